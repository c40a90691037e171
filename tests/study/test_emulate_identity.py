"""The emulated GPUs' identity: named as NVML names the profile's GPU (so the governor's
GPU-family hint applies), with UUIDs that follow the profile (so a governor's learned
model, keyed on them, is restored across restarts and never applied to another profile's
GPUs)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.contract import unwrap
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.prior import gpu_family
from gpugov.daemon.config import parse_config
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.errors import DRIVER_GONE_CODES, GpuUnavailable
from gpugov.daemon.service import domains_from_config, gpu_uuid
from gpugov.plant import ServingPlant, load_profile
from gpugov.study.emulate.node import (
    UNNAMED_GPU,
    EmulatedNode,
    emulated_gpu_name,
    emulated_gpu_uuid,
)
from gpugov.study.emulate.server import EmulatorServer

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
BUNDLED = sorted(path.stem for path in PROFILES_DIR.glob("*.json"))
NVML_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuids(profile_name: str, gpus: int = 2) -> tuple[str, ...]:
    node = EmulatedNode(ServingPlant.from_profile(load_profile(profile_name)), gpus=gpus)
    return tuple(str(node.gpu_info(gpu)["uuid"]) for gpu in range(gpus))


def test_the_same_profile_gives_the_same_uuids_on_every_start() -> None:
    first = _uuids("h100-sxm-llama3-8b")
    assert first == _uuids("h100-sxm-llama3-8b")
    assert all(NVML_UUID.fullmatch(uuid) for uuid in first), first
    assert len(set(first)) == 2  # one per GPU index
    # A profile built in memory (no files, no file digests) is stable too.
    assert emulated_gpu_uuid(make_profile(), 0) == emulated_gpu_uuid(make_profile(), 0)


def test_another_profile_gives_other_uuids() -> None:
    h100_8b = _uuids("h100-sxm-llama3-8b")
    # Another GPU kind, and the same GPU kind serving another model: no UUID shared.
    assert not set(h100_8b) & set(_uuids("h200-sxm-llama3-8b"))
    # (a TP4 profile's node has 4 GPUs per replica)
    assert not set(h100_8b) & set(_uuids("h100-sxm-llama3-70b-tp4", 4))
    # The content counts, not only the name: an edited profile is another profile.
    edited = make_profile(gpu="test GPU, other fit")
    assert emulated_gpu_uuid(edited, 0) != emulated_gpu_uuid(make_profile(), 0)


def test_a_copied_profile_keeps_its_uuids_an_edited_one_does_not(tmp_path: Path) -> None:
    name = "h100-sxm-llama3-8b"
    for suffix in (".json", ".csv"):
        source = PROFILES_DIR / f"{name}{suffix}"
        (tmp_path / f"{name}{suffix}").write_bytes(source.read_bytes())
    copied = load_profile(tmp_path / f"{name}.json")
    assert emulated_gpu_uuid(copied, 0) == _uuids(name, 1)[0]
    manifest = tmp_path / f"{name}.json"
    manifest.write_text(manifest.read_text().replace('"tpot_slo_s": 0.05', '"tpot_slo_s": 0.06'))
    assert emulated_gpu_uuid(load_profile(manifest), 0) != _uuids(name, 1)[0]


@pytest.mark.parametrize("name", BUNDLED)
def test_a_bundled_profiles_gpu_name_gives_its_family_hint(name: str) -> None:
    profile = load_profile(name)
    gpu = emulated_gpu_name(profile)
    assert gpu == profile.manifest["gpu"] and gpu.startswith("NVIDIA ")
    family = gpu_family(gpu)
    assert family is not None
    assert family.key == str(profile.manifest["gpu_kind"]).lower()


def test_an_unknown_or_unstated_gpu_gives_no_hint() -> None:
    assert emulated_gpu_name(make_profile(gpu="Tesla V100-SXM2-16GB")) == (
        "NVIDIA Tesla V100-SXM2-16GB"
    )
    assert gpu_family(emulated_gpu_name(make_profile(gpu="Tesla V100-SXM2-16GB"))) is None
    assert gpu_family(emulated_gpu_name(make_profile())) is None  # "test GPU"
    stated = make_profile()
    unstated = replace(stated, manifest={k: v for k, v in stated.manifest.items() if k != "gpu"})
    assert emulated_gpu_name(unstated) == UNNAMED_GPU
    assert gpu_family(UNNAMED_GPU) is None
    # Only the stated kind: NVML's prefix added, and it names the family.
    assert emulated_gpu_name(make_profile(gpu=" ", gpu_kind="L40S")) == "NVIDIA L40S"


@pytest.fixture
def h200_emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorServer]:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    plant = ServingPlant.from_profile(load_profile("h200-sxm-llama3-8b"))
    server = EmulatorServer(EmulatedNode(plant, gpus=2), "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.close()


def test_the_governor_sees_the_profiles_gpu_and_takes_its_hint(
    h200_emulator: EmulatorServer,
) -> None:
    """A node governing the emulator (backend ``emulated``, ``mpc-online`` with no prior
    configured) reads the profile's GPU name, derives the H200 family hint from it, and
    keys its GPUs by the emulator's UUIDs."""
    url = h200_emulator.url
    config = parse_config(
        {
            "daemon": {"backend": "emulated", "emulator": url, "metrics_address": ""},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0, 1],
                    "ttft_slo_s": 1.0,
                    "tpot_slo_s": 0.05,
                    "engine": {"kind": "vllm", "url": f"{url}/metrics", "timeout_s": 0.5},
                    "controller": {"kind": "mpc-online"},
                }
            ],
        }
    )
    assembled = domains_from_config(config)
    try:
        node = h200_emulator.node
        assert assembled.header["domains"][0]["gpu_names"] == [node.gpu_name] * 2
        assert node.gpu_name == "NVIDIA H200 SXM 141GB HBM3e"
        assert [gpu_uuid(b) for b in assembled.backends] == list(node.gpu_uuids)
        controller = unwrap(assembled.domains[0].controller)
        assert isinstance(controller, OnlineMPCController)
        assert controller.auto_hints is not None
        assert controller.auto_hints.gpu == node.gpu_name
        prior = controller.auto_hints.prior_for("meta-llama/Llama-3.1-8B-Instruct")
        assert prior is not None and "H200" in prior.source, prior
    finally:
        assembled.close()


def test_the_backend_reads_the_identity_the_node_serves() -> None:
    server = EmulatorServer(EmulatedNode(make_plant(), gpus=2), "127.0.0.1", 0)
    server.start()
    try:
        backend = EmulatedBackend(1, emulator=server.url)
        assert backend.name == "NVIDIA test GPU"
        assert backend.uuid == emulated_gpu_uuid(make_profile(), 1)
        backend.close()
    finally:
        server.close()


def _restart(
    server: EmulatorServer, backend: EmulatedBackend, profile: Any, gpus: int = 1
) -> EmulatorServer:
    """``server`` stopped and another emulator started on its port (``gpugov emulate``
    restarted under a running daemon), serving a node of ``profile`` with ``gpus``."""
    port = int(server.url.rsplit(":", 1)[1])
    server.close()
    # A process's exit closes its connections; an in-process server's close leaves its
    # handler threads' keep-alive sockets open, so cut the backend's as the exit would
    # (its next request fails on the dead connection, as on a restarted emulator).
    if backend._connection is not None and backend._connection.sock is not None:
        backend._connection.sock.shutdown(socket.SHUT_RDWR)
    again = EmulatorServer(EmulatedNode(make_plant(profile), gpus=gpus), "127.0.0.1", port)
    again.start()
    return again


def test_an_emulator_restarted_with_other_gpus_is_a_replaced_driver_not_the_same_gpu() -> None:
    """An emulator restarted on the same port with another profile serves other GPUs (other
    UUIDs, clocks): the open backend refuses them as NVML's stale handles after a driver
    reload (a driver-gone code, the daemon's exit 4), never reading or locking the new
    GPU as the old one; its reset still answers. One restarted with the same GPUs goes on."""
    server = EmulatorServer(EmulatedNode(make_plant(), gpus=1), "127.0.0.1", 0)
    server.start()
    backend = EmulatedBackend(0, emulator=server.url)
    try:
        backend.sample()
        server = _restart(server, backend, make_profile())
        assert backend.sample().sm_clock_mhz is not None  # the same GPU: goes on
        server = _restart(server, backend, make_profile(gpu="test GPU, other fit"))
        for call in (backend.sample, lambda: backend.lock_clocks(900, 900)):
            with pytest.raises(GpuUnavailable) as raised:
                call()
            assert raised.value.code in DRIVER_GONE_CODES
            assert "another GPU" in str(raised.value), str(raised.value)
        server.node.lock_clocks(0, 900, 900)  # someone else's lock on the new GPU
        backend.reset_clocks()  # nothing of gpugov's to reset: the old GPU took its lock
        assert server.node.gpu_state[0].locked is not None  # the new GPU was not touched
    finally:
        backend.close()
        server.close()


def test_an_emulator_restarted_with_fewer_gpus_is_a_replaced_driver_for_the_missing_one() -> None:
    """GPU 1 of an emulator restarted with one GPU: refused with a driver-gone code (exit
    4), not "Invalid Argument" at each write (exit 1, with a reset-clocks command the
    emulator refuses: no GPU 1); its reset has nothing to do."""
    server = EmulatorServer(EmulatedNode(make_plant(), gpus=2), "127.0.0.1", 0)
    server.start()
    backend = EmulatedBackend(1, emulator=server.url)
    try:
        backend.lock_clocks(900, 900)
        server = _restart(server, backend, make_profile(), gpus=1)
        with pytest.raises(GpuUnavailable) as raised:
            backend.lock_clocks(900, 900)
        assert raised.value.code in DRIVER_GONE_CODES
        assert "has no GPU 1 now" in str(raised.value), str(raised.value)
        backend.reset_clocks()
    finally:
        backend.close()
        server.close()


def test_the_identity_is_asked_again_only_after_the_emulator_dropped_a_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection the backend closed itself (its own timeout) is reopened with no extra
    request, which would share the call's deadline and could time out every call after
    one; one the emulator dropped is reopened with the identity asked first, once."""
    server = EmulatorServer(EmulatedNode(make_plant(), gpus=1), "127.0.0.1", 0)
    server.start()
    asked: list[int] = []
    gpu_info = server.node.gpu_info
    monkeypatch.setattr(server.node, "gpu_info", lambda gpu: asked.append(gpu) or gpu_info(gpu))
    backend = EmulatedBackend(0, emulator=server.url)
    try:
        assert asked == [0]  # the open
        assert backend._connection is not None
        backend._connection.close()  # as after a timeout of its own
        backend.sample()
        backend.sample()
        assert asked == [0]
        assert backend._connection is not None and backend._connection.sock is not None
        backend._connection.sock.shutdown(socket.SHUT_RDWR)  # as the emulator's exit
        backend.sample()
        backend.sample()
        assert asked == [0, 0]
    finally:
        backend.close()
        server.close()


@pytest.mark.parametrize(
    "stated",
    [{"gpu": " ", "gpu_kind": "L40S"}, {"gpu": "H100  SXM5 80GB"}, {"gpu": "NVIDIA L4 24GB"}],
)
def test_a_simulated_node_names_its_gpus_as_the_emulated_node_does(
    stated: dict[str, str],
) -> None:
    """One name for a profile's GPU: what ``mpc-online``'s GPU-family hint reads in
    ``simulate`` (its context) and ``run --simulate`` (the simulated GPU) is the emulated
    GPU's NVML name (a profile stating only its ``gpu_kind`` gave the emulated node a hint
    and the simulated runs none, so their controllers started from other priors)."""
    from gpugov.daemon.controller_spec import parse_controller_spec
    from gpugov.daemon.decide import ControllerContext
    from gpugov.daemon.loop import VirtualClock
    from gpugov.daemon.service import simulated_run
    from gpugov.plant import Request

    profile = make_profile(**stated)
    plant = ServingPlant.from_profile(profile)
    workload = (Request(0, 0.0, 100, 10),)
    name = emulated_gpu_name(profile)
    context = ControllerContext.for_plant(plant, workload, period_s=1.0)
    assert context.gpu_names == (name,)
    run = simulated_run(workload, plant, parse_controller_spec("max"), VirtualClock())
    try:
        assert [backend.name for backend in run.domain.observer.gpus.backends] == [name]
    finally:
        run.finish()


def test_the_emulated_engine_serves_the_profiles_model_as_the_simulated_one_labels_it() -> None:
    """``gpugov emulate``'s engine names the profile's model (``/v1/models``, every
    ``model_name`` label) as the simulated engine of ``simulate`` and ``run --simulate``
    labels it, so ``mpc-online``'s model-size hint is the same on both: it served
    'gpugov-emulated', which states no size, and a node against the emulator started from
    another prior than the study it is compared with. ``--served-model-name`` still names
    another."""
    import json
    import urllib.request

    from study_support import start_emulator_process

    from gpugov.plant.profile_files import resolve_profile_path
    from gpugov.plant.simulator import PlantSimulation

    name = "h100-sxm-llama3-8b"
    plant = ServingPlant.from_profile(load_profile(name))
    labelled = PlantSimulation((), plant).observe().model_name
    assert labelled
    process, url = start_emulator_process(resolve_profile_path(name))
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as answer:
            served = json.loads(answer.read())["data"][0]["id"]
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            page = answer.read().decode()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert served == labelled
    assert f'model_name="{labelled}"' in page
