"""Run plots: ``simulate --plot`` and ``gpugov plot FILE.jsonl`` draw the same six panels.

Clocks (requested solid, realised dashed on top, so both show where they agree), power
against the cap, queues, TTFT and TPOT over their SLOs (one axis, latency / SLO, the SLO
at 1), and temperature against the thermal limit. matplotlib is the ``gpugov[plots]``
extra: it is imported here, inside the functions, and its absence is one clear line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpugov.daemon.cli_support import require_extra
from gpugov.plant.types import ttft_slo_at


def pyplot(needed_for: str = "plotting") -> Any:
    """``matplotlib.pyplot`` on the Agg backend (:func:`agg_pyplot`), or one
    :class:`UsageError` line naming the ``gpugov[plots]`` extra (``require_extra``)."""
    require_extra("matplotlib", needed_for)
    return agg_pyplot()


def agg_pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, every text drawn as written: matplotlib
    reads a pair of ``$`` as math, and a controller, trace or file name holding two
    (``plan_$x\\fr$.json``) raised a parse error when the figure was laid out or drawn,
    after the run's work.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def figure_bytes(fig: Any, image_format: str | None = "png", *, dpi: int = 110) -> bytes:
    """``fig`` drawn in memory as an image file's bytes (``image_format``: ``png``, ``svg``,
    ...; None: matplotlib's default), for a command that writes it with the rest of its
    outputs as one set (``write_files_atomic``)."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=image_format, dpi=dpi)
    return buffer.getvalue()


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110) -> None:
    """Save ``fig`` to ``path`` atomically: drawn in memory (the format from the
    extension), then written whole or not at all (a figure saved in place and cut short by
    a full disk or Ctrl-C left a broken image where a good one was)."""
    from gpugov.daemon.files import write_bytes_atomic

    target = Path(path)
    data = figure_bytes(fig, target.suffix.lstrip(".").lower() or None, dpi=dpi)
    write_bytes_atomic(target, data)


def check_image_format(flag: str, path: str | Path, needed_for: str = "plotting") -> None:
    """Refuse, before any work, a plot file whose extension matplotlib cannot write
    (``--plot run.txt`` failed after the whole run)."""
    pyplot(needed_for)  # the missing extra is one line
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lower().lstrip(".")
    supported = FigureCanvasBase.get_supported_filetypes()
    if suffix not in supported:
        from gpugov.daemon.cli_support import UsageError

        raise UsageError(
            f"{flag} {path}: not an image format matplotlib writes "
            f"({', '.join('.' + name for name in sorted(supported))})"
        )


@dataclass
class RunSeries:
    """What the run plot shows, from a simulation result or a recording (units in names)."""

    time_s: Sequence[float]
    requested_clock_mhz: Sequence[float | None]
    realized_clock_mhz: Sequence[float | None]
    power_w: Sequence[float | None]
    waiting: Sequence[float | None]
    decoding: Sequence[float | None]
    temperature_c: Sequence[float | None]
    ttft_points: tuple[Sequence[float], Sequence[float]] = ((), ())
    """(time, TTFT in seconds): per request at its first token, or windowed per tick."""
    tpot_points: tuple[Sequence[float], Sequence[float]] = ((), ())
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    ttft_slo_points: Sequence[float] = ()
    """Each TTFT point's own SLO (the flat SLO plus the allowance for its prompt); empty:
    ``ttft_slo_s`` for every point."""
    ttft_slo_per_prompt_token_s: float | None = None
    power_limit_w: float | None = None
    thermal_limit_c: float | None = None
    latency_kind: str = "per request"
    failsafe_s: Sequence[float] = field(default_factory=tuple)
    power_cap_w: Sequence[float | None] = field(default_factory=tuple)
    """The power limit gpugov held per tick (a recording's ``power_cap_w``; empty: none)."""


def series_from_result(result: Any) -> RunSeries:
    """A :class:`~gpugov.plant.ServingResult` as plot series (per-request latencies)."""
    ttft_t, ttft_v, tpot_t, tpot_v = [], [], [], []
    metrics = result.metrics
    ttft_slos = []
    for record in result.request_records:
        if record.ttft_s is not None:
            ttft_t.append(record.first_token_time_s)
            ttft_v.append(record.ttft_s)
            ttft_slos.append(
                ttft_slo_at(
                    metrics.ttft_slo_s, metrics.ttft_slo_per_prompt_token_s, record.prompt_tokens
                )
            )
        if record.tpot_s is not None:
            tpot_t.append(record.finish_time_s)
            tpot_v.append(record.tpot_s)
    plant = result.metadata.get("plant", {})
    return RunSeries(
        time_s=result.time_s,
        requested_clock_mhz=result.requested_clock_mhz,
        realized_clock_mhz=result.realized_clock_mhz,
        power_w=result.power_w,
        waiting=result.prefill_queue,
        decoding=result.decode_active,
        temperature_c=result.temperature_c,
        ttft_points=(ttft_t, ttft_v),
        tpot_points=(tpot_t, tpot_v),
        ttft_slo_s=metrics.ttft_slo_s,
        tpot_slo_s=metrics.tpot_slo_s,
        ttft_slo_points=ttft_slos,
        ttft_slo_per_prompt_token_s=metrics.ttft_slo_per_prompt_token_s,
        power_limit_w=plant.get("power_limit_w"),
        thermal_limit_c=plant.get("thermal_limit_c"),
    )


def series_from_recording(
    rows: Sequence[Mapping[str, Any]], domain: str | None = None
) -> RunSeries:
    """One domain's tick lines of a ``--record`` file as plot series (windowed latencies).

    The requested clock is the one the daemon asked for at each tick (after the safety
    wrappers); the realised one is what the GPU reported at the next tick, i.e. what it
    ran during that tick's interval, so the two line up; fail-safe ticks are marked.
    """
    mine = [r for r in rows if domain is None or r.get("domain") == domain]
    obs = [r.get("observation") or {} for r in mine]

    def column(key: str) -> list[float | None]:
        return [o.get(key) for o in obs]

    times = [float(o.get("time_s", r.get("time_s", 0.0))) for o, r in zip(obs, mine, strict=True)]

    def points(key: str) -> tuple[list[float], list[float]]:
        pairs = [(t, o[key]) for t, o in zip(times, obs, strict=True) if o.get(key) is not None]
        return [p[0] for p in pairs], [float(p[1]) for p in pairs]

    def last(key: str) -> float | None:
        values = [value for o in obs if (value := o.get(key)) is not None]
        return float(values[-1]) if values else None

    # Each window's TTFT against the SLO at its mean prompt, as the daemon judges it
    # (ServingObservation.ttft_recent_slo_s; NaN: no SLO recorded, the flat one is used).
    ttft_slos = [_window_ttft_slo_s(o) for o in obs if o.get("ttft_recent_s") is not None]
    return RunSeries(
        time_s=times,
        requested_clock_mhz=[r.get("requested_mhz") for r in mine],
        realized_clock_mhz=[*column("realized_clock_mhz")[1:], None],
        power_w=column("power_w"),
        waiting=column("waiting_requests"),
        decoding=column("decode_active"),
        temperature_c=column("temperature_c"),
        ttft_points=points("ttft_recent_s"),
        tpot_points=points("tpot_recent_s"),
        ttft_slo_s=last("ttft_slo_s"),
        tpot_slo_s=last("tpot_slo_s"),
        ttft_slo_points=ttft_slos,
        ttft_slo_per_prompt_token_s=last("ttft_slo_per_prompt_token_s"),
        power_limit_w=last("power_limit_w"),
        thermal_limit_c=last("thermal_limit_c"),
        latency_kind="windowed per tick",
        failsafe_s=[t for t, r in zip(times, mine, strict=True) if r.get("failsafe")],
        power_cap_w=[r.get("power_cap_w") for r in mine],
    )


def _window_ttft_slo_s(observation: Mapping[str, Any]) -> float:
    """The TTFT SLO of a recorded window's TTFT: the flat SLO plus the allowance for the
    window's mean prompt where both are recorded (NaN without a flat SLO)."""
    flat = observation.get("ttft_slo_s")
    if flat is None:
        return math.nan
    allowance = observation.get("ttft_slo_per_prompt_token_s")
    prompt = observation.get("ttft_recent_prompt_tokens")
    return ttft_slo_at(
        flat,
        None if allowance is None else float(allowance),
        None if prompt is None else float(prompt),
    )


def _clean(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def write_run_plot(series: RunSeries, path: str | Path, title: str) -> None:
    """Write the six-panel PNG of one run to ``path`` atomically."""
    from gpugov.daemon.files import write_bytes_atomic

    write_bytes_atomic(Path(path), run_plot_bytes(series, path, title))


def run_plot_bytes(series: RunSeries, path: str | Path, title: str) -> bytes:
    """The six-panel figure of one run, drawn in memory in the format ``path`` names, for
    a command that writes it with its other outputs as one set."""
    plt = pyplot()
    fig, axes = plt.subplots(
        6,
        1,
        figsize=(11, 13),
        sharex=True,
        gridspec_kw={"height_ratios": [1.3, 1, 1, 1.3, 1, 0.6]},
    )
    t = list(series.time_s)
    clocks, power, queue, latency, temperature = axes[0], axes[1], axes[2], axes[3], axes[4]
    clocks.step(
        t,
        _clean(series.requested_clock_mhz),
        where="post",
        lw=2.2,
        alpha=0.45,
        color="tab:blue",
        label="requested",
    )
    clocks.step(
        t,
        _clean(series.realized_clock_mhz),
        where="post",
        lw=0.9,
        ls="--",
        color="tab:red",
        label="realised",
    )
    for when in series.failsafe_s:
        clocks.axvline(when, color="tab:gray", lw=0.4, alpha=0.4)
    clocks.set_ylabel("SM clock (MHz)")
    clocks.legend(loc="lower right", fontsize=8, ncol=2)
    power.plot(t, _clean(series.power_w), lw=0.6, color="tab:red", label="power")
    if series.power_limit_w:
        power.axhline(series.power_limit_w, ls="--", color="k", lw=0.8, label="power limit")
    if any(value is not None for value in series.power_cap_w):
        power.step(
            t,
            _clean(series.power_cap_w),
            where="post",
            ls=":",
            color="tab:purple",
            lw=1.0,
            label="limit gpugov set",
        )
    power.set_ylabel("power (W)")
    power.legend(loc="upper right", fontsize=8)
    queue.plot(t, _clean(series.waiting), lw=0.8, label="waiting for first token")
    queue.plot(t, _clean(series.decoding), lw=0.8, label="decoding")
    queue.set_ylabel("requests")
    queue.legend(loc="upper right", fontsize=8)
    _latency_panel(latency, series)
    temperature.plot(
        t, _clean(series.temperature_c), color="tab:orange", lw=0.8, label="temperature"
    )
    if series.thermal_limit_c:
        temperature.axhline(
            series.thermal_limit_c,
            ls="--",
            color="k",
            lw=0.8,
            label=f"thermal limit {series.thermal_limit_c:g} C",
        )
    temperature.set_ylabel("temperature (C)")
    temperature.legend(loc="lower right", fontsize=8)
    difference = [
        (r - q) if r is not None and q is not None else None
        for q, r in zip(series.requested_clock_mhz, series.realized_clock_mhz, strict=True)
    ]
    axes[5].plot(t, _clean(difference), lw=0.7, color="tab:purple")
    axes[5].axhline(0.0, color="k", lw=0.5)
    axes[5].set_ylabel("realised -\nrequested (MHz)")
    axes[5].set_xlabel("time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    data = figure_bytes(fig, Path(path).suffix.lstrip(".").lower() or None)
    plt.close(fig)
    return data


def latency_over_slo(series: RunSeries) -> dict[str, tuple[list[float], list[float]]]:
    """Each TTFT and TPOT point over its SLO, by name (``TTFT``, ``TPOT``) as ``(times,
    ratios)``: a TTFT over its own prompt's SLO where the series has one per point (the
    TTFT SLO grows with the prompt), else over the flat one; a kind without an SLO or a
    point is left out."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for (times, values), slo, slos, name in (
        (series.ttft_points, series.ttft_slo_s, series.ttft_slo_points, "TTFT"),
        (series.tpot_points, series.tpot_slo_s, (), "TPOT"),
    ):
        if not slo or not len(times):
            continue
        own = list(slos) if len(slos) == len(values) else [slo] * len(values)
        pairs = [
            (float(t), float(v) / (s if s > 0 else slo))  # NaN (no SLO known): the flat one
            for t, v, s in zip(times, values, own, strict=True)
        ]
        out[name] = ([t for t, _ in pairs], [r for _, r in pairs])
    return out


def _latency_panel(axis: Any, series: RunSeries) -> None:
    """TTFT and TPOT over their SLOs on one log axis; the SLO is the line at 1."""
    shown = False
    colours = {"TTFT": "tab:green", "TPOT": "tab:purple"}
    for name, (times, ratios) in latency_over_slo(series).items():
        if name == "TTFT":
            allowance = series.ttft_slo_per_prompt_token_s or 0.0
            unit = f"{series.ttft_slo_s:g} s" + (
                f" + {allowance * 1e6:g} us/prompt token" if allowance > 0 else ""
            )
        else:
            unit = f"{(series.tpot_slo_s or 0.0) * 1000:g} ms"
        ratio = [max(r, 1e-3) for r in ratios]
        axis.scatter(
            times, ratio, s=3, alpha=0.5, color=colours[name], label=f"{name} / SLO ({unit})"
        )
        shown = True
    axis.axhline(1.0, ls="--", color="k", lw=0.8, label="SLO")
    if shown:
        axis.set_yscale("log")
    axis.set_ylabel(f"latency / SLO\n({series.latency_kind})")
    axis.legend(loc="upper right", fontsize=8, ncol=3)
