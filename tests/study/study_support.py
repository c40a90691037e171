"""Helpers shared by the study tests (imported by name; conftest.py holds the fixtures)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from gpugov.cli import main

QUICK_EXPERIMENTS_ARGS = ["experiments", "--quick", "--duration", "120", "--animation", "30"]


def run_quick_experiments(out: Path, *extra: str) -> tuple[int, str, str]:
    """``gpugov experiments --quick`` on a 120 s window into ``out``; (code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*QUICK_EXPERIMENTS_ARGS, *extra, "--out", str(out)])
    return code, stdout.getvalue(), stderr.getvalue()
