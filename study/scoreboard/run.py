"""Controller scoreboard: every controller and oracle on real traces, profiles and loads.

For each scenario (trace window x bundled profile x load) it runs the maximum clock, the
best fixed clock in hindsight, the reactive governor, the open-loop plan, the SLSQP MPC,
the fast (discrete-search) MPC and the window oracle on the detailed plant, plus the
fluid LP lower bound on energy, and reports energy, J/token, SLO attainment, p95 TTFT and
TPOT, the seconds above the board limit and the thermal limit, the seconds above the power
cap a row requested, decision times and oracle capture. It
also compares the two MPC solvers on every decision point of one recorded closed-loop
run. See ``docs/scoreboard.md`` for every definition; ``gpugov bench controllers`` runs
the same code. This module runs the scenarios; the command line is in ``command``, the
configuration and scenarios in ``scenarios``, the controllers in ``controllers``, the MPC
solver comparison in ``solvers`` and the outputs in ``report``.

    .venv/bin/python -m gpugov.study.scoreboard [--quick] [--out DIR] [--jobs N]

Writes ``DIR/scoreboard.json``, ``DIR/scoreboard.md`` and ``DIR/scoreboard.png``
(default ``bench/results/controllers/``) and prints a short summary; ``--report DIR2``
also writes the citable benchmark report (``publish``).

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

import functools
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from gpugov import __version__
from gpugov.controllers.contract import Diagnosable
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.oracles import (
    BestFixedClock,
    WindowOracle,
    best_fixed_clock,
    fluid_energy_lower_bound,
    holds_slo,
    oracle_capture,
    window_oracle,
)
from gpugov.daemon.decide import close_controller
from gpugov.daemon.errors import one_line
from gpugov.daemon.safety import invalid_decisions
from gpugov.daemon.simulated import observation_view
from gpugov.plant import PerformanceProfile, ServingPlant, ServingResult, simulate
from gpugov.plant.result import ServingMetrics
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.synthetic_profiles import resolve_profile
from gpugov.plant.types import ClockController, Request
from gpugov.plant.workload import (
    TraceError,
)
from gpugov.study.online_eval import (
    WARMUP_S,
    capture_after,
    model_error_by_clock,
    summarize_model_error,
)
from gpugov.study.provenance import software_versions
from gpugov.study.runners import CellProgress, RunnerSpec, map_cells, run_isolated
from gpugov.study.scoreboard.controllers import (
    ControllerEntry,
    bench_controllers,
    build_scoreboard_controllers,
    scoreboard_mpc,
)
from gpugov.study.scoreboard.publish import request_stats
from gpugov.study.scoreboard.report import (
    DEFINITIONS,
    head_to_head,
    summarize,
    write_outputs,
)
from gpugov.study.scoreboard.scenarios import (
    CONTROLLER_ORDER,
    FULL,
    QUICK,
    TINY,
    WHOLE_TRACE,
    BenchConfig,
    EmptyWindowError,
    ProbeTooLongError,
    Scenario,
    ScenarioSkip,
    _full_trace,
    build_scenario,
    expected_scenario_duration_s,
    label_of,
    row_order,
    slo_capacity,
)
from gpugov.study.scoreboard.solvers import (
    ProblemRecorder,
    TimedController,
    _percentile,
    compare_mpc_solvers,
    compare_recorded,
)
from gpugov.study.scoreboard.windows import (
    summarize_windows,
    window_fields,
    window_overlaps,
    window_starts,
)

PROGRESS_EVERY_S = 10.0
"""Simulated seconds between a run's progress reports (:func:`run_scenario`)."""

Task = tuple[str, str, str, BenchConfig, bool, float | None]
"""(trace, profile, load, config, compare, window start or None)."""


def scenario_progress_units(config: BenchConfig, scenario_s: float) -> float:
    """One scenario's share of the progress line, in simulated seconds: its own length
    ``scenario_s`` (:attr:`Scenario.scenario_duration_s`, a short trace's shorter than
    ``config.duration_s``) for each controller and oracle of the board."""
    return scenario_s * (len(CONTROLLER_ORDER) + len(config.outside_controllers))


def expected_progress_units(task: Task, shared: Mapping[str, Any]) -> float:
    """:func:`scenario_progress_units` of ``task`` before its scenario is built, from its
    loaded trace and profile in ``shared`` (:func:`expected_scenario_duration_s`)."""
    trace, profile, load, config, _, start = task
    return scenario_progress_units(
        config,
        expected_scenario_duration_s(
            trace,
            shared[f"trace:{trace}"][0],
            shared[f"profile:{profile}"],
            load,
            config.duration_s,
            start_s=start,
        ),
    )


def outcome_progress_units(outcome: Mapping[str, Any], config: BenchConfig) -> float:
    """:func:`scenario_progress_units` of a finished scenario's ``outcome``: its real
    length's, 0 for one skipped (nothing was simulated)."""
    if "skipped" in outcome:
        return 0.0
    return scenario_progress_units(config, float(outcome["scenario"]["scenario_duration_s"]))


# -------------------------------------------------------------------------- scoring
def slo_energy_fields(
    metrics: ServingMetrics, reference: ServingMetrics, tolerance: float
) -> dict[str, Any]:
    """A row's energy and SLO fields against the maximum clock's ``reference`` metrics:
    the saving, J per output token, attainment and its change, the SLO condition, the
    latency percentiles and the censored requests (shared by every scoreboard table)."""
    reference_attainment = reference.slo_attainment
    e_max = reference.energy_j
    return {
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
        "censored_requests": metrics.censored_requests,
    }


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
    times = list(decision_times_s) if decision_times_s is not None else []
    fields = slo_energy_fields(metrics, reference.metrics, tolerance)
    censored = fields.pop("censored_requests")
    return {
        "scenario": scenario.key,
        "trace": scenario.trace,
        "profile": scenario.profile,
        "load": scenario.load_label,
        "controller": key,
        "label": label_of(key),
        **fields,
        "power_cap_violation_s": metrics.power_cap_violation_s,
        "thermal_violation_s": metrics.thermal_violation_s,
        "cap_overshoot_s": metrics.cap_overshoot_s,
        "censored_requests": censored,
        "decisions": len(times) if decision_times_s is not None else None,
        "decision_time_p50_s": _percentile(times, 50) if decision_times_s is not None else None,
        "decision_time_p99_s": _percentile(times, 99) if decision_times_s is not None else None,
        "oracle_capture": None,
        "offline_compute_s": offline_s,
        "wall_s": wall_s,
        # Energy per request and TPOT deadlines for --report (publish.py): the request
        # records stay in the worker, so the figures are taken here.
        "request_stats": request_stats(result),
        **(extra or {}),
    }


def scoreboard_best_fixed(
    requests: Sequence[Request], plant: ServingPlant, reference: ServingResult, config: BenchConfig
) -> BestFixedClock:
    """The best fixed clock in hindsight as the scoreboard searches it (``config``'s
    tolerance, grid, seed and period) against the maximum clock's ``reference`` run."""
    return best_fixed_clock(
        requests,
        plant,
        reference=reference,
        tolerance=config.tolerance,
        coarse_points=config.best_fixed_coarse_points,
        seed=config.seed,
        control_period_s=config.control_period_s,
    )


def scoreboard_window_oracle(
    requests: Sequence[Request],
    plant: ServingPlant,
    reference: ServingResult,
    best: BestFixedClock,
    config: BenchConfig,
) -> WindowOracle:
    """The window schedule in hindsight as the scoreboard searches it, continuing at the
    best fixed clock ``best`` (``config``'s window, lookahead, grid, tolerance and seed)."""
    return window_oracle(
        requests,
        plant,
        reference=reference,
        continuation_clock_mhz=best.clock_mhz,
        continuation_result=best.result,
        **config.oracle_search,
    )


def scenario_warmup_s(scenario: Scenario) -> float:
    """The warm-up ``oracle_capture_after_warmup`` leaves out: :data:`WARMUP_S`, at most
    half the scenario's own length (:attr:`Scenario.scenario_duration_s`), not of
    ``--duration``."""
    return min(WARMUP_S, 0.5 * scenario.scenario_duration_s)


def run_scenario(
    trace: str,
    profile_name: str,
    load: str,
    config: BenchConfig,
    compare: bool = False,
    *,
    profile: PerformanceProfile | None = None,
    full_trace: tuple[tuple[Request, ...], str] | None = None,
    start_s: float | None = None,
    on_progress: Callable[[float], None] | None = None,
    on_scenario: Callable[[Scenario], None] | None = None,
) -> dict[str, Any]:
    """Every controller, both oracles and the LP bound on one scenario.

    ``profile`` and ``full_trace`` pass the loaded inputs by value (a worker on another
    machine has no path to them); without them they are loaded by name here. ``start_s``
    runs a held-out window starting there (``--windows``; its rows then carry the
    window fields of :func:`window_fields`). ``on_progress`` receives the fraction of the
    scenario's runs done, rising to 1: each controller's run and each oracle's search is
    an equal share, a run's share counted every :data:`PROGRESS_EVERY_S` simulated
    seconds against the window's last arrival, a search's when it ends (the capacity
    calibration before the runs counts nothing). It only reads the simulated time: the
    results are the same with it or without. ``on_scenario`` receives the scenario once
    it is built, before its runs (its real length: :func:`scenario_progress_units`).

    Returns:
        ``{"scenario": ..., "rows": [...], "comparison": ... or None}``; with
        ``compare``, "comparison" holds the SLSQP MPC's recorded problems and what
        :func:`compare_recorded` needs to solve them again.
    """
    started = time.perf_counter()
    profile = resolve_profile(profile_name) if profile is None else profile
    plant = ServingPlant.from_profile(profile)
    scenario = build_scenario(trace, plant, load, config.duration_s, full_trace, start_s=start_s)
    if on_scenario is not None:
        on_scenario(scenario)
    requests = scenario.requests
    period = config.control_period_s
    entries = bench_controllers(plant, requests, config)
    shares = len(entries) + 2  # every controller's run, the best fixed clock, the oracle
    span_s = max(requests[-1].arrival_time_s if requests else 0.0, 1e-9)

    def advance(runs_done: int, time_s: float = 0.0) -> None:
        """Tell ``on_progress`` that ``runs_done`` runs and ``time_s`` simulated seconds
        of the next are done."""
        if on_progress is not None:
            on_progress(min((runs_done + min(time_s / span_s, 1.0)) / shares, 1.0))

    def run(
        controller: ClockController, name: str, every_s: float | None = None, position: int = 0
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
            view=observation_view(config.engine_view, config.slo_target),
            on_progress=(
                None if on_progress is None else lambda time_s, _: advance(position, time_s)
            ),
            progress_every_s=PROGRESS_EVERY_S,
        )
        return result, time.perf_counter() - start

    results: dict[str, ServingResult] = {}
    rows: dict[str, dict[str, Any]] = {}
    failed: list[dict[str, Any]] = []
    comparison: dict[str, Any] | None = None
    reference: ServingResult | None = None

    def measure(
        entry: ControllerEntry, position: int
    ) -> tuple[ServingResult, float, float, list[float], dict[str, Any], Any]:
        """``entry``'s controller built and run on the scenario, then closed: its result,
        offline and wall seconds, decision times, extra row fields and (the SLSQP MPC of
        the comparison scenario) its recorded problems."""
        start = time.perf_counter()
        chain = entry.build()
        offline = time.perf_counter() - start
        inner = chain.unwrapped
        recorder = (
            ProblemRecorder(inner)  # type: ignore[arg-type]
            if compare and entry.key == "mpc-slsqp"
            else None
        )
        timed = TimedController(chain)
        own_period = entry.control_period_s or period  # the row's own, else the board's
        try:
            result, wall = run(timed, entry.key, own_period, position)
        finally:
            close_controller(chain, f"{scenario.key}: controller {entry.key!r}")
        # Decisions that were not a clock (the chain ran the top clock instead).
        extra: dict[str, Any] = {
            "invalid_decisions": invalid_decisions(chain),
            # The period it decided at, which the board's line of settings says per row.
            "control_period_s": own_period,
        }
        times = [float(t) for t in timed.call_times_s]
        report = inner.diagnostics() if isinstance(inner, Diagnosable) else None
        if report is not None:
            # An MPC: its own solve times are the decision times.
            times = [float(t) for t in report.solve_times_s]
            extra |= {
                "mpc_solves": int(report.solve_times_s.size),
                "mpc_fallbacks": report.fallback_count,
                "mpc_fallback_reasons": dict(report.fallback_reasons),
                "mpc_control_period_s": float(report.control_period_s),
                "mpc_horizon_steps": int(report.horizon_steps),
            }
        if isinstance(inner, OnlineMPCController):
            errors = model_error_by_clock(inner, profile, result)
            extra["model_error_by_clock"] = errors
            extra["model_error"] = summarize_model_error(errors)
            extra["online_status"] = inner.status()
        return result, offline, wall, times, extra, recorder

    for position, entry in enumerate(entries):
        advance(position)
        try:
            if entry.outside:
                # Another package's code runs in a child process: one that ends its
                # process costs its row, and its module's state does not carry over to
                # the next scenario (which would follow --jobs and the scenario order).
                measured = run_isolated(
                    functools.partial(measure, entry, position), f"controller {entry.key!r}"
                )
            else:
                measured = measure(entry, position)
        except Exception as error:  # another package's row: its failure costs it alone
            if not entry.outside:
                raise
            failed.append(failed_row(scenario.key, entry.key, error))
            continue
        result, offline, wall, times, extra, recorder = measured
        results[entry.key] = result
        if entry.key == "max":
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

    advance(len(entries))
    start = time.perf_counter()
    best = scoreboard_best_fixed(requests, plant, reference, config)
    best_s = time.perf_counter() - start
    advance(len(entries) + 1)
    rows["best-fixed"] = _row(
        scenario,
        "best-fixed",
        best.result,
        reference,
        decision_times_s=None,
        offline_s=best_s,
        wall_s=best_s,
        tolerance=config.tolerance,
        extra={"clock_mhz": best.clock_mhz},
    )
    start = time.perf_counter()
    oracle = scoreboard_window_oracle(requests, plant, reference, best, config)
    oracle_s = time.perf_counter() - start
    advance(shares)
    rows["window-oracle"] = _row(
        scenario,
        "window-oracle",
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
        for key in ("best-fixed", "window-oracle")
        if rows[key]["holds_slo"]
    ]
    oracle_energy, oracle_key = min(holding) if holding else (None, None)
    e_max = reference.metrics.energy_j
    # Capture over what follows the warm-up (5 minutes, at most half of a short scenario).
    warmup = scenario_warmup_s(scenario)
    oracle_result = {"best-fixed": best.result, "window-oracle": oracle.result}.get(
        oracle_key or ""
    )
    results["best-fixed"], results["window-oracle"] = best.result, oracle.result
    for key, row in rows.items():
        row["warmup_s"] = warmup
        row["oracle_capture_after_warmup"] = capture_after(
            results[key], reference, oracle_result, warmup, holds=bool(row["holds_slo"])
        )
    if start_s is not None:
        for key, fields in window_fields(results, reference, warmup).items():
            rows[key].update({"window_start_s": start_s, **fields})
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
    if start_s is not None:
        info["window_start_s"] = start_s
    return {
        "scenario": info,
        "rows": [rows[key] for key in row_order(rows)],
        "failed_rows": failed,
        "comparison": comparison,
    }


def failed_row(scenario: str, controller: str, error: BaseException) -> dict[str, Any]:
    """An outside controller's row that did not run on a scenario: where, and its error in
    one line (a build error, or the run's ``controller ... raised at t=...``)."""
    return {"scenario": scenario, "controller": controller, "error": one_line(error)}


def drop_failed_controllers(
    rows: Sequence[dict[str, Any]], failed: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``rows`` without those of a controller that failed on some scenario: a summary over
    the scenarios it survived would compare it on another set than the other rows."""
    gone = {entry["controller"] for entry in failed}
    return [row for row in rows if row["controller"] not in gone]


def _task_label(task: Task) -> str:
    """A task's scenario name: ``trace|profile|load``, ``@START`` for a held-out window."""
    label = "|".join(task[:3])
    return label if task[5] is None else f"{label}@{task[5]:g}"


def _run_task(
    args: Task, shared: Mapping[str, Any], progress_key: str | None = None
) -> dict[str, Any]:
    """One scenario as a runner task; the profile and the trace come in ``shared``, and
    the :class:`CellProgress` its runs report to (simulated seconds, in the slot
    ``progress_key``), when there is one, with the one (``sizes``) its real length's
    units go to once the scenario is built."""
    trace, profile, load, config, compare, start = args
    progress: CellProgress | None = shared.get("progress")
    sizes: CellProgress | None = shared.get("sizes")
    on_progress: Callable[[float], None] | None = None
    on_scenario: Callable[[Scenario], None] | None = None
    if progress is not None and progress_key is not None:
        key = progress_key
        units = 0.0

        def on_scenario(scenario: Scenario) -> None:
            nonlocal units
            units = scenario_progress_units(config, scenario.scenario_duration_s)
            if sizes is not None:
                sizes.report(key, units)

        def on_progress(fraction: float) -> None:
            progress.report(key, fraction * units)

    try:
        return run_scenario(
            trace,
            profile,
            load,
            config,
            compare,
            profile=shared[f"profile:{profile}"],
            full_trace=shared[f"trace:{trace}"],
            start_s=start,
            on_progress=on_progress,
            on_scenario=on_scenario,
        )
    except (TraceError, ScenarioSkip) as error:
        return {"skipped": {"scenario": _task_label(args), "reason": str(error)}}


def _run_cell(cell: tuple[str, Task], shared: Mapping[str, Any]) -> dict[str, Any]:
    """A runner cell ``(progress slot, task)``: :func:`_run_task`."""
    return _run_task(cell[1], shared, cell[0])


def _shared_inputs(config: BenchConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The profiles and full traces every scenario reads, loaded here (the driver) and
    handed to the workers by value; traces that fail to load map to their error."""
    shared: dict[str, Any] = {f"profile:{name}": resolve_profile(name) for name in config.profiles}
    failed: dict[str, str] = {}
    for name in config.traces:
        try:
            shared[f"trace:{name}"] = _full_trace(name)
        except TraceError as error:
            failed[name] = str(error)
    return shared, failed


def _window_starts(
    config: BenchConfig, shared: Mapping[str, Any], failed: Mapping[str, str]
) -> dict[str, tuple[float | None, ...]]:
    """Per trace, the starts of its windows: None (the trace's own scoreboard window)
    without ``--windows``; a trace that did not load gets one None per window, each
    skipped with the reason."""
    out: dict[str, tuple[float | None, ...]] = {}
    for trace in config.traces:
        if config.windows == 1 or trace in failed:
            out[trace] = (None,) * config.windows
        else:
            requests = shared[f"trace:{trace}"][0]
            out[trace] = window_starts(trace, requests, config.duration_s, config.windows)
    return out


def run_scoreboard(
    config: BenchConfig,
    progress: Callable[[str], None] | None = None,
    runner: RunnerSpec | None = None,
    on_progress: Callable[[float, float], None] | None = None,
) -> dict[str, Any]:
    """Run every scenario (in ``config.jobs`` processes, or as Ray tasks when ``runner``
    says so) and assemble the payload.

    ``progress`` receives a line per scenario done (``[n/N] KEY (wall s)``, no ETA) and
    per lost worker; ``on_progress`` the simulated seconds done so far over every scenario
    and their total while they run: every :data:`PROGRESS_EVERY_S` simulated seconds of
    a run in this process or a local pool's worker (shared memory the workers inherit), a
    Ray task's when it ends. The total is :func:`scenario_progress_units` of each
    scenario's real length, guessed (:func:`expected_progress_units`) until its worker has
    built it (a Ray task's: until it ends); a skipped scenario counts nothing."""
    say = progress or (lambda line: None)
    started = time.perf_counter()
    specs = config.scenario_specs()
    shared, failed = _shared_inputs(config)
    starts = _window_starts(config, shared, failed)
    tasks: list[Task] = [
        (t, p, ld, config, k == 0 and f"{t}|{p}|{ld}" == config.comparison_scenario, start)
        for t, p, ld in specs
        for k, start in enumerate(starts[t])
    ]
    if config.comparison_scenario and not any(task[4] for task in tasks) and tasks:
        tasks[0] = (*tasks[0][:4], True, tasks[0][5])
    # Longest first: the comparison scenario, then whole windows, the short traces last.
    order = sorted(
        range(len(tasks)), key=lambda i: (not tasks[i][4], tasks[i][0] in WHOLE_TRACE, i)
    )
    jobs = config.jobs or min(len(tasks), os.cpu_count() or 1)
    runner = runner or RunnerSpec(jobs=jobs)
    outcomes: dict[int, dict[str, Any]] = {}
    runnable = [i for i in order if tasks[i][0] not in failed]
    keys = [str(i) for i in runnable]  # a progress slot per task, whatever its label

    def report() -> None:
        if on_progress is not None:
            on_progress(cells.total(), sizes.total())

    cells = CellProgress(keys, on_report=report)
    sizes = CellProgress(keys)  # each task's units: guessed here, its worker's once built
    for key, i in zip(keys, runnable, strict=True):
        sizes.report(key, expected_progress_units(tasks[i], shared))
    report()
    say(
        f"bench controllers: {len(tasks)} scenario(s), {runner.kind} runner; "
        "each first calibrates its SLO capacity at the maximum clock, then runs "
        f"{len(CONTROLLER_ORDER) + len(config.outside_controllers)} controllers and oracles "
        "and the LP bound"
    )
    for i, task in enumerate(tasks):
        if task[0] in failed:
            outcomes[i] = {"skipped": {"scenario": _task_label(task), "reason": failed[task[0]]}}
            say(_progress_line(outcomes[i], len(outcomes), len(tasks)))
    for done in map_cells(
        _run_cell,
        [(key, tasks[i]) for key, i in zip(keys, runnable, strict=True)],
        spec=runner,
        shared={**shared, "progress": cells, "sizes": sizes},
        on_event=say,
        label=lambda cell: _task_label(cell[1]),
        on_wait=report,
    ):
        index = runnable[done.index]
        outcomes[index] = done.value
        # Its real length's units (a Ray cell's reports went nowhere; a skipped one: 0).
        units = outcome_progress_units(done.value, config)
        sizes.report(keys[done.index], units)
        cells.report(keys[done.index], units)
        say(_progress_line(outcomes[index], len(outcomes), len(tasks)))
    ordered = [outcomes[i] for i in range(len(tasks))]
    scenarios, skipped, rows = gather_outcomes(ordered)
    failed_rows = [entry for outcome in ordered for entry in outcome.get("failed_rows", ())]
    rows = drop_failed_controllers(rows, failed_rows)
    comparison: dict[str, Any] | None = None
    for outcome in ordered:
        if outcome.get("comparison") is not None:
            comparison = compare_recorded(outcome["comparison"], say)
    elapsed = time.perf_counter() - started
    windows: dict[str, Any] = {}
    if config.windows > 1:
        windows = {
            "window_starts_s": {
                trace: list(values) for trace, values in starts.items() if trace not in failed
            },
            "window_summary": summarize_windows(rows),
            "window_overlaps": window_overlaps(scenarios),
        }
    provenance = board_provenance(replace(config, jobs=jobs), runner)
    return {
        "benchmark": "controllers",
        "mode": provenance.pop("mode"),
        "config": provenance.pop("config"),
        "definitions": DEFINITIONS,
        **provenance,
        "profiles": {name: shared[f"profile:{name}"].describe() for name in config.profiles},
        "wall_s": elapsed,
        "scenarios": scenarios,
        "skipped": skipped,
        "failed_rows": failed_rows,
        "rows": rows,
        "summary": summarize(rows),
        "head_to_head": head_to_head(rows),
        "mpc_solver_comparison": comparison,
        **windows,
    }


def board_provenance(config: BenchConfig, runner: RunnerSpec) -> dict[str, Any]:
    """What a board's JSON records of how it ran, for its figures to be run again: the
    ``mode``, every setting (``config``, its SLO target included), the ``machine``, the
    ``runner``, ``gpugov_version`` and the libraries, commit and outside code
    (``versions``). The colocated and the disaggregated boards both record it."""
    return {
        "mode": config.mode,
        "config": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in asdict(config).items()
        }
        | {"slo_target": None if config.slo_target is None else config.slo_target.as_dict()},
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "runner": runner.describe(),
        "gpugov_version": __version__,
        "versions": software_versions(config.outside_controllers),
    }


def gather_outcomes(
    outcomes: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """A board's scenario outcomes, in task order, as ``(scenarios, skipped, rows)``: an
    outcome is ``{"skipped": ...}`` or has its ``scenario`` and its ``rows``."""
    scenarios: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for outcome in outcomes:
        if "skipped" in outcome:
            skipped.append(outcome["skipped"])
            continue
        scenarios.append(outcome["scenario"])
        rows.extend(outcome["rows"])
    return scenarios, skipped, rows


def _progress_line(outcome: dict[str, Any], done: int, total: int) -> str:
    """A scenario's line once it is done: ``[n/N] KEY (its wall seconds)``, or ``[n/N]
    skipped KEY``. No ETA: scenarios differ in length, so the caller's estimate from the
    simulated seconds (``on_progress``) is the one to show."""
    if "skipped" in outcome:
        return f"[{done}/{total}] skipped {outcome['skipped']['scenario']}"
    info = outcome["scenario"]
    return f"[{done}/{total}] {info['key']} ({info['wall_s']:.1f}s)"


__all__ = [
    "FULL",
    "QUICK",
    "TINY",
    "BenchConfig",
    "ControllerEntry",
    "EmptyWindowError",
    "ProbeTooLongError",
    "Scenario",
    "ScenarioSkip",
    "board_provenance",
    "build_scenario",
    "build_scoreboard_controllers",
    "compare_mpc_solvers",
    "drop_failed_controllers",
    "expected_progress_units",
    "failed_row",
    "gather_outcomes",
    "outcome_progress_units",
    "run_scenario",
    "run_scoreboard",
    "scenario_progress_units",
    "scenario_warmup_s",
    "scoreboard_mpc",
    "slo_capacity",
    "write_outputs",
]

if __name__ == "__main__":
    from gpugov.study.scoreboard.command import main

    raise SystemExit(main())
