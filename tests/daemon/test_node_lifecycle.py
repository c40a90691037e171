"""The node's lifecycle end to end, over real HTTP on loopback: ``gpugov emulate`` (with a
served model name), ``gpugov run`` (backend ``emulated``) and ``gpugov load``.

- ``mpc-online`` learns under load; SIGTERM saves the model; a restart restores it (still
  warmed up, nothing set aside); an engine serving another model makes it learn anew.
- SIGTERM, a second signal during the stop, and SIGKILL followed by the next start's
  reconcile each leave the emulated GPU unlocked (read back from the emulator, as NVML
  would show it).

Periods are short (0.2 s) and every wait has a deadline; correctness never depends on
how fast the machine is.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

GPUGOV = [sys.executable, "-m", "gpugov"]
APPLICATIONS_CLOCKS_SETTING = 0x2
"""NVML's clock-event reason for a lock holding the clock below the top one."""
PERIOD_S = 0.2
FIXED_MHZ = 1410
STARTUP_S = 60.0
"""Deadline for a process to answer (imports, and a first numba compile on a cold cache)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _state(pid: int) -> str:
    """The process state letter of ``pid`` in ``/proc`` ("T" when stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _until(what: str, check: Callable[[], bool], deadline_s: float) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` past the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    """The processes of one test (an emulator, daemons, load), stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.state_dir = tmp_path / "state"
        self.emulator_port = _free_port()
        self.emulator_url = f"http://127.0.0.1:{self.emulator_port}"
        self.metrics_port = _free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.emulator: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def _start(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = (self.tmp_path / log_name).open("wb")
        self.logs.append(log)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.processes.append(process)
        return process

    def start_emulator(self, served_model_name: str) -> None:
        """``gpugov emulate`` on the test's port (a restart keeps the port)."""
        if self.emulator is not None:
            stop(self.emulator)
        self.emulator = self._start(
            [
                *GPUGOV,
                "emulate",
                "--profile",
                "h100-sxm-llama3-8b",
                "--address",
                f"127.0.0.1:{self.emulator_port}",
                "--served-model-name",
                served_model_name,
            ],
            f"emulator-{served_model_name}.log",
        )
        _until("the emulator", lambda: bool(_get(f"{self.emulator_url}/v1/models")), STARTUP_S)

    def start_load(self, seconds: float = 60.0) -> subprocess.Popen[bytes]:
        """``gpugov load``: a conversation trace at twice its rate."""
        return self._start(
            [
                *GPUGOV,
                "load",
                "--trace",
                "azure-conv-10min",
                "--url",
                self.emulator_url,
                "--duration",
                str(seconds),
                "--load-scale",
                "2",
                "--drain",
                "5",
                "--quiet",
            ],
            f"load-{len(self.processes)}.log",
        )

    def config(self, controller: str) -> Path:
        """A daemon config for the emulator; ``controller`` is ``mpc-online`` or ``fixed``."""
        if controller == "mpc-online":
            block = (
                'kind = "mpc-online"\nwarmup_s = 1.0\nsolve_time_limit_s = 0.1\n'
                f'state_dir = "{self.state_dir}"\n'
            )
        else:
            block = f'kind = "fixed"\nclock_mhz = {FIXED_MHZ}\n'
        path = self.tmp_path / f"{controller}.toml"
        path.write_text(
            f"[daemon]\nperiod_s = {PERIOD_S}\n"
            f'metrics_address = "127.0.0.1:{self.metrics_port}"\n'
            f'backend = "emulated"\nemulator = "{self.emulator_url}"\n'
            f'state_dir = "{self.state_dir}"\nlog_level = "info"\n\n'
            '[[domains]]\nname = "emu"\ngpus = [0]\n\n'
            f'[domains.engine]\nkind = "vllm"\nurl = "{self.emulator_url}/metrics"\n\n'
            f"[domains.controller]\n{block}\n"
            f"[domains.safety]\ndwell_s = {PERIOD_S}\n"
        )
        return path

    def start_daemon(self, config: Path) -> tuple[subprocess.Popen[bytes], Path]:
        """``gpugov run``; returns the process and its log file, once it has decided."""
        self.runs += 1
        name = f"daemon-{self.runs}.log"
        daemon = self._start([*GPUGOV, "run", "--config", str(config)], name)
        _until(
            "the daemon's first decisions", lambda: self.metric("gpugov_decisions") >= 1, STARTUP_S
        )
        return daemon, self.tmp_path / name

    def metrics(self) -> dict[str, float]:
        """The daemon's exporter, by sample name (one domain, one GPU)."""
        page = _get(self.metrics_url)
        return {s.name: s.value for f in text_string_to_metric_families(page) for s in f.samples}

    def metric(self, name: str) -> float:
        values = self.metrics()
        return values.get(name, values.get(f"{name}_total", 0.0))

    def sample(self) -> dict[str, Any]:
        """The emulated GPU's readings (NVML's view)."""
        return dict(json.loads(_get(f"{self.emulator_url}/gpu/0/sample")))

    def locked_low(self) -> bool:
        """Whether a lock holds the emulated GPU below its top clock."""
        return bool(self.sample()["clock_event_reasons"] & APPLICATIONS_CLOCKS_SETTING)

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        for log in self.logs:
            log.close()


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` and wait for the exit code (bounded)."""
    if process.poll() is None:
        process.send_signal(sig)
    return process.wait(timeout=30)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    emulated = Node(tmp_path)
    try:
        yield emulated
    finally:
        emulated.close()


def _stored(node: Node) -> dict[str, Any]:
    payload = json.loads((node.state_dir / "online-model-emu.json").read_text())
    return dict(payload)


def _windows(payload: dict[str, Any]) -> int:
    model = payload["model"]
    return sum(int(model[fit]["samples"]) for fit in ("time", "power", "thermal"))


def test_the_learned_model_survives_a_restart_and_a_new_model_relearns(node: Node) -> None:
    node.start_emulator("model-a")
    load = node.start_load()
    config = node.config("mpc-online")
    daemon, log = node.start_daemon(config)
    _until(
        "the warm-up to end",
        lambda: (
            node.metric("gpugov_model_warmup_active") == 0.0
            and node.metric("gpugov_model_samples") >= 10
        ),
        STARTUP_S,
    )
    assert stop(daemon) == 0, log.read_text()
    first = _stored(node)
    assert first["key"]["model_name"] == "model-a"
    assert first["model"]["warmed_up"] is True
    learned = _windows(first)
    assert learned >= 10
    # The GPUs' NVML names (the emulated board's) are kept with the model, and `gpugov
    # model export` names the board in the profile's `gpu`.
    from gpugov.cli import main
    from gpugov.plant import load_profile
    from gpugov.study.emulate.node import emulated_gpu_name

    board = emulated_gpu_name(load_profile("h100-sxm-llama3-8b"))
    assert first["gpu_names"] == [board] * len(first["key"]["gpu_uuids"])
    out = node.state_dir.parent / "export"
    flags = ["--ttft-slo", "1", "--tpot-slo", "0.1"]  # the domain sets none
    assert (
        main(["model", "export", "--state-dir", str(node.state_dir), "--out", str(out), *flags])
        == 0
    )
    assert json.loads((out / "online-emu.json").read_text())["gpu"] == board

    # Restart against the same engine: the model is restored, still warmed up.
    daemon, log = node.start_daemon(config)
    # The model is restored at the controller's first observation; a first decision can
    # come before it (a fail-safe tick while the first scrape is still under way).
    _until(
        "the stored model restored",
        lambda: node.metric("gpugov_model_samples") >= first["model"]["time"]["samples"],
        STARTUP_S,
    )
    metrics = node.metrics()
    assert metrics["gpugov_model_warmup_active"] == 0.0
    assert metrics["gpugov_model_samples_total"] >= first["model"]["time"]["samples"]
    assert stop(daemon) == 0, log.read_text()
    text = log.read_text()
    assert "learned model restored" in text
    assert "not applied" not in text and "learning anew" not in text
    second = _stored(node)
    assert second["key"]["model_name"] == "model-a"
    assert _windows(second) >= learned
    stop(load)  # it only drove the engine

    # The engine now serves another model: the stored one is kept aside, learned anew.
    node.start_emulator("model-b")
    load = node.start_load()
    daemon, log = node.start_daemon(config)
    _until("a new window learned", lambda: node.metric("gpugov_model_samples") >= 2, STARTUP_S)
    assert stop(daemon) == 0, log.read_text()
    text = log.read_text()
    # Not restored: it warmed up anew. (Its warm-up gauge, read once the daemon has
    # decided, says so only until its five busy windows, 1 s, have passed: a loaded
    # machine can take that long between two reads.)
    assert "learned model restored" not in text
    assert "not applied; kept as" in text and "'model-a'" in text
    assert len(list(node.state_dir.glob("online-model-*.json.other-*"))) == 1
    third = _stored(node)
    assert third["key"]["model_name"] == "model-b"
    assert 0 < _windows(third) < _windows(second)
    stop(load)


@pytest.mark.parametrize("second", [None, signal.SIGINT], ids=["sigterm", "sigterm-then-sigint"])
def test_a_stop_signal_leaves_no_lock(node: Node, second: int | None) -> None:
    node.start_emulator("model-a")
    daemon, log = node.start_daemon(node.config("fixed"))
    _until("the lock", node.locked_low, STARTUP_S)
    if second is None:
        daemon.send_signal(signal.SIGTERM)
    else:
        # Frozen while both are sent, so the second cannot come after the whole stop
        # (handlers restored, the process exiting) when this process is descheduled
        # between the two sends on a loaded machine: both are pending when it resumes.
        # SIGSTOP takes effect when the process next runs, and a SIGCONT sent before
        # that cancels it, so the sends wait until the kernel reports it stopped.
        daemon.send_signal(signal.SIGSTOP)
        _until("the stop", lambda: _state(daemon.pid) == "T", STARTUP_S)
        daemon.send_signal(signal.SIGTERM)
        daemon.send_signal(second)
        daemon.send_signal(signal.SIGCONT)
    # 0 for SIGTERM; sent together, pending signals may be delivered lowest number first
    # (SIGINT before SIGTERM), and a stop Ctrl-C started exits 130.
    codes = {0} if second is None else {0, 130}
    assert daemon.wait(timeout=30) in codes, log.read_text()
    text = log.read_text()
    assert "clocks reset" in text or "was reset" in text
    if second is not None:
        assert "again; still stopping" in text
    assert not node.locked_low()
    assert node.sample()["sm_clock_mhz"] > FIXED_MHZ


def test_after_sigkill_the_next_start_resets_the_lock(node: Node) -> None:
    node.start_emulator("model-a")
    config = node.config("fixed")
    daemon, log = node.start_daemon(config)
    _until("the lock", node.locked_low, STARTUP_S)
    assert stop(daemon, signal.SIGKILL) == -signal.SIGKILL
    time.sleep(0.5)
    assert node.locked_low()  # SIGKILL cannot be caught: the lock is left behind
    daemon, log = node.start_daemon(config)
    assert stop(daemon) == 0, log.read_text()
    text = log.read_text()
    assert "reconcile: GPU 0" in text and "reset" in text
    assert not node.locked_low()
