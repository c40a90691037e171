"""Shared helpers for the deployment checks: where things are, and tools that may be missing.

A check whose tool is missing is skipped with the reason on a developer's machine, but
fails when ``CI`` is set, so CI cannot pass by skipping. ``.ci/install-tools.sh`` installs
every tool these checks use.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SYSTEMD = DEPLOY / "systemd"
PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
KUBERNETES = DEPLOY / "kubernetes"
OPERATOR_GUIDE = REPO / "docs" / "operator.md"
INSTALL_HINT = "run .ci/install-tools.sh (as root) to install it"


def in_ci() -> bool:
    """True when the ``CI`` environment variable is set (to anything but empty)."""
    return bool(os.environ.get("CI"))


def missing(what: str) -> None:
    """Skip (developer machine) or fail (CI) because ``what`` is not installed."""
    message = f"{what} is not installed; {INSTALL_HINT}"
    if in_ci():
        pytest.fail(f"{message} (CI is set, so a missing tool fails instead of skipping)")
    pytest.skip(message, allow_module_level=True)


def require_tool(name: str) -> str:
    """The absolute path of executable ``name``, or skip/fail when it is not on PATH."""
    path = shutil.which(name)
    if path is None:
        missing(f"`{name}`")
    assert path is not None
    return path


def require_module(name: str) -> ModuleType:
    """Import ``name``, or skip/fail when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"Python package `{name}`")
        raise  # unreachable: missing() always raises


def gpugov_executable() -> Path:
    """The project's ``gpugov`` console script in the running interpreter's environment."""
    path = Path(sys.executable).parent / "gpugov"
    if not path.exists():
        pytest.fail(f"{path} not found: install the project (pip install -e '.[test]')")
    return path


RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.rules.yml"))
DASHBOARD = GRAFANA / "gpugov-dashboard.json"


def rules_in(path: Path) -> list[dict[str, Any]]:
    """Every rule (recording and alerting) of every group in one rule file."""
    yaml = require_module("yaml")
    document = yaml.safe_load(path.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def all_rules() -> list[tuple[Path, dict[str, Any]]]:
    """``(rule file, rule)`` for every rule of every file in deploy/prometheus/rules/."""
    return [(path, rule) for path in RULE_FILES for rule in rules_in(path)]


def dashboard() -> dict[str, Any]:
    """The committed dashboard JSON."""
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every non-row panel, including those nested in collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def mentions(text: str, name: str) -> bool:
    """True when ``text`` names the metric or recorded series ``name`` (not as part of a
    longer name)."""
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", text) is not None


def check_config(path: Path, *flags: str) -> tuple[int, list[str]]:
    """``gpugov check-config PATH --offline FLAGS``, run in this process: its exit code and
    the lines it wrote to stderr (its warnings and errors), which a shipped config must
    leave empty: an SRE who copies it sees them at every check and every start."""
    import contextlib
    import io

    from gpugov.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["check-config", str(path), "--offline", *flags])
    return code, stderr.getvalue().splitlines()
