"""PowerLimitActuator: a controller's power cap set on a node, on change only, and the
limits found before gpugov restored on every way out (and after a crash, at the next
start); the budget's NVML source never reads gpugov's own cap."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import fake_pynvml as fp
import pytest
from daemon_support import MetricsServer, run_ticks
from fake_pynvml import FakeNvml

from gpugov.daemon.backend import DryRunBackend, GpuSample, power_limit_backend
from gpugov.daemon.config import parse_config
from gpugov.daemon.errors import (
    ClocksNotReset,
    ConfigError,
    DriverGone,
    GpuLost,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.power_budget import PowerBudget
from gpugov.daemon.power_limit import PowerLimitActuator
from gpugov.daemon.record import record_to_dict
from gpugov.daemon.service import domains_from_config

SET = "nvmlDeviceSetPowerManagementLimit"
LOCK = "nvmlDeviceSetGpuLockedClocks"


PATIENT_S = 60.0
"""The lock record's write deadline here: the tests read the file right after a write, and
on a loaded machine a write past the default 0.5 s is left running (the file not there
yet)."""


def _state(directory: Path, **options: Any) -> LockState:
    """The lock record in ``directory``, each write waited for up to :data:`PATIENT_S`."""
    return LockState(directory, write_deadline_s=PATIENT_S, **options)


def _backends(fake: FakeNvml) -> list[NvmlBackend]:
    return [NvmlBackend(i, nvml=fake) for i in range(len(fake.gpus))]


def _cap_writes(fake: FakeNvml) -> list[tuple[Any, ...]]:
    return [w for w in fake.writes if w[0] == SET]


def _limits_mw(fake: FakeNvml) -> list[int]:
    return [gpu.power_limit_mw for gpu in fake.gpus]


# ------------------------------------------------------------------------ backends
def test_nvml_reads_and_sets_the_power_limit_in_watts(fake_nvml: FakeNvml) -> None:
    backend = NvmlBackend(0, nvml=fake_nvml)
    assert isinstance(backend, NvmlBackend) and power_limit_backend(backend) is backend
    assert backend.power_limit_w() == 700.0
    assert backend.power_limit_constraints_w() == (200.0, 700.0)
    backend.set_power_limit(350.25)
    assert fake_nvml.writes == [(SET, 0, 350_250)]  # whole milliwatts
    assert backend.power_limit_w() == pytest.approx(350.25)


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (fp.NVML_ERROR_NO_PERMISSION, PermissionDenied),
        (fp.NVML_ERROR_NOT_SUPPORTED, NotSupported),
        (fp.NVML_ERROR_GPU_IS_LOST, GpuLost),
        (fp.NVML_ERROR_TIMEOUT, TransientGpuError),
    ],
)
def test_nvml_power_limit_errors_map_to_the_daemons_tree(
    fake_nvml: FakeNvml, code: int, error: type[Exception]
) -> None:
    backend = NvmlBackend(0, nvml=fake_nvml)
    fake_nvml.fail(SET, code)
    with pytest.raises(error):
        backend.set_power_limit(300.0)
    fake_nvml.fail("nvmlDeviceGetPowerManagementLimit", code)
    with pytest.raises(error):
        backend.power_limit_w()


def test_dry_run_reads_the_limit_and_only_logs_the_write(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    backend = DryRunBackend(NvmlBackend(0, nvml=fake_nvml))
    assert power_limit_backend(backend) is backend
    assert backend.power_limit_w() == 700.0
    with caplog.at_level(logging.INFO):
        backend.set_power_limit(300.0)
    assert fake_nvml.writes == []
    assert backend.writes[-1] == ("power_limit", 300.0)
    assert "would set the power limit to 300.0 W" in caplog.text


# ------------------------------------------------------------------------ actuator
def test_the_cap_is_split_over_the_gpus_written_on_change_and_restored(
    fake_nvml: FakeNvml,
) -> None:
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    assert actuator.apply(800.0) == 2
    assert _limits_mw(fake_nvml) == [400_000, 400_000]
    assert actuator.apply(800.0) == 0  # unchanged: no write
    assert actuator.applied_w == 800.0
    assert actuator.apply(600.0) == 2  # the next period's new cap
    assert _limits_mw(fake_nvml) == [300_000, 300_000]
    assert actuator.writes == 4
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [700_000, 700_000]
    assert actuator.applied_w is None


def test_a_cap_over_gpus_with_unequal_limits_sums_to_the_cap(fake_nvml: FakeNvml) -> None:
    """GPUs of one domain with unequal limits: a GPU whose bounds clamp its equal share
    leaves the difference to the others, so the domain's limits add up to the cap (an
    even split left 100 W of a 1,000 W cap unused, and put a 500 W cap 75 W over)."""
    fake_nvml.gpus[1].power_limit_mw = 400_000  # an operator's own, lower limit
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(1_000.0)
    assert _limits_mw(fake_nvml) == [600_000, 400_000]
    assert actuator.applied_w == pytest.approx(1_000.0)
    actuator.apply(1_200.0)  # more than the GPUs hold together: each at its own limit
    assert _limits_mw(fake_nvml) == [700_000, 400_000]
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [700_000, 400_000]
    fake_nvml.gpus[1].power_limit_min_mw = 300_000  # a GPU that accepts no lower
    fake_nvml.gpus[0].power_limit_min_mw = 100_000
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(500.0)
    assert _limits_mw(fake_nvml) == [200_000, 300_000]
    actuator.apply(300.0)  # below what they accept together: each at its lowest
    assert _limits_mw(fake_nvml) == [100_000, 300_000]


def test_a_share_within_half_a_watt_of_a_gpus_own_limit_leaves_it_alone(
    fake_nvml: FakeNvml,
) -> None:
    """A share less than half a watt under a GPU's own limit is that limit: written, the
    exit took it for the original already back (the same limit, read back) and left the
    GPU capped a fraction of a watt under it."""
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(1_399.6)  # 699.8 W a GPU
    assert _cap_writes(fake_nvml) == []
    actuator.apply(1_000.0)
    actuator.apply(1_399.6)  # back to (about) their own: restored
    assert _limits_mw(fake_nvml) == [700_000, 700_000]
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [700_000, 700_000]


def test_a_huge_cap_with_a_gpu_not_read_yet_is_split_without_a_stall(
    fake_nvml: FakeNvml,
) -> None:
    """A cap of 1e13 W while one GPU's limits could not be read yet (no ceiling known):
    the split's search ends (it looped for ever where floats that large are further
    apart than its tolerance) and the GPU read sets its own limit."""
    fake_nvml.fail("nvmlDeviceGetPowerManagementLimit", fp.NVML_ERROR_TIMEOUT)  # GPU 0
    fake_nvml.fail("nvmlDeviceGetPowerManagementLimitConstraints", fp.NVML_ERROR_TIMEOUT)
    import threading

    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    written: list[int] = []
    applying = threading.Thread(target=lambda: written.append(actuator.apply(1e13)), daemon=True)
    applying.start()
    applying.join(30)  # a bound to catch the hang
    assert written == [0]  # GPU 1 at its own limit; GPU 0 next tick
    assert _limits_mw(fake_nvml) == [700_000, 700_000]


def test_a_cap_back_to_none_restores_the_original_limit(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[1].power_limit_mw = 650_000  # an operator's own limit, kept as the original
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(500.0)
    assert _limits_mw(fake_nvml) == [250_000, 250_000]
    assert actuator.apply(None) == 2
    assert _limits_mw(fake_nvml) == [700_000, 650_000]
    assert actuator.apply(None) == 0
    assert actuator.restore() == [] and len(_cap_writes(fake_nvml)) == 4


def test_a_limit_an_operator_set_while_gpugov_held_none_is_the_new_original(
    fake_nvml: FakeNvml,
) -> None:
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(800.0)
    actuator.apply(None)  # the fail-safe, say: the GPUs' own limits
    fake_nvml.gpus[0].power_limit_mw = 350_000  # nvidia-smi -pl 350 meanwhile
    actuator.apply(800.0)
    assert _limits_mw(fake_nvml) == [350_000, 450_000]  # never raised above theirs
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [350_000, 700_000]


def test_a_limit_set_while_the_cap_left_the_gpu_alone_is_the_one_restored(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """A cap at or above a GPU's own limit leaves it alone (nothing of gpugov's on it);
    a limit an operator sets on it meanwhile is what a later cap keeps under and what is
    restored, not the limit read before (restored, it undid the operator's change)."""
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d", state=_state(tmp_path))
    actuator.apply(1_400.0)  # each GPU's own 700 W: nothing written
    assert _cap_writes(fake_nvml) == []
    fake_nvml.gpus[0].power_limit_mw = 450_000  # nvidia-smi -pl 450 meanwhile
    fake_nvml.gpus[1].power_limit_mw = 500_000
    actuator.apply(600.0)
    assert _limits_mw(fake_nvml) == [300_000, 300_000]
    record = _state(tmp_path).get_power_limit(fake_nvml.gpus[0].uuid)
    assert record is not None and record["original_mw"] == 450_000  # what a crash restores
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [450_000, 500_000]


def test_a_limit_set_after_gpugovs_first_write_failed_is_the_one_restored(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """gpugov's first write to a GPU fails (a timeout) and an operator sets its limit
    before the retry: the retry keeps under theirs, and theirs is restored, not the limit
    read before the failed write. A GPU still at its own limit after such a failure is
    not taken for someone else's change."""
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    fake_nvml.fail(SET, fp.NVML_ERROR_TIMEOUT)  # GPU 0's write
    actuator.apply(600.0)
    assert _limits_mw(fake_nvml) == [700_000, 300_000]
    fake_nvml.fail(SET, fp.NVML_ERROR_TIMEOUT)  # its retry fails too: no outside change
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.power_limit"):
        actuator.apply(600.0)
    assert "which gpugov did not set" not in caplog.text
    fake_nvml.gpus[0].power_limit_mw = 450_000  # nvidia-smi -pl 450 before the retry
    actuator.apply(600.0)
    assert _limits_mw(fake_nvml) == [300_000, 300_000]
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [450_000, 700_000]


def test_a_limit_someone_else_sets_while_gpugov_holds_one_is_never_raised(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """An outside agent (``nvidia-smi -pl``, Dynamo's node agent) sets a GPU's limit while
    gpugov holds its cap there: the next cap is kept under that limit (it is the new
    ceiling, restored at exit and after a crash), said once; a cap at or above it leaves
    the outside limit alone."""
    state = _state(tmp_path)
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d", state=state)
    actuator.apply(800.0)
    assert _limits_mw(fake_nvml) == [400_000, 400_000]
    fake_nvml.gpus[0].power_limit_mw = 450_000  # above gpugov's 400 W
    fake_nvml.gpus[1].power_limit_mw = 350_000  # below it
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.power_limit"):
        actuator.apply(1_000.0)  # 500 W a GPU asked
        actuator.apply(1_040.0)
    assert _limits_mw(fake_nvml) == [450_000, 350_000]  # neither raised
    assert caplog.text.count("which gpugov did not set") == 2  # once a GPU
    actuator.apply(720.0)  # 370 W for GPU 0: under its outside limit; GPU 1's stands
    assert _limits_mw(fake_nvml) == [370_000, 350_000]
    record = _state(tmp_path).get_power_limit(fake_nvml.gpus[0].uuid)
    assert record is not None and record["original_mw"] == 450_000  # what a crash restores
    assert _state(tmp_path).get_power_limit(fake_nvml.gpus[1].uuid) is None
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [450_000, 350_000]  # the outside limits stand


def test_a_limit_someone_raises_under_an_unchanged_cap_is_capped_again(
    fake_nvml: FakeNvml,
) -> None:
    """A static cap (the same request every tick) and an operator who raises a GPU's
    limit over gpugov's (``nvidia-smi -pl 700``): their limit is the new ceiling, and the
    cap is applied under it again at the next tick. Only a changed request read the GPU
    again, so a static cap was lost for good."""
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(600.0)
    fake_nvml.gpus[0].power_limit_mw = 650_000
    actuator.apply(600.0)
    assert _limits_mw(fake_nvml) == [300_000, 300_000]
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [650_000, 700_000]  # theirs, restored


def test_a_request_outside_the_constraints_is_clamped_and_said_once(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.power_limit"):
        actuator.apply(100.0)  # 50 W a GPU, below the 200 W they accept
        actuator.apply(120.0)
        actuator.apply(100.0)
    assert _limits_mw(fake_nvml) == [200_000, 200_000]
    assert len(_cap_writes(fake_nvml)) == 2  # the clamped value did not change
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # once per GPU
    assert "below the lowest limit it accepts (200 W); 200 W set instead" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.power_limit"):
        actuator.apply(3000.0)  # above the limit each GPU had: gpugov never raises one
    assert _limits_mw(fake_nvml) == [700_000, 700_000]
    assert "which gpugov never raises" in caplog.text


def test_a_constraints_read_that_fails_for_now_is_read_again(fake_nvml: FakeNvml) -> None:
    """The limits a GPU accepts, read when a cap is first applied, failing once (TIMEOUT):
    read again at the next apply, and the share below them clamped into them. Taken as
    unknown for the whole run, a share under the GPU's lowest limit was written every tick
    and refused by NVML every tick (INVALID_ARGUMENT): the cap was never applied."""
    # GPU 0's reads in the first apply (before its original is taken, and before its share).
    fake_nvml.fail("nvmlDeviceGetPowerManagementLimitConstraints", fp.NVML_ERROR_TIMEOUT, 2)
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(100.0)  # 50 W a GPU, below the 200 W they accept
    assert _limits_mw(fake_nvml) == [700_000, 200_000]  # GPU 0 waits for its constraints
    assert actuator.write_failures == {"0": 1, "1": 0} and actuator.refused is None
    for _ in range(2):
        actuator.apply(100.0)
    assert _limits_mw(fake_nvml) == [200_000, 200_000]
    assert actuator.write_failures == {"0": 1, "1": 0} and actuator.refused is None
    assert fake_nvml.calls["nvmlDeviceGetPowerManagementLimitConstraints"] == 4  # read again


def test_permission_denied_is_one_line_and_no_cap(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.fail(SET, fp.NVML_ERROR_NO_PERMISSION, times=None)
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.power_limit"):
        for _ in range(5):
            assert actuator.apply(400.0) == 0
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert "needs root or CAP_SYS_ADMIN" in caplog.text and "clocks are" in caplog.text
    assert actuator.refused is not None and fake_nvml.calls[SET] == 1
    assert actuator.restore() == [] and fake_nvml.calls[SET] == 1  # nothing to restore


def test_a_restore_refused_in_the_loop_is_not_retried_every_tick(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d", sleep=lambda s: None)
    actuator.apply(600.0)
    fake_nvml.fail(SET, fp.NVML_ERROR_NO_PERMISSION, times=None)
    with caplog.at_level(logging.ERROR, logger="gpugov.daemon.power_limit"):
        for _ in range(10):  # a fail-safe that lasts: the GPUs' own limits, every tick
            actuator.apply(None)
    assert len(caplog.records) == 2 and actuator.refused is not None  # one line a GPU
    assert "GPU 0: restoring its power limit to 700 W needs root or CAP_SYS_ADMIN" in (caplog.text)
    assert actuator.restore() == ["0", "1"]  # named at exit: they may still be capped


def test_a_transient_failure_is_counted_and_retried_next_tick(fake_nvml: FakeNvml) -> None:
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    fake_nvml.fail(SET, fp.NVML_ERROR_TIMEOUT, times=1)
    assert actuator.apply(600.0) == 1
    assert actuator.write_failures == {"0": 1, "1": 0}
    assert actuator.apply(600.0) == 1  # GPU 0 written again
    assert _limits_mw(fake_nvml) == [300_000, 300_000]


def test_a_power_limit_read_as_no_limit_is_never_taken_as_the_original(
    fake_nvml: FakeNvml,
) -> None:
    """NVML reads 0xFFFFFFFF mW where a value is unknown: taken as the original, the exit
    restore asked the GPU for 4.3 MW, was refused, and the run ended in exit 6. Such a
    reading (or one outside the limits the GPU accepts) is a failed read: no cap is written
    on that GPU until it reads a limit it could have."""
    fake_nvml.gpus[0].power_limit_mw = 0xFFFFFFFF
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    assert actuator.apply(600.0) == 1  # GPU 1 only
    assert actuator.write_failures == {"0": 1, "1": 0}
    assert fake_nvml.gpus[0].power_limit_mw == 0xFFFFFFFF
    fake_nvml.gpus[0].power_limit_mw = 700_000  # it reads again
    assert actuator.apply(600.0) == 1
    assert _limits_mw(fake_nvml) == [300_000, 300_000]
    assert actuator.restore() == []  # each back to a limit it accepts
    assert _limits_mw(fake_nvml) == [700_000, 700_000]


def test_a_limit_read_as_no_limit_at_restore_is_unknown_not_someone_elses(
    fake_nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read before a restore (at exit, or a start's reconcile after a crash) that
    gives no limit a GPU could have (0xFFFFFFFF mW) is an unknown limit: the original is
    written back. It was taken for a limit someone else set: the GPU was left capped (and
    the lock record's entry dropped) with exit 0."""
    read = fake_nvml.nvmlDeviceGetPowerManagementLimit
    garbled = False

    def garbled_read(handle: Any) -> int:
        return 0xFFFFFFFF if garbled and handle.index == 0 else read(handle)

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetPowerManagementLimit", garbled_read)
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(600.0)
    garbled = True
    assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [700_000, 700_000]
    garbled = False
    crashed = PowerLimitActuator(_backends(fake_nvml), domain="d", state=_state(tmp_path))
    crashed.apply(600.0)  # then killed: its record stays
    garbled = True
    started = PowerLimitActuator(_backends(fake_nvml), domain="d", state=_state(tmp_path, pid=4242))
    lines = started.reconcile()
    assert _limits_mw(fake_nvml) == [700_000, 700_000]
    assert "restored" in lines[0] and "now unknown" in lines[0], lines


def test_the_exit_restore_retries_with_backoff_and_names_what_stays_capped(
    fake_nvml: FakeNvml,
) -> None:
    sleeps: list[float] = []
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d", sleep=sleeps.append)
    actuator.apply(600.0)
    fake_nvml.fail(SET, fp.NVML_ERROR_TIMEOUT, times=3)  # GPU 0, GPU 1, GPU 0 again
    assert actuator.restore() == []
    assert sleeps == [0.2, 0.4]
    assert _limits_mw(fake_nvml) == [700_000, 700_000]
    actuator.apply(600.0)
    fake_nvml.fail(SET, fp.NVML_ERROR_TIMEOUT, times=None)
    assert actuator.restore() == ["0", "1"]


def test_a_limit_someone_else_set_since_is_left_at_exit(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    actuator.apply(600.0)
    fake_nvml.gpus[0].power_limit_mw = 250_000  # nvidia-smi -pl 250, say
    with caplog.at_level(logging.WARNING):
        assert actuator.restore() == []
    assert _limits_mw(fake_nvml) == [250_000, 700_000]
    assert "which gpugov did not set" in caplog.text


def test_dry_run_writes_nothing(fake_nvml: FakeNvml) -> None:
    backends = [DryRunBackend(b) for b in _backends(fake_nvml)]
    actuator = PowerLimitActuator(backends, domain="d")
    actuator.apply(400.0)
    actuator.apply(500.0)
    assert actuator.restore() == []
    assert fake_nvml.writes == []
    assert backends[0].writes[-1] == ("power_limit", 700.0)  # the restore, logged only


# ------------------------------------------------------------- crash and reconcile
def test_the_original_is_recorded_before_the_write_and_restored_after_a_crash(
    fake_nvml: FakeNvml, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed = PowerLimitActuator(
        _backends(fake_nvml), domain="d", state=_state(tmp_path, pid=999_999_999)
    )
    fake_nvml.fail(SET, fp.NVML_ERROR_TIMEOUT, times=1)
    crashed.apply(600.0)  # GPU 0's write failed: recorded all the same
    data = json.loads((tmp_path / "locks.json").read_text())
    assert data["power_limits"]["GPU-fake-0000"]["original_mw"] == 700_000
    assert data["power_limits"]["GPU-fake-0001"]["set_mw"] == 300_000
    # ... and the process dies here: no restore. The next start reconciles.
    state = _state(tmp_path)
    restarted = PowerLimitActuator(_backends(fake_nvml), domain="d", state=state)
    with caplog.at_level(logging.WARNING):
        lines = restarted.reconcile()
    assert _limits_mw(fake_nvml) == [700_000, 700_000]
    assert [line.split(";")[-1].strip() for line in lines] == ["already back", "restored"]
    assert "power_limits" not in json.loads((tmp_path / "locks.json").read_text())
    assert "previous gpugov run (pid 999999999" in caplog.text


@pytest.mark.parametrize("original_mw", [10**30, 1e308, 2**32 + 450_000])
def test_a_recorded_original_over_a_megawatt_is_no_limit_to_restore(
    original_mw: float, fake_nvml: FakeNvml, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged record's original limit past any board's (a megawatt): restored, NVML
    was asked for it (pynvml passes a c_uint, which keeps the low 32 bits of a larger
    one) and reset-clocks advised ``nvidia-smi -pl`` with a 28-digit number."""
    PowerLimitActuator(
        _backends(fake_nvml), domain="d", state=_state(tmp_path, pid=999_999_999)
    ).apply(600.0)
    path = tmp_path / "locks.json"
    data = json.loads(path.read_text())
    data["power_limits"]["GPU-fake-0000"]["original_mw"] = original_mw
    path.write_text(json.dumps(data))
    before = list(fake_nvml.writes)
    with caplog.at_level(logging.WARNING):
        lines = PowerLimitActuator(
            _backends(fake_nvml), domain="d", state=_state(tmp_path)
        ).reconcile()
    assert len(lines) == 1 and "GPU 1" in lines[0]  # GPU 0's entry is dropped
    assert [w for w in fake_nvml.writes[len(before) :] if w[0] == SET and w[1] == 0] == []
    assert "GPU-fake-0000: original_mw is" in caplog.text
    assert "not a power limit in mW" in caplog.text


def test_reconcile_leaves_a_limit_someone_else_set_and_retries_a_failed_restore_at_exit(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    crashed = PowerLimitActuator(
        _backends(fake_nvml), domain="d", state=_state(tmp_path, pid=999_999_999)
    )
    crashed.apply(600.0)
    fake_nvml.gpus[0].power_limit_mw = 450_000  # changed by someone else after the crash
    restarted = PowerLimitActuator(_backends(fake_nvml), domain="d", state=_state(tmp_path))
    fake_nvml.fail(SET, fp.NVML_ERROR_TIMEOUT, times=1)
    lines = restarted.reconcile()
    assert "left as it is" in lines[0] and "restore FAILED" in lines[1]
    assert _limits_mw(fake_nvml) == [450_000, 300_000]
    assert restarted.restore() == []  # the exit tries GPU 1 again, to the recorded original
    assert _limits_mw(fake_nvml) == [450_000, 700_000]


def test_a_dry_run_reconcile_writes_nothing(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    PowerLimitActuator(
        _backends(fake_nvml), domain="d", state=_state(tmp_path, pid=999_999_999)
    ).apply(600.0)
    before = list(fake_nvml.writes)
    lines = PowerLimitActuator(_backends(fake_nvml), domain="d", state=_state(tmp_path)).reconcile(
        dry_run=True
    )
    assert all("dry run: left as it is" in line for line in lines)
    assert fake_nvml.writes == before


# ------------------------------------------------------------------------- budget
def test_the_budget_source_reads_the_limit_before_gpugovs_cap_or_someone_elses(
    fake_nvml: FakeNvml,
) -> None:
    backends = _backends(fake_nvml)
    actuator = PowerLimitActuator(backends, domain="d")

    def samples() -> list[GpuSample]:
        return [backend.sample() for backend in backends]

    assert actuator.outside_limit_w(samples()) == 1400.0  # before any write
    actuator.apply(600.0)
    assert [s.power_limit_w for s in samples()] == [300.0, 300.0]  # gpugov's own cap
    assert actuator.outside_limit_w(samples()) == 1400.0  # not an outside budget
    fake_nvml.gpus[1].power_limit_mw = 250_000  # someone else's limit: a budget
    assert actuator.outside_limit_w(samples()) == 950.0
    budget = PowerBudget("d")
    assert budget.resolve(actuator.outside_limit_w(samples())) == 950.0
    assert budget.source == "nvml"


# ----------------------------------------------------------------------- the node
def _config(url: str, backend: str = "nvml", **domain: Any) -> Any:
    section = {
        "name": "llm",
        "gpus": [0, 1],
        "engine": {"kind": "vllm", "url": url, "timeout_s": 0.9},
        "controller": {"kind": "power-cap", "cap_w": 800.0},
        **domain,
    }
    daemon: dict[str, Any] = {"period_s": 1.0, "backend": backend}
    if backend == "zeusd":
        daemon["zeusd"] = {"socket": "/run/zeusd.sock"}
    return parse_config({"daemon": daemon, "domains": [section]})


def test_a_node_caps_from_the_first_decision_and_restores_on_stop(
    vllm_server: MetricsServer, tmp_path: Path
) -> None:
    fake = FakeNvml(2)
    config = _config(vllm_server.url)
    config = config.model_copy(
        update={"daemon": config.daemon.model_copy(update={"state_dir": tmp_path})}
    )
    assembled = domains_from_config(config, nvml=fake)
    domain = assembled.domains[0]
    seen: list[tuple[list[int], float | None, float | None]] = []

    def on_step(step: int, records: list[Any]) -> None:
        seen.append((_limits_mw(fake), domain.budget.sources_w.get("nvml"), None))

    try:
        records, _ = run_ticks(assembled.domains, 4, on_step=on_step)
    finally:
        assembled.close()
    assert [limits for limits, _, _ in seen] == [[400_000, 400_000]] * 4
    assert _cap_writes(fake)[:2] == [(SET, 0, 400_000), (SET, 1, 400_000)]
    assert len(_cap_writes(fake)) == 4  # two caps, two restores
    assert [nvml for _, nvml, _ in seen] == [1400.0] * 4  # never its own cap
    assert records[-1].observation.power_limit_w == 1400.0
    # Each tick's record (a --record line) carries the limit gpugov held: both GPUs' 400 W.
    assert [record.power_cap_w for record in records] == [800.0] * len(records)
    assert record_to_dict(records[-1])["power_cap_w"] == 800.0
    assert _limits_mw(fake) == [700_000, 700_000]
    assert domain.snapshot().power_cap_applied_w is None  # restored
    assert "power_limits" not in json.loads((tmp_path / "locks.json").read_text())


def test_a_configured_cap_below_the_gpus_lowest_limit_is_refused_naming_the_field(
    vllm_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """NVML refuses a power limit below its constraints' lowest; a configured cap_w under
    it was clamped to that lowest at the first tick, with a line that named no config
    field, and the node held a cap the config does not state."""
    fake = FakeNvml(2)  # each accepts 200-700 W: at least 400 W for the domain
    section = {"controller": {"kind": "power-cap", "cap_w": 10.0}}
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(ConfigError) as refused,
    ):
        domains_from_config(_config(vllm_server.url, **section), nvml=fake)
    assert str(refused.value) == (
        "domain 'llm': controller.cap_w (10 W) is below the lowest power limit its 2 GPU(s) "
        "accept (400 W together; NVML refuses a lower one)"
    )
    assert _cap_writes(fake) == [] and "set instead" not in caplog.text
    # At the lowest limit it is taken, as a budget there is.
    assembled = domains_from_config(
        _config(vllm_server.url, controller={"kind": "power-cap", "cap_w": 400.0}), nvml=fake
    )
    assembled.close()


def test_a_constraints_read_failing_for_now_at_the_start_is_unknown_not_an_error(
    vllm_server: MetricsServer,
) -> None:
    """At the start (the configured cap's check against the lowest limit) a constraints
    read that fails for now leaves them unknown, as before: the start goes on."""
    fake = FakeNvml(2)
    fake.fail("nvmlDeviceGetPowerManagementLimitConstraints", fp.NVML_ERROR_TIMEOUT, None)
    section = {"controller": {"kind": "power-cap", "cap_w": 10.0}}
    assembled = domains_from_config(_config(vllm_server.url, **section), nvml=fake)
    assembled.close()
    assert fake.calls["nvmlDeviceGetPowerManagementLimitConstraints"] >= 1  # it was read


def test_a_node_restores_the_cap_when_the_run_ends_in_an_exception(
    vllm_server: MetricsServer,
) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)

    def on_step(step: int, records: list[Any]) -> None:
        if step == 1:
            raise RuntimeError("boom")

    try:
        with pytest.raises(RuntimeError, match="boom"):
            run_ticks(assembled.domains, 5, on_step=on_step)
    finally:
        assembled.close()
    assert _limits_mw(fake) == [700_000, 700_000]
    assert fake.locked(0) is None


def test_a_cap_not_restored_at_exit_is_named_in_one_line(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    domain = assembled.domains[0]
    assert domain.power_limits is not None
    domain.power_limits.restore_backoff_s = 0.0  # no real backoff here

    def on_step(step: int, records: list[Any]) -> None:
        fake.fail(SET, fp.NVML_ERROR_TIMEOUT, times=None)

    try:
        with pytest.raises(ClocksNotReset) as caught:
            run_ticks(assembled.domains, 2, on_step=on_step)
    finally:
        assembled.close()
    assert caught.value.gpus == ("0", "1")
    assert "could not restore the power limit of GPU(s) 0,1" in str(caught.value)
    assert "GPU 0: 700 W" in str(caught.value)
    assert fake.locked(0) is None  # the clocks were reset all the same


def test_permission_denied_for_the_cap_leaves_the_clocks_governed(
    vllm_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(2)
    fake.fail(SET, fp.NVML_ERROR_NO_PERMISSION, times=None)
    config = _config(vllm_server.url, controller={"kind": "power-profile", "ceiling_mhz": 1410})
    config = config.model_copy(
        update={
            "domains": (
                config.domains[0].model_copy(
                    update={
                        "controller": config.domains[0].controller.model_copy(
                            update={"cap_w": 500.0}
                        )
                    }
                ),
            )
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    try:
        with caplog.at_level(logging.ERROR, logger="gpugov.daemon.power_limit"):
            records, _ = run_ticks(assembled.domains, 4)
    finally:
        assembled.close()
    assert len(caplog.records) == 1 and "CAP_SYS_ADMIN" in caplog.text
    assert [r.applied_mhz for r in records] == [1410] * 4  # the clock is governed
    assert (LOCK, 0, 1410, 1410) in fake.writes
    assert _limits_mw(fake) == [700_000, 700_000]


def test_a_dry_run_node_writes_no_power_limit(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), dry_run=True, nvml=fake)
    try:
        run_ticks(assembled.domains, 3)
    finally:
        assembled.close()
    assert fake.writes == []


@pytest.mark.parametrize("backend", ["actuator", "zeusd", "nvidia-smi"])
def test_a_cap_controller_with_a_clock_only_backend_is_refused_in_one_line(
    backend: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        _config("http://127.0.0.1:9/metrics", backend=backend)
    message = str(caught.value)
    assert "'power-cap' sets a GPU power limit" in message
    assert f'backend = "{backend}" cannot set' in message


# -------------------------------------------------------------- the simulated node
def test_run_simulate_with_a_power_cap_caps_the_simulated_plant() -> None:
    from gpugov.daemon.controller_config import PowerCapControllerConfig
    from gpugov.daemon.loop import TimedLoop, VirtualClock, run
    from gpugov.daemon.service import simulated_run
    from gpugov.plant import ServingPlant, load_profile
    from gpugov.plant.workload import load_trace

    workload, _ = load_trace("azure-conv-10min", duration_s=20)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    clock = VirtualClock()
    sim = simulated_run(
        workload, plant, PowerCapControllerConfig(kind="power-cap", cap_w=300.0), clock
    )
    caps: list[float | None] = []
    applied: list[float | None] = []

    def on_tick(batch: Any) -> None:
        caps.append(sim.node.simulation.gpu.cap_w)
        applied.append(sim.domain.snapshot().power_cap_applied_w)

    run(
        [sim.domain],
        TimedLoop(1.0, clock=clock, sleep=clock.sleep),
        on_tick=on_tick,
        before_tick=sim.before_tick,
    )
    assert caps and all(cap == pytest.approx(300.0) for cap in caps)
    assert all(value == pytest.approx(300.0) for value in applied)
    assert sim.node.simulation.gpu.cap_w is None  # restored at the end


def test_run_simulate_controller_power_cap_applies_it(capsys: pytest.CaptureFixture[str]) -> None:
    from gpugov.daemon import node_cli

    argv = ["run", "--simulate", "--virtual", "--duration", "20", "--quiet"]
    argv += ["--metrics-address", "none", "--controller", "power-cap:300"]
    assert node_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "clock writes, 2 power limit writes" in out  # the cap, and its restore


@pytest.mark.parametrize(
    ("low_mw", "high_mw"), [(700_000, 100_000), (0, 0), (0xFFFFFFFF, 0xFFFFFFFF), (0, 700_000)]
)
def test_power_limit_bounds_no_gpu_has_are_unknown_not_a_reason_to_drop(
    fake_nvml: FakeNvml,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    low_mw: int,
    high_mw: int,
) -> None:
    """NVML's bounds reversed, 0 or 0xFFFFFFFF mW: a genuine 350 W reading was discarded as
    a failed read, and no power cap could be written. Now unknown, with one warning."""
    from gpugov.daemon.gpu_sampling import DomainGpus

    # Only the bounds read back are bad: the GPU accepts 200-700 W, as the fake enforces.
    monkeypatch.setattr(
        fake_nvml, "nvmlDeviceGetPowerManagementLimitConstraints", lambda h: [low_mw, high_mw]
    )
    backends = _backends(fake_nvml)
    with caplog.at_level(logging.WARNING):
        assert backends[0].power_limit_constraints_w() is None
        assert backends[0].power_limit_constraints_w() is None
        gpus = DomainGpus(backends[:1])
        samples = [gpus.sample(float(step)) for step in range(2)]
        assert all(
            batch[0].power_w == pytest.approx(fake_nvml.gpus[0].power_mw / 1000)
            for batch in samples
        )
        actuator = PowerLimitActuator(backends, domain="d")
        assert actuator.apply(600.0) == 2
        assert _limits_mw(fake_nvml) == [300_000, 300_000]
        assert actuator.restore() == []
    lines = [r.getMessage() for r in caplog.records if "power limit bounds" in r.getMessage()]
    assert sorted(line.split(":")[0] for line in lines) == ["GPU 0", "GPU 1"]  # one a GPU
    assert all("taken as unknown" in line for line in lines)


def test_an_original_the_gpu_no_longer_accepts_is_restored_within_its_limits(
    fake_nvml: FakeNvml, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run capped GPU 0 and died; a driver update since lowered the highest limit the
    GPU accepts below the recorded original. The restore to the original was refused
    (invalid argument) at every start and exit, the GPU left capped at gpugov's limit;
    it is now restored to the highest limit it accepts, said once."""
    PowerLimitActuator(
        _backends(fake_nvml), domain="d", state=_state(tmp_path, pid=999_999_999)
    ).apply(600.0)
    assert _limits_mw(fake_nvml) == [300_000, 300_000]
    fake_nvml.gpus[0].power_limit_max_mw = 650_000  # the original 700 W is refused now
    restarted = PowerLimitActuator(_backends(fake_nvml), domain="d", state=_state(tmp_path))
    with caplog.at_level(logging.WARNING):
        lines = restarted.reconcile()
    assert _limits_mw(fake_nvml) == [650_000, 700_000]
    assert [line.split(";")[-1].strip() for line in lines] == ["restored", "restored"]
    assert "700 W is outside the 200-650 W it accepts now; restored to 650 W" in caplog.text
    assert "power_limits" not in json.loads((tmp_path / "locks.json").read_text())


@pytest.mark.parametrize("call", [SET, "nvmlDeviceGetPowerManagementLimit"])
@pytest.mark.parametrize(
    "code",
    [
        fp.NVML_ERROR_DRIVER_NOT_LOADED,
        fp.NVML_ERROR_UNINITIALIZED,
        fp.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    ],
)
def test_a_driver_gone_under_a_power_limit_call_ends_the_run_as_under_a_clock_write(
    vllm_server: MetricsServer, caplog: pytest.LogCaptureFixture, call: str, code: int
) -> None:
    """A power limit read or write that finds the driver unloaded or replaced mid-run
    ended the cap alone ("its power limit cannot be set (...: no NVIDIA driver on this
    machine; without a GPU, run `gpugov emulate`...)") and the run went on against a
    driver that was gone; a clock write's ends the run (DriverGone, the exit resetting
    what NVML still answers for). Both now do."""
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    fake.fail(call, code, times=None)  # the power limit calls alone: the first cap's
    try:
        with (
            caplog.at_level(logging.ERROR, logger="gpugov.daemon.power_limit"),
            pytest.raises(DriverGone, match="went away or was replaced"),
        ):
            run_ticks(assembled.domains, 6)
    finally:
        assembled.close()
    assert "cannot be set" not in caplog.text
    assert "no NVIDIA driver on this machine" not in caplog.text


@pytest.mark.parametrize(
    ("mins_w", "cap_w", "settled_w"),
    [
        ((200, 200), 300.0, (200, 200)),  # below what they accept together: each its lowest
        ((300, 100), 500.0, (300, 200)),  # GPU 0's lowest clamps its share: GPU 1 takes less
    ],
)
def test_a_gpu_whose_constraints_cannot_be_read_learns_its_lowest_limit_from_refusals(
    fake_nvml: FakeNvml,
    caplog: pytest.LogCaptureFixture,
    mins_w: tuple[int, int],
    cap_w: float,
    settled_w: tuple[int, int],
) -> None:
    """Constraints that can never be read (NOT_SUPPORTED for good) left a GPU's lowest
    limit unknown (0 W): its share went below it, NVML refused it (INVALID_ARGUMENT) and
    the refusal dropped the domain's cap for the whole run. Such a refusal now tells where
    the lowest limit lies: the share is kept above it, the cap holds, and the others take
    the difference as they do under constraints read."""
    fake_nvml.fail(
        "nvmlDeviceGetPowerManagementLimitConstraints", fp.NVML_ERROR_NOT_SUPPORTED, None
    )
    for gpu, low in zip(fake_nvml.gpus, mins_w, strict=True):
        gpu.power_limit_min_mw = low * 1000
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.power_limit"):
        for _ in range(40):
            actuator.apply(cap_w)
    assert actuator.refused is None
    assert "not applied" not in caplog.text
    for limit_mw, low, settled in zip(_limits_mw(fake_nvml), mins_w, settled_w, strict=True):
        assert low * 1000 <= limit_mw <= settled * 1000 + 1_000  # within 1 W above its lowest
    if cap_w >= sum(mins_w):
        assert sum(_limits_mw(fake_nvml)) <= cap_w * 1000 + 1_000
    learned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(learned) <= 2 and all("cannot be read" in line for line in learned)
    writes = len(_cap_writes(fake_nvml))
    actuator.apply(cap_w)  # settled: nothing more to write
    assert len(_cap_writes(fake_nvml)) == writes
    assert actuator.restore() == [] and _limits_mw(fake_nvml) == [700_000, 700_000]


@pytest.mark.parametrize("asked", [10**400, -(10**400), float("nan"), float("inf"), "300", True])
def test_a_cap_that_is_no_number_of_watts_is_one_line_and_no_cap(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture, asked: object
) -> None:
    """A controller's power cap that is no finite positive number of watts (an outside
    controller's own value): an integer too large for a float raised OverflowError out of
    the tick, text and True were read as 300 W and 1 W. Each is one line, once, and the
    GPUs keep their own limits."""
    actuator = PowerLimitActuator(_backends(fake_nvml), domain="d")
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.power_limit"):
        for _ in range(3):
            assert actuator.apply(asked) == 0  # type: ignore[arg-type]
    assert _cap_writes(fake_nvml) == [] and actuator.requested_w is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "not a positive number of watts" in lines[0]
