"""The reduced scheduling MDP itself: its types, state indexing and construction (from a
profile or a trace); the solvers live in ``dp`` and ``rl``.

The abstraction has 245 states (prefill count 0-6, decode count 0-6, oldest-request age
bin 0-4) and three actions (prefill, decode, idle); its assumptions are spelled out in
:attr:`SchedulingMDP.description`. :mod:`controllers.scheduling` re-exports every public
name, so users import from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import Request

if TYPE_CHECKING:
    from sklearn.ensemble import ExtraTreesRegressor

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
    action_energy: Sequence[float] | FloatArray = (0.85, 1.0, 0.25),
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
