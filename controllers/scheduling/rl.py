"""Offline RL and policy evaluation on the scheduling MDP: logged transitions, fitted Q
iteration with Extra-Trees (scikit-learn, imported when fitting) and seeded roll-outs.

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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from sklearn.ensemble import ExtraTreesRegressor

from gpugov.controllers.scheduling.dp import _labels, decode_priority_policy
from gpugov.controllers.scheduling.mdp import (
    DECODE,
    NUMBER_ACTIONS,
    NUMBER_STATES,
    REDUCED_REPLAY_RANDOM_SEED,
    REDUCED_REPLAY_STEPS,
    SCHEDULING_ACTIONS,
    FloatArray,
    FQISolution,
    IntArray,
    PolicyEvaluation,
    SchedulingMDP,
    TransitionDataset,
    state_index,
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
    from sklearn.ensemble import ExtraTreesRegressor  # the study's extra: gpugov[study]

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
