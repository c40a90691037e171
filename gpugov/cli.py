"""The ``gpugov`` console script: one parser; each subcommand's module loads only when named.

``COMMANDS`` maps every subcommand to the module that registers it (``register(subparsers)``)
and a one-line help. ``gpugov --help`` lists the table without importing any command module;
``gpugov NAME ...`` imports only NAME's module, so a node command never loads the study code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpugov import __version__

NODE = "gpugov.daemon.node_cli"
SIMULATE = "gpugov.study.simulate_cli"
EXPERIMENTS = "gpugov.study.experiments_cli"
SCOREBOARD = "gpugov.study.scoreboard_cli"
MODEL = "gpugov.daemon.model_cli"

#: Subcommand -> (module that registers it, one-line help for ``gpugov --help``).
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (NODE, "run the governor (a node from --config, or the simulated plant)"),
    "check-config": (NODE, "validate a config file; apply nothing"),
    "status": (NODE, "show GPUs, clocks, power, permissions and engine reachability"),
    "reset-clocks": (NODE, "unlock the GPUs' SM clocks (the unit's ExecStopPost=)"),
    "replay": (NODE, "run a recording through another controller and compare decisions"),
    "model": (MODEL, "show or export the model the mpc-online controller learned"),
    "simulate": (SIMULATE, "run a controller on the simulated plant and print its metrics"),
    "profiles": (SIMULATE, "list the bundled GPU profiles"),
    "experiments": (EXPERIMENTS, "run the textbook study (open-loop vs MPC, DP vs FQI)"),
    "bench": (SCOREBOARD, "benchmarks: the controller scoreboard"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``gpugov`` parser; with ``command``, only that command's module is imported.

    Without ``command`` every command module registers itself (the full parser, for tests
    and documentation); the commands not loaded appear in ``--help`` from ``COMMANDS``.
    """
    parser = argparse.ArgumentParser(
        prog="gpugov",
        description="Serving-aware GPU clock governor and its simulated serving plant.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gpugov {__version__}",
        help="print the version and exit",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    if command == "":
        modules: list[str] = []
    elif command in COMMANDS:
        modules = [COMMANDS[command][0]]
    else:
        modules = list(dict.fromkeys(module for module, _ in COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).register(subparsers)
    for name, (_, help_text) in COMMANDS.items():
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def _command_in(argv: Sequence[str]) -> str:
    """The subcommand named in ``argv`` (its first non-option word), or ``""`` for none."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else "?"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    parser = build_parser(None if command == "?" else command)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except Exception as error:  # the outermost edge: input errors become one clear line
        from gpugov.daemon import cli_support

        if isinstance(error, cli_support.INPUT_ERRORS):
            return cli_support.fail(str(error))
        raise


if __name__ == "__main__":
    sys.exit(main())
