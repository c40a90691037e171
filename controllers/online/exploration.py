"""Where ``mpc-online`` may put the clock while its model is still being learned.

:class:`SafeExploration` bounds how far below the explored clocks the clock may go, and
backs off to the maximum when a measured latency nears its SLO; :class:`ArrivalClumping`
measures how often arrivals come together (where an idle GPU should park high). The
policy and its worst case are in ``docs/online.md``: after the warm-up the clock may go
at most one bounded step (``step_fraction`` of the clock range) below the lowest clock
already explored, only while the measured TTFT and TPOT are below ``explore_slack`` of
their SLOs, and never where the model's relative uncertainty exceeds
``maximum_relative_std``; when a measured latency passes ``backoff`` of its SLO the clock
goes to the maximum at once and stays there for ``backoff_hold_s``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.adaptation import SLOFeedback
from gpugov.controllers.budget import loosened
from gpugov.controllers.online.identification import (
    REFERENCE_BATCH,
    REFERENCE_CONTEXT_TOKENS,
    OnlineModel,
)
from gpugov.plant.types import ServingObservation, replace_observation

FloatArray = NDArray[np.float64]


@dataclass
class SafeExploration:
    """Where the clock may go, from what has been explored and the measured SLO slack.

    Args:
        step_fraction: how far the floor moves below the explored frontier, as a
            fraction of the clock range.
        largest_step_fraction: the longest such step, taken when the measured latency
            is far under the exploration threshold: the floor goes down to ``frontier *
            pressure / threshold`` (latency grows at most like 1/f), but never more than
            this fraction of the range below the frontier.
        explore_slack: measured latency / SLO below which the floor may step down.
        backoff: measured latency / SLO above which the clock goes to the maximum.
        backoff_hold_s: how long a back-off holds the maximum clock.
        maximum_relative_std: the floor never goes where the model's latency standard
            deviation exceeds this fraction of its mean.
        minimum_visits: busy windows at a clock before it counts as explored.
        calm_windows: after a back-off the floor rises one step above the clock that
            caused it (each further back-off while it is raised doubles the rise), and
            comes down one step per ``calm_windows`` decisions whose measured latencies
            sat under the exploration threshold (an idle window is no evidence): so a
            workload whose bursts a clock cannot absorb stops meeting that clock.
        baseline_headroom: where the latency measured at the top clock is itself high
            (a GPU whose TPOT sits near the SLO at any clock), the thresholds move up to
            that baseline plus this much: ``explore`` below ``max(explore_slack,
            baseline + headroom)`` (and 0.05 under the back-off threshold), back off
            above ``min(0.95, max(backoff, baseline + headroom))``; otherwise the top
            clock's own noise would trigger them.
        looseness: the attainment budget's looseness
            (:class:`controllers.budget.AttainmentBudget`), set each decision: both
            thresholds are scaled by it, never past the SLO itself.
    """

    step_fraction: float = 0.08
    largest_step_fraction: float = 0.24
    explore_slack: float = 0.6
    backoff: float = 0.9
    backoff_hold_s: float = 2.0
    maximum_relative_std: float = 0.25
    minimum_visits: int = 5
    baseline_headroom: float = 0.08
    calm_windows: int = 5
    baseline: float | None = None
    backoff_until_s: float = -math.inf
    backoffs: int = 0
    floor_mhz: float | None = None
    exploring: bool = False
    raised_floor_mhz: float | None = None
    calm_count: int = 0
    raise_steps: int = 1
    looseness: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.step_fraction <= 1.0:
            raise ValueError(f"step_fraction must lie in (0, 1], got {self.step_fraction!r}")
        if not 0.0 < self.explore_slack < self.backoff:
            raise ValueError("SafeExploration needs 0 < explore_slack < backoff")

    @staticmethod
    def pressure(observation: ServingObservation) -> float | None:
        """The larger of measured TTFT / SLO and TPOT / SLO, or None when unmeasured."""
        ttft, tpot = SLOFeedback.latency_ratios(observation)
        if ttft is None:
            return tpot
        return ttft if tpot is None else max(ttft, tpot)

    def floor(self, model: OnlineModel, observation: ServingObservation, zscore: float) -> float:
        """The lowest clock allowed now (MHz, supported)."""
        clocks = model.clocks_mhz
        frontier = model.lowest_explored_mhz(self.minimum_visits)
        step = self.step_fraction * (clocks[-1] - clocks[0])
        pressure = self.pressure(observation)
        threshold = self.explore_threshold  # (nothing below changes it before the end)
        slack = pressure is None or pressure < threshold
        target = frontier - step if slack else frontier
        if slack and pressure is not None and pressure > 0.0:
            # Latency grows at most like 1/f: at f' = frontier * pressure / threshold the
            # measured pressure would just reach the exploration threshold. Far from it,
            # the floor may take a longer step (at most ``largest_step_fraction``).
            longest = self.largest_step_fraction * (clocks[-1] - clocks[0])
            physics = frontier * pressure / threshold
            target = min(target, max(physics, frontier - longest))
        if slack:
            # One step reaches at least the next supported clock (a narrow range's step
            # can be finer than the clock grid).
            lower = clocks[clocks < frontier - 1e-9]
            if lower.size:
                target = min(target, float(lower[-1]))
        # Never where the model is too unsure (relative std of the latency predictions):
        # the lowest candidate that is sure enough, all predicted in one vectorised pass.
        within = (clocks >= target - 1e-9) & (clocks <= frontier + 1e-9)
        candidates = clocks[within]
        allowed = frontier
        if candidates.size:
            # Read on every supported clock (the model caches that table between its
            # updates), then kept to the candidates.
            table = model.table(clocks, REFERENCE_BATCH, REFERENCE_CONTEXT_TOKENS)
            relative = np.maximum(
                _relative(*table["prefill_s_per_token"]), _relative(*table["decode_iteration_s"])
            )[within]
            sure = np.flatnonzero(zscore * relative <= self.maximum_relative_std * max(zscore, 1.0))
            if sure.size:
                allowed = float(candidates[sure[0]])
            below = candidates[candidates < frontier - 1e-9]
            if slack and below.size:
                # One bounded step below the frontier needs no model certainty: the
                # measured latency has slack, the step is bounded, and a clock never
                # visited never gets surer (a model unsure below the frontier would
                # otherwise hold the floor there for ever).
                within_step = below[below >= frontier - step - 1e-9]
                allowed = min(allowed, float(within_step[0] if within_step.size else below[-1]))
        self.exploring = allowed < frontier - 1e-9
        # Only a measured calm window (latency nearer the exploration threshold than the
        # back-off one) is evidence that the raised floor may come down.
        calm = pressure is not None and pressure < 0.5 * (threshold + self.backoff_threshold)
        allowed = self._after_backoffs(allowed, clocks, step, calm=calm)
        self.floor_mhz = allowed
        return allowed

    def _after_backoffs(
        self, allowed: float, clocks: FloatArray, step: float, *, calm: bool
    ) -> float:
        """``allowed`` raised to the floor left by recent back-offs, which comes down one
        step per ``calm_windows`` calm decisions."""
        if self.raised_floor_mhz is None:
            return allowed
        self.calm_count = self.calm_count + 1 if calm else 0
        if self.calm_count >= self.calm_windows:
            self.calm_count = 0
            self.raised_floor_mhz -= step
            if self.raised_floor_mhz <= allowed + 1e-9:  # no longer binding: dissolved
                self.raised_floor_mhz = None
                return allowed
        floor = self.backoff_floor(clocks)
        if floor > allowed:
            self.exploring = False
        return max(allowed, floor)

    def backoff_floor(self, clocks: FloatArray) -> float:
        """The floor recent back-offs left (the lowest clock when none): what still binds
        where the exploration's own floor does not (an idle GPU, a decode descent)."""
        if self.raised_floor_mhz is None:
            return float(clocks[0])
        raised = clocks[clocks >= self.raised_floor_mhz - 1e-9]
        return float(raised[0]) if raised.size else float(clocks[-1])

    @property
    def explore_threshold(self) -> float:
        """Measured latency / SLO below which the floor may step down."""
        slack = loosened(self.explore_slack, self.looseness)
        if self.baseline is None:
            return min(slack, self.backoff_threshold - 0.05)
        return min(
            self.backoff_threshold - 0.05,
            max(slack, self.baseline + self.baseline_headroom),
        )

    @property
    def backoff_threshold(self) -> float:
        """Measured latency / SLO above which the clock goes to the maximum."""
        if self.baseline is None:
            return loosened(self.backoff, self.looseness)
        raised = min(0.95, max(self.backoff, self.baseline + self.baseline_headroom))
        return loosened(raised, self.looseness)

    def observe_top(self, observation: ServingObservation, maximum_mhz: float) -> None:
        """Track the latency pressure measured while the top clock was requested."""
        pressure = self.pressure(observation)
        requested = observation.requested_clock_mhz
        if pressure is None or requested is None or requested < maximum_mhz - 1e-6:
            return
        if self.baseline is None:
            self.baseline = pressure
        else:
            self.baseline += 0.05 * (pressure - self.baseline)

    def backing_off(self, observation: ServingObservation, maximum_mhz: float) -> bool:
        """Whether to hold the maximum clock now: a hold starts when the latency measured
        while the clock was below the maximum passes the threshold (at the maximum clock
        a high latency is not the clock's doing, and holding longer would not help)."""
        pressure = self.pressure(observation)
        requested = observation.requested_clock_mhz
        lowered = requested is None or requested < maximum_mhz - 1e-6
        if pressure is not None and pressure > self.backoff_threshold and lowered:
            if observation.time_s >= self.backoff_until_s:
                self.backoffs += 1
                # Latency grows at most like 1/f: if even the top clock could not have
                # brought it under the threshold, the lowered clock is not the cause and
                # does not raise the floor (the hold still gives the fastest clock).
                share = (requested or 0.0) / maximum_mhz
                if pressure * share <= self.backoff_threshold:
                    self._raise_floor(observation, maximum_mhz)
            self.backoff_until_s = observation.time_s + self.backoff_hold_s
        return observation.time_s < self.backoff_until_s

    def _raise_floor(self, observation: ServingObservation, maximum_mhz: float) -> None:
        """After a back-off, keep the clock above the clock that caused it."""
        clocks = observation.supported_clocks_mhz
        if len(clocks) < 2 or observation.requested_clock_mhz is None:
            return
        step = self.step_fraction * (float(clocks[-1]) - float(clocks[0]))
        # One step on a first back-off; each further one while the floor is still raised
        # doubles the rise (a workload whose bursts keep reaching the SLO climbs fast).
        self.raise_steps = 1 if self.raised_floor_mhz is None else 2 * self.raise_steps
        clock = float(observation.requested_clock_mhz)
        raised = min(maximum_mhz, clock + self.raise_steps * step)
        self.raised_floor_mhz = max(self.raised_floor_mhz or -math.inf, raised)
        self.calm_count = 0


@dataclass
class ArrivalClumping:
    """How often arrivals come with company: the share of decision periods with any
    arrival that had two or more (counts decayed over ``memory_windows`` such periods).

    A lone prompt at an idle GPU has nobody decoding beside its prefill; prompts arriving
    together decode beside each other's prefill chunks, at whatever clock the GPU was
    parked at until the next decision. ``clumped`` says whether that risk is common.
    """

    memory_windows: float = 120.0
    threshold: float = 0.1
    minimum_windows: float = 5.0
    windows: float = 0.0
    clumped_windows: float = 0.0
    last_arrived: int | None = None

    def update(self, observation: ServingObservation) -> None:
        """Fold the arrivals since the previous observation in (a counter that went
        backwards, an engine restart, starts the count again)."""
        arrived = observation.arrived_requests
        previous, self.last_arrived = self.last_arrived, arrived
        if previous is None or arrived <= previous:
            return
        keep = 1.0 - 1.0 / self.memory_windows
        self.windows = keep * self.windows + 1.0
        self.clumped_windows = keep * self.clumped_windows + float(arrived - previous >= 2)

    @property
    def share(self) -> float | None:
        """The decayed share of arrival periods with two or more arrivals (None before
        ``minimum_windows`` such periods)."""
        if self.windows < self.minimum_windows:
            return None
        return self.clumped_windows / self.windows

    @property
    def clumped(self) -> bool:
        """Whether clumped arrivals are common (not assumed before there is evidence:
        the warm-up holds the maximum clock meanwhile)."""
        share = self.share
        return share is not None and share >= self.threshold


@dataclass
class LatencyWindow:
    """The engine's windowed TTFT and TPOT over at least ``span_s``, whatever the period.

    Every latency-driven rule (the back-off, the exploration slack, the decode descent's
    bound, the MPC's SLO feedback) compares one window's mean latency with a threshold.
    A shorter control period makes each window's mean rest on fewer requests, so its
    noise alone crosses the thresholds more often: at 0.25 s, one slow first token
    decides a window. :meth:`view` gives those rules the mean latency-to-SLO ratio over
    the windows of the last ``span_s`` (each window equally weighted; a window without a
    measurement is left out), scaled back on the current window's SLO. At a period of
    ``span_s`` or longer it is the observation itself. The queue and backlog signals
    stay per tick: the burst guard still reacts at the next decision.
    """

    span_s: float = 0.5
    _history: deque[tuple[float, float | None, float | None]] = field(
        default_factory=deque, repr=False
    )

    def __post_init__(self) -> None:
        if not math.isfinite(self.span_s) or self.span_s < 0.0:
            raise ValueError(f"LatencyWindow.span_s must be >= 0, got {self.span_s!r}")

    def view(self, observation: ServingObservation) -> ServingObservation:
        """``observation`` with its windowed latencies averaged over ``span_s``."""
        history = self._history
        now = observation.time_s
        if history and now < history[-1][0]:
            history.clear()  # time went backwards: another run
        ttft, tpot = SLOFeedback.latency_ratios(observation)
        history.append((now, ttft, tpot))
        while history and history[0][0] <= now - self.span_s + 1e-9:
            history.popleft()
        if len(history) <= 1:
            return observation
        ttfts = [entry[1] for entry in history if entry[1] is not None]
        tpots = [entry[2] for entry in history if entry[2] is not None]
        ttft_slo, tpot_slo = observation.ttft_slo_s, observation.tpot_slo_s
        changes: dict[str, Any] = {}
        if ttfts and ttft_slo is not None and ttft_slo > 0.0:
            changes["ttft_recent_s"] = math.fsum(ttfts) / len(ttfts) * ttft_slo
        if tpots and tpot_slo is not None and tpot_slo > 0.0:
            changes["tpot_recent_s"] = math.fsum(tpots) / len(tpots) * tpot_slo
        return replace_observation(observation, changes) if changes else observation


@dataclass
class BacklogAge:
    """How long the oldest request still waiting for its first token has waited, from
    the observation's request counts: the requests that had arrived by each tick and,
    first in first out (prompts are prefilled in arrival order), the tick by which the
    oldest one still waiting (``arrived_requests - waiting_requests`` have left the
    queue, a prompt in its prefill counted as waiting) had arrived.

    The burst guard drains a backlog within the TTFT target *less* this age: a prompt
    that arrived in a window at a lowered clock has already waited part of its SLO, and
    at every later tick the deadline stays where it was instead of sliding by a period.
    The request arrived between that tick and the one before it: the age counts from the
    middle (half a period for a backlog the tick sees for the first time). Counted in
    requests, not prompt tokens: a node's token backlog is an estimate (no engine
    publishes a prompt's length before its first token), so tokens would misplace the
    oldest one; its request counts are exact.
    """

    maximum_ticks: int = 4096
    age_s: float = 0.0
    _ticks: deque[tuple[float, float]] = field(default_factory=deque, repr=False)
    _rises: deque[tuple[float, float, float]] = field(default_factory=deque, repr=False)
    """The kept ticks after the first at which the arrivals rose, as ``(time, arrived,
    the tick before's time)``: :meth:`arrival_groups` reads these, not every tick (a
    queue stuck for minutes keeps thousands)."""
    _earlier_s: float | None = None
    _now_s: float = 0.0
    _waiting: int = 0

    def update(self, observation: ServingObservation) -> float:
        """Fold one tick in; return the age of the oldest waiting request (0 when
        nothing waits)."""
        arrived = float(observation.arrived_requests)
        waiting = max(0, observation.waiting_requests)
        left = arrived - waiting
        now = observation.time_s
        ticks, rises = self._ticks, self._rises
        if ticks and (now < ticks[-1][0] or arrived < ticks[-1][1]):
            ticks.clear()  # the arrivals went backwards (an engine restart) or another run
            rises.clear()
            self._earlier_s = None
        if ticks and arrived > ticks[-1][1]:
            rises.append((now, arrived, ticks[-1][0]))
        ticks.append((now, arrived))
        self._now_s, self._waiting = now, int(waiting)
        # Every request that had arrived by the first kept tick has left the queue: drop it.
        while len(ticks) > 1 and (ticks[0][1] <= left or len(ticks) > self.maximum_ticks):
            self._earlier_s = ticks.popleft()[0]
        while rises and rises[0][0] <= ticks[0][0]:
            rises.popleft()  # the first kept tick is the first group's, whatever its count
        if waiting <= 0 and observation.prefill_remaining_tokens <= 0.0:
            self.age_s = 0.0
            return self.age_s
        head_s = ticks[0][0]
        since_s = head_s if self._earlier_s is None else 0.5 * (self._earlier_s + head_s)
        self.age_s = max(0.0, now - since_s)
        return self.age_s

    def arrival_groups(self) -> list[tuple[int, float]]:
        """The requests still waiting at the last update, grouped by the period they
        arrived in, oldest first: ``(k, age_s)`` with ``k`` the waiting requests up to and
        including that group and ``age_s`` theirs (from the middle of the period, as
        :attr:`age_s` is for the oldest, which the first group carries); empty when
        nothing waits."""
        ticks = self._ticks
        waiting = self._waiting
        if waiting <= 0 or not ticks:
            return []
        left = ticks[-1][1] - waiting
        groups: list[tuple[int, float]] = []
        count = int(ticks[0][1] - left)
        if count > 0:
            groups.append((count, self.age_s))
        # A later group begins only where the arrivals rose (:attr:`_rises`), from the
        # middle of the period before that tick.
        for time_s, arrived, earlier in self._rises:
            count = int(arrived - left)
            if count > 0 and (not groups or count > groups[-1][0]):
                groups.append((count, max(0.0, self._now_s - 0.5 * (earlier + time_s))))
        return groups

    def ages_s(self) -> list[float]:
        """The age of every request still waiting at the last update, oldest first."""
        ages: list[float] = []
        done = 0
        for count, age in self.arrival_groups():
            ages.extend([age] * (count - done))
            done = count
        return ages


def _relative(mean: FloatArray, std: FloatArray) -> FloatArray:
    """Standard deviation over the magnitude of the mean, elementwise."""
    return std / np.maximum(np.abs(mean), 1e-12)
