"""The experiment suite (the seed's ``build_textbook_results``) at small sizes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.mpc import run_mpc
from gpugov.controllers.open_loop import (
    OPEN_LOOP_SEED_DEVIATIONS,
    select_frequency_experiment_window,
    shift_largest_burst,
)
from gpugov.controllers.scheduling import SCHEDULING_SEED_DEVIATIONS, scheduling_clock_calibration
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.types import Request, RequestRecord
from gpugov.plant.workload import load_trace, workload_checksum
from gpugov.study.experiments import (
    EXPERIMENT_SEED_DEVIATIONS,
    build_textbook_results,
    matched_first_token_latency,
    measurement_caveats,
    moved_request_ids,
    optional_difference,
    queued_at,
)

SMALL_SIZES = {
    "fqi_transitions": 1_500,
    "fqi_sweeps": 3,
    "fqi_trees": 10,
    "evaluation_episodes": 50,
    "evaluation_horizon_steps": 60,
}

# The seed's result structure: every key its build_textbook_results writes, per section.
SEED_METADATA_KEYS = {
    "profile_status",
    "profile_source",
    "load_dilation",
    "frequency_experiment_source_window_s",
    "frequency_experiment_source_window_start_s",
    "frequency_experiment_source_window_end_s",
    "frequency_experiment_request_count",
    "frequency_experiment_window",
    "scheduling_trace_source_window_s",
    "warning",
    "expected_output_tokens",
    "profile_csv_sha256",
    "measurement_validation",
}
SEED_MEASUREMENT_VALIDATION_KEYS = {
    "validated",
    "manifest_status",
    "manifest_sha256",
    "thermal_fit_r_squared",
    "thermal_fit_is_weak",
    "maximum_profile_phase_power_w",
    "configured_power_limit_w",
    "profile_phase_power_exceeds_limit",
}
SEED_RESULT_KEYS = {
    "controller_name",
    "scheduler_name",
    "time_s",
    "prefill_queue",
    "decode_active",
    "completed_requests",
    "kv_tokens",
    "power_w",
    "requested_clock_mhz",
    "realized_clock_mhz",
    "energy_j",
    "temperature_c",
    "phase",
    "metrics",
}
SEED_MATCHED_KEYS = {
    "matched_moved_burst_mean_ttft_s",
    "matched_moved_burst_p95_ttft_s",
    "matched_moved_burst_request_count",
    "matched_moved_burst_observed_ttft_count",
    "matched_moved_burst_censored_ttft_count",
    "matched_moved_burst_ttft_status",
    "queued_requests_at_30_s",
}
SEED_MISMATCH_KEYS = {
    "moved_request_count",
    "arrival_shift_s",
    "matched_ttft_comparison_available",
    "matched_mean_ttft_delta_s",
    "matched_p95_ttft_delta_s",
    "queued_requests_at_30_s_delta",
    "peak_queue_at_minimum_clock_delta",
}
SEED_PLAN_KEYS = {
    "time_s",
    "continuous_clock_mhz",
    "applied_clock_mhz",
    "predicted_backlog_s",
    "objective",
    "optimization_method",
    "success",
    "message",
}
SEED_SCHEDULING_KEYS = {
    "controllers",
    "bellman_residual",
    "iterations",
    "exact_policy_evaluation",
    "policy_slice_age_4",
    "policy_slices",
    "description",
    "calibration",
}
SEED_CALIBRATION_KEYS = {
    "arrival_probability",
    "prefill_completion_probability",
    "decode_completion_probability",
    "action_energy_j",
    "decision_period_s",
    "fixed_requested_clock_mhz",
    "batch_balanced_realized_clock_mhz",
    "trajectory_semantics",
}
SEED_TRAJECTORY_KEYS = {
    "controller_name",
    "scheduler_name",
    "time_s",
    "prefill_queue",
    "decode_active",
    "completed_requests",
    "kv_tokens",
    "power_w",
    "requested_clock_mhz",
    "energy_j",
    "phase",
    "metrics",
}
SEED_EVALUATION_KEYS = {
    "mean_discounted_return",
    "mean_queue_length",
    "mean_waiting_time_s",
    "mean_decode_stalls",
    "mean_dropped_arrivals",
    "episodes",
    "horizon_steps",
}
SEED_PROTOCOL_KEYS = {
    "transitions_per_dataset",
    "sweeps",
    "trees",
    "maximum_depth",
    "minimum_leaf_size",
    "random_seed",
    "evaluation_episodes",
    "evaluation_horizon_steps",
}


class StepTimer:
    """A deterministic monotonic timer: every reading is 1 ms after the previous one."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


@pytest.fixture(scope="module")
def plant() -> ServingPlant:
    # A short drain keeps the on-plant runs of policies that starve requests brief.
    return ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"), drain_timeout_s=60.0)


@pytest.fixture(scope="module")
def workloads() -> tuple[tuple[Request, ...], tuple[Request, ...]]:
    evaluation, _ = load_trace("azure-conv-10min", duration_s=120.0)
    animation = tuple(r for r in evaluation if r.arrival_time_s < 20.0)
    return animation, evaluation


def _run(plant, workloads, **options: Any) -> dict[str, Any]:
    animation, evaluation = workloads
    return build_textbook_results(
        animation,
        evaluation,
        plant,
        scheduling_trace_source_window_s=120.0,
        mpc_timer=StepTimer(),
        **SMALL_SIZES,
        **options,
    )


PROGRESS: list[str] = []


@pytest.fixture(scope="module")
def results(plant, workloads) -> dict[str, Any]:
    PROGRESS.clear()
    return _run(plant, workloads, extra_metadata={"note": "test"}, progress=PROGRESS.append)


def test_every_seed_key_is_present(results) -> None:
    assert {"metadata", "modeling", "open_loop", "mpc", "scheduling", "fqi"} <= set(results)
    metadata = results["metadata"]
    assert set(metadata) >= SEED_METADATA_KEYS
    assert set(metadata["measurement_validation"]) >= SEED_MEASUREMENT_VALIDATION_KEYS
    assert set(results["modeling"]) >= SEED_RESULT_KEYS

    open_loop = results["open_loop"]
    assert set(open_loop["controllers"]) == {"nominal", "shifted"}
    for payload in open_loop["controllers"].values():
        assert set(payload) >= SEED_RESULT_KEYS
        assert set(payload["metrics"]) >= SEED_MATCHED_KEYS
    assert set(open_loop["mismatch_metrics"]) >= SEED_MISMATCH_KEYS
    assert set(open_loop["plan"]) >= SEED_PLAN_KEYS

    assert set(results["mpc"]["controllers"]) == {"max", "reactive", "open-loop", "mpc-slsqp"}
    for payload in results["mpc"]["controllers"].values():
        assert set(payload) >= SEED_RESULT_KEYS

    scheduling = results["scheduling"]
    assert set(scheduling) >= SEED_SCHEDULING_KEYS
    assert set(scheduling["controllers"]) == {"exact_dp", "decode_priority"}
    assert set(scheduling["calibration"]) >= SEED_CALIBRATION_KEYS
    assert set(scheduling["exact_policy_evaluation"]) >= SEED_EVALUATION_KEYS
    assert set(scheduling["policy_slices"]) == {"0", "1", "2", "3", "4"}

    fqi = results["fqi"]
    assert set(fqi) >= {"controllers", "metrics", "policy_slices", "coverage_slices", "protocol"}
    assert set(fqi["controllers"]) == {"exact_dp", "broad_fqi", "narrow_fqi"}
    for trajectory in [*fqi["controllers"].values(), *scheduling["controllers"].values()]:
        assert set(trajectory) >= SEED_TRAJECTORY_KEYS
    assert set(fqi["metrics"]) == {"exact_dp", "broad_fqi", "narrow_fqi"}
    for key in ("broad_fqi", "narrow_fqi"):
        assert SEED_EVALUATION_KEYS | {"coverage_fraction", "policy_disagreement_fraction"} <= set(
            fqi["metrics"][key]
        )
    assert set(fqi["policy_slices"]) == {"exact_dp", "broad_fqi", "narrow_fqi"}
    assert set(fqi["coverage_slices"]) == {"broad_fqi", "narrow_fqi"}
    assert set(fqi["protocol"]) >= SEED_PROTOCOL_KEYS


def test_slices_are_seven_by_seven_action_tables(results) -> None:
    for policy in results["fqi"]["policy_slices"].values():
        for table in policy.values():
            array = np.asarray(table)
            assert array.shape == (7, 7)
            assert set(np.unique(array)) <= {0, 1, 2}
    for coverage in results["fqi"]["coverage_slices"].values():
        for table in coverage.values():
            assert np.asarray(table).shape == (7, 7)
            assert np.min(table) >= 0
    assert (
        results["scheduling"]["policy_slice_age_4"]
        == results["fqi"]["policy_slices"]["exact_dp"]["4"]
    )


def test_json_is_strict_and_identical_for_identical_runs(plant, workloads, results) -> None:
    first = json.dumps(results, allow_nan=False, sort_keys=True)
    again = json.dumps(
        _run(plant, workloads, extra_metadata={"note": "test"}), allow_nan=False, sort_keys=True
    )
    assert first == again


def test_protocol_and_sizes_are_recorded(results) -> None:
    protocol = results["fqi"]["protocol"]
    assert protocol["transitions_per_dataset"] == SMALL_SIZES["fqi_transitions"]
    assert protocol["sweeps"] == SMALL_SIZES["fqi_sweeps"]
    assert protocol["trees"] == SMALL_SIZES["fqi_trees"]
    assert protocol["evaluation_episodes"] == SMALL_SIZES["evaluation_episodes"]
    for key in ("exact_dp", "broad_fqi", "narrow_fqi"):
        assert results["fqi"]["metrics"][key]["episodes"] == SMALL_SIZES["evaluation_episodes"]
        assert (
            results["fqi"]["metrics"][key]["horizon_steps"]
            == SMALL_SIZES["evaluation_horizon_steps"]
        )
    assert results["metadata"]["sizes"] == SMALL_SIZES
    assert results["metadata"]["scheduling_trace_source_window_s"] == 120.0


def test_metadata_carries_deviations_checksums_and_caller_provenance(
    plant, workloads, results
) -> None:
    animation, evaluation = workloads
    metadata = results["metadata"]
    deviations = metadata["seed_deviations"]
    assert deviations["open_loop"] == list(OPEN_LOOP_SEED_DEVIATIONS)
    assert deviations["scheduling"] == list(SCHEDULING_SEED_DEVIATIONS)
    assert deviations["experiments"] == list(EXPERIMENT_SEED_DEVIATIONS)
    # Without discrete refinement the refinement deviation is not claimed.
    assert deviations["mpc"] and not any("refine_discrete_plan" in d for d in deviations["mpc"])
    inputs = metadata["inputs"]
    assert inputs["animation_workload_checksum"] == workload_checksum(animation)
    assert inputs["evaluation_workload_checksum"] == workload_checksum(evaluation)
    assert inputs["evaluation_request_count"] == len(evaluation)
    assert inputs["profile_csv_sha256"] == plant.profile.profile_csv_sha256
    assert len(inputs["manifest_sha256"]) == 64
    assert metadata["profile_status"] == "literature-derived"
    assert "not measured" in metadata["warning"].lower()
    assert metadata["note"] == "test"
    assert metadata["load_dilation"] == 1.0


def test_open_loop_experiment_matches_its_window(plant, workloads, results) -> None:
    _, evaluation = workloads
    window = results["metadata"]["frequency_experiment_window"]
    mismatch = results["open_loop"]["mismatch_metrics"]
    assert mismatch["moved_request_count"] == window["shiftable_burst_request_count"] > 0
    assert mismatch["arrival_shift_s"] == -20.0
    nominal = results["open_loop"]["controllers"]["nominal"]["metrics"]
    assert nominal["arrived_requests"] == window["request_count"]
    assert nominal["matched_moved_burst_request_count"] == mismatch["moved_request_count"]
    # The open-loop controller of the MPC comparison is the shifted open-loop run.
    assert results["mpc"]["controllers"]["open-loop"]["metrics"] == {
        key: value
        for key, value in results["open_loop"]["controllers"]["shifted"]["metrics"].items()
        if key in results["mpc"]["controllers"]["open-loop"]["metrics"]
    }
    plan = results["open_loop"]["plan"]
    assert plan["success"] and len(plan["applied_clock_mhz"]) == 60
    assert set(plan["applied_clock_mhz"]) <= set(plant.profile.clock_mhz.tolist())
    assert results["metadata"]["expected_output_tokens"] == pytest.approx(
        float(np.mean([r.output_tokens for r in evaluation]))
    )


def test_mpc_section_is_run_mpc_on_the_shifted_window(plant, workloads, results) -> None:
    _, evaluation = workloads
    expected = float(np.mean([r.output_tokens for r in evaluation]))
    window, _ = select_frequency_experiment_window(
        evaluation, plant.profile, expected_output_tokens=expected
    )
    shifted = shift_largest_burst(window, plant.profile, expected_output_tokens=expected)
    reference = run_mpc(shifted, plant, timer=StepTimer())
    suite = results["mpc"]["controllers"]["mpc-slsqp"]
    assert suite["metrics"] == reference.metrics.as_dict()
    expected = reference.as_dict(stride=5)
    assert suite["requested_clock_mhz"] == expected["requested_clock_mhz"]
    assert suite["power_w"] == expected["power_w"]
    diagnostics = results["mpc"]["diagnostics"]
    assert diagnostics["solves"] == reference.metadata["mpc"]["solves"]
    assert diagnostics["fallback_count"] == reference.metadata["mpc"]["fallback_count"]
    assert len(diagnostics["solve_times_s"]) == diagnostics["solves"]
    assert diagnostics["solve_time_p99_s"] == pytest.approx(0.001)


def test_scheduling_on_plant_compares_every_policy_at_the_calibration_clock(
    plant, workloads, results
) -> None:
    _, evaluation = workloads
    section = results["scheduling_on_plant"]
    keys = {"exact_dp", "broad_fqi", "narrow_fqi", "decode_priority", "chunked_prefill"}
    assert set(section["schedulers"]) == keys == set(section["metrics"])
    clock, _ = scheduling_clock_calibration(plant.profile)
    assert section["clock_mhz"] == clock
    assert section["workload_checksum"] == workload_checksum(evaluation)
    for key, payload in section["schedulers"].items():
        metrics = section["metrics"][key]
        assert metrics["arrived_requests"] == len(evaluation)
        assert metrics["completed_requests"] + metrics["censored_requests"] == len(evaluation)
        for name in ("energy_j", "ttft_p95_s", "tpot_p95_s", "slo_attainment"):
            assert name in metrics
        # After the plant's initial sample every requested clock is the fixed clock.
        assert set(payload["requested_clock_mhz"][1:]) == {clock}
    # The plain chunked-prefill scheduler is the plant's own: the same run as simulate's.
    reference = simulate(
        evaluation,
        plant,
        chunked_prefill_scheduler,
        lambda observation: clock,
    )
    assert section["metrics"]["chunked_prefill"]["energy_j"] == reference.metrics.energy_j


def test_progress_reports_each_long_step(results) -> None:
    text = "\n".join(PROGRESS)
    for needle in (
        "modelling",
        "open loop",
        "MPC",
        "value iteration",
        "broad",
        "narrow",
        "evaluation",
        "on the plant",
    ):
        assert needle in text


def test_empty_workloads_are_rejected(plant) -> None:
    request = Request(0, 0.0, 100, 10)
    with pytest.raises(ValueError, match="must not be empty"):
        build_textbook_results((), (request,), plant)
    with pytest.raises(ValueError, match="must not be empty"):
        build_textbook_results((request,), (), plant)


# ------------------------------------------------------------------- the helpers
def _record(request_id: int, arrival: float, first: float | None) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        arrival_time_s=arrival,
        prompt_tokens=100,
        output_tokens=10,
        first_token_time_s=first,
        finish_time_s=None if first is None else first + 1.0,
        generated_tokens=0 if first is None else 10,
    )


def test_matched_first_token_latency_keeps_censoring_visible() -> None:
    records = [_record(0, 0.0, 0.5), _record(1, 1.0, 2.0), _record(2, 2.0, None)]
    complete = matched_first_token_latency(records, {0, 1})
    assert complete["matched_moved_burst_ttft_status"] == "available_complete"
    assert complete["matched_moved_burst_mean_ttft_s"] == pytest.approx(0.75)
    assert complete["matched_moved_burst_p95_ttft_s"] == pytest.approx(
        float(np.percentile([0.5, 1.0], 95))
    )
    censored = matched_first_token_latency(records, {0, 2})
    assert censored["matched_moved_burst_ttft_status"] == "available_with_censoring"
    assert censored["matched_moved_burst_censored_ttft_count"] == 1
    assert censored["matched_moved_burst_observed_ttft_count"] == 1
    none_observed = matched_first_token_latency(records, {2})
    assert none_observed["matched_moved_burst_ttft_status"] == (
        "unavailable_no_observed_first_tokens"
    )
    assert none_observed["matched_moved_burst_mean_ttft_s"] is None
    empty = matched_first_token_latency(records, set())
    assert empty["matched_moved_burst_ttft_status"] == "unavailable_no_moved_requests"
    assert empty["matched_moved_burst_p95_ttft_s"] is None


def test_optional_difference_and_moved_ids() -> None:
    assert optional_difference(None, 1.0) is None
    assert optional_difference(1.0, None) is None
    assert optional_difference(3.0, 1.0) == 2.0
    original = (Request(0, 0.0, 10, 5), Request(1, 30.0, 10, 5), Request(2, 31.0, 10, 5))
    shifted = (Request(1, 10.0, 10, 5), Request(0, 0.0, 10, 5), Request(2, 11.0, 10, 5))
    assert moved_request_ids(original, shifted) == {1, 2}
    assert moved_request_ids(original, original) == set()


def test_queued_at_reads_the_last_sample_at_or_before_the_time(workloads) -> None:
    animation, _ = workloads
    result = simulate(animation[:20], make_plant(), chunked_prefill_scheduler, lambda o: 1980.0)
    assert queued_at(result, -1.0) == 0.0
    index = int(np.searchsorted(result.time_s, 3.05, side="right") - 1)
    assert queued_at(result, 3.05) == result.prefill_queue[index] + result.decode_active[index]


def test_measurement_caveats_follow_the_seed() -> None:
    synthetic_plant = make_plant()
    warning, r_squared, weak, peak, exceeds = measurement_caveats(synthetic_plant)
    assert warning == "" and r_squared is None and weak is None and not exceeds
    assert peak == pytest.approx(680.0)  # prefill power at the maximum clock
    measured = replace(
        synthetic_plant,
        profile=make_profile(status="measured", thermal_fit_r_squared=0.05, warning="Bench."),
        power_limit_w=600.0,
    )
    warning, r_squared, weak, peak, exceeds = measurement_caveats(measured)
    assert r_squared == pytest.approx(0.05) and weak is True and exceeds is True
    assert warning.startswith("Bench.") and "weak" in warning and "power cap" in warning
    missing = replace(synthetic_plant, profile=make_profile(status="measured"))
    warning, r_squared, weak, _, exceeds = measurement_caveats(missing)
    assert r_squared is None and weak is True and not exceeds
    assert "does not report a finite R-squared" in warning
