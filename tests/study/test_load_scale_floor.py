"""``--load-scale`` on a trace whose arrivals come in simultaneous groups (Mooncake's
3 s grid, replayed as written: ``--keep-batched-stamps``): the scale is applied (the
arrival rate changes by exactly X), and once every group finishes before the next
arrives, the command says that a smaller scale only adds idle time (the light-load
floor), in ``simulate`` and ``run --simulate``; ``load`` names the groups."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pytest
from synthetic import make_plant

from gpugov.cli import main
from gpugov.plant.result import arrival_separation
from gpugov.plant.types import RequestRecord
from gpugov.plant.workload import load_trace
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer

GROUPS = 6
GROUP_SIZE = 4
GRID_MS = 3000


def grouped_trace(tmp_path: Path) -> Path:
    """A Mooncake-format file: GROUPS arrival times GRID_MS apart, GROUP_SIZE requests
    at each, with unequal prompts (a made-up shape, not the real trace)."""
    lines = []
    for group in range(GROUPS):
        for member in range(GROUP_SIZE):
            prompt = 500 + 700 * member + 90 * group
            lines.append(
                json.dumps(
                    {
                        "timestamp": group * GRID_MS,
                        "input_length": prompt,
                        "output_length": 20 + 15 * member,
                        "hash_ids": [],
                    }
                )
            )
    path = tmp_path / "grouped.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def record(arrival_s: float, finish_s: float | None) -> RequestRecord:
    """A finished (or, with ``finish_s=None``, unfinished) request record."""
    return RequestRecord(0, arrival_s, 10, 2, arrival_s + 0.1, finish_s, 2)


def test_separation_counts_groups_and_detects_overlap() -> None:
    apart = [record(0.0, 1.0), record(0.0, 2.0), record(5.0, 6.0)]
    assert arrival_separation(apart) == arrival_separation(list(reversed(apart)))
    result = arrival_separation(apart)
    assert (result.arrival_times, result.largest_group, result.separated) == (2, 2, True)
    # the second member of the first group still runs when the next group arrives
    assert not arrival_separation([record(0.0, 1.0), record(0.0, 5.5), record(5.0, 6.0)]).separated
    # an unfinished request is still running at every later arrival
    assert not arrival_separation([record(0.0, None), record(5.0, 6.0)]).separated
    assert arrival_separation([record(0.0, 1.0), record(5.0, None)]).separated


@pytest.mark.parametrize("scale", [4.0, 0.5, 0.01])
def test_scale_changes_the_arrival_rate_not_the_window(tmp_path: Path, scale: float) -> None:
    path = grouped_trace(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        base, _ = load_trace(path, duration_s=10.0, spread_batches=False)
        scaled, report = load_trace(path, duration_s=10.0, load_scale=scale, spread_batches=False)
    # the window (trace seconds) is cut first: 4 groups at 0, 3, 6, 9 s
    assert len(base) == len(scaled) == report.requests == 4 * GROUP_SIZE
    assert [r.request_id for r in scaled] == [r.request_id for r in base]
    assert scaled[-1].arrival_time_s == pytest.approx(9.0 / scale)
    rate = len(scaled) / scaled[-1].arrival_time_s
    assert rate == pytest.approx(scale * len(base) / base[-1].arrival_time_s)
    # the groups stay whole: the scale spaces them, it never splits one
    assert len({r.arrival_time_s for r in scaled}) == 4


def run_json(
    tmp_path: Path, trace: Path, scale: float, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, object], str]:
    """``gpugov simulate`` on ``trace`` at ``scale``: its JSON and its stdout."""
    out = tmp_path / f"run-{scale:g}.json"
    code = main(
        [
            "simulate",
            "--trace",
            str(trace),
            "--keep-batched-stamps",
            "--load-scale",
            str(scale),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_simulate_says_when_a_smaller_scale_cannot_change_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = grouped_trace(tmp_path)
    busy, busy_out = run_json(tmp_path, trace, 200.0, capsys)
    light, light_out = run_json(tmp_path, trace, 0.5, capsys)
    lighter, lighter_out = run_json(tmp_path, trace, 0.05, capsys)
    assert "light-load floor" not in busy_out
    assert not busy["metadata"]["trace"]["light_load_floor"]  # type: ignore[index]
    for payload, printed in ((light, light_out), (lighter, lighter_out)):
        meta = payload["metadata"]["trace"]  # type: ignore[index]
        assert meta["light_load_floor"] and meta["arrival_times"] == GROUPS
        assert meta["largest_arrival_group"] == GROUP_SIZE
        assert printed.count("note: every request finished before the next arrival time") == 1
        assert f"at {GROUPS} arrival times, up to {GROUP_SIZE} at once" in printed
    # at the floor: the same latencies and attainment, only idle time and energy grow
    light_m, lighter_m = light["metrics"], lighter["metrics"]  # type: ignore[index]
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "slo_attainment"):
        assert lighter_m[key] == pytest.approx(light_m[key], rel=1e-9)
    assert lighter_m["simulated_duration_s"] > 5 * light_m["simulated_duration_s"]
    assert lighter_m["energy_j"] > light_m["energy_j"]
    busy_m = busy["metrics"]  # type: ignore[index]
    assert busy_m["ttft_p99_s"] > light_m["ttft_p99_s"]  # the busy run did queue


def test_run_simulate_prints_the_same_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = grouped_trace(tmp_path)
    code = main(
        [
            "run",
            "--simulate",
            "--virtual",
            "--keep-batched-stamps",
            "--trace",
            str(trace),
            "--load-scale",
            "0.5",
            "--metrics-address",  # the default port is one other tests (in parallel) use
            "none",
            "--quiet",
        ]
    )
    assert code == 0
    assert "light-load floor" in capsys.readouterr().out


def test_load_names_the_simultaneous_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = grouped_trace(tmp_path)
    server = EmulatorServer(EmulatedNode(make_plant()), "127.0.0.1", 0)
    server.start()
    try:
        code = main(
            [
                "load",
                "--trace",
                str(trace),
                "--keep-batched-stamps",
                "--url",
                server.url,
                "--duration",
                "4",
                "--load-scale",
                "10",
                "--quiet",
            ]
        )
    finally:
        server.close()
    assert code == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"gpugov load: {2 * GROUP_SIZE} requests from grouped.jsonl")
    assert f"(at 2 arrival times, up to {GROUP_SIZE} at once: --load-scale spaces" in first


def test_the_outputs_say_which_window_and_which_stamps_they_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs of one trace, one with its batches spread and one with
    ``--keep-batched-stamps`` (or over other windows), wrote JSON that named neither:
    the load summary now records its window, the grid spread and the trace's sha256, and
    simulate's metadata the grid."""
    trace = tmp_path / "batched.jsonl"
    rows = [
        json.dumps({"timestamp": group * GRID_MS, "input_length": 300 + member, "output_length": 5})
        for group in range(6)
        for member in range(3)
    ]
    trace.write_text("\n".join(rows) + "\n")
    grid_s = GRID_MS / 1000.0
    for keep, expected in ((False, grid_s), (True, None)):
        out = tmp_path / f"sim-{keep}.json"
        argv = ["simulate", "--trace", str(trace), "--out", str(out), "--quiet"]
        assert main(argv + (["--keep-batched-stamps"] if keep else [])) == 0
        assert json.loads(out.read_text())["metadata"]["trace"]["batch_grid_s"] == expected
    server = EmulatorServer(EmulatedNode(make_plant()), "127.0.0.1", 0)
    server.start()
    try:
        summary_path = tmp_path / "load.json"
        argv = ["load", "--trace", str(trace), "--url", server.url, "--json", str(summary_path)]
        argv += ["--start", "3", "--duration", "6", "--load-scale", "10", "--quiet"]
        assert main(argv) == 0
    finally:
        server.close()
    summary = json.loads(summary_path.read_text())
    assert summary["requests_completed"] == 6  # the two batches stamped at 3 s and 6 s
    assert (summary["start_s"], summary["duration_s"]) == (3.0, 6.0)
    assert summary["batch_grid_s"] == grid_s
    assert summary["trace_sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()


def test_the_spread_note_names_the_flag_only_where_the_command_has_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The note that a batched trace's stamps were spread told ``sweep``, ``experiments``
    and ``bench controllers`` users to pass ``--keep-batched-stamps``, which those commands
    refuse as an unknown flag; ``simulate`` (which takes it) still names it."""
    from gpugov.study import sweep

    trace = tmp_path / "batched.jsonl"
    rows = [
        json.dumps({"timestamp": group * GRID_MS, "input_length": 300 + member, "output_length": 5})
        for group in range(6)
        for member in range(3)
    ]
    trace.write_text("\n".join(rows) + "\n")
    assert main(["simulate", "--trace", str(trace), "--quiet"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "spread" in line]
    assert said == [
        "gpugov: note: batched.jsonl stamps arrivals on a 3 s grid; each batch is spread over "
        "its step (--keep-batched-stamps replays the stamps as written)"
    ]
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["batched.jsonl"]\nprofiles = ["h100-sxm-llama3-8b"]\ncontrollers = ["max"]\n'
    )
    sweep.plan_sweep(grid)
    said = [line for line in capsys.readouterr().err.splitlines() if "spread" in line]
    assert said == [
        "gpugov: note: batched.jsonl stamps arrivals on a 3 s grid; each batch is spread over "
        "its step"
    ]
