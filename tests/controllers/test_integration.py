"""The ported methods on the real plant, a bundled profile and the bundled trace."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.mpc.controller import run_mpc
from gpugov.controllers.open_loop import (
    forecast_request_work_seconds,
    open_loop_clock_controller,
    optimize_open_loop,
    select_frequency_experiment_window,
    shift_largest_burst,
)
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.workload import load_trace


@pytest.fixture(scope="module")
def h100_plant() -> ServingPlant:
    return ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))


@pytest.fixture(scope="module")
def trace():
    requests, _ = load_trace("azure-conv-10min")
    return requests


def _seed_select_window(requests, profile, horizon_s, burst_window_s, shift_s, expected):
    """The seed's ``_select_frequency_experiment_window`` search, verbatim in substance."""
    first_start = np.floor(requests[0].arrival_time_s / burst_window_s) * burst_window_s
    last_start = np.floor(requests[-1].arrival_time_s / burst_window_s) * burst_window_s
    number_starts = int(round((last_start - first_start) / burst_window_s)) + 1
    number_bins = int(np.ceil(horizon_s / burst_window_s))
    bin_starts = burst_window_s * np.arange(number_bins)
    eligible_bins = np.flatnonzero(bin_starts >= shift_s - 1e-12)
    best = None
    for raw_start in first_start + burst_window_s * np.arange(number_starts):
        start = float(raw_start)
        selected = tuple(r for r in requests if start <= r.arrival_time_s < start + horizon_s)
        if not selected:
            continue
        weights = np.asarray(
            [forecast_request_work_seconds(r, profile, expected) for r in selected]
        )
        total = float(np.sum(weights))
        if total > horizon_s + 1e-9 * max(1.0, horizon_s):
            continue
        relative = np.asarray([r.arrival_time_s - start for r in selected])
        bins = np.clip(np.floor(relative / burst_window_s).astype(int), 0, number_bins - 1)
        totals = np.bincount(bins, weights=weights, minlength=number_bins)
        target = int(eligible_bins[int(np.argmax(totals[eligible_bins]))])
        if totals[target] <= 0.0:
            continue
        score = (float(totals[target]), total, -start)
        if best is None or score > best[0]:
            best = (score, start, selected)
    return best


def test_open_loop_experiment_on_the_bundled_trace(h100_plant, trace):
    profile = h100_plant.profile
    expected = float(np.mean([r.output_tokens for r in trace]))
    window, metadata = select_frequency_experiment_window(
        trace, profile, expected_output_tokens=expected
    )
    score, start, selected = _seed_select_window(trace, profile, 60.0, 10.0, 20.0, expected)
    assert metadata["source_window_start_s"] == start
    assert metadata["shiftable_burst_forecast_work_s"] == score[0]
    assert [r.request_id for r in window] == [r.request_id for r in selected]
    assert metadata["forecast_utilization_at_max_clock"] <= 1.0

    plan = optimize_open_loop(window, h100_plant, expected_output_tokens=expected)
    assert plan.success and plan.applied_clock_mhz.size == 60
    assert set(plan.applied_clock_mhz) <= set(profile.clock_mhz)
    nominal = simulate(
        window, h100_plant, chunked_prefill_scheduler, open_loop_clock_controller(plan)
    )
    shifted_workload = shift_largest_burst(window, profile, expected_output_tokens=expected)
    moved = {
        a.request_id
        for a in window
        for b in shifted_workload
        if a.request_id == b.request_id and abs(a.arrival_time_s - b.arrival_time_s) > 1e-9
    }
    assert len(moved) == metadata["shiftable_burst_request_count"]
    shifted = simulate(
        shifted_workload, h100_plant, chunked_prefill_scheduler, open_loop_clock_controller(plan)
    )
    for result in (nominal, shifted):
        assert result.metrics.arrived_requests == len(window)
        # After the plant's initial sample every requested clock comes from the plan.
        assert set(result.requested_clock_mhz[1:]) <= set(plan.applied_clock_mhz)


@pytest.mark.slow
def test_run_mpc_on_a_minute_of_the_bundled_trace(h100_plant):
    window, _ = load_trace("azure-conv-10min", start_s=120.0, duration_s=60.0)
    result = run_mpc(window, h100_plant)
    summary = result.metadata["mpc"]
    assert summary["solves"] >= 60
    assert summary["fallback_reasons"]["exception"] == 0
    assert summary["fallback_count"] <= 0.1 * summary["solves"]
    assert result.metrics.arrived_requests == len(window)
    assert set(result.requested_clock_mhz) <= set(h100_plant.profile.clock_mhz)
    maximum = simulate(window, h100_plant, chunked_prefill_scheduler, maximum_clock_controller)
    # The MPC trades latency slack for energy: it never uses more than the maximum clock.
    assert result.metrics.energy_j < maximum.metrics.energy_j
    assert result.metrics.censored_requests == 0


def test_run_mpc_declared_forecast_is_independent_of_hidden_lengths(h100_plant):
    """With a declared forecast, changing unfinished requests' hidden output lengths
    cannot change the controller's decisions before those requests finish."""
    window, _ = load_trace("azure-conv-10min", start_s=120.0, duration_s=15.0)
    longer = tuple(replace(r, output_tokens=r.output_tokens + 500) for r in window)
    first = run_mpc(window, h100_plant, expected_output_tokens=200.0)
    second = run_mpc(longer, h100_plant, expected_output_tokens=200.0)
    # Until the first request finishes, both runs see identical observations.
    finish = min(r.finish_time_s for r in first.request_records if r.finish_time_s is not None)
    early = first.time_s <= finish
    np.testing.assert_array_equal(
        first.requested_clock_mhz[early], second.requested_clock_mhz[: int(np.sum(early))]
    )
