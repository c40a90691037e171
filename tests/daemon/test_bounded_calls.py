"""Calls the daemon cannot bound on its own, bounded as a whole: an engine's name whose
addresses do not answer (``daemon.scrape.connect_any``), the GPUs' reads of one tick, the
start's opening of the configured GPUs and ``gpugov reset-clocks`` (a Kubernetes preStop
hook). Time is a fake clock where the code takes one; where a deadline is a real wait, a
hung call is a fake NVML call blocked on an event the test frees, and the cases assert
what happened, not how long it took."""

from __future__ import annotations

import re
import socket
import threading
import types
from typing import Any

import pytest
from daemon_support import JOIN_S, MetricsServer, node_commands_on
from fake_pynvml import FakeNvml
from hung_support import DEADLINE_S, HungCall

import gpugov.daemon.gpu_open as gpu_open
import gpugov.daemon.node_cli as node_cli
import gpugov.daemon.node_support as node_support
import gpugov.daemon.reset_clocks as reset_clocks
import gpugov.daemon.scrape as scrape
import gpugov.daemon.service as service
import gpugov.daemon.status_cli as status_cli
from gpugov.daemon.config import parse_config
from gpugov.daemon.deadline import LatestReader, ReadTimeout
from gpugov.daemon.errors import GpuCallHung
from gpugov.daemon.gpu_sampling import DomainGpus
from gpugov.daemon.nvml import NvmlBackend


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _BlackholedSocket:
    """A socket whose connect waits its whole timeout (on the fake clock), then times out:
    an address whose route drops the SYN."""

    made: list[_BlackholedSocket] = []  # noqa: RUF012 - the test's record
    clock: _Clock

    def __init__(self, *_args: Any) -> None:
        self.timeout: float | None = None
        type(self).made.append(self)

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def bind(self, _address: Any) -> None:
        pass

    def connect(self, _address: Any) -> None:
        assert self.timeout is not None and self.timeout > 0
        self.clock.now += self.timeout
        raise TimeoutError("timed out")

    def close(self) -> None:
        pass


def test_connect_any_bounds_all_its_addresses_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each address was given the whole timeout, so a name with three blackholed
    addresses held the scrape (and the loop) for three times its deadline: the exchange's
    timer cannot cut a connect. Now the tries share the one timeout."""
    clock = _Clock()
    _BlackholedSocket.made = []
    _BlackholedSocket.clock = clock
    monkeypatch.setattr(scrape.socket, "socket", _BlackholedSocket)
    addresses = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"192.0.2.{i}", 8000)) for i in (1, 2, 3)
    ]
    with pytest.raises(TimeoutError):
        scrape.connect_any(addresses, ("engine", 8000), 0.5, clock=clock)
    assert clock.now == pytest.approx(0.5)
    assert len(_BlackholedSocket.made) == 1  # the time was spent: the others not tried


def test_connect_any_leaves_the_next_address_what_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An address refused at once leaves the next the whole timeout; one that took part
    of it leaves the rest."""
    clock = _Clock()
    timeouts: list[float | None] = []

    class Refused(_BlackholedSocket):
        def connect(self, address: Any) -> None:
            timeouts.append(self.timeout)
            if address[0] == "192.0.2.1":
                clock.now += 0.2
                raise ConnectionRefusedError("refused")
            if address[0] == "192.0.2.2":
                raise ConnectionRefusedError("refused")

    Refused.clock = clock
    monkeypatch.setattr(scrape.socket, "socket", Refused)
    addresses = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"192.0.2.{i}", 8000)) for i in (1, 2, 3)
    ]
    sock = scrape.connect_any(addresses, ("engine", 8000), 0.5, clock=clock)
    assert isinstance(sock, Refused)
    assert timeouts == pytest.approx([0.5, 0.3, 0.3])


def test_connect_any_without_a_timeout_tries_every_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Refused(_BlackholedSocket):
        def connect(self, _address: Any) -> None:
            assert self.timeout is None
            raise ConnectionRefusedError("refused")

    monkeypatch.setattr(scrape.socket, "socket", Refused)
    Refused.made = []
    addresses = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 1))] * 3
    with pytest.raises(ConnectionRefusedError):
        scrape.connect_any(addresses, ("engine", 1), None)
    assert len(Refused.made) == 3


# ------------------------------------------------------------- a tick's GPU reads
def _gpus(fake: FakeNvml, deadline_s: float, clock: Any = None) -> DomainGpus:
    backends = [NvmlBackend(i, nvml=fake) for i in range(len(fake.gpus))]
    if clock is None:
        return DomainGpus(backends, read_deadline_s=deadline_s)
    return DomainGpus(backends, read_deadline_s=deadline_s, clock=clock)


def test_a_ticks_gpu_reads_run_at_once(safety: list[Any]) -> None:
    """Each GPU's read started once the one before it had returned or timed out, so N
    GPUs hung together held the tick for N deadlines. Now they all start first: GPU 0's
    read returns only once GPU 1's read is under way, which read one after another
    happened only after GPU 0's deadline had passed (GPU 0 then failed)."""
    fake = FakeNvml(2)
    hung = HungCall(fake, "nvmlDeviceGetUtilizationRates", index=1)
    safety.append(hung)
    first = fake.nvmlDeviceGetUtilizationRates

    def gpu0_waits_for_gpu1(handle: Any) -> Any:
        if handle.index == 0:
            hung.blocked.wait(JOIN_S)
        return first(handle)

    fake.nvmlDeviceGetUtilizationRates = gpu0_waits_for_gpu1  # type: ignore[method-assign]
    gpus = _gpus(fake, 1.0)
    samples = gpus.sample(0.0)
    assert samples[0].read_errors == () and samples[0].utilization is not None
    assert samples[1].read_errors == ("sample",)
    assert gpus.hanging_reads == ("1",)


def test_a_ticks_gpu_reads_share_one_deadline(
    safety: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hung GPUs: the second is waited for only what is left of the tick's one
    deadline (nothing, once the first took it all), not a deadline of its own."""
    fake = FakeNvml(3)
    for index in (0, 1):
        safety.append(HungCall(fake, "nvmlDeviceGetUtilizationRates", index=index))
    clock = _Clock()
    waits: list[float | None] = []
    real_read = LatestReader.read

    def read(self: LatestReader[Any], wait_s: float | None = None) -> Any:
        waits.append(wait_s)
        hanging = self.hanging  # a read still hanging is not waited for at all
        try:
            return real_read(self, wait_s)
        except ReadTimeout:
            if not hanging and wait_s is not None:
                clock.now += max(0.0, wait_s)  # the time it waited
            raise

    monkeypatch.setattr(LatestReader, "read", read)
    gpus = _gpus(fake, 1.0, clock)
    samples = gpus.sample(0.0)
    assert [s.read_errors for s in samples] == [("sample",), ("sample",), ()]
    assert waits[:3] == pytest.approx([1.0, 0.0, 0.0])  # then GPU 2's power limits
    assert gpus.hanging_reads == ("0", "1")
    # While they hang, a tick waits for neither (no second read is started).
    waits.clear()
    samples = gpus.sample(1.0)
    assert [s.read_errors for s in samples] == [("sample",), ("sample",), ()]
    assert [call.calls for call in safety] == [1, 1]


def test_a_started_read_is_the_next_reads_answer() -> None:
    """:meth:`LatestReader.start` begins a read the next :meth:`LatestReader.read` takes,
    without starting another."""
    calls: list[int] = []

    def read() -> int:
        calls.append(len(calls))
        return len(calls)

    reader: LatestReader[int] = LatestReader(read, 1.0, name="test", idle_s=0.0)
    reader.start()
    assert reader.read() == 1
    assert reader.read() == 2  # a read of its own
    reader.start()
    assert reader.read() == 3
    assert calls == [0, 1, 2]


# ------------------------------------------------------- the start's opening of the GPUs
@pytest.mark.parametrize("hung", ["nvmlDeviceGetUUID", "nvmlDeviceGetSupportedMemoryClocks"])
def test_a_gpu_whose_opening_hangs_ends_the_start(
    safety: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    hung: str,
) -> None:
    """Opening the configured GPUs (the handle, the UUID, the clocks' list) ran on the
    start's thread with no deadline: one NVML call hung in the driver held the start, so
    the loop never began and no watchdog ping was sent, for as long as it hung. Now each
    call is waited for at most ``GPU_OPEN_DEADLINE_S`` and the start ends, no usable
    GPU (exit 4), naming the GPU; the GPU opened before it is left open, NVML not shut
    down under the hung call."""
    fake = FakeNvml(2)
    call = HungCall(fake, hung, index=1)
    safety.append(call)
    monkeypatch.setattr(gpu_open, "GPU_OPEN_DEADLINE_S", DEADLINE_S)
    config = parse_config(
        {
            "daemon": {"metrics_address": ""},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0, 1],
                    "engine": {"kind": "vllm", "url": metrics_server.url},
                }
            ],
        }
    )
    with pytest.raises(GpuCallHung) as raised:
        service.domains_from_config(config, nvml=fake)
    assert call.blocked.is_set() and call.hung  # it gave up while the call still hung
    assert str(raised.value).startswith("GPU 1: ")
    assert f"no answer within {DEADLINE_S:g} s (a hung GPU call" in str(raised.value)
    assert node_support.exit_code(raised.value) == 4
    assert "nvmlShutdown" not in fake.calls  # nothing shut down under the hung call


# ------------------------------------------------- gpugov reset-clocks (a preStop hook)
class _HungCount:
    """``nvmlDeviceGetCount`` hung in the driver until :attr:`release` is set."""

    def __init__(self, fake: FakeNvml) -> None:
        self.real = fake.nvmlDeviceGetCount
        self.release = threading.Event()
        self.blocked = threading.Event()
        fake.nvmlDeviceGetCount = self  # type: ignore[method-assign]

    def __call__(self) -> int:
        self.blocked.set()
        self.release.wait(JOIN_S)
        return int(self.real())


@pytest.fixture
def reset_fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    monkeypatch.setattr(reset_clocks, "RESET_CALL_DEADLINE_S", DEADLINE_S)
    monkeypatch.setattr(reset_clocks, "RESET_BUDGET_S", 5 * DEADLINE_S)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    return node_commands_on(monkeypatch, FakeNvml(2))


@pytest.mark.parametrize("hung", ["nvmlDeviceResetGpuLockedClocks", "nvmlDeviceGetUUID"])
def test_reset_clocks_names_a_gpu_whose_call_hangs_and_ends(
    reset_fake: FakeNvml,
    safety: list[Any],
    capsys: pytest.CaptureFixture[str],
    hung: str,
) -> None:
    """``gpugov reset-clocks`` (the Kubernetes preStop hook) called NVML with no deadline:
    a hung driver held the hook, and the pod's termination, for as long as it hung. Now
    each call is waited for at most the loop's deadline: the GPU is named as not reset,
    the others are reset, and the command ends (exit 6)."""
    for gpu in reset_fake.gpus:
        gpu.locked = (1005, 1005)
    call = HungCall(reset_fake, hung, index=1)
    safety.append(call)
    assert node_cli.main(["reset-clocks", "--gpus", "all"]) == 6
    assert call.blocked.is_set() and call.hung  # it ended while the call still hung
    out, err = capsys.readouterr()
    assert out.splitlines() == ["GPU 0: SM clock lock reset"]
    lines = err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("GPU 1: NOT reset: ")
    assert lines[0].count("GPU 1") == 1  # it said "GPU 1: NOT reset: GPU 1: ..."
    assert re.search(
        r"no answer within [0-9.]+ s \(a hung GPU call: a driver in trouble\)$", lines[0]
    )
    assert lines[1] == "gpugov: error: 1 of 2 GPU(s) not reset: 1; they may still be locked"
    assert reset_fake.gpus[0].locked is None


def test_reset_clocks_whose_gpu_listing_hangs_says_so(
    reset_fake: FakeNvml, safety: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--gpus all`` lists the GPUs first (NVML's count): a count that hangs ends the
    command with one line, exit 6 (the GPUs may still be locked), not a hook that hangs."""
    count = _HungCount(reset_fake)
    safety.append(count)
    assert node_cli.main(["reset-clocks", "--gpus", "all"]) == 6
    assert count.blocked.is_set() and not count.release.is_set()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpugov: error: list the GPUs: no answer within ")
    assert "no GPU was reset and they may still be locked" in line


def test_reset_clocks_gives_up_once_its_budget_is_spent(reset_fake: FakeNvml) -> None:
    """The GPU calls of the whole command share one budget: once it is spent, a GPU is
    named as not tried and NVML is not called for it."""
    clock = _Clock()
    budget = reset_clocks._ResetBudget(1.0, clock)
    clock.now = 1.0
    before = dict(reset_fake.calls)
    error = reset_clocks._reset_one(0, "nvml", lambda _s: None, budget=budget)
    assert error == "not tried: reset-clocks' 1 s for its GPU calls is spent"
    assert reset_fake.calls == before
    clock.now = 0.5  # half of it left: a call may take the per-call deadline at most,
    assert budget.wait_s() == pytest.approx(min(DEADLINE_S, 0.5))
    assert budget.left_s() == pytest.approx(0.5)  # nvmlInit (an open, the listing) all of it


def test_reset_clocks_through_nvidia_smi_keeps_to_its_budget(
    reset_fake: FakeNvml,
    safety: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--backend nvidia-smi --gpus all`` ran ``nvidia-smi --reset-gpu-clocks`` with a
    timeout of its own, 30 s, three times the command's budget (10 s): a hung driver held
    the preStop hook past the pod's grace period. Now the command's timeout is what is
    left of the budget, and a child that does not end with it (hung in the driver, it
    outlives its kill) is not waited for: one line, exit 6."""
    release = threading.Event()
    safety.append(types.SimpleNamespace(release=release))
    timeouts: list[float] = []

    def hung_nvidia_smi(argv: Any, timeout_s: float) -> str:
        timeouts.append(timeout_s)
        release.wait(JOIN_S)
        return ""

    monkeypatch.setattr(reset_clocks, "run_command", hung_nvidia_smi)
    assert node_cli.main(["reset-clocks", "--backend", "nvidia-smi", "--gpus", "all"]) == 6
    assert not release.is_set()  # it ended while nvidia-smi still hung
    assert len(timeouts) == 1 and 0 < timeouts[0] <= reset_clocks.RESET_BUDGET_S
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpugov: error: nvidia-smi --reset-gpu-clocks: no answer within ")
    assert "(a hung GPU call: a driver in trouble); the GPUs may still be locked" in line


# ------------------------------------------- gpugov check-config and status (read only)
@pytest.fixture
def read_only_fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Two fake GPUs for check-config and status, their deadlines the tests' own."""
    monkeypatch.setattr(gpu_open, "GPU_OPEN_DEADLINE_S", DEADLINE_S)
    monkeypatch.setattr(status_cli, "GPU_CALL_DEADLINE_S", DEADLINE_S, raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    return node_commands_on(monkeypatch, FakeNvml(2))


def _node_config(tmp_path: Any) -> str:
    path = tmp_path / "gpugov.toml"
    path.write_text(
        '[daemon]\nmetrics_address = ""\n[[domains]]\nname = "llm"\ngpus = [0, 1]\n'
        "ttft_slo_s = 1.0\ntpot_slo_s = 0.1\n"
        '[domains.engine]\nkind = "vllm"\nurl = "http://127.0.0.1:9/metrics"\n'
    )
    return str(path)


_HUNG_LINE = r"no answer within 0\.2 s \(a hung GPU call: a driver in trouble\)$"


@pytest.mark.parametrize("hung", ["nvmlDeviceGetUUID", "nvmlDeviceGetSupportedMemoryClocks"])
def test_check_config_names_a_gpu_whose_opening_hangs_and_ends(
    read_only_fake: FakeNvml,
    safety: list[Any],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    hung: str,
) -> None:
    """``gpugov check-config`` opened the GPUs with no deadline: a hung driver held it
    for as long as it hung. Now it opens them as ``run``'s start does (each call within
    ``GPU_OPEN_DEADLINE_S``) and ends with one line naming the GPU, exit 4, nothing
    shut down under the hung call."""
    call = HungCall(read_only_fake, hung, index=1)
    safety.append(call)
    assert node_cli.main(["check-config", _node_config(tmp_path)]) == 4
    assert call.blocked.is_set() and call.hung  # it ended while the call still hung
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpugov: error: GPU 1: ")
    assert re.search(_HUNG_LINE, line), line
    assert read_only_fake.initialized > 0  # GPU 0 left open: NVML not shut down


def test_check_config_whose_gpu_listing_hangs_says_so(
    read_only_fake: FakeNvml,
    safety: list[Any],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """NVML's count (check-config's first GPU call) that hangs is a problem in one line,
    exit 4, not "no NVIDIA driver here" and not a command that never ends."""
    count = _HungCount(read_only_fake)
    safety.append(count)
    assert node_cli.main(["check-config", _node_config(tmp_path)]) == 4
    assert count.blocked.is_set() and not count.release.is_set()
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("gpugov: error: NVML: list the GPUs: ")
    assert re.search(_HUNG_LINE, line), line
    assert "skipped" not in captured.out


@pytest.mark.parametrize(
    ("hung", "what"),
    [
        ("nvmlDeviceGetUUID", "open"),
        ("nvmlDeviceGetSupportedMemoryClocks", "list supported clocks"),
        ("nvmlDeviceGetUtilizationRates", "read"),
    ],
)
def test_status_names_a_gpu_whose_call_hangs_and_ends(
    read_only_fake: FakeNvml,
    safety: list[Any],
    capsys: pytest.CaptureFixture[str],
    hung: str,
    what: str,
) -> None:
    """``gpugov status`` opened and read the GPUs with no deadline: a hung driver held it.
    Now opening a GPU waits ``GPU_OPEN_DEADLINE_S`` and its other calls 2 s, as ``run``
    waits: the GPUs read before are shown, the hung one is named in one line, exit 4."""
    call = HungCall(read_only_fake, hung, index=1)
    safety.append(call)
    assert node_cli.main(["status"]) == 4
    assert call.blocked.is_set() and call.hung
    captured = capsys.readouterr()
    assert any(line.startswith("GPU 0: ") for line in captured.out.splitlines())
    assert not any(line.startswith("GPU 1: ") for line in captured.out.splitlines())
    (line,) = captured.err.splitlines()
    assert line.startswith(f"gpugov: error: GPUs unavailable: GPU 1: {what}: "), line
    assert re.search(_HUNG_LINE, line), line


def test_status_whose_gpu_listing_hangs_says_so(
    read_only_fake: FakeNvml, safety: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    count = _HungCount(read_only_fake)
    safety.append(count)
    assert node_cli.main(["status", "--json"]) == 4
    assert count.blocked.is_set() and not count.release.is_set()
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("gpugov: error: GPUs unavailable: list the GPUs: ")
    assert re.search(_HUNG_LINE, line), line
    assert '"gpus": []' in captured.out
