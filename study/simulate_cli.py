"""``gpugov simulate``, ``gpugov profiles`` and ``gpugov traces``: offline runs of a
controller on the plant, and the profiles and traces they can use."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from gpugov import __version__
from gpugov.daemon import cli_types
from gpugov.daemon.cli_outputs import (
    check_distinct_outputs,
    check_output_file,
    simulated_run_inputs,
)
from gpugov.daemon.cli_support import (
    CONTROLLER_HELP,
    UsageError,
    add_decision_arguments,
    add_engine_view_argument,
    add_safety_arguments,
    check_slo_target_period,
    check_workload_fits,
    checked_controller_flag,
    control_period_of,
    controller_label,
    fail,
    format_summary,
    light_load_note,
    load_profile_for_cli,
    load_trace_for_cli,
    require_extra,
    require_nonnegative,
    require_positive,
    safety_from_args,
    simulated_controller,
    slo_target_of,
    warn,
    window_past_end_note,
    wrote,
)
from gpugov.daemon.decide import close_controller
from gpugov.daemon.errors import ExitCode, Terminated, printable
from gpugov.daemon.files import write_bytes_atomic, write_files_atomic
from gpugov.daemon.outside import invalid_decision_note
from gpugov.daemon.safety import invalid_decisions
from gpugov.daemon.sim_progress import SimulationProgress
from gpugov.daemon.simulated import observation_view
from gpugov.plant import (
    PerformanceProfile,
    ServingPlant,
    ServingResult,
    simulate,
)
from gpugov.plant.attribution import ENERGY_DEFINITIONS, energy_summary, request_rows
from gpugov.plant.profile import DEFAULT_PROFILE
from gpugov.plant.profile_files import list_bundled_profiles, names_profile_file, profile_files
from gpugov.plant.result import arrival_separation
from gpugov.plant.scheduler import SCHEDULERS
from gpugov.plant.synthetic_profiles import (
    ALL_SYNTHETIC,
    SHAPES,
    SYNTHETIC_PREFIX,
    is_synthetic_spec,
    resolve_profile,
)
from gpugov.plant.workload import (
    DEFAULT_TRACE,
    workload_checksum,
)
from gpugov.study.provenance import outside_specs, software_versions


def write_plot(result: ServingResult, path: Path, title: str = "") -> None:
    """PNG of the run: clocks (requested and realised), power against the cap, queues,
    TTFT/TPOT against their SLOs and temperature against the thermal limit."""
    write_bytes_atomic(path, plot_bytes(result, path, title))


def plot_bytes(result: ServingResult, path: Path, title: str = "") -> bytes:
    """:func:`write_plot`'s figure drawn in memory, in the format ``path`` names."""
    from gpugov.study.plots import run_plot_bytes, series_from_result

    return run_plot_bytes(series_from_result(result), path, title or result.controller_name)


def controller_diagnostics(controller: object) -> dict[str, Any] | None:
    """An MPC's solve record for the JSON: solves, fallbacks by reason (``budget``: a
    solve that used up its deterministic budget in virtual time), the budget or limit."""
    from gpugov.controllers.contract import Diagnosable, unwrap
    from gpugov.controllers.mpc.controller import MPCController

    algorithm = unwrap(controller)  # type: ignore[arg-type]
    if not isinstance(algorithm, Diagnosable):
        return None
    report = algorithm.diagnostics()
    budget = algorithm.solve_budget_evaluations if isinstance(algorithm, MPCController) else None
    return {
        "solves": int(len(report.solve_times_s)),
        "successful_solves": int(report.successful_solves),
        "fallbacks": int(report.fallback_count),
        "fallback_reasons": dict(report.fallback_reasons),
        "solve_budget_evaluations": budget,
        "solve_time_limit_s": float(report.solve_time_limit_s),
    }


def result_energy(result: ServingResult) -> dict[str, Any]:
    """The run's energy figures (``plant/attribution.py``) with their definitions."""
    metrics = result.metrics
    summary = energy_summary(
        result.request_records,
        energy_j=metrics.energy_j,
        idle_energy_j=metrics.idle_energy_j,
        output_tokens=metrics.output_tokens,
    )
    return {**summary, "definitions": dict(ENERGY_DEFINITIONS)}


def energy_lines(energy: dict[str, Any]) -> str:
    """Two lines for stdout: the phase split and the per-request distribution."""

    def kj(value: float) -> str:
        return f"{value / 1000.0:.2f} kJ"

    def joules(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    per_request = energy["per_request_j"]
    per_token = energy["per_output_token_j"]
    return (
        f"  {'energy prefill/decode/idle':<31}  {kj(energy['prefill_energy_j'])} / "
        f"{kj(energy['decode_energy_j'])} / {kj(energy['idle_energy_j'])}\n"
        f"  {'J/request p50 / p90 / p99':<31}  "
        + " / ".join(joules(per_request[k], 1) for k in ("p50", "p90", "p99"))
        + " J ("
        + " / ".join(joules(per_token[k], 3) for k in ("p50", "p90", "p99"))
        + " J per output token)"
    )


def _generated_profile(spec: str) -> PerformanceProfile | None:
    """The generated profile ``--profile synthetic:SHAPE`` names (as the scoreboard's
    ``--profiles`` and ``gpugov sweep``'s grid take it); None for a bundled name or a
    file (a file of that name comes first).

    Raises:
        UsageError: an unknown shape (the scoreboard's line), or ``synthetic`` alone.
    """
    if not is_synthetic_spec(spec) or names_profile_file(spec):
        return None
    if spec == ALL_SYNTHETIC:
        raise UsageError(
            f"--profile {spec}: names every generated shape, and a simulation runs one: "
            f"{SYNTHETIC_PREFIX}SHAPE, one of {', '.join(SHAPES)}"
        )
    try:
        return resolve_profile(spec)
    except ValueError as error:
        raise UsageError(f"--profile: {error}") from None


def _failed_output(error: OSError, *outputs: tuple[str, str | None]) -> tuple[str, str]:
    """The flag and the path as given of the output a failed write names (it names a
    link's target, not the link), so that the error line blames the right flag."""
    failed = os.path.realpath(error.filename) if error.filename else None
    given = [(flag, path) for flag, path in outputs if path]
    for flag, path in given:
        if os.path.realpath(path) == failed:
            return flag, path
    return given[0] if given else ("--out", str(error.filename))


def run_simulate(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov simulate``."""
    args.control_period = control_period_of(args.control_period, args.controller)
    require_positive("--control-period", args.control_period)
    check_slo_target_period(args.slo_target, args.control_period)
    require_positive("--duration", args.duration)
    require_positive("--load-scale", args.load_scale)
    require_nonnegative("--latency-noise", args.latency_noise)
    require_nonnegative("--dwell", args.dwell)
    require_positive("--floor", args.floor)
    if args.stride < 1:
        raise UsageError(f"--stride must be >= 1, got {args.stride!r}")
    if not math.isfinite(args.start) or args.start < 0:
        raise UsageError(f"--start must be >= 0, got {args.start!r}")
    generated = _generated_profile(args.profile)
    profile = generated or load_profile_for_cli("--profile", args.profile, load=resolve_profile)
    inputs = simulated_run_inputs(
        args.trace, DEFAULT_PROFILE if generated else args.profile, args.controller
    )
    if generated is not None:  # it reads no profile file: drop the stand-in's files
        del inputs[1 : 1 + len(profile_files(DEFAULT_PROFILE))]
    check_output_file("--out", args.out, inputs)
    check_output_file("--plot", args.plot, inputs)
    check_distinct_outputs(("--out", args.out), ("--plot", args.plot))
    # The controller and the floor before the trace, as the profile: a refusal is not
    # found only after a long read of a large trace.
    checked_controller_flag(args.controller, profile)
    safety = safety_from_args(args, profile.clock_mhz)
    if args.plot:
        require_extra("matplotlib", "simulate --plot")  # one line now, not after the run
        from gpugov.study.plots import check_image_format

        check_image_format("--plot", args.plot, "simulate --plot")
    workload, report = load_trace_for_cli(
        args.trace,
        format=args.trace_format,
        format_flag="--trace-format",
        start_s=args.start,
        duration_s=args.duration,
        spread_batches=not args.keep_batched_stamps,
        load_scale=args.load_scale,
        progress=not args.quiet,
    )
    if not workload:
        raise UsageError(f"--trace {args.trace}: the selected window holds no requests")
    plant = ServingPlant.from_profile(profile, latency_noise_cv=args.latency_noise)
    check_workload_fits(workload, plant, args.trace)
    slo_target = slo_target_of(args.slo_target)
    controller = simulated_controller(
        args.controller,
        plant,
        workload,
        args.control_period,
        safety=safety,
        slo_target=slo_target,
    )
    scheduler = SCHEDULERS[args.scheduler]
    progress = SimulationProgress(workload[-1].arrival_time_s, "simulate", enabled=not args.quiet)
    try:
        result = simulate(
            workload,
            plant,
            scheduler,
            controller,
            seed=args.seed,
            controller_name=controller_label(args.controller),
            control_period_s=args.control_period,
            on_progress=progress,
            view=observation_view(args.engine_view, slo_target),
        )
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: one line saying where it stopped
        start = "\n" if sys.stderr.isatty() and not args.quiet else ""
        terminated = Terminated.caused(stop)
        print(
            f"{start}gpugov: {'terminated' if terminated else 'interrupted'} at "
            f"{progress.reached_s:,.1f} of {progress.total_s:,.1f} simulated s",
            file=sys.stderr,
        )
        return ExitCode.TERMINATED if terminated else ExitCode.INTERRUPTED
    finally:
        close_controller(controller, f"controller {controller_label(args.controller)!r}")
    progress.close(result=result)
    invalid = invalid_decision_note(controller, controller_label(args.controller))
    if invalid is not None:
        warn(invalid)
    metrics = result.metrics.as_dict()
    title = (
        f"gpugov simulate: {controller_label(args.controller)} on {profile.name} "
        f"({profile.profile_status}), "
        f"trace {Path(report.path).name} [{len(workload)} requests], every "
        f"{args.control_period:g} s, SLO target "
        + ("none" if args.slo_target is None else f"{100.0 * args.slo_target:g}%")
        + f", {safety.words()}, {args.engine_view} engine view"
    )
    energy = result_energy(result)
    separation = arrival_separation(result.request_records)
    note = light_load_note(result.request_records, separation)
    # The files first: a closed stdout (`gpugov simulate --out F | head -1`) ends the
    # command at the first print, and must not cost the run's outputs.
    outputs: dict[Path, str | bytes] = {}
    if args.out:
        out = Path(args.out)
        series = result.as_dict(stride=args.stride)
        series.pop("metrics")
        payload = {
            "metrics": metrics,
            "metadata": {
                **result.metadata,
                "gpugov_version": __version__,
                # The libraries, the checkout's commit and an outside controller's code.
                "versions": software_versions(outside_specs([args.controller])),
                "controller": controller_label(args.controller),
                "controller_spec": args.controller,
                "engine_view": args.engine_view,
                "control_period_s": args.control_period,
                "slo_target": args.slo_target,
                "safety": safety.as_dict(),
                "trace": {
                    "path": report.path,
                    "format": report.format,
                    "rows": report.rows,
                    "skipped_zero_token_rows": report.skipped_zero_token_rows,
                    "sha256": report.sha256,
                    "start_s": args.start,
                    "duration_s": args.duration,
                    "load_scale": args.load_scale,
                    # The grid a batched trace's arrivals were spread over (None: as written).
                    "batch_grid_s": report.batch_grid_s,
                    "requests": len(workload),
                    "arrival_times": separation.arrival_times,
                    "largest_arrival_group": separation.largest_group,
                    "light_load_floor": separation.separated,
                    "workload_checksum": workload_checksum(workload),
                },
                "series_stride": args.stride,
                "controller_diagnostics": controller_diagnostics(controller),
                "invalid_decisions": invalid_decisions(controller),
            },
            "series": series,
            "energy": energy,
            "requests": request_rows(result.request_records),
        }
        outputs[out] = json.dumps(payload, indent=1, allow_nan=False)
    if args.plot:
        outputs[Path(args.plot)] = plot_bytes(result, Path(args.plot), title)
    # One set: a run stopped or killed mid-write leaves the old files whole, never a part,
    # and never a new --out beside the earlier --plot.
    try:
        write_files_atomic(outputs)
    except OSError as error:
        flag, path = _failed_output(error, ("--out", args.out), ("--plot", args.plot))
        return fail(f"{flag} {path}: cannot write: {error.strerror or error}", ExitCode.FAILURE)
    written = [str(path) for path in outputs]
    print(format_summary(metrics, title))
    print(energy_lines(energy))
    past_end = window_past_end_note(report)
    if past_end is not None:  # the run covers less than the window asked for
        print(f"note: {past_end}")
    if note:
        print(note)
    for path in written:
        wrote(path)
    return 0


def run_traces(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov traces``: every trace name, where it resolves, present?"""
    from gpugov.plant.workload import TRACES_DIR_ENV, list_traces, traces_dir, traces_dir_problem

    problem = traces_dir_problem()
    if problem is not None:  # the shared traces are listed, each absent: say why
        warn(problem)
    rows = list_traces()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<18} {'kind':<8} {'present':<8} path")
    for row in rows:
        present = "yes" if row["present"] else "no"
        # $GPUGOV_TRACES_DIR's text, escaped: a newline in it stays in its row.
        print(printable(f"{row['name']:<18} {row['kind']:<8} {present:<8} {row['path']}"))
    print(
        printable(
            f"shared traces are looked up in {traces_dir()} "
            f"(set ${TRACES_DIR_ENV} to change); any other --trace value is a file path"
        )
    )
    return 0


def run_profiles(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov profiles``."""
    rows = list_bundled_profiles()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{'name':<30} {'status':<19} {'TP':>2} {'clocks (MHz)':<12} {'SLO TTFT/TPOT':<22} "
        f"{'worst cal.':>10}  gpu / model"
    )
    for row in rows:
        clock_range = row.get("clock_range_mhz") or ["?", "?"]
        worst = row.get("worst_calibration_error")
        worst_text = "none" if worst is None else f"{worst:.3f}"
        slo = f"{row.get('ttft_slo_s')}s+{row.get('ttft_slo_per_prompt_token_s', 0) * 1e6:g}us/tok"
        slo += f"/{row.get('tpot_slo_s')}s"
        print(
            f"{row['name']:<30} {row['status']:<19} {row.get('tensor_parallel', 1):>2} "
            f"{clock_range[0]}-{clock_range[1]:<7} {slo:<22} {worst_text:>10}  "
            f"{row['gpu']} / {row['model']}"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``simulate`` and ``profiles`` to the ``gpugov`` parser."""
    sim = subparsers.add_parser(
        "simulate",
        help="run a controller on the simulated plant and print its metrics",
        description="Replay a trace through the iteration-level plant under one controller.",
    )
    sim.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help=f"bundled or shared trace name, or a path (default {DEFAULT_TRACE})",
    )
    sim.add_argument(
        "--trace-format",
        default="auto",
        choices=["auto", "azure", "burstgpt", "mooncake", "csv"],
        help="the trace file's format (default: detected from its first line)",
    )
    sim.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"bundled profile name, manifest path or synthetic:SHAPE (a generated profile; "
        f"default {DEFAULT_PROFILE})",
    )
    sim.add_argument("--controller", default="max", help=f"{CONTROLLER_HELP} (default max)")
    sim.add_argument(
        "--scheduler",
        default="chunked",
        choices=sorted(SCHEDULERS),
        help="the engine's batching rule (default chunked prefill)",
    )
    add_decision_arguments(sim, node_note="a node's daemon.period_s; ")
    add_safety_arguments(sim)
    add_engine_view_argument(sim)
    sim.add_argument(
        "--start",
        type=cli_types.offset,
        default=0.0,
        metavar="S",
        help="window start, seconds after the trace's first arrival",
    )
    sim.add_argument(
        "--duration",
        type=cli_types.duration,
        default=None,
        metavar="S",
        help="window length in seconds (default: the whole trace)",
    )
    sim.add_argument(
        "--load-scale",
        type=cli_types.load_scale,
        default=1.0,
        metavar="X",
        help="X>1 compresses inter-arrival times (more load), X<1 dilates; "
        "applied after the --start/--duration window is cut (the window "
        "keeps its requests, they arrive over duration/X seconds)",
    )
    sim.add_argument(
        "--keep-batched-stamps",
        action="store_true",
        help="replay a grid-quantised trace's timestamps as written (default: "
        "spread each batch over its grid step, e.g. Mooncake's 3 s)",
    )
    sim.add_argument(
        "--seed", type=cli_types.seed, default=0, help="seed of the latency noise (default 0)"
    )
    sim.add_argument(
        "--latency-noise",
        type=cli_types.latency_noise,
        default=0.0,
        metavar="CV",
        help="coefficient of variation of iteration-time jitter (seeded)",
    )
    sim.add_argument(
        "--out",
        default=None,
        metavar="FILE.json",
        help="write metrics, metadata and time series as JSON here",
    )
    sim.add_argument(
        "--stride",
        type=cli_types.positive_int,
        default=10,
        help="keep every N-th series sample in the JSON (default 10)",
    )
    sim.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="write a PNG of clocks, power, queues, TTFT/TPOT vs SLO and "
        "temperature (needs gpugov[plots])",
    )
    sim.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    sim.set_defaults(handler=run_simulate)

    prof = subparsers.add_parser("profiles", help="list the bundled GPU profiles")
    prof.add_argument("--json", action="store_true", help="print the list as JSON")
    prof.set_defaults(handler=run_profiles)

    traces = subparsers.add_parser(
        "traces",
        help="list the trace names, where each resolves and whether it is present",
        description="List the bundled and shared trace names --trace accepts, the file "
        "each resolves to now, and whether that file is present.",
    )
    traces.add_argument("--json", action="store_true", help="print the list as JSON")
    traces.set_defaults(handler=run_traces)
