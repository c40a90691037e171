"""The controllers every scoreboard scenario runs, built the way the daemon builds them
(the MPCs through its own factory), each under its one name."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpugov.controllers.baseline import maximum_clock_controller, reactive_clock_controller
from gpugov.controllers.mpc import (
    MPCController,
    expected_output_tokens_forecast,
)
from gpugov.controllers.open_loop import OpenLoopClockController, optimize_open_loop
from gpugov.daemon.config import MPCControllerConfig
from gpugov.daemon.service import simulated_mpc
from gpugov.plant import ServingPlant
from gpugov.plant.types import ClockController, Request
from gpugov.study.online_eval import (
    scoreboard_online,
)
from gpugov.study.scoreboard_scenarios import (
    LABELS,
)


# ---------------------------------------------------------------------- controllers
@dataclass(frozen=True)
class ControllerEntry:
    """One online controller of the scoreboard: a key, a label and a factory."""

    key: str
    label: str
    build: Callable[[], ClockController]
    control_period_s: float | None = None
    """The controller's own control period; None runs it at the scenario's."""


def scoreboard_mpc(
    plant: ServingPlant,
    workload: Sequence[Request],
    kind: str,
    *,
    control_period_s: float = 1.0,
    horizon_s: float = 10.0,
    solve_time_limit_s: float = 0.8,
) -> MPCController:
    """The MPC of config kind ``kind`` (``mpc``: the fast solver and model; ``mpc-slsqp``:
    the seed's) exactly as the daemon's simulated mode builds it
    (:func:`daemon.service.simulated_mpc`), with forecasts declared from the workload
    before the run."""
    spec = MPCControllerConfig(
        kind=kind,  # type: ignore[arg-type]
        horizon_s=horizon_s,
        solve_time_limit_s=solve_time_limit_s,
    )
    controller = simulated_mpc(spec, plant, workload, control_period_s)
    assert isinstance(controller, MPCController)
    return controller


def build_scoreboard_controllers(
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float = 1.0,
    mpc_horizon_s: float = 10.0,
    mpc_solve_time_limit_s: float = 0.8,
    fast_mpc_period_s: float | None = None,
) -> list[ControllerEntry]:
    """The online controllers of the scoreboard, in table order (the one place to swap
    one in: keys ``max``, ``reactive``, ``open-loop``, ``mpc-slsqp``, ``mpc``).

    The MPCs are the daemon's config kinds ``mpc-slsqp`` (the seed's SLSQP solver and
    fluid model, the reference) and ``mpc`` (the fast discrete-search solver with its
    latency model, SLO margin, burst hedge and SLO feedback), built by
    :func:`scoreboard_mpc`. The fast MPC runs every ``fast_mpc_period_s`` (default: the
    scenario's period) over the same horizon in seconds, since its solve time allows it.

    The open-loop plan (:func:`optimize_open_loop`) covers the scenario to 60 s past the
    last arrival with the MPC's output forecast; its factory solves the LP, so building it
    is its offline cost.
    """
    requests = tuple(workload)
    forecast = expected_output_tokens_forecast(requests)
    plan_horizon = math.ceil(requests[-1].arrival_time_s) + 60.0

    def open_loop() -> ClockController:
        plan = optimize_open_loop(
            requests,
            plant,
            horizon_s=plan_horizon,
            control_period_s=control_period_s,
            expected_output_tokens=forecast,
        )
        return OpenLoopClockController(plan)

    fast_period = control_period_s if fast_mpc_period_s is None else fast_mpc_period_s

    def mpc(kind: str, period: float) -> Callable[[], ClockController]:
        return lambda: scoreboard_mpc(
            plant,
            requests,
            kind,
            control_period_s=period,
            horizon_s=mpc_horizon_s,
            solve_time_limit_s=mpc_solve_time_limit_s,
        )

    return [
        ControllerEntry("max", LABELS["max"], lambda: maximum_clock_controller),
        ControllerEntry("reactive", LABELS["reactive"], lambda: reactive_clock_controller),
        ControllerEntry("open-loop", LABELS["open-loop"], open_loop),
        ControllerEntry("mpc-slsqp", LABELS["mpc-slsqp"], mpc("mpc-slsqp", control_period_s)),
        ControllerEntry("mpc", LABELS["mpc"], mpc("mpc", fast_period), fast_period),
        ControllerEntry(
            "mpc-online",
            LABELS["mpc-online"],
            lambda: scoreboard_online(
                requests,
                control_period_s=fast_period,
                horizon_s=mpc_horizon_s,
                solve_time_limit_s=mpc_solve_time_limit_s,
            ),
            fast_period,
        ),
    ]
