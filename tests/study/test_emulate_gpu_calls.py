"""The emulated GPUs' NVML calls over HTTP with arguments NVML would not take, and a
request that fails inside the server: each answered, none a traceback."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

from gpugov.study.emulate.server import EmulatorServer


def _call(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize(
    "body",
    [
        b'{"min_mhz": 1e400, "max_mhz": 1e400}',  # infinity: int() overflowed, a traceback
        b'{"min_mhz": 900, "max_mhz": 1e400}',
        b'{"min_mhz": 900, "max_mhz": 4294967296}',  # past NVML's unsigned int
        b'{"min_mhz": 900.5, "max_mhz": 1000}',  # not an integer: truncated and taken
        b'{"min_mhz": true, "max_mhz": 1000}',
        b'{"min_mhz": "900", "max_mhz": "1000"}',
        b'{"min_mhz": 900}',
        b"[900, 1000]",
        b"{not json",
        b"[" * 100_000 + b"]" * 100_000,  # past the JSON parser's depth: a RecursionError
    ],
)
def test_a_lock_nvml_could_not_take_is_invalid_argument_and_changes_nothing(
    emulator: EmulatorServer, body: bytes, capfd: pytest.CaptureFixture[str]
) -> None:
    status, payload = _call(emulator.url, "POST", "/gpu/0/lock", body)
    assert (status, json.loads(payload)) == (500, {"nvmlReturn": 2})
    assert emulator.node.gpu_state[0].locked is None
    assert "Traceback" not in capfd.readouterr().err


def test_a_request_that_fails_in_the_server_is_a_500_and_one_line(
    emulator: EmulatorServer,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception in a handler printed socketserver's traceback to the emulator's
    stderr and closed the connection with no answer."""

    def broken(gpu: int) -> dict[str, object]:
        raise RuntimeError("the plant broke")

    monkeypatch.setattr(emulator.node, "gpu_info", broken)
    status, payload = _call(emulator.url, "GET", "/gpu/0")
    assert status == 500
    assert json.loads(payload)["error"]["type"] == "InternalServerError"
    assert "Traceback" not in capfd.readouterr().err
    said = [r for r in caplog.records if "the plant broke" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "ERROR" and said[0].exc_info is None
    assert said[0].getMessage() == "GET /gpu/0 failed: RuntimeError: the plant broke"
    # The server goes on serving.
    assert _call(emulator.url, "GET", "/gpu")[0] == 200
