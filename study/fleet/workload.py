"""The fleet's workload: the trace scaled to ``--utilization`` of the fleet's fluid
capacity at the maximum clock, consecutive windows laid over each other where one window's
rate is too low, and the load that workload puts on the fleet (``fleet_utilization``)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpugov.daemon.cli_support import UsageError
from gpugov.plant import ServingPlant
from gpugov.plant.types import Request
from gpugov.plant.workload import format_seconds, workload_checksum
from gpugov.study.scoreboard.scenarios import _full_trace, work_seconds_at_maximum

if TYPE_CHECKING:
    from gpugov.study.fleet.run import FleetConfig

_INSTANT_SPAN_S = 1e-6
"""The span given a trace whose arrivals all share one timestamp (it spans 0 s)."""


class _SortedTrace:
    """A trace's requests sorted by arrival (ties in their given order) with their arrival
    times, so a window is two binary searches: :func:`select_window` sorts the whole trace
    for each, and a sparse trace of a million rows overlays thousands of windows."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = sorted(requests, key=lambda r: r.arrival_time_s)
        self.arrivals = [r.arrival_time_s for r in self.requests]

    def window(self, start_s: float, length_s: float) -> tuple[Request, ...]:
        """``select_window(requests, start_s, length_s)``: the arrivals of ``[start, start +
        length)`` rebased so ``start`` is 0."""
        first = bisect.bisect_left(self.arrivals, start_s)
        last = bisect.bisect_left(self.arrivals, start_s + length_s, lo=first)
        return tuple(
            Request(r.request_id, r.arrival_time_s - start_s, r.prompt_tokens, r.output_tokens)
            for r in self.requests[first:last]
        )


def _piece(
    full: _SortedTrace, start_s: float, length_s: float, span_s: float
) -> tuple[Request, ...]:
    """Arrivals of ``[start, start + length)`` rebased to 0, the start wrapped to fit; a
    length that covers the trace's span takes the whole trace, its last arrival included,
    whatever the start (a window of exactly the span would leave out the arrival at its
    end, and a start wrapped into no room at all was rounding noise that could drop the
    first)."""
    if length_s >= span_s:
        return full.window(0.0, math.nextafter(span_s, math.inf))
    return full.window(_piece_start(start_s, length_s, span_s), length_s)


def _piece_start(start_s: float, length_s: float, span_s: float) -> float:
    """Where :func:`_piece`'s window of ``length_s < span_s`` starts: at ``start_s``,
    wrapped round the room the span leaves where the window would run past its end."""
    return start_s if start_s + length_s <= span_s else start_s % (span_s - length_s)


def _window_length(config: FleetConfig, span_s: float, scale: float) -> float:
    """The trace's seconds each of :func:`_overlaid`'s windows takes: ``--duration``
    compressed by ``scale / ceil(scale)``, at most the whole trace."""
    return min(config.duration_s * (scale / max(1, math.ceil(scale))), span_s)


def _source_start(config: FleetConfig, span_s: float, scale: float) -> float | None:
    """Where the first of :func:`_overlaid`'s windows starts, in the trace's own seconds:
    ``--trace-start``, wrapped round the trace where that window would run past its end
    (:func:`_piece_start`), or None where a window covers the whole trace, which is then
    used whole whatever the start. ``fleet.md`` says it: ``--trace-start`` alone named a
    second the trace may not have (1,800 s of a 200 s trace)."""
    length = _window_length(config, span_s, scale)
    if length >= span_s:
        return None
    return _piece_start(config.trace_start_s, length, span_s)


UTILIZATION_TOLERANCE = 0.1
"""How far (relative) the load a fleet's workload puts on it may miss ``--utilization``
before the scale is corrected or, where it cannot be, the run says so."""

_SCALE_TRIES = 8
"""Corrections of the scale at most (each one the ratio asked over reached)."""

_SCALE_BOUND = 16.0
"""How far the corrections may take the scale from the first window's (either way)."""


def _overlaid(
    full: _SortedTrace, config: FleetConfig, span: float, scale: float
) -> tuple[Request, ...]:
    """``ceil(scale)`` consecutive windows of the trace from ``--trace-start``, each
    compressed by ``scale / ceil(scale)`` and laid over each other, cut at ``--duration``
    and numbered in arrival order."""
    pieces = max(1, math.ceil(scale))
    each = scale / pieces
    source = config.duration_s * each
    length = _window_length(config, span, scale)
    merged: list[Request] = []
    for j in range(pieces):
        part = _piece(full, config.trace_start_s + j * source, length, span)
        for r in part:
            # Scaled here, not by scale_load: a scale that underflowed to 0 (--utilization
            # 5e-324) or an arrival over it that overflows raised a ValueError there; such
            # an arrival lies past --duration and is dropped as the others past it are.
            if each > 0.0:
                at = r.arrival_time_s / each
            else:
                at = 0.0 if r.arrival_time_s == 0.0 else math.inf
            if not at < config.duration_s:
                continue
            merged.append(Request(r.request_id, at, r.prompt_tokens, r.output_tokens))
    merged.sort(key=lambda r: (r.arrival_time_s, r.request_id))
    return tuple(
        Request(i, r.arrival_time_s, r.prompt_tokens, r.output_tokens)
        for i, r in enumerate(merged)
        if r.arrival_time_s < config.duration_s
    )


def fleet_utilization(
    requests: Sequence[Request], config: FleetConfig, plants: Mapping[str, ServingPlant]
) -> float:
    """The load ``requests`` put on the fleet over ``--duration``, as ``--utilization``
    counts it: one over the sum over nodes of the duration over the requests' work at the
    node's top clock (0 for no requests). Each listed profile's work is priced once: node by
    node, the pricing was quadratic in ``--nodes``, the workload growing with the fleet."""
    priced = {
        name: work_seconds_at_maximum(requests, plants[name].profile) for name in config.profiles
    }
    works = [priced[name] for name in config.node_profiles()]
    if not requests or min(works) <= 0.0:
        return 0.0
    return 1.0 / sum(config.duration_s / work for work in works)


def fleet_workload(
    config: FleetConfig, plants: Mapping[str, ServingPlant], *, quiet: bool = False
) -> tuple[tuple[Request, ...], dict[str, Any]]:
    """The trace scaled to the fleet: ``--utilization`` of the fleet's fluid capacity at
    the maximum clock (the sum over nodes of the window's length over its work at the
    node's top rates). Above one trace's rate, ``m = ceil(scale)`` consecutive windows are
    laid over each other, each compressed by ``scale / m`` (wrapping round the trace's
    end), so each arrival is a recorded request and the length mix is the trace's. The
    trace is read once per process, with a progress line for a large file unless
    ``quiet`` (the zero-token rows it leaves out:
    :func:`~study.scoreboard.scenarios.skipped_zero_token_rows`)."""
    everything, digest = _full_trace(config.trace, quiet=quiet)
    smallest = min(plant.kv_capacity_tokens for plant in plants.values())
    full = tuple(r for r in everything if r.prompt_tokens + r.output_tokens <= smallest)
    if not full:
        raise UsageError(f"--trace {config.trace}: no request fits every node's KV cache")
    # A trace whose arrivals share one timestamp spans 0 s; simulate and sweep replay it as
    # it is, so the fleet takes a window just wide enough to hold those arrivals.
    trace = _SortedTrace(full)
    span = max(trace.arrivals[-1], _INSTANT_SPAN_S)
    length = min(config.duration_s, span)
    window = _piece(trace, config.trace_start_s, length, span)
    if not window:
        # Only a window shorter than the span can miss every arrival: one in a gap.
        start = _piece_start(config.trace_start_s, length, span)
        wrapped = (
            ""
            if start == config.trace_start_s
            else f" (--trace-start {format_seconds(config.trace_start_s)} s wrapped round "
            "the trace)"
        )
        raise UsageError(
            f"--trace {config.trace}: the window from {format_seconds(start)} s to "
            f"{format_seconds(start + length)} s{wrapped} holds no requests (kept arrivals "
            f"span 0 to {format_seconds(span)} s); choose another --trace-start or a longer "
            "--duration"
        )
    capacity = sum(
        length / max(work_seconds_at_maximum(window, plants[name].profile), 1e-9)
        for name in config.node_profiles()
    )
    scale = config.utilization * capacity
    requests = _overlaid(trace, config, span, scale)
    reached = fleet_utilization(requests, config, plants)
    if length >= config.duration_s:
        # The scale was set on the first window; the later ones it overlays hold less work
        # (a trace with hours of gaps: BurstGPT's first 720 s loaded the fleet to 0.23 of
        # 0.6) or more: correct it by what it reached, within bounds (a trace of a few
        # requests an hour apart would need millions of windows; such a load is said).
        first_scale, tried = scale, scale
        best = (abs(reached / config.utilization - 1.0), scale, requests, reached)
        for _ in range(_SCALE_TRIES):
            if not reached or best[0] <= UTILIZATION_TOLERANCE:
                break
            low, high = first_scale / _SCALE_BOUND, first_scale * _SCALE_BOUND
            bounded = min(max(tried * config.utilization / reached, low), high)
            if bounded == tried:
                break
            tried = bounded
            attempt = _overlaid(trace, config, span, tried)
            reached = fleet_utilization(attempt, config, plants)
            if abs(reached / config.utilization - 1.0) < best[0]:
                best = (abs(reached / config.utilization - 1.0), tried, attempt, reached)
        _, scale, requests, reached = best
    if not requests:
        # --utilization 1e-9 stretched the window past --duration: every cell ran a fleet
        # of no requests and the tables printed its idle energy as results.
        raise UsageError(
            f"--utilization {config.utilization:g}: the fleet's {format_seconds(config.duration_s)}"
            " s window holds no request at that load; raise --utilization or --duration"
        )
    info = {
        "trace": config.trace,
        "trace_span_s": span if trace.arrivals[-1] > 0.0 else 0.0,
        "trace_sha256": digest,
        "source_start_s": _source_start(config, span, scale),
        "load_scale": scale,
        "overlaid_windows": max(1, math.ceil(scale)),
        "fluid_capacity_scale": capacity,
        "reached_utilization": reached,
        "requests": len(requests),
        "rejected_requests": len(everything) - len(full),
        "workload_checksum": workload_checksum(requests),
    }
    return requests, info
