"""The discrete-search MPC solver and the iteration latency model: known answers."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from test_mpc import _observation, _random_states

from gpugov.controllers import compiled as compiled_module
from gpugov.controllers.mpc import search_kernel
from gpugov.controllers.mpc.controller import MPCController, MPCProblem
from gpugov.controllers.mpc.fast import DiscreteSearchSolver, plan_costs
from gpugov.controllers.mpc.model import MPCWeights
from gpugov.controllers.mpc.search_kernel import local_search, price_plans, problem_arrays
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, load_trace, simulate


def _problem(plant, observation, rate, clock_index, horizon_s, **options) -> MPCProblem:  # type: ignore[no-untyped-def]
    controller = MPCController(
        plant,
        horizon_s=horizon_s,
        mean_prompt_tokens=1_000.0,
        mean_output_tokens=150.0,
        solve_time_limit_s=60.0,
        **options,
    )
    controller.current_clock = float(plant.profile.clock_mhz[clock_index])
    return controller.problem(observation, rate)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"latency_model": "iteration"},
        {"latency_model": "iteration", "slo_margin": 0.7},
        {"latency_model": "iteration", "ttft_prompt_tokens": 4000.0},
        {"latency_model": "iteration", "ttft_prompt_tokens": 9000.0, "ttft_excess_cap": 0.5},
        {"ttft_excess_cap": 0.2},
        {"latency_model": "iteration", "ttft_excess_cap": 1.0, "terminal_queued_replies": True},
    ],
    ids=[
        "seed",
        "iteration",
        "iteration-margin",
        "iteration-tail-prompt",
        "iteration-capped",
        "seed-capped",
        "iteration-queued-replies",
    ],
)
def test_kernel_costs_equal_problem_costs(synthetic_plant, options) -> None:  # type: ignore[no-untyped-def]
    clocks = synthetic_plant.profile.clock_mhz
    rng = np.random.default_rng(3)
    for observation, rate, clock_index in _random_states(25, seed=5):
        problem = _problem(synthetic_plant, observation, rate, clock_index, 6.0, **options)
        levels = rng.integers(0, clocks.size, size=(40, problem.horizon_steps))
        expected = problem.costs(clocks[levels])
        np.testing.assert_allclose(plan_costs(problem, levels), expected, rtol=1e-12)
        assert problem.cost(clocks[levels[0]]) == pytest.approx(expected[0], rel=1e-12)


def test_a_pool_priced_from_shared_prefixes_costs_each_plan_as_priced_alone(  # type: ignore[no-untyped-def]
    synthetic_plant,
) -> None:
    """Rows of a sorted pool are rolled from where they leave the row before them: the
    costs are bit for bit those of each plan rolled from period 0 (a pool of one)."""
    clocks = synthetic_plant.profile.clock_mhz
    rng = np.random.default_rng(11)
    for observation, rate, clock_index in _random_states(10, seed=7):
        problem = _problem(
            synthetic_plant, observation, rate, clock_index, 6.0, latency_model="iteration"
        )
        table, parameters, arrivals = problem_arrays(problem)
        steps = problem.horizon_steps
        # Few levels per period, so neighbours share long prefixes; a duplicate row too.
        levels = rng.integers(0, 3, size=(60, steps)) * (clocks.size // 3)
        pool = np.unique(np.concatenate([levels, levels[:1]]), axis=0).astype(np.int64)
        pool = np.concatenate([pool, pool[-1:]])
        blocks = np.arange(steps, dtype=np.int64)
        together = price_plans(pool, blocks, table, parameters, arrivals)
        alone = [price_plans(row[None, :], blocks, table, parameters, arrivals)[0] for row in pool]
        assert together.tolist() == alone
        np.testing.assert_allclose(together, problem.costs(clocks[pool]), rtol=1e-12)


def test_power_and_thermal_terms_counted_when_reachable(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    hot = synthetic_plant.with_overrides(power_limit_w=300.0, thermal_limit_c=40.0)
    observation = _observation(prefill_tokens=3_000.0, decode_active=8, temperature_c=39.0)
    problem = _problem(hot, observation, 2.0, 8, 4.0)
    levels = np.array([[8] * 4, [0] * 4, [4, 8, 0, 2]])
    _, parameters, _ = problem_arrays(problem)
    assert parameters[search_kernel._P_CHECK_POWER] == 1.0
    assert parameters[search_kernel._P_CHECK_THERMAL] == 1.0
    np.testing.assert_allclose(
        plan_costs(problem, levels), problem.costs(hot.profile.clock_mhz[levels]), rtol=1e-12
    )


@pytest.mark.parametrize("latency_model", ["seed", "iteration"])
def test_discrete_search_matches_brute_force_on_tiny_horizons(  # type: ignore[no-untyped-def]
    synthetic_plant, latency_model
) -> None:
    clocks = synthetic_plant.profile.clock_mhz
    every_plan = np.array(list(itertools.product(clocks, repeat=3)))
    solver = DiscreteSearchSolver()
    gaps = []
    for observation, rate, clock_index in _random_states(40, seed=11):
        problem = _problem(
            synthetic_plant, observation, rate, clock_index, 3.0, latency_model=latency_model
        )
        outcome = solver.solve_problem(problem, None)
        assert outcome.success
        assert set(outcome.x) <= set(clocks)
        best = float(np.min(problem.costs(every_plan)))
        cost = problem.cost(outcome.x)
        assert cost >= best - 1e-12
        gaps.append((cost - best) / best)
    assert np.mean(np.array(gaps) < 1e-9) >= 0.95
    assert max(gaps) < 0.01


def test_discrete_search_never_worse_than_every_constant_plan(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    solver = DiscreteSearchSolver()
    clocks = synthetic_plant.profile.clock_mhz
    for observation, rate, clock_index in _random_states(20, seed=2):
        problem = _problem(synthetic_plant, observation, rate, clock_index, 10.0)
        plan = solver.solve_problem(problem, None).x
        constants = problem.costs(np.repeat(clocks[:, None], problem.horizon_steps, axis=1))
        assert problem.cost(plan) <= float(np.min(constants)) + 1e-12


def test_fast_mpc_in_the_loop_is_deterministic_and_uses_warm_starts() -> None:
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    workload, _ = load_trace("azure-conv-10min", duration_s=40)
    results = []
    for _ in range(2):
        controller = MPCController(
            plant,
            mean_prompt_tokens=1060.0,
            mean_output_tokens=206.0,
            solver=DiscreteSearchSolver(),
            latency_model="iteration",
            slo_margin=0.7,
            solve_time_limit_s=10.0,
        )
        result = simulate(workload, plant, chunked_prefill_scheduler, controller)
        assert controller.fallback_count == 0
        assert controller.last_plan is not None
        results.append(result)
    np.testing.assert_array_equal(results[0].requested_clock_mhz, results[1].requested_clock_mhz)
    assert set(np.unique(results[0].requested_clock_mhz)) <= set(plant.profile.clock_mhz)


def test_overrun_of_the_fast_solver_falls_back(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    controller = MPCController(
        synthetic_plant, solver=DiscreteSearchSolver(), solve_time_limit_s=0.0
    )
    supported = tuple(float(c) for c in synthetic_plant.profile.clock_mhz)
    controller(_observation(prefill_tokens=2_000.0, decode_active=3, supported=supported))
    assert controller.fallback_reasons["overrun"] == 1
    assert controller.last_plan is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"latency_model": "magic"}, "latency_model"),
        ({"slo_margin": 0.0}, "slo_margin"),
        ({"slo_margin": 1.5}, "slo_margin"),
    ],
)
def test_latency_model_and_margin_validated(synthetic_plant, kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        MPCController(synthetic_plant, **kwargs)


def test_long_horizons_use_move_blocking(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    solver = DiscreteSearchSolver(free_periods=5)
    observation = _observation(prefill_tokens=3_000.0, decode_active=6)
    problem = _problem(synthetic_plant, observation, 2.0, 4, 20.0)
    plan = solver.solve_problem(problem, None).x
    assert plan.shape == (20,)
    # Five blocks of four periods, one level each.
    assert all(len(set(plan[start : start + 4])) == 1 for start in range(0, 20, 4))
    clocks = synthetic_plant.profile.clock_mhz
    constants = problem.costs(np.repeat(clocks[:, None], 20, axis=1))
    assert problem.cost(plan) <= float(np.min(constants)) + 1e-12


def test_tail_prompt_raises_predicted_ttft(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    observation = _observation(prefill_tokens=2_000.0, decode_active=6)
    mean = _problem(synthetic_plant, observation, 2.0, 0, 3.0, latency_model="iteration")
    tail = _problem(
        synthetic_plant,
        observation,
        2.0,
        0,
        3.0,
        latency_model="iteration",
        ttft_prompt_tokens=5_000.0,
    )
    assert tail.ttft_prompt == 5_000.0 and mean.ttft_prompt == mean.mean_prompt_tokens
    plan = np.full(3, synthetic_plant.profile.minimum_clock_mhz)
    assert tail.cost(plan) > mean.cost(plan)


def test_local_search_prices_incrementally_and_returns_the_true_cost(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    """The search's incremental, pruned pricing reports exactly the full cost of the plan
    it returns, never above its start, and stays within its trial cap."""
    solver = DiscreteSearchSolver()
    levels = synthetic_plant.profile.clock_mhz.size
    rng = np.random.default_rng(7)
    for observation, rate, clock_index in _random_states(15, seed=9):
        for model in ("seed", "iteration"):
            problem = _problem(
                synthetic_plant, observation, rate, clock_index, 8.0, latency_model=model
            )
            table, parameters, arrivals = problem_arrays(problem)
            steps = np.arange(8, dtype=np.int64)
            start = rng.integers(0, levels, size=8).astype(np.int64)
            start_cost = price_plans(start[None, :], steps, table, parameters, arrivals)[0]
            plan, cost, trials = local_search(
                start.copy(),
                steps,
                solver.move_matrix(8),
                levels,
                300,
                table,
                parameters,
                arrivals,
            )
            assert trials <= 300
            assert cost <= start_cost
            assert cost == pytest.approx(
                problem.cost(synthetic_plant.profile.clock_mhz[plan]), rel=1e-12
            )


def test_every_search_is_bounded_by_its_trial_cap(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    solver = DiscreteSearchSolver(starts=3, maximum_trials=5)
    observation = _observation(prefill_tokens=3_000.0, decode_active=6)
    problem = _problem(synthetic_plant, observation, 2.0, 4, 10.0)
    outcome = solver.solve_problem(problem, None)
    assert outcome.success
    assert 0 < solver.last_trials <= 3 * 5


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("coarse_levels", 0),
        ("starts", 0),
        ("maximum_trials", 0),
        ("free_periods", 0),
        ("late_step_levels", -1),
        ("start_spread", -1),
        ("constant_stride", 0),
    ],
)
def test_solver_settings_validated(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=name):
        DiscreteSearchSolver(**{name: value})


def test_candidate_pool_holds_every_family() -> None:
    solver = DiscreteSearchSolver(coarse_levels=4, late_step_levels=2)
    pool = {tuple(row) for row in solver.candidates(5, 13, None)}
    assert (7, 7, 7, 7, 7) in pool  # constant, every level
    assert (0, 12, 12, 12, 12) in pool  # two-block on the coarse grid (0, 4, 8, 12)
    assert (12, 4, 12, 4, 12) in pool  # alternating
    assert (0, 0, 0, 8, 8) in pool and (2, 2, 12, 12, 12) in pool  # late steps
    warm = np.array([1, 2, 3, 4, 5])
    assert tuple(solver.candidates(5, 13, warm)[-1]) == (1, 2, 3, 4, 5)


def test_a_constant_stride_keeps_every_nth_constant_plan_and_the_top() -> None:
    solver = DiscreteSearchSolver(coarse_levels=4, late_step_levels=0, constant_stride=4)
    pool = {tuple(row) for row in solver.candidates(5, 14, None)}
    constants = sorted(row[0] for row in pool if len(set(row)) == 1)
    # Every 4th level and the top one; the coarse grid's levels are constants too
    # (two-block plans whose blocks agree).
    assert {0, 4, 8, 12, 13} <= set(constants)
    assert 7 not in constants and 2 not in constants


def test_kernels_compile_in_memory_where_no_cache_is_writable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """numba raises RuntimeError at decoration when cache=True finds no writable cache
    directory; the kernels then compile without a disk cache instead of failing import."""
    calls = []

    def fake_njit(*, cache: bool, nogil: bool, inline: str):  # type: ignore[no-untyped-def]
        calls.append(cache)
        if cache:
            raise RuntimeError("cannot cache function: no locator available")
        return lambda function: function

    monkeypatch.setattr(compiled_module, "njit", fake_njit)

    def kernel(x: float) -> float:
        return x + 1.0

    compiled = compiled_module.jit(kernel)
    assert calls == [True, False]
    assert compiled(1.0) == 2.0


def test_capped_ttft_penalty_stops_growing_past_the_cap(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    """Past ``ttft_excess_cap`` SLOs of excess, a later first token costs nothing more:
    the cost then differs between two hopeless backlogs only by their other terms."""
    observation = _observation(prefill_tokens=200_000.0, decode_active=4)
    # The TTFT term alone beside power (the TPOT and backlog terms prefer a fast clock
    # whatever the TTFT cap).
    weights = MPCWeights(tpot=0.0, terminal_backlog=0.0)
    capped = _problem(
        synthetic_plant,
        observation,
        2.0,
        0,
        3.0,
        latency_model="iteration",
        ttft_excess_cap=1.0,
        weights=weights,
    )
    uncapped = _problem(
        synthetic_plant, observation, 2.0, 0, 3.0, latency_model="iteration", weights=weights
    )
    assert capped.ttft_excess_cap_s == synthetic_plant.profile.ttft_slo_s
    assert uncapped.ttft_excess_cap_s == float("inf")
    clocks = synthetic_plant.profile.clock_mhz
    low, high = np.full(3, clocks[0]), np.full(3, clocks[-1])
    # Uncapped, the maximum clock's faster queue is worth its power; capped, every step
    # is hopeless either way and the minimum clock is cheaper.
    assert uncapped.cost(high) < uncapped.cost(low)
    assert capped.cost(low) < capped.cost(high)
    with pytest.raises(ValueError, match="ttft_excess_cap"):
        _problem(synthetic_plant, observation, 2.0, 0, 3.0, ttft_excess_cap=0.0)


@pytest.mark.parametrize("mean_output", [20.0, 150.0])
def test_kernel_costs_equal_problem_costs_for_short_and_long_answers(
    synthetic_plant,
    mean_output: float,  # type: ignore[no-untyped-def]
) -> None:
    clocks = synthetic_plant.profile.clock_mhz
    rng = np.random.default_rng(4)
    for observation, rate, clock_index in _random_states(15, seed=6):
        controller = MPCController(
            synthetic_plant,
            horizon_s=6.0,
            mean_prompt_tokens=2_000.0,
            mean_output_tokens=mean_output,
            latency_model="iteration",
            solve_time_limit_s=60.0,
        )
        controller.current_clock = float(clocks[clock_index])
        problem = controller.problem(observation, rate)
        levels = rng.integers(0, clocks.size, size=(30, problem.horizon_steps))
        np.testing.assert_allclose(
            plan_costs(problem, levels), problem.costs(clocks[levels]), rtol=1e-12
        )


def test_short_answers_see_the_mixed_iteration_while_prompts_are_prefilled(
    synthetic_plant,  # type: ignore[no-untyped-def]
) -> None:
    observation = _observation(prefill_tokens=3_000.0, decode_active=8, temperature_c=40.0)

    def proxy(mean_output: float) -> tuple[float, float, float]:
        controller = MPCController(
            synthetic_plant,
            horizon_s=2.0,
            mean_prompt_tokens=2_000.0,
            mean_output_tokens=mean_output,
            latency_model="iteration",
        )
        problem = controller.problem(observation, 1.0)
        active, decode_rate = np.array([8.0]), np.array([2_000.0])
        served, prefill_rate = np.array([3_000.0]), np.array([20_000.0])
        t_dec = float(problem.decode_iteration_s(active, decode_rate)[0])
        value = float(problem.tpot_proxy(active, decode_rate, served, prefill_rate)[0])
        stretched = t_dec / (1.0 - 3_000.0 / (20_000.0 * problem.control_period_s))
        return value, t_dec, stretched

    short, t_dec, stretched = proxy(5.0)
    # A 5-token answer decodes entirely beside prefill chunks of 512 - 8 tokens.
    assert short == pytest.approx(t_dec + (512.0 - 8.0) / 20_000.0, rel=1e-9)
    long_answer, _, _ = proxy(5_000.0)
    # A long answer sees the period's average: about the stretched iteration.
    assert long_answer < short
    assert long_answer == pytest.approx(stretched, rel=0.05)


def test_a_prefill_filling_the_period_stretches_decode_at_most_to_one_chunk(
    synthetic_plant,  # type: ignore[no-untyped-def]
) -> None:
    """Chunked prefill never stalls the decode batch: however much of the period the
    prefill takes, the TPOT proxy is at most an iteration that carries one chunk."""
    observation = _observation(prefill_tokens=30_000.0, decode_active=8)
    controller = MPCController(
        synthetic_plant,
        horizon_s=2.0,
        mean_prompt_tokens=2_000.0,
        mean_output_tokens=150.0,
        latency_model="iteration",
    )
    problem = controller.problem(observation, 1.0)
    active, decode_rate, prefill_rate = np.array([8.0]), np.array([2_000.0]), np.array([20_000.0])
    t_dec = float(problem.decode_iteration_s(active, decode_rate)[0])
    mixed = t_dec + (512.0 - 8.0) / 20_000.0
    for share in (0.9, 0.99, 1.0):
        served = np.array([share * 20_000.0 * problem.control_period_s])
        value = float(problem.tpot_proxy(active, decode_rate, served, prefill_rate)[0])
        assert value <= mixed * (1.0 + 1e-12)
    assert value == pytest.approx(mixed, rel=1e-12)
    assert value < t_dec / 0.05  # the time-shared stretch of a stalled batch


@pytest.mark.parametrize("held_periods", [0.0, 1.0, 2.5, 4.0, float("inf")])
def test_plans_are_priced_as_the_dwell_applies_them(  # type: ignore[no-untyped-def]
    synthetic_plant, held_periods: float
) -> None:
    """With a dwell, a plan costs what the clocks the chain applies cost (a lower clock
    waits until the one before it has been held the dwell), in the Python model, the
    kernel, a pool priced from shared prefixes and the local search alike."""
    clocks = synthetic_plant.profile.clock_mhz
    rng = np.random.default_rng(17)
    blocks = np.arange(6, dtype=np.int64)
    moves = DiscreteSearchSolver().move_matrix(6)
    for observation, rate, clock_index in _random_states(8, seed=19):
        free = _problem(
            synthetic_plant, observation, rate, clock_index, 6.0, latency_model="iteration"
        )
        problem = replace(
            free, dwell_periods=4.0, held_clock_mhz=float(clocks[-2]), held_periods=held_periods
        )
        levels = rng.integers(0, clocks.size, size=(40, problem.horizon_steps))
        applied = problem.applied(clocks[levels])
        if held_periods < 4.0:
            assert np.all(applied[:, 0] >= clocks[-2])  # nothing falls before the dwell
        np.testing.assert_allclose(problem.costs(clocks[levels]), free.costs(applied), rtol=1e-12)
        np.testing.assert_allclose(
            plan_costs(problem, levels), problem.costs(clocks[levels]), rtol=1e-12
        )
        table, parameters, arrivals = problem_arrays(problem)
        pool = np.unique(levels // 3 * 3, axis=0).astype(np.int64)
        together = price_plans(pool, blocks, table, parameters, arrivals)
        alone = [price_plans(row[None, :], blocks, table, parameters, arrivals)[0] for row in pool]
        assert together.tolist() == alone
        plan, cost, _ = local_search(
            levels[0].astype(np.int64), blocks, moves, clocks.size, 300, table, parameters, arrivals
        )
        assert cost == pytest.approx(problem.cost(clocks[plan]), rel=1e-12)


def test_plans_are_applied_as_the_safety_chain_applies_them(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    """:meth:`MPCProblem.applied` is ``MinimumDwell`` run over the plan's periods."""
    from gpugov.daemon.safety import MinimumDwell

    clocks = synthetic_plant.profile.clock_mhz
    period, dwell_s = 0.25, 1.0
    problem = _problem(synthetic_plant, _observation(), 1.0, 0, 12 * period)
    problem = replace(problem, control_period_s=period, prompt_arrivals=np.zeros(12))
    rng = np.random.default_rng(23)
    for _ in range(30):
        held = float(clocks[rng.integers(0, clocks.size)])
        held_periods = int(rng.integers(0, 6))
        asked = clocks[rng.integers(0, clocks.size, size=12)]
        wishes = iter([held, *asked])
        chain = MinimumDwell(lambda observation, wishes=wishes: next(wishes), dwell_s)
        chain(_observation(time_s=-held_periods * period))
        expected = [chain(_observation(time_s=k * period)) for k in range(12)]
        case = replace(
            problem,
            dwell_periods=dwell_s / period,
            held_clock_mhz=held,
            held_periods=float(held_periods),
        )
        assert case.applied(asked)[0].tolist() == expected


def test_the_fast_mpc_tracks_the_clock_the_node_holds(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    """The held clock and how long it has been held come from the observations'
    locked clock: a change seen now was applied at the decision before."""
    clocks = synthetic_plant.profile.clock_mhz
    controller = MPCController(
        synthetic_plant,
        horizon_s=2.5,
        control_period_s=0.25,
        latency_model="iteration",
        solver=DiscreteSearchSolver(),
        dwell_s=1.0,
    )
    seen = []
    for time_s, locked in ((0.0, clocks[-1]), (0.25, clocks[3]), (0.5, clocks[3]), (0.75, None)):
        observation = replace(_observation(time_s=time_s), requested_clock_mhz=locked)
        controller(observation)
        problem = controller.last_problem
        assert problem is not None and problem.dwell_periods == pytest.approx(4.0)
        seen.append((problem.held_clock_mhz, problem.held_periods))
    assert seen[0] == (clocks[-1], float("inf"))
    assert seen[1] == (clocks[3], pytest.approx(1.0))
    assert seen[2] == (clocks[3], pytest.approx(2.0))
    assert seen[3][0] is None  # nothing locked: nothing held
    # A node's ticks wake a little after their targets: held since a tick that woke later,
    # the clock has been held whole periods, as the safety chain counts them.
    seen.clear()
    for time_s, locked in ((1.0003, clocks[-1]), (1.2502, clocks[3]), (1.5001, clocks[3])):
        observation = replace(_observation(time_s=time_s), requested_clock_mhz=locked)
        controller(observation)
        problem = controller.last_problem
        assert problem is not None
        seen.append((problem.held_clock_mhz, problem.held_periods))
    assert seen[1:] == [(clocks[3], 1.0), (clocks[3], 2.0)]
    with pytest.raises(ValueError, match="dwell_s"):
        MPCController(synthetic_plant, dwell_s=-1.0)


def test_the_power_need_ignores_the_dwell(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    """The need is what the load asks for at each clock held throughout: a hold the
    chain keeps at the top clock for the next periods does not change it."""
    from gpugov.controllers.power_need import need_from_problem

    clocks = synthetic_plant.profile.clock_mhz
    observation = _observation(prefill_tokens=500.0, decode_active=4)
    free = _problem(synthetic_plant, observation, 0.5, 0, 4.0, latency_model="iteration")
    held = replace(free, dwell_periods=4.0, held_clock_mhz=float(clocks[-1]), held_periods=0.0)
    assert need_from_problem(held) == need_from_problem(free)


def test_under_an_overload_the_queued_replies_make_the_top_clock_cheaper(synthetic_plant) -> None:  # type: ignore[no-untyped-def]
    """With the TTFT excess capped, a backlog no clock clears costs every plan the same
    TTFT term; the seed's terminal penalty then priced the lowest clock cheapest where a
    reply is more work than its prompt, as it prefills least and a queued prompt's reply
    counted only once prefilled (``mpc`` held about 540 MHz with 175 prompts waiting, at
    under half the top clock's attainment). Counting them, the top clock is cheaper."""

    def problem(counted: bool) -> MPCProblem:
        controller = MPCController(
            synthetic_plant,
            horizon_s=10.0,
            mean_prompt_tokens=300.0,
            mean_output_tokens=600.0,
            latency_model="iteration",
            ttft_excess_cap=1.0,
            terminal_queued_replies=counted,
        )
        controller.current_clock = float(synthetic_plant.profile.clock_mhz[0])
        # 200 prompts queued, 20 arriving a second: more replies than decode serves.
        return controller.problem(_observation(prefill_tokens=60_000.0, decode_active=40), 20.0)

    seed, counted = problem(False), problem(True)
    assert counted.terminal_queued_replies and not seed.terminal_queued_replies
    clocks = synthetic_plant.profile.clock_mhz
    low = np.full(seed.horizon_steps, clocks[0])
    high = np.full(seed.horizon_steps, clocks[-1])
    assert seed.cost(low) < seed.cost(high)
    assert counted.cost(high) < counted.cost(low)
    levels = np.zeros((1, seed.horizon_steps), dtype=np.int64)
    assert plan_costs(counted, levels)[0] == pytest.approx(counted.cost(low))
