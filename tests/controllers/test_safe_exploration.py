"""Safe exploration's floor: the physics-bounded step, and the floor that back-offs raise
(doubling on repeated back-offs) and that only measured calm brings down."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpugov.controllers.online.exploration import SafeExploration
from gpugov.plant.types import ServingObservation

CLOCKS = tuple(float(c) for c in np.arange(500.0, 1501.0, 25.0))  # range 1000 MHz
STEP = 0.08 * 1000.0


class _Model:
    """The part of :class:`OnlineModel` the floor reads: clocks, the explored frontier and
    latency predictions with a chosen relative uncertainty."""

    def __init__(self, frontier_mhz: float, relative_std: float = 0.05) -> None:
        self.clocks_mhz = np.asarray(CLOCKS)
        self.frontier_mhz = frontier_mhz
        self.relative_std = relative_std

    def lowest_explored_mhz(self, minimum_visits: int = 5) -> float:
        return self.frontier_mhz

    def prefill_s_per_token(self, clock_mhz: float) -> tuple[float, float]:
        mean = 1e-4 * 1500.0 / clock_mhz
        return mean, self.relative_std * mean

    def decode_iteration_s(
        self, clock_mhz: float, batch: float, context: float
    ) -> tuple[float, float]:
        mean = 0.02 * 1500.0 / clock_mhz
        return mean, self.relative_std * mean

    def table(self, clocks: np.ndarray, batch: float, context: float) -> dict:
        rows = [
            (self.prefill_s_per_token(c), self.decode_iteration_s(c, batch, context))
            for c in clocks
        ]
        prefill = np.array([r[0] for r in rows])
        decode = np.array([r[1] for r in rows])
        return {
            "prefill_s_per_token": (prefill[:, 0], prefill[:, 1]),
            "decode_iteration_s": (decode[:, 0], decode[:, 1]),
        }


def _seen(time_s: float, *, ttft_ratio: float | None, requested: float) -> ServingObservation:
    return ServingObservation(
        time_s=time_s,
        step_index=int(time_s),
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=40.0,
        ttft_recent_s=None if ttft_ratio is None else ttft_ratio * 1.0,
        tpot_recent_s=None,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        requested_clock_mhz=requested,
        supported_clocks_mhz=CLOCKS,
    )


def test_near_the_threshold_the_floor_takes_one_step() -> None:
    policy = SafeExploration()
    floor = policy.floor(_Model(1200.0), _seen(1.0, ttft_ratio=0.55, requested=1200.0), 1.5)
    assert floor == pytest.approx(1200.0 - STEP, abs=25.0)


def test_far_under_the_threshold_the_floor_takes_the_physics_step_capped() -> None:
    policy = SafeExploration()
    # pressure 0.45 at 1200 MHz: 1200 * 0.45 / 0.6 = 900 MHz, within the 240 MHz cap.
    floor = policy.floor(_Model(1200.0), _seen(1.0, ttft_ratio=0.45, requested=1200.0), 1.5)
    assert floor == pytest.approx(975.0)
    # pressure 0.1: the physics allows 200 MHz; the cap (24% of the range) stops at 960.
    floor = policy.floor(_Model(1200.0), _seen(2.0, ttft_ratio=0.1, requested=1200.0), 1.5)
    assert floor == pytest.approx(975.0)  # the first supported clock at or above 960
    # A model too unsure below the frontier takes one bounded step, not the physics' long
    # one: it gets surer only where it goes.
    unsure = policy.floor(
        _Model(1200.0, relative_std=0.5), _seen(3.0, ttft_ratio=0.1, requested=1200.0), 1.5
    )
    assert unsure == pytest.approx(1125.0)  # the first supported clock at or above 1120
    # Without slack, no step at all.
    held = policy.floor(
        _Model(1200.0, relative_std=0.5), _seen(4.0, ttft_ratio=0.7, requested=1200.0), 1.5
    )
    assert held == pytest.approx(1200.0)


def test_a_step_finer_than_the_clock_grid_still_reaches_the_next_clock() -> None:
    # A narrow range on a coarse grid: 8 % of 400 MHz is 32 MHz, the clocks are 50 apart.
    clocks = tuple(float(c) for c in range(1100, 1501, 50))

    class _Narrow(_Model):
        def __init__(self) -> None:
            super().__init__(1500.0, relative_std=0.5)
            self.clocks_mhz = np.asarray(clocks)

    for time_s, ratio in ((1.0, 0.55), (2.0, 0.59)):  # the physics bound above 1468 too
        seen = replace(
            _seen(time_s, ttft_ratio=ratio, requested=1500.0), supported_clocks_mhz=clocks
        )
        assert SafeExploration().floor(_Narrow(), seen, 1.5) == pytest.approx(1450.0)


def test_a_backoff_raises_the_floor_and_a_repeated_one_doubles_the_rise() -> None:
    policy = SafeExploration(calm_windows=10)
    model = _Model(700.0)
    assert policy.backing_off(_seen(10.0, ttft_ratio=0.95, requested=800.0), 1500.0)
    assert policy.backoffs == 1
    assert policy.raised_floor_mhz == pytest.approx(800.0 + STEP)
    after = _seen(20.0, ttft_ratio=0.3, requested=1500.0)
    assert not policy.backing_off(after, 1500.0)  # the hold (2 s) is over
    assert policy.floor(model, after, 1.5) == pytest.approx(900.0)  # 880, on the grid
    # A second back-off while the floor is raised: two steps above its clock.
    assert policy.backing_off(_seen(30.0, ttft_ratio=0.95, requested=900.0), 1500.0)
    assert policy.raised_floor_mhz == pytest.approx(900.0 + 2 * STEP)


def test_only_measured_calm_brings_the_raised_floor_down() -> None:
    policy = SafeExploration(calm_windows=10)
    model = _Model(700.0)
    policy.backing_off(_seen(0.0, ttft_ratio=0.95, requested=1000.0), 1500.0)
    raised = policy.raised_floor_mhz
    assert raised is not None
    for k in range(30):  # idle windows: no latency measured, no evidence
        policy.floor(model, _seen(10.0 + k, ttft_ratio=None, requested=1100.0), 1.5)
    assert policy.raised_floor_mhz == pytest.approx(raised)
    for k in range(10):  # ten measured calm windows: one step down
        policy.floor(model, _seen(50.0 + k, ttft_ratio=0.2, requested=1100.0), 1.5)
    assert policy.raised_floor_mhz == pytest.approx(raised - STEP)
    for k in range(9):  # pressure resets the count
        policy.floor(model, _seen(70.0 + k, ttft_ratio=0.2, requested=1000.0), 1.5)
    policy.floor(model, _seen(80.0, ttft_ratio=0.7, requested=1000.0), 1.5)
    assert policy.calm_count == 0
    for k in range(100):  # enough calm: the raised floor dissolves, the frontier rules
        policy.floor(model, _seen(100.0 + k, ttft_ratio=0.2, requested=1000.0), 1.5)
    assert policy.raised_floor_mhz is None
    assert policy.floor(model, _seen(200.0, ttft_ratio=0.55, requested=700.0), 1.5) < 700.0


def test_a_latency_the_top_clock_would_show_too_holds_but_raises_no_floor() -> None:
    policy = SafeExploration()
    # 0.98 of the SLO at 1450 MHz: at 1500 it would still be at least 0.98 * 1450 / 1500
    # = 0.947 > 0.9 (latency grows at most like 1/f), so the clock was not the cause.
    assert policy.backing_off(_seen(10.0, ttft_ratio=0.98, requested=1450.0), 1500.0)
    assert policy.backoffs == 1 and policy.raised_floor_mhz is None
    # The same latency at 1000 MHz: the top clock could have brought it to 0.65.
    assert policy.backing_off(_seen(20.0, ttft_ratio=0.98, requested=1000.0), 1500.0)
    assert policy.backoffs == 2
    assert policy.raised_floor_mhz == pytest.approx(1000.0 + STEP)
