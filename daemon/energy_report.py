"""``gpugov status``'s energy line: the running daemon's last-minute rates, read from its
own ``/metrics`` (``gpugov_energy_*``, :mod:`daemon.energy`)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.scrape import MAX_PAGE_BYTES

RATE_SERIES = {
    "gpugov_energy_per_output_token_joules": "joules_per_output_token",
    "gpugov_energy_per_prompt_token_joules": "joules_per_prompt_token",
    "gpugov_energy_per_request_joules": "joules_per_request",
}


def check_metrics_url(url: str) -> None:
    """Refuse a URL that is not ``http(s)://HOST[:PORT]/...``.

    Raises:
        ValueError: naming the URL.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as error:
        raise ValueError(f"{url[:200]!r}: {error}") from error
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url[:200]!r}: expected http://HOST:PORT/metrics")


def governor_energy(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """The daemon's last-minute energy rates per domain and model, or why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read(MAX_PAGE_BYTES).decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return {"url": url, "reachable": False, "error": str(reason)}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = RATE_SERIES.get(sample.name)
                if name is None:
                    continue
                key = (sample.labels.get("domain", ""), sample.labels.get("model", ""))
                row = rows.setdefault(key, {"domain": key[0], "model": key[1]})
                row[name] = float(sample.value)
    except ValueError as error:
        return {"url": url, "reachable": False, "error": f"not Prometheus text: {error}"}
    return {"url": url, "reachable": True, "models": [rows[k] for k in sorted(rows)]}


def energy_lines(report: dict[str, Any]) -> list[str]:
    """``gpugov status``'s lines for :func:`governor_energy`'s report."""
    url = report["url"]
    if not report["reachable"]:
        return [f"energy ({url}): unreachable: {report['error']}"]
    if not report["models"]:
        return [f"energy ({url}): no estimate yet (no window with tokens in the last minute)"]
    lines = []
    for row in report["models"]:
        token = row.get("joules_per_output_token")
        request = row.get("joules_per_request")
        text = (
            "n/a J per output token"
            if token is None
            else f"{token:.3g} J per output token (ML.ENERGY's unit)"
        )
        if request is not None:
            text += f", {request:.3g} kJ ({request / 3.6:.3g} Wh) per 1,000 requests"
        lines.append(f"energy {row['domain']}/{row['model']}, last minute: {text}")
    return lines
