"""``replay`` runs the controller on virtual time, as the studies do (docs/daemon.md): an
outside controller is called directly, with no node's decision deadline, and an MPC's
solves are bounded by the deterministic budget, so a replay's report does not depend on
how busy the machine is."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gpugov.controllers.contract import unwrap
from gpugov.controllers.mpc.controller import DEFAULT_SOLVE_BUDGET_EVALUATIONS, MPCController
from gpugov.daemon.controller_config import FixedControllerConfig
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.record import Recorder
from gpugov.daemon.replay import _replayed_controller, replay
from gpugov.daemon.service import simulated_run
from gpugov.plant import Request, ServingPlant, load_profile

SLOW = """
import time


def make(context):
    clocks = context.supported_clocks_mhz
    calls = [0]

    def decide(observation):
        calls[0] += 1
        if calls[0] == 3:
            time.sleep(0.6)  # past a node's deadline: the 0.25 s control period
        return clocks[-1]

    return decide
"""


def _recording(path: Path) -> int:
    """A short simulated node's recording at a 0.25 s period; its tick count."""
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    workload = tuple(Request(i, 0.5 * i, 300, 20) for i in range(6))
    clock = VirtualClock()
    sim = simulated_run(
        workload,
        plant,
        FixedControllerConfig(kind="fixed", clock_mhz=1410),
        clock,
        period_s=0.25,
        virtual_time=True,
    )
    ticks: list[object] = []
    recorder = Recorder(path, sim.header)
    try:

        def on_tick(batch: list[object]) -> None:
            ticks.extend(batch)
            recorder(batch)  # type: ignore[arg-type]

        run(
            [sim.domain],
            TimedLoop(0.25, clock=clock, sleep=clock.sleep),
            on_tick=on_tick,
            before_tick=sim.before_tick,
        )
    finally:
        recorder.close()
        sim.finish()
    return len(ticks)


def test_a_slow_outside_controller_is_replayed_not_timed_out(
    tmp_path: Path, module_on_path: Callable[[str, str], str]
) -> None:
    name = module_on_path("slow_replay_governor", SLOW)
    path = tmp_path / "run.jsonl"
    ticks = _recording(path)
    report = replay(path, parse_controller_spec(f"{name}:make"))
    assert report.compared == ticks > 3
    assert report.replayed_sum_mhz == ticks * 1980.0


def test_a_replayed_mpc_solves_within_the_deterministic_budget() -> None:
    info = {"name": "sim", "gpus": ["0"], "gpu_names": ["NVIDIA H100 SXM5 80GB HBM3"]}
    clocks = [float(c) for c in load_profile("h100-sxm-llama3-8b").clock_mhz]
    chain = _replayed_controller(parse_controller_spec("mpc"), info, 1.0, clocks)
    mpc = unwrap(chain)
    assert isinstance(mpc, MPCController)
    assert mpc.solve_budget_evaluations == DEFAULT_SOLVE_BUDGET_EVALUATIONS


def test_a_long_replay_keeps_a_node_s_history_of_plans_not_every_one() -> None:
    """A replay of a day's recording through an MPC kept every decision's plan and times
    (hundreds of MB no report reads); it keeps the last ones, as the node that recorded
    it did."""
    from gpugov.daemon.service import CONTROLLER_HISTORY_STEPS
    from gpugov.plant.types import ServingObservation

    info = {"name": "sim", "gpus": ["0"], "gpu_names": ["NVIDIA H100 SXM5 80GB HBM3"]}
    clocks = [float(c) for c in load_profile("h100-sxm-llama3-8b").clock_mhz]
    chain = _replayed_controller(parse_controller_spec("mpc"), info, 1.0, clocks)
    mpc = unwrap(chain)
    assert isinstance(mpc, MPCController)
    for step in range(CONTROLLER_HISTORY_STEPS + 50):
        chain(
            ServingObservation(
                time_s=float(step),
                step_index=step,
                arrived_requests=step,
                prefill_remaining_tokens=0.0,
                decode_active=0,
                generated_decode_tokens=0.0,
                temperature_c=40.0,
                supported_clocks_mhz=tuple(clocks),
            )
        )
    assert len(mpc.plans_by_step) == CONTROLLER_HISTORY_STEPS
    assert max(mpc.plans_by_step) == CONTROLLER_HISTORY_STEPS + 49


def test_a_replayed_mpc_on_a_profile_of_other_gpus_says_so_as_a_node_does(
    tmp_path: Path,
) -> None:
    """A node whose ``mpc`` profile does not describe its GPUs says so in one line at its
    start (``decide.profile_fit_warnings``); a replay of its recording through such an
    ``mpc`` planned on the other domain's rates and powers without a word."""
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-70b-tp4"))
    workload = tuple(Request(i, 0.5 * i, 300, 20) for i in range(4))
    clock = VirtualClock()
    sim = simulated_run(workload, plant, FixedControllerConfig(kind="fixed", clock_mhz=1410), clock)
    path = tmp_path / "tp4.jsonl"
    recorder = Recorder(path, sim.header)
    try:
        run(
            [sim.domain],
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            on_tick=recorder,
            before_tick=sim.before_tick,
        )
    finally:
        recorder.close()
    lines: list[str] = []
    replay(path, parse_controller_spec("mpc:h100-sxm-llama3-8b"), warn=lines.append)
    assert lines == [
        "domain 'sim': controller: mpc profile 'h100-sxm-llama3-8b' describes a domain of 1 "
        "GPU(s) (tensor_parallel), this domain has 4: its rates and powers are another "
        "domain's"
    ]
    same: list[str] = []
    replay(path, parse_controller_spec("mpc:h100-sxm-llama3-70b-tp4"), warn=same.append)
    assert same == []


def test_a_recording_of_a_chain_with_no_dwell_replays(tmp_path: Path) -> None:
    """A run with ``--dwell 0`` (or a config's ``dwell_s = 0`` or
    ``min_relock_interval_s = 0``, which the config takes) records a zero in its safety
    settings, and its replay runs with them: the header check read a zero as missing and
    refused the recording as holding a negative number."""
    from gpugov.cli import main

    path = tmp_path / "run.jsonl"
    argv = ["run", "--simulate", "--virtual", "--duration", "10", "--controller", "reactive"]
    argv += ["--dwell", "0", "--metrics-address", "none", "--record", str(path), "--quiet"]
    assert main(argv) == 0
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["domains"][0]["safety"]["min_relock_interval_s"] = 0
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    report = replay(path, parse_controller_spec("reactive"))
    assert report.compared == len(lines) - 1 and report.differing == 0


def test_the_report_says_the_recordings_settings_the_replay_ran_with(tmp_path: Path) -> None:
    """The replay's report says, per domain, the period, chain and SLO target the recording
    gave the replayed controller, as simulate's title says its own: a replay of a run with
    --dwell 2 read as one of the defaults."""
    from gpugov.cli import main

    path = tmp_path / "run.jsonl"
    argv = ["run", "--simulate", "--virtual", "--duration", "5", "--controller", "reactive"]
    argv += ["--dwell", "2", "--floor", "900", "--slo-target", "0.95"]
    assert main([*argv, "--metrics-address", "none", "--record", str(path), "--quiet"]) == 0
    text = replay(path, parse_controller_spec("max")).format()
    assert text.splitlines()[1] == (
        "  settings            sim: every 1 s, dwell 2 s, clock floor 900 MHz, SLO target 95%"
    )
