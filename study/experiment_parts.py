"""The experiment suite's independent parts, so a runner can run them side by side.

:func:`gpugov.study.experiments.build_textbook_results` is these parts run one after the
other and assembled; ``gpugov experiments --ray`` (or ``--jobs``) runs the first-stage
parts as separate tasks, then the one that needs their policies, and assembles the same
result. The parts:

* ``modeling``: the modelling run (maximum clock on the animation workload);
* ``frequency``: the 60 s window, the open-loop plan on nominal and shifted arrivals, and
  the MPC comparison (maximum clock, reactive governor, MPC) on the shifted window;
* ``scheduling``: the scheduling MDP's calibration, exact value iteration and its Monte
  Carlo evaluation, and the decode-priority heuristic;
* ``fqi_broad`` and ``fqi_narrow``: fitted Q iteration on the broad (uniform) and the
  narrow (decode-priority) log, and the evaluation of the fitted policy (each solves the
  small MDP again for the disagreement reference: cheap, and keeps the parts independent);
* second stage, ``scheduling_on_plant``: the policies as batching rules on the plant.

Every part is deterministic given its inputs (fixed seeds), except the MPC's wall-clock
solve times, so sharded and sequential runs give the same result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpugov.controllers.contract import ControllerWrapper
from gpugov.controllers.mpc.controller import (
    MPCController,
    expected_output_tokens_forecast,
    mpc_summary,
)
from gpugov.controllers.open_loop import (
    OpenLoopPlan,
    optimize_open_loop,
    select_frequency_experiment_window,
    shift_largest_burst,
)
from gpugov.controllers.scheduling import (
    decode_priority_policy,
    evaluate_scheduling_policy,
    fit_fqi,
    policy_action_coverage_slices,
    scheduling_clock_calibration,
    scheduling_mdp_from_trace,
    solve_scheduling_mdp,
)
from gpugov.controllers.scheduling.policy import MDPPolicyScheduler
from gpugov.daemon.controller_config import (
    ControllerConfig,
    FixedControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OpenLoopControllerConfig,
    ReactiveControllerConfig,
)
from gpugov.daemon.decide import ControllerContext, Forecasts, build_controller
from gpugov.daemon.safety import SafetySettings
from gpugov.plant.closed_loop import simulate
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult
from gpugov.plant.scheduler import CHUNKED_PREFILL_LABEL, chunked_prefill_scheduler
from gpugov.plant.types import Request
from gpugov.plant.workload import workload_checksum

ProgressCallback = Callable[[str], None]

SCHEDULER_NAME = CHUNKED_PREFILL_LABEL
FREQUENCY_EXPERIMENT_WINDOW_S = 60.0
ARRIVAL_SHIFT_S = 20.0
SERIES_SPACING_S = 0.5
FQI_MAXIMUM_DEPTH = 12
FQI_MINIMUM_LEAF_SIZE = 2
FQI_RANDOM_SEED = 0
NARROW_EXPLORATION_PROBABILITY = 0.05

FIRST_STAGE = ("modeling", "frequency", "scheduling", "fqi_broad", "fqi_narrow")
"""Parts that depend only on the inputs (longest last is not known: FQI dominates at the
seed's sizes, the frequency part at small ones)."""
SECOND_STAGE = "scheduling_on_plant"
"""The part that needs the first stage's policies."""


@dataclass(frozen=True)
class SuiteInputs:
    """What every part reads: the two workloads, the plant and the sizes."""

    animation_workload: tuple[Request, ...]
    evaluation_workload: tuple[Request, ...]
    plant: ServingPlant
    fqi_transitions: int = 50_000
    fqi_sweeps: int = 50
    fqi_trees: int = 200
    evaluation_episodes: int = 2_000
    evaluation_horizon_steps: int = 300
    mpc_timer: Callable[[], float] | None = None

    @property
    def stride(self) -> int:
        """Series decimation for the JSON payloads (one sample per 0.5 s)."""
        return max(1, int(round(SERIES_SPACING_S / self.plant.time_step_s)))

    @property
    def expected_output_tokens(self) -> float:
        """The declared output forecast: the evaluation workload's mean output length,
        fixed before any run (the seed's choice)."""
        return float(np.mean([request.output_tokens for request in self.evaluation_workload]))


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def moved_request_ids(original: Sequence[Request], shifted: Sequence[Request]) -> set[int]:
    """Ids of requests whose arrival differs between two versions of a workload."""
    before = {request.request_id: request.arrival_time_s for request in original}
    return {
        request.request_id
        for request in shifted
        if request.request_id in before
        and abs(request.arrival_time_s - before[request.request_id]) > 1e-9
    }


MAX = MaxControllerConfig(kind="max")
OPEN_LOOP = OpenLoopControllerConfig(kind="open-loop", plan=Path("case-study-plan"))
"""The open-loop spec; its plan comes in the context (solved in the run, not a file)."""
CASE_STUDY_SAFETY = SafetySettings(floor_mhz=None, dwell_s=0.0)
"""The case study's runs hold no clock (the seed's have no dwell) and set no floor: the
chain only quantises onto the supported clocks, which every controller here already asks
for, so the seed's numbers are reproduced."""
CASE_STUDY_PERIOD_S = 1.0
"""The case study's control period: the seed's one decision a second."""


def case_study_settings() -> dict[str, Any]:
    """What every controller of the case study runs with (``results.json``'s
    ``metadata.controllers``, said in ``summary.md``): its period, safety chain, SLO target
    (none: fixed margins) and engine view (the plant's exact state), the seed's rather than
    ``simulate``'s defaults, so that figures set beside a ``simulate`` run's say why they
    differ."""
    return {
        "control_period_s": CASE_STUDY_PERIOD_S,
        "safety": CASE_STUDY_SAFETY.as_dict(),
        "slo_target": None,
        "engine_view": "exact",
    }


def case_study_controller(
    spec: ControllerConfig,
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    forecasts: Forecasts | None = None,
    plan: OpenLoopPlan | None = None,
) -> ControllerWrapper:
    """A controller of the case study, built by the node's factory in its safety chain
    (:data:`CASE_STUDY_SAFETY`) on a simulated domain of ``plant``, in virtual time, with
    only the forecasts the seed declares (none unless given)."""
    context = ControllerContext.for_plant(
        plant,
        workload,
        period_s=CASE_STUDY_PERIOD_S,
        safety=CASE_STUDY_SAFETY,
        forecasts=forecasts or Forecasts(),
        plan=plan,
    )
    return build_controller(spec, context)


def _run_mpc(
    workload: Sequence[Request],
    plant: ServingPlant,
    timer: Callable[[], float] | None,
) -> ServingResult:
    """``run_mpc(workload, plant)`` with the solve-time distribution in its metadata."""
    forecast = expected_output_tokens_forecast(workload)
    chain = case_study_controller(
        MPCControllerConfig(kind="mpc-slsqp"),
        plant,
        workload,
        forecasts=Forecasts(mean_output_tokens=forecast),
    )
    controller = chain.unwrapped
    assert isinstance(controller, MPCController)
    if timer is not None:
        controller.timer = timer  # fixed solve times in tests; decisions use the budget
    result = simulate(
        workload,
        plant,
        chunked_prefill_scheduler,
        chain,
        0,
        controller_name="mpc-slsqp",
        scheduler_name=SCHEDULER_NAME,
        control_period_s=controller.control_period_s,
    )
    times = [float(value) for value in controller.diagnostics().solve_times_s]
    summary = {
        **mpc_summary(controller, forecast),
        "solve_time_p99_s": _percentile(times, 99),
        "solve_times_s": times,
    }
    return replace(result, metadata={**result.metadata, "mpc": summary})


def _modeling(inputs: SuiteInputs, report: ProgressCallback) -> dict[str, Any]:
    report(f"modelling run: maximum clock on {len(inputs.animation_workload)} requests")
    result = simulate(
        inputs.animation_workload,
        inputs.plant,
        chunked_prefill_scheduler,
        case_study_controller(MAX, inputs.plant, inputs.animation_workload),
        controller_name="max",
        scheduler_name=SCHEDULER_NAME,
    )
    return {"modeling_result": result}


def frequency_window(
    inputs: SuiteInputs,
) -> tuple[tuple[Request, ...], dict[str, float | int | str]]:
    """The open-loop experiment's window of the evaluation workload (the largest
    shiftable burst; :func:`select_frequency_experiment_window`). A command checks it
    before any work: a trace without one is refused there, not minutes in.

    Raises:
        ValueError: no window of the workload holds a shiftable burst.
    """
    return select_frequency_experiment_window(
        inputs.evaluation_workload,
        inputs.plant.profile,
        horizon_s=FREQUENCY_EXPERIMENT_WINDOW_S,
        shift_s=ARRIVAL_SHIFT_S,
        expected_output_tokens=inputs.expected_output_tokens,
    )


def _frequency(inputs: SuiteInputs, report: ProgressCallback) -> dict[str, Any]:
    plant = inputs.plant
    expected_output_tokens = inputs.expected_output_tokens
    report("open loop: selecting the 60 s window and solving the LP plan")
    frequency_workload, frequency_window_metadata = frequency_window(inputs)
    plan = optimize_open_loop(
        frequency_workload,
        plant,
        horizon_s=FREQUENCY_EXPERIMENT_WINDOW_S,
        expected_output_tokens=expected_output_tokens,
    )
    report("open loop: nominal and shifted arrivals under the same plan")
    open_loop_nominal = simulate(
        frequency_workload,
        plant,
        chunked_prefill_scheduler,
        case_study_controller(OPEN_LOOP, plant, frequency_workload, plan=plan),
        controller_name="open-loop",
        scheduler_name=SCHEDULER_NAME,
    )
    shifted_workload = shift_largest_burst(
        frequency_workload,
        plant.profile,
        shift_s=ARRIVAL_SHIFT_S,
        expected_output_tokens=expected_output_tokens,
    )
    moved_ids = moved_request_ids(frequency_workload, shifted_workload)
    if not moved_ids:
        raise RuntimeError("selected frequency window did not yield a moved burst")
    open_loop_shifted = simulate(
        shifted_workload,
        plant,
        chunked_prefill_scheduler,
        case_study_controller(OPEN_LOOP, plant, shifted_workload, plan=plan),
        controller_name="open-loop",
        scheduler_name=SCHEDULER_NAME,
    )
    report("mpc comparison: maximum clock and reactive governor on the shifted window")
    maximum_result = simulate(
        shifted_workload,
        plant,
        chunked_prefill_scheduler,
        case_study_controller(MAX, plant, shifted_workload),
        controller_name="max",
        scheduler_name=SCHEDULER_NAME,
    )
    reactive_result = simulate(
        shifted_workload,
        plant,
        chunked_prefill_scheduler,
        case_study_controller(ReactiveControllerConfig(kind="reactive"), plant, shifted_workload),
        controller_name="reactive",
        scheduler_name=SCHEDULER_NAME,
    )
    report("mpc comparison: receding-horizon MPC (SLSQP every second)")
    mpc_result = _run_mpc(shifted_workload, plant, inputs.mpc_timer)
    return {
        "frequency_workload": frequency_workload,
        "frequency_window_metadata": frequency_window_metadata,
        "plan": plan,
        "open_loop_nominal": open_loop_nominal,
        "open_loop_shifted": open_loop_shifted,
        "shifted_workload": shifted_workload,
        "moved_ids": moved_ids,
        "maximum_result": maximum_result,
        "reactive_result": reactive_result,
        "mpc_result": mpc_result,
    }


def _mdp_and_exact(inputs: SuiteInputs) -> tuple[Any, Any]:
    mdp = scheduling_mdp_from_trace(inputs.evaluation_workload, inputs.plant.profile)
    return mdp, solve_scheduling_mdp(mdp)


def _scheduling(inputs: SuiteInputs, report: ProgressCallback) -> dict[str, Any]:
    report("scheduling MDP: calibration and exact value iteration")
    mdp, exact = _mdp_and_exact(inputs)
    fixed_requested_clock_mhz, batch_balanced_realized_clock_mhz = scheduling_clock_calibration(
        inputs.plant.profile
    )
    exact_evaluation = evaluate_scheduling_policy(
        mdp,
        exact.policy,
        episodes=inputs.evaluation_episodes,
        horizon_steps=inputs.evaluation_horizon_steps,
    )
    return {
        "mdp": mdp,
        "exact": exact,
        "fixed_requested_clock_mhz": fixed_requested_clock_mhz,
        "batch_balanced_realized_clock_mhz": batch_balanced_realized_clock_mhz,
        "exact_evaluation": exact_evaluation,
        "heuristic_policy": decode_priority_policy(mdp),
    }


def _fqi(inputs: SuiteInputs, report: ProgressCallback, *, narrow: bool) -> dict[str, Any]:
    kind = "narrow (decode-priority)" if narrow else "broad (uniform)"
    report(
        f"fqi: {kind} log, {inputs.fqi_transitions} transitions, {inputs.fqi_sweeps} "
        f"sweeps x {inputs.fqi_trees} trees"
    )
    mdp, exact = _mdp_and_exact(inputs)
    options: dict[str, Any] = (
        {"behavior": "decode_priority", "exploration_probability": NARROW_EXPLORATION_PROBABILITY}
        if narrow
        else {"behavior": "uniform"}
    )
    fit = fit_fqi(
        mdp,
        number_transitions=inputs.fqi_transitions,
        sweeps=inputs.fqi_sweeps,
        number_trees=inputs.fqi_trees,
        maximum_depth=FQI_MAXIMUM_DEPTH,
        minimum_leaf_size=FQI_MINIMUM_LEAF_SIZE,
        random_seed=FQI_RANDOM_SEED,
        reference_policy=exact.policy,
        **options,
    )
    report(
        f"policy evaluation: {'narrow' if narrow else 'broad'} FQI, "
        f"{inputs.evaluation_episodes} episodes x {inputs.evaluation_horizon_steps} steps"
    )
    evaluation = evaluate_scheduling_policy(
        mdp,
        fit.policy,
        episodes=inputs.evaluation_episodes,
        horizon_steps=inputs.evaluation_horizon_steps,
    )
    return {
        "policy": fit.policy,
        "coverage_fraction": fit.dataset.coverage_fraction,
        "policy_disagreement_fraction": fit.policy_disagreement_fraction,
        "coverage_slices": policy_action_coverage_slices(fit.dataset, fit.policy),
        "evaluation": evaluation,
    }


def run_part(
    name: str, inputs: SuiteInputs, progress: ProgressCallback | None = None
) -> dict[str, Any]:
    """Run one first-stage part (module notes) and return what the assembly needs.

    Raises:
        ValueError: an unknown part.
        RuntimeError: the frequency window yields no moved burst (as in the seed).
    """
    report = progress or (lambda message: None)
    match name:
        case "modeling":
            return _modeling(inputs, report)
        case "frequency":
            return _frequency(inputs, report)
        case "scheduling":
            return _scheduling(inputs, report)
        case "fqi_broad":
            return _fqi(inputs, report, narrow=False)
        case "fqi_narrow":
            return _fqi(inputs, report, narrow=True)
    raise ValueError(f"unknown experiment part {name!r}; expected one of {FIRST_STAGE}")


def _plant_scheduler_payload(
    result: ServingResult, *, label: str, policy: str, stride: int
) -> dict[str, Any]:
    payload = result.as_dict(stride=stride)
    payload["policy"] = policy
    payload["label"] = label
    return payload


def run_scheduling_on_plant(
    inputs: SuiteInputs,
    parts: Mapping[str, Mapping[str, Any]],
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """The second stage: each first-stage policy as an :class:`MDPPolicyScheduler`, plus
    chunked prefill, on the plant at the MDP's calibration clock; ``progress`` is told
    before each run (a step each: each replays the whole evaluation window)."""
    scheduling = parts["scheduling"]
    return _scheduling_on_plant(
        inputs.evaluation_workload,
        inputs.plant,
        clock_mhz=scheduling["fixed_requested_clock_mhz"],
        decision_period_s=scheduling["mdp"].decision_period_s,
        policies={
            "exact_dp": ("Exact DP", scheduling["exact"].policy),
            "broad_fqi": ("FQI, broad coverage", parts["fqi_broad"]["policy"]),
            "narrow_fqi": ("FQI, narrow log", parts["fqi_narrow"]["policy"]),
            "decode_priority": ("Decode-priority heuristic", scheduling["heuristic_policy"]),
        },
        stride=inputs.stride,
        progress=progress,
    )


def _scheduling_on_plant(
    workload: Sequence[Request],
    plant: ServingPlant,
    *,
    clock_mhz: float,
    decision_period_s: float,
    policies: Mapping[str, tuple[str, Any]],
    stride: int,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Each policy as an :class:`MDPPolicyScheduler`, plus chunked prefill, on the plant
    at one fixed clock; ``progress`` is told before each run."""
    controller = case_study_controller(
        FixedControllerConfig(kind="fixed", clock_mhz=clock_mhz), plant, workload
    )
    runs = len(policies) + 1

    def report(index: int, label: str) -> None:
        if progress is not None:
            progress(f"scheduling on the plant at the calibration clock: {label} ({index}/{runs})")

    schedulers: dict[str, Any] = {}
    for index, (key, (label, policy)) in enumerate(policies.items(), 1):
        report(index, label)
        scheduler = MDPPolicyScheduler(
            np.asarray(policy, dtype=int), decision_period_s=decision_period_s, label=label
        )
        result = simulate(
            workload,
            plant,
            scheduler,
            controller,
            controller_name=f"fixed:{clock_mhz:g}",
            scheduler_name=label,
        )
        schedulers[key] = _plant_scheduler_payload(result, label=label, policy=key, stride=stride)
    report(runs, "Chunked prefill")
    chunked = simulate(
        workload,
        plant,
        chunked_prefill_scheduler,
        controller,
        controller_name=f"fixed:{clock_mhz:g}",
        scheduler_name=SCHEDULER_NAME,
    )
    schedulers["chunked_prefill"] = _plant_scheduler_payload(
        chunked, label=SCHEDULER_NAME, policy="none (chunked prefill)", stride=stride
    )
    return {
        "schedulers": schedulers,
        "metrics": {key: payload["metrics"] for key, payload in schedulers.items()},
        "clock_mhz": float(clock_mhz),
        "decision_period_s": float(decision_period_s),
        "request_count": len(workload),
        "workload_checksum": workload_checksum(workload),
        "state_mapping": (
            "MDPPolicyScheduler: p = min(6, waiting + prefilling requests); d = min(6, "
            "ceil(decode_active / ceil(max_batch_size / 6))); age bin from the oldest "
            "waiting request's age with edges (1, 2, 3, 4) x decision period"
        ),
        "description": (
            "beyond the seed: the reduced-MDP policies run as the serving engine's batching "
            "rule on the detailed plant, every scheduler at the MDP's calibration clock on "
            "the evaluation workload"
        ),
    }


__all__ = [
    "FIRST_STAGE",
    "SECOND_STAGE",
    "SuiteInputs",
    "moved_request_ids",
    "run_part",
    "run_scheduling_on_plant",
]
