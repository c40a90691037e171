"""Every flag and argument of every command has help text, one name per concept, and the
synopses of docs/commands.md list them."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

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


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _documented_usage(page: str) -> dict[str, str]:
    """The synopsis lines of a page's code blocks, by command (``model show``,
    ``bench controllers``): each ``gpugov CMD ...`` line with its indented continuations
    (a command given twice, ``actuator --probe``, is joined)."""
    usage: dict[str, str] = {}
    # Each fenced block from its opening fence (a language named or not) to its closing
    # one: a closing fence is never taken for an opening one.
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", (DOCS / page).read_text(), re.S | re.M):
        command = None
        for line in block.splitlines():
            match = re.match(r"gpugov ([a-z-]+(?: (?:show|export|controllers))?)\b", line)
            if match:
                command = match.group(1)
                usage[command] = usage.get(command, "") + " " + line
            elif command and line.startswith(" "):
                usage[command] += " " + line
            else:
                command = None
    return usage


def _flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


def test_commands_md_synopses_list_each_commands_flags_and_only_those() -> None:
    """docs/commands.md's synopsis of every command names each flag ``--help`` lists, and
    no flag the command does not take (a hidden, deprecated alias is never documented);
    where a flag has choices, the synopsis spells the same ones. daemon.md's shorter
    synopses name only flags that exist."""
    usage = _documented_usage("commands.md")
    problems = []
    for path, parser in _parsers(build_parser()):
        command = path.removeprefix("gpugov ")
        if command == "gpugov" or any(
            isinstance(a, argparse._SubParsersAction) for a in parser._actions
        ):
            continue
        shown = {
            option: action
            for action in parser._actions
            if action.help != argparse.SUPPRESS
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        }
        if command not in usage:
            problems.append(f"{command}: no synopsis in docs/commands.md")
            continue
        documented = _flags(usage[command])
        problems += [
            f"{command}: {flag} is not in the synopsis" for flag in shown.keys() - documented
        ]
        problems += [f"{command}: {flag} is no flag of it" for flag in documented - shown.keys()]
        for flag, action in shown.items():
            if action.choices is None:
                continue
            spelled = re.search(re.escape(flag) + r" ([\w-]+(?:\|[\w-]+)+)", usage[command])
            if spelled and set(spelled.group(1).split("|")) != set(map(str, action.choices)):
                problems.append(f"{command}: {flag} {spelled.group(1)}, not {action.choices}")
    parsers = dict(_parsers(build_parser()))
    for command, text in _documented_usage("daemon.md").items():
        parser = parsers[f"gpugov {command}"]
        known = {o for action in parser._actions for o in action.option_strings}
        problems += [f"daemon.md: {command}: {f} is no flag of it" for f in _flags(text) - known]
    assert not problems, problems


def test_run_help_states_every_exit_code_of_the_daemon_table() -> None:
    """``gpugov run --help`` lists the exit codes docs/daemon.md's table gives the daemon:
    each ``ExitCode`` but 143, which only the long offline commands return."""
    from gpugov.daemon.errors import ExitCode

    run = dict(_parsers(build_parser()))["gpugov run"]
    description = " ".join((run.description or "").split())
    stated = {int(code) for code in re.findall(r"\b(\d+) [A-Za-z]", description)}
    assert stated == {int(code) for code in ExitCode} - {ExitCode.TERMINATED}


def test_daemon_md_full_synopses_list_each_commands_flags() -> None:
    """daemon.md's synopses that do not end in ``...`` (``emulate`` and ``load`` point to
    commands.md for the rest) name every flag ``--help`` lists, as commands.md's do."""
    parsers = dict(_parsers(build_parser()))
    problems = []
    for command, text in _documented_usage("daemon.md").items():
        if text.rstrip().endswith("..."):
            continue
        shown = {
            option
            for action in parsers[f"gpugov {command}"]._actions
            if action.help != argparse.SUPPRESS
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        }
        problems += [f"{command}: {flag}" for flag in sorted(shown - _flags(text))]
    assert problems == []
