"""``gpugov sweep``'s summaries through the real entry point: names a file may hold (a
``|``, an escape sequence) keep the tables' columns, and a failed cell is named."""

from __future__ import annotations

import io
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from study_support import run_main
from synthetic import plan_payload

from gpugov.daemon.progress import Progress
from gpugov.study.sweep import SUMMARY_JSON, SUMMARY_MD, plan_sweep
from gpugov.study.sweep import run as sweep_run
from gpugov.study.sweep_results import sweep_plot


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
    code, stdout, stderr = run_main(
        ["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]
    )
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
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"])
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


def test_checking_a_grid_counts_every_load_build_and_cell(tmp_path: Path) -> None:
    # A grid of many profiles and controllers was checked in silence: each controller
    # built on each profile, every cell keyed (minutes for thousands), before any line.
    _trace(tmp_path / "short.csv")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["short.csv"]\n'
        'profiles = ["h100-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b"]\n'
        'controllers = ["max", "fixed:1200", "reactive"]\n'
        f"seeds = {list(range(500))}\n"
    )
    heard: list[tuple[float, float, str]] = []
    plan = plan_sweep(grid, lambda done, total, what: heard.append((done, total, what)))
    assert len(plan.cells) == 3000
    totals = {total for _, total, _ in heard}
    assert len(totals) == 1
    assert heard[-1][0] == pytest.approx(totals.pop())
    assert [done for done, _, _ in heard] == sorted(done for done, _, _ in heard)
    said = [what for _, _, what in heard]
    for profile in ("h100-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b"):
        assert f"profile {profile}" in said
        for controller in ("max", "fixed:1200", "reactive"):
            assert f"controller {controller} on {profile}" in said
    assert "trace short.csv" in said
    assert said[-1] == "3,000 of 3,000 cells keyed"


def test_the_grids_check_is_a_progress_line_with_an_eta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def eager(*args: Any, **kwargs: Any) -> Progress:  # a line at every update
        kwargs.pop("quiet_start_s", None)
        return Progress(*args, log_interval_s=0.0, tty=False, **kwargs)

    monkeypatch.setattr(sweep_run, "Progress", eager)
    _trace(tmp_path / "short.csv")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["short.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\ncontrollers = ["max"]\n'
    )
    stream = io.StringIO()
    sweep_run.run_sweep(grid, tmp_path / "out", progress_stream=stream, say=lambda line: None)
    checking = [line for line in stream.getvalue().splitlines() if "checking the grid" in line]
    assert checking[-1].startswith("sweep: 100.0% (3/3 checks), elapsed ")
    assert all(", ETA " in line for line in checking)
    assert checking[-1].endswith("checking the grid: 1 of 1 cells keyed")
    built = "checking the grid: controller max on h100-sxm-llama3-8b"
    assert any(line.endswith(built) for line in checking)


def test_a_controller_whose_file_name_reads_as_math_is_plotted_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # matplotlib read the pair of $ in the plan's name as math, and drawing the legend
    # raised a parse error after every cell had run.
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    plan = tmp_path / "plan$x\\fr$.json"
    plan.write_text(json.dumps(plan_payload()))
    _trace(tmp_path / "short.csv")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["short.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        f'controllers = ["max", {json.dumps(f"open-loop:{plan.name}")}]\n'
    )
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"])
    assert code == 0, stderr
    assert (out / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_a_sweep_with_no_finished_cell_draws_its_plot_without_a_warning() -> None:
    # Every cell failed: the empty legend was a matplotlib UserWarning on stderr, naming
    # sweep_results.py and its source line.
    pytest.importorskip("matplotlib")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        data = sweep_plot([])
    assert data is not None and data.startswith(b"\x89PNG")


def test_every_figure_draws_its_text_as_written() -> None:
    """A pair of ``$`` in any title, label or legend entry (a controller, trace or file
    name) is drawn as written: matplotlib read it as math and raised a parse error when
    the figure was drawn, after the run's work (simulate's title, plot's, the scoreboard's
    and the fleet's legends)."""
    pytest.importorskip("matplotlib")
    from gpugov.study.plots import figure_bytes, pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    name = "open-loop:plan$x\\fr$.json"
    ax.plot([0, 1], [0, 1], label=name)
    ax.set_title(name)
    ax.set_xlabel(name)
    ax.legend()
    fig.suptitle(f"simulate: {name}")
    try:
        assert figure_bytes(fig).startswith(b"\x89PNG")
    finally:
        plt.close(fig)


def test_the_summary_says_the_settings_every_cell_ran_with(tmp_path: Path) -> None:
    """summary.md states the chain, period, SLO target and engine view the cells ran with,
    so that a cell's figures beside a ``simulate`` run's show why they differ."""
    _trace(tmp_path / "t.csv")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["t.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\ncontrollers = ["max"]\n'
        'dwell_s = 1.5\nfloor_mhz = 600.0\nslo_target = 0.95\nengine_view = "exact"\n'
        "control_period_s = 0.5\nduration_s = 3.0\n"
    )
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"])
    assert code == 0, stderr
    assert (
        "Every cell: its controller decides every 0.5 s, SLO target 95 %, the node's safety "
        "chain (dwell 1.5 s, clock floor 600 MHz), the exact engine view, the chunked "
        "scheduler, latency noise 0, the window from 0 s for 3 s."
    ) in (out / SUMMARY_MD).read_text().splitlines()
