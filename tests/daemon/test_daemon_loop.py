"""TimedLoop on virtual time, systemd notifications, signal handling."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpugov.daemon.loop import ScaledClock, SystemdNotify, TimedLoop, VirtualClock, stop_on_signals
from gpugov.daemon.stop_signals import StopEvent, set_from_handler


def test_ticks_at_absolute_targets_without_drift() -> None:
    clock = VirtualClock(100.0)
    loop = TimedLoop(0.5, clock=clock, sleep=clock.sleep)
    times = []
    for now in loop:
        times.append(now)
        clock.now_s += 0.123  # work inside the tick does not shift the next target
        if len(times) == 5:
            loop.stop.set()
    assert times == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert loop.ticks == 5 and loop.overruns == 0


def test_overrun_skips_missed_targets() -> None:
    clock = VirtualClock()
    loop = TimedLoop(1.0, clock=clock, sleep=clock.sleep)
    times = []
    for now in loop:
        times.append(now)
        if len(times) == 2:
            clock.now_s += 2.5  # this tick ran past two targets
        if len(times) == 4:
            loop.stop.set()
    assert times == pytest.approx([0.0, 1.0, 4.0, 5.0])
    assert loop.overruns == 2


def test_stop_before_start_yields_nothing() -> None:
    loop = TimedLoop(1.0, clock=VirtualClock(), sleep=lambda s: None)
    loop.stop.set()
    assert list(loop) == []


def test_period_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TimedLoop(0.0)


def test_scaled_clock_uses_wall_time() -> None:
    wall = VirtualClock(50.0)
    scaled = ScaledClock(60.0, wall=wall)
    wall.now_s += 2.0
    assert scaled() == pytest.approx(120.0)


class Recorder:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def notify(self, state: str) -> None:
        self.messages.append(state)


def test_systemd_ready_watchdog_status_stopping() -> None:
    recorder = Recorder()
    notify = SystemdNotify(recorder, environ={"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "10000000"})
    notify.tick("one")
    notify.tick("two")
    notify.stopping()
    assert recorder.messages == [
        "READY=1",
        "WATCHDOG=1",
        "STATUS=one",
        "WATCHDOG=1",
        "STATUS=two",
        "STOPPING=1",
    ]


def test_no_watchdog_without_usec_or_for_another_pid() -> None:
    recorder = Recorder()
    SystemdNotify(recorder, environ={"NOTIFY_SOCKET": "/x"}).tick("s")
    other = SystemdNotify(recorder, environ={"WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"})
    assert not other.watchdog_enabled or os.getpid() == 1
    assert "WATCHDOG=1" not in recorder.messages


def test_silent_outside_systemd() -> None:
    notify = SystemdNotify(environ={})
    notify.tick("x")
    notify.stopping()


def _signum(name: str) -> int:
    """The number of signal ``name``; ``SIGRTMIN+N`` names a real-time signal."""
    base, _, offset = name.partition("+")
    return int(getattr(signal, base)) + int(offset or 0)


@pytest.mark.parametrize(
    "name",
    # SIGPWR (LXC's stop of a container), SIGRTMIN+3 (systemd's halt in a container) and
    # the other real-time signals end a process by default too.
    ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGPWR", "SIGSTKFLT", "SIGRTMIN+3"],
)
def test_every_terminating_signal_sets_stop(name: str, caplog: pytest.LogCaptureFixture) -> None:
    loop = TimedLoop(1.0, clock=VirtualClock(), sleep=lambda s: None)
    sig = _signum(name)
    previous = signal.getsignal(sig)
    with caplog.at_level("INFO", logger="gpugov.daemon.loop"), stop_on_signals(loop.stop):
        os.kill(os.getpid(), sig)
        assert loop.stop.is_set()
        # A repeated signal (a second Ctrl-C during the reset) must not interrupt it.
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), sig)
        assert loop.stop.is_set()
    assert signal.getsignal(sig) is previous
    assert f"received {name}; stopping" in caplog.text


_STOP_WHILE_THE_LOCK_IS_HELD = """
import signal, threading
from gpugov.daemon.loop import TimedLoop, stop_on_signals
for stop in (TimedLoop(1.0).stop, threading.Event()):
    with stop_on_signals(stop):
        # Where the main thread is on its way into or out of the loop's stop.wait: holding
        # the event's lock, which is not reentrant. A handler that set the event here
        # waited on that lock forever.
        with stop._cond:
            signal.raise_signal(signal.SIGTERM)
            seen = stop.is_set()
        print(type(stop).__name__, seen, stop.wait(10), flush=True)
"""


def test_a_stop_signal_while_the_loop_holds_the_stop_events_lock_still_stops() -> None:
    """A daemon hung at its SIGTERM (GPUs locked) when the signal landed in ``stop.wait``'s
    own few bytecodes that hold the event's lock."""
    done = subprocess.run(
        [sys.executable, "-c", _STOP_WHILE_THE_LOCK_IS_HELD],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # The loop's own event reads as set at once; any other is set once the handler returned.
    assert done.stdout.split("\n")[:2] == ["StopEvent True True", "Event False True"], done


def test_events_set_from_a_handler_are_set_in_order() -> None:
    """Whoever sees the last event set (the loop's stop) sees the first (Ctrl-C's) too."""
    for _ in range(50):
        first, last = threading.Event(), threading.Event()
        set_from_handler(first, last)
        assert last.wait(10)
        assert first.is_set()
    signalled = StopEvent()
    set_from_handler(signalled)
    assert signalled.is_set() and signalled.wait(0)  # at once, before its thread ran
    assert threading.Event.wait(signalled, 10)  # and its thread's set() came
    signalled.clear()
    assert not signalled.is_set()


def test_a_notify_socket_nobody_reads_never_holds_the_loop_or_its_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd's notify socket holds a few datagrams only (``net.unix.max_dgram_qlen``):
    while its reader is busy (PID 1 in a long reload, a container's notify proxy that
    stopped reading) a blocking send waited for room, so the loop stopped at its watchdog
    ping and, at a stop, ``STOPPING=1`` held the reset with the GPUs locked. A datagram
    with no room is dropped now, as a ping that systemd would not have read in time."""
    path = tmp_path / "notify"
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    notify = SystemdNotify(environ={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "30000000"})
    sent: list[int] = []

    def ticks() -> None:
        for tick in range(500):  # far past any queue's room
            notify.tick(f"tick {tick}")
            sent.append(tick)
        notify.stopping()

    worker = threading.Thread(target=ticks, daemon=True)
    worker.start()
    worker.join(10.0)
    try:
        assert not worker.is_alive(), f"the notify send blocked after {len(sent)} tick(s)"
        assert reader.recv(4096) == b"READY=1"  # what had room was sent
    finally:
        reader.close()
