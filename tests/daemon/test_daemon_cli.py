"""The node commands: run, check-config, reset-clocks, status, replay, exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from daemon_support import MetricsServer, fixture_text, node_commands_on, sigterm_once_open
from fake_pynvml import FakeNvml

import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.reset_clocks as reset_clocks
import gpugov.daemon.status_cli as status_cli
from gpugov.daemon.errors import PERMISSION_DENIED_MESSAGE

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "gpugov.example.toml"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return node_commands_on(monkeypatch, FakeNvml(2))


def _config(tmp_path: Path, url: str, extra: str = "") -> Path:
    path = tmp_path / "gpugov.toml"
    path.write_text(
        f'[daemon]\nmetrics_address = ""\n{extra}\n'
        f'[[domains]]\nname = "llm"\ngpus = [0, 1]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{url}"\n'
    )
    return path


def test_check_config_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert node_cli.main(["check-config", str(EXAMPLE), "--offline"]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "domain llama-8b" in out
    assert "controller mpc-online, SLO target 99% over 600 s;" in out


def test_check_config_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[domains]]\nname = "x"\ngpus = [0]\n[domains.controller]\nkind = "fixed"\n')
    assert node_cli.main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpugov: error: ") and "domains[0].controller.clock_mhz" in err


def test_run_without_permission_exits_3(
    tmp_path: Path,
    metrics_server: MetricsServer,
    capsys: pytest.CaptureFixture[str],
    fake: FakeNvml,
) -> None:
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    fake.permission = False
    assert node_cli.main(["run", "--config", str(_config(tmp_path, metrics_server.url))]) == 3
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"gpugov: {PERMISSION_DENIED_MESSAGE}"
    assert fake.initialized == 0


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_a_read_nvml_refuses_exits_3_naming_it_without_a_dry_run_to_try(
    tmp_path: Path,
    metrics_server: MetricsServer,
    capsys: pytest.CaptureFixture[str],
    fake: FakeNvml,
    dry_run: bool,
) -> None:
    # NVML's NO_PERMISSION at its initialisation (a user who cannot open /dev/nvidia*)
    # said "needs root or CAP_SYS_ADMIN to lock clocks; run with --dry-run to observe
    # only", to a dry run too, which NVML refuses the same way.
    import fake_pynvml as fp

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    fake.fail("nvmlInit", fp.NVML_ERROR_NO_PERMISSION, times=None)
    argv = ["run", "--config", str(_config(tmp_path, metrics_server.url))]
    assert node_cli.main([*argv, "--dry-run"] if dry_run else argv) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("gpugov: error: GPU 0: initialise NVML: NVML refused this user")
    assert "/dev/nvidia*" in line and "--dry-run" not in line


def test_run_with_missing_gpu_exits_4(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[[domains]]\nname = "x"\ngpus = [7]\n')
    assert node_cli.main(["run", "--config", str(path)]) == 4
    assert "GPU 7" in capsys.readouterr().err
    assert fake.initialized == 0


def test_a_second_run_on_a_held_node_names_the_holder_not_the_metrics_port(
    tmp_path: Path, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpugov run` with the running daemon's own config: its metrics port is taken too,
    and that was the line (`daemon.metrics_address: cannot serve metrics on ...: Address
    already in use; pick another`), which sent the operator to edit the config, only to
    be refused on the state directory next. The refusal names the daemon holding it."""
    import socket

    from gpugov.daemon.lockstate import LockState

    state = LockState(tmp_path / "state")
    state.hold()  # the running daemon (this process)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "gpugov.toml"
        path.write_text(
            f'[daemon]\nmetrics_address = "127.0.0.1:{port}"\n'
            f'state_dir = "{tmp_path / "state"}"\n'
            '[[domains]]\nname = "llm"\ngpus = [0, 1]\n'
            '[domains.engine]\nkind = "vllm"\nurl = "http://127.0.0.1:9/metrics"\n'
        )
        try:
            assert node_cli.main(["run", "--config", str(path)]) == 2
        finally:
            state.release()
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gpugov: error: {tmp_path / 'state'}: another gpugov run (pid {os.getpid()}) holds "
        "this state directory; run one daemon per node (or give each its own state_dir and GPUs)"
    ), err
    assert fake.calls.get("nvmlInit", 0) == 0  # refused before any GPU call


def test_run_with_gpu_lost_exits_5(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
) -> None:
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    import fake_pynvml as fp

    fake.fail("nvmlDeviceGetUtilizationRates", fp.NVML_ERROR_GPU_IS_LOST, times=None)
    assert node_cli.main(["run", "--config", str(_config(tmp_path, metrics_server.url))]) == 5
    err = capsys.readouterr().err
    assert "GPU is lost (NVML code 15); the other GPU's clock was reset" in err  # of 2


def test_gpus_lost_together_exit_5_naming_them_not_6(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both GPUs lost at once (a baseboard's fault; an emulated node with ``--fault
    lost-after``): the exit's reset of the other finds it lost too. That ended in exit 6,
    `could not reset ...; run gpugov reset-clocks`, which no command can do for a lost
    GPU; it is exit 5, the line naming the GPUs lost with it."""
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    import fake_pynvml as fp

    lock = fake.nvmlDeviceSetGpuLockedClocks

    def lock_then_both_lost(handle: Any, low: int, high: int) -> None:
        lock(handle, low, high)
        if handle.index == 1:  # both GPUs locked: lost together from the next tick
            fake.fail("nvmlDeviceGetUtilizationRates", fp.NVML_ERROR_GPU_IS_LOST, times=None)
            fake.fail("nvmlDeviceResetGpuLockedClocks", fp.NVML_ERROR_GPU_IS_LOST, times=None)

    monkeypatch.setattr(fake, "nvmlDeviceSetGpuLockedClocks", lock_then_both_lost)
    config = _config(tmp_path, metrics_server.url, extra="period_s = 0.1")
    assert node_cli.main(["run", "--config", str(config)]) == 5
    assert fake.locked(0) is not None and fake.locked(1) is not None
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpugov: error: GPU 0: ") and "GPU is lost (NVML code 15)" in last
    assert last.endswith("; GPU(s) 1 lost too")
    # The log's line too: none can reach them.
    assert "reset-clocks" not in err + caplog.text, caplog.text
    assert "GPU(s) 0,1 lost: their SM clock locks could not be reset" in caplog.text


@pytest.mark.parametrize("code", [9, 1, 6, 18])  # DRIVER_NOT_LOADED, UNINITIALIZED, ...
def test_a_driver_gone_mid_run_says_so_and_resets_the_clocks(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    code: int,
) -> None:
    """A driver unloaded or upgraded under the loop ended the run with the start's line,
    "no NVIDIA driver on this machine, run `gpugov emulate`"; it now says the driver went
    away while gpugov ran, after the exit reset every lock NVML still answers for."""
    import fake_pynvml as fp

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    read = fake.nvmlDeviceGetUtilizationRates

    def utilisation(handle: fp.FakeGpu) -> fp.Utilization:
        if any(gpu.locked for gpu in fake.gpus):  # the loop governs: the driver goes
            raise fp.NVMLError(code)
        return read(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetUtilizationRates", utilisation)
    config = _config(tmp_path, metrics_server.url, "period_s = 0.05")
    assert node_cli.main(["run", "--config", str(config)]) == 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert f"(NVML code {code}): the NVIDIA driver went away or was replaced" in err[0]
    assert err[0].endswith("while gpugov ran; every clock gpugov locked was reset")
    assert "no NVIDIA driver on this machine" not in err[0] and "emulate" not in err[0]
    assert any(write[0] == "nvmlDeviceSetGpuLockedClocks" for write in fake.writes)
    assert [gpu.locked for gpu in fake.gpus] == [None, None]


def test_the_engine_page_hung_up_on_prints_nothing_to_the_daemons_stderr(
    metrics_server: MetricsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scrape given up at its deadline (0.025 s at a 0.05 s period, under load) broke
    the page's answer: socketserver printed a 19-line BrokenPipeError traceback into the
    stderr the tests above count, as the daemon's. A hang-up is now counted, not printed;
    any other server error still prints."""
    server: Any = metrics_server._httpd
    try:
        raise BrokenPipeError(32, "Broken pipe")
    except BrokenPipeError:
        server.handle_error(None, ("127.0.0.1", 1))
    assert capsys.readouterr().err == "" and metrics_server.hangups == 1
    try:
        raise ValueError("a broken handler")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 1))
    assert "ValueError: a broken handler" in capsys.readouterr().err
    assert metrics_server.hangups == 1


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_a_gpu_lost_before_the_start_is_no_usable_gpu(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """Lost before the daemon governed it, a GPU is no usable GPU (exit 4), and no line
    claims other GPUs were reset (exit 5 and that line are for one lost mid-run)."""
    import fake_pynvml as fp

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    fake.fail("nvmlDeviceGetHandleByIndex", fp.NVML_ERROR_GPU_IS_LOST, times=None)
    config = str(_config(tmp_path, metrics_server.url))
    argv = ["run", "--config", config] if command == "run" else ["check-config", config]
    assert node_cli.main(argv) == 4
    err = capsys.readouterr().err
    assert "GPU is lost" in err and "were reset" not in err


def test_run_flag_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert node_cli.main(["run"]) == 2
    assert node_cli.main(["run", "--speed", "5", "--config", "x.toml"]) == 2
    assert node_cli.main(["run", "--simulate", "--virtual", "--controller", "warp"]) == 2
    assert node_cli.main(["run", "--simulate", "--speed", "-1"]) == 2
    err = capsys.readouterr().err
    assert "unknown controller 'warp'" in err
    assert "argument --speed: must be a speed in (0, 1e+06], got '-1'" in err


def test_run_simulate_refuses_a_state_directory_that_is_a_file_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mpc-online`` keeps its learned model in the state directory: one that is a file
    is one line before the run (it ran the whole simulation, then lost the model it
    learned, saying so only at the end); a controller that learns nothing runs."""
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    argv = ["run", "--simulate", "--virtual", "--duration", "5", "--quiet"]
    assert node_cli.main([*argv, "--controller", "mpc-online"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"gpugov: error: $STATE_DIRECTORY={state}: exists and is not a directory; "
        "mpc-online keeps its learned model there"
    ]
    assert "run --simulate" not in captured.out
    assert state.read_text() == "not a directory\n"
    assert node_cli.main([*argv, "--controller", "max"]) == 0


def test_reset_clocks(fake: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    fake.gpus[0].locked = (900, 900)
    assert node_cli.main(["reset-clocks"]) == 0
    assert sorted(fake.writes) == [  # the GPUs are reset at once, in any order
        ("nvmlDeviceResetGpuLockedClocks", 0),
        ("nvmlDeviceResetGpuLockedClocks", 1),
    ]
    assert node_cli.main(["reset-clocks", "--gpus", "1"]) == 0
    assert fake.writes[-1] == ("nvmlDeviceResetGpuLockedClocks", 1)
    assert "GPU 1: SM clock lock reset" in capsys.readouterr().out
    assert node_cli.main(["reset-clocks", "--gpus", "x"]) == 2
    # A GPU the node does not have: no such GPU (4), not one that may still be locked (6).
    capsys.readouterr()
    assert node_cli.main(["reset-clocks", "--gpus", "5"]) == 4
    assert "--gpus: no GPU 5 on this node (it has 0-1)" in capsys.readouterr().err
    fake.permission = False
    assert node_cli.main(["reset-clocks"]) == 3


def test_reset_clocks_with_a_config_clears_its_state_dirs_lock_record(
    tmp_path: Path, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reset-clocks --config FILE`` clears the GPU's record in the config's
    ``state_dir`` (it looked only at ``$STATE_DIRECTORY``, and the next start reported a
    lock left behind)."""
    from gpugov.daemon.lockstate import LockState

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    state = tmp_path / "state"
    state.mkdir()
    LockState(state).record(fake.gpus[0].uuid, "0", 900, 900)
    fake.gpus[0].locked = (900, 900)
    config = tmp_path / "node.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n\n[[domains]]\nname = "x"\ngpus = [0]\n')
    assert node_cli.main(["reset-clocks", "--config", str(config), "--gpus", "0"]) == 0
    assert LockState(state).get(fake.gpus[0].uuid) is None


def test_reset_clocks_restores_a_power_limit_a_crashed_run_left(
    tmp_path: Path,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A unit's ``ExecStopPost=`` reset after a SIGKILL restores the power limit the run
    recorded (in ``$STATE_DIRECTORY``) along with the clocks."""
    from gpugov.daemon.lockstate import LockState

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    LockState(tmp_path, pid=999_999_999).record_power_limit(
        fake.gpus[1].uuid, "1", 700_000, 300_000
    )
    fake.gpus[1].power_limit_mw = 300_000
    assert node_cli.main(["reset-clocks"]) == 0
    assert fake.gpus[1].power_limit_mw == 700_000
    assert ("nvmlDeviceSetPowerManagementLimit", 1, 700_000) in fake.writes
    assert "set its power limit to 300 W (now 300 W), 700 W before; restored" in (
        capsys.readouterr().out
    )
    assert LockState(tmp_path).get_power_limit(fake.gpus[1].uuid) is None


def test_reset_clocks_restores_a_recorded_power_limit_when_the_clock_reset_fails(
    tmp_path: Path,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A clock reset refused for good (exit 6, the GPU named) still restores the power
    limit the run recorded on that GPU."""
    from gpugov.daemon.lockstate import LockState

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    LockState(tmp_path, pid=999_999_999).record_power_limit(
        fake.gpus[1].uuid, "1", 700_000, 300_000
    )
    fake.gpus[1].power_limit_mw = 300_000
    fake.fail("nvmlDeviceResetGpuLockedClocks", 3, times=None)  # NVML_ERROR_NOT_SUPPORTED
    assert node_cli.main(["reset-clocks", "--gpus", "1"]) == 6
    assert fake.gpus[1].power_limit_mw == 700_000
    assert "700 W before; restored" in capsys.readouterr().out
    assert LockState(tmp_path).get_power_limit(fake.gpus[1].uuid) is None


def test_reset_clocks_through_a_backend_that_sets_no_power_limit_names_the_one_left(
    tmp_path: Path,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``reset-clocks --config`` of a split-mode node (its backend resets clocks and sets
    no power limit) said the GPU was reset, exit 0, with a power limit a killed run
    recorded left capped: it is named, with the command that restores it, exit 6."""
    from gpugov.daemon import reset_clocks
    from gpugov.daemon.lockstate import LockState

    class ClocksOnly:  # what the actuator's or an emulated GPU's backend offers
        label, uuid = "0", fake.gpus[0].uuid

        def reset_clocks(self) -> None:
            fake.gpus[0].locked = None

        def close(self) -> None:
            pass

    monkeypatch.setattr(reset_clocks, "open_backend", lambda *args, **kwargs: ClocksOnly())
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    LockState(tmp_path, pid=999_999_999).record_power_limit(
        fake.gpus[0].uuid, "0", 700_000, 300_000
    )
    config = tmp_path / "node.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[[domains]]\nname = "x"\ngpus = [0]\n')
    assert node_cli.main(["reset-clocks", "--config", str(config), "--gpus", "0"]) == 6
    captured = capsys.readouterr()
    err = captured.err
    # Its clock lock was reset: said so, and the GPU is not called possibly still locked
    # (it was named 'NOT reset' and 'they may still be locked').
    assert "GPU 0: SM clock lock reset" in captured.out and fake.gpus[0].locked is None
    assert "may still be locked" not in err and "NOT reset" not in err
    assert err.strip().splitlines()[-1] == (
        "gpugov: error: 1 of 1 GPU(s) keep a power limit gpugov set: 0; they may still be capped"
    )
    assert (
        "GPU 0: power limit NOT restored: its power limit, which a gpugov run set (700 W "
        "before), is not restored" in err
    )
    assert "`gpugov reset-clocks --config FILE --backend nvml --gpus 0` as root" in err
    assert "`nvidia-smi -i 0 -pl 700`" in err
    assert LockState(tmp_path).get_power_limit(fake.gpus[0].uuid) is not None  # kept


def test_status_refuses_an_engine_url_with_credentials(
    fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--engine-url http://USER:PASSWORD@HOST/...``: the credentials were dropped from
    the request (a 401 said "reachable, but answered with an error") and the password
    printed. Refused in one line naming the flag, the password not echoed, as the
    config's engine.url is."""
    code = node_cli.main(["status", "--engine-url", "http://gpugov:s3cret@127.0.0.1:9/metrics"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gpugov: error: --engine-url: cannot hold credentials"), err
    assert "s3cret" not in err and err.count("\n") == 1


def test_status_on_a_node_whose_driver_lists_no_gpu_says_so_and_exits_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """NVML answers but lists no GPU (a container that sees none, every GPU off the bus):
    status said only "may lock clocks: yes" and exited 0, as if the node were ready."""
    node_commands_on(monkeypatch, FakeNvml(0))
    assert node_cli.main(["status"]) == 4
    captured = capsys.readouterr()
    assert "GPUs: unavailable: NVML lists no GPU on this node" in captured.out
    (line,) = captured.err.splitlines()
    assert line == "gpugov: error: GPUs unavailable: NVML lists no GPU on this node"
    assert node_cli.main(["status", "--json"]) == 4
    assert json.loads(capsys.readouterr().out)["gpu_error"] == "NVML lists no GPU on this node"


def test_status_tells_an_engine_that_answers_badly_from_an_unreachable_one(
    fake: FakeNvml, metrics_server: MetricsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """HTTP 500 and a page that is not metrics came from an engine that answered: status
    said "unreachable" for both. Refused is unreachable."""
    url = metrics_server.url
    metrics_server.page = "<html>not metrics {{{\n"
    assert node_cli.main(["status", "--engine-url", url]) == 0
    out = capsys.readouterr().out
    assert (
        f"engine {url}: reachable, but its answer is not a metrics page gpugov can read: "
        f"{url}: the page is HTML, not Prometheus text" in out
    )
    metrics_server.status = 500
    assert node_cli.main(["status", "--engine-url", url]) == 0
    out = capsys.readouterr().out
    assert (
        f"engine {url}: reachable, but answered with an error: "
        f"{url}: HTTP 500 Internal Server Error\n" in out
    )
    assert node_cli.main(["status", "--json", "--engine-url", url]) == 0
    engine = json.loads(capsys.readouterr().out)["engines"][0]
    assert (engine["reachable"], engine["answer"]) == (True, "http_error")
    metrics_server.close()
    assert node_cli.main(["status", "--engine-url", url]) == 0
    assert f"engine {url}: unreachable: {url}: connection refused" in capsys.readouterr().out


def test_status_reads_a_configured_engine_as_run_does(
    fake: FakeNvml,
    metrics_server: MetricsServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """status reads a domain's engine with the config's page limit (and deadline), as run
    does: with its own defaults it called a page run refuses readable."""
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    config = _config(tmp_path, metrics_server.url)
    config.write_text(config.read_text() + "max_page_bytes = 1024\n")
    assert node_cli.main(["status", "--json", "--config", str(config)]) == 0
    (engine,) = json.loads(capsys.readouterr().out)["engines"]
    assert (engine["reachable"], engine["answer"]) == (True, "not_a_metrics_page")
    assert "over the 1024-byte limit" in engine["error"]


def test_status(
    fake: FakeNvml, metrics_server: MetricsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics_server.page = fixture_text("sglang_real.txt")
    assert node_cli.main(["status", "--engine-url", metrics_server.url]) == 0
    out = capsys.readouterr().out
    assert "may lock clocks:" in out
    assert "GPU 0: NVIDIA H100 80GB HBM3 GPU-fake-0000; supported 345-1980 MHz" in out
    assert "reachable (sglang, 2826 waiting, 162 running)" in out
    metrics_server.down = True
    assert node_cli.main(["status", "--json", "--engine-url", metrics_server.url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"][1]["supported_clock_count"] == 110
    assert report["engines"][0]["reachable"] is False
    fake.driver_loaded = False
    assert node_cli.main(["status"]) == 4
    assert "unavailable" in capsys.readouterr().out


def test_status_shows_what_a_gpugov_run_recorded_it_holds(
    fake: FakeNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A clock lock and a power limit a run recorded in the state directory (here one that
    is gone) are shown under their GPU, and in ``--json`` as ``held_by_gpugov``; a GPU
    with no record shows none."""
    from gpugov.daemon.lockstate import LockState

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    dead = 2**22 + 12345  # above the default pid_max: no such process
    state = LockState(tmp_path, pid=dead)
    uuid = fake.gpus[1].uuid
    state.record(uuid, "1", 1410, 1410)
    state.record_power_limit(uuid, "1", 700_000, 300_000)
    assert node_cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert (
        f"  held by a gpugov run (pid {dead}, not running: its next start or `gpugov "
        "reset-clocks` undoes it): clock lock 1410-1410 MHz; power limit 300 W (700 W before)"
    ) in out
    assert out.count("held by a gpugov run") == 1
    assert node_cli.main(["status", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert gpus[0]["held_by_gpugov"] is None
    assert gpus[1]["held_by_gpugov"] == {
        "clock_lock_mhz": [1410, 1410],
        "power_limit_w": 300.0,
        "power_limit_before_w": 700.0,
        "pid": dead,
        "running": False,
    }


def test_status_names_the_gpugov_governing_a_gpu_now(
    fake: FakeNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A GPU a running gpugov holds (one governor per GPU) is shown with that governor's
    pid, and in ``--json`` as ``governed_by``; status itself holds nothing."""
    import os

    from gpugov.daemon.gpu_hold import hold_gpu, release

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    governor = hold_gpu(fake.gpus[1].uuid, "nvml", named="1")
    try:
        assert node_cli.main(["status"]) == 0
        out = capsys.readouterr().out
        assert node_cli.main(["status", "--json"]) == 0
        gpus = json.loads(capsys.readouterr().out)["gpus"]
    finally:
        release([governor] if governor is not None else [])
    assert f"  governed now by gpugov (pid {os.getpid()} (" in out
    assert out.count("governed now by gpugov") == 1
    assert gpus[0]["governed_by"] is None
    assert gpus[1]["governed_by"].startswith(f"pid {os.getpid()} (")
    # Status held nothing: the GPU can be held once the governor let it go.
    again = hold_gpu(fake.gpus[1].uuid, "nvml", named="1")
    release([again] if again is not None else [])


def test_status_shows_the_gpus_beside_a_newer_gpugov_s_lock_record(
    fake: FakeNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A record a newer gpugov wrote, which a start refuses, is named in one line (and
    ``lock_record_error``) while the GPUs are shown: status is where to check them."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    record, text = _newer_record(tmp_path)
    assert node_cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"lock record: not read: {record}: lock record version 2, newer" in out
    assert "GPU 0: " in out and "GPU 1: " in out and "held by" not in out
    assert node_cli.main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "version 2" in report["lock_record_error"] and len(report["gpus"]) == 2
    assert record.read_text() == text


def test_status_without_access_to_the_state_directory_shows_no_record(
    fake: FakeNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """gpugov.service keeps its state directory 0700: ``status`` run by another user
    cannot look in it and shows no record, not a traceback."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    real_exists = Path.exists

    def exists(self: Path, *args: Any, **kwargs: Any) -> bool:
        if self.parent == tmp_path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    assert node_cli.main(["status", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert [gpu["held_by_gpugov"] for gpu in gpus] == [None] * len(gpus)


def test_may_lock_clocks_reads_capabilities(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t0000000000200000\n")
    assert status_cli.may_lock_clocks(status)
    status.write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    assert not status_cli.may_lock_clocks(status)


def test_run_simulate_virtual_record_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "rec.jsonl"
    argv = [
        "run",
        "--simulate",
        "--virtual",
        "--duration",
        "60",
        "--controller",
        "reactive",
        "--metrics-address",
        "127.0.0.1:0",
        "--record",
        str(record),
    ]
    assert node_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "gpugov run --simulate: reactive on h100-sxm-llama3-8b" in out
    for row in (
        "energy per output token",
        "TTFT p50 / p95 / p99",
        "SLO attainment",
        "clock changes",
        "daemon:",
    ):
        assert row in out
    assert f"wrote {record}" in out
    assert node_cli.main(["replay", str(record), "--controller", "max"]) == 0
    out = capsys.readouterr().out
    assert "through 'max'" in out and "differing ticks" in out
    assert node_cli.main(["replay", str(tmp_path / "nope.jsonl"), "--controller", "max"]) == 2


def test_a_run_that_spent_more_than_the_maximum_clock_says_more() -> None:
    """The demo's last line said "-0.7% less energy" for a governor that spent more."""
    from types import SimpleNamespace

    from synthetic import make_plant

    from gpugov.daemon.run_simulated import _against_maximum
    from gpugov.plant.types import Request

    plant = make_plant()
    workload = [Request(i, 0.5 * i, 800, 60) for i in range(40)]
    # The maximum clock's own run, then a run that spent a tenth more and a tenth less.
    probe = _against_maximum(
        SimpleNamespace(metrics=SimpleNamespace(energy_j=1.0, slo_attainment=1.0)),
        workload,
        plant,
        0,
    )
    reference_kj = float(probe.split(" vs ", 1)[1].split(" kJ", 1)[0])
    for factor, words in ((2.0, "% more energy ("), (0.5, "% less energy (")):
        run = SimpleNamespace(
            metrics=SimpleNamespace(energy_j=factor * reference_kj * 1e3, slo_attainment=1.0)
        )
        line = _against_maximum(run, workload, plant, 0)
        share = float(line.split("on the same trace: ", 1)[1].split("%", 1)[0])
        assert words in line and 40.0 < share < 110.0, line  # a positive share, its word


def test_run_simulate_defaults_to_mpc_online_with_the_slo_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's command: ``mpc-online`` (no profile) every 0.25 s under a 99 % target,
    its saving against the maximum clock printed; its recording replays exactly, the
    target included (a replay without it would decide otherwise)."""
    record = tmp_path / "online.jsonl"
    argv = ["run", "--simulate", "--virtual", "--duration", "40", "--quiet"]
    argv += ["--metrics-address", "none", "--record", str(record)]
    assert node_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "controller mpc-online every 0.25 s, SLO target 99%" in out
    line = next(x for x in out.splitlines() if "against the maximum clock" in x)
    saved = float(line.split(":", 1)[1].split("%", 1)[0])
    assert 0.0 < saved < 100.0
    header = json.loads(record.read_text().splitlines()[0])
    domain = header["domains"][0]
    assert domain["slo_target"] == {"attainment": 0.99, "window_s": 600.0}
    assert domain["gpu_names"] == ["NVIDIA H100 SXM5 80GB HBM3"]  # the profile's GPU
    assert node_cli.main(["replay", str(record), "--controller", "mpc-online"]) == 0
    assert "differing ticks     0 (0.0 %)" in capsys.readouterr().out
    domain["slo_target"] = {"attainment": 2.0, "window_s": 600.0}
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([json.dumps(header), *record.read_text().splitlines()[1:]]) + "\n")
    assert node_cli.main(["replay", str(broken), "--controller", "mpc-online"]) == 2
    assert "slo_target" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--slo-target", "none"], "controller mpc-online every 0.25 s, SLO target none"),
        (["--controller", "reactive"], "controller reactive every 1 s, SLO target 99%"),
    ],
)
def test_run_simulate_period_and_target_follow_the_flags(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--simulate", "--virtual", "--duration", "10", "--quiet"]
    assert node_cli.main([*argv, "--metrics-address", "none", *flags]) == 0
    assert expected in capsys.readouterr().out


@pytest.mark.parametrize("value", ["1.5", "0", "1", "nan", "x"])
def test_run_simulate_refuses_a_bad_slo_target(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert node_cli.main(["run", "--simulate", "--slo-target", value]) == 2
    err = capsys.readouterr().err
    assert "--slo-target" in err and len(err.strip().splitlines()) == 1


def test_nvidia_smi_reset_all_uses_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(
        reset_clocks, "run_command", lambda argv, timeout: calls.append(list(argv)) or ""
    )
    assert node_cli.main(["reset-clocks", "--backend", "nvidia-smi"]) == 0
    assert calls == [["nvidia-smi", "--reset-gpu-clocks"]]


def test_mpc_recording_replays_through_the_same_mpc_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "mpc.jsonl"
    argv = [
        "run",
        "--simulate",
        "--controller",
        "mpc",
        "--virtual",
        "--duration",
        "40",
        "--metrics-address",
        "none",
        "--record",
        str(record),
    ]
    assert node_cli.main(argv) == 0
    capsys.readouterr()
    assert node_cli.main(["replay", str(record), "--controller", "mpc"]) == 0
    out = capsys.readouterr().out
    assert "through 'mpc'" in out
    assert "differing ticks     0 (0.0 %)" in out


def test_a_recording_on_a_profile_file_replays_through_mpc_on_that_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recording named its profile by the manifest's stem only, which replay then
    looked up as a bundled name: ``mpc`` was refused as an unknown profile, with no word
    of ``--profile``."""
    from gpugov.plant.synthetic_profiles import write_synthetic_profile

    manifest = write_synthetic_profile("narrow-clocks", tmp_path / "boards")
    record = tmp_path / "mpc.jsonl"
    argv = ["run", "--simulate", "--profile", str(manifest), "--controller", "mpc"]
    argv += ["--virtual", "--duration", "10", "--metrics-address", "none"]
    assert node_cli.main([*argv, "--record", str(record)]) == 0
    capsys.readouterr()
    assert node_cli.main(["replay", str(record), "--controller", "mpc"]) == 0
    out = capsys.readouterr().out
    assert "differing ticks     0 (0.0 %)" in out
    # Moved away: one line that names the file and --profile.
    moved = tmp_path / "elsewhere"
    (tmp_path / "boards").rename(moved)
    assert node_cli.main(["replay", str(record), "--controller", "mpc"]) == 2
    err = capsys.readouterr().err
    assert str(manifest) in err and "--profile" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_watchdog_rejects_a_period_it_would_kill() -> None:
    from gpugov.daemon.loop import SystemdNotify

    notify = SystemdNotify(notifier=None, environ={"WATCHDOG_USEC": "30000000"})
    notify.check_period(10.0)
    with pytest.raises(ValueError, match="WatchdogSec=30s"):
        notify.check_period(20.0)
    SystemdNotify(notifier=None, environ={}).check_period(59.0)


@pytest.mark.parametrize(
    "flags",
    [["--duration", "3"], ["--floor", "1900"], ["--controller", "max"], ["--speed", "2"]],
    ids=["duration", "floor", "controller", "speed"],
)
def test_a_node_run_refuses_the_simulated_runs_flags(
    tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # --duration, --floor and --controller were ignored: the node ran on, unfloored, with
    # its config's controller.
    path = tmp_path / "gpugov.toml"
    path.write_text("[[domains]]\nname = 'llm'\ngpus = [0]\n")
    assert node_cli.main(["run", "--config", str(path), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flags[0] in err[0] and "only with --simulate" in err[0]


@pytest.mark.parametrize(
    "name", ["SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPWR", "SIGRTMIN+3"]
)
def test_a_stop_signal_before_the_daemon_handles_signals_ends_the_start_cleanly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A signal the daemon stops on, while `gpugov run` still imports and reads its
    config (before the daemon installs its own handling and opens a GPU), is the stop it
    asks for: one line naming it, exit 0 (it was a kill with no line; SIGTERM alone was
    handled). The process's own handling is put back after."""
    import os
    import signal

    from gpugov import cli

    base, _, offset = name.partition("+")
    signum = int(getattr(signal, base)) + int(offset or 0)

    def stopped_while_importing(command: str | None = None) -> object:
        os.kill(os.getpid(), signum)
        raise AssertionError(f"the {name} handler should have ended the start")

    monkeypatch.setattr(cli, "build_parser", stopped_while_importing)
    before = signal.getsignal(signum)
    assert cli.main(["run", "--config", "node.toml"]) == 0
    assert capsys.readouterr().err.strip() == (
        f"gpugov: stopped ({name}) before the start; no GPU was touched"
    )
    assert signal.getsignal(signum) is before


def test_a_stop_during_the_start_ends_it_before_the_loop(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A SIGTERM while the daemon opens its GPUs (its handling installed) ends the start:
    no "locking clocks" line, no tick, exit 0."""
    import logging

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    sigterm_once_open(monkeypatch)
    with caplog.at_level(logging.INFO):
        assert node_cli.main(["run", "--config", str(_config(tmp_path, metrics_server.url))]) == 0
    text = caplog.text
    assert "stopped during the start, before the first tick" in text
    assert "locking clocks" not in text
    assert fake.writes == []


def _start_on_gpu_0_and_stop(
    tmp_path: Path,
    state_dir: Path,
    metrics_server: MetricsServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A start of a config governing GPU 0 alone (state in ``state_dir``), stopped by a
    SIGTERM once its GPUs are open and reconciled; it exits 0."""
    import logging

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{state_dir}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
    )
    sigterm_once_open(monkeypatch)
    with caplog.at_level(logging.INFO):
        assert node_cli.main(["run", "--config", str(config)]) == 0


def _killed_run_on_gpus_0_and_1(fake: FakeNvml, state_dir: Path) -> None:
    """A run that locked GPUs 0 and 1 at 1410 MHz (its lock record in ``state_dir``) and
    was SIGKILLed: nothing reset."""
    from gpugov.daemon.actuator import ClockActuator
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend

    killed = ClockActuator(
        [NvmlBackend(i, nvml=fake) for i in range(2)], state=LockState(state_dir, pid=1)
    )
    killed.apply(1410)


def test_a_lock_a_killed_run_left_on_a_gpu_no_longer_configured_is_reset(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run on GPUs 0 and 1 is killed; the next start governs GPU 0 only. GPU 1's lock
    (recorded in the state directory) is reset too: reconcile saw only the configured
    GPUs, and GPU 1 stayed locked low with its record kept."""

    from gpugov.daemon.lockstate import LockState

    state_dir = tmp_path / "state"
    _killed_run_on_gpus_0_and_1(fake, state_dir)
    assert fake.locked(1) == (1410, 1410)
    LockState(state_dir, pid=1).record("GPU-gone", "7", 900, 900)  # a GPU since removed
    _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    assert fake.locked(0) is None and fake.locked(1) is None
    # The GPU that is gone keeps its record, named in one line with the command to run.
    assert set(LockState(state_dir).read()) == {"GPU-gone"}
    lines = [r.getMessage() for r in caplog.records if "not in this config" in r.getMessage()]
    (reset,) = [line for line in lines if "GPU 1 " in line]
    assert reset.startswith("reconcile: GPU 1 (GPU-fake-0001), not in this config")
    assert "left it locked at 1410-1410 MHz; reset" in reset
    (gone,) = [line for line in lines if "GPU 7 " in line]
    assert "not reset" in gone and "gpugov reset-clocks --gpus 7" in gone
    assert "\n" not in gone and "Traceback" not in caplog.text


def test_a_left_lock_on_a_gpu_another_governor_holds_now_is_left_to_it(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run on GPUs 0 and 1 is killed; another governor (its own state directory) has
    taken GPU 1 since, and this one's next start governs GPU 0 only. GPU 1's lock is that
    governor's: the start reset it, undoing the other's clock. It is left, named with the
    holder, and the stale record dropped."""
    import os

    from gpugov.daemon.gpu_hold import hold_gpu, release
    from gpugov.daemon.lockstate import LockState

    state_dir = tmp_path / "state"
    _killed_run_on_gpus_0_and_1(fake, state_dir)
    other = hold_gpu("GPU-fake-0001", "nvml", named="1")  # the other governor, running
    try:
        _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    finally:
        release([other] if other is not None else [])
    assert fake.locked(0) is None
    assert fake.locked(1) == (1410, 1410)  # the other governor's lock stands
    assert LockState(state_dir).read() == {}
    (line,) = [r.getMessage() for r in caplog.records if "GPU 1 (" in r.getMessage()]
    assert line.startswith("reconcile: GPU 1 (GPU-fake-0001), not in this config")
    assert f"not reset: another gpugov on this node governs it now (pid {os.getpid()} (" in line
    assert line.endswith("), and the lock is its own; record dropped")


def test_a_lock_left_on_a_gpu_moved_to_another_index_since_is_reset_where_it_is(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run on GPUs 0 to 2 is killed; GPU 1 is then taken off the node, so the GPU that
    was 2 is 1 now, and the next start governs GPU 0 only. The lock left on it is found by
    its UUID and reset: opened by the index recorded (2, no GPU now), it stayed locked
    low, the line sending the operator to reset a GPU 2 the node no longer has."""
    import fake_pynvml as fp

    from gpugov.daemon.actuator import ClockActuator
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend

    fake.gpus.append(fp.FakeGpu(index=2))
    state_dir = tmp_path / "state"
    killed = ClockActuator([NvmlBackend(2, nvml=fake)], state=LockState(state_dir, pid=1))
    killed.apply(1410)  # ... and the process is SIGKILLed: nothing reset
    moved = fake.gpus.pop(2)
    fake.gpus[1] = moved  # GPU 1 removed: GPU-fake-0002 is GPU 1 now
    moved.index = 1
    _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    assert moved.locked is None
    assert LockState(state_dir).read() == {}
    (line,) = [r.getMessage() for r in caplog.records if "(GPU-fake-0002)" in r.getMessage()]
    assert line.startswith("reconcile: GPU 1 (GPU-fake-0002), not in this config"), line
    assert line.endswith("; reset"), line


def test_a_lock_a_killed_run_left_on_a_lost_gpu_no_longer_configured_names_no_command(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run on GPUs 0 and 1 is killed, GPU 1 falls off the bus, and the next start
    governs GPU 0 only. GPU 1's line named `gpugov reset-clocks --gpus 1`, which fails on a
    lost GPU as the reset did; it now says that no command reaches it, and the record is
    kept (the driver reload or reboot it needs clears the lock, and the start after it
    finds what is left)."""
    from gpugov.daemon.lockstate import LockState

    state_dir = tmp_path / "state"
    _killed_run_on_gpus_0_and_1(fake, state_dir)
    fake.lose(1)
    _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    assert fake.locked(0) is None
    assert set(LockState(state_dir).read()) == {"GPU-fake-0001"}
    lines = [r.getMessage() for r in caplog.records if "not in this config" in r.getMessage()]
    (lost,) = [line for line in lines if "GPU 1 " in line]
    assert "reset-clocks" not in lost, lost
    assert "GPU is lost" in lost and "no command reaches a lost GPU" in lost, lost


def test_a_power_limit_a_killed_run_left_on_a_gpu_no_longer_configured_is_restored(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run capped GPUs 0 and 1 and was killed; the next start governs GPU 0 only. GPU
    1's power limit (recorded in the state directory) is restored too: it stayed capped,
    its record kept, where only `gpugov reset-clocks` restored it."""

    from gpugov.daemon.lockstate import LockState

    state_dir = tmp_path / "state"
    killed = LockState(state_dir, pid=1, write_deadline_s=60.0)  # on disk, however loaded
    for index in (0, 1):
        killed.record_power_limit(fake.gpus[index].uuid, str(index), 700_000, 300_000)
        fake.gpus[index].power_limit_mw = 300_000
    killed.record_power_limit("GPU-gone", "7", 700_000, 300_000)  # a GPU since removed
    _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    assert fake.gpus[0].power_limit_mw == 700_000 and fake.gpus[1].power_limit_mw == 700_000
    assert ("nvmlDeviceSetPowerManagementLimit", 1, 700_000) in fake.writes
    # The GPU that is gone keeps its record, named in one line with the command to run.
    assert set(LockState(state_dir).power_limits()) == {"GPU-gone"}
    messages = [r.getMessage() for r in caplog.records]
    assert any("GPU 1: a previous gpugov run" in m and m.endswith("restored") for m in messages)
    (gone,) = [m for m in messages if "GPU 7 (GPU-gone)" in m]
    assert "not restored" in gone and "gpugov reset-clocks --gpus 7" in gone
    assert "\n" not in gone and "Traceback" not in caplog.text


def test_a_power_limit_left_on_a_gpu_governed_through_a_backend_that_sets_none_is_named(
    tmp_path: Path, metrics_server: MetricsServer, fake: FakeNvml
) -> None:
    """A run capped GPU 0 through NVML and was killed; the next start governs it in the
    split mode (``backend = "actuator"``, which sets no power limit). No domain restores
    the limit and the start passed over it without a word: the GPU stayed capped. One
    line now names it with the command that restores it, and the entry is kept for it."""
    from gpugov.daemon.config import parse_config
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.loop import ResetAdvice
    from gpugov.daemon.reconcile import reset_left_locks
    from gpugov.daemon.service import domains_from_config

    state_dir = tmp_path / "state"
    LockState(state_dir, pid=1).record_power_limit(fake.gpus[0].uuid, "0", 700_000, 300_000)
    fake.gpus[0].power_limit_mw = 300_000
    config = parse_config(
        {
            "daemon": {
                "state_dir": str(state_dir),
                "metrics_address": "",
                "backend": "actuator",
                "actuator": {"socket": str(tmp_path / "none.sock")},
            },
            "domains": [
                {"name": "llm", "gpus": [0], "engine": {"kind": "vllm", "url": metrics_server.url}}
            ],
        }
    )
    assembled = domains_from_config(config)
    advice = ResetAdvice("actuator", str(tmp_path / "gpugov.toml"))
    try:
        lines = reset_left_locks(config, assembled, advice=advice)
    finally:
        assembled.close()
    (line,) = lines
    assert line.startswith(f"GPU 0 ({fake.gpus[0].uuid}): a previous gpugov run (pid 1, ")
    assert "set its power limit to 300 W, 700 W before; not restored" in line
    assert 'backend = "actuator" sets no power limit' in line
    assert line.endswith(
        f"run `gpugov reset-clocks --config {tmp_path}/gpugov.toml --backend nvml --gpus 0` as "
        "root (it restores the recorded limit) or `nvidia-smi -i 0 -pl 700`"
    )
    assert set(LockState(state_dir).power_limits()) == {fake.gpus[0].uuid}


@pytest.mark.parametrize("hung", ["nvmlDeviceGetUUID", "nvmlDeviceResetGpuLockedClocks"])
def test_a_hung_call_on_a_gpu_no_longer_configured_costs_the_start_one_deadline(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    safety: list[Any],
    hung: str,
) -> None:
    """The GPUs a killed run left locked and this config no longer governs were opened and
    reset on the start's thread with no deadline: one NVML call hung in the driver (the
    open, the reset) held the start for as long as it hung. Each is now waited for at
    most its deadline, and the GPU is named as not reset, with the command to run."""
    import time

    from hung_support import DEADLINE_S, HungCall

    from gpugov.daemon.actuator import ClockActuator
    from gpugov.daemon.config import parse_config
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend
    from gpugov.daemon.reconcile import reset_left_locks
    from gpugov.daemon.service import domains_from_config

    state_dir = tmp_path / "state"
    killed = ClockActuator(
        [NvmlBackend(i, nvml=fake) for i in range(2)], state=LockState(state_dir, pid=1)
    )
    killed.apply(1410)  # ... and the process is SIGKILLed: nothing reset
    config = parse_config(
        {
            "daemon": {"state_dir": str(state_dir), "metrics_address": ""},
            "domains": [
                {"name": "llm", "gpus": [0], "engine": {"kind": "vllm", "url": metrics_server.url}}
            ],
        }
    )
    call = HungCall(fake, hung, index=1)
    safety.append(call)
    assembled = domains_from_config(config)
    try:
        started = time.monotonic()
        lines = reset_left_locks(config, assembled, deadline_s=DEADLINE_S)
        took_s = time.monotonic() - started
    finally:
        assembled.close()
    assert took_s < 10 * DEADLINE_S and call.blocked.is_set()
    (line,) = lines
    assert line.startswith("GPU 1 (GPU-fake-0001), not in this config")
    assert f"has not finished within {DEADLINE_S:g} s: a hung GPU call" in line
    assert line.endswith("run `gpugov reset-clocks --gpus 1`")
    assert "GPU-fake-0001" in LockState(state_dir).read()  # kept for the command


def test_a_restart_with_the_killed_runs_pid_undoes_what_it_left(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A container's ``gpugov run`` is pid 1 again after an OOM kill: the next start's pid
    is the killed run's. Its records were taken as this run's own and skipped: GPU 0's
    power limit stayed at 300 W (read as its limit before gpugov from then on), its lock
    (idle under a cap, so the clocks show none) and GPU 1's lock and limit stayed."""
    import os

    from gpugov.daemon.actuator import ClockActuator
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend

    state_dir = tmp_path / "state"
    killed = LockState(state_dir, pid=os.getpid(), write_deadline_s=60.0)  # on disk
    ClockActuator([NvmlBackend(0, nvml=fake)], state=killed, lock_mode="cap").apply(900)
    ClockActuator([NvmlBackend(1, nvml=fake)], state=killed).apply(1410)
    for index in (0, 1):
        killed.record_power_limit(fake.gpus[index].uuid, str(index), 700_000, 300_000)
        fake.gpus[index].power_limit_mw = 300_000
    # ... and the process is SIGKILLed. GPU 0 idles at its lowest clock under its cap.
    fake.gpus[0].sm_clock_mhz, fake.gpus[0].event_reasons = 345, 0x1
    _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    assert fake.locked(0) is None and fake.locked(1) is None
    assert [gpu.power_limit_mw for gpu in fake.gpus] == [700_000, 700_000]
    assert LockState(state_dir).read() == {} and LockState(state_dir).power_limits() == {}
    messages = [r.getMessage() for r in caplog.records]
    previous = f"a previous gpugov run (pid {os.getpid()}"
    assert any(m.startswith("reconcile: GPU 0: " + previous) for m in messages)
    assert any("left it locked at 345-900 MHz" in m and m.endswith("; reset") for m in messages)
    assert any("GPU 1 (GPU-fake-0001), not in this config" in m for m in messages)


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 0), ("SIGINT", 130)])
def test_a_stop_while_a_gpu_open_is_retried_ends_the_retries(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sig: str,
    code: int,
) -> None:
    """A stop signal while NVML keeps failing transiently at start (retried with waits
    that double) ends the start at once: a clean stop, no more attempts. It was ignored:
    every GPU's retries ran out (seconds each, past a unit's stop timeout on a large node)
    and the run then failed with the NVML error."""
    import logging
    import os
    import signal

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    fake.fail("nvmlInit", fake.NVML_ERROR_UNKNOWN, times=None)
    real_init = fake.nvmlInit

    def init_then_stopped() -> None:
        os.kill(os.getpid(), getattr(signal, sig))  # lands during the first failed open
        real_init()

    monkeypatch.setattr(fake, "nvmlInit", init_then_stopped)
    with caplog.at_level(logging.INFO):
        assert (
            node_cli.main(["run", "--config", str(_config(tmp_path, metrics_server.url))]) == code
        )
    assert fake.calls["nvmlInit"] == 1  # no retry after the stop
    assert "stopped during the start, before the first tick" in caplog.text
    assert "locking clocks" not in caplog.text
    assert fake.writes == []


def test_a_stop_during_the_controllers_warm_up_is_not_called_a_wedged_driver(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A SIGTERM while the controller warms up (``mpc-online``'s first start compiles its
    search: seconds, no GPU call) ends the start without waiting for it, as a stop during
    a hung GPU call does. Its line said a GPU call had not returned, ``a wedged
    driver?``, sending an operator after a healthy driver; it names the warm-up now."""
    import logging
    import os
    import signal
    import threading

    import gpugov.daemon.service as service

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    release = threading.Event()

    def stopped_while_warming(*args: Any, **kwargs: Any) -> float:
        os.kill(os.getpid(), signal.SIGTERM)
        release.wait(30)  # a long compile: the start ends without it
        return 0.0

    monkeypatch.setattr(service, "warm_up", stopped_while_warming)
    try:
        with caplog.at_level(logging.INFO):
            assert (
                node_cli.main(["run", "--config", str(_config(tmp_path, metrics_server.url))]) == 0
            )
    finally:
        release.set()
    assert (
        "stopped during the start, before the first tick (domain llm's controller was being "
        "built and warmed up); nothing was locked"
    ) in caplog.text
    assert "wedged driver" not in caplog.text and "locking clocks" not in caplog.text
    assert fake.writes == []


@pytest.mark.parametrize(
    ("flag", "config_address", "message"),
    [
        (["--metrics-address", "127.0.0.1:99999"], "", "--metrics-address must be HOST:PORT"),
        (["--metrics-address", "nothing"], "", "--metrics-address must be HOST:PORT"),
        ([], "999.1.1.1:9400", "daemon.metrics_address: names no IP address"),
        ([], "nosuchhost.invalid:9400", "daemon.metrics_address: cannot serve metrics on"),
    ],
    ids=["port", "no-port", "config-ip", "config-name"],
)
def test_run_refuses_a_bad_metrics_address_before_opening_a_gpu(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: list[str],
    config_address: str,
    message: str,
) -> None:
    # It was refused only after reconcile had opened the GPUs and reset a leftover lock.
    path = _config(tmp_path, "http://127.0.0.1:1/metrics")
    path.write_text(
        path.read_text().replace('metrics_address = ""', f'metrics_address = "{config_address}"')
    )

    def opened(*args: object, **kwargs: object) -> None:
        raise AssertionError("the GPUs were opened")

    monkeypatch.setattr(node_cli, "domains_from_config", opened)
    assert node_cli.main(["run", "--config", str(path), "--dry-run", *flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpugov: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("gpus", ["0,0", "0,1,0", "GPU-aaaa,GPU-aaaa"])
def test_reset_clocks_refuses_a_gpu_named_twice(
    fake: FakeNvml, capsys: pytest.CaptureFixture[str], gpus: str
) -> None:
    # --gpus 0,0 reset GPU 0 twice.
    assert node_cli.main(["reset-clocks", "--gpus", gpus]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpugov: error: --gpus: GPU ") and "named twice" in err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["reset-clocks", "--gpus", "0", "--gpus", "1"],
            "reset-clocks: --gpus given twice ('0', then '1'); give it once",
        ),
        (
            ["run", "--config", "a.toml", "--config=b.toml"],
            "run: --config given twice ('a.toml', then 'b.toml'); give it once",
        ),
        (
            ["run", "--simulate", "--period", "1", "--control-period", "2"],
            "run: --period 1.0 and --control-period 2.0 set the same thing; give one",
        ),
        (
            ["model", "export", "--out", "a", "--out", "b"],
            "model export: --out given twice ('a', then 'b'); give it once",
        ),
    ],
)
def test_a_flag_given_twice_with_two_values_is_refused_before_any_work(
    argv: list[str], line: str, fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse kept the last value silently: ``reset-clocks --gpus 0 --gpus 1`` reset
    GPU 1 only and exited 0 with GPU 0 still locked."""
    fake.gpus[0].locked = (900, 900)
    assert node_cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"gpugov: error: {line} (see gpugov ")
    assert fake.writes == []


def test_a_flag_repeated_with_its_value_is_accepted(
    fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrapper that adds a flag the command line already has, with the same value,
    changes nothing; the parsed arguments carry no trace of the check."""
    assert node_cli.main(["reset-clocks", "--gpus", "1", "--gpus=1"]) == 0
    assert capsys.readouterr().out == "GPU 1: SM clock lock reset\n"
    assert fake.writes == [("nvmlDeviceResetGpuLockedClocks", 1)]
    from gpugov.cli import build_parser

    args = build_parser("status").parse_args(["status", "--backend", "nvml", "--backend", "nvml"])
    assert not any(name.startswith("_gpugov") for name in vars(args))


@pytest.mark.parametrize(
    "argv",
    [["status"], ["status", "--json"], ["reset-clocks"], ["reset-clocks", "--gpus", "0"]],
)
def test_without_a_driver_the_line_points_at_the_emulated_gpus(
    argv: list[str], fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a machine with no NVIDIA driver (a workstation, CI) the error says so and where
    to go, not only NVML's "Driver Not Loaded"."""
    fake.driver_loaded = False
    code = node_cli.main(argv)
    captured = capsys.readouterr()
    said = (
        json.loads(captured.out)["gpu_error"] if "--json" in argv else captured.out + captured.err
    )
    assert "Traceback" not in captured.err
    assert "Driver Not Loaded (NVML code 9): no NVIDIA driver on this machine" in said
    assert "gpugov emulate" in said and "--backend emulated --emulator URL" in said
    assert code == (6 if argv[-1] == "0" else 4)


@pytest.mark.parametrize("argv", [["status"], ["status", "--json"]])
def test_status_says_why_on_stderr_when_the_gpus_cannot_be_listed(
    argv: list[str], fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 4 came with nothing on stderr: the failure was only a field of the report on
    stdout. It is now also the one error line on stderr; the report stays whole."""
    fake.driver_loaded = False
    assert node_cli.main(argv) == 4
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith("gpugov: error: GPUs unavailable: ")
    assert "no NVIDIA driver on this machine" in err[0]
    if "--json" in argv:
        assert json.loads(captured.out)["gpu_error"] in err[0]
    else:
        assert "may lock clocks:" in captured.out and "GPUs: unavailable: " in captured.out


def test_reset_clocks_refuses_a_uuid_for_emulated_gpus_as_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An emulated GPU has no UUID name: ``--gpus GPU-...`` is a usage error (exit 2),
    not a GPU that "may still be locked" (exit 6), and no emulator is asked."""
    argv = ["reset-clocks", "--backend", "emulated", "--emulator", "http://127.0.0.1:9"]
    assert node_cli.main([*argv, "--gpus", "0,GPU-1234"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "gpugov: error: --gpus GPU-1234: an emulated GPU is named by its index (0, 1, ...)\n"
    )


@pytest.mark.parametrize("uuid", ["GPU-", "GPU-\x1b[2J", "MIG- 1", "GPU-" + "a" * 121])
def test_reset_clocks_refuses_a_uuid_nvml_never_prints_as_usage(
    uuid: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--gpus GPU-`` (nothing after the prefix), an escape or a space in a UUID: NVML was
    asked for it and reset-clocks ended "1 of 1 GPU(s) not reset; they may still be
    locked" (exit 6) instead of naming the flag (exit 2), as the config's gpus does."""
    assert node_cli.main(["reset-clocks", "--backend", "nvml", "--gpus", f"0,{uuid}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpugov: error: --gpus takes "), lines


def test_status_json_has_the_documented_keys(
    fake: FakeNvml, metrics_server: MetricsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The keys docs/commands.md lists for ``status --json``, on success and with no
    driver (exit 4, the object still printed, ``gpu_error`` added)."""
    assert node_cli.main(["status", "--json", "--engine-url", metrics_server.url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"backend", "may_lock_clocks", "gpus", "engines"}
    assert set(report["gpus"][0]) == {
        "index",
        "name",
        "uuid",
        "supported_clock_range_mhz",
        "supported_clock_count",
        "sm_clock_mhz",
        "power_w",
        "temperature_c",
        "utilization",
        "power_limit_w",
        "clock_event_reasons",
        "held_by_gpugov",
        "governed_by",
    }
    # The server's empty page: the engine answered, with no metrics page.
    assert set(report["engines"][0]) == {"url", "reachable", "answer", "error"}
    fake.driver_loaded = False
    assert node_cli.main(["status", "--json"]) == 4
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"backend", "may_lock_clocks", "gpus", "engines", "gpu_error"}
    assert report["gpus"] == []


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("--trace t.csv: no such file", "--trace t.csv: no such file"),  # ordinary: unchanged
        ("C:\\traces\\été 🧑\u200d💻.csv", "C:\\traces\\été 🧑\u200d💻.csv"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x1b[2J\x1b]0;title\x07", "\\x1b[2J\\x1b]0;title\\x07"),
        ("\x00\x7f\x85", "\\x00\\x7f\\x85"),
        ("abc\u202edef\u2028", "abc\\u202edef\\u2028"),  # bidi override, line separator
        ("bad\udcffbyte", "bad\\udcffbyte"),  # an undecodable byte of a file name
    ],
)
def test_printable_escapes_control_characters_only(text: str, shown: str) -> None:
    from gpugov.daemon.errors import printable

    assert printable(text) == shown


def test_fail_and_warn_print_one_escaped_line(capsys: pytest.CaptureFixture[str]) -> None:
    from gpugov.daemon.cli_support import fail, warn
    from gpugov.daemon.errors import ConfigError

    assert fail("--out a\nb: cannot write", 1) == 1
    warn("x\x1b[0m")
    assert capsys.readouterr().err == (
        "gpugov: error: --out a\\nb: cannot write\ngpugov: warning: x\\x1b[0m\n"
    )
    fail(ConfigError("f\n: a\nf\n: b", problems=["f\n: a", "f\n: b"]))
    assert capsys.readouterr().err == "gpugov: error: f\\n: a\nf\\n: b\n"


def _newer_record(directory: Path) -> tuple[Path, str]:
    """A lock record a later gpugov wrote: version 2, with a field this one lacks."""
    path = directory / "locks.json"
    text = (
        '{"version": 2, "gpus": {"GPU-0": {"gpu": "0", "min_mhz": 900, "max_mhz": 900, '
        '"pid": 999999999, "kind": "new"}}, "future": {"x": 1}}'
    )
    path.write_text(text)
    return path, text


def test_a_start_refuses_a_lock_record_of_a_newer_gpugov(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Read as version 1, a newer gpugov's record was rewritten as version 1, its fields
    dropped; the start refuses it in one line (exit 2), touching no GPU."""
    state = tmp_path / "state"
    state.mkdir()
    record, text = _newer_record(state)
    from gpugov.daemon.lockstate import LockState, NewerLockRecord

    with pytest.raises(NewerLockRecord):  # the record itself refuses (before: a daemon ran)
        LockState(state)
    config = _config(tmp_path, metrics_server.url, f'state_dir = "{state}"')
    assert node_cli.main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{record}: lock record version 2, newer than this gpugov reads (1)" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert record.read_text() == text
    assert not fake.writes


def test_reset_clocks_resets_but_leaves_a_newer_gpugov_s_lock_record(
    tmp_path: Path,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``reset-clocks`` resets the clocks (they need no record), says the start's line
    (exit 2) and does not rewrite the record as version 1."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    record, text = _newer_record(tmp_path)
    fake.gpus[0].locked = (900, 900)
    assert node_cli.main(["reset-clocks"]) == 2
    out, err = capsys.readouterr()
    assert "GPU 0: SM clock lock reset" in out and "GPU 1: SM clock lock reset" in out
    assert f"{record}: lock record version 2, newer than this gpugov reads (1)" in err
    assert len(err.strip().splitlines()) == 1
    assert record.read_text() == text


def test_status_shows_what_a_run_recorded_on_gpus_it_lists_by_index_or_not_at_all(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The nvidia-smi backend gives no UUID, and a run through it keys its lock record by
    the GPU as configured ("1"): status looked each GPU up by its UUID (None) and never
    showed a lock such a killed run left. It is shown under the GPU of that index; an
    entry no listed GPU matches (a GPU keyed by its UUID, a GPU gone) is one line of its
    own, and ``held_elsewhere`` in ``--json``."""
    from fake_nvidia_smi import FakeNvidiaSmi

    import gpugov.daemon.node_support as node_support
    import gpugov.daemon.nvidia_smi as nvidia_smi
    from gpugov.daemon.lockstate import LockState

    smi = FakeNvidiaSmi(2)
    monkeypatch.setattr(node_support, "run_command", smi)
    real = nvidia_smi.NvidiaSmiBackend
    monkeypatch.setattr(nvidia_smi, "NvidiaSmiBackend", lambda gpu: real(gpu, runner=smi))
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    dead = 2**22 + 12345  # above the default pid_max: no such process
    state = LockState(tmp_path, pid=dead)
    state.record("1", "1", 900, 900)  # what an nvidia-smi run keys GPU 1 by
    state.record("GPU-gone", "7", 600, 600)  # a GPU no longer listed
    assert node_cli.main(["status", "--backend", "nvidia-smi"]) == 0
    out = capsys.readouterr().out.splitlines()
    gpu_1 = out.index(next(line for line in out if line.startswith("GPU 1:")))
    assert out[gpu_1 + 1].startswith("  held by a gpugov run (pid ")
    assert "clock lock 900-900 MHz" in out[gpu_1 + 1]
    (gone,) = [line for line in out if "GPU-gone" in line]
    assert gone.startswith("GPU 7 (GPU-gone), matched to no GPU listed (gone, or recorded by")
    assert "does not show): held by a gpugov run" in gone
    assert "clock lock 600-600 MHz" in gone
    assert node_cli.main(["status", "--backend", "nvidia-smi", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"][0]["held_by_gpugov"] is None
    assert report["gpus"][1]["held_by_gpugov"]["clock_lock_mhz"] == [900, 900]
    (elsewhere,) = report["held_elsewhere"]
    assert elsewhere["key"] == "GPU-gone" and elsewhere["gpu"] == "7"
    assert elsewhere["clock_lock_mhz"] == [600, 600]


@pytest.mark.parametrize("how", ["not-a-file", "damaged", "directory-unreadable"])
def test_status_says_when_it_cannot_read_the_lock_record(
    fake: FakeNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    """A lock record status cannot read (a state directory or record only the daemon's
    user may read: mode 0700 or 0600; a damaged one) showed no lock at all, silently or
    under the daemon's own warning (`a crash would leave no record of the locks`), as
    if nothing were held. One line says it was not read and why; the GPUs are shown."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    if how == "not-a-file":
        (tmp_path / "locks.json").mkdir()
    elif how == "damaged":
        (tmp_path / "locks.json").write_text('{"version": 1, "gpus": {"GPU-')  # cut short
    else:
        from gpugov.daemon.lockstate import LockState

        LockState(tmp_path, pid=2**22 + 1).record(fake.gpus[0].uuid, "0", 900, 900)
        real_exists = Path.exists

        def denied(path: Path, *args: Any, **kwargs: Any) -> bool:
            if path.name == "locks.json":
                raise PermissionError(13, "Permission denied", str(path))
            return real_exists(path, *args, **kwargs)

        monkeypatch.setattr(Path, "exists", denied)
    assert node_cli.main(["status"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("lock record:")]
    assert line.startswith(f"lock record: not read: {tmp_path / 'locks.json'}: ")
    assert "not shown" in line and out.count("GPU ") >= 2
    assert "a crash would leave no record" not in caplog.text
    assert node_cli.main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "cannot read it" in report["lock_record_error"] and len(report["gpus"]) == 2


def test_a_lock_a_killed_run_recorded_by_gpu_index_is_reset_by_a_run_through_nvml(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run through a backend without UUIDs (nvidia-smi) records a GPU by the index its
    config names ("1"). Killed, and the node switched to NVML, governing GPU 0 only: the
    start opened GPU 1, found its UUID is not "1", and left it locked low ("not reset:
    GPU 1 is now GPU-..."), its record never cleared. In the same boot an index names
    one GPU: it is reset and its entry cleared."""
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend

    state_dir = tmp_path / "state"
    NvmlBackend(1, nvml=fake).lock_clocks(900, 900)  # what the killed run left
    LockState(state_dir, pid=2**22 + 7).record("1", "1", 900, 900)
    assert fake.locked(1) == (900, 900)
    _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    assert fake.locked(1) is None
    assert LockState(state_dir).read() == {}
    (line,) = [r.getMessage() for r in caplog.records if "left it locked" in r.getMessage()]
    assert "GPU 1 (recorded by its index; GPU-fake-0001)" in line and line.endswith("; reset")


def test_a_lock_recorded_by_the_index_of_a_gpu_now_governed_is_left_to_its_domain(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The index-keyed entry of a GPU this config governs (through NVML, by its UUID):
    its domain's reconcile dealt with the GPU, so it is not reset again behind it; the
    entry, which nothing else clears, is."""
    from gpugov.daemon.lockstate import LockState

    state_dir = tmp_path / "state"
    LockState(state_dir, pid=2**22 + 7).record("0", "0", 900, 900)
    _start_on_gpu_0_and_stop(tmp_path, state_dir, metrics_server, monkeypatch, caplog)
    assert LockState(state_dir).read() == {}
    (line,) = [r.getMessage() for r in caplog.records if "recorded by its index" in r.getMessage()]
    assert line.endswith("governed by this config (its domain reconciled it)")


def test_a_start_through_nvidia_smi_names_how_to_reset_a_gpu_recorded_by_uuid(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry a run through NVML keyed by UUID, found by a start through nvidia-smi
    (which gives no UUID): "not reset: GPU 1 is now 1" said nothing, and the command it
    named would not clear the entry. The line says why and names NVML's command."""
    from fake_nvidia_smi import FakeNvidiaSmi

    import gpugov.daemon.gpu_open as gpu_open
    from gpugov.daemon.config import parse_config
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvidia_smi import NvidiaSmiBackend
    from gpugov.daemon.reconcile import reset_left_locks

    smi = FakeNvidiaSmi(2)
    monkeypatch.setattr(gpu_open, "NvidiaSmiBackend", lambda gpu: NvidiaSmiBackend(gpu, runner=smi))
    state_dir = tmp_path / "state"
    LockState(state_dir, pid=2**22 + 7).record("GPU-recorded", "1", 900, 900)
    config = parse_config(
        {
            "daemon": {"backend": "nvidia-smi", "state_dir": str(state_dir)},
            "domains": [{"name": "llm", "gpus": [0], "engine": {"url": "http://127.0.0.1:1"}}],
        }
    )

    assembled = SimpleNamespace(
        state=LockState(state_dir), backends=[NvidiaSmiBackend(0, runner=smi)]
    )
    (line,) = reset_left_locks(config, assembled)  # type: ignore[arg-type]
    assert "not reset: this backend gives no UUID to tell whether GPU 1" in line
    assert line.endswith(
        "run `gpugov reset-clocks --backend nvml --gpus 1` as root (it clears the entry too)"
    )
    assert set(LockState(state_dir).read()) == {"GPU-recorded"}


@pytest.mark.parametrize(("sig", "line"), [("SIGTERM", None), ("SIGINT", "interrupted")])
def test_a_stop_during_the_start_that_leaves_a_gpu_locked_exits_6(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sig: str,
    line: str | None,
) -> None:
    """A killed run left GPU 0 locked at 1005 MHz; the next start is stopped before its
    first tick and neither reconcile's reset nor the exit's goes through. The exit said 0
    (130 and ``every clock gpugov locked was reset`` for Ctrl-C) and logged ``stopped
    during the start``, GPU 0 still locked; it is exit 6 with the line naming it, as a
    stop after the first tick says."""
    import os
    import signal

    from gpugov.daemon.actuator import ClockActuator
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend

    state_dir = tmp_path / "state"
    ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(state_dir, pid=1)).apply(1005)
    fake.fail("nvmlDeviceResetGpuLockedClocks", fake.NVML_ERROR_NOT_SUPPORTED, times=None)
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    real = node_cli.domains_from_config

    def stopped_once_open(*args: Any, **kwargs: Any) -> Any:
        assembled = real(*args, **kwargs)
        os.kill(os.getpid(), getattr(signal, sig))
        return assembled

    monkeypatch.setattr(node_cli, "domains_from_config", stopped_once_open)
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{state_dir}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
    )
    assert node_cli.main(["run", "--config", str(config)]) == 6
    assert fake.locked(0) == (1980, 1980)  # not reset, but no longer held at 1005 MHz
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpugov: error:") and "GPU(s) 0" in last, err
    assert "every clock gpugov locked was reset" not in err
    assert "GPU-fake-0000" in LockState(state_dir).read()  # kept for the next start


def test_a_dry_run_stopped_says_it_locked_nothing(
    tmp_path: Path,
    metrics_server: MetricsServer,
    fake: FakeNvml,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dry run writes nothing; its exit said ``GPU 0 clocks reset`` and ``every clock
    gpugov locked was reset``, as if it had locked them. It now says it locked none."""
    import logging
    import os
    import signal

    metrics_server.page = fixture_text("vllm_v1_real.txt")
    read = fake.nvmlDeviceGetUtilizationRates
    calls = [0]

    def utilisation(handle: Any) -> Any:
        calls[0] += 1
        if calls[0] == 6:  # a few ticks in: Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
        return read(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetUtilizationRates", utilisation)
    config = _config(tmp_path, metrics_server.url, "period_s = 0.05")
    with caplog.at_level(logging.INFO):
        assert node_cli.main(["run", "--config", str(config), "--dry-run"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "gpugov: interrupted; a dry run: no clock was locked", err
    text = caplog.text
    assert "every clock gpugov locked was reset" not in text
    assert "stopped; a dry run: no clock was locked" in text
    resets = [line for line in text.splitlines() if "clocks reset" in line]
    assert resets and all("(dry run: not written)" in line for line in resets), resets
    assert not any(write[0] == "nvmlDeviceSetGpuLockedClocks" for write in fake.writes)


def test_run_simulate_says_whether_it_went_on_from_a_kept_learned_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mpc-online`` under ``run --simulate`` keeps its learned model in the state
    directory and the next run goes on from it, as a node does: the summary says so, so
    that figures other than ``simulate``'s (which learns from none every run) have their
    reason beside them."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    argv = ["run", "--simulate", "--virtual", "--duration", "20", "--quiet"]
    argv += ["--metrics-address", "none", "--controller", "mpc-online"]
    kept = tmp_path / "online-model-sim.json"
    assert node_cli.main(argv) == 0
    first = capsys.readouterr().out
    assert f"  learned model: learned from none; kept in {kept}" in first.splitlines()
    assert kept.is_file()
    assert node_cli.main(argv) == 0
    second = capsys.readouterr().out
    assert f"  learned model: went on from the one kept in {kept}" in second.splitlines()
    monkeypatch.delenv("STATE_DIRECTORY")
    assert node_cli.main(argv) == 0
    assert "learned model" not in capsys.readouterr().out


def test_run_simulate_says_the_chain_and_view_its_controller_runs_in(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The start line states the chain's dwell and floor and the engine view beside the
    period and SLO target, as ``simulate``'s title does."""
    argv = ["run", "--simulate", "--virtual", "--duration", "5", "--quiet"]
    argv += ["--metrics-address", "none", "--controller", "reactive"]
    assert node_cli.main([*argv, "--dwell", "2", "--floor", "900"]) == 0
    assert (
        "controller reactive every 1 s, SLO target 99%, dwell 2 s, clock floor 900 MHz, "
        "vllm engine view, virtual time"
    ) in capsys.readouterr().out


def test_run_simulate_takes_simulates_latency_noise_seeded_by_its_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--latency-noise`` jitters the simulated node's iterations as ``simulate``'s does,
    seeded by ``--seed``: each seed gives the figures ``simulate`` gives with it, and two
    seeds differ. ``--seed`` took no noise to seed (``run --simulate`` had no
    ``--latency-noise``), so every seed ran the same run."""
    from gpugov.cli import main

    common = ["--virtual", "--duration", "20", "--quiet", "--controller", "reactive"]
    figures = []
    for seed in ("0", "7"):
        noise = ["--latency-noise", "0.2", "--seed", seed]
        assert (
            node_cli.main(["run", "--simulate", *common, *noise, "--metrics-address", "none"]) == 0
        )
        node = capsys.readouterr().out.splitlines()
        assert main(["simulate", *common[1:], *noise]) == 0
        study = capsys.readouterr().out.splitlines()
        table = [line for line in node if line.startswith("  ") and "daemon:" not in line]
        assert table and all(line in study for line in table[:10]), (table, study)
        figures.append(table[:10])
    assert figures[0] != figures[1]
