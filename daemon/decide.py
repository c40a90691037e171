"""Decide: build a controller from config, and wrap it in the safety limits.

One factory picks the controller with a ``match`` on the config's ``kind``; a new kind is
one more case. Safety limits wrap any controller, Gymnasium-style:
``MinimumDwell(FloorClock(ClampToSupported(inner, clocks), floor, clocks), dwell_s)``.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from gpugov.controllers.baseline import (
    ReactiveGovernor,
    fixed_clock_controller,
    maximum_clock_controller,
)
from gpugov.daemon.config import (
    ControllerConfig,
    FixedControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OnlineMPCControllerConfig,
    OpenLoopControllerConfig,
    PriorHintsConfig,
    ReactiveControllerConfig,
)
from gpugov.daemon.errors import ControllerError
from gpugov.plant.types import ClockController, ServingObservation

log = logging.getLogger(__name__)

CONTROLLER_SPEC_HELP = (
    "max | fixed:MHZ | reactive | open-loop:PLAN.json | mpc[:PROFILE] | mpc-slsqp[:PROFILE]"
    " | mpc-online[:PRIOR_PROFILE | :gpu=NAME,params_b=B,active_params_b=B,tp=N]"
)
ONLINE_HINT_KEYS = {
    "gpu": "gpu",
    "params_b": "params_b",
    "active_params_b": "active_params_b",
    "tp": "tensor_parallel",
    "tensor_parallel": "tensor_parallel",
    "profile": "prior_profile",
}
"""``--controller mpc-online:KEY=VALUE,...`` keys -> config fields."""
# Penalise predicted latency above 70% of each SLO: the proxies are means, the SLOs are
# judged per request (chosen on the scoreboard, see docs/scoreboard.md).
FAST_MPC_SLO_MARGIN = 0.7
FAST_MPC_TTFT_EXCESS_CAP = 1.0
"""The fast MPC stops penalising TTFT excess beyond one TTFT SLO (see MPCProblem)."""


def controller_name(controller: object) -> str:
    """A short label for metrics and logs."""
    return str(getattr(controller, "__name__", type(controller).__name__))


OLD_CONTROLLER_NAMES = {
    "maximum": "max",
    "maximum_clock": "max",
    "maximum_clock_controller": "max",
    "max_clock": "max",
    "reactive_governor": "reactive",
    "open_loop_clock": "open-loop",
    "open_loop": "open-loop",
    "offline": "open-loop",
    "Offline plan": "open-loop",
    "mpc_clock": "mpc",
    "mpc_fast": "mpc",
    "mpc_slsqp_clock": "mpc-slsqp",
    "mpc_slsqp": "mpc-slsqp",
    "best_fixed": "best-fixed",
    "window_oracle": "window-oracle",
}
"""Names older versions wrote (metrics labels, recordings, JSON) -> the one name now."""


def canonical_controller_name(name: str) -> str:
    """The one name of a controller (``max``, ``fixed:MHZ``, ``reactive``, ``open-loop``,
    ``mpc``, ``mpc-slsqp``), also for a name an older recording or result carries."""
    if name.startswith("fixed_") and name.endswith("_mhz"):
        return f"fixed:{name[len('fixed_') : -len('_mhz')]}"
    return OLD_CONTROLLER_NAMES.get(name, name)


def spec_name(spec: ControllerConfig) -> str:
    """The one name of a configured controller: its ``--controller`` spec without the
    argument (``fixed`` keeps its clock: ``fixed:1410``). Metrics labels, recordings,
    JSON and figures all use it."""
    if isinstance(spec, FixedControllerConfig):
        return f"fixed:{spec.clock_mhz:g}"
    return str(spec.kind)


def build_controller(
    spec: ControllerConfig,
    *,
    period_s: float,
    gpu_name: str | None = None,
    gpu_count: int | None = None,
) -> ClockController:
    """The controller a config section asks for.

    Args:
        spec: the ``[domains.controller]`` section.
        period_s: the daemon's control period (MPC plans on it).
        gpu_name, gpu_count: the domain's first GPU name (NVML) and its GPU count, for an
            ``mpc-online`` prior hint ``gpu = "auto"`` (:func:`first_gpu_name`).

    Raises:
        ControllerError: a plan file or profile cannot be loaded, or the kind's module is
            not available in this build.
    """
    match spec:
        case MaxControllerConfig():
            return maximum_clock_controller
        case FixedControllerConfig(clock_mhz=clock_mhz):
            return fixed_clock_controller(clock_mhz)
        case ReactiveControllerConfig():
            return ReactiveGovernor(
                up_fraction=spec.up_fraction,
                down_fraction=spec.down_fraction,
                queue_high_tokens=spec.queue_high_tokens,
                idle_utilization=spec.idle_utilization,
                step_mhz=spec.step_mhz,
            )
        case OpenLoopControllerConfig(plan=plan):
            from gpugov.controllers.open_loop import (
                OpenLoopClockController,
                PlanFormatError,
                load_plan,
            )

            try:
                return OpenLoopClockController(load_plan(plan))
            except PlanFormatError as error:
                raise ControllerError(str(error)) from error
        case MPCControllerConfig():
            return _build_mpc(spec, period_s)
        case OnlineMPCControllerConfig():
            return online_controller(spec, period_s, gpu_name=gpu_name, gpu_count=gpu_count)
    raise ControllerError(f"unknown controller kind {getattr(spec, 'kind', spec)!r}")


def first_gpu_name(names: Sequence[str]) -> str | None:
    """A domain's GPU name for ``gpu = "auto"``: its first GPU's, None when that one
    reports none."""
    return names[0] if names and names[0] else None


def mpc_controller(
    spec: MPCControllerConfig,
    plant: Any,
    period_s: float,
    *,
    mean_prompt_tokens: float | None = None,
    mean_output_tokens: float | None = None,
    virtual_time: bool = False,
) -> ClockController:
    """The MPC a config asks for, planning on ``plant``.

    Declared forecasts come from the config, else from the caller (the simulated modes
    pass the workload's means), else the controller's defaults. With ``virtual_time``
    (simulate, run --simulate --virtual, the scoreboard) a solve is bounded by a
    deterministic evaluation budget instead of the wall-clock ``solve_time_limit_s``, so
    a busy machine cannot change a decision.
    """
    from gpugov.controllers.adaptation import BurstHedge, SLOFeedback
    from gpugov.controllers.fast_mpc import DiscreteSearchSolver
    from gpugov.controllers.mpc import DEFAULT_SOLVE_BUDGET_EVALUATIONS, MPCController

    fast = spec.kind == "mpc"
    options: dict[str, Any] = {
        "horizon_s": spec.horizon_s,
        "control_period_s": period_s,
        "solve_time_limit_s": spec.solve_time_limit_s,
        "latency_model": spec.latency_model or ("iteration" if fast else "seed"),
        "slo_margin": spec.slo_margin or (FAST_MPC_SLO_MARGIN if fast else 1.0),
    }
    if fast:
        options["solver"] = DiscreteSearchSolver()
    # The online corrections default to on for the fast MPC, off for the seed's.
    if spec.burst_hedge if spec.burst_hedge is not None else fast:
        options["burst_hedge"] = BurstHedge()
    if spec.slo_feedback if spec.slo_feedback is not None else fast:
        options["slo_feedback"] = SLOFeedback()
    cap = spec.ttft_excess_cap or (FAST_MPC_TTFT_EXCESS_CAP if fast else None)
    if cap is not None:
        options["ttft_excess_cap"] = cap
    prompt = spec.mean_prompt_tokens or mean_prompt_tokens
    output = spec.mean_output_tokens or mean_output_tokens
    if prompt is not None:
        options["mean_prompt_tokens"] = prompt
    if spec.ttft_prompt_tokens is not None:
        options["ttft_prompt_tokens"] = spec.ttft_prompt_tokens
    if output is not None:
        options["mean_output_tokens"] = output
    if virtual_time:
        options["solve_budget_evaluations"] = DEFAULT_SOLVE_BUDGET_EVALUATIONS
    controller = MPCController(plant, **options)
    controller.__name__ = spec.kind
    return controller


def online_controller(
    spec: OnlineMPCControllerConfig,
    period_s: float,
    *,
    mean_prompt_tokens: float | None = None,
    mean_output_tokens: float | None = None,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    gpu_name: str | None = None,
    gpu_count: int | None = None,
    power_limit_w: float | None = None,
) -> ClockController:
    """The self-calibrating MPC a config asks for. It reads no profile while it runs;
    ``prior_profile``, when set, is read once here as a rough prior; ``prior`` hints are
    turned into one (``controllers.online_prior``): ``gpu = "auto"`` takes ``gpu_name``
    (NVML's), the TP degree defaults to ``gpu_count``. ``power_limit_w`` (the domain's
    summed enforced limit at start) stands in when an observation carries none.

    Raises:
        ControllerError: the prior profile cannot be loaded.
    """
    from gpugov.controllers.online_mpc import OnlineMPCController, prior_from_profile

    prior = None
    if spec.prior is not None:
        prior = _hinted_prior(spec, gpu_name, gpu_count)
    if spec.prior_profile is not None:
        from gpugov.plant import load_profile
        from gpugov.plant.profile import ProfileError

        try:
            prior = prior_from_profile(load_profile(spec.prior_profile))
        except ProfileError as error:
            raise ControllerError(f"mpc-online prior_profile: {error}") from error
    options: dict[str, Any] = {}
    prompt = spec.mean_prompt_tokens or mean_prompt_tokens
    output = spec.mean_output_tokens or mean_output_tokens
    if prompt is not None:
        options["mean_prompt_tokens"] = prompt
    if output is not None:
        options["mean_output_tokens"] = output
    return OnlineMPCController(
        ttft_prompt_tokens=spec.ttft_prompt_tokens,
        horizon_s=spec.horizon_s,
        control_period_s=period_s,
        solve_time_limit_s=spec.solve_time_limit_s,
        slo_margin=spec.slo_margin,
        warmup_s=spec.warmup_s,
        memory_s=spec.memory_s,
        uncertainty_z=spec.uncertainty_z,
        burst_guard=spec.burst_guard,
        decode_descent=spec.decode_descent,
        ttft_slo_s=ttft_slo_s,
        tpot_slo_s=tpot_slo_s,
        prior=prior,
        power_limit_w=power_limit_w,
        **options,
    )


def _hinted_prior(
    spec: OnlineMPCControllerConfig, gpu_name: str | None, gpu_count: int | None
) -> Any:
    """The prior of ``spec.prior``'s hints (None when they give none; one warning line
    for a GPU name that is unknown or, with ``auto``, not reported)."""
    from gpugov.controllers.online_prior import AUTO, PriorHints, prior_from_hints

    hints = spec.prior
    assert hints is not None
    gpu = hints.gpu
    if gpu is not None and gpu.strip().lower() == AUTO:
        gpu = gpu_name
        if not gpu:
            log.warning(
                'mpc-online prior: gpu = "auto" but the GPU reports no name; '
                "no prior from the GPU name"
            )
    return prior_from_hints(
        PriorHints(
            gpu=gpu or None,
            params_b=hints.params_b,
            active_params_b=hints.active_params_b,
            tensor_parallel=hints.tensor_parallel or max(1, gpu_count or 1),
        ),
        warn=log.warning,
    )


def _online_spec(text: str, argument: str) -> OnlineMPCControllerConfig:
    """``mpc-online:ARGUMENT``: a prior profile, or ``KEY=VALUE`` hints separated by
    commas (:data:`ONLINE_HINT_KEYS`).

    Raises:
        ValueError: one line naming the spec and the key.
    """
    if "=" not in argument:
        return OnlineMPCControllerConfig(kind="mpc-online", prior_profile=argument)
    fields: dict[str, Any] = {}
    hints: dict[str, Any] = {}
    for item in argument.split(","):
        key, equals, value = (part.strip() for part in item.partition("="))
        if key not in ONLINE_HINT_KEYS or not equals or not value:
            raise ValueError(
                f"--controller {text!r}: expected KEY=VALUE with KEY one of "
                f"{', '.join(sorted(ONLINE_HINT_KEYS))}, got {item!r}"
            )
        name = ONLINE_HINT_KEYS[key]
        if name == "prior_profile":
            fields[name] = value
            continue
        if name in ("params_b", "active_params_b"):
            try:
                number = float(value)
            except ValueError:
                raise ValueError(
                    f"--controller {text!r}: {key} must be a number of billions, got {value!r}"
                ) from None
            hints[name] = number
        elif name == "tensor_parallel":
            if not value.isdigit():
                raise ValueError(
                    f"--controller {text!r}: {key} must be a whole number of GPUs, got {value!r}"
                )
            hints[name] = int(value)
        else:
            hints[name] = value
    from pydantic import ValidationError

    try:
        if hints:
            fields["prior"] = PriorHintsConfig(**hints)
        return OnlineMPCControllerConfig(kind="mpc-online", **fields)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "prior"
        message = str(first["msg"]).removeprefix("Value error, ")
        if not message.startswith(where):
            message = f"{where}: {message}"
        raise ValueError(f"--controller {text!r}: {message}") from None


def _build_mpc(spec: MPCControllerConfig, period_s: float) -> ClockController:
    from gpugov.plant import ServingPlant, load_profile
    from gpugov.plant.profile import ProfileError

    try:
        plant = ServingPlant.from_profile(load_profile(spec.profile))
    except ProfileError as error:
        raise ControllerError(f"mpc controller: {error}") from error
    return mpc_controller(spec, plant, period_s)


def parse_controller_spec(text: str, *, default_profile: str | None = None) -> ControllerConfig:
    """A command-line ``--controller`` value as a controller config.

    ``max``, ``fixed:1410``, ``reactive``, ``open-loop:plan.json``, ``mpc`` or
    ``mpc:PROFILE`` (default: ``default_profile``); ``mpc-slsqp`` likewise. An argument
    where none is taken (``reactive:foo``), or an MPC profile that is neither a bundled
    profile nor a profile file, is refused.

    Raises:
        ValueError: naming the spec and what was expected.
    """
    kind, colon, argument = text.partition(":")
    match kind:
        case "max" | "maximum" | "reactive":
            if colon:
                raise ValueError(
                    f"--controller {text!r}: {kind} takes no argument; "
                    f"expected {CONTROLLER_SPEC_HELP}"
                )
            if kind == "reactive":
                return ReactiveControllerConfig(kind="reactive")
            return MaxControllerConfig(kind="max")
        case "fixed":
            try:
                clock = float(argument)
            except ValueError as error:
                raise ValueError(f"--controller fixed:MHZ needs a number, got {text!r}") from error
            if not math.isfinite(clock) or clock <= 0:
                raise ValueError(f"--controller fixed:MHZ needs a positive clock, got {text!r}")
            return FixedControllerConfig(kind="fixed", clock_mhz=clock)
        case "open-loop":
            if not argument:
                raise ValueError("--controller open-loop:PLAN.json needs the plan file")
            return OpenLoopControllerConfig.model_validate({"kind": "open-loop", "plan": argument})
        case "mpc-online":
            if argument:
                return _online_spec(text, argument)
            return OnlineMPCControllerConfig(kind="mpc-online")
        case "mpc" | "mpc-slsqp":
            if colon and not argument:
                raise ValueError(f"--controller {text!r}: name a profile after the colon")
            profile = argument or default_profile
            if argument:
                _check_profile(argument, text)
            if profile:
                return MPCControllerConfig(kind=kind, profile=profile)
            return MPCControllerConfig(kind=kind)
    raise ValueError(f"unknown controller {text!r}; expected {CONTROLLER_SPEC_HELP}")


def warm_up(
    controller: ClockController,
    clocks_mhz: Sequence[float],
    *,
    thermal_limit_c: float | None = None,
) -> float:
    """Make one dummy decision on a copy of ``controller`` and return its seconds.

    The copy sees an idle node at time 0, so whatever a controller pays on its first
    call (the fast MPC's kernel compile or cache load, lazy imports, cached candidate
    pools) is paid before the loop's clock starts, and the controller itself keeps no
    trace of it: its first real decision is the run's first decision. Called for every
    domain when it is assembled (:func:`daemon.service.build_domain`).
    """
    probe = copy.deepcopy(controller)
    observation = ServingObservation(
        time_s=0.0,
        step_index=0,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        thermal_limit_c=thermal_limit_c,
        supported_clocks_mhz=tuple(float(c) for c in clocks_mhz),
    )
    started = time.perf_counter()
    probe(observation)
    return time.perf_counter() - started


def _check_profile(name: str, text: str) -> None:
    """Refuse an MPC profile that is neither bundled nor a profile file (one line)."""
    from gpugov.plant.profile import ProfileError, resolve_profile_path

    try:
        resolve_profile_path(name)
    except ProfileError as error:
        raise ValueError(f"--controller {text!r}: {error}") from error


# ---------------------------------------------------------------------- wrappers
class ClampToSupported:
    """Quantise the inner decision down onto the supported clocks, within their range.

    A non-finite decision becomes the maximum clock (safe for latency) and is counted in
    ``invalid_decisions``.
    """

    def __init__(self, inner: ClockController, clocks_mhz: Sequence[float]) -> None:
        if not clocks_mhz:
            raise ValueError("ClampToSupported needs at least one supported clock")
        self.inner = inner
        self.clocks_mhz = tuple(sorted(float(c) for c in clocks_mhz))
        self.invalid_decisions = 0
        self.last_raw_mhz: float | None = None
        self.__name__ = controller_name(inner)

    def __call__(self, observation: ServingObservation) -> float:
        decision = self.inner(observation)  # a controller's exception propagates
        try:
            requested = float(decision)
        except (TypeError, ValueError):
            requested = math.nan
        self.last_raw_mhz = requested if math.isfinite(requested) else None
        if not math.isfinite(requested):
            self.invalid_decisions += 1
            return self.clocks_mhz[-1]
        eligible = [c for c in self.clocks_mhz if c <= requested + 1e-9]
        return eligible[-1] if eligible else self.clocks_mhz[0]


class FloorClock:
    """Never go below ``floor_mhz`` (rounded up onto the supported clocks)."""

    def __init__(
        self, inner: ClockController, floor_mhz: float, clocks_mhz: Sequence[float] = ()
    ) -> None:
        above = [float(c) for c in sorted(clocks_mhz) if c >= floor_mhz - 1e-9]
        self.floor_mhz = above[0] if above else float(floor_mhz)
        self.inner = inner
        self.__name__ = controller_name(inner)

    def __call__(self, observation: ServingObservation) -> float:
        return max(float(self.inner(observation)), self.floor_mhz)


class MinimumDwell:
    """Hold a clock for at least ``dwell_s`` (by ``observation.time_s``) before changing it.

    Frequent lock changes disturb NCCL collectives (NVIDIA/nccl#1551).
    """

    def __init__(self, inner: ClockController, dwell_s: float) -> None:
        if dwell_s < 0 or not math.isfinite(dwell_s):
            raise ValueError(f"dwell_s must be >= 0, got {dwell_s!r}")
        self.inner = inner
        self.dwell_s = float(dwell_s)
        self.held_mhz: float | None = None
        self._since_s = -math.inf
        self.suppressed = 0
        self.__name__ = controller_name(inner)

    def __call__(self, observation: ServingObservation) -> float:
        requested = float(self.inner(observation))
        if self.held_mhz is None or requested == self.held_mhz:
            if self.held_mhz is None:
                self._since_s = observation.time_s
            self.held_mhz = requested
            return requested
        if observation.time_s - self._since_s + 1e-9 < self.dwell_s:
            self.suppressed += 1
            return self.held_mhz
        self.held_mhz = requested
        self._since_s = observation.time_s
        return requested


def with_safety(
    inner: ClockController,
    clocks_mhz: Sequence[float],
    *,
    floor_mhz: float | None = None,
    dwell_s: float = 1.0,
) -> MinimumDwell:
    """The standard wrapping: clamp to supported, then the floor, then the dwell time."""
    controller: ClockController = ClampToSupported(inner, clocks_mhz)
    if floor_mhz is not None:
        controller = FloorClock(controller, floor_mhz, clocks_mhz)
    return MinimumDwell(controller, dwell_s)


def innermost(controller: object) -> object:
    """The controller inside every safety wrapper (for ``diagnostics()``)."""
    while isinstance(controller, ClampToSupported | FloorClock | MinimumDwell):
        controller = controller.inner
    return controller


def invalid_decisions(controller: object) -> int:
    """Non-finite decisions replaced by the maximum clock, over the wrapper chain."""
    while isinstance(controller, FloorClock | MinimumDwell):
        controller = controller.inner
    return controller.invalid_decisions if isinstance(controller, ClampToSupported) else 0
