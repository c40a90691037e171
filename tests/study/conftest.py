"""Fixtures shared by the study tests: one quick ``gpugov experiments`` run per session
(the CLI tests read it, and the Ray test compares its sharded run with it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_support import run_quick_experiments


@pytest.fixture(scope="session")
def experiments_quick_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, int, str, str]:
    """The sequential quick run (figures included): ``(out, code, stdout, stderr)``."""
    out = tmp_path_factory.mktemp("experiments") / "quick"
    code, stdout, stderr = run_quick_experiments(out)
    return out, code, stdout, stderr
