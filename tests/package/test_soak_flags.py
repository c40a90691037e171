"""``bench/soak.py`` refuses a flag it cannot run with in one line naming it, before the
soak runs (it takes minutes): never a traceback, never a run whose JSON cannot be written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--hours", "inf"], "--hours"),
        (["--sample-minutes", "inf"], "--sample-minutes"),
        (["--period", "0.001"], "--period"),
        (["--period", "1000"], "--period"),
        (["--out", "DIRECTORY"], "--out"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it(tmp_path: Path, flags: list[str], named: str) -> None:
    flags = [str(tmp_path) if flag == "DIRECTORY" else flag for flag in flags]
    out = [] if "--out" in flags else ["--out", str(tmp_path / "soak.json")]
    done = subprocess.run(
        [sys.executable, "bench/soak.py", *flags, *out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and named in lines[-1], done.stderr
    assert lines[-1].startswith("soak.py: error:")
    assert not (tmp_path / "soak.json").exists()
