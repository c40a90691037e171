"""Persistence of the online MPC's model and ``gpugov model show|export``."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synthetic import make_plant, poisson_requests

from gpugov.cli import main
from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.identification import OnlineModel
from gpugov.daemon import stored_model, stored_slo_window
from gpugov.daemon.deadline import WRITE_DEADLINE_S
from gpugov.daemon.files import resolve_state_dir
from gpugov.daemon.model_store import PersistentOnlineModel, set_aside
from gpugov.daemon.stored_model import StoredModelError, model_path, read_stored
from gpugov.plant import chunked_prefill_scheduler, load_profile, simulate
from gpugov.plant.types import Request, ServingObservation

GPUS = ("GPU-aaaa", "GPU-bbbb")


def _controller() -> OnlineMPCController:
    return OnlineMPCController(mean_prompt_tokens=1100.0, mean_output_tokens=110.0, warmup_s=10.0)


class Named:
    """Adds the engine's model_name label to every observation (what the observer does)."""

    def __init__(self, inner: PersistentOnlineModel, name: str) -> None:
        self.inner, self.name = inner, name

    def __call__(self, observation):  # type: ignore[no-untyped-def]
        return self.inner(replace(observation, model_name=self.name))


def _learn(
    directory: Path,
    gpus: tuple[str, ...] = GPUS,
    name: str = "llama",
    gpu_names: tuple[str, ...] = (),
    write_deadline_s: float = WRITE_DEADLINE_S,
) -> PersistentOnlineModel:
    wrapper = PersistentOnlineModel(
        _controller(),
        directory,
        "llm",
        gpus,
        gpu_names=gpu_names,
        write_deadline_s=write_deadline_s,
    )
    simulate(
        poisson_requests(60.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, name), 0
    )
    wrapper.close()
    return wrapper


def test_model_survives_a_restart(tmp_path: Path) -> None:
    first = _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = read_stored(path)
    assert payload["key"] == {"gpu_uuids": list(GPUS), "model_name": "llama"}
    assert not list(tmp_path.glob(".*tmp*"))  # atomic write left nothing behind
    learned = first.inner.model
    assert learned is not None and learned.warmed_up
    second = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    workload = poisson_requests(5.0, seed=9)
    simulate(workload, make_plant(), chunked_prefill_scheduler, Named(second, "llama"), 0)
    assert second.restored
    restored = second.inner.model
    assert restored is not None and restored.warmed_up
    assert restored.samples >= learned.samples  # it kept learning from where it stopped


class PrefillPool:
    """A disaggregated prefill pool's view: each request served to its first token, the
    role on every observation (what the observer sets from the config or the labels)."""

    def __init__(self, inner: PersistentOnlineModel) -> None:
        self.inner = inner

    def __call__(self, observation):  # type: ignore[no-untyped-def]
        return self.inner(replace(observation, role="prefill", model_name="llama"))


def _prompts_only(count: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0, count))
    return [Request(i, float(t), int(rng.integers(500, 4000)), 1) for i, t in enumerate(times)]


def test_a_model_whose_weights_only_decode_part_is_below_zero_survives_a_restart(
    tmp_path: Path,
) -> None:
    """A decode pool whose batch and context grow together cannot split weight reads from
    context reads, and can learn a weights-only iteration below zero (seen: -0.0097 s at
    one request with no context) while predicting its own batches right. The running
    controller clamps that part at zero; the store refused every save of it, and the
    running model went back to the last good file."""
    learned = _learn(tmp_path).inner.model
    assert learned is not None
    top = learned.clocks_mhz[-1] * learned.realized_ratio[-1]
    before = learned.decode_iteration_s(top, 64.0, 1024.0)[0]
    # Move the top clock's weight reads to the batch's, the weights-only iteration to
    # -0.0097 s, the reference batch's iteration kept (the prediction is linear in the
    # blocks: one unit of each, measured, gives the shifts).
    knots = learned.knots_mhz.size
    weights, batch = slice(knots, 2 * knots), slice(2 * knots, 3 * knots)

    def iteration(requests: float, context: float) -> float:
        return learned.decode_iteration_s(top, requests, context)[0]

    alone = iteration(1.0, 0.0)
    learned.time.mean[weights] += 1.0
    per_weight = iteration(1.0, 0.0) - alone
    learned.time.mean[weights] -= 1.0
    learned.time.mean[batch] += 1.0
    per_batch = iteration(64.0, 1024.0) - before
    learned.time.mean[batch] -= 1.0
    shift = (alone + 0.0097) / per_weight
    learned.time.mean[weights] -= shift
    learned.time.mean[batch] += shift * per_weight / per_batch
    assert learned.decode_iteration_s(top, 1.0, 0.0)[0] < 0.0
    assert learned.decode_iteration_s(top, 64.0, 1024.0)[0] == pytest.approx(before)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["model"]["time"]["mean"] = learned.time.mean.tolist()
    path.write_text(json.dumps(payload))
    second = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(5.0, seed=9),
        make_plant(),
        chunked_prefill_scheduler,
        Named(second, "llama"),
        0,
    )
    assert second.restored
    assert not [message for message in second.messages if "refused" in message]
    second.close()
    assert "not saved" not in " ".join(second.messages)
    # A zeroed decode model is still refused.
    learned.time.mean[knots:] = 0.0
    with pytest.raises(ValueError, match="decode iteration latency"):
        learned.check_latencies("decode")


def test_a_prefill_pools_model_is_saved_and_survives_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prefill pool decodes nothing, so its model learns no decode latency: every save
    was refused as predicting a decode iteration of 0 s, and each refusal sent the
    running model back to the last good file (it never warmed up on a node)."""

    def controller() -> OnlineMPCController:
        return OnlineMPCController(mean_prompt_tokens=2000.0, mean_output_tokens=1.0, warmup_s=10.0)

    first = PersistentOnlineModel(controller(), tmp_path, "prefill", GPUS)
    with caplog.at_level(logging.WARNING):
        simulate(
            _prompts_only(120, 0), make_plant(), chunked_prefill_scheduler, PrefillPool(first), 0
        )
        first.close()
    assert "not saved" not in caplog.text
    learned = first.inner.model
    assert learned is not None and learned.warmed_up and learned.samples > 50
    second = PersistentOnlineModel(controller(), tmp_path, "prefill", GPUS)
    simulate(_prompts_only(5, 1), make_plant(), chunked_prefill_scheduler, PrefillPool(second), 0)
    assert second.restored
    restored = second.inner.model
    assert restored is not None and restored.warmed_up and restored.samples >= learned.samples
    # A zeroed model is still refused for a prefill pool: its prefill latency is checked.
    restored.time.mean[:] = 0.0
    with pytest.raises(ValueError, match="prefill latency"):
        restored.check_latencies("prefill")
    # The file says the role it was learned in, and `gpugov model show` reads it by it.
    path = model_path(tmp_path, "prefill")
    assert read_stored(path)["role"] == "prefill"
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    payload = json.loads(path.read_text())
    path.write_text(json.dumps({**payload, "role": "router"}))
    assert main(["model", "show", "--state-dir", str(tmp_path)]) != 0
    assert "role must be one of colocated, prefill, decode" in capsys.readouterr().err


def test_a_model_learned_in_another_role_is_kept_aside_not_called_corrupt(
    tmp_path: Path,
) -> None:
    """A prefill pool's model (it learns no decode latency) found by the domain serving
    colocated (or decode) after a restart: it was refused as predicting a decode iteration
    of 0 s and renamed corrupt, so the pool never had it back. It is kept aside as another
    role's, and put back when the domain is a prefill pool again."""

    def controller() -> OnlineMPCController:
        return OnlineMPCController(mean_prompt_tokens=2000.0, mean_output_tokens=1.0, warmup_s=10.0)

    first = PersistentOnlineModel(controller(), tmp_path, "llm", GPUS)
    simulate(_prompts_only(120, 0), make_plant(), chunked_prefill_scheduler, PrefillPool(first), 0)
    first.close()
    learned = first.inner.model
    assert learned is not None and learned.warmed_up
    colocated = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    colocated(_idle(0.0, name="llama"))
    assert not colocated.restored
    (said,) = [m for m in colocated.messages if "pool" in m]
    assert "learned in a prefill pool, this domain is colocated" in said
    assert "not applied; kept as online-model-llm.json.other-" in said
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))
    simulate(
        poisson_requests(30.0),
        make_plant(),
        chunked_prefill_scheduler,
        Named(colocated, "llama"),
        0,
    )
    colocated.close()
    assert read_stored(model_path(tmp_path, "llm"))["role"] == "colocated"
    # A prefill pool again: its model is put back, the colocated one kept in its place.
    back = PersistentOnlineModel(controller(), tmp_path, "llm", GPUS)
    back(_idle(0.0, name="llama", role="prefill"))
    assert back.restored, back.messages
    assert any("put back the model kept as" in m for m in back.messages), back.messages
    model = back.inner.model
    assert model is not None and model.warmed_up and model.samples == learned.samples
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert read_stored(kept)["role"] == "colocated"
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))


def test_the_same_gpus_listed_in_another_order_keep_the_model(tmp_path: Path) -> None:
    """A domain's GPUs named in another order (indices that changed order across a reboot,
    a config rewritten with UUIDs) are the same domain: its model is restored, not kept
    aside as another node's and learned anew."""
    _learn(tmp_path, gpus=("GPU-bbbb", "GPU-aaaa"))
    second = PersistentOnlineModel(_controller(), tmp_path, "llm", ("GPU-aaaa", "GPU-bbbb"))
    workload = poisson_requests(5.0, seed=9)
    simulate(workload, make_plant(), chunked_prefill_scheduler, Named(second, "llama"), 0)
    assert second.restored, second.messages
    assert not list(tmp_path.glob("online-model-llm.json.other-*"))


@pytest.mark.parametrize(
    ("gpus", "name"),
    [(("GPU-aaaa", "GPU-cccc"), "llama"), (GPUS, "mistral")],
    ids=["gpu-swapped", "other-model"],
)
def test_model_is_not_applied_but_kept_when_the_key_changes(tmp_path: Path, gpus, name) -> None:  # type: ignore[no-untyped-def]
    _learn(tmp_path)
    stored = model_path(tmp_path, "llm").read_bytes()
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", gpus)
    simulate(
        poisson_requests(5.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, name), 0
    )
    assert not wrapper.restored
    assert any("not applied; kept as online-model-llm.json.other-" in m for m in wrapper.messages)
    assert wrapper.inner.model is not None and not wrapper.inner.model.warmed_up
    wrapper.close()
    assert read_stored(model_path(tmp_path, "llm"))["key"]["model_name"] == name
    # The other node's model is kept whole, not overwritten by the new one's saves.
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert kept.read_bytes() == stored


@pytest.mark.parametrize(
    "content",
    [
        '{"format": "gpugov-online-model", "version": 1, "key": {"gpu_u',
        "\x00\x01garbage",
        '{"format": "gpugov-online-model", "version": 1, "key": {"gpu_uuids": ["GPU-aaaa", '
        '"GPU-bbbb"], "model_name": "llama"}, "model": {"version": 1, "clocks_mhz": [1, 2]}}',
    ],
    ids=["truncated", "binary", "wrong-clocks"],
)
def test_corrupt_state_is_set_aside_and_learning_starts_fresh(tmp_path: Path, content: str) -> None:
    path = model_path(tmp_path, "llm")
    path.write_text(content)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(15.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, "llama"), 0
    )
    assert not wrapper.restored
    refused = [m for m in wrapper.messages if "refused" in m]
    assert len(refused) == 1 and "\n" not in refused[0] and str(path) in refused[0]
    assert len(list(tmp_path.glob("online-model-llm.json.corrupt-*"))) == 1
    wrapper.close()
    assert read_stored(path)["key"]["model_name"] == "llama"  # a fresh, valid file


def test_unreadable_state_is_left_as_it_is_and_never_saved_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state file the daemon's user cannot read (root wrote it 0600, an I/O error) is not
    its content's fault: it is neither renamed corrupt nor replaced by the model learned
    anew, so making it readable and restarting restores it."""
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    stored = path.read_bytes()
    real_open = os.open

    def refuse(file, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(file) == path and not flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(15.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, "llama"), 0
    )
    wrapper.close()
    assert not wrapper.restored
    (line,) = [m for m in wrapper.messages if "Permission denied" in m]
    assert str(path) in line and "left as it is" in line and "\n" not in line
    assert wrapper.inner.model is not None and wrapper.inner.model.samples > 0  # it learned
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))
    assert path.read_bytes() == stored  # never saved over
    monkeypatch.undo()
    again = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(5.0), make_plant(), chunked_prefill_scheduler, Named(again, "llama"), 0
    )
    assert again.restored  # readable again: restored


def test_a_state_file_readable_again_mid_run_is_restored_and_saving_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One I/O error (or a permission fixed while the daemon runs) does not turn saving
    off for the whole run: each save period reads the file again, and once it can be
    read it is restored, as at a start, and saved from then on."""
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    real_open = os.open
    blocked = [True]

    def refuse(file, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if blocked[0] and Path(file) == path and not flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS, save_every_s=5.0)
    named = Named(wrapper, "llama")

    def unblocking(observation: ServingObservation) -> float:
        if observation.time_s >= 20.0:
            blocked[0] = False  # the operator fixed the permissions
        return named(observation)

    stored_at = path.stat().st_mtime_ns
    simulate(poisson_requests(40.0, seed=5), make_plant(), chunked_prefill_scheduler, unblocking, 0)
    wrapper.close()
    refused = [m for m in wrapper.messages if "Permission denied" in m]
    assert len(refused) == 1  # one line, not one a save period
    assert any("can be read again" in m for m in wrapper.messages)
    assert wrapper.restored
    assert path.stat().st_mtime_ns != stored_at  # saved again after the restore
    assert read_stored(path)["key"]["model_name"] == "llama"
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))


def test_state_directory_defaults_to_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/gpugov:/other")
    assert resolve_state_dir(None) == Path("/var/lib/gpugov")
    assert resolve_state_dir("/x") == Path("/x")
    monkeypatch.delenv("STATE_DIRECTORY")
    assert resolve_state_dir(None) is None


def test_model_show_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _learn(tmp_path)
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "domain llm" in shown and "GPU-aaaa" in shown and "+-" in shown
    out = tmp_path / "export"
    assert main(["model", "export", "--state-dir", str(tmp_path), "--out", str(out)]) == 0
    profile = load_profile(out / "online-llm.json")
    assert profile.profile_status == "online-identified" and not profile.is_measured
    assert profile.ttft_slo_s == make_plant().profile.ttft_slo_s
    # The exported table is the stored model's mean prediction.
    from gpugov.daemon.model_cli import load_model

    _, model = load_model(model_path(tmp_path, "llm"))
    top = profile.maximum_clock_mhz
    assert profile.rate("prefill", top) == pytest.approx(
        1.0 / model.prefill_s_per_token(top)[0], rel=1e-4
    )
    assert profile.power("decode", top) == pytest.approx(
        model.phase_power_w(top, "decode")[0], rel=1e-4
    )


H100 = "NVIDIA H100 80GB HBM3"


def _export(
    directory: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], list[str]]:
    """``gpugov model export`` of ``directory``'s model: the manifest, and stderr's lines."""
    out = directory / "export"
    assert main(["model", "export", "--state-dir", str(directory), "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    return json.loads((out / "online-llm.json").read_text()), err.splitlines() if err else []


def test_the_gpu_names_are_kept_with_the_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The domain's NVML names are saved beside the key, in the order of its UUIDs (the
    key sorts them), and a restart restores the model and saves them again."""
    _learn(tmp_path, gpus=("GPU-bbbb", "GPU-aaaa"), gpu_names=("NVIDIA H200", H100))
    payload = read_stored(model_path(tmp_path, "llm"))
    assert payload["key"]["gpu_uuids"] == ["GPU-aaaa", "GPU-bbbb"]
    assert payload["gpu_names"] == [H100, "NVIDIA H200"]
    assert stored_model.stored_gpu_names(payload) == (H100, "NVIDIA H200")
    with caplog.at_level("INFO", logger="gpugov"):
        again = _learn(tmp_path, gpus=GPUS, gpu_names=(H100, "NVIDIA H200"))
    assert again.restored
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert read_stored(model_path(tmp_path, "llm"))["gpu_names"] == [H100, "NVIDIA H200"]


def test_the_daemon_gives_the_store_its_gpus_names(tmp_path: Path) -> None:
    """``build_controller`` hands the context's NVML names (``ControllerContext.gpu_names``)
    to the store with the UUIDs."""
    from gpugov.controllers.contract import layers
    from gpugov.daemon.controller_config import OnlineMPCControllerConfig
    from gpugov.daemon.decide import ControllerContext, build_controller

    context = ControllerContext(
        period_s=1.0,
        supported_clocks_mhz=(900.0, 1980.0),
        gpu_names=(H100, H100),
        gpu_uuids=GPUS,
        gpu_count=2,
        state_dir=tmp_path,
        domain="llm",
    )
    chain = build_controller(OnlineMPCControllerConfig(kind="mpc-online"), context)
    stores = [layer for layer in layers(chain) if isinstance(layer, PersistentOnlineModel)]
    assert len(stores) == 1 and stores[0].gpu_names == (H100, H100)


def test_the_exported_manifest_names_the_board_the_gpus_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manifest's ``gpu`` is the board's NVML name the domain's GPUs share (the UUIDs
    stay as ``gpu_uuids``): the profile loader's label, ``gpugov emulate``'s GPU name and a
    ``gpu = "auto"`` prior's family are the board's; ``model show`` names it too."""
    from gpugov.controllers.online.prior import gpu_family
    from gpugov.daemon.decide import ControllerContext
    from gpugov.plant import ServingPlant
    from gpugov.plant.zoo import GPUS as BOARDS
    from gpugov.study.emulate.node import emulated_gpu_name

    _learn(tmp_path, gpu_names=(H100, H100))
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr()
    assert f"GPUs GPU-aaaa, GPU-bbbb ({H100}); model llama" in shown.out and not shown.err
    manifest, err = _export(tmp_path, capsys)
    assert manifest["gpu"] == H100 and manifest["gpu_uuids"] == list(GPUS)
    assert not err
    profile = load_profile(tmp_path / "export" / "online-llm.json")
    assert profile.source_label == f"{H100}, llama (online-identified)"
    assert emulated_gpu_name(profile) == H100
    context = ControllerContext.for_plant(
        ServingPlant.from_profile(profile), poisson_requests(5.0), period_s=1.0
    )
    assert context.gpu_name == H100 and gpu_family(H100) == BOARDS["h100"]


def test_a_model_stored_before_the_gpu_names_loads_and_exports_no_board(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A state file without ``gpu_names`` (saved before they were kept) is restored,
    shown and exported as before: no ``gpu`` (emulate's GPU is unnamed, never "NVIDIA 0"),
    one note line saying why; the next save writes the node's names."""
    from gpugov.study.emulate.node import UNNAMED_GPU, emulated_gpu_name

    _learn(tmp_path, gpus=("0",), gpu_names=(H100,))
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    del payload["gpu_names"]
    path.write_text(json.dumps(payload))
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr()
    assert "GPUs 0; model llama" in shown.out and not shown.err
    manifest, err = _export(tmp_path, capsys)
    assert "gpu" not in manifest and manifest["gpu_uuids"] == ["0"]
    assert len(err) == 1 and "keeps no GPU name" in err[0] and "no 'gpu'" in err[0]
    profile = load_profile(tmp_path / "export" / "online-llm.json")
    assert emulated_gpu_name(profile) == UNNAMED_GPU
    assert profile.source_label.startswith("unknown GPU, llama")
    with caplog.at_level("INFO", logger="gpugov"):
        again = _learn(tmp_path, gpus=("0",), gpu_names=(H100,))
    assert again.restored
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert read_stored(path)["gpu_names"] == [H100]


def test_gpus_of_different_names_export_no_board(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A domain whose GPUs are not one board kind names no board: ``gpu`` is left out,
    one note line names the names; ``model show`` names each GPU's."""
    _learn(tmp_path, gpu_names=(H100, "NVIDIA H200"))
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert f"GPUs GPU-aaaa ({H100}), GPU-bbbb (NVIDIA H200); model llama" in shown
    manifest, err = _export(tmp_path, capsys)
    assert "gpu" not in manifest and manifest["gpu_uuids"] == list(GPUS)
    assert len(err) == 1 and "different names" in err[0] and "NVIDIA H200" in err[0]


@pytest.mark.parametrize(
    ("names", "field"),
    [
        (["NVIDIA " + "H" * 200, H100], "gpu_names[0]"),
        ([H100, "NVIDIA H100\n\x1b[2J"], "gpu_names[1]"),
        ([H100, 7], "gpu_names[1]"),
        ([H100], "gpu_names must be a list of 2 names"),
        ("NVIDIA H100", "gpu_names must be a list of 2 names"),
    ],
    ids=["over-long", "control-characters", "not-text", "too-few", "not-a-list"],
)
def test_damaged_stored_gpu_names_are_one_line_and_the_model_stays(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    names: object,
    field: str,
) -> None:
    """A damaged ``gpu_names`` is one line naming the field, as a damaged ``slo_budget``
    is: the model is restored (and its next save writes the node's names), shown without
    the names, and exported without ``gpu``."""
    _learn(tmp_path, gpu_names=(H100, H100))
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["gpu_names"] = names
    path.write_text(json.dumps(payload))
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr()
    assert "GPUs GPU-aaaa, GPU-bbbb; model llama" in shown.out and "HHHH" not in shown.out
    err = shown.err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "shown without" in err[0]
    assert "\x1b" not in shown.err
    manifest, err = _export(tmp_path, capsys)
    assert "gpu" not in manifest and manifest["gpu_uuids"] == list(GPUS)
    assert len(err) == 1 and field in err[0] and "no 'gpu'" in err[0]
    with caplog.at_level("INFO", logger="gpugov"):
        # Its save waited for whatever the machine's load (no hung-disk line beside it).
        again = _learn(tmp_path, gpu_names=(H100, H100), write_deadline_s=60.0)
    assert again.restored
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and field in warnings[0] and "restored" in warnings[0]
    assert read_stored(path)["gpu_names"] == [H100, H100]


def test_names_the_store_would_call_damaged_are_not_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon never writes names its loader calls damaged (one too long, or not one
    per GPU): one line, and the model is saved without them."""
    with caplog.at_level("INFO", logger="gpugov"):
        _learn(tmp_path, gpu_names=(H100, "H" * 96))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "gpu_names[1]" in warnings[0]
    assert "gpu_names" not in read_stored(model_path(tmp_path, "llm"))


@pytest.mark.parametrize(
    ("fit", "period", "expected"),
    [
        ((40.0, 0.05, 120.0), 0.5, (40.0, 0.05, 60.0, "learned online")),
        ((40.0, 0.05, 120.0), None, (40.0, 0.05, 30.0, "without its control period")),
        ((70.0, 0.2, 120.0), 0.25, (30.0, None, 30.0, "not below the 87 C limit")),
        (None, 0.25, (30.0, None, 30.0, "not learned yet")),
        # A hand-edited period: an integer too large for a float, one whose product with
        # the windows overflows, a negative one, a string: the neutral 30 s, said why.
        ((40.0, 0.05, 120.0), 10**400, (40.0, 0.05, 30.0, "stored control period")),
        ((40.0, 0.05, 120.0), 1e307, (40.0, 0.05, 30.0, "stored control period")),
        ((40.0, 0.05, 120.0), -0.5, (40.0, 0.05, 30.0, "stored control period -0.5")),
        ((40.0, 0.05, 120.0), "0.5", (40.0, 0.05, 30.0, "stored control period '0.5'")),
    ],
    ids=[
        "learned",
        "old-file-no-period",
        "idles-over-the-limit",
        "not-learned",
        "period-huge-int",
        "period-overflows",
        "period-negative",
        "period-string",
    ],
)
def test_the_exported_thermal_section_is_one_the_profile_loader_takes(
    fit: tuple[float, float, float] | None,
    period: object,
    expected: tuple[float, float | None, float, str],
) -> None:
    """The learned RC fit, its time constant from control windows to seconds; a fit that
    idles the domain at or over the limit (the loader refuses such a profile) gives way to
    the neutral RC, the source saying why."""
    from gpugov.daemon.model_cli import _thermal_section

    model = OnlineModel([345.0, 1980.0], 700.0)
    model.thermal_parameters = lambda: fit  # type: ignore[method-assign]
    thermal = _thermal_section(model, 87.0, 100.0, period)
    ambient, resistance, constant, source = expected
    assert thermal["ambient_temperature_c"] == ambient
    if resistance is not None:
        assert thermal["thermal_resistance_c_per_w"] == resistance
    assert thermal["thermal_time_constant_s"] == pytest.approx(constant)
    assert source in thermal["source"]
    steady = thermal["ambient_temperature_c"] + thermal["thermal_resistance_c_per_w"] * 100.0
    assert steady < 87.0


def test_model_export_of_a_hand_edited_control_period_exports_the_neutral_time_constant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state file whose control_period_s was edited to an integer too large for a float
    crashed ``gpugov model export`` with an OverflowError traceback; now the profile is
    written with the neutral 30 s time constant and the source saying why."""
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["control_period_s"] = 10**400
    path.write_text(json.dumps(payload))
    monkeypatch.setattr(OnlineModel, "thermal_parameters", lambda self: (40.0, 0.05, 120.0))
    out = tmp_path / "export"
    assert main(["model", "export", "--state-dir", str(tmp_path), "--out", str(out)]) == 0
    thermal = load_profile(out / "online-llm.json").manifest["thermal"]
    assert thermal["thermal_time_constant_s"] == 30.0
    assert "stored control period" in thermal["source"]


def test_the_stored_model_carries_its_control_period(tmp_path: Path) -> None:
    _learn(tmp_path)
    assert read_stored(model_path(tmp_path, "llm"))["control_period_s"] == pytest.approx(
        _controller().control_period_s
    )


@pytest.mark.parametrize("period", [0.25, 2.0])
def test_a_model_restored_at_another_control_period_keeps_its_thermal_time_constant(
    tmp_path: Path, period: float
) -> None:
    """The thermal fit is per control window: restored under another ``period_s`` (1 s to
    the recommended 0.25 s), its time constant in seconds was the stored one times 0.25."""
    first = _learn(tmp_path)
    assert first.inner.model is not None and first.inner.control_period_s == 1.0
    fitted = first.inner.model.thermal_parameters()
    assert fitted is not None
    ambient, resistance, windows = fitted
    controller = OnlineMPCController(
        mean_prompt_tokens=1100.0, mean_output_tokens=110.0, warmup_s=10.0, control_period_s=period
    )
    second = PersistentOnlineModel(controller, tmp_path, "llm", GPUS)
    workload = poisson_requests(2.0 * period, seed=9)
    simulate(
        workload,
        make_plant(),
        chunked_prefill_scheduler,
        Named(second, "llama"),
        0,
        control_period_s=period,
    )
    assert second.restored
    assert second.inner.model is not None
    restored = second.inner.model.thermal_parameters()
    assert restored is not None
    assert restored[2] * period == pytest.approx(windows * 1.0, rel=0.05)
    assert restored[:2] == pytest.approx((ambient, resistance), rel=0.05)
    assert any("thermal fit (per control window) is converted" in line for line in second.messages)


def test_model_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(tmp_path) in err
    model_path(tmp_path, "llm").write_text("{")
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not valid JSON" in err
    # One bad file among good ones: the good ones are shown, the bad one is one line.
    _learn(tmp_path / "two")
    (tmp_path / "two" / "online-model-aaa.json").write_text("{")
    assert main(["model", "show", "--state-dir", str(tmp_path / "two")]) == 2
    captured = capsys.readouterr()
    assert "domain llm" in captured.out
    err = captured.err.strip()
    assert err.count("\n") == 0 and "online-model-aaa.json" in err and "not valid JSON" in err
    config = tmp_path / "gpugov.toml"
    config.write_text('[[domains]]\nname = "llm"\ngpus = [0]\n[domains.controller]\nkind = "max"\n')
    assert main(["model", "show", "--config", str(config)]) == 2
    assert "no domain runs the mpc-online controller" in capsys.readouterr().err


def test_model_files_no_domain_could_have_written_are_not_shown_or_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand-made ``online-model-a<newline>b.json`` (or ``online-model-.json``) beside the
    daemon's was shown as domain ``a\\nb`` and exported as ``online-a<newline>b.json``,
    its "wrote" line cut in two: only a domain's name is a model file."""
    state = tmp_path / "state"
    _learn(state)
    text = model_path(state, "llm").read_text()
    (state / "online-model-a\nb.json").write_text(text)
    (state / "online-model-.json").write_text(text)
    assert main(["model", "show", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "domain llm" in out and "domain a" not in out and "domain :" not in out
    assert main(["model", "export", "--state-dir", str(state), "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "online-llm.csv",
        "online-llm.json",
    ]
    assert all(line.startswith("wrote ") for line in capsys.readouterr().out.splitlines())


def test_model_show_finds_the_model_where_the_daemon_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --config, the model is read from the controller's state_dir, else [daemon]'s
    (where the daemon writes it), else $STATE_DIRECTORY."""
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    _learn(tmp_path / "daemon-state")
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "daemon-state"}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n[domains.controller]\nkind = "mpc-online"\n'
    )
    assert main(["model", "show", "--config", str(config)]) == 0
    assert "domain llm" in capsys.readouterr().out
    config.write_text(
        '[[domains]]\nname = "llm"\ngpus = [0]\n[domains.controller]\nkind = "mpc-online"\n'
    )
    assert main(["model", "show", "--config", str(config)]) == 2
    assert "[daemon]" in capsys.readouterr().err


def test_model_command_imports_no_study_code() -> None:
    code = (
        "import sys, gpugov.daemon.model_cli; "
        "heavy = ('sklearn', 'matplotlib', 'gpugov.study'); "
        "bad = [m for m in sys.modules if m.startswith(heavy)]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_controller_spec_and_config_kind() -> None:
    from gpugov.daemon.config import parse_config
    from gpugov.daemon.controller_config import OnlineMPCControllerConfig
    from gpugov.daemon.controller_spec import parse_controller_spec
    from gpugov.daemon.errors import ConfigError

    assert parse_controller_spec("mpc-online") == OnlineMPCControllerConfig(kind="mpc-online")
    hinted = parse_controller_spec("mpc-online:h100-sxm-llama3-8b")
    assert isinstance(hinted, OnlineMPCControllerConfig)
    assert hinted.prior_profile == "h100-sxm-llama3-8b"
    config = parse_config(
        {
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "controller": {"kind": "mpc-online", "state_dir": "/var/lib/x"},
                }
            ]
        }
    )
    assert config.domains[0].controller.state_dir == Path("/var/lib/x")  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as error:
        parse_config(
            {
                "domains": [
                    {
                        "name": "llm",
                        "gpus": [0],
                        "controller": {"kind": "mpc-online", "uncertainty_z": -1},
                    }
                ]
            }
        )
    assert str(error.value).count("\n") == 0
    assert "domains[0].controller.uncertainty_z" in str(error.value)


def test_simulated_daemon_saves_the_model_in_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    code = main(
        [
            "run",
            "--simulate",
            "--virtual",
            "--controller",
            "mpc-online",
            "--duration",
            "40",
            "--metrics-address",  # the default port is one other tests (in parallel) use
            "none",
        ]
    )
    assert code == 0, capsys.readouterr().err
    payload = read_stored(model_path(tmp_path, "sim"))
    assert payload["model"]["warmed_up"] is True
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    assert "domain sim" in capsys.readouterr().out


# ------------------------------------------------------------------ the lifecycle
def _idle(time_s: float = 0.0, name: str | None = None, **fields: object) -> ServingObservation:
    """An observation like the warm-up's: an idle node, no model name yet by default."""
    base: dict[str, object] = {
        "time_s": time_s,
        "step_index": int(time_s),
        "arrived_requests": 0,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 0,
        "generated_decode_tokens": 0.0,
        "temperature_c": 40.0,
        "supported_clocks_mhz": tuple(float(c) for c in make_plant().profile.clock_mhz),
        "model_name": name,
    }
    base.update(fields)
    return ServingObservation(**base)  # type: ignore[arg-type]


def _stored_windows(directory: Path) -> int:
    model = read_stored(model_path(directory, "llm"))["model"]
    return sum(int(model[fit]["samples"]) for fit in ("time", "power", "thermal"))


def test_a_deep_copy_never_touches_the_stored_model(tmp_path: Path) -> None:
    """The warm-up's probe: a copy fed an idle observation with no model name."""
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    before = path.read_bytes()
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    probe = copy.deepcopy(wrapper)
    probe(_idle())
    probe.close()
    assert path.read_bytes() == before
    assert probe.messages == [] and not probe.restored
    # The original is untouched by its copy: it restores at its own first observation.
    assert wrapper.key is None and wrapper.inner.model is None
    wrapper(_idle(name="llama"))
    assert wrapper.restored


def test_warm_up_keeps_the_stored_model(tmp_path: Path) -> None:
    from gpugov.daemon.decide import warm_up

    _learn(tmp_path)
    windows = _stored_windows(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    warm_up(wrapper, tuple(float(c) for c in make_plant().profile.clock_mhz))
    assert _stored_windows(tmp_path) == windows
    assert not any("not applied" in m for m in wrapper.messages)


def test_an_unknown_model_name_matches_the_stored_model(tmp_path: Path) -> None:
    """Before the engine's first scrape the name is None: the stored model is restored,
    and the real name, when it comes, keeps it."""
    _learn(tmp_path)
    windows = _stored_windows(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    wrapper(_idle(0.0))
    assert wrapper.restored and wrapper.key is not None
    assert wrapper.key.model_name == "llama"  # the stored name, adopted
    model = wrapper.inner.model
    assert model is not None and model.warmed_up
    wrapper(_idle(1.0, name="llama"))
    assert wrapper.inner.model is model and wrapper.inner.resets == 0
    assert not any("not applied" in m or "anew" in m for m in wrapper.messages)
    wrapper.close()
    assert _stored_windows(tmp_path) >= windows


def test_a_real_model_name_change_relearns(tmp_path: Path) -> None:
    _learn(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    wrapper(_idle(0.0))  # name unknown: the stored llama model
    assert wrapper.restored
    wrapper(_idle(0.5, name="llama"))  # the engine names it: no longer only adopted
    wrapper(_idle(1.0, name="mistral"))
    wrapper(_idle(1.25, name="mistral"))
    assert wrapper.restored and wrapper.inner.resets == 0  # not settled yet
    wrapper(_idle(1.5, name="mistral"))  # the third in a row: a new model
    assert not wrapper.restored and wrapper.inner.resets == 1
    assert wrapper.key is not None and wrapper.key.model_name == "mistral"
    model = wrapper.inner.model
    assert model is not None and not model.warmed_up
    assert any("now serves 'mistral'" in m for m in wrapper.messages)


def _learned_samples(wrapper: PersistentOnlineModel) -> int:
    model = wrapper.inner.model
    assert model is not None
    state = model.state_dict()
    return sum(int(state[fit]["samples"]) for fit in ("time", "power", "thermal"))


def test_a_new_name_not_yet_settled_teaches_the_held_model_nothing(tmp_path: Path) -> None:
    """The windows under another name before it settles may be the new model's: the
    held model does not learn from them, so they are neither used nor stored as its."""
    _learn(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    learned: dict[str, list[int]] = {"llama": [], "mistral": []}

    def labelled(observation: ServingObservation) -> float:
        # Two ticks of another name in every ten: never settled (three in a row are).
        name = "mistral" if int(observation.time_s) % 10 in (4, 5) else "llama"
        before = _learned_samples(wrapper) if wrapper.inner.model is not None else 0
        clock = wrapper(replace(observation, model_name=name))
        learned[name].append(_learned_samples(wrapper) - before)
        return clock

    simulate(poisson_requests(20.0, seed=3), make_plant(), chunked_prefill_scheduler, labelled, 0)
    assert wrapper.inner.resets == 0
    assert learned["mistral"] and not any(learned["mistral"])
    assert sum(learned["llama"]) > 0
    wrapper.close()


def test_a_flapping_model_name_keeps_the_model(tmp_path: Path) -> None:
    """A label that changes at every scrape (two engines answering in turn) relearned and
    logged "learning anew" at every tick: the model never learned."""
    _learn(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    wrapper(_idle(0.0, name="llama"))
    assert wrapper.restored
    for tick in range(1, 21):
        wrapper(_idle(0.25 * tick, name="mistral" if tick % 2 else "llama"))
    assert wrapper.restored and wrapper.inner.resets == 0
    assert not any("now serves" in m for m in wrapper.messages)
    wrapper.close()


def test_an_empty_model_never_replaces_a_stored_one(tmp_path: Path) -> None:
    _learn(tmp_path, gpus=("GPU-old",))
    path = model_path(tmp_path, "llm")
    before = path.read_bytes()
    # Another GPU: the stored model does not fit, but nothing was learned yet either.
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    wrapper(_idle(0.0, name="llama"))
    assert any("not applied" in m for m in wrapper.messages)
    assert not wrapper.save()
    wrapper.close()
    assert not path.exists()  # nothing learned, nothing written
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert kept.read_bytes() == before
    # Once it has learned a window, the new model is saved under the new key.
    simulate(
        poisson_requests(5.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, "llama"), 0
    )
    wrapper.close()
    assert read_stored(path)["key"]["gpu_uuids"] == list(GPUS)


def test_a_nan_temperature_at_start_still_saves(tmp_path: Path) -> None:
    """The observer reports NaN until its first temperature read."""
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)

    def observed(observation: ServingObservation) -> float:
        if observation.time_s < 2.0:
            observation = replace(observation, temperature_c=math.nan)
        return wrapper(replace(observation, model_name="llama"))

    simulate(poisson_requests(20.0), make_plant(), chunked_prefill_scheduler, observed, 0)
    wrapper.close()
    assert not any("cannot save" in m for m in wrapper.messages)
    payload = read_stored(model_path(tmp_path, "llm"))
    assert payload["model"]["thermal"]["samples"] > 0
    assert payload["status"]["skipped_nonfinite_windows"] >= 1


def test_a_dry_run_keys_the_model_by_the_gpu_uuids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fake_pynvml import FakeNvml

    from gpugov.controllers.contract import layers as controller_layers
    from gpugov.daemon.backend import DryRunBackend
    from gpugov.daemon.config import parse_config
    from gpugov.daemon.service import domains_from_config

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    fake = FakeNvml(2)
    config = parse_config(
        {
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0, 1],
                    "engine": {"kind": "vllm", "url": "http://127.0.0.1:9/metrics"},
                    "controller": {"kind": "mpc-online", "state_dir": str(tmp_path)},
                }
            ]
        }
    )
    keys = []
    for dry_run in (False, True):
        assembled = domains_from_config(config, dry_run=dry_run, nvml=fake)
        try:
            backends = assembled.domains[0].observer.gpus.backends
            assert all(isinstance(b, DryRunBackend) for b in backends) == dry_run
            layers = controller_layers(assembled.domains[0].controller)
            wrapper = next(x for x in layers if isinstance(x, PersistentOnlineModel))
            keys.append(wrapper.gpu_uuids)
        finally:
            assembled.close()
    uuids = tuple(gpu.uuid for gpu in fake.gpus)
    assert keys == [uuids, uuids]
    dry = DryRunBackend(backends[0].inner)  # type: ignore[attr-defined]
    assert dry.uuid == fake.gpus[0].uuid and dry.name == fake.gpus[0].name


def test_a_restored_warmed_up_model_skips_the_warm_up(tmp_path: Path) -> None:
    """A restarted node saves from its first decision: the restored model is warmed up,
    so no decision is spent at the top clock for a warm-up."""
    _learn(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    top = float(make_plant().profile.clock_mhz[-1])
    reasons: list[str] = []
    decisions: list[float] = []

    def recording(observation: ServingObservation) -> float:
        decision = Named(wrapper, "llama")(observation)
        reasons.append(wrapper.inner.last_reason)
        decisions.append(float(decision))
        return decision

    simulate(poisson_requests(10.0, seed=5), make_plant(), chunked_prefill_scheduler, recording, 0)
    assert wrapper.restored
    assert not {"warm-up", "warm-up-descent"} & set(reasons)
    assert decisions[0] < top
    # A fresh node (nothing stored) spends its first decisions on the warm-up.
    fresh = PersistentOnlineModel(_controller(), tmp_path / "other", "llm", GPUS)
    simulate(poisson_requests(3.0, seed=5), make_plant(), chunked_prefill_scheduler, fresh, 0)
    assert fresh.inner.last_reason in ("warm-up", "warm-up-descent")
    assert fresh.inner.model is not None and not fresh.inner.model.warmed_up


def test_a_node_restarted_under_load_saves_from_its_first_decision(tmp_path: Path) -> None:
    """A daemon restarted under load reads the engine's counters since the engine started
    (a lifetime of requests at its first observation): those are no arrivals of the
    restarted controller's first period, which would have held the top clock."""
    _learn(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    top = float(make_plant().profile.clock_mhz[-1])
    decisions: list[float] = []

    def lifetime(observation: ServingObservation) -> float:
        shifted = replace(
            observation,
            model_name="llama",
            arrived_requests=observation.arrived_requests + 50_000,
            completed_requests=observation.completed_requests + 50_000,
        )
        decisions.append(float(wrapper(shifted)))
        return decisions[-1]

    simulate(poisson_requests(10.0, seed=5), make_plant(), chunked_prefill_scheduler, lifetime, 0)
    assert wrapper.restored
    assert decisions[0] < top


@pytest.mark.parametrize(
    "damage",
    [
        "prior-nan",
        "samples-inf",
        "visits-huge",
        "warmup-inf",
        # Finite, but no GPU: a latency of 1e308 s gave a profile of 0 tokens/s, and the
        # restored model stopped the daemon at every start.
        "time-huge",
        "covariance-negative",
        "covariance-asymmetric",
        "visits-half",
        "warmed-up-text",
        # Finite and shaped right, but latencies of 0 or below s, or a covariance that is
        # none: restored, they drove the clock to the floor.
        "time-negated",
        "time-zero",
        "covariance-indefinite",
        "covariance-indefinite-huge",
        "covariance-huge",
    ],
)
def test_a_stored_model_with_impossible_numbers_is_set_aside(tmp_path: Path, damage: str) -> None:
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    model = payload["model"]
    if damage == "prior-nan":
        model["time"]["prior_covariance"][0][0] = float("nan")
    elif damage == "samples-inf":
        model["time"]["samples"] = float("inf")
    elif damage == "visits-huge":
        model["visits"] = [1e300] * len(model["visits"])
    elif damage == "time-huge":
        model["time"]["mean"] = [1e308] * len(model["time"]["mean"])
    elif damage == "covariance-negative":
        size = len(model["time"]["covariance"])
        model["time"]["covariance"] = [[-1.0] * size for _ in range(size)]
    elif damage == "covariance-asymmetric":
        model["time"]["covariance"][0][1] += 1.0
    elif damage == "visits-half":
        model["visits"] = [0.5] * len(model["visits"])
    elif damage == "warmed-up-text":
        model["warmed_up"] = "yes"
    elif damage == "time-negated":
        model["time"]["mean"] = [-value for value in model["time"]["mean"]]
    elif damage == "time-zero":
        model["time"]["mean"] = [0.0] * len(model["time"]["mean"])
    elif damage.startswith("covariance-indefinite"):
        value = 1e200 if damage.endswith("huge") else 1e6
        model["time"]["covariance"][0][1] = model["time"]["covariance"][1][0] = value
    elif damage == "covariance-huge":
        covariance = model["time"]["covariance"]
        model["time"]["covariance"] = [[value * 1e300 for value in row] for row in covariance]
    else:
        model["warmup_count"] = float("inf")
    path.write_text(json.dumps(payload))
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(15.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, "llama"), 0
    )
    assert not wrapper.restored
    assert len([message for message in wrapper.messages if "refused" in message]) == 1
    assert len(list(tmp_path.glob("online-model-llm.json.corrupt-*"))) == 1
    wrapper.close()


def _damage(model: dict, field: str) -> None:  # type: ignore[type-arg]
    """One field of a stored model made impossible (as an edited or damaged file has it)."""
    if field == "power.mean":
        model["power"]["mean"] = [-100.0] * len(model["power"]["mean"])
    elif field == "time.forgetting":
        model["time"]["forgetting"] = 5.0
    elif field == "knots_mhz":
        model["knots_mhz"] = [1.0]
    elif field == "clocks_mhz":
        model["clocks_mhz"] = "x"
    elif field == "time.covariance":
        model["time"]["covariance"][0] = [1.0, [2.0]]
    elif field == "visits":
        model["visits"][0] = "many"
    elif field == "time.mean":
        model["time"]["mean"][0] = 1e308
    elif field == "power_limit_w":
        model["power_limit_w"] = 1e308
    else:
        model["power"]["noise_variance"] = -1.0


PHYSICAL_DAMAGE = [
    # Each was restored (negative powers: `model show` printed -100 W and the export a
    # profile clamped to 1 W), or refused in numpy's words naming no field.
    ("power.mean", "model.power.mean: the idle power at the top clock"),
    ("time.forgetting", "model.time.forgetting must lie in (0, 1]"),
    ("knots_mhz", "model.knots_mhz must be two or more positive clocks"),
    ("clocks_mhz", "model.clocks_mhz must be two or more positive clocks"),
    ("time.covariance", "model.time.covariance[0] must be a list of"),
    ("visits", "model.visits[0] must be a finite number"),
    ("power.noise_variance", "model.power.noise_variance must be a positive number"),
    # model show printed numpy's overflow RuntimeWarning and export wrote a profile of it.
    ("time.mean", "model.time.mean[0] must be a finite number within ±1e+12, got 1e+308"),
    # model show printed numpy's RuntimeWarning twice, and export wrote a profile its own
    # loader refuses (power_limit_w at most 1e+06 W).
    ("power_limit_w", "model.power_limit_w must be a positive number of at most 1e+06 W"),
]


@pytest.mark.parametrize(("field", "named"), PHYSICAL_DAMAGE, ids=[f for f, _ in PHYSICAL_DAMAGE])
def test_a_stored_model_outside_its_physical_ranges_is_refused_naming_the_field(
    tmp_path: Path, field: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    _damage(payload["model"], field)
    path.write_text(json.dumps(payload))
    with pytest.raises(StoredModelError, match=re.escape(f"{path}: {named}")):
        read_stored(path)
    out = tmp_path / "export"
    for argv in (
        ["model", "show", "--state-dir", str(tmp_path)],
        ["model", "export", "--state-dir", str(tmp_path), "--out", str(out)],
    ):
        assert main(argv) == 2
        captured = capsys.readouterr()
        err = [line for line in captured.err.splitlines() if line.strip()]
        assert len(err) == 1 and named in err[0] and not captured.out
    assert not out.exists()
    # The daemon: one line naming the field, the file set aside, learning anew.
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(15.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, "llama"), 0
    )
    assert not wrapper.restored
    (refused,) = [message for message in wrapper.messages if "refused" in message]
    assert named in refused and "\n" not in refused
    assert len(list(tmp_path.glob("online-model-llm.json.corrupt-*"))) == 1
    wrapper.close()


def test_settings_that_cannot_use_a_valid_stored_model_do_not_set_it_aside(
    tmp_path: Path,
) -> None:
    # uncertainty_z = 1e308 (now refused by the config, still taken by the class) made a
    # valid stored model give no profile, and the file was renamed .corrupt-: a setting
    # destroyed the learned state.
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    stored = path.read_bytes()
    controller = OnlineMPCController(
        mean_prompt_tokens=1100.0, mean_output_tokens=110.0, warmup_s=10.0, uncertainty_z=1e308
    )
    wrapper = PersistentOnlineModel(controller, tmp_path, "llm", GPUS)
    wrapper(_idle(name="llama"))
    assert not wrapper.restored
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert kept.read_bytes() == stored
    (said,) = [message for message in wrapper.messages if "not applied" in message]
    assert "uncertainty_z = 1e+308" in said and "settings, not the file" in said


def test_a_failing_save_is_tried_once_a_save_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read-only or full disk: one warning a save period, not one a tick.
    import gpugov.daemon.model_store as store

    def refuse(path: Path, payload: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(store, "write_json_atomic", refuse)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS, save_every_s=10.0)
    simulate(
        poisson_requests(60.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, "llama"), 0
    )
    failures = [m for m in wrapper.messages if "cannot save" in m]
    assert 1 <= len(failures) <= 7 and wrapper.save_failed
    assert "tried again in 10 s" in failures[0]
    # The save at shutdown is the last try: it says so, and promises no retry.
    wrapper.close()
    assert "not saved: the model learned since the last save is lost" in wrapper.messages[-1]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("mean_prompt_tokens", "1024", "mean_prompt_tokens must be a positive number"),
        ("mean_output_tokens", 10**400, "mean_output_tokens must be a positive number"),
        ("mean_prompt_tokens", -5.0, "mean_prompt_tokens must be a positive number"),
        # Export said "no usable profile ... decode_tokens_per_s nan" of it.
        (
            "mean_prompt_tokens",
            1e300,
            "mean_prompt_tokens must be a positive number of at most 1e+09 tokens, got 1e+300",
        ),
        ("slos", "x", "'slos' is not an object"),
        ("key", {"gpu_uuids": [1, 2]}, "key.gpu_uuids"),
    ],
    ids=["string", "huge", "negative", "1e300", "slos", "uuids"],
)
def test_stored_fields_of_the_wrong_kind_are_one_error(
    tmp_path: Path, field: str, value: object, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # model show and export raised TypeError, OverflowError or AttributeError on them.
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload[field] = value
    path.write_text(json.dumps(payload))
    with pytest.raises(StoredModelError, match=re.escape(named)):
        read_stored(path)
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named.split()[0] in err[0]


def test_export_refuses_stored_clocks_no_gpu_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["model"]["clocks_mhz"][0] = -5.0
    path.write_text(json.dumps(payload))
    out = tmp_path / "export"
    assert main(["model", "export", "--state-dir", str(tmp_path), "--out", str(out)]) == 2
    assert "clocks_mhz must be two or more positive clocks" in capsys.readouterr().err


def test_a_refused_export_leaves_no_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _learn(tmp_path)
    out = tmp_path / "export"
    # No such domain: refused in one line before anything is written.
    code = main(
        ["model", "export", "--state-dir", str(tmp_path), "--domain", "nope", "--out", str(out)]
    )
    assert code == 2
    assert "--domain nope" in capsys.readouterr().err
    assert not out.exists()
    # A damaged model: refused, and the directory is not made for it either.
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["model"]["clocks_mhz"][0] = -5.0
    path.write_text(json.dumps(payload))
    assert main(["model", "export", "--state-dir", str(tmp_path), "--out", str(out)]) == 2
    assert not out.exists()


def test_an_export_refused_for_want_of_slos_leaves_no_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A domain with no ttft_slo_s or tpot_slo_s saves its model with null SLOs; exporting
    # it without --ttft-slo and --tpot-slo was refused after --out had been made, empty.
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["slos"] = {"ttft_slo_s": None, "tpot_slo_s": None, "thermal_limit_c": None}
    path.write_text(json.dumps(payload))
    out = tmp_path / "export"
    export = ["model", "export", "--state-dir", str(tmp_path), "--out", str(out)]
    for slos in ([], ["--ttft-slo", "1"]):
        assert main([*export, *slos]) == 2
        assert "pass --ttft-slo and --tpot-slo" in capsys.readouterr().err
        assert not out.exists()
    assert main([*export, "--ttft-slo", "1", "--tpot-slo", "0.05"]) == 0
    assert (out / "online-llm.json").is_file()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ttft_slo_s", "x"),
        ("tpot_slo_s", [1]),
        ("ttft_slo_s", -1.0),
        ("thermal_limit_c", 0),
        ("tpot_slo_s", True),
        # Over ten years: exported as a profile the profile loader then refused.
        ("ttft_slo_s", 1e300),
        ("tpot_slo_s", 3.2e8),
    ],
)
def test_a_damaged_slos_block_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object
) -> None:
    # Each was a traceback from model export (float() of text, a list, a negative SLO).
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["slos"][field] = value
    path.write_text(json.dumps(payload))
    out = tmp_path / "export"
    for argv in (
        ["model", "export", "--state-dir", str(tmp_path), "--out", str(out)],
        ["model", "show", "--state-dir", str(tmp_path)],
    ):
        assert main(argv) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and f"slos.{field} must be a positive number" in err[0]
    assert not out.exists()


def test_stored_clocks_no_gpu_runs_at_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A clock of 1e308 MHz passed, with numpy overflow warnings and a table of infinities.
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["model"]["clocks_mhz"][-1] = 1e308
    path.write_text(json.dumps(payload))
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "at most 100000 MHz" in err[0]


def test_two_files_set_aside_in_one_second_are_both_kept(tmp_path: Path) -> None:
    """A served model going A, B, A within a second sets two models aside with one stamp:
    the second gets a count, and neither overwrites the other."""
    kept = []
    for content in ("model A", "model B", "model C"):
        path = tmp_path / "online-model-llm.json"
        path.write_text(content)
        kept.append(set_aside(path, now=lambda: 1.8e9, tag="other"))
    assert [p.read_text() for p in kept] == ["model A", "model B", "model C"]
    assert kept[0].name == "online-model-llm.json.other-20270115T080000Z"
    assert [p.name[-2:] for p in kept[1:]] == ["-2", "-3"]


@pytest.mark.parametrize(("scale", "restored"), [(1e-6, True), (-1e-6, True), (-1e3, False)])
def test_a_prefill_latency_within_its_noise_of_zero_is_restored(
    tmp_path: Path, scale: float, restored: bool
) -> None:
    """A run whose prefill part is poorly identified can learn a prefill latency of -1e-7 s
    a token at the top clock with a far wider spread; the running controller decides with
    it, so a restart restores it (it was set aside as corrupt, and the node learned
    anew). A prefill latency below zero by far more than its spread is still refused."""
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    mean = payload["model"]["time"]["mean"]
    knots = len(mean) // 4  # the prefill block comes first
    spread = math.sqrt(payload["model"]["time"]["covariance"][knots - 1][knots - 1])
    mean[:knots] = [scale * spread] * knots
    path.write_text(json.dumps(payload))
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(15.0), make_plant(), chunked_prefill_scheduler, Named(wrapper, "llama"), 0
    )
    assert wrapper.restored is restored
    refused = [message for message in wrapper.messages if "refused" in message]
    assert len(refused) == (0 if restored else 1)
    wrapper.close()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda path: None, "no such directory"),
        (lambda path: path.write_text("x"), "not a directory"),
        (lambda path: path.symlink_to(path), "cannot read it"),
    ],
    ids=["missing", "a-file", "a-link-loop"],
)
def test_a_state_dir_that_is_no_directory_is_named_not_read_as_empty(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    make: object,
    reason: str,
) -> None:
    """A mistyped --state-dir (or $STATE_DIRECTORY) is one line saying what is wrong with
    it, not "no learned model here", which sent the user looking for a model."""
    state = tmp_path / "state"
    make(state)  # type: ignore[operator]
    assert main(["model", "show", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--state-dir {state}: {reason}" in err
    assert "no learned model" not in err
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    assert main(["model", "export", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"$STATE_DIRECTORY={state}: {reason}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["daemon", "controller"])
def test_a_config_state_dir_that_is_a_file_is_named_by_model_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """A config's state_dir naming a file (run warns and keeps no model there) said
    "...: no learned model yet", as if one might come."""
    occupied = tmp_path / "occupied"
    occupied.write_text("x")
    controller = 'kind = "mpc-online"\n'
    daemon = ""
    if where == "daemon":
        daemon = f'[daemon]\nstate_dir = "{occupied}"\n'
    else:
        controller += f'state_dir = "{occupied}"\n'
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'{daemon}[[domains]]\nname = "llm"\ngpus = [0]\n[domains.controller]\n{controller}'
    )
    assert main(["model", "show", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no learned model yet" not in err
    assert f"domain 'llm': state_dir {occupied} is not a directory (a file is there)" in err


def test_a_model_saved_before_any_latency_was_learned_survives_restarts(tmp_path: Path) -> None:
    """A node stopped before any busy window (no prior, no hint) saves a model with power
    and thermal samples and no latency sample; its prior predicts no latency at all. It
    was refused at every start as impossible and renamed ``.corrupt-``, one more file a
    restart; it is restored, keeping what it measured, and learns latency afresh."""
    for restart in range(3):
        wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
        for tick in range(40):
            idle = _idle(
                float(tick) * 0.25,
                name="llama",
                power_w=120.0 + restart,
                energy_j=30.0 * tick,
                requested_clock_mhz=1980.0,
                realized_clock_mhz=1980.0,
                gpu_utilization=0.0,
                temperature_c=40.0 + 0.1 * tick,
            )
            wrapper(idle)
        wrapper.close()
        assert not [message for message in wrapper.messages if "refused" in message]
        assert wrapper.restored == (restart > 0)
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))
    stored = read_stored(model_path(tmp_path, "llm"))
    assert stored["model"]["time"]["samples"] == 0
    assert stored["model"]["power"]["samples"] > 0


def test_a_model_with_no_latency_learned_is_not_exported_and_shows_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its latency part is only the prior (no hint: zero latency). ``model export`` wrote
    it as a profile of 1e7 prompt tokens/s on every clock (exit 0; a simulation on it ran
    on no energy), and ``model show`` printed 1e12 tok/s +- 5e21 and 0.00 ms."""
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    for tick in range(40):
        wrapper(
            _idle(
                float(tick) * 0.25,
                name="llama",
                power_w=120.0,
                energy_j=30.0 * tick,
                requested_clock_mhz=1980.0,
                realized_clock_mhz=1980.0,
                gpu_utilization=0.0,
                temperature_c=40.0 + 0.1 * tick,
            )
        )
    wrapper.close()
    assert read_stored(model_path(tmp_path, "llm"))["model"]["time"]["samples"] == 0
    out = tmp_path / "export"
    argv = ["model", "export", "--state-dir", str(tmp_path), "--out", str(out)]
    assert main([*argv, "--ttft-slo", "1", "--tpot-slo", "0.05"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "domain llm: the model has learned no latency yet" in err[0]
    assert not out.exists()
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "no latency learned yet" in shown and "e+" not in shown
    rows = [line.split() for line in shown.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    assert rows and all(row[2:4] == ["-", "-"] for row in rows)


FILE_DAMAGE = [
    # Each was restored (and 1e308 written back on the next save), or named confusingly.
    ("thermal", lambda p: p["model"]["thermal"].update(mean=[1e308] * 3), "model.thermal.mean: a"),
    ("power_limit", lambda p: p["model"].update(power_limit_w=-600), "model.power_limit_w"),
    ("status", lambda p: p.update(status="garbage"), "status must be an object"),
    ("version", lambda p: p.update(version="1"), "model version must be an integer, got '1'"),
    ("inner_version", lambda p: p["model"].update(version=1.5), "model.version must be an integer"),
]


@pytest.mark.parametrize(
    ("damage", "named"), [d[1:] for d in FILE_DAMAGE], ids=[d[0] for d in FILE_DAMAGE]
)
def test_a_state_file_with_absurd_values_is_refused_naming_them(
    tmp_path: Path,
    damage,
    named: str,  # type: ignore[no-untyped-def]
) -> None:
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    damage(payload)
    path.write_text(json.dumps(payload))
    with pytest.raises(StoredModelError, match=re.escape(f"{path}: {named}")):
        read_stored(path)


def test_a_model_its_loader_would_refuse_is_not_saved_and_goes_back_to_the_last_good(
    tmp_path: Path,
) -> None:
    """Defence in depth: whatever drove the learned model somewhere its loader refuses
    (a decode power of -7 W at the top clock was saved, and refused at the next start),
    the save keeps the last good file and the model goes back to it, in one line."""
    wrapper = _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    good = path.read_bytes()
    model = wrapper.inner.model
    assert model is not None
    k = model.knots_mhz.size
    mean = model.power.mean.copy()
    mean[3 * k - 1] = -7.1  # the decode power at the top clock
    model.power.mean = mean
    wrapper.persist = True
    assert wrapper.save() is False
    assert path.read_bytes() == good
    (line,) = [m for m in wrapper.messages if "not saved" in m]
    assert "decode power at the top clock" in line and "goes back to it" in line
    restored = wrapper.inner.model
    assert restored is not None and restored.power.mean[3 * k - 1] > 0.0
    assert wrapper.restored
    assert wrapper.save() is True
    read_stored(path)


def test_a_model_kept_aside_comes_back_when_its_key_does(tmp_path: Path) -> None:
    """The served model goes A, B, A: A's model is put back, not learned again; B's is
    kept aside in turn, and comes back the same way."""
    first = _learn(tmp_path, name="llama")
    llama = first.inner.model
    assert llama is not None and llama.warmed_up
    path = model_path(tmp_path, "llm")
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(60.0),
        make_plant(),
        chunked_prefill_scheduler,
        Named(wrapper, "mistral"),
        0,
    )
    assert not wrapper.restored
    wrapper.close()
    assert read_stored(path)["key"]["model_name"] == "mistral"
    mistral_samples = read_stored(path)["model"]["time"]["samples"]
    # Back to llama: its kept model is restored, mistral's kept aside.
    back = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    back(_idle(0.0, name="llama"))
    assert back.restored
    put_back = "put back the model kept as online-model-llm.json.other-"
    assert any(put_back in m for m in back.messages)
    model = back.inner.model
    assert model is not None and model.warmed_up and model.samples == llama.samples
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert read_stored(kept)["key"]["model_name"] == "mistral"
    # A name change during the run takes mistral's back as well.
    for tick in range(1, 6):
        back(_idle(0.25 * tick, name="mistral"))
    assert back.restored and back.key is not None and back.key.model_name == "mistral"
    assert back.inner.model is not None
    assert back.inner.model.time.samples == mistral_samples
    back.close()
    # Another GPU set has no kept model of its own: it learns anew.
    other = PersistentOnlineModel(_controller(), tmp_path, "llm", ("GPU-cccc",))
    other(_idle(0.0, name="llama"))
    assert not other.restored


class OtherClocks:
    """Another GPU kind behind the same UUIDs: every other supported clock (what a
    board swapped in place, or another driver's clock table, shows)."""

    def __init__(self, inner: PersistentOnlineModel, name: str) -> None:
        self.inner, self.name = inner, name

    def __call__(self, observation):  # type: ignore[no-untyped-def]
        clocks = observation.supported_clocks_mhz[::2]
        return self.inner(replace(observation, model_name=self.name, supported_clocks_mhz=clocks))


def test_a_model_learned_on_other_clocks_is_kept_as_another_nodes_and_comes_back(
    tmp_path: Path,
) -> None:
    """Same UUIDs, other supported clocks (another GPU kind): the stored model is not
    applied and kept aside as another node's (it was renamed corrupt, and never came
    back); when the clocks are the first kind's again, its model is put back."""
    first = _learn(tmp_path)
    learned = first.inner.model
    assert learned is not None and learned.warmed_up
    path = model_path(tmp_path, "llm")
    other = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(60.0),
        make_plant(),
        chunked_prefill_scheduler,
        OtherClocks(other, "llama"),
        0,
    )
    assert not other.restored
    (said,) = [m for m in other.messages if "other supported clocks" in m]
    assert "not applied; kept as online-model-llm.json.other-" in said and "\n" not in said
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))
    other.close()
    assert len(read_stored(path)["model"]["clocks_mhz"]) < len(learned.clocks_mhz)
    # Back on the first kind: its model is put back, the other kind's kept in turn.
    back = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    back(_idle(0.0, name="llama"))
    assert back.restored
    assert any("put back the model kept as" in m for m in back.messages), back.messages
    model = back.inner.model
    assert model is not None and model.warmed_up and model.samples == learned.samples
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert len(read_stored(kept)["model"]["clocks_mhz"]) < len(learned.clocks_mhz)
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))


def test_a_model_of_another_version_is_kept_for_its_gpugov_not_called_corrupt(
    tmp_path: Path,
) -> None:
    """A rollback finds the file a newer gpugov wrote (another model version): it was
    renamed corrupt, and the newer gpugov, upgraded again, never had its model back. It
    is kept aside whole as another node's, and this gpugov learns anew."""
    _learn(tmp_path).close()
    path = model_path(tmp_path, "llm")
    payload = json.loads(path.read_text())
    payload["version"] = payload["version"] + 1  # what a newer gpugov writes
    path.write_text(json.dumps(payload))
    older = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    older(_idle(0.0, name="llama"))
    assert not older.restored
    (said,) = [m for m in older.messages if "written by another gpugov" in m]
    assert "not applied; kept as online-model-llm.json.other-" in said and "\n" not in said
    assert not list(tmp_path.glob("online-model-llm.json.corrupt-*"))
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert json.loads(kept.read_text()) == payload  # whole, for the gpugov that reads it


class Continued:
    """Observations as a node's daemon sees them: ``time_s`` on the daemon's own clock
    (it starts again at a restart), the engine's SLO counters going on from
    ``counters`` (the engine was not restarted); the last observation is kept."""

    def __init__(
        self,
        inner: PersistentOnlineModel,
        time_s: float = 0.0,
        counters: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    ) -> None:
        self.inner, self.time_s, self.counters = inner, time_s, counters
        self.last: ServingObservation | None = None

    def __call__(self, observation: ServingObservation) -> float:
        base = self.counters
        self.last = replace(
            observation,
            model_name="llama",
            time_s=observation.time_s + self.time_s,
            ttft_within_slo_total=(observation.ttft_within_slo_total or 0.0) + base[0],
            ttft_count_total=(observation.ttft_count_total or 0.0) + base[1],
            tpot_within_slo_total=(observation.tpot_within_slo_total or 0.0) + base[2],
            tpot_count_total=(observation.tpot_count_total or 0.0) + base[3],
        )
        return float(self.inner(self.last))

    def counters_now(self) -> tuple[float, float, float, float]:
        """The engine's counters at the last observation."""
        last = self.last
        assert last is not None
        return (
            last.ttft_within_slo_total or 0.0,
            last.ttft_count_total or 0.0,
            last.tpot_within_slo_total or 0.0,
            last.tpot_count_total or 0.0,
        )


def _budgeted() -> OnlineMPCController:
    return OnlineMPCController(
        mean_prompt_tokens=1100.0,
        mean_output_tokens=110.0,
        warmup_s=10.0,
        slo_target=SLOTarget(attainment=0.99, window_s=600.0),
    )


def _learn_budgeted(directory: Path) -> Continued:
    """Two minutes of a budgeted ``mpc-online``, stopped (its final save)."""
    first = PersistentOnlineModel(_budgeted(), directory, "llm", GPUS)
    before = Continued(first)
    simulate(poisson_requests(120.0), make_plant(), chunked_prefill_scheduler, before, 0)
    first.close()
    return before


def _restart_budgeted(
    directory: Path, before: Continued, seconds: float, seed: int
) -> PersistentOnlineModel:
    """A budgeted ``mpc-online`` started again on ``directory`` and run ``seconds`` with
    the engine's counters going on from ``before``'s last observation."""
    wrapper = PersistentOnlineModel(_budgeted(), directory, "llm", GPUS)
    after = Continued(wrapper, counters=before.counters_now())
    simulate(
        poisson_requests(seconds, seed=seed), make_plant(), chunked_prefill_scheduler, after, 0
    )
    return wrapper


def test_a_restart_goes_on_with_the_slo_window_it_measured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The SLO budget's window (the engine's counters it has seen, its looseness) is
    stored with the model: a daemon restarted in the same boot, on a clock that starts
    again, judges the requests served before the restart too, and goes on at the
    looseness it had, instead of a window that forgets the misses already spent."""
    before = _learn_budgeted(tmp_path)
    budget = before.inner.inner.budget
    assert budget is not None and budget.last is not None
    stored = read_stored(model_path(tmp_path, "llm"))
    assert stored["slo_budget"]["snapshots"] and stored["clock"]["boot_unix_s"] > 0.0
    with caplog.at_level("INFO", logger="gpugov"):
        second = _restart_budgeted(tmp_path, before, 10.0, seed=3)
    assert second.restored
    assert any("SLO budget window restored" in r.getMessage() for r in caplog.records)
    restored = second.inner.budget
    assert restored is not None and restored.last is not None
    assert restored.last.requests > budget.last.requests  # both runs' requests


def test_a_restarted_node_whose_slo_counters_start_again_keeps_the_window_it_measured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a node the SLO counters are the daemon's own (its attainment estimator starts at
    zero with each run), not the engine's: the restored window's last snapshot read as
    counters gone back at the first window, and the window was dropped; it goes on."""
    before = _learn_budgeted(tmp_path)
    budget = before.inner.inner.budget
    assert budget is not None and budget.last is not None
    wrapper = PersistentOnlineModel(_budgeted(), tmp_path, "llm", GPUS)
    after = Continued(wrapper)  # the counters start again from zero
    with caplog.at_level("INFO", logger="gpugov"):
        simulate(poisson_requests(10.0, seed=3), make_plant(), chunked_prefill_scheduler, after, 0)
    assert wrapper.restored
    assert any("SLO budget window restored" in r.getMessage() for r in caplog.records)
    restored = wrapper.inner.budget
    assert restored is not None and restored.last is not None
    assert restored.last.requests > budget.last.requests  # both runs' requests


def test_a_served_model_change_keeps_the_slo_window_this_run_measured(tmp_path: Path) -> None:
    """The SLO window is the domain's, whatever model it serves: when the served model
    changes mid-run and the new name's model comes back from its file, the window stored
    with that model does not replace the one this run has measured (whose misses it
    would drop); only a start goes on from a stored window."""
    _learn_budgeted(tmp_path)  # llama's model and window, stored
    wrapper = PersistentOnlineModel(_budgeted(), tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(60.0, seed=5),
        make_plant(),
        chunked_prefill_scheduler,
        Named(wrapper, "mistral"),
        0,
    )
    budget = wrapper.inner.budget
    assert budget is not None and budget.last is not None
    live = budget.last.requests
    last = wrapper._last_observation
    assert last is not None and live > 0
    seen = len(wrapper.messages)
    for tick in range(1, 7):
        wrapper(replace(last, time_s=last.time_s + 0.25 * tick, model_name="llama"))
    assert wrapper.restored and wrapper.key is not None and wrapper.key.model_name == "llama"
    assert not any("SLO budget window restored" in m for m in wrapper.messages[seen:])
    assert wrapper.inner.budget is budget and budget.last is not None
    assert budget.last.requests >= live


def test_a_stored_slo_window_of_another_boot_or_damaged_keeps_the_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window stored before a reboot (the engine and its counters started again) is not
    applied, and a damaged one is one log line: the learned model is restored either
    way."""
    before = _learn_budgeted(tmp_path)
    path = model_path(tmp_path, "llm")
    booted = stored_slo_window.boot_unix_s() + 3600.0
    with monkeypatch.context() as patch:
        patch.setattr(stored_slo_window, "boot_unix_s", lambda: booted)
        with caplog.at_level("INFO", logger="gpugov"):
            rebooted = _restart_budgeted(tmp_path, before, 5.0, seed=3)
    assert rebooted.restored
    assert not any("SLO budget" in r.getMessage() for r in caplog.records)
    assert rebooted.inner.budget is not None and rebooted.inner.budget.looseness == 1.0
    payload = read_stored(path)
    payload["slo_budget"]["snapshots"] = [["x", 1, 1, 1, 1]]
    payload["clock"]["boot_unix_s"] = stored_slo_window.boot_unix_s()  # saved on this boot
    path.write_text(json.dumps(payload))
    caplog.clear()
    with caplog.at_level("INFO", logger="gpugov"):
        damaged = _restart_budgeted(tmp_path, before, 5.0, seed=4)
    assert damaged.restored
    lines = [r.getMessage() for r in caplog.records if "SLO budget" in r.getMessage()]
    assert len(lines) == 1 and "slo_budget.snapshots[0]" in lines[0]


def test_a_read_only_store_restores_and_writes_nothing(tmp_path: Path) -> None:
    """A dry run beside the node's daemon (the same state directory) restores the stored
    model but never saves over it, and leaves a file it cannot apply where it is: its
    saves replaced the daemon's model, and its set-asides moved the daemon's file."""
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    stored = path.read_bytes()
    dry = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS, read_only=True)
    workload = poisson_requests(20.0, seed=9)
    simulate(workload, make_plant(), chunked_prefill_scheduler, Named(dry, "llama"), 0)
    assert dry.restored and dry.save() is False
    dry.close()
    assert path.read_bytes() == stored
    # Another model served: not applied, and left in place (not kept aside).
    other = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS, read_only=True)
    simulate(workload, make_plant(), chunked_prefill_scheduler, Named(other, "mistral"), 0)
    other.close()
    assert not other.restored
    assert any("left as it is (a dry run writes nothing)" in m for m in other.messages)
    # A file it refuses: said in one line, left in place.
    path.write_text("\x00\x01garbage")
    refused = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS, read_only=True)
    simulate(workload, make_plant(), chunked_prefill_scheduler, Named(refused, "llama"), 0)
    refused.close()
    assert [m for m in refused.messages if "refused" in m and "left as it is" in m]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["online-model-llm.json"]
    assert path.read_bytes() == b"\x00\x01garbage"


def test_a_dry_run_builds_a_read_only_store(vllm_server: Any, tmp_path: Path) -> None:
    """``run --dry-run`` (``domains_from_config(dry_run=True)``) hands the controller's
    store ``read_only``; a run that locks clocks saves."""
    from fake_pynvml import FakeNvml

    from gpugov.controllers.contract import layers
    from gpugov.daemon.config import parse_config
    from gpugov.daemon.service import domains_from_config

    config = parse_config(
        {
            "daemon": {"period_s": 1.0, "state_dir": str(tmp_path)},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {"kind": "vllm", "url": vllm_server.url},
                    "controller": {"kind": "mpc-online"},
                }
            ],
        }
    )
    for dry_run in (True, False):
        assembled = domains_from_config(config, nvml=FakeNvml(1), dry_run=dry_run)
        try:
            chain = assembled.domains[0].controller
            (store,) = [x for x in layers(chain) if isinstance(x, PersistentOnlineModel)]
            assert store.read_only is dry_run
        finally:
            assembled.close()


def test_a_rollback_takes_back_the_model_its_version_kept(tmp_path: Path) -> None:
    """Upgrade, then roll back: the newer gpugov kept this version's model aside and
    saved its own; the rolled-back daemon keeps the newer file aside and puts its own
    version's model back at once (it learned anew, and its first save then made the
    kept model unreachable: the state file fitted the key from then on)."""
    first = _learn(tmp_path)
    learned = first.inner.model
    assert learned is not None and learned.warmed_up
    path = model_path(tmp_path, "llm")
    ours = path.read_bytes()
    # The newer gpugov: this version's model kept aside, its own saved.
    set_aside(path, tag="other")
    newer = json.loads(ours)
    newer["version"] = newer["version"] + 1
    path.write_text(json.dumps(newer))
    older = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    older(_idle(0.0, name="llama"))
    assert older.restored, older.messages
    assert any("written by another gpugov" in m for m in older.messages)
    assert any("put back the model kept as" in m for m in older.messages)
    model = older.inner.model
    assert model is not None and model.warmed_up and model.samples == learned.samples
    assert read_stored(path)["version"] == json.loads(ours)["version"]
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert json.loads(kept.read_text()) == newer  # whole, for the newer gpugov


def test_a_damaged_state_file_gives_way_to_the_model_kept_for_the_key(tmp_path: Path) -> None:
    """The state file is damaged (set aside as corrupt) while a model kept aside for
    exactly this key and these clocks exists: that one is put back and restored, not
    learned again."""
    first = _learn(tmp_path)
    learned = first.inner.model
    assert learned is not None
    path = model_path(tmp_path, "llm")
    set_aside(path, tag="other")
    path.write_text('{"format": "gpugov-online-model", "version": 1, "key": {"gpu_u')
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    wrapper(_idle(0.0, name="llama"))
    assert wrapper.restored, wrapper.messages
    assert len(list(tmp_path.glob("online-model-llm.json.corrupt-*"))) == 1
    model = wrapper.inner.model
    assert model is not None and model.samples == learned.samples


class OtherSlos(Continued):
    """A restarted node whose config now states tighter latency SLOs."""

    def __call__(self, observation: ServingObservation) -> float:
        tighter = replace(
            observation,
            ttft_slo_s=(observation.ttft_slo_s or 1.0) / 2.0,
            tpot_slo_s=(observation.tpot_slo_s or 0.1) / 2.0,
        )
        return super().__call__(tighter)


@pytest.mark.parametrize("change", ["slos", "target"])
def test_a_slo_window_measured_against_other_slos_is_not_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    """The stored window counted requests within the SLOs (and the looseness was earned
    against the target) of the run that saved it: a restart under tighter SLOs or a
    stricter target went on spending the budget the old terms left (a looseness above 1
    lowers the clock) on evidence that is not this run's. The model is restored, the
    window starts anew, and one line says why."""
    before = _learn_budgeted(tmp_path)
    stored = read_stored(model_path(tmp_path, "llm"))
    stored["slo_budget"]["looseness"] = 1.4  # spending: what a loose old SLO earned
    model_path(tmp_path, "llm").write_text(json.dumps(stored))
    controller = _budgeted()
    if change == "target":
        controller = OnlineMPCController(
            mean_prompt_tokens=1100.0,
            mean_output_tokens=110.0,
            warmup_s=10.0,
            slo_target=SLOTarget(attainment=0.999, window_s=600.0),
        )
    wrapper = PersistentOnlineModel(controller, tmp_path, "llm", GPUS)
    kind = OtherSlos if change == "slos" else Continued
    after = kind(wrapper, counters=before.counters_now())
    slos = stored["slos"]  # the observations carry the config's SLOs
    with caplog.at_level("INFO", logger="gpugov"):
        after(
            _idle(0.0, name="llama", ttft_slo_s=slos["ttft_slo_s"], tpot_slo_s=slos["tpot_slo_s"])
        )
    assert wrapper.restored
    messages = [r.getMessage() for r in caplog.records]
    assert not any("SLO budget window restored" in m for m in messages)
    (said,) = [m for m in messages if "SLO budget window not applied" in m]
    assert "\n" not in said
    assert wrapper.inner.budget is not None and wrapper.inner.budget.looseness == 1.0


def test_temporary_files_an_interrupted_save_left_are_removed_at_the_start(
    tmp_path: Path,
) -> None:
    """A run killed (or out of time at exit on a slow disk) between a save's temporary
    file and its rename left ``.online-model-<domain>.json.<8 hex>``, a whole model's
    size, that nothing ever removed: one more a kill. The next start removes its own
    domain's (one line) and leaves every other file; a read-only store removes none."""
    _learn(tmp_path)
    left = [
        tmp_path / ".online-model-llm.json.0a1b2c3d",
        tmp_path / ".online-model-llm.json.ffff0000",
    ]
    for path in left:
        path.write_text('{"format": "gpugov-online-model", "ver')  # cut short by the kill
    others = [
        tmp_path / ".online-model-other.json.0a1b2c3d",  # another domain's
        tmp_path / ".online-model-llm.json.notes",
        tmp_path / ".online-model-llm.json.0A1B2C3D",
    ]
    for path in others:
        path.write_text("x")
    dry = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS, read_only=True)
    dry(_idle(0.0, name="llama"))
    assert all(path.exists() for path in left)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    wrapper(_idle(0.0, name="llama"))
    assert wrapper.restored
    assert not any(path.exists() for path in left)
    assert all(path.exists() for path in others)
    (said,) = [m for m in wrapper.messages if "temporary file" in m]
    assert "removed 2 temporary file(s)" in said and "\n" not in said


def test_a_model_kept_for_the_key_comes_back_when_the_name_arrives_after_the_start(
    tmp_path: Path,
) -> None:
    """A node boots, its daemon before its engine: the first observations name no model,
    so no kept model could be picked, and when the engine's name came the key only
    adopted it; the model kept for exactly that key (here after a rollback set the
    state file aside) stayed aside, and the first save of the model learned anew made
    it unreachable. It is put back and restored once the name is known."""
    first = _learn(tmp_path)
    learned = first.inner.model
    assert learned is not None
    path = model_path(tmp_path, "llm")
    set_aside(path, tag="other")  # no state file; llama's model kept aside
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    for tick in range(4):
        wrapper(_idle(0.25 * tick))  # the engine still loading: no name
    assert not wrapper.restored
    for tick in range(4, 8):
        wrapper(_idle(0.25 * tick, name="llama"))
    assert wrapper.restored, wrapper.messages
    assert any("put back the model kept as" in m for m in wrapper.messages)
    model = wrapper.inner.model
    assert model is not None and model.samples == learned.samples
    wrapper.close()
    assert read_stored(path)["key"]["model_name"] == "llama"


def test_a_renamed_domain_takes_over_the_model_its_old_name_kept(tmp_path: Path) -> None:
    """The config renames domain ``llm`` to ``pool`` (same GPUs, same served model): the
    new name found no state file and learned anew, while ``online-model-llm.json`` sat
    unread. It is taken over, in one line; a domain of other GPUs takes nothing."""
    first = _learn(tmp_path)
    learned = first.inner.model
    assert learned is not None
    other = PersistentOnlineModel(_controller(), tmp_path, "other", ("GPU-cccc",))
    other(_idle(0.0, name="llama"))
    assert not other.restored and model_path(tmp_path, "llm").exists()
    renamed = PersistentOnlineModel(_controller(), tmp_path, "pool", GPUS)
    renamed(_idle(0.0, name="llama"))
    assert renamed.restored, renamed.messages
    (said,) = [m for m in renamed.messages if "took over" in m]
    assert "domain 'llm' (online-model-llm.json)" in said and "\n" not in said
    model = renamed.inner.model
    assert model is not None and model.samples == learned.samples
    assert not model_path(tmp_path, "llm").exists()
    assert read_stored(model_path(tmp_path, "pool"))["key"]["model_name"] == "llama"


def test_a_stored_name_adopted_before_the_engine_named_one_gives_way_at_once(
    tmp_path: Path,
) -> None:
    """Restored before the engine named its model, the stored model's name is adopted as
    a guess; the engine's first real name is the evidence. Another name waited three
    observations to settle, as a flapping label does, and meanwhile the stored model of
    another served model decided the clock on this one's traffic. It gives way at once;
    a name that agrees keeps the model, and a later change settles as before."""
    _learn(tmp_path)
    wrapper = PersistentOnlineModel(_controller(), tmp_path, "llm", GPUS)
    wrapper(_idle(0.0))  # the engine not answering yet: no name
    assert wrapper.restored and wrapper.key is not None
    assert wrapper.key.model_name == "llama"  # adopted from the file
    wrapper(_idle(0.25, name="mistral"))  # the engine's first real name
    assert not wrapper.restored and wrapper.inner.resets == 1
    assert wrapper.key.model_name == "mistral"
    other = tmp_path / "agreeing"
    _learn(other)
    agreeing = PersistentOnlineModel(_controller(), other, "llm", GPUS)
    agreeing(_idle(0.0))
    agreeing(_idle(0.25, name="llama"))
    assert agreeing.restored and agreeing.inner.resets == 0
    agreeing(_idle(0.5, name="mistral"))  # a real change now: it settles first
    assert agreeing.restored and agreeing.inner.resets == 0 and agreeing.key is not None
    assert agreeing.key.model_name == "llama"


def test_a_hand_made_state_file_no_domain_could_have_is_not_taken_over(tmp_path: Path) -> None:
    """Only a file a domain's name could have written is another domain's: one whose
    name holds a newline would have cut the "took over" line in two."""
    _learn(tmp_path)
    path = model_path(tmp_path, "llm")
    path.rename(tmp_path / "online-model-a\nb.json")
    renamed = PersistentOnlineModel(_controller(), tmp_path, "pool", GPUS)
    renamed(_idle(0.0, name="llama"))
    assert not renamed.restored
    assert not any("took over" in m for m in renamed.messages)


def test_a_model_keyed_by_gpu_index_is_never_taken_over_by_another_domain(
    tmp_path: Path,
) -> None:
    """A simulated run (``gpugov run --simulate`` where ``$STATE_DIRECTORY`` is the
    node's) keys its domain ``sim`` by the index ``0``, as a node through nvidia-smi keys
    its GPU 0: an index names no board, so that file is no renamed domain's model."""
    _learn(tmp_path, gpus=("0",))
    model_path(tmp_path, "llm").rename(model_path(tmp_path, "sim"))
    node = PersistentOnlineModel(_controller(), tmp_path, "llm", ("0",))
    node(_idle(0.0, name="llama"))
    assert not node.restored
    assert model_path(tmp_path, "sim").exists()


@pytest.mark.parametrize("command", ["show", "export"])
def test_a_domain_whose_model_was_kept_aside_says_so_not_no_model_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """After the engine served another model (or the GPUs changed) and the daemon stopped
    before it learned anything new, the domain's model is kept aside as ``.other-``:
    `model show` and `export` said "no learned model yet", as if the model were lost."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "online-model-llm.json.other-20261207T094000Z").write_text("{}")
    (state / "online-model-llm.json.corrupt-20261207T094100Z").write_text("{")
    (state / "online-model-llm2.json.other-20261207T094200Z").write_text("{}")  # not llm's
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{state}"\n[[domains]]\nname = "llm"\ngpus = [0]\n'
        '[domains.controller]\nkind = "mpc-online"\n'
    )
    argv = ["model", command, "--config", str(config)]
    if command == "export":
        argv += ["--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "online-model-llm.json.other-20261207T094000Z" in err, err
    assert "online-model-llm.json.corrupt-20261207T094100Z" in err, err
    assert "llm2" not in err, err


def test_two_domains_whose_names_were_swapped_each_take_over_their_gpus_model(
    tmp_path: Path,
) -> None:
    """The config swaps two domains' names (``llm`` on GPUS and ``pool`` on others become
    ``pool`` on GPUS and ``llm`` on the others): each name's file holds the other GPUs'
    model. Both were kept aside as another node's and learned anew from scratch; each
    domain takes over its GPUs' model, one line each."""
    others = ("GPU-cccc", "GPU-dddd")
    llm = _learn(tmp_path).inner.model
    elsewhere = tmp_path / "elsewhere"
    pool = _learn(elsewhere, gpus=others).inner.model
    assert llm is not None and pool is not None
    os.replace(model_path(elsewhere, "llm"), model_path(tmp_path, "pool"))
    swapped = {
        "pool": PersistentOnlineModel(_controller(), tmp_path, "pool", GPUS),
        "llm": PersistentOnlineModel(_controller(), tmp_path, "llm", others),
    }
    for wrapper in swapped.values():
        wrapper(_idle(0.0, name="llama"))
    for name, learned in (("pool", llm), ("llm", pool)):
        wrapper = swapped[name]
        assert wrapper.restored, (name, wrapper.messages)
        model = wrapper.inner.model
        assert model is not None and model.samples == learned.samples, name
        assert any("took over" in m for m in wrapper.messages), wrapper.messages
    assert read_stored(model_path(tmp_path, "pool"))["key"]["gpu_uuids"] == list(GPUS)
    assert read_stored(model_path(tmp_path, "llm"))["key"]["gpu_uuids"] == list(others)


@pytest.mark.parametrize("gpus", [GPUS, GPUS[:1]], ids=["two GPUs", "one GPU"])
def test_the_exported_profile_describes_the_domains_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: tuple[str, ...]
) -> None:
    """The model's rates are its domain's and its powers their sum: a domain of two GPUs
    exported no ``tensor_parallel`` (read as 1), so ``gpugov emulate --gpus 2`` made two
    replicas each drawing the whole domain's power, as ``gpugov profile`` never writes."""
    _learn(tmp_path, gpus=gpus, gpu_names=(H100,) * len(gpus))
    manifest, _ = _export(tmp_path, capsys)
    assert manifest["tensor_parallel"] == len(gpus)
    assert load_profile(tmp_path / "export" / "online-llm.json").tensor_parallel == len(gpus)


class NoPower:
    """Observations without a power or energy reading (a GPU whose power reads fail)."""

    def __init__(self, inner: PersistentOnlineModel) -> None:
        self.inner = inner

    def __call__(self, observation):  # type: ignore[no-untyped-def]
        changed = replace(observation, power_w=None, energy_j=None, model_name="llama")
        return self.inner(changed)


def test_a_model_in_its_warm_up_is_not_thrown_away_by_a_save_it_fails(tmp_path: Path) -> None:
    """Without power readings the first save comes with the first latency window, when the
    decode fit at the top clock is not identified yet (0 s): the save was refused and the
    model reset to nothing (no good file yet), its first windows lost. A model in its
    warm-up is not saved then, and goes on learning."""
    controller = OnlineMPCController(control_period_s=0.25)
    wrapper = PersistentOnlineModel(controller, tmp_path, "llm", GPUS)
    simulate(
        poisson_requests(30.0, seed=1),
        make_plant(),
        chunked_prefill_scheduler,
        NoPower(wrapper),
        0,
        control_period_s=0.25,
    )
    wrapper.close()
    assert controller.resets == 0
    assert not [m for m in wrapper.messages if "not saved" in m]
    model = controller.model
    assert model is not None and model.warmed_up
    assert (
        read_stored(model_path(tmp_path, "llm"))["model"]["time"]["samples"] == model.time.samples
    )
