"""Parsing the trace formats (Azure, BurstGPT, Mooncake, plain CSV) into columns: format
detection, each field's checks and the ``path:line: what is wrong`` errors that
:func:`plant.workload.load_trace` raises; naming, windowing and scaling stay there."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import re
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpugov.plant.input_files import loads_json, plain_number_text
from gpugov.plant.trace_file import read_trace_text

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
    """A trace file is missing, unreadable or malformed; the message is ``path:line: what``.

    ``formats``: the formats a header matched where it matched several (the message says
    how to rename it; a caller with a way to name the format adds it, as ``simulate``'s
    ``--trace-format`` and :func:`~gpugov.plant.workload.load_trace`'s ``format``)."""

    def __init__(self, message: str, *, formats: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.formats = formats


_BLOCK_CHARS = 1 << 20
"""Characters of a trace's text parsed between two progress reports (about 1 MB of a
trace's ASCII); lines are split in each block's own buffer, never in a copy of the whole
text."""


@dataclass(slots=True)
class ParsedTrace:
    """Columns parsed from a trace, arrivals already relative to the first timestamp
    (packed arrays: 8 bytes a value, not a Python object each)."""

    ids: array[int]
    arrivals_s: array[float]
    prompts: array[int]
    outputs: array[int]
    rows: int
    skipped: int
    first_timestamp_raw: str


def trace_error(
    path: Path, line: int | None, message: str, *, formats: tuple[str, ...] = ()
) -> TraceError:
    """Build a TraceError whose message is ``path:line: message``."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return TraceError(f"{where}: {message}", formats=formats)


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
        raise trace_error(path, line, f"field {field!r}: expected a token count, got {raw!r:.40}")
    if isinstance(raw, str):
        if not plain_number_text(raw):
            raise trace_error(
                path, line, f"field {field!r}: expected a token count, got {raw!r:.40}"
            )
        try:
            value = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                raise trace_error(
                    path, line, f"field {field!r}: expected a token count, got {raw!r:.40}"
                ) from None
    else:
        value = raw
    if isinstance(value, float):
        if not value.is_integer():
            raise trace_error(
                path, line, f"field {field!r}: expected an integer token count, got {raw!r:.40}"
            )
        value = int(value)
    if value < 0:
        raise trace_error(path, line, f"field {field!r}: negative token count {raw!r:.40}")
    if value > MAX_TOKEN_COUNT:
        raise trace_error(
            path,
            line,
            f"field {field!r}: token count {_clipped(raw)} is over the limit of "
            f"{MAX_TOKEN_COUNT:,} (no model's context window is longer)",
        )
    return value


_DATE = re.compile(r"\s*\d{4}-\d{2}-\d{2}[ T]\d", re.ASCII)
"""The start of a date and time (``2023-11-16 18:17:03``, ``2023-11-16T18:17:03Z``)."""


def _not_a_number(raw: Any, field: str, path: Path, line: int) -> TraceError:
    """The error for a timestamp that is no number; a date is told where dates are read
    (the azure format), since a user's own log converted to ``arrival_time_s`` often
    keeps its ISO dates."""
    hint = ""
    if isinstance(raw, str) and _DATE.match(raw):
        hint = (
            " (a date: this format's stamps are numbers; dates are read by the azure format, "
            "header TIMESTAMP,ContextTokens,GeneratedTokens)"
        )
    return trace_error(path, line, f"field {field!r}: expected a number, got {raw!r:.40}{hint}")


def _seconds(raw: Any, field: str, path: Path, line: int) -> float:
    """Parse a finite numeric timestamp (seconds or milliseconds, as the format says)."""
    if isinstance(raw, bool) or (isinstance(raw, str) and not plain_number_text(raw)):
        raise _not_a_number(raw, field, path, line)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise _not_a_number(raw, field, path, line) from None
    except OverflowError:  # a JSON integer too large for a float (10**400)
        value = math.inf
    if not math.isfinite(value):
        raise trace_error(path, line, f"field {field!r}: timestamp must be finite, got {raw!r:.40}")
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
            raise trace_error(
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
                raise trace_error(path, line, f"field {field!r}: invalid date in {raw!r}") from None
            self._days[date] = day
        h, m, s = int(hours), int(minutes), int(seconds)
        if h > 23 or m > 59 or s > 59:
            raise trace_error(path, line, f"field {field!r}: invalid time of day in {raw!r}")
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
            raise trace_error(
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
            raise trace_error(path, line, f"field {field!r}: invalid UTC offset in {raw.strip()!r}")
        sign = -1 if zone[0] == "-" else 1
        return sign * (hours * 3_600 + minutes * 60)


def read_trace(path: Path) -> tuple[str, str]:
    """Read a trace as UTF-8 text within the size limits (see :mod:`plant.trace_file`)."""
    return read_trace_text(path, trace_error)


def _first_line(text: str) -> tuple[int, str] | None:
    """The file's first line that is not blank, as (its 1-based number, its text without
    the terminator), or None when every line is blank; blank lines before it are skipped
    as they are between rows (found by one regex search: the rest is not copied)."""
    found = _NOT_BLANK.search(text)
    if found is None:
        return None
    start = text.rfind("\n", 0, found.start()) + 1
    end = text.find("\n", start)
    line = text[start:] if end < 0 else text[start:end]
    return text.count("\n", 0, start) + 1, line.rstrip("\r")


_NOT_BLANK = re.compile(r"\S")
"""A character that makes its line not blank (``str.strip`` strips the others)."""


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


def _csv_reason(error: csv.Error) -> str:
    """The csv module's error in a trace's words: its "new-line character seen in unquoted
    field - do you need to open the file in universal-newline mode?" is a carriage return
    inside a line, from line ends that mix lone CRs with LFs (a file of lone CRs only is
    read as it is), and names a Python mode no user can set."""
    if "new-line character seen in unquoted field" in str(error):
        return (
            "a carriage return inside the line (line ends mixing lone CRs with LFs; make "
            "them all LF first: tr '\\r' '\\n' < FILE > NEW)"
        )
    return str(error)


def detect_format(path: Path, text: str) -> str:
    """Pick the format from the first line; raise naming the known formats otherwise."""
    if not text:
        raise trace_error(path, 1, "empty file (no header and no data rows)")
    found = _first_line(text)
    if found is None:
        raise trace_error(path, 1, "only blank lines (no header and no data rows)")
    line, first = found
    if first.lstrip().startswith("{"):
        return "mooncake"
    if first.lstrip().startswith("["):
        raise trace_error(
            path,
            line,
            "a JSON array, not JSON lines; a Mooncake trace has one JSON object per line",
        )
    try:
        header = {_column_key(name) for name in next(csv.reader([first]), [])}
    except csv.Error as error:
        raise trace_error(
            path, line, f"the header is not a CSV row: {_csv_reason(error)}"
        ) from None
    columns = {fmt: {_column_key(col) for col in cols} for fmt, cols in _CSV_COLUMNS.items()}
    matches = [fmt for fmt, cols in columns.items() if cols <= header]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        # Worded for every caller: a command line has no format= (only simulate has a flag
        # for it, which its own line adds from ``formats``).
        columns_of = "; ".join(f"{fmt}: {', '.join(_CSV_COLUMNS[fmt])}" for fmt in matches)
        raise trace_error(
            path,
            line,
            f"header {_clipped(first, 80)} matches several formats ({', '.join(matches)}); "
            f"rename a column of each format but the one to read ({columns_of})",
            formats=tuple(matches),
        )
    hint = ""
    closest = max(_CSV_COLUMNS, key=lambda fmt: len(columns[fmt] & header))
    missing = [col for col in _CSV_COLUMNS[closest] if _column_key(col) not in header]
    if len(missing) < len(_CSV_COLUMNS[closest]):
        hint = f" (closest: {closest}, missing column(s) {', '.join(map(repr, missing))})"
    elif "," not in first and ("\t" in first or ";" in first):
        separator = "tabs" if "\t" in first else "semicolons"
        hint = f" (columns separated by {separator}: a trace is comma-separated)"
    raise trace_error(
        path, line, f"unknown header {_clipped(first, 80)}{hint}; known formats: {_KNOWN_FORMATS}"
    )


class _Columns:
    """The columns of a trace's rows as they are parsed: each timestamp refused when it is
    earlier than the one before it or so far from the first that their span is no finite
    number of seconds, arrivals relative to the first (divided by ``unit``: 1 for
    seconds), a row with a zero token count counted as skipped.

    ``first`` gives a raw timestamp as :attr:`ParsedTrace.first_timestamp_raw` records it,
    ``named`` the field and timestamp an error names (built only for an error)."""

    def __init__(
        self,
        path: Path,
        unit: float,
        first: Callable[[Any], str],
        named: Callable[[Any], str],
    ) -> None:
        self.path = path
        self.unit = unit
        self.first = first
        self.named = named
        self.ids: array[int] = array("q")
        self.arrivals: array[float] = array("d")
        self.prompts: array[int] = array("q")
        self.outputs: array[int] = array("q")
        self.rows = 0
        self.skipped = 0
        self.first_raw = ""
        self.origin: Any = 0
        self.previous: Any = None
        self.previous_line = 0

    def add(self, line: int, raw: Any, stamp: Any, prompt: int, output: int) -> None:
        """The row at ``line``: timestamp ``stamp`` (``raw`` as the file gives it)."""
        if self.previous is None:
            self.first_raw, self.origin = self.first(raw), stamp
        elif stamp < self.previous:
            raise trace_error(
                self.path,
                line,
                f"{self.named(raw)} goes backwards (line {self.previous_line} is later)",
            )
        span = stamp - self.origin  # Azure's integer nanoseconds: exact, and always finite
        if not math.isfinite(span):
            raise trace_error(self.path, line, f"{self.named(raw)} is too far from the first")
        self.previous, self.previous_line = stamp, line
        if prompt == 0 or output == 0:
            self.skipped += 1
        else:
            self.ids.append(self.rows)
            self.arrivals.append(span / self.unit)
            self.prompts.append(prompt)
            self.outputs.append(output)
        self.rows += 1

    def parsed(self) -> ParsedTrace:
        """The columns parsed."""
        return ParsedTrace(
            self.ids,
            self.arrivals,
            self.prompts,
            self.outputs,
            self.rows,
            self.skipped,
            self.first_raw,
        )


def _parse_csv(
    path: Path, text: str, fmt: str, report: Callable[[float], None] | None = None
) -> ParsedTrace:
    """Parse one of the CSV formats; arrivals relative to the first data row. ``report``
    gets the fraction of the text parsed (see :func:`_blocks`). A row the csv module
    cannot read (a quote left open, a stray carriage return) is refused in one line
    naming the file (and the row's line: :func:`_one_line_rows`), not raised as the
    module's own error."""
    try:
        return _parse_csv_rows(path, text, fmt, report)
    except csv.Error as error:
        raise trace_error(
            path, None, f"not a CSV file the reader can split into rows: {error}"
        ) from None


def _parse_csv_rows(
    path: Path, text: str, fmt: str, report: Callable[[float], None] | None
) -> ParsedTrace:
    """:func:`_parse_csv`'s work."""
    if not text:
        raise trace_error(path, 1, "empty file (no header and no data rows)")
    reader = csv.reader(_csv_lines(text, report))
    # The header is the first row that is not blank (blank lines are skipped before it as
    # between rows, and a file of blank lines only has none).
    rows = _one_line_rows(reader, path)
    header = next((row for row in rows if any(cell.strip() for cell in row)), [])
    if not header:
        raise trace_error(path, 1, "only blank lines (no header and no data rows)")
    header = [name.strip() for name in header]
    header_line = reader.line_num
    keys = [_column_key(name) for name in header]
    ts_col, prompt_col, output_col = _CSV_COLUMNS[fmt]
    for col in (ts_col, prompt_col, output_col):
        if _column_key(col) not in keys:
            listed = ", ".join(map(repr, header))
            listed = listed if len(listed) <= 120 else listed[:117] + "..."
            raise trace_error(
                path,
                header_line,
                f"missing column {col!r} required by format {fmt!r}; header has {listed}",
            )
        if keys.count(_column_key(col)) > 1:
            raise trace_error(
                path, header_line, f"column {col!r} appears more than once in the header"
            )
    i_ts, i_prompt, i_output = (
        keys.index(_column_key(c)) for c in (ts_col, prompt_col, output_col)
    )
    width = len(header)
    azure_clock = _AzureClock() if fmt == "azure" else None
    # Azure's integer nanoseconds: the subtraction is exact, then one rounding to seconds;
    # the other formats' seconds are floats already.
    columns = _Columns(
        path,
        1e9 if azure_clock is not None else 1.0,
        str.strip,
        lambda raw: f"field {ts_col!r}: timestamp {raw.strip()!r}",
    )
    for row in rows:
        line = reader.line_num
        if not row or not any(cell.strip() for cell in row):
            continue  # blank line: not a record
        if [_column_key(cell.lstrip("\ufeff")) for cell in row] == keys:
            # Files joined with cat: the second one's header was "expected a number".
            raise trace_error(
                path,
                line,
                f"the header again (line {header_line}'s): files joined with cat? Keep the "
                "first file's header only",
            )
        if len(row) != width:
            if len(row) < width:
                absent = header[len(row)]
                raise trace_error(
                    path,
                    line,
                    f"missing field {absent!r}: row has {len(row)} of {width} fields",
                )
            raise trace_error(path, line, f"row has {len(row)} fields, header has {width}")
        raw_ts = row[i_ts]
        stamp: float | int
        if azure_clock is not None:
            stamp = azure_clock(raw_ts, ts_col, path, line)
        else:
            stamp = _seconds(raw_ts, ts_col, path, line)
        prompt = _token_count(row[i_prompt], prompt_col, path, line)
        output = _token_count(row[i_output], output_col, path, line)
        columns.add(line, raw_ts, stamp, prompt, output)
    if columns.rows == 0:
        raise trace_error(path, reader.line_num + 1, "no data rows after the header")
    return columns.parsed()


def _one_line_rows(reader: Any, path: Path) -> Iterator[list[str]]:
    """The rows of ``reader`` (a ``csv.reader``), each refused naming the line it starts on
    when it is no row of one line: a quoted field that runs over a line break, or past the
    csv module's field limit. A trace row is one line, so such a field is a quote left
    open (``1,10,5,"oops``), which would swallow the rows after it, up to the next quote
    or the end of the file, into one ignored column: requests silently lost."""
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            if "field limit" not in str(error):
                raise trace_error(path, start, f"not a CSV row: {_csv_reason(error)}") from None
            raise trace_error(
                path,
                start,
                f"a quoted field runs on from this line past {csv.field_size_limit():,} "
                f"characters (to line {reader.line_num}); a trace row is one line: is a "
                "quote left open?",
            ) from None
        if reader.line_num > start:
            raise trace_error(
                path,
                start,
                f"a quoted field runs on from this line to line {reader.line_num}; a trace "
                "row is one line: is a quote left open?",
            )
        yield row


def _parse_mooncake(
    path: Path, text: str, report: Callable[[float], None] | None = None
) -> ParsedTrace:
    """Parse Mooncake JSON lines (timestamps in ms); arrivals relative to the first line.
    ``report`` gets the fraction of the text parsed (see :func:`_blocks`)."""
    columns = _Columns(
        path, 1000.0, json.dumps, lambda raw: f"field 'timestamp': timestamp {raw!r}"
    )
    line = 0
    if not text:
        raise trace_error(path, 1, "empty file (no data rows)")
    for line, content in enumerate(_json_lines(text, report), start=1):
        if not content.strip():
            continue
        try:
            item = loads_json(content)
        except json.JSONDecodeError as e:
            raise trace_error(path, line, f"invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(item, dict):
            raise trace_error(path, line, f"expected a JSON object, got {type(item).__name__}")
        for field in _MOONCAKE_FIELDS:
            if field not in item:
                raise trace_error(path, line, f"missing field {field!r}")
        for field in _MOONCAKE_FIELDS:
            # JSON numbers only: text such as "100" or "1e3" is not what a Mooncake
            # trace holds (the CSV readers parse text; this one must not).
            value = item[field]
            if isinstance(value, str):
                raise trace_error(
                    path, line, f"field {field!r}: expected a JSON number, got text {value!r:.40}"
                )
        raw_ts = item["timestamp"]
        stamp = _seconds(raw_ts, "timestamp", path, line)
        prompt = _token_count(item["input_length"], "input_length", path, line)
        output = _token_count(item["output_length"], "output_length", path, line)
        columns.add(line, raw_ts, stamp, prompt, output)
    if columns.rows == 0:
        raise trace_error(path, line + 1, "no data rows (empty trace)")
    return columns.parsed()


def parse_trace(
    path: Path, text: str, fmt: str, report: Callable[[float], None] | None = None
) -> ParsedTrace:
    """Parse ``text`` (the file at ``path``) in format ``fmt`` (``azure``, ``burstgpt``,
    ``mooncake`` or ``csv``); ``report`` gets the fraction of the text parsed."""
    if fmt == "mooncake":
        return _parse_mooncake(path, text, report)
    return _parse_csv(path, text, fmt, report)
