"""The simulated daemon: same loop on the plant, consistent with plant.simulate, live metrics."""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugov.controllers.baseline import reactive_clock_controller
from gpugov.daemon.backend import POWER_OVER_LIMIT_FACTOR
from gpugov.daemon.controller_config import FixedControllerConfig, ReactiveControllerConfig
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.record import Recorder
from gpugov.daemon.record_reader import read_recording
from gpugov.daemon.replay import replay
from gpugov.daemon.service import SimulatedRun, simulated_run
from gpugov.daemon.simulated import node_view
from gpugov.plant import ServingPlant, load_profile, simulate
from gpugov.plant.gpu_physics import CLOCK_EVENT_SW_POWER_CAP
from gpugov.plant.workload import load_trace


@pytest.fixture(scope="module")
def workload_and_plant() -> tuple[tuple, ServingPlant]:  # type: ignore[type-arg]
    workload, _ = load_trace("azure-conv-10min", duration_s=180)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    return workload, plant


def _run_to_the_end(sim: SimulatedRun, clock: VirtualClock) -> list[TickRecord]:
    """Run the simulated node's loop on virtual time until its workload ends; its ticks."""
    records: list[TickRecord] = []
    run(
        [sim.domain],
        TimedLoop(1.0, clock=clock, sleep=clock.sleep),
        on_tick=records.extend,
        before_tick=sim.before_tick,
    )
    return records


def test_virtual_minutes_match_plant_simulate_and_metrics_are_live(
    workload_and_plant: tuple,
    tmp_path: Path,  # type: ignore[type-arg]
) -> None:
    workload, plant = workload_and_plant
    clock = VirtualClock()
    sim = simulated_run(workload, plant, ReactiveControllerConfig(kind="reactive"), clock)
    exporter = Exporter(port=0)
    scraped: list[tuple[TickRecord, dict[tuple[str, str | None], float]]] = []
    records: list[TickRecord] = []
    recorder = Recorder(tmp_path / "run.jsonl", sim.header)

    def on_tick(batch: Sequence[TickRecord]) -> None:
        records.extend(batch)
        recorder(batch)
        if batch[0].step in (30, 120):
            with urllib.request.urlopen(exporter.url, timeout=5) as response:
                text = response.read().decode()
            values = {
                (s.name, s.labels.get("gpu")): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
            }
            scraped.append((batch[0], values))

    try:
        stats = run(
            [sim.domain],
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            exporter=exporter,
            on_tick=on_tick,
            before_tick=sim.before_tick,
        )
    finally:
        exporter.close()
        recorder.close()
    assert sim.result is not None
    daemon_metrics = sim.result.metrics.as_dict()
    # The daemon's loop sees a vLLM page through its observer; so does node_view.
    reference = simulate(
        workload, plant, controller=reactive_clock_controller, view=node_view
    ).metrics.as_dict()
    for key in (
        "energy_j",
        "output_tokens",
        "completed_requests",
        "clock_changes",
        "simulated_duration_s",
        "ttft_p95_s",
        "tpot_p95_s",
        "slo_attainment",
    ):
        assert daemon_metrics[key] == pytest.approx(reference[key], rel=1e-9), key
    assert stats.ticks == len(records) > 180

    # Scraped values are the plant's at that tick.
    assert len(scraped) == 2
    for record, values in scraped:
        o = record.observation
        assert values[("gpugov_gpu_power_watts", "0")] == pytest.approx(o.power_w)
        assert values[("gpugov_gpu_energy_joules_total", "0")] == pytest.approx(o.energy_j)
        assert values[("gpugov_gpu_temperature_celsius", "0")] == pytest.approx(o.temperature_c)
        assert values[("gpugov_queue_waiting_requests", None)] == o.waiting_requests
        assert values[("gpugov_queue_running_requests", None)] == o.decode_active
        assert values[("gpugov_requested_clock_hertz", None)] == pytest.approx(
            record.requested_mhz * 1e6
        )
        assert values[("gpugov_loop_ticks_total", None)] == record.step + 1
        # The plant's TTFT SLO grows with the window's mean prompt (per-token allowance).
        assert values[("gpugov_ttft_slo_seconds", None)] == pytest.approx(o.ttft_recent_slo_s)
        assert o.ttft_slo_s is not None and o.ttft_slo_s >= plant.profile.ttft_slo_s

    # The actuator reset the simulated GPU (to the maximum) after the result was frozen.
    backend = sim.domain.observer.gpus.backends[0]
    assert backend.resets == 1  # type: ignore[attr-defined]

    # The recording replays through the same controller with no difference ...
    header, rows = read_recording(tmp_path / "run.jsonl")
    assert header["mode"] == "simulated" and len(rows) == len(records)
    assert len(header["domains"][0]["gpu_names"]) == len(header["domains"][0]["gpus"])
    assert json.loads((tmp_path / "run.jsonl").read_text().splitlines()[1])["decision_mhz"] > 0
    same = replay(tmp_path / "run.jsonl", ReactiveControllerConfig(kind="reactive"))
    assert same.compared == len(records) and same.differing == 0
    # ... and differs from a fixed clock where the governor moved.
    fixed = replay(tmp_path / "run.jsonl", FixedControllerConfig(kind="fixed", clock_mhz=1980))
    assert fixed.differing > 0
    assert "differing ticks" in fixed.format()


def test_the_exact_view_matches_plant_simulate_without_a_view(
    workload_and_plant: tuple,  # type: ignore[type-arg]
) -> None:
    """``engine_view="exact"`` hands the plant's exact state through the observer
    unchanged: the daemon's loop runs what ``plant.simulate`` does without a view."""
    workload, plant = workload_and_plant
    clock = VirtualClock()
    spec = ReactiveControllerConfig(kind="reactive")
    sim = simulated_run(workload, plant, spec, clock, engine_view="exact")
    assert sim.header["engine_view"] == "exact"
    _run_to_the_end(sim, clock)
    assert sim.result is not None
    reference = simulate(workload, plant, controller=reactive_clock_controller)
    assert sim.result.metrics.energy_j == pytest.approx(reference.metrics.energy_j, rel=1e-9)
    assert sim.result.metrics.slo_attainment == reference.metrics.slo_attainment


def test_speed_mode_uses_scaled_wall_clock(workload_and_plant: tuple) -> None:  # type: ignore[type-arg]
    from gpugov.daemon.loop import ScaledClock

    workload, plant = workload_and_plant
    wall = VirtualClock()
    scaled = ScaledClock(60.0, wall=wall)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds / 60.0)  # wall seconds the real sleeper would wait
        wall.sleep(seconds / 60.0)

    sim = simulated_run(
        workload[:50], plant, FixedControllerConfig(kind="fixed", clock_mhz=1200), scaled
    )
    run([sim.domain], TimedLoop(1.0, clock=scaled, sleep=sleep), before_tick=sim.before_tick)
    assert sim.result is not None and sim.result.metrics.completed_requests == 50
    assert sleeps and max(sleeps) == pytest.approx(1.0 / 60.0)


def _waits_past_the_dwell(
    rows: list[dict[str, Any]], applied: list[float], dwell_s: float
) -> list[float]:
    """For each lowering of ``applied`` (one clock per recorded tick), how long after both
    the dwell since the last change and the first tick whose decision asked lower it came."""
    waits: list[float] = []
    held: float | None = None
    since = asked = 0.0
    for row, mhz in zip(rows, applied, strict=True):
        time_s = row["time_s"]
        if held is not None and mhz < held:
            waits.append(time_s - max(since + dwell_s, min(asked, time_s)))
        if held is None or mhz != held:
            held, since, asked = mhz, time_s, math.inf
        elif row["decision_mhz"] < held and asked == math.inf:
            asked = time_s
    return waits


def test_real_h200_dry_run_recording_replays() -> None:
    from daemon_support import FIXTURES

    path = FIXTURES / "h200_dryrun_reactive.jsonl"
    header, rows = read_recording(path)
    assert header["mode"] == "node" and header["dry_run"] is True
    assert len(rows) >= 100
    clocks = header["domains"][0]["supported_clocks_mhz"]
    assert (clocks[0], clocks[-1], len(clocks)) == (345.0, 1980.0, 110)
    energies = [row["observation"]["energy_j"] for row in rows]
    assert energies == sorted(energies)
    for row in rows:
        o = row["observation"]
        assert 50.0 < o["power_w"] < 800.0 and o["power_limit_w"] == 700.0
        assert 345.0 <= o["realized_clock_mhz"] <= 1980.0
        assert not row["failsafe"] and row["engine_error"] is None
    # Prefill (compute-bound) hits the power cap; decode (memory-bound) runs at the top clock.
    prefill = [r["observation"] for r in rows if r["observation"]["waiting_requests"] == 8]
    decode = [r["observation"] for r in rows if r["observation"]["decode_active"] == 8]
    assert min(o["realized_clock_mhz"] for o in prefill) < 1700.0
    assert max(o["realized_clock_mhz"] for o in decode) == 1980.0
    same = replay(path, ReactiveControllerConfig(kind="reactive"))
    assert same.compared == len(rows)
    # The node timed its dwell (1 s, two 0.5 s periods) by its ticks' own times, each a
    # few microseconds after its target: a lowering whose second tick came that much
    # short of 1 s waited a third period. The chain now counts whole periods, so the
    # replay applies each lowering at the first tick past the dwell that asks it.
    replayed = {diff.step: diff.replayed_mhz for diff in same.differences}
    recorded = [row["requested_mhz"] for row in rows]
    assert max(_waits_past_the_dwell(rows, recorded, 1.0)) == pytest.approx(0.5, abs=1e-3)
    applied = [replayed.get(row["step"], row["requested_mhz"]) for row in rows]
    assert max(_waits_past_the_dwell(rows, applied, 1.0)) == pytest.approx(0.0, abs=1e-3)
    # Each difference is such a lowering, a period sooner; the last, the recorded fall to
    # 345 MHz, comes while the dwell of the replay's own fall a period before holds.
    assert all(diff.replayed_mhz < diff.recorded_mhz for diff in same.differences[:-1])
    assert same.differing == 25  # each a lowering a period sooner, and the last below
    last = same.differences[-1]
    assert (last.recorded_mhz, last.replayed_mhz) == (345.0, 1140.0)
    assert replay(path, FixedControllerConfig(kind="fixed", clock_mhz=1980)).differing > 0


def test_tensor_parallel_plant_is_a_multi_gpu_domain() -> None:
    """A TP-4 profile runs as a domain of four simulated GPUs whose sums are the plant's."""
    workload, _ = load_trace("azure-conv-10min", duration_s=40)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-70b-tp4"))
    assert plant.tensor_parallel == 4
    clock = VirtualClock()
    sim = simulated_run(workload, plant, ReactiveControllerConfig(kind="reactive"), clock)
    backends = sim.domain.observer.gpus.backends
    assert [b.label for b in backends] == ["0", "1", "2", "3"]
    _run_to_the_end(sim, clock)
    assert sim.result is not None
    samples = [b.sample() for b in backends]
    assert len({s.sm_clock_mhz for s in samples}) == 1
    assert sum(s.energy_j for s in samples) == pytest.approx(sim.result.metrics.energy_j, rel=1e-6)
    assert sum(s.power_limit_w for s in samples) == pytest.approx(plant.power_limit_w)  # type: ignore[misc]
    # One clock decision per tick, however many GPUs the domain locks.
    reference = simulate(workload, plant, controller=reactive_clock_controller).metrics
    assert sim.result.metrics.clock_changes == reference.clock_changes
    assert sim.result.metrics.energy_j == pytest.approx(reference.energy_j, rel=1e-9)


def test_replay_fills_an_online_gpu_auto_hint_from_the_recorded_gpu_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recording's header names the domain's GPUs (NVML), so `gpugov replay` resolves
    an mpc-online `gpu = "auto"` hint as the daemon did; an older recording warns once."""
    from daemon_support import FIXTURES

    from gpugov.daemon.controller_config import OnlineMPCControllerConfig
    from gpugov.daemon.replay import _replayed_controller

    spec = OnlineMPCControllerConfig.model_validate(
        {"kind": "mpc-online", "prior": {"gpu": "auto", "params_b": 70}}
    )
    two = {"gpu_names": ["NVIDIA H200", "NVIDIA H200"], "gpus": ["0", "1"]}
    clocks = [900.0, 1980.0]
    controller = _replayed_controller(spec, two, 0.5, clocks).unwrapped  # type: ignore[attr-defined]
    assert controller.prior is not None and "H200" in controller.prior.source
    assert "x2" in controller.prior.source and controller.prior.board_power_w == 1400.0
    with caplog.at_level("WARNING"):
        unnamed = _replayed_controller(spec, {"gpus": ["0"]}, 0.5, clocks).unwrapped  # type: ignore[attr-defined]
    assert unnamed.prior is None and "reports no name" in caplog.text

    # The whole replay runs through it on a real recording given a name.
    lines = (FIXTURES / "h200_dryrun_reactive.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["domains"][0]["gpu_names"] = ["NVIDIA H200"]
    path = tmp_path / "named.jsonl"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    report = replay(path, spec)
    assert report.compared == len(lines) - 1


def test_replay_compares_the_power_caps_a_recording_carries(tmp_path: Path) -> None:
    """A cap kind's recording carries the limit gpugov held each tick (``power_cap_w``);
    replay compares it with the cap the replayed controller asks for, and refuses a cap
    that is not a number in one line naming the tick."""
    from gpugov.daemon import node_cli
    from gpugov.daemon.controller_config import MPCControllerConfig, PowerCapControllerConfig
    from gpugov.daemon.record import RecordingError

    path = tmp_path / "cap.jsonl"
    argv = ["run", "--simulate", "--virtual", "--duration", "20", "--controller"]
    argv += ["power-cap:300", "--metrics-address", "none", "--record", str(path), "--quiet"]
    assert node_cli.main(argv) == 0
    _, rows = read_recording(path)
    assert {row["power_cap_w"] for row in rows} == {300.0}
    same = replay(path, PowerCapControllerConfig(kind="power-cap", cap_w=300.0))
    assert same.compared == len(rows) and same.capped == same.compared
    assert same.cap_differing == 0 and "differing on 0" in same.format()
    lower = replay(path, PowerCapControllerConfig(kind="power-cap", cap_w=250.0))
    assert lower.cap_differing == lower.compared
    assert lower.recorded_cap_sum_w / lower.recorded_cap_ticks == pytest.approx(300.0)
    assert lower.replayed_cap_sum_w / lower.replayed_cap_ticks == pytest.approx(250.0)
    assert "replayed (as asked) 250 W" in lower.format()
    unset = replay(path, MPCControllerConfig(kind="mpc"))  # asks for no cap: every tick differs
    assert unset.cap_differing == unset.compared and unset.replayed_cap_ticks == 0
    lines = path.read_text().splitlines()
    tick = json.loads(lines[3])
    tick["power_cap_w"] = "lots"
    lines[3] = json.dumps(tick)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordingError, match=r":4: power_cap_w must be a positive number"):
        replay(path, PowerCapControllerConfig(kind="power-cap", cap_w=300.0))


def test_a_board_limit_below_the_lowest_clocks_draw_reads_as_a_capped_gpu() -> None:
    """A profile whose power limit is below what even its lowest clock draws (an operator
    lowered it with ``nvidia-smi -pl``) reads as a real capped GPU: power within the limit,
    SW power cap among the reasons, and no power read taken as failed."""
    workload, _ = load_trace("azure-conv-10min", duration_s=40)
    profile = load_profile("h100-sxm-llama3-8b")
    # Far enough below the lowest clock's decode draw that running it uncapped reads as
    # more than POWER_OVER_LIMIT_FACTOR times the limit, still above every idle power.
    limit = 0.5 * (max(profile.idle_power_w) + profile.decode_power_w[0] / POWER_OVER_LIMIT_FACTOR)
    assert max(profile.idle_power_w) < limit < profile.decode_power_w[0] / POWER_OVER_LIMIT_FACTOR
    plant = ServingPlant.from_profile(profile, power_limit_w=limit)
    clock = VirtualClock()
    sim = simulated_run(workload, plant, FixedControllerConfig(kind="fixed", clock_mhz=1980), clock)
    records = _run_to_the_end(sim, clock)
    assert sim.result is not None
    assert sim.domain.observer.gpus.gpu_read_errors == {"0": 0}
    powers = [r.observation.power_w for r in records if r.observation.power_w is not None]
    assert len(powers) == len(records) and max(powers) <= limit + 1e-6
    assert all(r.gpu_read_errors == () for r in records)
    assert any((r.observation.clock_event_reasons or 0) & CLOCK_EVENT_SW_POWER_CAP for r in records)
    assert sim.result.metrics.power_cap_violation_s == 0.0


def test_a_replay_holds_the_fail_safes_top_clock_for_the_dwell_as_the_node_does(
    tmp_path: Path,
) -> None:
    """On a node the fail-safe locks the top clock outside the chain, and the chain holds
    it from that lock (its dwell, its relock interval). The replay skipped the fail-safe
    tick without telling the chain, so the next tick's lower clock came at once there:
    a difference from the node that the controller did not make."""
    from daemon_support import FIXTURES

    lines = FIXTURES.joinpath("h200_dryrun_reactive.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:]]
    index = 10
    rows[index]["failsafe"] = True
    rows[index]["requested_mhz"] = 1980.0
    path = tmp_path / "failsafe.jsonl"
    path.write_text("\n".join([lines[0], *(json.dumps(row) for row in rows)]) + "\n")
    report = replay(path, FixedControllerConfig(kind="fixed", clock_mhz=900))
    replayed = {diff.step: diff.replayed_mhz for diff in report.differences}
    after = rows[index + 1]
    assert report.skipped_failsafe == 1
    # Within the recording's 1 s dwell of the fail-safe's lock: the top clock held.
    assert after["time_s"] - rows[index]["time_s"] < 1.0
    assert replayed.get(after["step"], after["requested_mhz"]) == 1980.0


def test_the_node_exports_what_the_thermal_guard_held() -> None:
    """A simulated node whose die reaches its thermal limit at the top clock: the chain's
    guard caps the clock, and the snapshot the exporter reads says at what and how often
    (gpugov_thermal_cap_hertz, gpugov_thermal_capped_decisions_total)."""
    workload, _ = load_trace("azure-conv-10min", duration_s=60, load_scale=3.0)
    profile = load_profile("h100-sxm-llama3-8b")
    # Well under what the top clock's load reaches here from a 30 C inlet.
    plant = ServingPlant.from_profile(profile, thermal_limit_c=50.0)
    clock = VirtualClock()
    sim = simulated_run(workload, plant, FixedControllerConfig(kind="fixed", clock_mhz=1980), clock)
    _run_to_the_end(sim, clock)
    snapshot = sim.domain.snapshot()
    assert snapshot.thermal_capped_total is not None and snapshot.thermal_capped_total > 0
    assert sim.result is not None and sim.result.metrics.peak_temperature_c <= 50.0 + 0.5
