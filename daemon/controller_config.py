"""The per-controller config models (``[domains.controller]``, ``--controller``): one frozen
model per ``kind``, joined in the :data:`ControllerConfig` union."""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gpugov.daemon.config_types import (
    ClockMHz,
    FrozenModel,
    LoosePath,
    PositiveSeconds,
    Seconds,
    TokenCount,
    UnitFraction,
    Watts,
    named_directory,
)
from gpugov.daemon.limits import MAX_PERIOD_S
from gpugov.plant.profile import DEFAULT_PROFILE

MIN_DECISION_TIMEOUT_S = 0.01
"""An outside controller's shortest decision deadline (``decision_timeout_s``)."""

MAX_UNCERTAINTY_Z = 10.0
"""Largest ``uncertainty_z``: ten standard deviations already price every clock at its
worst case (the default is 1.5), and 1e308 overflows the predicted latencies."""
MAX_TTFT_EXCESS_CAP = 1000.0
"""Largest ``ttft_excess_cap``, in TTFT SLOs: no first token waits a thousand SLOs, so a cap
this high never binds (the way to ask ``mpc`` for no cap)."""
MAX_PID_GAIN = 100.0
"""Largest ``pid`` gain: the loop's output is the clock's share of its range (0 to 1) and
its error a share of the SLO, so a gain of 100 already swings the whole range on 1 % of
the SLO (the defaults are 0.3, 0.5 and 0.05)."""
MAX_AGFT_ALPHA = 1000.0
"""Largest ``agft`` ``initial_alpha`` (exploration weight): a hundred times the paper's 10."""


class MaxControllerConfig(FrozenModel):
    """Always the highest supported clock (what the GPU does unlocked under load)."""

    kind: Literal["max"]


class FixedControllerConfig(FrozenModel):
    """One fixed clock, quantised down onto the supported set."""

    kind: Literal["fixed"]
    clock_mhz: ClockMHz


class ReactiveControllerConfig(FrozenModel):
    """The queue/latency step governor (``controllers.baseline.ReactiveGovernor``):
    ``up_fraction`` and ``down_fraction`` are shares of the SLO, in (0, 1]."""

    kind: Literal["reactive"]
    up_fraction: UnitFraction | None = None
    down_fraction: UnitFraction | None = None
    queue_high_tokens: TokenCount | None = None
    idle_utilization: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    step_mhz: ClockMHz | None = None

    @model_validator(mode="after")
    def _fractions_ordered(self) -> ReactiveControllerConfig:
        from gpugov.controllers.baseline import ReactiveGovernor

        default = ReactiveGovernor()
        up = self.up_fraction if self.up_fraction is not None else default.up_fraction
        down = self.down_fraction if self.down_fraction is not None else default.down_fraction
        if down > up:
            raise ValueError(
                f"down_fraction ({down:g}) must not exceed up_fraction "
                f"({up:g}): the governor would step up and down at once"
            )
        return self


class OpenLoopControllerConfig(FrozenModel):
    """Replays a saved open-loop plan (``controllers.open_loop.save_plan``)."""

    kind: Literal["open-loop"]
    plan: LoosePath


class MPCControllerConfig(FrozenModel):
    """Model-predictive control on the plant model built from a profile.

    ``mpc``: the fast discrete-search solver on the iteration-level latency model with a
    0.7 SLO margin. ``mpc-slsqp``: the seed's SLSQP solver on the seed's fluid model and
    SLOs (the reference). ``latency_model`` and ``slo_margin`` override either default;
    ``ttft_prompt_tokens`` is the declared prompt length the iteration model's TTFT proxy
    charges a new request (default: the mean prompt). ``burst_hedge`` (charge a new
    request the recent burst size) and ``slo_feedback`` (tighten the margin while measured
    latency nears the SLO) default to on for ``mpc`` and off for ``mpc-slsqp``; see
    ``controllers/adaptation.py``. ``ttft_excess_cap`` (in TTFT SLOs) caps the penalised
    TTFT excess: 1.0 for ``mpc``, no cap for ``mpc-slsqp``.
    """

    kind: Literal["mpc", "mpc-slsqp"]
    profile: str = DEFAULT_PROFILE
    horizon_s: PositiveSeconds | None = None
    solve_time_limit_s: PositiveSeconds | None = None
    mean_prompt_tokens: TokenCount | None = None
    mean_output_tokens: TokenCount | None = None
    ttft_prompt_tokens: TokenCount | None = None
    latency_model: Literal["iteration", "seed"] | None = None
    slo_margin: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    burst_hedge: bool | None = None
    slo_feedback: bool | None = None
    ttft_excess_cap: (
        Annotated[float, Field(gt=0, le=MAX_TTFT_EXCESS_CAP, allow_inf_nan=False)] | None
    ) = None


class PriorHintsConfig(FrozenModel):
    """Rough hints for ``mpc-online``'s prior (``controllers.online.prior``): the GPU
    (``"auto"``: the NVML name of the domain's first GPU; else a name such as
    ``"NVIDIA H100 80GB HBM3"``, matched by family), the served model's parameters in
    billions (total, and active per token for an MoE) and its tensor-parallel degree
    (default: the domain's GPU count). A wrong hint costs little: the warm-up still runs
    and the evidence overrules it."""

    gpu: str | None = None
    params_b: Annotated[float, Field(gt=0, le=1e5, allow_inf_nan=False)] | None = None
    active_params_b: Annotated[float, Field(gt=0, le=1e5, allow_inf_nan=False)] | None = None
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PriorHintsConfig:
        from gpugov.controllers.online.prior import PriorHints

        PriorHints(
            gpu=self.gpu,
            params_b=self.params_b,
            active_params_b=self.active_params_b,
            tensor_parallel=self.tensor_parallel or 1,
        )
        return self


class OnlineMPCControllerConfig(FrozenModel):
    """The self-calibrating MPC (``controllers.online.controller``): learns the node's clock ->
    latency/power model online, so it needs no profile (``docs/online.md``).

    ``prior_profile`` optionally names a bundled profile (or a manifest path) whose top
    clock seeds the model instead of the warm-up; ``prior`` gives rough hints instead
    (:class:`PriorHintsConfig`; not both). With neither, ``auto_hints`` (default on)
    derives the hints on the node: the GPU family from NVML's name and the model size from
    the engine's ``model_name`` (``controllers.online.prior.AutoHints``). ``state_dir``
    keeps the learned model across restarts (default: systemd's ``$STATE_DIRECTORY``,
    else none). ``warmup_s``: seconds at the maximum clock before the MPC takes over
    (``hinted_warmup_s`` once a hint has given the clock shape);
    ``memory_s``: how long evidence lasts; ``uncertainty_z``: standard deviations added
    to predicted latencies; ``burst_guard``: hold a clock that drains a prompt backlog in
    time and keeps short answers' mixed iterations within the TPOT SLO
    (``OnlineMPCController.burst_floor``);
    ``decode_descent``: in decode-only windows, lower the clock as far as the measured
    latency (grown like 1/f) allows, to the least optimistic decode energy
    (``OnlineMPCController.descent_clock``); ``latency_window_s``: the latency-driven
    rules read the engine's windowed latencies averaged over at least this long
    (``controllers.online.exploration.LatencyWindow``). ``ttft_prompt_tokens``: the tail
    prompt its MPC charges a new request: with a ``slo_target`` and the burst guard on,
    only in the share the attainment budget withholds below its default looseness (the
    guard drains a long prompt that does arrive); else always (default: the mean prompt).
    """

    kind: Literal["mpc-online"]
    horizon_s: PositiveSeconds | None = None
    solve_time_limit_s: PositiveSeconds | None = None
    mean_prompt_tokens: TokenCount | None = None
    mean_output_tokens: TokenCount | None = None
    ttft_prompt_tokens: TokenCount | None = None
    slo_margin: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    warmup_s: PositiveSeconds | None = None
    hinted_warmup_s: PositiveSeconds | None = None
    memory_s: PositiveSeconds | None = None
    uncertainty_z: (
        Annotated[float, Field(ge=0, le=MAX_UNCERTAINTY_Z, allow_inf_nan=False)] | None
    ) = None
    """0 to 10 (:data:`MAX_UNCERTAINTY_Z`)."""
    burst_guard: bool | None = None
    decode_descent: bool | None = None
    latency_window_s: Annotated[float, Field(ge=0.0, le=60.0, allow_inf_nan=False)] | None = None
    auto_hints: bool | None = None
    prior_profile: str | None = None
    prior: PriorHintsConfig | None = None
    state_dir: LoosePath | None = None

    _state_dir_named = field_validator("state_dir", mode="before")(named_directory)

    @model_validator(mode="after")
    def _one_prior(self) -> OnlineMPCControllerConfig:
        if self.prior is not None and self.prior_profile is not None:
            raise ValueError("set prior_profile or prior (hints), not both")
        return self


# ------------------------------------------------------- peer governors (controllers/peers)
class PowerCapControllerConfig(FrozenModel):
    """A static power cap with the clock left to the GPU (``controllers.peers.power_cap``):
    ``cap_w`` watts for the domain, else ``fraction`` (default 0.7) of the board limit the
    node first reports."""

    kind: Literal["power-cap"]
    cap_w: Watts | None = None
    fraction: UnitFraction | None = None


class DPSControllerConfig(FrozenModel):
    """A DPS-style cap steered from power telemetry every ``loop_s`` over the last
    ``window`` readings (``controllers.peers.dps``)."""

    kind: Literal["dps"]
    loop_s: PositiveSeconds | None = None
    window: Annotated[int, Field(ge=1, le=1000)] | None = None


class PowerProfileControllerConfig(FrozenModel):
    """A static clock ceiling plus cap (``controllers.peers.power_profile``): the given
    ``ceiling_mhz`` (and ``cap_w``), else the preset calibrated on ``profile`` (a bundled
    profile or a manifest path; in a simulation, default the simulated profile) keeping
    ``throughput_fraction`` (default 0.97) of the top clock's reference throughput."""

    kind: Literal["power-profile"]
    ceiling_mhz: ClockMHz | None = None
    cap_w: Watts | None = None
    profile: str | None = None
    throughput_fraction: UnitFraction | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PowerProfileControllerConfig:
        if self.ceiling_mhz is not None and self.profile is not None:
            raise ValueError("set ceiling_mhz (a preset) or profile (calibrate one), not both")
        if self.cap_w is not None and self.ceiling_mhz is None:
            raise ValueError("cap_w needs ceiling_mhz (the preset's clock ceiling)")
        return self


class DefaultDVFSControllerConfig(FrozenModel):
    """The unlocked GPU's default DVFS (``controllers.peers.default_dvfs``): the top clock,
    busy or idle, as a GPU holds it with the engine's CUDA context open (set
    ``idle_hold_s`` for one that drops to its lowest clock after that much idle time); the
    board power limit as the firmware enforces it."""

    kind: Literal["default-dvfs"]
    idle_hold_s: Seconds | None = None


class AGFTControllerConfig(FrozenModel):
    """AGFT's contextual LinUCB bandit over SM clocks (``controllers.peers.agft``); run it
    with ``daemon.period_s = 0.3``, its decision cycle."""

    kind: Literal["agft"]
    max_arms: Annotated[int, Field(ge=2, le=512)] | None = None
    initial_alpha: Annotated[float, Field(ge=0, le=MAX_AGFT_ALPHA, allow_inf_nan=False)] | None = (
        None
    )


PIDGain = Annotated[float, Field(ge=0, le=MAX_PID_GAIN, allow_inf_nan=False)]
"""A ``pid`` gain, 0 to :data:`MAX_PID_GAIN`."""


class PIDControllerConfig(FrozenModel):
    """PID on TTFT and TPOT (``controllers.peers.pid``): ``setpoint`` is the latency's
    target share of its SLO."""

    kind: Literal["pid"]
    setpoint: Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)] | None = None
    kp: PIDGain | None = None
    ki: PIDGain | None = None
    kd: PIDGain | None = None


class ThrottLLeMControllerConfig(FrozenModel):
    """throttLL'eM-style projection and lowest meeting clock
    (``controllers.peers.throttllem``): ``margin`` is the share of the TPOT SLO the
    predicted iteration time must stay within."""

    kind: Literal["throttllem"]
    margin: UnitFraction | None = None


class GreenLLMControllerConfig(FrozenModel):
    """GreenLLM's dual-loop decode controller and fitted prefill clock
    (``controllers.peers.greenllm``): ``target`` is the decode band's centre as a share
    of the TPOT SLO."""

    kind: Literal["greenllm"]
    target: UnitFraction | None = None


class VoltanaControllerConfig(FrozenModel):
    """VoltanaLLM's per-phase rule (``controllers.peers.voltana``): the lowest clock of a
    short list whose latency, learned from the node's windows, meets ``(1 + margin)`` x
    the role's SLO (TTFT on a prefill pool, TPOT on a decode pool)."""

    kind: Literal["voltana"]
    margin: Annotated[float, Field(gt=-1, le=1, allow_inf_nan=False)] | None = None
    levels: Annotated[int, Field(ge=2, le=512)] | None = None


class ExternalControllerConfig(FrozenModel):
    """A controller from another package: ``factory`` is ``"module:callable"``, called
    once with the domain's :class:`~gpugov.daemon.decide.ControllerContext` (without the
    simulated plant: a node's view) and returning the controller
    (``docs/benchmark.md``). ``name`` is its one name in metrics and results (default the
    entry point's name, else ``factory``). ``decision_timeout_s`` is how long a node waits
    for one decision before that tick takes the fail-safe (default the control period;
    :mod:`daemon.deadline`)."""

    kind: Literal["external"]
    factory: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=64)] | None = None
    decision_timeout_s: (
        Annotated[float, Field(ge=MIN_DECISION_TIMEOUT_S, le=MAX_PERIOD_S, allow_inf_nan=False)]
        | None
    ) = None


PEER_CONTROLLER_CONFIGS = (
    PowerCapControllerConfig,
    DPSControllerConfig,
    PowerProfileControllerConfig,
    DefaultDVFSControllerConfig,
    AGFTControllerConfig,
    PIDControllerConfig,
    ThrottLLeMControllerConfig,
    GreenLLMControllerConfig,
    VoltanaControllerConfig,
)
"""The peer governors' config kinds (``docs/benchmark.md``)."""

POWER_CAP_KINDS = frozenset({"power-cap", "dps", "power-profile", "default-dvfs"})
"""The controller kinds that set a GPU power limit as well as a clock
(:class:`~gpugov.plant.types.PowerCapping`): a node runs them only where its backend sets
power limits (``backend = "nvml"``)."""
POWER_LIMIT_BACKENDS = frozenset({"nvml"})
"""The node backends that set a GPU power limit (the others lock clocks only)."""


ControllerConfig = Annotated[
    MaxControllerConfig
    | FixedControllerConfig
    | ReactiveControllerConfig
    | OpenLoopControllerConfig
    | MPCControllerConfig
    | OnlineMPCControllerConfig
    | PowerCapControllerConfig
    | DPSControllerConfig
    | PowerProfileControllerConfig
    | DefaultDVFSControllerConfig
    | AGFTControllerConfig
    | PIDControllerConfig
    | ThrottLLeMControllerConfig
    | GreenLLMControllerConfig
    | VoltanaControllerConfig
    | ExternalControllerConfig,
    Field(discriminator="kind"),
]


def controller_kinds() -> frozenset[str]:
    """Every ``kind`` the ``ControllerConfig`` union accepts (read from the union, so a
    new kind is never left out)."""
    union = typing.get_args(ControllerConfig)[0]
    return frozenset(
        kind
        for spec in typing.get_args(union)
        for kind in typing.get_args(spec.model_fields["kind"].annotation)
    )
