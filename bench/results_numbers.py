"""Print the derived figures docs/results.md cites, read from `gpugov experiments` outputs.

Run after ``gpugov experiments --out results/bundled`` and
``gpugov experiments --trace azure-conv --out results/azure-conv``:
``python bench/results_numbers.py bundled azure-conv`` (folders under ``results/``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def report(folder: Path) -> None:
    """Print one run's energy shares, attainments, mean clocks and FQI return ratios."""
    r = json.loads((folder / "results.json").read_text())
    c = r["mpc"]["controllers"]
    m = {k: v["metrics"] for k, v in c.items()}
    e = {k: v["energy_j"] for k, v in m.items()}
    profile = r["metadata"]["profile"]
    digest = profile["manifest_sha256"][:12]
    print(f"== {folder.name}: profile {profile['name']}, manifest {digest}")
    print(
        f"mpc energy vs reactive {1 - e['mpc-slsqp'] / e['reactive']:.1%}, "
        f"vs max {1 - e['mpc-slsqp'] / e['max']:.1%}; "
        f"reactive vs max {1 - e['reactive'] / e['max']:.1%}"
    )
    for k in ("mpc-slsqp", "open-loop"):
        print(
            f"{k}: TTFT attainment {m[k]['ttft_slo_attainment']:.1%}, "
            f"TPOT attainment {m[k]['tpot_slo_attainment']:.1%}, SLO {m[k]['slo_attainment']:.1%}"
        )
    for label, run in r["open_loop"]["controllers"].items():
        clocks = np.array(run["realized_clock_mhz"])
        print(f"open-loop {label}: mean realised clock {np.mean(clocks):.0f} MHz")
    clocks = np.array(c["mpc-slsqp"]["realized_clock_mhz"])
    floor = profile["minimum_clock_mhz"]
    print(
        f"mpc mean realised clock {np.mean(clocks):.0f} MHz; "
        f"share of samples at the floor {np.mean(clocks <= floor):.0%}"
    )
    q = r["fqi"]["metrics"]
    dp = q["exact_dp"]["mean_discounted_return"]
    print(
        f"broad FQI return {q['broad_fqi']['mean_discounted_return'] / dp - 1:.1%} below DP; "
        f"narrow FQI return {q['narrow_fqi']['mean_discounted_return'] / dp:.1f}x DP's"
    )


def main(argv: list[str]) -> int:
    """Report every named folder under results/ (exit 2 naming a missing results.json)."""
    parser = argparse.ArgumentParser(prog="bench/results_numbers.py", description=__doc__)
    parser.add_argument("runs", nargs="+", help="folders under results/")
    for name in parser.parse_args(argv).runs:
        folder = Path("results") / name
        if not (folder / "results.json").is_file():
            print(f"results_numbers: error: {folder}/results.json: not found", file=sys.stderr)
            return 2
        report(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
