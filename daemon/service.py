"""Assembling runs: real domains from a config, or one simulated domain from the plant.

Constructors below take plain values; only :func:`domains_from_config` reads the config
object (the CLI loads it, this turns it into parts).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from gpugov.controllers.budget import SLOTarget
from gpugov.daemon import gpu_open
from gpugov.daemon.actuator import CLOCK_WRITE_DEADLINE_S, ClockActuator, ExternalPolicy, LockMode
from gpugov.daemon.backend import GpuBackend, GpuSample, unwrapped
from gpugov.daemon.config import DomainConfig, GpugovConfig, controller_state_dir
from gpugov.daemon.controller_config import (
    ControllerConfig,
    OnlineMPCControllerConfig,
)
from gpugov.daemon.controller_spec import spec_name
from gpugov.daemon.deadline import WRITE_DEADLINE_S, CallTimeout, DecisionTimeout, SerialCalls
from gpugov.daemon.decide import (
    ControllerContext,
    Forecasts,
    TimeMode,
    build_controller,
    declared_spec,
    profile_fit_warnings,
    warm_up,
    warmed_when_built,
)
from gpugov.daemon.domain import Domain, FailsafeMode
from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.errors import (
    ControllerError,
    GpuCallHung,
    GpugovError,
)
from gpugov.daemon.files import resolve_state_dir
from gpugov.daemon.gpu_hold import GpuHeld, GpuHold, hold_gpu, hold_scope, release
from gpugov.daemon.gpu_open import (
    check_actuator_serves,
    check_configured_clocks,
    check_opened_once,
    check_power_capping,
    gpu_names,
    gpu_uuid,
    no_common_clock,
    open_backend,
    open_domain_gpu,
)
from gpugov.daemon.gpu_sampling import GPU_READ_DEADLINE_S
from gpugov.daemon.lockstate import LockState, hold_model_file
from gpugov.daemon.observer import DomainObserver
from gpugov.daemon.power_budget import PowerBudget, check_configured_cap, domain_budget
from gpugov.daemon.power_limit import (
    POWER_LIMIT_WRITE_DEADLINE_S,
    power_limit_actuator,
)
from gpugov.daemon.roles import COLOCATED, resolve_role
from gpugov.daemon.safety import SafetySettings
from gpugov.daemon.simulated import (
    SimulatedBackend,
    SimulatedNode,
    SimulatedSource,
    tail_quantile,
)
from gpugov.daemon.thermal_limit import held_thermal_limit
from gpugov.plant import PlantSimulation, ServingPlant, ServingResult
from gpugov.plant.types import Request

log = logging.getLogger(__name__)


CONTROLLER_HISTORY_STEPS = 1000
"""Plans and solve times a controller keeps in the daemon (the studies keep all)."""


@dataclass
class Assembled:
    """Domains ready to run and what must be closed afterwards."""

    domains: list[Domain]
    backends: list[GpuBackend] = field(default_factory=list)
    sources: list[ScrapedSource] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)
    state: LockState | None = None
    """The lock record, holding the state directory for this run."""
    hung_opens: list[str] = field(default_factory=list)
    """GPUs whose opening at the start hung past its deadline (no backend is closed)."""
    held_models: list[IO[str]] = field(default_factory=list)
    """The hold files of the domains' learned models (:func:`hold_models`), closed with
    the rest."""
    gpu_holds: list[GpuHold] = field(default_factory=list)
    """The holds on the GPUs this run locks (:func:`daemon.gpu_hold.hold_gpu`), let go
    last."""

    def close(self) -> None:
        """Close every backend (NVML references) and engine connection, then let the
        state directory go. While a GPU call still hangs (a clock or power limit write or
        a sample past its deadline: a driver in trouble) no backend is closed: shutting
        NVML down under a call that hangs could hang the exit with it, and the process's
        exit releases what it holds."""
        hanging = sorted(
            {
                label
                for domain in self.domains
                for label in (
                    *domain.actuator.hanging_writes,
                    *domain.observer.gpus.hanging_reads,
                    *(() if domain.power_limits is None else domain.power_limits.hanging_writes),
                )
            }
            | set(self.hung_opens)
        )
        if hanging:
            log.info(
                "GPU(s) %s: a call still hangs in the driver; the GPUs are left open (the "
                "process's exit releases them)",
                ",".join(hanging),
            )
        else:
            self._close_backends()
        for source in self.sources:
            source.close()
        self._close_files()
        release(self.gpu_holds)

    def _close_files(self, deadline_s: float = WRITE_DEADLINE_S) -> None:
        """Let the state directory go and close the learned models' hold files on a
        worker thread, waited for at most ``deadline_s`` (a write's): on a hung mount (an
        NFS lock's release is a call to the server) the close held the exit, after the
        resets, until the unit's stop timeout killed it. One warning; the process's
        exit releases them."""
        state, held = self.state, list(self.held_models)
        self.held_models.clear()
        if state is None and not held:
            return
        calls = SerialCalls(deadline_s, name="close-files", cause="a hung disk or mount")

        def close_all() -> None:
            if state is not None:
                state.release()
            for handle in held:
                handle.close()

        try:
            calls.call(close_all)
        except CallTimeout:
            where = state.path.parent if state is not None else "the models' directory"
            log.warning(
                "%s: its hold files have not closed within %g s (a hung disk or mount); "
                "exiting without it (the process's exit releases them)",
                where,
                deadline_s,
            )

    def _close_backends(self, deadline_s: float | None = None) -> None:
        """Close the backends on a worker thread, waited for at most ``deadline_s``
        (:data:`BACKEND_CLOSE_DEADLINE_S`): a driver that wedges as the daemon stops
        (the resets went through, then ``nvmlShutdown`` never returns) held the exit
        until the unit's stop timeout killed it. One warning; the process's exit
        releases NVML."""
        if not self.backends:
            return
        wait_s = BACKEND_CLOSE_DEADLINE_S if deadline_s is None else deadline_s
        calls = SerialCalls(wait_s, name="close", cause="a hung GPU call: a driver in trouble")

        def close_all() -> None:
            for backend in self.backends:
                backend.close()

        try:
            calls.call(close_all)
        except CallTimeout:
            log.warning(
                "GPU(s) %s: closing them (NVML's shutdown) has not returned within %g s (a "
                "hung GPU call: a driver in trouble); exiting without it (the process's "
                "exit releases NVML)",
                ",".join(backend.label for backend in self.backends),
                wait_s,
            )


BACKEND_CLOSE_DEADLINE_S = GPU_READ_DEADLINE_S
"""How long the exit waits for the GPUs' close (NVML's shutdown: milliseconds when the
driver answers) before it goes on without it (:meth:`Assembled._close_backends`)."""

MODEL_HOLD_WAIT_S = 2.0
"""Longest a start waits to hold a domain's learned model (:func:`hold_models`): a hung
disk under it never holds the start; generous, as a loaded machine is no hung disk."""


def hold_models(config: GpugovConfig, held: list[IO[str]]) -> None:
    """Hold each ``mpc-online`` domain's learned model where it is kept
    (:func:`~gpugov.daemon.lockstate.hold_model_file`), appending the hold files to
    ``held``: two daemons keeping a domain of one name in one directory (their own
    ``daemon.state_dir`` each, one controller ``state_dir``) set each other's models aside
    and overwrote them at every save.

    Raises:
        StateDirectoryHeld: another run holds one (the line names its config field).
    """
    for index, spec in enumerate(config.domains):
        directory = controller_state_dir(spec.controller, config.daemon.state_dir)
        if directory is None:
            continue
        own = getattr(spec.controller, "state_dir", None) is not None
        field_name = f"domains[{index}].controller.state_dir" if own else "daemon.state_dir"
        handle = _hold_within(directory, spec.name, field_name, MODEL_HOLD_WAIT_S)
        if handle is not None:
            held.append(handle)


def _hold_within(directory: Path, domain: str, field_name: str, wait_s: float) -> IO[str] | None:
    """:func:`~gpugov.daemon.lockstate.hold_model_file`, waited for at most ``wait_s``: a
    hung disk or mount under the model's directory never holds the start (the model's
    own reads and saves are bounded too); it is then not held, with one warning.

    Raises:
        StateDirectoryHeld: another run holds it.
    """
    calls = SerialCalls(wait_s, name=f"hold-model-{domain}", cause="a hung disk or mount")
    try:
        return calls.call(lambda: hold_model_file(directory, domain, field_name))
    except CallTimeout:
        log.warning(
            "%s %s: domain %r's learned model could not be held within %g s (a hung disk "
            "or mount?); a second daemon keeping a domain of that name there is not refused",
            field_name,
            directory,
            domain,
            wait_s,
        )
        return None


def build_domain(
    name: str,
    backends: Sequence[GpuBackend],
    source: Any,
    controller_spec: ControllerConfig,
    *,
    period_s: float,
    stale_after_s: float,
    failsafe: FailsafeMode = "max",
    lock_mode: LockMode = "pin",
    external_policy: ExternalPolicy = "reassert",
    state: LockState | None = None,
    safety: SafetySettings | None = None,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    thermal_limit_c: float | None = None,
    ttft_slo_per_prompt_token_s: float | None = None,
    slo_target: SLOTarget | None = None,
    mean_prompt_tokens: float = 512.0,
    mean_output_tokens: float = 256.0,
    forecasts: Forecasts | None = None,
    time_mode: TimeMode = "wall",
    state_dir: Path | None = None,
    state_read_only: bool = False,
    plant: ServingPlant | None = None,
    budget: PowerBudget | None = None,
    role: str | None = None,
    gpu_read_deadline_s: float | None = None,
    clock_write_deadline_s: float | None = None,
    power_limit_write_deadline_s: float | None = None,
) -> Domain:
    """Observer + controller (in its safety chain, :func:`daemon.decide.build_controller`)
    + actuator for one domain.

    The controller holds the domain's power budget (:class:`daemon.power_budget.PowerBudget`:
    ``budget``, else the GPUs' enforced NVML limits alone) through the chain's
    :class:`~gpugov.controllers.power_need.BudgetGuard` (``docs/power-budget.md``): by the
    clock when a budget is configured (``power_budget_w`` or ``power_budget_file``); with
    the NVML limits alone, which the GPUs' firmware enforces, the guard only reports.
    ``gpu_read_deadline_s`` bounds each GPU's sample on a node (a hung NVML call costs it
    once, :class:`~daemon.gpu_sampling.DomainGpus`; None: read on the loop's thread);
    ``clock_write_deadline_s`` each GPU's clock write (a hung one costs it once and stops
    that GPU's writes until it returns, :class:`~daemon.actuator.ClockActuator`; None:
    written on the loop's thread); ``power_limit_write_deadline_s`` each GPU's power
    limit call, the same way (:class:`~daemon.power_limit.PowerLimitActuator`).
    ``role`` is the configured pool role (``docs/disaggregated.md``); when it is None
    the engine's page is read once here for the role its labels state
    (:func:`probe_role`), else the domain is colocated. ``state_read_only`` (a dry run):
    a learner restores its model from ``state_dir`` and writes nothing there.

    The controller is built and warmed (:func:`daemon.decide.warm_up`: one dummy
    decision on a copy of the algorithm) here, before any loop or paced plant clock
    starts, so a first-use cost such as the fast MPC's compile never counts as a decision
    or as plant time.

    Raises:
        NotSupported: a GPU lists no supported clocks.
        ControllerError: the controller cannot be built.
        ConfigError: the safety floor is above the GPUs' top clock, or the controller
            sets a power cap that the GPUs' backend cannot set, or its configured
            ``cap_w`` is below the lowest power limit the GPUs accept.
    """
    safety = safety or SafetySettings()
    labelled = probe_role(source, name) if role is None else None
    resolved = resolve_role(role, labelled, name)
    if resolved != COLOCATED:
        log.info("domain %s: role %s (%s)", name, resolved, "config" if role else "engine labels")
    observer = DomainObserver(
        backends,
        source,
        stale_after_s=stale_after_s,
        ttft_slo_s=ttft_slo_s,
        tpot_slo_s=tpot_slo_s,
        thermal_limit_c=thermal_limit_c,
        ttft_slo_per_prompt_token_s=ttft_slo_per_prompt_token_s,
        mean_prompt_tokens=mean_prompt_tokens,
        mean_output_tokens=mean_output_tokens,
        scrape_timeout_s=getattr(source, "timeout_s", None),
        role=resolved,
        role_from_config=role is not None,
        domain=name,
        tail_quantile=tail_quantile(slo_target),
        gpu_read_deadline_s=gpu_read_deadline_s,
        period_s=period_s,
    )
    clocks = observer.gpus.supported_clocks_mhz()
    if not clocks:
        raise no_common_clock(name, backends)
    check_configured_clocks(name, safety.floor_mhz, controller_spec, clocks)
    check_configured_cap(
        name,
        getattr(controller_spec, "cap_w", None),
        backends,
        read_deadline_s=gpu_read_deadline_s,
    )
    context = ControllerContext(
        period_s=period_s,
        supported_clocks_mhz=tuple(clocks),
        gpu_names=tuple(gpu_names(backends)),
        gpu_uuids=tuple(gpu_uuid(backend) for backend in backends),
        gpu_count=len(backends),
        power_limit_w=(
            _start_power_limit_w(backends, observer.gpus.read)
            if isinstance(controller_spec, OnlineMPCControllerConfig)
            else None
        ),
        ttft_slo_s=ttft_slo_s,
        tpot_slo_s=tpot_slo_s,
        thermal_limit_c=thermal_limit_c,
        forecasts=forecasts or Forecasts(),
        time_mode=time_mode,
        state_dir=state_dir,
        state_read_only=state_read_only,
        domain=name,
        safety=safety,
        plant=plant,
        history_limit=CONTROLLER_HISTORY_STEPS if time_mode == "wall" else None,
        slo_target=slo_target,
        budget_guard=True,
        budget_enforced=budget is not None and budget.configured,
        role=resolved,
    )
    try:
        controller = build_controller(controller_spec, context)
    except ControllerError as error:
        raise ControllerError(f"domain {name!r}: controller: {error}") from error
    if plant is None:  # a node's GPUs (a simulated domain's plant is the profile's own)
        for line in profile_fit_warnings(controller_spec, clocks, len(backends)):
            log.warning("domain %r: controller: %s", name, line)
    try:
        if not warmed_when_built(controller_spec, context):  # else build_controller did
            warm_s = warm_up(controller, clocks, thermal_limit_c=thermal_limit_c)
            log.debug("domain %s: controller warmed up in %.3f s", name, warm_s)
    except DecisionTimeout as error:  # an outside controller; the loop's ticks hold the fail-safe
        log.warning(
            "domain %s: the controller's warm-up decision did not return (%s); the first "
            "ticks hold the fail-safe until it does",
            name,
            error,
        )
    except Exception as error:  # the loop meets (and reports) a failing controller itself
        log.warning("domain %s: the controller's warm-up decision raised %r", name, error)
    actuator = ClockActuator(
        backends,
        domain=name,
        lock_mode=lock_mode,
        external_policy=external_policy,
        state=state,
        write_deadline_s=clock_write_deadline_s,
    )
    power_limits = power_limit_actuator(
        backends, domain=name, state=state, write_deadline_s=power_limit_write_deadline_s
    )
    check_power_capping(name, controller_spec, controller, can_set=power_limits is not None)
    return Domain(
        name,
        observer,
        controller,
        actuator,
        failsafe=failsafe,
        label=spec_name(controller_spec),
        budget=budget or PowerBudget(name),
        power_limits=power_limits,
        context=context,
    )


def probe_role(source: Any, domain: str) -> str | None:
    """The pool role the engine's page states now (one scrape of a real engine's page),
    or None: no role label, a simulated source, or an engine not reachable yet (logged;
    the observer reports a role its labels state later)."""
    if not isinstance(source, ScrapedSource):
        return None
    try:
        return source.scrape().role
    except Exception as error:  # never fatal: the loop reports a failing engine itself
        log.info("domain %s: no role read from the engine at start (%s)", domain, error)
        return None


def _start_power_limit_w(
    backends: Sequence[GpuBackend], read: Callable[[GpuBackend], GpuSample]
) -> float | None:
    """The domain's summed enforced power limit now (NVML), or None when a GPU does not
    report one. Simulated GPUs are not sampled here (a sample advances their plant); their
    observations carry the limit every tick. ``read`` is the domain's read of a GPU, under
    its deadline: a read that hangs at the start leaves the limit unknown."""
    total = 0.0
    for backend in backends:
        if isinstance(unwrapped(backend), SimulatedBackend):
            return None
        try:
            limit = read(backend).power_limit_w
        except GpugovError as error:
            log.warning("GPU %s: no power limit read at start (%s)", backend.label, error)
            return None
        if limit is None or not limit > 0.0:
            return None
        total += float(limit)
    return total or None


def _domain_header(domain: Domain, config_fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": domain.name,
        "controller": domain.label,
        "gpus": [b.label for b in domain.observer.gpus.backends],
        # NVML names, so that `gpugov replay` can fill an mpc-online `gpu = "auto"` hint.
        "gpu_names": gpu_names(domain.observer.gpus.backends),
        "supported_clocks_mhz": list(domain.observer.gpus.supported_clocks_mhz()),
        "role": domain.observer.role,
        # The rest of what the controller was told, so that replay tells it the same.
        **({} if domain.context is None else {"context": domain.context.recorded()}),
        **config_fields,
    }


def _build_configured(
    config: GpugovConfig,
    spec: DomainConfig,
    backends: Sequence[GpuBackend],
    source: ScrapedSource,
    state: LockState | None,
    *,
    dry_run: bool,
) -> Domain:
    thermal_limit_c, lowered = held_thermal_limit(
        spec.name, spec.thermal_limit_c, backends, read_deadline_s=GPU_READ_DEADLINE_S
    )
    if lowered is not None:
        log.warning("%s", lowered)
    return build_domain(
        spec.name,
        backends,
        source,
        spec.controller,
        period_s=config.daemon.period_s,
        stale_after_s=config.stale_after_s(spec),
        failsafe=spec.failsafe,
        lock_mode=spec.lock_mode,
        external_policy=spec.external_clock_policy,
        state=state,
        safety=SafetySettings(
            floor_mhz=spec.safety.floor_mhz,
            dwell_s=spec.safety.dwell_s,
            min_relock_interval_s=spec.safety.min_relock_interval_s,
        ),
        ttft_slo_s=spec.ttft_slo_s,
        tpot_slo_s=spec.tpot_slo_s,
        thermal_limit_c=thermal_limit_c,
        ttft_slo_per_prompt_token_s=spec.ttft_slo_per_prompt_token_s,
        slo_target=None if spec.slo_target is None else spec.slo_target.target(),
        mean_prompt_tokens=spec.mean_prompt_tokens,
        mean_output_tokens=spec.mean_output_tokens,
        forecasts=_declared_forecasts(spec),
        state_dir=controller_state_dir(spec.controller, config.daemon.state_dir),
        state_read_only=dry_run,  # a dry run writes nothing, its learned model included
        budget=domain_budget(
            spec.name,
            backends,
            config_w=spec.power_budget_w,
            file=spec.power_budget_file,
            file_scope=spec.power_budget_file_scope,
            read_deadline_s=GPU_READ_DEADLINE_S,
        ),
        role=spec.role,
        gpu_read_deadline_s=GPU_READ_DEADLINE_S,  # a node's GPUs: a hung call never stalls it
        clock_write_deadline_s=CLOCK_WRITE_DEADLINE_S,  # nor a hung clock write
        power_limit_write_deadline_s=POWER_LIMIT_WRITE_DEADLINE_S,  # nor a power limit's
    )


def _declared_forecasts(spec: DomainConfig) -> Forecasts:
    """A domain's declared forecasts: its estimation defaults, only when the operator sets
    them (else each controller keeps its own default)."""
    return Forecasts(
        mean_prompt_tokens=(
            spec.mean_prompt_tokens if "mean_prompt_tokens" in spec.model_fields_set else None
        ),
        mean_output_tokens=(
            spec.mean_output_tokens if "mean_output_tokens" in spec.model_fields_set else None
        ),
    )


OPENING_GPUS = "a GPU call made as the GPUs were opened has not returned: a wedged driver?"
"""What a start stopped while it opens the GPUs was doing (:func:`domains_from_config`)."""


def _hold(
    assembled: Assembled,
    backend: GpuBackend,
    domain: str,
    named: str,
    config: GpugovConfig,
    scope: str,
) -> None:
    """Hold ``backend``'s GPU for this run (:func:`daemon.gpu_hold.hold_gpu`).

    Raises:
        GpuHeld: another gpugov on the node holds it (the line names the domain).
    """
    uuid = str(getattr(backend, "uuid", None) or "")
    try:
        held = hold_gpu(
            uuid, config.daemon.backend, named=named, emulator=config.daemon.emulator, scope=scope
        )
    except GpuHeld as error:
        error.args = (f"domain {domain!r}: gpus: {error}",)
        raise
    if held is not None:
        assembled.gpu_holds.append(held)


def domains_from_config(
    config: GpugovConfig,
    *,
    dry_run: bool = False,
    nvml: ModuleType | None = None,
    stop: threading.Event | None = None,
    phase: list[str] | None = None,
) -> Assembled:
    """Open every domain's GPUs and engine source and build its controller.

    Locks are persisted in the state directory (``daemon.state_dir``, else
    ``$STATE_DIRECTORY``) unless this is a dry run. ``stop`` (set by a stop signal) ends
    the retries of a GPU's transient errors at once (:func:`retry_transient`). ``phase``
    is kept saying what the start is doing (:data:`OPENING_GPUS`, or a domain's controller
    being built and warmed up), for the line of a stop that does not wait for its end.

    Raises:
        GpuUnavailable, NotSupported, ControllerError: nothing is left open.
        ConfigError: a limit the config sets does not fit the GPUs (``floor_mhz``), or the
            lock record is a newer gpugov's (:class:`NewerLockRecord`).
    """
    dry_run = dry_run or config.daemon.dry_run
    scope = hold_scope()  # read where the start begins: one that ends later holds in it
    assembled = Assembled(domains=[])
    state_dir = resolve_state_dir(config.daemon.state_dir)
    state = None if dry_run or state_dir is None else LockState(state_dir)
    if state is not None:
        state.hold()  # one daemon per state directory: before any GPU is opened
    assembled.state = state
    opened: dict[str, tuple[str, str]] = {}  # UUID -> (domain, the GPU as the config names it)
    phase = [] if phase is None else phase
    try:
        if not dry_run:  # a dry run saves no model (state_read_only)
            hold_models(config, assembled.held_models)
        for spec in config.domains:
            phase[:] = [OPENING_GPUS]
            backends: list[GpuBackend] = []
            for gpu in spec.gpus:
                backend = open_domain_gpu(
                    spec.name,
                    gpu,
                    config.daemon.backend,
                    dry_run=dry_run,
                    nvml=nvml,
                    emulator=config.daemon.emulator,
                    daemon=config.daemon,
                    stop=stop,
                    deadline_s=gpu_open.GPU_OPEN_DEADLINE_S,  # a hung call never holds the start
                )
                backends.append(backend)
                assembled.backends.append(backend)  # closed with the rest if a later one fails
                check_opened_once(opened, backend, spec.name, str(gpu))
                if not dry_run:  # one governor per GPU on the node: before any write
                    _hold(assembled, backend, spec.name, str(gpu), config, scope)
            if not dry_run:  # a dry run writes nothing, so no refusal can stop it
                check_actuator_serves(spec.name, backends)
            source = ScrapedSource(
                spec.engine.url,
                spec.engine.kind,
                timeout_s=spec.engine.timeout_s,
                max_page_bytes=spec.engine.max_page_bytes,
            )
            assembled.sources.append(source)
            # mpc-online's warm-up compiles its search: seconds, no GPU call.
            phase[:] = [f"domain {spec.name}'s controller was being built and warmed up"]
            domain = _build_configured(config, spec, backends, source, state, dry_run=dry_run)
            assembled.domains.append(domain)
    except BaseException as error:
        if isinstance(error, GpuCallHung) and error.gpu is not None:
            assembled.hung_opens.append(error.gpu)
        assembled.close()
        raise
    assembled.header = {
        "mode": "node",
        "period_s": config.daemon.period_s,
        "dry_run": dry_run,
        "domains": [
            _domain_header(
                domain,
                {
                    "engine_url": spec.engine.url,
                    "safety": spec.safety.model_dump(),
                    "power_budget_held": spec.power_budget_w is not None
                    or spec.power_budget_file is not None,
                    "slo_target": (
                        None if spec.slo_target is None else spec.slo_target.target().as_dict()
                    ),
                    "controller_config": declared_spec(
                        spec.controller, _declared_forecasts(spec)
                    ).model_dump(mode="json"),
                },
            )
            for domain, spec in zip(assembled.domains, config.domains, strict=True)
        ],
    }
    return assembled


# --------------------------------------------------------------------- simulated
@dataclass
class SimulatedRun:
    """One simulated domain and the plant behind it."""

    node: SimulatedNode
    domain: Domain
    horizon_s: float
    header: dict[str, Any]
    result: ServingResult | None = None

    def before_tick(self, now_s: float, step: int) -> bool:
        """Advance the plant to ``now_s``; True (stop) when the run is over.

        Mirrors :func:`plant.simulate`: stop once every request finished, or past the
        horizon; the result is frozen here, before the actuator's reset on exit.
        """
        over = now_s > self.horizon_s + 1e-12
        self.node.advance(self.horizon_s if over else now_s)
        if over or (self.node.done and step > 0):
            self.finish()
            return True
        return False

    def finish(self) -> ServingResult:
        """Freeze the plant's result (idempotent)."""
        if self.result is None:
            self.result = self.node.simulation.result(
                controller_name=self.domain.label, scheduler_name=""
            )
        return self.result


SIMULATED_DOMAIN = "sim"
"""The domain of a simulated run: its learned model is ``online-model-sim.json``, never a
node domain's."""


def simulated_run(
    workload: Sequence[Request],
    plant: ServingPlant,
    controller_spec: ControllerConfig,
    clock: Callable[[], float],
    *,
    period_s: float = 1.0,
    safety: SafetySettings | None = None,
    seed: int = 0,
    horizon_s: float | None = None,
    header: dict[str, Any] | None = None,
    virtual_time: bool = False,
    engine_view: str = "vllm",
    slo_target: Any = None,
) -> SimulatedRun:
    """A simulated node with one domain on the plant's ``tensor_parallel`` simulated GPUs.

    The controller is built as a node builds it (:func:`build_domain`), with the declared
    forecasts the config gives or, by default, the workload's (fixed before the run, as
    ``gpugov simulate`` does); an ``mpc`` plans on the run's own plant. ``virtual_time``
    (the clock is virtual, not paced) bounds solves by a deterministic budget, not the
    wall clock. ``engine_view`` is what the simulated engine publishes
    (:class:`~daemon.simulated.SimulatedSource`): ``vllm``, a vLLM page, from which the
    observer derives what a node's does, under the SLOs the plant's profile states (as a
    node's config states them); ``exact``, the plant's exact state. ``slo_target`` is the
    domain's ``[domains.slo_target]`` (:class:`~gpugov.controllers.budget.SLOTarget`).
    """
    if not workload:
        raise ValueError("the simulated workload has no requests")
    safety = safety or SafetySettings()
    simulation = PlantSimulation(workload, plant, seed=seed)
    horizon = plant.run_horizon_s(workload) if horizon_s is None else float(horizon_s)
    node = SimulatedNode(simulation, clock, horizon_s=horizon)
    gpus = plant.tensor_parallel
    backends = [SimulatedBackend(node, label=str(i), share=1.0 / gpus) for i in range(gpus)]
    profile = plant.profile
    domain = build_domain(
        SIMULATED_DOMAIN,
        backends,
        SimulatedSource(node, view=engine_view),
        controller_spec,
        period_s=period_s,
        stale_after_s=3.0 * period_s,
        safety=safety,
        ttft_slo_s=profile.ttft_slo_s,
        tpot_slo_s=profile.tpot_slo_s,
        ttft_slo_per_prompt_token_s=profile.ttft_slo_per_prompt_token_s,
        thermal_limit_c=plant.thermal_limit_c,
        slo_target=slo_target,
        forecasts=Forecasts.from_workload(workload),
        time_mode="virtual" if virtual_time else "wall",
        state_dir=controller_state_dir(controller_spec, None),
        plant=plant,
    )
    full_header = {
        "mode": "simulated",
        "engine_view": engine_view,
        "period_s": period_s,
        "domains": [
            _domain_header(
                domain,
                {
                    "safety": safety.as_dict(),
                    "slo_target": None if slo_target is None else slo_target.as_dict(),
                    "controller_config": declared_spec(
                        controller_spec, Forecasts.from_workload(workload)
                    ).model_dump(mode="json"),
                },
            )
        ],
        **(header or {}),
    }
    return SimulatedRun(node=node, domain=domain, horizon_s=horizon, header=full_header)


__all__ = [
    "Assembled",
    "SimulatedRun",
    "build_domain",
    "domains_from_config",
    "open_backend",
    "open_domain_gpu",
    "simulated_run",
]
