"""``gpugov profile``'s progress: a line with an ETA for every measurement (a line per
clock left the first clock, a minute or more, without either), and an ETA from the clocks
measured in this run (resumed clocks counted as measured in no time made it too short)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from study_support import small_sweep_settings

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.sweep import Interrupted, Sweep


def test_every_measurement_has_a_line_and_resumed_clocks_leave_the_eta_alone(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = emulator
    backend = EmulatedBackend(0, emulator=server.url)
    settings = small_sweep_settings(0.3)
    stop = threading.Event()
    try:
        sweep = Sweep([backend], server.url, "gpugov-emulated", settings, tmp_path, stop=stop)
        with pytest.raises(Interrupted):
            sweep.run(check_load=lambda record: stop.set())
        first = capsys.readouterr().err.splitlines()
        # One line per measurement of the first clock, each with a settled ETA.
        steps = [line for line in first if "measured" in line]
        assert [line.rsplit(": ", 1)[-1] for line in steps] == [
            "idle measured",
            "prefill measured",
            *(f"decode B={batch} measured" for batch, _ in settings.decode_points),
        ]
        assert all("1980 MHz (clock 1 of 2)" in line for line in steps)
        assert all(re.search(r"ETA \d", line) for line in steps), steps
        stop.clear()
        Sweep([backend], server.url, "gpugov-emulated", settings, tmp_path).run(resume=True)
        second = capsys.readouterr().err.splitlines()
        # Only the one clock left is counted: 6 measurements, none of them resumed.
        assert "(0/6 measurements)" in second[0] and "1 of 2 clocks resumed" in second[0]
        assert "(6/6 measurements)" in second[-1]
    finally:
        backend.close()
