"""A simulated node's GPUs carry UUIDs of their profile, as the emulated node's do
(``study.emulate.node.emulated_gpu_uuid``): ``mpc-online``'s learned model is keyed on
the GPUs' UUIDs, and every simulated GPU 0 was ``0``, so ``run --simulate`` under a state
directory restored a model learned on one profile (an H100) onto another (an H200) and
decided other clocks than ``simulate`` on the same trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.daemon.decide import ControllerContext
from gpugov.daemon.gpu_open import gpu_uuid
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.service import simulated_run
from gpugov.daemon.simulated import node_view
from gpugov.plant import ServingPlant, load_profile, simulate
from gpugov.plant.workload import load_trace
from gpugov.study.emulate.node import emulated_gpu_uuid

PERIOD_S = 0.25
SPEC = OnlineMPCControllerConfig(kind="mpc-online")


def _node_run(plant: ServingPlant, workload: tuple) -> tuple[float, list[str]]:  # type: ignore[type-arg]
    """``run --simulate --virtual``'s run of ``mpc-online``: its energy, its GPUs' UUIDs."""
    clock = VirtualClock()
    sim = simulated_run(workload, plant, SPEC, clock, period_s=PERIOD_S, virtual_time=True)
    uuids = [gpu_uuid(b) for b in sim.domain.observer.gpus.backends]
    run(
        [sim.domain],
        TimedLoop(PERIOD_S, clock=clock, sleep=clock.sleep),
        before_tick=sim.before_tick,
    )
    assert sim.result is not None
    return sim.result.metrics.energy_j, uuids


def test_a_model_learned_on_one_simulated_profile_is_not_restored_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpugov.daemon.decide import build_controller

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    workload, _ = load_trace("azure-conv-10min", duration_s=60)
    h100 = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    h200 = ServingPlant.from_profile(load_profile("h200-sxm-llama3-8b"))
    _, first = _node_run(h100, workload)
    assert list(tmp_path.glob("online-model-*.json"))  # the H100's model, kept
    energy, second = _node_run(h200, workload)
    assert first == [emulated_gpu_uuid(h100.profile, 0)]
    assert second == [emulated_gpu_uuid(h200.profile, 0)] != first
    context = ControllerContext.for_plant(h200, workload, period_s=PERIOD_S)
    assert context.gpu_uuids == tuple(second)
    reference = simulate(
        workload,
        h200,
        controller=build_controller(SPEC, context),
        control_period_s=PERIOD_S,
        view=node_view,
    )
    assert energy == reference.metrics.energy_j
