"""Bundled literature-derived profiles (the zoo): loading, provenance, calibration, regeneration."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpugov.plant import calibration, roofline, zoo
from gpugov.plant.decode_check import decode_check
from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import CSV_COLUMNS, PerformanceProfile, ProfileError
from gpugov.plant.profile_files import bundled_profile_dir, list_bundled_profiles, load_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(zoo.PROFILES)
ORIGINAL_THREE = ("h100-sxm-llama3-8b", "h200-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b")
PUBLISHED_MAX_CLOCK_MHZ = {"H100": 1980, "H200": 1980, "A100": 1410, "B200": 1965}
PUBLISHED_TDP_W = {"H100": 700.0, "H200": 700.0, "A100": 400.0, "L40S": 350.0, "L4": 72.0}
PUBLISHED_CONTEXT_IDLE_W = {"H100": 121.7, "A100": 80.0, "L40S": 102.1}


@pytest.fixture(scope="module", params=NAMES)
def bundled(request: pytest.FixtureRequest) -> PerformanceProfile:
    return load_profile(request.param)


def kind(profile: PerformanceProfile) -> str:
    return str(profile.manifest["gpu_kind"])


# ------------------------------------------------------------------ loading, status
def test_zoo_covers_gpus_models_and_tp() -> None:
    rows = {row["name"]: row for row in list_bundled_profiles()}
    assert set(NAMES) == set(rows)
    assert len(rows) >= 10
    for name in ORIGINAL_THREE:
        assert rows[name]["model"].startswith("Llama-3.1-8B-Instruct")
        assert rows[name]["tensor_parallel"] == 1
    kinds = {load_profile(name).manifest["gpu_kind"] for name in NAMES}
    assert {"H100", "H200", "A100", "L40S", "B200"} <= kinds
    assert kinds & {"L4", "A10G"}
    tp = {
        (load_profile(n).manifest["gpu_kind"], rows[n]["tensor_parallel"])
        for n in NAMES
        if "70B" in rows[n]["model"]
    }
    assert {4, 8} <= {t for k, t in tp if k in ("H100", "H200")}
    assert any("Mixtral" in row["model"] for row in rows.values())
    for row in rows.values():
        assert row["status"] == "literature-derived"
        assert Path(row["path"]).name == f"{row['name']}.json"


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
    if kind(bundled) in PUBLISHED_MAX_CLOCK_MHZ:
        assert bundled.maximum_clock_mhz == PUBLISHED_MAX_CLOCK_MHZ[kind(bundled)]
    assert np.all(np.diff(clocks) == 15.0)
    assert np.all(clocks == np.round(clocks))
    assert bundled.manifest["clock_step_mhz"] == 15
    assert bundled.manifest["clock_range_mhz"] == [clocks[0], clocks[-1]]


# ------------------------------------------------------------------- calibration
def test_calibration_rows_are_complete_and_consistent(bundled: PerformanceProfile) -> None:
    manifest = bundled.manifest
    rows = manifest["calibration"]
    summary = manifest["calibration_summary"]
    assert summary["rows"] == len(rows)
    keys = {"source", "quantity", "conditions", "measured", "model", "relative_error", "role"}
    for row in rows:
        assert keys <= set(row)
        assert row["role"] in ("fit", "check")
        expected = (row["model"] - row["measured"]) / row["measured"]
        assert row["relative_error"] == pytest.approx(expected, abs=2e-3)
        if abs(row["relative_error"]) > summary["target"]:
            assert row["note"], row
    worst = max((abs(r["relative_error"]) for r in rows), default=None)
    assert summary["worst_relative_error"] == worst == bundled.worst_calibration_error
    assert summary["note"]
    if not rows:
        assert "no stated error" in summary["note"]


def test_measured_gpus_have_time_rows_within_target() -> None:
    """Every profile on a GPU Vidur measured compares with its kernel timings."""
    for name in (
        "a100-sxm-80gb-llama3-8b",
        "a100-sxm-80gb-llama3-70b-tp4",
        "h100-sxm-llama3-8b",
        "h100-sxm-llama3-70b-tp4",
        "h100-sxm-llama3-70b-tp8",
    ):
        rows = [r for r in load_profile(name).manifest["calibration"] if "vidur" in r["source"]]
        assert len(rows) >= 4, name
        assert all(abs(r["relative_error"]) <= 0.2 for r in rows if "per-layer" in r["quantity"])


def test_h100_energy_matches_ml_energy_within_target() -> None:
    rows = load_profile("h100-sxm-llama3-8b").manifest["calibration"]
    energy = [r for r in rows if r["quantity"].startswith("energy per output token")]
    assert len(energy) == 1 and energy[0]["measured"] == 0.12
    assert abs(energy[0]["relative_error"]) <= 0.2


def test_efficiency_fit_is_reproducible_and_reasonable() -> None:
    for gpu in ("a100", "h100"):
        eff = calibration.fit_efficiency(gpu)
        assert 0.5 < eff.bandwidth_fraction <= 1.0
        assert 0.3 < eff.gemm_mfu <= 1.0
        quality = calibration.efficiency_fit_quality(gpu)
        assert quality["points"] > 50
        assert quality["rms_relative_error"] < 0.1


def test_rates_rise_with_clock(bundled: PerformanceProfile) -> None:
    # Memory-bound decode saturates at high clocks: flat within the CSV's 0.1 tokens/s.
    assert np.all(np.diff(bundled.decode_tokens_per_s) >= 0.0)
    assert bundled.decode_tokens_per_s[-1] > bundled.decode_tokens_per_s[0]
    assert np.all(np.diff(bundled.prefill_tokens_per_s) > 0.0)


def test_decode_weakly_and_prefill_nearly_proportionally_clock_dependent(
    bundled: PerformanceProfile,
) -> None:
    decode = bundled.decode_tokens_per_s
    assert 0.5 <= decode[0] / decode[-1] < 1.0
    clock_ratio = bundled.clock_mhz[0] / bundled.clock_mhz[-1]
    prefill_ratio = bundled.prefill_tokens_per_s[0] / bundled.prefill_tokens_per_s[-1]
    # Compute-bound but with clock-independent launch and memory parts: sub-linear.
    assert clock_ratio < prefill_ratio < 1.6 * clock_ratio + 0.05


def test_h100_over_a100_near_splitwise_ratios() -> None:
    h100 = load_profile("h100-sxm-llama3-8b")
    a100 = load_profile("a100-sxm-80gb-llama3-8b")
    compute = h100.prefill_tokens_per_s[-1] / a100.prefill_tokens_per_s[-1]
    bandwidth = h100.decode_tokens_per_s[-1] / a100.decode_tokens_per_s[-1]
    # Splitwise's datasheet ratios 3.43x / 1.64x, moved by the fitted efficiencies (A100's
    # measured MFU is higher than H100's).
    assert compute == pytest.approx(3.43, rel=0.2)
    assert bandwidth == pytest.approx(1.64, rel=0.2)


def test_h200_vs_h100_same_compute_more_bandwidth() -> None:
    h100 = load_profile("h100-sxm-llama3-8b")
    h200 = load_profile("h200-sxm-llama3-8b")
    np.testing.assert_allclose(h200.prefill_tokens_per_s, h100.prefill_tokens_per_s, rtol=0.06)
    assert np.all(h200.decode_tokens_per_s > h100.decode_tokens_per_s)


def test_energy_per_token_has_an_interior_or_floor_optimum(bundled: PerformanceProfile) -> None:
    prefill = bundled.prefill_power_w / bundled.prefill_tokens_per_s
    best = int(np.argmin(prefill))
    assert 0 < best < prefill.size - 1
    assert prefill[-1] > prefill[best] * 1.05
    decode = bundled.decode_power_w / bundled.decode_tokens_per_s
    assert decode[-1] > decode.min() * 1.05


def test_powers_ordered_and_below_the_domain_limit(bundled: PerformanceProfile) -> None:
    tp = bundled.tensor_parallel
    limit = bundled.manifest["power_limit_w"]
    if kind(bundled) in PUBLISHED_TDP_W:
        assert limit == PUBLISHED_TDP_W[kind(bundled)] * tp
    assert 0.8 * limit <= bundled.prefill_power_w[-1] <= limit
    for table in (bundled.prefill_power_w, bundled.decode_power_w, bundled.idle_power_w):
        assert np.all(table <= limit)
        # strictly rising, except decode rows the power cap holds at the limit
        rising = np.diff(table) > 0.0
        capped = (table[:-1] == limit) & (table[1:] == limit)
        assert np.all(rising | capped)
    capped_rows = bundled.decode_power_w == limit
    assert not capped_rows[0]
    assert np.all(np.diff(capped_rows.astype(int)) >= 0)  # capped rows are the top clocks
    assert np.all(bundled.idle_power_w < bundled.decode_power_w)
    assert np.all(bundled.idle_power_w < bundled.prefill_power_w)
    idle = bundled.idle_power_w
    assert 0.8 <= idle[0] / idle[-1] < 1.0


def test_idle_at_max_clock_is_the_published_figure_per_gpu(bundled: PerformanceProfile) -> None:
    if kind(bundled) not in PUBLISHED_CONTEXT_IDLE_W:
        pytest.skip("no published idle figure for this board")
    per_gpu = bundled.idle_power_w[-1] / bundled.tensor_parallel
    assert per_gpu == pytest.approx(PUBLISHED_CONTEXT_IDLE_W[kind(bundled)], abs=0.005)


def test_h200_decode_power_against_published_range_is_recorded() -> None:
    rows = load_profile("h200-sxm-llama3-8b").manifest["calibration"]
    measured = sorted(r["measured"] for r in rows if "published range" in r["quantity"])
    assert measured == [137.0, 300.0]


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
    assert model.factor(256, reference) > model.factor(128, reference) >= 1.0


def test_engine_and_slos(bundled: PerformanceProfile) -> None:
    engine = bundled.manifest["engine"]
    assert engine["max_batch_size"] == 256
    d = roofline.domain(bundled.name)
    per_gpu_free = d.gpu.memory_capacity_bytes * 0.9 - d.model.weight_bytes / d.tp - 2e9
    expected = per_gpu_free * d.tp / d.model.kv_bytes_per_token
    assert engine["kv_capacity_tokens"] == pytest.approx(expected, abs=1.0)
    assert engine["kv_capacity_tokens"] >= 64 * engine["reference_context_tokens"]
    # The reference batch meets the TPOT SLO at every clock.
    tpot_s = engine["reference_batch_size"] / bundled.decode_tokens_per_s
    assert np.all(tpot_s < bundled.tpot_slo_s)
    assert 0.0 < bundled.tpot_slo_s < bundled.ttft_slo_s
    # The TTFT SLO grows with the prompt: a lone prompt at the max clock meets it with room.
    allowance = bundled.ttft_slo_per_prompt_token_s
    assert allowance > 0.0
    assert allowance * bundled.prefill_tokens_per_s[-1] == pytest.approx(2.0, rel=0.05)
    assert bundled.ttft_slo_for(100_000) == pytest.approx(bundled.ttft_slo_s + 1e5 * allowance)


def test_slos_scale_with_model_size() -> None:
    small = load_profile("h100-sxm-llama3-8b")
    large = load_profile("h100-sxm-llama3-70b-tp4")
    moe = load_profile("h100-sxm-mixtral-8x7b-tp2")
    assert small.ttft_slo_s < moe.ttft_slo_s < large.ttft_slo_s
    assert small.tpot_slo_s < moe.tpot_slo_s < large.tpot_slo_s


def test_thermal_steady_state_at_tdp_below_limit(bundled: PerformanceProfile) -> None:
    thermal = bundled.manifest["thermal"]
    steady_c = (
        thermal["ambient_temperature_c"]
        + thermal["thermal_resistance_c_per_w"] * bundled.manifest["power_limit_w"]
    )
    assert thermal["thermal_limit_c"] - 10.0 < steady_c < thermal["thermal_limit_c"]
    assert thermal["thermal_time_constant_s"] > 0.0


# ------------------------------------------------------------- TP domains, MoE
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_tensor_parallel_domains(gpu: str) -> None:
    tp4 = load_profile(f"{gpu}-sxm-llama3-70b-tp4")
    tp8 = load_profile(f"{gpu}-sxm-llama3-70b-tp8")
    assert (tp4.tensor_parallel, tp8.tensor_parallel) == (4, 8)
    assert tp8.manifest["power_limit_w"] == 2 * tp4.manifest["power_limit_w"]
    assert tp8.idle_power_w[-1] == pytest.approx(2 * tp4.idle_power_w[-1], rel=1e-3)
    assert np.all(tp8.decode_tokens_per_s > tp4.decode_tokens_per_s)
    # Doubling the GPUs does not double the rate: the all-reduce does not shrink.
    assert tp8.decode_tokens_per_s[-1] < 2 * tp4.decode_tokens_per_s[-1]
    for profile in (tp4, tp8):
        assert profile.manifest["tensor_parallel"]["all_reduce_s_per_decode_iteration"] > 0.0
        plant = ServingPlant.from_profile(profile)
        assert plant.tensor_parallel == profile.tensor_parallel
        assert plant.power_limit_w == profile.manifest["power_limit_w"]


def test_moe_streams_only_routed_experts_and_states_imbalance() -> None:
    model = zoo.MIXTRAL_8X7B
    assert model.streamed_weight_bytes(1) < 0.4 * model.weight_bytes
    # At batch 64 every expert is read; only the untied input embedding table is not
    # streamed (a row gather).
    embedding = model.vocab_size * model.d_model * model.bytes_per_value
    assert model.streamed_weight_bytes(64) == pytest.approx(
        model.weight_bytes - embedding, rel=1e-6
    )
    tied = zoo.MODELS["llama3-3b"]
    assert tied.streamed_weight_bytes(1) == tied.weight_bytes
    assert model.active_parameter_count < model.parameter_count / 3
    profile = load_profile("h200-sxm-mixtral-8x7b")
    assert any("imbalance" in item for item in profile.manifest["assumptions"])
    dense = load_profile("h200-sxm-llama3-70b-tp4")
    # 13B active on one GPU prefills faster per GPU than a 70B dense model on four.
    assert profile.prefill_tokens_per_s[-1] > dense.prefill_tokens_per_s[-1] / 4


def test_generator_handles_a_domain_unlike_the_bundled_ones() -> None:
    """A 3B model split over two A100s and a MoE on an L40S: sane, monotone physics."""
    for spec in (
        zoo.ProfileSpec("x-a100-3b-tp2", "a100", "llama3-3b", 2, 8, 1.0, 0.05, "test"),
        zoo.ProfileSpec("x-l40s-moe-tp4", "l40s", "mixtral-8x7b", 4, 128, 1.5, 0.2, "test"),
    ):
        gpu = zoo.GPUS[spec.gpu]
        d = roofline.Domain(
            spec,
            gpu,
            zoo.MODELS[spec.model],
            calibration.fit_efficiency(gpu.efficiency_from),
            roofline.RooflineParameters(),
            calibration.fit_attention(),
        )
        if spec.gpu == "l40s":
            with pytest.raises(KeyError):
                d.all_reduce_s(64)  # no measured fabric for this board: refuse, not guess
            continue
        table = roofline.profile_table(d)
        for column in ("decode_tokens_per_s", "prefill_tokens_per_s", "prefill_power_w"):
            assert np.all(np.diff(table[column]) > 0.0), column
        assert d.kv_capacity_tokens() > 0
        assert d.all_reduce_s(8) > 0.0


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


@pytest.mark.parametrize("order", ["descending", "shuffled", "one row pasted twice"])
def test_rows_in_any_order_load_as_the_ascending_table(
    copy_of_h100: tuple[Path, Path], order: str
) -> None:
    """Rows need not ascend (nvidia-smi lists clocks descending): they are read sorted by
    clock, and a row listed twice whole is read once. Both were refused."""
    csv_path, json_path = copy_of_h100
    expected = load_profile(json_path)
    header, *rows = csv_path.read_text().splitlines()
    if order == "descending":
        rows.reverse()
    elif order == "shuffled":
        rows = rows[1::2] + rows[::2]
    else:
        rows.insert(7, rows[3])
        rows.append(rows[0])
    csv_path.write_text("\r\n".join([header, *rows]) + "\r\n")
    profile = load_profile(json_path)
    for column in CSV_COLUMNS:
        np.testing.assert_array_equal(getattr(profile, column), getattr(expected, column))


def test_clock_listed_twice_with_other_values_names_both_lines(
    copy_of_h100: tuple[Path, Path],
) -> None:
    csv_path, json_path = copy_of_h100
    header, *rows = csv_path.read_text().splitlines()
    cells = rows[3].split(",")
    cells[header.split(",").index("decode_power_w")] = "999"
    rows.append(",".join(cells))  # on line len(rows) + 1, the fifth row's clock again
    csv_path.write_text("\n".join([header, *rows]) + "\n")
    with pytest.raises(ProfileError, match="listed again") as error:
        load_profile(json_path)
    message = str(error.value)
    assert f"{csv_path}:{len(rows) + 1}:" in message
    assert "first on line 5" in message
    assert "decode_power_w" in message
    assert "\n" not in message


def test_one_clock_listed_twice_is_too_few_clocks(copy_of_h100: tuple[Path, Path]) -> None:
    csv_path, json_path = copy_of_h100
    header, *rows = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join([header, rows[0], rows[0]]) + "\n")
    with pytest.raises(ProfileError, match="at least two clocks"):
        load_profile(json_path)


def test_negative_power_names_file_and_line(copy_of_h100: tuple[Path, Path]) -> None:
    csv_path, json_path = copy_of_h100
    _rewrite_cell(csv_path, 7, "idle_power_w", "-5.0")
    with pytest.raises(ProfileError, match="must be at least 0") as error:
        load_profile(json_path)
    assert f"{csv_path}:7" in str(error.value)
    assert "idle_power_w" in str(error.value)


def test_zero_idle_power_loads_and_other_zero_cells_do_not(
    copy_of_h100: tuple[Path, Path],
) -> None:
    """An idle power of 0 W (a table of the power above an unmetered idle floor, or what a
    profiler read from a board reporting 0 W) was refused; every other column stays
    positive."""
    csv_path, json_path = copy_of_h100
    original = csv_path.read_text()
    header, *rows = original.splitlines()
    column = header.split(",").index("idle_power_w")
    zeroed = [
        ",".join([*row.split(",")[:column], "0", *row.split(",")[column + 1 :]]) for row in rows
    ]
    csv_path.write_text("\n".join([header, *zeroed]) + "\n")
    profile = load_profile(json_path)
    assert np.all(profile.idle_power_w == 0.0)
    assert profile.power("idle", profile.maximum_clock_mhz) == 0.0
    ServingPlant.from_profile(profile).validate()
    for other in ("decode_power_w", "prefill_power_w", "decode_tokens_per_s", "clock_mhz"):
        csv_path.write_text(original)
        _rewrite_cell(csv_path, 4, other, "0")
        with pytest.raises(ProfileError, match=f"{other}' must be positive, got '0'"):
            load_profile(json_path)


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


def test_a100_decode_iteration_tracks_vidurs_measured_kernels() -> None:
    """The A100 8B plant's decode iteration against Vidur's kernel-time sum.

    Vidur (default, no CPU overheads) times an iteration as the sum of the measured per-layer
    kernels; the plant adds the output projection and the engine overheads, so it may be
    slower, but by far less than the "half again" once reported.
    """
    rows = decode_check()
    assert [batch for batch, _, _ in rows] == [1, 8, 32, 64, 128]
    for batch, vidur, plant in rows:
        assert 1.0 <= plant / vidur <= 1.2, (batch, plant, vidur)


def test_all_reduce_fits_every_measured_point_and_grows_with_size() -> None:
    """The two-protocol NCCL model meets the 0.2 target on every Vidur point."""
    for (gpu, workers), points in calibration.all_reduce_points().items():
        for size, seconds in points:
            model = calibration.all_reduce_s(gpu, workers, size)
            assert abs(model / seconds - 1.0) <= 0.2, (gpu, workers, size)
        sizes = np.geomspace(1e3, 1e8, 60)
        times = [calibration.all_reduce_s(gpu, workers, s) for s in sizes]
        assert np.all(np.diff(times) > 0.0)
    assert calibration.all_reduce_s("h100", 1, 1e6) == 0.0


def test_attention_fit_is_physical_and_matches_the_llama3_points() -> None:
    """Decode attention: a positive launch, a bandwidth near the linear operators', and the
    Llama-3-8B FlashInfer points within the target."""
    eff = calibration.fit_attention()
    assert 0.0 < eff.launch_s < 1e-4
    assert 0.5 < eff.relative_bandwidth <= 1.5
    for point in calibration.attention_points():
        if point.model == "Llama-3-8B":
            error = calibration.predict_attention(point) / point.layer_s - 1.0
            assert abs(error) <= 0.2 + 1e-3, point
    quality = calibration.attention_fit_quality()
    assert quality["points"] == len(calibration.attention_points())
