"""Roofline model that derives the bundled, literature-derived GPU performance profiles.

Run ``python -m gpugov.plant.roofline --out profiles/`` to regenerate ``profiles/<name>.csv`` and
``profiles/<name>.json`` byte for byte. Nothing here is measured: every number is either a
published figure (``/work/shared/PROFILE_FACTS.md`` or an NVIDIA datasheet/whitepaper, each
cited in the manifest's ``sources``) or an assumption listed in the manifest's
``assumptions``. The model serves Llama-3.1-8B-Instruct in BF16 on one GPU (TP=1) under
vLLM-style continuous batching.

Notation: ``f`` SM clock (MHz), ``f_max`` the top supported clock, ``P`` parameter count
(8.03e9), ``W = 2 P`` weight bytes, ``b_kv = 2 (K,V) * n_layers * n_kv_heads * head_dim *
2 B = 131072 B`` KV-cache bytes per token, ``B_ref`` / ``L_ref`` the reference decode batch
and per-sequence context, ``L_p`` the reference prompt length.

Compute and bandwidth
    ``F(f) = n_SM * flops_per_SM_per_clock * f`` is the dense BF16 tensor peak, linear in
    the SM clock (H100/H200: 132 SMs * 4096 FLOP/clk gives the datasheet 989 TFLOPS at
    1830 MHz and 1070 TFLOPS at 1980 MHz; A100: 108 * 2048 FLOP/clk gives 312 TFLOPS at
    1410 MHz). Achievable HBM bandwidth is ``BW_a = eta_bw * BW_datasheet``. The SMs
    must issue the loads, so bandwidth sags at low clock:
    ``BW(f) = BW_a * x / (1 + x**n)**(1/n)`` with ``x = f / f_need`` and
    ``f_need = BW_a / (n_SM * r)``, ``r`` the bytes per SM per clock the load path
    sustains; a smooth minimum of "HBM-bound" and "issue-bound" with sharpness ``n``.

Prefill (compute-bound)
    ``prefill_tokens_per_s(f) = MFU * F(f) / (2 P + 2 n_layers d_model L_p)``; the second
    term is causal attention at the reference prompt (QK and PV, mean context ``L_p/2``).

Decode (memory-bound, weakly clock dependent), one iteration at ``B_ref`` and ``L_ref``
    ``t_w(f) = W / BW(f)`` (weights), ``t_kv(f) = B_ref L_ref b_kv / BW(f)`` (KV read),
    ``t_c(f) = (1 - omega) * 2 P B_ref / F(f)`` (GEMM compute not hidden under the weight
    stream; ``omega`` the overlap), ``t_tok = B_ref * tau_tok`` (per-sequence sampling and
    scheduling), ``t_fix`` (fixed per-iteration launch/scheduler cost);
    ``t_iter(f) = t_w + t_kv + t_c + t_tok + t_fix`` and
    ``decode_tokens_per_s(f) = B_ref / t_iter(f)``.
    ``decode_latency_model`` holds the shares of ``t_iter(f_max)``: weight =
    ``(t_w + t_fix) / t_iter`` (batch- and context-independent), batch =
    ``(t_c + t_tok) / t_iter`` (proportional to batch), kv = ``t_kv / t_iter``.

Voltage and power
    Relative voltage ``v(f) = v_min`` below the knee ``f_knee = k_knee * f_max`` and
    linear to 1 at ``f_max``; dynamic scale ``d(f) = v(f)**2 * f / f_max`` (C V^2 f).
    ``idle_power_w(f) = P_bare + (P_ctx - P_bare) * (1 - kappa + kappa * d(f))``: the
    published bare idle plus the CUDA-context overhead, a share ``kappa`` of which scales
    with ``d(f)`` (equal to the published idle-with-context at ``f_max``).
    ``prefill_power_w(f) = idle(f) + P_core * d(f)`` with
    ``P_core = rho * TDP - idle(f_max)``, so prefill reaches ``rho * TDP`` (< TDP) at
    ``f_max``.
    ``decode_power_w(f) = idle(f) + e_hbm * (W + B_ref L_ref b_kv) / t_iter(f)
    + lambda * P_core * d(f) * a(f)`` with ``a(f) = min(1, (2 P B_ref / F(f)) /
    (MFU * t_iter(f)))`` the tensor activity relative to prefill. ``lambda`` is the one
    calibrated constant: it puts the H200 decode power at the reference batch and
    ``f_max`` at the top of the published 137-300 W decode range and is then used
    unchanged for all GPUs. Energy per token is ``power / rate``; the idle term favours
    high clocks and the ``v**2`` term low ones, so both phases are U-shaped in ``f``.

Decode power vs batch (``decode_power_batch_model``)
    ML.ENERGY's logistic ``P(B) = idle + L * sigmoid(k (log2 B - x0))`` fitted to the
    H100 anchors (batch 1 ~ 300 W, batch 128 ~ 600 W, idle-with-context 121.7 W) with
    one added assumption, that batch 128 reaches ``s_sat`` of the plateau:
    ``k (7 - x0) = logit(s_sat)`` and ``-k x0 = logit(s_sat * (P1 - idle) / (P128 - idle))``.
    Only the shape (``k``, ``x0``) is kept; the absolute level comes from the decode power
    above (see ``profiles/README.md`` for why).

Engine and thermal
    ``kv_capacity_tokens = (HBM * u_mem - W - activations) / b_kv``. Steady-state
    temperature at TDP is ``ambient + R * TDP``, chosen just below ``thermal_limit_c``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GENERATOR = "plant/roofline.py v1"
CLOCK_STEP_MHZ = 15

CSV_HEADER = (
    "clock_mhz,prefill_tokens_per_s,decode_tokens_per_s,prefill_power_w,decode_power_w,idle_power_w"
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Transformer shape of the served model (Llama-3.1-8B-Instruct, BF16)."""

    name: str
    parameter_count: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    bytes_per_value: int

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights read per forward pass."""
        return float(self.parameter_count * self.bytes_per_value)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token: K and V for every layer and KV head."""
        return float(2 * self.n_layers * self.n_kv_heads * self.head_dim * self.bytes_per_value)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Published (or derived) figures of one GPU board; units in every name."""

    key: str
    gpu: str
    min_clock_mhz: int
    max_clock_mhz: int
    idle_clock_mhz: int
    max_memory_clock_mhz: int
    sm_count: int
    dense_bf16_flops_per_sm_per_clock: int
    hbm_bandwidth_bytes_per_s: float
    hbm_capacity_bytes: float
    hbm_energy_pj_per_bit: float
    tdp_w: float
    bare_idle_power_w: float
    context_idle_power_w: float
    thermal_resistance_c_per_w: float

    def __post_init__(self) -> None:
        span = self.max_clock_mhz - self.min_clock_mhz
        if span <= 0 or span % CLOCK_STEP_MHZ:
            raise ValueError(
                f"{self.key}: clock range {self.min_clock_mhz}-{self.max_clock_mhz} MHz is "
                f"not a positive multiple of {CLOCK_STEP_MHZ} MHz"
            )


@dataclass(frozen=True, slots=True)
class RooflineParameters:
    """Assumed model constants shared by every GPU (each listed as an assumption)."""

    prefill_mfu: float = 0.55
    achievable_bandwidth_fraction: float = 0.80
    decode_compute_overlap: float = 0.5
    sm_load_bytes_per_clock: float = 128.0
    bandwidth_knee_sharpness: float = 4.0
    fixed_iteration_overhead_s: float = 0.6e-3
    per_sequence_overhead_s: float = 5e-6
    voltage_min_fraction: float = 0.70
    voltage_knee_fraction_of_max_clock: float = 0.50
    idle_context_clock_share: float = 0.30
    prefill_power_fraction_of_tdp: float = 0.95
    h200_decode_power_at_max_clock_w: float = 290.0
    reference_batch_size: int = 64
    reference_context_tokens: int = 1260
    reference_prompt_tokens: int = 1155
    max_batch_size: int = 256
    gpu_memory_utilization: float = 0.90
    activation_reserve_bytes: float = 2e9
    logistic_anchor_batch1_w: float = 300.0
    logistic_anchor_batch128_w: float = 600.0
    logistic_anchor_idle_w: float = 121.7
    logistic_saturation_at_batch128: float = 0.95
    ttft_slo_s: float = 1.0
    tpot_slo_s: float = 0.05
    ambient_temperature_c: float = 30.0
    thermal_time_constant_s: float = 40.0
    thermal_limit_c: float = 87.0


LLAMA_31_8B = ModelSpec(
    name="Llama-3.1-8B-Instruct (BF16, TP=1)",
    parameter_count=8_030_261_248,
    n_layers=32,
    n_kv_heads=8,
    head_dim=128,
    d_model=4096,
    bytes_per_value=2,
)

GPUS: dict[str, GpuSpec] = {
    "h100-sxm-llama3-8b": GpuSpec(
        key="h100-sxm-llama3-8b",
        gpu="NVIDIA H100 SXM5 80GB HBM3",
        min_clock_mhz=345,
        max_clock_mhz=1980,
        idle_clock_mhz=345,
        max_memory_clock_mhz=2619,
        sm_count=132,
        dense_bf16_flops_per_sm_per_clock=4096,
        hbm_bandwidth_bytes_per_s=3.35e12,
        hbm_capacity_bytes=80e9,
        hbm_energy_pj_per_bit=3.5,
        tdp_w=700.0,
        bare_idle_power_w=71.8,
        context_idle_power_w=121.7,
        thermal_resistance_c_per_w=0.078,
    ),
    "h200-sxm-llama3-8b": GpuSpec(
        key="h200-sxm-llama3-8b",
        gpu="NVIDIA H200 SXM 141GB HBM3e",
        min_clock_mhz=345,
        max_clock_mhz=1980,
        idle_clock_mhz=345,
        max_memory_clock_mhz=3201,
        sm_count=132,
        dense_bf16_flops_per_sm_per_clock=4096,
        hbm_bandwidth_bytes_per_s=4.8e12,
        hbm_capacity_bytes=141e9,
        hbm_energy_pj_per_bit=3.5,
        tdp_w=700.0,
        bare_idle_power_w=71.8,
        # H100's 121.7 W plus the <0.02 W/GB occupancy bound on the 0.9 * 61 GB more
        # memory vLLM fills: the same GH100 die at the same TDP.
        context_idle_power_w=round(121.7 + 0.02 * 0.9 * (141 - 80), 1),
        thermal_resistance_c_per_w=0.078,
    ),
    "a100-sxm-80gb-llama3-8b": GpuSpec(
        key="a100-sxm-80gb-llama3-8b",
        gpu="NVIDIA A100 SXM4 80GB HBM2e",
        min_clock_mhz=510,
        max_clock_mhz=1410,
        idle_clock_mhz=210,
        max_memory_clock_mhz=1593,
        sm_count=108,
        dense_bf16_flops_per_sm_per_clock=2048,
        hbm_bandwidth_bytes_per_s=2.039e12,
        hbm_capacity_bytes=80e9,
        hbm_energy_pj_per_bit=4.0,
        tdp_w=400.0,
        bare_idle_power_w=53.7,
        context_idle_power_w=80.0,
        thermal_resistance_c_per_w=0.135,
    ),
}


# ------------------------------------------------------------------------ physics
def clock_grid_mhz(gpu: GpuSpec) -> list[int]:
    """Supported SM clocks in MHz: the 15 MHz grid from the floor up to exactly the max."""
    return list(range(gpu.min_clock_mhz, gpu.max_clock_mhz + 1, CLOCK_STEP_MHZ))


def peak_flops(gpu: GpuSpec, clock_mhz: float) -> float:
    """Dense BF16 tensor peak in FLOP/s at ``clock_mhz`` (linear in the SM clock)."""
    return gpu.sm_count * gpu.dense_bf16_flops_per_sm_per_clock * clock_mhz * 1e6


def achieved_bandwidth(gpu: GpuSpec, params: RooflineParameters, clock_mhz: float) -> float:
    """Achieved HBM bandwidth in bytes/s: ``BW_a * x / (1 + x**n)**(1/n)``, x = f / f_need."""
    achievable = params.achievable_bandwidth_fraction * gpu.hbm_bandwidth_bytes_per_s
    need_mhz = achievable / (gpu.sm_count * params.sm_load_bytes_per_clock) / 1e6
    x = clock_mhz / need_mhz
    n = params.bandwidth_knee_sharpness
    return achievable * x / (1.0 + x**n) ** (1.0 / n)


def prefill_tokens_per_s(
    gpu: GpuSpec, model: ModelSpec, params: RooflineParameters, clock_mhz: float
) -> float:
    """Prefill rate: ``MFU * F(f) / (2 P + 2 n_layers d_model L_p)`` tokens/s."""
    attention = 2.0 * model.n_layers * model.d_model * params.reference_prompt_tokens
    flops_per_token = 2.0 * model.parameter_count + attention
    return params.prefill_mfu * peak_flops(gpu, clock_mhz) / flops_per_token


def decode_iteration_s(
    gpu: GpuSpec, model: ModelSpec, params: RooflineParameters, clock_mhz: float
) -> dict[str, float]:
    """Parts of one decode iteration at the reference batch and context, in seconds."""
    bandwidth = achieved_bandwidth(gpu, params, clock_mhz)
    batch = params.reference_batch_size
    gemm_flops = 2.0 * model.parameter_count * batch
    parts = {
        "weight_s": model.weight_bytes / bandwidth,
        "kv_s": batch * params.reference_context_tokens * model.kv_bytes_per_token / bandwidth,
        "compute_s": (1.0 - params.decode_compute_overlap)
        * gemm_flops
        / peak_flops(gpu, clock_mhz),
        "per_sequence_s": batch * params.per_sequence_overhead_s,
        "fixed_s": params.fixed_iteration_overhead_s,
    }
    parts["total_s"] = sum(parts.values())
    parts["tensor_busy_s"] = gemm_flops / peak_flops(gpu, clock_mhz)
    return parts


def decode_tokens_per_s(
    gpu: GpuSpec, model: ModelSpec, params: RooflineParameters, clock_mhz: float
) -> float:
    """Aggregate decode rate at the reference batch: ``B_ref / t_iter(f)`` tokens/s."""
    total = decode_iteration_s(gpu, model, params, clock_mhz)["total_s"]
    return params.reference_batch_size / total


def voltage_fraction(gpu: GpuSpec, params: RooflineParameters, clock_mhz: float) -> float:
    """Core voltage relative to its value at the max clock (flat below the knee)."""
    knee = params.voltage_knee_fraction_of_max_clock * gpu.max_clock_mhz
    rise = max(0.0, (clock_mhz - knee) / (gpu.max_clock_mhz - knee))
    return params.voltage_min_fraction + (1.0 - params.voltage_min_fraction) * rise


def dynamic_scale(gpu: GpuSpec, params: RooflineParameters, clock_mhz: float) -> float:
    """``v(f)**2 * f / f_max``: dynamic power relative to the max clock (C V^2 f)."""
    return voltage_fraction(gpu, params, clock_mhz) ** 2 * clock_mhz / gpu.max_clock_mhz


def idle_power_w(gpu: GpuSpec, params: RooflineParameters, clock_mhz: float) -> float:
    """Idle board power with the model resident, in watts."""
    share = params.idle_context_clock_share
    overhead = gpu.context_idle_power_w - gpu.bare_idle_power_w
    scale = 1.0 - share + share * dynamic_scale(gpu, params, clock_mhz)
    return gpu.bare_idle_power_w + overhead * scale


def core_power_at_max_w(gpu: GpuSpec, params: RooflineParameters) -> float:
    """``P_core``: prefill power above idle at the max clock, in watts."""
    prefill_max = params.prefill_power_fraction_of_tdp * gpu.tdp_w
    return prefill_max - idle_power_w(gpu, params, gpu.max_clock_mhz)


def prefill_power_w(gpu: GpuSpec, params: RooflineParameters, clock_mhz: float) -> float:
    """Board power while prefilling, in watts: ``idle(f) + P_core * d(f)``."""
    dynamic = core_power_at_max_w(gpu, params) * dynamic_scale(gpu, params, clock_mhz)
    return idle_power_w(gpu, params, clock_mhz) + dynamic


def _decode_power_parts_w(
    gpu: GpuSpec, model: ModelSpec, params: RooflineParameters, clock_mhz: float
) -> tuple[float, float, float]:
    """(idle, HBM, tensor-activity-weighted core at lambda = 1) decode power terms in W."""
    parts = decode_iteration_s(gpu, model, params, clock_mhz)
    bytes_per_iteration = model.weight_bytes + (
        params.reference_batch_size * params.reference_context_tokens * model.kv_bytes_per_token
    )
    memory = gpu.hbm_energy_pj_per_bit * 8e-12 * bytes_per_iteration / parts["total_s"]
    activity = min(1.0, parts["tensor_busy_s"] / (params.prefill_mfu * parts["total_s"]))
    core = core_power_at_max_w(gpu, params) * dynamic_scale(gpu, params, clock_mhz) * activity
    return idle_power_w(gpu, params, clock_mhz), memory, core


def decode_core_activity_scale(model: ModelSpec, params: RooflineParameters) -> float:
    """``lambda``, calibrated so H200 decode power at the max clock hits its target."""
    gpu = GPUS["h200-sxm-llama3-8b"]
    idle, memory, core = _decode_power_parts_w(gpu, model, params, gpu.max_clock_mhz)
    scale = (params.h200_decode_power_at_max_clock_w - idle - memory) / core
    if not 0.0 < scale <= 1.0:
        raise ValueError(f"decode core activity scale must lie in (0, 1], got {scale!r}")
    return scale


def decode_power_w(
    gpu: GpuSpec, model: ModelSpec, params: RooflineParameters, clock_mhz: float
) -> float:
    """Board power while decoding at the reference batch, in watts."""
    idle, memory, core = _decode_power_parts_w(gpu, model, params, clock_mhz)
    return idle + memory + decode_core_activity_scale(model, params) * core


def fit_decode_power_batch_model(params: RooflineParameters) -> tuple[float, float]:
    """(k, x0) of the logistic batch model from the two ML.ENERGY H100 anchors.

    Raises:
        ValueError: if the anchors do not describe power rising with batch.
    """
    rise_1 = params.logistic_anchor_batch1_w - params.logistic_anchor_idle_w
    rise_128 = params.logistic_anchor_batch128_w - params.logistic_anchor_idle_w
    if not 0.0 < rise_1 < rise_128:
        raise ValueError(f"anchors must rise above idle with batch, got {rise_1}, {rise_128}")
    saturation = params.logistic_saturation_at_batch128
    s_1 = saturation * rise_1 / rise_128

    def logit(p: float) -> float:
        return math.log(p / (1.0 - p))

    k_times_x0 = -logit(s_1)
    k = (logit(saturation) + k_times_x0) / math.log2(128)
    return k, k_times_x0 / k


def kv_capacity_tokens(gpu: GpuSpec, model: ModelSpec, params: RooflineParameters) -> int:
    """KV-cache tokens that fit beside the weights under vLLM's memory budget."""
    free = (
        gpu.hbm_capacity_bytes * params.gpu_memory_utilization
        - model.weight_bytes
        - params.activation_reserve_bytes
    )
    return int(free // model.kv_bytes_per_token)


# ----------------------------------------------------------------------- profiles
def profile_table(
    gpu: GpuSpec, model: ModelSpec = LLAMA_31_8B, params: RooflineParameters | None = None
) -> dict[str, list[float]]:
    """Every CSV column over the clock grid (unrounded)."""
    params = params or RooflineParameters()
    clocks = clock_grid_mhz(gpu)
    return {
        "clock_mhz": [float(f) for f in clocks],
        "prefill_tokens_per_s": [prefill_tokens_per_s(gpu, model, params, f) for f in clocks],
        "decode_tokens_per_s": [decode_tokens_per_s(gpu, model, params, f) for f in clocks],
        "prefill_power_w": [prefill_power_w(gpu, params, f) for f in clocks],
        "decode_power_w": [decode_power_w(gpu, model, params, f) for f in clocks],
        "idle_power_w": [idle_power_w(gpu, params, f) for f in clocks],
    }


def render_csv(table: dict[str, list[float]]) -> str:
    """CSV text with fixed decimals (0 for clocks, 1 for rates, 2 for powers)."""
    lines = [CSV_HEADER]
    for i, clock in enumerate(table["clock_mhz"]):
        lines.append(
            f"{int(clock)},{table['prefill_tokens_per_s'][i]:.1f},"
            f"{table['decode_tokens_per_s'][i]:.1f},{table['prefill_power_w'][i]:.2f},"
            f"{table['decode_power_w'][i]:.2f},{table['idle_power_w'][i]:.2f}"
        )
    return "\n".join(lines) + "\n"


def _r(value: float, digits: int = 6) -> float:
    """Round to ``digits`` significant digits so the JSON is stable and readable."""
    return float(f"{value:.{digits}g}")


def _sources(gpu: GpuSpec) -> list[dict[str, str]]:
    facts = "PROFILE_FACTS.md: "
    datasheet = " (not from PROFILE_FACTS)"
    common = [
        {
            "quantity": "decode power range (H200)",
            "value": "137-300 W, never reaches the 700 W cap",
            "source": facts + "arXiv 2605.11999",
        },
        {
            "quantity": "power vs batch anchors (H100 SXM5)",
            "value": "batch 1 ~ 300 W; batch 128 ~ 600 W",
            "source": facts + "ML.ENERGY Benchmark v3.0 via vllm-semantic-router fleet-sim "
            "'Power Model Reference' doc",
        },
        {
            "quantity": "power(batch) model form",
            "value": "y = b0 + L * sigmoid(k * (log2(batch) - x0))",
            "source": facts + "ml-energy/data mlenergy_data/modeling/logistic.py",
        },
        {
            "quantity": "H100 idle with CUDA context (logistic baseline)",
            "value": "121.7 W",
            "source": facts + "arXiv 2605.23918 via sgl-project/sglang issue #27567",
        },
        {
            "quantity": "energy vs frequency shape",
            "value": "U-shaped; 1410 -> 1005 MHz gives a sub-linear time increase (A100)",
            "source": facts + "VoltanaLLM project page / blog",
        },
        {
            "quantity": "decode frequency sensitivity",
            "value": "largely frequency-insensitive; max -> min clock 1-6% latency",
            "source": facts + "arXiv 2501.08219v4",
        },
        {
            "quantity": "H100 vs A100",
            "value": "3.43x compute, 1.64x memory bandwidth (used as a cross-check)",
            "source": facts + "Splitwise (ISCA'24)",
        },
        {
            "quantity": "Llama-3.1-8B shape",
            "value": "8,030,261,248 parameters; 32 layers; 8 KV heads; head_dim 128; d_model 4096",
            "source": "Meta Llama-3.1-8B-Instruct model card/config (not from PROFILE_FACTS)",
        },
        {
            "quantity": "vLLM defaults",
            "value": "gpu_memory_utilization 0.9; max_num_seqs 256",
            "source": "vLLM engine arguments documentation (not from PROFILE_FACTS)",
        },
        {
            "quantity": "reference prompt / output length",
            "value": "mean prompt ~1155 tokens, mean output ~211 tokens (conversation)",
            "source": "Azure LLM inference trace 2023, conversation split, as quoted in the "
            "project brief (not from PROFILE_FACTS; not re-verified here)",
        },
    ]
    per_gpu: dict[str, list[dict[str, str]]] = {
        "h100-sxm-llama3-8b": [
            {
                "quantity": "max SM / memory clock",
                "value": "1980 / 2619 MHz",
                "source": facts + "AWS EC2 'optimize GPU' doc (nvidia-smi -ac 2619,1980)",
            },
            {
                "quantity": "idle SM clock (profile floor)",
                "value": "345 MHz",
                "source": facts + "amazon-eks-ami PR #1985; sglang issue #27567",
            },
            {"quantity": "TDP", "value": "700 W", "source": facts + "hmc-tech; glennklockwood"},
            {
                "quantity": "bare idle vs idle with CUDA context",
                "value": "71.8 W vs 121.7 W",
                "source": facts + "arXiv 2605.23918 via sglang issue #27567",
            },
            {
                "quantity": "dense BF16 peak",
                "value": "989 TFLOPS (132 SMs x 4096 FLOP/clk at 1830 MHz)",
                "source": "NVIDIA H100 datasheet / Hopper whitepaper" + datasheet,
            },
            {
                "quantity": "HBM3 bandwidth / capacity",
                "value": "3.35 TB/s / 80 GB",
                "source": "NVIDIA H100 SXM datasheet" + datasheet,
            },
        ],
        "h200-sxm-llama3-8b": [
            {
                "quantity": "max SM / memory clock, idle SM clock",
                "value": "1980 / 3201 MHz; idle 345 MHz",
                "source": facts + "AWS EC2 doc; amazon-eks-ami PR #1985",
            },
            {"quantity": "TDP", "value": "700 W", "source": facts + "hmc-tech; glennklockwood"},
            {
                "quantity": "H100 bare idle vs idle with context (H200 derived from it)",
                "value": "71.8 W vs 121.7 W",
                "source": facts + "arXiv 2605.23918 via sglang issue #27567",
            },
            {
                "quantity": "VRAM occupancy effect on idle power",
                "value": "< 0.02 W/GB",
                "source": facts + "arXiv 2605.23918 via sglang issue #27567",
            },
            {
                "quantity": "H100 vs H200 memory",
                "value": "HBM3e 4.89 TB/s on H200 (cross-check of the datasheet 4.8 TB/s)",
                "source": facts + "arXiv 2604.11391",
            },
            {
                "quantity": "dense BF16 peak",
                "value": "989 TFLOPS (same GH100 compute as H100)",
                "source": "NVIDIA H200 datasheet" + datasheet,
            },
            {
                "quantity": "HBM3e bandwidth / capacity",
                "value": "4.8 TB/s / 141 GB",
                "source": "NVIDIA H200 datasheet" + datasheet,
            },
        ],
        "a100-sxm-80gb-llama3-8b": [
            {
                "quantity": "max SM / memory clock (80 GB)",
                "value": "1410 / 1593 MHz",
                "source": facts + "AWS EC2 doc (nvidia-smi -ac 1593,1410)",
            },
            {
                "quantity": "SM clock range used (profile floor 510 MHz)",
                "value": "510-1410 MHz (61 settings)",
                "source": facts + "mertside/ai-inference-energy H100_SUPPORT_SUMMARY.md",
            },
            {
                "quantity": "idle SM clock",
                "value": "210 MHz",
                "source": facts + "sglang issue #27567",
            },
            {
                "quantity": "bare idle vs idle with CUDA context",
                "value": "53.7 W vs 80.0 W",
                "source": facts + "arXiv 2605.23918 via sglang issue #27567",
            },
            {
                "quantity": "TDP",
                "value": "400 W",
                "source": "NVIDIA A100 80GB SXM datasheet" + datasheet,
            },
            {
                "quantity": "dense BF16 peak",
                "value": "312 TFLOPS (108 SMs x 2048 FLOP/clk at 1410 MHz)",
                "source": "NVIDIA A100 datasheet / Ampere whitepaper" + datasheet,
            },
            {
                "quantity": "HBM2e bandwidth / capacity",
                "value": "2.039 TB/s / 80 GB",
                "source": "NVIDIA A100 80GB SXM datasheet" + datasheet,
            },
        ],
    }
    return per_gpu[gpu.key] + common


def _assumptions(gpu: GpuSpec, params: RooflineParameters, scale: float) -> list[str]:
    items = [
        f"Prefill MFU {params.prefill_mfu} of the dense BF16 peak at every clock.",
        f"Achievable HBM bandwidth is {params.achievable_bandwidth_fraction} of the "
        "datasheet figure.",
        f"The SM load path sustains {params.sm_load_bytes_per_clock:g} B per SM per clock; "
        f"bandwidth sags below f_need with knee sharpness {params.bandwidth_knee_sharpness:g}.",
        f"{params.decode_compute_overlap:.0%} of decode GEMM compute overlaps the weight "
        "stream; the rest adds to the iteration time.",
        f"Fixed decode iteration overhead {params.fixed_iteration_overhead_s * 1e3:g} ms and "
        f"{params.per_sequence_overhead_s * 1e6:g} us per sequence per iteration.",
        f"Reference decode batch {params.reference_batch_size} and context "
        f"{params.reference_context_tokens} tokens per sequence (mean prompt 1155 + half the "
        "mean output 211); prefill attention at a 1155-token prompt.",
        f"Relative core voltage {params.voltage_min_fraction} below "
        f"{params.voltage_knee_fraction_of_max_clock:.0%} of the max clock, rising linearly "
        "to 1 at the max clock.",
        f"{params.idle_context_clock_share:.0%} of the CUDA-context idle overhead scales with "
        "V^2 f; the published idle-with-context figure holds at the max clock.",
        f"Prefill power reaches {params.prefill_power_fraction_of_tdp:.0%} of TDP at the max "
        "clock (below the cap, so no power throttling is modelled).",
        f"HBM energy {gpu.hbm_energy_pj_per_bit:g} pJ/bit of traffic (order of magnitude from "
        "public HBM estimates).",
        f"Decode core activity scale lambda = {_r(scale, 4)}, calibrated so the H200 decode "
        f"power at the max clock and reference batch is "
        f"{params.h200_decode_power_at_max_clock_w:g} W (top of the published 137-300 W "
        "range), then used for all GPUs.",
        "The ML.ENERGY H100 anchors (300 W / 600 W) set only the logistic shape; their "
        "absolute level is about twice this model's 8B decode power and is not used.",
        f"Batch 128 reaches {params.logistic_saturation_at_batch128:.0%} of the logistic "
        "plateau (the second condition needed to fit k and x0 to two anchors).",
        f"SLOs: TTFT {params.ttft_slo_s:g} s and TPOT {params.tpot_slo_s:g} s for an 8B chat "
        "model (between common interactive and server settings).",
        f"KV capacity with gpu_memory_utilization {params.gpu_memory_utilization} and "
        f"{params.activation_reserve_bytes / 1e9:g} GB reserved for activations; HBM capacity "
        "counted in 1e9-byte GB.",
        f"Thermal: inlet {params.ambient_temperature_c:g} C, R "
        f"{gpu.thermal_resistance_c_per_w} C/W (steady state at TDP "
        f"{params.ambient_temperature_c + gpu.thermal_resistance_c_per_w * gpu.tdp_w:.1f} C), "
        f"time constant {params.thermal_time_constant_s:g} s; limit "
        f"{params.thermal_limit_c:g} C is a typical 'GPU Max Operating Temp' of data-center "
        "SXM boards, not a published figure for this board.",
        f"max_batch_size {params.max_batch_size} (vLLM's long-standing max_num_seqs default).",
    ]
    if gpu.key == "h200-sxm-llama3-8b":
        items.append(
            "H200 idle power is derived, not published: H100's bare 71.8 W and 121.7 W with "
            "context (same GH100 die and TDP) plus 0.02 W/GB on the extra 0.9 x 61 GB vLLM "
            "fills."
        )
    if gpu.key == "a100-sxm-80gb-llama3-8b":
        items.append(
            "Profile floor 510 MHz (the range the cited A100 study used), above the 210 MHz "
            "idle clock; lower clocks are not modelled."
        )
    else:
        items.append(
            "Profile floor 345 MHz, the published idle clock of H100/H200 SXM; the 210 MHz "
            "floor in PROFILE_FACTS belongs to the H100 PCIe board."
        )
    return items


def build_profile(
    key: str, model: ModelSpec = LLAMA_31_8B, params: RooflineParameters | None = None
) -> tuple[str, dict[str, Any]]:
    """CSV text and manifest of the bundled profile ``key``.

    Raises:
        KeyError: if ``key`` is not one of :data:`GPUS`.
    """
    params = params or RooflineParameters()
    gpu = GPUS[key]
    table = profile_table(gpu, model, params)
    csv_text = render_csv(table)
    parts = decode_iteration_s(gpu, model, params, gpu.max_clock_mhz)
    total = parts["total_s"]
    weight = _r((parts["weight_s"] + parts["fixed_s"]) / total)
    kv = _r(parts["kv_s"] / total)
    batch = _r(1.0 - weight - kv)
    k, x0 = fit_decode_power_batch_model(params)
    scale = decode_core_activity_scale(model, params)
    clocks = table["clock_mhz"]
    decode_energy = [
        p / r for p, r in zip(table["decode_power_w"], table["decode_tokens_per_s"], strict=True)
    ]
    prefill_energy = [
        p / r for p, r in zip(table["prefill_power_w"], table["prefill_tokens_per_s"], strict=True)
    ]
    manifest: dict[str, Any] = {
        "name": key,
        "gpu": gpu.gpu,
        "model": model.name,
        "status": "literature-derived",
        "warning": (
            "Literature-derived, not measured: every number comes from a documented roofline "
            "model calibrated to published figures, so absolute rates and powers may be off "
            "by tens of percent on a real GPU; use it to compare controllers, not to claim "
            "savings on hardware."
        ),
        "csv": f"{key}.csv",
        "clock_range_mhz": [gpu.min_clock_mhz, gpu.max_clock_mhz],
        "clock_step_mhz": CLOCK_STEP_MHZ,
        "idle_clock_mhz": gpu.idle_clock_mhz,
        "max_memory_clock_mhz": gpu.max_memory_clock_mhz,
        "ttft_slo_s": params.ttft_slo_s,
        "tpot_slo_s": params.tpot_slo_s,
        "power_limit_w": gpu.tdp_w,
        "thermal": {
            "ambient_temperature_c": params.ambient_temperature_c,
            "thermal_resistance_c_per_w": gpu.thermal_resistance_c_per_w,
            "thermal_time_constant_s": params.thermal_time_constant_s,
            "thermal_limit_c": params.thermal_limit_c,
        },
        "thermal_fit_r_squared": None,
        "engine": {
            "max_batch_size": params.max_batch_size,
            "kv_capacity_tokens": kv_capacity_tokens(gpu, model, params),
            "reference_batch_size": params.reference_batch_size,
            "reference_context_tokens": params.reference_context_tokens,
        },
        "decode_latency_model": {
            "weight_fraction": weight,
            "batch_fraction": batch,
            "kv_fraction": kv,
        },
        "decode_power_batch_model": {"k": _r(k), "x0": _r(x0)},
        "summary": {
            "decode_tokens_per_s_at_max_clock": _r(table["decode_tokens_per_s"][-1]),
            "decode_tokens_per_s_at_min_clock": _r(table["decode_tokens_per_s"][0]),
            "prefill_tokens_per_s_at_max_clock": _r(table["prefill_tokens_per_s"][-1]),
            "decode_iteration_s_at_max_clock": _r(total),
            "min_decode_energy_clock_mhz": int(clocks[decode_energy.index(min(decode_energy))]),
            "min_prefill_energy_clock_mhz": int(clocks[prefill_energy.index(min(prefill_energy))]),
            "decode_energy_saving_at_best_clock_vs_max": _r(
                1.0 - min(decode_energy) / decode_energy[-1], 3
            ),
            "decode_rate_loss_at_best_clock_vs_max": _r(
                1.0
                - table["decode_tokens_per_s"][decode_energy.index(min(decode_energy))]
                / table["decode_tokens_per_s"][-1],
                3,
            ),
            "steady_state_temperature_at_tdp_c": _r(
                params.ambient_temperature_c + gpu.thermal_resistance_c_per_w * gpu.tdp_w
            ),
        },
        "sources": _sources(gpu),
        "assumptions": _assumptions(gpu, params, scale),
        "derivation": {
            "generator": GENERATOR,
            "command": "python -m gpugov.plant.roofline --out profiles/",
            "parameters": {
                **{
                    key_: (_r(value) if isinstance(value, float) else value)
                    for key_, value in asdict(params).items()
                },
                "decode_core_activity_scale": _r(scale),
                "gpu": {
                    key_: (_r(value) if isinstance(value, float) else value)
                    for key_, value in asdict(gpu).items()
                },
                "model": asdict(model),
            },
        },
    }
    return csv_text, manifest


def write_profiles(out_dir: Path, keys: Sequence[str] | None = None) -> list[Path]:
    """Write ``<key>.csv`` and ``<key>.json`` for each profile; return the written paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for key in keys or sorted(GPUS):
        csv_text, manifest = build_profile(key)
        csv_path = out_dir / f"{key}.csv"
        json_path = out_dir / f"{key}.json"
        csv_path.write_text(csv_text, encoding="ascii", newline="\n")
        json_path.write_text(
            json.dumps(manifest, indent=2, ensure_ascii=True) + "\n", encoding="ascii", newline="\n"
        )
        written += [csv_path, json_path]
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m gpugov.plant.roofline --out profiles/``."""
    parser = argparse.ArgumentParser(
        prog="python -m gpugov.plant.roofline",
        description="Regenerate the literature-derived GPU profiles from the roofline model.",
    )
    parser.add_argument("--out", type=Path, default=Path("profiles"), help="output directory")
    parser.add_argument(
        "--only", action="append", choices=sorted(GPUS), help="profile(s) to write (default all)"
    )
    args = parser.parse_args(argv)
    for path in write_profiles(args.out, args.only):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
