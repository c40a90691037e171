"""A DPS-style power-cap controller: the cap steered from the GPU's own power telemetry.

Source: NVIDIA Domain Power Service (DPS) documentation, "Power Reservation Steering"
(docs.nvidia.com/datacenter/dps): a loop that collects power and utilisation telemetry,
finds GPUs that do not use their allocation, and moves their power limits towards demand
(``loopIntervalSeconds: 90``, ``windowSize: 5`` in its Helm example), within a group
budget.

What this keeps: a loop every ``loop_s`` over the last ``window`` power readings. A GPU
that uses its allocation (mean power at or above ``busy_fraction`` of the cap, or held by
the cap: NVML's SW-power-cap reason bit) gets ``step_fraction`` of the board limit more;
a GPU well below it (mean under ``idle_fraction`` of the cap) is lowered to its window's
peak power plus ``headroom``, never under ``floor_fraction`` of the board limit. The clock
is left to the GPU (top clock requested).

Simplified: one GPU domain, so there is no group budget to redistribute (the cap only
follows demand); the loop runs every 10 s instead of 90 s, so that it acts within a
scenario of a few minutes; utilisation is read through power and the cap reason bit only.
"""

from __future__ import annotations

import math
from collections import deque

from gpugov.controllers.peers.common import board_limit, clocks_of, finite
from gpugov.plant.types import ServingObservation

SW_POWER_CAP = 0x4
"""NVML's ``nvmlClocksEventReasonSwPowerCap`` bit."""


class DPSPowerSteering:
    """Steer the power cap every ``loop_s`` from the window's power telemetry (module
    notes); requests the top clock (a :class:`~gpugov.plant.types.PowerCapping`)."""

    def __init__(
        self,
        *,
        loop_s: float = 10.0,
        window: int = 5,
        busy_fraction: float = 0.95,
        idle_fraction: float = 0.8,
        headroom: float = 0.1,
        step_fraction: float = 0.1,
        floor_fraction: float = 0.3,
    ) -> None:
        if not (math.isfinite(loop_s) and loop_s > 0.0):
            raise ValueError(f"dps: loop_s must be positive, got {loop_s!r}")
        if window < 1:
            raise ValueError(f"dps: window must be >= 1, got {window!r}")
        if not 0.0 < idle_fraction < busy_fraction <= 1.0:
            raise ValueError("dps: need 0 < idle_fraction < busy_fraction <= 1")
        self.loop_s = float(loop_s)
        self.busy_fraction = busy_fraction
        self.idle_fraction = idle_fraction
        self.headroom = headroom
        self.step_fraction = step_fraction
        self.floor_fraction = floor_fraction
        self.board_limit_w: float | None = None
        self.cap: float | None = None
        self._power: deque[float] = deque(maxlen=window)
        self._capped: deque[bool] = deque(maxlen=window)
        self._next_loop_s: float | None = None
        self.name = "dps"

    @property
    def requested_power_cap_w(self) -> float | None:
        """The cap in force (None until the board limit is known: the board's own)."""
        return self.cap

    def __call__(self, observation: ServingObservation) -> float:
        top = clocks_of(observation, "dps")[-1]
        self.board_limit_w = board_limit(observation, self.board_limit_w)
        board = self.board_limit_w
        if board is None:
            return top
        if self.cap is None:
            self.cap = board
        power = finite(observation.power_w)
        if power is not None and power >= 0.0:
            self._power.append(power)
            reasons = observation.clock_event_reasons
            self._capped.append(bool(reasons is not None and reasons & SW_POWER_CAP))
        now = float(observation.time_s)
        if self._next_loop_s is None:
            self._next_loop_s = now + self.loop_s
        if now + 1e-9 >= self._next_loop_s and self._power:
            self._next_loop_s = now + self.loop_s
            self.cap = self._steer(board, self.cap)
        return top

    def _steer(self, board: float, cap: float) -> float:
        """The next cap from the window (module notes)."""
        mean = sum(self._power) / len(self._power)
        floor = self.floor_fraction * board
        if mean >= self.busy_fraction * cap or any(self._capped):
            return min(board, cap + self.step_fraction * board)
        if mean < self.idle_fraction * cap:
            return min(board, max(floor, max(self._power) * (1.0 + self.headroom)))
        return cap
