"""``gpugov load``: replay a trace against an OpenAI-compatible endpoint (client TTFT/TPOT)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType

from gpugov.daemon import cli_types
from gpugov.daemon.limits import MAX_CONCURRENCY


def cmd_load(args: argparse.Namespace) -> int:
    """Replay the trace window, print the summary, optionally write JSON."""
    from gpugov.daemon.cli_support import (
        UsageError,
        check_output_file,
        fail,
        load_trace_for_cli,
        require_positive,
    )
    from gpugov.daemon.errors import ExitCode
    from gpugov.daemon.progress import Progress
    from gpugov.study.load import format_report, run_load, summarize
    from gpugov.study.openai_client import EngineUnreachable, base_url, served_model

    for flag in ("load_scale", "duration", "drain", "request_timeout"):
        require_positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    if args.max_concurrency < 1:
        raise UsageError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    check_output_file("--json", args.json)
    try:
        base_url(args.url)
        model = args.model or served_model(args.url)
    except EngineUnreachable as error:
        raise UsageError(str(error)) from error
    workload, report = load_trace_for_cli(
        args.trace,
        duration_s=args.duration,
        load_scale=args.load_scale,
        start_s=args.start,
        spread_batches=not args.keep_batched_stamps,
    )
    if not workload:
        raise UsageError(f"--trace {args.trace}: the selected window holds no requests")
    window = workload[-1].arrival_time_s
    groups = Counter(r.arrival_time_s for r in workload)
    together = (
        f" (at {len(groups)} arrival times, up to {max(groups.values())} at once: "
        "--load-scale spaces these groups, it never splits one)"
        if len(groups) < len(workload)
        else ""
    )
    print(
        f"gpugov load: {len(workload)} requests from {Path(report.path).name} over "
        f"{window:.0f} s{together} against {args.url} (model {model})",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    interrupted = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            interrupted.set()
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    progress = Progress(max(window, 1e-9), "load", unit="s", enabled=not args.quiet)
    try:
        run = run_load(
            workload,
            args.url,
            model,
            max_concurrency=args.max_concurrency,
            request_timeout_s=args.request_timeout,
            drain_s=args.drain,
            max_model_len=args.max_model_len,
            prompt_mode=args.prompt,
            progress=progress,
            stop=stop,
        )
    finally:
        progress.close()
        for sig, old in previous.items():
            signal.signal(sig, old)
    summary = summarize(run)
    summary["trace"] = str(report.path)
    summary["url"] = args.url
    summary["model"] = model
    summary["load_scale"] = args.load_scale
    print(format_report(summary))
    if args.json:
        path = Path(args.json)
        try:
            path.write_text(json.dumps(summary, indent=2) + "\n")
        except OSError as error:
            return fail(f"--json {path}: cannot write: {error.strerror or error}", ExitCode.FAILURE)
    if summary["requests_sent"] and not summary["requests_completed"]:
        first = next(iter(summary["errors"]), "no request finished")
        return fail(f"no request completed against {args.url}: {first}", ExitCode.FAILURE)
    if interrupted.is_set():
        print(
            f"gpugov: interrupted after {summary['requests_sent']} of {len(workload)} requests",
            file=sys.stderr,
        )
        return ExitCode.INTERRUPTED
    return ExitCode.INTERRUPTED if stop.is_set() else ExitCode.OK


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``load`` to the ``gpugov`` parser."""
    parser = subparsers.add_parser(
        "load",
        help="replay a trace against an OpenAI-compatible endpoint; client TTFT/TPOT",
        description="Send a trace's requests at their arrival times as streamed "
        "/v1/completions (prompt length from the trace, max_tokens = its output length, "
        "ignore_eos), to gpugov emulate or a real vLLM/SGLang, and report TTFT and TPOT "
        "percentiles measured by the client.",
    )
    parser.add_argument(
        "--trace", required=True, metavar="NAME|PATH", help="trace name (gpugov traces) or file"
    )
    parser.add_argument(
        "--url",
        required=True,
        metavar="URL",
        help="the engine's base URL, e.g. http://127.0.0.1:8000",
    )
    parser.add_argument(
        "--load-scale",
        type=cli_types.load_scale,
        default=1.0,
        metavar="X",
        help="arrival-rate multiplier (2 halves every gap; default 1)",
    )
    parser.add_argument(
        "--duration",
        type=cli_types.duration,
        default=None,
        metavar="S",
        help="trace window length in trace seconds (default: the whole trace)",
    )
    parser.add_argument(
        "--keep-batched-stamps",
        action="store_true",
        help="send a grid-quantised trace's batches at once, as written "
        "(default: spread each batch over its grid step)",
    )
    parser.add_argument(
        "--start",
        type=cli_types.offset,
        default=0.0,
        metavar="S",
        help="trace window start in trace seconds (default 0)",
    )
    parser.add_argument(
        "--model", default=None, help="model id to request (default: the first of GET /v1/models)"
    )
    parser.add_argument(
        "--prompt",
        choices=["ids", "text"],
        default="ids",
        help="send prompts as token ids (exact; default) or as text",
    )
    parser.add_argument(
        "--max-model-len",
        type=cli_types.positive_int,
        default=None,
        metavar="N",
        help="clip prompt + output to N tokens (for models shorter than the trace's requests)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=cli_types.count(1, MAX_CONCURRENCY),
        default=256,
        metavar="N",
        help="requests in flight at most (default 256)",
    )
    parser.add_argument(
        "--request-timeout",
        type=cli_types.duration,
        default=600.0,
        metavar="S",
        help="one request's timeout (default 600)",
    )
    parser.add_argument(
        "--drain",
        type=cli_types.duration,
        default=120.0,
        metavar="S",
        help="wait at most this long after the last arrival (default 120)",
    )
    parser.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="also write the summary (counts, percentiles in seconds) as JSON",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.set_defaults(handler=cmd_load)
