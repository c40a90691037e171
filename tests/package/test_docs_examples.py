"""The docs a user copies from work as written: every relative link and ``#anchor`` between
the pages resolves, every ``gpugov`` example command line parses with the real parser, and
an example's relative output directory has its parent made first (no command creates a
missing parent)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugov.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    REPO / "deploy" / "README.md",
    REPO / "profiles" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _ids(pages: list[Path]) -> list[str]:
    return [str(page.relative_to(REPO)) for page in pages]


def _anchors(page: Path) -> set[str]:
    """The ``#anchor`` names a page's headings get (GitHub's rule: lower case, punctuation
    but ``-`` and ``_`` dropped, spaces as ``-``, a repeated heading numbered)."""
    text = CODE_BLOCK.sub("", page.read_text())
    anchors: set[str] = set(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    text = CODE_BLOCK.sub("", page.read_text())
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading gives #{anchor}")
    assert not broken, broken


def _examples(page: Path) -> Iterator[tuple[str, str]]:
    """Each code block's ``gpugov`` example command lines (continuations joined), with the
    block they are in; synopses (``[--flag]``, ``a|b``) and placeholders (``FILE``) are
    left out: they are checked against ``--help`` in test_cli_help.py."""
    for block in CODE_BLOCK.findall(page.read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            match = re.match(r"(?:\$ |sudo )?(?:\S*/)?gpugov (.*)$", line)
            if not match:
                continue
            command = re.split(r"\s(?:#|\||&&|&|;|>|2>)(?:\s|$)", match.group(1) + " ")[0]
            if "[" in command or "|" in command or re.search(r"\b[A-Z]{2,}\b", command):
                continue
            yield command.strip(), joined


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_example_command_lines_parse(page: Path) -> None:
    refused = []
    for command, _ in _examples(page):
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(shlex.split(command))
        except SystemExit as stop:
            if stop.code:
                refused.append(f"gpugov {command}: {stderr.getvalue().strip()}")
    assert not refused, refused


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_example_output_directories_have_their_parent_made(page: Path) -> None:
    """``--out runs/a`` is refused where ``runs/`` does not exist, so an example that
    writes under a relative folder makes it first (``mkdir -p runs``) in its block."""
    missing = []
    for command, block in _examples(page):
        for out in re.findall(r"--out[ =](\S+)", command):
            parent = Path(out).parent
            if out.startswith(("/", "~")) or parent == Path("."):
                continue
            if not re.search(r"mkdir -p [^\n]*\b" + re.escape(str(parent)) + r"\b", block):
                missing.append(f"gpugov {command}: {parent}/ is not made before it")
    assert not missing, missing


def test_input_rules_table_gives_each_file_kind_its_caps() -> None:
    """docs/commands.md's table of input file caps has one row per kind the bounded
    reader knows (``FILE_LIMITS``), with that kind's size and line caps."""
    from gpugov.plant.input_files import FILE_LIMITS

    units = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
    text = (REPO / "docs" / "commands.md").read_text()
    start = text.index("| kind | size cap | line cap |")
    rows = text[start : text.index("\n\n", start)].splitlines()[2:]
    stated = sorted(
        tuple(int(n) * units[u] for n, u in re.findall(r"\| (\d+) ([KMG]iB) ", row + " "))
        for row in rows
    )
    assert stated == sorted((lim.max_bytes, lim.max_line_bytes) for lim in FILE_LIMITS.values())


def test_numbers_table_names_every_range_checked_flag() -> None:
    """docs/commands.md's table of numeric flags names each flag whose value a typed
    converter range-checks (``gpugov.daemon.cli_types``), in every command."""
    import argparse

    text = (REPO / "docs" / "commands.md").read_text()
    start = text.index("| kind | range | flags |")
    table = text[start : text.index("\n\n", start)]
    named = set(re.findall(r"--[a-z][a-z-]*", table))
    checked: set[str] = set()
    parsers = [build_parser()]
    while parsers:
        for action in parsers.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif (
                action.help != argparse.SUPPRESS
                and action.option_strings
                and getattr(action.type, "__module__", "") == "gpugov.daemon.cli_types"
            ):
                checked.add(action.option_strings[-1])
    assert sorted(checked - named) == []
