"""``gpugov profile --resume`` continues only the sweep it interrupted: the same GPUs
and the same served model, as well as the same settings and engine URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import make_profile

from gpugov.daemon.cli_support import UsageError
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.plant import ServingPlant
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.sweep import Sweep, SweepSettings


def test_a_resume_on_other_gpus_or_another_model_is_refused(tmp_path: Path) -> None:
    """``--resume`` compared the settings and the engine's URL only: a sweep resumed on
    another GPU (a mistyped ``--gpus``) or after the engine changed model fitted both into
    one profile."""
    server = EmulatorServer(
        EmulatedNode(ServingPlant.from_profile(make_profile()), gpus=2), "127.0.0.1", 0
    )
    server.start()
    backends = [EmulatedBackend(index, emulator=server.url) for index in (0, 1)]
    settings = SweepSettings(clocks_mhz=(1980, 1290), dwell_s=0.3)
    state = tmp_path / "sweep-state.jsonl"
    header = {"kind": "header", "settings": settings.header(), "url": server.url}
    try:
        for gpus, model, refused in (
            (["1"], "gpugov-emulated", "--resume with --gpus 0, the interrupted sweep's was 1"),
            (["0"], "other", "--resume with served model 'gpugov-emulated', the interrupted"),
        ):
            state.write_text(json.dumps({**header, "gpus": gpus, "model": model}) + "\n")
            sweep = Sweep([backends[0]], server.url, "gpugov-emulated", settings, tmp_path)
            with pytest.raises(UsageError, match=refused):
                sweep.run(resume=True)
            assert server.node.gpu_state[0].locked is None
    finally:
        for backend in backends:
            backend.close()
        server.close()
