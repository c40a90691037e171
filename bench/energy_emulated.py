"""The energy attribution end to end: ``gpugov emulate`` + ``gpugov run`` + ``gpugov load
--governor-metrics``, faster than real time.

For each profile x trace: start the emulator at ``--speed X`` on free loopback ports, the
daemon on it (``deploy/emulated.toml``'s settings, the ``max`` controller unless told
otherwise), and replay the trace window with ``--load-scale X`` (the trace's arrival rate
in plant time), then read the comparison ``load`` wrote under ``energy`` in its JSON. The
daemon's windows are one wall second, X plant seconds; the emulator reports utilisation as
NVML does, the busy share of its last plant second.

    nice -n 15 .venv/bin/python bench/energy_emulated.py [--speed 10] [--duration 600]
        [--profiles h100-sxm-llama3-8b,...] [--traces azure-conv,azure-code]

At ``--speed 1`` each daemon window is one plant second, as on a node; run one such
bench at a time (on two cores, two side by side moved one run's phase split by 15-20
points). Faster speeds are quick, but each window's utilisation reading covers only its
last plant second, and the phase split is then far coarser than a node's.

Writes ``bench/results/energy_emulated.json``.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "energy_emulated.json"
GPUGOV = str(Path(sys.executable).with_name("gpugov"))

CONFIG = """
[daemon]
period_s = 1.0
metrics_address = "127.0.0.1:{metrics}"
backend = "emulated"
emulator = "http://127.0.0.1:{emulator}"
log_level = "warning"

[[domains]]
name = "emulated"
gpus = [0]
failsafe = "max"

[domains.engine]
kind = "vllm"
url = "http://127.0.0.1:{emulator}/metrics"
timeout_s = 0.5

[domains.controller]
kind = "{controller}"
"""


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, deadline_s: float = 30.0) -> None:
    """Until ``url`` answers HTTP 200."""
    import urllib.request

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {deadline_s:g} s")


def one_run(
    profile: str, trace: str, speed: float, duration: float, controller: str, work: Path
) -> dict[str, Any]:
    """Emulator, daemon and load for one profile and trace; load's energy comparison."""
    emulator, metrics = free_port(), free_port()
    config = work / f"{profile}-{trace}.toml"
    config.write_text(CONFIG.format(emulator=emulator, metrics=metrics, controller=controller))
    processes = []
    try:
        processes.append(
            subprocess.Popen(
                [
                    GPUGOV,
                    "emulate",
                    "--profile",
                    profile,
                    "--speed",
                    str(speed),
                    "--address",
                    f"127.0.0.1:{emulator}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_for(f"http://127.0.0.1:{emulator}/health")
        processes.append(
            subprocess.Popen(
                [GPUGOV, "run", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_for(f"http://127.0.0.1:{metrics}/metrics")
        time.sleep(3.0)  # a few windows before the load starts
        out = work / f"{profile}-{trace}.json"
        done = subprocess.run(
            [
                GPUGOV,
                "load",
                "--trace",
                trace,
                "--url",
                f"http://127.0.0.1:{emulator}",
                "--duration",
                str(duration),
                "--load-scale",
                str(speed),
                "--quiet",
                "--governor-metrics",
                f"http://127.0.0.1:{metrics}/metrics",
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"load failed ({done.returncode}): {done.stderr[-500:]}")
        summary = json.loads(out.read_text())
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
    energy = summary["energy"]
    energy.update(
        {
            "profile": profile,
            "trace": trace,
            "speed": speed,
            "controller": controller,
            "requests_completed": summary["requests_completed"],
        }
    )
    return energy


def main(argv: list[str] | None = None) -> int:
    """Run every profile x trace and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--speed", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=600.0, help="trace seconds")
    parser.add_argument("--profiles", default="h100-sxm-llama3-8b")
    parser.add_argument("--traces", default="azure-conv,azure-code")
    parser.add_argument("--controller", default="max")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for trace in args.traces.split(","):
            for profile in args.profiles.split(","):
                result = one_run(
                    profile, trace, args.speed, args.duration, args.controller, Path(work)
                )
                runs.append(result)
                token, phases, per = (
                    result["joules_per_output_token"],
                    result["phases"],
                    result["per_request"],
                )

                def pct(value: float | None) -> str:
                    return "n/a" if value is None else f"{100 * value:+.1f}%"

                print(
                    f"{trace:<11} {profile:<26} J/tok {pct(token['error'])}; prefill "
                    f"{pct(phases['prefill']['error'])}, decode {pct(phases['decode']['error'])}"
                    f", idle {pct(phases['idle']['error'])}; request median "
                    f"{pct(per['median_error'])} p90 {pct(per['p90_error'])} "
                    f"({per['compared']})",
                    flush=True,
                )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv[1:], "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
