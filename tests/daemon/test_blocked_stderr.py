"""A stderr that stops taking lines (a pipe its reader stopped reading: a container
runtime's blocking log mode on a full log disk) never holds the daemon's log calls: the
loop, a stop's reset and the exit go on, and the lines come out in order once it takes
them again, those left out counted in one line."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

import pytest
from daemon_support import JOIN_S

from gpugov.daemon.log_lines import (
    LOG_QUEUE_LINES,
    BoundedStreamHandler,
    LineFormatter,
    print_to_stderr,
)


class StuckStream:
    """A stream whose writes block until :attr:`release` is set (a full pipe)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.release.wait(JOIN_S)
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def _logger(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger("gpugov.test.blocked_stderr")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_log_calls_do_not_wait_on_a_stderr_that_takes_no_lines() -> None:
    """Before, each log call wrote to stderr on the caller's thread: a full pipe held the
    loop (and a SIGTERM's stop) there, the GPUs locked, until the reader came back."""
    stream = StuckStream()
    handler = BoundedStreamHandler(stream)
    handler.setFormatter(LineFormatter("%(message)s"))
    logger = _logger(handler)
    try:
        started = time.monotonic()
        total = LOG_QUEUE_LINES + 50
        for number in range(total):
            logger.info("line %d", number)
        handler.flush()  # the exit's: waits for nothing while the stream hangs
        took_s = time.monotonic() - started
        # One wait, not one per line (those would take minutes): a bound, not a timing.
        assert took_s < JOIN_S / 2, took_s
        assert not stream.text
        stream.release.set()
        deadline = time.monotonic() + JOIN_S
        while time.monotonic() < deadline and not any("left out" in t for t in stream.text):
            time.sleep(0.01)
        lines = "".join(stream.text).splitlines()
        # The first lines in order; those past the queue's room left out, said once.
        assert lines[:-1] == [f"line {number}" for number in range(LOG_QUEUE_LINES)]
        assert lines[-1].startswith(
            f"{total - LOG_QUEUE_LINES} log line(s) left out: stderr did not take them"
        )
    finally:
        stream.release.set()
        handler.close()


def test_a_healthy_stream_gets_each_line_before_the_call_returns() -> None:
    """Written on the handler's thread, each line is still out before its log call
    returns (a command's own last line, printed to the same stderr, comes after it)."""
    stream = StuckStream()
    stream.release.set()
    handler = BoundedStreamHandler(stream)
    handler.setFormatter(LineFormatter("%(message)s"))
    logger = _logger(handler)
    try:
        for number in range(20):
            logger.warning("line %d", number)
            assert stream.text[-1] == f"line {number}\n"
    finally:
        handler.close()


def test_a_forked_child_writes_its_lines_with_a_writer_of_its_own(tmp_path: Path) -> None:
    """The writer thread is not forked with the process: a child's lines waited for a
    thread it does not have, 0.5 s each, and were lost."""
    import os

    path = tmp_path / "child.log"
    with path.open("w") as stream:
        handler = BoundedStreamHandler(stream)
        handler.setFormatter(LineFormatter("%(message)s"))
        logger = _logger(handler)
        logger.warning("parent")  # the parent's writer thread runs
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            logger.warning("child")  # lost where the child had no writer thread
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        handler.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert path.read_text().splitlines() == ["parent", "child"]


def test_a_commands_last_line_goes_after_the_log_lines_and_never_waits_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C's ``interrupted`` line (exit 6's, any ``gpugov: error:``) was printed to the
    stderr the log lines go to: on a stuck pipe the print waited for the reader, the GPUs
    reset and the exit held. It goes through the log's writer now, after its lines."""
    stream = StuckStream()
    monkeypatch.setattr(sys, "stderr", stream)
    handler = BoundedStreamHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(LineFormatter("%(message)s"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    try:
        started = time.monotonic()
        logging.getLogger("gpugov.test.last_line").warning("received SIGINT; stopping")
        print_to_stderr("gpugov: interrupted; every clock gpugov locked was reset")
        assert time.monotonic() - started < JOIN_S / 2  # not held by the stuck stream
        assert not stream.text
        stream.release.set()
        deadline = time.monotonic() + JOIN_S
        while len(stream.text) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stream.text == [
            "received SIGINT; stopping\n",
            "gpugov: interrupted; every clock gpugov locked was reset\n",
        ]
    finally:
        stream.release.set()
        handler.close()
