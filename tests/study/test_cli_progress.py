"""Long commands report progress on a stream that is not a terminal (one line per period)."""

from __future__ import annotations

import io
import re
from pathlib import Path

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


def test_bench_says_what_it_does_from_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "controllers", "--tiny", "--out", str(tmp_path)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err[0].startswith("bench controllers:   0.0% (0/1 scenarios), elapsed 0s, ETA ?")
    assert "calibrates its SLO capacity" in err[0]
    assert any(line.startswith("bench controllers: 100.0% (1/1 scenarios)") for line in err)
