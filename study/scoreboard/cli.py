"""``gpugov bench controllers``: the controller scoreboard from the command line.

Runs :mod:`gpugov.study.scoreboard.command` (also ``python -m gpugov.study.scoreboard``; see
``docs/scoreboard.md``): every controller and hindsight oracle on trace windows x bundled
profiles x loads, written to ``DIR/scoreboard.json``, ``DIR/scoreboard.md`` and
``DIR/scoreboard.png`` (default ``bench/results/controllers/`` in a source checkout,
``gpugov-scoreboard/`` otherwise), with a short summary on stdout and progress lines on
stderr; ``--report DIR`` adds the citable benchmark report
(:mod:`gpugov.study.scoreboard.publish`). ``bench`` installs with the package, so this
works from a wheel as well.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from gpugov.daemon.cli_support import UsageError, require_extra


def scoreboard_module() -> ModuleType:
    """``gpugov.study.scoreboard.command`` (imported on first use: it is heavy)."""
    return importlib.import_module("gpugov.study.scoreboard.command")


def run_controllers(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov bench controllers``."""
    require_extra("matplotlib", "gpugov bench controllers (scoreboard.png)")
    module = scoreboard_module()
    try:
        config = module.config_from_args(args)  # every flag checked before any work
    except ValueError as error:
        raise UsageError(str(error)) from error
    return int(module.run_from_args(args, config))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``bench controllers`` to the ``gpugov`` parser."""
    bench = subparsers.add_parser(
        "bench",
        help="benchmarks: the controller scoreboard",
        description="Benchmarks of the installed package.",
    )
    inner = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    inner.required = True
    parser = inner.add_parser(
        "controllers",
        help="score every controller and oracle on real traces, profiles and loads",
        description=(
            "Run the maximum clock, best fixed clock in hindsight, reactive governor, "
            "open-loop plan, MPC (SLSQP), MPC (fast), the self-calibrating MPC "
            "(mpc-online), the peer governors (power caps, power profile, default DVFS, "
            "AGFT, PID, throttLL'eM, GreenLLM) and the window oracle on every scenario, "
            "with the fluid LP bound, and write DIR/scoreboard.json, "
            "DIR/scoreboard.md and DIR/scoreboard.png; with --report DIR2, also a "
            "self-contained benchmark report (README.md, report.md, report.json, "
            "pareto.csv, pareto.png) in DIR2."
        ),
    )
    scoreboard_module().add_arguments(parser)
    parser.set_defaults(handler=run_controllers)


__all__ = ["register", "run_controllers", "scoreboard_module"]
