"""How far a profile measured through ``gpugov emulate`` is from the profile the emulator ran.

The truth at a measured clock is the emulated plant's own model there: rates and powers
at the realised clock, the decode rate and power at the measured profile's reference batch
and context (through the truth's decode latency and batch-power models).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
            / want[column] - 1.0
            for column in COLUMNS
        }
        magnitudes = np.abs(list(errors.values()))
        rows.append({
            "clock_mhz": int(clock),
            "errors": errors,
            "median_abs_error": float(np.median(magnitudes)),
            "worst_abs_error": float(np.max(magnitudes)),
        })
    return {
        "rows": rows,
        "median_abs_error": float(np.median([r["median_abs_error"] for r in rows])),
        "worst_abs_error": float(np.max([r["worst_abs_error"] for r in rows])),
    }
