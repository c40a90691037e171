"""The plant's SLO attainment counters: exact, judged as the run's metrics judge, and
the observation's TTFT SLO fields for the per-prompt allowance."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.simulator import PlantSimulation
from gpugov.plant.types import Request, ServingObservation


def _workload(count: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.15, count))
    return [
        Request(
            i,
            float(t),
            int(rng.choice([200, 2_000, 12_000, 30_000])),
            int(rng.choice([1, 2, 40, 300])),
        )
        for i, t in enumerate(times)
    ]


@pytest.mark.parametrize("clock_mhz", [600.0, 1980.0])
def test_counters_equal_the_records_judged_by_the_metrics(clock_mhz: float) -> None:
    profile = make_profile(ttft_slo_per_prompt_token_s=4e-5)
    plant = make_plant(profile)
    requests = _workload(150, seed=3)
    seen: list[ServingObservation] = []

    def controller(observation: ServingObservation) -> float:
        seen.append(observation)
        return clock_mhz

    result = simulate(requests, plant, chunked_prefill_scheduler, controller, 0)
    last = seen[-1]
    # The last observation precedes the run's end: count what had happened by then.
    records = [r for r in result.request_records if r.arrival_time_s <= last.time_s]
    first = [
        r
        for r in records
        if r.first_token_time_s is not None and r.first_token_time_s <= last.time_s
    ]
    ttft_met = [r for r in first if r.ttft_s <= profile.ttft_slo_for(r.prompt_tokens) + 1e-12]  # type: ignore[operator]
    finished = [
        r
        for r in records
        if r.finish_time_s is not None and r.finish_time_s <= last.time_s and r.output_tokens > 1
    ]
    tpot_met = [r for r in finished if r.tpot_s <= profile.tpot_slo_s + 1e-12]  # type: ignore[operator]
    assert last.ttft_count_total == len(first)
    assert last.ttft_within_slo_total == len(ttft_met)
    assert last.tpot_count_total == len(finished)
    assert last.tpot_within_slo_total == len(tpot_met)
    if clock_mhz < 1000.0:
        assert len(ttft_met) < len(first)  # the low clock misses some: a real test
    # Counters are cumulative: never decreasing.
    counts = [o.ttft_count_total for o in seen]
    assert counts == sorted(counts)


def test_finished_run_counts_match_the_metrics_attainment() -> None:
    profile = make_profile(ttft_slo_per_prompt_token_s=4e-5)
    plant = make_plant(profile)
    requests = _workload(120, seed=5)
    simulation = PlantSimulation(requests, plant, seed=0, initial_clock_mhz=700.0)
    simulation.advance_to(1e6, stop_when_done=True)
    observation = simulation.observe()
    metrics = simulation.result().metrics
    arrived = metrics.arrived_requests
    assert observation.ttft_count_total == arrived  # every request had its first token
    assert observation.ttft_within_slo_total == pytest.approx(metrics.ttft_slo_attainment * arrived)  # type: ignore[operator]
    one_token = sum(1 for r in requests if r.output_tokens == 1)
    assert observation.tpot_count_total == arrived - one_token
    # compute_metrics counts a one-token request's TPOT as met.
    assert observation.tpot_within_slo_total + one_token == pytest.approx(  # type: ignore[operator]
        metrics.tpot_slo_attainment * arrived  # type: ignore[operator]
    )


def test_observation_carries_the_flat_slo_the_allowance_and_the_window_prompt() -> None:
    profile = make_profile(ttft_slo_per_prompt_token_s=4e-5)
    requests = [Request(0, 0.0, 10_000, 5), Request(1, 0.0, 30_000, 5)]
    simulation = PlantSimulation(requests, make_plant(profile), seed=0)
    simulation.advance_to(30.0)
    observation = simulation.observe()
    assert observation.ttft_slo_s == profile.ttft_slo_s
    assert observation.ttft_slo_per_prompt_token_s == 4e-5
    assert observation.ttft_recent_prompt_tokens == 20_000.0
    assert observation.ttft_recent_slo_s == pytest.approx(profile.ttft_slo_for(20_000))
    assert observation.ttft_slo_for(30_000) == pytest.approx(profile.ttft_slo_for(30_000))
    quiet = simulation.observe()  # no first token in this window: the flat SLO
    assert quiet.ttft_recent_prompt_tokens is None
    assert quiet.ttft_recent_slo_s == profile.ttft_slo_s
