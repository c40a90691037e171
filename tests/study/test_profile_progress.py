"""``gpugov profile``'s progress: a line with an ETA for every measurement (a line per
clock left the first clock, a minute or more, without either), and an ETA from the clocks
measured in this run (resumed clocks counted as measured in no time made it too short)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from synthetic import make_profile

from gpugov.daemon.emulated import EmulatedBackend
from gpugov.plant import ServingPlant
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.sweep import Interrupted, Sweep, SweepSettings, default_decode_points


def test_every_measurement_has_a_line_and_resumed_clocks_leave_the_eta_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = EmulatorServer(EmulatedNode(ServingPlant.from_profile(make_profile())), "127.0.0.1", 0)
    server.start()
    backend = EmulatedBackend(0, emulator=server.url)
    settings = SweepSettings(
        clocks_mhz=(1980, 1290),
        dwell_s=0.3,
        decode_points=default_decode_points(16, 256, 131_072),
        reference_batch=16,
        reference_context_tokens=256,
    )
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
        server.close()
