"""The node commands of ``gpugov``: run, check-config, reset-clocks, status, replay. This
module registers them all; ``status`` runs in :mod:`daemon.status_cli`, ``reset-clocks`` in
:mod:`daemon.reset_clocks`, and what the commands
share (exit codes of errors, the GPU backend a command reads) is :mod:`daemon.node_support`.

Exit codes (also in ``docs/daemon.md``):

* 0 -- success, or a clean stop (SIGTERM and the other stop signals) with every clock
  reset;
* 1 -- the daemon failed at run time (a controller raised ``daemon.max_controller_failures``
  times in a row, an unexpected GPU error);
* 2 -- usage or configuration error (nothing was applied);
* 3 -- permission denied: locking clocks needs root or CAP_SYS_ADMIN;
* 4 -- no usable GPU: no driver/NVML, no such GPU, or clock locking not supported;
* 5 -- a GPU was lost mid-run (the others were reset);
* 6 -- at exit (or in ``reset-clocks``) some GPUs' locks could not be reset, or the power
  limits gpugov set not restored: the message names them;
* 130 -- stopped by Ctrl-C (SIGINT), every clock reset.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from gpugov.daemon import cli_types
from gpugov.daemon.cli_outputs import check_output_file
from gpugov.daemon.cli_support import (
    UsageError,
    add_decision_arguments,
    add_engine_view_argument,
    add_safety_arguments,
    check_fixed_clock,
    check_metrics_address,
    fail,
    hidden_alias,
    load_profile_for_cli,
    metrics_exporter,
    parse_controller_flag,
    require_positive,
    setup_logging,
    warn,
)
from gpugov.daemon.config import GpugovConfig, load_config, own_metrics_engine
from gpugov.daemon.controller_config import ControllerConfig, PowerProfileControllerConfig
from gpugov.daemon.controller_spec import CONTROLLER_SPEC_HELP, parse_controller_spec, shown_spec
from gpugov.daemon.domain import Domain
from gpugov.daemon.errors import (
    ExitCode,
    GpuLost,
    TransientGpuError,
    printable,
)
from gpugov.daemon.exit_restore import ExitBudget
from gpugov.daemon.files import resolve_state_dir
from gpugov.daemon.lockstate import refuse_if_held
from gpugov.daemon.log_lines import print_to_stderr
from gpugov.daemon.loop import (
    ResetAdvice,
    SystemdNotify,
    TimedLoop,
    raise_not_reset,
    restore_all,
    restore_power_limits,
    run,
)
from gpugov.daemon.loop import stop_on_signals as _stop_on_signals
from gpugov.daemon.node_support import exit_code, gpu_lost_line, guarded
from gpugov.daemon.nvml import load_pynvml
from gpugov.daemon.reconcile import reset_left_locks
from gpugov.daemon.record import Recorder
from gpugov.daemon.record_reader import read_recording
from gpugov.daemon.replay import replay
from gpugov.daemon.reset_clocks import cmd_reset_clocks
from gpugov.daemon.run_simulated import DEFAULT_CONTROLLER, DEFAULT_SPEED, run_simulated
from gpugov.daemon.sd_notify import watchdog_usec_problem
from gpugov.daemon.service import OPENING_GPUS, domains_from_config
from gpugov.daemon.status_cli import cmd_status, may_lock_clocks
from gpugov.daemon.stop_signals import StopEvent
from gpugov.plant.profile import DEFAULT_PROFILE

log = logging.getLogger("gpugov")
T = TypeVar("T")

EXIT_OK = ExitCode.OK
EXIT_FAILURE = ExitCode.FAILURE


# --------------------------------------------------------------------------- run
def _run_node(args: argparse.Namespace) -> int:
    if not args.config:
        raise UsageError("gpugov run needs --config FILE (or --simulate)")
    from gpugov.daemon.node_check import (
        config_inputs,
        ignored_backend_warnings,
        ignored_target_warnings,
        period_warnings,
        shared_budget_file_warnings,
        shared_engine_warnings,
        unkept_model_warnings,
    )

    environ_watchdog_s()  # a malformed $WATCHDOG_USEC is refused before any work
    config = load_config(args.config)
    check_output_file(
        "--record" if args.record else "daemon.record",
        args.record or config.daemon.record,
        config_inputs(config, args.config),
    )
    setup_logging(args.log_level or config.daemon.log_level)
    for line in [
        *ignored_backend_warnings(config),
        *ignored_target_warnings(config),
        *period_warnings(config),
        *shared_engine_warnings(config),
        *shared_budget_file_warnings(config),
    ]:
        log.warning("%s", line)
    notify = SystemdNotify()
    try:
        notify.check_period(config.daemon.period_s)
    except ValueError as error:
        raise UsageError(f"{args.config}: {error}") from error
    dry_run = args.dry_run or config.daemon.dry_run
    # Before any GPU is opened: a bad address used to be refused after reconcile.
    try:
        if args.metrics_address:
            check_metrics_address(args.metrics_address)
            own = own_metrics_engine(args.metrics_address, config.domains)
            if own is not None:
                raise UsageError(
                    f"--metrics-address {args.metrics_address}: domains[{own}].engine.url "
                    f"({config.domains[own].engine.url}) in {args.config} is this daemon's "
                    "own metrics endpoint; give the serving engine's /metrics URL, or serve "
                    "the metrics elsewhere"
                )
        else:
            check_metrics_address(
                config.daemon.metrics_address, f"{args.config}: daemon.metrics_address"
            )
    except UsageError:
        # The port a running daemon serves on: the line names that daemon (the state
        # directory it holds), not a port to change that the next try would meet.
        state_dir = None if dry_run else resolve_state_dir(config.daemon.state_dir)
        if state_dir is not None:
            refuse_if_held(state_dir)
        raise
    stop = StopEvent()
    received: list[str] = []
    # Signals are caught from here on: one during the start (opening the GPUs,
    # reconciling, building the MPC) ends the run cleanly before the first tick.
    phase: list[str] = []  # what the start is doing, for a stop that does not wait for it
    # /metrics and /healthz ("starting") answer from here, so the start may take the
    # exporter's START_ALLOWANCE_S (the units' TimeoutStartSec=), a pod's probes seeing it.
    with (
        _stop_on_signals(stop, received),
        metrics_exporter(args.metrics_address or config.daemon.metrics_address)
        or contextlib.nullcontext() as exporter,
    ):
        try:
            assembled = _built_unless_stopped(
                lambda: domains_from_config(config, dry_run=dry_run, stop=stop, phase=phase),
                stop,
            )
        except TransientGpuError as error:
            if not stop.is_set():
                raise
            # The stop cut a GPU's retries short: nothing was opened or locked.
            log.info("stopped during the start, before the first tick (%s)", error)
            return _stopped(received)
        if assembled is None:
            # A stop during mpc-online's warm-up (a compile, seconds) was said to be a
            # wedged driver.
            log.info(
                "stopped during the start, before the first tick (%s); nothing was locked",
                phase[0] if phase else OPENING_GPUS,
            )
            return _stopped(received)
        recorder = None
        restore_here = True  # the finally's restore: until the loop's exit or the stop's
        advice = ResetAdvice(config.daemon.backend, args.config)
        try:
            for domain in assembled.domains:
                domain.reconcile(config.daemon.reconcile, dry_run=dry_run, stop=stop)
            if not dry_run:
                reset_left_locks(config, assembled, stop, advice=advice)
            if stop.is_set():
                # Stopped while the start ran (opening the GPUs, reconciling, building
                # the controllers): no loop, so no "locking clocks" line before the stop.
                log.info("stopped during the start, before the first tick")
                restore_here = False
                _restore_at_start(assembled.domains, advice)  # before Ctrl-C's line says so
                return _stopped(received)
            record = args.record or config.daemon.record
            recorder = Recorder(record, assembled.header) if record else None
            for line in [] if dry_run else unkept_model_warnings(config):
                log.warning("%s", line)  # a start that got this far: no refusal follows
            mode = "dry run" if dry_run else "locking clocks"
            log.info(
                "gpugov %s: %d domain(s), period %.3g s%s",
                mode,
                len(assembled.domains),
                config.daemon.period_s,
                f", metrics on {exporter.url}" if exporter else "",
            )
            restore_here = False
            run(
                assembled.domains,
                TimedLoop(config.daemon.period_s, stop=stop),
                exporter=exporter,
                notify=notify,
                on_tick=recorder,
                max_controller_failures=config.daemon.max_controller_failures,
                concurrent_observation=True,
                # exit 6's line: reset-clocks with this config, unless the GPUs are NVML's
                reset_advice=advice,
            )
        finally:
            try:
                if restore_here:  # what reconcile could not reset is tried once more
                    _restore_at_start(assembled.domains, advice)
            finally:
                if recorder is not None:
                    recorder.close()
                if exporter is not None:
                    exporter.close()
                assembled.close()
    if dry_run:
        log.info("stopped; a dry run: no clock was locked")
    else:
        log.info("stopped; every clock gpugov locked was reset")
    return _stopped(received, dry_run=dry_run)


def _restore_at_start(domains: Sequence[Domain], advice: ResetAdvice) -> None:
    """The exit of a start that never reached the loop: reset what reconcile locked or
    could not reset, within the exit's budget, as the loop's exit does.

    Raises:
        ClocksNotReset: some GPUs may still be locked or capped (exit 6, the line naming
            them; an error already on its way out is logged first), as after the loop.
    """
    budget = ExitBudget()
    failed = restore_all(domains, budget)
    capped = restore_power_limits(domains, budget)
    if failed or capped:
        lost = {label for domain in domains for label in domain.actuator.lost}
        raise_not_reset(failed, sys.exc_info()[1], capped, advice, lost)


STOP_GRACE_S = 1.0
"""How long a start that was stopped may take to end on its own (a retry's wait wakes on
the stop at once) before :func:`_built_unless_stopped` leaves it to its call."""


def _built_unless_stopped(build: Callable[[], T], stop: threading.Event) -> T | None:
    """``build()`` on a worker thread until it returns or ``stop`` is set (None when it
    has not returned :data:`STOP_GRACE_S` later: a hung NVML call; nothing is locked yet).
    A build that returns after it was given up is closed there (its GPUs, engines, files
    and GPU holds), not left open for the rest of the process.

    Raises:
        Exception: what ``build`` raised.
    """
    done = threading.Event()
    given_up = threading.Lock()
    outcome: list[T] = []
    failure: list[BaseException] = []
    abandoned: list[bool] = []

    def work() -> None:
        try:
            built = build()
        except BaseException as error:  # the worker's outermost edge: raised in the caller
            with given_up:
                failure.append(error)
                done.set()
            return
        with given_up:
            if not abandoned:
                outcome.append(built)
                done.set()
                return
        close = getattr(built, "close", None)
        if close is not None:
            close()

    threading.Thread(target=work, name="gpugov-start", daemon=True).start()
    while not done.wait(0.05):
        if stop.is_set() and not done.wait(STOP_GRACE_S):
            with given_up:
                if not done.is_set():
                    abandoned.append(True)
                    return None
    if failure:
        raise failure[0]
    return outcome[0]


def _stopped(received: list[str], *, dry_run: bool = False) -> int:
    """The exit code of a run stopped by a signal (``received``: its name, if any)."""
    if received[:1] == ["SIGINT"]:
        # Ctrl-C, as every command answers it: one line and 130, after the reset.
        done = (
            "a dry run: no clock was locked" if dry_run else "every clock gpugov locked was reset"
        )
        print_to_stderr(f"gpugov: interrupted; {done}")
        return ExitCode.INTERRUPTED
    return EXIT_OK


@guarded
def cmd_run(args: argparse.Namespace) -> int:
    """``gpugov run``."""
    if args.simulate:
        if args.config:
            raise UsageError("--simulate and --config are exclusive")
        if args.dry_run:
            raise UsageError(
                "--dry-run applies to a node run (--config); --simulate never touches a GPU"
            )
        return run_simulated(args)
    given = [
        flag
        for dest, (flag, default) in getattr(args, "simulate_only", {}).items()
        if getattr(args, dest, default) != default
    ]
    if given:
        raise UsageError(
            f"{', '.join(given)}: only with --simulate (a node run takes its config's settings)"
        )
    return _run_node(args)


# ------------------------------------------------------------------ check-config
@guarded
def cmd_check_config(args: argparse.Namespace) -> int:
    """``gpugov check-config FILE``: validate the file and check it against this node as
    ``run`` would at start (read-only; :mod:`daemon.node_check`), print what would run,
    apply nothing. Every problem ``run`` would refuse to start with is one line, and the
    exit code is ``run``'s for the first; a rule or panel that could never show data is a
    warning line (exit 0)."""
    from gpugov.daemon.node_check import (
        check_node,
        ignored_backend_warnings,
        ignored_target_warnings,
        period_warnings,
        shared_budget_file_warnings,
        shared_engine_warnings,
        slo_warnings,
        unkept_model_warnings,
    )

    watchdog_s = _watchdog_s(args.watchdog_sec)
    config = load_config(args.file)
    problems: list[Exception] = []
    if watchdog_s is not None:
        usec = str(round(watchdog_s * 1e6))
        try:
            SystemdNotify(environ={"WATCHDOG_USEC": usec}).check_period(config.daemon.period_s)
        except ValueError as error:
            problems.append(UsageError(f"{args.file}: {error}"))
    report = check_node(
        config, path=args.file, offline=args.offline, load_nvml=lambda: load_pynvml()
    )
    problems.extend(report.problems)
    if problems:
        # A refused config's lines are its problems alone: warnings about a config run
        # would not start with came first and buried them.
        for problem in problems:
            # A lost GPU in run's own words (its line says no usable GPU is left).
            fail(gpu_lost_line(problem) if isinstance(problem, GpuLost) else problem)
        return exit_code(problems[0]) or EXIT_FAILURE
    for line in [
        *slo_warnings(config),
        *ignored_backend_warnings(config),
        *ignored_target_warnings(config),
        *period_warnings(config),
        *shared_engine_warnings(config),
        *shared_budget_file_warnings(config),
        *report.warnings,
    ]:
        warn(line)
    print(printable(f"{args.file}: OK"))
    print(describe_config(config))
    for line in report.lines:
        print(printable(f"  {line}"))  # a GPU's NVML name, a file's path
    # A note, not a warning: the state directory may be the unit's (StateDirectory=),
    # which this shell does not see; run warns where it really has none.
    for line in unkept_model_warnings(config):
        print(printable(f"  note: {line} (a systemd unit's StateDirectory= sets it)"))
    # The emulated GPUs need no privilege; the actuator and zeusd hold it for the governor.
    writes_itself = config.daemon.backend in ("nvml", "nvidia-smi")
    locks = not args.offline and writes_itself and not config.daemon.dry_run
    if locks and not may_lock_clocks():
        print("  this process may not lock clocks; run needs root or CAP_SYS_ADMIN")
    return EXIT_OK


def _watchdog_s(flag: float | None) -> float | None:
    """The WatchdogSec= to check ``period_s`` against: the flag's, else the environment's
    ``WATCHDOG_USEC`` (as systemd sets it), else None."""
    if flag is not None:
        require_positive("--watchdog-sec", flag)
        return flag
    return environ_watchdog_s()


def environ_watchdog_s(environ: Mapping[str, str] | None = None) -> float | None:
    """``$WATCHDOG_USEC`` in seconds, or None when it is not set.

    systemd sets it to a positive integer of microseconds (the unit's ``WatchdogSec=``);
    anything else (``abc``, ``-5``, ``nan``, ``1e6``) was read as no watchdog, or ended the
    command in a traceback, and is refused in one line naming the variable.

    Raises:
        UsageError: the variable is set to anything but a positive integer.
    """
    env = os.environ if environ is None else environ
    problem = watchdog_usec_problem(env)
    if problem is not None:
        raise UsageError(problem)
    raw = env.get("WATCHDOG_USEC")
    return None if raw is None else int(raw.strip()) / 1e6


def describe_config(config: GpugovConfig) -> str:
    """A few lines naming every domain's GPUs, pool role, engine, controller and limits,
    each escaped (:func:`~gpugov.daemon.errors.printable`)."""
    d = config.daemon
    lines = [
        f"  period {d.period_s:g} s, backend {d.backend}, metrics "
        f"{d.metrics_address or 'off'}{', dry run' if d.dry_run else ''}"
    ]
    for domain in config.domains:
        controller = domain.controller.model_dump(exclude={"kind"}, mode="json")
        options = ", ".join(f"{k}={v}" for k, v in controller.items() if v is not None)
        floor = domain.safety.floor_mhz
        target = domain.slo_target
        role = domain.role or "from the engine's labels, else colocated"
        lines.append(
            f"  domain {domain.name}: GPUs {', '.join(map(str, domain.gpus))}; role {role}; "
            f"engine {domain.engine.kind} at {domain.engine.url}; "
            f"controller {domain.controller.kind}{f' ({options})' if options else ''}"
            + (
                f", SLO target {100.0 * target.attainment:g}% over {target.window_s:g} s"
                if target is not None
                else ""
            )
            + f"; fail-safe {domain.failsafe} after {config.stale_after_s(domain):g} s; "
            f"dwell {domain.safety.dwell_s:g} s" + (f"; floor {floor:g} MHz" if floor else "")
        )
    return "\n".join(map(printable, lines))  # a path in a controller's options


# ------------------------------------------------------------------------ replay
def _calibrated_on(spec: ControllerConfig, profile: object, text: str) -> ControllerConfig:
    """A ``power-profile`` with neither a preset nor a profile of its own calibrated on the
    replay's profile (``--profile``, default the recording's), as ``mpc`` plans on it.

    Raises:
        UsageError: there is no profile to calibrate on (the line names ``--profile``).
    """
    if not isinstance(spec, PowerProfileControllerConfig) or spec.ceiling_mhz is not None:
        return spec
    if spec.profile is not None:
        return spec
    if not isinstance(profile, str) or not profile:
        raise UsageError(
            f"--controller {shown_spec(text)}: the recording names no profile to calibrate "
            "the preset on; give one with --profile NAME (or --controller power-profile:PROFILE)"
        )
    return spec.model_copy(update={"profile": profile})


def _check_recorded_profile(profile: str, text: str) -> None:
    """The recording's profile, which the controller plans on, loads here.

    Raises:
        UsageError: one line naming the profile and ``--profile`` (a recording made on a
            profile file that has moved, or on another machine's).
    """
    from gpugov.plant.profile import ProfileError
    from gpugov.plant.profile_files import load_profile

    try:
        load_profile(profile)
    except (ProfileError, OSError) as error:
        raise UsageError(
            f"--controller {shown_spec(text)}: the recording's profile cannot be read here "
            f"({error}); give it with --profile NAME|FILE"
        ) from error


@guarded
def cmd_replay(args: argparse.Namespace) -> int:
    """``gpugov replay FILE.jsonl --controller X``."""
    if args.profile is not None:  # refused even when unused, before the recording is read
        load_profile_for_cli("--profile", args.profile)
    parse_controller_flag(args.controller, default_profile=args.profile)  # likewise
    header, _ = read_recording(args.file, warn=lambda message: None)
    from gpugov.daemon.replay import checked_header

    _, domains = checked_header(args.file, header)
    profile = args.profile or header.get("profile")
    try:
        spec = parse_controller_spec(args.controller, default_profile=profile)
    except ValueError as error:
        raise UsageError(str(error)) from error
    spec = _calibrated_on(spec, profile, args.controller)
    if (
        args.profile is None
        and isinstance(profile, str)
        and getattr(spec, "profile", None) == profile
    ):
        _check_recorded_profile(profile, args.controller)
    clocks = [float(clock) for info in domains.values() for clock in info["supported_clocks_mhz"]]
    if clocks:
        check_fixed_clock(spec, min(clocks), max(clocks), args.controller)
    report = replay(args.file, spec, warn=warn)
    print(report.format(show=args.show))
    return EXIT_OK


# ---------------------------------------------------------------------- register
def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add run, check-config, reset-clocks, status and replay to the ``gpugov`` parser."""
    run_parser = subparsers.add_parser(
        "run",
        help="run the governor on this node (or on the simulated plant with --simulate)",
        description="Observe GPUs and the serving engine, decide a clock, lock it; "
        "every lock is reset on exit. Exit codes: 0 ok, 1 run-time failure, 2 usage or "
        "config error, 3 permission denied, 4 no usable GPU, 5 GPU lost, 6 clocks not reset "
        "(named), 130 interrupted (Ctrl-C; every lock reset).",
    )
    run_parser.add_argument("--config", metavar="FILE", help="TOML config (a real node)")
    run_parser.add_argument(
        "--dry-run", action="store_true", help="observe and decide, log the clock writes, make none"
    )
    run_parser.add_argument(
        "--simulate", action="store_true", help="run against the simulated plant instead"
    )
    run_parser.add_argument(
        "--trace",
        default=None,
        metavar="NAME|PATH",
        help="--simulate: trace name (see gpugov traces) or file (default azure-conv-10min)",
    )
    run_parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"--simulate: the plant's profile, name or manifest (default {DEFAULT_PROFILE})",
    )
    run_parser.add_argument(
        "--controller",
        default=DEFAULT_CONTROLLER,
        help=f"{CONTROLLER_SPEC_HELP} (--simulate; default {DEFAULT_CONTROLLER}, which reads "
        "no profile)",
    )
    pace = run_parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed",
        type=cli_types.speed,
        default=None,
        metavar="X",
        help=f"--simulate: simulated seconds per wall second (default {DEFAULT_SPEED:g})",
    )
    pace.add_argument("--virtual", action="store_true", help="--simulate: run as fast as possible")
    run_parser.add_argument(
        "--duration",
        type=cli_types.duration,
        default=None,
        metavar="S",
        help="--simulate: the trace window's length in seconds (default: the whole trace)",
    )
    run_parser.add_argument(
        "--load-scale",
        type=cli_types.load_scale,
        default=1.0,
        metavar="X",
        help="--simulate: X>1 compresses inter-arrival times (more load), X<1 dilates "
        "(after the --duration window is cut)",
    )
    run_parser.add_argument(
        "--keep-batched-stamps",
        action="store_true",
        help="--simulate: replay a grid-quantised trace's timestamps as written (default: "
        "spread each batch over its grid step, e.g. Mooncake's 3 s)",
    )
    add_decision_arguments(
        run_parser, prefix="--simulate: ", node_note="a node run takes daemon.period_s; "
    )
    hidden_alias(run_parser, "--period", "control_period", cli_types.period)
    add_safety_arguments(run_parser, prefix="--simulate: ")
    add_engine_view_argument(run_parser, prefix="--simulate: ")
    run_parser.add_argument(
        "--seed",
        type=cli_types.seed,
        default=0,
        help="--simulate: seed of the latency noise (default 0)",
    )
    run_parser.add_argument(
        "--latency-noise",
        type=cli_types.latency_noise,
        default=0.0,
        metavar="CV",
        help="--simulate: coefficient of variation of iteration-time jitter, seeded by "
        "--seed (default 0: none), as simulate's",
    )
    run_parser.add_argument(
        "--metrics-address",
        default=None,
        metavar="HOST:PORT",
        help="serve /metrics here (default 127.0.0.1:9400 or the config's; 'none' to disable)",
    )
    run_parser.add_argument(
        "--record",
        default=None,
        metavar="FILE.jsonl",
        help="write one JSON line per domain per tick (for gpugov replay and gpugov plot); "
        "its directory must exist",
    )
    run_parser.add_argument(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="default: the config's, or warning with --simulate",
    )
    run_parser.add_argument(
        "--quiet", action="store_true", help="--simulate: no progress lines on stderr"
    )
    # Every flag whose help says "--simulate:" (and --controller, whose help is the spec's),
    # with its default: a node run refuses one given another value (it ignored them).
    simulate_only = {
        action.dest: (action.option_strings[0], action.default)
        for action in run_parser._actions
        if action.option_strings
        and ((action.help or "").startswith("--simulate") or action.dest == "controller")
    }
    run_parser.set_defaults(handler=_run_entry, simulate_only=simulate_only)

    check = subparsers.add_parser(
        "check-config",
        help="validate a config file and check it against this node's GPUs; apply nothing",
        description="Validate FILE, then check it as `run` would at start, read-only: the "
        "GPUs exist, the floor is below their top clock, the controllers build (plan, "
        "profiles), the emulator answers, the record file and metrics address work. "
        "Exit codes as `run`'s.",
    )
    check.add_argument("file", metavar="FILE", help="the TOML config to validate")
    check.add_argument(
        "--offline",
        action="store_true",
        help="check the file only: skip the GPUs, the emulator, the record file and the "
        "metrics address",
    )
    check.add_argument(
        "--watchdog-sec",
        type=cli_types.duration,
        default=None,
        metavar="S",
        help="check daemon.period_s against a unit's WatchdogSec= of S seconds (default: "
        "$WATCHDOG_USEC when set)",
    )
    check.set_defaults(handler=cmd_check_config)

    reset = subparsers.add_parser(
        "reset-clocks",
        help="remove SM clock locks (for ExecStopPost= and people)",
        description="Remove the SM clock locks on the GPUs (every one by default), through "
        "the config's backend when --config is given; exit 6 when a GPU may stay locked (3 when "
        "this user may not reset it).",
    )
    reset.add_argument("--gpus", default="all", help="'all' or indices/UUIDs, comma separated")
    _backend_arguments(reset, "reset through")
    reset.set_defaults(handler=cmd_reset_clocks)

    status = subparsers.add_parser(
        "status",
        help="GPUs, clock ranges, clocks, power, lock permission, engine reachability",
        description="Show each GPU's clock range, clocks, power and whether this user may "
        "lock its clocks, and whether the engines answer; changes nothing.",
    )
    status.add_argument(
        "--config", metavar="FILE", help="read the config's GPU backend and check its engines"
    )
    _backend_arguments(status, "read the GPUs through", config=False)
    status.add_argument(
        "--engine-url",
        action="append",
        metavar="URL",
        help="also check this engine's metrics page (repeatable)",
    )
    status.add_argument(
        "--governor-metrics",
        default=None,
        metavar="URL",
        help="the running daemon's /metrics (e.g. http://127.0.0.1:9400/metrics): also show "
        "its last minute's J per output token and energy per 1,000 requests",
    )
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.set_defaults(handler=cmd_status)

    rep = subparsers.add_parser(
        "replay", help="replay a --record file through another controller and compare"
    )
    rep.add_argument("file", metavar="FILE.jsonl", help="a recording from run --record")
    rep.add_argument("--controller", required=True, help=CONTROLLER_SPEC_HELP)
    rep.add_argument(
        "--profile",
        default=None,
        help="profile for mpc and power-profile to plan or calibrate on (default: the recording's)",
    )
    rep.add_argument(
        "--show",
        type=cli_types.nonnegative_int,
        default=10,
        help="differences to list (default 10)",
    )
    rep.set_defaults(handler=cmd_replay)


def _backend_arguments(parser: argparse.ArgumentParser, verb: str, *, config: bool = True) -> None:
    """``--backend`` and ``--emulator`` (and ``--config`` unless the command has its own)."""
    if config:
        parser.add_argument(
            "--config",
            metavar="FILE",
            help="take the GPU backend (and emulator URL) from this config, as run does",
        )
    parser.add_argument(
        "--backend",
        default=None,
        choices=["nvml", "nvidia-smi", "emulated"],
        help=f"{verb} NVML, the nvidia-smi command, or gpugov emulate's GPUs "
        "(default: the config's, else nvml)",
    )
    parser.add_argument(
        "--emulator",
        default=None,
        metavar="URL",
        help="gpugov emulate's URL for --backend emulated (default: the config's)",
    )


def _run_entry(args: argparse.Namespace) -> int:
    if args.metrics_address is None and args.simulate:
        args.metrics_address = "127.0.0.1:9400"
    return cmd_run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one of this module's commands (for tests and ``python -m daemon.node_cli``),
    through the ``gpugov`` entry point (its one error line and exit codes)."""
    from gpugov.cli import main as gpugov_main

    return gpugov_main(argv)


if __name__ == "__main__":
    sys.exit(main())
