"""A GPU whose supported clock list cannot make a profile (one clock, none) is refused in
one line before any clock is set: the sweep locked and measured it for minutes, then
failed writing a profile of one clock (or, with no clock listed, a traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from synthetic import make_profile

from gpugov.cli import main
from gpugov.daemon import gpu_open
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.plant import ServingPlant
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer


@pytest.mark.parametrize(
    ("listed", "flags", "said"),
    [
        ([1980], [], "GPU 0 lists one supported clock (1980 MHz): a profile needs two"),
        ([1980, 1980], [], "GPU 0 lists one supported clock (1980 MHz): a profile needs two"),
        ([], [], "GPU 0 lists no supported clock: a profile needs two"),
        ([], ["--clock-list", "1980,1290"], "GPU 0 lists no supported clock: a profile needs two"),
    ],
)
def test_a_gpu_with_too_few_clocks_is_refused_before_any_work(
    emulator: EmulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    listed: list[int],
    flags: list[str],
    said: str,
) -> None:
    class FewClocks(EmulatedBackend):
        def supported_clocks_mhz(self) -> list[int]:
            return list(listed)

    def open_backend(gpu: Any, backend: str, **_: Any) -> EmulatedBackend:
        return FewClocks(int(gpu), emulator=emulator.url)

    monkeypatch.setattr(gpu_open, "open_backend", open_backend)
    out = tmp_path / "out"
    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "emulated"]
    assert main([*argv, "--out", str(out), "--quiet", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert not out.exists()
    assert emulator.node.gpu_state[0].locked is None


def test_a_dry_run_on_a_gpu_of_one_clock_runs(
    emulator: EmulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run locks no clock: one listed clock does not stop it."""

    class OneClock(EmulatedBackend):
        def supported_clocks_mhz(self) -> list[int]:
            return [1980]

    def open_backend(gpu: Any, backend: str, **_: Any) -> EmulatedBackend:
        return OneClock(int(gpu), emulator=emulator.url)

    monkeypatch.setattr(gpu_open, "open_backend", open_backend)
    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "emulated"]
    argv += ["--out", str(tmp_path), "--quiet", "--dry-run", "--dwell", "0.3"]
    assert main([*argv, "--reference-batch", "16", "--reference-context", "256"]) == 0
    assert (tmp_path / "dry-run.json").exists()


@pytest.mark.parametrize(("fault", "code"), [("lost", 5), ("no-permission", 3)])
def test_a_gpu_failing_as_it_is_opened_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, code: int
) -> None:
    """An emulated GPU lost before the sweep (``gpugov emulate --fault lost``) raised
    GpuLost out of the GPU's opening: a traceback."""
    node = EmulatedNode(ServingPlant.from_profile(make_profile()), fault=fault)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        argv = ["profile", "--engine-url", server.url, "--gpus", "0", "--backend", "emulated"]
        result = main([*argv, "--out", str(tmp_path / "out"), "--quiet"])
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()
    if fault == "lost":
        assert result == code and len(err) == 1 and "GPU is lost" in err[0], err
        assert not (tmp_path / "out").exists()
    else:  # opened; refused at its first lock, as before
        assert result == code and len(err) == 1, err
