"""A rough prior for ``mpc-online`` from config hints: GPU name, parameter count, TP degree.

A node's operator usually knows which GPU it has (NVML reports the name), roughly how big
the served model is and over how many GPUs it is split. From that alone the plant's own
roofline physics (:mod:`gpugov.plant.roofline`, the board figures of
:mod:`gpugov.plant.zoo` and the fitted efficiencies of :mod:`gpugov.plant.calibration`)
gives a rough per-clock picture: prefill seconds per prompt token, the per-iteration
(weight-streaming) part of a decode iteration, the per-request and per-context-token parts,
and the board power. :func:`prior_from_hints` turns it into a :class:`ModelPrior` that
keeps the warm-up (``replaces_warmup=False``) and gives the identification only what a rough
hint can be trusted with: the *clock shape* of each part of the time model (which parts are
memory-bound, flat in the clock), relative to the top clock, so clocks not yet explored
are predicted by the physics instead of the compute-bound extrapolation. The level comes
from the warm-up's evidence, never from the hint (a parameter count off by 10x would
otherwise bias it and inflate the regression's noise estimate); the prior's covariance
stays the no-hint one (30 % relative, correlated over the clocks), so every visited clock
overrules the shape (``docs/online.md``).

The model shape behind a parameter count is a Llama-like one (``d_ff = 3.5 d``, 8 KV heads
of 128, about 115 ``d_model`` per layer); an MoE (``active_params_b`` below
``params_b``) gets two routed experts per token and as many experts as the total needs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpugov.controllers.online.identification import REFERENCE_BATCH, ModelPrior
from gpugov.controllers.online.model_names import hints_from_model_name, served_models
from gpugov.plant import calibration
from gpugov.plant.roofline import Domain, RooflineParameters
from gpugov.plant.zoo import GPUS, GpuSpec, ModelSpec, ProfileSpec

GPU_FAMILIES: tuple[tuple[str, str], ...] = (
    ("B200", "b200"),
    ("H200", "h200"),
    # GH200's GPU is the H100's die (132 SMs, 1,980 MHz) with HBM3 or HBM3e at 4.0 or
    # 4.9 TB/s: nearer the H200's 4.8 TB/s than the H100's 3.35.
    ("GH200", "h200"),
    ("H100", "h100"),
    ("H800", "h100"),  # the H100's die and clocks, with less NVLink bandwidth
    ("A100", "a100"),
    ("A800", "a100"),  # the A100's die and clocks, with less NVLink bandwidth
    ("L40S", "l40s"),
    ("L4", "l4"),
)
"""NVML name token -> board of :data:`gpugov.plant.zoo.GPUS` (first match wins; a token
matches only as a whole word: ``L40`` is not ``L4``). Export variants of a board's die
(H800, A800) and the Grace Hopper superchip's GPU take that board's figures."""
MAX_HINTED_TP = 64
"""The widest tensor-parallel group a hint describes (the config's bound)."""
AUTO = "auto"
"""``gpu = "auto"``: the daemon fills in the NVML name of the domain's first GPU."""
LAYER_WIDTH_RATIO = 115.0
"""Llama-like aspect ratio: ``d_model / n_layers`` of Llama 3.x 3B, 8B, 70B is 110-128."""


class HintError(ValueError):
    """A hint value is out of range; the message names the field."""


@dataclass(frozen=True, slots=True)
class PriorHints:
    """What the operator declares about a domain (all optional).

    Args:
        gpu: NVML device name such as ``"NVIDIA H100 80GB HBM3"`` (matched by family).
        params_b: total parameters of the served model, billions.
        active_params_b: parameters active per token (MoE), billions; default ``params_b``.
        tensor_parallel: GPUs the model is split over (the domain's GPUs).
    """

    gpu: str | None = None
    params_b: float | None = None
    active_params_b: float | None = None
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        for name in ("params_b", "active_params_b"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or not 0.0 < value <= 1e5):
                raise HintError(
                    f"prior.{name} must be a positive number of billions, got {value!r}"
                )
        if (
            self.active_params_b is not None
            and self.params_b is not None
            and self.active_params_b > self.params_b
        ):
            raise HintError(
                f"prior.active_params_b ({self.active_params_b:g}) exceeds "
                f"prior.params_b ({self.params_b:g})"
            )
        if self.active_params_b is not None and self.params_b is None:
            raise HintError("prior.active_params_b needs prior.params_b (the total)")
        tp = self.tensor_parallel
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_HINTED_TP:
            raise HintError(
                f"prior.tensor_parallel must be an integer 1-{MAX_HINTED_TP}, got {tp!r}"
            )
        if self.gpu is not None and not self.gpu.strip():
            raise HintError('prior.gpu must name a GPU (or be "auto"), got an empty string')


def gpu_family(name: str) -> GpuSpec | None:
    """The board of :data:`GPU_FAMILIES` an NVML device name belongs to, or None."""
    upper = name.upper()
    for token, key in GPU_FAMILIES:
        if re.search(rf"(?<![A-Z0-9]){token}(?![A-Z0-9])", upper):
            return GPUS[key]
    return None


def model_shape(params_b: float, active_params_b: float | None = None) -> ModelSpec:
    """A Llama-like :class:`ModelSpec` with ``params_b`` billion parameters (MoE when
    ``active_params_b`` is below it): a rough stand-in for a model we only know the size of."""
    total = params_b * 1e9
    active = (active_params_b or params_b) * 1e9
    # Per layer about 13 d^2 (attention with 8 KV heads of 128 plus a gated MLP of 3.5 d).
    d_model = max(512, int(round((active * LAYER_WIDTH_RATIO / 13.0) ** (1.0 / 3.0) / 128.0)) * 128)
    n_layers = max(1, int(round(active / (13.0 * d_model * d_model))))
    n_heads = d_model // 128
    n_kv = min(8, n_heads)
    attention = d_model * (d_model + 2 * n_kv * 128) + d_model * d_model
    if total <= active * 1.05:
        d_ff = max(256, int(round((active / n_layers - attention) / (3 * d_model) / 256)) * 256)
        return ModelSpec(
            "hint",
            "hinted model",
            int(total),
            int(active),
            n_layers,
            n_heads,
            n_kv,
            128,
            d_model,
            d_ff,
        )
    per_expert = max(1.0, (active / n_layers - attention) / 2.0)  # two experts per token
    experts = max(3, int(round((total / n_layers - attention) / per_expert)))
    d_ff = max(128, int(round(per_expert / (3 * d_model))))
    return ModelSpec(
        "hint",
        "hinted MoE model",
        int(total),
        int(active),
        n_layers,
        n_heads,
        n_kv,
        128,
        d_model,
        d_ff,
        n_experts=experts,
        experts_per_token=2,
        expert_parameter_count=min(int(total), int(experts * per_expert * n_layers)),
    )


def _domain(gpu: GpuSpec, model: ModelSpec, tp: int) -> Domain:
    spec = ProfileSpec("hint", gpu.key, model.key, tp, REFERENCE_BATCH, 1.0, 0.1, "hint")
    # All-reduce timings exist for H100 and A100 nodes only: other boards borrow H100's.
    source = gpu.all_reduce_from
    if tp > 1 and all(g != source for g, _ in calibration.all_reduce_points()):
        source = "h100"
    return Domain(
        spec,
        replace(gpu, all_reduce_from=source),
        model,
        calibration.fit_efficiency(gpu.efficiency_from),
        RooflineParameters(),
        calibration.fit_attention(),
    )


def time_table(
    gpu: GpuSpec, model: ModelSpec, tensor_parallel: int
) -> tuple[tuple[float, float, float, float, float], ...]:
    """Per supported clock of ``gpu`` (15 MHz grid): ``(clock MHz, prefill s per prompt
    token, decode s per iteration, s per running request per iteration, s per context token
    per iteration)`` from the plant's roofline (:class:`gpugov.plant.roofline.Domain`)."""
    domain = _domain(gpu, model, tensor_parallel)
    params = domain.params
    prompt = float(params.reference_prompt_tokens)
    rows = []
    for clock in [*domain.clocks()[::4], gpu.max_clock_mhz]:
        f = float(clock)
        prefill = domain.prefill_s(f) / prompt
        iteration = (
            domain.linear_s(f, REFERENCE_BATCH)
            + domain.all_reduce_s(REFERENCE_BATCH)
            + domain.attention_launch_s()
            + params.fixed_iteration_overhead_s
        )
        per_request = params.per_sequence_overhead_s
        per_context = domain.kv_s(f, 1.0, 1.0)
        rows.append((f, prefill, iteration, per_request, per_context))
    return tuple(sorted(set(rows)))


def prior_from_hints(
    hints: PriorHints, *, warn: Callable[[str], None] | None = None
) -> ModelPrior | None:
    """The :class:`ModelPrior` the hints support, or None when they give nothing.

    The GPU alone gives the board power (TDP x TP: the power-cap fallback and the scale of
    the power prior when NVML reports no limit); with ``params_b`` it also gives the
    per-clock time shape (:func:`time_table`). An unknown GPU name
    calls ``warn`` once and gives no prior from the name; ``"auto"`` must have been
    replaced by the NVML name before this is called (otherwise it is ignored).
    """
    if hints.gpu is None or hints.gpu.strip().lower() == AUTO:
        return None
    gpu = gpu_family(hints.gpu)
    if gpu is None:
        if warn is not None:
            families = ", ".join(token for token, _ in GPU_FAMILIES)
            warn(
                f"mpc-online prior: GPU {hints.gpu!r} is not a known family ({families}); "
                "no prior from the GPU name"
            )
        return None
    tp = hints.tensor_parallel
    table: tuple[tuple[float, float, float, float, float], ...] = ()
    if hints.params_b is not None:
        table = time_table(gpu, model_shape(hints.params_b, hints.active_params_b), tp)
    return ModelPrior(
        time_table=table,
        replaces_warmup=False,
        board_power_w=gpu.tdp_w * tp,
        source=f"hint: {gpu.gpu} x{tp}"
        + (f", {hints.params_b:g}B parameters" if hints.params_b is not None else ""),
    )


@dataclass
class AutoHints:
    """Hints a node derives itself, for ``mpc-online`` with no ``prior`` configured: the
    GPU family from NVML's device name and the model size from the engine's
    ``model_name`` (:func:`controllers.online.model_names.hints_from_model_name`).

    :meth:`prior_for` is asked once per served model name (the controller asks when the
    first name arrives and when it changes); a name that states no size, or a GPU that is
    not a known family, gives no prior and one warning line, never one per tick.

    Args:
        gpu: NVML name of the domain's first GPU (None: not reported).
        tensor_parallel: the GPUs the model is split over (the domain's GPU count).
        warn: where the warning lines go (the daemon's log); None drops them.
    """

    gpu: str | None = None
    tensor_parallel: int = 1
    warn: Callable[[str], None] | None = None
    _priors: dict[str, ModelPrior | None] = field(default_factory=dict, repr=False)
    _said: set[str] = field(default_factory=set, repr=False)

    def _warn_once(self, message: str) -> None:
        if message not in self._said and self.warn is not None:
            self.warn(message)
        self._said.add(message)

    def warm(self) -> None:
        """Fit now what a prior for this GPU needs whatever the model (the roofline's
        efficiency and attention fits, cached for the process): done at the first
        ``model_name``, it took 40-110 ms of one decision, seconds into a run."""
        spec = gpu_family(self.gpu) if self.gpu else None
        if spec is not None:
            calibration.fit_efficiency(spec.efficiency_from)
            calibration.fit_attention()
            calibration.all_reduce_points()

    def prior_for(self, model_name: str, engines: int = 1) -> ModelPrior | None:
        """The prior for ``model_name`` served on this domain's GPUs (None when the name
        or the GPU gives none), for one of ``engines`` data-parallel engines that share
        them evenly (each on ``tensor_parallel / engines`` GPUs; the domain's GPUs where
        they do not divide evenly); computed once per name and engine count."""
        key = model_name if engines == 1 else f"{model_name}\x00{engines}"
        if key in self._priors:
            return self._priors[key]
        tp = self.tensor_parallel
        if engines > 1 and isinstance(tp, int) and tp % engines == 0:
            tp //= engines
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_HINTED_TP:
            # The hints' roofline knows TP groups of 1-64 GPUs; a wider domain (a profile
            # the loader takes up to 1,024) learns with no prior, never fails a decision.
            self._warn_once(
                f"mpc-online: a tensor-parallel group of {tp!r} GPUs is beyond the hints' "
                f"1-{MAX_HINTED_TP}; no prior from the GPU and model names"
            )
            return None
        params_b: float | None = None
        active_params_b: float | None = None
        size = hints_from_model_name(model_name)
        if size is None and len(served_models(model_name)) > 1:
            self._warn_once(
                f"mpc-online: the engine serves several models ({model_name!r}) whose names "
                "state no one size; no prior from them"
            )
        elif size is None:
            self._warn_once(
                f"mpc-online: the served model's name {model_name!r} states no size "
                "(such as 70B, 8x7B or 30B-A3B); no prior from it"
            )
        else:
            params_b, active_params_b = size
        prior = None
        if not self.gpu:
            self._warn_once("mpc-online: the GPU reports no name; no prior from the GPU name")
        else:
            try:
                hints = PriorHints(
                    gpu=self.gpu,
                    params_b=params_b,
                    active_params_b=active_params_b,
                    tensor_parallel=tp,
                )
            except HintError as error:
                # A name is the engine's label, not the operator's config: a size no
                # model has (Mix-999x9999B) is no hint, never a controller error.
                self._warn_once(
                    f"mpc-online: the served model's name {model_name!r} gives no usable "
                    f"size ({error}); no prior from it"
                )
                hints = PriorHints(gpu=self.gpu, tensor_parallel=tp)
            prior = prior_from_hints(hints, warn=self._warn_once)
        if prior is not None:
            prior = replace(prior, source=f"{prior.source} (served model {model_name!r})")
        if len(self._priors) >= 16:
            self._priors.pop(next(iter(self._priors)))
        self._priors[key] = prior
        return prior


__all__ = [
    "AUTO",
    "GPU_FAMILIES",
    "AutoHints",
    "HintError",
    "PriorHints",
    "gpu_family",
    "model_shape",
    "prior_from_hints",
    "time_table",
]
