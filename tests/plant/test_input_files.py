"""The one bounded reader of input files: what it refuses, before reading or at its caps,
always in one line naming the file (and the line)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import threading
import zipfile
from pathlib import Path

import pytest

from gpugov.daemon.config import load_config
from gpugov.daemon.errors import ConfigError
from gpugov.daemon.lockstate import LockState
from gpugov.plant import input_files
from gpugov.plant.input_files import (
    FILE_LIMITS,
    FileLimits,
    InputFileError,
    read_input_text,
    read_input_text_and_digest,
)


def test_every_kind_has_caps() -> None:
    for kind in ("config", "grid", "plan", "profile", "trace", "recording", "results", "state"):
        limits = FILE_LIMITS[kind]
        assert 0 < limits.max_line_bytes <= limits.max_bytes


def test_text_and_digest(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_bytes(b"\xef\xbb\xbfkey = 1\n")  # a BOM is dropped
    text, digest = read_input_text_and_digest(path, "config")
    assert text == "key = 1\n"
    assert len(digest) == 64


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_input_text(fifo, "config")
        except InputFileError as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10.0)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert str(outcome[0]) == f"{fifo}: is a FIFO (named pipe), not a config file"


@pytest.mark.parametrize(
    ("target", "what"),
    [("/dev/zero", "a device"), ("/dev/null", "a device"), (".", "a directory")],
)
def test_what_is_not_a_regular_file_is_refused_before_opening(target: str, what: str) -> None:
    with pytest.raises(InputFileError, match=f"is {what}, not a grid file"):
        read_input_text(target, "grid")


def test_a_link_to_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "locks.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputFileError, match="is a device, not a state file"):
        read_input_text(link, "state")
    # The lock state file reads as empty (with a warning) rather than filling memory.
    assert LockState(tmp_path).read() == {}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"a = 1\nb = \x00\n", ":2: binary data (a NUL byte); not a config file"),
        (b"a = 1\n\xff\xfe\n", ":2: not UTF-8 text (invalid start byte at byte 6)"),
    ],
)
def test_binary_and_non_utf8_name_the_line(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(data)
    with pytest.raises(InputFileError) as error:
        read_input_text(path, "config")
    assert str(error.value).startswith(f"{path}{expected}")


def _zipped(data: bytes) -> bytes:
    """``data`` as the one member of a zip archive."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("trace.csv", data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n"), ": gzip-compressed; not a"),
        ("TIMESTAMP\n".encode("utf-16"), ": UTF-16 text; a trace file is UTF-8"),
        ("TIMESTAMP\n".encode("utf-16-be").join([b"\xfe\xff", b""]), ": UTF-16 text"),
        (
            b"\x28\xb5\x2f\xfd\x24\x05\x29\x00\x00",
            ": zstd-compressed; not a trace file (decompress it: zstd -d FILE)",
        ),
        (bz2.compress(b"TIMESTAMP\n"), ": bzip2-compressed; not a trace file (decompress it: "),
        (lzma.compress(b"TIMESTAMP\n"), ": xz-compressed; not a trace file (decompress it: unxz"),
        (_zipped(b"TIMESTAMP\n"), ": a zip archive; not a trace file (decompress it: unzip FILE)"),
    ],
    ids=["gzip", "utf-16-le", "utf-16-be", "zstd", "bzip2", "xz", "zip"],
)
def test_compressed_and_utf16_files_are_named_as_such(
    tmp_path: Path, data: bytes, expected: str
) -> None:
    # They were "binary data (a NUL byte)" or "not UTF-8 text": true, but no help with a
    # .csv.gz, a .jsonl.zst or a spreadsheet's "Unicode text" export.
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    with pytest.raises(InputFileError) as error:
        read_input_text(path, "trace")
    assert str(error.value).startswith(f"{path}{expected}")


def test_size_and_line_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(FILE_LIMITS, "config", FileLimits(64, 16))
    monkeypatch.setattr(input_files, "_CHUNK_BYTES", 5)
    path = tmp_path / "c.toml"
    path.write_text("a = 1\n" * 10)  # 60 bytes, short lines
    assert read_input_text(path, "config").count("\n") == 10
    path.write_text("a = 1\n" * 11)  # 66 bytes
    with pytest.raises(InputFileError, match=r": 66 bytes, over the 64 bytes limit"):
        read_input_text(path, "config")
    path.write_text("a = 1\nb = 12345678901234\n")  # line 2 is 18 bytes
    with pytest.raises(InputFileError, match=rf"^{path}:2: line longer than 16 bytes"):
        read_input_text(path, "config")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read plan file: No such file"):
        read_input_text(tmp_path / "absent.json", "plan")


def test_the_config_loader_uses_it() -> None:
    with pytest.raises(ConfigError, match=r"^/dev/zero: is a device, not a config file$"):
        load_config("/dev/zero")


def test_nesting_too_deep_is_a_decode_error() -> None:
    import json
    import tomllib

    from gpugov.plant.input_files import loads_json, loads_toml

    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        loads_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(tomllib.TOMLDecodeError, match="nested too deeply"):
        loads_toml("a = " + "[" * 100_000 + "]" * 100_000)
    assert loads_json('{"a": [1]}') == {"a": [1]}


def test_a_key_given_twice_is_a_decode_error_unless_asked() -> None:
    """``json.loads`` keeps the last of two values silently; the file's author meant one,
    and which is unknowable: refused, naming the key and where its second copy starts,
    at any depth. A reader that must take whatever a damaged record names (the lock
    state) asks for the old rule."""
    import json

    from gpugov.plant.input_files import loads_json

    text = '{"a": 1, "b": {"c": 2, "c": 3}}'
    with pytest.raises(json.JSONDecodeError, match='key "c" given twice') as excinfo:
        loads_json(text)
    assert excinfo.value.pos == text.rindex('"c"')
    assert loads_json(text, unique_keys=False) == {"a": 1, "b": {"c": 3}}
    assert loads_json('[{"c": 1}, {"c": 2}]') == [{"c": 1}, {"c": 2}]  # apart: fine
