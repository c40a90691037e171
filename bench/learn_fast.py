"""How fast ``mpc-online`` starts saving on a node it never saw.

For each profile (bundled ones and a synthetic one generated here, with a shape unlike
the bundled ones), runs what ``gpugov simulate --controller SPEC --profile P --trace T
--duration 300 --control-period S`` runs, and reports the first requested clock below the
maximum: when (simulated seconds, and busy seconds: the GPU not idle) and which, plus the
energy saved against the maximum clock over the run and the SLO attainment of both.
Specs: ``mpc-online`` (the automatic hints from the GPU and the served model's name)
and ``mpc-online:auto=off`` (no hint), each at every ``--periods`` period.

The synthetic profile: compute-bound decode and prefill over a narrow clock range, a
small board, served under a model name and GPU whose physics say otherwise (an L40S
running a 32B model: memory-bound), so its automatic hint is a wrong one.

    .venv/bin/python bench/learn_fast.py [--duration 300] [--periods 1,0.25]

Writes ``bench/results/learn_fast.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.daemon.cli_outputs import check_output_file
from gpugov.daemon.cli_support import load_trace_for_cli, simulated_controller
from gpugov.daemon.progress import Progress
from gpugov.plant import (
    PerformanceProfile,
    ServingPlant,
    chunked_prefill_scheduler,
    load_profile,
    simulate,
)
from gpugov.plant.profile import ProfileError
from gpugov.plant.result import ServingResult
from gpugov.plant.trace_formats import TraceError
from gpugov.plant.types import Request

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "learn_fast.json"
BUNDLED = ("h100-sxm-llama3-8b", "h200-sxm-llama3-70b-tp4", "h100-sxm-mixtral-8x7b-tp2")


def synthetic_profile() -> PerformanceProfile:
    """Compute-bound (time ~ 1/f for prefill and decode), 600-1500 MHz, a 300 W board."""
    clocks = np.arange(600.0, 1501.0, 15.0)
    x = clocks / clocks[-1]
    return PerformanceProfile(
        clock_mhz=clocks,
        prefill_tokens_per_s=16_000.0 * x,
        decode_tokens_per_s=3_600.0 * x,
        prefill_power_w=70.0 + 210.0 * x**2.2,
        decode_power_w=70.0 + 150.0 * x**2.0,
        idle_power_w=45.0 + 8.0 * x,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        manifest={
            "status": "synthetic",
            "gpu": "NVIDIA L40S",
            "model": "Qwen/Qwen2.5-32B-Instruct",
            "power_limit_w": 300.0,
            "engine": {
                "reference_batch_size": 32,
                "reference_context_tokens": 1024,
                "kv_capacity_tokens": 400_000,
            },
            "decode_latency_model": {
                "weight_fraction": 0.2,
                "batch_fraction": 0.7,
                "kv_fraction": 0.1,
            },
        },
        name="synthetic-compute-bound",
    )


def first_below_top(result: ServingResult) -> dict[str, float] | None:
    """The first requested clock below the run's maximum: its time, the busy seconds
    before it and the clock; None when the clock never left the maximum."""
    requested = np.asarray(result.requested_clock_mhz, dtype=float)
    top = float(np.max(requested))
    below = np.flatnonzero(requested < top - 1e-6)
    if not below.size:
        return None
    index = int(below[0])
    times = np.asarray(result.time_s, dtype=float)
    steps = np.diff(times, prepend=times[0])
    busy = np.cumsum(np.where(np.array([p != "idle" for p in result.phase]), steps, 0.0))
    return {
        "time_s": float(times[index]),
        "busy_s": float(busy[index]),
        "clock_mhz": float(requested[index]),
    }


SPECS = ("mpc-online", "mpc-online:auto=off")


def run(
    profile: PerformanceProfile,
    workload: Sequence[Request],
    periods: list[float],
    step: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every spec at every period on ``profile``, against the maximum clock; ``step`` is
    called after each run (the maximum clock's too) with what it ran."""
    plant = ServingPlant.from_profile(profile)
    top = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller, 0)
    if step is not None:
        step(f"last {profile.name} max")
    rows = []
    for period in periods:
        for spec in SPECS:
            controller = simulated_controller(spec, plant, workload, period)
            result = simulate(
                workload, plant, chunked_prefill_scheduler, controller, 0, control_period_s=period
            )
            algorithm = controller.unwrapped
            prior = getattr(algorithm, "active_prior", None)
            rows.append(
                {
                    "profile": profile.name,
                    "spec": spec,
                    "period_s": period,
                    "first_below_top": first_below_top(result),
                    "energy_saved_fraction": 1.0 - result.metrics.energy_j / top.metrics.energy_j,
                    "slo_attainment": result.metrics.slo_attainment,
                    "max_clock_slo_attainment": top.metrics.slo_attainment,
                    "prior": None if prior is None else prior.source,
                }
            )
            first = rows[-1]["first_below_top"]
            print(
                f"{profile.name:<26} {spec:<20} {period:>5g} s  first below the top "
                + (
                    f"after {first['busy_s']:5.1f} busy s ({first['clock_mhz']:.0f} MHz)"
                    if first
                    else "never                     "
                )
                + f"  saved {100 * rows[-1]['energy_saved_fraction']:5.1f}%  SLO "
                f"{100 * (result.metrics.slo_attainment or 0):6.2f}% (max clock "
                f"{100 * (top.metrics.slo_attainment or 0):6.2f}%)",
                flush=True,
            )
            if step is not None:
                step(f"last {profile.name} {spec} {period:g} s")
    return rows


def _periods(text: str) -> list[float]:
    """``--periods`` as seconds (comma-separated, each finite and positive).

    Raises:
        ValueError: one line naming the flag.
    """
    try:
        periods = [float(part) for part in text.split(",")]
    except ValueError:
        periods = []
    if not periods or not all(math.isfinite(p) and p > 0.0 for p in periods):
        raise ValueError(
            f"--periods must be positive seconds, comma-separated (such as 1,0.25), got {text!r}"
        )
    return periods


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and write its JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", default="azure-conv-10min")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals")
    parser.add_argument("--periods", default="1,0.25", help="control periods, comma-separated")
    parser.add_argument("--profiles", default=",".join(BUNDLED), help="bundled profiles")
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    args = parser.parse_args(argv)
    out = Path(args.out)
    # Every input is checked before the first run: one line naming it, exit 2.
    try:
        periods = _periods(args.periods)
        if not (math.isfinite(args.duration) and args.duration > 0.0):
            raise ValueError(f"--duration must be positive seconds, got {args.duration!r}")
        if out == OUT:  # the default's folder is git-ignored: made when missing
            OUT.parent.mkdir(parents=True, exist_ok=True)
        check_output_file("--out", out)
        profiles = [load_profile(name) for name in args.profiles.split(",") if name]
        workload, _ = load_trace_for_cli(args.trace, duration_s=args.duration)
    except (ValueError, ProfileError, TraceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    profiles.append(synthetic_profile())
    runs = len(profiles) * (1 + len(periods) * len(SPECS))
    bar = Progress(runs, "learn fast", unit="runs")
    done = 0

    def step(detail: str) -> None:
        nonlocal done
        done += 1
        bar.update(done, detail, force=True)

    rows: list[dict[str, Any]] = []
    for profile in profiles:
        rows += run(profile, workload, periods, step)
    bar.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "learn-fast",
                "trace": args.trace,
                "duration_s": args.duration,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
