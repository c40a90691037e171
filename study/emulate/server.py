"""The emulator's HTTP server (stdlib ``ThreadingHTTPServer``, loopback only).

Routes:

* ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE with ``stream: true``, one
  event per token as the plant's iterations produce them, ending with ``data: [DONE]``);
  ``GET /v1/models``; ``GET /health``;
* ``GET /metrics``: vLLM V1's page (:mod:`gpugov.study.emulate.metrics`); in a
  disaggregated layout (``--layout MPND``) each pool's instead, ``GET /prefill/metrics`` and
  ``GET /decode/metrics`` (:mod:`gpugov.study.emulate.disaggregated`), and ``/metrics``
  answers 404 naming them;
* ``GET /replica/<r>/metrics``: engine replica ``r``'s own page (its pool's, in a
  disaggregated layout), its engine labelled ``engine="0"``, as each engine process of
  a real node serves its own ``/metrics``; an index past the last replica is a 404;
* the emulated GPUs, NVML's calls over HTTP (``daemon/emulated.py`` is the client):
  ``GET /gpu`` (count, speed, ``tensor_parallel`` and each engine replica's GPUs, role
  and page: :meth:`EmulatedNode.replica_layout`), ``GET /gpu/<i>`` (identity, supported
  and max clocks), ``GET /gpu/<i>/sample`` (power, energy counter, temperature, SM
  clock, utilisation, clock-event reasons, power limit), ``POST /gpu/<i>/lock``
  (``{"min_mhz", "max_mhz"}``) and ``POST /gpu/<i>/reset``. A failing call answers HTTP
  500 with ``{"nvmlReturn": code}``, NVML's own return code. Nothing reveals the profile
  beyond the node's layout. A tensor-parallel profile's replica is ``tensor_parallel``
  of these GPUs, each with its share of the group's power
  (:mod:`gpugov.study.emulate.node`), in either layout.
* ``GET /gpugov/energy[?since=T]``: the true energy of the finished requests (by the
  completion's ``id``) and the run's totals (:meth:`EmulatedNode.energy_report`); every
  completion's ``usage`` carries its own (``energy_j``, ``prefill_energy_j``,
  ``decode_energy_j``). The contract is in ``docs/commands.md``.

Bad clients are answered as vLLM's server answers them: an unknown path 404 and a known
path with the wrong method 405 (with ``Allow``), both in vLLM's error shape
(``{"error": {...}}``); an OpenAI POST whose content type is not ``application/json``, a
malformed ``Content-Length`` or a body that is not JSON 400; a body larger than
:data:`MAX_BODY_BYTES` 413. Chunked request bodies are read. A client that disconnects
aborts its request: the plant stops generating it, and it is counted in no ``/metrics``
series (``vllm:request_success_total`` counts finished requests only).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue
import re
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from gpugov.daemon.cli_types import is_loopback
from gpugov.study.emulate.api import ApiError, Responder, models_body, parse_request, token_text
from gpugov.study.emulate.disaggregated import POOL_PATHS, DisaggregatedNode, render_pool_metrics
from gpugov.study.emulate.metrics import render_metrics
from gpugov.study.emulate.node import UNNAMED_MODEL, EmulatedNode

log = logging.getLogger(__name__)

_GPU_PATH = re.compile(r"^/gpu/(\d+)(/sample|/lock|/reset)?$")
_REPLICA_PATH = re.compile(r"^/replica/(\d{1,9})/metrics$")
"""An engine replica's own page (:data:`gpugov.study.emulate.node.REPLICA_METRICS_PATH`)."""
STREAM_TIMEOUT_S = 3600.0
MAX_BODY_BYTES = 32 << 20
"""Largest request body read (32 MiB: a prompt of a few million token ids)."""
POLL_S = 0.25
"""How often a handler waiting for tokens checks that its client is still there."""
OPENAI_POST = ("/v1/completions", "/v1/chat/completions")
ENERGY_PATH = "/gpugov/energy"
GET_ONLY = ("/metrics", "/v1/models", "/health", "/gpu", ENERGY_PATH, *POOL_PATHS)


CLIENT_GONE = -1
"""What :meth:`_Handler._wait` returns when the client left."""


class ClientGone(Exception):
    """The client closed its connection while its request was in flight."""


class BadRequestBody(Exception):
    """A request body that cannot be read: ``status`` and the message to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def energy_since(path: str) -> float | None:
    """The ``since`` query of ``GET /gpugov/energy`` (plant seconds), None without one.

    Raises:
        ApiError: ``since`` given twice, or not a finite number >= 0.
    """
    query = path.split("?", 1)[1] if "?" in path else ""
    values = parse_qs(query, keep_blank_values=True).get("since")
    if values is None:
        return None
    if len(values) != 1:
        raise ApiError("since must be given once")
    try:
        since = float(values[0])
    except ValueError:
        raise ApiError(f"since must be a number of plant seconds, got {values[0][:40]!r}") from None
    if not math.isfinite(since) or since < 0.0:
        raise ApiError(f"since must be a finite number >= 0, got {values[0][:40]!r}")
    return since


NVML_UINT_MAX = 2**32 - 1
"""The largest clock NVML's lock call takes (a C unsigned int)."""


def lock_request(raw: bytes) -> tuple[int, int] | None:
    """The ``(min_mhz, max_mhz)`` of a ``POST /gpu/<i>/lock`` body, or None where NVML
    could not take them (answered INVALID_ARGUMENT): not JSON, a clock missing or not an
    integer (a float, a boolean, text), or past NVML's unsigned int."""
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):  # nested past the parser
        return None
    if not isinstance(body, dict):
        return None
    clocks = (body.get("min_mhz"), body.get("max_mhz"))
    if not all(
        isinstance(mhz, int) and not isinstance(mhz, bool) and 0 <= mhz <= NVML_UINT_MAX
        for mhz in clocks
    ):
        return None
    return int(clocks[0]), int(clocks[1])  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: EmulatorServer
    head_only = False
    """Answering HEAD: the headers GET would send, no body (as Starlette serves vLLM)."""

    def _write(self, data: bytes) -> None:
        if not self.head_only:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def handle(self) -> None:
        """Serve the connection; a client that left mid-answer ends it quietly."""
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            log.debug("%s left before its answer was written", self.address_string())

    def send_response(self, code: int, message: str | None = None) -> None:
        """Send the status line, noting that this request is answered."""
        self._answered = True
        super().send_response(code, message)

    def handle_one_request(self) -> None:
        """One request; one that fails inside the server is one line on stderr and a 500
        (when nothing was sent yet), and the connection closed: never socketserver's
        traceback and a connection cut with no answer."""
        self._answered = False
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as error:  # a request's outermost edge: say it, answer, go on
            self.close_connection = True
            log.error(
                "%s %s failed: %s: %s",
                self.command,
                str(self.path)[:200],
                type(error).__name__,
                error,
            )
            log.debug("the failed request's traceback", exc_info=True)
            if not self._answered:
                body = ApiError(
                    f"Internal Server Error: {type(error).__name__}",
                    status=500,
                    kind="InternalServerError",
                ).body()
                with contextlib.suppress(OSError):  # the client left meanwhile
                    self._send_json(500, body)

    # ----------------------------------------------------------------- helpers
    def _send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._write(data)

    def _send_text(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._write(data)

    def _not_found(self) -> None:
        self._send_json(404, ApiError("Not Found", status=404, kind="NotFoundError").body())

    def _not_allowed(self, allow: str) -> None:
        """405, with ``Allow``, in vLLM's error shape (a known path, the wrong method)."""
        body = ApiError("Method Not Allowed", status=405, kind="MethodNotAllowed").body()
        data = json.dumps(body).encode()
        self.send_response(405)
        self.send_header("Allow", allow)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._write(data)

    def _body(self) -> bytes:
        """The request body: ``Content-Length`` bytes, or a chunked body.

        Raises:
            BadRequestBody: a malformed length or chunk, or a body over the cap.
        """
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._chunked_body()
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        if not (raw.strip().isascii() and raw.strip().isdigit()):
            raise BadRequestBody(f"malformed Content-Length {raw[:40]!r}")
        length = int(raw)
        if length > MAX_BODY_BYTES:
            raise BadRequestBody(f"request body of {length} bytes is too large", status=413)
        data = self.rfile.read(length) if length > 0 else b""
        if len(data) < length:
            raise BadRequestBody("request body shorter than its Content-Length")
        return data

    def _chunked_body(self) -> bytes:
        """A ``Transfer-Encoding: chunked`` body (RFC 9112, section 7.1), within the cap."""
        chunks: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BadRequestBody(f"malformed chunk size {size_text[:20]!r}") from None
            if size < 0:
                raise BadRequestBody("malformed chunk size")
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailer fields, then the end
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise BadRequestBody(f"request body over {MAX_BODY_BYTES} bytes", status=413)
            chunk = self.rfile.read(size)
            if len(chunk) < size or self.rfile.read(2) != b"\r\n":
                raise BadRequestBody("chunk shorter than its size")
            chunks.append(chunk)

    def _client_gone(self) -> bool:
        """Whether the client closed its connection (a readable socket with no data)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # ------------------------------------------------------------ other methods
    def do_PUT(self) -> None:
        self._other_method()

    def do_DELETE(self) -> None:
        self._other_method()

    def do_PATCH(self) -> None:
        self._other_method()

    def do_OPTIONS(self) -> None:
        self._other_method()

    def _other_method(self) -> None:
        """A method no route takes: 405 on a known path, 404 elsewhere."""
        path = self.path.split("?", 1)[0]
        self.close_connection = True  # the body, if any, is not read
        if path in OPENAI_POST:
            self._not_allowed("POST")
        elif path in GET_ONLY or _GPU_PATH.match(path) or _REPLICA_PATH.match(path):
            match = _GPU_PATH.match(path)
            self._not_allowed("POST" if match and match.group(2) in ("/lock", "/reset") else "GET")
        else:
            self._not_found()

    # -------------------------------------------------------------------- GET
    def do_HEAD(self) -> None:
        """GET's status and headers without the body on a GET path, 405 on a POST path
        (Starlette adds HEAD to every GET route)."""
        self.head_only = True
        try:
            self.do_GET()
        finally:
            self.head_only = False

    def do_GET(self) -> None:
        node = self.server.node
        path = self.path.split("?", 1)[0]
        if path == "/metrics" and isinstance(node, DisaggregatedNode):
            message = (
                f"Not Found: this emulated node is disaggregated ({node.layout_name}); "
                f"its pools' pages are {' and '.join(POOL_PATHS)}"
            )
            self._send_json(404, ApiError(message, status=404, kind="NotFoundError").body())
        elif path in POOL_PATHS and isinstance(node, DisaggregatedNode):
            self._send_text(
                200,
                render_pool_metrics(node, self.server.model, POOL_PATHS[path]),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        elif path == "/metrics":
            self._send_text(
                200,
                render_metrics(node, self.server.model),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        elif (replica_path := _REPLICA_PATH.match(path)) is not None:
            self._replica_metrics(int(replica_path.group(1)))
        elif path == "/v1/models":
            self._send_json(200, models_body(self.server.model, node.max_model_len))
        elif path == "/health":
            self._send_text(200, "", "text/plain")
        elif path == "/gpu":
            self._send_json(
                200,
                {
                    "count": node.gpu_count,
                    "speed": node.speed,
                    "tensor_parallel": node.tensor_parallel,
                    "replicas": node.replica_layout(),
                },
            )
        elif path == ENERGY_PATH:
            try:
                since = energy_since(self.path)
            except ApiError as error:
                self._send_json(error.status, error.body())
                return
            self._send_json(200, node.energy_report(since))
        elif path in OPENAI_POST:
            self._not_allowed("POST")
        else:
            match = _GPU_PATH.match(path)
            if match is not None and match.group(2) in ("/lock", "/reset"):
                self._not_allowed("POST")
                return
            if match is None:
                self._not_found()
                return
            gpu = int(match.group(1))
            if gpu >= node.gpu_count:
                self._send_json(500, {"nvmlReturn": 2})  # INVALID_ARGUMENT: no such index
                return
            body = node.gpu_sample(gpu) if match.group(2) else node.gpu_info(gpu)
            self._send_json(500 if "nvmlReturn" in body else 200, body)

    def _replica_metrics(self, replica: int) -> None:
        """``GET /replica/<r>/metrics``: replica ``replica``'s own engine page (its pool's
        series in a disaggregated layout), or a 404 naming the replicas there are."""
        node = self.server.node
        if replica >= node.replicas:
            message = (
                f"Not Found: this emulated node has {node.replicas} engine replica(s), "
                f"their pages {node.replica_pages()}"
            )
            self._send_json(404, ApiError(message, status=404, kind="NotFoundError").body())
            return
        if isinstance(node, DisaggregatedNode):
            page = render_pool_metrics(
                node, self.server.model, node.replica_role(replica), replicas=(replica,)
            )
        else:
            page = render_metrics(node, self.server.model, replicas=(replica,))
        self._send_text(200, page, "text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------- POST
    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        match = _GPU_PATH.match(path)
        known_post = path in OPENAI_POST or (match and match.group(2) in ("/lock", "/reset"))
        if not known_post:
            self.close_connection = True  # the body is not read
            if path in GET_ONLY or match is not None or _REPLICA_PATH.match(path):
                self._not_allowed("GET")
            else:
                self._not_found()
            return
        try:
            raw = self._body()
        except BadRequestBody as error:
            self.close_connection = True
            kind = "BadRequestError" if error.status == 400 else "RequestEntityTooLarge"
            self._send_json(
                error.status, ApiError(str(error), status=error.status, kind=kind).body()
            )
            return
        if path in OPENAI_POST:
            media_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
            if media_type != "application/json":
                self._send_json(
                    400,
                    ApiError("Unsupported Media Type: Only 'application/json' is allowed").body(),
                )
                return
            self._generate(raw, chat=path.endswith("chat/completions"))
            return
        if match is None:  # not reached: known_post above
            self._not_found()
            return
        node = self.server.node
        gpu = int(match.group(1))
        if gpu >= node.gpu_count:
            self._send_json(500, {"nvmlReturn": 2})
            return
        if match.group(2) == "/reset":
            code = node.reset_clocks(gpu)
        else:
            clocks = lock_request(raw)
            code = 2 if clocks is None else node.lock_clocks(gpu, *clocks)
        self._send_json(500 if code else 200, {"nvmlReturn": code})

    def _generate(self, raw: bytes, *, chat: bool) -> None:
        node = self.server.node
        try:
            generation = parse_request(
                raw, chat=chat, served_model=self.server.model, max_model_len=node.max_model_len
            )
            output_tokens, reason = node.natural_output_tokens(
                generation.max_tokens, generation.ignore_eos, generation.min_tokens
            )
            responder = Responder(generation)
            stream = node.submit(
                generation.prompt_tokens, output_tokens, reason, request_id=responder.id
            )
        except ApiError as error:
            self._send_json(error.status, error.body())
            return
        except ValueError as error:
            self._send_json(400, ApiError(str(error)).body())
            return
        if not generation.stream:
            produced = self._wait(stream)
            if produced == CLIENT_GONE:
                node.abort(stream)
                log.debug("client left before its completion; request aborted")
                return
            if produced is None:
                self._send_json(
                    500,
                    ApiError("the server stopped", status=500, kind="InternalServerError").body(),
                )
                return
            responder.energy_j = node.stream_energy(stream)
            self._send_json(200, responder.complete(produced, stream.finish_reason))
            return
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self._stream(stream, responder)
        except (BrokenPipeError, ConnectionResetError, ClientGone):
            node.abort(stream)
            log.debug("client left before the end of its stream; request aborted")

    def _next_event(self, stream: Any) -> tuple[str, int]:
        """The stream's next event, checking every :data:`POLL_S` that the client is
        still connected.

        Raises:
            ClientGone: the client closed its connection.
        """
        started = time.monotonic()
        while True:
            try:
                event: tuple[str, int] = stream.events.get(timeout=POLL_S)
            except queue.Empty:
                event = ("", 0)
            now = time.monotonic()
            # Tokens may flow all along: check by the clock, across calls.
            if now - getattr(self, "_checked_s", 0.0) >= POLL_S:
                self._checked_s = now
                if self._client_gone():
                    raise ClientGone
            if event[0]:
                return event
            if now - started >= STREAM_TIMEOUT_S:
                return ("abort", 0)

    def _wait(self, stream: Any) -> int | None:
        """The completion's token count; None when the server stopped it, or
        :data:`CLIENT_GONE` when the client left."""
        while True:
            try:
                kind, value = self._next_event(stream)
            except ClientGone:
                return CLIENT_GONE
            if kind == "done":
                return int(value)
            if kind == "abort":
                return None

    def _event(self, payload: Any) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {text}\n\n".encode())
        self.wfile.flush()

    def _stream(self, stream: Any, responder: Responder) -> None:
        generation = responder.generation
        if generation.chat:
            self._event(responder.chunk("", None, first=True))
        sent = 0
        while True:
            kind, value = self._next_event(stream)
            if kind == "abort":
                # Stopped by the server (its stop, the stream's timeout): vLLM ends such a
                # stream with an empty chunk whose finish_reason is "abort".
                self._event(responder.chunk("", "abort"))
                break
            if kind == "tokens":
                for _ in range(value):
                    last = sent + 1 == stream.output_tokens
                    reason = stream.finish_reason if last else None
                    self._event(responder.chunk(token_text(sent), reason))
                    sent += 1
            elif kind == "done":
                break
        if generation.include_usage:
            responder.energy_j = self.server.node.stream_energy(stream)
            self._event(responder.usage_chunk(sent))
        self._event("[DONE]")


class EmulatorServer(ThreadingHTTPServer):
    """The emulator on ``(host, port)``; port 0 picks a free one (see :attr:`url`)."""

    daemon_threads = True
    request_queue_size = 1024  # many clients connect at once (a load test, a profile sweep)

    def __init__(
        self,
        node: EmulatedNode,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        model: str = UNNAMED_MODEL,
    ) -> None:
        if not is_loopback(host):
            raise ValueError(f"the emulator serves on loopback only, got host {host!r}")
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.node = node
        self.model = model
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` actually bound."""
        host, port = self.server_address[:2]
        host = str(host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Start the plant and serve in a background thread (tests)."""
        self.node.start()
        self._thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.05},  # how fast close() returns (0.5 s by default)
            name="emulator",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and stop the plant."""
        self.node.stop()
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5.0)
        self.server_close()
