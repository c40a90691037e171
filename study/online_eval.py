"""Scoreboard support for the self-calibrating MPC (``mpc-online``).

Builds the controller exactly as the daemon does (config kind ``mpc-online``, forecasts
declared from the workload before the run, no profile), measures energy after a warm-up
(the capture a node sees once the model has learned) and compares the learned model with
the true profile at every clock the run visited. The true profile is read here, by the
evaluation, never by the controller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from gpugov.controllers.online.controller import REFERENCE_BATCH, OnlineMPCController
from gpugov.controllers.oracles.common import oracle_capture
from gpugov.plant import PerformanceProfile, PlantSimulation, ServingPlant, ServingResult
from gpugov.plant.types import ClockController, Request
from gpugov.study.markdown import scenario_title

WARMUP_S = 300.0
"""The warm-up: capture is also reported over what follows the first 5 minutes."""


def energy_after(result: ServingResult, start_s: float) -> float:
    """Energy (J) the run used after ``start_s`` seconds."""
    index = int(np.searchsorted(result.time_s, start_s))
    if index >= result.energy_j.size:
        return 0.0
    return float(result.energy_j[-1] - result.energy_j[index])


def capture_after(
    result: ServingResult,
    reference: ServingResult,
    oracle: ServingResult | None,
    start_s: float,
    *,
    holds: bool,
) -> float | None:
    """Oracle capture counted on the energy after ``start_s``: ``(E_max - E) / (E_max -
    E_oracle)`` over that stretch (:func:`oracle_capture`'s rule); None when the
    controller does not hold the SLO over the whole run, there is no oracle, or the oracle
    saves nothing there (at most a millionth of the maximum clock's energy)."""
    if oracle is None:
        return None
    return oracle_capture(
        energy_after(reference, start_s),
        energy_after(result, start_s),
        energy_after(oracle, start_s),
        holds=holds,
    )


def model_error_by_clock(
    controller: OnlineMPCController,
    profile: PerformanceProfile,
    result: ServingResult,
    *,
    minimum_seconds: float = 5.0,
) -> list[dict[str, Any]]:
    """Learned (mean, not pessimistic) against true model at each clock the run held for
    at least ``minimum_seconds``: relative errors of the prefill rate, the decode
    iteration time at the run's operating point (its mean decode batch while decoding,
    and a context of mean prompt + half the mean output) and the phase powers. The
    operating point, not the profile's reference batch: the model is learned from the
    batches the node runs, and a trace of short outputs never shows a batch of 64."""
    model = controller.model
    if model is None or not model.warmed_up:
        return []
    dt = float(result.time_s[1] - result.time_s[0]) if result.time_s.size > 1 else 0.1
    clocks, counts = np.unique(result.realized_clock_mhz, return_counts=True)
    decode = profile.decode_latency_model
    decoding = result.decode_active[result.decode_active > 0]
    batch = float(decoding.mean()) if decoding.size else 1.0
    records = result.request_records
    context = (
        float(np.mean([r.prompt_tokens + 0.5 * r.output_tokens for r in records]))
        if records
        else float(decode.reference_context_tokens)
    )
    rows = []
    for clock, count in zip(clocks, counts, strict=True):
        seconds = float(count) * dt
        if seconds < minimum_seconds:
            continue
        f = float(clock)
        learned_prefill = 1.0 / max(model.prefill_s_per_token(f)[0], 1e-12)
        true_prefill = profile.rate("prefill", f)
        learned_iteration = model.decode_iteration_s(f, batch, context)[0]
        t_ref = decode.reference_batch_size / profile.rate("decode", f)
        true_iteration = t_ref * (
            decode.weight_fraction
            + decode.batch_fraction * batch / decode.reference_batch_size
            + decode.kv_fraction
            * batch
            * context
            / (decode.reference_batch_size * decode.reference_context_tokens)
        )
        row: dict[str, Any] = {
            "clock_mhz": f,
            "seconds": seconds,
            "decode_batch": batch,
            "context_tokens": context,
            "prefill_rate_error": learned_prefill / true_prefill - 1.0,
            "decode_iteration_error": learned_iteration / true_iteration - 1.0,
        }
        for phase in ("prefill", "decode", "idle"):
            learned = model.phase_power_w(f, phase)[0]
            true_power = profile.power(phase, f)  # type: ignore[arg-type]
            batch_model = profile.decode_power_batch_model
            if phase == "decode" and batch_model is not None:
                # The plant's decode power depends on the batch: compare at the run's.
                idle = profile.power("idle", f)
                factor = batch_model.factor(batch, decode.reference_batch_size)
                true_power = idle + (true_power - idle) * factor
            # None where the truth is zero (a profile may state an idle power of 0 W): no
            # relative error, where the division stopped the scoreboard in a traceback.
            row[f"{phase}_power_error"] = learned / true_power - 1.0 if true_power > 0 else None
        rows.append(row)
    return rows


def summarize_model_error(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Time-weighted mean absolute relative error of each learned quantity."""
    if not rows:
        return {}
    seconds = np.array([row["seconds"] for row in rows])
    out: dict[str, float | None] = {}
    for key in (
        "prefill_rate_error",
        "decode_iteration_error",
        "prefill_power_error",
        "decode_power_error",
        "idle_power_error",
    ):
        known = [index for index, row in enumerate(rows) if row[key] is not None]
        if not known:
            out[key] = None
            continue
        values = np.abs(np.array([rows[index][key] for index in known], dtype=float))
        out[key] = float(np.average(values, weights=seconds[known]))
    return out


def run_segments(
    segments: Sequence[tuple[Sequence[Request], ServingPlant, str]],
    controller: ClockController,
    *,
    control_period_s: float = 1.0,
    seed: int = 0,
) -> list[ServingResult]:
    """Run one controller across engine restarts: each segment is a workload served by a
    fresh engine on a plant under a ``model_name`` (the engine's label); the controller
    sees one continuous clock, counters that restart from zero and the new label, as on
    a node whose engine was restarted with another model. Returns one result per segment.
    """
    results = []
    offset = 0.0
    for workload, plant, name in segments:
        simulation = PlantSimulation(workload, plant, seed=seed)
        horizon = plant.run_horizon_s(simulation.requests)
        step = 0
        while True:
            tick = step * control_period_s
            if tick > horizon:
                simulation.advance_to(horizon, stop_when_done=True)
                break
            simulation.advance_to(tick, stop_when_done=True)
            if simulation.done and step > 0:
                break
            observation = simulation.observe()
            observation = replace(observation, time_s=observation.time_s + offset, model_name=name)
            simulation.request_clock(float(controller(observation)))
            step += 1
        results.append(
            simulation.result(controller_name="segment", control_period_s=control_period_s)
        )
        offset += simulation.time_s + control_period_s
    return results


def _shifted(requests: Sequence[Request], offset_s: float, first_id: int) -> list[Request]:
    return [
        Request(first_id + i, r.arrival_time_s + offset_s, r.prompt_tokens, r.output_tokens)
        for i, r in enumerate(requests)
    ]


def nonstationary_runs(
    duration_s: float = 300.0, control_period_s: float = 0.5
) -> list[dict[str, Any]]:
    """The two non-stationary scenarios, on the bundled profiles at 70 % of
    the SLO capacity: ``prompt-mix`` (the Azure conversation window, then the Azure code
    window: prompts twice as long, outputs a tenth as long) on the H100 profile, and
    ``model-swap`` (the conversation window on the H100 profile, then the engine restarts
    on the A100 profile under another ``model_name``). Each runs the maximum clock, the
    profile-fed fast MPC (built on the first profile, as a node configured once would
    keep it) and ``mpc-online``; one row per controller and segment."""
    from gpugov.controllers.contract import unwrap
    from gpugov.daemon.controller_config import MaxControllerConfig, MPCControllerConfig
    from gpugov.plant import load_profile
    from gpugov.study.scoreboard.controllers import scoreboard_online, study_controller
    from gpugov.study.scoreboard.run import build_scenario

    h100 = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    a100 = ServingPlant.from_profile(load_profile("a100-sxm-80gb-llama3-8b"))
    conv = build_scenario("azure-conv-10min", h100, "cap70", duration_s).requests
    code = build_scenario("azure-code", h100, "cap70", duration_s).requests
    conv_a100 = build_scenario("azure-conv-10min", a100, "cap70", duration_s).requests
    mixed = list(conv) + _shifted(code, conv[-1].arrival_time_s + 1.0, len(conv))
    cases = {
        "prompt-mix": [(mixed, h100, "llama-3-8b")],
        "model-swap": [(list(conv), h100, "llama-3-8b"), (list(conv_a100), a100, "other")],
    }
    rows: list[dict[str, Any]] = []
    for case, segments in cases.items():
        everything = [r for workload, _, _ in segments for r in workload]
        # Every controller in the node's safety chain of the first plant's clocks (a node
        # configured once keeps its domain's).
        builders = {
            "max": lambda everything=everything: study_controller(
                MaxControllerConfig(kind="max"), h100, everything, control_period_s=control_period_s
            ),
            "mpc": lambda everything=everything: study_controller(
                MPCControllerConfig(kind="mpc"), h100, everything, control_period_s=control_period_s
            ),
            "mpc-online": lambda everything=everything: scoreboard_online(
                h100, everything, control_period_s=control_period_s
            ),
        }
        reference: list[ServingResult] = []
        for key, build in builders.items():
            controller = build()
            results = run_segments(segments, controller, control_period_s=control_period_s)
            if key == "max":
                reference = results
            for index, result in enumerate(results):
                base = reference[index].metrics
                attainment = result.metrics.slo_attainment or 0.0
                rows.append(
                    {
                        "case": case,
                        "segment": index,
                        "controller": key,
                        "slo_attainment": attainment,
                        "max_clock_slo_attainment": base.slo_attainment,
                        "holds_slo": attainment >= (base.slo_attainment or 0.0) - 0.01,
                        "energy_j": result.metrics.energy_j,
                        "energy_saved_fraction": 1.0 - result.metrics.energy_j / base.energy_j,
                        "resets": (
                            algorithm.resets
                            if isinstance(algorithm := unwrap(controller), OnlineMPCController)
                            else None
                        ),
                    }
                )
    return rows


def online_model_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown: the online MPC's learned-against-true model error per scenario, and its
    capture over the whole run beside the capture after the warm-up."""
    mine = [row for row in rows if row.get("controller") == "mpc-online"]
    if not mine:
        return []
    fast = {row["scenario"]: row for row in rows if row.get("controller") == "mpc"}
    lines = [
        "",
        "## Online MPC: capture and learned-model error",
        "",
        "Capture over the whole run (warm-up included) and after the warm-up, beside the "
        "profile-fed fast MPC's; mean absolute relative error of the learned model against "
        "the true profile, weighted by the time spent at each realised clock.",
        "",
        "| scenario | holds SLO | capture (fast) | after warm-up (fast) | prefill rate | "
        "decode iteration | prefill power | decode power | idle power |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def fmt(value: Any, scale: float = 1.0, suffix: str = "") -> str:
        return "-" if value is None else f"{value * scale:.{1 if suffix else 2}f}{suffix}"

    for row in mine:
        other = fast.get(row["scenario"], {})
        error = row.get("model_error") or {}
        lines.append(
            f"| {scenario_title(row, 'scenario')} | {'yes' if row['holds_slo'] else 'no'} | "
            f"{fmt(row.get('oracle_capture'))} ({fmt(other.get('oracle_capture'))}) | "
            f"{fmt(row.get('oracle_capture_after_warmup'))} "
            f"({fmt(other.get('oracle_capture_after_warmup'))}) | "
            + " | ".join(
                fmt(error.get(key), 100, "%")
                for key in (
                    "prefill_rate_error",
                    "decode_iteration_error",
                    "prefill_power_error",
                    "decode_power_error",
                    "idle_power_error",
                )
            )
            + " |"
        )
    return lines


__all__ = [
    "REFERENCE_BATCH",
    "WARMUP_S",
    "capture_after",
    "energy_after",
    "model_error_by_clock",
    "nonstationary_runs",
    "online_model_lines",
    "run_segments",
    "summarize_model_error",
]
