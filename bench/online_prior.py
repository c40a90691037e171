"""What a config hint (GPU name, parameter count, TP degree) buys ``mpc-online``.

Runs the known-answer experiments of ``tests/controllers/test_online_prior.py`` over more
seeds and reports them:

* **convergence**: windows until the learned decode iteration time is within 15 % of the
  truth at every supported clock, on Mixtral-8x7B over 4 A100s (the plant's roofline, a
  domain the project does not bundle), with no hint, the right hint and two badly wrong
  ones (wrong family and 10x / 1/10 the parameters); the clocks follow safe exploration's
  pattern (warm-up at the top, one step down per 5 windows, then anywhere);
* **closed loop**: SLO attainment and energy saved against the maximum clock on two
  synthetic plants of shapes unlike the bundled ones, with no hint and two wrong hints.

    .venv/bin/python bench/online_prior.py [--seeds 12]

Writes ``bench/results/online_prior.json`` and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "online_prior.json"
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "controllers")]

import test_online_prior as experiments  # noqa: E402  (the tests' helpers)

from gpugov.controllers.online.prior import prior_from_hints  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run both experiments and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12, help="seeds of the convergence runs")
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    args = parser.parse_args(argv)
    cases = {"no hint": None, "right hint": prior_from_hints(experiments.RIGHT)}
    cases.update({name: prior_from_hints(h) for name, h in experiments.WRONG.items()})
    convergence = {}
    for name, prior in cases.items():
        runs = [experiments._windows_to_tolerance(prior, seed) for seed in range(args.seeds)]
        reached = [r for r, _ in runs]
        done = [r for r in reached if r is not None]
        convergence[name] = {
            "windows_to_tolerance": reached,
            "median_windows": float(np.median(done)) if done else None,
            "not_reached": len(reached) - len(done),
            "final_error_max": max(float(f) for _, f in runs),
        }
        print(
            f"{name:32s} median {convergence[name]['median_windows']} windows to "
            f"{experiments.TOLERANCE:.0%} (not reached {convergence[name]['not_reached']}"
            f"/{args.seeds}), final error <= {convergence[name]['final_error_max']:.3f}"
        )
    closed = {}
    for plant in sorted(experiments.PLANTS):
        top = experiments.simulate(
            experiments._poisson(2.0, 180.0, seed=31),
            experiments.PLANTS[plant](),
            experiments.chunked_prefill_scheduler,
            experiments.maximum_clock_controller,
            0,
        )
        for hint in [None, *sorted(experiments.HINTS)]:
            prior = None if hint is None else prior_from_hints(experiments.HINTS[hint])
            result, controller = experiments._closed_loop(plant, prior)
            row = {
                "slo_attainment": result.metrics.slo_attainment,
                "max_clock_slo_attainment": top.metrics.slo_attainment,
                "energy_saved": 1.0 - result.metrics.energy_j / top.metrics.energy_j,
                "lowest_clock_mhz": float(np.min(result.requested_clock_mhz)),
                "backoffs": controller.exploration.backoffs,
            }
            closed[f"{plant} / {hint or 'no hint'}"] = row
            print(
                f"{plant:22s} {hint or 'no hint':24s} SLO {row['slo_attainment']:.4f} "
                f"(max clock {row['max_clock_slo_attainment']:.4f}), saved "
                f"{row['energy_saved']:.1%}, lowest {row['lowest_clock_mhz']:.0f} MHz"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "tolerance": experiments.TOLERANCE,
                "seeds": args.seeds,
                "convergence": convergence,
                "closed_loop": closed,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
