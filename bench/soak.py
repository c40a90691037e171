"""Accelerated soak: a day (or more) of daemon ticks with the MPC on virtual time.

What runs is the daemon's own loop (``daemon.loop.run``) over a domain built from a
config by ``daemon.service.domains_from_config``: the fake NVML
(``tests/daemon/fake_pynvml.py``, one H100), the vLLM scrape path (``ScrapedSource`` with
its parser, series cache and value checks; the page text is generated in process, so no
socket is needed), the controller (``--controller``: ``mpc-online``, the node's default
governor, with its learned model saved to a state directory as a node's is, or the
profile-fed fast MPC ``mpc``), the safety wrappers, the actuator with its readback, and
the exporter's collector (published every tick, collected every simulated minute). The
clock is virtual: ticks run back to back.

The engine's load follows a day-long cycle with bursts and two engine restarts (the
counters fall back to zero), so the MPC sees the whole range of queues.

Reported: RSS over simulated time, its least-squares slope after the warm-up (target
< 1 MB per simulated day), open file descriptors and threads at the start and the end,
ticks and wall time; for ``mpc-online``, the saved model's size and the windows it
learned. Writes ``bench/results/soak.json``.

    .venv/bin/python bench/soak.py [--controller mpc-online|mpc] [--hours 24] [--period 1.0]
                                   [--warmup-hours 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "daemon")]

from fake_pynvml import FakeNvml  # noqa: E402

from gpugov.daemon.cli_outputs import check_output_file  # noqa: E402
from gpugov.daemon.cli_support import UsageError  # noqa: E402
from gpugov.daemon.config import parse_config  # noqa: E402
from gpugov.daemon.exporter import Exporter  # noqa: E402
from gpugov.daemon.files import json_safe  # noqa: E402
from gpugov.daemon.limits import MAX_PERIOD_S, MIN_PERIOD_S  # noqa: E402
from gpugov.daemon.loop import LoopSnapshot, TimedLoop, VirtualClock, run  # noqa: E402
from gpugov.daemon.model_store import learned_windows  # noqa: E402
from gpugov.daemon.progress import Progress  # noqa: E402
from gpugov.daemon.service import domains_from_config  # noqa: E402

OUT = ROOT / "bench" / "results" / "soak.json"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """Resident set size of this process, MB (from /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE / 1e6


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    """Threads of this process as the kernel counts them."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return threading.active_count()


class SyntheticVllm:
    """A vLLM ``/metrics`` page whose load follows a daily cycle with bursts.

    Counters grow with the served load and restart from zero twice a day (an engine
    restart), as a real engine's do. With ``gpu`` (the fake's GPU), the latencies follow
    its SM clock (:func:`follow_clock`): prefill as ``1/f``, an inter-token interval as
    ``f^-0.3`` (memory-bound), so a controller's clock has consequences.
    """

    def __init__(self, clock: VirtualClock, seed: int = 0, gpu: Any = None) -> None:
        self.clock = clock
        self.gpu = gpu
        self.rng = random.Random(seed)
        self.prompt = self.generation = self.finished = 0.0
        self.ttft_sum = self.ttft_count = self.itl_sum = self.itl_count = 0.0
        self.last_s = 0.0
        self.restarts = 0

    def __call__(self, url: str, timeout_s: float) -> str:
        now = self.clock()
        hour = now / 3600.0
        if int(hour // 12) > self.restarts:  # an engine restart twice a day
            self.restarts = int(hour // 12)
            self.prompt = self.generation = self.finished = 0.0
            self.ttft_sum = self.ttft_count = self.itl_sum = self.itl_count = 0.0
        rate = 4.0 + 3.5 * math.sin(2 * math.pi * hour / 24.0)  # requests per second
        if self.rng.random() < 0.02:
            rate *= 5.0  # a burst
        dt = max(0.0, now - self.last_s)
        self.last_s = now
        arrived = self.rng.gauss(rate * dt, math.sqrt(max(rate * dt, 1e-9)))
        arrived = max(0.0, arrived)
        running = max(0, round(rate * 6.0))
        # A request's first token leads its finish: the running ones have theirs.
        self.finished = max(self.finished, self.ttft_count + arrived - running)
        self.prompt += arrived * 600.0
        self.generation += arrived * 220.0
        slower = 1.0 if self.gpu is None else TOP_CLOCK_MHZ / max(self.gpu.sm_clock_mhz, 1)
        self.ttft_count += arrived
        self.ttft_sum += arrived * (0.15 + 0.05 * rate / 8.0) * slower
        self.itl_count += arrived * 220.0
        self.itl_sum += arrived * 220.0 * 0.02 * slower**0.3
        waiting = max(0, round(self.rng.gauss(rate * 0.05, 0.5)))
        usage = min(1.0, running / 120.0)
        labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
        return (
            f"vllm:num_requests_running{{{labels}}} {running}\n"
            f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {usage}\n"
            f"vllm:prompt_tokens_total{{{labels}}} {self.prompt}\n"
            f"vllm:generation_tokens_total{{{labels}}} {self.generation}\n"
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {self.finished}\n'
            f"vllm:time_to_first_token_seconds_sum{{{labels}}} {self.ttft_sum}\n"
            f"vllm:time_to_first_token_seconds_count{{{labels}}} {self.ttft_count}\n"
            f"vllm:inter_token_latency_seconds_sum{{{labels}}} {self.itl_sum}\n"
            f"vllm:inter_token_latency_seconds_count{{{labels}}} {self.itl_count}\n"
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="34470"} 1.0\n'
        )


TOP_CLOCK_MHZ = 1980


def follow_clock(gpu: Any, dt_s: float) -> None:
    """Move the fake GPU as a board would under its lock: the SM clock to the lock's top,
    power ``100 + 500 (f / f_max)^2.5`` W, and the energy counter by that power over
    ``dt_s`` (the fake NVML's own values never move)."""
    gpu.sm_clock_mhz = TOP_CLOCK_MHZ if gpu.locked is None else int(gpu.locked[1])
    watts = 100.0 + 500.0 * (gpu.sm_clock_mhz / TOP_CLOCK_MHZ) ** 2.5
    gpu.power_mw = gpu.average_power_mw = int(watts * 1000)
    gpu.energy_mj += int(watts * dt_s * 1000)


def slope_mb_per_day(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(hours, MB)`` points, in MB per day."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return 24.0 * sxy / sxx if sxx > 0 else None


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line naming the flag, what the soak cannot run with, before it runs
    (minutes): a number that is not finite, a period the daemon's config refuses, an
    ``--out`` that cannot be written (it was found after the soak, as a traceback)."""
    for flag in ("hours", "warmup_hours", "period", "sample_minutes"):
        if not math.isfinite(getattr(args, flag)):
            parser.error(f"--{flag.replace('_', '-')} must be a finite number")
    if not (args.hours > args.warmup_hours >= 0 and args.sample_minutes > 0):
        parser.error("need --hours > --warmup-hours >= 0 and a positive --sample-minutes")
    if not MIN_PERIOD_S <= args.period <= MAX_PERIOD_S:
        parser.error(
            f"--period must be from {MIN_PERIOD_S:g} to {MAX_PERIOD_S:g} s (the daemon's "
            f"daemon.period_s bounds), got {args.period:g}"
        )
    if args.out == OUT:  # the default's folder is git-ignored: made when missing
        OUT.parent.mkdir(parents=True, exist_ok=True)
    try:
        check_output_file("--out", args.out)
    except UsageError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> int:
    """Run the soak and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (24)")
    parser.add_argument("--period", type=float, default=1.0, help="control period, s (1.0)")
    parser.add_argument("--warmup-hours", type=float, default=2.0, help="left out of the slope")
    parser.add_argument("--sample-minutes", type=float, default=15.0, help="RSS sample interval")
    parser.add_argument(
        "--controller",
        choices=("mpc-online", "mpc"),
        default="mpc-online",
        help="the domain's controller (mpc-online, the node's default, with its model saved)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    check_flags(parser, args)

    state_dir = tempfile.TemporaryDirectory(prefix="gpugov-soak-")
    controller: dict[str, Any] = (
        {"kind": "mpc", "profile": "h100-sxm-llama3-8b"}
        if args.controller == "mpc"
        else {"kind": "mpc-online"}
    )
    config = parse_config(
        {
            "daemon": {"period_s": args.period, "state_dir": state_dir.name},
            "domains": [
                {
                    "name": "soak",
                    "gpus": [0],
                    "engine": {
                        "kind": "vllm",
                        "url": "http://127.0.0.1:1/metrics",
                        "timeout_s": min(0.5, args.period / 2),
                    },
                    "controller": controller,
                    "ttft_slo_s": 0.5,
                    "tpot_slo_s": 0.05,
                }
            ],
        }
    )
    clock = VirtualClock()
    fake = FakeNvml(1)
    # The fake's own write log is test bookkeeping, not the daemon's: keep it bounded so
    # the slope measures the daemon (unbounded, it grows ~100 B per clock change).
    fake.writes = deque(maxlen=1000)  # type: ignore[assignment]
    assembled = domains_from_config(config, nvml=fake)
    gpu = fake.gpus[0]
    page = SyntheticVllm(clock, gpu=gpu)
    for source in assembled.sources:
        source._fetch = page  # the generated page instead of a socket
    domain = assembled.domains[0]
    domain.observer._clock = clock  # scrape times in virtual seconds
    exporter = Exporter(serve=False)

    total_ticks = int(args.hours * 3600 / args.period)
    sample_every = max(1, int(args.sample_minutes * 60 / args.period))
    collect_every = max(1, int(60 / args.period))
    samples: list[dict[str, float]] = []
    start = {"rss_mb": rss_mb(), "fds": open_fds(), "threads": os_threads()}
    progress = Progress(total_ticks, "soak", unit="ticks", log_interval_s=30.0)
    wall_started = time.perf_counter()

    def before_tick(now_s: float, step: int) -> bool:
        follow_clock(gpu, args.period)
        if step % collect_every == 0 and step:
            exporter.publish([domain.snapshot()], LoopSnapshot(ticks_total=step))
            list(exporter.collector.collect())
        if step % sample_every == 0:
            samples.append(
                {
                    "hours": now_s / 3600.0,
                    "rss_mb": rss_mb(),
                    "fds": open_fds(),
                    "threads": os_threads(),
                    "python_objects": len(gc.get_objects()),
                }
            )
            progress.update(step, f"{now_s / 3600:.1f} h, RSS {samples[-1]['rss_mb']:.1f} MB")
        return step >= total_ticks

    try:
        stats = run(
            [domain],
            TimedLoop(args.period, clock=clock, sleep=clock.sleep),
            before_tick=before_tick,
        )
    finally:
        progress.close()
        assembled.close()
        exporter.close()
    wall_s = time.perf_counter() - wall_started
    saved = sorted(Path(state_dir.name).glob("*.json"))
    saved_bytes = sum(path.stat().st_size for path in saved)
    state_dir.cleanup()
    after = [(s["hours"], s["rss_mb"]) for s in samples if s["hours"] >= args.warmup_hours]
    slope = slope_mb_per_day(after)
    inner = domain.controller
    while getattr(inner, "inner", None) is not None:
        inner = inner.inner
    planner = getattr(inner, "mpc", None) or inner  # mpc-online plans with an MPC of its own
    result: dict[str, Any] = {
        "benchmark": "soak",
        "command": "python bench/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "simulated_hours": args.hours,
        "period_s": args.period,
        "ticks": stats.ticks,
        "decisions": domain.decisions,
        "clock_writes": domain.actuator.writes,
        "engine_errors": domain.observer.engine_errors,
        "fallbacks": domain.fallback_counts(),
        "wall_s": round(wall_s, 1),
        "speed_x_real_time": round(args.hours * 3600 / wall_s, 1),
        "warmup_hours": args.warmup_hours,
        "rss_start_mb": round(start["rss_mb"], 2),
        "rss_after_warmup_mb": round(after[0][1], 2) if after else None,
        "rss_end_mb": round(samples[-1]["rss_mb"], 2),
        "rss_slope_mb_per_day": None if slope is None else round(slope, 3),
        "rss_slope_target_mb_per_day": 1.0,
        "fds_start": start["fds"],
        "fds_end": samples[-1]["fds"],
        "threads_start": start["threads"],
        "threads_end": samples[-1]["threads"],
        "controller": args.controller,
        "saved_models": [path.name for path in saved],
        "saved_model_bytes": saved_bytes,
        "learned_windows": learned_windows(inner) if args.controller == "mpc-online" else None,
        "controller_status": json_safe(inner.status()) if hasattr(inner, "status") else None,
        "last_reason": getattr(inner, "last_reason", None),
        "mpc_plans_kept": len(getattr(planner, "plans_by_step", {})),
        "mpc_solve_times_kept": len(getattr(planner, "solve_times", [])),
        "samples": samples,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(
        f"soak: {args.hours:g} simulated h ({stats.ticks} ticks at {args.period:g} s) in "
        f"{wall_s:.0f} s wall; RSS {result['rss_after_warmup_mb']} -> {result['rss_end_mb']} MB, "
        f"slope {result['rss_slope_mb_per_day']} MB/day after {args.warmup_hours:g} h "
        f"(target < 1); fds {start['fds']} -> {result['fds_end']}, threads "
        f"{start['threads']} -> {result['threads_end']}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
