"""The plot's TTFT panel divided each TTFT by the flat ``ttft_slo_s`` alone: every bundled
profile's TTFT SLO grows with the prompt (``ttft_slo_per_prompt_token_s``), so a request
within its SLO was drawn over the line (a 2.5 s TTFT of 2,000 prompt tokens against
2 s + 400 us/token, 2.8 s, as 1.25 times its SLO). Each point is now over its own SLO."""

from __future__ import annotations

from typing import Any

import pytest

from gpugov.study.plots import RunSeries, latency_over_slo, series_from_recording


def _tick(time_s: float, ttft: float | None, prompt: float | None) -> dict[str, Any]:
    return {
        "domain": "sim",
        "requested_mhz": 1000.0,
        "observation": {
            "time_s": time_s,
            "ttft_recent_s": ttft,
            "ttft_recent_prompt_tokens": prompt,
            "ttft_slo_s": 2.0,
            "ttft_slo_per_prompt_token_s": 4e-4,
            "tpot_recent_s": 0.05,
            "tpot_slo_s": 0.1,
        },
    }


def test_each_ttft_is_over_its_own_prompts_slo() -> None:
    rows = [_tick(0.0, 2.5, 2000.0), _tick(1.0, None, None), _tick(2.0, 2.5, None)]
    series = series_from_recording(rows)
    ratios = latency_over_slo(series)
    times, ttft = ratios["TTFT"]
    assert times == [0.0, 2.0]
    # 2 s + 400 us x 2,000 tokens = 2.8 s; a window of unknown prompt: the flat 2 s.
    assert ttft == pytest.approx([2.5 / 2.8, 2.5 / 2.0])
    assert ratios["TPOT"] == ([0.0, 1.0, 2.0], pytest.approx([0.5, 0.5, 0.5]))


def test_a_flat_slo_divides_as_before() -> None:
    series = RunSeries(
        time_s=[0.0],
        requested_clock_mhz=[None],
        realized_clock_mhz=[None],
        power_w=[None],
        waiting=[None],
        decoding=[None],
        temperature_c=[None],
        ttft_points=([0.0, 1.0], [0.5, 3.0]),
        ttft_slo_s=1.0,
    )
    assert latency_over_slo(series)["TTFT"] == ([0.0, 1.0], [0.5, 3.0])
    assert "TPOT" not in latency_over_slo(series)  # no TPOT SLO: nothing to divide by
