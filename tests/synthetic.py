"""A small synthetic profile (clearly labelled synthetic) and plants for known-answer tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpugov.daemon.backend import GpuSample
from gpugov.plant import PerformanceProfile, ServingPlant
from gpugov.plant.types import Request

if TYPE_CHECKING:
    from gpugov.controllers.budget import SLOTarget
    from gpugov.daemon.controller_config import ControllerConfig
    from gpugov.plant import ServingResult


def make_profile(**manifest_extra: Any) -> PerformanceProfile:
    """A synthetic H100-like profile for known-answer tests (never presented as measured)."""
    clocks = np.arange(345.0, 1981.0, 15.0)
    x = clocks / clocks[-1]
    manifest: dict[str, Any] = {
        "status": "synthetic",
        "gpu": "test GPU",
        "model": "test model",
        "engine": {
            "reference_batch_size": 64,
            "reference_context_tokens": 1536,
            "max_batch_size": 256,
            "kv_capacity_tokens": 400_000,
        },
        "decode_latency_model": {"weight_fraction": 0.5, "batch_fraction": 0.1, "kv_fraction": 0.4},
        "decode_power_batch_model": {"k": 1.0, "x0": 4.0},
    }
    manifest.update(manifest_extra)
    return PerformanceProfile(
        clock_mhz=clocks,
        prefill_tokens_per_s=20_000.0 * x,
        decode_tokens_per_s=4_000.0 * (0.7 + 0.3 * x),
        prefill_power_w=120.0 + 560.0 * x**2.5,
        decode_power_w=120.0 + 330.0 * x**2,
        idle_power_w=100.0 + 22.0 * x,
        ttft_slo_s=1.0,
        tpot_slo_s=0.1,
        manifest=manifest,
        name="synthetic-test",
    )


def make_plant(profile: PerformanceProfile | None = None, **overrides: Any) -> ServingPlant:
    """A plant around the synthetic profile with H100-like limits."""
    values: dict[str, Any] = {
        "power_limit_w": 700.0,
        "thermal_limit_c": 87.0,
        "ambient_temperature_c": 30.0,
        "thermal_resistance_c_per_w": 0.07,
        "thermal_time_constant_s": 30.0,
    }
    values.update(overrides)
    return ServingPlant.from_profile(profile or make_profile(), **values)


class IdleGpu:
    """A GpuBackend that reads an empty sample, for tests about the engine's side."""

    label = "0"

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return (900, 1980)

    def sample(self) -> GpuSample:
        return GpuSample(gpu="0")

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self) -> None: ...

    def close(self) -> None: ...


def plan_payload(
    clock_mhz: tuple[float, float] = (1000.0, 1000.0), **changes: Any
) -> dict[str, Any]:
    """A minimal open-loop plan file's content (two steps at ``clock_mhz``), ``changes``
    applied: for tests that write a plan and read it back through a command."""
    plan: dict[str, Any] = {
        "format": "gpugov-open-loop-plan-v1",
        "time_s": [0, 1],
        "continuous_clock_mhz": list(clock_mhz),
        "applied_clock_mhz": list(clock_mhz),
        "predicted_backlog_s": [0, 0, 0],
        "control_period_s": 1.0,
        "objective": None,
        "optimization_method": "x",
        "message": "x",
        "workload_checksum": "x",
        "profile_status": "synthetic",
        "success": True,
    }
    return {**plan, **changes}


def poisson_requests(seconds: float = 60.0, seed: int = 3) -> list[Request]:
    """Poisson arrivals at 2.5 requests/s for ``seconds``, prompts of 200-2,000 tokens and
    replies of 20-200 (uniform): a small, busy run for the learned model's tests."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.4, size=int(seconds / 0.4 * 2)))
    times = times[times < seconds]
    return [
        Request(i, float(t), int(rng.integers(200, 2000)), int(rng.integers(20, 200)))
        for i, t in enumerate(times)
    ]


def scoreboard_run(
    plant: ServingPlant,
    requests: tuple[Request, ...],
    spec: ControllerConfig,
    period_s: float,
    slo_target: SLOTarget | None = None,
    view: str | None = None,
) -> ServingResult:
    """One closed-loop run of ``spec`` built as the scoreboard builds it (the node's
    factory and safety chain); ``view``: ``"vllm"`` for what a vLLM node sees of the
    engine, None for the simulator's exact state."""
    from gpugov.daemon.simulated import observation_view
    from gpugov.plant import chunked_prefill_scheduler, simulate
    from gpugov.study.scoreboard.controllers import study_controller

    controller = study_controller(
        spec, plant, requests, control_period_s=period_s, slo_target=slo_target
    )
    return simulate(
        requests,
        plant,
        chunked_prefill_scheduler,
        controller,
        0,
        controller_name=spec.kind,
        control_period_s=period_s,
        view=None if view is None else observation_view(view),
    )
