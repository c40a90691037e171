"""Prometheus exposition text: the sample lines a source wants, parsed into series, and
one sample name's series combined into the value of one engine.

A vLLM page is thousands of lines of histogram buckets; parsing it whole costs
milliseconds. :func:`parse_page` keeps only the lines of the wanted sample names (one
regex scan) and parses those with ``prometheus_client.parser.text_string_to_metric_families``
(which drops ``_total`` from a counter's family name but not from its samples: matching is
on sample names). :func:`aggregate` combines a name's series: series that differ only in a
rank label (``tp_rank``, ``pp_rank``, ...) are one engine reporting the same state several
times, so the largest is taken; everything else (data-parallel ``engine``/``dp_rank``
labels, ``finished_reason``, several models) is summed, except ratios, which are averaged.
What the series mean for each engine is :mod:`daemon.engines`.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.errors import EngineParseError, EngineUnavailable

RANK_LABELS = frozenset({"tp_rank", "pp_rank", "rank", "attn_tp_rank", "moe_ep_rank"})
"""Labels that tell one engine's ranks apart: their series report the same state."""
Aggregate = Literal["sum", "mean"]
Series = dict[str, list[tuple[dict[str, str], float]]]


def escape_label_value(value: str) -> str:
    """``value`` as exposition text quotes a label value: backslash, double quote and
    newline escaped, as the text format defines."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample_name(line: str) -> str:
    """The sample name a line of exposition text starts with."""
    end = len(line)
    for stop in ("{", " ", "\t"):
        position = line.find(stop)
        if position != -1 and position < end:
            end = position
    return line[:end]


@functools.lru_cache(maxsize=16)
def _line_selector(wanted: frozenset[str] | None) -> re.Pattern[str]:
    """A regex matching ``"\\n" + line`` for lines that start with a wanted sample name,
    after any blanks (the exposition format ignores a line's leading whitespace).

    The names' common prefix (``vllm:``, ``sglang:``) is a literal the regex engine can
    search for, which makes the scan several times faster than a per-line Python loop.
    """
    if wanted is None:
        return re.compile(r"\n[ \t]*(?!#)[^\s][^\n]*")
    ordered = sorted(wanted, key=len, reverse=True)
    prefix = os.path.commonprefix(ordered)  # noqa: RUF071 - a string prefix is meant
    names = "|".join(re.escape(name[len(prefix) :]) for name in ordered)
    return re.compile(rf"\n[ \t]*{re.escape(prefix)}(?:{names})(?=[{{ \t])[^\n]*")


SeriesCache = dict[str, tuple[str, dict[str, str]]]


_NAME_AND_LABELS = re.compile(r'[^\s{]*\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}')
"""A sample line's name and label set, up to the brace that closes it outside quotes."""


def _split_value(line: str) -> tuple[str, str]:
    """``name{labels}`` and the rest (value, optional timestamp and exemplar) of a line.

    Values and timestamps are numbers, so without a ``#`` the last brace ends the labels.
    An OpenMetrics exemplar (``value # {trace_id="..."} 0.3 ts``) has braces of its own,
    and a label value may hold ``#`` or braces: those lines are split after the label set
    proper, read with its quotes and escapes.
    """
    if "#" in line:
        match = _NAME_AND_LABELS.match(line)
        if match is not None:
            return line[: match.end()], line[match.end() :]
        head, _, rest = line.partition(" ")  # no label set: the name ends at the space
        return head, rest
    close = line.rfind("}")
    if close != -1:
        return line[: close + 1], line[close + 1 :]
    head, _, rest = line.partition(" ")
    return head, rest


CHECK_EVERY = 2048
"""Wanted lines read between two looks at the clock, and parsed per block: a page
parses in blocks so that one with hundreds of thousands of wanted lines can be given up
at its deadline, not only after the whole of it."""


MAX_LINE_CHARS = 32 * 1024
"""The longest sample line of a wanted series read (an engine's longest, vLLM's
``cache_config_info``, is under a kilobyte). prometheus_client's parser takes time
quadratic in a line's labels, and one line cannot be given up at the deadline: a 2 MB
line of 200,000 labels held the loop 23 s, past any ``engine.timeout_s``."""

BLOCK_CHARS = 256 * 1024
"""The most characters parsed between two looks at the clock (with at most
:data:`CHECK_EVERY` lines): a block of long lines costs what thousands of short ones do."""


class ParseTimeout(EngineUnavailable):
    """The page was still being read at the scrape's deadline (:func:`parse_page`)."""


def parse_page(
    text: str,
    wanted: Iterable[str] | None,
    source: str,
    cache: SeriesCache | None = None,
    *,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Series:
    """Parse exposition text into ``{sample name: [(labels, value), ...]}``.

    Only lines whose sample name is in ``wanted`` are parsed (all when None); they are
    picked with one regex scan, so a page of thousands of bucket lines costs little.
    With ``cache`` (one per source), a series seen before reuses its parsed name and
    labels and only its value is read; new series go through prometheus_client's parser,
    :data:`CHECK_EVERY` lines or :data:`BLOCK_CHARS` characters at a time (each block's
    series cached as it is parsed). With ``deadline`` (on ``clock``), the clock is read
    every :data:`CHECK_EVERY` lines and between blocks: a page still being read past it
    is given up.

    Raises:
        EngineParseError: naming ``source`` and the 1-based line that does not parse, or
            that is longer than :data:`MAX_LINE_CHARS` (refused before any parsing).
        ParseTimeout: the page is still being read past ``deadline``.
    """
    selector = _line_selector(None if wanted is None else frozenset(wanted))
    # A byte-order mark (a page saved by an editor, served as a file) would glue itself
    # to the first sample name, and that line would be passed over unread.
    padded = "\n" + text.removeprefix("\ufeff")
    series: Series = {}
    fresh: list[re.Match[str]] = []
    for count, match in enumerate(selector.finditer(padded), 1):
        if deadline is not None and count % CHECK_EVERY == 0 and clock() > deadline:
            raise ParseTimeout(f"{source}: the page was still being read at its deadline")
        line = match.group(0).strip()
        if len(line) > MAX_LINE_CHARS:
            number = padded.count("\n", 0, match.start() + 1)
            raise EngineParseError(
                f"{source}: line {number} ({sample_name(line)}) is {len(line)} characters, "
                f"longer than any metrics line ({MAX_LINE_CHARS}); scrape discarded"
            )
        key, rest = _split_value(line)
        known = cache.get(key) if cache is not None else None
        if known is not None:
            fields = rest.split()
            try:
                value = float(fields[0])
            except (IndexError, ValueError):
                fresh.append(match)  # let the real parser name the problem
                continue
            series.setdefault(known[0], []).append((known[1], value))
        else:
            fresh.append(match)
    if not fresh:
        return series
    if cache is not None and len(cache) > 20_000:  # label churn (e.g. per-request labels)
        cache.clear()
    for index, block in enumerate(_blocks(fresh)):
        if deadline is not None and index and clock() > deadline:
            raise ParseTimeout(f"{source}: the page was still being read at its deadline")
        samples = _parse_block(block, padded, source)
        if cache is not None and len(samples) == len(block):
            for match, sample in zip(block, samples, strict=True):
                cache[_split_value(match.group(0).strip())[0]] = (sample.name, sample.labels)
        for sample in samples:
            series.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    return series


def _blocks(fresh: list[re.Match[str]]) -> Iterator[list[re.Match[str]]]:
    """``fresh`` in blocks of at most :data:`CHECK_EVERY` lines and about
    :data:`BLOCK_CHARS` characters (a line longer than that is a block of its own)."""
    block: list[re.Match[str]] = []
    size = 0
    for match in fresh:
        length = match.end() - match.start()
        if block and (len(block) >= CHECK_EVERY or size + length > BLOCK_CHARS):
            yield block
            block, size = [], 0
        block.append(match)
        size += length
    if block:
        yield block


def _parse_block(block: list[re.Match[str]], padded: str, source: str) -> list[Any]:
    """The samples of ``block``'s lines (of ``padded``, the page after a newline), through
    prometheus_client's parser.

    Raises:
        EngineParseError: naming ``source`` and the 1-based line that does not parse.
    """
    text = "\n".join(match.group(0).strip() for match in block) + "\n"
    # Any exception: the parser is not ours, and on some text raises what it does not
    # mean to (an empty label name after a comma, ``{a="1", ="2"}``, raised IndexError,
    # which ended the daemon's loop with a traceback).
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as failed:
        for match in block:  # find the culprit to name it
            line = match.group(0).strip()
            try:
                list(text_string_to_metric_families(line + "\n"))
            except Exception as error:
                number = padded.count("\n", 0, match.start() + 1)
                raise EngineParseError(
                    f"{source}: line {number} is not Prometheus text ({_said(error)}): "
                    f"{line[:200]!r}"
                ) from error
        raise EngineParseError(  # the block failed but no single line did
            f"{source}: the page is not Prometheus text ({_said(failed)})"
        ) from failed
    return [sample for family in families for sample in family.samples]


def _said(error: Exception) -> str:
    """What the parser's ``error`` says: its message, with its type where that is not the
    ValueError the parser means for bad text."""
    return str(error) if type(error) is ValueError else f"{type(error).__name__}: {error}"


EngineKey = tuple[tuple[str, str], ...]
"""A series' labels less its rank labels, sorted: which engine (and which of its series
of one name) it is, as :func:`aggregate` tells them apart."""


def engine_key(labels: dict[str, str], leave_out: str | None = None) -> EngineKey:
    """``labels`` less the rank labels (and ``leave_out``, a histogram's ``le``), sorted:
    series with the same key are one engine's same series, said by several ranks."""
    return tuple(
        sorted((k, v) for k, v in labels.items() if k not in RANK_LABELS and k != leave_out)
    )


def aggregate(series: Series, name: str, how: Aggregate = "sum") -> float | None:
    """Combine every series of sample ``name``; None when the page lacks it.

    Series that differ only in rank labels count once (their maximum); the rest are
    summed (``how="sum"``) or averaged (``how="mean"``, for ratios).
    """
    rows = series.get(name)
    if not rows:
        return None
    groups: dict[EngineKey, float] = {}
    for labels, value in rows:
        key = engine_key(labels)
        previous = groups.get(key)
        groups[key] = value if previous is None else max(previous, value)
    total = sum(groups.values())
    return total / len(groups) if how == "mean" else total


def aggregate_where(series: Series, name: str, label: str, value: str) -> float | None:
    """:func:`aggregate` over the series of ``name`` whose ``label`` is ``value`` (rank
    labels counted once, as everywhere); None when the page has none."""
    rows = [(labels, v) for labels, v in series.get(name) or () if labels.get(label) == value]
    return aggregate({name: rows}, name) if rows else None


def summed(series: Series, names: Iterable[str]) -> float | None:
    """The sum of every present name's aggregate, or None when none is present."""
    values = [aggregate(series, name) for name in names]
    present = [value for value in values if value is not None]
    return sum(present) if present else None


__all__ = [
    "BLOCK_CHARS",
    "CHECK_EVERY",
    "MAX_LINE_CHARS",
    "RANK_LABELS",
    "Aggregate",
    "EngineKey",
    "ParseTimeout",
    "Series",
    "SeriesCache",
    "aggregate",
    "aggregate_where",
    "engine_key",
    "escape_label_value",
    "parse_page",
    "sample_name",
    "summed",
]
