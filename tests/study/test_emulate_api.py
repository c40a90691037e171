"""The emulator's OpenAI request parsing: its refusals read as vLLM's do."""

from __future__ import annotations

import json

import pytest
from synthetic import make_plant

from gpugov.study.emulate.api import ApiError, Generation, parse_request
from gpugov.study.emulate.node import EmulatedNode

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


def _generation(body: dict[str, object]) -> Generation:
    return parse_request(
        json.dumps(body).encode(), chat=False, served_model="m", max_model_len=MODEL_LEN
    )


def test_min_tokens_holds_off_the_end_of_sequence_as_vllms_does() -> None:
    """``min_tokens`` was ignored: a request asking for at least 200 tokens without
    ignore_eos ended at the drawn end-of-sequence (mean 256 tokens, often far fewer)."""
    node = EmulatedNode(make_plant(), seed=3)
    generation = _generation({"prompt": "hi", "max_tokens": 400, "min_tokens": 200})
    assert generation.min_tokens == 200
    lengths = [
        node.natural_output_tokens(generation.max_tokens, False, generation.min_tokens)[0]
        for _ in range(200)
    ]
    assert min(lengths) == 200 and max(lengths) == 400
    plain = [node.natural_output_tokens(400, False)[0] for _ in range(200)]
    assert min(plain) < 200  # without min_tokens the draw ends earlier at times


@pytest.mark.parametrize(
    ("min_tokens", "refusal"),
    [
        (-1, "min_tokens must be greater than or equal to 0, got -1."),
        (11, "min_tokens must be less than or equal to max_tokens=10, got 11."),
        (2.5, "min_tokens must be an integer, got 2.5"),
    ],
)
def test_a_min_tokens_vllm_refuses_is_refused(min_tokens: object, refusal: str) -> None:
    assert _refusal({"prompt": "hi", "max_tokens": 10, "min_tokens": min_tokens}, chat=False) == (
        refusal
    )


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]]])
def test_a_batch_of_prompts_is_refused_as_a_batch(prompt: object) -> None:
    """A batch of two prompts was refused as 'prompt must be a list of non-negative
    integer token ids', which it is not meant to be."""
    assert _refusal({"prompt": prompt, "max_tokens": 2}, chat=False) == (
        "prompt is a batch of 2 prompts; this server takes one prompt per request"
    )
