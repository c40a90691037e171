"""``make bench`` runs the scripts in bench/ as scripts: each must start from the repository
root (no module of bench/ shadowing a package) and default its output to the ignored folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts_as_a_script(script: str) -> None:
    done = subprocess.run(
        [sys.executable, f"bench/{script}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_benchmark_outputs_are_ignored_by_git() -> None:
    ignore = (ROOT / ".gitignore").read_text().split()
    assert "/bench/results/" in ignore
    from gpugov.study.scoreboard.scenarios import DEFAULT_OUT

    assert DEFAULT_OUT.resolve().is_relative_to(ROOT / "bench" / "results")
