"""Shared fixtures for the controller tests: a small synthetic profile and plant."""

from __future__ import annotations

import numpy as np
import pytest

from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import Request


def make_synthetic_profile(number_clocks: int = 9, **manifest: object) -> PerformanceProfile:
    """A monotone synthetic profile between 900 and 1980 MHz (clearly labelled synthetic)."""
    clocks = np.linspace(900.0, 1980.0, number_clocks)
    fraction = (clocks - clocks[0]) / (clocks[-1] - clocks[0])
    return PerformanceProfile(
        clock_mhz=clocks,
        prefill_tokens_per_s=6_000.0 + 6_000.0 * fraction,
        decode_tokens_per_s=1_200.0 + 1_300.0 * fraction,
        prefill_power_w=250.0 + 400.0 * fraction**1.5,
        decode_power_w=200.0 + 300.0 * fraction**1.5,
        idle_power_w=80.0 + 20.0 * fraction,
        ttft_slo_s=0.5,
        tpot_slo_s=0.05,
        manifest={"status": "synthetic", **manifest},
        name="test-synthetic",
    )


@pytest.fixture
def synthetic_profile() -> PerformanceProfile:
    return make_synthetic_profile()


def make_workload(
    count: int = 40, *, spacing_s: float = 0.5, prompt: int = 800, output: int = 120
) -> tuple[Request, ...]:
    """Evenly spaced requests with varied prompt and output lengths."""
    return tuple(
        Request(
            request_id=index,
            arrival_time_s=index * spacing_s,
            prompt_tokens=prompt + 37 * (index % 7),
            output_tokens=output + 11 * (index % 5),
        )
        for index in range(count)
    )


@pytest.fixture
def profile_factory():
    """Factory for synthetic profiles: ``profile_factory(number_clocks, **manifest)``."""
    return make_synthetic_profile


@pytest.fixture
def workload_factory():
    """Factory for evenly spaced workloads (see :func:`make_workload`)."""
    return make_workload


def make_synthetic_plant(profile: PerformanceProfile | None = None, **overrides: object):
    """A ServingPlant around the synthetic profile (H100-like limits)."""
    from gpugov.plant.plant import ServingPlant

    values: dict[str, object] = {
        "profile": make_synthetic_profile() if profile is None else profile,
        "power_limit_w": 700.0,
        "thermal_limit_c": 87.0,
        "ambient_temperature_c": 30.0,
        "thermal_resistance_c_per_w": 0.07,
        "thermal_time_constant_s": 30.0,
    }
    values.update(overrides)
    return ServingPlant(**values)  # type: ignore[arg-type]


@pytest.fixture
def synthetic_plant():
    return make_synthetic_plant()


@pytest.fixture
def plant_factory():
    """Factory: ``plant_factory(profile=None, **overrides)``."""
    return make_synthetic_plant
