"""The burst guard: while a prompt backlog is prefilled the clock drains it within the TTFT
target and, beside decoding requests, keeps the pessimistic mixed iteration within the TPOT
SLO; an idle GPU parks there when arrivals often come together (:class:`ArrivalClumping`)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.mpc.model import CHUNK_TOKENS
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.exploration import ArrivalClumping
from gpugov.plant import PerformanceProfile, chunked_prefill_scheduler, simulate
from gpugov.plant.types import Request, ServingObservation

CLOCKS = np.arange(500.0, 1501.0, 50.0)
PREFILL_S_PER_TOKEN_TOP = 6e-5  # 512 tokens: 30.7 ms at the top clock
DECODE_S_TOP = 0.012


class _Model:
    """What the guard reads of :class:`OnlineModel`: clocks, the realised ratio and a
    latency table that scales like 1/f with a 10% relative std."""

    clocks_mhz = CLOCKS
    realized_ratio = np.ones(CLOCKS.size)

    def table(self, clocks: np.ndarray, batch: float, context: float) -> dict:
        scale = CLOCKS[-1] / np.asarray(clocks)
        prefill = PREFILL_S_PER_TOKEN_TOP * scale
        decode = DECODE_S_TOP * scale
        return {
            "prefill_s_per_token": (prefill, 0.1 * prefill),
            "decode_iteration_s": (decode, 0.1 * decode),
        }


def _mixed(clock: float, batch: float, z: float) -> float:
    scale = CLOCKS[-1] / clock
    chunk = max(CHUNK_TOKENS - batch, 32.0)
    return (1.0 + 0.1 * z) * scale * (DECODE_S_TOP + chunk * PREFILL_S_PER_TOKEN_TOP)


def _seen(*, backlog: float, running: int, waiting: int, arrived: int = 0) -> ServingObservation:
    return ServingObservation(
        time_s=1.0,
        step_index=1,
        arrived_requests=arrived,
        prefill_remaining_tokens=backlog,
        decode_active=running,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        waiting_requests=waiting,
        supported_clocks_mhz=tuple(CLOCKS),
    )


def _controller() -> OnlineMPCController:
    controller = OnlineMPCController()
    controller.model = _Model()  # type: ignore[assignment]
    return controller


def _clumped_controller() -> OnlineMPCController:
    """A controller that has seen arrivals come three at a time for 20 periods."""
    controller = _controller()
    arrived = 0
    for _ in range(20):
        arrived += 3
        controller.clumping.update(_seen(backlog=0.0, running=0, waiting=0, arrived=arrived))
    assert controller.clumping.clumped
    return controller


def test_a_burst_beside_decodes_gets_the_lowest_clock_whose_mixed_iteration_fits() -> None:
    controller = _controller()
    z = controller.uncertainty_z
    slo = 0.07
    floor = controller.burst_floor(_seen(backlog=4000.0, running=8, waiting=3), (100.0, slo))
    fitting = [c for c in CLOCKS if _mixed(c, 8, z) <= slo]
    assert fitting and floor == pytest.approx(min(fitting))
    assert _mixed(floor - 50.0, 8, z) > slo  # one step lower would not fit


def test_a_slo_no_clock_meets_during_a_burst_gets_the_maximum() -> None:
    controller = _controller()
    assert _mixed(CLOCKS[-1], 2, controller.uncertainty_z) > 0.03
    seen = _seen(backlog=4000.0, running=2, waiting=0)
    assert controller.burst_floor(seen, (100.0, 0.03)) == CLOCKS[-1]


def test_no_burst_no_guard() -> None:
    controller = _controller()
    # Less than one chunk waits: no guard.
    assert controller.burst_floor(_seen(backlog=300.0, running=5, waiting=1), (1.0, 0.05)) is None
    # Idle, and no evidence that arrivals come together: no parking.
    assert controller.burst_floor(_seen(backlog=0.0, running=0, waiting=0), (1.0, 0.05)) is None
    # One lone prompt with nobody decoding beside it: only the drain limit, which a loose
    # TTFT SLO meets at the lowest clock (the TPOT limit would not: 0.01 s).
    lone = _seen(backlog=9000.0, running=0, waiting=1)
    assert controller.burst_floor(lone, (100.0, 0.01)) == CLOCKS[0]


def test_a_backlog_is_drained_within_the_ttft_target() -> None:
    controller = _controller()
    z = controller.uncertainty_z
    backlog, ttft = 9000.0, 1.6
    floor = controller.burst_floor(_seen(backlog=backlog, running=0, waiting=1), (ttft, 1.0))
    chunk = CHUNK_TOKENS - 1.0
    fitting = [
        c
        for c in CLOCKS
        if math.ceil(backlog / chunk) * _mixed(c, 1, z) <= controller.slo_margin * ttft
    ]
    assert fitting and floor == pytest.approx(min(fitting)) and floor > CLOCKS[0]
    # A backlog no clock drains in time gets the maximum (the MPC's capped TTFT penalty
    # would give it up).
    hopeless = _seen(backlog=50 * backlog, running=0, waiting=1)
    assert controller.burst_floor(hopeless, (ttft, 1.0)) == CLOCKS[-1]


def test_an_idle_gpu_parks_at_the_burst_clock_where_arrivals_come_together() -> None:
    controller = _clumped_controller()
    slo = 0.07
    floor = controller.burst_floor(_seen(backlog=0.0, running=0, waiting=0), (1.0, slo))
    fitting = [c for c in CLOCKS if _mixed(c, 1, controller.uncertainty_z) <= slo]
    assert floor == pytest.approx(min(fitting))


def test_an_idle_gpu_does_not_park_for_short_answers_no_clock_would_save() -> None:
    controller = _clumped_controller()
    # The mixed iteration outlasts this TPOT SLO even at the top clock: parking the idle
    # GPU there would cost power and save no short answer.
    slo = 0.03
    assert _mixed(CLOCKS[-1], 1, controller.uncertainty_z) > slo
    assert controller.burst_floor(_seen(backlog=0.0, running=0, waiting=0), (1.0, slo)) is None
    # A burst beside decodes under the same SLO still gets the top clock (it drains the
    # backlog soonest), as before.
    burst = _seen(backlog=4000.0, running=2, waiting=2)
    assert controller.burst_floor(burst, (100.0, slo)) == CLOCKS[-1]


def test_arrival_clumping_counts_periods_with_company() -> None:
    clumping = ArrivalClumping()
    assert clumping.share is None and not clumping.clumped  # no evidence yet
    arrived = 0
    for index in range(40):
        arrived += 2 if index % 10 == 5 else 1  # one period in ten has two arrivals
        clumping.update(_seen(backlog=0.0, running=0, waiting=0, arrived=arrived))
        clumping.update(_seen(backlog=0.0, running=0, waiting=0, arrived=arrived))  # quiet
    assert clumping.share == pytest.approx(0.1, abs=0.02)  # decayed counts: near 0.1
    lone = ArrivalClumping()
    for arrived in range(1, 30):
        lone.update(_seen(backlog=0.0, running=0, waiting=0, arrived=arrived))
    assert lone.share == 0.0 and not lone.clumped
    # An engine restart (the counter goes back) is not an arrival.
    lone.update(_seen(backlog=0.0, running=0, waiting=0, arrived=0))
    assert lone.last_arrived == 0 and lone.share == 0.0


def _clumped_short_answers(seed: int, duration_s: float = 300.0) -> list[Request]:
    """Groups of 1-4 prompts arriving together; 40% of answers are 2-9 tokens long."""
    rng = np.random.default_rng(seed)
    requests: list[Request] = []
    time_s = 0.0
    while time_s < duration_s:
        time_s += 0.05 + rng.exponential(3.0)
        for k in range(int(rng.integers(1, 5))):
            output = int(rng.integers(2, 10)) if rng.random() < 0.4 else int(rng.integers(30, 300))
            requests.append(
                Request(len(requests), time_s + 0.01 * k, int(rng.integers(800, 3000)), output)
            )
    return requests


def test_on_a_plant_whose_mixed_iteration_nears_the_slo_at_the_top_clock_it_holds() -> None:
    """A shape unlike the bundled ones: prefill slow enough that an iteration carrying a
    512-token chunk takes most of the TPOT SLO even at the top clock."""
    base = make_profile()
    profile = PerformanceProfile(
        clock_mhz=base.clock_mhz,
        prefill_tokens_per_s=0.75 * base.prefill_tokens_per_s,
        decode_tokens_per_s=base.decode_tokens_per_s,
        prefill_power_w=base.prefill_power_w,
        decode_power_w=base.decode_power_w,
        idle_power_w=base.idle_power_w,
        ttft_slo_s=1.5,
        tpot_slo_s=0.055,
        manifest=base.manifest,
        name="mix-tight",
    )
    plant = make_plant(profile)
    workload = _clumped_short_answers(1)
    reference = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller, 0)
    prompts = np.array([r.prompt_tokens for r in workload], dtype=float)
    outputs = np.array([r.output_tokens for r in workload], dtype=float)
    controller = OnlineMPCController(
        mean_prompt_tokens=float(prompts.mean()),
        mean_output_tokens=float(outputs.mean()),
        ttft_prompt_tokens=float(np.percentile(prompts, 95)),
        control_period_s=0.5,
    )
    guarded = 0

    def counted(observation: ServingObservation) -> float:
        nonlocal guarded
        decision = controller(observation)
        guarded += controller.last_reason == "burst-guard"
        return decision

    result = simulate(workload, plant, chunked_prefill_scheduler, counted, 0, control_period_s=0.5)
    assert reference.metrics.slo_attainment is not None
    assert result.metrics.slo_attainment >= reference.metrics.slo_attainment - 0.01
    assert result.metrics.energy_j < reference.metrics.energy_j
    assert guarded > 0 and controller.clumping.clumped


def _steady_with(long_prompt_at: float | None) -> list[Request]:
    """Steady decoding (a request every 0.5 s, 400 tokens each), and optionally one
    16k-token prompt arriving at ``long_prompt_at``."""
    rng = np.random.default_rng(3)
    steady = [Request(0, 0.5 * i, int(rng.integers(200, 800)), 400) for i in range(160)]
    if long_prompt_at is not None:
        steady.append(Request(0, long_prompt_at, 16_000, 50))
    merged = sorted(steady, key=lambda r: r.arrival_time_s)
    return [
        Request(i, r.arrival_time_s, r.prompt_tokens, r.output_tokens) for i, r in enumerate(merged)
    ]


def _decisions(
    workload: list[Request], period: float
) -> tuple[list[tuple[float, float, float, str]], object]:
    controller = OnlineMPCController(
        control_period_s=period, mean_prompt_tokens=500.0, mean_output_tokens=400.0, warmup_s=10.0
    )
    seen: list[tuple[float, float, float, str]] = []

    def recording(observation: ServingObservation) -> float:
        decision = float(controller(observation))
        seen.append(
            (
                observation.time_s,
                observation.prefill_remaining_tokens,
                decision,
                controller.last_reason,
            )
        )
        return decision

    result = simulate(
        workload, make_plant(), chunked_prefill_scheduler, recording, 0, control_period_s=period
    )
    return seen, result


def test_a_long_prompt_arriving_in_a_lowered_window_raises_the_clock_at_the_next_tick() -> None:
    """Steady decoding; a 16k-token prompt arrives just after a decision that lowered the
    clock (0.25 s period). The next decision sees its backlog and raises the clock to
    drain it (the burst guard), one period later at most."""
    period = 0.25
    top = float(make_plant().profile.clock_mhz[-1])
    quiet, _ = _decisions(_steady_with(None), period)
    lowered = next(t for t, _, d, _ in quiet if t >= 55.0 and d < top)
    arrival = lowered + 0.3 * period
    seen, result = _decisions(_steady_with(arrival), period)
    decided = {t: d for t, _, d, _ in seen}
    assert decided[lowered] < top  # the same decisions up to the arrival
    t, backlog, decision, why = next(row for row in seen if row[0] > arrival)
    assert t - arrival <= period and backlog > CHUNK_TOKENS
    assert decision == top and why == "burst-guard"
    # It waits at most one period at the lowered clock: its TTFT is at most one period
    # more than what the maximum clock all along gives it.
    at_top = simulate(
        _steady_with(arrival), make_plant(), chunked_prefill_scheduler, maximum_clock_controller, 0
    )

    def long_ttft(records: object) -> float:
        return next(r.ttft_s for r in records if r.prompt_tokens == 16_000)  # type: ignore[attr-defined]

    assert long_ttft(result.request_records) <= long_ttft(at_top.request_records) + period  # type: ignore[attr-defined]


def test_the_backlog_age_follows_the_oldest_waiting_request() -> None:
    from dataclasses import replace

    from gpugov.controllers.online.exploration import BacklogAge

    def tick(time_s: float, arrived: int, waiting: int, backlog: float) -> ServingObservation:
        seen = _seen(backlog=backlog, running=0, waiting=waiting)
        return replace(seen, time_s=time_s, arrived_requests=arrived)

    age = BacklogAge()
    assert age.update(tick(0.0, 0, 0, 0.0)) == 0.0
    # Two requests arrive between 0.0 and 0.25 s: half a period old when first seen.
    assert age.update(tick(0.25, 2, 2, 4_000.0)) == pytest.approx(0.125)
    # A third arrives; the first two still wait: the oldest is still the first lot's.
    assert age.update(tick(0.5, 3, 3, 3_600.0)) == pytest.approx(0.375)
    # The first lot has its first tokens: the oldest waiting request came with the third.
    assert age.update(tick(0.75, 3, 1, 500.0)) == pytest.approx(0.375)
    # A backlog estimate that jumps (a node's view) moves nothing: the requests decide.
    assert age.update(tick(1.0, 3, 1, 20_000.0)) == pytest.approx(0.625)
    # All drained: no age.
    assert age.update(tick(1.25, 3, 0, 0.0)) == 0.0
    # An engine restart (the arrivals went backwards) starts afresh.
    assert age.update(tick(1.5, 1, 1, 1_000.0)) == pytest.approx(0.0)


def _groups_by_every_tick(
    ticks: list[tuple[float, float]],
    earlier_s: float | None,
    now_s: float,
    waiting: int,
    age_s: float,
) -> list[tuple[int, float]]:
    """The arrival groups read from every kept tick (the direct reading of
    :meth:`BacklogAge.arrival_groups`' definition)."""
    if waiting <= 0 or not ticks:
        return []
    left = ticks[-1][1] - waiting
    groups: list[tuple[int, float]] = []
    earlier = earlier_s
    for time_s, arrived in ticks:
        count = int(arrived - left)
        if count > 0 and (not groups or count > groups[-1][0]):
            since_s = time_s if earlier is None else 0.5 * (earlier + time_s)
            groups.append((count, age_s if not groups else max(0.0, now_s - since_s)))
        earlier = time_s
    return groups


def test_the_arrival_groups_read_only_the_rises_and_match_every_tick() -> None:
    """``arrival_groups`` reads the ticks where the arrivals rose, not every kept tick (a
    stuck queue keeps thousands), and gives what every kept tick gives: random arrivals
    and departures, engine restarts and the tick cap."""
    from dataclasses import replace

    from gpugov.controllers.online.exploration import BacklogAge

    rng = np.random.default_rng(7)
    for maximum_ticks in (4096, 5):
        age = BacklogAge(maximum_ticks=maximum_ticks)
        arrived, waiting, now = 0, 0, 0.0
        for _ in range(600):
            now += 0.25
            if rng.random() < 0.02:
                arrived, waiting = int(rng.integers(0, 3)), 0  # an engine restart
            new = int(rng.poisson(0.6)) if rng.random() < 0.5 else 0
            arrived += new
            waiting = max(0, waiting + new - int(rng.poisson(0.7)))
            seen = replace(
                _seen(backlog=1_000.0 * waiting, running=0, waiting=waiting),
                time_s=now,
                arrived_requests=arrived,
            )
            age.update(seen)
            expected = _groups_by_every_tick(
                list(age._ticks), age._earlier_s, age._now_s, age._waiting, age.age_s
            )
            assert age.arrival_groups() == expected
            assert len(age._rises) <= len(age._ticks)


def test_a_backlog_that_already_waited_gets_a_faster_clock() -> None:
    controller = _controller()
    observation = _seen(backlog=6 * CHUNK_TOKENS, running=8, waiting=3)
    fresh = controller.burst_floor(observation, (1.0, 0.1))
    controller.backlog_age.age_s = 0.4  # the oldest prompt waited 0.4 s of its 1 s SLO
    waited = controller.burst_floor(observation, (1.0, 0.1))
    assert fresh is not None and waited is not None and waited > fresh
    controller.backlog_age.age_s = 0.8  # past the 0.7 s target: only the top clock
    assert controller.burst_floor(observation, (1.0, 0.1)) == float(CLOCKS[-1])


def test_the_short_answer_rule_stands_down_while_the_budget_is_ahead() -> None:
    from gpugov.controllers.budget import SLOTarget

    controller = OnlineMPCController(slo_target=SLOTarget(0.99))
    controller.model = _Model()  # type: ignore[assignment]
    slo = 0.07
    burst = _seen(backlog=4000.0, running=8, waiting=3)
    assert controller.budget is not None
    guarded = controller.burst_floor(burst, (100.0, slo))
    assert guarded is not None and guarded > CLOCKS[0]
    controller.budget.ahead = True
    assert controller.spending
    # The loose TTFT target drains the backlog at the lowest clock: only the drain binds.
    assert controller.burst_floor(burst, (100.0, slo)) == CLOCKS[0]
    # The drain limit still binds while the budget is ahead.
    assert controller.burst_floor(burst, (0.05, slo)) == CLOCKS[-1]


def test_the_backlog_tail_is_planned_with_only_while_no_miss_is_affordable() -> None:
    """A node prices a prompt in its prefill at its expected rest; while the SLO window can
    afford one more miss that risk is the budget's, and once it cannot, the controller
    plans with the tail estimate (a far longer prompt holds a short one queued behind it)."""
    from dataclasses import replace

    from gpugov.controllers.budget import SLOTarget

    controller = OnlineMPCController(slo_target=SLOTarget(0.99))
    assert controller.budget is not None
    seen = replace(_seen(backlog=12_000.0, running=1, waiting=1), prefill_tail_tokens=80_000.0)
    controller.budget.affordable = True
    assert controller._tail_backlog(seen) is seen
    controller.budget.affordable = False
    planned = controller._tail_backlog(seen)
    assert planned.prefill_remaining_tokens == 80_000.0
    # An exact backlog (no tail) or a tail below it changes nothing.
    exact = _seen(backlog=12_000.0, running=1, waiting=1)
    assert controller._tail_backlog(exact) is exact
    low = replace(exact, prefill_tail_tokens=5_000.0)
    assert controller._tail_backlog(low) is low
    # Without a target there is no budget to judge by: the expected backlog stands.
    assert OnlineMPCController()._tail_backlog(seen) is seen


def _lone_prompt(backlog: float, *, role: str = "colocated") -> ServingObservation:
    return replace(_seen(backlog=backlog, running=0, waiting=1), role=role)


def _drain_clock(backlog: float, target_s: float, *, prefill_pool: bool, z: float) -> float:
    """The lowest clock that prefills ``backlog`` within ``target_s`` at the pessimistic
    iteration: a prefill pool's chunk alone, else a chunk beside one decode."""
    fitting = []
    for clock in CLOCKS:
        scale = CLOCKS[-1] / clock
        if prefill_pool:
            iteration = (1.0 + 0.1 * z) * scale * CHUNK_TOKENS * PREFILL_S_PER_TOKEN_TOP
            chunks = math.ceil(backlog / CHUNK_TOKENS)
        else:
            iteration = _mixed(clock, 1, z)
            chunks = math.ceil(backlog / (CHUNK_TOKENS - 1.0))
        if chunks * iteration <= target_s:
            fitting.append(clock)
    return float(min(fitting)) if fitting else float(CLOCKS[-1])


def test_a_prefill_pool_drains_in_chunks_without_a_decode_iteration() -> None:
    # A prefill pool decodes nothing: each iteration is a whole chunk of prompt tokens
    # alone, so the same backlog drains at a lower clock than beside a running decode.
    controller = _controller()
    z = controller.uncertainty_z
    ttft, rest = 1.6, 9000.0
    pool = _lone_prompt(rest, role="prefill")
    colocated = _lone_prompt(rest)
    target = controller.slo_margin * ttft
    assert controller.burst_floor(pool, (ttft, 1.0)) == pytest.approx(
        _drain_clock(rest, target, prefill_pool=True, z=z)
    )
    assert controller.burst_floor(colocated, (ttft, 1.0)) == pytest.approx(
        _drain_clock(rest, target, prefill_pool=False, z=z)
    )
    assert controller.burst_floor(pool, (ttft, 1.0)) < controller.burst_floor(
        colocated, (ttft, 1.0)
    )


def test_the_backlog_age_gives_every_waiting_request_its_own_age() -> None:
    from gpugov.controllers.online.exploration import BacklogAge

    def tick(time_s: float, arrived: int, waiting: int) -> ServingObservation:
        seen = _seen(backlog=1_000.0 * waiting, running=0, waiting=waiting)
        return replace(seen, time_s=time_s, arrived_requests=arrived)

    age = BacklogAge()
    age.update(tick(0.0, 0, 0))
    assert age.ages_s() == []
    age.update(tick(0.25, 2, 2))  # two in (0, 0.25]
    age.update(tick(0.5, 3, 3))  # one in (0.25, 0.5]
    age.update(tick(0.75, 5, 5))  # two in (0.5, 0.75]
    assert age.ages_s() == pytest.approx([0.625, 0.625, 0.375, 0.125, 0.125])
    assert age.ages_s()[0] == pytest.approx(age.age_s)
    age.update(tick(1.0, 5, 2))  # the first three have their first tokens
    assert age.ages_s() == pytest.approx([0.375, 0.375])
    age.update(tick(1.25, 5, 0))
    assert age.ages_s() == []


def _waited(controller: OnlineMPCController, ages: list[float], backlog: float) -> float | None:
    """The burst guard's clock for ``len(ages)`` prompts waiting, having arrived ``ages``
    seconds ago (oldest first, each at the middle of a 0.25 s period), beside 8 decodes."""
    age = controller.backlog_age
    now = 10.0
    # Each request is first seen at the tick that closes the period it arrived in.
    for time_s in np.arange(now - 2.0, now, 0.25):
        arrived = sum(1 for a in ages if now - a + 0.125 <= time_s + 1e-9)
        seen = _seen(backlog=1_000.0 * arrived, running=8, waiting=arrived)
        age.update(replace(seen, time_s=float(time_s), arrived_requests=arrived))
    burst = replace(
        _seen(backlog=backlog, running=8, waiting=len(ages)), time_s=now, arrived_requests=len(ages)
    )
    age.update(burst)
    assert age.ages_s() == pytest.approx(ages)
    return controller.burst_floor(burst, (1.0, 10.0))


def test_each_waiting_prompt_is_drained_by_its_own_deadline() -> None:
    """Prefilled first in first out, the k-th of w waiting prompts needs only the first k/w
    of the backlog by its own deadline, counted from its own arrival; the oldest's
    deadline binds the backlog as a whole only where the prompts came together, where a
    clock's longer drain would break the decoding replies' TPOT, or where the SLO window
    could not afford every waiting prompt missing."""
    z = OnlineMPCController().effective_z
    backlog = 8 * CHUNK_TOKENS
    margin = OnlineMPCController().slo_margin

    def lowest(needs: list[tuple[float, float]]) -> float:
        fitting = [
            c
            for c in CLOCKS
            if all(
                math.ceil(tokens / (CHUNK_TOKENS - 8)) * _mixed(c, 8, z) <= margin - age
                for tokens, age in needs
            )
        ]
        return min(fitting) if fitting else float(CLOCKS[-1])

    together = _waited(_controller(), [0.375] * 4, backlog)
    assert together == pytest.approx(lowest([(backlog, 0.375)]))
    spread = _waited(_controller(), [0.375, 0.125, 0.125, 0.125], backlog)
    expected = lowest([(backlog / 4, 0.375), (backlog, 0.125)])
    assert spread == pytest.approx(expected)
    assert together is not None and spread is not None and spread < together
    # The newest prompts' deadlines relax the drain only where the longer drain's mixed
    # iteration still meets the TPOT SLO of the replies decoding beside it.
    # (The budget ahead, so that the short-answer rule stands down and only this binds.)
    from gpugov.controllers.budget import SLOTarget

    controller = OnlineMPCController(slo_target=SLOTarget(0.99))
    controller.model = _Model()  # type: ignore[assignment]
    assert controller.budget is not None
    _waited(controller, [0.375, 0.125, 0.125, 0.125], backlog)
    controller.budget.ahead = True
    assert controller.spending and controller.looseness == 1.0
    burst = replace(_seen(backlog=backlog, running=8, waiting=4), time_s=10.0, arrived_requests=4)
    assert controller.burst_floor(burst, (1.0, 10.0)) == pytest.approx(spread)
    tight_tpot = _mixed(together, 8, z) * 1.001
    assert controller.burst_floor(burst, (1.0, tight_tpot)) == pytest.approx(together)
    # Only while the SLO window could afford every waiting prompt (and the next) missing.
    controller.budget.remaining, controller.budget.exposed = 4.0, 5.0
    assert controller.burst_floor(burst, (1.0, 10.0)) == pytest.approx(together)
    controller.budget.remaining = 5.0
    assert controller.burst_floor(burst, (1.0, 10.0)) == pytest.approx(spread)


def _spent_controller(
    *, tpot_misses: float, remaining: float, recent_tpot_misses: float = 0.0
) -> OnlineMPCController:
    """A controller whose SLO window has ``remaining`` misses left, ``tpot_misses`` of
    its counted misses TPOT ones, ``recent_tpot_misses`` of them in its short window."""
    from gpugov.controllers.budget import SLOTarget, WindowAttainment

    controller = OnlineMPCController(slo_target=SLOTarget(0.99))
    controller.model = _Model()  # type: ignore[assignment]
    assert controller.budget is not None
    controller.budget.remaining = remaining
    controller.budget.affordable = remaining >= 1.0
    controller.budget.last = WindowAttainment(
        requests=100.0, miss_fraction=0.01, tpot_misses=tpot_misses
    )
    controller.budget.recent = WindowAttainment(
        requests=10.0, miss_fraction=0.1, tpot_misses=recent_tpot_misses
    )
    return controller


def _typical_mixed(clock: float, batch: float) -> float:
    return _mixed(clock, batch, 0.0)


def test_with_no_tpot_miss_left_a_decode_window_holds_the_clock_a_prompt_landing_in_it_needs() -> (
    None
):
    """A prompt that lands in a lowered decode window is prefilled beside the decoding
    replies at that clock until the next decision: once the window has spent its misses
    on TPOT, that mixed iteration must fit the TPOT SLO (a short reply decoding beside a
    stream of prompts lives on such iterations alone)."""
    slo = 0.07
    decoding = _seen(backlog=0.0, running=4, waiting=0)
    idle = _seen(backlog=0.0, running=0, waiting=0)
    spent = _spent_controller(tpot_misses=1.0, remaining=0.2)
    fitting = [c for c in CLOCKS if _typical_mixed(c, 4) <= slo]
    assert fitting and CLOCKS[0] < min(fitting) < CLOCKS[-1]
    assert spent.burst_floor(decoding, (100.0, slo)) == pytest.approx(min(fitting))
    # An idle GPU too: a prompt arriving there decodes beside the next one.
    idle_fitting = [c for c in CLOCKS if _typical_mixed(c, 1) <= slo]
    assert spent.burst_floor(idle, (100.0, slo)) == pytest.approx(min(idle_fitting))
    # A board whose mixed iteration outlasts the SLO at every clock: the top clock's.
    assert spent.burst_floor(decoding, (100.0, 0.01)) == CLOCKS[-1]
    # A miss still affordable, or misses that were not TPOT ones: no floor.
    for controller in (
        _spent_controller(tpot_misses=1.0, remaining=1.5),
        _spent_controller(tpot_misses=0.0, remaining=0.2),
    ):
        assert controller.burst_floor(decoding, (100.0, slo)) is None
        assert controller.burst_floor(idle, (100.0, slo)) is None
    # Without a target there is no budget to judge by.
    assert _controller().burst_floor(decoding, (100.0, slo)) is None


def test_past_its_budget_a_window_holds_the_top_clock_for_a_prompt_landing_in_it() -> None:
    """Past the window's budget (more misses than it allows) and still missing on TPOT in
    its short window, the misses came at clocks the learned mean judged to fit: a decode
    window and an idle GPU hold the top clock while they go on."""
    slo = 0.07
    decoding = _seen(backlog=0.0, running=4, waiting=0)
    idle = _seen(backlog=0.0, running=0, waiting=0)
    fitting = [c for c in CLOCKS if _typical_mixed(c, 4) <= slo]
    assert fitting and min(fitting) < CLOCKS[-1]
    missing = _spent_controller(tpot_misses=2.0, remaining=-0.5, recent_tpot_misses=1.0)
    assert missing.burst_floor(decoding, (100.0, slo)) == CLOCKS[-1]
    assert missing.burst_floor(idle, (100.0, slo)) == CLOCKS[-1]
    # Past the budget with no TPOT miss of late (an estimate's misses that stopped
    # coming), within it, or past it on TTFT misses alone: as before.
    for controller in (
        _spent_controller(tpot_misses=2.0, remaining=-0.5),
        _spent_controller(tpot_misses=2.0, remaining=0.0, recent_tpot_misses=1.0),
    ):
        assert controller.burst_floor(decoding, (100.0, slo)) == pytest.approx(min(fitting))
    ttft_only = _spent_controller(tpot_misses=0.0, remaining=-0.5)
    assert ttft_only.burst_floor(decoding, (100.0, slo)) is None


def test_a_prefill_pools_warm_up_drains_its_backlog_below_the_top_clock() -> None:
    """In the warm-up, once a second of busy windows is fitted, a prefill pool's backlog
    gets the burst guard's drain clock (the warm-up fit's 1/f law), not the top clock,
    and every prompt still meets its TTFT SLO; before that second, the top clock. The
    profile is one of the tests' own (a 20k token/s prefill, 1 s TTFT SLO), the run
    shorter than the warm-up: it misses no more prompts than the maximum clock, for less
    energy."""
    from gpugov.controllers.online.rules import WARMUP_DRAIN_BUSY_S
    from gpugov.plant import ServingPlant
    from gpugov.plant.disaggregated import simulate_disaggregated
    from gpugov.plant.disaggregated_layout import DisaggregatedPlant, PoolSpec
    from gpugov.plant.synthetic_workloads import LognormalLengths, poisson_workload

    plant = ServingPlant.from_profile(make_profile())
    requests = poisson_workload(
        0.5, 90.0, seed=11, prompt_tokens=LognormalLengths(median=5000.0, mean=6000.0)
    )
    prefill = OnlineMPCController(control_period_s=0.25, mean_prompt_tokens=6000.0)
    decisions: list[tuple[str, float, float, bool]] = []

    def recorded(observation: ServingObservation) -> float:
        clock = prefill(observation)
        model = prefill.model
        assert model is not None
        busy_s = float(model.visits.sum()) * prefill.control_period_s
        decisions.append((prefill.last_reason, clock, busy_s, model.warmed_up))
        return clock

    def run(controller: object) -> Any:
        layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant))
        controllers = {"prefill": controller, "decode": maximum_clock_controller}
        return simulate_disaggregated(requests, layout, controllers, 0, control_period_s=0.25)  # type: ignore[arg-type]

    result, at_top = run(recorded), run(maximum_clock_controller)
    top = float(plant.profile.clock_mhz[-1])
    guarded = [
        (clock, busy_s, warm)
        for reason, clock, busy_s, warm in decisions
        if reason == "warm-up-guard"
    ]
    assert guarded, "no backlog was priced in the warm-up"
    assert all(not warm and busy_s >= WARMUP_DRAIN_BUSY_S for _, busy_s, warm in guarded)
    assert min(clock for clock, _, _ in guarded) < 0.8 * top
    early = [c for r, c, busy_s, _ in decisions if busy_s < WARMUP_DRAIN_BUSY_S and r == "warm-up"]
    assert early and all(clock == top for clock in early)
    # The maximum clock misses one prompt of 48 here (a 9.7k-token prompt behind two).
    assert result.metrics.ttft_slo_attainment == at_top.metrics.ttft_slo_attainment
    spent = result.pools["prefill"].as_dict()["energy_j"]
    assert spent < at_top.pools["prefill"].as_dict()["energy_j"]


def test_a_tighter_target_share_binds_only_where_the_top_clock_meets_it() -> None:
    # A lone 9k-token prompt in a prefill pool: at the top clock it drains in 0.64 s.
    # Within half the 1.6 s SLO (0.8 s) the top clock meets it, so that share binds;
    # within 0.3 of it (0.48 s) no clock does, so the margin's drain stands.
    controller = _controller()
    z = controller.uncertainty_z
    ttft, rest = 1.6, 9000.0
    pool = _lone_prompt(rest, role="prefill")
    margin = _drain_clock(rest, controller.slo_margin * ttft, prefill_pool=True, z=z)
    half = _drain_clock(rest, 0.5 * ttft, prefill_pool=True, z=z)
    assert margin < half < CLOCKS[-1]
    assert controller.burst_floor(pool, (ttft, 1.0)) == pytest.approx(margin)
    assert controller.burst_floor(pool, (ttft, 1.0), 0.5) == pytest.approx(half)
    assert controller.burst_floor(pool, (ttft, 1.0), 0.3) == pytest.approx(margin)
    assert controller.burst_floor(pool, (ttft, 1.0), 0.9) == pytest.approx(margin)


def test_prompts_the_kv_cache_has_no_room_for_get_the_top_clock() -> None:
    """Admitted only as running replies finish, a backlog that does not fit the cache's
    room drains at the decode's pace, which the drain by the prefill rate leaves out;
    the same backlog with room, or where the engine publishes no cache, keeps the drain's
    clock."""
    controller = _controller()
    slos = (100.0, 1.0)  # loose: the drain alone allows the lowest clock
    waiting = _seen(backlog=4000.0, running=12, waiting=3)
    roomy = replace(waiting, kv_tokens=10_000.0, kv_capacity_tokens=20_000.0)
    full = replace(waiting, kv_tokens=18_000.0, kv_capacity_tokens=20_000.0)
    assert controller.burst_floor(waiting, slos) == CLOCKS[0]
    assert controller.burst_floor(roomy, slos) == CLOCKS[0]
    assert controller.burst_floor(full, slos) == CLOCKS[-1]
    # Nothing waits: no guard, however full the cache.
    idle = replace(full, waiting_requests=0, prefill_remaining_tokens=0.0)
    assert controller.burst_floor(idle, slos) is None
    # A prefill pool's cache is freed by the transfers, which its clock does not hasten.
    assert controller.burst_floor(replace(full, role="prefill"), slos) == CLOCKS[0]
