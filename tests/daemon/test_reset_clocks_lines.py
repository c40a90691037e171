"""``gpugov reset-clocks``' lines: a refused reset says the GPUs may still be locked and
names the privilege it needs (no ``--dry-run``, which a reset has no use for), and a
``--gpus`` index the node lacks is refused before any reset, whatever the backend."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from daemon_support import node_commands_on
from fake_nvidia_smi import FakeNvidiaSmi
from fake_pynvml import FakeNvml
from hung_support import HungCall

import gpugov.daemon.gpu_open as gpu_open
import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.node_support as node_support
import gpugov.daemon.reset_clocks as reset_clocks
from gpugov.daemon.errors import RESET_PERMISSION_MESSAGE
from gpugov.daemon.nvidia_smi import NvidiaSmiBackend


def test_nvml_reset_refused_says_the_gpus_may_still_be_locked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused on every GPU: exit 3 as before, but the last line said only "2 of 2 GPU(s)
    not reset: 0, 1", where every other failed reset says they may still be locked; and
    each GPU's line advised ``--dry-run``, which a reset has no use for."""
    fake = node_commands_on(monkeypatch, FakeNvml(2))
    fake.permission = False
    assert node_cli.main(["reset-clocks"]) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == "gpugov: error: 2 of 2 GPU(s) not reset: 0, 1; they may still be locked"
    for line in lines[:-1]:
        assert line.endswith(f"reset clocks: {RESET_PERMISSION_MESSAGE}")
    assert "--dry-run" not in "\n".join(lines)


def test_nvidia_smi_reset_all_refused_names_the_privilege_not_dry_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``nvidia-smi --reset-gpu-clocks`` refused: the line advised ``--dry-run``."""
    smi = FakeNvidiaSmi(2, permission=False)
    monkeypatch.setattr(reset_clocks, "run_command", smi)
    assert node_cli.main(["reset-clocks", "--backend", "nvidia-smi"]) == 3
    (line,) = capsys.readouterr().err.splitlines()
    assert RESET_PERMISSION_MESSAGE in line and "--dry-run" not in line
    assert line.endswith("no GPU was reset and they may still be locked")


def _smi_node(monkeypatch: pytest.MonkeyPatch, gpus: int) -> FakeNvidiaSmi:
    """A node whose nvidia-smi (listing and per-GPU backends) is a fake of ``gpus`` GPUs."""
    smi = FakeNvidiaSmi(gpus)
    monkeypatch.setattr(node_support, "run_command", smi)
    monkeypatch.setattr(gpu_open, "NvidiaSmiBackend", lambda gpu: NvidiaSmiBackend(gpu, runner=smi))
    return smi


def test_nvidia_smi_reset_of_a_gpu_the_node_lacks_is_refused_before_any_reset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--backend nvidia-smi --gpus 0,7`` on a 2-GPU node reset GPU 0, then named GPU 7
    "NOT reset ... they may still be locked" (exit 6); NVML's and the emulator's backends
    refused the index up front: one line naming --gpus, exit 4, no GPU touched."""
    smi = _smi_node(monkeypatch, 2)
    smi.gpus[0].locked = (900, 900)
    assert node_cli.main(["reset-clocks", "--backend", "nvidia-smi", "--gpus", "0,7"]) == 4
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "gpugov: error: --gpus: no GPU 7 on this node (it has 0-1)"
    ]
    assert not [argv for argv in smi.calls if "--reset-gpu-clocks" in argv]
    assert smi.gpus[0].locked == (900, 900)
    assert node_cli.main(["reset-clocks", "--backend", "nvidia-smi", "--gpus", "1"]) == 0
    assert "GPU 1: SM clock lock reset" in capsys.readouterr().out


@pytest.mark.parametrize(
    "write_path",
    [
        'backend = "actuator"\nactuator = {{ socket = "{dir}/a.sock" }}',
        'backend = "zeusd"\nzeusd = {{ socket = "{dir}/z.sock" }}',
    ],
)
def test_a_split_backend_s_gpu_the_node_lacks_is_refused_before_any_reset(
    write_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--config`` of the split mode (the actuator, zeusd) with ``--gpus 7`` on a 2-GPU
    node: GPU 7 was tried and named "NOT reset ... they may still be locked" (exit 6);
    now it is refused up front as on NVML (the split mode reads, and lists, by NVML)."""
    node_commands_on(monkeypatch, FakeNvml(2))
    config = tmp_path / "g.toml"
    config.write_text(
        f"[daemon]\n{write_path.format(dir=tmp_path)}\n"
        '[[domains]]\nname = "a"\ngpus = [0]\n'
        '[domains.engine]\nurl = "http://127.0.0.1:9/metrics"\n'
    )
    assert node_cli.main(["reset-clocks", "--config", str(config), "--gpus", "1,7"]) == 4
    assert capsys.readouterr().err.splitlines() == [
        "gpugov: error: --gpus: no GPU 7 on this node (it has 0-1)"
    ]


def test_gpus_whose_reset_hangs_leave_a_healthy_gpu_after_them_its_reset(
    monkeypatch: pytest.MonkeyPatch, safety: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget of one and a half call deadlines, GPUs 0 and 1 whose reset hangs: reset
    one after another, the two spent the budget and GPU 2, healthy, was named "not
    tried" and left locked (a preStop hook's only chance). Reset at once, GPU 2 is reset
    and only the hung two are named."""
    deadline_s = 0.5
    monkeypatch.setattr(reset_clocks, "RESET_CALL_DEADLINE_S", deadline_s)
    monkeypatch.setattr(reset_clocks, "RESET_BUDGET_S", 1.5 * deadline_s)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    fake = node_commands_on(monkeypatch, FakeNvml(3))
    for gpu in fake.gpus:
        gpu.locked = (1005, 1005)
    hung = [HungCall(fake, "nvmlDeviceResetGpuLockedClocks", index=i) for i in (0, 1)]
    safety.extend(hung)
    assert node_cli.main(["reset-clocks", "--gpus", "all"]) == 6
    out, err = capsys.readouterr()
    assert out.splitlines() == ["GPU 2: SM clock lock reset"]
    assert fake.gpus[2].locked is None
    lines = err.splitlines()
    assert [line.split(":", 1)[0] for line in lines[:2]] == ["GPU 0", "GPU 1"]
    assert all("(a hung GPU call: a driver in trouble)" in line for line in lines[:2]), lines
    assert lines[2:] == ["gpugov: error: 2 of 3 GPU(s) not reset: 0, 1; they may still be locked"]


def test_a_damaged_lock_record_is_one_warning_however_many_gpus_are_reset(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A lock record that is no JSON, or names a clock that is none, is read once per GPU
    for its lock and once for its power limit: each said the same warning again (four
    identical lines for two GPUs, sixteen for eight)."""
    fake = node_commands_on(monkeypatch, FakeNvml(2))
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    record = tmp_path / "locks.json"
    uuid = fake.gpus[0].uuid
    bad_clock = json.dumps({"version": 1, "gpus": {uuid: {"gpu": "0", "min_mhz": "abc"}}})
    bad_limit = json.dumps({"version": 1, "power_limits": {uuid: {"original_mw": -5}}})
    for text, needle in (
        ("[1, 2", "cannot read it"),
        (bad_clock, "min_mhz is 'abc'"),
        (bad_limit, "original_mw is -5"),
    ):
        record.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert node_cli.main(["reset-clocks"]) == 0
        said = [r.getMessage() for r in caplog.records if needle in r.getMessage()]
        assert len(said) == 1, said


def test_reset_on_a_node_whose_driver_lists_no_gpu_says_so_and_exits_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """NVML answers but lists no GPU: reset-clocks printed nothing and exited 0, as if
    every GPU had been reset; it is exit 4 (no GPU could be listed), in one line."""
    node_commands_on(monkeypatch, FakeNvml(0))
    assert node_cli.main(["reset-clocks"]) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "gpugov: error: NVML lists no GPU on this node; nothing was reset"
    ]
