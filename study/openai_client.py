"""A small streaming client for OpenAI-compatible servers (vLLM, SGLang, ``gpugov emulate``).

One request, streamed: the client records when it sent the request, when each token event
arrived and how the stream ended. The prompt is either token ids (``prompt`` as a list of
integers, exact on vLLM, SGLang and the emulator) or text of the right length
(``" the"`` repeated: four characters, which is one token by the emulator's rule and for
common BPE tokenizers). ``ignore_eos: true`` makes the output exactly ``max_tokens``.

A server started with an API key (vLLM's ``--api-key``) refuses a request without it
(HTTP 401): every call here takes ``api_key``, sent as ``Authorization: Bearer KEY``.
A failed request carries its message (``error``) and the kind it is grouped by
(``error_kind``: the HTTP status and the error's ``type``, or the failure's class).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gpugov.daemon.addresses import host_name_problem

if TYPE_CHECKING:
    import argparse

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
    error_kind: str | None = None
    """What the failure is, for grouping failed requests: ``HTTP 400 BadRequestError``
    (the status and the error body's ``type``), ``HTTP 502``, ``ConnectionRefusedError``,
    ``stream ended early``; never a request's own numbers or ids, which its ``error``
    message may hold."""
    finish_reason: str | None = None
    """The stream's last ``finish_reason`` (``length``, ``stop``, ``abort``); None where
    it sent none: why a stream ended short of ``max_tokens``."""
    usage: dict[str, Any] | None = None
    """The stream's ``usage`` object when the server sent one (``stream_options``
    ``include_usage``; ``gpugov emulate`` adds the request's true energy to it)."""

    @property
    def ttft_s(self) -> float | None:
        """Time to first token as the client saw it."""
        return self.token_s[0] - self.sent_s if self.token_s else None

    @property
    def output_tokens(self) -> int:
        """Tokens the server generated: its ``usage.completion_tokens`` when it sent one;
        else ``max_tokens`` where a finished stream ended at its length limit (the output
        ``ignore_eos`` asked for); else one per token event, a lower bound where a server
        sends several tokens in one event (vLLM's and SGLang's ``--stream-interval``,
        speculative decoding)."""
        counted = len(self.token_s)
        usage = self.usage.get("completion_tokens") if self.usage else None
        if isinstance(usage, int) and not isinstance(usage, bool) and usage >= counted:
            return usage
        if self.end_s is not None and self.finish_reason == "length":
            return max(counted, self.max_tokens)
        return counted

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (the first to the last token
        event over :attr:`output_tokens` less one, as vLLM's benchmark counts it)."""
        tokens = self.output_tokens
        if len(self.token_s) < 2 or tokens < 2:
            return None
        return (self.token_s[-1] - self.token_s[0]) / (tokens - 1)


MAX_EVENT_LINE_BYTES = 1 << 20
"""Longest server-sent event line read (1 MiB; a token event is a few hundred bytes)."""


API_KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,4096}")
"""An API key as an HTTP header carries it: visible ASCII, no spaces, at most 4 KiB."""


def check_api_key(key: str, source: str) -> None:
    """Refuse a key no ``Authorization`` header can carry, naming ``source`` (the flag or
    variable it came from) and never the key.

    Raises:
        ValueError: one line.
    """
    if not API_KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"{source}: an API key is 1-4096 visible ASCII characters without spaces "
            f"(this one has {len(key)} characters)"
        )


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer KEY`` for a key, nothing without one."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


API_KEY_VARIABLE = "OPENAI_API_KEY"
"""The environment variable ``--api-key`` defaults to (the OpenAI clients' own)."""


def resolve_api_key(flag_value: str | None) -> str | None:
    """The API key to send: ``--api-key``'s value, else ``OPENAI_API_KEY``'s when set and
    not empty, else none. Shared by ``gpugov load`` and ``gpugov profile``.

    Raises:
        UsageError: a key no HTTP header can carry, naming its source (never the key).
    """
    from gpugov.daemon.cli_support import UsageError

    if flag_value is not None:
        key, source = flag_value, "--api-key"
    else:
        key, source = os.environ.get(API_KEY_VARIABLE, ""), API_KEY_VARIABLE
        if not key:
            return None
    try:
        check_api_key(key, source)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return key


def add_api_key_argument(parser: argparse.ArgumentParser) -> None:
    """``--api-key KEY`` (default: ``OPENAI_API_KEY``), for a server started with one."""
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"API key for a server started with one (vLLM --api-key), sent as "
        f"'Authorization: Bearer KEY' (default: ${API_KEY_VARIABLE} when set; never printed)",
    )


def _error_type(event: dict[str, Any]) -> str | None:
    """The error body's ``type`` (vLLM: ``BadRequestError``, ``NotFoundError``), in
    either shape, when it is a short word."""
    inner = event.get("error")
    kind = inner.get("type") if isinstance(inner, dict) else event.get("type")
    if isinstance(kind, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", kind):
        return kind
    return None


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
    problem = host_name_problem(parts.hostname)
    if problem is not None:  # http.client raised on it at the first request
        raise EngineUnreachable(f"--url: {problem}; expected http://HOST:PORT")
    prefix = parts.path.rstrip("/")
    prefix = prefix.removesuffix("/v1")
    return parts.hostname, port or 80, prefix


def served_models(url: str, timeout_s: float = 5.0, *, api_key: str | None = None) -> list[Any]:
    """The entries ``GET /v1/models`` lists (an object's ``id`` is a model's name): the one
    read of the list that every question about the served models asks.

    Raises:
        EngineUnreachable: refused, timed out, or not an OpenAI-compatible model list.
    """
    host, port, prefix = base_url(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", f"{prefix}/v1/models", headers=auth_headers(api_key))
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
    if not isinstance(models, list):
        raise EngineUnreachable(f"{url}/v1/models is not an OpenAI model list")
    return models


def served_model(url: str, timeout_s: float = 5.0, *, api_key: str | None = None) -> str:
    """The first model id ``GET /v1/models`` lists.

    Raises:
        EngineUnreachable: refused, timed out, or not an OpenAI-compatible answer.
    """
    models = served_models(url, timeout_s, api_key=api_key)
    if not models:
        raise EngineUnreachable(f"{url}/v1/models lists no model")
    first = models[0].get("id") if isinstance(models[0], dict) else None
    if not isinstance(first, str) or not first:
        raise EngineUnreachable(f"{url}/v1/models: its first model has no id")
    return first


def served_max_model_len(
    url: str, model: str, timeout_s: float = 5.0, *, api_key: str | None = None
) -> int | None:
    """``max_model_len`` of ``model`` as ``GET /v1/models`` lists it (vLLM, SGLang and the
    emulator say it); None when the server does not say, or does not answer."""
    try:
        models = served_models(url, timeout_s, api_key=api_key)
    except EngineUnreachable:
        return None
    for entry in models:
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("max_model_len")
            is_count = isinstance(value, int) and not isinstance(value, bool) and value > 0
            return value if is_count else None
    return None


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


ERROR_BODY_BYTES = 4000
"""How much of an error answer's body is read: enough for vLLM's JSON error with a long
validation message (its message is then cut to 200 characters, any other body to its
first 300 bytes)."""


def _http_failure(response: http.client.HTTPResponse) -> tuple[str, str]:
    """A failed request's answer: its message in one line, status, reason and the error's
    message (vLLM's error shape), else the body's first 300 bytes (``HTTP 413 Request
    Entity Too Large: request body of 36000099 bytes is too large``); and its kind, the
    status and the error's ``type`` when the body gives one (``HTTP 413``,
    ``HTTP 400 BadRequestError``)."""
    raw = response.read(ERROR_BODY_BYTES)
    # One line (an HTML error page), of the body's first 300 bytes.
    text = " ".join(raw[:300].decode(errors="replace").split())
    kind = f"HTTP {response.status}"
    with contextlib.suppress(ValueError):
        body = json.loads(raw)
        if isinstance(body, dict) and ("error" in body or body.get("object") == "error"):
            text = _error_message(body)
            error_type = _error_type(body)
            kind = f"{kind} {error_type}" if error_type else kind
    status = f"HTTP {response.status} {response.reason}".rstrip()
    if response.status == 401:  # vLLM --api-key's answer to a missing or wrong key
        text = f"{text} " if text else ""
        text += "(a missing or wrong API key: --api-key or OPENAI_API_KEY)"
    return (f"{status}: {text}" if text else status), kind


def _http_error(response: http.client.HTTPResponse) -> str:
    """A failed request's answer in one line (:func:`_http_failure`)."""
    return _http_failure(response)[0]


def _answer_to_a_cut_request(
    connection: http.client.HTTPConnection, size: int, timeout_s: float
) -> tuple[str, str]:
    """What to report of a request whose ``size``-byte body the server stopped taking (it
    closed the connection): its answer when it sent one first (:func:`_http_error`), else
    that the connection was closed while the body was being sent (with its kind)."""
    try:
        if connection.sock is not None:
            connection.sock.settimeout(min(timeout_s, ANSWER_WAIT_S))
        return _http_failure(connection.getresponse())
    except (OSError, http.client.HTTPException):
        return (
            f"the server closed the connection while the request body of {size} bytes "
            "was being sent",
            "connection closed while sending",
        )


def stream_completion(
    url: str,
    body: dict[str, Any],
    *,
    timeout_s: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
    barrier: threading.Barrier | None = None,
    api_key: str | None = None,
) -> StreamTiming:
    """POST one streamed completion and time every token event; never raises for the
    server's failures (they land in ``error`` and ``error_kind``). With ``barrier``,
    connect first and send when every party has connected (a batch that starts
    together); with ``api_key``, send it as a bearer token."""
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
                headers={
                    "Content-Type": "application/json",
                    "Accept": "text/event-stream",
                    **auth_headers(api_key),
                },
            )
        except ConnectionError:
            # The server closed the connection while the body was still going out: most
            # often it answered first (the emulator's 413 for a body over its limit) and
            # that answer is waiting to be read; the send's broken pipe says nothing.
            timing.error, timing.error_kind = _answer_to_a_cut_request(
                connection, len(data), timeout_s
            )
            return timing
        response = connection.getresponse()
        if response.status != 200:
            timing.error, timing.error_kind = _http_failure(response)
            return timing
        finished = False
        while True:
            line = response.readline(MAX_EVENT_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_EVENT_LINE_BYTES:
                timing.error = f"stream event longer than {MAX_EVENT_LINE_BYTES} bytes"
                timing.error_kind = "stream event too long"
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
                timing.error_kind = "malformed stream event"
                return timing
            if "error" in event:  # vLLM reports a failure mid-stream as an error event
                timing.error = f"error event in the stream: {_error_message(event)}"
                error_type = _error_type(event)
                timing.error_kind = "error event" + (f" {error_type}" if error_type else "")
                return timing
            usage = event.get("usage")
            if isinstance(usage, dict):
                timing.usage = usage
            choices = event.get("choices") or []
            if choices and isinstance(choices[0], dict) and choices[0].get("text"):
                timing.token_s.append(now)
            if choices and isinstance(choices[0], dict):
                reason = choices[0].get("finish_reason")
                if isinstance(reason, str):
                    timing.finish_reason = reason[:40]
        if not finished:  # the server went away: the request did not complete
            timing.error = "the stream ended without [DONE] (connection closed early)"
            timing.error_kind = "stream ended early"
            return timing
        timing.end_s = clock()
    except (OSError, http.client.HTTPException) as error:
        timing.error = f"{type(error).__name__}: {error}"
        timing.error_kind = type(error).__name__
    finally:
        connection.close()
    return timing
