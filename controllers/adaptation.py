"""Online corrections an MPC applies to its model from what the node reports.

The MPC's fluid model forecasts a constant arrival rate and penalises predicted
latencies, so on its own it misjudges two things the scoreboard shows (docs/scoreboard.md):

- **bursts**: arrivals come in clumps (BurstGPT, Azure code), and a clump that lands
  just after a decision waits at the clock chosen for a quiet period;
- **model error**: the latency proxies are approximations whose error differs per GPU
  and per workload.

:class:`BurstHedge` sizes the prompt work a newly arriving request may find ahead of it
from the recent arrival history, and :class:`SLOFeedback` is integral action on the SLO
margin from the engine's measured latencies (the standard way to make a model-based
controller offset-free). Both read only what a real node observes: the arrival counter
and the windowed TTFT/TPOT the engine's metrics give.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpugov.controllers.budget import loosened
from gpugov.plant.types import ServingObservation


@dataclass
class BurstHedge:
    """The prompt tokens the TTFT proxy charges a new request, from recent bursts.

    Keeps per-period arrival counts over the last ``window_s``; a burst is the number
    of arrivals within any TTFT-SLO-long run of periods, and the hedge is ``share``
    times the ``quantile`` of those bursts times the mean prompt: on average a request
    in a burst finds half of it ahead of it.

    Args:
        quantile: burst quantile hedged against, in [0, 1].
        share: the part of a burst charged ahead of the new request, in (0, 1].
        window_s: arrival history kept, seconds.
    """

    quantile: float = 0.9
    share: float = 0.5
    window_s: float = 60.0
    _counts: deque[int] = field(default_factory=deque, repr=False)
    _previous_arrived: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"BurstHedge.quantile must lie in [0, 1], got {self.quantile!r}")
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"BurstHedge.share must lie in (0, 1], got {self.share!r}")
        if not math.isfinite(self.window_s) or self.window_s <= 0.0:
            raise ValueError(f"BurstHedge.window_s must be positive, got {self.window_s!r}")

    def update(self, observation: ServingObservation, period_s: float) -> None:
        """Count the arrivals since the previous update (one control period)."""
        arrived = observation.arrived_requests
        previous = arrived if self._previous_arrived is None else self._previous_arrived
        # A counter that goes backwards (an engine restart) counts as no arrivals.
        self._counts.append(max(0, arrived - previous))
        self._previous_arrived = arrived
        keep = max(1, int(math.ceil(self.window_s / period_s)))
        while len(self._counts) > keep:
            self._counts.popleft()

    def burst_requests(self, period_s: float, ttft_slo_s: float) -> float:
        """The ``quantile`` of arrivals within one TTFT SLO, over the kept history."""
        if not self._counts:
            return 0.0
        counts = np.fromiter(self._counts, dtype=float, count=len(self._counts))
        span = max(1, int(round(ttft_slo_s / period_s)))
        if counts.size >= span:
            # Every run of ``span`` periods (sums of whole counts: exact).
            running = np.concatenate(([0.0], np.cumsum(counts)))
            totals = running[span:] - running[:-span]
        else:
            totals = np.array([counts.sum()])
        return _linear_quantile(totals, self.quantile)

    def prompt_tokens(self, mean_prompt_tokens: float, period_s: float, ttft_slo_s: float) -> float:
        """Prompt tokens to charge a new request for the burst it may land in."""
        return self.share * self.burst_requests(period_s, ttft_slo_s) * mean_prompt_tokens


def _linear_quantile(values: np.ndarray, quantile: float) -> float:
    """``np.quantile(values, quantile)`` (its default, linear method; the same
    arithmetic) of a non-empty 1-D array by one sort: numpy's general quantile costs
    tens of microseconds a call."""
    ordered = np.sort(values)
    position = (ordered.size - 1) * quantile
    if position >= ordered.size - 1:
        return float(ordered[-1])
    below = int(math.floor(position))
    fraction = position - below
    low, high = float(ordered[below]), float(ordered[below + 1])
    difference = high - low
    if fraction >= 0.5:
        return high - difference * (1.0 - fraction)
    return low + difference * fraction


@dataclass
class SLOFeedback:
    """Integral action on the MPC's SLO margin from the engine's windowed latencies.

    Each period the pressure is the larger of windowed TTFT / TTFT SLO and windowed
    TPOT / TPOT SLO. Above ``pressure`` the scale grows by ``grow_per_s`` (per second
    of control period), otherwise it relaxes by ``relax_per_s`` back towards 1; the MPC
    divides its margin by the scale, so measured latency near the SLO tightens the
    targets the model plans against, and headroom loosens them again, slowly.

    Args:
        pressure: windowed latency over SLO above which the margin tightens.
        grow_per_s: factor the scale grows by per second under pressure (> 1).
        relax_per_s: factor the scale shrinks by per second without pressure (>= 1).
        maximum_scale: cap on the scale (the tightest margin is margin / cap).
    """

    pressure: float = 0.8
    tpot_pressure: float | None = None
    grow_per_s: float = 1.5
    relax_per_s: float = 1.02
    maximum_scale: float = 4.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.pressure > 0.0:
            raise ValueError(f"SLOFeedback.pressure must be positive, got {self.pressure!r}")
        if not self.grow_per_s > 1.0 or not self.relax_per_s >= 1.0:
            raise ValueError("SLOFeedback needs grow_per_s > 1 and relax_per_s >= 1")
        if not self.maximum_scale >= 1.0:
            raise ValueError(f"SLOFeedback.maximum_scale must be >= 1, got {self.maximum_scale!r}")

    @staticmethod
    def latency_ratios(observation: ServingObservation) -> tuple[float | None, float | None]:
        """Windowed TTFT / TTFT SLO and windowed TPOT / TPOT SLO; each None when the
        window saw no such latency or the source reports no SLO. The TTFT SLO is the one
        at the window's mean prompt where the observation carries a per-prompt allowance
        (:attr:`ServingObservation.ttft_recent_slo_s`)."""
        ttft, tpot = observation.ttft_recent_s, observation.tpot_recent_s
        ttft_ratio = tpot_ratio = None
        if ttft is not None:
            slo = observation.ttft_recent_slo_s
            if slo is not None and slo > 0 and math.isfinite(ttft):
                ttft_ratio = ttft / slo
        if tpot is not None:
            slo = observation.tpot_slo_s
            if slo is not None and slo > 0 and math.isfinite(tpot):
                tpot_ratio = tpot / slo
        return ttft_ratio, tpot_ratio

    def under_pressure(self, observation: ServingObservation, looseness: float = 1.0) -> bool:
        """Whether the windowed TTFT is above ``pressure`` of its SLO, or the windowed
        TPOT above ``tpot_pressure`` (default ``pressure``) of its SLO; both thresholds
        scaled by ``looseness`` (:class:`controllers.budget.AttainmentBudget`), never
        past the SLO itself."""
        ttft, tpot = self.latency_ratios(observation)
        tpot_limit = self.pressure if self.tpot_pressure is None else self.tpot_pressure
        return (ttft is not None and ttft > loosened(self.pressure, looseness)) or (
            tpot is not None and tpot > loosened(tpot_limit, looseness)
        )

    def update(
        self,
        observation: ServingObservation,
        period_s: float,
        looseness: float = 1.0,
        *,
        ahead: bool = False,
    ) -> float:
        """Fold one period's measured latencies in; return the new scale.

        ``ahead``: the attainment budget is ahead of its target
        (:attr:`controllers.budget.AttainmentBudget.ahead`). The windowed mean latency is
        a proxy for the requests' attainment, which is then measured to have slack: it
        does not tighten the margin, which keeps relaxing."""
        if not ahead and self.under_pressure(observation, looseness):
            self.scale = min(self.maximum_scale, self.scale * self.grow_per_s**period_s)
        else:
            self.scale = max(1.0, self.scale / self.relax_per_s**period_s)
        return self.scale
