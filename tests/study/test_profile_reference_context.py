"""``--reference-context`` above the engine's ``max_model_len``: the decode points were
cut to the model's length and the profile's decode rate was the latency fit extrapolated
to sequences the engine cannot serve, written as the reference; it is refused in one line
before any GPU is opened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpugov.cli import main
from gpugov.daemon import gpu_open
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.openai_client import served_max_model_len


class _Opened(Exception):
    pass


def _open_backend(*args: Any, **kwargs: Any) -> None:
    raise _Opened  # the checks passed: the GPUs are opened next


@pytest.mark.parametrize("over", [1, 68_928])
def test_a_reference_context_beyond_the_model_length_is_refused(
    emulator: EmulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    over: int,
) -> None:
    monkeypatch.setattr(gpu_open, "open_backend", _open_backend)
    longest = served_max_model_len(emulator.url, "gpugov-emulated")
    assert longest is not None
    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "emulated"]
    argv += ["--out", str(tmp_path / "out"), "--reference-batch", "1", "--quiet"]
    assert main([*argv, "--reference-context", str(longest + over)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"gpugov: error: --reference-context {longest + over}: longer than the engine's "
        f"max_model_len ({longest} tokens), a sequence it cannot serve; give at most "
        f"{longest}; nothing was changed"
    ]
    assert not (tmp_path / "out").exists()


def test_a_reference_context_at_the_model_length_passes(
    emulator: EmulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_open, "open_backend", _open_backend)
    longest = served_max_model_len(emulator.url, "gpugov-emulated")
    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "emulated"]
    argv += ["--out", str(tmp_path / "out"), "--reference-batch", "1", "--quiet"]
    with pytest.raises(_Opened):
        main([*argv, "--reference-context", str(longest)])
