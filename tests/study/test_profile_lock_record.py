"""``gpugov profile`` keeps its clock locks in the daemon's lock record (``locks.json`` in
the state directory): a profile killed outright leaves its GPUs named there, for
``gpugov reset-clocks`` (and the next ``gpugov run``) to reset and ``gpugov status`` to
show; a running governor holding the state directory refuses the profile before any
clock is locked. (A normal end, an interrupt and a dry run: tests/study/test_profile.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from study_support import SMALL_BATCH, SMALL_CONTEXT

from gpugov.cli import main
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.gpu_hold import hold_gpu, release
from gpugov.daemon.lockstate import STATE_FILE, LockState, live_writer
from gpugov.study.emulate.server import EmulatorServer

SMALL_REFERENCE = ("--reference-batch", str(SMALL_BATCH), "--reference-context", str(SMALL_CONTEXT))


def _argv(url: str, out: Path, *extra: str) -> list[str]:
    return [
        "profile", "--engine-url", url, "--gpus", "0", "--backend", "emulated",
        "--out", str(out), "--quiet", "--clock-list", "1980,1290", *SMALL_REFERENCE, *extra,
    ]  # fmt: skip


def _entries(state_dir: Path) -> dict[str, dict[str, object]]:
    return dict(json.loads((state_dir / STATE_FILE).read_text())["gpus"])


def _recorded(state_dir: Path) -> bool:
    try:
        return bool(_entries(state_dir))
    except (OSError, ValueError):  # not written yet
        return False


def test_a_profile_killed_mid_sweep_leaves_its_lock_recorded_for_reset_clocks(
    emulator: EmulatorServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGKILLed (or OOM-killed) mid-sweep, the profile resets nothing: its lock was
    recorded nowhere, so the next ``gpugov run`` left the GPU locked low and ``gpugov
    status`` did not show it as gpugov's. Now the record names the GPU and the dead
    profile, status shows it, and reset-clocks resets it and clears the entry."""
    state_dir = tmp_path / "state"
    gpu = emulator.node.gpu_state[0]
    # The state directory as systemd gives the daemon one: $STATE_DIRECTORY.
    env = {**os.environ, "STATE_DIRECTORY": str(state_dir), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = _argv(emulator.url, tmp_path / "out", "--dwell", "30")  # killed in its first dwell
    process = subprocess.Popen(
        [sys.executable, "-m", "gpugov", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60.0
        while process.poll() is None and time.monotonic() < deadline:
            if gpu.locked is not None and _recorded(state_dir):  # locked, then recorded
                break
            time.sleep(0.02)
        assert gpu.locked == (1980, 1980), process.poll()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stderr is not None
    process.stderr.close()
    assert gpu.locked == (1980, 1980)  # killed outright: nothing reset it
    [(key, entry)] = _entries(state_dir).items()
    assert entry["gpu"] == "0" and key != "0"  # keyed by the GPU's UUID
    assert (entry["min_mhz"], entry["max_mhz"], entry["pid"]) == (1980, 1980, process.pid)
    assert not live_writer(entry)

    monkeypatch.setenv("STATE_DIRECTORY", str(state_dir))
    assert main(["status", "--backend", "emulated", "--emulator", emulator.url, "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)["gpus"]
    held = shown["held_by_gpugov"]
    assert (held["clock_lock_mhz"], held["pid"], held["running"]) == (
        [1980, 1980],
        process.pid,
        False,
    )

    argv = ["reset-clocks", "--backend", "emulated", "--emulator", emulator.url, "--gpus", "0"]
    assert main(argv) == 0
    assert gpu.locked is None
    assert _entries(state_dir) == {}


def test_a_profile_is_refused_while_a_running_governor_holds_the_state_directory(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile on the state directory a running ``gpugov run`` holds would fight it over
    the clocks: refused in one line naming the directory and the governor's pid, exit 2,
    before any clock is locked or any measurement made."""
    state_dir = tmp_path / "state"
    governor = LockState(state_dir)
    governor.hold()  # as gpugov run holds it (this process's pid in the hold file)
    try:
        out = tmp_path / "out"
        code = main(_argv(emulator.url, out, "--dwell", "0.3", "--state-dir", str(state_dir)))
    finally:
        governor.release()
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gpugov: error: --state-dir {state_dir}: gpugov (pid {os.getpid()}) holds this state "
        "directory: a running governor (or another profile) sets these clocks, and the two "
        "would fight over them; stop it before profiling (systemctl stop gpugov); nothing was "
        "changed"
    ]
    assert emulator.node.gpu_state[0].locked is None
    assert not (out / "sweep-state.jsonl").exists()
    assert not (state_dir / STATE_FILE).exists()


def test_a_profile_is_refused_on_a_gpu_a_governor_with_another_state_directory_holds(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A governor keeping its lock record elsewhere holds the GPU itself
    (``daemon.gpu_hold``): the profile is refused naming the GPU and the holder, exit 2,
    before any clock is locked; the profile's own state directory is let go."""
    uuid = str(EmulatedBackend(0, emulator=emulator.url).uuid)
    governor = hold_gpu(uuid, "emulated", named="0", emulator=emulator.url)
    (tmp_path / "s").mkdir()
    try:
        out = tmp_path / "out"
        code = main(_argv(emulator.url, out, "--dwell", "0.3", "--state-dir", str(tmp_path / "s")))
    finally:
        release([governor] if governor is not None else [])
    assert code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"gpugov: error: --gpus: GPU 0 ({uuid}) is held by another gpugov on this node (pid "
        f"{os.getpid()} ("
    )
    assert lines[0].endswith("; stop it before profiling; nothing was changed")
    assert emulator.node.gpu_state[0].locked is None
    assert not (out / "sweep-state.jsonl").exists()
    LockState(tmp_path / "s").hold()  # not held by the refused profile
