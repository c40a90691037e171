"""Hindsight oracles and the fluid LP bound on a tiny synthetic scenario."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
from synthetic import make_plant

from gpugov.controllers.baseline import FixedClockController, reactive_clock_controller
from gpugov.controllers.oracles import (
    BestFixedClock,
    ScheduleController,
    WindowOracle,
    best_fixed_clock,
    fluid_energy_lower_bound,
    holds_slo,
    maximum_clock_reference,
    oracle_capture,
    phase_token_costs,
    window_oracle,
)
from gpugov.controllers.oracles.bound import _lower_hull
from gpugov.plant import PerformanceProfile, PlantSimulation, ServingPlant, ServingResult, simulate
from gpugov.plant.types import Request


def _workload() -> tuple[Request, ...]:
    """30 s of arrivals with a burst in the middle (the synthetic GPU is busy, not full)."""
    requests = []
    time_s = 0.0
    for index in range(90):
        time_s += 0.15 if 30 <= index < 50 else 0.4
        requests.append(
            Request(
                request_id=index,
                arrival_time_s=round(time_s, 3),
                prompt_tokens=400 + 173 * (index % 7),
                output_tokens=20 + 23 * (index % 5),
            )
        )
    return tuple(requests)


@dataclass(frozen=True)
class Scenario:
    workload: tuple[Request, ...]
    plant: ServingPlant
    reference: ServingResult
    best: BestFixedClock
    oracle: WindowOracle


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    workload = _workload()
    plant = make_plant()
    reference = maximum_clock_reference(workload, plant)
    best = best_fixed_clock(workload, plant, reference=reference, coarse_points=4)
    oracle = window_oracle(
        workload,
        plant,
        reference=reference,
        continuation_clock_mhz=best.clock_mhz,
        window_s=5.0,
        lookahead_s=5.0,
        coarse_levels=5,
        neighbour_steps=(3,),
    )
    return Scenario(workload, plant, reference, best, oracle)


def _run(scenario: Scenario, controller: object) -> ServingResult:
    return simulate(scenario.workload, scenario.plant, controller=controller)  # type: ignore[arg-type]


def _holds(scenario: Scenario, result: ServingResult) -> bool:
    return holds_slo(result.metrics.slo_attainment, scenario.reference.metrics.slo_attainment)


# ------------------------------------------------------------------ SLO and capture
def test_holds_slo_is_within_one_point_of_the_reference() -> None:
    assert holds_slo(0.99, 1.0)
    assert holds_slo(0.985, 0.99)
    assert not holds_slo(0.9899, 1.0)
    assert holds_slo(1.0, 0.5)
    assert holds_slo(0.95, 1.0, tolerance=0.05)
    assert holds_slo(None, None)
    assert not holds_slo(None, 1.0)
    assert not holds_slo(1.0, None)
    with pytest.raises(ValueError, match="tolerance"):
        holds_slo(1.0, 1.0, tolerance=-0.01)


def test_oracle_capture_formula_and_edge_cases() -> None:
    assert oracle_capture(100.0, 100.0, 60.0, holds=True) == 0.0
    assert oracle_capture(100.0, 60.0, 60.0, holds=True) == 1.0
    assert oracle_capture(100.0, 80.0, 60.0, holds=True) == pytest.approx(0.5)
    assert oracle_capture(100.0, 50.0, 60.0, holds=True) == pytest.approx(1.25)
    assert oracle_capture(100.0, 110.0, 60.0, holds=True) == pytest.approx(-0.25)
    # Failing the SLO: no capture, whatever the energy.
    assert oracle_capture(100.0, 60.0, 60.0, holds=False) is None
    # The oracle saves nothing (or costs more): undefined.
    assert oracle_capture(100.0, 90.0, 100.0, holds=True) is None
    assert oracle_capture(100.0, 90.0, 100.0 - 1e-9, holds=True) is None
    assert oracle_capture(100.0, 90.0, 120.0, holds=True) is None
    with pytest.raises(ValueError, match="finite"):
        oracle_capture(100.0, math.nan, 60.0, holds=True)


# --------------------------------------------------------------------------- fork
def test_fork_runs_on_exactly_like_a_deep_copy() -> None:
    workload = _workload()
    plant = make_plant()
    simulation = PlantSimulation(workload, plant)
    simulation.request_clock(900.0)
    simulation.advance_to(12.3)
    forked = simulation.fork()
    copied = copy.deepcopy(simulation)
    for run in (forked, copied):
        run.request_clock(600.0)
        run.advance_to(25.0)
    assert forked.energy_j == copied.energy_j
    assert forked.temperature_c == copied.temperature_c
    assert forked.records() == copied.records()
    # The original is untouched.
    assert simulation.time_s == pytest.approx(12.3)
    assert simulation.energy_j < forked.energy_j


# ------------------------------------------------------------------- best fixed
def test_best_fixed_clock_holds_and_the_next_lower_clock_does_not(scenario: Scenario) -> None:
    best = scenario.best
    assert _holds(scenario, best.result)
    assert best.result.metrics.energy_j <= scenario.reference.metrics.energy_j
    clocks = scenario.plant.profile.clock_mhz
    index = int(np.searchsorted(clocks, best.clock_mhz))
    assert index > 0, "the synthetic scenario should need more than the minimum clock"
    lower = _run(scenario, FixedClockController(float(clocks[index - 1])))
    assert not _holds(scenario, lower)


def test_best_fixed_clock_is_the_cheapest_holding_clock_it_evaluated(scenario: Scenario) -> None:
    best = scenario.best
    holding = [e for e in best.evaluations if e.holds_slo]
    assert min(e.energy_j for e in holding) == best.result.metrics.energy_j
    assert best.evaluations[0].clock_mhz == scenario.plant.profile.maximum_clock_mhz
    assert len({e.clock_mhz for e in best.evaluations}) == len(best.evaluations)
    assert best.lowest_holding_clock_mhz <= best.clock_mhz
    # Every evaluation is a real simulation of that fixed clock.
    sample = best.evaluations[-1]
    rerun = _run(scenario, FixedClockController(sample.clock_mhz))
    assert rerun.metrics.energy_j == pytest.approx(sample.energy_j, rel=1e-12)


# ---------------------------------------------------------------- window oracle
def test_window_oracle_saves_energy_and_holds_the_slo(scenario: Scenario) -> None:
    oracle = scenario.oracle
    assert oracle.holds_slo
    assert _holds(scenario, oracle.result)
    assert oracle.result.metrics.energy_j <= scenario.reference.metrics.energy_j
    # It includes the constant best-fixed schedule, so it is never worse than that.
    assert oracle.result.metrics.energy_j <= scenario.best.result.metrics.energy_j + 1e-9
    assert oracle.candidate_runs > 0
    assert oracle.attempts[0]["source"].startswith("greedy")


def test_window_oracle_schedule_replays_to_the_reported_result(scenario: Scenario) -> None:
    oracle = scenario.oracle
    replay = _run(scenario, ScheduleController(oracle.schedule_mhz, oracle.window_s))
    assert replay.metrics.energy_j == pytest.approx(oracle.result.metrics.energy_j, rel=1e-12)
    assert replay.metrics.slo_attainment == oracle.result.metrics.slo_attainment
    supported = set(scenario.plant.profile.clock_mhz.tolist())
    assert set(oracle.schedule_mhz) <= supported


def test_schedule_controller_indexes_windows_and_clamps() -> None:
    controller = ScheduleController([500.0, 700.0], 5.0)

    class Observation:
        def __init__(self, time_s: float) -> None:
            self.time_s = time_s

    assert controller(Observation(-1.0)) == 500.0  # type: ignore[arg-type]
    assert controller(Observation(4.999)) == 500.0  # type: ignore[arg-type]
    assert controller(Observation(5.0)) == 700.0  # type: ignore[arg-type]
    assert controller(Observation(99.0)) == 700.0  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ScheduleController([], 5.0)


def test_window_oracle_rejects_a_window_off_the_control_grid() -> None:
    with pytest.raises(ValueError, match="whole number"):
        window_oracle(_workload()[:5], make_plant(), window_s=2.5)


# ------------------------------------------------------------------ fluid LP bound
def test_lp_bound_is_below_every_controller(scenario: Scenario) -> None:
    bound = fluid_energy_lower_bound(scenario.workload, scenario.plant)
    assert bound.success
    assert 0.0 < bound.idle_floor_j < bound.energy_j
    energies = {
        "max": scenario.reference.metrics.energy_j,
        "best fixed": scenario.best.result.metrics.energy_j,
        "window oracle": scenario.oracle.result.metrics.energy_j,
        "reactive": _run(scenario, reactive_clock_controller).metrics.energy_j,
    }
    for evaluation in scenario.best.evaluations:
        energies[f"fixed {evaluation.clock_mhz:g}"] = evaluation.energy_j
    for name, energy in energies.items():
        assert bound.energy_j <= energy, name


def test_lp_bound_tightens_with_finer_windows(scenario: Scenario) -> None:
    fine = fluid_energy_lower_bound(scenario.workload, scenario.plant, window_s=0.5)
    coarse = fluid_energy_lower_bound(scenario.workload, scenario.plant, window_s=5.0)
    assert fine.energy_j >= coarse.energy_j - 1e-6 * coarse.energy_j


def test_lp_bound_of_one_request_is_its_cheapest_energy() -> None:
    plant = make_plant()
    request = Request(0, 0.0, 1000, 11)
    bound = fluid_energy_lower_bound([request], plant)
    costs = phase_token_costs(plant, 1000.0)
    expected = 1000 * costs["prefill_j"].min() + 10 * costs["decode_j"].min()
    assert bound.windows == 0
    assert bound.energy_j == pytest.approx(expected)
    # A lone request served at the best fixed clock cannot beat it.
    clocks = plant.profile.clock_mhz
    best = min(
        simulate([request], plant, controller=FixedClockController(float(c))).metrics.energy_j
        for c in clocks[::10]
    )
    assert bound.energy_j <= best


def test_lower_hull_keeps_the_convex_efficient_points() -> None:
    seconds = np.array([1.0, 2.0, 3.0, 4.0, 2.5, 5.0])
    cost = np.array([10.0, 6.0, 4.0, 3.5, 9.0, 3.6])
    hull = _lower_hull(seconds, cost)
    assert hull.tolist() == [0, 1, 2, 3]
    # A point above the chord of its neighbours is dropped.
    hull = _lower_hull(np.array([1.0, 2.0, 3.0]), np.array([10.0, 9.0, 2.0]))
    assert hull.tolist() == [0, 2]


def test_phase_token_costs_match_the_profile_at_the_reference_batch() -> None:
    plant = make_plant()
    profile = plant.profile
    costs = phase_token_costs(plant, 1.0)
    top = profile.maximum_clock_mhz
    assert costs["prefill_s"][-1] == pytest.approx(1.0 / profile.rate("prefill", top))
    assert costs["prefill_j"][-1] == pytest.approx(
        profile.power("prefill", top) / profile.rate("prefill", top)
    )
    # The best batch is never slower per token than the reference batch and context.
    assert np.all(costs["decode_s"] <= (1.0 + 1e-9) / profile.decode_tokens_per_s)
    assert np.all(costs["decode_marginal_j"] <= costs["decode_j"])


def _brute_force_decode_costs(plant: ServingPlant, context: float) -> dict[str, np.ndarray]:
    """Per clock, the fastest and cheapest decode token over every batch 1 to the plant's
    largest, one batch at a time (the definition the bound's costs must not exceed)."""
    profile = plant.profile
    model = profile.decode_latency_model
    power_model = profile.decode_power_batch_model
    b_ref, c_ref = (
        model.reference_batch_size,
        model.reference_batch_size * (model.reference_context_tokens),
    )
    idle = profile.idle_power_w
    seconds, joules = [], []
    for batch in range(1, plant.max_batch_size + 1):
        iteration = (b_ref / profile.decode_tokens_per_s) * (
            model.weight_fraction
            + model.batch_fraction * batch / b_ref
            + model.kv_fraction * batch * context / c_ref
        )
        factor = 1.0 if power_model is None else power_model.factor(batch, b_ref)
        power = idle + (profile.decode_power_w - idle) * factor
        seconds.append(iteration / batch)
        joules.append(iteration / batch * power)
    return {"decode_s": np.min(seconds, axis=0), "decode_j": np.min(joules, axis=0)}


@pytest.mark.parametrize("largest", [300, 20_000])
def test_decode_costs_never_exceed_the_best_batch(largest: int) -> None:
    """Up to a few thousand batches the costs are each batch's; past them a bound over
    each stretch of batches, never above any batch's own cost and within a percent."""
    plant = replace(make_plant(), max_batch_size=largest)
    costs = phase_token_costs(plant, 300.0)
    exact = _brute_force_decode_costs(plant, 300.0)
    for key in ("decode_s", "decode_j"):
        assert np.all(costs[key] <= exact[key] * (1.0 + 1e-12))
        assert np.all(costs[key] >= exact[key] * 0.99)


def test_lp_bound_of_an_engine_of_a_trillion_batch_places() -> None:
    """A manifest may state a batch of up to 10**12 requests: the bound priced every
    batch size one by one and ended in a MemoryError (an array of 10**12 batches)."""
    plant = replace(make_plant(), max_batch_size=10**12)
    requests = _workload()
    bound = fluid_energy_lower_bound(requests, plant)
    assert bound.success and math.isfinite(bound.energy_j) and bound.energy_j > 0.0
    top = simulate(requests, plant, controller=FixedClockController(1980.0))
    assert bound.energy_j <= top.metrics.energy_j


def test_the_fluid_bound_holds_where_a_busy_power_lies_below_the_idle_power() -> None:
    """A table whose decode power at the lowest clocks is under its idle power (a flat
    250 W idle, decode 120-320 W): the bound measured the floor from the idle power alone,
    priced the busy seconds below it as a negative cost paired with the fastest batch's
    seconds, and came out below zero (-8.4 kJ on this trace). The floor is now the least
    power of any state: the bound is positive and still under every fixed clock's run."""
    clocks = np.arange(300.0, 1801.0, 150.0)
    x = clocks / clocks[-1]
    profile = PerformanceProfile(
        clock_mhz=clocks,
        prefill_tokens_per_s=32_000.0 * x,
        decode_tokens_per_s=5_000.0 * (0.6 + 0.4 * x),
        prefill_power_w=150.0 + 30.0 * np.arange(clocks.size),
        decode_power_w=120.0 + 20.0 * np.arange(clocks.size),
        idle_power_w=np.full(clocks.size, 250.0),
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        manifest={"status": "synthetic"},
        name="busy-below-idle",
    )
    plant = make_plant(profile)
    workload = _workload()
    bound = fluid_energy_lower_bound(workload, plant)
    assert bound.success and bound.energy_j > 0.0
    for clock in clocks[::2]:
        run = simulate(workload, plant, controller=FixedClockController(float(clock)))
        assert bound.energy_j <= run.metrics.energy_j
