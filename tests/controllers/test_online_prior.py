"""mpc-online's prior from config hints (GPU name, parameters, TP): GPU matching, the
physics it gives, known-answer convergence with a right and a badly wrong hint, the SLO
under a wrong hint on plants of shapes the project never bundled, and the power-cap
fallback."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from synthetic import make_plant

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.identification import OnlineModel
from gpugov.controllers.online.prior import (
    HintError,
    PriorHints,
    gpu_family,
    model_shape,
    prior_from_hints,
)
from gpugov.controllers.online.window import Window
from gpugov.plant import (
    PerformanceProfile,
    ServingPlant,
    calibration,
    chunked_prefill_scheduler,
    simulate,
)
from gpugov.plant.roofline import Domain, RooflineParameters
from gpugov.plant.types import Request, ServingObservation
from gpugov.plant.zoo import GPUS, MODELS, ProfileSpec

# ------------------------------------------------------------------ the hints


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GH200 480GB", "h200"),  # its own token: the H100 die, H200-like memory
        ("NVIDIA H800", "h100"),
        ("NVIDIA A800-SXM4-80GB", "a100"),
        ("NVIDIA XH200", None),  # not an H200 by a substring
        ("NVIDIA L40", None),  # not an L4
        ("Tesla V100-SXM2-16GB", None),
    ],
)
def test_gpu_names_match_by_family(name: str, key: str | None) -> None:
    board = gpu_family(name)
    assert (board.key if board is not None else None) == key


def test_an_unknown_gpu_warns_once_and_gives_no_prior() -> None:
    lines: list[str] = []
    assert (
        prior_from_hints(PriorHints(gpu="Tesla V100-SXM2-16GB", params_b=8.0), warn=lines.append)
        is None
    )
    assert len(lines) == 1 and "V100" in lines[0] and "\n" not in lines[0]
    # No GPU at all (or "auto" not resolved): no prior, no warning.
    assert prior_from_hints(PriorHints(params_b=8.0), warn=lines.append) is None
    assert prior_from_hints(PriorHints(gpu="auto"), warn=lines.append) is None
    assert len(lines) == 1


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"params_b": -1.0}, "prior.params_b"),
        ({"params_b": math.nan}, "prior.params_b"),
        ({"params_b": 8.0, "active_params_b": 13.0}, "prior.active_params_b"),
        ({"active_params_b": 13.0}, "prior.active_params_b"),
        ({"tensor_parallel": 0}, "prior.tensor_parallel"),
        ({"gpu": "  "}, "prior.gpu"),
    ],
)
def test_bad_hints_name_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(HintError, match=named.replace(".", r"\.")):
        PriorHints(**fields)


def test_a_gpu_alone_gives_the_board_power_and_no_times() -> None:
    prior = prior_from_hints(PriorHints(gpu="NVIDIA H100 80GB HBM3", tensor_parallel=4))
    assert prior is not None and not prior.replaces_warmup
    assert prior.board_power_w == pytest.approx(4 * GPUS["h100"].tdp_w)
    assert prior.time_table == ()


def test_model_shape_matches_the_parameter_counts() -> None:
    for total, active in ((8.03, None), (70.6, None), (46.7, 12.9), (671.0, 37.0)):
        spec = model_shape(total, active)
        assert spec.parameter_count == pytest.approx(total * 1e9, rel=1e-6)
        # The per-layer weights of the shape add up to the active count within 15 %.
        per_layer = spec.d_model * (spec.d_model + 2 * spec.n_kv_heads * 128) + spec.d_model**2
        per_layer += 3 * spec.d_model * spec.d_ff * max(1, spec.experts_per_token)
        assert per_layer * spec.n_layers == pytest.approx((active or total) * 1e9, rel=0.15)
        assert spec.is_moe == (active is not None)


# ---------------------------------------- known answers: convergence of the identification
def _truth(gpu: str, model: str, tp: int) -> Domain:
    """A domain the project does not bundle, with the plant's real model shape (the hint
    only knows the parameter counts)."""
    spec = ProfileSpec("truth", gpu, model, tp, 64, 1.5, 0.075, "test")
    board = GPUS[gpu]
    return Domain(
        spec,
        board,
        MODELS[model],
        calibration.fit_efficiency(board.efficiency_from),
        RooflineParameters(),
        calibration.fit_attention(),
    )


TRUTH = ("a100", "mixtral-8x7b", 4)  # Mixtral on 4 A100s: not a bundled profile
RIGHT = PriorHints(
    gpu="NVIDIA A100-SXM4-80GB", params_b=46.7, active_params_b=12.9, tensor_parallel=4
)
WRONG = {
    "wrong family, 10x parameters": PriorHints(gpu="NVIDIA L4", params_b=467.0, tensor_parallel=1),
    "wrong family, 1/10 parameters": PriorHints(
        gpu="NVIDIA B200", params_b=4.67, tensor_parallel=1
    ),
}
TOLERANCE = 0.15
"""Largest relative error of the decode iteration (batch 64, context 1024) over the
supported clocks: where the clock shape matters (the prefill's level is learned alike with
and without a hint; its final error is checked too)."""
WARMUP = 20
STEPS = 240


def _windows_to_tolerance(prior: Any, seed: int = 0) -> tuple[int | None, float]:
    """Windows until the learned model is within TOLERANCE of the truth at every clock,
    and the final error. The clocks follow safe exploration's pattern: the top clock for
    the warm-up, then one step (8 % of the range) down per 5 windows to the bottom, then
    anywhere (the MPC's choice) for 5 windows at a time."""
    domain = _truth(*TRUTH)
    clocks = np.array(domain.clocks(), dtype=float)
    top = clocks[-1]
    prompt = domain.params.reference_prompt_tokens

    def prefill(f: float) -> float:
        return domain.prefill_s(f) / prompt

    def iteration(f: float, batch: float, context: float) -> float:
        # The roofline's iteration, linear in the batch about the reference batch (the
        # form the identification fits), so the answer is known exactly.
        p = domain.params
        return (
            domain.linear_s(f, 64.0)
            + domain.kv_s(f, batch, context)
            + domain.all_reduce_s(64.0)
            + batch * p.per_sequence_overhead_s
            + p.fixed_iteration_overhead_s
        )

    checked = clocks[::4]
    truth = [(prefill(f), iteration(f, 64.0, 1024.0)) for f in checked]

    def error(model: OnlineModel, quantity: int) -> float:
        worst = 0.0
        for f, known in zip(checked, truth, strict=True):
            learned = (
                model.prefill_s_per_token(f)[0],
                model.decode_iteration_s(f, 64.0, 1024.0)[0],
            )[quantity]
            worst = max(worst, abs(learned / known[quantity] - 1.0))
        return worst

    rng = np.random.default_rng(seed)
    model = OnlineModel(clocks, 1600.0, warmup_windows=WARMUP, prior=prior)
    step = 0.08 * (top - clocks[0])
    clock = top
    explored = False
    reached = None
    for index in range(STEPS):
        if index >= WARMUP and index % 5 == 0:
            if not explored:
                clock = float(clocks[np.searchsorted(clocks, clock - step)])
                explored = clock <= clocks[0]
            else:  # explored down to the bottom: the MPC moves over the whole range
                clock = float(rng.choice(clocks))
        batch = float(rng.integers(8, 96))
        context = float(rng.uniform(300, 3000))
        iterations = float(rng.integers(5, 40))
        prompt_tokens = float(rng.integers(0, 4000))
        busy = prompt_tokens * prefill(clock) + iterations * iteration(clock, batch, context)
        model.update(
            Window(
                busy / 0.8,
                busy * rng.normal(1.0, 0.01),
                prompt_tokens,
                batch * iterations,
                iterations,
                context,
                None,
                clock,
                clock,
                60.0,
                60.0,
            )
        )
        if reached is None and model.warmed_up and error(model, 1) <= TOLERANCE:
            reached = index + 1
    return reached, max(error(model, 0), error(model, 1))


SEEDS = range(4)
FINAL_TOLERANCE = 0.2
"""Largest relative error of both predictions over the clocks at the end of the run."""


@pytest.fixture(scope="module")
def convergence() -> dict[str, list[tuple[int | None, float]]]:
    cases: dict[str, Any] = {"none": None, "right": prior_from_hints(RIGHT)}
    cases.update({name: prior_from_hints(hints) for name, hints in WRONG.items()})
    return {
        name: [_windows_to_tolerance(prior, seed) for seed in SEEDS]
        for name, prior in cases.items()
    }


def test_a_right_hint_converges_at_the_end_of_the_warm_up(convergence) -> None:  # type: ignore[no-untyped-def]
    none = [reached for reached, _ in convergence["none"]]
    right = [reached for reached, _ in convergence["right"]]
    assert None not in none and None not in right
    # Without a hint the compute-bound extrapolation is only corrected clock by clock, as
    # exploration reaches them; the hint's shape is right as soon as the warm-up ends.
    assert all(r <= n for r, n in zip(right, none, strict=True))  # type: ignore[operator]
    assert float(np.median(right)) <= WARMUP + 5  # type: ignore[arg-type]
    assert float(np.median(none)) >= 3 * WARMUP  # type: ignore[arg-type]
    assert all(final <= FINAL_TOLERANCE for _, final in convergence["right"])


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_badly_wrong_hint_still_converges(convergence, case: str) -> None:  # type: ignore[no-untyped-def]
    for (reached, final), (none, _) in zip(convergence[case], convergence["none"], strict=True):
        # The evidence overrules the hint: within the run, no later than without a hint.
        assert reached is not None and none is not None
        assert reached <= none
        assert final <= FINAL_TOLERANCE


def test_a_restored_model_keeps_its_level_under_a_hint() -> None:
    prior = prior_from_hints(RIGHT)
    clocks = np.arange(510.0, 1411.0, 15.0)
    learned = OnlineModel(clocks, 1600.0, warmup_windows=5)
    for _ in range(10):
        learned.update(
            Window(1.0, 0.5, 2000.0, 640.0, 10.0, 1000.0, None, 1410.0, 1410.0, 60.0, 60.0)
        )
    restored = OnlineModel(clocks, 1600.0, warmup_windows=5, prior=prior)
    restored.load_state(learned.state_dict())
    before = restored.prefill_s_per_token(1410.0)[0]
    restored.update(Window(1.0, 0.5, 2000.0, 640.0, 10.0, 1000.0, None, 1410.0, 1410.0, 60.0, 60.0))
    assert restored.prefill_s_per_token(1410.0)[0] == pytest.approx(before, rel=0.05)


# ------------------------------------------ closed loop: a wrong hint never breaks the SLO
def _compute_bound_profile() -> PerformanceProfile:
    """Decode and prefill compute-bound over the whole range (time ~ 1/f), a narrow
    range, small board: the opposite of what a big model on a low-bandwidth GPU suggests."""
    clocks = np.arange(600.0, 1501.0, 30.0)
    x = clocks / clocks[-1]
    return PerformanceProfile(
        clock_mhz=clocks,
        prefill_tokens_per_s=9_000.0 * x,
        decode_tokens_per_s=2_400.0 * x,
        prefill_power_w=40.0 + 210.0 * x**2.2,
        decode_power_w=40.0 + 150.0 * x**2.0,
        idle_power_w=30.0 + 8.0 * x,
        ttft_slo_s=1.0,
        tpot_slo_s=0.06,
        manifest={
            "status": "synthetic",
            "engine": {"reference_batch_size": 32, "reference_context_tokens": 1024},
            "decode_latency_model": {
                "weight_fraction": 0.3,
                "batch_fraction": 0.6,
                "kv_fraction": 0.1,
            },
        },
        name="compute-bound-narrow",
    )


def _poisson(rate: float, duration_s: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * duration_s * 2)))
    times = times[times < duration_s]
    return [
        Request(i, float(t), int(rng.integers(100, 2500)), int(rng.integers(20, 300)))
        for i, t in enumerate(times)
    ]


PLANTS = {
    "compute-bound-narrow": lambda: ServingPlant(
        profile=_compute_bound_profile(),
        power_limit_w=260.0,
        thermal_limit_c=87.0,
        ambient_temperature_c=30.0,
        thermal_resistance_c_per_w=0.15,
        thermal_time_constant_s=30.0,
    ),
    "prefill-power-capped": lambda: make_plant(power_limit_w=560.0),
}
HINTS = {
    # Says memory-bound (flat at low clocks): optimistic about low clocks on these plants.
    "L4, 10x parameters": PriorHints(gpu="NVIDIA L4", params_b=80.0),
    "B200, tiny model, TP 8": PriorHints(gpu="NVIDIA B200", params_b=0.8, tensor_parallel=8),
}


def _closed_loop(plant_name: str, prior: Any) -> tuple[Any, OnlineMPCController]:
    plant = PLANTS[plant_name]()
    workload = _poisson(2.0, 180.0, seed=31)
    prompts = np.array([r.prompt_tokens for r in workload], dtype=float)
    outputs = np.array([r.output_tokens for r in workload], dtype=float)
    controller = OnlineMPCController(
        mean_prompt_tokens=float(prompts.mean()),
        mean_output_tokens=float(outputs.mean()),
        ttft_prompt_tokens=float(np.percentile(prompts, 95)),
        prior=prior,
    )
    return simulate(workload, plant, chunked_prefill_scheduler, controller, 0), controller


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[Any, Any]]:
    """Per plant: the maximum clock's run and the no-hint mpc-online run."""
    out = {}
    for name in PLANTS:
        workload = _poisson(2.0, 180.0, seed=31)
        top = simulate(
            workload, PLANTS[name](), chunked_prefill_scheduler, maximum_clock_controller, 0
        )
        out[name] = (top, _closed_loop(name, None)[0])
    return out


@pytest.mark.parametrize("plant_name", sorted(PLANTS))
@pytest.mark.parametrize("hint_name", sorted(HINTS))
def test_a_wrong_hint_never_breaks_the_slo(references, plant_name: str, hint_name: str) -> None:  # type: ignore[no-untyped-def]
    top, bare = references[plant_name]
    result, controller = _closed_loop(plant_name, prior_from_hints(HINTS[hint_name]))
    assert top.metrics.slo_attainment is not None
    assert result.metrics.slo_attainment >= top.metrics.slo_attainment - 0.01
    # It still saves energy, and not much less than with no hint at all.
    saved = 1.0 - result.metrics.energy_j / top.metrics.energy_j
    bare_saved = 1.0 - bare.metrics.energy_j / top.metrics.energy_j
    assert bare_saved > 0.05
    assert saved >= 0.5 * bare_saved
    assert controller.model is not None and controller.model.warmed_up


# -------------------------------------------------------------- the power-cap fallback
def _observation(power_limit_w: float | None, power_w: float | None = None) -> ServingObservation:
    return ServingObservation(
        time_s=0.0,
        step_index=0,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        supported_clocks_mhz=tuple(float(c) for c in range(600, 1501, 30)),
        power_limit_w=power_limit_w,
        power_w=power_w,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
    )


def _plan_cap(controller: OnlineMPCController, observation: ServingObservation) -> float:
    controller.observe(observation)
    return controller.learned_plant(observation, (1.0, 0.05)).power_limit_w


def test_the_power_cap_comes_from_what_the_node_knows() -> None:
    # NVML's limit in the observation wins; then the last one seen.
    controller = OnlineMPCController()
    assert _plan_cap(controller, _observation(450.0)) == pytest.approx(450.0)
    assert controller.power_cap_w(_observation(None)) == pytest.approx(450.0)
    # The domain's summed enforced limit read at start.
    started = OnlineMPCController(power_limit_w=1_200.0)
    assert _plan_cap(started, _observation(None)) == pytest.approx(1_200.0)
    assert started.model is not None and started.model.power_limit_w == pytest.approx(1_200.0)
    # The hinted board (TDP x TP) when NVML reports nothing.
    hinted = OnlineMPCController(
        prior=prior_from_hints(PriorHints(gpu="NVIDIA L4", tensor_parallel=2))
    )
    assert _plan_cap(hinted, _observation(None)) == pytest.approx(2 * GPUS["l4"].tdp_w)


def test_no_cap_is_assumed_when_nothing_is_known() -> None:
    controller = OnlineMPCController()
    observation = _observation(None, power_w=90.0)
    assert controller.power_cap_w(observation) is None
    cap = _plan_cap(controller, observation)
    model = controller.model
    assert model is not None
    # The power prior is scaled on the measured power, not on a 700 W guess...
    assert model.power_limit_w == pytest.approx(180.0)
    # ...and the MPC plans with a cap far above any power the model predicts.
    profile = controller.learned_profile((1.0, 0.05))
    assert cap >= 5.0 * max(profile.prefill_power_w.max(), profile.decode_power_w.max())


def test_a_hint_shortens_the_warm_up_to_its_hinted_length() -> None:
    """A hint gives the clock shape, so the warm-up only centres it on the top clock:
    ``hinted_warmup_windows``, whether the hint came with the model or arrived later (the
    engine's first ``model_name``); without one the full warm-up runs."""
    clocks = np.linspace(210.0, 1980.0, 60)
    prior = prior_from_hints(RIGHT)
    assert prior is not None and prior.time_table
    unhinted = OnlineModel(clocks, 1600.0, warmup_windows=20, hinted_warmup_windows=5)
    assert unhinted.warmup_windows == 20
    hinted = OnlineModel(clocks, 1600.0, warmup_windows=20, hinted_warmup_windows=5, prior=prior)
    assert hinted.warmup_windows == 5
    late = OnlineModel(clocks, 1600.0, warmup_windows=20, hinted_warmup_windows=5)
    assert late.adopt_hint(prior) and late.warmup_windows == 5
    # The controller sizes both from seconds at its period (20 s and 5 s by default).
    controller = OnlineMPCController(control_period_s=0.25)
    assert (controller.warmup_windows, controller.hinted_warmup_windows) == (80, 20)
    with pytest.raises(ValueError, match="hinted_warmup_s"):
        OnlineMPCController(hinted_warmup_s=0.0)
    # 1e308 s was an OverflowError counting the periods, a traceback from check-config.
    for name in ("warmup_s", "hinted_warmup_s"):
        with pytest.raises(ValueError, match=f"{name} spans too many control periods"):
            OnlineMPCController(control_period_s=0.05, **{name: 1e308})
    with pytest.raises(ValueError, match="warmup_s must be finite and positive"):
        OnlineMPCController(warmup_s=math.inf)
