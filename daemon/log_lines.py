"""The daemon's log lines: one event a line, on stderr, whatever text the event quotes.

A log line quotes text from outside the daemon: an engine's labels (``model_name``) and
error pages, NVML's GPU names, URLs and paths from the config, requests on the actuator's
socket, zeusd's answers. A newline in such text would start a line a reader (journald,
syslog, a log shipper) takes for the daemon's own, and an escape sequence would drive the
terminal that shows it. :class:`LineFormatter` writes each record, its traceback
included, as one line through :func:`~gpugov.daemon.errors.printable`, for the node's
commands (:func:`log_to_stderr`); every other command prints a logged warning as its own
warning line (:class:`CommandLineFormatter`, :func:`escape_unconfigured_logs`), through
the same :func:`command_line` as ``cli_support.warn``. The values stay as they came
everywhere else (the model store compares the raw ``model_name``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from typing import Any, TextIO

from gpugov.daemon.errors import printable

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""A log line: time, level, logger, message."""


class LineFormatter(logging.Formatter):
    """``fmt`` (:data:`LOG_FORMAT`), each record one line: a newline, a carriage return or
    an escape sequence in its message or traceback written as ``\\n``, ``\\r``,
    ``\\x1b``, and the line bounded (:func:`~gpugov.daemon.errors.printable`)."""

    def __init__(self, fmt: str = LOG_FORMAT) -> None:
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        """The record as one escaped, bounded line."""
        return printable(super().format(record))


def command_line(kind: str, message: str) -> str:
    """A command's own line on stderr, ``gpugov: KIND: MESSAGE``, the message escaped and
    bounded (:func:`~gpugov.daemon.errors.printable`): every error, warning and note line."""
    return f"gpugov: {kind}: {printable(message)}"


class CommandLineFormatter(logging.Formatter):
    """A record as a command's warning line (:func:`command_line`): ``gpugov: warning:``,
    ``gpugov: error:`` at ERROR and above; an exception's one line, never a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one ``gpugov: warning:`` (or ``error:``) line."""
        message = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            message = f"{message}: {error!r}"
        return command_line("error" if record.levelno >= logging.ERROR else "warning", message)


LOG_WAIT_S = 0.5
"""How long a log call waits for its line to be written to stderr (microseconds when the
reader reads) before it goes on without it (:class:`BoundedStreamHandler`)."""
LOG_QUEUE_LINES = 1000
"""Lines held for a stderr that has not taken them; past that, lines are left out."""


class BoundedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A :class:`logging.StreamHandler` whose lines are written on a thread of its own: a
    log call waits for its line at most :data:`LOG_WAIT_S`, and not at all while a line
    is still not taken after that (a full pipe: the log reader stopped reading, as a
    container runtime's blocking log mode does on a full log disk).

    Written on the caller's thread, such a write held the caller until the reader came
    back: the loop, and a SIGTERM's reset, with the GPUs locked. At most
    :data:`LOG_QUEUE_LINES` lines wait; those past it are left out and counted, in one
    line where they would have been. Each line is out before its call returns while the
    stream takes lines, so the order with what is printed to the same stream holds.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._lines: deque[str] = deque()
        # Reentrant: a signal handler that logs may land while this thread holds it.
        self._changed = threading.Condition(threading.RLock())
        self._queued = 0
        self._written = 0
        self._left_out = 0
        self._writing_since: float | None = None
        self._writer: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """A forked child has no writer thread: its first line starts one of its own."""
        self._changed = threading.Condition(threading.RLock())
        self._writer = None
        self._writing_since = None

    def emit(self, record: logging.LogRecord) -> None:
        """Queue the record's line and wait for it (see the class)."""
        try:
            line = self.format(record) + self.terminator
        except Exception:  # as StreamHandler.emit: a record that cannot be formatted
            self.handleError(record)
            return
        self.write_line(line)

    def write_line(self, line: str) -> None:
        """Write ``line`` (its newline included) after the lines queued, waiting for it as
        a record's (:func:`print_to_stderr`: a command's own last line)."""
        with self._changed:
            if len(self._lines) >= LOG_QUEUE_LINES:
                self._left_out += 1
                return
            if self._left_out:
                self._queue(self._left_out_line())
            number = self._queue(line)
            if self._stuck():
                return
            self._changed.wait_for(lambda: self._written >= number, timeout=LOG_WAIT_S)

    def flush(self) -> None:
        """Wait, at most :data:`LOG_WAIT_S` and not while the stream is stuck, for every
        queued line to be written (the exit's ``logging.shutdown``)."""
        with self._changed:
            if not self._stuck():
                self._changed.wait_for(lambda: not self._lines, timeout=LOG_WAIT_S)

    def _queue(self, line: str) -> int:
        """Hand ``line`` to the writer thread (started on the first); its number."""
        self._lines.append(line)
        self._queued += 1
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="gpugov-log", daemon=True)
            self._writer.start()
        self._changed.notify_all()
        return self._queued

    def _stuck(self) -> bool:
        """Whether a line has been in the stream's write for longer than the wait."""
        since = self._writing_since
        return since is not None and time.monotonic() - since >= LOG_WAIT_S

    def _left_out_line(self) -> str:
        """The line standing for the lines left out since the last one queued (their
        count is reset), formatted as a record of its own."""
        notice = logging.makeLogRecord(
            {
                "name": __name__,
                "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": "%d log line(s) left out: stderr did not take them (its reader "
                "stopped reading: a full pipe)",
                "args": (self._left_out,),
            }
        )
        self._left_out = 0
        return self.format(notice) + self.terminator

    def _write(self) -> None:
        """The writer thread: each queued line, in order, written and flushed."""
        stream: Any = self.stream
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._lines))
                line = self._lines[0]
                self._writing_since = time.monotonic()
            try:
                stream.write(line)
                stream.flush()
            except Exception:  # a stream that fails: nowhere to say so
                pass
            finally:
                with self._changed:
                    self._lines.popleft()
                    self._written += 1
                    self._writing_since = None
                    if not self._lines and self._left_out:  # no later line to say it
                        self._queue(self._left_out_line())
                    self._changed.notify_all()


def print_to_stderr(text: str) -> None:
    """Print ``text`` as one line on stderr (a command's error or last line). Where the
    root logger writes stderr through a :class:`BoundedStreamHandler` (``run``, the
    actuator), through it: after the log lines queued, and never waiting long on a stderr
    that takes no lines, where a ``print`` waited for the reader with the GPUs reset and
    the exit held (Ctrl-C's ``interrupted`` line, exit 6's)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, BoundedStreamHandler) and handler.stream is sys.stderr:
            handler.write_line(text + handler.terminator)
            return
    print(text, file=sys.stderr)


def log_to_stderr(level: int) -> None:
    """Log records at ``level`` and above to stderr, one :class:`LineFormatter` line each,
    never waiting long on a stderr that takes no lines (:class:`BoundedStreamHandler`)
    (``logging.basicConfig``: nothing when the root logger has a handler already)."""
    handler = BoundedStreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter())
    logging.basicConfig(level=level, handlers=[handler])


def escape_unconfigured_logs() -> None:
    """A command that sets up no logging (every command but the node's) still prints its
    warnings through ``logging.lastResort``, the message alone: print them as the
    command's own warning lines (:class:`CommandLineFormatter`), one escaped line each."""
    if logging.lastResort is not None:
        logging.lastResort.setFormatter(CommandLineFormatter())
