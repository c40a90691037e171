"""A simulated GPU's clock requests and the clock in effect: each request takes effect
``actuation_delay_s`` after it was made, in the order made (at once with no delay), as a
real clock lock lands a little after its write."""

from __future__ import annotations

import math
from collections import deque

from gpugov.plant.gpu_physics import _EPS


class ActuationDelay:
    """The requested and the effective clock of a :class:`~gpugov.plant.simulator.
    PlantSimulation`, as indices into its supported clocks, and how often the request
    changed (the result's ``clock_changes``).

    Args:
        start_index: the clock requested and in effect at the start.
        delay_s: seconds from a request to its effect (0 or less: at once).
    """

    def __init__(self, start_index: int, delay_s: float) -> None:
        self.requested = start_index
        """The clock requested last."""
        self.effective = start_index
        """The clock in effect as of the last :meth:`take_effect`."""
        self.changes = 0
        """Requests that changed the requested clock."""
        self._delay_s = delay_s
        self._pending: deque[tuple[float, int]] = deque()  # (effective at, clock index)

    def request(self, index: int, now_s: float) -> None:
        """Request clock ``index`` at ``now_s``; a request of the clock already requested
        changes nothing."""
        if index == self.requested:
            return
        self.requested = index
        self.changes += 1
        effective = now_s + self._delay_s
        if self._delay_s <= 0.0:
            self.effective = index
            self._pending.clear()
        else:
            self._pending.append((effective, index))

    def next_change_s(self) -> float:
        """When the next request takes effect (infinity: none is pending)."""
        return self._pending[0][0] if self._pending else math.inf

    def take_effect(self, now_s: float) -> int:
        """The clock in effect at ``now_s``, every request due by then taken into effect."""
        pending = self._pending
        while pending and pending[0][0] <= now_s + _EPS:
            self.effective = pending.popleft()[1]
        return self.effective


__all__ = ["ActuationDelay"]
