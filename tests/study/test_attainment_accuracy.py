"""``bench/attainment_accuracy.py``: the true count of TTFT misses (each request at its own
per-prompt SLO) and the node's count from the last observation a controller was given."""

from __future__ import annotations

import pytest
from study_support import bench_script

from gpugov.plant import load_profile
from gpugov.plant.types import RequestRecord, ServingObservation


def _record(index: int, prompt: int, ttft_s: float | None) -> RequestRecord:
    first = None if ttft_s is None else 10.0 + ttft_s
    return RequestRecord(index, 10.0, prompt, 8, first, None, 1)


def test_true_misses_judge_each_request_at_its_own_slo() -> None:
    module = bench_script("attainment_accuracy")
    profile = load_profile("h200-sxm-llama3-8b")
    allowance = profile.ttft_slo_per_prompt_token_s
    assert allowance > 0.0
    long_slo = profile.ttft_slo_for(90_000)
    records = (
        _record(0, 90_000, long_slo - 0.1),  # a long prompt within its own SLO
        _record(1, 1_000, long_slo - 0.2),  # a short one as late: a miss
        _record(2, 1_000, None),  # no first token yet: not judged
    )
    assert module.true_misses(records, profile) == 1


def test_the_wrapper_passes_decisions_through_and_counts_the_last_observation() -> None:
    module = bench_script("attainment_accuracy")
    seen: list[float] = []

    def inner(observation: ServingObservation) -> float:
        seen.append(observation.time_s)
        return 1_500.0

    chain = module.LastObservation(inner)
    assert chain.counted_misses() is None
    base = {
        "step_index": 0,
        "arrived_requests": 0,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 0,
        "generated_decode_tokens": 0.0,
        "temperature_c": 50.0,
    }
    assert chain(ServingObservation(time_s=1.0, **base)) == 1_500.0  # type: ignore[arg-type]
    assert chain.counted_misses() is None  # no counters on this observation
    counted = ServingObservation(
        time_s=2.0, ttft_within_slo_total=97.5, ttft_count_total=100.0, **base
    )  # type: ignore[arg-type]
    assert chain(counted) == 1_500.0
    assert chain.counted_misses() == pytest.approx(2.5)
    assert seen == [1.0, 2.0]
