"""The fleet run: the trace scaled to the fleet, one cell per (allocator, budget) and one
budget step per allocator, each cell a whole fleet simulation in lockstep.

A cell advances every node one control period at a time: the router sends the period's
arrivals (in arrival order, each to the node it picks at that moment), every node runs its
engine to the period's end and makes one control decision, and every allocator period
(and at a grid signal) the allocator turns the nodes' reports into new caps. The fleet's
power is each period's energy over its length, summed over the nodes.

Cells are independent and deterministic (seeded), so they run in this process, on a local
process pool or as Ray tasks with the same results (``study/runners.py``). The nodes of one
cell are not stepped in parallel: the router couples them at every arrival, so a parallel
step would need a synchronisation per control period, whose cost (a round trip per node
per second of plant time) exceeds the node's own work (a few milliseconds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpugov import __version__
from gpugov.controllers.oracles import SLO_TOLERANCE
from gpugov.daemon.cli_support import (
    MAX_SIMULATED_DAYS,
    UsageError,
    check_fixed_clock,
    check_simulated_cap,
    parse_controller_flag,
    slo_target_of,
)
from gpugov.daemon.decide import Forecasts, close_controller
from gpugov.daemon.errors import ControllerError
from gpugov.daemon.limits import MIN_PERIOD_S
from gpugov.daemon.safety import SafetySettings
from gpugov.daemon.simulated import ENGINE_VIEWS, observation_view
from gpugov.plant import ServingPlant
from gpugov.plant.profile import ProfileError
from gpugov.plant.profile_files import load_profile
from gpugov.plant.result import compute_metrics
from gpugov.plant.types import Request, RequestRecord
from gpugov.plant.workload import format_seconds
from gpugov.study.fleet.allocators import (
    ALLOCATOR_FUNCTIONS,
    ALLOCATORS,
    NodeReport,
    uniform,
)
from gpugov.study.fleet.node import FleetNode
from gpugov.study.fleet.router import make_router
from gpugov.study.fleet.workload import UTILIZATION_TOLERANCE, fleet_workload
from gpugov.study.provenance import outside_specs
from gpugov.study.runners import CellDone, CellProgress, RunnerSpec, map_cells, run_isolated
from gpugov.study.scoreboard.scenarios import work_seconds_at_maximum

DEFAULT_PROFILES = ("h100-sxm-llama3-8b", "h200-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b")
"""A mixed fleet serving one model: three GPU kinds, each node the next in turn."""
DEFAULT_BUDGETS = (0.6, 0.7, 0.8)
UNCAPPED = "uncapped"
"""The reference cell: every node at its TDP, no budget."""


@dataclass(frozen=True)
class FleetConfig:
    """What one ``gpugov fleet`` run covers (every flag; units in names)."""

    nodes: int = 4
    profiles: tuple[str, ...] = DEFAULT_PROFILES
    controller: str = "mpc"
    router: str = "least-tokens"
    trace: str = "azure-conv"
    trace_start_s: float = 1800.0
    duration_s: float = 720.0
    drain_s: float = 60.0
    utilization: float = 0.6
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    allocators: tuple[str, ...] = ALLOCATORS
    allocator_period_s: float = 15.0
    control_period_s: float = 1.0
    dwell_s: float = 0.5
    floor_fraction: float = 0.3
    guard_fraction: float = 0.02
    step: bool = True
    step_budget: float = 0.8
    step_at_s: float = 60.0
    step_depth: float = 0.3
    step_ramp_s: float = 30.0
    step_hold_s: float = 600.0
    seed: int = 0
    latency_noise: float = 0.0
    """Coefficient of variation of every node's iteration-time jitter (0: none; each node's
    jitter seeded ``seed + i``)."""
    engine_view: str = "vllm"
    slo_target: float | None = None
    """Every node's SLO target: the attainment over a rolling 600 s that ``mpc`` and
    ``mpc-online`` spend the misses of (a domain's ``[domains.slo_target]``; ``gpugov
    fleet`` defaults it to 0.99, as ``simulate`` does); None holds fixed margins."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting that does not fit (before work)."""
        if self.nodes < 1:
            raise ValueError(f"--nodes must be >= 1, got {self.nodes}")
        if not (math.isfinite(self.duration_s) and self.duration_s >= MIN_PERIOD_S):
            raise ValueError(
                f"--duration must be at least {MIN_PERIOD_S:g} s, got {self.duration_s!r}"
            )
        span_s = self.duration_s + self.drain_s
        if not span_s <= MAX_SIMULATED_DAYS * 86_400.0:
            # Every cell simulates all of it: --duration 3e8 showed an ETA of 1,800 hours
            # while its series grew without bound.
            raise ValueError(
                f"--duration {self.duration_s:g} s and --drain {self.drain_s:g} s make "
                f"{format_seconds(span_s)} simulated seconds a cell, over the limit of "
                f"{MAX_SIMULATED_DAYS:g} simulated days; shorten --duration or --drain"
            )
        if self.engine_view not in ENGINE_VIEWS:
            raise ValueError(
                f"--engine-view must be one of {', '.join(ENGINE_VIEWS)}, got {self.engine_view!r}"
            )
        if not (math.isfinite(self.latency_noise) and 0.0 <= self.latency_noise < 1.0):
            raise ValueError(f"--latency-noise must lie in [0, 1), got {self.latency_noise!r}")
        if self.slo_target is not None and not 0.0 < self.slo_target < 1.0:
            raise ValueError(f"--slo-target must lie in (0, 1), got {self.slo_target!r}")
        for name in self.allocators:
            if name not in ALLOCATORS:
                raise ValueError(f"--allocators: unknown allocator {name!r} (one of {ALLOCATORS})")
        for budget in (*self.budgets, self.step_budget):
            if not 0.0 < budget <= 1.0:
                raise ValueError(
                    f"--budgets: a budget is a fraction of TDP in (0, 1], got {budget}"
                )
        ratio = self.allocator_period_s / self.control_period_s
        if abs(ratio - round(ratio)) > 1e-9 or ratio < 1:
            raise ValueError(
                f"--allocator-period {self.allocator_period_s:g} s must be a whole number of "
                f"control periods (--control-period {self.control_period_s:g} s)"
            )
        if self.step:
            end = self.step_at_s + self.step_ramp_s + self.step_hold_s
            if end > self.duration_s:
                raise ValueError(
                    f"--duration {self.duration_s:g} s is shorter than the budget step "
                    f"(at {self.step_at_s:g} s, {self.step_ramp_s:g} s ramp, held "
                    f"{self.step_hold_s:g} s: ends at {end:g} s); lengthen --duration, "
                    "shorten --step-hold or pass --no-step"
                )
            first, last = self.step_ticks
            if last <= first:
                # No period's budget sample fell in the step: its held budget was the
                # minimum of none (inf), and the run ended writing fleet.json.
                raise ValueError(
                    f"the budget step (--step-at {self.step_at_s:g} s, --step-ramp "
                    f"{self.step_ramp_s:g} s, --step-hold {self.step_hold_s:g} s) holds the "
                    f"middle of no control period (--control-period {self.control_period_s:g} "
                    "s), so no period sees it; lengthen --step-hold or pass --no-step"
                )

    @property
    def ticks(self) -> int:
        """Control periods in one cell (arrivals plus the drain)."""
        return int(math.ceil((self.duration_s + self.drain_s) / self.control_period_s - 1e-9))

    @property
    def step_window(self) -> tuple[float, float]:
        """The budget step's window: from the signal to the end of the hold."""
        return self.step_at_s, self.step_at_s + self.step_ramp_s + self.step_hold_s

    @property
    def step_ticks(self) -> tuple[int, int]:
        """The control periods of the budget step's window, ``range(first, last)``: those
        whose middle, where a cell samples the budget, lies in it (``round`` took a step
        from 1.5 s to 2.5 s for none, rounding both ends half to even)."""
        start, end = self.step_window
        period = self.control_period_s
        return math.ceil(start / period - 0.5), math.ceil(end / period - 0.5)

    def node_profiles(self) -> list[str]:
        """Each node's profile, the listed profiles in turn."""
        return [self.profiles[i % len(self.profiles)] for i in range(self.nodes)]

    def describe(self) -> dict[str, Any]:
        """JSON-able settings."""
        return asdict(self)


@dataclass(frozen=True)
class Cell:
    """One fleet simulation: an allocator at a budget (a fraction of the summed TDP), with
    the budget step or without."""

    allocator: str
    budget: float | None
    step: bool = False

    @property
    def key(self) -> str:
        """``slo@0.70``, ``dps@0.80+step``, ``uncapped``."""
        if self.budget is None:
            return UNCAPPED
        return f"{self.allocator}@{self.budget:.2f}" + ("+step" if self.step else "")


def cells_for(config: FleetConfig) -> list[Cell]:
    """The uncapped reference, every (allocator, budget), and each allocator's step."""
    cells = [Cell(UNCAPPED, None)]
    cells += [Cell(a, b) for b in config.budgets for a in config.allocators]
    if config.step:
        cells += [Cell(a, config.step_budget, step=True) for a in config.allocators]
    return cells


# ------------------------------------------------------------------------- workload
# ------------------------------------------------------------------------ one cell
def budget_at(config: FleetConfig, cell: Cell, tdp_w: float, time_s: float) -> float:
    """The fleet's budget (watts) at ``time_s``: ``budget x TDP``; in a step cell the grid
    signal cuts it by ``step_depth`` linearly over ``step_ramp_s``, holds it for
    ``step_hold_s``, then restores it over the same ramp."""
    if cell.budget is None:
        return math.inf
    base = cell.budget * tdp_w
    if not cell.step:
        return base
    low = base * (1.0 - config.step_depth)
    start, ramp = config.step_at_s, max(config.step_ramp_s, 1e-9)
    hold_end = start + config.step_ramp_s + config.step_hold_s
    if time_s < start:
        return base
    if time_s < start + config.step_ramp_s:
        return base + (low - base) * (time_s - start) / ramp
    if time_s < hold_end:
        return low
    if time_s < hold_end + config.step_ramp_s:
        return low + (base - low) * (time_s - hold_end) / ramp
    return base


def _plants(names: Sequence[str], latency_noise: float = 0.0) -> dict[str, ServingPlant]:
    """One plant per distinct profile, with iteration-time jitter of CV ``latency_noise``."""
    return {
        name: ServingPlant.from_profile(load_profile(name), latency_noise_cv=latency_noise)
        for name in dict.fromkeys(names)
    }


def _attained(
    records: Sequence[Sequence[RequestRecord]],
    plants: Sequence[ServingPlant],
    keep: Callable[[RequestRecord], bool],
) -> tuple[int, int]:
    """(requests meeting both SLOs, requests) among those ``keep`` picks, every node's
    requests judged against its own profile's SLO as ``compute_metrics`` judges them."""
    met = total = 0
    for node_records, plant in zip(records, plants, strict=True):
        chosen = [r for r in node_records if keep(r)]
        if not chosen:
            continue
        profile = plant.profile
        metrics = compute_metrics(
            chosen,
            energy_j=0.0,
            duration_s=1.0,
            output_tokens=0,
            ttft_slo_s=profile.ttft_slo_s,
            tpot_slo_s=profile.tpot_slo_s,
            ttft_slo_per_prompt_token_s=profile.ttft_slo_per_prompt_token_s,
            power_cap_violation_s=0.0,
            thermal_violation_s=0.0,
            peak_temperature_c=0.0,
            peak_queued_requests_at_minimum_clock=0.0,
            preemptions=0,
            clock_changes=0,
        )
        met += round((metrics.slo_attainment or 0.0) * len(chosen))
        total += len(chosen)
    return met, total


def run_cell(cell: Cell, shared: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate the fleet for one cell; its metrics and series (JSON-able). Another
    package's controller runs the cell in a child process, as a sweep's cell does: one
    that ends its process fails the run in one line, and what it changes in its module's
    state is not there when the next cell starts (its figures would follow ``--jobs``,
    ``--ray`` and the cells' order)."""
    spec = shared["config"].controller
    if outside_specs([spec]):
        return run_isolated(lambda: _simulated_cell(cell, shared), f"controller {spec!r}")
    return _simulated_cell(cell, shared)


def _simulated_cell(cell: Cell, shared: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`run_cell`'s simulation, in this process."""
    started = time.process_time()
    config: FleetConfig = shared["config"]
    workload: Sequence[Request] = shared["workload"]
    plants: Mapping[str, ServingPlant] = shared["plants"]
    safety = SafetySettings(dwell_s=config.dwell_s)
    # Once: every node declares the same forecasts, target and view.
    forecasts = Forecasts.from_workload(workload)
    slo_target = slo_target_of(config.slo_target)
    view = observation_view(config.engine_view, slo_target)
    nodes = [
        FleetNode(
            f"node{i}",
            plants[name],
            config.controller,
            workload,
            period_s=config.control_period_s,
            floor_w=config.floor_fraction * plants[name].power_limit_w,
            safety=safety,
            seed=config.seed + i,
            view=view,
            slo_target=slo_target,
            forecasts=forecasts,
        )
        for i, name in enumerate(config.node_profiles())
    ]
    mix_tokens = sum(r.prompt_tokens + r.output_tokens for r in workload)
    rates = {
        name: mix_tokens / max(work_seconds_at_maximum(workload, plant.profile), 1e-9)
        for name, plant in plants.items()
    }
    for node, name in zip(nodes, config.node_profiles(), strict=True):
        node.tokens_per_s = rates[name]
    tdp = sum(node.tdp_w for node in nodes)
    allocate = ALLOCATOR_FUNCTIONS.get(cell.allocator)
    router = make_router(config.router)
    period = config.control_period_s
    every = int(round(config.allocator_period_s / period))
    signal_tick = int(round(config.step_at_s / period)) if cell.step else -1

    def reports(powers: Sequence[float]) -> list[NodeReport]:
        out = []
        for node, power in zip(nodes, powers, strict=True):
            need = node.take_mean_need()
            out.append(
                NodeReport(
                    floor_w=node.floor_w,
                    tdp_w=node.tdp_w,
                    cap_w=node.cap_w,
                    power_w=power,
                    need_w=None if need is None else need.watts,
                    need_sigma_w=None if need is None else need.sigma_w,
                )
            )
        return out

    def target(time_s: float) -> float:
        """What the allocator splits: the lowest budget until its next tick (once a grid
        signal is out, it announces its ramp), less the guard band for the firmware's
        dither above a cap."""
        points = [time_s + k * period for k in range(every + 1)]
        if cell.step and time_s < config.step_at_s:
            points = [t for t in points if t < config.step_at_s]  # the signal is not yet out
        lowest = min(budget_at(config, cell, tdp, t) for t in points)
        return (1.0 - config.guard_fraction) * lowest

    if allocate is not None:
        first = target(0.0)
        for node, cap in zip(nodes, uniform(reports([0.0] * len(nodes)), first), strict=True):
            node.set_cap(cap)
    fleet_power: list[float] = []
    budgets: list[float] = []
    caps_sum: list[float] = []
    cap_ticks: list[float] = []
    cap_series: list[list[float]] = []
    need_series: list[list[float | None]] = []
    energy_mark = [0.0] * len(nodes)
    last_needs: list[float | None] = [None] * len(nodes)
    allocation_mark = [0.0] * len(nodes)
    allocation_time = 0.0
    arrivals = iter(workload)
    upcoming = next(arrivals, None)
    progress: CellProgress | None = shared.get("progress")
    try:
        # Each node's first tick, at 0 s, as a simulated node's: inside the ``try``, so a
        # controller failing at its first decision still has every node's controller closed.
        for node in nodes:
            node.start()
        for tick in range(config.ticks):
            now = tick * period
            if allocate is not None and tick > 0 and (tick % every == 0 or tick == signal_tick):
                elapsed = max(now - allocation_time, 1e-9)
                powers = [
                    (node.energy_j - mark) / elapsed
                    for node, mark in zip(nodes, allocation_mark, strict=True)
                ]
                status = reports(powers)
                last_needs = [report.need_w for report in status]
                caps = allocate(status, target(now))
                for node, cap in zip(nodes, caps, strict=True):
                    node.set_cap(cap)
                allocation_mark = [node.energy_j for node in nodes]
                allocation_time = now
            if tick % every == 0:
                cap_ticks.append(now)
                cap_series.append([node.cap_w for node in nodes])
                need_series.append(last_needs)
            end = now + period
            arriving = []  # routed as a batch: the nodes do not step until the period ends
            while upcoming is not None and upcoming.arrival_time_s < end:
                arriving.append(upcoming)
                upcoming = next(arrivals, None)
            router.route(arriving, nodes)
            for node in nodes:
                node.step(end)
            energies = [node.energy_j for node in nodes]
            fleet_power.append(
                sum(e - m for e, m in zip(energies, energy_mark, strict=True)) / period
            )
            energy_mark = energies
            budgets.append(budget_at(config, cell, tdp, now + 0.5 * period))
            caps_sum.append(sum(node.cap_w for node in nodes))
            if progress is not None:
                progress.report(cell.key, (tick + 1) * period * len(nodes))
    finally:  # as a node closes its controllers at exit
        for node in nodes:
            close_controller(node.controller, f"{node.name}: controller {config.controller!r}")

    results = [
        node.simulation.result(controller_name=config.controller, control_period_s=period)
        for node in nodes
    ]
    records = [result.request_records for result in results]
    node_plants = [node.plant for node in nodes]
    met, total = _attained(records, node_plants, lambda r: True)
    window = config.step_window
    window_met, window_total = _attained(
        records, node_plants, lambda r: window[0] <= r.arrival_time_s < window[1]
    )
    energy = sum(node.energy_j for node in nodes)
    tokens = sum(
        node.observation.output_tokens_total for node in nodes if node.observation is not None
    )
    over = [p > b + 1e-6 for p, b in zip(fleet_power, budgets, strict=True)]
    out: dict[str, Any] = {
        "key": cell.key,
        "allocator": cell.allocator,
        "budget_fraction": cell.budget,
        "step": cell.step,
        "tdp_w": tdp,
        "slo_attainment": met / total if total else None,
        "requests": total,
        "step_window_slo_attainment": window_met / window_total if window_total else None,
        "step_window_requests": window_total,
        "energy_j": energy,
        "output_tokens": tokens,
        "energy_per_output_token_j": energy / tokens if tokens else None,
        "mean_power_w": sum(fleet_power) / len(fleet_power) if fleet_power else None,
        "peak_power_w": max(fleet_power, default=None),
        "time_over_budget_s": sum(over) * period,
        "peak_over_budget_w": max(
            (p - b for p, b in zip(fleet_power, budgets, strict=True) if math.isfinite(b)),
            default=None,
        ),
        "nodes": [
            {
                "name": node.name,
                "profile": node.profile_name,
                "tdp_w": node.tdp_w,
                "floor_w": node.floor_w,
                "publishes_need": node.publishes_need,
                "slo_attainment": result.metrics.slo_attainment,
                "requests": result.metrics.arrived_requests,
                "energy_j": result.metrics.energy_j,
                "power_cap_violation_s": result.metrics.power_cap_violation_s,
                "cap_overshoot_s": result.metrics.cap_overshoot_s,
            }
            for node, result in zip(nodes, results, strict=True)
        ],
        "series": {
            "period_s": period,
            "fleet_power_w": fleet_power,
            "budget_w": [b if math.isfinite(b) else None for b in budgets],
            "caps_sum_w": caps_sum,
            "cap_times_s": cap_ticks,
            "caps_w": cap_series,
            "needs_w": need_series,
        },
        "cpu_s": time.process_time() - started,
    }
    if cell.step:
        out.update(step_metrics(config, fleet_power, budgets, period))
    return out


def step_metrics(
    config: FleetConfig, fleet_power: Sequence[float], budgets: Sequence[float], period: float
) -> dict[str, Any]:
    """How fast the fleet got under the cut budget (the held, lowest one): seconds from the
    signal to the end of the first period at or under it, and to the end of the period from
    which it stays under until the hold ends; and the seconds over the (ramping) budget
    inside the step window."""
    first, last = config.step_ticks  # never empty (FleetConfig.validate)
    held = min(budgets[first:last])
    under = [fleet_power[i] <= held + 1e-6 for i in range(first, last)]
    first_under = next((i for i, ok in enumerate(under) if ok), None)
    stays: int | None = None
    for index in range(len(under) - 1, -1, -1):
        if not under[index]:
            break
        stays = index
    over = sum(1 for i in range(first, last) if fleet_power[i] > budgets[i] + 1e-6)
    return {
        "step_held_budget_w": held,
        "step_time_to_under_s": None if first_under is None else (first_under + 1) * period,
        "step_time_to_stay_under_s": None if stays is None else (stays + 1) * period,
        "step_time_over_budget_s": over * period,
    }


# ------------------------------------------------------------------------ the run
def summarize(config: FleetConfig, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in table order with the comparisons: attainment against the uncapped fleet
    (the scoreboard's SLO condition: within ``SLO_TOLERANCE``), energy against it, and a
    step's SLO loss inside its window against the same allocator without the step, at
    the step's own budget (a budget that differs from it only past the two decimals a cell
    is named by is another run, not its baseline)."""
    by_key = {row["key"]: row for row in rows}
    unstepped = {(row["allocator"], row["budget_fraction"]): row for row in rows if not row["step"]}
    reference = by_key.get(UNCAPPED)
    ref_att = reference["slo_attainment"] if reference else None
    ref_energy = reference["energy_j"] if reference else None
    out = []
    for cell in cells_for(config):
        row = dict(by_key[cell.key])
        att = row["slo_attainment"]
        row["slo_vs_uncapped_pp"] = (
            None if att is None or ref_att is None else 100.0 * (att - ref_att)
        )
        row["slo_holds"] = (
            None if att is None or ref_att is None else att >= ref_att - SLO_TOLERANCE - 1e-12
        )
        row["energy_vs_uncapped"] = None if not ref_energy else row["energy_j"] / ref_energy - 1.0
        if cell.step:
            base = unstepped.get((cell.allocator, cell.budget))
            before = None if base is None else base["step_window_slo_attainment"]
            now = row["step_window_slo_attainment"]
            row["step_slo_loss_pp"] = (
                None if before is None or now is None else 100.0 * (before - now)
            )
        out.append(row)
    return out


def floor_warning(config: FleetConfig, plants: Mapping[str, ServingPlant]) -> str | None:
    """One line when a budget the allocators split (less the guard band; the budget
    step's held low too) lies below the fleet's floor: the nodes' lowest caps summed, or
    their idle power at the lowest clock summed where that is higher. No split reaches
    such a budget: every node is held at its lowest cap (``level_fill``) and the fleet
    runs over it. None when every budget is above the floor."""
    names = config.node_profiles()
    tdp = sum(plants[name].power_limit_w for name in names)
    floors = sum(config.floor_fraction * plants[name].power_limit_w for name in names)
    idle = sum(
        plants[name].profile.power("idle", plants[name].profile.minimum_clock_mhz) for name in names
    )
    floor = max(floors, idle)
    keep = 1.0 - config.guard_fraction

    def below(fraction: float) -> bool:
        return keep * fraction * tdp < floor - 1e-9

    parts: list[str] = []
    low = [budget for budget in config.budgets if below(budget)]
    if low:
        fractions = ", ".join(f"{budget:g}" for budget in low)
        watts = ", ".join(f"{budget * tdp:.0f} W" for budget in low)
        parts.append(f"--budgets {fractions} ({watts})")
    held = config.step_budget * (1.0 - config.step_depth)
    if config.step and below(held):
        parts.append(
            f"the budget step's hold (--step-budget {config.step_budget:g} less "
            f"{100.0 * config.step_depth:g} %: {held * tdp:.0f} W)"
        )
    if not parts:
        return None
    return (
        f"{' and '.join(parts)} of the nodes' summed TDP of {tdp:.0f} W, less the "
        f"{100.0 * config.guard_fraction:g} % guard band, is below the fleet's floor of "
        f"{floor:.0f} W: "
        f"the nodes' lowest caps (--floor {config.floor_fraction:g} of each TDP) sum to "
        f"{floors:.0f} W, their idle power at the lowest clock to {idle:.0f} W; every node "
        "is held at its lowest cap there and the fleet runs over that budget"
    )


def load_warning(config: FleetConfig, info: Mapping[str, Any]) -> str | None:
    """A line saying the load the trace puts on the fleet misses ``--utilization`` by more
    than :data:`UTILIZATION_TOLERANCE`, and why (``info``: :func:`fleet_workload`'s); None
    when it is within it. The results are the fleet at that load, not at the one asked."""
    reached = float(info["reached_utilization"])
    if abs(reached / config.utilization - 1.0) <= UTILIZATION_TOLERANCE:
        return None
    span = float(info["trace_span_s"])
    load = (
        f"the fleet's load over the {format_seconds(config.duration_s)} s window is "
        f"{reached:.3g} of its capacity, not --utilization {config.utilization:g}"
    )
    if span == 0.0:
        why = "its arrivals share one timestamp, so they are the load, all at time 0"
        fix = "a trace with a rate to scale"
    elif span < config.duration_s:
        why = (
            f"it spans {format_seconds(span)} s, shorter than --duration, so every overlaid "
            "window arrives within that span and the fleet idles after it"
        )
        fix = f"a --duration of at most {format_seconds(span)} s or a longer trace"
    elif reached > config.utilization:
        # The first arrival is always kept: a load lighter than it cannot be made.
        why = f"a load that light is less than the {info['requests']} request(s) kept"
        fix = "a higher --utilization or a longer --duration"
    else:
        why = (
            "its windows from --trace-start hold too little work (gaps between arrivals) "
            "for the load to be scaled to it"
        )
        fix = "another --trace-start or a busier trace"
    return f"--trace {config.trace}: {why}; {load}; choose {fix}"


def check_inputs(config: FleetConfig, *, quiet: bool = False) -> tuple[str, ...]:
    """Everything a run reads, checked before any work: the settings, every profile, the
    trace and its window, and the controller spec (built once on the first profile); a
    progress line while a large trace loads, unless ``quiet``. Returns the lines to warn
    of: :func:`floor_warning`'s (a budget below the fleet's floor) and
    :func:`load_warning`'s (a load that misses ``--utilization``), where they have one.

    Raises:
        UsageError, ProfileError, TraceError: one line naming the flag or file.
    """
    try:
        config.validate()
    except ValueError as error:
        raise UsageError(str(error)) from error
    try:
        plants = _plants(config.profiles, config.latency_noise)
    except ProfileError as error:
        raise UsageError(f"--profiles: {error}") from error
    first = plants[config.profiles[0]]
    # The spec itself, before the trace is read.
    spec = parse_controller_flag(config.controller, default_profile=first.profile.name)
    for name, plant in plants.items():  # a fixed clock and a cap every node's GPU takes
        profile = plant.profile
        try:
            check_fixed_clock(
                spec, profile.minimum_clock_mhz, profile.maximum_clock_mhz, config.controller
            )
        except UsageError as error:
            raise UsageError(f"{error} of {name}") from error
        try:
            check_simulated_cap(spec, profile, config.controller)
        except UsageError as error:
            raise UsageError(f"{error} (profile {name})") from error
    workload, info = fleet_workload(config, plants, quiet=quiet)

    def build() -> None:
        check = FleetNode(
            "check",
            first,
            config.controller,
            workload,
            period_s=config.control_period_s,
            floor_w=config.floor_fraction * first.power_limit_w,
            slo_target=slo_target_of(config.slo_target),
        )
        close_controller(check.controller, f"--controller {config.controller!r}")

    if outside_specs([config.controller]):
        # Built in a child process, as its cells build it (run_cell): what its factory
        # changes in its module's state is not there when they start.
        try:
            run_isolated(build, f"controller {config.controller!r}")
        except ControllerError as error:  # the refusal the child met, or its end
            message = str(error)
            raise UsageError(
                message if message.startswith("--controller") else f"--controller: {message}"
            ) from error
    else:
        build()
    lines = (floor_warning(config, plants), load_warning(config, info))
    return tuple(line for line in lines if line is not None)


def run_fleet(
    config: FleetConfig,
    *,
    spec: RunnerSpec | None = None,
    on_cell: Callable[[dict[str, Any], int, int], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Run every cell of ``config`` (``spec``: where); the JSON payload.

    ``on_progress`` receives the node-seconds simulated so far over every cell while they
    run (each control period in this process or a local pool's; a Ray cell's when it
    ends), then ``on_cell`` each finished cell's row."""
    config.validate()
    plants = _plants(config.profiles, config.latency_noise)
    workload, info = fleet_workload(config, plants)
    cells = cells_for(config)

    def report() -> None:
        if on_progress is not None:
            on_progress(progress.total())

    progress = CellProgress([cell.key for cell in cells], on_report=report)
    shared = {"config": config, "workload": workload, "plants": plants, "progress": progress}
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    done: CellDone[Any]
    for done in map_cells(
        run_cell,
        cells,
        spec=spec,
        shared=shared,
        on_event=on_event,
        label=lambda c: c.key,
        on_wait=report,
    ):
        rows.append(done.value)
        cell = cells[done.index]
        progress.report(cell.key, config.ticks * config.control_period_s * config.nodes)
        if on_cell is not None:
            on_cell(done.value, len(rows), len(cells))
    return {
        "schema": "gpugov-fleet-v1",
        "gpugov_version": __version__,
        "config": config.describe(),
        "runner": (spec or RunnerSpec()).describe(),
        "workload": info,
        "tdp_w": sum(plants[name].power_limit_w for name in config.node_profiles()),
        "slo_tolerance": SLO_TOLERANCE,
        "wall_s": time.monotonic() - started,
        "rows": summarize(config, rows),
    }


def with_overrides(config: FleetConfig, **changes: Any) -> FleetConfig:
    """``config`` with some settings changed (validated)."""
    out = replace(config, **changes)
    out.validate()
    return out


__all__ = [
    "Cell",
    "FleetConfig",
    "budget_at",
    "cells_for",
    "fleet_workload",
    "run_cell",
    "run_fleet",
    "step_metrics",
    "summarize",
]
