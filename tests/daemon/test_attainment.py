"""SLO attainment from engine histograms: bucket parsing on real pages, the interpolated
estimate and its bounds, window deltas, and the observer's cumulative counters."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from daemon_support import fixture_text
from synthetic import IdleGpu

from gpugov.controllers.budget import AttainmentBudget, SLOTarget
from gpugov.daemon.attainment import (
    AttainmentEstimator,
    IntervalsPerFinishedRequest,
    PromptPerFirstToken,
    bucket_delta,
    count_within,
    total,
    within_window,
)
from gpugov.daemon.engine_sources import SglangSource, TgiSource, VllmSource
from gpugov.daemon.engines import EngineSample
from gpugov.daemon.observer import DomainObserver

# The real SGLang page (its docs): TTFT and per-interval TPOT buckets.
SGLANG_TPOT_005 = 11685.0  # observations <= 0.05 s
SGLANG_TPOT_0075 = 433413.0  # observations <= 0.075 s


def _sglang() -> EngineSample:
    return SglangSource("x", fetch=lambda url, t: fixture_text("sglang_real.txt")).scrape()


def test_real_sglang_page_gives_both_histograms_buckets() -> None:
    sample = _sglang()
    assert sample.ttft_buckets is not None and sample.tpot_buckets is not None
    assert total(sample.ttft_buckets) == 11008.0  # its +Inf bucket, equal to _count
    assert total(sample.tpot_buckets) == 7.400757e06
    assert dict(sample.tpot_buckets)[0.05] == SGLANG_TPOT_005
    # The older SGLang TPOT histogram observes every interval, not once per request.
    assert sample.tpot_buckets_per_request is False
    les = [le for le, _ in sample.ttft_buckets]
    assert les == sorted(les) and math.isinf(les[-1])


def test_an_slo_on_a_bucket_bound_is_counted_exactly() -> None:
    sample = _sglang()
    assert sample.tpot_buckets is not None and sample.ttft_buckets is not None
    assert count_within(sample.tpot_buckets, 0.05) == SGLANG_TPOT_005
    assert count_within(sample.ttft_buckets, 1.0) == 27.0


def test_an_slo_inside_a_bucket_is_interpolated_within_its_bounds() -> None:
    sample = _sglang()
    assert sample.tpot_buckets is not None
    estimate = count_within(sample.tpot_buckets, 0.0625)  # halfway through (0.05, 0.075]
    assert estimate == pytest.approx(SGLANG_TPOT_005 + 0.5 * (SGLANG_TPOT_0075 - SGLANG_TPOT_005))
    # The error bound: between the counts at the bucket's two bounds.
    assert SGLANG_TPOT_005 <= estimate <= SGLANG_TPOT_0075
    # Below the first bound, the first bucket is interpolated from zero.
    assert count_within(((0.1, 10.0), (math.inf, 20.0)), 0.025) == pytest.approx(2.5)


def test_an_slo_past_the_last_bound_counts_the_overflow_as_misses() -> None:
    sample = _sglang()
    assert sample.ttft_buckets is not None
    assert count_within(sample.ttft_buckets, 100.0) == 2513.0  # the 30 s bucket


def test_vllm_prefers_the_per_request_tpot_histogram() -> None:
    page = fixture_text("vllm_request_tpot_synthetic.txt")
    sample = VllmSource("x", fetch=lambda url, t: page).scrape()
    assert sample.tpot_buckets_per_request is True
    assert sample.tpot_buckets == ((0.025, 50.0), (0.05, 98.0), (math.inf, 100.0))
    # The windowed mean still comes from the inter-token histogram.
    assert sample.tpot is not None and sample.tpot.count == 9900.0


def test_data_parallel_buckets_are_summed_and_ranks_counted_once() -> None:
    page = fixture_text("vllm_dp2_synthetic.txt")
    sample = VllmSource("x", fetch=lambda url, t: page).scrape()
    assert sample.ttft_buckets == ((0.1, 90.0), (math.inf, 200.0))
    ranks = "\n".join(
        f'sglang:time_to_first_token_seconds_bucket{{le="{le}",model_name="m",tp_rank="{r}"}} {n}'
        for r in (0, 1)
        for le, n in (("1.0", 7), ("+Inf", 10))
    )
    page = fixture_text("sglang_ranks_synthetic.txt") + ranks + "\n"
    sample = SglangSource("x", fetch=lambda url, t: page).scrape()
    assert sample.ttft_buckets == ((1.0, 7.0), (math.inf, 10.0))


def test_tgi_without_buckets_has_no_attainment() -> None:
    sample = TgiSource("x", fetch=lambda url, t: fixture_text("tgi_synthetic.txt")).scrape()
    assert sample.ttft_buckets is None and sample.tpot_buckets is None


def test_window_delta_and_restarts() -> None:
    before = ((0.5, 10.0), (1.0, 15.0), (math.inf, 20.0))
    now = ((0.5, 14.0), (1.0, 22.0), (math.inf, 30.0))
    assert bucket_delta(now, before) == ((0.5, 4.0), (1.0, 7.0), (math.inf, 10.0))
    assert bucket_delta(before, now) is None  # counts went back: an engine restart
    assert bucket_delta(now, ((0.5, 1.0), (math.inf, 2.0))) is None  # other bounds
    assert bucket_delta(now, None) is None


def test_prompt_per_first_token_carries_long_prefills() -> None:
    prompts = PromptPerFirstToken()
    # A 30k-token prompt prefilled over three windows; its first token in the third.
    assert prompts.update(10_000.0, 0.0) is None
    assert prompts.update(10_000.0, 0.0) is None
    assert prompts.update(10_000.0, 1.0) == 30_000.0
    assert prompts.update(3_000.0, 3.0) == 1_000.0


def test_estimator_accumulates_windows_at_the_per_prompt_slo() -> None:
    estimator = AttainmentEstimator(1.0, 0.05, ttft_slo_per_prompt_token_s=1e-4)
    ttft = ((0.5, 2.0), (1.0, 4.0), (2.0, 8.0), (math.inf, 10.0))
    tpot = ((0.05, 9.0), (math.inf, 10.0))
    estimator.add_window(ttft, tpot, prompt_tokens=50_000.0)  # 5k per first token: SLO 1.5 s
    assert estimator.recent_prompt_tokens == 5_000.0
    assert estimator.ttft_within == pytest.approx(6.0)  # halfway through (1.0, 2.0]
    assert estimator.ttft_count == 10.0
    assert (estimator.tpot_within, estimator.tpot_count) == (9.0, 10.0)
    estimator.add_window(None, tpot, prompt_tokens=None)  # a restart's window: TTFT skipped
    assert estimator.ttft_count == 10.0 and estimator.tpot_count == 20.0


def test_a_skipped_windows_prompts_are_not_lent_to_the_next_first_token() -> None:
    """A window whose TTFT histogram gives no window (other bounds, counts that fell, a
    page without it) loses its first tokens: its prompt tokens are theirs, not the next
    window's first token's, which they lent a longer SLO (a miss counted as met)."""
    estimator = AttainmentEstimator(1.0, None, ttft_slo_per_prompt_token_s=5e-5)
    estimator.add_window(None, None, prompt_tokens=30_000.0)  # its first tokens unknown
    lone = ((1.0, 0.0), (2.5, 1.0), (math.inf, 1.0))  # one first token at 1.6 s
    estimator.add_window(lone, None, prompt_tokens=100.0, ttft_sum_s=1.6)
    assert estimator.recent_prompt_tokens == 100.0
    assert estimator.ttft_within == 0.0  # its SLO is 1.005 s: a miss


def test_a_lone_first_token_is_judged_at_its_own_value() -> None:
    """vLLM's TTFT buckets jump from 1.0 to 2.5 s: one 1.1 s first token in a window
    would count as 87 % missed against a 1.2 s SLO; its window sum says it met it."""
    window = ((1.0, 0.0), (2.5, 1.0), (math.inf, 1.0))
    assert count_within(window, 1.2) == pytest.approx(0.2 / 1.5)
    assert within_window(window, 1.2, 1.1) == 1.0
    assert within_window(window, 1.05, 1.1) == 0.0
    assert within_window(window, 1.2, None) == pytest.approx(0.2 / 1.5)


def test_the_window_sum_places_the_observations_of_the_slos_bucket() -> None:
    # One at about 0.05 s (the first bucket's middle), one at 1.3 s: SLO 1.2 s.
    window = ((0.1, 1.0), (1.0, 1.0), (2.5, 2.0), (math.inf, 2.0))
    assert within_window(window, 1.2, 0.05 + 1.3) == pytest.approx(1.0)
    assert within_window(window, 1.4, 0.05 + 1.3) == pytest.approx(2.0)
    # Two around a 1.5 s mean: spread over (1.0, 2.0], half below 1.5 s.
    pair = ((1.0, 0.0), (2.5, 2.0), (math.inf, 2.0))
    assert within_window(pair, 1.5, 3.0) == pytest.approx(1.0)
    assert within_window(pair, 1.25, 3.0) == pytest.approx(0.5)
    # A sum outside what the buckets allow is clamped into the SLO's bucket.
    assert within_window(window, 1.2, 100.0) == pytest.approx(1.0)
    # An observation above the last finite bound: no place for it, interpolated.
    beyond = ((1.0, 0.0), (2.5, 1.0), (math.inf, 2.0))
    assert within_window(beyond, 1.2, 6.0) == count_within(beyond, 1.2)
    assert within_window(((1.0, 0.0), (math.inf, 0.0)), 1.2, 0.0) == 0.0


def test_known_lone_values_place_the_other_buckets_and_the_spread() -> None:
    """A board's steady TPOT sits near the top of vLLM's first bucket (0, 10 ms], not at
    its middle, and several observations in the SLO's bucket spread as the lone ones did."""
    window = ((0.01, 3.0), (0.025, 4.0), (math.inf, 4.0))  # three fast, one near a 16 ms SLO
    total_s = 3 * 0.009 + 0.015
    assert within_window(window, 0.016, total_s) == 3.0  # at the middle: 0.027 s left over
    known = [0.009] * 8
    assert within_window(window, 0.016, total_s, known) == 4.0
    # Four in the SLO's bucket around 15 ms: lone ones seen from 14 to 16 ms all meet it.
    pair = ((0.01, 0.0), (0.025, 4.0), (math.inf, 4.0))
    steady = [0.014, 0.0145, 0.015, 0.0155, 0.016, 0.015, 0.0148, 0.0152]
    assert within_window(pair, 0.0163, 4 * 0.015) == pytest.approx(4 * (0.0063 / 0.01))
    assert within_window(pair, 0.0163, 4 * 0.015, steady) == 4.0
    # Fewer than MIN_KNOWN_VALUES known: the even spread.
    assert within_window(pair, 0.0163, 4 * 0.015, steady[:3]) == pytest.approx(2.52)


def test_an_slo_on_a_bucket_bound_counts_every_observation_in_that_bucket_met() -> None:
    """A 10 ms TPOT SLO is vLLM's first bound: every observation in (0, 10 ms] met it,
    whatever the lone values known there say of their spread. Four requests at a mean of
    9.3 ms, beside lone ones seen from 2 to 9.5 ms, were placed around 9.3 ms with that
    spread, past the bucket's own bound, and counted as misses that never happened (a
    TP 8 board's budget judged itself behind and held the top clock)."""
    window = ((0.01, 4.0), (0.025, 4.0), (math.inf, 4.0))
    known = [0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.009, 0.0095]
    assert within_window(window, 0.01, 4 * 0.0093, known) == 4.0
    assert within_window(window, 0.01, 4 * 0.0093) == 4.0
    # Within the bucket, below its bound, the spread still decides.
    assert within_window(window, 0.0095, 4 * 0.0093, known) < 4.0


def test_the_estimator_keeps_lone_observations() -> None:
    estimator = AttainmentEstimator(None, 0.0163)
    alone = ((0.01, 0.0), (0.025, 1.0), (math.inf, 1.0))
    for value in (0.014, 0.0145, 0.015, 0.0155, 0.016, 0.015, 0.0148, 0.0152):
        estimator.add_window(None, alone, None, tpot_sum_s=value)
    assert estimator.tpot_within == 8.0
    estimator.add_window(None, ((0.01, 0.0), (0.025, 4.0), (math.inf, 4.0)), None, None, 0.06)
    assert (estimator.tpot_within, estimator.tpot_count) == (12.0, 12.0)


def test_a_window_with_part_of_an_observation_in_the_slos_bucket_is_judged_at_its_mean() -> None:
    """Bucket counts that are not whole (a proxy that averages its replicas' pages): a
    window with half an observation in the SLO's bucket, once 8 lone values there were
    known, took the square root of a negative number and ended the daemon's loop with a
    ValueError. Less than one observation there is judged at its mean, as one is."""
    estimator = AttainmentEstimator(None, 0.0163)
    alone = ((0.01, 0.0), (0.025, 1.0), (math.inf, 1.0))
    for value in (0.014, 0.0145, 0.015, 0.0155, 0.016, 0.015, 0.0148, 0.0152):
        estimator.add_window(None, alone, None, tpot_sum_s=value)
    half = ((0.01, 0.0), (0.025, 0.5), (math.inf, 0.5))
    estimator.add_window(None, half, None, None, 0.5 * 0.015)
    assert (estimator.tpot_within, estimator.tpot_count) == (8.5, 8.5)
    assert within_window(half, 0.0145, 0.5 * 0.015, [0.015] * 8) == 0.0


def test_a_window_sum_below_zero_is_no_sum() -> None:
    """A window sum that went back (the ``_sum`` of an engine that restarted, hidden in a
    data-parallel page's total) placed the window's observations at their bucket's lower
    bound: all met. It is no sum: the buckets alone judge the window."""
    window = ((0.5, 1.0), (1.0, 2.0), (math.inf, 2.0))
    assert within_window(window, 0.6, -0.3) == count_within(window, 0.6)
    assert within_window(window, 0.6, -0.3, [0.7] * 8) == count_within(window, 0.6)


def test_the_estimator_uses_the_window_sum() -> None:
    estimator = AttainmentEstimator(1.0, None, ttft_slo_per_prompt_token_s=1e-4)
    window = ((1.0, 0.0), (2.5, 1.0), (math.inf, 1.0))
    estimator.add_window(window, None, prompt_tokens=3_000.0, ttft_sum_s=1.25)  # SLO 1.3 s
    assert (estimator.ttft_within, estimator.ttft_count) == (1.0, 1.0)
    estimator.add_window(window, None, prompt_tokens=1_000.0, ttft_sum_s=1.25)  # SLO 1.1 s
    assert (estimator.ttft_within, estimator.ttft_count) == (1.0, 2.0)


def test_the_sum_places_an_observation_where_the_other_buckets_allow() -> None:
    """A short prompt's first token at 1.55 s (bucket (1, 2.5]) beside a long one's at
    3.05 s (bucket (2.5, 5]): with the long one at its bucket's middle, 3.75 s, the
    short one would sit at 1.0 s; the sum allows it only (1.0, 2.1]."""
    pair = ((1.0, 0.0), (2.5, 1.0), (5.0, 2.0), (math.inf, 2.0))
    assert within_window(pair, 1.5, 4.6) == 0.0  # placed at 1.55 s: a miss at 1.5 s
    assert within_window(pair, 1.6, 4.6) == 1.0
    # Where the middle of the other bucket fits the sum, it is kept.
    assert within_window(pair, 1.4, 5.1) == 1.0  # 5.1 - 3.75: 1.35 s
    assert within_window(pair, 1.3, 5.1) == 0.0


def test_a_short_prompt_behind_a_long_one_counts_as_the_miss_it_is() -> None:
    """A 1k-token prompt that waited behind a 99k-token one gets its first token in the
    same window: judged at their mean prompt's SLO (5 s here) it would count as met;
    judged at a typical prompt's (the windows with one first token) it misses, and the
    long one is judged at the rest of the window's tokens."""
    estimator = AttainmentEstimator(1.0, None, ttft_slo_per_prompt_token_s=5e-5)
    alone = ((0.5, 1.0), (1.0, 1.0), (2.5, 1.0), (5.0, 1.0), (math.inf, 1.0))
    for prompt in (800.0, 1_000.0, 2_000.0, 3_000.0, 5_000.0, 1_500.0, 2_500.0, 4_000.0):
        estimator.add_window(alone, None, prompt_tokens=prompt, ttft_sum_s=0.3)
    assert (estimator.ttft_within, estimator.ttft_count) == (8.0, 8.0)
    pair = ((0.5, 0.0), (1.0, 0.0), (2.5, 1.0), (5.0, 2.0), (math.inf, 2.0))
    estimator.add_window(pair, None, prompt_tokens=100_000.0, ttft_sum_s=1.6 + 3.0)
    # The short one (about 1.55 s) against 1 + 5e-5 * 2.25k = 1.11 s: missed; the long one
    # (about 3.05 s) against 1 + 5e-5 * 97.75k = 5.9 s: met.
    assert (estimator.ttft_within, estimator.ttft_count) == (9.0, 10.0)
    # Two prompts of the same length in one window: judged as before.
    same = AttainmentEstimator(1.0, None, ttft_slo_per_prompt_token_s=5e-5)
    for _ in range(8):
        same.add_window(alone, None, prompt_tokens=20_000.0, ttft_sum_s=0.3)
    both = ((0.5, 0.0), (1.0, 0.0), (2.5, 2.0), (math.inf, 2.0))
    same.add_window(both, None, prompt_tokens=40_000.0, ttft_sum_s=2 * 1.2)  # SLO 2.0 s
    assert (same.ttft_within, same.ttft_count) == (10.0, 10.0)


def test_a_window_never_counts_more_met_first_tokens_than_it_holds() -> None:
    """Two first tokens near a typical prompt's SLO beside a long prompt's: the typical
    SLO counts 1.5 of the two as met and the rest's SLO the slowest as met. The slowest is
    not one of the others, so the window counts two met, not 2.5 (an estimate above the
    count hid a random board's 19 misses from the SLO budget, which kept spending)."""
    estimator = AttainmentEstimator(1.0, None, ttft_slo_per_prompt_token_s=1e-3)
    alone = ((0.5, 1.0), (1.0, 1.0), (2.5, 1.0), (5.0, 1.0), (math.inf, 1.0))
    for _ in range(8):
        estimator.add_window(alone, None, prompt_tokens=225.0, ttft_sum_s=0.4)
    # A typical prompt's SLO 1 + 1e-3 * 225 = 1.225 s; the window's mean first token at
    # 1.15 s spread evenly over 1.0-1.3 s: 1.5 of 2 within it. The rest of the window's
    # 2,000 prompt tokens, 1,775, gives the slowest 2.775 s: met.
    pair = ((0.5, 0.0), (1.0, 0.0), (2.5, 2.0), (5.0, 2.0), (math.inf, 2.0))
    estimator.add_window(pair, None, prompt_tokens=2_000.0, ttft_sum_s=2.3)
    assert (estimator.ttft_within, estimator.ttft_count) == (10.0, 10.0)


def test_few_windows_with_one_first_token_judge_at_the_mean_prompt() -> None:
    estimator = AttainmentEstimator(1.0, None, ttft_slo_per_prompt_token_s=5e-5)
    pair = ((0.5, 0.0), (1.0, 0.0), (2.5, 1.0), (5.0, 2.0), (math.inf, 2.0))
    estimator.add_window(pair, None, prompt_tokens=100_000.0, ttft_sum_s=1.6 + 3.0)
    assert estimator.ttft_within == 2.0  # the mean prompt's SLO, 3.5 s: both met


def test_no_slo_no_counts() -> None:
    estimator = AttainmentEstimator(None, None)
    estimator.add_window(((1.0, 3.0), (math.inf, 4.0)), None, 100.0)
    assert estimator.ttft_count is None and estimator.ttft_within is None


class _Pages:
    """An engine source serving the real SGLang page with its counters grown by a scripted
    amount each scrape (every bucket grows by the same histogram of new requests)."""

    def __init__(self) -> None:
        self.base = _sglang()
        self.grow: list[tuple[tuple[float, float], ...]] = []
        self.scrapes = 0

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        sample = self.base
        for step in self.grow[: self.scrapes]:
            assert sample.ttft_buckets is not None and sample.prompt_tokens_total is not None
            sample = replace(
                sample,
                ttft_buckets=tuple((le, n + dict(step)[le]) for le, n in sample.ttft_buckets),
                prompt_tokens_total=sample.prompt_tokens_total + 4000.0,
            )
        self.scrapes += 1
        return sample


def test_observer_turns_histograms_into_cumulative_counters() -> None:
    pages = _Pages()
    assert pages.base.ttft_buckets is not None
    bounds = [le for le, _ in pages.base.ttft_buckets]
    # Each window: 4 first tokens, 2 at or under 1.0 s, 3 under 2.5 s, 4 in all.
    window = tuple(
        (le, 0.0 if le < 1.0 else 2.0 if le < 2.5 else 3.0 if le < 5 else 4.0) for le in bounds
    )
    pages.grow = [window, window]
    observer = DomainObserver(
        [IdleGpu()],
        pages,
        stale_after_s=3.0,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        ttft_slo_per_prompt_token_s=0.0,
    )
    first = observer.observe(0.0, 0, None).observation
    assert first.ttft_count_total is None  # no window yet
    second = observer.observe(1.0, 1, None).observation
    third = observer.observe(2.0, 2, None).observation
    assert second.ttft_count_total == 4.0 and second.ttft_within_slo_total == 2.0
    assert third.ttft_count_total == 8.0 and third.ttft_within_slo_total == 4.0
    # SGLang counts a prompt when its request finishes: not the window's first tokens'.
    assert third.ttft_recent_prompt_tokens is None
    assert third.ttft_slo_per_prompt_token_s == 0.0
    # The real page's TPOT histogram did not move: nothing counted, but it is measured.
    assert third.tpot_count_total == 0.0


def test_the_estimate_stays_within_each_windows_count_on_random_windows() -> None:
    """Whatever a window holds (first tokens spread over vLLM's buckets, its sum, its
    prompt tokens, windows of one first token between), the cumulative estimate gains
    between none and all of the window's observations."""
    rng = np.random.default_rng(7)
    bounds = (0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf)
    for case in range(40):
        estimator = AttainmentEstimator(
            float(rng.uniform(0.2, 3.0)),
            float(rng.uniform(0.02, 0.2)),
            ttft_slo_per_prompt_token_s=float(rng.choice([0.0, 5e-5, 1e-3])),
        )
        for _ in range(60):
            count = int(rng.choice([1, 1, 2, 3, 5]))
            values = rng.lognormal(float(rng.uniform(-2.0, 1.5)), 0.6, size=count)
            cumulative = tuple((le, float(np.sum(values <= le))) for le in bounds)
            tpot = rng.lognormal(-3.0, 0.5, size=count)
            tpot_buckets = tuple((le, float(np.sum(tpot <= le))) for le in bounds)
            prompts = float(rng.integers(10, 20_000)) * count
            before = (estimator.ttft_within or 0.0, estimator.tpot_within or 0.0)
            estimator.add_window(
                cumulative, tpot_buckets, prompts, float(values.sum()), float(tpot.sum())
            )
            gained = (estimator.ttft_within or 0.0) - before[0]
            assert -1e-9 <= gained <= count + 1e-9, (case, values, prompts)
            gained = (estimator.tpot_within or 0.0) - before[1]
            assert -1e-9 <= gained <= count + 1e-9, (case, tpot)


def _sglang_page_grown(
    first_token_s: float | None,
    prompt_tokens: float,
    done: int,
    intervals: tuple[float, float] | None = None,
    finished: float = 0.0,
) -> str:
    """The real SGLang page after ``done`` windows, each adding ``prompt_tokens`` to the
    prompt counter, (``first_token_s`` not None) one first token of that TTFT and
    (``intervals`` not None) that many inter-token intervals of 0.03 s and of 0.09 s,
    and ``finished`` requests."""
    lines = []
    grown = 0 if first_token_s is None else done
    fast, slow = intervals or (0.0, 0.0)
    for line in fixture_text("sglang_real.txt").splitlines():
        if line.startswith("#") or " " not in line:
            lines.append(line)
            continue
        name, value = line.rsplit(" ", 1)
        number = float(value)
        if name.startswith("sglang:prompt_tokens_total"):
            number += prompt_tokens * done
        elif name.startswith("sglang:e2e_request_latency_seconds_count"):
            number += finished * done
        elif name.startswith("sglang:time_per_output_token_seconds_bucket"):
            le = float(name.split('le="')[1].split('"')[0].replace("Inf", "inf"))
            number += done * ((fast if le >= 0.03 else 0.0) + (slow if le >= 0.09 else 0.0))
        elif name.startswith("sglang:time_per_output_token_seconds_count"):
            number += done * (fast + slow)
        elif name.startswith("sglang:time_per_output_token_seconds_sum"):
            number += done * (0.03 * fast + 0.09 * slow)
        elif name.startswith("sglang:time_to_first_token_seconds_bucket"):
            le = float(name.split('le="')[1].split('"')[0].replace("Inf", "inf"))
            number += grown if first_token_s is not None and first_token_s <= le else 0
        elif name.startswith("sglang:time_to_first_token_seconds_count"):
            number += grown
        elif name.startswith("sglang:time_to_first_token_seconds_sum"):
            number += grown * (first_token_s or 0.0)
        lines.append(f"{name} {number!r}")
    return "\n".join(lines) + "\n"


def test_sglang_prompts_counted_at_their_finish_do_not_lengthen_a_first_tokens_slo() -> None:
    """SGLang adds a request's prompt to its counter when the request finishes, windows
    after its first token: a long prompt finishing beside a short one's late first token
    lent that first token the long prompt's allowance, and its miss counted as met."""
    pages = iter([_sglang_page_grown(1.6, 30_000.0, done) for done in range(3)])
    source = SglangSource("x", fetch=lambda url, t: next(pages))
    observer = DomainObserver(
        [IdleGpu()],
        source,
        stale_after_s=3.0,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        ttft_slo_per_prompt_token_s=5e-5,
    )
    observer.observe(0.0, 0, None)
    observer.observe(1.0, 1, None)
    last = observer.observe(2.0, 2, None).observation
    # Each window: one 1.6 s first token, 30,000 prompt tokens of requests that finished.
    # Judged at the flat 1 s SLO (its own prompt is not known): two misses.
    assert last.ttft_count_total == 2.0
    assert last.ttft_within_slo_total == 0.0
    assert last.ttft_recent_prompt_tokens is None


def test_an_inter_token_histogram_counts_tpot_judgements_in_requests() -> None:
    """SGLang's TPOT histogram observes every inter-token interval: its counts are tokens,
    and the SLO budget's window, which counts requests by them where TTFT is not judged
    (a decode pool, a TPOT-only SLO), took 2,000 intervals of 10 replies for 2,000
    requests (at 99 %, 20 misses allowed where a tenth of one is). The window's finished
    requests are its judgements, at the share of its intervals within the SLO."""
    pages = iter(
        [
            _sglang_page_grown(None, 0.0, done, intervals=(1_900.0, 100.0), finished=10.0)
            for done in range(3)
        ]
    )
    observer = DomainObserver(
        [IdleGpu()],
        SglangSource("x", fetch=lambda url, t: next(pages)),
        stale_after_s=3.0,
        ttft_slo_s=None,
        tpot_slo_s=0.05,
    )
    observations = [observer.observe(float(t), t, None).observation for t in range(3)]
    last = observations[-1]
    assert last.tpot_count_total == pytest.approx(20.0)  # ten replies a window
    assert last.tpot_within_slo_total == pytest.approx(19.0)  # 95 % of their intervals
    budget = AttainmentBudget(SLOTarget(attainment=0.99, window_s=600.0))
    for observation in observations:
        budget.update(observation)
    assert budget.last is not None and budget.last.requests == pytest.approx(10.0)
    assert not budget.ahead  # a tenth of a miss allowed: too few requests to tell


def test_a_replys_intervals_are_judged_when_it_finishes() -> None:
    intervals = IntervalsPerFinishedRequest()
    assert intervals.update(90.0, 100.0, 0.0) is None  # decoding, none finished yet
    assert intervals.update(60.0, 100.0, 2.0) == (1.5, 2.0)  # 150 of 200 within
    assert intervals.update(0.0, 0.0, 1.0) is None  # a one-token reply: no TPOT
    assert intervals.update(10.0, 10.0, None) is None  # finished unknown: carry restarts
    assert intervals.update(0.0, 10.0, 1.0) == (0.0, 1.0)


def test_an_inter_token_histogram_without_a_finished_counter_leaves_tpot_unmeasured() -> None:
    """Intervals are judged as requests by the finished counter's difference; an engine
    without that counter judges none, and its TPOT counts stay None (unmeasured), as a
    budget must see them: at 0.0 they read as measured with nothing judged, and the
    budget loosened on the TTFT slack alone."""
    estimator = AttainmentEstimator(None, 0.05)
    buckets = ((0.05, 90.0), (0.1, 100.0), (math.inf, 100.0))
    estimator.add_window(None, buckets, None, tpot_per_interval=True, finished=None)
    assert estimator.tpot_count is None and estimator.tpot_within is None
    estimator.add_window(None, buckets, None, tpot_per_interval=True, finished=4.0)
    assert estimator.tpot_count == 4.0 and estimator.tpot_within == pytest.approx(3.6)
