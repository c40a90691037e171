"""``mpc-online`` on profiles of shapes it was never developed on (the generated ones of
``plant/synthetic_profiles.py``: compute-bound, memory-bound, low and high idle power,
narrow and wide clock ranges, TP groups of 2, 4 and 8), closed loop, built by the node's
factory in its safety chain as the scoreboard builds it: every 0.25 s, told the SLO target
the condition judges (``BenchConfig.slo_target``: 99 % of the requests over the run).

Each run is 120 s of the bundled Azure conversation slice at 70% of the maximum clock's
SLO capacity on that profile (the scoreboard's ``cap70``, its capacity search included).
The controller must hold the SLO (attainment within the scoreboard's 1 point of the
maximum clock's) and use less energy than the maximum clock.
"""

from __future__ import annotations

import pytest
from synthetic import scoreboard_run

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.oracles import SLO_TOLERANCE, holds_slo
from gpugov.daemon.controller_config import (
    MaxControllerConfig,
    OnlineMPCControllerConfig,
)
from gpugov.plant import ServingPlant
from gpugov.plant.synthetic_profiles import SHAPES, synthetic_profile
from gpugov.study.scoreboard.scenarios import FULL, build_scenario

DURATION_S = 120.0
ONLINE_PERIOD_S = FULL.online_period_s
"""The scoreboard's period for ``mpc-online`` (``BenchConfig.online_period_s``)."""
TARGET = SLOTarget(attainment=1.0 - SLO_TOLERANCE, window_s=DURATION_S)
"""The SLO target the scoreboard states (``BenchConfig.slo_target``), over this run."""


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mpc_online_holds_the_slo_on_an_unseen_shape(shape: str) -> None:
    profile = synthetic_profile(shape)
    plant = ServingPlant.from_profile(profile)
    scenario = build_scenario("azure-conv-10min", plant, "cap70", DURATION_S)
    requests = scenario.requests
    assert len(requests) > 100
    top = scoreboard_run(plant, requests, MaxControllerConfig(kind="max"), 1.0)
    spec = OnlineMPCControllerConfig(kind="mpc-online")
    online = scoreboard_run(plant, requests, spec, ONLINE_PERIOD_S, TARGET)
    a_top, a_online = top.metrics.slo_attainment, online.metrics.slo_attainment
    assert a_top is not None and a_online is not None
    assert holds_slo(a_online, a_top), (
        f"{profile.name}: mpc-online attains {100 * a_online:.2f}% against the maximum "
        f"clock's {100 * a_top:.2f}% (tolerance {100 * SLO_TOLERANCE:g} point)"
    )
    assert online.metrics.energy_j < top.metrics.energy_j
    # Every clock it ran at is one the profile supports (the safety chain's clamp).
    assert set(online.realized_clock_mhz.tolist()) <= set(profile.clock_mhz.tolist())
