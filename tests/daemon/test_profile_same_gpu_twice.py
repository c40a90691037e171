"""``gpugov profile --gpus 0,GPU-<its UUID>``: one GPU in two spellings was opened twice
and swept as a tensor-parallel group of two (the manifest's ``tensor_parallel`` 2 and its
power limit doubled); it is refused in one line before any clock is set."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon_support import node_commands_on
from fake_pynvml import FakeNvml
from synthetic import make_profile

from gpugov.cli import main
from gpugov.plant import ServingPlant
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer


def test_one_gpu_named_twice_in_two_spellings_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = node_commands_on(monkeypatch, FakeNvml(2))
    server = EmulatorServer(EmulatedNode(ServingPlant.from_profile(make_profile())), "127.0.0.1", 0)
    server.start()
    out = tmp_path / "out"
    try:
        uuid = fake.gpus[0].uuid
        argv = ["profile", "--engine-url", server.url, "--gpus", f"0,{uuid}", "--out", str(out)]
        code = main([*argv, "--quiet"])
    finally:
        server.close()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpugov: error: --gpus: GPU {uuid} is GPU 0, named twice; nothing was changed"]
    assert fake.writes == []  # no clock locked, none reset
    assert not out.exists()
