"""``gpugov load`` and ``gpugov profile`` against a server that wants an API key (vLLM's
``--api-key``): ``--api-key`` or ``OPENAI_API_KEY`` goes out as a bearer token on every
request and is never printed; and ``load`` groups failed requests by their kind (status
and error type), not by the start of their message."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpugov.cli import main
from gpugov.plant.types import Request
from gpugov.study.load import format_report, run_load, summarize
from gpugov.study.openai_client import StreamTiming

KEY = "sk-test-0123456789abcdef"


class _Server(BaseHTTPRequestHandler):
    """An OpenAI-compatible server: ``/v1/models`` and streamed ``/v1/completions``
    (``max_tokens`` token events), each refused with vLLM's 401 without ``Bearer KEY``
    when ``key`` is set; every Authorization header it saw is kept in ``seen``."""

    protocol_version = "HTTP/1.1"
    key: ClassVar[str | None] = KEY
    seen: ClassVar[list[str | None]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization")
        type(self).seen.append(given)
        if self.key is None or given == f"Bearer {self.key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self._authorized():
            self._send(200, {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._authorized():
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for _ in range(int(body["max_tokens"])):
            event = {"choices": [{"index": 0, "text": " the"}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@pytest.fixture
def server() -> Iterator[str]:
    _Server.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,16,3\n0,16,2\n")
    return path


def test_load_sends_the_api_key_and_never_prints_it(
    server: str,
    trace: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "load.json"
    argv = ["load", "--trace", str(trace), "--url", server, "--quiet", "--json", str(out)]
    assert main([*argv, "--api-key", KEY]) == 0
    summary = json.loads(out.read_text())
    assert summary["requests_completed"] == 2 and summary["output_tokens"] == 5
    # /v1/models (the model, its context) and both completions carried the key.
    assert _Server.seen == [f"Bearer {KEY}"] * 4
    captured = capsys.readouterr()
    assert KEY not in captured.out + captured.err + out.read_text()


def test_load_takes_the_key_from_openai_api_key(
    server: str, trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert main(["load", "--trace", str(trace), "--url", server, "--quiet"]) == 0
    assert set(_Server.seen) == {f"Bearer {KEY}"}
    captured = capsys.readouterr()
    assert KEY not in captured.out + captured.err


def test_load_without_the_key_is_refused_in_one_line_naming_the_flag(
    server: str, trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["load", "--trace", str(trace), "--url", server, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"gpugov: error: {server}/v1/models: HTTP 401 Unauthorized: Unauthorized "
        "(a missing or wrong API key: --api-key or OPENAI_API_KEY)"
    ]
    assert _Server.seen == [None]


@pytest.mark.parametrize(
    ("argv", "variable", "source"),
    [
        (["--api-key", f"{KEY} more"], None, "--api-key"),
        (["--api-key", ""], None, "--api-key"),
        ([], f"{KEY}\n", "OPENAI_API_KEY"),
    ],
    ids=["space", "empty", "newline-in-variable"],
)
def test_a_key_no_header_can_carry_is_refused_before_any_request(
    server: str,
    trace: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    variable: str | None,
    source: str,
) -> None:
    if variable is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", variable)
    for command in (
        ["load", "--trace", str(trace), "--url", server, "--quiet"],
        ["profile", "--engine-url", server, "--gpus", "0", "--out", "unused", "--quiet"],
    ):
        assert main([*command, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("gpugov: error: ")
        assert f"{source}: " in err
        assert KEY not in err and "Traceback" not in err
    assert _Server.seen == []  # refused before the server was asked anything


def test_profile_asks_the_served_model_with_the_key(
    server: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the key the engine's 401 ends the run in one line; with it the run gets
    past the engine to the GPUs (here an emulator that does not answer: no GPU)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    argv = [
        "profile",
        "--engine-url",
        server,
        "--gpus",
        "0",
        "--backend",
        "emulated",
        "--emulator",
        "http://127.0.0.1:9",
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "--api-key or OPENAI_API_KEY" in err
    _Server.seen.clear()
    code = main([*argv, "--api-key", KEY])
    err = capsys.readouterr().err
    assert code not in (0, 2) and "HTTP 401" not in err and KEY not in err
    assert _Server.seen and set(_Server.seen) == {f"Bearer {KEY}"}


def test_the_profile_measurer_sends_the_key_with_its_requests(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's measurer (``Sweep.api_key`` hands it the key) sends it with every
    request of a batch."""
    from gpugov.study.profiler import measure

    keys: list[str | None] = []

    def stream(url: str, body: dict[str, Any], **options: Any) -> StreamTiming:
        keys.append(options.get("api_key"))
        return StreamTiming(8, 1, 0.0, error="refused")

    monkeypatch.setattr(measure, "stream_completion", stream)
    measurer = measure.Measurer(server, "m", None, api_key=KEY)  # type: ignore[arg-type]
    with pytest.raises(measure.ProfileRunError, match="3 request"):
        measurer.prefill(8, 3)
    assert keys == [KEY] * 3


# ------------------------------------------------------------------ error groups
LONG_PREFIX = (
    "The completion request could not be served by this deployment of the inference engine: "
)


class _Refusals(BaseHTTPRequestHandler):
    """Answers the n-th completion with vLLM's 400 (its message holding the request's
    id) when n is even, its 503 when n is odd; both messages share an 80-character
    start."""

    protocol_version = "HTTP/1.1"
    count: ClassVar[int] = 0
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            n = type(self).count
            type(self).count += 1
        if n % 2 == 0:
            status, kind, why = 400, "BadRequestError", f"prompt too long (request cmpl-{n:04d})"
        else:
            status, kind, why = 503, "ServiceUnavailableError", "the engine is overloaded"
        message = LONG_PREFIX + why
        data = json.dumps({"error": {"message": message, "type": kind, "code": status}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data.encode())
        self.close_connection = True


def test_failed_requests_are_grouped_by_status_and_error_type() -> None:
    """Four 400s whose messages differ only in the request id are one group; the 503s,
    whose messages start with the same 80 characters, are another."""
    assert len(LONG_PREFIX) >= 80
    _Refusals.count = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Refusals)
    threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        workload = [Request(i, 0.0, 16, 2) for i in range(8)]
        run = run_load(workload, url, "m", max_concurrency=1, drain_s=30.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    summary = summarize(run)
    assert summary["requests_failed"] == 8
    assert summary["errors"] == {
        "HTTP 400 BadRequestError": 4,
        "HTTP 503 ServiceUnavailableError": 4,
    }
    examples = summary["error_examples"]
    assert examples["HTTP 400 BadRequestError"] == (
        f"HTTP 400 Bad Request: {LONG_PREFIX}prompt too long (request cmpl-0000)"
    )
    assert examples["HTTP 503 ServiceUnavailableError"].startswith("HTTP 503 Service Unavailable")
    report = format_report(summary)
    assert (
        "error x4 [HTTP 400 BadRequestError]: first HTTP 400 Bad Request: "
        f"{LONG_PREFIX}prompt too long (request cmpl-0000)"
    ) in report


def test_a_failure_without_a_kind_is_grouped_by_its_message() -> None:
    """A timing made elsewhere (no ``error_kind``) keeps its whole message as its group."""
    from gpugov.study.load import LoadRun

    long = "x" * 100
    timings = [
        StreamTiming(1, 1, 0.0, error=f"{long}a"),
        StreamTiming(1, 1, 0.0, error=f"{long}b"),
        StreamTiming(1, 1, 0.0, error=f"{long}a"),
    ]
    run = LoadRun(timings, scheduled=3, not_sent=0, clipped_prompts=0, wall_s=1.0, late_starts=0)
    assert summarize(run)["errors"] == {f"{long}a": 2, f"{long}b": 1}


class _Answer:
    """What ``_http_failure`` reads of an ``http.client.HTTPResponse``."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        self.status, self.reason, self._body = status, reason, body

    def read(self, size: int = -1) -> bytes:
        return self._body if size < 0 else self._body[:size]


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "max_tokens is too large", "type": "BadRequestError"}},
        {"object": "error", "message": "max_tokens is too large", "type": "BadRequestError"},
    ],
    ids=["current", "flat"],
)
def test_both_vllm_error_shapes_give_the_message_and_the_kind(body: dict[str, object]) -> None:
    """vLLM's current error body and its older flat one (``{"object": "error", ...}``)
    both give the message and the error's type, not the raw JSON."""
    from gpugov.study.openai_client import _http_failure

    answer = _Answer(400, "Bad Request", json.dumps(body).encode())
    line, kind = _http_failure(answer)  # type: ignore[arg-type]
    assert line == "HTTP 400 Bad Request: max_tokens is too large"
    assert kind == "HTTP 400 BadRequestError"
