"""A node's ``--record`` on a disk that hangs or fills: its lines are written on a writer
thread through a bounded queue (:class:`daemon.record.Recorder`), so the loop never waits
on the disk; ticks the disk has not taken are left out, counted and marked on the next
tick written, and a full disk stops the recording as it always did.

A hung disk is the recording's file whose ``write`` blocks on a :class:`threading.Event`.
Every check is of what happened, never of wall time: a call that should not wait must
return while the disk is still hung (a safety timer frees the disk after :data:`JOIN_S`,
so a regression fails instead of hanging the suite)."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from daemon_support import JOIN_S, MetricsServer, eventually, fixed_clock_node, freed_at_end
from fake_pynvml import FakeNvml

from gpugov.daemon.controller_config import FixedControllerConfig
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.loop import RunStats, TimedLoop, VirtualClock, run
from gpugov.daemon.record import Recorder
from gpugov.daemon.record_reader import check_recording, read_recording
from gpugov.daemon.replay import replay


class _Disk:
    """The disk under the recording: while :attr:`hung`, each write blocks until
    :attr:`release` is set; while :attr:`full`, each write fails with ENOSPC."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.hung = False
        self.full = False
        self.release = threading.Event()
        self.blocked = threading.Event()
        """Set once a write is blocked on the hung disk."""

    @property
    def hanging(self) -> bool:
        """Whether writes block now."""
        return self.hung and not self.release.is_set()

    def write(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.hanging:
            self.blocked.set()
            self.release.wait(JOIN_S)


class _DiskFile:
    """The recording's open file: each ``write`` goes through :class:`_Disk` first."""

    def __init__(self, real: Any, disk: _Disk) -> None:
        self._real = real
        self._disk = disk

    def write(self, text: str) -> int:
        self._disk.write()
        return int(self._real.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Disk]:
    """``tmp_path / "run.jsonl"`` on a disk the test hangs or fills, freed at the end of the
    test (or after :data:`JOIN_S`)."""
    disk = _Disk(tmp_path / "run.jsonl")
    real_open = Path.open

    def open_(self: Path, mode: str = "r", *args: Any, **options: Any) -> Any:
        handle = real_open(self, mode, *args, **options)
        return _DiskFile(handle, disk) if self == disk.path and "w" in mode else handle

    monkeypatch.setattr(Path, "open", open_)
    with freed_at_end(disk.release.set):
        yield disk


def _run(assembled: Any, ticks: int, on_tick: Callable[[Sequence[TickRecord]], None]) -> RunStats:
    """The daemon loop over the node's domains for ``ticks`` ticks, on virtual time."""
    clock = VirtualClock()
    try:
        return run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            on_tick=on_tick,
            before_tick=lambda now, step: step >= ticks,
        )
    finally:
        assembled.close()


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_hung_record_write_never_holds_the_loop_and_the_gap_is_marked(
    tmp_path: Path,
    disk: _Disk,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.record")
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    assert assembled.header["mode"] == "node"
    recorder = Recorder(disk.path, assembled.header, queue_ticks=3, close_wait_s=JOIN_S)
    disk.hung = True
    seen: list[tuple[int, bool, int, int]] = []

    def on_tick(records: Sequence[TickRecord]) -> None:
        recorder(records)
        step = records[0].step
        if step == 0:  # the writer holds step 0's line on the hung disk
            assert disk.blocked.wait(JOIN_S)
        seen.append((step, disk.hanging, recorder.queued_ticks, recorder.dropped_ticks))
        if step == 9:  # the disk answers: the queued ticks land, the next one is taken
            disk.release.set()
            assert eventually(lambda: recorder.queued_ticks == 0)

    stats = _run(assembled, 12, on_tick)
    recorder.close()
    # Every tick ran while step 0's write hung; the queue (the tick being written and
    # two more) filled, and the ticks after it were left out and counted.
    assert stats.ticks == 12
    assert seen[:10] == [(0, True, 1, 0), (1, True, 2, 0), (2, True, 3, 0)] + [
        (step, True, 3, step - 2) for step in range(3, 10)
    ]
    assert recorder.dropped_ticks == 7 and recorder.failed is None
    # The queued ticks landed in order; the first tick after the gap carries its count.
    header, rows = read_recording(disk.path)
    assert header["mode"] == "node"
    assert [row["step"] for row in rows] == [0, 1, 2, 10, 11]
    assert [row.get("dropped_ticks") for row in rows] == [None, None, None, 7, None]
    # The readers take it as any recording.
    check_recording(disk.path, header, rows)
    report = replay(disk.path, FixedControllerConfig(kind="fixed", clock_mhz=1410))
    assert report.compared == 5 and report.differing == 0
    # One line when the ticks start being left out, one when the disk has taken them.
    assert _messages(caplog, "ticks are left out") == [
        f"recording {disk.path}: the disk has not taken the 3 tick(s) queued (a hung or "
        "slow disk); from step 3, ticks are left out of the recording until it has, the "
        "run goes on"
    ]
    assert _messages(caplog, "were left out") == [
        f"recording {disk.path}: the disk has taken the ticks queued; 7 tick(s) (steps 3 to "
        "9) were left out of the recording, the next tick's lines say so (dropped_ticks)"
    ]


def test_a_node_recording_is_byte_for_byte_the_one_written_on_the_loops_thread(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    """The writer thread changes where the lines are written, not what: a node's file is
    the one a simulated run's recorder (on the caller's thread, as every recording was)
    writes of the same ticks, its header's mode aside."""
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    header = assembled.header
    node = Recorder(tmp_path / "node.jsonl", header, close_wait_s=JOIN_S)
    here = Recorder(tmp_path / "here.jsonl", {**header, "mode": "simulated"})

    def on_tick(records: Sequence[TickRecord]) -> None:
        node(records)
        here(records)

    _run(assembled, 20, on_tick)
    node.close()
    here.close()
    written = (tmp_path / "node.jsonl").read_bytes().splitlines(keepends=True)
    expected = (tmp_path / "here.jsonl").read_bytes().splitlines(keepends=True)
    assert len(written) == 21 and written[1:] == expected[1:]
    assert written[0] == expected[0].replace(b'"mode": "simulated"', b'"mode": "node"')
    assert node.dropped_ticks == 0 and b"dropped_ticks" not in b"".join(written)


@pytest.mark.parametrize("mode", ["node", "simulated"])
def test_a_full_disk_stops_the_recording_not_the_run(
    tmp_path: Path,
    disk: _Disk,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    """As documented, on either thread: one warning naming the file, the error and the
    tick lines written; the ticks after it are not recorded; the run goes on."""
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.record")
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    recorder = Recorder(disk.path, {**assembled.header, "mode": mode}, close_wait_s=JOIN_S)

    def on_tick(records: Sequence[TickRecord]) -> None:
        if records[0].step == 3:  # three ticks on disk, then it is full
            assert eventually(lambda: recorder.queued_ticks == 0)
            disk.full = True
        recorder(records)

    stats = _run(assembled, 8, on_tick)
    assert eventually(lambda: recorder.failed is not None)
    recorder.close()
    assert stats.ticks == 8 and recorder.failed == "No space left on device"
    assert _messages(caplog, "recording stopped") == [
        f"recording {disk.path}: cannot write it (No space left on device); recording "
        "stopped after 3 tick line(s), the run goes on"
    ]
    _, rows = read_recording(disk.path)
    assert [row["step"] for row in rows] == [0, 1, 2]


def test_the_exit_waits_for_a_hung_disk_at_most_its_bound(
    tmp_path: Path,
    disk: _Disk,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """:meth:`Recorder.close` waits for the ticks queued at most ``close_wait_s``, then
    says how many are not written and returns with the disk still hung; the writer
    writes them and closes the file if the disk answers."""
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.record")
    batches: list[Sequence[TickRecord]] = []
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    _run(assembled, 4, batches.append)
    recorder = Recorder(disk.path, assembled.header, close_wait_s=0.05)
    disk.hung = True
    for batch in batches:
        recorder(batch)
    assert disk.blocked.wait(JOIN_S)
    recorder.close()
    assert disk.hanging and recorder.queued_ticks == 4
    assert _messages(caplog, "at exit") == [
        f"recording {disk.path}: the disk has not taken the last 4 tick(s) within 0.05 s at "
        "exit (a hung or slow disk); they are not in the recording"
    ]
    recorder(batches[0])  # closed: nothing more is queued
    assert recorder.queued_ticks == 4
    disk.release.set()
    assert eventually(lambda: recorder.queued_ticks == 0)
    _, rows = read_recording(disk.path)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="queue_ticks must be at least 1, got 0"):
        Recorder(tmp_path / "other.jsonl", assembled.header, queue_ticks=0)


def test_ticks_left_out_at_the_end_are_told_at_exit(
    tmp_path: Path,
    disk: _Disk,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A gap no tick followed (the disk answered only at the exit) is one line at the
    close, once the queued ticks are written."""
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.record")
    batches: list[Sequence[TickRecord]] = []
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    _run(assembled, 3, batches.append)
    recorder = Recorder(disk.path, assembled.header, queue_ticks=1, close_wait_s=JOIN_S)
    disk.hung = True
    for batch in batches:
        recorder(batch)
    assert recorder.dropped_ticks == 2
    disk.release.set()
    recorder.close()
    assert _messages(caplog, "its last") == [
        f"recording {disk.path}: its last 2 tick(s) (steps 1 to 2) were left out (the disk "
        "had not taken the ticks queued before them)"
    ]
    _, rows = read_recording(disk.path)
    assert [row["step"] for row in rows] == [0]


def test_a_node_recording_keeps_one_writer_thread_across_ticks(
    tmp_path: Path, metrics_server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick's lines every period: the writer's thread waits for the next tick instead
    of a thread being started per tick."""
    threads: list[int] = []
    drain = Recorder._drain

    def counted(self: Recorder, payload: Any) -> None:
        threads.append(threading.get_ident())
        drain(self, payload)

    monkeypatch.setattr(Recorder, "_drain", counted)
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    recorder = Recorder(tmp_path / "run.jsonl", assembled.header, close_wait_s=JOIN_S)

    def on_tick(records: Sequence[TickRecord]) -> None:
        recorder(records)
        assert eventually(lambda: recorder.queued_ticks == 0)  # written before the next

    _run(assembled, 6, on_tick)
    recorder.close()
    assert len(threads) >= 6 and len(set(threads)) == 1
    assert threading.get_ident() not in threads
    _, rows = read_recording(tmp_path / "run.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4, 5]


def test_the_ticks_left_out_are_exported(
    tmp_path: Path, disk: _Disk, metrics_server: MetricsServer
) -> None:
    """``gpugov_recording_dropped_ticks_total`` follows the recorder's count (published
    before each tick's lines are handed over, so one tick behind)."""
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    recorder = Recorder(disk.path, assembled.header, queue_ticks=2, close_wait_s=JOIN_S)
    disk.hung = True
    exporter = Exporter(serve=False)
    exported: list[float | None] = []
    clock = VirtualClock()
    try:
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            exporter=exporter,
            on_tick=recorder,
            before_tick=lambda now, step: (
                exported.append(
                    exporter.registry.get_sample_value("gpugov_recording_dropped_ticks_total")
                )
                or step >= 6
            ),
        )
    finally:
        assembled.close()
    disk.release.set()
    recorder.close()
    # Step 0 hangs on the disk, step 1 waits behind it; steps 2 to 5 are left out.
    assert recorder.dropped_ticks == 4
    assert exported == [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]


def _header(path: Path) -> dict[str, Any]:
    header: dict[str, Any] = json.loads(path.read_text().splitlines()[0])
    return header


def test_a_node_recording_keeps_the_previous_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart (``Restart=on-failure`` after a crash) truncated the recording that
    showed what led to it: a node's earlier recordings are kept as FILE.1 (the last run's)
    to FILE.3, as logrotate numbers them; a simulated run's file is overwritten."""
    caplog.set_level(logging.INFO, logger="gpugov.daemon.record")
    path = tmp_path / "run.jsonl"
    for number in range(5):
        Recorder(path, {"mode": "node", "run": number}, close_wait_s=JOIN_S).close()
    runs = {
        name: _header(tmp_path / name)["run"]
        for name in ("run.jsonl", "run.jsonl.1", "run.jsonl.2", "run.jsonl.3")
    }
    assert runs == {"run.jsonl": 4, "run.jsonl.1": 3, "run.jsonl.2": 2, "run.jsonl.3": 1}
    assert not (tmp_path / "run.jsonl.4").exists()
    assert f"recording {path}: the previous recording kept as run.jsonl.1" in caplog.messages
    # An empty file (a run stopped before its first line) is not kept: nothing shifts.
    path.write_text("")
    Recorder(path, {"mode": "node", "run": 5}, close_wait_s=JOIN_S).close()
    assert _header(tmp_path / "run.jsonl.1")["run"] == 3
    # A simulated run's recording is the same on every run: overwritten, none kept.
    sim = tmp_path / "sim.jsonl"
    for number in range(2):
        Recorder(sim, {"mode": "simulated", "run": number}).close()
    assert sorted(p.name for p in tmp_path.glob("sim.jsonl*")) == ["sim.jsonl"]


def test_a_node_recording_is_rotated_at_its_size_limit(
    tmp_path: Path, metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon that records for months filled its disk: a node's recording that reaches
    ``rotate_bytes`` goes on in a new file at its path, the full one kept as FILE.1 (older
    ones up to FILE.3, as at a start); each file has its header and reads whole, and no
    tick is lost or repeated across the files kept."""
    caplog.set_level(logging.INFO, logger="gpugov.daemon.record")
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    path = tmp_path / "run.jsonl"
    recorder = Recorder(path, assembled.header, close_wait_s=JOIN_S, rotate_bytes=6000)
    _run(assembled, 30, recorder)
    recorder.close()
    names = sorted(p.name for p in tmp_path.glob("run.jsonl*"))
    assert names == ["run.jsonl", "run.jsonl.1", "run.jsonl.2", "run.jsonl.3"]
    steps: list[int] = []
    for name in reversed(names):
        header, rows = read_recording(tmp_path / name)
        check_recording(tmp_path / name, header, rows)
        assert header["mode"] == "node" and rows
        assert (tmp_path / name).stat().st_size < 6000 + 2 * len(json.dumps(rows[-1]))
        steps += [row["step"] for row in rows]
    assert steps == list(range(steps[0], 30)) and steps[0] > 0
    assert any("the previous recording kept as run.jsonl.1" in m for m in caplog.messages)


def test_a_simulated_recording_is_never_rotated(tmp_path: Path) -> None:
    """A simulated run's recording is the whole run, the same on every run: one file."""
    path = tmp_path / "sim.jsonl"
    recorder = Recorder(path, {"mode": "simulated", "period_s": 1.0}, rotate_bytes=10)
    for _ in range(5):
        recorder([])
    recorder.close()
    assert sorted(p.name for p in tmp_path.glob("sim.jsonl*")) == ["sim.jsonl"]


def test_a_full_recording_that_cannot_be_kept_aside_is_kept_and_the_recording_stops(
    tmp_path: Path,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the full file cannot be renamed to FILE.1 at its size limit, it is not
    truncated for the next one: the recording stops there, one warning, and the file so
    far stays whole and readable."""
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.record")
    assembled = fixed_clock_node(tmp_path, metrics_server, FakeNvml(1))
    path = tmp_path / "run.jsonl"
    recorder = Recorder(path, assembled.header, close_wait_s=JOIN_S, rotate_bytes=6000)

    def refused(self: Path, target: Any) -> Path:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "replace", refused)
    _run(assembled, 30, recorder)
    recorder.close()
    assert sorted(p.name for p in tmp_path.glob("run.jsonl*")) == ["run.jsonl"]
    header, rows = read_recording(path)
    check_recording(path, header, rows)
    assert [row["step"] for row in rows] == list(range(len(rows))) and path.stat().st_size >= 6000
    assert recorder.failed is not None and "Permission denied" in recorder.failed
    stopped = [m for m in caplog.messages if "recording stopped" in m]
    assert len(stopped) == 1 and f"after {len(rows)} tick line(s)" in stopped[0]
