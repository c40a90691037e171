"""Engine counters that cannot have moved as far as a scrape says.

A page can hold values that parse and are each possible, yet cannot follow the page
before: a counter that rose by a million times its lifetime within one scrape interval
(a proxy's arithmetic gone wild, a bit flip), or one read as about 2^64 (an unsigned
counter wrapped below zero). Fed to the derivations, such a window is a rate no node can
serve: the learned model took it as a latency sample and was saved in a state its own
loader refuses, the MPC's solver overflowed, the energy fit failed. This module says
which counter of a scrape moved impossibly (:func:`impossible_jump`) and keeps the
offsets that let counters which stay at a new level go on from where they were
(:class:`CounterOffsets`), for :class:`daemon.observer.DomainObserver`.

The ceilings are physical, not tuned to a profile: a node's counters cannot move faster
however the engine is configured, so a real page never reaches them. They are the online
model's (:data:`~plant.ceilings.MAX_TOKENS_PER_S`, a hundred times a
fast eight-GPU node's prefill rate, and
:data:`~plant.ceilings.MAX_REQUESTS_PER_S`), which refuses such a
window too; a latency histogram's ``_sum`` (seconds a second: one a second per request
in flight) is bounded by the requests' ceiling.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import replace

from gpugov.daemon.engines import EngineSample, HistogramTotals
from gpugov.plant.ceilings import MAX_REQUESTS_PER_S, MAX_TOKENS_PER_S

MAX_COUNTER = float(2**53)
"""A cumulative counter above this is no count (float64's exact integers: 285 years at
1e6 a second); an unsigned 64-bit counter that wrapped below zero reads about 1.8e19."""
MIN_WINDOW_S = 1.0
"""A window shorter than this is allowed a second's worth: an engine may account a step's
tokens at once, and a simulated clock may not move between two scrapes."""

_TOKEN_COUNTERS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "iteration_tokens_total",
    "prompt_tokens_computed_total",
    "finished_generation_tokens_total",
    "prompt_tokens_external_total",
)
_REQUEST_COUNTERS = (
    "prompt_requests_total",
    "finished_requests_total",
    "arrived_requests_total",
    "preemptions_total",
    "iterations_total",
    "tpot_buckets_sum_s",
    "prefill_forward_s_total",
    "decode_forward_s_total",
)
_HISTOGRAMS = {"ttft": MAX_REQUESTS_PER_S, "tpot": MAX_TOKENS_PER_S}
"""Histogram totals and what bounds their counts (TPOT: per inter-token interval where
the engine has no per-request one)."""
_BUCKETS = {
    "ttft_buckets": MAX_REQUESTS_PER_S,
    "tpot_buckets": MAX_TOKENS_PER_S,
    "request_prompt_tokens_buckets": MAX_REQUESTS_PER_S,
    "request_generation_tokens_buckets": MAX_REQUESTS_PER_S,
}

Counters = dict[str, float]


def counters(sample: EngineSample) -> Counters:
    """The cumulative counters of ``sample`` by name (histogram totals as ``ttft.count``,
    buckets as ``ttft_buckets[1.0]``); those the engine does not publish are left out."""
    out: Counters = {}
    for name in (*_TOKEN_COUNTERS, *_REQUEST_COUNTERS):
        value = getattr(sample, name)
        if value is not None:
            out[name] = float(value)
    for name in _HISTOGRAMS:
        totals: HistogramTotals | None = getattr(sample, name)
        if totals is not None:
            out[f"{name}.count"] = float(totals.count)
            out[f"{name}.sum_s"] = float(totals.sum_s)
    for name in _BUCKETS:
        buckets = getattr(sample, name)
        for le, count in buckets or ():
            out[f"{name}[{le:g}]"] = float(count)
    return out


def _ceiling(key: str) -> float:
    """The most ``key`` can rise a second."""
    name = key.split("[")[0]
    if name in _TOKEN_COUNTERS:
        return MAX_TOKENS_PER_S
    if name in _BUCKETS:
        return _BUCKETS[name]
    if key.endswith(".count"):
        return _HISTOGRAMS[key.split(".")[0]]
    return MAX_REQUESTS_PER_S


def impossible_value(now: Mapping[str, float]) -> str | None:
    """A counter that is no count (above :data:`MAX_COUNTER`, or not finite), described,
    or None."""
    for key, value in now.items():
        if not abs(value) <= MAX_COUNTER:
            return f"{key} reads {value:.3g}, above any count ({MAX_COUNTER:.3g})"
    return None


def _too_far(
    before: Mapping[str, float], now: Mapping[str, float], elapsed_s: float
) -> Iterator[tuple[str, float, float]]:
    """``(key, rise, ceiling a second)`` for each counter of both that rose further from
    ``before`` to ``now`` than any node can in ``elapsed_s`` (at least
    :data:`MIN_WINDOW_S`)."""
    window = max(elapsed_s, MIN_WINDOW_S) if math.isfinite(elapsed_s) else MIN_WINDOW_S
    for key, value in now.items():
        previous = before.get(key)
        if previous is None:
            continue
        rise = value - previous
        ceiling = _ceiling(key)
        if not rise <= ceiling * window:
            yield key, rise, ceiling


def impossible_jump(
    before: Mapping[str, float], now: Mapping[str, float], elapsed_s: float
) -> tuple[str, str] | None:
    """The first counter that rose further from ``before`` to ``now`` than any node can
    in ``elapsed_s`` (at least :data:`MIN_WINDOW_S`): ``(key, description)``, or None.
    A counter that went back is an engine restart, not a jump (the caller's)."""
    for key, rise, ceiling in _too_far(before, now, elapsed_s):
        return key, (
            f"{key} rose by {rise:.3g} in {max(elapsed_s, 0.0):.2g} s, more than any "
            f"node ({ceiling:.0e} a second)"
        )
    return None


def went_back(before: Mapping[str, float], now: Mapping[str, float]) -> bool:
    """A counter of both went back (an engine restart)."""
    return any(value < before[key] for key, value in now.items() if key in before)


class CounterOffsets:
    """What is taken off each counter, so that one that jumped and stayed at its new
    level goes on from where it was (the jump itself is not counted as work); cleared at
    an engine restart, whose counters start again from zero."""

    def __init__(self) -> None:
        self.offsets: Counters = {}

    def clear(self) -> None:
        """An engine restart: counters are the engine's own again."""
        self.offsets.clear()

    def restart_from(self, now: Mapping[str, float]) -> None:
        """Take every counter of ``now`` off from here on: another engine answers on the
        URL, and its counters start from zero, as a restarted engine's do."""
        self.offsets = dict(now)

    def re_anchor(
        self, last: Mapping[str, float], jumped: Mapping[str, float], elapsed_s: float
    ) -> list[str]:
        """Take off each counter's rise from ``last`` (the last accepted raw counters)
        to ``jumped`` (the refused ones) where that rise was impossible in
        ``elapsed_s``; the counters named."""
        moved = []
        for key, rise, _ in _too_far(last, jumped, elapsed_s):
            if math.isfinite(rise):
                self.offsets[key] = self.offsets.get(key, 0.0) + rise
                moved.append(key)
        return moved

    def apply(self, sample: EngineSample) -> EngineSample:
        """``sample`` with the offsets taken off (itself when there are none)."""
        if not self.offsets:
            return sample
        off = self.offsets
        changes: dict[str, object] = {}
        for name in (*_TOKEN_COUNTERS, *_REQUEST_COUNTERS):
            value = getattr(sample, name)
            if value is not None and name in off:
                changes[name] = value - off[name]
        for name in _HISTOGRAMS:
            totals = getattr(sample, name)
            count_key, sum_key = f"{name}.count", f"{name}.sum_s"
            if totals is not None and (count_key in off or sum_key in off):
                changes[name] = HistogramTotals(
                    sum_s=totals.sum_s - off.get(sum_key, 0.0),
                    count=totals.count - off.get(count_key, 0.0),
                )
        for name in _BUCKETS:
            buckets = getattr(sample, name)
            if buckets and any(f"{name}[{le:g}]" in off for le, _ in buckets):
                changes[name] = tuple(
                    (le, count - off.get(f"{name}[{le:g}]", 0.0)) for le, count in buckets
                )
        return replace(sample, **changes) if changes else sample  # type: ignore[arg-type]


__all__ = [
    "MAX_COUNTER",
    "MAX_REQUESTS_PER_S",
    "MAX_TOKENS_PER_S",
    "MIN_WINDOW_S",
    "CounterOffsets",
    "counters",
    "impossible_jump",
    "impossible_value",
    "went_back",
]
