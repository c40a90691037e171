"""``study/online_eval``: the learned model's error against the true profile, on a
profile whose idle power is 0 W (no relative error there, not a ZeroDivisionError)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from gpugov.plant import ServingPlant, load_profile, simulate
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.workload import load_trace
from gpugov.study.online_eval import capture_after, model_error_by_clock, summarize_model_error
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


def _energy_run(total_after_j: float) -> SimpleNamespace:
    """A run's cumulative energy: 500 J by 10 s, ``total_after_j`` more by 20 s."""
    return SimpleNamespace(
        time_s=np.array([0.0, 10.0, 20.0]),
        energy_j=np.array([0.0, 500.0, 500.0 + total_after_j]),
    )


def test_capture_after_the_warm_up_is_none_where_the_oracle_saves_only_noise() -> None:
    """Past the warm-up, an oracle within a millionth of the maximum clock's energy saves
    nothing (as for the whole run's capture): a ratio over that gap is noise blown up,
    -100,000 for a run 1 J over the maximum clock's."""
    reference = _energy_run(1000.0)
    noise = _energy_run(1000.0 - 1e-5)
    assert capture_after(_energy_run(1001.0), reference, noise, 10.0, holds=True) is None  # type: ignore[arg-type]
    saving = _energy_run(800.0)
    half = capture_after(_energy_run(900.0), reference, saving, 10.0, holds=True)  # type: ignore[arg-type]
    assert half is not None and abs(half - 0.5) < 1e-12
    assert capture_after(_energy_run(900.0), reference, saving, 10.0, holds=False) is None  # type: ignore[arg-type]
