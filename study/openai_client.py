"""A small streaming client for OpenAI-compatible servers (vLLM, SGLang, ``gpugov emulate``).

One request, streamed: the client records when it sent the request, when each token event
arrived and how the stream ended. The prompt is either token ids (``prompt`` as a list of
integers, exact on vLLM, SGLang and the emulator) or text of the right length
(``" the"`` repeated: four characters, which is one token by the emulator's rule and for
common BPE tokenizers). ``ignore_eos: true`` makes the output exactly ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

PromptMode = Literal["ids", "text"]
TOKEN_ID_BASE = 1000  # ids 1000-1999: ordinary vocabulary entries for every common tokenizer


class EngineUnreachable(ValueError):
    """The engine's OpenAI endpoint does not answer; the message says where."""


@dataclass
class StreamTiming:
    """What the client saw of one streamed request (``time.monotonic`` seconds)."""

    prompt_tokens: int
    max_tokens: int
    sent_s: float
    token_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    """The stream's ``usage`` object when the server sent one (``stream_options``
    ``include_usage``; ``gpugov emulate`` adds the request's true energy to it)."""

    @property
    def ttft_s(self) -> float | None:
        """Time to first token as the client saw it."""
        return self.token_s[0] - self.sent_s if self.token_s else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if len(self.token_s) < 2:
            return None
        return (self.token_s[-1] - self.token_s[0]) / (len(self.token_s) - 1)


MAX_EVENT_LINE_BYTES = 1 << 20
"""Longest server-sent event line read (1 MiB; a token event is a few hundred bytes)."""


def _error_message(event: dict[str, Any]) -> str:
    """The message of an error body, in vLLM's current shape (``{"error": {...}}``) or
    its older flat one (``{"object": "error", "message": ...}``), on one line (pydantic's
    validation messages span several)."""
    inner = event.get("error")
    message = (
        inner.get("message", inner) if isinstance(inner, dict) else event.get("message", inner)
    )
    return " ".join(str(message).split())[:200]


def _shown(payload: bytes) -> str:
    """The start of a malformed event's data on one line (its first 80 bytes, control
    characters escaped)."""
    text = payload[:80].decode(errors="replace")
    shown = repr(text)[1:-1]
    return f"{shown}..." if len(payload) > 80 else shown


def base_url(url: str) -> tuple[str, int, str]:
    """``(host, port, path prefix)`` of an engine URL given with or without ``/v1``.

    Raises:
        EngineUnreachable: not an http:// URL.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:  # a bad IPv6 literal, a port that is not a number or out of range
        parts, port = None, None
    if parts is None or parts.scheme != "http" or not parts.hostname or port == 0:
        shown = url if len(url) <= 200 else f"{url[:200]}..."
        raise EngineUnreachable(f"--url {shown}: expected http://HOST:PORT")
    prefix = parts.path.rstrip("/")
    prefix = prefix.removesuffix("/v1")
    return parts.hostname, port or 80, prefix


def served_model(url: str, timeout_s: float = 5.0) -> str:
    """The first model id ``GET /v1/models`` lists.

    Raises:
        EngineUnreachable: refused, timed out, or not an OpenAI-compatible answer.
    """
    host, port, prefix = base_url(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", f"{prefix}/v1/models")
        response = connection.getresponse()
        if response.status != 200:  # its reason and message, as a failed request's
            answer = _http_error(response)
        else:
            answer, body = None, response.read()
    except (OSError, http.client.HTTPException) as error:
        raise EngineUnreachable(f"engine at {url} does not answer: {error}") from error
    finally:
        connection.close()
    if answer is not None:
        raise EngineUnreachable(f"{url}/v1/models: {answer}")
    try:
        models = json.loads(body)["data"]
    except (ValueError, KeyError, TypeError) as error:
        raise EngineUnreachable(f"{url}/v1/models is not an OpenAI model list") from error
    if not isinstance(models, list) or not models:
        raise EngineUnreachable(f"{url}/v1/models lists no model")
    first = models[0].get("id") if isinstance(models[0], dict) else None
    if not isinstance(first, str) or not first:
        raise EngineUnreachable(f"{url}/v1/models: its first model has no id")
    return first


def served_max_model_len(url: str, model: str, timeout_s: float = 5.0) -> int | None:
    """``max_model_len`` of ``model`` as ``GET /v1/models`` lists it (vLLM, SGLang and the
    emulator say it); None when the server does not say, or does not answer."""
    host, port, prefix = base_url(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", f"{prefix}/v1/models")
        response = connection.getresponse()
        entries = json.loads(response.read())["data"] if response.status == 200 else []
        for entry in entries:
            if isinstance(entry, dict) and entry.get("id") == model:
                value = entry.get("max_model_len")
                is_count = isinstance(value, int) and not isinstance(value, bool) and value > 0
                return value if is_count else None
        return None
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
        return None
    finally:
        connection.close()


def request_body(
    model: str,
    prompt_tokens: int,
    max_tokens: int,
    mode: PromptMode = "ids",
    salt: int = 0,
    include_usage: bool = False,
) -> dict[str, Any]:
    """A streamed ``/v1/completions`` body of exactly ``prompt_tokens`` and ``max_tokens``
    (with ``include_usage``, asking for the final ``usage`` event)."""
    if mode == "ids":
        prompt: Any = [TOKEN_ID_BASE + (salt + i) % 1000 for i in range(prompt_tokens)]
    else:
        prompt = " the" * prompt_tokens
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": int(max_tokens),
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.0,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


ANSWER_WAIT_S = 5.0
"""Longest wait for the answer of a server that closed the connection mid-request."""


def _http_error(response: http.client.HTTPResponse) -> str:
    """A failed request's answer in one line: status, reason and the error's message
    (vLLM's error shape), else the body's first 300 bytes: ``HTTP 413 Request Entity Too
    Large: request body of 36000099 bytes is too large``."""
    raw = response.read(300)
    text = " ".join(raw.decode(errors="replace").split())  # one line (an HTML error page)
    with contextlib.suppress(ValueError):
        body = json.loads(raw)
        if isinstance(body, dict) and "error" in body:
            text = _error_message(body)
    status = f"HTTP {response.status} {response.reason}".rstrip()
    return f"{status}: {text}" if text else status


def _answer_to_a_cut_request(
    connection: http.client.HTTPConnection, size: int, timeout_s: float
) -> str:
    """What to report of a request whose ``size``-byte body the server stopped taking (it
    closed the connection): its answer when it sent one first (:func:`_http_error`), else
    that the connection was closed while the body was being sent."""
    try:
        if connection.sock is not None:
            connection.sock.settimeout(min(timeout_s, ANSWER_WAIT_S))
        return _http_error(connection.getresponse())
    except (OSError, http.client.HTTPException):
        return (
            f"the server closed the connection while the request body of {size} bytes "
            "was being sent"
        )


def stream_completion(
    url: str,
    body: dict[str, Any],
    *,
    timeout_s: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
    barrier: threading.Barrier | None = None,
) -> StreamTiming:
    """POST one streamed completion and time every token event; never raises for the
    server's failures (they land in ``error``). With ``barrier``, connect first and send
    when every party has connected (a batch that starts together)."""
    host, port, prefix = base_url(url)
    prompt = body["prompt"]
    timing = StreamTiming(
        prompt_tokens=len(prompt) if isinstance(prompt, list) else len(prompt) // 4,
        max_tokens=int(body["max_tokens"]),
        sent_s=clock(),
    )
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        data = json.dumps(body).encode()
        if barrier is not None:
            try:
                connection.connect()
            except OSError:
                barrier.abort()  # release the others at once; this failure is reported
                raise
            # A party that failed breaks the barrier: send anyway, its error is reported.
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=min(timeout_s, 30.0))
        timing.sent_s = clock()
        if connection.sock is None:
            connection.connect()  # a refusal is reported below, as any failure to connect
        try:
            connection.request(
                "POST",
                f"{prefix}/v1/completions",
                body=data,
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
        except ConnectionError:
            # The server closed the connection while the body was still going out: most
            # often it answered first (the emulator's 413 for a body over its limit) and
            # that answer is waiting to be read; the send's broken pipe says nothing.
            timing.error = _answer_to_a_cut_request(connection, len(data), timeout_s)
            return timing
        response = connection.getresponse()
        if response.status != 200:
            timing.error = _http_error(response)
            return timing
        finished = False
        while True:
            line = response.readline(MAX_EVENT_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_EVENT_LINE_BYTES:
                timing.error = f"stream event longer than {MAX_EVENT_LINE_BYTES} bytes"
                return timing
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload:  # an empty data field carries no event
                continue
            if payload == b"[DONE]":
                finished = True
                break
            now = clock()
            try:
                event = json.loads(payload)
            except ValueError:
                event = None
            if not isinstance(event, dict):  # no OpenAI-compatible server sends one
                timing.error = f"malformed stream event: {_shown(payload)}"
                return timing
            if "error" in event:  # vLLM reports a failure mid-stream as an error event
                timing.error = f"error event in the stream: {_error_message(event)}"
                return timing
            usage = event.get("usage")
            if isinstance(usage, dict):
                timing.usage = usage
            choices = event.get("choices") or []
            if choices and isinstance(choices[0], dict) and choices[0].get("text"):
                timing.token_s.append(now)
        if not finished:  # the server went away: the request did not complete
            timing.error = "the stream ended without [DONE] (connection closed early)"
            return timing
        timing.end_s = clock()
    except (OSError, http.client.HTTPException) as error:
        timing.error = f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    return timing
