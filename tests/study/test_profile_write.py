"""``write_profile`` writes only a profile the loader takes: one it refused replaced an
earlier profile of that name and stayed behind, unloadable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_profile import _domain_record

from gpugov.plant import load_profile
from gpugov.study.profiler.measure import ProfileRunError
from gpugov.study.profiler.write import write_profile


def _write(out: Path, power_limit_w: float) -> Path:
    records: list[dict[str, Any]] = [_domain_record(clock, 1) for clock in (990, 1980)]
    return write_profile(
        records,
        out,
        name="p",
        status="emulated",
        gpu_name="Emulated GPU",
        model="m",
        supported_clocks=[990, 1980],
        power_limit_w=power_limit_w,
        settings={"reference_batch": 64, "reference_context_tokens": 1024},
        command="gpugov profile",
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        kv_capacity_tokens=None,
        backend="emulated",
    )


def test_a_profile_the_loader_refuses_leaves_the_earlier_one_whole(tmp_path: Path) -> None:
    manifest = _write(tmp_path, 700.0)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    # A power limit under the 120 W idle: the loader refuses the profile.
    with pytest.raises(ProfileRunError) as refused:
        _write(tmp_path, 100.0)
    message = str(refused.value)
    assert message.startswith(f"{manifest}: power_limit_w (100.0 W)"), message
    assert "the profile was not written" in message
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
    assert load_profile(manifest).manifest["power_limit_w"] == 700.0
