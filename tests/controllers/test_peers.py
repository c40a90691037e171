"""The peer governors (``controllers/peers``): each decides a supported clock, moves the
right way under pressure and copes with missing or NaN signals; the cap controllers set
the cap they promise; the specs parse."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from synthetic import make_plant, make_profile

from gpugov.controllers.peers.agft import AGFTController, spread_arms
from gpugov.controllers.peers.best_cap import best_static_cap
from gpugov.controllers.peers.default_dvfs import DefaultDVFS
from gpugov.controllers.peers.dps import DPSPowerSteering
from gpugov.controllers.peers.greenllm import GreenLLMController
from gpugov.controllers.peers.pid import SLAPIDController
from gpugov.controllers.peers.power_cap import StaticPowerCap
from gpugov.controllers.peers.power_profile import (
    PowerProfileController,
    calibrate_power_profile,
)
from gpugov.controllers.peers.throttllem import ThrottLLeMController
from gpugov.daemon.controller_config import PowerCapControllerConfig, PowerProfileControllerConfig
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.plant import Request, simulate
from gpugov.plant.types import PowerCapping, ServingObservation

CLOCKS = tuple(float(c) for c in range(600, 2001, 100))
TTFT_SLO, TPOT_SLO = 1.0, 0.05


def obs(time_s: float = 0.0, **changes: Any) -> ServingObservation:
    """A busy node's observation at ``time_s`` (fields overridable)."""
    fields: dict[str, Any] = {
        "time_s": time_s,
        "step_index": int(time_s),
        "arrived_requests": 10,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 32,
        "generated_decode_tokens": 100.0,
        "temperature_c": 50.0,
        "supported_clocks_mhz": CLOCKS,
        "requested_clock_mhz": CLOCKS[-1],
        "realized_clock_mhz": CLOCKS[-1],
        "power_w": 400.0,
        "energy_j": 400.0 * time_s,
        "power_limit_w": 700.0,
        "gpu_utilization": 1.0,
        "kv_tokens": 50_000.0,
        "kv_capacity_tokens": 400_000.0,
        "output_tokens_total": 1000.0 * time_s,
        "prompt_tokens_total": 2000.0 * time_s,
        "ttft_slo_s": TTFT_SLO,
        "tpot_slo_s": TPOT_SLO,
        "ttft_recent_s": 0.3,
        "tpot_recent_s": 0.02,
    }
    fields.update(changes)
    return ServingObservation(**fields)


# ------------------------------------------------------------------------- caps
def test_static_cap_is_70_percent_of_the_first_reported_limit() -> None:
    cap = StaticPowerCap()
    assert isinstance(cap, PowerCapping)
    assert cap.requested_power_cap_w is None  # nothing known yet: the board's own limit
    assert cap(obs()) == CLOCKS[-1]
    assert cap.requested_power_cap_w == pytest.approx(490.0)
    # The cap comes back as the limit in force; it must not compound.
    cap(obs(1.0, power_limit_w=490.0))
    assert cap.requested_power_cap_w == pytest.approx(490.0)
    assert StaticPowerCap(cap_w=300.0).requested_power_cap_w == 300.0
    with pytest.raises(ValueError, match="fraction"):
        StaticPowerCap(fraction=1.5)


def test_static_cap_ignores_a_nan_limit() -> None:
    cap = StaticPowerCap()
    cap(obs(power_limit_w=math.nan))
    assert cap.requested_power_cap_w is None
    cap(obs(1.0))
    assert cap.requested_power_cap_w == pytest.approx(490.0)


def test_dps_raises_a_used_cap_and_lowers_an_unused_one() -> None:
    dps = DPSPowerSteering(loop_s=1.0, window=2)
    dps(obs(0.0, power_w=690.0))
    assert dps.requested_power_cap_w == 700.0
    # Light load: mean power far below the cap -> the window's peak plus 10 %.
    for t in (1.0, 2.0, 3.0):
        dps(obs(t, power_w=200.0))
    assert dps.requested_power_cap_w == pytest.approx(220.0)
    # At its cap (the cap reason bit): one step (10 % of the board) up per loop.
    dps(obs(4.0, power_w=219.0, clock_event_reasons=0x4))
    assert dps.requested_power_cap_w == pytest.approx(290.0)
    # Idle: never below the floor (30 % of the board).
    for t in (5.0, 6.0, 7.0, 8.0):
        dps(obs(t, power_w=60.0))
    assert dps.requested_power_cap_w == pytest.approx(210.0)
    assert dps(obs(9.0, power_w=math.nan)) == CLOCKS[-1]


def test_power_profile_keeps_97_percent_of_the_reference_throughput() -> None:
    profile = make_profile()
    preset = calibrate_power_profile(profile)
    assert preset.ceiling_mhz < profile.maximum_clock_mhz
    assert preset.throughput_fraction >= 0.97
    assert preset.power_fraction < 1.0
    looser = calibrate_power_profile(profile, throughput_fraction=0.9)
    assert looser.ceiling_mhz < preset.ceiling_mhz
    controller = PowerProfileController.from_preset(preset)
    decision = controller(obs(supported_clocks_mhz=tuple(float(c) for c in profile.clock_mhz)))
    assert decision == preset.ceiling_mhz
    assert controller.requested_power_cap_w == pytest.approx(preset.cap_w)


def test_best_cap_holds_the_slo_and_spends_no_more_than_the_top_clock() -> None:
    plant = make_plant()
    workload = tuple(Request(i, 0.3 * i, 1500, 60) for i in range(40))
    best = best_static_cap(workload, plant, fractions=(0.3, 0.5, 0.7, 1.0))
    top = simulate(workload, plant, controller=StaticPowerCap(cap_w=plant.power_limit_w))
    assert best.cap_w in {f * plant.power_limit_w for f in (0.3, 0.5, 0.7, 1.0)}
    assert best.result.metrics.energy_j <= top.metrics.energy_j + 1e-6
    assert any(holds for *_, holds in best.evaluations)
    assert best.as_dict()["simulations"] == len(best.evaluations)


def test_default_dvfs_holds_the_top_clock_idle_as_with_a_context_open() -> None:
    """Measured on an H200: with a CUDA context open (a serving engine's) the unlocked
    GPU stays at its top clock while idle."""
    dvfs = DefaultDVFS()
    idle = {"decode_active": 0, "waiting_requests": 0, "prefill_remaining_tokens": 0.0}
    assert dvfs(obs(0.0, **idle)) == CLOCKS[-1]
    assert dvfs(obs(0.25)) == CLOCKS[-1]
    assert dvfs(obs(60.0, **idle)) == CLOCKS[-1]
    assert dvfs.requested_power_cap_w == 700.0
    with pytest.raises(ValueError, match="idle_hold_s"):
        DefaultDVFS(idle_hold_s=math.nan)


def test_default_dvfs_boosts_while_busy_and_drops_after_the_idle_hold() -> None:
    dvfs = DefaultDVFS(idle_hold_s=0.5)
    assert dvfs(obs(0.0)) == CLOCKS[-1]
    assert dvfs.requested_power_cap_w == 700.0  # the board limit, through the firmware
    idle = {"decode_active": 0, "waiting_requests": 0, "prefill_remaining_tokens": 0.0}
    assert dvfs(obs(0.25, **idle)) == CLOCKS[-1]  # idle for 0.25 s: still boosted
    assert dvfs(obs(0.5, **idle)) == CLOCKS[0]  # idle for 0.5 s: down
    assert dvfs(obs(0.75, power_limit_w=math.nan)) == CLOCKS[-1]  # work again: boost
    assert dvfs.requested_power_cap_w == 700.0
    fresh = DefaultDVFS(idle_hold_s=0.5)
    assert fresh(obs(0.0, **idle)) == CLOCKS[0]  # never busy: idle from the start


# ------------------------------------------------------------------------ PID
def test_pid_raises_the_clock_over_the_slo_and_lowers_it_under() -> None:
    pid = SLAPIDController()
    assert pid.u == 1.0  # starts at the top clock
    low = [pid(obs(t, ttft_recent_s=0.1, tpot_recent_s=0.01)) for t in (1.0, 2.0, 3.0)]
    assert low[-1] < CLOCKS[-1] and low == sorted(low, reverse=True)
    high = [pid(obs(t, ttft_recent_s=1.2)) for t in (4.0, 5.0, 6.0)]
    assert high == sorted(high) and high[-1] > low[-1]
    assert all(c in CLOCKS for c in low + high)


def test_pid_never_lowers_the_clock_while_the_slo_is_missed() -> None:
    # Latency many times its SLO that falls but stays over it (a profile whose SLO no
    # clock meets): the velocity form's proportional and derivative terms of the fall
    # (error 30 -> 3) swung the clock from the top to the lowest while every window
    # missed its SLO.
    pid = SLAPIDController()
    clocks = [
        pid(obs(float(t), tpot_recent_s=TPOT_SLO * (30.0 if t % 2 else 3.0))) for t in range(1, 9)
    ]
    assert clocks == [CLOCKS[-1]] * len(clocks)
    # The loop still lowers the clock as soon as the windows meet their SLO again.
    after = [pid(obs(float(t), ttft_recent_s=0.1, tpot_recent_s=0.01)) for t in (9, 10, 11)]
    assert after[-1] < CLOCKS[-1]


def test_pid_holds_without_latency_while_busy_and_drifts_down_idle() -> None:
    pid = SLAPIDController()
    pid(obs(0.0, ttft_recent_s=0.1, tpot_recent_s=0.01))
    held = pid(obs(1.0, ttft_recent_s=None, tpot_recent_s=math.nan))
    assert pid(obs(2.0, ttft_recent_s=None, tpot_recent_s=None)) == held
    idle = obs(3.0, ttft_recent_s=None, tpot_recent_s=None, decode_active=0)
    assert pid(idle) < held


# ------------------------------------------------------------------------ AGFT
def test_agft_measures_its_baseline_at_the_top_clock_then_explores() -> None:
    agft = AGFTController(baseline_windows=3)
    decisions = [agft(obs(0.3 * i)) for i in range(3)]
    assert decisions == [CLOCKS[-1]] * 3  # no energy delta yet, then baseline windows
    assert agft.baseline_edp is None
    agft(obs(0.9))  # the third baseline window
    assert agft.baseline_edp is not None
    later = {agft(obs(0.3 * i)) for i in range(4, 40)}
    assert later <= set(agft.arms) and len(later) > 1
    assert spread_arms(CLOCKS, 4) == (600.0, 1100.0, 1500.0, 2000.0)


def test_agft_reward_is_edp_against_the_baseline_and_minus_two_over_the_slo() -> None:
    agft = AGFTController(baseline_windows=1)
    assert agft.reward(obs(), 100.0) is None  # the baseline window
    assert agft.baseline_edp == pytest.approx(0.9 * 100.0 * 0.02)
    assert agft.reward(obs(), 45.0) == pytest.approx(2.0 * (1.0 - 45.0 / 90.0))
    assert agft.reward(obs(), 500.0) == pytest.approx(-2.0)
    assert agft.reward(obs(ttft_recent_s=2.0), 10.0) == -2.0
    assert agft.reward(obs(tpot_recent_s=math.nan), 10.0) is None
    assert agft.reward(obs(), None) is None


def test_agft_learns_to_prefer_the_rewarded_arm() -> None:
    agft = AGFTController(baseline_windows=1, initial_alpha=0.5, alpha_decay=0.5)
    agft(obs(0.0))
    agft(obs(0.3))  # baseline
    good = agft.arms[len(agft.arms) // 2]
    context = np.zeros(7)
    context[-1] = 1.0
    for _ in range(30):
        for arm in agft.arms:
            agft._learn(arm, context, 1.5 if arm == good else -0.5)
    assert agft._choose(context) == good


def test_agft_rests_at_the_lowest_clock_while_idle_and_learns_nothing_there() -> None:
    agft = AGFTController(baseline_windows=1)
    idle = {"decode_active": 0, "waiting_requests": 0, "tpot_recent_s": None}
    # Idle from the start (no baseline yet): two idle decisions keep the clock, the third
    # rests at the lowest clock, as AGFT's rest mode does after three idle checks.
    decisions = [agft(obs(0.3 * i, **idle)) for i in range(6)]
    assert decisions[:2] == [CLOCKS[-1]] * 2
    assert decisions[2:] == [CLOCKS[0]] * 4
    assert agft.baseline_edp is None and agft.rounds == 0
    # Work returns: the baseline is measured at the top clock, then the bandit decides.
    assert agft(obs(1.8)) == CLOCKS[-1]
    agft(obs(2.1))
    assert agft.baseline_edp is not None
    for i in range(8, 20):
        assert agft(obs(0.3 * i)) in agft.arms
    rounds = agft.rounds
    rested = [agft(obs(0.3 * i, **idle)) for i in range(20, 40)]
    assert rested[2:] == [CLOCKS[0]] * 18
    assert agft.rounds - rounds <= 2  # the rest decisions are no bandit rounds
    assert agft(obs(12.0)) in agft.arms  # busy again: the bandit decides at once


def test_agft_prunes_a_terrible_low_arm_and_those_below_it() -> None:
    agft = AGFTController(baseline_windows=1)
    agft(obs(0.0))
    low = agft.arms[2]
    context = np.ones(7)
    for _ in range(3):
        agft._learn(low, context, -2.0)
    assert low in agft.pruned and set(agft.arms[:2]) <= agft.pruned
    agft._prune(agft.arms[-1])
    assert agft.arms[-1] not in agft.pruned  # the top clock stays


# ------------------------------------------------------------------ throttLL'eM
def feed_throttllem(controller: ThrottLLeMController, windows: int) -> None:
    """Windows whose iteration time is 10 ms + 0.1 ms per request (the window's mean
    batch), all of it scaling with 1/f, at alternating clocks."""
    previous = 16
    for i in range(windows):
        clock = CLOCKS[-1] if i % 2 else CLOCKS[5]
        batch = 16 + 2 * i
        mean_batch, previous = 0.5 * (previous + batch), batch
        itl = (0.01 + 0.0001 * mean_batch) * CLOCKS[-1] / clock
        controller(
            obs(
                float(i),
                decode_active=batch,
                realized_clock_mhz=clock,
                requested_clock_mhz=clock,
                tpot_recent_s=itl,
                waiting_requests=0,
            )
        )


def test_throttllem_holds_the_top_clock_until_it_has_a_model() -> None:
    throttle = ThrottLLeMController(min_samples=10)
    assert throttle(obs(0.0, tpot_recent_s=math.nan)) == CLOCKS[-1]
    feed_throttllem(throttle, 5)
    assert throttle.samples < 10
    assert throttle(obs(6.0)) == CLOCKS[-1]


def test_throttllem_runs_an_idle_engine_at_the_lowest_clock_before_it_has_a_model() -> None:
    throttle = ThrottLLeMController(min_samples=10)
    idle = {"decode_active": 0, "waiting_requests": 0, "tpot_recent_s": None}
    assert [throttle(obs(float(t), **idle)) for t in range(5)] == [CLOCKS[0]] * 5
    assert throttle.samples == 0
    # Work arrives before the model has its windows: the top clock, as in the warm-up.
    assert throttle(obs(5.0)) == CLOCKS[-1]
    assert throttle(obs(6.0, prefill_remaining_tokens=5000.0, **idle)) == CLOCKS[-1]


def test_throttllem_picks_a_higher_clock_for_a_bigger_projected_batch() -> None:
    throttle = ThrottLLeMController(min_samples=10)
    feed_throttllem(throttle, 40)
    light = throttle(obs(50.0, decode_active=8, waiting_requests=0))
    heavy = throttle(obs(51.0, decode_active=200, waiting_requests=40))
    assert light < heavy
    # The lowest clock whose predicted iteration time meets 90 % of the TPOT SLO.
    assert throttle.predict_iteration_s(8.0, throttle.project(obs(decode_active=8))[1], light) <= (
        0.9 * TPOT_SLO
    )


def test_throttllem_drains_a_prompt_backlog_within_the_ttft_slo() -> None:
    throttle = ThrottLLeMController(min_samples=10)
    feed_throttllem(throttle, 40)
    quiet = throttle(obs(60.0, decode_active=8))
    backlog = throttle(obs(61.0, decode_active=8, prefill_remaining_tokens=30_000.0))
    assert backlog > quiet
    assert throttle.prompt_rate_per_mhz is not None


# --------------------------------------------------------------------- GreenLLM
def test_greenllm_decode_loop_steps_with_hysteresis() -> None:
    green = GreenLLMController(target=0.8, low=0.85, high=1.0, up_steps=3)
    start = CLOCKS.index(1500.0)
    first = green(obs(0.0, requested_clock_mhz=1500.0, tpot_recent_s=0.035))
    assert first == CLOCKS[start]  # 0.7 of the SLO: inside [0.68, 0.8], hold
    assert green(obs(1.0, tpot_recent_s=0.045)) == CLOCKS[start + 3]  # over the band: up 3
    assert green(obs(2.0, tpot_recent_s=0.01)) == CLOCKS[start + 2]  # under it: down 1
    assert green(obs(3.0, tpot_recent_s=None)) == CLOCKS[start + 2]  # busy, no sample: hold


def test_greenllm_outer_loop_tightens_the_target_after_slo_misses() -> None:
    green = GreenLLMController(outer_s=5.0)
    before = green.target
    for t in range(12):
        green(obs(float(t), tpot_recent_s=0.06))
    assert green.target < before


def test_greenllm_prefill_clock_from_its_fitted_models() -> None:
    green = GreenLLMController()
    assert green.prefill_index(obs(prefill_remaining_tokens=0.0), CLOCKS) is None
    # No model yet: the top clock for a backlog.
    assert green.prefill_index(obs(prefill_remaining_tokens=5000.0), CLOCKS) == len(CLOCKS) - 1
    # Windows at two clocks: prompt rate 10 tokens/s per MHz, power 100 + 300 x^3 W.
    total = 0.0
    for i in range(10):
        clock = CLOCKS[-1] if i % 2 else CLOCKS[4]
        total += 10.0 * clock  # one fully busy second at this clock
        green(
            obs(
                float(i),
                realized_clock_mhz=clock,
                prompt_tokens_total=total,
                power_w=100.0 + 300.0 * (clock / CLOCKS[-1]) ** 3,
            )
        )
    small = green.prefill_index(obs(prefill_remaining_tokens=2000.0), CLOCKS)
    large = green.prefill_index(obs(prefill_remaining_tokens=12_000.0), CLOCKS)
    assert small is not None and large is not None and small <= large
    # The large backlog drains within 70 % of the TTFT SLO at the chosen clock.
    assert 12_000.0 / (10.0 * CLOCKS[large]) <= 0.7 * TTFT_SLO + 1e-9


# ------------------------------------------------------- every peer, every signal
PEERS = ("power-cap", "dps", "default-dvfs", "agft", "pid", "throttllem", "greenllm")


@pytest.mark.parametrize("spec", PEERS)
def test_every_peer_decides_a_supported_clock_with_nan_signals(spec: str) -> None:
    context = ControllerContext(period_s=0.5, supported_clocks_mhz=CLOCKS)
    chain = build_controller(parse_controller_spec(spec), context)
    nan = dict.fromkeys(
        (
            "power_w",
            "energy_j",
            "realized_clock_mhz",
            "gpu_utilization",
            "power_limit_w",
            "kv_tokens",
            "output_tokens_total",
            "prompt_tokens_total",
            "ttft_recent_s",
            "tpot_recent_s",
        ),
        math.nan,
    )
    for t in range(30):
        seen = obs(0.5 * t, **(nan if t % 3 == 0 else {}))
        if t % 5 == 0:
            seen = replace(seen, decode_active=0, waiting_requests=0)
        assert chain(seen) in CLOCKS


def test_peer_specs_parse_and_refuse_bad_arguments() -> None:
    assert parse_controller_spec("power-cap") == PowerCapControllerConfig(kind="power-cap")
    assert parse_controller_spec("power-cap:350").cap_w == 350.0  # type: ignore[union-attr]
    assert parse_controller_spec("power-profile:h100-sxm-llama3-8b") == (
        PowerProfileControllerConfig(kind="power-profile", profile="h100-sxm-llama3-8b")
    )
    for kind in ("dps", "default-dvfs", "agft", "pid", "throttllem", "greenllm"):
        assert parse_controller_spec(kind).kind == kind
    for bad in ("power-cap:-3", "power-cap:lots", "agft:1", "pid:x", "power-profile:"):
        with pytest.raises(ValueError, match="--controller"):
            parse_controller_spec(bad)


def test_power_profile_on_a_node_needs_a_preset_or_a_profile() -> None:
    from gpugov.daemon.errors import ControllerError

    context = ControllerContext(period_s=1.0, supported_clocks_mhz=CLOCKS)
    with pytest.raises(ControllerError, match="power-profile needs"):
        build_controller(PowerProfileControllerConfig(kind="power-profile"), context)
    preset = PowerProfileControllerConfig(kind="power-profile", ceiling_mhz=1500.0, cap_w=400.0)
    chain = build_controller(preset, context)
    assert chain(obs()) == 1500.0
    assert chain.requested_power_cap_w == 400.0  # the chain passes the cap through


def test_power_profile_cap_is_scaled_to_the_domain_gpu_count() -> None:
    """A preset calibrated on a 1-GPU profile, run on an 8-GPU domain, caps the domain at
    eight GPUs' share (it capped all eight at one GPU's power); on a profile of the
    domain's own TP degree the cap is the calibrated one."""
    from gpugov.daemon.decide import profile_fit_warnings
    from gpugov.plant import load_profile

    one = load_profile("h100-sxm-llama3-8b")
    eight = load_profile("h100-sxm-llama3-70b-tp8")
    assert (one.tensor_parallel, eight.tensor_parallel) == (1, 8)
    for profile, expected_scale in ((one, 8.0), (eight, 1.0)):
        spec = PowerProfileControllerConfig(kind="power-profile", profile=profile.name)
        context = ControllerContext(
            period_s=1.0, supported_clocks_mhz=tuple(profile.clock_mhz), gpu_count=8
        )
        chain = build_controller(spec, context)
        cap = calibrate_power_profile(profile).cap_w
        assert chain.requested_power_cap_w == pytest.approx(cap * expected_scale)
        warnings = profile_fit_warnings(spec, tuple(profile.clock_mhz), 8)
        assert len(warnings) == (1 if expected_scale != 1.0 else 0)
        assert all("scaled by 8/1" in line for line in warnings)
