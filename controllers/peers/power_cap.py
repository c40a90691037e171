"""A static power cap: the lever NVIDIA's tools use, at a fixed share of the board limit.

Source: NVIDIA Dynamo's power-aware planner sets per-GPU power limits from a pod
annotation, with a fail-closed default of about 70 % of TDP; ``nvidia-smi -pl`` and NVML's
``nvmlDeviceSetPowerManagementLimit`` set the same limit by hand. The clock is left to the
GPU (the top clock requested, as unlocked), so the firmware's power controller alone holds
the power at the cap (``plant/gpu_physics.py`` models it: the highest clock whose power
fits, acting on averaged power).

Simplified: one cap for the whole run and the whole domain (Dynamo sets it per GPU from an
annotation an operator changes by hand); the board limit is the first limit the node
reports, since a cap once set is reported back as the limit in force.
"""

from __future__ import annotations

import math

from gpugov.controllers.peers.common import board_limit, clocks_of
from gpugov.plant.types import ServingObservation

DEFAULT_CAP_FRACTION = 0.7
"""Dynamo's fail-closed default: 70 % of the board limit (TDP)."""


class StaticPowerCap:
    """Request the top clock and cap the power at ``cap_w`` watts, or at ``fraction`` of
    the board limit when ``cap_w`` is None (a :class:`~gpugov.plant.types.PowerCapping`)."""

    def __init__(self, cap_w: float | None = None, fraction: float = DEFAULT_CAP_FRACTION) -> None:
        if cap_w is not None and not (math.isfinite(cap_w) and cap_w > 0.0):
            raise ValueError(f"power-cap: cap_w must be positive watts, got {cap_w!r}")
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise ValueError(f"power-cap: fraction must lie in (0, 1], got {fraction!r}")
        self.cap_w = None if cap_w is None else float(cap_w)
        self.fraction = float(fraction)
        self.board_limit_w: float | None = None
        self.name = "power-cap"

    @property
    def requested_power_cap_w(self) -> float | None:
        """The cap in force: ``cap_w``, else ``fraction`` of the board limit once known."""
        if self.cap_w is not None:
            return self.cap_w
        return None if self.board_limit_w is None else self.fraction * self.board_limit_w

    def __call__(self, observation: ServingObservation) -> float:
        self.board_limit_w = board_limit(observation, self.board_limit_w)
        return clocks_of(observation, "power-cap")[-1]
