"""Extreme boards: ``mpc-online`` (the node's: safety chain, vLLM engine view, every
0.25 s, told the 99 % target) against the maximum clock on hand-made shapes far outside
the bundled and random ones: two or three clocks, 100-3000 MHz, 5 MHz steps, idle near
zero or near the board's power, time ~ 1/f or flat in f, sub-ms and 100+ ms iterations,
a power limit below the top clock's draw, very loose or nearly unachievable SLOs.

Per shape it checks what ``bench/random_shapes.py`` checks (hold, saving, capture with
``--best-fixed``) and also: every decision finite and a supported clock, the time per
decision, and how often the realised clock reverses direction (oscillation; a raise for
a prompt and the fall after it count as one).

    .venv/bin/python bench/extreme_shapes.py [--shapes NAME ...] [--duration 180]
        [--load 0.6] [--trace azure-conv-10min] [--best-fixed]

The sub-millisecond and the loose-SLO shapes have a capacity the 10-minute slice cannot
fill for long: run them on the hour (``--shapes tiny-model loose-slo --trace azure-conv
--duration 60 --load 0.5``, ``GPUGOV_TRACES_DIR`` set). Writes
``bench/results/extreme_shapes.json`` and prints a line per shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from random_shapes import _start
from unseen_node import _run, light_scenario

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.oracles import SLO_TOLERANCE, best_fixed_clock, holds_slo
from gpugov.daemon.controller_config import MaxControllerConfig, OnlineMPCControllerConfig
from gpugov.plant import ServingPlant
from gpugov.plant.synthetic_profiles import BASE, REFERENCE_BATCH, SyntheticShape, shape_profile
from gpugov.plant.workload import TraceWarning, load_trace

OUT = Path(__file__).resolve().parent / "results" / "extreme_shapes.json"
ONLINE_PERIOD_S = 0.25


def _tiny() -> SyntheticShape:
    prefill, decode = 800_000.0, 250_000.0  # a batch of 64 in 0.26 ms
    return replace(
        BASE,
        name="tiny-model",
        description="sub-ms iterations",
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
        ttft_slo_s=0.05,
        tpot_slo_s=3 * REFERENCE_BATCH / decode,
    )


def _huge() -> SyntheticShape:
    prefill, decode = 3_000.0, 500.0  # a batch of 64 in 128 ms
    return replace(
        BASE,
        name="huge-tp8",
        description="100+ ms iterations over 8 GPUs",
        tensor_parallel=8,
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
        ttft_slo_s=8.0,
        tpot_slo_s=2.5 * REFERENCE_BATCH / decode,
        kv_capacity_tokens=1_600_000,
    )


EXTREME: dict[str, SyntheticShape] = {
    s.name: s
    for s in (
        replace(
            BASE,
            name="two-clocks",
            description="345 and 1980 MHz only",
            clock_min_mhz=345.0,
            clock_max_mhz=1980.0,
            clock_step_mhz=1635.0,
        ),
        replace(
            BASE,
            name="three-clocks",
            description="1000, 1400, 1800 MHz",
            clock_min_mhz=1000.0,
            clock_max_mhz=1800.0,
            clock_step_mhz=400.0,
        ),
        replace(
            BASE,
            name="two-close",
            description="1700 and 1800 MHz",
            clock_min_mhz=1700.0,
            clock_max_mhz=1800.0,
            clock_step_mhz=100.0,
        ),
        replace(
            BASE,
            name="very-wide",
            description="100-3000 MHz, 5 MHz steps",
            clock_min_mhz=100.0,
            clock_max_mhz=3000.0,
            clock_step_mhz=5.0,
        ),
        replace(
            BASE,
            name="very-wide-coarse",
            description="100-3000 MHz, 100 MHz steps",
            clock_min_mhz=100.0,
            clock_max_mhz=3000.0,
            clock_step_mhz=100.0,
        ),
        replace(
            BASE,
            name="fine-steps",
            description="1 MHz steps over 1200-1800 MHz",
            clock_min_mhz=1200.0,
            clock_max_mhz=1800.0,
            clock_step_mhz=1.0,
        ),
        replace(BASE, name="zero-idle", description="idle 0.5-1 W", idle_min_w=0.5, idle_max_w=1.0),
        replace(
            BASE,
            name="idle-near-tdp",
            description="idle 560-600 W of 700 W",
            idle_min_w=560.0,
            idle_max_w=600.0,
            prefill_static_w=10.0,
            prefill_dynamic_w=90.0,
            decode_static_w=10.0,
            decode_dynamic_w=60.0,
        ),
        replace(
            BASE,
            name="pure-compute",
            description="every rate ~ f",
            prefill_exponent=1.0,
            decode_flat_fraction=0.0,
        ),
        replace(
            BASE,
            name="pure-memory",
            description="every rate flat in f",
            prefill_exponent=0.0,
            decode_flat_fraction=1.0,
        ),
        replace(
            BASE,
            name="decode-flat",
            description="decode flat, prefill ~ f",
            prefill_exponent=1.0,
            decode_flat_fraction=1.0,
        ),
        _tiny(),
        _huge(),
        replace(
            BASE,
            name="power-cap-low",
            description="limit 350 W, top draws 590 W",
            power_limit_w=350.0,
        ),
        replace(BASE, name="power-cap-mid", description="limit 450 W", power_limit_w=450.0),
        replace(
            BASE,
            name="loose-slo",
            description="TTFT 60 s, TPOT 2 s",
            ttft_slo_s=60.0,
            tpot_slo_s=2.0,
        ),
        replace(
            BASE,
            name="tight-slo",
            description="TTFT 0.1 s, TPOT 1.05x top iteration",
            ttft_slo_s=0.1,
            tpot_slo_s=1.05 * REFERENCE_BATCH / BASE.decode_tokens_per_s,
        ),
        replace(
            BASE,
            name="tight-tpot",
            description="TPOT 1.1x the top iteration",
            tpot_slo_s=1.1 * REFERENCE_BATCH / BASE.decode_tokens_per_s,
        ),
        replace(BASE, name="tight-ttft", description="TTFT 0.08 s", ttft_slo_s=0.08),
        replace(
            BASE,
            name="flat-power",
            description="power flat in f",
            prefill_dynamic_w=0.0,
            decode_dynamic_w=0.0,
            prefill_static_w=450.0,
            decode_static_w=300.0,
        ),
        replace(
            BASE,
            name="ultra-fine-wide",
            description="100-3000 MHz in 1 MHz steps",
            clock_min_mhz=100.0,
            clock_max_mhz=3000.0,
            clock_step_mhz=1.0,
        ),
        replace(
            BASE,
            name="cap-below-min",
            description="limit 130 W, below the lowest clock's prefill draw",
            power_limit_w=130.0,
        ),
        replace(
            BASE,
            name="idle-tdp-tight",
            description="idle near the board power, tight TTFT",
            idle_min_w=560.0,
            idle_max_w=600.0,
            prefill_static_w=10.0,
            prefill_dynamic_w=90.0,
            decode_static_w=10.0,
            decode_dynamic_w=60.0,
            ttft_slo_s=0.08,
        ),
        replace(
            BASE,
            name="steep-power",
            description="power ~ f^6",
            prefill_power_exponent=6.0,
            decode_power_exponent=6.0,
        ),
    )
}


def _reversals(clocks: np.ndarray) -> int:
    steps = np.sign(np.diff(clocks))
    steps = steps[steps != 0]
    return int(np.count_nonzero(np.diff(steps) != 0))


def run_shape(
    shape: SyntheticShape, trace: str, duration_s: float, load: float, best: bool, view: str
) -> dict[str, Any]:
    started = time.perf_counter()
    row: dict[str, Any] = {"shape": shape.name, "description": shape.description}
    try:
        profile = shape_profile(shape)
        plant = ServingPlant.from_profile(profile)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            full, _ = load_trace(trace)
        scenario = light_scenario(full, plant, _start(trace), duration_s, load)
        requests = scenario.pop("requests")
        row["scenario"] = {**scenario, "requests": len(requests)}
        target = SLOTarget(attainment=1.0 - SLO_TOLERANCE, window_s=duration_s)
        top = _run(plant, requests, MaxControllerConfig(kind="max"), 1.0, None, view)
        t0 = time.perf_counter()
        online = _run(
            plant,
            requests,
            OnlineMPCControllerConfig(kind="mpc-online"),
            ONLINE_PERIOD_S,
            target,
            view,
        )
        online_s = time.perf_counter() - t0
        clocks = np.asarray(online.realized_clock_mhz, dtype=float)
        supported = set(profile.clock_mhz.tolist())
        a_top, a_on = top.metrics.slo_attainment, online.metrics.slo_attainment
        row.update(
            top_attainment=a_top,
            online_attainment=a_on,
            holds=bool(holds_slo(a_on, a_top)),
            saved=1.0 - online.metrics.energy_j / top.metrics.energy_j,
            finite=bool(np.all(np.isfinite(clocks))),
            unsupported=sorted(set(clocks.tolist()) - supported)[:5],
            mean_clock=float(np.mean(clocks)),
            top_share=float(np.mean(clocks >= profile.clock_mhz.max())),
            reversals_per_min=_reversals(clocks) / (duration_s / 60.0),
            ms_per_decision=1000 * online_s / max(1, len(clocks)),
        )
        if best:
            b = best_fixed_clock(requests, plant, reference=top, seed=0, control_period_s=1.0)
            bsave = 1.0 - b.result.metrics.energy_j / top.metrics.energy_j
            row.update(
                best_clock=b.clock_mhz,
                best_saved=bsave,
                capture=row["saved"] / bsave if bsave >= 0.01 else None,
            )
    except Exception as error:  # a crash is a finding
        row["error"] = f"{type(error).__name__}: {error}"
        row["traceback"] = traceback.format_exc()
    row["wall_s"] = time.perf_counter() - started
    return row


def line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['shape']:18s} ERROR {row['error']}"
    cap = row.get("capture")
    best = (
        (
            f" best {row['best_clock']:.0f} {100 * row['best_saved']:5.1f}%"
            f" cap {'-' if cap is None else f'{cap:.2f}'}"
        )
        if "best_clock" in row
        else ""
    )
    return (
        f"{row['shape']:18s} n={row['scenario']['requests']:5d} "
        f"top {100 * (row['top_attainment'] or 0):6.2f}% "
        f"on {100 * (row['online_attainment'] or 0):6.2f}%"
        f"{'' if row['holds'] else ' MISS'} saved {100 * row['saved']:5.1f}%{best} "
        f"mean {row['mean_clock']:.0f} topshare {row['top_share']:.2f} "
        f"rev/min {row['reversals_per_min']:.1f} {row['ms_per_decision']:.2f} ms/dec"
        f"{'' if row['finite'] else ' NONFINITE'}"
        f"{'' if not row['unsupported'] else ' UNSUPPORTED ' + str(row['unsupported'])}"
        f" ({row['wall_s']:.0f}s)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(EXTREME))
    parser.add_argument("--trace", default="azure-conv-10min")
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--load", type=float, default=0.6)
    parser.add_argument("--best-fixed", action="store_true")
    parser.add_argument("--engine-view", default="vllm")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    rows = []
    for name in args.shapes:
        row = run_shape(
            EXTREME[name], args.trace, args.duration, args.load, args.best_fixed, args.engine_view
        )
        rows.append(row)
        print(line(row), flush=True)
        if "traceback" in row:
            print(row["traceback"], file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
