"""Fault tests for the split mode: ``gpugov actuator`` and a governor with
``backend = "actuator"``, as real processes on the fake node, over a real Unix socket.

Each test asserts an outcome, never a duration: the lock a dead governor held is reset
(and the actuator's log says why), a governor without its actuator holds its fail-safe
and counts the failed writes, and resumes when the actuator returns; a stranger, a
flood, a lock out of range or on an unconfigured GPU, and a slow actuator are refused
or survived.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import (
    LOCKED_MHZ,
    TOP_MHZ,
    Daemon,
    Engine,
    Node,
    assert_clean,
    config_text,
)

from gpugov.daemon.actuator_server import DEFAULT_MIN_RELOCK_S

LEASE_S = 1.0
FAILSAFE = 'gpugov_failsafe_active{domain="llm"}'
UNAVAILABLE = (
    'gpugov_fallbacks_total{controller="fixed:1410",domain="llm",reason="actuator_unavailable"}'
)


class Peer:
    """A raw protocol client on the actuator's socket."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rwb")

    def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.file.write(data)
        self.file.flush()

    def answer(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line, "the actuator closed the connection"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.answer()

    def closed(self) -> bool:
        """True when the actuator has closed its end (EOF)."""
        return self.file.readline() == b""

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def start_actuator(
    node: Node,
    path: Path,
    *,
    gpus: str = "0,1",
    allow: int | None = None,
    name: str = "actuator",
    env: dict[str, str] | None = None,
) -> Daemon:
    """``gpugov actuator`` on the fake node, serving ``path``; returns once it listens."""
    uid = os.getuid() if allow is None else allow
    args = ["actuator", "--gpus", gpus, "--allow", str(uid), "--socket", str(path)]
    actuator = Daemon(node, args, name=name, env=env or {}).start()
    actuator.wait_for(lambda: "serving GPUs" in actuator.stderr, 60, "the actuator to listen")
    return actuator


def governor(root: Path, node: Node, engine: Engine, path: Path, **actuator: Any) -> Daemon:
    """A governor (fixed 1410 MHz, period 0.2 s) writing through the actuator at ``path``."""
    settings = {"socket": str(path), "lease_s": LEASE_S, "timeout_s": 0.15, **actuator}
    inline = ", ".join(f"{key} = {json.dumps(value)}" for key, value in settings.items())
    text = config_text(engine.url).replace(
        "[daemon]\n", f'[daemon]\nbackend = "actuator"\nactuator = {{ {inline} }}\n', 1
    )
    config = root / "governor.toml"
    config.write_text(text)
    return Daemon(node, ["run", "--config", str(config)], name="governor")


@pytest.fixture
def split(tmp_path: Path) -> Iterator[tuple[Path, Node, Engine, Path, list[Daemon]]]:
    """A fake node, a healthy engine, a socket path; every process started is killed."""
    node = Node(tmp_path)
    engine = Engine("ok")
    started: list[Daemon] = []
    short = Path(tempfile.mkdtemp(prefix="gpugov-", dir="/tmp"))  # sun_path holds 107 bytes
    try:
        yield tmp_path, node, engine, short / "actuator.sock", started
    finally:
        for process in started:
            process.kill()
        engine.close()
        shutil.rmtree(short, ignore_errors=True)


class NotifyListener:
    """What systemd listens on for ``sd_notify``: a datagram socket on a path, read by a
    thread that stamps each message with the time it arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.1)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._done.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.time(), data.decode()))

    def states(self) -> list[str]:
        """Every message so far, in order."""
        return [message for _, message in self.messages]

    def pings(self) -> list[float]:
        """When each ``WATCHDOG=1`` arrived."""
        return [t for t, message in self.messages if message == "WATCHDOG=1"]

    def close(self) -> None:
        self._done.set()
        self._thread.join(5)
        self._sock.close()


def metrics(daemon: Daemon) -> dict[str, float]:
    """The daemon's metrics once it serves them (empty before)."""
    return daemon.metrics() if "metrics on" in daemon.stderr else {}


def unlocked(node: Node) -> bool:
    return all(lock is None for lock in node.locked())


def test_governor_sigkilled_its_locks_are_reset(split: Any) -> None:
    root, node, engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    gov = governor(root, node, engine, path).start()
    started.append(gov)
    gov.wait_locked(LOCKED_MHZ)
    gov.kill()
    actuator.wait_for(lambda: unlocked(node), 30, "the actuator to reset the dead governor's locks")
    assert "disconnected" in actuator.stderr
    assert actuator.process is not None and actuator.process.poll() is None
    assert actuator.stop() == 0
    assert_clean(actuator)


def test_governor_stopped_past_its_lease_loses_its_locks_and_takes_them_again(
    split: Any,
) -> None:
    root, node, engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    gov = governor(root, node, engine, path).start()
    started.append(gov)
    gov.wait_locked(LOCKED_MHZ)
    gov.send(signal.SIGSTOP)  # hung: the connection stays open, no renewals
    try:
        actuator.wait_for(lambda: unlocked(node), 30, "the lease to expire")
        assert "expired" in actuator.stderr
    finally:
        gov.send(signal.SIGCONT)
    gov.wait_locked(LOCKED_MHZ, what="the governor to lock again on a new lease")
    assert gov.stop() == 0
    assert unlocked(node)
    assert_clean(gov)


def test_actuator_sigkilled_governor_fails_safe_and_resumes(split: Any) -> None:
    root, node, engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    gov = governor(root, node, engine, path).start()
    started.append(gov)
    gov.wait_locked(LOCKED_MHZ)
    actuator.kill()
    gov.wait_for(lambda: metrics(gov).get(FAILSAFE) == 1.0, 30, "the fail-safe")
    seen = gov.metrics()
    assert seen[UNAVAILABLE] >= 1
    failures = sum(v for k, v in seen.items() if k.startswith("gpugov_clock_write_failures"))
    assert failures >= 1
    ticks = seen["gpugov_loop_ticks_total"]
    gov.wait_for(lambda: gov.metrics()["gpugov_loop_ticks_total"] > ticks, 30, "ticks")
    assert "clock writes cannot go through" in gov.stderr

    again = start_actuator(node, path, name="actuator2")  # resets what the dead one left
    started.append(again)
    gov.wait_for(lambda: metrics(gov)[FAILSAFE] == 0.0, 30, "the fail-safe to end")
    gov.wait_locked(LOCKED_MHZ, what="control to resume")
    assert "clock writes go through again" in gov.stderr
    assert gov.stop() == 0
    assert unlocked(node)
    assert again.stop() == 0
    assert_clean(gov)
    assert_clean(again)


def test_a_stranger_is_refused(split: Any) -> None:
    _root, node, _engine, path, started = split
    actuator = start_actuator(node, path, allow=os.getuid() + 4242)
    started.append(actuator)
    for _ in range(3):
        peer = Peer(path)
        answer = peer.answer()
        assert answer["ok"] is False and answer["error"] == "forbidden"
        assert peer.closed()
        peer.close()
    assert not [w for w in node.writes() if w[0] == "lock"]
    assert actuator.stderr.count("refused a connection") == 1  # one line per stranger uid
    # A governor of that uid stops with one line naming the actuator's refusal.
    gov = governor(_root, node, _engine, path).start()
    started.append(gov)
    assert gov.wait(60) == 3
    lines = gov.stderr.strip().splitlines()
    assert "refused this user" in lines[-1] and lines[-1].startswith("gpugov: error:"), lines
    assert_clean(gov)
    assert not [w for w in node.writes() if w[0] == "lock"]
    assert actuator.stop() == 0


def test_a_flood_is_rate_limited_and_survived(split: Any) -> None:
    _root, node, _engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    peer = Peer(path)
    assert peer.ask({"op": "hello", "lease_s": 5})["ok"]
    answers: list[dict[str, Any]] = []
    count = 3000

    def read() -> None:
        for _ in range(count):
            answers.append(peer.answer())

    reader = threading.Thread(target=read)
    reader.start()
    batches = 10
    for batch in range(batches):  # bursts spread over about half a second
        peer.send(
            b"".join(
                json.dumps({"op": "lock", "gpu": "0", "min_mhz": m, "max_mhz": m}).encode() + b"\n"
                for m in (1410 if i % 2 else 1395 for i in range(count // batches))
            )
        )
        if batch + 1 < batches:
            time.sleep(0.05)
    reader.join(60)
    assert len(answers) == count
    written = [a for a in answers if a.get("written")]
    limited = [a for a in answers if a.get("error") == "rate_limited"]
    unchanged = [a for a in answers if a.get("ok") and not a.get("written")]
    assert written and len(written) + len(limited) + len(unchanged) == count
    assert limited  # the GPU saw a few locks, not thousands (the gaps below bound them)
    locks = [w for w in node.writes() if w[0] == "lock" and w[1] == 0]
    assert len(locks) == len(written)
    gaps = [b[-1] - a[-1] for a, b in itertools.pairwise(locks)]
    assert all(gap >= 0.9 * DEFAULT_MIN_RELOCK_S for gap in gaps), gaps  # ~50 ms apart
    # Garbage, then a line with no end: answered, then the connection is closed.
    assert peer.ask({"op": "launch"})["error"] == "bad_request"
    peer.send(b"\xff\xfe not json\n")
    assert peer.answer()["error"] == "bad_request"
    peer.send(b"[" * 4000 + b"\n")  # nested deeper than the JSON parser recurses
    assert peer.answer()["error"] == "bad_request"
    for odd in ([1, 2], {"op": "lock", "gpu": ["0"]}, {"op": "hello", "lease_s": "nan"}):
        assert peer.ask(odd)["ok"] is False  # type: ignore[arg-type]
    peer.send(b"x" * 10_000)
    assert peer.answer()["error"] == "bad_request"
    assert peer.closed()
    peer.close()
    # Many connections at once: the extra ones are turned away, the actuator serves on.
    peers, turned_away = [], 0
    for _ in range(40):
        try:
            peers.append(Peer(path))
        except OSError:  # the listen backlog is full: turned away by the kernel
            turned_away += 1
    for other in peers:
        other.sock.settimeout(0.5)
        try:
            line = other.file.readline()
        except TimeoutError:
            continue  # served: waits for its request
        turned_away += bool(line) and json.loads(line)["error"] == "busy"
    assert turned_away >= 40 - 16
    for other in peers:
        other.close()
    fresh = Peer(path)
    assert fresh.ask({"op": "held"})["ok"]
    fresh.close()
    actuator.wait_for(lambda: unlocked(node), 30, "the flooding peer's lock to be reset")
    assert actuator.stop() == 0
    assert_clean(actuator)


def test_locks_out_of_range_or_on_other_gpus_are_refused(split: Any) -> None:
    _root, node, _engine, path, started = split
    actuator = start_actuator(node, path, gpus="0")  # the node has GPUs 0 and 1
    started.append(actuator)
    peer = Peer(path)
    hello = peer.ask({"op": "hello"})
    assert [g["gpu"] for g in hello["gpus"]] == ["0"]
    low, top = hello["gpus"][0]["min_mhz"], hello["gpus"][0]["max_mhz"]
    refused = {
        ("1", 1410, 1410): "unknown_gpu",
        ("GPU-fake-0001", 1410, 1410): "unknown_gpu",
        ("0", low - 15, 1410): "out_of_range",
        ("0", 1410, top + 15): "out_of_range",
        ("0", 1500, 1410): "out_of_range",
        ("0", 0, 0): "out_of_range",
        ("0", -1410, 1410): "out_of_range",
    }
    for (gpu, lo, hi), code in refused.items():
        answer = peer.ask({"op": "lock", "gpu": gpu, "min_mhz": lo, "max_mhz": hi})
        assert answer["error"] == code, (gpu, lo, hi, answer)
    for bad in ({"min_mhz": 1410.5, "max_mhz": 1500}, {"min_mhz": True, "max_mhz": 1410}, {}):
        assert peer.ask({"op": "lock", "gpu": "0", **bad})["error"] == "bad_request"
    assert peer.ask({"op": "reset", "gpu": "1"})["error"] == "unknown_gpu"
    assert not [w for w in node.writes() if w[0] == "lock"]
    assert peer.ask({"op": "lock", "gpu": "0", "min_mhz": 1410, "max_mhz": 1410})["ok"]
    assert peer.ask({"op": "held"})["held"] == {
        "0": {"min_mhz": 1410, "max_mhz": 1410, "mine": True}
    }
    assert node.locked() == [[1410, 1410], None]
    peer.close()
    actuator.wait_for(lambda: unlocked(node), 30, "the closed peer's lock to be reset")
    assert actuator.stop() == 0


def test_a_slow_actuator_never_stalls_the_governor(split: Any) -> None:
    root, node, engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    node.delay("nvmlDeviceSetGpuLockedClocks", 0.5)  # each lock 0.5 s; the timeout 0.15 s
    gov = governor(root, node, engine, path).start()
    started.append(gov)
    failures = 'gpugov_clock_write_failures_total{domain="llm",gpu="0"}'
    gov.wait_for(lambda: metrics(gov).get(failures, 0) >= 2, 60, "timed-out writes")
    ticks = gov.metrics()["gpugov_loop_ticks_total"]
    gov.wait_for(lambda: gov.metrics()["gpugov_loop_ticks_total"] > ticks + 5, 30, "ticks")
    node.delay("nvmlDeviceSetGpuLockedClocks", 0.0)
    gov.wait_locked(LOCKED_MHZ, what="locks once the actuator is quick again")
    assert gov.stop() == 0
    actuator.wait_for(lambda: unlocked(node), 30, "every lock reset")
    assert actuator.stop() == 0
    # Whatever was locked while the actuator was slow went to the control clock or the
    # top clock (the fail-safe), never below the control clock.
    locks = [w for w in node.writes() if w[0] == "lock"]
    assert all(w[3] in (LOCKED_MHZ, TOP_MHZ) for w in locks), locks
    assert_clean(gov)
    assert_clean(actuator)


def test_governor_stopped_cleanly_resets_through_the_actuator(split: Any) -> None:
    root, node, engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    gov = governor(root, node, engine, path).start()
    started.append(gov)
    gov.wait_locked(LOCKED_MHZ)
    assert gov.stop() == 0
    assert unlocked(node)
    resets = [w for w in node.writes() if w[0] == "reset"]
    assert len(resets) >= 4  # two at the actuator's start, two at the governor's stop
    # reset-clocks with the governor's config goes through the actuator too.
    config = str(root / "governor.toml")
    reset = Daemon(node, ["reset-clocks", "--config", config, "--gpus", "all"], name="reset")
    assert reset.start().wait(60) == 0
    assert "GPU 1: SM clock lock reset" in reset.stdout
    assert len([w for w in node.writes() if w[0] == "reset"]) == len(resets) + 2
    assert actuator.stop() == 0
    assert_clean(gov)
    assert_clean(reset)


def test_the_actuator_on_ctrl_c_resets_and_exits_130_in_one_line(split: Any) -> None:
    """SIGTERM is its normal stop (exit 0); Ctrl-C ends it as every command, 130."""
    _root, node, _engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    peer = Peer(path)
    try:
        assert peer.ask({"op": "hello", "lease_s": 30})["ok"]
        assert peer.ask({"op": "lock", "gpu": "0", "min_mhz": 1410, "max_mhz": 1410})["ok"]
        assert node.locked()[0] == [1410, 1410]
        actuator.send(signal.SIGINT)
        assert actuator.wait(60) == 130
    finally:
        peer.close()
    assert unlocked(node)
    assert actuator.stderr.strip().splitlines()[-1] == (
        "gpugov: interrupted; every GPU the actuator served was reset"
    )
    assert_clean(actuator)


@pytest.mark.parametrize("name", ["SIGHUP", "SIGUSR1", "SIGPWR", "SIGRTMIN+3"])
def test_the_actuator_stopped_by_any_terminating_signal_resets(split: Any, name: str) -> None:
    """Every signal that stops ``gpugov run`` stops the actuator the same way, its GPUs
    reset (exit 0): SIGUSR1, SIGPWR or a real-time signal killed it with the locks it
    served held."""
    from gpugov.daemon.stop_signals import signal_number

    _root, node, _engine, path, started = split
    actuator = start_actuator(node, path)
    started.append(actuator)
    peer = Peer(path)
    try:
        assert peer.ask({"op": "hello", "lease_s": 30})["ok"]
        assert peer.ask({"op": "lock", "gpu": "0", "min_mhz": 1410, "max_mhz": 1410})["ok"]
        assert node.locked()[0] == [1410, 1410]
        actuator.send(signal_number(name))
        assert actuator.wait(60) == 0
    finally:
        peer.close()
    assert unlocked(node)
    assert_clean(actuator)


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (
            ["--gpus", "0", "--socket", "/nonexistent/a.sock"],
            2,
            "--socket /nonexistent/a.sock: no such directory /nonexistent",
        ),
        (["--gpus", "7"], 4, "GPU 7"),
        (["--gpus", "zz"], 2, "argument --gpus"),
        (["--gpus", "0", "--max-lease-s", "nan"], 2, "argument --max-lease-s"),
        (["--gpus", "all", "permission"], 3, "needs root or CAP_SYS_ADMIN"),
    ],
)
def test_a_bad_start_is_one_line(split: Any, args: list[str], code: int, needle: str) -> None:
    _root, node, _engine, path, _started = split
    if args[-1] == "permission":
        args = args[:-1]
        node.edit(permission=False)
    if "--socket" not in args:
        args = [*args, "--socket", str(path)]
    actuator = Daemon(node, ["actuator", "--allow", str(os.getuid()), *args]).start()
    assert actuator.wait(60) == code
    lines = actuator.stderr.strip().splitlines()
    assert needle in lines[-1] and lines[-1].startswith("gpugov"), lines
    assert_clean(actuator)
    assert not path.exists()


def test_the_actuator_tells_systemd_ready_watchdog_and_stopping(split: Any) -> None:
    """As its ``Type=notify`` unit with ``WatchdogSec=1s`` sees it: READY=1 once it serves,
    WATCHDOG=1 while its loop makes progress, none while a lease's reset hangs in NVML
    (so systemd would kill it and its ExecStopPost= reset), STOPPING=1 at SIGTERM."""
    _root, node, _engine, path, started = split
    notify = NotifyListener(path.parent / "notify")
    hang_s = 3.0
    try:
        env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "1000000"}
        actuator = start_actuator(node, path, env=env)
        started.append(actuator)
        actuator.wait_for(lambda: len(notify.pings()) >= 3, 30, "watchdog pings")
        assert notify.states()[0] == "READY=1"
        node.delay("nvmlDeviceResetGpuLockedClocks", hang_s)
        peer = Peer(path)
        assert peer.ask({"op": "hello", "lease_s": 30})["ok"]
        assert peer.ask({"op": "lock", "gpu": "0", "min_mhz": 1410, "max_mhz": 1410})["ok"]
        peer.close()  # the lease ends; its reset takes hang_s in the driver
        actuator.wait_for(lambda: unlocked(node), 30, "the lease's reset")
        node.delay("nvmlDeviceResetGpuLockedClocks", 0.0)
        returned = [w for w in node.writes() if w[0] == "reset"][-1][-1]
        actuator.wait_for(lambda: notify.pings()[-1] > returned, 30, "pings after the hang")
        # None arrived while the reset was stuck (a second's margin for one sent just before).
        stuck = [t for t in notify.pings() if returned - hang_s + 1.0 < t < returned]
        assert not stuck, f"{len(stuck)} pings while the loop was stuck in NVML"
        assert actuator.stop() == 0
        assert notify.states()[-1] == "STOPPING=1"
        assert notify.states().count("READY=1") == 1
    finally:
        notify.close()
    assert_clean(actuator)


def test_a_watchdog_too_short_to_keep_is_one_line(split: Any) -> None:
    _root, node, _engine, path, _started = split
    env = {"NOTIFY_SOCKET": str(path.parent / "notify"), "WATCHDOG_USEC": "500000"}
    args = ["actuator", "--gpus", "0", "--allow", str(os.getuid()), "--socket", str(path)]
    actuator = Daemon(node, args, env=env).start()
    assert actuator.wait(60) == 2
    lines = actuator.stderr.strip().splitlines()
    assert lines == [
        "gpugov: error: actuator: the unit's WatchdogSec=0.5s is too short (the actuator "
        "serves in 0.1 s rounds); use at least 1s"
    ]
    assert node.writes() == []  # refused before any GPU was opened
    assert not path.exists()
