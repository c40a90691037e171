"""Per-request energy attribution in the plant: conservation and known answers."""

from __future__ import annotations

import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.baseline import maximum_clock_controller, reactive_clock_controller
from gpugov.plant import (
    PlantSimulation,
    Request,
    chunked_prefill_scheduler,
    prefill_priority_scheduler,
    simulate,
)
from gpugov.plant.attribution import energy_summary, prefill_fraction, request_rows
from gpugov.plant.result import ServingResult
from gpugov.plant.synthetic_workloads import poisson_workload


def _attributed(result: ServingResult) -> float:
    return sum(r.prefill_energy_j + r.decode_energy_j for r in result.request_records)


def _assert_conserved(result: ServingResult) -> None:
    metrics = result.metrics
    total = _attributed(result) + metrics.idle_energy_j
    assert total == pytest.approx(metrics.energy_j, rel=1e-9, abs=1e-6)
    assert metrics.prefill_energy_j + metrics.decode_energy_j + metrics.idle_energy_j == (
        pytest.approx(metrics.energy_j, rel=1e-9)
    )
    assert all(
        r.prefill_energy_j >= 0.0 and r.decode_energy_j >= 0.0 for r in result.request_records
    )


@pytest.mark.parametrize(
    ("scheduler", "tensor_parallel", "noise"),
    [(chunked_prefill_scheduler, 1, 0.0), (prefill_priority_scheduler, 2, 0.2)],
)
def test_energy_is_conserved_on_mixed_batches_and_tp_groups(
    scheduler: object, tensor_parallel: int, noise: float
) -> None:
    """Mixed prefill/decode iterations, clock changes mid-iteration (reactive), TP 2 and
    jitter: requests' prefill + decode + idle is the GPU's energy."""
    profile = make_profile(tensor_parallel=tensor_parallel)
    plant = make_plant(profile, latency_noise_cv=noise)
    assert plant.tensor_parallel == tensor_parallel
    workload = poisson_workload(4.0, 20.0, seed=5)
    result = simulate(workload, plant, scheduler, reactive_clock_controller)  # type: ignore[arg-type]
    assert "mixed" in result.phase or scheduler is prefill_priority_scheduler
    _assert_conserved(result)
    assert result.metrics.prefill_energy_j > 0 and result.metrics.decode_energy_j > 0
    assert result.metrics.completed_requests == len(workload)


def test_energy_is_conserved_with_idle_gaps_preemption_and_censoring() -> None:
    # A small KV cache forces preemptions (recompute); gaps leave the GPU idle.
    plant = make_plant(kv_capacity_tokens=3000)
    workload = [Request(i, 0.2 * i + (30.0 if i >= 6 else 0.0), 900, 400) for i in range(9)]
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    assert result.metrics.preemptions > 0
    assert result.metrics.idle_energy_j > 0.0
    _assert_conserved(result)
    # Cut the run short: running requests carry their energy so far, and it still adds up.
    cut = simulate(
        workload, plant, chunked_prefill_scheduler, maximum_clock_controller, horizon_s=32.0
    )
    assert cut.metrics.censored_requests > 0
    _assert_conserved(cut)


def test_lone_requests_get_their_phase_energy_exactly() -> None:
    plant = make_plant(actuation_delay_s=0.0)
    profile = plant.profile
    clock = profile.maximum_clock_mhz
    # One prefill-only request (one output token), alone on the GPU.
    result = simulate([Request(0, 1.0, 800, 1)], plant, controller=maximum_clock_controller)
    (record,) = result.request_records
    expected = 800 / profile.rate("prefill", clock) * profile.power("prefill", clock)
    assert record.prefill_energy_j == pytest.approx(expected, rel=1e-9)
    assert record.decode_energy_j == 0.0
    # Two identical requests arriving together are charged the same.
    pair = simulate(
        [Request(0, 1.0, 200, 50), Request(1, 1.0, 200, 50)],
        plant,
        controller=maximum_clock_controller,
    )
    first, second = pair.request_records
    assert first.energy_j == pytest.approx(second.energy_j, rel=1e-9)
    assert first.decode_energy_j > 0.0


def test_mixed_iteration_split_follows_the_phase_powers() -> None:
    """One mixed iteration stepped by hand: the prefill chunk gets ``t_pf * P_pf`` of
    its energy, the decoding request the rest."""
    plant = make_plant(actuation_delay_s=0.0)
    simulation = PlantSimulation([Request(0, 0.0, 100, 20), Request(1, 0.0, 8000, 2)], plant)

    gpu = simulation.gpu
    index = gpu.realized_index
    simulation.advance_to(1e-6)  # the first iteration: both prefill, 512 tokens
    first_s = sum(gpu.iteration_parts(index, 512, 0, 0, 1.0)[:2])
    simulation.advance_to(first_s)
    before = [simulation.request_energy(i) for i in (0, 1)]
    e0 = simulation.energy_j
    simulation.advance_to(first_s + 1e-6)  # starts the next one: mixed
    assert simulation._iter_decode_batch == 1 and simulation._iter_prefill_tokens > 0
    t_pf, t_dec, power = gpu.iteration_parts(
        index, simulation._iter_prefill_tokens, 1, simulation._iter_context, 1.0
    )
    fraction = prefill_fraction(t_pf, t_dec, power, gpu.params.prefill_power_w[index])
    assert 0.0 < fraction < 1.0
    simulation.advance_to(first_s + t_pf + t_dec)
    assert not simulation._in_iteration
    energy = simulation.energy_j - e0
    assert energy == pytest.approx(power * (t_pf + t_dec), rel=1e-9)
    after = [simulation.request_energy(i) for i in (0, 1)]
    assert after[1][0] - before[1][0] == pytest.approx(
        t_pf * gpu.params.prefill_power_w[index], rel=1e-9
    )
    assert after[0][1] - before[0][1] == pytest.approx(energy * (1.0 - fraction), rel=1e-9)
    assert after[0][0] == before[0][0] and after[1][1] == before[1][1]


def test_summary_and_rows() -> None:
    plant = make_plant()
    workload = poisson_workload(2.0, 10.0, seed=2)
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    metrics = result.metrics
    summary = energy_summary(
        result.request_records,
        energy_j=metrics.energy_j,
        idle_energy_j=metrics.idle_energy_j,
        output_tokens=metrics.output_tokens,
    )
    rows = request_rows(result.request_records)
    assert len(rows) == len(workload)
    per_request = sorted(row["energy_j"] for row in rows)
    assert summary["per_request_j"]["mean"] == pytest.approx(sum(per_request) / len(rows))
    assert per_request[0] <= summary["per_request_j"]["p50"] <= per_request[-1]
    assert summary["ml_energy_j_per_output_token"] == pytest.approx(
        metrics.energy_j / metrics.output_tokens
    )
    assert summary["energy_per_1000_requests_j"] == pytest.approx(
        1000.0 * metrics.energy_j / len(rows)
    )
    assert summary["idle_energy_j"] == metrics.idle_energy_j
    row = rows[0]
    assert row["energy_per_output_token_j"] == pytest.approx(
        row["energy_j"] / row["generated_tokens"]
    )


def test_fork_keeps_the_ledger_apart() -> None:
    plant = make_plant()
    simulation = PlantSimulation(poisson_workload(3.0, 10.0, seed=1), plant)
    simulation.advance_to(5.0)
    fork = simulation.fork()
    fork.advance_to(9.0)
    assert fork.energy_ledger is not simulation.energy_ledger
    assert sum(fork.energy_ledger.prefill_j) > sum(simulation.energy_ledger.prefill_j)
    assert simulation.time_s == pytest.approx(5.0)
