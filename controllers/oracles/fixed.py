"""The best fixed clock in hindsight: the lowest-energy supported clock whose run holds
the SLO, by bisection, a coarse scan and refinement (rules in
``controllers/oracles/__init__.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpugov.controllers.oracles.common import (
    SLO_TOLERANCE,
    _run_fixed,
    holds_slo,
    lowest_holding,
    maximum_clock_reference,
)
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.types import Request, Scheduler


# ---------------------------------------------------------------- best fixed clock
@dataclass(frozen=True, slots=True)
class ClockEvaluation:
    """One simulated fixed-clock run of the best-fixed search."""

    clock_mhz: float
    energy_j: float
    slo_attainment: float | None
    holds_slo: bool


@dataclass(frozen=True)
class BestFixedClock:
    """Result of :func:`best_fixed_clock`.

    ``evaluations`` lists every clock simulated, in the order evaluated;
    ``lowest_holding_clock_mhz`` is the bisection's answer (the lowest clock found to
    hold the SLO).
    """

    clock_mhz: float
    result: ServingResult
    evaluations: tuple[ClockEvaluation, ...]
    lowest_holding_clock_mhz: float
    reference_attainment: float | None
    tolerance: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (the run's metrics are not repeated)."""
        return {
            "clock_mhz": self.clock_mhz,
            "energy_j": self.result.metrics.energy_j,
            "slo_attainment": self.result.metrics.slo_attainment,
            "lowest_holding_clock_mhz": self.lowest_holding_clock_mhz,
            "reference_attainment": self.reference_attainment,
            "tolerance": self.tolerance,
            "simulations": len(self.evaluations),
            "evaluations": [
                {
                    "clock_mhz": e.clock_mhz,
                    "energy_j": e.energy_j,
                    "slo_attainment": e.slo_attainment,
                    "holds_slo": e.holds_slo,
                }
                for e in self.evaluations
            ],
        }


def best_fixed_clock(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    reference: ServingResult | None = None,
    tolerance: float = SLO_TOLERANCE,
    coarse_points: int = 5,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> BestFixedClock:
    """The lowest-energy fixed clock whose run holds the SLO (see the module notes).

    Args:
        workload: the requests (the oracle reads their output lengths via the plant).
        plant: the plant to simulate.
        scheduler: the engine's batching rule.
        reference: the maximum-clock run (simulated here when ``None``); it is also the
            maximum clock's evaluation.
        tolerance: SLO attainment slack against the reference (fraction).
        coarse_points: evenly spaced clocks between the lowest holding clock and the
            maximum, before refinement.
        seed: plant seed (latency jitter), the same for every run.
        control_period_s: how often the fixed clock is requested.

    Raises:
        ValueError: an empty workload or ``coarse_points < 2``.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("best_fixed_clock needs at least one request")
    if coarse_points < 2:
        raise ValueError(f"coarse_points must be >= 2, got {coarse_points}")
    clocks = plant.profile.clock_mhz
    top = clocks.size - 1
    if reference is None:
        reference = maximum_clock_reference(
            requests, plant, scheduler, seed=seed, control_period_s=control_period_s
        )
    reference_attainment = reference.metrics.slo_attainment
    runs: dict[int, ServingResult] = {top: reference}
    order: list[int] = [top]

    def evaluate(index: int) -> ServingResult:
        if index not in runs:
            runs[index] = _run_fixed(
                requests, plant, scheduler, float(clocks[index]), seed, control_period_s
            )
            order.append(index)
        return runs[index]

    def holds(index: int) -> bool:
        attainment = evaluate(index).metrics.slo_attainment
        return holds_slo(attainment, reference_attainment, tolerance)

    def energy(index: int) -> float:
        return evaluate(index).metrics.energy_j

    # 1. Bisection for the lowest holding index (the top one holds by definition).
    lowest = lowest_holding(holds, top)
    # 2. Coarse grid over [lowest, top].
    grid = np.unique(np.linspace(lowest, top, coarse_points).round().astype(int))
    for index in grid:
        evaluate(int(index))

    def best_holding() -> int:
        holding = [i for i in runs if i >= lowest and holds(i)]
        return min(holding, key=lambda i: (energy(i), -i))

    # 3. Refinement with halving steps around the best holding clock.
    step = max(1, int(math.ceil((top - lowest) / max(1, grid.size - 1) / 2.0)))
    while True:
        center = best_holding()
        for neighbour in (center - step, center + step):
            if lowest <= neighbour <= top:
                evaluate(neighbour)
        if step == 1:
            # A last pass at step 1 until the best stops moving.
            if best_holding() == center:
                break
            continue
        step = max(1, step // 2)
    chosen = best_holding()
    evaluations = tuple(
        ClockEvaluation(
            clock_mhz=float(clocks[i]),
            energy_j=energy(i),
            slo_attainment=runs[i].metrics.slo_attainment,
            holds_slo=holds(i),
        )
        for i in order
    )
    return BestFixedClock(
        clock_mhz=float(clocks[chosen]),
        result=runs[chosen],
        evaluations=evaluations,
        lowest_holding_clock_mhz=float(clocks[lowest]),
        reference_attainment=reference_attainment,
        tolerance=tolerance,
    )
