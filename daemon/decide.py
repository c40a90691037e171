"""Decide: the one factory that builds a controller from its spec and a context.

:func:`build_controller` is the only way to make a controller: the node, ``run
--simulate``, ``simulate``, ``replay``, sweeps and the scoreboard all call it. It picks the
algorithm with a ``match`` on the spec's ``kind`` (a new kind is one more case), gives it
what the :class:`ControllerContext` says it may know, keeps a learner's model in the state
directory when there is one, and wraps it in the node's safety chain
(:mod:`daemon.safety`), so what a study measures is what a node runs.
"""

from __future__ import annotations

import copy
import logging
import math
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpugov.controllers.baseline import (
    ReactiveGovernor,
    fixed_clock_controller,
    maximum_clock_controller,
)
from gpugov.controllers.contract import (
    Closable,
    ControllerWrapper,
    HistoryBounded,
    chain_layer,
    layers,
    unwrap,
)
from gpugov.daemon.controller_config import (
    AGFTControllerConfig,
    ControllerConfig,
    DefaultDVFSControllerConfig,
    DPSControllerConfig,
    ExternalControllerConfig,
    FixedControllerConfig,
    GreenLLMControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OnlineMPCControllerConfig,
    OpenLoopControllerConfig,
    PIDControllerConfig,
    PowerCapControllerConfig,
    PowerProfileControllerConfig,
    ReactiveControllerConfig,
    ThrottLLeMControllerConfig,
    VoltanaControllerConfig,
)
from gpugov.daemon.controller_spec import load_factory, spec_name
from gpugov.daemon.errors import ControllerError
from gpugov.daemon.limits import MIN_PERIOD_S
from gpugov.daemon.roles import COLOCATED, OBJECTIVES, RoleView, check_role, role_weights
from gpugov.daemon.safety import SafetySettings, with_safety
from gpugov.plant.types import ClockController, Request, ServingObservation

if TYPE_CHECKING:
    from gpugov.plant import ServingPlant

log = logging.getLogger(__name__)

TimeMode = Literal["wall", "virtual"]


@dataclass(frozen=True, slots=True)
class Forecasts:
    """Declared workload forecasts, fixed before a run (None: the controller's default)."""

    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    ttft_prompt_tokens: float | None = None
    """The prompt length the iteration model's TTFT proxy charges a new request."""

    @classmethod
    def from_workload(cls, workload: Sequence[Request]) -> Forecasts:
        """A study's declared forecasts: the workload's mean prompt and output lengths (as
        the seed's experiment declares them) and its 95th-percentile prompt (a mean prompt
        underestimates TTFT tails on long-prompt traces)."""
        import numpy as np

        from gpugov.controllers.mpc.controller import expected_output_tokens_forecast

        if not workload:
            return cls()
        prompts = np.array([r.prompt_tokens for r in workload], dtype=float)
        return cls(
            mean_prompt_tokens=float(prompts.mean()),
            mean_output_tokens=expected_output_tokens_forecast(workload),
            ttft_prompt_tokens=float(np.percentile(prompts, 95)),
        )


@dataclass(frozen=True)
class ControllerContext:
    """What a controller may know about where it runs: one frozen value per domain.

    Attributes:
        period_s: the control period it is called on.
        supported_clocks_mhz: the domain's supported SM clocks, ascending.
        gpu_names, gpu_uuids, gpu_count: the domain's GPUs (NVML names and UUIDs).
        power_limit_w: the domain's summed enforced power limit at start, if known.
        ttft_slo_s, tpot_slo_s, thermal_limit_c: the limits the node states.
        forecasts: declared workload forecasts (a spec's own values win).
        time_mode: ``"wall"`` (a node: solves bounded by wall-clock limits) or
            ``"virtual"`` (simulations: bounded by a deterministic evaluation budget, so
            a busy machine cannot change a decision).
        state_dir: where a learner keeps its model across restarts (None: nowhere).
        state_read_only: the learner restores its model from ``state_dir`` and never
            writes there (a dry run, beside the node's own daemon).
        domain: the domain's name (names the state file).
        safety: the chain's floor and dwell.
        plant: the plant model an ``mpc`` plans on in a simulated run (its own plant);
            None on a node, where the spec's profile is loaded.
        plan: an open-loop plan computed offline (the scoreboard's); None: the spec's
            plan file.
        history_limit: how many decisions' plans and solve times a controller keeps
            (a node bounds it; None keeps all).
        slo_target: the domain's SLO target (``controllers.budget.SLOTarget``): ``mpc``
            and ``mpc-online`` spend the misses it allows; None: they hold the SLO with
            their fixed margins.
        budget_guard: hold the clock within the power budget each observation carries
            (its ``power_limit_w``) by the controller's own model, and degrade by the
            budget rule when the budget is below the need
            (:class:`controllers.power_need.BudgetGuard`, ``docs/power-budget.md``); a
            node always does, a study when it asks.
        budget_enforced: with ``budget_guard``, whether the guard holds the budget by the
            clock (a budget configured in the node: ``power_budget_w`` or
            ``power_budget_file``) or only reports the need against it (the GPUs' own
            power limit alone, which their firmware enforces).
        role: the domain's pool role in disaggregated serving (``"prefill"``,
            ``"decode"`` or ``"colocated"``, :mod:`daemon.roles`): a prefill domain is
            judged on TTFT only, a decode domain on TPOT only (:attr:`objectives`);
            the other objective is inactive: the controller sees no measurement of it
            (:class:`daemon.roles.RoleView`) and ``mpc`` / ``mpc-online`` weigh it zero.
    """

    period_s: float
    supported_clocks_mhz: tuple[float, ...]
    gpu_names: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    gpu_count: int = 1
    power_limit_w: float | None = None
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    thermal_limit_c: float | None = None
    forecasts: Forecasts = field(default_factory=Forecasts)
    time_mode: TimeMode = "wall"
    state_dir: Path | None = None
    state_read_only: bool = False
    domain: str = "default"
    safety: SafetySettings = field(default_factory=SafetySettings)
    plant: ServingPlant | None = None
    plan: Any = None
    history_limit: int | None = None
    slo_target: Any = None
    budget_guard: bool = False
    budget_enforced: bool = True
    role: str = "colocated"

    def __post_init__(self) -> None:
        if not math.isfinite(self.period_s) or self.period_s <= 0:
            raise ValueError(f"period_s must be positive, got {self.period_s!r}")
        if not self.supported_clocks_mhz:
            raise ValueError("a controller context needs the supported clocks")
        clocks = tuple(sorted(float(c) for c in self.supported_clocks_mhz))
        object.__setattr__(self, "supported_clocks_mhz", clocks)
        if self.gpu_count < 1:
            raise ValueError(f"gpu_count must be >= 1, got {self.gpu_count!r}")
        check_role(self.role)

    @property
    def objectives(self) -> tuple[str, ...]:
        """The latency objectives the domain is judged on: ``("ttft",)`` for a prefill
        domain, ``("tpot",)`` for a decode one, both for a colocated one."""
        return OBJECTIVES[self.role]

    @property
    def gpu_name(self) -> str | None:
        """The first GPU's NVML name, for an ``mpc-online`` hint ``gpu = "auto"``."""
        return self.gpu_names[0] if self.gpu_names and self.gpu_names[0] else None

    def recorded(self) -> dict[str, Any]:
        """What a recording's header keeps of the context beyond the fields it carries
        otherwise (period, clocks, GPU names, safety, SLO target, role): the SLOs, the
        thermal and power limits, the GPUs' UUIDs and the declared forecasts, so that
        ``replay`` gives a controller the context the node gave it."""
        return {
            "ttft_slo_s": self.ttft_slo_s,
            "tpot_slo_s": self.tpot_slo_s,
            "thermal_limit_c": self.thermal_limit_c,
            "power_limit_w": self.power_limit_w,
            "gpu_uuids": list(self.gpu_uuids),
            "forecasts": {name: getattr(self.forecasts, name) for name in FORECAST_FIELDS},
        }

    @classmethod
    def for_plant(
        cls,
        plant: ServingPlant,
        workload: Sequence[Request],
        *,
        period_s: float,
        safety: SafetySettings | None = None,
        time_mode: TimeMode = "virtual",
        replicas: int = 1,
        **more: Any,
    ) -> ControllerContext:
        """A simulated domain's context: the plant's clocks and GPUs (``replicas`` engines'
        of them: a pool of data-parallel engines is one domain on a node), the SLOs its
        profile states (as a simulated node's config states them), forecasts declared
        from the workload, the plant itself for an ``mpc``; virtual time by default."""
        from gpugov.daemon.profile_identity import profile_gpu_name, profile_gpu_uuids

        profile = plant.profile
        gpus = plant.tensor_parallel * max(1, replicas)
        values: dict[str, Any] = {
            "period_s": period_s,
            "supported_clocks_mhz": tuple(float(c) for c in profile.clock_mhz),
            "gpu_names": (profile_gpu_name(profile) or "",) * gpus,
            "gpu_uuids": profile_gpu_uuids(profile, gpus),
            "gpu_count": gpus,
            "ttft_slo_s": profile.ttft_slo_s,
            "tpot_slo_s": profile.tpot_slo_s,
            "thermal_limit_c": plant.thermal_limit_c,
            "time_mode": time_mode,
            "safety": safety or SafetySettings(),
            "plant": plant,
        }
        if "forecasts" not in more:  # given (a fleet's nodes share one): not built again
            values["forecasts"] = Forecasts.from_workload(workload)
        return cls(**{**values, **more})


FORECAST_FIELDS = ("mean_prompt_tokens", "mean_output_tokens", "ttft_prompt_tokens")


def declared_spec(spec: ControllerConfig, forecasts: Forecasts) -> ControllerConfig:
    """``spec`` with the forecasts it leaves open declared from ``forecasts``: the spec the
    controller really runs, which a recording keeps so that a replay rebuilds it."""
    if not isinstance(spec, MPCControllerConfig | OnlineMPCControllerConfig):
        return spec
    update = {
        name: getattr(forecasts, name)
        for name in FORECAST_FIELDS
        if getattr(spec, name) is None and getattr(forecasts, name) is not None
    }
    return spec.model_copy(update=update) if update else spec


def build_controller(spec: ControllerConfig, context: ControllerContext) -> ControllerWrapper:
    """The controller ``spec`` asks for, in the safety chain, as a node runs it.

    The result is ``MinimumDwell(FloorClock(ThermalGuard(ClampToSupported(algorithm))))``
    (the floor only when set); for ``mpc-online`` with a state directory the algorithm is wrapped in
    :class:`daemon.model_store.PersistentOnlineModel` first, and with
    ``context.budget_guard`` in :class:`controllers.power_need.BudgetGuard` inside the
    chain. On a node (``context.time_mode == "wall"``) an outside controller (``external``)
    runs inside :class:`daemon.deadline.DecisionDeadline`: its call has a deadline
    (:func:`decision_deadline_s`) on a worker thread; in virtual time it makes its
    warm-up decision here (:func:`warmed_when_built`). Every layer is named after the spec
    (:func:`spec_name`).

    Raises:
        ControllerError: a plan file or profile cannot be loaded, or the kind's module is
            not available in this build.
    """
    spec = declared_spec(spec, context.forecasts)
    algorithm = _algorithm(spec, context)
    if isinstance(algorithm, HistoryBounded) and context.history_limit is not None:
        algorithm.history_limit = context.history_limit
    inner: ClockController = algorithm
    if isinstance(spec, ExternalControllerConfig) and context.time_mode == "wall":
        # Outside code is unbounded: on a node its call gets a deadline (daemon.deadline).
        from gpugov.daemon.deadline import DecisionDeadline

        inner = DecisionDeadline(algorithm, decision_deadline_s(spec, context.period_s))
    if isinstance(spec, OnlineMPCControllerConfig) and context.state_dir is not None:
        from gpugov.daemon.model_store import PersistentOnlineModel

        inner = PersistentOnlineModel(
            algorithm,  # type: ignore[arg-type]
            context.state_dir,
            context.domain,
            context.gpu_uuids or tuple(str(i) for i in range(context.gpu_count)),
            gpu_names=context.gpu_names,  # kept with the model: `model export` names the board
            read_only=context.state_read_only,
        )
    if context.budget_guard:
        from gpugov.controllers.power_need import BudgetGuard

        inner = BudgetGuard(inner, enforce=context.budget_enforced)
    if context.role != COLOCATED:
        inner = RoleView(inner, context.role)
    chain = with_safety(
        inner, context.supported_clocks_mhz, context.safety, period_s=context.period_s
    )
    name = spec_name(spec)
    for layer in layers(chain):
        if isinstance(layer, ControllerWrapper):
            layer.name = name
    if warmed_when_built(spec, context):
        try:
            warm_up(chain, context.supported_clocks_mhz, thermal_limit_c=context.thermal_limit_c)
        except Exception as error:  # as on a node: its decisions meet a failing controller
            log.warning("controller %s: its warm-up decision raised %r", name, error)
    return chain


def warmed_when_built(spec: ControllerConfig, context: ControllerContext) -> bool:
    """Whether :func:`build_controller` makes the controller's warm-up decision itself (a
    node's start makes it otherwise): an outside controller in virtual time (``simulate``,
    every study, ``replay``, ``run --simulate --virtual``). Outside code may keep state in
    its module, which the warm-up's copy shares; this way it sees the node's warm-up call
    on every path, and decides the same clocks after it."""
    return isinstance(spec, ExternalControllerConfig) and context.time_mode == "virtual"


def decision_deadline_s(spec: ExternalControllerConfig, period_s: float) -> float:
    """How long a node waits for an outside controller's decision: the spec's
    ``decision_timeout_s``, else the control period."""
    return spec.decision_timeout_s if spec.decision_timeout_s is not None else period_s


def _algorithm(spec: ControllerConfig, context: ControllerContext) -> ClockController:
    """The bare algorithm ``spec`` asks for (no wrapper)."""
    match spec:
        case MaxControllerConfig():
            return maximum_clock_controller
        case FixedControllerConfig(clock_mhz=clock_mhz):
            return fixed_clock_controller(clock_mhz)
        case ReactiveControllerConfig():
            return ReactiveGovernor(**_set_fields(spec))
        case OpenLoopControllerConfig(plan=plan):
            from gpugov.controllers.open_loop import (
                OpenLoopClockController,
                PlanFormatError,
                load_plan,
            )

            if context.plan is not None:
                return OpenLoopClockController(context.plan)
            try:
                return OpenLoopClockController(load_plan(plan, min_period_s=MIN_PERIOD_S))
            except PlanFormatError as error:
                raise ControllerError(str(error)) from error
        case MPCControllerConfig():
            return _mpc(spec, context)
        case OnlineMPCControllerConfig():
            return _online(spec, context)
        case (
            PowerCapControllerConfig()
            | DPSControllerConfig()
            | PowerProfileControllerConfig()
            | DefaultDVFSControllerConfig()
            | AGFTControllerConfig()
            | PIDControllerConfig()
            | ThrottLLeMControllerConfig()
            | GreenLLMControllerConfig()
            | VoltanaControllerConfig()
        ):
            return _peer(spec, context)
        case ExternalControllerConfig():
            return _external(spec, context)
    raise ControllerError(f"unknown controller kind {getattr(spec, 'kind', spec)!r}")


def _peer(spec: ControllerConfig, context: ControllerContext) -> ClockController:
    """A peer governor (``controllers/peers``, ``docs/benchmark.md``) with the spec's set
    fields; the rest keep the controller's defaults.

    Raises:
        ControllerError: a ``power-profile`` with neither a ceiling nor a profile to
            calibrate on, or a profile that cannot be loaded.
    """
    match spec:
        case PowerCapControllerConfig():
            from gpugov.controllers.peers.power_cap import StaticPowerCap

            return StaticPowerCap(**_set_fields(spec))
        case DPSControllerConfig():
            from gpugov.controllers.peers.dps import DPSPowerSteering

            return DPSPowerSteering(**_set_fields(spec))
        case PowerProfileControllerConfig():
            return _power_profile(spec, context)
        case DefaultDVFSControllerConfig():
            from gpugov.controllers.peers.default_dvfs import DefaultDVFS

            return DefaultDVFS(**_set_fields(spec))
        case AGFTControllerConfig():
            from gpugov.controllers.peers.agft import AGFTController

            return AGFTController(**_set_fields(spec))
        case PIDControllerConfig():
            from gpugov.controllers.peers.pid import SLAPIDController

            return SLAPIDController(**_set_fields(spec))
        case ThrottLLeMControllerConfig():
            from gpugov.controllers.peers.throttllem import ThrottLLeMController

            return ThrottLLeMController(**_set_fields(spec))
        case GreenLLMControllerConfig():
            from gpugov.controllers.peers.greenllm import GreenLLMController

            return GreenLLMController(**_set_fields(spec))
        case VoltanaControllerConfig():
            from gpugov.controllers.peers.voltana import VoltanaController

            return VoltanaController(**_set_fields(spec))
    raise ControllerError(f"unknown peer controller kind {getattr(spec, 'kind', spec)!r}")


def _external(spec: ExternalControllerConfig, context: ControllerContext) -> ClockController:
    """An outside package's controller: its factory called with what a node knows (the
    context without the simulated plant or an offline plan), at gpugov's edge
    (:class:`daemon.outside.OutsideController`: its own copy of each observation, an
    answer that is not a clock counted and replaced by the top clock).

    Raises:
        ControllerError: the factory cannot be loaded, raises, or returns no callable.
    """
    import dataclasses

    try:
        factory = load_factory(spec.factory)
    except ValueError as error:
        raise ControllerError(str(error)) from None
    try:
        controller = factory(dataclasses.replace(context, plant=None, plan=None))
    except Exception as error:  # an outside factory: report any failure in one line
        raise ControllerError(f"controller factory {spec.factory!r} raised: {error}") from error
    except BaseException as error:  # sys.exit(), GeneratorExit: its failure, not gpugov's exit
        from gpugov.daemon.deadline import ctrl_c, escape_text

        if ctrl_c(error):
            raise
        raise ControllerError(f"controller factory {spec.factory!r} {escape_text(error)}") from None
    if not callable(controller):
        raise ControllerError(
            f"controller factory {spec.factory!r} returned {type(controller).__name__}, "
            "not a callable observation -> MHz"
        )
    from gpugov.daemon.outside import OutsideController

    # In virtual time no deadline bounds a call: a long one is named instead.
    return OutsideController(controller, watch=context.time_mode == "virtual")


def _power_profile(
    spec: PowerProfileControllerConfig, context: ControllerContext
) -> ClockController:
    """The preset of ``spec``: its own ceiling and cap, else calibrated on its profile (in a
    simulation, default the simulated profile, as a vendor calibrates per GPU and model).
    A calibrated cap is the profile's domain power: on a domain of another GPU count it is
    scaled to the domain's GPUs (a 1-GPU profile's cap on a TP8 domain held it at an
    eighth of its power)."""
    from gpugov.controllers.peers.power_profile import (
        PowerProfileController,
        calibrate_power_profile,
    )

    if spec.ceiling_mhz is not None:
        return PowerProfileController(spec.ceiling_mhz, spec.cap_w)
    fraction = (
        {}
        if spec.throughput_fraction is None
        else {"throughput_fraction": spec.throughput_fraction}
    )
    if spec.profile is None:
        if context.plant is None:
            raise ControllerError(
                "power-profile needs ceiling_mhz (and cap_w) or a profile to calibrate on"
            )
        profile = context.plant.profile
    else:
        from gpugov.plant import load_profile
        from gpugov.plant.profile import ProfileError

        try:
            profile = load_profile(spec.profile)
        except ProfileError as error:
            raise ControllerError(f"power-profile: {error}") from error
    preset = calibrate_power_profile(profile, **fraction)
    # The domain's GPUs: a simulated pool's hold every engine's group, as a node's domain.
    gpus = context.gpu_count
    return PowerProfileController(preset.ceiling_mhz, preset.cap_w * gpus / profile.tensor_parallel)


def _set_fields(spec: Any, *, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The tuning fields a spec sets (not None): the rest keep the controller's defaults,
    which live next to the controller."""
    return {
        name: value
        for name, value in spec
        if name != "kind" and name not in skip and value is not None
    }


def planning_plant(spec: MPCControllerConfig, context: ControllerContext) -> ServingPlant:
    """The plant an ``mpc`` plans on: the context's (a simulated run's own plant) unless
    the spec names another profile (``--controller mpc:PROFILE``: a model-mismatch run),
    else the spec's profile (a node).

    Raises:
        ControllerError: the profile cannot be loaded.
    """
    from gpugov.plant import ServingPlant, load_profile
    from gpugov.plant.profile import ProfileError

    named = spec.profile if "profile" in spec.model_fields_set else None
    own = context.plant
    if own is not None and (named is None or named == own.profile.name):
        return own
    try:
        other = ServingPlant.from_profile(load_profile(named or spec.profile))
    except ProfileError as error:
        raise ControllerError(f"mpc controller: {error}") from error
    return own if own is not None and other.profile.name == own.profile.name else other


def profile_fit_warnings(
    spec: ControllerConfig, clocks_mhz: Sequence[float], gpu_count: int
) -> list[str]:
    """Where an ``mpc``'s profile does not describe the domain's GPUs: one line for profile
    clocks the GPUs do not support (the chain locks each such planned clock at the next
    supported clock below it, so the MPC's model of that clock's latency is wrong and a
    planned 1,700 MHz may run at 1,000), one for a TP degree other than the domain's GPU
    count (the profile's rates and powers are another domain's). No clocks (the GPUs not
    read: ``check-config --offline``) give the TP line alone. A ``power-profile``
    calibrated on a profile of another TP degree gets one line saying its cap is scaled.
    Empty for other kinds and for a profile that does not load (the build refuses it)."""
    if isinstance(spec, PowerProfileControllerConfig) and spec.profile is not None:
        from gpugov.plant import load_profile
        from gpugov.plant.profile import ProfileError

        try:
            tp = load_profile(spec.profile).tensor_parallel
        except ProfileError:
            return []
        if tp == gpu_count:
            return []
        return [
            f"power-profile profile {spec.profile!r} describes a domain of {tp} GPU(s) "
            f"(tensor_parallel), this domain has {gpu_count}: its calibrated cap is scaled "
            f"by {gpu_count}/{tp}"
        ]
    if not isinstance(spec, MPCControllerConfig):
        return []
    from gpugov.plant import load_profile
    from gpugov.plant.profile import ProfileError

    try:
        profile = load_profile(spec.profile)
    except ProfileError:
        return []
    lines = []
    supported = {round(float(clock)) for clock in clocks_mhz}
    missing = [float(c) for c in profile.clock_mhz if round(float(c)) not in supported]
    if missing and clocks_mhz:
        lines.append(
            f"{spec.kind} profile {profile.name!r}: {len(missing)} of its "
            f"{profile.clock_mhz.size} clocks ({profile.minimum_clock_mhz:g}-"
            f"{profile.maximum_clock_mhz:g} MHz) are not supported by the domain's GPUs "
            f"({len(supported)} clocks, {min(clocks_mhz):g}-{max(clocks_mhz):g} MHz), first "
            f"{missing[0]:g} MHz; a planned clock they lack is locked at the supported clock "
            "below it (or the lowest), which the plan did not price"
        )
    if profile.tensor_parallel != gpu_count:
        lines.append(
            f"{spec.kind} profile {profile.name!r} describes a domain of "
            f"{profile.tensor_parallel} GPU(s) (tensor_parallel), this domain has {gpu_count}: "
            "its rates and powers are another domain's"
        )
    return lines


def _mpc(spec: MPCControllerConfig, context: ControllerContext) -> ClockController:
    """The MPC of ``spec`` planning on :func:`planning_plant`: ``mpc`` is the fast
    discrete search with its preset (``controllers.mpc.fast.FAST_MPC_PRESET``),
    ``mpc-slsqp`` the seed's SLSQP and fluid model."""
    from gpugov.controllers.adaptation import BurstHedge, SLOFeedback
    from gpugov.controllers.mpc.controller import DEFAULT_SOLVE_BUDGET_EVALUATIONS, MPCController
    from gpugov.controllers.mpc.fast import FAST_MPC_PRESET, DiscreteSearchSolver

    fast = spec.kind == "mpc"
    options: dict[str, Any] = dict(FAST_MPC_PRESET) if fast else {}
    options.update(
        _set_fields(spec, skip=("profile", "burst_hedge", "slo_feedback", "latency_model"))
    )
    options["control_period_s"] = context.period_s
    options["latency_model"] = spec.latency_model or ("iteration" if fast else "seed")
    if fast:
        options["solver"] = DiscreteSearchSolver()
        # The fast MPC prices its plans as the safety chain will apply them.
        options["dwell_s"] = context.safety.dwell_s
        options["efficiency_floor"] = True
    # The online corrections default to on for the fast MPC, off for the seed's.
    if spec.burst_hedge if spec.burst_hedge is not None else fast:
        options["burst_hedge"] = BurstHedge()
    if spec.slo_feedback if spec.slo_feedback is not None else fast:
        options["slo_feedback"] = SLOFeedback()
    if context.time_mode == "virtual":
        options["solve_budget_evaluations"] = DEFAULT_SOLVE_BUDGET_EVALUATIONS
    weights = role_weights(context.role)
    if weights is not None:
        options["weights"] = weights
    if fast and context.slo_target is not None:
        from gpugov.controllers.budget import AttainmentBudget

        margin = float(options.get("slo_margin", 1.0))
        options["slo_budget"] = AttainmentBudget(
            context.slo_target, tightest=min(1.0, margin), loosest=1.0 / margin
        )
    return MPCController(planning_plant(spec, context), **options)


_SAID_IN_THIS_PROCESS: set[str] = set()
"""The hint warnings a study process has logged (:func:`_warn_once_in_this_process`)."""


def _warn_once_in_this_process(message: str) -> None:
    """A simulated run's hint warning, once per process: a benchmark or sweep builds an
    ``mpc-online`` per scenario, pool and seed, and each said the same unknown GPU or
    model name again (a node's controller, built once per domain, logs its own)."""
    if message in _SAID_IN_THIS_PROCESS:
        return
    if len(_SAID_IN_THIS_PROCESS) < 1000:  # bounded: past it, each is said again
        _SAID_IN_THIS_PROCESS.add(message)
    log.warning(message)


def _online(spec: OnlineMPCControllerConfig, context: ControllerContext) -> ClockController:
    """The self-calibrating MPC. It reads no profile while it runs; ``prior_profile``,
    when set, is read once here as a rough prior; ``prior`` hints are turned into one
    (``controllers.online.prior``): ``gpu = "auto"`` takes the context's first GPU name,
    the TP degree defaults to its GPU count. With neither (and ``auto_hints`` not off),
    the controller derives the hints itself from the context's first GPU name, its GPU
    count and the engine's ``model_name`` (:class:`controllers.online.prior.AutoHints`).

    Raises:
        ControllerError: the prior profile cannot be loaded.
    """
    from gpugov.controllers.online.controller import OnlineMPCController, prior_from_profile

    prior = None
    auto_hints = None
    if spec.prior is not None:
        prior = _hinted_prior(spec, context.gpu_name, context.gpu_count)
    elif spec.prior_profile is None and spec.auto_hints is not False:
        from gpugov.controllers.online.prior import AutoHints

        auto_hints = AutoHints(
            gpu=context.gpu_name,
            tensor_parallel=max(1, context.gpu_count),
            warn=log.warning if context.time_mode == "wall" else _warn_once_in_this_process,
        )
    if spec.prior_profile is not None:
        from gpugov.plant import load_profile
        from gpugov.plant.profile import ProfileError

        try:
            prior = prior_from_profile(load_profile(spec.prior_profile))
        except ProfileError as error:
            raise ControllerError(f"mpc-online prior_profile: {error}") from error
    from gpugov.controllers.mpc.controller import DEFAULT_SOLVE_BUDGET_EVALUATIONS

    # Passed on to its MPC: the solve budget in virtual time, the role's weights (the
    # inactive objective weighs 0) and the chain's dwell (plans priced as it applies them).
    mpc_options: dict[str, Any] = {"dwell_s": context.safety.dwell_s}
    if context.time_mode == "virtual":
        mpc_options["solve_budget_evaluations"] = DEFAULT_SOLVE_BUDGET_EVALUATIONS
    weights = role_weights(context.role)
    if weights is not None:
        mpc_options["weights"] = weights
    return OnlineMPCController(
        **_set_fields(spec, skip=("prior", "prior_profile", "state_dir", "auto_hints")),
        **mpc_options,
        control_period_s=context.period_s,
        ttft_slo_s=context.ttft_slo_s,
        tpot_slo_s=context.tpot_slo_s,
        prior=prior,
        auto_hints=auto_hints,
        power_limit_w=context.power_limit_w,
        slo_target=context.slo_target,
    )


def _hinted_prior(
    spec: OnlineMPCControllerConfig, gpu_name: str | None, gpu_count: int | None
) -> Any:
    """The prior of ``spec.prior``'s hints (None when they give none; one warning line
    for a GPU name that is unknown or, with ``auto``, not reported). A ``gpu`` left out
    is the domain's first GPU's name where it reports one, as the TP degree left out is
    the domain's GPU count: a parameter count alone gave no prior, and turned the
    automatic hints off unsaid."""
    from gpugov.controllers.online.prior import AUTO, PriorHints, prior_from_hints

    hints = spec.prior
    assert hints is not None
    gpu = hints.gpu
    if gpu is None:
        gpu = gpu_name
    elif gpu.strip().lower() == AUTO:
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


def warm_up(
    controller: ClockController,
    clocks_mhz: Sequence[float],
    *,
    thermal_limit_c: float | None = None,
) -> float:
    """Make one dummy decision on a copy of the algorithm and return its seconds.

    The copy is of the algorithm inside every wrapper (no safety layer, no persistence:
    a warm-up never does I/O). It sees an idle node at time 0, so whatever a controller
    pays on its first call (the fast MPC's kernel compile or cache load, lazy imports,
    cached candidate pools) is paid before the loop's clock starts, and the controller
    itself keeps no trace of it: its first real decision is the run's first decision. A
    controller whose first decision does not run all its compiled code (``mpc-online``
    stays at the top clock through its warm-up) runs the rest on the copy too
    (``warm_kernels``). An outside controller's copy decides inside its
    :class:`daemon.outside.OutsideController` and, on a node, within its decision
    deadline (:meth:`daemon.deadline.DecisionDeadline.warm`, which raises
    :class:`daemon.deadline.DecisionTimeout` past it). An outside controller that cannot
    be copied (it holds a lock, a socket, a client session) is not warmed up: one line
    says so, and its first decision pays what a first call costs.
    """
    from gpugov.daemon.deadline import DecisionDeadline
    from gpugov.daemon.outside import outside_layer

    # An outside controller warms up at its edge (its sys.exit() is an error) and, on a
    # node, within its decision deadline, on the deadline's worker thread.
    outside = outside_layer(controller)
    try:
        probe = copy.deepcopy(outside or unwrap(controller))
        if isinstance(probe, ControllerWrapper) and isinstance(probe.inner, types.FunctionType):
            probe.inner = function_copy(probe.inner)  # deepcopy gave the function itself
    except Exception as error:
        if outside is None:
            raise
        log.info(
            "controller %s cannot be copied for a warm-up decision (%s); its first decision "
            "is its warm-up",
            getattr(outside.inner, "name", type(outside.inner).__name__),
            error,
        )
        return 0.0
    deadline = chain_layer(controller, DecisionDeadline)
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

    def decide(observation: ServingObservation) -> Any:
        answer = probe(observation)
        warm_kernels = getattr(probe, "warm_kernels", None)
        if callable(warm_kernels):
            # Compiled code past the first decision (``mpc-online``'s, after its warm-up).
            warm_kernels(observation)
        return answer

    started = time.perf_counter()
    if deadline is None:
        decide(observation)
    else:
        deadline.warm(decide, observation)
    return time.perf_counter() - started


def close_controller(controller: ClockController, who: str) -> bool:
    """Close ``controller``'s outermost closable layer (a wrapper closes the layers inside
    it) once a study's run of it ends, as a node closes its controllers at exit: an
    outside controller releases what it holds (a file, a client session, a thread) and a
    learner persists. A failure (an exception, ``sys.exit()``, a ``GeneratorExit``) is one
    warning line naming ``who``, never raised; Ctrl-C stays Ctrl-C's. Returns whether
    the close went through (True where nothing needed one)."""
    closable = next((layer for layer in layers(controller) if isinstance(layer, Closable)), None)
    if closable is None:
        return True
    try:
        closable.close()
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # outside code: any failure of its close is its own
        log.warning("%s: closing the controller failed: %r", who, error)
        return False
    return True


def function_copy(function: types.FunctionType) -> types.FunctionType:
    """``function`` with copies of what its closure holds. ``copy.deepcopy`` gives a
    function as itself, so a warm-up decision on its "copy" was a real call: the state a
    closure keeps (a count, an average) carried it into the run, and ``run`` decided other
    clocks than ``simulate``. Its globals stay shared, as a module's state is.

    Raises:
        Exception: what copying a cell's value raises (a lock, a socket).
    """
    memo: dict[int, Any] = {}
    cells = []
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a name bound later)
            cells.append(types.CellType())
            continue
        cells.append(types.CellType(copy.deepcopy(value, memo)))
    copied = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__,
        copy.deepcopy(function.__defaults__, memo),
        tuple(cells) if function.__closure__ is not None else None,
    )
    copied.__kwdefaults__ = copy.deepcopy(function.__kwdefaults__, memo)
    copied.__dict__.update(function.__dict__)
    copied.__qualname__ = function.__qualname__
    return copied


__all__ = [
    "ControllerContext",
    "Forecasts",
    "build_controller",
    "close_controller",
    "decision_deadline_s",
    "declared_spec",
    "planning_plant",
    "warm_up",
    "warmed_when_built",
]
