"""``gpugov bench controllers`` and ``python -m gpugov.study.scoreboard``: the scoreboard's
command line. Its flags (:func:`add_arguments`), the configuration they make
(:func:`config_for`, checked before any work), and the run from parsed arguments
(:func:`run_from_args`): :mod:`~gpugov.study.scoreboard.run` runs the scenarios,
:mod:`~gpugov.study.scoreboard.report` and :mod:`~gpugov.study.scoreboard.publish` write
the outputs, :mod:`~gpugov.study.scoreboard.disaggregated` the disaggregated layout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpugov.daemon import cli_types
from gpugov.daemon.cli_support import (
    add_engine_view_argument,
    add_safety_arguments,
    fail,
    load_trace_for_cli,
    warn,
    wrote,
)
from gpugov.daemon.errors import ExitCode, Terminated
from gpugov.daemon.limits import MAX_JOBS, MIN_PERIOD_S
from gpugov.daemon.simulated import ENGINE_VIEWS
from gpugov.plant.profile_files import list_bundled_profiles
from gpugov.plant.synthetic_profiles import expand_synthetic, resolve_profile
from gpugov.plant.workload import BUNDLED_TRACES, SHARED_TRACES, TraceError
from gpugov.study.outputs import check_replaceable, held_output_dir
from gpugov.study.runners import add_runner_arguments, check_runner, spec_from_args
from gpugov.study.scoreboard.publish import FILES as REPORT_FILES
from gpugov.study.scoreboard.publish import write_report
from gpugov.study.scoreboard.report import (
    failed_controller_lines,
    invalid_decision_lines,
    short_table,
    write_outputs,
)
from gpugov.study.scoreboard.run import run_scoreboard
from gpugov.study.scoreboard.scenarios import (
    DEFAULT_OUT,
    FULL,
    LABELS,
    LOADS,
    PROFILES,
    QUICK,
    ROOT,
    TINY,
    TRACES,
    WHOLE_TRACE,
    BenchConfig,
    _full_trace,
    keep_full_trace,
    layout_profiles,
)
from gpugov.study.scoreboard.windows import overlap_lines, window_lines, window_starts


def expand_profiles(names: Sequence[str]) -> list[str]:
    """``--profiles`` values with ``all`` replaced by every bundled profile (the zoo) and
    ``synthetic`` by every generated shape (``synthetic:SHAPE``)."""
    out: list[str] = []
    for name in names:
        expanded = (
            [row["name"] for row in list_bundled_profiles()]
            if name == "all"
            else expand_synthetic(name)
        )
        out += [n for n in expanded if n not in out]
    return out


def config_for(
    *,
    quick: bool = False,
    tiny: bool = False,
    traces: Sequence[str] | None = None,
    profiles: Sequence[str] | None = None,
    loads: Sequence[str] | None = None,
    duration_s: float | None = None,
    jobs: int | None = None,
    dwell_s: float | None = None,
    floor_mhz: float | None = None,
    windows: int | None = None,
    engine_view: str | None = None,
    outside_controllers: Sequence[str] | None = None,
    layout: str = "colocated",
) -> BenchConfig:
    """The full, ``--quick`` or hidden ``--tiny`` configuration with overrides.

    ``floor_mhz`` is checked against the top clock of every profile ``layout`` runs
    (:func:`layout_profiles`: the disaggregated board's own unless ``profiles`` names
    them).

    ``outside_controllers``: ``--controller`` specs of other packages' controllers, each
    scored as one more row; a built-in kind (already a row), a factory that does not load
    and a name given twice or taken by a row are refused.

    With ``windows`` above 1 the default traces leave out those used whole; a trace named
    in ``traces`` that is used whole, or too short for the windows, is refused.
    """
    config = TINY if tiny else QUICK if quick else FULL
    changes: dict[str, Any] = {}
    for flag, values in (("--traces", traces), ("--profiles", profiles), ("--loads", loads)):
        repeated = sorted(value for value, n in Counter(values or ()).items() if n > 1)
        if repeated:
            raise ValueError(f"{flag}: {', '.join(repeated)} given more than once")
    if traces:
        _refuse_one_file_twice(traces)
        changes["traces"] = tuple(traces)
    if profiles:
        try:
            profiles = expand_profiles(profiles)
            named: dict[str, str] = {}
            for name in profiles:
                # ProfileError (a ValueError) names a bad profile now.
                profile_name = resolve_profile(name).name
                earlier = named.setdefault(profile_name, name)
                if earlier != name:
                    # A scenario is keyed by its profile's name: the two ran as one key.
                    raise ValueError(
                        f"{earlier} and {name} are both the profile {profile_name!r} (a "
                        "scenario is keyed by its profile's name); give each profile once, "
                        "each under its own name"
                    )
        except ValueError as error:
            raise ValueError(f"--profiles: {str(error).removeprefix('--profiles: ')}") from None
        changes["profiles"] = tuple(profiles)
    if loads:
        unknown = sorted(set(loads) - set(LOADS))
        if unknown:
            raise ValueError(f"--loads: unknown load(s) {unknown}; choose from {list(LOADS)}")
        changes["loads"] = tuple(loads)
    if duration_s is not None:
        if not math.isfinite(duration_s) or duration_s < MIN_PERIOD_S:
            raise ValueError(f"--duration must be at least {MIN_PERIOD_S:g} s, got {duration_s!r}")
        changes["duration_s"] = float(duration_s)
    if jobs is not None:
        if jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {jobs}")
        changes["jobs"] = jobs
    if dwell_s is not None:
        if not math.isfinite(dwell_s) or dwell_s < 0.0:
            raise ValueError(f"--dwell must be finite and >= 0, got {dwell_s!r}")
        changes["dwell_s"] = float(dwell_s)
    if floor_mhz is not None:
        if not math.isfinite(floor_mhz) or floor_mhz <= 0.0:
            raise ValueError(f"--floor must be a positive clock, got {floor_mhz!r}")
        for name in layout_profiles(
            layout, changes.get("profiles", config.profiles), named=bool(profiles)
        ):
            top = resolve_profile(name).maximum_clock_mhz
            if floor_mhz > top:
                raise ValueError(
                    f"--floor {floor_mhz:g}: above the top supported clock of {name} ({top:g} MHz)"
                )
        changes["floor_mhz"] = float(floor_mhz)
    if outside_controllers:
        changes["outside_controllers"] = _outside_rows(outside_controllers)
    if engine_view is not None:
        if engine_view not in ENGINE_VIEWS:
            raise ValueError(
                f"--engine-view must be one of {', '.join(ENGINE_VIEWS)}, got {engine_view!r}"
            )
        changes["engine_view"] = engine_view
    for name in traces or ():
        if name not in BUNDLED_TRACES and name not in SHARED_TRACES:
            # A file the user named, read now, so a bad one is refused before any work
            # (a missing shared trace is skipped at its scenarios instead); a word that is
            # neither a name nor a file, the loader refuses naming the closest name. Read
            # after the other flags are checked: a large file takes a minute to read.
            try:  # its warnings (skipped rows) as one "gpugov: warning:" line each
                requests, report = load_trace_for_cli(name, keep_stamps_flag=None)
            except TraceError as error:
                raise ValueError(f"--traces: {error}") from error
            keep_full_trace(name, requests, report)  # read once, not again to run
    if windows is not None and windows != 1:
        if windows < 1:
            raise ValueError(f"--windows must be >= 1, got {windows}")
        changes["windows"] = windows
        if not traces:
            changes["traces"] = tuple(t for t in config.traces if t not in WHOLE_TRACE)
        config = replace(config, **changes)
        for trace in config.traces:
            try:
                requests, _ = _full_trace(trace) if trace not in WHOLE_TRACE else ((), "")
            except TraceError:
                continue  # skipped at run time, with its reason
            window_starts(trace, requests, config.duration_s, windows)
        return config
    return replace(config, **changes)


def _refuse_one_file_twice(traces: Sequence[str]) -> None:
    """Refuse two ``--traces`` that name one file (``t.csv`` and ``./t.csv``, a link to
    it): its scenarios ran twice, each counted in every mean over the scenarios."""
    files: dict[str, str] = {}
    for name in traces:
        if name in BUNDLED_TRACES or name in SHARED_TRACES or not os.path.exists(name):
            continue  # a name (its own scenarios), or a word the loader refuses later
        identity = os.path.realpath(name)
        earlier = files.setdefault(identity, name)
        if earlier != name:
            raise ValueError(
                f"--traces: {earlier} and {name} name the same file ({identity}); give it once"
            )


def _outside_rows(specs: Sequence[str]) -> tuple[str, ...]:
    """``--controller`` specs of outside controllers, each checked (its factory loaded)
    before any work; one line naming the spec otherwise."""
    from gpugov.daemon.cli_support import parse_controller_flag
    from gpugov.daemon.controller_config import ExternalControllerConfig
    from gpugov.daemon.controller_spec import shown_spec, spec_name

    names: list[str] = []
    for text in specs:
        config = parse_controller_flag(text)
        if not isinstance(config, ExternalControllerConfig):
            raise ValueError(
                f"--controller {shown_spec(text)!r}: {spec_name(config)} is built in (the "
                "board's own rows are fixed); name an outside controller (MODULE:FACTORY or an "
                "installed gpugov.controllers entry point)"
            )
        name = spec_name(config)
        if name in LABELS or name in names:
            raise ValueError(
                f"--controller {shown_spec(text)!r}: a row named {name!r} is there already"
            )
        names.append(name)
    return tuple(specs)


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scoreboard's command-line options (``gpugov bench controllers`` and
    ``python -m gpugov.study.scoreboard``)."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="bundled slice + Azure code, one profile, 120 s windows",
    )
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out",
        default=str(DEFAULT_OUT),
        metavar="DIR",
        help=f"output directory (default {_shown(DEFAULT_OUT)})",
    )
    parser.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="also write a citable benchmark report to DIR: README.md, report.md, "
        "report.json, pareto.csv and pareto.png (docs/benchmark.md)",
    )
    parser.add_argument(
        "--traces",
        nargs="+",
        metavar="NAME",
        default=None,
        help=f"trace names (default: {' '.join(TRACES)})",
    )
    parser.add_argument(
        "--profiles",
        nargs="+",
        metavar="NAME",
        default=None,
        help="bundled profile names or manifest paths, 'all' for the whole zoo, "
        "'synthetic:SHAPE' for a generated profile or 'synthetic' for every shape "
        f"(default: {' '.join(PROFILES)})",
    )
    parser.add_argument(
        "--loads",
        nargs="+",
        metavar="LOAD",
        default=None,
        help=f"loads among {' '.join(LOADS)} (default: both)",
    )
    parser.add_argument(
        "--duration",
        type=cli_types.scaled_duration,
        default=None,
        metavar="S",
        help="seconds of arrivals per scenario (default 600, quick 120)",
    )
    parser.add_argument(
        "--jobs",
        type=cli_types.count(1, MAX_JOBS),
        default=None,
        metavar="N",
        help="worker processes (default: one per CPU)",
    )
    parser.add_argument(
        "--windows",
        type=cli_types.count(1, 1000),
        default=None,
        metavar="N",
        help="N windows per trace: the scoreboard's and N-1 held-out starts, with a "
        "summary over the windows (traces used whole are left out)",
    )
    parser.add_argument(
        "--layout",
        choices=("colocated", "disaggregated", "both"),
        default="colocated",
        help="colocated scenarios (default), disaggregated prefill/decode scenarios "
        "(1P1D and 2P2D; default traces azure-conv and mooncake, profiles H100 and H200 "
        "with the 8B and 70B models; DIR/disaggregated.json and .md), or both",
    )
    parser.add_argument(
        "--controller",
        action="append",
        default=None,
        metavar="SPEC",
        help="also score another package's controller as a row (MODULE:FACTORY or an "
        "installed gpugov.controllers entry point's name; repeat for more; "
        "docs/benchmark.md)",
    )
    add_engine_view_argument(parser)
    add_safety_arguments(parser, prefix="every controller runs in the node's safety chain: ")
    add_runner_arguments(parser, jobs=False)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The configuration parsed arguments ask for (:func:`config_for`).

    Raises:
        ValueError: one line naming the flag that does not fit.
    """
    return config_for(
        quick=args.quick,
        tiny=args.tiny,
        traces=args.traces,
        profiles=args.profiles,
        loads=args.loads,
        duration_s=args.duration,
        jobs=args.jobs,
        dwell_s=args.dwell,
        floor_mhz=args.floor,
        windows=args.windows,
        engine_view=getattr(args, "engine_view", None),
        outside_controllers=_outside_for_layout(args),
        layout=getattr(args, "layout", "colocated"),
    )


def check_outside_rows(config: BenchConfig) -> None:
    """Build each outside controller once, for the first profile's clocks, as a scenario
    will: a factory that raises, returns no callable or ends its process is refused in one
    line before any work, not minutes into the run. It is built in a child process, as
    the scenarios build it (:func:`~gpugov.study.runners.run_isolated`): what its factory
    changes in its module's state is not there when they start."""
    from gpugov.daemon.cli_support import UsageError
    from gpugov.daemon.controller_spec import parse_controller_spec, shown_spec
    from gpugov.daemon.decide import ControllerContext, build_controller, close_controller
    from gpugov.daemon.errors import ControllerError
    from gpugov.study.runners import run_isolated

    if not config.outside_controllers:
        return
    clocks = tuple(float(c) for c in resolve_profile(config.profiles[0]).clock_mhz)
    context = ControllerContext(period_s=config.online_period_s, supported_clocks_mhz=clocks)

    def build_and_close(text: str) -> None:
        built = build_controller(parse_controller_spec(text), context)
        close_controller(built, f"--controller {shown_spec(text)}")

    for text in config.outside_controllers:
        try:
            run_isolated(
                functools.partial(build_and_close, text), f"controller {shown_spec(text)!r}"
            )
        except ControllerError as error:
            raise UsageError(f"--controller {shown_spec(text)}: {error}") from None


def _outside_for_layout(args: argparse.Namespace) -> list[str] | None:
    """``--controller`` specs, refused where the layout has no such rows; ``--report``
    and ``--windows``, which shape the colocated board alone, refused on the
    disaggregated board by itself (it would run on without them)."""
    layout = getattr(args, "layout", "colocated")
    specs = getattr(args, "controller", None)
    if specs and layout != "colocated":
        raise ValueError(
            "--controller: outside controllers are scored on the colocated board only "
            "(--layout colocated)"
        )
    if layout == "disaggregated":
        for flag, what in (
            ("report", "the benchmark report covers the colocated board"),
            ("windows", "held-out windows run on the colocated board"),
        ):
            if getattr(args, flag, None) is not None:
                raise ValueError(
                    f"--{flag}: {what} only; the disaggregated board writes "
                    "disaggregated.json and .md (--layout colocated or both)"
                )
    return specs


SCOREBOARD_FILES = ("scoreboard.json", "scoreboard.md", "scoreboard.png")
DISAGGREGATED_FILES = ("disaggregated.json", "disaggregated.md")


def check_outputs_not_inputs(args: argparse.Namespace, config: BenchConfig, layout: str) -> None:
    """Refuse an ``--out`` or ``--report`` where a file the run writes is a trace file or
    a profile's manifest or CSV the run reads (one line, before any work)."""
    from gpugov.daemon.cli_outputs import check_not_an_input
    from gpugov.plant.profile_files import profile_files

    inputs: list[tuple[str, str | Path]] = [
        (f"the trace {name!r}", name)
        for name in config.traces
        if name not in BUNDLED_TRACES and name not in SHARED_TRACES
    ]
    for name in config.profiles:
        inputs += [(f"a file of the profile {name!r}", path) for path in profile_files(name)]
    names: tuple[str, ...] = () if layout == "disaggregated" else SCOREBOARD_FILES
    names += () if layout == "colocated" else DISAGGREGATED_FILES
    outputs = [("--out", Path(args.out) / name) for name in names]
    report_dir = getattr(args, "report", None)
    if report_dir is not None:
        written = (*REPORT_FILES, "scoreboard.json")  # the report's copy of the board
        outputs += [("--report", Path(report_dir) / name) for name in written]
    for flag, path in outputs:
        check_not_an_input(flag, path, inputs)
        check_replaceable(flag, path.parent, path)


def run_from_args(args: argparse.Namespace, config: BenchConfig | None = None) -> int:
    """Run the scoreboard from parsed arguments (``config``: their configuration, already
    checked; else made here); print the summary and the paths. A failed run (no scenario
    could run, an error, Ctrl-C) removes the ``--out`` and ``--report`` directories it
    made while they are still empty."""
    from gpugov.daemon.cli_outputs import output_dirs_removed_on_failure

    with (
        output_dirs_removed_on_failure(args.out, getattr(args, "report", None)),
        contextlib.ExitStack() as holds,
    ):
        return _run_from_args(args, config, holds)


def _run_from_args(
    args: argparse.Namespace, config: BenchConfig | None, holds: contextlib.ExitStack
) -> int:
    """:func:`run_from_args`'s run; ``holds`` keeps ``--out`` and ``--report`` held
    (:func:`~gpugov.study.outputs.held_output_dir`) until it ends."""
    if config is None:
        config = config_from_args(args)
    from gpugov.daemon.cli_outputs import check_output_dir, prepare_output_dir
    from gpugov.daemon.cli_support import UsageError
    from gpugov.daemon.progress import Progress
    from gpugov.study.plots import pyplot

    layout = getattr(args, "layout", "colocated")
    check_outputs_not_inputs(args, config, layout)
    if layout == "disaggregated":
        from gpugov.study.scoreboard.disaggregated import run_disaggregated_from_args

        return run_disaggregated_from_args(args, config)
    pyplot()  # scoreboard.png needs the gpugov[plots] extra: say so before the run
    runner = replace(spec_from_args(args), jobs=config.jobs)
    check_runner(runner)  # --ray: Ray installed and the cluster there, before any work
    check_outside_rows(config)
    report_dir = getattr(args, "report", None)
    if report_dir is not None:
        check_output_dir("--report", report_dir)  # refused before --out is made
    prepare_output_dir("--out", args.out, parents=args.out == str(DEFAULT_OUT))
    if report_dir is not None:
        prepare_output_dir("--report", report_dir)
    # One run at a time writes DIR: a second one is refused here, before its scenarios.
    outputs = (*SCOREBOARD_FILES, *DISAGGREGATED_FILES)
    holds.enter_context(held_output_dir(Path(args.out), "--out", outputs))
    if report_dir is not None:
        report_outputs = (*REPORT_FILES, "scoreboard.json")
        holds.enter_context(held_output_dir(Path(report_dir), "--report", report_outputs))
    scenarios = config.scenario_count()
    # The total is the scenarios' real simulated seconds (run_scoreboard's on_progress):
    # known once their traces are loaded, and each scenario's exactly once it is built.
    bar = Progress(0.0, "bench controllers", unit="simulated s")
    simulated, finished, started = 0.0, 0, False

    def progress(line: str) -> None:  # what the run does, a scenario done, a lost worker
        nonlocal finished, started
        started = True
        if line.startswith("["):  # "[n/N] KEY (wall s)": the bar counts the scenarios
            finished += 1
            line = line.partition("] ")[2]
        bar.update(simulated, f"{finished}/{scenarios} scenarios, {line}", force=True)

    def on_progress(done: float, total: float) -> None:  # simulated seconds, while they run
        nonlocal simulated
        simulated, bar.total = done, total
        if started:  # the first line is the run's own (what it runs)
            bar.update(simulated, f"{finished}/{scenarios} scenarios")

    payload = run_scoreboard(config, progress=progress, runner=runner, on_progress=on_progress)
    bar.close(f"{finished}/{scenarios} scenarios")
    if not payload["scenarios"]:
        reasons = "; ".join(sorted({s["reason"] for s in payload["skipped"]}))
        raise UsageError(f"no scenario could run: {reasons}")
    paths = write_outputs(payload, Path(args.out))
    print(short_table(payload))
    if payload.get("window_summary"):
        print("\n".join(window_lines(payload["window_summary"])))
    for line in overlap_lines(payload.get("window_overlaps", ())):
        warn(f"--windows: not held out: {line}; lower --windows or --duration")
    for path in paths.values():
        wrote(path)
    if report_dir is not None:
        written, note = write_report(payload, Path(report_dir))
        if note is not None:
            print(note)
        wrote(f"the benchmark report to {report_dir} ({', '.join(written)})")
    if layout == "both":
        from gpugov.study.scoreboard.disaggregated import run_disaggregated_from_args

        return run_disaggregated_from_args(args, config)
    for line in invalid_decision_lines(payload["rows"]):
        warn(line)
    failed = failed_controller_lines(payload.get("failed_rows", ()))
    for line in failed:  # the other rows are on the board; the run still failed
        fail(f"--controller {line}; left out of the board")
    return ExitCode.FAILURE if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m gpugov.study.scoreboard``."""
    from gpugov.daemon.cli_support import UsageError, fail
    from gpugov.daemon.log_lines import escape_unconfigured_logs

    escape_unconfigured_logs()  # a logged warning is a `gpugov: warning:` line, as in gpugov

    parser = argparse.ArgumentParser(
        prog="python -m gpugov.study.scoreboard",
        description="The controller scoreboard (what gpugov bench controllers runs).",
    )
    add_arguments(parser)
    try:
        return run_from_args(parser.parse_args(argv))
    except (UsageError, ValueError) as error:
        return fail(str(error))
    except KeyboardInterrupt as stop:
        if Terminated.caused(stop):
            print(Terminated.line(), file=sys.stderr)
            return ExitCode.TERMINATED
        print("gpugov: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


__all__ = [
    "add_arguments",
    "config_for",
    "config_from_args",
    "expand_profiles",
    "main",
    "run_from_args",
]
