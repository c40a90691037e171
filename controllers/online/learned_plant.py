"""The plant ``mpc-online``'s MPC plans on: its learned model as a profile over the
supported clocks, with the node's power and thermal limits and the learned thermal RC.

Built once a decision, so the profile after the first is a copy of the first with new
values (its validation is a fifth of the decision's time otherwise).
"""

from __future__ import annotations

import math
from typing import Any

from gpugov.controllers.online.identification import REFERENCE_BATCH, OnlineModel
from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import ServingObservation

ONLINE_STATUS = "online-identified"
"""Profile status of a learned model (``measured`` stays reserved for clock sweeps)."""
DEFAULT_THERMAL_LIMIT_C = 87.0
UNCAPPED_FACTOR = 10.0
"""With no cap known, the MPC plans on a 'cap' this many times the learned top power, so
the cap never binds (``ServingPlant`` needs a finite one)."""


def published_kv_capacity(observation: ServingObservation) -> int | None:
    """One engine's KV cache in tokens as its engine publishes it (vLLM's cache config),
    or None where it publishes none or an impossible one."""
    capacity = observation.kv_capacity_tokens
    if capacity is None or not math.isfinite(capacity) or capacity < 1.0:
        return None
    return int(capacity)


class LearnedPlant:
    """Builds the learned profile and plant; keeps the first profile as the template
    later ones copy."""

    def __init__(self) -> None:
        self.template: PerformanceProfile | None = None
        """The first learned profile; later ones are copies of it with new values."""

    def profile(
        self,
        model: OnlineModel,
        slos: tuple[float, float],
        z: float,
        context_tokens: float,
        model_name: str | None,
    ) -> PerformanceProfile:
        """``model`` as a profile over its clocks: latencies at the mean plus ``z``
        standard deviations, powers at the mean, at ``context_tokens`` of context."""
        clocks = model.clocks_mhz
        realized = clocks * model.realized_ratio
        # Latencies at the mean plus z standard deviations, held to the physics: no part
        # of an iteration gets faster at a lower clock, nor slower than 1/f; board power
        # does not fall as the clock rises (prediction.learned_tables).
        arrays, top, valid = model.learned_tables(realized, z, REFERENCE_BATCH, context_tokens)
        weights = max(float(top[0]), 0.0)
        batch_only = max(float(top[1]) - weights, 0.0)
        full = max(float(top[2]), 1e-9)
        kv = max(full - weights - batch_only, 0.0)
        total = weights + batch_only + kv
        fractions = (
            (weights / total, batch_only / total, kv / total) if total > 0 else (1.0, 0.0, 0.0)
        )
        manifest = {
            "status": ONLINE_STATUS,
            "gpu": "learned online",
            "model": model_name or "unknown model",
            "engine": {
                "reference_batch_size": REFERENCE_BATCH,
                "reference_context_tokens": max(1, int(round(context_tokens))),
            },
            "decode_latency_model": {
                "weight_fraction": fractions[0],
                "batch_fraction": fractions[1],
                # kv / total itself: ``1 - w - b`` can come out at -3e-17 when the
                # context term is zero, which the profile refuses (and the MPC fell back).
                "kv_fraction": fractions[2],
            },
            "power_limit_w": model.power_limit_w,
        }
        values: dict[str, Any] = {
            "prefill_tokens_per_s": arrays[0],
            "decode_tokens_per_s": arrays[1],
            "prefill_power_w": arrays[2],
            "decode_power_w": arrays[3],
            "idle_power_w": arrays[4],
            "ttft_slo_s": float(slos[0]),
            "tpot_slo_s": float(slos[1]),
            "manifest": manifest,
        }
        template = self.template
        if (
            template is not None
            and template.clock_mhz.shape == clocks.shape
            and bool((template.clock_mhz == clocks).all())
            and valid
            and all(math.isfinite(slo) and slo > 0.0 for slo in slos)
        ):
            # The same clocks, and values that are finite and positive (checked in the
            # kernel): the previous profile with the new values, without validating
            # them again (a fifth of the decision's time otherwise).
            # (``copy.copy`` of a frozen dataclass, by hand: its instance dict copied.)
            profile = object.__new__(type(template))
            profile.__dict__.update(template.__dict__)
            profile.__dict__.update(values)
            return profile
        profile = PerformanceProfile(clock_mhz=clocks.copy(), name="online", **values)
        self.template = profile
        return profile

    @staticmethod
    def plant(
        observation: ServingObservation,
        profile: PerformanceProfile,
        model: OnlineModel,
        *,
        thermal_limit_c: float | None,
        cap_w: float | None,
        control_period_s: float,
    ) -> ServingPlant:
        """The plant on ``profile``: the power cap ``cap_w`` (NVML's limit; none known:
        :data:`UNCAPPED_FACTOR` times the top power), the observation's thermal limit
        (else ``thermal_limit_c``, else 87 C), the learned thermal RC (a neutral one until
        it is learned) and the engine's KV cache where it publishes one
        (:func:`published_kv_capacity`)."""
        limit = observation.thermal_limit_c or thermal_limit_c or DEFAULT_THERMAL_LIMIT_C
        top_power = max(float(profile.prefill_power_w[-1]), float(profile.decode_power_w[-1]))
        power_limit = cap_w if cap_w is not None else UNCAPPED_FACTOR * top_power
        fitted = model.thermal_parameters()
        if fitted is not None and fitted[0] < limit:
            ambient, resistance, windows = fitted
            tau = max(1.0, windows * control_period_s)
        else:
            # Unknown RC: one that keeps the die under its limit at the power limit, so
            # the MPC leaves thermal holds to the GPU until the fit is physical.
            ambient = min(30.0, limit - 10.0)
            resistance = (limit - ambient) / (1.1 * (power_limit if cap_w else top_power))
            tau = 30.0
        capacity = published_kv_capacity(observation)
        return ServingPlant(
            profile=profile,
            power_limit_w=power_limit,
            thermal_limit_c=limit,
            ambient_temperature_c=ambient,
            thermal_resistance_c_per_w=resistance,
            thermal_time_constant_s=tau,
            **({} if capacity is None else {"kv_capacity_tokens": capacity}),
        )
