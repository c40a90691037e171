"""``bench/online_windows.py`` (held-out windows): its summary arithmetic on known rows, its
best fixed clock in hindsight, and its refusal of a trace the scoreboard uses whole."""

from __future__ import annotations

from typing import Any

import pytest
from study_support import bench_script

from gpugov.daemon.safety import SafetySettings


def _run(holds: bool, missed: int, near: int, saved: float, after: float | None) -> dict[str, Any]:
    return {
        "holds_slo": holds,
        "extra_missed_requests": missed,
        "extra_ttft_near_misses": near,
        "energy_saved_fraction": saved,
        "energy_saved_after_warmup_fraction": after,
    }


def test_summary_counts_holds_misses_and_mean_savings() -> None:
    module = bench_script("online_windows")
    top = _run(True, 0, 0, 0.0, 0.0)
    rows = [
        {"controllers": {"max": top, "mpc-online": _run(True, 0, 2, 0.10, 0.20)}},
        {"controllers": {"max": top, "mpc-online": _run(False, 2, 3, 0.30, None)}},
        {"error": "the window holds no requests"},
    ]
    summary = {entry["controller"]: entry for entry in module.summarise(rows, ("mpc-online",))}
    online = summary["mpc-online"]
    assert online["windows"] == 2  # the skipped window is not counted
    assert online["holds_slo"] == 1
    assert online["extra_missed_requests"] == 2
    assert online["extra_ttft_near_misses"] == 5
    assert online["mean_energy_saved_fraction"] == pytest.approx(0.20)
    assert online["mean_energy_saved_after_warmup_fraction"] == pytest.approx(0.20)
    assert summary["max"]["holds_slo"] == 2


def test_a_trace_used_whole_is_refused_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    module = bench_script("online_windows")
    assert module.main(["--trace", "burstgpt1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "burstgpt1" in err[0]


def test_the_best_fixed_clock_is_a_hindsight_row_that_holds_and_saves() -> None:
    module = bench_script("online_windows")
    cell = (
        "azure-conv-10min",
        0.0,
        "h100-sxm-llama3-8b",
        "cap70",
        60.0,
        (module.BEST_FIXED,),
        "exact",
        SafetySettings(dwell_s=0.5),
    )
    row = module.run_cell(cell)
    best, top = row["controllers"][module.BEST_FIXED], row["controllers"]["max"]
    assert best["holds_slo"] and best["energy_j"] <= top["energy_j"]
    assert 0.0 < best["energy_saved_fraction"] < 1.0
    assert best["clock_mhz"] < 1980.0  # below the H100's top clock
    summary = {entry["controller"] for entry in module.summarise([row], (module.BEST_FIXED,))}
    assert summary == {"max", module.BEST_FIXED}


def test_the_window_oracle_is_a_hindsight_row_beside_the_best_fixed_clock() -> None:
    module = bench_script("online_windows")
    keys = (module.BEST_FIXED, module.WINDOW_ORACLE)
    cell = (
        "azure-conv-10min",
        0.0,
        "h100-sxm-llama3-8b",
        "cap70",
        30.0,
        keys,
        "exact",
        SafetySettings(dwell_s=0.5),
    )
    row = module.run_cell(cell)
    oracle, top = row["controllers"][module.WINDOW_ORACLE], row["controllers"]["max"]
    assert oracle["holds_slo"] and 0.0 < oracle["energy_saved_fraction"] < 1.0
    assert oracle["energy_j"] < top["energy_j"] and oracle["oracle_source"]
    summary = {entry["controller"] for entry in module.summarise([row], keys)}
    assert summary == {"max", *keys}
