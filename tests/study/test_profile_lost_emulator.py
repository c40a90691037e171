"""An emulator (GPU and engine) that stops answering midway: the exit line said "clocks
reset" while the reset had failed; it now names the GPUs that may still be locked and
the command that unlocks them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from study_support import start_emulator_process
from synthetic import make_profile

from gpugov.cli import main
from gpugov.study.profiler import cli as profile_cli
from gpugov.study.profiler.accuracy import write_profile_files


def _two_clock_profile(url: str, out: Path) -> list[str]:
    """``gpugov profile`` of GPU 0 of the emulator at ``url`` at two clocks, into ``out``."""
    return [
        *("profile", "--engine-url", url, "--gpus", "0", "--backend", "emulated"),
        *("--out", str(out), "--quiet", "--clock-list", "1980,1290"),
        *("--dwell", "0.3", "--reference-batch", "16", "--reference-context", "256"),
    ]


def test_a_failed_reset_is_not_reported_as_a_reset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator, url = start_emulator_process(write_profile_files(make_profile(), tmp_path))
    try:

        def gone_after_the_first_clock(record: dict[str, Any]) -> None:
            emulator.kill()  # the emulated node (its GPU and its engine) is gone
            emulator.wait()

        monkeypatch.setattr(profile_cli, "_check_load", gone_after_the_first_clock)
        code = main(_two_clock_profile(url, tmp_path / "out"))
    finally:
        emulator.kill()
        emulator.wait()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code != 0
    assert "clocks reset" not in last, last
    assert last.endswith(
        "GPU(s) 0 could not be reset and may still be locked: run gpugov reset-clocks "
        f"--gpus 0 --backend emulated --emulator {url} once it answers"
    ), last


def test_a_finished_sweep_whose_reset_fails_says_so_and_exits_6(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every clock measured and the profile written, but the GPU refuses the last reset
    (the driver no longer takes the call): the run ends with the line naming the GPU that
    may still be locked and the command that unlocks it, exit 6 as ``run``'s, where it
    printed only the profile's lines and exited 0."""
    from gpugov.daemon.emulated import EmulatedBackend
    from gpugov.daemon.errors import NotSupported

    emulator, url = start_emulator_process(write_profile_files(make_profile(), tmp_path))
    try:

        def refuses_resets_from_now_on(record: dict[str, Any]) -> None:
            def refused(self: EmulatedBackend) -> None:
                raise NotSupported("GPU 0: reset the SM clocks: not supported")

            monkeypatch.setattr(EmulatedBackend, "reset_clocks", refused)

        monkeypatch.setattr(profile_cli, "_check_load", refuses_resets_from_now_on)
        code = main(_two_clock_profile(url, tmp_path / "out"))
    finally:
        emulator.kill()
        emulator.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert (tmp_path / "out").is_dir() and list((tmp_path / "out").glob("*.json"))
    assert code == 6, err
    assert err[-1].endswith(
        "GPU(s) 0 could not be reset and may still be locked: run gpugov reset-clocks "
        f"--gpus 0 --backend emulated --emulator {url} once it answers"
    ), err[-1]
