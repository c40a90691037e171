"""The GPU's default DVFS: unlocked, boosting under load, idling low, under its board power
limit as the firmware enforces it.

Source: NVIDIA's default behaviour without application clocks or locks: the GPU boosts to
its highest clock while work runs, drops to a low clock when idle, and its power
controller holds the board power limit (TDP) on averaged power (``nvidia-smi -q -d
PERFORMANCE``: idle, SW power cap and thermal reasons). It is the baseline most governors
quote their savings against.

What this keeps: the top clock while the engine has work (or had some within
``idle_hold_s``), the lowest clock after that much idle time; the board limit applied
through the plant's firmware power controller (a cap at the board limit itself, so that
it acts on power averaged over ``power_cap_window_s`` and may overshoot briefly, as boost
does), where ``max`` meets it as an instant clamp.

Simplified: a node's governor cannot switch clocks within an iteration, so the idle drop
and the boost happen at decision times (every 0.25 s on the scoreboard, plus the safety
chain's dwell before the drop); the real firmware reacts within milliseconds. Boost
clocks above the top supported clock and memory-clock changes are not modelled.
"""

from __future__ import annotations

import math

from gpugov.controllers.peers.common import board_limit, clocks_of, has_work
from gpugov.plant.types import ServingObservation


class DefaultDVFS:
    """Top clock while busy, lowest clock once idle for ``idle_hold_s``; the board limit as
    a firmware cap (a :class:`~gpugov.plant.types.PowerCapping`)."""

    def __init__(self, idle_hold_s: float = 0.5) -> None:
        if not (math.isfinite(idle_hold_s) and idle_hold_s >= 0.0):
            raise ValueError(f"default-dvfs: idle_hold_s must be >= 0, got {idle_hold_s!r}")
        self.idle_hold_s = float(idle_hold_s)
        self.board_limit_w: float | None = None
        self._last_busy_s: float | None = None
        self.name = "default-dvfs"

    @property
    def requested_power_cap_w(self) -> float | None:
        """The board limit, once known (the firmware's own limit)."""
        return self.board_limit_w

    def __call__(self, observation: ServingObservation) -> float:
        clocks = clocks_of(observation, "default-dvfs")
        self.board_limit_w = board_limit(observation, self.board_limit_w)
        now = float(observation.time_s)
        if has_work(observation):
            self._last_busy_s = now
        idle_for = math.inf if self._last_busy_s is None else now - self._last_busy_s
        return clocks[0] if idle_for >= self.idle_hold_s else clocks[-1]
