"""Long commands report progress on a stream that is not a terminal (one line per period)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpugov.cli import main
from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.daemon.sim_progress import SimulationProgress, slo_so_far
from gpugov.plant import PlantSimulation, simulate
from gpugov.plant.types import Request

LINE = re.compile(
    r"^(simulate|run --simulate): +\d+\.\d% \([\d,]+/[\d,]+ simulated s\), elapsed \S+, "
    r"ETA \S+, energy [\d,.]+ kJ, SLO (so far )?\S"
)


def _workload(n: int = 40) -> list[Request]:
    return [Request(i, 0.5 * i, 200 + 10 * i, 20 + i) for i in range(n)]


def test_plant_calls_on_progress_every_n_simulated_seconds(plant) -> None:
    calls: list[float] = []
    simulate(
        _workload(),
        plant,
        controller=maximum_clock_controller,
        on_progress=lambda time_s, simulation: calls.append(time_s),
        progress_every_s=5.0,
    )
    # At each 5 s tick; the run ends when the last request finishes, just before 20 s.
    assert calls[:4] == pytest.approx([0.0, 5.0, 10.0, 15.0])
    assert len(calls) == 5 and 19.5 < calls[4] <= 20.0


def test_simulation_progress_lines_with_an_injected_clock(plant) -> None:
    now = [0.0]
    stream = io.StringIO()
    progress = SimulationProgress(20.0, "simulate", stream=stream, clock=lambda: now[0], tty=False)
    simulation = PlantSimulation(_workload(), plant)
    for second in range(0, 21, 2):
        simulation.advance_to(float(second))
        now[0] = second * 1.5  # 1.5 wall seconds per 2 simulated seconds
        progress(float(second), simulation)
    progress.close(simulation)
    lines = stream.getvalue().splitlines()
    # One line at the start, one every 10 wall seconds, and the final one.
    assert len(lines) == 4, lines
    assert all(LINE.match(line) for line in lines), lines
    # Lines when 10 and 20 wall seconds have passed: at 8 (12 s) and 16 (24 s) simulated s.
    assert lines[1].startswith("simulate:  40.0% (8/20 simulated s), elapsed 12s, ETA 18s")
    assert lines[2].startswith("simulate:  80.0% (16/20 simulated s)")
    met, done = slo_so_far(simulation)
    assert f"SLO so far {100.0 * met / done:.1f} % of {done:,} finished" in lines[-1]
    assert lines[-1].startswith("simulate: 100.0% (20/20 simulated s)")


def test_simulation_progress_counts_the_drain_after_the_last_arrival(plant) -> None:
    # Every request arrives at 0 s and decodes for minutes: measured against the last
    # arrival alone, each line read 100 % and ETA 0s from the first second to the end.
    now = [0.0]
    stream = io.StringIO()
    progress = SimulationProgress(0.0, "simulate", stream=stream, clock=lambda: now[0], tty=False)

    def on_progress(time_s: float, simulation: Any) -> None:
        now[0] += 4.0  # four wall seconds per call (every 10 simulated s)
        progress(time_s, simulation)

    workload = [Request(i, 0.0, 500, 6000) for i in range(4)]
    result = simulate(workload, plant, controller=maximum_clock_controller, on_progress=on_progress)
    progress.close(result=result)
    shares = [float(m) for m in re.findall(r"simulate: +([\d.]+)%", stream.getvalue())]
    end_s = result.metrics.simulated_duration_s
    assert end_s > 30.0  # a drain of several progress lines
    middle = shares[1:-1]
    assert middle and all(0.0 < share < 100.0 for share in middle), stream.getvalue()
    assert middle == sorted(middle)
    assert shares[-1] == 100.0
    assert f"({end_s:,.0f}/{end_s:,.0f} simulated s)" in stream.getvalue().splitlines()[-1]
    assert progress.total_s == pytest.approx(end_s)


def test_simulate_shows_progress_when_not_on_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--duration", "30"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) >= 2 and all(LINE.match(line) for line in err), err
    assert err[-1].startswith("simulate: 100.0%")
    assert main(["simulate", "--duration", "30", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_run_simulate_shows_progress_when_not_on_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", "--simulate", "--virtual", "--duration", "30", "--metrics-address", "none"]
    assert main(argv) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) >= 2 and all(LINE.match(line) for line in err), err
    assert err[-1].startswith("run --simulate: 100.0%")


BENCH_LINE = re.compile(
    r"^bench controllers: +\d+\.\d% \(([\d,]+)/([\d,]+) simulated s\), elapsed \S+, "
    r"ETA \S+, (\d+)/(\d+) scenarios"
)


def test_bench_says_what_it_does_from_the_start_and_counts_inside_a_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line counted whole scenarios, so a board of one long scenario read "0/1
    scenarios, ETA ?" until its end. It counts the runs' simulated seconds now, each run's
    as it goes: here a line at every update (the interval set to 0) shows them before the
    one scenario has finished."""
    from gpugov.daemon import progress
    from gpugov.study.scoreboard.run import TINY, scenario_progress_units

    class EveryUpdate(progress.Progress):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "log_interval_s": 0.0})

    monkeypatch.setattr(progress, "Progress", EveryUpdate)
    assert main(["bench", "controllers", "--tiny", "--out", str(tmp_path)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    total = scenario_progress_units(TINY, TINY.duration_s)  # the bundled trace's first 15 s
    assert err[0].startswith(
        f"bench controllers:   0.0% (0/{total:,.0f} simulated s), elapsed 0s, ETA ?, "
        "0/1 scenarios, bench controllers: 1 scenario(s)"
    )
    assert "calibrates its SLO capacity" in err[0]
    lines = [BENCH_LINE.match(line) for line in err if line.startswith("bench controllers")]
    assert all(lines), err
    counts = [(float(m[1].replace(",", "")), int(m[3])) for m in lines if m is not None]
    first_done = next(i for i, (_, scenarios) in enumerate(counts) if scenarios == 1)
    inside = [done for done, _ in counts[:first_done] if 0.0 < done < total]
    assert len(inside) >= 3, err  # within the scenario, before it finished
    assert [done for done, _ in counts] == sorted(done for done, _ in counts)
    assert err[-1].startswith(f"bench controllers: 100.0% ({total:,.0f}/{total:,.0f} simulated s)")


def test_a_bench_line_shows_one_eta_and_one_scenario_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scenario's line carried a second ETA, ``[1/1 3.5s ETA 0s]``, counting scenarios
    as if all were as long (and the count again) after the bar's own: each line has the
    bar's ETA, from the simulated seconds, and one count of the scenarios done."""
    assert main(["bench", "controllers", "--tiny", "--out", str(tmp_path)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    bench = [line for line in err if line.startswith("bench controllers:")]
    assert bench and all(line.count("ETA") == 1 for line in bench), err
    assert all(len(re.findall(r"\d+/\d+ scenarios|\[\d+/\d+", line)) == 1 for line in bench)
    done = [line for line in bench if "azure-conv-10min|h100-sxm-llama3-8b|recorded (" in line]
    assert done and ", 1/1 scenarios, azure-conv-10min|h100-sxm-llama3-8b|recorded (" in done[0]


def test_bench_counts_a_pools_scenarios_while_they_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A local pool's workers report their runs' simulated seconds through shared memory
    (``CellProgress``), which the driver reads while it waits: counted before either of
    two scenarios running side by side has finished."""
    import multiprocessing
    import os
    from dataclasses import replace

    from gpugov.study import runners
    from gpugov.study.scoreboard.run import TINY, run_scoreboard, scenario_progress_units

    # A worker that has counted something waits (60 s at most) until the driver has read
    # a count: on a loaded machine the driver could otherwise sleep through both
    # scenarios, and only ever see them finished. (The workers are forked after this.)
    read = multiprocessing.get_context("fork").Event()
    reported = runners.CellProgress.report

    def report_then_wait(self: Any, key: str, done: float) -> None:
        reported(self, key, done)
        # The simulated seconds' slots alone (the driver's reader: on_report); the
        # scenarios' sizes, reported as each is built, are read only with them.
        if done > 0.0 and os.getpid() != self._driver_pid and self.on_report is not None:
            read.wait(60.0)

    def on_progress(done: float, total: float) -> None:
        events.append(("progress", done))
        totals.append(total)
        if done > 0.0:
            read.set()

    monkeypatch.setattr(runners.CellProgress, "report", report_then_wait)
    monkeypatch.setattr(runners, "WAIT_S", 0.01)  # the driver looks every 10 ms
    profiles = ("h100-sxm-llama3-8b", "h200-sxm-llama3-8b")
    config = replace(TINY, profiles=profiles, jobs=2, comparison_scenario=None)
    events: list[tuple[str, float]] = []
    totals: list[float] = []
    run_scoreboard(
        config,
        progress=lambda line: events.append(("line", float(line.startswith("[")))),
        on_progress=on_progress,
    )
    units = scenario_progress_units(config, config.duration_s)  # each one 15 s window
    total = 2 * units
    assert totals == pytest.approx([total] * len(totals))
    first_done = events.index(("line", 1.0))
    before = [value for kind, value in events[:first_done] if kind == "progress" and value]
    # The first count is a part of a scenario (a finished one counts whole): read while
    # both still ran.
    assert before and 0.0 < before[0] < units, events
    counted = [value for kind, value in events if kind == "progress"]
    assert counted == sorted(counted) and counted[-1] == pytest.approx(total)


def _short_trace(path: Path, requests: int = 60, every_s: float = 0.5) -> Path:
    """An Azure-format trace of ``requests`` arrivals ``every_s`` apart (29.5 s here)."""
    rows = [
        f"2023-11-16 18:53:{every_s * i:010.7f},{300 + 7 * i},{40 + i % 9}" for i in range(requests)
    ]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_a_short_scenarios_progress_units_are_its_own_length(tmp_path: Path) -> None:
    """The bar counted ``duration_s`` (600 s) for every scenario, a 30 s trace's too, so
    its ETA was that of runs twenty times longer: the units are the scenario's own
    simulated length, guessed from the trace before the scenario is built, and its
    built length afterwards."""
    from dataclasses import replace

    from gpugov.plant import ServingPlant
    from gpugov.plant.synthetic_profiles import resolve_profile
    from gpugov.study.scoreboard.run import (
        expected_progress_units,
        outcome_progress_units,
        scenario_progress_units,
    )
    from gpugov.study.scoreboard.scenarios import (
        CONTROLLER_ORDER,
        FULL,
        _full_trace,
        build_scenario,
    )

    trace = str(_short_trace(tmp_path / "short.csv"))
    config = replace(FULL, traces=(trace,), profiles=("h100-sxm-llama3-8b",), loads=("recorded",))
    assert config.duration_s == 600.0
    full = _full_trace(trace, quiet=True)
    profile = resolve_profile("h100-sxm-llama3-8b")
    shared = {f"trace:{trace}": full, "profile:h100-sxm-llama3-8b": profile}
    task = (trace, "h100-sxm-llama3-8b", "recorded", config, False, None)
    runs = len(CONTROLLER_ORDER)  # every controller and oracle of the board
    assert scenario_progress_units(config, 29.5) == pytest.approx(29.5 * runs)
    assert expected_progress_units(task, shared) == pytest.approx(29.5 * runs)
    scenario = build_scenario(trace, ServingPlant.from_profile(profile), "recorded", 600.0, full)
    assert scenario.load_scale == 1.0 and scenario.scenario_duration_s == pytest.approx(29.5)
    outcome = {"scenario": scenario.describe()}
    assert outcome_progress_units(outcome, config) == pytest.approx(29.5 * runs)
    assert outcome_progress_units({"skipped": {"scenario": trace}}, config) == 0.0


def test_a_trace_used_whole_is_guessed_at_its_fluid_length() -> None:
    """BurstGPT's slice is used whole, compressed to a load of its capacity: before the
    capacity is measured its length is guessed from its work at the maximum clock, not
    taken for ``duration_s``."""
    from gpugov.plant.synthetic_profiles import resolve_profile
    from gpugov.study.scoreboard.scenarios import (
        BUSY_UTILIZATION,
        TARGET_UTILIZATION,
        expected_scenario_duration_s,
        work_seconds_at_maximum,
    )

    profile = resolve_profile("h100-sxm-llama3-8b")
    requests = [Request(i, 100.0 * i, 500, 50) for i in range(20)]
    work_s = work_seconds_at_maximum(requests, profile)
    guessed = {
        load: expected_scenario_duration_s("burstgpt1", requests, profile, load, 600.0)
        for load in ("recorded", "cap70")
    }
    assert guessed["recorded"] == pytest.approx(work_s / BUSY_UTILIZATION)
    assert guessed["cap70"] == pytest.approx(work_s / TARGET_UTILIZATION)
    # A window: duration_s, cut to what the trace holds from its start.
    assert expected_scenario_duration_s("other", requests, profile, "recorded", 600.0) == 600.0
    assert expected_scenario_duration_s(
        "other", requests, profile, "recorded", 600.0, start_s=1500.0
    ) == pytest.approx(600.0)  # moved back to fit the 1,900 s trace
    assert expected_scenario_duration_s(
        "other", requests[:5], profile, "recorded", 600.0
    ) == pytest.approx(400.0, abs=1e-5)


def test_bench_counts_a_short_trace_at_its_own_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench controllers`` on a 29.5 s trace with 600 s windows: its bar counts 17 runs
    of 29.5 s (502 simulated s) from its first line, not 17 of 600 (10,200)."""
    trace = _short_trace(tmp_path / "short.csv")
    argv = ["bench", "controllers", "--tiny", "--traces", str(trace), "--duration", "600"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench")]
    assert err[0].startswith("bench controllers:   0.0% (0/502 simulated s)"), err
    assert err[-1].startswith("bench controllers: 100.0% (502/502 simulated s)"), err


SWEEP_LINE = re.compile(
    r"^sweep: +\d+\.\d% \(([\d,]+)/([\d,]+) simulated s\), elapsed \S+, ETA \S+, "
    r"(\d+)/(\d+) cells"
)


def test_a_sweep_counts_simulated_seconds_inside_its_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep counted whole cells, so one of a few long cells (a whole trace under mpc)
    read "0/1 cells, ETA ?" for minutes. It counts each cell's simulated seconds as it
    runs now (to its last arrival, at the load's scale): here, with a line at every
    update, counts inside the one cell of each load before it finishes."""
    from gpugov.daemon import progress
    from gpugov.study.runners import RunnerSpec
    from gpugov.study.sweep import run as sweep_run
    from gpugov.study.sweep import run_sweep

    class EveryUpdate(progress.Progress):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "log_interval_s": 0.0})

    monkeypatch.setattr(sweep_run, "Progress", EveryUpdate)
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["max"]\nloads = [1.0, 2.0]\nduration_s = 60.0\n'
    )
    stream = io.StringIO()
    run_sweep(
        grid, tmp_path / "out", spec=RunnerSpec(jobs=1), say=lambda line: None,
        progress_stream=stream,
    )  # fmt: skip
    lines = [line for line in stream.getvalue().splitlines() if line.strip()]
    matches = [SWEEP_LINE.match(line) for line in lines]
    assert all(matches), lines
    counts = [
        (float(m[1].replace(",", "")), float(m[2].replace(",", "")), int(m[3]))
        for m in matches
        if m
    ]
    total = counts[0][1]
    assert 80.0 < total <= 90.0, lines  # 60 s at load 1 and 30 s at load 2, to the last arrivals
    assert lines[0].startswith(
        f"sweep:   0.0% (0/{total:,.0f} simulated s), elapsed 0s, ETA ?, 0/2 cells"
    )
    inside = [done for done, _, cells in counts if cells == 0 and done > 0.0]
    assert len(inside) >= 3, lines  # within the first cell, before it finished
    assert [done for done, _, _ in counts] == sorted(done for done, _, _ in counts)
    # Done, each cell counts its whole run: past its last arrival, its requests' drain.
    rows = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    ran = sum(json.loads(row)["metrics"]["simulated_duration_s"] for row in rows)
    assert ran >= total
    assert counts[-1] == (round(ran), round(ran), 2), lines


DISAGGREGATED_LINE = re.compile(
    r"^bench controllers --layout disaggregated: +\d+\.\d% \(([\d,]+)/([\d,]+) rows\), "
    r"elapsed \S+, ETA \S+, (\d+)/(\d+) scenarios"
)


def test_the_disaggregated_board_counts_rows_inside_a_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--layout disaggregated`` counted whole scenarios: a board of two 10-minute
    scenarios said nothing for 2 1/2 minutes and read "ETA ?" until the first ended. It
    counts each scenario's rows as they are done now: here, with a line at every update,
    counts inside the first scenario before it finishes."""
    from gpugov.daemon import progress

    class EveryUpdate(progress.Progress):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "log_interval_s": 0.0})

    monkeypatch.setattr(progress, "Progress", EveryUpdate)
    argv = ["bench", "controllers", "--layout", "disaggregated", "--duration", "3"]
    argv += ["--traces", "azure-conv-10min", "--profiles", "h100-sxm-llama3-8b"]
    argv += ["--loads", "recorded", "--jobs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench")]
    matches = [DISAGGREGATED_LINE.match(line) for line in err]
    assert all(matches), err
    counts = [(int(m[1]), int(m[2]), int(m[3])) for m in matches if m]
    assert {total for _, total, _ in counts} == {14}, err  # 2 layouts x 7 rows
    inside = [done for done, _, scenarios in counts if scenarios == 0 and 0 < done < 7]
    assert len(inside) >= 3, err
    assert [done for done, _, _ in counts] == sorted(done for done, _, _ in counts)
    assert counts[-1] == (14, 14, 2), err
