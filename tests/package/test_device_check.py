"""The device check's guard and script: every NVML setter is refused and logged, and the
script's dry run, rehearsed against the emulator, makes no clock write."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import nvml_guard  # noqa: E402

RUN_EARLY = 36  # its rough seconds on 2 cores: tests/conftest.py runs the longest files first


def test_guard_refuses_and_logs_every_setter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in dir(pynvml):
        if name.startswith(nvml_guard.WRITE_PREFIXES):
            monkeypatch.setattr(pynvml, name, getattr(pynvml, name))  # restored after
    log = tmp_path / "setters.jsonl"
    names = nvml_guard.guard(log)
    assert {
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceSetPersistenceMode",
    } <= set(names)
    with pytest.raises(pynvml.NVMLError) as refused:
        pynvml.nvmlDeviceSetGpuLockedClocks(None, 1980, 1980)
    assert refused.value.value == pynvml.NVML_ERROR_NO_PERMISSION
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["function"] for line in lines] == ["nvmlDeviceSetGpuLockedClocks"]
    assert not any(name.startswith("nvmlDeviceGet") for name in names)


STALE_TICK = "not scraped: the last good data went stale before this tick"


def _scrape_ran_late(error: str | None) -> bool:
    """Whether a fail-safe tick's ``engine_error`` is a scrape that ran past its timeout
    (the script's 0.125 s, half the period) or a tick that came after the data went stale:
    what a loaded machine does to the emulator's page, which the daemon answers with the
    fail-safe by design."""
    return error is not None and ("timed out" in error or error == STALE_TICK)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the script polls with curl")
def test_dry_run_script_rehearsed_on_the_emulator(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "BACKEND": "emulated",
        "PYTHON": sys.executable,
        "PORT": str(_free_port()),
        "METRICS_PORT": str(_free_port()),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        # 4 s of load (the daemon runs 5 s more: about 36 ticks at 0.25 s); the script's
        # steps around it (emulator, check-config, status) take the rest.
        ["bash", "bench/device_dry_run.sh", "4"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "setters.jsonl").read_text() == ""
    assert (out / "status.txt").read_text().splitlines()[-1] == "rc 0"
    lines = (out / "record.jsonl").read_text().splitlines()
    header, ticks = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    assert header["dry_run"] is True and len(ticks) >= 10
    # No tick is in fail-safe but for the scrapes a loaded machine made late (the engine
    # page not read within 0.125 s: the data went stale, and the fail-safe is the
    # daemon's answer); a page the daemon could not read, a GPU read or the controller
    # failing would show here. (All ticks clear was asserted: with 3 busy loops, a
    # fault-scenario loop and another test run beside it, 3 runs of 3 failed it; the two
    # looked at had 1 fail-safe tick of about 60, after a scrape past 0.125 s.)
    failsafe = [tick for tick in ticks if tick["failsafe"]]
    assert all(_scrape_ran_late(tick["engine_error"]) for tick in failsafe), failsafe[:3]
    assert len(failsafe) < len(ticks)
    log = (out / "logs.txt").read_text()
    assert "daemon exit 0" in log and "setters refused: 0" in log
    assert "Traceback" not in log
