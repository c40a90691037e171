"""The plant's run-time power cap: the firmware's power controller, its averaging window
and overshoot, and the closed loop applying a controller's cap."""

from __future__ import annotations

import math

import pytest
from synthetic import make_plant

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.plant import ControllerError, PlantSimulation, Request, simulate
from gpugov.plant.gpu_physics import CLOCK_EVENT_SW_POWER_CAP, GpuParameters, GpuPhysics
from gpugov.plant.types import ServingObservation

PREFILL_TOKENS = 512


def run_prefill(gpu: GpuPhysics, seconds: float, step_s: float = 0.02) -> list[int]:
    """Run back-to-back prefill-only segments of ``step_s`` requested at the top clock;
    the realised clock index of each."""
    top = len(gpu.params.clock_mhz) - 1
    realised = []
    for _ in range(int(round(seconds / step_s))):
        index, (_, _, power) = gpu.busy_clock(top, PREFILL_TOKENS, 0, 0, 1.0)
        gpu.integrate(step_s, power, busy=True)
        realised.append(index)
    return realised


def highest_fitting(params: GpuParameters, cap_w: float) -> int:
    """The highest clock index whose prefill power fits ``cap_w``."""
    fitting = [i for i, p in enumerate(params.prefill_power_w) if p <= cap_w]
    return fitting[-1]


def test_cap_above_the_top_power_changes_nothing() -> None:
    plant = make_plant()
    params = GpuParameters.from_plant(plant)
    top_power = max(params.prefill_power_w)
    uncapped, capped = GpuPhysics(params, 0), GpuPhysics(params, 0)
    capped.set_power_cap(top_power + 10.0)
    assert run_prefill(uncapped, 5.0) == run_prefill(capped, 5.0)
    assert capped.energy_j == pytest.approx(uncapped.energy_j)
    assert capped.cap_overshoot_s == 0.0


def test_lower_cap_settles_at_the_highest_fitting_clock() -> None:
    plant = make_plant()
    params = GpuParameters.from_plant(plant)
    top = len(params.clock_mhz) - 1
    cap = 0.5 * (min(params.prefill_power_w) + max(params.prefill_power_w))
    gpu = GpuPhysics(params, top)
    gpu.set_power_cap(cap)
    realised = run_prefill(gpu, 10.0)
    settled = highest_fitting(params, cap)
    assert settled < top
    assert realised[-1] == settled
    assert gpu.clock_event_reasons & CLOCK_EVENT_SW_POWER_CAP
    assert gpu.average_power_w <= cap + 1e-6
    # A lower cap settles lower still.
    lower = GpuPhysics(params, top)
    lower.set_power_cap(cap - 100.0)
    assert run_prefill(lower, 10.0)[-1] < settled


def test_averaging_window_delays_the_response_and_overshoots() -> None:
    params = GpuParameters.from_plant(make_plant(power_cap_window_s=1.0))
    top = len(params.clock_mhz) - 1
    cap = 0.5 * (min(params.prefill_power_w) + max(params.prefill_power_w))
    gpu = GpuPhysics(params, top)  # idle: the averaged power is the idle power
    gpu.set_power_cap(cap)
    realised = run_prefill(gpu, 5.0)  # a burst starts
    first_drop = next(i for i, index in enumerate(realised) if index < top)
    assert first_drop > 0  # the clock holds until the averaged power crosses the cap
    assert realised[-1] == highest_fitting(params, cap)
    assert gpu.cap_overshoot_s == pytest.approx(first_drop * 0.02)
    # Without a window the same cap acts at once.
    instant = GpuPhysics(GpuParameters.from_plant(make_plant(power_cap_window_s=0.0)), top)
    instant.set_power_cap(cap)
    assert run_prefill(instant, 0.1)[1] == highest_fitting(params, cap)
    # A longer window delays it longer.
    slow = GpuPhysics(GpuParameters.from_plant(make_plant(power_cap_window_s=3.0)), top)
    slow.set_power_cap(cap)
    slow_realised = run_prefill(slow, 10.0)
    assert next(i for i, index in enumerate(slow_realised) if index < top) > first_drop


def test_raised_cap_lifts_the_ceiling_at_once() -> None:
    params = GpuParameters.from_plant(make_plant())
    top = len(params.clock_mhz) - 1
    gpu = GpuPhysics(params, top)
    gpu.set_power_cap(0.5 * (min(params.prefill_power_w) + max(params.prefill_power_w)))
    assert run_prefill(gpu, 10.0)[-1] < top
    gpu.set_power_cap(None)
    assert run_prefill(gpu, 0.04)[0] == top
    assert gpu.enforced_power_limit_w == params.power_limit_w


def test_a_cap_set_again_after_its_removal_comes_down_to_its_own_fit() -> None:
    """A cap the controller removes and later sets again acts as a first one: the
    clock comes down to the highest that fits it, not to the ceiling an older, lower cap
    had left (the lowest clock, until the averaged power crossed the new cap)."""
    params = GpuParameters.from_plant(make_plant())
    top = len(params.clock_mhz) - 1
    low = 0.5 * (params.prefill_power_w[0] + params.prefill_power_w[1])
    gpu = GpuPhysics(params, top)
    gpu.set_power_cap(low)
    assert run_prefill(gpu, 10.0)[-1] == 0
    gpu.set_power_cap(None)
    assert run_prefill(gpu, 10.0)[-1] == top  # the average is now the top clock's
    cap = 0.5 * (min(params.prefill_power_w) + max(params.prefill_power_w))
    gpu.set_power_cap(cap)
    realised = run_prefill(gpu, 2.0)
    fresh = GpuPhysics(params, top)
    run_prefill(fresh, 10.0)
    fresh.set_power_cap(cap)
    assert realised == run_prefill(fresh, 2.0)
    assert min(realised) == highest_fitting(params, cap) > 0


def test_cap_is_clamped_to_the_board_limit_and_checked() -> None:
    params = GpuParameters.from_plant(make_plant(power_limit_w=500.0))
    gpu = GpuPhysics(params, 0)
    assert gpu.set_power_cap(900.0) == 500.0
    for bad in (math.nan, math.inf, 0.0, -5.0):
        with pytest.raises(ValueError, match="power cap"):
            gpu.set_power_cap(bad)


def test_plant_rejects_a_negative_window() -> None:
    with pytest.raises(ValueError, match="power_cap_window_s"):
        make_plant(power_cap_window_s=-1.0)


class CapAt:
    """Top clock, and a power cap (a :class:`~gpugov.plant.types.PowerCapping`)."""

    def __init__(self, cap_w: float | None) -> None:
        self.requested_power_cap_w = cap_w
        self.limits: list[float | None] = []

    def __call__(self, observation: ServingObservation) -> float:
        self.limits.append(observation.power_limit_w)
        return observation.supported_clocks_mhz[-1]


def busy_workload() -> tuple[Request, ...]:
    return tuple(Request(i, 0.2 * i, 2000, 50) for i in range(60))


def test_closed_loop_applies_a_controllers_cap() -> None:
    plant = make_plant()
    free = simulate(busy_workload(), plant, controller=CapAt(None), control_period_s=0.5)
    capper = CapAt(350.0)
    capped = simulate(busy_workload(), plant, controller=capper, control_period_s=0.5)
    assert capped.metrics.energy_j < free.metrics.energy_j
    assert min(capped.realized_clock_mhz) < max(capped.realized_clock_mhz)
    assert capper.limits[0] == plant.power_limit_w  # before the first decision
    assert capper.limits[-1] == 350.0  # the observation reports the cap in force
    high = simulate(busy_workload(), plant, controller=CapAt(5000.0), control_period_s=0.5)
    assert high.metrics.energy_j == pytest.approx(free.metrics.energy_j)


def test_closed_loop_names_a_bad_cap() -> None:
    with pytest.raises(ControllerError, match="power cap"):
        simulate(busy_workload(), make_plant(), controller=CapAt(math.nan))


def test_a_run_reports_the_seconds_over_the_requested_cap_apart_from_the_board_limit() -> None:
    """A cap below the idle power no clock can hold: the GPU never exceeds its board limit,
    so the board-limit violation reads 0 s, and the result reported nothing else, so the
    cap looked held. The seconds over the requested cap are the result's
    ``cap_overshoot_s``; None for a run that set no cap."""
    plant = make_plant()
    idle = min(GpuParameters.from_plant(plant).idle_power_w)
    unholdable = simulate(
        busy_workload(), plant, controller=CapAt(0.5 * idle), control_period_s=0.5
    )
    metrics = unholdable.metrics
    assert metrics.power_cap_violation_s == 0.0
    assert metrics.cap_overshoot_s is not None
    # Over the cap from the first decision (0.5 s) to the end of the run.
    assert metrics.cap_overshoot_s == pytest.approx(metrics.simulated_duration_s - 0.5, abs=0.5)
    assert unholdable.as_dict()["metrics"]["cap_overshoot_s"] == metrics.cap_overshoot_s
    held = simulate(busy_workload(), plant, controller=CapAt(5000.0), control_period_s=0.5)
    assert held.metrics.cap_overshoot_s == 0.0
    free = simulate(busy_workload(), plant, controller=CapAt(None), control_period_s=0.5)
    assert free.metrics.cap_overshoot_s is None


def test_fast_forward_matches_iteration_by_iteration_under_a_cap() -> None:
    plant = make_plant(actuation_delay_s=0.0)
    workload = tuple(Request(i, 0.0, 300, 400) for i in range(32))
    outcomes = []
    for fast in (True, False):
        simulation = PlantSimulation(workload, plant, fast_forward=fast)
        simulation.set_power_cap(260.0)
        simulation.advance_to(30.0)
        outcomes.append((simulation.energy_j, simulation.records()))
    assert outcomes[0][0] == pytest.approx(outcomes[1][0], rel=1e-9)
    assert outcomes[0][1] == outcomes[1][1]


def test_board_limit_below_the_lowest_clock_slows_the_gpu_to_the_limit() -> None:
    """A board limit below what the lowest clock draws (an operator's ``nvidia-smi -pl``)
    is held as firmware holds it: the iteration is slowed to draw the limit, with SW power
    cap among the reasons, never run above the limit."""
    probe = GpuParameters.from_plant(make_plant())
    lowest_draw = min(probe.prefill_power_w[0], probe.decode_power_w[0])
    limit = 0.5 * (max(probe.idle_power_w) + lowest_draw)
    assert max(probe.idle_power_w) < limit < lowest_draw
    params = GpuParameters.from_plant(make_plant(power_limit_w=limit))
    gpu = GpuPhysics(params, len(params.clock_mhz) - 1)
    t_pf, _, power = gpu.iteration_parts(0, PREFILL_TOKENS, 0, 0, 1.0)
    index, (slowed_pf, _, slowed_power) = gpu.busy_clock(
        len(params.clock_mhz) - 1, PREFILL_TOKENS, 0, 0, 1.0
    )
    assert index == 0 and slowed_power == pytest.approx(limit)
    assert gpu.clock_event_reasons & CLOCK_EVENT_SW_POWER_CAP
    # Run a share of the time at the lowest clock, idle there for the rest: same mean power.
    idle = params.idle_power_w[0]
    assert slowed_pf == pytest.approx(t_pf * (power - idle) / (limit - idle))
    assert gpu.running_power_w == pytest.approx(power)
    # A lock at the lowest clock is slowed all the same, and says why.
    gpu.busy_clock(0, PREFILL_TOKENS, 0, 0, 1.0)
    assert gpu.clock_event_reasons & CLOCK_EVENT_SW_POWER_CAP
    # The closed loop never draws above the limit: no second over it.
    workload = [Request(i, 0.5 * i, PREFILL_TOKENS, 64) for i in range(20)]
    result = simulate(
        workload, make_plant(power_limit_w=limit), controller=maximum_clock_controller
    )
    assert result.metrics.power_cap_violation_s == 0.0
    assert max(result.power_w) <= limit + 1e-6
    assert result.metrics.completed_requests == len(workload)


def test_a_run_time_cap_below_the_lowest_clock_slows_the_gpu_to_the_cap() -> None:
    """A cap set at run time below what the lowest clock draws is held as the board limit
    is, once the cap's controller has come down to the lowest clock: the GPU was left at
    the lowest clock's draw, above the cap for as long as the load lasted."""
    params = GpuParameters.from_plant(make_plant(power_cap_window_s=1.0))
    lowest_draw = params.prefill_power_w[0]
    cap = 0.5 * (max(params.idle_power_w) + lowest_draw)
    assert max(params.idle_power_w) < cap < lowest_draw
    gpu = GpuPhysics(params, len(params.clock_mhz) - 1)
    gpu.set_power_cap(cap)
    realised = run_prefill(gpu, 10.0)
    assert realised[-1] == 0
    overshoot = gpu.cap_overshoot_s
    assert 0.0 < overshoot < 2.0  # the averaging window's, not the whole run's
    run_prefill(gpu, 10.0)
    assert gpu.cap_overshoot_s == pytest.approx(overshoot)
    assert gpu.slowdown > 1.0 and gpu.clock_event_reasons & CLOCK_EVENT_SW_POWER_CAP
    assert gpu.average_power_w == pytest.approx(cap, rel=1e-6)
    # Removing the cap runs the lowest clock at full speed again.
    gpu.set_power_cap(None)
    gpu.busy_clock(0, PREFILL_TOKENS, 0, 0, 1.0)
    assert gpu.slowdown == 1.0
    # In the closed loop: the iterations take longer, the power stays at the cap.
    workload = tuple(Request(i, 0.0, 300, 400) for i in range(32))
    plant = make_plant(actuation_delay_s=0.0, power_cap_window_s=0.0)
    decode_draw = GpuPhysics(GpuParameters.from_plant(plant), 0).iteration_parts(
        0, 0, len(workload), 0, 1.0
    )[2]
    low_cap = 0.5 * (max(GpuParameters.from_plant(plant).idle_power_w) + decode_draw)
    outcomes = []
    for fast in (True, False):
        simulation = PlantSimulation(workload, plant, fast_forward=fast)
        simulation.set_power_cap(low_cap)
        simulation.advance_to(1.0)
        assert simulation.gpu.slowdown > 1.0
        simulation.advance_to(60.0)
        assert simulation.done and simulation.gpu.cap_overshoot_s < 0.5
        outcomes.append((simulation.energy_j, simulation.records()))
    assert outcomes[0][0] == pytest.approx(outcomes[1][0], rel=1e-9)
    for fast, slow in zip(outcomes[0][1], outcomes[1][1], strict=True):
        assert (fast.first_token_time_s, fast.finish_time_s) == pytest.approx(
            (slow.first_token_time_s, slow.finish_time_s), rel=1e-9
        )


def test_fast_forward_matches_iteration_by_iteration_when_slowed_below_the_lowest_clock() -> None:
    """The closed-form decode stretch stretches each iteration as the slowdown does."""
    workload = tuple(Request(i, 0.0, 300, 400) for i in range(32))
    probe = GpuParameters.from_plant(make_plant())
    decode_draw = GpuPhysics(probe, 0).iteration_parts(0, 0, len(workload), 0, 1.0)[2]
    limit = 0.5 * (max(probe.idle_power_w) + decode_draw)
    plant = make_plant(actuation_delay_s=0.0, power_limit_w=limit)
    outcomes = []
    for fast in (True, False):
        simulation = PlantSimulation(workload, plant, fast_forward=fast)
        simulation.advance_to(1.0)
        assert simulation.gpu.slowdown > 1.0 and not simulation.done
        simulation.advance_to(30.0)
        assert simulation.done
        outcomes.append((simulation.energy_j, simulation.records()))
    assert outcomes[0][0] == pytest.approx(outcomes[1][0], rel=1e-9)
    for fast, slow in zip(outcomes[0][1], outcomes[1][1], strict=True):
        assert (fast.first_token_time_s, fast.finish_time_s) == pytest.approx(
            (slow.first_token_time_s, slow.finish_time_s), rel=1e-9
        )
        assert fast.decode_energy_j == pytest.approx(slow.decode_energy_j, rel=1e-9)


def test_a_cap_below_the_idle_power_still_holds_the_board_limit() -> None:
    """A run-time cap at or below the idle power cannot be held, but the board limit still
    is: on a board whose lowest clock draws more than its limit the GPU is slowed to the
    board limit. It ran unslowed at the lowest clock's full draw, above the board limit."""
    probe = GpuParameters.from_plant(make_plant())
    lowest_draw = min(probe.prefill_power_w[0], probe.decode_power_w[0])
    limit = 0.5 * (max(probe.idle_power_w) + lowest_draw)
    plant = make_plant(power_limit_w=limit, power_cap_window_s=0.0)
    params = GpuParameters.from_plant(plant)
    gpu = GpuPhysics(params, len(params.clock_mhz) - 1)
    gpu.set_power_cap(0.5 * params.idle_power_w[0])
    run_prefill(gpu, 1.0)
    assert gpu.power_w == pytest.approx(limit)
    assert gpu.power_violation_s == 0.0
    assert gpu.cap_overshoot_s > 0.0
    result = simulate(
        busy_workload(), plant, controller=CapAt(0.5 * params.idle_power_w[0]), control_period_s=0.5
    )
    assert result.metrics.power_cap_violation_s == 0.0
    assert max(result.power_w) <= limit + 1e-6
    assert result.metrics.cap_overshoot_s is not None and result.metrics.cap_overshoot_s > 0.0


def test_a_gpu_starts_idle_within_its_board_limit() -> None:
    """A board limit below the top clock's idle power holds the idle GPU lower from the
    start, as every later idle segment is: the first sample read the top clock's idle
    power, above the limit, and the die started at that power's temperature."""
    probe = GpuParameters.from_plant(make_plant())
    limit = 0.5 * (probe.idle_power_w[0] + probe.idle_power_w[-1])
    assert probe.idle_power_w[0] < limit < probe.idle_power_w[-1]
    plant = make_plant(power_limit_w=limit)
    params = GpuParameters.from_plant(plant)
    top = len(params.clock_mhz) - 1
    gpu = GpuPhysics(params, top)
    held = max(i for i, p in enumerate(params.idle_power_w) if p <= limit)
    assert gpu.realized_index == held
    assert gpu.power_w == params.idle_power_w[held] <= limit
    assert gpu.temperature_c == pytest.approx(
        params.steady_temperature_c(params.idle_power_w[held])
    )
    assert gpu.clock_event_reasons & CLOCK_EVENT_SW_POWER_CAP
    workload = [Request(0, 1.0, PREFILL_TOKENS, 8)]
    result = simulate(workload, plant, controller=maximum_clock_controller)
    assert max(result.power_w) <= limit + 1e-9
