"""``gpugov reset-clocks`` through nvidia-smi when nvidia-smi fails (not only when it
hangs), nvidia-smi's GPU listing kept to its caller's wait, and ``check-config`` that
makes no GPU call once one has hung. Fake subprocess runners and a fake NVML whose hung
call blocks on an event the test frees (``hung_support.HungCall``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from daemon_support import node_commands_on
from fake_pynvml import FakeNvml
from hung_support import DEADLINE_S, HungCall

import gpugov.daemon.gpu_open as gpu_open
import gpugov.daemon.gpu_sampling as gpu_sampling
import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.node_support as node_support
import gpugov.daemon.nvidia_smi as nvidia_smi
import gpugov.daemon.reset_clocks as reset_clocks
from gpugov.daemon.errors import (
    RESET_PERMISSION_MESSAGE,
    GpuError,
    GpuUnavailable,
    TransientGpuError,
)
from gpugov.daemon.nvidia_smi import CommandTimedOut, classify_failure

_RESET_ALL = ["reset-clocks", "--backend", "nvidia-smi", "--gpus", "all"]


def _failing_nvidia_smi(text: str) -> Any:
    """A runner whose nvidia-smi exits non-zero saying ``text`` (as ``run_command``
    raises it)."""

    def run(argv: Any, timeout_s: float) -> str:
        raise classify_failure(argv, text)

    return run


@pytest.mark.parametrize(
    "text",
    [
        "Unable to reset SM clocks for GPU 00000000:3B:00.0: Unknown Error",
        "GPU 00000000:3B:00.0: GPU is lost.",
        "Resetting SM clocks is not supported for GPU 00000000:3B:00.0.",
    ],
)
def test_nvidia_smi_reset_that_fails_says_the_gpus_may_still_be_locked(
    text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A non-zero exit of ``nvidia-smi --reset-gpu-clocks`` exited 1 (or 4, 5 by its
    text) with no word that the GPUs may still be locked, where one that hangs exits 6:
    now every failure to reset is exit 6, NVML's failed reset's code, in one line."""
    monkeypatch.setattr(reset_clocks, "run_command", _failing_nvidia_smi(text))
    assert node_cli.main(_RESET_ALL) == 6
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("gpugov: error: nvidia-smi --reset-gpu-clocks: ")
    assert "the GPUs may still be locked" in line
    assert "no answer within" not in line  # it answered, saying why (no hung call)
    assert "Traceback" not in captured.err and "reset (nvidia-smi)" not in captured.out


def test_nvidia_smi_reset_that_times_out_is_said_as_a_hung_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def timed_out(argv: Any, timeout_s: float) -> str:
        raise CommandTimedOut(f"{' '.join(argv)} timed out after {timeout_s:g} s")

    monkeypatch.setattr(reset_clocks, "run_command", timed_out)
    assert node_cli.main(_RESET_ALL) == 6
    (line,) = capsys.readouterr().err.splitlines()
    assert "nvidia-smi --reset-gpu-clocks: no answer within" in line
    assert "the GPUs may still be locked" in line


def test_nvidia_smi_reset_refused_exits_3_and_says_not_reset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Permission denied stays exit 3 (as NVML's refusals), and the line now says no GPU
    was reset and they may still be locked."""
    monkeypatch.setattr(
        reset_clocks, "run_command", _failing_nvidia_smi("Insufficient Permissions")
    )
    assert node_cli.main(_RESET_ALL) == 3
    (line,) = capsys.readouterr().err.splitlines()
    assert RESET_PERMISSION_MESSAGE in line
    assert line.endswith("no GPU was reset and they may still be locked")


def test_nvidia_smi_reset_without_nvidia_smi_is_no_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No nvidia-smi here: no GPU could be reached at all, exit 4 as documented."""

    def missing(argv: Any, timeout_s: float) -> str:
        raise GpuUnavailable(f"{argv[0]} not found")

    monkeypatch.setattr(reset_clocks, "run_command", missing)
    assert node_cli.main(_RESET_ALL) == 4
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_generic_nvidia_smi_failure_is_a_gpu_error() -> None:
    """A text nvidia-smi's classification does not name is a plain GpuError (exit 1
    before); its "Unknown Error" (NVML's UNKNOWN) is a passing one, as NVML's code is."""
    argv = ["nvidia-smi", "--reset-gpu-clocks"]
    assert type(classify_failure(argv, "Failed to reset SM clocks for GPU 0")) is GpuError
    assert type(classify_failure(argv, "Unknown Error")) is TransientGpuError


# ----------------------------------------------- nvidia-smi's listing, the caller's wait
def _listing_runner(timeouts: list[float]) -> Any:
    def run(argv: Any, timeout_s: float) -> str:
        timeouts.append(timeout_s)
        return "0\n1\n"

    return run


def test_reset_clocks_listing_through_nvidia_smi_gets_the_budget_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gpu_indices`` ran nvidia-smi with a timeout of its own, 30 s, while reset-clocks
    waits 10 s at most: the child outlived the wait. It gets what is left now."""
    timeouts: list[float] = []
    monkeypatch.setattr(node_support, "run_command", _listing_runner(timeouts))
    budget = reset_clocks._ResetBudget(budget_s=3.0)
    assert reset_clocks._listed("nvidia-smi", None, budget) == [0, 1]
    assert len(timeouts) == 1 and 0 < timeouts[0] <= 3.0


def test_status_listing_through_nvidia_smi_gets_the_open_deadline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpugov status --backend nvidia-smi`` waits GPU_OPEN_DEADLINE_S for the listing:
    nvidia-smi's own timeout is no longer (it was 30 s)."""
    timeouts: list[float] = []
    monkeypatch.setattr(gpu_open, "GPU_OPEN_DEADLINE_S", 1.5)
    monkeypatch.setattr(node_support, "run_command", _listing_runner(timeouts))

    def no_reads(argv: Any, timeout_s: float) -> str:  # the GPUs' own reads: none here
        raise GpuUnavailable("nvidia-smi: no reads in this test")

    monkeypatch.setattr(nvidia_smi, "run_command", no_reads)
    node_cli.main(["status", "--backend", "nvidia-smi"])
    assert timeouts == [1.5]
    assert "Traceback" not in capsys.readouterr().err


# ------------------------------------------- check-config: no GPU call after a hung one
@pytest.fixture
def read_only_fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    monkeypatch.setattr(gpu_open, "GPU_OPEN_DEADLINE_S", DEADLINE_S)
    monkeypatch.setattr(gpu_sampling, "GPU_READ_DEADLINE_S", DEADLINE_S)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    return node_commands_on(monkeypatch, FakeNvml(2))


def _two_domain_config(tmp_path: Any) -> str:
    """Domain ``a`` on GPU 0 and ``b`` on GPU 1, each with a power budget (its GPUs'
    power limits are read)."""
    path = tmp_path / "gpugov.toml"
    domains = "".join(
        f'[[domains]]\nname = "{name}"\ngpus = [{index}]\nttft_slo_s = 1.0\n'
        "tpot_slo_s = 0.1\npower_budget_w = 600.0\n"
        f'[domains.engine]\nkind = "vllm"\nurl = "http://127.0.0.1:9/metrics"\n'
        for index, name in enumerate(("a", "b"))
    )
    path.write_text('[daemon]\nmetrics_address = ""\n' + domains)
    return str(path)


_LIMITS = "nvmlDeviceGetPowerManagementLimitConstraints"


def test_check_config_reads_no_power_limit_after_a_hung_open(
    read_only_fake: FakeNvml,
    safety: list[Any],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GPU 1's open hangs: domain ``a``'s GPU 0 was opened before it, and its power
    limits were still read, a call that would queue behind the hung one in the driver.
    Now no GPU call is made after the hung one, and the refusal is its one line (the
    budget's "not checked" warning is for a config run would start with)."""
    call = HungCall(read_only_fake, "nvmlDeviceGetUUID", index=1)
    safety.append(call)
    assert node_cli.main(["check-config", _two_domain_config(tmp_path)]) == 4
    assert call.hung
    assert read_only_fake.calls.get(_LIMITS, 0) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpugov: error: GPU 1: open: no answer within ")


def test_check_config_makes_no_gpu_call_after_a_hung_power_limit_read(
    read_only_fake: FakeNvml,
    safety: list[Any],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GPU 0's power limit read hangs (domain ``a``): it is a warning, as ``run`` takes
    the limits as unknown, and domain ``b``'s GPU 1 is not read, nor any GPU closed."""
    call = HungCall(read_only_fake, _LIMITS, index=0)
    safety.append(call)
    assert node_cli.main(["check-config", _two_domain_config(tmp_path)]) == 0
    assert call.hung and call.calls == 1
    # GPU 0's is still blocked (the fake records a call as it runs), GPU 1's not started.
    assert read_only_fake.calls.get(_LIMITS, 0) == 0
    assert read_only_fake.initialized > 0  # nothing closed: NVML not shut down
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert re.search(r"GPU 0: read the power limits: no answer within 0\.2 s", text), text
    assert "domain b: power budget not checked: a GPU call hung" in text
    assert "Traceback" not in text
