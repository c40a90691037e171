"""``bench/random_shapes.py`` (random boards): its refusals, and a short run on the bundled
trace slice whose JSON holds the runs, flags and summary it reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_support import run_bench_main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "5:2"], "--seeds must be FIRST:LAST"),
        (["--seeds", "x"], "--seeds must be FIRST:LAST"),
        (["--seeds=-3:2"], "--seeds must be FIRST:LAST"),
        (["--seeds", "0:100000000000"], "at most 10000 seeds"),
        (["--duration", "0"], "--duration must be positive"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--traces", "no-such-trace.csv"], "no-such-trace.csv"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "random.json"
    code, _, stderr = run_bench_main("random_shapes", [*argv, "--out", str(out)])
    assert code == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def test_a_short_run_writes_every_board_and_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "random.json"
    argv = ["--seeds", "0:2", "--traces", "azure-conv-10min", "--duration", "30"]
    code, stdout, _ = run_bench_main(
        "random_shapes", [*argv, "--mpc", "--jobs", "1", "--out", str(out)]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert [row["seed"] for row in result["rows"]] == [0, 1]
    judged = [row for row in result["rows"] if "controllers" in row]
    assert judged, result["rows"]
    for row in judged:
        runs = row["controllers"]
        assert set(runs) == {"max", "mpc-online", "mpc"}
        top = runs["max"]["energy_j"]
        for run in runs.values():
            assert run["saved_fraction"] == pytest.approx(1.0 - run["energy_j"] / top)
            assert run["costs_more"] == (run["energy_j"] > top)
        assert row["shape"]["name"] == f"random-{row['seed']}"
    summary = result["summary"]["mpc-online"]
    assert summary["boards"] == len(judged)
    assert 0 <= summary["holds_slo"] <= summary["boards"]
    assert "mpc-online: holds the SLO on" in stdout
