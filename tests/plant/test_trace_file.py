"""The trace reader's documented limits: line length and total size, with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpugov.plant import input_files, trace_file
from gpugov.plant.input_files import FileLimits
from gpugov.plant.workload import TraceError, load_trace

HEADER = "arrival_time_s,prompt_tokens,output_tokens\n"


def test_long_line_is_refused_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "0,10,10\n" + "9" * (trace_file.MAX_LINE_BYTES + 1) + "\n")
    with pytest.raises(TraceError, match=rf"^{path}:3: line longer than 64 KiB"):
        load_trace(path)


def test_a_line_split_across_chunks_is_measured_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(input_files, "_CHUNK_BYTES", 7)
    monkeypatch.setitem(input_files.FILE_LIMITS, "trace", FileLimits(1 << 20, 60))
    path = tmp_path / "t.csv"
    rows = "".join(f"{i},{10 + i},{5 + i}\n" for i in range(20))
    path.write_text(HEADER + rows)
    requests, report = load_trace(path)  # 42-byte header, short rows: within the caps
    assert len(requests) == 20 and report.rows == 20
    path.write_text(HEADER + rows + "1" * 61 + "\n")
    with pytest.raises(TraceError, match=rf"^{path}:22: line longer than 60 bytes"):
        load_trace(path)


def test_total_size_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_files, "_CHUNK_BYTES", 16)
    monkeypatch.setitem(input_files.FILE_LIMITS, "trace", FileLimits(100, 100))
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "".join(f"{i},10,10\n" for i in range(20)))
    with pytest.raises(TraceError, match=rf"^{path}: .*over the 100 bytes limit of a trace"):
        load_trace(path)


def test_dev_zero_is_refused_before_reading() -> None:
    with pytest.raises(TraceError, match=r"^/dev/zero: is a device, not a trace file"):
        load_trace("/dev/zero")


@pytest.mark.parametrize("timestamp", ["1" + "0" * 400, "-1" + "0" * 400])
def test_a_timestamp_too_large_for_a_float_is_refused_with_its_line(
    tmp_path: Path, timestamp: str
) -> None:
    # A JSON integer of 400 digits raised OverflowError (a traceback in every command).
    path = tmp_path / "mooncake.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
        f'{{"timestamp": {timestamp}, "input_length": 10, "output_length": 5}}\n'
    )
    with pytest.raises(TraceError, match=r"mooncake.jsonl:2: field 'timestamp': timestamp must"):
        load_trace(path)


def test_a_column_named_twice_is_refused(tmp_path: Path) -> None:
    # Which of the two a row's prompt length came from was the reader's choice.
    path = tmp_path / "dup.csv"
    path.write_text("arrival_time_s,prompt_tokens,output_tokens,prompt_tokens\n0,10,5,20\n")
    with pytest.raises(TraceError, match=r"dup.csv:1: column 'prompt_tokens' appears more than"):
        load_trace(path)


@pytest.mark.parametrize(
    ("row", "named"),
    [
        ("0,1_000,5", "field 'prompt_tokens': expected a token count, got '1_000'"),
        ("0,\u0663,5", "field 'prompt_tokens': expected a token count"),
        ("1_0,10,5", "field 'arrival_time_s': expected a number, got '1_0'"),
    ],
)
def test_numbers_python_reads_but_a_trace_does_not_hold_are_refused(
    tmp_path: Path, row: str, named: str
) -> None:
    # int() and float() read digit separators and other scripts' digits.
    path = tmp_path / "t.csv"
    path.write_text(f"arrival_time_s,prompt_tokens,output_tokens\n{row}\n", encoding="utf-8")
    with pytest.raises(TraceError, match=named):
        load_trace(path)
