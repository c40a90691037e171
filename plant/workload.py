"""Request workloads for the serving plant from real trace files: loaders, windows, scaling.

Real traces (see ``docs/traces.md`` for their origin and licences):

* ``azure``: Azure LLM inference trace 2023 (Splitwise), ``TIMESTAMP,ContextTokens,
  GeneratedTokens`` with ``YYYY-MM-DD HH:MM:SS.fffffff`` timestamps (100 ns ticks, parsed
  exactly as integers, not through ``strptime``'s six-digit ``%f``), and the 2024 release
  (DynamoLLM), whose stamps carry a UTC offset (``2024-05-10 00:00:00.009930+00:00``):
  offsets are read, so arrivals count in UTC; a file mixing stamps with and without one
  is refused.
* ``burstgpt``: BurstGPT CSV, both the ``_1`` layout (``Timestamp,Model,Request tokens,
  Response tokens,Total tokens,Log Type``) and the ``_3`` layout (adds ``Session ID`` and
  ``Elapsed time``); timestamps in seconds, integer or float.
* ``mooncake``: Mooncake JSON lines, ``timestamp`` in milliseconds, ``input_length``,
  ``output_length``; ``hash_ids`` is ignored.
* ``csv``: a plain ``arrival_time_s,prompt_tokens,output_tokens`` CSV.

Mapping to :class:`~plant.types.Request`: ``arrival_time_s`` is the row's timestamp minus
the first data row's timestamp, in seconds; ``request_id`` is the 0-based index of the
data record in the file. Skipped zero-token rows (failed requests in BurstGPT) still use
up their index, so ids always map back to file rows: for a file without blank lines the
id is the line number minus 2 (CSV, one header line) or minus 1 (JSON lines).

CSV columns are found by name, whatever their order, case or surrounding spaces; other
columns are ignored. Every bad input raises :class:`TraceError` with a ``path:line: what is
wrong`` message.

The synthetic generators live in :mod:`plant.synthetic_workloads`.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import math
import os
import re
import warnings
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from gpugov.plant.input_files import loads_json
from gpugov.plant.trace_batches import batch_grid_s, spread_batched_arrivals
from gpugov.plant.trace_file import read_trace_text
from gpugov.plant.types import Request

TraceFormat = Literal["auto", "azure", "burstgpt", "mooncake", "csv"]

#: Environment variable naming the directory that holds the shared real traces.
TRACES_DIR_ENV = "GPUGOV_TRACES_DIR"


def default_traces_dir(source_root: Path) -> Path:
    """The shared traces' default directory for a package whose top folder's parent is
    ``source_root``: in a source checkout (``source_root`` holds ``pyproject.toml``), a
    ``shared/traces`` folder beside it; installed from a wheel, ``$XDG_DATA_HOME/gpugov/
    traces`` (by default ``~/.local/share/gpugov/traces``), never a folder inside the
    install."""
    if (source_root / "pyproject.toml").is_file():
        return source_root.parent / "shared" / "traces"
    data = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(data) / "gpugov" / "traces"


#: Default traces directory (:func:`default_traces_dir` of this install).
DEFAULT_TRACES_DIR = default_traces_dir(Path(__file__).resolve().parents[1])

#: Trace bundled with the package (``plant/data``), loadable without the shared directory.
DEFAULT_TRACE = "azure-conv-10min"

BUNDLED_TRACES: dict[str, str] = {"azure-conv-10min": "azure_conv_10min.csv"}

SHARED_TRACES: dict[str, str] = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake_conversation_trace.jsonl",
    "burstgpt1": "burstgpt1_first400rows.csv",
    "burstgpt3": "burstgpt3_first400rows.csv",
}

# Columns (timestamp, prompt tokens, output tokens) that identify each CSV format.
_CSV_COLUMNS: dict[str, tuple[str, str, str]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "csv": ("arrival_time_s", "prompt_tokens", "output_tokens"),
}
_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")

MAX_TOKEN_COUNT = 10_000_000
"""Largest prompt or output length a trace row may give: ten million tokens, the longest
context window any model offers (the real traces' longest prompt is Mooncake's 126,195).
A longer one is a corrupt row; replayed, it would be a prompt no engine takes, and
``gpugov load`` would build it token by token."""

_KNOWN_FORMATS = (
    "azure (CSV header TIMESTAMP,ContextTokens,GeneratedTokens); "
    "burstgpt (CSV header with Timestamp,Request tokens,Response tokens); "
    "mooncake (JSON lines with timestamp,input_length,output_length); "
    "csv (CSV header arrival_time_s,prompt_tokens,output_tokens)"
)

_AZURE_TIMESTAMP = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(Z|[+-]\d{2}(?::?\d{2})?)?",
    re.ASCII,
)
"""An Azure stamp: the 2023 release's ``2023-11-16 18:17:03.9799600`` (no zone) or the 2024
release's ``2024-05-10 00:00:00.009930+00:00`` (a UTC offset: ``Z``, ``+HH:MM``, ``+HHMM``
or ``+HH``)."""


class TraceError(ValueError):
    """A trace file is missing, unreadable or malformed; the message is ``path:line: what``."""


class TraceWarning(UserWarning):
    """A trace loaded, but some rows were skipped (zero-token rows: failed requests)."""


@dataclass(frozen=True, slots=True)
class TraceLoadReport:
    """Provenance of one :func:`load_trace` call.

    Attributes:
        path: resolved file path.
        format: detected or requested format (``azure``, ``burstgpt``, ``mooncake``, ``csv``).
        rows: data rows in the file, zero-token rows included (before windowing).
        skipped_zero_token_rows: rows dropped because prompt or output tokens were 0.
        sha256: hex digest of the file's bytes.
        first_timestamp_raw: the first data row's timestamp as written; arrivals count
            from it.
        requests: requests returned (after skipping, windowing and scaling).
        start_s: window start in the trace's own seconds from its first timestamp.
        duration_s: window length in the trace's own seconds, ``None`` for the rest.
        load_scale: arrival-rate multiplier applied after windowing.
        name: the trace name when loaded by name (``azure-conv``...), else ``None``.
        batch_grid_s: the grid step (trace seconds) over which batched arrivals were
            spread, ``None`` when the trace is not batched or spreading was off.
    """

    path: str
    format: str
    rows: int
    skipped_zero_token_rows: int
    sha256: str
    first_timestamp_raw: str
    requests: int
    start_s: float = 0.0
    duration_s: float | None = None
    load_scale: float = 1.0
    name: str | None = None
    batch_grid_s: float | None = None


TraceProgress = Callable[[float], None]
"""``on_progress`` of :func:`load_trace`: called with the fraction of the load done so far
(0 to 1, increasing, the last call 1.0)."""

_BLOCK_CHARS = 1 << 20
"""Characters of a trace's text parsed between two progress reports (about 1 MB of a
trace's ASCII); lines are split in each block's own buffer, never in a copy of the whole
text."""

_PARSE_SHARE = 0.7
"""Share of a whole trace's load progress that parsing its text counts for; building the
requests from the parsed columns takes the rest (as it takes about 30 % of the time on
generated Azure files of 0.3 and 2 million rows)."""

_PARSE_SHARE_OF_A_WINDOW = 0.95
"""The same for a load with a ``duration_s`` window, whose requests are usually a small
part of the trace (only they are built; the other rows are only looked at)."""

_BUILD_ROWS = 1 << 16
"""Requests built between two progress reports."""


@dataclass(slots=True)
class _Parsed:
    """Columns parsed from a trace, arrivals already relative to the first timestamp
    (packed arrays: 8 bytes a value, not a Python object each)."""

    ids: array[int]
    arrivals_s: array[float]
    prompts: array[int]
    outputs: array[int]
    rows: int
    skipped: int
    first_timestamp_raw: str


# --------------------------------------------------------------------------- resolving


def traces_dir() -> Path:
    """Directory of the shared real traces: ``$GPUGOV_TRACES_DIR``, else the default
    (:data:`DEFAULT_TRACES_DIR`, which does not depend on the working directory)."""
    configured = os.environ.get(TRACES_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return DEFAULT_TRACES_DIR


def _bundled_path(file_name: str) -> Path:
    """Path of a file in the package's ``data`` folder (works from an installed wheel)."""
    return Path(str(resources.files("gpugov.plant") / "data" / file_name))


def resolve_trace(name_or_path: str | Path) -> Path:
    """Map a trace name to its file, or return the argument as a path.

    Names: ``azure-conv-10min`` (bundled in the package) and the shared traces
    ``azure-conv``, ``azure-code``, ``mooncake``, ``burstgpt1``, ``burstgpt3`` (looked up
    in :func:`traces_dir`). Any other string, and any :class:`~pathlib.Path`, is a path.

    Raises:
        TraceError: a shared trace's file is absent; the message names
            ``$GPUGOV_TRACES_DIR`` and the default directory.
    """
    if isinstance(name_or_path, Path):
        return name_or_path
    if name_or_path in BUNDLED_TRACES:
        return _bundled_path(BUNDLED_TRACES[name_or_path])
    if name_or_path in SHARED_TRACES:
        file_name = SHARED_TRACES[name_or_path]
        directory = traces_dir()
        path = directory / file_name
        if not path.is_file():
            configured = os.environ.get(TRACES_DIR_ENV)
            if configured:
                raise TraceError(
                    f"trace {name_or_path!r}: {file_name} not found in "
                    f"${TRACES_DIR_ENV}={configured}; point ${TRACES_DIR_ENV} at the "
                    "directory holding the shared traces"
                )
            raise TraceError(
                f"trace {name_or_path!r}: {file_name} not found in {directory} (the "
                f"default); place the shared traces there, or set ${TRACES_DIR_ENV} to the "
                "directory holding them"
            )
        return path
    return Path(name_or_path)


def list_traces() -> list[dict[str, Any]]:
    """Known trace names, where each resolves now, and whether the file is present."""
    listing: list[dict[str, Any]] = []
    for name, file_name in BUNDLED_TRACES.items():
        path = _bundled_path(file_name)
        listing.append(
            {"name": name, "kind": "bundled", "path": str(path), "present": path.is_file()}
        )
    directory = traces_dir()
    for name, file_name in SHARED_TRACES.items():
        path = directory / file_name
        listing.append(
            {"name": name, "kind": "shared", "path": str(path), "present": path.is_file()}
        )
    return listing


# --------------------------------------------------------------------------- parsing


def _fail(path: Path, line: int | None, message: str) -> TraceError:
    """Build a TraceError whose message is ``path:line: message``."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return TraceError(f"{where}: {message}")


def _plain_number_text(raw: str) -> bool:
    """Whether ``raw`` can be a trace's number: ASCII without digit separators (``int()``
    and ``float()`` also read ``1_000`` and other scripts' digits)."""
    return raw.isascii() and "_" not in raw


def _clipped(raw: Any, width: int = 40) -> str:
    """``repr(raw)`` cut to ``width`` characters, its end marked when cut (a 400-digit
    count is shown as its first digits and ``...``)."""
    text = repr(raw)
    return text if len(text) <= width else text[: width - 3] + "..."


def _token_count(raw: Any, field: str, path: Path, line: int) -> int:
    """Parse a token count: a non-negative integer (``12`` or an integral ``12.0``) of at
    most :data:`MAX_TOKEN_COUNT`."""
    value: int | float
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise _fail(path, line, f"field {field!r}: expected a token count, got {raw!r:.40}")
    if isinstance(raw, str):
        if not _plain_number_text(raw):
            raise _fail(path, line, f"field {field!r}: expected a token count, got {raw!r:.40}")
        try:
            value = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                raise _fail(
                    path, line, f"field {field!r}: expected a token count, got {raw!r:.40}"
                ) from None
    else:
        value = raw
    if isinstance(value, float):
        if not value.is_integer():
            raise _fail(
                path, line, f"field {field!r}: expected an integer token count, got {raw!r:.40}"
            )
        value = int(value)
    if value < 0:
        raise _fail(path, line, f"field {field!r}: negative token count {raw!r:.40}")
    if value > MAX_TOKEN_COUNT:
        raise _fail(
            path,
            line,
            f"field {field!r}: token count {_clipped(raw)} is over the limit of "
            f"{MAX_TOKEN_COUNT:,} (no model's context window is longer)",
        )
    return value


def _seconds(raw: Any, field: str, path: Path, line: int) -> float:
    """Parse a finite numeric timestamp (seconds or milliseconds, as the format says)."""
    if isinstance(raw, bool) or (isinstance(raw, str) and not _plain_number_text(raw)):
        raise _fail(path, line, f"field {field!r}: expected a number, got {raw!r:.40}")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise _fail(path, line, f"field {field!r}: expected a number, got {raw!r:.40}") from None
    except OverflowError:  # a JSON integer too large for a float (10**400)
        value = math.inf
    if not math.isfinite(value):
        raise _fail(path, line, f"field {field!r}: timestamp must be finite, got {raw!r:.40}")
    return value


class _AzureClock:
    """Parses Azure timestamps to integer nanoseconds (UTC where the stamp has an offset),
    caching the per-date day number; a file mixing stamps with and without an offset is
    refused, since the zone of the ones without is unknown."""

    def __init__(self) -> None:
        self._days: dict[str, int] = {}
        self._zoned: tuple[bool, int] | None = None  # (has an offset, its first line)

    def __call__(self, raw: str, field: str, path: Path, line: int) -> int:
        match = _AZURE_TIMESTAMP.fullmatch(raw.strip())
        if match is None:
            raise _fail(
                path,
                line,
                f"field {field!r}: expected a timestamp YYYY-MM-DD HH:MM:SS[.fffffff] with an "
                f"optional UTC offset (+00:00), got {raw!r:.60}",
            )
        date, hours, minutes, seconds, fraction, zone = match.groups()
        day = self._days.get(date)
        if day is None:
            try:
                day = dt.date.fromisoformat(date).toordinal()
            except ValueError:
                raise _fail(path, line, f"field {field!r}: invalid date in {raw!r}") from None
            self._days[date] = day
        h, m, s = int(hours), int(minutes), int(seconds)
        if h > 23 or m > 59 or s > 59:
            raise _fail(path, line, f"field {field!r}: invalid time of day in {raw!r}")
        offset_s = self._offset_s(zone, raw, field, path, line)
        nanoseconds = int(fraction.ljust(9, "0")) if fraction else 0
        return ((day * 86_400 + h * 3_600 + m * 60 + s - offset_s) * 1_000_000_000) + nanoseconds

    def _offset_s(self, zone: str | None, raw: str, field: str, path: Path, line: int) -> int:
        """The stamp's UTC offset in seconds (0 without one), refusing an offset of 24 h or
        more and a file whose stamps do not all agree on having one."""
        zoned = zone is not None
        if self._zoned is None:
            self._zoned = (zoned, line)
        elif self._zoned[0] != zoned:
            first = "has a UTC offset" if self._zoned[0] else "has none"
            raise _fail(
                path,
                line,
                f"field {field!r}: timestamp {raw.strip()!r} "
                f"{'has a UTC offset' if zoned else 'has no UTC offset'}, but line "
                f"{self._zoned[1]}'s {first}; a trace's stamps must all have one or all not",
            )
        if zone is None or zone == "Z":
            return 0
        digits = zone[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:] or 0)
        if hours > 23 or minutes > 59:
            raise _fail(path, line, f"field {field!r}: invalid UTC offset in {raw.strip()!r}")
        sign = -1 if zone[0] == "-" else 1
        return sign * (hours * 3_600 + minutes * 60)


def _read_text(path: Path) -> tuple[str, str]:
    """Read a trace as UTF-8 text within the size limits (see :mod:`plant.trace_file`)."""
    return read_trace_text(path, _fail)


def _first_line(text: str) -> str:
    """The file's first line without its terminator (the rest of the text is not copied)."""
    end = text.find("\n")
    return (text if end < 0 else text[:end]).rstrip("\r")


def _blocks(text: str, report: Callable[[float], None] | None) -> Iterator[str]:
    """``text`` in consecutive pieces of about :data:`_BLOCK_CHARS` characters, each but the
    last ending just after a ``\\n``; once a piece is consumed, ``report`` (if any) gets the
    fraction of the text passed (the last call: 1.0)."""
    size = len(text)
    start = 0
    while start < size:
        cut = text.find("\n", start + _BLOCK_CHARS - 1)
        end = size if cut < 0 else cut + 1
        yield text[start:end]
        start = end
        if report is not None:
            report(start / size)


def _csv_lines(text: str, report: Callable[[float], None] | None) -> Iterator[str]:
    """The lines of ``text`` as ``io.StringIO(text, newline="")`` yields them (ended by
    ``\\n``, ``\\r\\n`` or ``\\r``, terminators kept), a block at a time: a block ends after
    a ``\\n``, where every such line ends, and a StringIO holds 4 bytes a character, so one
    of the whole text would be four times its size."""
    for block in _blocks(text, report):
        yield from io.StringIO(block, newline="")


def _json_lines(text: str, report: Callable[[float], None] | None) -> Iterator[str]:
    """The lines of ``text`` split at ``\\n`` only, as ``text.split("\\n")`` without the empty
    string after a final terminator, a block at a time."""
    for block in _blocks(text, report):
        yield from (block[:-1] if block.endswith("\n") else block).split("\n")


def _column_key(name: str) -> str:
    """A header name as columns are matched: stripped and case-folded (``timestamp``,
    `` Timestamp `` and ``TIMESTAMP`` name one column)."""
    return name.strip().casefold()


def _detect_format(path: Path, text: str) -> str:
    """Pick the format from the first line; raise naming the known formats otherwise."""
    if not text:
        raise _fail(path, 1, "empty file (no header and no data rows)")
    first = _first_line(text)
    if first.lstrip().startswith("{"):
        return "mooncake"
    if first.lstrip().startswith("["):
        raise _fail(
            path,
            1,
            "a JSON array, not JSON lines; a Mooncake trace has one JSON object per line",
        )
    try:
        header = {_column_key(name) for name in next(csv.reader([first]), [])}
    except csv.Error as error:
        raise _fail(path, 1, f"the header is not a CSV row: {error}") from None
    columns = {fmt: {_column_key(col) for col in cols} for fmt, cols in _CSV_COLUMNS.items()}
    matches = [fmt for fmt, cols in columns.items() if cols <= header]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise _fail(
            path,
            1,
            f"header {_clipped(first, 80)} matches several formats ({', '.join(matches)}); "
            "pass format= to choose one",
        )
    hint = ""
    closest = max(_CSV_COLUMNS, key=lambda fmt: len(columns[fmt] & header))
    missing = [col for col in _CSV_COLUMNS[closest] if _column_key(col) not in header]
    if len(missing) < len(_CSV_COLUMNS[closest]):
        hint = f" (closest: {closest}, missing column(s) {', '.join(map(repr, missing))})"
    elif "," not in first and ("\t" in first or ";" in first):
        separator = "tabs" if "\t" in first else "semicolons"
        hint = f" (columns separated by {separator}: a trace is comma-separated)"
    raise _fail(
        path, 1, f"unknown header {_clipped(first, 80)}{hint}; known formats: {_KNOWN_FORMATS}"
    )


def _check_stamp(
    path: Path,
    line: int,
    named: str,
    stamp: Any,
    origin: Any,
    previous: Any,
    previous_line: int | None,
) -> None:
    """Refuse a timestamp (``named``: its field and text) earlier than the one before it
    (at ``previous_line``), or so far from the first (``origin``) that their span is no
    finite number of seconds."""
    if previous is not None and stamp < previous:
        raise _fail(path, line, f"{named} goes backwards (line {previous_line} is later)")
    if not math.isfinite(float(stamp) - float(origin)):
        raise _fail(path, line, f"{named} is too far from the first")


def _parse_csv(
    path: Path, text: str, fmt: str, report: Callable[[float], None] | None = None
) -> _Parsed:
    """Parse one of the CSV formats; arrivals relative to the first data row. ``report``
    gets the fraction of the text parsed (see :func:`_blocks`). A row the csv module
    cannot read (a field past its size limit, a stray carriage return) is refused in
    one line naming the file, not raised as the module's own error."""
    try:
        return _parse_csv_rows(path, text, fmt, report)
    except csv.Error as error:
        raise _fail(path, None, f"not a CSV file the reader can split into rows: {error}") from None


def _parse_csv_rows(
    path: Path, text: str, fmt: str, report: Callable[[float], None] | None
) -> _Parsed:
    """:func:`_parse_csv`'s work."""
    if not text:
        raise _fail(path, 1, "empty file (no header and no data rows)")
    reader = csv.reader(_csv_lines(text, report))
    header = [name.strip() for name in next(reader)]
    keys = [_column_key(name) for name in header]
    ts_col, prompt_col, output_col = _CSV_COLUMNS[fmt]
    for col in (ts_col, prompt_col, output_col):
        if _column_key(col) not in keys:
            listed = ", ".join(map(repr, header))
            listed = listed if len(listed) <= 120 else listed[:117] + "..."
            raise _fail(
                path,
                1,
                f"missing column {col!r} required by format {fmt!r}; header has {listed}",
            )
        if keys.count(_column_key(col)) > 1:
            raise _fail(path, 1, f"column {col!r} appears more than once in the header")
    i_ts, i_prompt, i_output = (
        keys.index(_column_key(c)) for c in (ts_col, prompt_col, output_col)
    )
    width = len(header)
    azure_clock = _AzureClock() if fmt == "azure" else None

    ids: array[int] = array("q")
    arrivals: array[float] = array("d")
    prompts: array[int] = array("q")
    outputs: array[int] = array("q")
    record = 0
    skipped = 0
    first_raw = ""
    origin: Any = 0
    previous: float | int | None = None
    previous_line = 0
    for row in reader:
        line = reader.line_num
        if not row or not any(cell.strip() for cell in row):
            continue  # blank line: not a record
        if len(row) != width:
            if len(row) < width:
                absent = header[len(row)]
                raise _fail(
                    path,
                    line,
                    f"missing field {absent!r}: row has {len(row)} of {width} fields",
                )
            raise _fail(path, line, f"row has {len(row)} fields, header has {width}")
        raw_ts = row[i_ts]
        stamp: float | int
        if azure_clock is not None:
            stamp = azure_clock(raw_ts, ts_col, path, line)
        else:
            stamp = _seconds(raw_ts, ts_col, path, line)
        prompt = _token_count(row[i_prompt], prompt_col, path, line)
        output = _token_count(row[i_output], output_col, path, line)
        if previous is None:
            first_raw, origin = raw_ts.strip(), stamp
        _check_stamp(
            path,
            line,
            f"field {ts_col!r}: timestamp {raw_ts.strip()!r}",
            stamp,
            origin,
            previous,
            previous_line,
        )
        previous, previous_line = stamp, line
        if prompt == 0 or output == 0:
            skipped += 1
        else:
            ids.append(record)
            # Azure's integer nanoseconds: the subtraction is exact, then one rounding to
            # seconds; the other formats' seconds are floats already.
            arrivals.append((stamp - origin) / 1e9 if azure_clock is not None else stamp - origin)
            prompts.append(prompt)
            outputs.append(output)
        record += 1
    if record == 0:
        raise _fail(path, reader.line_num + 1, "no data rows after the header")
    return _Parsed(ids, arrivals, prompts, outputs, record, skipped, first_raw)


def _parse_mooncake(
    path: Path, text: str, report: Callable[[float], None] | None = None
) -> _Parsed:
    """Parse Mooncake JSON lines (timestamps in ms); arrivals relative to the first line.
    ``report`` gets the fraction of the text parsed (see :func:`_blocks`)."""
    ids: array[int] = array("q")
    arrivals: array[float] = array("d")
    prompts: array[int] = array("q")
    outputs: array[int] = array("q")
    record = 0
    skipped = 0
    first_raw = ""
    origin = 0.0
    previous: float | None = None
    previous_line = 0
    line = 0
    if not text:
        raise _fail(path, 1, "empty file (no data rows)")
    for line, content in enumerate(_json_lines(text, report), start=1):
        if not content.strip():
            continue
        try:
            item = loads_json(content)
        except json.JSONDecodeError as e:
            raise _fail(path, line, f"invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(item, dict):
            raise _fail(path, line, f"expected a JSON object, got {type(item).__name__}")
        for field in _MOONCAKE_FIELDS:
            if field not in item:
                raise _fail(path, line, f"missing field {field!r}")
        raw_ts = item["timestamp"]
        stamp = _seconds(raw_ts, "timestamp", path, line)
        prompt = _token_count(item["input_length"], "input_length", path, line)
        output = _token_count(item["output_length"], "output_length", path, line)
        if previous is None:
            first_raw, origin = json.dumps(raw_ts), stamp
        _check_stamp(
            path,
            line,
            f"field 'timestamp': timestamp {raw_ts!r}",
            stamp,
            origin,
            previous,
            previous_line,
        )
        previous, previous_line = stamp, line
        if prompt == 0 or output == 0:
            skipped += 1
        else:
            ids.append(record)
            arrivals.append((stamp - origin) / 1000.0)
            prompts.append(prompt)
            outputs.append(output)
        record += 1
    if record == 0:
        raise _fail(path, line + 1, "no data rows (empty trace)")
    return _Parsed(ids, arrivals, prompts, outputs, record, skipped, first_raw)


def _scaled(report: TraceProgress | None, share: float) -> TraceProgress | None:
    """``report`` given a fraction times ``share`` (parsing's part of a load's progress)."""
    if report is None:
        return None
    return lambda fraction: report(share * fraction)


def _check_window(start_s: float, duration_s: float | None) -> None:
    """Validate a window: finite start >= 0 and finite duration > 0 (or None)."""
    if not math.isfinite(start_s) or start_s < 0.0:
        raise ValueError(f"start_s must be finite and >= 0, got {start_s!r}")
    if duration_s is not None and (not math.isfinite(duration_s) or duration_s <= 0.0):
        raise ValueError(f"duration_s must be finite and > 0, got {duration_s!r}")


def _check_scale(load_scale: float) -> None:
    """Validate a load scale: finite and > 0."""
    if not math.isfinite(load_scale) or load_scale <= 0.0:
        raise ValueError(f"load_scale must be finite and > 0, got {load_scale!r}")


def load_trace(
    path_or_name: str | Path,
    *,
    format: TraceFormat = "auto",
    start_s: float = 0.0,
    duration_s: float | None = None,
    load_scale: float = 1.0,
    spread_batches: bool = True,
    on_progress: TraceProgress | None = None,
) -> tuple[tuple[Request, ...], TraceLoadReport]:
    """Load a real trace as requests sorted by arrival.

    Steps: parse (arrival = timestamp minus the first data row's timestamp) -> spread a
    batched trace's arrivals over its grid step (:mod:`gpugov.plant.trace_batches`;
    Mooncake's 3 s grid; ``spread_batches=False`` keeps the stamps as written) -> keep
    arrivals in ``[start_s, start_s + duration_s)`` (the trace's own seconds) -> divide by
    ``load_scale`` -> rebase so the window start is time 0. This is exactly
    ``scale_load(select_window(full, start_s, duration_s), load_scale)``.

    Args:
        path_or_name: a trace name (see :func:`resolve_trace`) or a file path.
        format: ``auto`` detects from the first line; otherwise force a format.
        start_s: window start, seconds from the trace's first timestamp.
        duration_s: window length in trace seconds; ``None`` keeps the rest.
        load_scale: arrival-rate multiplier (2.0 halves every inter-arrival time).
        spread_batches: spread the arrivals of a batched (grid-quantised) trace over
            their grid step; the report's ``batch_grid_s`` says whether it applied.
        on_progress: called with the fraction of the load done, increasing, about once
            per MB of the file parsed and per 65,536 rows made requests (parsing counts
            for 70 %, or 95 % with a ``duration_s`` window), the last call 1.0 once the
            requests are built: a progress line while a large trace loads. What it
            raises (a Ctrl-C) ends the load.

    Returns:
        The requests and a :class:`TraceLoadReport`. Zero-token rows are skipped with one
        :class:`TraceWarning` per file naming their count.

    Raises:
        TraceError: missing/unreadable file, unknown header, malformed row (the message
            is ``path:line: ...``), or a window holding no requests.
        ValueError: bad ``format``, window or ``load_scale``.
    """
    if format not in ("auto", "azure", "burstgpt", "mooncake", "csv"):
        raise ValueError(f"format must be auto, azure, burstgpt, mooncake or csv, got {format!r}")
    _check_window(start_s, duration_s)
    _check_scale(load_scale)
    name = (
        path_or_name
        if isinstance(path_or_name, str) and path_or_name in BUNDLED_TRACES | SHARED_TRACES
        else None
    )
    path = resolve_trace(path_or_name)
    text, digest = _read_text(path)
    if "\r" in text and "\n" not in text:
        text = text.replace("\r", "\n")  # classic Mac line endings: one row per line
    fmt = _detect_format(path, text) if format == "auto" else format
    share = _PARSE_SHARE if duration_s is None else _PARSE_SHARE_OF_A_WINDOW
    parse_report = _scaled(on_progress, share)
    parsed = (
        _parse_mooncake(path, text, parse_report)
        if fmt == "mooncake"
        else _parse_csv(path, text, fmt, parse_report)
    )
    del text  # the columns hold what is needed; the text is as large as the file
    if parsed.rows and parsed.skipped == parsed.rows:
        raise _fail(
            path,
            None,
            f"all {parsed.rows} row(s) have zero prompt or output tokens (failed requests, "
            "skipped): no requests to replay",
        )
    if parsed.skipped:
        warnings.warn(
            f"{path}: skipped {parsed.skipped} zero-token row(s) of {parsed.rows} "
            "(failed requests)",
            TraceWarning,
            stacklevel=2,
        )

    # The parsed column itself where nothing is spread: a list of the arrivals would be
    # 32 bytes a row more while the requests are built.
    grid = batch_grid_s(parsed.arrivals_s) if spread_batches else None
    arrivals: Sequence[float] = (
        parsed.arrivals_s if grid is None else spread_batched_arrivals(parsed.arrivals_s)[0]
    )
    end_s = math.inf if duration_s is None else start_s + duration_s
    requests: list[Request] = []
    count = len(parsed.ids)
    for first in range(0, count, _BUILD_ROWS):
        last = min(first + _BUILD_ROWS, count)
        for rid, arrival, prompt, output in zip(
            parsed.ids[first:last],
            arrivals[first:last],
            parsed.prompts[first:last],
            parsed.outputs[first:last],
            strict=True,
        ):
            if start_s <= arrival < end_s:
                shifted = arrival - start_s
                if load_scale != 1.0:
                    shifted = shifted / load_scale
                requests.append(Request(rid, shifted, prompt, output))
        if on_progress is not None and last < count:
            on_progress(share + (1.0 - share) * last / count)
    if on_progress is not None:
        on_progress(1.0)
    if not requests:
        span = arrivals[-1] if arrivals else 0.0
        raise _fail(
            path,
            None,
            f"window [{start_s}, {end_s}) s holds no requests (kept arrivals span 0 to {span} s)",
        )
    report = TraceLoadReport(
        path=str(path),
        format=fmt,
        rows=parsed.rows,
        skipped_zero_token_rows=parsed.skipped,
        sha256=digest,
        first_timestamp_raw=parsed.first_timestamp_raw,
        requests=len(requests),
        start_s=start_s,
        duration_s=duration_s,
        load_scale=load_scale,
        name=name,
        batch_grid_s=grid,
    )
    return tuple(requests), report


# --------------------------------------------------------------------------- transforms


def _sorted(workload: Sequence[Request]) -> list[Request]:
    """Requests sorted by arrival, ties kept in their given order."""
    return sorted(workload, key=lambda r: r.arrival_time_s)


def select_window(
    workload: Sequence[Request], start_s: float, duration_s: float | None
) -> tuple[Request, ...]:
    """Keep arrivals in ``[start_s, start_s + duration_s)``, rebased so ``start_s`` is 0.

    Request ids and lengths are kept; ``duration_s=None`` keeps everything after start.
    The result may be empty.

    Raises:
        ValueError: start < 0, duration <= 0, or either not finite.
    """
    _check_window(start_s, duration_s)
    end_s = math.inf if duration_s is None else start_s + duration_s
    return tuple(
        Request(r.request_id, r.arrival_time_s - start_s, r.prompt_tokens, r.output_tokens)
        for r in _sorted(workload)
        if start_s <= r.arrival_time_s < end_s
    )


def scale_load(workload: Sequence[Request], load_scale: float) -> tuple[Request, ...]:
    """Multiply the arrival rate by ``load_scale``: every arrival time becomes ``t / X``.

    ``X > 1`` compresses inter-arrival times (more load), ``X < 1`` dilates them. Ids and
    lengths are kept.

    Raises:
        ValueError: ``load_scale`` not finite and > 0.
    """
    _check_scale(load_scale)
    if load_scale == 1.0:
        return tuple(_sorted(workload))
    return tuple(
        Request(r.request_id, r.arrival_time_s / load_scale, r.prompt_tokens, r.output_tokens)
        for r in _sorted(workload)
    )


def workload_checksum(workload: Sequence[Request]) -> str:
    """SHA-256 hex digest of a workload, stable across runs, platforms and versions.

    Canonical encoding: the line ``gpugov-workload-v1``, then one ASCII line per request,
    in the given order, ``request_id,repr(float(arrival_time_s)),prompt,output``. Python's
    float ``repr`` is the shortest round-tripping decimal, so it is platform independent.
    """
    digest = hashlib.sha256(b"gpugov-workload-v1\n")
    for r in workload:
        line = (
            f"{int(r.request_id)},{float(r.arrival_time_s)!r},"
            f"{int(r.prompt_tokens)},{int(r.output_tokens)}\n"
        )
        digest.update(line.encode("ascii"))
    return digest.hexdigest()
