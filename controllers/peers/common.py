"""What the peer controllers share: reading an observation defensively (a missing or NaN
field is unknown, never a number), stepping over the supported clocks, and the deltas of
the engine's and the GPU's cumulative counters between two decisions."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpugov.plant.types import ServingObservation


def finite(value: float | None) -> float | None:
    """``value`` as a float when it is a finite number, else None (unknown)."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def clocks_of(observation: ServingObservation, who: str) -> tuple[float, ...]:
    """The observation's supported clocks, ascending.

    Raises:
        ValueError: the observation lists none (a node always lists them).
    """
    clocks = observation.supported_clocks_mhz
    if not clocks:
        raise ValueError(f"{who} needs observation.supported_clocks_mhz (got an empty tuple)")
    return tuple(sorted(float(c) for c in clocks))


def index_at_or_below(clocks: Sequence[float], mhz: float) -> int:
    """Index of the highest clock at or below ``mhz`` (the lowest clock when none is)."""
    return max(0, bisect.bisect_right(clocks, mhz + 1e-9) - 1)


def index_at_or_above(clocks: Sequence[float], mhz: float) -> int:
    """Index of the lowest clock at or above ``mhz`` (the highest clock when none is)."""
    return min(len(clocks) - 1, bisect.bisect_left(clocks, mhz - 1e-9))


def current_index(observation: ServingObservation, clocks: Sequence[float]) -> int:
    """Index of the clock last requested (the top clock when unknown)."""
    requested = finite(observation.requested_clock_mhz)
    return len(clocks) - 1 if requested is None else index_at_or_below(clocks, requested)


def latency_ratio(value: float | None, slo: float | None) -> float | None:
    """``value / slo`` when both are known and the SLO is positive, else None."""
    measured, target = finite(value), finite(slo)
    if measured is None or target is None or target <= 0.0 or measured < 0.0:
        return None
    return measured / target


def ttft_ratio(observation: ServingObservation) -> float | None:
    """The window's mean TTFT over its SLO (at the window's mean prompt), or None."""
    return latency_ratio(observation.ttft_recent_s, observation.ttft_recent_slo_s)


def tpot_ratio(observation: ServingObservation) -> float | None:
    """The window's mean TPOT over the TPOT SLO, or None."""
    return latency_ratio(observation.tpot_recent_s, observation.tpot_slo_s)


@dataclass(slots=True)
class CounterDeltas:
    """Deltas of the cumulative counters since the previous observation.

    ``energy_j``, ``output_tokens`` and ``prompt_tokens`` are None when unknown (first
    call, a missing or NaN reading, or a counter that went backwards: a restart).
    """

    elapsed_s: float | None = None
    energy_j: float | None = None
    output_tokens: float | None = None
    prompt_tokens: float | None = None


class CounterTracker:
    """Turns an observation's cumulative counters into per-window deltas."""

    def __init__(self) -> None:
        self._last: tuple[float, float | None, float | None, float | None] | None = None

    def update(self, observation: ServingObservation) -> CounterDeltas:
        """The deltas from the previous call to this one."""
        now = (
            float(observation.time_s),
            finite(observation.energy_j),
            finite(observation.output_tokens_total),
            finite(observation.prompt_tokens_total),
        )
        last, self._last = self._last, now
        if last is None:
            return CounterDeltas()

        def delta(index: int) -> float | None:
            before, after = last[index], now[index]
            if before is None or after is None or after < before:
                return None
            return after - before

        elapsed = now[0] - last[0]
        return CounterDeltas(
            elapsed_s=elapsed if elapsed > 0.0 else None,
            energy_j=delta(1),
            output_tokens=delta(2),
            prompt_tokens=delta(3),
        )


def board_limit(observation: ServingObservation, known: float | None) -> float | None:
    """The board power limit: the first finite positive limit the node reported
    (``known``), else this observation's. A cap a controller sets is reported back as
    the limit in force, so only the first reading is the board's."""
    if known is not None:
        return known
    limit = finite(observation.power_limit_w)
    return limit if limit is not None and limit > 0.0 else None
