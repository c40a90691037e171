"""Fits from the sweep's measurements: the decode latency model per clock, the thermal RC,
and smooth cross-clock fits (diagnostics), each with its R^2.

Decode: ``t(B, C) = alpha + beta * B + gamma * C`` (non-negative least squares over the
design points at one clock), the plant's latency model; at the reference batch ``B_ref``
and context ``C_ref = B_ref * L_ref`` it gives ``decode_tokens_per_s = B_ref / t`` and the
weight/batch/KV fractions ``alpha / t``, ``beta B_ref / t``, ``gamma C_ref / t``.
Thermal: ``dT/dt = (T_amb + R P - T) / tau`` integrated exactly between power readings
(power held between readings), least squares on the measured temperatures of every
contiguous segment, each starting at its own first reading.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import least_squares, nnls


def r_squared(observed: ArrayLike, predicted: ArrayLike) -> float:
    """Coefficient of determination (1 for a perfect fit; 0 when observed is constant)."""
    y = np.asarray(observed, dtype=float)
    residual = float(np.sum((y - np.asarray(predicted, dtype=float)) ** 2))
    total = float(np.sum((y - y.mean()) ** 2))
    if total <= 0.0:
        return 1.0 if residual <= 1e-18 else 0.0
    return 1.0 - residual / total


@dataclass(frozen=True, slots=True)
class DecodeFit:
    """``t(B, C) = alpha + beta B + gamma C`` at one clock, seconds."""

    alpha_s: float
    beta_s: float
    gamma_s: float
    r_squared: float

    def iteration_s(self, batch: float, context_tokens: float) -> float:
        """Iteration time for batch ``batch`` with ``context_tokens`` in total."""
        return self.alpha_s + self.beta_s * batch + self.gamma_s * context_tokens

    def fractions(self, batch: int, context_per_sequence: int) -> tuple[float, float, float]:
        """Weight, batch and KV shares of the iteration at the reference point."""
        total = self.iteration_s(batch, batch * context_per_sequence)
        return (
            self.alpha_s / total,
            self.beta_s * batch / total,
            self.gamma_s * batch * context_per_sequence / total,
        )


def fit_decode(points: Sequence[tuple[float, float, float]]) -> DecodeFit:
    """Fit ``(batch, context_tokens, iteration_s)`` points (at least three, not collinear).

    Raises:
        ValueError: fewer than three points.
    """
    if len(points) < 3:
        raise ValueError(f"the decode fit needs at least 3 design points, got {len(points)}")
    data = np.asarray(points, dtype=float)
    design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    # Scale the columns so NNLS is well conditioned, then undo the scaling.
    scale = np.maximum(np.abs(design).max(axis=0), 1e-12)
    coefficients, _ = nnls(design / scale, data[:, 2])
    coefficients = coefficients / scale
    predicted = design @ coefficients
    return DecodeFit(
        alpha_s=float(coefficients[0]),
        beta_s=float(coefficients[1]),
        gamma_s=float(coefficients[2]),
        r_squared=r_squared(data[:, 2], predicted),
    )


@dataclass(frozen=True, slots=True)
class ThermalFit:
    """One-state RC fitted to measured temperatures."""

    ambient_temperature_c: float
    thermal_resistance_c_per_w: float
    thermal_time_constant_s: float
    r_squared: float
    duration_s: float
    temperature_span_c: float


def _simulate(segment: np.ndarray, ambient: float, resistance: float, tau: float) -> np.ndarray:
    times, powers, temps = segment[:, 0], segment[:, 1], segment[:, 2]
    out = np.empty_like(temps)
    out[0] = temps[0]
    for k in range(1, len(times)):
        equilibrium = ambient + resistance * powers[k - 1]
        out[k] = equilibrium + (out[k - 1] - equilibrium) * math.exp(
            -(times[k] - times[k - 1]) / tau
        )
    return out


def fit_thermal(
    segments: Sequence[Sequence[tuple[float, float, float]]],
    *,
    min_duration_s: float = 60.0,
    min_span_c: float = 3.0,
) -> ThermalFit | None:
    """Fit ``(time_s, power_w, temperature_c)`` segments; None when the run was too short
    (under ``min_duration_s`` in all) or the temperature moved less than ``min_span_c``."""
    arrays = [np.asarray(s, dtype=float) for s in segments if len(s) >= 5]
    if not arrays:
        return None
    duration = float(sum(a[-1, 0] - a[0, 0] for a in arrays))
    temps = np.concatenate([a[:, 2] for a in arrays])
    span = float(temps.max() - temps.min())
    if duration < min_duration_s or span < min_span_c:
        return None
    powers = np.concatenate([a[:, 1] for a in arrays])

    def residuals(params: np.ndarray) -> np.ndarray:
        ambient, resistance, tau = params
        return np.concatenate(
            [_simulate(a, ambient, resistance, tau)[1:] - a[1:, 2] for a in arrays]
        )

    mean_power = max(float(powers.mean()), 1.0)
    guess_resistance = max((float(temps.mean()) - 25.0) / mean_power, 1e-3)
    result = least_squares(
        residuals,
        x0=[25.0, guess_resistance, 30.0],
        bounds=([-20.0, 1e-4, 1.0], [80.0, 1.0, 3600.0]),
    )
    ambient, resistance, tau = (float(v) for v in result.x)
    observed = np.concatenate([a[1:, 2] for a in arrays])
    predicted = observed + residuals(result.x)
    return ThermalFit(
        ambient_temperature_c=ambient,
        thermal_resistance_c_per_w=resistance,
        thermal_time_constant_s=tau,
        r_squared=r_squared(observed, predicted),
        duration_s=duration,
        temperature_span_c=span,
    )


def clock_fit(clocks: Sequence[float], values: Sequence[float], degree: int = 2) -> dict:
    """A polynomial in the clock (GHz) through a measured column, with its R^2."""
    x = np.asarray(clocks, dtype=float) / 1000.0
    y = np.asarray(values, dtype=float)
    degree = min(degree, len(x) - 1)
    if degree < 1:
        return {"degree": 0, "coefficients_per_ghz": [float(y.mean())], "r_squared": None}
    coefficients = np.polyfit(x, y, degree)
    return {
        "degree": degree,
        "coefficients_per_ghz": [float(c) for c in coefficients],
        "r_squared": r_squared(y, np.polyval(coefficients, x)),
    }
