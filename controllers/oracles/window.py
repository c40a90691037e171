"""The window schedule in hindsight: a clock per window from a greedy forward search that
forks the plant at each boundary (rules in ``controllers/oracles/__init__.py``)."""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from gpugov.controllers.oracles.common import (
    SLO_TOLERANCE,
    FloatArray,
    _drive,
    holds_slo,
    maximum_clock_reference,
)
from gpugov.plant.closed_loop import simulate
from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import PerformanceProfile, Phase
from gpugov.plant.result import ServingMetrics, ServingResult
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.simulator import PlantSimulation
from gpugov.plant.types import Request, RequestRecord, Scheduler, ServingObservation


# ------------------------------------------------------------------ window oracle
class ScheduleController:
    """Replays a clock per window: ``clocks_mhz[k]`` during ``[k w, (k+1) w)``.

    After the schedule ends its last clock is held; a negative time uses the first.
    """

    def __init__(
        self, clocks_mhz: Sequence[float], window_s: float, name: str = "clock_schedule"
    ) -> None:
        if not clocks_mhz:
            raise ValueError("a clock schedule needs at least one window")
        if not math.isfinite(window_s) or window_s <= 0.0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.clocks_mhz = tuple(float(c) for c in clocks_mhz)
        self.window_s = float(window_s)
        self.__name__ = name

    def __call__(self, observation: ServingObservation) -> float:
        index = int(math.floor((observation.time_s + 1e-9) / self.window_s))
        return self.clocks_mhz[min(max(index, 0), len(self.clocks_mhz) - 1)]


class TimedRun(Protocol):
    """What :class:`_MissCounter` reads of a run: its time and its requests' times
    (:meth:`PlantSimulation.request_times`, or the disaggregated plant's)."""

    time_s: float

    def request_times(self) -> tuple[Sequence[float | None], Sequence[float | None]]: ...


class MeteredRun(Protocol):
    """A finished run as :func:`_select_schedule` judges it: its metrics."""

    @property
    def metrics(self) -> ServingMetrics: ...


def _miss_known_time(record: RequestRecord, ttft_slo_s: float, tpot_slo_s: float) -> float:
    """When a request's SLO miss becomes known (``math.inf`` for a request that meets it).

    A miss is known at ``t`` when ``t`` exceeds the returned time (see the module notes).
    """
    arrival = record.arrival_time_s
    first = record.first_token_time_s
    if first is None or first - arrival > ttft_slo_s + 1e-12:
        return arrival + ttft_slo_s
    output = record.output_tokens
    if output <= 1:
        return math.inf if record.finish_time_s is not None else arrival + ttft_slo_s
    deadline = first + tpot_slo_s * (output - 1)
    finish = record.finish_time_s
    if finish is None or (finish - first) / (output - 1) > tpot_slo_s + 1e-12:
        return deadline
    return math.inf


@dataclass
class _MissCounter:
    """Known SLO misses of a (forked) run, counted incrementally from a settled prefix."""

    arrivals: list[float]
    outputs: list[int]
    ttft_slo_s: float
    tpot_slo_s: float
    settled_upto: int = 0
    settled_misses: int = 0
    ttft_slos: list[float] | None = None  # per request (prompt-length SLO); None: ttft_slo_s

    def _status(
        self, index: int, now: float, first: Sequence[float | None], finish: Sequence[float | None]
    ) -> int:
        """1 for a known miss, 0 for a final success, -1 while open."""
        arrival = self.arrivals[index]
        first_token = first[index]
        ttft_slo = self.ttft_slo_s if self.ttft_slos is None else self.ttft_slos[index]
        if first_token is None:
            return 1 if now > arrival + ttft_slo + 1e-12 else -1
        if first_token - arrival > ttft_slo + 1e-12:
            return 1
        output = self.outputs[index]
        done = finish[index]
        if output <= 1:
            return 0 if done is not None else -1
        if done is not None:
            return 1 if (done - first_token) / (output - 1) > self.tpot_slo_s + 1e-12 else 0
        return 1 if now - first_token > self.tpot_slo_s * (output - 1) + 1e-12 else -1

    def settle(self, simulation: TimedRun) -> None:
        """Advance the settled prefix on the main run (its outcomes are final)."""
        first, finish = simulation.request_times()
        now = simulation.time_s
        arrived = bisect.bisect_right(self.arrivals, now + 1e-12)
        while self.settled_upto < arrived:
            status = self._status(self.settled_upto, now, first, finish)
            if status < 0:
                break
            self.settled_misses += status
            self.settled_upto += 1

    def known_misses(self, simulation: TimedRun) -> tuple[int, int]:
        """(known misses, arrived requests) of ``simulation`` at its current time."""
        first, finish = simulation.request_times()
        now = simulation.time_s
        arrived = bisect.bisect_right(self.arrivals, now + 1e-12)
        misses = self.settled_misses
        for index in range(self.settled_upto, arrived):
            if self._status(index, now, first, finish) == 1:
                misses += 1
        return misses, arrived


def known_miss_times(
    records: Sequence[RequestRecord],
    ttft_profile: PerformanceProfile,
    tpot_profile: PerformanceProfile,
) -> FloatArray:
    """Sorted times at which the reference run's misses become known (step 3's
    allowance), TTFT judged on ``ttft_profile``'s SLO and TPOT on ``tpot_profile``'s."""
    return np.sort(
        np.array(
            [
                _miss_known_time(
                    r, ttft_profile.ttft_slo_for(r.prompt_tokens), tpot_profile.tpot_slo_s
                )
                for r in records
            ],
            dtype=float,
        )
    )


def miss_counter_for(
    requests: Sequence[Request], ttft_profile: PerformanceProfile, tpot_profile: PerformanceProfile
) -> _MissCounter:
    """The known-miss counter of a search over ``requests``, with the SLOs as in
    :func:`known_miss_times`."""
    return _MissCounter(
        arrivals=[r.arrival_time_s for r in requests],
        outputs=[int(r.output_tokens) for r in requests],
        ttft_slo_s=ttft_profile.ttft_slo_s,
        tpot_slo_s=tpot_profile.tpot_slo_s,
        ttft_slos=[ttft_profile.ttft_slo_for(r.prompt_tokens) for r in requests],
    )


def cumulative_outputs(requests: Sequence[Request]) -> list[float]:
    """Output tokens of the first ``n`` requests, for ``n`` from 0 (the terminal value's
    work still to generate)."""
    return [0.0, *np.cumsum([r.output_tokens for r in requests]).tolist()]


def joules_per_token(profile: PerformanceProfile, phase: Phase, clock_mhz: float) -> float:
    """A token of ``phase`` at ``clock_mhz`` (realised), in joules, by the profile."""
    return float(profile.power(phase, clock_mhz) / profile.rate(phase, clock_mhz))


@dataclass(frozen=True)
class WindowOracle:
    """Result of :func:`window_oracle`.

    ``schedule_mhz[k]`` is the clock of window ``k``; ``result`` is the schedule's
    replay with :func:`plant.simulate`. ``attempts`` records every schedule tried
    (margin, energy, attainment, whether it held); ``source`` says which one was kept.
    """

    schedule_mhz: tuple[float, ...]
    window_s: float
    lookahead_s: float
    continuation_clock_mhz: float
    result: ServingResult
    holds_slo: bool
    source: str
    attempts: tuple[dict[str, Any], ...]
    candidate_runs: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (the run's metrics are not repeated)."""
        return {
            "window_s": self.window_s,
            "lookahead_s": self.lookahead_s,
            "continuation_clock_mhz": self.continuation_clock_mhz,
            "windows": len(self.schedule_mhz),
            "schedule_mhz": list(self.schedule_mhz),
            "holds_slo": self.holds_slo,
            "source": self.source,
            "attempts": list(self.attempts),
            "candidate_runs": self.candidate_runs,
            "energy_j": self.result.metrics.energy_j,
            "slo_attainment": self.result.metrics.slo_attainment,
        }


@dataclass
class _SearchSettings:
    window_steps: int
    lookahead_steps: int
    control_period_s: float
    horizon_s: float
    continuation_index: int
    coarse: tuple[int, ...]
    neighbour_steps: tuple[int, ...]
    levels: int
    reference_miss_times: FloatArray
    cumulative_output_tokens: list[float]
    terminal_prefill_j_per_token: float
    terminal_output_j_per_token: float
    counter_template: _MissCounter = field(repr=False)


def candidate_levels(
    coarse: Sequence[int],
    previous: int,
    continuation: int,
    neighbour_steps: Sequence[int],
    levels: int,
) -> list[int]:
    """Step 1's candidates, as clock indices in ascending order: the ``coarse`` levels,
    the ``previous`` window's and its neighbours ``+-s`` for ``s`` in ``neighbour_steps``,
    and the ``continuation``, within ``[0, levels)``."""
    candidates = set(coarse)
    candidates.add(previous)
    candidates.add(continuation)
    for offset in neighbour_steps:
        candidates.update((previous - offset, previous + offset))
    return sorted(c for c in candidates if 0 <= c < levels)


def coarse_levels_of(levels: int, coarse_levels: int) -> tuple[int, ...]:
    """``coarse_levels`` evenly spaced indices of ``levels`` supported clocks."""
    return tuple(int(i) for i in np.unique(np.linspace(0, levels - 1, coarse_levels).round()))


def candidate_key(
    misses: int,
    arrived: int,
    time_s: float,
    reference_miss_times: FloatArray,
    margin: float,
    score_j: float,
) -> tuple[int, float, float]:
    """Step 3's ranking of a candidate whose run reached ``time_s`` (lower is better):
    admissible first (known misses at most the maximum clock's known by then, sorted in
    ``reference_miss_times``, plus ``floor(margin * arrived)``), then the fewest known
    misses, then the lowest score."""
    reference = int(np.searchsorted(reference_miss_times, time_s - 1e-12, "left"))
    allowed = reference + int(math.floor(margin * arrived + 1e-9))
    excess = max(0, misses - allowed)
    return (excess, float(misses) if excess else 0.0, score_j)


def _terminal_energy(simulation: PlantSimulation, arrived: int, settings: _SearchSettings) -> float:
    """Work left in ``simulation`` valued at the continuation clock's joules per token."""
    observation = simulation.observe()
    left_output = max(
        0.0, settings.cumulative_output_tokens[arrived] - observation.output_tokens_total
    )
    return (
        observation.prefill_remaining_tokens * settings.terminal_prefill_j_per_token
        + left_output * settings.terminal_output_j_per_token
    )


def _greedy_schedule(
    requests: tuple[Request, ...],
    plant: ServingPlant,
    scheduler: Scheduler,
    seed: int,
    settings: _SearchSettings,
    margin: float,
) -> tuple[list[float], int]:
    """One greedy forward search (module notes, steps 1-4): (clocks per window, forks)."""
    clocks = plant.profile.clock_mhz
    main = PlantSimulation(requests, plant, scheduler, seed=seed)
    counter = copy.copy(settings.counter_template)
    period = settings.control_period_s
    schedule: list[float] = []
    previous = settings.continuation_index
    forks = 0
    window = 0
    while True:
        first_step = window * settings.window_steps
        start = first_step * period
        if start > settings.horizon_s + 1e-12:
            break
        main.advance_to(start, stop_when_done=True)
        if main.done and window > 0:
            break
        counter.settle(main)
        best: tuple[tuple[int, float, float], int] | None = None
        for index in candidate_levels(
            settings.coarse,
            previous,
            settings.continuation_index,
            settings.neighbour_steps,
            settings.levels,
        ):
            fork = main.fork()
            forks += 1
            end_step = first_step + settings.window_steps
            over = _drive(
                fork, float(clocks[index]), first_step, end_step, period, settings.horizon_s
            )
            if not over:
                look_end = end_step + settings.lookahead_steps
                over = _drive(
                    fork,
                    float(clocks[settings.continuation_index]),
                    end_step,
                    look_end,
                    period,
                    settings.horizon_s,
                )
                if not over:
                    fork.advance_to(min(look_end * period, settings.horizon_s), stop_when_done=True)
            misses, arrived = counter.known_misses(fork)
            energy = fork.energy_j - main.energy_j + _terminal_energy(fork, arrived, settings)
            key = candidate_key(
                misses, arrived, fork.time_s, settings.reference_miss_times, margin, energy
            )
            # Ties: the higher clock.
            if best is None or key < best[0] or (key == best[0] and index > best[1]):
                best = (key, index)
        assert best is not None
        chosen = best[1]
        schedule.append(float(clocks[chosen]))
        previous = chosen
        over = _drive(
            main,
            float(clocks[chosen]),
            first_step,
            first_step + settings.window_steps,
            period,
            settings.horizon_s,
        )
        window += 1
        if over:
            break
    return schedule, forks


def search_steps(
    window_s: float,
    lookahead_s: float,
    control_period_s: float,
    margins: Sequence[float] | None,
    tolerance: float,
    coarse_levels: int,
) -> tuple[int, tuple[float, ...]]:
    """A window oracle's checked settings: (control periods per window, the margins,
    default ``(tolerance / 2, 0)``).

    Raises:
        ValueError: a window that is not a whole number of control periods, a negative
            lookahead or margin, or fewer than two coarse levels.
    """
    if not math.isfinite(control_period_s) or control_period_s <= 0.0:
        raise ValueError(f"control_period_s must be positive, got {control_period_s!r}")
    window_steps = int(round(window_s / control_period_s))
    if window_steps < 1 or abs(window_steps * control_period_s - window_s) > 1e-9:
        raise ValueError(
            f"window_s ({window_s!r}) must be a positive whole number of control periods "
            f"({control_period_s!r} s)"
        )
    if not math.isfinite(lookahead_s) or lookahead_s < 0.0:
        raise ValueError(f"lookahead_s must be finite and >= 0, got {lookahead_s!r}")
    margin_values = (tolerance / 2.0, 0.0) if margins is None else tuple(margins)
    if not margin_values or any(not math.isfinite(m) or m < 0.0 for m in margin_values):
        raise ValueError(f"margins must be finite and >= 0, got {margins!r}")
    if coarse_levels < 2:
        raise ValueError(f"coarse_levels must be >= 2, got {coarse_levels}")
    return window_steps, margin_values


Step = TypeVar("Step")
Run = TypeVar("Run", bound=MeteredRun)


@dataclass(frozen=True)
class Selection(Generic[Step, Run]):
    """What :func:`select_schedule` kept: the schedule, its run, which attempt it was,
    every attempt (margin or fallback, energy, attainment, whether it held) and the
    searches' forks."""

    schedule: list[Step]
    result: Run
    source: str
    attempts: tuple[dict[str, Any], ...]
    forks: int


def select_schedule(
    margins: Sequence[float],
    search: Callable[[float], tuple[list[Step], int]],
    replay: Callable[[Sequence[Step]], Run],
    raise_to_continuation: Callable[[Step], Step],
    continuation: Step,
    continuation_result: Run | None,
    reference_attainment: float | None,
    tolerance: float,
    continuation_name: str = "clock",
) -> Selection[Step, Run]:
    """The replay-then-fallback rule shared by the window oracles (module notes): one
    greedy ``search`` per margin until its ``replay`` holds the SLO; otherwise the last
    schedule raised to the continuation in every window; the constant continuation
    schedule (``continuation_result`` when already run) replaces either when it holds
    with less energy, and is the last fallback."""
    attempts: list[dict[str, Any]] = []
    total_forks = 0
    last_schedule: list[Step] = [continuation]

    def record(source: str, schedule: Sequence[Step], result: Run) -> bool:
        held = holds_slo(result.metrics.slo_attainment, reference_attainment, tolerance)
        attempts.append(
            {
                "source": source,
                "energy_j": result.metrics.energy_j,
                "slo_attainment": result.metrics.slo_attainment,
                "holds_slo": held,
                "windows": len(schedule),
            }
        )
        return held

    chosen: tuple[list[Step], Run, str] | None = None
    for margin in margins:
        schedule, forks = search(margin)
        total_forks += forks
        last_schedule = schedule
        result = replay(schedule)
        source = f"greedy(margin={margin:g})"
        if record(source, schedule, result):
            chosen = (schedule, result, source)
            break
    if chosen is None:
        raised = [raise_to_continuation(step) for step in last_schedule]
        result = replay(raised)
        source = f"greedy raised to the continuation {continuation_name}"
        if record(source, raised, result):
            chosen = (raised, result, source)
    # The constant continuation schedule is a candidate too (and the last fallback).
    constant = [continuation] * max(1, len(last_schedule))
    constant_result = continuation_result if continuation_result is not None else replay(constant)
    source = f"constant continuation {continuation_name}"
    constant_holds = record(source, constant, constant_result)
    if constant_holds and (
        chosen is None or constant_result.metrics.energy_j < chosen[1].metrics.energy_j
    ):
        chosen = (constant, constant_result, source)
    if chosen is None:
        chosen = (constant, constant_result, source)
    schedule, result, source = chosen
    return Selection(schedule, result, source, tuple(attempts), total_forks)


def window_oracle(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    reference: ServingResult | None = None,
    continuation_clock_mhz: float | None = None,
    continuation_result: ServingResult | None = None,
    window_s: float = 5.0,
    lookahead_s: float = 15.0,
    coarse_levels: int = 8,
    neighbour_steps: Sequence[int] = (2, 6),
    margins: Sequence[float] | None = None,
    tolerance: float = SLO_TOLERANCE,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> WindowOracle:
    """A per-window clock schedule in hindsight by greedy forked search (module notes).

    Args:
        workload: the requests.
        plant: the plant to simulate.
        scheduler: the engine's batching rule.
        reference: the maximum-clock run (simulated here when ``None``).
        continuation_clock_mhz: clock of the lookahead and of the fallbacks; pass the
            best fixed clock (default: the maximum clock).
        continuation_result: the run at the continuation clock if already simulated
            (the best fixed clock's run); simulated here when needed otherwise.
        window_s: schedule window; a whole number of control periods.
        lookahead_s: seconds simulated at the continuation clock after each window.
        coarse_levels: evenly spaced supported clocks tried in every window.
        neighbour_steps: level offsets around the previous window's clock also tried.
        margins: extra known misses allowed, as a fraction of arrived requests, one
            greedy search per margin until the replay holds the SLO (default
            ``(tolerance / 2, 0)``).
        tolerance: the SLO condition's slack (fraction).
        seed: plant seed.
        control_period_s: control tick, as in :func:`plant.simulate`.

    Raises:
        ValueError: an empty workload, a window that is not a whole number of control
            periods, or a negative lookahead or margin.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("window_oracle needs at least one request")
    window_steps, margin_values = search_steps(
        window_s, lookahead_s, control_period_s, margins, tolerance, coarse_levels
    )
    profile = plant.profile
    levels = profile.clock_mhz.size
    if reference is None:
        reference = maximum_clock_reference(
            requests, plant, scheduler, seed=seed, control_period_s=control_period_s
        )
    reference_attainment = reference.metrics.slo_attainment
    continuation = (
        profile.maximum_clock_mhz
        if continuation_clock_mhz is None
        else profile.quantize_clock(continuation_clock_mhz)
    )
    continuation_index = profile.clock_index(continuation)
    realized = profile.realized_clock(continuation)
    miss_times = known_miss_times(reference.request_records, profile, profile)
    settings = _SearchSettings(
        window_steps=window_steps,
        lookahead_steps=int(math.ceil(lookahead_s / control_period_s - 1e-9)),
        control_period_s=float(control_period_s),
        horizon_s=plant.run_horizon_s(requests),
        continuation_index=continuation_index,
        coarse=coarse_levels_of(levels, coarse_levels),
        neighbour_steps=tuple(int(s) for s in neighbour_steps),
        levels=levels,
        reference_miss_times=miss_times,
        cumulative_output_tokens=cumulative_outputs(requests),
        terminal_prefill_j_per_token=joules_per_token(profile, "prefill", realized),
        terminal_output_j_per_token=joules_per_token(profile, "decode", realized),
        counter_template=miss_counter_for(requests, profile, profile),
    )

    def replay(schedule: Sequence[float]) -> ServingResult:
        return simulate(
            requests,
            plant,
            scheduler,
            ScheduleController(schedule, window_s, name="window_oracle"),
            seed,
            controller_name="window_oracle",
            control_period_s=control_period_s,
        )

    selection = select_schedule(
        margin_values,
        lambda margin: _greedy_schedule(requests, plant, scheduler, seed, settings, margin),
        replay,
        lambda clock: max(clock, continuation),
        continuation,
        continuation_result,
        reference_attainment,
        tolerance,
    )
    result = selection.result
    return WindowOracle(
        schedule_mhz=tuple(selection.schedule),
        window_s=float(window_s),
        lookahead_s=float(lookahead_s),
        continuation_clock_mhz=continuation,
        result=result,
        holds_slo=holds_slo(result.metrics.slo_attainment, reference_attainment, tolerance),
        source=selection.source,
        attempts=selection.attempts,
        candidate_runs=selection.forks,
    )
