"""Bundled literature-derived profiles: loading, provenance, calibration, regeneration."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpugov.plant import roofline
from gpugov.plant.profile import (
    PerformanceProfile,
    ProfileError,
    bundled_profile_dir,
    list_bundled_profiles,
    load_profile,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLISHED_MAX_CLOCK_MHZ = {
    "h100-sxm-llama3-8b": 1980,
    "h200-sxm-llama3-8b": 1980,
    "a100-sxm-80gb-llama3-8b": 1410,
}
PUBLISHED_TDP_W = {
    "h100-sxm-llama3-8b": 700.0,
    "h200-sxm-llama3-8b": 700.0,
    "a100-sxm-80gb-llama3-8b": 400.0,
}
PUBLISHED_CONTEXT_IDLE_W = {"h100-sxm-llama3-8b": 121.7, "a100-sxm-80gb-llama3-8b": 80.0}
# Plausible aggregate decode rates at batch 64 and max clock for an 8B model (tokens/s).
DECODE_RATE_BAND = {
    "h100-sxm-llama3-8b": (3000.0, 9000.0),
    "h200-sxm-llama3-8b": (4000.0, 12000.0),
    "a100-sxm-80gb-llama3-8b": (1500.0, 5000.0),
}
NAMES = sorted(PUBLISHED_MAX_CLOCK_MHZ)


@pytest.fixture(scope="module", params=NAMES)
def bundled(request: pytest.FixtureRequest) -> PerformanceProfile:
    return load_profile(request.param)


def energy_per_token(power_w: np.ndarray, rate: np.ndarray) -> np.ndarray:
    return power_w / rate


# ------------------------------------------------------------------ loading, status
def test_list_bundled_profiles_has_all_three_literature_derived() -> None:
    rows = {row["name"]: row for row in list_bundled_profiles()}
    assert set(NAMES) <= set(rows)
    for name in NAMES:
        assert rows[name]["status"] == "literature-derived"
        assert rows[name]["model"].startswith("Llama-3.1-8B-Instruct")


def test_status_is_literature_derived_never_measured(bundled: PerformanceProfile) -> None:
    assert bundled.profile_status == "literature-derived"
    assert not bundled.is_measured
    assert not bundled.measurement_validated
    assert "literature-derived" in bundled.source_label
    manifest = bundled.manifest
    assert "not measured" in manifest["warning"]
    assert "clock_profile_selection" not in manifest
    assert manifest["thermal_fit_r_squared"] is None


def test_manifest_provenance(bundled: PerformanceProfile) -> None:
    manifest = bundled.manifest
    for key in ("name", "gpu", "model", "csv", "idle_clock_mhz", "max_memory_clock_mhz"):
        assert manifest[key], key
    assert manifest["name"] == bundled.name
    assert manifest["derivation"]["generator"].startswith("plant/roofline.py v")
    assert manifest["derivation"]["parameters"]
    assert manifest["assumptions"]
    assert all(isinstance(item, str) and item for item in manifest["assumptions"])
    sources = manifest["sources"]
    assert any(source["source"].startswith("PROFILE_FACTS.md:") for source in sources)
    for source in sources:
        assert set(source) == {"quantity", "value", "source"}
        assert all(source.values())
        assert source["source"].startswith("PROFILE_FACTS.md:") or (
            "not from PROFILE_FACTS" in source["source"]
        )


def test_load_by_csv_path_gives_the_same_profile(bundled: PerformanceProfile) -> None:
    by_path = load_profile(bundled_profile_dir() / f"{bundled.name}.csv")
    assert by_path.profile_csv_sha256 == bundled.profile_csv_sha256
    assert by_path.manifest_sha256 == bundled.manifest_sha256


# ------------------------------------------------------------------------ clocks
def test_clocks_on_15_mhz_grid_ending_at_published_max(bundled: PerformanceProfile) -> None:
    clocks = bundled.clock_mhz
    assert bundled.maximum_clock_mhz == PUBLISHED_MAX_CLOCK_MHZ[bundled.name]
    assert np.all(np.diff(clocks) == 15.0)
    assert np.all(clocks == np.round(clocks))
    assert bundled.manifest["clock_step_mhz"] == 15
    assert bundled.manifest["clock_range_mhz"] == [clocks[0], clocks[-1]]


# ------------------------------------------------------------------- calibration
def test_rates_plausible_for_8b(bundled: PerformanceProfile) -> None:
    low, high = DECODE_RATE_BAND[bundled.name]
    assert low < bundled.decode_tokens_per_s[-1] < high
    assert 8_000.0 < bundled.prefill_tokens_per_s[-1] < 80_000.0
    assert np.all(np.diff(bundled.decode_tokens_per_s) > 0.0)
    assert np.all(np.diff(bundled.prefill_tokens_per_s) > 0.0)


def test_decode_weakly_and_prefill_proportionally_clock_dependent(
    bundled: PerformanceProfile,
) -> None:
    decode = bundled.decode_tokens_per_s
    assert 0.70 <= decode[0] / decode[-1] <= 0.90
    prefill_per_mhz = bundled.prefill_tokens_per_s / bundled.clock_mhz
    np.testing.assert_allclose(prefill_per_mhz, prefill_per_mhz[-1], rtol=1e-3)


def test_h100_over_a100_matches_splitwise_ratios() -> None:
    h100 = load_profile("h100-sxm-llama3-8b")
    a100 = load_profile("a100-sxm-80gb-llama3-8b")
    compute = h100.prefill_tokens_per_s[-1] / a100.prefill_tokens_per_s[-1]
    bandwidth = h100.decode_tokens_per_s[-1] / a100.decode_tokens_per_s[-1]
    assert compute == pytest.approx(3.43, rel=0.15)
    assert bandwidth == pytest.approx(1.64, rel=0.15)


def test_h200_vs_h100_same_compute_more_bandwidth() -> None:
    h100 = load_profile("h100-sxm-llama3-8b")
    h200 = load_profile("h200-sxm-llama3-8b")
    np.testing.assert_allclose(h200.prefill_tokens_per_s, h100.prefill_tokens_per_s)
    assert np.all(h200.decode_tokens_per_s > h100.decode_tokens_per_s)


def test_energy_per_token_is_u_shaped(bundled: PerformanceProfile) -> None:
    for power, rate in (
        (bundled.decode_power_w, bundled.decode_tokens_per_s),
        (bundled.prefill_power_w, bundled.prefill_tokens_per_s),
    ):
        energy = energy_per_token(power, rate)
        best = int(np.argmin(energy))
        assert 0 < best < energy.size - 1
        assert energy[-1] > energy[best] * 1.05
        assert energy[0] > energy[best]


def test_powers_ordered_and_below_tdp(bundled: PerformanceProfile) -> None:
    tdp = PUBLISHED_TDP_W[bundled.name]
    assert bundled.manifest["power_limit_w"] == tdp
    assert 0.8 * tdp <= bundled.prefill_power_w[-1] <= tdp
    assert bundled.decode_power_w[-1] < 0.5 * tdp
    for table in (bundled.prefill_power_w, bundled.decode_power_w, bundled.idle_power_w):
        assert np.all(table <= tdp)
        assert np.all(np.diff(table) > 0.0)
    assert np.all(bundled.idle_power_w < bundled.decode_power_w)
    assert np.all(bundled.idle_power_w < bundled.prefill_power_w)
    idle = bundled.idle_power_w
    assert 0.8 <= idle[0] / idle[-1] < 1.0


def test_idle_at_max_clock_is_the_published_figure() -> None:
    for name, published in PUBLISHED_CONTEXT_IDLE_W.items():
        assert load_profile(name).idle_power_w[-1] == pytest.approx(published, abs=0.005)


def test_h200_decode_power_within_published_range() -> None:
    h200 = load_profile("h200-sxm-llama3-8b")
    assert np.all(h200.decode_power_w >= 137.0)
    assert np.all(h200.decode_power_w <= 300.0)


def test_decode_latency_model_is_consistent(bundled: PerformanceProfile) -> None:
    model = bundled.decode_latency_model
    parts = (model.weight_fraction, model.batch_fraction, model.kv_fraction)
    assert all(part > 0.0 for part in parts)
    assert sum(parts) == pytest.approx(1.0, abs=1e-6)
    assert model.reference_batch_size == bundled.manifest["engine"]["reference_batch_size"]
    assert model.reference_context_tokens == 1260
    # Memory-bound: the weight and KV reads dominate the iteration.
    assert model.batch_fraction < 0.2


def test_decode_power_batch_model_reproduces_ml_energy_anchors(
    bundled: PerformanceProfile,
) -> None:
    model = bundled.decode_power_batch_model
    assert model is not None
    reference = bundled.decode_latency_model.reference_batch_size
    assert model.factor(reference, reference) == pytest.approx(1.0)
    # (300 - 121.7) / (600 - 121.7): the H100 batch-1 and batch-128 rises above idle.
    ratio = model.factor(1, reference) / model.factor(128, reference)
    assert ratio == pytest.approx((300.0 - 121.7) / (600.0 - 121.7), rel=1e-4)
    assert model.factor(256, reference) > model.factor(128, reference) > 1.0


def test_engine_and_slos(bundled: PerformanceProfile) -> None:
    engine = bundled.manifest["engine"]
    assert engine["max_batch_size"] == 256
    capacity = engine["kv_capacity_tokens"]
    assert capacity >= engine["max_batch_size"] * engine["reference_context_tokens"]
    hbm_gb = 141.0 if bundled.name.startswith("h200") else 80.0
    expected = (hbm_gb * 1e9 * 0.9 - 2 * 8_030_261_248 - 2e9) / 131072
    assert capacity == pytest.approx(expected, abs=1.0)
    # The reference batch meets the TPOT SLO at every clock.
    tpot_s = engine["reference_batch_size"] / bundled.decode_tokens_per_s
    assert np.all(tpot_s < bundled.tpot_slo_s)
    assert 0.0 < bundled.tpot_slo_s < bundled.ttft_slo_s


def test_thermal_steady_state_at_tdp_below_limit(bundled: PerformanceProfile) -> None:
    thermal = bundled.manifest["thermal"]
    steady_c = (
        thermal["ambient_temperature_c"]
        + thermal["thermal_resistance_c_per_w"] * bundled.manifest["power_limit_w"]
    )
    assert thermal["thermal_limit_c"] - 10.0 < steady_c < thermal["thermal_limit_c"]
    assert thermal["thermal_time_constant_s"] > 0.0


# ------------------------------------------------------------------ regeneration
def test_bundled_files_are_exactly_what_the_generator_writes(tmp_path: Path) -> None:
    assert roofline.main(["--out", str(tmp_path)]) == 0
    generated = sorted(path.name for path in tmp_path.iterdir())
    assert generated == sorted(f"{name}.{ext}" for name in NAMES for ext in ("csv", "json"))
    for file_name in generated:
        bundled_bytes = (bundled_profile_dir() / file_name).read_bytes()
        assert (tmp_path / file_name).read_bytes() == bundled_bytes, file_name


def test_generator_runs_as_a_module(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "gpugov.plant.roofline", "--out", str(tmp_path), "--only", NAMES[0]],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    name = f"{NAMES[0]}.csv"
    assert (tmp_path / name).read_bytes() == (bundled_profile_dir() / name).read_bytes()


def test_logistic_fit_has_closed_form_solution() -> None:
    params = roofline.RooflineParameters()
    k, x0 = roofline.fit_decode_power_batch_model(params)

    def sigmoid(x: float) -> float:
        return 1.0 / (1.0 + np.exp(-k * (x - x0)))

    assert sigmoid(7.0) == pytest.approx(params.logistic_saturation_at_batch128)
    assert sigmoid(0.0) / sigmoid(7.0) == pytest.approx((300.0 - 121.7) / (600.0 - 121.7))


# -------------------------------------------------------------- broken copies
@pytest.fixture
def copy_of_h100(tmp_path: Path) -> tuple[Path, Path]:
    name = "h100-sxm-llama3-8b"
    csv_path = tmp_path / f"{name}.csv"
    json_path = tmp_path / f"{name}.json"
    shutil.copyfile(bundled_profile_dir() / f"{name}.csv", csv_path)
    shutil.copyfile(bundled_profile_dir() / f"{name}.json", json_path)
    return csv_path, json_path


def _rewrite_cell(csv_path: Path, line_number: int, column: str, value: str) -> None:
    lines = csv_path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[line_number - 1].split(",")
    cells[header.index(column)] = value
    lines[line_number - 1] = ",".join(cells)
    csv_path.write_text("\n".join(lines) + "\n")


def test_copy_loads_unchanged(copy_of_h100: tuple[Path, Path]) -> None:
    _, json_path = copy_of_h100
    assert load_profile(json_path).name == "h100-sxm-llama3-8b"


def test_missing_column_names_the_csv(copy_of_h100: tuple[Path, Path]) -> None:
    csv_path, json_path = copy_of_h100
    rows = [line.split(",") for line in csv_path.read_text().splitlines()]
    drop = rows[0].index("decode_power_w")
    csv_path.write_text("\n".join(",".join(r[:drop] + r[drop + 1 :]) for r in rows) + "\n")
    with pytest.raises(ProfileError, match="missing column") as error:
        load_profile(json_path)
    assert str(csv_path) in str(error.value)
    assert "decode_power_w" in str(error.value)


def test_non_numeric_cell_names_file_and_line(copy_of_h100: tuple[Path, Path]) -> None:
    csv_path, json_path = copy_of_h100
    _rewrite_cell(csv_path, 5, "decode_tokens_per_s", "fast")
    with pytest.raises(ProfileError, match="not a number") as error:
        load_profile(json_path)
    assert f"{csv_path}:5" in str(error.value)
    assert "decode_tokens_per_s" in str(error.value)


def test_non_ascending_clocks_name_file_and_line(copy_of_h100: tuple[Path, Path]) -> None:
    csv_path, json_path = copy_of_h100
    lines = csv_path.read_text().splitlines()
    lines[2], lines[3] = lines[3], lines[2]  # swap the rows on lines 3 and 4
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match="ascending") as error:
        load_profile(json_path)
    assert f"{csv_path}:4" in str(error.value)


def test_negative_power_names_file_and_line(copy_of_h100: tuple[Path, Path]) -> None:
    csv_path, json_path = copy_of_h100
    _rewrite_cell(csv_path, 7, "idle_power_w", "-5.0")
    with pytest.raises(ProfileError, match="must be positive") as error:
        load_profile(json_path)
    assert f"{csv_path}:7" in str(error.value)
    assert "idle_power_w" in str(error.value)


@pytest.mark.parametrize("key", ["status", "csv", "tpot_slo_s", "power_limit_w", "thermal"])
def test_missing_manifest_key_names_the_manifest(copy_of_h100: tuple[Path, Path], key: str) -> None:
    _, json_path = copy_of_h100
    manifest = json.loads(json_path.read_text())
    del manifest[key]
    json_path.write_text(json.dumps(manifest))
    with pytest.raises(ProfileError, match=key) as error:
        load_profile(json_path)
    assert str(json_path) in str(error.value)


def test_missing_thermal_key_names_the_manifest(copy_of_h100: tuple[Path, Path]) -> None:
    _, json_path = copy_of_h100
    manifest = json.loads(json_path.read_text())
    del manifest["thermal"]["thermal_limit_c"]
    json_path.write_text(json.dumps(manifest))
    with pytest.raises(ProfileError, match="thermal_limit_c") as error:
        load_profile(json_path)
    assert str(json_path) in str(error.value)


def test_malformed_json_names_the_manifest(copy_of_h100: tuple[Path, Path]) -> None:
    _, json_path = copy_of_h100
    text = json_path.read_text()
    json_path.write_text(text[: len(text) // 2])
    with pytest.raises(ProfileError, match="not valid JSON") as error:
        load_profile(json_path)
    assert str(json_path) in str(error.value)
