"""The attainment budget: it loosens when ahead of the target, tightens (faster) when
behind, holds between, stays within its bounds and reads only cumulative counters."""

from __future__ import annotations

import itertools
import math

import pytest
from synthetic import make_plant, make_profile
from test_online_mpc import _poisson_workload

from gpugov.controllers.adaptation import SLOFeedback
from gpugov.controllers.budget import (
    AttainmentBudget,
    AttainmentCounters,
    SLOTarget,
    loosened,
    window_attainment,
)
from gpugov.controllers.online.exploration import SafeExploration
from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.types import ServingObservation
from gpugov.study.scoreboard.controllers import study_controller

TARGET = SLOTarget(attainment=0.99, window_s=600.0)


def _observation(
    time_s: float,
    ttft: tuple[float, float] | None,
    tpot: tuple[float, float] | None = None,
    **more: object,
) -> ServingObservation:
    return ServingObservation(
        time_s=time_s,
        step_index=0,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=50.0,
        ttft_within_slo_total=None if ttft is None else ttft[0],
        ttft_count_total=None if ttft is None else ttft[1],
        tpot_within_slo_total=None if tpot is None else tpot[0],
        tpot_count_total=None if tpot is None else tpot[1],
        **more,  # type: ignore[arg-type]
    )


def _run(
    budget: AttainmentBudget,
    seconds: float,
    rate: float,
    miss: float,
    *,
    start: tuple[float, float, float] = (0.0, 0.0, 0.0),
    period: float = 1.0,
) -> tuple[list[float], tuple[float, float, float]]:
    """Feed ``seconds`` of traffic at ``rate`` requests/s, a share ``miss`` of them
    missing their TTFT; returns the looseness per period and the end state."""
    time_s, within, count = start
    trace = []
    for _ in range(int(seconds / period)):
        time_s += period
        count += rate * period
        within += rate * period * (1.0 - miss)
        trace.append(budget.update(_observation(time_s, (within, count), (count, count))))
    return trace, (time_s, within, count)


def test_loosens_when_ahead_and_stops_at_its_bound() -> None:
    budget = AttainmentBudget(TARGET, tightest=0.7, loosest=1 / 0.7)
    trace, _ = _run(budget, 600.0, rate=5.0, miss=0.0)
    assert trace[-1] == pytest.approx(1 / 0.7)
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(trace))
    # Slowly: across the range [0.7, 1/0.7] in half a window, so 1 -> 1/0.7 takes a
    # quarter of it (150 s) once two misses are allowed (200 requests: 40 s at 5/s).
    reached = next(i for i, b in enumerate(trace) if b >= 1 / 0.7 - 1e-9)
    assert 150 <= reached <= 200


def test_needs_enough_requests_to_tell_before_loosening() -> None:
    budget = AttainmentBudget(TARGET)
    trace, _ = _run(budget, 600.0, rate=0.2, miss=0.0)  # 120 requests: 1.2 misses allowed
    assert trace[-1] == 1.0


def test_tightens_fast_when_behind_and_stops_at_its_bound() -> None:
    budget = AttainmentBudget(TARGET, tightest=0.7, loosest=1 / 0.7)
    _, state = _run(budget, 300.0, rate=5.0, miss=0.0)
    assert budget.looseness == pytest.approx(1 / 0.7)
    trace, _ = _run(budget, 120.0, rate=5.0, miss=0.05, start=state)
    assert trace[-1] == pytest.approx(0.7)
    # Fast: the whole range in a short window (50 s), once the short window burns three
    # times the budget (30 s into 5 % misses here): far faster than it loosened.
    down = next(i for i, b in enumerate(trace) if b <= 0.7 + 1e-9)
    assert down <= 85
    assert budget.last is not None and budget.last.attainment < TARGET.attainment + 0.0075


def test_one_early_miss_is_no_rate() -> None:
    """On a light node (0.5 requests/s: 3 misses a window) one miss among the first 40
    requests is not "behind" (one miss is no rate), and the window, projected from the
    rate, holds enough requests to loosen; three misses there are behind."""
    one = AttainmentBudget(TARGET)
    _, state = _run(one, 79.0, rate=0.5, miss=0.0)
    before = one.looseness
    trace, _ = _run(one, 1.0, rate=0.5, miss=2.0, start=state)  # one miss at 80 s
    assert one.last is not None and one.last.misses == pytest.approx(1.0)
    trace += _run(one, 100.0, rate=0.5, miss=0.0, start=(80.0, 39.0, 40.0))[0]
    assert min(trace) >= before
    three = AttainmentBudget(TARGET)
    _run(three, 80.0, rate=0.5, miss=0.075)  # three misses in 40 requests
    assert three.looseness < 1.0


def test_early_misses_are_judged_against_the_window_s_projected_budget() -> None:
    """Four misses in a busy window's first minute (300 requests seen, 3,000 projected:
    30 misses allowed) are not "behind", though they pass three quarters of what the
    requests seen so far allow; the same share kept up is (the short window burns)."""
    budget = AttainmentBudget(TARGET)
    trace, state = _run(budget, 60.0, rate=5.0, miss=4.0 / 300.0)
    assert budget.last is not None and budget.last.misses > 0.75 * 0.01 * budget.last.requests
    assert min(trace) == 1.0
    trace, _ = _run(budget, 60.0, rate=5.0, miss=0.04, start=state)
    assert trace[-1] < 1.0


def test_holds_between_half_and_three_quarters_of_the_budget_spent() -> None:
    budget = AttainmentBudget(TARGET)
    trace, _ = _run(budget, 900.0, rate=5.0, miss=0.006)  # 60% of the budget spent
    assert trace[-1] == 1.0


def test_a_fast_burn_tightens_before_the_long_window_shows_it() -> None:
    budget = AttainmentBudget(TARGET, tightest=0.7, loosest=1 / 0.7)
    _, state = _run(budget, 600.0, rate=5.0, miss=0.0)
    loose = budget.looseness
    # 20 s at 10 % misses: 10 misses, a third of the 30 the window allows, burnt at
    # over three times the sustainable rate across the 50 s short window.
    trace, _ = _run(budget, 20.0, rate=5.0, miss=0.10, start=state)
    assert budget.last is not None and budget.last.misses < 0.75 * 0.01 * budget.last.requests
    assert trace[-1] < loose


def test_the_short_window_s_misses_are_kept_beside_the_long_window_s() -> None:
    """``recent`` is the last twelfth of the window: misses that stopped coming leave it
    and stay in ``last`` (the burst guard's hold past the budget reads both)."""
    budget = AttainmentBudget(TARGET)
    budget.update(_observation(0.0, (0.0, 0.0), (0.0, 0.0)))
    budget.update(_observation(10.0, (50.0, 50.0), (45.0, 50.0)))
    assert budget.recent is not None and budget.recent.tpot_misses == pytest.approx(5.0)
    # 100 s later (past the 50 s short window), 100 more requests and no miss.
    budget.update(_observation(110.0, (150.0, 150.0), (145.0, 150.0)))
    assert budget.last is not None and budget.last.tpot_misses == pytest.approx(5.0)
    assert budget.recent is not None and budget.recent.tpot_misses == 0.0


def test_union_bound_counts_ttft_and_tpot_misses_apart() -> None:
    before = AttainmentCounters(0.0, (0.0, 0.0), (0.0, 0.0))
    now = AttainmentCounters(10.0, (99.0, 100.0), (97.0, 100.0))
    window = window_attainment(now, before)
    assert window.requests == 100.0
    assert window.miss_fraction == pytest.approx(0.04)
    assert window.tpot_misses == pytest.approx(3.0)  # the TPOT judgements that missed
    tpot_only = window_attainment(
        AttainmentCounters(10.0, None, (90.0, 100.0)), AttainmentCounters(0.0, None, (0.0, 0.0))
    )
    assert tpot_only.requests == 100.0 and tpot_only.attainment == pytest.approx(0.9)
    assert tpot_only.tpot_misses == pytest.approx(10.0)
    ttft_only = window_attainment(
        AttainmentCounters(10.0, (95.0, 100.0), None), AttainmentCounters(0.0, (0.0, 0.0), None)
    )
    assert ttft_only.tpot_misses == 0.0


def test_update_is_idempotent_per_time_and_survives_restarts_and_gaps() -> None:
    budget = AttainmentBudget(TARGET)
    _run(budget, 300.0, rate=5.0, miss=0.0)
    loose = budget.looseness
    again = budget.update(_observation(300.0, (0.0, 0.0)))  # the same time: ignored
    assert again == loose
    # The engine restarted: its counters start again; the loop holds until it can tell.
    assert budget.update(_observation(301.0, (1.0, 1.0), (1.0, 1.0))) == loose
    assert budget.last is None
    # An observation without counters (no histogram buckets) holds too.
    assert budget.update(_observation(302.0, None)) == loose


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="tightest"):
        AttainmentBudget(TARGET, tightest=1.2, loosest=2.0)
    with pytest.raises(ValueError, match="attainment"):
        SLOTarget(attainment=1.0)
    with pytest.raises(ValueError, match="window_s"):
        SLOTarget(attainment=0.9, window_s=0.0)


def test_loosened_thresholds_never_pass_the_slo() -> None:
    assert loosened(0.8, 1 / 0.7) == 1.0
    assert loosened(0.6, 1 / 0.7) == pytest.approx(0.6 / 0.7)
    assert loosened(0.9, 0.7) == pytest.approx(0.63)
    assert loosened(1.2, 2.0) == 1.2  # already past the SLO: kept, never loosened further
    feedback = SLOFeedback()
    pressing = _observation(0.0, None, ttft_recent_s=0.9, ttft_slo_s=1.0)
    assert feedback.under_pressure(pressing)
    assert not feedback.under_pressure(pressing, looseness=1 / 0.7)
    exploration = SafeExploration()
    assert (exploration.explore_threshold, exploration.backoff_threshold) == (0.6, 0.9)
    exploration.looseness = 1 / 0.7
    assert exploration.backoff_threshold == 1.0
    assert exploration.explore_threshold == pytest.approx(0.6 / 0.7)
    exploration.looseness = 0.7
    assert exploration.backoff_threshold == pytest.approx(0.63)
    assert math.isclose(exploration.explore_threshold, 0.42)


def test_feedback_judges_ttft_at_the_window_prompts_slo() -> None:
    observation = _observation(
        0.0,
        None,
        ttft_recent_s=1.8,
        ttft_slo_s=1.0,
        ttft_slo_per_prompt_token_s=5e-5,
        ttft_recent_prompt_tokens=20_000.0,
    )
    ttft, _ = SLOFeedback.latency_ratios(observation)
    assert ttft == pytest.approx(0.9)  # 1.8 s against 1 s + 1 s of allowance


# ------------------------------------------------------------------ closed loop
def _loop(  # type: ignore[no-untyped-def]
    rate: float, target: SLOTarget | None, looseness: list[float] | None = None
):
    """Run ``mpc-online`` on the synthetic plant; ``looseness`` collects the budget's
    looseness after every decision."""
    plant = make_plant(make_profile())
    workload = _poisson_workload(rate, 120.0, (200, 2500), (20, 300), seed=5)
    spec = OnlineMPCControllerConfig(kind="mpc-online")
    chain = study_controller(spec, plant, workload, control_period_s=0.5, slo_target=target)

    def decide(observation: ServingObservation) -> float:
        clock = chain(observation)
        budget = chain.unwrapped.budget
        if looseness is not None and budget is not None:
            looseness.append(budget.looseness)
        return clock

    result = simulate(workload, plant, chunked_prefill_scheduler, decide, 0, control_period_s=0.5)
    return result, chain.unwrapped


def test_mpc_online_spends_the_budget_where_it_is_ahead() -> None:
    held, _ = _loop(4.0, None)  # no target: the fixed margins (100 % attainment here)
    target = SLOTarget(attainment=0.99, window_s=120.0)
    result, controller = _loop(4.0, target)
    assert result.metrics.energy_j < held.metrics.energy_j
    assert controller.budget is not None
    assert controller.budget.looseness == pytest.approx(controller.budget.loosest)
    assert controller.status()["slo_budget"]["attainment"] >= target.attainment
    assert result.metrics.slo_attainment >= target.attainment


def test_mpc_online_gives_the_budget_back_where_it_is_behind() -> None:
    # At 7.3 requests/s the learned controller without a target loses more than half the
    # 1 % budget on this plant (the run is deterministic), so the misses put the budget
    # behind its target. (At 7.0 it did until the decode descent held an arriving
    # prompt's bound: 98.98 % then, 99.89 % now.)
    target = SLOTarget(attainment=0.99, window_s=120.0)
    unheld, _ = _loop(7.3, None)
    assert unheld.metrics.slo_attainment < 1.0 - 0.5 * (1.0 - target.attainment)
    looseness: list[float] = []
    result, controller = _loop(7.3, target, looseness)
    assert controller.budget is not None
    tightest = controller.budget.tightest
    # Behind, it tightened all the way (z / 0.7 on the model's uncertainty) ...
    assert min(looseness) == pytest.approx(tightest)
    assert controller.uncertainty_z / tightest == pytest.approx(controller.uncertainty_z / 0.7)
    # ... and held the target, no worse than the fixed margins.
    assert result.metrics.slo_attainment >= target.attainment
    assert result.metrics.slo_attainment >= unheld.metrics.slo_attainment


def test_the_per_prompt_allowance_is_given_back_when_behind() -> None:
    budget = AttainmentBudget(TARGET, tightest=0.7, loosest=1 / 0.7)
    assert budget.allowance_credit == 1.0
    budget.looseness = 0.85
    assert budget.allowance_credit == pytest.approx(0.5)
    budget.looseness = 0.7
    assert budget.allowance_credit == 0.0
    budget.looseness = 1 / 0.7
    assert budget.allowance_credit == 1.0


def test_ahead_is_reported_only_with_evidence_of_slack() -> None:
    light = AttainmentBudget(TARGET)
    _run(light, 600.0, rate=0.3, miss=0.0)  # 180 requests a window: 1.8 misses allowed
    assert not light.ahead and light.looseness == 1.0
    budget = AttainmentBudget(TARGET)
    assert not budget.ahead
    _, state = _run(budget, 100.0, rate=5.0, miss=0.0)
    assert budget.ahead and budget.status()["ahead"]
    _run(budget, 40.0, rate=5.0, miss=0.05, start=state)  # burning: no longer ahead
    assert not budget.ahead
    budget.update(_observation(10_000.0, None))  # nothing measured: no evidence
    assert not budget.ahead


class _AheadBudget(AttainmentBudget):
    """A budget that is always ahead of its target (what the controller reads)."""

    def update(self, observation: ServingObservation) -> float:
        self.ahead = True
        return self.looseness


def test_the_back_off_stands_down_while_the_budget_is_ahead() -> None:
    from gpugov.controllers.online.controller import OnlineMPCController

    clocks = tuple(float(c) for c in range(500, 1501, 100))
    # Measured TTFT at twice its SLO at a lowered clock: a back-off without a budget.
    seen = _observation(
        1.0,
        (10.0, 10.0),
        (10.0, 10.0),
        supported_clocks_mhz=clocks,
        requested_clock_mhz=800.0,
        ttft_recent_s=2.0,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
    )
    plain = OnlineMPCController(slo_target=TARGET)
    assert plain(seen) == clocks[-1] and plain.last_reason == "backoff"
    spending = OnlineMPCController(slo_target=TARGET)
    spending.budget = _AheadBudget(TARGET)
    spending(seen)
    assert spending.spending and spending.last_reason == "warm-up"
    assert spending.exploration.backoffs == 0 and plain.exploration.backoffs == 1


def test_loosens_only_once_the_requests_seen_can_afford_one_more_miss() -> None:
    """Early in a window its projected size may hold enough requests to tell, while the
    requests seen so far allow less than one miss: one miss then would already spend
    the budget of what has been served, so the loop waits (at 1 %, for 100 requests)."""
    budget = AttainmentBudget(TARGET)
    # 0.35 requests/s with a burst first: 30 requests in 20 s project 300 in the window.
    trace, state = _run(budget, 20.0, rate=1.5, miss=0.0)
    assert budget.last is not None and 25.0 <= budget.last.requests < 30.0
    assert trace[-1] == 1.0 and not budget.ahead
    trace, _ = _run(budget, 60.0, rate=1.5, miss=0.0, start=state)  # 120 requests seen
    assert budget.ahead and trace[-1] > 1.0
    first = next(i for i, b in enumerate(trace) if b > 1.0)
    assert 20.0 + first + 1 >= 100 / 1.5 - 1.0  # not before 100 requests


def test_mpc_online_s_slo_feedback_stops_tightening_while_ahead_and_mpc_s_does_not() -> None:
    from gpugov.controllers.mpc.controller import MPCController
    from gpugov.controllers.online.controller import OnlineMPCController
    from gpugov.plant import ServingPlant
    from gpugov.plant.synthetic_profiles import synthetic_profile

    # The windowed TPOT above the feedback's pressure, every decision: a GPU whose
    # windowed TPOT is noisy near its SLO while its requests meet it.
    pressing = _observation(1.0, None, tpot_recent_s=0.049, tpot_slo_s=0.05, ttft_slo_s=1.0)
    plant = ServingPlant.from_profile(synthetic_profile("compute-bound"))
    scales = {}
    for yields in (True, False):
        mpc = MPCController(
            plant,
            control_period_s=0.5,
            slo_feedback=SLOFeedback(),
            slo_budget=_AheadBudget(TARGET),
            feedback_yields_when_ahead=yields,
        )
        for _ in range(4):
            mpc.adapt(pressing)
        assert mpc.slo_feedback is not None
        scales[yields] = mpc.slo_feedback.scale
    assert scales[True] == 1.0 and scales[False] > 2.0
    # mpc-online asks for it; the profile-fed mpc keeps its only measured-latency hedge.
    assert OnlineMPCController()._mpc(plant).feedback_yields_when_ahead
    assert not MPCController(plant).feedback_yields_when_ahead


def test_the_per_prompt_allowance_waits_for_a_miss_to_spare() -> None:
    # 3 requests/s over a 600 s window: 1,800 requests, 18 misses allowed at 99 %.
    budget = AttainmentBudget(TARGET, tightest=0.7, loosest=1 / 0.7)
    _, state = _run(budget, 120.0, rate=3.0, miss=0.0)
    assert budget.affordable and budget.allowance_credit == 1.0
    # A burst of misses leaves the window less than one to spare: no allowance, whatever
    # the looseness, until the window's misses age out or its requests grow.
    time_s, within, count = state
    budget.update(_observation(time_s + 1.0, (within, count + 20.0), (count + 20.0,) * 2))
    assert not budget.affordable
    budget.looseness = 1 / 0.7
    assert budget.allowance_credit == 0.0
    _run(budget, 700.0, rate=3.0, miss=0.0, start=(time_s + 1.0, within, count + 20.0))
    # The misses aged out: the allowance again, in the share the looseness (which fell
    # while behind and is rising again) gives.
    assert budget.affordable and budget.allowance_credit > 0.0


def test_past_the_first_miss_the_requests_served_must_afford_the_next() -> None:
    """The projected window pays for the first miss; traffic can stop (a trace's arrivals
    ending, a router draining the node), so the next is spent only on requests served."""
    budget = AttainmentBudget(TARGET)
    _, (time_s, within, count) = _run(budget, 60.0, rate=1.0, miss=0.0)
    assert budget.affordable  # 60 served, 600 projected: 6 misses allowed
    budget.update(_observation(time_s + 1.0, (within, count + 1.0), (count + 1.0,) * 2))
    assert not budget.affordable  # one counted: 0.61 allowed by the 61 served
    _run(budget, 200.0, rate=1.0, miss=0.0, start=(time_s + 1.0, within, count + 1.0))
    assert budget.affordable  # 261 served: 2.6 allowed, one spent


def test_a_ttft_miss_the_histograms_split_still_counts_as_one() -> None:
    """An engine's coarse TTFT buckets can estimate one real miss at a fraction of one
    (a 1.10 s first token against a 1.04 s SLO, among others in its window: 0.4). The
    next miss must still be afforded by the requests served, not by the projection."""
    budget = AttainmentBudget(TARGET)
    _, (time_s, within, count) = _run(budget, 60.0, rate=1.0, miss=0.0)
    budget.update(_observation(time_s + 1.0, (within + 0.6, count + 1.0), (count + 1.0,) * 2))
    assert budget.last is not None and budget.last.ttft_misses == pytest.approx(0.4)
    assert not budget.affordable and budget.allowance_credit == 0.0
    # TPOT judgements are many per request: a split share of one stays below "counted".
    tpot = AttainmentBudget(TARGET)
    _, (time_s, within, count) = _run(tpot, 60.0, rate=1.0, miss=0.0)
    tpot.update(_observation(time_s + 1.0, (count + 1.0,) * 2, (count + 0.6, count + 1.0)))
    assert tpot.affordable


def test_a_window_too_small_for_one_miss_never_plans_with_the_allowance() -> None:
    # 0.1 requests/s: 60 requests a window, 0.6 misses allowed at 99 %.
    budget = AttainmentBudget(TARGET)
    _run(budget, 900.0, rate=0.1, miss=0.0)
    assert not budget.affordable and budget.allowance_credit == 0.0


def test_margins_spend_only_what_covers_the_prompts_waiting_together() -> None:
    """Prompts that wait together are prefilled and decoded together: the looseness is
    applied above 1 only while the window's budget left covers them all and the next."""
    budget = AttainmentBudget(TARGET, tightest=0.7, loosest=1 / 0.7)
    trace, (time_s, within, count) = _run(budget, 600.0, rate=1.0, miss=0.0)
    assert trace[-1] == pytest.approx(1 / 0.7)
    # 600 requests in the window at 99 %: six misses allowed, none spent.
    assert budget.remaining == pytest.approx(6.0)
    calm = budget.update(
        _observation(
            time_s + 1, (within + 1, count + 1), (count + 1, count + 1), waiting_requests=4
        )
    )
    assert budget.exposed == 5.0 and calm == pytest.approx(1 / 0.7)
    burst = budget.update(
        _observation(
            time_s + 2, (within + 2, count + 2), (count + 2, count + 2), waiting_requests=6
        )
    )
    # Seven exposed against six to spare: the margins at 1, the rule's level kept.
    assert burst == 1.0 and budget.applied_looseness == 1.0
    assert budget.looseness == pytest.approx(1 / 0.7)
    assert budget.status()["applied_looseness"] == 1.0
    drained = budget.update(
        _observation(time_s + 3, (within + 3, count + 3), (count + 3, count + 3))
    )
    assert drained == pytest.approx(1 / 0.7)


def test_the_exposure_cap_never_tightens_below_the_rule() -> None:
    """Behind its target the rule's own level (below 1) applies, whatever waits."""
    budget = AttainmentBudget(TARGET, tightest=0.7, loosest=1 / 0.7)
    trace, _ = _run(budget, 600.0, rate=5.0, miss=0.05)
    assert trace[-1] == pytest.approx(0.7)
    assert budget.applied_looseness == pytest.approx(0.7)


def test_a_restart_goes_on_measuring_the_same_window() -> None:
    """The state a node stores (``state_dict``) carries the window's misses and the
    looseness across a restart: the misses counted before it still count after it, and
    the looseness goes on from where it was, on the restarted run's own clock."""
    before = AttainmentBudget(TARGET)
    _, end = _run(before, 300.0, rate=5.0, miss=0.0)
    _, end = _run(before, 30.0, rate=5.0, miss=0.05, start=end)  # 7.5 misses: behind
    state = before.state_dict()
    # Restarted 20 s later: the new run's clock reads 3 s; the save was 20 s ago on it.
    after = AttainmentBudget(TARGET)
    assert after.load_state(state, time_s=3.0, shift_s=3.0 - 20.0 - end[0])
    assert after.looseness == before.looseness
    _run(after, 10.0, rate=5.0, miss=0.0, start=(3.0, end[1], end[2]))
    assert after.last is not None and after.last.misses == pytest.approx(7.5, abs=0.01)
    # Started fresh, the same node would have counted none of them.
    fresh = AttainmentBudget(TARGET)
    _run(fresh, 10.0, rate=5.0, miss=0.0, start=(3.0, end[1], end[2]))
    assert fresh.last is not None and fresh.last.misses == 0.0


@pytest.mark.parametrize(
    "since_s",
    [
        700.0,  # down for longer than the window: nothing of it left
        -5.0,  # a save after now: not this run's past
        math.nan,
    ],
)
def test_a_stored_window_past_the_window_or_ahead_of_now_is_not_applied(since_s: float) -> None:
    before = AttainmentBudget(TARGET)
    _, end = _run(before, 300.0, rate=5.0, miss=0.0)
    after = AttainmentBudget(TARGET)
    assert not after.load_state(before.state_dict(), end[0] + since_s)
    assert after.looseness == 1.0 and after.state_dict()["snapshots"] == []


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        ({"looseness": "loose"}, "slo_budget.looseness"),
        ({"time_s": math.nan}, "slo_budget.time_s"),
        ({"snapshots": {}}, "slo_budget.snapshots"),
        ({"snapshots": [[1.0, 1.0, 1.0]]}, r"slo_budget.snapshots\[0\]"),
        ({"snapshots": [[1.0, None, None, None, None]]}, r"slo_budget.snapshots\[0\]"),
        ({"snapshots": [[1.0, -1.0, 1.0, None, None]]}, r"slo_budget.snapshots\[0\]"),
        ({"snapshots": [[2.0, 1, 1, 1, 1], [1.0, 1, 1, 1, 1]]}, "time order"),
        ({"snapshots": [[1e9, 1, 1, 1, 1]]}, "later than"),
    ],
)
def test_a_damaged_stored_window_is_refused_naming_the_field(
    damage: dict[str, object], field: str
) -> None:
    before = AttainmentBudget(TARGET)
    _run(before, 60.0, rate=5.0, miss=0.0)
    state = {**before.state_dict(), **damage}
    after = AttainmentBudget(TARGET)
    with pytest.raises(ValueError, match=field):
        after.load_state(state, 61.0)
    assert after.looseness == 1.0 and after.state_dict()["snapshots"] == []


def test_overspent_while_the_window_is_past_its_budget_and_still_missing() -> None:
    """Overspent: the window's misses past its whole projected budget while its short
    window (a twelfth: 50 s) still misses faster than the target sustains; a short window
    clean again ends it, though the long window is still past its budget."""
    budget = AttainmentBudget(TARGET)
    _, state = _run(budget, 200.0, rate=5.0, miss=0.0)
    assert not budget.overspent
    _, state = _run(budget, 30.0, rate=5.0, miss=0.1, start=state)  # 15 of its 30
    assert budget.remaining > 0.0 and not budget.overspent
    _, state = _run(budget, 60.0, rate=5.0, miss=0.1, start=state)
    assert budget.remaining < 0.0 and budget.overspent
    _, state = _run(budget, 60.0, rate=5.0, miss=0.0, start=state)
    assert budget.remaining < 0.0 and not budget.overspent
    light = AttainmentBudget(TARGET)  # misses within the window's budget: not overspent
    _run(light, 600.0, rate=5.0, miss=0.005)
    assert light.remaining > 0.0 and not light.overspent


def test_a_window_blind_to_an_slo_it_judges_is_never_ahead() -> None:
    """TGI publishes no TTFT histogram: a colocated domain with a TTFT SLO counts its
    TPOT judgements only. Ahead on them, the budget loosened every margin, the TTFT ones
    included, on no evidence that first tokens had room (their misses are not seen).
    Where the role judges no TTFT (a decode pool), TPOT alone is the evidence."""
    slos = {"ttft_slo_s": 1.0, "tpot_slo_s": 0.05}
    for role, ahead in (("colocated", False), ("decode", True)):
        budget = AttainmentBudget(TARGET)
        for second in range(1, 601):
            count = 5.0 * second
            budget.update(_observation(float(second), None, (count, count), role=role, **slos))
        assert budget.ahead is ahead, role
        assert (budget.looseness > 1.0) is ahead, role
