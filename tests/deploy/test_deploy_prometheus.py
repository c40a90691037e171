"""Prometheus assets: `promtool check config`, `check rules`, `test rules`, and their coverage.

Every alert must appear in ``deploy/prometheus/tests/gpugov.test.yml`` at least once
firing and at least once with no alert expected after it fired (cleared), and every
alert's runbook anchor must exist in the operator guide. The live checks against a real
server are in ``test_deploy_live.py``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploytools import OPERATOR_GUIDE, PROMETHEUS, require_module, require_tool

yaml = require_module("yaml")

RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.rules.yml"))
ALERT_RULES = PROMETHEUS / "rules" / "gpugov-alerts.rules.yml"
RECORDING_RULES = PROMETHEUS / "rules" / "gpugov-recording.rules.yml"
UNIT_TESTS = PROMETHEUS / "tests" / "gpugov.test.yml"
POWER_BUDGET_RULES = PROMETHEUS / "rules" / "gpugov-power-budget.rules.yml"
POWER_BUDGET_TESTS = PROMETHEUS / "tests" / "gpugov-power-budget.test.yml"


def promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    """Run promtool; fail with its output when it exits non-zero."""
    tool = require_tool("promtool")
    result = subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def rules(path: Path) -> list[dict[str, Any]]:
    """Every rule of every group in a rule file."""
    document = yaml.safe_load(path.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alert_names() -> list[str]:
    """The alerts defined in the alert rule file."""
    return [rule["alert"] for rule in rules(ALERT_RULES)]


def test_rule_files_are_the_expected_ones() -> None:
    assert sorted([ALERT_RULES, RECORDING_RULES, POWER_BUDGET_RULES]) == RULE_FILES


def test_promtool_check_config() -> None:
    output = promtool("check", "config", "prometheus.yml")
    assert "SUCCESS" in output


def test_promtool_check_rules() -> None:
    output = promtool("check", "rules", *(str(p) for p in RULE_FILES))
    assert output.count("SUCCESS") == len(RULE_FILES)


def test_promtool_test_rules() -> None:
    output = promtool("test", "rules", str(UNIT_TESTS))
    assert "SUCCESS" in output


def test_promtool_test_power_budget_rules() -> None:
    output = promtool("test", "rules", str(POWER_BUDGET_TESTS))
    assert "SUCCESS" in output


def test_prometheus_config_loads_every_rule_file() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert sorted(PROMETHEUS / path for path in config["rule_files"]) == RULE_FILES


@pytest.mark.parametrize(
    ("rule_file", "unit_tests"),
    [(ALERT_RULES, UNIT_TESTS), (POWER_BUDGET_RULES, POWER_BUDGET_TESTS)],
    ids=["alerts", "power-budget"],
)
def test_every_alert_fires_and_clears_in_the_unit_tests(rule_file: Path, unit_tests: Path) -> None:
    document = yaml.safe_load(unit_tests.read_text())
    fired: set[str] = set()
    cleared_after_firing: set[str] = set()
    seconds = {"s": 1, "m": 60, "h": 3600}
    for case in document["tests"]:
        checks = sorted(
            case.get("alert_rule_test", []),
            key=lambda c: int(c["eval_time"][:-1]) * seconds[c["eval_time"][-1]],
        )
        firing_in_case: set[str] = set()
        for check in checks:
            name = check["alertname"]
            if check.get("exp_alerts"):
                firing_in_case.add(name)
                fired.add(name)
            elif name in firing_in_case:
                cleared_after_firing.add(name)
    names = [rule["alert"] for rule in rules(rule_file) if "alert" in rule]
    assert names, f"{rule_file.name} defines no alert"
    for name in names:
        assert name in fired, f"{name} never fires in {unit_tests.name}"
        assert name in cleared_after_firing, f"{name} never clears in {unit_tests.name}"


@pytest.mark.parametrize("rule_file", [ALERT_RULES, POWER_BUDGET_RULES], ids=lambda p: p.stem)
def test_alerts_are_documented(rule_file: Path) -> None:
    guide = OPERATOR_GUIDE.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", guide, flags=re.M)
    }
    for rule in (rule for rule in rules(rule_file) if "alert" in rule):
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        for key in ("summary", "description", "runbook_url"):
            assert rule["annotations"].get(key), f"{rule['alert']}: no {key}"
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operator.md#{rule['alert'].lower()}"
        assert rule["alert"].lower() in anchors, (
            f"{rule['alert']}: no '## {rule['alert']}' section in docs/operator.md"
        )


@pytest.mark.parametrize(
    ("rule_file", "levels"),
    [(RECORDING_RULES, {"domain", "gpu"}), (POWER_BUDGET_RULES, {"domain", "node", "cluster"})],
    ids=["recording", "power-budget"],
)
def test_recording_rule_names_follow_the_convention(rule_file: Path, levels: set[str]) -> None:
    for rule in (rule for rule in rules(rule_file) if "record" in rule):
        level, metric, operations = rule["record"].split(":")
        assert level in levels, rule["record"]
        assert metric.startswith("gpugov_"), rule["record"]
        assert operations, rule["record"]


def test_check_config_names_exactly_the_rules_that_need_the_slos() -> None:
    """``gpugov check-config`` warns that a domain without SLOs leaves some rules and
    alerts without data: they must be exactly those that read an SLO series, directly
    or through another recorded series."""
    from gpugov.daemon.node_check import SLO_ALERTS, SLO_RECORDING_RULES, SLO_SERIES

    def reads(expr: str, names: set[str]) -> bool:
        return any(re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) for name in names)

    needs = set(SLO_SERIES.values())
    recorded: set[str] = set()
    grown = True
    while grown:
        grown = False
        for rule in rules(RECORDING_RULES):
            if rule["record"] not in recorded and reads(rule["expr"], needs | recorded):
                recorded.add(rule["record"])
                grown = True
    assert recorded == set(SLO_RECORDING_RULES)
    alerts = [r["alert"] for r in rules(ALERT_RULES) if reads(r["expr"], needs | recorded)]
    assert alerts == list(SLO_ALERTS)
