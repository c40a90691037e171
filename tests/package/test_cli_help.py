"""Every flag and argument of every command has help text, and one name per concept."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from gpugov.cli import COMMANDS, build_parser


def _parsers(
    parser: argparse.ArgumentParser, path: str = "gpugov"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_action_of_every_command_has_help() -> None:
    missing = []
    commands = set()
    for path, parser in _parsers(build_parser()):
        commands.add(path)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if action.help == argparse.SUPPRESS:
                continue  # deprecated aliases and test-only flags, hidden on purpose
            if not (action.help or "").strip():
                missing.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing
    assert {f"gpugov {name}" for name in COMMANDS} <= commands


def test_one_flag_name_per_concept() -> None:
    retired = {"--period": "--control-period", "--window": "--duration"}
    for path, parser in _parsers(build_parser()):
        shown = {
            option
            for action in parser._actions
            if action.help != argparse.SUPPRESS
            for option in action.option_strings
        }
        for old, new in retired.items():
            assert old not in shown, f"{path} lists {old}; the flag is {new}"


def test_old_flag_names_still_parse_as_hidden_aliases() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--simulate", "--period", "0.5"])
    assert args.control_period == 0.5
    args = parser.parse_args(["experiments", "--out", "x", "--window", "120"])
    assert args.duration == 120.0
    assert parser.parse_args(["experiments", "--out", "x"]).duration == 300.0


def test_help_pages_print_no_format_escapes() -> None:
    """argparse %-formats help strings but not descriptions or epilogs: a ``%%`` written
    there prints as is (``60/70/80%%`` in ``gpugov fleet --help``)."""
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        assert "%%" not in text, f"{path} --help prints '%%'"
        assert "%(" not in text, f"{path} --help prints an unexpanded %(...)s"
