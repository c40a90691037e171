"""The best static power cap in hindsight: an oracle like ``best-fixed``, for the cap.

Not a controller a node can run: it simulates the whole scenario under each candidate cap
(the top clock requested, as :class:`~gpugov.controllers.peers.power_cap.StaticPowerCap`
runs it) and keeps the lowest-energy cap whose run holds the SLO
(:func:`gpugov.controllers.oracles.holds_slo`). It bounds what any static cap can do on a
scenario, as ``best-fixed`` bounds any fixed clock.

Search: caps are ``fractions`` of the board limit (20 % to 100 % in 5 % steps). The
lowest holding cap is found by bisection (a lower cap never runs faster), then the caps
just above it are simulated too (a slightly higher cap can finish sooner and spend less),
and the lowest-energy holding run is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpugov.controllers.oracles.common import (
    SLO_TOLERANCE,
    holds_slo,
    lowest_holding,
    maximum_clock_reference,
)
from gpugov.controllers.peers.power_cap import StaticPowerCap
from gpugov.plant.closed_loop import simulate
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.types import Request, Scheduler

DEFAULT_FRACTIONS = tuple(float(f) for f in np.round(np.arange(0.2, 1.0001, 0.05), 2))


@dataclass(frozen=True)
class BestStaticCap:
    """Result of :func:`best_static_cap`: the cap, its run and every cap simulated
    (``(cap W, energy J, SLO attainment, holds)`` in the order evaluated)."""

    cap_w: float
    result: ServingResult
    evaluations: tuple[tuple[float, float, float | None, bool], ...]
    reference_attainment: float | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary."""
        return {
            "cap_w": self.cap_w,
            "energy_j": self.result.metrics.energy_j,
            "slo_attainment": self.result.metrics.slo_attainment,
            "reference_attainment": self.reference_attainment,
            "simulations": len(self.evaluations),
            "evaluations": [
                {"cap_w": c, "energy_j": e, "slo_attainment": a, "holds_slo": h}
                for c, e, a, h in self.evaluations
            ],
        }


def best_static_cap(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    reference: ServingResult | None = None,
    tolerance: float = SLO_TOLERANCE,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    neighbours: int = 2,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> BestStaticCap:
    """The lowest-energy static cap whose run holds the SLO (module notes).

    Raises:
        ValueError: an empty workload or no fractions.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("best_static_cap needs at least one request")
    caps = sorted({float(f) * plant.power_limit_w for f in fractions if 0.0 < f <= 1.0})
    if not caps:
        raise ValueError("best_static_cap needs fractions in (0, 1]")
    if reference is None:
        reference = maximum_clock_reference(
            requests, plant, scheduler, seed=seed, control_period_s=control_period_s
        )
    target = reference.metrics.slo_attainment
    runs: dict[int, ServingResult] = {}
    order: list[int] = []

    def run(index: int) -> ServingResult:
        if index not in runs:
            runs[index] = simulate(
                requests,
                plant,
                scheduler,
                StaticPowerCap(cap_w=caps[index]),
                seed,
                controller_name="best-cap",
                control_period_s=control_period_s,
            )
            order.append(index)
        return runs[index]

    def holds(index: int) -> bool:
        return holds_slo(run(index).metrics.slo_attainment, target, tolerance)

    top = len(caps) - 1
    if holds(0):
        lowest = 0
    elif not holds(top):  # not even the highest cap holds: it is the choice
        lowest = top
    else:
        lowest = lowest_holding(holds, top)
    for index in range(lowest + 1, min(top, lowest + neighbours) + 1):
        run(index)
    holding = [i for i in runs if holds(i)] or [top]
    chosen = min(holding, key=lambda i: (run(i).metrics.energy_j, -i))
    return BestStaticCap(
        cap_w=caps[chosen],
        result=run(chosen),
        evaluations=tuple(
            (
                caps[i],
                runs[i].metrics.energy_j,
                runs[i].metrics.slo_attainment,
                holds_slo(runs[i].metrics.slo_attainment, target, tolerance),
            )
            for i in order
        ),
        reference_attainment=target,
    )
