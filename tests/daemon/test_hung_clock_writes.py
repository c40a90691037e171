"""A clock write that hangs inside NVML (a driver in trouble): on a node each GPU's clock
writes run on a worker thread of their own (:class:`daemon.deadline.SerialCalls`), one at a
time in the order made, and the loop waits for one at most the write deadline. A write past
it is a failed write (counted, one log line), no other write to that GPU starts while it
hangs, the loop goes on governing every other GPU, and once the call returns its outcome is
taken and the clock wanted then is written. At exit a reset that hangs is bounded too, and
the GPU is reported as possibly still locked (exit 6), its lock record kept.

A hung write is an NVML setter blocked on a :class:`threading.Event`. Every check is of what
happened, never of wall time: a call that should not wait must return while the write is
still hung (a safety timer frees it after :data:`JOIN_S`, so a regression fails instead of
hanging the suite)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from daemon_support import JOIN_S, MetricsServer, eventually, run_ticks
from fake_pynvml import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_TIMEOUT, FakeNvml, NVMLError
from hung_support import DEADLINE_S, HungCall, two_domains

import gpugov.daemon.service as service
from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.deadline import CallTimeout, SerialCalls
from gpugov.daemon.errors import ClocksNotReset, GpuLost
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.service import domains_from_config

LOCK = "nvmlDeviceSetGpuLockedClocks"
RESET = "nvmlDeviceResetGpuLockedClocks"


def _writes(fake: FakeNvml, index: int) -> list[tuple[Any, ...]]:
    """The clock writes that went through on GPU ``index``, in order (without the GPU)."""
    return [(w[0], *w[2:]) for w in fake.writes if w[0] in (LOCK, RESET) and w[1] == index]


def _recorded(state: LockState) -> dict[str, tuple[int, int]]:
    """The locks the state file on disk holds, by GPU label (what the next start resets)."""
    state.flush()
    return {e["gpu"]: (e["min_mhz"], e["max_mhz"]) for e in state.read().values()}


def _actuator(fake: FakeNvml, state: LockState | None = None, **options: Any) -> ClockActuator:
    backends = [NvmlBackend(i, nvml=fake) for i in range(len(fake.gpus))]
    return ClockActuator(
        backends, domain="llm", state=state, write_deadline_s=DEADLINE_S, **options
    )


# ------------------------------------------------------------------ the worker
class _Blocking:
    """A call that blocks until :attr:`release` is set, then returns ``answer`` (or raises
    ``error``)."""

    def __init__(self, answer: Any = None, error: Exception | None = None) -> None:
        self.answer = answer
        self.error = error
        self.release = threading.Event()
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        self.release.wait(JOIN_S)
        if self.error is not None:
            raise self.error
        return self.answer


def test_a_hung_call_costs_one_deadline_starts_no_other_and_its_outcome_is_taken_once(
    safety: list[Any],
) -> None:
    done: list[str] = []
    calls = SerialCalls(DEADLINE_S, name="test")
    assert calls.call(lambda: "first") == "first"
    assert calls.late() is None  # nothing ran late
    hung = _Blocking(answer="late")
    safety.append(hung)
    with pytest.raises(CallTimeout, match=r"has not finished within 0\.2 s: a hung call"):
        calls.call(hung)
    assert calls.hanging and calls.busy
    with pytest.raises(CallTimeout, match="a call has been hanging for"):
        calls.late()
    for _ in range(5):  # while it hangs, no call waits and none other starts
        with pytest.raises(CallTimeout, match="a call has been hanging for"):
            calls.call(lambda: done.append("later"))
    assert hung.calls == 1 and done == []
    hung.release.set()
    assert eventually(lambda: not calls.busy)
    assert not calls.hanging
    outcome = calls.late()
    assert outcome is not None and outcome.result == "late" and outcome.error is None
    assert calls.late() is None  # taken once
    assert calls.call(lambda: done.append("after") or "fresh") == "fresh"
    assert done == ["after"]


def test_a_late_call_s_error_is_its_outcome_and_a_newer_call_drops_an_untaken_one(
    safety: list[Any],
) -> None:
    calls = SerialCalls(DEADLINE_S, name="test", cause="a hung GPU call", idle_s=0.0)
    hung = _Blocking(error=OSError("driver"))
    safety.append(hung)
    with pytest.raises(CallTimeout, match="a hung GPU call"):
        calls.call(hung)
    hung.release.set()
    assert eventually(lambda: not calls.busy)
    outcome = calls.late()
    assert outcome is not None and isinstance(outcome.error, OSError)
    hung = _Blocking(answer="dropped")
    safety.append(hung)
    with pytest.raises(CallTimeout):
        calls.call(hung)
    hung.release.set()
    assert eventually(lambda: not calls.busy)
    assert calls.call(lambda: "newer") == "newer"
    assert calls.late() is None  # the late call's outcome went with the newer call
    with pytest.raises(ValueError, match="deadline_s must be positive"):
        SerialCalls(0.0, name="test")


def test_calls_run_in_order_on_one_daemon_thread() -> None:
    calls = SerialCalls(JOIN_S, name="order")
    seen: list[tuple[int, threading.Thread]] = []
    for number in range(20):
        calls.call(lambda number=number: seen.append((number, threading.current_thread())))
    assert [number for number, _ in seen] == list(range(20))
    threads = {thread for _, thread in seen}
    assert len(threads) == 1  # kept between calls (its idle wait), never the caller's
    (thread,) = threads
    assert thread is not threading.current_thread() and thread.daemon
    assert thread.name == "gpugov-calls-order"


# ------------------------------------------------------------------ the actuator
def test_a_hung_lock_starts_no_other_write_and_the_wanted_clock_follows_it_in_order(
    safety: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hung write was a lowering (from the GPU's default clocks to 1005 MHz): while it
    hangs nothing else is written to that GPU and the lock record holds it; once it
    returns (it went through: the GPU is at 1005 MHz), the clock wanted now (1410 MHz) is
    written after it, never before."""
    fake = FakeNvml(2)
    hung = HungCall(fake, LOCK)
    safety.append(hung)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state)
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.actuator")
    assert actuator.apply(1005) == 1  # GPU 1's lock; GPU 0's ran past the deadline
    assert hung.blocked.is_set() and hung.hung
    assert fake.locked(1) == (1005, 1005) and actuator.locked_mhz["1"] == 1005
    assert actuator.write_failures == {"0": 1, "1": 0}
    assert actuator.hanging_writes == ("0",)
    assert _recorded(state) == {"0": (1005, 1005), "1": (1005, 1005)}  # a kill: reset at start
    # Each call while it hangs: no write to GPU 0 started, one more failure.
    assert [actuator.apply(1410) for _ in range(5)] == [1, 0, 0, 0, 0]
    assert fake.locked(1) == (1410, 1410)
    assert hung.calls == 1 and actuator.write_failures["0"] == 6
    assert actuator.applied_mhz is None  # GPU 0's lock is not known
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "domain llm: GPU 0: clock lock at 1005-1005 MHz: no answer within 0.2 s (a hung GPU "
        "call); nothing more is written to this GPU until that call returns, then the clock "
        "wanted then is (while it fails, one line a minute)"
    ]
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert fake.locked(0) == (1005, 1005)  # the late lowering went through
    assert actuator.apply(1410) == 1  # its outcome taken, then the wanted clock written
    assert _writes(fake, 0) == [(LOCK, 1005, 1005), (LOCK, 1410, 1410)]
    assert fake.locked(0) == (1410, 1410) and actuator.applied_mhz == 1410
    assert actuator.write_failures["0"] == 6
    assert "clock writes succeed again after 6 failure(s)" in caplog.records[-1].getMessage()
    assert actuator.restore() == []


def test_a_hung_write_that_fails_leaves_the_lock_unknown_and_it_is_written_again(
    safety: list[Any],
) -> None:
    fake = FakeNvml(1)
    hung = HungCall(fake, LOCK)
    hung.error = NVMLError(NVML_ERROR_TIMEOUT)
    safety.append(hung)
    actuator = _actuator(fake)
    assert actuator.apply(1005) == 0
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.apply(1005) == 1  # the same clock: unknown after the error, so written
    assert hung.calls == 2 and fake.locked(0) == (1005, 1005)
    assert actuator.locked_mhz["0"] == 1005 and actuator.write_failures["0"] == 1


def test_a_hung_write_that_returns_gpu_lost_stops_the_run_as_any_lost_gpu(
    safety: list[Any],
) -> None:
    fake = FakeNvml(1)
    hung = HungCall(fake, LOCK)
    hung.error = NVMLError(NVML_ERROR_GPU_IS_LOST)
    safety.append(hung)
    actuator = _actuator(fake)
    actuator.apply(1005)
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    with pytest.raises(GpuLost):
        actuator.apply(1410)
    assert hung.calls == 1


def test_a_hung_reset_of_the_unlock_fail_safe_is_bounded_and_taken_when_it_returns(
    safety: list[Any],
) -> None:
    fake = FakeNvml(2)
    actuator = _actuator(fake)
    actuator.apply(1005)
    hung = HungCall(fake, RESET)
    safety.append(hung)
    assert actuator.unlock() == 1  # GPU 1 reset; GPU 0's reset hangs
    assert fake.locked(1) is None and fake.locked(0) == (1005, 1005)
    assert actuator.unlock() == 0 and hung.calls == 1  # no top-clock lock behind it either
    assert _writes(fake, 0) == [(LOCK, 1005, 1005)]
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.unlock() == 0  # the late reset went through: nothing left to write
    assert actuator.locked_mhz["0"] is None and fake.locked(0) is None
    assert actuator.apply(1410) == 2


def test_a_reset_that_hangs_at_exit_is_bounded_and_reported_with_its_record_kept(
    safety: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(2)
    state = LockState(tmp_path)
    slept: list[float] = []
    actuator = _actuator(fake, state, sleep=slept.append)
    actuator.apply(1005)
    hung = HungCall(fake, RESET)
    safety.append(hung)
    caplog.set_level(logging.ERROR, logger="gpugov.daemon.actuator")
    assert actuator.restore() == ["0"]  # returned while the reset still hangs
    assert hung.hung and hung.calls == 1  # one reset started, not retried
    assert fake.locked(1) is None and fake.locked(0) == (1005, 1005)
    assert slept == []  # no backoff: a retry could not start while it hangs
    assert _recorded(state) == {"0": (1005, 1005)}  # the next start resets it
    assert [r.getMessage() for r in caplog.records] == [
        "domain llm: reset failed: GPU 0: clock reset: no answer within 0.2 s (a hung GPU "
        "call); not retried"
    ]


def test_a_reset_at_exit_waits_for_no_write_still_hanging_from_the_loop(
    safety: list[Any],
) -> None:
    fake = FakeNvml(1)
    hung = HungCall(fake, LOCK)
    safety.append(hung)
    slept: list[float] = []
    actuator = _actuator(fake, sleep=slept.append)
    actuator.apply(1005)
    assert actuator.restore() == ["0"]
    assert _writes(fake, 0) == [] and hung.calls == 1  # no reset started behind the hung lock
    assert slept == []


def test_a_reset_at_start_that_hangs_is_reported_and_tried_again_at_exit(
    safety: list[Any], tmp_path: Path
) -> None:
    fake = FakeNvml(1)
    first = _actuator(fake, LockState(tmp_path))
    first.apply(1005)  # a run that was killed: its record and its lock stay
    hung = HungCall(fake, RESET)
    safety.append(hung)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state, sleep=lambda s: None)
    (line,) = actuator.reconcile()
    assert line.endswith(
        "reset FAILED: GPU 0: clock reset: no answer within 0.2 s (a hung GPU call)"
    )
    assert actuator.apply(1410) == 0 and hung.calls == 1
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.apply(1410) == 1 and fake.locked(0) == (1410, 1410)
    assert actuator.restore() == [] and fake.locked(0) is None
    assert _recorded(state) == {}


# ------------------------------------------------------------------ the loop
def _two_domains(server: MetricsServer) -> Any:
    return two_domains(server, {"kind": "fixed", "clock_mhz": 1410})


def test_a_hung_clock_write_costs_one_deadline_and_every_other_domain_goes_on(
    safety: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Domain a's first lock (GPU 0, a lowering from its default clocks to 1410 MHz) hangs
    in the driver. Every tick still runs; domain b decides and writes on (its fail-safe's
    top clock while the engine is down, 1410 MHz once it is back), the exporter updates,
    no second write to GPU 0 starts while the first hangs, and once it returns the clock
    domain a wants then (its fail-safe's top clock) is written after it: the late lowering
    never lands after the raise. Before, the loop waited on it until the watchdog killed
    the daemon."""
    monkeypatch.setattr(service, "CLOCK_WRITE_DEADLINE_S", DEADLINE_S)
    fake = FakeNvml(2)
    hung = HungCall(fake, LOCK)
    safety.append(hung)
    assembled = domains_from_config(_two_domains(metrics_server), nvml=fake)
    a = assembled.domains[0]
    top = int(a.observer.gpus.supported_clocks_mhz()[-1])
    exporter = Exporter(serve=False)
    seen: list[tuple[Any, ...]] = []

    def on_step(step: int, records: Any) -> None:
        get = exporter.registry.get_sample_value
        seen.append(
            (
                hung.hung,
                hung.calls,
                fake.locked(1),
                get("gpugov_loop_ticks_total"),
                get("gpugov_clock_write_failures_total", {"domain": "a", "gpu": "0"}),
            )
        )
        if step == 0:
            metrics_server.down = True  # both engines go quiet: both domains' fail-safe
        if step == 5:
            hung.release.set()  # the driver answers: the lowering to 1410 MHz lands now
            assert eventually(lambda: not a.actuator.hanging_writes)
            assert fake.locked(0) == (1410, 1410)
        if step == 6:
            metrics_server.down = False

    caplog.set_level(logging.WARNING, logger="gpugov.daemon.actuator")
    try:
        records, stats = run_ticks(assembled.domains, 9, on_step=on_step, exporter=exporter)
    finally:
        assembled.close()
    assert stats.ticks == 9  # every tick ran; ticks 0 to 5 with GPU 0's write hung
    assert [hung_now for hung_now, *_ in seen] == [True] * 6 + [False] * 3
    assert [calls for _, calls, *_ in seen[:6]] == [1] * 6  # one write started while hung
    assert [ticks for *_, ticks, _ in seen] == [float(n) for n in range(1, 10)]
    failures = [failed for *_, failed in seen]
    assert failures[0] == 1.0 and failures[5] > failures[0]  # the hang, each tick it held
    # Domain b decided and wrote on: 1410, its fail-safe's top clock, 1410 again.
    b_clocks = [record.requested_mhz for record in records if record.domain == "b"]
    assert b_clocks[0] == 1410 and top in b_clocks[1:6] and b_clocks[-1] == 1410
    relocked = [(LOCK, 1410, 1410), (LOCK, top, top), (LOCK, 1410, 1410), (RESET,)]
    assert _writes(fake, 1) == relocked  # (the last: the exit's reset)
    assert [locked for _, _, locked, *_ in seen][3:5] == [(top, top)] * 2
    # GPU 0: the hung lowering, then the raise wanted when it returned, then 1410 again.
    assert _writes(fake, 0) == relocked
    hang_lines = [r.getMessage() for r in caplog.records if "a hung GPU call" in r.getMessage()]
    assert hang_lines == [
        "domain a: GPU 0: clock lock at 1410-1410 MHz: no answer within 0.2 s (a hung GPU "
        "call); nothing more is written to this GPU until that call returns, then the clock "
        "wanted then is (while it fails, one line a minute)"
    ]
    assert fake.locked(0) is None and fake.locked(1) is None


def test_a_reset_that_hangs_at_the_loop_s_exit_ends_the_run_naming_the_gpu(
    safety: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
) -> None:
    """The exit's reset of GPU 1 hangs: the run ends at once after its deadline (no
    retries, no backoff) with exit 6's error naming GPU 1, GPU 0 reset; and closing the
    node leaves NVML open while the call hangs (shutting it down under the call could hang
    the exit too), then closes it once it has returned."""
    monkeypatch.setattr(service, "CLOCK_WRITE_DEADLINE_S", DEADLINE_S)
    fake = FakeNvml(2)
    assembled = domains_from_config(_two_domains(metrics_server), nvml=fake)
    opened = fake.initialized
    hung: list[HungCall] = []

    def on_step(step: int, records: Any) -> None:
        if step == 1:  # the driver hangs GPU 1's resets from now on
            hung.append(HungCall(fake, RESET, index=1))
            safety.append(hung[0])

    # A hung reset is never retried: the line claims no retries.
    with pytest.raises(ClocksNotReset, match=r"GPU\(s\) 1; they may still be locked"):
        run_ticks(assembled.domains, 2, on_step=on_step)
    assert hung[0].hung and hung[0].calls == 1
    assert fake.locked(0) is None and fake.locked(1) == (1410, 1410)
    assembled.close()
    assert fake.initialized == opened  # left open: the reset still hangs
    hung[0].release.set()
    assert eventually(lambda: not assembled.domains[1].actuator.hanging_writes)
    assembled.close()
    assert fake.initialized == 0


def test_closing_a_node_leaves_nvml_open_while_a_gpu_read_still_hangs(
    safety: list[Any], monkeypatch: pytest.MonkeyPatch, metrics_server: MetricsServer
) -> None:
    monkeypatch.setattr(service, "GPU_READ_DEADLINE_S", DEADLINE_S)
    fake = FakeNvml(2)
    assembled = domains_from_config(_two_domains(metrics_server), nvml=fake)
    opened = fake.initialized
    hung = HungCall(fake, "nvmlDeviceGetUtilizationRates")  # a sample's read, GPU 0
    safety.append(hung)
    a = assembled.domains[0]
    assert a.observe(0.0, 0).gpu_samples[0].read_errors == ("sample",)
    assert a.observer.gpus.hanging_reads == ("0",)
    assembled.close()
    assert fake.initialized == opened
    hung.release.set()
    assert eventually(lambda: not a.observer.gpus.hanging_reads)
    assembled.close()
    assert fake.initialized == 0
