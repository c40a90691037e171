"""Open-loop clock planning: a fluid model solved as an LP, replayed without feedback.

Ported from the seed. Arrivals become forecast work in seconds at the maximum clock,
using the prompt length (known on arrival) and one *declared* expected output length,
never a request's realised ``output_tokens``. The LP chooses a normalised service level
per control period; the plan maps it back to clocks and quantises downward onto the
supported set. :func:`shift_largest_burst` and :func:`select_frequency_experiment_window`
build the seed's "what an open-loop plan misses" experiment.

Plans can be written to and read from JSON with :func:`save_plan` / :func:`load_plan`
(the only I/O in ``controllers/``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linprog

from gpugov.controllers.mpc.model import DEFAULT_EXPECTED_OUTPUT_TOKENS
from gpugov.plant.input_files import InputFileError, finite_number, loads_json, read_input_text
from gpugov.plant.output_files import write_text_atomic
from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.profile_files import MAX_CLOCK_MHZ, PROFILE_STATUSES
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.types import ClockController, Request, Scheduler, ServingObservation
from gpugov.plant.workload import workload_checksum

FloatArray = NDArray[np.float64]

PLAN_FORMAT = "gpugov-open-loop-plan-v1"
OPEN_LOOP_SEED_DEVIATIONS = (
    "OpenLoopClockController clamps a negative time to the first period (the seed "
    "clamped only from above, so a negative time indexed from the end of the plan)",
    "optimize_open_loop inverts the service level over the clocks that serve more than "
    "every clock below them, and plans the lowest clock throughout when no clock serves "
    "more than it (the seed inverted it with np.interp, which silently misbehaves on a "
    "non-increasing curve and divided by zero on a flat one)",
)
BACKLOG_COST_PER_S = 20.0
TERMINAL_BACKLOG_COST_PER_S = 20.0


@dataclass(frozen=True)
class OpenLoopPlan:
    """A continuous fluid solution and its supported-clock implementation.

    ``time_s``, ``continuous_clock_mhz`` and ``applied_clock_mhz`` hold one value per
    control period; ``predicted_backlog_s`` (forecast work seconds at the maximum clock)
    holds the initial backlog and one value per period end under the applied clocks.
    """

    time_s: FloatArray
    continuous_clock_mhz: FloatArray
    applied_clock_mhz: FloatArray
    predicted_backlog_s: FloatArray
    objective: float
    optimization_method: str
    success: bool
    message: str
    control_period_s: float
    workload_checksum: str
    profile_status: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (a non-finite objective becomes ``None``)."""
        return {
            "format": PLAN_FORMAT,
            "time_s": self.time_s.tolist(),
            "continuous_clock_mhz": self.continuous_clock_mhz.tolist(),
            "applied_clock_mhz": self.applied_clock_mhz.tolist(),
            "predicted_backlog_s": self.predicted_backlog_s.tolist(),
            "objective": self.objective if math.isfinite(self.objective) else None,
            "optimization_method": self.optimization_method,
            "success": self.success,
            "message": self.message,
            "control_period_s": self.control_period_s,
            "workload_checksum": self.workload_checksum,
            "profile_status": self.profile_status,
        }


# ------------------------------------------------------------------- forecasts
def forecast_request_work_seconds(
    request: Request,
    profile: PerformanceProfile,
    expected_output_tokens: float,
) -> float:
    """Planner-visible work of one request in seconds at the maximum clock.

    ``prompt_tokens / prefill_rate(f_max) + expected_output_tokens / decode_rate(f_max)``;
    the request's hidden ``output_tokens`` is never read.

    Raises:
        ValueError: ``expected_output_tokens`` not finite and positive.
    """
    if not np.isfinite(expected_output_tokens) or expected_output_tokens <= 0.0:
        raise ValueError("expected_output_tokens must be finite and positive")
    maximum_clock = profile.maximum_clock_mhz
    return request.prompt_tokens / profile.rate(
        "prefill", maximum_clock
    ) + expected_output_tokens / profile.rate("decode", maximum_clock)


_forecast_request_work_seconds = forecast_request_work_seconds


def arrival_work_grid(
    workload: Sequence[Request],
    profile: PerformanceProfile,
    horizon_steps: int,
    control_period_s: float,
    expected_output_tokens: float,
) -> FloatArray:
    """Forecast work (seconds) arriving in each control period; later arrivals dropped."""
    work = np.zeros(horizon_steps, dtype=float)
    for request in workload:
        index = int(np.floor(request.arrival_time_s / control_period_s))
        if 0 <= index < horizon_steps:
            work[index] += forecast_request_work_seconds(request, profile, expected_output_tokens)
    return work


_arrival_work_grid = arrival_work_grid


def service_levels(profile: PerformanceProfile) -> FloatArray:
    """Normalised service level per supported clock: the mean of the prefill and decode
    rates, each relative to its maximum-clock value (1 at the maximum clock)."""
    return 0.5 * (
        profile.prefill_tokens_per_s / profile.prefill_tokens_per_s[-1]
        + profile.decode_tokens_per_s / profile.decode_tokens_per_s[-1]
    )


def fluid_rollout(
    clock_mhz: FloatArray,
    arrival_work_s: FloatArray,
    plant: ServingPlant,
    control_period_s: float,
    *,
    initial_backlog_s: float = 0.0,
    initial_temperature_c: float | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Roll the fluid model forward under a clock sequence.

    ``b[k+1] = max(0, b[k] + w[k] - h * s(f[k]))`` with ``s`` the service level; the
    temperature follows the one-state RC model at the phase-maximum power.

    Returns:
        ``(backlog_s, temperature_c, normalised_power)``; the first two have one more
        entry than ``clock_mhz`` (the initial state).
    """
    clock_mhz = np.asarray(clock_mhz, dtype=float)
    profile = plant.profile
    maximum_clock = profile.maximum_clock_mhz
    maximum_power = max(
        profile.power("prefill", maximum_clock), profile.power("decode", maximum_clock)
    )
    service_scale = np.interp(clock_mhz, profile.clock_mhz, service_levels(profile))
    power = np.interp(
        clock_mhz, profile.clock_mhz, np.maximum(profile.prefill_power_w, profile.decode_power_w)
    )
    backlog = np.empty(clock_mhz.size + 1, dtype=float)
    temperature = np.empty(clock_mhz.size + 1, dtype=float)
    backlog[0] = max(0.0, initial_backlog_s)
    temperature[0] = (
        plant.ambient_temperature_c if initial_temperature_c is None else initial_temperature_c
    )
    thermal_decay = np.exp(-control_period_s / plant.thermal_time_constant_s)
    for index in range(clock_mhz.size):
        backlog[index + 1] = max(
            0.0,
            backlog[index] + arrival_work_s[index] - control_period_s * service_scale[index],
        )
        equilibrium = plant.ambient_temperature_c + plant.thermal_resistance_c_per_w * power[index]
        temperature[index + 1] = equilibrium + (temperature[index] - equilibrium) * thermal_decay
    return backlog, temperature, power / maximum_power


_fluid_rollout = fluid_rollout


# --------------------------------------------------------------------- planning
def optimize_open_loop(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    horizon_s: float = 60.0,
    control_period_s: float = 1.0,
    expected_output_tokens: float = DEFAULT_EXPECTED_OUTPUT_TOKENS,
) -> OpenLoopPlan:
    """Optimise a nominal fluid schedule using a declared output-length forecast.

    LP over ``n`` service levels ``u`` in ``[s(f_min), 1]`` and ``n`` end-of-period
    backlogs ``b >= 0`` with ``b[k] >= b[k-1] + w[k] - h * u[k]`` (``b[-1] = 0``);
    cost ``power_slope * sum(u) + 20 * sum(b) + 20 * b[n-1]``, where ``power_slope`` is the
    normalised phase-maximum power range over the service range. Solved by HiGHS; on
    failure the plan runs at the maximum service level and ``success`` is False. On a
    profile where no clock serves more than the lowest (rates flat in the clock: a
    memory-bound GPU), there is no service level to choose: the plan is the lowest clock
    throughout, with no LP.

    Raises:
        ValueError: non-positive horizon or period, or a bad output forecast.
    """
    del scheduler  # The fluid plan assumes the fixed chunked scheduler named by the caller.
    plant.validate()
    if horizon_s <= 0.0 or control_period_s <= 0.0:
        raise ValueError("horizon and control period must be positive")
    horizon_steps = int(np.ceil(horizon_s / control_period_s))
    profile = plant.profile
    arrivals = arrival_work_grid(
        workload, profile, horizon_steps, control_period_s, expected_output_tokens
    )
    all_levels = service_levels(profile)
    # Seed deviation (guard): the seed inverted the service curve with np.interp, which
    # silently returns nonsense for a non-increasing curve and divided by zero for a flat
    # one. The plan inverts it over the clocks that serve more than every clock below
    # them (a measured profile's noise, or a rate that peaks below the top clock, leaves
    # others that no plan needs). A curve with one such clock (flat: a memory-bound
    # profile) leaves nothing to choose, and its LP would divide by zero: the plan is the
    # lowest clock. A flat profile was refused here, which ended `bench controllers` on
    # such a profile in a traceback and `experiments` after its first step.
    rising = all_levels > np.maximum.accumulate(np.concatenate(([-np.inf], all_levels[:-1])))
    if np.count_nonzero(rising) < 2:
        return _lowest_clock_plan(workload, plant, arrivals, control_period_s)
    levels, planned_clocks = all_levels[rising], profile.clock_mhz[rising]
    minimum_service = float(levels[0])
    maximum_power = np.maximum(profile.prefill_power_w, profile.decode_power_w)
    normalized_power = maximum_power / maximum_power[-1]
    power_slope = (normalized_power[-1] - normalized_power[0]) / (1.0 - minimum_service)

    # Variables: n normalised service levels, then n end-of-period backlogs. The
    # inequalities implement b_{k+1} >= b_k + w_k - h u_k.
    number_variables = 2 * horizon_steps
    linear_cost = np.zeros(number_variables, dtype=float)
    linear_cost[:horizon_steps] = power_slope
    linear_cost[horizon_steps:] = BACKLOG_COST_PER_S
    linear_cost[-1] += TERMINAL_BACKLOG_COST_PER_S
    constraint = np.zeros((horizon_steps, number_variables), dtype=float)
    bound = -arrivals.copy()
    for index in range(horizon_steps):
        constraint[index, index] = -control_period_s
        constraint[index, horizon_steps + index] = -1.0
        if index > 0:
            constraint[index, horizon_steps + index - 1] = 1.0
    solution = linprog(
        linear_cost,
        A_ub=constraint,
        b_ub=bound,
        bounds=[(minimum_service, 1.0)] * horizon_steps + [(0.0, None)] * horizon_steps,
        method="highs",
    )
    if solution.success:
        optimized_service = np.asarray(solution.x[:horizon_steps], dtype=float)
    else:
        optimized_service = np.ones(horizon_steps, dtype=float)
    continuous = np.interp(optimized_service, levels, planned_clocks)
    # Downward onto the planned clocks: a skipped clock serves no more than one below it.
    applied = planned_clocks[
        np.maximum(np.searchsorted(planned_clocks, continuous + 1e-9, side="right") - 1, 0)
    ]
    predicted_backlog, _, _ = fluid_rollout(applied, arrivals, plant, control_period_s)
    objective_value = float(solution.fun) if solution.success else float("nan")
    return OpenLoopPlan(
        time_s=np.arange(horizon_steps, dtype=float) * control_period_s,
        continuous_clock_mhz=continuous,
        applied_clock_mhz=applied,
        predicted_backlog_s=predicted_backlog,
        objective=objective_value,
        optimization_method="HiGHS linear program",
        success=bool(solution.success and np.all(np.isfinite(continuous))),
        message=str(solution.message),
        control_period_s=control_period_s,
        workload_checksum=workload_checksum(workload),
        profile_status=profile.profile_status,
    )


def _lowest_clock_plan(
    workload: Sequence[Request],
    plant: ServingPlant,
    arrivals: FloatArray,
    control_period_s: float,
) -> OpenLoopPlan:
    """The plan on a profile where no clock serves more than the lowest: that clock in
    every period. Its objective is the LP's backlog cost (the power term has no range to
    price)."""
    profile = plant.profile
    horizon_steps = arrivals.size
    clocks = np.full(horizon_steps, profile.minimum_clock_mhz, dtype=float)
    backlog, _, _ = fluid_rollout(clocks, arrivals, plant, control_period_s)
    objective = BACKLOG_COST_PER_S * float(np.sum(backlog[1:])) + (
        TERMINAL_BACKLOG_COST_PER_S * float(backlog[-1]) if horizon_steps else 0.0
    )
    return OpenLoopPlan(
        time_s=np.arange(horizon_steps, dtype=float) * control_period_s,
        continuous_clock_mhz=clocks.copy(),
        applied_clock_mhz=clocks,
        predicted_backlog_s=backlog,
        objective=objective,
        optimization_method="lowest clock (no clock serves more than the lowest)",
        success=True,
        message=(
            f"no clock of profile {profile.name} serves more than the lowest, "
            f"{profile.minimum_clock_mhz:g} MHz: planned throughout"
        ),
        control_period_s=control_period_s,
        workload_checksum=workload_checksum(workload),
        profile_status=profile.profile_status,
    )


class OpenLoopClockController:
    """Clock controller that replays a precomputed plan without feedback.

    Period ``k`` covers ``[k h, (k+1) h)``; after the plan ends its last clock is held.
    """

    def __init__(self, plan: OpenLoopPlan) -> None:
        self.plan = plan
        self.plan_dt_s = plan.control_period_s
        self.plans_by_step = {0: tuple(float(value) for value in plan.applied_clock_mhz)}
        self.plan_start_times_by_step = {0: 0.0}
        self.__name__ = "open-loop"

    def __call__(self, observation: ServingObservation) -> float:
        index = int(np.floor((observation.time_s + 1e-12) / self.plan.control_period_s))
        # Seed deviation: the seed only clamped from above, so a negative time would
        # index from the end of the plan; clamp to the first period instead.
        index = min(max(index, 0), self.plan.applied_clock_mhz.size - 1)
        return float(self.plan.applied_clock_mhz[index])


def open_loop_clock_controller(plan: OpenLoopPlan) -> ClockController:
    """Controller replaying ``plan`` (the seed's factory name)."""
    return OpenLoopClockController(plan)


# --------------------------------------------------------------------- plan I/O
class PlanFormatError(ValueError):
    """A saved plan is malformed; the message names the file and the key."""


def save_plan(plan: OpenLoopPlan, path: str | Path) -> Path:
    """Write ``plan`` as JSON to ``path`` atomically (an earlier plan there stays whole if
    the write fails midway) and return the path."""
    target = Path(path)
    write_text_atomic(target, json.dumps(plan.as_dict(), indent=2, allow_nan=False) + "\n")
    return target


def _number_array(data: dict[str, Any], key: str, where: str) -> FloatArray:
    raw = data.get(key)
    if not isinstance(raw, list) or not raw:
        raise PlanFormatError(f"{where}: key {key!r} must be a non-empty list of numbers")
    for position, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PlanFormatError(f"{where}: key {key!r}[{position}] is not a number: {value!r}")
        # finite_number: an integer too large for a float (10**400) ended the load in an
        # OverflowError traceback, from math.isfinite here or float() below.
        if finite_number(value) is None:
            raise PlanFormatError(f"{where}: key {key!r}[{position}] is not finite")
    return np.asarray(raw, dtype=float)


def plan_from_dict(data: Any, *, source: str = "<plan>", min_period_s: float = 0.0) -> OpenLoopPlan:
    """Rebuild and validate a plan from :meth:`OpenLoopPlan.as_dict` output.

    ``min_period_s`` is the shortest ``control_period_s`` taken (the commands pass the
    daemon's ``MIN_PERIOD_S``, which this layer cannot import; 0 takes any positive one).

    Raises:
        PlanFormatError: naming ``source`` and the offending key.
    """
    if not isinstance(data, dict):
        raise PlanFormatError(f"{source}: a plan must be a JSON object")
    if data.get("format") != PLAN_FORMAT:
        raise PlanFormatError(
            f"{source}: key 'format' must be {PLAN_FORMAT!r}, got {data.get('format')!r}"
        )
    time_s = _number_array(data, "time_s", source)
    continuous = _number_array(data, "continuous_clock_mhz", source)
    applied = _number_array(data, "applied_clock_mhz", source)
    backlog = _number_array(data, "predicted_backlog_s", source)
    steps = time_s.size
    for key, array, expected in (
        ("continuous_clock_mhz", continuous, steps),
        ("applied_clock_mhz", applied, steps),
        ("predicted_backlog_s", backlog, steps + 1),
    ):
        if array.size != expected:
            raise PlanFormatError(
                f"{source}: key {key!r} has {array.size} values, expected {expected} "
                f"(time_s has {steps})"
            )
    for key, clocks in (("applied_clock_mhz", applied), ("continuous_clock_mhz", continuous)):
        if np.any(clocks <= 0.0):
            raise PlanFormatError(f"{source}: clocks in {key!r} must be positive")
        if np.any(clocks > MAX_CLOCK_MHZ):
            first = int(np.flatnonzero(clocks > MAX_CLOCK_MHZ)[0])
            raise PlanFormatError(
                f"{source}: key {key!r}[{first}] is {clocks[first]:g} MHz; no GPU clocks "
                f"above {MAX_CLOCK_MHZ:g} MHz"
            )
    if np.any(backlog < 0.0):
        raise PlanFormatError(f"{source}: key 'predicted_backlog_s' must be nonnegative")
    period = data.get("control_period_s")
    if isinstance(period, bool) or not isinstance(period, int | float) or not period > 0.0:
        raise PlanFormatError(
            f"{source}: key 'control_period_s' must be positive, got {period!r:.40}"
        )
    if finite_number(period) is None:
        raise PlanFormatError(f"{source}: key 'control_period_s' must be finite")
    if period < min_period_s:
        raise PlanFormatError(
            f"{source}: key 'control_period_s' must be at least {min_period_s:g} s "
            f"(the shortest control period), got {period!r}"
        )
    if np.any(np.diff(time_s) <= 0.0):
        raise PlanFormatError(f"{source}: key 'time_s' must be strictly increasing")
    objective = data.get("objective")
    if objective is not None and finite_number(objective) is None:
        raise PlanFormatError(f"{source}: key 'objective' must be a finite number or null")
    strings = {}
    for key in (
        "optimization_method",
        "message",
        "workload_checksum",
        "profile_status",
    ):
        value = data.get(key)
        if not isinstance(value, str):
            raise PlanFormatError(f"{source}: key {key!r} must be a string, got {value!r}")
        strings[key] = value
    if strings["profile_status"] not in PROFILE_STATUSES:
        raise PlanFormatError(
            f"{source}: key 'profile_status' must be one of {', '.join(PROFILE_STATUSES)} "
            f"(the status of the profile the plan was made on), got "
            f"{strings['profile_status']!r:.40}"
        )
    success = data.get("success")
    if not isinstance(success, bool):
        raise PlanFormatError(f"{source}: key 'success' must be true or false, got {success!r}")
    return OpenLoopPlan(
        time_s=time_s,
        continuous_clock_mhz=continuous,
        applied_clock_mhz=applied,
        predicted_backlog_s=backlog,
        objective=float("nan") if objective is None else float(objective),
        success=success,
        control_period_s=float(period),
        **strings,
    )


def load_plan(path: str | Path, *, min_period_s: float = 0.0) -> OpenLoopPlan:
    """Read a plan written by :func:`save_plan` (``min_period_s`` as in
    :func:`plan_from_dict`).

    Raises:
        PlanFormatError: unreadable file, invalid JSON or a bad key (the message names
            the file and the key).
    """
    source = Path(path)
    try:
        text = read_input_text(source, "plan")
    except InputFileError as error:
        raise PlanFormatError(str(error)) from error
    try:
        data = loads_json(text)
    except json.JSONDecodeError as error:
        raise PlanFormatError(f"{source}:{error.lineno}: not valid JSON: {error.msg}") from error
    return plan_from_dict(data, source=str(source), min_period_s=min_period_s)


# ------------------------------------------------------------- burst experiment
def shift_largest_burst(
    workload: Sequence[Request],
    profile: PerformanceProfile,
    *,
    window_s: float = 10.0,
    shift_s: float = 20.0,
    expected_output_tokens: float = DEFAULT_EXPECTED_OUTPUT_TOKENS,
) -> tuple[Request, ...]:
    """Move the largest forecast-work burst ``shift_s`` earlier.

    Arrivals are binned into ``window_s`` bins from time zero; among bins starting at or
    after ``shift_s`` the one with the most forecast work (first on ties) moves earlier
    by ``shift_s``. The result is sorted by (arrival, request_id). Unchanged when no bin
    is eligible or the largest eligible bin is empty.

    Raises:
        ValueError: non-positive ``window_s`` or ``shift_s``.
    """
    if not workload:
        return ()
    if window_s <= 0.0 or shift_s <= 0.0:
        raise ValueError("window_s and shift_s must be positive")
    latest = max(request.arrival_time_s for request in workload)
    edges = np.arange(0.0, latest + window_s, window_s)
    if edges.size < 2:
        return tuple(workload)
    weights = np.array(
        [
            forecast_request_work_seconds(request, profile, expected_output_tokens)
            for request in workload
        ]
    )
    arrivals = np.array([request.arrival_time_s for request in workload])
    bin_index = np.clip(np.digitize(arrivals, edges) - 1, 0, edges.size - 2)
    totals = np.bincount(bin_index, weights=weights, minlength=edges.size - 1)
    eligible = np.where(edges[:-1] >= shift_s)[0]
    if not eligible.size:
        return tuple(workload)
    target_bin = int(eligible[np.argmax(totals[eligible])])
    if totals[target_bin] <= 0.0:
        return tuple(workload)
    shifted: list[Request] = []
    for request, index in zip(workload, bin_index, strict=True):
        arrival = (
            request.arrival_time_s - shift_s if index == target_bin else request.arrival_time_s
        )
        shifted.append(replace(request, arrival_time_s=max(0.0, arrival)))
    shifted.sort(key=lambda request: (request.arrival_time_s, request.request_id))
    return tuple(shifted)


def _no_window_reason(
    requests: Sequence[Request],
    horizon_s: float,
    burst_window_s: float,
    shift_s: float,
    lightest_over_s: float,
) -> str:
    """Why :func:`select_frequency_experiment_window` found no window, in the user's terms:
    the arrivals span too little for a burst ``shift_s`` into a window, or every window
    that has one carries more work than the maximum clock serves in ``horizon_s``."""
    first = requests[0].arrival_time_s
    last = requests[-1].arrival_time_s
    head = (
        f"no trace window contains a shiftable forecast-work burst within the maximum-clock "
        f"horizon capacity: the open-loop experiment moves a burst {shift_s:g} s earlier, so "
        f"it needs a {horizon_s:g} s window with requests {shift_s:g} s or more into it"
    )
    if math.isfinite(lightest_over_s):
        return (
            f"{head} whose forecast work fits {horizon_s:g} s at the maximum clock; every such "
            f"window holds more (the lightest {lightest_over_s:,.1f} s): use a lighter stretch of "
            "the trace or a faster profile"
        )
    return (
        f"{head} (windows start on a multiple of {burst_window_s:g} s); the "
        f"{len(requests)} request(s) arrive from {first:,.2f} s to {last:,.2f} s: use a "
        "longer stretch of the trace"
    )


def select_frequency_experiment_window(
    workload: Sequence[Request],
    profile: PerformanceProfile,
    *,
    horizon_s: float = 60.0,
    burst_window_s: float = 10.0,
    shift_s: float = 20.0,
    expected_output_tokens: float = DEFAULT_EXPECTED_OUTPUT_TOKENS,
) -> tuple[tuple[Request, ...], dict[str, float | int | str]]:
    """Select a nondegenerate frequency-control window deterministically.

    Candidate windows are aligned with the burst bins used by
    :func:`shift_largest_burst`. A candidate must contain positive forecast work in a bin
    that can be shifted earlier and its total forecast work must fit within the
    maximum-clock service capacity of the horizon. Among those candidates, the one with
    the largest shiftable burst is selected; total forecast work and then the earliest
    source time break ties. The window is rebased to start at zero.

    Forecast work uses prompt lengths and one declared expected output length. It never
    reads a request's realised ``output_tokens`` value.

    Returns:
        ``(rebased requests, metadata)``; the metadata records the source window, the
        burst, the forecast and the selection rule.

    Raises:
        ValueError: an empty or unsorted workload, bad lengths, or no eligible window.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("workload must contain at least one request")
    if horizon_s <= 0.0 or burst_window_s <= 0.0 or shift_s <= 0.0:
        raise ValueError("horizon_s, burst_window_s, and shift_s must be positive")
    if horizon_s < shift_s + burst_window_s:
        raise ValueError("horizon is too short to contain a shiftable burst")
    if any(right.arrival_time_s < left.arrival_time_s for left, right in pairwise(requests)):
        raise ValueError("workload must be sorted by arrival_time_s")
    first_start = np.floor(requests[0].arrival_time_s / burst_window_s) * burst_window_s
    last_start = np.floor(requests[-1].arrival_time_s / burst_window_s) * burst_window_s
    number_starts = int(round((last_start - first_start) / burst_window_s)) + 1
    candidate_starts = first_start + burst_window_s * np.arange(number_starts)
    number_bins = int(np.ceil(horizon_s / burst_window_s))
    bin_starts = burst_window_s * np.arange(number_bins)
    eligible_bins = np.flatnonzero(bin_starts >= shift_s - 1e-12)
    all_weights = np.asarray(
        [
            forecast_request_work_seconds(request, profile, expected_output_tokens)
            for request in requests
        ],
        dtype=float,
    )
    all_arrivals = np.asarray([request.arrival_time_s for request in requests], dtype=float)
    best: tuple[tuple[float, float, float], float, int, int, float, int, float] | None = None
    capacity_tolerance = 1e-9 * max(1.0, horizon_s)
    # The least work of a window with a burst to shift but over the horizon's capacity.
    lightest_over_s = math.inf
    for raw_start in candidate_starts:
        source_start = float(raw_start)
        source_end = source_start + horizon_s
        # The workload is sorted, so the window is one contiguous slice.
        low = int(np.searchsorted(all_arrivals, source_start, side="left"))
        high = int(np.searchsorted(all_arrivals, source_end, side="left"))
        if high <= low:
            continue
        weights = all_weights[low:high]
        total_work = float(np.sum(weights))
        relative_arrivals = all_arrivals[low:high] - source_start
        bin_indices = np.clip(
            np.floor(relative_arrivals / burst_window_s).astype(int), 0, number_bins - 1
        )
        totals = np.bincount(bin_indices, weights=weights, minlength=number_bins)
        if not eligible_bins.size:
            continue
        target_bin = int(eligible_bins[int(np.argmax(totals[eligible_bins]))])
        burst_work = float(totals[target_bin])
        if burst_work <= 0.0:
            continue
        if total_work > horizon_s + capacity_tolerance:
            lightest_over_s = min(lightest_over_s, total_work)
            continue
        burst_count = int(np.count_nonzero(bin_indices == target_bin))
        score = (burst_work, total_work, -source_start)
        if best is None or score > best[0]:
            best = (score, source_start, low, high, total_work, burst_count, bin_starts[target_bin])
    if best is None:
        raise ValueError(
            _no_window_reason(requests, horizon_s, burst_window_s, shift_s, lightest_over_s)
        )
    score, source_start, low, high, total_work, burst_count, burst_start = best
    rebased = tuple(
        replace(request, arrival_time_s=float(request.arrival_time_s - source_start))
        for request in requests[low:high]
    )
    if any(
        request.arrival_time_s < 0.0 or request.arrival_time_s >= horizon_s for request in rebased
    ):
        raise RuntimeError("selected trace window did not rebase into its horizon")
    metadata: dict[str, float | int | str] = {
        "source_window_start_s": source_start,
        "source_window_end_s": source_start + horizon_s,
        "source_window_duration_s": horizon_s,
        "request_count": len(rebased),
        "forecast_work_s": total_work,
        "forecast_utilization_at_max_clock": total_work / horizon_s,
        "shiftable_burst_start_s": float(burst_start),
        "shiftable_burst_end_s": float(min(burst_start + burst_window_s, horizon_s)),
        "shiftable_burst_request_count": burst_count,
        "shiftable_burst_forecast_work_s": score[0],
        "expected_output_tokens": expected_output_tokens,
        "selection_rule": (
            "largest shift-eligible forecast-work burst among aligned windows "
            "within maximum-clock forecast capacity"
        ),
    }
    return rebased, metadata


_select_frequency_experiment_window = select_frequency_experiment_window

__all__ = [
    "DEFAULT_EXPECTED_OUTPUT_TOKENS",
    "OPEN_LOOP_SEED_DEVIATIONS",
    "OpenLoopClockController",
    "OpenLoopPlan",
    "PlanFormatError",
    "arrival_work_grid",
    "fluid_rollout",
    "forecast_request_work_seconds",
    "load_plan",
    "open_loop_clock_controller",
    "optimize_open_loop",
    "plan_from_dict",
    "save_plan",
    "select_frequency_experiment_window",
    "service_levels",
    "shift_largest_burst",
]
