"""Known-answer tests of the iteration-level plant (no wall-time assertions)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.baseline import (
    fixed_clock_controller,
    maximum_clock_controller,
    reactive_clock_controller,
    sample_and_hold_clock_controller,
)
from gpugov.plant import (
    ControllerError,
    PlantSimulation,
    Request,
    ServingObservation,
    chunked_prefill_scheduler,
    decode_priority_scheduler,
    prefill_priority_scheduler,
    simulate,
)
from gpugov.plant.gpu_physics import GpuParameters, GpuPhysics, _time_above
from gpugov.plant.synthetic_workloads import poisson_workload


def sparse_workload(count: int = 6, gap_s: float = 20.0) -> tuple[Request, ...]:
    """Requests far apart so each runs alone on the GPU."""
    return tuple(Request(i, 1.0 + i * gap_s, 700 + 300 * i, 40 + 10 * i) for i in range(count))


def test_thermal_rc_matches_closed_form_step_response() -> None:
    plant = make_plant(thermal_time_constant_s=12.0, actuation_delay_s=0.0)
    profile = plant.profile
    simulation = PlantSimulation((), plant, initial_clock_mhz=profile.minimum_clock_mhz)
    t0 = simulation.temperature_c
    assert t0 == pytest.approx(30.0 + 0.07 * profile.power("idle", profile.minimum_clock_mhz))
    simulation.request_clock(profile.maximum_clock_mhz)  # a power step at t = 0
    simulation.advance_to(60.0)
    result = simulation.result()
    t_eq = 30.0 + 0.07 * profile.power("idle", profile.maximum_clock_mhz)
    expected = t_eq + (t0 - t_eq) * np.exp(-result.time_s / 12.0)
    np.testing.assert_allclose(result.temperature_c, expected, rtol=0, atol=1e-9)


def test_gpu_physics_integrates_one_segment_exactly() -> None:
    """The composed GPU alone: energy, RC step response and seconds above both limits."""
    plant = make_plant(power_limit_w=300.0, thermal_limit_c=50.0, thermal_time_constant_s=10.0)
    params = GpuParameters.from_plant(plant)
    gpu = GpuPhysics(params, 0)
    t0 = gpu.temperature_c
    assert t0 == pytest.approx(30.0 + 0.07 * params.idle_power_w[0])
    gpu.integrate(20.0, 400.0, busy=True)
    t_eq = 30.0 + 0.07 * 400.0
    assert gpu.energy_j == 8000.0
    assert gpu.temperature_c == pytest.approx(t_eq + (t0 - t_eq) * math.exp(-2.0))
    assert gpu.busy_s == 20.0 and gpu.power_violation_s == 20.0
    assert gpu.thermal_violation_s == pytest.approx(_time_above(t0, t_eq, 10.0, 20.0, 50.0))
    assert gpu.thermal_violation_s > 0.0 and gpu.peak_temperature_c == gpu.temperature_c
    gpu.integrate(0.0, 123.0, busy=False)  # an empty segment only sets the power
    assert gpu.power_w == 123.0 and gpu.energy_j == 8000.0 and gpu.busy_s == 20.0


def test_gpu_parameters_are_frozen_and_shared_by_forks(plant) -> None:  # type: ignore[no-untyped-def]
    simulation = PlantSimulation(poisson_workload(3.0, 10.0, seed=1), plant)
    params = simulation.gpu.params
    assert params == GpuParameters.from_plant(plant)
    assert params.thermal_safe_power_w() == pytest.approx(
        (plant.thermal_limit_c - plant.ambient_temperature_c) / plant.thermal_resistance_c_per_w
    )
    with pytest.raises(AttributeError):
        params.power_limit_w = 1.0  # type: ignore[misc]
    simulation.advance_to(5.0)
    fork = simulation.fork()
    assert fork.gpu.params is params and fork.gpu is not simulation.gpu
    fork.advance_to(9.0)
    assert fork.energy_j > simulation.energy_j and simulation.time_s == pytest.approx(5.0)


def test_a_fork_after_added_requests_keeps_its_own_workload(plant) -> None:  # type: ignore[no-untyped-def]
    """A request added to a fork is not added to the original (the emulator and a decode
    engine grow their workload with add_request; the fork shared the list)."""
    simulation = PlantSimulation((), plant)
    simulation.add_request(64, 4)
    simulation.advance_to(2.0)
    assert simulation.done
    fork = simulation.fork()
    fork.add_request(128, 8)
    fork.advance_to(1.0 + fork.time_s)
    assert len(simulation.requests) == 1 and len(fork.requests) == 2
    assert simulation.done and len(simulation.records()) == 1
    # An untouched workload (the tuple a simulation starts with) is still shared.
    started = PlantSimulation(poisson_workload(3.0, 5.0, seed=2), plant)
    assert started.fork().requests is started.requests


def test_time_above_limit_closed_form() -> None:
    # Heating from 20 to an equilibrium of 100 crosses 60 at tau * ln(80 / 40).
    assert _time_above(20.0, 100.0, 10.0, 30.0, 60.0) == pytest.approx(30.0 - 10.0 * math.log(2.0))
    # Cooling from 90 towards 30 stays above 60 for tau * ln(60 / 30).
    assert _time_above(90.0, 30.0, 10.0, 30.0, 60.0) == pytest.approx(10.0 * math.log(2.0))
    assert _time_above(20.0, 50.0, 10.0, 30.0, 60.0) == 0.0


def test_low_load_ttft_equals_prompt_work_over_prefill_rate() -> None:
    plant = make_plant()
    workload = sparse_workload()
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    rate = plant.profile.rate("prefill", plant.profile.maximum_clock_mhz)
    for record in result.request_records:
        expected = record.prompt_tokens / rate
        assert record.ttft_s == pytest.approx(expected, rel=1e-9)
    assert result.metrics.slo_attainment == 1.0


def test_decode_rate_reproduced_at_reference_batch(plant) -> None:  # type: ignore[no-untyped-def]
    profile = plant.profile
    model = profile.decode_latency_model
    gpu = PlantSimulation((), plant).gpu
    batch = model.reference_batch_size
    context = model.reference_batch_size * model.reference_context_tokens
    for index, clock in enumerate(profile.clock_mhz):
        _, t_dec, _ = gpu.iteration_parts(index, 0, batch, context, 1.0)
        assert model.reference_batch_size / t_dec == pytest.approx(profile.rate("decode", clock))


def test_energy_is_integral_of_power_and_series_consistent(plant) -> None:  # type: ignore[no-untyped-def]
    workload = poisson_workload(3.0, 60.0, seed=3)
    result = simulate(workload, plant, chunked_prefill_scheduler, reactive_clock_controller)
    dt = plant.time_step_s
    integrated = np.concatenate([[0.0], np.cumsum(result.power_w[1:] * dt)])
    np.testing.assert_allclose(integrated, result.energy_j, rtol=1e-9, atol=1e-9)
    # The total adds the tail after the last grid tick at no more than peak power.
    tail = result.metrics.simulated_duration_s - result.time_s[-1]
    assert 0.0 <= tail < dt
    assert result.metrics.energy_j >= result.energy_j[-1]
    assert result.metrics.energy_j - result.energy_j[-1] <= tail * plant.power_limit_w + 1e-9


def test_idle_energy_equals_idle_power_times_time(plant) -> None:  # type: ignore[no-untyped-def]
    simulation = PlantSimulation((), plant, initial_clock_mhz=1200.0)
    simulation.advance_to(37.3)
    expected = plant.profile.power("idle", 1200.0) * 37.3
    assert simulation.energy_j == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "scheduler",
    [chunked_prefill_scheduler, prefill_priority_scheduler, decode_priority_scheduler],
    ids=["chunked", "prefill-priority", "decode-priority"],
)
def test_every_output_token_generated_exactly_once(scheduler) -> None:  # type: ignore[no-untyped-def]
    workload = poisson_workload(6.0, 40.0, seed=11)
    plant = make_plant()
    result = simulate(workload, plant, scheduler, maximum_clock_controller)
    assert result.metrics.completed_requests == len(workload)
    assert result.metrics.output_tokens == sum(r.output_tokens for r in workload)
    for record in result.request_records:
        assert record.generated_tokens == record.output_tokens
        assert record.finish_time_s is not None and record.first_token_time_s is not None
        assert record.finish_time_s >= record.first_token_time_s >= record.arrival_time_s


def test_kv_overflow_preempts_and_recomputes_without_duplicating_tokens() -> None:
    workload = tuple(Request(i, 0.01 * i, 2000, 600) for i in range(24))
    plant = make_plant(kv_capacity_tokens=30_000)
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    assert result.metrics.preemptions > 0
    assert result.metrics.output_tokens == 24 * 600
    assert all(r.generated_tokens == 600 for r in result.request_records)
    assert float(np.max(result.kv_tokens)) <= 30_000


def test_kv_capacity_makes_requests_wait() -> None:
    workload = tuple(Request(i, 0.0, 8000, 50) for i in range(6))
    small = make_plant(kv_capacity_tokens=17_000)
    large = make_plant()
    waited = simulate(workload, small, chunked_prefill_scheduler, maximum_clock_controller)
    free = simulate(workload, large, chunked_prefill_scheduler, maximum_clock_controller)
    assert float(np.max(waited.kv_tokens)) <= 17_000
    last_ttft_small = max(r.ttft_s for r in waited.request_records)  # type: ignore[type-var]
    last_ttft_large = max(r.ttft_s for r in free.request_records)  # type: ignore[type-var]
    assert last_ttft_small > last_ttft_large


@pytest.mark.parametrize(
    ("workload", "limits"),
    [
        # More requests at once than batch slots: 44 wait for a slot.
        (tuple(Request(i, 0.0, 100, 200) for i in range(300)), {"max_batch_size": 256}),
        # The third prompt waits for KV room the first two running requests hold.
        (
            (Request(0, 0.0, 9000, 300), Request(1, 0.0, 9000, 300), Request(2, 0.1, 9000, 300)),
            {"kv_capacity_tokens": 20_000},
        ),
    ],
    ids=["batch-full", "kv-full"],
)
def test_prefill_priority_decodes_while_a_waiting_prompt_cannot_be_admitted(
    workload: tuple[Request, ...], limits: dict[str, int]
) -> None:
    """A prompt that waits for a batch slot or KV room lets the running requests decode
    (vLLM V0 decodes when no prefill can be scheduled); a prefill-only iteration that
    admits nothing paused the decodes that free the room for good: every request was
    censored at the end of the run, none completed."""
    plant = make_plant(**limits)
    result = simulate(workload, plant, prefill_priority_scheduler, maximum_clock_controller)
    assert result.metrics.completed_requests == len(workload)
    assert all(r.generated_tokens == r.output_tokens for r in result.request_records)


def test_identical_seeds_identical_results_different_seeds_differ() -> None:
    plant = make_plant(latency_noise_cv=0.2)
    workload = poisson_workload(4.0, 30.0, seed=5)
    first = simulate(workload, plant, chunked_prefill_scheduler, reactive_clock_controller, seed=7)
    second = simulate(workload, plant, chunked_prefill_scheduler, reactive_clock_controller, seed=7)
    other = simulate(workload, plant, chunked_prefill_scheduler, reactive_clock_controller, seed=8)
    assert json.dumps(first.as_dict()) == json.dumps(second.as_dict())
    assert first.metrics.energy_j != other.metrics.energy_j


def test_lower_fixed_clock_saves_energy_at_low_load_without_faster_ttft(plant) -> None:  # type: ignore[no-untyped-def]
    workload = poisson_workload(0.5, 120.0, seed=2)
    results = [
        simulate(workload, plant, chunked_prefill_scheduler, fixed_clock_controller(clock))
        for clock in (1980.0, 1500.0, 1005.0)
    ]
    energies = [r.metrics.energy_j for r in results]
    assert energies[0] > energies[1] > energies[2]
    ttfts = [[rec.ttft_s for rec in r.request_records] for r in results]
    for higher, lower in itertools.pairwise(ttfts):
        assert all(b >= a - 1e-12 for a, b in zip(higher, lower, strict=True))


def test_power_cap_holds_realized_clock_below_request() -> None:
    plant = make_plant(power_limit_w=330.0)
    workload = poisson_workload(8.0, 30.0, seed=4)
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    assert float(np.max(result.power_w[1:])) <= 330.0 + 1e-6
    assert result.metrics.power_cap_violation_s == 0.0
    assert np.any(result.realized_clock_mhz < result.requested_clock_mhz)


def test_thermal_limit_holds_temperature() -> None:
    plant = make_plant(thermal_limit_c=45.0, thermal_time_constant_s=5.0)
    workload = poisson_workload(8.0, 60.0, seed=4)
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    # The die may overshoot only within one iteration of crossing the limit.
    assert float(np.max(result.temperature_c)) < 45.0 + 0.5
    assert np.any(result.realized_clock_mhz < result.requested_clock_mhz)
    # While hot, iterations run at a clock whose steady state is within the limit; only
    # the iteration in flight when the limit is crossed finishes at the old clock.
    safe_power = (45.0 - 30.0) / 0.07
    hot = result.temperature_c[:-1] > 45.0 + 0.05
    assert hot.any()
    assert float(np.mean(result.power_w[1:][hot])) <= safe_power
    assert result.metrics.thermal_violation_s > 0.0


def test_actuation_delay_and_quantisation() -> None:
    plant = make_plant(actuation_delay_s=0.25, time_step_s=0.05)
    simulation = PlantSimulation((), plant, initial_clock_mhz=1980.0)
    assert simulation.request_clock(1003.0) == 990.0  # quantised downward on the 15 MHz grid
    simulation.advance_to(0.2)
    assert simulation.realized_clock_mhz == 1980.0
    simulation.advance_to(0.3)
    assert simulation.realized_clock_mhz == 990.0


def test_measured_manifest_realized_medians_are_honoured() -> None:
    profile = make_profile(
        clock_profile_selection={"realized_clock_median_mhz_by_requested": {"1980": 1875.0}}
    )
    plant = make_plant(profile)
    workload = sparse_workload(2)
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    assert set(np.unique(result.realized_clock_mhz)) == {1875.0}
    assert set(np.unique(result.requested_clock_mhz)) == {1980.0}
    rate = profile.rate("prefill", 1875.0)
    assert result.request_records[0].ttft_s == pytest.approx(700 / rate, rel=1e-9)


def test_observations_never_reveal_unfinished_output_lengths(plant) -> None:  # type: ignore[no-untyped-def]
    workload = poisson_workload(3.0, 20.0, seed=9)
    sentinel = list(workload)
    sentinel[5] = replace(sentinel[5], output_tokens=sentinel[5].output_tokens + 900)
    seen: list[list[ServingObservation]] = [[], []]

    def recorder(bucket: list[ServingObservation]):  # type: ignore[no-untyped-def]
        def controller(observation: ServingObservation) -> float:
            bucket.append(observation)
            return 1500.0

        return controller

    first = simulate(
        workload, plant, chunked_prefill_scheduler, recorder(seen[0]), control_period_s=0.25
    )
    simulate(
        tuple(sentinel), plant, chunked_prefill_scheduler, recorder(seen[1]), control_period_s=0.25
    )
    finish = first.request_records[5].finish_time_s
    assert finish is not None
    compared = 0
    for a, b in zip(seen[0], seen[1], strict=False):
        if a.time_s >= finish:
            break
        assert a == b
        compared += 1
    assert compared > 10


def test_controller_exception_propagates_with_context(plant) -> None:  # type: ignore[no-untyped-def]
    def broken(observation: ServingObservation) -> float:
        if observation.time_s >= 3.0:
            raise ZeroDivisionError("boom")
        return 1500.0

    with pytest.raises(ControllerError, match=r"t=3\.000s") as info:
        simulate(sparse_workload(), plant, chunked_prefill_scheduler, broken)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(ControllerError, match="non-finite"):
        simulate(sparse_workload(), plant, chunked_prefill_scheduler, lambda o: float("nan"))


def test_controller_period_any_positive_value(plant) -> None:  # type: ignore[no-untyped-def]
    calls: list[float] = []

    def controller(observation: ServingObservation) -> float:
        calls.append(observation.time_s)
        return 1980.0

    simulate(sparse_workload(2), plant, chunked_prefill_scheduler, controller, control_period_s=0.3)
    np.testing.assert_allclose(np.diff(calls), 0.3, atol=1e-9)
    with pytest.raises(ValueError, match="control_period_s"):
        simulate(
            sparse_workload(2), plant, chunked_prefill_scheduler, controller, control_period_s=0.0
        )


def test_censoring_at_horizon(plant) -> None:  # type: ignore[no-untyped-def]
    workload = tuple(Request(i, 0.0, 4000, 3000) for i in range(4))
    result = simulate(
        workload, plant, chunked_prefill_scheduler, maximum_clock_controller, horizon_s=2.0
    )
    metrics = result.metrics
    assert metrics.censored_requests == 4
    assert metrics.completed_requests == 0
    assert metrics.tpot_censored_requests == 4
    assert metrics.slo_attainment == 0.0
    assert all(r.finish_time_s is None for r in result.request_records)


def test_default_horizon_waits_for_an_slo_longer_than_the_drain_timeout() -> None:
    """A run ends at the drain timeout after the last arrival only where every request's
    SLO deadline has passed by then: on a board whose TTFT SLO is longer, a queue still
    draining within its SLO is served, not censored as misses."""
    profile = replace(make_profile(), ttft_slo_s=3000.0, tpot_slo_s=10.0)
    plant = make_plant(profile, drain_timeout_s=1.0)
    workload = tuple(Request(i, 0.0, 4000, 300) for i in range(8))
    assert plant.run_horizon_s(workload) == pytest.approx(3000.0 + 299 * 10.0)
    result = simulate(workload, plant, chunked_prefill_scheduler, fixed_clock_controller(345.0))
    assert result.metrics.censored_requests == 0
    assert result.metrics.completed_requests == len(workload)
    assert result.metrics.slo_attainment == 1.0
    # Where the deadlines pass first, the drain timeout still ends the run: the synthetic
    # profile's 1 s + 299 x 0.1 s = 30.9 s against a 600 s drain.
    quick = make_plant()
    late = (*workload, Request(8, 50.0, 4000, 300))
    assert quick.profile.ttft_slo_for(4000) + 299 * quick.profile.tpot_slo_s < 600.0
    assert quick.run_horizon_s(late) == pytest.approx(50.0 + 600.0)


def test_result_as_dict_is_json_and_strided(plant) -> None:  # type: ignore[no-untyped-def]
    result = simulate(
        sparse_workload(3),
        plant,
        chunked_prefill_scheduler,
        sample_and_hold_clock_controller(reactive_clock_controller, period_s=2.0),
    )
    payload = result.as_dict(stride=7)
    text = json.dumps(payload, allow_nan=False)
    assert "peak_queued_requests_at_minimum_clock" in text
    assert payload["time_s"][-1] == pytest.approx(float(result.time_s[-1]))
    count = result.time_s.size
    expected = len(range(0, count, 7)) + (0 if (count - 1) % 7 == 0 else 1)
    assert len(payload["time_s"]) == len(payload["phase"]) == expected
    for key in (
        "energy_j",
        "energy_per_output_token_j",
        "ttft_p50_s",
        "ttft_p95_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p95_s",
        "tpot_p99_s",
        "slo_attainment",
        "completed_requests",
        "censored_requests",
        "output_tokens",
        "simulated_duration_s",
        "power_cap_violation_s",
        "thermal_violation_s",
        "cap_overshoot_s",
        "peak_queued_requests_at_minimum_clock",
    ):
        assert key in payload["metrics"]
    with pytest.raises(ValueError):
        result.as_dict(stride=0)


def test_workload_must_be_sorted_and_fit_kv(plant) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="sorted"):
        PlantSimulation((Request(0, 5.0, 10, 10), Request(1, 1.0, 10, 10)), plant)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        PlantSimulation((Request(0, 0.0, 500_000, 10),), plant)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"kv_capacity_tokens": 30_000}, {"thermal_limit_c": 45.0, "thermal_time_constant_s": 5.0}],
    ids=["default", "kv-limited", "thermal-limited"],
)
def test_fast_forward_matches_iteration_by_iteration(overrides: dict) -> None:
    plant = make_plant(**overrides)
    workload = poisson_workload(3.0, 60.0, seed=21)
    runs = []
    for fast in (True, False):
        simulation = PlantSimulation(workload, plant, fast_forward=fast)
        for step in range(200):
            simulation.advance_to(step * 0.5)
            observation = simulation.observe()
            simulation.request_clock(reactive_clock_controller(observation))
        runs.append(simulation.result())
    fast_result, slow_result = runs
    for name in (
        "energy_j",
        "temperature_c",
        "power_w",
        "kv_tokens",
        "realized_clock_mhz",
        "prefill_queue",
        "decode_active",
        "completed_requests",
    ):
        np.testing.assert_allclose(
            getattr(fast_result, name),
            getattr(slow_result, name),
            rtol=1e-9,
            atol=1e-6,
            err_msg=name,
        )
    for a, b in zip(fast_result.request_records, slow_result.request_records, strict=True):
        assert a.generated_tokens == b.generated_tokens
        for field in ("first_token_time_s", "finish_time_s"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None and y is None) or x == pytest.approx(y, rel=1e-9, abs=1e-9)
    assert fast_result.metrics.output_tokens == slow_result.metrics.output_tokens


def test_scheduler_requested_idle_is_honoured(plant) -> None:  # type: ignore[no-untyped-def]
    from gpugov.plant import IterationPlan, SchedulerView

    def patient(view: SchedulerView) -> IterationPlan:
        # Hold new prompts until the oldest has waited 0.4 s (a batching-delay policy).
        if view.waiting_requests and view.oldest_waiting_age_s < 0.4 - 1e-9:
            return IterationPlan(decode=view.decode_active > 0, prefill_token_budget=0, idle_s=0.1)
        return IterationPlan(decode=True, prefill_token_budget=4096)

    result = simulate(sparse_workload(3), plant, patient, maximum_clock_controller)
    rate = plant.profile.rate("prefill", plant.profile.maximum_clock_mhz)
    for record in result.request_records:
        assert record.ttft_s == pytest.approx(0.4 + record.prompt_tokens / rate, abs=1e-6)


def test_clock_event_reasons_follow_nvml_bits() -> None:
    from gpugov.plant.gpu_physics import (
        CLOCK_EVENT_GPU_IDLE,
        CLOCK_EVENT_SW_POWER_CAP,
        CLOCK_EVENT_SW_THERMAL_SLOWDOWN,
    )

    idle = PlantSimulation((), make_plant())
    idle.advance_to(1.0)
    assert idle.clock_event_reasons == CLOCK_EVENT_GPU_IDLE
    capped = PlantSimulation(poisson_workload(8.0, 10.0, seed=4), make_plant(power_limit_w=330.0))
    seen: set[int] = set()
    for step in range(1, 100):
        capped.advance_to(step * 0.1)
        seen.add(capped.clock_event_reasons)
    assert any(reason & CLOCK_EVENT_SW_POWER_CAP for reason in seen)
    hot = PlantSimulation(
        poisson_workload(8.0, 60.0, seed=4),
        make_plant(thermal_limit_c=45.0, thermal_time_constant_s=5.0),
    )
    seen = set()
    for step in range(1, 600):
        hot.advance_to(step * 0.1)
        seen.add(hot.clock_event_reasons)
    assert any(reason & CLOCK_EVENT_SW_THERMAL_SLOWDOWN for reason in seen)


def test_energy_known_answer_for_one_request_at_a_fixed_clock() -> None:
    """Idle, then chunked prefill, then decode at batch 1: energy from the profile alone."""
    plant = make_plant(actuation_delay_s=0.0)
    profile = plant.profile
    clock = 1200.0
    prompt, output, arrival = 1500, 40, 2.5
    simulation = PlantSimulation(
        (Request(0, arrival, prompt, output),), plant, initial_clock_mhz=clock
    )
    while not simulation.done:
        simulation.advance_to(simulation.time_s + 1.0, stop_when_done=True)
    model = profile.decode_latency_model
    t_ref = model.reference_batch_size / profile.rate("decode", clock)
    c_ref = model.reference_batch_size * model.reference_context_tokens
    # Decode iteration j runs with context prompt + j (the first token came with prefill).
    decode_times = [
        t_ref
        * (
            model.weight_fraction
            + model.batch_fraction / model.reference_batch_size
            + model.kv_fraction * (prompt + j) / c_ref
        )
        for j in range(output - 1)
    ]
    idle = profile.power("idle", clock)
    batch_factor = profile.decode_power_batch_model.factor(1, model.reference_batch_size)
    decode_power = idle + (profile.power("decode", clock) - idle) * batch_factor
    prefill_time = prompt / profile.rate("prefill", clock)
    expected_energy = (
        idle * arrival
        + profile.power("prefill", clock) * prefill_time
        + decode_power * sum(decode_times)
    )
    expected_end = arrival + prefill_time + sum(decode_times)
    assert simulation.time_s == pytest.approx(expected_end, rel=1e-12)
    assert simulation.energy_j == pytest.approx(expected_energy, rel=1e-9)
    record = simulation.records()[0]
    assert record.ttft_s == pytest.approx(prefill_time, rel=1e-12)
    assert record.tpot_s == pytest.approx(sum(decode_times) / (output - 1), rel=1e-12)


def test_a_request_cut_short_stops_generating() -> None:
    from gpugov.plant import PlantSimulation

    simulation = PlantSimulation((), make_plant(), seed=0, fast_forward=True)
    running = simulation.add_request(64, 5000)
    simulation.advance_to(1.0)
    produced = simulation.generated_tokens(running)
    assert 1 < produced < 5000
    waiting = simulation.add_request(64, 5000)  # arrives now, not yet prefilled
    simulation.cut_short(running)
    simulation.cut_short(waiting)
    simulation.advance_to(2.0)
    _, finish = simulation.request_times()
    assert finish[running] is not None and finish[waiting] is not None
    assert simulation.generated_tokens(running) <= produced + 2  # ended after an iteration
    assert simulation.generated_tokens(waiting) == 1  # ended with its prefill's token
    assert simulation.observe().decode_active == 0 and simulation.observe().kv_tokens == 0
    simulation.cut_short(running)  # a finished request is left alone
    assert simulation.generated_tokens(running) <= produced + 2


def test_engine_step_counters_count_every_step_and_its_tokens() -> None:
    # Every step runs its prefill chunk tokens plus one token per decoding request: over
    # a drained run without preemptions that is every prompt token and every output
    # token but the first (a prefill's). Fast-forwarded stretches count step by step.
    from gpugov.plant.engine_counters import ITERATION_TOKEN_BUCKETS

    plant = make_plant()
    workload = poisson_workload(3.0, 40.0, seed=5)
    counts = []
    for fast in (True, False):
        simulation = PlantSimulation(workload, plant, fast_forward=fast)
        simulation.advance_to(workload[-1].arrival_time_s + 600.0)
        records = simulation.result().request_records
        assert all(r.finish_time_s is not None and r.preemptions == 0 for r in records)
        expected = sum(r.prompt_tokens + r.output_tokens - 1 for r in records)
        assert simulation.iteration_tokens == expected
        per_bucket = simulation.iteration_token_counts()
        assert len(per_bucket) == len(ITERATION_TOKEN_BUCKETS) + 1
        assert simulation.iterations == sum(per_bucket)
        # At least as many steps as the longest request's decode tokens, at most one
        # per token.
        assert max(r.output_tokens for r in records) <= simulation.iterations <= expected
        counts.append(per_bucket)
    assert counts[0] == counts[1]


def test_recent_utilization_is_the_busy_share_of_the_last_samples() -> None:
    # NVML-like: the share of the last span's grid samples at which an iteration ran.
    simulation = PlantSimulation((Request(0, 0.0, 2000, 300),), make_plant())
    assert simulation.recent_utilization(1.0) == 0.0
    simulation.advance_to(1.0)
    assert simulation.recent_utilization(1.0) == pytest.approx(1.0)
    simulation.advance_to(60.0)
    finish = simulation.result().request_records[0].finish_time_s
    assert finish is not None and finish > 1.5
    assert simulation.recent_utilization(1.0) == 0.0
    again = PlantSimulation((Request(0, 0.0, 2000, 300),), make_plant())
    again.advance_to(finish + 0.5)
    assert again.recent_utilization(1.0) == pytest.approx(0.5, abs=0.15)


def test_the_recent_inter_token_latency_is_what_the_iterations_took() -> None:
    """An iteration that a clock change lands in runs its segments at two clocks; the
    window's inter-token latency counted it at the last clock's full duration, so it
    differed from the request's own TPOT. Back-to-back decodes of one request: the two
    agree exactly."""
    plant = make_plant(actuation_delay_s=0.013)
    simulation = PlantSimulation([Request(0, 0.0, 100, 200)], plant)
    clocks = plant.profile.clock_mhz
    step = 0
    while not simulation.done:
        step += 1
        simulation.advance_to(0.05 * step, stop_when_done=True)
        simulation.request_clock(float(clocks[0] if step % 2 else clocks[-1]))
    record = simulation.records()[0]
    assert record.tpot_s is not None
    assert simulation.observe().tpot_recent_s == pytest.approx(record.tpot_s, rel=1e-9)


def test_a_thermal_limit_below_the_lowest_clocks_draw_is_held_by_slowing() -> None:
    """Where even the lowest clock draws more than the power whose steady temperature is
    the thermal limit, the GPU is slowed at that clock to draw that power, as the board
    limit's slowdown does: it ran on at the lowest clock's draw, its die settling above
    the limit for the rest of the run."""
    probe = GpuParameters.from_plant(make_plant())
    workload = [Request(i, 0.0, 200, 2000) for i in range(64)]
    decode_draw = GpuPhysics(probe, 0).iteration_parts(0, 0, len(workload), 0, 1.0)[2]
    safe = 0.5 * (max(probe.idle_power_w) + decode_draw)
    assert max(probe.idle_power_w) < safe < decode_draw
    limit_c = probe.ambient_temperature_c + probe.thermal_resistance_c_per_w * safe
    plant = make_plant(thermal_limit_c=limit_c, thermal_time_constant_s=5.0)
    result = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller)
    metrics = result.metrics
    assert metrics.completed_requests == len(workload)
    # Over the last half the die stays within an iteration's overshoot of the limit; it
    # rose towards the lowest clock's steady temperature, 0.8 C above.
    settled = result.temperature_c[result.time_s > 0.5 * metrics.simulated_duration_s]
    assert settled.size and float(np.max(settled)) < limit_c + 0.1
    split = metrics.prefill_energy_j + metrics.decode_energy_j + metrics.idle_energy_j
    assert split == pytest.approx(metrics.energy_j, rel=1e-9)


@pytest.mark.parametrize(("prompt", "output"), [(2.5, 3), (64, 0), (0, 4), (64, -1)])
def test_a_request_added_online_with_a_length_that_is_no_positive_whole_token_is_refused(
    plant, prompt, output
) -> None:  # type: ignore[no-untyped-def]
    """``add_request`` refuses a fractional, zero or negative length (it took 2.5 prompt
    tokens as 2 and checked the KV cache with 2.5) and leaves the workload as it was."""
    simulation = PlantSimulation((), plant)
    with pytest.raises(ValueError):
        simulation.add_request(prompt, output)
    assert len(simulation.requests) == 0
    assert simulation.add_request(64, 4) == 0
