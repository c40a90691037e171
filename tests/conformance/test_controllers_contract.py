"""One contract, every controller kind.

Every kind the config accepts (``max``, ``fixed``, ``reactive``, ``open-loop``, ``mpc``,
``mpc-slsqp``, ``mpc-online``, and ``mpc-online`` keeping its model in a state directory,
and the peer governors ``power-cap``, ``dps``, ``power-profile``, ``default-dvfs``,
``agft``, ``pid``,
``throttllem``, ``greenllm`` and ``voltana``, and an outside package's factory, ``external``),
raw (the algorithm, :func:`unwrap`) and inside the safety chain the factory
(:func:`gpugov.daemon.decide.build_controller`) returns, on idle, burst and NaN-field
observations:

* raw, it decides a finite clock (and raises nothing) on every observation, also with
  NaN in any one measured field;
* inside the chain, it decides a clock of the supported set;
* ``copy.deepcopy`` of it, taken mid-run, decides the same as the original from there;
* :func:`gpugov.daemon.decide.warm_up` on it opens no file, renames none and makes no
  socket, and leaves it deciding as if it had never been warmed.

Controllers are built in one place, :func:`make_controller`, by the node's factory.
"""

from __future__ import annotations

import copy
import io
import math
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpugov.controllers.contract import unwrap
from gpugov.controllers.open_loop import PLAN_FORMAT, OpenLoopPlan, save_plan
from gpugov.daemon.controller_config import (
    PEER_CONTROLLER_CONFIGS,
    AGFTControllerConfig,
    ControllerConfig,
    DefaultDVFSControllerConfig,
    DPSControllerConfig,
    ExternalControllerConfig,
    FixedControllerConfig,
    GreenLLMControllerConfig,
    MaxControllerConfig,
    MPCControllerConfig,
    OnlineMPCControllerConfig,
    OpenLoopControllerConfig,
    PIDControllerConfig,
    PowerCapControllerConfig,
    PowerProfileControllerConfig,
    ReactiveControllerConfig,
    ThrottLLeMControllerConfig,
    VoltanaControllerConfig,
)
from gpugov.daemon.decide import ControllerContext, build_controller, warm_up
from gpugov.plant import load_profile
from gpugov.plant.types import ClockController, ServingObservation

PROFILE = load_profile("h100-sxm-llama3-8b")
CLOCKS_MHZ = tuple(float(c) for c in PROFILE.clock_mhz)
PERIOD_S = 1.0
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_UUID = "GPU-00000000-0000-4000-8000-000000000000"
SOLVE_TIME_LIMIT_S = 60.0
"""Far above any solve here, so no decision depends on how busy the machine is."""
ONLINE_WARMUP_S = 2.0
"""``mpc-online`` holds the top clock this long before its MPC decides (default 20 s):
short, so a few observations reach the MPC."""


# ------------------------------------------------------------------ the one factory
def make_controller(spec: ControllerConfig, *, safety: bool) -> ClockController:
    """The controller ``spec`` asks for on a one-GPU H100 domain, built by the node's
    factory: the chain it returns (``safety``), or the algorithm inside it. An
    ``mpc-online`` spec with a ``state_dir`` keeps its model there, as on a node."""
    state_dir = spec.state_dir if isinstance(spec, OnlineMPCControllerConfig) else None
    context = ControllerContext(
        period_s=PERIOD_S,
        supported_clocks_mhz=CLOCKS_MHZ,
        gpu_names=(GPU_NAME,),
        gpu_uuids=(GPU_UUID,),
        state_dir=None if state_dir is None else Path(state_dir),
        domain="conformance",
    )
    chain = build_controller(spec, context)
    return chain if safety else unwrap(chain)


# ------------------------------------------------------------------------ the kinds
KINDS = (
    "max",
    "fixed",
    "reactive",
    "open-loop",
    "mpc",
    "mpc-slsqp",
    "mpc-online",
    "mpc-online-persistent",
    "power-cap",
    "dps",
    "power-profile",
    "default-dvfs",
    "agft",
    "pid",
    "throttllem",
    "greenllm",
    "voltana",
    "external",
)


def spec_for(kind: str, plan: Path, state_dir: Path) -> ControllerConfig:
    """The config section of ``kind`` (:data:`KINDS`)."""
    match kind:
        case "max":
            return MaxControllerConfig(kind="max")
        case "fixed":
            return FixedControllerConfig(kind="fixed", clock_mhz=1200.0)
        case "reactive":
            return ReactiveControllerConfig(kind="reactive")
        case "open-loop":
            return OpenLoopControllerConfig(kind="open-loop", plan=plan)
        case "mpc" | "mpc-slsqp":
            return MPCControllerConfig(kind=kind, solve_time_limit_s=SOLVE_TIME_LIMIT_S)
        case "mpc-online" | "mpc-online-persistent":
            return OnlineMPCControllerConfig(
                kind="mpc-online",
                solve_time_limit_s=SOLVE_TIME_LIMIT_S,
                warmup_s=ONLINE_WARMUP_S,
                state_dir=state_dir if kind == "mpc-online-persistent" else None,
            )
        case "power-cap":
            return PowerCapControllerConfig(kind="power-cap")
        case "dps":
            return DPSControllerConfig(kind="dps", loop_s=1.0)
        case "power-profile":
            return PowerProfileControllerConfig(kind="power-profile", profile=PROFILE.name)
        case "default-dvfs":
            return DefaultDVFSControllerConfig(kind="default-dvfs")
        case "agft":
            return AGFTControllerConfig(kind="agft")
        case "pid":
            return PIDControllerConfig(kind="pid")
        case "throttllem":
            return ThrottLLeMControllerConfig(kind="throttllem")
        case "greenllm":
            return GreenLLMControllerConfig(kind="greenllm")
        case "voltana":
            return VoltanaControllerConfig(kind="voltana")
        case "external":
            return ExternalControllerConfig(
                kind="external", factory="example_outside_governor:make"
            )
    raise ValueError(f"unknown kind {kind!r}")


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A minimal valid open-loop plan file (four periods, written by ``save_plan``)."""
    saved = OpenLoopPlan(
        time_s=np.array([0.0, 1.0, 2.0, 3.0]),
        continuous_clock_mhz=np.array([1980.0, 1500.0, 1110.0, 900.0]),
        applied_clock_mhz=np.array([1980.0, 1500.0, 1110.0, 900.0]),
        predicted_backlog_s=np.array([0.0, 0.0, 0.0, 0.0, 0.0]),
        objective=1.0,
        optimization_method="conformance",
        success=True,
        message="a minimal valid plan",
        control_period_s=PERIOD_S,
        workload_checksum="none",
        profile_status="synthetic",
    )
    path = save_plan(saved, tmp_path_factory.mktemp("plan") / "plan.json")
    assert f'"{PLAN_FORMAT}"' in path.read_text()
    return path


@pytest.fixture
def spec(kind: str, plan: Path, tmp_path_factory: pytest.TempPathFactory) -> ControllerConfig:
    """The test's kind as a config section; a persistent one gets a fresh state directory
    (no test restores a model another one saved)."""
    fresh = kind == "mpc-online-persistent"
    return spec_for(kind, plan, tmp_path_factory.mktemp("state") if fresh else Path("."))


# ------------------------------------------------------------------ observations
TIMES_S = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
"""Six control periods: two of ``mpc-online``'s warm-up at the top clock (see
:data:`ONLINE_WARMUP_S`), then its MPC."""
SCENARIOS = ("idle", "burst", "nan")
MEASURED = (
    "temperature_c",
    "power_w",
    "energy_j",
    "realized_clock_mhz",
    "gpu_utilization",
    "power_limit_w",
    "prefill_remaining_tokens",
    "generated_decode_tokens",
    "kv_tokens",
    "kv_capacity_tokens",
    "output_tokens_total",
    "prompt_tokens_total",
    "ttft_recent_s",
    "tpot_recent_s",
)
"""The fields a node measures (NVML and the engine's /metrics): any of them may be NaN.
Configured values (SLOs, thermal limit, supported clocks) are not part of this check."""


def observation(scenario: str, time_s: float, nan: tuple[str, ...] = ()) -> ServingObservation:
    """What the node sees at ``time_s``: an idle GPU, a prompt burst over a busy decode
    batch, or that burst with NaN in every field of ``nan`` (all measured fields for the
    ``nan`` scenario)."""
    step = int(round(time_s / PERIOD_S))
    fields: dict[str, Any] = {
        "time_s": time_s,
        "step_index": step,
        "arrived_requests": 0,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 0,
        "generated_decode_tokens": 0.0,
        "temperature_c": 38.0,
        "kv_capacity_tokens": 400_000.0,
        "power_w": 95.0,
        "energy_j": 95.0 * time_s,
        "requested_clock_mhz": CLOCKS_MHZ[-1],
        "realized_clock_mhz": CLOCKS_MHZ[-1],
        "gpu_utilization": 0.0,
        "power_limit_w": 700.0,
        "thermal_limit_c": 87.0,
        "supported_clocks_mhz": CLOCKS_MHZ,
        "clock_event_reasons": 0x1,
        "model_name": "conformance-model",
        "ttft_slo_s": PROFILE.ttft_slo_s,
        "tpot_slo_s": PROFILE.tpot_slo_s,
    }
    if scenario != "idle":
        fields.update(
            arrived_requests=40 * (step + 1),
            prefill_remaining_tokens=60_000.0,
            decode_active=64,
            generated_decode_tokens=6_400.0 + 640.0 * step,
            temperature_c=62.0,
            waiting_requests=30,
            completed_requests=10 * step,
            output_tokens_total=3_000.0 * step,
            prompt_tokens_total=20_000.0 * step,
            kv_tokens=150_000.0,
            power_w=520.0,
            energy_j=520.0 * time_s,
            gpu_utilization=1.0,
            clock_event_reasons=0,
            ttft_recent_s=1.5 * PROFILE.ttft_slo_s,
            tpot_recent_s=0.8 * PROFILE.tpot_slo_s,
        )
    for name in MEASURED if scenario == "nan" else nan:
        fields[name] = math.nan
    return ServingObservation(**fields)


def sequence(scenario: str, nan: tuple[str, ...] = ()) -> list[ServingObservation]:
    """The observations of one run, in time order."""
    return [observation(scenario, time_s, nan) for time_s in TIMES_S]


def cases(second: tuple[str, ...]) -> list[Any]:
    """``(kind, x)`` for every kind and every ``x`` in ``second``."""
    return [pytest.param(kind, other) for kind in KINDS for other in second]


# ----------------------------------------------------------------------- tests
@pytest.mark.parametrize(("kind", "scenario"), cases(SCENARIOS))
def test_raw_decision_is_a_finite_clock(spec: ControllerConfig, kind: str, scenario: str) -> None:
    controller = make_controller(spec, safety=False)
    for seen in sequence(scenario):
        decision = controller(seen)
        assert isinstance(decision, float | int) and math.isfinite(decision), (seen, decision)
        assert decision > 0.0


@pytest.mark.parametrize(("kind", "scenario"), cases(SCENARIOS))
def test_chain_decision_is_a_supported_clock(
    spec: ControllerConfig, kind: str, scenario: str
) -> None:
    controller = make_controller(spec, safety=True)
    for seen in sequence(scenario):
        assert controller(seen) in CLOCKS_MHZ


@pytest.mark.parametrize(("kind", "field"), cases(MEASURED))
def test_nan_in_one_measured_field_still_decides(
    spec: ControllerConfig, kind: str, field: str
) -> None:
    controller = make_controller(spec, safety=False)
    for seen in sequence("burst", nan=(field,)):
        assert math.isfinite(controller(seen))


@pytest.mark.parametrize("safety", [False, True], ids=["raw", "chain"])
@pytest.mark.parametrize(("kind", "scenario"), cases(SCENARIOS))
def test_a_deep_copy_decides_the_same(
    spec: ControllerConfig, kind: str, scenario: str, safety: bool
) -> None:
    original = make_controller(spec, safety=safety)
    observations = sequence(scenario)
    half = len(observations) // 2
    for seen in observations[:half]:
        original(seen)
    twin = copy.deepcopy(original)
    rest = observations[half:]
    assert [twin(seen) for seen in rest] == [original(seen) for seen in rest]


def _no_io(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"I/O during warm-up: {args[:2]!r}")


@pytest.mark.parametrize("safety", [False, True], ids=["raw", "chain"])
@pytest.mark.parametrize(("kind", "stage"), cases(("warm-up",)))
def test_warm_up_does_no_io(
    spec: ControllerConfig,
    kind: str,
    stage: str,
    safety: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    controller = make_controller(spec, safety=safety)
    # A kernel's first-use compile or cache load is the library's, not the controller's:
    # pay it before the check (warm_up decides on a copy; the controller is untouched).
    warm_up(make_controller(spec, safety=False), CLOCKS_MHZ)
    before = copy.deepcopy(controller)
    monkeypatch.setattr("builtins.open", _no_io)
    monkeypatch.setattr(io, "open", _no_io)  # pathlib's read_text and write_text
    monkeypatch.setattr(os, "replace", _no_io)
    monkeypatch.setattr(socket, "socket", _no_io)
    seconds = warm_up(controller, CLOCKS_MHZ, thermal_limit_c=87.0)
    monkeypatch.undo()
    assert seconds >= 0.0
    # The warm-up leaves no trace: the controller decides as one that was never warmed.
    run = sequence("burst")
    assert [controller(seen) for seen in run] == [before(seen) for seen in run]


def test_every_kind_the_config_accepts_is_covered(plan: Path) -> None:
    kinds = {spec_for(kind, plan, Path(".")).kind for kind in KINDS}
    accepted: set[str] = set()
    for model in (
        MaxControllerConfig,
        FixedControllerConfig,
        ReactiveControllerConfig,
        OpenLoopControllerConfig,
        MPCControllerConfig,
        OnlineMPCControllerConfig,
        *PEER_CONTROLLER_CONFIGS,
        ExternalControllerConfig,
    ):
        annotation = model.model_fields["kind"].annotation
        accepted.update(getattr(annotation, "__args__", ()))
    assert kinds == accepted


def test_observations_are_what_the_scenarios_say() -> None:
    idle, burst, nan = (observation(s, 1.0) for s in SCENARIOS)
    assert idle.prefill_remaining_tokens == 0.0 and idle.decode_active == 0
    assert burst.prefill_remaining_tokens > 0.0 and burst.ttft_recent_s is not None
    assert all(math.isnan(getattr(nan, name)) for name in MEASURED)
    assert nan.ttft_slo_s == PROFILE.ttft_slo_s  # configured values stay valid
