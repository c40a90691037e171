"""Tests of the MDP-policy scheduler on hand-made plant views and on the plant."""

from __future__ import annotations

import numpy as np
import pytest

from gpugov.controllers.scheduling import (
    DECODE,
    IDLE,
    PREFILL,
    decode_priority_policy,
    make_scheduling_mdp,
    solve_scheduling_mdp,
    state_index,
)
from gpugov.controllers.scheduling.policy import MDPPolicyScheduler
from gpugov.plant.types import IterationPlan, SchedulerView


def _view(
    waiting: int = 0,
    prefilling: int = 0,
    decode_active: int = 0,
    age_s: float = 0.0,
    max_batch_size: int = 256,
) -> SchedulerView:
    return SchedulerView(
        time_s=5.0,
        waiting_requests=waiting,
        prefilling_requests=prefilling,
        decode_active=decode_active,
        prefill_remaining_tokens=700 * (waiting + prefilling),
        oldest_waiting_age_s=age_s,
        kv_tokens=1_000,
        kv_capacity_tokens=400_000,
        max_batch_size=max_batch_size,
    )


@pytest.fixture(scope="module")
def mdp():
    return make_scheduling_mdp(arrival_probability=0.1, prefill_completion_probability=0.6)


def _probe_policy(mdp, state: tuple[int, int, int], action: int) -> np.ndarray:
    """Idle everywhere except ``action`` in one state."""
    policy = np.full(245, IDLE)
    policy[state_index(*state)] = action
    return policy


def test_state_mapping():
    scheduler = MDPPolicyScheduler(np.full(245, IDLE))
    assert scheduler.state(_view()) == (0, 0, 0)
    assert scheduler.state(_view(waiting=2, prefilling=1, age_s=0.05)) == (3, 0, 0)
    assert scheduler.state(_view(waiting=20, age_s=0.1)) == (6, 0, 1)  # edge counts as >=
    assert scheduler.state(_view(waiting=1, age_s=0.35)) == (1, 0, 3)
    assert scheduler.state(_view(waiting=1, age_s=9.0)) == (1, 0, 4)
    # Age is ignored when nothing waits (the MDP's empty-queue age is 0).
    assert scheduler.state(_view(decode_active=5, age_s=3.0)) == (0, 1, 0)
    # Decode bins of ceil(256 / 6) = 43 requests: 1-43 -> 1, 44-86 -> 2, 216-256 -> 6.
    for active, level in ((1, 1), (43, 1), (44, 2), (215, 5), (216, 6), (256, 6)):
        assert scheduler.state(_view(decode_active=active))[1] == level
    plain = MDPPolicyScheduler(np.full(245, IDLE), decode_bin_width=1)
    assert plain.state(_view(decode_active=4))[1] == 4
    assert plain.state(_view(decode_active=40))[1] == 6
    edges = MDPPolicyScheduler(np.full(245, IDLE), age_bin_edges_s=(0.5, 1.0, 2.0, 4.0))
    assert edges.state(_view(waiting=1, age_s=1.5)) == (1, 0, 2)


def test_actions_become_iteration_plans(mdp):
    prefill = MDPPolicyScheduler(_probe_policy(mdp, (2, 1, 3), PREFILL), decision_period_s=0.2)
    view = _view(waiting=2, decode_active=10, age_s=0.65)
    assert prefill.state(view) == (2, 1, 3)
    assert prefill(view) == IterationPlan(decode=False, prefill_token_budget=512, idle_s=0.2)
    assert prefill.action(view) == "prefill"
    decode = MDPPolicyScheduler(_probe_policy(mdp, (2, 1, 3), DECODE), decision_period_s=0.2)
    assert decode(view) == IterationPlan(decode=True, prefill_token_budget=0, idle_s=0.2)
    idle = MDPPolicyScheduler(np.full(245, IDLE), decision_period_s=0.2)
    assert idle(view) == IterationPlan(decode=False, prefill_token_budget=0, idle_s=0.2)
    budget = MDPPolicyScheduler(_probe_policy(mdp, (2, 1, 3), PREFILL), prefill_token_budget=2048)
    assert budget(_view(waiting=2, decode_active=10, age_s=0.35)).prefill_token_budget == 2048


def test_follows_a_solved_policy(mdp):
    solution = solve_scheduling_mdp(mdp)
    scheduler = MDPPolicyScheduler.from_solution(solution, label="Exact DP")
    assert scheduler.decision_period_s == mdp.decision_period_s
    assert scheduler.__name__ == "Exact DP"
    for waiting in range(4):
        for active in (0, 1, 50, 256):
            for age_s in (0.0, 0.15, 0.5):
                view = _view(waiting=waiting, decode_active=active, age_s=age_s)
                expected = solution.policy_labels[state_index(*scheduler.state(view))]
                assert scheduler.action(view) == expected


def test_rejects_bad_policies_and_parameters(mdp):
    with pytest.raises(ValueError, match="policy must hold 245 integer actions"):
        MDPPolicyScheduler(np.zeros(10, dtype=int))
    with pytest.raises(ValueError, match="policy must hold 245 integer actions"):
        MDPPolicyScheduler(np.zeros(245))
    with pytest.raises(ValueError, match=r"policy\[3\] = 7 is not an action index"):
        bad = np.full(245, IDLE)
        bad[3] = 7
        MDPPolicyScheduler(bad)
    with pytest.raises(ValueError, match=r"decode in state \(p=0, d=0, age=0\)"):
        MDPPolicyScheduler(np.full(245, DECODE))
    with pytest.raises(ValueError, match=r"prefill in state \(p=0, d=0, age=0\)"):
        MDPPolicyScheduler(np.full(245, PREFILL))
    policy = decode_priority_policy(mdp)
    with pytest.raises(ValueError, match="decision_period_s must be positive"):
        MDPPolicyScheduler(policy, decision_period_s=0.0)
    with pytest.raises(ValueError, match="prefill_token_budget must be >= 1"):
        MDPPolicyScheduler(policy, prefill_token_budget=0)
    with pytest.raises(ValueError, match="four increasing finite values"):
        MDPPolicyScheduler(policy, age_bin_edges_s=(0.1, 0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match="decode_bin_width must be >= 1"):
        MDPPolicyScheduler(policy, decode_bin_width=0)


def test_runs_on_the_plant(mdp, synthetic_plant, workload_factory):
    from gpugov.controllers.baseline import maximum_clock_controller
    from gpugov.plant.closed_loop import simulate

    scheduler = MDPPolicyScheduler(decode_priority_policy(mdp), label="Decode priority (MDP)")
    workload = workload_factory(30, spacing_s=0.4, prompt=600, output=40)
    result = simulate(workload, synthetic_plant, scheduler, maximum_clock_controller)
    assert result.metrics.completed_requests == 30
    assert result.metrics.censored_requests == 0
    exact = MDPPolicyScheduler.from_solution(solve_scheduling_mdp(mdp))
    result = simulate(workload, synthetic_plant, exact, maximum_clock_controller)
    assert result.metrics.completed_requests == 30
