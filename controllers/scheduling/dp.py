"""Exact dynamic programming for the scheduling MDP: value iteration, policy iteration and
the LP, on generic discounted MDPs and on :class:`SchedulingMDP` (checked against each other).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from gpugov.controllers.scheduling.mdp import (
    DECODE,
    IDLE,
    PREFILL,
    SCHEDULING_ACTIONS,
    BoolArray,
    DPSolution,
    FloatArray,
    IntArray,
    SchedulingActionName,
    SchedulingMDP,
    make_scheduling_mdp,
)


# --------------------------------------------------------- generic discounted MDPs
def _check_arrays(
    transitions: FloatArray, stage_cost: FloatArray, valid_actions: BoolArray, gamma: float
) -> None:
    if transitions.ndim != 3 or transitions.shape[0] != transitions.shape[2]:
        raise ValueError(f"transitions must have shape (S, A, S), got {transitions.shape}")
    if stage_cost.shape != transitions.shape[:2] or valid_actions.shape != stage_cost.shape:
        raise ValueError(
            f"stage_cost {stage_cost.shape} and valid_actions {valid_actions.shape} "
            f"must have shape {transitions.shape[:2]}"
        )
    if not np.all(valid_actions.any(axis=1)):
        bad = int(np.flatnonzero(~valid_actions.any(axis=1))[0])
        raise ValueError(f"state {bad} has no valid action")
    if not 0.0 < gamma < 1.0:
        raise ValueError("gamma must lie strictly between zero and one")


def _q_values(
    transitions: FloatArray,
    stage_cost: FloatArray,
    valid_actions: BoolArray,
    gamma: float,
    value: FloatArray,
) -> FloatArray:
    continuation = np.einsum("sak,k->sa", transitions, value)
    return np.where(valid_actions, stage_cost + gamma * continuation, np.inf)


def discounted_value_iteration(
    transitions: FloatArray,
    stage_cost: FloatArray,
    valid_actions: BoolArray,
    gamma: float,
    *,
    tolerance: float = 1e-10,
    maximum_iterations: int = 100_000,
) -> tuple[FloatArray, IntArray, int, float]:
    """Minimise discounted cost by value iteration from zero (the seed's algorithm).

    Stops when successive iterates differ by at most ``tolerance`` in the max norm.

    Returns:
        ``(value, greedy policy, iterations, Bellman residual of the returned value)``.
    """
    _check_arrays(transitions, stage_cost, valid_actions, gamma)
    if tolerance <= 0.0 or maximum_iterations <= 0:
        raise ValueError("tolerance and maximum_iterations must be positive")
    value = np.zeros(transitions.shape[0], dtype=float)
    iterations = 0
    for iterations in range(1, maximum_iterations + 1):  # noqa: B007 - reported below
        updated = np.min(_q_values(transitions, stage_cost, valid_actions, gamma, value), axis=1)
        if np.max(np.abs(updated - value)) <= tolerance:
            value = updated
            break
        value = updated
    q_values = _q_values(transitions, stage_cost, valid_actions, gamma, value)
    residual = float(np.max(np.abs(np.min(q_values, axis=1) - value)))
    policy = np.argmin(q_values, axis=1).astype(int)
    return value, policy, iterations, residual


def evaluate_policy_exactly(
    transitions: FloatArray,
    stage_cost: FloatArray,
    gamma: float,
    policy: IntArray,
) -> FloatArray:
    """Discounted cost-to-go of a stationary policy: solve ``(I - gamma P_pi) v = c_pi``."""
    rows = np.arange(transitions.shape[0])
    p_pi = transitions[rows, policy]
    c_pi = stage_cost[rows, policy]
    if not np.all(np.isfinite(c_pi)):
        raise ValueError("policy selects an invalid action")
    return np.asarray(np.linalg.solve(np.eye(rows.size) - gamma * p_pi, c_pi), dtype=np.float64)


def discounted_policy_iteration(
    transitions: FloatArray,
    stage_cost: FloatArray,
    valid_actions: BoolArray,
    gamma: float,
    *,
    maximum_iterations: int = 1_000,
) -> tuple[FloatArray, IntArray, int]:
    """Howard's policy iteration with exact (linear-solve) evaluation.

    Improvement keeps the current action unless another is better by more than 1e-12
    (relative), so the iteration cannot cycle between tied actions.

    Returns:
        ``(value, policy, iterations)``.

    Raises:
        RuntimeError: no convergence within ``maximum_iterations``.
    """
    _check_arrays(transitions, stage_cost, valid_actions, gamma)
    policy = np.argmax(valid_actions, axis=1).astype(int)
    rows = np.arange(transitions.shape[0])
    for iteration in range(1, maximum_iterations + 1):
        value = evaluate_policy_exactly(transitions, stage_cost, gamma, policy)
        q_values = _q_values(transitions, stage_cost, valid_actions, gamma, value)
        best = np.argmin(q_values, axis=1)
        current = q_values[rows, policy]
        improves = q_values[rows, best] < current - 1e-12 * np.maximum(1.0, np.abs(current))
        if not np.any(improves):
            return value, policy, iteration
        policy = np.where(improves, best, policy).astype(int)
    raise RuntimeError(f"policy iteration did not converge in {maximum_iterations} iterations")


def discounted_lp_solve(
    transitions: FloatArray,
    stage_cost: FloatArray,
    valid_actions: BoolArray,
    gamma: float,
) -> tuple[FloatArray, IntArray]:
    """Solve the discounted MDP as the primal LP (HiGHS).

    ``maximise sum(v)`` subject to ``v(s) - gamma P(s, a) v <= c(s, a)`` for every valid
    ``(s, a)``; the optimum is the optimal cost-to-go.

    Returns:
        ``(value, greedy policy)``.

    Raises:
        RuntimeError: HiGHS reports failure.
    """
    _check_arrays(transitions, stage_cost, valid_actions, gamma)
    number_states = transitions.shape[0]
    state_ids, action_ids = np.nonzero(valid_actions)
    matrix = -gamma * transitions[state_ids, action_ids]
    matrix[np.arange(state_ids.size), state_ids] += 1.0
    solution = linprog(
        -np.ones(number_states),
        A_ub=matrix,
        b_ub=stage_cost[state_ids, action_ids],
        bounds=[(None, None)] * number_states,
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if not solution.success:
        raise RuntimeError(f"LP solve failed: {solution.message}")
    value = np.asarray(solution.x, dtype=float)
    q_values = _q_values(transitions, stage_cost, valid_actions, gamma, value)
    return value, np.argmin(q_values, axis=1).astype(int)


# ------------------------------------------------------------ scheduling solvers
def _labels(policy: IntArray) -> tuple[SchedulingActionName, ...]:
    return tuple(SCHEDULING_ACTIONS[int(action)] for action in policy)  # type: ignore[misc]


def solve_scheduling_mdp(
    mdp: SchedulingMDP | None = None,
    *,
    tolerance: float = 1e-10,
    maximum_iterations: int = 100_000,
) -> DPSolution:
    """Solve the reduced discounted scheduling model by value iteration.

    Raises:
        ValueError: an invalid model or non-positive tolerance / iteration limit.
    """
    model = make_scheduling_mdp() if mdp is None else mdp
    model.validate()
    if tolerance <= 0.0 or maximum_iterations <= 0:
        raise ValueError("tolerance and maximum_iterations must be positive")
    value, policy, iterations, residual = discounted_value_iteration(
        model.transitions,
        model.stage_cost,
        model.valid_actions,
        model.gamma,
        tolerance=tolerance,
        maximum_iterations=maximum_iterations,
    )
    return DPSolution(
        value=value,
        policy=policy,
        policy_labels=_labels(policy),
        iterations=iterations,
        bellman_residual=residual,
        mdp=model,
    )


def _residual(model: SchedulingMDP, value: FloatArray) -> float:
    q_values = _q_values(
        model.transitions, model.stage_cost, model.valid_actions, model.gamma, value
    )
    return float(np.max(np.abs(np.min(q_values, axis=1) - value)))


def policy_iteration(mdp: SchedulingMDP | None = None) -> DPSolution:
    """Solve the reduced model by policy iteration (an independent check on DP)."""
    model = make_scheduling_mdp() if mdp is None else mdp
    model.validate()
    value, policy, iterations = discounted_policy_iteration(
        model.transitions, model.stage_cost, model.valid_actions, model.gamma
    )
    return DPSolution(
        value=value,
        policy=policy,
        policy_labels=_labels(policy),
        iterations=iterations,
        bellman_residual=_residual(model, value),
        mdp=model,
        method="policy_iteration",
    )


def solve_scheduling_mdp_lp(mdp: SchedulingMDP | None = None) -> DPSolution:
    """Solve the reduced model as a linear program (an independent check on DP)."""
    model = make_scheduling_mdp() if mdp is None else mdp
    model.validate()
    value, policy = discounted_lp_solve(
        model.transitions, model.stage_cost, model.valid_actions, model.gamma
    )
    return DPSolution(
        value=value,
        policy=policy,
        policy_labels=_labels(policy),
        iterations=1,
        bellman_residual=_residual(model, value),
        mdp=model,
        method="linear_program",
    )


def decode_priority_policy(mdp: SchedulingMDP) -> IntArray:
    """The seed's decode-priority heuristic: decode when any decode is active, else
    prefill when a prompt waits and the decode batch has room, else idle."""
    return np.array(
        [DECODE if d > 0 else (PREFILL if p > 0 and d < 6 else IDLE) for p, d, _ in mdp.states],
        dtype=int,
    )
