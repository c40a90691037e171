"""The safety chain every controller runs in, on a node and in every study.

``MinimumDwell(FloorClock(ThermalGuard(ClampToSupported(controller, clocks)), floor),
dwell)``: the decision is quantised onto the supported clocks, capped near a stated
thermal limit, kept at or above the floor, a lower
clock waits out the dwell time and no clock changes sooner than the minimum relock
interval after the last change. Each layer is a :class:`ControllerWrapper`.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from gpugov.controllers.contract import (
    ClockController,
    ControllerWrapper,
    chain_layer,
    whole_periods,
)
from gpugov.controllers.power_need import BudgetGuard
from gpugov.plant.types import ServingObservation

log = logging.getLogger(__name__)

DEFAULT_DWELL_S = 0.5
"""Seconds a clock is held before a lower one is applied (``safety.dwell_s``): two
decisions at the 0.25 s period ``mpc-online`` is run at, one at 0.5 s; at a 1 s period it
never binds."""
DEFAULT_MIN_RELOCK_INTERVAL_S = 0.1
"""Least seconds between two clock changes of a domain, raises included
(``safety.min_relock_interval_s``): NCCL collectives of a TP group stall when its
clocks change every ~50 ms."""


@dataclass(frozen=True, slots=True)
class SafetySettings:
    """The chain's parameters: ``safety.floor_mhz``, ``safety.dwell_s`` and
    ``safety.min_relock_interval_s`` of a domain."""

    floor_mhz: float | None = None
    dwell_s: float = DEFAULT_DWELL_S
    min_relock_interval_s: float = DEFAULT_MIN_RELOCK_INTERVAL_S

    def __post_init__(self) -> None:
        if self.floor_mhz is not None and not (
            math.isfinite(self.floor_mhz) and self.floor_mhz > 0
        ):
            raise ValueError(f"floor_mhz must be a positive clock, got {self.floor_mhz!r}")
        if not math.isfinite(self.dwell_s) or self.dwell_s < 0:
            raise ValueError(f"dwell_s must be >= 0, got {self.dwell_s!r}")
        interval = self.min_relock_interval_s
        if not math.isfinite(interval) or interval < 0:
            raise ValueError(f"min_relock_interval_s must be >= 0, got {interval!r}")

    def words(self) -> str:
        """The chain's floor and dwell in words, for a command's title line or a study's
        summary: two runs' figures then show the settings they differ in."""
        floor = (
            "no clock floor" if self.floor_mhz is None else f"clock floor {self.floor_mhz:g} MHz"
        )
        return f"dwell {self.dwell_s:g} s, {floor}"

    def as_dict(self) -> dict[str, float | None]:
        """JSON form (recording headers, scoreboard parameters)."""
        return {
            "floor_mhz": self.floor_mhz,
            "dwell_s": self.dwell_s,
            "min_relock_interval_s": self.min_relock_interval_s,
        }


class ClampToSupported(ControllerWrapper):
    """Quantise the inner decision down onto the supported clocks, within their range.

    A non-finite decision becomes the maximum clock (safe for latency) and is counted in
    ``invalid_decisions``.
    """

    def __init__(self, inner: ClockController, clocks_mhz: Sequence[float]) -> None:
        if not clocks_mhz:
            raise ValueError("ClampToSupported needs at least one supported clock")
        super().__init__(inner)
        self.clocks_mhz = tuple(sorted(float(c) for c in clocks_mhz))
        self.invalid_decisions = 0
        self.last_raw_mhz: float | None = None

    def __call__(self, observation: ServingObservation) -> float:
        decision = self.inner(observation)  # a controller's exception propagates
        try:
            requested = float(decision)
        except (TypeError, ValueError):
            requested = math.nan
        self.last_raw_mhz = requested if math.isfinite(requested) else None
        if not math.isfinite(requested):
            self.invalid_decisions += 1
            return self.clocks_mhz[-1]
        # The highest supported clock <= requested + 1e-9 (the clocks are sorted).
        index = bisect_right(self.clocks_mhz, requested + 1e-9)
        return self.clocks_mhz[index - 1] if index else self.clocks_mhz[0]


THERMAL_BAND_C = 2.0
"""The band under a stated thermal limit in which :class:`ThermalGuard` caps the clock:
two of NVML's whole-degree readings."""
THERMAL_STALE_S = 10.0
"""How long :class:`ThermalGuard` plans from its last temperature reading through ticks
that read none (beyond one control period, where it knows the period)."""
THERMAL_GAP_S = 5.0
"""A gap between two of :class:`ThermalGuard`'s calls longer than this beyond one control
period (the fail-safe held the clock) restarts its count of time at the lowest clock."""
THERMAL_GIVE_UP_S = 120.0
"""Seconds the die may stay at or above the limit with the clock at its lowest before
:class:`ThermalGuard` calls the limit unholdable and stands down (until the die cools
under the band)."""


class ThermalGuard(ControllerWrapper):
    """Hold the thermal limit the node states (``observation.thermal_limit_c``) whatever
    the controller decides: with the die (the domain's hottest GPU) within
    :data:`THERMAL_BAND_C` of the limit, the decision is capped at a clock that falls in
    proportion from the top clock at the band's foot to the lowest at the limit (a
    static map from temperature to clock, stable on the die's first-order thermal
    response whatever its time constant). Where the limit cannot be held (the die at or
    above it for :data:`THERMAL_GIVE_UP_S` at the lowest clock: an ambient too hot for
    it) the guard stands down, one log line, until the die is back under the band.

    A controller in its warm-up, or a rule that raises past its own thermal plan, went
    past a stated limit; the GPU's own slowdown only acts at its hardware limit.

    ``period_s`` (the control period the calls come at) lengthens the gap and the
    staleness by one period: ticks 10 s apart are no gap (each one counted as a fail-safe's,
    an unholdable limit was never given up)."""

    def __init__(
        self,
        inner: ClockController,
        clocks_mhz: Sequence[float],
        *,
        period_s: float | None = None,
    ) -> None:
        super().__init__(inner)
        self.clocks_mhz = tuple(sorted(float(c) for c in clocks_mhz))
        tick_s = 0.0 if period_s is None else float(period_s)
        self.gap_s = tick_s + THERMAL_GAP_S
        """A longer gap between two calls is a fail-safe's (:data:`THERMAL_GAP_S`)."""
        self.stale_s = tick_s + THERMAL_STALE_S
        """How old a reading a tick with none plans from (:data:`THERMAL_STALE_S`)."""
        self.capped = 0
        """Decisions lowered by the guard."""
        self.cap_mhz: float | None = None
        """The cap of the last decision (None: none applied)."""
        self.unholdable = False
        self._lowest_since_s: float | None = None
        self._last_call_s: float | None = None
        self._reading: tuple[float, float] | None = None
        """The last finite temperature and when it was read."""

    def __call__(self, observation: ServingObservation) -> float:
        return self.capping(float(self.inner(observation)), observation)

    def capping(self, decision: float, observation: ServingObservation) -> float:
        """``decision`` capped at the clock the die's temperature allows now; the node's
        fail-safe takes its top clock through here too (:func:`failsafe_clock`)."""
        cap = self._cap(observation)
        self.cap_mhz = cap
        if cap is None or decision <= cap:
            return decision
        self.capped += 1
        return cap

    def _cap(self, observation: ServingObservation) -> float | None:
        """The clock the die's temperature allows now (None: no cap)."""
        limit = observation.thermal_limit_c
        now = observation.time_s
        last_call, self._last_call_s = self._last_call_s, now
        if last_call is not None and not 0.0 <= now - last_call <= self.gap_s:
            # Not called meanwhile (an outage with no reading at all): the time at the
            # lowest clock starts again.
            self._lowest_since_s = None
        temperature = observation.temperature_c
        if math.isfinite(temperature):
            self._reading = (temperature, now)
        elif self._reading is not None and 0.0 <= now - self._reading[1] <= self.stale_s:
            # A tick the sensor gave no reading: the last one, a few seconds old at most,
            # so that a flaky sensor at the limit does not lift the cap tick by tick.
            temperature = self._reading[0]
        clocks = self.clocks_mhz
        if limit is None or not math.isfinite(limit) or not math.isfinite(temperature):
            return None
        room = (limit - temperature) / THERMAL_BAND_C
        if room >= 1.0:
            if self.unholdable:
                self.unholdable = False
                log.info("thermal limit %.4g C: the die is back under it; held again", limit)
            self._lowest_since_s = None
            return None
        if self.unholdable:
            return None
        share = min(1.0, max(0.0, room))
        wanted = clocks[0] + share * (clocks[-1] - clocks[0])
        index = bisect_right(clocks, wanted + 1e-9)
        cap = clocks[index - 1] if index else clocks[0]
        if room > 0.0 or cap > clocks[0]:
            self._lowest_since_s = None
        elif self._lowest_since_s is None:
            self._lowest_since_s = now
        elif now - self._lowest_since_s >= THERMAL_GIVE_UP_S:
            self.unholdable = True
            log.warning(
                "thermal limit %.4g C cannot be held: the die stayed at %.4g C or above for "
                "%.0f s at the lowest clock; the clock is no longer capped for it until the "
                "die is back under %.4g C",
                limit,
                limit,
                THERMAL_GIVE_UP_S,
                limit - THERMAL_BAND_C,
            )
            return None
        return cap


class FloorClock(ControllerWrapper):
    """Never go below ``floor_mhz`` (rounded up onto the supported clocks)."""

    def __init__(
        self, inner: ClockController, floor_mhz: float, clocks_mhz: Sequence[float] = ()
    ) -> None:
        super().__init__(inner)
        above = [float(c) for c in sorted(clocks_mhz) if c >= floor_mhz - 1e-9]
        self.floor_mhz = above[0] if above else float(floor_mhz)

    def __call__(self, observation: ServingObservation) -> float:
        return max(float(self.inner(observation)), self.floor_mhz)


class MinimumDwell(ControllerWrapper):
    """Hold a clock for at least ``dwell_s`` (by ``observation.time_s``) before lowering it,
    and change no clock sooner than ``min_relock_interval_s`` after the last change.

    Frequent lock changes disturb NCCL collectives (NVIDIA/nccl#1551; a TP group's
    collectives stall when its clocks change every ~50 ms). The dwell bounds how often a
    clock can fall; a raise passes it at once, but not the relock interval: a raise
    asked within the interval of the last change waits for the first decision after the
    interval, so it is late by at most the interval (the decision that asked for it came
    at least one period after that change). At a control period of at least the
    interval the interval never binds.
    """

    def __init__(
        self,
        inner: ClockController,
        dwell_s: float,
        min_relock_interval_s: float = 0.0,
        *,
        period_s: float | None = None,
    ) -> None:
        if dwell_s < 0 or not math.isfinite(dwell_s):
            raise ValueError(f"dwell_s must be >= 0, got {dwell_s!r}")
        if min_relock_interval_s < 0 or not math.isfinite(min_relock_interval_s):
            raise ValueError(f"min_relock_interval_s must be >= 0, got {min_relock_interval_s!r}")
        if period_s is not None and not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        super().__init__(inner)
        self.dwell_s = float(dwell_s)
        self.min_relock_interval_s = float(min_relock_interval_s)
        self.period_s = period_s
        """The control period the decisions come at (None: times taken as they are)."""
        self.held_mhz: float | None = None
        self._since_s = -math.inf
        self.suppressed = 0
        """Lower clocks held back by the dwell."""
        self.deferred = 0
        """Changes (raises included) held back by the minimum relock interval."""

    def __call__(self, observation: ServingObservation) -> float:
        requested = float(self.inner(observation))
        held = self.held_mhz
        if held is not None and requested == held:
            return requested
        if held is not None:
            since_s = self._held_for_s(observation.time_s)
            if requested < held and since_s < self.dwell_s:
                self.suppressed += 1
                return held
            if since_s < self.min_relock_interval_s:
                self.deferred += 1
                return held
        self.held_mhz = requested
        self._since_s = observation.time_s
        return requested

    def _held_for_s(self, time_s: float) -> float:
        """How long the held clock has been held at ``time_s`` (with a nanosecond's float
        slack). With ``period_s`` (a node's ticks) it is counted in whole control periods,
        a tenth of one allowed for the ticks' timing: a tick wakes a little after its
        target, by a different fraction of a millisecond each time, and a change one
        period after one that woke later was held back a period more (a dwell of two
        periods took three about every other time)."""
        held_s = time_s - self._since_s
        period = self.period_s
        if period is not None:
            held_s = whole_periods(held_s, period) * period
        return held_s + 1e-9

    def held_by_node(self, clock_mhz: float, time_s: float) -> None:
        """The node locked ``clock_mhz`` at ``time_s`` outside the chain (the fail-safe's
        top clock): held from then, so the dwell and the relock interval count from that
        lock, not from the chain's last change (the next decision relocked at once)."""
        if self.held_mhz != clock_mhz:
            self.held_mhz = float(clock_mhz)
            self._since_s = time_s


def with_safety(
    inner: ClockController,
    clocks_mhz: Sequence[float],
    settings: SafetySettings | None = None,
    *,
    period_s: float | None = None,
) -> MinimumDwell:
    """The standard chain: clamp to supported, then the thermal guard, then the floor,
    then the dwell time and the minimum relock interval, counted in whole periods of
    ``period_s`` when given."""
    settings = settings or SafetySettings()
    controller: ClockController = ThermalGuard(
        ClampToSupported(inner, clocks_mhz), clocks_mhz, period_s=period_s
    )
    if settings.floor_mhz is not None:
        controller = FloorClock(controller, settings.floor_mhz, clocks_mhz)
    return MinimumDwell(
        controller, settings.dwell_s, settings.min_relock_interval_s, period_s=period_s
    )


def clamp_layer(controller: ClockController) -> ClampToSupported | None:
    """The chain's :class:`ClampToSupported` layer (None outside a chain)."""
    return chain_layer(controller, ClampToSupported)


def failsafe_clock(
    controller: ClockController, top_mhz: float, observation: ServingObservation | None
) -> float:
    """The clock the node's fail-safe holds: the top clock, capped by the chain's
    :class:`ThermalGuard` where ``observation`` (the GPUs' readings, read while the engine
    is not) puts the die within its band of the stated thermal limit, and by the chain's
    :class:`BudgetGuard` where the power measured is over an enforced budget, never below
    the chain's floor (:class:`FloorClock`, outside both as in the chain). The fail-safe
    serves blind, not past the limits the node states; the guard's give-up applies."""
    if observation is None:
        return top_mhz
    clock = top_mhz
    budget = chain_layer(controller, BudgetGuard)
    ceiling = None if budget is None else budget.measured_ceiling(observation)
    if ceiling is not None:
        clock = min(clock, ceiling)
    guard = chain_layer(controller, ThermalGuard)
    if guard is not None:
        clock = guard.capping(clock, observation)
    floor = chain_layer(controller, FloorClock)
    return clock if floor is None else max(clock, floor.floor_mhz)


def held_by_node(controller: ClockController, clock_mhz: float, time_s: float) -> None:
    """Tell the chain's :class:`MinimumDwell` that the node locked ``clock_mhz`` at
    ``time_s`` without asking it (the fail-safe); nothing outside a chain."""
    dwell = chain_layer(controller, MinimumDwell)
    if dwell is not None:
        dwell.held_by_node(clock_mhz, time_s)


def invalid_decisions(controller: ClockController) -> int:
    """Non-finite decisions replaced by the maximum clock, over the wrapper chain."""
    clamp = clamp_layer(controller)
    return clamp.invalid_decisions if clamp is not None else 0


def raw_decision(controller: ClockController, fallback: float) -> float:
    """The algorithm's own answer at the last call, before the chain changed it."""
    clamp = clamp_layer(controller)
    if clamp is None or clamp.last_raw_mhz is None:
        return fallback
    return clamp.last_raw_mhz


__all__ = [
    "DEFAULT_DWELL_S",
    "DEFAULT_MIN_RELOCK_INTERVAL_S",
    "ClampToSupported",
    "FloorClock",
    "MinimumDwell",
    "SafetySettings",
    "ThermalGuard",
    "clamp_layer",
    "failsafe_clock",
    "held_by_node",
    "invalid_decisions",
    "raw_decision",
    "with_safety",
]
