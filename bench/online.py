"""Cost of the online MPC's identification: wall time of the per-tick model update.

Runs ``mpc-online`` on the simulated plant (bundled Azure conversation slice on the H100
profile, the scoreboard's 0.5 s period), collecting every window the controller folded
in; then replays those windows through a fresh :class:`OnlineModel` ``--repeat`` times,
timing each update with ``perf_counter`` and the thread's CPU time (the identification
alone, no MPC solve; on a shared machine the CPU time is the fair figure), and
reports the update time percentiles, the learned-profile build time, the whole decision
time (identification + profile + MPC solve) and the model's memory before and after.

Target: per-tick update <= 0.2 ms; memory constant whatever the run length.

    .venv/bin/python bench/online.py [--duration 600] [--repeat 20]

Writes ``bench/results/online.json`` and prints a short table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.identification import OnlineModel
from gpugov.controllers.online.window import Window, window_between
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.types import ServingObservation
from gpugov.study.scoreboard.controllers import scoreboard_online
from gpugov.study.scoreboard.run import build_scenario

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "online.json"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals")
    parser.add_argument("--repeat", type=int, default=20, help="replays of the windows")
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    parser.add_argument(
        "--nonstationary",
        action="store_true",
        help="also run the prompt-mix and model-swap scenarios (a few minutes)",
    )
    args = parser.parse_args(argv)

    profile = load_profile("h100-sxm-llama3-8b")
    plant = ServingPlant.from_profile(profile)
    scenario = build_scenario("azure-conv-10min", plant, "recorded", args.duration)
    controller = scoreboard_online(plant, scenario.requests, control_period_s=0.5)
    observations: list[ServingObservation] = []
    decisions: list[float] = []

    def recording(observation: ServingObservation) -> float:
        observations.append(observation)
        start = time.perf_counter()
        value = controller(observation)
        decisions.append(time.perf_counter() - start)
        return value

    print(
        f"running mpc-online on {scenario.key} ({len(scenario.requests)} requests)", file=sys.stderr
    )
    simulate(
        scenario.requests, plant, chunked_prefill_scheduler, recording, 0, control_period_s=0.5
    )
    windows: list[Window] = []
    for previous, current in itertools.pairwise(observations):
        window = window_between(previous, current)
        if window is not None:
            windows.append(window)
    clocks = observations[0].supported_clocks_mhz
    model = OnlineModel(clocks, observations[0].power_limit_w or 700.0, period_s=0.5)
    before = model.nbytes()
    times = []
    cpu_times = []
    for _ in range(args.repeat):
        for window in windows:
            start, start_cpu = time.perf_counter(), time.thread_time()
            model.update(window)
            cpu_times.append(time.thread_time() - start_cpu)
            times.append(time.perf_counter() - start)
    after = model.nbytes()
    slos = (profile.ttft_slo_s, profile.tpot_slo_s)
    algorithm = controller.unwrapped
    assert isinstance(algorithm, OnlineMPCController)
    builds = []
    for _ in range(200):
        start = time.perf_counter()
        algorithm.learned_profile(slos)
        builds.append(time.perf_counter() - start)
    update = np.asarray(times)
    cpu = np.asarray(cpu_times)
    decision = np.asarray(decisions)
    result = {
        "benchmark": "online-identification",
        "scenario": scenario.key,
        "windows": len(windows),
        "updates_timed": int(update.size),
        "update_p50_ms": float(np.percentile(update, 50) * 1e3),
        "update_p99_ms": float(np.percentile(update, 99) * 1e3),
        "update_mean_ms": float(update.mean() * 1e3),
        "update_cpu_p50_ms": float(np.percentile(cpu, 50) * 1e3),
        "update_cpu_p99_ms": float(np.percentile(cpu, 99) * 1e3),
        "update_cpu_mean_ms": float(cpu.mean() * 1e3),
        "load_average_1min": float(os.getloadavg()[0]),
        "update_target_ms": 0.2,
        "update_mean_over_target": float(update.mean() * 1e3 / 0.2),
        "profile_build_p50_ms": float(np.percentile(builds, 50) * 1e3),
        "decision_p50_ms": float(np.percentile(decision, 50) * 1e3),
        "decision_p99_ms": float(np.percentile(decision, 99) * 1e3),
        "model_bytes_before": before,
        "model_bytes_after": after,
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
    }
    if args.nonstationary:
        from gpugov.study.online_eval import nonstationary_runs

        print("running the non-stationary scenarios", file=sys.stderr)
        result["nonstationary"] = nonstationary_runs()
        for row in result["nonstationary"]:
            print(
                f"{row['case']:<11} segment {row['segment']} {row['controller']:<10} "
                f"SLO {100 * row['slo_attainment']:6.2f}% (max "
                f"{100 * (row['max_clock_slo_attainment'] or 0):6.2f}%) holds "
                f"{'yes' if row['holds_slo'] else 'NO ':<3} saved "
                f"{100 * row['energy_saved_fraction']:5.1f}%"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"identification update: p50 {result['update_p50_ms']:.3f} ms, p99 "
        f"{result['update_p99_ms']:.3f} ms, mean {result['update_mean_ms']:.3f} ms "
        f"(target 0.2 ms) over {update.size} updates; thread CPU time p50 "
        f"{result['update_cpu_p50_ms']:.3f} ms, p99 {result['update_cpu_p99_ms']:.3f} ms, "
        f"mean {result['update_cpu_mean_ms']:.3f} ms (load average "
        f"{result['load_average_1min']:.1f})"
    )
    print(
        f"learned-profile build p50 {result['profile_build_p50_ms']:.3f} ms; whole decision "
        f"p50 {result['decision_p50_ms']:.2f} ms, p99 {result['decision_p99_ms']:.2f} ms"
    )
    print(f"model memory {before} B before, {after} B after; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
