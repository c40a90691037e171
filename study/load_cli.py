"""``gpugov load``: replay a trace against an OpenAI-compatible endpoint (client TTFT/TPOT)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from gpugov.daemon import cli_types
from gpugov.daemon.limits import MAX_CONCURRENCY, MAX_COUNT, MAX_SECONDS
from gpugov.daemon.stop_signals import StopEvent, set_from_handler


def cmd_load(args: argparse.Namespace) -> int:
    """Replay the trace window, print the summary, optionally write JSON."""
    from gpugov.daemon.cli_outputs import check_output_file, trace_file
    from gpugov.daemon.cli_support import UsageError, fail, load_trace_for_cli, require_positive
    from gpugov.daemon.errors import ExitCode
    from gpugov.daemon.files import write_text_atomic
    from gpugov.daemon.progress import Progress
    from gpugov.plant.workload import format_seconds
    from gpugov.study.load import LoadRun, format_report, run_load, summarize
    from gpugov.study.openai_client import (
        EngineUnreachable,
        base_url,
        resolve_api_key,
        served_max_model_len,
        served_model,
    )

    api_key = resolve_api_key(args.api_key)
    for flag in ("load_scale", "duration", "drain", "request_timeout"):
        require_positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    if args.max_concurrency < 1:
        raise UsageError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    check_output_file("--json", args.json, [("the trace", trace_file(args.trace))])
    if args.governor_metrics is not None:
        from gpugov.daemon.energy_report import check_metrics_url

        try:
            check_metrics_url(args.governor_metrics)
        except ValueError as error:
            raise UsageError(f"--governor-metrics {error}") from error
    # The local trace first: a bad one is named before the engine is contacted.
    workload, report = load_trace_for_cli(
        args.trace,
        duration_s=args.duration,
        load_scale=args.load_scale,
        start_s=args.start,
        spread_batches=not args.keep_batched_stamps,
        progress=not args.quiet,
    )
    if not workload:
        raise UsageError(f"--trace {args.trace}: the selected window holds no requests")
    window = workload[-1].arrival_time_s
    if window > MAX_SECONDS:  # sent in real time, such a window never ends
        raise UsageError(
            f"--trace {args.trace}: the window spans {format_seconds(window)} s, over the "
            f"{format_seconds(MAX_SECONDS)} s (ten years) a load may last; choose a shorter "
            "--duration or a larger --load-scale"
        )
    try:
        host, port, prefix = base_url(args.url)
        model = args.model or served_model(args.url, api_key=api_key)
    except EngineUnreachable as error:
        raise UsageError(str(error)) from error
    if args.model:
        _check_the_model_is_served(args.url, args.model, api_key)
    if args.max_model_len is None:
        context = served_max_model_len(args.url, model, api_key=api_key)
        _warn_over_the_context(args.trace, workload, context)
    truth_base = f"http://{host}:{port}{prefix}"
    if args.governor_metrics is not None:
        _check_energy_sources(args.governor_metrics, truth_base)
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
    stop = StopEvent()
    interrupted = StopEvent()
    terminated = StopEvent()

    def handler(signum: int, frame: FrameType | None) -> None:
        set_from_handler(interrupted if signum == signal.SIGINT else terminated, stop)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    progress = Progress(max(window, 1e-9), "load", unit="s", enabled=not args.quiet)
    energy = _EnergyRun(args.governor_metrics, truth_base) if args.governor_metrics else None
    run: LoadRun | None = None
    try:
        if energy is not None:
            energy.start()
        run = run_load(
            workload,
            args.url,
            model,
            max_concurrency=args.max_concurrency,
            request_timeout_s=args.request_timeout,
            drain_s=args.drain,
            max_model_len=args.max_model_len,
            prompt_mode=args.prompt,
            include_usage=energy is not None,
            api_key=api_key,
            progress=progress,
            stop=stop,
        )
    finally:
        # Every request sent: the last line shows the whole window done, whatever its span.
        sent_all = run is not None and run.not_sent == 0
        progress.close(done=progress.total if sent_all else None)
        if energy is not None:
            energy.finish()
        for sig, old in previous.items():
            signal.signal(sig, old)
    summary = summarize(run)
    summary["trace"] = str(report.path)
    summary["url"] = args.url
    summary["model"] = model
    summary["load_scale"] = args.load_scale
    # The window and how its arrivals were read: two runs of one trace with other windows
    # (or one spread, one with --keep-batched-stamps) wrote summaries that named neither.
    summary["start_s"] = args.start
    summary["duration_s"] = args.duration
    summary["batch_grid_s"] = report.batch_grid_s
    summary["trace_sha256"] = report.sha256
    # A run cut short says so in its summary (the --json file replaces an earlier one).
    summary["stopped"] = (
        "interrupted" if interrupted.is_set() else "terminated" if terminated.is_set() else None
    )
    if energy is not None:
        summary["energy"] = energy.compare(run)
    print(format_report(summary))
    if energy is not None:
        print(energy.report(summary["energy"]))
    if args.json:
        path = Path(args.json)
        try:
            write_text_atomic(path, json.dumps(summary, indent=2) + "\n")
        except OSError as error:
            return fail(f"--json {path}: cannot write: {error.strerror or error}", ExitCode.FAILURE)
    # A stop comes first: a run stopped before any request finished failed no request.
    if summary["stopped"] is not None:
        print(
            f"gpugov: {summary['stopped']} after {summary['requests_sent']} of "
            f"{len(workload)} requests",
            file=sys.stderr,
        )
        return ExitCode.INTERRUPTED if interrupted.is_set() else ExitCode.TERMINATED
    if summary["requests_sent"] and not summary["requests_completed"]:
        kind = next(iter(summary["errors"]), None)
        first = "no request finished" if kind is None else summary["error_examples"][kind]
        return fail(f"no request completed against {args.url}: {first}", ExitCode.FAILURE)
    return ExitCode.OK


def _check_the_model_is_served(url: str, model: str, api_key: str | None) -> None:
    """Warn before any request when the server's ``/v1/models`` list is read and names no
    such ``--model``: a server that checks the name (vLLM) refuses every request of the
    window (404), where TGI and SGLang serve their model whatever name is sent. A server
    that lists no models, or none readable, is left to answer."""
    from gpugov.daemon.cli_support import warn
    from gpugov.study.openai_client import EngineUnreachable, served_models

    try:
        entries = served_models(url, api_key=api_key)
    except EngineUnreachable:
        return
    ids = [entry["id"] for entry in entries if isinstance(entry, dict) and "id" in entry]
    if ids and model not in ids:
        listed = ", ".join(str(name) for name in ids[:10]) + (", ..." if len(ids) > 10 else "")
        warn(
            f"--model {model}: {url}/v1/models lists no such model (it serves {listed}); a "
            "server that checks the name (vLLM) refuses every request: name one of them, "
            "or leave --model out for the first"
        )


def _warn_over_the_context(trace: str, workload: Any, context: int | None) -> None:
    """Warn, before any request is sent, when some of ``workload``'s requests (prompt plus
    output) exceed the served model's ``context`` tokens: the server refuses each one."""
    from gpugov.daemon.cli_support import warn

    if context is None:
        return
    over = sum(1 for r in workload if int(r.prompt_tokens) + int(r.output_tokens) > context)
    if over:
        warn(
            f"--trace {trace}: {over} of {len(workload)} requests exceed the served model's "
            f"context of {context} tokens (prompt + output, its max_model_len in /v1/models); "
            f"the server will refuse them; --max-model-len {context} clips them instead"
        )


def _check_energy_sources(governor: str, truth_base: str) -> None:
    """Refuse ``--governor-metrics`` before any work unless the daemon's metrics and the
    emulator's truth both answer.

    Raises:
        UsageError: naming the flag and what did not answer.
    """
    from gpugov.daemon.cli_support import UsageError
    from gpugov.study.energy_check import EnergySourceError, read_governor, read_truth

    try:
        read_governor(governor)
    except EnergySourceError as error:
        raise UsageError(f"--governor-metrics {error}") from error
    try:
        read_truth(truth_base)
    except EnergySourceError as error:
        raise UsageError(
            f"--governor-metrics needs a gpugov emulator as --url (its /gpugov/energy truth): "
            f"{error}"
        ) from error


class _EnergyRun:
    """The daemon's estimate read through the run and the emulator's truth at both ends."""

    LAG_S = 2.0
    """How far the daemon's attribution trails the truth (a control window and a scrape):
    its estimate is read that much after each truth reading."""

    def __init__(self, governor: str, truth_base: str) -> None:
        import time

        from gpugov.study.energy_check import GovernorSampler

        self.truth_base = truth_base
        self.sampler = GovernorSampler(governor)
        self._clock = time.monotonic
        self.start_s = self.end_s = 0.0
        self.truth_start: dict[str, float] = {}
        self.truth_end: dict[str, float] = {}
        self.error: str | None = None

    def start(self) -> None:
        """Read the truth and the daemon once, then the daemon every second."""
        import time

        from gpugov.study.energy_check import EnergySourceError, read_truth

        try:
            self.truth_start = read_truth(self.truth_base)
        except EnergySourceError as error:
            self.error = str(error)
        self.start_s = self._clock()
        self.sampler.start()
        time.sleep(self.LAG_S)  # the daemon's reading at start_s + lag
        self.sampler.sample()

    def finish(self) -> None:
        """Read the truth at the end, and the daemon a few seconds more."""
        import time

        from gpugov.study.energy_check import EnergySourceError, read_truth

        try:
            self.truth_end = read_truth(self.truth_base)
        except EnergySourceError as error:
            self.error = self.error or str(error)
        self.end_s = self._clock()
        self.sampler.sample()
        time.sleep(self.LAG_S)  # then the daemon's reading at end_s + lag
        self.sampler.stop()

    def compare(self, run: Any) -> dict[str, Any]:
        """The comparison (:func:`gpugov.study.energy_check.compare`) as JSON."""
        from gpugov.study.energy_check import RequestTruth, compare

        if self.error is not None:
            return {"error": self.error}
        if len(self.sampler.rows) < 2:
            return {"error": f"the daemon's metrics answered {len(self.sampler.rows)} time(s)"}
        truth = {k: self.truth_end[k] - self.truth_start[k] for k in self.truth_end}
        requests = []
        for timing in run.timings:
            usage = timing.usage or {}
            energy = usage.get("energy_j")
            if timing.end_s is None or not timing.token_s or not isinstance(energy, int | float):
                continue
            requests.append(
                RequestTruth(
                    prompt_tokens=float(usage.get("prompt_tokens", timing.prompt_tokens)),
                    output_tokens=float(timing.output_tokens),
                    first_token_s=timing.token_s[0],
                    end_s=timing.end_s,
                    true_j=float(energy),
                )
            )
        result = compare(
            self.sampler.series(),
            truth,
            requests,
            start_s=self.start_s,
            end_s=self.end_s,
            lag_s=self.LAG_S,
        )
        result["governor_reads"] = len(self.sampler.rows)
        result["governor_read_failures"] = self.sampler.failures
        return result

    def report(self, result: dict[str, Any]) -> str:
        """The summary lines."""
        from gpugov.study.energy_check import format_comparison

        if "error" in result:
            return f"  energy: no comparison: {result['error']}"
        return format_comparison(result)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``load`` to the ``gpugov`` parser."""
    from gpugov.study.openai_client import add_api_key_argument

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
    add_api_key_argument(parser)
    parser.add_argument(
        "--prompt",
        choices=["ids", "text"],
        default="ids",
        help="send prompts as token ids (exact; default) or as text",
    )
    parser.add_argument(
        "--max-model-len",
        # At least a prompt token and an output token: 1 clipped every request to no output
        # (max_tokens 0), each refused by the server only after the run had begun.
        type=cli_types.count(2, MAX_COUNT),
        default=None,
        metavar="N",
        help="clip prompt + output to N tokens, at least 2 (for models shorter than the "
        "trace's requests)",
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
    parser.add_argument(
        "--governor-metrics",
        default=None,
        metavar="URL",
        help="the gpugov daemon's /metrics URL: against a gpugov emulator, compare the "
        "daemon's energy estimate with the emulator's truth (J per output token, per-phase "
        "totals, per-request energy; in the summary and the JSON)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.set_defaults(handler=cmd_load)
