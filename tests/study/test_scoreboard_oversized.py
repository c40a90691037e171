"""A scenario leaves out (and counts) requests larger than the profile's KV cache, as an
engine refuses a prompt over its max_model_len, instead of failing the whole scoreboard."""

from __future__ import annotations

import hashlib

import pytest
from synthetic import make_plant

from gpugov.plant.types import Request
from gpugov.study.scoreboard.scenarios import EmptyWindowError, build_scenario


def test_requests_larger_than_the_kv_cache_are_rejected_and_counted() -> None:
    plant = make_plant(kv_capacity_tokens=20_000)
    requests = tuple(Request(i, 0.5 * i, 30_000 if i % 25 == 7 else 800, 100) for i in range(400))
    oversized = sum(1 for r in requests if r.prompt_tokens + r.output_tokens > 20_000)
    assert oversized > 0
    scenario = build_scenario(
        "made-up", plant, "recorded", 200.0, (requests, hashlib.sha256(b"x").hexdigest())
    )
    assert scenario.requests, "the scenario still runs"
    assert all(r.prompt_tokens + r.output_tokens <= 20_000 for r in scenario.requests)
    described = scenario.describe()
    assert described["rejected_requests"] > 0
    window = [
        r
        for r in requests
        if scenario.source_start_s
        <= r.arrival_time_s
        < scenario.source_start_s + scenario.source_duration_s
    ]
    assert described["rejected_requests"] == sum(r.prompt_tokens > 20_000 for r in window)
    assert described["requests"] + described["rejected_requests"] == len(window)


def test_start_s_moves_the_source_window() -> None:
    """``start_s`` runs a held-out window of a trace (``bench/online_windows.py``); without
    it the window starts where the trace's entry says (0 s for an unknown trace)."""
    plant = make_plant(kv_capacity_tokens=200_000)
    requests = tuple(Request(i, 0.5 * i, 800, 100) for i in range(2_000))
    trace = (requests, hashlib.sha256(b"y").hexdigest())
    default = build_scenario("made-up", plant, "recorded", 100.0, trace)
    moved = build_scenario("made-up", plant, "recorded", 100.0, trace, start_s=400.0)
    assert default.source_start_s == 0.0
    assert moved.source_start_s == 400.0
    assert moved.requests and default.requests
    # Re-based to the window's start, and drawn from the moved window's arrivals.
    assert min(r.arrival_time_s for r in moved.requests) < 1.0
    window = {
        r.request_id
        for r in requests
        if 400.0 <= r.arrival_time_s < 400.0 + moved.source_duration_s
    }
    assert {r.request_id for r in moved.requests} <= window


def test_a_trace_whose_every_request_is_too_large_is_an_empty_scenario() -> None:
    """Every request over the KV cache leaves nothing to run: the scenario is skipped with
    its reason (EmptyWindowError), not a ValueError traceback from the capacity search."""
    plant = make_plant(kv_capacity_tokens=20_000)
    requests = tuple(Request(i, float(i), 30_000, 100) for i in range(5))
    trace = (requests, hashlib.sha256(b"z").hexdigest())
    with pytest.raises(EmptyWindowError, match=r"no request fits .*KV cache of 20000 tokens"):
        build_scenario("made-up", plant, "cap70", 100.0, trace)


@pytest.mark.parametrize("load", ["recorded", "cap70"])
def test_a_window_in_an_idle_stretch_is_an_empty_scenario(load: str) -> None:
    """A held-out window of a bursty trace can fall in an idle gap (azure-code's reach
    217 s): skipped with its reason, not a ValueError traceback."""
    plant = make_plant(kv_capacity_tokens=200_000)
    requests = (Request(0, 0.0, 800, 100), Request(1, 1.0, 800, 100), Request(2, 100.0, 800, 100))
    trace = (requests, hashlib.sha256(b"w").hexdigest())
    with pytest.raises(EmptyWindowError, match=r"window from 33 s holds no requests"):
        build_scenario("made-up", plant, load, 10.0, trace, start_s=33.0)
