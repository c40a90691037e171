"""Reading a trace file safely: the shared bounded reader (:mod:`plant.input_files`) with
the trace's caps, each refusal raised through the trace loader's own error.

A trace is small text (the shared ones are at most a few MB). Reading ``/dev/zero``, a FIFO
or a runaway file must fail at a documented limit, naming the file and line, not fill memory
or hang.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpugov.plant.input_files import FILE_LIMITS, InputFileError, read_input_text_and_digest

MAX_TRACE_BYTES = FILE_LIMITS["trace"].max_bytes
"""Largest trace file read (1 GiB; the shared traces are at most a few MB)."""

MAX_LINE_BYTES = FILE_LIMITS["trace"].max_line_bytes
"""Longest line a trace may have (64 KiB; real rows are under 200 bytes)."""


def read_trace_text(
    path: Path, fail: Callable[[Path, int | None, str], Exception]
) -> tuple[str, str]:
    """Read a trace as UTF-8 text (BOM allowed); return (text, sha256 of the bytes).

    Raises:
        Exception: ``fail(path, line, reason)`` for a file the bounded reader refuses.
    """
    try:
        return read_input_text_and_digest(path, "trace")
    except InputFileError as error:
        raise fail(path, error.line, error.reason) from error
