"""Hindsight oracles: the limits a clock controller can reach on a known workload.

Each oracle sees the whole future (every arrival and every output length) and works on
the detailed plant (:class:`plant.PlantSimulation`), so it is a reference for the
scoreboard (``study/scoreboard.py``), never a controller a node could run. All of them
share one SLO condition: a run *holds the SLO* when its SLO attainment is at least the
maximum clock's minus ``tolerance`` (1 percentage point by default), see
:func:`holds_slo`.

Best fixed clock in hindsight (:func:`best_fixed_clock`)
    The lowest-energy fixed clock whose run holds the SLO. Search over the supported
    clocks: (1) bisection for the lowest clock index that holds (SLO attainment is
    roughly monotone in the clock), (2) ``coarse_points`` evenly spaced clocks between
    that index and the maximum, (3) refinement around the lowest-energy holding clock
    with halving steps down to one supported level. Every candidate is verified by a
    full simulation; the result lists every clock evaluated. Energy and attainment are
    only roughly monotone, so the search is exact only when they are.

Window schedule in hindsight (:func:`window_oracle`)
    A clock per window of ``window_s`` seconds, found by a greedy forward search that
    forks the simulator at each window boundary. The exact rule, for window ``k``
    starting at ``t_k``:

    1. candidates: ``coarse_levels`` evenly spaced supported clocks, the previous
       window's clock and its neighbours ``+-s`` levels for ``s`` in
       ``neighbour_steps``, and the continuation clock ``c_cont`` (the best fixed clock
       when given, else the maximum);
    2. for each candidate ``c``: fork the plant at ``t_k``, run the window at ``c`` and
       a lookahead of ``lookahead_s`` at ``c_cont``, both with the same per-period
       control ticks as :func:`plant.simulate`; its *score* is the energy used from
       ``t_k`` plus the work left at the end ``t_e`` valued at ``c_cont``'s energy per
       token (queued prompt tokens at its prefill joules per token, output tokens still
       to generate at its decode joules per token at the reference batch), so that
       deferring work is not free; also record the number of requests whose SLO is
       *known* to be missed at ``t_e``
       (TTFT: no first token by ``arrival + TTFT SLO``, or a late one; TPOT: finished
       with a mean TPOT above the SLO, or unfinished with
       ``t_e - first_token > TPOT SLO * (output_tokens - 1)``);
    3. a candidate is *admissible* when its known misses are at most the maximum-clock
       run's known misses at ``t_e`` (same rule) plus ``floor(margin * arrived(t_e))``;
       the admissible candidate with the lowest score wins (ties: the higher clock);
       when none is admissible, the one with the fewest known misses (then lowest
       score) wins;
    4. the plant advances through the window at the winner, and the search moves on
       until every request has finished or the horizon (last arrival plus the plant's
       drain timeout) is reached.

    The schedule is then replayed from scratch with :func:`plant.simulate` and the SLO
    condition is checked on the full run. If it fails the search is repeated with the
    next, smaller margin (``margins``, default half the tolerance, then zero); if every
    margin fails, the schedule raised to at least ``c_cont`` in every window is tried,
    and finally ``c_cont`` itself (which holds by construction when it is the best
    fixed clock). The constant ``c_cont`` schedule is itself a per-window schedule, so
    when it holds the SLO with less energy than the greedy one it is returned instead.
    The result is a heuristic: an *achievable* schedule, so an upper bound on the energy
    of the true optimal per-window schedule, not the optimum itself.

Fluid LP lower bound (:func:`fluid_energy_lower_bound`)
    A bound, not a controller: the minimum energy of any run that serves all the work
    of the trace (every prompt token once, ``output_tokens - 1`` decode tokens per
    request) on this plant, from an LP over windows of ``window_s`` seconds up to the
    last arrival and a free tail after it. Per supported clock (its realised clock, as
    the plant uses) a prefill token costs ``tau = 1 / prefill_rate`` seconds and
    ``tau * prefill_power`` joules; a decode token costs at least
    ``tau_d = min_B t_dec(B, C_min(B)) / B`` seconds and
    ``min_B t_dec(B, C_min(B)) * p_dec(B) / B`` joules over batch sizes
    ``1 <= B <= max_batch_size``, with the plant's decode latency and batch-power models
    and the smallest possible context ``C_min(B) = B * min prompt tokens``. Before the
    last arrival ``A`` the GPU draws at least the lowest idle power ``P_idle_min`` at
    every instant, so the energy up to ``A`` is at least ``P_idle_min * A`` plus, per
    token served before ``A``, its marginal cost ``energy - P_idle_min * tau``; work
    left at ``A`` costs its full (lowest) energy per token with no time limit. The LP
    (HiGHS) chooses, per window, how many tokens of each phase to serve at each clock,
    subject to the window's length (busy time ``<=`` window) and causality (cumulative
    service ``<=`` cumulative arrivals up to the window's end; backlog variables keep the
    constraints sparse). Only the lower-left convex hull of each phase's
    ``(seconds, marginal joules)`` points is kept, which leaves the optimum unchanged.

    Every run of the noise-free plant that finishes all requests maps onto a feasible LP
    point with no more energy, so the LP optimum is a lower bound. It ignores: latency
    SLOs and queueing (work may wait arbitrarily), the prefill-before-decode order within
    a request and admission limits (a request's decode work is available at its
    arrival), batch formation (every decode token gets the best batch size), context
    growth, KV-cache limits and preemption recompute, the actuation delay, the power cap
    and thermal limits, idle energy after the last arrival, and arrivals within a window
    being served from the window's start. With ``latency_noise_cv > 0`` it bounds the
    noise-free plant only.

:func:`oracle_capture` turns the energies into the scoreboard's capture ratio.
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.optimize import linprog

from gpugov.controllers.baseline import FixedClockController
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.simulator import PlantSimulation, simulate
from gpugov.plant.types import Request, RequestRecord, Scheduler, ServingObservation

FloatArray = NDArray[np.float64]

SLO_TOLERANCE = 0.01
"""SLO attainment may be at most this far (a fraction: 1 percentage point) below the
maximum clock's for a run to hold the SLO."""

_EPS = 1e-9


# ------------------------------------------------------------------ SLO and capture
def holds_slo(
    attainment: float | None,
    reference_attainment: float | None,
    tolerance: float = SLO_TOLERANCE,
) -> bool:
    """True when ``attainment`` is within ``tolerance`` below ``reference_attainment``.

    ``None`` (no request arrived) holds only against a ``None`` reference.

    Raises:
        ValueError: ``tolerance`` negative or not finite.
    """
    if not math.isfinite(tolerance) or tolerance < 0.0:
        raise ValueError(f"tolerance must be finite and >= 0, got {tolerance!r}")
    if reference_attainment is None:
        return attainment is None
    if attainment is None:
        return False
    return attainment >= reference_attainment - tolerance - 1e-12


def oracle_capture(
    energy_max_j: float,
    energy_j: float,
    energy_oracle_j: float,
    *,
    holds: bool,
) -> float | None:
    """Share of the oracle's saving a controller captures.

    ``(E_max - E) / (E_max - E_oracle)``: 1 when the controller matches the oracle, 0 at
    the maximum clock's energy, above 1 when it beats the (heuristic) oracle and
    negative when it uses more than the maximum clock.

    Returns:
        The ratio, or ``None`` when the controller does not hold the SLO or the oracle
        saves nothing (``E_max - E_oracle`` at most a millionth of ``E_max``).
    """
    if not holds:
        return None
    for name, value in (
        ("energy_max_j", energy_max_j),
        ("energy_j", energy_j),
        ("energy_oracle_j", energy_oracle_j),
    ):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    gap = energy_max_j - energy_oracle_j
    if gap <= 1e-6 * max(abs(energy_max_j), 1e-12):
        return None
    return (energy_max_j - energy_j) / gap


# -------------------------------------------------------------------- simulation
def _drive(
    simulation: PlantSimulation,
    clock_mhz: float,
    first_step: int,
    end_step: int,
    control_period_s: float,
    horizon_s: float,
) -> bool:
    """Run control steps ``[first_step, end_step)`` requesting ``clock_mhz``, exactly as
    :func:`plant.simulate` does (advance to the tick, stop when done, observe, request).

    Returns:
        True when the run is over (everything finished or past the horizon).
    """
    for step in range(first_step, end_step):
        tick = step * control_period_s
        if tick > horizon_s + 1e-12:
            simulation.advance_to(horizon_s, stop_when_done=True)
            return True
        simulation.advance_to(tick, stop_when_done=True)
        if simulation.done and step > 0:
            return True
        simulation.observe()
        simulation.request_clock(clock_mhz)
    return False


def _run_fixed(
    requests: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler,
    clock_mhz: float,
    seed: int,
    control_period_s: float,
) -> ServingResult:
    return simulate(
        requests,
        plant,
        scheduler,
        FixedClockController(float(clock_mhz)),
        seed,
        controller_name=f"fixed_{clock_mhz:g}_mhz",
        control_period_s=control_period_s,
    )


def maximum_clock_reference(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> ServingResult:
    """The maximum-clock run every oracle's SLO condition is measured against."""
    return _run_fixed(
        tuple(workload), plant, scheduler, plant.profile.maximum_clock_mhz, seed, control_period_s
    )


# ---------------------------------------------------------------- best fixed clock
@dataclass(frozen=True, slots=True)
class ClockEvaluation:
    """One simulated fixed-clock run of the best-fixed search."""

    clock_mhz: float
    energy_j: float
    slo_attainment: float | None
    holds_slo: bool


@dataclass(frozen=True)
class BestFixedClock:
    """Result of :func:`best_fixed_clock`.

    ``evaluations`` lists every clock simulated, in the order evaluated;
    ``lowest_holding_clock_mhz`` is the bisection's answer (the lowest clock found to
    hold the SLO).
    """

    clock_mhz: float
    result: ServingResult
    evaluations: tuple[ClockEvaluation, ...]
    lowest_holding_clock_mhz: float
    reference_attainment: float | None
    tolerance: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (the run's metrics are not repeated)."""
        return {
            "clock_mhz": self.clock_mhz,
            "energy_j": self.result.metrics.energy_j,
            "slo_attainment": self.result.metrics.slo_attainment,
            "lowest_holding_clock_mhz": self.lowest_holding_clock_mhz,
            "reference_attainment": self.reference_attainment,
            "tolerance": self.tolerance,
            "simulations": len(self.evaluations),
            "evaluations": [
                {
                    "clock_mhz": e.clock_mhz,
                    "energy_j": e.energy_j,
                    "slo_attainment": e.slo_attainment,
                    "holds_slo": e.holds_slo,
                }
                for e in self.evaluations
            ],
        }


def best_fixed_clock(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    reference: ServingResult | None = None,
    tolerance: float = SLO_TOLERANCE,
    coarse_points: int = 5,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> BestFixedClock:
    """The lowest-energy fixed clock whose run holds the SLO (see the module notes).

    Args:
        workload: the requests (the oracle reads their output lengths via the plant).
        plant: the plant to simulate.
        scheduler: the engine's batching rule.
        reference: the maximum-clock run (simulated here when ``None``); it is also the
            maximum clock's evaluation.
        tolerance: SLO attainment slack against the reference (fraction).
        coarse_points: evenly spaced clocks between the lowest holding clock and the
            maximum, before refinement.
        seed: plant seed (latency jitter), the same for every run.
        control_period_s: how often the fixed clock is requested.

    Raises:
        ValueError: an empty workload or ``coarse_points < 2``.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("best_fixed_clock needs at least one request")
    if coarse_points < 2:
        raise ValueError(f"coarse_points must be >= 2, got {coarse_points}")
    clocks = plant.profile.clock_mhz
    top = clocks.size - 1
    if reference is None:
        reference = maximum_clock_reference(
            requests, plant, scheduler, seed=seed, control_period_s=control_period_s
        )
    reference_attainment = reference.metrics.slo_attainment
    runs: dict[int, ServingResult] = {top: reference}
    order: list[int] = [top]

    def evaluate(index: int) -> ServingResult:
        if index not in runs:
            runs[index] = _run_fixed(
                requests, plant, scheduler, float(clocks[index]), seed, control_period_s
            )
            order.append(index)
        return runs[index]

    def holds(index: int) -> bool:
        attainment = evaluate(index).metrics.slo_attainment
        return holds_slo(attainment, reference_attainment, tolerance)

    def energy(index: int) -> float:
        return evaluate(index).metrics.energy_j

    # 1. Bisection for the lowest holding index (the top one holds by definition).
    if holds(0):
        lowest = 0
    else:
        failing, lowest = 0, top
        while lowest - failing > 1:
            middle = (failing + lowest) // 2
            if holds(middle):
                lowest = middle
            else:
                failing = middle
    # 2. Coarse grid over [lowest, top].
    grid = np.unique(np.linspace(lowest, top, coarse_points).round().astype(int))
    for index in grid:
        evaluate(int(index))

    def best_holding() -> int:
        holding = [i for i in runs if i >= lowest and holds(i)]
        return min(holding, key=lambda i: (energy(i), -i))

    # 3. Refinement with halving steps around the best holding clock.
    step = max(1, int(math.ceil((top - lowest) / max(1, grid.size - 1) / 2.0)))
    while True:
        center = best_holding()
        for neighbour in (center - step, center + step):
            if lowest <= neighbour <= top:
                evaluate(neighbour)
        if step == 1:
            # A last pass at step 1 until the best stops moving.
            if best_holding() == center:
                break
            continue
        step = max(1, step // 2)
    chosen = best_holding()
    evaluations = tuple(
        ClockEvaluation(
            clock_mhz=float(clocks[i]),
            energy_j=energy(i),
            slo_attainment=runs[i].metrics.slo_attainment,
            holds_slo=holds(i),
        )
        for i in order
    )
    return BestFixedClock(
        clock_mhz=float(clocks[chosen]),
        result=runs[chosen],
        evaluations=evaluations,
        lowest_holding_clock_mhz=float(clocks[lowest]),
        reference_attainment=reference_attainment,
        tolerance=tolerance,
    )


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
        self, index: int, now: float, first: list[float | None], finish: list[float | None]
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

    def settle(self, simulation: PlantSimulation) -> None:
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

    def known_misses(self, simulation: PlantSimulation) -> tuple[int, int]:
        """(known misses, arrived requests) of ``simulation`` at its current time."""
        first, finish = simulation.request_times()
        now = simulation.time_s
        arrived = bisect.bisect_right(self.arrivals, now + 1e-12)
        misses = self.settled_misses
        for index in range(self.settled_upto, arrived):
            if self._status(index, now, first, finish) == 1:
                misses += 1
        return misses, arrived


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
        candidates = set(settings.coarse)
        candidates.add(previous)
        candidates.add(settings.continuation_index)
        for offset in settings.neighbour_steps:
            candidates.update((previous - offset, previous + offset))
        best: tuple[tuple[int, float, float], int] | None = None
        for index in sorted(c for c in candidates if 0 <= c < settings.levels):
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
            reference = int(
                np.searchsorted(settings.reference_miss_times, fork.time_s - 1e-12, "left")
            )
            allowed = reference + int(math.floor(margin * arrived + 1e-9))
            excess = max(0, misses - allowed)
            # Admissible first (excess 0), then fewest misses, then energy, then the
            # higher clock.
            key = (excess, float(misses) if excess else 0.0, energy)
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
    miss_times = np.sort(
        np.array(
            [
                _miss_known_time(r, profile.ttft_slo_for(r.prompt_tokens), profile.tpot_slo_s)
                for r in reference.request_records
            ],
            dtype=float,
        )
    )
    settings = _SearchSettings(
        window_steps=window_steps,
        lookahead_steps=int(math.ceil(lookahead_s / control_period_s - 1e-9)),
        control_period_s=float(control_period_s),
        horizon_s=requests[-1].arrival_time_s + plant.drain_timeout_s,
        continuation_index=continuation_index,
        coarse=tuple(int(i) for i in np.unique(np.linspace(0, levels - 1, coarse_levels).round())),
        neighbour_steps=tuple(int(s) for s in neighbour_steps),
        levels=levels,
        reference_miss_times=miss_times,
        cumulative_output_tokens=[0.0, *np.cumsum([r.output_tokens for r in requests]).tolist()],
        terminal_prefill_j_per_token=profile.power("prefill", realized)
        / profile.rate("prefill", realized),
        terminal_output_j_per_token=profile.power("decode", realized)
        / profile.rate("decode", realized),
        counter_template=_MissCounter(
            arrivals=[r.arrival_time_s for r in requests],
            outputs=[int(r.output_tokens) for r in requests],
            ttft_slo_s=profile.ttft_slo_s,
            tpot_slo_s=profile.tpot_slo_s,
            ttft_slos=[profile.ttft_slo_for(r.prompt_tokens) for r in requests],
        ),
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

    attempts: list[dict[str, Any]] = []
    total_forks = 0
    last_schedule: list[float] = [continuation]

    def record(source: str, schedule: Sequence[float], result: ServingResult) -> bool:
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

    chosen: tuple[list[float], ServingResult, str] | None = None
    for margin in margin_values:
        schedule, forks = _greedy_schedule(requests, plant, scheduler, seed, settings, margin)
        total_forks += forks
        last_schedule = schedule
        result = replay(schedule)
        source = f"greedy(margin={margin:g})"
        if record(source, schedule, result):
            chosen = (schedule, result, source)
            break
    if chosen is None:
        raised = [max(c, continuation) for c in last_schedule]
        result = replay(raised)
        source = "greedy raised to the continuation clock"
        if record(source, raised, result):
            chosen = (raised, result, source)
    # The constant continuation schedule is a candidate too (and the last fallback).
    constant = [continuation] * max(1, len(last_schedule))
    constant_result = continuation_result if continuation_result is not None else replay(constant)
    source = "constant continuation clock"
    constant_holds = record(source, constant, constant_result)
    if constant_holds and (
        chosen is None or constant_result.metrics.energy_j < chosen[1].metrics.energy_j
    ):
        chosen = (constant, constant_result, source)
    if chosen is None:
        chosen = (constant, constant_result, source)
    schedule, result, source = chosen
    return WindowOracle(
        schedule_mhz=tuple(schedule),
        window_s=float(window_s),
        lookahead_s=float(lookahead_s),
        continuation_clock_mhz=continuation,
        result=result,
        holds_slo=holds_slo(result.metrics.slo_attainment, reference_attainment, tolerance),
        source=source,
        attempts=tuple(attempts),
        candidate_runs=total_forks,
    )


# ------------------------------------------------------------------ fluid LP bound
@dataclass(frozen=True)
class FluidEnergyBound:
    """Result of :func:`fluid_energy_lower_bound` (energies in joules)."""

    energy_j: float
    idle_floor_j: float
    window_s: float
    windows: int
    last_arrival_s: float
    prefill_tokens: float
    decode_tokens: float
    tail_prefill_tokens: float
    tail_decode_tokens: float
    prefill_hull_clocks_mhz: tuple[float, ...]
    decode_hull_clocks_mhz: tuple[float, ...]
    success: bool
    message: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "energy_j": self.energy_j,
            "idle_floor_j": self.idle_floor_j,
            "window_s": self.window_s,
            "windows": self.windows,
            "last_arrival_s": self.last_arrival_s,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "tail_prefill_tokens": self.tail_prefill_tokens,
            "tail_decode_tokens": self.tail_decode_tokens,
            "prefill_hull_clocks_mhz": list(self.prefill_hull_clocks_mhz),
            "decode_hull_clocks_mhz": list(self.decode_hull_clocks_mhz),
            "success": self.success,
            "message": self.message,
        }


def _lower_hull(seconds: FloatArray, cost: FloatArray) -> NDArray[np.int_]:
    """Indices of the lower-left convex hull of ``(seconds, cost)`` points.

    From the fastest point to the cheapest one; every other point is no better than a
    convex combination of hull points with no more seconds and no more cost.
    """
    order = sorted(range(seconds.size), key=lambda i: (seconds[i], cost[i]))
    hull: list[int] = []
    for i in order:
        if hull and cost[i] >= cost[hull[-1]] - 1e-15:
            continue  # slower and no cheaper than the last kept point
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (seconds[b] - seconds[a]) * (cost[i] - cost[a]) - (cost[b] - cost[a]) * (
                seconds[i] - seconds[a]
            )
            if cross <= 0.0:  # b lies on or above the segment a-i
                hull.pop()
            else:
                break
        hull.append(i)
    return np.asarray(hull, dtype=int)


def phase_token_costs(plant: ServingPlant, minimum_context_tokens: float) -> dict[str, FloatArray]:
    """Per supported clock: seconds and joules per prefill token, and the best case per
    decode token (module notes), at the clock the plant realises.

    Returns:
        ``clock_mhz``, ``prefill_s``, ``prefill_j``, ``decode_s``, ``decode_j`` (the
        fastest and the cheapest decode token over batch sizes, each its own minimum),
        ``decode_marginal_j`` (the lowest joules per decode token above the lowest idle
        power, ``min_B seconds * (p_dec(B) - P_idle_min)``) and ``idle_w``.
    """
    profile = plant.profile
    clocks = profile.clock_mhz.astype(float)
    realized = np.array([profile.realized_clock(c) for c in clocks])
    prefill_rate = np.array([profile.rate("prefill", c) for c in realized])
    decode_rate = np.array([profile.rate("decode", c) for c in realized])
    prefill_power = np.array([profile.power("prefill", c) for c in realized])
    decode_power = np.array([profile.power("decode", c) for c in realized])
    idle_power = np.array([profile.power("idle", c) for c in realized])
    model = profile.decode_latency_model
    b_ref = float(model.reference_batch_size)
    c_ref = b_ref * float(model.reference_context_tokens)
    batches = np.arange(1, plant.max_batch_size + 1, dtype=float)
    t_ref = b_ref / decode_rate
    iteration_s = t_ref[:, None] * (
        model.weight_fraction
        + model.batch_fraction * batches[None, :] / b_ref
        + model.kv_fraction * batches[None, :] * minimum_context_tokens / c_ref
    )
    power_model = profile.decode_power_batch_model
    factor = np.array(
        [1.0 if power_model is None else power_model.factor(b, b_ref) for b in batches]
    )
    iteration_w = idle_power[:, None] + (decode_power - idle_power)[:, None] * factor[None, :]
    per_token_s = iteration_s / batches[None, :]
    per_token_j = per_token_s * iteration_w
    idle_floor = float(np.min(idle_power))
    return {
        "clock_mhz": clocks,
        "prefill_s": 1.0 / prefill_rate,
        "prefill_j": prefill_power / prefill_rate,
        "decode_s": per_token_s.min(axis=1),
        "decode_j": per_token_j.min(axis=1),
        "decode_marginal_j": (per_token_s * (iteration_w - idle_floor)).min(axis=1),
        "idle_w": idle_power,
    }


def fluid_energy_lower_bound(
    workload: Sequence[Request],
    plant: ServingPlant,
    *,
    window_s: float = 1.0,
) -> FluidEnergyBound:
    """Lower bound on the energy of any run serving ``workload`` (module notes).

    Raises:
        ValueError: an empty workload or a non-positive window.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("fluid_energy_lower_bound needs at least one request")
    if not math.isfinite(window_s) or window_s <= 0.0:
        raise ValueError(f"window_s must be positive, got {window_s!r}")
    minimum_context = float(min(r.prompt_tokens for r in requests))
    costs = phase_token_costs(plant, minimum_context)
    idle_floor_w = float(np.min(costs["idle_w"]))
    prefill_s, prefill_j = costs["prefill_s"], costs["prefill_j"]
    decode_s, decode_j = costs["decode_s"], costs["decode_j"]
    prefill_marginal = prefill_j - idle_floor_w * prefill_s
    decode_marginal = costs["decode_marginal_j"]
    prefill_hull = _lower_hull(prefill_s, prefill_marginal)
    decode_hull = _lower_hull(decode_s, decode_marginal)
    tail_prefill_j = float(np.min(prefill_j))
    tail_decode_j = float(np.min(decode_j))

    arrivals = np.array([r.arrival_time_s for r in requests], dtype=float)
    prompt = np.array([r.prompt_tokens for r in requests], dtype=float)
    decode = np.array([r.output_tokens - 1 for r in requests], dtype=float)
    last_arrival = float(arrivals.max())
    total_prefill, total_decode = float(prompt.sum()), float(decode.sum())
    windows = int(math.ceil(last_arrival / window_s - 1e-12)) if last_arrival > 0.0 else 0
    clocks = costs["clock_mhz"]
    hull_clocks = (
        tuple(float(clocks[i]) for i in prefill_hull),
        tuple(float(clocks[i]) for i in decode_hull),
    )
    if windows == 0:
        energy = tail_prefill_j * total_prefill + tail_decode_j * total_decode
        return FluidEnergyBound(
            energy,
            0.0,
            float(window_s),
            0,
            last_arrival,
            total_prefill,
            total_decode,
            total_prefill,
            total_decode,
            *hull_clocks,
            True,
            "no window before the last arrival",
        )
    lengths = np.full(windows, float(window_s))
    lengths[-1] = last_arrival - window_s * (windows - 1)
    index = np.minimum((arrivals / window_s).astype(int), windows - 1)
    prefill_in = np.bincount(index, weights=prompt, minlength=windows)
    decode_in = np.bincount(index, weights=decode, minlength=windows)

    # Variable layout per window k: [x_k (prefill per hull clock), y_k (decode per hull
    # clock), q_k (prefill backlog at the window's end), r_k (decode backlog)].
    hp, hd = prefill_hull.size, decode_hull.size
    width = hp + hd + 2
    count = windows * width
    cost = np.zeros(count)
    base = np.arange(windows) * width
    for j, level in enumerate(prefill_hull):
        cost[base + j] = prefill_marginal[level]
    for j, level in enumerate(decode_hull):
        cost[base + hp + j] = decode_marginal[level]
    cost[base[-1] + hp + hd] = tail_prefill_j
    cost[base[-1] + hp + hd + 1] = tail_decode_j

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []

    def put(row: int, col: int, value: float) -> None:
        rows.append(row)
        cols.append(col)
        vals.append(value)

    # Equalities: backlog_k - backlog_{k-1} + served_k = arrived_k, per phase.
    for k in range(windows):
        b = k * width
        for j in range(hp):
            put(2 * k, b + j, 1.0)
        put(2 * k, b + hp + hd, 1.0)
        for j in range(hd):
            put(2 * k + 1, b + hp + j, 1.0)
        put(2 * k + 1, b + hp + hd + 1, 1.0)
        if k > 0:
            put(2 * k, b - width + hp + hd, -1.0)
            put(2 * k + 1, b - width + hp + hd + 1, -1.0)
    equality = sparse.csr_matrix((vals, (rows, cols)), shape=(2 * windows, count))
    equality_rhs = np.column_stack([prefill_in, decode_in]).reshape(-1)
    rows, cols, vals = [], [], []
    # Inequalities: busy seconds of window k <= its length.
    for k in range(windows):
        b = k * width
        for j, level in enumerate(prefill_hull):
            put(k, b + j, float(prefill_s[level]))
        for j, level in enumerate(decode_hull):
            put(k, b + hp + j, float(decode_s[level]))
    inequality = sparse.csr_matrix((vals, (rows, cols)), shape=(windows, count))
    solution = linprog(
        cost,
        A_ub=inequality,
        b_ub=lengths,
        A_eq=equality,
        b_eq=equality_rhs,
        bounds=(0.0, None),
        method="highs",
    )
    idle_floor_j = idle_floor_w * last_arrival
    if not solution.success:
        # Never infeasible (the tail absorbs any work); report rather than raise.
        return FluidEnergyBound(
            float("nan"),
            idle_floor_j,
            float(window_s),
            windows,
            last_arrival,
            total_prefill,
            total_decode,
            float("nan"),
            float("nan"),
            *hull_clocks,
            False,
            str(solution.message),
        )
    x = np.asarray(solution.x)
    return FluidEnergyBound(
        energy_j=float(solution.fun) + idle_floor_j,
        idle_floor_j=idle_floor_j,
        window_s=float(window_s),
        windows=windows,
        last_arrival_s=last_arrival,
        prefill_tokens=total_prefill,
        decode_tokens=total_decode,
        tail_prefill_tokens=float(x[base[-1] + hp + hd]),
        tail_decode_tokens=float(x[base[-1] + hp + hd + 1]),
        prefill_hull_clocks_mhz=hull_clocks[0],
        decode_hull_clocks_mhz=hull_clocks[1],
        success=True,
        message=str(solution.message),
    )


__all__ = [
    "SLO_TOLERANCE",
    "BestFixedClock",
    "ClockEvaluation",
    "FluidEnergyBound",
    "ScheduleController",
    "WindowOracle",
    "best_fixed_clock",
    "fluid_energy_lower_bound",
    "holds_slo",
    "maximum_clock_reference",
    "oracle_capture",
    "phase_token_costs",
    "window_oracle",
]
