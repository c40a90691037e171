"""How far a profile measured through ``gpugov emulate`` is from the profile the emulator ran.

The truth at a measured clock is the emulated plant's own model there: rates and powers
at the realised clock, the decode rate and power at the measured profile's reference batch
and context (through the truth's decode latency and batch-power models).
:func:`memory_bound_profile` is the synthetic shape unlike the bundled profiles that the
accuracy benchmark and tests check against (status ``synthetic``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gpugov.daemon.files import write_files_atomic
from gpugov.plant.profile import PerformanceProfile

COLUMNS = (
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "prefill_power_w",
    "decode_power_w",
    "idle_power_w",
)


def truth_row(truth: PerformanceProfile, clock_mhz: float, batch: int, context: int) -> dict:
    """The truth's five values at ``clock_mhz`` for decode at ``batch`` x ``context``."""
    realized = truth.realized_clock(clock_mhz)
    model = truth.decode_latency_model
    b_ref = model.reference_batch_size
    c_ref = b_ref * model.reference_context_tokens
    t_ref = b_ref / truth.rate("decode", realized)
    t = t_ref * (
        model.weight_fraction
        + model.batch_fraction * batch / b_ref
        + model.kv_fraction * batch * context / c_ref
    )
    idle = truth.power("idle", realized)
    factor = 1.0
    if truth.decode_power_batch_model is not None:
        factor = truth.decode_power_batch_model.factor(batch, b_ref)
    return {
        "prefill_tokens_per_s": truth.rate("prefill", realized),
        "decode_tokens_per_s": batch / t,
        "prefill_power_w": truth.power("prefill", realized),
        "decode_power_w": idle + (truth.power("decode", realized) - idle) * factor,
        "idle_power_w": idle,
    }


def compare(measured: PerformanceProfile, truth: PerformanceProfile) -> dict[str, Any]:
    """Relative errors ``measured / truth - 1`` per measured clock and column, with each
    clock's median and worst absolute error over the five columns."""
    engine = measured.manifest["engine"]
    batch = int(engine["reference_batch_size"])
    context = int(engine["reference_context_tokens"])
    clocks = measured.manifest.get("measured_clocks_mhz") or list(measured.clock_mhz)
    rows = []
    for clock in clocks:
        want = truth_row(truth, float(clock), batch, context)
        errors = {
            column: float(np.interp(clock, measured.clock_mhz, getattr(measured, column)))
            / want[column]
            - 1.0
            for column in COLUMNS
        }
        magnitudes = np.abs(list(errors.values()))
        rows.append(
            {
                "clock_mhz": int(clock),
                "errors": errors,
                "median_abs_error": float(np.median(magnitudes)),
                "worst_abs_error": float(np.max(magnitudes)),
            }
        )
    return {
        "rows": rows,
        "median_abs_error": float(np.median([r["median_abs_error"] for r in rows])),
        "worst_abs_error": float(np.max([r["worst_abs_error"] for r in rows])),
    }


# ---------------------------------------------- a shape unlike the bundled profiles
def memory_bound_profile(**overrides: Any) -> PerformanceProfile:
    """A shape unlike the bundled ones: clocks 600-1500 MHz in 30 MHz steps, a prefill
    rate that saturates, a flat memory-bound decode dominated by the KV read, a decode
    power that barely follows the clock, a high idle, and realised clocks below the
    requested ones at the top (as a power-limited board shows)."""
    clocks = np.arange(600.0, 1501.0, 30.0)
    x = clocks / clocks[-1]
    manifest: dict[str, Any] = {
        "status": "synthetic",
        "engine": {
            "reference_batch_size": 32,
            "reference_context_tokens": 2048,
            "max_batch_size": 128,
            "kv_capacity_tokens": 300_000,
        },
        "decode_latency_model": {
            "weight_fraction": 0.25,
            "batch_fraction": 0.05,
            "kv_fraction": 0.70,
        },
        "decode_power_batch_model": {"k": 0.8, "x0": 2.5},
        "clock_profile_selection": {
            "realized_clock_median_mhz_by_requested": {"1500.0": 1470.0, "1470.0": 1455.0}
        },
    }
    values = {
        "clock_mhz": clocks,
        "prefill_tokens_per_s": 30_000.0 * (1.0 - np.exp(-2.5 * x)),
        "decode_tokens_per_s": 2_500.0 * (0.97 + 0.03 * x),
        "prefill_power_w": 260.0 + 300.0 * x**1.5,
        "decode_power_w": 330.0 + 40.0 * x,
        "idle_power_w": 180.0 + 10.0 * x,
        "ttft_slo_s": 2.0,
        "tpot_slo_s": 0.08,
        "manifest": manifest,
        "name": "memory-bound",
    }
    values.update(overrides)
    return PerformanceProfile(**values)


def write_profile_files(profile: PerformanceProfile, directory: Path) -> Path:
    """``profile`` as a CSV + manifest ``gpugov emulate --profile PATH`` loads; the
    manifest path."""
    columns = (
        "clock_mhz",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "prefill_power_w",
        "decode_power_w",
        "idle_power_w",
    )
    csv = directory / f"{profile.name}.csv"
    rows = [",".join(columns)] + [
        ",".join(f"{value:.8g}" for value in values)
        for values in zip(*(getattr(profile, c) for c in columns), strict=True)
    ]
    manifest = dict(profile.manifest)
    manifest.update(
        {
            "csv": csv.name,
            "ttft_slo_s": profile.ttft_slo_s,
            "tpot_slo_s": profile.tpot_slo_s,
            "power_limit_w": 1000.0,
            "thermal": {
                "ambient_temperature_c": 30.0,
                "thermal_resistance_c_per_w": 0.05,
                "thermal_time_constant_s": 30.0,
                "thermal_limit_c": 95.0,
            },
        }
    )
    path = directory / f"{profile.name}.json"
    write_files_atomic({csv: "\n".join(rows) + "\n", path: json.dumps(manifest)})
    return path
