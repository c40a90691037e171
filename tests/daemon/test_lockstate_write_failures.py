"""A lock state file that cannot be written (a full disk, an unwritable state directory):
the daemon goes on governing and resets its clocks at stop, every failed write is counted
and exported (``gpugov_lock_state_write_failures_total``, ``gpugov_lock_state_stale_active``),
the file is written again each tick until it goes through, and the log has one line for
the first failure, one a minute while it lasts and one when it is written again."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from daemon_support import MetricsServer, fixed_clock_node, lock_state_reading, run_ticks
from fake_pynvml import FakeNvml

from gpugov.daemon import lockstate
from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.nvml import NvmlBackend

KEY = "GPU-fake-0000"
PATIENT_S = 60.0
"""The write deadline of the tests that count writes and log lines: the failures are the
fake disk's ENOSPC, never a write the loaded machine ran past the default 0.5 s (a real
write counted as one more failure: a line lost, a count off by one)."""


class _Disk:
    """``write_json_atomic`` in place of the lock state's own: ENOSPC while ``full``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.full = True
        self.writes = 0

    def __call__(self, path: Path, data: Any, **options: Any) -> None:
        self.writes += 1
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.real(path, data, **options)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> _Disk:
    """The lock state's disk, full until the test frees it."""
    fake = _Disk(lockstate.write_json_atomic)
    monkeypatch.setattr(lockstate, "write_json_atomic", fake)
    return fake


def test_a_lock_state_write_that_fails_is_counted_retried_and_the_clocks_still_reset(
    tmp_path: Path, disk: _Disk
) -> None:
    fake = FakeNvml(1)
    state = LockState(tmp_path, pid=1, write_deadline_s=PATIENT_S)
    actuator = ClockActuator([NvmlBackend(0, nvml=fake)], state=state)
    assert not state.stale and state.write_failures == 0
    assert actuator.apply(900) == 1
    assert fake.locked(0) == (900, 900)  # the lock went through; only its record did not
    assert state.stale and state.write_failures == 1
    assert not (tmp_path / "locks.json").exists()
    assert state.retry() is False and state.write_failures == 2
    disk.full = False
    assert state.retry() is True and not state.stale
    assert LockState(tmp_path).read()[KEY]["max_mhz"] == 900
    assert state.retry() is True and disk.writes == 3  # up to date: nothing written
    disk.full = True
    assert actuator.restore() == [] and fake.locked(0) is None  # reset, record or not
    assert state.stale and state.write_failures == 3
    # The file still names the lock the reset removed: the next start resets it again.
    assert set(LockState(tmp_path).read()) == {KEY}


def test_a_record_the_exit_cannot_write_says_what_the_next_start_does(
    tmp_path: Path, disk: _Disk, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk full from the exit's resets on (the record was written while the run
    went on): the exit's one line said "the daemon writes it again every tick (while it
    fails, one line a minute)", which no daemon on its way out does. It says the record
    still names the locks the exit reset, which the next start resets again."""
    fake = FakeNvml(1)
    state = LockState(tmp_path, pid=1, write_deadline_s=PATIENT_S)
    actuator = ClockActuator([NvmlBackend(0, nvml=fake)], state=state)
    disk.full = False
    assert actuator.apply(900) == 1 and not state.stale
    disk.full = True
    state.defer_writes()  # the exit's resets, as the loop's exit makes them
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        assert actuator.restore() == [] and fake.locked(0) is None
        assert state.flush() is False
    (line,) = [r.getMessage() for r in caplog.records if "cannot write it" in r.getMessage()]
    assert "every tick" not in line, line
    assert "still names the locks this exit reset: the next start resets them again" in line


def test_failing_lock_state_writes_log_one_line_a_minute_and_one_on_recovery(
    tmp_path: Path, disk: _Disk, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "locks.json").write_text('["garbage"]')  # warned once, as a read problem
    now = [0.0]
    with caplog.at_level(logging.DEBUG, logger="gpugov.daemon.lockstate"):
        state = LockState(tmp_path, pid=1, clock=lambda: now[0], write_deadline_s=PATIENT_S)
        state.record(KEY, "0", 900, 900)  # the first failure: logged
        for _ in range(119):  # a retry every 0.5 s tick for 59.5 s: not logged
            now[0] += 0.5
            state.retry()
        now[0] += 0.5
        state.retry()  # a minute on: one reminder
        now[0] += 1.0
        disk.full = False
        state.retry()  # written again: one line
        for step in range(31):  # failures that come and go, one every 2 s from 62 s on
            now[0] += 1.0
            disk.full = True
            state.record(KEY, "0", 1000 + step, 1000 + step)
            now[0] += 1.0
            disk.full = False
            state.retry()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 8, lines
    assert "not a lock record" in lines[0]
    path = tmp_path / "locks.json"
    assert lines[1].startswith(f"lock state {path}: cannot write it (")
    assert "No space left on device" in lines[1]
    assert "a daemon killed meanwhile leaves locks the next start finds only" in lines[1]
    assert "writes it again every tick (while it fails, one line a minute)" in lines[1]
    assert lines[2].startswith(
        f"lock state {path}: still cannot write it: 121 failures in a row over 60 s "
        "(119 not logged): "
    )
    assert lines[3] == (
        f"lock state {path}: written again after 121 failed write(s) (61 s); the record of "
        "the locks is up to date"
    )
    # Of the runs of failures that come and go, one a minute is logged, start and end.
    assert lines[4].startswith(f"lock state {path}: cannot write it (")
    assert lines[4].endswith("one line a minute)")
    assert lines[5].startswith(f"lock state {path}: written again after 1 failed write(s)")
    assert lines[6].endswith(
        "(29 more such episode(s) in the 58 s before were not logged: it comes and goes)"
    )
    assert lines[7].startswith(f"lock state {path}: written again after 1 failed write(s)")
    assert state.write_failures == 121 + 31 and not state.stale
    assert LockState(tmp_path).read()[KEY]["max_mhz"] == 1030


def test_the_loop_exports_lock_state_write_failures_and_recovers(
    tmp_path: Path, disk: _Disk, metrics_server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop makes its own LockState: its writer waits PATIENT_S too.
    real_writer = lockstate.LatestWriter
    monkeypatch.setattr(
        lockstate,
        "LatestWriter",
        lambda write, deadline_s, **options: real_writer(write, PATIENT_S, **options),
    )
    fake = FakeNvml(1)
    assembled = fixed_clock_node(tmp_path, metrics_server, fake)
    exporter = Exporter(serve=False)
    seen: list[tuple[float | None, float | None, Any]] = []

    def on_step(step: int, records: Any) -> None:
        seen.append(lock_state_reading(exporter, fake))
        if step == 1:
            disk.full = False  # space freed: the next tick's retry goes through

    try:
        run_ticks(assembled.domains, 4, on_step=on_step, exporter=exporter)
    finally:
        assembled.close()
    assert seen == [
        (1.0, 1.0, (1410, 1410)),  # the lock's record failed; the lock holds
        (2.0, 1.0, (1410, 1410)),  # the tick's retry failed too
        (2.0, 0.0, (1410, 1410)),  # written again
        (2.0, 0.0, (1410, 1410)),
    ]
    assert fake.locked(0) is None  # reset at stop
    assert LockState(tmp_path).read() == {}  # and its record removed


def test_a_run_without_a_lock_state_exports_zero_failures() -> None:
    exporter = Exporter(serve=False)
    assert exporter.registry.get_sample_value("gpugov_lock_state_write_failures_total") == 0.0
    assert exporter.registry.get_sample_value("gpugov_lock_state_stale_active") == 0.0


def test_a_record_holding_a_non_finite_number_is_written_not_raised(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    """A lock record read with NaN or Infinity in a field the loader does not check (another
    GPU's pid, a power limit's set_mw; Python's JSON reader takes both) made every write
    of the file raise ValueError out of the actuator: the daemon crashed at its first lock
    and again while resetting its clocks at stop. Such a number is now written as null."""
    (tmp_path / "locks.json").write_text(
        '{"version": 1, "gpus": {"GPU-elsewhere": {"gpu": "7", "min_mhz": 900, '
        '"max_mhz": 900, "pid": NaN, "time": "2026-01-01T00:00:00+00:00"}}, '
        '"power_limits": {"GPU-elsewhere": {"gpu": "7", "original_mw": 700000, '
        '"set_mw": Infinity}}}'
    )
    fake = FakeNvml(1)
    assembled = fixed_clock_node(tmp_path, metrics_server, fake)
    locked: list[Any] = []
    try:
        run_ticks(assembled.domains, 2, on_step=lambda step, records: locked.append(
            LockState(tmp_path).read().get(KEY, {}).get("max_mhz")
        ))  # fmt: skip
    finally:
        assembled.close()
    assert locked == [1410, 1410]  # recorded at the first lock
    assert fake.locked(0) is None  # reset at stop
    record = LockState(tmp_path)
    assert KEY not in record.read() and record.read()["GPU-elsewhere"]["pid"] is None
    assert record.power_limits()["GPU-elsewhere"]["set_mw"] is None
    assert not record.stale
