"""Offline study commands: simulate, experiments, the controller scoreboard (and, above the
node's code, everything that never runs on a node). ``gpugov.study`` may import
``gpugov.daemon``; the daemon never imports this package.

The seed's experiment suite, :func:`~gpugov.study.experiments.build_textbook_results`, is
importable from here; it loads on first use (PEP 562), so importing a study command's
module does not pull in the suite.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {"build_textbook_results": "gpugov.study.experiments"}

__all__ = ["build_textbook_results"]


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first access."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'gpugov.study' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
