"""``bench/disaggregated_shapes.py`` (random disaggregated boards): its refusals, and a
short run on the bundled trace slice whose JSON holds every row it reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from study_support import run_bench_main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "5:2"], "--seeds must be FIRST:LAST"),
        (["--duration", "0"], "--duration must be positive"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--traces", "no-such-trace.csv"], "no-such-trace.csv"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "shapes.json"
    code, _, stderr = run_bench_main("disaggregated_shapes", [*argv, "--out", str(out)])
    assert code == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def _one_board(tmp_path: Path, duration_s: str) -> tuple[str, dict[str, Any]]:
    """Seed 0 on azure-conv for ``duration_s``: the run's stdout and its JSON."""
    out = tmp_path / "shapes.json"
    argv = ["--seeds", "0:1", "--traces", "azure-conv-10min", "--duration", duration_s]
    code, stdout, _ = run_bench_main(
        "disaggregated_shapes", [*argv, "--jobs", "1", "--out", str(out)]
    )
    assert code == 0
    return stdout, json.loads(out.read_text())


def test_a_short_run_writes_every_board_and_the_summary(tmp_path: Path) -> None:
    stdout, result = _one_board(tmp_path, "30")
    (row,) = result["rows"]
    assert row["seed"] == 0 and row["layout"] == "1P1D" and row["requests"] > 0
    assert set(row["controllers"]) == {"max", "mpc-online", "voltana"}
    assert row["controllers"]["max"]["saved_fraction"] == pytest.approx(0.0)
    assert row["controllers"]["max"]["holds_slo"]
    for key in ("mpc-online", "voltana"):
        run = row["controllers"][key]
        assert -1.0 < run["saved_fraction"] < 1.0
        summary = result["summary"][key]
        assert summary["boards"] == 1
        assert summary["holds_slo"] == int(run["holds_slo"])
        assert summary["median_saved_fraction"] == pytest.approx(run["saved_fraction"])
        assert f"{key}: holds {summary['holds_slo']}/1" in stdout


def test_a_board_of_too_few_requests_is_reported_not_judged(tmp_path: Path) -> None:
    stdout, result = _one_board(tmp_path, "0.5")
    (row,) = result["rows"]
    assert "controllers" not in row and "fewer than" in row["skipped"]
    assert result["summary"]["mpc-online"]["boards"] == 0
    assert "fewer than" in stdout
