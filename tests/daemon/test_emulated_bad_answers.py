"""The emulated backend against an emulator that answers nonsense: a real HTTP server on
loopback serving crafted JSON. A reading that is no reading costs that reading (or the
sample), never the daemon; a GPU description without integer clocks refuses the GPU; a
frozen or trickling emulator costs a read at most its deadline, and is logged as a GPU
whose samples fail."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpugov.daemon.emulated import EmulatedBackend, call_timeout_s
from gpugov.daemon.engines import EngineSample
from gpugov.daemon.errors import GpuUnavailable, TransientGpuError
from gpugov.daemon.observer import DomainObserver

GOOD_GPU = {
    "uuid": "GPU-emulated-0",
    "name": "emulated",
    "max_sm_clock_mhz": 1410,
    "supported_memory_clocks_mhz": [1593],
    "supported_graphics_clocks_mhz": [1410, 1005, 510],
}
GOOD_SAMPLE = {
    "power_mw": 300_000,
    "energy_mj": 1_000_000,
    "temperature_c": 50,
    "sm_clock_mhz": 1410,
    "utilization_gpu": 80,
    "clock_event_reasons": 0,
    "enforced_power_limit_mw": 400_000,
}


TRICKLE_PADDING = 1200
"""Whitespace after a trickled body: 1,200 bytes more at 50 ms each take a minute."""


class _Emulator:
    """Answers GET /gpu/0 with ``gpu`` and GET /gpu/0/sample with ``sample`` (raw JSON
    text, so NaN and Infinity go out as Python's json writes them)."""

    def __init__(self, port: int = 0) -> None:
        self.gpu: Any = GOOD_GPU
        self.sample: Any = GOOD_SAMPLE
        self.frozen = False  # /sample is never answered (a process stopped with SIGSTOP)
        # /sample's body goes out one byte every 50 ms, padded with whitespace to take a
        # minute: a byte comes well within any read's socket timeout, the whole body not
        # within the deadline of any read here, however loaded the machine.
        self.trickle = False
        self.trickled_whole = False  # a trickled body went out to its last byte
        self.release = threading.Event()  # set at teardown: held handlers return
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                reading = self.path.endswith("/sample")
                if reading and owner.frozen:
                    owner.release.wait(10.0)
                    return
                body = owner.sample if reading else owner.gpu
                data = json.dumps(body).encode()
                if reading and owner.trickle:
                    data += b" " * TRICKLE_PADDING
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if reading and owner.trickle:
                    try:
                        for byte in data:
                            if owner.release.wait(0.05):
                                return
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                    except OSError:  # the client gave up and closed the connection
                        return
                    owner.trickled_whole = True
                    return
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()


@pytest.fixture
def emulator() -> Iterator[_Emulator]:
    server = _Emulator()
    yield server
    server.release.set()
    server.server.shutdown()
    server.server.server_close()


@pytest.mark.parametrize(
    ("changes", "lost"),
    [
        ({"clock_event_reasons": float("inf")}, "clock_event_reasons"),
        ({"clock_event_reasons": float("nan")}, "clock_event_reasons"),
        ({"utilization_gpu": float("nan")}, "utilization"),
        # A percentage past 100 or below 0 was clamped into [0, 1] and taken as read.
        ({"utilization_gpu": 250}, "utilization"),
        ({"utilization_gpu": -3}, "utilization"),
        ({"power_mw": -1}, "power"),
        ({"energy_mj": float("-inf")}, "energy"),
        # An integer too large for a float raised OverflowError out of the read.
        ({"power_mw": 10**400}, "power"),
        ({"temperature_c": -(10**400)}, "temperature"),
        ({"energy_mj": 10**400}, "energy"),
        # A field's NVML code that is no code raised ValueError out of the read.
        ({"power_mw": {"nvmlReturn": "timeout"}}, "power"),
        ({"power_mw": {"nvmlReturn": 10**400}}, "power"),
    ],
)
def test_an_impossible_reading_is_a_failed_read(
    emulator: _Emulator, changes: dict[str, float], lost: str
) -> None:
    emulator.sample = GOOD_SAMPLE | changes
    backend = EmulatedBackend(0, emulator=emulator.url)
    sample = backend.sample()
    assert lost in sample.read_errors
    assert sample.sm_clock_mhz == 1410.0  # the rest of the sample stands
    backend.close()


def test_a_field_the_emulator_once_called_unsupported_is_taken_when_it_reads_again(
    emulator: _Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """A field answered NOT_SUPPORTED once (an emulated fault, a MIG mode switched off
    again) was dropped for good: every later answer's value was thrown away, the SM
    clock (and so the readback of every lock) unread for the rest of the run. It is left
    out while it is not supported; one line when it stops, one when it reads again."""
    backend = EmulatedBackend(0, emulator=emulator.url)
    emulator.sample = GOOD_SAMPLE | {"sm_clock_mhz": {"nvmlReturn": 3}}
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.emulated"):
        assert backend.sample().sm_clock_mhz is None
        assert backend.sample().sm_clock_mhz is None
        emulator.sample = GOOD_SAMPLE
        sample = backend.sample()
    assert sample.sm_clock_mhz == 1410.0 and sample.read_errors == ()
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: sm_clock not supported; left out while it is",
        "GPU 0: sm_clock reads again",
    ]
    backend.close()


def test_an_answer_that_is_no_reading_fails_the_whole_read(emulator: _Emulator) -> None:
    emulator.sample = [1, 2]
    backend = EmulatedBackend(0, emulator=emulator.url)
    sample = backend.sample()
    assert sample.power_w is None and sample.sm_clock_mhz is None
    assert "power" in sample.read_errors and "sm_clock" in sample.read_errors
    backend.close()


@pytest.mark.parametrize("code", ["timeout", 1.5, 10**400, [4]])
def test_a_whole_read_answered_with_a_code_that_is_no_code_is_a_failed_read(
    emulator: _Emulator, code: Any
) -> None:
    """An NVML code that is no integer (text, a float, past any C int) is NVML's UNKNOWN:
    a failed read the observer counts, not a ValueError out of the tick."""
    emulator.sample = {"nvmlReturn": code}
    backend = EmulatedBackend(0, emulator=emulator.url)
    with pytest.raises(TransientGpuError, match="read GPU"):
        backend.sample()
    backend.close()


def test_clocks_no_gpu_runs_at_refuse_the_gpu(emulator: _Emulator) -> None:
    """A clock too large for a float passed as an integer and raised OverflowError where
    the daemon first took the clocks as floats: refused in one line at the open."""
    emulator.gpu = GOOD_GPU | {"supported_graphics_clocks_mhz": [1410, 10**400]}
    with pytest.raises(GpuUnavailable, match="lists supported clocks no GPU runs at"):
        EmulatedBackend(0, emulator=emulator.url)
    emulator.gpu = GOOD_GPU | {"supported_graphics_clocks_mhz": [0, 1410]}
    with pytest.raises(GpuUnavailable, match=r"no GPU runs at \(0 MHz"):
        EmulatedBackend(0, emulator=emulator.url)
    emulator.gpu = GOOD_GPU | {"max_sm_clock_mhz": 10**400}
    assert EmulatedBackend(0, emulator=emulator.url).max_clock_mhz() is None


@pytest.mark.parametrize("clocks", [["abc"], [None], [float("inf")]])
def test_clocks_that_are_not_integers_refuse_the_gpu(
    emulator: _Emulator, clocks: list[Any]
) -> None:
    emulator.gpu = GOOD_GPU | {"supported_graphics_clocks_mhz": clocks}
    with pytest.raises(GpuUnavailable, match="not integers"):
        EmulatedBackend(0, emulator=emulator.url)


def test_a_description_that_is_no_object_refuses_the_gpu(emulator: _Emulator) -> None:
    emulator.gpu = [GOOD_GPU]
    with pytest.raises(GpuUnavailable, match="no GPU description"):
        EmulatedBackend(0, emulator=emulator.url)


@pytest.mark.parametrize("fault", ["frozen", "trickle"])
def test_a_frozen_or_trickling_emulator_costs_a_read_at_most_its_deadline(
    emulator: _Emulator, fault: str
) -> None:
    """A stopped emulator (SIGSTOP) or one that trickles its answer: the read fails as a
    whole (TransientGpuError, which the observer logs and counts) at one overall
    deadline, not one per socket read, and the next read after it recovers is whole.

    Judged by the failure and by what the emulator sent, not by the wall clock (a loaded
    machine stretches any elapsed time): the trickled answer's bytes each came within
    the socket's timeout, its whole body (a minute of bytes) never came, so only the
    overall deadline could end the read, and its error says so."""
    backend = EmulatedBackend(0, emulator=emulator.url, timeout_s=0.2)
    setattr(emulator, fault, True)
    with pytest.raises(TransientGpuError) as failed:
        backend.sample()
    assert str(failed.value) == (
        f"read GPU: emulator {emulator.url} did not answer: no complete answer within 0.2 s"
    )
    assert not emulator.trickled_whole
    setattr(emulator, fault, False)
    # The read after recovery is judged whole, not fast: a loaded machine may take the
    # emulator's thread longer than 0.2 s to answer it.
    backend._timeout_s = READ_AFTER_RECOVERY_S
    assert backend.sample().read_errors == ()
    backend.close()


READ_AFTER_RECOVERY_S = 30.0
"""The deadline of the read after an emulator recovers: it must come back whole, and the
tests judge that, not its speed."""


def test_the_daemon_gives_an_emulated_call_a_fifth_of_its_period() -> None:
    """Sample and write at most 0.4 of the period, the scrape at most half: a frozen
    emulator (which serves the engine's page too) leaves a tick within its period."""
    assert call_timeout_s(0.5) == pytest.approx(0.1)
    assert call_timeout_s(2.0) == 0.25
    assert call_timeout_s(0.05) == 0.05


class _Engine:
    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        return EngineSample("vllm", 0, 0)


def test_a_frozen_emulator_is_logged_as_a_gpu_whose_samples_fail(
    emulator: _Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """As for NVML and nvidia-smi: one warning at the first failed sample, DEBUG after it
    (a reminder a minute), one line when sampled again; each failed sample counted once."""
    backend = EmulatedBackend(0, emulator=emulator.url, timeout_s=0.1)
    observer = DomainObserver([backend], _Engine(), stale_after_s=3.0, log_every_s=60.0)
    emulator.frozen = True
    with caplog.at_level(logging.INFO, logger="gpugov.daemon"):
        for tick in range(3):
            observer.observe(float(tick), tick, None)
        emulator.frozen = False
        backend._timeout_s = READ_AFTER_RECOVERY_S  # whole, however loaded the machine
        observer.observe(3.0, 3, None)
    backend.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GPU 0")]
    assert lines == [
        f"GPU 0: sample failed: read GPU: emulator {emulator.url} did not answer: "
        "no complete answer within 0.1 s",
        "GPU 0: sampled again after 3 failed samples",
    ]
    assert caplog.records[0].levelno == logging.WARNING
    assert observer.gpus.gpu_read_errors == {"0": 3}


def test_an_emulator_still_starting_is_waited_for_and_one_that_never_answers_is_no_gpu() -> None:
    """Opening an emulated GPU whose emulator does not answer yet (started beside the
    daemon, or busy) is retried as an NVML timeout at start is; it was refused at once as
    `no such emulated GPU`, which it is not. One that never answers is still no GPU at
    start (exit 4), in words that say it did not answer."""
    import socket

    from gpugov.daemon.gpu_open import START_ATTEMPTS, open_backend

    with socket.socket() as probe:  # a free port, nothing listening on it yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    started: list[_Emulator] = []
    waits: list[float] = []

    def wait(seconds: float) -> None:  # the start's backoff: the emulator comes up
        waits.append(seconds)
        if len(waits) == 2:
            started.append(_Emulator(port))

    try:
        backend = open_backend(0, "emulated", emulator=url, sleep=wait)
        assert backend.uuid == GOOD_GPU["uuid"] and backend.supported_clocks_mhz()[-1] == 1410
        assert len(waits) == 2
        backend.close()
    finally:
        for server in started:
            server.server.shutdown()
            server.server.server_close()
    with pytest.raises(GpuUnavailable) as refused:
        open_backend(0, "emulated", emulator=url, sleep=lambda seconds: None)
    message = str(refused.value)
    assert "did not answer" in message and f"(tried {START_ATTEMPTS} times)" in message
    assert "no such emulated GPU" not in message
    stop = threading.Event()
    stop.set()  # a stop signal during the start ends the tries: the daemon's own path
    with pytest.raises(TransientGpuError):
        open_backend(0, "emulated", emulator=url, sleep=lambda seconds: None, stop=stop)
