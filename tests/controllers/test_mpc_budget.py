"""mpc-slsqp in virtual time is reproducible: a deterministic evaluation budget, not the
0.8 s wall-clock limit, bounds its solves, so a busy machine cannot change a decision."""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.controllers.mpc import DEFAULT_SOLVE_BUDGET_EVALUATIONS, MPCController
from gpugov.daemon.cli_support import simulated_controller
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, load_trace, simulate

PROFILE = "h100-sxm-llama3-8b"


@pytest.fixture(scope="module")
def setting() -> tuple[tuple, ServingPlant]:  # type: ignore[type-arg]
    workload, _ = load_trace("azure-conv-10min", duration_s=20.0)
    return workload, ServingPlant.from_profile(load_profile(PROFILE))


def _run(setting, *, busy: bool = False, budget: int | None = None) -> tuple[list, MPCController]:  # type: ignore[no-untyped-def,type-arg]
    workload, plant = setting
    chain = simulated_controller("mpc-slsqp", plant, workload, 1.0)
    controller = chain.unwrapped
    assert isinstance(controller, MPCController)
    if busy:
        ticks = count()
        controller.timer = lambda: float(next(ticks))  # every solve "takes" 1 s > 0.8 s
    if budget is not None:
        controller.solve_budget_evaluations = budget
    result = simulate(workload, plant, chunked_prefill_scheduler, controller)
    return list(result.requested_clock_mhz), controller


def test_offline_mpc_slsqp_uses_the_budget_not_the_wall_clock(setting) -> None:  # type: ignore[no-untyped-def]
    calm, calm_controller = _run(setting)
    busy, busy_controller = _run(setting, busy=True)
    assert calm_controller.solve_budget_evaluations == DEFAULT_SOLVE_BUDGET_EVALUATIONS
    assert busy == calm  # identical decisions although every solve looked 1 s long
    assert busy_controller.fallback_reasons["overrun"] == 0
    assert busy_controller.fallback_reasons == calm_controller.fallback_reasons
    assert calm_controller.successful_solves > 0


def test_a_solve_past_the_budget_falls_back_with_reason_budget(setting) -> None:  # type: ignore[no-untyped-def]
    first, controller = _run(setting, budget=3)
    again, _ = _run(setting, budget=3)
    assert first == again
    reasons = controller.fallback_reasons
    assert reasons["budget"] == controller.fallback_count > 0
    assert controller.successful_solves == 0  # no SLSQP solve fits in 3 evaluations


def test_on_a_node_the_wall_clock_limit_still_applies(setting) -> None:  # type: ignore[no-untyped-def]
    workload, plant = setting
    controller = MPCController(plant, solve_time_limit_s=0.8)
    ticks = count()
    controller.timer = lambda: float(next(ticks))
    simulate(workload[:20], plant, chunked_prefill_scheduler, controller)
    assert controller.solve_budget_evaluations is None
    assert controller.fallback_reasons["overrun"] == controller.fallback_count > 0


def test_simulate_json_records_fallbacks_and_runs_repeat(tmp_path: Path) -> None:
    payloads = []
    for name in ("a.json", "b.json"):
        out = tmp_path / name
        argv = ["simulate", "--controller", "mpc-slsqp", "--duration", "15", "--out", str(out)]
        assert main(argv) == 0
        payloads.append(json.loads(out.read_text()))
    record = payloads[0]["metadata"]["controller_diagnostics"]
    assert record["solve_budget_evaluations"] == DEFAULT_SOLVE_BUDGET_EVALUATIONS
    assert set(record["fallback_reasons"]) >= {"budget", "overrun", "solver_failed"}
    assert record["fallbacks"] == sum(record["fallback_reasons"].values())
    series = [p["series"]["requested_clock_mhz"] for p in payloads]
    assert series[0] == series[1]
    assert payloads[0]["metrics"]["energy_j"] == payloads[1]["metrics"]["energy_j"]
