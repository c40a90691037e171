"""OpenAI-compatible request parsing and response bodies, shaped as vLLM's server shapes them.

Prompt length: ``prompt_token_ids`` or a list of token ids counts exactly; text counts
``ceil(len(text) / 4)`` tokens (about four characters per token, OpenAI's rule of thumb),
at least one; a chat request adds 4 tokens per message for the chat template.
Output length: ``max_tokens`` (``max_completion_tokens`` for chat) with
``ignore_eos: true``; otherwise an end-of-sequence token ends it earlier at random, never
before ``min_tokens`` (:meth:`EmulatedNode.natural_output_tokens`). Errors are current
vLLM's ``ErrorResponse``:
``{"error": {"message": ..., "type": "BadRequestError", "param": null, "code": 400}}``.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
DEFAULT_COMPLETION_MAX_TOKENS = 16
WORDS = (" the", " model", " emits", " one", " token", " per", " event", " here", ".")


class ApiError(Exception):
    """A request the server refuses; ``body`` is vLLM's error JSON."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """Current vLLM's ``ErrorResponse``: one ``error`` object (``ErrorInfo``)."""
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": None,
                "code": self.status,
            }
        }


@dataclass(frozen=True, slots=True)
class Generation:
    """A parsed request: what to generate and how to answer."""

    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    min_tokens: int = 0
    """Tokens generated before an end-of-sequence may end the output (vLLM's
    ``min_tokens``)."""


def text_tokens(text: str) -> int:
    """Tokens of a text prompt by the documented rule: ``ceil(len / 4)``, at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def _token_ids(value: Any, field: str) -> int:
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise ApiError(f"{field} must be a list of non-negative integer token ids")
    return len(value)


def _prompt_length(body: dict[str, Any]) -> int:
    if "prompt_token_ids" in body:
        ids = body["prompt_token_ids"]
        if not isinstance(ids, list):
            raise ApiError("prompt_token_ids must be a list of integers")
        count = _token_ids(ids, "prompt_token_ids")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        elif (
            isinstance(prompt, list)
            and len(prompt) > 1
            and all(isinstance(item, str | list) for item in prompt)
        ):
            raise ApiError(
                f"prompt is a batch of {len(prompt)} prompts; this server takes one "
                "prompt per request"
            )
        if isinstance(prompt, str):
            count = text_tokens(prompt) if prompt else 0
        elif isinstance(prompt, list):
            count = _token_ids(prompt, "prompt")
        elif prompt is None:
            raise ApiError("Either prompt or prompt_embeds must be provided and non-empty.")
        else:
            raise ApiError("prompt must be a string or a list of token ids (batches of one)")
    if count < 1:
        raise ApiError("Either prompt or prompt_embeds must be provided and non-empty.")
    return count


def _chat_length(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list")
    total = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ApiError(f"messages[{index}] must be an object with a role")
        content = message.get("content", "")
        if isinstance(content, list):  # content parts: count the text ones
            content = "".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        if not isinstance(content, str):
            raise ApiError(f"messages[{index}].content must be a string or a list of parts")
        total += CHAT_TOKENS_PER_MESSAGE + (text_tokens(content) if content else 0)
    return total


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(f"{key} must be an integer, got {value!r}")
    if value < 1:
        raise ApiError(f"{key} must be at least 1, got {value}.")
    return value


def parse_request(raw: bytes, *, chat: bool, served_model: str, max_model_len: int) -> Generation:
    """Validate a ``/v1/completions`` or ``/v1/chat/completions`` body.

    Raises:
        ApiError: not JSON, a bad field, an unknown model, or too long for the model.
    """
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(f"JSON decode error: {error}") from error
    except RecursionError:  # arrays or objects nested deeper than the parser goes
        raise ApiError("JSON decode error: nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model", served_model)
    if model is not None and model != served_model:
        raise ApiError(f"The model `{model}` does not exist.", status=404, kind="NotFoundError")
    n = body.get("n", 1)
    if n != 1:
        raise ApiError("n must be 1 on this server")
    stream = body.get("stream", False)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(stream, bool) or not isinstance(ignore_eos, bool):
        raise ApiError("stream and ignore_eos must be booleans")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError("stream_options must be an object")
    if options and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.")
    prompt_tokens = _chat_length(body) if chat else _prompt_length(body)
    requested = _positive_int(body, "max_completion_tokens") if chat else None
    requested = requested or _positive_int(body, "max_tokens")
    if requested is None and chat:
        # vLLM's default: what the model has left after the prompt, refused when none is.
        if prompt_tokens >= max_model_len:
            raise ApiError(
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"you requested {prompt_tokens} tokens in the messages, Please reduce the "
                "length of the messages."
            )
        requested = max_model_len - prompt_tokens
    elif requested is None:
        requested = DEFAULT_COMPLETION_MAX_TOKENS
    if prompt_tokens + requested > max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the messages, "
            f"{requested} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    min_tokens = body.get("min_tokens")
    min_tokens = 0 if min_tokens is None else min_tokens
    if not isinstance(min_tokens, int) or isinstance(min_tokens, bool):
        raise ApiError(f"min_tokens must be an integer, got {min_tokens!r}")
    if min_tokens < 0:
        raise ApiError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > requested:
        raise ApiError(
            f"min_tokens must be less than or equal to max_tokens={requested}, got {min_tokens}."
        )
    return Generation(
        chat=chat,
        model=served_model,
        prompt_tokens=prompt_tokens,
        max_tokens=requested,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        min_tokens=min_tokens,
    )


def token_text(position: int) -> str:
    """The text of output token ``position`` (a fixed cycle of words)."""
    return WORDS[position % len(WORDS)]


class Responder:
    """Builds the response objects of one request (ids and timestamps fixed at start)."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        prefix = "chatcmpl" if generation.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.energy_j: tuple[float, float] | None = None
        """(prefill J, decode J) for ``usage`` (the plant's truth), once known."""
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if generation.chat else "text_completion"

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        """The ``usage`` object, with the request's true energy when known (``energy_j``,
        ``prefill_energy_j``, ``decode_energy_j``: the plant's attribution, in joules)."""
        prompt = self.generation.prompt_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if self.energy_j is not None:
            prefill, decode = self.energy_j
            usage["energy_j"] = prefill + decode
            usage["prefill_energy_j"] = prefill
            usage["decode_energy_j"] = decode
        return usage

    def chunk(self, text: str | None, finish_reason: str | None, *, first: bool = False) -> dict:
        """One streamed event."""
        if self.generation.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None}
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = None
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.generation.model,
            "choices": [choice],
        }

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        """The final usage-only event (``stream_options.include_usage``)."""
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.generation.model,
            "choices": [],
            "usage": self.usage(completion_tokens),
        }

    def complete(self, completion_tokens: int, finish_reason: str) -> dict[str, Any]:
        """The whole non-streamed response."""
        text = "".join(token_text(i) for i in range(completion_tokens))
        if self.generation.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
            kind = "text_completion"
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = None
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.generation.model,
            "choices": [choice],
            "usage": self.usage(completion_tokens),
        }


def models_body(served_model: str, max_model_len: int) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {
        "object": "list",
        "data": [
            {
                "id": served_model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": served_model,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [],
            }
        ],
    }
