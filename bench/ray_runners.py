"""Ray against the local pool: wall time of one scoreboard run each way, the per-cell cost,
and Ray's own overheads, with the scaling they imply on paper.

Measures, in one run on this machine:

* ``pool`` and ``ray``: ``run_scoreboard`` on the same configuration (``--mode quick``: the
  scoreboard's ``--quick``; ``tiny``: the hidden test setup with both loads) over the local
  fork pool with ``--jobs`` processes, then over a local Ray runtime with as many CPUs;
  wall time, per-scenario wall time (the per-cell cost) and their ratio.
* Ray's overheads on a fresh local runtime: ``ray.init`` (start-up), the first round of
  trivial tasks (worker processes start and import gpugov), then the steady per-task cost
  (many no-op tasks through :func:`map_cells`, the scoreboard's own path), and the time to
  put a loaded trace into the object store and fetch it in a task.
* ``scaling``: from those numbers, the wall time and speed-up the scoreboard and a sweep
  would have on W workers: ``T(W) = start-up + first round + max(n * o, LPT(costs, W))``,
  with ``o`` the steady per-task overhead (the driver dispatches serially) and ``LPT`` the
  makespan of the measured cell costs (repeated to ``n`` cells) placed longest first on W
  workers. On paper: it assumes W real cores and no contention.

Writes ``bench/results/ray_runners.json`` (the ignored benchmark output folder) and prints
a summary. Needs Ray (``pip install 'gpugov[ray]'``).

Usage: ``python bench/ray_runners.py [--mode quick|tiny] [--jobs N] [--tasks N]``
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpugov.study.ray_cluster import RayRuntime
from gpugov.study.runners import RunnerSpec, map_cells
from gpugov.study.scoreboard import command
from gpugov.study.scoreboard import run as scoreboard

ROOT = Path(__file__).resolve().parents[1]
WORKERS = (1, 2, 8, 32, 128)


def noop(cell: int, shared: Mapping[str, Any]) -> int:
    """A trivial task: the runner's own cost."""
    return cell


def fetch_trace(cell: int, shared: Mapping[str, Any]) -> int:
    """Read the shared trace (a worker fetches it from the object store once)."""
    return len(shared["trace"])


def makespan(costs: Sequence[float], workers: int) -> float:
    """Longest-processing-time-first makespan of ``costs`` on ``workers`` machines."""
    loads = [0.0] * max(1, workers)
    for cost in sorted(costs, reverse=True):
        heapq.heapreplace(loads, loads[0] + cost)
    return max(loads)


def run_board(config: scoreboard.BenchConfig, runner: RunnerSpec) -> dict[str, Any]:
    """One scoreboard run; its wall time and the per-scenario cost."""
    started = time.perf_counter()
    payload = scoreboard.run_scoreboard(config, runner=runner)
    wall = time.perf_counter() - started
    costs = [s["wall_s"] for s in payload["scenarios"]]
    return {
        "wall_s": wall,
        "scenario_wall_s": costs,
        "scenarios": len(costs),
        # The SLSQP MPC drops solves that overrun a wall-clock budget: not compared.
        "energy_j": {
            f"{r['scenario']}|{r['controller']}": r["energy_j"]
            for r in payload["rows"]
            if r["controller"] != "mpc_slsqp"
        },
    }


def ray_overheads(jobs: int, tasks: int) -> dict[str, Any]:
    """Start-up, first round, steady per-task cost and trace transfer of a local runtime."""
    import ray

    started = time.perf_counter()
    with RayRuntime(RunnerSpec(jobs=jobs, ray_address="local")) as runtime:
        init_s = time.perf_counter() - started
        spec = RunnerSpec(jobs=jobs, ray_address="local")
        first = time.perf_counter()
        list(map_cells(noop, list(range(jobs)), spec=spec))
        first_round_s = time.perf_counter() - first
        steady = time.perf_counter()
        list(map_cells(noop, list(range(tasks)), spec=spec))
        steady_s = time.perf_counter() - steady
        trace, _ = scoreboard._full_trace("azure-conv-10min")
        transfer = time.perf_counter()
        list(map_cells(fetch_trace, list(range(jobs)), spec=spec, shared={"trace": trace}))
        transfer_s = time.perf_counter() - transfer
        cpus = runtime.cpus()
    shutdown_s = time.perf_counter() - started - init_s - first_round_s - steady_s - transfer_s
    return {
        "ray_version": ray.__version__,
        "cpus": cpus,
        "init_s": init_s,
        "first_round_s": first_round_s,
        "steady_tasks": tasks,
        "steady_total_s": steady_s,
        "per_task_s": steady_s / tasks,
        "trace_requests": len(trace),
        "trace_put_and_fetch_round_s": transfer_s,
        "shutdown_s": max(0.0, shutdown_s),
    }


def scaling(costs: Sequence[float], cells: int, overhead: Mapping[str, Any]) -> list[dict]:
    """Wall time and speed-up on W workers (module notes), the costs repeated to ``cells``."""
    repeated = [costs[i % len(costs)] for i in range(cells)]
    serial = sum(repeated)
    fixed = overhead["init_s"] + overhead["first_round_s"]
    out = []
    for workers in WORKERS:
        dispatch = cells * overhead["per_task_s"]
        work = makespan(repeated, workers)
        total = fixed + max(dispatch, work)
        parts = {
            "start-up": fixed,
            "dispatch": dispatch,
            "longest cell" if work <= max(repeated) + 1e-9 else "work": work,
        }
        out.append(
            {
                "workers": workers,
                "wall_s": total,
                "speedup_vs_serial": serial / total,
                "bound": max(parts, key=lambda name: parts[name]),
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print a summary and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mode", choices=["quick", "tiny"], default="quick")
    parser.add_argument("--jobs", type=int, default=2, help="pool processes = Ray CPUs")
    parser.add_argument("--tasks", type=int, default=300, help="no-op tasks for the overhead")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ray_runners.json"))
    args = parser.parse_args(argv)
    config = command.config_for(
        quick=args.mode == "quick",
        tiny=args.mode == "tiny",
        loads=["recorded", "cap70"] if args.mode == "tiny" else None,
        jobs=args.jobs,
    )
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    load_at_start = os.getloadavg()
    say(f"scoreboard ({args.mode}) on the local pool, {args.jobs} processes")
    pool = run_board(config, RunnerSpec(jobs=args.jobs))
    say(f"  {pool['wall_s']:.1f} s; the same on a local Ray runtime with {args.jobs} CPUs")
    on_ray = run_board(config, RunnerSpec(jobs=args.jobs, ray_address="local"))
    say(f"  {on_ray['wall_s']:.1f} s; Ray's overheads on a fresh runtime")
    overhead = ray_overheads(args.jobs, args.tasks)
    costs = pool["scenario_wall_s"]
    from gpugov.daemon.cli_support import simulated_controller
    from gpugov.plant import ServingPlant, load_profile, simulate
    from gpugov.plant.scheduler import chunked_prefill_scheduler

    cell_started = time.perf_counter()
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    workload = scoreboard._full_trace("azure-conv-10min")[0]
    simulate(
        workload,
        plant,
        chunked_prefill_scheduler,
        simulated_controller("reactive", plant, workload),
        0,
    )
    sweep_costs = [time.perf_counter() - cell_started]
    result = {
        "benchmark": "ray_runners",
        "mode": args.mode,
        "jobs": args.jobs,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
        },
        "pool": pool,
        "ray": on_ray,
        "ray_over_pool_speedup": pool["wall_s"] / on_ray["wall_s"],
        "same_energies_but_slsqp": pool["energy_j"] == on_ray["energy_j"],
        "per_cell_cost_s": {
            "scoreboard_scenario_mean": statistics.fmean(costs),
            "scoreboard_scenario_max": max(costs),
            "sweep_cell_azure_10min_reactive": sweep_costs[0],
        },
        "ray_overhead": overhead,
        "scaling": {
            "scoreboard_quick_cells_repeated_to_30": scaling(costs, 30, overhead),
            "sweep_216_cells": scaling(sweep_costs, 216, overhead),
            "sweep_10000_cells": scaling(sweep_costs, 10_000, overhead),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"pool {pool['wall_s']:.1f} s, ray {on_ray['wall_s']:.1f} s: ray/pool speed-up "
        f"{result['ray_over_pool_speedup']:.2f}x "
        f"(same energies but SLSQP: {result['same_energies_but_slsqp']})"
    )
    print(
        f"scenario cost mean {statistics.fmean(costs):.1f} s (max {max(costs):.1f} s); "
        f"sweep cell {sweep_costs[0]:.2f} s"
    )
    print(
        f"ray: init {overhead['init_s']:.1f} s, first round {overhead['first_round_s']:.1f} s, "
        f"{1000 * overhead['per_task_s']:.2f} ms per task, trace round "
        f"{overhead['trace_put_and_fetch_round_s']:.2f} s"
    )
    for name, rows in result["scaling"].items():
        print(
            name
            + ": "
            + ", ".join(
                f"W={r['workers']} {r['wall_s']:.0f} s "
                f"({r['speedup_vs_serial']:.1f}x, {r['bound']})"
                for r in rows
            )
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
