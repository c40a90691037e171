"""The MPC solver comparison of the scoreboard: every decision point of a scenario's fast
MPC re-solved by SLSQP, the costs and solve times compared."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from gpugov.controllers.contract import ControllerWrapper
from gpugov.controllers.mpc.controller import (
    MPCController,
    MPCProblem,
    MPCSolver,
)
from gpugov.plant import ServingPlant
from gpugov.plant.types import ClockController, Request, ServingObservation
from gpugov.study.scoreboard.controllers import (
    scoreboard_mpc,
)


class TimedController(ControllerWrapper):
    """Times every call of ``inner``, its safety chain included (wall clock,
    ``perf_counter``): the whole decision a node would time."""

    def __init__(self, inner: ClockController) -> None:
        super().__init__(inner)
        self.call_times_s: list[float] = []

    def __call__(self, observation: ServingObservation) -> float:
        start = time.perf_counter()
        value = self.inner(observation)
        self.call_times_s.append(time.perf_counter() - start)
        return value


class ProblemRecorder:
    """Records every :class:`MPCProblem` an MPC controller builds during a run.

    Wraps the instance's ``problem`` method, so it works for any controller exposing
    ``problem(observation, arrival_rate)`` (the decision points of the run, in order).
    """

    def __init__(self, controller: MPCController) -> None:
        self.problems: list[MPCProblem] = []
        original = controller.problem

        def recording(observation: ServingObservation, arrival_rate: float) -> MPCProblem:
            problem = original(observation, arrival_rate)
            self.problems.append(problem)
            return problem

        controller.problem = recording  # type: ignore[method-assign]


def _mpc_algorithm(
    plant: ServingPlant,
    workload: Sequence[Request],
    kind: str,
    *,
    control_period_s: float,
    horizon_s: float,
) -> MPCController:
    """The scoreboard's MPC of ``kind`` itself (outside its chain) with no solve limit:
    the comparison calls its solver directly on recorded problems."""
    controller = scoreboard_mpc(
        plant,
        workload,
        kind,
        control_period_s=control_period_s,
        horizon_s=horizon_s,
        solve_time_limit_s=1e6,  # no overrun fallback: about 12 days per solve
    ).unwrapped
    assert isinstance(controller, MPCController)
    return controller


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


LONG_HORIZON_SPLIT = 4
"""The solver comparison also times the fast solver with each period split in this many."""


def compare_mpc_solvers(
    problems: Sequence[MPCProblem],
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float = 1.0,
    horizon_s: float = 10.0,
    fast_solver: MPCSolver | None = None,
) -> dict[str, Any]:
    """Solve every recorded problem with SLSQP and the fast solver; compare the costs.

    The problems are the SLSQP MPC's (the seed's model and SLOs), so both solvers
    minimise the same cost. Each solver runs inside its own MPC controller (the
    scoreboard's ``mpc-slsqp`` and ``mpc`` builds, no overrun limit; ``fast_solver``
    replaces the latter's solver), started from the recorded previous clock; the fast
    solver keeps its own warm start (its previous plan) across the sequence. Costs are
    ``problem.cost(plan)`` of the applied (supported-clock) plans. A point counts as no
    worse when the fast cost is at most the SLSQP cost plus ``1e-9`` relative (a failed
    SLSQP solve counts as no worse, a failed fast solve as worse).
    """
    slsqp = _mpc_algorithm(
        plant, workload, "mpc-slsqp", control_period_s=control_period_s, horizon_s=horizon_s
    )
    fast = _mpc_algorithm(
        plant, workload, "mpc", control_period_s=control_period_s, horizon_s=horizon_s
    )
    if fast_solver is not None:
        fast.solver = fast_solver
    slsqp_times: list[float] = []
    fast_times: list[float] = []
    excess: list[float] = []
    no_worse = 0
    failures = {"slsqp": 0, "fast": 0}
    for problem in problems:
        slsqp.current_clock = problem.previous_clock_mhz
        plan_s, _, elapsed_s = slsqp.solve(problem)
        fast.current_clock = problem.previous_clock_mhz
        plan_f, _, elapsed_f = fast.solve(problem)
        fast.last_plan = plan_f
        slsqp_times.append(elapsed_s)
        fast_times.append(elapsed_f)
        failures["slsqp"] += plan_s is None
        failures["fast"] += plan_f is None
        if plan_f is None:
            excess.append(math.inf)
            continue
        cost_f = problem.cost(plan_f)
        if plan_s is None:
            no_worse += 1
            continue
        cost_s = problem.cost(plan_s)
        relative = (cost_f - cost_s) / max(abs(cost_s), 1e-12)
        excess.append(relative)
        no_worse += relative <= 1e-9
    # The same states over the same 10 s, at four times the control rate: each problem's
    # periods split in four (arrivals spread evenly), solved by the fast solver alone.
    long_fast = _mpc_algorithm(
        plant,
        workload,
        "mpc",
        control_period_s=control_period_s / LONG_HORIZON_SPLIT,
        horizon_s=horizon_s,
    )
    if fast_solver is not None:
        long_fast.solver = fast_solver
    long_times: list[float] = []
    for problem in problems:
        split = replace(
            problem,
            control_period_s=problem.control_period_s / LONG_HORIZON_SPLIT,
            prompt_arrivals=np.repeat(
                problem.prompt_arrivals / LONG_HORIZON_SPLIT, LONG_HORIZON_SPLIT
            ),
        )
        long_fast.current_clock = problem.previous_clock_mhz
        plan_long, _, elapsed_long = long_fast.solve(split)
        long_fast.last_plan = plan_long
        long_times.append(elapsed_long)
    points = len(problems)
    worst = max(excess) if excess else None
    return {
        "points": points,
        "fraction_no_worse": (no_worse / points) if points else None,
        "worst_relative_excess": None if worst is None or math.isinf(worst) else worst,
        "fast_p50_s": _percentile(fast_times, 50),
        "fast_p99_s": _percentile(fast_times, 99),
        "slsqp_p50_s": _percentile(slsqp_times, 50),
        "slsqp_p99_s": _percentile(slsqp_times, 99),
        "solver_failures": failures,
        "horizon_steps": problems[0].horizon_steps if problems else None,
        "long_horizon_steps": (
            problems[0].horizon_steps * LONG_HORIZON_SPLIT if problems else None
        ),
        "fast_long_p50_s": _percentile(long_times, 50),
        "fast_long_p99_s": _percentile(long_times, 99),
        "rule": (
            "cost = problem.cost(applied plan); no worse when fast <= slsqp * (1 + 1e-9); "
            "worst_relative_excess = max (fast - slsqp) / |slsqp| (negative: always better)"
        ),
    }


def compare_recorded(
    recorded: dict[str, Any], say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """:func:`compare_mpc_solvers` on the decision points a scenario recorded, run in
    this process after every scenario has finished."""
    problems = recorded["problems"]
    if say is not None:
        say(
            f"comparing the MPC solvers on {len(problems)} decision points of "
            f"{recorded['scenario']}"
        )
    comparison = compare_mpc_solvers(
        problems,
        recorded["plant"],
        recorded["requests"],
        control_period_s=recorded["control_period_s"],
        horizon_s=recorded["horizon_s"],
    )
    comparison["scenario"] = recorded["scenario"]
    return comparison
