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

The formats are parsed in :mod:`plant.trace_formats`; the synthetic generators live in
:mod:`plant.synthetic_workloads`.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from gpugov.plant.input_files import path_exists
from gpugov.plant.trace_batches import batch_grid_s, spread_batched_arrivals
from gpugov.plant.trace_formats import (
    TraceError,
    detect_format,
    parse_trace,
    read_trace,
    trace_error,
)
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


class TraceWarning(UserWarning):
    """A trace loaded, with something a user should hear of: rows skipped (zero-token
    rows: failed requests), or stamps that look like a time since 1970 in another unit."""


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
        span_s: the trace's last kept arrival in its own seconds from its first (after
            spreading, before windowing): a window ending past it holds less than asked.
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
    span_s: float = 0.0


TraceProgress = Callable[[float], None]
"""``on_progress`` of :func:`load_trace`: called with the fraction of the load done so far
(0 to 1, increasing, the last call 1.0)."""

_PARSE_SHARE = 0.7
"""Share of a whole trace's load progress that parsing its text counts for; building the
requests from the parsed columns takes the rest (as it takes about 30 % of the time on
generated Azure files of 0.3 and 2 million rows)."""

_PARSE_SHARE_OF_A_WINDOW = 0.95
"""The same for a load with a ``duration_s`` window, whose requests are usually a small
part of the trace (only they are built; the other rows are only looked at)."""

_BUILD_ROWS = 1 << 16
"""Requests built between two progress reports."""


# --------------------------------------------------------------------------- resolving


def traces_dir() -> Path:
    """Directory of the shared real traces: ``$GPUGOV_TRACES_DIR``, else the default
    (:data:`DEFAULT_TRACES_DIR`, which does not depend on the working directory)."""
    configured = os.environ.get(TRACES_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return DEFAULT_TRACES_DIR


def traces_dir_problem() -> str | None:
    """What is wrong with a ``$GPUGOV_TRACES_DIR`` that is set: the path it names does not
    exist, or is a file (or anything else that is no directory), so that no shared trace
    can be found there; None when it is unset, empty or a directory."""
    configured = os.environ.get(TRACES_DIR_ENV)
    if not configured:
        return None
    directory = traces_dir()
    if os.path.isdir(directory):
        return None
    if os.path.isfile(directory):
        what = "is a file, not a directory"
    elif os.path.lexists(directory):
        what = "is not a directory" if os.path.exists(directory) else "is a dangling link"
    else:
        what = "does not exist"
    return (
        f"${TRACES_DIR_ENV} is set to {directory}, which {what}: no shared trace is found "
        "there; point it at the directory holding the shared traces"
    )


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
            ``$GPUGOV_TRACES_DIR`` and the default directory. Or a string without a
            directory part is neither a name nor a file: the message lists the names
            and the closest one.
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
            if path.exists() or path.is_symlink():
                # There, but no trace file: a directory, a FIFO, a device, a dangling link.
                kind = "not a regular file"
                if path.is_dir():
                    kind = "a directory"
                elif not path.exists():
                    kind = "a dangling link"
                raise TraceError(f"trace {name_or_path!r}: {path} is {kind}, not the trace's file")
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
    path = Path(name_or_path)
    present = path_exists(path, dangling_links=True)
    if os.sep not in name_or_path and not present:
        # A bare word that is no file: most likely a mistyped name, which was refused as
        # "azure-conv-10mim: cannot read trace file: No such file or directory".
        known = [*BUNDLED_TRACES, *SHARED_TRACES]
        close = difflib.get_close_matches(name_or_path, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TraceError(
            f"unknown trace {name_or_path!r:.80}: not a trace name ({', '.join(known)}; "
            f"gpugov traces lists them) nor a file{hint}"
        )
    return path


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


def _scaled(report: TraceProgress | None, share: float) -> TraceProgress | None:
    """``report`` given a fraction times ``share`` (parsing's part of a load's progress)."""
    if report is None:
        return None
    return lambda fraction: report(share * fraction)


def format_seconds(seconds: float) -> str:
    """A time in seconds as a message shows it: from 100 s up with thousands separated
    and at most one decimal (``11,258,612.3``, ``1,800``: a trace's span in seconds runs
    to eight digits), below that and from 1e15 up to four significant figures (``0.25``,
    ``37.5``, ``1e+297``: a corrupt stamp of 1e300 ms made a line of 300 digits)."""
    if not math.isfinite(seconds) or abs(seconds) < 100 or abs(seconds) >= 1e15:
        return f"{seconds:.4g}"
    return f"{seconds:,.1f}".removesuffix(".0")


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


_EPOCH_UNITS = (
    ("seconds", 1.0),
    ("milliseconds", 1e3),
    ("microseconds", 1e6),
    ("nanoseconds", 1e9),
)
"""Units a stamp counted from 1970 may be in, each with its count per second."""

_EPOCH_RANGE_S = (1e9, 1e10)
"""Seconds from 1970 to 2001 and to 2286: a first stamp in this range, in some unit, is
most likely a time since 1970 in that unit."""


def epoch_unit_warning(fmt: str, first_raw: str) -> str | None:
    """A line saying the trace's first stamp looks like a time since 1970 in a unit other
    than the one its format reads (``arrival_time_s`` of ``1700000000000``: milliseconds,
    read as seconds, so the trace runs 1000 times slower; a Mooncake ``timestamp`` of
    ``1700000000``: seconds, read as milliseconds, 1000 times faster), which no check
    refuses; None where it fits the format's unit or is no number (Azure's dates)."""
    read_as = {"csv": ("seconds", 1.0), "burstgpt": ("seconds", 1.0)}.get(
        fmt, ("milliseconds", 1e3) if fmt == "mooncake" else None
    )
    if read_as is None:
        return None
    try:
        stamp = float(first_raw)
    except ValueError:
        return None
    for unit, per_second in _EPOCH_UNITS:
        if unit != read_as[0] and _EPOCH_RANGE_S[0] <= stamp / per_second < _EPOCH_RANGE_S[1]:
            factor = per_second / read_as[1]
            how = f"{factor:g} times slower" if factor > 1 else f"{1 / factor:g} times faster"
            return (
                f"the first timestamp {first_raw[:40]} looks like {unit} since 1970, but the "
                f"{fmt} format reads its stamps as {read_as[0]}: if so, the trace replays "
                f"{how} than it was recorded (convert the stamps first)"
            )
    return None


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
    text, digest = read_trace(path)
    if "\r" in text and "\n" not in text:
        text = text.replace("\r", "\n")  # classic Mac line endings: one row per line
    fmt = detect_format(path, text) if format == "auto" else format
    share = _PARSE_SHARE if duration_s is None else _PARSE_SHARE_OF_A_WINDOW
    parse_report = _scaled(on_progress, share)
    parsed = parse_trace(path, text, fmt, parse_report)
    del text  # the columns hold what is needed; the text is as large as the file
    if parsed.rows and parsed.skipped == parsed.rows:
        raise trace_error(
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
    unit = epoch_unit_warning(fmt, parsed.first_timestamp_raw)
    if unit is not None:
        warnings.warn(f"{path}: {unit}", TraceWarning, stacklevel=2)

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
                    if not math.isfinite(shifted):
                        # 10 s / 1e-308 overflows: a Request refused it with a traceback.
                        raise trace_error(
                            path,
                            None,
                            f"a load scale of {load_scale:g} stretches the window's arrival "
                            f"at {format_seconds(arrival - start_s)} s to no finite time; "
                            "choose a larger load scale",
                        )
                requests.append(Request(rid, shifted, prompt, output))
        if on_progress is not None and last < count:
            on_progress(share + (1.0 - share) * last / count)
    if on_progress is not None:
        on_progress(1.0)
    if not requests:
        span = arrivals[-1] if arrivals else 0.0
        end = "the end" if duration_s is None else f"{format_seconds(end_s)} s"
        raise trace_error(
            path,
            None,
            f"the window from {format_seconds(start_s)} s to {end} holds no requests (kept "
            f"arrivals span 0 to {format_seconds(span)} s)",
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
        span_s=arrivals[-1],
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
