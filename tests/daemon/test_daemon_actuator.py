"""ClockActuator: write on change only, reset on every way out."""

from __future__ import annotations

import fake_pynvml as fp
import pytest
from fake_pynvml import FakeNvml

from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.errors import GpuLost, PermissionDenied
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
    assert fake_nvml.writes[-2:] == [
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
        assert actuator.apply(1000) == 1
        assert actuator.write_errors == 1
        assert actuator.applied_mhz is None
        assert actuator.apply(1000) == 1
        assert actuator.applied_mhz == 1000


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
