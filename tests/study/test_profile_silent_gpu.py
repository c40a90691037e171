"""A GPU that stops answering (not lost: every reading fails) midway through a sweep: the
clock measured without readings was kept and the sweep went on for every other clock, to
fail only when the profile was written; it now stops at that clock, clocks reset."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import make_profile

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.errors import TransientGpuError
from gpugov.plant import ServingPlant
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.measure import ProfileRunError
from gpugov.study.profiler.sweep import Sweep, SweepSettings, default_decode_points


def test_a_clock_measured_without_readings_stops_the_sweep(tmp_path: Path) -> None:
    server = EmulatorServer(EmulatedNode(ServingPlant.from_profile(make_profile())), "127.0.0.1", 0)
    server.start()

    class Silent(EmulatedBackend):
        def sample(self):  # type: ignore[no-untyped-def]
            raise TransientGpuError("GPU 0: the reading timed out")

    backend = Silent(0, emulator=server.url)
    settings = SweepSettings(
        clocks_mhz=(1980, 1290),
        dwell_s=0.3,
        decode_points=default_decode_points(16, 256, 131_072),
        reference_batch=16,
        reference_context_tokens=256,
    )
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
        server.close()
