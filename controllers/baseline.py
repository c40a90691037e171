"""Baseline clock controllers: maximum, fixed, the reactive governor, sample-and-hold.

Each is a callable ``ServingObservation -> requested clock (MHz)``; none does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpugov.plant.types import ClockController, ServingObservation


def _require_clocks(observation: ServingObservation, who: str) -> tuple[float, ...]:
    clocks = observation.supported_clocks_mhz
    if not clocks:
        raise ValueError(f"{who} needs observation.supported_clocks_mhz (got an empty tuple)")
    return clocks


def maximum_clock_controller(observation: ServingObservation) -> float:
    """Always request the highest supported clock (the default GPU behaviour under load)."""
    return float(_require_clocks(observation, "maximum_clock_controller")[-1])


# Controllers carry gpugov's one name for them (the --controller spec, the metrics label).
maximum_clock_controller.__name__ = "max"


@dataclass(frozen=True, slots=True)
class FixedClockController:
    """Request one fixed clock (quantised downward by the actuator or plant)."""

    clock_mhz: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.clock_mhz) or self.clock_mhz <= 0.0:
            raise ValueError(f"fixed clock must be positive, got {self.clock_mhz!r}")

    @property
    def __name__(self) -> str:
        return f"fixed:{self.clock_mhz:g}"

    def __call__(self, observation: ServingObservation) -> float:
        return float(self.clock_mhz)


def fixed_clock_controller(clock_mhz: float) -> FixedClockController:
    """A controller that always requests ``clock_mhz``."""
    return FixedClockController(float(clock_mhz))


@dataclass(frozen=True, slots=True)
class ReactiveGovernor:
    """A queue- and latency-driven step governor in the spirit of Linux's ``ondemand``.

    Stateless: it reads the current requested clock from the observation, so one
    instance can serve every GPU. Rules, in order, each period:

    1. Pressure (waiting prompts above ``queue_high`` per-iteration worth of tokens, or a
       windowed TTFT/TPOT above ``up_fraction`` of its SLO): jump to the maximum clock,
       as ``ondemand`` jumps to the top frequency when load crosses its up-threshold.
    2. Idle (utilisation below ``idle_utilization`` and nothing queued or running): go
       to the minimum clock.
    3. Slack (nothing waiting, windowed TTFT and TPOT below ``down_fraction`` of their
       SLOs): step down by ``step_mhz``.
    4. Otherwise hold.

    Without SLOs in the observation only the queue and utilisation rules apply.
    """

    up_fraction: float = 0.8
    down_fraction: float = 0.5
    queue_high_tokens: float = 2048.0
    idle_utilization: float = 0.05
    step_mhz: float = 105.0

    @property
    def __name__(self) -> str:
        return "reactive"

    def __call__(self, observation: ServingObservation) -> float:
        clocks = _require_clocks(observation, "ReactiveGovernor")
        minimum, maximum = float(clocks[0]), float(clocks[-1])
        current = observation.requested_clock_mhz
        current = maximum if current is None else float(current)
        ttft, tpot = observation.ttft_recent_s, observation.tpot_recent_s
        ttft_slo, tpot_slo = observation.ttft_slo_s, observation.tpot_slo_s
        ttft_high = ttft is not None and ttft_slo is not None and ttft > self.up_fraction * ttft_slo
        tpot_high = tpot is not None and tpot_slo is not None and tpot > self.up_fraction * tpot_slo
        if observation.prefill_remaining_tokens > self.queue_high_tokens or ttft_high or tpot_high:
            return maximum
        utilization = observation.gpu_utilization
        nothing_to_do = observation.decode_active == 0 and observation.waiting_requests == 0
        if nothing_to_do and (utilization is None or utilization < self.idle_utilization):
            return minimum
        ttft_low = ttft is None or ttft_slo is None or ttft < self.down_fraction * ttft_slo
        tpot_low = tpot is None or tpot_slo is None or tpot < self.down_fraction * tpot_slo
        if observation.waiting_requests == 0 and ttft_low and tpot_low:
            return max(minimum, current - self.step_mhz)
        return min(maximum, max(minimum, current))


reactive_clock_controller = ReactiveGovernor()


class SampleAndHoldController:
    """Call ``controller`` once per ``period_s`` and hold its answer in between."""

    def __init__(self, controller: ClockController, period_s: float) -> None:
        if not math.isfinite(period_s) or period_s <= 0.0:
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        self.controller = controller
        self.period_s = float(period_s)
        self._last_index: int | None = None
        self._held: float | None = None
        inner = getattr(controller, "__name__", type(controller).__name__)
        self.__name__ = f"sample_and_hold({inner}, {period_s:g}s)"

    def __call__(self, observation: ServingObservation) -> float:
        index = math.floor((observation.time_s + 1e-12) / self.period_s)
        if self._held is None or index != self._last_index:
            self._held = float(self.controller(observation))
            self._last_index = index
        return self._held

    def diagnostics(self) -> object:
        """Forward the inner controller's diagnostics when it has them."""
        inner: Callable[[], object] | None = getattr(self.controller, "diagnostics", None)
        return inner() if inner is not None else None


def sample_and_hold_clock_controller(
    controller: ClockController, period_s: float = 1.0
) -> SampleAndHoldController:
    """Wrap ``controller`` so it is consulted at most once per ``period_s`` (the seed's name)."""
    return SampleAndHoldController(controller, period_s)
