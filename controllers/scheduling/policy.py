"""A plant scheduler that follows a solved scheduling-MDP policy (beyond the seed).

The seed solves the reduced 245-state scheduling MDP but only replays it inside the MDP
itself. :class:`MDPPolicyScheduler` runs such a policy on the detailed plant: at every
engine iteration it maps the plant's :class:`~plant.types.SchedulerView` onto the
abstraction's state, looks up the policy's action and turns it into an
:class:`~plant.types.IterationPlan`.

State mapping (documented choices, not derived from the seed):

* prefill count ``p = min(6, waiting_requests + prefilling_requests)``: requests that
  still need prompt processing, capped like the MDP's queue;
* decode count ``d = min(6, ceil(decode_active / w))`` with bin width
  ``w = ceil(max_batch_size / 6)`` unless given: ``d = 0`` exactly when nothing decodes,
  and ``d = 6`` (where the MDP forbids prefill) only when the running batch is within one
  bin of the engine's batch limit. Width 1 gives the plain cap ``min(6, decode_active)``;
* oldest-age bin: 0 when ``p = 0`` (the MDP's empty-queue age); otherwise the number of
  bin edges at or below ``oldest_waiting_age_s``. The default edges are
  ``(1, 2, 3, 4) * decision_period_s``, matching the MDP, whose age bin grows by one per
  decision period while the oldest request waits.

Action mapping: ``prefill`` is a prefill-only iteration with a 512-token budget (running
decodes stall, as in the MDP); ``decode`` is a decode-only iteration; ``idle`` runs
nothing for one decision period. Every plan carries ``idle_s = decision_period_s`` so an
iteration that cannot run (for example a KV cache too full to admit a prompt) waits one
period before asking again instead of spinning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.scheduling import (
    DECODE,
    IDLE,
    NUMBER_STATES,
    PREFILL,
    SCHEDULING_ACTIONS,
    DPSolution,
    state_index,
)
from gpugov.plant.types import IterationPlan, SchedulerView

DEFAULT_PREFILL_TOKEN_BUDGET = 512
MAXIMUM_LEVEL = 6


def _structurally_valid(policy: NDArray[np.int_]) -> tuple[bool, str]:
    """Check a policy against the MDP's action rules without building the MDP."""
    for p in range(MAXIMUM_LEVEL + 1):
        for d in range(MAXIMUM_LEVEL + 1):
            for age in range(5):
                action = int(policy[state_index(p, d, age)])
                if action == PREFILL and not (p > 0 and d < MAXIMUM_LEVEL):
                    return False, f"prefill in state (p={p}, d={d}, age={age})"
                if action == DECODE and d == 0:
                    return False, f"decode in state (p={p}, d={d}, age={age})"
    return True, ""


@dataclass(frozen=True, eq=False)
class MDPPolicyScheduler:
    """Scheduler driven by a 245-state MDP policy (see the module notes for the mapping).

    Args:
        policy: one action index (0 prefill, 1 decode, 2 idle) per MDP state.
        decision_period_s: the MDP's decision period; the idle duration.
        prefill_token_budget: prompt tokens of a prefill iteration.
        age_bin_edges_s: four increasing edges (seconds) of the oldest-age bins 1-4;
            default ``(1, 2, 3, 4) * decision_period_s``.
        decode_bin_width: requests per decode-count level; default
            ``ceil(max_batch_size / 6)`` from the view.
        label: the name results show.

    Raises:
        ValueError: a policy of the wrong shape or with an action the MDP forbids,
            non-positive period or budget, bad edges or bin width.
    """

    policy: NDArray[np.int_]
    decision_period_s: float = 0.1
    prefill_token_budget: int = DEFAULT_PREFILL_TOKEN_BUDGET
    age_bin_edges_s: tuple[float, float, float, float] | None = None
    decode_bin_width: int | None = None
    label: str = "MDP policy"
    _edges: NDArray[np.float64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        policy = np.asarray(self.policy)
        if policy.shape != (NUMBER_STATES,) or not np.issubdtype(policy.dtype, np.integer):
            raise ValueError(
                f"policy must hold {NUMBER_STATES} integer actions, got shape {policy.shape} "
                f"and dtype {policy.dtype}"
            )
        if np.any((policy < 0) | (policy > 2)):
            bad = int(np.flatnonzero((policy < 0) | (policy > 2))[0])
            raise ValueError(f"policy[{bad}] = {int(policy[bad])} is not an action index 0-2")
        valid, message = _structurally_valid(policy)
        if not valid:
            raise ValueError(f"policy selects an invalid action: {message}")
        object.__setattr__(self, "policy", policy.astype(int))
        if not math.isfinite(self.decision_period_s) or self.decision_period_s <= 0.0:
            raise ValueError(f"decision_period_s must be positive, got {self.decision_period_s!r}")
        if self.prefill_token_budget < 1:
            raise ValueError(
                f"prefill_token_budget must be >= 1, got {self.prefill_token_budget!r}"
            )
        edges = (
            np.arange(1, 5, dtype=float) * self.decision_period_s
            if self.age_bin_edges_s is None
            else np.asarray(self.age_bin_edges_s, dtype=float)
        )
        if edges.shape != (4,) or not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
            raise ValueError(
                f"age_bin_edges_s must be four increasing finite values, got {self.age_bin_edges_s}"
            )
        if edges[0] <= 0.0:
            raise ValueError(f"age_bin_edges_s must be positive, got {self.age_bin_edges_s}")
        object.__setattr__(self, "_edges", edges)
        if self.decode_bin_width is not None and self.decode_bin_width < 1:
            raise ValueError(f"decode_bin_width must be >= 1, got {self.decode_bin_width!r}")

    @classmethod
    def from_solution(cls, solution: DPSolution, **options: Any) -> MDPPolicyScheduler:
        """Scheduler for a solved MDP, using its decision period."""
        options.setdefault("decision_period_s", solution.mdp.decision_period_s)
        return cls(np.asarray(solution.policy, dtype=int), **options)

    @property
    def __name__(self) -> str:
        return self.label

    def state(self, view: SchedulerView) -> tuple[int, int, int]:
        """The abstract state ``(p, d, age_bin)`` of a plant view."""
        p = min(MAXIMUM_LEVEL, view.waiting_requests + view.prefilling_requests)
        width = (
            self.decode_bin_width
            if self.decode_bin_width is not None
            else max(1, math.ceil(view.max_batch_size / MAXIMUM_LEVEL))
        )
        d = min(MAXIMUM_LEVEL, math.ceil(view.decode_active / width))
        if p == 0:
            age = 0
        else:
            age = int(np.searchsorted(self._edges, view.oldest_waiting_age_s, side="right"))
        return p, d, age

    def action(self, view: SchedulerView) -> str:
        """The policy's action name for a plant view."""
        return SCHEDULING_ACTIONS[int(self.policy[state_index(*self.state(view))])]

    def __call__(self, view: SchedulerView) -> IterationPlan:
        action = int(self.policy[state_index(*self.state(view))])
        if action == PREFILL:
            return IterationPlan(
                decode=False,
                prefill_token_budget=self.prefill_token_budget,
                idle_s=self.decision_period_s,
            )
        if action == DECODE:
            return IterationPlan(decode=True, prefill_token_budget=0, idle_s=self.decision_period_s)
        assert action == IDLE
        return IterationPlan(decode=False, prefill_token_budget=0, idle_s=self.decision_period_s)


__all__ = ["DEFAULT_PREFILL_TOKEN_BUDGET", "MDPPolicyScheduler"]
