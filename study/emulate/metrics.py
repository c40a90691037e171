"""The emulated engine's ``/metrics`` page, in vLLM V1's exposition format.

Names, labels (``model_name``, ``engine``; ``finished_reason`` on successes) and histogram
buckets are vLLM V1's (``vllm/v1/metrics/loggers.py``), so anything that scrapes a real
vLLM (gpugov's ``VllmSource``, Prometheus rules, dashboards) reads this page unchanged.
The families are written as vLLM's prometheus_client writes them: a counter's ``# HELP``
and ``# TYPE`` under its sample name (``vllm:prompt_tokens_total``), and after each
counter and histogram its ``_created`` gauge (``vllm:prompt_tokens_created``,
``vllm:iteration_tokens_total_created``), one sample per series.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpugov.daemon.exposition import escape_label_value
from gpugov.plant.engine_counters import ITERATION_TOKEN_BUCKETS
from gpugov.study.emulate.node import EmulatedNode, Histogram

BLOCK_SIZE = 16


def _labels(model: str, engine: int, **extra: str) -> str:
    """A series' labels as the page writes them, values escaped (a served model name may
    hold a quote or a backslash)."""
    pairs = {"engine": str(engine), **extra, "model_name": model}
    return ",".join(f'{key}="{escape_label_value(value)}"' for key, value in pairs.items())


def _number(value: float) -> str:
    return repr(float(value))


def family(lines: list[str], name: str, kind: str, help_text: str) -> None:
    """A family's ``# HELP`` and ``# TYPE`` lines as prometheus_client writes them: a
    counter's under its sample name, ``name_total``, so a strict parser types its samples."""
    typed = f"{name}_total" if kind == "counter" else name
    lines.append(f"# HELP {typed} {help_text}")
    lines.append(f"# TYPE {typed} {kind}")


def created(
    lines: list[str], name: str, help_text: str, labels: Sequence[str], unix_s: float
) -> None:
    """The ``name_created`` gauge prometheus_client writes after a counter or histogram
    ``name``: when each of its series (``labels``, one per series) was made."""
    family(lines, f"{name}_created", "gauge", help_text)
    lines.extend(f"{name}_created{{{series}}} {_number(unix_s)}" for series in labels)


def _histogram(lines: list[str], name: str, labels: str, histogram: Histogram) -> None:
    cumulative = histogram.cumulative()
    for bound, count in zip(histogram.buckets, cumulative, strict=False):
        lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {_number(count)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {_number(cumulative[-1])}')
    lines.append(f"{name}_count{{{labels}}} {_number(histogram.count)}")
    lines.append(f"{name}_sum{{{labels}}} {_number(histogram.sum)}")


def render_metrics(node: EmulatedNode, model: str, replicas: Sequence[int] | None = None) -> str:
    """The whole page for every replica of ``node``, or for the engine replicas
    ``replicas`` only (one replica's own page, one pool of a disaggregated layout),
    labelled ``engine="0"``, ``"1"``, ... in order."""
    served = list(range(len(node.simulations))) if replicas is None else list(replicas)
    states = [node.engine_state(replica) for replica in served]
    engines = range(len(served))  # the page's engine labels
    kv_capacity = node.plant.kv_capacity_tokens
    lines: list[str] = []
    made = node.created_unix_s
    every_engine = [_labels(model, r) for r in engines]

    def per_replica(name: str, kind: str, help_text: str, values: Sequence[float]) -> None:
        """One family with one sample per replica (a counter's end in ``_total`` and are
        stamped ``_created``)."""
        family(lines, name, kind, help_text)
        suffix = "_total" if kind == "counter" else ""
        for r in engines:
            lines.append(f"{name}{suffix}{{{every_engine[r]}}} {_number(values[r])}")
        if kind == "counter":
            created(lines, name, help_text, every_engine, made)

    per_replica(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [state["running"] for state in states],
    )
    per_replica(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        [state["waiting"] for state in states],
    )
    per_replica(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        [state["kv_usage"] for state in states],
    )
    family(lines, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    for r in engines:
        # vLLM's info gauge has the cache config's fields and ``engine``, no model_name.
        fields = {
            "block_size": str(BLOCK_SIZE),
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "engine": str(r),
            "gpu_memory_utilization": "0.9",
            "num_gpu_blocks": str(kv_capacity // BLOCK_SIZE),
        }
        info = ",".join(f'{key}="{value}"' for key, value in fields.items())
        lines.append(f"vllm:cache_config_info{{{info}}} 1.0")
    with node.lock:
        stats = [node.stats[replica] for replica in served]
        # Running counts only: a scrape's work must not grow with the requests served.
        preemptions = [node.simulations[replica].preemptions for replica in served]
        per_replica(
            "vllm:num_preemptions",
            "counter",
            "Cumulative number of preemption from the engine.",
            preemptions,
        )
        per_replica(
            "vllm:prompt_tokens",
            "counter",
            "Number of prefill tokens processed.",
            [stat.prompt_tokens for stat in stats],
        )
        per_replica(
            "vllm:generation_tokens",
            "counter",
            "Number of generation tokens processed.",
            [stat.generation_tokens for stat in stats],
        )
        success_help = "Count of successfully processed requests."
        family(lines, "vllm:request_success", "counter", success_help)
        by_reason: list[str] = []
        for r in engines:
            for reason, count in sorted(stats[r].finished.items()):
                labels = _labels(model, r, finished_reason=reason)
                by_reason.append(labels)
                lines.append(f"vllm:request_success_total{{{labels}}} {_number(count)}")
        created(lines, "vllm:request_success", success_help, by_reason, made)
        # Engine steps by tokens run (running counts kept by the simulation).
        steps_help = "Histogram of number of tokens per engine_step."
        family(lines, "vllm:iteration_tokens_total", "histogram", steps_help)
        for r, replica in enumerate(served):
            simulation = node.simulations[replica]
            steps = Histogram.of(
                ITERATION_TOKEN_BUCKETS,
                simulation.iteration_token_counts(),
                simulation.iteration_tokens,
            )
            _histogram(lines, "vllm:iteration_tokens_total", every_engine[r], steps)
        created(lines, "vllm:iteration_tokens_total", steps_help, every_engine, made)
        for name, attribute, help_text in (
            (
                "vllm:time_to_first_token_seconds",
                "ttft",
                "Histogram of time to first token in seconds.",
            ),
            (
                "vllm:inter_token_latency_seconds",
                "itl",
                "Histogram of inter-token latency in seconds.",
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "tpot",
                "Histogram of time_per_output_token_seconds per request.",
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "e2e",
                "Histogram of e2e request latency in seconds.",
            ),
            (
                "vllm:request_prompt_tokens",
                "prompt_lengths",
                "Number of prefill tokens processed.",
            ),
            (
                "vllm:request_generation_tokens",
                "output_lengths",
                "Number of generation tokens processed.",
            ),
        ):
            family(lines, name, "histogram", help_text)
            for r in engines:
                _histogram(lines, name, every_engine[r], getattr(stats[r], attribute))
            created(lines, name, help_text, every_engine, made)
    return "\n".join(lines) + "\n"
