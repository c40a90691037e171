"""The emulator's HTTP server (stdlib ``ThreadingHTTPServer``, loopback only).

Routes:

* ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE with ``stream: true``, one
  event per token as the plant's iterations produce them, ending with ``data: [DONE]``);
  ``GET /v1/models``; ``GET /health``;
* ``GET /metrics``: vLLM V1's page (:mod:`gpugov.study.emulate.metrics`);
* the emulated GPUs, NVML's calls over HTTP (``daemon/emulated.py`` is the client):
  ``GET /gpu`` (count), ``GET /gpu/<i>`` (identity, supported and max clocks),
  ``GET /gpu/<i>/sample`` (power, energy counter, temperature, SM clock, utilisation,
  clock-event reasons, power limit), ``POST /gpu/<i>/lock`` (``{"min_mhz", "max_mhz"}``)
  and ``POST /gpu/<i>/reset``. A failing call answers HTTP 500 with
  ``{"nvmlReturn": code}``, NVML's own return code. Nothing reveals the profile.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpugov.study.emulate.api import ApiError, Responder, models_body, parse_request, token_text
from gpugov.study.emulate.metrics import render_metrics
from gpugov.study.emulate.node import EmulatedNode

log = logging.getLogger(__name__)

_GPU_PATH = re.compile(r"^/gpu/(\d+)(/sample|/lock|/reset)?$")
STREAM_TIMEOUT_S = 3600.0


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: EmulatorServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ----------------------------------------------------------------- helpers
    def _send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._send_json(404, {"detail": "Not Found"})

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    # -------------------------------------------------------------------- GET
    def do_GET(self) -> None:
        node = self.server.node
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send_text(
                200,
                render_metrics(node, self.server.model),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        elif path == "/v1/models":
            self._send_json(200, models_body(self.server.model, node.max_model_len))
        elif path == "/health":
            self._send_text(200, "", "text/plain")
        elif path == "/gpu":
            self._send_json(200, {"count": len(node.simulations)})
        else:
            match = _GPU_PATH.match(path)
            if match is None or match.group(2) not in (None, "/sample"):
                self._not_found()
                return
            gpu = int(match.group(1))
            if gpu >= len(node.simulations):
                self._send_json(500, {"nvmlReturn": 2})  # INVALID_ARGUMENT: no such index
                return
            body = node.gpu_sample(gpu) if match.group(2) else node.gpu_info(gpu)
            self._send_json(500 if "nvmlReturn" in body else 200, body)

    # ------------------------------------------------------------------- POST
    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        raw = self._body()
        if path in ("/v1/completions", "/v1/chat/completions"):
            self._generate(raw, chat=path.endswith("chat/completions"))
            return
        match = _GPU_PATH.match(path)
        if match is None or match.group(2) not in ("/lock", "/reset"):
            self._not_found()
            return
        node = self.server.node
        gpu = int(match.group(1))
        if gpu >= len(node.simulations):
            self._send_json(500, {"nvmlReturn": 2})
            return
        if match.group(2) == "/reset":
            code = node.reset_clocks(gpu)
        else:
            try:
                body = json.loads(raw or b"{}")
                code = node.lock_clocks(gpu, int(body["min_mhz"]), int(body["max_mhz"]))
            except (ValueError, KeyError, TypeError):
                code = 2
        self._send_json(500 if code else 200, {"nvmlReturn": code})

    def _generate(self, raw: bytes, *, chat: bool) -> None:
        node = self.server.node
        try:
            generation = parse_request(
                raw, chat=chat, served_model=self.server.model, max_model_len=node.max_model_len
            )
            output_tokens, reason = node.natural_output_tokens(
                generation.max_tokens, generation.ignore_eos
            )
            stream = node.submit(generation.prompt_tokens, output_tokens, reason)
        except ApiError as error:
            self._send_json(error.status, error.body())
            return
        except ValueError as error:
            self._send_json(400, ApiError(str(error)).body())
            return
        responder = Responder(generation)
        if not generation.stream:
            produced = self._wait(stream)
            if produced is None:
                self._send_json(
                    500,
                    ApiError("the server stopped", status=500, kind="InternalServerError").body(),
                )
                return
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
        except (BrokenPipeError, ConnectionResetError):
            log.debug("client left before the end of its stream")

    def _wait(self, stream: Any) -> int | None:
        while True:
            kind, value = stream.events.get(timeout=STREAM_TIMEOUT_S)
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
            kind, value = stream.events.get(timeout=STREAM_TIMEOUT_S)
            if kind == "abort":
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
        model: str = "gpugov-emulated",
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
        self._thread = threading.Thread(target=self.serve_forever, name="emulator", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and stop the plant."""
        self.node.stop()
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5.0)
        self.server_close()
