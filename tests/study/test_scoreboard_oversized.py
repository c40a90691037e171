"""A scenario leaves out (and counts) requests larger than the profile's KV cache, as an
engine refuses a prompt over its max_model_len, instead of failing the whole scoreboard."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import pytest
from synthetic import make_plant

from gpugov.daemon.cli_support import MAX_SIMULATED_DAYS
from gpugov.plant import PerformanceProfile, ServingPlant
from gpugov.plant.profile_files import load_profile
from gpugov.plant.types import Request
from gpugov.study.scoreboard import scenarios
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


def _slow_profile() -> PerformanceProfile:
    """The bundled H100 8B profile 4,000 times slower (about 1 token/s of decode): a light
    load of one short window lasts simulated weeks."""
    profile = load_profile("h100-sxm-llama3-8b")
    return dataclasses.replace(
        profile,
        name="slow-8b",
        prefill_tokens_per_s=profile.prefill_tokens_per_s / 4000.0,
        decode_tokens_per_s=profile.decode_tokens_per_s / 4000.0,
    )


def _recorded_probes(monkeypatch: pytest.MonkeyPatch, attained: float = 1.0) -> list[float]:
    """The load scales of the capacity probes run from here on, each answered ``attained``
    (1.0 at the first probe's scale or lighter) instead of simulated."""
    scales: list[float] = []

    def attainment(requests: Sequence[Request], plant: ServingPlant, load_scale: float) -> float:
        scales.append(load_scale)
        return 1.0 if load_scale <= scales[0] else attained

    monkeypatch.setattr(scenarios, "slo_attainment_at_maximum", attainment)
    return scales


def test_a_profile_too_slow_for_the_capacity_search_is_a_skipped_scenario(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A profile of about 1 token/s made ``bench controllers`` seem to hang: the capacity
    search's light-load probe of a 15 s window simulated 8.4 days, its lighter ones 4 and
    16 times more. A first probe past MAX_SIMULATED_DAYS is not run: the scenario is skipped
    with the reason, as an empty window is."""
    from gpugov.study.scoreboard import run as scoreboard

    probes = _recorded_probes(monkeypatch)
    requests = tuple(Request(i, 0.1 * i, 800, 1000) for i in range(1000))
    shared = {"profile:slow-8b": _slow_profile(), "trace:made-up": (requests, "0" * 64)}
    out = scoreboard._run_task(
        ("made-up", "slow-8b", "recorded", scoreboard.TINY, False, None), shared
    )
    assert out["skipped"]["scenario"] == "made-up|slow-8b|recorded"
    reason = out["skipped"]["reason"]
    assert reason.startswith("its light-load capacity probe would simulate ")
    assert "over the limit of 7 simulated days: slow-8b takes " in reason
    assert probes == []
    plant = ServingPlant.from_profile(_slow_profile())
    with pytest.raises(scenarios.ProbeTooLongError):
        build_scenario("made-up", plant, "cap70", 15.0, (requests, "0" * 64))
    assert isinstance(scenarios.ProbeTooLongError("x"), scenarios.ScenarioSkip)


def test_lighter_capacity_probes_past_the_simulated_days_limit_are_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The light-load probe fits in MAX_SIMULATED_DAYS and the 4x lighter one does not: it
    is not run, the light load stays the reference, and the search goes on from it."""
    probes = _recorded_probes(monkeypatch, attained=0.5)
    plant = ServingPlant.from_profile(_slow_profile())
    requests = [Request(i, 0.25 * i, 800, 100) for i in range(200)]
    work_s = scenarios.work_seconds_at_maximum(requests, plant.profile)
    capacity, reference, runs = scenarios.slo_capacity(requests, plant, 50.0)
    limit_s = MAX_SIMULATED_DAYS * 86_400.0
    light = probes[0]
    assert scenarios.probe_span_s(requests, light, work_s) <= limit_s
    assert scenarios.probe_span_s(requests, light / 4.0, work_s) > limit_s
    assert min(probes) == light and runs == len(probes) == 6  # light, guess, 4 bisections
    assert reference == 1.0 and light <= capacity < probes[1]
