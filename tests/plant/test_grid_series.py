"""The plant's grid series alone, and as a simulation and its fork hold it."""

from __future__ import annotations

import pytest

from gpugov.plant import PlantSimulation
from gpugov.plant.grid_series import GridSeries
from gpugov.plant.result import SERIES_NAMES
from gpugov.plant.synthetic_workloads import poisson_workload


def _record(series: GridSeries, energy_j: float, phase: str) -> None:
    series.record(
        series.next_tick_s,
        prefill_queue=0.0,
        decode_active=0.0,
        completed_requests=0.0,
        kv_tokens=0.0,
        power_w=123.0,
        requested_clock_mhz=1980.0,
        realized_clock_mhz=1980.0,
        energy_j=energy_j,
        temperature_c=40.0,
        phase=phase,
    )


def test_power_is_the_mean_over_each_step_after_the_first_sample() -> None:
    series = GridSeries(0.5)
    for energy_j, phase in ((0.0, "idle"), (50.0, "decode"), (150.0, "mixed"), (160.0, "idle")):
        _record(series, energy_j, phase)
    assert series.samples["time_s"] == [0.0, 0.5, 1.0, 1.5]
    assert series.samples["power_w"] == [123.0, 100.0, 200.0, 20.0]
    assert series.next_tick_s == 2.0
    assert series.busy_fraction_since(0.0) == pytest.approx(2 / 3)
    assert series.busy_fraction_since(1.5) == 0.0
    arrays = series.arrays()
    assert tuple(arrays) == SERIES_NAMES
    assert arrays["energy_j"].tolist() == [0.0, 50.0, 150.0, 160.0]


def test_a_fork_starts_its_series_empty_on_the_same_grid(plant) -> None:  # type: ignore[no-untyped-def]
    simulation = PlantSimulation(poisson_workload(3.0, 10.0, seed=1), plant)
    simulation.advance_to(5.0)
    fork = simulation.fork()
    assert fork.series is not simulation.series
    assert fork.series.samples["time_s"] == [] and fork.series.phases == []
    assert fork.series.next_tick_s == simulation.series.next_tick_s
    fork.advance_to(6.0)
    simulation.advance_to(6.0)
    ticks = len(fork.series.phases)
    assert fork.series.samples["time_s"] == simulation.series.samples["time_s"][-ticks:]
    assert fork.series.samples["energy_j"] == simulation.series.samples["energy_j"][-ticks:]


def test_a_forks_first_power_sample_is_the_mean_over_its_step(plant) -> None:  # type: ignore[no-untyped-def]
    """A fork between two ticks samples the same power as the run it came from: the mean
    over the step, not the power at the tick (which only the run's first sample takes)."""
    simulation = PlantSimulation(poisson_workload(20.0, 10.0, seed=3), plant)
    simulation.advance_to(5.0 + 0.5 * plant.time_step_s)
    fork = simulation.fork()
    fork.advance_to(7.0)
    simulation.advance_to(7.0)
    ticks = len(fork.series.phases)
    power = simulation.series.samples["power_w"][-ticks:]
    assert fork.series.samples["power_w"] == pytest.approx(power, rel=1e-12)
