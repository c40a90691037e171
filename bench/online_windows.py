"""Held-out windows: ``mpc-online`` (and any scoreboard controller) against the maximum
clock on windows of a trace that the scoreboard does not use.

The scoreboard runs one fixed window per trace; a change to a controller that helps there
can hurt elsewhere. This benchmark moves the window's start over the trace (``--starts``)
and, for every start, profile and load, runs the maximum clock and the chosen controllers
on the same workload. Per controller it reports:

* whether it holds the SLO (attainment within the scoreboard's tolerance of the maximum
  clock's) and how many more requests than the maximum clock miss their SLO;
* how many more requests come within 10% of their TTFT SLO (TTFT > 0.9 x its SLO): a
  smoother measure of the tail risk than the misses, which are few;
* the energy saved against the maximum clock, over the whole run and after the warm-up.

``--best-fixed`` adds a hindsight row, ``best-fixed``: the best fixed clock in hindsight
(:func:`~gpugov.controllers.oracles.best_fixed_clock`, the scoreboard's oracle), the
lowest-energy clock whose run holds the SLO against the same maximum-clock run.
``--oracle`` adds it and the scoreboard's window oracle, ``window-oracle``: a clock per
5 s window in hindsight, continuing at the best fixed clock
(:func:`~gpugov.study.scoreboard.run.scoreboard_window_oracle`; several times the cost of
the rest). They are references for what the windows allow, not governors a node can run.

The scoreboard's scenario builder makes each window (capacity search, loads), so a
window here is what the scoreboard would run had it started there.

    .venv/bin/python bench/online_windows.py [--trace mooncake] [--starts 0 600 1200 2400 3000]

Writes ``bench/results/online_windows.json`` and prints a table (a few minutes per 10
cells on 2 cores, progress with an ETA on stderr).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpugov.controllers.oracles.common import SLO_TOLERANCE, holds_slo
from gpugov.controllers.oracles.fixed import best_fixed_clock
from gpugov.daemon.cli_support import add_engine_view_argument, add_safety_arguments
from gpugov.daemon.progress import Progress
from gpugov.daemon.safety import SafetySettings
from gpugov.daemon.simulated import observation_view
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.result import ServingResult
from gpugov.study.online_eval import energy_after
from gpugov.study.scoreboard.controllers import build_scoreboard_controllers
from gpugov.study.scoreboard.run import scenario_warmup_s, scoreboard_window_oracle
from gpugov.study.scoreboard.scenarios import FULL, WHOLE_TRACE, build_scenario

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "online_windows.json"
PROFILES = (
    "h100-sxm-llama3-8b",
    "h200-sxm-llama3-8b",
    "a100-sxm-80gb-llama3-8b",
    "h100-sxm-mixtral-8x7b-tp2",
)
NEAR_FRACTION = 0.9
"""A request whose TTFT passes this fraction of its TTFT SLO counts as a near miss."""
BEST_FIXED = "best-fixed"
"""The key of the best fixed clock in hindsight (``--best-fixed``)."""
WINDOW_ORACLE = "window-oracle"
"""The key of the window oracle in hindsight (``--oracle``)."""
HINDSIGHT = ("max", BEST_FIXED, WINDOW_ORACLE)
"""The rows no controller key names."""


def _tail(result: ServingResult, plant: ServingPlant) -> tuple[int, int]:
    """(requests whose TTFT passed NEAR_FRACTION of their SLO, requests that missed the
    SLO) of one run."""
    profile = plant.profile
    near = 0
    for record in result.request_records:
        ttft = record.ttft_s
        if ttft is None or ttft > NEAR_FRACTION * profile.ttft_slo_for(record.prompt_tokens):
            near += 1
    attainment = result.metrics.slo_attainment or 0.0
    missed = int(round((1.0 - attainment) * len(result.request_records)))
    return near, missed


def run_cell(
    cell: tuple[str, float, str, str, float, tuple[str, ...], str, SafetySettings],
) -> dict[str, Any]:
    """Run the maximum clock and ``keys`` on one window; a dict row (``error`` set when
    the window cannot be built)."""
    trace, start, profile_name, load, duration, keys, engine_view, safety = cell
    row: dict[str, Any] = {"trace": trace, "start_s": start, "profile": profile_name, "load": load}
    plant = ServingPlant.from_profile(load_profile(profile_name))
    try:
        scenario = build_scenario(trace, plant, load, duration, start_s=start)
    except Exception as error:  # a window too small to hold requests at this capacity
        row["error"] = str(error)
        return row
    row["requests"] = len(scenario.requests)
    row["load_label"] = scenario.load_label
    warmup = scenario_warmup_s(scenario)
    runs: dict[str, dict[str, Any]] = {}
    results: dict[str, ServingResult] = {}
    for entry in build_scoreboard_controllers(
        plant,
        scenario.requests,
        control_period_s=FULL.control_period_s,
        fast_mpc_period_s=FULL.fast_mpc_period_s,
        online_period_s=FULL.online_period_s,
        safety=safety,
        slo_target=FULL.slo_target,
    ):
        if entry.key not in ("max", *keys):
            continue
        result = simulate(
            scenario.requests,
            plant,
            chunked_prefill_scheduler,
            entry.build(),
            0,
            controller_name=entry.key,
            control_period_s=entry.control_period_s or 1.0,
            view=observation_view(engine_view),
        )
        results[entry.key] = result
    best_clock_mhz = oracle_source = None
    if BEST_FIXED in keys:
        best = best_fixed_clock(
            scenario.requests,
            plant,
            reference=results["max"],
            control_period_s=FULL.control_period_s,
        )
        results[BEST_FIXED], best_clock_mhz = best.result, best.clock_mhz
        if WINDOW_ORACLE in keys:
            oracle = scoreboard_window_oracle(scenario.requests, plant, results["max"], best, FULL)
            results[WINDOW_ORACLE], oracle_source = oracle.result, oracle.source
    for key, result in results.items():
        near, missed = _tail(result, plant)
        runs[key] = {
            "slo_attainment": result.metrics.slo_attainment,
            "energy_j": result.metrics.energy_j,
            "energy_after_warmup_j": energy_after(result, warmup),
            "ttft_near_misses": near,
            "missed_requests": missed,
        }
    if best_clock_mhz is not None:
        runs[BEST_FIXED]["clock_mhz"] = best_clock_mhz
    if oracle_source is not None:
        runs[WINDOW_ORACLE]["oracle_source"] = oracle_source
    top = runs["max"]
    for run in runs.values():
        run["holds_slo"] = holds_slo(run["slo_attainment"], top["slo_attainment"])
        run["extra_missed_requests"] = run["missed_requests"] - top["missed_requests"]
        run["extra_ttft_near_misses"] = run["ttft_near_misses"] - top["ttft_near_misses"]
        run["energy_saved_fraction"] = 1.0 - run["energy_j"] / top["energy_j"]
        after = top["energy_after_warmup_j"]
        run["energy_saved_after_warmup_fraction"] = (
            1.0 - run["energy_after_warmup_j"] / after if after > 0.0 else None
        )
    row["controllers"] = runs
    return row


def summarise(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per controller over the windows that ran."""
    ran = [row for row in rows if "controllers" in row]
    summary = []
    for key in ("max", *keys):
        mine = [row["controllers"][key] for row in ran if key in row["controllers"]]
        if not mine:
            continue
        after = [
            r["energy_saved_after_warmup_fraction"]
            for r in mine
            if r["energy_saved_after_warmup_fraction"] is not None
        ]
        summary.append(
            {
                "controller": key,
                "windows": len(mine),
                "holds_slo": sum(bool(r["holds_slo"]) for r in mine),
                "extra_missed_requests": sum(r["extra_missed_requests"] for r in mine),
                "extra_ttft_near_misses": sum(r["extra_ttft_near_misses"] for r in mine),
                "mean_energy_saved_fraction": statistics.fmean(
                    r["energy_saved_fraction"] for r in mine
                ),
                "mean_energy_saved_after_warmup_fraction": (
                    statistics.fmean(after) if after else None
                ),
            }
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    """Run the windows and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", default="mooncake", help="trace name (default mooncake)")
    parser.add_argument(
        "--starts",
        type=float,
        nargs="+",
        default=[0.0, 600.0, 1200.0, 2400.0, 3000.0],
        help="window starts, seconds into the trace",
    )
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--loads", nargs="+", default=["recorded", "cap70"])
    parser.add_argument(
        "--controllers",
        nargs="+",
        default=["mpc-online"],
        help="scoreboard controller keys run beside the maximum clock",
    )
    parser.add_argument(
        "--best-fixed",
        action="store_true",
        help="add the best fixed clock in hindsight as a reference row (about a dozen "
        "fixed-clock runs per window)",
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="add the best fixed clock and the window oracle in hindsight as reference "
        "rows (the oracle costs several times the rest of a window)",
    )
    parser.add_argument(
        "--duration", type=float, default=600.0, help="seconds of arrivals per window"
    )
    add_engine_view_argument(parser)
    add_safety_arguments(parser, prefix="every controller runs in the node's safety chain: ")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    args = parser.parse_args(argv)
    if args.trace in WHOLE_TRACE:
        print(
            f"error: --trace {args.trace} is used whole by the scoreboard; it has no "
            "windows to move",
            file=sys.stderr,
        )
        return 2
    keys = tuple(key for key in args.controllers if key not in HINDSIGHT)
    if args.best_fixed or args.oracle:
        keys += (BEST_FIXED,)
    if args.oracle:
        keys += (WINDOW_ORACLE,)
    safety = replace(
        FULL,
        dwell_s=FULL.dwell_s if args.dwell is None else args.dwell,
        floor_mhz=args.floor,
    ).safety
    cells = [
        (args.trace, start, profile, load, args.duration, keys, args.engine_view, safety)
        for start, profile, load in itertools.product(args.starts, args.profiles, args.loads)
    ]
    started = time.time()
    rows: list[dict[str, Any]] = []
    bar = Progress(len(cells), "online windows", unit="windows")
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(run_cell, cells):
            rows.append(row)
            bar.update(len(rows), f"last {row['profile']} {row['load']} @ {row['start_s']:g} s")
    bar.close()
    summary = summarise(rows, keys)
    result = {
        "benchmark": "online-windows",
        "trace": args.trace,
        "starts_s": args.starts,
        "duration_s": args.duration,
        "engine_view": args.engine_view,
        "dwell_s": safety.dwell_s,
        "floor_mhz": safety.floor_mhz,
        "slo_tolerance": SLO_TOLERANCE,
        "near_fraction": NEAR_FRACTION,
        "wall_s": time.time() - started,
        "rows": rows,
        "summary": summary,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        if "error" in row:
            print(
                f"{row['start_s']:6g} {row['profile']:<28} {row['load']:<8} skipped: {row['error']}"
            )
            continue
        line = (
            f"{row['start_s']:6g} {row['profile']:<28} {row['load_label']:<11} "
            f"n={row['requests']:<4}"
        )
        for key in keys:
            run = row["controllers"][key]
            after = run["energy_saved_after_warmup_fraction"]
            line += (
                f" | {key} {'holds' if run['holds_slo'] else 'MISS '} "
                f"+{run['extra_missed_requests']} missed "
                f"+{run['extra_ttft_near_misses']} near, saved "
                f"{100 * run['energy_saved_fraction']:5.1f}% (after warm-up "
                f"{'-' if after is None else f'{100 * after:5.1f}%'})"
            )
        print(line)
    for entry in summary:
        after = entry["mean_energy_saved_after_warmup_fraction"]
        print(
            f"{entry['controller']:<11} holds {entry['holds_slo']}/{entry['windows']}, "
            f"{entry['extra_missed_requests']:+d} missed and "
            f"{entry['extra_ttft_near_misses']:+d} near misses against the maximum clock; "
            f"mean saved {100 * entry['mean_energy_saved_fraction']:.1f}% "
            f"(after warm-up {'-' if after is None else f'{100 * after:.1f}%'})"
        )
    print(f"wrote {out} in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
