"""Profiler accuracy and run time: ``gpugov profile`` (default settings) against
``gpugov emulate`` on profiles of different shapes, each emulator in its own process.

For each profile: the wall time of the default sweep (8 clocks, 2 s dwell) and, per
measured clock, the relative error of the five profile columns against the emulated
truth (:mod:`gpugov.study.profiler.accuracy`). Writes ``bench/results/profile_accuracy.json``
(``--out``) and prints a table. Takes about two minutes per profile.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from gpugov.cli import main as gpugov_main
from gpugov.plant import load_profile
from gpugov.study.profiler.accuracy import compare


def memory_bound_files(directory: Path) -> Path:
    """Write a profile unlike the bundled ones (600-1500 MHz, saturating prefill, flat
    KV-dominated decode, high idle, realised clocks below the top requests); its manifest."""
    clocks = np.arange(600.0, 1501.0, 30.0)
    x = clocks / clocks[-1]
    columns = {
        "clock_mhz": clocks,
        "prefill_tokens_per_s": 30_000.0 * (1.0 - np.exp(-2.5 * x)),
        "decode_tokens_per_s": 2_500.0 * (0.97 + 0.03 * x),
        "prefill_power_w": 260.0 + 300.0 * x**1.5,
        "decode_power_w": 330.0 + 40.0 * x,
        "idle_power_w": 180.0 + 10.0 * x,
    }
    csv = directory / "memory-bound.csv"
    lines = [",".join(columns)]
    for row in zip(*columns.values(), strict=True):
        lines.append(",".join(f"{v:.6g}" for v in row))
    csv.write_text("\n".join(lines) + "\n")
    manifest = {
        "status": "synthetic", "csv": csv.name, "ttft_slo_s": 2.0, "tpot_slo_s": 0.08,
        "power_limit_w": 1000.0,
        "thermal": {"ambient_temperature_c": 30.0, "thermal_resistance_c_per_w": 0.05,
                    "thermal_time_constant_s": 30.0, "thermal_limit_c": 95.0},
        "engine": {"reference_batch_size": 32, "reference_context_tokens": 2048,
                   "max_batch_size": 128, "kv_capacity_tokens": 300_000},
        "decode_latency_model": {"weight_fraction": 0.25, "batch_fraction": 0.05,
                                 "kv_fraction": 0.70},
        "decode_power_batch_model": {"k": 0.8, "x0": 2.5},
        "clock_profile_selection": {"realized_clock_median_mhz_by_requested": {
            "1500.0": 1470.0, "1470.0": 1455.0}},
    }
    path = directory / "memory-bound.json"
    path.write_text(json.dumps(manifest, indent=2))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_one(truth_path: str, work: Path) -> dict:
    """Emulate ``truth_path``, profile it with the defaults, compare."""
    truth = load_profile(truth_path)
    engine = truth.manifest.get("engine", {})
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    emulator = subprocess.Popen(
        [sys.executable, "-m", "gpugov", "emulate", "--profile", truth_path,
         "--address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        out = work / truth.name
        started = time.monotonic()
        code = gpugov_main([
            "profile", "--engine-url", url, "--gpus", "0", "--backend", "emulated",
            "--out", str(out), "--name", "measured", "--quiet",
            "--reference-batch", str(engine.get("reference_batch_size", 64)),
            "--reference-context", str(engine.get("reference_context_tokens", 1024)),
        ])
        wall = time.monotonic() - started
    finally:
        emulator.send_signal(signal.SIGTERM)
        emulator.wait(timeout=20)
    if code != 0:
        return {"profile": truth.name, "exit_code": code, "wall_s": wall}
    measured = load_profile(out / "measured.json")
    report = compare(measured, truth)
    return {
        "profile": truth.name,
        "exit_code": code,
        "wall_s": wall,
        "thermal_fit_r_squared": measured.manifest["thermal_fit_r_squared"],
        **report,
    }


def main() -> int:
    """Run every profile and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/profile_accuracy.json")
    parser.add_argument("--profiles", default="h100-sxm-llama3-8b,memory-bound")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.profiles.split(","):
            path = str(memory_bound_files(work)) if name == "memory-bound" else name
            result = run_one(path, work)
            results.append(result)
            print(f"{result['profile']}: exit {result['exit_code']}, {result['wall_s']:.0f} s")
            for row in result.get("rows", []):
                errors = " ".join(f"{k.split('_')[0][:4]}-{k.split('_')[1][:3]} "
                                  f"{v * 100:+.2f}%" for k, v in row["errors"].items())
                print(f"  {row['clock_mhz']:5d} MHz  median {row['median_abs_error'] * 100:.2f}%"
                      f"  worst {row['worst_abs_error'] * 100:.2f}%  ({errors})")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
