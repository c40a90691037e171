"""What one control window tells ``mpc-online``'s model: the decode iterations and the
running requests' context (``window_between``), and the decode time learned from them
under prompts whose lengths span orders of magnitude."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gpugov.controllers.online.identification import OnlineModel
from gpugov.controllers.online.window import PromptEstimate, window_between
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, poisson_workload, simulate
from gpugov.plant.gpu_physics import GpuParameters, GpuPhysics
from gpugov.plant.synthetic_profiles import synthetic_profile
from gpugov.plant.synthetic_workloads import LognormalLengths
from gpugov.plant.types import ServingObservation


def _observation(time_s: float, **fields: object) -> ServingObservation:
    base: dict[str, object] = {
        "time_s": time_s,
        "step_index": int(time_s * 4),
        "arrived_requests": 10,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 4,
        "generated_decode_tokens": 400.0,
        "temperature_c": 55.0,
        "prompt_tokens_total": 50_000.0,
        "output_tokens_total": 1000.0 + 400.0 * time_s,
        "kv_tokens": 4 * 12_000.0,
        "energy_j": 400.0 * time_s,
        "gpu_utilization": 1.0,
        "realized_clock_mhz": 1500.0,
        "requested_clock_mhz": 1500.0,
    }
    base.update(fields)
    return ServingObservation(**base)  # type: ignore[arg-type]


def test_a_decode_only_window_reads_the_context_off_the_kv_cache() -> None:
    # Four requests of 12k tokens each decode, then three of 10k: the counter-based mean
    # prompt (1,000 tokens) says nothing about them; the KV per running request does.
    previous = _observation(1.0)
    current = _observation(1.25, decode_active=3, kv_tokens=3 * 10_000.0)
    window = window_between(previous, current, prompt_per_request=1000.0)
    assert window is not None
    assert window.context_tokens == pytest.approx(11_000.0)
    assert window.iterations == pytest.approx(window.generated_tokens / 3.5)


@pytest.mark.parametrize(
    ("previous_fields", "current_fields", "why"),
    [
        ({}, {"prompt_tokens_total": 52_000.0}, "a prompt was prefilled in the window"),
        ({"prefill_remaining_tokens": 800.0}, {}, "a prompt waited at the window's start"),
        ({}, {"prefill_remaining_tokens": 800.0}, "a prompt waits at its end"),
        ({}, {"kv_tokens": 0.0}, "the engine publishes no KV"),
        ({"kv_tokens": math.nan}, {}, "the KV read was not finite"),
        ({"decode_active": 0}, {}, "nothing ran at the window's start"),
    ],
)
def test_elsewhere_the_context_is_the_counter_based_estimate(
    previous_fields: dict[str, object], current_fields: dict[str, object], why: str
) -> None:
    # The KV then also holds prompts being prefilled (or is unknown): the mean prompt from
    # the counters plus the tokens generated so far per running request.
    previous = _observation(1.0, **previous_fields)
    current = _observation(1.25, **current_fields)
    window = window_between(previous, current, prompt_per_request=1000.0)
    assert window is not None, why
    assert window.context_tokens == pytest.approx(1000.0 + 400.0 / 4), why


@pytest.mark.parametrize(("start", "end", "mean_batch"), [(0, 1, 1.0), (0, 3, 2.0), (3, 0, 2.0)])
def test_a_batch_that_starts_or_drains_in_the_window_runs_at_half_its_size_plus_one_half(
    start: int, end: int, mean_batch: float
) -> None:
    # b requests joining (or leaving) at times spread over the window: the iterations ran
    # at a mean batch of (b + 1) / 2. From 0 to 1, 60 decode tokens took 60 iterations
    # (the mean of the ends, 0.5, would say 120: more iterations than tokens).
    previous = _observation(1.0, decode_active=start, output_tokens_total=1000.0)
    current = _observation(1.25, decode_active=end, output_tokens_total=1061.0, arrived_requests=11)
    window = window_between(previous, current, prompt_per_request=1000.0)
    assert window is not None
    assert window.generated_tokens == pytest.approx(60.0)
    assert window.iterations == pytest.approx(60.0 / mean_batch)


# Prompts log-normal over 64 to 60k tokens (median 1.5k, sigma 1.6), as Mooncake's span.
HEAVY_TAILED_PROMPTS = LognormalLengths(
    median=1500.0, mean=1500.0 * math.exp(1.6**2 / 2), minimum=64, maximum=60_000
)
OUTPUTS = LognormalLengths(median=250.0, mean=300.0, minimum=20, maximum=1000)


@pytest.mark.parametrize("shape", ["memory-bound", "compute-bound", "tp2", "narrow-clocks"])
def test_the_decode_time_is_learned_under_prompts_of_every_length(shape: str) -> None:
    # Generated shapes, not a bundled profile; three clocks held 5 s each in turn.
    plant = ServingPlant.from_profile(synthetic_profile(shape))
    clocks = np.asarray(plant.profile.clock_mhz)
    cycle = [clocks[-1], clocks[clocks.size // 2], clocks[clocks.size // 4]]
    observations: list[ServingObservation] = []

    def cycling(observation: ServingObservation) -> float:
        observations.append(observation)
        return float(cycle[int(observation.time_s // 5.0) % 3])

    workload = poisson_workload(
        1.0, 600.0, seed=7, prompt_tokens=HEAVY_TAILED_PROMPTS, output_tokens=OUTPUTS
    )
    simulate(workload, plant, chunked_prefill_scheduler, cycling, 0, control_period_s=0.25)
    model = OnlineModel(clocks, plant.power_limit_w)
    estimate = PromptEstimate()
    for previous, current in itertools.pairwise(observations):
        estimate.update(previous, current)
        window = window_between(previous, current, estimate.value)
        if window is not None:
            model.update(window)
    physics = GpuPhysics(GpuParameters.from_plant(plant), clocks.size - 1)
    for clock in cycle:
        index = int(np.flatnonzero(clocks == clock)[0])
        realized = plant.profile.realized_clock(float(clock))
        for batch, context in ((2, 1000.0), (4, 4000.0)):
            learned = float(model.decode_iteration_mean(np.array([realized]), batch, context)[0])
            true = physics.iteration_parts(index, 0, batch, int(batch * context), 1.0)[1]
            assert learned == pytest.approx(true, rel=0.10), (clock, batch, context)
