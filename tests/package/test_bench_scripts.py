"""``make bench`` runs the scripts in bench/ as scripts: each must start from the repository
root (no module of bench/ shadowing a package) and default its output to the ignored folder;
a script docs/commands.md gives a synopsis has the flags it lists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _documented_flags() -> dict[str, set[str]]:
    """The flags docs/commands.md's Benchmarks synopsis gives each bench script."""
    text = (ROOT / "docs" / "commands.md").read_text()
    block = text.split("## Benchmarks", 1)[1].split("```")[1]
    flags: dict[str, set[str]] = {}
    script = None
    for line in block.splitlines():
        match = re.match(r"\.venv/bin/python bench/(\S+\.py)(.*)", line)
        if match:
            script = match.group(1)
            flags[script] = set(FLAG.findall(match.group(2)))
        elif script and line.startswith(" "):
            flags[script] |= set(FLAG.findall(line))
        else:
            script = None
    return flags


DOCUMENTED = _documented_flags()


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
    if script in DOCUMENTED:  # its synopsis in docs/commands.md names each flag, no other
        assert set(FLAG.findall(done.stdout)) - {"--help"} == DOCUMENTED[script]


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
