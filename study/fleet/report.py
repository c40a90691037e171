"""``gpugov fleet``'s outputs: ``fleet.json`` (every cell, with its series), ``fleet.md``
(the tables) and ``fleet.png`` (attainment and energy per budget, the budget step's power
against the budget). The plot needs matplotlib (the ``gpugov[plots]`` extra); without it
the JSON and the tables are written and one line says the plot was not."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpugov.daemon.errors import printable
from gpugov.daemon.files import write_files_atomic
from gpugov.daemon.safety import SafetySettings
from gpugov.study.fleet.run import UNCAPPED
from gpugov.study.fleet.workload import UTILIZATION_TOLERANCE
from gpugov.study.markdown import markdown_text
from gpugov.study.scoreboard.report import cell

PLOTS_HINT = "matplotlib is not installed: no plot written (pip install 'gpugov[plots]')"
LABELS = {
    "uniform": "uniform caps (Dynamo phase 1)",
    "dps": "DPS-style steering",
    "slo": "SLO-aware (published need)",
    UNCAPPED: "uncapped (every node at TDP)",
}


def _load_reached(config: Mapping[str, Any], workload: Mapping[str, Any]) -> str:
    """The load asked of the fleet and, where it missed that by more than the tolerance
    (a trace too short or too sparse to scale), the load its requests reached."""
    asked = f"{config['utilization']:g} of the fleet's fluid capacity"
    reached = workload.get("reached_utilization")  # absent from an older fleet.json
    if reached is None or abs(reached / config["utilization"] - 1.0) <= UTILIZATION_TOLERANCE:
        return asked
    return f"{asked} asked, {reached:.3g} reached: the trace cannot be scaled to it"


def _pct(value: float | None, digits: int = 1) -> str:
    return cell(value, 100.0, digits, " %")


def _budget_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in payload["rows"] if not r["step"]]


def _step_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in payload["rows"] if r["step"]]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def board_breakdown(row: dict[str, Any]) -> list[dict[str, Any]]:
    """One cell's nodes grouped by profile (in the order the fleet first lists them): the
    nodes, the requests they served, their requests-weighted SLO attainment, the mean cap
    the allocator gave a node and the mean need its controller published (over the
    allocations; None where none), the energy per node and per request."""
    series = row.get("series") or {}
    caps = series.get("caps_w") or []
    needs = series.get("needs_w") or []
    groups: dict[str, list[int]] = {}
    for index, node in enumerate(row["nodes"]):
        groups.setdefault(node["profile"], []).append(index)
    out = []
    for profile, members in groups.items():
        nodes = [row["nodes"][i] for i in members]
        requests = sum(int(node["requests"]) for node in nodes)
        met = sum(  # a node the router sent nothing has no attainment (None)
            float(node["slo_attainment"]) * int(node["requests"])
            for node in nodes
            if int(node["requests"])
        )
        energy = sum(float(node["energy_j"]) for node in nodes)
        out.append(
            {
                "profile": profile,
                "nodes": len(nodes),
                "requests": requests,
                "slo_attainment": met / requests if requests else None,
                "mean_cap_w": _mean(
                    [float(tick[i]) for tick in caps for i in members if tick[i] is not None]
                ),
                "mean_need_w": _mean(
                    [float(tick[i]) for tick in needs for i in members if tick[i] is not None]
                ),
                "energy_per_node_j": energy / len(nodes),
                "energy_per_request_j": energy / requests if requests else None,
            }
        )
    return out


def _source_window(config: Mapping[str, Any], workload: Mapping[str, Any]) -> str:
    """Where in the trace the fleet's first window starts: ``from 20 s``, with
    ``--trace-start`` where the start was wrapped round the trace, or ``whole`` where a
    window covers the trace."""
    start, asked = workload["source_start_s"], config["trace_start_s"]
    if start is None:
        return f"whole (shorter than a window; --trace-start {asked:g} s has no effect)"
    if start == asked:
        return f"from {start:g} s"
    return f"from {start:g} s (--trace-start {asked:g} s wrapped round the trace)"


def markdown(payload: dict[str, Any]) -> str:
    """The report: the run's settings, the budget table and the budget-step table."""
    config = payload["config"]
    workload = payload["workload"]
    kinds = sorted(set(config["profiles"][: config["nodes"]]))
    target = config.get("slo_target")
    decides = (
        f" every {config['control_period_s']:g} s"
        + (f" to an SLO target of {100 * target:g} %" if target is not None else "")
        if "control_period_s" in config
        else ""
    )
    if "dwell_s" in config:  # the chain and the view it ran in (older results: unsaid)
        chain = SafetySettings(dwell_s=config["dwell_s"]).words()
        decides += f" in the node's safety chain ({chain})"
    if config.get("engine_view"):
        decides += f" on the {config['engine_view']} engine view"
    lines = [
        "# gpugov fleet",
        "",
        f"{config['nodes']} nodes ({', '.join(map(markdown_text, kinds))}) running "
        f"`{printable(config['controller'])}`"
        f"{decides}, "
        f"router `{config['router']}`, trace `{printable(workload['trace'])}` "
        f"{_source_window(config, workload)} scaled {workload['load_scale']:.3g}x "
        f"({_load_reached(config, workload)}, "
        f"{workload['requests']} requests over {config['duration_s']:g} s, "
        f"then {config['drain_s']:g} s to drain). Summed TDP {payload['tdp_w']:.0f} W; the "
        f"allocator runs every {config['allocator_period_s']:g} s and splits the budget less "
        f"a {100 * config['guard_fraction']:g} % guard band; caps within "
        f"[{100 * config['floor_fraction']:g} % of TDP, TDP].",
        "",
        "SLO attainment: requests meeting both their TTFT and TPOT SLO, over all nodes. "
        f"It holds when within {100 * payload['slo_tolerance']:g} point(s) of the uncapped "
        "fleet's (the scoreboard's condition). Time over budget: seconds whose mean fleet "
        "power exceeded the budget.",
        "",
        "| allocator | budget | SLO attainment | vs uncapped | holds | energy | vs uncapped "
        "| J/token | mean power | time over budget |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in _budget_rows(payload):
        budget = row["budget_fraction"]
        lines.append(
            "| "
            + " | ".join(
                [
                    LABELS.get(row["allocator"], row["allocator"]),
                    "-" if budget is None else f"{100 * budget:.0f} % TDP",
                    _pct(row["slo_attainment"], 2),
                    cell(row["slo_vs_uncapped_pp"], 1.0, 2, " pp"),
                    "-" if row["slo_holds"] is None else ("yes" if row["slo_holds"] else "no"),
                    cell(row["energy_j"], 1e-6, 3, " MJ"),
                    _pct(row["energy_vs_uncapped"]),
                    cell(row["energy_per_output_token_j"], 1.0, 3, " J"),
                    cell(row["mean_power_w"], 1.0, 0, " W"),
                    cell(row["time_over_budget_s"], 1.0, 0, " s"),
                ]
            )
            + " |"
        )
    lines += [
        "",
        "## Per board type",
        "",
        "Each cell's nodes by profile: the requests the router sent them, their SLO "
        "attainment, the mean cap the allocator gave one (and the mean need its controller "
        "published, where it publishes one), the energy per node and per request: where "
        "an allocator's points and joules go.",
        "",
        "| allocator | budget | board | nodes | requests | SLO attainment | mean cap "
        "| mean need | energy per node | J/request |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in _budget_rows(payload):
        budget = row["budget_fraction"]
        for board in board_breakdown(row):
            lines.append(
                "| "
                + " | ".join(
                    [
                        LABELS.get(row["allocator"], row["allocator"]),
                        "-" if budget is None else f"{100 * budget:.0f} % TDP",
                        markdown_text(board["profile"]),
                        str(board["nodes"]),
                        str(board["requests"]),
                        _pct(board["slo_attainment"], 2),
                        cell(board["mean_cap_w"], 1.0, 0, " W"),
                        cell(board["mean_need_w"], 1.0, 0, " W"),
                        cell(board["energy_per_node_j"], 1e-3, 1, " kJ"),
                        cell(board["energy_per_request_j"], 1.0, 1, " J"),
                    ]
                )
                + " |"
            )
    steps = _step_rows(payload)
    if steps:
        start, hold = config["step_at_s"], config["step_hold_s"]
        lines += [
            "",
            f"## Budget step ({100 * config['step_budget']:g} % TDP, cut by "
            f"{100 * config['step_depth']:g} % over {config['step_ramp_s']:g} s at "
            f"{start:g} s, held {hold:g} s)",
            "",
            "Time to under: seconds from the signal to the end of the first second whose mean "
            "fleet power is at or under the cut budget; to stay under: from which it stays "
            "there to the end of the hold. SLO in the window: requests arriving from "
            "the signal to the end of the hold; the loss is against the same allocator "
            "without the step.",
            "",
            "| allocator | time to under | to stay under | time over budget (window) "
            "| SLO in the window | SLO loss | energy |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in steps:
            lines.append(
                "| "
                + " | ".join(
                    [
                        LABELS.get(row["allocator"], row["allocator"]),
                        cell(row["step_time_to_under_s"], 1.0, 0, " s"),
                        cell(row["step_time_to_stay_under_s"], 1.0, 0, " s"),
                        cell(row["step_time_over_budget_s"], 1.0, 0, " s"),
                        _pct(row["step_window_slo_attainment"], 2),
                        cell(row["step_slo_loss_pp"], 1.0, 2, " pp"),
                        cell(row["energy_j"], 1e-6, 3, " MJ"),
                    ]
                )
                + " |"
            )
    runner = payload["runner"]
    lines += [
        "",
        f"Ran {len(payload['rows'])} cells on {runner['kind']}"
        + (f" ({runner['ray_address']})" if runner["ray_address"] else "")
        + f" in {payload['wall_s']:.0f} s; workload checksum "
        f"`{workload['workload_checksum'][:16]}`; gpugov {payload['gpugov_version']}.",
        "",
    ]
    return "\n".join(lines)


def short_table(payload: dict[str, Any]) -> str:
    """The summary printed on stdout: one line per cell."""
    lines = [f"{'cell':<22} {'SLO':>8} {'vs unc.':>9} {'energy':>9} {'over':>6} {'to under':>9}"]
    for row in payload["rows"]:
        lines.append(
            f"{row['key']:<22} {_pct(row['slo_attainment'], 2):>8} "
            f"{cell(row['slo_vs_uncapped_pp'], 1.0, 2, ' pp'):>9} "
            f"{cell(row['energy_j'], 1e-6, 3, ' MJ'):>9} "
            f"{cell(row['time_over_budget_s'], 1.0, 0, ' s'):>6} "
            f"{cell(row.get('step_time_to_under_s'), 1.0, 0, ' s') if row['step'] else '':>9}"
        )
    return "\n".join(lines)


def plot_png(payload: dict[str, Any]) -> bytes | None:
    """``fleet.png``'s bytes: SLO attainment and energy against the budget per allocator,
    and each allocator's fleet power against the budget through the step. None without
    matplotlib."""
    from gpugov.study.plots import agg_pyplot, figure_bytes

    try:
        plt = agg_pyplot()
    except ImportError:
        return None

    rows = _budget_rows(payload)
    steps = _step_rows(payload)
    allocators = list(dict.fromkeys(r["allocator"] for r in rows if r["budget_fraction"]))
    reference = next((r for r in rows if r["allocator"] == UNCAPPED), None)
    panels = 3 if steps else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4))
    for index, name in enumerate(allocators):
        mine = sorted(
            (r for r in rows if r["allocator"] == name), key=lambda r: r["budget_fraction"]
        )
        x = [100 * r["budget_fraction"] for r in mine]
        style = {"marker": "os^"[index % 3], "color": f"C{index}", "label": LABELS.get(name, name)}
        axes[0].plot(x, [100 * (r["slo_attainment"] or 0.0) for r in mine], **style)
        axes[1].plot(x, [r["energy_j"] / 1e6 for r in mine], **style)
    if reference is not None:
        axes[0].axhline(100 * (reference["slo_attainment"] or 0.0), color="k", ls="--", lw=0.8)
        axes[1].axhline(reference["energy_j"] / 1e6, color="k", ls="--", lw=0.8)
    axes[0].set_ylabel("SLO attainment (%), dashed: uncapped")
    axes[1].set_ylabel("fleet energy (MJ), dashed: uncapped")
    for axis in axes[:2]:
        axis.set_xlabel("budget (% of summed TDP)")
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    if steps:
        _plot_step(axes[2], steps, allocators)
    fig.suptitle(f"gpugov fleet: {payload['config']['nodes']} nodes", fontsize=10)
    fig.tight_layout()
    data = figure_bytes(fig, "png")
    plt.close(fig)
    return data


def _plot_step(axis: Any, steps: Sequence[dict[str, Any]], allocators: Sequence[str]) -> None:
    """Fleet power through the budget step, one line per allocator, and the budget."""
    for row in steps:
        series = row["series"]
        period = series["period_s"]
        times = [i * period for i in range(len(series["fleet_power_w"]))]
        index = allocators.index(row["allocator"]) if row["allocator"] in allocators else 0
        axis.plot(
            times,
            [p / 1e3 for p in series["fleet_power_w"]],
            color=f"C{index}",
            lw=0.8,
            label=LABELS.get(row["allocator"], row["allocator"]),
        )
    budget = steps[0]["series"]["budget_w"]
    period = steps[0]["series"]["period_s"]
    axis.plot(
        [i * period for i in range(len(budget))],
        [b / 1e3 if b is not None else None for b in budget],
        color="k",
        ls="--",
        lw=1.0,
        label="budget",
    )
    axis.set_xlabel("plant time (s)")
    axis.set_ylabel("fleet power (kW)")
    axis.set_title("budget step", fontsize=9)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7)


OUTPUT_NAMES = ("fleet.json", "fleet.md", "fleet.png")
"""The files :func:`write_outputs` writes in the output directory."""


def write_outputs(payload: dict[str, Any], out_dir: Path) -> tuple[dict[str, Path], str | None]:
    """Write ``fleet.json``, ``fleet.md`` and (with matplotlib) ``fleet.png`` as one set:
    each to a temporary file beside it, and only once all are written are they renamed
    into place (:func:`write_files_atomic`), so a failure or Ctrl-C midway leaves an
    earlier run's files as they were, with no temporary file. Without matplotlib an earlier
    run's ``fleet.png`` is removed once the others are written (it would be another run's).
    The paths written and a note when the plot was not.

    Raises:
        OSError: a file cannot be written; its ``filename`` is that file's path.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    json_name, md_name, png_name = OUTPUT_NAMES
    paths = {"json": out_dir / json_name, "md": out_dir / md_name}
    files: dict[Path, str | bytes] = {
        paths["json"]: json.dumps(payload, indent=1, allow_nan=False) + "\n",
        paths["md"]: markdown(payload),
    }
    plot = plot_png(payload)
    if plot is not None:
        paths["png"] = out_dir / png_name
        files[paths["png"]] = plot
    write_files_atomic(files)
    if plot is not None:
        return paths, None
    stale = out_dir / png_name
    if stale.is_file():
        # An earlier run's plot beside this run's report would be a mix of two runs.
        stale.unlink()
        return paths, f"{PLOTS_HINT}; the earlier run's {png_name} was removed"
    return paths, PLOTS_HINT
