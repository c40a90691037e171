"""Daemon overhead: wall time per tick without the controller, and CPU at a 100 ms period.

Setup: the fake NVML (``tests/daemon/fake_pynvml.py``, so NVML itself costs ~nothing:
on a real GPU add the measured NVML call latencies) with one domain of ``--gpus`` GPUs,
and a vLLM-format ``/metrics`` page of realistic size (two data-parallel engines, full
histogram buckets) served over HTTP on 127.0.0.1 by a separate process, so its CPU is
not counted. The controller is a fixed clock (negligible); its time is subtracted anyway.

Targets: under 1 ms per tick, under 2 % of one core at a 100 ms period.

    .venv/bin/python bench/daemon.py [--ticks 2000] [--cpu-seconds 10] [--gpus 1]

Writes ``bench/results/daemon.json`` and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "daemon")]

from fake_pynvml import FakeNvml  # noqa: E402

from gpugov.daemon.config import parse_config  # noqa: E402
from gpugov.daemon.exporter import Exporter  # noqa: E402
from gpugov.daemon.exposition import parse_page  # noqa: E402
from gpugov.daemon.loop import TimedLoop, VirtualClock, run  # noqa: E402
from gpugov.daemon.service import domains_from_config  # noqa: E402

SERVER = r"""
import http.server, sys
page = open(sys.argv[1], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""

HISTOGRAMS = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_inference_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "iteration_tokens_total",
    "request_max_num_generation_tokens",
    "request_params_n",
    "request_params_max_tokens",
    "request_time_per_output_token_seconds",
)


def realistic_vllm_page(engines: int = 2, buckets: int = 25) -> str:
    """A vLLM V1 page of production size: gauges, counters and full histograms."""
    model = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    lines = []
    for name, kind, value in (
        ("num_requests_running", "gauge", 12),
        ("num_requests_waiting", "gauge", 3),
        ("kv_cache_usage_perc", "gauge", 0.4),
        ("prompt_tokens_total", "counter", 60000),
        ("generation_tokens_total", "counter", 30000),
        ("num_preemptions_total", "counter", 2),
        ("prefix_cache_queries_total", "counter", 60000),
        ("prefix_cache_hits_total", "counter", 20000),
    ):
        lines += [f"# HELP vllm:{name} {name}", f"# TYPE vllm:{name} {kind}"]
        lines += [f'vllm:{name}{{engine="{e}",{model}}} {value}' for e in range(engines)]
    lines += ["# HELP vllm:request_success_total ok", "# TYPE vllm:request_success_total counter"]
    for e in range(engines):
        for reason in ("stop", "length", "abort"):
            lines.append(
                f'vllm:request_success_total{{engine="{e}",finished_reason="{reason}",{model}}} 40'
            )
    for name in HISTOGRAMS:
        lines += [f"# HELP vllm:{name} {name}", f"# TYPE vllm:{name} histogram"]
        for e in range(engines):
            for b in range(buckets):
                le = 0.001 * 2**b
                lines.append(f'vllm:{name}_bucket{{engine="{e}",le="{le}",{model}}} {b * 3}')
            lines.append(f'vllm:{name}_bucket{{engine="{e}",le="+Inf",{model}}} 100')
            lines.append(f'vllm:{name}_count{{engine="{e}",{model}}} 100')
            lines.append(f'vllm:{name}_sum{{engine="{e}",{model}}} 31.4')
    return "\n".join(lines) + "\n"


def _build(url: str, gpus: int, real: bool = False) -> tuple[object, FakeNvml | None]:
    """One domain; with ``real`` the real NVML in a dry run (reads only, never a write)."""
    fake = None if real else FakeNvml(gpus)
    config = parse_config(
        {
            "daemon": {"period_s": 0.1},
            "domains": [
                {
                    "name": "bench",
                    "gpus": list(range(gpus)),
                    "engine": {"kind": "vllm", "url": url, "timeout_s": 0.05},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                    "safety": {"dwell_s": 0.0},
                }
            ],
        }
    )
    return domains_from_config(config, dry_run=real, nvml=fake), fake


def bench_tick(url: str, ticks: int, gpus: int, real: bool = False) -> dict[str, float]:
    """Wall time per tick on virtual time (no sleeping), controller time subtracted."""
    assembled, _ = _build(url, gpus, real)
    domain = assembled.domains[0]  # type: ignore[attr-defined]
    exporter = Exporter(serve=False)
    clock = VirtualClock()
    cpu0 = time.process_time()
    stats = run(
        [domain],
        TimedLoop(0.1, clock=clock, sleep=clock.sleep),
        exporter=exporter,
        before_tick=lambda now, step: step >= ticks,
        keep_tick_times=True,
    )
    cpu_per_tick = (time.process_time() - cpu0) / max(stats.ticks, 1)
    assembled.close()  # type: ignore[attr-defined]
    solve_mean = domain.solve.sum_s / max(domain.solve.count, 1)
    times = sorted(t - solve_mean for t in stats.tick_seconds[10:])  # skip warm-up
    # The scrape is timed inside the observer; the rest is NVML + derivation + actuation.
    return {
        "ticks": len(times),
        "mean_ms": 1e3 * statistics.fmean(times),
        "p50_ms": 1e3 * times[len(times) // 2],
        "p99_ms": 1e3 * times[int(len(times) * 0.99)],
        "cpu_ms_per_tick": 1e3 * (cpu_per_tick - solve_mean),
        "controller_mean_ms": 1e3 * solve_mean,
    }


def bench_parts(url: str, gpus: int, repeats: int = 500, real: bool = False) -> dict[str, float]:
    """Mean time of the two observation halves: GPU sampling and the engine scrape."""
    assembled, _ = _build(url, gpus, real)
    observer = assembled.domains[0].observer  # type: ignore[attr-defined]
    started = time.perf_counter()
    for _ in range(repeats):
        for backend in observer.gpus.backends:
            backend.sample()
    gpu_ms = 1e3 * (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        observer.source.scrape()
    scrape_ms = 1e3 * (time.perf_counter() - started) / repeats
    text = observer.source._fetch(url, 1.0)
    wanted = observer.source.spec.wanted()
    cache: dict = {}  # type: ignore[type-arg]
    parse_page(text, wanted, url, cache)  # the daemon keeps one per source
    started = time.perf_counter()
    for _ in range(repeats):
        parse_page(text, wanted, url, cache)
    parse_ms = 1e3 * (time.perf_counter() - started) / repeats
    assembled.close()  # type: ignore[attr-defined]
    return {
        "gpu_sample_ms": gpu_ms,
        "engine_scrape_ms": scrape_ms,
        "of_which_parse_ms": parse_ms,
        "of_which_http_round_trip_ms": scrape_ms - parse_ms,
    }


def bench_cpu(url: str, seconds: float, gpus: int, real: bool = False) -> dict[str, float]:
    """Process CPU time over wall time with the real clock at a 100 ms period."""
    assembled, _ = _build(url, gpus, real)
    exporter = Exporter("127.0.0.1", 0)  # the HTTP server thread counts too
    loop = TimedLoop(0.1)
    wall0, cpu0 = time.monotonic(), time.process_time()
    stats = run(
        assembled.domains,  # type: ignore[attr-defined]
        loop,
        exporter=exporter,
        before_tick=lambda now, step: now >= seconds,
    )
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    exporter.close()
    assembled.close()  # type: ignore[attr-defined]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_percent_of_one_core": 100.0 * cpu / wall,
        "ticks": stats.ticks,
        "overruns": stats.overruns,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--cpu-seconds", type=float, default=10.0)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument(
        "--nvml",
        choices=["fake", "real"],
        default="fake",
        help="real: the machine's NVML, in a dry run (reads only; no clock is ever written)",
    )
    parser.add_argument("--out", default=None, help="default bench/results/daemon[_real_nvml].json")
    args = parser.parse_args()
    real = args.nvml == "real"
    suffix = "_real_nvml" if real else ""
    args.out = args.out or str(ROOT / "bench" / "results" / f"daemon{suffix}.json")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    page_path = out.parent / f"daemon_bench_page{suffix}.txt"
    page = realistic_vllm_page()
    page_path.write_text(page)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(page_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/metrics"
        tick = bench_tick(url, args.ticks, args.gpus, real)
        parts = bench_parts(url, args.gpus, real=real)
        cpu = bench_cpu(url, args.cpu_seconds, args.gpus, real)
    finally:
        server.terminate()
        server.wait(timeout=10)
        page_path.unlink(missing_ok=True)

    result = {
        "benchmark": "daemon loop overhead",
        "setup": {
            "gpus_in_domain": args.gpus,
            "nvml": "real NVML, dry run (reads only)"
            if real
            else "fake (tests/daemon/fake_pynvml.py); add real NVML call latency on a GPU",
            "engine_page_lines": page.count("\n"),
            "engine_page_bytes": len(page.encode()),
            "engine_server": "separate process (http.server), 127.0.0.1, HTTP/1.1 keep-alive",
            "python": platform.python_version(),
            "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(),
        },
        "tick_excluding_controller": tick,
        "tick_parts": parts,
        "cpu_at_100ms_period": cpu,
        "targets": {"tick_ms": 1.0, "cpu_percent_of_one_core": 2.0},
        "meets_targets": {
            "tick_p50_wall": tick["p50_ms"] < 1.0,
            "tick_cpu": tick["cpu_ms_per_tick"] < 1.0,
            "cpu": cpu["cpu_percent_of_one_core"] < 2.0,
        },
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"daemon overhead ({args.gpus} GPU(s), fake NVML, {result['setup']['engine_page_lines']}"
        "-line vLLM page over local HTTP)"
    )
    print(
        f"  tick excl. controller   mean {tick['mean_ms']:.3f} ms   p50 {tick['p50_ms']:.3f} ms"
        f"   p99 {tick['p99_ms']:.3f} ms   (target < 1 ms)"
    )
    print(f"  daemon CPU per tick     {tick['cpu_ms_per_tick']:.3f} ms (excl. controller)")
    print(f"    GPU sampling          {parts['gpu_sample_ms']:.3f} ms")
    print(
        f"    engine scrape         {parts['engine_scrape_ms']:.3f} ms"
        f" = HTTP round trip {parts['of_which_http_round_trip_ms']:.3f} ms"
        f" + parse {parts['of_which_parse_ms']:.3f} ms"
    )
    print(
        f"  CPU at 100 ms period    {cpu['cpu_percent_of_one_core']:.2f} % of one core"
        f" over {cpu['wall_s']:.1f} s, {cpu['ticks']} ticks, {cpu['overruns']} overruns"
        " (target < 2 %)"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
