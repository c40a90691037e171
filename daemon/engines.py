"""Engine sources: scrape a serving engine's Prometheus ``/metrics`` into an EngineSample.

``VllmSource``, ``SglangSource`` and ``TgiSource`` fetch the page over HTTP
(:mod:`daemon.scrape`: one kept-alive connection, one overall deadline per scrape, a size
cap), keep only the lines of
the series they use (a vLLM page is thousands of lines of histogram buckets; parsing it
whole costs milliseconds) and parse those with
``prometheus_client.parser.text_string_to_metric_families``, matching on sample names
(the parser drops ``_total`` from a counter's family name but not from its samples).
:func:`detect_engine` picks the engine from the metric names.

Aggregation over series of one sample name: series that differ only in a rank label
(``tp_rank``, ``pp_rank``, ...) are one engine reporting the same state several times,
so the largest is taken; everything else (data-parallel ``engine``/``dp_rank`` labels,
``finished_reason``, several models) is summed, except ratios, which are averaged.
The derivations from these cumulative values to a ``ServingObservation`` live in
:mod:`daemon.observer` and ``docs/daemon.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.attainment import Buckets
from gpugov.daemon.errors import EngineParseError
from gpugov.daemon.scrape import MAX_PAGE_BYTES, Fetcher, KeepAliveFetcher

EngineKind = Literal["vllm", "sglang", "tgi"]
RANK_LABELS = frozenset({"tp_rank", "pp_rank", "rank", "attn_tp_rank", "moe_ep_rank"})
Aggregate = Literal["sum", "mean"]


@dataclass(frozen=True, slots=True)
class HistogramTotals:
    """A histogram's cumulative ``_sum`` (seconds) and ``_count``."""

    sum_s: float
    count: float


@dataclass(frozen=True, slots=True)
class EngineSample:
    """What one scrape of an engine says; cumulative counters are since the engine started.

    The last block holds exact values only a simulated engine knows; a real engine
    leaves them None and :mod:`daemon.observer` estimates them.
    """

    engine: str
    running_requests: int
    waiting_requests: int
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    finished_requests_total: float | None = None
    arrived_requests_total: float | None = None
    preemptions_total: float | None = None
    ttft: HistogramTotals | None = None
    tpot: HistogramTotals | None = None
    ttft_buckets: Buckets | None = None
    """The TTFT histogram's cumulative buckets (for the SLO attainment)."""
    tpot_buckets: Buckets | None = None
    """The TPOT histogram's buckets: per request where the engine has one, else per
    inter-token interval (``tpot_buckets_per_request`` says which)."""
    tpot_buckets_per_request: bool = False
    kv_usage_ratio: float | None = None
    kv_capacity_tokens: float | None = None
    kv_tokens: float | None = None
    # Exact values (simulated engine only).
    prefill_remaining_tokens: float | None = None
    generated_decode_tokens: float | None = None
    ttft_recent_s: float | None = None
    tpot_recent_s: float | None = None
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    model_name: str | None = None
    """The ``model_name`` label of the engine's series (vLLM, SGLang); several models
    are joined with commas; None when the engine does not label its series."""
    ttft_slo_per_prompt_token_s: float | None = None
    ttft_recent_prompt_tokens: float | None = None
    ttft_count_total: float | None = None
    ttft_within_slo_total: float | None = None
    tpot_count_total: float | None = None
    tpot_within_slo_total: float | None = None
    request_prompt_tokens_buckets: Buckets | None = None
    """Per finished request: the prompt-length histogram's cumulative buckets (vLLM
    ``vllm:request_prompt_tokens``, SGLang ``sglang:prompt_tokens_histogram``), for the
    per-request energy histogram (:mod:`daemon.energy`); None when not published."""
    request_generation_tokens_buckets: Buckets | None = None
    """Per finished request: the output-length histogram's cumulative buckets."""
    iterations_total: float | None = None
    """Engine steps (forward passes) so far: the count of vLLM's tokens-per-step
    histogram ``vllm:iteration_tokens_total``, or of TGI's ``tgi_batch_forward_duration``
    (both methods); None where the engine publishes neither (SGLang)."""
    iteration_tokens_total: float | None = None
    """Tokens those steps ran (the tokens-per-step histogram's ``_sum``): prefill chunk
    tokens as they are computed plus one per decoding request, where the prompt counter
    counts a prompt only once its prefill is done."""
    prefill_forward_s_total: float | None = None
    """Seconds of prefill forward passes so far (TGI's ``tgi_batch_forward_duration_sum``,
    ``method="prefill"``); None where the engine does not time its phases."""
    decode_forward_s_total: float | None = None
    """Seconds of decode forward passes so far (the same, ``method="decode"``)."""
    # Disaggregated serving (docs/disaggregated.md); None where the page has no such series.
    role: str | None = None
    """The pool role the page's labels state (``prefill``, ``decode``, ``colocated``):
    SGLang's ``engine_type``, Dynamo's ``dynamo_component``; None where they say none."""
    kv_transfers_total: float | None = None
    """KV cache transfers completed (vLLM NIXL: ``vllm:nixl_xfer_time_seconds_count``)."""
    kv_transfer_seconds_total: float | None = None
    """Their summed duration in seconds (``vllm:nixl_xfer_time_seconds_sum``)."""
    kv_transfer_bytes_total: float | None = None
    """Bytes they moved (``vllm:nixl_bytes_transferred_sum``)."""
    kv_transfer_failures_total: float | None = None
    """Failed KV transfers (vLLM NIXL), or requests whose transfer failed (SGLang)."""
    kv_transfer_latency_s: float | None = None
    """SGLang's gauge of the latest KV transfer's latency (``sglang:kv_transfer_latency_ms``)."""
    kv_transfer_queue_requests: int | None = None
    """Requests whose KV cache is on the move (SGLang: the prefill inflight queue and the
    decode transfer queue)."""
    kv_bootstrap_queue_requests: int | None = None
    """Requests waiting to be paired with the other pool (SGLang: the prefill bootstrap
    and decode prealloc queues)."""
    waiting_deferred_requests: int | None = None
    """vLLM's waiting requests deferred by a transient constraint, KV transfers included
    (``vllm:num_requests_waiting_by_reason{reason="deferred"}``)."""
    prompt_tokens_external_total: float | None = None
    """Prompt tokens whose KV cache came from another instance instead of being computed
    here (``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}``)."""


@runtime_checkable
class EngineSource(Protocol):
    """One serving engine's state, fetched now.

    Raises :class:`~daemon.errors.EngineUnavailable` (or its ``EngineParseError``) when the
    engine cannot be read; the daemon counts it and falls back when it lasts.
    ``timeout_s`` shortens the source's own deadline for this one scrape (the observer
    passes what is left before its data would go stale).
    """

    def scrape(self, timeout_s: float | None = None) -> EngineSample: ...


# ------------------------------------------------------------------------ parsing
Series = dict[str, list[tuple[dict[str, str], float]]]


def _sample_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " ", "\t"):
        position = line.find(stop)
        if position != -1 and position < end:
            end = position
    return line[:end]


@functools.lru_cache(maxsize=16)
def _line_selector(wanted: frozenset[str] | None) -> re.Pattern[str]:
    """A regex matching ``"\\n" + line`` for lines that start with a wanted sample name.

    The names' common prefix (``vllm:``, ``sglang:``) is a literal the regex engine can
    search for, which makes the scan several times faster than a per-line Python loop.
    """
    if wanted is None:
        return re.compile(r"\n[ \t]*(?!#)[^\s][^\n]*")
    ordered = sorted(wanted, key=len, reverse=True)
    prefix = os.path.commonprefix(ordered)  # noqa: RUF071 - a string prefix is meant
    names = "|".join(re.escape(name[len(prefix) :]) for name in ordered)
    return re.compile(rf"\n{re.escape(prefix)}(?:{names})(?=[{{ \t])[^\n]*")


SeriesCache = dict[str, tuple[str, dict[str, str]]]


def _split_value(line: str) -> tuple[str, str]:
    """``name{labels}`` and the rest (value, optional timestamp) of a sample line."""
    close = line.rfind("}")  # values and timestamps are numbers: the last brace ends labels
    if close != -1:
        return line[: close + 1], line[close + 1 :]
    head, _, rest = line.partition(" ")
    return head, rest


def parse_page(
    text: str, wanted: Iterable[str] | None, source: str, cache: SeriesCache | None = None
) -> Series:
    """Parse exposition text into ``{sample name: [(labels, value), ...]}``.

    Only lines whose sample name is in ``wanted`` are parsed (all when None); they are
    picked with one regex scan, so a page of thousands of bucket lines costs little.
    With ``cache`` (one per source), a series seen before reuses its parsed name and
    labels and only its value is read; new series go through prometheus_client's parser.

    Raises:
        EngineParseError: naming ``source`` and the 1-based line that does not parse.
    """
    selector = _line_selector(None if wanted is None else frozenset(wanted))
    padded = "\n" + text
    series: Series = {}
    fresh: list[re.Match[str]] = []
    for match in selector.finditer(padded):
        line = match.group(0).strip()
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
    block = "\n".join(match.group(0).strip() for match in fresh) + "\n"
    try:
        families = list(text_string_to_metric_families(block))
    except ValueError:
        for match in fresh:  # find the culprit to name it
            line = match.group(0).strip()
            try:
                list(text_string_to_metric_families(line + "\n"))
            except ValueError as error:
                number = padded.count("\n", 0, match.start() + 1)
                raise EngineParseError(
                    f"{source}: line {number} is not Prometheus text ({error}): {line[:200]!r}"
                ) from error
        raise  # pragma: no cover - the block failed but no single line did
    samples = [sample for family in families for sample in family.samples]
    if cache is not None and len(samples) == len(fresh):
        if len(cache) > 20_000:  # label churn (e.g. per-request labels): start over
            cache.clear()
        for match, sample in zip(fresh, samples, strict=True):
            cache[_split_value(match.group(0).strip())[0]] = (sample.name, sample.labels)
    for sample in samples:
        series.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    return series


def aggregate(series: Series, name: str, how: Aggregate = "sum") -> float | None:
    """Combine every series of sample ``name``; None when the page lacks it.

    Series that differ only in rank labels count once (their maximum); the rest are
    summed (``how="sum"``) or averaged (``how="mean"``, for ratios).
    """
    rows = series.get(name)
    if not rows:
        return None
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in rows:
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in RANK_LABELS))
        previous = groups.get(key)
        groups[key] = value if previous is None else max(previous, value)
    total = sum(groups.values())
    return total / len(groups) if how == "mean" else total


def _first(series: Series, names: Iterable[str], how: Aggregate = "sum") -> float | None:
    for name in names:
        value = aggregate(series, name, how)
        if value is not None:
            return value
    return None


def _buckets(series: Series, bases: Iterable[str]) -> tuple[str, Buckets] | None:
    """The first of ``bases`` whose ``_bucket`` series the page has, with its cumulative
    buckets: series that differ only in rank labels count once (their maximum), the rest
    (data-parallel engines) are summed bucket by bucket. None when none has a ``+Inf``
    bucket."""
    for base in bases:
        rows = series.get(f"{base}_bucket")
        if not rows:
            continue
        groups: dict[tuple[tuple[tuple[str, str], ...], float], float] = {}
        for labels, value in rows:
            try:
                le = float(labels.get("le", "nan").replace("Inf", "inf"))
            except ValueError:
                continue
            if math.isnan(le):
                continue
            key = tuple(
                sorted((k, v) for k, v in labels.items() if k not in RANK_LABELS and k != "le")
            )
            previous = groups.get((key, le))
            groups[(key, le)] = value if previous is None else max(previous, value)
        per_le: dict[float, float] = {}
        for (_, le), value in groups.items():
            per_le[le] = per_le.get(le, 0.0) + value
        if math.inf in per_le:
            return base, tuple(sorted(per_le.items()))
    return None


def _histogram(series: Series, bases: Iterable[str]) -> HistogramTotals | None:
    for base in bases:
        total = aggregate(series, f"{base}_sum")
        count = aggregate(series, f"{base}_count")
        if total is not None and count is not None:
            return HistogramTotals(sum_s=total, count=count)
    return None


def _method_seconds(series: Series, bases: Iterable[str], method: str) -> float | None:
    """The summed ``_sum`` of the first of ``bases`` over the series labelled
    ``method`` (None when the page has no such series)."""
    for base in bases:
        rows = [
            value
            for labels, value in series.get(f"{base}_sum", ())
            if labels.get("method") == method
        ]
        if rows:
            return float(sum(rows))
    return None


# -------------------------------------------------------------------- the engines
@dataclass(frozen=True)
class EngineSpec:
    """Which sample names carry each value, in order of preference (newest name first)."""

    kind: EngineKind
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    arrived: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    ttft: tuple[str, ...] = ()
    tpot: tuple[str, ...] = ()
    ttft_buckets: tuple[str, ...] = ()
    """Histograms whose buckets give the TTFT attainment."""
    tpot_buckets: tuple[str, ...] = ()
    """Histograms whose buckets give the TPOT attainment, per-request ones first."""
    kv_usage: tuple[str, ...] = ()
    kv_tokens: tuple[str, ...] = ()
    info: tuple[str, ...] = ()
    request_prompt_tokens: tuple[str, ...] = ()
    """Per-request prompt-length histograms (their buckets feed the energy histogram)."""
    request_generation_tokens: tuple[str, ...] = ()
    iterations: tuple[str, ...] = ()
    """Histograms observed once per engine step (their ``_count`` counts the steps)."""
    step_tokens: tuple[str, ...] = ()
    """Histograms of the tokens each engine step ran (their ``_sum`` is the tokens)."""
    forward_seconds: tuple[str, ...] = ()
    """Histograms of forward-pass seconds labelled by ``method`` (prefill, decode)."""

    def wanted(self) -> frozenset[str]:
        """Every sample name this engine's extraction reads."""
        names: set[str] = set()
        for group in (
            self.running,
            self.waiting,
            self.prompt_tokens,
            self.generation_tokens,
            self.finished,
            self.arrived,
            self.preemptions,
            self.kv_usage,
            self.kv_tokens,
            self.info,
        ):
            names.update(group)
        for base in (
            *self.ttft,
            *self.tpot,
            *self.iterations,
            *self.step_tokens,
            *self.forward_seconds,
        ):
            names.update((f"{base}_sum", f"{base}_count"))
        for base in (
            *self.ttft_buckets,
            *self.tpot_buckets,
            *self.request_prompt_tokens,
            *self.request_generation_tokens,
        ):
            names.add(f"{base}_bucket")
        names.update(DISAGGREGATION_SERIES.get(self.kind, ()))
        return frozenset(names)


PER_REQUEST_TPOT = frozenset(
    {
        "vllm:request_time_per_output_token_seconds",
        "sglang:request_time_per_output_token_seconds",
        "tgi_request_mean_time_per_token_duration",
    }
)
"""TPOT histograms observed once per request (its mean time per output token), as the
plant's TPOT SLO judges; the others observe every inter-token interval."""


VLLM = EngineSpec(
    kind="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    finished=("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count"),
    preemptions=("vllm:num_preemptions_total",),
    ttft=("vllm:time_to_first_token_seconds",),
    tpot=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ttft_buckets=("vllm:time_to_first_token_seconds",),
    tpot_buckets=(
        "vllm:request_time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    info=("vllm:cache_config_info",),
    request_prompt_tokens=("vllm:request_prompt_tokens",),
    request_generation_tokens=("vllm:request_generation_tokens",),
    iterations=("vllm:iteration_tokens_total",),
    step_tokens=("vllm:iteration_tokens_total",),
)
SGLANG = EngineSpec(
    kind="sglang",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    finished=("sglang:num_requests_total", "sglang:e2e_request_latency_seconds_count"),
    ttft=("sglang:time_to_first_token_seconds",),
    tpot=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    ttft_buckets=("sglang:time_to_first_token_seconds",),
    tpot_buckets=(
        "sglang:request_time_per_output_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:time_per_output_token_seconds",
    ),
    kv_usage=("sglang:token_usage",),
    kv_tokens=("sglang:num_used_tokens",),
    request_prompt_tokens=("sglang:prompt_tokens_histogram",),
    request_generation_tokens=("sglang:generation_tokens_histogram",),
)
TGI = EngineSpec(
    kind="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    prompt_tokens=("tgi_request_input_length_sum",),
    generation_tokens=("tgi_request_generated_tokens_sum",),
    finished=("tgi_request_success", "tgi_request_success_total"),
    arrived=("tgi_request_count", "tgi_request_count_total"),
    tpot=("tgi_request_mean_time_per_token_duration",),
    tpot_buckets=("tgi_request_mean_time_per_token_duration",),
    iterations=("tgi_batch_forward_duration",),
    forward_seconds=("tgi_batch_forward_duration",),
)
SPECS: dict[str, EngineSpec] = {"vllm": VLLM, "sglang": SGLANG, "tgi": TGI}


def _vllm_kv_capacities(series: Series) -> dict[tuple[tuple[str, str], ...], float]:
    """KV capacity in tokens per engine (non-rank labels), from ``vllm:cache_config_info``:
    ``kv_cache_size_tokens`` (recent releases), else ``num_gpu_blocks * block_size``."""
    per_engine: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, _ in series.get("vllm:cache_config_info") or ():
        try:
            if "kv_cache_size_tokens" in labels:
                tokens = float(labels["kv_cache_size_tokens"])
            else:
                tokens = float(labels["num_gpu_blocks"]) * float(labels["block_size"])
        except (KeyError, ValueError):
            continue
        if not math.isfinite(tokens) or tokens < 0:
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in RANK_LABELS))
        per_engine[key] = tokens
    return per_engine


def _weighted_kv_tokens(
    series: Series, usage_names: Iterable[str], capacities: dict[tuple[tuple[str, str], ...], float]
) -> float | None:
    """Sum over engines of each engine's usage ratio times its own capacity.

    An engine's usage series and its ``cache_config_info`` row are matched on the labels
    they share (``engine`` for data-parallel vLLM). None when any engine has no match.
    """
    for name in usage_names:
        rows = series.get(name)
        if not rows:
            continue
        usage: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in rows:
            key = tuple(sorted((k, v) for k, v in labels.items() if k not in RANK_LABELS))
            usage[key] = max(usage.get(key, value), value)
        total = 0.0
        for key, ratio in usage.items():
            mine = dict(key)
            matches = [
                tokens
                for info, tokens in capacities.items()
                if all(mine[k] == v for k, v in info if k in mine)
                and any(k in mine for k, _ in info)
            ]
            if len(matches) != 1:
                if len(usage) == 1 and len(capacities) == 1:
                    matches = list(capacities.values())
                else:
                    return None
            total += ratio * matches[0]
        return total
    return None


def check_values(series: Series, source: str) -> None:
    """Refuse a page whose values cannot be true: NaN, infinite or negative.

    Every series the daemon reads is a count, a token total, a latency sum or a ratio.

    Raises:
        EngineParseError: naming ``source``, the series and the value.
    """
    for name, rows in series.items():
        for labels, value in rows:
            if not math.isfinite(value) or value < 0:
                shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                raise EngineParseError(
                    f"{source}: impossible value {name}{{{shown}}} = {value!r} "
                    "(not a finite non-negative number); scrape discarded"
                )


def model_name(series: Series, names: Iterable[str]) -> str | None:
    """The ``model_name`` label on the first of ``names`` present (sorted and joined
    with commas when the page serves several), or None."""
    for name in names:
        rows = series.get(name)
        if rows:
            labels = sorted({str(lab["model_name"]) for lab, _ in rows if "model_name" in lab})
            return ",".join(labels) if labels else None
    return None


def extract(spec: EngineSpec, series: Series, source: str) -> EngineSample:
    """Build an :class:`EngineSample` from parsed series.

    Raises:
        EngineParseError: the page has neither the running nor the waiting gauge (wrong
            engine kind or metrics disabled).
    """
    running = _first(series, spec.running)
    waiting = _first(series, spec.waiting)
    if running is None and waiting is None:
        raise EngineParseError(
            f"{source}: no {spec.kind} queue gauges ({spec.running[0]}, {spec.waiting[0]}) "
            "on the page; wrong engine kind, or metrics not enabled"
        )
    check_values(series, source)
    usage = _first(series, spec.kv_usage, how="mean")
    if usage is not None and usage > 1.0 + 1e-6:
        raise EngineParseError(
            f"{source}: impossible KV cache usage {usage!r} (a ratio above 1); scrape discarded"
        )
    capacities = _vllm_kv_capacities(series) if spec.kind == "vllm" else {}
    capacity = sum(capacities.values()) if capacities else None
    kv_tokens = _first(series, spec.kv_tokens)
    if capacity is None and kv_tokens is not None and usage:
        capacity = kv_tokens / usage
    if kv_tokens is None and usage is not None and capacity is not None:
        # Data-parallel engines may have different caches: weight each one's usage by
        # its own capacity; the mean usage times the summed capacity only as a fallback.
        weighted = _weighted_kv_tokens(series, spec.kv_usage, capacities)
        kv_tokens = usage * capacity if weighted is None else weighted
        if weighted is not None and capacity > 0:
            usage = weighted / capacity
    tpot_buckets = _buckets(series, spec.tpot_buckets)
    ttft_buckets = _buckets(series, spec.ttft_buckets)
    prompt_lengths = _buckets(series, spec.request_prompt_tokens)
    output_lengths = _buckets(series, spec.request_generation_tokens)
    steps = _histogram(series, spec.iterations)
    sample = EngineSample(
        engine=spec.kind,
        running_requests=round(running or 0.0),
        waiting_requests=round(waiting or 0.0),
        prompt_tokens_total=_first(series, spec.prompt_tokens),
        generation_tokens_total=_first(series, spec.generation_tokens),
        finished_requests_total=_first(series, spec.finished),
        arrived_requests_total=_first(series, spec.arrived),
        preemptions_total=_first(series, spec.preemptions),
        ttft=_histogram(series, spec.ttft),
        tpot=_histogram(series, spec.tpot),
        ttft_buckets=None if ttft_buckets is None else ttft_buckets[1],
        tpot_buckets=None if tpot_buckets is None else tpot_buckets[1],
        tpot_buckets_per_request=tpot_buckets is not None and tpot_buckets[0] in PER_REQUEST_TPOT,
        kv_usage_ratio=usage,
        kv_capacity_tokens=capacity,
        kv_tokens=kv_tokens,
        model_name=model_name(series, (*spec.running, *spec.waiting)),
        request_prompt_tokens_buckets=None if prompt_lengths is None else prompt_lengths[1],
        request_generation_tokens_buckets=None if output_lengths is None else output_lengths[1],
        iterations_total=None if steps is None else steps.count,
        iteration_tokens_total=_first(series, [f"{base}_sum" for base in spec.step_tokens]),
        prefill_forward_s_total=_method_seconds(series, spec.forward_seconds, "prefill"),
        decode_forward_s_total=_method_seconds(series, spec.forward_seconds, "decode"),
    )
    return with_disaggregation(spec, series, sample)


def detect_engine(series_names: Iterable[str]) -> EngineKind | None:
    """The engine whose metric prefix appears on the page (vLLM, SGLang, TGI), or None."""
    names = list(series_names)
    for prefix, kind in (("vllm:", "vllm"), ("sglang:", "sglang"), ("tgi_", "tgi")):
        if any(name.startswith(prefix) for name in names):
            return kind  # type: ignore[return-value]
    return None


# ---------------------------------------------------------- disaggregated serving
VLLM_NIXL_TRANSFER = "vllm:nixl_xfer_time_seconds"
VLLM_NIXL_BYTES = "vllm:nixl_bytes_transferred"
VLLM_NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"
VLLM_PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
VLLM_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
SGLANG_TRANSFER_QUEUES = (
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
)
SGLANG_BOOTSTRAP_QUEUES = (
    "sglang:num_prefill_prealloc_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
)
SGLANG_TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"
SGLANG_TRANSFER_LATENCY_MS = "sglang:kv_transfer_latency_ms"

DISAGGREGATION_SERIES: dict[str, tuple[str, ...]] = {
    "vllm": (
        f"{VLLM_NIXL_TRANSFER}_count",
        f"{VLLM_NIXL_TRANSFER}_sum",
        f"{VLLM_NIXL_BYTES}_sum",
        VLLM_NIXL_FAILED,
        VLLM_PROMPT_BY_SOURCE,
        VLLM_WAITING_BY_REASON,
    ),
    "sglang": (
        *SGLANG_TRANSFER_QUEUES,
        *SGLANG_BOOTSTRAP_QUEUES,
        SGLANG_TRANSFER_FAILED,
        SGLANG_TRANSFER_LATENCY_MS,
        f"{SGLANG_TRANSFER_LATENCY_MS}_count",
        f"{SGLANG_TRANSFER_LATENCY_MS}_sum",
    ),
}
"""The disaggregated-serving sample names each engine's extraction also reads (vLLM's
NIXL connector metrics and prompt sources, SGLang's PD queues and transfer series);
a page without them parses as before."""

DYNAMO_MARK = "dynamo_component"
DYNAMO_SERIES = frozenset({"dynamo_component_requests_total", "dynamo_component_inflight_requests"})
"""A Dynamo worker's own series: its ``dynamo_component`` label names the worker's role."""

ROLE_LABELS: dict[str, dict[str, str]] = {
    "engine_type": {"prefill": "prefill", "decode": "decode", "unified": "colocated"},
    "dynamo_component": {"prefill": "prefill", "decode": "decode", "decoder": "decode"},
}
"""Labels whose value states the pool role, and the role each value means: SGLang's
``engine_type`` (``unified`` is a colocated engine), Dynamo's worker component. Dynamo
names both an aggregated worker and a disaggregated decode worker ``backend``, so that
value (and any other) says nothing."""


def page_role(series: Series) -> str | None:
    """The pool role the page's labels state (:data:`ROLE_LABELS`), or None when they
    state none or disagree with each other (a page that mixes roles)."""
    roles: set[str] = set()
    for rows in series.values():
        for labels, _ in rows:
            for label, meaning in ROLE_LABELS.items():
                value = labels.get(label)
                if value is not None and value in meaning:
                    roles.add(meaning[value])
    return roles.pop() if len(roles) == 1 else None


def _labelled(series: Series, name: str, label: str, value: str) -> float | None:
    """:func:`aggregate` over the rows of ``name`` whose ``label`` is ``value``."""
    rows = [(labels, v) for labels, v in series.get(name) or () if labels.get(label) == value]
    return aggregate({name: rows}, name) if rows else None


def _count(value: float | None) -> int | None:
    return None if value is None else round(value)


def _summed(series: Series, names: Iterable[str]) -> float | None:
    """The sum of every present name's aggregate, or None when none is present."""
    values = [aggregate(series, name) for name in names]
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def with_disaggregation(spec: EngineSpec, series: Series, sample: EngineSample) -> EngineSample:
    """``sample`` with the role its labels state and its engine's KV transfer series
    (``docs/disaggregated.md``); series a page lacks stay None, unknown ones are ignored."""
    update: dict[str, object] = {"role": page_role(series)}
    if spec.kind == "vllm":
        update.update(
            kv_transfers_total=aggregate(series, f"{VLLM_NIXL_TRANSFER}_count"),
            kv_transfer_seconds_total=aggregate(series, f"{VLLM_NIXL_TRANSFER}_sum"),
            kv_transfer_bytes_total=aggregate(series, f"{VLLM_NIXL_BYTES}_sum"),
            kv_transfer_failures_total=aggregate(series, VLLM_NIXL_FAILED),
            waiting_deferred_requests=_count(
                _labelled(series, VLLM_WAITING_BY_REASON, "reason", "deferred")
            ),
            prompt_tokens_external_total=_labelled(
                series, VLLM_PROMPT_BY_SOURCE, "source", "external_kv_transfer"
            ),
        )
    elif spec.kind == "sglang":
        latency_ms = aggregate(series, f"{SGLANG_TRANSFER_LATENCY_MS}_sum")
        gauge_ms = aggregate(series, SGLANG_TRANSFER_LATENCY_MS, "mean")
        update.update(
            kv_transfers_total=aggregate(series, f"{SGLANG_TRANSFER_LATENCY_MS}_count"),
            kv_transfer_seconds_total=None if latency_ms is None else latency_ms / 1000.0,
            kv_transfer_latency_s=None if gauge_ms is None else gauge_ms / 1000.0,
            kv_transfer_failures_total=aggregate(series, SGLANG_TRANSFER_FAILED),
            kv_transfer_queue_requests=_count(_summed(series, SGLANG_TRANSFER_QUEUES)),
            kv_bootstrap_queue_requests=_count(_summed(series, SGLANG_BOOTSTRAP_QUEUES)),
        )
    return dataclasses.replace(sample, **update)  # type: ignore[arg-type]


class ScrapedSource:
    """An engine's ``/metrics`` page over HTTP.

    Args:
        url: the metrics URL, e.g. ``http://127.0.0.1:8000/metrics``.
        kind: ``"vllm"``, ``"sglang"``, ``"tgi"`` or ``"auto"`` (detected on the first
            successful scrape, then fixed).
        timeout_s: one deadline for the whole scrape (connect, headers, body).
        fetch: ``(url, timeout_s) -> text``; tests may pass their own.
        max_page_bytes: a larger page is refused (a bad scrape).
    """

    def __init__(
        self,
        url: str,
        kind: EngineKind | Literal["auto"] = "auto",
        *,
        timeout_s: float = 0.5,
        fetch: Fetcher | None = None,
        max_page_bytes: int = MAX_PAGE_BYTES,
    ) -> None:
        if kind != "auto" and kind not in SPECS:
            raise ValueError(f"unknown engine kind {kind!r}; expected auto, {', '.join(SPECS)}")
        self.url = url
        self.timeout_s = timeout_s
        self._fetch = fetch or KeepAliveFetcher(max_bytes=max_page_bytes)
        self.spec: EngineSpec | None = None if kind == "auto" else SPECS[kind]
        self._wanted = None if self.spec is None else self.spec.wanted()
        self._cache: SeriesCache = {}

    @property
    def kind(self) -> str:
        """The engine kind, ``"auto"`` until detected."""
        return "auto" if self.spec is None else self.spec.kind

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        """Fetch and parse the page within ``timeout_s`` (default: the source's own).

        Raises:
            EngineUnavailable: fetch failed or timed out. EngineParseError: bad text,
                impossible values or unknown engine.
        """
        budget = self.timeout_s if timeout_s is None else max(0.0, min(timeout_s, self.timeout_s))
        text = self._fetch(self.url, budget)
        if self.spec is None:
            kind = detect_engine(
                _sample_name(line) for line in text.splitlines() if line[:1] != "#"
            )
            if kind is None:
                raise EngineParseError(
                    f"{self.url}: no vllm:, sglang: or tgi_ metrics on the page; "
                    "set the engine kind explicitly"
                )
            self.spec = SPECS[kind]
            self._wanted = self.spec.wanted()
        series = parse_page(text, self._wanted, self.url, self._cache)
        if DYNAMO_MARK in text:  # a Dynamo worker: its component series name the role
            series.update(parse_page(text, DYNAMO_SERIES, self.url, self._cache))
        return extract(self.spec, series, self.url)

    def close(self) -> None:
        """Close kept-alive connections."""
        close = getattr(self._fetch, "close", None)
        if close is not None:
            close()


class VllmSource(ScrapedSource):
    """vLLM: V1 names, with the deprecated aliases older fleets still run."""

    def __init__(self, url: str, *, timeout_s: float = 0.5, fetch: Fetcher | None = None) -> None:
        super().__init__(url, "vllm", timeout_s=timeout_s, fetch=fetch)


class SglangSource(ScrapedSource):
    """SGLang (needs ``--enable-metrics``); per-rank series counted once."""

    def __init__(self, url: str, *, timeout_s: float = 0.5, fetch: Fetcher | None = None) -> None:
        super().__init__(url, "sglang", timeout_s=timeout_s, fetch=fetch)


class TgiSource(ScrapedSource):
    """Hugging Face text-generation-inference (no TTFT histogram: TTFT stays None)."""

    def __init__(self, url: str, *, timeout_s: float = 0.5, fetch: Fetcher | None = None) -> None:
        super().__init__(url, "tgi", timeout_s=timeout_s, fetch=fetch)
