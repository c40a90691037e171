"""``gpugov experiments --quick`` through the real entry point."""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_quick_experiments

from gpugov.cli import main
from gpugov.study import experiments_cli
from gpugov.study.experiments import TIMING_FIELDS, build_textbook_results
from gpugov.study.runners import RunnerSpec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOP_LEVEL_KEYS = {
    "metadata",
    "modeling",
    "open_loop",
    "mpc",
    "scheduling",
    "fqi",
    "scheduling_on_plant",
}
TABLE_ROWS = (
    "| Open-loop plan, nominal arrivals |",
    "| Open-loop plan, shifted arrivals |",
    "| max, shifted |",
    "| reactive, shifted |",
    "| open-loop, shifted (same run as open-loop shifted) |",
    "| mpc-slsqp, shifted |",
    "| Exact DP |",
    "| FQI, broad coverage |",
    "| FQI, narrow log |",
    "| Exact DP policy |",
    "| Broad-FQI policy |",
    "| Narrow-FQI policy |",
    "| Decode-priority policy |",
    "| Chunked prefill (512 tokens) |",
)


def _strict_load(text: str) -> Any:
    def reject(constant: str) -> None:
        raise ValueError(f"non-strict JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


def _run_quick(out: Path, *extra: str) -> tuple[int, str, str]:
    return run_quick_experiments(out, *extra)


@pytest.fixture(scope="module")
def quick_run(experiments_quick_run: tuple[Path, int, str, str]) -> tuple[Path, int, str, str]:
    return experiments_quick_run


def _without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [_without_timing(item) for item in value]
    return value


def test_quick_run_writes_results_summary_and_every_figure(quick_run) -> None:
    out, code, stdout, _ = quick_run
    assert code == 0
    results = _strict_load((out / "results.json").read_text())
    assert set(results) == TOP_LEVEL_KEYS
    for name in experiments_cli.FIGURES:
        path = out / "figures" / name
        assert path.read_bytes()[:8] == PNG_MAGIC, name
        assert f"wrote {path}" in stdout
    assert f"wrote {out / 'results.json'}" in stdout
    assert f"wrote {out / 'summary.md'}" in stdout
    assert not (out / ".partial").exists()  # every file moved into DIR


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file()
    }


def test_a_run_stopped_midway_leaves_the_earlier_outputs_whole(
    quick_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results, the figures and the summary were written into DIR one after another:
    Ctrl-C (or SIGTERM) while the figures were drawn left this run's results.json and
    first figures beside the earlier run's summary and last figures. They now go into DIR
    only once all are written: a stopped run leaves DIR as it was.

    The suite's results are the quick run's (read back from its results.json): what is
    under test is how the command writes them, not how it computes them."""
    recorded = _strict_load((quick_run[0] / "results.json").read_text())
    monkeypatch.setattr(experiments_cli, "build_textbook_results", lambda *a, **k: recorded)
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    earlier = {"results.json": b"earlier", "summary.md": b"earlier", "notes.txt": b"the user's"}
    earlier |= {f"figures/{name}": b"earlier" for name in experiments_cli.FIGURES}
    for name, data in earlier.items():
        (out / name).write_bytes(data)

    stops: list[object] = []

    def stopped(*args: object, **kwargs: object) -> None:  # Ctrl-C at the fifth figure
        stops.append(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(experiments_cli, "plot_coverage", stopped)
    code, _, stderr = _run_quick(out)
    assert code == 130 and stderr.splitlines()[-1] == "gpugov: interrupted"
    assert len(stops) == 1  # stopped while the figures were drawn
    assert _files(out) == earlier and not (out / ".partial").exists()
    # A DIR the stopped run created goes with it.
    monkeypatch.setattr(experiments_cli, "build_textbook_results", stopped)
    code, _, _ = _run_quick(tmp_path / "new")
    assert code == 130 and not (tmp_path / "new").exists()


def test_quick_results_record_sizes_trace_and_version(quick_run) -> None:
    out, _, _, _ = quick_run
    metadata = _strict_load((out / "results.json").read_text())["metadata"]
    assert metadata["sizes"] == experiments_cli.QUICK_SIZES
    assert metadata["quick"] is True
    assert metadata["trace"]["name"] == "azure-conv-10min"
    assert len(metadata["trace"]["sha256"]) == 64
    assert metadata["trace"]["duration_s"] == 120.0
    assert 599.0 < metadata["trace"]["span_s"] < 600.0  # the bundled slice's last arrival
    assert "past the trace's last arrival" not in (out / "summary.md").read_text()
    assert metadata["scheduling_trace_source_window_s"] == 120.0
    assert metadata["gpugov_version"]
    assert metadata["profile"]["status"] == "literature-derived"
    assert set(metadata["seed_deviations"]) == {"open_loop", "mpc", "scheduling", "experiments"}


def test_summary_has_the_headline_tables_and_caveats(quick_run) -> None:
    out, _, _, _ = quick_run
    summary = (out / "summary.md").read_text()
    for row in TABLE_ROWS:
        assert row in summary, row
    assert "Profile status: literature-derived" in summary
    assert "Solve time p50 / p99 / max" in summary
    assert "fallbacks to the reactive governor" in summary
    assert "## Seed deviations" in summary
    assert "--quick" in summary
    # What every controller ran with, which is the seed's, not simulate's defaults.
    assert (
        "- Controllers: the node's factory and safety chain (dwell 0 s, no clock floor), "
        "every 1 s, SLO target none (fixed margins), the exact engine view, as the seed runs"
    ) in summary
    metadata = json.loads((out / "results.json").read_text())["metadata"]
    assert metadata["controllers"] == {
        "control_period_s": 1.0,
        "safety": {"floor_mhz": None, "dwell_s": 0.0, "min_relock_interval_s": 0.1},
        "slo_target": None,
        "engine_view": "exact",
    }
    for name in experiments_cli.FIGURES:
        assert f"(figures/{name})" in summary


def test_progress_lines_carry_step_elapsed_and_eta(quick_run) -> None:
    _, _, _, stderr = quick_run
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) >= 10
    steps = experiments_cli.EXPERIMENT_STEPS
    pattern = re.compile(
        rf"^experiments: +\d+\.\d% \(\d+/{steps} steps\), elapsed \S+, ETA \S+, \S"
    )
    assert all(pattern.match(line) for line in lines), lines
    assert lines[-1].startswith(f"experiments: 100.0% ({steps}/{steps} steps)")
    assert any("fqi" in line for line in lines)
    assert lines[-1].endswith("done")


def test_each_run_on_the_plant_is_a_step(quick_run) -> None:
    """The second stage's five runs on the plant (each policy and chunked prefill, over the
    whole evaluation window) were one step: on an hour's window it ran 37 s at "83.3%
    ... ETA 2s" with no line. Each run is a step of its own now, so the ETA counts them;
    and so is each figure (as one step, the figures were drawn for seconds at "ETA 1s"
    with no line; before that the bar read 100 % meanwhile)."""
    _, _, _, stderr = quick_run
    lines = [line for line in stderr.splitlines() if line.strip()]
    on_plant = [line for line in lines if "scheduling on the plant" in line]
    assert [line.split(", ", 3)[-1] for line in on_plant] == [
        f"scheduling on the plant at the calibration clock: {label} ({index}/5)"
        for index, label in enumerate(
            (
                "Exact DP",
                "FQI, broad coverage",
                "FQI, narrow log",
                "Decode-priority heuristic",
                "Chunked prefill",
            ),
            1,
        )
    ], lines
    figures = [line for line in lines if "writing figure" in line]
    assert [line.split(", ", 3)[-1] for line in figures] == [
        f"writing figure {name} ({index}/6)"
        for index, name in enumerate(experiments_cli.FIGURES, 1)
    ], lines
    steps = experiments_cli.EXPERIMENT_STEPS
    before = steps - len(experiments_cli.FIGURES)  # the figures are the last steps
    assert figures[0].startswith(
        f"experiments: {100 * before / steps:5.1f}% ({before}/{steps} steps)"
    ), lines


def test_identical_runs_give_identical_json_except_solve_times(
    quick_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _, _, _ = quick_run
    first = _strict_load((out / "results.json").read_text())
    # Virtual time: an evaluation budget bounds the solves, so no solve "overruns" on a
    # busy machine. The second run times solves with a fake clock (1 ms per reading);
    # the solve times never change a decision. The figures were checked above; this run
    # only needs the JSON.
    assert first["mpc"]["diagnostics"]["fallback_reasons"]["overrun"] == 0
    ticks = iter(range(1, 10**9))
    monkeypatch.setattr(
        experiments_cli,
        "build_textbook_results",
        functools.partial(build_textbook_results, mpc_timer=lambda: next(ticks) * 1e-3),
    )
    monkeypatch.setattr(experiments_cli, "write_figures", lambda *args: [])
    code, _, _ = _run_quick(tmp_path / "again")
    assert code == 0
    second = _strict_load((tmp_path / "again" / "results.json").read_text())
    assert second["mpc"]["diagnostics"]["solve_time_p99_s"] == pytest.approx(1e-3)
    assert first["mpc"]["diagnostics"]["solve_time_p99_s"] is not None
    assert _without_timing(first) == _without_timing(second)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--duration", "0"], "argument --duration: must be a duration in seconds in (0, "),
        (["--window", "0"], "argument --window: must be a duration in seconds in (0, "),
        (["--animation", "200", "--duration", "100"], "exceeds --duration"),
        (["--start", "-1"], "argument --start: must be a time in seconds in [0, "),
        (["--trace", "no-such-trace.csv"], "no-such-trace.csv"),
        (["--profile", "no-such-profile"], "no-such-profile"),
        # Accepted durations no window of which holds a burst to move 20 s earlier: the
        # refusal blamed the trace ('--trace azure-conv-10min: no trace window ...').
        (["--duration", "10"], "--duration 10: the open-loop experiment moves a burst 20 s"),
        (["--duration", "20"], "so it needs a --duration over 20 s"),
    ],
)
def test_bad_arguments_fail_with_one_clear_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["experiments", "--quick", *argv, "--out", str(tmp_path / "bad")])
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("gpugov: error:") and message in error
    assert not (tmp_path / "bad" / "results.json").exists()


@pytest.mark.parametrize("output", ["summary.md", "results.json", "figures/coverage.png"])
def test_an_out_whose_outputs_would_overwrite_the_trace_is_refused(
    output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace at DIR/summary.md ran the whole study, then was replaced by the summary."""
    from gpugov.plant.workload import resolve_trace

    out = tmp_path / "out"
    trace = out / output
    trace.parent.mkdir(parents=True)
    before = resolve_trace("azure-conv-10min").read_bytes()
    trace.write_bytes(before)
    argv = ["experiments", "--quick", "--trace", str(trace), "--duration", "60"]
    assert main([*argv, "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"--out {trace}: is the trace, which it would overwrite" in error[0]
    assert trace.read_bytes() == before


def test_a_second_run_into_a_directory_being_written_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs into one DIR shared DIR/.partial: the second removed the first's files at
    its start, the first's move took the second's, and one failed on a missing file."""
    import fcntl
    import os

    out = tmp_path / "out"
    (out / ".partial").mkdir(parents=True)
    (out / ".partial" / "results.json").write_text("the other run's")
    held = os.open(out, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # the other run, mid-way

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study ran")

    monkeypatch.setattr(experiments_cli, "build_textbook_results", never)
    try:
        code = main(["experiments", "--quick", "--duration", "60", "--out", str(out)])
    finally:
        os.close(held)
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"--out {out}: another run is writing its outputs" in error[0]
    assert (out / ".partial" / "results.json").read_text() == "the other run's"


def test_parts_in_a_local_pool_give_the_sequential_result(
    quick_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--jobs 2 runs the independent parts (modelling, open loop + MPC, DP, both FQIs) as
    pool tasks and assembles the same result as the sequential run."""
    out, _, _, _ = quick_run
    first = _strict_load((out / "results.json").read_text())
    monkeypatch.setattr(experiments_cli, "write_figures", lambda *args: [])
    code, _, stderr = _run_quick(tmp_path / "sharded", "--jobs", "2")
    assert code == 0, stderr
    second = _strict_load((tmp_path / "sharded" / "results.json").read_text())
    assert second["metadata"].pop("runner") == RunnerSpec(jobs=2).describe()
    assert "part fqi_narrow done" in stderr and "part frequency done" in stderr
    if (
        first["mpc"]["diagnostics"]["fallback_reasons"]["overrun"]
        or second["mpc"]["diagnostics"]["fallback_reasons"]["overrun"]
    ):
        pytest.skip("an MPC solve overran its wall-clock limit here; runs are not comparable")
    assert _without_timing(first) == _without_timing(second)


def test_a_window_shorter_than_the_animation_default_is_all_modelling_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--duration 30`` with no ``--animation`` was refused with "--animation (60 s)
    exceeds --duration (30 s)", a flag the user never set. The default now shortens to the
    window (the modelling run is all of it); an ``--animation`` given is still refused."""

    class Started(Exception):
        """The suite was reached: the arguments were taken."""

    seen: dict[str, Any] = {}

    def started(animation: Any, evaluation: Any, plant: Any, **kwargs: Any) -> Any:
        seen.update(animation=animation, evaluation=evaluation, **kwargs)
        raise Started

    monkeypatch.setattr(experiments_cli, "build_textbook_results", started)
    argv = ["experiments", "--quick", "--duration", "30", "--out", str(tmp_path / "out")]
    with pytest.raises(Started):
        main(argv)
    assert seen["animation"] == seen["evaluation"] and len(seen["animation"]) > 0
    assert seen["extra_metadata"]["trace"]["animation_duration_s"] == 30.0
    assert main([*argv, "--animation", "31"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == "gpugov: error: --animation (31 s) exceeds --duration (30 s)"
    assert experiments_cli.animation_length_s(None, 300.0) == experiments_cli.DEFAULT_ANIMATION_S


@pytest.mark.parametrize(
    ("trace", "said"),
    [
        ({"start_s": 0.0, "duration_s": 300.0, "span_s": 72.74}, ", past the trace's last "
         "arrival at 72.74 s"),
        ({"start_s": 100.0, "duration_s": 300.0, "span_s": 599.2}, ""),
        ({"start_s": 0.0, "duration_s": 300.0}, ""),  # results from before the span was kept
    ],
)  # fmt: skip
def test_the_summary_says_a_window_past_the_traces_end(trace: dict[str, Any], said: str) -> None:
    """A 73 s trace under the default 300 s window was summarised as "400 requests (300 s
    from 0 s)": the window's seconds, not the trace's."""
    assert experiments_cli._past_end(trace) == said


def test_a_trace_with_no_burst_to_move_is_told_what_the_experiment_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One request: the refusal said only 'no trace window contains a shiftable
    forecast-work burst within the maximum-clock horizon capacity'."""
    trace = tmp_path / "one.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,50\n")
    code = main(["experiments", "--quick", "--trace", str(trace), "--out", str(tmp_path / "o")])
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"gpugov: error: --trace {trace} (the window ")
    assert "it needs a 60 s window with requests 20 s or more into it" in error[0]
    assert "the 1 request(s) arrive from 0.00 s to 0.00 s" in error[0]
    assert not (tmp_path / "o").exists()


def _slow_part(name: str, shared: object) -> dict[str, object]:
    """A stand-in first-stage part that takes a while (module level: picklable)."""
    time.sleep(0.5)
    return {"part": name}


def test_a_sharded_run_redraws_its_line_while_its_parts_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``--jobs`` or ``--ray`` the bar was updated only as a part ended: a minute
    with no line on two cores (FQI), where a line every 10 s is promised. The driver's
    wait calls back now (``on_wait``), and the command redraws the line from it."""
    from gpugov.study import runners

    monkeypatch.setattr(experiments_cli, "run_part_task", _slow_part)
    monkeypatch.setattr(experiments_cli, "run_scheduling_on_plant", lambda *a, **k: {})
    monkeypatch.setattr(experiments_cli, "assemble_textbook_results", lambda *a, **k: {})
    monkeypatch.setattr(runners, "WAIT_S", 0.05)
    events: list[str] = []
    experiments_cli.build_sharded_results(
        None,  # type: ignore[arg-type]  # the stand-in parts read no inputs
        runners.RunnerSpec(jobs=2),
        events.append,
        on_wait=lambda: events.append("wait"),
    )
    first_done = next(i for i, event in enumerate(events) if event.startswith("part "))
    assert "wait" in events[:first_done], events


def test_a_window_past_the_simulated_days_limit_names_only_this_commands_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal of a window longer than the simulated-days limit told an experiments
    user to choose "a larger --load-scale", a flag experiments does not take."""
    trace = tmp_path / "far.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n900000,100,10\n")
    argv = ["experiments", "--trace", str(trace), "--quick", "--duration", "1000000"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gpugov: error: --trace {trace}: the window spans 900,000 simulated seconds, over the "
        "limit of 7 simulated days; choose a shorter --duration"
    ]
