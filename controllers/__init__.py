"""Clock controllers and the scheduling MDP methods; pure computation, no I/O.

Public names follow the seed's ``__all__`` (see ``../shared/SEED_NOTES.md`` section 2).
"""

from controllers.baseline import (
    FixedClockController,
    ReactiveGovernor,
    SampleAndHoldController,
    fixed_clock_controller,
    maximum_clock_controller,
    reactive_clock_controller,
    sample_and_hold_clock_controller,
)
from controllers.experiments import build_textbook_results
from controllers.mpc import (
    MPCController,
    MPCWeights,
    estimate_decode_remaining_tokens,
    mpc_latency_proxies,
    run_mpc,
)
from controllers.open_loop import (
    OpenLoopClockController,
    OpenLoopPlan,
    load_plan,
    open_loop_clock_controller,
    optimize_open_loop,
    save_plan,
    select_frequency_experiment_window,
    shift_largest_burst,
)
from controllers.scheduling import (
    SCHEDULING_ACTIONS,
    DPSolution,
    FQISolution,
    PolicyEvaluation,
    SchedulingMDP,
    TransitionDataset,
    evaluate_scheduling_policy,
    fit_fqi,
    generate_transition_dataset,
    make_scheduling_mdp,
    policy_slice,
    scheduling_mdp_from_trace,
    solve_scheduling_mdp,
)
from controllers.scheduling_policy import MDPPolicyScheduler

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
    "build_textbook_results",
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
