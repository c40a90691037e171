"""Roofline model that derives the bundled, literature-derived GPU performance profiles.

Run ``python -m gpugov.plant.roofline --out profiles/`` to regenerate every
``profiles/<name>.csv`` and ``profiles/<name>.json`` of the zoo (:mod:`gpugov.plant.zoo`)
byte for byte. Nothing here is measured on our side: every number is a published figure,
a parameter fitted to published measurements (:mod:`gpugov.plant.calibration`; every fitted
point is listed in the manifest's ``calibration`` rows with its relative error) or an
assumption listed in the manifest's ``assumptions``.

A profile describes one serving *domain*: a model on ``tp`` GPUs of one kind under
tensor parallelism and vLLM-style continuous batching. Rates are the domain's; powers are
summed over its GPUs. Notation: ``f`` SM clock (MHz), ``F(f)`` a GPU's dense BF16 peak,
``BW(f)`` its achieved memory bandwidth, ``B`` the decode batch, ``L`` the per-sequence
context, ``L_p`` the reference prompt.

Compute and bandwidth (per GPU)
    ``F(f) = n_SM * flops_per_SM_per_clock * f``. ``BW(f) = BW_a * x / (1 + x**4)**(1/4)``
    with ``BW_a = eta_bw * BW_datasheet`` (``eta_bw`` fitted), ``x = f / f_need`` and
    ``f_need = BW_a / (n_SM * 128 B/clk)``: the SMs must issue the loads, so bandwidth
    sags at low clocks.

Linear operators (fitted to Vidur's measured per-layer timings)
    ``t_lin(f, N) = n_layers * [(t_mem**n + t_gemm(N)**n)**(1/n) + N e / BW(f) + t_launch]``
    with ``t_mem`` the layer's streamed weight bytes per GPU over ``BW(f)``, ``t_gemm`` its
    GEMM FLOPs per GPU (``imbalance`` times, for MoE) over ``MFU * F(f)`` and ``e`` the
    element-wise bytes per token. ``eta_bw``, ``MFU``, ``t_launch`` and ``n`` are fitted
    per GPU kind (:func:`gpugov.plant.calibration.fit_efficiency`).

Decode iteration at ``B`` sequences of context ``L``
    ``t_iter = t_lin(f, B) + n_layers (t_attn + B L b_kv / (n_layers tp r BW(f)))
    + 2 n_layers AR(B d 2 bytes) + B tau + t_fix``: the decode attention kernel's launch
    ``t_attn`` and relative bandwidth ``r`` are fitted to Vidur's measured A100 attention
    timings (:func:`gpugov.plant.calibration.fit_attention`), ``AR`` is the all-reduce time
    over ``tp`` GPUs fitted to Vidur's measured NCCL all-reduce (zero at TP 1);
    ``decode_tokens_per_s = B / t_iter``. ``t_lin`` streams every weight except an untied
    input embedding table (a row gather).

Prefill of ``L_p`` tokens
    ``t_pre = t_lin(f, L_p) + 2 n_layers d L_p**2 / (tp MFU F(f)) + 2 n_layers AR(L_p d 2)
    + t_fix``; ``prefill_tokens_per_s = L_p / t_pre``.

Voltage and power (per GPU, times ``tp`` for the domain)
    ``v(f) = v_min`` below ``k_knee * f_max``, linear to 1 at ``f_max``;
    ``d(f) = v(f)**2 f / f_max``. ``idle(f) = P_bare + (P_ctx - P_bare) (1 - kappa + kappa
    d(f))``. ``prefill(f) = idle(f) + P_core d(f)`` with ``P_core = rho TDP - idle(f_max)``.
    ``decode(f) = idle(f) + e_mem * bytes / t_iter + P_core (a_tensor d(f) + mu s_stream
    (sigma + (1 - sigma) d(f)))`` with ``a_tensor`` the GEMM busy share and ``s_stream`` the
    memory-stream share of the iteration. ``mu`` (SM power while streaming, relative to dense
    GEMM) is calibrated once, on the H100 8B domain, to ML.ENERGY's measured power at the
    reference batch; ``sigma`` (the share of streaming power that does not follow the SM
    clock: L2, crossbar, memory PHY) once, on the H200 8B domain, so the best clock lock
    saves the published 32% of decode energy. Both are used unchanged everywhere.

A decode row whose modelled power exceeds the board limit reports the decode at the clock
the firmware's power cap leaves (:func:`power_capped_decode_clock`).

Decode power vs batch: ML.ENERGY's logistic ``P(B) = idle + L sigmoid(k (log2 B - x0))``
with ``k``, ``x0`` fitted to the H100 anchors (see ``profiles/README.md``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gpugov.plant import calibration
from gpugov.plant.calibration import AttentionEfficiency, Efficiency, LayerShape
from gpugov.plant.output_files import write_files_atomic
from gpugov.plant.zoo import (
    CLOCK_STEP_MHZ,
    GPUS,
    MODELS,
    PROFILES,
    GpuSpec,
    ModelSpec,
    ProfileSpec,
)

GENERATOR = "plant/roofline.py v3"
CSV_HEADER = (
    "clock_mhz,prefill_tokens_per_s,decode_tokens_per_s,prefill_power_w,decode_power_w,idle_power_w"
)
CALIBRATION_DOMAIN = "h100-sxm-llama3-8b"


@dataclass(frozen=True, slots=True)
class RooflineParameters:
    """Assumed model constants shared by every profile (each listed as an assumption)."""

    sm_load_bytes_per_clock: float = 128.0
    bandwidth_knee_sharpness: float = 4.0
    fixed_iteration_overhead_s: float = 0.6e-3
    per_sequence_overhead_s: float = 5e-6
    voltage_min_fraction: float = 0.70
    voltage_knee_fraction_of_max_clock: float = 0.50
    idle_context_clock_share: float = 0.30
    prefill_power_fraction_of_tdp: float = 0.95
    reference_context_tokens: int = 1260
    reference_prompt_tokens: int = 1155
    max_batch_size: int = 256
    gpu_memory_utilization: float = 0.90
    activation_reserve_bytes: float = 2e9
    logistic_anchor_batch1_w: float = 300.0
    logistic_anchor_batch128_w: float = 600.0
    logistic_anchor_idle_w: float = 121.7
    logistic_saturation_at_batch128: float = 0.95
    ttft_allowance_prefill_multiple: float = 2.0
    ambient_temperature_c: float = 30.0
    thermal_time_constant_s: float = 40.0
    thermal_limit_c: float = 87.0


@dataclass(frozen=True, slots=True)
class Domain:
    """One profile's physics: a model on ``tensor_parallel`` GPUs of one kind."""

    spec: ProfileSpec
    gpu: GpuSpec
    model: ModelSpec
    eff: Efficiency
    params: RooflineParameters
    attention: AttentionEfficiency

    @property
    def tp(self) -> int:
        """Tensor-parallel degree (GPUs in the domain)."""
        return self.spec.tensor_parallel

    @property
    def shape(self) -> LayerShape:
        """Per-GPU layer shape."""
        m = self.model
        return LayerShape(m.d_model, m.d_ff, m.n_heads, m.n_kv_heads, self.tp, m.experts_per_token)

    def clocks(self) -> list[int]:
        """Supported SM clocks in MHz: the 15 MHz grid from the floor up to exactly the max."""
        return list(range(self.gpu.min_clock_mhz, self.gpu.max_clock_mhz + 1, CLOCK_STEP_MHZ))

    def peak_flops(self, clock_mhz: float) -> float:
        """Dense BF16 tensor peak of one GPU in FLOP/s (linear in the SM clock)."""
        gpu = self.gpu
        return gpu.sm_count * gpu.dense_bf16_flops_per_sm_per_clock * clock_mhz * 1e6

    def bandwidth(self, clock_mhz: float) -> float:
        """Achieved memory bandwidth of one GPU in bytes/s (sags below ``f_need``)."""
        achievable = self.eff.bandwidth_fraction * self.gpu.memory_bandwidth_bytes_per_s
        need_mhz = achievable / (self.gpu.sm_count * self.params.sm_load_bytes_per_clock) / 1e6
        x = clock_mhz / need_mhz
        n = self.params.bandwidth_knee_sharpness
        return achievable * x / (1.0 + x**n) ** (1.0 / n)

    def streamed_layer_bytes(self, tokens: float) -> float:
        """Weight bytes per layer per GPU one pass over ``tokens`` tokens streams."""
        return self.model.streamed_weight_bytes(tokens) / (self.model.n_layers * self.tp)

    def linear_s(self, clock_mhz: float, tokens: float) -> float:
        """``t_lin``: all layers' non-attention operators over ``tokens`` tokens."""
        per_layer = calibration.layer_time_s(
            self.shape,
            tokens,
            self.eff,
            self.peak_flops(clock_mhz),
            self.bandwidth(clock_mhz),
            weight_bytes=self.streamed_layer_bytes(tokens),
            imbalance=self.model.expert_load_imbalance,
        )
        return self.model.n_layers * per_layer

    def gemm_s(self, clock_mhz: float, tokens: float) -> float:
        """Busy time of the tensor cores over ``tokens`` tokens (all layers, per GPU)."""
        flops = 2.0 * self.shape.active_params * tokens * self.model.expert_load_imbalance
        return self.model.n_layers * flops / (self.eff.gemm_mfu * self.peak_flops(clock_mhz))

    def all_reduce_s(self, tokens: float) -> float:
        """Two all-reduces of ``tokens * d_model`` BF16 values per layer (0 at TP 1)."""
        size = tokens * self.model.d_model * self.model.bytes_per_value
        per_call = calibration.all_reduce_s(self.gpu.all_reduce_from, self.tp, size)
        return 2.0 * self.model.n_layers * per_call

    def kv_s(self, clock_mhz: float, batch: float, context: float) -> float:
        """Time the decode attention kernels spend reading the batch's KV cache (all layers,
        split over the TP group), at the fitted attention bandwidth."""
        total = batch * context * self.model.kv_bytes_per_token / self.tp
        return total / (self.attention.relative_bandwidth * self.bandwidth(clock_mhz))

    def attention_launch_s(self) -> float:
        """Fixed part of the decode attention kernels per iteration (all layers)."""
        return self.model.n_layers * self.attention.launch_s

    def decode_parts_s(
        self, clock_mhz: float, batch: float | None = None, context: float | None = None
    ) -> dict[str, float]:
        """Parts of one decode iteration at ``batch`` (default reference) and ``context``
        tokens per sequence (default L_ref)."""
        b = float(batch if batch is not None else self.spec.reference_batch_size)
        p = self.params
        length = float(context if context is not None else p.reference_context_tokens)
        parts = {
            "linear_s": self.linear_s(clock_mhz, b),
            "kv_s": self.kv_s(clock_mhz, b, length),
            "attention_launch_s": self.attention_launch_s(),
            "all_reduce_s": self.all_reduce_s(b),
            "per_sequence_s": b * p.per_sequence_overhead_s,
            "fixed_s": p.fixed_iteration_overhead_s,
        }
        parts["total_s"] = sum(parts.values())
        parts["gemm_s"] = self.gemm_s(clock_mhz, b)
        parts["stream_s"] = (
            self.model.streamed_weight_bytes(b) / self.tp / self.bandwidth(clock_mhz)
            + parts["kv_s"]
        )
        parts["bytes_per_gpu"] = (
            self.model.streamed_weight_bytes(b) / self.tp
            + b * length * self.model.kv_bytes_per_token / self.tp
        )
        return parts

    def decode_tokens_per_s(self, clock_mhz: float, batch: float | None = None) -> float:
        """Aggregate decode rate of the domain: ``B / t_iter`` tokens/s."""
        b = float(batch if batch is not None else self.spec.reference_batch_size)
        return b / self.decode_parts_s(clock_mhz, b)["total_s"]

    def prefill_s(self, clock_mhz: float) -> float:
        """Time to prefill one reference prompt alone."""
        lp = float(self.params.reference_prompt_tokens)
        m = self.model
        attention = 2.0 * m.n_layers * m.d_model * lp * lp / self.tp
        return (
            self.linear_s(clock_mhz, lp)
            + attention / (self.eff.gemm_mfu * self.peak_flops(clock_mhz))
            + self.all_reduce_s(lp)
            + self.params.fixed_iteration_overhead_s
        )

    def prefill_tokens_per_s(self, clock_mhz: float) -> float:
        """Prompt tokens per second of the domain at the reference prompt."""
        return self.params.reference_prompt_tokens / self.prefill_s(clock_mhz)

    # ----------------------------------------------------------------- power
    def dynamic_scale(self, clock_mhz: float) -> float:
        """``v(f)**2 * f / f_max``: dynamic power relative to the max clock (C V^2 f)."""
        p, f_max = self.params, self.gpu.max_clock_mhz
        knee = p.voltage_knee_fraction_of_max_clock * f_max
        rise = max(0.0, (clock_mhz - knee) / (f_max - knee))
        v = p.voltage_min_fraction + (1.0 - p.voltage_min_fraction) * rise
        return v * v * clock_mhz / f_max

    def idle_gpu_w(self, clock_mhz: float) -> float:
        """Idle power of one GPU with the model resident, W."""
        gpu, share = self.gpu, self.params.idle_context_clock_share
        overhead = gpu.context_idle_power_w - gpu.bare_idle_power_w
        return gpu.bare_idle_power_w + overhead * (
            1.0 - share + share * self.dynamic_scale(clock_mhz)
        )

    def core_power_w(self) -> float:
        """``P_core``: prefill power of one GPU above idle at the max clock, W."""
        top = self.params.prefill_power_fraction_of_tdp * self.gpu.tdp_w
        return top - self.idle_gpu_w(self.gpu.max_clock_mhz)

    def prefill_gpu_w(self, clock_mhz: float) -> float:
        """Prefill power of one GPU, W."""
        return self.idle_gpu_w(clock_mhz) + self.core_power_w() * self.dynamic_scale(clock_mhz)

    def decode_gpu_w(
        self, clock_mhz: float, mu: float, sigma: float = 0.0, batch: float | None = None
    ) -> float:
        """Decode power of one GPU at ``batch`` (default reference), W.

        ``sigma`` is the share of the streaming power that does not follow the SM clock.
        """
        parts = self.decode_parts_s(clock_mhz, batch)
        total = parts["total_s"]
        memory = self.gpu.memory_energy_pj_per_bit * 8e-12 * parts["bytes_per_gpu"] / total
        scale = self.dynamic_scale(clock_mhz)
        tensor = min(1.0, parts["gemm_s"] / total)
        stream = min(1.0 - tensor, mu * parts["stream_s"] / total)
        core = self.core_power_w() * (tensor * scale + stream * (sigma + (1.0 - sigma) * scale))
        return self.idle_gpu_w(clock_mhz) + memory + core

    def kv_capacity_tokens(self) -> int:
        """KV-cache tokens of the domain that fit beside the weights under vLLM's budget."""
        p = self.params
        per_gpu = (
            self.gpu.memory_capacity_bytes * p.gpu_memory_utilization
            - self.model.weight_bytes / self.tp
            - p.activation_reserve_bytes
        )
        return int(per_gpu * self.tp // self.model.kv_bytes_per_token)


def domain(name: str, params: RooflineParameters | None = None) -> Domain:
    """The :class:`Domain` of bundled profile ``name``.

    Raises:
        KeyError: if ``name`` is not in :data:`gpugov.plant.zoo.PROFILES`.
    """
    spec = PROFILES[name]
    gpu = GPUS[spec.gpu]
    return Domain(
        spec,
        gpu,
        MODELS[spec.model],
        calibration.fit_efficiency(gpu.efficiency_from),
        params or RooflineParameters(),
        calibration.fit_attention(),
    )


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


def logistic_anchor_power_w(params: RooflineParameters, batch: float) -> float:
    """Power of the ML.ENERGY H100 anchor curve at ``batch`` (through both anchors)."""
    k, x0 = fit_decode_power_batch_model(params)

    def s(b: float) -> float:
        return 1.0 / (1.0 + math.exp(-k * (math.log2(b) - x0)))

    rise_128 = params.logistic_anchor_batch128_w - params.logistic_anchor_idle_w
    return params.logistic_anchor_idle_w + rise_128 * s(batch) / s(128)


@lru_cache(maxsize=4)
def streaming_activity(params: RooflineParameters | None = None) -> float:
    """``mu``, calibrated so the H100 8B domain's decode power at the reference batch and
    max clock lies on the ML.ENERGY anchor curve; rounded to 4 significant digits.

    Raises:
        ValueError: if the calibration does not land in (0, 1].
    """
    params = params or RooflineParameters()
    d = domain(CALIBRATION_DOMAIN, params)
    f = d.gpu.max_clock_mhz
    target = logistic_anchor_power_w(params, d.spec.reference_batch_size)
    parts = d.decode_parts_s(f)
    total = parts["total_s"]
    memory = d.gpu.memory_energy_pj_per_bit * 8e-12 * parts["bytes_per_gpu"] / total
    core = d.core_power_w() * d.dynamic_scale(f)
    needed = (target - d.idle_gpu_w(f) - memory) / core - parts["gemm_s"] / total
    mu = needed / (parts["stream_s"] / total)
    if not 0.0 < mu <= 1.0:
        raise ValueError(f"streaming activity must lie in (0, 1], got {mu!r}")
    return float(f"{mu:.4g}")


DVFS_DOMAIN = "h200-sxm-llama3-8b"
DVFS_DECODE_SAVING = 0.32


def best_clock_decode_saving(d: Domain, mu: float, sigma: float) -> float:
    """Decode energy saving of the best supported clock vs the max clock (reference batch)."""
    energy = [d.decode_gpu_w(f, mu, sigma) / d.decode_tokens_per_s(f) for f in d.clocks()]
    return 1.0 - min(energy) / energy[-1]


@lru_cache(maxsize=4)
def clock_fixed_stream_share(params: RooflineParameters | None = None) -> float:
    """``sigma``, bisected so the H200 8B domain's best clock saves the published 32% of
    decode energy (arXiv 2605.11999 via PROFILE_FACTS); rounded to 4 significant digits.

    Raises:
        ValueError: if no sigma in [0, 1] reaches the target.
    """
    params = params or RooflineParameters()
    d = domain(DVFS_DOMAIN, params)
    mu = streaming_activity(params)
    low, high = 0.0, 1.0
    if (
        not best_clock_decode_saving(d, mu, high)
        <= DVFS_DECODE_SAVING
        <= (best_clock_decode_saving(d, mu, low))
    ):
        raise ValueError("the DVFS target is out of reach for sigma in [0, 1]")
    for _ in range(40):
        mid = 0.5 * (low + high)
        if best_clock_decode_saving(d, mu, mid) > DVFS_DECODE_SAVING:
            low = mid
        else:
            high = mid
    return float(f"{0.5 * (low + high):.4g}")


def power_capped_decode_clock(d: Domain, clock_mhz: float, mu: float, sigma: float) -> float:
    """The clock a decode at locked ``clock_mhz`` really runs at under the board power limit.

    A locked clock is an upper bound: when the modelled decode power exceeds the TDP the
    firmware lowers the clock until it fits, so the row reports the decode at that clock
    (bisected to 1e-6 MHz; the lowest supported clock is the floor).
    """
    limit = d.gpu.tdp_w
    if d.decode_gpu_w(clock_mhz, mu, sigma) <= limit:
        return clock_mhz
    low, high = float(d.gpu.min_clock_mhz), float(clock_mhz)
    if d.decode_gpu_w(low, mu, sigma) > limit:
        return low
    while high - low > 1e-6:
        mid = 0.5 * (low + high)
        if d.decode_gpu_w(mid, mu, sigma) > limit:
            high = mid
        else:
            low = mid
    return low


def profile_table(d: Domain) -> dict[str, list[float]]:
    """Every CSV column over the clock grid (unrounded), for the whole domain."""
    mu = streaming_activity(d.params)
    sigma = clock_fixed_stream_share(d.params)
    tp = d.tp
    clocks = d.clocks()
    decode_clocks = [power_capped_decode_clock(d, f, mu, sigma) for f in clocks]
    return {
        "clock_mhz": [float(f) for f in clocks],
        "prefill_tokens_per_s": [d.prefill_tokens_per_s(f) for f in clocks],
        "decode_tokens_per_s": [d.decode_tokens_per_s(f) for f in decode_clocks],
        "prefill_power_w": [tp * d.prefill_gpu_w(f) for f in clocks],
        "decode_power_w": [tp * d.decode_gpu_w(f, mu, sigma) for f in decode_clocks],
        "idle_power_w": [tp * d.idle_gpu_w(f) for f in clocks],
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


def write_profiles(out_dir: Path, keys: Sequence[str] | None = None) -> list[Path]:
    """Write ``<key>.csv`` and ``<key>.json`` for each profile; return the written paths."""
    from gpugov.plant.roofline_manifest import build_profile

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for key in keys or sorted(PROFILES):
        csv_text, manifest = build_profile(key)
        csv_path = out_dir / f"{key}.csv"
        json_path = out_dir / f"{key}.json"
        manifest_text = json.dumps(manifest, indent=2, ensure_ascii=True) + "\n"
        write_files_atomic(  # together: never a new CSV beside an old manifest
            {csv_path: csv_text.encode("ascii"), json_path: manifest_text.encode("ascii")}
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
        "--only",
        action="append",
        choices=sorted(PROFILES),
        help="profile(s) to write (default all)",
    )
    args = parser.parse_args(argv)
    for path in write_profiles(args.out, args.only):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
