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

from gpugov.cli import main as gpugov_main
from gpugov.plant import load_profile
from gpugov.study.profiler.accuracy import compare, memory_bound_profile, write_profile_files


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
        [
            sys.executable,
            "-m",
            "gpugov",
            "emulate",
            "--profile",
            truth_path,
            "--address",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
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
        code = gpugov_main(
            [
                "profile",
                "--engine-url",
                url,
                "--gpus",
                "0",
                "--backend",
                "emulated",
                "--out",
                str(out),
                "--name",
                "measured",
                "--quiet",
                "--reference-batch",
                str(engine.get("reference_batch_size", 64)),
                "--reference-context",
                str(engine.get("reference_context_tokens", 1024)),
            ]
        )
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
            if name == "memory-bound":
                path = str(write_profile_files(memory_bound_profile(), work))
            else:
                path = name
            result = run_one(path, work)
            results.append(result)
            print(f"{result['profile']}: exit {result['exit_code']}, {result['wall_s']:.0f} s")
            for row in result.get("rows", []):
                errors = " ".join(
                    f"{k.split('_')[0][:4]}-{k.split('_')[1][:3]} {v * 100:+.2f}%"
                    for k, v in row["errors"].items()
                )
                print(
                    f"  {row['clock_mhz']:5d} MHz  median {row['median_abs_error'] * 100:.2f}%"
                    f"  worst {row['worst_abs_error'] * 100:.2f}%  ({errors})"
                )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
