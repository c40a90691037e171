"""``gpugov emulate`` and ``gpugov load`` under bad clients and bad servers, over real
loopback sockets: vLLM's error shape, malformed and chunked bodies, wrong content types
and methods, a client that leaves mid-request, and a stream cut before ``[DONE]``."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from synthetic import make_plant

from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.load import LoadRun, summarize
from gpugov.study.openai_client import stream_completion


def _raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as written (plus ``Connection: close``) on a fresh connection;
    (status, headers, body). The client keeps its side open: a half-closed connection
    reads as a client that left."""
    line, _, rest = request.partition(b"\r\n")
    request = line + b"\r\nConnection: close\r\n" + rest
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _post(path: str, body: bytes, *, headers: str = "Content-Type: application/json\r\n") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


COMPLETION = json.dumps({"prompt": "hello there", "max_tokens": 3, "ignore_eos": True}).encode()


def test_errors_have_current_vllms_shape(emulator: EmulatorServer) -> None:
    status, _, body = _raw(emulator.url, _post("/v1/completions", b"{not json"))
    assert status == 400
    assert set(json.loads(body)) == {"error"}
    assert json.loads(body)["error"]["code"] == 400


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", "", "\u00b2"])
def test_a_malformed_content_length_is_a_400(emulator: EmulatorServer, length: str) -> None:
    """Headers are read as Latin-1: a superscript two is a digit to ``str.isdigit`` and
    no number to ``int`` (it was a 500)."""
    request = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode("latin-1") + COMPLETION
    status, _, body = _raw(emulator.url, request)
    assert status == 400
    assert "Content-Length" in json.loads(body)["error"]["message"]


def test_an_oversized_body_is_refused_unread(emulator: EmulatorServer) -> None:
    request = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {1 << 40}\r\n\r\n"
    ).encode()
    status, _, body = _raw(emulator.url, request)
    assert status == 413 and json.loads(body)["error"]["code"] == 413


def test_a_chunked_body_is_read(emulator: EmulatorServer) -> None:
    half = len(COMPLETION) // 2
    chunks = b"".join(
        f"{len(part):x}\r\n".encode() + part + b"\r\n"
        for part in (COMPLETION[:half], COMPLETION[half:])
    )
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    )
    status, _, body = _raw(emulator.url, request)
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 3


def test_a_malformed_chunk_is_a_400(emulator: EmulatorServer) -> None:
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    )
    status, _, body = _raw(emulator.url, request)
    assert status == 400 and "chunk" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_wrong_content_type_is_a_400(emulator: EmulatorServer, content_type: str | None) -> None:
    header = f"Content-Type: {content_type}\r\n" if content_type else ""
    status, _, body = _raw(emulator.url, _post("/v1/completions", COMPLETION, headers=header))
    assert status == 400
    assert "Only 'application/json' is allowed" in json.loads(body)["error"]["message"]
    # With a parameter it is still JSON.
    header = "Content-Type: application/json; charset=utf-8\r\n"
    status, _, _ = _raw(emulator.url, _post("/v1/completions", COMPLETION, headers=header))
    assert status == 200


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/completions", "POST"),
        ("DELETE", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("PUT", "/metrics", "GET"),
        ("GET", "/gpu/0/lock", "POST"),
        ("OPTIONS", "/v1/completions", "POST"),
    ],
)
def test_a_wrong_method_is_a_405(
    emulator: EmulatorServer, method: str, path: str, allow: str
) -> None:
    request = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
    status, headers, body = _raw(emulator.url, request)
    assert status == 405 and headers["allow"] == allow
    assert json.loads(body)["error"]["code"] == 405


def test_head_answers_a_get_path_without_a_body_and_a_post_path_with_a_405(
    emulator: EmulatorServer,
) -> None:
    # Starlette, which serves vLLM, adds HEAD to every GET route.
    status, headers, body = _raw(emulator.url, b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and int(headers["content-length"]) > 0 and body == b""
    status, headers, body = _raw(emulator.url, b"HEAD /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and headers["allow"] == "POST" and body == b""


def test_an_unknown_path_is_a_404_in_the_same_shape(emulator: EmulatorServer) -> None:
    status, _, body = _raw(emulator.url, _post("/v1/nothing", b"{}"))
    assert status == 404 and json.loads(body)["error"]["code"] == 404


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_aborts_its_request(stream: bool) -> None:
    node = EmulatedNode(make_plant())
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        body = json.dumps(
            {"prompt": "x" * 40, "max_tokens": 2000, "ignore_eos": True, "stream": stream}
        ).encode()
        parts = urllib.parse.urlsplit(server.url)
        sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
        sock.sendall(_post("/v1/completions", body))
        if stream:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # the stream has begun
        deadline = time.monotonic() + 10.0
        while not any(node._streams) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any(node._streams)  # in flight
        sock.close()
        while any(node._streams) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(node._streams), "the request was not aborted"
        # The plant ends it after its current iteration, once its thread next advances.
        simulation = node.simulations[0]
        deadline = time.monotonic() + 30.0
        while simulation.observe().decode_active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert simulation.observe().decode_active == 0
        assert simulation.generated_tokens(0) < 2000  # it stopped generating
        assert sum(node.stats[0].finished.values()) == 0  # not counted as finished
    finally:
        server.close()


class _CutStream(BaseHTTPRequestHandler):
    """A server that dies mid-stream: two token events, then the connection closes."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for _ in range(2):
            event = {"choices": [{"index": 0, "text": " a", "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


class _ErrorEvent(_CutStream):
    """A server that reports an error mid-stream, as vLLM does, then ends the stream."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        error = {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
        self.wfile.write(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode())
        self.close_connection = True


@pytest.mark.parametrize(("handler", "expected"), [(_CutStream, "without [DONE]"),
                                                    (_ErrorEvent, "engine died")])  # fmt: skip
def test_load_counts_a_stream_cut_short_as_failed(
    handler: type[BaseHTTPRequestHandler], expected: str
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        timing = stream_completion(url, {"prompt": [1, 2, 3], "max_tokens": 5}, timeout_s=10)
        assert timing.error is not None and expected in timing.error
        assert timing.end_s is None
        run = LoadRun([timing], scheduled=1, not_sent=0, clipped_prompts=0, wall_s=1.0,
                      late_starts=0)  # fmt: skip
        summary = summarize(run)
        assert summary["requests_completed"] == 0 and summary["requests_failed"] == 1
    finally:
        server.shutdown()
        server.server_close()


class _HangsUpOnTheBody(_CutStream):
    """A server that reads a request's headers and closes without an answer."""

    def do_POST(self) -> None:
        self.close_connection = True


def test_a_server_that_hangs_up_mid_body_is_reported_as_such() -> None:
    """The server closes while the client is still sending an 18 MB body and sends no
    answer: the failure names what happened (it read ``BrokenPipeError: [Errno 32]
    Broken pipe``), and counts as a failed request."""
    from gpugov.study.openai_client import request_body

    server = ThreadingHTTPServer(("127.0.0.1", 0), _HangsUpOnTheBody)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        body = request_body("m", 3_000_000, 4)
        size = len(json.dumps(body).encode())
        timing = stream_completion(url, body, timeout_s=10)
        assert timing.error == (
            f"the server closed the connection while the request body of {size} bytes "
            "was being sent"
        )
        run = LoadRun([timing], scheduled=1, not_sent=0, clipped_prompts=0, wall_s=1.0,
                      late_starts=0)  # fmt: skip
        assert summarize(run)["requests_failed"] == 1
    finally:
        server.shutdown()
        server.server_close()


class _MalformedEvents(_CutStream):
    """A server whose stream carries events that are not JSON objects, then ends well."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(self.server.events + b"data: [DONE]\n\n")  # type: ignore[attr-defined]
        self.close_connection = True


@pytest.mark.parametrize(
    ("events", "shown"),
    [
        (b"data: {not json\n\n", "malformed stream event: {not json"),
        (b"data: [1, 2]\n\n", "malformed stream event: [1, 2]"),
        (b"data: \x1b[31m\n\n", "malformed stream event: \\x1b[31m"),
    ],
)
def test_a_malformed_stream_event_fails_the_request(events: bytes, shown: str) -> None:
    """An event whose data is not a JSON object was skipped, so a stream of garbage that
    ended with ``[DONE]`` counted as a completed request of no tokens; it now fails."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MalformedEvents)
    server.events = events  # type: ignore[attr-defined]
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        timing = stream_completion(url, {"prompt": [1, 2, 3], "max_tokens": 5}, timeout_s=10)
        assert timing.error == shown
        assert timing.end_s is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_stream_the_emulator_stops_ends_with_finish_reason_abort() -> None:
    """The emulator stopped mid-stream (SIGTERM, its stream timeout): the stream ended with
    ``[DONE]`` and no finish reason, where vLLM sends one of ``abort``; a client could not
    tell an ended stream from a short answer."""
    node = EmulatedNode(make_plant())
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        body = json.dumps(
            {"prompt": "x" * 40, "max_tokens": 5000, "ignore_eos": True, "stream": True}
        ).encode()
        parts = urllib.parse.urlsplit(server.url)
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(_post("/v1/completions", body))
            data = b""
            while b'"text": "' not in data and b'"text":"' not in data:  # a token streamed
                data += sock.recv(65536)
            node.stop()  # as on SIGTERM: every open stream is ended
            while b"[DONE]" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    finally:
        server.close()
    events = [
        json.loads(line[len(b"data: ") :])
        for line in data.split(b"\n")
        if line.startswith(b"data: {")
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "abort", events[-1]
    assert b"[DONE]" in data
