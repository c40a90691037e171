"""The rest of a prompt seen in its prefill, from the engine's prompt-length histogram.

A node never sees a prompt's length before its first token: vLLM and SGLang publish the
finished requests' prompt lengths as a histogram in coarse 1-2-5 buckets and, vLLM, the
tokens each engine step ran. Each bucket's lengths are taken as spread evenly between its
bounds (the open bucket up to twice its lower bound).
"""

from __future__ import annotations

import math

from gpugov.daemon.attainment import Buckets, bucket_counts


def residual_prompt_tokens_quantile(
    buckets: Buckets | None, quantile: float, done_tokens: float | None = None
) -> float | None:
    """The ``quantile`` of the rest of a prompt seen in its prefill, ``L - k | L > k``
    over the prompt-length histogram ``buckets`` (``k``: ``done_tokens``, 0 when unknown),
    each bucket's lengths spread evenly as in :func:`residual_prompt_tokens`: the rest
    that only a share ``1 - quantile`` of such prompts exceed. None without a histogram
    or any request in it; a prompt past every recorded length is taken to be as long
    again.

    Raises:
        ValueError: ``quantile`` outside (0, 1).
    """
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must lie in (0, 1), got {quantile!r}")
    rows = _rows(buckets)
    if not rows:
        return None
    k = max(0.0, float(done_tokens or 0.0))
    above = _above(rows, k)
    mass = sum(n for _, _, n in above)
    if mass <= 0.0:
        return max(k, 1.0)
    wanted = quantile * mass
    for lo, hi, n in above:
        if n >= wanted:
            return lo + (hi - lo) * (wanted / n) - k
        wanted -= n
    return above[-1][1] - k


def _above(rows: list[tuple[float, float, float]], k: float) -> list[tuple[float, float, float]]:
    """The histogram's lengths above ``k`` (``L | L > k``), each bucket cut at ``k`` and
    its count scaled to the share of it left (lengths spread evenly in a bucket)."""
    kept = []
    for lo, hi, n in rows:
        if k <= lo:
            kept.append((lo, hi, n))
        elif k < hi:
            kept.append((k, hi, n * (hi - k) / (hi - lo)))
    return kept


def _rows(buckets: Buckets | None) -> list[tuple[float, float, float]]:
    """The histogram's buckets with requests in them, as ``(lower, upper, count)`` (the
    open bucket up to twice its lower bound)."""
    if not buckets:
        return []
    rows = []
    for lower, bound, count in bucket_counts(buckets):
        upper = 2.0 * lower if math.isinf(bound) else bound
        if count > 0.0 and math.isfinite(lower) and math.isfinite(upper) and upper >= lower:
            rows.append((lower, upper, count))
    return rows


def residual_prompt_tokens(
    buckets: Buckets | None, done_tokens: float | None = None
) -> float | None:
    """The expected rest of a prompt seen in its prefill, over the prompt-length
    histogram ``buckets``.

    With ``done_tokens``, the tokens of it that have already run, it is
    ``E[L - k | L > k]``: a prompt that has run past most recorded lengths is a long one
    (and one past every recorded length is taken to be as long again). Without it (an
    engine that publishes no per-step tokens) it is ``E[L^2] / (2 E[L])``: a prompt is in
    prefill for a time in proportion to its length, so the one seen there is a long one
    more often than the mean says, and half done on average. None without a histogram or
    any request in it."""
    rows = _rows(buckets)
    if not rows:
        return None
    if done_tokens is None:
        first = sum(n * 0.5 * (lo + hi) for lo, hi, n in rows)
        second = sum(n * (lo * lo + lo * hi + hi * hi) / 3.0 for lo, hi, n in rows)
        return second / (2.0 * first) if first > 0.0 else None
    k = max(0.0, float(done_tokens))
    above = _above(rows, k)
    mass = sum(n for _, _, n in above)
    rest = sum(n * (0.5 * (lo + hi) - k) for lo, hi, n in above)
    return rest / mass if mass > 0.0 else max(k, 1.0)
