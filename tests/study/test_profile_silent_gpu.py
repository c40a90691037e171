"""A GPU that stops answering (not lost: every reading fails) midway through a sweep: the
clock measured without readings was kept and the sweep went on for every other clock, to
fail only when the profile was written; it now stops at that clock, clocks reset."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_support import small_sweep_settings

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.errors import TransientGpuError
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.measure import ProfileRunError
from gpugov.study.profiler.sweep import Sweep


def test_a_clock_measured_without_readings_stops_the_sweep(
    emulator: EmulatorServer, tmp_path: Path
) -> None:
    server = emulator

    class Silent(EmulatedBackend):
        def sample(self):  # type: ignore[no-untyped-def]
            raise TransientGpuError("GPU 0: the reading timed out")

    backend = Silent(0, emulator=server.url)
    settings = small_sweep_settings(0.3)
    try:
        sweep = Sweep([backend], server.url, "gpugov-emulated", settings, tmp_path)
        sweep.progress_enabled = False
        with pytest.raises(ProfileRunError, match=r"^1980 MHz: no idle power and no prefill"):
            sweep.run()
        assert server.node.gpu_state[0].locked is None
        state = (tmp_path / "sweep-state.jsonl").read_text().splitlines()
        assert len(state) == 1  # the header only: the clock without readings is not kept
    finally:
        backend.close()
