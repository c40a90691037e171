"""Compare what the daemon read on a real GPU with what nvidia-smi read beside it.

Reads the folder ``bench/device_dry_run.sh`` wrote (``record.jsonl``, ``nvidia-smi.csv``,
``gpu_load.jsonl``, ``logs.txt``) and reports, per load phase, nvidia-smi's and the
daemon's power, SM clock and temperature (medians), the power from the daemon's energy
counter, and over the whole run how far the daemon's readings lie from nvidia-smi's at
the same instant. Writes ``bench/results/device_compare.json`` and prints a table.

    .venv/bin/python bench/device_compare.py DIR
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "device_compare.json"
SETTLE_S = 3.0  # a phase's first seconds, skipped (clocks and power settle)


def _utc(text: str, pattern: str) -> float:
    return dt.datetime.strptime(text, pattern).replace(tzinfo=dt.UTC).timestamp()


def read_smi(path: Path) -> np.ndarray:
    """nvidia-smi's rows: time, SM MHz, memory MHz, W, C, utilisation %, event reasons."""
    rows = []
    for line in path.read_text().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 7:
            continue
        time = _utc(parts[0], "%Y/%m/%d %H:%M:%S.%f")
        rows.append([time, *(float(part) for part in parts[1:6]), int(parts[6], 16)])
    return np.asarray(rows)


def read_record(directory: Path) -> dict[str, np.ndarray]:
    """The daemon's ticks, on the wall clock (its start taken from its log line)."""
    match = re.search(
        r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO gpugov: gpugov dry run",
        (directory / "logs.txt").read_text(),
    )
    if match is None:
        raise SystemExit(f"{directory / 'logs.txt'}: no 'gpugov dry run' start line")
    start = _utc(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    ticks = [json.loads(line) for line in (directory / "record.jsonl").open()][1:]

    def field(name: str) -> np.ndarray:
        return np.asarray([tick["observation"][name] for tick in ticks], dtype=float)

    return {
        "time": start + field("time_s"),
        "power_w": field("power_w"),
        "clock_mhz": field("realized_clock_mhz"),
        "temperature_c": field("temperature_c"),
        "energy_j": field("energy_j"),
        "decision_mhz": np.asarray([tick["decision_mhz"] for tick in ticks], dtype=float),
        "read_errors": np.asarray([len(tick["gpu_read_errors"]) for tick in ticks]),
        "failsafe": np.asarray([bool(tick["failsafe"]) for tick in ticks]),
    }


def compare(directory: Path) -> dict[str, Any]:
    """The phase table and the agreement figures."""
    smi = read_smi(directory / "nvidia-smi.csv")
    record = read_record(directory)
    phases = [json.loads(line) for line in (directory / "gpu_load.jsonl").open()]
    time = record["time"]
    rows = []
    for phase in phases:
        lo, hi = phase["start"] + SETTLE_S, phase["end"] - 1.0
        s = (smi[:, 0] >= lo) & (smi[:, 0] <= hi)
        r = np.flatnonzero((time >= lo) & (time <= hi))
        counter_w = (record["energy_j"][r[-1]] - record["energy_j"][r[0]]) / (
            time[r[-1]] - time[r[0]]
        )
        rows.append(
            {
                "phase": phase["phase"],
                "rate": phase.get("tflops") or phase.get("gb_per_s"),
                "smi_power_w": float(np.median(smi[s, 3])),
                "daemon_power_w": float(np.median(record["power_w"][r])),
                "daemon_energy_counter_w": float(counter_w),
                "smi_clock_mhz": float(np.median(smi[s, 1])),
                "daemon_clock_mhz": float(np.median(record["clock_mhz"][r])),
                "smi_temperature_c": float(np.median(smi[s, 4])),
                "daemon_temperature_c": float(np.median(record["temperature_c"][r])),
                "event_reasons": sorted({int(x) for x in smi[s, 6]}),
            }
        )
    before = smi[:, 0] < phases[0]["start"]
    inside = (time > smi[0, 0]) & (time < smi[-1, 0])
    power_error = record["power_w"][inside] - np.interp(time[inside], smi[:, 0], smi[:, 3])
    clock_error = record["clock_mhz"][inside] - np.interp(time[inside], smi[:, 0], smi[:, 1])
    span = (time[0] <= smi[:, 0]) & (smi[:, 0] <= time[-1])
    return {
        "ticks": int(time.size),
        "read_errors": int(record["read_errors"].sum()),
        "failsafe_ticks": int(record["failsafe"].sum()),
        "before_load_smi_power_w": float(np.median(smi[before, 3])),
        "before_load_smi_clock_mhz": float(np.median(smi[before, 1])),
        "run_energy_counter_mean_w": float(
            (record["energy_j"][-1] - record["energy_j"][0]) / (time[-1] - time[0])
        ),
        "run_smi_mean_w": float(smi[span, 3].mean()),
        "power_error_w": {
            q: float(np.percentile(power_error, p))
            for q, p in (("p5", 5), ("p50", 50), ("p95", 95))
        },
        "clock_within_15_mhz": float(np.mean(np.abs(clock_error) <= 15.0)),
        "phases": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Compare, print, write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("directory", help="the folder bench/device_dry_run.sh wrote")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    result = compare(Path(args.directory))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['ticks']} ticks, {result['read_errors']} read errors, "
        f"{result['failsafe_ticks']} fail-safe ticks; before the load "
        f"{result['before_load_smi_power_w']:.1f} W "
        f"at {result['before_load_smi_clock_mhz']:.0f} MHz"
    )
    print(
        f"mean power over the run: energy counter {result['run_energy_counter_mean_w']:.1f} W, "
        f"nvidia-smi {result['run_smi_mean_w']:.1f} W; daemon - nvidia-smi power p5/p50/p95 "
        "{p5:.1f}/{p50:.2f}/{p95:.1f} W".format(**result["power_error_w"])
        + f"; clock within 15 MHz {100 * result['clock_within_15_mhz']:.0f} % of ticks"
    )
    print(
        f"{'phase':<7} {'rate':>7} {'smi W':>7} {'daemon W':>8} {'counter W':>9} "
        f"{'smi MHz':>7} {'daemon MHz':>10} {'C':>5} reasons"
    )
    for row in result["phases"]:
        print(
            f"{row['phase']:<7} {row['rate'] or 0:7.0f} {row['smi_power_w']:7.1f} "
            f"{row['daemon_power_w']:8.1f} {row['daemon_energy_counter_w']:9.1f} "
            f"{row['smi_clock_mhz']:7.0f} {row['daemon_clock_mhz']:10.0f} "
            f"{row['smi_temperature_c']:5.0f} {row['event_reasons']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
