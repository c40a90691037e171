"""Simulator speed: simulated seconds per wall second replaying the Azure conversation hour.

Runs the full one-hour Azure conversation trace (see docs/traces.md) at
the maximum clock and under the reactive governor, on the default profile, and reports
the real-time ratio of each. Falls back to the bundled 10-minute slice, and says so, when
the shared traces are absent. Writes ``bench/results/simulator.json``.

Usage: ``python bench/simulator.py [--trace NAME|PATH] [--profile NAME] [--repeat N]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from gpugov.controllers.baseline import maximum_clock_controller, reactive_clock_controller
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, load_trace, simulate
from gpugov.plant.workload import TraceError

TARGET_RATIO = 1000.0


def main() -> int:
    """Run the benchmark, print a table and write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="azure-conv")
    parser.add_argument("--profile", default="h100-sxm-llama3-8b")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per controller")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "simulator.json"))
    args = parser.parse_args()

    note = ""
    try:
        workload, report = load_trace(args.trace)
    except TraceError as error:
        note = f"{args.trace} unavailable ({error}); used the bundled 10-minute slice instead"
        workload, report = load_trace("azure-conv-10min")
    plant = ServingPlant.from_profile(load_profile(args.profile))
    rows = []
    for name, controller in (
        ("maximum clock", maximum_clock_controller),
        ("reactive governor", reactive_clock_controller),
    ):
        best = float("inf")
        result = None
        for _ in range(max(1, args.repeat)):
            start = time.perf_counter()
            result = simulate(workload, plant, chunked_prefill_scheduler, controller)
            best = min(best, time.perf_counter() - start)
        assert result is not None
        simulated = result.metrics.simulated_duration_s
        rows.append(
            {
                "controller": name,
                "simulated_s": simulated,
                "wall_s": best,
                "real_time_ratio": simulated / best,
                "meets_target": simulated / best >= TARGET_RATIO,
                "requests": len(workload),
                "energy_j": result.metrics.energy_j,
                "slo_attainment": result.metrics.slo_attainment,
            }
        )
    payload = {
        "benchmark": "simulator",
        "trace": report.path,
        "trace_sha256": report.sha256,
        "profile": args.profile,
        "target_real_time_ratio": TARGET_RATIO,
        "note": note,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    if note:
        print(f"note: {note}")
    header = f"{'controller':<20} {'simulated s':>12} {'wall s':>8} {'ratio':>8}"
    print(f"{header}  target {TARGET_RATIO:g}x")
    for row in rows:
        print(
            f"{row['controller']:<20} {row['simulated_s']:>12.1f} {row['wall_s']:>8.2f} "
            f"{row['real_time_ratio']:>7.0f}x  {'met' if row['meets_target'] else 'MISSED'}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
