"""Controller scoreboard: every controller and oracle on real traces, profiles and loads.

For each scenario (trace window x bundled profile x load) it runs the maximum clock, the
best fixed clock in hindsight, the reactive governor, the open-loop plan, the SLSQP MPC,
the fast (discrete-search) MPC and the window oracle on the detailed plant, plus the
fluid LP lower bound on energy, and reports energy, J/token, SLO attainment, p95 TTFT and
TPOT, power-cap and thermal violation seconds, decision times and oracle capture. It
also compares the two MPC solvers on every decision point of one recorded closed-loop
run. See ``docs/scoreboard.md`` for every definition; ``gpugov bench controllers`` runs
the same code.

    .venv/bin/python study/scoreboard.py [--quick] [--out DIR] [--jobs N]

Writes ``DIR/scoreboard.json``, ``DIR/scoreboard.md`` and ``DIR/scoreboard.png``
(default ``bench/results/controllers/``) and prints a short summary.

Scenarios
    Traces: the bundled Azure conversation slice (``azure-conv-10min``, from 0 s), the
    Azure conversation hour (from 1800 s), the Azure code hour (from 600 s), Mooncake
    (from 1800 s) and the BurstGPT ``_1`` slice (all 400 rows, time-compressed). Each
    scenario covers about ``duration_s`` seconds of arrivals (600 s in the full run).

    Capacity: the maximum-clock capacity of a window is the highest arrival-rate
    multiplier (``scale_load``) at which the maximum clock's SLO attainment stays within
    1 percentage point of its attainment at a light load ("SLO capacity"). Light load
    is 20% of the fluid estimate's capacity (below), lowered 4x (at most twice) while
    that raises the attainment by half a point or more (the Azure code trace's bursts
    stay congested at 20% on average); the light-load attainment is about 100% on the
    Azure conversation trace but not on Mooncake, whose longest prompts miss a 1 s TTFT
    even alone. It is measured by simulation: from the fluid guess the multiplier is doubled
    (up to 16x the guess) or bisected towards the light load until the test changes,
    then bisected in log space to within about 4%. A load's utilisation is its
    multiplier over the capacity multiplier. The seed-style fluid estimate,
    ``(sum(prompt) / prefill_rate(f_max) + sum(output - 1) / decode_rate(f_max))`` over
    the window's length, is reported next to it; it ignores latency, so it calls loads
    "70%" that the maximum clock serves far outside the SLOs (chunked prefill's
    512-token iterations each pay the decode batch's weight reads, and big decode
    batches break the TPOT SLO before they run out of throughput).

    Loads: ``recorded`` keeps the trace's own arrival rate when it is within capacity
    (capacity multiplier >= 1); otherwise the window is spread over the
    smallest pool of ``n = ceil(1 / capacity)`` GPUs (arrival rate / n, labelled
    ``recorded/n``), as the shared traces' README advises for Mooncake. BurstGPT ``_1``
    as recorded is 0.01 requests/s (an idle GPU), so its first load is ``busy``:
    compressed to 90% of capacity. ``cap70`` scales the arrival rate to 70% of capacity
    (measured on a first ``duration_s`` window, the source window resized to
    ``duration_s * 0.7 * capacity`` so that the scenario still covers about
    ``duration_s`` seconds, and the capacity measured again on it).

Controllers are assembled in one place, :func:`build_scoreboard_controllers`; the
oracles and the bound come from :mod:`controllers.oracles`.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from gpugov.controllers.baseline import maximum_clock_controller, reactive_clock_controller
from gpugov.controllers.mpc import (
    MPCController,
    MPCProblem,
    MPCSolver,
    expected_output_tokens_forecast,
)
from gpugov.controllers.open_loop import OpenLoopClockController, optimize_open_loop
from gpugov.controllers.oracles import (
    SLO_TOLERANCE,
    best_fixed_clock,
    fluid_energy_lower_bound,
    holds_slo,
    oracle_capture,
    window_oracle,
)
from gpugov.daemon.config import MPCControllerConfig
from gpugov.daemon.service import simulated_mpc
from gpugov.plant import PerformanceProfile, ServingPlant, ServingResult, load_profile, simulate
from gpugov.plant.profile import list_bundled_profiles
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.types import ClockController, Request, ServingObservation
from gpugov.plant.workload import (
    TraceError,
    TraceWarning,
    load_trace,
    scale_load,
    select_window,
    workload_checksum,
)

ROOT = Path(__file__).resolve().parents[1]
# In a source checkout the results live beside the benchmark; installed from a wheel,
# there is no checkout, and they go to a folder under the working directory.
DEFAULT_OUT = (
    ROOT / "bench" / "results" / "controllers"
    if (ROOT / "pyproject.toml").is_file()
    else Path("gpugov-scoreboard")
)

TRACES = ("azure-conv-10min", "azure-conv", "azure-code", "mooncake", "burstgpt1")
PROFILES = ("h100-sxm-llama3-8b", "h200-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b")
LOADS = ("recorded", "cap70")
TRACE_STARTS_S = {
    "azure-conv-10min": 0.0,
    "azure-conv": 1800.0,
    "azure-code": 600.0,
    "mooncake": 1800.0,
    "burstgpt1": 0.0,
}
"""Source window start per trace (seconds after its first arrival)."""
WHOLE_TRACE = frozenset({"burstgpt1"})
"""Traces used whole (too few rows for a window), time-compressed to the target load."""
TARGET_UTILIZATION = 0.7
BUSY_UTILIZATION = 0.9
LIGHT_LOAD_FRACTION = 0.2
"""Light load for the capacity search, as a fraction of the fluid estimate's capacity."""
CAPACITY_SEARCH_LIMIT = 16.0

CONTROLLER_ORDER = (
    "max_clock",
    "best_fixed",
    "reactive",
    "open_loop",
    "mpc_slsqp",
    "mpc_fast",
    "window_oracle",
)
ORACLE_KEYS = frozenset({"best_fixed", "window_oracle"})


# --------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class BenchConfig:
    """What one scoreboard run covers and how hard the oracles search."""

    traces: tuple[str, ...] = TRACES
    profiles: tuple[str, ...] = PROFILES
    loads: tuple[str, ...] = LOADS
    duration_s: float = 600.0
    control_period_s: float = 1.0
    mpc_horizon_s: float = 10.0
    mpc_solve_time_limit_s: float = 0.8
    fast_mpc_period_s: float = 0.5
    oracle_window_s: float = 5.0
    oracle_lookahead_s: float = 15.0
    oracle_coarse_levels: int = 8
    oracle_neighbour_steps: tuple[int, ...] = (2, 6)
    best_fixed_coarse_points: int = 5
    lp_window_s: float = 1.0
    tolerance: float = SLO_TOLERANCE
    comparison_scenario: str | None = "azure-conv-10min|h100-sxm-llama3-8b|recorded"
    jobs: int = 0
    seed: int = 0
    mode: str = "full"

    def scenario_specs(self) -> list[tuple[str, str, str]]:
        """(trace, profile, load) for every scenario, in table order."""
        return [(t, p, ld) for t in self.traces for p in self.profiles for ld in self.loads]


FULL = BenchConfig()
QUICK = BenchConfig(
    traces=("azure-conv-10min", "azure-code"),
    profiles=("h100-sxm-llama3-8b",),
    duration_s=120.0,
    mode="quick",
)
TINY = BenchConfig(
    traces=("azure-conv-10min",),
    profiles=("h100-sxm-llama3-8b",),
    loads=("recorded",),
    duration_s=15.0,
    oracle_window_s=5.0,
    oracle_lookahead_s=5.0,
    oracle_coarse_levels=4,
    oracle_neighbour_steps=(3,),
    best_fixed_coarse_points=3,
    jobs=1,
    mode="tiny",
)


# ------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class Scenario:
    """One trace window at one load on one profile."""

    key: str
    trace: str
    profile: str
    load: str
    load_label: str
    requests: tuple[Request, ...]
    source_start_s: float
    source_duration_s: float
    load_scale: float
    capacity_load_scale: float
    capacity_probes: int
    light_load_slo_attainment: float
    utilization: float
    fluid_utilization_estimate: float
    trace_sha256: str

    def describe(self) -> dict[str, Any]:
        """JSON-able description (without the requests)."""
        arrivals = [r.arrival_time_s for r in self.requests]
        return {
            "key": self.key,
            "trace": self.trace,
            "profile": self.profile,
            "load": self.load,
            "load_label": self.load_label,
            "source_start_s": self.source_start_s,
            "source_duration_s": self.source_duration_s,
            "load_scale": self.load_scale,
            "capacity_load_scale": self.capacity_load_scale,
            "capacity_probes": self.capacity_probes,
            "light_load_slo_attainment": self.light_load_slo_attainment,
            "utilization": self.utilization,
            "fluid_utilization_estimate": self.fluid_utilization_estimate,
            "requests": len(self.requests),
            "arrival_span_s": (max(arrivals) - min(arrivals)) if arrivals else 0.0,
            "scenario_duration_s": self.source_duration_s / self.load_scale,
            "trace_sha256": self.trace_sha256,
            "workload_checksum": workload_checksum(self.requests),
        }


def work_seconds_at_maximum(requests: Iterable[Request], profile: PerformanceProfile) -> float:
    """Seconds of work at the maximum clock by the profile's aggregate rates (the fluid
    estimate's numerator)."""
    top = profile.realized_clock(profile.maximum_clock_mhz)
    prefill = profile.rate("prefill", top)
    decode = profile.rate("decode", top)
    return sum(r.prompt_tokens / prefill + (r.output_tokens - 1) / decode for r in requests)


def slo_attainment_at_maximum(
    requests: Sequence[Request], plant: ServingPlant, load_scale: float
) -> float:
    """SLO attainment of the maximum clock on ``requests`` at ``load_scale``."""
    result = simulate(
        scale_load(requests, load_scale),
        plant,
        chunked_prefill_scheduler,
        maximum_clock_controller,
        controller_name="capacity probe",
    )
    return result.metrics.slo_attainment or 0.0


def slo_capacity(
    requests: Sequence[Request],
    plant: ServingPlant,
    duration_s: float,
    *,
    tolerance: float = SLO_TOLERANCE,
    light_fraction: float = LIGHT_LOAD_FRACTION,
    bisections: int = 4,
) -> tuple[float, float, int]:
    """The window's SLO capacity multiplier at the maximum clock (module notes).

    Returns:
        ``(capacity multiplier, light-load SLO attainment, simulations run)``.

    Raises:
        ValueError: no requests or a non-positive duration.
    """
    if not requests or duration_s <= 0.0:
        raise ValueError("slo_capacity needs requests and a positive duration")
    guess = duration_s / max(work_seconds_at_maximum(requests, plant.profile), 1e-9)
    runs = 0

    def attainment(scale: float) -> float:
        nonlocal runs
        runs += 1
        return slo_attainment_at_maximum(requests, plant, scale)

    # Light load: 20% of the fluid guess, lowered 4x at a time (at most twice) while
    # that still gains half a point (bursty traces stay congested at 20% on average).
    light = light_fraction * guess
    reference = attainment(light)
    for _ in range(2):
        lighter = attainment(light / 4.0)
        if lighter < reference + tolerance / 2.0:
            break
        light, reference = light / 4.0, lighter
    threshold = reference - tolerance - 1e-12
    low, high = light, guess
    if attainment(high) >= threshold:
        low = high
        while high < CAPACITY_SEARCH_LIMIT * guess:
            high *= 2.0
            if attainment(high) < threshold:
                break
            low = high
        else:
            return high, reference, runs
    for _ in range(bisections):
        middle = math.sqrt(low * high)
        if attainment(middle) >= threshold:
            low = middle
        else:
            high = middle
    return low, reference, runs


@cache
def _full_trace(name: str) -> tuple[tuple[Request, ...], str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        requests, report = load_trace(name)
    return requests, report.sha256


def _window(
    full: Sequence[Request], start_s: float, length_s: float
) -> tuple[tuple[Request, ...], float, float]:
    """Arrivals in ``[start, start + length)``, the window moved back to fit the trace."""
    span = full[-1].arrival_time_s if full else 0.0
    length = min(length_s, span + 1e-6)
    start = max(0.0, min(start_s, span + 1e-6 - length))
    return select_window(full, start, length), start, length


class EmptyWindowError(ValueError):
    """A scenario's window, shrunk to a small profile's capacity, holds no requests."""


def _require_requests(window: Sequence[Request], trace: str, length_s: float) -> None:
    """Raise :class:`EmptyWindowError` when ``window`` is empty (the scenario is skipped)."""
    if not window:
        raise EmptyWindowError(
            f"{trace}: the {length_s:.3g} s window this profile's capacity allows holds no "
            "requests"
        )


def build_scenario(trace: str, plant: ServingPlant, load: str, duration_s: float) -> Scenario:
    """The workload of one scenario (module notes: windows, capacity, loads).

    Raises:
        TraceError: the trace cannot be loaded.
        EmptyWindowError: the window shrunk to the profile's capacity holds no requests.
        ValueError: an unknown load.
    """
    if load not in LOADS:
        raise ValueError(f"load must be one of {LOADS}, got {load!r}")
    profile = plant.profile
    full, digest = _full_trace(trace)
    if trace in WHOLE_TRACE:
        window, start, length = _window(full, 0.0, full[-1].arrival_time_s + 1e-6)
        capacity, light, probes = slo_capacity(window, plant, length)
        target = BUSY_UTILIZATION if load == "recorded" else TARGET_UTILIZATION
        scale = target * capacity
        label = "busy" if load == "recorded" else "cap70"
    else:
        window, start, length = _window(full, TRACE_STARTS_S.get(trace, 0.0), duration_s)
        capacity, light, probes = slo_capacity(window, plant, length)
        if load == "recorded":
            pool = 1 if capacity >= 1.0 else math.ceil(1.0 / capacity)
            scale = 1.0 / pool
            label = "recorded" if pool == 1 else f"recorded/{pool}"
            if pool > 1:
                window, start, length = _window(full, start, duration_s * scale)
                _require_requests(window, trace, length)
        else:
            window, start, length = _window(full, start, duration_s * TARGET_UTILIZATION * capacity)
            _require_requests(window, trace, length)
            capacity, light, more = slo_capacity(window, plant, length)
            probes += more
            scale = TARGET_UTILIZATION * capacity
            label = "cap70"
    return Scenario(
        key=f"{trace}|{profile.name}|{load}",
        trace=trace,
        profile=profile.name,
        load=load,
        load_label=label,
        requests=scale_load(window, scale),
        source_start_s=start,
        source_duration_s=length,
        load_scale=scale,
        capacity_load_scale=capacity,
        capacity_probes=probes,
        light_load_slo_attainment=light,
        utilization=scale / capacity,
        fluid_utilization_estimate=work_seconds_at_maximum(window, profile) * scale / length,
        trace_sha256=digest,
    )


# ---------------------------------------------------------------------- controllers
@dataclass(frozen=True)
class ControllerEntry:
    """One online controller of the scoreboard: a key, a label and a factory."""

    key: str
    label: str
    build: Callable[[], ClockController]
    control_period_s: float | None = None
    """The controller's own control period; None runs it at the scenario's."""


def scoreboard_mpc(
    plant: ServingPlant,
    workload: Sequence[Request],
    kind: str,
    *,
    control_period_s: float = 1.0,
    horizon_s: float = 10.0,
    solve_time_limit_s: float = 0.8,
) -> MPCController:
    """The MPC of config kind ``kind`` (``mpc``: the fast solver and model; ``mpc-slsqp``:
    the seed's) exactly as the daemon's simulated mode builds it
    (:func:`daemon.service.simulated_mpc`), with forecasts declared from the workload
    before the run."""
    spec = MPCControllerConfig(
        kind=kind,  # type: ignore[arg-type]
        horizon_s=horizon_s,
        solve_time_limit_s=solve_time_limit_s,
    )
    controller = simulated_mpc(spec, plant, workload, control_period_s)
    assert isinstance(controller, MPCController)
    return controller


def build_scoreboard_controllers(
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float = 1.0,
    mpc_horizon_s: float = 10.0,
    mpc_solve_time_limit_s: float = 0.8,
    fast_mpc_period_s: float | None = None,
) -> list[ControllerEntry]:
    """The online controllers of the scoreboard, in table order (the one place to swap
    one in: keys ``max_clock``, ``reactive``, ``open_loop``, ``mpc_slsqp``, ``mpc_fast``).

    The MPCs are the daemon's config kinds ``mpc-slsqp`` (the seed's SLSQP solver and
    fluid model, the reference) and ``mpc`` (the fast discrete-search solver with its
    latency model, SLO margin, burst hedge and SLO feedback), built by
    :func:`scoreboard_mpc`. The fast MPC runs every ``fast_mpc_period_s`` (default: the
    scenario's period) over the same horizon in seconds, since its solve time allows it.

    The open-loop plan (:func:`optimize_open_loop`) covers the scenario to 60 s past the
    last arrival with the MPC's output forecast; its factory solves the LP, so building it
    is its offline cost.
    """
    requests = tuple(workload)
    forecast = expected_output_tokens_forecast(requests)
    plan_horizon = math.ceil(requests[-1].arrival_time_s) + 60.0

    def open_loop() -> ClockController:
        plan = optimize_open_loop(
            requests,
            plant,
            horizon_s=plan_horizon,
            control_period_s=control_period_s,
            expected_output_tokens=forecast,
        )
        return OpenLoopClockController(plan)

    fast_period = control_period_s if fast_mpc_period_s is None else fast_mpc_period_s

    def mpc(kind: str, period: float) -> Callable[[], ClockController]:
        return lambda: scoreboard_mpc(
            plant,
            requests,
            kind,
            control_period_s=period,
            horizon_s=mpc_horizon_s,
            solve_time_limit_s=mpc_solve_time_limit_s,
        )

    return [
        ControllerEntry("max_clock", "Maximum clock", lambda: maximum_clock_controller),
        ControllerEntry("reactive", "Reactive governor", lambda: reactive_clock_controller),
        ControllerEntry("open_loop", "Open-loop plan", open_loop),
        ControllerEntry("mpc_slsqp", "MPC (SLSQP)", mpc("mpc-slsqp", control_period_s)),
        ControllerEntry("mpc_fast", "MPC (fast)", mpc("mpc", fast_period), fast_period),
    ]


LABELS = {
    "max_clock": "Maximum clock",
    "best_fixed": "Best fixed (hindsight)",
    "reactive": "Reactive governor",
    "open_loop": "Open-loop plan",
    "mpc_slsqp": "MPC (SLSQP)",
    "mpc_fast": "MPC (fast)",
    "window_oracle": "Window oracle (hindsight)",
}


class TimedController:
    """Times every call of ``inner`` (wall clock, ``perf_counter``)."""

    def __init__(self, inner: ClockController) -> None:
        self.inner = inner
        self.call_times_s: list[float] = []
        self.__name__ = str(getattr(inner, "__name__", type(inner).__name__))

    def __call__(self, observation: ServingObservation) -> float:
        start = time.perf_counter()
        value = self.inner(observation)
        self.call_times_s.append(time.perf_counter() - start)
        return value


class ProblemRecorder:
    """Records every :class:`MPCProblem` an MPC controller builds during a run.

    Wraps the instance's ``problem`` method, so it works for any controller exposing
    ``problem(observation, arrival_rate)`` (the decision points of the run, in order).
    """

    def __init__(self, controller: MPCController) -> None:
        self.problems: list[MPCProblem] = []
        original = controller.problem

        def recording(observation: ServingObservation, arrival_rate: float) -> MPCProblem:
            problem = original(observation, arrival_rate)
            self.problems.append(problem)
            return problem

        controller.problem = recording  # type: ignore[method-assign]


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


LONG_HORIZON_SPLIT = 4
"""The solver comparison also times the fast solver with each period split in this many."""


def compare_mpc_solvers(
    problems: Sequence[MPCProblem],
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float = 1.0,
    horizon_s: float = 10.0,
    fast_solver: MPCSolver | None = None,
) -> dict[str, Any]:
    """Solve every recorded problem with SLSQP and the fast solver; compare the costs.

    The problems are the SLSQP MPC's (the seed's model and SLOs), so both solvers
    minimise the same cost. Each solver runs inside its own MPC controller (the
    scoreboard's ``mpc-slsqp`` and ``mpc`` builds, no overrun limit; ``fast_solver``
    replaces the latter's solver), started from the recorded previous clock; the fast
    solver keeps its own warm start (its previous plan) across the sequence. Costs are
    ``problem.cost(plan)`` of the applied (supported-clock) plans. A point counts as no
    worse when the fast cost is at most the SLSQP cost plus ``1e-9`` relative (a failed
    SLSQP solve counts as no worse, a failed fast solve as worse).
    """
    slsqp = scoreboard_mpc(
        plant,
        workload,
        "mpc-slsqp",
        control_period_s=control_period_s,
        horizon_s=horizon_s,
        solve_time_limit_s=1e9,
    )
    fast = scoreboard_mpc(
        plant,
        workload,
        "mpc",
        control_period_s=control_period_s,
        horizon_s=horizon_s,
        solve_time_limit_s=1e9,
    )
    if fast_solver is not None:
        fast.solver = fast_solver
    slsqp_times: list[float] = []
    fast_times: list[float] = []
    excess: list[float] = []
    no_worse = 0
    failures = {"slsqp": 0, "fast": 0}
    for problem in problems:
        slsqp.current_clock = problem.previous_clock_mhz
        plan_s, _, elapsed_s = slsqp.solve(problem)
        fast.current_clock = problem.previous_clock_mhz
        plan_f, _, elapsed_f = fast.solve(problem)
        fast.last_plan = plan_f
        slsqp_times.append(elapsed_s)
        fast_times.append(elapsed_f)
        failures["slsqp"] += plan_s is None
        failures["fast"] += plan_f is None
        if plan_f is None:
            excess.append(math.inf)
            continue
        cost_f = problem.cost(plan_f)
        if plan_s is None:
            no_worse += 1
            continue
        cost_s = problem.cost(plan_s)
        relative = (cost_f - cost_s) / max(abs(cost_s), 1e-12)
        excess.append(relative)
        no_worse += relative <= 1e-9
    # The same states over the same 10 s, at four times the control rate: each problem's
    # periods split in four (arrivals spread evenly), solved by the fast solver alone.
    long_fast = scoreboard_mpc(
        plant,
        workload,
        "mpc",
        control_period_s=control_period_s / LONG_HORIZON_SPLIT,
        horizon_s=horizon_s,
        solve_time_limit_s=1e9,
    )
    if fast_solver is not None:
        long_fast.solver = fast_solver
    long_times: list[float] = []
    for problem in problems:
        split = replace(
            problem,
            control_period_s=problem.control_period_s / LONG_HORIZON_SPLIT,
            prompt_arrivals=np.repeat(
                problem.prompt_arrivals / LONG_HORIZON_SPLIT, LONG_HORIZON_SPLIT
            ),
        )
        long_fast.current_clock = problem.previous_clock_mhz
        plan_long, _, elapsed_long = long_fast.solve(split)
        long_fast.last_plan = plan_long
        long_times.append(elapsed_long)
    points = len(problems)
    worst = max(excess) if excess else None
    return {
        "points": points,
        "fraction_no_worse": (no_worse / points) if points else None,
        "worst_relative_excess": None if worst is None or math.isinf(worst) else worst,
        "fast_p50_s": _percentile(fast_times, 50),
        "fast_p99_s": _percentile(fast_times, 99),
        "slsqp_p50_s": _percentile(slsqp_times, 50),
        "slsqp_p99_s": _percentile(slsqp_times, 99),
        "solver_failures": failures,
        "horizon_steps": problems[0].horizon_steps if problems else None,
        "long_horizon_steps": (
            problems[0].horizon_steps * LONG_HORIZON_SPLIT if problems else None
        ),
        "fast_long_p50_s": _percentile(long_times, 50),
        "fast_long_p99_s": _percentile(long_times, 99),
        "rule": (
            "cost = problem.cost(applied plan); no worse when fast <= slsqp * (1 + 1e-9); "
            "worst_relative_excess = max (fast - slsqp) / |slsqp| (negative: always better)"
        ),
    }


# -------------------------------------------------------------------------- scoring
def _row(
    scenario: Scenario,
    key: str,
    result: ServingResult,
    reference: ServingResult,
    *,
    decision_times_s: Sequence[float] | None,
    offline_s: float,
    wall_s: float,
    tolerance: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    metrics = result.metrics
    reference_attainment = reference.metrics.slo_attainment
    times = list(decision_times_s) if decision_times_s is not None else []
    e_max = reference.metrics.energy_j
    return {
        "scenario": scenario.key,
        "trace": scenario.trace,
        "profile": scenario.profile,
        "load": scenario.load_label,
        "controller": key,
        "label": LABELS[key],
        "energy_j": metrics.energy_j,
        "energy_saved_fraction": (e_max - metrics.energy_j) / e_max if e_max > 0 else None,
        "energy_per_output_token_j": metrics.energy_per_output_token_j,
        "slo_attainment": metrics.slo_attainment,
        "slo_attainment_vs_max_pp": (
            None
            if metrics.slo_attainment is None or reference_attainment is None
            else 100.0 * (metrics.slo_attainment - reference_attainment)
        ),
        "holds_slo": holds_slo(metrics.slo_attainment, reference_attainment, tolerance),
        "ttft_p95_s": metrics.ttft_p95_s,
        "tpot_p95_s": metrics.tpot_p95_s,
        "power_cap_violation_s": metrics.power_cap_violation_s,
        "thermal_violation_s": metrics.thermal_violation_s,
        "censored_requests": metrics.censored_requests,
        "decisions": len(times) if decision_times_s is not None else None,
        "decision_time_p50_s": _percentile(times, 50) if decision_times_s is not None else None,
        "decision_time_p99_s": _percentile(times, 99) if decision_times_s is not None else None,
        "oracle_capture": None,
        "offline_compute_s": offline_s,
        "wall_s": wall_s,
        **(extra or {}),
    }


def run_scenario(
    trace: str, profile_name: str, load: str, config: BenchConfig, compare: bool = False
) -> dict[str, Any]:
    """Every controller, both oracles and the LP bound on one scenario.

    Returns:
        ``{"scenario": ..., "rows": [...], "comparison": ... or None}``; with
        ``compare``, "comparison" holds the SLSQP MPC's recorded problems and what
        :func:`compare_recorded` needs to solve them again.
    """
    started = time.perf_counter()
    profile = load_profile(profile_name)
    plant = ServingPlant.from_profile(profile)
    scenario = build_scenario(trace, plant, load, config.duration_s)
    requests = scenario.requests
    period = config.control_period_s

    def run(
        controller: ClockController, name: str, every_s: float | None = None
    ) -> tuple[ServingResult, float]:
        start = time.perf_counter()
        result = simulate(
            requests,
            plant,
            chunked_prefill_scheduler,
            controller,
            config.seed,
            controller_name=name,
            control_period_s=period if every_s is None else every_s,
        )
        return result, time.perf_counter() - start

    results: dict[str, ServingResult] = {}
    rows: dict[str, dict[str, Any]] = {}
    comparison: dict[str, Any] | None = None
    reference: ServingResult | None = None
    for entry in build_scoreboard_controllers(
        plant,
        requests,
        control_period_s=period,
        mpc_horizon_s=config.mpc_horizon_s,
        mpc_solve_time_limit_s=config.mpc_solve_time_limit_s,
        fast_mpc_period_s=config.fast_mpc_period_s,
    ):
        start = time.perf_counter()
        inner = entry.build()
        offline = time.perf_counter() - start
        recorder = ProblemRecorder(inner) if compare and entry.key == "mpc_slsqp" else None
        timed = TimedController(inner)
        result, wall = run(timed, entry.key, entry.control_period_s)
        extra: dict[str, Any] = {}
        times: Sequence[float] = timed.call_times_s
        diagnostics = getattr(inner, "diagnostics", None)
        report = diagnostics() if callable(diagnostics) else None
        if report is not None and hasattr(report, "solve_times_s"):
            # An MPC: its own solve times are the decision times.
            times = [float(t) for t in report.solve_times_s]
            extra = {
                "mpc_solves": int(report.solve_times_s.size),
                "mpc_fallbacks": report.fallback_count,
                "mpc_fallback_reasons": dict(report.fallback_reasons),
                "mpc_control_period_s": float(report.control_period_s),
                "mpc_horizon_steps": int(report.horizon_steps),
            }
        results[entry.key] = result
        if entry.key == "max_clock":
            reference = result
        assert reference is not None, "the maximum clock must run first"
        rows[entry.key] = _row(
            scenario,
            entry.key,
            result,
            reference,
            decision_times_s=times,
            offline_s=offline,
            wall_s=wall,
            tolerance=config.tolerance,
            extra=extra,
        )
        if recorder is not None:
            # Solved later, alone on the machine (compare_recorded), so the solve times
            # are not those of two benchmark processes sharing two cores.
            comparison = {
                "scenario": scenario.key,
                "problems": recorder.problems,
                "plant": plant,
                "requests": requests,
                "control_period_s": period,
                "horizon_s": config.mpc_horizon_s,
            }
    assert reference is not None

    start = time.perf_counter()
    best = best_fixed_clock(
        requests,
        plant,
        reference=reference,
        tolerance=config.tolerance,
        coarse_points=config.best_fixed_coarse_points,
        seed=config.seed,
        control_period_s=period,
    )
    best_s = time.perf_counter() - start
    rows["best_fixed"] = _row(
        scenario,
        "best_fixed",
        best.result,
        reference,
        decision_times_s=None,
        offline_s=best_s,
        wall_s=best_s,
        tolerance=config.tolerance,
        extra={"clock_mhz": best.clock_mhz},
    )
    start = time.perf_counter()
    oracle = window_oracle(
        requests,
        plant,
        reference=reference,
        continuation_clock_mhz=best.clock_mhz,
        continuation_result=best.result,
        window_s=config.oracle_window_s,
        lookahead_s=config.oracle_lookahead_s,
        coarse_levels=config.oracle_coarse_levels,
        neighbour_steps=config.oracle_neighbour_steps,
        tolerance=config.tolerance,
        seed=config.seed,
        control_period_s=period,
    )
    oracle_s = time.perf_counter() - start
    rows["window_oracle"] = _row(
        scenario,
        "window_oracle",
        oracle.result,
        reference,
        decision_times_s=None,
        offline_s=oracle_s,
        wall_s=oracle_s,
        tolerance=config.tolerance,
        extra={"oracle_source": oracle.source},
    )
    start = time.perf_counter()
    bound = fluid_energy_lower_bound(requests, plant, window_s=config.lp_window_s)
    bound_s = time.perf_counter() - start

    # The oracle energy: the lowest of the hindsight oracles that hold the SLO.
    holding = [
        (rows[key]["energy_j"], key)
        for key in ("best_fixed", "window_oracle")
        if rows[key]["holds_slo"]
    ]
    oracle_energy, oracle_key = min(holding) if holding else (None, None)
    e_max = reference.metrics.energy_j
    for row in rows.values():
        if oracle_energy is not None:
            row["oracle_capture"] = oracle_capture(
                e_max, row["energy_j"], oracle_energy, holds=row["holds_slo"]
            )
        row["energy_over_lp_bound"] = (
            row["energy_j"] / bound.energy_j if bound.success and bound.energy_j > 0 else None
        )
    info = {
        **scenario.describe(),
        "max_clock_slo_attainment": reference.metrics.slo_attainment,
        "oracle_energy_j": oracle_energy,
        "oracle": oracle_key,
        "lp_bound": {**bound.as_dict(), "compute_s": bound_s},
        "best_fixed": best.as_dict(),
        "window_oracle": oracle.as_dict(),
        "wall_s": time.perf_counter() - started,
    }
    return {
        "scenario": info,
        "rows": [rows[key] for key in CONTROLLER_ORDER],
        "comparison": comparison,
    }


def compare_recorded(
    recorded: dict[str, Any], say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """:func:`compare_mpc_solvers` on the decision points a scenario recorded, run in
    this process after every scenario has finished."""
    problems = recorded["problems"]
    if say is not None:
        say(f"comparing the MPC solvers on {len(problems)} decision points of "
            f"{recorded['scenario']}")
    comparison = compare_mpc_solvers(
        problems,
        recorded["plant"],
        recorded["requests"],
        control_period_s=recorded["control_period_s"],
        horizon_s=recorded["horizon_s"],
    )
    comparison["scenario"] = recorded["scenario"]
    return comparison


def _run_task(args: tuple[str, str, str, BenchConfig, bool]) -> dict[str, Any]:
    trace, profile, load, config, compare = args
    try:
        return run_scenario(trace, profile, load, config, compare)
    except (TraceError, EmptyWindowError) as error:
        return {"skipped": {"scenario": f"{trace}|{profile}|{load}", "reason": str(error)}}


def run_scoreboard(
    config: BenchConfig, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every scenario (in ``config.jobs`` processes) and assemble the payload."""
    say = progress or (lambda line: None)
    started = time.perf_counter()
    specs = config.scenario_specs()
    tasks = [
        (t, p, ld, config, f"{t}|{p}|{ld}" == config.comparison_scenario) for t, p, ld in specs
    ]
    if config.comparison_scenario and not any(task[4] for task in tasks) and tasks:
        tasks[0] = (*tasks[0][:4], True)
    # Longest first: the comparison scenario, then whole windows, the short traces last.
    order = sorted(
        range(len(tasks)), key=lambda i: (not tasks[i][4], tasks[i][0] in WHOLE_TRACE, i)
    )
    jobs = config.jobs or min(len(tasks), os.cpu_count() or 1)
    outcomes: dict[int, dict[str, Any]] = {}
    if jobs <= 1 or len(tasks) <= 1:
        for i in order:
            outcomes[i] = _run_task(tasks[i])
            say(_progress_line(outcomes[i], len(outcomes), len(tasks), started))
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {pool.submit(_run_task, tasks[i]): i for i in order}
            for future in as_completed(futures):
                outcomes[futures[future]] = future.result()
                say(_progress_line(outcomes[futures[future]], len(outcomes), len(tasks), started))
    rows: list[dict[str, Any]] = []
    scenarios: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    comparison: dict[str, Any] | None = None
    for i in range(len(tasks)):
        outcome = outcomes[i]
        if "skipped" in outcome:
            skipped.append(outcome["skipped"])
            continue
        scenarios.append(outcome["scenario"])
        rows.extend(outcome["rows"])
        if outcome["comparison"] is not None:
            comparison = compare_recorded(outcome["comparison"], say)
    elapsed = time.perf_counter() - started
    return {
        "benchmark": "controllers",
        "mode": config.mode,
        "config": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in asdict(replace(config, jobs=jobs)).items()
        },
        "definitions": DEFINITIONS,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "wall_s": elapsed,
        "scenarios": scenarios,
        "skipped": skipped,
        "rows": rows,
        "summary": summarize(rows),
        "mpc_solver_comparison": comparison,
    }


DEFINITIONS = {
    "holds_slo": (
        f"SLO attainment >= the maximum clock's minus {100 * SLO_TOLERANCE:g} percentage point"
    ),
    "oracle_capture": (
        "(E_max - E) / (E_max - E_oracle), E_oracle the lowest energy of the hindsight "
        "oracles (best fixed, window) that hold the SLO; null when the controller does not "
        "hold the SLO or the oracle saves nothing"
    ),
    "decision_time": (
        "wall time per controller call (perf_counter); MPC: its own solve times "
        "(diagnostics); oracles: null (offline search, see offline_compute_s)"
    ),
    "utilization": (
        "load multiplier over the SLO capacity multiplier: the highest multiplier at which "
        "the maximum clock's SLO attainment is within 1 point of its light-load attainment"
    ),
    "fluid_utilization_estimate": (
        "(sum prompt / prefill_rate(f_max) + sum (output - 1) / decode_rate(f_max)) / "
        "scenario duration"
    ),
    "lp_bound": "fluid LP lower bound on the energy of any run serving all the work",
}


def _progress_line(outcome: dict[str, Any], done: int, total: int, started: float) -> str:
    elapsed = time.perf_counter() - started
    if "skipped" in outcome:
        return f"[{done}/{total} {elapsed:6.1f}s] skipped {outcome['skipped']['scenario']}"
    info = outcome["scenario"]
    return f"[{done}/{total} {elapsed:6.1f}s] {info['key']} ({info['wall_s']:.1f}s)"


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per controller across scenarios: how often it holds the SLO, its median energy
    saving and capture, and its worst p99 decision time."""
    out = []
    for key in CONTROLLER_ORDER:
        mine = [r for r in rows if r["controller"] == key]
        if not mine:
            continue
        captures = [r["oracle_capture"] for r in mine if r["oracle_capture"] is not None]
        saved = [r["energy_saved_fraction"] for r in mine if r["energy_saved_fraction"] is not None]
        p99 = [r["decision_time_p99_s"] for r in mine if r["decision_time_p99_s"] is not None]
        out.append(
            {
                "controller": key,
                "label": LABELS[key],
                "scenarios": len(mine),
                "holds_slo": sum(bool(r["holds_slo"]) for r in mine),
                "median_energy_saved_fraction": float(np.median(saved)) if saved else None,
                "median_oracle_capture": float(np.median(captures)) if captures else None,
                "min_oracle_capture": float(min(captures)) if captures else None,
                "max_decision_time_p99_s": float(max(p99)) if p99 else None,
            }
        )
    return out


# ----------------------------------------------------------------------------- output
def _fmt(value: Any, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float | int):
        return f"{value * scale:.{digits}f}{suffix}"
    return str(value)


def markdown(payload: dict[str, Any]) -> str:
    """The scoreboard as markdown: settings, per-scenario tables, summary, comparison."""
    lines = [
        f"# Controller scoreboard ({payload['mode']})",
        "",
        f"Wall time {payload['wall_s']:.1f} s on {payload['machine']['cpus']} CPUs, "
        f"{payload['config']['jobs']} worker process(es). Definitions: `docs/scoreboard.md`.",
        "Energy saved is relative to the maximum clock; SLO holds when attainment is within "
        "1 point of the maximum clock's; capture = (E_max - E) / (E_max - E_oracle).",
        f"Control period {payload['config']['control_period_s']:g} s (the fast MPC "
        f"{payload['config'].get('fast_mpc_period_s', payload['config']['control_period_s']):g}"
        f" s); MPC horizon {payload['config']['mpc_horizon_s']:g} s.",
        "",
    ]
    if payload["skipped"]:
        lines.append(
            "Skipped: " + "; ".join(f"{s['scenario']} ({s['reason']})" for s in payload["skipped"])
        )
        lines.append("")
    lines += [
        "## Summary per controller",
        "",
        "| controller | scenarios | holds SLO | median saved | median capture | "
        "min capture | worst p99 decision |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in payload["summary"]:
        lines.append(
            f"| {s['label']} | {s['scenarios']} | {s['holds_slo']} | "
            f"{_fmt(s['median_energy_saved_fraction'], 100, 1, '%')} | "
            f"{_fmt(s['median_oracle_capture'], 1, 2)} | {_fmt(s['min_oracle_capture'], 1, 2)} | "
            f"{_fmt(s['max_decision_time_p99_s'], 1000, 2, ' ms')} |"
        )
    comparison = payload.get("mpc_solver_comparison")
    if comparison:
        lines += [
            "",
            "## MPC solvers on the same decision points",
            "",
            f"Scenario `{comparison['scenario']}`, {comparison['points']} decision points, "
            f"{comparison['horizon_steps']}-step horizon: the fast solver is no worse on "
            f"{_fmt(comparison['fraction_no_worse'], 100, 1, '%')} of points, worst relative "
            f"excess {_fmt(comparison['worst_relative_excess'], 100, 3, '%')}; p99 solve "
            f"{_fmt(comparison['fast_p99_s'], 1000, 2, ' ms')} (fast) vs "
            f"{_fmt(comparison['slsqp_p99_s'], 1000, 2, ' ms')} (SLSQP); with each period "
            f"split in {LONG_HORIZON_SPLIT} ({comparison.get('long_horizon_steps')} steps), "
            f"fast p99 {_fmt(comparison.get('fast_long_p99_s'), 1000, 2, ' ms')}.",
        ]
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for row in payload["rows"]:
        by_scenario.setdefault(row["scenario"], []).append(row)
    lines += [
        "",
        "## Energy saved per scenario",
        "",
        "Energy saved vs the maximum clock, then capture in brackets; a dash after the "
        "saving marks a run that does not hold the SLO. Utilisation is the load over the "
        "maximum clock's SLO capacity; A_max the maximum clock's SLO attainment; the last "
        "column the fluid LP bound over the oracle energy.",
        "",
        "| trace | profile | load | util | A_max | "
        + " | ".join(LABELS[key] for key in CONTROLLER_ORDER[1:])
        + " | LP / oracle |",
        "| --- | --- | --- | ---: | ---: | "
        + " | ".join("---:" for _ in CONTROLLER_ORDER[1:])
        + " | ---: |",
    ]
    for info in payload["scenarios"]:
        mine = {row["controller"]: row for row in by_scenario.get(info["key"], [])}
        cells = []
        for key in CONTROLLER_ORDER[1:]:
            row = mine.get(key)
            if row is None:
                cells.append("")
                continue
            saved = _fmt(row["energy_saved_fraction"], 100, 1, "%")
            if not row["holds_slo"]:
                cells.append(f"{saved} -")
            elif row["oracle_capture"] is None:
                cells.append(saved)
            else:
                cells.append(f"{saved} ({row['oracle_capture']:.2f})")
        bound = info["lp_bound"]["energy_j"]
        ratio = (
            _fmt(bound / info["oracle_energy_j"], 1, 2)
            if bound is not None and info["oracle_energy_j"]
            else "-"
        )
        lines.append(
            f"| {info['trace']} | {info['profile']} | {info['load_label']} | "
            f"{_fmt(info['utilization'], 100, 0, '%')} | "
            f"{_fmt(info['max_clock_slo_attainment'], 100, 1, '%')} | "
            + " | ".join(cells)
            + f" | {ratio} |"
        )
    lines += ["", "## Scenarios", ""]
    for info in payload["scenarios"]:
        bound = info["lp_bound"]
        lines += [
            f"### {info['trace']} / {info['profile']} / {info['load_label']}",
            "",
            f"{info['requests']} requests over {info['scenario_duration_s']:.0f} s "
            f"(source {info['source_start_s']:.0f} s + {info['source_duration_s']:.0f} s, "
            f"load scale {info['load_scale']:.3g}); utilisation "
            f"{100 * info['utilization']:.0f}% of maximum-clock SLO capacity (fluid estimate "
            f"{100 * info['fluid_utilization_estimate']:.0f}%), maximum clock's SLO attainment "
            f"{_fmt(info['max_clock_slo_attainment'], 100, 2, '%')}. Best fixed clock "
            f"{info['best_fixed']['clock_mhz']:g} MHz ({info['best_fixed']['simulations']} "
            f"runs); window oracle {info['window_oracle']['source']}; fluid LP bound "
            f"{_fmt(bound['energy_j'], 1e-3, 1, ' kJ')}.",
            "",
            "| controller | energy | saved | J/token | SLO | holds | TTFT p95 | TPOT p95 | "
            "cap / thermal | decision p50 / p99 | capture |",
            "| --- | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in by_scenario.get(info["key"], []):
            decision = (
                "offline"
                if row["decision_time_p50_s"] is None
                else f"{_fmt(row['decision_time_p50_s'], 1000, 2)} / "
                f"{_fmt(row['decision_time_p99_s'], 1000, 2)} ms"
            )
            lines.append(
                f"| {row['label']} | {_fmt(row['energy_j'], 1e-3, 1, ' kJ')} | "
                f"{_fmt(row['energy_saved_fraction'], 100, 1, '%')} | "
                f"{_fmt(row['energy_per_output_token_j'], 1, 3)} | "
                f"{_fmt(row['slo_attainment'], 100, 2, '%')} | {_fmt(row['holds_slo'])} | "
                f"{_fmt(row['ttft_p95_s'], 1, 3, ' s')} | "
                f"{_fmt(row['tpot_p95_s'], 1000, 1, ' ms')} | "
                f"{_fmt(row['power_cap_violation_s'], 1, 1)} / "
                f"{_fmt(row['thermal_violation_s'], 1, 1)} s | {decision} | "
                f"{_fmt(row['oracle_capture'], 1, 2)} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def write_plot(payload: dict[str, Any], path: Path) -> None:
    """PNG: energy saved vs SLO attainment (relative to the maximum clock), one point per
    controller and scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = dict(zip(CONTROLLER_ORDER, "os^vDPX", strict=True))
    fig, ax = plt.subplots(figsize=(9, 6))
    for index, key in enumerate(CONTROLLER_ORDER):
        mine = [
            r
            for r in payload["rows"]
            if r["controller"] == key
            and r["slo_attainment_vs_max_pp"] is not None
            and r["energy_saved_fraction"] is not None
        ]
        if not mine:
            continue
        ax.scatter(
            [r["slo_attainment_vs_max_pp"] for r in mine],
            [100.0 * r["energy_saved_fraction"] for r in mine],
            label=LABELS[key],
            marker=markers[key],
            color=f"C{index}",
            alpha=0.8,
            s=36,
        )
    shown = [
        r["slo_attainment_vs_max_pp"]
        for r in payload["rows"]
        if r["slo_attainment_vs_max_pp"] is not None
    ]
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(min([-2.0, *shown]) * 1.2, max([0.5, *shown]) * 1.5)
    ax.axvline(-100.0 * SLO_TOLERANCE, color="k", ls="--", lw=0.8)
    ax.text(
        -100.0 * SLO_TOLERANCE, ax.get_ylim()[1], " SLO holds to the right", va="top", fontsize=8
    )
    ax.set_xlabel("SLO attainment minus the maximum clock's (percentage points, symlog)")
    ax.set_ylabel("energy saved vs the maximum clock (%)")
    ax.set_title(f"gpugov controller scoreboard ({payload['mode']}): one point per scenario")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _strict(value: Any) -> Any:
    """Replace non-finite floats by None so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    if isinstance(value, np.generic):
        return _strict(value.item())
    return value


def write_outputs(payload: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``scoreboard.json``, ``scoreboard.md`` and ``scoreboard.png`` to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "scoreboard.json",
        "md": out_dir / "scoreboard.md",
        "png": out_dir / "scoreboard.png",
    }
    paths["json"].write_text(json.dumps(_strict(payload), indent=1, allow_nan=False) + "\n")
    paths["md"].write_text(markdown(payload))
    write_plot(payload, paths["png"])
    return paths


def short_table(payload: dict[str, Any]) -> str:
    """The summary printed on stdout."""
    lines = [
        f"{'controller':<26} {'holds':>7} {'saved':>7} {'capture':>8} {'min cap':>8} "
        f"{'p99 dec':>10}"
    ]
    for s in payload["summary"]:
        lines.append(
            f"{s['label']:<26} {s['holds_slo']:>3}/{s['scenarios']:<3} "
            f"{_fmt(s['median_energy_saved_fraction'], 100, 1, '%'):>7} "
            f"{_fmt(s['median_oracle_capture'], 1, 2):>8} {_fmt(s['min_oracle_capture'], 1, 2):>8} "
            f"{_fmt(s['max_decision_time_p99_s'], 1000, 2, ' ms'):>10}"
        )
    comparison = payload.get("mpc_solver_comparison")
    if comparison:
        lines.append(
            f"MPC solvers on {comparison['points']} points: fast no worse on "
            f"{_fmt(comparison['fraction_no_worse'], 100, 1, '%')}, worst excess "
            f"{_fmt(comparison['worst_relative_excess'], 100, 3, '%')}, p99 "
            f"{_fmt(comparison['fast_p99_s'], 1000, 2, ' ms')} fast vs "
            f"{_fmt(comparison['slsqp_p99_s'], 1000, 2, ' ms')} SLSQP; "
            f"{comparison.get('long_horizon_steps')}-step fast p99 "
            f"{_fmt(comparison.get('fast_long_p99_s'), 1000, 2, ' ms')}"
        )
    lines.append(
        f"{len(payload['scenarios'])} scenarios, {len(payload['skipped'])} skipped, "
        f"wall {payload['wall_s']:.1f} s"
    )
    return "\n".join(lines)


def expand_profiles(names: Sequence[str]) -> list[str]:
    """``--profiles`` values with ``all`` replaced by every bundled profile (the zoo)."""
    out: list[str] = []
    for name in names:
        expanded = [row["name"] for row in list_bundled_profiles()] if name == "all" else [name]
        out += [n for n in expanded if n not in out]
    return out


def config_for(
    *,
    quick: bool = False,
    tiny: bool = False,
    traces: Sequence[str] | None = None,
    profiles: Sequence[str] | None = None,
    loads: Sequence[str] | None = None,
    duration_s: float | None = None,
    jobs: int | None = None,
) -> BenchConfig:
    """The full, ``--quick`` or hidden ``--tiny`` configuration with overrides."""
    config = TINY if tiny else QUICK if quick else FULL
    changes: dict[str, Any] = {}
    if traces:
        changes["traces"] = tuple(traces)
    if profiles:
        profiles = expand_profiles(profiles)
        for name in profiles:
            load_profile(name)  # ProfileError (a ValueError) names a bad profile now
        changes["profiles"] = tuple(profiles)
    if loads:
        unknown = sorted(set(loads) - set(LOADS))
        if unknown:
            raise ValueError(f"--loads: unknown load(s) {unknown}; choose from {list(LOADS)}")
        changes["loads"] = tuple(loads)
    if duration_s is not None:
        if not math.isfinite(duration_s) or duration_s <= 0.0:
            raise ValueError(f"--duration must be positive, got {duration_s!r}")
        changes["duration_s"] = float(duration_s)
    if jobs is not None:
        if jobs < 0:
            raise ValueError(f"--jobs must be >= 0, got {jobs}")
        changes["jobs"] = jobs
    return replace(config, **changes)


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scoreboard's command-line options (shared by this script and the CLI)."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="bundled slice + Azure code, one profile, 120 s windows",
    )
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out",
        default=str(DEFAULT_OUT),
        metavar="DIR",
        help=f"output directory (default {_shown(DEFAULT_OUT)})",
    )
    parser.add_argument(
        "--traces",
        nargs="+",
        metavar="NAME",
        default=None,
        help=f"trace names (default: {' '.join(TRACES)})",
    )
    parser.add_argument(
        "--profiles",
        nargs="+",
        metavar="NAME",
        default=None,
        help="bundled profile names or manifest paths, or 'all' for the whole zoo "
        f"(default: {' '.join(PROFILES)})",
    )
    parser.add_argument(
        "--loads",
        nargs="+",
        metavar="LOAD",
        default=None,
        help=f"loads among {' '.join(LOADS)} (default: both)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds of arrivals per scenario (default 600, quick 120)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="worker processes (default: one per CPU)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run the scoreboard from parsed arguments; print the summary and the paths."""
    config = config_for(
        quick=args.quick,
        tiny=args.tiny,
        traces=args.traces,
        profiles=args.profiles,
        loads=args.loads,
        duration_s=args.duration,
        jobs=args.jobs,
    )
    payload = run_scoreboard(config, progress=lambda line: print(line, file=sys.stderr))
    paths = write_outputs(payload, Path(args.out))
    print(short_table(payload))
    for path in paths.values():
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python study/scoreboard.py``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


__all__ = [
    "FULL",
    "QUICK",
    "TINY",
    "BenchConfig",
    "ControllerEntry",
    "Scenario",
    "build_scenario",
    "build_scoreboard_controllers",
    "compare_mpc_solvers",
    "config_for",
    "run_scenario",
    "run_scoreboard",
    "scoreboard_mpc",
    "slo_capacity",
    "write_outputs",
]

if __name__ == "__main__":
    raise SystemExit(main())
