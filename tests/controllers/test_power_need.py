"""The ``power_needed`` hook: what a domain needs to hold its SLO at the current load, by
the controller's model, reachable through the safety chain; and the budget rule."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.contract import PowerNeed, layers, power_needed
from gpugov.controllers.mpc.model import MPCWeights
from gpugov.controllers.power_need import BudgetGuard, need_from_problem
from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.plant import PlantSimulation, ServingPlant, chunked_prefill_scheduler, simulate
from gpugov.plant.synthetic_profiles import BASE, shape_profile
from gpugov.plant.types import Request, ServingObservation


def _workload(count: int = 60, spacing_s: float = 0.25) -> tuple[Request, ...]:
    return tuple(
        Request(
            request_id=i,
            arrival_time_s=i * spacing_s,
            prompt_tokens=900 + 31 * (i % 5),
            output_tokens=100 + 7 * (i % 3),
        )
        for i in range(count)
    )


def _drive(chain, plant: ServingPlant, workload, seconds: int) -> list[PowerNeed | None]:
    """Run ``chain`` on the plant for ``seconds`` control periods of 1 s; the chain's
    need after each decision."""
    simulation = PlantSimulation(workload, plant, chunked_prefill_scheduler, seed=0)
    needs = []
    for step in range(seconds):
        simulation.advance_to(float(step))
        simulation.request_clock(chain(simulation.observe()))
        needs.append(chain.power_needed())
    return needs


def test_mpc_need_is_the_lowest_clock_its_model_says_holds_the_slo() -> None:
    plant = make_plant()
    workload = _workload()
    chain = build_controller(
        parse_controller_spec("mpc"), ControllerContext.for_plant(plant, workload, period_s=1.0)
    )
    assert chain.power_needed() is None  # no decision yet
    _drive(chain, plant, workload, 6)
    need = chain.power_needed()
    assert isinstance(need, PowerNeed)
    assert power_needed(chain) == need  # the helper and the chain agree
    assert need == chain.unwrapped.power_needed()  # the chain passes the algorithm's through
    assert need.holds and need.uncertainty_w == 0.0
    # The need is the curve at its clock, within the profile's power range.
    assert need.watts == pytest.approx(need.watts_at(need.clock_mhz))
    profile = plant.profile
    assert profile.idle_power_w.min() <= need.watts <= profile.prefill_power_w.max()
    assert need.tpot_clock_mhz <= need.clock_mhz
    # Known answer from the model itself: the need's clock has no penalty over the
    # horizon and the next clock down has one.
    problem = chain.unwrapped.last_problem
    latency_only = replace(
        problem,
        weights=MPCWeights(
            power=0.0, ttft=1.0, tpot=1.0, clock_change=0.0, constraint=0.0, terminal_backlog=0.0
        ),
    )
    steps = problem.horizon_steps
    index = need.clocks_mhz.index(need.clock_mhz)
    assert latency_only.costs(np.full((1, steps), need.clock_mhz))[0] == 0.0
    assert index > 0
    assert latency_only.costs(np.full((1, steps), need.clocks_mhz[index - 1]))[0] > 0.0


def test_need_grows_with_the_backlog_and_ignores_the_power_cap() -> None:
    plant = make_plant()
    workload = _workload()
    chain = build_controller(
        parse_controller_spec("mpc"), ControllerContext.for_plant(plant, workload, period_s=1.0)
    )
    _drive(chain, plant, workload, 4)
    problem = chain.unwrapped.last_problem
    light = need_from_problem(problem)
    heavy = need_from_problem(replace(problem, initial_prefill_tokens=8_000.0))
    assert heavy.clock_mhz > light.clock_mhz and heavy.watts > light.watts
    # A plant capped far below the need: the need is the same (no cap applied).
    capped = replace(problem, plant=replace(problem.plant, power_limit_w=150.0))
    assert need_from_problem(capped) == light


def test_the_peak_is_the_most_any_clock_draws_on_a_table_with_a_bump() -> None:
    """Before, the peak was the top clock's phase power: on a profile whose prefill draws
    most below the top clock, a budget at that peak still bound, and the guard priced
    the need only once a second there."""
    profile = make_profile()
    bump = np.exp(-(((profile.clock_mhz - 1400.0) / 120.0) ** 2))
    bumped = replace(profile, prefill_power_w=profile.prefill_power_w + 500.0 * bump)
    assert bumped.prefill_power_w.max() > bumped.prefill_power_w[-1]
    plant = make_plant(bumped)
    workload = _workload(count=80, spacing_s=0.1)
    chain = build_controller(
        parse_controller_spec("mpc"), ControllerContext.for_plant(plant, workload, period_s=1.0)
    )
    _drive(chain, plant, workload, 4)
    need = need_from_problem(replace(chain.unwrapped.last_problem, initial_prefill_tokens=8e4))
    assert need.peak_w is not None
    assert need.peak_w == pytest.approx(bumped.prefill_power_w.max())
    assert max(need.curve_w) <= need.peak_w


def test_online_mpc_reports_a_need_with_model_uncertainty_after_warm_up() -> None:
    plant = make_plant()
    workload = _workload(count=80, spacing_s=0.2)
    spec = OnlineMPCControllerConfig(kind="mpc-online", warmup_s=4.0, auto_hints=False)
    chain = build_controller(spec, ControllerContext.for_plant(plant, workload, period_s=1.0))
    needs = _drive(chain, plant, workload, 14)
    assert needs[0] is None  # warming up at the top clock
    need = chain.power_needed()
    assert need is not None
    assert need.uncertainty_w > 0.0 and need.upper_w > need.watts
    assert need.clock_mhz in need.clocks_mhz


def test_an_idle_colocated_gpu_parked_past_warm_up_keeps_publishing_its_need() -> None:
    """Parked idle between prompts, past the warm-up, the MPC still decided at every tick
    (the parking only caps its clock): the need is that decision's, not absent, so the
    node's need gauge and its budget owner do not lose it between prompts."""
    plant = make_plant()
    busy = [
        Request(request_id=i, arrival_time_s=0.2 * i, prompt_tokens=900, output_tokens=100)
        for i in range(100)
    ]
    sparse = [
        Request(
            request_id=100 + i, arrival_time_s=25.0 + 6.0 * i, prompt_tokens=900, output_tokens=30
        )
        for i in range(4)
    ]
    workload = tuple(busy + sparse)
    spec = OnlineMPCControllerConfig(kind="mpc-online", warmup_s=4.0, auto_hints=False)
    chain = build_controller(spec, ControllerContext.for_plant(plant, workload, period_s=1.0))
    online = chain.unwrapped
    simulation = PlantSimulation(workload, plant, chunked_prefill_scheduler, seed=0)
    parked = []
    for step in range(48):
        simulation.advance_to(float(step))
        observation = simulation.observe()
        simulation.request_clock(chain(observation))
        if step > 20 and getattr(online, "last_reason", None) == "idle-park":
            parked.append(chain.power_needed())
    assert len(parked) >= 10
    assert all(need is not None and need.watts > 0.0 for need in parked)


def _need(clocks, curve, *, watts_index: int, tpot_index: int) -> PowerNeed:
    return PowerNeed(
        watts=curve[watts_index],
        uncertainty_w=0.0,
        clock_mhz=clocks[watts_index],
        holds=True,
        tpot_clock_mhz=clocks[tpot_index],
        clocks_mhz=tuple(clocks),
        curve_w=tuple(curve),
    )


class _Planned:
    """A controller with a fixed decision and need (a fake of the hook)."""

    def __init__(self, decision: float, need: PowerNeed | None) -> None:
        self.decision = decision
        self.need = need

    def __call__(self, observation: ServingObservation) -> float:
        return self.decision

    def power_needed(self) -> PowerNeed | None:
        return self.need


def _observation(budget_w: float | None) -> ServingObservation:
    return ServingObservation(
        time_s=0.0,
        step_index=0,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        power_limit_w=budget_w,
    )


CLOCKS = (900.0, 1200.0, 1500.0, 1800.0)
CURVE = (200.0, 300.0, 420.0, 600.0)


@pytest.mark.parametrize(
    ("decision", "budget", "expected", "over", "slipping"),
    [
        (1500.0, None, 1500.0, False, "none"),  # no budget: unchanged
        (1500.0, 700.0, 1500.0, False, "none"),  # within budget, fits
        (1800.0, 450.0, 1500.0, False, "none"),  # within budget: capped at the ceiling
        (1800.0, 350.0, 1200.0, True, "ttft"),  # over: the ceiling, above the TPOT clock
        (900.0, 350.0, 1200.0, True, "ttft"),  # over: never below the TPOT clock that fits
        (1800.0, 250.0, 900.0, True, "ttft+tpot"),  # below the TPOT clock's power
    ],
)
def test_budget_guard_rule(
    decision: float, budget: float | None, expected: float, over: bool, slipping: str
) -> None:
    # Need: 1500 MHz (420 W); the running requests' TPOT needs 1200 MHz (300 W).
    need = _need(CLOCKS, CURVE, watts_index=2, tpot_index=1)
    guard = BudgetGuard(_Planned(decision, need))
    assert guard(_observation(budget)) == expected
    assert guard.over_budget is over and guard.slipping == slipping
    assert guard.power_needed() is need


# A power curve that does not rise with the clock: a profile's table with a bump at 1200
# MHz (or a learned model), where the top clock draws less than the one below it.
BUMPY = (200.0, 480.0, 420.0, 440.0)


@pytest.mark.parametrize(
    ("decision", "budget", "tpot_index", "expected", "over", "slipping"),
    [
        (1800.0, 450.0, 2, 1800.0, False, "none"),  # the top clock fits: unchanged
        (1200.0, 450.0, 2, 900.0, False, "none"),  # 480 W does not fit: the clock below
        (1200.0, 430.0, 2, 1500.0, True, "ttft"),  # over: the TPOT clock, which fits
        (900.0, 430.0, 1, 1500.0, True, "ttft"),  # over: TPOT held at a fitting clock above
        (1800.0, 410.0, 2, 900.0, True, "ttft+tpot"),  # only 900 MHz fits
    ],
)
def test_budget_guard_holds_a_budget_on_a_curve_that_does_not_rise_with_the_clock(
    decision: float, budget: float, tpot_index: int, expected: float, over: bool, slipping: str
) -> None:
    """Before, the guard capped the decision at the highest clock that fits and took
    every clock below it to fit too: 1200 MHz passed a 450 W budget at 480 W."""
    # Need: 1800 MHz (440 W).
    need = _need(CLOCKS, BUMPY, watts_index=3, tpot_index=tpot_index)
    guard = BudgetGuard(_Planned(decision, need))
    clock = guard(_observation(budget))
    assert clock == expected
    assert guard.over_budget is over and guard.slipping == slipping
    assert need.watts_at(clock) <= budget


def test_a_need_at_the_budget_but_for_rounding_is_within_it() -> None:
    """A model that learned its power from reads the limit held predicts the limit plus
    float noise (150.0000000000073 W against 150 W): counted over budget, the guard held
    the clock below the need and the node warned "150.00 W is below the 150.00 W"."""
    curve = (100.0, 120.0, 150.00000000000728, 180.0)
    need = _need(CLOCKS, curve, watts_index=2, tpot_index=1)
    guard = BudgetGuard(_Planned(1800.0, need))
    assert guard(_observation(150.0)) == 1500.0  # the need's clock: the ceiling
    assert guard.over_budget is False and guard.slipping == "none"
    assert guard(_observation(149.999)) == 1200.0  # a budget really below it
    assert guard.over_budget is True


def test_a_reporting_guard_follows_the_budget_but_never_changes_the_decision() -> None:
    # The GPUs' own limit alone: their firmware holds it, the guard only reports.
    need = _need(CLOCKS, CURVE, watts_index=2, tpot_index=1)
    guard = BudgetGuard(_Planned(1800.0, need), enforce=False)
    assert guard(_observation(350.0)) == 1800.0
    assert guard.over_budget is True and guard.slipping == "ttft"
    assert guard.capped_decisions == 0 and guard.last_budget_w == 350.0


def test_budget_guard_passes_a_controller_without_a_need() -> None:
    guard = BudgetGuard(_Planned(1800.0, None))
    assert guard(_observation(100.0)) == 1800.0
    assert not guard.over_budget and guard.last_need is None


def test_a_controller_without_a_need_is_held_by_the_power_measured() -> None:
    """No model (``max``, ``reactive``, the peers, ``mpc-online`` in its warm-up): the
    power the domain drew over the last period holds the budget. Over it, the clock is
    the applied one scaled by budget / power; well under it, the cap rises a tenth of
    the range a decision and lapses; with no reading, nothing binds. (Every reading is
    taken with work in hand: none is an idle draw.)"""
    guard = BudgetGuard(_Planned(1800.0, None))
    clocks = {"supported_clocks_mhz": CLOCKS, "decode_active": 8}
    over = replace(_observation(300.0), power_w=450.0, requested_clock_mhz=1800.0, **clocks)
    assert guard(over) == 1200.0  # 1800 x 300 / 450
    assert guard.capped_decisions == 1 and guard.measured_cap_mhz == 1200.0
    assert guard.over_budget
    # The chain has not brought the clock down yet (its dwell): the power read at 1800 MHz
    # does not lower the cap again.
    assert guard(over) == 1200.0
    still = replace(over, power_w=320.0, requested_clock_mhz=1200.0)
    assert guard(still) == 900.0  # 1200 x 300 / 320 = 1125: the clock under it
    within = replace(over, power_w=280.0, requested_clock_mhz=900.0)
    assert guard(within) == 900.0  # within the budget but above 90 % of it: held
    under = replace(over, power_w=200.0, requested_clock_mhz=900.0)
    assert guard(under) == 1200.0  # raised a tenth of the range, onto the clock above
    assert guard(under) == 1500.0
    assert guard(under) == 1800.0 and guard.measured_cap_mhz is None  # lapsed
    assert not guard.over_budget
    # No power reading: the cap lapses (nothing to hold the budget by).
    assert guard(over) == 1200.0
    assert guard(replace(over, power_w=None)) == 1800.0 and guard.measured_cap_mhz is None
    # The GPUs' own limit alone (their firmware holds it): only reported.
    reporting = BudgetGuard(_Planned(1800.0, None), enforce=False)
    assert reporting(over) == 1800.0


def _busy_workload() -> tuple[Request, ...]:
    """120 requests 70 ms apart, prompts of 1,000-1,222 tokens: a load whose power is over
    a 300 W budget at the test plant's top clock."""
    return tuple(
        Request(
            request_id=i,
            arrival_time_s=i * 0.07,
            prompt_tokens=1000 + 37 * (i % 7),
            output_tokens=150 + 11 * (i % 5),
        )
        for i in range(120)
    )


def test_max_on_the_plant_is_held_within_a_configured_budget() -> None:
    """The maximum clock has no model to price a budget with: its clock was left to the
    GPUs' own power limit, and a budget from the config or a file, which no firmware
    enforces, was not held at all."""
    plant = make_plant()
    workload = _busy_workload()
    budget_w = 300.0
    mean_w: dict[bool, float] = {}
    for guarded in (False, True):
        context = ControllerContext.for_plant(plant, workload, period_s=1.0, budget_guard=guarded)
        chain = build_controller(parse_controller_spec("max"), context)

        def budgeted(observation: ServingObservation, chain=chain) -> float:
            return float(chain(replace(observation, power_limit_w=budget_w)))

        result = simulate(
            workload, plant, chunked_prefill_scheduler, budgeted, 0, control_period_s=1.0
        )
        # Mean power from a few periods in (the feedback's settling) to the end.
        start_s, end_s = 3.0, float(result.time_s[-1])
        energy = np.interp([start_s, end_s], result.time_s, result.energy_j)
        mean_w[guarded] = float(energy[1] - energy[0]) / (end_s - start_s)
    assert mean_w[False] > budget_w
    assert mean_w[True] <= budget_w * 1.05


def test_budget_guard_holds_a_budget_on_the_plant_and_protects_tpot_first() -> None:
    """A budget below the need, delivered in the observation (as a node delivers it;
    the plant's own firmware cap is not set): the MPC alone plans on its profile's board
    limit and overspends; in the guard the plant's mean power stays within the budget,
    TPOT holds and TTFT slips. A budget step takes effect at the next decision."""
    plant = make_plant()
    workload = _busy_workload()
    step_s, budget_w = 5.0, 300.0
    results = {}
    after_step_w: dict[bool, float] = {}
    for guarded in (False, True):
        context = ControllerContext.for_plant(plant, workload, period_s=1.0, budget_guard=guarded)
        chain = build_controller(parse_controller_spec("mpc"), context)
        steps: list[tuple[float, float, float]] = []

        def budgeted(observation: ServingObservation, chain=chain, steps=steps) -> float:
            budget = 700.0 if observation.time_s < step_s else budget_w
            clock = float(chain(replace(observation, power_limit_w=budget)))
            need = chain.power_needed()
            ceiling = need.ceiling_mhz(budget) if need is not None else math.inf
            steps.append((observation.time_s, clock, ceiling))
            return clock

        result = simulate(
            workload, plant, chunked_prefill_scheduler, budgeted, 0, control_period_s=1.0
        )
        results[guarded] = result.metrics
        # Mean power from one period after the step (the plant's actuation) to the end.
        start_s, end_s = step_s + 1.0, float(result.time_s[-1])
        energy = np.interp([start_s, end_s], result.time_s, result.energy_j)
        after_step_w[guarded] = float(energy[1] - energy[0]) / (end_s - start_s)
        if guarded:
            # From the step on, every decision is within the budget's ceiling.
            after = [(clock, ceiling) for time_s, clock, ceiling in steps if time_s >= step_s]
            assert after and all(clock <= ceiling for clock, ceiling in after)
            guard = next(layer for layer in layers(chain) if isinstance(layer, BudgetGuard))
            assert guard.over_budget_decisions > 0
    free, held = results[False], results[True]
    assert after_step_w[False] > budget_w  # the MPC alone plans on its board limit
    assert after_step_w[True] <= budget_w
    assert held.tpot_slo_attainment == pytest.approx(1.0)  # TPOT of running requests held
    assert held.ttft_p50_s > free.ttft_p50_s  # TTFT of queued requests slips first


def test_budget_guard_survives_a_need_that_raises() -> None:
    class Broken(_Planned):
        def power_needed(self) -> PowerNeed | None:
            raise ValueError("watts must be finite and >= 0, got nan")

    guard = BudgetGuard(Broken(1800.0, None))
    assert guard(_observation(100.0)) == 1800.0
    assert guard.need_errors == 1 and guard.last_need is None


def test_budget_guard_prices_the_need_every_decision_only_while_the_budget_can_bind() -> None:
    class Counting(_Planned):
        calls = 0

        def power_needed(self) -> PowerNeed | None:
            self.calls += 1
            return self.need

    need = replace(_need(CLOCKS, CURVE, watts_index=2, tpot_index=1), peak_w=650.0)
    inner = Counting(1500.0, need)
    guard = BudgetGuard(inner)
    for tick in range(8):  # 0.25 s periods, a budget above the peak: once a second
        guard(replace(_observation(700.0), time_s=0.25 * tick))
    assert inner.calls == 2 and guard.last_need is need
    for tick in range(8, 12):  # a budget that can bind: at every decision
        guard(replace(_observation(400.0), time_s=0.25 * tick))
    assert inner.calls == 6


def test_the_measured_cap_lapses_on_a_board_that_idles_near_its_budget() -> None:
    """A board idling at 600 W under a 700 W budget never read under 90 % of it (630 W):
    a cap lowered during a burst of prompts was kept for good, at 915 MHz, where the
    steady load after it draws 662 W at the top clock. The headroom is judged above the
    power the domain drew idle, so the cap lapses once the burst is over."""
    shape = replace(
        BASE,
        name="idles-near-budget",
        description="idle 600-610 W",
        idle_min_w=600.0,
        idle_max_w=610.0,
        power_limit_w=1300.0,
        decode_flat_fraction=0.0,
        decode_static_w=20.0,
        decode_dynamic_w=60.0,
        tpot_slo_s=0.03,
        thermal_resistance_c_per_w=0.03,
    )
    plant = ServingPlant.from_profile(shape_profile(shape))
    burst = [Request(i, 3.0 + 0.05 * i, 4000, 5) for i in range(60)]
    steady = [Request(100 + i, 11.0 + 0.4 * i, 100, 200) for i in range(150)]
    workload = (*burst, *steady)
    budget_w = 700.0
    context = ControllerContext.for_plant(plant, workload, period_s=1.0, budget_guard=True)
    chain = build_controller(parse_controller_spec("max"), context)
    decisions: list[tuple[float, float]] = []

    def budgeted(observation: ServingObservation) -> float:
        clock = float(chain(replace(observation, power_limit_w=budget_w)))
        decisions.append((observation.time_s, clock))
        return clock

    result = simulate(workload, plant, chunked_prefill_scheduler, budgeted, 0, control_period_s=1.0)
    guard = next(layer for layer in layers(chain) if isinstance(layer, BudgetGuard))
    assert guard.capped_decisions > 0  # the burst was over the budget
    top = float(plant.profile.clock_mhz[-1])
    assert all(clock == top for time_s, clock in decisions if 40.0 <= time_s <= 65.0)
    assert guard.idle_floor_w is not None and 600.0 <= guard.idle_floor_w <= 610.0
    start_s, end_s = 40.0, 65.0
    energy = np.interp([start_s, end_s], result.time_s, result.energy_j)
    assert float(energy[1] - energy[0]) / (end_s - start_s) <= budget_w


def test_an_idle_draw_is_learned_only_from_periods_the_gpus_did_not_run() -> None:
    """Two ticks with no work in hand are an idle period, but a request that came and went
    between them ran kernels the engine's counts missed: where the GPUs report that busy
    share, such a period's power is no idle draw (it was learned, and a floor too high cut
    the clock far below what the budget needs)."""
    guard = BudgetGuard(_Planned(1800.0, None))
    quiet = replace(
        _observation(700.0),
        power_w=650.0,
        requested_clock_mhz=1800.0,
        supported_clocks_mhz=CLOCKS,
        gpu_utilization=0.6,
    )
    for tick in range(3):
        guard(replace(quiet, time_s=float(tick)))
    assert guard.idle_floor_w is None
    for tick in range(3, 6):
        guard(replace(quiet, time_s=float(tick), power_w=300.0, gpu_utilization=0.0))
    assert guard.idle_floor_w == 300.0
    unknown = BudgetGuard(_Planned(1800.0, None))  # no utilisation read: the counts alone
    for tick in range(3):
        unknown(replace(quiet, time_s=float(tick), gpu_utilization=None))
    assert unknown.idle_floor_w == 650.0
