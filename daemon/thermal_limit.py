"""A domain's thermal limit against its GPUs' own slowdown temperature.

A GPU slows its clocks itself once its die reaches its slowdown temperature (NVML's
``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``): a ``thermal_limit_c`` configured above it is
never reached, and a controller planning to it plans clocks the GPU will not hold. The
limit held is the lower of the two, said in one line at the start (``run``) and in
``check-config``'s report, word for word.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpugov.daemon.backend import GpuBackend, unwrapped
from gpugov.daemon.gpu_sampling import read_within


def slowdown_temperature_c(backend: GpuBackend, read_deadline_s: float | None) -> float | None:
    """``backend``'s slowdown temperature (C) where its backend reports one (NVML), read
    within ``read_deadline_s`` (:func:`~daemon.gpu_sampling.read_within`)."""
    value = read_within(
        unwrapped(backend), "slowdown_temperature_c", "slowdown temperature", read_deadline_s
    )
    return float(value) if value is not None and math.isfinite(value) else None


def held_thermal_limit(
    domain: str,
    limit_c: float | None,
    backends: Sequence[GpuBackend],
    read_deadline_s: float | None = None,
) -> tuple[float | None, str | None]:
    """The thermal limit a domain holds: its configured ``limit_c``, lowered to the lowest
    slowdown temperature its GPUs report where that is lower; and the line saying so
    (None where nothing was lowered). No GPU is read without a configured limit."""
    if limit_c is None:
        return None, None
    slowdowns = [
        (backend.label, value)
        for backend in backends
        if (value := slowdown_temperature_c(backend, read_deadline_s)) is not None
    ]
    if not slowdowns:
        return limit_c, None
    label, lowest = min(slowdowns, key=lambda pair: pair[1])
    if limit_c <= lowest:
        return limit_c, None
    return lowest, (
        f"domain {domain!r}: thermal_limit_c ({limit_c:g} C) is above GPU {label}'s slowdown "
        f"temperature ({lowest:g} C, NVML), where the GPU slows itself: {lowest:g} C is "
        "held instead"
    )


__all__ = ["held_thermal_limit", "slowdown_temperature_c"]
