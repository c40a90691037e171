"""The scoreboard's disaggregated scenarios: the layout's load, per-pool rows, the SLO
condition, and ``gpugov bench controllers --layout disaggregated`` end to end."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpugov.cli import main
from gpugov.plant import ServingPlant, load_profile
from gpugov.study.scoreboard.disaggregated import run_disaggregated_scenario
from gpugov.study.scoreboard.scenarios import TINY, build_disaggregated_scenario


@pytest.fixture(scope="module")
def plant() -> ServingPlant:
    return ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))


def test_layout_load_and_rows(plant: ServingPlant) -> None:
    """2P2D gets twice the colocated scenario's arrival rate; each row judges the
    request-level SLO against the maximum clock and splits the saving by pool."""
    one = build_disaggregated_scenario("azure-conv-10min", plant, "1P1D", "recorded", 10.0)
    two = build_disaggregated_scenario("azure-conv-10min", plant, "2P2D", "recorded", 10.0)
    assert one.requests == one.base.requests
    assert [r.arrival_time_s for r in two.requests] == pytest.approx(
        [r.arrival_time_s / 2.0 for r in one.requests]
    )
    assert two.key.endswith("|recorded|2P2D") and two.describe()["decode_engines"] == 2
    with pytest.raises(ValueError, match="layout must be one of"):
        build_disaggregated_scenario("azure-conv-10min", plant, "3P1D", "recorded", 10.0)

    config = replace(TINY, duration_s=10.0)
    rows = run_disaggregated_scenario(two, plant, config, ("max", "reactive"), best_fixed=False)
    reference, reactive = rows
    assert reference["controller"] == "max" and reference["energy_saved_fraction"] == 0.0
    assert reference["holds_slo"] is True
    assert reference["pools"]["prefill"]["energy_saved_fraction"] == 0.0
    e_max = reference["energy_j"]
    assert sum(reference["pools"][r]["energy_j"] for r in ("prefill", "decode")) == (
        pytest.approx(e_max)
    )
    # The reactive governor lowers the decode pool's clock: it saves energy there.
    assert reactive["pools"]["decode"]["energy_saved_fraction"] > 0.0
    assert (
        reactive["pools"]["decode"]["mean_realized_clock_mhz"]
        < (reference["pools"]["decode"]["mean_realized_clock_mhz"])
    )
    assert reactive["oracle_capture"] is None
    # The same controllers on the colocated layout of the same four GPUs and load.
    assert reference["colocated"]["gpus"] == 4
    assert reference["colocated"]["energy_saved_fraction"] == 0.0
    e_colocated = reference["colocated"]["energy_j"]
    assert reference["energy_vs_colocated_fraction"] == pytest.approx(
        (e_colocated - e_max) / e_colocated
    )
    assert reactive["colocated"]["energy_j"] < e_colocated
    assert reactive["transfer_p50_s"] > 0.0
    with pytest.raises(ValueError, match="start with 'max'"):
        run_disaggregated_scenario(two, plant, config, ("reactive",))


def test_bench_controllers_layout_disaggregated(tmp_path: Path) -> None:
    out = tmp_path / "board"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(
            [
                "bench",
                "controllers",
                "--tiny",
                "--layout",
                "disaggregated",
                "--traces",
                "azure-conv-10min",
                "--profiles",
                "h200-sxm-llama3-8b",
                "--duration",
                "8",
                "--dwell",
                "0.25",
                "--engine-view",
                "exact",
                "--out",
                str(out),
            ]
        )
    assert code == 0
    payload = json.loads((out / "disaggregated.json").read_text())
    # What ran it, as the colocated board records it: every setting, the software, the
    # machine and the runner, and the profiles it read (with their checksums).
    from gpugov import __version__

    assert payload["mode"] == "tiny" and payload["gpugov_version"] == __version__
    config = payload["config"]
    assert config["traces"] == ["azure-conv-10min"]
    assert config["profiles"] == ["h200-sxm-llama3-8b"]
    assert (config["duration_s"], config["dwell_s"], config["engine_view"]) == (8.0, 0.25, "exact")
    assert config["slo_target"]["attainment"] == 0.99
    assert {"numpy", "scipy", "source"} <= set(payload["versions"])
    assert payload["machine"]["cpus"] and payload["runner"]["kind"] == "local"
    assert len(payload["profiles"]["h200-sxm-llama3-8b"]["manifest_sha256"]) == 64
    assert payload["wall_s"] > 0
    layouts = {(row["layout"], row["controller"]) for row in payload["rows"]}
    assert layouts == {
        (layout, key)
        for layout in ("1P1D", "2P2D")
        for key in (
            "max",
            "best-fixed",
            "window-oracle",
            "reactive",
            "default-dvfs",
            "voltana",
            "mpc-online",
        )
    }
    assert all(row["profile"] == "h200-sxm-llama3-8b" for row in payload["rows"])
    for scenario in payload["scenarios"]:
        assert scenario["oracle"] in ("best-fixed", "window-oracle")
        assert scenario["lp_bound"]["success"] is True
        assert scenario["window_oracle"]["windows"] >= 1
    table = (out / "disaggregated.md").read_text()
    assert "| mpc-online |" in table and "| voltana |" in table
    assert "| best-fixed (hindsight) |" in table and "prefill alone" in table
    assert "| window-oracle (hindsight) |" in table and "| LP bound decode |" in table
    assert "not run per pool" not in table
    # The chain, the periods and the target every pool's controller ran with.
    assert (
        "(the node's factory and safety chain: dwell 0.25 s, no clock floor; decided every "
        "0.25 s (default-dvfs, voltana, mpc-online), 1 s (max, reactive); an SLO target of "
        "99 % over 12 s) and observes the 'exact' engine view"
    ) in table
    assert "wrote" in stdout.getvalue()
    # Progress with an ETA, one line per scenario (two layouts x the tiny board's loads).
    lines = [line for line in stderr.getvalue().splitlines() if "disaggregated:" in line]
    assert lines and "ETA" in lines[0] and "100.0%" in lines[-1]


def test_the_colocated_twin_of_a_tensor_parallel_layout_counts_its_gpus() -> None:
    """The colocated twin runs one engine per disaggregated engine, each the profile's
    tensor-parallel group: ``gpus`` is their GPUs (4 for 1P1D of a TP2 profile), where it
    gave the engines (2), and ``engines`` the engines."""
    tp2 = ServingPlant.from_profile(load_profile("h100-sxm-mixtral-8x7b-tp2"))
    one = build_disaggregated_scenario("azure-conv-10min", tp2, "1P1D", "recorded", 5.0)
    config = replace(TINY, duration_s=5.0)
    (reference,) = run_disaggregated_scenario(one, tp2, config, ("max",), best_fixed=False)
    assert reference["colocated"]["gpus"] == 4
    assert reference["colocated"]["engines"] == 2


@pytest.mark.parametrize(
    ("extra", "flag"),
    [(["--report", "{tmp}/report"], "--report"), (["--windows", "2"], "--windows")],
)
def test_a_colocated_board_flag_is_refused_on_the_disaggregated_board(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], flag: str
) -> None:
    """``--report`` and ``--windows`` shape the colocated board only: with ``--layout
    disaggregated`` they are refused in one line before any work, where the run went
    on without them (no report written, one window)."""
    out = tmp_path / "board"
    board = ["bench", "controllers", "--tiny", "--layout", "disaggregated"]
    scenario = ["--traces", "azure-conv-10min", "--duration", "8", "--out", str(out)]
    code = main([*board, *scenario, *(a.replace("{tmp}", str(tmp_path)) for a in extra)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"gpugov: error: {flag}: ") and "--layout colocated or both" in err
    assert not out.exists() and not (tmp_path / "report").exists()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_each_pool_is_judged_on_its_phase_as_a_node_with_that_role(
    plant: ServingPlant, role: str
) -> None:
    from gpugov.controllers.contract import layers
    from gpugov.daemon.controller_config import ReactiveControllerConfig
    from gpugov.daemon.roles import RoleView
    from gpugov.study.scoreboard.controllers import study_controller

    scenario = build_disaggregated_scenario("azure-conv-10min", plant, "1P1D", "recorded", 10.0)
    chain = study_controller(
        ReactiveControllerConfig(kind="reactive"),
        plant,
        scenario.requests,
        control_period_s=1.0,
        role=role,
    )
    views = [layer for layer in layers(chain) if isinstance(layer, RoleView)]
    assert [view.role for view in views] == [role]


def test_a_pool_of_two_engines_is_one_domain_of_their_gpus(plant: ServingPlant) -> None:
    """A 2P2D pool's controller is built as a node builds one domain holding both engines'
    GPUs, so the automatic hints give each engine its own TP group's prior."""
    from gpugov.controllers.contract import layers
    from gpugov.controllers.online.controller import OnlineMPCController
    from gpugov.study.scoreboard.disaggregated import row_controller

    scenario = build_disaggregated_scenario("azure-conv-10min", plant, "2P2D", "recorded", 10.0)
    chain = row_controller("mpc-online", plant, scenario.requests, TINY, "prefill", 2)
    online = [layer for layer in layers(chain) if isinstance(layer, OnlineMPCController)]
    assert len(online) == 1 and online[0].auto_hints is not None
    assert online[0].auto_hints.tensor_parallel == 2 * plant.tensor_parallel


def test_hindsight_rows_oracle_choice_captures_and_bound(plant: ServingPlant) -> None:
    """The per-pool hindsight rows: the best fixed pair (the lowest holding clock per pool,
    the other at its maximum, checked jointly) and the window oracle per pool continuing
    at it; the oracle is the lowest-energy holding one, every row's capture (and each
    pool's) is measured against it, and every row lies above the LP bound, per pool and
    in total."""
    from gpugov.study.scoreboard.disaggregated import disaggregated_scenario_outcome

    scenario = build_disaggregated_scenario("azure-conv-10min", plant, "1P1D", "recorded", 8.0)
    config = replace(TINY, duration_s=8.0)
    outcome = disaggregated_scenario_outcome(scenario, plant, config, ("max", "voltana"))
    rows = outcome["rows"]
    assert [row["controller"] for row in rows] == ["max", "best-fixed", "window-oracle", "voltana"]
    reference, pair_row, window_row = rows[:3]
    pair = pair_row["best_fixed_pair"]
    clocks = plant.profile.clock_mhz
    # Each pool's own search ends at a supported clock, below the top one here (light
    # load), and the joint pair is at or above each pool's own answer.
    for role in ("prefill", "decode"):
        assert pair["single_pool_mhz"][role] in clocks
        assert pair["clocks_mhz"][role] >= pair["single_pool_mhz"][role]
    assert pair["single_pool_mhz"]["decode"] < clocks[-1]
    assert pair_row["holds_slo"] is True and pair_row["energy_j"] < reference["energy_j"]
    # The evaluations start at the maximum pair (the reference) and the chosen pair holds.
    first = pair["evaluations"][0]
    assert (first["prefill_mhz"], first["decode_mhz"]) == (clocks[-1], clocks[-1])
    chosen = [
        e
        for e in pair["evaluations"]
        if (e["prefill_mhz"], e["decode_mhz"])
        == (pair["clocks_mhz"]["prefill"], pair["clocks_mhz"]["decode"])
    ]
    assert chosen and chosen[0]["holds_slo"] is True
    # The window oracle continues at the pair, holds, and uses no more than it.
    info = outcome["scenario"]
    summary = info["window_oracle"]
    assert summary["continuation_clocks_mhz"] == pair["clocks_mhz"]
    assert window_row["holds_slo"] is True
    assert window_row["energy_j"] <= pair_row["energy_j"]
    assert window_row["oracle_source"] == summary["source"]
    # The oracle: the lowest-energy holding hindsight row.
    oracle = min((pair_row, window_row), key=lambda row: row["energy_j"])
    assert info["oracle"] == oracle["controller"]
    assert info["oracle_energy_j"] == oracle["energy_j"]
    assert oracle["oracle_capture"] == pytest.approx(1.0)
    assert reference["oracle_capture"] == pytest.approx(0.0)
    assert pair_row["colocated"] is None and window_row["colocated"] is None
    # Each pool's capture is the pool's saving over the oracle's saving in that pool.
    for row in rows:
        for role in ("prefill", "decode"):
            pool = row["pools"][role]
            e_max = reference["pools"][role]["energy_j"]
            e_oracle = oracle["pools"][role]["energy_j"]
            if row["holds_slo"] and abs(e_max - e_oracle) > 1e-6 * e_max:
                expected = (e_max - pool["energy_j"]) / (e_max - e_oracle)
                assert pool["oracle_capture"] == pytest.approx(expected)
            elif not row["holds_slo"]:
                assert row["oracle_capture"] is None and pool["oracle_capture"] is None
    # The LP bound: the sum of the pools' bounds, below every row, in total and per pool.
    bound = info["lp_bound"]
    pools = bound["pools"]
    assert bound["energy_j"] == pytest.approx(
        pools["prefill"]["energy_j"] + pools["decode"]["energy_j"]
    )
    for row in rows:
        assert row["energy_over_lp_bound"] == pytest.approx(row["energy_j"] / bound["energy_j"])
        assert row["energy_over_lp_bound"] >= 1.0
        for role in ("prefill", "decode"):
            assert row["pools"][role]["energy_over_lp_bound"] >= 1.0


def test_no_holding_hindsight_row_leaves_every_capture_empty() -> None:
    from gpugov.study.scoreboard.disaggregated import add_captures, choose_oracle

    def row(key: str, energy_j: float, holds: bool) -> dict:  # type: ignore[type-arg]
        pools = {role: {"energy_j": energy_j / 2.0} for role in ("prefill", "decode")}
        return {"controller": key, "energy_j": energy_j, "holds_slo": holds, "pools": pools}

    rows = [row("max", 10.0, True), row("best-fixed", 8.0, False), row("window-oracle", 7.0, False)]
    assert choose_oracle(rows) is None
    add_captures(rows, None)
    assert all(r["oracle_capture"] is None for r in rows)
    rows[1]["holds_slo"] = True
    assert choose_oracle(rows) is rows[1]
    rows[2]["holds_slo"] = True
    assert choose_oracle(rows) is rows[2]


def test_every_pool_and_the_colocated_twin_observe_the_configured_engine_view(
    plant: ServingPlant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the colocated scenarios, a disaggregated row's controllers observe what the
    node's daemon derives from each engine's vLLM page (``engine_view``), per pool role;
    ``exact`` gives them the plant's state."""
    import gpugov.study.scoreboard.disaggregated as board
    from gpugov.daemon.simulated import node_view

    roles: list[str] = []
    targets: list[object] = []

    def recording(engine_view: str, slo_target=None):  # type: ignore[no-untyped-def]
        targets.append(slo_target)  # the board's target, as its domains' observers take it
        if engine_view == "exact":
            return None

        def view(simulation, role="colocated"):  # type: ignore[no-untyped-def]
            roles.append(role)
            return node_view(simulation, role)

        return view

    monkeypatch.setattr(board, "pool_view", recording)
    scenario = build_disaggregated_scenario("azure-conv-10min", plant, "1P1D", "recorded", 6.0)
    config = replace(TINY, duration_s=6.0)
    rows = run_disaggregated_scenario(scenario, plant, config, ("max",), best_fixed=False)
    assert sorted(roles) == ["colocated", "colocated", "decode", "prefill"]
    assert targets and all(t == config.slo_target for t in targets)
    roles.clear()
    exact = run_disaggregated_scenario(
        scenario, plant, replace(config, engine_view="exact"), ("max",), best_fixed=False
    )
    assert roles == []
    # The maximum clock decides nothing from what it sees.
    assert exact[0]["energy_j"] == pytest.approx(rows[0]["energy_j"])


def test_the_board_is_the_same_in_parallel_as_in_one_process() -> None:
    # Each scenario is a runner task (local pool or Ray); the rows come back in the
    # scenarios' order, whatever order the tasks finish in, and with the same numbers.
    from gpugov.study.runners import RunnerSpec
    from gpugov.study.scoreboard.disaggregated import run_disaggregated

    config = replace(TINY, duration_s=8.0, loads=("recorded",))
    kwargs = {
        "traces": ("azure-conv-10min",),
        "profiles": ("h200-sxm-llama3-8b",),
        "controllers": ("max", "reactive"),
    }
    lines: list[str] = []
    serial = run_disaggregated(config, runner=RunnerSpec(jobs=1), **kwargs)  # type: ignore[arg-type]
    pooled = run_disaggregated(config, runner=RunnerSpec(jobs=2), progress=lines.append, **kwargs)  # type: ignore[arg-type]

    def numbers(payload: dict) -> list[dict]:  # type: ignore[type-arg]
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in payload["rows"]]

    assert [row["layout"] for row in pooled["rows"]][:4] == ["1P1D"] * 4
    assert numbers(pooled) == numbers(serial) and len(numbers(serial)) == 8

    def scenarios(payload: dict) -> list[dict]:  # type: ignore[type-arg]
        # The LP bound's solve time is the one timing a scenario records.
        return [
            {**info, "lp_bound": {**info["lp_bound"], "compute_s": None}}
            for info in payload["scenarios"]
        ]

    assert scenarios(pooled) == scenarios(serial)
    assert [line.split()[0] for line in lines] == ["[1]", "[2]"]


def test_a_scenario_the_capacity_search_cannot_run_is_skipped_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A disaggregated scenario is built on the colocated one, whose capacity search refuses
    a profile too slow to probe (ProbeTooLongError): the cell is skipped with the reason, as
    an empty window is, where the board stopped on it."""
    from gpugov.study.scoreboard import disaggregated
    from gpugov.study.scoreboard.scenarios import ProbeTooLongError

    def too_slow(*_args: object, **_kwargs: object) -> None:
        raise ProbeTooLongError("its light-load capacity probe would simulate 59.1 days")

    monkeypatch.setattr(disaggregated, "build_disaggregated_scenario", too_slow)
    out = disaggregated.disaggregated_cell(
        ("mooncake", "h100-sxm-llama3-8b", "recorded", "1P1D"),
        {"config": TINY, "controllers": ("max",)},
    )
    assert out == {
        "skipped": {
            "scenario": "mooncake|h100-sxm-llama3-8b|recorded|1P1D",
            "reason": "its light-load capacity probe would simulate 59.1 days",
        }
    }


def test_the_disaggregated_bench_says_what_it_runs_at_once_and_counts_only_scenarios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its first line came when the first scenario ended (4 1/2 minutes on two busy cores),
    and a lost worker's line counted as a scenario done."""
    from gpugov.study.scoreboard import disaggregated

    seen: list[str] = []

    def fake(config: object, *, progress: Any, **kwargs: object) -> dict[str, Any]:
        seen.append(capsys.readouterr().err)
        progress("worker process died running a|b; retry 1/2")
        progress("[1] a|b|recorded|1P1D")
        return {"rows": [], "skipped": [{"reason": "faked"}]}

    monkeypatch.setattr(disaggregated, "run_disaggregated", fake)
    argv = ["bench", "controllers", "--layout", "disaggregated", "--out", str(tmp_path / "o")]
    assert main([*argv, "--jobs", "1"]) == 2
    lines = capsys.readouterr().err.splitlines()
    label = "bench controllers --layout disaggregated:"
    assert seen[0].startswith(f"{label}   0.0% (0/") and "scenario(s), local runner" in seen[0]
    assert lines[0].startswith(f"{label}   0.0% (0/") and "retry 1/2" in lines[0]
    assert lines[1].startswith(f"{label} ") and re.search(
        r", 1/\d+ scenarios, \[1\] a\|b", lines[1]
    )


def test_a_generated_profile_runs_on_the_disaggregated_board(tmp_path: Path) -> None:
    """``--profiles synthetic:SHAPE`` passed the checks, then each disaggregated scenario
    refused it after the progress began (exit 2 with --layout both, after the colocated
    board ran): "a synthetic profile is generated only by ... bench controllers"."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n1,200,20\n")
    out = tmp_path / "board"
    argv = ["bench", "controllers", "--layout", "disaggregated", "--traces", str(trace)]
    argv += ["--profiles", "synthetic:compute-bound", "--loads", "recorded", "--duration", "5"]
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = main([*argv, "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr.getvalue()
    payload = json.loads((out / "disaggregated.json").read_text())
    assert {row["profile"] for row in payload["rows"]} == {"synthetic-compute-bound"}
    assert {row["layout"] for row in payload["rows"]} == {"1P1D", "2P2D"}


def test_an_lp_bound_that_does_not_solve_is_null_in_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound of an LP that did not solve is NaN; disaggregated.json wrote it as NaN,
    # which is no JSON (a strict reader refuses the file), where scoreboard.json has null.
    from scipy.optimize import OptimizeResult

    from gpugov.controllers.oracles import bound as lp

    monkeypatch.setattr(
        lp, "linprog", lambda *a, **k: OptimizeResult(success=False, message="time limit")
    )
    out = tmp_path / "board"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(
            ["bench", "controllers", "--tiny", "--layout", "disaggregated", "--traces",
             "azure-conv-10min", "--profiles", "h200-sxm-llama3-8b", "--duration", "8",
             "--jobs", "1", "--out", str(out)]
        )  # fmt: skip
    assert code == 0, stderr.getvalue()

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in disaggregated.json")

    payload = json.loads((out / "disaggregated.json").read_text(), parse_constant=refuse)
    assert payload["scenarios"] and payload["rows"]
    for info in payload["scenarios"]:
        assert info["lp_bound"]["success"] is False
        assert info["lp_bound"]["energy_j"] is None
    assert all(row["energy_over_lp_bound"] is None for row in payload["rows"])


def test_the_best_fixed_pair_is_never_dearer_than_the_maximum_pair() -> None:
    """On a board whose power falls as the clock rises (a table where the top clock is
    the cheapest), the lowest holding pair is the dearest: the best fixed pair was that
    pair and cost more than the maximum clock on both pools, which holds the SLO too
    (124.9 % more on a 40 s window of the bundled trace). It is now the lowest-energy
    holding pair simulated."""
    from gpugov.plant import PerformanceProfile
    from gpugov.study.scoreboard.disaggregated import disaggregated_scenario_outcome

    clocks = np.arange(300.0, 1801.0, 150.0)
    x = clocks / clocks[-1]
    steps = np.arange(clocks.size)
    profile = PerformanceProfile(
        clock_mhz=clocks,
        prefill_tokens_per_s=32_000.0 * x,
        decode_tokens_per_s=5_000.0 * x,
        prefill_power_w=560.0 - 20.0 * steps,
        decode_power_w=400.0 - 15.0 * steps,
        idle_power_w=np.full(clocks.size, 90.0),
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        manifest={"status": "synthetic"},
        name="power-falls",
    )
    plant = ServingPlant.from_profile(profile)
    scenario = build_disaggregated_scenario("azure-conv-10min", plant, "1P1D", "recorded", 8.0)
    outcome = disaggregated_scenario_outcome(
        scenario, plant, replace(TINY, duration_s=8.0), ("max",)
    )
    reference, pair_row = outcome["rows"][:2]
    assert pair_row["controller"] == "best-fixed" and pair_row["holds_slo"] is True
    assert pair_row["energy_j"] <= reference["energy_j"]
    holding = [e for e in pair_row["best_fixed_pair"]["evaluations"] if e["holds_slo"]]
    assert pair_row["energy_j"] == min(e["energy_j"] for e in holding)
