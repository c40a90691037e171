"""``gpugov bench controllers``: the controller scoreboard from the command line.

Runs the same code as ``python bench/controllers.py`` (see ``docs/scoreboard.md``):
every controller and hindsight oracle on trace windows x bundled profiles x loads,
written to ``DIR/scoreboard.json``, ``DIR/scoreboard.md`` and ``DIR/scoreboard.png``
(default ``bench/results/controllers/``), with a short summary on stdout and progress
lines on stderr.

``bench/`` is not an installed package: the scoreboard is found in the source checkout
this module lives in (the repository root is put on ``sys.path`` when ``bench`` is not
importable, so the scoreboard's worker processes can import it too).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from daemon.sim_cli import UsageError

ROOT = Path(__file__).resolve().parents[1]
SCOREBOARD = ROOT / "bench" / "controllers.py"


def scoreboard_module() -> ModuleType | None:
    """``bench.controllers``, or ``None`` outside a source checkout."""
    if not SCOREBOARD.is_file():
        return None
    try:
        return importlib.import_module("bench.controllers")
    except ModuleNotFoundError as error:
        if error.name not in ("bench", "bench.controllers"):
            raise
    sys.path.insert(0, str(ROOT))
    importlib.invalidate_caches()
    return importlib.import_module("bench.controllers")


def _missing(args: argparse.Namespace) -> int:
    raise UsageError(
        f"bench controllers: {SCOREBOARD} not found; run gpugov from a source checkout"
    )


def run_controllers(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov bench controllers``."""
    module = scoreboard_module()
    if module is None:
        return _missing(args)
    try:
        module.config_for(
            quick=args.quick,
            tiny=args.tiny,
            traces=args.traces,
            profiles=args.profiles,
            loads=args.loads,
            duration_s=args.duration,
            jobs=args.jobs,
        )
    except ValueError as error:
        raise UsageError(str(error)) from error
    return int(module.run_from_args(args))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``bench controllers`` to the ``gpugov`` parser."""
    bench = subparsers.add_parser(
        "bench",
        help="benchmarks: the controller scoreboard",
        description="Benchmarks run from the source checkout.",
    )
    inner = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    inner.required = True
    parser = inner.add_parser(
        "controllers",
        help="score every controller and oracle on real traces, profiles and loads",
        description=(
            "Run the maximum clock, best fixed clock in hindsight, reactive governor, "
            "open-loop plan, MPC (SLSQP), MPC (fast) and the window oracle on every "
            "scenario, with the fluid LP bound, and write DIR/scoreboard.json, "
            "DIR/scoreboard.md and DIR/scoreboard.png."
        ),
    )
    module = scoreboard_module()
    if module is None:
        parser.set_defaults(handler=_missing)
        return
    module.add_arguments(parser)
    parser.set_defaults(handler=run_controllers)


__all__ = ["register", "run_controllers", "scoreboard_module"]
