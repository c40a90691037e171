"""A lock that does not hold while its clock is measured (another program reset the
clocks, the GPU or its emulator restarted, a lock write failed transiently): the GPU ran
at its own clock and the sweep recorded those rates and powers under the locked clock;
it now stops at that clock, not recorded, clocks reset."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_support import small_sweep_settings

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.measure import ProfileRunError
from gpugov.study.profiler.sweep import Sweep


def test_a_clock_the_gpu_did_not_hold_stops_the_sweep(
    emulator: EmulatorServer, tmp_path: Path
) -> None:
    class ResetBehind(EmulatedBackend):
        def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
            super().lock_clocks(min_mhz, max_mhz)
            if max_mhz < 1980:  # someone else resets the clocks once they are locked low
                super().reset_clocks()

    backend = ResetBehind(0, emulator=emulator.url)
    try:
        sweep = Sweep(
            [backend],
            emulator.url,
            "gpugov-emulated",
            small_sweep_settings(0.3),
            tmp_path,
            progress_enabled=False,
        )
        with pytest.raises(ProfileRunError, match=r"^1290 MHz: the GPUs ran at 1980 MHz"):
            sweep.run()
        assert emulator.node.gpu_state[0].locked is None
        state = (tmp_path / "sweep-state.jsonl").read_text().splitlines()
        assert len(state) == 2  # the header and 1980 MHz: the clock not held is not kept
        assert '"clock_mhz": 1980' in state[1]
    finally:
        backend.close()


def test_one_gpu_of_a_group_reset_is_caught_not_averaged_away() -> None:
    """A TP8 sweep locked at 1,290 MHz with one GPU reset to 1,980 MHz averages 1,376 MHz,
    within the driver's offset of the lock by the mean: the sweep recorded that GPU's
    power under 1,290 MHz. The fastest GPU's clock is judged, not the mean."""
    from types import SimpleNamespace

    from gpugov.study.profiler.measure import GpuReading

    clocks = tuple(float(c) for c in range(345, 1981, 15))
    stub = SimpleNamespace(backends=[SimpleNamespace(supported_clocks_mhz=lambda: clocks)])
    mean = (7 * 1290.0 + 1980.0) / 8
    readings = [
        GpuReading(float(t), 2000.0, None, mean, 60.0, top_sm_clock_mhz=1980.0) for t in range(5)
    ]
    with pytest.raises(ProfileRunError, match=r"^1290 MHz: the GPUs ran at 1980 MHz"):
        Sweep._check_lock_held(stub, 1290, "prefill", readings)  # type: ignore[arg-type]
    held = [GpuReading(float(t), 2000.0, None, 1290.0, 60.0, 1290.0) for t in range(5)]
    Sweep._check_lock_held(stub, 1290, "prefill", held)  # type: ignore[arg-type]
