"""A lock the driver realises off its clock is written once; a lock lost is written again.

A real driver may not run a GPU at exactly the clock it was locked to: it rounds the lock
to its own clock steps, holds it a bin lower, or holds it lower under a power cap, a
thermal, board or reliability limit. Writing the same lock again changes nothing there,
and each write (``nvmlDeviceSetGpuLockedClocks``) can stall a tensor-parallel group's
collectives; the readback once took such a GPU for one changed by someone else and wrote
its lock again every other tick. A lock that is really lost (the clocks reset by another
process, a driver reset) or replaced by another one far from it is still written again.
"""

from __future__ import annotations

import logging
from typing import Any

import fake_pynvml as fp
import pytest
from daemon_support import MetricsServer, run_ticks
from fake_pynvml import FakeGpu, FakeNvml
from synthetic import make_plant, make_profile

from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_config import FixedControllerConfig
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.readback import DRIVER_OFFSET_STEPS
from gpugov.daemon.service import domains_from_config, simulated_run
from gpugov.daemon.simulated import SimulatedBackend
from gpugov.plant.workload import load_trace

LOCK = "nvmlDeviceSetGpuLockedClocks"
STEP_MHZ = 15  # the fake GPU's supported clocks: 345-1980 MHz in 15 MHz steps
TICKS = 40


class DriverHoldsOff(FakeNvml):
    """A fake NVML whose driver runs a locked GPU ``offset_mhz`` off the lock, showing
    ``reasons`` (besides the ApplicationsClocksSetting a lock below the top shows)."""

    def __init__(self, gpus: int = 1, *, offset_mhz: int, reasons: int = 0) -> None:
        super().__init__(gpus)
        self.offset_mhz = offset_mhz
        self.reasons = reasons

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: FakeGpu, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        super().nvmlDeviceSetGpuLockedClocks(handle, minGpuClockMHz, maxGpuClockMHz)
        handle.sm_clock_mhz = maxGpuClockMHz + self.offset_mhz
        handle.event_reasons |= self.reasons


def _config(url: str, clock_mhz: int = 1410, **domain: Any) -> Any:
    section = {
        "name": "llm",
        "gpus": [0],
        "engine": {"kind": "vllm", "url": url, "timeout_s": 0.9},
        "controller": {"kind": "fixed", "clock_mhz": clock_mhz},
        **domain,
    }
    return parse_config({"daemon": {"period_s": 1.0}, "domains": [section]})


def _locks(fake: FakeNvml) -> list[tuple[Any, ...]]:
    return [w for w in fake.writes if w[0] == LOCK]


def _no_lock_shown(gpu: FakeGpu) -> None:
    """What a reading shows with no lock in force."""
    gpu.event_reasons &= ~fp.nvmlClocksEventReasonApplicationsClocksSetting


@pytest.mark.parametrize(
    ("offset_mhz", "reasons"),
    [
        (-60, 0),  # rounded four steps down (the lock's ApplicationsClocksSetting shown)
        (45, 0),  # rounded three steps up
        (-120, 0),  # bins lower, at the edge: DRIVER_OFFSET_STEPS steps
        (-300, fp.nvmlClocksEventReasonSwPowerCap),
        (-300, fp.nvmlClocksEventReasonSwThermalSlowdown),
        (-300, 0x8),  # nvmlClocksEventReasonHwSlowdown
        (-300, 0x200),  # nvmlClocksThrottleReasonBoardLimit
        (-300, 0x400),  # nvmlClocksThrottleReasonReliability
        (-300, 0x1000),  # a reason a newer driver names and gpugov does not know
    ],
    ids=[
        "rounded-down",
        "rounded-up",
        "bins-lower",
        "power-cap",
        "thermal",
        "hw-slowdown",
        "board-limit",
        "reliability",
        "unknown-reason",
    ],
)
def test_a_steady_request_the_driver_holds_off_its_lock_is_written_once(
    vllm_server: MetricsServer, offset_mhz: int, reasons: int
) -> None:
    """The daemon's loop at a constant request on a GPU the driver holds off the lock."""
    fake = DriverHoldsOff(offset_mhz=offset_mhz, reasons=reasons)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    actuator = assembled.domains[0].actuator
    try:
        records, stats = run_ticks(assembled.domains, TICKS)
        assert stats.ticks == TICKS
        assert _locks(fake) == [(LOCK, 0, 1410, 1410)]
        assert actuator.external_changes == {"0": 0}
        assert {r.applied_mhz for r in records} == {1410}
    finally:
        assembled.close()


@pytest.mark.parametrize(("offset_mhz", "side"), [(-60, "lower"), (45, "higher")])
def test_a_gpu_the_driver_holds_off_its_lock_is_logged_once(
    vllm_server: MetricsServer, caplog: pytest.LogCaptureFixture, offset_mhz: int, side: str
) -> None:
    fake = DriverHoldsOff(offset_mhz=offset_mhz)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    try:
        with caplog.at_level(logging.INFO, logger="gpugov.daemon.actuator"):
            run_ticks(assembled.domains, 10)
    finally:
        assembled.close()
    lines = [r.getMessage() for r in caplog.records if "while locked at" in r.getMessage()]
    assert lines == [
        f"domain llm: GPU 0 runs at {1410 + offset_mhz} MHz while locked at 1410 MHz, with "
        "no clock event reason that explains it: taken as the driver's own clock for that "
        f"lock (its clock steps, a bin {side}), not written again (logged once per GPU)"
    ]
    assert "changed by someone else" not in caplog.text


def test_a_lock_lost_on_a_gpu_the_driver_holds_lower_is_written_again(
    vllm_server: MetricsServer,
) -> None:
    """Another process resets the clocks (``nvidia-smi -rgc``, ``gpugov reset-clocks``):
    the GPU runs at its top clock with no lock in force; the lock is written again, once,
    and the driver's clock under it is then left alone again."""
    fake = DriverHoldsOff(offset_mhz=-60)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    actuator = assembled.domains[0].actuator

    def on_step(step: int, records: list[TickRecord]) -> None:
        if step == 15:
            fake.nvmlDeviceResetGpuLockedClocks(fake.gpus[0])

    try:
        records, _ = run_ticks(assembled.domains, TICKS, on_step=on_step)
        locks = _locks(fake)
        assert locks == [(LOCK, 0, 1410, 1410)] * 2
        assert actuator.external_changes == {"0": 1}
        # Two reads confirm the change (steps 16 and 17), the lock is written at once.
        assert [r.step for r in records if r.writes] == [0, 17]
        assert records[-1].observation.realized_clock_mhz == 1350.0
    finally:
        assembled.close()
    assert fake.locked(0) is None  # reset at the end as ever


@pytest.mark.parametrize("policy", ["reassert", "yield"])
def test_a_reset_of_a_lock_near_the_top_clock_is_still_seen(policy: str) -> None:
    """A lock within the driver's offset of the top clock, reset by someone else: the GPU
    runs above it with no lock in force, which no driver's rounding of a lock shows."""
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    actuator = ClockActuator([backend], external_policy=policy)  # type: ignore[arg-type]
    actuator.apply(1935)
    for _ in range(3):
        assert actuator.check_readback([backend.sample()]) == []
    fake.nvmlDeviceResetGpuLockedClocks(fake.gpus[0])  # 1980 MHz, no lock shown
    assert actuator.check_readback([backend.sample()]) == []
    assert actuator.check_readback([backend.sample()]) == ["0"]
    assert actuator.apply(1935) == (1 if policy == "reassert" else 0)


@pytest.mark.parametrize(
    ("other_mhz", "outside"),
    [
        (1200, True),  # 14 steps below: another lock
        (1410 - STEP_MHZ * (DRIVER_OFFSET_STEPS + 1), True),  # one step beyond the offset
        (1410 - STEP_MHZ * DRIVER_OFFSET_STEPS, False),  # at the offset
        (1650, True),  # 16 steps above, held by a lock: another lock
        (1320, False),  # 6 steps below: within what a driver does to a lock
        (1500, False),  # 6 steps above, held by a lock
    ],
)
def test_another_lock_is_an_outside_change_beyond_the_drivers_offset(
    other_mhz: int, outside: bool
) -> None:
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    actuator = ClockActuator([backend])
    actuator.apply(1410)
    fake.nvmlDeviceSetGpuLockedClocks(fake.gpus[0], other_mhz, other_mhz)  # nvidia-smi -lgc
    actuator.check_readback([backend.sample()])
    assert actuator.check_readback([backend.sample()]) == (["0"] if outside else [])
    assert actuator.apply(1410) == int(outside)


def test_an_unlocked_gpu_above_the_lock_is_seen_whatever_the_offset() -> None:
    """Above the lock by less than the driver's offset but with no lock in force (a
    driver reset dropped it, the GPU boosts): the lock is lost, not rounded."""
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    actuator = ClockActuator([backend])
    actuator.apply(1410)
    gpu = fake.gpus[0]
    gpu.locked, gpu.sm_clock_mhz = None, 1470
    _no_lock_shown(gpu)
    actuator.check_readback([backend.sample()])
    assert actuator.check_readback([backend.sample()]) == ["0"]
    assert actuator.apply(1410) == 1


def test_a_capped_gpu_rounded_above_its_cap_is_written_once() -> None:
    """``lock_mode = "cap"`` (``[lowest, f]``): a GPU the driver runs a few steps above
    the cap, the cap's lock in force, is left alone; below the cap is never checked."""
    fake = DriverHoldsOff(offset_mhz=45)
    backend = NvmlBackend(0, nvml=fake)
    actuator = ClockActuator([backend], lock_mode="cap")
    for _ in range(TICKS):
        assert actuator.check_readback([backend.sample()]) == []
        actuator.apply(1410)
    assert _locks(fake) == [(LOCK, 0, 345, 1410)]


def test_a_simulated_gpu_realising_a_lock_lower_is_written_once() -> None:
    """The simulated node on a measured profile whose GPU ran a 1,410 MHz lock at
    1,350 MHz (``realized_clock_median_mhz_by_requested``): one lock for the whole run."""
    profile = make_profile(
        clock_profile_selection={"realized_clock_median_mhz_by_requested": {"1410": 1350.0}}
    )
    workload, _ = load_trace("azure-conv-10min", duration_s=60)
    clock = VirtualClock()
    sim = simulated_run(
        workload,
        make_plant(profile),
        FixedControllerConfig(kind="fixed", clock_mhz=1410),
        clock,
    )
    records: list[TickRecord] = []
    stats = run(
        [sim.domain],
        TimedLoop(1.0, clock=clock, sleep=clock.sleep),
        on_tick=records.extend,
        before_tick=sim.before_tick,
    )
    (backend,) = sim.domain.observer.gpus.backends
    assert isinstance(backend, SimulatedBackend)
    assert stats.ticks >= TICKS
    assert list(backend.locks) == [(1410, 1410)]
    assert sim.domain.actuator.external_changes == {"0": 0}
    assert {r.observation.realized_clock_mhz for r in records[5:]} >= {1350.0}
