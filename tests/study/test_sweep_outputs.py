"""``gpugov sweep``'s summaries through the real entry point: names a file may hold (a
``|``, an escape sequence) keep the tables' columns, and a failed cell is named."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from gpugov.cli import main
from gpugov.study.sweep import SUMMARY_MD


def _run(argv: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


def _trace(path: Path) -> Path:
    """A short trace of a few requests at ``path``."""
    rows = ["arrival_time_s,prompt_tokens,output_tokens"]
    rows += [f"{0.5 * index:.2f},{200 + 10 * index},{8 + index}" for index in range(8)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _markdown_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row, split on the ``|`` that are not escaped."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = line.replace("\\|", "\0").strip("|").split("|")
            rows.append([cell.strip().replace("\0", "|") for cell in cells])
    return rows


def test_names_with_a_pipe_or_an_escape_keep_the_tables_columns(tmp_path: Path) -> None:
    _trace(tmp_path / "a|b.csv")
    _trace(tmp_path / "red\x1b[31m.csv")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["a|b.csv", "red\\u001b[31m.csv"]\n'
        'profiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["max", "fixed:1200"]\n'
    )
    out = tmp_path / "out"
    code, stdout, stderr = _run(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"])
    assert code == 0, stderr
    rows = _markdown_rows((out / SUMMARY_MD).read_text())
    header, body = rows[0], rows[2:]
    assert len(body) == 4
    assert all(len(row) == len(header) for row in body), body
    assert {row[0] for row in body} == {"a|b.csv", "red\\x1b[31m.csv"}
    assert "\x1b" not in stdout
    table = stdout.splitlines()[: 1 + len(body)]
    # Every figure of the fixed-width table ends in its column, the header's.
    assert {len(line) for line in table} == {len(table[0])}, table
