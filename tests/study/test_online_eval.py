"""``study/online_eval``: the learned model's error against the true profile, on a
profile whose idle power is 0 W (no relative error there, not a ZeroDivisionError)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpugov.plant import ServingPlant, load_profile, simulate
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.workload import load_trace
from gpugov.study.online_eval import model_error_by_clock, summarize_model_error
from gpugov.study.scoreboard.controllers import scoreboard_online


def test_zero_idle_power_has_no_relative_error_and_the_rest_is_summarised() -> None:
    """A profile may state an idle power of 0 W: `bench controllers` on one stopped in a
    ZeroDivisionError computing mpc-online's idle-power error."""
    bundled = load_profile("h100-sxm-llama3-8b")
    profile = replace(bundled, idle_power_w=np.zeros_like(bundled.idle_power_w))
    plant = ServingPlant.from_profile(profile)
    requests, _ = load_trace("azure-conv-10min", duration_s=90.0)
    controller = scoreboard_online(plant, requests, control_period_s=1.0)
    result = simulate(requests, plant, chunked_prefill_scheduler, controller, 0)
    rows = model_error_by_clock(controller.unwrapped, profile, result)  # type: ignore[arg-type]
    assert rows, "the run held some clock long enough to compare"
    assert all(row["idle_power_error"] is None for row in rows)
    assert all(np.isfinite(row["decode_power_error"]) for row in rows)
    summary = summarize_model_error(rows)
    assert summary["idle_power_error"] is None
    assert summary["decode_power_error"] is not None and np.isfinite(summary["decode_power_error"])
    assert summarize_model_error([]) == {}
