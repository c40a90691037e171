"""Prompt-length TTFT SLOs: the profile defines them, metrics, observations and oracles use them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpugov.controllers.oracles.window import _miss_known_time
from gpugov.plant import ServingPlant, load_profile, simulate
from gpugov.plant.profile import ProfileError
from gpugov.plant.profile_files import bundled_profile_dir
from gpugov.plant.result import compute_metrics
from gpugov.plant.types import Request, RequestRecord


def _record(prompt: int, ttft_s: float) -> RequestRecord:
    return RequestRecord(
        request_id=0,
        arrival_time_s=0.0,
        prompt_tokens=prompt,
        output_tokens=2,
        first_token_time_s=ttft_s,
        finish_time_s=ttft_s + 0.01,
        generated_tokens=2,
    )


def _metrics(records: list[RequestRecord], allowance: float) -> float | None:
    return compute_metrics(
        records,
        energy_j=1.0,
        duration_s=1.0,
        output_tokens=4,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        power_cap_violation_s=0.0,
        thermal_violation_s=0.0,
        peak_temperature_c=40.0,
        peak_queued_requests_at_minimum_clock=0.0,
        preemptions=0,
        clock_changes=0,
        ttft_slo_per_prompt_token_s=allowance,
    ).ttft_slo_attainment


def test_metrics_use_the_per_token_allowance() -> None:
    records = [_record(100, 0.9), _record(40_000, 2.5), _record(40_000, 3.5)]
    # Flat 1 s SLO: only the short prompt meets it.
    assert _metrics(records, 0.0) == pytest.approx(1 / 3)
    # 1 s + 50 us/token: a 40k prompt gets 3 s, so the 2.5 s one meets it too.
    assert _metrics(records, 50e-6) == pytest.approx(2 / 3)


def test_oracle_miss_time_follows_the_request_slo() -> None:
    profile = load_profile("h100-sxm-llama3-8b")
    record = _record(40_000, 2.5)
    slo = profile.ttft_slo_for(record.prompt_tokens)
    assert slo > 2.5
    assert _miss_known_time(record, slo, 1.0) == float("inf")
    assert _miss_known_time(record, profile.ttft_slo_s, 1.0) == pytest.approx(1.0)


def test_long_prompts_can_meet_the_grown_slo_on_the_plant() -> None:
    """A lone 60k-token prompt misses a flat 1 s TTFT on H100 but meets its grown SLO."""
    profile = load_profile("h100-sxm-llama3-8b")
    plant = ServingPlant.from_profile(profile)
    requests = [Request(request_id=0, arrival_time_s=0.0, prompt_tokens=60_000, output_tokens=4)]
    result = simulate(requests, plant, controller=lambda observation: profile.maximum_clock_mhz)
    record = result.request_records[0]
    assert record.ttft_s is not None and record.ttft_s > 1.0
    assert record.ttft_s <= profile.ttft_slo_for(60_000)
    assert result.metrics.ttft_slo_attainment == 1.0
    assert result.metrics.ttft_slo_per_prompt_token_s == profile.ttft_slo_per_prompt_token_s


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ttft_slo_per_prompt_token_s", -1e-6, "ttft_slo_per_prompt_token_s"),
        ("ttft_slo_per_prompt_token_s", "fast", "ttft_slo_per_prompt_token_s"),
        ("tensor_parallel", {"size": 0}, "tensor_parallel"),
        ("tensor_parallel", 2.5, "tensor_parallel"),
    ],
)
def test_loader_rejects_bad_slo_and_tp_fields(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    name = "h100-sxm-llama3-70b-tp4"
    shutil.copyfile(bundled_profile_dir() / f"{name}.csv", tmp_path / f"{name}.csv")
    manifest = json.loads((bundled_profile_dir() / f"{name}.json").read_text())
    manifest[field] = value
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(ProfileError, match=message) as error:
        load_profile(path)
    assert str(path) in str(error.value)


def test_a_manifest_without_the_new_fields_keeps_the_old_meaning(tmp_path: Path) -> None:
    name = "h100-sxm-llama3-8b"
    shutil.copyfile(bundled_profile_dir() / f"{name}.csv", tmp_path / f"{name}.csv")
    manifest = json.loads((bundled_profile_dir() / f"{name}.json").read_text())
    del manifest["ttft_slo_per_prompt_token_s"], manifest["tensor_parallel"]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    profile = load_profile(path)
    assert profile.ttft_slo_per_prompt_token_s == 0.0
    assert profile.ttft_slo_for(50_000) == profile.ttft_slo_s
    assert profile.tensor_parallel == 1


def test_replace_observation_gives_what_dataclasses_replace_gives() -> None:
    from dataclasses import replace

    from gpugov.plant.types import ServingObservation, replace_observation

    observation = ServingObservation(
        12.5, 3, 40, 900.0, 2, 1410.0, 61.0, ttft_slo_s=0.5, tpot_slo_s=0.05
    )
    changes = {"ttft_recent_s": 0.42, "tpot_recent_s": 0.031}
    copied = replace_observation(observation, changes)
    assert copied == replace(observation, **changes)
    assert copied is not observation and observation.ttft_recent_s is None
