"""The plant's disaggregated mode: the colocated limit, transfer times, conservation of
requests and energy, and per-pool control."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpugov.plant import Request, ServingObservation, ServingPlant, load_profile, simulate
from gpugov.plant.disaggregated import (
    DisaggregatedSimulation,
    simulate_colocated_replicas,
    simulate_disaggregated,
)
from gpugov.plant.disaggregated_layout import (
    DEFAULT_KV_BYTES_PER_TOKEN,
    DisaggregatedPlant,
    PoolSpec,
    kv_bytes_per_token,
)
from gpugov.plant.synthetic_profiles import synthetic_profile
from gpugov.plant.synthetic_workloads import poisson_workload

FREE = {"link_bandwidth_bytes_per_s": math.inf, "transfer_fixed_s": 0.0}


@pytest.fixture(scope="module")
def plant() -> ServingPlant:
    return ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))


def _fixed(clock_mhz: float):  # type: ignore[no-untyped-def]
    def controller(observation: ServingObservation) -> float:
        return clock_mhz

    return controller


def _both(plant: ServingPlant, clock_mhz: float | None = None) -> dict[str, object]:
    clock = plant.profile.maximum_clock_mhz if clock_mhz is None else clock_mhz
    return {"prefill": _fixed(clock), "decode": _fixed(clock)}


def test_colocated_limit_is_exact(plant: ServingPlant) -> None:
    """One request at a time and a free transfer: the prefill and decode pools run the
    same iterations as the colocated plant, so every request's times and phase energies
    agree to float rounding; only the second GPU's idle energy differs."""
    requests = [Request(i, 4.0 * i, 300 + 211 * i, 2 + 7 * i) for i in range(5)]
    colocated = simulate(requests, plant, controller=_fixed(plant.profile.maximum_clock_mhz))
    layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant), **FREE)
    split = simulate_disaggregated(requests, layout, _both(plant))  # type: ignore[arg-type]
    assert len(split.request_records) == len(colocated.request_records) == 5
    for one, two in zip(colocated.request_records, split.request_records, strict=True):
        assert two.first_token_time_s == pytest.approx(one.first_token_time_s, abs=1e-9)
        assert two.finish_time_s == pytest.approx(one.finish_time_s, abs=1e-9)
        assert two.generated_tokens == one.generated_tokens == one.output_tokens
        assert two.prefill_energy_j == pytest.approx(one.prefill_energy_j, rel=1e-9)
        assert two.decode_energy_j == pytest.approx(one.decode_energy_j, rel=1e-9)
    assert split.metrics.simulated_duration_s == pytest.approx(
        colocated.metrics.simulated_duration_s, abs=1e-9
    )
    assert split.metrics.slo_attainment == colocated.metrics.slo_attainment
    # The busy energy is the same; each pool idles while the other works.
    busy = split.metrics.prefill_energy_j + split.metrics.decode_energy_j
    assert busy == pytest.approx(
        colocated.metrics.prefill_energy_j + colocated.metrics.decode_energy_j, rel=1e-9
    )
    assert split.metrics.energy_j > colocated.metrics.energy_j


def test_transfer_time_at_known_sizes(plant: ServingPlant) -> None:
    """Bytes / (link bandwidth x parallel links) + the fixed cost, with the profile's KV
    size; the transfer delays the second token, not the first."""
    assert kv_bytes_per_token(plant.profile) == 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B, BF16
    layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant), interconnect="infiniband")
    assert layout.transfer_s(1000) == pytest.approx(1e-3 + 1000 * 131_072 / 50e9, rel=1e-12)
    nvlink = replace(layout, interconnect="nvlink")
    assert nvlink.transfer_s(4096) == pytest.approx(1e-4 + 4096 * 131_072 / 450e9, rel=1e-12)
    big = ServingPlant.from_profile(load_profile("h200-sxm-llama3-70b-tp4"))
    tp4 = DisaggregatedPlant(PoolSpec(big), PoolSpec(big), interconnect="roce")
    assert tp4.links == 4
    assert tp4.bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert tp4.transfer_s(2000) == pytest.approx(1e-3 + 2000 * 327_680 / (4 * 25e9), rel=1e-12)
    # The layout's name counts engines, as --layout MPND and the scoreboard's keys do; the
    # GPUs are each pool's own figure.
    described = replace(tp4, decode=PoolSpec(big, 2)).describe()
    assert described["layout"] == "1P2D"
    assert (described["prefill"]["gpus"], described["decode"]["gpus"]) == (4, 8)
    # No model shape in the profile: the stated default.
    synthetic = ServingPlant.from_profile(synthetic_profile("compute-bound"))
    assert kv_bytes_per_token(synthetic.profile) is None
    bare = DisaggregatedPlant(PoolSpec(synthetic), PoolSpec(synthetic))
    assert bare.bytes_per_token == DEFAULT_KV_BYTES_PER_TOKEN

    # In a run: a slow link moves the finish by exactly the transfer time.
    request = [Request(0, 0.0, 3000, 40)]
    slow = replace(layout, link_bandwidth_bytes_per_s=1e9, transfer_fixed_s=0.05)
    free = simulate_disaggregated(request, replace(layout, **FREE), _both(plant))  # type: ignore[arg-type]
    late = simulate_disaggregated(request, slow, _both(plant))  # type: ignore[arg-type]
    delay = 0.05 + 3000 * 131_072 / 1e9
    assert late.transfer_s == pytest.approx((delay,))
    assert late.transfer_bytes == 3000 * 131_072
    one, two = free.request_records[0], late.request_records[0]
    assert two.first_token_time_s == pytest.approx(one.first_token_time_s, abs=1e-12)
    assert two.finish_time_s - one.finish_time_s == pytest.approx(delay, abs=1e-9)


def test_requests_and_energy_are_conserved(plant: ServingPlant) -> None:
    """2P2D under Poisson load: every request arrives, is prefilled once and decoded to
    its length; the pools' energies sum to the run's, each pool's phases and idle to the
    pool's, and the attributed energy plus idle to the whole."""
    requests = poisson_workload(6.0, 12.0, seed=3)
    requests = (*requests, Request(len(requests), requests[-1].arrival_time_s, 500, 1))
    layout = DisaggregatedPlant(PoolSpec(plant, 2), PoolSpec(plant, 2), interconnect="roce")
    result = simulate_disaggregated(requests, layout, _both(plant))  # type: ignore[arg-type]
    records = result.request_records
    assert [r.request_id for r in records] == [r.request_id for r in requests]
    assert all(r.finish_time_s is not None for r in records)
    assert all(r.generated_tokens == r.output_tokens for r in records)
    assert sum(r.generated_tokens for r in records) == result.metrics.output_tokens
    assert len(result.transfer_s) == sum(1 for r in requests if r.output_tokens > 1)
    prefill, decode = result.pools["prefill"], result.pools["decode"]
    assert len(prefill.engines) == len(decode.engines) == 2
    assert sum(len(e.request_records) for e in prefill.engines) == len(requests)
    assert sum(len(e.request_records) for e in decode.engines) == len(result.transfer_s)
    assert prefill.decode_energy_j == 0.0 and decode.prefill_energy_j == 0.0
    for pool in (prefill, decode):
        assert pool.energy_j == pytest.approx(sum(e.metrics.energy_j for e in pool.engines))
        parts = pool.prefill_energy_j + pool.decode_energy_j + pool.idle_energy_j
        assert parts == pytest.approx(pool.energy_j, rel=1e-9)
        # Every GPU is counted over the whole run.
        for engine in pool.engines:
            assert engine.metrics.simulated_duration_s == pytest.approx(
                result.metrics.simulated_duration_s, abs=1e-9
            )
    metrics = result.metrics
    assert metrics.energy_j == pytest.approx(prefill.energy_j + decode.energy_j, rel=1e-12)
    attributed = sum(r.energy_j for r in records)
    assert attributed + metrics.idle_energy_j == pytest.approx(metrics.energy_j, rel=1e-9)
    assert metrics.completed_requests == metrics.arrived_requests == len(requests)
    assert metrics.ttft_slo_attainment is not None and metrics.tpot_p50_s is not None


def test_controller_per_pool_sees_its_role(plant: ServingPlant) -> None:
    """Each pool's controller sees its pool (role, queue) and sets only its clock."""
    seen: dict[str, list[ServingObservation]] = {"prefill": [], "decode": []}
    low, high = plant.profile.minimum_clock_mhz, plant.profile.maximum_clock_mhz

    def recorder(role: str, clock: float):  # type: ignore[no-untyped-def]
        def controller(observation: ServingObservation) -> float:
            seen[role].append(observation)
            return clock

        return controller

    requests = poisson_workload(4.0, 6.0, seed=5)
    layout = DisaggregatedPlant(PoolSpec(plant, 2), PoolSpec(plant))
    controllers = {"prefill": recorder("prefill", high), "decode": recorder("decode", low)}
    result = simulate_disaggregated(requests, layout, controllers, control_period_s=0.5)  # type: ignore[arg-type]
    assert {o.role for o in seen["prefill"]} == {"prefill"}
    assert {o.role for o in seen["decode"]} == {"decode"}
    assert all(o.decode_active == 0 for o in seen["prefill"])
    assert any(o.decode_active > 0 for o in seen["decode"])
    assert seen["prefill"][-1].arrived_requests == len(requests)
    pooled = seen["prefill"][3]
    assert pooled.power_limit_w == pytest.approx(2 * plant.power_limit_w)
    # The pooled prefill view says it pools two engines, and the largest one engine's
    # backlog within the summed one; a single-engine pool says one and leaves it unknown.
    assert {o.engines for o in seen["prefill"]} == {2}
    assert {o.engines for o in seen["decode"]} == {1}
    assert all(o.busiest_prefill_tokens is None for o in seen["decode"])
    for o in seen["prefill"]:
        assert o.busiest_prefill_tokens is not None
        assert o.prefill_remaining_tokens / 2 <= o.busiest_prefill_tokens
        assert o.busiest_prefill_tokens <= o.prefill_remaining_tokens
    assert result.pools["decode"].engines[0].requested_clock_mhz[-1] == low
    assert result.pools["prefill"].engines[1].requested_clock_mhz[-1] == high
    assert ServingObservation(0.0, 0, 0, 0.0, 0, 0.0, 30.0).role == "colocated"


def test_pooled_view_names_the_busiest_engines_backlog(plant: ServingPlant) -> None:
    """A long prompt and a short one land on the two engines of a prefill pool: the pooled
    backlog is their sum, the busiest engine's the long prompt's rest alone."""
    requests = [Request(0, 0.0, 40_000, 2), Request(1, 0.0, 8_000, 2)]
    layout = DisaggregatedPlant(PoolSpec(plant, 2), PoolSpec(plant))
    simulation = DisaggregatedSimulation(requests, layout, seed=1)
    simulation.advance_to(0.05)
    pooled = simulation.observe("prefill")
    assert pooled.engines == 2
    assert pooled.busiest_prefill_tokens is not None
    assert 0 < pooled.busiest_prefill_tokens < pooled.prefill_remaining_tokens
    assert pooled.busiest_prefill_tokens > pooled.prefill_remaining_tokens / 2
    alone = simulation.pools["prefill"].engines[0].observe()
    assert pooled.busiest_prefill_tokens == alone.prefill_remaining_tokens


def test_bad_layouts_and_controllers_are_named(plant: ServingPlant) -> None:
    with pytest.raises(ValueError, match="interconnect"):
        DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant), interconnect="carrier-pigeon")
    with pytest.raises(ValueError, match="link_bandwidth_bytes_per_s"):
        DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant), link_bandwidth_bytes_per_s=0.0)
    with pytest.raises(ValueError, match="replicas"):
        PoolSpec(plant, 0)
    # A whole float or a bool is no engine count: it was taken, and the run failed later
    # with a TypeError (range() of a float) or ran True as one engine.
    for odd in (2.0, True):
        with pytest.raises(ValueError, match="replicas must be an integer"):
            PoolSpec(plant, odd)  # type: ignore[arg-type]
    layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant))
    with pytest.raises(ValueError, match="missing \\['decode'\\]"):
        simulate_disaggregated([Request(0, 0.0, 10, 5)], layout, {"prefill": _fixed(1000.0)})  # type: ignore[dict-item]


def test_colocated_replicas_reference(plant: ServingPlant) -> None:
    """The colocated layout of the same GPUs: one engine is :func:`simulate` exactly;
    two split the arrivals round robin and end together."""
    requests = poisson_workload(5.0, 6.0, seed=7)
    top = _fixed(plant.profile.maximum_clock_mhz)
    alone = simulate(requests, plant, controller=top)
    one = simulate_colocated_replicas(requests, plant, [top])
    assert one.metrics == alone.metrics
    assert one.request_records == alone.request_records
    two = simulate_colocated_replicas(requests, plant, [top, top])
    assert [r.request_id for r in two.request_records] == [r.request_id for r in requests]
    assert two.metrics.completed_requests == len(requests)
    assert two.metrics.energy_j == pytest.approx(sum(e.metrics.energy_j for e in two.engines))
    ends = {round(e.metrics.simulated_duration_s, 9) for e in two.engines}
    assert ends == {round(two.metrics.simulated_duration_s, 9)}


def _drive_pools(
    simulation: DisaggregatedSimulation, clocks: dict[str, float], first: int, end: int
) -> None:
    """Control ticks ``[first, end)`` of one second at fixed pool clocks, as the loop runs."""
    for step in range(first, end):
        simulation.advance_to(float(step), stop_when_done=True)
        if simulation.done and step > 0:
            return
        for role in ("prefill", "decode"):
            simulation.observe(role)
            simulation.request_clock(role, clocks[role])


def test_fork_runs_on_like_the_original_and_leaves_it_alone(plant: ServingPlant) -> None:
    """A fork of a 2P2D run in full flow (transfers in flight, decode engines that were
    handed requests) driven on equals the original driven the same way; driving the fork
    elsewhere first changes nothing in the original; request_times matches the records."""
    requests = poisson_workload(8.0, 10.0, seed=11)
    requests = (*requests, Request(len(requests), requests[-1].arrival_time_s, 700, 1))
    layout = DisaggregatedPlant(PoolSpec(plant, 2), PoolSpec(plant, 2), interconnect="roce")
    clocks = plant.profile.clock_mhz
    top = {"prefill": float(clocks[-1]), "decode": float(clocks[-1])}
    low = {"prefill": float(clocks[len(clocks) // 2]), "decode": float(clocks[0])}
    original = DisaggregatedSimulation(requests, layout, seed=4)
    _drive_pools(original, top, 0, 6)
    decode_engines = original.pools["decode"].engines
    assert sum(len(engine.requests) for engine in decode_engines) > 0 and not original.done
    before = (original.time_s, original.energy_j, original.records(), original.request_times())

    elsewhere = original.fork()
    _drive_pools(elsewhere, top, 6, 40)  # to the end, at other clocks than below
    assert elsewhere.done and elsewhere.energy_j > before[1]
    after = (original.time_s, original.energy_j, original.records(), original.request_times())
    assert after == before

    twin = original.fork()
    for simulation in (original, twin):
        _drive_pools(simulation, low, 6, 60)
        simulation.advance_to(60.0, stop_when_done=True)
    assert original.done and twin.done
    assert twin.energy_j == original.energy_j and twin.time_s == original.time_s
    assert twin.records() == original.records()
    assert twin.request_times() == original.request_times()
    first, finish = original.request_times()
    records = original.records()
    assert first == [r.first_token_time_s for r in records]
    assert finish == [r.finish_time_s for r in records]
    assert all(t is not None for t in finish) and elsewhere.records() != records


def test_a_run_observing_through_a_view_is_not_forked(plant: ServingPlant) -> None:
    layout = DisaggregatedPlant(PoolSpec(plant), PoolSpec(plant))
    viewed = DisaggregatedSimulation(
        [Request(0, 0.0, 100, 5)], layout, view=lambda engine, role: engine.observe
    )
    with pytest.raises(ValueError, match="observes through a view"):
        viewed.fork()
