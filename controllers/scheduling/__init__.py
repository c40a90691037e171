"""Reduced scheduling MDP: exact dynamic programming, offline RL and policy evaluation.

This module is the public face: it re-exports the names of ``mdp`` (the MDP's
types and construction), ``dp`` (exact solvers) and ``rl`` (logged
transitions, fitted Q iteration, evaluation), so users import from here.

Ported from the seed's scheduling half. The abstraction has 245 states (prefill count
0-6, decode count 0-6, oldest-request age bin 0-4) and three actions (prefill, decode,
idle); its assumptions are spelled out in :attr:`SchedulingMDP.description`. The exact
policy comes from value iteration (:func:`solve_scheduling_mdp`); :func:`policy_iteration`
and :func:`solve_scheduling_mdp_lp` solve the same discounted problem independently so the
value-iteration answer can be checked. Offline RL is fitted Q iteration with Extra-Trees
(:func:`fit_fqi`) on logged transitions (:func:`generate_transition_dataset`).

Random streams. The seed samples each next state with ``Generator.choice(n, p=row)``,
which draws one uniform and inverts the row's normalised cumulative sum.
``rl`` does exactly that with precomputed cumulative rows, so
:func:`generate_transition_dataset`,
:func:`evaluate_scheduling_policy` and the reduced trajectory reproduce the seed's numbers
bit for bit (the tests check this against a per-step ``choice`` reference), while
:func:`evaluate_scheduling_policy` runs all episodes at once: the uniforms are drawn up
front as an ``(episodes, horizon_steps)`` array, which is the order the seed's nested loop
consumed them in.
"""

from __future__ import annotations

from gpugov.controllers.scheduling.dp import (
    decode_priority_policy,
    discounted_lp_solve,
    discounted_policy_iteration,
    discounted_value_iteration,
    evaluate_policy_exactly,
    policy_iteration,
    solve_scheduling_mdp,
    solve_scheduling_mdp_lp,
)
from gpugov.controllers.scheduling.mdp import (
    _REDUCED_REPLAY_RANDOM_SEED,
    _REDUCED_REPLAY_STEPS,
    DECODE,
    IDLE,
    NUMBER_ACTIONS,
    NUMBER_AGE_BINS,
    NUMBER_DECODE_LEVELS,
    NUMBER_PREFILL_LEVELS,
    NUMBER_STATES,
    PREFILL,
    REDUCED_REPLAY_RANDOM_SEED,
    REDUCED_REPLAY_STEPS,
    SCHEDULING_ACTIONS,
    SCHEDULING_SEED_DEVIATIONS,
    DPSolution,
    FQISolution,
    PolicyEvaluation,
    SchedulingActionName,
    SchedulingMDP,
    TransitionDataset,
    make_scheduling_mdp,
    scheduling_clock_calibration,
    scheduling_mdp_from_trace,
    state_index,
)
from gpugov.controllers.scheduling.rl import (
    _reduced_policy_trajectory,
    evaluate_scheduling_policy,
    fit_fqi,
    generate_transition_dataset,
    policy_action_coverage_slices,
    policy_slice,
    reduced_policy_trajectory,
)

__all__ = [
    "DECODE",
    "IDLE",
    "NUMBER_ACTIONS",
    "NUMBER_AGE_BINS",
    "NUMBER_DECODE_LEVELS",
    "NUMBER_PREFILL_LEVELS",
    "NUMBER_STATES",
    "PREFILL",
    "REDUCED_REPLAY_RANDOM_SEED",
    "REDUCED_REPLAY_STEPS",
    "SCHEDULING_ACTIONS",
    "SCHEDULING_SEED_DEVIATIONS",
    "_REDUCED_REPLAY_RANDOM_SEED",
    "_REDUCED_REPLAY_STEPS",
    "DPSolution",
    "FQISolution",
    "PolicyEvaluation",
    "SchedulingActionName",
    "SchedulingMDP",
    "TransitionDataset",
    "_reduced_policy_trajectory",
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
