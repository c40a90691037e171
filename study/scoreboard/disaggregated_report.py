"""The disaggregated scoreboard's report: ``disaggregated.md`` (one line per scenario and
controller, the per-pool savings, the hindsight references) and its pair with
``disaggregated.json``, as :mod:`study.scoreboard.report` is the colocated board's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpugov.daemon.files import json_safe, write_files_atomic
from gpugov.study.markdown import markdown_text, scenario_title
from gpugov.study.scoreboard.disaggregated import BEST_FIXED, WINDOW_ORACLE


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _kilojoules(bound: dict[str, Any] | None) -> str:
    """A bound's energy in kJ, or ``-`` when there is none or it did not solve."""
    if not bound or not bound.get("success") or bound.get("energy_j") is None:
        return "-"
    return f"{bound['energy_j'] / 1000.0:.1f}"


def markdown(payload: dict[str, Any]) -> str:
    """The disaggregated table: one line per scenario and controller."""
    lines = [
        "# Disaggregated scenarios",
        "",
        payload["notes"],
        "",
        "| scenario | controller | saved | prefill pool saved | decode pool saved "
        "| SLO attainment | holds SLO | capture | E / LP bound | TTFT p95 (s) | TPOT p95 (ms) "
        "| colocated saved | vs colocated |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pairs: list[str] = []
    references: list[str] = []
    for info in payload["scenarios"]:
        oracle = info.get("window_oracle")
        bound = info.get("lp_bound")
        if oracle is None and bound is None:
            continue
        pools = (bound or {}).get("pools", {})
        references.append(
            f"| {scenario_title(info)} | {info.get('oracle') or '-'} "
            f"| {'-' if oracle is None else oracle['source']} "
            f"| {'-' if oracle is None else oracle['candidate_runs']} "
            f"| {_kilojoules(pools.get('prefill'))} | {_kilojoules(pools.get('decode'))} "
            f"| {_kilojoules(bound)} |"
        )
    for row in payload["rows"]:
        pools = row["pools"]
        colocated = row.get("colocated") or {}
        capture = row.get("oracle_capture")
        over_bound = row.get("energy_over_lp_bound")
        label = row["controller"]
        if label == WINDOW_ORACLE:
            label = "window-oracle (hindsight)"
        if label == BEST_FIXED:
            label = "best-fixed (hindsight)"
            pair = row["best_fixed_pair"]
            pairs.append(
                f"| {scenario_title(row, 'scenario')} "
                f"| {pair['clocks_mhz']['prefill']:g} | {pair['clocks_mhz']['decode']:g} "
                f"| {pair['single_pool_mhz']['prefill']:g} "
                f"| {pair['single_pool_mhz']['decode']:g} | {pair['simulations']} |"
            )
        attainment = row["slo_attainment"]
        tpot = row["tpot_p95_s"]
        ttft = row["ttft_p95_s"]
        lines.append(
            f"| {scenario_title(row, 'scenario')} | {label} "
            f"| {_percent(row['energy_saved_fraction'])} "
            f"| {_percent(pools['prefill']['energy_saved_fraction'])} "
            f"| {_percent(pools['decode']['energy_saved_fraction'])} "
            f"| {'-' if attainment is None else f'{100.0 * attainment:.2f}%'} "
            f"| {'yes' if row['holds_slo'] else 'no'} "
            f"| {'-' if capture is None else f'{capture:.2f}'} "
            f"| {'-' if over_bound is None else f'{over_bound:.2f}'} "
            f"| {'-' if ttft is None else f'{ttft:.3f}'} "
            f"| {'-' if tpot is None else f'{1000.0 * tpot:.1f}'} "
            f"| {_percent(colocated.get('energy_saved_fraction'))} "
            f"| {_percent(row['energy_vs_colocated_fraction'])} |"
        )
    if pairs:
        lines += [
            "",
            "Best fixed clock pair per scenario (MHz): the pair, and each pool's own search "
            "with the other pool at its maximum clock.",
            "",
            "| scenario | prefill | decode | prefill alone | decode alone | simulations |",
            "|---|---|---|---|---|---|",
            *pairs,
        ]
    if references:
        lines += [
            "",
            "Hindsight reference per scenario: the oracle row (the lowest-energy hindsight "
            "row that holds the SLO), the window oracle's kept schedule and forked runs, "
            "and the fluid LP bound per pool and in total (kJ).",
            "",
            "| scenario | oracle | window oracle kept | forked runs | LP bound prefill "
            "| LP bound decode | LP bound |",
            "|---|---|---|---|---|---|---|",
            *references,
        ]
    for item in payload["skipped"]:
        lines.append(
            f"\nSkipped {markdown_text(item['scenario'])}: {markdown_text(item['reason'])}"
        )
    return "\n".join(lines) + "\n"


def write_disaggregated(payload: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write ``disaggregated.json`` and ``disaggregated.md`` into ``out`` as one pair
    (:func:`write_files_atomic`: neither replaced until both are written)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "disaggregated.json", "md": out / "disaggregated.md"}
    write_files_atomic(
        {
            # An LP bound that did not solve is NaN: null here, as scoreboard.json has it.
            paths["json"]: json.dumps(json_safe(payload), indent=2, sort_keys=True, allow_nan=False)
            + "\n",
            paths["md"]: markdown(payload),
        }
    )
    return paths
