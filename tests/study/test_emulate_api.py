"""The emulator's OpenAI request parsing: its refusals read as vLLM's do."""

from __future__ import annotations

import json

import pytest

from gpugov.study.emulate.api import ApiError, parse_request

MODEL_LEN = 1000


def _refusal(body: dict[str, object], *, chat: bool) -> str:
    with pytest.raises(ApiError) as caught:
        parse_request(
            json.dumps(body).encode(), chat=chat, served_model="m", max_model_len=MODEL_LEN
        )
    assert caught.value.status == 400
    return str(caught.value)


@pytest.mark.parametrize("content", ["x" * 4000, "x" * 4100])
def test_a_chat_prompt_as_long_as_the_model_without_max_tokens_is_refused_by_its_length(
    content: str,
) -> None:
    """With no max_tokens the completion's share is what the model has left; a prompt that
    fills it was refused with a completion of 0 or fewer tokens ('you requested 1000
    tokens (1029 in the messages, -29 in the completion)'); vLLM states the prompt's."""
    prompt = 4 + len(content) // 4
    message = _refusal({"messages": [{"role": "user", "content": content}]}, chat=True)
    assert message == (
        f"This model's maximum context length is {MODEL_LEN} tokens. However, you requested "
        f"{prompt} tokens in the messages, Please reduce the length of the messages."
    )


def test_a_max_tokens_past_the_model_states_both_shares() -> None:
    message = _refusal({"prompt": [1] * 990, "max_tokens": 11}, chat=False)
    assert "you requested 1001 tokens (990 in the messages, 11 in the completion)" in message


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_a_zero_length_is_refused_naming_the_field_sent(key: str) -> None:
    """``max_completion_tokens: 0`` was refused as 'max_tokens must be at least 1'."""
    message = _refusal({"messages": [{"role": "user", "content": "hi"}], key: 0}, chat=True)
    assert message == f"{key} must be at least 1, got 0."


@pytest.mark.parametrize("chat", [False, True])
def test_a_body_nested_past_the_json_parser_is_a_400(chat: bool) -> None:
    """Arrays nested 100,000 deep raised RecursionError out of the request's parse."""
    with pytest.raises(ApiError) as caught:
        parse_request(
            b"[" * 100_000 + b"]" * 100_000,
            chat=chat,
            served_model="m",
            max_model_len=MODEL_LEN,
        )
    assert caught.value.status == 400
    assert str(caught.value) == "JSON decode error: nested too deeply"
