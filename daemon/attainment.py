"""SLO attainment from an engine's latency histograms: how many requests met their SLO.

The engines publish Prometheus histograms: cumulative counts of observations at or below
each bucket's upper bound ``le`` (``vllm:time_to_first_token_seconds_bucket`` and so on).
Between two scrapes the difference of each bucket is the histogram of the requests that
completed the event in that window. :func:`count_within` estimates how many of them lay at
or below an SLO: exactly the count at a bucket bound when the SLO is one, else linear
interpolation within the bucket that holds the SLO (observations assumed spread evenly
across it). :func:`within_window` places that bucket's observations with the window's
``_sum`` instead: one alone is judged at its own value, which makes the estimate exact in
the short windows a node scrapes (a fraction of a second holds few first tokens), where
vLLM's coarse TTFT buckets (1.0 s, then 2.5 s) would count a 1.1 s first token against a
1.2 s SLO as 87 % missed. Either estimate lies between the counts at that bucket's two
bounds, so its error is at most that bucket's count in the window, and none where the SLO
sits on a bound. An SLO beyond the last finite bound counts every observation above that
bound as a miss.

:class:`AttainmentEstimator` adds each window's estimate to cumulative totals (the
observation's ``ttft_within_slo_total`` / ``ttft_count_total`` and the TPOT pair): a
missed scrape costs nothing (the next window covers the gap) and an engine restart (a
counter going backwards) skips that one window. With a per-prompt TTFT allowance, where a
window holds one first token its SLO is its own (the window's prompt tokens,
:class:`PromptPerFirstToken`). The TTFT histogram does not pair a TTFT with its prompt, so
of a window holding several, all but the slowest are judged at a typical prompt's SLO (the
median prompt of the windows that held one, at most the window's mean) and the slowest at
the SLO of the rest of the window's prompt tokens: a short prompt that waited behind a long
one gets its first token in the long one's window, and judged at their mean prompt's SLO
its miss would count as met.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

Buckets = tuple[tuple[float, float], ...]
"""``(le, cumulative count)`` ascending by ``le``, the last ``+Inf`` (the total)."""


def bucket_delta(now: Buckets | None, before: Buckets | None) -> Buckets | None:
    """The histogram of the window between two scrapes, or None when it cannot be had:
    either side missing, different bucket bounds, a count that went backwards (an
    engine restart), or a window whose counts fall as ``le`` rises: no histogram, but
    buckets summed over data-parallel engines one of which restarted while the others'
    gains hid it (judged, 4 first tokens met of 3)."""
    if now is None or before is None or len(now) != len(before):
        return None
    delta: list[tuple[float, float]] = []
    for (le, count), (le_before, count_before) in zip(now, before, strict=True):
        if le != le_before or count < count_before:
            return None
        window = count - count_before
        if delta and window < delta[-1][1] - 1e-9 * max(delta[-1][1], 1.0):
            return None
        delta.append((le, window))
    return tuple(delta)


def bucket_counts(buckets: Sequence[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """``(lower, upper, count)`` per bucket of a cumulative histogram, the first bucket's
    lower bound 0 and the ``+Inf`` bucket's its last finite bound."""
    rows = []
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        rows.append((lower, le, cumulative - below))
        lower, below = le, cumulative
    return rows


def count_within(buckets: Sequence[tuple[float, float]], threshold_s: float) -> float:
    """Observations at or below ``threshold_s`` in a cumulative histogram (module notes:
    linear interpolation within the bucket that holds it; the lower bound of the first
    bucket is 0)."""
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if threshold_s <= le:
            if math.isinf(le):
                return below  # above the last finite bound: counted as misses
            if le <= lower:
                return count
            share = (threshold_s - lower) / (le - lower)
            return below + max(0.0, share) * (count - below)
        lower, below = le, count
    return below


MIN_KNOWN_VALUES = 8
"""Values seen alone in the SLO's bucket that :func:`within_window` needs before it
judges several observations there by their spread instead of an even one."""


KNOWN_VALUES_KEPT = 256
"""Lone observations :class:`AttainmentEstimator` keeps per histogram (the latest)."""


def within_window(
    buckets: Sequence[tuple[float, float]],
    threshold_s: float,
    sum_s: float | None,
    known: Sequence[float] = (),
) -> float:
    """Observations of one window at or below ``threshold_s``, placed within the bucket
    that holds it by the window's ``_sum`` (module notes): the other buckets' observations
    taken at the mean of the ``known`` values in their bucket (else at its middle), the
    rest of the sum is that bucket's. One observation there (or part of one: counts that
    are not whole) is judged at that value.
    Several are judged as the ``known`` values in that bucket (earlier windows' lone
    observations, each exact) spread around the window's mean (narrowed as the spread of
    draws with that mean is), once at least :data:`MIN_KNOWN_VALUES` are known; before
    that, as spread evenly around their mean as far as the bucket allows (a tight spread,
    a board's steady TPOT, then counts as partly missed: the safe side). Scraped every
    fraction of a second, a window holds few observations, so this is mostly exact where
    the coarse buckets are not. Without a usable sum (none, an observation above the last
    finite bound), or one below zero (a sum that went back: no window's sum, which placed
    its observations at their bucket's lower bound, every one met): :func:`count_within`."""
    if sum_s is None or not math.isfinite(sum_s) or sum_s < 0.0 or not buckets:
        return count_within(buckets, threshold_s)
    bounds = bucket_counts(buckets)
    held = next((i for i, (_, upper, _) in enumerate(bounds) if threshold_s <= upper), None)
    if held is None or math.isinf(bounds[held][1]) or bounds[-1][2] > 0.0:
        return count_within(buckets, threshold_s)
    low, high, count = bounds[held]
    within_below = sum(c for _, _, c in bounds[:held])
    if count <= 0.0 or threshold_s >= high:
        # The SLO on the bucket's bound: every observation in it met the SLO, exactly
        # (a spread placed around the window's mean must not carry any past the bound).
        return within_below + max(count, 0.0)
    rest = [(lo, up, c) for i, (lo, up, c) in enumerate(bounds) if i != held and c]
    others = sum(_typical(lo, up, known) * c for lo, up, c in rest)
    mean = (sum_s - others) / count
    # What the sum allows, the other observations anywhere in their buckets: where the
    # typical places put it outside, the middle of what is allowed (a short prompt's
    # first token in (1, 2.5] s beside a long one's in (2.5, 5] s, summing 4.6 s, lies
    # in (1, 2.1] s: 1.55 s, not the 1 s the long one at 3.75 s would leave it).
    lowest = max(low, (sum_s - sum(up * c for _, up, c in rest)) / count)
    highest = min(high, (sum_s - sum(lo * c for lo, _, c in rest)) / count)
    if lowest <= highest and not lowest <= mean <= highest:
        mean = 0.5 * (lowest + highest)
    mean = min(high, max(low, mean))
    half = min(mean - low, high - mean)
    if count <= 1.0 or half <= 0.0:
        # One observation, or part of one (counts that are not whole: a page averaged
        # over replicas), is judged at the mean: a spread of it has no meaning.
        return within_below + (count if mean <= threshold_s + 1e-12 else 0.0)
    inside = [value for value in known if low < value <= high]
    if len(inside) >= MIN_KNOWN_VALUES:
        # Given their mean, ``count`` draws of a spread each lie around it with the
        # spread narrowed by sqrt((count - 1) / count) (exact for a normal spread).
        centre = sum(inside) / len(inside)
        narrow = math.sqrt((count - 1.0) / count)
        met = sum(mean + (value - centre) * narrow <= threshold_s + 1e-12 for value in inside)
        return within_below + count * met / len(inside)
    share = (threshold_s - (mean - half)) / (2.0 * half)
    return within_below + count * min(1.0, max(0.0, share))


def _typical(low: float, high: float, known: Sequence[float]) -> float:
    """An observation in the bucket ``(low, high]``: the mean of the ``known`` values in
    it where there are enough (a bucket from 0 holds a board's steady values near its
    top, not at its middle), else its middle."""
    inside = [value for value in known if low < value <= high]
    if len(inside) >= MIN_KNOWN_VALUES:
        return sum(inside) / len(inside)
    return 0.5 * (low + high)


def total(buckets: Sequence[tuple[float, float]]) -> float:
    """Observations in a cumulative histogram (its ``+Inf`` bucket)."""
    return buckets[-1][1] if buckets else 0.0


@dataclass
class PromptPerFirstToken:
    """The mean prompt of the requests whose first token came in a window, from the
    engine's counters: the prompt tokens prefilled since the last window that saw a first
    token, per first token in this one. A long prompt is prefilled in chunks over several
    windows before its first token; the tokens of windows without one are carried to the
    window where it lands."""

    carried_tokens: float = 0.0

    def update(self, prompt_tokens: float | None, first_tokens: float) -> float | None:
        """Fold one window in (its prompt tokens and first tokens); the window's mean
        prompt, None without a first token or a prompt counter."""
        if prompt_tokens is None or not math.isfinite(prompt_tokens) or prompt_tokens < 0.0:
            self.carried_tokens = 0.0
            return None
        if first_tokens <= 0.0:
            self.carried_tokens += prompt_tokens
            return None
        mean = (self.carried_tokens + prompt_tokens) / first_tokens
        self.carried_tokens = 0.0
        return mean


@dataclass
class IntervalsPerFinishedRequest:
    """TPOT judgements in requests from a histogram of inter-token intervals (SGLang's,
    vLLM's without its per-request one): a reply's intervals come over the windows it
    decodes in and its TPOT is judged when it finishes, so the intervals since the last
    window that finished a request are judged as that window's finished requests, at the
    share of them within the SLO. Counted as intervals, a window of ten replies read as
    thousands of requests to the SLO budget, whose counts are requests."""

    within: float = 0.0
    count: float = 0.0

    def update(
        self, within: float, count: float, finished: float | None
    ) -> tuple[float, float] | None:
        """Fold one window in (its intervals within the SLO, its intervals, the requests
        it finished); ``(within, judged)`` in requests, None where no request finished
        after an interval (or the finished count is unknown: the carry restarts)."""
        if finished is None or not math.isfinite(finished) or finished < 0.0:
            self.within = self.count = 0.0
            return None
        self.within += within
        self.count += count
        if finished <= 0.0 or self.count <= 0.0:
            return None
        judged = (finished * min(1.0, max(0.0, self.within / self.count)), finished)
        self.within = self.count = 0.0
        return judged


@dataclass
class AttainmentEstimator:
    """Cumulative SLO counters of one engine, from its histograms (module notes).

    Args:
        ttft_slo_s, tpot_slo_s: the SLOs (None: that pair is not counted).
        ttft_slo_per_prompt_token_s: the per-prompt TTFT allowance (None or 0: flat).
    """

    ttft_slo_s: float | None
    tpot_slo_s: float | None
    ttft_slo_per_prompt_token_s: float | None = None
    ttft_within: float | None = None
    ttft_count: float | None = None
    tpot_within: float | None = None
    tpot_count: float | None = None
    recent_prompt_tokens: float | None = None
    """The last window's mean prompt per first token (None when unknown)."""

    def __post_init__(self) -> None:
        self._prompts = PromptPerFirstToken()
        self._ttft_alone: deque[float] = deque(maxlen=KNOWN_VALUES_KEPT)
        self._tpot_alone: deque[float] = deque(maxlen=KNOWN_VALUES_KEPT)
        self._lone_prompts: deque[float] = deque(maxlen=KNOWN_VALUES_KEPT)
        self._intervals = IntervalsPerFinishedRequest()

    def add_window(
        self,
        ttft: Buckets | None,
        tpot: Buckets | None,
        prompt_tokens: float | None,
        ttft_sum_s: float | None = None,
        tpot_sum_s: float | None = None,
        *,
        tpot_per_interval: bool = False,
        finished: float | None = None,
    ) -> None:
        """Fold one window's histograms (:func:`bucket_delta`) and prompt tokens in;
        their window ``_sum`` s, where known, place the observations of the bucket that
        holds the SLO (:func:`within_window`). A window without TTFT buckets (None) carries
        none of its prompt tokens to the next. ``tpot_per_interval``: the TPOT histogram
        observes every inter-token interval, judged as the ``finished`` requests of the
        window (:class:`IntervalsPerFinishedRequest`)."""
        first_tokens = total(ttft) if ttft is not None else 0.0
        # A window without its TTFT histogram lost its first tokens: its prompt tokens are
        # theirs, not to be carried to the next window's (a longer SLO than their own).
        mean = self.recent_prompt_tokens = self._prompts.update(
            prompt_tokens if ttft is not None else None, first_tokens
        )
        if ttft is not None and self.ttft_slo_s is not None:
            allowance = self.ttft_slo_per_prompt_token_s or 0.0
            if mean is None or not allowance:
                within = within_window(ttft, self.ttft_slo_s, ttft_sum_s, self._ttft_alone)
            else:
                within = self._within_split(ttft, ttft_sum_s, mean, first_tokens, allowance)
                if first_tokens == 1.0:
                    self._lone_prompts.append(mean)
            self.ttft_within = (self.ttft_within or 0.0) + within
            self.ttft_count = (self.ttft_count or 0.0) + first_tokens
            _keep_alone(self._ttft_alone, ttft, ttft_sum_s)
        if tpot is None or self.tpot_slo_s is None:
            self._intervals.update(0.0, 0.0, None)  # their replies' intervals are lost
            return
        within = within_window(tpot, self.tpot_slo_s, tpot_sum_s, self._tpot_alone)
        count = total(tpot)
        _keep_alone(self._tpot_alone, tpot, tpot_sum_s)
        if tpot_per_interval:
            judged = self._intervals.update(within, count, finished)
            if judged is None and finished is None:
                # No finished counter to count requests by: the TPOT counts stay as they
                # are, None while nothing was ever judged, so a budget sees the SLO
                # unmeasured rather than met by none.
                return
            within, count = judged if judged is not None else (0.0, 0.0)
        self.tpot_within = (self.tpot_within or 0.0) + within
        self.tpot_count = (self.tpot_count or 0.0) + count

    def _within_split(
        self, ttft: Buckets, sum_s: float | None, mean: float, count: float, allowance: float
    ) -> float:
        """A window's first tokens within their per-prompt SLOs when the histogram does not
        pair a TTFT with its prompt (module notes): all but the slowest judged at a typical
        prompt's SLO (the median prompt of the windows that held one first token, where
        enough are known, at most the window's mean), the slowest at the SLO of the rest
        of the window's tokens. A short prompt that waited behind a long one counts as the
        miss it is; with one first token, or few known, the mean prompt's SLO."""
        base = float(self.ttft_slo_s or 0.0)
        known = self._lone_prompts
        if count <= 1.0 or len(known) < MIN_KNOWN_VALUES:
            return within_window(ttft, base + allowance * mean, sum_s, self._ttft_alone)
        typical = min(mean, statistics.median(known))
        rest = mean * count - typical * (count - 1.0)
        others = within_window(ttft, base + allowance * typical, sum_s, self._ttft_alone)
        if others >= count:
            return count
        slowest = within_window(ttft, base + allowance * rest, sum_s, self._ttft_alone)
        # Not all met at the typical SLO: the slowest is one of those missing there, so at
        # most ``count - 1`` others count, and the slowest by its own SLO.
        return min(others, count - 1.0) + min(1.0, max(0.0, slowest - (count - 1.0)))


def _keep_alone(kept: deque[float], buckets: Buckets, sum_s: float | None) -> None:
    """Keep a window's observation where it was alone: its ``_sum`` is its exact value."""
    if total(buckets) == 1.0 and sum_s is not None and math.isfinite(sum_s) and sum_s >= 0.0:
        kept.append(sum_s)


__all__ = [
    "AttainmentEstimator",
    "Buckets",
    "IntervalsPerFinishedRequest",
    "PromptPerFirstToken",
    "bucket_counts",
    "bucket_delta",
    "count_within",
    "total",
    "within_window",
]
