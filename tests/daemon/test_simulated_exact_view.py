"""``run --simulate --engine-view exact`` and ``simulate --engine-view exact`` run one
governor: the simulated engine's exact page hands the controller what the plant's own
observation holds, the served model's name included, so ``mpc-online`` takes its
automatic hints from the profile's model on both paths and decides the same clocks."""

from __future__ import annotations

from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.service import simulated_run
from gpugov.plant import ServingPlant, load_profile, simulate
from gpugov.plant.types import ServingObservation
from gpugov.plant.workload import load_trace

PERIOD_S = 0.25


def test_mpc_online_on_the_exact_view_decides_as_simulate_does() -> None:
    workload, _ = load_trace("azure-conv-10min", duration_s=60)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    spec = OnlineMPCControllerConfig(kind="mpc-online")
    reference = simulate(
        workload,
        plant,
        controller=build_controller(
            spec, ControllerContext.for_plant(plant, workload, period_s=PERIOD_S)
        ),
        control_period_s=PERIOD_S,
    )
    clock = VirtualClock()
    sim = simulated_run(
        workload, plant, spec, clock, period_s=PERIOD_S, virtual_time=True, engine_view="exact"
    )
    seen: list[ServingObservation] = []
    run(
        [sim.domain],
        TimedLoop(PERIOD_S, clock=clock, sleep=clock.sleep),
        on_tick=lambda batch: seen.extend(record.observation for record in batch),
        before_tick=sim.before_tick,
    )
    assert sim.result is not None
    assert seen and {o.model_name for o in seen} == {plant.profile.manifest["model"]}
    node, plant_run = sim.result.metrics, reference.metrics
    assert node.clock_changes == plant_run.clock_changes > 0
    assert node.energy_j == plant_run.energy_j
    assert node.slo_attainment == plant_run.slo_attainment
