"""Reading a trace file safely: streamed in chunks, with a size cap and a line-length cap.

A trace is small text (the shared ones are at most a few MB). Reading ``/dev/zero`` or a
runaway file must fail at a documented limit, naming the file and line, not fill memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

MAX_TRACE_BYTES = 1 << 30
"""Largest trace file read (1 GiB; the shared traces are at most a few MB). A device or a
runaway file (``/dev/zero``) is refused at this size instead of filling memory."""

MAX_LINE_BYTES = 1 << 16
"""Longest line a trace may have (64 KiB; real rows are under 200 bytes)."""

_READ_CHUNK_BYTES = 1 << 20


def read_trace_text(
    path: Path, fail: Callable[[Path, int | None, str], Exception]
) -> tuple[str, str]:
    """Read a trace as UTF-8 text (BOM allowed); return (text, sha256 of the bytes).

    Streamed in 1 MiB chunks, refusing (with the line number) a line longer than
    :data:`MAX_LINE_BYTES` or a file larger than :data:`MAX_TRACE_BYTES`.
    """
    chunks: list[bytes] = []
    hasher = hashlib.sha256()
    total = 0
    lines_before = 0  # complete lines in the chunks read so far
    line_length = 0  # bytes since the last newline
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(_READ_CHUNK_BYTES):
                total += len(chunk)
                if total > MAX_TRACE_BYTES:
                    raise fail(
                        path,
                        None,
                        f"larger than the {MAX_TRACE_BYTES:,}-byte limit of a trace; "
                        "split it or select the window you need first",
                    )
                parts = chunk.split(b"\n")  # parts[0] continues the current line
                for index, part in enumerate(parts):
                    length = len(part) + (line_length if index == 0 else 0)
                    if length > MAX_LINE_BYTES:
                        raise fail(
                            path,
                            lines_before + index + 1,
                            f"line longer than {MAX_LINE_BYTES} bytes; not a trace "
                            "(rows are a timestamp and two token counts)",
                        )
                line_length = len(parts[-1]) + (line_length if len(parts) == 1 else 0)
                lines_before += len(parts) - 1
                hasher.update(chunk)
                chunks.append(chunk)
    except OSError as e:
        raise fail(path, None, f"cannot read trace file: {e.strerror or e}") from e
    data = b"".join(chunks)
    digest = hasher.hexdigest()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise fail(path, line, f"not UTF-8 text ({e.reason} at byte {e.start})") from e
    return text, digest
