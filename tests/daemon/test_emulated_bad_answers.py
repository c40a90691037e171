"""The emulated backend against an emulator that answers nonsense: a real HTTP server on
loopback serving crafted JSON. A reading that is no reading costs that reading (or the
sample), never the daemon; a GPU description without integer clocks refuses the GPU."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.errors import GpuUnavailable

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


class _Emulator:
    """Answers GET /gpu/0 with ``gpu`` and GET /gpu/0/sample with ``sample`` (raw JSON
    text, so NaN and Infinity go out as Python's json writes them)."""

    def __init__(self) -> None:
        self.gpu: Any = GOOD_GPU
        self.sample: Any = GOOD_SAMPLE
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.sample if self.path.endswith("/sample") else owner.gpu
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()


@pytest.fixture
def emulator() -> Iterator[_Emulator]:
    server = _Emulator()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.mark.parametrize(
    ("changes", "lost"),
    [
        ({"clock_event_reasons": float("inf")}, "clock_event_reasons"),
        ({"clock_event_reasons": float("nan")}, "clock_event_reasons"),
        ({"utilization_gpu": float("nan")}, "utilization"),
        ({"power_mw": -1}, "power"),
        ({"energy_mj": float("-inf")}, "energy"),
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


def test_an_answer_that_is_no_reading_fails_the_whole_read(emulator: _Emulator) -> None:
    emulator.sample = [1, 2]
    backend = EmulatedBackend(0, emulator=emulator.url)
    sample = backend.sample()
    assert sample.power_w is None and sample.sm_clock_mhz is None
    assert "power" in sample.read_errors and "sm_clock" in sample.read_errors
    backend.close()


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
