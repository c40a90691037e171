"""One simulated fleet node: a plant with its own profile, its controller built by the
node's factory inside the node's safety chain, and the power cap the fleet hands it.

The cap reaches the node as a run-time power cap on its GPU (the plant's firmware power
controller, ``PlantSimulation.set_power_cap``: what ``nvidia-smi -pl`` sets, acting on
power averaged over ``power_cap_window_s``), so the controller sees it as the power limit
in its next observation, as a node sees NVML's enforced limit. A controller that sets a
cap of its own (``PowerCapping``) gets the lower of the two.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.contract import ControllerWrapper, controller_label, power_needed
from gpugov.daemon.cli_support import UsageError, parse_controller_flag
from gpugov.daemon.controller_spec import shown_spec
from gpugov.daemon.decide import ControllerContext, Forecasts, build_controller
from gpugov.daemon.errors import ControllerError as GpugovControllerError
from gpugov.daemon.safety import SafetySettings
from gpugov.plant import ServingPlant
from gpugov.plant.closed_loop import ControllerError as PlantControllerError
from gpugov.plant.closed_loop import ObservationView
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.simulator import PlantSimulation
from gpugov.plant.types import PowerCapping, Request, ServingObservation


@dataclass(frozen=True, slots=True)
class Need:
    """A node's published need: the watts holding its SLO needs now, and the standard
    deviation of that estimate."""

    watts: float
    sigma_w: float = 0.0


def node_controller(
    spec: str,
    plant: ServingPlant,
    workload: Sequence[Request],
    period_s: float,
    safety: SafetySettings | None,
    slo_target: SLOTarget | None = None,
    forecasts: Forecasts | None = None,
) -> ControllerWrapper:
    """``spec``'s controller as a node runs it: the node's factory and safety chain with
    the budget guard (the observation's power limit holds the clock by the controller's
    own model, ``controllers/power_need.py``) and the domain's SLO target. ``forecasts``:
    those ``workload`` declares, when the caller has them (a fleet's nodes share one)."""
    config = parse_controller_flag(spec, default_profile=plant.profile.name)
    declared: dict[str, Any] = {} if forecasts is None else {"forecasts": forecasts}
    context = ControllerContext.for_plant(
        plant,
        workload,
        period_s=period_s,
        **declared,
        safety=safety,
        budget_guard=True,
        slo_target=slo_target,
    )
    try:
        return build_controller(config, context)
    except GpugovControllerError as error:
        raise UsageError(f"--controller {shown_spec(spec)}: {error}") from error


class FleetNode:
    """A plant, its controller in the safety chain, its cap; stepped one control period at
    a time by the fleet, with requests dispatched to it by the router. The controller
    observes through ``view`` (``daemon.simulated.node_view``: what the node's daemon
    derives from its engine's page), the router the plant's own state."""

    def __init__(
        self,
        name: str,
        plant: ServingPlant,
        controller_spec: str,
        forecast_workload: Sequence[Request],
        *,
        period_s: float,
        floor_w: float,
        safety: SafetySettings | None = None,
        seed: int = 0,
        view: ObservationView | None = None,
        slo_target: SLOTarget | None = None,
        forecasts: Forecasts | None = None,
    ) -> None:
        """``forecasts``: :meth:`Forecasts.from_workload` of ``forecast_workload`` where
        the caller has it; a fleet computes it once for all its nodes (each node read the
        whole fleet's workload, and building 2,000 nodes took minutes)."""
        self.name = name
        self.plant = plant
        self.profile_name = plant.profile.name
        self.period_s = period_s
        self.tdp_w = float(plant.power_limit_w)
        self.floor_w = float(min(floor_w, self.tdp_w))
        self.simulation = PlantSimulation((), plant, chunked_prefill_scheduler, seed=seed)
        self._exact = view is None
        self._observe = self.simulation.observe if view is None else view(self.simulation)
        """What the node's controller observes (``view``: a node's, from its engine's
        page; without one, the plant's exact state)."""
        self.controller = node_controller(
            controller_spec, plant, forecast_workload, period_s, safety, slo_target, forecasts
        )
        self.cap_w = self.tdp_w
        self.tokens_per_s = 1.0
        """The node's serving rate at its top clock on the fleet's mix (tokens per second;
        what ``least-work`` weighs its outstanding tokens by; the fleet sets it)."""
        self._pending: deque[Request] = deque()
        self._pending_prompt_tokens = 0
        """The prompt tokens of ``_pending``, kept as it changes: a router reads it for
        every node at every request (summed anew, quadratic in a large fleet)."""
        self.dispatched_prompt_tokens = 0
        self.observation: ServingObservation | None = None
        self.need: Need | None = None
        self.need_seen = False
        self._need_sum = 0.0
        self._sigma_sum = 0.0
        self._need_count = 0

    @property
    def publishes_need(self) -> bool:
        """Whether the node's controller has published a need (``power_needed``) so far."""
        return self.need is not None or self.need_seen

    @property
    def energy_j(self) -> float:
        """Energy the node's GPU drew since the start."""
        return self.simulation.energy_j

    def dispatch(self, request: Request) -> None:
        """Queue a routed request; it reaches the engine at its arrival time."""
        self._pending.append(request)
        self._pending_prompt_tokens += request.prompt_tokens
        self.dispatched_prompt_tokens += request.prompt_tokens

    def outstanding_tokens(self) -> float:
        """Tokens a router counts against this node: prompt tokens queued for prefill,
        dispatched but not yet arrived, and the KV tokens of running requests (what the
        engine's gauges and the router's own dispatch log tell it)."""
        pending = self._pending_prompt_tokens
        observation = self.observation
        if observation is None:
            return float(pending)
        return float(pending) + observation.prefill_remaining_tokens + observation.kv_tokens

    def set_cap(self, cap_w: float) -> None:
        """Hand the node a new power cap (watts), effective at once on its GPU."""
        self.cap_w = float(min(self.tdp_w, max(self.floor_w, cap_w)))
        self._apply_cap()

    def _apply_cap(self) -> None:
        cap = self.cap_w
        if isinstance(self.controller, PowerCapping):
            own = self.controller.requested_power_cap_w
            if own is not None and math.isfinite(own) and own > 0.0:
                cap = min(cap, float(own))
        self.simulation.set_power_cap(None if cap >= self.tdp_w else cap)

    def start(self) -> None:
        """The node's first control decision, at 0 s before any request: a node's daemon
        decides from its first tick, as ``simulate`` and ``run --simulate`` call their
        controller at 0 s (a fleet's node first decided one period in)."""
        self.step(0.0)

    def step(self, end_s: float) -> None:
        """Run the engine to ``end_s`` (requests arriving at their times), then one control
        decision: observe, decide, apply the clock and the cap, read the need."""
        simulation = self.simulation
        pending = self._pending
        while pending and pending[0].arrival_time_s <= end_s:
            request = pending.popleft()
            self._pending_prompt_tokens -= request.prompt_tokens
            simulation.advance_to(request.arrival_time_s)
            simulation.add_request(request.prompt_tokens, request.output_tokens)
        simulation.advance_to(end_s)
        # The controller reads its view, the router and the fleet's accounting the plant.
        # The view first: each PlantSimulation.observe() starts a new latency window, and
        # a node's page takes its inter-token latencies from the window it observes.
        observed = self._observe()
        self.observation = observed if self._exact else simulation.observe()
        try:
            clock = float(self.controller(observed))
        except Exception as error:  # one line naming the controller, node and time
            raise PlantControllerError(
                f"controller {controller_label(self.controller)!r} on node {self.name} raised "
                f"at t={observed.time_s:.3f}s (step {observed.step_index}): {error}"
            ) from None
        simulation.request_clock(clock)
        self._apply_cap()
        need = power_needed(self.controller)
        self.need = None if need is None else Need(need.watts, need.uncertainty_w)
        if need is not None:
            self.need_seen = True
            self._need_sum += need.watts
            self._sigma_sum += need.uncertainty_w
            self._need_count += 1

    def take_mean_need(self) -> Need | None:
        """The mean published need since the previous call (what a fleet owner reads as
        ``avg_over_time`` of the node's need over its period), then start again; None
        when none was published."""
        count = self._need_count
        mean = None if count == 0 else Need(self._need_sum / count, self._sigma_sum / count)
        self._need_sum = self._sigma_sum = 0.0
        self._need_count = 0
        return mean
