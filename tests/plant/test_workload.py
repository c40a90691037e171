"""Tests for plant.workload and plant.trace_formats: trace loaders against the real files,
errors, transforms.

Known answers come from ``docs/traces.md`` (row counts, spans, token means)
and from ``plant/data/ATTRIBUTION.md`` (the bundled slice's rows and sha256).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import gpugov.plant.trace_formats as trace_formats
import gpugov.plant.workload as workload_module
from gpugov.plant.synthetic_workloads import (
    AZURE_CONV_OUTPUT_TOKENS,
    AZURE_CONV_PROMPT_TOKENS,
    LognormalLengths,
    bursty_workload,
    poisson_workload,
)
from gpugov.plant.trace_formats import MAX_TOKEN_COUNT
from gpugov.plant.types import Request
from gpugov.plant.workload import (
    DEFAULT_TRACES_DIR,
    TRACES_DIR_ENV,
    TraceError,
    TraceLoadReport,
    TraceWarning,
    format_seconds,
    list_traces,
    load_trace,
    resolve_trace,
    scale_load,
    select_window,
    workload_checksum,
)

SLICE_SHA256 = "d231084ba67ad511f6d4f99ee5027b656cc414f9ce203ec2b63d6ac26fa13620"
SLICE_CHECKSUM = "a3302e55ef479624dc5a0810ccaa9bd29df0f982b3607c4b97bc1a25ea98c96f"
SOURCE_CONV_SHA256 = "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST1_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST3_HEADER = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
)


def shared_traces_dir() -> Path:
    """The shared traces directory by the loader's own rule (env var, else default)."""
    configured = os.environ.get(TRACES_DIR_ENV)
    return Path(configured) if configured else DEFAULT_TRACES_DIR


def require_shared(file_name: str) -> Path:
    """Path of a shared trace file, skipping the test when it is absent."""
    path = shared_traces_dir() / file_name
    if not path.is_file():
        pytest.skip(f"shared trace {path} not present")
    return path


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    """Write a small trace file into tmp_path."""
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def load_quiet(*args: object, **kwargs: object) -> tuple[tuple[Request, ...], object]:
    """load_trace, failing the test on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_trace(*args, **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- real traces

# name, file, format, rows, skipped, last arrival s, mean prompt, mean output (docs/traces.md;
# its means include zero-token rows, whose tokens are 0, so sum / rows reproduces them).
REAL_TRACES = [
    ("azure-conv", "AzureLLMInferenceTrace_conv.csv", "azure", 19366, 0, 3501.721937,
     1154.7, 211.1),
    ("azure-code", "AzureLLMInferenceTrace_code.csv", "azure", 8819, 0, 3435.948056,
     2047.8, 27.9),
    ("mooncake", "mooncake_conversation_trace.jsonl", "mooncake", 12031, 0, 3536.999,
     12035.1, 342.6),
    ("burstgpt1", "burstgpt1_first400rows.csv", "burstgpt", 400, 17, 37269.0, 520.5, 276.5),
    ("burstgpt3", "burstgpt3_first400rows.csv", "burstgpt", 400, 1, 41453.0, 617.4, 170.9),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "file_name", "fmt", "rows", "skipped", "last_s", "prompt_mean", "output_mean"),
    REAL_TRACES,
)
def test_real_trace_known_answers(
    name: str,
    file_name: str,
    fmt: str,
    rows: int,
    skipped: int,
    last_s: float,
    prompt_mean: float,
    output_mean: float,
) -> None:
    path = require_shared(file_name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        requests, report = load_trace(name, spread_batches=False)
    zero_warnings = [w for w in caught if issubclass(w.category, TraceWarning)]
    assert len(caught) == len(zero_warnings)
    if skipped:
        assert len(zero_warnings) == 1
        assert f"skipped {skipped} zero-token" in str(zero_warnings[0].message)
    else:
        assert not zero_warnings
    assert report.path == str(path)
    assert report.name == name
    assert report.format == fmt
    assert report.rows == rows
    assert report.skipped_zero_token_rows == skipped
    assert report.requests == len(requests) == rows - skipped
    assert report.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert requests[0].arrival_time_s == 0.0
    assert requests[-1].arrival_time_s == pytest.approx(last_s, abs=1e-9)
    arrivals = [r.arrival_time_s for r in requests]
    assert arrivals == sorted(arrivals)
    assert sum(r.prompt_tokens for r in requests) / rows == pytest.approx(prompt_mean, abs=0.05)
    assert sum(r.output_tokens for r in requests) / rows == pytest.approx(output_mean, abs=0.05)
    # Ids are file row indices: increasing, with gaps only where rows were skipped.
    ids = [r.request_id for r in requests]
    assert ids == sorted(ids) and ids[-1] <= rows - 1
    assert len(set(range(rows)) - set(ids)) == skipped
    # Spread (the default): only Mooncake is batched (a 3 s grid), and no arrival leaves
    # its grid step.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spread, spread_report = load_trace(name)
    assert (spread_report.batch_grid_s is not None) == (name == "mooncake")
    step = spread_report.batch_grid_s or 0.0
    for kept, moved in zip(requests, spread, strict=True):
        assert kept.request_id == moved.request_id
        assert kept.arrival_time_s <= moved.arrival_time_s <= kept.arrival_time_s + step


def test_real_traces_by_path_and_by_name_agree() -> None:
    path = require_shared("AzureLLMInferenceTrace_code.csv")
    by_name, _ = load_quiet("azure-code")
    by_path, report = load_quiet(path, format="azure")
    assert by_name == by_path
    assert report.name is None


def test_burstgpt1_zero_rows_skipped_keep_row_ids() -> None:
    require_shared("burstgpt1_first400rows.csv")
    with pytest.warns(TraceWarning, match="skipped 17 zero-token row"):
        requests, _ = load_trace("burstgpt1")
    ids = {r.request_id for r in requests}
    # Row 20 (file line 22) is the first zero-token row of the file.
    assert 19 in ids and 20 not in ids and 21 in ids
    # docs/traces.md: without the zero rows, prompt mean 543.6 and output mean 288.8.
    assert np.mean([r.prompt_tokens for r in requests]) == pytest.approx(543.6, abs=0.05)
    assert np.mean([r.output_tokens for r in requests]) == pytest.approx(288.8, abs=0.05)


def test_burstgpt3_float_timestamps_and_first_raw() -> None:
    require_shared("burstgpt3_first400rows.csv")
    with pytest.warns(TraceWarning, match="skipped 1 zero-token row"):
        requests, report = load_trace("burstgpt3")
    assert report.first_timestamp_raw == "19440110.0"
    assert requests[1].arrival_time_s == 51.0  # 19440161.0 - 19440110.0


# --------------------------------------------------------------------------- bundled slice


def test_bundled_slice_loads_without_shared_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path / "no-such-dir"))
    monkeypatch.chdir(tmp_path)
    requests, report = load_quiet("azure-conv-10min")
    assert report.sha256 == SLICE_SHA256
    assert report.format == "azure"
    assert report.rows == report.requests == len(requests) == 3335
    assert report.skipped_zero_token_rows == 0
    assert report.first_timestamp_raw == "2023-11-16 18:53:00.7324930"
    assert requests[0] == Request(0, 0.0, 390, 144)
    assert requests[-1] == Request(3334, 599.232421, 1799, 145)
    assert workload_checksum(requests) == SLICE_CHECKSUM
    # The shared names are unavailable here, and the error says where it looked.
    with pytest.raises(TraceError) as excinfo:
        resolve_trace("azure-conv")
    message = str(excinfo.value)
    assert TRACES_DIR_ENV in message
    assert str(tmp_path / "no-such-dir") in message
    # The default is not searched while the variable is set, so it is not offered.
    assert str(DEFAULT_TRACES_DIR) not in message


def test_without_the_variable_the_error_names_the_default_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpugov.plant import workload

    monkeypatch.delenv(TRACES_DIR_ENV, raising=False)
    monkeypatch.setattr(workload, "DEFAULT_TRACES_DIR", tmp_path / "absent")
    with pytest.raises(TraceError) as excinfo:
        resolve_trace("mooncake")
    message = str(excinfo.value)
    assert f"{tmp_path / 'absent'} (the default)" in message and TRACES_DIR_ENV in message


@pytest.mark.parametrize("kind", ["a directory", "a dangling link", "not a regular file"])
def test_a_shared_trace_name_that_is_no_file_says_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A directory, a FIFO or a dangling link where a shared trace's file should be was
    reported as "not found", sending the user to look for a missing file."""
    import os

    from gpugov.plant.workload import SHARED_TRACES

    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))
    path = tmp_path / SHARED_TRACES["mooncake"]
    if kind == "a directory":
        path.mkdir()
    elif kind == "a dangling link":
        path.symlink_to(tmp_path / "gone.jsonl")
    else:
        os.mkfifo(path)
    with pytest.raises(TraceError) as excinfo:
        resolve_trace("mooncake")
    message = str(excinfo.value)
    assert message == f"trace 'mooncake': {path} is {kind}, not the trace's file"


def test_default_traces_dir_is_beside_a_checkout_or_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpugov.plant.workload import default_traces_dir

    checkout = tmp_path / "repo"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text("")
    assert default_traces_dir(checkout) == tmp_path / "shared" / "traces"
    site = tmp_path / "site-packages"  # a wheel's install: no pyproject.toml
    site.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_traces_dir(site) == tmp_path / "data" / "gpugov" / "traces"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_traces_dir(site) == tmp_path / "home" / ".local/share/gpugov/traces"


def test_bundled_slice_is_unmodified_source_rows() -> None:
    source = require_shared("AzureLLMInferenceTrace_conv.csv").read_bytes()
    assert hashlib.sha256(source).hexdigest() == SOURCE_CONV_SHA256
    bundled = resolve_trace("azure-conv-10min").read_bytes()
    source_lines = source.splitlines(keepends=True)
    # Header (line 1) plus source lines 13,295 to 16,629 (1-based), as ATTRIBUTION.md says.
    assert bundled == source_lines[0] + b"".join(source_lines[13294:16629])
    attribution = (resolve_trace("azure-conv-10min").parent / "ATTRIBUTION.md").read_text()
    assert SLICE_SHA256 in attribution and SOURCE_CONV_SHA256 in attribution


def test_bundled_slice_matches_full_trace_window() -> None:
    require_shared("AzureLLMInferenceTrace_conv.csv")
    full, _ = load_quiet("azure-conv")
    sliced, _ = load_quiet("azure-conv-10min")
    first = full[13293]
    assert first.arrival_time_s == pytest.approx(2234.051903, abs=1e-9)
    window = select_window(full, first.arrival_time_s, 599.25)  # next row is at 599.294
    assert len(window) == len(sliced)
    for whole, part in zip(window, sliced, strict=True):
        assert whole.request_id == part.request_id + 13293
        assert (whole.prompt_tokens, whole.output_tokens) == (
            part.prompt_tokens,
            part.output_tokens,
        )
        assert whole.arrival_time_s == pytest.approx(part.arrival_time_s, abs=1e-6)


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("content", "fmt", "expected"),
    [
        (
            AZURE_HEADER + "2023-11-16 18:00:00.0000000,10,5\n2023-11-16 18:00:01.5000000,20,6\n",
            "azure",
            [Request(0, 0.0, 10, 5), Request(1, 1.5, 20, 6)],
        ),
        (
            BURST1_HEADER + "5,ChatGPT,10,5,15,Conversation log\n7,GPT-4,20,6,26,API log\n",
            "burstgpt",
            [Request(0, 0.0, 10, 5), Request(1, 2.0, 20, 6)],
        ),
        (
            BURST3_HEADER + "100.0,abc,3,ChatGPT,10,5,15,Conversation log\n"
            "102.5,,4,GPT-4,20,6,26,API log\n",
            "burstgpt",
            [Request(0, 0.0, 10, 5), Request(1, 2.5, 20, 6)],
        ),
        (
            '{"timestamp": 1000, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'
            '{"timestamp": 4000, "input_length": 20, "output_length": 6, "hash_ids": [0, 1]}\n',
            "mooncake",
            [Request(0, 0.0, 10, 5), Request(1, 3.0, 20, 6)],
        ),
        (
            "arrival_time_s,prompt_tokens,output_tokens\n0.0,10,5\n0.25,20,6\n",
            "csv",
            [Request(0, 0.0, 10, 5), Request(1, 0.25, 20, 6)],
        ),
        (
            "output_tokens, prompt_tokens ,arrival_time_s\r\n5,10,0\r\n6,20,0.25\r\n",
            "csv",
            [Request(0, 0.0, 10, 5), Request(1, 0.25, 20, 6)],
        ),
    ],
    ids=["azure", "burstgpt1", "burstgpt3", "mooncake", "csv", "csv-reordered-crlf"],
)
def test_auto_detects_every_format(
    tmp_path: Path, content: str, fmt: str, expected: list[Request]
) -> None:
    path = write(tmp_path, "trace.txt", content)
    requests, report = load_quiet(path)
    assert report.format == fmt
    assert list(requests) == expected
    forced, _ = load_quiet(path, format=fmt)  # type: ignore[arg-type]
    assert forced == requests


def test_format_override_resolves_ambiguous_header(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "both.csv",
        "arrival_time_s,prompt_tokens,output_tokens,TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "0.0,10,5,2023-11-16 18:00:00.0000000,100,50\n"
        "2.0,20,6,2023-11-16 18:00:01.0000000,200,60\n",
    )
    with pytest.raises(TraceError, match=r"both\.csv:1: .*several formats \(azure, csv\)") as info:
        load_trace(path)
    # Worded for a command line too, which has no format= (it said "pass format="): the
    # columns of each format matched, to rename all but one's.
    assert "format=" not in str(info.value) and info.value.formats == ("azure", "csv")
    assert str(info.value).endswith(
        "rename a column of each format but the one to read (azure: TIMESTAMP, ContextTokens, "
        "GeneratedTokens; csv: arrival_time_s, prompt_tokens, output_tokens)"
    )
    as_csv, report = load_quiet(path, format="csv")
    assert report.format == "csv"
    assert list(as_csv) == [Request(0, 0.0, 10, 5), Request(1, 2.0, 20, 6)]
    as_azure, _ = load_quiet(path, format="azure")
    assert list(as_azure) == [Request(0, 0.0, 100, 50), Request(1, 1.0, 200, 60)]


def test_format_override_that_does_not_fit_names_the_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "az.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,10,5\n")
    # Column names match whatever their case: TIMESTAMP is BurstGPT's Timestamp too.
    with pytest.raises(TraceError, match=r"az\.csv:1: missing column 'Request tokens'.*'burstgpt'"):
        load_trace(path, format="burstgpt")
    with pytest.raises(TraceError, match=r"az\.csv:1: invalid JSON"):
        load_trace(path, format="mooncake")
    with pytest.raises(ValueError, match="format must be"):
        load_trace(path, format="parquet")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- errors

BAD_FILES = [
    ("unknown-header", "foo,bar,baz\n1,2,3\n", 1, "unknown header 'foo,bar,baz'"),
    ("near-miss-header", "TIMESTAMP,ContextTokens\n2023-11-16 18:00:00.0,1\n", 1,
     "closest: azure, missing column(s) 'GeneratedTokens'"),
    ("missing-field", AZURE_HEADER + "2023-11-16 18:00:00.0,10,5\n2023-11-16 18:00:01.0,10\n",
     3, "missing field 'GeneratedTokens'"),
    ("extra-field", AZURE_HEADER + "2023-11-16 18:00:00.0,10,5,7\n", 2, "4 fields"),
    ("non-numeric-tokens", AZURE_HEADER + "2023-11-16 18:00:00.0,10,5\n"
     "2023-11-16 18:00:01.0,10,5\n2023-11-16 18:00:02.0,ten,5\n", 4,
     "field 'ContextTokens': expected a token count, got 'ten'"),
    ("fractional-tokens", "arrival_time_s,prompt_tokens,output_tokens\n0,10,5.5\n", 2,
     "field 'output_tokens': expected an integer token count"),
    ("bad-azure-timestamp", AZURE_HEADER + "2023-11-16 18:00:00.0,10,5\n16/11/2023 18:00,1,1\n",
     3, "field 'TIMESTAMP': expected a timestamp"),
    ("bad-azure-date", AZURE_HEADER + "2023-02-30 18:00:00.0,10,5\n", 2, "invalid date"),
    ("bad-azure-time", AZURE_HEADER + "2023-11-16 24:00:00.0,10,5\n", 2, "invalid time of day"),
    ("non-numeric-timestamp", BURST1_HEADER + "5,ChatGPT,1,1,2,API log\n"
     "x,ChatGPT,1,1,2,API log\n", 3, "field 'Timestamp': expected a number, got 'x'"),
    ("nan-timestamp", "arrival_time_s,prompt_tokens,output_tokens\nnan,10,5\n", 2,
     "must be finite"),
    ("negative-tokens", BURST1_HEADER + "5,ChatGPT,1,1,2,API log\n6,ChatGPT,1,-3,-2,API log\n",
     3, "field 'Response tokens': negative token count '-3'"),
    ("backwards", AZURE_HEADER + "2023-11-16 18:00:00.0,10,5\n2023-11-16 18:00:02.0,10,5\n"
     "2023-11-16 18:00:01.0,10,5\n", 4, "goes backwards (line 3 is later)"),
    ("backwards-csv", "arrival_time_s,prompt_tokens,output_tokens\n1.0,1,1\n0.5,1,1\n", 3,
     "goes backwards"),
    ("empty", "", 1, "empty file"),
    ("json-empty", "", 1, "empty file"),
    ("header-only", AZURE_HEADER, 2, "no data rows"),
    ("json-blank-lines-only", "\n\n", 3, "no data rows"),
    ("json-invalid", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
     '{"timestamp": 1, "input_length": 1, "output_length": 1}\n{"timestamp": 2, "input_le\n',
     3, "invalid JSON"),
    ("json-not-object", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n[1, 2]\n',
     2, "expected a JSON object"),
    ("json-missing-field", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
     '{"timestamp": 1, "input_length": 1}\n', 2, "missing field 'output_length'"),
    ("json-non-numeric", '{"timestamp": "soon", "input_length": 1, "output_length": 1}\n', 1,
     "field 'timestamp': expected a JSON number, got text 'soon'"),
    # Numbers written as text were read as numbers (while true was refused).
    ("json-text-tokens", '{"timestamp": 0, "input_length": "100", "output_length": 1}\n', 1,
     "field 'input_length': expected a JSON number, got text '100'"),
    ("json-text-exponent", '{"timestamp": 0, "input_length": 1, "output_length": "1e3"}\n', 1,
     "field 'output_length': expected a JSON number, got text '1e3'"),
    ("json-text-timestamp", '{"timestamp": "5", "input_length": 1, "output_length": 1}\n', 1,
     "field 'timestamp': expected a JSON number, got text '5'"),
    ("json-bool-tokens", '{"timestamp": 0, "input_length": true, "output_length": 1}\n', 1,
     "field 'input_length': expected a token count"),
    ("json-fractional-tokens", '{"timestamp": 0, "input_length": 2.5, "output_length": 1}\n', 1,
     "expected an integer token count"),
    ("json-null-tokens", '{"timestamp": 0, "input_length": null, "output_length": 1}\n', 1,
     "expected a token count"),
    ("inf-tokens", "arrival_time_s,prompt_tokens,output_tokens\n0,inf,1\n", 2,
     "expected an integer token count"),
    ("huge-tokens", AZURE_HEADER + "2023-11-16 18:00:00.0,10000001,5\n", 2,
     "field 'ContextTokens': token count '10000001' is over the limit of 10,000,000"),
    ("json-400-digit-tokens", '{"timestamp": 0, "input_length": 1' + "0" * 400
     + ', "output_length": 1}\n', 1,
     "field 'input_length': token count 1000000000000000000000000000000000000... is over"),
    ("json-negative", '{"timestamp": 0, "input_length": 1, "output_length": -1}\n', 1,
     "negative token count"),
    ("json-backwards", '{"timestamp": 5, "input_length": 1, "output_length": 1}\n'
     '{"timestamp": 4, "input_length": 1, "output_length": 1}\n', 2, "goes backwards"),
    ("json-key-twice", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
     '{"timestamp": 1, "input_length": 5, "input_length": 7, "output_length": 1}\n', 2,
     'invalid JSON: key "input_length" given twice in one object (column 37)'),
    # Only blank lines: named as such (it was "unknown header ''").
    ("blank-lines-only", "\n  \r\n\n", 1, "only blank lines (no header and no data rows)"),
    # Blank lines before the header are skipped, and errors name the header's own line.
    ("near-miss-header-after-blank-lines", "\n\nTIMESTAMP,ContextTokens\n"
     "2023-11-16 18:00:00.0,1\n", 3, "closest: azure, missing column(s) 'GeneratedTokens'"),
    # A carriage return inside the header's field: the csv module raised its own error.
    ("cr-in-header", "TIMESTAMP,Context\rTokens,GeneratedTokens\n1,2,3\n", 1,
     "the header is not a CSV row"),
    # A quote left open in an ignored column swallowed the rows after it into that column:
    # to the end of the file, this trace loaded 2 requests of 3 without a word.
    ("open-quote-to-the-end", BURST1_HEADER + '5,ChatGPT,1,1,2,API log\n'
     '6,ChatGPT,1,1,2,"API log\n7,ChatGPT,1,1,2,API log\n', 3,
     "a quoted field runs on from this line to line 4; a trace row is one line: is a quote"),
    # Elsewhere in the row, the swallowed row was refused, but as the next line's.
    ("open-quote-mid-row", BURST1_HEADER + '5,ChatGPT,1,1,2,API log\n'
     '6,"ChatGPT,1,1,2,API log\n7,ChatGPT,1,1,2,API log\n', 3,
     "a quoted field runs on from this line to line 4"),
    # ... and up to a later quote it lost the rows between (here line 4).
    ("open-quote-closed-later", BURST1_HEADER + '5,ChatGPT,1,1,2,API log\n'
     '6,ChatGPT,1,1,2,"API log\n7,ChatGPT,1,1,2,API log\n8,ChatGPT,1,1,2,"API log"\n', 3,
     "a quoted field runs on from this line to line 5"),
    # Past the csv module's field limit it was "not a CSV file ...", without a line.
    ("open-quote-past-the-field-limit", "arrival_time_s,prompt_tokens,output_tokens,note\n"
     '0,1,1,"a\n' + "1,1,1,b\n" * 20_000, 2, "a quoted field runs on from this line past"),
    ("open-quote-in-the-header", 'arrival_time_s,prompt_tokens,output_tokens,"note\n'
     "0,1,1,a\n1,1,1,b\n", 1, "a quoted field runs on from this line to line 3"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "content", "line", "fragment"), BAD_FILES, ids=[case[0] for case in BAD_FILES]
)
def test_broken_files_name_file_and_line(
    tmp_path: Path, case: str, content: str, line: int, fragment: str
) -> None:
    # Cases named json-* are Mooncake JSON lines (forced, since some have no JSON to detect).
    is_json = case.startswith("json")
    path = write(tmp_path, "broken.jsonl" if is_json else "broken.csv", content)
    with pytest.raises(TraceError) as excinfo:
        load_trace(path, format="mooncake" if is_json else "auto")
    message = str(excinfo.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert fragment in message


def test_token_counts_up_to_the_limit_load(tmp_path: Path) -> None:
    # Ten million tokens is the limit (longer is no model's context, and `gpugov load`
    # built such a prompt token by token: 1e23 never finished); the limit itself loads.
    path = write(tmp_path, "big.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,10000000,1e7\n")
    requests, _ = load_quiet(path)
    assert requests == (Request(0, 0.0, MAX_TOKEN_COUNT, 10_000_000),)


@pytest.mark.parametrize(
    ("header", "fmt"),
    [
        ("timestamp,contexttokens,generatedtokens", "azure"),
        ("Timestamp , CONTEXTTOKENS,GeneratedTokens", "azure"),
        ("timestamp,model,request tokens,response tokens,total tokens,log type", "burstgpt"),
        ("ARRIVAL_TIME_S,Prompt_Tokens,output_tokens", "csv"),
    ],
)
def test_header_names_match_whatever_their_case(tmp_path: Path, header: str, fmt: str) -> None:
    # A header re-written by a tool (lower-cased by pandas or a spreadsheet) names the same
    # columns; formats differ in names, never only in case.
    stamps = {"azure": ("2023-11-16 18:00:00.0", "2023-11-16 18:00:01.5")}.get(fmt, ("0", "1.5"))
    if fmt == "burstgpt":
        rows = f"{stamps[0]},ChatGPT,10,5,15,API log\n{stamps[1]},ChatGPT,20,6,26,API log\n"
    else:
        rows = f"{stamps[0]},10,5\n{stamps[1]},20,6\n"
    path = write(tmp_path, "h.csv", header + "\n" + rows)
    requests, report = load_quiet(path)
    assert report.format == fmt
    assert list(requests) == [Request(0, 0.0, 10, 5), Request(1, 1.5, 20, 6)]


def test_a_header_named_twice_in_two_cases_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,timestamp\n")
    with pytest.raises(TraceError, match=r"d\.csv:1: column 'TIMESTAMP' appears more than once"):
        load_trace(path, format="azure")


@pytest.mark.parametrize(
    ("first_line", "fragment"),
    [
        ("x" * 60_000, "unknown header 'xxxxxxxx"),
        (",".join(["col"] * 15_000), "unknown header 'col,col,"),
        ('[{"timestamp": 0, "input_length": 1, "output_length": 1}]', "a JSON array, not JSON"),
        ("Timestamp\tModel\tRequest tokens", "columns separated by tabs"),
        ("Timestamp;Model;Request tokens", "columns separated by semicolons"),
    ],
    ids=["long-line", "many-columns", "json-array", "tabs", "semicolons"],
)
def test_a_header_that_is_no_trace_is_one_short_line(
    tmp_path: Path, first_line: str, fragment: str
) -> None:
    # The header is quoted cut short: a 60 KB first line made a 60 KB error line.
    path = write(tmp_path, "x.csv", first_line + "\n1,2,3\n")
    with pytest.raises(TraceError) as excinfo:
        load_trace(path)
    message = str(excinfo.value)
    assert message.startswith(f"{path}:1: ") and fragment in message
    assert len(message) < len(str(path)) + 600 and "\n" not in message


def test_a_missing_column_lists_the_header_cut_short(tmp_path: Path) -> None:
    path = write(tmp_path, "m.csv", ",".join(f"c{i}" for i in range(10_000)) + "\n1\n")
    with pytest.raises(TraceError) as excinfo:
        load_trace(path, format="csv")
    message = str(excinfo.value)
    assert "missing column 'arrival_time_s' required by format 'csv'; header has 'c0'" in message
    assert len(message) < len(str(path)) + 300


def test_unknown_header_lists_known_formats(tmp_path: Path) -> None:
    path = write(tmp_path, "odd.csv", "a,b\n1,2\n")
    with pytest.raises(TraceError) as excinfo:
        load_trace(path)
    for fmt in ("azure", "burstgpt", "mooncake", "csv"):
        assert fmt in str(excinfo.value)


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "bin.csv", AZURE_HEADER.encode() + b"2023-11-16 18:00:00.0,1,1\n\xff\n")
    with pytest.raises(TraceError, match=r"bin\.csv:3: not UTF-8"):
        load_trace(path)


def test_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "absent.csv"
    with pytest.raises(TraceError, match=r"absent\.csv: cannot read trace file"):
        load_trace(missing)
    with pytest.raises(TraceError, match="is a directory, not a trace file"):
        load_trace(tmp_path)


def test_zero_token_rows_one_warning_per_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "z.csv",
        BURST1_HEADER + "5,ChatGPT,10,5,15,API log\n6,ChatGPT,0,0,0,API log\n"
        "7,ChatGPT,3,0,3,API log\n8,ChatGPT,4,4,8,API log\n",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        requests, report = load_trace(path)
    assert len(caught) == 1 and issubclass(caught[0].category, TraceWarning)
    assert "z.csv" in str(caught[0].message) and "skipped 2 zero-token" in str(caught[0].message)
    assert report.skipped_zero_token_rows == 2 and report.rows == 4
    assert list(requests) == [Request(0, 0.0, 10, 5), Request(3, 3.0, 4, 4)]


def test_blank_lines_are_not_records(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,1,1\n\n"
                 "2023-11-16 18:00:01.0,2,2\n\n")  # fmt: skip
    requests, report = load_quiet(path)
    assert report.rows == 2
    assert [r.request_id for r in requests] == [0, 1]


@pytest.mark.parametrize("fmt", ["auto", "forced"])
@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("lead.csv", "\n\r\n  \n" + AZURE_HEADER + "2023-11-16 18:00:00.0,1,1\n"
         "2023-11-16 18:00:01.0,2,2\n"),
        ("lead.jsonl", "\n  \n" + '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
         '{"timestamp": 1000, "input_length": 2, "output_length": 2}\n'),
    ],
    ids=["azure", "mooncake"],
)  # fmt: skip
def test_blank_lines_before_the_header_or_first_record_are_skipped(
    tmp_path: Path, name: str, content: str, fmt: str
) -> None:
    """Blank lines at the top are skipped as those between rows are: a JSON lines file
    starting with one was detected as a CSV with the unknown header ''."""
    path = write(tmp_path, name, content)
    forced = "mooncake" if name.endswith(".jsonl") else "azure"
    requests, report = load_quiet(path, format=forced if fmt == "forced" else "auto")
    assert report.format == forced and report.rows == 2
    assert list(requests) == [Request(0, 0.0, 1, 1), Request(1, 1.0, 2, 2)]


def test_azure_timestamps_are_parsed_exactly(tmp_path: Path) -> None:
    # Seven fractional digits (100 ns), across midnight, and 1 to 7 digit fractions.
    path = write(
        tmp_path,
        "t.csv",
        AZURE_HEADER + "2023-11-16 23:59:59.9999999,1,1\n2023-11-17 00:00:00.0000000,1,1\n"
        "2023-11-17 00:00:00.0000007,1,1\n2023-11-17 00:00:00.5,1,1\n"
        "2023-11-17 00:00:01,1,1\n",
    )
    requests, report = load_quiet(path)
    assert report.first_timestamp_raw == "2023-11-16 23:59:59.9999999"
    assert [r.arrival_time_s for r in requests] == [0.0, 1e-7, 8e-7, 0.5000001, 1.0000001]


def test_azure_2024_timestamps_with_a_utc_offset(tmp_path: Path) -> None:
    # The 2024 release (AzureLLMInferenceTrace_code_1week.csv, DynamoLLM) writes
    # 2024-05-10 00:00:00.009930+00:00: six digits, a UTC offset, whole seconds without a
    # fraction. Offsets are read, so stamps in other zones count in UTC.
    path = write(
        tmp_path,
        "a24.csv",
        AZURE_HEADER + "2024-05-10 00:00:00.009930+00:00,100,10\n"
        "2024-05-10 00:00:01+00:00,200,20\n2024-05-10T02:00:01.5+02:00,300,30\n"
        "2024-05-10T00:00:02Z,400,40\n2024-05-09 19:00:02.25-0500,500,50\n",
    )
    requests, report = load_quiet(path)
    assert report.format == "azure"
    assert report.first_timestamp_raw == "2024-05-10 00:00:00.009930+00:00"
    assert [r.arrival_time_s for r in requests] == [0.0, 0.99007, 1.49007, 1.99007, 2.24007]
    assert [r.prompt_tokens for r in requests] == [100, 200, 300, 400, 500]


@pytest.mark.parametrize(
    ("rows", "line", "fragment"),
    [
        (
            "2024-05-10 00:00:00.1+00:00,1,1\n2024-05-10 00:00:01.2,1,1\n",
            3,
            "has no UTC offset, but line 2's has a UTC offset",
        ),
        (
            "2024-05-10 00:00:00.1,1,1\n2024-05-10 00:00:01.2+00:00,1,1\n",
            3,
            "has a UTC offset, but line 2's has none",
        ),
        ("2024-05-10 00:00:00+24:00,1,1\n", 2, "invalid UTC offset"),
        ("2024-05-10 00:00:00+0060,1,1\n", 2, "invalid UTC offset"),
        ("2024-05-10 00:00:00 UTC,1,1\n", 2, "expected a timestamp"),
        # Other scripts' digits are no timestamp (a Unicode \d would match them).
        ("2024-05-10 \u0661\u0668:00:00,1,1\n", 2, "expected a timestamp"),
    ],
    ids=[
        "aware-then-naive",
        "naive-then-aware",
        "offset-24h",
        "offset-60min",
        "zone-name",
        "arabic-digits",
    ],
)
def test_azure_timestamp_zones_refused_naming_the_line(
    tmp_path: Path, rows: str, line: int, fragment: str
) -> None:
    path = write(tmp_path, "z.csv", AZURE_HEADER + rows)
    with pytest.raises(TraceError) as excinfo:
        load_trace(path)
    assert str(excinfo.value).startswith(f"{path}:{line}: field 'TIMESTAMP': ")
    assert fragment in str(excinfo.value)


def test_arrivals_are_relative_to_first_timestamp(tmp_path: Path) -> None:
    path = write(tmp_path, "c.csv", "arrival_time_s,prompt_tokens,output_tokens\n5,1,1\n7.5,1,1\n")
    requests, report = load_quiet(path)
    assert [r.arrival_time_s for r in requests] == [0.0, 2.5]
    assert report.first_timestamp_raw == "5"


# --------------------------------------------------------------------------- window, scale


def ladder(n: int = 10, step_s: float = 1.0) -> tuple[Request, ...]:
    """Requests at 0, step, 2 step, ... with distinct lengths."""
    return tuple(Request(i, i * step_s, 100 + i, 10 + i) for i in range(n))


def azure_2024_rows(count: int, line_end: str = "\n") -> tuple[str, list[Request]]:
    """An Azure-2024-style trace of ``count`` rows (every 97th, the first included, has zero
    output tokens) and the requests it holds, worked out independently of the loader:
    whole microseconds from the first row's stamp, divided once."""
    rows = [AZURE_HEADER.replace("\n", line_end)]
    expected: list[Request] = []
    micros = 0
    for index in range(count):
        micros += 1 + (index * 7919) % 40_000
        seconds, fraction = divmod(micros, 1_000_000)
        minutes, second = divmod(seconds, 60)
        hour, minute = divmod(minutes, 60)
        prompt, output = 1 + index % 5000, (index % 97 != 0) * (1 + index % 700)
        rows.append(
            f"2024-05-10 {hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}+00:00,"
            f"{prompt},{output}{line_end}"
        )
        if output:
            expected.append(Request(index, (micros - 1) / 1e6, prompt, output))
    return "".join(rows), expected


def load_azure(path: Path, **kwargs: object) -> tuple[tuple[Request, ...], TraceLoadReport]:
    """load_trace as an Azure trace, its zero-token warning ignored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return load_trace(path, format="azure", **kwargs)  # type: ignore[arg-type]


def test_a_large_trace_reports_progress_and_loads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 70,000 rows at an eighth of the text block and of the build batch (as 70,000 rows,
    # about 3 MB, are at the real sizes): three blocks of text parsed and two batches of
    # requests built, so the callback is called in both phases.
    monkeypatch.setattr(trace_formats, "_BLOCK_CHARS", trace_formats._BLOCK_CHARS // 8)
    monkeypatch.setattr(workload_module, "_BUILD_ROWS", workload_module._BUILD_ROWS // 8)
    text, expected = azure_2024_rows(8_750)
    path = write(tmp_path, "big.csv", text)
    seen: list[float] = []
    requests, report = load_azure(path, on_progress=seen.append)
    silent, silent_report = load_azure(path)
    assert len(seen) >= 4
    assert all(0.0 < f <= 1.0 for f in seen)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)  # strictly increasing
    assert seen[-1] == 1.0
    assert 0.7 in seen and any(0.7 < f < 1.0 for f in seen)  # parsed at 70 %, then built
    assert requests == silent and report == silent_report
    assert report.rows == 8_750
    assert report.skipped_zero_token_rows == len(range(0, 8_750, 97))
    assert list(requests) == expected
    # A window: parsing counts for more of the load, as only its requests are built.
    in_window: list[float] = []
    window, _ = load_azure(path, start_s=100.0, duration_s=60.0, on_progress=in_window.append)
    assert window == select_window(requests, 100.0, 60.0)
    assert in_window == sorted(in_window) and in_window[-1] == 1.0
    assert 0.95 in in_window


@pytest.mark.parametrize("line_end", ["\n", "\r\n", "\r"])
def test_parsing_in_blocks_changes_no_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line_end: str
) -> None:
    # The text is parsed a block at a time; any block size (here down to one line a
    # block) gives the requests, the line numbers and the errors of the whole text.
    text, expected = azure_2024_rows(300, line_end)
    good = write(tmp_path, "good.csv", text)
    bad = write(tmp_path, "bad.csv", text + f"2024-05-11 00:00:00+00:00,1,x{line_end}")
    moon = write(
        tmp_path,
        "m.jsonl",
        "".join(
            f'{{"timestamp": {t * 3000}, "input_length": {t + 1}, "output_length": 2}}\n'
            + ("\n" if t % 7 == 0 else "")
            for t in range(200)
        ),
    )
    results = []
    for block in (1, 5, 64, 1 << 20):
        monkeypatch.setattr(trace_formats, "_BLOCK_CHARS", block)
        seen: list[float] = []
        requests, report = load_azure(good, on_progress=seen.append)
        assert list(requests) == expected
        assert seen == sorted(seen) and seen[-1] == 1.0
        with pytest.raises(TraceError) as error:
            load_azure(bad)
        moon_requests, _ = load_quiet(moon)
        results.append((requests, report, str(error.value), moon_requests))
    assert all(result == results[0] for result in results)
    assert f"bad.csv:{302}: field 'GeneratedTokens'" in results[0][2]


def test_an_interrupt_from_the_progress_callback_ends_the_load(tmp_path: Path) -> None:
    text, _ = azure_2024_rows(70_000)
    path = write(tmp_path, "big.csv", text)
    calls: list[float] = []

    def interrupt(fraction: float) -> None:
        calls.append(fraction)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_azure(path, on_progress=interrupt)
    assert len(calls) == 1 and calls[0] < 0.7  # raised at the first report, mid-parse


def test_select_window_half_open_and_rebased_to_window_start() -> None:
    window = select_window(ladder(), 2.5, 3.5)  # keeps arrivals 3, 4, 5 (6.0 is excluded)
    assert window == (Request(3, 0.5, 103, 13), Request(4, 1.5, 104, 14), Request(5, 2.5, 105, 15))
    assert select_window(ladder(), 3.0, 1.0) == (Request(3, 0.0, 103, 13),)  # start inclusive
    assert select_window(ladder(), 7.0, None)[-1] == Request(9, 2.0, 109, 19)
    assert select_window(ladder(), 100.0, 5.0) == ()
    for start, duration in ((-1.0, 1.0), (0.0, 0.0), (0.0, -2.0), (math.nan, 1.0), (0.0, math.inf)):
        with pytest.raises(ValueError):
            select_window(ladder(), start, duration)


def test_scale_load_compresses_and_dilates() -> None:
    doubled = scale_load(ladder(), 2.0)
    assert [r.arrival_time_s for r in doubled] == [i / 2 for i in range(10)]
    assert [(r.request_id, r.prompt_tokens, r.output_tokens) for r in doubled] == [
        (r.request_id, r.prompt_tokens, r.output_tokens) for r in ladder()
    ]
    halved = scale_load(ladder(), 0.5)
    assert [r.arrival_time_s for r in halved] == [2.0 * i for i in range(10)]
    assert scale_load(ladder(), 1.0) == ladder()
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="load_scale"):
            scale_load(ladder(), bad)


def test_transforms_sort_unsorted_input() -> None:
    shuffled = (Request(1, 2.0, 1, 1), Request(0, 1.0, 1, 1))
    assert [r.request_id for r in scale_load(shuffled, 2.0)] == [0, 1]
    assert [r.request_id for r in select_window(shuffled, 0.0, None)] == [0, 1]


def test_load_trace_window_then_scale_then_rebase() -> None:
    full, _ = load_quiet("azure-conv-10min")
    requests, report = load_quiet(
        "azure-conv-10min", start_s=100.0, duration_s=200.0, load_scale=2.0
    )
    assert requests == scale_load(select_window(full, 100.0, 200.0), 2.0)
    expected = [r for r in full if 100.0 <= r.arrival_time_s < 300.0]
    assert len(requests) == len(expected) == report.requests
    assert requests[0].request_id == expected[0].request_id
    assert requests[0].arrival_time_s == (expected[0].arrival_time_s - 100.0) / 2.0
    assert all(0.0 <= r.arrival_time_s < 100.0 for r in requests)
    assert (report.start_s, report.duration_s, report.load_scale) == (100.0, 200.0, 2.0)
    assert report.rows == 3335


def test_a_trace_of_only_failed_requests_says_so(tmp_path: Path) -> None:
    path = tmp_path / "failed.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,0,3\n2023-11-16 18:15:47.0805900,40,0\n"
    )
    with pytest.raises(TraceError, match=r"failed\.csv: all 2 row\(s\) have zero prompt or output"):
        load_trace(path)


def test_load_trace_empty_window_and_bad_arguments() -> None:
    with pytest.raises(TraceError, match="holds no requests"):
        load_trace("azure-conv-10min", start_s=10_000.0)
    with pytest.raises(ValueError, match="load_scale"):
        load_trace("azure-conv-10min", load_scale=0.0)
    with pytest.raises(ValueError, match="duration_s"):
        load_trace("azure-conv-10min", duration_s=0.0)


def test_an_empty_window_names_the_window_and_the_span_readably(tmp_path: Path) -> None:
    # The numbers were raw floats: "window [20000000.0, inf) s ... span 0 to
    # 11258612.306481274 s".
    path = tmp_path / "long.csv"
    path.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,10,5\n11258612.306481274,10,5\n")
    with pytest.raises(TraceError) as info:
        load_trace(path, start_s=20_000_000.0)
    assert str(info.value).endswith(
        "the window from 20,000,000 s to the end holds no requests "
        "(kept arrivals span 0 to 11,258,612.3 s)"
    )
    with pytest.raises(TraceError, match=r"from 0\.5 s to 1\.25 s holds no requests"):
        load_trace(path, start_s=0.5, duration_s=0.75)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (11258612.306481274, "11,258,612.3"),
        (1800.0, "1,800"),
        (100.0, "100"),
        (37.5, "37.5"),
        (0.25, "0.25"),
        (0.0, "0"),
        (math.inf, "inf"),
        (999_999_999_999_999.0, "999,999,999,999,999"),
        # A Mooncake stamp of 1e300 ms made the span line 300 digits long.
        (1e297, "1e+297"),
        (-1e300, "-1e+300"),
    ],
)
def test_format_seconds(seconds: float, shown: str) -> None:
    assert format_seconds(seconds) == shown


def test_a_span_past_every_limit_is_a_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrupt stamp of 1e300 ms gave a 556-character error line of digits."""
    import json

    from gpugov.cli import main

    trace = tmp_path / "far.jsonl"
    rows = [{"timestamp": 0, "input_length": 5, "output_length": 3}]
    rows.append({"timestamp": 1e300, "input_length": 5, "output_length": 3})
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["simulate", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the window spans 1e+297 simulated seconds" in err[0], err
    assert len(err[0]) < 250 + len(str(trace))


# --------------------------------------------------------------------------- synthetic


def test_poisson_is_deterministic_per_seed_and_rate_is_right() -> None:
    a = poisson_workload(5.0, 2000.0, seed=7)
    assert a == poisson_workload(5.0, 2000.0, seed=7)
    assert a != poisson_workload(5.0, 2000.0, seed=8)
    # Count ~ Poisson(10,000): sd 100, allow 5 sd.
    assert abs(len(a) - 10_000) < 500
    arrivals = np.array([r.arrival_time_s for r in a])
    assert np.all(np.diff(arrivals) >= 0) and arrivals[0] >= 0 and arrivals[-1] < 2000.0
    assert [r.request_id for r in a] == list(range(len(a)))
    gaps = np.diff(arrivals)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential gaps
    prompts = np.array([r.prompt_tokens for r in a])
    outputs = np.array([r.output_tokens for r in a])
    assert np.median(prompts) == pytest.approx(1020, rel=0.03)
    assert np.median(outputs) == pytest.approx(129, rel=0.05)
    assert np.mean(prompts) == pytest.approx(1154.7, rel=0.03)
    assert prompts.min() >= 1 and prompts.max() <= AZURE_CONV_PROMPT_TOKENS.maximum
    assert outputs.min() >= 1 and outputs.max() <= AZURE_CONV_OUTPUT_TOKENS.maximum


def test_length_options_fixed_sampler_and_independent_streams() -> None:
    base = poisson_workload(2.0, 100.0, seed=3)
    fixed = poisson_workload(2.0, 100.0, seed=3, output_tokens=64)
    assert {r.output_tokens for r in fixed} == {64}
    # Changing the output lengths changes neither the arrivals nor the prompts.
    assert [(r.arrival_time_s, r.prompt_tokens) for r in fixed] == [
        (r.arrival_time_s, r.prompt_tokens) for r in base
    ]
    short = LognormalLengths(median=10.0, mean=12.0, maximum=20)
    custom = poisson_workload(2.0, 100.0, seed=3, prompt_tokens=short)
    assert all(1 <= r.prompt_tokens <= 20 for r in custom)

    def constant(rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, 5)

    assert {
        r.prompt_tokens for r in poisson_workload(1.0, 50.0, seed=1, prompt_tokens=constant)
    } == {5}

    def broken(rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros(n)

    with pytest.raises(ValueError, match="sampler"):
        poisson_workload(1.0, 50.0, seed=1, prompt_tokens=broken)
    with pytest.raises(ValueError, match="prompt_tokens"):
        poisson_workload(1.0, 50.0, seed=1, prompt_tokens=0)
    with pytest.raises(ValueError, match="rate_per_s"):
        poisson_workload(-1.0, 50.0, seed=1)
    with pytest.raises(ValueError, match="duration_s"):
        poisson_workload(1.0, 0.0, seed=1)
    assert poisson_workload(0.0, 50.0, seed=1) == ()


def test_bursty_rates_per_phase() -> None:
    on_rate, off_rate, on_s, off_s, duration = 20.0, 2.0, 10.0, 30.0, 4000.0
    a = bursty_workload(on_rate, off_rate, on_s, off_s, duration, seed=11)
    assert a == bursty_workload(on_rate, off_rate, on_s, off_s, duration, seed=11)
    assert a != bursty_workload(on_rate, off_rate, on_s, off_s, duration, seed=12)
    arrivals = np.array([r.arrival_time_s for r in a])
    assert np.all(np.diff(arrivals) >= 0) and arrivals[-1] < duration
    in_on = np.mod(arrivals, on_s + off_s) < on_s
    # 100 periods: 1000 s on (expect 20,000, sd 141) and 3000 s off (expect 6,000, sd 77).
    assert abs(int(in_on.sum()) - 20_000) < 5 * 141
    assert abs(int((~in_on).sum()) - 6_000) < 5 * 77
    mean_rate = (on_rate * on_s + off_rate * off_s) / (on_s + off_s)
    assert len(a) / duration == pytest.approx(mean_rate, rel=0.03)
    silent = bursty_workload(5.0, 0.0, 1.0, 4.0, 500.0, seed=2)
    assert all(r.arrival_time_s % 5.0 < 1.0 for r in silent)
    with pytest.raises(ValueError, match="on_s"):
        bursty_workload(1.0, 1.0, 0.0, 1.0, 10.0, seed=0)


def test_lognormal_fit_reproduces_median_and_mean() -> None:
    lengths = LognormalLengths(median=129.0, mean=211.1, maximum=10**9)
    assert math.exp(math.log(129.0) + lengths.sigma**2 / 2) == pytest.approx(211.1)
    with pytest.raises(ValueError):
        LognormalLengths(median=100.0, mean=50.0)


# --------------------------------------------------------------------------- checksum


def test_checksum_known_answer_and_encoding() -> None:
    workload = (Request(0, 0.0, 10, 5), Request(1, 0.1, 20, 7))
    expected = hashlib.sha256(b"gpugov-workload-v1\n0,0.0,10,5\n1,0.1,20,7\n").hexdigest()
    assert workload_checksum(workload) == expected
    assert expected == "846a88936ce97a6fd8e02ea0bc28918520f884fbeaf636ad0150a4b0a5291848"
    numpy_scalars = (Request(0, np.float64(0.0), np.int64(10), np.int64(5)),)  # type: ignore[arg-type]
    assert workload_checksum(numpy_scalars) == workload_checksum((Request(0, 0.0, 10, 5),))


def test_checksum_sensitive_to_every_field_and_order() -> None:
    base = ladder(5)
    reference = workload_checksum(base)
    assert workload_checksum(ladder(5)) == reference
    r = base[2]
    variants = [
        Request(r.request_id + 10, r.arrival_time_s, r.prompt_tokens, r.output_tokens),
        Request(r.request_id, math.nextafter(r.arrival_time_s, 10.0), r.prompt_tokens,
                r.output_tokens),
        Request(r.request_id, r.arrival_time_s, r.prompt_tokens + 1, r.output_tokens),
        Request(r.request_id, r.arrival_time_s, r.prompt_tokens, r.output_tokens + 1),
    ]  # fmt: skip
    digests = {workload_checksum((*base[:2], v, *base[3:])) for v in variants}
    assert len(digests) == len(variants) and reference not in digests
    assert workload_checksum(tuple(reversed(base))) != reference
    assert workload_checksum(base[:4]) != reference


# --------------------------------------------------------------------------- names


def test_resolve_trace_names_env_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))
    write(tmp_path, "burstgpt1_first400rows.csv", BURST1_HEADER + "5,ChatGPT,1,1,2,API log\n")
    assert resolve_trace("burstgpt1") == tmp_path / "burstgpt1_first400rows.csv"
    _, report = load_quiet("burstgpt1")
    assert report.rows == 1 and report.name == "burstgpt1"
    with pytest.raises(TraceError, match=r"mooncake_conversation_trace\.jsonl not found"):
        resolve_trace("mooncake")
    assert resolve_trace("some/file.csv") == Path("some/file.csv")
    assert resolve_trace(Path("azure-conv")) == Path("azure-conv")  # a Path is always a path
    assert resolve_trace("azure-conv-10min").name == "azure_conv_10min.csv"

    listing = {entry["name"]: entry for entry in list_traces()}
    assert set(listing) == {
        "azure-conv-10min", "azure-conv", "azure-code", "mooncake", "burstgpt1", "burstgpt3"
    }  # fmt: skip
    assert (
        listing["azure-conv-10min"]["present"] and listing["azure-conv-10min"]["kind"] == "bundled"
    )
    assert listing["burstgpt1"]["present"] and listing["burstgpt1"]["path"] == str(
        tmp_path / "burstgpt1_first400rows.csv"
    )
    assert not listing["mooncake"]["present"]


@pytest.mark.parametrize(
    ("argument", "hint"),
    [
        ("azure-conv-10mim", "; did you mean 'azure-conv-10min'?"),
        ("mooncak", "; did you mean 'mooncake'?"),
        ("nosuch", ""),
    ],
)
def test_a_bare_word_that_is_no_name_nor_file_lists_the_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argument: str, hint: str
) -> None:
    """A mistyped name was read as a path: "azure-conv-10mim: cannot read trace file: No
    such file or directory", with no word of the names."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceError) as caught:
        load_trace(argument)
    assert str(caught.value) == (
        f"unknown trace {argument!r}: not a trace name (azure-conv-10min, azure-conv, "
        f"azure-code, mooncake, burstgpt1, burstgpt3; gpugov traces lists them) nor a file" + hint
    )
    write(tmp_path, argument, "arrival_time_s,prompt_tokens,output_tokens\n0,10,10\n")
    assert resolve_trace(argument) == Path(argument)  # a file of that name is read


def test_a_name_too_long_for_a_file_is_one_short_line() -> None:
    """Looking up a 60,000-character name raised "OSError: File name too long" past the
    loader; it is an unknown trace, quoted cut short."""
    with pytest.raises(TraceError) as caught:
        load_trace("y" * 60_000)
    assert str(caught.value).startswith("unknown trace 'yyy") and len(str(caught.value)) < 400


def test_default_traces_dir_is_next_to_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACES_DIR_ENV, raising=False)
    module_file = Path(workload_module.__file__).resolve()
    repo_root = module_file.parents[1]
    assert repo_root.parent / "shared" / "traces" == DEFAULT_TRACES_DIR
    assert shared_traces_dir() == DEFAULT_TRACES_DIR


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("span.csv", "arrival_time_s,prompt_tokens,output_tokens\n-1e308,10,10\n1e308,10,10\n"),
        (
            "span.jsonl",
            '{"timestamp": -1e308, "input_length": 10, "output_length": 10}\n'
            '{"timestamp": 1e308, "input_length": 10, "output_length": 10}\n',
        ),
    ],
    ids=["csv", "mooncake"],
)
def test_a_span_too_long_for_a_float_is_refused_naming_the_line(
    tmp_path: Path, name: str, text: str
) -> None:
    # simulate dropped the second request silently; fleet raised.
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=rf"{name}:(2|3): .*too far from the first"):
        load_trace(path)


def test_classic_mac_line_endings_load_as_lines(tmp_path: Path) -> None:
    """A file whose lines end in a lone carriage return crashed the format detection with
    the csv module's error; it reads as the same file with newlines."""
    rows = (
        "TIMESTAMP,ContextTokens,GeneratedTokens|"
        "2023-11-16 18:15:46.68,374,44|2023-11-16 18:15:50.99,396,109|"
    )
    mac = write(tmp_path, "mac.csv", rows.replace("|", "\r"))
    unix = write(tmp_path, "unix.csv", rows.replace("|", "\n"))
    assert load_trace(mac)[0] == load_trace(unix)[0]


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "ms.csv",
            "arrival_time_s,prompt_tokens,output_tokens\n1700000000000,100,5\n1700000001000,9,5\n",
            "looks like milliseconds since 1970, but the csv format reads its stamps as "
            "seconds: if so, the trace replays 1000 times slower",
        ),
        (
            "ns.csv",
            "arrival_time_s,prompt_tokens,output_tokens\n1.7e18,100,5\n1.7000001e18,9,5\n",
            "looks like nanoseconds since 1970",
        ),
        (
            "s.jsonl",
            '{"timestamp": 1700000000, "input_length": 9, "output_length": 5}\n'
            '{"timestamp": 1700000003, "input_length": 9, "output_length": 5}\n',
            "looks like seconds since 1970, but the mooncake format reads its stamps as "
            "milliseconds: if so, the trace replays 1000 times faster",
        ),
    ],
)
def test_stamps_since_1970_in_another_unit_are_warned_of(
    tmp_path: Path, name: str, text: str, said: str
) -> None:
    """Epoch milliseconds in ``arrival_time_s`` replayed 1000 times slower, and epoch
    seconds in a Mooncake ``timestamp`` 1000 times faster, without a word."""
    trace = tmp_path / name
    trace.write_text(text)
    with pytest.warns(TraceWarning, match="looks like") as caught:
        load_trace(trace)
    assert said in str(caught[0].message)
    assert str(caught[0].message).startswith(f"{trace}: the first timestamp ")


@pytest.mark.parametrize(
    "text",
    [
        "arrival_time_s,prompt_tokens,output_tokens\n1700000000.5,100,5\n1700000001,9,5\n",
        "arrival_time_s,prompt_tokens,output_tokens\n0,100,5\n3600,9,5\n",
        '{"timestamp": 1700000000000, "input_length": 9, "output_length": 5}\n',
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,50\n",
    ],
    ids=["epoch-seconds", "relative-seconds", "mooncake-epoch-ms", "azure"],
)
def test_stamps_in_their_formats_unit_are_not_warned_of(tmp_path: Path, text: str) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        load_trace(trace)


def test_a_load_scale_that_stretches_an_arrival_past_any_finite_time_is_a_trace_error(
    tmp_path: Path,
) -> None:
    """``--load-scale 1e-308`` divided 10 s into infinity, which the request refused with
    a ValueError that reached the user as a traceback."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,5\n10,9,5\n")
    with pytest.raises(TraceError) as error:
        load_trace(trace, load_scale=1e-308)
    assert str(error.value) == (
        f"{trace}: a load scale of 1e-308 stretches the window's arrival at 10 s to no "
        "finite time; choose a larger load scale"
    )


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("iso.csv", "arrival_time_s,prompt_tokens,output_tokens\n2023-11-16T18:17:03Z,9,5\n", 2),
        (
            "burst.csv",
            "Timestamp,Request tokens,Response tokens\n5,9,5\n2024-05-10 00:00:01,9,5\n",
            3,
        ),
    ],
)
def test_a_date_in_a_numeric_timestamp_column_names_the_format_that_reads_dates(
    tmp_path: Path, name: str, text: str, line: int
) -> None:
    """A user's log converted to arrival_time_s with its ISO dates kept was refused as
    "expected a number", with no word of the format that reads them."""
    trace = tmp_path / name
    trace.write_text(text)
    with pytest.raises(TraceError) as error:
        load_trace(trace)
    message = str(error.value)
    assert message.startswith(f"{trace}:{line}: field ")
    assert message.endswith(
        "(a date: this format's stamps are numbers; dates are read by the azure format, "
        "header TIMESTAMP,ContextTokens,GeneratedTokens)"
    )


def test_line_ends_mixing_lone_crs_with_lfs_are_named_as_such(tmp_path: Path) -> None:
    """The csv module's own words reached the user: "new-line character seen in unquoted
    field - do you need to open the file in universal-newline mode?"."""
    trace = tmp_path / "mixed.csv"
    trace.write_bytes(b"arrival_time_s,prompt_tokens,output_tokens\r0,100,50\r1,200,20\n")
    with pytest.raises(TraceError) as error:
        load_trace(trace)
    assert str(error.value) == (
        f"{trace}:1: the header is not a CSV row: a carriage return inside the line (line "
        "ends mixing lone CRs with LFs; make them all LF first: tr '\\r' '\\n' < FILE > NEW)"
    )


@pytest.mark.parametrize("bom", ["", "\ufeff"])
def test_a_second_header_from_joined_files_is_named_as_such(tmp_path: Path, bom: str) -> None:
    """Two traces joined with cat: the second header was refused as "field 'TIMESTAMP':
    expected a timestamp ..., got 'TIMESTAMP'", which does not say what happened."""
    rows = "2023-11-16 18:17:03.9799600,100,50\n2023-11-16 18:17:04.1,200,20\n"
    trace = tmp_path / "joined.csv"
    trace.write_text(AZURE_HEADER + rows + bom + AZURE_HEADER + rows, encoding="utf-8")
    with pytest.raises(TraceError) as error:
        load_trace(trace)
    assert str(error.value) == (
        f"{trace}:4: the header again (line 1's): files joined with cat? Keep the first "
        "file's header only"
    )
