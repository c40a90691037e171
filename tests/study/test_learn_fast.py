"""``bench/learn_fast.py`` (how fast ``mpc-online`` starts saving): its refusals, before
any run, and a short run whose progress line counts the runs with an ETA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_support import run_bench_main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--periods", "abc"], "--periods must be positive seconds"),
        (["--periods", "1,0"], "--periods must be positive seconds"),
        (["--periods", "nan"], "--periods must be positive seconds"),
        (["--duration", "-5"], "--duration must be positive seconds"),
        (["--profiles", "no-such-profile"], "unknown profile 'no-such-profile'"),
        (["--trace", "no-such-trace.csv"], "no-such-trace.csv"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "learn_fast.json"
    code, stdout, stderr = run_bench_main("learn_fast", [*argv, "--out", str(out)])
    assert code == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr and not stdout
    assert not out.exists()


def test_an_output_that_is_a_directory_is_refused_before_any_run(tmp_path: Path) -> None:
    code, stdout, stderr = run_bench_main("learn_fast", ["--out", str(tmp_path)])
    assert code == 2
    assert "is a directory" in stderr and not stdout


def test_a_short_run_counts_its_runs(tmp_path: Path) -> None:
    out = tmp_path / "learn_fast.json"
    code, stdout, stderr = run_bench_main(
        "learn_fast",
        ["--duration", "20", "--periods", "1", "--profiles", "", "--out", str(out)],
    )
    assert code == 0, stderr
    rows = json.loads(out.read_text())["rows"]
    # The generated profile only: one run per spec, beside the maximum clock's.
    assert [row["spec"] for row in rows] == ["mpc-online", "mpc-online:auto=off"]
    assert "(3/3 runs)" in stderr and "ETA" in stderr
    assert stdout.count("first below the top") == 2
