"""A profile measured against ``gpugov emulate`` says ``emulated`` whatever GPU backend
read it: with ``--backend nvml`` (a fake or real NVML) and the emulator as the engine, the
rates are the simulated plant's, and the manifest said ``measured``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from synthetic import make_profile

from gpugov.cli import main
from gpugov.daemon import gpu_open
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.plant import ServingPlant, load_profile
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.cli import profile_status


def test_the_status_follows_the_engine_as_well_as_the_backend(emulator: EmulatorServer) -> None:
    assert profile_status("emulated", "http://127.0.0.1:9") == "emulated"
    assert profile_status("nvml", emulator.url) == "emulated"
    assert profile_status("nvidia-smi", emulator.url + "/v1") == "emulated"
    assert profile_status("nvml", "http://127.0.0.1:9") == "measured"


def test_an_nvml_run_against_the_emulator_writes_an_emulated_profile(
    emulator: EmulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest said ``measured`` for an NVML run against the emulator. The same run
    (one sweep for both) reads no power limit from its GPU: 700 W was written with no
    word that it was assumed, beside the measured columns."""
    import dataclasses

    # The GPU NVML would open stands in as the emulator's own (its readings follow the
    # emulated engine's load, as a board's follow its engine's), with no power limit.
    class NoLimit(EmulatedBackend):
        def sample(self):  # type: ignore[no-untyped-def]
            return dataclasses.replace(super().sample(), power_limit_w=None)

    def open_backend(gpu: Any, backend: str, **_: Any) -> EmulatedBackend:
        assert backend == "nvml"
        return NoLimit(int(gpu), emulator=emulator.url)

    monkeypatch.setattr(gpu_open, "open_backend", open_backend)
    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "nvml"]
    argv += ["--out", str(tmp_path), "--quiet", "--clock-list", "1980,1290", "--dwell", "0.3"]
    argv += ["--reference-batch", "16", "--reference-context", "256", "--name", "p"]
    code = main(argv)
    assert code == 0
    profile = load_profile(tmp_path / "p.json")
    assert profile.profile_status == "emulated" and not profile.is_measured
    assert "not on hardware" in profile.manifest["warning"]
    assert profile.manifest["power_limit_w"] == 700.0
    assert any("assumes 700 W per GPU" in line for line in profile.manifest["assumptions"])


def test_an_engine_faster_than_real_time_is_refused_whatever_the_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``--speed`` check asked only ``--emulator`` under ``--backend emulated``: with
    ``--backend nvml`` against ``gpugov emulate --speed 4`` every rate came out four times
    the plant's."""
    server = EmulatorServer(
        EmulatedNode(ServingPlant.from_profile(make_profile()), speed=4.0), "127.0.0.1", 0
    )
    server.start()
    opened: list[Any] = []
    monkeypatch.setattr(gpu_open, "open_backend", lambda *a, **k: opened.append(a))
    try:
        out = tmp_path / "new"
        argv = ["profile", "--engine-url", server.url + "/v1", "--gpus", "0", "--out", str(out)]
        code = main([*argv, "--quiet"])
    finally:
        server.close()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpugov: error: --engine-url {server.url}: ")
    assert "--speed 4" in err[0] and "nothing was changed" in err[0]
    assert not out.exists() and not opened


@pytest.mark.parametrize(
    ("gpus", "node_gpus", "said"),
    [
        ("0", 2, "--engine-url {url}: gpugov emulate serves 2 engine replicas (GPUs 0; 1)"),
        ("0", 1, None),
        ("0,1", 4, "--gpus 0,1: the emulated engine runs on GPUs 0,1,2,3: give exactly those"),
        ("0,7", 4, None),  # no GPU 7: the backend says so (exit 4)
    ],
)
def test_an_emulated_engine_is_profiled_on_its_one_replicas_gpus(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    gpus: str,
    node_gpus: int,
    said: str | None,
) -> None:
    """Against an emulator of two replicas the requests were spread over both while one
    was locked; ``--gpus`` naming other GPUs than the engine's locked GPUs it does not
    run on. Both measured a profile of nothing: refused before any clock is set."""
    # Four GPUs: one replica of a tensor-parallel group of four.
    node = EmulatedNode(
        ServingPlant.from_profile(make_profile()),
        gpus=node_gpus,
        tensor_parallel=4 if node_gpus == 4 else None,
    )
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()

    class Opened(Exception):
        pass

    def open_backend(*args: Any, **kwargs: Any) -> None:
        raise Opened  # the checks passed: the GPUs are opened next

    monkeypatch.setattr(gpu_open, "open_backend", open_backend)
    try:
        argv = ["profile", "--engine-url", server.url, "--gpus", gpus, "--backend", "emulated"]
        argv += ["--out", str(tmp_path / "out"), "--quiet"]
        if said is None:
            with pytest.raises(Opened):
                main(argv)
            return
        assert main(argv) == 2
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpugov: error: " + said.format(url=server.url))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("gpus", ["0", "1", "0,1"])
def test_a_disaggregated_emulator_is_refused_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: str
) -> None:
    """Against ``gpugov emulate --layout 1P1D`` the line said the emulator "spreads the
    requests over" two replicas; its pools serve each request's prefill and decode in
    turn, on different GPUs, which no profile of one engine describes."""
    from gpugov.study.emulate.disaggregated import DisaggregatedNode

    node = DisaggregatedNode(
        ServingPlant.from_profile(make_profile()), prefill_replicas=1, decode_replicas=1
    )
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        argv = ["profile", "--engine-url", server.url, "--gpus", gpus, "--backend", "emulated"]
        assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"gpugov: error: --engine-url {server.url}: gpugov emulate serves a disaggregated "
        "layout (prefill GPUs 0, decode GPUs 1)"
    )
    assert "spreads" not in err[0] and "without --layout" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_dry_run_against_the_emulator_says_it_is_emulated(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dry run's record and line said "measured" with no word of the emulator."""
    import json

    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "emulated"]
    argv += ["--out", str(tmp_path), "--quiet", "--dry-run", "--dwell", "0.3"]
    assert main([*argv, "--reference-batch", "16", "--reference-context", "256"]) == 0
    assert json.loads((tmp_path / "dry-run.json").read_text())["status"] == "emulated"
    assert "measured through gpugov emulate" in capsys.readouterr().out
