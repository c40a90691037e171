"""The profile zoo: served models, GPU boards and the (GPU, model, TP) profiles bundled.

Pure data for :mod:`gpugov.plant.roofline`. Every board and model figure is a published
datasheet or model-card value (cited in :data:`GPU_SOURCES` / :data:`MODEL_SOURCES`) or an
assumption stated in the manifest; nothing here is measured on our side.
"""

from __future__ import annotations

from dataclasses import dataclass

CLOCK_STEP_MHZ = 15
FACTS = "PROFILE_FACTS.md: "
DATASHEET = " (not from PROFILE_FACTS)"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Transformer shape of a served model (BF16); MoE fields are zero for dense models."""

    key: str
    name: str
    parameter_count: int
    active_parameter_count: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    d_ff: int
    vocab_size: int = 0
    tied_embeddings: bool = False
    bytes_per_value: int = 2
    n_experts: int = 0
    experts_per_token: int = 0
    expert_parameter_count: int = 0
    expert_load_imbalance: float = 1.0

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.n_experts > 0

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (every expert) resident across the TP group."""
        return float(self.parameter_count * self.bytes_per_value)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token over the whole model: K and V, every layer and KV head."""
        return float(2 * self.n_layers * self.n_kv_heads * self.head_dim * self.bytes_per_value)

    @property
    def input_embedding_parameters(self) -> int:
        """Parameters of an untied input embedding table (a row gather, never streamed)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.d_model

    def streamed_weight_bytes(self, tokens: float) -> float:
        """Weight bytes one forward pass over ``tokens`` tokens reads (whole model).

        Dense: every weight except an untied input embedding table, of which a pass reads
        only the tokens' rows (the output projection is streamed whole). MoE: the shared
        weights plus the experts that at least one token routes to,
        ``E * (1 - (1 - k/E)**tokens)`` of ``E`` in expectation under uniform routing.
        """
        dense = self.parameter_count - self.input_embedding_parameters
        if not self.is_moe:
            return float(dense * self.bytes_per_value)
        share = 1.0 - (1.0 - self.experts_per_token / self.n_experts) ** max(tokens, 0.0)
        shared = dense - self.expert_parameter_count
        return float((shared + self.expert_parameter_count * share) * self.bytes_per_value)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Published (or derived) figures of one GPU board; units in every name."""

    key: str
    gpu: str
    kind: str
    min_clock_mhz: int
    max_clock_mhz: int
    idle_clock_mhz: int
    max_memory_clock_mhz: int
    sm_count: int
    dense_bf16_flops_per_sm_per_clock: int
    memory_bandwidth_bytes_per_s: float
    memory_capacity_bytes: float
    memory_energy_pj_per_bit: float
    tdp_w: float
    bare_idle_power_w: float
    context_idle_power_w: float
    thermal_resistance_c_per_w: float
    efficiency_from: str
    all_reduce_from: str

    def __post_init__(self) -> None:
        span = self.max_clock_mhz - self.min_clock_mhz
        if span <= 0 or span % CLOCK_STEP_MHZ:
            raise ValueError(
                f"{self.key}: clock range {self.min_clock_mhz}-{self.max_clock_mhz} MHz is "
                f"not a positive multiple of {CLOCK_STEP_MHZ} MHz"
            )


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """One bundled profile: a model served on ``tensor_parallel`` GPUs of one kind."""

    name: str
    gpu: str
    model: str
    tensor_parallel: int
    reference_batch_size: int
    ttft_slo_s: float
    tpot_slo_s: float
    slo_class: str


LLAMA_31_8B = ModelSpec(
    key="llama3-8b",
    name="Llama-3.1-8B-Instruct (BF16, TP=1)",
    parameter_count=8_030_261_248,
    active_parameter_count=8_030_261_248,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    d_model=4096,
    d_ff=14336,
    vocab_size=128256,
)
LLAMA_31_70B = ModelSpec(
    key="llama3-70b",
    name="Llama-3.1-70B-Instruct (BF16)",
    parameter_count=70_553_706_496,
    active_parameter_count=70_553_706_496,
    n_layers=80,
    n_heads=64,
    n_kv_heads=8,
    head_dim=128,
    d_model=8192,
    d_ff=28672,
    vocab_size=128256,
)
LLAMA_32_3B = ModelSpec(
    key="llama3-3b",
    name="Llama-3.2-3B-Instruct (BF16, TP=1)",
    parameter_count=3_212_749_824,
    active_parameter_count=3_212_749_824,
    n_layers=28,
    n_heads=24,
    n_kv_heads=8,
    head_dim=128,
    d_model=3072,
    d_ff=8192,
    vocab_size=128256,
    tied_embeddings=True,
)
MIXTRAL_8X7B = ModelSpec(
    key="mixtral-8x7b",
    name="Mixtral-8x7B-Instruct-v0.1 (BF16, MoE 8 experts top-2)",
    parameter_count=46_702_792_704,
    active_parameter_count=12_879_925_248,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    d_model=4096,
    d_ff=14336,
    vocab_size=32000,
    n_experts=8,
    experts_per_token=2,
    expert_parameter_count=8 * 3 * 4096 * 14336 * 32,
    expert_load_imbalance=1.15,
)
# Not served by a bundled profile: shapes of models whose published measurements check a
# board's physics (plant/roofline_manifest.py, "published serving" rows).
QWEN25_7B = ModelSpec(
    key="qwen2.5-7b",
    name="Qwen2.5-7B-Instruct (BF16, TP=1)",
    parameter_count=7_615_616_512,
    active_parameter_count=7_615_616_512,
    n_layers=28,
    n_heads=28,
    n_kv_heads=4,
    head_dim=128,
    d_model=3584,
    d_ff=18944,
    vocab_size=152064,
)
CHECK_MODELS: dict[str, ModelSpec] = {QWEN25_7B.key: QWEN25_7B}
MODELS: dict[str, ModelSpec] = {
    m.key: m for m in (LLAMA_31_8B, LLAMA_31_70B, LLAMA_32_3B, MIXTRAL_8X7B)
}

_H100_IDLE = (71.8, 121.7)
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        key="h100",
        gpu="NVIDIA H100 SXM5 80GB HBM3",
        kind="H100",
        min_clock_mhz=345,
        max_clock_mhz=1980,
        idle_clock_mhz=345,
        max_memory_clock_mhz=2619,
        sm_count=132,
        dense_bf16_flops_per_sm_per_clock=4096,
        memory_bandwidth_bytes_per_s=3.35e12,
        memory_capacity_bytes=80e9,
        memory_energy_pj_per_bit=3.5,
        tdp_w=700.0,
        bare_idle_power_w=_H100_IDLE[0],
        context_idle_power_w=_H100_IDLE[1],
        thermal_resistance_c_per_w=0.078,
        efficiency_from="h100",
        all_reduce_from="h100",
    ),
    "h200": GpuSpec(
        key="h200",
        gpu="NVIDIA H200 SXM 141GB HBM3e",
        kind="H200",
        min_clock_mhz=345,
        max_clock_mhz=1980,
        idle_clock_mhz=345,
        max_memory_clock_mhz=3201,
        sm_count=132,
        dense_bf16_flops_per_sm_per_clock=4096,
        memory_bandwidth_bytes_per_s=4.8e12,
        memory_capacity_bytes=141e9,
        memory_energy_pj_per_bit=3.5,
        tdp_w=700.0,
        bare_idle_power_w=_H100_IDLE[0],
        # H100's 121.7 W plus the <0.02 W/GB occupancy bound on the 0.9 * 61 GB more
        # memory vLLM fills: the same GH100 die at the same TDP.
        context_idle_power_w=round(_H100_IDLE[1] + 0.02 * 0.9 * (141 - 80), 1),
        thermal_resistance_c_per_w=0.078,
        efficiency_from="h100",
        all_reduce_from="h100",
    ),
    "a100": GpuSpec(
        key="a100",
        gpu="NVIDIA A100 SXM4 80GB HBM2e",
        kind="A100",
        min_clock_mhz=510,
        max_clock_mhz=1410,
        idle_clock_mhz=210,
        max_memory_clock_mhz=1593,
        sm_count=108,
        dense_bf16_flops_per_sm_per_clock=2048,
        memory_bandwidth_bytes_per_s=2.039e12,
        memory_capacity_bytes=80e9,
        memory_energy_pj_per_bit=4.0,
        tdp_w=400.0,
        bare_idle_power_w=53.7,
        context_idle_power_w=80.0,
        thermal_resistance_c_per_w=0.135,
        efficiency_from="a100",
        all_reduce_from="a100",
    ),
    "l40s": GpuSpec(
        key="l40s",
        gpu="NVIDIA L40S 48GB GDDR6",
        kind="L40S",
        min_clock_mhz=210,
        max_clock_mhz=2520,
        idle_clock_mhz=210,
        max_memory_clock_mhz=9001,
        sm_count=142,
        dense_bf16_flops_per_sm_per_clock=1024,
        memory_bandwidth_bytes_per_s=864e9,
        memory_capacity_bytes=48e9,
        memory_energy_pj_per_bit=7.0,
        tdp_w=350.0,
        bare_idle_power_w=35.6,
        context_idle_power_w=102.1,
        thermal_resistance_c_per_w=0.156,
        efficiency_from="mean",
        all_reduce_from="none",
    ),
    "l4": GpuSpec(
        key="l4",
        gpu="NVIDIA L4 24GB GDDR6",
        kind="L4",
        min_clock_mhz=210,
        max_clock_mhz=2040,
        idle_clock_mhz=210,
        max_memory_clock_mhz=6251,
        sm_count=58,
        dense_bf16_flops_per_sm_per_clock=1024,
        memory_bandwidth_bytes_per_s=300e9,
        memory_capacity_bytes=24e9,
        memory_energy_pj_per_bit=7.0,
        tdp_w=72.0,
        bare_idle_power_w=16.0,
        context_idle_power_w=28.0,
        thermal_resistance_c_per_w=0.76,
        efficiency_from="mean",
        all_reduce_from="none",
    ),
    "b200": GpuSpec(
        key="b200",
        gpu="NVIDIA B200 SXM 180GB HBM3e",
        kind="B200",
        min_clock_mhz=345,
        max_clock_mhz=1965,
        idle_clock_mhz=345,
        max_memory_clock_mhz=3996,
        sm_count=148,
        dense_bf16_flops_per_sm_per_clock=8192,
        memory_bandwidth_bytes_per_s=8.0e12,
        memory_capacity_bytes=180e9,
        memory_energy_pj_per_bit=3.5,
        tdp_w=1000.0,
        # Not published: H100's bare and with-context idle scaled by the TDP ratio.
        bare_idle_power_w=round(_H100_IDLE[0] * 1000.0 / 700.0, 1),
        context_idle_power_w=round(_H100_IDLE[1] * 1000.0 / 700.0, 1),
        thermal_resistance_c_per_w=0.0546,
        efficiency_from="mean",
        all_reduce_from="none",
    ),
}

_SMALL = dict(ttft_slo_s=1.0, tpot_slo_s=0.05, slo_class="small (<= 10B): TTFT 1 s, TPOT 50 ms")
_LARGE = dict(ttft_slo_s=2.0, tpot_slo_s=0.1, slo_class="large (70B): TTFT 2 s, TPOT 100 ms")
_MOE = dict(ttft_slo_s=1.5, tpot_slo_s=0.075, slo_class="MoE (47B/13B): TTFT 1.5 s, TPOT 75 ms")

PROFILES: dict[str, ProfileSpec] = {
    p.name: p
    for p in (
        ProfileSpec("h100-sxm-llama3-8b", "h100", "llama3-8b", 1, 64, **_SMALL),  # type: ignore[arg-type]
        ProfileSpec("h200-sxm-llama3-8b", "h200", "llama3-8b", 1, 64, **_SMALL),  # type: ignore[arg-type]
        ProfileSpec("a100-sxm-80gb-llama3-8b", "a100", "llama3-8b", 1, 64, **_SMALL),  # type: ignore[arg-type]
        ProfileSpec("l40s-llama3-8b", "l40s", "llama3-8b", 1, 32, **_SMALL),  # type: ignore[arg-type]
        ProfileSpec("l4-llama3.2-3b", "l4", "llama3-3b", 1, 16, **_SMALL),  # type: ignore[arg-type]
        ProfileSpec("b200-llama3-8b", "b200", "llama3-8b", 1, 64, **_SMALL),  # type: ignore[arg-type]
        ProfileSpec("h100-sxm-llama3-70b-tp4", "h100", "llama3-70b", 4, 64, **_LARGE),  # type: ignore[arg-type]
        ProfileSpec("h100-sxm-llama3-70b-tp8", "h100", "llama3-70b", 8, 64, **_LARGE),  # type: ignore[arg-type]
        ProfileSpec("h200-sxm-llama3-70b-tp4", "h200", "llama3-70b", 4, 64, **_LARGE),  # type: ignore[arg-type]
        ProfileSpec("h200-sxm-llama3-70b-tp8", "h200", "llama3-70b", 8, 64, **_LARGE),  # type: ignore[arg-type]
        ProfileSpec("a100-sxm-80gb-llama3-70b-tp4", "a100", "llama3-70b", 4, 64, **_LARGE),  # type: ignore[arg-type]
        ProfileSpec("h100-sxm-mixtral-8x7b-tp2", "h100", "mixtral-8x7b", 2, 64, **_MOE),  # type: ignore[arg-type]
        ProfileSpec("h200-sxm-mixtral-8x7b", "h200", "mixtral-8x7b", 1, 64, **_MOE),  # type: ignore[arg-type]
    )
}

GPU_SOURCES: dict[str, list[dict[str, str]]] = {
    "h100": [
        {
            "quantity": "max SM / memory clock",
            "value": "1980 / 2619 MHz",
            "source": FACTS + "AWS EC2 'optimize GPU' doc (nvidia-smi -ac 2619,1980)",
        },
        {
            "quantity": "idle SM clock (profile floor)",
            "value": "345 MHz",
            "source": FACTS + "amazon-eks-ami PR #1985; sglang issue #27567",
        },
        {"quantity": "TDP", "value": "700 W", "source": FACTS + "hmc-tech; glennklockwood"},
        {
            "quantity": "bare idle vs idle with CUDA context",
            "value": "71.8 W vs 121.7 W",
            "source": FACTS + "arXiv 2605.23918 via sglang issue #27567",
        },
        {
            "quantity": "dense BF16 peak",
            "value": "989 TFLOPS (132 SMs x 4096 FLOP/clk at 1830 MHz)",
            "source": "NVIDIA H100 datasheet / Hopper whitepaper" + DATASHEET,
        },
        {
            "quantity": "HBM3 bandwidth / capacity",
            "value": "3.35 TB/s / 80 GB",
            "source": "NVIDIA H100 SXM datasheet" + DATASHEET,
        },
    ],
    "h200": [
        {
            "quantity": "max SM / memory clock, idle SM clock",
            "value": "1980 / 3201 MHz; idle 345 MHz",
            "source": FACTS + "AWS EC2 doc; amazon-eks-ami PR #1985",
        },
        {"quantity": "TDP", "value": "700 W", "source": FACTS + "hmc-tech; glennklockwood"},
        {
            "quantity": "H100 bare idle vs idle with context (H200 derived from it)",
            "value": "71.8 W vs 121.7 W",
            "source": FACTS + "arXiv 2605.23918 via sglang issue #27567",
        },
        {
            "quantity": "VRAM occupancy effect on idle power",
            "value": "< 0.02 W/GB",
            "source": FACTS + "arXiv 2605.23918 via sglang issue #27567",
        },
        {
            "quantity": "H100 vs H200 memory",
            "value": "HBM3e 4.89 TB/s on H200 (cross-check of the datasheet 4.8 TB/s)",
            "source": FACTS + "arXiv 2604.11391",
        },
        {
            "quantity": "dense BF16 peak",
            "value": "989 TFLOPS (same GH100 compute as H100)",
            "source": "NVIDIA H200 datasheet" + DATASHEET,
        },
        {
            "quantity": "HBM3e bandwidth / capacity",
            "value": "4.8 TB/s / 141 GB",
            "source": "NVIDIA H200 datasheet" + DATASHEET,
        },
    ],
    "a100": [
        {
            "quantity": "max SM / memory clock (80 GB)",
            "value": "1410 / 1593 MHz",
            "source": FACTS + "AWS EC2 doc (nvidia-smi -ac 1593,1410)",
        },
        {
            "quantity": "SM clock range used (profile floor 510 MHz)",
            "value": "510-1410 MHz (61 settings)",
            "source": FACTS + "mertside/ai-inference-energy H100_SUPPORT_SUMMARY.md",
        },
        {"quantity": "idle SM clock", "value": "210 MHz", "source": FACTS + "sglang issue #27567"},
        {
            "quantity": "bare idle vs idle with CUDA context",
            "value": "53.7 W vs 80.0 W",
            "source": FACTS + "arXiv 2605.23918 via sglang issue #27567",
        },
        {
            "quantity": "TDP",
            "value": "400 W",
            "source": "NVIDIA A100 80GB SXM datasheet" + DATASHEET,
        },
        {
            "quantity": "dense BF16 peak",
            "value": "312 TFLOPS (108 SMs x 2048 FLOP/clk at 1410 MHz)",
            "source": "NVIDIA A100 datasheet / Ampere whitepaper" + DATASHEET,
        },
        {
            "quantity": "HBM2e bandwidth / capacity",
            "value": "2.039 TB/s / 80 GB",
            "source": "NVIDIA A100 80GB SXM datasheet" + DATASHEET,
        },
    ],
    "l40s": [
        {
            "quantity": "bare idle vs idle with CUDA context",
            "value": "35.6 W vs 102.1 W",
            "source": FACTS + "arXiv 2605.23918 via sglang issue #27567",
        },
        {
            "quantity": "dense BF16 peak",
            "value": "362 TFLOPS at 2520 MHz boost (142 SMs)",
            "source": "NVIDIA L40S datasheet" + DATASHEET,
        },
        {
            "quantity": "GDDR6 bandwidth / capacity, TDP",
            "value": "864 GB/s / 48 GB; 350 W",
            "source": "NVIDIA L40S datasheet" + DATASHEET,
        },
    ],
    "l4": [
        {
            "quantity": "dense BF16 peak",
            "value": "121 TFLOPS at 2040 MHz boost (58 SMs)",
            "source": "NVIDIA L4 datasheet" + DATASHEET,
        },
        {
            "quantity": "GDDR6 bandwidth / capacity, TDP",
            "value": "300 GB/s / 24 GB; 72 W",
            "source": "NVIDIA L4 datasheet" + DATASHEET,
        },
    ],
    "b200": [
        {
            "quantity": "max SM / memory clock",
            "value": "1965 / 3996 MHz",
            "source": FACTS + "AWS EC2 doc",
        },
        {
            "quantity": "dense BF16 peak",
            "value": "2.25 PFLOPS (148 SMs)",
            "source": "NVIDIA HGX B200 datasheet" + DATASHEET,
        },
        {
            "quantity": "HBM3e bandwidth / capacity, TDP",
            "value": "8 TB/s / 180 GB; 1000 W",
            "source": "NVIDIA HGX B200 datasheet" + DATASHEET,
        },
    ],
}

MODEL_SOURCES: dict[str, dict[str, str]] = {
    "llama3-8b": {
        "quantity": "Llama-3.1-8B shape",
        "value": "8,030,261,248 parameters; 32 layers; "
        "8 KV heads; head_dim 128; d_model 4096; d_ff 14336",
        "source": "Meta Llama-3.1-8B-Instruct model card/config (vocabulary 128256, untied "
        "embeddings)" + DATASHEET,
    },
    "llama3-70b": {
        "quantity": "Llama-3.1-70B shape",
        "value": "70,553,706,496 parameters; 80 layers; "
        "8 KV heads; head_dim 128; d_model 8192; d_ff 28672",
        "source": "Meta Llama-3.1-70B-Instruct model card/config (vocabulary 128256, untied "
        "embeddings)" + DATASHEET,
    },
    "llama3-3b": {
        "quantity": "Llama-3.2-3B shape",
        "value": "3,212,749,824 parameters; 28 layers; "
        "8 KV heads; head_dim 128; d_model 3072; d_ff 8192",
        "source": "Meta Llama-3.2-3B-Instruct model card/config (vocabulary 128256, tied "
        "embeddings)" + DATASHEET,
    },
    "mixtral-8x7b": {
        "quantity": "Mixtral-8x7B shape",
        "value": "46.7B total / 12.9B active parameters; 32 layers; 8 experts, top-2; "
        "8 KV heads; d_model 4096; expert d_ff 14336",
        "source": "Mistral AI Mixtral-8x7B model card/config (vocabulary 32000, untied "
        "embeddings) and paper (arXiv 2401.04088)" + DATASHEET,
    },
}
