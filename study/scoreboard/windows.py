"""Held-out windows on the scoreboard (``gpugov bench controllers --windows N``).

The scoreboard's one window per trace is where the controllers were tuned; ``--windows N``
runs ``N`` windows of every trace instead, each built as the scoreboard builds its own
(capacity search, loads), and scores every controller on each. The starts: the trace's
scoreboard start (``TRACE_STARTS_S``) and ``N - 1`` more, spaced by ``span / N`` and
wrapped around the trace's span (a window that would run past the end is moved back, as
every window is). A trace used whole (``WHOLE_TRACE``) has no window to move, and a trace
shorter than ``N`` windows of ``--duration`` has no room for them: both are refused.

Per controller the window summary gives the windows where it holds the SLO, its missed
requests beyond the maximum clock's (total), its mean saving over the whole run and after
the warm-up, and its median capture.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gpugov.plant.result import ServingResult
from gpugov.plant.types import Request
from gpugov.study.online_eval import energy_after
from gpugov.study.scoreboard.scenarios import TRACE_STARTS_S, WHOLE_TRACE, label_of, row_order


def window_starts(
    trace: str, requests: Sequence[Request], duration_s: float, count: int
) -> tuple[float, ...]:
    """``count`` window starts (seconds into ``trace``), the scoreboard's own first.

    Raises:
        ValueError: one line when the trace is used whole or too short for ``count``
            windows of ``duration_s``.
    """
    if trace in WHOLE_TRACE:
        raise ValueError(
            f"--windows: trace {trace} is used whole by the scoreboard; it has no windows "
            "to move (leave it out of --traces)"
        )
    span = requests[-1].arrival_time_s if requests else 0.0
    if span < count * duration_s:
        raise ValueError(
            f"--windows {count}: trace {trace} spans {span:.0f} s, too short for {count} "
            f"windows of {duration_s:g} s (lower --windows or --duration)"
        )
    first = TRACE_STARTS_S.get(trace, 0.0)
    spacing = span / count
    starts = tuple(float(round((first + k * spacing) % span)) for k in range(count))
    if len(set(starts)) < count:
        # Starts are whole seconds: windows under a second apart shared one start, and
        # so one scenario key, run and counted as two windows.
        raise ValueError(
            f"--windows {count}: trace {trace} spans {span:.0f} s, so {count} windows would "
            "start less than a second apart (lower --windows)"
        )
    return starts


def window_overlaps(scenarios: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs of held-out windows of one trace, profile and load whose source stretches of
    the trace overlap, each with the seconds they share. A window's source is not its
    ``--duration``: at ``cap70`` it is ``--duration`` x 0.7 x the capacity scale (three
    times as long on a light trace), and one that would run past the trace's end is moved
    back, so two windows, the scoreboard's own among them, can score the same requests."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for info in scenarios:
        if info.get("window_start_s") is not None:
            groups.setdefault((info["trace"], info["profile"], info["load"]), []).append(info)
    out = []
    for (trace, profile, load), infos in groups.items():
        for index, first in enumerate(infos):
            for second in infos[index + 1 :]:
                start = max(first["source_start_s"], second["source_start_s"])
                end = min(
                    first["source_start_s"] + first["source_duration_s"],
                    second["source_start_s"] + second["source_duration_s"],
                )
                if end - start >= 1.0:  # a second or more in common
                    out.append(
                        {
                            "trace": trace,
                            "profile": profile,
                            "load": load,
                            "window_starts_s": [
                                first["window_start_s"],
                                second["window_start_s"],
                            ],
                            "overlap_s": end - start,
                        }
                    )
    return out


def overlap_lines(overlaps: Sequence[dict[str, Any]]) -> list[str]:
    """One phrase per pair of :func:`window_overlaps`."""
    return [
        f"{o['trace']} on {o['profile']} at {o['load']}: the windows @{o['window_starts_s'][0]:g} "
        f"and @{o['window_starts_s'][1]:g} share {o['overlap_s']:.0f} s of the trace"
        for o in overlaps
    ]


def missed_requests(result: ServingResult) -> int:
    """Requests of ``result`` that missed their SLO (censored ones included)."""
    attainment = result.metrics.slo_attainment or 0.0
    return int(round((1.0 - attainment) * len(result.request_records)))


def window_fields(
    results: dict[str, ServingResult], reference: ServingResult, warmup_s: float
) -> dict[str, dict[str, Any]]:
    """Per controller key, the fields a window row adds: missed requests (and beyond the
    maximum clock's) and the energy saved after the warm-up."""
    top_missed = missed_requests(reference)
    top_after = energy_after(reference, warmup_s)
    out: dict[str, dict[str, Any]] = {}
    for key, result in results.items():
        missed = missed_requests(result)
        out[key] = {
            "missed_requests": missed,
            "extra_missed_requests": missed - top_missed,
            "energy_saved_after_warmup_fraction": (
                1.0 - energy_after(result, warmup_s) / top_after if top_after > 0.0 else None
            ),
        }
    return out


def summarize_windows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per controller over every window row: how many hold the SLO, the extra missed
    requests in total, the mean saving (whole run, after the warm-up) and the median
    capture (whole run, after the warm-up)."""
    out = []
    for key in row_order(r["controller"] for r in rows):
        mine = [r for r in rows if r["controller"] == key]

        def present(field: str, rows: list[dict[str, Any]] = mine) -> list[float]:
            return [float(r[field]) for r in rows if r.get(field) is not None]

        saved, after = (
            present("energy_saved_fraction"),
            present("energy_saved_after_warmup_fraction"),
        )
        captures, captures_after = present("oracle_capture"), present("oracle_capture_after_warmup")
        out.append(
            {
                "controller": key,
                "label": label_of(key),
                "windows": len(mine),
                "holds_slo": sum(bool(r["holds_slo"]) for r in mine),
                "extra_missed_requests": sum(int(r["extra_missed_requests"]) for r in mine),
                "mean_energy_saved_fraction": statistics.fmean(saved) if saved else None,
                "mean_energy_saved_after_warmup_fraction": (
                    statistics.fmean(after) if after else None
                ),
                "median_oracle_capture": statistics.median(captures) if captures else None,
                "median_oracle_capture_after_warmup": (
                    statistics.median(captures_after) if captures_after else None
                ),
            }
        )
    return out


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def window_lines(summary: Sequence[dict[str, Any]]) -> list[str]:
    """The window summary as a fixed-width table (stdout)."""
    lines = [
        f"{'controller (windows)':<26} {'holds':>7} {'+missed':>8} {'saved':>7} "
        f"{'>warm':>7} {'capture':>8} {'cap>warm':>8}"
    ]
    for s in summary:
        lines.append(
            f"{s['label']:<26} {s['holds_slo']:>3}/{s['windows']:<3} "
            f"{s['extra_missed_requests']:>+8d} {_percent(s['mean_energy_saved_fraction']):>7} "
            f"{_percent(s['mean_energy_saved_after_warmup_fraction']):>7} "
            f"{_number(s['median_oracle_capture']):>8} "
            f"{_number(s['median_oracle_capture_after_warmup']):>8}"
        )
    return lines


def window_markdown(payload: dict[str, Any]) -> list[str]:
    """The markdown section of a ``--windows`` run (empty without one)."""
    summary = payload.get("window_summary")
    if not summary:
        return []
    config = payload["config"]
    lines = [
        "",
        "## Held-out windows",
        "",
        f"{config['windows']} windows per trace (starts: "
        + "; ".join(
            f"{trace} {', '.join(f'{s:g}' for s in starts)} s"
            for trace, starts in payload.get("window_starts_s", {}).items()
        )
        + "). Extra missed: requests missing the SLO beyond the maximum clock's on the same "
        "window, summed; savings are means over the windows, captures medians.",
        "",
        "| controller | windows holding SLO | extra missed | mean saved | mean saved after "
        "warm-up | median capture | median capture after warm-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    overlaps = overlap_lines(payload.get("window_overlaps", ()))
    if overlaps:
        lines[-3:-3] = [
            "",
            "Not held out from each other: their source stretches of the trace overlap "
            "(a window's source is longer than --duration where the load scale is above 1, "
            "and one past the trace's end is moved back; lower --windows or --duration): "
            + "; ".join(overlaps)
            + ".",
        ]
    for s in summary:
        lines.append(
            f"| {s['label']} | {s['holds_slo']}/{s['windows']} | "
            f"{s['extra_missed_requests']:+d} | {_percent(s['mean_energy_saved_fraction'])} | "
            f"{_percent(s['mean_energy_saved_after_warmup_fraction'])} | "
            f"{_number(s['median_oracle_capture'])} | "
            f"{_number(s['median_oracle_capture_after_warmup'])} |"
        )
    return lines


__all__ = [
    "missed_requests",
    "overlap_lines",
    "summarize_windows",
    "window_fields",
    "window_lines",
    "window_markdown",
    "window_overlaps",
    "window_starts",
]
