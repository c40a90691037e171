"""What each serving engine's Prometheus ``/metrics`` page means: the :class:`EngineSample`
and :class:`EngineSource` protocol the observer reads, each engine's sample names
(:class:`EngineSpec`: ``VLLM``, ``SGLANG``, ``TGI``), their extraction from the series
:mod:`daemon.exposition` parsed (:func:`extract`), the engine's detection from its metric
names and the pool role its labels state (:mod:`daemon.engine_pools`). No I/O: the sources
that fetch a page and read it with these are :mod:`daemon.engine_sources`. The derivations
from these cumulative values to a ``ServingObservation`` live in :mod:`daemon.observer` and
``docs/daemon.md``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from gpugov.daemon.attainment import Buckets
from gpugov.daemon.engine_pools import DISAGGREGATION_SERIES, QUEUE_GAUGES, disaggregation_fields
from gpugov.daemon.errors import EngineParseError
from gpugov.daemon.exposition import (
    Aggregate,
    EngineKey,
    Series,
    aggregate,
    aggregate_where,
    engine_key,
    escape_label_value,
    summed,
)

EngineKind = Literal["vllm", "sglang", "tgi"]


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
    engines: int = 1
    """Data-parallel engines the page shows (:func:`shown_engines`): the sample's
    counts and tokens are their sums. 1 for one engine, however many tensor- or
    pipeline-parallel ranks it has, and where the page cannot tell."""
    engine_labels: frozenset[EngineKey] | None = None
    """Which engines those are: the label sets, rank labels left out, of the page's
    running and waiting gauges (:func:`shown_engines`); None where no page was read."""
    prompt_tokens_total: float | None = None
    prompt_requests_total: float | None = None
    """The requests whose prompts ``prompt_tokens_total`` holds, which its mean prompt is
    over: the first tokens where the engine counts a prompt once prefilled (vLLM,
    SGLang's older collector), the finished requests where it counts one as its request
    finishes (SGLang since its collector rewrite), the validated requests where it counts
    one as it arrives (TGI's ``tgi_request_input_length_count``); None where not known."""
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
    tpot_buckets_sum_s: float | None = None
    """The ``_sum`` of the histogram the TPOT buckets come from (it places a window's
    observations within the bucket that holds the SLO, :mod:`daemon.attainment`)."""
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
    """The ``model_name`` label of the engine's series (vLLM, SGLang; SGLang v0.3.5's
    ``name``); several models are joined with commas; None when the engine does not
    label its series."""
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
    finished_generation_tokens_total: float | None = None
    """Tokens generated by the finished requests: the output-length histogram's sum
    (vLLM ``vllm:request_generation_tokens_sum``, SGLang v0.3.5
    ``sglang:request_generation_tokens_sum``). With ``generation_tokens_total``, which
    counts every generated token as it is made, it gives the tokens the requests in
    flight have generated (:mod:`daemon.observer`). None where the engine publishes no
    such histogram, or where its generation counter counts a request's tokens when it
    finishes, so that it equals the histogram's sum (TGI; SGLang since its collector
    rewrite, sgl-project/sglang#1981)."""
    prompt_tokens_at_finish: bool = False
    """Whether ``prompt_tokens_total`` counts a request's prompt only when the request
    finishes (SGLang since its collector rewrite), windows after its first token: a
    window's prompt tokens are then not those of its first tokens, which are judged at
    the flat TTFT SLO (:mod:`daemon.attainment`)."""
    iterations_total: float | None = None
    """Engine steps (forward passes) so far: the count of vLLM's tokens-per-step
    histogram ``vllm:iteration_tokens_total``, or of TGI's ``tgi_batch_forward_duration``
    (both methods); None where the engine publishes neither (SGLang)."""
    prompt_tokens_computed_total: float | None = None
    """Prompt tokens the engine's prefills computed so far, counted as they ran (SGLang's
    ``sglang:realtime_tokens_total{mode="prefill_compute"}``, cached tokens left out),
    where its prompt counter counts a prompt only as its request finishes; None where the
    engine publishes no such counter."""
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
    created: tuple[tuple[str, float], ...] | None = None
    """When each counter and histogram series of the page was created (its ``_created``
    series, by series), which tells one engine instance from another: a restarted engine
    creates its series again. None where the page has none (prometheus_client's
    multiprocess mode, SGLang, TGI)."""


@runtime_checkable
class EngineSource(Protocol):
    """One serving engine's state, fetched now.

    Raises :class:`~daemon.errors.EngineUnavailable` (or its ``EngineParseError``) when the
    engine cannot be read; the daemon counts it and falls back when it lasts.
    ``timeout_s`` shortens the source's own deadline for this one scrape (the observer
    passes what is left before its data would go stale).
    """

    def scrape(self, timeout_s: float | None = None) -> EngineSample: ...


def _first(series: Series, names: Iterable[str], how: Aggregate = "sum") -> float | None:
    for name in names:
        value = aggregate(series, name, how)
        if value is not None:
            return value
    return None


def _buckets(
    series: Series, bases: Iterable[str], source: str = "engine"
) -> tuple[str, Buckets] | None:
    """The first of ``bases`` whose ``_bucket`` series the page has, with its cumulative
    buckets: series that differ only in rank labels count once (their maximum), the rest
    (data-parallel engines) are summed bucket by bucket, on the bounds every series has
    (a bound one series lacks held only the others' counts, and the sum fell as ``le``
    rose). None when none has a ``+Inf`` bucket in every series: summed, a series
    without one added its finite buckets and not its total, so more requests read as
    met than the total held.

    Raises:
        EngineParseError: a series' cumulative count falls as ``le`` rises.
    """
    for base in bases:
        rows = series.get(f"{base}_bucket")
        if not rows:
            continue
        groups: dict[tuple[EngineKey, float], float] = {}
        for labels, value in rows:
            try:
                le = float(labels.get("le", "nan").replace("Inf", "inf"))
            except ValueError:
                continue
            if math.isnan(le):
                continue
            key = engine_key(labels, leave_out="le")
            previous = groups.get((key, le))
            groups[(key, le)] = value if previous is None else max(previous, value)
        _check_cumulative(groups, f"{base}_bucket", source)
        totalled = {key for key, le in groups if le == math.inf}
        if not totalled or totalled != {key for key, _ in groups}:
            continue  # no series, or one without its total
        bounds: dict[EngineKey, set[float]] = {}
        for key, le in groups:
            bounds.setdefault(key, set()).add(le)
        shared = set.intersection(*bounds.values())  # +Inf at least
        per_le: dict[float, float] = {}
        for (_, le), value in groups.items():
            if le in shared:
                per_le[le] = per_le.get(le, 0.0) + value
        return base, tuple(sorted(per_le.items()))
    return None


BUCKET_ROUNDING = 1e-9
"""How far, relative to the larger count, a cumulative bucket may fall below the one
before it (rounding in an engine's float counters) before the page is refused."""


def _check_cumulative(groups: dict[tuple[EngineKey, float], float], name: str, source: str) -> None:
    """Refuse buckets of one series that fall as ``le`` rises (a cumulative count never
    does): trusted, they counted phantom requests as met.

    Raises:
        EngineParseError: naming ``source``, the series and the two buckets.
    """
    last: dict[EngineKey, tuple[float, float]] = {}
    for (key, le), value in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1])):
        before = last.get(key)
        if before is not None and value < before[1] - BUCKET_ROUNDING * max(before[1], 1.0):
            raise EngineParseError(
                f"{source}: {name} falls as le rises (le={before[0]:g}: {before[1]:g}, "
                f"le={le:g}: {value:g}; cumulative buckets never do); scrape discarded"
            )
        last[key] = (le, value)


def _histogram(series: Series, bases: Iterable[str]) -> HistogramTotals | None:
    for base in bases:
        total = aggregate(series, f"{base}_sum")
        count = aggregate(series, f"{base}_count")
        if total is not None and count is not None:
            return HistogramTotals(sum_s=total, count=count)
    return None


def _method_seconds(series: Series, bases: Iterable[str], method: str) -> float | None:
    """The ``_sum`` of the first of ``bases`` over the series labelled ``method``, combined
    as every series is (:func:`~daemon.exposition.aggregate`: a rank's copy counts once,
    where the rows were added); None when the page has no such series."""
    for base in bases:
        seconds = aggregate_where(series, f"{base}_sum", "method", method)
        if seconds is not None:
            return seconds
    return None


def _prefill_computed(series: Series, names: Iterable[str]) -> float | None:
    """The ``mode="prefill_compute"`` series of the first of ``names`` the page has (the
    prompt tokens computed as they ran), combined as every series is; None where none."""
    for name in names:
        tokens = aggregate_where(series, name, "mode", "prefill_compute")
        if tokens is not None:
            return tokens
    return None


# -------------------------------------------------------------------- the engines
@dataclass(frozen=True)
class EngineSpec:
    """Which sample names carry each value, in order of preference (newest name first)."""

    kind: EngineKind
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    waiting_also: tuple[str, ...] = ()
    """Gauges of requests in neither the running nor the waiting gauge that wait to run
    again (vLLM V0's requests swapped to CPU memory): added to the waiting count."""
    prompt_tokens: tuple[str, ...] = ()
    prompt_requests: tuple[str, ...] = ()
    """Counters of the requests whose prompts the prompt counter holds, where it counts a
    prompt neither at its first token nor at its request's end (TGI: as it validates it);
    elsewhere those are the TTFT count, or the finished requests
    (:attr:`prompt_tokens_at_finish`)."""
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
    kv_capacity: tuple[str, ...] = ()
    """Gauges of the KV cache's capacity in tokens (SGLang's ``max_total_num_tokens``):
    exact, where the capacity derived from a usage ratio the engine rounds is not."""
    info: tuple[str, ...] = ()
    model_labels: tuple[str, ...] = ("model_name",)
    """Labels that name the served model, in order of preference (newest name first)."""
    request_prompt_tokens: tuple[str, ...] = ()
    """Per-request prompt-length histograms (their buckets feed the energy histogram)."""
    request_generation_tokens: tuple[str, ...] = ()
    finished_generation: tuple[str, ...] = ()
    """Output-length histograms whose ``_sum`` is the finished requests' share of a
    generation counter that counts tokens as they are made (vLLM, SGLang v0.3.5). Not
    where the counter itself counts a request's tokens when it finishes (SGLang since its
    collector rewrite, TGI): there the two are equal and say nothing of the requests in
    flight."""
    iterations: tuple[str, ...] = ()
    """Histograms observed once per engine step (their ``_count`` counts the steps)."""
    step_tokens: tuple[str, ...] = ()
    """Histograms of the tokens each engine step ran (their ``_sum`` is the tokens)."""
    prompt_tokens_computed: tuple[str, ...] = ()
    """Counters of tokens by ``mode`` whose ``prefill_compute`` series counts the prompt
    tokens the prefills computed as they ran (SGLang's ``realtime_tokens_total``)."""
    forward_seconds: tuple[str, ...] = ()
    """Histograms of forward-pass seconds labelled by ``method`` (prefill, decode)."""
    prompt_tokens_at_finish: bool = False
    """The prompt counter counts a request's prompt when it finishes, where the page has
    none of the ``finished_generation`` histograms (SGLang since its collector rewrite;
    its older collector, which has them, counted tokens as they ran)."""

    def wanted(self) -> frozenset[str]:
        """Every sample name this engine's extraction reads."""
        names: set[str] = set()
        for group in (
            self.running,
            self.waiting,
            self.waiting_also,
            self.prompt_tokens,
            self.prompt_requests,
            self.prompt_tokens_computed,
            self.generation_tokens,
            self.finished,
            self.arrived,
            self.preemptions,
            self.kv_usage,
            self.kv_tokens,
            self.kv_capacity,
            self.info,
        ):
            names.update(group)
        for base in (
            *self.ttft,
            *self.tpot,
            *self.iterations,
            *self.step_tokens,
            *self.forward_seconds,
            *self.request_generation_tokens,
            *self.finished_generation,
        ):
            names.update((f"{base}_sum", f"{base}_count"))
        names.update(f"{base}_sum" for base in self.tpot_buckets)
        for base in (
            *self.ttft_buckets,
            *self.tpot_buckets,
            *self.request_prompt_tokens,
            *self.request_generation_tokens,
        ):
            names.add(f"{base}_bucket")
        names.update(DISAGGREGATION_SERIES.get(self.kind, ()))
        names.update(self.created())
        return frozenset(names)

    def created(self) -> tuple[str, ...]:
        """The ``_created`` sample names of this engine's counters (``vllm:prompt_tokens_total``:
        ``vllm:prompt_tokens_created``) and histograms, which prometheus_client writes
        beside them: their values change when the engine restarts."""
        counters = (
            *self.prompt_tokens,
            *self.prompt_tokens_computed,
            *self.generation_tokens,
            *self.finished,
            *self.arrived,
            *self.preemptions,
        )
        histograms = (
            *self.ttft,
            *self.tpot,
            *self.ttft_buckets,
            *self.tpot_buckets,
            *self.request_prompt_tokens,
            *self.request_generation_tokens,
            *self.iterations,
        )
        names = [
            f"{name.removesuffix('_total')}_created" for name in counters if name.endswith("_total")
        ]
        names.extend(f"{base}_created" for base in histograms)
        return tuple(dict.fromkeys(names))


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
    waiting_also=("vllm:num_requests_swapped",),
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
    finished_generation=("vllm:request_generation_tokens",),
    iterations=("vllm:iteration_tokens_total",),
    step_tokens=("vllm:iteration_tokens_total",),
)
SGLANG = EngineSpec(
    kind="sglang",
    running=("sglang:num_running_reqs", "sglang:num_requests_running"),
    waiting=("sglang:num_queue_reqs", "sglang:num_requests_waiting"),
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
    kv_capacity=("sglang:max_total_num_tokens",),
    model_labels=("model_name", "name"),  # "name" until the collector rewrite
    request_prompt_tokens=("sglang:prompt_tokens_histogram", "sglang:request_prompt_tokens"),
    request_generation_tokens=(
        "sglang:generation_tokens_histogram",
        "sglang:request_generation_tokens",
    ),
    finished_generation=("sglang:request_generation_tokens",),
    prompt_tokens_computed=("sglang:realtime_tokens_total",),
    prompt_tokens_at_finish=True,
)
TGI = EngineSpec(
    kind="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    prompt_tokens=("tgi_request_input_length_sum",),
    prompt_requests=("tgi_request_input_length_count",),
    generation_tokens=("tgi_request_generated_tokens_sum",),
    finished=("tgi_request_success", "tgi_request_success_total"),
    arrived=("tgi_request_count", "tgi_request_count_total"),
    tpot=("tgi_request_mean_time_per_token_duration",),
    tpot_buckets=("tgi_request_mean_time_per_token_duration",),
    iterations=("tgi_batch_forward_duration", "tgi_batch_inference_duration"),
    forward_seconds=("tgi_batch_forward_duration",),
)
SPECS: dict[str, EngineSpec] = {"vllm": VLLM, "sglang": SGLANG, "tgi": TGI}

TGI_BEFORE_FIRST_REQUEST = (
    "TGI publishes its series from its first request on: a TGI that has served no "
    "request yet has none"
)
"""What a page without TGI's queue gauges may be: TGI's router (metrics-rs) creates each
series at its first use, so a fresh TGI's page has none of them."""


MAX_KV_TOKENS = 1e12
"""KV cache tokens no engine holds: a token's cache is kilobytes (layers x KV heads x head
size x 2), so a trillion is petabytes. A KV token gauge or capacity that reads more is
no count (an unsigned value wrapped below zero reads about 1.8e19)."""


def _vllm_kv_capacities(series: Series) -> dict[EngineKey, float]:
    """KV capacity in tokens per engine (non-rank labels), from ``vllm:cache_config_info``:
    ``kv_cache_size_tokens`` (recent releases), else (absent, or ``"None"``: an optional
    field) ``num_gpu_blocks * block_size``; one above :data:`MAX_KV_TOKENS` is not known."""
    per_engine: dict[EngineKey, float] = {}
    for labels, _ in series.get("vllm:cache_config_info") or ():
        try:
            tokens = float(labels["kv_cache_size_tokens"])
        except (KeyError, ValueError):
            try:
                tokens = float(labels["num_gpu_blocks"]) * float(labels["block_size"])
            except (KeyError, ValueError):
                continue
        if not math.isfinite(tokens) or tokens <= 0 or tokens > MAX_KV_TOKENS:
            continue  # no cache (a page before the engine profiled it), or no count
        per_engine[engine_key(labels)] = tokens
    return per_engine


def _known_capacity(series: Series, spec: EngineSpec) -> float | None:
    """The KV capacity in tokens the page's capacity gauge states (:attr:`EngineSpec.kv_capacity`,
    summed over engines), or None: no such gauge, or a value of 0 (a cache not sized yet)
    or above :data:`MAX_KV_TOKENS` (no count)."""
    tokens = _first(series, spec.kv_capacity)
    if tokens is None or not 0.0 < tokens <= MAX_KV_TOKENS:
        return None
    return tokens


def _weighted_kv_tokens(
    series: Series, usage_names: Iterable[str], capacities: dict[EngineKey, float]
) -> float | None:
    """Sum over engines of each engine's usage ratio times its own capacity.

    An engine's usage series and its ``cache_config_info`` row are matched on the labels
    they share (``engine`` for data-parallel vLLM). None when any engine has no match.
    Several usage series matched to one row (a ``pid`` per process, prometheus_client's
    multiprocess mode) are that engine's usage said more than once: their mean counts,
    where each was added and the cache counted as many times over.
    The rows are looked up by the values of the labels they share, not each usage row
    against every capacity row: 2,000 of each (label churn) took 3.6 s, past any scrape
    deadline, after the page was read in time.
    """
    for name in usage_names:
        rows = series.get(name)
        if not rows:
            continue
        usage: dict[EngineKey, float] = {}
        for labels, value in rows:
            key = engine_key(labels)
            usage[key] = max(usage.get(key, value), value)
        # Per set of usage label names: the capacity rows by the names they share with
        # it, then by those labels' values.
        index: dict[
            frozenset[str], dict[tuple[str, ...], dict[tuple[str, ...], list[tuple[int, float]]]]
        ]
        index = {}
        per_cache: dict[int, list[float]] = {}  # the ratios of each matched capacity row
        tokens_of: dict[int, float] = {}
        for key, ratio in usage.items():
            mine = dict(key)
            names = frozenset(mine)
            shared = index.get(names)
            if shared is None:
                shared = index[names] = {}
                for row, (info, tokens) in enumerate(capacities.items()):
                    common = tuple(k for k, _ in info if k in names)
                    if common:
                        values = tuple(v for k, v in info if k in names)
                        shared.setdefault(common, {}).setdefault(values, []).append((row, tokens))
            matches = [
                (row, tokens)
                for common, by_values in shared.items()
                for row, tokens in by_values.get(tuple(mine[k] for k in common), ())
            ]
            if len(matches) != 1:
                if len(usage) == 1 and len(capacities) == 1:
                    matches = [(0, next(iter(capacities.values())))]
                else:
                    return None
            row, tokens = matches[0]
            per_cache.setdefault(row, []).append(ratio)
            tokens_of[row] = tokens
        return sum(tokens_of[row] * sum(r) / len(r) for row, r in per_cache.items())
    return None


def _series_text(name: str, labels: dict[str, str]) -> str:
    """One series as an error quotes it: ``name{k="v",...}``, its labels sorted and their
    values escaped as the page writes them (a newline in one split the error's log line
    in two, the second of the page's making)."""
    shown = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{shown}}}"


def _escaped(value: str) -> str:
    """A label value as exposition text writes it: backslash, double quote and newline
    escaped; any other control character as its code, so a quoted series is one line."""
    value = escape_label_value(value)
    if value.isprintable():  # the common case, every scrape's _created series
        return value
    return "".join(
        character if character.isprintable() or character == " " else f"\\x{ord(character):02x}"
        for character in value
    )


def check_values(series: Series, source: str) -> None:
    """Refuse a page whose values cannot be true: NaN, infinite or negative.

    Every series the daemon reads is a count, a token total, a latency sum or a ratio.

    Raises:
        EngineParseError: naming ``source``, the series and the value.
    """
    for name, rows in series.items():
        for labels, value in rows:
            if not math.isfinite(value) or value < 0:
                raise EngineParseError(
                    f"{source}: impossible value {_series_text(name, labels)} = {value!r} "
                    "(not a finite non-negative number); scrape discarded"
                )


MAX_REQUESTS_IN_ENGINE = 1e8
"""Requests no engine holds at once: each is kept in its memory (its prompt at least), so
a hundred million is hundreds of GB. A queue gauge that reads more is no count: an
unsigned gauge wrapped below zero (about 4.3e9 or 1.8e19) or a proxy's arithmetic gone
wild, which read as a queue made the prompt backlog infinite."""


def check_request_gauges(series: Series, names: Iterable[str], source: str) -> None:
    """Refuse a page whose gauge of requests (running, waiting, queued) reads above
    :data:`MAX_REQUESTS_IN_ENGINE`.

    Raises:
        EngineParseError: naming ``source``, the series and the value.
    """
    for name in names:
        for labels, value in series.get(name) or ():
            if value > MAX_REQUESTS_IN_ENGINE:
                raise EngineParseError(
                    f"{source}: impossible value {_series_text(name, labels)} = {value!r} (more "
                    f"requests than any engine holds, {MAX_REQUESTS_IN_ENGINE:.0e}); "
                    "scrape discarded"
                )


EngineLabels = frozenset[EngineKey]
"""The label sets (rank labels left out) of the engines a page shows."""


def shown_engines(series: Series, spec: EngineSpec) -> tuple[int, EngineLabels]:
    """The data-parallel engines a page shows, and which ones: the count is the number of
    distinct label sets, rank labels
    (:data:`~daemon.exposition.RANK_LABELS`) left out, of its running gauge and of its
    waiting gauge (the first name of each the page has), the larger of the two, at
    least 1. vLLM V1 labels each engine of a data-parallel deployment ``engine="0"``,
    ``"1"``, ...; SGLang adds ``dp_rank`` to each data-parallel scheduler's labels; the
    TP and PP ranks of one engine (SGLang's ``tp_rank``, ``pp_rank``) count once, as
    :func:`~daemon.exposition.aggregate` counts them. A page without such labels (TGI,
    an older SGLang) is one engine; one that serves several models counts each model's
    engines (their series are summed too). Which engines: the label sets of both gauges
    together; two pages of as many engines may show other ones (one left, another
    joined), whose sums are other engines'."""
    sets: list[EngineLabels] = []
    for names in (spec.running, spec.waiting):
        for name in names:
            rows = series.get(name)
            if rows:
                sets.append(frozenset(engine_key(labels) for labels, _ in rows))
                break
    return max([1, *(len(keys) for keys in sets)]), frozenset().union(*sets)


def model_name(
    series: Series, names: Iterable[str], labels: Iterable[str] = ("model_name",)
) -> str | None:
    """The served model's name on the first of ``names`` present: the first of ``labels``
    its series carry (SGLang v0.3.5 named it ``name``), sorted and joined with commas when
    the page serves several; None where none carries one."""
    for name in names:
        rows = series.get(name)
        if rows:
            models = set()
            for row, _ in rows:
                label = next((label for label in labels if label in row), None)
                if label is not None:
                    models.add(str(row[label]))
            return ",".join(sorted(models)) if models else None
    return None


def extract(spec: EngineSpec, series: Series, source: str) -> EngineSample:
    """Build an :class:`EngineSample` from parsed series.

    Raises:
        EngineParseError: the page has neither the running nor the waiting gauge (wrong
            engine kind or metrics disabled), or only one of them: the other is not
            known, and read as 0 it made a backlog (or a batch) look idle.
    """
    running = _first(series, spec.running)
    waiting = _first(series, spec.waiting)
    if running is None and waiting is None:
        raise EngineParseError(
            f"{source}: no {spec.kind} queue gauges ({spec.running[0]}, {spec.waiting[0]}) "
            "on the page; wrong engine kind, or metrics not enabled"
            + (f" ({TGI_BEFORE_FIRST_REQUEST})" if spec.kind == "tgi" else "")
        )
    if running is None or waiting is None:
        what, names, other = (
            ("running", spec.running, "waiting")
            if running is None
            else ("waiting", spec.waiting, "running")
        )
        raise EngineParseError(
            f"{source}: the {spec.kind} page has its {other} requests gauge but no {what} "
            f"requests gauge ({' or '.join(names)}): the {what} requests are not known "
            "(never read as 0); scrape discarded"
        )
    check_values(series, source)
    requests = (*spec.running, *spec.waiting, *spec.waiting_also, *QUEUE_GAUGES.get(spec.kind, ()))
    check_request_gauges(series, requests, source)
    waiting += summed(series, spec.waiting_also) or 0.0
    usage = _first(series, spec.kv_usage, how="mean")
    if usage is not None and usage > 1.0 + 1e-6:
        raise EngineParseError(
            f"{source}: impossible KV cache usage {usage!r} (a ratio above 1); scrape discarded"
        )
    capacities = _vllm_kv_capacities(series) if spec.kind == "vllm" else {}
    capacity = sum(capacities.values()) if capacities else _known_capacity(series, spec)
    kv_tokens = _first(series, spec.kv_tokens)
    if kv_tokens is not None and kv_tokens > MAX_KV_TOKENS:
        raise EngineParseError(
            f"{source}: impossible KV cache tokens {kv_tokens!r} ({' or '.join(spec.kv_tokens)}; "
            f"more than any engine holds, {MAX_KV_TOKENS:.0e}); scrape discarded"
        )
    if capacity is None and kv_tokens and usage:
        # SGLang's without its capacity gauge: used tokens over their share, which SGLang
        # rounds to two decimals. A share rounded near 0 beside a count made one of
        # petabytes; above MAX_KV_TOKENS it is not known, as a vLLM page's.
        derived = kv_tokens / usage
        capacity = derived if derived <= MAX_KV_TOKENS else None
    if kv_tokens is None and usage is not None and capacity is not None:
        # Data-parallel engines may have different caches: weight each one's usage by
        # its own capacity; the mean usage times the summed capacity only as a fallback.
        weighted = _weighted_kv_tokens(series, spec.kv_usage, capacities)
        kv_tokens = usage * capacity if weighted is None else weighted
        if weighted is not None and capacity > 0:
            usage = weighted / capacity
    tpot_buckets = _buckets(series, spec.tpot_buckets, source)
    ttft_buckets = _buckets(series, spec.ttft_buckets, source)
    prompt_lengths = _buckets(series, spec.request_prompt_tokens, source)
    output_lengths = _buckets(series, spec.request_generation_tokens, source)
    finished_generation = _histogram(series, spec.finished_generation)
    prompts_at_finish = spec.prompt_tokens_at_finish and finished_generation is None
    steps = _histogram(series, spec.iterations)
    engines, labels = shown_engines(series, spec)
    ttft = _histogram(series, spec.ttft)
    finished = _first(series, spec.finished)
    prompt_requests = _first(series, spec.prompt_requests)
    if prompts_at_finish:
        prompt_requests = finished
    elif prompt_requests is None and ttft is not None:
        prompt_requests = ttft.count
    sample = EngineSample(
        engine=spec.kind,
        running_requests=round(running),
        waiting_requests=round(waiting),
        engines=engines,
        engine_labels=labels,
        prompt_tokens_total=_first(series, spec.prompt_tokens),
        prompt_requests_total=prompt_requests,
        generation_tokens_total=_first(series, spec.generation_tokens),
        finished_requests_total=finished,
        arrived_requests_total=_first(series, spec.arrived),
        preemptions_total=_first(series, spec.preemptions),
        ttft=ttft,
        tpot=_histogram(series, spec.tpot),
        ttft_buckets=None if ttft_buckets is None else ttft_buckets[1],
        tpot_buckets=None if tpot_buckets is None else tpot_buckets[1],
        tpot_buckets_per_request=tpot_buckets is not None and tpot_buckets[0] in PER_REQUEST_TPOT,
        tpot_buckets_sum_s=(
            None if tpot_buckets is None else aggregate(series, f"{tpot_buckets[0]}_sum")
        ),
        kv_usage_ratio=usage,
        kv_capacity_tokens=capacity,
        kv_tokens=kv_tokens,
        model_name=model_name(series, (*spec.running, *spec.waiting), spec.model_labels),
        request_prompt_tokens_buckets=None if prompt_lengths is None else prompt_lengths[1],
        request_generation_tokens_buckets=None if output_lengths is None else output_lengths[1],
        finished_generation_tokens_total=(
            None if finished_generation is None else finished_generation.sum_s
        ),
        prompt_tokens_at_finish=prompts_at_finish,
        iterations_total=None if steps is None else steps.count,
        iteration_tokens_total=_first(series, [f"{base}_sum" for base in spec.step_tokens]),
        prompt_tokens_computed_total=_prefill_computed(series, spec.prompt_tokens_computed),
        prefill_forward_s_total=_method_seconds(series, spec.forward_seconds, "prefill"),
        decode_forward_s_total=_method_seconds(series, spec.forward_seconds, "decode"),
        created=created_times(series, spec.created()),
    )
    return dataclasses.replace(sample, **disaggregation_fields(spec.kind, series))  # type: ignore[arg-type]


def created_times(series: Series, names: Iterable[str]) -> tuple[tuple[str, float], ...] | None:
    """The creation time of each series of ``names`` the page has, by series (sorted), or
    None when it has none."""
    found = sorted(
        (_series_text(name, labels), value)
        for name in names
        for labels, value in series.get(name) or ()
    )
    return tuple(found) or None


GOVERNED_SERIES: tuple[tuple[str, str, bool], ...] = (
    ("running requests", "running", False),
    ("waiting requests", "waiting", False),
    ("prompt tokens", "prompt_tokens", False),
    ("generated tokens", "generation_tokens", False),
    ("finished requests", "finished", False),
    ("TTFT histogram", "ttft", True),
    ("TPOT histogram", "tpot", True),
)
"""What the governor reads from every engine page: a description, the spec field that
names its series, and whether those are histograms (``_sum`` and ``_count``)."""


def missing_series(spec: EngineSpec, series: Series) -> tuple[str, ...]:
    """The values of :data:`GOVERNED_SERIES` the page lacks, each with the names looked for
    (a value the engine publishes under no name, TGI's TTFT, is not listed)."""
    missing: list[str] = []
    for what, field, histogram in GOVERNED_SERIES:
        names: tuple[str, ...] = getattr(spec, field)
        if not names:
            continue
        found = _histogram(series, names) if histogram else _first(series, names)
        if found is None:
            missing.append(f"{what} ({' or '.join(names)})")
    return tuple(missing)


ENGINE_PREFIXES: tuple[tuple[str, EngineKind], ...] = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("tgi_", "tgi"),
)
"""Each engine's metric prefix, in the order a page is tried for them."""


def detect_engine(series_names: Iterable[str]) -> EngineKind | None:
    """The engine whose metric prefix appears on the page (vLLM, SGLang, TGI), or None."""
    names = list(series_names)
    for prefix, kind in ENGINE_PREFIXES:
        if any(name.startswith(prefix) for name in names):
            return kind
    return None


def detect_engine_on_page(text: str) -> EngineKind | None:
    """:func:`detect_engine` of a page's sample lines, each prefix one regex search of
    the text (a page of millions of lines is not split into a list of them); a line's
    leading blanks are no part of it, as the exposition format has it."""
    for prefix, kind in ENGINE_PREFIXES:
        if re.search(rf"(?m)^[ \t]*{re.escape(prefix)}", text):
            return kind
    return None
