"""``mpc-online`` on a GPU whose NVML reports no utilisation (MIG mode, some virtual GPUs:
``nvmlDeviceGetUtilizationRates`` answers NOT_SUPPORTED, so every observation carries
``gpu_utilization = None``). The busy time its model fits then comes from the engine's
work in hand at the window's ends; without it no window was learned from, the warm-up
never ended and the controller held the top clock for the whole run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.online.window import window_between
from gpugov.controllers.oracles import SLO_TOLERANCE, holds_slo
from gpugov.daemon.controller_config import MaxControllerConfig, OnlineMPCControllerConfig
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.types import ServingObservation
from gpugov.study.scoreboard.controllers import study_controller
from gpugov.study.scoreboard.scenarios import build_scenario

DURATION_S = 120.0
PERIOD_S = 0.25


def _without_utilization(simulation):  # type: ignore[no-untyped-def]
    """A view that drops NVML's utilisation from every observation, as on a MIG GPU."""

    def observe(step_index: int | None = None) -> ServingObservation:
        return replace(simulation.observe(step_index), gpu_utilization=None)

    return observe


def _observation(time_s: float, **fields: float) -> ServingObservation:
    base = dict(
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=50.0,
        realized_clock_mhz=1980.0,
        requested_clock_mhz=1980.0,
        gpu_utilization=None,
    )
    base.update(fields)
    return ServingObservation(time_s=time_s, step_index=int(time_s * 4), **base)  # type: ignore[arg-type]


def test_a_window_without_utilisation_is_busy_while_the_engine_has_work() -> None:
    idle = _observation(1.0)
    busy = _observation(1.25, decode_active=4, output_tokens_total=40.0)
    still = _observation(1.5, decode_active=4, output_tokens_total=80.0)
    both = window_between(busy, still, busy_from_engine=True)
    assert both is not None and both.busy_s == pytest.approx(0.25)
    # Work at one end only: it began (or ended) within the window, half of it on average.
    one = window_between(idle, busy, busy_from_engine=True)
    assert one is not None and one.busy_s == pytest.approx(0.125)
    # Nothing in hand at either end and nothing done: an idle window.
    quiet = window_between(idle, _observation(1.25), busy_from_engine=True)
    assert quiet is not None and quiet.busy_s == 0.0
    # Work done between two idle ends (a short request came and went): its busy time is
    # unknown, so the window is not used.
    flash = _observation(1.25, output_tokens_total=5.0, prompt_tokens_total=100.0)
    assert window_between(idle, flash, busy_from_engine=True) is None
    # NVML's reading, where there is one, is the busy time.
    measured = replace(still, gpu_utilization=0.6)
    window = window_between(busy, measured, busy_from_engine=True)
    assert window is not None and window.busy_s == pytest.approx(0.15)
    # On a GPU that reports its utilisation, a window without one is a read that failed:
    # not used, rather than priced from the work in hand.
    assert window_between(busy, still) is None


def test_mpc_online_saves_on_a_gpu_that_reports_no_utilisation() -> None:
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    requests = build_scenario("azure-conv-10min", plant, "cap70", DURATION_S).requests
    target = SLOTarget(attainment=1.0 - SLO_TOLERANCE, window_s=DURATION_S)
    top_chain = study_controller(
        MaxControllerConfig(kind="max"), plant, requests, control_period_s=1.0
    )
    top = simulate(requests, plant, chunked_prefill_scheduler, top_chain, 0)
    spec = OnlineMPCControllerConfig(kind="mpc-online")
    chain = study_controller(spec, plant, requests, control_period_s=PERIOD_S, slo_target=target)
    online = simulate(
        requests,
        plant,
        chunked_prefill_scheduler,
        chain,
        0,
        control_period_s=PERIOD_S,
        view=_without_utilization,
    )
    a_top, a_online = top.metrics.slo_attainment, online.metrics.slo_attainment
    assert a_top is not None and a_online is not None
    assert holds_slo(a_online, a_top)
    # It left the top clock: at least 10 % less energy than the maximum clock.
    assert online.metrics.energy_j < 0.9 * top.metrics.energy_j, (
        online.metrics.energy_j,
        top.metrics.energy_j,
    )
