"""``bench/online_windows.py`` (held-out windows): its summary arithmetic on known rows, and
its refusal of a trace the scoreboard uses whole."""

from __future__ import annotations

from typing import Any

import pytest
from study_support import bench_script


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
