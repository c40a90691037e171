"""The scoreboard's outputs: the summary per controller, the Markdown report, the plot,
the strict JSON and the short table on stdout."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpugov.controllers.oracles import (
    SLO_TOLERANCE,
)
from gpugov.daemon.errors import printable
from gpugov.daemon.files import json_safe, write_files_atomic
from gpugov.study.markdown import markdown_text
from gpugov.study.online_eval import (
    online_model_lines,
)
from gpugov.study.scoreboard.scenarios import label_of, row_order
from gpugov.study.scoreboard.solvers import (
    LONG_HORIZON_SPLIT,
)
from gpugov.study.scoreboard.windows import window_markdown

DEFINITIONS = {
    "holds_slo": (
        f"SLO attainment >= the maximum clock's minus {100 * SLO_TOLERANCE:g} percentage point"
    ),
    "oracle_capture": (
        "(E_max - E) / (E_max - E_oracle), E_oracle the lowest energy of the hindsight "
        "oracles (best fixed, window) that hold the SLO; null when the controller does not "
        "hold the SLO or the oracle saves nothing"
    ),
    "oracle_capture_after_warmup": (
        "oracle capture on the energy used after the warm-up (min(300 s, half the "
        "scenario's own length, scenario_duration_s); the row's warmup_s) by the "
        "controller, the maximum clock and the oracle; null when the "
        "controller does not hold the SLO over the whole run"
    ),
    "model_error": (
        "mpc-online only: time-weighted mean |learned / true - 1| over the realised clocks "
        "held >= 5 s; decode iteration at the run's mean decode batch and a context of "
        "mean prompt + half the mean output; null for a quantity whose true value is 0 "
        "(a profile's idle power of 0 W)"
    ),
    "decision_time": (
        "wall time per controller call (perf_counter); MPC: its own solve times "
        "(diagnostics); oracles: null (offline search, see offline_compute_s)"
    ),
    "utilization": (
        "load multiplier over the SLO capacity multiplier: the highest multiplier at which "
        "the maximum clock's SLO attainment is within 1 point of its light-load attainment"
    ),
    "fluid_utilization_estimate": (
        "(sum prompt / prefill_rate(f_max) + sum (output - 1) / decode_rate(f_max)) / "
        "scenario duration"
    ),
    "lp_bound": "fluid LP lower bound on the energy of any run serving all the work",
    "head_to_head": (
        "each row against mpc-online on the scenarios where that row holds the SLO: how "
        "many, on how many of them mpc-online holds, the row's median saving there, "
        "mpc-online's on the same scenarios (none where it misses), and on how many the row "
        "saves more"
    ),
    "attributed_energy": (
        "request_stats.attributed_energy: the plant's exact per-request energy (prefill and "
        "decode, idle kept apart; docs/plant.md), mean/p50/p90/p99 per request and per "
        "output token, idle J, J per 1,000 requests and J per output token as ML.ENERGY "
        "reports it (whole energy over output tokens)"
    ),
}


def _request_energy(row: dict[str, Any]) -> str:
    """The table cell of a row's attributed energy per request: p50 / p99 in J."""
    energy = (row.get("request_stats") or {}).get("attributed_energy") or {}
    spread = energy.get("per_request_j") or {}
    if spread.get("p50") is None:
        return "-"
    return f"{cell(spread['p50'], 1, 1)} / {cell(spread.get('p99'), 1, 1)}"


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per controller across scenarios: how often it holds the SLO, its median energy
    saving and capture, and its worst p99 decision time."""
    out = []
    for key in row_order(r["controller"] for r in rows):
        mine = [r for r in rows if r["controller"] == key]
        captures = [r["oracle_capture"] for r in mine if r["oracle_capture"] is not None]
        after = [
            r["oracle_capture_after_warmup"]
            for r in mine
            if r.get("oracle_capture_after_warmup") is not None
        ]
        saved = [r["energy_saved_fraction"] for r in mine if r["energy_saved_fraction"] is not None]
        p99 = [r["decision_time_p99_s"] for r in mine if r["decision_time_p99_s"] is not None]
        out.append(
            {
                "controller": key,
                "label": label_of(key),
                "scenarios": len(mine),
                "holds_slo": sum(bool(r["holds_slo"]) for r in mine),
                "median_energy_saved_fraction": float(np.median(saved)) if saved else None,
                "median_oracle_capture": float(np.median(captures)) if captures else None,
                "min_oracle_capture": float(min(captures)) if captures else None,
                "median_oracle_capture_after_warmup": (float(np.median(after)) if after else None),
                "max_decision_time_p99_s": float(max(p99)) if p99 else None,
            }
        )
    return out


HEAD_TO_HEAD_REFERENCE = "mpc-online"
"""The row every other is set against in :func:`head_to_head`: the default governor."""


def head_to_head(
    rows: Sequence[dict[str, Any]], reference: str = HEAD_TO_HEAD_REFERENCE
) -> list[dict[str, Any]]:
    """Each row against ``reference`` on the scenarios where that row holds the SLO.

    A median over every scenario compares different sets (a row that misses a scenario
    still counts its saving there). Here a row's median saving over the scenarios it
    holds is set beside the reference's over the same scenarios, a reference that misses
    one counting no saving there (savings at equal SLO), with how many of them the row
    saves more on. Empty when the reference did not run."""
    by_scenario: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_scenario.setdefault(row["scenario"], {})[row["controller"]] = row
    if not any(reference in runs for runs in by_scenario.values()):
        return []

    def saved(row: dict[str, Any]) -> float:
        value = row.get("energy_saved_fraction")
        return float(value) if row["holds_slo"] and value is not None else 0.0

    out = []
    for key in row_order(row["controller"] for row in rows):
        if key in ("max", reference):
            continue
        pairs = [
            (runs[key], runs[reference])
            for runs in by_scenario.values()
            if key in runs and reference in runs and runs[key]["holds_slo"]
        ]
        theirs = [saved(row) for row, _ in pairs]
        ours = [saved(other) for _, other in pairs]
        out.append(
            {
                "controller": key,
                "label": label_of(key),
                "reference": reference,
                "holds_slo": len(pairs),
                "reference_holds_slo": sum(bool(other["holds_slo"]) for _, other in pairs),
                "median_energy_saved_fraction": float(np.median(theirs)) if pairs else None,
                "reference_median_energy_saved_fraction": (
                    float(np.median(ours)) if pairs else None
                ),
                "saves_more": sum(a > b + 1e-12 for a, b in zip(theirs, ours, strict=True)),
            }
        )
    return out


# ----------------------------------------------------------------------------- output
def cell(value: Any, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    """A table cell: "-" for None, yes/no for a bool, a number scaled and rounded."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float | int):
        return f"{value * scale:.{digits}f}{suffix}"
    return str(value)


def _trace(info: dict[str, Any]) -> str:
    """A scenario's trace, with its window's start for a held-out window (``--windows``)."""
    start = info.get("window_start_s")
    trace = markdown_text(info["trace"])
    return trace if start is None else f"{trace} @{start:g} s"


def periods_line(payload: Mapping[str, Any]) -> str:
    """The control periods the rows decided at (each row's own where the board recorded
    it: the fast MPC, ``mpc-online``, the peers and outside rows each have theirs), the
    MPC's horizon, and the SLO target and engine view every controller was given."""
    config = payload["config"]
    period = config["control_period_s"]
    others: dict[float, list[str]] = {}
    for row in payload["rows"]:
        own = row.get("control_period_s")
        if own is not None and own != period and row["controller"] not in others.get(own, []):
            others.setdefault(own, []).append(row["controller"])
    if others:
        rest = (
            " ("
            + "; ".join(
                f"{', '.join(map(markdown_text, keys))} {own:g} s"
                for own, keys in sorted(others.items(), reverse=True)
            )
            + ")"
        )
    elif any(row.get("control_period_s") is not None for row in payload["rows"]):
        rest = ", every row"  # the rows recorded their periods, all the board's
    else:  # a board from before the rows recorded their periods
        rest = (
            f" (the fast MPC {config.get('fast_mpc_period_s', period):g} s"
            + (
                f", mpc-online {config['online_period_s']:g} s"
                if "online_period_s" in config
                else ""
            )
            + ")"
        )
    target = config.get("slo_target")
    given = (
        ""
        if "engine_view" not in config
        else " Every controller was given "
        + (
            "no SLO target"
            if target is None
            else f"an SLO target of {100.0 * target['attainment']:g} % over "
            f"{target['window_s']:g} s"
        )
        + f" and observed the {config['engine_view']} engine view."
    )
    return f"Control period {period:g} s{rest}; MPC horizon {config['mpc_horizon_s']:g} s." + given


def _chain_line(config: dict[str, Any]) -> str:
    """The safety chain every controller ran in (older results have none recorded)."""
    if "dwell_s" not in config:
        return "Controllers ran without the node's safety chain (recorded before it applied)."
    floor = config.get("floor_mhz")
    return (
        "Every controller ran in the node's safety chain: clamp to the supported clocks, "
        + (f"floor {floor:g} MHz, " if floor else "no floor, ")
        + f"{config['dwell_s']:g} s dwell before a lower clock (a raise passes at once)."
    )


def head_to_head_markdown(entries: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown section of :func:`head_to_head` (none when it is empty)."""
    if not entries:
        return []
    reference = entries[0]["reference"]
    lines = [
        "",
        f"## Head to head against {label_of(reference)}",
        "",
        f"On the scenarios where each row holds the SLO: its median saving there, "
        f"{label_of(reference)}'s on the same scenarios (none where it misses), and on how "
        "many the row saves more.",
        "",
        f"| controller | holds SLO | {label_of(reference)} holds there | median saved there | "
        f"{label_of(reference)}'s there | saves more on |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for entry in entries:
        lines.append(
            f"| {entry['label']} | {entry['holds_slo']} | {entry['reference_holds_slo']} | "
            f"{cell(entry['median_energy_saved_fraction'], 100, 1, '%')} | "
            f"{cell(entry['reference_median_energy_saved_fraction'], 100, 1, '%')} | "
            f"{entry['saves_more']} |"
        )
    return lines


def markdown(payload: dict[str, Any]) -> str:
    """The scoreboard as markdown: settings, per-scenario tables, summary, comparison."""
    lines = [
        f"# Controller scoreboard ({payload['mode']})",
        "",
        f"Wall time {payload['wall_s']:.1f} s on {payload['machine']['cpus']} CPUs, "
        f"{payload['config']['jobs']} worker process(es). Definitions: `docs/scoreboard.md`.",
        "Energy saved is relative to the maximum clock; SLO holds when attainment is within "
        "1 point of the maximum clock's; capture = (E_max - E) / (E_max - E_oracle).",
        periods_line(payload),
        _chain_line(payload["config"]),
        "",
    ]
    if payload["skipped"]:
        lines.append(
            "Skipped: "
            + "; ".join(
                f"{markdown_text(s['scenario'])} ({markdown_text(s['reason'])})"
                for s in payload["skipped"]
            )
        )
        lines.append("")
    failed = failed_controller_lines(payload.get("failed_rows", ()))
    if failed:
        lines.append("Failed, so left out of every table: " + "; ".join(failed) + ".")
        lines.append("")
    invalid = invalid_decision_lines(payload["rows"])
    if invalid:
        lines.append("Not its own clocks: " + "; ".join(invalid) + ".")
        lines.append("")
    lines += [
        "## Summary per controller",
        "",
        "| controller | scenarios | holds SLO | median saved | median capture | "
        "min capture | median capture after warm-up | worst p99 decision |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in payload["summary"]:
        lines.append(
            f"| {s['label']} | {s['scenarios']} | {s['holds_slo']} | "
            f"{cell(s['median_energy_saved_fraction'], 100, 1, '%')} | "
            f"{cell(s['median_oracle_capture'], 1, 2)} | {cell(s['min_oracle_capture'], 1, 2)} | "
            f"{cell(s.get('median_oracle_capture_after_warmup'), 1, 2)} | "
            f"{cell(s['max_decision_time_p99_s'], 1000, 2, ' ms')} |"
        )
    lines += head_to_head_markdown(payload.get("head_to_head") or [])
    lines += window_markdown(payload)
    lines += online_model_lines(payload["rows"])
    comparison = payload.get("mpc_solver_comparison")
    if comparison:
        lines += [
            "",
            "## MPC solvers on the same decision points",
            "",
            f"Scenario `{printable(comparison['scenario'])}`, {comparison['points']} decision "
            "points, "
            f"{comparison['horizon_steps']}-step horizon: the fast solver is no worse on "
            f"{cell(comparison['fraction_no_worse'], 100, 1, '%')} of points, worst relative "
            f"excess {cell(comparison['worst_relative_excess'], 100, 3, '%')}; p99 solve "
            f"{cell(comparison['fast_p99_s'], 1000, 2, ' ms')} (fast) vs "
            f"{cell(comparison['slsqp_p99_s'], 1000, 2, ' ms')} (SLSQP); with each period "
            f"split in {LONG_HORIZON_SPLIT} ({comparison.get('long_horizon_steps')} steps), "
            f"fast p99 {cell(comparison.get('fast_long_p99_s'), 1000, 2, ' ms')}.",
        ]
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for row in payload["rows"]:
        by_scenario.setdefault(row["scenario"], []).append(row)
    # Every row but the maximum clock, the board's own then outside ones.
    columns = [key for key in row_order(r["controller"] for r in payload["rows"]) if key != "max"]
    lines += [
        "",
        "## Energy saved per scenario",
        "",
        "Energy saved vs the maximum clock, then capture in brackets; a dash after the "
        "saving marks a run that does not hold the SLO. Utilisation is the load over the "
        "maximum clock's SLO capacity; A_max the maximum clock's SLO attainment; the last "
        "column the fluid LP bound over the oracle energy.",
        "",
        "| trace | profile | load | util | A_max | "
        + " | ".join(label_of(key) for key in columns)
        + " | LP / oracle |",
        "| --- | --- | --- | ---: | ---: | " + " | ".join("---:" for _ in columns) + " | ---: |",
    ]
    for info in payload["scenarios"]:
        mine = {row["controller"]: row for row in by_scenario.get(info["key"], [])}
        cells = []
        for key in columns:
            row = mine.get(key)
            if row is None:
                cells.append("")
                continue
            saved = cell(row["energy_saved_fraction"], 100, 1, "%")
            if not row["holds_slo"]:
                cells.append(f"{saved} -")
            elif row["oracle_capture"] is None:
                cells.append(saved)
            else:
                cells.append(f"{saved} ({row['oracle_capture']:.2f})")
        bound = info["lp_bound"]["energy_j"]
        ratio = (
            cell(bound / info["oracle_energy_j"], 1, 2)
            if bound is not None and info["oracle_energy_j"]
            else "-"
        )
        lines.append(
            f"| {_trace(info)} | {markdown_text(info['profile'])} | {info['load_label']} | "
            f"{cell(info['utilization'], 100, 0, '%')} | "
            f"{cell(info['max_clock_slo_attainment'], 100, 1, '%')} | "
            + " | ".join(cells)
            + f" | {ratio} |"
        )
    lines += ["", "## Scenarios", ""]
    for info in payload["scenarios"]:
        bound = info["lp_bound"]
        lines += [
            f"### {_trace(info)} / {markdown_text(info['profile'])} / {info['load_label']}",
            "",
            f"{info['requests']} requests over {info['scenario_duration_s']:.0f} s "
            f"(source {info['source_start_s']:.0f} s + {info['source_duration_s']:.0f} s, "
            f"load scale {info['load_scale']:.3g}); utilisation "
            f"{100 * info['utilization']:.0f}% of maximum-clock SLO capacity (fluid estimate "
            f"{100 * info['fluid_utilization_estimate']:.0f}%), maximum clock's SLO attainment "
            f"{cell(info['max_clock_slo_attainment'], 100, 2, '%')}. Best fixed clock "
            f"{info['best_fixed']['clock_mhz']:g} MHz ({info['best_fixed']['simulations']} "
            f"runs); window oracle {info['window_oracle']['source']}; fluid LP bound "
            f"{cell(bound['energy_j'], 1e-3, 1, ' kJ')}.",
            "",
            *SCENARIO_TABLE_HEAD,
        ]
        lines += [scenario_row(row) for row in by_scenario.get(info["key"], [])]
        lines.append("")
    return "\n".join(lines) + "\n"


SCENARIO_TABLE_HEAD = (
    "| controller | energy | saved | J/token | J/request p50 / p99 | SLO | holds | "
    "TTFT p95 | TPOT p95 | limit / thermal | over cap | decision p50 / p99 | capture |",
    "| --- | ---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: |",
)
"""A scenario's table's header and alignment lines (one line a row: :func:`scenario_row`)."""


def scenario_row(row: dict[str, Any]) -> str:
    """One controller's line of a scenario's table: ``limit / thermal`` is the seconds
    above the board limit and the thermal limit, ``over cap`` the seconds above the power
    cap the row requested ("-" where it set none)."""
    decision = (
        "offline"
        if row["decision_time_p50_s"] is None
        else f"{cell(row['decision_time_p50_s'], 1000, 2)} / "
        f"{cell(row['decision_time_p99_s'], 1000, 2)} ms"
    )
    return (
        f"| {row['label']} | {cell(row['energy_j'], 1e-3, 1, ' kJ')} | "
        f"{cell(row['energy_saved_fraction'], 100, 1, '%')} | "
        f"{cell(row['energy_per_output_token_j'], 1, 3)} | "
        f"{_request_energy(row)} | "
        f"{cell(row['slo_attainment'], 100, 2, '%')} | {cell(row['holds_slo'])} | "
        f"{cell(row['ttft_p95_s'], 1, 3, ' s')} | "
        f"{cell(row['tpot_p95_s'], 1000, 1, ' ms')} | "
        f"{cell(row['power_cap_violation_s'], 1, 1)} / "
        f"{cell(row['thermal_violation_s'], 1, 1)} s | "
        f"{cell(row.get('cap_overshoot_s'), 1, 1, ' s')} | {decision} | "
        f"{cell(row['oracle_capture'], 1, 2)} |"
    )


MARKERS = "os^vDP*X<>hpdH8+x"
"""One marker per row in table order (repeating past the last)."""


def plot_png(payload: dict[str, Any]) -> bytes:
    """``scoreboard.png``'s bytes: energy saved vs SLO attainment (relative to the maximum
    clock), one point per controller and scenario."""
    from gpugov.study.plots import agg_pyplot, figure_bytes

    plt = agg_pyplot()

    fig, ax = plt.subplots(figsize=(9, 6))
    for index, key in enumerate(row_order(r["controller"] for r in payload["rows"])):
        mine = [
            r
            for r in payload["rows"]
            if r["controller"] == key
            and r["slo_attainment_vs_max_pp"] is not None
            and r["energy_saved_fraction"] is not None
        ]
        if not mine:
            continue
        ax.scatter(
            [r["slo_attainment_vs_max_pp"] for r in mine],
            [100.0 * r["energy_saved_fraction"] for r in mine],
            label=label_of(key),
            marker=MARKERS[index % len(MARKERS)],
            color=f"C{index}",
            alpha=0.8,
            s=36,
        )
    shown = [
        r["slo_attainment_vs_max_pp"]
        for r in payload["rows"]
        if r["slo_attainment_vs_max_pp"] is not None
    ]
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(min([-2.0, *shown]) * 1.2, max([0.5, *shown]) * 1.5)
    ax.axvline(-100.0 * SLO_TOLERANCE, color="k", ls="--", lw=0.8)
    ax.text(
        -100.0 * SLO_TOLERANCE, ax.get_ylim()[1], " SLO holds to the right", va="top", fontsize=8
    )
    ax.set_xlabel("SLO attainment minus the maximum clock's (percentage points, symlog)")
    ax.set_ylabel("energy saved vs the maximum clock (%)")
    ax.set_title(f"gpugov controller scoreboard ({payload['mode']}): one point per scenario")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    data = figure_bytes(fig, "png")
    plt.close(fig)
    return data


def write_outputs(payload: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``scoreboard.json``, ``scoreboard.md`` and ``scoreboard.png`` to ``out_dir``
    as one set (:func:`write_files_atomic`: all to temporary files first, then renamed into
    place), so a failure midway leaves an earlier run's three files as they were."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "scoreboard.json",
        "md": out_dir / "scoreboard.md",
        "png": out_dir / "scoreboard.png",
    }
    write_files_atomic(
        {
            paths["json"]: json.dumps(json_safe(payload), indent=1, allow_nan=False) + "\n",
            paths["md"]: markdown(payload),
            paths["png"]: plot_png(payload),
        }
    )
    return paths


def failed_controller_lines(failed: Sequence[dict[str, Any]]) -> list[str]:
    """One phrase per outside controller whose row failed: on how many scenarios, and the
    first error (``failed_rows`` of a board)."""
    by_controller: dict[str, list[dict[str, Any]]] = {}
    for entry in failed:
        by_controller.setdefault(entry["controller"], []).append(entry)
    return [
        f"{controller} failed on {len(entries)} scenario(s), first "
        f"{printable(entries[0]['scenario'])}: {printable(entries[0]['error'])}"
        for controller, entries in by_controller.items()
    ]


def invalid_decision_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per controller with decisions that were not a clock (the chain ran the
    top clock instead): how many, over how many scenarios."""
    counts: dict[str, list[int]] = {}
    for row in rows:
        if row.get("invalid_decisions"):
            counts.setdefault(row["controller"], []).append(int(row["invalid_decisions"]))
    return [
        f"controller {controller!r}: {sum(found)} decision(s) on {len(found)} scenario(s) were "
        "not a clock in MHz; the safety chain ran the top clock instead"
        for controller, found in counts.items()
    ]


def short_table(payload: dict[str, Any]) -> str:
    """The summary printed on stdout."""
    lines = [
        f"{'controller':<26} {'holds':>7} {'saved':>7} {'capture':>8} {'min cap':>8} "
        f"{'cap>warm':>8} {'p99 dec':>10}"
    ]
    for s in payload["summary"]:
        lines.append(
            f"{s['label']:<26} {s['holds_slo']:>3}/{s['scenarios']:<3} "
            f"{cell(s['median_energy_saved_fraction'], 100, 1, '%'):>7} "
            f"{cell(s['median_oracle_capture'], 1, 2):>8} {cell(s['min_oracle_capture'], 1, 2):>8} "
            f"{cell(s.get('median_oracle_capture_after_warmup'), 1, 2):>8} "
            f"{cell(s['max_decision_time_p99_s'], 1000, 2, ' ms'):>10}"
        )
    comparison = payload.get("mpc_solver_comparison")
    if comparison:
        lines.append(
            f"MPC solvers on {comparison['points']} points: fast no worse on "
            f"{cell(comparison['fraction_no_worse'], 100, 1, '%')}, worst excess "
            f"{cell(comparison['worst_relative_excess'], 100, 3, '%')}, p99 "
            f"{cell(comparison['fast_p99_s'], 1000, 2, ' ms')} fast vs "
            f"{cell(comparison['slsqp_p99_s'], 1000, 2, ' ms')} SLSQP; "
            f"{comparison.get('long_horizon_steps')}-step fast p99 "
            f"{cell(comparison.get('fast_long_p99_s'), 1000, 2, ' ms')}"
        )
    lines.append(
        f"{len(payload['scenarios'])} scenarios, {len(payload['skipped'])} skipped, "
        f"wall {payload['wall_s']:.1f} s"
    )
    return "\n".join(lines)
