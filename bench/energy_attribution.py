"""Accuracy of the daemon's energy attribution against the plant's exact energy.

Runs the daemon's real loop (``gpugov run --simulate``'s :func:`simulated_run`, virtual
time) on the Azure conversation and code traces on several profiles, with the node's
energy estimator (:mod:`gpugov.daemon.energy`) as it runs on a node, and reads the
plant's exact energy alongside (its energy ledger, :mod:`gpugov.plant.attribution`: per
phase, and per request by token share within each phase). Then
:func:`gpugov.study.energy_check.compare` reports the targets: J per output token over
the run within 5%, per-phase totals within 10%, median per-request error within 15%.

    nice -n 15 .venv/bin/python bench/energy_attribution.py [--duration 600]
        [--profiles h100-sxm-llama3-8b,a100-sxm-80gb-llama3-8b,l40s-llama3-8b]
        (bundled names, synthetic:SHAPE or random:SEED)
        [--traces azure-conv,azure-code] [--controller mpc-online] [--learned]
        [--utilization window|sampled|instant] [--steps counted|estimated]
        [--prompt-counter chunks|done] [--start S] [--seed N]

Writes ``bench/results/energy_attribution.json`` and prints one line per run.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpugov.daemon.cli_support import load_trace_for_cli
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.service import simulated_run
from gpugov.plant import ServingPlant
from gpugov.plant.synthetic_profiles import random_shape, resolve_profile, shape_profile
from gpugov.study.energy_check import EstimateSeries, RequestTruth, compare

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "energy_attribution.json"
DEFAULT_PROFILES = "h100-sxm-llama3-8b,a100-sxm-80gb-llama3-8b,l40s-llama3-8b"
DEFAULT_TRACES = "azure-conv,azure-code"


class PlantTruth:
    """The plant's exact energy (its :class:`gpugov.plant.attribution.EnergyLedger`):
    per phase and per request."""

    def __init__(self, simulation: Any) -> None:
        self.sim = simulation
        self.ledger = simulation.energy_ledger

    def totals(self) -> dict[str, float]:
        """Cumulative truth now."""
        return {
            "prefill_j": self.ledger.prefill_total_j,
            "decode_j": self.ledger.decode_total_j,
            "idle_j": self.ledger.idle_j,
            # The counters observe() reports, read without observing (that would close
            # the engine's latency window the daemon reads).
            "output_tokens": float(self.sim.counters.output_tokens),
            "requests": float(self.sim._completed),
        }

    def request_j(self, index: int) -> float:
        """A finished request's prefill plus decode energy."""
        prefill, decode = self.ledger.request_energy(index, decoding=False)
        return prefill + decode


def _read_utilization(domain: Any, utilization: Callable[[], float]) -> None:
    """Make the GPUs report ``utilization()`` instead of the plant's exact busy share of
    the window."""
    for backend in domain.observer.gpus.backends:
        read = backend.sample

        def sample(read: Any = read) -> Any:
            return replace(read(), utilization=utilization())

        backend.sample = sample


def _edit_scrapes(domain: Any, edit: Callable[[Any], Any]) -> None:
    """Make the engine's every scrape pass through ``edit`` (an ``EngineSample`` to
    another), as an engine that publishes its counters otherwise would."""
    source = domain.observer.source
    scrape = source.scrape

    def edited(timeout_s: float | None = None) -> Any:
        return edit(scrape(timeout_s))

    source.scrape = edited


def _prompt_tokens_when_done(sim: Any) -> Callable[[Any], Any]:
    """The engine's prompt counter as vLLM (and ``gpugov emulate``'s page) keeps it: a
    prompt's tokens count once its prefill is done, not chunk by chunk as they run."""
    prompts = [request.prompt_tokens for request in sim.requests]

    def when_done(sample: Any) -> Any:
        first, _ = sim.request_times()
        done = sum(tokens for tokens, t in zip(prompts, first, strict=False) if t is not None)
        return replace(sample, prompt_tokens_total=float(done))

    return when_done


def _profile(spec: str) -> Any:
    """A bundled profile, ``synthetic:SHAPE`` or ``random:SEED`` (a board drawn at random,
    as ``bench/random_shapes.py`` draws them)."""
    if spec.startswith("random:"):
        return shape_profile(random_shape(int(spec.removeprefix("random:"))))
    return resolve_profile(spec)


def one_run(
    trace: str,
    profile_name: str,
    controller: str,
    duration_s: float,
    seed: int,
    learned: bool = False,
    utilization: str = "window",
    start_s: float = 0.0,
    steps: str = "counted",
    prompt_counter: str = "chunks",
) -> dict[str, Any]:
    """One simulated daemon run with the truth alongside; the comparison."""
    workload, _ = load_trace_for_cli(trace, duration_s=duration_s, start_s=start_s)
    profile = _profile(profile_name)
    plant = ServingPlant.from_profile(profile)
    spec = parse_controller_spec(controller, default_profile=profile_name)
    clock = VirtualClock()
    simulation = simulated_run(
        workload, plant, spec, clock, period_s=1.0, seed=seed, virtual_time=True
    )
    truth = PlantTruth(simulation.node.simulation)
    domain = simulation.domain
    domain.energy.use_learned = learned
    sim = simulation.node.simulation
    if utilization == "instant":
        # As a sampled counter reads at worst: 1 when an iteration runs at the read, else 0.
        _read_utilization(domain, lambda: 1.0 if sim._in_iteration else 0.0)
    elif utilization == "sampled":
        # As NVML (and gpugov emulate) report it: the busy share of the last second.
        _read_utilization(domain, lambda: sim.recent_utilization(1.0))
    if steps == "estimated":
        # No step count published (as SGLang): the estimator estimates the iterations.
        _edit_scrapes(domain, lambda sample: replace(sample, iterations_total=None))
    if prompt_counter == "done":
        _edit_scrapes(domain, _prompt_tokens_when_done(sim))
    rows: list[tuple[float, dict[str, float]]] = []
    truth_rows: list[tuple[float, dict[str, float]]] = []

    def on_tick(records: Any) -> None:
        now = clock()
        views = domain.energy.snapshot().models
        rows.append(
            (
                now,
                {
                    "prefill_j": sum(v.prefill_j for v in views),
                    "decode_j": sum(v.decode_j for v in views),
                    "idle_j": sum(v.idle_j for v in views),
                    "prompt_tokens": sum(v.prompt_tokens for v in views),
                    "output_tokens": sum(v.output_tokens for v in views),
                    "requests": sum(v.finished_requests for v in views),
                },
            )
        )
        truth_rows.append((now, truth.totals()))

    started = time.perf_counter()
    try:
        run(
            [domain],
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            on_tick=on_tick,
            before_tick=simulation.before_tick,
        )
    finally:
        simulation.finish()
    wall = time.perf_counter() - started
    # Compare from the estimator's first window to its last (the truth over that span).
    first = next(i for i, (_, row) in enumerate(rows) if any(row.values()))
    start_s, end_s = rows[max(0, first - 1)][0], rows[-1][0]
    truth_series = EstimateSeries.from_rows(truth_rows)
    span_truth = {
        name: truth_series.delta(name, start_s, end_s)
        for name in ("prefill_j", "decode_j", "idle_j", "output_tokens", "requests")
    }
    sim = simulation.node.simulation
    requests = []
    for index in range(len(workload)):
        first_token, finish = sim._first_token[index], sim._finish[index]
        if first_token is None or finish is None or not math.isfinite(finish):
            continue
        if not (start_s <= first_token and finish <= end_s):
            continue
        true_j = truth.request_j(index)
        if true_j <= 0:
            continue
        requests.append(
            RequestTruth(
                prompt_tokens=float(sim._prompt[index]),
                output_tokens=float(sim._output[index]),
                first_token_s=float(first_token),
                end_s=float(finish),
                true_j=true_j,
            )
        )
    result = compare(
        EstimateSeries.from_rows(rows), span_truth, requests, start_s=start_s, end_s=end_s
    )
    sources: dict[str, int] = {}
    for view in domain.energy.snapshot().models:
        for source, count in view.windows:
            sources[source] = sources.get(source, 0) + count
    result.update(
        {
            "trace": trace,
            "profile": profile_name,
            "controller": domain.label,
            "requests": len(workload),
            "windows_by_source": sources,
            "skipped": dict(domain.energy.skipped),
            "wall_s": wall,
        }
    )
    return result


def main(argv: list[str] | None = None) -> int:
    """Run every trace x profile and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals")
    parser.add_argument("--profiles", default=DEFAULT_PROFILES)
    parser.add_argument("--traces", default=DEFAULT_TRACES)
    parser.add_argument("--controller", default="mpc-online")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=float, default=0.0, help="trace window start (s)")
    parser.add_argument(
        "--learned",
        action="store_true",
        help="split with mpc-online's learned model where it has warmed up (default: own fit)",
    )
    parser.add_argument(
        "--utilization",
        choices=["window", "sampled", "instant"],
        default="window",
        help="GPU utilisation the daemon reads: the plant's exact busy share of the window "
        "(default), the busy share of the last second's samples as NVML reports it "
        "(sampled), or 0/1 at the read (instant, the worst case)",
    )
    parser.add_argument(
        "--steps",
        choices=["counted", "estimated"],
        default="counted",
        help="engine steps: counted by the engine (vLLM's tokens-per-step histogram, the "
        "default) or not published, so estimated from tokens and batch (as for SGLang)",
    )
    parser.add_argument(
        "--prompt-counter",
        choices=["chunks", "done"],
        default="chunks",
        help="the engine's prompt-token counter: chunk by chunk as prefill runs (default), "
        "or each prompt once its prefill is done, as vLLM counts it",
    )
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    results = []
    for trace in args.traces.split(","):
        for profile in args.profiles.split(","):
            result = one_run(
                trace,
                profile,
                args.controller,
                args.duration,
                args.seed,
                args.learned,
                args.utilization,
                args.start,
                args.steps,
                args.prompt_counter,
            )
            results.append(result)
            token = result["joules_per_output_token"]
            per = result["per_request"]
            phases = result["phases"]

            def pct(value: float | None) -> str:
                return "n/a" if value is None else f"{100 * value:+.1f}%"

            print(
                f"{trace:<11} {profile:<26} {result['controller']:<11} "
                f"J/tok {token['estimate']:.3f} vs {token['truth']:.3f} ({pct(token['error'])}); "
                f"prefill {pct(phases['prefill']['error'])}, decode "
                f"{pct(phases['decode']['error'])}, idle {pct(phases['idle']['error'])}; "
                f"request median {pct(per['median_error'])} p90 {pct(per['p90_error'])} "
                f"({per['compared']}); {result['windows_by_source']}; {result['wall_s']:.0f} s",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "argv": sys.argv[1:],
                "duration_s": args.duration,
                "learned": args.learned,
                "utilization": args.utilization,
                "steps": args.steps,
                "prompt_counter": args.prompt_counter,
                "start_s": args.start,
                "controller": args.controller,
                "runs": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
