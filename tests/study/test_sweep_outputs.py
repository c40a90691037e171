"""``gpugov sweep``'s summaries through the real entry point: names a file may hold (a
``|``, an escape sequence) keep the tables' columns, and a failed cell is named."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.study.sweep import SUMMARY_JSON, SUMMARY_MD


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


def test_a_failed_cell_is_named_in_the_summaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cell that failed was left out of summary.md without a word: its "2 cells" line
    # stood over one row, and only results.jsonl said which cell and why.
    (tmp_path / "late_failing_governor.py").write_text(
        "def make(context):\n"
        "    top = max(context.supported_clocks_mhz)\n"
        "    def decide(observation):\n"
        "        if observation.time_s > 2.0:\n"
        "            raise RuntimeError('no model past 2 s')\n"
        "        return top\n"
        "    return decide\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "late_failing_governor", raising=False)
    _trace(tmp_path / "short.csv")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["short.csv"]\n'
        'profiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["max", "late_failing_governor:make"]\n'
    )
    out = tmp_path / "out"
    code, _, stderr = _run(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"])
    assert code == 1, stderr
    summary = json.loads((out / SUMMARY_JSON).read_text())
    assert summary["failed"] == 1
    [failed] = summary["failed_cells"]
    assert failed["controller"] == "late_failing_governor:make"
    assert failed["trace"] == "short.csv" and failed["seed"] == 0 and failed["load"] == 1.0
    assert "no model past 2 s" in failed["error"]
    assert [row["controller"] for row in summary["table"]] == ["max"]
    text = (out / SUMMARY_MD).read_text()
    named = [line for line in text.splitlines() if "late_failing_governor:make" in line]
    assert len(named) == 1
    assert "failed on 1 cell(s), first short.csv, h100-sxm-llama3-8b" in named[0]
    assert "no model past 2 s" in named[0]
