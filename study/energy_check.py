"""Compare the daemon's energy estimate with the plant's truth (``gpugov load``, benches).

The estimate is the daemon's cumulative attribution (``gpugov_energy_joules_total`` per
phase, ``gpugov_energy_tokens_total`` per kind, ``gpugov_energy_requests_total``) read
at several times; the truth is the plant's exact energy per phase and per request
(``gpugov emulate``'s ``/gpugov/energy`` and each response's ``usage``, or the plant
itself in-process). Reported:

* J per output token over the run, as ML.ENERGY reports it ((prefill + decode) / output
  tokens, idle excluded), estimate against truth;
* per-phase totals (prefill, decode, idle) over the run;
* per request: the daemon's rates at the time x the request's tokens, i.e.
  ``prompt x (prefill J / prompt token around its first token) + output x (decode J /
  output token from its first token to its end)``, each rate taken over at least
  ``min_span_s`` of the daemon's series centred on the request, against the truth;
  median and p90 of the relative error;
* energy per 1,000 requests (request energy only) against the truth.

Relative errors are ``(estimate - truth) / truth``; the summary's ``*_error`` fields are
absolute values of those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SERIES_FIELDS = (
    "prefill_j",
    "decode_j",
    "idle_j",
    "prompt_tokens",
    "output_tokens",
    "requests",
)


@dataclass(frozen=True)
class EstimateSeries:
    """The daemon's cumulative attribution at increasing times (seconds, any origin)."""

    times_s: np.ndarray
    values: dict[str, np.ndarray]

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[float, dict[str, float]]]) -> EstimateSeries:
        """From ``(time, {field: cumulative value})`` rows; missing fields count 0."""
        ordered = sorted(rows, key=lambda row: row[0])
        times = np.asarray([t for t, _ in ordered], dtype=float)
        values = {
            name: np.asarray([float(row.get(name, 0.0)) for _, row in ordered], dtype=float)
            for name in SERIES_FIELDS
        }
        return cls(times, values)

    def at(self, name: str, time_s: float) -> float:
        """The cumulative ``name`` at ``time_s`` (linear between rows, held at the ends)."""
        return float(np.interp(time_s, self.times_s, self.values[name]))

    def delta(self, name: str, start_s: float, end_s: float) -> float:
        """How much ``name`` grew from ``start_s`` to ``end_s``."""
        return self.at(name, end_s) - self.at(name, start_s)

    def rate(
        self, energy: str, tokens: str, start_s: float, end_s: float, min_span_s: float
    ) -> float | None:
        """``energy`` J per ``tokens`` over ``[start_s, end_s]`` widened symmetrically to
        at least ``min_span_s`` (None when no token was counted there)."""
        span = end_s - start_s
        if span < min_span_s:
            widen = 0.5 * (min_span_s - span)
            start_s, end_s = start_s - widen, end_s + widen
        count = self.delta(tokens, start_s, end_s)
        if count <= 0:
            return None
        return self.delta(energy, start_s, end_s) / count


@dataclass(frozen=True)
class RequestTruth:
    """One finished request's tokens, times (same clock as the series) and true energy."""

    prompt_tokens: float
    output_tokens: float
    first_token_s: float
    end_s: float
    true_j: float


def _relative(estimate: float | None, truth: float | None) -> float | None:
    if estimate is None or truth is None or not truth > 0:
        return None
    return (estimate - truth) / truth


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def compare(
    series: EstimateSeries,
    truth: dict[str, float],
    requests: Sequence[RequestTruth],
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    min_span_s: float = 10.0,
    lag_s: float = 0.0,
) -> dict[str, Any]:
    """The comparison the module notes describe, as a JSON-able dict.

    Args:
        series: the daemon's cumulative attribution.
        truth: the plant's totals over ``[start_s, end_s]``: ``prefill_j``,
            ``decode_j``, ``idle_j``, ``output_tokens`` and ``requests``.
        requests: finished requests with their true energy.
        start_s, end_s: the span compared (default: the series' first and last times).
        lag_s: how far the daemon's attribution trails the truth (its window and
            scrape): the estimate is read over ``[start_s + lag_s, end_s + lag_s]``.
    """
    if series.times_s.size < 2:
        raise ValueError("the daemon's series needs at least two readings")
    start = float(series.times_s[0]) if start_s is None else float(start_s)
    end = float(series.times_s[-1]) if end_s is None else float(end_s)
    estimate = {name: series.delta(name, start + lag_s, end + lag_s) for name in SERIES_FIELDS}
    phases: dict[str, dict[str, float | None]] = {}
    for phase in ("prefill", "decode", "idle"):
        mine, real = estimate[f"{phase}_j"], truth.get(f"{phase}_j")
        phases[phase] = {"estimate_j": mine, "truth_j": real, "error": _relative(mine, real)}
    mine_token = _ratio(estimate["prefill_j"] + estimate["decode_j"], estimate["output_tokens"])
    real_token = _ratio(
        truth.get("prefill_j", 0.0) + truth.get("decode_j", 0.0), truth.get("output_tokens", 0.0)
    )
    mine_request = _ratio(estimate["prefill_j"] + estimate["decode_j"], estimate["requests"])
    real_request = _ratio(
        truth.get("prefill_j", 0.0) + truth.get("decode_j", 0.0), truth.get("requests", 0.0)
    )
    errors = []
    for request in requests:
        prompt_rate = series.rate(
            "prefill_j", "prompt_tokens", request.first_token_s, request.first_token_s, min_span_s
        )
        decode_rate = series.rate(
            "decode_j", "output_tokens", request.first_token_s, request.end_s, min_span_s
        )
        if prompt_rate is None or decode_rate is None:
            continue
        guess = request.prompt_tokens * prompt_rate + request.output_tokens * decode_rate
        error = _relative(guess, request.true_j)
        if error is not None and math.isfinite(error):
            errors.append(error)
    spread = np.abs(np.asarray(errors, dtype=float))
    return {
        "span_s": end - start,
        "joules_per_output_token": {
            "estimate": mine_token,
            "truth": real_token,
            "error": _relative(mine_token, real_token),
        },
        "phases": phases,
        "kilojoules_per_1000_requests": {
            "estimate": None if mine_request is None else mine_request,
            "truth": None if real_request is None else real_request,
            "error": _relative(mine_request, real_request),
        },
        "per_request": {
            "compared": len(errors),
            "median_error": float(np.median(spread)) if errors else None,
            "p90_error": float(np.percentile(spread, 90)) if errors else None,
            "median_signed_error": float(np.median(errors)) if errors else None,
        },
    }


def format_comparison(result: dict[str, Any]) -> str:
    """The comparison as a few summary lines."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100.0 * value:+.1f}%"

    def num(value: float | None, digits: int = 3) -> str:
        return "n/a" if value is None else f"{value:.{digits}g}"

    token = result["joules_per_output_token"]
    request = result["kilojoules_per_1000_requests"]
    per = result["per_request"]
    lines = [
        f"  energy, J per output token (ML.ENERGY)  estimate {num(token['estimate'])}, "
        f"truth {num(token['truth'])} ({pct(token['error'])})",
    ]
    for phase, row in result["phases"].items():
        estimate, truth = row["estimate_j"], row["truth_j"]
        lines.append(
            f"  energy, {phase:<7} total                estimate "
            f"{num(None if estimate is None else estimate / 1e3)} kJ, truth "
            f"{num(None if truth is None else truth / 1e3)} kJ ({pct(row['error'])})"
        )
    lines.append(
        f"  energy per 1,000 requests              estimate {num(request['estimate'])} kJ, "
        f"truth {num(request['truth'])} kJ ({pct(request['error'])})"
    )
    median, p90 = per["median_error"], per["p90_error"]
    lines.append(
        f"  per-request energy error median / p90  "
        f"{'n/a' if median is None else f'{100 * median:.1f}%'} / "
        f"{'n/a' if p90 is None else f'{100 * p90:.1f}%'} over {per['compared']} requests"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------- live sources
class EnergySourceError(ValueError):
    """The governor's metrics or the emulator's truth cannot be read; the message says
    which URL and why."""


def _get(url: str, timeout_s: float) -> bytes:
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise EnergySourceError(f"{url}: expected http://HOST:PORT/PATH")
    try:
        port = parts.port or 80
    except ValueError as error:
        raise EnergySourceError(f"{url}: {error}") from error
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = http.client.HTTPConnection(parts.hostname, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read(64 << 20)
        if response.status != 200:
            raise EnergySourceError(f"{url}: HTTP {response.status} {response.reason}")
        return body
    except (OSError, http.client.HTTPException) as error:
        raise EnergySourceError(f"{url}: does not answer: {error}") from error
    finally:
        connection.close()


GOVERNOR_SERIES = {
    "gpugov_energy_joules_total": (
        "phase",
        {"prefill": "prefill_j", "decode": "decode_j", "idle": "idle_j"},
    ),
    "gpugov_energy_tokens_total": ("kind", {"prompt": "prompt_tokens", "output": "output_tokens"}),
}


def read_governor(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """The daemon's cumulative attribution, summed over domains and models, from its
    ``/metrics`` page at ``url``.

    Raises:
        EnergySourceError: no answer, not Prometheus text, or no ``gpugov_energy_*``
            series on the page (not a gpugov daemon, or one without energy attribution).
    """
    from prometheus_client.parser import text_string_to_metric_families

    text = _get(url, timeout_s).decode("utf-8", errors="replace")
    totals = dict.fromkeys(SERIES_FIELDS, 0.0)
    found = False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "gpugov_energy_skipped_windows_total":
                    found = True  # a daemon with attribution, maybe no window yet
                    continue
                if sample.name == "gpugov_energy_requests_total":
                    totals["requests"] += float(sample.value)
                    found = True
                    continue
                spec = GOVERNOR_SERIES.get(sample.name)
                if spec is None:
                    continue
                field = spec[1].get(sample.labels.get(spec[0], ""))
                if field is not None:
                    totals[field] += float(sample.value)
                    found = True
    except ValueError as error:
        raise EnergySourceError(f"{url}: not Prometheus text: {error}") from error
    if not found:
        raise EnergySourceError(
            f"{url}: no gpugov_energy_* series (not a gpugov daemon's /metrics, or it has "
            "not attributed a window yet)"
        )
    return totals


def read_truth(base: str, timeout_s: float = 5.0) -> dict[str, float]:
    """The emulator's exact totals (``GET /gpugov/energy``) under the fields of
    :data:`SERIES_FIELDS` (``requests``: the requests it lists as finished).

    Raises:
        EnergySourceError: no answer, or not the truth endpoint's JSON.
    """
    import json

    url = base.rstrip("/") + "/gpugov/energy"
    raw = _get(url, timeout_s)
    try:
        body = json.loads(raw)
        totals = body["totals"]
        out = {
            "prefill_j": float(totals["prefill_j"]),
            "decode_j": float(totals["decode_j"]),
            "idle_j": float(totals["idle_j"]),
            "prompt_tokens": float(totals["prompt_tokens"]),
            "output_tokens": float(totals["output_tokens"]),
            "requests": float(len(body.get("requests") or ())),
        }
    except (ValueError, KeyError, TypeError) as error:
        raise EnergySourceError(f"{url}: not the emulator's energy truth ({error!r})") from error
    return out


class GovernorSampler:
    """Reads the daemon's attribution every ``interval_s`` in a daemon thread, stamped
    with ``clock`` (the load's own clock); a failed read is counted and skipped."""

    def __init__(self, url: str, *, interval_s: float = 1.0, clock: Any = None) -> None:
        import threading
        import time

        self.url = url
        self.interval_s = interval_s
        self._clock = clock or time.monotonic
        self.rows: list[tuple[float, dict[str, float]]] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpugov-energy", daemon=True)

    def sample(self) -> None:
        """One read now."""
        try:
            values = read_governor(self.url, timeout_s=max(0.5, self.interval_s))
        except EnergySourceError:
            self.failures += 1
            return
        self.rows.append((self._clock(), values))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        """Read once now, then every interval."""
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and read a last time."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        self.sample()

    def series(self) -> EstimateSeries:
        """What was read."""
        return EstimateSeries.from_rows(self.rows)
