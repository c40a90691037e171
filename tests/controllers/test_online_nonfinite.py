"""A NaN or infinite reading never enters the online MPC's model: the part it would spoil
skips the window, counts it, and the model stays finite (and savable) for good."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from synthetic import make_plant, poisson_requests

from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.controllers.online.identification import OnlineModel
from gpugov.controllers.online.regression import RecursiveLeastSquares
from gpugov.controllers.online.window import PromptEstimate, Window, window_between
from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.types import ServingObservation

CLOCKS = tuple(float(c) for c in range(900, 1981, 90))


def _window(**fields: float) -> Window:
    base = {
        "duration_s": 1.0,
        "busy_s": 0.8,
        "prompt_tokens": 2000.0,
        "generated_tokens": 300.0,
        "iterations": 20.0,
        "context_tokens": 1200.0,
        "energy_j": 500.0,
        "realized_mhz": 1980.0,
        "requested_mhz": 1980.0,
        "temperature_start_c": 60.0,
        "temperature_end_c": 60.5,
    }
    base.update(fields)
    return Window(**base)  # type: ignore[arg-type]


def _finite(model: OnlineModel) -> bool:
    return all(
        bool(np.all(np.isfinite(fit.mean))) and bool(np.all(np.isfinite(fit.covariance)))
        for fit in (model.time, model.power, model.thermal)
    ) and bool(np.all(np.isfinite(model.realized_ratio)))


def test_regression_refuses_a_nonfinite_sample_and_keeps_its_state() -> None:
    rls = RecursiveLeastSquares(np.zeros(2), np.eye(2), 1.0)
    rls.update(np.array([1.0, 0.5]), 2.0)
    mean, covariance, samples = rls.mean.copy(), rls.covariance.copy(), rls.samples
    for x, y in ((np.array([math.nan, 1.0]), 1.0), (np.array([1.0, 1.0]), math.inf)):
        assert math.isnan(rls.update(x, y))
    np.testing.assert_array_equal(rls.mean, mean)
    np.testing.assert_array_equal(rls.covariance, covariance)
    assert rls.samples == samples and rls.rejected_nonfinite == 2


def test_nan_temperature_skips_only_the_thermal_fit() -> None:
    model = OnlineModel(CLOCKS, 700.0)
    model.update(_window(temperature_start_c=math.nan))
    assert model.skipped_nonfinite_windows == 1
    assert model.skipped_nonfinite["thermal"] == 1
    assert model.thermal.samples == 0 and model.thermal.rejected_nonfinite == 0
    assert model.time.samples == 1 and model.power.samples == 1  # still learned from it
    for _ in range(5):
        model.update(_window())
    assert model.thermal.samples == 5 and model.skipped_nonfinite_windows == 1
    assert _finite(model)
    json.dumps(model.state_dict(), allow_nan=False)  # the model can still be saved


@pytest.mark.parametrize(
    ("field", "part"),
    [
        ("busy_s", "window"),
        ("realized_mhz", "window"),
        ("prompt_tokens", "time"),
        ("context_tokens", "time"),
        ("energy_j", "power"),
        ("requested_mhz", "clock_ratio"),
        ("temperature_end_c", "thermal"),
    ],
)
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_each_nonfinite_field_is_skipped_and_counted(field: str, part: str, value: float) -> None:
    model = OnlineModel(CLOCKS, 700.0)
    model.update(_window())
    model.update(_window(**{field: value}))
    assert model.skipped_nonfinite_windows == 1
    assert model.skipped_nonfinite[part] == 1
    assert _finite(model)
    json.dumps(model.state_dict(), allow_nan=False)


def _observation(time_s: float, **fields: object) -> ServingObservation:
    base: dict[str, object] = {
        "time_s": time_s,
        "step_index": int(time_s),
        "arrived_requests": int(time_s) * 3,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 4,
        "generated_decode_tokens": 100.0,
        "temperature_c": 55.0,
        "prompt_tokens_total": 1000.0 * time_s,
        "output_tokens_total": 300.0 * time_s,
        "energy_j": 400.0 * time_s,
        "gpu_utilization": 0.7,
        "realized_clock_mhz": 1980.0,
        "requested_clock_mhz": 1980.0,
    }
    base.update(fields)
    return ServingObservation(**base)  # type: ignore[arg-type]


def test_a_nonfinite_utilisation_reaches_the_model_as_a_skipped_window() -> None:
    window = window_between(_observation(1.0), _observation(2.0, gpu_utilization=math.nan))
    assert window is not None and math.isnan(window.busy_s)
    model = OnlineModel(CLOCKS, 700.0)
    model.update(window)
    assert model.skipped_nonfinite["window"] == 1 and model.time.samples == 0


def test_prompt_estimate_skips_a_nonfinite_counter() -> None:
    estimate = PromptEstimate()
    for second in range(1, 6):
        estimate.update(_observation(second - 1.0), _observation(float(second)))
    value = estimate.value
    assert value is not None and math.isfinite(value)
    estimate.update(_observation(5.0), _observation(6.0, prompt_tokens_total=math.nan))
    assert estimate.skipped_nonfinite == 1 and estimate.value == value


def test_the_controller_survives_nan_readings_and_reports_them() -> None:
    """As on a node: NaN temperature until the first read, later a bad engine counter."""
    controller = OnlineMPCController(
        mean_prompt_tokens=1100.0, mean_output_tokens=110.0, warmup_s=10.0
    )
    decisions: list[float] = []

    def observed(observation: ServingObservation) -> float:
        if observation.time_s < 3.0:
            observation = replace(observation, temperature_c=math.nan)
        if 25.0 <= observation.time_s < 27.0:
            observation = replace(observation, prompt_tokens_total=math.nan)
        decision = controller(observation)
        decisions.append(decision)
        return decision

    simulate(poisson_requests(40.0, seed=5), make_plant(), chunked_prefill_scheduler, observed, 0)
    status = controller.status()
    assert status["skipped_nonfinite_windows"] >= 3
    assert status["skipped_nonfinite"]["thermal"] >= 3
    assert status["skipped_nonfinite"]["time"] >= 1
    assert status["skipped_nonfinite"]["prompt_estimate"] >= 1
    assert status["warmed_up"] and status["samples"] > 20
    model = controller.model
    assert model is not None and _finite(model)
    assert all(math.isfinite(d) for d in decisions)
    json.dumps(model.state_dict(), allow_nan=False)


def test_a_finite_sample_that_overflows_the_step_is_refused() -> None:
    # A counter gone wild (1e300 tokens in half a second) is finite, but its step is not:
    # refused, the estimate unchanged and still saveable.
    regression = RecursiveLeastSquares(np.zeros(2), np.eye(2), noise_variance=1.0)
    regression.update(np.array([1.0, 2.0]), 3.0)
    before = (regression.mean.copy(), regression.covariance.copy(), regression.samples)
    assert math.isnan(regression.update(np.array([1e300, 1e300]), 1e300))
    assert regression.rejected_nonfinite == 1
    assert np.array_equal(regression.mean, before[0])
    assert np.array_equal(regression.covariance, before[1]) and regression.samples == before[2]
    json.dumps(regression.state_dict(), allow_nan=False)
