"""``mpc-online`` on an observation that pools several data-parallel engines: it learns and
plans one engine (``controllers.online.engines``), so a pool of like engines is governed as
one of them, and a lone prompt in a pool is planned at one engine's rate."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gpugov.controllers.mpc.controller import DEFAULT_SOLVE_BUDGET_EVALUATIONS
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.engines import RUNNING_FIELDS, SHARED_FIELDS, engine_view
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.disaggregated import simulate_disaggregated
from gpugov.plant.disaggregated_layout import DisaggregatedPlant, PoolSpec
from gpugov.plant.synthetic_workloads import LognormalLengths, poisson_workload
from gpugov.plant.types import Request, ServingObservation, replace_observation


def _observation(**values: Any) -> ServingObservation:
    base: dict[str, Any] = {
        "time_s": 10.0,
        "step_index": 10,
        "arrived_requests": 40,
        "prefill_remaining_tokens": 9000.0,
        "decode_active": 3,
        "generated_decode_tokens": 300.0,
        "temperature_c": 55.0,
        "waiting_requests": 2,
        "completed_requests": 30,
        "output_tokens_total": 6000.0,
        "prompt_tokens_total": 80000.0,
        "kv_tokens": 6000.0,
        "kv_capacity_tokens": 200000.0,
        "power_w": 900.0,
        "energy_j": 9000.0,
        "power_limit_w": 1400.0,
        "gpu_utilization": 0.7,
        "realized_clock_mhz": 1500.0,
        "ttft_count_total": 34.0,
        "ttft_within_slo_total": 33.0,
        "tpot_count_total": 30.0,
        "tpot_within_slo_total": 30.0,
        "ttft_recent_s": 0.4,
        "tpot_recent_s": 0.03,
    }
    return ServingObservation(**{**base, **values})


def test_one_engine_is_seen_as_it_is() -> None:
    observation = _observation()
    assert engine_view(observation) is observation


def test_a_pool_is_seen_as_one_engine_holding_the_busiest_backlog() -> None:
    pooled = _observation(engines=2, busiest_prefill_tokens=8000.0, prefill_tail_tokens=12000.0)
    view = engine_view(pooled)
    assert view.engines == 1 and view.busiest_prefill_tokens is None
    for name in SHARED_FIELDS:
        assert getattr(view, name) == pytest.approx(getattr(pooled, name) / 2), name
    # Three running requests on two engines: an engine that runs any runs 1.5, and the
    # KV and tokens per running request are the pool's.
    assert view.decode_active == pytest.approx(1.5)
    for name in RUNNING_FIELDS:
        per_request = getattr(view, name) / view.decode_active
        assert per_request == pytest.approx(getattr(pooled, name) / pooled.decode_active), name
    # The busiest engine's backlog, and the tail's excess (3000) all on it.
    assert view.prefill_remaining_tokens == 8000.0
    assert view.prefill_tail_tokens == pytest.approx(11000.0)
    # Utilisation, latencies, temperature and clock are the pool's.
    for name in ("gpu_utilization", "ttft_recent_s", "tpot_recent_s", "temperature_c"):
        assert getattr(view, name) == getattr(pooled, name)
    assert engine_view(view) is view


def test_an_unknown_busiest_backlog_is_all_on_one_engine_and_one_request_on_one() -> None:
    pooled = _observation(engines=4, decode_active=1, kv_tokens=3000.0)
    view = engine_view(pooled)
    assert view.prefill_remaining_tokens == pooled.prefill_remaining_tokens
    assert view.decode_active == 1.0
    assert view.kv_tokens == 3000.0
    idle = engine_view(_observation(engines=2, decode_active=0, kv_tokens=100.0))
    assert idle.decode_active == 0.0 and idle.kv_tokens == 50.0


def _doubled(observation: ServingObservation) -> ServingObservation:
    """The observation of a pool of two engines each in ``observation``'s state."""
    changes: dict[str, Any] = {"engines": 2}
    for name in (*SHARED_FIELDS, *RUNNING_FIELDS, "decode_active", "prefill_remaining_tokens"):
        value = getattr(observation, name)
        if value is not None:
            changes[name] = value * 2
    changes["busiest_prefill_tokens"] = observation.prefill_remaining_tokens
    if observation.prefill_tail_tokens is not None:
        excess = observation.prefill_tail_tokens - observation.prefill_remaining_tokens
        changes["prefill_tail_tokens"] = 2 * observation.prefill_remaining_tokens + excess
    return replace_observation(observation, changes)


def _controller(workload: list[Request]) -> OnlineMPCController:
    prompts = np.array([r.prompt_tokens for r in workload], dtype=float)
    outputs = np.array([r.output_tokens for r in workload], dtype=float)
    ticks = iter(range(10**9))
    return OnlineMPCController(
        mean_prompt_tokens=float(prompts.mean()),
        mean_output_tokens=float(outputs.mean()),
        control_period_s=0.5,
        timer=lambda: next(ticks) * 1e-6,
        solve_budget_evaluations=DEFAULT_SOLVE_BUDGET_EVALUATIONS,
    )


def test_a_pool_of_two_like_engines_is_governed_as_one_of_them() -> None:
    """Fed a pool of two engines in the same state as one engine, tick by tick, the
    controller makes the same decisions and reports twice the power need."""
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    workload = list(poisson_workload(3.0, 80.0, seed=7))
    single = _controller(workload)
    pooled = _controller(workload)
    decisions: list[tuple[float, float]] = []
    needs: list[tuple[float, float]] = []

    def both(observation: ServingObservation) -> float:
        clock = single(observation)
        decisions.append((clock, pooled(_doubled(observation))))
        one, two = single.power_needed(), pooled.power_needed()
        assert (one is None) == (two is None)
        if one is not None and two is not None:
            needs.append((one.watts, two.watts))
        return clock

    simulate(workload, plant, chunked_prefill_scheduler, both, 0, control_period_s=0.5)
    assert single.model is not None and single.model.warmed_up
    assert single.last_reason not in ("start", "warm-up")
    assert len({round(one) for one, _ in decisions}) > 1  # the clock moved
    assert [one for one, _ in decisions] == [two for _, two in decisions]
    assert needs and all(two == pytest.approx(2 * one) for one, two in needs)
    assert pooled.engines == 2 and single.engines == 1


def test_a_two_engine_prefill_pool_learns_one_engines_prefill_rate() -> None:
    """A 2P1D layout's prefill controller learns one engine's time per prompt token, not
    the two engines' joint rate (half of it), which would plan a lone prompt twice too
    fast."""
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    requests = poisson_workload(
        2.0, 150.0, seed=3, prompt_tokens=LognormalLengths(median=2500.0, mean=3500.0)
    )
    layout = DisaggregatedPlant(PoolSpec(plant, 2), PoolSpec(plant))
    controllers = {"prefill": _controller(list(requests)), "decode": _controller(list(requests))}
    simulate_disaggregated(requests, layout, controllers, 0, control_period_s=0.5)  # type: ignore[arg-type]
    model = controllers["prefill"].model
    assert model is not None and model.warmed_up
    realized = model.clocks_mhz * model.realized_ratio
    learned = float(model.table(realized, 1.0, 3000.0)["prefill_s_per_token"][0][-1])
    truth = 1.0 / float(plant.profile.prefill_tokens_per_s[-1])
    assert math.isfinite(learned)
    assert 0.75 * truth < learned < 1.35 * truth
