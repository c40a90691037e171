"""Random boards: ``mpc-online`` (and ``mpc`` fed the true profile) against the maximum
clock on profiles whose every trait is drawn at random, to find where the governor does
not generalise.

The generated shapes of ``plant/synthetic_profiles.py`` break one trait of the bundled
boards at a time; ``random_shape(seed)`` draws all of them at once from wide ranges (clock
range and step, TP degree, how rates and powers follow the clock, idle and static power,
tight or loose SLOs), so combinations no one chose turn up: a board whose static power
is high and whose decode slows in proportion to the clock, say, where a lower clock costs
more energy than it saves. Per seed:

* the trace cycles over ``--traces`` (seed modulo their count) and the load is drawn in
  ``[0.4, 0.85]`` of the maximum clock's SLO capacity (seeded), sized as
  ``bench/unseen_node.py`` sizes its light scenario, over ``--duration`` seconds;
* the runs, each built by the node's factory in its safety chain: the maximum clock,
  ``mpc-online`` every 0.25 s, and with ``--mpc`` the profile-fed ``mpc`` every 0.5 s,
  both told the SLO target the condition judges (99 % over the run);
* whether each holds the SLO (attainment within 1 point of the maximum clock's), its
  saving against the maximum clock, and a flag where it uses more energy than the
  maximum clock (``costs_more``);
* with ``--best-fixed``, the best fixed clock in hindsight (the scoreboard's search,
  against the maximum clock's run) and each controller's ``capture``: its saving over the
  best fixed clock's, where that clock saves at least ``MIN_REFERENCE_SAVING`` (the
  unseen-node benchmark's whole-run measure, on every random board).

A scenario with fewer than ``MIN_REQUESTS`` requests is reported and not judged (one miss
there is several points).

    .venv/bin/python bench/random_shapes.py [--seeds 0:36] [--duration 300] [--mpc]
        [--best-fixed] [--jobs N]

Writes ``bench/results/random_shapes.json`` and prints a table; progress with an ETA on
stderr. The Azure code and Mooncake traces come from the shared traces (the bundled slice
covers ``--traces azure-conv-10min``).
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
from unseen_node import _run, light_scenario

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.oracles import SLO_TOLERANCE, best_fixed_clock, holds_slo
from gpugov.daemon.cli_support import add_engine_view_argument
from gpugov.daemon.controller_config import (
    ControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OnlineMPCControllerConfig,
)
from gpugov.daemon.progress import Progress
from gpugov.plant import ServingPlant
from gpugov.plant.synthetic_profiles import random_shape, shape_profile
from gpugov.plant.workload import TraceError, TraceWarning, load_trace
from gpugov.study.runners import RunnerSpec, map_cells

OUT = Path(__file__).resolve().parent / "results" / "random_shapes.json"
TRACES = ("azure-conv", "azure-code", "mooncake")
MIN_REQUESTS = 20
LOAD_RANGE = (0.4, 0.85)
ONLINE_PERIOD_S = 0.25
MPC_PERIOD_S = 0.5
MIN_REFERENCE_SAVING = 0.01
"""A capture is reported only where the best fixed clock saves at least this share."""


def _start(trace: str) -> float:
    """The source window's start: the Azure traces' second half hour (not the
    scoreboard's windows), the others from their start."""
    return 1800.0 if trace.startswith("azure") and trace != "azure-conv-10min" else 0.0


Cell = tuple[int, str, float, bool, str, bool]


def run_seed(cell: Cell, shared: Any = None) -> dict[str, Any]:
    """Every run on one random board; a row (``error`` or ``skipped`` set when the
    scenario cannot be built or is too small to judge). ``shared``: the runner's, unused."""
    seed, trace, duration_s, with_mpc, view, with_best = cell
    started = time.perf_counter()
    shape = random_shape(seed)
    profile = shape_profile(shape)
    plant = ServingPlant.from_profile(profile)
    load = float(np.random.default_rng(1000 + seed).uniform(*LOAD_RANGE))
    row: dict[str, Any] = {"seed": seed, "trace": trace, "load": load, "shape": asdict(shape)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        full, _ = load_trace(trace)
    try:
        scenario = light_scenario(full, plant, _start(trace), duration_s, load)
    except ValueError as error:
        row["error"] = str(error)
        return row
    requests = scenario.pop("requests")
    row["scenario"] = {**scenario, "requests": len(requests)}
    if len(requests) < MIN_REQUESTS:
        row["skipped"] = f"{len(requests)} requests (fewer than {MIN_REQUESTS})"
        return row
    target = SLOTarget(attainment=1.0 - SLO_TOLERANCE, window_s=duration_s)
    specs: list[tuple[ControllerConfig, float, SLOTarget | None]] = [
        (MaxControllerConfig(kind="max"), 1.0, None),
        (OnlineMPCControllerConfig(kind="mpc-online"), ONLINE_PERIOD_S, target),
    ]
    if with_mpc:
        specs.append((MPCControllerConfig(kind="mpc"), MPC_PERIOD_S, target))
    results = {
        spec.kind: _run(plant, requests, spec, period, goal, view) for spec, period, goal in specs
    }
    if with_best:
        best = best_fixed_clock(
            requests, plant, reference=results["max"], seed=0, control_period_s=1.0
        )
        results["best-fixed"] = best.result
        row["best_fixed_clock_mhz"] = best.clock_mhz
    top = results["max"].metrics
    controllers: dict[str, dict[str, Any]] = {}
    for key, result in results.items():
        metrics = result.metrics
        controllers[key] = {
            "slo_attainment": metrics.slo_attainment,
            "holds_slo": holds_slo(metrics.slo_attainment, top.slo_attainment),
            "energy_j": metrics.energy_j,
            "saved_fraction": 1.0 - metrics.energy_j / top.energy_j,
            "costs_more": bool(metrics.energy_j > top.energy_j),
            "mean_clock_mhz": float(np.mean(result.realized_clock_mhz)),
        }
    if with_best:
        reference = controllers["best-fixed"]["saved_fraction"]
        for key, run in controllers.items():
            if key not in ("max", "best-fixed"):
                usable = run["holds_slo"] and reference >= MIN_REFERENCE_SAVING
                run["capture"] = run["saved_fraction"] / reference if usable else None
    row["controllers"] = controllers
    row["wall_s"] = time.perf_counter() - started
    return row


def _judged(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if "controllers" in row]


def summary(rows: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """Holds, savings and boards where ``key`` costs more than the maximum clock."""
    judged = [row for row in _judged(rows) if key in row["controllers"]]
    runs = [row["controllers"][key] for row in judged]
    saved = [run["saved_fraction"] for run in runs]
    captures = [run["capture"] for run in runs if run.get("capture") is not None]
    return {
        "boards": len(judged),
        "holds_slo": sum(run["holds_slo"] for run in runs),
        "median_saved_fraction": float(np.median(saved)) if saved else None,
        "min_saved_fraction": float(np.min(saved)) if saved else None,
        "capture_boards": len(captures),
        "median_capture": float(np.median(captures)) if captures else None,
        "min_capture": float(np.min(captures)) if captures else None,
        "costs_more": [row["seed"] for row in judged if row["controllers"][key]["costs_more"]],
        "misses": [row["seed"] for row in judged if not row["controllers"][key]["holds_slo"]],
    }


def table(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    """One line per seed: scenario, then per controller its saving and hold."""
    lines = []
    for row in rows:
        head = f"seed {row['seed']:3d} {row['trace']:11s}"
        if "controllers" not in row:
            lines.append(f"{head} {row.get('error') or row.get('skipped')}")
            continue
        scenario = row["scenario"]
        parts = [f"{head} util {scenario['utilization']:.2f} requests {scenario['requests']:5d}"]
        for key in keys:
            run = row["controllers"].get(key)
            if run is not None:
                mark = "" if run["holds_slo"] else " MISSES"
                capture = run.get("capture")
                mark += "" if capture is None else f" ({capture:.2f})"
                parts.append(f"{key} {100 * run['saved_fraction']:6.1f}%{mark}")
        lines.append("  ".join(parts))
    return lines


MAX_SEEDS = 10_000
"""Most boards one run draws (a run of 10,000 takes days on a small machine)."""


def _seeds(text: str) -> range:
    """``FIRST:LAST`` (LAST excluded) or one seed, as a range."""
    message = (
        f"--seeds must be FIRST:LAST with 0 <= FIRST < LAST and at most {MAX_SEEDS} seeds, "
        f"got {text[:40]!r}"
    )
    first, _, last = text.partition(":")
    try:
        start = int(first)
        stop = int(last) if last else start + 1
    except ValueError:
        raise ValueError(message) from None
    if stop <= start or start < 0 or stop - start > MAX_SEEDS:
        raise ValueError(message)
    return range(start, stop)


def checked_inputs(args: argparse.Namespace) -> range:
    """The seeds of ``args`` once ``--seeds``, ``--duration``, ``--jobs`` and every trace
    of ``--traces`` are checked, before any board runs.

    Raises:
        ValueError: a bad flag.
        TraceError: a trace that does not load.
    """
    seeds = _seeds(args.seeds)
    if not args.duration > 0.0:
        raise ValueError(f"--duration must be positive, got {args.duration!r}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        for trace in args.traces:
            load_trace(trace)
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    """Run every seed and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="0:36", help="FIRST:LAST seeds (default 0:36)")
    parser.add_argument("--traces", nargs="+", default=list(TRACES), metavar="TRACE")
    parser.add_argument("--duration", type=float, default=300.0, help="scenario seconds")
    parser.add_argument("--mpc", action="store_true", help="also run mpc fed the true profile")
    parser.add_argument(
        "--best-fixed",
        action="store_true",
        help="also search the best fixed clock in hindsight and report each capture",
    )
    add_engine_view_argument(parser)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    args = parser.parse_args(argv)
    try:
        seeds = checked_inputs(args)
    except (ValueError, TraceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    traces = list(args.traces)
    best = bool(args.best_fixed)
    cells: list[Cell] = [
        (seed, traces[seed % len(traces)], args.duration, args.mpc, args.engine_view, best)
        for seed in seeds
    ]
    started = time.time()
    bar = Progress(len(cells), "random shapes", unit="boards")
    finished: dict[int, dict[str, Any]] = {}
    # The project's runner (the scoreboard's): boards in completion order, so the
    # progress never waits on a slow one; one job runs them here, in this process.
    for done in map_cells(run_seed, cells, spec=RunnerSpec(jobs=min(args.jobs, len(cells)))):
        finished[done.index] = done.value
        bar.update(len(finished), f"last seed {done.value['seed']}", force=True)
    bar.close()
    rows = [finished[index] for index in range(len(cells))]
    keys = ["mpc-online", "mpc"] if args.mpc else ["mpc-online"]
    if best:
        keys.append("best-fixed")
    result = {
        "benchmark": "random-shapes",
        "engine_view": args.engine_view,
        "seeds": [seeds.start, seeds.stop],
        "traces": traces,
        "duration_s": args.duration,
        "load_range": list(LOAD_RANGE),
        "slo_tolerance": SLO_TOLERANCE,
        "wall_s": time.time() - started,
        "rows": rows,
        "summary": {key: summary(rows, key) for key in keys},
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(table(rows, keys)))
    for key in keys:
        s = result["summary"][key]
        median = s["median_saved_fraction"]
        capture = s["median_capture"]
        of_best = (
            ""
            if capture is None
            else f"; median capture of the best fixed clock's saving {capture:.2f} "
            f"(lowest {s['min_capture']:.2f}, {s['capture_boards']} boards)"
        )
        print(
            f"{key}: holds the SLO on {s['holds_slo']}/{s['boards']} boards "
            f"(misses: seeds {s['misses'] or 'none'}); median saved "
            f"{'-' if median is None else f'{100 * median:.1f}%'}; costs more than the "
            f"maximum clock on seeds {s['costs_more'] or 'none'}{of_best}"
        )
    print(f"wrote {out} in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
