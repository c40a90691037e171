"""The actuator's systemd watchdog: pings from its serving loop reach a real
``$NOTIFY_SOCKET`` (an AF_UNIX datagram socket, as systemd listens on) while the loop
and its lease enforcement make progress, and stop while an NVML call hangs."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import FakeGpu, FakeNvml

from gpugov.daemon.actuator_server import ActuatorServer
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.sd_notify import MIN_WATCHDOG_S, Watchdog, notify_systemd, watchdog_seconds

WATCHDOG_USEC = "1000000"  # WatchdogSec=1s: a ping at most every 0.25 s


class NotifySocket:
    """What systemd listens on for ``sd_notify``: a datagram socket on a path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))

    def next(self, timeout_s: float) -> str | None:
        """The next message, or None when none comes within ``timeout_s``."""
        self.sock.settimeout(timeout_s)
        try:
            return self.sock.recv(4096).decode()
        except TimeoutError:
            return None

    def drain(self) -> list[str]:
        """Every message already queued."""
        out = []
        while (message := self.next(0.001)) is not None:
            out.append(message)
        return out

    def close(self) -> None:
        self.sock.close()


class HangingNvml(FakeNvml):
    """The fake NVML whose ``hang_in`` function blocks until ``release`` is set (a
    driver call that does not return), with ``hung`` set once a call is stuck there."""

    def __init__(self, gpus: int | list[FakeGpu] = 1) -> None:
        super().__init__(gpus)
        self.hang_in: str | None = None
        self.hung = threading.Event()
        self.release = threading.Event()

    def _enter(self, function: str, handle: FakeGpu | None = None) -> None:
        super()._enter(function, handle)
        if function == self.hang_in:
            self.hung.set()
            self.release.wait(30)


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gpugov-", dir="/tmp") as name:  # short paths
        yield Path(name)


@pytest.fixture
def notify(folder: Path) -> Iterator[NotifySocket]:
    listener = NotifySocket(folder / "notify")
    yield listener
    listener.close()


def _ask(peer: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
    """One request line and its answer, on a raw connection to the actuator."""
    peer.sendall(json.dumps(request).encode() + b"\n")
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = peer.recv(4096)
        assert chunk, "the actuator closed the connection"
        answer += chunk
    result: dict[str, Any] = json.loads(answer)
    return result


def test_pings_stop_while_an_nvml_call_hangs_and_resume_when_it_returns(
    folder: Path, notify: NotifySocket
) -> None:
    nvml = HangingNvml(1)
    backend = NvmlBackend(0, nvml=nvml)
    server = ActuatorServer([backend], str(folder / "a.sock"), str(os.getuid()))
    server.listen()
    watchdog = Watchdog({"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": WATCHDOG_USEC})
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop.is_set, watchdog.progress))
    thread.start()
    try:
        assert [notify.next(5), notify.next(5)] == ["WATCHDOG=1"] * 2  # serving: pings
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(5)
            peer.connect(str(folder / "a.sock"))
            assert _ask(peer, {"op": "hello", "lease_s": 5})["ok"]
            assert _ask(peer, {"op": "lock", "gpu": "0", "min_mhz": 1410, "max_mhz": 1410})["ok"]
            assert nvml.locked(0) == (1410, 1410)
            nvml.hang_in = "nvmlDeviceResetGpuLockedClocks"
        # The governor is gone: its lease ends and the reset hangs in the driver.
        assert nvml.hung.wait(5), "the lease's reset never started"
        notify.drain()  # whatever was sent before the hang
        silent = notify.next(4 * 1.0)  # four times WatchdogSec: systemd would have fired
        assert silent is None, f"pinged while the loop was stuck in NVML: {silent!r}"
        assert nvml.locked(0) == (1410, 1410)
        nvml.release.set()  # the call returns: the reset is done, the loop goes on
        assert notify.next(5) == "WATCHDOG=1"
        assert nvml.locked(0) is None
        assert server.gpus["0"].holder is None
    finally:
        nvml.release.set()
        stop.set()
        thread.join(10)
        server.close()
        backend.close()
    assert not thread.is_alive()


def test_pings_are_at_most_every_quarter_of_watchdogsec(notify: NotifySocket) -> None:
    now = [100.0]
    environ = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}
    watchdog = Watchdog(environ, clock=lambda: now[0])
    for _ in range(40):  # 40 rounds of 0.125 s: 5 s, a ping every 0.5 s
        watchdog.progress()
        now[0] += 0.125
    assert watchdog.pings == 10
    assert notify.drain() == ["WATCHDOG=1"] * 10


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WATCHDOG_USEC": "10000000"}, 10.0),
        ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}, 10.0),
        ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}, None),  # another process's
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_is_the_units_when_it_is_ours(
    notify: NotifySocket, environ: dict[str, str], expected: float | None
) -> None:
    environ = {"NOTIFY_SOCKET": str(notify.path), **environ}
    assert watchdog_seconds(environ) == expected
    watchdog = Watchdog(environ)
    watchdog.progress()
    assert notify.drain() == ([] if expected is None else ["WATCHDOG=1"])


def test_without_notify_socket_nothing_is_sent_or_expected(notify: NotifySocket) -> None:
    assert watchdog_seconds({"WATCHDOG_USEC": "10000000"}) is None
    Watchdog({"WATCHDOG_USEC": "10000000"}).progress()
    notify_systemd("READY=1", {})
    assert notify.drain() == []
    notify_systemd("READY=1", {"NOTIFY_SOCKET": str(notify.path)})
    assert notify.drain() == ["READY=1"]


def test_a_watchdog_shorter_than_the_minimum_is_a_problem(notify: NotifySocket) -> None:
    environ = {"NOTIFY_SOCKET": str(notify.path)}
    short = Watchdog({**environ, "WATCHDOG_USEC": str(int(MIN_WATCHDOG_S * 1e6) // 2)})
    problem = short.problem()
    assert problem is not None and "WatchdogSec=0.5s is too short" in problem
    assert Watchdog({**environ, "WATCHDOG_USEC": str(int(MIN_WATCHDOG_S * 1e6))}).problem() is None
    assert Watchdog(environ).problem() is None


def test_a_notify_socket_nobody_reads_never_holds_the_serving_loop(notify: NotifySocket) -> None:
    """A send to a notify socket whose queue is full (its reader busy) waited for room,
    holding the actuator's serving loop, and so its lease enforcement; it is dropped now."""
    environ = {"NOTIFY_SOCKET": str(notify.path)}
    worker = threading.Thread(
        target=lambda: [notify_systemd("WATCHDOG=1", environ) for _ in range(500)], daemon=True
    )
    worker.start()
    worker.join(10.0)
    assert not worker.is_alive(), "the notify send blocked on a full queue"
    assert notify.next(1.0) == "WATCHDOG=1"


@pytest.mark.parametrize("raw", ["²", "٥٠٠٠٠٠٠", "abc", "-5", "0", "1e6"])
def test_a_malformed_watchdog_usec_is_the_actuators_problem(notify: NotifySocket, raw: str) -> None:
    """``gpugov actuator`` under WATCHDOG_USEC=² ended in a traceback (isdigit() is true of
    it, int() refuses it), and other garbage ran with no watchdog where the unit expects
    pings; it is one line naming the variable now, as ``gpugov run`` says it."""
    from gpugov.daemon.node_cli import environ_watchdog_s

    environ = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": raw}
    problem = Watchdog(environ).problem()
    assert problem is not None and problem.startswith(f"WATCHDOG_USEC={raw!r}: must be"), problem
    with pytest.raises(ValueError) as run_said:
        environ_watchdog_s(environ)
    assert str(run_said.value) == problem
