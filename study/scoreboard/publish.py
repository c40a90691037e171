"""The citable benchmark report of ``gpugov bench controllers --report DIR``.

After a scoreboard run it writes a self-contained folder that a third party can cite and
reproduce: the scenarios with their trace checksums, the plant and profile versions,
energy in ML.ENERGY's units (J per output token, energy per request), SLO attainment and
the share of requests within TPOT deadlines of 50, 100 and 250 ms, the oracle capture,
a Pareto plot of energy saved against SLO attainment, a ``README.md`` naming every file
and the command that reproduces it, and ``report.json``. Definitions: ``docs/benchmark.md``.

The per-request figures are computed where the run happens (:func:`request_stats`, on
each row in the worker) because the request records do not leave the worker.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import platform
import shlex
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpugov import __version__
from gpugov.daemon.files import json_safe, write_files_atomic
from gpugov.plant import ServingResult
from gpugov.plant.attribution import ENERGY_DEFINITIONS, energy_summary
from gpugov.study.markdown import markdown_text, scenario_title
from gpugov.study.provenance import LIBRARIES
from gpugov.study.scoreboard.report import (
    cell,
    failed_controller_lines,
    head_to_head,
    head_to_head_markdown,
    invalid_decision_lines,
    periods_line,
)
from gpugov.study.scoreboard.windows import window_markdown

WINDOW_KEYS = ("window_starts_s", "window_summary", "window_overlaps")
"""A ``--windows`` board's keys the report carries as they are."""
REPORT_SCHEMA = 1
"""Version of ``report.json``'s layout; raised when a field changes meaning."""

TPOT_DEADLINES_S = (0.05, 0.1, 0.25)
"""Deadlines the per-request TPOT is judged against (50, 100 and 250 ms)."""

REPORT_DEFINITIONS = {
    "energy_per_output_token_j": (
        "the run's whole GPU energy (idle time included) over the output tokens generated "
        "in it, as ML.ENERGY's leaderboard reports J per output token"
    ),
    "energy_per_request_j": (
        "by output tokens: the run's energy is split over its arrived requests in "
        "proportion to the output tokens each was served, E_i = E * g_i / sum(g); prefill "
        "and idle energy are charged to output tokens. The mean over requests is E / "
        "requests; the median is J per output token times the median tokens served. The "
        "plant's exact attribution by phase is in attributed_energy"
    ),
    "attributed_energy": (
        "the plant's exact per-request attribution (docs/plant.md, energy per request): "
        "each iteration's energy split between prefill and decode by modelled phase power "
        "x time, then by token share; idle energy charged to no request. "
        + "; ".join(f"{key}: {text}" for key, text in ENERGY_DEFINITIONS.items())
    ),
    "tpot_median_s": (
        "median over the requests with an inter-token interval of their TPOT, (last "
        "token - first token) / (output tokens - 1), i.e. each request's mean ITL; the "
        "plant records first and last token times, not every token's, so this is the "
        "median per-request ITL"
    ),
    "tpot_within_deadline": (
        "share of the arrived requests whose TPOT is within the deadline; a request "
        "unfinished at the end of the run counts as a miss, a one-token request (no "
        "inter-token interval) as within, the rule the SLO attainment uses"
    ),
    "slo_attainment": (
        "share of arrived requests meeting both the TTFT SLO (ttft_slo_s + "
        "ttft_slo_per_prompt_token_s * prompt tokens) and the TPOT SLO of the profile; "
        "censored requests count as misses"
    ),
    "holds_slo": "SLO attainment >= the maximum clock's on the same scenario minus 1 point",
    "energy_saved_fraction": "(E_max - E) / E_max, E_max the maximum clock's energy",
    "oracle_capture": (
        "(E_max - E) / (E_max - E_oracle), E_oracle the lowest energy of the hindsight "
        "oracles that hold the SLO; null when the row does not hold the SLO"
    ),
    "invalid_decisions": (
        "the row's decisions that were not a clock in MHz (NaN, an infinity, zero, a "
        "negative number, a bool, a string, None), each replaced by the top clock in the "
        "safety chain; null for the hindsight rows, which make no decisions"
    ),
}

FILES = {
    "README.md": "this file: what each file holds and the command that reproduces the run",
    "report.md": (
        "the report for reading: versions, profiles, scenarios with trace checksums, the "
        "summary per row and one table per scenario"
    ),
    "report.json": (
        "the same, machine-readable (strict JSON, schema in `schema`): versions, "
        "definitions, profiles, scenarios, one entry per row and scenario, the summary"
    ),
    "pareto.csv": (
        "the Pareto plot's data: one line per row and scenario (energy saved, SLO "
        "attainment, whether it holds the SLO)"
    ),
    "pareto.png": (
        "energy saved against SLO attainment, one point per row and scenario (all of them, "
        "and those at 90 % attainment or more); a ring marks a point on its "
        "scenario's Pareto front"
    ),
    "scoreboard.json": "the scoreboard's whole payload, as `--out DIR` gets it",
}


# ------------------------------------------------------------------ per-request stats
def request_stats(result: ServingResult) -> dict[str, Any]:
    """Energy per request and the TPOT figures of one run, by the rules in
    :data:`REPORT_DEFINITIONS` (computed in the worker, where the records are)."""
    records = result.request_records
    energy = float(result.metrics.energy_j)
    served = [int(r.generated_tokens) for r in records]
    tokens = sum(served)
    per_token = energy / tokens if tokens > 0 else None
    tpots = [t for t in (r.tpot_s for r in records) if t is not None]
    within: dict[str, float | None] = {}
    for deadline in TPOT_DEADLINES_S:
        met = sum(
            1
            for r in records
            if r.finish_time_s is not None and (r.tpot_s is None or r.tpot_s <= deadline + 1e-12)
        )
        within[f"{round(deadline * 1000)}ms"] = met / len(records) if records else None
    return {
        "requests": len(records),
        "completed_requests": sum(1 for r in records if r.finish_time_s is not None),
        "output_tokens": tokens,
        "energy_per_output_token_j": per_token,
        "energy_per_request_mean_j": energy / len(records) if records else None,
        "energy_per_request_median_j": (
            per_token * float(statistics.median(served))
            if per_token is not None and served
            else None
        ),
        "tpot_median_s": float(statistics.median(tpots)) if tpots else None,
        "tpot_within_deadline": within,
        "attributed_energy": energy_summary(
            records,
            energy_j=energy,
            idle_energy_j=float(getattr(result.metrics, "idle_energy_j", 0.0)),
            output_tokens=tokens,
        ),
    }


# --------------------------------------------------------------------- the report
def reproduce_command(config: Mapping[str, Any], report_dir: str) -> str:
    """The command line that runs the same scenarios and writes the same report, with
    every choice spelled out (so that a later change of defaults does not change it)."""
    parts = ["gpugov", "bench", "controllers"]
    if config.get("mode") in ("quick", "tiny"):
        parts.append(f"--{config['mode']}")
    parts += ["--traces", *config["traces"], "--profiles", *config["profiles"]]
    parts += ["--loads", *config["loads"], "--duration", f"{config['duration_s']:g}"]
    if int(config.get("windows", 1)) > 1:
        parts += ["--windows", str(config["windows"])]
    if config.get("dwell_s") is not None:
        parts += ["--dwell", f"{config['dwell_s']:g}"]
    if config.get("floor_mhz") is not None:
        parts += ["--floor", f"{config['floor_mhz']:g}"]
    if config.get("engine_view") is not None:
        parts += ["--engine-view", str(config["engine_view"])]
    for spec in config.get("outside_controllers") or ():
        parts += ["--controller", str(spec)]
    parts += ["--report", report_dir]
    return shlex.join(parts)


def _scenario_entry(info: Mapping[str, Any]) -> dict[str, Any]:
    """What the report keeps of a scenario: its definition, checksums and references."""
    keys = (
        "key",
        "trace",
        "profile",
        "load",
        "load_label",
        "source_start_s",
        "source_duration_s",
        "scenario_duration_s",
        "load_scale",
        "utilization",
        "requests",
        "rejected_requests",
        "trace_sha256",
        "workload_checksum",
        "max_clock_slo_attainment",
        "oracle",
        "oracle_energy_j",
        "window_start_s",
    )
    entry = {key: info.get(key) for key in keys if key in info}
    entry["best_fixed_clock_mhz"] = (info.get("best_fixed") or {}).get("clock_mhz")
    entry["lp_bound_energy_j"] = (info.get("lp_bound") or {}).get("energy_j")
    return entry


def _row_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """One row and scenario in the report's units."""
    stats = row.get("request_stats") or {}
    return {
        "scenario": row["scenario"],
        "controller": row["controller"],
        "label": row["label"],
        "energy_j": row["energy_j"],
        "energy_saved_fraction": row["energy_saved_fraction"],
        "energy_per_output_token_j": stats.get(
            "energy_per_output_token_j", row["energy_per_output_token_j"]
        ),
        "energy_per_request_median_j": stats.get("energy_per_request_median_j"),
        "energy_per_request_mean_j": stats.get("energy_per_request_mean_j"),
        "output_tokens": stats.get("output_tokens"),
        "requests": stats.get("requests"),
        "slo_attainment": row["slo_attainment"],
        "slo_attainment_vs_max_pp": row["slo_attainment_vs_max_pp"],
        "holds_slo": row["holds_slo"],
        "ttft_p95_s": row["ttft_p95_s"],
        "tpot_median_s": stats.get("tpot_median_s"),
        "tpot_p95_s": row["tpot_p95_s"],
        "tpot_within_deadline": stats.get("tpot_within_deadline"),
        "attributed_energy": stats.get("attributed_energy"),
        "oracle_capture": row["oracle_capture"],
        "oracle_capture_after_warmup": row.get("oracle_capture_after_warmup"),
        "invalid_decisions": row.get("invalid_decisions"),
        "control_period_s": row.get("control_period_s"),
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per row kind across scenarios, in the scoreboard's order."""
    order: list[str] = []
    for row in rows:
        if row["controller"] not in order:
            order.append(row["controller"])
    out = []
    for key in order:
        mine = [r for r in rows if r["controller"] == key]
        out.append(
            {
                "controller": key,
                "label": mine[0]["label"],
                "scenarios": len(mine),
                "holds_slo": sum(bool(r["holds_slo"]) for r in mine),
                "median_energy_saved_fraction": _median([r["energy_saved_fraction"] for r in mine]),
                "median_energy_per_output_token_j": _median(
                    [r["energy_per_output_token_j"] for r in mine]
                ),
                "median_slo_attainment": _median([r["slo_attainment"] for r in mine]),
                "median_oracle_capture": _median([r["oracle_capture"] for r in mine]),
            }
        )
    return out


def _pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on
    both), sorted by the first axis."""
    front = [
        i
        for i, (x, y) in enumerate(points)
        if not any(
            (ox >= x and oy >= y) and (ox > x or oy > y)
            for j, (ox, oy) in enumerate(points)
            if j != i
        )
    ]
    return sorted(front, key=lambda i: points[i][0])


def build_report(
    payload: Mapping[str, Any], report_dir: str, *, created_utc: str | None = None
) -> dict[str, Any]:
    """``report.json``'s content from a scoreboard payload."""
    config = payload["config"]
    rows = [_row_entry(r) for r in payload["rows"]]
    pareto: dict[str, list[str]] = {}
    for info in payload["scenarios"]:
        mine = [
            r
            for r in rows
            if r["scenario"] == info["key"]
            and r["slo_attainment"] is not None
            and r["energy_saved_fraction"] is not None
        ]
        front = _pareto_front([(r["slo_attainment"], r["energy_saved_fraction"]) for r in mine])
        pareto[info["key"]] = [mine[i]["controller"] for i in front]
    for row in rows:
        row["pareto_optimal"] = row["controller"] in pareto.get(row["scenario"], [])
    return {
        "report": "gpugov governor benchmark",
        "schema": REPORT_SCHEMA,
        "created_utc": created_utc
        or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": reproduce_command(config, report_dir),
        "versions": payload.get("versions")
        or {
            "gpugov": payload.get("gpugov_version", __version__),
            "python": platform.python_version(),
        },
        "plant": {
            "model": "gpugov.plant iteration-level serving simulator",
            "version": payload.get("gpugov_version", __version__),
            "scheduler": "chunked-prefill",
            "seed": config.get("seed"),
            "control_period_s": config.get("control_period_s"),
            "latency_noise": "none",
        },
        "mode": payload["mode"],
        "config": config,
        "definitions": {**payload.get("definitions", {}), **REPORT_DEFINITIONS},
        "tpot_deadlines_s": list(TPOT_DEADLINES_S),
        "profiles": payload.get("profiles", {}),
        "scenarios": [_scenario_entry(info) for info in payload["scenarios"]],
        "skipped": payload.get("skipped", []),
        "failed_rows": payload.get("failed_rows", []),
        "rows": rows,
        "pareto_front": pareto,
        "summary": _summary(rows),
        "head_to_head": head_to_head(rows),
        "machine": payload.get("machine"),
        "wall_s": payload.get("wall_s"),
        # A --windows run: the starts, the summary over the windows and their overlaps.
        **{key: payload[key] for key in WINDOW_KEYS if key in payload},
    }


def versions_line(versions: Mapping[str, Any]) -> str:
    """``gpugov 0.2.0 (commit 1a2b3c4d5e6f, modified), Python 3.11.7, numpy 2.1.0, ...``
    and each outside controller's source: what ran the report, for ``report.md``."""
    source = versions.get("source") or {}
    commit = ""
    if source.get("commit"):
        commit = f" (commit {source['commit'][:12]}{', modified' if source.get('dirty') else ''})"
    parts = [f"gpugov {versions['gpugov']}{commit}", f"Python {versions['python']}"]
    parts += [f"{name} {versions[name]}" for name in LIBRARIES if versions.get(name)]
    for entry in versions.get("outside_controllers") or ():
        package = entry.get("package")
        where = (
            f"package {package} {entry.get('package_version') or '?'}"
            if package
            else f"module sha256 {(entry.get('module_sha256') or '?')[:12]}"
        )
        parts.append(f"{entry['spec']} from {entry['factory']} ({where})")
    return ", ".join(parts)


def report_markdown(report: Mapping[str, Any]) -> str:
    """``report.md``: the report for reading."""
    deadlines = [f"{round(d * 1000)}ms" for d in report["tpot_deadlines_s"]]
    lines = [
        f"# gpugov governor benchmark ({report['mode']})",
        "",
        f"{versions_line(report['versions'])}; created {report['created_utc']}. Reproduce with:",
        "",
        "```sh",
        report["command"],
        "```",
        "",
        f"Plant: {report['plant']['model']}, {report['plant']['scheduler']} scheduler, "
        f"seed {report['plant']['seed']}, no latency noise. {periods_line(report)} "
        "Definitions are in "
        "`report.json` (`definitions`); energy per request follows the attribution rule "
        "there (energy split in proportion to output tokens served).",
        "",
        "## Profiles",
        "",
        "| profile | status | source | CSV sha256 | manifest sha256 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, info in report["profiles"].items():
        lines.append(
            f"| {markdown_text(name)} | {info.get('status', '-')} | "
            f"{markdown_text(info.get('source', '-'))} | "
            f"`{info.get('profile_csv_sha256') or '-'}` | `{info.get('manifest_sha256') or '-'}` |"
        )
    lines += [
        "",
        "## Scenarios",
        "",
        "| scenario | requests | duration | load scale | utilisation | trace sha256 | "
        "workload checksum |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for s in report["scenarios"]:
        lines.append(
            f"| {scenario_title(s)} | {s['requests']} | "
            f"{cell(s.get('scenario_duration_s'), 1, 0, ' s')} "
            f"| {cell(s.get('load_scale'), 1, 3)} | {cell(s.get('utilization'), 100, 0, '%')} | "
            f"`{s.get('trace_sha256') or '-'}` | `{s.get('workload_checksum') or '-'}` |"
        )
    if report["skipped"]:
        lines += [
            "",
            "Skipped: "
            + "; ".join(
                f"{markdown_text(s['scenario'])} ({markdown_text(s['reason'])})"
                for s in report["skipped"]
            ),
        ]
    failed = failed_controller_lines(report["failed_rows"])
    if failed:
        lines += ["", "Failed, so left out of every table: " + "; ".join(failed) + "."]
    invalid = invalid_decision_lines(report["rows"])
    if invalid:
        lines += ["", "Not its own clocks: " + "; ".join(invalid) + "."]
    lines += [
        "",
        "## Summary per row",
        "",
        "Medians over the scenarios; a row holds the SLO when its attainment is within 1 "
        "point of the maximum clock's.",
        "",
        "| row | scenarios | holds SLO | median saved | median J/token | median SLO | "
        "median capture |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in report["summary"]:
        lines.append(
            f"| {s['label']} | {s['scenarios']} | {s['holds_slo']} | "
            f"{cell(s['median_energy_saved_fraction'], 100, 1, '%')} | "
            f"{cell(s['median_energy_per_output_token_j'], 1, 3)} | "
            f"{cell(s['median_slo_attainment'], 100, 2, '%')} | "
            f"{cell(s['median_oracle_capture'], 1, 2)} |"
        )
    lines += head_to_head_markdown(report.get("head_to_head") or [])
    lines += window_markdown(dict(report))
    for s in report["scenarios"]:
        lines += [
            "",
            f"## {scenario_title(s)}",
            "",
            f"Oracle: {s.get('oracle') or 'none holds'}; best fixed clock "
            f"{cell(s.get('best_fixed_clock_mhz'), 1, 0, ' MHz')}; maximum clock's SLO "
            f"attainment {cell(s.get('max_clock_slo_attainment'), 100, 2, '%')}. "
            "A `*` marks the scenario's Pareto front (energy saved against SLO attainment).",
            "",
            "| row | saved | J/token | J/request median / mean | SLO | holds | median TPOT | "
            + " | ".join(f"TPOT <= {d}" for d in deadlines)
            + " | capture |",
            "| --- | ---: | ---: | ---: | ---: | :---: | ---: | "
            + " | ".join("---:" for _ in deadlines)
            + " | ---: |",
        ]
        for r in report["rows"]:
            if r["scenario"] != s["key"]:
                continue
            within = r.get("tpot_within_deadline") or {}
            lines.append(
                f"| {r['label']}{' *' if r['pareto_optimal'] else ''} | "
                f"{cell(r['energy_saved_fraction'], 100, 1, '%')} | "
                f"{cell(r['energy_per_output_token_j'], 1, 3)} | "
                f"{cell(r['energy_per_request_median_j'], 1, 1)} / "
                f"{cell(r['energy_per_request_mean_j'], 1, 1)} J | "
                f"{cell(r['slo_attainment'], 100, 2, '%')} | {cell(r['holds_slo'])} | "
                f"{cell(r['tpot_median_s'], 1000, 1, ' ms')} | "
                + " | ".join(cell(within.get(d), 100, 1, "%") for d in deadlines)
                + f" | {cell(r['oracle_capture'], 1, 2)} |"
            )
    return "\n".join(lines) + "\n"


def pareto_csv(report: Mapping[str, Any]) -> str:
    """``pareto.csv``: the plot's points, one line per row and scenario."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(
        [
            "scenario",
            "controller",
            "slo_attainment",
            "slo_attainment_vs_max_pp",
            "energy_saved_fraction",
            "holds_slo",
            "pareto_optimal",
        ]
    )
    for r in report["rows"]:
        writer.writerow(
            [
                r["scenario"],
                r["controller"],
                "" if r["slo_attainment"] is None else f"{r['slo_attainment']:.6f}",
                ""
                if r["slo_attainment_vs_max_pp"] is None
                else f"{r['slo_attainment_vs_max_pp']:.4f}",
                "" if r["energy_saved_fraction"] is None else f"{r['energy_saved_fraction']:.6f}",
                int(bool(r["holds_slo"])),
                int(bool(r["pareto_optimal"])),
            ]
        )
    return text.getvalue()


def pareto_plot(report: Mapping[str, Any]) -> bytes | None:
    """``pareto.png``'s bytes: every point on the left, the points at 90 % attainment or
    more on the right, each scenario's Pareto front ringed; None when matplotlib is not
    installed."""
    from gpugov.study.plots import agg_pyplot, figure_bytes

    try:
        plt = agg_pyplot()
    except ImportError:
        return None

    order = [s["controller"] for s in report["summary"]]
    labels = {s["controller"]: s["label"] for s in report["summary"]}
    markers = "os^vDP*X<>hpdH8+x"
    fig, axes = plt.subplots(1, 2, figsize=(13, 6), sharey=True)
    for index, key in enumerate(order):
        mine = [
            r
            for r in report["rows"]
            if r["controller"] == key
            and r["slo_attainment"] is not None
            and r["energy_saved_fraction"] is not None
        ]
        for ax, zoom in zip(axes, (False, True), strict=True):
            shown = [r for r in mine if not zoom or r["slo_attainment"] >= 0.9]
            ax.scatter(
                [100.0 * r["slo_attainment"] for r in shown],
                [100.0 * r["energy_saved_fraction"] for r in shown],
                label=labels[key] if not zoom else None,
                marker=markers[index % len(markers)],
                color=f"C{index % 10}",
                alpha=0.85,
                s=40,
            )
    front = [r for r in report["rows"] if r["pareto_optimal"]]
    for ax, zoom in zip(axes, (False, True), strict=True):
        ringed = [r for r in front if not zoom or r["slo_attainment"] >= 0.9]
        ax.scatter(
            [100.0 * r["slo_attainment"] for r in ringed],
            [100.0 * r["energy_saved_fraction"] for r in ringed],
            label="on its scenario's Pareto front" if not zoom else None,
            marker="o",
            facecolors="none",
            edgecolors="k",
            linewidths=1.0,
            s=150,
        )
    axes[0].set_title("every row and scenario", fontsize=10)
    axes[1].set_title("SLO attainment >= 90 %", fontsize=10)
    axes[1].set_xlim(89.5, 100.5)
    for ax in axes:
        ax.set_xlabel("SLO attainment (%)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("energy saved vs the maximum clock (%)")
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(
        f"gpugov governor benchmark ({report['mode']}): one point per row and scenario; "
        "a ring marks its scenario's Pareto front",
        fontsize=10,
    )
    fig.tight_layout()
    data = figure_bytes(fig, "png")
    plt.close(fig)
    return data


def readme(report: Mapping[str, Any], files: Sequence[str], plot_note: str | None) -> str:
    """``README.md``: every file in the folder and the command that reproduces it."""
    lines = [
        f"# gpugov governor benchmark ({report['mode']})",
        "",
        f"Written by gpugov {report['versions']['gpugov']} on {report['created_utc']}: "
        f"{len(report['scenarios'])} scenario(s), {len(report['summary'])} rows each "
        "(gpugov's controllers, the peer governors and the hindsight oracles), on the "
        "simulated serving plant. The profiles are literature-derived unless their status "
        "says otherwise: compare the rows with each other, not the figures with hardware.",
        "",
        "Reproduce it (the same scenarios, seed and settings give the same energies and "
        "SLO figures; wall and decision times depend on the machine):",
        "",
        "```sh",
        report["command"],
        "```",
        "",
        "Check that the inputs are the same: each scenario's `trace_sha256` (the trace file) "
        "and `workload_checksum` (the requests after windowing and scaling), and each "
        "profile's `profile_csv_sha256` and `manifest_sha256`, in `report.json`.",
        "",
        "## Files",
        "",
    ]
    lines += [f"- `{name}`: {FILES[name]}" for name in files]
    if plot_note:
        lines += ["", plot_note]
    lines += [
        "",
        "## Units and rules",
        "",
    ]
    lines += [f"- `{key}`: {text}" for key, text in REPORT_DEFINITIONS.items()]
    lines += ["", "The method and every peer's source: `docs/benchmark.md` in gpugov."]
    return "\n".join(lines) + "\n"


def write_report(
    payload: Mapping[str, Any], report_dir: Path, *, created_utc: str | None = None
) -> tuple[dict[str, Path], str | None]:
    """Write the report folder (already checked by ``prepare_output_dir``) as one set
    (:func:`write_files_atomic`): every file is drawn first and none replaces the earlier
    one until all are written, so a Ctrl-C or a full disk midway leaves the earlier report
    whole (it left a new report.json beside the earlier README.md and report.md).

    Returns:
        The paths written by name, and the one line to print when the plot was left out
        (None when it was drawn).
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    report = build_report(payload, str(report_dir), created_utc=created_utc)
    contents: dict[str, str | bytes] = {
        "report.json": json.dumps(json_safe(report), indent=1, allow_nan=False) + "\n",
        "report.md": report_markdown(report),
        "pareto.csv": pareto_csv(report),
        "scoreboard.json": json.dumps(json_safe(payload), indent=1, allow_nan=False) + "\n",
    }
    note = None
    plot = pareto_plot(report)
    if plot is not None:
        contents["pareto.png"] = plot
    else:
        note = (
            "pareto.png was not drawn: matplotlib is not installed (pip install "
            "'gpugov[plots]'); its data is in pareto.csv"
        )
    files = ["README.md", "report.md", "report.json", "pareto.csv"]
    files += ["pareto.png"] if "pareto.png" in contents else []
    files += ["scoreboard.json"]
    contents["README.md"] = readme(report, files, note)
    paths = {name: report_dir / name for name in contents}
    write_files_atomic({paths[name]: content for name, content in contents.items()})
    return paths, note


__all__ = [
    "REPORT_DEFINITIONS",
    "REPORT_SCHEMA",
    "TPOT_DEADLINES_S",
    "build_report",
    "reproduce_command",
    "request_stats",
    "write_report",
]
