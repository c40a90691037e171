"""Controllers under the node's stated limits: the thermal limit a domain configures
(the observation's ``thermal_limit_c``) is the one a controller plans to."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpugov.controllers.mpc.controller import MPCController
from gpugov.plant import ServingPlant, load_profile
from gpugov.plant.types import ServingObservation


def _hot_observation(time_s: float, limit_c: float | None) -> ServingObservation:
    """A loaded GPU at 59.9 C (the profile's limit is 87 C)."""
    return ServingObservation(
        time_s=time_s,
        step_index=int(time_s),
        arrived_requests=100,
        prefill_remaining_tokens=2_000.0,
        decode_active=64,
        generated_decode_tokens=0.0,
        temperature_c=59.9,
        requested_clock_mhz=1980.0,
        thermal_limit_c=limit_c,
    )


@pytest.mark.parametrize("kind", ["seed", "iteration"])
def test_mpc_plans_to_the_thermal_limit_the_node_states(kind: str) -> None:
    """A domain's thermal_limit_c of 60 C, 0.1 C above the die: the top clock's draw
    would pass it within the horizon, so the MPC plans a lower clock than under the
    profile's 87 C (it planned the top clock under both: the stated limit never reached
    its model)."""
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    assert plant.thermal_limit_c == 87.0

    def decisions(limit_c: float | None) -> list[float]:
        controller = MPCController(
            plant, horizon_s=5.0, latency_model=kind, solve_time_limit_s=60.0
        )
        return [controller(_hot_observation(float(t), limit_c)) for t in range(3)]

    free = decisions(None)
    assert free == decisions(87.0)  # the profile's own limit stated: the same plans
    held = decisions(60.0)
    assert max(held) < min(free)
    # 35 C is under the 38.4 C the GPU idles at at its lowest clock: no clock holds it,
    # and the MPC plans to the profile's limit rather than lock the lowest clock.
    assert decisions(35.0) == free
    # 40 C is above that but under the 42.0 C the least busy draw at the lowest clock
    # holds (a prefill at 345 MHz, 154 W): no clock holds it while the GPU serves, and
    # planned to, the MPC locked the lowest clock while the die stayed over it.
    assert decisions(40.0) == free
    # The problem it priced holds the stated limit; the controller's plant is unchanged.
    controller = MPCController(plant, horizon_s=5.0, latency_model=kind)
    problem = controller.problem(_hot_observation(0.0, 60.0), 1.0)
    assert problem.plant.thermal_limit_c == 60.0 and controller.plant is plant


def test_a_replaced_plant_is_planned_at_the_stated_limit_too() -> None:
    """mpc-online hands its MPC a newly learned plant every decision: the problem is
    the new plant at the stated limit, never the plant the limit was first applied to."""
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    controller = MPCController(plant, horizon_s=5.0)
    first = controller.problem(_hot_observation(0.0, 60.0), 1.0).plant
    assert (first.thermal_limit_c, first.ambient_temperature_c) == (60.0, 30.0)
    controller.plant = plant.with_overrides(ambient_temperature_c=35.0)
    again = controller.problem(_hot_observation(1.0, 60.0), 1.0).plant
    assert (again.thermal_limit_c, again.ambient_temperature_c) == (60.0, 35.0)


@pytest.mark.parametrize("kind", ["seed", "iteration"])
def test_a_temperature_no_longer_read_is_carried_forward_by_the_rc(kind: str) -> None:
    """The sensor stops answering (NaN) just after reading 62 C, over a 60 C limit, while
    the GPU draws 150 W (whose steady state is 41.7 C): ten time constants later the MPC
    plans as for a cooled die, not as for one held at 62 C for ever (it planned the
    lowest clock as long as the reading stayed missing)."""
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))

    def last_decision(temperatures: list[float]) -> float:
        controller = MPCController(plant, horizon_s=5.0, latency_model=kind)
        decision = math.nan
        for tick, value in enumerate(temperatures):
            observation = replace(
                _hot_observation(10.0 * tick, 60.0),  # a tick every 10 s: 400 s in all
                arrived_requests=100 * tick,  # 10 requests a second
                temperature_c=value,
                power_w=150.0,
            )
            decision = controller(observation)
        return decision

    cooled = last_decision([62.0] + [41.7] * 40)
    missing = last_decision([62.0] + [math.nan] * 40)
    held = last_decision([62.0] * 41)
    assert held < cooled  # the hot die is held low
    assert missing == cooled
