"""A clock lock whose write fails transiently (an NVML timeout, the driver busy): the
sweep went on to measure that clock with the GPUs at the clock before it and recorded
those rates under the clock it asked for; the lock is written again, and a lock that
never takes ends the sweep at that clock, not recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_support import small_sweep_settings

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.errors import TransientGpuError
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.measure import ProfileRunError
from gpugov.study.profiler.sweep import Sweep


class _Flaky(EmulatedBackend):
    """Fails the first ``failures`` lock writes of a clock below 1980 MHz."""

    failures = 1

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        if max_mhz < 1980 and self.failures > 0:
            self.failures -= 1
            raise TransientGpuError(f"GPU {self.label}: the lock write timed out")
        super().lock_clocks(min_mhz, max_mhz)


def _sweep(emulator: EmulatorServer, tmp_path: Path, backend: EmulatedBackend) -> Sweep:
    return Sweep(
        [backend],
        emulator.url,
        "gpugov-emulated",
        # 1290 MHz first: a lock that failed left the GPU at its default clock,
        # above it; 1980 MHz after it.
        small_sweep_settings(0.3).__class__(
            **{**small_sweep_settings(0.3).__dict__, "clocks_mhz": (1290, 1980)}
        ),
        tmp_path,
        progress_enabled=False,
    )


def test_a_lock_that_failed_once_is_written_again(emulator: EmulatorServer, tmp_path: Path) -> None:
    backend = _Flaky(0, emulator=emulator.url)
    try:
        records = _sweep(emulator, tmp_path, backend).run()
    finally:
        backend.close()
    assert [r["clock_mhz"] for r in records] == [1290, 1980]
    assert abs(records[0]["realized_clock_mhz"] - 1290) <= 30
    assert emulator.node.gpu_state[0].locked is None


def test_a_lock_that_never_takes_ends_the_sweep(emulator: EmulatorServer, tmp_path: Path) -> None:
    backend = _Flaky(0, emulator=emulator.url)
    backend.failures = 100
    try:
        with pytest.raises(ProfileRunError, match=r"^1290 MHz: the lock could not be set"):
            _sweep(emulator, tmp_path, backend).run()
    finally:
        backend.close()
    assert (tmp_path / "sweep-state.jsonl").read_text().count("\n") == 1  # the header only
    assert emulator.node.gpu_state[0].locked is None
