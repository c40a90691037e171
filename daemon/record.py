"""``--record FILE.jsonl``: one JSON line per domain per tick (reading it back is
:mod:`daemon.record_reader`'s).

The first line is a header (``"format": "gpugov-record-v1"``) naming the period and, per
domain, the controller, the safety settings and the supported clocks (left out of the
tick lines to keep them short). Each following line is a :class:`~daemon.domain.TickRecord`:
the observation, the controller's own decision, the requested clock after the safety
wrappers, the applied lock, the solve time, the fail-safe flag and any errors.
Non-finite floats are written as ``null``.

A node's recording is written on a writer thread through a bounded queue
(:class:`Recorder`), so a hung or slow disk never holds the loop: ticks it has not taken
are left out, counted, and marked on the next tick written (``dropped_ticks``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from gpugov import __version__
from gpugov.daemon.deadline import READER_IDLE_S, WRITE_DEADLINE_S, LatestWriter, WriteTimeout
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.errors import GpugovError
from gpugov.daemon.files import json_safe
from gpugov.plant.types import ServingObservation

log = logging.getLogger(__name__)

RECORD_FORMAT = "gpugov-record-v1"

RECORD_KEEP_PREVIOUS = 3
"""How many earlier recordings of a node's ``record`` path are kept, as ``FILE.1`` (the
last run's) to ``FILE.3``: a restart (``Restart=on-failure`` after a crash) truncated the
recording that showed what led to it."""

RECORD_QUEUE_TICKS = 1000
"""The most ticks a node's recording holds for its writer thread (:class:`Recorder`):
1000 s of a disk that takes none at the default period of 1 s, 50 s at the shortest
(0.05 s); a tick is a line of about 1 kB per domain, so a few MB at most. A healthy disk
takes each tick's lines in well under a millisecond."""

RECORD_ROTATE_BYTES = 100_000_000
"""The size at which a node's recording goes on in a new file at its path, the full one
kept as ``FILE.1`` (:func:`keep_previous_recordings`): about a day of one domain at the
default period of 1 s. Recorded for months, a node's recording filled its disk; with
the :data:`RECORD_KEEP_PREVIOUS` kept, the recording takes at most 400 MB."""


class RecordingError(GpugovError):
    """A recording file is unreadable or not a gpugov recording (names file and line)."""


class RecordingWarning(UserWarning):
    """A recording was read, but its cut-off last line was dropped."""


def observation_to_dict(observation: ServingObservation) -> dict[str, Any]:
    """JSON-able observation without ``supported_clocks_mhz`` (it is in the header)."""
    data = {
        f.name: getattr(observation, f.name)
        for f in dataclasses.fields(observation)
        if f.name != "supported_clocks_mhz"
    }
    cleaned: dict[str, Any] = json_safe(data)
    return cleaned


def record_to_dict(record: TickRecord) -> dict[str, Any]:
    """One tick line."""
    data = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    data["observation"] = observation_to_dict(record.observation)
    data["gpu_read_errors"] = list(record.gpu_read_errors)
    cleaned: dict[str, Any] = json_safe(data)
    return cleaned


def _json_line(data: Mapping[str, Any]) -> str:
    """One line of a recording (non-finite numbers as ``null``)."""
    return json.dumps(json_safe(dict(data)), allow_nan=False) + "\n"


def keep_previous_recordings(path: Path, keep: int = RECORD_KEEP_PREVIOUS) -> None:
    """Move a non-empty recording at ``path`` to ``path.1``, shifting older ones up to
    ``path.<keep>`` (the oldest beyond it is dropped), as logrotate numbers them; one log
    line says where it went, or, where a rename fails, that it will be overwritten."""
    try:
        kept = _shift_recordings(path, keep)
    except OSError as error:
        log.warning(
            "recording %s: cannot keep the previous recording (%s); it is overwritten",
            path,
            error.strerror or error,
        )
        return
    if kept is not None:
        log.info("recording %s: the previous recording kept as %s", path, kept.name)


def _shift_recordings(path: Path, keep: int = RECORD_KEEP_PREVIOUS) -> Path | None:
    """Move a non-empty recording at ``path`` to ``path.1``, older ones up to
    ``path.<keep>``; where it went (None: nothing to keep).

    Raises:
        OSError: a rename failed (``path`` is where it was).
    """
    if not path.is_file() or path.stat().st_size == 0:
        return None
    for index in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{index}")
        if older.is_file():
            older.replace(path.with_name(f"{path.name}.{index + 1}"))
    kept = path.with_name(f"{path.name}.1")
    path.replace(kept)
    return kept


class Recorder:
    """Writes the header, then one line per tick record; use as ``on_tick``.

    A node's recording (a header whose ``mode`` is not ``"simulated"``) is written on a
    writer thread (:class:`~daemon.deadline.LatestWriter`), so a hung or slow disk never
    holds the loop: each tick's lines join a queue of at most ``queue_ticks`` ticks (the
    one being written included), written in order, each tick's then a flush. While the
    queue is full, each tick is left out and counted (:attr:`dropped_ticks`, one warning
    at the first), until the disk has taken every tick queued; the lines of the first tick
    written after that gap carry ``dropped_ticks``, the count left out just before it (one
    line says so). A simulated run's recording is written on the caller's thread: its
    loop runs ahead of wall time, and its recording is whole, the same on every run.

    A write that fails once the run is under way (a full disk, a file-size limit, an I/O
    error) ends the recording, not the run: one warning names the file and the error,
    and the ticks after it are not recorded. The recording so far stays readable (a cut
    last line is dropped by :func:`read_recording`).

    A node's recording keeps the earlier ones at its path (:func:`keep_previous_recordings`);
    a simulated run's overwrites its file. A node's recording that reaches
    ``rotate_bytes`` goes on in a new file at its path, its header first, the full one
    kept the same way (a simulated run's recording is the whole run, never rotated).

    Args:
        path: the JSONL file (its directory must exist: a mistyped path is refused, not
            created).
        header: extra header fields (period, domains with their clocks, run metadata).
        queue_ticks: the most ticks a node's recording holds for its writer.
        close_wait_s: how long :meth:`close` waits for the ticks queued (a hung disk holds
            the exit no longer).
        rotate_bytes: the size at which a node's recording goes on in a new file.

    Raises:
        RecordingError: the file cannot be opened for writing.
    """

    def __init__(
        self,
        path: str | Path,
        header: Mapping[str, Any],
        *,
        queue_ticks: int = RECORD_QUEUE_TICKS,
        close_wait_s: float = WRITE_DEADLINE_S,
        rotate_bytes: int = RECORD_ROTATE_BYTES,
    ) -> None:
        if queue_ticks < 1:
            raise ValueError(f"queue_ticks must be at least 1, got {queue_ticks!r}")
        if rotate_bytes < 1:
            raise ValueError(f"rotate_bytes must be at least 1, got {rotate_bytes!r}")
        self.path = Path(path)
        if header.get("mode") != "simulated":
            keep_previous_recordings(self.path)
        try:
            self._file: IO[str] | None = self.path.open("w")
        except OSError as error:
            raise RecordingError(
                f"{self.path}: cannot write the recording: {error.strerror or error}"
            ) from error
        self.lines = 0
        self.failed: str | None = None
        """Why the recording stopped early (None while it is written)."""
        self.dropped_ticks = 0
        """Ticks left out: the disk had not taken the ticks queued before them."""
        self._queue_ticks = queue_ticks
        self._queue: deque[list[str]] = deque()
        """Each queued tick's lines, oldest first; the writer removes one once written."""
        self._lock = threading.Lock()
        self._gap: tuple[int, int, int] | None = None
        """The ticks left out since the last one queued: count, first and last step."""
        self._closed = False
        self._writer = (
            None
            if header.get("mode") == "simulated"
            # A tick's lines every period: one thread kept, not one started per tick.
            else LatestWriter(self._drain, close_wait_s, name="record", idle_s=READER_IDLE_S)
        )
        self._rotate_bytes = rotate_bytes
        self._header_line = _json_line(
            {"format": RECORD_FORMAT, "gpugov_version": __version__, **header}
        )
        # Into the file's buffer: the first tick's flush writes it (the writer's, on a node).
        self._file.write(self._header_line)
        self._file_bytes = len(self._header_line)
        """What the file now written holds (the lines are ASCII: one byte a character)."""

    @property
    def queued_ticks(self) -> int:
        """Ticks handed to the writer thread and not yet written (a node's recording)."""
        with self._lock:
            return len(self._queue)

    def __call__(self, records: Sequence[TickRecord]) -> None:
        if self._writer is None:
            if self._file is not None:  # not stopped after a failed write, nor closed
                self._write_tick([_json_line(record_to_dict(record)) for record in records])
            return
        step = records[0].step if records else 0
        with self._lock:
            if self._closed or self.failed is not None:
                return
            if len(self._queue) >= self._queue_ticks or (self._gap and self._queue):
                self._drop(step)
                return
            rows = [record_to_dict(record) for record in records]
            if self._gap is not None:
                count, first, last = self._gap
                self._gap = None
                for row in rows:
                    row["dropped_ticks"] = count
                log.warning(
                    "recording %s: the disk has taken the ticks queued; %d tick(s) (steps %d "
                    "to %d) were left out of the recording, the next tick's lines say so "
                    "(dropped_ticks)",
                    self.path,
                    count,
                    first,
                    last,
                )
            self._queue.append([_json_line(row) for row in rows])
        self._writer.post(None)

    def _drop(self, step: int) -> None:
        """Leave tick ``step`` out (the lock held): count it; one warning at a gap's first."""
        self.dropped_ticks += 1
        if self._gap is not None:
            count, first, _ = self._gap
            self._gap = (count + 1, first, step)
            return
        self._gap = (1, step, step)
        log.warning(
            "recording %s: the disk has not taken the %d tick(s) queued (a hung or slow "
            "disk); from step %d, ticks are left out of the recording until it has, the run "
            "goes on",
            self.path,
            len(self._queue),
            step,
        )

    def _drain(self, _signal: object) -> None:
        """The writer thread's job: write the queued ticks, oldest first, until none is
        left; once :meth:`close` was called, then close the file."""
        while True:
            with self._lock:
                lines = self._queue[0] if self._queue else None
                closing = self._closed
            if lines is None:
                if closing:
                    self._discard()
                return
            if not self._write_tick(lines):
                return
            with self._lock:
                self._queue.popleft()

    def _write_tick(self, lines: Sequence[str]) -> bool:
        """Write one tick's lines and flush them; False (the recording stopped) when a
        write fails."""
        handle = self._file
        if handle is None:
            return False
        try:
            for line in lines:
                handle.write(line)
                self.lines += 1
                self._file_bytes += len(line)
            handle.flush()
            if self._writer is not None and self._file_bytes >= self._rotate_bytes:
                return self._rotate(handle)
        except OSError as error:
            self._stop(error)
            return False
        return True

    def _rotate(self, handle: IO[str]) -> bool:
        """Go on in a new file at the path, its header first, the full one kept as
        ``FILE.1`` (the writer thread's, between two ticks: each file reads whole);
        False (the recording stopped, one warning) where the full one cannot be kept
        aside: it is not truncated for the next.

        Raises:
            OSError: the new file cannot be opened or written (the recording stops).
        """
        self._file = None
        handle.close()
        try:
            kept = _shift_recordings(self.path)
        except OSError as error:
            self.failed = error.strerror or str(error)
            log.warning(
                "recording %s: reached %d bytes and cannot be kept aside as %s.1 (%s); "
                "recording stopped after %d tick line(s), the file kept whole, the run goes on",
                self.path,
                self._file_bytes,
                self.path.name,
                self.failed,
                self.lines,
            )
            with self._lock:
                self._queue.clear()
            return False
        if kept is not None:
            log.info("recording %s: the previous recording kept as %s", self.path, kept.name)
        fresh = self.path.open("w")
        self._file = fresh
        fresh.write(self._header_line)
        self._file_bytes = len(self._header_line)
        return True

    def _stop(self, error: OSError) -> None:
        """End the recording after a failed write: one warning; the run goes on."""
        self.failed = error.strerror or str(error)
        log.warning(
            "recording %s: cannot write it (%s); recording stopped after %d tick line(s), "
            "the run goes on",
            self.path,
            self.failed,
            self.lines,
        )
        with self._lock:
            self._queue.clear()
        self._discard()

    def _discard(self) -> None:
        """Close the file, dropping what its buffer could not write."""
        handle, self._file = self._file, None
        if handle is None:
            return
        with contextlib.suppress(OSError):  # the buffer's rest is lost, as the warning says
            handle.close()

    def close(self) -> None:
        """Close the file (idempotent); a failing final write is one warning, never an
        error (the clocks are reset by then). A node's recording waits for the ticks
        queued at most ``close_wait_s``: past that (a hung disk) one warning says how many
        are not in it, and the writer closes the file if the disk answers."""
        if self._writer is None:
            if self._file is None:
                return
            try:
                self._file.flush()
            except OSError as error:
                self._stop(error)
                return
            self._discard()
            return
        with self._lock:
            if self._closed or self.failed is not None:
                self._closed = True
                return
            self._closed = True
            gap = self._gap
        self._writer.post(None)
        left_out = "" if gap is None else f", nor the {gap[0]} left out before them"
        try:
            self._writer.wait()
        except WriteTimeout:
            log.warning(
                "recording %s: the disk has not taken the last %d tick(s) within %g s at "
                "exit (a hung or slow disk); they are not in the recording%s",
                self.path,
                self.queued_ticks,
                self._writer.deadline_s,
                left_out,
            )
            return
        if gap is not None:
            log.warning(
                "recording %s: its last %d tick(s) (steps %d to %d) were left out (the disk "
                "had not taken the ticks queued before them)",
                self.path,
                *gap,
            )
