"""The closed loop on the plant: a clock controller called every control period on a
:class:`PlantSimulation` until every request finished or the horizon passed."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gpugov.plant.gpu_physics import _EPS
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.simulator import PlantSimulation
from gpugov.plant.types import (
    ClockController,
    PowerCapping,
    Request,
    Scheduler,
    ServingObservation,
)

ObservationView = Callable[[PlantSimulation], Callable[[], ServingObservation]]
"""Given a simulation, the function that makes each tick's observation of it."""


class ControllerError(RuntimeError):
    """A clock controller raised or returned an invalid clock; the message says when."""


def _controller_name(controller: Callable[..., Any]) -> str:
    return str(getattr(controller, "__name__", type(controller).__name__))


def simulate(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    controller: ClockController | None = None,
    seed: int = 0,
    *,
    controller_name: str | None = None,
    scheduler_name: str | None = None,
    control_period_s: float = 1.0,
    horizon_s: float | None = None,
    on_progress: Callable[[float, PlantSimulation], None] | None = None,
    progress_every_s: float = 10.0,
    view: ObservationView | None = None,
) -> ServingResult:
    """Run ``workload`` on ``plant`` with ``controller`` called every ``control_period_s``.

    A controller that sets a power cap (:class:`~gpugov.plant.types.PowerCapping`) has its
    ``requested_power_cap_w`` applied after each decision.

    The run ends when every request has finished, or at ``horizon_s`` (default:
    :meth:`ServingPlant.run_horizon_s`, the drain timeout after the last arrival or the
    last SLO deadline); requests unfinished then are censored.
    ``on_progress(time_s, simulation)``, when given, is called at the first control tick
    at or after every ``progress_every_s`` simulated seconds (the plant itself never
    prints; a CLI turns the call into a progress line).

    ``view``, when given, makes the controller's observation: called once with the
    simulation, it returns the function each tick calls (a node's view:
    ``daemon.simulated.node_view``). Without it the controller sees
    :meth:`PlantSimulation.observe`, the plant's exact state.

    Raises:
        ControllerError: the controller raised (chained) or returned a non-finite clock.
    """
    if controller is None:
        raise ValueError("simulate needs a clock controller")
    if not math.isfinite(control_period_s) or control_period_s <= 0.0:
        raise ValueError(f"control_period_s must be positive, got {control_period_s!r}")
    simulation = PlantSimulation(workload, plant, scheduler, seed=seed)
    requests = simulation.requests
    horizon = plant.run_horizon_s(requests) if horizon_s is None else float(horizon_s)
    if horizon <= 0.0:
        raise ValueError(f"horizon_s must be positive, got {horizon!r}")
    name = controller_name or _controller_name(controller)
    observe = simulation.observe if view is None else view(simulation)
    for _ in control_ticks(simulation, horizon, control_period_s, on_progress, progress_every_s):
        apply_decision(
            controller,
            f"controller {name!r}",
            observe(),
            simulation.request_clock,
            simulation.set_power_cap,
        )
    return simulation.result(
        controller_name=name,
        scheduler_name=scheduler_name or "",
        control_period_s=control_period_s,
        horizon_s=horizon,
    )


def control_ticks(
    simulation: Any,
    horizon_s: float,
    control_period_s: float,
    on_progress: Callable[[float, Any], None] | None = None,
    progress_every_s: float = 10.0,
) -> Iterator[float]:
    """The control instants of a closed-loop run: advance ``simulation`` to each tick and
    yield it, until every request has finished (after the first tick) or ``horizon_s``
    (where the simulation is advanced to and the ticks stop); ``on_progress`` is called at
    the first tick at or after every ``progress_every_s`` simulated seconds."""
    step = 0
    next_progress_s = 0.0
    while True:
        tick = step * control_period_s
        if tick > horizon_s + _EPS:
            simulation.advance_to(horizon_s, stop_when_done=True)
            return
        simulation.advance_to(tick, stop_when_done=True)
        if on_progress is not None and tick >= next_progress_s:
            on_progress(simulation.time_s, simulation)
            next_progress_s = tick + progress_every_s
        if simulation.done and step > 0:
            return
        yield tick
        step += 1


def apply_decision(
    controller: ClockController,
    who: str,
    observation: ServingObservation,
    set_clock: Callable[[float], object],
    set_cap: Callable[[float | None], object],
) -> None:
    """Call ``controller`` (named ``who`` in errors) on ``observation`` and apply its clock
    with ``set_clock``, and its power cap with ``set_cap`` when it sets one
    (:class:`~gpugov.plant.types.PowerCapping`).

    Raises:
        ControllerError: the controller raised (chained), returned something that is not
            a finite clock, or asked for a bad power cap.
    """
    try:
        requested = controller(observation)
    except Exception as error:
        raise ControllerError(
            f"{who} raised at t={observation.time_s:.3f}s (step {observation.step_index}): {error}"
        ) from error
    try:
        value = float(requested)
    except (TypeError, ValueError) as error:
        raise ControllerError(
            f"{who} returned {requested!r} at t={observation.time_s:.3f}s; expected a clock in MHz"
        ) from error
    if not math.isfinite(value):
        raise ControllerError(
            f"{who} returned a non-finite clock {value!r} at t={observation.time_s:.3f}s"
        )
    set_clock(value)
    if isinstance(controller, PowerCapping):
        cap = controller.requested_power_cap_w
        try:
            set_cap(cap)
        except (TypeError, ValueError) as error:
            raise ControllerError(
                f"{who} asked for power cap {cap!r} at t={observation.time_s:.3f}s: {error}"
            ) from error
