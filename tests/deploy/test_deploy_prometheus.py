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

import pytest
from deploytools import (
    OPERATOR_GUIDE,
    PROMETHEUS,
    RULE_FILES,
    all_rules,
    dashboard,
    mentions,
    panels,
    require_module,
    require_tool,
    rules_in,
)

yaml = require_module("yaml")

ALERT_RULES = PROMETHEUS / "rules" / "gpugov-alerts.rules.yml"
RECORDING_RULES = PROMETHEUS / "rules" / "gpugov-recording.rules.yml"
UNIT_TESTS = PROMETHEUS / "tests" / "gpugov.test.yml"
POWER_BUDGET_RULES = PROMETHEUS / "rules" / "gpugov-power-budget.rules.yml"
POWER_BUDGET_TESTS = PROMETHEUS / "tests" / "gpugov-power-budget.test.yml"
ENERGY_RULES = PROMETHEUS / "rules" / "gpugov-energy.rules.yml"
ENERGY_TESTS = PROMETHEUS / "tests" / "gpugov-energy.test.yml"


def promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    """Run promtool; fail with its output when it exits non-zero."""
    tool = require_tool("promtool")
    result = subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def alert_names() -> list[str]:
    """The alerts defined in the alert rule file."""
    return [rule["alert"] for rule in rules_in(ALERT_RULES)]


def test_rule_files_are_the_expected_ones() -> None:
    assert sorted([ALERT_RULES, RECORDING_RULES, POWER_BUDGET_RULES, ENERGY_RULES]) == RULE_FILES


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


def test_promtool_test_energy_rules() -> None:
    output = promtool("test", "rules", str(ENERGY_TESTS))
    assert "SUCCESS" in output


def test_prometheus_config_loads_every_rule_file() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert sorted(PROMETHEUS / path for path in config["rule_files"]) == RULE_FILES


@pytest.mark.parametrize(
    ("rule_file", "unit_tests"),
    [
        (ALERT_RULES, UNIT_TESTS),
        (POWER_BUDGET_RULES, POWER_BUDGET_TESTS),
        (ENERGY_RULES, ENERGY_TESTS),
    ],
    ids=["alerts", "power-budget", "energy"],
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
    names = [rule["alert"] for rule in rules_in(rule_file) if "alert" in rule]
    assert names, f"{rule_file.name} defines no alert"
    for name in names:
        assert name in fired, f"{name} never fires in {unit_tests.name}"
        assert name in cleared_after_firing, f"{name} never clears in {unit_tests.name}"


@pytest.mark.parametrize(
    "rule_file", [ALERT_RULES, POWER_BUDGET_RULES, ENERGY_RULES], ids=lambda p: p.stem
)
def test_alerts_are_documented(rule_file: Path) -> None:
    guide = OPERATOR_GUIDE.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", guide, flags=re.M)
    }
    for rule in (rule for rule in rules_in(rule_file) if "alert" in rule):
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
    [
        (RECORDING_RULES, {"domain", "gpu"}),
        (POWER_BUDGET_RULES, {"domain", "node", "cluster"}),
        (ENERGY_RULES, {"domain"}),
    ],
    ids=["recording", "power-budget", "energy"],
)
def test_recording_rule_names_follow_the_convention(rule_file: Path, levels: set[str]) -> None:
    for rule in (rule for rule in rules_in(rule_file) if "record" in rule):
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
        for rule in rules_in(RECORDING_RULES):
            if rule["record"] not in recorded and reads(rule["expr"], needs | recorded):
                recorded.add(rule["record"])
                grown = True
    assert recorded == set(SLO_RECORDING_RULES)
    alerts = [r["alert"] for r in rules_in(ALERT_RULES) if reads(r["expr"], needs | recorded)]
    assert alerts == list(SLO_ALERTS)


# ------------------------------------------------- the operator guide documents them
FILE_COLUMN = {
    RECORDING_RULES: "recording",
    ENERGY_RULES: "energy",
    POWER_BUDGET_RULES: "budget",
}


def guide_section(title: str) -> str:
    """The text of the operator guide's ``## title`` section, up to the next ``## ``."""
    guide = OPERATOR_GUIDE.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", guide, flags=re.M | re.S)
    assert match, f"docs/operator.md has no '## {title}' section"
    return match.group(1)


def documented_recording_rules() -> dict[str, list[str]]:
    """The operator guide's recording-rule table: series name -> its row's cells."""
    rows: dict[str, list[str]] = {}
    for line in guide_section("Recording rules").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z]+:gpugov_[a-z0-9_]+:[a-z0-9_]+)`", cells[0])
        if line.startswith("|") and match:
            assert match.group(1) not in rows, f"{match.group(1)} documented twice"
            rows[match.group(1)] = cells
    return rows


def users(name: str) -> list[str]:
    """What reads the recorded series ``name``: alerts, other recording rules, and
    dashboard panels (by title)."""
    found = []
    for _, rule in all_rules():
        if rule.get("record") != name and mentions(rule["expr"], name):
            found.append(rule.get("alert") or rule["record"])
    for panel in panels(dashboard()):
        if any(mentions(target["expr"], name) for target in panel["targets"]):
            found.append(panel["title"])
    return sorted(set(found))


def test_every_recording_rule_is_documented_with_its_file_and_users() -> None:
    """docs/operator.md's *Recording rules* table lists exactly the recorded series of
    deploy/prometheus/rules/, each with the file it is in and, in its *used by* cell,
    every alert, rule and dashboard panel that reads it."""
    rows = documented_recording_rules()
    recorded = {(path, rule["record"]) for path, rule in all_rules() if "record" in rule}
    assert sorted(rows) == sorted({name for _, name in recorded}), (
        "the table in docs/operator.md#recording-rules and the rule files disagree"
    )
    for path, name in recorded:
        _, file, meaning, used_by = rows[name]
        assert file == FILE_COLUMN[path], f"{name}: file column {file!r}, it is in {path.name}"
        assert meaning, f"{name}: says nothing about what it computes"
        for user in users(name):
            assert user in used_by, f"{name}: its 'used by' cell does not name {user!r}"
        if not users(name):
            assert used_by.startswith("none"), f"{name}: nothing reads it, yet {used_by!r}"


def test_every_documented_alert_exists() -> None:
    """The *Alerts* section has one ``###`` runbook per alert, and no runbook for an alert
    that no rule file defines."""
    headings = re.findall(r"^### (\S+)$", guide_section("Alerts"), flags=re.M)
    alerts = [rule["alert"] for _, rule in all_rules() if "alert" in rule]
    assert sorted(headings) == sorted(alerts)


def test_every_recorded_series_named_anywhere_is_recorded() -> None:
    """A ``level:gpugov_...:op`` name in an alert, a rule, a panel or a document is one the
    rule files record (a renamed rule leaves no dangling reference)."""
    recorded = {rule["record"] for _, rule in all_rules() if "record" in rule}
    pattern = re.compile(r"\b[a-z]+:gpugov_[a-z0-9_]+:[a-z0-9_]+\b")
    texts = {
        f"{path.name}: {rule.get('alert') or rule['record']}": rule["expr"]
        for path, rule in all_rules()
    }
    texts |= {
        f"panel {panel['title']!r}": target["expr"]
        for panel in panels(dashboard())
        for target in panel["targets"]
    }
    repo = OPERATOR_GUIDE.parents[1]
    for path in [*sorted((repo / "docs").glob("*.md")), repo / "deploy" / "README.md"]:
        texts[str(path.relative_to(repo))] = path.read_text()
    for where, text in texts.items():
        for name in pattern.findall(text):
            assert name in recorded, f"{where} names {name}, which no rule records"


def seconds(duration: str) -> int:
    """A Prometheus duration such as ``90s``, ``10m`` or ``1h`` in seconds."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, f"unexpected duration {duration!r}"
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def test_alerts_wait_before_firing_and_page_only_on_what_lasts() -> None:
    """An alert either holds its condition for a while (``for:`` from 1 minute to an hour)
    or counts events over a window of at least 5 minutes (``increase``, ``resets``), so one
    scrape never fires it; a ``critical`` alert (it pages) also waits at least 2 minutes."""
    for path, rule in all_rules():
        if "alert" not in rule:
            continue
        where = f"{path.name}: {rule['alert']}"
        if "for" in rule:
            assert 60 <= seconds(rule["for"]) <= 3600, f"{where}: for: {rule['for']}"
        else:
            windows = re.findall(r"\b(?:increase|resets|changes)\([^\[]*\[(\w+)\]\)", rule["expr"])
            assert windows and all(seconds(w) >= 300 for w in windows), (
                f"{where}: no for: and no event count over >= 5 minutes"
            )
        if rule["labels"]["severity"] == "critical":
            assert seconds(rule.get("for", "0s")) >= 120, f"{where}: pages without waiting"


def test_a_per_node_scrape_of_loopback_is_told_to_name_the_node_in_instance() -> None:
    """The job scrapes 127.0.0.1:9400, as a Prometheus or agent on each node does; the
    rules join a node's series on (job, instance), so series of several nodes with the
    one loopback `instance` join across nodes (a busy node's lock alerted as idle by an
    idle node's queue). The job carries, commented, the relabeling that names the node;
    uncommented, it is a relabel_configs that sets `instance`."""
    text = (PROMETHEUS / "prometheus.yml").read_text()
    config = yaml.safe_load(text)
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpugov"]
    targets = [t for c in job.get("static_configs", []) for t in c["targets"]]
    if not any(t.startswith(("127.", "localhost", "[::1]")) for t in targets):
        return
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "# relabel_configs:"), None)
    assert start is not None, "the loopback job does not say to name the node in `instance`"
    indent = lines[start].index("#")
    block = []
    for line in lines[start:]:
        if not line.strip().startswith("#") or line.index("#") != indent:
            break
        body = line[indent + 1 :]
        if block and not body.startswith("   "):
            break
        block.append(" " * indent + body[1:])
    relabel = yaml.safe_load("\n".join(block))["relabel_configs"]
    assert {"target_label": "instance"}.items() <= relabel[0].items(), relabel
    assert relabel[0].get("replacement"), relabel
