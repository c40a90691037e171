"""Which engine instance a page is: the ``_created`` series of its counters and histograms
(prometheus_client's creation time of each series, set again when an engine restarts)
tell a restart, or another engine behind the URL, where no counter went back."""

from __future__ import annotations

import logging
import math
import re

import pytest
from daemon_support import fixture_text
from synthetic import IdleGpu

from gpugov.daemon.engine_sources import SglangSource, VllmSource
from gpugov.daemon.observer import DomainObserver

CREATED = 1.7769301736e09
"""When the first engine's series were created (a real page's ``_created`` value)."""


def _page(scale: float, created: float) -> str:
    """The per-request-TPOT vLLM page (real format) with every counter and histogram
    series times ``scale`` and ``_created`` series at ``created``, as vLLM's default
    registry writes them."""
    lines = []
    for line in fixture_text("vllm_request_tpot_synthetic.txt").splitlines():
        name = line.split("{", 1)[0]
        if name.endswith(("_total", "_bucket", "_count", "_sum")):
            head, _, value = line.rpartition(" ")
            line = f"{head} {float(value) * scale!r}"
        lines.append(line)
    labels = 'engine="0",model_name="m"'
    for base in (
        "vllm:prompt_tokens",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    ):
        lines.append(f"vllm:{base[5:]}_created{{{labels}}} {created!r}")
    return "\n".join(lines) + "\n"


def _observe(pages: list[str]) -> list[object]:
    shown = [pages[0]]
    observer = DomainObserver(
        [IdleGpu()],
        VllmSource("http://e/metrics", fetch=lambda url, t: shown[0]),
        stale_after_s=30.0,
        ttft_slo_s=0.5,
        tpot_slo_s=0.05,
    )
    ticks = []
    for step, page in enumerate(pages):
        shown[0] = page
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None, (step, observed.engine_error)
        ticks.append(observed.observation)
    return ticks


def test_a_restart_whose_counters_rose_past_the_old_ones_is_another_engine() -> None:
    """The engine restarted between two scrapes and its new lifetime already passed the
    old one's on every counter (the daemon missed its first pages): no counter went back,
    so the difference of the two lifetimes was read as one window's work (200 first
    tokens judged, 40,000 prompt tokens). Its series' creation times changed: it is
    another engine, whose counters start from zero there."""
    old, new = _page(1.0, CREATED), _page(3.0, CREATED + 600.0)
    ticks = _observe([old, old, new, new])
    before, switched, after = ticks[1], ticks[2], ticks[3]
    assert switched.prompt_tokens_total <= before.prompt_tokens_total
    assert switched.ttft_recent_s is None  # no window across the two engines
    assert after.ttft_count_total == before.ttft_count_total == 0.0
    assert after.tpot_count_total == before.tpot_count_total == 0.0


def test_a_url_that_answers_for_two_engines_in_turn_counts_no_work_between_them() -> None:
    """A URL behind a load balancer over two vLLM replicas of one model (same labels):
    each page is the other engine's. Every other window went from the smaller lifetime
    to the larger and counted the difference as work: 70 first tokens judged each time,
    none of them served. Each page is another engine now, and idle pages count none."""
    first, second = _page(1.0, CREATED), _page(0.3, CREATED + 3600.0)
    ticks = _observe([first, second] * 4)
    assert {t.ttft_count_total for t in ticks[1:]} <= {None, 0.0}
    assert {t.tpot_count_total for t in ticks[1:]} <= {None, 0.0}
    assert all(t.ttft_recent_s is None for t in ticks)


def test_the_same_engine_scraped_again_is_one_engine() -> None:
    """Unchanged creation times: the windows are taken as before (the work between two
    pages of one engine is counted)."""
    ticks = _observe([_page(1.0, CREATED), _page(1.5, CREATED), _page(2.0, CREATED)])
    assert ticks[2].ttft_count_total == 100.0  # 50 first tokens a window
    assert ticks[2].ttft_recent_s is not None


def test_a_finished_count_below_one_request_gives_no_mean_per_request() -> None:
    """A finished-requests count that is no whole request (1e-300: a proxy's arithmetic)
    made the mean output per request 7.6e306 tokens and the tokens the running requests
    had generated infinite, an observation no controller can use. A mean per request
    needs a request: below one, the configured means stand in."""
    page = fixture_text("sglang_real.txt").replace(
        'sglang:e2e_request_latency_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"}'
        " 11228.0",
        'sglang:e2e_request_latency_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"}'
        " 1e-300",
    )
    assert "1e-300" in page
    observer = DomainObserver(
        [IdleGpu()], SglangSource("http://e/metrics", fetch=lambda url, t: page), stale_after_s=30.0
    )
    observation = observer.observe(0.0, 0, None).observation
    assert math.isfinite(observation.generated_decode_tokens)
    assert observation.generated_decode_tokens == 162 * 256.0 / 2  # the configured mean


def _dp_page(engines: dict[str, tuple[float, float, float, float]]) -> str:
    """A vLLM page of data-parallel engines in prometheus_client's multiprocess mode (no
    ``_created`` series): per engine, its TTFT buckets at 0.5 s and 1.0 s, its count and
    its sum."""
    lines = []
    for engine, (half, one, count, total) in engines.items():
        labels = f'engine="{engine}",model_name="m"'
        lines += [
            f"vllm:num_requests_running{{{labels}}} 2.0",
            f"vllm:num_requests_waiting{{{labels}}} 0.0",
            f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.5"}} {half}',
            f'vllm:time_to_first_token_seconds_bucket{{{labels},le="1.0"}} {one}',
            f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {count}',
            f"vllm:time_to_first_token_seconds_count{{{labels}}} {count}",
            f"vllm:time_to_first_token_seconds_sum{{{labels}}} {total}",
        ]
    return "\n".join(lines) + "\n"


def test_a_restart_hidden_in_a_data_parallel_sum_judges_no_window() -> None:
    """One of two data-parallel engines restarts (its one first token, 1.0 s, gone) while
    the other makes four at 0.3 s: every sum on the page still rose, so no restart was
    seen, and the window's buckets (4 at 0.5 s, 3 in all) fell as le rose: 4 first
    tokens judged met of 3, an attainment above 100 %. Such a window is no histogram;
    it is skipped, as a restart's is."""
    before = _dp_page({"0": (100.0, 100.0, 100.0, 20.0), "1": (0.0, 1.0, 1.0, 1.0)})
    after = _dp_page({"0": (104.0, 104.0, 104.0, 21.2), "1": (0.0, 0.0, 0.0, 0.0)})
    shown = [before]
    observer = DomainObserver(
        [IdleGpu()],
        VllmSource("http://e/metrics", fetch=lambda url, t: shown[0]),
        stale_after_s=30.0,
        ttft_slo_s=0.5,
    )
    observer.observe(0.0, 0, None)
    shown[0] = after
    observation = observer.observe(1.0, 1, None).observation
    assert (observation.ttft_within_slo_total or 0.0) <= (observation.ttft_count_total or 0.0)
    assert observation.ttft_count_total in (None, 0.0)


def test_a_restart_is_said_once_and_a_url_that_flips_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An engine restart (its counters went back) was silent: nothing in the log said
    when the daemon's windows started again. One line says it; a URL whose counters go
    back scrape after scrape (two replicas behind it, no ``_created`` series to tell
    them apart) logs one line a minute, at WARNING, asking whether it reaches several."""
    first = _page(1.0, CREATED).replace("_created", "_created_not")  # multiprocess mode
    second = _page(0.3, CREATED).replace("_created", "_created_not")
    restarted = [first, first, second, second, second]
    with caplog.at_level(logging.DEBUG, logger="gpugov.daemon.observer"):
        _observe(restarted)
    said = [
        r for r in caplog.records if r.levelno >= logging.INFO and "went back" in r.getMessage()
    ]
    assert [r.getMessage() for r in said] == [
        "http://e/metrics: the engine's counters went back (a restart): its counters start "
        "from zero here"
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="gpugov.daemon.observer"):
        _observe([first, second] * 65)  # 130 scrapes, one a second
    said = [
        r for r in caplog.records if r.levelno >= logging.INFO and "zero here" in r.getMessage()
    ]
    assert len(said) == 3, [r.getMessage() for r in said]
    assert said[0].levelno == logging.INFO
    assert said[1].levelno == logging.WARNING
    # 58 or 60 s: each scrape's time carries the wall time its GPU reads took.
    assert re.search(
        r"more in the (58|60) s before were not logged: does this URL reach several engines",
        said[1].getMessage(),
    ), said[1].getMessage()


def test_creation_times_new_at_every_scrape_are_no_engine_identity(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A page built afresh for every request (a proxy or exporter that makes a new
    registry each time) writes ``_created`` as the time of that request: read as
    creation times, every scrape was another engine and no window was ever taken. Three
    scrapes in a row whose times are all new are no engine identity: from then on only
    counters going back tell a restart (one line says so), and the windows are taken."""
    pages = [_page(1.0 + 0.5 * k, CREATED + k) for k in range(8)]
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.observer"):
        ticks = _observe(pages)
    assert ticks[-1].ttft_count_total is not None and ticks[-1].ttft_count_total >= 150.0
    said = [r.getMessage() for r in caplog.records if "_created" in r.getMessage()]
    assert len(said) == 1, said
    assert "change at every scrape" in said[0]
