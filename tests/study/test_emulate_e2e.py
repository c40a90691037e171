"""End to end over real HTTP, in real time: ``gpugov emulate`` + ``gpugov run`` (backend
``emulated``) + ``gpugov load``, three processes on loopback for about 20 s.

Checks that the daemon moves the emulated GPU's clock, serves its metrics (the per-request
energy histogram among them), and resets the GPU on SIGTERM (read back from the emulator,
as NVML would show it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

GPUGOV = [sys.executable, "-m", "gpugov"]
APPLICATIONS_CLOCKS_SETTING = 0x2
DEADLINE_S = 60.0
"""Deadline for each wait (a process's start: imports, and a first numba compile on a
cold cache; the clock to move; a window to close): every wait ends once its condition
holds, so a long one costs nothing on a fast machine."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def _wait_for(url: str, process: subprocess.Popen[str]) -> None:
    """Poll ``url`` until it answers; fail if ``process`` exits or past the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered (exit code {process.poll()})")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_daemon_governs_the_emulated_node(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    emulator_port, metrics_port = _free_port(), _free_port()
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    emulator = subprocess.Popen(
        [
            *GPUGOV,
            "emulate",
            "--profile",
            "h100-sxm-llama3-8b",
            "--address",
            f"127.0.0.1:{emulator_port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    daemon = load = None
    try:
        _wait_for(f"{emulator_url}/v1/models", emulator)
        config = tmp_path / "emulated.toml"
        template = (Path(__file__).resolve().parents[2] / "deploy" / "emulated.toml").read_text()
        text = template.replace("127.0.0.1:8000", f"127.0.0.1:{emulator_port}")
        text = text.replace("127.0.0.1:9400", f"127.0.0.1:{metrics_port}")
        text = re.sub(r'kind = "mpc"\nprofile = "[^"]+"', 'kind = "reactive"', text)
        config.write_text(text)
        daemon = subprocess.Popen(
            [*GPUGOV, "run", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        exporter_url = f"http://127.0.0.1:{metrics_port}/metrics"
        _wait_for(exporter_url, daemon)
        load = subprocess.Popen(
            [
                *GPUGOV,
                "load",
                "--trace",
                "azure-conv-10min",
                "--url",
                emulator_url,
                "--duration",
                "15",  # the trace's first 15 s: 82 requests
                "--quiet",
                "--json",
                str(tmp_path / "load.json"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        clocks: set[float] = set()
        locked_seen = False
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and not (locked_seen and len(clocks) >= 2):
            sample = json.loads(_get(f"{emulator_url}/gpu/0/sample"))
            clocks.add(sample["sm_clock_mhz"])
            locked_seen |= bool(sample["clock_event_reasons"] & APPLICATIONS_CLOCKS_SETTING)
            time.sleep(0.5)
        page = _get(exporter_url)
        load_out, _ = load.communicate(timeout=150)
        assert load.returncode == 0, load_out
        summary = json.loads((tmp_path / "load.json").read_text())
        assert summary["requests_completed"] > 50
        # The daemon locked the emulated GPU and moved its clock.
        assert locked_seen
        assert len(clocks) >= 2, clocks
        # Its exporter serves the GPU and the decisions.
        assert re.search(r'gpugov_gpu_power_watts\{[^}]*gpu="0"[^}]*\} [1-9]', page)
        assert re.search(r"gpugov_decisions_total\{[^}]*\} [1-9]", page)
        assert re.search(r"gpugov_gpu_sm_clock_hertz\{[^}]*\} [1-9]", page)
        # With the emulator's per-request token histograms, the finished requests are in
        # the per-request energy histogram (once a window after the load has closed).
        deadline = time.monotonic() + DEADLINE_S
        while True:
            after = _get(exporter_url)
            count = re.search(r"gpugov_energy_request_joules_count\{[^}]*\} (\S+)", after)
            if (count is not None and float(count.group(1)) > 0) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert count is not None and float(count.group(1)) > 0, after
        # SIGTERM resets the GPU: the lock is gone and the clock is back at its max.
        daemon.send_signal(signal.SIGTERM)
        daemon_out, _ = daemon.communicate(timeout=DEADLINE_S)
        assert daemon.returncode == 0, daemon_out
        assert "clocks reset" in daemon_out
        time.sleep(0.2)
        sample = json.loads(_get(f"{emulator_url}/gpu/0/sample"))
        assert not sample["clock_event_reasons"] & APPLICATIONS_CLOCKS_SETTING
        assert sample["sm_clock_mhz"] == 1980
    finally:
        for process in (load, daemon, emulator):
            if process is not None:
                _stop(process)
