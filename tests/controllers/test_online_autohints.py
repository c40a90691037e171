"""mpc-online's automatic hints: the GPU family from NVML's name and the model size from
the engine's ``model_name``, asked once per served model; the configured prior wins; an
unknown name is one log line; a wrong automatic hint costs little in the closed loop."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.contract import unwrap
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.prior import AutoHints, PriorHints, prior_from_hints
from gpugov.daemon.controller_config import OnlineMPCControllerConfig, PriorHintsConfig
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, simulate
from gpugov.plant.types import Request, ServingObservation
from gpugov.plant.zoo import GPUS

H100 = "NVIDIA H100 80GB HBM3"
CLOCKS = tuple(float(c) for c in make_plant().profile.clock_mhz)


def _observation(time_s: float, name: str | None, **fields: Any) -> ServingObservation:
    base: dict[str, Any] = {
        "time_s": time_s,
        "step_index": int(time_s),
        "arrived_requests": 0,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 0,
        "generated_decode_tokens": 0.0,
        "temperature_c": 40.0,
        "supported_clocks_mhz": CLOCKS,
        "model_name": name,
        "ttft_slo_s": 1.0,
        "tpot_slo_s": 0.1,
    }
    base.update(fields)
    return ServingObservation(**base)


def test_a_known_gpu_and_model_name_give_a_shape_and_the_board_power() -> None:
    lines: list[str] = []
    hints = AutoHints(gpu=H100, tensor_parallel=4, warn=lines.append)
    prior = hints.prior_for("meta-llama/Llama-3.1-70B-Instruct")
    assert prior is not None and prior.time_table and not prior.replaces_warmup
    assert prior.board_power_w == pytest.approx(4 * GPUS["h100"].tdp_w)
    assert "Llama-3.1-70B-Instruct" in prior.source
    # The same physics as the configured hints would give.
    configured = prior_from_hints(PriorHints(gpu=H100, params_b=70.0, tensor_parallel=4))
    assert configured is not None and prior.time_table == configured.time_table
    # Asked again: the same prior, computed once.
    assert hints.prior_for("meta-llama/Llama-3.1-70B-Instruct") is prior
    assert lines == []


def test_an_mixture_name_gives_the_active_parameters() -> None:
    hints = AutoHints(gpu=H100, tensor_parallel=2)
    moe = hints.prior_for("mistralai/Mixtral-8x7B-Instruct-v0.1")
    dense = hints.prior_for("some-org/dense-45B")
    assert moe is not None and dense is not None
    # Fewer active parameters: less compute per prompt token than a dense model of the
    # same total.
    assert moe.time_table[-1][1] < dense.time_table[-1][1]


def test_an_unknown_name_or_gpu_is_one_line_each_and_no_shape() -> None:
    lines: list[str] = []
    hints = AutoHints(gpu=H100, warn=lines.append)
    for _ in range(3):
        prior = hints.prior_for("microsoft/phi-4")
        # The GPU alone still gives the board power (the power-cap fallback).
        assert prior is not None and not prior.time_table and prior.board_power_w
    assert len(lines) == 1 and "phi-4" in lines[0] and "no size" in lines[0]
    unknown_gpu = AutoHints(gpu="Tesla V100-SXM2-16GB", warn=lines.append)
    for name in ("llama-8B", "llama-70B", "llama-8B"):
        assert unknown_gpu.prior_for(name) is None
    assert len(lines) == 2 and "V100" in lines[1]
    nameless = AutoHints(gpu=None, warn=lines.append)
    assert nameless.prior_for("llama-8B") is None and nameless.prior_for("x-3B") is None
    assert len(lines) == 3 and "no name" in lines[2]


def test_several_models_of_other_sizes_are_said_so() -> None:
    """A page that serves several models whose names state different sizes gives no
    prior, in a line that says so: it said the name "states no size", where each stated
    one."""
    lines: list[str] = []
    hints = AutoHints(gpu=H100, warn=lines.append)
    name = "Qwen/Qwen3-30B-A3B,meta-llama/Llama-3.1-70B-Instruct"
    prior = hints.prior_for(name)
    assert prior is not None and not prior.time_table  # the GPU's board power alone
    assert lines == [
        f"mpc-online: the engine serves several models ({name!r}) whose names state no "
        "one size; no prior from them"
    ]


def test_a_domain_wider_than_the_hints_learns_with_no_prior(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A TP group past the hints' 64 GPUs (a profile's, which the loader takes up to
    1,024) is one log line and no prior; every decision had raised on it, and a run
    stopped at its first one."""
    lines: list[str] = []
    wide = AutoHints(gpu=H100, tensor_parallel=128, warn=lines.append)
    for name in ("llama-70B", "llama-70B", "llama-8B"):
        assert wide.prior_for(name) is None
    assert len(lines) == 1 and "128 GPUs" in lines[0]
    profile = make_profile(gpu=H100, model="Llama-3.1-70B-Instruct", tensor_parallel={"size": 128})
    with caplog.at_level(logging.WARNING):
        result, controller = _run(make_plant(profile), "mpc-online", _poisson(2.0, 60.0, 5))
    assert controller.auto_prior is None and result.metrics.completed_requests > 0
    assert sum("128 GPUs" in r.getMessage() for r in caplog.records) == 1


def test_a_size_no_model_has_is_no_hint_and_one_line() -> None:
    """An engine label is not the operator's config: ``Mix-999x9999B`` reads as a mixture
    of 7.8 million billion parameters, past any hint; it gave a controller error at every
    tick."""
    lines: list[str] = []
    hints = AutoHints(gpu=H100, warn=lines.append)
    for _ in range(3):
        prior = hints.prior_for("Mix-999x9999B")
        assert prior is not None and not prior.time_table and prior.board_power_w
    assert len(lines) == 1 and "no usable size" in lines[0] and "Mix-999x9999B" in lines[0]
    controller = OnlineMPCController(auto_hints=AutoHints(gpu=H100), warmup_s=5.0)
    for step in range(4):
        controller(replace(_observation(0.25 * step, None), model_name="Mix-999x9999B"))


def test_a_data_parallel_domain_is_hinted_per_engine() -> None:
    """Eight GPUs serving two data-parallel engines: each engine's prior is a TP4 group's
    (the controller plans one engine); an engine count that does not divide the GPUs
    keeps the domain's."""
    hints = AutoHints(gpu=H100, tensor_parallel=8)
    name = "meta-llama/Llama-3.1-70B-Instruct"
    per_engine = hints.prior_for(name, engines=2)
    tp4 = AutoHints(gpu=H100, tensor_parallel=4).prior_for(name)
    assert per_engine is not None and tp4 is not None
    assert per_engine.time_table == tp4.time_table
    assert per_engine.board_power_w == pytest.approx(4 * GPUS["h100"].tdp_w)
    whole = hints.prior_for(name)
    assert whole is not None and whole.board_power_w == pytest.approx(8 * GPUS["h100"].tdp_w)
    odd = hints.prior_for(name, engines=3)
    assert odd is not None and odd.time_table == whole.time_table
    controller = OnlineMPCController(auto_hints=hints, warmup_s=5.0)
    controller(_observation(0.0, name, engines=2))
    assert controller.auto_prior is per_engine


def test_a_data_parallel_domain_that_scales_is_hinted_per_engine_again() -> None:
    """Eight GPUs whose page showed one engine, then four (a data-parallel deployment
    scaled up, or its other engines' series came later): the prior is asked again for
    one of the four engines (TP 2), where it kept the one engine's TP 8 shape and board."""
    hints = AutoHints(gpu=H100, tensor_parallel=8)
    name = "meta-llama/Llama-3.1-70B-Instruct"
    controller = OnlineMPCController(auto_hints=hints, warmup_s=5.0)
    controller(_observation(0.0, name))
    assert controller.auto_prior is hints.prior_for(name)
    controller(_observation(0.25, name, engines=4))
    per_engine = hints.prior_for(name, engines=4)
    assert per_engine is not None and controller.auto_prior is per_engine
    assert per_engine.board_power_w == pytest.approx(2 * GPUS["h100"].tdp_w)
    model = controller.model
    assert model is not None and not model.warmed_up and model.prior is per_engine


def test_the_controller_takes_the_hint_when_the_first_name_arrives() -> None:
    controller = OnlineMPCController(
        auto_hints=AutoHints(gpu=H100, tensor_parallel=1), warmup_s=5.0
    )
    controller(_observation(0.0, None))  # the engine's first scrape has not answered
    model = controller.model
    assert model is not None and controller.auto_prior is None
    assert np.all(model.time_shape == 1.0)  # the compute-bound extrapolation
    controller(_observation(1.0, "meta-llama/Llama-3.1-8B-Instruct"))
    assert controller.model is model  # the same model, still warming up ...
    assert controller.auto_prior is not None and model.prior is controller.auto_prior
    assert np.any(model.time_shape < 0.99)  # ... now with the physics' clock shape
    assert "Llama-3.1-8B" in controller.status()["prior"]
    # Another served model: the model is learned anew, from that model's prior.
    for time_s in (2.0, 2.25):
        controller(_observation(time_s, "meta-llama/Llama-3.1-70B-Instruct"))
    assert controller.resets == 0  # a new name holds three observations before it counts
    controller(_observation(2.5, "meta-llama/Llama-3.1-70B-Instruct"))
    assert controller.resets == 1 and controller.model is not model
    assert controller.model is not None and controller.model.prior is controller.auto_prior
    assert "70B" in controller.auto_prior.source


def test_a_warmed_up_model_keeps_its_shape() -> None:
    controller = OnlineMPCController(auto_hints=AutoHints(gpu=H100))
    controller(_observation(0.0, None))
    model = controller.model
    assert model is not None
    model.warmed_up = True  # as a restored model is
    shape = model.time_shape.copy()
    controller(_observation(1.0, "llama-8B"))
    assert np.array_equal(model.time_shape, shape) and model.prior is None


def _context(**fields: Any) -> ControllerContext:
    values: dict[str, Any] = {
        "period_s": 1.0,
        "supported_clocks_mhz": CLOCKS,
        "gpu_names": (H100,) * 2,
        "gpu_count": 2,
    }
    values.update(fields)
    return ControllerContext(**values)


def test_the_factory_gives_automatic_hints_unless_a_prior_is_configured() -> None:
    bare = unwrap(build_controller(OnlineMPCControllerConfig(kind="mpc-online"), _context()))
    assert isinstance(bare, OnlineMPCController) and bare.auto_hints is not None
    assert bare.auto_hints.gpu == H100 and bare.auto_hints.tensor_parallel == 2
    configured = [
        OnlineMPCControllerConfig(kind="mpc-online", prior=PriorHintsConfig(params_b=8.0)),
        OnlineMPCControllerConfig(kind="mpc-online", prior_profile="h100-sxm-llama3-8b"),
        OnlineMPCControllerConfig(kind="mpc-online", auto_hints=False),
        parse_controller_spec("mpc-online:auto=off"),
    ]
    for spec in configured:
        controller = unwrap(build_controller(spec, _context()))
        assert isinstance(controller, OnlineMPCController) and controller.auto_hints is None
    assert parse_controller_spec("mpc-online:auto=on").auto_hints is True  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="auto must be on or off"):
        parse_controller_spec("mpc-online:auto=maybe")


def test_the_configured_prior_wins_over_the_name() -> None:
    hints = AutoHints(gpu=H100)
    configured = prior_from_hints(PriorHints(gpu=H100, params_b=8.0))
    controller = OnlineMPCController(prior=configured, auto_hints=hints)
    controller(_observation(0.0, "meta-llama/Llama-3.1-405B-Instruct"))
    assert controller.auto_prior is None and controller.active_prior is configured
    assert controller.model is not None and controller.model.prior is configured


def test_an_unknown_name_logs_one_line_over_many_ticks(caplog: pytest.LogCaptureFixture) -> None:
    controller = unwrap(build_controller(OnlineMPCControllerConfig(kind="mpc-online"), _context()))
    with caplog.at_level(logging.WARNING):
        for tick in range(30):
            controller(_observation(float(tick), "microsoft/phi-4"))
    lines = [r.getMessage() for r in caplog.records if "phi-4" in r.getMessage()]
    assert len(lines) == 1


# ------------------------------------------- a wrong automatic hint costs little
def _poisson(rate: float, duration_s: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * duration_s * 2)))
    times = times[times < duration_s]
    return [
        Request(i, float(t), int(rng.integers(100, 2500)), int(rng.integers(20, 300)))
        for i, t in enumerate(times)
    ]


def _run(plant: ServingPlant, spec: str, workload: list[Request]) -> Any:
    context = ControllerContext.for_plant(plant, workload, period_s=1.0)
    controller = build_controller(parse_controller_spec(spec), context)
    return simulate(workload, plant, chunked_prefill_scheduler, controller, 0), unwrap(controller)


def test_a_wrong_automatic_hint_costs_little() -> None:
    """The synthetic H100-like plant served under a name and a GPU that say something
    else entirely: an L4 (a small, low-bandwidth board) running a 405B model. The
    evidence overrules the shape: the SLO holds and the saving stays."""
    profile = make_profile(gpu="NVIDIA L4", model="meta-llama/Llama-3.1-405B-Instruct")
    plant = make_plant(profile)
    workload = _poisson(2.0, 180.0, seed=31)
    top = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller, 0)
    bare, _ = _run(plant, "mpc-online:auto=off", workload)
    hinted, controller = _run(plant, "mpc-online", workload)
    assert controller.auto_prior is not None and "405B" in controller.auto_prior.source
    assert controller.model is not None and controller.model.warmed_up
    assert hinted.metrics.slo_attainment >= top.metrics.slo_attainment - 0.01
    saved = 1.0 - hinted.metrics.energy_j / top.metrics.energy_j
    bare_saved = 1.0 - bare.metrics.energy_j / top.metrics.energy_j
    assert bare_saved > 0.05
    assert saved >= bare_saved - 0.03


def test_simulated_observations_carry_the_profiles_model_name() -> None:
    profile = make_profile(model="Qwen/Qwen3-30B-A3B")
    seen: list[str | None] = []

    def recording(observation: ServingObservation) -> float:
        seen.append(observation.model_name)
        return maximum_clock_controller(observation)

    simulate([Request(0, 0.0, 100, 10)], make_plant(profile), chunked_prefill_scheduler, recording)
    assert seen and set(seen) == {"Qwen/Qwen3-30B-A3B"}
    unnamed = replace(profile, manifest={k: v for k, v in profile.manifest.items() if k != "model"})
    seen.clear()
    simulate([Request(0, 0.0, 100, 10)], make_plant(unnamed), chunked_prefill_scheduler, recording)
    assert seen and set(seen) == {None}


def test_simulated_runs_say_a_hint_warning_once_per_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A benchmark builds an ``mpc-online`` per scenario and pool: each said the same
    unknown GPU and model name again, dozens of lines in a run. In simulated (virtual)
    time a message is said once per process; a node's controller logs its own."""
    gpu = "NVIDIA Unlisted Board 7319"  # a name no other test uses: said once here
    profile = make_profile(gpu=gpu, model="an-unsized-model-7319")
    plant = make_plant(profile)
    workload = _poisson(1.0, 20.0, seed=3)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            _run(plant, "mpc-online", workload)
    said = [r.getMessage() for r in caplog.records]
    assert sum(gpu in line for line in said) == 1, said
    assert sum("an-unsized-model-7319" in line for line in said) <= 1, said
    # A node (wall time) builds one per domain and keeps its own lines.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            context = replace(
                ControllerContext.for_plant(plant, workload, period_s=1.0), time_mode="wall"
            )
            controller = unwrap(build_controller(parse_controller_spec("mpc-online"), context))
            assert isinstance(controller, OnlineMPCController) and controller.auto_hints
            controller.auto_hints.prior_for("an-unsized-model-7319")
    assert sum("an-unsized-model-7319" in r.getMessage() for r in caplog.records) == 2
