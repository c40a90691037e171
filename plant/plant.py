"""The plant's physical and engine parameters (the seed's ``ServingPlant``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from gpugov.plant.profile import DEFAULT_MAX_BATCH_SIZE, PerformanceProfile
from gpugov.plant.types import Request


def board_power_limit_w(profile: PerformanceProfile) -> float:
    """The board power limit a plant of ``profile`` has: its manifest's ``power_limit_w``,
    700 W where it states none."""
    return float(profile.manifest.get("power_limit_w", 700.0))


def run_horizon_s(
    requests: Sequence[Request],
    drain_timeout_s: float,
    ttft_slo_for: Callable[[float], float],
    tpot_slo_s: float,
) -> float:
    """Where a run of ``requests`` ends by default: ``drain_timeout_s`` after the last
    arrival, or later where a request's SLO deadline (its TTFT SLO, then each further
    token at the TPOT SLO) falls later, so that no request is censored as a miss before
    it could have missed (a board whose TTFT SLO is longer than the drain timeout)."""
    if not requests:
        return drain_timeout_s
    last = max(r.arrival_time_s for r in requests)
    deadline = max(
        r.arrival_time_s + ttft_slo_for(r.prompt_tokens) + (r.output_tokens - 1) * tpot_slo_s
        for r in requests
    )
    return max(last + drain_timeout_s, deadline)


@dataclass(frozen=True)
class ServingPlant:
    """One GPU serving one model: profile, power/thermal limits and engine limits.

    Thermal model: one-state RC, ``dT/dt = (T_amb + R * P - T) / tau``, integrated exactly
    for piecewise-constant power. ``actuation_delay_s`` is the time from a clock request
    to the new clock taking effect. ``kv_capacity_tokens`` and ``max_batch_size`` bound
    the running batch as vLLM's KV block pool and ``max_num_seqs`` do.
    ``power_cap_window_s`` is the averaging window of the firmware's power controller
    under a run-time power cap (``gpu_physics.py``; 0: it acts on instant power).
    ``tensor_parallel`` is the number of GPUs in the domain (one clock for all of them, as
    the daemon's multi-GPU domains lock it): the profile's rates are the domain's, its powers
    and ``power_limit_w`` the sum over the GPUs, its thermal state each GPU's.
    """

    profile: PerformanceProfile
    power_limit_w: float
    thermal_limit_c: float
    ambient_temperature_c: float
    thermal_resistance_c_per_w: float
    thermal_time_constant_s: float
    time_step_s: float = 0.1
    actuation_delay_s: float = 0.02
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    kv_capacity_tokens: int = 400_000
    drain_timeout_s: float = 600.0
    latency_noise_cv: float = 0.0
    tensor_parallel: int = 1
    power_cap_window_s: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first parameter out of range."""
        positive = (
            "power_limit_w",
            "thermal_resistance_c_per_w",
            "thermal_time_constant_s",
            "time_step_s",
            "drain_timeout_s",
        )
        for name in positive:
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0.0:
                raise ValueError(f"ServingPlant.{name} must be finite and positive, got {value!r}")
        for name in ("thermal_limit_c", "ambient_temperature_c"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"ServingPlant.{name} must be finite, got {value!r}")
        if self.thermal_limit_c <= self.ambient_temperature_c:
            raise ValueError(
                f"ServingPlant.thermal_limit_c ({self.thermal_limit_c}) must exceed "
                f"ambient_temperature_c ({self.ambient_temperature_c})"
            )
        if not math.isfinite(self.actuation_delay_s) or self.actuation_delay_s < 0.0:
            raise ValueError(
                f"ServingPlant.actuation_delay_s must be >= 0, got {self.actuation_delay_s!r}"
            )
        window = self.power_cap_window_s
        if not math.isfinite(window) or window < 0.0:
            raise ValueError(f"ServingPlant.power_cap_window_s must be >= 0, got {window!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"ServingPlant.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.kv_capacity_tokens < 1:
            raise ValueError(
                f"ServingPlant.kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}"
            )
        if self.tensor_parallel < 1:
            raise ValueError(
                f"ServingPlant.tensor_parallel must be >= 1, got {self.tensor_parallel}"
            )
        if not math.isfinite(self.latency_noise_cv) or not 0.0 <= self.latency_noise_cv < 1.0:
            raise ValueError(
                f"ServingPlant.latency_noise_cv must lie in [0, 1), got {self.latency_noise_cv!r}"
            )

    @classmethod
    def from_profile(cls, profile: PerformanceProfile, **overrides: Any) -> ServingPlant:
        """Build a plant from a profile manifest's limits, thermal and engine sections."""
        manifest = profile.manifest
        thermal = manifest.get("thermal", {})
        engine = manifest.get("engine", {})
        values: dict[str, Any] = {
            "profile": profile,
            "power_limit_w": board_power_limit_w(profile),
            "thermal_limit_c": float(thermal.get("thermal_limit_c", 87.0)),
            "ambient_temperature_c": float(thermal.get("ambient_temperature_c", 30.0)),
            "thermal_resistance_c_per_w": float(thermal.get("thermal_resistance_c_per_w", 0.07)),
            "thermal_time_constant_s": float(thermal.get("thermal_time_constant_s", 30.0)),
            "tensor_parallel": profile.tensor_parallel,
        }
        if "max_batch_size" in engine:
            values["max_batch_size"] = int(engine["max_batch_size"])
        if "kv_capacity_tokens" in engine:
            values["kv_capacity_tokens"] = int(engine["kv_capacity_tokens"])
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown ServingPlant parameter(s): {unknown}")
        values.update(overrides)
        return cls(**values)

    def with_overrides(self, **overrides: Any) -> ServingPlant:
        """A copy with some parameters changed (validated)."""
        return replace(self, **overrides)

    def run_horizon_s(self, requests: Sequence[Request]) -> float:
        """Where a run of ``requests`` on this plant ends by default (:func:`run_horizon_s`)."""
        profile = self.profile
        return run_horizon_s(
            requests, self.drain_timeout_s, profile.ttft_slo_for, profile.tpot_slo_s
        )

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters for result metadata."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "profile"}
        out["profile"] = self.profile.describe()
        return out
