"""How well a node counts TTFT misses: the daemon's estimate from the engine's histograms
against the plant's exact count, on the scoreboard's scenarios.

A node cannot see a request's TTFT beside its prompt: it estimates the requests within
their per-prompt TTFT SLO from vLLM's TTFT histogram and prompt counter
(``daemon/attainment.py``), and its SLO budget spends and gives back by that estimate.
This benchmark runs the maximum clock and ``mpc-online`` on what a vLLM node's daemon
sees (``--engine-view vllm``), colocated and in the disaggregated layouts (1P1D, 2P2D: the
prefill pool's count), and per run compares the misses the controller's last observation
counts (``ttft_count_total - ttft_within_slo_total``) with the requests whose TTFT passed
their own SLO.

    .venv/bin/python bench/attainment_accuracy.py [--traces mooncake azure-conv]
        [--layouts colocated 1P1D 2P2D]

Writes ``bench/results/attainment_accuracy.json`` and prints a table and the totals (a few
minutes on 2 cores with ``--jobs 2``, progress with an ETA on stderr).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gpugov.daemon.progress import Progress
from gpugov.daemon.simulated import observation_view
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import ClockController, RequestRecord, ServingObservation
from gpugov.study.scoreboard.disaggregated import (
    layout_plant,
    pool_workloads,
    row_controller,
    row_spec,
    simulate_pools,
)
from gpugov.study.scoreboard.scenarios import (
    BenchConfig,
    build_disaggregated_scenario,
    build_scenario,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "attainment_accuracy.json"
CONTROLLERS = ("max", "mpc-online")


class LastObservation:
    """A controller that remembers the last observation it was given (the node's view)."""

    def __init__(self, inner: ClockController) -> None:
        self.inner = inner
        self.last: ServingObservation | None = None

    def __call__(self, observation: ServingObservation) -> float:
        self.last = observation
        return self.inner(observation)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def counted_misses(self) -> float | None:
        """The TTFT misses the last observation counts (None without counters)."""
        o = self.last
        if o is None or o.ttft_within_slo_total is None or o.ttft_count_total is None:
            return None
        return float(o.ttft_count_total - o.ttft_within_slo_total)


def true_misses(records: tuple[RequestRecord, ...], profile: PerformanceProfile) -> int:
    """Requests whose first token came after their own TTFT SLO."""
    return sum(
        1
        for r in records
        if r.first_token_time_s is not None
        and r.first_token_time_s - r.arrival_time_s > profile.ttft_slo_for(r.prompt_tokens)
    )


def run_cell(trace: str, profile_name: str, load: str, layout: str, key: str) -> dict[str, Any]:
    """One run: the node's count of TTFT misses and the true count."""
    config = BenchConfig(loads=(load,))
    profile = load_profile(profile_name)
    plant = ServingPlant.from_profile(profile)
    _, period = row_spec(key, config)
    row: dict[str, Any] = {
        "trace": trace,
        "profile": profile_name,
        "load": load,
        "layout": layout,
        "controller": key,
    }
    if layout == "colocated":
        scenario = build_scenario(trace, plant, load, config.duration_s)
        chain = LastObservation(row_controller(key, plant, scenario.requests, config))
        result = simulate(
            scenario.requests,
            plant,
            chunked_prefill_scheduler,
            chain,
            config.seed,
            controller_name=key,
            control_period_s=period,
            view=observation_view(config.engine_view),
        )
        counted = chain.counted_misses()
        records = result.request_records
    else:
        disaggregated = build_disaggregated_scenario(trace, plant, layout, load, config.duration_s)
        outcome, chains = simulate_pools(
            disaggregated,
            layout_plant(disaggregated, plant),
            pool_workloads(disaggregated.requests),
            key,
            config,
            wrap=LastObservation,
        )
        prefill = chains["prefill"]  # TTFT is the prefill pool's
        assert isinstance(prefill, LastObservation)
        counted = prefill.counted_misses()
        records = outcome.request_records
    row["requests"] = len(records)
    row["true_misses"] = true_misses(records, profile)
    row["counted_misses"] = counted
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=["mooncake", "azure-conv"])
    parser.add_argument(
        "--profiles", nargs="+", default=["h100-sxm-llama3-8b", "h200-sxm-llama3-8b"]
    )
    parser.add_argument("--loads", nargs="+", default=["recorded", "cap70"])
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=["colocated", "1P1D", "2P2D"],
        choices=["colocated", "1P1D", "2P2D"],
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    args = parser.parse_args(argv)
    cells = list(
        itertools.product(args.traces, args.profiles, args.loads, args.layouts, CONTROLLERS)
    )
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with (
        Progress(len(cells), "attainment accuracy", unit="runs") as progress,
        ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool,
    ):
        futures = [pool.submit(run_cell, *cell) for cell in cells]
        for done, future in enumerate(futures, start=1):
            rows.append(future.result())
            progress.update(done, "last " + "|".join(cells[done - 1]))
    print(f"{'scenario':58} {'controller':10} {'requests':>8} {'true':>5} {'counted':>8}")
    for row in rows:
        name = "|".join(str(row[k]) for k in ("trace", "profile", "load", "layout"))
        counted = row["counted_misses"]
        shown = "-" if counted is None else f"{counted:.2f}"
        print(
            f"{name:58} {row['controller']:10} {row['requests']:8d} "
            f"{row['true_misses']:5d} {shown:>8}"
        )
    judged = [r for r in rows if r["counted_misses"] is not None]
    true_total = sum(r["true_misses"] for r in judged)
    counted_total = sum(r["counted_misses"] for r in judged)
    error = sum(abs(r["counted_misses"] - r["true_misses"]) for r in judged)
    print(
        f"{len(judged)} runs with counters: {true_total} true misses, "
        f"{counted_total:.2f} counted, absolute error {error:.2f}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "attainment-accuracy",
        "rows": rows,
        "runs_with_counters": len(judged),
        "true_misses": true_total,
        "counted_misses": counted_total,
        "absolute_error": error,
        "wall_s": time.perf_counter() - started,
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
