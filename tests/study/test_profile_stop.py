"""``gpugov profile`` stops at once on Ctrl-C/SIGTERM, whatever it is measuring: a stop
that waited for the measurement in flight kept the GPU locked low for as long as the
engine took (minutes when it stalled) or as long as ``--dwell``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic import make_profile

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.plant import ServingPlant
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.measure import GpuSampler, Interrupted, Measurer
from gpugov.study.profiler.sweep import Sweep, SweepSettings


@pytest.fixture
def stalled_engine() -> Iterator[str]:
    """An engine that accepts every connection and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    closing = threading.Event()

    def accept() -> None:
        while not closing.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            held.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    closing.set()
    listener.close()
    for connection in held:
        connection.close()


def _stop_after(seconds: float) -> threading.Event:
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    return stop


def test_a_stop_ends_a_request_the_engine_never_answers(stalled_engine: str) -> None:
    """A stop waited for the stalled request's timeout (300 s by default)."""
    measurer = Measurer(
        stalled_engine, "m", GpuSampler([]), request_timeout_s=30.0, stop=_stop_after(0.3)
    )
    started = time.monotonic()
    with pytest.raises(Interrupted):
        measurer.prefill(16, 3)
    assert time.monotonic() - started < 3.0


def test_a_stop_ends_a_long_idle_dwell() -> None:
    measurer = Measurer("http://127.0.0.1:9", "m", GpuSampler([]), stop=_stop_after(0.2))
    started = time.monotonic()
    with pytest.raises(Interrupted):
        measurer.idle(30.0)
    assert time.monotonic() - started < 3.0


def test_a_sweep_stopped_mid_dwell_resets_its_clock_at_once(tmp_path: Path) -> None:
    plant = ServingPlant.from_profile(make_profile())
    server = EmulatorServer(EmulatedNode(plant), "127.0.0.1", 0)
    server.start()
    backend = EmulatedBackend(0, emulator=server.url)
    try:
        settings = SweepSettings(clocks_mhz=(1290, 1980), dwell_s=60.0)
        stop = _stop_after(1.5)
        sweep = Sweep([backend], server.url, "m", settings, tmp_path, stop=stop)
        sweep.progress_enabled = False
        started = time.monotonic()
        with pytest.raises(Interrupted):
            sweep.run()
        assert time.monotonic() - started < 8.0
        assert server.node.gpu_state[0].locked is None
    finally:
        backend.close()
        server.close()


@pytest.mark.parametrize(
    ("name", "word", "code"),
    [
        ("SIGINT", "interrupted", 130),
        ("SIGTERM", "terminated", 143),
        ("SIGHUP", "stopped by SIGHUP", 129),
        ("SIGRTMIN+3", "stopped by SIGRTMIN+3", 128 + 37),
    ],
)
def test_a_sweep_stopped_by_a_signal_ends_with_its_word_and_code(
    name: str, word: str, code: int
) -> None:
    """Each stop signal the sweep takes ends it with its word and the shell's code, a
    real-time one (no :class:`signal.Signals` member) included."""
    from gpugov.study.profiler.cli import _stopped_by

    assert _stopped_by([name]) == (word, code)
