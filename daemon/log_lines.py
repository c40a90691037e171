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
import sys

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


def log_to_stderr(level: int) -> None:
    """Log records at ``level`` and above to stderr, one :class:`LineFormatter` line each
    (``logging.basicConfig``: nothing when the root logger has a handler already)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter())
    logging.basicConfig(level=level, handlers=[handler])


def escape_unconfigured_logs() -> None:
    """A command that sets up no logging (every command but the node's) still prints its
    warnings through ``logging.lastResort``, the message alone: print them as the
    command's own warning lines (:class:`CommandLineFormatter`), one escaped line each."""
    if logging.lastResort is not None:
        logging.lastResort.setFormatter(CommandLineFormatter())
