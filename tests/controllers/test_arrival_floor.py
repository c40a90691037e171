"""The arrival floor of ``mpc-online``: where the TTFT SLO is shorter than a control
period, a prompt arriving now is prefilled at the clock chosen now before any later
decision can raise it, so no decision goes below the clock at which the worst TTFT
measured over the last minute, grown like 1/f, would still meet the SLO."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from synthetic import scoreboard_run

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.rules import ARRIVAL_FLOOR_PERIODS
from gpugov.controllers.oracles import SLO_TOLERANCE, holds_slo
from gpugov.daemon.controller_config import (
    ControllerConfig,
    MaxControllerConfig,
    OnlineMPCControllerConfig,
)
from gpugov.plant import ServingPlant, ServingResult
from gpugov.plant.synthetic_profiles import BASE, shape_profile
from gpugov.plant.types import Request, ServingObservation
from gpugov.study.scoreboard.scenarios import build_scenario

CLOCKS = np.arange(300.0, 1801.0, 15.0)
TOP = CLOCKS[-1]
PERIOD_S = 0.25


class _Model:
    """What the floor reads of :class:`OnlineModel`: the supported clocks."""

    clocks_mhz = CLOCKS


def _seen(role: str = "colocated") -> ServingObservation:
    return ServingObservation(
        time_s=10.0,
        step_index=40,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=3,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        supported_clocks_mhz=tuple(CLOCKS),
        requested_clock_mhz=TOP,
        role=role,
    )


def _controller(ratio: float, slo_s: float) -> OnlineMPCController:
    """A controller whose last minute measured one TTFT at ``ratio`` of a ``slo_s`` SLO."""
    controller = OnlineMPCController(control_period_s=PERIOD_S)
    controller.model = _Model()  # type: ignore[assignment]
    controller.remember_ttft_pressure(9.0, ratio, PERIOD_S / slo_s)
    return controller


def _lowest(share: float) -> float:
    return float(min(c for c in CLOCKS if c >= TOP * share - 1e-9))


def test_a_ttft_slo_shorter_than_a_period_bounds_every_decision() -> None:
    # 0.15 s SLO, 0.25 s period: an arrival's whole TTFT passes before the next decision,
    # at most 1/f slower than at the top clock: ratio / x <= 1.
    controller = _controller(0.3, 0.15)
    assert controller.arrival_floor(_seen()) == pytest.approx(_lowest(0.3))
    # A higher measured pressure raises it, never above the top clock.
    assert controller.arrival_floor(_seen()) < _controller(0.6, 0.15).arrival_floor(_seen())
    assert _controller(1.5, 0.15).arrival_floor(_seen()) == TOP


def test_a_ttft_measured_below_the_top_clock_grows_like_1_over_f_from_there() -> None:
    """A TTFT at 0.5 of its SLO measured at 900 MHz meets it from 450 MHz up (1/f from
    where it was measured); from the top clock the law held the floor at 900 MHz, twice
    the clock the measurement needs."""
    controller = OnlineMPCController(control_period_s=PERIOD_S)
    controller.model = _Model()  # type: ignore[assignment]
    controller.remember_ttft_pressure(9.0, 0.5, PERIOD_S / 0.15, 900.0)
    assert controller.arrival_floor(_seen()) == pytest.approx(_lowest(450.0 / TOP))
    # Over its SLO where it was measured: no clock below the top is known to meet it.
    controller.remember_ttft_pressure(9.5, 1.2, PERIOD_S / 0.15, 900.0)
    assert controller.arrival_floor(_seen()) == TOP


def test_the_floor_reads_the_clock_each_ttft_was_measured_at() -> None:
    """The pressure an observation brings is kept with the higher of its window's clock
    and the one before (its prompts arrived under either)."""
    controller = OnlineMPCController(control_period_s=PERIOD_S)
    controller.model = _Model()  # type: ignore[assignment]
    for time_s, clock in ((9.75, 900.0), (10.0, 810.0)):
        seen = replace(
            _seen(),
            time_s=time_s,
            requested_clock_mhz=clock,
            ttft_recent_s=0.075,
            ttft_slo_s=0.15,
        )
        controller.idle_prefill_clock(seen, (0.15, 0.05))
    assert [pressure[3] for pressure in controller._prefill_pressures] == [900.0, 900.0]
    assert controller.arrival_floor(_seen()) == pytest.approx(_lowest(450.0 / TOP))


def test_the_worst_pressure_of_the_last_minute_counts() -> None:
    controller = _controller(0.3, 0.15)
    controller.remember_ttft_pressure(9.5, 0.7, PERIOD_S / 0.15)
    controller.remember_ttft_pressure(9.75, 0.2, PERIOD_S / 0.15)
    assert controller.arrival_floor(_seen()) == pytest.approx(_lowest(0.7))
    # A window whose SLO (a long prompt's allowance) spans more than a period adds none.
    controller.remember_ttft_pressure(9.9, 0.95, PERIOD_S / 0.6)
    assert controller.arrival_floor(_seen()) == pytest.approx(_lowest(0.7))


def test_no_floor_where_the_slo_spans_a_period_or_nothing_is_prefilled() -> None:
    lowest = float(CLOCKS[0])
    # A 0.4 s SLO outlasts the 0.25 s period: a later decision can still act.
    assert PERIOD_S / 0.4 * ARRIVAL_FLOOR_PERIODS < 1.0
    assert _controller(0.9, 0.4).arrival_floor(_seen()) == lowest
    # A decode pool prefills nothing.
    assert _controller(0.6, 0.15).arrival_floor(_seen(role="decode")) == lowest
    # Nothing measured yet.
    empty = OnlineMPCController(control_period_s=PERIOD_S)
    empty.model = _Model()  # type: ignore[assignment]
    assert empty.arrival_floor(_seen()) == lowest


# ---------------------------------------------------------------- closed loop
DURATION_S = 120.0


def _run(
    plant: ServingPlant,
    requests: tuple[Request, ...],
    spec: ControllerConfig,
    period_s: float,
    slo_target: SLOTarget | None = None,
) -> ServingResult:
    """As a node runs it: the safety chain, a vLLM node's view of the engine."""
    return scoreboard_run(plant, requests, spec, period_s, slo_target, view="vllm")


def test_a_ttft_slo_shorter_than_the_period_is_held() -> None:
    """An 80 ms TTFT SLO (plus the per-prompt allowance: 0.1-0.2 s for the trace's
    prompts) under 0.25 s decisions: before the floor, the decode descent and the MPC
    lowered the clock where a prompt arriving in the period missed (97.3 % against the
    top clock's 99.6 % on 180 s at 60 % load)."""
    profile = shape_profile(
        replace(BASE, name="tight-ttft", description="TTFT 80 ms", ttft_slo_s=0.08)
    )
    plant = ServingPlant.from_profile(profile)
    requests = build_scenario("azure-conv-10min", plant, "cap70", DURATION_S).requests
    assert len(requests) > 100
    top = _run(plant, requests, MaxControllerConfig(kind="max"), 1.0)
    target = SLOTarget(attainment=1.0 - SLO_TOLERANCE, window_s=DURATION_S)
    online = _run(plant, requests, OnlineMPCControllerConfig(kind="mpc-online"), PERIOD_S, target)
    a_top, a_online = top.metrics.slo_attainment, online.metrics.slo_attainment
    assert a_top is not None and a_online is not None
    assert holds_slo(a_online, a_top), (a_online, a_top)
    assert online.metrics.energy_j < top.metrics.energy_j
