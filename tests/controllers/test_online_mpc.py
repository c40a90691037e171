"""The self-calibrating MPC: known-answer identification, no profile access, safe
exploration on profiles of shapes the project never bundled, re-learning, bounded cost."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.identification import REFERENCE_BATCH, OnlineModel
from gpugov.controllers.online.regression import RecursiveLeastSquares
from gpugov.controllers.online.window import Window
from gpugov.plant import PerformanceProfile, ServingPlant, chunked_prefill_scheduler, simulate
from gpugov.plant.types import Request

# ---------------------------------------------------------------- the regression


def test_rls_converges_to_known_parameters_and_shrinks_uncertainty() -> None:
    rng = np.random.default_rng(0)
    truth = np.array([0.3, -1.2, 2.0])
    rls = RecursiveLeastSquares(np.zeros(3), np.eye(3) * 100.0, 1.0, forgetting=1.0)
    first_std = rls.predict(np.array([1.0, 1.0, 1.0]))[1]
    for _ in range(2000):
        x = rng.normal(size=3)
        rls.update(x, float(x @ truth + rng.normal(scale=0.05)))
    np.testing.assert_allclose(rls.mean, truth, atol=0.01)
    assert rls.predict(np.array([1.0, 1.0, 1.0]))[1] < 0.01 * first_std
    assert math.sqrt(rls.noise_variance) == pytest.approx(0.05, rel=0.3)


def test_rls_forgetting_tracks_a_changed_plant_and_stays_bounded() -> None:
    rng = np.random.default_rng(1)
    rls = RecursiveLeastSquares(np.zeros(2), np.eye(2), 1.0, forgetting=0.98)
    for truth in (np.array([1.0, 2.0]), np.array([3.0, -1.0])):
        for _ in range(600):
            x = rng.normal(size=2)
            rls.update(x, float(x @ truth + rng.normal(scale=0.01)))
        np.testing.assert_allclose(rls.mean, truth, atol=0.02)
    # No information for a long time: the covariance relaxes to the prior, never beyond.
    for _ in range(2000):
        rls.update(np.zeros(2), 0.0)
    assert np.all(np.linalg.eigvalsh(rls.prior_covariance - rls.covariance) >= -1e-9)


def test_the_compiled_step_is_the_kalman_update_and_gives_new_arrays() -> None:
    # The textbook form, in numpy, beside the compiled step the regression runs.
    rng = np.random.default_rng(7)
    n = 9
    root = rng.normal(size=(n, n))
    prior = root @ root.T + np.eye(n)
    rls = RecursiveLeastSquares(rng.normal(size=n), prior, 0.3, forgetting=0.97)
    for _ in range(25):
        x, y, weight = rng.normal(size=n), float(rng.normal()), float(rng.uniform(0.5, 2.0))
        mean, covariance = rls.mean, rls.covariance
        relaxed = 0.97 * covariance + 0.03 * prior
        px = relaxed @ x
        expected_innovation = y - x @ mean
        gain = px / (x @ px + rls.noise_variance / weight)
        expected = relaxed - np.outer(gain, px)
        innovation = rls.update(x, y, weight)
        assert innovation == pytest.approx(expected_innovation, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(rls.mean, mean + gain * expected_innovation, rtol=1e-10)
        np.testing.assert_allclose(rls.covariance, 0.5 * (expected + expected.T), atol=1e-10)
        np.testing.assert_array_equal(rls.covariance, rls.covariance.T)
        # New arrays each update: what caches a prediction on the estimate relies on.
        assert rls.mean is not mean and rls.covariance is not covariance


def test_building_the_controller_compiles_its_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    # At build time, before the node's loop starts: the first model update and the first
    # MPC solve come inside a control period, where a cold compile takes seconds.
    import gpugov.controllers.online.controller as online

    calls: list[str] = []
    monkeypatch.setattr(online, "compile_regression", lambda: calls.append("update"))
    monkeypatch.setattr(online, "compile_prediction", lambda: calls.append("predict"))
    monkeypatch.setattr(online, "compile_kernels", lambda: calls.append("search"))
    OnlineMPCController()
    assert sorted(calls) == ["predict", "search", "update"]


# ------------------------------------------------------ known-answer identification
TRUE_PREFILL_S = 4e-5  # s per prompt token at the top clock, compute-bound
TRUE_WEIGHTS_S = 0.008  # s per decode iteration, memory-bound (flat in clock)
TRUE_BATCH_S = 6e-5  # s per running request per iteration, compute-bound
TRUE_CONTEXT_S = 1.5e-8  # s per context token per iteration, memory-bound


def _true_busy(
    clock: float, top: float, prompt: float, iterations: float, tokens: float, context: float
) -> float:
    g = top / clock
    return (
        prompt * TRUE_PREFILL_S * g
        + iterations * TRUE_WEIGHTS_S
        + tokens * TRUE_BATCH_S * g
        + tokens * context * TRUE_CONTEXT_S
    )


def test_online_model_recovers_known_latency_and_power_curves() -> None:
    clocks = np.arange(600.0, 1801.0, 50.0)
    top = clocks[-1]
    model = OnlineModel(clocks, 600.0, knots=7, warmup_windows=10, memory_s=1e6)
    rng = np.random.default_rng(2)
    visited = clocks[::3]

    def true_power(clock: float, phase: str) -> float:
        x = clock / top
        return {"idle": 60 + 20 * x, "prefill": 120 + 380 * x**3, "decode": 100 + 200 * x**2}[phase]

    for step in range(4000):
        clock = float(top if step < 10 else rng.choice(visited))
        batch = float(rng.integers(4, 120))
        iterations = float(rng.integers(5, 40))
        tokens = batch * iterations
        context = float(rng.uniform(300, 3000))
        prompt = float(rng.integers(0, 6000))
        busy = _true_busy(clock, top, prompt, iterations, tokens, context)
        duration = busy / rng.uniform(0.4, 0.95)
        prefill_s = prompt * TRUE_PREFILL_S * top / clock
        energy = (
            true_power(clock, "idle") * (duration - busy)
            + true_power(clock, "prefill") * prefill_s
            + true_power(clock, "decode") * (busy - prefill_s)
        )
        model.update(
            Window(
                duration,
                busy * rng.normal(1.0, 0.01),
                prompt,
                tokens,
                iterations,
                context,
                energy,
                clock,
                clock,
                60.0,
                60.0,
            )
        )
    for clock in visited:
        mean, std = model.prefill_s_per_token(float(clock))
        assert mean == pytest.approx(TRUE_PREFILL_S * top / clock, rel=0.03)
        assert std < 0.05 * mean
        truth = _true_busy(float(clock), top, 0.0, 1.0, 64.0, 1024.0)
        assert model.decode_iteration_s(float(clock), 64.0, 1024.0)[0] == pytest.approx(
            truth, rel=0.03
        )
        for phase in ("idle", "prefill", "decode"):
            assert model.phase_power_w(float(clock), phase)[0] == pytest.approx(
                true_power(float(clock), phase), rel=0.05
            )
    assert model.confidence() > 0.8


def test_unexplored_clocks_are_predicted_pessimistically_with_wide_uncertainty() -> None:
    clocks = np.arange(600.0, 1801.0, 50.0)
    model = OnlineModel(clocks, 600.0, warmup_windows=20)
    for _ in range(60):  # only the top clock, as in the warm-up
        model.update(Window(1.0, 0.5, 5000.0, 0.0, 0.0, 0.0, None, 1800.0, 1800.0, 60.0, 60.0))
    top_mean, top_std = model.prefill_s_per_token(1800.0)
    low_mean, low_std = model.prefill_s_per_token(600.0)
    # Compute-bound extrapolation (time ~ 1/f): the slowest the physics allows.
    assert low_mean == pytest.approx(3.0 * top_mean, rel=0.05)
    assert low_std / low_mean > 5 * top_std / top_mean


def _leaves(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_leaves(v) for v in value.values())
    if isinstance(value, list):
        return sum(_leaves(v) for v in value)
    return 1


@pytest.mark.slow
def test_memory_is_bounded_over_100k_updates() -> None:
    clocks = np.arange(345.0, 1981.0, 15.0)
    model = OnlineModel(clocks, 700.0)
    rng = np.random.default_rng(4)
    windows = [
        Window(
            1.0,
            0.6,
            float(rng.integers(0, 4000)),
            300.0,
            10.0,
            1500.0,
            300.0,
            float(rng.choice(clocks)),
            None,
            60.0,
            60.1,
        )
        for _ in range(64)
    ]
    before = model.nbytes()
    state_size = _leaves(model.state_dict())
    for index in range(100_000):
        model.update(windows[index % 64])
    assert model.samples == 100_000
    assert model.nbytes() == before
    assert _leaves(model.state_dict()) == state_size
    json.dumps(model.state_dict())  # still plain JSON
    assert np.all(np.isfinite(model.time.covariance))


# --------------------------------------------------------------- no profile access
class ProfileTouched(AssertionError):
    """The controller reached into the plant's profile."""


class GuardedProfile:
    """A profile that only code of the plant package may touch (the plant itself must
    still work); anything else reading it raises."""

    def __init__(self, inner: PerformanceProfile) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith("gpugov.plant"):
            raise ProfileTouched(f"{caller} read profile.{name}")
        return getattr(object.__getattribute__(self, "_inner"), name)


def _poisson_workload(
    rate: float,
    duration_s: float,
    prompt: tuple[int, int],
    output: tuple[int, int],
    seed: int,
    start_s: float = 0.0,
    first_id: int = 0,
) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = start_s + np.cumsum(rng.exponential(1.0 / rate, size=int(rate * duration_s * 2)))
    times = times[times < start_s + duration_s]
    return [
        Request(first_id + i, float(t), int(rng.integers(*prompt)), int(rng.integers(*output)))
        for i, t in enumerate(times)
    ]


def _online(workload: list[Request], period: float = 1.0, **options: Any) -> OnlineMPCController:
    prompts = np.array([r.prompt_tokens for r in workload], dtype=float)
    outputs = np.array([r.output_tokens for r in workload], dtype=float)
    return OnlineMPCController(
        mean_prompt_tokens=float(prompts.mean()),
        mean_output_tokens=float(outputs.mean()),
        ttft_prompt_tokens=float(np.percentile(prompts, 95)),
        control_period_s=period,
        **options,
    )


def test_controller_never_reads_the_profile_and_still_controls(profile) -> None:  # type: ignore[no-untyped-def]
    plant = make_plant(GuardedProfile(profile))  # type: ignore[arg-type]
    with pytest.raises(ProfileTouched):
        _ = plant.profile.clock_mhz  # the guard works from outside the plant
    workload = _poisson_workload(3.0, 150.0, (200, 2500), (20, 300), seed=5)
    controller = _online(workload)
    result = simulate(workload, plant, chunked_prefill_scheduler, controller, 0)
    assert controller.model is not None and controller.model.warmed_up
    assert controller.last_reason in {
        "mpc",
        "explore-floor",
        "backoff",
        "burst-guard",
        "decode-descent",
    }
    assert np.min(result.requested_clock_mhz) < profile.maximum_clock_mhz


# ------------------------------------------------------ unseen shapes, exploration
def _memory_bound_flat_profile() -> PerformanceProfile:
    """Decode memory-bound and flat above a mid clock; prefill compute-bound."""
    clocks = np.arange(400.0, 2101.0, 20.0)
    x = clocks / clocks[-1]
    decode = 3_000.0 * np.minimum(1.0, clocks / 1200.0) ** 0.8
    return PerformanceProfile(
        clock_mhz=clocks,
        prefill_tokens_per_s=14_000.0 * x,
        decode_tokens_per_s=decode,
        prefill_power_w=90.0 + 400.0 * x**2.5,
        decode_power_w=90.0 + 220.0 * x**2,
        idle_power_w=70.0 + 15.0 * x,
        ttft_slo_s=1.5,
        tpot_slo_s=0.08,
        manifest={
            "status": "synthetic",
            "engine": {"reference_batch_size": 32, "reference_context_tokens": 2048},
            "decode_latency_model": {
                "weight_fraction": 0.7,
                "batch_fraction": 0.1,
                "kv_fraction": 0.2,
            },
        },
        name="memory-bound-flat",
    )


SHAPES = {
    "memory-bound-decode": lambda: ServingPlant(
        profile=_memory_bound_flat_profile(),
        power_limit_w=500.0,
        thermal_limit_c=87.0,
        ambient_temperature_c=30.0,
        thermal_resistance_c_per_w=0.08,
        thermal_time_constant_s=30.0,
    ),
    # Prefill at the top clock draws 680 W: the 560 W cap holds the clock lower.
    "prefill-power-capped": lambda: make_plant(power_limit_w=560.0),
    "tight-slo": lambda: make_plant(make_profile(), power_limit_w=700.0).with_overrides(
        profile=_with_slos(make_profile(), 0.5, 0.045)
    ),
    "loose-slo": lambda: make_plant(make_profile(), power_limit_w=700.0).with_overrides(
        profile=_with_slos(make_profile(), 4.0, 0.3)
    ),
}


def _with_slos(profile: PerformanceProfile, ttft: float, tpot: float) -> PerformanceProfile:
    return PerformanceProfile(
        clock_mhz=profile.clock_mhz,
        prefill_tokens_per_s=profile.prefill_tokens_per_s,
        decode_tokens_per_s=profile.decode_tokens_per_s,
        prefill_power_w=profile.prefill_power_w,
        decode_power_w=profile.decode_power_w,
        idle_power_w=profile.idle_power_w,
        ttft_slo_s=ttft,
        tpot_slo_s=tpot,
        manifest=profile.manifest,
        name=profile.name,
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_holds_the_slo_on_unseen_shapes_and_saves_energy(shape: str) -> None:
    plant = SHAPES[shape]()
    workload = _poisson_workload(2.5, 240.0, (100, 3000), (20, 400), seed=11)
    reference = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller, 0)
    controller = _online(workload)
    clocks = plant.profile.clock_mhz
    # The longest step: far under the exploration threshold (physics-bounded, capped).
    step = controller.exploration.largest_step_fraction * (clocks[-1] - clocks[0])
    below_frontier: list[float] = []

    def checked(observation):  # type: ignore[no-untyped-def]
        decision = controller(observation)
        # The frontier the decision saw: the clock may go at most one capped step below it.
        model = controller.model
        if model is not None and controller.last_reason in ("mpc", "explore-floor", "probe"):
            below_frontier.append(model.lowest_explored_mhz() - decision)
        return decision

    guarded = plant.with_overrides(profile=GuardedProfile(plant.profile))
    result = simulate(workload, guarded, chunked_prefill_scheduler, checked, 0)
    assert reference.metrics.slo_attainment is not None
    assert result.metrics.slo_attainment >= reference.metrics.slo_attainment - 0.01, shape
    assert result.metrics.energy_j < reference.metrics.energy_j, shape
    # Safe exploration: never more than one bounded step below the explored clocks.
    assert below_frontier and max(below_frontier) <= step + 1e-9, shape


def test_relearns_after_a_model_swap_and_a_prompt_mix_change() -> None:
    from gpugov.study.online_eval import run_segments

    first = make_plant()
    second = ServingPlant(
        profile=_memory_bound_flat_profile(),
        power_limit_w=500.0,
        thermal_limit_c=87.0,
        ambient_temperature_c=30.0,
        thermal_resistance_c_per_w=0.08,
        thermal_time_constant_s=30.0,
    )
    short = _poisson_workload(3.0, 100.0, (100, 600), (50, 300), seed=21)
    long = _poisson_workload(
        1.5, 100.0, (1500, 3500), (50, 300), seed=22, start_s=100.0, first_id=len(short)
    )
    mixed = short + long  # the prompt mix changes at 100 s
    swapped = _poisson_workload(2.0, 150.0, (200, 2500), (20, 300), seed=23)
    controller = _online(mixed + swapped)
    results = run_segments([(mixed, first, "model-a"), (swapped, second, "model-b")], controller)
    # Two resets: the second plant's GPU lists other clocks (at once), and its model's
    # name settles a few observations later.
    assert controller.resets == 2 and controller.model_name == "model-b"
    assert controller.model is not None and controller.model.warmed_up
    for workload, plant, result in zip((mixed, swapped), (first, second), results, strict=True):
        reference = simulate(
            workload, plant, chunked_prefill_scheduler, maximum_clock_controller, 0
        )
        assert result.metrics.slo_attainment >= reference.metrics.slo_attainment - 0.01


def test_a_profile_prior_skips_the_warm_up(profile) -> None:  # type: ignore[no-untyped-def]
    from gpugov.controllers.online.controller import prior_from_profile

    prior = prior_from_profile(profile)
    model = OnlineModel(profile.clock_mhz, 700.0, prior=prior)
    assert model.warmed_up
    top = profile.maximum_clock_mhz
    assert model.prefill_s_per_token(top)[0] == pytest.approx(1.0 / profile.rate("prefill", top))
    assert model.phase_power_w(top, "decode")[0] == pytest.approx(profile.power("decode", top))
    # Without a hint the model starts unwarmed and the controller holds the top clock.
    bare = OnlineModel(profile.clock_mhz, 700.0)
    assert not bare.warmed_up and bare.confidence() == 0.0


# ------------------------------------------------------------ the fast decision's parts
def _table_by_features(model: OnlineModel, clocks: np.ndarray, batch: float, context: float):  # type: ignore[no-untyped-def]
    """The predictions as the regression states them: one feature row per clock."""
    prefill, decode = [], []
    for clock in clocks:
        prefill.append(model.prefill_s_per_token(float(clock)))
        decode.append(model.decode_iteration_s(float(clock), batch, context))
    return np.array(prefill), np.array(decode)


def test_the_compiled_table_equals_the_regressions_predictions_after_every_update() -> None:
    clocks = np.arange(345.0, 1981.0, 15.0)
    model = OnlineModel(clocks, 700.0, warmup_windows=5)
    rng = np.random.default_rng(2)
    # Between knots, on them, and beyond both ends (clamped to the end knots).
    asked = np.concatenate([[300.0], clocks[::7] * 0.98, [1980.0, 2100.0]])
    for _ in range(12):
        clock = float(rng.choice(clocks[60:]))
        model.update(
            Window(
                1.0,
                0.6,
                2000.0 * rng.random(),
                600.0,
                12.0,
                1000.0,
                400.0,
                clock,
                clock,
                60.0,
                61.0,
            )
        )
        for batch, context in ((64.0, 1000.0), (2.0, 6000.0)):
            table = model.table(asked, batch, context)
            again = model.table(asked, batch, context)  # asking again changes nothing
            prefill, decode = _table_by_features(model, asked, batch, context)
            for got in (table, again):
                np.testing.assert_allclose(got["prefill_s_per_token"][0], prefill[:, 0], rtol=1e-9)
                np.testing.assert_allclose(
                    got["prefill_s_per_token"][1], prefill[:, 1], rtol=1e-9, atol=1e-15
                )
                np.testing.assert_allclose(got["decode_iteration_s"][0], decode[:, 0], rtol=1e-9)
                np.testing.assert_allclose(
                    got["decode_iteration_s"][1], decode[:, 1], rtol=1e-9, atol=1e-15
                )
            np.testing.assert_allclose(
                model.decode_iteration_mean(asked, batch, context), decode[:, 0], rtol=1e-9
            )
            for phase in ("idle", "prefill", "decode"):
                powers = [model.phase_power_w(float(clock), phase)[0] for clock in asked]
                np.testing.assert_allclose(table[phase][0], powers, rtol=1e-9)


def test_a_copied_learned_profile_equals_a_validated_one() -> None:
    """After the first, learned profiles are copies with new values (not revalidated):
    every field is what a validated construction gives."""
    plant = make_plant()
    workload = [Request(i, 0.3 * i, 800, 60) for i in range(200)]
    controller = OnlineMPCController(
        warmup_s=5.0, mean_prompt_tokens=800.0, mean_output_tokens=60.0
    )
    simulate(workload, plant, chunked_prefill_scheduler, controller, 0)
    slos = (1.0, 0.05)
    first = controller.learned_profile(slos)
    second = controller.learned_profile((1.2, 0.06))
    assert second is not first and controller._learned.template is not None
    rebuilt = PerformanceProfile(
        clock_mhz=second.clock_mhz,
        prefill_tokens_per_s=second.prefill_tokens_per_s,
        decode_tokens_per_s=second.decode_tokens_per_s,
        prefill_power_w=second.prefill_power_w,
        decode_power_w=second.decode_power_w,
        idle_power_w=second.idle_power_w,
        ttft_slo_s=1.2,
        tpot_slo_s=0.06,
        manifest=second.manifest,
        name="online",
    )
    assert (second.ttft_slo_s, second.tpot_slo_s) == (1.2, 0.06)
    assert second.manifest == first.manifest
    for clock in (345.0, 1000.0, 1980.0):
        for phase in ("prefill", "decode"):
            assert second.rate(phase, clock) == rebuilt.rate(phase, clock)
        for phase in ("prefill", "decode", "idle"):
            assert second.power(phase, clock) == rebuilt.power(phase, clock)


def test_the_compiled_learned_profile_equals_its_numpy_statement() -> None:
    """The learned profile's arrays (one compiled pass) are the model's table at the
    realised clocks, mean plus z std, held to the physics, powers made non-decreasing:
    stated here with numpy, at a held clock whose ratio makes the realised clocks
    non-monotone."""
    from gpugov.controllers.online.rules import _physical

    plant = make_plant()
    workload = [Request(i, 0.3 * i, 800, 60) for i in range(200)]
    controller = OnlineMPCController(
        warmup_s=5.0, mean_prompt_tokens=800.0, mean_output_tokens=60.0
    )
    simulate(workload, plant, chunked_prefill_scheduler, controller, 0)
    model = controller.model
    assert model is not None
    model.realized_ratio[-1] = 0.9  # the top clock held below the one under it
    profile = controller.learned_profile((1.0, 0.05))
    realized = model.clocks_mhz * model.realized_ratio
    table = model.table(realized, REFERENCE_BATCH, controller.context_tokens)
    z = controller.effective_z
    mean, std = table["prefill_s_per_token"]
    prefill = _physical(np.maximum(mean + z * std, 1e-7), realized)
    mean, std = table["decode_iteration_s"]
    decode = _physical(np.maximum(mean + z * std, 1e-5), realized)
    np.testing.assert_allclose(profile.prefill_tokens_per_s, 1.0 / prefill, rtol=1e-12)
    np.testing.assert_allclose(profile.decode_tokens_per_s, REFERENCE_BATCH / decode, rtol=1e-12)
    for name, phase in (("prefill_power_w", "prefill"), ("decode_power_w", "decode")):
        expected = np.maximum.accumulate(np.maximum(table[phase][0], 1.0))
        np.testing.assert_allclose(getattr(profile, name), expected, rtol=1e-12)
    expected = np.maximum.accumulate(np.maximum(table["idle"][0], 1.0))
    np.testing.assert_allclose(profile.idle_power_w, expected, rtol=1e-12)
    fractions = profile.decode_latency_model
    top = model.decode_iteration_means(
        model.clocks_mhz,
        ((0.0, 0.0), (REFERENCE_BATCH, 0.0), (REFERENCE_BATCH, controller.context_tokens)),
    )[-1]
    assert fractions.weight_fraction == pytest.approx(top[0] / top[2], rel=1e-9)


def test_pessimistic_times_grow_no_faster_than_one_over_f() -> None:
    """The learned profile's pessimistic times (mean + z std) obey the physics at clocks
    the model has not visited: no faster than 1/f below any clock, and no faster at a
    lower clock; the unvisited low clocks are then priced from the visited top."""
    from gpugov.controllers.online.rules import _physical

    plant = make_plant()
    workload = [Request(i, 0.3 * i, 800, 60) for i in range(120)]
    controller = OnlineMPCController(
        warmup_s=5.0, mean_prompt_tokens=800.0, mean_output_tokens=60.0
    )
    # The controller sees every window, but the top clock is applied throughout: every
    # lower clock is unvisited, its std large.
    simulate(
        workload,
        plant,
        chunked_prefill_scheduler,
        lambda observation: (controller(observation), plant.profile.maximum_clock_mhz)[1],
        0,
    )
    model = controller.model
    assert model is not None
    learned = controller.learned_profile((1.0, 0.05))
    realized = model.clocks_mhz * model.realized_ratio
    for rate in (learned.prefill_tokens_per_s, learned.decode_tokens_per_s):
        seconds = 1.0 / rate
        cycles = seconds * realized
        assert bool(np.all(np.diff(seconds) <= 1e-15 * seconds[1:]))
        assert bool(np.all(np.diff(cycles) >= -1e-9 * cycles[1:]))
    # Without the cap the lowest clock's pessimistic prefill time is above the 1/f bound.
    z = controller.effective_z
    table = model.table(realized, 8.0, controller.context_tokens)
    mean, std = table["prefill_s_per_token"]
    raw = mean + z * std
    assert raw[0] > raw[-1] * realized[-1] / realized[0]
    assert 1.0 / learned.prefill_tokens_per_s[0] <= raw[-1] * realized[-1] / realized[0] * (
        1 + 1e-9
    )
    # A held top clock that realises less than the one below it only loosens the bound.
    times = np.array([6.0, 2.0, 1.5, 1.4])
    clocks = np.array([500.0, 1000.0, 1500.0, 1400.0])
    capped = _physical(times, clocks)
    assert bool(np.all(capped <= times)) and bool(np.all(np.diff(capped) <= 0.0))
    assert capped[0] == pytest.approx(2.0 * 1000.0 / 500.0)
    # The top's bound on the clock below is taken at 1500 MHz, not its realised 1400.
    assert capped[2] == pytest.approx(1.4) and capped[2] > 1.4 * 1400.0 / 1500.0


def test_the_latency_window_averages_over_its_span_whatever_the_period() -> None:
    from dataclasses import replace

    from gpugov.controllers.online.exploration import LatencyWindow

    def seen(time_s: float, ttft: float | None, tpot: float | None, slo: float = 1.0):  # type: ignore[no-untyped-def]
        return replace(
            _observation_at(time_s), ttft_recent_s=ttft, tpot_recent_s=tpot, ttft_slo_s=slo
        )

    window = LatencyWindow(0.5)
    # 0.25 s periods: each view averages the ratios of the last two windows.
    assert window.view(seen(0.25, 0.9, 0.04)).ttft_recent_s == pytest.approx(0.9)
    second = window.view(seen(0.5, 0.1, None))
    assert second.ttft_recent_s == pytest.approx(0.5)  # (0.9 + 0.1) / 2
    assert second.tpot_recent_s == pytest.approx(0.04)  # the window with a TPOT
    # The ratio is kept when the SLO changes: 0.1/1.0 and 1.0/2.0 -> 0.3 of 2.0.
    assert window.view(seen(0.75, 1.0, None, slo=2.0)).ttft_recent_s == pytest.approx(0.6)
    # At a period of the span or longer: the observation itself.
    slow = LatencyWindow(0.5)
    first = seen(1.0, 0.9, 0.04)
    assert slow.view(first) is first
    later = seen(1.5, 0.2, 0.01)
    assert slow.view(later) is later
    with pytest.raises(ValueError, match="span_s"):
        LatencyWindow(-1.0)


def _observation_at(time_s: float):  # type: ignore[no-untyped-def]
    from gpugov.plant.types import ServingObservation

    return ServingObservation(
        time_s=time_s,
        step_index=int(time_s * 4),
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        tpot_slo_s=0.05,
    )


def test_the_default_horizon_is_ten_control_periods() -> None:
    assert OnlineMPCController(control_period_s=0.25).horizon_s == pytest.approx(2.5)
    assert OnlineMPCController(control_period_s=1.0, horizon_s=20.0).horizon_s == 20.0


def test_the_learned_profile_never_makes_the_mpc_fall_back() -> None:
    """A learned decode model with no context term once gave ``kv_fraction = 1 - w - b``
    of -3e-17, which the profile refused: the MPC raised and fell back on about one
    decision in seven. A minute of the bundled trace must see no exception fallback."""
    from gpugov.daemon.cli_support import simulated_controller
    from gpugov.plant import ServingPlant, load_profile, load_trace, simulate

    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    workload, _ = load_trace("azure-conv-10min", duration_s=60.0)
    chain = simulated_controller("mpc-online", plant, workload, 1.0)
    result = simulate(workload, plant, controller=chain)
    algorithm = chain.unwrapped
    assert isinstance(algorithm, OnlineMPCController)
    assert algorithm.mpc is not None and algorithm.mpc.successful_solves > 0
    assert algorithm.fallback_reasons["exception"] == 0
    assert result.metrics.slo_attainment == 1.0


def test_a_node_bounds_the_history_of_mpc_online_s_mpc() -> None:
    """``mpc-online`` is history-bounded as ``mpc`` is: the limit a node sets reaches the
    MPC it plans with (unbounded, its plans grew ~2 MB an hour on a day's soak)."""
    from gpugov.controllers.contract import HistoryBounded

    workload = _poisson_workload(4.0, 150.0, (200, 2000), (20, 300), seed=7)
    controller = _online(workload)
    assert isinstance(controller, HistoryBounded)
    controller.history_limit = 5
    simulate(workload, make_plant(make_profile()), chunked_prefill_scheduler, controller, 0)
    assert controller.mpc is not None and controller.mpc.successful_solves > 5
    assert len(controller.mpc.plans_by_step) == 5
    assert len(controller.mpc.plan_start_times_by_step) == 5
    assert len(controller.mpc.solve_times) <= 10
