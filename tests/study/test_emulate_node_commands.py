"""``gpugov status``, ``reset-clocks`` and ``check-config`` honour ``backend = "emulated"``:
run against ``gpugov emulate``'s server on loopback (two emulated GPUs), never NVML."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic import make_plant

import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.node_support as node_support
import gpugov.daemon.status_cli as status_cli
from gpugov.daemon.emulated import EmulatedBackend, emulated_device_count
from gpugov.daemon.errors import GpuUnavailable
from gpugov.daemon.loop import ResetAdvice, not_reset_message
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorServer]:
    """Two emulated GPUs on a free loopback port; NVML is made unusable, so a command
    that reads NVML instead of the emulator fails."""

    def no_nvml() -> None:
        raise AssertionError("NVML used although the backend is emulated")

    # check-config, status and the GPU listing of reset-clocks each look NVML up by name.
    for module in (node_cli, status_cli, node_support):
        monkeypatch.setattr(module, "load_pynvml", no_nvml)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    server = EmulatorServer(EmulatedNode(make_plant(), gpus=2), "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.close()


def _config(tmp_path: Path, emulator: str, gpus: str = "[0]") -> Path:
    path = tmp_path / "emulated.toml"
    path.write_text(
        f'[daemon]\nmetrics_address = ""\nbackend = "emulated"\nemulator = "{emulator}"\n'
        f'[[domains]]\nname = "emulated"\ngpus = {gpus}\n'
        "ttft_slo_s = 1.0\ntpot_slo_s = 0.05\n"
        f'[domains.engine]\nkind = "vllm"\nurl = "{emulator}/metrics"\n'
    )
    return path


def test_an_outside_controller_that_caps_power_is_refused_by_check_config_as_by_run(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An outside governor that sets a power cap on GPUs whose backend cannot set one: run
    refused it at its start, and check-config (online or --offline) said OK."""
    config = _config(tmp_path, emulator.url)
    config.write_text(
        config.read_text()
        + '[domains.controller]\nkind = "external"\n'
        + 'factory = "example_outside_governor:make_capping"\n'
    )
    assert node_cli.main(["run", "--config", str(config), "--dry-run"]) == 2
    run_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert run_line == (
        "gpugov: error: domain 'emulated': controller 'example_outside_governor:make_capping' "
        "sets a GPU power limit, which this domain's GPU backend cannot set (only nvml can); "
        'use backend = "nvml", or a controller that sets only the clock'
    )
    for offline in ([], ["--offline"]):
        assert node_cli.main(["check-config", str(config), *offline]) == 2
        assert capsys.readouterr().err.splitlines() == [run_line]


def test_a_tensor_parallel_group_split_over_domains_is_one_warning_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replicas of two tensor-parallel GPUs each, governed as domains of one GPU (or a
    group's GPU in no domain): each group ran at its slowest GPU's clock, two controllers
    fighting over it, and check-config said OK."""
    from synthetic import make_profile

    from gpugov.plant import ServingPlant

    monkeypatch.setattr(node_cli, "load_pynvml", lambda: None)
    node = EmulatedNode(ServingPlant.from_profile(make_profile()), gpus=4, tensor_parallel=2)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        config = tmp_path / "split.toml"
        text = f'[daemon]\nmetrics_address = ""\nbackend = "emulated"\nemulator = "{server.url}"\n'
        for name, gpus, replica in (("a", "[0]", 0), ("b", "[1]", 0), ("c", "[2]", 1)):
            text += (
                f'[[domains]]\nname = "{name}"\ngpus = {gpus}\nttft_slo_s = 1.0\n'
                f"tpot_slo_s = 0.05\n[domains.engine]\n"
                f'url = "{server.url}/replica/{replica}/metrics"\n'
            )
        config.write_text(text)
        assert node_cli.main(["check-config", str(config)]) == 0
        split = "gpugov: warning: the emulator's replica"
        warnings = [line for line in capsys.readouterr().err.splitlines() if split in line]
        assert warnings == [
            "gpugov: warning: the emulator's replica 0 (GPUs 0, 1: one tensor-parallel group) "
            "is split: GPU 0 in domain 'a', GPU 1 in domain 'b'; the group runs at its slowest "
            "GPU's clock, so give one domain all of its GPUs",
            "gpugov: warning: the emulator's replica 1 (GPUs 2, 3: one tensor-parallel group) "
            "is split: GPU 2 in domain 'c', GPU 3 in no domain; the group runs at its slowest "
            "GPU's clock, so give one domain all of its GPUs",
        ]
        # One domain per group, each on its replica's page: no warning.
        whole = f'[daemon]\nmetrics_address = ""\nbackend = "emulated"\nemulator = "{server.url}"\n'
        for name, gpus, replica in (("a", "[0, 1]", 0), ("c", "[3, 2]", 1)):
            whole += (
                f'[[domains]]\nname = "{name}"\ngpus = {gpus}\nttft_slo_s = 1.0\n'
                f"tpot_slo_s = 0.05\n[domains.engine]\n"
                f'url = "{server.url}/replica/{replica}/metrics"\n'
            )
        config.write_text(whole)
        assert node_cli.main(["check-config", str(config)]) == 0
        assert capsys.readouterr().err == ""
    finally:
        server.close()


def _lock(emulator: str, gpu: int) -> None:
    backend = EmulatedBackend(gpu, emulator=emulator)
    backend.lock_clocks(900, 900)
    backend.close()


def test_the_emulator_counts_its_gpus(emulator: EmulatorServer) -> None:
    assert emulated_device_count(emulator.url) == 2
    url = emulator.url
    emulator.close()
    with pytest.raises(GpuUnavailable, match="does not answer"):
        emulated_device_count(url)


def test_status_reads_the_configs_emulated_gpus(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, emulator.url)
    assert node_cli.main(["status", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"may lock clocks: yes (emulated GPUs at {emulator.url})" in out
    gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
    assert len(gpus) == 2 and "supported 345-1980 MHz" in gpus[1]
    assert f"engine {emulator.url}/metrics: reachable (vllm" in out
    assert (
        node_cli.main(["status", "--backend", "emulated", "--emulator", emulator.url, "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "emulated" and report["emulator"] == emulator.url
    assert [gpu["index"] for gpu in report["gpus"]] == [0, 1]


def test_status_with_the_emulator_down_says_no_lock_can_be_made(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the emulator not running, status said ``may lock clocks: yes (emulated GPUs
    at URL)`` above the line saying the GPUs are unavailable: no lock can be made
    through an emulator that does not answer. It says no, and why."""
    config = _config(tmp_path, emulator.url)
    emulator.close()
    assert node_cli.main(["status", "--config", str(config)]) == 4
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("may lock clocks:"))
    assert line.startswith(
        f"may lock clocks: no (the emulated GPUs cannot be read: emulator {emulator.url} "
        "does not answer"
    ), line
    assert node_cli.main(["status", "--config", str(config), "--json"]) == 4
    report = json.loads(capsys.readouterr().out)
    assert report["may_lock_clocks"] is False and "does not answer" in report["gpu_error"]


def test_reset_clocks_resets_the_configs_emulated_gpus(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _lock(emulator.url, 0)
    _lock(emulator.url, 1)
    states = emulator.node.gpu_state
    assert states[0].locked == (900, 900) and states[1].locked == (900, 900)
    config = _config(tmp_path, emulator.url)
    assert node_cli.main(["reset-clocks", "--config", str(config), "--gpus", "1"]) == 0
    assert states[0].locked == (900, 900) and states[1].locked is None
    assert node_cli.main(["reset-clocks", "--config", str(config)]) == 0  # --gpus all
    assert states[0].locked is None
    out = capsys.readouterr().out
    assert "GPU 0: SM clock lock reset" in out and "GPU 1: SM clock lock reset" in out
    _lock(emulator.url, 1)
    assert node_cli.main(["reset-clocks", "--backend", "emulated", "--emulator", emulator.url]) == 0
    assert states[1].locked is None


def test_reset_clocks_with_a_hung_emulator_exits_6_as_with_a_hung_nvml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An emulator that accepts and never answers (stopped, hung) made the listing fail
    as no GPU (exit 4), where a hung NVML listing is exit 6: the GPUs may still be
    locked. One that is not running is still no GPU (exit 4)."""
    import socket

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # the kernel accepts into its backlog; nothing ever answers
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        assert node_cli.main(["reset-clocks", "--backend", "emulated", "--emulator", url]) == 6
    assert capsys.readouterr().err == (
        f"gpugov: error: emulator {url} does not answer: no answer within 2 s (stopped or "
        "hung); no GPU was reset and they may still be locked: run `gpugov reset-clocks` "
        "again once it answers\n"
    )
    assert node_cli.main(["reset-clocks", "--backend", "emulated", "--emulator", url]) == 4
    assert "Connection refused" in capsys.readouterr().err


def test_reset_clocks_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert node_cli.main(["reset-clocks", "--backend", "emulated"]) == 2
    assert "--backend emulated needs --emulator URL" in capsys.readouterr().err
    assert node_cli.main(["reset-clocks", "--emulator", "http://127.0.0.1:1"]) == 2
    assert "--emulator applies to the emulated backend" in capsys.readouterr().err


def test_check_config_checks_the_emulator_and_its_gpus(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, emulator.url, gpus="[0, 1]")
    assert node_cli.main(["check-config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"emulator {emulator.url}: answers, 2 GPU(s)" in out
    assert "domain emulated: GPU 0, 1 (NVIDIA test GPU): 110 supported clocks, 345-1980 MHz" in out
    missing = _config(tmp_path, emulator.url, gpus="[0, 5]")
    assert node_cli.main(["check-config", str(missing)]) == 4
    assert "GPU 5: no such emulated GPU" in capsys.readouterr().err
    url = emulator.url
    emulator.close()
    assert node_cli.main(["check-config", str(config)]) == 4
    err = capsys.readouterr().err
    assert f"emulator {url} does not answer" in err and "--offline" in err
    assert node_cli.main(["check-config", str(config), "--offline"]) == 0


def test_exit_6_names_the_config_for_an_emulated_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config's absolute path (the line is read later, from elsewhere), no "as root"
    for GPUs that need none; NVML's line stays the bare command, as root."""
    config = _config(tmp_path, "http://127.0.0.1:8000")
    monkeypatch.chdir(config.parent)
    advice = ResetAdvice("emulated", config.name)
    assert not_reset_message(["0", "1"], None, advice) == (
        "could not reset the SM clock lock of GPU(s) 0,1; they may still be locked: "
        f"run `gpugov reset-clocks --config {config} --gpus 0,1` (emulated backend)"
    )
    assert ResetAdvice("nvidia-smi", config.name).command("0") == (
        f"run `gpugov reset-clocks --config {config} --gpus 0` as root"
    )
    assert ResetAdvice("nvml", config.name).command("0") == (
        "run `gpugov reset-clocks --gpus 0` as root"
    )


def test_a_gpu_lost_mid_run_says_so_once_in_nvml_words_and_how_to_reset_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``gpugov emulate --fault lost-after:S`` on a one-GPU node: exit 5, NVML's text for
    code 15 once (not "NVML return code 15 (NVML code 15)"), no "other GPUs" when there
    are none, and the log says the lock could not be reset on a lost GPU, with no
    ``gpugov reset-clocks`` advice (no command reaches a lost GPU)."""
    node = EmulatedNode(make_plant(), gpus=1)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        config = _config(tmp_path, server.url)
        config.write_text(
            config.read_text().replace(
                "[daemon]\n", f'[daemon]\nperiod_s = 0.2\nstate_dir = "{tmp_path}"\n'
            )
        )
        node.gpu_state[0].lost_at_s = node.plant_time_s() + 1.0
        assert node_cli.main(["run", "--config", str(config)]) == 5
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("gpugov: error: GPU 0: ")
    assert err.endswith(" failed: GPU is lost (NVML code 15); it was the only GPU governed")
    assert "GPU(s) 0 lost: its SM clock lock could not be reset" in caplog.text
    assert "no command reaches a lost GPU" in caplog.text
    assert "reset-clocks" not in caplog.text


def test_a_left_lock_on_a_gpu_the_emulator_lacks_is_dropped_not_left_forever(
    tmp_path: Path, emulator: EmulatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed run's lock record names a GPU this emulated node does not have (the
    emulator restarted with fewer GPUs): its lock went with the old emulator. The start's
    line named `gpugov reset-clocks --gpus 7`, which went to NVML, then the config's
    command, which the emulator refuses (no GPU 7), and the record was kept for good; it
    is dropped."""
    from gpugov.daemon.lockstate import LockState

    state_dir = tmp_path / "state"
    LockState(state_dir, pid=1).record("GPU-gone", "7", 900, 900)  # ... and SIGKILLed
    node = emulator.node
    config = _config(tmp_path, emulator.url)
    config.write_text(
        config.read_text().replace(
            "[daemon]\n", f'[daemon]\nperiod_s = 0.2\nstate_dir = "{state_dir}"\n'
        )
    )
    node.gpu_state[0].lost_at_s = node.plant_time_s() + 0.5  # ends the run
    assert node_cli.main(["run", "--config", str(config)]) == 5
    (line,) = [r.getMessage() for r in caplog.records if "GPU 7 (GPU-gone)" in r.getMessage()]
    assert line.endswith(
        "the emulator has no GPU 7 now (restarted with fewer GPUs), and its "
        "lock went with the old one; record dropped"
    ), line
    assert "GPU-gone" not in LockState(state_dir, pid=2).read()


def test_a_left_lock_on_a_gpu_an_emulator_restart_replaced_is_dropped_not_left_forever(
    tmp_path: Path, emulator: EmulatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed run's lock record names GPU 0 by a UUID the emulator no longer serves there
    (restarted with another profile): that GPU's lock went with the old emulator. Each
    start said `not reset: GPU 0 is now GPU-...; run gpugov reset-clocks on the recorded
    GPU`, which no command can do, and status showed the record for good; it is dropped."""
    from gpugov.daemon.lockstate import LockState

    state_dir = tmp_path / "state"
    old = "GPU-5668c455-dc5a-5422-96ff-2b1ffd7984b2"  # another profile's GPU 0
    LockState(state_dir, pid=1).record(old, "0", 900, 900)  # ... and SIGKILLed
    node = emulator.node
    config = _config(tmp_path, emulator.url, gpus="[1]")
    config.write_text(
        config.read_text().replace(
            "[daemon]\n", f'[daemon]\nperiod_s = 0.2\nstate_dir = "{state_dir}"\n'
        )
    )
    node.gpu_state[1].lost_at_s = node.plant_time_s() + 0.5  # ends the run
    assert node_cli.main(["run", "--config", str(config)]) == 5
    (line,) = [r.getMessage() for r in caplog.records if f"GPU 0 ({old})" in r.getMessage()]
    assert "emulator" in line and "dropped" in line, line
    assert "reset-clocks" not in line, line
    assert old not in LockState(state_dir, pid=2).read()
    assert node.gpu_state[0].locked is None  # the GPU now at index 0 was not touched
