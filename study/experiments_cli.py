"""``gpugov experiments``: the seed's whole study from one command.

Runs :func:`gpugov.study.experiments.build_textbook_results` on a trace and writes

* ``DIR/results.json``: the seed's result structure (strict JSON, no NaN);
* ``DIR/summary.md``: the headline tables (per-controller energy, J/token, TTFT/TPOT p95,
  SLO attainment; DP vs FQI; the MDP policies on the plant), MPC solve times and
  fallbacks, the profile's status and the seed deviations;
* ``DIR/figures/*.png``: the modelling run, open loop nominal vs shifted, the MPC
  comparison's clock/power/queue/temperature trajectories, the DP/FQI policy slices,
  the FQI datasets' coverage and the on-plant scheduler comparison.

Workloads. ``--trace`` is loaded from ``--start`` (default 0) for ``--duration`` seconds
(default 300, the seed's ``scheduling_trace_source_window_s``): that is the evaluation
workload the frequency window is selected from and the scheduling MDP is calibrated on.
The animation workload (the modelling run) is its first ``--animation`` seconds
(default 60, or the whole window when ``--duration`` is shorter). Arrivals are not
rescaled (``load_dilation`` 1.0).

Progress (step, elapsed, ETA) goes to stderr: a redrawn bar on a terminal, one line per
step otherwise; the written paths go to stdout. ``--window`` is the old name of
``--duration`` (still accepted, not listed in ``--help``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from gpugov import __version__
from gpugov.daemon import cli_types
from gpugov.daemon.cli_outputs import check_not_an_input, prepare_output_dir, simulated_run_inputs
from gpugov.daemon.cli_support import (
    UsageError,
    check_kv_fits,
    check_window_span,
    hidden_alias,
    load_profile_for_cli,
    load_trace_for_cli,
    require_extras,
    require_positive,
    window_past_end_note,
    wrote,
)
from gpugov.daemon.files import write_text_atomic
from gpugov.daemon.progress import Progress
from gpugov.daemon.safety import SafetySettings
from gpugov.plant import ServingPlant
from gpugov.plant.profile import DEFAULT_PROFILE
from gpugov.plant.workload import DEFAULT_TRACE, format_seconds
from gpugov.study.experiment_parts import (
    ARRIVAL_SHIFT_S,
    FIRST_STAGE,
    SuiteInputs,
    frequency_window,
    run_part,
    run_scheduling_on_plant,
)
from gpugov.study.experiments import assemble_textbook_results, build_textbook_results
from gpugov.study.outputs import check_replaceable, staged_outputs
from gpugov.study.runners import (
    RunnerSpec,
    add_runner_arguments,
    check_runner,
    map_cells,
    single_threaded,
    spec_from_args,
)

DEFAULT_WINDOW_S = 300.0
DEFAULT_ANIMATION_S = 60.0


class SuiteSizes(TypedDict):
    """The study's sample sizes, passed as keywords to the suite."""

    fqi_transitions: int
    fqi_sweeps: int
    fqi_trees: int
    evaluation_episodes: int
    evaluation_horizon_steps: int


SEED_SIZES: SuiteSizes = {
    "fqi_transitions": 50_000,
    "fqi_sweeps": 50,
    "fqi_trees": 200,
    "evaluation_episodes": 2_000,
    "evaluation_horizon_steps": 300,
}
"""The seed's default sizes (what ``gpugov experiments`` runs without ``--quick``)."""

QUICK_SIZES: SuiteSizes = {
    "fqi_transitions": 2_000,
    "fqi_sweeps": 5,
    "fqi_trees": 20,
    "evaluation_episodes": 100,
    "evaluation_horizon_steps": 100,
}
"""Sizes for ``--quick`` (CI smoke runs; the numbers are not the study's)."""

FIGURES = (
    "modeling.png",
    "open_loop.png",
    "mpc_trajectories.png",
    "policy_slices.png",
    "coverage.png",
    "scheduling_on_plant.png",
)
"""Files written under ``DIR/figures``."""

MPC_CONTROLLERS = (
    ("max", "max"),
    ("reactive", "reactive"),
    ("open-loop", "open-loop"),
    ("mpc-slsqp", "mpc-slsqp"),
)
"""The frequency experiment's controllers: results key and label, both the one name the
CLI spec, the metrics and the scoreboard use (the seed's MPC is ``mpc-slsqp``)."""
POLICIES = (
    ("exact_dp", "Exact DP"),
    ("broad_fqi", "FQI, broad coverage"),
    ("narrow_fqi", "FQI, narrow log"),
)
PLANT_SCHEDULERS = (
    ("exact_dp", "Exact DP policy"),
    ("broad_fqi", "Broad-FQI policy"),
    ("narrow_fqi", "Narrow-FQI policy"),
    ("decode_priority", "Decode-priority policy"),
    ("chunked_prefill", "Chunked prefill (512 tokens)"),
)
ACTION_COLOURS = ("#4c72b0", "#dd8452", "#d0d0d0")
ACTION_NAMES = ("prefill", "decode", "idle")


# --------------------------------------------------------------------- formatting
def _number(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{float(value) * scale:.{digits}f}"


def _percent(value: Any) -> str:
    return "n/a" if value is None else f"{100.0 * float(value):.1f} %"


def _metrics_row(label: str, metrics: Mapping[str, Any]) -> str:
    return (
        f"| {label} | {_number(metrics['energy_j'], 1e-3, 2)} | "
        f"{_number(metrics['energy_per_output_token_j'], digits=4)} | "
        f"{_number(metrics['ttft_p95_s'], digits=3)} | "
        f"{_number(metrics['tpot_p95_s'], 1e3, 1)} | "
        f"{_percent(metrics['slo_attainment'])} | "
        f"{metrics['completed_requests']} / {metrics['censored_requests']} |"
    )


METRICS_HEADER = (
    "| run | energy (kJ) | J / output token | TTFT p95 (s) | TPOT p95 (ms) | SLO attainment "
    "| completed / censored |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def _past_end(trace: dict[str, Any]) -> str:
    """``, past the trace's last arrival at X s`` where the evaluation window runs past it
    (a 73 s trace under the default 300 s window read as 300 s of arrivals), else ``""``
    (also for results written before the span was recorded)."""
    span = trace.get("span_s")
    duration = trace.get("duration_s")
    if span is None or duration is None or trace.get("start_s", 0.0) + duration <= span:
        return ""
    return f", past the trace's last arrival at {format_seconds(span)} s"


def _controllers_line(settings: Mapping[str, Any] | None) -> list[str]:
    """The bullet on what every controller ran with (none for results from before they
    recorded it): the seed's settings, which are not ``simulate``'s defaults."""
    if not settings:
        return []
    safety = settings["safety"]
    chain = SafetySettings(floor_mhz=safety["floor_mhz"], dwell_s=safety["dwell_s"]).words()
    target = settings["slo_target"]
    return [
        f"- Controllers: the node's factory and safety chain ({chain}), every "
        f"{settings['control_period_s']:g} s, SLO target "
        + ("none (fixed margins)" if target is None else f"{100.0 * target:g} %")
        + f", the {settings['engine_view']} engine view, as the seed runs them (`simulate`'s "
        "defaults: dwell 0.5 s, a 99 % SLO target, the vllm engine view)"
    ]


def format_summary_markdown(results: Mapping[str, Any], *, elapsed_s: float | None = None) -> str:
    """The ``summary.md`` text for a :func:`build_textbook_results` payload."""
    metadata = results["metadata"]
    lines: list[str] = ["# gpugov experiments: summary", ""]
    trace = metadata.get("trace", {})
    window = metadata["frequency_experiment_window"]
    lines += [
        f"- Profile: {metadata['profile_source']} (status **{metadata['profile_status']}**)",
        f"- Trace: {trace.get('name') or trace.get('path', 'caller-supplied workload')}"
        + (f", sha256 `{trace['sha256']}`" if trace.get("sha256") else ""),
        f"- Evaluation workload: {metadata['inputs']['evaluation_request_count']} requests "
        f"({metadata['scheduling_trace_source_window_s']:g} s from "
        f"{trace.get('start_s', 0.0):g} s{_past_end(trace)}); animation workload: "
        f"{metadata['inputs']['animation_request_count']} requests",
        f"- Frequency experiment window: {window['source_window_start_s']:g}-"
        f"{window['source_window_end_s']:g} s of the evaluation workload, "
        f"{window['request_count']} requests; burst {window['shiftable_burst_start_s']:g}-"
        f"{window['shiftable_burst_end_s']:g} s "
        f"({window['shiftable_burst_request_count']} requests) moved 20 s earlier",
        f"- Declared output forecast: {metadata['expected_output_tokens']:.1f} tokens; "
        f"load dilation {metadata['load_dilation']:g}",
        *_controllers_line(metadata.get("controllers")),
        "- Sizes: "
        + ", ".join(f"{key} {value:,}" for key, value in metadata["sizes"].items())
        + (" (**--quick**: not the study's sizes)" if metadata.get("quick") else ""),
        f"- gpugov {metadata.get('gpugov_version', '?')}"
        + (f"; run time {elapsed_s:.1f} s" if elapsed_s is not None else ""),
        "",
    ]
    if metadata.get("warning"):
        lines += [f"> **Profile status: {metadata['profile_status']}.** {metadata['warning']}", ""]

    open_loop = results["open_loop"]["controllers"]
    mpc = results["mpc"]["controllers"]
    lines += [
        "## Frequency control (detailed plant, chunked prefill)",
        "",
        "Open loop: the LP plan for the nominal window, replayed without feedback on the "
        "nominal and on the shifted arrivals. The MPC comparison runs on the shifted "
        "arrivals; its open-loop row is the same run as the open-loop shifted row.",
        "",
        METRICS_HEADER,
        _metrics_row("Open-loop plan, nominal arrivals", open_loop["nominal"]["metrics"]),
        _metrics_row("Open-loop plan, shifted arrivals", open_loop["shifted"]["metrics"]),
    ]
    for key, label in MPC_CONTROLLERS:
        suffix = " (same run as open-loop shifted)" if key == "open-loop" else ""
        lines.append(_metrics_row(f"{label}, shifted{suffix}", mpc[key]["metrics"]))
    lines.append(_metrics_row("Modelling run (max, animation)", results["modeling"]["metrics"]))
    mismatch = results["open_loop"]["mismatch_metrics"]
    lines += [
        "",
        f"Moved burst: {mismatch['moved_request_count']} requests; matched mean TTFT "
        f"change {_number(mismatch['matched_mean_ttft_delta_s'])} s, p95 change "
        f"{_number(mismatch['matched_p95_ttft_delta_s'])} s; requests queued at 30 s "
        f"change {mismatch['queued_requests_at_30_s_delta']:+g}.",
        "",
    ]
    diagnostics = results["mpc"]["diagnostics"]
    reasons = ", ".join(f"{k} {v}" for k, v in diagnostics["fallback_reasons"].items())
    lines += [
        "### MPC solves",
        "",
        f"- Solves: {diagnostics['solves']} ({diagnostics['successful_solves']} successful); "
        f"fallbacks to the reactive governor: {diagnostics['fallback_count']} ({reasons})",
        f"- Solve time p50 / p99 / max: {_number(diagnostics['solve_time_p50_s'], 1e3, 1)} / "
        f"{_number(diagnostics['solve_time_p99_s'], 1e3, 1)} / "
        f"{_number(diagnostics['solve_time_max_s'], 1e3, 1)} ms (limit "
        f"{diagnostics['solve_time_limit_s'] * 1e3:g} ms; wall clock, machine dependent)",
        f"- Horizon {diagnostics['horizon_steps']} x {diagnostics['control_period_s']:g} s; "
        f"declared forecasts: prompt {diagnostics['expected_prompt_tokens']:g}, output "
        f"{diagnostics['expected_output_tokens']:.1f} tokens",
        "",
    ]

    fqi = results["fqi"]["metrics"]
    lines += [
        "## Scheduling MDP: exact DP vs fitted Q iteration (reduced model)",
        "",
        f"{results['fqi']['protocol']['evaluation_episodes']:,} episodes x "
        f"{results['fqi']['protocol']['evaluation_horizon_steps']} steps on fixed random "
        "streams; return is minus the discounted cost (higher is better).",
        "",
        "| policy | discounted return | mean queue | mean wait (s) | decode stalls | "
        "dropped arrivals | coverage | disagreement with DP |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in POLICIES:
        row = fqi[key]
        lines.append(
            f"| {label} | {row['mean_discounted_return']:.2f} | {row['mean_queue_length']:.3f} | "
            f"{row['mean_waiting_time_s']:.3f} | {row['mean_decode_stalls']:.2f} | "
            f"{row['mean_dropped_arrivals']:.3f} | "
            f"{_percent(row.get('coverage_fraction'))} | "
            f"{_percent(row.get('policy_disagreement_fraction', 0.0))} |"
        )
    scheduling = results["scheduling"]
    lines += [
        "",
        f"Value iteration: {scheduling['iterations']} iterations, Bellman residual "
        f"{scheduling['bellman_residual']:.2e}.",
        "",
    ]

    on_plant = results["scheduling_on_plant"]
    lines += [
        "## The MDP policies on the detailed plant (beyond the seed)",
        "",
        f"Each policy as the engine's batching rule (`MDPPolicyScheduler`) at a fixed "
        f"{on_plant['clock_mhz']:g} MHz (the MDP's calibration clock) on the evaluation "
        f"workload ({on_plant['request_count']} requests), next to chunked prefill.",
        "",
        METRICS_HEADER,
    ]
    for key, label in PLANT_SCHEDULERS:
        lines.append(_metrics_row(label, on_plant["metrics"][key]))
    lines += [""]

    lines += ["## Seed deviations", ""]
    for section, deviations in metadata["seed_deviations"].items():
        for deviation in deviations:
            lines.append(f"- **{section}**: {deviation}")
    lines += ["", "## Figures", ""]
    lines += [f"- [{name}](figures/{name})" for name in FIGURES]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ figures
def _pyplot() -> Any:
    from gpugov.study.plots import pyplot

    return pyplot()


def _save(fig: Any, path: Path) -> None:
    """Write ``fig`` (``save_figure``: a failure, a full disk, names ``path``) and close it."""
    from gpugov.study.plots import save_figure

    try:
        save_figure(fig, path, dpi=110)
    finally:
        _pyplot().close(fig)


def plot_trajectories(
    runs: Sequence[tuple[str, Mapping[str, Any]]],
    path: Path,
    title: str,
    *,
    power_limit_w: float | None = None,
    thermal_limit_c: float | None = None,
) -> None:
    """Clock, power, waiting, decoding and temperature of several runs, overlaid."""
    plt = _pyplot()
    fig, axes = plt.subplots(5, 1, figsize=(11, 11), sharex=True)
    for label, run in runs:
        t = run["time_s"]
        axes[0].step(t, run["realized_clock_mhz"], where="post", lw=0.9, label=label)
        axes[1].plot(t, run["power_w"], lw=0.7, label=label)
        axes[2].plot(t, run["prefill_queue"], lw=0.9, label=label)
        axes[3].plot(t, run["decode_active"], lw=0.9, label=label)
        axes[4].plot(t, run["temperature_c"], lw=0.9, label=label)
    if power_limit_w:
        axes[1].axhline(power_limit_w, ls="--", color="k", lw=0.8, label="power limit")
    if thermal_limit_c:
        axes[4].axhline(thermal_limit_c, ls="--", color="k", lw=0.8, label="thermal limit")
    axes[0].set_ylabel("realised clock (MHz)")
    axes[1].set_ylabel("power (W)")
    axes[2].set_ylabel("waiting for\nfirst token")
    axes[3].set_ylabel("decoding")
    axes[4].set_ylabel("temperature (C)")
    axes[4].set_xlabel("time (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(runs), bbox_to_anchor=(0.5, 0.965))
    for axis in axes[1:]:
        limits = [
            (handle, label)
            for handle, label in zip(*axis.get_legend_handles_labels(), strict=True)
            if label.endswith("limit")
        ]
        if limits:
            axis.legend(*zip(*limits, strict=True), loc="upper right", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    _save(fig, path)


def plot_open_loop(results: Mapping[str, Any], path: Path) -> None:
    """The plan's clocks and the nominal vs shifted queue and power, burst marked."""
    plt = _pyplot()
    open_loop = results["open_loop"]
    plan = open_loop["plan"]
    window = results["metadata"]["frequency_experiment_window"]
    shift = -float(open_loop["mismatch_metrics"]["arrival_shift_s"])
    start, end = float(window["shiftable_burst_start_s"]), float(window["shiftable_burst_end_s"])
    fig, axes = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True)
    axes[0].step(
        plan["time_s"],
        plan["applied_clock_mhz"],
        where="post",
        lw=1.2,
        label="applied plan (quantised down)",
    )
    axes[0].plot(
        plan["time_s"], plan["continuous_clock_mhz"], lw=0.8, ls=":", label="continuous LP solution"
    )
    axes[0].set_ylabel("planned clock (MHz)")
    backlog_axis = axes[0].twinx()
    period = plan["time_s"][1] - plan["time_s"][0] if len(plan["time_s"]) > 1 else 1.0
    backlog_axis.plot(
        [period * step for step in range(len(plan["predicted_backlog_s"]))],
        plan["predicted_backlog_s"],
        color="tab:green",
        lw=0.8,
        label="predicted backlog",
    )
    backlog_axis.set_ylabel("fluid backlog (s of work)", color="tab:green")
    for key, label in (("nominal", "nominal arrivals"), ("shifted", "shifted arrivals")):
        run = open_loop["controllers"][key]
        queued = [p + d for p, d in zip(run["prefill_queue"], run["decode_active"], strict=True)]
        axes[1].plot(run["time_s"], queued, lw=0.9, label=label)
        axes[2].plot(run["time_s"], run["power_w"], lw=0.7, label=label)
    axes[1].set_ylabel("requests in system")
    axes[2].set_ylabel("power (W)")
    axes[2].set_xlabel("time (s)")
    for axis in axes:
        axis.axvspan(start, end, color="tab:blue", alpha=0.10)
        axis.axvspan(start - shift, end - shift, color="tab:red", alpha=0.10)
    axes[1].text(
        start,
        0.95,
        " burst (nominal)",
        transform=axes[1].get_xaxis_transform(),
        fontsize=8,
        va="top",
        color="tab:blue",
    )
    axes[1].text(
        start - shift,
        0.95,
        f" burst moved {shift:g} s earlier",
        transform=axes[1].get_xaxis_transform(),
        fontsize=8,
        va="top",
        color="tab:red",
    )
    axes[0].legend(loc="upper left", fontsize=8)
    axes[1].legend(loc="upper right", fontsize=8)
    axes[2].legend(loc="upper right", fontsize=8)
    fig.suptitle("Open-loop plan: nominal vs shifted arrivals (same plan, no feedback)")
    fig.tight_layout()
    _save(fig, path)


def _action_colormap() -> tuple[Any, Any]:
    from matplotlib.colors import BoundaryNorm, ListedColormap

    colormap = ListedColormap(ACTION_COLOURS)
    return colormap, BoundaryNorm([-0.5, 0.5, 1.5, 2.5], colormap.N)


def plot_policy_slices(results: Mapping[str, Any], path: Path) -> None:
    """7 x 7 action tables (prefill count x decode count) per age bin, per policy."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    slices = results["fqi"]["policy_slices"]
    metrics = results["fqi"]["metrics"]
    colormap, norm = _action_colormap()
    fig, axes = plt.subplots(len(POLICIES), 5, figsize=(14, 9), squeeze=False)
    for row, (key, label) in enumerate(POLICIES):
        disagreement = metrics[key].get("policy_disagreement_fraction")
        for age in range(5):
            axis = axes[row][age]
            table = slices[key][str(age)]
            axis.imshow(table, cmap=colormap, norm=norm, origin="lower")
            for p, cells in enumerate(table):
                for d, action in enumerate(cells):
                    axis.text(
                        d,
                        p,
                        ACTION_NAMES[action][0].upper(),
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="k",
                    )
            axis.set_xticks(range(7))
            axis.set_yticks(range(7))
            axis.tick_params(labelsize=7)
            if row == len(POLICIES) - 1:
                axis.set_xlabel("decode count d", fontsize=8)
            if age == 0:
                extra = f"\n(disagrees {100 * disagreement:.1f} %)" if disagreement else ""
                axis.set_ylabel(f"{label}{extra}\nprefill count p", fontsize=8)
            if row == 0:
                axis.set_title(f"oldest-age bin {age}", fontsize=9)
    handles = [Patch(color=c, label=n) for c, n in zip(ACTION_COLOURS, ACTION_NAMES, strict=True)]
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=9)
    fig.suptitle("Scheduling policy slices: exact DP vs fitted Q iteration")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    _save(fig, path)


def plot_coverage(results: Mapping[str, Any], path: Path) -> None:
    """Logged visits to each displayed (state, action), broad vs narrow log."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm

    coverage = results["fqi"]["coverage_slices"]
    metrics = results["fqi"]["metrics"]
    peak = max(
        max(max(cells) for cells in table)
        for key in ("broad_fqi", "narrow_fqi")
        for table in coverage[key].values()
    )
    colormap = plt.get_cmap("viridis").with_extremes(bad="white")
    norm = LogNorm(vmin=1, vmax=max(peak, 2))
    fig, axes = plt.subplots(2, 5, figsize=(14, 6), squeeze=False, layout="constrained")
    image = None
    for row, (key, label) in enumerate(POLICIES[1:]):
        for age in range(5):
            axis = axes[row][age]
            table = coverage[key][str(age)]
            masked = [[value if value > 0 else float("nan") for value in cells] for cells in table]
            image = axis.imshow(masked, cmap=colormap, norm=norm, origin="lower")
            for p, cells in enumerate(table):
                for d, value in enumerate(cells):
                    if value == 0:
                        axis.text(d, p, "0", ha="center", va="center", fontsize=6, color="tab:red")
            axis.set_xticks(range(7))
            axis.set_yticks(range(7))
            axis.tick_params(labelsize=7)
            if row == 1:
                axis.set_xlabel("decode count d", fontsize=8)
            if age == 0:
                fraction = metrics[key]["coverage_fraction"]
                axis.set_ylabel(
                    f"{label}\n(covers {100 * fraction:.1f} % of pairs)\nprefill count p",
                    fontsize=8,
                )
            if row == 0:
                axis.set_title(f"oldest-age bin {age}", fontsize=9)
    assert image is not None
    fig.colorbar(image, ax=axes, shrink=0.8, label="logged visits to the displayed action")
    fig.suptitle("FQI datasets: visits to the action each learned policy displays")
    _save(fig, path)


def plot_scheduling_on_plant(results: Mapping[str, Any], path: Path) -> None:
    """Energy per output token, SLO attainment and completions of each scheduler on the
    plant (energy per token, not total energy: runs that censor requests last until the
    drain timeout)."""
    plt = _pyplot()
    on_plant = results["scheduling_on_plant"]
    labels = [label for _, label in PLANT_SCHEDULERS]
    metrics = [on_plant["metrics"][key] for key, _ in PLANT_SCHEDULERS]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8))
    per_token = [m["energy_per_output_token_j"] or 0.0 for m in metrics]
    slo = [100.0 * (m["slo_attainment"] or 0.0) for m in metrics]
    completed = [100.0 * m["completed_requests"] / max(1, m["arrived_requests"]) for m in metrics]
    positions = list(range(len(labels)))
    colours = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#937860"]
    for axis, values, ylabel in (
        (axes[0], per_token, "energy per output token (J, log scale)"),
        (axes[1], slo, "SLO attainment (%)"),
        (axes[2], completed, "completed requests (%)"),
    ):
        axis.bar(positions, values, color=colours)
        axis.set_xticks(positions)
        axis.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        axis.set_ylabel(ylabel)
    if all(value > 0.0 for value in per_token):
        axes[0].set_yscale("log")
    fig.suptitle(
        f"MDP policies as plant schedulers at {on_plant['clock_mhz']:g} MHz "
        f"({on_plant['request_count']} requests)"
    )
    fig.tight_layout()
    _save(fig, path)


def write_figures(
    results: Mapping[str, Any],
    directory: Path,
    on_figure: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write every figure in :data:`FIGURES` under ``directory``; return the paths.
    ``on_figure`` hears a line before each (a progress step: together they take seconds)."""
    directory.mkdir(parents=True, exist_ok=True)
    plant = results["metadata"]["inputs"]["plant"]
    limits = {
        "power_limit_w": plant.get("power_limit_w"),
        "thermal_limit_c": plant.get("thermal_limit_c"),
    }
    writers: dict[str, Callable[[Path], None]] = {
        "modeling.png": lambda path: plot_trajectories(
            [("max", results["modeling"])],
            path,
            "Modelling run: max (maximum clock), chunked prefill",
            **limits,
        ),
        "open_loop.png": lambda path: plot_open_loop(results, path),
        "mpc_trajectories.png": lambda path: plot_trajectories(
            [(label, results["mpc"]["controllers"][key]) for key, label in MPC_CONTROLLERS],
            path,
            "Frequency control on the shifted window",
            **limits,
        ),
        "policy_slices.png": lambda path: plot_policy_slices(results, path),
        "coverage.png": lambda path: plot_coverage(results, path),
        "scheduling_on_plant.png": lambda path: plot_scheduling_on_plant(results, path),
    }
    written = []
    for index, name in enumerate(FIGURES, 1):
        if on_figure is not None:
            on_figure(f"writing figure {name} ({index}/{len(FIGURES)})")
        target = directory / name
        writers[name](target)
        written.append(target)
    return written


# ------------------------------------------------------------------------ sharded
def run_part_task(name: str, shared: Mapping[str, Any]) -> dict[str, Any]:
    """One first-stage part as a runner task (the inputs arrive by value in ``shared``)."""
    return run_part(name, shared["inputs"])


def build_sharded_results(
    inputs: SuiteInputs,
    spec: RunnerSpec,
    progress: Callable[[str], None],
    *,
    on_wait: Callable[[], None] | None = None,
    **assembly: Any,
) -> dict[str, Any]:
    """:func:`build_textbook_results` with the first-stage parts as parallel tasks (local
    pool or Ray), then the on-plant stage and the assembly here: the same result.
    ``on_wait`` is called every second or so while the parts run (a progress line's
    redraw: a part runs for a minute)."""
    parts: dict[str, dict[str, Any]] = {}
    progress(f"running {len(FIRST_STAGE)} independent parts as tasks: {', '.join(FIRST_STAGE)}")
    for done in map_cells(
        run_part_task,
        list(FIRST_STAGE),
        spec=spec,
        shared={"inputs": inputs},
        on_event=progress,
        on_wait=on_wait,
    ):
        name = FIRST_STAGE[done.index]
        parts[name] = done.value
        progress(f"part {name} done ({len(parts)}/{len(FIRST_STAGE)}, on {done.worker})")
    on_plant = run_scheduling_on_plant(inputs, parts, progress)
    return assemble_textbook_results(inputs, parts, on_plant, progress=progress, **assembly)


# --------------------------------------------------------------------------- run
EXPERIMENT_STEPS = 16 + len(FIGURES)
"""Progress steps: the suite's sixteen (``build_textbook_results`` reports one line before
each; each of the five runs on the plant is one) and each figure written (together they
take seconds: as one step the bar read 'ETA 1s' while they were drawn)."""


def animation_length_s(given_s: float | None, duration_s: float) -> float:
    """The modelling run's length in seconds: ``--animation`` as given, else
    :data:`DEFAULT_ANIMATION_S` cut to a shorter ``--duration`` (the whole window).

    Raises:
        UsageError: an ``--animation`` given that is not positive or exceeds ``--duration``.
    """
    if given_s is None:
        return min(DEFAULT_ANIMATION_S, duration_s)
    require_positive("--animation", given_s)
    if given_s > duration_s:
        raise UsageError(f"--animation ({given_s:g} s) exceeds --duration ({duration_s:g} s)")
    return given_s


def run_experiments(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov experiments``."""
    started = time.perf_counter()
    bar = Progress(EXPERIMENT_STEPS, "experiments", unit="steps", stream=sys.stderr)
    steps = 0
    last = ""

    def progress(message: str) -> None:
        nonlocal steps, last
        bar.update(steps, message, force=True)
        steps += 1
        last = message

    def redraw() -> None:  # while parts run: a line every 10 s, the ETA counting down
        bar.update(max(steps - 1, 0), last)

    require_extras("gpugov experiments (fitted Q iteration, figures)", "sklearn", "matplotlib")
    require_positive("--duration", args.duration)
    if not math.isfinite(args.start) or args.start < 0.0:
        raise UsageError(f"--start must be >= 0, got {args.start!r}")
    animation_s = animation_length_s(args.animation, args.duration)
    _pyplot()  # the figures need the gpugov[plots] extra: say so now, not after the run
    spec = spec_from_args(args)
    check_runner(spec)  # --ray: Ray installed and the cluster there, before any work
    sizes = QUICK_SIZES if args.quick else SEED_SIZES

    profile = load_profile_for_cli("--profile", args.profile)
    evaluation, report = load_trace_for_cli(
        args.trace, start_s=args.start, duration_s=args.duration, keep_stamps_flag=None
    )
    animation = tuple(r for r in evaluation if r.arrival_time_s < animation_s)
    if not animation:
        if args.animation is None:  # the default: the user set no --animation
            raise UsageError(
                f"the modelling run (the window's first {animation_s:g} s, --animation's "
                "default) holds no requests; give --animation S"
            )
        raise UsageError(f"--animation {animation_s:g}: the first seconds hold no requests")
    plant = ServingPlant.from_profile(profile)
    check_kv_fits(evaluation, plant, args.trace)
    # The remedy in this command's flags: it has no --load-scale to stretch a window with.
    check_window_span(
        evaluation[-1].arrival_time_s, args.trace, remedy="choose a shorter --duration"
    )
    inputs = SuiteInputs(animation, evaluation, plant, **sizes)
    try:
        frequency_window(inputs)  # the open-loop part's window: refused now, not minutes in
    except ValueError as error:
        if args.duration <= ARRIVAL_SHIFT_S:  # no window of it can hold a burst to move
            raise UsageError(
                f"--duration {args.duration:g}: the open-loop experiment moves a burst "
                f"{ARRIVAL_SHIFT_S:g} s earlier, from {ARRIVAL_SHIFT_S:g} s or more into "
                f"the evaluation window, so it needs a --duration over {ARRIVAL_SHIFT_S:g} s"
            ) from error
        raise UsageError(
            f"--trace {args.trace} (the window from {format_seconds(args.start)} s for "
            f"{format_seconds(args.duration)} s): {error}"
        ) from error
    out = Path(args.out)
    # results.json, summary.md, figures/*.png: none of them the trace or the profile,
    # which the move into DIR replaced (the trace became the summary).
    read = simulated_run_inputs(args.trace, args.profile, "max")
    for name in ("results.json", "summary.md", *(f"figures/{figure}" for figure in FIGURES)):
        check_not_an_input("--out", out / name, read)
        check_replaceable("--out", out, out / name)
    if (out / "figures").exists() and not (out / "figures").is_dir():
        raise UsageError(
            f"--out {out}: {out / 'figures'} is not a directory, where the figures go; "
            "move it away or choose another --out"
        )
    created = not out.exists()
    prepare_output_dir("--out", args.out)  # the inputs are good: only now is DIR made
    extra = {
        "gpugov_version": __version__,
        "quick": bool(args.quick),
        "trace": {
            "name": report.name,
            "path": report.path,
            "format": report.format,
            "sha256": report.sha256,
            "rows": report.rows,
            "start_s": args.start,
            "duration_s": args.duration,
            "span_s": report.span_s,
            "animation_duration_s": animation_s,
        },
        "profile": profile.describe(),
        "workload_choice": (
            "evaluation workload: the trace's arrivals in [start, start + duration); "
            "animation workload: its first `animation` seconds; arrivals not rescaled"
        ),
    }
    # Every file is written under DIR/.partial and moved into DIR once all are: a run
    # stopped midway leaves DIR as it was, never a mix of its files and an earlier run's.
    with staged_outputs(out, created=created) as staging:
        try:
            if spec.ray_address is not None or spec.jobs > 1:
                results = build_sharded_results(
                    inputs,
                    spec,
                    progress,
                    on_wait=redraw,
                    load_dilation=1.0,
                    scheduling_trace_source_window_s=args.duration,
                    extra_metadata={**extra, "runner": spec.describe()},
                )
            else:
                # As the runners' cells: results independent of cores.
                with single_threaded():
                    results = build_textbook_results(
                        animation,
                        evaluation,
                        plant,
                        load_dilation=1.0,
                        progress=progress,
                        scheduling_trace_source_window_s=args.duration,
                        extra_metadata=extra,
                        **sizes,
                    )
        except UsageError:
            raise
        except ValueError as error:
            raise UsageError(f"--trace {args.trace}: {error}") from error

        results_path = staging / "results.json"
        # Each named in a failure (a full disk); Path.write_text's failed write names none.
        write_text_atomic(results_path, json.dumps(results, allow_nan=False) + "\n")
        figures = write_figures(results, staging / "figures", progress)
        summary_path = staging / "summary.md"
        write_text_atomic(
            summary_path, format_summary_markdown(results, elapsed_s=time.perf_counter() - started)
        )
        written = [results_path, *figures, summary_path]
    bar.close("done", done=EXPERIMENT_STEPS)
    past_end = window_past_end_note(report)
    if past_end is not None:  # the evaluation window holds less than its duration says
        print(f"note: {past_end}")
    for path in written:
        wrote(out / path.relative_to(staging))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``experiments`` to the ``gpugov`` parser."""
    parser = subparsers.add_parser(
        "experiments",
        help="run the seed's study (open loop, MPC, DP vs FQI) and write results and figures",
        description=(
            "Run the whole experiment suite on a trace window and write DIR/results.json, "
            "DIR/summary.md and DIR/figures/*.png."
        ),
    )
    parser.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help=f"bundled or shared trace name, or a path (default {DEFAULT_TRACE})",
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"bundled profile name or manifest path (default {DEFAULT_PROFILE})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small FQI and evaluation sizes for CI (not the study's numbers)",
    )
    parser.add_argument(
        "--start",
        type=cli_types.offset,
        default=0.0,
        metavar="S",
        help="evaluation window start, seconds after the trace's first arrival",
    )
    parser.add_argument(
        "--duration",
        type=cli_types.duration,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help=f"evaluation window length in seconds (default {DEFAULT_WINDOW_S:g})",
    )
    hidden_alias(parser, "--window", "duration", cli_types.duration)
    parser.add_argument(
        "--animation",
        type=cli_types.duration,
        default=None,
        metavar="S",
        help="modelling-run length, the evaluation window's first S seconds "
        f"(default {DEFAULT_ANIMATION_S:g}, or the whole window when --duration is shorter)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_runner_arguments(
        parser,
        jobs_help="run the independent parts (modelling, open loop + MPC, DP, broad FQI, "
        "narrow FQI) in N local processes (default: one after the other)",
    )
    parser.set_defaults(handler=run_experiments)


__all__ = [
    "FIGURES",
    "QUICK_SIZES",
    "SEED_SIZES",
    "format_summary_markdown",
    "register",
    "run_experiments",
    "write_figures",
]
