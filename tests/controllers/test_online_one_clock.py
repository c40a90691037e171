"""``mpc-online`` on a GPU that supports one clock, as a node builds it (the safety chain
from the node's factory): it decides that clock at every tick instead of raising (a node
stops after a run of controller failures), with no model and no power need."""

from __future__ import annotations

from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.plant.types import ServingObservation

CLOCK = 1410.0


def _observation(k: int) -> ServingObservation:
    busy = k % 3 != 0
    return ServingObservation(
        time_s=0.25 * k,
        step_index=k,
        arrived_requests=k,
        prefill_remaining_tokens=600.0 if k % 5 == 0 else 0.0,
        decode_active=4 if busy else 0,
        generated_decode_tokens=40.0 * k,
        temperature_c=50.0,
        supported_clocks_mhz=(CLOCK,),
        requested_clock_mhz=CLOCK,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        power_w=300.0,
        gpu_utilization=0.8 if busy else 0.0,
        ttft_recent_s=0.1,
        tpot_recent_s=0.02,
    )


def test_one_supported_clock_is_decided_at_every_tick() -> None:
    context = ControllerContext(period_s=0.25, supported_clocks_mhz=(CLOCK,))
    chain = build_controller(OnlineMPCControllerConfig(kind="mpc-online"), context)
    decisions = {float(chain(_observation(k))) for k in range(200)}
    assert decisions == {CLOCK}
    bare = OnlineMPCController(control_period_s=0.25)
    assert bare(_observation(0)) == CLOCK and bare.last_reason == "one clock"
    assert bare.model is None and bare.power_needed() is None
    assert bare.status()["samples"] == 0
