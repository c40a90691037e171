"""A GPU lost in the middle of a clock's measurement: the sampler saw it lost, but the
sweep first found that clock without readings and ended with "did a GPU stop answering?"
(exit 1); it now ends as a lost GPU (:class:`GpuLost`, the command's exit 5)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from study_support import small_sweep_settings

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.errors import GpuLost
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.sweep import Sweep


def test_a_gpu_lost_mid_clock_ends_the_sweep_as_lost(
    emulator: EmulatorServer, tmp_path: Path
) -> None:
    class LostAtTheSecondClock(EmulatedBackend):
        lost_at = math.inf

        def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
            super().lock_clocks(min_mhz, max_mhz)
            if max_mhz < 1980:  # lost once its idle power is measured (settle and dwell)
                self.lost_at = time.monotonic() + 1.2

        def sample(self) -> GpuSample:
            if time.monotonic() >= self.lost_at:
                raise GpuLost(f"GPU {self.label}: GPU is lost (NVML code 15)")
            return super().sample()

    backend = LostAtTheSecondClock(0, emulator=emulator.url)
    try:
        sweep = Sweep(
            [backend],
            emulator.url,
            "gpugov-emulated",
            small_sweep_settings(0.3),
            tmp_path,
            progress_enabled=False,
        )
        with pytest.raises(GpuLost, match="GPU is lost"):
            sweep.run()
        state = (tmp_path / "sweep-state.jsonl").read_text().splitlines()
        assert len(state) == 2  # the header and 1980 MHz: the clock it was lost in is not kept
    finally:
        backend.close()
