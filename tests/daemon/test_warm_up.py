"""The controller is built and warmed before a paced plant's clock starts.

A first-use cost (the fast MPC's numba compile, 8-15 s on a cold machine) used to run
after ``run --simulate`` had started its paced clock, so hundreds of requests arrived
before the first decision. Here the wall clock is fake: building the MPC "takes" 15 s
of it, and the first decision must still happen at plant time ~0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpugov.controllers.mpc.fast as fast_mpc
import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.run_simulated as run_simulated
from gpugov.daemon.decide import warm_up
from gpugov.daemon.loop import ScaledClock
from gpugov.daemon.record_reader import read_recording
from gpugov.plant.types import ServingObservation

COMPILE_S = 15.0


class _FakeWall:
    """The real monotonic clock plus whatever a fake compile added."""

    def __init__(self) -> None:
        import time

        self._monotonic = time.monotonic
        self.offset_s = 0.0

    def __call__(self) -> float:
        return self._monotonic() + self.offset_s


def test_first_decision_at_plant_time_zero_despite_a_slow_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wall = _FakeWall()
    real_compile = fast_mpc.compile_kernels

    def slow_compile() -> None:
        real_compile()
        wall.offset_s += COMPILE_S  # a cold machine's compile, on the fake wall clock

    class FakeWallClock(ScaledClock):
        def __init__(self, speed: float, *, stop: Any = None) -> None:
            super().__init__(speed, wall=wall, stop=stop)

    monkeypatch.setattr(fast_mpc, "compile_kernels", slow_compile)
    monkeypatch.setattr(run_simulated, "ScaledClock", FakeWallClock)
    record = tmp_path / "run.jsonl"
    argv = [
        "run",
        "--simulate",
        "--controller",
        "mpc",
        "--speed",
        "50",
        "--duration",
        "20",
        "--metrics-address",
        "none",
        "--record",
        str(record),
    ]
    assert node_cli.main(argv) == 0
    assert wall.offset_s >= COMPILE_S, "the fake compile did not run: the test proves nothing"
    _, ticks = read_recording(record)
    first = ticks[0]
    # Without the warm-up ordering the plant would be 50 x 15 s = 750 s in at the first
    # tick, with every request of the 20 s window already arrived and served.
    assert first["time_s"] < 1.0
    assert first["decision_mhz"] is not None
    assert first["observation"]["arrived_requests"] <= 5
    assert len(ticks) >= 5, "the run should last the 20 s window"


class _Counting:
    """A stateful controller: counts its calls, remembers the last time it saw."""

    def __init__(self) -> None:
        self.calls = 0
        self.last_time_s: float | None = None

    def __call__(self, observation: ServingObservation) -> float:
        self.calls += 1
        self.last_time_s = observation.time_s
        return observation.supported_clocks_mhz[-1]


def test_warm_up_decides_on_a_copy_and_leaves_the_controller_untouched() -> None:
    controller = _Counting()
    seconds = warm_up(controller, (900.0, 1980.0), thermal_limit_c=85.0)
    assert seconds >= 0.0
    assert controller.calls == 0 and controller.last_time_s is None


def _h100_chain(spec: Any, *, period_s: float) -> tuple[Any, tuple[float, ...]]:
    """``spec``'s controller in its chain on the H100 profile's clocks, and the clocks."""
    from gpugov.daemon.decide import ControllerContext, build_controller
    from gpugov.plant import load_profile

    clocks = tuple(float(c) for c in load_profile("h100-sxm-llama3-8b").clock_mhz)
    context = ControllerContext(period_s=period_s, supported_clocks_mhz=clocks)
    return build_controller(spec, context), clocks


def test_warm_up_compiles_the_fast_mpc_and_keeps_its_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpugov.controllers.mpc.controller import MPCController
    from gpugov.daemon.controller_config import MPCControllerConfig

    chain, clocks = _h100_chain(MPCControllerConfig(kind="mpc"), period_s=1.0)
    controller = chain.unwrapped
    assert isinstance(controller, MPCController)
    warm_up(chain, clocks)
    assert controller.solve_times == [] and controller.last_control_index is None
    assert controller.fallback_count == 0


def test_warm_up_runs_mpc_online_past_its_warm_up_on_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``mpc-online`` stays at the top clock through its warm-up, so its first decision
    runs none of its compiled code: the warm-up also runs the regression step, the
    model's tables and the MPC's search on the copy (``warm_kernels``), and the node's
    controller keeps no trace of them."""
    from gpugov.controllers.online.controller import OnlineMPCController
    from gpugov.daemon.controller_config import OnlineMPCControllerConfig

    chain, clocks = _h100_chain(OnlineMPCControllerConfig(kind="mpc-online"), period_s=0.25)
    controller = chain.unwrapped
    assert isinstance(controller, OnlineMPCController)
    probes: list[OnlineMPCController] = []
    real = OnlineMPCController.warm_kernels

    def spy(self: OnlineMPCController, observation: ServingObservation) -> None:
        real(self, observation)
        probes.append(self)

    monkeypatch.setattr(OnlineMPCController, "warm_kernels", spy)
    warm_up(chain, clocks, thermal_limit_c=85.0)
    (probe,) = probes
    assert probe is not controller
    assert probe.model is not None and probe.model.time.samples == 1
    assert probe.mpc is not None and len(probe.mpc.solve_times) == 1
    assert controller.model is None and controller.mpc is None


def test_warm_up_fits_what_a_hint_needs_for_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hint's prior is built at the engine's first ``model_name``, and the roofline's
    efficiency and attention fits it needs took 40-110 ms of that decision (``run
    --simulate``'s demo went fail-safe on stale engine data there, 0.8 s into the run):
    they depend on the GPU alone, which the node knows at the start, so the warm-up fits
    them (process-wide caches) before the loop starts."""
    from gpugov.controllers.online import prior
    from gpugov.daemon.controller_config import OnlineMPCControllerConfig
    from gpugov.daemon.decide import ControllerContext, build_controller
    from gpugov.plant import load_profile

    fitted: list[str] = []
    monkeypatch.setattr(prior.calibration, "fit_efficiency", fitted.append)
    monkeypatch.setattr(prior.calibration, "fit_attention", lambda: fitted.append("attention"))
    clocks = tuple(float(c) for c in load_profile("h100-sxm-llama3-8b").clock_mhz)
    context = ControllerContext(
        period_s=0.25, supported_clocks_mhz=clocks, gpu_names=("NVIDIA H100 80GB HBM3",)
    )
    chain = build_controller(OnlineMPCControllerConfig(kind="mpc-online"), context)
    assert fitted == []
    warm_up(chain, clocks, thermal_limit_c=85.0)
    assert fitted == [prior.GPUS["h100"].efficiency_from, "attention"]
    # A GPU of no known family gives no prior, and nothing to fit.
    fitted.clear()
    unknown = ControllerContext(
        period_s=0.25, supported_clocks_mhz=clocks, gpu_names=("Made-up Accelerator",)
    )
    warm_up(build_controller(OnlineMPCControllerConfig(kind="mpc-online"), unknown), clocks)
    assert fitted == []


class _HoldsALock:
    """An outside controller holding what cannot be copied (a lock: a client session's)."""

    def __init__(self, clocks: tuple[float, ...]) -> None:
        import threading

        self.clocks, self.lock, self.calls = clocks, threading.Lock(), 0

    def __call__(self, observation: ServingObservation) -> float:
        with self.lock:
            self.calls += 1
            return self.clocks[-1]


@pytest.mark.parametrize("time_mode", ["wall", "virtual"])
def test_an_outside_controller_that_cannot_be_copied_skips_its_warm_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, time_mode: str
) -> None:
    """Its copy for the warm-up raised (TypeError: cannot pickle '_thread.lock'), which the
    start logged as the controller's warm-up decision raising; now one line says it is
    not warmed up, and the controller itself is not called."""
    import logging
    import sys
    import types

    from gpugov.daemon.controller_spec import parse_controller_spec
    from gpugov.daemon.decide import ControllerContext, build_controller

    clocks = (900.0, 1980.0)
    made: list[_HoldsALock] = []

    def make(context: Any) -> _HoldsALock:
        made.append(_HoldsALock(clocks))
        return made[-1]

    plugin = types.ModuleType("gpugov_locked_plugin")
    plugin.make = make  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpugov_locked_plugin", plugin)
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=clocks, time_mode=time_mode)
    chain = build_controller(parse_controller_spec("gpugov_locked_plugin:make"), context)
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.decide"):
        assert warm_up(chain, clocks) == 0.0
    assert made[0].calls == 0
    assert any("cannot be copied for a warm-up" in r.getMessage() for r in caplog.records)
    chain.close()  # a node's chain: its decision deadline's worker


@pytest.mark.parametrize("time_mode", ["wall", "virtual"])
def test_an_outside_function_is_warmed_up_on_a_copy_of_its_closure(
    monkeypatch: pytest.MonkeyPatch, time_mode: str
) -> None:
    """A function (a closure keeping its own state, as the factory of docs/benchmark.md
    returns) was its own copy: the warm-up's dummy decision was its first real call, so a
    node's first decision was its second, and ``run --simulate`` ran other clocks than
    ``simulate`` on the same trace. The warm-up decides on a copy of its closure."""
    import sys
    import types

    from gpugov.daemon.controller_spec import parse_controller_spec
    from gpugov.daemon.decide import ControllerContext, build_controller

    clocks = (900.0, 1980.0)
    counts: list[list[int]] = []

    def make(context: Any) -> Any:
        calls = [0]  # its own state: a count, in its closure
        counts.append(calls)

        def decide(observation: ServingObservation) -> float:
            calls[0] += 1
            return clocks[-1] if calls[0] % 2 else clocks[0]

        return decide

    plugin = types.ModuleType("gpugov_closure_plugin")
    plugin.make = make  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpugov_closure_plugin", plugin)
    context = ControllerContext(period_s=1.0, supported_clocks_mhz=clocks, time_mode=time_mode)
    chain = build_controller(parse_controller_spec("gpugov_closure_plugin:make"), context)
    warm_up(chain, clocks)
    assert counts == [[0]]  # the warm-up counted on its copy
    first = ServingObservation(
        time_s=0.0,
        step_index=0,
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        supported_clocks_mhz=clocks,
    )
    assert chain(first) == clocks[-1] and counts == [[1]]  # its first call
    chain.close()
