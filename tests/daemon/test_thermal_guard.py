"""The safety chain holds a stated thermal limit whatever the controller decides."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from synthetic import make_plant, poisson_requests

from gpugov.daemon.safety import THERMAL_BAND_C, THERMAL_GIVE_UP_S, ThermalGuard, with_safety
from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.types import ServingObservation

CLOCKS = (300.0, 600.0, 900.0, 1200.0, 1500.0)


def _at(time_s: float, temperature_c: float, limit_c: float | None = 80.0) -> ServingObservation:
    return ServingObservation(
        time_s=time_s,
        step_index=int(time_s),
        arrived_requests=0,
        prefill_remaining_tokens=0.0,
        decode_active=0,
        generated_decode_tokens=0.0,
        temperature_c=temperature_c,
        thermal_limit_c=limit_c,
        supported_clocks_mhz=CLOCKS,
    )


def _top(observation: ServingObservation) -> float:
    return CLOCKS[-1]


def test_the_cap_falls_from_the_top_clock_to_the_lowest_across_the_band() -> None:
    guard = ThermalGuard(_top, CLOCKS)
    assert guard(_at(0.0, 80.0 - THERMAL_BAND_C)) == 1500.0  # the band's foot: no cap
    assert guard(_at(1.0, 80.0 - THERMAL_BAND_C / 2)) == 900.0  # halfway down
    assert guard(_at(2.0, 80.0)) == 300.0  # at the limit: the lowest clock
    assert guard(_at(3.0, 95.0)) == 300.0
    assert guard.capped == 3
    # No limit stated, or no reading: the decision as it is.
    assert guard(_at(4.0, 95.0, limit_c=None)) == 1500.0
    assert ThermalGuard(_top, CLOCKS)(_at(5.0, float("nan"))) == 1500.0  # never read
    # A lower decision than the cap passes unchanged.
    assert ThermalGuard(lambda o: 600.0, CLOCKS)(_at(6.0, 80.0 - THERMAL_BAND_C / 2)) == 600.0


def test_an_unholdable_limit_is_said_once_and_the_guard_stands_down_until_the_die_cools(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A die that stays at the limit at the lowest clock (an ambient too hot for the
    limit stated) would hold the node at its lowest clock for good."""
    guard = ThermalGuard(_top, CLOCKS)
    with caplog.at_level(logging.INFO, logger="gpugov"):
        decisions = [guard(_at(float(t), 81.0)) for t in range(int(THERMAL_GIVE_UP_S) + 5)]
    assert decisions[0] == 300.0 and decisions[-1] == 1500.0 and guard.unholdable
    warnings = [r for r in caplog.records if "cannot be held" in r.getMessage()]
    assert len(warnings) == 1
    assert guard(_at(500.0, 79.0)) == 1500.0 and guard.unholdable  # in the band: stood down
    assert guard(_at(501.0, 80.0 - THERMAL_BAND_C - 0.5)) == 1500.0
    assert not guard.unholdable  # cooled under the band: held again
    assert guard(_at(502.0, 80.0)) == 300.0


def test_a_tick_without_a_reading_keeps_the_cap_and_a_gap_restarts_the_give_up_count() -> None:
    """A flaky sensor at the limit: a NaN tick planned from the last reading (the cap
    was lifted for that tick, a top-clock raise and a relock at each flicker), for a few
    seconds at most. Time the chain was not called (the fail-safe) is no time at the
    lowest clock: one tick at the limit, a long fail-safe, and the next tick gave up."""
    guard = ThermalGuard(_top, CLOCKS)
    assert guard(_at(0.0, 80.0)) == 300.0
    assert guard(_at(1.0, float("nan"))) == 300.0  # the last reading, a second old
    assert guard(_at(12.0, float("nan"))) == 1500.0  # ten seconds on: none to plan from
    assert guard(_at(13.0, 80.0)) == 300.0
    assert guard(_at(13.0 + THERMAL_GIVE_UP_S + 10.0, 80.0)) == 300.0  # after a gap
    assert not guard.unholdable


def test_every_controller_holds_a_stated_limit_on_the_plant() -> None:
    """The maximum clock, with the node stating a limit 3 C under the peak the die reaches
    there: the chain keeps the die under it (the plant's own limit, far higher, never
    slows the GPU). Under the plant's own limit alone the same run is unchanged."""
    plant = make_plant()
    workload = poisson_requests(120.0)
    top = float(plant.profile.clock_mhz[-1])
    free = simulate(workload, plant, chunked_prefill_scheduler, lambda o: top, 0)
    limit = free.metrics.peak_temperature_c - 3.0
    clocks = [float(c) for c in plant.profile.clock_mhz]
    chain = with_safety(lambda o: top, clocks)

    def stated(observation: ServingObservation) -> float:
        return chain(dataclasses.replace(observation, thermal_limit_c=limit))

    held = simulate(workload, plant, chunked_prefill_scheduler, stated, 0)
    guard = chain.inner
    assert isinstance(guard, ThermalGuard) and guard.capped > 0
    assert held.metrics.peak_temperature_c <= limit + 0.2
    assert held.metrics.energy_j < free.metrics.energy_j
    unstated = with_safety(lambda o: top, clocks)
    again = simulate(workload, plant, chunked_prefill_scheduler, unstated, 0)
    assert again.metrics.energy_j == free.metrics.energy_j


@pytest.mark.parametrize("period_s", [10.0, 60.0])
def test_a_long_control_period_still_gives_up_an_unholdable_limit_and_keeps_the_cap(
    period_s: float,
) -> None:
    """A node at a control period longer than the guard's gap (``daemon.period_s`` up to
    60 s): its ticks, one period apart, are no fail-safe's gap, so an unholdable limit is
    given up after its 120 s as at a short period, and a tick the sensor gave no reading
    plans from the last tick's reading."""
    chain = with_safety(_top, CLOCKS, period_s=period_s)
    guard = chain.inner
    assert isinstance(guard, ThermalGuard)
    ticks = int(THERMAL_GIVE_UP_S / period_s) + 3
    decisions = [chain(_at(t * period_s, 81.0)) for t in range(ticks)]
    assert decisions[0] == 300.0 and guard.unholdable and decisions[-1] == 1500.0
    flaky = with_safety(_top, CLOCKS, period_s=period_s)
    assert flaky(_at(0.0, 80.0)) == 300.0
    assert flaky(_at(period_s, float("nan"))) == 300.0  # the last tick's reading
    # A tick missed (the fail-safe held the clock) is still a gap.
    gapped = ThermalGuard(_top, CLOCKS, period_s=period_s)
    assert gapped(_at(0.0, 81.0)) == 300.0
    assert gapped(_at(2 * period_s + THERMAL_GIVE_UP_S, 81.0)) == 300.0
    assert not gapped.unholdable


class _EngineDown:
    """An engine whose page never answers: every tick is the fail-safe's."""

    def scrape(self, timeout_s: float | None = None) -> object:
        from gpugov.daemon.errors import EngineUnavailable

        raise EngineUnavailable("connection refused")


def _blind_domain(fake: Any, **fields: object) -> Any:
    """A one-GPU domain on ``fake`` (a FakeNvml) whose engine page never answers, with
    the domain config's ``fields``: its assembly (``.domains[0]``; close it)."""
    from gpugov.daemon.config import parse_config
    from gpugov.daemon.service import domains_from_config

    domain = {
        "name": "llm",
        "gpus": [0],
        "stale_after_s": 2.5,
        "engine": {"kind": "vllm", "url": "http://127.0.0.1:9/metrics"},
        "controller": {"kind": "fixed", "clock_mhz": 1410},
        **fields,
    }
    config = parse_config({"daemon": {"period_s": 1.0}, "domains": [domain]})
    assembled = domains_from_config(config, nvml=fake)
    assembled.domains[0].observer.source = _EngineDown()
    return assembled


@pytest.mark.parametrize("failsafe", ["max", "unlock"])
def test_the_fail_safe_serves_blind_but_not_past_the_stated_thermal_limit(failsafe: str) -> None:
    """With the engine's page down the node holds the top clock (or unlocks), outside the
    controller, but the GPUs still read: with the die 0.5 C under the stated limit it locks
    the clock the thermal guard allows (it locked the top clock, past the limit), and once
    the die cools it holds the top clock again."""
    from daemon_support import run_ticks
    from fake_pynvml import FakeNvml

    fake = FakeNvml(1)
    fake.gpus[0].temperature_c = 80
    assembled = _blind_domain(fake, thermal_limit_c=80.5, failsafe=failsafe)
    domain = assembled.domains[0]
    top = max(fake.gpus[0].graphics_clocks_mhz)
    try:
        records, _ = run_ticks([domain], 4)
        assert [record.failsafe for record in records] == [True] * 4
        held = domain.snapshot().thermal_cap_mhz
        assert held is not None and held < top
        assert {record.applied_mhz for record in records} == {held}
        assert ("nvmlDeviceSetGpuLockedClocks", 0, held, held) in fake.writes
        fake.gpus[0].temperature_c = 60
        records, _ = run_ticks([domain], 40)
        assert records[-1].failsafe
        assert records[-1].applied_mhz == (top if failsafe == "max" else None)
    finally:
        assembled.close()


def test_the_fail_safes_thermal_cap_never_goes_below_the_floor() -> None:
    """The fail-safe's clock goes through the chain's thermal guard and then its floor, as
    a decision does (the floor sits outside the guard): with the die at the limit it is the
    floor, not the lowest clock under it."""
    from gpugov.daemon.safety import SafetySettings, failsafe_clock

    chain = with_safety(_top, CLOCKS, SafetySettings(floor_mhz=850.0))
    assert failsafe_clock(chain, CLOCKS[-1], _at(0.0, 80.0)) == 900.0
    assert failsafe_clock(chain, CLOCKS[-1], _at(1.0, 70.0)) == CLOCKS[-1]
    assert failsafe_clock(chain, CLOCKS[-1], None) == CLOCKS[-1]
    assert failsafe_clock(with_safety(_top, CLOCKS), CLOCKS[-1], _at(2.0, 80.0)) == CLOCKS[0]


def test_the_fail_safe_holds_a_configured_power_budget_by_the_power_measured() -> None:
    """With the engine's page down the fail-safe decides without the controller, but the
    GPUs still read: a domain drawing 350 W over its 250 W budget is held below the top
    clock by the budget guard's measured-power rule (it locked the top clock over the
    budget for the whole outage), and runs at the top clock again once the draw is low."""
    from daemon_support import run_ticks
    from fake_pynvml import FakeNvml

    fake = FakeNvml(1)
    fake.gpus[0].power_mw = fake.gpus[0].average_power_mw = 350_000
    assembled = _blind_domain(fake, power_budget_w=250.0)
    domain = assembled.domains[0]
    top = max(fake.gpus[0].graphics_clocks_mhz)
    try:
        records, _ = run_ticks([domain], 3)
        assert all(record.failsafe for record in records)
        assert all(
            record.applied_mhz is not None and record.applied_mhz < top for record in records
        )
        fake.gpus[0].power_mw = fake.gpus[0].average_power_mw = 100_000
        records, _ = run_ticks([domain], 30)
        assert records[-1].failsafe and records[-1].applied_mhz == top
    finally:
        assembled.close()
