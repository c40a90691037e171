"""The scoreboard's disaggregated scenarios (``gpugov bench controllers --layout
disaggregated``): each controller governs the prefill pool and the decode pool of a
:class:`~gpugov.plant.disaggregated_layout.DisaggregatedPlant`, one instance per pool, each
built by the node's factory inside its safety chain (:func:`study_controller`), and each
observing what its node's daemon derives from its engines' pages (``config.engine_view``,
as the colocated scenarios; ``exact`` for the plant's state).

Rows carry the run's energy and its saving against the maximum clock on both pools, the
same saving per pool, and the scoreboard's SLO condition (attainment at least the
maximum clock's minus the tolerance) on the request-level records. Two hindsight rows
follow the maximum clock, as on the colocated board: the best fixed clock pair
(:func:`best_fixed_pair`) and the window oracle per pool
(:func:`~gpugov.controllers.oracles.pool_window_oracle`, continuing at that pair). The
oracle energy is the lowest of the two that hold the SLO; every row's
``oracle_capture``, and each pool's, is measured against that row (each pool against its
same pool), and ``energy_over_lp_bound`` against the fluid LP bound of the layout (the
sum of the pools' bounds, :func:`~gpugov.controllers.oracles.pool_energy_lower_bound`)
and of each pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpugov.controllers.baseline import FixedClockController
from gpugov.controllers.oracles import (
    PoolEnergyBound,
    PoolWindowOracle,
    holds_slo,
    oracle_capture,
    pool_energy_lower_bound,
    pool_window_oracle,
)
from gpugov.controllers.oracles.common import lowest_holding
from gpugov.daemon.controller_config import (
    ControllerConfig,
    DefaultDVFSControllerConfig,
    MaxControllerConfig,
    OnlineMPCControllerConfig,
    ReactiveControllerConfig,
    VoltanaControllerConfig,
)
from gpugov.daemon.simulated import pool_view
from gpugov.plant import ServingPlant
from gpugov.plant.disaggregated import (
    DisaggregatedResult,
    ReplicatedResult,
    simulate_colocated_replicas,
    simulate_disaggregated,
)
from gpugov.plant.disaggregated_layout import ROLES, DisaggregatedPlant, PoolSpec
from gpugov.plant.synthetic_profiles import resolve_profile
from gpugov.plant.types import ClockController, Request
from gpugov.plant.workload import TraceError
from gpugov.study.runners import (
    CellProgress,
    RunnerSpec,
    check_runner,
    map_cells,
    spec_from_args,
)
from gpugov.study.scoreboard.controllers import study_controller
from gpugov.study.scoreboard.run import board_provenance, gather_outcomes, slo_energy_fields
from gpugov.study.scoreboard.scenarios import (
    DEFAULT_OUT,
    DISAGGREGATED_LAYOUTS,
    DISAGGREGATED_PROFILES,
    DISAGGREGATED_TRACES,
    BenchConfig,
    DisaggregatedScenario,
    ScenarioSkip,
    build_disaggregated_scenario,
    layout_profiles,
)

DISAGGREGATED_CONTROLLERS = ("max", "reactive", "default-dvfs", "voltana", "mpc-online")
"""Rows of the disaggregated scoreboard, in table order (``max`` first: the reference)."""
BEST_FIXED = "best-fixed"
"""The first hindsight row: the best fixed clock pair (:func:`best_fixed_pair`), after
``max``."""
WINDOW_ORACLE = "window-oracle"
"""The second hindsight row: the window oracle per pool
(:func:`~gpugov.controllers.oracles.pool_window_oracle`), after the best fixed pair."""
HINDSIGHT = (BEST_FIXED, WINDOW_ORACLE)
"""The hindsight rows, in table order; the oracle energy is the lowest holding one's."""


def row_spec(key: str, config: BenchConfig) -> tuple[ControllerConfig, float]:
    """The config kind of row ``key`` and the period it runs at."""
    if key == "max":
        return MaxControllerConfig(kind="max"), config.control_period_s
    if key == "reactive":
        return ReactiveControllerConfig(kind="reactive"), config.control_period_s
    if key == "default-dvfs":
        return DefaultDVFSControllerConfig(kind="default-dvfs"), config.online_period_s
    if key == "voltana":
        return VoltanaControllerConfig(kind="voltana"), config.online_period_s
    if key == "mpc-online":
        spec = OnlineMPCControllerConfig(
            kind="mpc-online", solve_time_limit_s=config.mpc_solve_time_limit_s
        )
        return spec, config.online_period_s
    raise ValueError(f"unknown disaggregated scoreboard row {key!r}")


def pool_workloads(requests: Sequence[Request]) -> dict[str, tuple[Request, ...]]:
    """What each pool serves, for its controller's declared forecasts: the prefill pool
    runs every request to its first token; the decode pool the requests' full lengths."""
    prefill = tuple(Request(r.request_id, r.arrival_time_s, r.prompt_tokens, 1) for r in requests)
    return {"prefill": prefill, "decode": tuple(requests)}


def layout_plant(scenario: DisaggregatedScenario, plant: ServingPlant) -> DisaggregatedPlant:
    """The scenario's two pools of ``plant``, joined by its interconnect."""
    return DisaggregatedPlant(
        PoolSpec(plant, scenario.prefill_engines),
        PoolSpec(plant, scenario.decode_engines),
        interconnect=scenario.interconnect,
    )


def _pool_fields(
    result: DisaggregatedResult, reference: DisaggregatedResult
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        pool = result.pools[role]
        e_max = reference.pools[role].energy_j
        out[role] = {
            "energy_j": pool.energy_j,
            "energy_saved_fraction": (e_max - pool.energy_j) / e_max if e_max > 0 else None,
            "prefill_energy_j": pool.prefill_energy_j,
            "decode_energy_j": pool.decode_energy_j,
            "idle_energy_j": pool.idle_energy_j,
            "mean_realized_clock_mhz": pool.mean_realized_clock_mhz,
            **pool.phase_latency_s,
        }
    return out


def _colocated_fields(
    result: ReplicatedResult, reference: ReplicatedResult, tolerance: float, tensor_parallel: int
) -> dict[str, Any]:
    """The same controller on the colocated layout of the same GPUs and load: one engine
    per disaggregated engine, each ``tensor_parallel`` GPUs."""
    metrics = result.metrics
    e_max = reference.metrics.energy_j
    return {
        "gpus": len(result.engines) * tensor_parallel,
        "engines": len(result.engines),
        "energy_j": metrics.energy_j,
        "energy_saved_fraction": (e_max - metrics.energy_j) / e_max if e_max > 0 else None,
        "slo_attainment": metrics.slo_attainment,
        "holds_slo": holds_slo(metrics.slo_attainment, reference.metrics.slo_attainment, tolerance),
        "ttft_p95_s": metrics.ttft_p95_s,
        "tpot_p95_s": metrics.tpot_p95_s,
    }


def _row(
    scenario: DisaggregatedScenario,
    key: str,
    result: DisaggregatedResult,
    reference: DisaggregatedResult,
    *,
    tolerance: float,
    wall_s: float,
) -> dict[str, Any]:
    transfer = result.as_dict()["transfer"]
    return {
        "scenario": scenario.key,
        "trace": scenario.base.trace,
        "profile": scenario.base.profile,
        "load": scenario.base.load_label,
        "layout": scenario.layout,
        "controller": key,
        **slo_energy_fields(result.metrics, reference.metrics, tolerance),
        "pools": _pool_fields(result, reference),
        "transfer_p50_s": transfer["p50_s"],
        "transfer_p99_s": transfer["p99_s"],
        "oracle_capture": None,
        "energy_over_lp_bound": None,
        "wall_s": wall_s,
    }


# ------------------------------------------------------- per-pool hindsight reference
@dataclass(frozen=True)
class BestFixedPair:
    """Result of :func:`best_fixed_pair`: a fixed clock per pool, the run at that pair,
    each pool's own search result (the other pool at its maximum clock) and every pair
    simulated, in the order evaluated."""

    clocks_mhz: dict[str, float]
    single_pool_mhz: dict[str, float]
    result: DisaggregatedResult
    evaluations: tuple[dict[str, Any], ...]
    reference_attainment: float | None
    tolerance: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (the run's metrics are in its row)."""
        return {
            "clocks_mhz": dict(self.clocks_mhz),
            "single_pool_mhz": dict(self.single_pool_mhz),
            "energy_j": self.result.metrics.energy_j,
            "slo_attainment": self.result.metrics.slo_attainment,
            "reference_attainment": self.reference_attainment,
            "tolerance": self.tolerance,
            "simulations": len(self.evaluations),
            "evaluations": list(self.evaluations),
        }


def best_fixed_pair(
    requests: Sequence[Request],
    layout: DisaggregatedPlant,
    reference: DisaggregatedResult,
    *,
    tolerance: float,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> BestFixedPair:
    """The lowest fixed clock per pool that holds the SLO condition against
    ``reference`` (the maximum clock on both pools), in hindsight.

    1. Per pool, the other pool at its maximum clock: the lowest supported clock that
       holds, by bisection (:func:`~gpugov.controllers.oracles.common.lowest_holding`;
       attainment is taken to be monotone in the clock).
    2. Jointly: the pair of the two answers is simulated; when it does not hold (each
       pool spent the whole tolerance on its own), both clocks rise together along the
       line to the maximum pair, again by bisection, to the lowest point that holds.

    3. The pair kept is the lowest-energy holding pair simulated: the joint answer, unless
       a pair the searches ran (the maximum pair among them) holds for less.

    The lowest holding clock is not always the lowest-energy one (energy per token can
    rise again at the lowest clocks); this reference scans no further than the pairs the
    searches ran. It is a fixed pair, not a per-window schedule."""
    work = tuple(requests)
    clocks = {role: layout.pool(role).plant.profile.clock_mhz for role in ROLES}
    top = {role: int(clocks[role].size) - 1 for role in ROLES}
    target = reference.metrics.slo_attainment
    runs: dict[tuple[int, int], DisaggregatedResult] = {(top["prefill"], top["decode"]): reference}
    order: list[tuple[int, int]] = [(top["prefill"], top["decode"])]

    def run(pair: tuple[int, int]) -> DisaggregatedResult:
        if pair not in runs:
            chosen = {
                role: float(clocks[role][index]) for role, index in zip(ROLES, pair, strict=True)
            }
            runs[pair] = simulate_disaggregated(
                work,
                layout,
                {role: FixedClockController(chosen[role]) for role in ROLES},
                seed,
                controller_names={role: f"fixed:{chosen[role]:g}" for role in ROLES},
                control_period_s=control_period_s,
            )
            order.append(pair)
        return runs[pair]

    def holds(pair: tuple[int, int]) -> bool:
        return holds_slo(run(pair).metrics.slo_attainment, target, tolerance)

    lowest_prefill = lowest_holding(lambda i: holds((i, top["decode"])), top["prefill"])
    lowest_decode = lowest_holding(lambda i: holds((top["prefill"], i)), top["decode"])
    gaps = (top["prefill"] - lowest_prefill, top["decode"] - lowest_decode)
    span = max(gaps)

    def along(k: int) -> tuple[int, int]:
        if span == 0:
            return (lowest_prefill, lowest_decode)
        return (
            lowest_prefill + round(k * gaps[0] / span),
            lowest_decode + round(k * gaps[1] / span),
        )

    lowest = along(lowest_holding(lambda k: holds(along(k)), span))
    # The cheapest holding pair simulated (the maximum pair among them): on a table whose
    # power falls as the clock rises, the lowest holding pair cost more than the maximum.
    chosen = min(
        (pair for pair in runs if holds(pair)),
        key=lambda pair: (runs[pair].metrics.energy_j, pair != lowest),
    )
    evaluations = tuple(
        {
            "prefill_mhz": float(clocks["prefill"][p]),
            "decode_mhz": float(clocks["decode"][d]),
            "energy_j": runs[(p, d)].metrics.energy_j,
            "slo_attainment": runs[(p, d)].metrics.slo_attainment,
            "holds_slo": holds((p, d)),
        }
        for p, d in order
    )
    return BestFixedPair(
        clocks_mhz={
            role: float(clocks[role][index]) for role, index in zip(ROLES, chosen, strict=True)
        },
        single_pool_mhz={
            "prefill": float(clocks["prefill"][lowest_prefill]),
            "decode": float(clocks["decode"][lowest_decode]),
        },
        result=runs[chosen],
        evaluations=evaluations,
        reference_attainment=target,
        tolerance=tolerance,
    )


def _capture(
    energy_max_j: float, energy_j: float, energy_oracle_j: float, holds: bool
) -> float | None:
    return oracle_capture(energy_max_j, energy_j, energy_oracle_j, holds=holds)


def choose_oracle(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The oracle row: the lowest-energy hindsight row (:data:`HINDSIGHT`) that holds the
    SLO, as the colocated board chooses; None when none holds."""
    holding = [row for row in rows if row["controller"] in HINDSIGHT and row["holds_slo"]]
    return min(holding, key=lambda row: (row["energy_j"], row["controller"]), default=None)


def add_captures(rows: Sequence[dict[str, Any]], oracle: dict[str, Any] | None) -> None:
    """Set each row's ``oracle_capture`` against the oracle row ``oracle`` (the whole
    run), and each pool's against the oracle's same pool; a row that does not hold the
    SLO, or every row when no oracle holds (``oracle`` None), gets None, as on the
    colocated scoreboard."""
    reference = rows[0]
    for row in rows:
        row["oracle_capture"] = (
            None
            if oracle is None
            else _capture(
                reference["energy_j"], row["energy_j"], oracle["energy_j"], row["holds_slo"]
            )
        )
        for role in ROLES:
            row["pools"][role]["oracle_capture"] = (
                None
                if oracle is None
                else _capture(
                    reference["pools"][role]["energy_j"],
                    row["pools"][role]["energy_j"],
                    oracle["pools"][role]["energy_j"],
                    row["holds_slo"],
                )
            )


def add_bound_ratios(rows: Sequence[dict[str, Any]], bound: PoolEnergyBound) -> None:
    """Set each row's ``energy_over_lp_bound`` (the run's energy over the layout's bound)
    and each pool's (over that pool's bound); None where a bound did not solve."""

    def ratio(energy_j: float, bound_j: float, success: bool) -> float | None:
        return energy_j / bound_j if success and bound_j > 0.0 else None

    for row in rows:
        row["energy_over_lp_bound"] = ratio(row["energy_j"], bound.energy_j, bound.success)
        for role in ROLES:
            pool = bound.pools[role]
            row["pools"][role]["energy_over_lp_bound"] = ratio(
                row["pools"][role]["energy_j"], pool.energy_j, pool.success
            )


def row_controller(
    key: str,
    plant: ServingPlant,
    workload: Sequence[Request],
    config: BenchConfig,
    role: str = "colocated",
    replicas: int = 1,
) -> ClockController:
    """Row ``key``'s controller on one domain of ``plant`` in ``role`` (the node's factory
    and safety chain, the row's period and the board's SLO target), a pool of ``replicas``
    engines."""
    spec, period = row_spec(key, config)
    return study_controller(
        spec,
        plant,
        workload,
        control_period_s=period,
        safety=config.safety,
        slo_target=config.slo_target,
        role=role,
        replicas=replicas,
    )


def simulate_pools(
    scenario: DisaggregatedScenario,
    layout: DisaggregatedPlant,
    workloads: dict[str, tuple[Request, ...]],
    key: str,
    config: BenchConfig,
    *,
    wrap: Callable[[ClockController], ClockController] | None = None,
) -> tuple[DisaggregatedResult, dict[str, ClockController]]:
    """One row's run on the layout: each pool its own instance of ``key``'s controller
    (the node's factory and safety chain, the pool's role), ``wrap`` around each where
    given (a probe of what it observes); the result and the pools' controllers."""
    _, period = row_spec(key, config)
    chains: dict[str, ClockController] = {}
    for role in ROLES:
        pool = layout.pool(role)
        chain = row_controller(key, pool.plant, workloads[role], config, role, pool.replicas)
        chains[role] = chain if wrap is None else wrap(chain)
    result = simulate_disaggregated(
        scenario.requests,
        layout,
        chains,  # type: ignore[arg-type]
        config.seed,
        controller_names={role: key for role in ROLES},
        control_period_s=period,
        view=pool_view(config.engine_view, config.slo_target),
    )
    return result, chains


def disaggregated_scenario_outcome(
    scenario: DisaggregatedScenario,
    plant: ServingPlant,
    config: BenchConfig,
    controllers: Sequence[str] = DISAGGREGATED_CONTROLLERS,
    *,
    best_fixed: bool = True,
    window_oracle: bool = True,
    on_row: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One row per controller on ``scenario`` (the maximum clock first, the reference);
    with ``best_fixed``, the hindsight rows after it: the best fixed clock pair
    (:func:`best_fixed_pair`) and, with ``window_oracle`` too, the window oracle per pool
    continuing at that pair; then the oracle choice, the captures and the LP bound's
    ratios. Returns ``{"scenario": ..., "key": ..., "rows": [...]}``; the scenario's
    description records the oracle row, its energy, the LP bounds and the window
    oracle's summary. ``on_row``, when given, is told the rows done so far as each is
    (a progress count; the hindsight rows together, after their search)."""
    if not controllers or controllers[0] != "max":
        raise ValueError("the disaggregated rows must start with 'max' (the reference)")
    layout = layout_plant(scenario, plant)
    workloads = pool_workloads(scenario.requests)
    view = pool_view(config.engine_view, config.slo_target)
    rows: list[dict[str, Any]] = []
    reference: DisaggregatedResult | None = None
    colocated_reference: ReplicatedResult | None = None
    gpus = scenario.prefill_engines + scenario.decode_engines
    for key in controllers:
        _, period = row_spec(key, config)
        colocated = simulate_colocated_replicas(
            scenario.requests,
            plant,
            [row_controller(key, plant, scenario.requests, config) for _ in range(gpus)],
            config.seed,
            control_period_s=period,
            view=view,
        )
        if colocated_reference is None:
            colocated_reference = colocated
        started = time.perf_counter()
        result, _ = simulate_pools(scenario, layout, workloads, key, config)
        wall = time.perf_counter() - started
        if reference is None:
            reference = result
        row = _row(scenario, key, result, reference, tolerance=config.tolerance, wall_s=wall)
        row["colocated"] = _colocated_fields(
            colocated, colocated_reference, config.tolerance, plant.tensor_parallel
        )
        e_colocated = colocated.metrics.energy_j
        row["energy_vs_colocated_fraction"] = (
            (e_colocated - result.metrics.energy_j) / e_colocated if e_colocated > 0 else None
        )
        rows.append(row)
        if on_row is not None:
            on_row(len(rows))
    assert reference is not None
    info: dict[str, Any] = scenario.describe()
    if best_fixed:
        hindsight = _hindsight_rows(scenario, layout, reference, config, window_oracle)
        rows[1:1] = hindsight["rows"]
        if on_row is not None:
            on_row(len(rows))
        info["window_oracle"] = hindsight["window_oracle"]
        oracle = choose_oracle(rows)
        add_captures(rows, oracle)
        info["oracle"] = None if oracle is None else oracle["controller"]
        info["oracle_energy_j"] = None if oracle is None else oracle["energy_j"]
    started = time.perf_counter()
    bound = pool_energy_lower_bound(scenario.requests, layout, window_s=config.lp_window_s)
    info["lp_bound"] = {**bound.as_dict(), "compute_s": time.perf_counter() - started}
    add_bound_ratios(rows, bound)
    return {"scenario": info, "key": scenario.key, "rows": rows}


def _hindsight_rows(
    scenario: DisaggregatedScenario,
    layout: DisaggregatedPlant,
    reference: DisaggregatedResult,
    config: BenchConfig,
    window_oracle: bool,
) -> dict[str, Any]:
    """The best fixed pair's row and, with ``window_oracle``, the window oracle's
    (continuing at the pair, with ``config``'s window, lookahead, grid, tolerance and
    seed); ``{"rows": [...], "window_oracle": its summary or None}``."""
    started = time.perf_counter()
    pair = best_fixed_pair(
        scenario.requests,
        layout,
        reference,
        tolerance=config.tolerance,
        seed=config.seed,
        control_period_s=config.control_period_s,
    )
    wall = time.perf_counter() - started
    row = _row(
        scenario, BEST_FIXED, pair.result, reference, tolerance=config.tolerance, wall_s=wall
    )
    row["colocated"] = None
    row["energy_vs_colocated_fraction"] = None
    row["best_fixed_pair"] = pair.as_dict()
    rows = [row]
    if not window_oracle:
        return {"rows": rows, "window_oracle": None}
    started = time.perf_counter()
    oracle = scoreboard_pool_window_oracle(scenario, layout, reference, pair, config)
    wall = time.perf_counter() - started
    row = _row(
        scenario, WINDOW_ORACLE, oracle.result, reference, tolerance=config.tolerance, wall_s=wall
    )
    row["colocated"] = None
    row["energy_vs_colocated_fraction"] = None
    row["oracle_source"] = oracle.source
    summary = oracle.as_dict()
    rows.append(row)
    return {"rows": rows, "window_oracle": summary}


def scoreboard_pool_window_oracle(
    scenario: DisaggregatedScenario,
    layout: DisaggregatedPlant,
    reference: DisaggregatedResult,
    pair: BestFixedPair,
    config: BenchConfig,
) -> PoolWindowOracle:
    """The window oracle per pool as the board searches it: continuing at the best fixed
    pair ``pair``, with ``config``'s window, lookahead, grid, tolerance, seed and period
    (those of the colocated board's window oracle)."""
    return pool_window_oracle(
        scenario.requests,
        layout,
        reference=reference,
        continuation_clocks_mhz=pair.clocks_mhz,
        continuation_result=pair.result,
        **config.oracle_search,
    )


def run_disaggregated_scenario(
    scenario: DisaggregatedScenario,
    plant: ServingPlant,
    config: BenchConfig,
    controllers: Sequence[str] = DISAGGREGATED_CONTROLLERS,
    *,
    best_fixed: bool = True,
    window_oracle: bool = True,
) -> list[dict[str, Any]]:
    """The rows of :func:`disaggregated_scenario_outcome` (the maximum clock first, then
    the hindsight rows with ``best_fixed``, then the other controllers)."""
    outcome = disaggregated_scenario_outcome(
        scenario, plant, config, controllers, best_fixed=best_fixed, window_oracle=window_oracle
    )
    rows: list[dict[str, Any]] = outcome["rows"]
    return rows


def disaggregated_cell(
    cell: tuple[str, str, str, str], shared: Mapping[str, Any]
) -> dict[str, Any]:
    """One scenario ``(trace, profile, load, layout)`` as a runner task: its description and
    rows, or the reason it was skipped (a window with no requests, a profile too slow for the
    capacity search, a trace not present)."""
    trace, profile_name, load, layout = cell
    config: BenchConfig = shared["config"]
    counter: CellProgress | None = shared.get("progress")
    on_row: Callable[[int], None] | None = None
    if counter is not None:

        def on_row(rows: int) -> None:
            counter.report("|".join(cell), float(rows))

    # A generated profile (synthetic:SHAPE) as the colocated board takes it.
    plant = ServingPlant.from_profile(resolve_profile(profile_name))
    try:
        scenario = build_disaggregated_scenario(trace, plant, layout, load, config.duration_s)
    except (ScenarioSkip, TraceError) as error:
        return {"skipped": {"scenario": "|".join(cell), "reason": str(error)}}
    return disaggregated_scenario_outcome(
        scenario, plant, config, shared["controllers"], on_row=on_row
    )


def rows_per_scenario(controllers: Sequence[str]) -> int:
    """A disaggregated scenario's rows: one per controller and the two hindsight rows."""
    return len(controllers) + 2


def run_disaggregated(
    config: BenchConfig,
    *,
    traces: Sequence[str] | None = None,
    profiles: Sequence[str] | None = None,
    layouts: Sequence[str] | None = None,
    controllers: Sequence[str] = DISAGGREGATED_CONTROLLERS,
    progress: Callable[[str], None] | None = None,
    runner: RunnerSpec | None = None,
    on_count: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Every disaggregated scenario: ``traces`` x ``profiles`` x ``config.loads`` x
    ``layouts`` (defaults :data:`DISAGGREGATED_TRACES`, :data:`DISAGGREGATED_PROFILES`,
    every layout), each a task of ``runner`` (default: ``config.jobs`` local processes),
    assembled in that order whatever order they finish in. A scenario whose window holds
    no requests is skipped with its reason. ``on_count`` receives the rows done so far over
    every scenario while they run (:func:`rows_per_scenario` each; in this process or a
    local pool's workers, a Ray scenario's when it ends; a skipped one counts whole)."""
    started = time.perf_counter()
    traces, profiles = (
        tuple(traces or DISAGGREGATED_TRACES),
        tuple(profiles or DISAGGREGATED_PROFILES),
    )
    runner = runner or RunnerSpec(jobs=config.jobs)
    cells = [
        (trace, profile_name, load, layout)
        for trace in traces
        for profile_name in profiles
        for load in config.loads
        for layout in layouts or tuple(DISAGGREGATED_LAYOUTS)
    ]
    outcomes: dict[int, dict[str, Any]] = {}

    def count() -> None:
        if on_count is not None:
            on_count(counter.total())

    counter = CellProgress(["|".join(cell) for cell in cells], on_report=count)
    for done in map_cells(
        disaggregated_cell,
        cells,
        spec=runner,
        shared={"config": config, "controllers": tuple(controllers), "progress": counter},
        on_event=progress,
        label=lambda cell: "|".join(cell),
        on_wait=count,
    ):
        outcomes[done.index] = done.value
        counter.report("|".join(cells[done.index]), float(rows_per_scenario(controllers)))
        if progress is not None:
            finished = done.value.get("key") or done.value["skipped"]["scenario"]
            progress(f"[{len(outcomes)}] {finished}")
    scenarios, skipped, rows = gather_outcomes([outcomes[i] for i in range(len(cells))])
    ran = replace(config, traces=traces, profiles=profiles, jobs=runner.jobs)
    return {
        "benchmark": "controllers",
        "layout": "disaggregated",
        # How it ran, as the colocated board records it: its figures can be run again.
        **board_provenance(ran, runner),
        "profiles": {name: resolve_profile(name).describe() for name in profiles},
        "wall_s": time.perf_counter() - started,
        "scenarios": scenarios,
        "skipped": skipped,
        "rows": rows,
        "notes": (
            "Each pool runs its own instance of the row's controller (the node's factory "
            f"and safety chain: {config.safety.words()}; {_periods_words(controllers, config)}; "
            f"{_target_words(config)}) and observes the {config.engine_view!r} engine view, as "
            "does the colocated twin. Savings are against the maximum clock on both pools; per "
            "pool against the maximum clock's same pool. 'best-fixed (hindsight)' is the "
            "best fixed clock pair: the lowest fixed clock per pool that holds the SLO "
            "condition (searched per pool with the other at its maximum clock, then "
            "checked and raised jointly). 'window-oracle (hindsight)' is a clock per pool "
            "per 'oracle_window_s' window from a greedy forked search on the "
            "disaggregated plant (per window the prefill pool's candidates, then the "
            "decode pool's; lookahead and fallbacks at the best fixed pair), under the "
            "same SLO condition. The oracle energy is the lowest of the two hindsight rows "
            "that hold the SLO; 'capture' is each row's oracle capture against it (None "
            "where the row does not hold the SLO), each pool's against the oracle's same "
            "pool. 'E / LP bound' is the run's energy over the fluid LP lower bound of the "
            "layout: the sum of each pool's bound (the prefill pool serving every prompt "
            "token, the decode pool every decode token, each with its replicas). "
            "'colocated saved' is the same controller on the colocated layout of the same "
            "GPUs and load (one engine per disaggregated engine, arrivals round robin) "
            "against its maximum "
            "clock; 'vs colocated' is how far the disaggregated run's energy lies below "
            "that colocated run's."
        ),
    }


def _periods_words(controllers: Sequence[str], config: BenchConfig) -> str:
    """The control period each row decides at, in words (rows of one period together)."""
    by_period: dict[float, list[str]] = {}
    for key in controllers:
        by_period.setdefault(row_spec(key, config)[1], []).append(key)
    return "decided every " + ", ".join(
        f"{period:g} s ({', '.join(keys)})" for period, keys in sorted(by_period.items())
    )


def _target_words(config: BenchConfig) -> str:
    """The SLO target every controller is given, in words."""
    target = config.slo_target
    if target is None:
        return "no SLO target"
    return f"an SLO target of {100.0 * target.attainment:g} % over {target.window_s:g} s"


def run_disaggregated_from_args(args: Any, config: BenchConfig) -> int:
    """``--layout disaggregated`` (or the second half of ``both``): run, write
    ``DIR/disaggregated.json`` and ``.md``, print the table. ``--traces`` and
    ``--profiles`` choose the scenarios when given; otherwise the disaggregated defaults.
    ``DIR`` is held while it runs (:func:`~gpugov.study.outputs.held_output_dir`)."""
    from gpugov.daemon.cli_outputs import prepare_output_dir
    from gpugov.study.outputs import held_output_dir
    from gpugov.study.scoreboard.command import DISAGGREGATED_FILES

    runner = replace(spec_from_args(args), jobs=config.jobs)
    check_runner(runner)  # --ray: Ray installed and the cluster there, before any work
    prepare_output_dir("--out", args.out, parents=args.out == str(DEFAULT_OUT))
    # One run at a time writes DIR: a second one is refused here, before its scenarios.
    with held_output_dir(Path(args.out), "--out", DISAGGREGATED_FILES):
        return _run_disaggregated_held(args, config, runner)


def _run_disaggregated_held(args: Any, config: BenchConfig, runner: RunnerSpec) -> int:
    """:func:`run_disaggregated_from_args`' run, once ``DIR`` is held."""
    from gpugov.daemon.cli_support import UsageError, wrote
    from gpugov.daemon.progress import Progress
    from gpugov.study.scoreboard.disaggregated_report import markdown, write_disaggregated

    traces = getattr(args, "traces", None) or DISAGGREGATED_TRACES
    profiles = layout_profiles(
        "disaggregated", config.profiles, named=bool(getattr(args, "profiles", None))
    )
    total = len(traces) * len(profiles) * len(config.loads) * len(DISAGGREGATED_LAYOUTS)
    # The bar counts rows, each scenario's as they are done (a scenario runs for minutes:
    # counted in whole scenarios, the bar said nothing and read "ETA ?" until one ended).
    rows = rows_per_scenario(DISAGGREGATED_CONTROLLERS)
    bar = Progress(total * rows, "bench controllers --layout disaggregated", unit="rows")
    done = 0
    counted = 0.0
    last = ""

    def show(*, force: bool = False) -> None:
        value = max(counted, float(done * rows))
        bar.update(value, f"{done}/{total} scenarios, {last}" if last else "", force=force)

    def progress(line: str) -> None:  # a scenario done ("[N] key"), or a lost worker
        nonlocal done, last
        if line.startswith("["):
            done += 1
        last = line
        show(force=True)

    def on_count(value: float) -> None:
        nonlocal counted
        counted = value
        show()

    # A line at once: a scenario runs for minutes, and nothing was said until the first
    # ended (4 1/2 minutes on two busy cores).
    progress(
        f"{total} scenario(s), {runner.kind} runner; each runs "
        f"{len(DISAGGREGATED_CONTROLLERS)} controllers, an instance on each pool"
    )

    payload = run_disaggregated(
        config,
        traces=traces,
        profiles=profiles,
        progress=progress,
        runner=runner,
        on_count=on_count,
    )
    bar.close(f"{done}/{total} scenarios")
    if not payload["rows"]:
        reasons = "; ".join(sorted({s["reason"] for s in payload["skipped"]}))
        raise UsageError(f"no disaggregated scenario could run: {reasons}")
    paths = write_disaggregated(payload, Path(args.out))
    print(markdown(payload))
    for path in paths.values():
        wrote(path)
    return 0
