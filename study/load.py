"""Replay a trace against an OpenAI-compatible endpoint and measure latency from the client.

Each trace request is sent at its arrival time (after ``load_scale``) as a streamed
``/v1/completions`` with its prompt length (token ids or text, see
:mod:`gpugov.study.openai_client`), ``max_tokens`` = its output length and
``ignore_eos: true``, so a real vLLM or SGLang does the work the trace describes.
Failed requests are grouped by their kind (:attr:`StreamTiming.error_kind`: the HTTP
status and the error's type, or the failure's class), each group with a count and its
first message; an ``api_key`` goes with every request as a bearer token.
Bounded: at most ``max_concurrency`` requests in flight (one daemon thread each; a
request waits client-side when the bound is reached), each at most ``request_timeout_s``,
the whole run at most the trace window plus ``drain_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpugov.daemon.progress import Progress, format_duration
from gpugov.plant.types import Request
from gpugov.study.openai_client import PromptMode, StreamTiming, request_body, stream_completion

PERCENTILES = (50, 90, 95, 99)


@dataclass
class LoadRun:
    """The outcome of one replay: one timing per request sent, and what was not sent."""

    timings: list[StreamTiming]
    scheduled: int
    not_sent: int
    clipped_prompts: int
    wall_s: float
    late_starts: int


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        empty: dict[str, float | None] = {f"p{p}": None for p in PERCENTILES}
        return empty | {"mean": None}
    array = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES}
    out["mean"] = float(array.mean())
    return out


def summarize(run: LoadRun) -> dict[str, Any]:
    """Counts, client-side TTFT/TPOT percentiles (seconds) and throughput."""
    done = [t for t in run.timings if t.error is None and t.end_s is not None]
    failed = [t for t in run.timings if t.error is not None]
    ttft = [t.ttft_s for t in done if t.ttft_s is not None]
    tpot = [t.tpot_s for t in done if t.tpot_s is not None]
    output = sum(t.output_tokens for t in run.timings)
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for timing in failed:
        message = timing.error or ""
        key = timing.error_kind or message
        errors[key] = errors.get(key, 0) + 1
        examples.setdefault(key, message)
    return {
        "requests_scheduled": run.scheduled,
        "requests_sent": len(run.timings),
        "requests_completed": len(done),
        "requests_failed": len(failed),
        "requests_unfinished": len(run.timings) - len(done) - len(failed),
        "requests_not_sent": run.not_sent,
        "late_starts": run.late_starts,
        "clipped_prompts": run.clipped_prompts,
        "output_tokens": output,
        "wall_s": run.wall_s,
        "output_tokens_per_s": output / run.wall_s if run.wall_s > 0 else None,
        "ttft_s": _percentiles(ttft),
        "tpot_s": _percentiles(tpot),
        "errors": errors,
        "error_examples": examples,
    }


def run_load(
    workload: Sequence[Request],
    url: str,
    model: str,
    *,
    max_concurrency: int = 256,
    request_timeout_s: float = 600.0,
    drain_s: float = 120.0,
    max_model_len: int | None = None,
    prompt_mode: PromptMode = "ids",
    include_usage: bool = False,
    api_key: str | None = None,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LoadRun:
    """Send ``workload`` to ``url`` in real time; return every request's client timings.

    Late start: a request sent more than 100 ms after its arrival (the concurrency bound
    was reached, or the machine could not keep up). ``include_usage`` asks each stream
    for its final ``usage`` event (kept in :attr:`StreamTiming.usage`); ``api_key`` is
    sent with each request (``Authorization: Bearer``).
    """
    if max_concurrency < 1:
        raise ValueError(f"max concurrency must be >= 1, got {max_concurrency}")
    stop = stop or threading.Event()
    slots = threading.BoundedSemaphore(max_concurrency)
    timings: list[StreamTiming] = []
    lock = threading.Lock()
    threads: list[threading.Thread] = []
    window_s = workload[-1].arrival_time_s if workload else 0.0
    deadline = clock() + window_s + drain_s
    clipped = 0
    late = 0
    start = clock()

    def worker(body: dict[str, Any]) -> None:
        try:
            timing = stream_completion(
                url, body, timeout_s=request_timeout_s, clock=clock, api_key=api_key
            )
            with lock:
                timings.append(timing)
        finally:
            slots.release()

    sent = 0
    for request in workload:
        due = start + request.arrival_time_s
        while not stop.is_set() and clock() < due:
            stop.wait(min(0.05, max(0.0, due - clock())))
            if progress is not None:
                progress.update(clock() - start, f"{sent} requests sent")
        if stop.is_set():
            break
        while not slots.acquire(timeout=0.1):
            if stop.is_set() or clock() > deadline:
                break
            if progress is not None:  # the line must not freeze while the bound holds
                progress.update(
                    min(clock() - start, window_s),
                    f"{sent} requests sent, waiting: {max_concurrency} in flight "
                    "(--max-concurrency)",
                )
        else:
            prompt, output = int(request.prompt_tokens), int(request.output_tokens)
            if max_model_len is not None and prompt + output > max_model_len:
                prompt = max(1, max_model_len - output)
                output = min(output, max_model_len - prompt)
                clipped += 1
            if clock() - due > 0.1:
                late += 1
            body = request_body(
                model, prompt, output, prompt_mode, salt=sent, include_usage=include_usage
            )
            thread = threading.Thread(target=worker, args=(body,), daemon=True)
            thread.start()
            threads.append(thread)
            sent += 1
            continue
        break
    for thread in threads:
        remaining = deadline - clock()
        if remaining <= 0 or stop.is_set():
            break
        while thread.is_alive() and not stop.is_set() and clock() < deadline:
            thread.join(timeout=min(0.2, max(0.0, deadline - clock())))
            if progress is not None:  # the window is sent: say what the wait is on
                with lock:
                    in_flight = sent - len(timings)
                # Every request sent: the window is done (one of 0 s, a burst at one
                # instant, read 0.0 % while it drained).
                progress.update(
                    progress.total if sent == len(workload) else min(clock() - start, window_s),
                    f"{sent} requests sent, draining {in_flight} in flight "
                    f"(at most {format_duration(max(0.0, deadline - clock()))} more)",
                )
    wall = clock() - start
    with lock:
        collected = list(timings)
    # Requests still streaming at the deadline count as sent but unfinished.
    unfinished = sent - len(collected)
    collected += [
        StreamTiming(prompt_tokens=0, max_tokens=0, sent_s=start) for _ in range(unfinished)
    ]
    return LoadRun(
        timings=collected,
        scheduled=len(workload),
        not_sent=len(workload) - sent,
        clipped_prompts=clipped,
        wall_s=wall,
        late_starts=late,
    )


def format_report(summary: dict[str, Any]) -> str:
    """The human-readable summary table."""

    def ms(values: dict[str, float | None]) -> str:
        return " / ".join(
            "n/a" if values[k] is None else f"{values[k] * 1000:.1f}"  # type: ignore[operator]
            for k in ("p50", "p90", "p99")
        )

    rows = [
        (
            "requests sent / completed / failed",
            f"{summary['requests_sent']} / {summary['requests_completed']} / "
            f"{summary['requests_failed']} (unfinished {summary['requests_unfinished']}, "
            f"not sent {summary['requests_not_sent']})",
        ),
        ("TTFT p50 / p90 / p99 (client)", ms(summary["ttft_s"]) + " ms"),
        ("TPOT p50 / p90 / p99 (client)", ms(summary["tpot_s"]) + " ms"),
        (
            "output tokens",
            f"{summary['output_tokens']} ({(summary['output_tokens_per_s'] or 0):.1f} tok/s)",
        ),
        ("late starts", str(summary["late_starts"])),
        ("wall time", f"{summary['wall_s']:.1f} s"),
    ]
    if summary.get("clipped_prompts"):
        # The latencies above are of the clipped requests, not the trace's lengths.
        clipped = f"{summary['clipped_prompts']} of {summary['requests_sent']} requests"
        rows.insert(-2, ("clipped to --max-model-len", clipped))
    width = max(len(name) for name, _ in rows)
    lines = [f"  {name:<{width}}  {value}" for name, value in rows]
    examples = summary.get("error_examples", {})
    for kind, count in summary["errors"].items():
        example = examples.get(kind, kind)
        group = "" if example == kind else f" [{kind}]"
        first = "" if count == 1 or example == kind else "first "
        lines.append(f"  error x{count}{group}: {first}{example}")
    return "\n".join(lines)
