"""Generated profiles (``plant/synthetic_profiles.py``): each loads from the files it writes,
is a valid synthetic profile, and has the shape its name promises."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpugov.plant import ServingPlant, load_profile
from gpugov.plant.profile import PerformanceProfile, ProfileError
from gpugov.plant.synthetic_profiles import (
    SHAPES,
    expand_synthetic,
    is_synthetic_spec,
    main,
    random_shape,
    resolve_profile,
    shape_profile,
    synthetic_profile,
    write_synthetic_profile,
)

COLUMNS = (
    "clock_mhz",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "prefill_power_w",
    "decode_power_w",
    "idle_power_w",
)


@pytest.fixture(scope="module", params=sorted(SHAPES))
def written(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[PerformanceProfile, PerformanceProfile]:
    """(the generated profile in memory, the same loaded from the files it writes)."""
    directory = tmp_path_factory.mktemp("synthetic")
    path = write_synthetic_profile(request.param, directory)
    return synthetic_profile(request.param), load_profile(path)


def test_each_profile_loads_back_identical(
    written: tuple[PerformanceProfile, PerformanceProfile],
) -> None:
    generated, loaded = written
    assert (
        loaded.name
        == generated.name
        == f"synthetic-{generated.manifest['synthetic_shape']['name']}"
    )
    for column in COLUMNS:
        np.testing.assert_array_equal(getattr(loaded, column), getattr(generated, column))
    assert (loaded.ttft_slo_s, loaded.tpot_slo_s) == (generated.ttft_slo_s, generated.tpot_slo_s)
    assert loaded.ttft_slo_per_prompt_token_s == generated.ttft_slo_per_prompt_token_s
    assert loaded.decode_latency_model == generated.decode_latency_model
    assert loaded.tensor_parallel == generated.tensor_parallel
    assert loaded.profile_csv_sha256  # loaded from a file: provenance recorded


def test_each_profile_is_synthetic_and_never_measured(
    written: tuple[PerformanceProfile, PerformanceProfile],
) -> None:
    _, profile = written
    assert profile.profile_status == "synthetic"
    assert not profile.is_measured
    assert "(synthetic)" in profile.source_label
    assert "not measured" in profile.manifest["warning"]


def test_each_profile_is_physically_valid(
    written: tuple[PerformanceProfile, PerformanceProfile],
) -> None:
    _, profile = written
    manifest = profile.manifest
    limit = manifest["power_limit_w"]
    assert np.all(np.diff(profile.prefill_tokens_per_s) > 0.0)
    assert np.all(np.diff(profile.decode_tokens_per_s) > 0.0)
    for table in (profile.prefill_power_w, profile.decode_power_w, profile.idle_power_w):
        assert np.all(np.diff(table) > 0.0)
        assert np.all(table <= limit)
    assert np.all(profile.idle_power_w < profile.decode_power_w)
    assert np.all(profile.idle_power_w < profile.prefill_power_w)
    # The reference batch meets the TPOT SLO at the top clock (with room), a lone prompt
    # the TTFT SLO, and the domain at its power limit stays below the thermal limit.
    reference = profile.decode_latency_model.reference_batch_size
    assert reference / profile.decode_tokens_per_s[-1] < 0.5 * profile.tpot_slo_s
    assert 1_000 / profile.prefill_tokens_per_s[-1] < profile.ttft_slo_for(1_000)
    thermal = manifest["thermal"]
    steady = thermal["ambient_temperature_c"] + thermal["thermal_resistance_c_per_w"] * limit
    assert thermal["thermal_limit_c"] - 10.0 < steady < thermal["thermal_limit_c"]
    plant = ServingPlant.from_profile(profile)
    assert plant.tensor_parallel == profile.tensor_parallel
    assert plant.power_limit_w == limit
    assert plant.kv_capacity_tokens == manifest["engine"]["kv_capacity_tokens"]


def _decode_ratio(profile: PerformanceProfile) -> float:
    return float(profile.decode_tokens_per_s[0] / profile.decode_tokens_per_s[-1])


def test_compute_bound_rates_scale_with_the_clock() -> None:
    profile = synthetic_profile("compute-bound")
    clocks = profile.clock_mhz / profile.maximum_clock_mhz
    np.testing.assert_allclose(
        profile.prefill_tokens_per_s / profile.prefill_tokens_per_s[-1], clocks, atol=1e-4
    )
    # Decode within 5% of the top rate of proportional at every clock.
    decode = profile.decode_tokens_per_s / profile.decode_tokens_per_s[-1]
    assert np.all(np.abs(decode - clocks) <= 0.05)
    assert _decode_ratio(profile) < 0.25


def test_memory_bound_decode_is_nearly_flat() -> None:
    profile = synthetic_profile("memory-bound")
    assert _decode_ratio(profile) >= 0.9
    # Its decode power is mostly the clock-independent (memory) part.
    static = profile.decode_power_w[0] - profile.idle_power_w[0]
    assert static >= 0.5 * (profile.decode_power_w[-1] - profile.idle_power_w[-1])


def test_idle_power_low_and_high() -> None:
    low, high = synthetic_profile("low-idle"), synthetic_profile("high-idle")
    base = synthetic_profile("compute-bound")
    assert low.idle_power_w[-1] <= 0.05 * low.manifest["power_limit_w"]
    assert high.idle_power_w[0] >= 0.25 * high.manifest["power_limit_w"]
    assert (
        low.idle_power_w[-1] < base.idle_power_w[0] < base.idle_power_w[-1] < high.idle_power_w[0]
    )


def test_clock_ranges_narrow_and_wide() -> None:
    narrow, wide = synthetic_profile("narrow-clocks"), synthetic_profile("wide-clocks")
    assert (narrow.minimum_clock_mhz, narrow.maximum_clock_mhz) == (1100.0, 1500.0)
    assert narrow.clock_mhz.size <= 10
    assert (wide.minimum_clock_mhz, wide.maximum_clock_mhz) == (210.0, 2100.0)
    assert wide.clock_mhz.size >= 300
    np.testing.assert_allclose(np.diff(wide.clock_mhz), 5.0)


@pytest.mark.parametrize("size", [2, 4, 8])
def test_tensor_parallel_groups(size: int) -> None:
    profile = synthetic_profile(f"tp{size}")
    assert profile.tensor_parallel == size
    assert profile.manifest["tensor_parallel"]["size"] == size
    per_gpu = profile.manifest["tensor_parallel"]["per_gpu_power_limit_w"]
    assert profile.manifest["power_limit_w"] == size * per_gpu
    # Powers are the domain's sum: idle grows with the group.
    one = synthetic_profile("tp2")
    assert profile.idle_power_w[-1] == pytest.approx(one.idle_power_w[-1] * size / 2)
    # Rates do not grow with the GPUs: the model grows with them, and the all-reduce costs.
    assert profile.decode_tokens_per_s[-1] <= one.decode_tokens_per_s[-1]


def test_specs_resolve_and_expand() -> None:
    assert expand_synthetic("synthetic") == [f"synthetic:{name}" for name in SHAPES]
    assert expand_synthetic("h100-sxm-llama3-8b") == ["h100-sxm-llama3-8b"]
    assert is_synthetic_spec("synthetic:tp4") and is_synthetic_spec("synthetic-tp4")
    assert not is_synthetic_spec("h100-sxm-llama3-8b")
    assert resolve_profile("synthetic:tp4").name == "synthetic-tp4"
    assert resolve_profile("synthetic-memory-bound").name == "synthetic-memory-bound"
    assert resolve_profile("h100-sxm-llama3-8b").name == "h100-sxm-llama3-8b"
    with pytest.raises(ValueError, match="unknown synthetic profile shape 'synthetic:nope'"):
        resolve_profile("synthetic:nope")
    # An unknown name lists the generated shapes beside the bundled profiles.
    with pytest.raises(ProfileError, match=r"; or a generated one: synthetic:SHAPE \(compute"):
        resolve_profile("synthetic-nope")


def test_module_writes_the_named_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path), "tp2", "synthetic:low-idle"]) == 0
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == [
        "synthetic-low-idle.csv",
        "synthetic-low-idle.json",
        "synthetic-tp2.csv",
        "synthetic-tp2.json",
    ]
    assert json.loads((tmp_path / "synthetic-tp2.json").read_text())["status"] == "synthetic"
    assert main(["--out", str(tmp_path), "bogus"]) == 2
    assert "unknown synthetic profile shape 'bogus'" in capsys.readouterr().err


def test_random_shapes_are_seeded_and_differ() -> None:
    assert random_shape(3) == random_shape(3)
    assert random_shape(3) != random_shape(4)
    assert random_shape(3).name == "random-3"


@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_make_valid_synthetic_boards(seed: int) -> None:
    shape = random_shape(seed)
    profile = shape_profile(shape)
    assert profile.profile_status == "synthetic"
    assert profile.clock_mhz[0] == shape.clock_min_mhz
    assert profile.clock_mhz[-1] == shape.clock_max_mhz
    assert np.all(np.diff(profile.clock_mhz) > 0.0)
    assert np.all(np.diff(profile.prefill_tokens_per_s) > 0.0)
    assert np.all(np.diff(profile.decode_tokens_per_s) >= 0.0)
    for table in (profile.prefill_power_w, profile.decode_power_w):
        assert np.all(profile.idle_power_w < table)
    # The TPOT SLO leaves the reference batch at the top clock between 1.3x and 4x of room
    # (or the 10 ms floor), and the plant builds.
    reference = profile.decode_latency_model.reference_batch_size
    top_iteration_s = reference / profile.decode_tokens_per_s[-1]
    assert top_iteration_s * 1.29 <= profile.tpot_slo_s <= max(top_iteration_s * 4.01, 0.01)
    plant = ServingPlant.from_profile(profile)
    assert plant.tensor_parallel == shape.tensor_parallel
