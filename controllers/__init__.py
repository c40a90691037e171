"""Clock controllers and the scheduling MDP methods; pure computation, no I/O.

Public names follow the seed's ``__all__`` (see ``docs/seed-notes.md`` section 2), except
its experiment suite ``build_textbook_results``: assembling the case study is study code,
in :mod:`gpugov.study.experiments` (also importable as ``gpugov.study.build_textbook_results``).
They load on first use (PEP 562), so importing one controller module does not pull in
scikit-learn: ``gpugov`` starts in a fraction of the time.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "FixedClockController": "gpugov.controllers.baseline",
    "ReactiveGovernor": "gpugov.controllers.baseline",
    "SampleAndHoldController": "gpugov.controllers.baseline",
    "fixed_clock_controller": "gpugov.controllers.baseline",
    "maximum_clock_controller": "gpugov.controllers.baseline",
    "reactive_clock_controller": "gpugov.controllers.baseline",
    "sample_and_hold_clock_controller": "gpugov.controllers.baseline",
    "MPCController": "gpugov.controllers.mpc.controller",
    "MPCWeights": "gpugov.controllers.mpc.controller",
    "estimate_decode_remaining_tokens": "gpugov.controllers.mpc.controller",
    "mpc_latency_proxies": "gpugov.controllers.mpc.controller",
    "run_mpc": "gpugov.controllers.mpc.controller",
    "OpenLoopClockController": "gpugov.controllers.open_loop",
    "OpenLoopPlan": "gpugov.controllers.open_loop",
    "load_plan": "gpugov.controllers.open_loop",
    "open_loop_clock_controller": "gpugov.controllers.open_loop",
    "optimize_open_loop": "gpugov.controllers.open_loop",
    "save_plan": "gpugov.controllers.open_loop",
    "select_frequency_experiment_window": "gpugov.controllers.open_loop",
    "shift_largest_burst": "gpugov.controllers.open_loop",
    "SCHEDULING_ACTIONS": "gpugov.controllers.scheduling",
    "DPSolution": "gpugov.controllers.scheduling",
    "FQISolution": "gpugov.controllers.scheduling",
    "PolicyEvaluation": "gpugov.controllers.scheduling",
    "SchedulingMDP": "gpugov.controllers.scheduling",
    "TransitionDataset": "gpugov.controllers.scheduling",
    "evaluate_scheduling_policy": "gpugov.controllers.scheduling",
    "fit_fqi": "gpugov.controllers.scheduling",
    "generate_transition_dataset": "gpugov.controllers.scheduling",
    "make_scheduling_mdp": "gpugov.controllers.scheduling",
    "policy_slice": "gpugov.controllers.scheduling",
    "scheduling_mdp_from_trace": "gpugov.controllers.scheduling",
    "solve_scheduling_mdp": "gpugov.controllers.scheduling",
    "MDPPolicyScheduler": "gpugov.controllers.scheduling.policy",
}

__all__ = [
    "SCHEDULING_ACTIONS",
    "DPSolution",
    "FQISolution",
    "FixedClockController",
    "MDPPolicyScheduler",
    "MPCController",
    "MPCWeights",
    "OpenLoopClockController",
    "OpenLoopPlan",
    "PolicyEvaluation",
    "ReactiveGovernor",
    "SampleAndHoldController",
    "SchedulingMDP",
    "TransitionDataset",
    "estimate_decode_remaining_tokens",
    "evaluate_scheduling_policy",
    "fit_fqi",
    "fixed_clock_controller",
    "generate_transition_dataset",
    "load_plan",
    "make_scheduling_mdp",
    "maximum_clock_controller",
    "mpc_latency_proxies",
    "open_loop_clock_controller",
    "optimize_open_loop",
    "policy_slice",
    "reactive_clock_controller",
    "run_mpc",
    "sample_and_hold_clock_controller",
    "save_plan",
    "scheduling_mdp_from_trace",
    "select_frequency_experiment_window",
    "shift_largest_burst",
    "solve_scheduling_mdp",
]


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first access."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'controllers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
