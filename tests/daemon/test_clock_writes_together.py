"""A tick's clock writes to a domain's GPUs start together and are waited for under one
write deadline, as the tick's GPU reads are: two GPUs whose writes hang cost the tick one
deadline, not two. Each hung or failed write is still reported for its GPU, and none
leaves a GPU locked low at exit.

Checked by call overlap, never by wall time: when GPU 1's write starts, GPU 0's (hung)
write must not have been given up on yet (written one after another, it had been, a
whole deadline before)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from daemon_support import eventually
from fake_pynvml import FakeNvml
from hung_support import HungCall

from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.errors import GpuLost
from gpugov.daemon.exit_restore import ExitBudget
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.loop import restore_all
from gpugov.daemon.nvml import NvmlBackend

LOCK = "nvmlDeviceSetGpuLockedClocks"
RESET = "nvmlDeviceResetGpuLockedClocks"
DEADLINE_S = 1.0
"""Long enough that a worker thread starting late never passes for writes in a row."""


def _actuator(fake: FakeNvml, state: LockState | None = None) -> ClockActuator:
    backends = [NvmlBackend(i, nvml=fake) for i in range(len(fake.gpus))]
    return ClockActuator(backends, domain="llm", state=state, write_deadline_s=DEADLINE_S)


def _watch_starts(fake: FakeNvml, function: str, actuator: ClockActuator) -> list[Any]:
    """Record, as GPU 1's ``function`` starts, which GPUs' writes were already given up
    on (``hanging_writes``)."""
    seen: list[Any] = []
    inner = getattr(fake, function)

    def entered(handle: Any, *args: Any) -> Any:
        if handle.index == 1:
            seen.append(actuator.hanging_writes)
        return inner(handle, *args)

    setattr(fake, function, entered)
    return seen


def test_two_hung_locks_start_together_and_each_is_reported(
    safety: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(3)
    hung = [HungCall(fake, LOCK, 0), HungCall(fake, LOCK, 1)]
    safety.extend(hung)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state)
    seen = _watch_starts(fake, LOCK, actuator)
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.actuator")
    assert actuator.apply(1005) == 1  # GPU 2's lock went through
    assert seen == [()]  # GPU 1's write began while GPU 0's was still within its deadline
    assert all(call.blocked.is_set() for call in hung)
    assert fake.locked(2) == (1005, 1005)
    assert actuator.write_failures == {"0": 1, "1": 1, "2": 0}
    assert actuator.hanging_writes == ("0", "1")
    state.flush()
    recorded = {e["gpu"]: (e["min_mhz"], e["max_mhz"]) for e in state.read().values()}
    assert recorded == {gpu: (1005, 1005) for gpu in "012"}  # a kill: reset at the next start
    lines = [r.getMessage() for r in caplog.records]
    for gpu in "01":
        assert any(
            line.startswith(
                f"domain llm: GPU {gpu}: clock lock at 1005-1005 MHz: no answer within 1 s"
            )
            for line in lines
        ), lines
    for call in hung:
        call.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.apply(1410) == 3
    assert actuator.applied_mhz == 1410
    assert actuator.restore() == []
    assert [fake.locked(i) for i in range(3)] == [None, None, None]


def test_two_hung_resets_of_the_unlock_fail_safe_start_together(safety: list[Any]) -> None:
    fake = FakeNvml(3)
    actuator = _actuator(fake)
    assert actuator.apply(1005) == 3
    hung = [HungCall(fake, RESET, 0), HungCall(fake, RESET, 1)]
    safety.extend(hung)
    seen = _watch_starts(fake, RESET, actuator)
    assert actuator.unlock() == 1  # GPU 2 reset
    assert seen == [()]
    assert actuator.hanging_writes == ("0", "1") and fake.locked(2) is None
    for call in hung:
        call.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.unlock() == 0  # the late resets went through: nothing left to write
    assert [fake.locked(i) for i in range(3)] == [None, None, None]


def test_a_lost_gpu_raises_once_the_others_writes_are_taken_and_none_is_left_locked(
    safety: list[Any],
) -> None:
    """GPU 0 is lost while GPU 1's lock, started beside it, goes through: the loss is
    raised after GPU 1's write is taken (its lock known), and the exit resets GPU 1."""
    fake = FakeNvml(2)
    actuator = _actuator(fake)
    fake.lose(0)
    with pytest.raises(GpuLost):
        actuator.apply(1005)
    assert fake.locked(1) == (1005, 1005) and actuator.locked_mhz["1"] == 1005
    assert actuator.hanging_writes == ()
    assert "1" not in actuator.restore()
    assert fake.locked(1) is None


def test_exit_resets_start_together_so_hung_gpus_leave_the_others_time(
    safety: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An exit budget of one and a half write deadlines: reset one after another, GPU 0's
    hung reset took a deadline, GPU 1's the rest, and GPU 2, healthy, was named "not
    started" and left locked low. Started together, every GPU's reset is tried: GPU 2 is
    reset, the hung two are named as possibly still locked, their records kept."""
    fake = FakeNvml(3)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state)
    assert actuator.apply(1005) == 3
    hung = [HungCall(fake, RESET, 0), HungCall(fake, RESET, 1)]
    safety.extend(hung)
    seen = _watch_starts(fake, RESET, actuator)
    caplog.set_level(logging.ERROR, logger="gpugov.daemon.actuator")
    assert actuator.restore(ExitBudget(1.5 * DEADLINE_S)) == ["0", "1"]
    assert seen == [()]  # GPU 1's reset began while GPU 0's was still within its wait
    assert fake.locked(2) is None  # the healthy GPU was reset
    assert [fake.locked(i) for i in (0, 1)] == [(1005, 1005)] * 2  # still hung
    state.flush()
    assert sorted(e["gpu"] for e in state.read().values()) == ["0", "1"]  # the next start
    lines = [r.getMessage() for r in caplog.records]
    assert not any("not started" in line for line in lines), lines
    for gpu in "01":
        assert any(f"GPU {gpu}: clock reset: no answer within" in line for line in lines)


def test_exit_resets_of_every_domain_start_together(safety: list[Any]) -> None:
    """Three one-GPU domains (an engine per GPU), the first two GPUs' resets hanging, an
    exit budget of one and a half deadlines: each domain's reset waited its own turn, so
    the third domain's healthy GPU was "not started" and left locked low. The exit now
    starts every domain's resets before it waits for any."""
    fake = FakeNvml(3)
    domains = [
        SimpleNamespace(
            actuator=ClockActuator(
                [NvmlBackend(i, nvml=fake)], domain=f"d{i}", write_deadline_s=DEADLINE_S
            )
        )
        for i in range(3)
    ]
    for domain in domains:
        assert domain.actuator.apply(1005) == 1
    hung = [HungCall(fake, RESET, 0), HungCall(fake, RESET, 1)]
    safety.extend(hung)
    assert restore_all(domains, ExitBudget(1.5 * DEADLINE_S)) == ["0", "1"]  # type: ignore[arg-type]
    assert fake.locked(2) is None
    assert all(call.blocked.is_set() for call in hung)
