"""What an engine's page says about disaggregated serving: the pool role its labels state
(SGLang's ``engine_type``, a Dynamo worker's ``dynamo_component``) and its KV transfer
series (vLLM's NIXL connector, SGLang's PD queues). :func:`daemon.engines.extract` reads
them into the sample (``docs/disaggregated.md``). No I/O.
"""

from __future__ import annotations

from gpugov.daemon.exposition import Series, aggregate, aggregate_where, summed

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

QUEUE_GAUGES: dict[str, tuple[str, ...]] = {
    "vllm": (VLLM_WAITING_BY_REASON,),
    "sglang": (*SGLANG_TRANSFER_QUEUES, *SGLANG_BOOTSTRAP_QUEUES),
}
"""Each engine's gauges of requests besides its running and waiting ones
(:func:`daemon.engines.check_request_gauges`)."""

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
    state none or disagree with each other (a page that mixes prefill and decode).

    ``colocated`` (SGLang's ``unified``) beside one pool role is that pool: SGLang
    releases write ``unified`` in every mode, so behind a Dynamo prefill worker it says
    nothing against the worker's ``prefill``."""
    roles: set[str] = set()
    for rows in series.values():
        for labels, _ in rows:
            for label, meaning in ROLE_LABELS.items():
                value = labels.get(label)
                if value is not None and value in meaning:
                    roles.add(meaning[value])
    if len(roles) == 2 and "colocated" in roles:
        roles.discard("colocated")
    return roles.pop() if len(roles) == 1 else None


def _count(value: float | None) -> int | None:
    return None if value is None else round(value)


def disaggregation_fields(kind: str, series: Series) -> dict[str, object]:
    """The :class:`~daemon.engines.EngineSample` fields of the role the page's labels
    state and the ``kind`` engine's KV transfer series (``docs/disaggregated.md``); series
    a page lacks stay None, unknown ones are ignored."""
    update: dict[str, object] = {"role": page_role(series)}
    if kind == "vllm":
        update.update(
            kv_transfers_total=aggregate(series, f"{VLLM_NIXL_TRANSFER}_count"),
            kv_transfer_seconds_total=aggregate(series, f"{VLLM_NIXL_TRANSFER}_sum"),
            kv_transfer_bytes_total=aggregate(series, f"{VLLM_NIXL_BYTES}_sum"),
            kv_transfer_failures_total=aggregate(series, VLLM_NIXL_FAILED),
            waiting_deferred_requests=_count(
                aggregate_where(series, VLLM_WAITING_BY_REASON, "reason", "deferred")
            ),
            prompt_tokens_external_total=aggregate_where(
                series, VLLM_PROMPT_BY_SOURCE, "source", "external_kv_transfer"
            ),
        )
    elif kind == "sglang":
        latency_ms = aggregate(series, f"{SGLANG_TRANSFER_LATENCY_MS}_sum")
        gauge_ms = aggregate(series, SGLANG_TRANSFER_LATENCY_MS, "mean")
        update.update(
            kv_transfers_total=aggregate(series, f"{SGLANG_TRANSFER_LATENCY_MS}_count"),
            kv_transfer_seconds_total=None if latency_ms is None else latency_ms / 1000.0,
            kv_transfer_latency_s=None if gauge_ms is None else gauge_ms / 1000.0,
            kv_transfer_failures_total=aggregate(series, SGLANG_TRANSFER_FAILED),
            kv_transfer_queue_requests=_count(summed(series, SGLANG_TRANSFER_QUEUES)),
            kv_bootstrap_queue_requests=_count(summed(series, SGLANG_BOOTSTRAP_QUEUES)),
        )
    return update
