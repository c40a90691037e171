"""One governor path: every simulated run gives a controller the context a simulated node
(``gpugov run --simulate``) gives it, so an outside controller's factory, and every
kind, sees the same period, clocks, GPUs, SLOs, limits, forecasts and chain settings in
``simulate``, a sweep's cell, the scoreboard and a fleet's node."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpugov.controllers.budget import SLOTarget
from gpugov.daemon.cli_support import simulated_controller
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.loop import VirtualClock
from gpugov.daemon.safety import SafetySettings
from gpugov.daemon.service import simulated_run
from gpugov.plant import Request, ServingPlant, load_profile
from gpugov.study.fleet.node import node_controller
from gpugov.study.scoreboard.controllers import study_controller

RECORDING = """
seen = []


def make(context):
    seen.append(context)
    top = max(context.supported_clocks_mhz)
    return lambda observation: top
"""

SHARED = (
    "period_s",
    "supported_clocks_mhz",
    "gpu_names",
    "gpu_uuids",
    "gpu_count",
    "power_limit_w",
    "ttft_slo_s",
    "tpot_slo_s",
    "thermal_limit_c",
    "forecasts",
    "time_mode",
    "safety",
    "slo_target",
    "role",
)
"""What a controller may know that must be the same on every path (the domain's name and
the budget guard are the node's own)."""


@pytest.mark.parametrize("profile", ["h100-sxm-llama3-8b", "h100-sxm-llama3-70b-tp4"])
def test_every_simulated_path_gives_the_context_of_a_simulated_node(
    profile: str, module_on_path: Callable[[str, str], str]
) -> None:
    name = module_on_path("context_recording_governor", RECORDING)
    spec = f"{name}:make"
    plant = ServingPlant.from_profile(load_profile(profile))
    workload = tuple(Request(i, 0.5 * i, 300 + 10 * i, 20) for i in range(8))
    safety = SafetySettings(floor_mhz=900.0, dwell_s=1.0)
    target = SLOTarget(attainment=0.95)
    sim = simulated_run(
        workload,
        plant,
        parse_controller_spec(spec),
        VirtualClock(),
        period_s=0.25,
        safety=safety,
        virtual_time=True,
        slo_target=target,
    )
    sim.finish()
    seen: list[Any] = sys.modules[name].seen
    node = seen[-1]
    simulated_controller(spec, plant, workload, 0.25, safety=safety, slo_target=target)
    study_controller(
        parse_controller_spec(spec),
        plant,
        workload,
        control_period_s=0.25,
        safety=safety,
        slo_target=target,
    )
    node_controller(spec, plant, workload, 0.25, safety, target)
    assert len(seen) == 4
    assert node.ttft_slo_s == plant.profile.ttft_slo_s
    assert node.tpot_slo_s == plant.profile.tpot_slo_s
    for path, context in zip(("simulate", "scoreboard", "fleet"), seen[1:], strict=True):
        for field in SHARED:
            assert getattr(context, field) == getattr(node, field), (path, field)
    assert {f.name for f in dataclasses.fields(node)} >= set(SHARED)


def test_a_calibrated_power_profile_caps_the_whole_domain_of_a_pool() -> None:
    """A pool of engines is one domain holding all their GPUs (``replicas``): the cap a
    ``power-profile`` calibrates on the profile is scaled to every GPU of the domain, as on
    a node, where it was scaled to one engine's tensor-parallel group."""
    from gpugov.daemon.controller_config import PowerProfileControllerConfig

    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-70b-tp4"))
    workload = tuple(Request(i, 0.5 * i, 300, 20) for i in range(4))
    spec = PowerProfileControllerConfig(kind="power-profile")
    caps = [
        study_controller(
            spec, plant, workload, control_period_s=1.0, replicas=replicas
        ).requested_power_cap_w
        for replicas in (1, 2)
    ]
    assert caps[0] is not None and caps[1] == pytest.approx(2.0 * caps[0])


def test_replay_gives_the_context_the_recorded_node_gave(
    tmp_path: Path, module_on_path: Callable[[str, str], str]
) -> None:
    """``replay`` rebuilds the controller with the context the recorded domain's gave it:
    the SLOs, thermal limit, GPUs and forecasts of a simulated node (an outside controller
    that read its SLO from the context decided every tick otherwise in replay)."""
    from gpugov.daemon.loop import TimedLoop, run
    from gpugov.daemon.record import Recorder
    from gpugov.daemon.replay import replay

    name = module_on_path("replay_context_recording_governor", RECORDING)
    spec = parse_controller_spec(f"{name}:make")
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-70b-tp4"))
    workload = tuple(Request(i, 0.5 * i, 300 + 10 * i, 20) for i in range(8))
    clock = VirtualClock()
    sim = simulated_run(
        workload,
        plant,
        spec,
        clock,
        period_s=0.5,
        safety=SafetySettings(floor_mhz=900.0, dwell_s=1.0),
        virtual_time=True,
        slo_target=SLOTarget(attainment=0.95),
    )
    path = tmp_path / "run.jsonl"
    recorder = Recorder(path, sim.header)
    try:
        run(
            [sim.domain],
            TimedLoop(0.5, clock=clock, sleep=clock.sleep),
            on_tick=recorder,
            before_tick=sim.before_tick,
        )
    finally:
        recorder.close()
        sim.finish()
    replay(path, spec)
    seen: list[Any] = sys.modules[name].seen
    node, replayed = seen[0], seen[-1]
    assert node.ttft_slo_s is not None and node.thermal_limit_c is not None
    for field in SHARED:
        assert getattr(replayed, field) == getattr(node, field), field
    assert replayed.gpu_uuids and replayed.gpu_uuids == node.gpu_uuids


MODULE_STATE = """
CALLS = [0]


def make(context):
    top = max(context.supported_clocks_mhz)

    def decide(observation):
        CALLS[0] += 1  # the module's state, which no copy of the function holds
        return top

    return decide
"""


def test_every_path_makes_the_warm_up_decision_a_node_makes(
    module_on_path: Callable[[str, str], str],
) -> None:
    """A node makes one warm-up decision before its loop; an outside controller that keeps
    its state in its module (a count, a cache) sees it there whatever is copied, so every
    simulated path makes it too: ``simulate`` decided other clocks than ``run --simulate``
    from the 50th decision of a controller switching every 50 calls."""
    name = module_on_path("module_state_governor", MODULE_STATE)
    spec = f"{name}:make"
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    workload = tuple(Request(i, 0.5 * i, 300, 20) for i in range(4))
    calls: list[int] = importlib.import_module(name).CALLS

    def made(build: Callable[[], Any]) -> int:
        calls[0] = 0
        build()
        return calls[0]

    node = made(
        lambda: simulated_run(
            workload, plant, parse_controller_spec(spec), VirtualClock(), virtual_time=True
        ).finish()
    )
    assert node == 1
    assert made(lambda: simulated_controller(spec, plant, workload, 1.0)) == node
    assert (
        made(
            lambda: study_controller(
                parse_controller_spec(spec), plant, workload, control_period_s=1.0
            )
        )
        == node
    )
    assert made(lambda: node_controller(spec, plant, workload, 1.0, None)) == node
