"""The seed's experiment suite: every method on one workload, one JSON-able result.

:func:`build_textbook_results` is the seed's function of the same name, ported step for
step: a modelling run at the maximum clock, the open-loop plan on a selected 60 s window
(nominal arrivals, then the largest burst moved 20 s earlier), the MPC comparison
(``max``, ``reactive``, the same ``open-loop`` plan, the seed's SLSQP MPC ``mpc-slsqp``) on
the shifted window, and the scheduling MDP (exact DP, fitted Q iteration on broad and
narrow logs, Monte Carlo evaluation, policy and coverage slices). The returned dict has the
seed's top-level keys (``metadata``, ``modeling``, ``open_loop``, ``mpc``, ``scheduling``,
``fqi``) with the seed's inner keys, except one rename: the MPC comparison's controllers
are keyed and named by the one name gpugov uses everywhere (CLI spec, metrics label,
recordings, scoreboard), so the seed's ``maximum_clock``, ``offline`` and ``mpc`` are
``max``, ``open-loop`` and ``mpc-slsqp``. Additions never remove a seed key:

* ``metadata`` also holds ``seed_deviations`` (every place the ported methods or this
  suite differ from the seed, and why), ``inputs`` (workload checksums and lengths, the
  profile's name and SHA-256 digests) and whatever the caller passes as
  ``extra_metadata`` (the CLI adds the trace's path, digest and window, and the gpugov
  version);
* ``mpc.diagnostics`` repeats the MPC's solve statistics with the p99 solve time;
* ``scheduling_on_plant`` (beyond the seed) runs the DP, broad-FQI, narrow-FQI
  and decode-priority policies as :class:`~gpugov.controllers.scheduling.policy.MDPPolicyScheduler`
  on the detailed plant, next to the plain chunked-prefill scheduler, at one fixed clock
  (the MDP's calibration clock) on the evaluation workload.

Pure computation: no file I/O, no printing. ``progress`` receives one line per step.
Everything is deterministic: the MPC runs in virtual time, so a deterministic budget of
cost evaluations bounds its solves, never the wall clock (a busy machine cannot change a
decision); only the reported solve times vary (``perf_counter``; pass ``mpc_timer`` to fix
them too).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gpugov.controllers.open_loop import (
    OPEN_LOOP_SEED_DEVIATIONS,
)
from gpugov.controllers.scheduling import (
    REDUCED_REPLAY_RANDOM_SEED,
    REDUCED_REPLAY_STEPS,
    SCHEDULING_SEED_DEVIATIONS,
    policy_slice,
    reduced_policy_trajectory,
)
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult
from gpugov.plant.types import Request, RequestRecord
from gpugov.plant.workload import workload_checksum
from gpugov.study.experiment_parts import (
    ARRIVAL_SHIFT_S,
    FIRST_STAGE,
    FQI_MAXIMUM_DEPTH,
    FQI_MINIMUM_LEAF_SIZE,
    FQI_RANDOM_SEED,
    FREQUENCY_EXPERIMENT_WINDOW_S,
    SuiteInputs,
    case_study_settings,
    moved_request_ids,
    run_part,
    run_scheduling_on_plant,
)

ProgressCallback = Callable[[str], None]

QUEUE_PROBE_TIME_S = 30.0

EXPERIMENT_SEED_DEVIATIONS = (
    "the MPC run is run_mpc's (same defaults and declared forecast), built from "
    "MPCController so its diagnostics also report the p99 solve time; the seed reported "
    "no solve-time distribution",
    "scheduling_trace_source_window_s is the caller's evaluation window (the seed wrote "
    "the constant 300.0, which its caller used); the gpugov CLI uses 300 s too",
    "the exact-DP reduced trajectory is computed once and copied into both the "
    "scheduling and fqi sections (the seed computed the identical sample path twice)",
)
"""Where this suite itself differs from the seed's ``build_textbook_results``."""

TIMING_FIELDS = ("solve_time_p50_s", "solve_time_p99_s", "solve_time_max_s", "solve_times_s")
"""Keys of MPC diagnostics that hold wall-clock solve times (machine dependent)."""


# ----------------------------------------------------------------- the seed's helpers
def matched_first_token_latency(
    request_records: Sequence[RequestRecord],
    request_ids: set[int],
) -> dict[str, float | int | str | None]:
    """Summarise TTFT for a prespecified request subset without hiding censoring.

    ``None`` is the only honest latency summary when the subset is empty or none of its
    requests produced a first token; the counts and status tell those cases apart.

    Raises:
        ValueError: a non-finite matched latency.
    """
    values = np.asarray(
        [
            record.first_token_time_s - record.arrival_time_s
            for record in request_records
            if record.request_id in request_ids and record.first_token_time_s is not None
        ],
        dtype=float,
    )
    if values.size and np.any(~np.isfinite(values)):
        raise ValueError("matched first-token latencies must be finite")
    selected_count = len(request_ids)
    observed_count = int(values.size)
    censored_count = max(0, selected_count - observed_count)
    if selected_count == 0:
        status = "unavailable_no_moved_requests"
    elif observed_count == 0:
        status = "unavailable_no_observed_first_tokens"
    elif censored_count:
        status = "available_with_censoring"
    else:
        status = "available_complete"
    mean = float(np.mean(values)) if observed_count else None
    p95 = float(np.percentile(values, 95)) if observed_count else None
    return {
        "matched_moved_burst_mean_ttft_s": mean,
        "matched_moved_burst_p95_ttft_s": p95,
        "matched_moved_burst_request_count": selected_count,
        "matched_moved_burst_observed_ttft_count": observed_count,
        "matched_moved_burst_censored_ttft_count": censored_count,
        "matched_moved_burst_ttft_status": status,
    }


_matched_first_token_latency = matched_first_token_latency


def optional_difference(minuend: float | None, subtrahend: float | None) -> float | None:
    """``minuend - subtrahend`` when both are available, else ``None``.

    Raises:
        ValueError: a non-finite difference.
    """
    if minuend is None or subtrahend is None:
        return None
    difference = float(minuend - subtrahend)
    if not np.isfinite(difference):
        raise ValueError("matched latency difference must be finite")
    return difference


_optional_difference = optional_difference


def measurement_caveats(plant: ServingPlant) -> tuple[str, float | None, bool | None, float, bool]:
    """The profile's caveats, without changing any outcome.

    Returns:
        ``(warning, thermal_fit_r_squared, thermal_fit_is_weak,
        maximum_profile_phase_power_w, profile_phase_power_exceeds_limit)``; the warning
        joins the manifest's own warning with the seed's measured-profile checks (weak
        or missing thermal fit, phase power above the power cap). The weak-fit flag is
        ``None`` for a profile that is not measured.
    """
    existing = plant.profile.manifest.get("warning", "")
    warnings = [str(existing).strip()] if existing else []
    raw_r_squared = plant.profile.manifest.get("thermal_fit_r_squared")
    try:
        thermal_r_squared = float(raw_r_squared) if raw_r_squared is not None else None
    except (TypeError, ValueError):
        thermal_r_squared = None
    if thermal_r_squared is not None and not np.isfinite(thermal_r_squared):
        thermal_r_squared = None
    thermal_fit_is_weak: bool | None = None
    if plant.profile.is_measured:
        thermal_fit_is_weak = thermal_r_squared is None or thermal_r_squared < 0.1
        if thermal_r_squared is None:
            warnings.append(
                "The measured profile does not report a finite R-squared for the one-state "
                "thermal RC fit; model-based temperature forecasts and thermal-constraint "
                "conclusions are therefore weakly supported."
            )
        elif thermal_fit_is_weak:
            warnings.append(
                "The one-state thermal RC fit is weak "
                f"(R-squared={thermal_r_squared:.4g}); model-based temperature forecasts "
                "and thermal-constraint conclusions are weakly supported by the measured "
                "transient."
            )
    maximum_profile_phase_power_w = float(
        max(
            np.max(plant.profile.idle_power_w),
            np.max(plant.profile.prefill_power_w),
            np.max(plant.profile.decode_power_w),
        )
    )
    profile_phase_power_exceeds_limit = bool(
        maximum_profile_phase_power_w > plant.power_limit_w + 1e-9
    )
    if plant.profile.is_measured and profile_phase_power_exceeds_limit:
        warnings.append(
            "The measured phase-power summary reaches "
            f"{maximum_profile_phase_power_w:.3f} W, above the configured "
            f"{plant.power_limit_w:.3f} W power cap. The requested cap is not treated as a "
            "hard sample-wise guarantee; violations remain reported."
        )
    return (
        " ".join(warnings),
        thermal_r_squared,
        thermal_fit_is_weak,
        maximum_profile_phase_power_w,
        profile_phase_power_exceeds_limit,
    )


_measurement_caveats = measurement_caveats


def queued_at(result: ServingResult, time_s: float) -> float:
    """Requests in the system (waiting for a first token plus decoding) at ``time_s``;
    0 before the first sample."""
    index = int(np.searchsorted(result.time_s, time_s, side="right") - 1)
    if index < 0:
        return 0.0
    return float(result.prefill_queue[index] + result.decode_active[index])


# ---------------------------------------------------------------------- the suite
def build_textbook_results(
    animation_workload: Sequence[Request],
    evaluation_workload: Sequence[Request],
    plant: ServingPlant,
    *,
    load_dilation: float = 1.0,
    fqi_transitions: int = 50_000,
    fqi_sweeps: int = 50,
    fqi_trees: int = 200,
    evaluation_episodes: int = 2_000,
    evaluation_horizon_steps: int = 300,
    progress: ProgressCallback | None = None,
    scheduling_trace_source_window_s: float = 300.0,
    mpc_timer: Callable[[], float] | None = None,
    extra_metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the deterministic experiment suite (the seed's ``build_textbook_results``).

    Args:
        animation_workload: requests of the modelling run (maximum clock).
        evaluation_workload: the trace window the frequency experiment is selected from
            and the scheduling MDP is calibrated on; sorted by arrival.
        plant: the serving plant (profile, limits, thermal model).
        load_dilation: how the caller dilated the trace's arrivals (recorded only).
        fqi_transitions: logged transitions per FQI dataset.
        fqi_sweeps: FQI sweeps.
        fqi_trees: Extra-Trees per sweep.
        evaluation_episodes: Monte Carlo episodes per evaluated policy.
        evaluation_horizon_steps: steps per episode.
        progress: called with one line before each step (for a CLI's progress display).
        scheduling_trace_source_window_s: length of the trace window the evaluation
            workload was cut from (recorded only; the seed's caller used 300 s).
        mpc_timer: monotonic timer for the MPC's solve times; default ``perf_counter``.
            A deterministic timer makes the whole result repeatable bit for bit.
        extra_metadata: merged into ``metadata`` (provenance only the caller knows).

    Returns:
        A JSON-able dict (``json.dumps(..., allow_nan=False)`` succeeds) with the seed's
        structure; see the module docstring for the additions.

    Raises:
        ValueError: an empty workload, or no trace window with a shiftable burst.
        RuntimeError: the selected window yields no moved burst (as in the seed).
    """
    if not animation_workload or not evaluation_workload:
        raise ValueError("animation_workload and evaluation_workload must not be empty")
    inputs = SuiteInputs(
        tuple(animation_workload),
        tuple(evaluation_workload),
        plant,
        fqi_transitions=fqi_transitions,
        fqi_sweeps=fqi_sweeps,
        fqi_trees=fqi_trees,
        evaluation_episodes=evaluation_episodes,
        evaluation_horizon_steps=evaluation_horizon_steps,
        mpc_timer=mpc_timer,
    )
    parts = {name: run_part(name, inputs, progress) for name in FIRST_STAGE}
    on_plant = run_scheduling_on_plant(inputs, parts, progress)
    return assemble_textbook_results(
        inputs,
        parts,
        on_plant,
        load_dilation=load_dilation,
        scheduling_trace_source_window_s=scheduling_trace_source_window_s,
        extra_metadata=extra_metadata,
        progress=progress,
    )


def assemble_textbook_results(
    inputs: SuiteInputs,
    parts: Mapping[str, Mapping[str, Any]],
    scheduling_on_plant: dict[str, Any],
    *,
    load_dilation: float = 1.0,
    scheduling_trace_source_window_s: float = 300.0,
    extra_metadata: Mapping[str, Any] | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """The suite's result from its parts (:mod:`gpugov.study.experiment_parts`): the
    first stage's outputs by part name and the second stage's ``scheduling_on_plant``."""

    def report(message: str) -> None:
        if progress is not None:
            progress(message)

    animation_workload = inputs.animation_workload
    evaluation_workload = inputs.evaluation_workload
    plant = inputs.plant
    fqi_transitions = inputs.fqi_transitions
    fqi_sweeps = inputs.fqi_sweeps
    fqi_trees = inputs.fqi_trees
    evaluation_episodes = inputs.evaluation_episodes
    evaluation_horizon_steps = inputs.evaluation_horizon_steps
    stride = inputs.stride
    expected_output_tokens = inputs.expected_output_tokens
    modeling_result = parts["modeling"]["modeling_result"]
    frequency = parts["frequency"]
    frequency_workload = frequency["frequency_workload"]
    frequency_window_metadata = frequency["frequency_window_metadata"]
    plan = frequency["plan"]
    open_loop_nominal = frequency["open_loop_nominal"]
    open_loop_shifted = frequency["open_loop_shifted"]
    shifted_workload = frequency["shifted_workload"]
    moved_ids = frequency["moved_ids"]
    maximum_result = frequency["maximum_result"]
    reactive_result = frequency["reactive_result"]
    mpc_result = frequency["mpc_result"]
    scheduling = parts["scheduling"]
    mdp = scheduling["mdp"]
    exact = scheduling["exact"]
    fixed_requested_clock_mhz = scheduling["fixed_requested_clock_mhz"]
    batch_balanced_realized_clock_mhz = scheduling["batch_balanced_realized_clock_mhz"]
    exact_evaluation = scheduling["exact_evaluation"]
    heuristic_policy = scheduling["heuristic_policy"]
    broad = parts["fqi_broad"]
    narrow = parts["fqi_narrow"]
    broad_evaluation = broad["evaluation"]
    narrow_evaluation = narrow["evaluation"]

    report("assembling results")
    nominal_matched = matched_first_token_latency(open_loop_nominal.request_records, moved_ids)
    shifted_matched = matched_first_token_latency(open_loop_shifted.request_records, moved_ids)
    nominal_matched_mean = nominal_matched["matched_moved_burst_mean_ttft_s"]
    nominal_matched_p95 = nominal_matched["matched_moved_burst_p95_ttft_s"]
    shifted_matched_mean = shifted_matched["matched_moved_burst_mean_ttft_s"]
    shifted_matched_p95 = shifted_matched["matched_moved_burst_p95_ttft_s"]
    assert nominal_matched_mean is None or isinstance(nominal_matched_mean, float)
    assert nominal_matched_p95 is None or isinstance(nominal_matched_p95, float)
    assert shifted_matched_mean is None or isinstance(shifted_matched_mean, float)
    assert shifted_matched_p95 is None or isinstance(shifted_matched_p95, float)
    nominal_open_payload = open_loop_nominal.as_dict(stride=stride)
    shifted_open_payload = open_loop_shifted.as_dict(stride=stride)
    nominal_open_payload["metrics"].update(
        {
            **nominal_matched,
            "queued_requests_at_30_s": queued_at(open_loop_nominal, QUEUE_PROBE_TIME_S),
        }
    )
    shifted_open_payload["metrics"].update(
        {
            **shifted_matched,
            "queued_requests_at_30_s": queued_at(open_loop_shifted, QUEUE_PROBE_TIME_S),
        }
    )

    def slices(policy: Any) -> dict[str, list[list[int]]]:
        return {str(age): policy_slice(policy, oldest_age_bin=age).tolist() for age in range(5)}

    exact_slices = slices(exact.policy)
    broad_slices = slices(broad["policy"])
    narrow_slices = slices(narrow["policy"])

    def trajectory(policy: Any, label: str) -> dict[str, object]:
        return reduced_policy_trajectory(
            mdp,
            policy,
            label=label,
            fixed_requested_clock_mhz=fixed_requested_clock_mhz,
            batch_balanced_realized_clock_mhz=batch_balanced_realized_clock_mhz,
        )

    exact_trajectory = trajectory(exact.policy, "Exact DP")

    (
        warning,
        thermal_fit_r_squared,
        thermal_fit_is_weak,
        maximum_profile_phase_power_w,
        profile_phase_power_exceeds_limit,
    ) = measurement_caveats(plant)

    mpc_diagnostics = mpc_result.metadata["mpc"]
    metadata: dict[str, Any] = {
        "profile_status": plant.profile.profile_status,
        "profile_source": plant.profile.source_label,
        "load_dilation": float(load_dilation),
        "frequency_experiment_source_window_s": FREQUENCY_EXPERIMENT_WINDOW_S,
        "frequency_experiment_source_window_start_s": (
            frequency_window_metadata["source_window_start_s"]
        ),
        "frequency_experiment_source_window_end_s": (
            frequency_window_metadata["source_window_end_s"]
        ),
        "frequency_experiment_request_count": frequency_window_metadata["request_count"],
        "frequency_experiment_window": frequency_window_metadata,
        "scheduling_trace_source_window_s": float(scheduling_trace_source_window_s),
        "warning": warning,
        "expected_output_tokens": expected_output_tokens,
        "profile_csv_sha256": plant.profile.profile_csv_sha256,
        "measurement_validation": {
            "validated": plant.profile.measurement_validated,
            "manifest_status": plant.profile.manifest.get("status", "not_measured"),
            "manifest_sha256": plant.profile.manifest_sha256,
            "thermal_fit_r_squared": thermal_fit_r_squared,
            "thermal_fit_is_weak": thermal_fit_is_weak,
            "maximum_profile_phase_power_w": maximum_profile_phase_power_w,
            "configured_power_limit_w": float(plant.power_limit_w),
            "profile_phase_power_exceeds_limit": profile_phase_power_exceeds_limit,
        },
        "seed_deviations": {
            "open_loop": list(OPEN_LOOP_SEED_DEVIATIONS),
            "mpc": list(mpc_diagnostics["seed_deviations"]),
            "scheduling": list(SCHEDULING_SEED_DEVIATIONS),
            "experiments": list(EXPERIMENT_SEED_DEVIATIONS),
        },
        "inputs": {
            "animation_workload_checksum": workload_checksum(animation_workload),
            "animation_request_count": len(animation_workload),
            "evaluation_workload_checksum": workload_checksum(evaluation_workload),
            "evaluation_request_count": len(evaluation_workload),
            "frequency_workload_checksum": workload_checksum(frequency_workload),
            "shifted_workload_checksum": workload_checksum(shifted_workload),
            "profile_name": plant.profile.name,
            "profile_csv_sha256": plant.profile.profile_csv_sha256,
            "manifest_sha256": plant.profile.manifest_sha256,
            "plant": plant.describe(),
        },
        "sizes": {
            "fqi_transitions": fqi_transitions,
            "fqi_sweeps": fqi_sweeps,
            "fqi_trees": fqi_trees,
            "evaluation_episodes": evaluation_episodes,
            "evaluation_horizon_steps": evaluation_horizon_steps,
        },
        "timing_fields": list(TIMING_FIELDS),
        "controllers": case_study_settings(),
    }
    metadata.update(dict(extra_metadata or {}))

    return {
        "metadata": metadata,
        "modeling": modeling_result.as_dict(stride=stride),
        "open_loop": {
            "controllers": {"nominal": nominal_open_payload, "shifted": shifted_open_payload},
            "mismatch_metrics": {
                "moved_request_count": len(moved_ids),
                "arrival_shift_s": -ARRIVAL_SHIFT_S,
                "matched_ttft_comparison_available": bool(
                    nominal_matched_mean is not None
                    and nominal_matched_p95 is not None
                    and shifted_matched_mean is not None
                    and shifted_matched_p95 is not None
                ),
                "matched_mean_ttft_delta_s": optional_difference(
                    shifted_matched_mean, nominal_matched_mean
                ),
                "matched_p95_ttft_delta_s": optional_difference(
                    shifted_matched_p95, nominal_matched_p95
                ),
                "queued_requests_at_30_s_delta": (
                    queued_at(open_loop_shifted, QUEUE_PROBE_TIME_S)
                    - queued_at(open_loop_nominal, QUEUE_PROBE_TIME_S)
                ),
                "peak_queue_at_minimum_clock_delta": (
                    open_loop_shifted.metrics.peak_queued_requests_at_minimum_clock
                    - open_loop_nominal.metrics.peak_queued_requests_at_minimum_clock
                ),
            },
            "plan": {
                "time_s": plan.time_s.tolist(),
                "continuous_clock_mhz": plan.continuous_clock_mhz.tolist(),
                "applied_clock_mhz": plan.applied_clock_mhz.tolist(),
                "predicted_backlog_s": plan.predicted_backlog_s.tolist(),
                # The seed wrote the raw objective; a failed LP's NaN becomes None so the
                # JSON stays strict.
                "objective": plan.objective if np.isfinite(plan.objective) else None,
                "optimization_method": plan.optimization_method,
                "success": plan.success,
                "message": plan.message,
            },
        },
        "mpc": {
            "controllers": {
                "max": maximum_result.as_dict(stride=stride),
                "reactive": reactive_result.as_dict(stride=stride),
                "open-loop": open_loop_shifted.as_dict(stride=stride),
                "mpc-slsqp": mpc_result.as_dict(stride=stride),
            },
            "diagnostics": copy.deepcopy(mpc_diagnostics),
        },
        "scheduling": {
            "controllers": {
                "exact_dp": exact_trajectory,
                "decode_priority": trajectory(heuristic_policy, "Decode-priority heuristic"),
            },
            "bellman_residual": exact.bellman_residual,
            "iterations": exact.iterations,
            "exact_policy_evaluation": exact_evaluation.as_dict(),
            "policy_slice_age_4": policy_slice(exact.policy, oldest_age_bin=4).tolist(),
            "policy_slices": exact_slices,
            "description": mdp.description,
            "calibration": {
                "arrival_probability": mdp.arrival_probability,
                "prefill_completion_probability": mdp.prefill_completion_probability,
                "decode_completion_probability": mdp.decode_completion_probability,
                "action_energy_j": mdp.action_energy.tolist(),
                "decision_period_s": mdp.decision_period_s,
                "fixed_requested_clock_mhz": fixed_requested_clock_mhz,
                "batch_balanced_realized_clock_mhz": batch_balanced_realized_clock_mhz,
                "trajectory_semantics": {
                    "source": "one_seeded_sample_path_from_reduced_mdp_not_event_simulator",
                    "random_seed": REDUCED_REPLAY_RANDOM_SEED,
                    "horizon_steps": REDUCED_REPLAY_STEPS,
                    "requested_clock_mhz": "fixed_profile_level_used_for_mdp_calibration",
                    "realized_clock_mhz": ("batch_balanced_profile_median_repeated_when_available"),
                    "power_w": "action_energy_j[action] / decision_period_s",
                    "energy_j": "cumulative_sum_of_action_energy_j[action]",
                    "temperature_c": "omitted_not_a_reduced_mdp_state",
                },
            },
        },
        "fqi": {
            "controllers": {
                "exact_dp": copy.deepcopy(exact_trajectory),
                "broad_fqi": trajectory(broad["policy"], "FQI, broad coverage"),
                "narrow_fqi": trajectory(narrow["policy"], "FQI, narrow log"),
            },
            "metrics": {
                "exact_dp": exact_evaluation.as_dict(),
                "broad_fqi": {
                    **broad_evaluation.as_dict(),
                    "coverage_fraction": broad["coverage_fraction"],
                    "policy_disagreement_fraction": broad["policy_disagreement_fraction"],
                },
                "narrow_fqi": {
                    **narrow_evaluation.as_dict(),
                    "coverage_fraction": narrow["coverage_fraction"],
                    "policy_disagreement_fraction": narrow["policy_disagreement_fraction"],
                },
            },
            "policy_slices": {
                "exact_dp": exact_slices,
                "broad_fqi": broad_slices,
                "narrow_fqi": narrow_slices,
            },
            "coverage_slices": {
                "broad_fqi": broad["coverage_slices"],
                "narrow_fqi": narrow["coverage_slices"],
            },
            "protocol": {
                "transitions_per_dataset": fqi_transitions,
                "sweeps": fqi_sweeps,
                "trees": fqi_trees,
                "maximum_depth": FQI_MAXIMUM_DEPTH,
                "minimum_leaf_size": FQI_MINIMUM_LEAF_SIZE,
                "random_seed": FQI_RANDOM_SEED,
                "evaluation_episodes": evaluation_episodes,
                "evaluation_horizon_steps": evaluation_horizon_steps,
            },
        },
        "scheduling_on_plant": scheduling_on_plant,
    }


__all__ = [
    "EXPERIMENT_SEED_DEVIATIONS",
    "TIMING_FIELDS",
    "assemble_textbook_results",
    "build_textbook_results",
    "matched_first_token_latency",
    "measurement_caveats",
    "moved_request_ids",
    "optional_difference",
    "queued_at",
]
