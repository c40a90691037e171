"""Tests of the open-loop LP plan, its replay controller, plan I/O and the burst shift."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from gpugov.controllers.open_loop import (
    OpenLoopClockController,
    PlanFormatError,
    arrival_work_grid,
    fluid_rollout,
    forecast_request_work_seconds,
    load_plan,
    open_loop_clock_controller,
    optimize_open_loop,
    save_plan,
    select_frequency_experiment_window,
    service_levels,
    shift_largest_burst,
)
from gpugov.plant.types import Request, ServingObservation
from gpugov.plant.workload import workload_checksum


def _observation(time_s: float) -> ServingObservation:
    return ServingObservation(
        time_s=time_s,
        step_index=0,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
    )


def _bursty_workload(scale: float = 1.0) -> tuple[Request, ...]:
    """Two requests per second with a heavy burst in [30, 40) s; ``scale`` grows prompts."""
    requests = []
    for index in range(120):
        arrival = 0.5 * index
        prompt = 600 + 50 * (index % 9)
        if 30.0 <= arrival < 40.0:
            prompt *= 6
        requests.append(Request(index, arrival, max(1, round(prompt * scale)), 64 + index % 5))
    return tuple(requests)


# --------------------------------------------------------------------- forecasts
def test_forecast_never_reads_output_tokens(synthetic_profile):
    short = Request(1, 0.0, 800, 1)
    long = Request(1, 0.0, 800, 100_000)
    work = forecast_request_work_seconds(short, synthetic_profile, 128.0)
    assert work == forecast_request_work_seconds(long, synthetic_profile, 128.0)
    assert work == pytest.approx(800 / 12_000.0 + 128 / 2_500.0)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="expected_output_tokens must be finite"):
            forecast_request_work_seconds(short, synthetic_profile, bad)


def test_arrival_work_grid_bins_and_truncates(synthetic_profile):
    requests = [Request(0, 0.2, 600, 5), Request(1, 0.9, 600, 5), Request(2, 2.5, 600, 5)]
    requests.append(Request(3, 3.0, 600, 5))  # beyond a 3-period horizon
    grid = arrival_work_grid(requests, synthetic_profile, 3, 1.0, 128.0)
    one = forecast_request_work_seconds(requests[0], synthetic_profile, 128.0)
    np.testing.assert_allclose(grid, [2 * one, 0.0, one])


# ---------------------------------------------------------------------- the plan
def test_plan_is_feasible_and_optimal(synthetic_plant):
    workload = _bursty_workload()
    plan = optimize_open_loop(workload, synthetic_plant, expected_output_tokens=96.0)
    profile = synthetic_plant.profile
    assert plan.success and math.isfinite(plan.objective)
    assert plan.optimization_method == "HiGHS linear program"
    assert plan.time_s.size == 60 and plan.predicted_backlog_s.size == 61
    np.testing.assert_allclose(plan.time_s, np.arange(60.0))
    assert np.all(plan.continuous_clock_mhz >= profile.minimum_clock_mhz - 1e-9)
    assert np.all(plan.continuous_clock_mhz <= profile.maximum_clock_mhz + 1e-9)
    assert set(plan.applied_clock_mhz) <= set(profile.clock_mhz)
    assert np.all(plan.applied_clock_mhz <= plan.continuous_clock_mhz + 1e-6)
    assert plan.workload_checksum == workload_checksum(workload)
    assert plan.profile_status == "synthetic"
    # The LP optimum serves work as soon as possible: u_k = clip((b_{k-1} + w_k)/h, u_min, 1).
    work = arrival_work_grid(workload, profile, 60, 1.0, 96.0)
    levels = service_levels(profile)
    backlog = 0.0
    expected_service = []
    for value in work:
        service = float(np.clip(backlog + value, levels[0], 1.0))
        backlog = max(0.0, backlog + value - service)
        expected_service.append(service)
    np.testing.assert_allclose(
        plan.continuous_clock_mhz,
        np.interp(expected_service, levels, profile.clock_mhz),
        atol=1e-5,
    )
    # The burst drives the plan up; quiet periods sit at the minimum service level.
    assert plan.continuous_clock_mhz[30:40].max() > plan.continuous_clock_mhz[:30].max()


def test_predicted_backlog_is_the_fluid_rollout(synthetic_plant):
    workload = _bursty_workload()
    plan = optimize_open_loop(workload, synthetic_plant)
    work = arrival_work_grid(workload, synthetic_plant.profile, 60, 1.0, 128.0)
    backlog, temperature, power = fluid_rollout(plan.applied_clock_mhz, work, synthetic_plant, 1.0)
    np.testing.assert_array_equal(plan.predicted_backlog_s, backlog)
    assert backlog[0] == 0.0 and np.all(backlog >= 0.0)
    assert temperature[0] == synthetic_plant.ambient_temperature_c
    assert np.all((power > 0.0) & (power <= 1.0 + 1e-12))
    # The continuous solution clears the backlog wherever capacity allows.
    continuous_backlog, _, _ = fluid_rollout(plan.continuous_clock_mhz, work, synthetic_plant, 1.0)
    assert np.all(continuous_backlog <= backlog + 1e-9)


@pytest.mark.parametrize("scale", [1.3, 2.0, 4.0])
def test_more_work_never_plans_lower_clocks(synthetic_plant, scale):
    base = optimize_open_loop(_bursty_workload(), synthetic_plant)
    heavier = optimize_open_loop(_bursty_workload(scale), synthetic_plant)
    assert np.all(heavier.continuous_clock_mhz >= base.continuous_clock_mhz - 1e-6)
    assert np.all(heavier.applied_clock_mhz >= base.applied_clock_mhz)
    # Denser arrivals (every request duplicated) also never lower the plan.
    doubled = list(_bursty_workload())
    doubled += [replace(r, request_id=r.request_id + 1000) for r in doubled]
    denser = optimize_open_loop(doubled, synthetic_plant)
    assert np.all(denser.applied_clock_mhz >= base.applied_clock_mhz)


def test_plan_errors(synthetic_plant, plant_factory, profile_factory):
    with pytest.raises(ValueError, match="horizon and control period must be positive"):
        optimize_open_loop(_bursty_workload(), synthetic_plant, horizon_s=0.0)
    with pytest.raises(ValueError, match="horizon and control period must be positive"):
        optimize_open_loop(_bursty_workload(), synthetic_plant, control_period_s=-1.0)


@pytest.mark.parametrize("shape", ["flat", "peaks-at-lowest"])
def test_plan_without_a_faster_clock_is_the_lowest_clock(shape, plant_factory, profile_factory):
    """A profile where no clock serves more than the lowest (a memory-bound GPU's rates,
    flat in the clock) is planned at the lowest clock throughout. It was refused, and
    `bench controllers` on such a profile ended in a traceback."""
    profile = profile_factory()
    count = profile.clock_mhz.size
    if shape == "flat":
        prefill, decode = np.full(count, 9_000.0), np.full(count, 2_000.0)
    else:
        prefill = np.linspace(9_000.0, 8_000.0, count)
        decode = np.linspace(2_000.0, 1_900.0, count)
    profile = replace(profile, prefill_tokens_per_s=prefill, decode_tokens_per_s=decode)
    plan = optimize_open_loop(_bursty_workload(), plant_factory(profile), horizon_s=20.0)
    assert plan.success
    assert plan.applied_clock_mhz.size == 20
    np.testing.assert_array_equal(plan.applied_clock_mhz, profile.minimum_clock_mhz)
    np.testing.assert_array_equal(plan.continuous_clock_mhz, profile.minimum_clock_mhz)
    assert np.isfinite(plan.objective)
    assert np.all(np.isfinite(plan.predicted_backlog_s))
    assert plan.predicted_backlog_s.size == 21


def test_empty_workload_plans_minimum_clock(synthetic_plant):
    plan = optimize_open_loop((), synthetic_plant, horizon_s=5.0)
    assert plan.success
    np.testing.assert_allclose(plan.applied_clock_mhz, synthetic_plant.profile.minimum_clock_mhz)


# -------------------------------------------------------------------- replaying
def test_controller_replays_the_plan(synthetic_plant):
    plan = optimize_open_loop(_bursty_workload(), synthetic_plant)
    controller = open_loop_clock_controller(plan)
    assert isinstance(controller, OpenLoopClockController)
    assert controller.__name__ == "open-loop"
    assert controller.plan_dt_s == 1.0
    assert controller.plans_by_step[0] == tuple(plan.applied_clock_mhz)
    assert controller.plan_start_times_by_step == {0: 0.0}
    for time_s, index in ((0.0, 0), (0.99, 0), (1.0, 1), (35.5, 35), (59.9, 59), (500.0, 59)):
        assert controller(_observation(time_s)) == plan.applied_clock_mhz[index]
    # A negative time (never produced by the plant) maps to the first period.
    assert controller(_observation(-3.0)) == plan.applied_clock_mhz[0]


# ---------------------------------------------------------------------- plan I/O
def test_save_load_round_trip(tmp_path, synthetic_plant):
    plan = optimize_open_loop(_bursty_workload(), synthetic_plant)
    path = save_plan(plan, tmp_path / "plan.json")
    loaded = load_plan(path)
    for name in ("time_s", "continuous_clock_mhz", "applied_clock_mhz", "predicted_backlog_s"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(plan, name))
    for name in (
        "objective",
        "optimization_method",
        "success",
        "message",
        "control_period_s",
        "workload_checksum",
        "profile_status",
    ):
        assert getattr(loaded, name) == getattr(plan, name)
    # A failed plan's NaN objective survives as JSON null.
    failed = replace(plan, objective=float("nan"), success=False)
    again = load_plan(save_plan(failed, tmp_path / "failed.json"))
    assert math.isnan(again.objective) and again.success is False
    assert json.loads((tmp_path / "failed.json").read_text())["objective"] is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("applied_clock_mhz"), "key 'applied_clock_mhz' must be a non-empty"),
        (lambda d: d.update(format="other"), "key 'format' must be"),
        (lambda d: d["predicted_backlog_s"].pop(), "key 'predicted_backlog_s' has 60 values"),
        (lambda d: d["applied_clock_mhz"].__setitem__(3, "x"), r"'applied_clock_mhz'\[3\]"),
        (lambda d: d.update(control_period_s=0), "key 'control_period_s' must be positive"),
        (lambda d: d.update(success="yes"), "key 'success' must be true or false"),
        (lambda d: d.update(message=None), "key 'message' must be a string"),
        (lambda d: d["applied_clock_mhz"].__setitem__(0, -5.0), "must be positive"),
        # Each loaded: a clock no GPU runs at, a status no profile has.
        (
            lambda d: d["applied_clock_mhz"].__setitem__(2, 1e9),
            r"key 'applied_clock_mhz'\[2\] is 1e\+09 MHz; no GPU clocks above 100000 MHz",
        ),
        (
            lambda d: d["continuous_clock_mhz"].__setitem__(0, 1e9),
            r"key 'continuous_clock_mhz'\[0\] is 1e\+09 MHz",
        ),
        (
            lambda d: d.update(profile_status="bogus"),
            r"key 'profile_status' must be one of measured, .*got 'bogus'",
        ),
        # Integers too large for a float: each ended the load in an OverflowError traceback.
        (lambda d: d["time_s"].__setitem__(-1, 10**400), r"key 'time_s'\[59\] is not finite"),
        (
            lambda d: d["predicted_backlog_s"].__setitem__(0, 10**400),
            r"key 'predicted_backlog_s'\[0\] is not finite",
        ),
        (lambda d: d.update(control_period_s=10**400), "key 'control_period_s' must be finite"),
        (lambda d: d.update(objective=10**400), "key 'objective' must be a finite number or null"),
    ],
)
def test_load_rejects_bad_plans(tmp_path, synthetic_plant, mutate, message):
    plan = optimize_open_loop(_bursty_workload(), synthetic_plant)
    data = plan.as_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFormatError, match=message) as error:
        load_plan(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("period", [5e-324, 1e-9, 0.049])
def test_load_refuses_a_period_below_the_callers_minimum(tmp_path, synthetic_plant, period):
    """A denormal period passed the positivity check and overflowed the period index."""
    data = optimize_open_loop(_bursty_workload(), synthetic_plant).as_dict()
    data["control_period_s"] = period
    path = tmp_path / "short.json"
    path.write_text(json.dumps(data))
    assert load_plan(path).control_period_s == period  # any positive one without a minimum
    with pytest.raises(PlanFormatError, match=r"key 'control_period_s' must be at least 0\.05 s"):
        load_plan(path, min_period_s=0.05)


def test_load_reports_unreadable_files(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(PlanFormatError, match=r"broken.json:1: not valid JSON"):
        load_plan(path)
    with pytest.raises(PlanFormatError, match="cannot read plan"):
        load_plan(tmp_path / "missing.json")


# ------------------------------------------------------------------- burst shift
def test_shift_largest_burst_moves_only_the_burst(synthetic_profile):
    workload = _bursty_workload()
    shifted = shift_largest_burst(workload, synthetic_profile)
    assert len(shifted) == len(workload)
    original = {r.request_id: r for r in workload}
    moved = {
        r.request_id for r in shifted if r.arrival_time_s != original[r.request_id].arrival_time_s
    }
    assert moved == {r.request_id for r in workload if 30.0 <= r.arrival_time_s < 40.0}
    for request in shifted:
        before = original[request.request_id]
        expected = (
            before.arrival_time_s - 20.0 if request.request_id in moved else before.arrival_time_s
        )
        assert request.arrival_time_s == pytest.approx(expected)
        assert (request.prompt_tokens, request.output_tokens) == (
            before.prompt_tokens,
            before.output_tokens,
        )
    keys = [(r.arrival_time_s, r.request_id) for r in shifted]
    assert keys == sorted(keys)


def test_shift_edge_cases(synthetic_profile):
    assert shift_largest_burst((), synthetic_profile) == ()
    early = tuple(Request(i, 0.5 * i, 500, 10) for i in range(20))  # all before 10 s
    assert shift_largest_burst(early, synthetic_profile) == early
    with pytest.raises(ValueError, match="window_s and shift_s must be positive"):
        shift_largest_burst(early, synthetic_profile, window_s=0.0)
    with pytest.raises(ValueError, match="window_s and shift_s must be positive"):
        shift_largest_burst(early, synthetic_profile, shift_s=-1.0)


# -------------------------------------------------------------- window selection
def _long_trace() -> tuple[Request, ...]:
    """Three minutes at one request per second; a burst at 95-100 s."""
    requests = []
    for index in range(180):
        prompt = 5_000 if 95 <= index < 100 else 700
        requests.append(Request(index, float(index) + 0.25, prompt, 50))
    return tuple(requests)


def test_window_selection_is_deterministic_with_metadata(synthetic_profile):
    trace = _long_trace()
    window, metadata = select_frequency_experiment_window(trace, synthetic_profile)
    again = select_frequency_experiment_window(trace, synthetic_profile)
    assert (window, metadata) == again
    # The burst bin (90-100 s) is shift-eligible for aligned starts 40-70 s.
    start = metadata["source_window_start_s"]
    assert start == 40.0  # starts 40-70 s tie on burst and total work; earliest wins
    assert metadata["source_window_end_s"] == start + 60.0
    assert metadata["request_count"] == len(window) == 60
    assert metadata["shiftable_burst_start_s"] == 90.0 - start
    assert metadata["shiftable_burst_request_count"] == 10
    assert metadata["expected_output_tokens"] == 128.0
    assert "largest shift-eligible" in str(metadata["selection_rule"])
    assert all(0.0 <= r.arrival_time_s < 60.0 for r in window)
    work = sum(forecast_request_work_seconds(r, synthetic_profile, 128.0) for r in window)
    assert metadata["forecast_work_s"] == pytest.approx(work)
    assert metadata["forecast_utilization_at_max_clock"] == pytest.approx(work / 60.0)
    # Ties on burst and total work go to the earliest start.
    flat = tuple(Request(i, float(i), 700, 50) for i in range(200))
    _, flat_metadata = select_frequency_experiment_window(flat, synthetic_profile)
    assert flat_metadata["source_window_start_s"] == 0.0


def test_window_selection_errors(synthetic_profile):
    trace = _long_trace()
    with pytest.raises(ValueError, match="workload must contain at least one request"):
        select_frequency_experiment_window((), synthetic_profile)
    with pytest.raises(ValueError, match="must be positive"):
        select_frequency_experiment_window(trace, synthetic_profile, horizon_s=0.0)
    with pytest.raises(ValueError, match="horizon is too short"):
        select_frequency_experiment_window(trace, synthetic_profile, horizon_s=25.0)
    with pytest.raises(ValueError, match="workload must be sorted by arrival_time_s"):
        select_frequency_experiment_window(trace[::-1], synthetic_profile)
    overloaded = tuple(Request(i, 0.1 * i, 20_000, 50) for i in range(900))
    with pytest.raises(ValueError, match="no trace window contains a shiftable") as caught:
        select_frequency_experiment_window(overloaded, synthetic_profile)
    # Why, in the user's terms: every window with a burst to move is over the capacity.
    assert "whose forecast work fits 60 s at the maximum clock; every such" in str(caught.value)
    short = tuple(Request(i, float(i), 700, 50) for i in range(15))
    with pytest.raises(ValueError, match="with requests 20 s or more into it") as caught:
        select_frequency_experiment_window(short, synthetic_profile)
    assert "the 15 request(s) arrive from 0.00 s to 14.00 s" in str(caught.value)
    assert "(windows start on a multiple of 10 s)" in str(caught.value)
    with pytest.raises(ValueError, match="start on a multiple of 5 s"):
        select_frequency_experiment_window(short, synthetic_profile, burst_window_s=5.0)


def test_a_service_curve_that_dips_plans_on_the_clocks_that_serve_more(
    plant_factory, profile_factory
):
    """A noisy (measured) profile whose rate dips at one clock, or peaks below the top:
    the planner raised, and `gpugov bench controllers` ended in a traceback on it."""
    profile = profile_factory()
    dipped = profile.decode_tokens_per_s.copy()
    dipped[3] = dipped[1]  # clock 3 serves less than clock 2
    peaked = profile.decode_tokens_per_s.copy()
    peaked[-2] = peaked[-1] * 1.2  # the clock below the top serves more than the top
    for decode in (dipped, peaked):
        plant = plant_factory(replace(profile, decode_tokens_per_s=decode))
        plan = optimize_open_loop(_bursty_workload(), plant)
        assert plan.success
        levels = service_levels(plant.profile)
        for clock in plan.applied_clock_mhz:
            index = int(np.searchsorted(plant.profile.clock_mhz, clock))
            assert np.all(levels[:index] < levels[index])  # serves more than every one below
