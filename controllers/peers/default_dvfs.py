"""The GPU's default DVFS: unlocked, boosting under load, under its board power limit as the
firmware enforces it, and at its top clock while idle as long as a CUDA context is open.

Source: NVIDIA's default behaviour without application clocks or locks: the GPU boosts to
its highest clock while work runs, and its power controller holds the board power limit
(TDP) on averaged power (``nvidia-smi -q -d PERFORMANCE``: idle, SW power cap and thermal
reasons). It is the baseline most governors quote their savings against. A GPU with no
process on it rests at a low clock, but a serving engine keeps a CUDA context open, and
with one open the GPU holds its top clock while idle: measured on an H200 (driver
580.159.04) by gpugov's device checks, 1,980 MHz and 121-127 W through idle spans of up
to 150 s with a context open (P0, no event reason), 345 MHz and 79-81 W with none
(``docs/measurements/device-h200-2026-12-04.md``).

What this keeps: the top clock while the engine runs (busy or idle); with a finite
``idle_hold_s`` (a GPU that does drop with a context open), the lowest clock after that
much idle time instead; the board limit applied through the plant's firmware power
controller (a cap at the board limit itself, so that it acts on power averaged over
``power_cap_window_s`` and may overshoot briefly, as boost does), where ``max`` meets it
as an instant clamp.

Simplified: a node's governor cannot switch clocks within an iteration, so an idle drop
and the boost happen at decision times (every 0.25 s on the scoreboard, plus the safety
chain's dwell before the drop); the real firmware reacts within milliseconds. Boost
clocks above the top supported clock and memory-clock changes are not modelled.
"""

from __future__ import annotations

import math

from gpugov.controllers.peers.common import board_limit, clocks_of
from gpugov.plant.types import ServingObservation


class DefaultDVFS:
    """The top clock (with a finite ``idle_hold_s``, the lowest once idle that long); the
    board limit as a firmware cap (a :class:`~gpugov.plant.types.PowerCapping`)."""

    def __init__(self, idle_hold_s: float = math.inf) -> None:
        if math.isnan(idle_hold_s) or idle_hold_s < 0.0:
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
        if observation.has_work:
            self._last_busy_s = now
        if math.isinf(self.idle_hold_s):
            return clocks[-1]  # a context is open: the GPU does not drop while idle
        idle_for = math.inf if self._last_busy_s is None else now - self._last_busy_s
        return clocks[0] if idle_for >= self.idle_hold_s else clocks[-1]
