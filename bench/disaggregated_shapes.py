"""Random boards, disaggregated: ``mpc-online`` and the VoltanaLLM-style ``voltana`` rule
on a prefill pool and a decode pool of a board whose every trait is drawn at random,
against the maximum clock on both pools, to find where the per-pool governor does not
generalise (the scoreboard's disaggregated board runs the bundled profiles only).

Per seed, the board is ``random_shape(seed)`` (``plant/synthetic_profiles.py``, as
``bench/random_shapes.py`` draws it); its name states no GPU family or model size, so
``mpc-online`` runs with no hint, as on a node it never saw. The trace cycles over
``--traces`` (seed modulo their count), taken as the disaggregated scoreboard takes it
(``--load``, ``--duration`` seconds from the trace's start), in ``--layout``; a
scenario of fewer than ``MIN_REQUESTS`` requests is reported and not judged (one miss
there is several points). Every row
runs as the board's rows do (``study.scoreboard.disaggregated``): built by the node's
factory, in its safety chain, each pool observing what its node's daemon derives from
its engines' vLLM pages. Reported per controller: whether it holds the SLO (attainment
within 1 point of the maximum clock's) and its saving against the maximum clock.

    .venv/bin/python bench/disaggregated_shapes.py [--seeds 0:12] [--layout 1P1D]
        [--traces mooncake azure-conv] [--load recorded] [--duration 300] [--jobs N]

Writes ``bench/results/disaggregated_shapes.json`` and prints a table; progress with an
ETA on stderr. The Azure and Mooncake traces come from the shared traces (the bundled
slice covers ``--traces azure-conv-10min``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from random_shapes import MIN_REQUESTS, checked_inputs

from gpugov.daemon.progress import Progress
from gpugov.plant import ServingPlant
from gpugov.plant.synthetic_profiles import random_shape, shape_profile
from gpugov.plant.workload import TraceError, TraceWarning
from gpugov.study.runners import RunnerSpec, map_cells
from gpugov.study.scoreboard.disaggregated import disaggregated_scenario_outcome
from gpugov.study.scoreboard.scenarios import (
    DISAGGREGATED_LAYOUTS,
    BenchConfig,
    build_disaggregated_scenario,
)

OUT = Path(__file__).resolve().parent / "results" / "disaggregated_shapes.json"
TRACES = ("mooncake", "azure-conv")
CONTROLLERS = ("max", "mpc-online", "voltana")

Cell = tuple[int, str, str, str, float]


def run_seed(cell: Cell, shared: Any = None) -> dict[str, Any]:
    """Every row on one random board; ``error`` set when the scenario cannot be built.
    ``shared``: the runner's, unused."""
    seed, trace, layout, load, duration_s = cell
    started = time.perf_counter()
    shape = random_shape(seed)
    plant = ServingPlant.from_profile(shape_profile(shape))
    row: dict[str, Any] = {"seed": seed, "trace": trace, "layout": layout, "load": load}
    row["shape"] = asdict(shape)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            scenario = build_disaggregated_scenario(trace, plant, layout, load, duration_s)
    except ValueError as error:
        row["error"] = str(error)
        return row
    row["requests"] = len(scenario.requests)
    if len(scenario.requests) < MIN_REQUESTS:
        row["skipped"] = f"{len(scenario.requests)} requests (fewer than {MIN_REQUESTS})"
        return row
    outcome = disaggregated_scenario_outcome(
        scenario, plant, BenchConfig(), CONTROLLERS, best_fixed=False
    )
    row["controllers"] = {
        run["controller"]: {
            "slo_attainment": run.get("slo_attainment"),
            "holds_slo": bool(run["holds_slo"]),
            "saved_fraction": float(run["energy_saved_fraction"]),
        }
        for run in outcome["rows"]
    }
    row["wall_s"] = time.perf_counter() - started
    return row


def summary(rows: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """Holds and savings of ``key`` over the boards judged."""
    runs = [row["controllers"][key] for row in rows if "controllers" in row]
    saved = [run["saved_fraction"] for run in runs]
    return {
        "boards": len(runs),
        "holds_slo": sum(run["holds_slo"] for run in runs),
        "median_saved_fraction": float(np.median(saved)) if saved else None,
        "min_saved_fraction": float(np.min(saved)) if saved else None,
    }


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per seed: the scenario, then per controller its saving and hold."""
    lines = []
    for row in rows:
        head = f"seed {row['seed']:3d} {row['trace']:11s} {row['layout']}"
        if "controllers" not in row:
            lines.append(f"{head} {row.get('error') or row.get('skipped')}")
            continue
        parts = [f"{head} requests {row['requests']:5d}"]
        for key in CONTROLLERS[1:]:
            run = row["controllers"][key]
            mark = "" if run["holds_slo"] else " MISSES"
            parts.append(f"{key} {100 * run['saved_fraction']:6.1f}%{mark}")
        lines.append("  ".join(parts))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run every seed and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="0:12", help="FIRST:LAST seeds (default 0:12)")
    parser.add_argument("--traces", nargs="+", default=list(TRACES), metavar="TRACE")
    parser.add_argument("--layout", default="1P1D", choices=sorted(DISAGGREGATED_LAYOUTS))
    parser.add_argument("--load", default="recorded", choices=BenchConfig().loads)
    parser.add_argument("--duration", type=float, default=300.0, help="scenario seconds")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    args = parser.parse_args(argv)
    try:
        seeds = checked_inputs(args)
    except (ValueError, TraceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    traces = list(args.traces)
    cells: list[Cell] = [
        (seed, traces[seed % len(traces)], args.layout, args.load, args.duration) for seed in seeds
    ]
    started = time.time()
    bar = Progress(len(cells), "disaggregated shapes", unit="boards")
    finished: dict[int, dict[str, Any]] = {}
    for done in map_cells(run_seed, cells, spec=RunnerSpec(jobs=min(args.jobs, len(cells)))):
        finished[done.index] = done.value
        bar.update(len(finished), f"last seed {done.value['seed']}", force=True)
    bar.close()
    rows = [finished[index] for index in range(len(cells))]
    result = {
        "benchmark": "disaggregated-shapes",
        "seeds": [seeds.start, seeds.stop],
        "traces": traces,
        "layout": args.layout,
        "load": args.load,
        "duration_s": args.duration,
        "wall_s": time.time() - started,
        "rows": rows,
        "summary": {key: summary(rows, key) for key in CONTROLLERS[1:]},
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(table(rows)))
    for key, numbers in result["summary"].items():
        median = numbers["median_saved_fraction"]
        shown = "n/a" if median is None else f"{100 * median:.1f} %"
        print(f"{key}: holds {numbers['holds_slo']}/{numbers['boards']}, median saved {shown}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
