"""Turn the sweep's clock records into a profile in the bundled schema (CSV + manifest).

Rows: every supported clock between the lowest and highest measured clock; a measured
clock's row holds its measurements, the rows between are linear interpolations (the plant
interpolates linearly anyway), listed in the manifest's ``measured_clocks_mhz``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpugov import __version__
from gpugov.daemon.files import write_files_atomic
from gpugov.plant.profile import CSV_COLUMNS, DEFAULT_MAX_BATCH_SIZE, ProfileError
from gpugov.plant.profile_files import load_profile
from gpugov.study.profiler.fit import clock_fit, fit_decode, fit_thermal
from gpugov.study.profiler.measure import ProfileRunError


def clock_rows(
    records: Sequence[dict[str, Any]], reference_batch: int, reference_context: int
) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
    """Per measured clock: the CSV values, and the per-clock fit diagnostics."""
    rows = []
    fits = []
    for record in records:
        points = [(p["batch"], p["context_tokens"], p["iteration_s"]) for p in record["decode"]]
        decode = fit_decode(points)
        t_ref = decode.iteration_s(reference_batch, reference_batch * reference_context)
        if t_ref <= 0:
            raise ProfileRunError(f"{record['clock_mhz']} MHz: decode fit gave no positive time")
        at_reference = [p for p in record["decode"] if p["batch"] == reference_batch]
        powered = [p for p in record["decode"] if p["power_w"]]
        if at_reference and at_reference[0]["power_w"]:
            decode_power = at_reference[0]["power_w"]
        elif powered:
            nearest = min(powered, key=lambda p: abs(np.log2(p["batch"] / reference_batch)))
            decode_power = nearest["power_w"]
        else:
            raise ProfileRunError(f"{record['clock_mhz']} MHz: no power reading while decoding")
        prefill = record["prefill"]
        for name, value in (("idle", record["idle_power_w"]), ("prefill", prefill["power_w"])):
            if not value:
                raise ProfileRunError(f"{record['clock_mhz']} MHz: no {name} power reading")
        rows.append(
            {
                "clock_mhz": float(record["clock_mhz"]),
                "prefill_tokens_per_s": float(prefill["tokens_per_s"]),
                "decode_tokens_per_s": reference_batch / t_ref,
                "prefill_power_w": float(prefill["power_w"]),
                "decode_power_w": float(decode_power),
                "idle_power_w": float(record["idle_power_w"]),
            }
        )
        fits.append(
            {
                "clock_mhz": record["clock_mhz"],
                "realized_clock_mhz": record["realized_clock_mhz"],
                "prefill_slope_r_squared": prefill["r_squared"],
                "decode_model": {
                    "alpha_s": decode.alpha_s,
                    "beta_s_per_sequence": decode.beta_s,
                    "gamma_s_per_context_token": decode.gamma_s,
                    "r_squared": decode.r_squared,
                },
                "decode_fractions": list(decode.fractions(reference_batch, reference_context)),
            }
        )
    return rows, fits


def _interpolated(rows: list[dict[str, float]], supported: Sequence[int]) -> list[dict[str, float]]:
    rows = sorted(rows, key=lambda r: r["clock_mhz"])
    measured = np.array([r["clock_mhz"] for r in rows])
    grid = sorted(
        {int(c) for c in supported if measured[0] <= c <= measured[-1]} | {int(c) for c in measured}
    )
    out = []
    for clock in grid:
        row = {"clock_mhz": float(clock)}
        for column in CSV_COLUMNS[1:]:
            row[column] = float(np.interp(clock, measured, [r[column] for r in rows]))
        out.append(row)
    return out


def write_profile(
    records: Sequence[dict[str, Any]],
    out_dir: Path,
    *,
    name: str,
    status: str,
    gpu_name: str,
    model: str,
    supported_clocks: Sequence[int],
    power_limit_w: float,
    settings: dict[str, Any],
    command: str,
    ttft_slo_s: float,
    tpot_slo_s: float,
    kv_capacity_tokens: int | None,
    backend: str,
    tensor_parallel: int = 1,
    power_limit_read: bool = True,
) -> Path:
    """Write ``DIR/NAME.csv`` and ``DIR/NAME.json``; return the manifest path (loadable
    by ``load_profile`` and usable as ``mpc:PATH``).

    Raises:
        ProfileRunError: fewer than two clocks measured, or a measurement is missing.
    """
    if len(records) < 2:
        raise ProfileRunError(
            f"a profile needs at least two measured clocks, the sweep has {len(records)}"
        )
    reference_batch = int(settings["reference_batch"])
    reference_context = int(settings["reference_context_tokens"])
    rows, fits = clock_rows(records, reference_batch, reference_context)
    table = _interpolated(rows, supported_clocks)
    csv_path = out_dir / f"{name}.csv"
    csv_text = io.StringIO(newline="")
    writer = csv.writer(csv_text)
    writer.writerow(CSV_COLUMNS)
    for row in table:
        writer.writerow([int(row["clock_mhz"])] + [f"{row[c]:.6g}" for c in CSV_COLUMNS[1:]])
    top = max(fits, key=lambda f: f["clock_mhz"])
    weight, batch_share, kv_share = (max(0.0, v) for v in top["decode_fractions"])
    share_total = weight + batch_share + kv_share
    thermal_fit = fit_thermal([r["thermal"] for r in records])
    measured_clocks = sorted(int(r["clock_mhz"]) for r in records)
    by_clock = sorted(rows, key=lambda r: r["clock_mhz"])
    clock_fits = {
        column: clock_fit([r["clock_mhz"] for r in by_clock], [r[column] for r in by_clock])
        for column in CSV_COLUMNS[1:]
    }
    thermal_limit = 87.0
    if thermal_fit is not None:
        thermal = {
            "ambient_temperature_c": round(thermal_fit.ambient_temperature_c, 3),
            "thermal_resistance_c_per_w": round(thermal_fit.thermal_resistance_c_per_w, 6),
            "thermal_time_constant_s": round(thermal_fit.thermal_time_constant_s, 3),
            "thermal_limit_c": thermal_limit,
        }
        thermal_note = (
            f"Thermal RC fitted on {thermal_fit.duration_s:.0f} s of readings spanning "
            f"{thermal_fit.temperature_span_c:.1f} C (R^2 {thermal_fit.r_squared:.3f})."
        )
    else:
        # A neutral RC whose steady state at the (summed) power limit stays under the
        # thermal limit, as `gpugov model export` writes: one GPU's 0.07 C/W against the
        # summed powers of an 8-GPU domain put its idle over 87 C, and the written profile
        # was refused by the loader at the end of the sweep.
        thermal = {
            "ambient_temperature_c": 30.0,
            "thermal_resistance_c_per_w": round((thermal_limit - 30.0) / (1.1 * power_limit_w), 9),
            "thermal_time_constant_s": 30.0,
            "thermal_limit_c": thermal_limit,
        }
        thermal_note = (
            "Thermal RC not fitted (the run was under 60 s of readings or the temperature "
            "moved under 3 C): the thermal section holds generic defaults, not measurements "
            "(a resistance that puts the power limit's steady state under the thermal limit)."
        )
    engine: dict[str, Any] = {
        "reference_batch_size": reference_batch,
        "reference_context_tokens": reference_context,
        # vLLM's default max_num_seqs, or the batch measured where that is larger (the
        # engine ran it): a profile's reference batch is within its batch bound.
        "max_batch_size": max(DEFAULT_MAX_BATCH_SIZE, int(reference_batch)),
    }
    if kv_capacity_tokens:
        engine["kv_capacity_tokens"] = int(kv_capacity_tokens)
    warning = (
        "Measured on real hardware by gpugov profile."
        if status == "measured"
        else "Measured through gpugov emulate (an emulated engine or GPU backed by the "
        "simulated plant), not on hardware: it tests the profiler, it says nothing about a "
        "real GPU."
    )
    manifest: dict[str, Any] = {
        "name": name,
        "gpu": gpu_name,
        "model": model,
        "status": status,
        "warning": warning,
        "csv": csv_path.name,
        "clock_range_mhz": [measured_clocks[0], measured_clocks[-1]],
        "measured_clocks_mhz": measured_clocks,
        "ttft_slo_s": ttft_slo_s,
        "tpot_slo_s": tpot_slo_s,
        "power_limit_w": power_limit_w,
        "tensor_parallel": max(1, int(tensor_parallel)),
        "thermal": thermal,
        "thermal_fit_r_squared": None if thermal_fit is None else thermal_fit.r_squared,
        "engine": engine,
        "decode_latency_model": {
            "weight_fraction": round(weight / share_total, 6),
            "batch_fraction": round(batch_share / share_total, 6),
            "kv_fraction": round(
                1.0 - round(weight / share_total, 6) - round(batch_share / share_total, 6), 6
            ),
        },
        "clock_profile_selection": {
            "realized_clock_median_mhz_by_requested": {
                str(f["clock_mhz"]): f["realized_clock_mhz"]
                for f in fits
                if f["realized_clock_mhz"] is not None
            },
        },
        "fits": {"per_clock": fits, "across_clocks": clock_fits},
        "assumptions": [
            "Rows between measured clocks are linear interpolations of the measured rows.",
            "Powers are summed over the profiled GPUs; instant power only where the energy "
            "counter window was too short.",
            "decode_power_w is measured at the reference batch; decode power's batch "
            "dependence is not modelled (no decode_power_batch_model).",
            "Decode latency fractions are the shares at the highest measured clock.",
            f"SLOs (TTFT {ttft_slo_s:g} s, TPOT {tpot_slo_s:g} s) are the operator's "
            "choice (--ttft-slo/--tpot-slo), not measurements.",
            "thermal_limit_c 87 C is a typical data-center board limit, not read from the GPU.",
            f"max_batch_size {engine['max_batch_size']} is vLLM's default max_num_seqs (256) "
            "or the reference batch where that is larger, not read from the engine.",
            thermal_note,
            *(
                []
                if power_limit_read
                else [
                    f"power_limit_w {power_limit_w:g} W assumes 700 W per GPU: the GPU gave "
                    "no power limit reading."
                ]
            ),
        ],
        "derivation": {
            "generator": f"gpugov profile {__version__}",
            "command": command,
            "backend": backend,
            "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "settings": settings,
        },
        "measurements": [
            {k: v for k, v in r.items() if k not in ("thermal", "kind")} for r in records
        ],
    }
    manifest_path = out_dir / f"{name}.json"
    files = {csv_path: csv_text.getvalue(), manifest_path: json.dumps(manifest, indent=2) + "\n"}
    # Both files at once: a failure midway (a full disk, Ctrl-C) leaves an earlier CSV
    # and manifest of that name whole, never a corrupt profile.
    checked = _check_loads(files, manifest_path)  # it must load: fail here, not later
    write_files_atomic(files)
    if not checked:
        load_profile(manifest_path)
    return manifest_path


def _check_loads(files: dict[Path, str], manifest_path: Path) -> bool:
    """Load the profile from a scratch copy before it is written: one the loader refuses
    replaced an earlier profile of that name and stayed behind, unloadable. False where
    no scratch copy could be written (a full disk): the real write then says why, or the
    profile is loaded once written.

    Raises:
        ProfileRunError: the loader's refusal, naming the manifest's real path.
    """
    try:
        scratch_dir = tempfile.TemporaryDirectory(prefix="gpugov-profile-")
    except OSError:  # no writable temporary directory
        return False
    with scratch_dir as scratch:
        try:
            for path, text in files.items():
                (Path(scratch) / path.name).write_text(text)
        except OSError:
            return False
        try:
            load_profile(Path(scratch) / manifest_path.name)
        except ProfileError as error:
            message = str(error).replace(str(Path(scratch)), str(manifest_path.parent))
            raise ProfileRunError(
                f"{message}; the profile was not written (the sweep state is kept)"
            ) from None
    return True
