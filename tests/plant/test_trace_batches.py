"""Batched (grid-quantised) traces are spread over their grid step; others are untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpugov.plant.trace_batches import batch_grid_s, spread_batched_arrivals
from gpugov.plant.workload import load_trace


def _grid_trace(batches: int, per_batch: int, step_s: float) -> list[float]:
    return [b * step_s for b in range(batches) for _ in range(per_batch)]


def test_a_batched_trace_is_spread_within_each_grid_step() -> None:
    arrivals = _grid_trace(batches=50, per_batch=8, step_s=3.0)
    spread, grid = spread_batched_arrivals(arrivals)
    assert grid == pytest.approx(3.0)
    times = np.asarray(spread)
    original = np.asarray(arrivals)
    assert np.all(np.diff(times) >= 0.0), "order is kept"
    assert np.all(times >= original) and np.all(times < original + 3.0), "inside its step"
    assert times[0] == 0.0, "the time origin stays the first stamp"
    assert np.unique(times).size == times.size, "no two arrivals coincide any more"
    # Uniform within the step: the mean offset is about half the step.
    assert np.mean(times - original) == pytest.approx(1.5, abs=0.2)


def test_the_spread_is_deterministic() -> None:
    arrivals = _grid_trace(batches=10, per_batch=5, step_s=2.0)
    assert spread_batched_arrivals(arrivals) == spread_batched_arrivals(arrivals)


def test_a_batch_never_reaches_the_next_stamp_after_a_short_gap() -> None:
    # Grid 3 s, but one gap of 0.5 s (one gap in twelve: still a grid): that batch spreads
    # over 0.5 s only.
    arrivals = (
        [0.0] * 4 + [3.0] * 4 + [3.5] * 4 + [6.5 + 3.0 * k for k in range(10) for _ in "1234"]
    )
    spread, grid = spread_batched_arrivals(arrivals)
    assert grid == pytest.approx(3.0)
    assert all(3.0 <= t < 3.5 for t in spread[4:8])
    assert all(3.5 <= t < 6.5 for t in spread[8:12])


def test_a_last_batch_near_the_float_maximum_spreads_to_finite_arrivals() -> None:
    """Batches 0.425e308 s apart: the last one's spread over its grid step overflowed to
    inf, with numpy's RuntimeWarning on stderr."""
    arrivals = [k * 0.425e308 for k in range(5) for _ in range(3)]
    with np.errstate(over="raise"):
        spread, grid = spread_batched_arrivals(arrivals)
    assert grid == 0.425e308
    assert all(np.isfinite(spread)) and spread == sorted(spread)
    assert all(t >= 1.7e308 for t in spread[12:])


@pytest.mark.parametrize(
    "arrivals",
    [
        [0.1 * i for i in range(100)],  # distinct stamps (Azure)
        [float(i // 1) for i in range(100)] + [99.0],  # a single coincidence (BurstGPT)
        [0.0],
        [],
        # Real bursts, not a grid: these were "batched" on a grid of their one gap, or of
        # their median gap, and the burst spread over it (500 requests over an hour).
        [0.0] * 500 + [3600.0],  # a burst and a straggler
        [0.0] * 5 + [7.0] * 5,  # two bursts
        [0.0] * 5 + [7.0] * 5 + [14.0] * 5 + [21.0] * 5,  # four: too few stamps for a grid
        [0.0] * 100 + [13.0, 250.0, 251.5, 900.0, 2000.0],  # stragglers at irregular times
        [0.0] * 4 + [1.7e308] * 3,  # a stray far stamp
    ],
)
def test_traces_that_are_not_batched_are_untouched(arrivals: list[float]) -> None:
    spread, grid = spread_batched_arrivals(arrivals)
    assert grid is None
    assert spread == arrivals
    assert batch_grid_s(arrivals) is None


def _write_mooncake(path: Path, stamps_ms: list[int]) -> Path:
    rows = [
        json.dumps({"timestamp": t, "input_length": 1000 + i, "output_length": 10})
        for i, t in enumerate(stamps_ms)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_load_trace_spreads_a_batched_file_and_reports_the_grid(tmp_path: Path) -> None:
    path = _write_mooncake(tmp_path / "grid.jsonl", [b * 3000 for b in range(20) for _ in range(6)])
    requests, report = load_trace(path)
    assert report.batch_grid_s == pytest.approx(3.0)
    times = [r.arrival_time_s for r in requests]
    assert len(set(times)) == len(times)
    assert [r.prompt_tokens for r in requests] == sorted(r.prompt_tokens for r in requests)

    kept, raw = load_trace(path, spread_batches=False)
    assert raw.batch_grid_s is None
    assert len({r.arrival_time_s for r in kept}) == 20


def test_load_trace_keeps_a_burst_with_a_straggler_at_one_instant(tmp_path: Path) -> None:
    """500 requests at once and one an hour later: the burst was spread over the hour
    (a "3600 s grid"), and simulate's SLO attainment at the maximum clock went from 4.6 %
    to 100 %."""
    path = tmp_path / "burst.csv"
    path.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n" + "0,100,10\n" * 500 + "3600,100,10\n"
    )
    requests, report = load_trace(path)
    assert report.batch_grid_s is None
    assert [r.arrival_time_s for r in requests] == [0.0] * 500 + [3600.0]


def test_a_bursty_trace_in_whole_seconds_is_on_the_grid_of_its_smallest_gap() -> None:
    """Bursts logged in whole seconds (gaps of 1 s) between quiet stretches (gaps of 2 to
    9 s, most of the gaps): the median gap is off that grid, the smallest is on it."""
    busy = [float(t) for t in range(10) for _ in range(6)]
    quiet = [10.0 + t for t in (4, 9, 11, 18, 20, 27, 36, 38, 45, 47, 55, 63, 66, 72, 80)]
    spread, grid = spread_batched_arrivals(busy + quiet)
    assert grid == 1.0
    assert all(t <= s < t + 1.0 for t, s in zip(busy, spread, strict=False))


def test_load_scale_still_stretches_a_spread_trace(tmp_path: Path) -> None:
    path = _write_mooncake(tmp_path / "grid.jsonl", [b * 3000 for b in range(20) for _ in range(6)])
    fast, _ = load_trace(path, load_scale=1.0)
    slow, _ = load_trace(path, load_scale=0.1)
    assert slow[-1].arrival_time_s == pytest.approx(10.0 * fast[-1].arrival_time_s)


def test_simulate_says_it_spread_the_batches_and_can_keep_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugov.cli import main

    path = _write_mooncake(tmp_path / "grid.jsonl", [b * 3000 for b in range(5) for _ in range(3)])
    out = tmp_path / "spread.json"
    assert main(["simulate", "--trace", str(path), "--quiet", "--out", str(out)]) == 0
    assert "3 s grid" in capsys.readouterr().err
    kept = tmp_path / "kept.json"
    argv = ["simulate", "--trace", str(path), "--quiet", "--keep-batched-stamps", "--out"]
    assert main([*argv, str(kept)]) == 0
    assert "grid" not in capsys.readouterr().err
    spread_ttft = json.loads(out.read_text())["metrics"]["ttft_p99_s"]
    kept_ttft = json.loads(kept.read_text())["metrics"]["ttft_p99_s"]
    assert kept_ttft > spread_ttft, "three prompts at one instant queue behind each other"
