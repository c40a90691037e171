"""The simulated engine's ``vllm`` view and the node view built on it: what a vLLM page
gives the daemon, and what the daemon's observer derives from it."""

from __future__ import annotations

import math
from functools import partial

import pytest

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.budget import SLOTarget
from gpugov.daemon.observer import DEFAULT_TAIL_QUANTILE
from gpugov.daemon.simulated import (
    SimulatedNode,
    SimulatedSource,
    node_view,
    observation_view,
    pool_view,
)
from gpugov.daemon.vllm_view import Histogram
from gpugov.plant import PlantSimulation, ServingPlant, load_profile, simulate
from gpugov.plant.types import Request, ServingObservation


@pytest.fixture(scope="module")
def plant() -> ServingPlant:
    return ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))


def long_prompt_workload() -> list[Request]:
    """Short chats, then one 30k-token prompt among them."""
    requests = [Request(i, 0.2 * i, 300, 80) for i in range(40)]
    requests.append(Request(40, 4.0, 30_000, 50))
    return sorted(requests, key=lambda r: r.arrival_time_s)


def test_histogram_buckets_are_cumulative_and_end_at_inf() -> None:
    histogram = Histogram((1.0, 2.0))
    histogram.observe(0.5)
    histogram.observe(1.5, times=2)
    histogram.observe(9.0)
    assert histogram.buckets_le() == ((1.0, 1.0), (2.0, 3.0), (math.inf, 4.0))
    assert histogram.totals().count == 4.0
    assert histogram.totals().sum_s == pytest.approx(0.5 + 3.0 + 9.0)


def test_the_vllm_view_publishes_only_what_a_vllm_page_has(plant: ServingPlant) -> None:
    simulation = PlantSimulation(long_prompt_workload(), plant)
    node = SimulatedNode(simulation, lambda: simulation.time_s)
    source = SimulatedSource(node, view="vllm")
    seen_prefilling = False
    for tick in range(1, 120):
        simulation.advance_to(0.1 * tick)
        exact = node.refresh()
        prefilling = simulation.prefilling_requests
        sample = source.scrape()
        # A prompt being prefilled is a running request on vLLM V1, not a waiting one.
        assert sample.running_requests == exact.decode_active + prefilling
        assert sample.waiting_requests == exact.waiting_requests - prefilling
        assert sample.prefill_remaining_tokens is None
        assert sample.arrived_requests_total is None
        assert sample.ttft_count_total is None and sample.ttft_slo_s is None
        first, finish = simulation.request_times()
        made = [i for i in range(exact.arrived_requests) if first[i] is not None]
        ended = [i for i in range(exact.arrived_requests) if finish[i] is not None]
        assert sample.ttft is not None and sample.ttft.count == len(made)
        # vLLM V1 counts a prompt when its first token is made.
        assert sample.prompt_tokens_total == sum(simulation.requests[i].prompt_tokens for i in made)
        assert sample.finished_requests_total == len(ended)
        assert sample.finished_generation_tokens_total == sum(
            simulation.requests[i].output_tokens for i in ended
        )
        assert sample.tpot_buckets_per_request
        assert sample.tpot_buckets is not None
        assert sample.tpot_buckets[-1][1] == sum(
            simulation.requests[i].output_tokens > 1 for i in ended
        )
        seen_prefilling |= prefilling > 0 and sample.waiting_requests == 0
    assert seen_prefilling, "the long prompt was never seen in its prefill alone"


def test_the_node_view_sees_the_long_prompt_being_prefilled(plant: ServingPlant) -> None:
    """While the 30k-token prompt is prefilled alone, vLLM's waiting gauge is 0; the
    daemon's observer still counts it as waiting, with a backlog, not as decode batch."""
    simulation = PlantSimulation(long_prompt_workload(), plant)
    exact_simulation = PlantSimulation(long_prompt_workload(), plant)
    observe = node_view(simulation)
    checked = 0
    for tick in range(1, 80):
        simulation.advance_to(0.1 * tick)
        exact_simulation.advance_to(0.1 * tick)
        seen = observe()
        exact = exact_simulation.observe()
        assert seen.time_s == exact.time_s
        assert seen.waiting_requests == exact.waiting_requests
        assert seen.decode_active == exact.decode_active
        assert seen.completed_requests == exact.completed_requests
        assert seen.ttft_slo_s == plant.profile.ttft_slo_s
        assert seen.ttft_slo_per_prompt_token_s == plant.profile.ttft_slo_per_prompt_token_s
        if exact.prefill_remaining_tokens > 10_000:
            # No engine publishes a prompt's length before its first token: the node
            # prices the backlog at the prompts it has seen, but it does see one.
            checked += 1
            assert seen.waiting_requests >= 1
            assert seen.prefill_remaining_tokens >= 300.0
    assert checked > 0


def test_the_node_view_counts_the_slo_attainment_from_histograms(plant: ServingPlant) -> None:
    """The observer's counts come from vLLM's TTFT and per-request TPOT histograms: the
    requests counted (from the observer's first scrape, at 0 s) match the plant's."""
    simulation = PlantSimulation(long_prompt_workload(), plant)
    observe = node_view(simulation)
    for tick in range(400):
        simulation.advance_to(0.1 * tick)
        seen = observe()
    exact = simulation.observe()
    assert seen.ttft_count_total == pytest.approx(exact.ttft_count_total)
    assert seen.tpot_count_total == pytest.approx(exact.tpot_count_total)
    assert seen.ttft_within_slo_total is not None and exact.ttft_within_slo_total is not None
    assert abs(seen.ttft_within_slo_total - exact.ttft_within_slo_total) <= 2.0


def test_a_view_changes_what_the_controller_sees_not_the_plant(plant: ServingPlant) -> None:
    workload = long_prompt_workload()
    plain = simulate(workload, plant, controller=maximum_clock_controller)
    viewed = simulate(workload, plant, controller=maximum_clock_controller, view=node_view)
    assert viewed.metrics.energy_j == pytest.approx(plain.metrics.energy_j)
    assert viewed.metrics.slo_attainment == plain.metrics.slo_attainment

    seen: list[int] = []

    def recording(observation):  # type: ignore[no-untyped-def]
        seen.append(observation.waiting_requests)
        return maximum_clock_controller(observation)

    simulate(workload, plant, controller=recording, view=node_view, control_period_s=0.25)
    assert max(seen) >= 1


def test_an_unknown_view_is_refused(plant: ServingPlant) -> None:
    simulation = PlantSimulation(long_prompt_workload(), plant)
    node = SimulatedNode(simulation, lambda: simulation.time_s)
    with pytest.raises(ValueError, match="view must be one of vllm, exact"):
        SimulatedSource(node, view="sglang")
    with pytest.raises(ValueError, match="view must be one of vllm, exact"):
        observation_view("sglang")
    assert observation_view("exact") is None and pool_view("exact") is None
    for make in (observation_view, pool_view):
        view = make("vllm")
        assert isinstance(view, partial) and view.func is node_view
        assert view.keywords == {"quantile": DEFAULT_TAIL_QUANTILE}
        targeted = make("vllm", SLOTarget(attainment=0.9))
        assert isinstance(targeted, partial) and targeted.keywords == {"quantile": 0.9}
    with pytest.raises(ValueError, match="view must be one of"):
        pool_view("sglang")


def test_each_pool_of_a_disaggregated_run_sees_its_node_view(plant: ServingPlant) -> None:
    """``simulate_disaggregated`` with ``node_view``: every engine of a pool is observed
    through its own vLLM page by a daemon observer of the pool's role; the decode pool's
    prompt tokens came from the other pool (``external_kv_transfer``), so it counts none
    as its own work, and its observation matches the plant's where vLLM publishes it."""
    from gpugov.plant.disaggregated import simulate_disaggregated
    from gpugov.plant.disaggregated_layout import DisaggregatedPlant, PoolSpec

    seen: dict[str, list[ServingObservation]] = {"prefill": [], "decode": []}
    made: list[tuple[PlantSimulation, str]] = []

    def recording_view(simulation: PlantSimulation, role: str):  # type: ignore[no-untyped-def]
        made.append((simulation, role))
        return node_view(simulation, role)

    def recorder(role: str):  # type: ignore[no-untyped-def]
        def controller(observation: ServingObservation) -> float:
            seen[role].append(observation)
            return plant.profile.maximum_clock_mhz

        return controller

    requests = [Request(i, 0.3 * i, 400 + 50 * (i % 5), 60) for i in range(30)]
    layout = DisaggregatedPlant(PoolSpec(plant, 2), PoolSpec(plant))
    exact = simulate_disaggregated(
        requests, layout, {"prefill": recorder("prefill"), "decode": recorder("decode")}
    )
    exact_seen = {role: list(observations) for role, observations in seen.items()}
    seen = {"prefill": [], "decode": []}
    viewed = simulate_disaggregated(
        requests,
        layout,
        {"prefill": recorder("prefill"), "decode": recorder("decode")},
        view=recording_view,
    )
    assert [role for _, role in made] == ["prefill", "prefill", "decode"]
    # The view observes; it does not change the run.
    assert viewed.metrics == exact.metrics
    assert {o.role for o in seen["prefill"]} == {"prefill"}
    assert {o.role for o in seen["decode"]} == {"decode"}
    # The decode pool computed none of its prompts: every prompt token is external.
    decode_engine = made[2][0]
    counters = SimulatedSource(SimulatedNode(decode_engine, lambda: decode_engine.time_s), "vllm")
    sample = counters.scrape()
    assert sample.prompt_tokens_total == sum(r.prompt_tokens for r in requests)
    assert sample.prompt_tokens_external_total == sample.prompt_tokens_total
    assert all(o.prompt_tokens_total == 0.0 for o in seen["decode"])
    assert max(o.prompt_tokens_total for o in seen["prefill"]) > 0.0
    # Where a vLLM page states them, the decode pool's counts are the plant's.
    for mine, truth in zip(seen["decode"], exact_seen["decode"], strict=True):
        assert mine.decode_active + mine.waiting_requests == (
            truth.decode_active + truth.waiting_requests
        )
        assert mine.output_tokens_total == truth.output_tokens_total
