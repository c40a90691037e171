"""``gpugov fleet``: a simulated fleet of gpugov nodes under a power budget (light to
import: the fleet itself loads only when the command runs)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from gpugov.daemon import cli_types
from gpugov.daemon.cli_support import add_decision_arguments, add_engine_view_argument
from gpugov.daemon.limits import MAX_SEED
from gpugov.study.runners import add_runner_arguments, check_runner, spec_from_args

MAX_NODES = 10_000
"""The most nodes one run simulates (``--nodes``)."""
DEFAULT_OUT = "gpugov-fleet"
ALLOCATOR_NAMES = ("uniform", "dps", "slo")
ROUTER_NAMES = ("round-robin", "least-tokens", "least-work")


def _items(text: str, what: str, *, repeats: bool = False) -> tuple[str, ...]:
    """The items of a comma-separated list: at least one, none empty (``a,,b`` and a
    trailing comma are typing slips), none twice unless ``repeats``."""
    items = tuple(part.strip() for part in text.split(","))
    if not any(items):
        raise argparse.ArgumentTypeError(f"needs at least one {what}")
    if not all(items):
        raise argparse.ArgumentTypeError(f"an empty {what} in {text!r}")
    if not repeats:
        twice = sorted({item for item in items if items.count(item) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"{what} {twice[0]!r} given more than once")
    return items


def _names(choices: tuple[str, ...], what: str) -> object:
    """A converter for a comma-separated list of ``choices``."""

    def convert(text: str) -> tuple[str, ...]:
        names = _items(text, what)
        for name in names:
            if name not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown {what} {name!r} (one of {', '.join(choices)})"
                )
        return names

    return convert


def _profiles(text: str) -> tuple[str, ...]:
    """A comma-separated list of profile names or paths (each checked when the run starts);
    one named twice gets twice the nodes."""
    return _items(text, "profile", repeats=True)


_fraction_of_tdp = cli_types.float_in(0.0, 1.0, low_open=True, name="fraction of TDP")


def _budgets(text: str) -> tuple[float, ...]:
    """A comma-separated list of budgets, each a fraction of the summed TDP in (0, 1], no
    two alike at the two decimals a run is named by (``slo@0.70``: one name, one run)."""
    parts = _items(text, "budget")
    budgets = tuple(_fraction_of_tdp(part) for part in parts)
    if len(set(budgets)) < len(budgets):
        raise argparse.ArgumentTypeError(f"a budget given more than once in {text!r}")
    named: dict[str, str] = {}
    for part, budget in zip(parts, budgets, strict=True):
        name = f"{budget:.2f}"  # as Cell.key names it
        if name in named:
            raise argparse.ArgumentTypeError(
                f"budgets {named[name]!r} and {part!r} are one budget ({name}) at the two "
                "decimals a run is named by; give budgets that differ there"
            )
        named[name] = part
    return budgets


def run_fleet_command(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov fleet``: validate everything, run the cells, write the
    report; 0 on success. ``--out`` is held from before the cells run to the end
    (:func:`~gpugov.study.outputs.held_output_dir`)."""
    with contextlib.ExitStack() as holds:
        return _run_fleet_command(args, holds)


def _run_fleet_command(args: argparse.Namespace, holds: contextlib.ExitStack) -> int:
    """:func:`run_fleet_command`'s run; ``holds`` keeps ``--out`` held until it ends."""
    import sys

    from gpugov.daemon.cli_outputs import (
        check_not_an_input,
        check_output_dir,
        prepare_output_dir,
        simulated_run_inputs,
    )
    from gpugov.daemon.cli_support import (
        UsageError,
        check_slo_target_period,
        control_period_of,
        note,
        warn,
        wrote,
    )
    from gpugov.daemon.errors import printable
    from gpugov.daemon.progress import Progress
    from gpugov.study.fleet.report import OUTPUT_NAMES, short_table, write_outputs
    from gpugov.study.fleet.run import (
        DEFAULT_PROFILES,
        FleetConfig,
        cells_for,
        check_inputs,
        run_fleet,
    )
    from gpugov.study.outputs import check_replaceable, held_output_dir
    from gpugov.study.scoreboard.scenarios import trace_warnings

    given = [
        flag
        for dest, (flag, default) in getattr(args, "step_only", {}).items()
        if args.no_step and getattr(args, dest, default) != default
    ]
    if given:
        raise UsageError(f"{', '.join(given)}: not with --no-step (it runs no budget-step cells)")
    control_period = control_period_of(args.control_period, args.controller)
    check_slo_target_period(args.slo_target, control_period)
    config = FleetConfig(
        nodes=args.nodes,
        profiles=args.profiles or DEFAULT_PROFILES,
        controller=args.controller,
        router=args.router,
        trace=args.trace,
        trace_start_s=args.trace_start,
        duration_s=args.duration,
        drain_s=args.drain,
        utilization=args.utilization,
        budgets=args.budgets,
        allocators=args.allocators,
        allocator_period_s=args.allocator_period,
        control_period_s=control_period,
        slo_target=args.slo_target,
        dwell_s=args.dwell,
        floor_fraction=args.floor,
        guard_fraction=args.guard,
        step=not args.no_step,
        step_budget=args.step_budget,
        step_at_s=args.step_at,
        step_depth=args.step_depth,
        step_ramp_s=args.step_ramp,
        step_hold_s=args.step_hold,
        seed=args.seed,
        latency_noise=args.latency_noise,
        engine_view=args.engine_view,
    )
    try:
        config.validate()
    except ValueError as error:
        raise UsageError(str(error)) from error
    runner = spec_from_args(args)
    check_runner(runner)  # --ray: Ray installed and the cluster there, before any work
    check_output_dir("--out", args.out, parents=args.out == DEFAULT_OUT)
    for line in check_inputs(config, quiet=args.quiet) or ():
        warn(line)
    for line in trace_warnings(config.trace):  # as a replay says them (`simulate`, `load`)
        warn(line)
    inputs = [
        item
        for profile in config.profiles
        for item in simulated_run_inputs(config.trace, profile, config.controller)
    ]
    for name in OUTPUT_NAMES:  # fleet.json, fleet.md, fleet.png: none of them an input
        check_not_an_input("--out", Path(args.out) / name, inputs)
        check_replaceable("--out", Path(args.out), Path(args.out) / name)
    prepare_output_dir("--out", args.out, parents=args.out == DEFAULT_OUT)
    # One run at a time writes DIR: a second one is refused here, before its cells.
    holds.enter_context(held_output_dir(Path(args.out), "--out", OUTPUT_NAMES))
    cells = cells_for(config)
    total = len(cells) * config.nodes * config.ticks * config.control_period_s
    bar = Progress(total, "fleet", unit="node-s", enabled=not args.quiet)
    done, finished = 0.0, 0
    bar.update(0.0, f"{len(cells)} cells of {config.nodes} nodes", force=True)

    def on_progress(node_s: float) -> None:  # every control period of the running cells
        nonlocal done
        done = node_s
        bar.update(done, f"{finished}/{len(cells)} cells")

    def on_cell(row: dict[str, object], count: int, cells_in_all: int) -> None:
        nonlocal finished
        finished = count
        bar.update(done, f"{finished}/{cells_in_all} cells, last {row['key']}", force=True)

    def on_event(line: str) -> None:
        print(f"gpugov: {printable(line)}", file=sys.stderr)

    payload = run_fleet(
        config, spec=runner, on_cell=on_cell, on_event=on_event, on_progress=on_progress
    )
    bar.close()
    paths, written_note = write_outputs(payload, Path(args.out))
    print(short_table(payload))
    if written_note is not None:
        note(written_note)
    for path in paths.values():
        wrote(path)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fleet`` to the ``gpugov`` parser."""
    parser = subparsers.add_parser(
        "fleet",
        help="simulate a fleet of nodes under a power budget: allocators, budgets, a grid step",
        description=(
            "Simulate N nodes (each a plant with its own profile and controller, built as a "
            "node builds it) behind a router, fed by a trace scaled to the fleet, while a "
            "budget allocator splits a watt budget into per-node caps every 15 s. Compares "
            "uniform caps, DPS-style steering and SLO-aware allocation at 60/70/80% of the "
            "summed TDP, and a -30% budget step; writes DIR/fleet.json, DIR/fleet.md and "
            "DIR/fleet.png. See docs/fleet.md."
        ),
    )
    add = parser.add_argument
    add("--nodes", type=cli_types.count(1, MAX_NODES), default=4, metavar="N",
        help="nodes in the fleet (default 4)")  # fmt: skip
    add("--profiles", type=_profiles, default=None, metavar="P1,P2,...",
        help="profiles of the nodes, in turn (default: h100-sxm, h200-sxm and a100-sxm-80gb "
        "serving llama3-8b)")  # fmt: skip
    add("--controller", default="mpc", metavar="SPEC",
        help="every node's controller, a 'gpugov simulate' --controller (default mpc)")  # fmt: skip
    add("--router", choices=ROUTER_NAMES, default="least-tokens",
        help="round-robin, least outstanding tokens (default), or least outstanding "
             "work (tokens over each node's speed)")  # fmt: skip
    add("--trace", default="azure-conv", metavar="NAME|FILE",
        help="the trace (default azure-conv: the Azure conversation trace)")  # fmt: skip
    add("--trace-start", type=cli_types.offset, default=1800.0, metavar="S",
        help="where in the trace the window starts (default 1800 s)")  # fmt: skip
    add("--duration", type=cli_types.scaled_duration, default=720.0, metavar="S",
        help="plant seconds of arrivals (default 720)")  # fmt: skip
    add("--drain", type=cli_types.offset, default=60.0, metavar="S",
        help="plant seconds after the last arrival window (default 60)")  # fmt: skip
    add("--utilization", type=cli_types.float_in(0.0, 2.0, low_open=True, name="fraction"),
        default=0.6, metavar="F",
        help="load, a fraction of the fleet capacity at the top clock (default 0.6)")  # fmt: skip
    add("--budgets", type=_budgets, default=(0.6, 0.7, 0.8), metavar="F1,F2,...",
        help="budgets as fractions of the summed TDP (default 0.6,0.7,0.8)")  # fmt: skip
    add("--allocators", type=_names(ALLOCATOR_NAMES, "allocator"), default=ALLOCATOR_NAMES,
        metavar="A1,A2,...", help="allocators to compare (default uniform,dps,slo)")  # fmt: skip
    add("--allocator-period", type=cli_types.period, default=15.0, metavar="S",
        help="seconds between allocations (default 15)")  # fmt: skip
    add("--dwell", type=cli_types.dwell, default=0.5, metavar="S",
        help="every node's safety-chain dwell (default 0.5)")  # fmt: skip
    add("--floor", type=cli_types.float_in(0.0, 1.0, low_open=True, name="fraction of TDP"),
        default=0.3, metavar="F",
        help="the lowest cap a node takes, as a fraction of its TDP (default 0.3)")  # fmt: skip
    add("--guard", type=cli_types.fraction, default=0.02, metavar="F",
        help="budget fraction kept back for the firmware's dither (default 0.02)")  # fmt: skip
    add("--no-step", action="store_true", help="skip the budget-step cells")
    add("--step-budget", type=_fraction_of_tdp, default=0.8, metavar="F",
        help="the budget the step starts from (default 0.8 of the summed TDP)")  # fmt: skip
    add("--step-at", type=cli_types.offset, default=60.0, metavar="S",
        help="plant time of the grid signal (default 60)")  # fmt: skip
    add("--step-depth", type=cli_types.fraction, default=0.3, metavar="F",
        help="the cut, as a fraction of the budget (default 0.3)")  # fmt: skip
    add("--step-ramp", type=cli_types.offset, default=30.0, metavar="S",
        help="seconds over which the budget falls (default 30)")  # fmt: skip
    add("--step-hold", type=cli_types.duration, default=600.0, metavar="S",
        help="seconds the cut holds (default 600)")  # fmt: skip
    add("--seed", type=cli_types.int_in(0, MAX_SEED), default=0, metavar="N",
        help="seed of the nodes' jitter (node i gets N + i; with --latency-noise)")  # fmt: skip
    add("--latency-noise", type=cli_types.latency_noise, default=0.0, metavar="CV",
        help="coefficient of variation of every node's iteration-time jitter (default 0: "
             "none, and the run is the same for every --seed)")  # fmt: skip
    add_decision_arguments(parser, prefix="every node's controller: ")
    add_engine_view_argument(parser, prefix="every node's controller: ")
    add("--out", default=DEFAULT_OUT, metavar="DIR",
        help=f"output directory (default ./{DEFAULT_OUT})")  # fmt: skip
    add("--quiet", action="store_true", help="no progress line")
    add_runner_arguments(parser, jobs_help="local worker processes (default: one per CPU)")
    # The budget step's flags, with their defaults: --no-step refuses one given another
    # value (it ignored them).
    step_only = {
        action.dest: (action.option_strings[0], action.default)
        for action in parser._actions
        if action.dest.startswith("step_")
    }
    parser.set_defaults(handler=run_fleet_command, step_only=step_only)


__all__ = ["register", "run_fleet_command"]
