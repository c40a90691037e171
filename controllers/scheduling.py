"""Reduced scheduling MDP: exact dynamic programming, offline RL and policy evaluation.

Ported from the seed's scheduling half. The abstraction has 245 states (prefill count
0-6, decode count 0-6, oldest-request age bin 0-4) and three actions (prefill, decode,
idle); its assumptions are spelled out in :attr:`SchedulingMDP.description`. The exact
policy comes from value iteration (:func:`solve_scheduling_mdp`); :func:`policy_iteration`
and :func:`solve_scheduling_mdp_lp` solve the same discounted problem independently so the
value-iteration answer can be checked. Offline RL is fitted Q iteration with Extra-Trees
(:func:`fit_fqi`) on logged transitions (:func:`generate_transition_dataset`).

Random streams. The seed samples each next state with ``Generator.choice(n, p=row)``,
which draws one uniform and inverts the row's normalised cumulative sum. This module does
exactly that with precomputed cumulative rows, so :func:`generate_transition_dataset`,
:func:`evaluate_scheduling_policy` and the reduced trajectory reproduce the seed's numbers
bit for bit (the tests check this against a per-step ``choice`` reference), while
:func:`evaluate_scheduling_policy` runs all episodes at once: the uniforms are drawn up
front as an ``(episodes, horizon_steps)`` array, which is the order the seed's nested loop
consumed them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linprog
from sklearn.ensemble import ExtraTreesRegressor

from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import Request

SCHEDULING_ACTIONS = ("prefill", "decode", "idle")
SchedulingActionName = Literal["prefill", "decode", "idle"]

NUMBER_PREFILL_LEVELS = 7
NUMBER_DECODE_LEVELS = 7
NUMBER_AGE_BINS = 5
NUMBER_STATES = NUMBER_PREFILL_LEVELS * NUMBER_DECODE_LEVELS * NUMBER_AGE_BINS
NUMBER_ACTIONS = len(SCHEDULING_ACTIONS)
PREFILL, DECODE, IDLE = 0, 1, 2

REDUCED_REPLAY_STEPS = 120
REDUCED_REPLAY_RANDOM_SEED = 29
# The seed's private names, kept for readers holding the seed beside this file.
_REDUCED_REPLAY_STEPS = REDUCED_REPLAY_STEPS
_REDUCED_REPLAY_RANDOM_SEED = REDUCED_REPLAY_RANDOM_SEED

SCHEDULING_SEED_DEVIATIONS = (
    "scheduling_mdp_from_trace takes the arrival span as max - min of the arrival "
    "times (the seed's last - first goes wrong for an unsorted workload)",
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int_]
BoolArray = NDArray[np.bool_]


# --------------------------------------------------------------------------- types
@dataclass(frozen=True)
class SchedulingMDP:
    """Finite queueing abstraction used for exact DP and offline RL."""

    states: IntArray
    transitions: FloatArray
    stage_cost: FloatArray
    valid_actions: BoolArray
    drop_probability: FloatArray
    arrival_probability: float
    prefill_completion_probability: float
    decode_completion_probability: float
    action_energy: FloatArray
    gamma: float
    decision_period_s: float
    description: str

    def validate(self) -> None:
        """Check shapes, probabilities and parameters; raise ``ValueError`` if wrong."""
        number_states = self.states.shape[0]
        number_actions = len(SCHEDULING_ACTIONS)
        if self.states.shape != (NUMBER_STATES, 3):
            raise ValueError("the approved reduced model must have 245 states")
        if self.transitions.shape != (number_states, number_actions, number_states):
            raise ValueError("transition tensor has an incompatible shape")
        if self.stage_cost.shape != (number_states, number_actions):
            raise ValueError("stage_cost has an incompatible shape")
        if self.valid_actions.shape != self.stage_cost.shape:
            raise ValueError("valid_actions has an incompatible shape")
        probabilities = self.transitions.sum(axis=2)
        if not np.allclose(probabilities[self.valid_actions], 1.0, atol=1e-12):
            raise ValueError("valid transition rows must sum to one")
        if np.any(self.transitions < -1e-14):
            raise ValueError("transition probabilities must be nonnegative")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError("gamma must lie strictly between zero and one")
        if self.decision_period_s <= 0.0:
            raise ValueError("decision_period_s must be positive")


@dataclass(frozen=True)
class DPSolution:
    """An exact solution of a :class:`SchedulingMDP` (value is a cost-to-go)."""

    value: FloatArray
    policy: IntArray
    policy_labels: tuple[SchedulingActionName, ...]
    iterations: int
    bellman_residual: float
    mdp: SchedulingMDP
    method: str = "value_iteration"


@dataclass(frozen=True)
class TransitionDataset:
    """Logged transitions ``(state, action, cost, next_state)`` from one behaviour policy."""

    state: IntArray
    action: IntArray
    cost: FloatArray
    next_state: IntArray
    behavior: str
    coverage_fraction: float
    random_seed: int


@dataclass(frozen=True)
class FQISolution:
    """Fitted-Q-iteration result: the last Extra-Trees model and its greedy policy."""

    model: ExtraTreesRegressor
    q_values: FloatArray
    policy: IntArray
    policy_labels: tuple[SchedulingActionName, ...]
    dataset: TransitionDataset
    sweeps: int
    random_seed: int
    policy_disagreement_fraction: float | None = None


@dataclass(frozen=True)
class PolicyEvaluation:
    """Monte Carlo summary of one stationary policy on fixed random streams."""

    mean_discounted_return: float
    mean_queue_length: float
    mean_waiting_time_s: float
    mean_decode_stalls: float
    mean_dropped_arrivals: float
    episodes: int
    horizon_steps: int

    def as_dict(self) -> dict[str, float | int]:
        """JSON-able copy of the fields."""
        return {
            "mean_discounted_return": self.mean_discounted_return,
            "mean_queue_length": self.mean_queue_length,
            "mean_waiting_time_s": self.mean_waiting_time_s,
            "mean_decode_stalls": self.mean_decode_stalls,
            "mean_dropped_arrivals": self.mean_dropped_arrivals,
            "episodes": self.episodes,
            "horizon_steps": self.horizon_steps,
        }


# ----------------------------------------------------------------- state indexing
def state_index(p: int, d: int, age: int) -> int:
    """Flat index of the state (prefill count ``p``, decode count ``d``, age bin ``age``)."""
    return (p * NUMBER_DECODE_LEVELS + d) * NUMBER_AGE_BINS + age


_state_index = state_index


def _binomial_probabilities(number: int, probability: float) -> FloatArray:
    return np.array(
        [
            comb(number, completed)
            * probability**completed
            * (1.0 - probability) ** (number - completed)
            for completed in range(number + 1)
        ],
        dtype=float,
    )


# ------------------------------------------------------------------- construction
def make_scheduling_mdp(
    *,
    arrival_probability: float = 0.35,
    prefill_completion_probability: float = 0.22,
    decode_completion_probability: float = 0.28,
    gamma: float = 0.99,
    decision_period_s: float = 0.1,
    action_energy: Sequence[float] = (0.85, 1.0, 0.25),
) -> SchedulingMDP:
    """Construct the approved 245-state queueing abstraction.

    Per decision period: at most one arrival (probability ``arrival_probability``), dropped
    when the prefill queue is already full (6); ``prefill`` completes one prompt with
    ``prefill_completion_probability`` and moves it into decode (valid only with a
    waiting prompt and fewer than 6 decodes); ``decode`` completes a binomial number of
    the ``d`` active decodes, each with ``decode_completion_probability / d`` (an
    aggregate capacity shared across jobs); ``idle`` serves nothing. Stage cost is
    ``p + d + 4*[age == 4] + 2*d*[action != decode] + 10*P(drop) + 0.1*energy/max_energy``.

    Raises:
        ValueError: a probability outside [0, 1], ``gamma`` outside (0, 1), a
            non-positive period or a malformed ``action_energy``.
    """
    if not 0.0 <= arrival_probability <= 1.0:
        raise ValueError("arrival_probability must lie in [0, 1]")
    if not 0.0 <= prefill_completion_probability <= 1.0:
        raise ValueError("prefill_completion_probability must lie in [0, 1]")
    if not 0.0 <= decode_completion_probability <= 1.0:
        raise ValueError("decode_completion_probability must lie in [0, 1]")
    if not 0.0 < gamma < 1.0:
        raise ValueError("gamma must lie strictly between zero and one")
    if decision_period_s <= 0.0:
        raise ValueError("decision_period_s must be positive")
    energy = np.asarray(action_energy, dtype=float)
    if energy.shape != (3,) or np.any(energy < 0.0):
        raise ValueError("action_energy must contain three nonnegative values")

    states = np.array(
        [
            (p, d, age)
            for p in range(NUMBER_PREFILL_LEVELS)
            for d in range(NUMBER_DECODE_LEVELS)
            for age in range(NUMBER_AGE_BINS)
        ],
        dtype=int,
    )
    number_states = states.shape[0]
    transitions = np.zeros((number_states, 3, number_states), dtype=float)
    costs = np.full((number_states, 3), np.inf, dtype=float)
    valid = np.zeros((number_states, 3), dtype=bool)
    drops = np.zeros((number_states, 3), dtype=float)
    maximum_energy = max(float(np.max(energy)), 1e-12)

    for index, (p_value, d_value, age_value) in enumerate(states):
        p_initial = int(p_value)
        d_initial = int(d_value)
        for action in range(3):
            is_valid = (
                action == IDLE
                or (action == PREFILL and p_initial > 0 and d_initial < 6)
                or (action == DECODE and d_initial > 0)
            )
            if not is_valid:
                continue
            valid[index, action] = True
            if action == PREFILL:
                service_outcomes: tuple[tuple[int, int, float, bool], ...] = (
                    (p_initial - 1, d_initial + 1, prefill_completion_probability, True),
                    (p_initial, d_initial, 1.0 - prefill_completion_probability, False),
                )
            elif action == DECODE:
                # ``decode_completion_probability`` is the aggregate expected completion
                # capacity of one GPU step. Sharing it across the active jobs keeps the
                # reduced model from manufacturing d times more throughput merely
                # because d jobs are present.
                per_job_probability = min(1.0, decode_completion_probability / max(d_initial, 1))
                service_outcomes = tuple(
                    (p_initial, d_initial - completed, probability, completed > 0)
                    for completed, probability in enumerate(
                        _binomial_probabilities(d_initial, per_job_probability)
                    )
                )
            else:
                service_outcomes = ((p_initial, d_initial, 1.0, False),)
            for p_base, d_after, service_probability, service_completed in service_outcomes:
                for arrival, arrival_prob in (
                    (0, 1.0 - arrival_probability),
                    (1, arrival_probability),
                ):
                    dropped = int(arrival == 1 and p_base >= 6)
                    p_after = min(6, p_base + arrival)
                    if p_after == 0:
                        age_after = 0
                    elif action == PREFILL and service_completed:
                        age_after = max(0, int(age_value) - 1)
                    else:
                        age_after = min(4, int(age_value) + 1)
                    next_index = state_index(p_after, d_after, age_after)
                    probability = service_probability * arrival_prob
                    transitions[index, action, next_index] += probability
                    drops[index, action] += probability * dropped
            costs[index, action] = (
                p_value
                + d_value
                + 4.0 * (age_value == 4)
                + 2.0 * d_value * (action != DECODE)
                + 10.0 * drops[index, action]
                + 0.1 * energy[action] / maximum_energy
            )

    mdp = SchedulingMDP(
        states=states,
        transitions=transitions,
        stage_cost=costs,
        valid_actions=valid,
        drop_probability=drops,
        arrival_probability=float(arrival_probability),
        prefill_completion_probability=float(prefill_completion_probability),
        decode_completion_probability=float(decode_completion_probability),
        action_energy=energy,
        gamma=float(gamma),
        decision_period_s=float(decision_period_s),
        description=(
            "Exactly solved reduced abstraction with capped prefill and decode counts; "
            "empirical phase completions and an aggregate decode-capacity budget "
            "shared across active jobs; it is not an exact reproduction of vLLM."
        ),
    )
    mdp.validate()
    return mdp


def scheduling_clock_calibration(profile: PerformanceProfile) -> tuple[float, float | None]:
    """Return the fixed requested clock (the middle supported clock) and, when a
    measured manifest reports it, that clock's realized-clock median in MHz."""
    fixed_requested_clock_mhz = float(profile.clock_mhz[len(profile.clock_mhz) // 2])
    batch_balanced_realized_clock_mhz: float | None = None
    selection = profile.manifest.get("clock_profile_selection", {})
    if isinstance(selection, Mapping):
        realized_by_requested = selection.get("realized_clock_median_mhz_by_requested", {})
        if isinstance(realized_by_requested, Mapping):
            for requested, realized in realized_by_requested.items():
                try:
                    requested_value = float(requested)
                    realized_value = float(realized)
                except (TypeError, ValueError):
                    continue
                if (
                    np.isclose(requested_value, fixed_requested_clock_mhz, rtol=0.0, atol=1e-9)
                    and np.isfinite(realized_value)
                    and realized_value > 0.0
                ):
                    batch_balanced_realized_clock_mhz = realized_value
                    break
    return fixed_requested_clock_mhz, batch_balanced_realized_clock_mhz


_scheduling_clock_calibration = scheduling_clock_calibration


def scheduling_mdp_from_trace(
    workload: Sequence[Request],
    profile: PerformanceProfile,
    *,
    decision_period_s: float = 0.1,
    gamma: float = 0.99,
    mean_output_tokens: float | None = None,
) -> SchedulingMDP:
    """Estimate the reduced MDP's probabilities from a historical trace and a profile.

    Arrival, prefill-completion and decode-completion rates become per-period
    probabilities ``1 - exp(-rate * period)`` clipped to [0.01, 0.95], at the middle
    supported clock; action energies are the phase powers there times the period.

    The trace is offline calibration data, so like the seed this reads its realised
    output lengths for the mean unless ``mean_output_tokens`` (a declared forecast) is
    given; nothing here runs inside a control loop.

    Raises:
        ValueError: an empty workload or a non-positive ``mean_output_tokens``.
    """
    if not workload:
        raise ValueError("workload must contain at least one request")
    arrival_times = [request.arrival_time_s for request in workload]
    # Seed deviation: the seed took workload[-1] - workload[0], which silently goes
    # negative (and is then replaced by one period) for an unsorted workload; max - min
    # is the same for sorted input and right for any order.
    span = max(max(arrival_times) - min(arrival_times), decision_period_s)
    arrival_rate = len(workload) / span
    arrival_probability = 1.0 - np.exp(-arrival_rate * decision_period_s)
    median_clock, _ = scheduling_clock_calibration(profile)
    mean_prompt = float(np.mean([request.prompt_tokens for request in workload]))
    if mean_output_tokens is None:
        mean_output = float(np.mean([request.output_tokens for request in workload]))
    else:
        if not np.isfinite(mean_output_tokens) or mean_output_tokens <= 0.0:
            raise ValueError(
                f"mean_output_tokens must be finite and positive, got {mean_output_tokens!r}"
            )
        mean_output = float(mean_output_tokens)
    prefill_completion_rate = profile.rate("prefill", median_clock) / max(mean_prompt, 1.0)
    completion_rate = profile.rate("decode", median_clock) / max(mean_output, 1.0)
    prefill_completion_probability = 1.0 - np.exp(-prefill_completion_rate * decision_period_s)
    completion_probability = 1.0 - np.exp(-completion_rate * decision_period_s)
    action_energy = (
        np.array(
            [
                profile.power("prefill", median_clock),
                profile.power("decode", median_clock),
                profile.power("idle", median_clock),
            ]
        )
        * decision_period_s
    )
    return make_scheduling_mdp(
        arrival_probability=float(np.clip(arrival_probability, 0.01, 0.95)),
        prefill_completion_probability=float(np.clip(prefill_completion_probability, 0.01, 0.95)),
        decode_completion_probability=float(np.clip(completion_probability, 0.01, 0.95)),
        gamma=gamma,
        decision_period_s=decision_period_s,
        action_energy=action_energy,
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
    return np.linalg.solve(np.eye(rows.size) - gamma * p_pi, c_pi)


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


# --------------------------------------------------------------------- sampling
def _cumulative_rows(transitions: FloatArray) -> FloatArray:
    """Normalised cumulative transition rows, as ``Generator.choice`` builds them.

    Invalid (all-zero) rows become NaN and must never be sampled.
    """
    cumulative = np.cumsum(transitions, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cumulative /= cumulative[..., -1:]
    return cumulative


def _sample_from_cumulative(cumulative_row: FloatArray, uniform: float) -> int:
    # Identical to Generator.choice(n, p=row) given the same uniform draw.
    return int(np.searchsorted(cumulative_row, uniform, side="right"))


def generate_transition_dataset(
    mdp: SchedulingMDP,
    *,
    behavior: Literal["uniform", "decode_priority"] = "uniform",
    number_transitions: int = 50_000,
    exploration_probability: float = 0.05,
    random_seed: int = 0,
) -> TransitionDataset:
    """Generate broad (``uniform``) or heuristic (``decode_priority``) logged transitions.

    ``uniform`` draws a state uniformly and then a valid action uniformly each step;
    ``decode_priority`` follows the heuristic from an empty system, restarting every 300
    steps, with ``exploration_probability`` of a uniform valid action. Deterministic in
    ``random_seed`` and identical to the seed's stream.

    Raises:
        ValueError: an invalid model, non-positive count, bad exploration probability
            or unknown behaviour.
    """
    mdp.validate()
    if number_transitions <= 0:
        raise ValueError("number_transitions must be positive")
    if not 0.0 <= exploration_probability <= 1.0:
        raise ValueError("exploration_probability must lie in [0, 1]")
    if behavior not in ("uniform", "decode_priority"):
        raise ValueError(f"unknown behavior policy: {behavior}")
    random = np.random.default_rng(random_seed)
    cumulative = _cumulative_rows(mdp.transitions)
    heuristic = decode_priority_policy(mdp)
    valid_choices = [np.flatnonzero(row) for row in mdp.valid_actions]
    states = np.empty(number_transitions, dtype=int)
    actions = np.empty(number_transitions, dtype=int)
    next_states = np.empty(number_transitions, dtype=int)
    number_states = mdp.states.shape[0]
    state = state_index(0, 0, 0)
    for index in range(number_transitions):
        if behavior == "uniform":
            state = int(random.integers(number_states))
            action = int(random.choice(valid_choices[state]))
        else:
            if index % 300 == 0:
                state = state_index(0, 0, 0)
            if random.random() < exploration_probability:
                action = int(random.choice(valid_choices[state]))
            else:
                action = int(heuristic[state])
        next_state = _sample_from_cumulative(cumulative[state, action], random.random())
        states[index] = state
        actions[index] = action
        next_states[index] = next_state
        state = next_state
    visited = np.unique(states * 3 + actions).size
    valid_pairs = int(np.sum(mdp.valid_actions))
    return TransitionDataset(
        state=states,
        action=actions,
        cost=mdp.stage_cost[states, actions].astype(float),
        next_state=next_states,
        behavior=behavior,
        coverage_fraction=visited / valid_pairs,
        random_seed=random_seed,
    )


# -------------------------------------------------------------------------- FQI
def _features(mdp: SchedulingMDP, states: IntArray, actions: IntArray) -> FloatArray:
    state_values = mdp.states[np.asarray(states, dtype=int)].astype(float)
    state_values[:, 0] /= 6.0
    state_values[:, 1] /= 6.0
    state_values[:, 2] /= 4.0
    one_hot = np.eye(3, dtype=float)[np.asarray(actions, dtype=int)]
    return np.column_stack([state_values, one_hot])


def fit_fqi(
    mdp: SchedulingMDP,
    dataset: TransitionDataset | None = None,
    *,
    behavior: Literal["uniform", "decode_priority"] = "uniform",
    number_transitions: int = 50_000,
    sweeps: int = 50,
    number_trees: int = 200,
    maximum_depth: int = 12,
    minimum_leaf_size: int = 2,
    exploration_probability: float = 0.05,
    random_seed: int = 0,
    reference_policy: Sequence[int] | IntArray | None = None,
) -> FQISolution:
    """Fit a joint state-action Extra-Trees approximation of the cost-to-go.

    Each sweep regresses the per-(state, action) mean of ``cost + gamma * min_a'
    Q(next, a')`` (weighted by visit counts) with a fresh forest seeded
    ``random_seed + sweep``. ``dataset`` overrides ``behavior`` and the generation
    arguments. With ``reference_policy`` the fraction of states where the greedy policy
    differs is reported.

    Raises:
        ValueError: non-positive sweeps/trees or a reference policy of the wrong shape.
    """
    mdp.validate()
    if sweeps <= 0 or number_trees <= 0:
        raise ValueError("sweeps and number_trees must be positive")
    samples = (
        dataset
        if dataset is not None
        else generate_transition_dataset(
            mdp,
            behavior=behavior,
            number_transitions=number_transitions,
            exploration_probability=exploration_probability,
            random_seed=random_seed,
        )
    )
    pair_id = samples.state * 3 + samples.action
    unique_pair, inverse = np.unique(pair_id, return_inverse=True)
    unique_features = _features(mdp, unique_pair // 3, unique_pair % 3)
    counts = np.bincount(inverse).astype(float)
    number_states = mdp.states.shape[0]
    all_features = _features(
        mdp, np.repeat(np.arange(number_states), 3), np.tile(np.arange(3), number_states)
    )
    model: ExtraTreesRegressor | None = None
    target = samples.cost.copy()
    for sweep in range(sweeps):
        aggregated_target = np.bincount(inverse, weights=target) / counts
        model = ExtraTreesRegressor(
            n_estimators=number_trees,
            max_depth=maximum_depth,
            min_samples_leaf=minimum_leaf_size,
            random_state=random_seed + sweep,
            n_jobs=1,
        )
        model.fit(unique_features, aggregated_target, sample_weight=counts)
        predicted = model.predict(all_features).reshape(number_states, 3)
        predicted = np.where(mdp.valid_actions, predicted, np.inf)
        next_minimum = np.min(predicted[samples.next_state], axis=1)
        target = samples.cost + mdp.gamma * next_minimum
    assert model is not None  # sweeps > 0
    q_values = model.predict(all_features).reshape(number_states, 3)
    q_values = np.where(mdp.valid_actions, q_values, np.inf)
    policy = np.argmin(q_values, axis=1).astype(int)
    disagreement = None
    if reference_policy is not None:
        reference = np.asarray(reference_policy, dtype=int)
        if reference.shape != policy.shape:
            raise ValueError("reference_policy has an incompatible shape")
        disagreement = float(np.mean(policy != reference))
    return FQISolution(
        model=model,
        q_values=q_values,
        policy=policy,
        policy_labels=_labels(policy),
        dataset=samples,
        sweeps=sweeps,
        random_seed=random_seed,
        policy_disagreement_fraction=disagreement,
    )


# ------------------------------------------------------------------- evaluation
def evaluate_scheduling_policy(
    mdp: SchedulingMDP,
    policy: Sequence[int] | IntArray,
    *,
    episodes: int = 2_000,
    horizon_steps: int = 300,
    random_seed: int = 17,
) -> PolicyEvaluation:
    """Evaluate one stationary policy on fixed random-number streams.

    Every episode starts empty. All episodes advance together; episode ``e`` uses the
    uniforms ``U[e, :]`` of one ``(episodes, horizon_steps)`` draw from
    ``default_rng(random_seed)``, which is the order the seed's per-step sampling
    consumed them in, so results equal the seed's. Waiting time is the Little's-law
    ratio ``sum(queue) * period / completions`` per episode; drops are expected drops.

    Raises:
        ValueError: a policy of the wrong shape or selecting an invalid action, or
            non-positive episodes / horizon.
    """
    number_states = mdp.states.shape[0]
    policy_array = np.asarray(policy, dtype=int)
    if policy_array.shape != (number_states,):
        raise ValueError("policy has an incompatible shape")
    if episodes <= 0 or horizon_steps <= 0:
        raise ValueError("episodes and horizon_steps must be positive")
    if np.any((policy_array < 0) | (policy_array >= NUMBER_ACTIONS)) or np.any(
        ~mdp.valid_actions[np.arange(number_states), policy_array]
    ):
        raise ValueError("policy selects an invalid action")
    random = np.random.default_rng(random_seed)
    uniforms = random.random((episodes, horizon_steps))
    # Rows of the closed-loop chain: cumulative transition row, cost, drop per state.
    rows = np.arange(number_states)
    cumulative = _cumulative_rows(mdp.transitions[rows, policy_array])
    cost = mdp.stage_cost[rows, policy_array]
    drop = mdp.drop_probability[rows, policy_array]
    decode_count = mdp.states[:, 1]
    queue = mdp.states[:, 0] + mdp.states[:, 1]
    stalled = ((decode_count > 0) & (policy_array != DECODE)).astype(float)
    decoding = policy_array == DECODE

    discounted_returns = np.zeros(episodes, dtype=float)
    queue_totals = np.zeros(episodes, dtype=float)
    stall_totals = np.zeros(episodes, dtype=float)
    drop_totals = np.zeros(episodes, dtype=float)
    completion_totals = np.zeros(episodes, dtype=float)
    state = np.full(episodes, state_index(0, 0, 0), dtype=int)
    discount = 1.0
    for step in range(horizon_steps):
        discounted_returns -= discount * cost[state]
        queue_totals += queue[state]
        stall_totals += stalled[state]
        drop_totals += drop[state]
        next_state = np.sum(cumulative[state] <= uniforms[:, step, None], axis=1)
        completed = np.maximum(0, decode_count[state] - decode_count[next_state])
        completion_totals += np.where(decoding[state], completed, 0)
        state = next_state
        discount *= mdp.gamma
    mean_waiting = np.mean(
        queue_totals * mdp.decision_period_s / np.maximum(completion_totals, 1.0)
    )
    return PolicyEvaluation(
        mean_discounted_return=float(np.mean(discounted_returns)),
        mean_queue_length=float(np.mean(queue_totals) / horizon_steps),
        mean_waiting_time_s=float(mean_waiting),
        mean_decode_stalls=float(np.mean(stall_totals)),
        mean_dropped_arrivals=float(np.mean(drop_totals)),
        episodes=episodes,
        horizon_steps=horizon_steps,
    )


def policy_slice(policy: Sequence[int] | IntArray, *, oldest_age_bin: int) -> IntArray:
    """Return the 7 by 7 action table (rows: prefill count, columns: decode count) for
    one oldest-request age bin.

    Raises:
        ValueError: an age bin outside [0, 4].
    """
    if not 0 <= oldest_age_bin <= 4:
        raise ValueError("oldest_age_bin must lie in [0, 4]")
    policy_array = np.asarray(policy, dtype=int)
    return np.array(
        [[policy_array[state_index(p, d, oldest_age_bin)] for d in range(7)] for p in range(7)],
        dtype=int,
    )


def policy_action_coverage_slices(
    dataset: TransitionDataset,
    displayed_policy: Sequence[int] | IntArray,
) -> dict[str, list[list[int]]]:
    """Count, per age bin, the logged visits to the action a policy displays in each
    (prefill, decode) cell.

    Raises:
        ValueError: a policy that is not one valid action index per state.
    """
    policy = np.asarray(displayed_policy, dtype=int)
    if policy.shape != (NUMBER_STATES,) or np.any((policy < 0) | (policy > 2)):
        raise ValueError("displayed_policy must contain one valid action per MDP state")
    pair_counts = np.bincount(
        dataset.state * 3 + dataset.action, minlength=NUMBER_STATES * 3
    ).reshape(NUMBER_STATES, 3)
    return {
        str(age): np.array(
            [
                [
                    pair_counts[state_index(p, d, age), int(policy[state_index(p, d, age)])]
                    for d in range(7)
                ]
                for p in range(7)
            ],
            dtype=int,
        ).tolist()
        for age in range(5)
    }


_policy_action_coverage_slices = policy_action_coverage_slices


def reduced_policy_trajectory(
    mdp: SchedulingMDP,
    policy: Sequence[int] | IntArray,
    *,
    label: str,
    fixed_requested_clock_mhz: float,
    batch_balanced_realized_clock_mhz: float | None = None,
    steps: int = REDUCED_REPLAY_STEPS,
    random_seed: int = REDUCED_REPLAY_RANDOM_SEED,
) -> dict[str, object]:
    """One seeded sample path of a policy in the reduced MDP, shaped like a
    ``ServingResult.as_dict`` payload (it is not an event simulation).

    Power is ``action_energy[action] / decision_period_s``; ``kv_tokens`` is the seed's
    illustrative 2,048 tokens per active decode; temperature is omitted (not a state).

    Raises:
        ValueError: a non-finite or non-positive clock.
    """
    if not np.isfinite(fixed_requested_clock_mhz) or fixed_requested_clock_mhz <= 0.0:
        raise ValueError("fixed_requested_clock_mhz must be finite and positive")
    if batch_balanced_realized_clock_mhz is not None and (
        not np.isfinite(batch_balanced_realized_clock_mhz)
        or batch_balanced_realized_clock_mhz <= 0.0
    ):
        raise ValueError("batch_balanced_realized_clock_mhz must be finite and positive")
    random = np.random.default_rng(random_seed)
    cumulative = _cumulative_rows(mdp.transitions)
    policy_array = np.asarray(policy, dtype=int)
    state = state_index(0, 0, 0)
    completed = 0
    energy = 0.0
    action_power_w = mdp.action_energy / mdp.decision_period_s
    time_values: list[float] = []
    prefill_values: list[int] = []
    decode_values: list[int] = []
    completed_values: list[int] = []
    power_values: list[float] = []
    energy_values: list[float] = []
    phase_values: list[str] = []
    for step in range(steps):
        action = int(policy_array[state])
        _, d_value, _ = mdp.states[state]
        next_state = _sample_from_cumulative(cumulative[state, action], random.random())
        next_prefill, next_decode, _ = mdp.states[next_state]
        if action == DECODE:
            completed += max(0, int(d_value) - int(next_decode))
        energy += float(mdp.action_energy[action])
        time_values.append((step + 1) * mdp.decision_period_s)
        prefill_values.append(int(next_prefill))
        decode_values.append(int(next_decode))
        completed_values.append(completed)
        power_values.append(float(action_power_w[action]))
        energy_values.append(energy)
        phase_values.append(SCHEDULING_ACTIONS[action])
        state = next_state
    trajectory: dict[str, object] = {
        "controller_name": label,
        "scheduler_name": label,
        "time_s": time_values,
        "prefill_queue": prefill_values,
        "decode_active": decode_values,
        "completed_requests": completed_values,
        "kv_tokens": [value * 2_048 for value in decode_values],
        "power_w": power_values,
        "requested_clock_mhz": [float(fixed_requested_clock_mhz)] * steps,
        "energy_j": energy_values,
        "phase": phase_values,
        "metrics": {},
    }
    if batch_balanced_realized_clock_mhz is not None:
        trajectory["realized_clock_mhz"] = [float(batch_balanced_realized_clock_mhz)] * steps
    return trajectory


_reduced_policy_trajectory = reduced_policy_trajectory

__all__ = [
    "NUMBER_STATES",
    "REDUCED_REPLAY_RANDOM_SEED",
    "REDUCED_REPLAY_STEPS",
    "SCHEDULING_ACTIONS",
    "SCHEDULING_SEED_DEVIATIONS",
    "DPSolution",
    "FQISolution",
    "PolicyEvaluation",
    "SchedulingActionName",
    "SchedulingMDP",
    "TransitionDataset",
    "decode_priority_policy",
    "discounted_lp_solve",
    "discounted_policy_iteration",
    "discounted_value_iteration",
    "evaluate_policy_exactly",
    "evaluate_scheduling_policy",
    "fit_fqi",
    "generate_transition_dataset",
    "make_scheduling_mdp",
    "policy_action_coverage_slices",
    "policy_iteration",
    "policy_slice",
    "reduced_policy_trajectory",
    "scheduling_clock_calibration",
    "scheduling_mdp_from_trace",
    "solve_scheduling_mdp",
    "solve_scheduling_mdp_lp",
    "state_index",
]
