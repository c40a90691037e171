"""``gpugov run --simulate``: the daemon's real loop, exporter and recorder on the simulated
plant (a simulated node), then its summary and its saving against the maximum clock."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from gpugov.daemon.cli_outputs import check_output_file, simulated_run_inputs
from gpugov.daemon.cli_support import (
    UsageError,
    check_metrics_address,
    check_slo_target_period,
    check_workload_fits,
    checked_controller_flag,
    format_summary,
    light_load_note,
    load_profile_for_cli,
    load_trace_for_cli,
    metrics_exporter,
    require_nonnegative,
    require_positive,
    safety_from_args,
    setup_logging,
    slo_target_of,
    window_past_end_note,
    wrote,
)
from gpugov.daemon.config import default_control_period
from gpugov.daemon.controller_config import ControllerConfig
from gpugov.daemon.errors import ExitCode
from gpugov.daemon.loop import RunStats, ScaledClock, TimedLoop, VirtualClock, run
from gpugov.daemon.loop import stop_on_signals as _stop_on_signals
from gpugov.daemon.record import Recorder
from gpugov.daemon.service import SIMULATED_DOMAIN, simulated_run
from gpugov.daemon.stop_signals import StopEvent, set_from_handler

DEFAULT_SPEED = 10.0
"""Simulated seconds per wall second of a paced ``run --simulate``."""
DEFAULT_CONTROLLER = "mpc-online"
"""``run --simulate``'s controller: the one a node with no profile runs."""


def _recorded_profile(spec: str | None, name: str) -> str:
    """The header's ``profile``: for a ``--profile`` that names a file of the user's, the
    manifest's absolute path (its stem, written before, was looked up by ``replay`` as a
    bundled name and refused for ``mpc``); else the bundled profile's ``name``."""
    from gpugov.plant.profile_files import names_profile_file, resolve_profile_path

    if spec is None or not names_profile_file(spec):
        return name
    return str(resolve_profile_path(spec).resolve())


def _learned_model_files(controller: str) -> list[tuple[str, Path]]:
    """The files ``mpc-online`` keeps for the simulated domain in the state directory (its
    learned model and the model's hold file), as ``--record``'s inputs: a record on the
    model set it aside as corrupt, and the model saved at the end replaced the record."""
    from gpugov.daemon.config import controller_state_dir
    from gpugov.daemon.controller_spec import parse_controller_spec
    from gpugov.daemon.lockstate import model_hold_path

    try:
        spec = parse_controller_spec(controller)
    except ValueError:  # refused in its own line when the controller is built
        return []
    directory = controller_state_dir(spec, None)
    if directory is None:
        return []
    from gpugov.daemon.stored_model import model_path

    return [
        ("the learned model", model_path(directory, SIMULATED_DOMAIN)),
        ("the learned model's hold file", model_hold_path(directory, SIMULATED_DOMAIN)),
    ]


def _check_state_dir(spec: ControllerConfig) -> None:
    """Refuse, before the run, a state directory where the learner's model cannot be kept
    (the run learned, then lost the model at its end, saying so only then).

    Raises:
        UsageError: it is a file, or no directory can be made or written there.
    """
    from gpugov.daemon.config import controller_state_dir
    from gpugov.daemon.files import STATE_DIR_ENV
    from gpugov.daemon.node_check import state_dir_problem

    directory = controller_state_dir(spec, None)
    problem = None if directory is None else state_dir_problem(directory)
    if problem is not None:
        configured = getattr(spec, "state_dir", None) is not None
        source = "--controller state_dir" if configured else f"${STATE_DIR_ENV}"
        raise UsageError(
            f"{source}={directory}: {problem}; {spec.kind} keeps its learned model there"
        )


def run_simulated(args: argparse.Namespace) -> int:
    """``gpugov run --simulate``: the real loop on the simulated plant, then its summary
    and its saving against the maximum clock on the same trace."""
    from gpugov.daemon.sim_progress import SimulationProgress
    from gpugov.plant import ServingPlant
    from gpugov.plant.workload import DEFAULT_TRACE

    setup_logging(args.log_level or "warning")
    for flag in ("speed", "duration", "control_period", "load_scale"):
        require_positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    require_nonnegative("--dwell", args.dwell)
    require_positive("--floor", args.floor)
    check_metrics_address(args.metrics_address)  # not found only once the run is built
    # The profile, the controller and the floor before the trace: a bad --profile,
    # --controller or --floor is one line naming the flag, not found only after a long
    # read of a large trace.
    profile = load_profile_for_cli("--profile", args.profile)
    inputs = simulated_run_inputs(args.trace, args.profile, args.controller)
    if args.record:
        inputs += _learned_model_files(args.controller)
    check_output_file("--record", args.record, [*inputs, ("the config file", args.config)])
    spec = checked_controller_flag(args.controller, profile, default_profile=args.profile)
    if args.control_period is None:
        args.control_period = default_control_period(spec.kind)
    check_slo_target_period(args.slo_target, args.control_period)
    _check_state_dir(spec)
    safety = safety_from_args(args, profile.clock_mhz)
    trace = args.trace or DEFAULT_TRACE
    workload, report = load_trace_for_cli(
        trace,
        duration_s=args.duration,
        load_scale=args.load_scale,
        spread_batches=not args.keep_batched_stamps,
        progress=not args.quiet,
    )
    if not workload:
        raise UsageError(f"--trace {trace}: the selected window holds no requests")
    plant = ServingPlant.from_profile(profile, latency_noise_cv=args.latency_noise)
    check_workload_fits(workload, plant, trace)
    stop = StopEvent()
    if args.virtual:
        virtual = VirtualClock()
        clock: Callable[[], float] = virtual
        sleep: Callable[[float], Any] = virtual.sleep
    else:
        scaled = ScaledClock(args.speed or DEFAULT_SPEED, stop=stop)
        clock, sleep = scaled, scaled.sleep
    simulation = simulated_run(
        workload,
        plant,
        spec,
        clock,
        period_s=args.control_period,
        safety=safety,
        seed=args.seed,
        virtual_time=args.virtual,
        engine_view=args.engine_view,
        slo_target=slo_target_of(args.slo_target),
        header={
            "trace": str(report.path),
            "profile": _recorded_profile(args.profile, profile.name),
            "requests": len(workload),
            "speed": "virtual" if args.virtual else args.speed or DEFAULT_SPEED,
        },
    )
    exporter = metrics_exporter(args.metrics_address)
    recorder = Recorder(args.record, simulation.header) if args.record else None
    pace = "virtual time" if args.virtual else f"{args.speed or DEFAULT_SPEED:g}x real time"
    target = "none" if args.slo_target is None else f"{100.0 * args.slo_target:g}%"
    print(
        f"gpugov run --simulate: {len(workload)} requests from {Path(report.path).name}, "
        f"profile {profile.name}, controller {simulation.domain.label} every "
        f"{args.control_period:g} s, SLO target {target}, {safety.words()}, "
        f"{args.engine_view} engine view, {pace}"
        + (f"; metrics on {exporter.url}" if exporter else ""),
        flush=True,
    )
    progress = SimulationProgress(
        workload[-1].arrival_time_s, "run --simulate", enabled=not args.quiet
    )

    def before_tick(now_s: float, step: int) -> bool:
        over = simulation.before_tick(now_s, step)
        progress(now_s, simulation.node.simulation)
        return over

    interrupted = StopEvent()

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        set_from_handler(interrupted, stop)

    if isinstance(clock, ScaledClock):
        clock.start()  # the paced plant starts now: its controller is built and warmed
    try:
        with _stop_on_signals(stop), _on_sigint(on_ctrl_c):
            stats = run(
                [simulation.domain],
                TimedLoop(args.control_period, clock=clock, sleep=sleep, stop=stop),
                exporter=exporter,
                on_tick=recorder,
                before_tick=before_tick,
            )
    finally:
        simulation.finish()
        progress.close(simulation.node.simulation, stopped=stop.is_set())
        if recorder is not None:
            recorder.close()
        if exporter is not None:
            exporter.close()
    if interrupted.is_set():
        print(
            f"gpugov: interrupted at {progress.reached_s:,.1f} of {progress.total_s:,.1f} "
            "simulated s" + (f" (the recording {args.record} ends there)" if args.record else ""),
            file=sys.stderr,
            flush=True,
        )
        return ExitCode.INTERRUPTED
    _print_summary(simulation, stats, args, profile, report, len(workload))
    if not stop.is_set() and simulation.domain.label != "max":
        print(_against_maximum(simulation.result, workload, plant, args.seed))
    return ExitCode.OK


@contextlib.contextmanager
def _on_sigint(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Ctrl-C calls ``handler`` (a simulated run ends at once, exit 130); the main thread
    only, elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _against_maximum(result: Any, workload: Any, plant: Any, seed: int) -> str:
    """One line: the run's energy and SLO attainment against the maximum clock on the same
    trace and plant (a virtual-time plant run of a second or so)."""
    from gpugov.daemon.controller_config import MaxControllerConfig
    from gpugov.daemon.decide import ControllerContext, build_controller
    from gpugov.plant import simulate

    maximum = build_controller(
        MaxControllerConfig(kind="max"), ControllerContext.for_plant(plant, workload, period_s=1.0)
    )
    reference = simulate(workload, plant, controller=maximum, seed=seed).metrics
    mine = result.metrics
    saved = 1.0 - mine.energy_j / reference.energy_j if reference.energy_j > 0 else 0.0

    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{100.0 * value:.1f}%"

    # A governor that spent more than the maximum clock says so, not "-0.7% less".
    change = f"{100.0 * saved:.1f}% less" if saved >= 0.0 else f"{-100.0 * saved:.1f}% more"
    return (
        f"  against the maximum clock on the same trace: {change} energy "
        f"({mine.energy_j / 1e3:.1f} kJ vs {reference.energy_j / 1e3:.1f} kJ), SLO attainment "
        f"{share(mine.slo_attainment)} vs {share(reference.slo_attainment)}"
    )


def _learned_model_line(controller: Any) -> str | None:
    """One line on the learned model the run kept in the state directory: whether it went
    on from the one a run before kept there (its figures are then not a run from none, as
    ``simulate``'s are) and where it is kept; None where no model is kept."""
    from gpugov.controllers.contract import chain_layer
    from gpugov.daemon.model_store import PersistentOnlineModel

    store = chain_layer(controller, PersistentOnlineModel)
    if store is None:
        return None
    start = (
        f"went on from the one kept in {store.path}"
        if store.restored
        else "learned from none; kept in " + str(store.path)
    )
    return "  learned model: " + start + ("; its last save failed" if store.save_failed else "")


def _print_summary(
    simulation: Any, stats: RunStats, args: argparse.Namespace, profile: Any, report: Any, n: int
) -> None:
    metrics = simulation.result.metrics.as_dict()
    domain = simulation.domain
    title = (
        f"gpugov run --simulate: {domain.label} on {profile.name} ({profile.profile_status}), "
        f"trace {Path(report.path).name} [{n} requests]"
    )
    print(format_summary(metrics, title))
    fallbacks = ", ".join(f"{k} {v}" for k, v in sorted(domain.fallback_counts().items()))
    print(
        f"  daemon: {stats.ticks} ticks, {stats.overruns} overruns, "
        f"{domain.decisions} decisions, {domain.actuator.writes} clock writes"
        + (
            f", {domain.power_limits.writes} power limit writes"
            if domain.caps and domain.power_limits is not None
            else ""
        )
        + (f", fallbacks: {fallbacks}" if fallbacks else "")
    )
    kept = _learned_model_line(domain.controller)
    if kept is not None:
        print(kept)
    past_end = window_past_end_note(report)
    if past_end is not None:  # the run covers less than the window asked for
        print(f"note: {past_end}")
    note = light_load_note(simulation.result.request_records)
    if note:
        print(note)
    if args.record:
        wrote(args.record)
