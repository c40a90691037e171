"""The MPC's online corrections: the burst hedge and SLO feedback, with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpugov.controllers.adaptation import BurstHedge, SLOFeedback, _linear_quantile
from gpugov.controllers.mpc.controller import MPCController
from gpugov.controllers.mpc.fast import DiscreteSearchSolver
from gpugov.controllers.mpc.model import MPCWeights
from gpugov.plant import ServingObservation


def _seen(
    arrived: int, *, time_s: float = 1.0, ttft: float | None = None, tpot: float | None = None
) -> ServingObservation:
    return ServingObservation(
        time_s=time_s,
        step_index=int(time_s),
        arrived_requests=arrived,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        ttft_recent_s=ttft,
        tpot_recent_s=tpot,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
    )


def test_burst_hedge_counts_arrivals_per_period_and_takes_the_quantile() -> None:
    hedge = BurstHedge(quantile=1.0, share=0.5, window_s=10.0)
    cumulative = 0
    for count in (0, 2, 0, 8, 1, 0):
        cumulative += count
        hedge.update(_seen(cumulative), period_s=1.0)
    # One-second SLO at one-second periods: the largest single period's arrivals.
    assert hedge.burst_requests(period_s=1.0, ttft_slo_s=1.0) == 8.0
    assert hedge.prompt_tokens(1_000.0, period_s=1.0, ttft_slo_s=1.0) == 4_000.0


def test_burst_hedge_sums_an_slo_long_run_of_short_periods() -> None:
    hedge = BurstHedge(quantile=1.0, share=1.0)
    cumulative = 0
    for count in (1, 0, 3, 2, 0, 0):
        cumulative += count
        hedge.update(_seen(cumulative), period_s=0.5)
    # Two half-second periods per one-second SLO: the largest pair is 3 + 2.
    assert hedge.burst_requests(period_s=0.5, ttft_slo_s=1.0) == 5.0


@pytest.mark.parametrize("quantile", [0.0, 0.1, 0.5, 0.9, 0.95, 1.0])
def test_the_hedge_quantile_is_numpys_to_the_last_bit(quantile: float) -> None:
    rng = np.random.default_rng(5)
    for size in (1, 2, 3, 7, 237, 240):
        for _ in range(20):
            values = rng.integers(0, 12, size=size).astype(float)
            assert _linear_quantile(values, quantile) == float(np.quantile(values, quantile))


def test_burst_hedge_forgets_old_periods_and_survives_a_counter_reset() -> None:
    hedge = BurstHedge(quantile=1.0, window_s=3.0)
    hedge.update(_seen(0), 1.0)
    hedge.update(_seen(50), 1.0)  # a burst of 50
    for arrived in (51, 52, 53):
        hedge.update(_seen(arrived), 1.0)
    assert hedge.burst_requests(1.0, 1.0) == 1.0  # the burst fell out of the window
    hedge.update(_seen(3), 1.0)  # the engine restarted: counts from zero again
    assert hedge.burst_requests(1.0, 1.0) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"quantile": 1.5}, "quantile"), ({"share": 0.0}, "share"), ({"window_s": 0.0}, "window")],
)
def test_burst_hedge_validates(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        BurstHedge(**kwargs)


def test_slo_feedback_stands_down_while_the_attainment_budget_is_ahead() -> None:
    # The windowed mean latency is a proxy for the requests' attainment: where the
    # measured attainment leaves the budget unspent, pressure on the proxy does not
    # tighten the margin; the scale keeps relaxing, and tightens again once it is not.
    feedback = SLOFeedback(pressure=0.8, grow_per_s=1.5, relax_per_s=1.02)
    pressing = _seen(0, tpot=0.045)
    assert feedback.update(pressing, period_s=1.0) == pytest.approx(1.5)
    assert feedback.update(pressing, period_s=1.0, ahead=True) == pytest.approx(1.5 / 1.02)
    assert feedback.update(pressing, period_s=1.0) == pytest.approx(1.5 / 1.02 * 1.5)


def test_slo_feedback_grows_under_pressure_and_relaxes_per_second() -> None:
    feedback = SLOFeedback(pressure=0.8, grow_per_s=1.5, relax_per_s=1.02, maximum_scale=4.0)
    # TPOT at 90% of its SLO is pressure: one second of it grows the scale by 1.5.
    assert feedback.update(_seen(0, tpot=0.045), period_s=1.0) == pytest.approx(1.5)
    # Half-second periods: the same growth per second.
    feedback.update(_seen(0, ttft=0.95), period_s=0.5)
    assert feedback.update(_seen(0, ttft=0.95), period_s=0.5) == pytest.approx(2.25)
    for _ in range(10):
        feedback.update(_seen(0, ttft=2.0), period_s=1.0)
    assert feedback.scale == 4.0  # capped
    # No measured latency is no pressure: relax by 2% per second, never below 1.
    assert feedback.update(_seen(0), period_s=1.0) == pytest.approx(4.0 / 1.02)
    for _ in range(200):
        feedback.update(_seen(0, ttft=0.1, tpot=0.01), period_s=1.0)
    assert feedback.scale == 1.0


def test_slo_feedback_ratios_ignore_missing_and_non_finite_latencies() -> None:
    assert SLOFeedback.latency_ratios(_seen(0)) == (None, None)
    ttft, tpot = SLOFeedback.latency_ratios(_seen(0, ttft=0.5, tpot=0.04))
    assert ttft == pytest.approx(0.5) and tpot == pytest.approx(0.8)
    assert SLOFeedback.latency_ratios(_seen(0, ttft=math.nan, tpot=0.01))[0] is None


def test_slo_feedback_can_judge_tpot_against_its_own_threshold() -> None:
    shared = SLOFeedback(pressure=0.8)
    own = SLOFeedback(pressure=0.8, tpot_pressure=1.0)
    noisy_tpot = _seen(0, ttft=0.1, tpot=0.045)  # TPOT at 90% of SLO
    assert shared.under_pressure(noisy_tpot) and not own.under_pressure(noisy_tpot)
    assert own.under_pressure(_seen(0, ttft=0.9, tpot=0.01))
    assert own.under_pressure(_seen(0, ttft=0.1, tpot=0.06))


def test_slo_feedback_validates() -> None:
    with pytest.raises(ValueError, match="grow_per_s"):
        SLOFeedback(grow_per_s=1.0)
    with pytest.raises(ValueError, match="maximum_scale"):
        SLOFeedback(maximum_scale=0.5)


def test_mpc_plans_against_the_adapted_prompt_and_margin(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    """The corrections reach the problem the solver sees, and raise the planned clock."""
    common = {
        "mean_prompt_tokens": 500.0,
        "mean_output_tokens": 100.0,
        "latency_model": "iteration",
        "slo_margin": 0.7,
        "solver": DiscreteSearchSolver(),
        "solve_time_limit_s": 10.0,
    }
    plain = MPCController(synthetic_plant, **common)
    adapted = MPCController(
        synthetic_plant,
        burst_hedge=BurstHedge(quantile=1.0),
        slo_feedback=SLOFeedback(),
        **common,
    )
    clocks = tuple(float(c) for c in synthetic_plant.profile.clock_mhz)
    arrivals = np.cumsum([0, 1, 0, 12, 0, 1])
    for index, arrived in enumerate(arrivals):
        observation = ServingObservation(
            time_s=float(index),
            step_index=index,
            arrived_requests=int(arrived),
            prefill_remaining_tokens=200.0,
            decode_active=2,
            generated_decode_tokens=20.0,
            temperature_c=40.0,
            ttft_recent_s=0.95,
            tpot_recent_s=0.01,
            ttft_slo_s=1.0,
            tpot_slo_s=0.05,
            supported_clocks_mhz=clocks,
        )
        plain(observation)
        adapted(observation)
    assert adapted.charged_prompt_tokens == pytest.approx(0.5 * 12 * 500.0)
    assert adapted.effective_slo_margin == pytest.approx(0.7 / 4.0)  # the scale hit its cap
    problem = adapted.problem(observation, 1.0)
    assert problem.ttft_prompt == adapted.charged_prompt_tokens
    assert problem.slo_margin == adapted.effective_slo_margin
    assert plain.problem(observation, 1.0).slo_margin == 0.7
    assert adapted.current_clock >= plain.current_clock


@pytest.mark.parametrize("yields", [False, True])
def test_the_tail_prompt_yields_to_the_budget_where_asked(synthetic_plant, yields: bool) -> None:  # type: ignore[no-untyped-def]
    """``mpc-online``'s MPC charges a new request the mean prompt, not the declared tail,
    while the attainment budget is at or above its default looseness, and the tail beyond
    the mean in the share the budget withholds below it; a burst is still charged in full.
    The seed's terminal penalty charges that same share of the backlog left at the
    horizon's end (the rest of the decode backlog, which the guard does not drain, is
    priced at its least energy). ``mpc`` keeps charging the tail and the backlog whatever
    the budget says."""
    from gpugov.controllers.budget import AttainmentBudget, SLOTarget

    budget = AttainmentBudget(SLOTarget(attainment=0.99), tightest=0.7, loosest=1 / 0.7)
    mpc = MPCController(
        synthetic_plant,
        mean_prompt_tokens=500.0,
        mean_output_tokens=100.0,
        latency_model="iteration",
        slo_margin=0.7,
        solver=DiscreteSearchSolver(),
        ttft_prompt_tokens=2_000.0,
        burst_hedge=BurstHedge(quantile=1.0),
        slo_budget=budget,
        tail_yields_to_budget=yields,
    )
    clocks = tuple(float(c) for c in synthetic_plant.profile.clock_mhz)
    charged: list[tuple[float, float]] = []
    terminal: list[float] = []
    arrived = 0
    # Two arrivals a period (a hedge of 500 tokens, the mean), then a burst of 12 (3,000).
    steps = ((1.0, 2), (1.0, 2), (0.85, 2), (0.7, 2), (1 / 0.7, 2), (1.0, 12))
    for index, (looseness, arrivals) in enumerate(steps):
        budget.looseness = looseness
        arrived += arrivals
        observation = ServingObservation(
            time_s=float(index),
            step_index=index,
            arrived_requests=arrived,
            prefill_remaining_tokens=0.0,
            decode_active=0,
            generated_decode_tokens=0.0,
            temperature_c=40.0,
            ttft_slo_s=1.0,
            tpot_slo_s=0.05,
            supported_clocks_mhz=clocks,
        )
        mpc.adapt(observation)  # no counters: the budget keeps the looseness set here
        problem = mpc.problem(observation, 1.0)
        assert problem.ttft_prompt == mpc.charged_prompt_tokens
        charged.append((problem.ttft_prompt, problem.ttft_own_prompt))
        assert problem.weights.terminal_backlog == MPCWeights().terminal_backlog
        terminal.append(problem.terminal_share)
    burst = (3_000.0, 2_000.0)
    if not yields:
        assert charged[1:5] == [pytest.approx((2_000.0, 2_000.0))] * 4
        assert charged[5] == pytest.approx(burst)
        assert terminal == [1.0] * len(steps)
        return
    assert terminal == pytest.approx([0.0, 0.0, 0.5, 1.0, 0.0, 0.0])
    assert charged[1] == pytest.approx((500.0, 500.0))
    assert charged[2] == pytest.approx((1_250.0, 1_250.0))  # half the way to the tightest
    assert charged[3] == pytest.approx((2_000.0, 2_000.0))
    assert charged[4] == pytest.approx((500.0, 500.0))
    assert charged[5] == pytest.approx((3_000.0, 500.0))  # the burst, the mean's own prompt


@pytest.mark.parametrize("guard", [True, False])
def test_mpc_online_yields_the_tail_only_with_its_burst_guard(synthetic_plant, guard: bool) -> None:  # type: ignore[no-untyped-def]
    """The tail is left to the burst guard: with the guard off, the MPC keeps charging it."""
    from gpugov.controllers.budget import SLOTarget
    from gpugov.controllers.online.controller import OnlineMPCController

    online = OnlineMPCController(burst_guard=guard, slo_target=SLOTarget(attainment=0.99))
    assert online._mpc(synthetic_plant).tail_yields_to_budget is guard
