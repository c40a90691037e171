"""The ``gpugov`` console script: one parser, subcommands registered by their modules."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpugov import __version__
from gpugov.daemon import cli_support, node_cli
from gpugov.study import experiments_cli, scoreboard_cli, simulate_cli

# Modules that add subcommands; each exposes ``register(subparsers)``.
COMMAND_MODULES = (simulate_cli, node_cli, experiments_cli, scoreboard_cli)


def build_parser() -> argparse.ArgumentParser:
    """The full ``gpugov`` argument parser."""
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
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except cli_support.INPUT_ERRORS as error:
        return cli_support.fail(str(error))


if __name__ == "__main__":
    sys.exit(main())
