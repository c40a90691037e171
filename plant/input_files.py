"""The one bounded reader of every input file gpugov reads: configs, recordings, plans,
profiles, grids, traces and state files.

Each kind has a size cap and a line-length cap (:data:`FILE_LIMITS`). The reader refuses
what is not a regular file (a device such as ``/dev/zero``, a FIFO, a socket, a directory)
before it opens it, opens with ``O_NONBLOCK`` so a FIFO swapped in between cannot block,
streams in chunks so memory stays within the cap, and requires UTF-8 text without NUL
bytes. Every refusal is one :class:`InputFileError` whose message names the file (and the
line, where there is one). It lives in ``plant/`` because the plant's own loaders (traces,
profiles) and the controllers' plan loader use it; ``gpugov.daemon.files`` re-exports it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class FileLimits:
    """The caps of one kind of input file: its size and its longest line, in bytes."""

    max_bytes: int
    max_line_bytes: int


FILE_LIMITS: dict[str, FileLimits] = {
    "config": FileLimits(1 * MIB, 64 * KIB),
    "grid": FileLimits(1 * MIB, 64 * KIB),
    "plan": FileLimits(64 * MIB, 64 * MIB),
    "profile": FileLimits(16 * MIB, 16 * MIB),
    "trace": FileLimits(1 * GIB, 64 * KIB),
    "recording": FileLimits(1 * GIB, 16 * MIB),
    "results": FileLimits(1 * GIB, 16 * MIB),
    "state": FileLimits(16 * MIB, 16 * MIB),
    "budget": FileLimits(4 * KIB, 4 * KIB),
    "token": FileLimits(4 * KIB, 4 * KIB),
}
"""Caps per kind. Configs and grids are hand-written TOML; plans, profile manifests and
state files are JSON that may sit on one line; traces, recordings and sweep results are
line-oriented and may be long, but no line of theirs is. A power budget file holds one
number (a Kubernetes Downward API projection of a pod annotation), a token file (zeusd's
``token_file``) one bearer token."""

_CHUNK_BYTES = 1 * MIB


class InputFileError(ValueError):
    """An input file gpugov refuses to read; the message names the file (and the line)."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, reason: str) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {reason}")


def _size(count: int) -> str:
    """``1 MiB``, ``64 KiB``, ``1 GiB`` or a byte count."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if count >= unit and count % unit == 0:
            return f"{count // unit} {name}"
    return f"{count:,} bytes"


def _what(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_input_bytes(path: str | os.PathLike[str], kind: str) -> bytes:
    """The bytes of the ``kind`` input file at ``path``, within its caps.

    Raises:
        InputFileError: missing or unreadable, not a regular file, larger than the size
            cap, or a line longer than the line cap (naming the line).
        KeyError: ``kind`` is not in :data:`FILE_LIMITS` (a programming error).
    """
    limits = FILE_LIMITS[kind]
    source = Path(path)
    try:
        what = _what(os.stat(source).st_mode)
    except OSError as error:
        raise InputFileError(
            source, None, f"cannot read {kind} file: {error.strerror or error}"
        ) from error
    if what is not None:
        raise InputFileError(source, None, f"is {what}, not a {kind} file")
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as error:
        raise InputFileError(
            source, None, f"cannot read {kind} file: {error.strerror or error}"
        ) from error
    chunks: list[bytes] = []
    total = 0
    lines_before = 0  # complete lines in the chunks read so far
    line_length = 0  # bytes since the last newline
    try:
        info = os.fstat(fd)
        what = _what(info.st_mode)
        if what is not None:  # swapped between the stat and the open
            raise InputFileError(source, None, f"is {what}, not a {kind} file")
        if info.st_size > limits.max_bytes:
            raise InputFileError(
                source,
                None,
                f"{info.st_size:,} bytes, over the {_size(limits.max_bytes)} limit of a "
                f"{kind} file",
            )
        while True:
            try:
                chunk = os.read(fd, _CHUNK_BYTES)
            except BlockingIOError:
                chunk = b""
            if not chunk:
                break
            total += len(chunk)
            if total > limits.max_bytes:
                raise InputFileError(
                    source, None, f"over the {_size(limits.max_bytes)} limit of a {kind} file"
                )
            parts = chunk.split(b"\n")  # parts[0] continues the current line
            for index, part in enumerate(parts):
                length = len(part) + (line_length if index == 0 else 0)
                if length > limits.max_line_bytes:
                    raise InputFileError(
                        source,
                        lines_before + index + 1,
                        f"line longer than {_size(limits.max_line_bytes)}; not a {kind} file",
                    )
            line_length = len(parts[-1]) + (line_length if len(parts) == 1 else 0)
            lines_before += len(parts) - 1
            chunks.append(chunk)
    except OSError as error:
        raise InputFileError(
            source, None, f"cannot read {kind} file: {error.strerror or error}"
        ) from error
    finally:
        os.close(fd)
    return b"".join(chunks)


_COMPRESSED: tuple[tuple[bytes, str, str], ...] = (
    (b"\x1f\x8b", "gzip-compressed", "gunzip -k"),  # the Azure 2025 trace ships .csv.gz
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d"),
    (b"BZh", "bzip2-compressed", "bunzip2 -k"),
    (b"\xfd7zXZ\x00", "xz-compressed", "unxz -k"),
    (b"PK\x03\x04", "a zip archive", "unzip"),
)
"""Magic numbers of the compressed forms a downloaded trace comes in, each named with the
command that unpacks it: they were refused as "binary data (a NUL byte)" or "not UTF-8
text (invalid start byte at byte 1)", no help with a ``.jsonl.zst``. (``BZh`` is text
too, but no trace, config or recording starts with it.)"""


def decode_input_text(source: str | os.PathLike[str], data: bytes, kind: str) -> str:
    """``data`` (a ``kind`` file's bytes) as UTF-8 text (a BOM is dropped).

    Raises:
        InputFileError: compressed (gzip, zstd, bzip2, xz, zip) or UTF-16 (named as such),
            not UTF-8, or holds a NUL byte (binary), naming the line.
    """
    for magic, what, command in _COMPRESSED:
        if data.startswith(magic):
            raise InputFileError(
                source, None, f"{what}; not a {kind} file (decompress it: {command} FILE)"
            )
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # a UTF-16 BOM (a spreadsheet's export)
        raise InputFileError(
            source,
            None,
            f"UTF-16 text; a {kind} file is UTF-8 (convert it: iconv -f UTF-16 -t UTF-8)",
        )
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise InputFileError(source, line, f"binary data (a NUL byte); not a {kind} file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise InputFileError(
            source,
            line,
            f"not UTF-8 text ({error.reason} at byte {error.start}); not a {kind} file",
        ) from error


def read_input_text(path: str | os.PathLike[str], kind: str) -> str:
    """The ``kind`` input file at ``path`` as text, within its caps (see the module).

    Raises:
        InputFileError: one line naming the file (see :func:`read_input_bytes` and
            :func:`decode_input_text`).
    """
    return decode_input_text(path, read_input_bytes(path, kind), kind)


def path_exists(path: str | os.PathLike[str], *, dangling_links: bool = False) -> bool:
    """``Path(path).exists()`` (or, with ``dangling_links``, a link to nothing, so that
    reading it names what is missing), False where the name cannot be looked up at all:
    a name longer than the file system takes raises ``OSError: File name too long``,
    which escaped the loaders as a traceback or a line as long as the name."""
    candidate = Path(path)
    try:
        return candidate.exists() or (dangling_links and candidate.is_symlink())
    except OSError:
        return False


def plain_number_text(text: str) -> bool:
    """Whether ``text`` may be read as a number (a file's cell or a flag): ASCII without
    digit separators. ``int()`` and ``float()`` also read ``1_000`` and other scripts'
    digits, so a typo ``3_45`` was read as 345 and a full-width ``５`` as 5."""
    return text.isascii() and "_" not in text


def plain_float(text: str) -> float:
    """``float(text)`` of a :func:`plain_number_text` only.

    Raises:
        ValueError: ``text`` is no plain number (``1_0``, ``５``, ``abc``).
    """
    if not plain_number_text(text):
        raise ValueError(f"not a plain number: {text!r:.40}")
    return float(text)


def finite_number(value: object) -> float | None:
    """``value`` as a finite float when it is a JSON/TOML number (an int or a float, not a
    bool), else None: a string, a list, NaN, an infinity, or an integer too large for a
    float (``10**400``)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class _KeyTwice(ValueError):
    """A JSON object that names one key twice (which value was meant is unknowable)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of :func:`loads_json`: the object, or :class:`_KeyTwice`."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _KeyTwice(key)
        out[key] = value
    return out


def loads_json(text: str | bytes, *, unique_keys: bool = True) -> Any:
    """``json.loads``, with what it would accept or crash on reported as the decode error
    every caller already handles: nesting too deep for the parser (``[[[[...`` thousands
    deep, not a RecursionError), an integer past Python's digit limit, and, with
    ``unique_keys``, an object that names a key twice (``json.loads`` keeps the last value
    silently; the file's author meant one of them, and which is unknowable)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys if unique_keys else None)
    except RecursionError:
        shown = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested too deeply", shown, 0) from None
    except json.JSONDecodeError:
        raise
    except _KeyTwice as twice:
        shown = text if isinstance(text, str) else text.decode("utf-8", "replace")
        quoted = json.dumps(twice.key)
        first = shown.find(quoted)
        second = shown.find(quoted, first + 1) if first >= 0 else -1
        raise json.JSONDecodeError(
            f"key {quoted} given twice in one object", shown, max(second, 0)
        ) from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        shown = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("a number with more digits than can be read", shown, 0) from None


def loads_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads``, with nesting too deep for the parser reported as a
    ``TOMLDecodeError`` rather than a RecursionError."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError("nested too deeply") from None
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise tomllib.TOMLDecodeError("a number with more digits than can be read") from None


def read_input_text_and_digest(path: str | os.PathLike[str], kind: str) -> tuple[str, str]:
    """The text of the ``kind`` input file at ``path`` and the sha256 of its bytes."""
    data = read_input_bytes(path, kind)
    return decode_input_text(path, data, kind), hashlib.sha256(data).hexdigest()


__all__ = [
    "FILE_LIMITS",
    "FileLimits",
    "InputFileError",
    "decode_input_text",
    "loads_json",
    "loads_toml",
    "plain_float",
    "plain_number_text",
    "read_input_bytes",
    "read_input_text",
    "read_input_text_and_digest",
]
