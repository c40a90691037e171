"""Fit the roofline's efficiency parameters to measured kernel timings (Vidur extracts).

The measured points are small extracts of microsoft/vidur's profiling data committed under
``profiles/calibration/`` (see its ATTRIBUTION.md): the per-layer time of the non-attention
operators (QKV, O, gated MLP projections, norms, RoPE, activation, residual add) at the
max clock for several Llama-family models, token counts and TP degrees, and intra-node
all-reduce times. :func:`fit_efficiency` fits, per GPU, the achievable bandwidth fraction,
the GEMM MFU, the per-layer launch overhead and the roofline knee sharpness of

    ``t_layer(N) = (t_mem**n + t_gemm(N)**n)**(1/n) + N * e / BW + t_launch``

with ``t_mem = W_layer / BW``, ``t_gemm = 2 P_layer N / (MFU F)`` and ``e`` the element-wise
bytes per token per layer. Fitted values are rounded to 4 significant digits so the
generated profiles are byte-stable across platforms.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

VIDUR_REPO = "microsoft/vidur"
LINEAR_FILE = "vidur_linear_ops.csv"
ALL_REDUCE_FILE = "vidur_all_reduce.csv"
# Datasheet peak and bandwidth of the boards the extracts were measured on (max clock).
MEASURED_BOARDS = {
    "a100": (108 * 2048, 1410.0, 2.039e12),
    "h100": (132 * 4096, 1980.0, 3.35e12),
}


@dataclass(frozen=True, slots=True)
class LayerShape:
    """Per-GPU shape of one decoder layer under tensor parallelism."""

    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    tensor_parallel: int
    experts_per_token: int = 0

    @property
    def head_dim(self) -> int:
        """Head dimension."""
        return self.d_model // self.n_heads

    @property
    def active_params(self) -> float:
        """Weights a token multiplies per layer per GPU (QKV, O, gated MLP or k experts)."""
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        mlp = 3 * d * self.d_ff * max(1, self.experts_per_token)
        return (d * (d + 2 * kv) + d * d + mlp) / self.tensor_parallel

    @property
    def elementwise_bytes_per_token(self) -> float:
        """BF16 bytes per token the layer's element-wise operators move (norms, RoPE, act, add)."""
        d, kv, tp = self.d_model, self.n_kv_heads * self.head_dim, self.tensor_parallel
        return 2.0 * (4 * d + 2 * (d + kv) / tp + 3 * self.d_ff / tp + 3 * d)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Fitted efficiency of one GPU kind (max clock); see the module docstring."""

    bandwidth_fraction: float
    gemm_mfu: float
    layer_launch_s: float
    knee_sharpness: float


@dataclass(frozen=True, slots=True)
class LinearPoint:
    """One measured per-layer time from the Vidur extract."""

    gpu: str
    model: str
    shape: LayerShape
    num_tokens: int
    layer_s: float


def calibration_dir() -> Path:
    """Directory of the committed measured-data extracts."""
    return Path(str(resources.files("gpugov.profiles"))) / "calibration"


def _rows(name: str) -> tuple[str, list[dict[str, str]]]:
    """(provenance comment line, rows) of one extract."""
    lines = (calibration_dir() / name).read_text(encoding="ascii").splitlines()
    comment = lines[0].lstrip("# ").strip()
    return comment, list(csv.DictReader(line for line in lines[1:]))


def source_commit() -> str:
    """The vidur commit the extracts were taken from."""
    comment, _ = _rows(LINEAR_FILE)
    return comment.split()[0].split("@")[1]


@lru_cache(maxsize=1)
def linear_points() -> tuple[LinearPoint, ...]:
    """Every measured per-layer point, deduplicated by (gpu, model, tp, tokens) (mean)."""
    _, rows = _rows(LINEAR_FILE)
    grouped: dict[tuple[str, str, int, int], list[dict[str, str]]] = {}
    for row in rows:
        key = (row["gpu"], row["model"], int(row["tp"]), int(row["num_tokens"]))
        grouped.setdefault(key, []).append(row)
    points = []
    for (gpu, model, tp, tokens), group in sorted(grouped.items()):
        first = group[0]
        shape = LayerShape(
            int(first["d_model"]),
            int(first["d_ff"]),
            int(first["n_heads"]),
            int(first["n_kv_heads"]),
            tp,
        )
        seconds = sum(float(r["layer_ms"]) for r in group) / len(group) * 1e-3
        points.append(LinearPoint(gpu, model, shape, tokens, seconds))
    return tuple(points)


def layer_time_s(
    shape: LayerShape,
    tokens: float,
    eff: Efficiency,
    peak_flops: float,
    bandwidth: float,
    weight_bytes: float | None = None,
    imbalance: float = 1.0,
) -> float:
    """Model time of one layer's non-attention operators over ``tokens`` tokens, seconds.

    ``weight_bytes`` overrides the streamed bytes (MoE: only routed experts are read);
    ``imbalance`` scales the GEMM time (the most-loaded expert sets the pace).
    """
    streamed = 2.0 * shape.active_params if weight_bytes is None else weight_bytes
    t_mem = streamed / bandwidth
    t_gemm = imbalance * 2.0 * shape.active_params * tokens / (eff.gemm_mfu * peak_flops)
    n = eff.knee_sharpness
    knee = (t_mem**n + t_gemm**n) ** (1.0 / n)
    return knee + tokens * shape.elementwise_bytes_per_token / bandwidth + eff.layer_launch_s


def _predict(point: LinearPoint, eff: Efficiency) -> float:
    per_clock, clock_mhz, bandwidth = MEASURED_BOARDS[point.gpu]
    peak = per_clock * clock_mhz * 1e6
    return layer_time_s(
        point.shape, point.num_tokens, eff, peak, eff.bandwidth_fraction * bandwidth
    )


def _sig(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


@cache
def fit_efficiency(gpu: str) -> Efficiency:
    """Least-squares fit (log error) of the four efficiency parameters for a measured GPU.

    ``gpu == "mean"`` returns the mean of the measured GPUs' fits, used for boards with no
    measured timings (an assumption stated in their manifests).
    """
    if gpu == "mean":
        fits = [fit_efficiency(g) for g in sorted(MEASURED_BOARDS)]
        return Efficiency(
            *(
                _sig(float(np.mean([getattr(f, name) for f in fits])))
                for name in Efficiency.__slots__
            )
        )
    points = [p for p in linear_points() if p.gpu == gpu]
    measured = np.array([p.layer_s for p in points])

    def residual(x: np.ndarray) -> np.ndarray:
        eff = Efficiency(float(x[0]), float(x[1]), float(x[2]) * 1e-3, float(x[3]))
        return np.log(np.array([_predict(p, eff) for p in points]) / measured)

    result = least_squares(
        residual, [0.8, 0.6, 0.05, 2.0], bounds=([0.3, 0.2, 0.0, 1.0], [1.0, 1.0, 1.0, 10.0])
    )
    x = result.x
    return Efficiency(_sig(x[0]), _sig(x[1]), _sig(x[2] * 1e-3), _sig(x[3]))


def efficiency_fit_quality(gpu: str) -> dict[str, float | int]:
    """Point count, RMS and max relative error of the fit over all of ``gpu``'s points."""
    eff = fit_efficiency(gpu)
    errors = [_predict(p, eff) / p.layer_s - 1.0 for p in linear_points() if p.gpu == gpu]
    return {
        "points": len(errors),
        "rms_relative_error": _sig(math.sqrt(sum(e * e for e in errors) / len(errors)), 3),
        "max_relative_error": _sig(max(abs(e) for e in errors), 3),
    }


def predict_point(point: LinearPoint) -> float:
    """Model per-layer time of a measured point with its GPU's fitted efficiency."""
    return _predict(point, fit_efficiency(point.gpu))


@lru_cache(maxsize=1)
def all_reduce_points() -> dict[tuple[str, int], list[tuple[int, float]]]:
    """Measured all-reduce medians: (gpu, workers) -> [(bytes, seconds)], deduplicated."""
    _, rows = _rows(ALL_REDUCE_FILE)
    table: dict[tuple[str, int], dict[int, float]] = {}
    for row in rows:
        key = (row["gpu"], int(row["workers"]))
        table.setdefault(key, {}).setdefault(int(row["size_bytes"]), float(row["median_ms"]) * 1e-3)
    return {key: sorted(sizes.items()) for key, sizes in sorted(table.items())}


@cache
def fit_all_reduce(gpu: str, workers: int) -> tuple[float, float]:
    """(latency_s, bus bytes/s) of ``t = alpha + bytes / beta`` fitted in log error."""
    points = all_reduce_points()[(gpu, workers)]
    sizes = np.array([s for s, _ in points], dtype=float)
    times = np.array([t for _, t in points])

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log((x[0] * 1e-6 + sizes / (x[1] * 1e9)) / times)

    result = least_squares(residual, [30.0, 200.0], bounds=([0.0, 1.0], [1e4, 1e4]))
    return _sig(result.x[0] * 1e-6), _sig(result.x[1] * 1e9)


def all_reduce_s(gpu: str, workers: int, size_bytes: float) -> float:
    """Model all-reduce time over ``workers`` GPUs of ``gpu``'s node (0 when workers == 1)."""
    if workers <= 1:
        return 0.0
    alpha, beta = fit_all_reduce(gpu, workers)
    return alpha + size_bytes / beta
