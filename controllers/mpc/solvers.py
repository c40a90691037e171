"""The MPC's solvers: the SLSQP reference (:class:`SLSQPSolver`) behind the
:class:`MPCSolver` protocol, and the discrete refinement of a continuous plan."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.mpc.model import (
    FloatArray,
    MPCProblem,
)


# ------------------------------------------------------------------- solvers
@dataclass(frozen=True, slots=True)
class SolveOutcome:
    """What a solver returns: a candidate sequence and whether it claims success."""

    x: FloatArray
    success: bool
    message: str = ""


class MPCSolver(Protocol):
    """Minimise ``objective`` over box ``bounds`` from ``initial``."""

    def __call__(
        self,
        objective: Callable[[FloatArray], float],
        initial: FloatArray,
        bounds: Sequence[tuple[float, float]],
    ) -> SolveOutcome: ...


@dataclass(frozen=True, slots=True)
class SLSQPSolver:
    """SciPy SLSQP with the seed's options (50 iterations, ftol 1e-6)."""

    maximum_iterations: int = 50
    tolerance: float = 1e-6

    def __call__(
        self,
        objective: Callable[[FloatArray], float],
        initial: FloatArray,
        bounds: Sequence[tuple[float, float]],
    ) -> SolveOutcome:
        from scipy.optimize import minimize  # SciPy loads only for the SLSQP solver

        solution = minimize(
            objective,
            initial,
            method="SLSQP",
            bounds=list(bounds),
            options={"maxiter": self.maximum_iterations, "ftol": self.tolerance, "disp": False},
        )
        return SolveOutcome(
            x=np.asarray(solution.x, dtype=float),
            success=bool(solution.success),
            message=str(solution.message),
        )


def _pair_moves(steps: int) -> NDArray[np.int_]:
    """Single-period moves of one index and joint moves of two adjacent periods."""
    moves = []
    for position in range(steps):
        for direction in (-1, 1):
            single = np.zeros(steps, dtype=int)
            single[position] = direction
            moves.append(single)
            if position + 1 < steps:
                for other in (-1, 1):
                    pair = single.copy()
                    pair[position + 1] = other
                    moves.append(pair)
    return np.array(moves, dtype=int).reshape(-1, steps)


def refine_discrete_plan(
    problem: MPCProblem,
    continuous_mhz: FloatArray,
    *,
    maximum_moves: int = 200,
) -> FloatArray:
    """Round a continuous plan onto supported clocks by a local search on the model cost.

    Starts from the downward-quantised plan (the seed's rounding) and from the upward
    one; from each, repeatedly takes the best move of one supported-clock index in one
    period or in two adjacent periods while the cost falls (at most ``maximum_moves``
    moves), pricing all moves at once with :meth:`MPCProblem.costs`. Returns the
    cheapest plan found, so never one costlier than the downward-quantised plan.

    Why: the fluid surrogate's cost jumps where a phase's work runs out within a period
    (the share switches), so plain downward rounding of a good continuous plan can cost
    far more than the best supported plan next to it. ``tests/controllers/test_mpc.py``
    checks it against brute force on tiny horizons.
    """
    profile = problem.plant.profile
    clocks = profile.clock_mhz
    size = clocks.size
    continuous = np.asarray(continuous_mhz, dtype=float)
    downward = np.array([profile.clock_index(value, downward=True) for value in continuous])
    upward = np.array([profile.clock_index(value, downward=False) for value in continuous])
    moves = _pair_moves(problem.horizon_steps)
    best_plan = clocks[downward].astype(float)
    best_cost = problem.cost(best_plan)
    for start in (downward, upward):
        index = start.copy()
        cost = float(problem.costs(clocks[index][None, :])[0])
        for _ in range(maximum_moves):
            trials = index[None, :] + moves
            trials = trials[np.all((trials >= 0) & (trials < size), axis=1)]
            trial_costs = problem.costs(clocks[trials])
            best = int(np.argmin(trial_costs))
            if not trial_costs[best] < cost - 1e-12:
                break
            index, cost = trials[best], float(trial_costs[best])
        if cost < best_cost - 1e-12:
            best_plan, best_cost = clocks[index].astype(float), cost
    return best_plan
