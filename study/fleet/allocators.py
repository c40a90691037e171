"""Fleet power-budget allocators: split a fleet's watt budget into per-node power caps.

Every allocator is a pure function of the nodes' reports and the budget, run every
allocator period (15 s by default, Dynamo's node-agent period) and at a grid signal. Each
returns one cap per node, within the node's cap range ``[floor_w, tdp_w]``, summing to the
budget whenever the budget lies between the summed floors and the summed TDPs (below the
floors every node sits at its floor; above the TDPs every node at its TDP).

* ``uniform`` (Dynamo's planner, phase 1): one cap for every node, the budget split evenly;
  a node whose range clips the even share hands the difference to the others (the one
  level where the clipped caps sum to the budget).
* ``dps`` (NVIDIA DPS-style steering from measured power): a node drawing well under its
  cap gives half its slack back; the freed watts, and any change of the budget, go first to
  the nodes pressing their caps (a cut comes first from the nodes with slack).
* ``slo`` (gpugov's, from each node's published need): every node gets the power its
  controller says holding its SLO needs (its mean over the allocator period plus one
  standard deviation of its uncertainty); the rest of the budget is evened out as uniform
  caps would be, at one level that no node's need undercuts (the need is a floor on the
  even share, not a ceiling: it is a mean, and bursts need more). When the needs sum to
  more than the budget, every node gets its floor plus the same
  fraction of its need above the floor (the shortfall shared in proportion to need), so no
  node is starved first and the rule is predictable. A node that publishes no need is
  counted at its measured power plus the DPS margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ALLOCATORS = ("uniform", "dps", "slo")
"""The allocators ``gpugov fleet`` compares, in table order."""

DPS_MARGIN_FRACTION = 0.05
"""A node within this fraction of its TDP below its cap is pressing it (DPS margin)."""
DPS_GIVE_BACK = 0.5
"""Fraction of a node's slack (cap minus power minus margin) it gives back per tick."""
NEED_SIGMAS = 1.0
"""Standard deviations of the need's uncertainty added to the need (about 84% cover)."""


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the allocator knows of one node at a tick: its cap range, its cap, the power it
    drew over the last allocator period, and its published need (None: not published)."""

    floor_w: float
    tdp_w: float
    cap_w: float
    power_w: float
    need_w: float | None = None
    need_sigma_w: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.floor_w) and 0.0 < self.floor_w <= self.tdp_w):
            raise ValueError(f"node cap range [{self.floor_w}, {self.tdp_w}] W is not valid")


Allocator = Callable[[Sequence[NodeReport], float], list[float]]


def level_fill(
    budget_w: float,
    base: Sequence[float],
    weight: Callable[[int, float], float],
    low: Sequence[float],
    high: Sequence[float],
) -> list[float]:
    """Caps ``clip(base_i + weight(i, L) * L, low_i, high_i)`` at the level ``L`` where they
    sum to ``budget_w`` (bisection; each term is non-decreasing in ``L``). Below the summed
    ``low`` every cap is its low end, above the summed ``high`` its high end."""
    n = len(base)
    if budget_w <= sum(low):
        return list(low)
    if budget_w >= sum(high):
        return list(high)

    def caps(level: float) -> list[float]:
        return [min(high[i], max(low[i], base[i] + weight(i, level) * level)) for i in range(n)]

    span = max(high) + max(abs(b) for b in base) + 1.0
    lo, hi = -span, span
    while sum(caps(hi)) < budget_w:
        hi *= 2.0
    while sum(caps(lo)) > budget_w:
        lo *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if sum(caps(mid)) < budget_w:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9:
            break
    out = caps(hi)
    # Spread the bisection's last fraction of a watt over the nodes not at an end.
    rest = budget_w - sum(out)
    free = [i for i in range(n) if low[i] < out[i] < high[i]]
    for i in free:
        out[i] = min(high[i], max(low[i], out[i] + rest / len(free)))
    return out


def _ranges(nodes: Sequence[NodeReport]) -> tuple[list[float], list[float]]:
    return [n.floor_w for n in nodes], [n.tdp_w for n in nodes]


def uniform(nodes: Sequence[NodeReport], budget_w: float) -> list[float]:
    """One cap for all: the even share, clipped to each range, at the level that sums to
    the budget (Dynamo phase 1)."""
    low, high = _ranges(nodes)
    return level_fill(budget_w, [0.0] * len(nodes), lambda i, level: 1.0, low, high)


def dps(nodes: Sequence[NodeReport], budget_w: float) -> list[float]:
    """Steer watts from measured power: nodes under their cap give back half their slack;
    the pool (and any budget change) goes to the nodes pressing their caps first."""
    low, high = _ranges(nodes)
    base: list[float] = []
    pressing: list[bool] = []
    for node in nodes:
        margin = DPS_MARGIN_FRACTION * node.tdp_w
        slack = node.cap_w - node.power_w - margin
        pressing.append(slack <= 0.0)
        base.append(node.cap_w - DPS_GIVE_BACK * max(0.0, slack))
    if not any(pressing):
        pressing = [True] * len(nodes)

    def weight(i: int, level: float) -> float:
        # Watts added go to the pressing nodes first, watts taken come from the others.
        favoured = pressing[i] if level >= 0.0 else not pressing[i]
        return 1.0 if favoured else 0.1

    return level_fill(budget_w, base, weight, low, high)


def need_of(node: NodeReport) -> float:
    """A node's need for the allocator: its published need plus ``NEED_SIGMAS`` standard
    deviations (measured power plus the DPS margin where it publishes none), in range."""
    if node.need_w is not None and math.isfinite(node.need_w):
        sigma = node.need_sigma_w if node.need_sigma_w and math.isfinite(node.need_sigma_w) else 0.0
        need = node.need_w + NEED_SIGMAS * max(0.0, sigma)
    else:
        need = node.power_w + DPS_MARGIN_FRACTION * node.tdp_w
    return min(node.tdp_w, max(node.floor_w, need))


def slo_aware(nodes: Sequence[NodeReport], budget_w: float) -> list[float]:
    """Each node's need, then the rest evened out (one level, as uniform caps, that no
    node's need undercuts); under a budget below the summed needs, the floor plus the same
    fraction of every node's need above it."""
    low, high = _ranges(nodes)
    needs = [need_of(node) for node in nodes]
    if budget_w >= sum(needs):
        # Needs first; the rest raises the lowest caps first, as uniform caps would.
        return level_fill(budget_w, [0.0] * len(nodes), lambda i, level: 1.0, needs, high)
    span = [needs[i] - low[i] for i in range(len(nodes))]
    return level_fill(budget_w, low, lambda i, lv: span[i] / max(high), low, needs)


ALLOCATOR_FUNCTIONS: dict[str, Allocator] = {"uniform": uniform, "dps": dps, "slo": slo_aware}
