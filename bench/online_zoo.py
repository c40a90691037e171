"""One scoreboard controller alone on the scoreboard's scenarios (or the zoo's), priced
against the hindsight oracles, whose energies are computed once per scenario and cached.

`gpugov bench controllers` runs every row and both oracles on every scenario: 7 minutes for
the 30 default scenarios, about 45 for the zoo's 130 on 2 cores. A change to one controller
needs only its own rows again. This benchmark runs the maximum clock and the chosen
controllers (``--controllers``, default ``mpc-online``) exactly as the scoreboard builds
them (its scenarios, safety chain, periods and SLO target), and prices each against the
lower of the best fixed clock's and the window oracle's energy among those that hold the
SLO, as the scoreboard does, over the whole run and after the warm-up (where at least
``MIN_AFTER_WARMUP_SHARE`` of the maximum clock's energy falls after it). The oracle
energies are kept in ``--cache`` (keyed by scenario and the scoreboard's settings), so a
second run costs the controllers alone: about 2 minutes for the 30, 8 for the zoo.

    .venv/bin/python bench/online_zoo.py [--profiles all] [--controllers mpc-online]

Writes ``bench/results/online_zoo.json`` and prints one line per scenario and a summary
per controller (progress with an ETA on stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpugov.controllers.oracles import holds_slo, oracle_capture
from gpugov.daemon.cli_support import add_engine_view_argument, add_safety_arguments
from gpugov.daemon.progress import Progress
from gpugov.daemon.simulated import observation_view
from gpugov.plant import ServingPlant, chunked_prefill_scheduler, simulate
from gpugov.plant.synthetic_profiles import resolve_profile
from gpugov.study.online_eval import energy_after
from gpugov.study.scoreboard.command import expand_profiles
from gpugov.study.scoreboard.controllers import bench_controllers
from gpugov.study.scoreboard.run import (
    scenario_warmup_s,
    scoreboard_best_fixed,
    scoreboard_window_oracle,
    slo_energy_fields,
)
from gpugov.study.scoreboard.scenarios import FULL, LABELS, BenchConfig, build_scenario

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "online_zoo.json"
CACHE = ROOT / "bench" / "results" / "oracle_energies.json"

Cell = tuple[str, str, str, BenchConfig, tuple[str, ...], list[float] | None]
MIN_AFTER_WARMUP_SHARE = 0.1
"""Share of the maximum clock's energy that must fall after the warm-up for a capture
after it to be reported: a run whose arrivals end early drains in a few seconds past the
warm-up, and a capture over those seconds is a ratio of two small differences."""


def settings_key(config: BenchConfig) -> str:
    """What the oracle energies depend on besides the scenario: a short digest of the
    scoreboard's settings (a cache entry from other settings is not reused)."""
    fields = {
        key: getattr(config, key)
        for key in (
            "duration_s",
            "control_period_s",
            "seed",
            "tolerance",
            "oracle_window_s",
            "oracle_lookahead_s",
            "oracle_coarse_levels",
            "oracle_neighbour_steps",
            "best_fixed_coarse_points",
        )
    }
    # The warm-up the energies after it are taken from: the scoreboard's rule
    # (scenario_warmup_s), half the scenario's own length at most; an entry from the older
    # rule (half of --duration) is not reused.
    fields["warmup"] = "min(300 s, half the scenario)"
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def _oracle_energies(
    requests: Any, plant: ServingPlant, reference: Any, config: BenchConfig, warmup: float
) -> list[float] | None:
    """[whole run, after the warm-up] energy of the scoreboard's oracle (the lower of the
    hindsight oracles that hold), None when neither holds."""
    best = scoreboard_best_fixed(requests, plant, reference, config)
    oracle = scoreboard_window_oracle(requests, plant, reference, best, config)
    holding = [
        [result.metrics.energy_j, energy_after(result, warmup)]
        for result in (best.result, oracle.result)
        if holds_slo(
            result.metrics.slo_attainment, reference.metrics.slo_attainment, config.tolerance
        )
    ]
    return min(holding) if holding else None


def _capture(e_max: float, energy: float, oracle: float, holds: bool) -> float | None:
    """The scoreboard's oracle capture (:func:`controllers.oracles.oracle_capture`)."""
    return oracle_capture(e_max, energy, oracle, holds=holds)


def _capture_after_warmup(
    e_max: float, e_max_after: float, energy_after: float, oracle_after: float, holds: bool
) -> float | None:
    """The capture after the warm-up, or None where less than
    :data:`MIN_AFTER_WARMUP_SHARE` of the maximum clock's energy ``e_max`` falls after it."""
    if e_max_after < MIN_AFTER_WARMUP_SHARE * e_max:
        return None
    return _capture(e_max_after, energy_after, oracle_after, holds)


def run_cell(cell: Cell) -> dict[str, Any]:
    """The maximum clock, the oracle energies (unless cached) and ``keys`` on one scenario."""
    trace, profile_name, load, config, keys, cached = cell
    row: dict[str, Any] = {"scenario": f"{trace}|{profile_name}|{load}"}
    plant = ServingPlant.from_profile(resolve_profile(profile_name))
    try:
        scenario = build_scenario(trace, plant, load, config.duration_s)
    except Exception as error:  # a trace that does not load, a window with no requests
        row["error"] = str(error)
        return row
    requests = scenario.requests
    warmup = scenario_warmup_s(scenario)
    runs: dict[str, Any] = {}
    for entry in bench_controllers(plant, requests, config):
        if entry.key != "max" and entry.key not in keys:
            continue
        result = simulate(
            requests,
            plant,
            chunked_prefill_scheduler,
            entry.build(),
            config.seed,
            controller_name=entry.key,
            control_period_s=entry.control_period_s or config.control_period_s,
            view=observation_view(config.engine_view),
        )
        runs[entry.key] = result
    reference = runs.pop("max")
    oracle = (
        cached
        if cached is not None
        else _oracle_energies(requests, plant, reference, config, warmup)
    )
    row["oracle_energies_j"] = oracle
    e_max, e_max_after = reference.metrics.energy_j, energy_after(reference, warmup)
    row["controllers"] = {}
    for key, result in runs.items():
        # The scoreboard's own fields: saving, attainment and its change, the SLO condition.
        fields = slo_energy_fields(result.metrics, reference.metrics, config.tolerance)
        holds = bool(fields["holds_slo"])
        energy, after = result.metrics.energy_j, energy_after(result, warmup)
        row["controllers"][key] = {
            **fields,
            "oracle_capture": None if oracle is None else _capture(e_max, energy, oracle[0], holds),
            "oracle_capture_after_warmup": (
                None
                if oracle is None
                else _capture_after_warmup(e_max, e_max_after, after, oracle[1], holds)
            ),
        }
    return row


def summarise(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per controller: holds, median and mean capture (whole run, after the warm-up) and
    the median saving."""
    out = []
    ran = [row for row in rows if "error" not in row]
    for key in keys:
        runs = [row["controllers"][key] for row in ran]

        def values(name: str, runs: list[dict[str, Any]] = runs) -> list[float]:
            return [run[name] for run in runs if run[name] is not None]

        capture, after = values("oracle_capture"), values("oracle_capture_after_warmup")
        out.append(
            {
                "controller": key,
                "scenarios": len(runs),
                "holds_slo": sum(run["holds_slo"] for run in runs),
                "median_capture": statistics.median(capture) if capture else None,
                "mean_capture": statistics.fmean(capture) if capture else None,
                "median_capture_after_warmup": statistics.median(after) if after else None,
                "mean_capture_after_warmup": statistics.fmean(after) if after else None,
                "scenarios_after_warmup": len(after),
                "median_saved": statistics.median(values("energy_saved_fraction")),
            }
        )
    return out


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--profiles",
        nargs="+",
        default=list(FULL.profiles),
        help="profile names, 'all' for the zoo (default: the scoreboard's three)",
    )
    parser.add_argument(
        "--controllers",
        nargs="+",
        default=["mpc-online"],
        help="scoreboard controller keys priced against the oracles",
    )
    add_engine_view_argument(parser)
    add_safety_arguments(parser, prefix="every controller runs in the node's safety chain: ")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", default=str(CACHE), help="oracle energies, kept between runs")
    parser.add_argument("--out", default=str(OUT), help="output JSON")
    args = parser.parse_args(argv)
    try:
        config = replace(
            FULL,
            profiles=tuple(expand_profiles(args.profiles)),
            engine_view=args.engine_view,
            dwell_s=FULL.dwell_s if args.dwell is None else args.dwell,
            floor_mhz=args.floor,
        )
        for name in config.profiles:
            resolve_profile(name)
    except ValueError as error:
        print(f"error: --profiles: {error}", file=sys.stderr)
        return 2
    runnable = sorted(set(LABELS) - {"best-fixed", "window-oracle"})
    unknown = [key for key in args.controllers if key not in runnable]
    if unknown:
        print(
            f"error: --controllers: unknown {', '.join(map(repr, unknown))} (keys, space "
            f"separated: {', '.join(runnable)})",
            file=sys.stderr,
        )
        return 2
    keys = tuple(key for key in args.controllers if key != "max")
    cache_path = Path(args.cache)
    cache: dict[str, Any] = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    prefix = settings_key(config)
    cells: list[Cell] = [
        (trace, profile, load, config, keys, cache.get(f"{prefix}|{trace}|{profile}|{load}"))
        for trace, profile, load in config.scenario_specs()
    ]
    started = time.time()
    rows: list[dict[str, Any]] = []
    bar = Progress(len(cells), "online zoo", unit="scenarios")
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(run_cell, cells):
            rows.append(row)
            if row.get("oracle_energies_j") is not None:
                cache[f"{prefix}|{row['scenario']}"] = row["oracle_energies_j"]
            bar.update(len(rows), f"last {row['scenario']}")
    bar.close()
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path.write_text(json.dumps(cache, indent=1) + "\n")
    summary = summarise(rows, keys)
    result = {
        "benchmark": "online-zoo",
        "profiles": list(config.profiles),
        "controllers": list(keys),
        "engine_view": config.engine_view,
        "dwell_s": config.dwell_s,
        "floor_mhz": config.floor_mhz,
        "wall_s": time.time() - started,
        "rows": rows,
        "summary": summary,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for row in sorted(rows, key=lambda row: row["scenario"]):
        if "error" in row:
            print(f"{row['scenario']:<56} skipped: {row['error']}")
            continue
        for key in keys:
            run = row["controllers"][key]
            print(
                f"{row['scenario']:<56} {key} {'holds' if run['holds_slo'] else 'MISS '} "
                f"{run['slo_attainment_vs_max_pp'] or 0.0:+.2f} pt, saved "
                f"{100 * run['energy_saved_fraction']:5.1f}%, capture "
                f"{_number(run['oracle_capture'])} ({_number(run['oracle_capture_after_warmup'])} "
                "after warm-up)"
            )
    for line in summary:
        print(
            f"{line['controller']}: holds {line['holds_slo']}/{line['scenarios']}; capture median "
            f"{_number(line['median_capture'])}, mean {_number(line['mean_capture'])}; after the "
            f"warm-up median {_number(line['median_capture_after_warmup'])}, mean "
            f"{_number(line['mean_capture_after_warmup'])} ({line['scenarios_after_warmup']} "
            f"scenarios); median saved {100 * line['median_saved']:.1f}%"
        )
    print(f"wrote {out} in {result['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
