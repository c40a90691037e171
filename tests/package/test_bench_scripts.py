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


def test_the_energy_attribution_bench_reads_the_plant_it_runs(tmp_path: Path) -> None:
    """The bench reads the plant's truth beside the daemon (its counters, its requests):
    a short run must finish and write its JSON, so a plant refactor cannot break it
    unseen (it once read a counter that had moved to ``PlantSimulation.counters``)."""
    out = tmp_path / "energy_attribution.json"
    run = ["--duration", "30", "--profiles", "h100-sxm-llama3-8b", "--traces", "azure-conv-10min"]
    done = subprocess.run(
        [sys.executable, "bench/energy_attribution.py", *run, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "J/tok" in done.stdout and out.is_file()
