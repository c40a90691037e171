"""ClockActuator: write on change only, reset on every way out."""

from __future__ import annotations

import logging

import fake_pynvml as fp
import pytest
from fake_pynvml import FakeNvml

from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.errors import GpuLost, NotSupported, PermissionDenied
from gpugov.daemon.exit_restore import Outcome, retry_each
from gpugov.daemon.nvml import NvmlBackend


def _backends(fake: FakeNvml) -> list[NvmlBackend]:
    return [NvmlBackend(i, nvml=fake) for i in range(len(fake.gpus))]


def test_writes_only_when_the_decision_changes(fake_nvml: FakeNvml) -> None:
    with ClockActuator(_backends(fake_nvml), domain="d") as actuator:
        assert actuator.apply(1410) == 2
        assert actuator.apply(1410) == 0
        assert actuator.applied_mhz == 1410
        assert actuator.apply(1200) == 2
        assert fake_nvml.locked(0) == (1200, 1200) and fake_nvml.locked(1) == (1200, 1200)
        assert actuator.writes == 4
    assert fake_nvml.locked(0) is None and fake_nvml.locked(1) is None
    assert sorted(fake_nvml.writes[-2:]) == [  # the exit's resets may start together
        ("nvmlDeviceResetGpuLockedClocks", 0),
        ("nvmlDeviceResetGpuLockedClocks", 1),
    ]


def test_cap_mode_leaves_the_floor_free(fake_nvml: FakeNvml) -> None:
    with ClockActuator(_backends(fake_nvml), lock_mode="cap") as actuator:
        actuator.apply(1410)
        assert fake_nvml.locked(0) == (345, 1410)


def test_untouched_gpus_are_not_reset(fake_nvml: FakeNvml) -> None:
    with ClockActuator(_backends(fake_nvml)):
        pass
    assert fake_nvml.writes == []


def test_exception_in_block_resets_and_propagates(fake_nvml: FakeNvml) -> None:
    with pytest.raises(RuntimeError), ClockActuator(_backends(fake_nvml)) as actuator:
        actuator.apply(1000)
        raise RuntimeError("controller bug")
    assert fake_nvml.locked(0) is None and fake_nvml.locked(1) is None


def test_unlock_resets_and_forgets(fake_nvml: FakeNvml) -> None:
    with ClockActuator(_backends(fake_nvml)) as actuator:
        actuator.apply(1000)
        assert actuator.unlock() == 2
        assert actuator.applied_mhz is None
        assert actuator.unlock() == 0
        assert actuator.apply(1000) == 2


def test_transient_write_error_retried_next_tick(fake_nvml: FakeNvml) -> None:
    with ClockActuator(_backends(fake_nvml)) as actuator:
        fake_nvml.fail("nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_TIMEOUT, times=1)
        assert actuator.apply(1000) == 2  # GPU 1's lock, then its reset: not split
        assert actuator.write_errors == 1
        assert actuator.applied_mhz is None
        assert fake_nvml.locked(0) is None and fake_nvml.locked(1) is None
        assert actuator.apply(1000) == 2
        assert actuator.applied_mhz == 1000


def test_a_write_failing_every_tick_is_counted_each_time_and_logged_once_a_minute(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    with ClockActuator(_backends(fake_nvml), domain="d", clock=lambda: now[0]) as actuator:
        fake_nvml.fail("nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_TIMEOUT, times=None)
        with caplog.at_level(logging.DEBUG, logger="gpugov.daemon.actuator"):
            for tick in range(150):  # 150 s at one tick a second, every write failing
                now[0] = float(tick)
                assert actuator.apply(1000) == 0
            assert actuator.write_failures == {"0": 150, "1": 150}
            fake_nvml.clear_failures()
            now[0] = 150.0
            assert actuator.apply(1000) == 2
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        gpu1 = [line for line in warnings if "GPU 1" in line]
        assert len(warnings) == 8 and len(gpu1) == 4  # per GPU: first, 2 reminders, back
        assert "lock clocks to 1000,1000 MHz failed" in gpu1[0] and "one line a minute" in gpu1[0]
        assert "61 failures in a row over 60 s (59 not logged)" in gpu1[1]
        assert "121 failures in a row over 120 s (59 not logged)" in gpu1[2]
        assert gpu1[3] == "domain d: GPU 1: clock writes succeed again after 150 failure(s) (150 s)"
        assert actuator.failure_log.failing("1") == 0
        debug = [
            r for r in caplog.records if r.levelno == logging.DEBUG and "GPU 1" in r.getMessage()
        ]
        assert len(debug) == 150 - 3


@pytest.mark.parametrize(
    "code",
    [fp.NVML_ERROR_TIMEOUT, fp.NVML_ERROR_UNKNOWN, fp.NVML_ERROR_INSUFFICIENT_POWER],
)
def test_a_raise_that_fails_resets_the_lock_rather_than_hold_it_low(
    fake_nvml: FakeNvml, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    with ClockActuator(_backends(fake_nvml), domain="d") as actuator:
        actuator.apply(800)
        fake_nvml.fail("nvmlDeviceSetGpuLockedClocks", code, times=None)
        with caplog.at_level(logging.WARNING, logger="gpugov.daemon.actuator"):
            # The load came back; every lock write fails: each GPU reset once, not every
            # tick, and those resets are counted as the writes they are.
            assert [actuator.apply(1980) for _ in range(5)] == [2, 0, 0, 0, 0]
        assert fake_nvml.locked(0) is None and fake_nvml.locked(1) is None  # not held at 800
        resets = [w for w in fake_nvml.writes if w[0] == "nvmlDeviceResetGpuLockedClocks"]
        assert len(resets) == 2 and actuator.writes == len(fake_nvml.writes) == 4
        assert actuator.write_failures == {"0": 5, "1": 5}
        reset_lines = [
            r.getMessage() for r in caplog.records if "was reset instead" in r.getMessage()
        ]
        assert len(reset_lines) == 2 and "from 800 MHz to 1980 MHz" in reset_lines[0]
        fake_nvml.clear_failures()
        assert actuator.apply(1980) == 2 and actuator.applied_mhz == 1980
    assert fake_nvml.locked(0) is None


def test_a_lowering_that_fails_keeps_the_higher_lock(fake_nvml: FakeNvml) -> None:
    with ClockActuator(_backends(fake_nvml)) as actuator:
        actuator.apply(1800)
        fake_nvml.fail("nvmlDeviceSetGpuLockedClocks", fp.NVML_ERROR_TIMEOUT, times=None)
        actuator.apply(800)
        assert fake_nvml.locked(0) == (1800, 1800)  # higher, never reset for a lowering
        assert not [w for w in fake_nvml.writes if w[0] == "nvmlDeviceResetGpuLockedClocks"]


def test_a_failsafe_unlock_that_fails_locks_the_top_clock(fake_nvml: FakeNvml) -> None:
    with ClockActuator(_backends(fake_nvml), domain="d") as actuator:
        actuator.apply(800)
        fake_nvml.fail("nvmlDeviceResetGpuLockedClocks", fp.NVML_ERROR_TIMEOUT, times=None)
        assert actuator.unlock() == 2  # the top clock's locks, counted as writes
        assert fake_nvml.locked(0) == (1980, 1980) and fake_nvml.locked(1) == (1980, 1980)
        assert actuator.unlock() == 0  # held at the top already: no lock written again
        assert len(fake_nvml.writes) == 4 == actuator.writes
        fake_nvml.clear_failures()
        assert actuator.unlock() == 2
    assert fake_nvml.locked(0) is None


@pytest.mark.parametrize(
    "function", ["nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"]
)
def test_writes_failing_every_other_call_never_leave_a_gpu_low(
    fake_nvml: FakeNvml, function: str
) -> None:
    fake_nvml.flaky(function, fp.NVML_ERROR_UNKNOWN)
    plan = [800, 1980, 800, 1980, 1410, 1980, 1980, 800, 1980]
    with ClockActuator(_backends(fake_nvml)) as actuator:
        for clock in plan:
            actuator.apply(clock)
            if clock == 1980:  # asked for the top: at the top or unlocked, never lower
                for index in (0, 1):
                    assert fake_nvml.locked(index) in (None, (1980, 1980))
            actuator.unlock()
            for index in (0, 1):
                assert fake_nvml.locked(index) in (None, (1980, 1980))
    fake_nvml.clear_failures()
    assert fake_nvml.locked(0) is None and fake_nvml.locked(1) is None


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (fp.NVML_ERROR_NO_PERMISSION, PermissionDenied),
        (fp.NVML_ERROR_NOT_SUPPORTED, NotSupported),
        (fp.NVML_ERROR_GPU_IS_LOST, GpuLost),
    ],
)
def test_a_lock_refused_for_good_mid_run_resets_every_gpu(
    fake_nvml: FakeNvml, code: int, error: type[Exception]
) -> None:
    with pytest.raises(error), ClockActuator(_backends(fake_nvml)) as actuator:
        actuator.apply(800)
        fake_nvml.fail("nvmlDeviceSetGpuLockedClocks", code, times=None)
        actuator.apply(1980)
    if code == fp.NVML_ERROR_GPU_IS_LOST:
        return  # the fake's injected code hits every call; lost GPUs are tested above
    assert fake_nvml.locked(0) is None and fake_nvml.locked(1) is None


def test_permission_denied_propagates() -> None:
    fake = FakeNvml(1, permission=False)
    with pytest.raises(PermissionDenied), ClockActuator(_backends(fake)) as actuator:
        actuator.apply(1000)


def test_lost_gpu_resets_the_others(fake_nvml: FakeNvml) -> None:
    with pytest.raises(GpuLost), ClockActuator(_backends(fake_nvml)) as actuator:
        actuator.apply(1000)
        fake_nvml.lose(1)
        actuator.apply(1100)
    assert fake_nvml.locked(0) is None  # reset although GPU 1 is gone
    assert fake_nvml.locked(1) == (1000, 1000)


def test_retry_each_retries_only_what_failed_for_now_with_doubling_waits() -> None:
    """The exit writes' loop: an item that fails for good is not tried again, one that
    fails for now is, each round after a wait twice the one before, and what still fails
    after the last round comes back apart from what failed for good."""
    outcomes: dict[str, list[Outcome]] = {
        "ok": ["done"],
        "gone": ["failed"],
        "slow": ["retry", "retry", "done"],
        "stuck": ["retry", "retry", "retry"],
    }
    tried: list[tuple[str, int]] = []
    waits: list[float] = []

    def attempt_one(item: str, attempt: int) -> Outcome:
        tried.append((item, attempt))
        return outcomes[item][attempt]

    failed, pending = retry_each(
        list(outcomes), attempt_one, attempts=3, backoff_s=0.2, sleep=waits.append
    )
    assert failed == ["gone"] and pending == ["stuck"]
    assert [item for item, attempt in tried if attempt > 0] == ["slow", "stuck", "slow", "stuck"]
    assert waits == [0.2, 0.4]  # no wait after the last round
    assert retry_each([], attempt_one, attempts=3, backoff_s=0.2, sleep=waits.append) == ([], [])
    assert waits == [0.2, 0.4]


def _locks(fake: FakeNvml) -> list[tuple[int, int] | None]:
    return [fake.locked(i) for i in range(len(fake.gpus))]


@pytest.mark.parametrize("deadline_s", [None, 2.0])  # a simulated run's writes, a node's
def test_a_lowering_failing_on_one_gpu_of_a_group_never_leaves_it_split(
    caplog: pytest.LogCaptureFixture, deadline_s: float | None
) -> None:
    fake = FakeNvml(4)
    fake.nvmlInit()
    backends = _backends(fake)
    with ClockActuator(backends, domain="tp4", write_deadline_s=deadline_s) as actuator:
        assert actuator.apply(1800) == 4
        fake.gpus[2].lock_error = fp.NVML_ERROR_TIMEOUT
        with caplog.at_level(logging.WARNING, logger="gpugov.daemon.actuator"):
            for _ in range(5):  # GPU 2 fails every lowering; the others follow it
                actuator.apply(900)
                assert _locks(fake) == [(1800, 1800)] * 4
        rollback = [r.getMessage() for r in caplog.records if "not split" in r.getMessage()]
        assert rollback == [
            "domain tp4: the lock at 900 MHz failed on GPU(s) 2; GPU(s) 0, 1, 3 back at 1800 "
            "MHz so the group is not split, and the lowering is written to the failing GPU(s) "
            "first until it goes through (logged once)"
        ]
        lowered = [w for w in fake.writes if w[0] == "nvmlDeviceSetGpuLockedClocks" and w[2] == 900]
        assert len(lowered) == 3  # once; then GPU 2 is tried alone, the others left at 1800
        assert actuator.writes == len(fake.writes) == 4 + 3 + 3  # the rollback counted
        fake.gpus[2].lock_error = None  # GPU 2 goes through first, then GPU 3 fails
        fake.gpus[3].lock_error = fp.NVML_ERROR_TIMEOUT
        actuator.apply(900)
        assert _locks(fake) == [(1800, 1800)] * 4  # GPU 2 locked back with 0 and 1
        fake.gpus[3].lock_error = None
        actuator.apply(900)
        assert _locks(fake) == [(900, 900)] * 4 and actuator.applied_mhz == 900
        fake.gpus[2].lock_error = fp.NVML_ERROR_TIMEOUT
        assert actuator.apply(1410) == 4  # a raise is never held back by a failing GPU
        assert _locks(fake)[:2] == [(1410, 1410)] * 2 and fake.locked(2) is None
        # Two failing GPUs, one of which goes through: it is locked back with the other.
        fake.gpus[2].lock_error = None
        actuator.apply(1410)
        fake.gpus[1].lock_error = fake.gpus[2].lock_error = fp.NVML_ERROR_TIMEOUT
        actuator.apply(900)
        assert _locks(fake) == [(1410, 1410)] * 4
        fake.gpus[1].lock_error = None  # GPU 1 recovers, GPU 2 still fails
        actuator.apply(900)
        assert _locks(fake) == [(1410, 1410)] * 4
        fake.gpus[2].lock_error = None
        actuator.apply(900)
        assert _locks(fake) == [(900, 900)] * 4
        fake.gpus[2].lock_error = fp.NVML_ERROR_TIMEOUT
        assert actuator.apply(1410) == 4
        # From the top clock the others are reset, run up to it as GPU 2 is held there:
        # a reset, which no actuator's rate limit holds back as it would a lock.
        fake.gpus[2].lock_error = None
        actuator.apply(1980)
        fake.gpus[2].lock_error = fp.NVML_ERROR_TIMEOUT
        actuator.apply(900)
        assert _locks(fake) == [None, None, (1980, 1980), None]


def test_a_reset_lost_for_good_counts_the_resets_made_before_it_and_its_own_failure() -> None:
    """``unlock`` off a node (its resets one after another): GPU 0's reset went through
    before GPU 1's was refused for good; both are counted (it lost the first and the
    failure was no write failure)."""
    fake = FakeNvml(2)
    fake.nvmlInit()
    with ClockActuator(_backends(fake)) as actuator:
        assert actuator.apply(900) == 2
        fake.lose(1)
        with pytest.raises(GpuLost):
            actuator.unlock()
        assert fake.locked(0) is None
        assert actuator.writes == 3
        assert actuator.write_failures == {"0": 0, "1": 1}


def test_a_rollback_refused_for_good_on_one_gpu_takes_every_other_outcome_first() -> None:
    """A node's rollback after a lowering failed for now on GPU 0: GPU 1's write back is
    refused for good, GPU 2's goes through; that is counted before the error is raised
    (it was raised at once, and no write of the round counted)."""
    fake = FakeNvml(3)
    fake.nvmlInit()
    real_lock = fake.nvmlDeviceSetGpuLockedClocks
    calls: dict[int, int] = {}

    def lock(handle: fp.FakeGpu, low: int, high: int) -> None:
        calls[handle.index] = calls.get(handle.index, 0) + 1
        if handle.index == 1 and calls[1] == 3:  # its lock, its lowering, then its rollback
            raise fp.NVMLError(fp.NVML_ERROR_GPU_IS_LOST)
        real_lock(handle, low, high)

    fake.nvmlDeviceSetGpuLockedClocks = lock  # type: ignore[method-assign]
    with ClockActuator(_backends(fake), domain="tp3", write_deadline_s=2.0) as actuator:
        assert actuator.apply(1800) == 3
        fake.gpus[0].lock_error = fp.NVML_ERROR_TIMEOUT
        with pytest.raises(GpuLost):
            actuator.apply(900)
        assert fake.locked(2) == (1800, 1800)  # back with GPU 0, the group not split
        assert actuator.writes == 3 + 2 + 1
        assert actuator.write_failures == {"0": 1, "1": 1, "2": 0}


def test_a_gpu_lost_in_a_failed_locks_fallback_is_fatal_after_every_other_outcome() -> None:
    """A node's raise fails for now on GPU 0, whose fallback reset then finds it lost: a
    fatal error, raised once GPUs 1 and 2's raises are taken and counted (it escaped the
    round at once, their outcomes untaken and nothing counted)."""
    fake = FakeNvml(3)
    fake.nvmlInit()
    real_reset = fake.nvmlDeviceResetGpuLockedClocks

    def reset(handle: fp.FakeGpu) -> None:
        if handle.index == 0:
            raise fp.NVMLError(fp.NVML_ERROR_GPU_IS_LOST)
        real_reset(handle)

    with ClockActuator(_backends(fake), domain="tp3", write_deadline_s=2.0) as actuator:
        assert actuator.apply(900) == 3
        fake.gpus[0].lock_error = fp.NVML_ERROR_TIMEOUT
        fake.nvmlDeviceResetGpuLockedClocks = reset  # type: ignore[method-assign]
        with pytest.raises(GpuLost):
            actuator.apply(1800)
        assert fake.locked(1) == fake.locked(2) == (1800, 1800)
        assert actuator.writes == 3 + 2
        assert actuator.write_failures == {"0": 2, "1": 0, "2": 0}
        fake.nvmlDeviceResetGpuLockedClocks = real_reset  # type: ignore[method-assign]
