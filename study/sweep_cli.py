"""``gpugov sweep``: run a grid of simulate cells on the local pool or on Ray (light to
import: the sweep itself loads only when the command runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpugov.study.runners import add_runner_arguments, spec_from_args


def run_sweep_command(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov sweep``: 0 when every cell ran, 1 when some failed."""
    from gpugov.daemon.cli_support import wrote
    from gpugov.daemon.errors import printable
    from gpugov.study.sweep import run_sweep
    from gpugov.study.sweep_results import format_table

    outcome = run_sweep(
        Path(args.grid), Path(args.out), spec=spec_from_args(args), resume=args.resume
    )
    print(format_table(outcome["table"]))
    print(
        f"{outcome['cells']} cells: {outcome['ran']} ran now, {outcome['skipped_done']} done "
        f"before, {outcome['failed']} failed"
    )
    for path in outcome["paths"].values():
        wrote(path)
    if outcome["failed"]:
        print(
            printable(
                f"gpugov: {outcome['failed']} cell(s) failed (see 'error' in {args.out}/"
                "results.jsonl); --resume runs them again"
            ),
            file=sys.stderr,
        )
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``sweep`` to the ``gpugov`` parser."""
    parser = subparsers.add_parser(
        "sweep",
        help="run a grid of traces x profiles x loads x controllers x seeds (local or Ray)",
        description=(
            "Run every cell of a TOML grid as a `gpugov simulate` run; append each cell's "
            "metrics to DIR/results.jsonl as it finishes, then write DIR/summary.md, "
            "DIR/summary.json and DIR/sweep.png. See docs/sweep.md for the grid's keys."
        ),
    )
    parser.add_argument(
        "--grid",
        required=True,
        metavar="FILE.toml",
        help="the grid: traces, profiles, loads, controllers, seeds, settings",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory (results.jsonl, summary, plot)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the sweep in DIR: run only the cells not yet done",
    )
    add_runner_arguments(parser)
    parser.set_defaults(handler=run_sweep_command)


__all__ = ["register", "run_sweep_command"]
