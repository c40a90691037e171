"""Recursive Bayesian linear regression with forgetting: the estimator every part of
``mpc-online``'s online model (:mod:`controllers.online.identification`) is fitted with,
its Kalman step compiled (a window's update runs three of them, inside a control period).
Pure computation: no I/O, no clocks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.compiled import jit

FloatArray = NDArray[np.float64]

NOISE_FLOOR = 1e-8
"""Least measurement-noise variance a regression assumes (keeps the gain finite)."""


@dataclass
class RecursiveLeastSquares:
    """Bayesian linear regression updated one sample at a time, with forgetting.

    ``y = x . theta + e``, Gaussian prior ``theta ~ N(mean, covariance)``. Each update is
    the Kalman/RLS step; forgetting relaxes the covariance towards the prior
    (``P <- lam P + (1 - lam) P0``), so old evidence fades, the estimate tracks a drifting
    plant, and the covariance never winds up beyond the prior (bounded memory and
    numerics). The noise variance is tracked as an exponentially weighted mean of the
    squared innovations.

    Args:
        mean: prior mean (n,).
        covariance: prior covariance (n, n), symmetric positive definite.
        noise_variance: initial measurement-noise variance.
        forgetting: ``lam`` per update, in (0, 1].
    """

    mean: FloatArray
    covariance: FloatArray
    noise_variance: float
    forgetting: float = 0.995
    prior_covariance: FloatArray = field(init=False)
    samples: int = 0
    residual_ms: float = 0.0
    """Exponentially weighted mean squared innovation (same units as ``y`` squared)."""
    rejected_nonfinite: int = 0
    """Samples refused because ``x``, ``y`` or the weight held a NaN or an infinity."""

    def __post_init__(self) -> None:
        self.mean = np.array(self.mean, dtype=float)
        self.covariance = np.array(self.covariance, dtype=float)
        n = self.mean.size
        if self.covariance.shape != (n, n):
            raise ValueError(f"covariance must be ({n}, {n}), got {self.covariance.shape}")
        if not 0.0 < self.forgetting <= 1.0:
            raise ValueError(f"forgetting must lie in (0, 1], got {self.forgetting!r}")
        if not self.noise_variance > 0.0:
            raise ValueError(f"noise_variance must be positive, got {self.noise_variance!r}")
        self.prior_covariance = self.covariance.copy()

    def reset_prior(self, mean: FloatArray, covariance: FloatArray) -> None:
        """Replace the prior (and the current estimate) by ``mean`` and ``covariance``."""
        self.mean = np.array(mean, dtype=float)
        self.covariance = np.array(covariance, dtype=float)
        self.prior_covariance = self.covariance.copy()

    def predict(self, x: FloatArray) -> tuple[float, float]:
        """``(mean, standard deviation)`` of ``x . theta`` (parameter uncertainty only)."""
        px = self.covariance @ x
        return float(x @ self.mean), math.sqrt(max(0.0, float(x @ px)))

    def update(self, x: FloatArray, y: float, weight: float = 1.0) -> float:
        """Fold in one sample ``y ~ x . theta`` (``weight`` scales its precision); return
        the innovation (``y`` minus the prediction before the update).

        A sample holding a NaN or an infinity, or one so large that the step overflows
        (a counter gone wild: 1e300 tokens), is refused (counted in ``rejected_nonfinite``,
        NaN returned) and changes nothing: one such sample would make the estimate NaN
        for good, and the model could no longer be saved."""
        if not (math.isfinite(y) and math.isfinite(weight)):
            self.rejected_nonfinite += 1
            return math.nan
        # New arrays, not updated in place: a caller holding the previous estimate
        # keeps it unchanged. The kernel checks ``x`` and its own results for finiteness.
        mean, covariance, innovation, finite = _rls_step(
            self.mean,
            self.covariance,
            self.prior_covariance,
            np.ascontiguousarray(x, dtype=np.float64),
            float(y),
            self.forgetting,
            self.noise_variance / max(weight, 1e-9),
        )
        if not finite:
            self.rejected_nonfinite += 1
            return math.nan
        self.mean, self.covariance = mean, covariance
        self.samples += 1
        beta = 0.05 if self.samples > 20 else 1.0 / self.samples
        self.residual_ms = (1.0 - beta) * self.residual_ms + beta * innovation * innovation
        self.noise_variance = max(
            (1.0 - beta) * self.noise_variance + beta * innovation * innovation,
            NOISE_FLOOR,
        )
        return innovation

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "mean": self.mean.tolist(),
            "covariance": self.covariance.tolist(),
            "prior_covariance": self.prior_covariance.tolist(),
            "noise_variance": self.noise_variance,
            "forgetting": self.forgetting,
            "samples": self.samples,
            "residual_ms": self.residual_ms,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (shapes checked).

        Raises:
            ValueError: a shape or value does not fit this regression.
        """
        mean = np.asarray(state["mean"], dtype=float)
        covariance = np.asarray(state["covariance"], dtype=float)
        prior = np.asarray(state["prior_covariance"], dtype=float)
        n = self.mean.size
        if mean.shape != (n,) or covariance.shape != (n, n) or prior.shape != (n, n):
            raise ValueError(f"stored regression has the wrong shape (expected {n} parameters)")
        if not all(bool(np.isfinite(array).all()) for array in (mean, covariance, prior)):
            raise ValueError("stored regression holds non-finite numbers")
        for name, matrix in (("covariance", covariance), ("prior_covariance", prior)):
            scale = float(np.abs(matrix).max(initial=0.0))
            if not np.allclose(matrix, matrix.T, rtol=0.0, atol=1e-9 * max(scale, 1.0)):
                raise ValueError(f"stored {name} is not symmetric")
            if bool((np.diag(matrix) < 0.0).any()):
                raise ValueError(f"stored {name} has a negative variance")
            lowest = float(np.linalg.eigvalsh(matrix)[0])
            if lowest < -PSD_TOLERANCE * max(scale, 1.0):
                raise ValueError(
                    f"stored {name} is not positive semi-definite (eigenvalue {lowest:.3g})"
                )
        largest = float(np.linalg.eigvalsh(covariance)[-1])
        ceiling = MAX_COVARIANCE_GROWTH * max(float(np.linalg.eigvalsh(prior)[-1]), 0.0)
        if largest > ceiling and largest > PSD_TOLERANCE:
            raise ValueError(
                f"stored covariance ({largest:.3g}) is over {MAX_COVARIANCE_GROWTH:g} times "
                "its prior's: learning only shrinks it towards the prior"
            )
        noise = float(state["noise_variance"])
        if not noise > 0.0 or not math.isfinite(noise):
            raise ValueError(f"stored noise_variance must be positive, got {noise!r}")
        samples = float(state["samples"])
        if not (math.isfinite(samples) and 0.0 <= samples <= MAX_STORED_COUNT):
            raise ValueError(f"stored samples must be a count, got {state['samples']!r}")
        residual = float(state["residual_ms"])
        if not (math.isfinite(residual) and residual >= 0.0):
            raise ValueError(f"stored residual_ms must be finite and >= 0, got {residual!r}")
        self.mean, self.covariance, self.prior_covariance = mean, covariance, prior
        self.noise_variance = noise
        self.samples = int(samples)
        self.residual_ms = residual


PSD_TOLERANCE = 1e-9
"""A stored covariance's most negative eigenvalue may be this much of its largest entry
(rounding); below, the matrix is no covariance and the file is refused."""
MAX_COVARIANCE_GROWTH = 1e6
"""A stored covariance's largest eigenvalue may be at most this many times its prior's:
each step relaxes it towards the prior and then shrinks it, so a learned one never grows
past the prior's (the files written so far stay below 1x)."""
MAX_STORED_COUNT = 2.0**53
"""The largest count a stored model may hold (a float's exact integers; a year of windows
every 0.25 s is about 1.3e8)."""


@jit
def _rls_step(
    mean: FloatArray,
    covariance: FloatArray,
    prior_covariance: FloatArray,
    x: FloatArray,
    y: float,
    forgetting: float,
    noise: float,
) -> tuple[FloatArray, FloatArray, float, bool]:
    """One Kalman/RLS step of :meth:`RecursiveLeastSquares.update` (compiled: a few
    microseconds against tens for the numpy operations one by one): the covariance
    relaxed towards the prior by the forgetting, the gain, the new mean and the new
    covariance (symmetrised against rounding), the innovation, and whether ``x``, the
    squared innovation and the new estimate are all finite (where not, the step is
    refused: an ``x`` that is not is not stepped at all)."""
    n = mean.size
    for i in range(n):
        if not math.isfinite(x[i]):
            return mean, covariance, math.nan, False
    relaxed = forgetting * covariance + (1.0 - forgetting) * prior_covariance
    px = np.zeros(n)
    for i in range(n):
        total = 0.0
        for j in range(n):
            total += relaxed[i, j] * x[j]
        px[i] = total
    predicted = 0.0
    variance = noise
    for i in range(n):
        predicted += x[i] * mean[i]
        variance += x[i] * px[i]
    innovation = y - predicted
    gain = px / variance
    new_mean = mean + gain * innovation
    finite = math.isfinite(innovation * innovation)
    new_covariance = np.empty((n, n))
    for i in range(n):
        finite = finite and math.isfinite(new_mean[i])
        new_covariance[i, i] = relaxed[i, i] - gain[i] * px[i]
        finite = finite and math.isfinite(new_covariance[i, i])
        for j in range(i + 1, n):
            upper = relaxed[i, j] - gain[i] * px[j]
            lower = relaxed[j, i] - gain[j] * px[i]
            value = 0.5 * (upper + lower)
            new_covariance[i, j] = value
            new_covariance[j, i] = value
            finite = finite and math.isfinite(value)
    return new_mean, new_covariance, innovation, finite


def compile_regression() -> None:
    """Compile (or load from numba's cache) the regression's kernel once per process,
    on a tiny input, so no control period pays the compile time."""
    one = np.ones(1)
    _rls_step(one, np.ones((1, 1)), np.ones((1, 1)), one, 1.0, 0.5, 1.0)
