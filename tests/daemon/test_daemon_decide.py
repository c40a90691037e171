"""Controller factory and the safety wrappers."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from gpugov.controllers.baseline import ReactiveGovernor, maximum_clock_controller
from gpugov.controllers.contract import ControllerWrapper, Named, layers, unwrap
from gpugov.daemon.controller_config import (
    FixedControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OpenLoopControllerConfig,
    ReactiveControllerConfig,
)
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import ControllerContext, Forecasts, build_controller
from gpugov.daemon.errors import ControllerError
from gpugov.daemon.safety import (
    ClampToSupported,
    FloorClock,
    MinimumDwell,
    SafetySettings,
    ThermalGuard,
    invalid_decisions,
    raw_decision,
    with_safety,
)
from gpugov.plant.types import ServingObservation

CLOCKS = (345.0, 900.0, 1200.0, 1500.0, 1980.0)
CONTEXT = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS)


def _obs(t: float = 0.0, requested: float | None = None) -> ServingObservation:
    return ServingObservation(
        time_s=t,
        step_index=int(t),
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=50.0,
        supported_clocks_mhz=CLOCKS,
        requested_clock_mhz=requested,
    )


class Scripted:
    """Returns the scripted clocks in order."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)
        self.name = "scripted"

    def __call__(self, observation: ServingObservation) -> float:
        return self.values.pop(0)


def test_factory_kinds(tmp_path: Path) -> None:
    chain = build_controller(MaxControllerConfig(kind="max"), CONTEXT)
    assert unwrap(chain) is maximum_clock_controller and chain(_obs()) == 1980.0
    assert (
        build_controller(FixedControllerConfig(kind="fixed", clock_mhz=1200), CONTEXT)(_obs())
        == 1200
    )
    reactive = unwrap(
        build_controller(ReactiveControllerConfig(kind="reactive", step_mhz=30.0), CONTEXT)
    )
    assert isinstance(reactive, ReactiveGovernor) and reactive.step_mhz == 30.0
    # An unset knob keeps the controller's own default (one place: the controller).
    default = unwrap(build_controller(ReactiveControllerConfig(kind="reactive"), CONTEXT))
    assert (
        isinstance(default, ReactiveGovernor)
        and default.up_fraction == ReactiveGovernor().up_fraction
    )
    with pytest.raises(ControllerError, match="cannot read plan"):
        build_controller(
            OpenLoopControllerConfig(kind="open-loop", plan=tmp_path / "missing.json"), CONTEXT
        )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "nope"}))
    with pytest.raises(ControllerError):
        build_controller(OpenLoopControllerConfig(kind="open-loop", plan=bad), CONTEXT)
    with pytest.raises(ControllerError, match="profile"):
        build_controller(MPCControllerConfig(kind="mpc", profile="no-such-profile"), CONTEXT)


def test_factory_returns_the_deployed_chain_named_after_the_spec() -> None:
    context = ControllerContext(
        period_s=1.0,
        supported_clocks_mhz=CLOCKS,
        safety=SafetySettings(floor_mhz=900.0, dwell_s=2.0),
    )
    chain = build_controller(FixedControllerConfig(kind="fixed", clock_mhz=500), context)
    kinds = [type(layer) for layer in layers(chain)[:-1]]
    assert kinds == [MinimumDwell, FloorClock, ThermalGuard, ClampToSupported]
    assert all(
        isinstance(layer, Named) and layer.name == "fixed:500" for layer in layers(chain)[:-1]
    )
    assert chain(_obs()) == 900.0  # the floor binds: 500 MHz is below it
    assert raw_decision(chain, 0.0) == 500.0


def test_factory_mpc_builds() -> None:
    pytest.importorskip("gpugov.controllers.mpc.controller")
    controller = build_controller(MPCControllerConfig(kind="mpc", horizon_s=5.0), CONTEXT)
    assert isinstance(controller, ControllerWrapper) and controller.name == "mpc"


def _mpc(spec: MPCControllerConfig, **context: object) -> object:
    from gpugov.plant import ServingPlant, load_profile

    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    full = ControllerContext.for_plant(plant, (), period_s=1.0, **context)  # type: ignore[arg-type]
    return unwrap(build_controller(spec, full))


@pytest.mark.parametrize(
    ("kind", "overrides", "hedged", "fed_back"),
    [
        ("mpc", {}, True, True),
        ("mpc-slsqp", {}, False, False),
        ("mpc", {"burst_hedge": False, "slo_feedback": False}, False, False),
        ("mpc-slsqp", {"burst_hedge": True}, True, False),
        ("mpc-slsqp", {"slo_feedback": True}, False, True),
    ],
)
def test_mpc_online_corrections_default_per_kind_and_override(  # type: ignore[no-untyped-def]
    kind, overrides, hedged, fed_back
) -> None:
    from gpugov.controllers.adaptation import BurstHedge, SLOFeedback

    controller = _mpc(MPCControllerConfig(kind=kind, **overrides))
    assert isinstance(controller.burst_hedge, BurstHedge) is hedged  # type: ignore[attr-defined]
    assert isinstance(controller.slo_feedback, SLOFeedback) is fed_back  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kind", "overrides", "cap"),
    [
        ("mpc", {}, 1.0),
        ("mpc-slsqp", {}, None),
        ("mpc", {"ttft_excess_cap": 3.0}, 3.0),
        ("mpc-slsqp", {"ttft_excess_cap": 2.0}, 2.0),
    ],
)
def test_mpc_ttft_excess_cap_defaults_per_kind(kind, overrides, cap) -> None:  # type: ignore[no-untyped-def]
    controller = _mpc(MPCControllerConfig(kind=kind, **overrides))
    assert controller.ttft_excess_cap == cap  # type: ignore[attr-defined]


def test_time_mode_and_forecasts_reach_the_mpc() -> None:
    forecasts = Forecasts(mean_prompt_tokens=300.0, mean_output_tokens=40.0)
    virtual = _mpc(MPCControllerConfig(kind="mpc"), forecasts=forecasts)
    assert virtual.solve_budget_evaluations is not None  # type: ignore[attr-defined]
    assert virtual.mean_prompt_tokens == 300.0  # type: ignore[attr-defined]
    wall = _mpc(
        MPCControllerConfig(kind="mpc", mean_prompt_tokens=700.0),
        time_mode="wall",
        forecasts=forecasts,
    )
    assert wall.solve_budget_evaluations is None  # type: ignore[attr-defined]
    assert wall.mean_prompt_tokens == 700.0  # the spec's own value wins  # type: ignore[attr-defined]


def test_the_mpc_counts_its_clock_change_from_the_applied_clock() -> None:
    controller: Any = _mpc(MPCControllerConfig(kind="mpc"))
    seen: list[float] = []
    original = controller.problem

    def recording(observation: ServingObservation, rate: float) -> Any:
        problem = original(observation, rate)
        seen.append(problem.previous_clock_mhz)
        return problem

    controller.problem = recording
    controller(_obs(0.0, requested=1980.0))
    held = 1200.0 if controller.current_clock != 1200.0 else 1500.0  # not its own wish
    controller(_obs(1.0, requested=held))
    assert seen == [1980.0, held]


def test_open_loop_plan_round_trip(tmp_path: Path) -> None:
    import numpy as np

    from gpugov.controllers.open_loop import OpenLoopPlan, save_plan

    plan = OpenLoopPlan(
        time_s=np.array([0.0, 1.0]),
        continuous_clock_mhz=np.array([1000.0, 1500.0]),
        applied_clock_mhz=np.array([900.0, 1500.0]),
        predicted_backlog_s=np.array([0.0, 0.0, 0.0]),
        objective=1.0,
        optimization_method="test",
        success=True,
        message="",
        control_period_s=1.0,
        workload_checksum="x",
        profile_status="synthetic",
    )
    path = save_plan(plan, tmp_path / "plan.json")
    context = ControllerContext(
        period_s=1.0, supported_clocks_mhz=CLOCKS, safety=SafetySettings(dwell_s=0.0)
    )
    controller = build_controller(OpenLoopControllerConfig(kind="open-loop", plan=path), context)
    assert controller(_obs(0.0)) == 900.0 and controller(_obs(1.5)) == 1500.0


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("max", "max"),
        ("fixed:1410", "fixed"),
        ("reactive", "reactive"),
        ("mpc", "mpc"),
        ("mpc:h100-sxm-llama3-8b", "mpc"),
        ("open-loop:p.json", "open-loop"),
    ],
)
def test_parse_controller_spec(text: str, kind: str) -> None:
    assert parse_controller_spec(text).kind == kind


@pytest.mark.parametrize("text", ["fixed:abc", "fixed:-5", "open-loop", "nope"])
def test_parse_controller_spec_errors(text: str) -> None:
    with pytest.raises(ValueError, match="controller"):
        parse_controller_spec(text)


def test_clamp_quantises_down_within_range() -> None:
    clamp = ClampToSupported(Scripted([1300.0, 5000.0, 100.0, math.nan, 1500.0]), CLOCKS)
    assert [clamp(_obs()) for _ in range(5)] == [1200.0, 1980.0, 345.0, 1980.0, 1500.0]
    assert clamp.invalid_decisions == 1
    assert invalid_decisions(MinimumDwell(clamp, 0.0)) == 1


def test_floor_rounds_up_onto_supported() -> None:
    floor = FloorClock(ClampToSupported(Scripted([345.0, 1500.0]), CLOCKS), 1000.0, CLOCKS)
    assert floor.floor_mhz == 1200.0
    assert floor(_obs()) == 1200.0 and floor(_obs()) == 1500.0


def test_dwell_holds_a_lower_clock_and_lets_a_raise_through_at_once() -> None:
    dwell = MinimumDwell(
        Scripted([1500.0, 900.0, 900.0, 1200.0, 1980.0, 900.0, 900.0]), dwell_s=2.0
    )
    out = [dwell(_obs(t)) for t in (0.0, 1.0, 2.0, 3.0, 3.5, 4.5, 5.5)]
    # 900 waits out the dwell from 1500 (t=0); 1200 and 1980 are raises: at once; 900 then
    # waits 2 s from the last change (t=3.5).
    assert out == [1500.0, 1500.0, 900.0, 1200.0, 1980.0, 1980.0, 900.0]
    assert dwell.suppressed == 2


def test_no_relock_sooner_than_the_minimum_interval_raises_included() -> None:
    """Decisions every 50 ms (a fake clock: the observations' times): no two changes of
    the applied clock less than 100 ms apart, and a raise is late by at most 100 ms."""
    script = [1500.0, 1980.0, 1980.0, 1200.0, 1980.0, 1980.0, 900.0, 1980.0, 1980.0]
    chain = MinimumDwell(Scripted(script), dwell_s=0.0, min_relock_interval_s=0.1)
    times = [0.05 * k for k in range(len(script))]
    out = [chain(_obs(t)) for t in times]
    # The raise asked at 0.05 s passes at 0.10 s; 1200 (0.15 s) is deferred and no longer
    # asked by 0.20 s; 900 passes at 0.30 s; the raise asked at 0.35 s passes at 0.40 s.
    assert out == [1500.0, 1500.0, 1980.0, 1980.0, 1980.0, 1980.0, 900.0, 900.0, 1980.0]
    changes = [t for t, a, b in zip(times[1:], out[:-1], out[1:], strict=True) if a != b]
    assert changes == pytest.approx([0.10, 0.30, 0.40])
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(changes))
    assert chain.deferred == 3 and chain.suppressed == 0
    # At a period of the interval or longer it never binds.
    slow = MinimumDwell(Scripted([1500.0, 1980.0, 900.0, 1980.0]), 0.0, 0.1)
    assert [slow(_obs(0.1 * k)) for k in range(4)] == [1500.0, 1980.0, 900.0, 1980.0]
    assert slow.deferred == 0
    # The dwell still holds a lower clock longer than the interval.
    dwell = MinimumDwell(Scripted([1980.0, 900.0, 900.0]), 1.0, 0.1)
    assert [dwell(_obs(t)) for t in (0.0, 0.5, 1.0)] == [1980.0, 1980.0, 900.0]
    assert dwell.suppressed == 1 and dwell.deferred == 0


def test_the_chain_takes_the_relock_interval_from_the_settings() -> None:
    chain = with_safety(Scripted([900.0, 1980.0]), CLOCKS, SafetySettings(dwell_s=0.0))
    assert chain.min_relock_interval_s == pytest.approx(0.1)
    assert chain(_obs(0.0)) == 900.0 and chain(_obs(0.05)) == 900.0  # deferred
    with pytest.raises(ValueError, match="min_relock_interval_s"):
        SafetySettings(min_relock_interval_s=-1.0)
    assert SafetySettings().as_dict()["min_relock_interval_s"] == pytest.approx(0.1)


def test_controller_exceptions_propagate_through_wrappers() -> None:
    def broken(observation: ServingObservation) -> float:
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        with_safety(broken, CLOCKS)(_obs())


def test_with_safety_chain() -> None:
    inner = Scripted([100.0])
    wrapped = with_safety(inner, CLOCKS, SafetySettings(floor_mhz=900.0, dwell_s=1.0))
    assert wrapped(_obs()) == 900.0
    assert wrapped.unwrapped is inner and unwrap(wrapped) is inner
    assert wrapped.name == "scripted"


def test_one_name_per_controller_and_old_names_map_to_it() -> None:
    from gpugov.daemon.controller_spec import canonical_controller_name, spec_name

    for text, name in [
        ("max", "max"),
        ("maximum", "max"),
        ("fixed:1410.0", "fixed:1410"),
        ("reactive", "reactive"),
        ("mpc", "mpc"),
        ("mpc-slsqp", "mpc-slsqp"),
        ("mpc:h200-sxm-llama3-8b", "mpc"),
    ]:
        assert spec_name(parse_controller_spec(text)) == name
    for old, new in [
        ("mpc_clock", "mpc"),
        ("mpc_slsqp_clock", "mpc-slsqp"),
        ("maximum_clock_controller", "max"),
        ("reactive_governor", "reactive"),
        ("open_loop_clock", "open-loop"),
        ("Offline plan", "open-loop"),
        ("fixed_1410_mhz", "fixed:1410"),
        ("mpc_fast", "mpc"),
        ("mpc", "mpc"),
    ]:
        assert canonical_controller_name(old) == new


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("reactive:foo", "reactive takes no argument"),
        ("max:", "max takes no argument"),
        ("mpc:garbage", "unknown profile 'garbage'"),
        ("mpc-slsqp:", "name a profile"),
        ("mpc:/nonexistent/p.json", "profile file not found"),
    ],
)
def test_controller_spec_arguments_are_checked(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_controller_spec(text)


def test_the_dwell_and_interval_count_whole_periods_of_ticks_that_wake_late() -> None:
    """A node's ticks wake a little after their targets, each by its own fraction of a
    millisecond: a lowering two periods after a raise whose tick woke later passes the
    0.5 s dwell at 0.25 s, and a change one period after another the 0.1 s interval at
    0.1 s (each waited a period more), while a change sooner than either still waits."""
    late = [0.0002, 0.0002, 0.00005, 0.0001, 0.0001]  # each tick's wake after its target
    dwell = with_safety(
        Scripted([1500.0, 1980.0, 900.0, 900.0, 900.0]),
        CLOCKS,
        SafetySettings(dwell_s=0.5, min_relock_interval_s=0.1),
        period_s=0.25,
    )
    out = [dwell(_obs(0.25 * k + late[k])) for k in range(5)]
    assert out == [1500.0, 1980.0, 1980.0, 900.0, 900.0]  # 1980 held two periods: 0.5 s
    relock = with_safety(
        Scripted([1500.0, 1980.0, 1200.0, 1500.0]),
        CLOCKS,
        SafetySettings(dwell_s=0.0, min_relock_interval_s=0.1),
        period_s=0.1,
    )
    assert [relock(_obs(0.1 * k + late[k])) for k in range(4)] == [1500.0, 1980.0, 1200.0, 1500.0]
    fast = with_safety(
        Scripted([1500.0, 1980.0, 1980.0]),
        CLOCKS,
        SafetySettings(dwell_s=0.0, min_relock_interval_s=0.1),
        period_s=0.05,
    )
    assert [fast(_obs(0.05 * k + late[k])) for k in range(3)] == [1500.0, 1500.0, 1980.0]
