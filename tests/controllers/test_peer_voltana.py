"""The VoltanaLLM-style per-phase peer (``controllers.peers.voltana``) on hand-made
observations: each role's rule, the learned latency table, the idle reset, and the
daemon's ``voltana`` kind."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gpugov.controllers.peers.voltana import LatencyTable, VoltanaController, batch_bucket
from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_config import VoltanaControllerConfig
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.plant.types import ServingObservation

CLOCKS = tuple(float(c) for c in range(500, 2001, 100))  # 16 clocks
TTFT_SLO, TPOT_SLO = 1.0, 0.05


def obs(time_s: float, role: str, **changes: Any) -> ServingObservation:
    """An idle pool's observation of ``role`` at ``time_s`` (fields overridable)."""
    fields: dict[str, Any] = {
        "time_s": time_s,
        "step_index": int(time_s * 4),
        "arrived_requests": 0,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 0,
        "generated_decode_tokens": 0.0,
        "temperature_c": 50.0,
        "supported_clocks_mhz": CLOCKS,
        "requested_clock_mhz": CLOCKS[-1],
        "realized_clock_mhz": CLOCKS[-1],
        "gpu_utilization": 0.0,
        "prompt_tokens_total": 0.0,
        "ttft_slo_s": TTFT_SLO,
        "tpot_slo_s": TPOT_SLO,
        "role": role,
    }
    fields.update(changes)
    return ServingObservation(**fields)


def test_frequency_list_and_table() -> None:
    voltana = VoltanaController(levels=4)
    assert voltana.frequency_list(CLOCKS) == (500.0, 1000.0, 1500.0, 2000.0)
    assert VoltanaController(levels=32).frequency_list(CLOCKS) == CLOCKS
    table = LatencyTable(alpha=0.5)
    assert table.predict(0, 1000.0) is None
    table.record(0, 2000.0, 0.01)
    table.record(0, 2000.0, 0.03)  # averaged: 0.01 + 0.5 * 0.02
    assert table.predict(0, 2000.0) == pytest.approx(0.02)
    assert table.predict(0, 1000.0) == pytest.approx(0.04)  # 1 / f from the nearest
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 64)] == [0, 1, 2, 2, 3, 6]
    for bad in ({"margin": -1.0}, {"levels": 1}, {"idle_reset_s": -1.0}, {"alpha": 0.0}):
        with pytest.raises(ValueError, match="voltana"):
            VoltanaController(**bad)


def test_decode_rule_steps_down_to_the_lowest_meeting_clock_and_up_under_a_queue() -> None:
    voltana = VoltanaController(levels=16)
    # Nothing measured for this batch: the top clock.
    assert voltana(obs(0.0, "decode", decode_active=8)) == CLOCKS[-1]
    # Measured at the top clock: 10 ms per token; the target is 0.8 x 50 ms = 40 ms, so
    # with latency ~ 1/f the lowest meeting clock is 2000 * 10 / 40 = 500 MHz.
    assert voltana(obs(0.25, "decode", decode_active=8, tpot_recent_s=0.010)) == 500.0
    # Measured there: 45 ms (over the target). Predictions now come from 500 MHz for
    # the clocks nearer to it: 45 * 500 / 600 = 37.5 ms meets at 600 MHz.
    seen = obs(
        0.5,
        "decode",
        decode_active=8,
        tpot_recent_s=0.045,
        requested_clock_mhz=500.0,
        realized_clock_mhz=500.0,
    )
    assert voltana(seen) == 600.0
    # Another batch bucket has nothing measured: the top clock again.
    assert voltana(obs(0.75, "decode", decode_active=100, requested_clock_mhz=600.0)) == 2000.0
    # Requests waiting for admission on a decode pool: the top clock.
    assert voltana(obs(1.0, "decode", decode_active=8, waiting_requests=3)) == CLOCKS[-1]
    # A decode pool never runs the prefill rule (no backlog in its view anyway).
    assert voltana.prefill_time.entries == {}


def prefill_windows(voltana: VoltanaController, clock: float, rate: float) -> float:
    """Feed two windows of prefill at ``clock`` computing ``rate`` prompt tokens per
    busy second (half busy), a backlog of 4,000 tokens queued; the last decision."""
    decision = 0.0
    for k in range(2):
        decision = voltana(
            obs(
                10.0 + 0.25 * k,
                "prefill",
                prefill_remaining_tokens=4000.0,
                waiting_requests=2,
                gpu_utilization=0.5,
                prompt_tokens_total=rate * 0.125 * (k + 1),
                requested_clock_mhz=clock,
                realized_clock_mhz=clock,
                ttft_recent_prompt_tokens=2000.0,
            )
        )
    return decision


def test_prefill_rule_drains_the_backlog_within_the_ttft_target() -> None:
    voltana = VoltanaController(levels=16)
    # First window: counters unknown, nothing measured: the top clock.
    first = voltana(obs(10.0, "prefill", prefill_remaining_tokens=4000.0, waiting_requests=2))
    assert first == CLOCKS[-1]
    # 10,000 prompt tokens per busy second at 2000 MHz: 4,000 tokens take 0.4 s there,
    # 0.4 * 2000 / f at f; the target is 0.8 s: 1000 MHz. Waiting requests do not pin a
    # prefill pool at the top clock (its backlog's drain time is the rule).
    voltana = VoltanaController(levels=16)
    assert prefill_windows(voltana, 2000.0, 10_000.0) == 1000.0
    # A slower measured rate asks for a higher clock.
    voltana = VoltanaController(levels=16)
    assert prefill_windows(voltana, 2000.0, 6_000.0) > 1000.0
    # No backlog now, but prompts computed in the window: one window-mean prompt (2,000
    # tokens, 0.2 s at 2000 MHz) sets the clock, so it drops between bursts.
    voltana = VoltanaController(levels=16)
    prefill_windows(voltana, 2000.0, 10_000.0)
    between = voltana(
        obs(
            10.5,
            "prefill",
            gpu_utilization=0.5,
            prompt_tokens_total=10_000.0 * 0.125 * 3,
            ttft_recent_prompt_tokens=2000.0,
        )
    )
    assert between == 500.0


def test_hold_then_idle_reset_and_colocated_takes_the_higher_clock() -> None:
    voltana = VoltanaController(levels=16, idle_reset_s=5.0)
    voltana(obs(0.0, "decode", decode_active=4, tpot_recent_s=0.01))
    # No metrics: hold the requested clock until five seconds pass, then the lowest.
    assert voltana(obs(1.0, "decode", requested_clock_mhz=1200.0)) == 1200.0
    assert voltana(obs(5.5, "decode", requested_clock_mhz=1200.0)) == CLOCKS[0]
    # Colocated: both rules, the higher clock wins (decode unmeasured here: the top).
    colocated = VoltanaController(levels=16)
    assert colocated(obs(0.0, "colocated", decode_active=4)) == CLOCKS[-1]


def test_nan_signals_give_a_supported_clock() -> None:
    chain = build_controller(
        parse_controller_spec("voltana"),
        ControllerContext(period_s=0.25, supported_clocks_mhz=CLOCKS, role="decode"),
    )
    for t in range(20):
        signals: dict[str, Any] = {"tpot_recent_s": 0.02}
        if t % 3 == 0:
            signals = {"tpot_recent_s": math.nan, "realized_clock_mhz": math.nan}
        seen = obs(0.25 * t, "decode", decode_active=t % 4, **signals)
        assert chain(seen) in CLOCKS


def test_daemon_kind_parses() -> None:
    assert parse_controller_spec("voltana") == VoltanaControllerConfig(kind="voltana")
    config = parse_config(
        {
            "domains": [
                {
                    "name": "d",
                    "gpus": [0],
                    "role": "decode",
                    "controller": {"kind": "voltana", "margin": -0.1, "levels": 6},
                }
            ]
        }
    )
    spec = config.domains[0].controller
    assert isinstance(spec, VoltanaControllerConfig) and spec.levels == 6
    with pytest.raises(ValueError, match="--controller"):
        parse_controller_spec("voltana:3")
