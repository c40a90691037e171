"""``mpc-online`` fed what a node's inputs give when things go wrong: it never raises,
never decides a clock off the observation's supported list, and re-learns."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import make_plant, poisson_requests

from gpugov.controllers.baseline import maximum_clock_controller
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.types import ServingObservation


def test_a_changed_supported_clock_list_is_relearned_and_never_left() -> None:
    # After 20 s the GPU offers another grid (every clock 7 MHz higher, the top one gone):
    # the model of the old grid decided clocks the GPU no longer has.
    controller = OnlineMPCController(warmup_s=5.0, control_period_s=0.25)
    off_list: list[tuple[float, float]] = []

    def observed(observation: ServingObservation) -> float:
        if observation.time_s > 20.0:
            clocks = tuple(c + 7.0 for c in observation.supported_clocks_mhz[:-1])
            observation = replace(observation, supported_clocks_mhz=clocks)
        decision = controller(observation)
        if decision not in observation.supported_clocks_mhz:
            off_list.append((observation.time_s, decision))
        return decision

    simulate(
        poisson_requests(40.0, seed=2),
        make_plant(),
        chunked_prefill_scheduler,
        observed,
        0,
        control_period_s=0.25,
    )
    assert off_list == []
    model = controller.model
    assert model is not None and float(model.clocks_mhz[0]) == 352.0
    assert float(model.clocks_mhz[-1]) == 1972.0 and controller.resets == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_control_period_longer_than_the_ttft_slo_holds_the_slo(seed: int) -> None:
    # At a 5 s period and a 1 s TTFT SLO the decode descent took the lowest clock in a
    # decode-only window, where the prompts arriving over the next 5 s queued at it and
    # missed their SLO (2.5 requests a second).
    workload = poisson_requests(90.0, seed=seed)
    plant = make_plant()
    context = ControllerContext.for_plant(plant, workload, period_s=5.0)
    chain = build_controller(OnlineMPCControllerConfig(kind="mpc-online"), context)
    result = simulate(workload, plant, chunked_prefill_scheduler, chain, 0, control_period_s=5.0)
    reference = simulate(workload, plant, chunked_prefill_scheduler, maximum_clock_controller, 0)
    assert reference.metrics.slo_attainment == 1.0
    assert result.metrics.slo_attainment == 1.0
