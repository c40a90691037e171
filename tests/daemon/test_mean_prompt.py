"""The mean prompt behind the queued requests' prefill backlog: prompt tokens over the
requests whose prompts the engine's prompt counter holds, which differ by engine (vLLM
counts a prompt at its first token, SGLang at the request's end, TGI when it validates
the request)."""

from __future__ import annotations

import pytest
from synthetic import IdleGpu

from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.observer import DomainObserver
from gpugov.plant.types import ServingObservation

PROMPT = 1000.0
"""Every request's prompt, in tokens."""


def _first_observation(page: str) -> ServingObservation:
    """What the observer reads from ``page`` at its first scrape."""
    observer = DomainObserver(
        [IdleGpu()],
        ScrapedSource("http://e/metrics", fetch=lambda url, t: page),
        stale_after_s=30.0,
    )
    return observer.observe(0.0, 0, None).observation


def _backlog(page: str) -> float:
    """The prefill backlog the observer reads from ``page`` at its first scrape."""
    return _first_observation(page).prefill_remaining_tokens


def test_sglang_mean_prompt_is_over_the_finished_requests() -> None:
    """SGLang counts a prompt when its request finishes: 10 finished of 110 with a first
    token (100 decoding) is a mean prompt of 1,000, not 10,000 / 110 = 91, which read
    20 queued prompts as 1,818 tokens of prefill where they hold 20,000."""
    labels = 'model_name="m",tp_rank="0"'
    page = "\n".join(
        (
            f"sglang:num_running_reqs{{{labels}}} 100",
            f"sglang:num_queue_reqs{{{labels}}} 20",
            f'sglang:prompt_tokens_total{{model_name="m"}} {10 * PROMPT}',
            'sglang:generation_tokens_total{model_name="m"} 2000',
            'sglang:num_requests_total{model_name="m"} 10',
            'sglang:time_to_first_token_seconds_sum{model_name="m"} 22.0',
            'sglang:time_to_first_token_seconds_count{model_name="m"} 110',
            "",
        )
    )
    assert _backlog(page) == pytest.approx(20 * PROMPT)


def test_tgi_mean_prompt_is_over_the_validated_requests() -> None:
    """TGI records a prompt's length when it validates the request, before it is queued:
    130 validated, 10 finished is a mean prompt of 1,000, not 130,000 / 10 = 13,000,
    which read 100 queued prompts as 1.3 million tokens of prefill."""
    page = "\n".join(
        (
            "tgi_batch_current_size 20",
            "tgi_queue_size 100",
            "tgi_request_count 130",
            "tgi_request_success 10",
            f"tgi_request_input_length_sum {130 * PROMPT}",
            "tgi_request_input_length_count 130",
            "tgi_request_generated_tokens_sum 2000",
            "tgi_request_generated_tokens_count 10",
            "",
        )
    )
    assert _backlog(page) == pytest.approx(100 * PROMPT)


def test_vllm_mean_prompt_is_over_the_first_tokens() -> None:
    """vLLM counts a prompt once prefilled, at its first token: the TTFT count."""
    labels = 'engine="0",model_name="m"'
    page = "\n".join(
        (
            f"vllm:num_requests_running{{{labels}}} 100",
            f"vllm:num_requests_waiting{{{labels}}} 20",
            f"vllm:prompt_tokens_total{{{labels}}} {110 * PROMPT}",
            f"vllm:generation_tokens_total{{{labels}}} 2000",
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} 10',
            f"vllm:time_to_first_token_seconds_sum{{{labels}}} 22.0",
            f"vllm:time_to_first_token_seconds_count{{{labels}}} 110",
            "",
        )
    )
    assert _backlog(page) == pytest.approx(20 * PROMPT)


def _observed_prompt_tokens(page: str) -> float:
    """The prompt tokens the observer reports (the work windows read) at the first scrape."""
    return _first_observation(page).prompt_tokens_total


def test_sglang_prompt_tokens_as_computed_where_it_counts_them() -> None:
    """SGLang counts a prompt in sglang:prompt_tokens_total when its request finishes,
    windows after its prefill ran, cached tokens included; newer releases count the
    prompt tokens their prefills compute as they run (sglang:realtime_tokens_total,
    mode="prefill_compute"), which are the work a window did, as vLLM's tokens per step
    are. Without that series the prompt counter stays."""
    labels = 'model_name="m",tp_rank="0"'
    base = "\n".join(
        (
            f"sglang:num_running_reqs{{{labels}}} 4",
            f"sglang:num_queue_reqs{{{labels}}} 0",
            'sglang:prompt_tokens_total{model_name="m"} 5000',
            'sglang:num_requests_total{model_name="m"} 5',
            "",
        )
    )
    assert _observed_prompt_tokens(base) == 5000.0
    computed = base + "".join(
        f'sglang:realtime_tokens_total{{{labels},mode="{mode}"}} {value}\n'
        for mode, value in (("prefill_compute", 7000), ("prefill_cache", 2500), ("decode", 900))
    )
    assert _observed_prompt_tokens(computed) == 7000.0
