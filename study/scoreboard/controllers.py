"""The controllers every scoreboard scenario runs, each built by the node's factory
(:func:`daemon.decide.build_controller`) in the node's safety chain, under its one name."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.contract import ControllerWrapper
from gpugov.controllers.mpc.controller import expected_output_tokens_forecast
from gpugov.controllers.open_loop import optimize_open_loop
from gpugov.daemon.controller_config import (
    AGFTControllerConfig,
    ControllerConfig,
    DefaultDVFSControllerConfig,
    DPSControllerConfig,
    GreenLLMControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OnlineMPCControllerConfig,
    OpenLoopControllerConfig,
    PIDControllerConfig,
    PowerCapControllerConfig,
    PowerProfileControllerConfig,
    ReactiveControllerConfig,
    ThrottLLeMControllerConfig,
)
from gpugov.daemon.controller_spec import parse_controller_spec, spec_name
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.daemon.safety import SafetySettings
from gpugov.plant import ServingPlant
from gpugov.plant.types import Request
from gpugov.study.scoreboard.scenarios import LABELS, BenchConfig


# ---------------------------------------------------------------------- controllers
@dataclass(frozen=True)
class ControllerEntry:
    """One online controller of the scoreboard: a key, a label and a factory."""

    key: str
    label: str
    build: Callable[[], ControllerWrapper]
    control_period_s: float | None = None
    """The controller's own control period; None runs it at the scenario's."""
    outside: bool = False
    """Another package's controller (``--controller``): a failure costs its own row only."""


def study_controller(
    spec: ControllerConfig,
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float,
    safety: SafetySettings | None = None,
    plan: object = None,
    slo_target: SLOTarget | None = None,
    role: str = "colocated",
    replicas: int = 1,
) -> ControllerWrapper:
    """``spec``'s controller on a simulated domain of ``plant``, as ``gpugov run --simulate
    --virtual`` builds it: the node's factory and safety chain, forecasts declared from the
    workload before the run, the plant itself for an ``mpc``, virtual time; ``slo_target``
    as a domain's ``[domains.slo_target]``; ``role`` as a domain's pool ``role`` (a
    disaggregated pool is judged on its phase's objective, ``docs/disaggregated.md``), and
    ``replicas`` its engines (one domain holding all their GPUs, as on a node)."""
    context = ControllerContext.for_plant(
        plant,
        workload,
        period_s=control_period_s,
        safety=safety,
        plan=plan,
        slo_target=slo_target,
        role=role,
        replicas=replicas,
    )
    return build_controller(spec, context)


def scoreboard_mpc(
    plant: ServingPlant,
    workload: Sequence[Request],
    kind: str,
    *,
    control_period_s: float = 1.0,
    horizon_s: float = 10.0,
    solve_time_limit_s: float = 0.8,
    safety: SafetySettings | None = None,
) -> ControllerWrapper:
    """The MPC of config kind ``kind`` (``mpc``: the fast solver and model; ``mpc-slsqp``:
    the seed's) in its safety chain, as :func:`study_controller` builds it."""
    spec = MPCControllerConfig(
        kind=kind,  # type: ignore[arg-type]
        horizon_s=horizon_s,
        solve_time_limit_s=solve_time_limit_s,
    )
    return study_controller(spec, plant, workload, control_period_s=control_period_s, safety=safety)


def scoreboard_online(
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float,
    horizon_s: float | None = None,
    solve_time_limit_s: float = 0.8,
    safety: SafetySettings | None = None,
) -> ControllerWrapper:
    """``mpc-online`` in its safety chain, as ``gpugov run --simulate`` builds it: declared
    forecasts from the workload; SLOs from the observations only. It never reads the
    plant's profile (the plant gives only the clocks a node would list). ``horizon_s``
    None: its default, ten control periods."""
    spec = OnlineMPCControllerConfig(
        kind="mpc-online", horizon_s=horizon_s, solve_time_limit_s=solve_time_limit_s
    )
    return study_controller(spec, plant, workload, control_period_s=control_period_s, safety=safety)


def build_scoreboard_controllers(
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float = 1.0,
    mpc_horizon_s: float = 10.0,
    mpc_solve_time_limit_s: float = 0.8,
    fast_mpc_period_s: float | None = None,
    online_period_s: float | None = None,
    safety: SafetySettings | None = None,
    slo_target: SLOTarget | None = None,
    outside_controllers: Sequence[str] = (),
) -> list[ControllerEntry]:
    """The online controllers of the scoreboard, in table order (the one place to swap
    one in: keys ``max``, ``reactive``, ``open-loop``, ``mpc-slsqp``, ``mpc``,
    ``mpc-online``, then the peer governors of :func:`peer_entries`, then each of
    ``outside_controllers``, a ``--controller`` spec of another package's controller,
    keyed by its one name and decided every ``online_period_s`` as the peers are), each
    in the node's safety chain with ``safety``'s floor and dwell.

    The MPCs are the daemon's config kinds ``mpc-slsqp`` (the seed's SLSQP solver and
    fluid model, the reference) and ``mpc`` (the fast discrete-search solver with its
    latency model, SLO margin, burst hedge and SLO feedback). The fast MPC runs every
    ``fast_mpc_period_s`` and ``mpc-online`` every ``online_period_s`` (its recommended
    node period; each default: ``fast_mpc_period_s``, else the scenario's period), since
    their solve time allows it: the MPCs over ``mpc_horizon_s``, ``mpc-online`` over its
    default horizon of ten control periods (as a node runs it). Every controller is given
    ``slo_target`` (the scoreboard's :attr:`BenchConfig.slo_target`); ``mpc`` and
    ``mpc-online`` spend the misses it allows.

    The open-loop plan (:func:`optimize_open_loop`) covers the scenario to 60 s past the
    last arrival with the MPC's output forecast; its factory solves the LP, so building it
    is its offline cost.
    """
    requests = tuple(workload)
    forecast = expected_output_tokens_forecast(requests)
    plan_horizon = math.ceil(requests[-1].arrival_time_s) + 60.0
    fast_period = control_period_s if fast_mpc_period_s is None else fast_mpc_period_s
    online_period = fast_period if online_period_s is None else online_period_s

    def make(spec: ControllerConfig, period: float) -> Callable[[], ControllerWrapper]:
        return lambda: study_controller(
            spec, plant, requests, control_period_s=period, safety=safety, slo_target=slo_target
        )

    def open_loop() -> ControllerWrapper:
        plan = optimize_open_loop(
            requests,
            plant,
            horizon_s=plan_horizon,
            control_period_s=control_period_s,
            expected_output_tokens=forecast,
        )
        return study_controller(
            OpenLoopControllerConfig(kind="open-loop", plan=Path("scoreboard-plan")),
            plant,
            requests,
            control_period_s=control_period_s,
            safety=safety,
            plan=plan,
        )

    def mpc(kind: str) -> MPCControllerConfig:
        return MPCControllerConfig(
            kind=kind,  # type: ignore[arg-type]
            horizon_s=mpc_horizon_s,
            solve_time_limit_s=mpc_solve_time_limit_s,
        )

    online = OnlineMPCControllerConfig(kind="mpc-online", solve_time_limit_s=mpc_solve_time_limit_s)
    return [
        ControllerEntry(
            "max", LABELS["max"], make(MaxControllerConfig(kind="max"), control_period_s)
        ),
        ControllerEntry(
            "reactive",
            LABELS["reactive"],
            make(ReactiveControllerConfig(kind="reactive"), control_period_s),
        ),
        ControllerEntry("open-loop", LABELS["open-loop"], open_loop),
        ControllerEntry("mpc-slsqp", LABELS["mpc-slsqp"], make(mpc("mpc-slsqp"), control_period_s)),
        ControllerEntry("mpc", LABELS["mpc"], make(mpc("mpc"), fast_period), fast_period),
        ControllerEntry(
            "mpc-online", LABELS["mpc-online"], make(online, online_period), online_period
        ),
        *peer_entries(
            plant,
            requests,
            control_period_s=control_period_s,
            peer_period_s=online_period,
            safety=safety,
            slo_target=slo_target,
        ),
        *(
            ControllerEntry(
                spec_name(config),
                spec_name(config),
                make(config, online_period),
                online_period,
                outside=True,
            )
            for config in (parse_controller_spec(text) for text in outside_controllers)
        ),
    ]


def bench_controllers(
    plant: ServingPlant, workload: Sequence[Request], config: BenchConfig
) -> list[ControllerEntry]:
    """:func:`build_scoreboard_controllers` with every setting ``config`` gives it (the
    periods, the MPC's horizon and solve limit, the safety chain, the SLO target and the
    outside controllers), as the scoreboard runs them."""
    return build_scoreboard_controllers(
        plant,
        workload,
        control_period_s=config.control_period_s,
        mpc_horizon_s=config.mpc_horizon_s,
        mpc_solve_time_limit_s=config.mpc_solve_time_limit_s,
        fast_mpc_period_s=config.fast_mpc_period_s,
        online_period_s=config.online_period_s,
        safety=config.safety,
        slo_target=config.slo_target,
        outside_controllers=config.outside_controllers,
    )


def peer_entries(
    plant: ServingPlant,
    workload: Sequence[Request],
    *,
    control_period_s: float,
    peer_period_s: float,
    safety: SafetySettings | None = None,
    slo_target: SLOTarget | None = None,
) -> list[ControllerEntry]:
    """The peer governors' rows (``controllers/peers``, ``docs/benchmark.md``), each the
    daemon's config kind in the node's safety chain: the caps (``power-cap``, ``dps``,
    ``power-profile``) every ``control_period_s``; ``agft`` every 0.3 s, its own cycle;
    ``default-dvfs``, ``pid``, ``throttllem`` and ``greenllm`` every ``peer_period_s``
    (``mpc-online``'s period, so that no clock governor decides more often than ours).
    ``best-cap`` is the best static cap in hindsight: its factory simulates the scenario
    under each candidate cap (:func:`~gpugov.controllers.peers.best_cap.best_static_cap`,
    its offline cost) and returns ``power-cap`` at the best one."""
    from gpugov.controllers.oracles import SLO_TOLERANCE
    from gpugov.controllers.peers.agft import AGFT_PERIOD_S
    from gpugov.controllers.peers.best_cap import best_static_cap

    requests = tuple(workload)

    def make(spec: ControllerConfig, period: float) -> Callable[[], ControllerWrapper]:
        return lambda: study_controller(
            spec, plant, requests, control_period_s=period, safety=safety, slo_target=slo_target
        )

    def best_cap() -> ControllerWrapper:
        tolerance = SLO_TOLERANCE if slo_target is None else 1.0 - slo_target.attainment
        best = best_static_cap(
            requests, plant, tolerance=tolerance, control_period_s=control_period_s
        )
        return make(
            PowerCapControllerConfig(kind="power-cap", cap_w=best.cap_w), control_period_s
        )()

    return [
        ControllerEntry(
            "power-cap",
            LABELS["power-cap"],
            make(PowerCapControllerConfig(kind="power-cap"), control_period_s),
        ),
        ControllerEntry("best-cap", LABELS["best-cap"], best_cap),
        ControllerEntry(
            "dps", LABELS["dps"], make(DPSControllerConfig(kind="dps"), control_period_s)
        ),
        ControllerEntry(
            "power-profile",
            LABELS["power-profile"],
            make(PowerProfileControllerConfig(kind="power-profile"), control_period_s),
        ),
        ControllerEntry(
            "default-dvfs",
            LABELS["default-dvfs"],
            make(DefaultDVFSControllerConfig(kind="default-dvfs"), peer_period_s),
            peer_period_s,
        ),
        ControllerEntry(
            "agft",
            LABELS["agft"],
            make(AGFTControllerConfig(kind="agft"), AGFT_PERIOD_S),
            AGFT_PERIOD_S,
        ),
        ControllerEntry(
            "pid",
            LABELS["pid"],
            make(PIDControllerConfig(kind="pid"), peer_period_s),
            peer_period_s,
        ),
        ControllerEntry(
            "throttllem",
            LABELS["throttllem"],
            make(ThrottLLeMControllerConfig(kind="throttllem"), peer_period_s),
            peer_period_s,
        ),
        ControllerEntry(
            "greenllm",
            LABELS["greenllm"],
            make(GreenLLMControllerConfig(kind="greenllm"), peer_period_s),
            peer_period_s,
        ),
    ]
