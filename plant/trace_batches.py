"""Undo a trace's timestamp quantisation: spread batched arrivals over their grid step.

Some traces record arrivals on a coarse grid. Mooncake's conversation trace stamps every
request on a 3 s grid (1,180 distinct timestamps for 12,031 requests), so replaying it
as written, or stretched by a load scale, delivers up to 20 long prompts at one instant:
a burst the real service never saw, which no clock can serve within a TTFT SLO. When at
least half of a trace's requests share their timestamp with another, and its distinct
timestamps sit on a grid (at least five of them, nine gaps in ten between them within 5 %
of a multiple of the step: the median gap, or else the smallest, the grid of a bursty
trace whose quiet stretches leave slots empty), the trace counts as batched, and each
batch's arrivals are spread uniformly at random (fixed seed, so the result is the same on
every load) over its grid step, cut at the next timestamp. This is the Poisson process
conditioned on the batch's count, the least informative reading of a quantised stamp.
Traces with distinct timestamps (Azure) or a few coincidences (BurstGPT's 1 s resolution)
are left alone, and so are real bursts: requests sent at one instant with few other
stamps, or stamps at irregular times (500 requests at 0 s and one at 3,600 s are a burst
and a straggler, not an hour's grid to spread the burst over).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BATCHED_FRACTION = 0.5
"""A trace is batched when at least this fraction of its requests share a timestamp."""

MIN_GRID_STAMPS = 5
"""Fewest distinct timestamps a grid is read from (two stamps give one gap, any gap; a
burst and two stragglers at random times are on some grid one time in eight)."""

ON_GRID_FRACTION = 0.9
"""Share of the gaps between distinct timestamps that must be a multiple of the step."""

GRID_TOLERANCE = 0.05
"""How far (a fraction of the step) a gap may be from a multiple of it and be on the grid
(Mooncake's 3 s gaps are 2,999 to 3,002 ms)."""

_LARGEST = float(np.finfo(float).max)
"""The largest finite arrival a spread may give."""

SPREAD_SEED = 0
"""Seed of the uniform offsets inside each batch (fixed: a trace always loads the same)."""


def batch_grid_s(arrivals_s: Sequence[float]) -> float | None:
    """The grid step of a batched trace (the median gap between distinct timestamps, or
    else the smallest), or ``None`` when it is not batched: fewer than half its requests
    share a stamp, it has fewer than :data:`MIN_GRID_STAMPS` distinct stamps, or their
    gaps are not on a grid (see the module's docstring)."""
    times = np.asarray(arrivals_s, dtype=float)
    if times.size < 2:
        return None
    distinct, counts = np.unique(times, return_counts=True)
    shared = int(counts[counts > 1].sum())
    if shared < BATCHED_FRACTION * times.size or distinct.size < MIN_GRID_STAMPS:
        return None
    gaps = np.diff(distinct)
    # The median gap is the step of a grid every slot of which holds a request (Mooncake);
    # the smallest gap, that of a grid whose quiet stretches leave slots empty (bursty
    # traffic logged in whole seconds: gaps of 1 s in a burst, of 2 to 9 s between).
    for step in (float(np.median(gaps)), float(gaps.min())):
        if _on_grid(gaps, step) >= ON_GRID_FRACTION * gaps.size:
            return step
    return None


def _on_grid(gaps: np.ndarray, step: float) -> int:
    """How many ``gaps`` are within :data:`GRID_TOLERANCE` of a positive multiple of
    ``step``."""
    with np.errstate(over="ignore"):  # a gap near the float maximum over a tiny step
        steps = gaps / step
    multiple = np.round(steps)
    return int(np.count_nonzero((multiple >= 1.0) & (np.abs(steps - multiple) <= GRID_TOLERANCE)))


def spread_batched_arrivals(arrivals_s: Sequence[float]) -> tuple[list[float], float | None]:
    """Arrivals with each batch spread over its grid step, and that step (``None``:
    unchanged, the trace is not batched).

    ``arrivals_s`` must be sorted. The first arrival of the trace stays at its stamp (the
    trace's time origin); the order of requests is kept (offsets are sorted within each
    batch, and a batch never reaches the next timestamp).
    """
    grid = batch_grid_s(arrivals_s)
    if grid is None:
        return list(arrivals_s), None
    times = np.asarray(arrivals_s, dtype=float)
    out = times.copy()
    rng = np.random.default_rng(SPREAD_SEED)
    starts = np.flatnonzero(np.r_[True, np.diff(times) > 0.0])
    ends = np.r_[starts[1:], times.size]
    for index, (first, stop) in enumerate(zip(starts, ends, strict=True)):
        count = int(stop - first)
        if count == 1:
            continue
        following = times[ends[index]] if index + 1 < starts.size else np.inf
        # Arrivals are >= 0 and finite; the last batch's spread must stay finite too (a
        # stamp near the float maximum plus a grid step as large would overflow to inf).
        width = min(grid, float(following - times[first]), _LARGEST - float(times[first]))
        offsets = np.sort(rng.uniform(0.0, width, count))
        if first == 0:
            offsets[0] = 0.0  # the time origin stays the first request's stamp
        out[first:stop] = times[first] + offsets
    return out.tolist(), grid
