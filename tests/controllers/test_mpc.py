"""Tests of the MPC clock controller: model, cost, brute force, fallbacks, diagnostics."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from synthetic import make_plant

from gpugov.controllers.mpc.controller import (
    FALLBACK_REASONS,
    MPCController,
    MPCProblem,
    MPCWeights,
    SolveOutcome,
    estimate_decode_remaining_tokens,
    expected_output_tokens_forecast,
    mpc_fluid_rollout,
    mpc_latency_proxies,
    refine_discrete_plan,
    run_mpc,
)
from gpugov.plant.types import MPCDiagnostics, ServingObservation


def _observation(
    time_s: float = 10.0,
    *,
    arrived: int = 0,
    prefill_tokens: float = 0.0,
    decode_active: int = 0,
    generated: float = 0.0,
    temperature_c: float = 45.0,
    supported: tuple[float, ...] = (),
    step_index: int | None = None,
) -> ServingObservation:
    return ServingObservation(
        time_s=time_s,
        step_index=int(round(time_s * 10)) if step_index is None else step_index,
        arrived_requests=arrived,
        prefill_remaining_tokens=prefill_tokens,
        decode_active=decode_active,
        generated_decode_tokens=generated,
        temperature_c=temperature_c,
        supported_clocks_mhz=supported,
    )


def _random_states(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        observation = _observation(
            prefill_tokens=float(rng.uniform(0, 4_000)),
            decode_active=int(rng.integers(0, 15)),
            generated=float(rng.uniform(0, 1_000)),
            temperature_c=float(rng.uniform(30, 60)),
        )
        yield observation, float(rng.uniform(0, 4)), int(rng.integers(0, 9))


# ------------------------------------------------------------ the seed's model
def _seed_rollout(
    clock_mhz,
    *,
    initial_prefill_tokens,
    initial_decode_tokens,
    initial_active_decode,
    prompt_arrivals,
    mean_prompt_tokens,
    mean_output_tokens,
    plant,
    control_period_s,
    initial_temperature_c,
):
    """The seed's ``_mpc_fluid_rollout``, verbatim apart from layout."""
    steps = clock_mhz.size
    profile = plant.profile
    prefill = np.empty(steps + 1)
    decode = np.empty(steps + 1)
    active = np.empty(steps + 1)
    temperature = np.empty(steps + 1)
    normalized_power = np.empty(steps)
    ttft_proxy = np.empty(steps)
    tpot_proxy = np.empty(steps)
    prefill[0] = max(0.0, initial_prefill_tokens)
    decode[0] = max(0.0, initial_decode_tokens)
    active[0] = max(0.0, initial_active_decode)
    temperature[0] = initial_temperature_c
    maximum_power = max(profile.prefill_power_w[-1], profile.decode_power_w[-1])
    decay = np.exp(-control_period_s / plant.thermal_time_constant_s)
    for index, clock in enumerate(clock_mhz):
        available_prefill = prefill[index] + prompt_arrivals[index]
        if available_prefill > 1e-12 and decode[index] > 1e-12:
            prefill_share = decode_share = 0.5
        elif available_prefill > 1e-12:
            prefill_share, decode_share = 1.0, 0.0
        elif decode[index] > 1e-12:
            prefill_share, decode_share = 0.0, 1.0
        else:
            prefill_share = decode_share = 0.0
        capacity = profile.rate("prefill", float(clock)) * control_period_s * prefill_share
        served_prefill = min(available_prefill, capacity)
        completed_prefill = served_prefill / max(mean_prompt_tokens, 1.0)
        prefill[index + 1] = max(0.0, available_prefill - served_prefill)
        available_decode = decode[index] + completed_prefill * mean_output_tokens
        capacity = profile.rate("decode", float(clock)) * control_period_s * decode_share
        served_decode = min(available_decode, capacity)
        completed_decode = served_decode / max(mean_output_tokens, 1.0)
        decode[index + 1] = max(0.0, available_decode - served_decode)
        active[index + 1] = max(0.0, active[index] + completed_prefill - completed_decode)
        ttft_proxy[index], tpot_proxy[index] = mpc_latency_proxies(
            prefill[index + 1], active[index + 1], float(clock), profile
        )
        if prefill_share > 0.0 and decode_share > 0.0:
            power = 0.5 * (profile.power("prefill", clock) + profile.power("decode", clock))
        elif prefill_share > 0.0:
            power = profile.power("prefill", float(clock))
        elif decode_share > 0.0:
            power = profile.power("decode", float(clock))
        else:
            power = profile.power("idle", float(clock))
        normalized_power[index] = power / maximum_power
        equilibrium = plant.ambient_temperature_c + plant.thermal_resistance_c_per_w * power
        temperature[index + 1] = equilibrium + (temperature[index] - equilibrium) * decay
    return prefill, decode, active, temperature, normalized_power, ttft_proxy, tpot_proxy


def _seed_objective(problem: MPCProblem, sequence: np.ndarray) -> float:
    """The seed's objective closure, verbatim apart from names."""
    profile = problem.plant.profile
    prefill, decode, _, temperature, power, ttft, tpot = _seed_rollout(
        sequence,
        initial_prefill_tokens=problem.initial_prefill_tokens,
        initial_decode_tokens=problem.initial_decode_tokens,
        initial_active_decode=problem.initial_active_decode,
        prompt_arrivals=problem.prompt_arrivals,
        mean_prompt_tokens=problem.mean_prompt_tokens,
        mean_output_tokens=problem.mean_output_tokens,
        plant=problem.plant,
        control_period_s=problem.control_period_s,
        initial_temperature_c=problem.initial_temperature_c,
    )
    minimum, maximum = profile.minimum_clock_mhz, profile.maximum_clock_mhz
    normalized = (sequence - minimum) / (maximum - minimum)
    previous = (problem.previous_clock_mhz - minimum) / (maximum - minimum)
    changes = np.diff(np.concatenate([[previous], normalized]))
    ttft_slack = np.maximum(0.0, ttft - profile.ttft_slo_s) / profile.ttft_slo_s
    tpot_slack = np.maximum(0.0, tpot - profile.tpot_slo_s) / profile.tpot_slo_s
    maximum_power = max(profile.prefill_power_w[-1], profile.decode_power_w[-1])
    power_slack = np.maximum(0.0, power - problem.plant.power_limit_w / maximum_power)
    thermal_slack = np.maximum(0.0, temperature[1:] - problem.plant.thermal_limit_c)
    terminal = prefill[-1] / profile.prefill_tokens_per_s[-1] + (
        decode[-1] / profile.decode_tokens_per_s[-1]
    )
    return float(
        np.sum(power)
        + 20.0 * np.sum(ttft_slack**2)
        + 10.0 * np.sum(tpot_slack**2)
        + 0.05 * np.sum(changes**2)
        + 1_000.0 * np.sum(power_slack**2 + thermal_slack**2)
        + 20.0 * terminal**2
    )


def _problem(plant, observation, rate, clock_index=0, horizon_s=3.0) -> MPCProblem:
    controller = MPCController(
        plant,
        horizon_s=horizon_s,
        mean_prompt_tokens=1_000.0,
        mean_output_tokens=150.0,
        solve_time_limit_s=60.0,
    )
    controller.current_clock = float(plant.profile.clock_mhz[clock_index])
    return controller.problem(observation, rate)


def test_rollout_and_cost_equal_the_seed(synthetic_plant):
    rng = np.random.default_rng(3)
    for observation, rate, clock_index in _random_states(20, seed=4):
        problem = _problem(synthetic_plant, observation, rate, clock_index, horizon_s=10.0)
        sequence = rng.uniform(900.0, 1980.0, size=10)
        ours = problem.rollout(sequence)
        seed = _seed_rollout(
            sequence,
            initial_prefill_tokens=problem.initial_prefill_tokens,
            initial_decode_tokens=problem.initial_decode_tokens,
            initial_active_decode=problem.initial_active_decode,
            prompt_arrivals=problem.prompt_arrivals,
            mean_prompt_tokens=problem.mean_prompt_tokens,
            mean_output_tokens=problem.mean_output_tokens,
            plant=problem.plant,
            control_period_s=problem.control_period_s,
            initial_temperature_c=problem.initial_temperature_c,
        )
        for mine, theirs in zip(
            (
                ours.prefill_tokens,
                ours.decode_tokens,
                ours.active_decode,
                ours.temperature_c,
                ours.normalized_power,
                ours.ttft_proxy_s,
                ours.tpot_proxy_s,
            ),
            seed,
            strict=True,
        ):
            np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=1e-12)
        assert problem.cost(sequence) == pytest.approx(
            _seed_objective(problem, sequence), rel=1e-12
        )


def test_batched_costs_equal_scalar_cost(synthetic_plant):
    rng = np.random.default_rng(5)
    for observation, rate, clock_index in _random_states(10, seed=6):
        problem = _problem(synthetic_plant, observation, rate, clock_index, horizon_s=6.0)
        batch = rng.uniform(900.0, 1980.0, size=(25, 6))
        batch[:5] = synthetic_plant.profile.clock_mhz[rng.integers(0, 9, size=(5, 6))]
        expected = [problem.cost(row) for row in batch]
        np.testing.assert_allclose(problem.costs(batch), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"clock sequence must have shape \(6,\)"):
        problem.cost(np.ones(3))


def test_public_model_functions(synthetic_profile, synthetic_plant):
    assert estimate_decode_remaining_tokens(4, 100.0, 150.0) == 500.0
    assert estimate_decode_remaining_tokens(1, 900.0, 150.0) == 0.0
    ttft, tpot = mpc_latency_proxies(6_000.0, 25.0, 1980.0, synthetic_profile)
    assert ttft == pytest.approx(0.5) and tpot == pytest.approx(0.01)
    assert mpc_latency_proxies(-5.0, -1.0, 900.0, synthetic_profile) == (0.0, 0.0)
    idle = mpc_fluid_rollout(
        np.full(3, 900.0),
        initial_prefill_tokens=0.0,
        initial_decode_tokens=0.0,
        initial_active_decode=0.0,
        prompt_arrivals=np.zeros(3),
        mean_prompt_tokens=1_000.0,
        mean_output_tokens=150.0,
        plant=synthetic_plant,
        control_period_s=1.0,
        initial_temperature_c=30.0,
    )
    np.testing.assert_allclose(idle[4], 80.0 / 650.0)  # idle power over maximum power


# ----------------------------------------------------------------- brute force
@pytest.mark.parametrize("horizon_s", [2.0, 3.0])
def test_mpc_matches_brute_force_on_tiny_horizons(synthetic_plant, horizon_s):
    """The applied (supported-clock) plan against every supported-clock plan."""
    steps = int(horizon_s)
    clocks = synthetic_plant.profile.clock_mhz
    every_plan = np.array(list(itertools.product(clocks, repeat=steps)))
    gaps, seed_gaps = [], []
    for observation, rate, clock_index in _random_states(40, seed=11):
        controller = MPCController(
            synthetic_plant,
            horizon_s=horizon_s,
            mean_prompt_tokens=1_000.0,
            mean_output_tokens=150.0,
            solve_time_limit_s=60.0,
            discrete_refinement=True,
        )
        controller.current_clock = float(clocks[clock_index])
        problem = controller.problem(observation, rate)
        plan, reason, _ = controller.solve(problem)
        assert reason is None and plan is not None
        assert set(plan) <= set(clocks)
        best = float(np.min(problem.costs(every_plan)))
        cost = problem.cost(plan)
        assert cost >= best - 1e-12
        gaps.append((cost - best) / best)
        controller.discrete_refinement = False  # the seed's downward rounding
        seed_plan, _, _ = controller.solve(problem)
        seed_gaps.append((problem.cost(seed_plan) - best) / best)
    gaps_array, seed_array = np.array(gaps), np.array(seed_gaps)
    # The refined plan is never worse than the seed's rounding of the same solve.
    assert np.all(gaps_array <= seed_array + 1e-12)
    # It is the brute-force optimum in the large majority of states; the rest are local
    # minima of SLSQP on a cost that jumps where a phase's work runs out.
    assert np.mean(gaps_array < 1e-9) >= 0.9
    assert np.median(gaps_array) == 0.0
    assert np.mean(gaps_array < 0.01) > np.mean(seed_array < 0.01)


def test_known_answers(synthetic_plant):
    clocks = synthetic_plant.profile.clock_mhz
    every_plan = np.array(list(itertools.product(clocks, repeat=3)))
    # Nothing to do: the minimum clock everywhere.
    quiet = _problem(synthetic_plant, _observation(), 0.0)
    controller = MPCController(synthetic_plant, horizon_s=3.0, solve_time_limit_s=60.0)
    plan, _, _ = controller.solve(quiet)
    np.testing.assert_array_equal(plan, [900.0] * 3)
    assert quiet.cost(plan) == pytest.approx(float(np.min(quiet.costs(every_plan))))
    # A long prefill queue: the maximum clock everywhere.
    busy = _problem(synthetic_plant, _observation(prefill_tokens=60_000.0), 2.0, 8)
    controller.current_clock = 1980.0
    plan, _, _ = controller.solve(busy)
    np.testing.assert_array_equal(plan, [1980.0] * 3)


def test_refinement_is_never_worse_than_downward_rounding(synthetic_plant):
    for observation, rate, clock_index in _random_states(10, seed=21):
        problem = _problem(synthetic_plant, observation, rate, clock_index, horizon_s=5.0)
        continuous = np.random.default_rng(clock_index).uniform(900.0, 1980.0, size=5)
        down = np.array([synthetic_plant.profile.quantize_clock(v) for v in continuous])
        refined = refine_discrete_plan(problem, continuous)
        assert problem.cost(refined) <= problem.cost(down) + 1e-12


# -------------------------------------------------------------------- fallbacks
class _FailingSolver:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, objective, initial, bounds):  # type: ignore[no-untyped-def]
        self.calls += 1
        return SolveOutcome(x=np.asarray(initial), success=False, message="Iteration limit")


class _RaisingSolver:
    def __call__(self, objective, initial, bounds):  # type: ignore[no-untyped-def]
        raise FloatingPointError("overflow in objective")


class _SteppingTimer:
    """Each call advances by ``step_s``: a solve appears to take ``step_s`` seconds."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def _fallback_recorder(value: float):
    seen: list[ServingObservation] = []

    def fallback(observation: ServingObservation) -> float:
        seen.append(observation)
        return value

    return fallback, seen


def test_failed_solve_falls_back_and_is_counted(synthetic_plant):
    fallback, seen = _fallback_recorder(1_500.0)
    solver = _FailingSolver()
    controller = MPCController(synthetic_plant, solver=solver, fallback=fallback)
    clock = controller(_observation(0.0, step_index=0))
    assert clock == 1440.0  # 1500 quantised downward onto the supported set
    assert seen and seen[0].supported_clocks_mhz == tuple(synthetic_plant.profile.clock_mhz)
    assert controller.plans_by_step[0] == (1440.0,)
    diagnostics = controller.diagnostics()
    assert diagnostics.fallback_count == 1 and diagnostics.successful_solves == 0
    assert diagnostics.fallback_reasons == {
        "solver_failed": 1,
        "overrun": 0,
        "exception": 0,
        "budget": 0,
    }
    assert controller.last_error == "Iteration limit"


def test_overrun_falls_back(synthetic_plant):
    fallback, _ = _fallback_recorder(1_980.0)
    controller = MPCController(
        synthetic_plant, fallback=fallback, timer=_SteppingTimer(1.0), solve_time_limit_s=0.8
    )
    assert controller(_observation(0.0)) == 1980.0
    assert controller.diagnostics().fallback_reasons["overrun"] == 1
    np.testing.assert_array_equal(controller.diagnostics().solve_times_s, [1.0])
    # A limit of zero discards every solve with the real timer too.
    strict = MPCController(synthetic_plant, fallback=fallback, solve_time_limit_s=0.0)
    strict(_observation(0.0))
    strict(_observation(1.0))
    assert strict.diagnostics().fallback_reasons == {
        "solver_failed": 0,
        "overrun": 2,
        "exception": 0,
        "budget": 0,
    }


def test_solver_exception_becomes_a_fallback(synthetic_plant):
    fallback, _ = _fallback_recorder(1_170.0)
    controller = MPCController(synthetic_plant, solver=_RaisingSolver(), fallback=fallback)
    assert controller(_observation(0.0)) == 1170.0
    assert controller.diagnostics().fallback_reasons["exception"] == 1
    assert controller.last_error == "FloatingPointError: overflow in objective"


def test_default_fallback_is_the_reactive_governor(synthetic_plant):
    controller = MPCController(synthetic_plant, solver=_FailingSolver())
    # Nothing queued or running and no utilisation reading: the governor's idle rule.
    assert controller(_observation(0.0)) == synthetic_plant.profile.minimum_clock_mhz


# ----------------------------------------------------------- loop and diagnostics
def test_one_solve_per_control_period(synthetic_plant):
    solver = _FailingSolver()
    fallback, _ = _fallback_recorder(1_305.0)
    controller = MPCController(
        synthetic_plant, solver=solver, fallback=fallback, control_period_s=1.0
    )
    for time_s in (0.0, 0.3, 0.9999):
        controller(_observation(time_s))
    assert solver.calls == 1
    controller(_observation(1.0))
    assert solver.calls == 2


def test_arrival_rate_uses_a_sliding_window(synthetic_plant):
    controller = MPCController(synthetic_plant)
    assert controller._arrival_rate(_observation(0.0, arrived=0)) == 0.0
    # 10 arrivals seen at t=0.5: window is max(t, period) = 1 s.
    assert controller._arrival_rate(_observation(0.5, arrived=10)) == 10.0
    assert controller._arrival_rate(_observation(20.0, arrived=30)) == pytest.approx(30 / 20)
    # At t=31 the 10 arrivals stamped 0.5 s have left the 30 s window.
    assert controller._arrival_rate(_observation(31.0, arrived=30)) == pytest.approx(20 / 30)
    problem = controller.problem(_observation(31.0, arrived=30), 2.0)
    np.testing.assert_allclose(problem.prompt_arrivals, 2.0 * controller.mean_prompt_tokens)
    assert problem.horizon_steps == 10


def test_a_started_engine_s_lifetime_count_is_no_arrivals(synthetic_plant):
    """A node's first observation reads the engine's counter since it started: with
    requests already completed, that count is the baseline, not a burst of arrivals."""
    from dataclasses import replace

    controller = MPCController(synthetic_plant)
    first = replace(_observation(0.001, arrived=40_000), completed_requests=39_990)
    assert controller._arrival_rate(first) == 0.0
    later = replace(_observation(0.5, arrived=40_010), completed_requests=39_995)
    assert controller._arrival_rate(later) == 10.0
    # A fresh engine (nothing completed): its first arrivals are arrivals.
    fresh = MPCController(synthetic_plant)
    assert fresh._arrival_rate(_observation(0.5, arrived=10)) == 10.0


def test_diagnostics_shape(synthetic_plant, workload_factory):
    controller = MPCController(synthetic_plant)
    for step in range(5):
        controller(_observation(float(step), arrived=3 * step, prefill_tokens=500.0 * step))
    diagnostics = controller.diagnostics()
    assert isinstance(diagnostics, MPCDiagnostics)
    assert diagnostics.solve_times_s.shape == (5,)
    assert np.all(diagnostics.solve_times_s >= 0.0)
    assert diagnostics.successful_solves + diagnostics.fallback_count == 5
    assert set(diagnostics.fallback_reasons) == set(FALLBACK_REASONS)
    assert sum(diagnostics.fallback_reasons.values()) == diagnostics.fallback_count
    assert (diagnostics.control_period_s, diagnostics.horizon_steps) == (1.0, 10)
    assert diagnostics.solve_time_limit_s == 0.8
    assert controller.__name__ == "mpc-slsqp" and controller.plan_dt_s == 1.0
    assert len(controller.plans_by_step) == 5
    for step, plan in controller.plans_by_step.items():
        assert len(plan) in (1, 10)
        assert controller.plan_start_times_by_step[step] == pytest.approx(step / 10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mean_output_tokens": 0.0}, "mean_output_tokens must be finite and positive"),
        ({"mean_prompt_tokens": float("nan")}, "mean_prompt_tokens must be finite"),
        ({"horizon_s": -1.0}, "horizon_s must be finite and positive"),
        ({"control_period_s": 0.0}, "control_period_s must be finite and positive"),
        ({"solve_time_limit_s": -0.1}, "solve_time_limit_s must be finite and >= 0"),
    ],
)
def test_constructor_validation(synthetic_plant, kwargs, message):
    with pytest.raises(ValueError, match=message):
        MPCController(synthetic_plant, **kwargs)


def test_weights_validation():
    with pytest.raises(ValueError, match=r"MPCWeights\.ttft must be finite and >= 0"):
        MPCWeights(ttft=-1.0)


def test_from_profile_needs_no_workload(synthetic_profile):
    controller = MPCController.from_profile(
        synthetic_profile, plant_overrides={"power_limit_w": 500.0}, mean_output_tokens=200.0
    )
    assert controller.plant.power_limit_w == 500.0
    assert controller.mean_output_tokens == 200.0
    assert math.isfinite(controller(_observation(0.0, decode_active=3, generated=20.0)))


# --------------------------------------------------------------- closed loop
def test_run_mpc_on_the_plant(synthetic_plant, workload_factory):
    workload = workload_factory(60, spacing_s=0.25, prompt=900, output=120)
    result = run_mpc(workload, synthetic_plant)
    summary = result.metadata["mpc"]
    assert result.controller_name == "MPC"
    assert result.scheduler_name == "512-token interleaved chunked-prefill surrogate"
    assert summary["expected_output_tokens"] == expected_output_tokens_forecast(workload)
    assert summary["successful_solves"] + summary["fallback_count"] == summary["solves"] > 0
    assert summary["seed_deviations"]
    assert result.metrics.completed_requests == 60
    assert set(result.requested_clock_mhz) <= set(synthetic_plant.profile.clock_mhz)
    declared = run_mpc(workload, synthetic_plant, expected_output_tokens=300.0)
    assert declared.metadata["mpc"]["expected_output_tokens"] == 300.0
    with pytest.raises(ValueError, match="workload must contain at least one request"):
        expected_output_tokens_forecast(())


def test_controller_is_deterministic(synthetic_plant):
    """The controller sees only observations and declared forecasts: same in, same out."""
    observations = [
        _observation(float(t), arrived=2 * t, prefill_tokens=300.0 * (t % 4), decode_active=t)
        for t in range(8)
    ]
    first = MPCController(synthetic_plant, mean_output_tokens=150.0)
    second = MPCController(synthetic_plant, mean_output_tokens=150.0)
    assert [first(o) for o in observations] == [second(o) for o in observations]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the seed solver on absurd forecasts
@pytest.mark.parametrize("jump", [10**8, 10**300], ids=["1e8", "1e300"])
def test_a_counter_jump_costs_a_tick_no_more_and_decides(jump: int) -> None:
    # A daemon started beside a long-running engine, or a counter gone wild: the arrival
    # estimate counts requests, it does not list them (a list took gigabytes and seconds).
    controller = MPCController(make_plant(), control_period_s=0.5, horizon_s=2.0)
    controller._arrival_rate(_observation(0.5, arrived=jump))
    assert len(controller.arrivals_seen) == 1
    assert controller.arrivals_in_window == jump
    # A counter that went back (an engine restart) starts again from its new value.
    controller._arrival_rate(_observation(1.0, arrived=3))
    controller._arrival_rate(_observation(1.5, arrived=5))
    assert controller.arrivals_in_window == jump + 2
    # Past the window only the new arrivals count; the decision is a supported clock.
    late = controller.arrival_window_s + 10.0
    assert controller._arrival_rate(_observation(late, arrived=9)) == pytest.approx(
        4 / controller.arrival_window_s
    )
    clock = controller(_observation(late + 0.5, arrived=10**300))
    assert clock in set(controller.plant.profile.clock_mhz.tolist())


def test_a_tick_with_no_temperature_plans_from_the_last_one_read(synthetic_plant):
    """A tick whose sensor gave no temperature (NaN: no GPU's reading came through) is
    planned from the last finite one, else the plant's ambient: a NaN start turned the
    thermal limit's check off (every comparison with NaN is false)."""
    controller = MPCController(synthetic_plant, control_period_s=1.0)
    controller(_observation(0.0, temperature_c=math.nan))
    assert controller.last_problem is not None
    assert controller.last_problem.initial_temperature_c == synthetic_plant.ambient_temperature_c
    controller(_observation(1.0, temperature_c=81.0))
    controller(_observation(2.0, temperature_c=math.nan))
    assert controller.last_problem.initial_temperature_c == 81.0
    # The same decision as with the temperature read.
    twin = MPCController(synthetic_plant, control_period_s=1.0)
    twin(_observation(0.0))
    twin(_observation(1.0, temperature_c=81.0))
    assert twin(_observation(2.0, temperature_c=81.0)) == controller.current_clock
