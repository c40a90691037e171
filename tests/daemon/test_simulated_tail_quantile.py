"""What a simulated controller observes under an SLO target is what a node with that target
observes: the daemon's observer prices a long prompt's tail (``prefill_tail_tokens``) at
the target's attainment quantile, and ``simulate``'s view of a vLLM page (``node_view``)
priced it at the default 99 % whatever ``--slo-target`` said, where ``run --simulate``
used the target's."""

from __future__ import annotations

from gpugov.controllers.budget import SLOTarget
from gpugov.daemon.controller_config import MaxControllerConfig
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.service import simulated_run
from gpugov.daemon.simulated import observation_view
from gpugov.plant import ServingPlant, load_profile, simulate
from gpugov.plant.types import ServingObservation
from gpugov.plant.workload import load_trace

PERIOD_S = 0.25
TARGET = SLOTarget(attainment=0.9)


def test_simulate_sees_the_prompt_tail_at_the_target_s_quantile_as_a_node_does() -> None:
    workload, _ = load_trace("azure-conv-10min", duration_s=120)  # bundled: no shared traces
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    spec = MaxControllerConfig(kind="max")
    seen: list[ServingObservation] = []

    def spy(observation: ServingObservation) -> float:
        seen.append(observation)
        return float(observation.supported_clocks_mhz[-1])

    chain = build_controller(spec, ControllerContext.for_plant(plant, workload, period_s=PERIOD_S))
    chain.inner.inner = spy  # type: ignore[attr-defined]
    simulate(
        workload,
        plant,
        controller=chain,
        control_period_s=PERIOD_S,
        view=observation_view("vllm", TARGET),
    )
    clock = VirtualClock()
    sim = simulated_run(
        workload, plant, spec, clock, period_s=PERIOD_S, virtual_time=True, slo_target=TARGET
    )
    node: list[ServingObservation] = []
    run(
        [sim.domain],
        TimedLoop(PERIOD_S, clock=clock, sleep=clock.sleep),
        on_tick=lambda batch: node.extend(record.observation for record in batch),
        before_tick=sim.before_tick,
    )
    tails = [o.prefill_tail_tokens for o in seen]
    assert len(tails) == len(node) and any(t for t in tails)
    assert tails == [o.prefill_tail_tokens for o in node]
