"""Relative paths in a config file taken from the file's folder (as Prometheus takes its
``rule_files``): the daemon runs from ``/`` under systemd, where ``check-config`` run
beside the file would pass. Applied to the TOML document before it is validated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpugov.plant.profile_files import written_as_path

_DAEMON_PATHS: tuple[tuple[str, ...], ...] = (
    ("record",),
    ("state_dir",),
    ("actuator", "socket"),
    ("zeusd", "socket"),
    ("zeusd", "token_file"),
)
"""The ``[daemon]`` keys that name files or folders (as key paths)."""
_CONTROLLER_PATHS = ("plan", "state_dir")
"""A controller table's keys that name files or folders."""
_CONTROLLER_PROFILES = ("profile", "prior_profile")
"""A controller table's keys that name a bundled profile or a manifest file."""


def _rebased(value: Any, base: Path, *, profile: bool = False) -> Any:
    """``value`` (a path as written) taken from ``base`` when it is relative, from the
    home when it starts with ``~`` (as a shell takes it; kept as written it named a
    folder ``~`` in the working directory); anything else (an absolute path, no text) as
    it is (validation names it). A profile key's value is a path only where it reads as
    one (a ``.json`` or ``.csv`` name, or a folder in it); else a bundled name."""
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        return value
    if profile and not written_as_path(value):
        return value
    if value.startswith("~"):
        return os.path.expanduser(value)  # ~nobody (no such user) stays: LoosePath refuses it
    if Path(value).is_absolute():
        return value
    return str(base / value)


def rebase_relative_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """The TOML document with every relative path in it taken from ``base``, the config
    file's folder (as Prometheus takes its ``rule_files``): the daemon runs from ``/``
    under systemd, where ``check-config`` run beside the file would pass."""
    daemon = data.get("daemon")
    if isinstance(daemon, dict):
        for keys in _DAEMON_PATHS:
            table: Any = daemon
            for key in keys[:-1]:
                table = table.get(key) if isinstance(table, dict) else None
            if isinstance(table, dict) and keys[-1] in table:
                table[keys[-1]] = _rebased(table[keys[-1]], base)
    domains = data.get("domains")
    for domain in domains if isinstance(domains, list) else ():
        if not isinstance(domain, dict):
            continue
        if "power_budget_file" in domain:
            domain["power_budget_file"] = _rebased(domain["power_budget_file"], base)
        controller = domain.get("controller")
        if not isinstance(controller, dict):
            continue
        for key in _CONTROLLER_PATHS:
            if key in controller:
                controller[key] = _rebased(controller[key], base)
        for key in _CONTROLLER_PROFILES:
            if key in controller:
                controller[key] = _rebased(controller[key], base, profile=True)
    return data
