"""Fit the roofline's efficiency parameters to measured kernel timings (Vidur extracts).

The measured points are small extracts of microsoft/vidur's profiling data committed under
``profiles/calibration/`` (see its ATTRIBUTION.md): the per-layer time of the non-attention
operators (QKV, O, gated MLP projections, norms, RoPE, activation, residual add) at the
max clock for several Llama-family models, token counts and TP degrees, and intra-node
all-reduce times. :func:`fit_efficiency` fits, per GPU, the achievable bandwidth fraction,
the GEMM MFU, the per-layer launch overhead and the roofline knee sharpness of

    ``t_layer(N) = (t_mem**n + t_gemm(N)**n)**(1/n) + N * e / BW + t_launch``

with ``t_mem = W_layer / BW``, ``t_gemm = 2 P_layer N / (MFU F)`` and ``e`` the element-wise
bytes per token per layer. :func:`fit_attention` fits the decode attention kernel,

    ``t_attn(B, L) = t_attn_launch + B * L * b_kv / (r * BW)``

per layer and GPU (``b_kv`` the layer's KV bytes per token on that GPU, ``r`` the
attention kernel's achieved bandwidth relative to the linear operators' ``BW``), to
Vidur's measured A100 decode-attention timings. :func:`fit_all_reduce` fits NCCL's
all-reduce as the faster of two latency + size / bandwidth lines (NCCL picks, per message
size, between a low-latency protocol and a high-bandwidth one). Fitted values are rounded to
4 significant digits so the generated profiles are byte-stable across platforms.
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

LINEAR_FILE = "vidur_linear_ops.csv"
ALL_REDUCE_FILE = "vidur_all_reduce.csv"
ATTENTION_FILES = ("vidur_attention_decode.csv", "vidur_attention_decode_llama3_8b.csv")
ATTENTION_GPU = "a100"
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


@cache
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


def _two_protocol_s(x: tuple[float, ...], size_bytes: np.ndarray | float) -> np.ndarray:
    """``min(a1 + s / b1, a2 + s / b2)`` with latencies in us and bandwidths in GB/s."""
    low = x[0] * 1e-6 + np.asarray(size_bytes, dtype=float) / (x[1] * 1e9)
    high = x[2] * 1e-6 + np.asarray(size_bytes, dtype=float) / (x[3] * 1e9)
    return np.minimum(low, high)


@cache
def fit_all_reduce(gpu: str, workers: int) -> tuple[float, float, float, float]:
    """``(alpha_ll_s, beta_ll, alpha_s, beta)`` of ``t = min(alpha_ll + s / beta_ll,
    alpha + s / beta)`` (bytes/s), fitted in log error from three fixed starts.

    NCCL's own tuning model is a latency plus size over bandwidth per protocol, taking the
    fastest: the low-latency protocol wins for small messages, the bandwidth one for large.
    """
    points = all_reduce_points()[(gpu, workers)]
    sizes = np.array([s for s, _ in points], dtype=float)
    times = np.array([t for _, t in points])

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(_two_protocol_s(tuple(x), sizes) / times)

    best = None
    for start in ([5.0, 20.0, 30.0, 300.0], [5.0, 50.0, 20.0, 200.0], [2.0, 10.0, 40.0, 400.0]):
        result = least_squares(residual, start, bounds=([0.0, 0.1, 0.0, 1.0], [1e3, 1e4, 1e3, 1e4]))
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    a1, b1, a2, b2 = (float(v) for v in best.x)
    if a2 < a1:  # name the lower-latency line first
        a1, b1, a2, b2 = a2, b2, a1, b1
    return _sig(a1 * 1e-6), _sig(b1 * 1e9), _sig(a2 * 1e-6), _sig(b2 * 1e9)


def all_reduce_s(gpu: str, workers: int, size_bytes: float) -> float:
    """Model all-reduce time over ``workers`` GPUs of ``gpu``'s node (0 when workers == 1).
    A group size Vidur did not measure uses the nearest measured one (2, 4 or 8)."""
    if workers <= 1:
        return 0.0
    measured = [n for g, n in all_reduce_points() if g == gpu]
    if measured and workers not in measured:
        workers = min(measured, key=lambda n: (abs(n - workers), n))
    a1, b1, a2, b2 = fit_all_reduce(gpu, workers)
    return float(_two_protocol_s((a1 * 1e6, b1 / 1e9, a2 * 1e6, b2 / 1e9), size_bytes))


@dataclass(frozen=True, slots=True)
class AttentionPoint:
    """One measured decode-attention kernel time (one layer, one GPU of the TP group)."""

    gpu: str
    model: str
    backend: str
    source_file: str
    tensor_parallel: int
    kv_heads_per_gpu: int
    head_dim: int
    batch: int
    context_tokens: int
    layer_s: float

    @property
    def kv_bytes(self) -> float:
        """BF16 K and V bytes the kernel reads on one GPU for one layer."""
        return 2.0 * 2.0 * self.kv_heads_per_gpu * self.head_dim * self.batch * self.context_tokens


@dataclass(frozen=True, slots=True)
class AttentionEfficiency:
    """Fitted decode-attention kernel: launch time and bandwidth relative to ``BW``."""

    launch_s: float
    relative_bandwidth: float


@cache
def attention_source(name: str) -> str:
    """The provenance comment of one attention extract."""
    comment, _ = _rows(name)
    return comment


@lru_cache(maxsize=1)
def attention_points() -> tuple[AttentionPoint, ...]:
    """Every measured decode-attention point, deduplicated by shape, batch and context (mean)."""
    grouped: dict[tuple[str, str, str, str, int, int, int, int, int], list[float]] = {}
    for name in ATTENTION_FILES:
        _, rows = _rows(name)
        for row in rows:
            tp = int(row["tp"])
            key = (
                row["gpu"],
                row["model"],
                row["backend"],
                name,
                tp,
                int(row["n_kv_heads"]) // tp,
                int(row["head_dim"]),
                int(row["batch"]),
                int(row["kv_tokens"]),
            )
            grouped.setdefault(key, []).append(float(row["attn_ms"]) * 1e-3)
    return tuple(
        AttentionPoint(*key, layer_s=sum(times) / len(times))
        for key, times in sorted(grouped.items())
    )


def a100_llama3_8b_decode_points(
    batch: int, context_tokens: int
) -> tuple[LinearPoint, AttentionPoint]:
    """Vidur's A100 Llama-3-8B (TP 1) kernels of one decode iteration: the linear
    operators at ``batch`` tokens and decode attention for ``batch`` sequences of
    ``context_tokens`` (the only model with both tables; StopIteration when unmeasured)."""
    linear = next(
        p
        for p in linear_points()
        if (p.gpu, p.model, p.shape.tensor_parallel, p.num_tokens)
        == ("a100", "Llama-3-8B", 1, batch)
    )
    attention = next(
        p
        for p in attention_points()
        if (p.model, p.tensor_parallel, p.batch, p.context_tokens)
        == ("Llama-3-8B", 1, batch, context_tokens)
    )
    return linear, attention


def attention_time_s(eff: AttentionEfficiency, kv_bytes: float, bandwidth: float) -> float:
    """Model decode-attention time of one layer on one GPU reading ``kv_bytes``."""
    return eff.launch_s + kv_bytes / (eff.relative_bandwidth * bandwidth)


def _measured_linear_bandwidth(gpu: str) -> float:
    return fit_efficiency(gpu).bandwidth_fraction * MEASURED_BOARDS[gpu][2]


@cache
def fit_attention() -> AttentionEfficiency:
    """Least-squares fit (log error) of the decode-attention launch time and relative
    bandwidth over every measured point (A100; both kernels and shapes weighted per point).
    """
    points = attention_points()
    bandwidth = _measured_linear_bandwidth(ATTENTION_GPU)
    measured = np.array([p.layer_s for p in points])
    kv = np.array([p.kv_bytes for p in points])

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log((x[0] * 1e-6 + kv / (x[1] * bandwidth)) / measured)

    result = least_squares(residual, [15.0, 0.9], bounds=([0.0, 0.1], [1e3, 3.0]))
    return AttentionEfficiency(_sig(result.x[0] * 1e-6), _sig(result.x[1]))


def predict_attention(point: AttentionPoint) -> float:
    """Model time of a measured attention point with the fitted attention efficiency."""
    return attention_time_s(fit_attention(), point.kv_bytes, _measured_linear_bandwidth(point.gpu))


def attention_fit_quality() -> dict[str, float | int]:
    """Point count, RMS and max relative error of the attention fit over all points."""
    errors = [predict_attention(p) / p.layer_s - 1.0 for p in attention_points()]
    return {
        "points": len(errors),
        "rms_relative_error": _sig(math.sqrt(sum(e * e for e in errors) / len(errors)), 3),
        "max_relative_error": _sig(max(abs(e) for e in errors), 3),
    }
