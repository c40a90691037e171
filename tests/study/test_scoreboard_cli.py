"""``gpugov bench controllers`` through the real entry point, on the hidden tiny setup."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from study_support import run_main

from gpugov.cli import main
from gpugov.study.scoreboard import cli as bench_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROW_KEYS = {
    "scenario",
    "controller",
    "energy_j",
    "energy_per_output_token_j",
    "slo_attainment",
    "holds_slo",
    "oracle_capture",
    "ttft_p95_s",
    "tpot_p95_s",
    "power_cap_violation_s",
    "thermal_violation_s",
    "cap_overshoot_s",
    "decision_time_p50_s",
    "decision_time_p99_s",
}
COMPARISON_KEYS = {
    "points",
    "fraction_no_worse",
    "worst_relative_excess",
    "fast_p99_s",
    "slsqp_p99_s",
    "long_horizon_steps",
    "fast_long_p99_s",
}
CONTROLLERS = [
    "max",
    "best-fixed",
    "reactive",
    "open-loop",
    "mpc-slsqp",
    "mpc",
    "mpc-online",
    "window-oracle",
    "power-cap",
    "best-cap",
    "dps",
    "power-profile",
    "default-dvfs",
    "agft",
    "pid",
    "throttllem",
    "greenllm",
]


def _strict_load(text: str) -> Any:
    def reject(constant: str) -> None:
        raise ValueError(f"non-strict JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, str]:
    out = tmp_path_factory.mktemp("scoreboard")
    code, stdout, stderr = run_main(["bench", "controllers", "--tiny", "--out", str(out)])
    return out, code, stdout, stderr


def test_tiny_scoreboard_writes_json_markdown_and_png(
    tiny_run: tuple[Path, int, str, str],
) -> None:
    out, code, stdout, stderr = tiny_run
    assert code == 0, stderr
    payload = _strict_load((out / "scoreboard.json").read_text())
    assert payload["mode"] == "tiny"
    assert "window_summary" not in payload  # only with --windows
    rows = payload["rows"]
    assert [row["controller"] for row in rows] == CONTROLLERS
    for row in rows:
        assert set(row) >= ROW_KEYS, row["controller"]
    by_key = {row["controller"]: row for row in rows}
    assert by_key["max"]["holds_slo"] is True
    assert by_key["max"]["oracle_capture"] == 0.0
    assert by_key["window-oracle"]["holds_slo"] is True
    # Oracles are offline searches: no per-call decision time.
    assert by_key["window-oracle"]["decision_time_p99_s"] is None
    assert by_key["mpc-slsqp"]["decision_time_p99_s"] > 0.0
    for row in rows:
        if not row["holds_slo"]:
            assert row["oracle_capture"] is None
    comparison = payload["mpc_solver_comparison"]
    assert set(comparison) >= COMPARISON_KEYS
    assert comparison["points"] == by_key["mpc-slsqp"]["mpc_solves"] > 0
    assert 0.0 <= comparison["fraction_no_worse"] <= 1.0
    scenario = payload["scenarios"][0]
    assert scenario["lp_bound"]["energy_j"] <= min(row["energy_j"] for row in rows)
    markdown = (out / "scoreboard.md").read_text()
    assert "| controller | energy | saved |" in markdown
    assert "window-oracle (hindsight)" in markdown
    for label in ("power-cap (70% TDP)", "best-cap (hindsight)", "agft", "throttllem", "greenllm"):
        assert label in markdown
    assert by_key["best-cap"]["holds_slo"] is True  # the hindsight search keeps a holding cap
    assert (out / "scoreboard.png").read_bytes().startswith(PNG_MAGIC)
    assert "\nmpc " in stdout and "mpc-slsqp" in stdout
    assert "wrote" in stdout
    assert "azure-conv-10min|h100-sxm-llama3-8b|recorded" in stderr


def test_the_board_says_the_period_target_and_view_each_row_ran_with(
    tiny_run: tuple[Path, int, str, str],
) -> None:
    """scoreboard.md says each row's control period where it is not the board's (the peers
    decide every 0.25 s, agft every 0.3 s) and the SLO target and engine view every
    controller was given: it said 'Control period 1 s' beside rows decided four times as
    often, and neither the target nor the view."""
    out, code, _, stderr = tiny_run
    assert code == 0, stderr
    rows = _strict_load((out / "scoreboard.json").read_text())["rows"]
    periods = {row["controller"]: row.get("control_period_s") for row in rows}
    assert periods["pid"] == periods["mpc-online"] == 0.25 and periods["agft"] == 0.3
    assert periods["reactive"] == 1.0 and periods["window-oracle"] is None
    assert (
        "Control period 1 s (mpc 0.5 s; agft 0.3 s; mpc-online, default-dvfs, pid, throttllem, "
        "greenllm 0.25 s); MPC horizon 10 s. Every controller was given an SLO target of 99 % "
        "over 15 s and observed the vllm engine view."
    ) in (out / "scoreboard.md").read_text().splitlines()


def test_bench_controllers_rejects_an_unknown_load(tmp_path: Path) -> None:
    code, _, stderr = run_main(
        ["bench", "controllers", "--tiny", "--loads", "peak", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "unknown load" in stderr
    assert not (tmp_path / "scoreboard.json").exists()


def test_bench_controllers_rejects_an_unknown_profile(tmp_path: Path) -> None:
    code, _, stderr = run_main(
        ["bench", "controllers", "--tiny", "--profiles", "b200-nope", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "b200-nope" in stderr


@pytest.mark.parametrize("layout", ["colocated", "disaggregated"])
def test_an_unknown_profile_is_named_by_its_flag(tmp_path: Path, layout: str) -> None:
    # The disaggregated layout's line said only "unknown profile 'b200-nope'".
    argv = ["bench", "controllers", "--tiny", "--layout", layout, "--out", str(tmp_path / "o")]
    for profiles in ("b200-nope", "synthetic:nope"):
        code, _, stderr = run_main([*argv, "--profiles", profiles])
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert stderr.startswith("gpugov: error: --profiles: unknown ") and profiles in stderr
    assert not (tmp_path / "o").exists()


TRACE = "arrival_time_s,prompt_tokens,output_tokens\n0.0,100,5\n1.0,0,0\n2.0,200,5\n"


@pytest.mark.parametrize(
    ("flags", "written"),
    [
        (["--traces", "{dir}/scoreboard.md"], "--out {dir}/scoreboard.md: is the trace"),
        (["--layout", "both", "--profiles", "{dir}/disaggregated.json"],
         "--out {dir}/disaggregated.json: is a file of the profile"),
        (["--report", "{dir}", "--traces", "{dir}/pareto.csv"],
         "--report {dir}/pareto.csv: is the trace"),
        (["--report", "{dir}", "--traces", "{dir}/scoreboard.json"],
         "--report {dir}/scoreboard.json: is the trace"),
    ],
    ids=["out-trace", "out-profile", "report-trace", "report-board"],
)  # fmt: skip
def test_an_output_that_is_an_input_is_refused_before_any_work(
    tmp_path: Path, flags: list[str], written: str
) -> None:
    # Each input was replaced by the board or the report; a trace's skipped rows were a
    # Python warning of two lines (the file and the source line) rather than one.
    from gpugov.plant.profile_files import profile_files

    manifest, csv = profile_files("h100-sxm-llama3-8b")
    (tmp_path / "disaggregated.json").write_bytes(manifest.read_bytes())
    (tmp_path / csv.name).write_bytes(csv.read_bytes())
    for name in ("scoreboard.md", "pareto.csv", "scoreboard.json"):
        (tmp_path / name).write_text(TRACE)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    argv = [flag.format(dir=tmp_path) for flag in flags]
    out = str(tmp_path) if "--report" not in flags else str(tmp_path / "out")
    code, _, stderr = run_main(["bench", "controllers", "--tiny", *argv, "--out", out])
    lines = stderr.splitlines()
    assert code == 2 and lines[-1].startswith("gpugov: error: "), stderr
    assert written.format(dir=tmp_path) in lines[-1]
    assert all(line.startswith("gpugov: ") for line in lines), stderr
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_profiles_all_expands_to_the_zoo() -> None:
    from gpugov.plant.profile_files import list_bundled_profiles
    from gpugov.study.scoreboard import command
    from gpugov.study.scoreboard import scenarios as scoreboard

    names = [row["name"] for row in list_bundled_profiles()]
    config = command.config_for(tiny=True, profiles=["all"])
    assert list(config.profiles) == names
    # "all" plus a name already in it: no duplicate scenarios.
    config = command.config_for(tiny=True, profiles=["h100-sxm-llama3-8b", "all"])
    assert len(config.profiles) == len(names)
    assert config.profiles[0] == "h100-sxm-llama3-8b"
    assert scoreboard.FULL.profiles == scoreboard.PROFILES


def test_bench_requires_a_benchmark_name() -> None:
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert main(["bench"]) == 2
    assert err.getvalue().startswith("gpugov: error: bench: ")


def test_scoreboard_is_the_study_package_module() -> None:
    module = bench_cli.scoreboard_module()
    assert module.__name__ == "gpugov.study.scoreboard.command"
    assert Path(module.__file__).resolve() == (
        Path(__file__).resolve().parents[2] / "study" / "scoreboard" / "command.py"
    )


def test_mpc_ablation_reproduces_the_scoreboards_fast_mpc(
    tiny_run: tuple[Path, int, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ablation's last variant is the scoreboard's fast MPC, so on the same scenario
    it uses the same energy (the simulator and the solver are deterministic)."""
    # The benchmarks are scripts in bench/, not part of the package.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import mpc_ablation

    out, code, _, stderr = tiny_run
    assert code == 0, stderr
    target = tmp_path / "ablation.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert (
            mpc_ablation.main(
                ["--scoreboard", str(out / "scoreboard.json"), "--out", str(target), "--jobs", "1"]
            )
            == 0
        )
    payload = _strict_load(target.read_text())
    assert [item["variant"] for item in payload["summary"]] == list(mpc_ablation.VARIANTS)
    board = _strict_load((out / "scoreboard.json").read_text())
    fast = next(row for row in board["rows"] if row["controller"] == "mpc")
    default = [row for row in payload["rows"] if row["variant"] == "+ TTFT penalty cap (default)"]
    assert len(default) == 1
    assert default[0]["energy_j"] == pytest.approx(fast["energy_j"], rel=1e-12)
    assert default[0]["holds_slo"] == fast["holds_slo"]


def test_a_window_emptied_by_a_small_profile_is_skipped_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpugov.study.scoreboard import run as scoreboard
    from gpugov.study.scoreboard import scenarios as scoreboard_scenarios

    with pytest.raises(scoreboard.EmptyWindowError, match="holds no requests"):
        scoreboard_scenarios._require_requests((), "azure-code", 0.5)

    def empty(*args: object, **kwargs: object) -> None:
        raise scoreboard.EmptyWindowError("azure-code: the 0.5 s window holds no requests")

    monkeypatch.setattr(scoreboard, "run_scenario", empty)
    out = scoreboard._run_task(
        ("azure-code", "l4-llama3.2-3b", "cap70", scoreboard.TINY, False, None),
        {"profile:l4-llama3.2-3b": None, "trace:azure-code": None},
    )
    assert out["skipped"]["scenario"] == "azure-code|l4-llama3.2-3b|cap70"
    assert "holds no requests" in out["skipped"]["reason"]


def test_a_trace_file_named_by_traces_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--traces FILE`` reads the file to refuse a bad one before any work; the run reuses
    that read instead of parsing the file a second time (seconds on a day-long trace)."""
    from gpugov.plant import workload
    from gpugov.study.scoreboard import command
    from gpugov.study.scoreboard import run as scoreboard

    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,10\n1.5,200,0\n2,300,30\n")
    reads: list[Path] = []
    real_read = workload.read_trace

    def counted(path: Path) -> tuple[str, str]:
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr(workload, "read_trace", counted)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        config = command.config_for(tiny=True, traces=[str(trace)])
    assert "skipped 1 zero-token row(s) of 3" in stderr.getvalue()
    shared, failed = scoreboard._shared_inputs(config)
    assert failed == {}
    requests, digest = shared[f"trace:{trace}"]
    assert [r.request_id for r in requests] == [0, 2]
    assert len(digest) == 64
    assert reads == [trace]


def test_the_warm_up_is_half_a_short_scenarios_own_length(tmp_path: Path) -> None:
    """The warm-up was ``min(300 s, half of --duration)``: a 12 s trace under the full
    board's 600 s had a 300 s warm-up, past its end, and no capture after it. It is half
    the scenario's own length, as the definition says, so the capture after it is there."""
    from dataclasses import replace

    from gpugov.study.scoreboard.run import TINY, run_scenario

    rows = [f"2023-11-16 18:53:{0.5 * i:010.7f},{300 + 7 * i},{40 + i % 9}" for i in range(24)]
    trace = tmp_path / "short.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    config = replace(TINY, traces=(str(trace),), duration_s=600.0, comparison_scenario=None)
    out = run_scenario(str(trace), "h100-sxm-llama3-8b", "recorded", config)
    length = out["scenario"]["scenario_duration_s"]
    assert length == pytest.approx(11.5, abs=1e-3)
    warmups = [row["warmup_s"] for row in out["rows"]]
    assert warmups == [pytest.approx(0.5 * length)] * len(warmups)
    by_key = {row["controller"]: row for row in out["rows"]}
    assert by_key["max"]["oracle_capture_after_warmup"] == pytest.approx(0.0)
    assert by_key["window-oracle"]["oracle_capture_after_warmup"] == pytest.approx(1.0)


@pytest.mark.parametrize("duration_s", [5.0, 8.0, 15.0, 600.0])
def test_the_boards_slo_target_is_one_a_node_takes(duration_s: float) -> None:
    """Every controller on the board spends an SLO target whose window spans at least 12
    of its control periods, as a config's ``slo_target.window_s`` must (the studies refuse
    any other): a short board's window was its duration (5 s at a 1 s period), a target a
    node refuses. Where the duration is shorter the window outlasts the scenario, so the
    budget counts every request, as the SLO condition does."""
    from gpugov.daemon.config import SLO_WINDOW_PERIODS, SLOTargetConfig
    from gpugov.study.scoreboard.scenarios import BenchConfig

    config = BenchConfig(duration_s=duration_s)
    target = config.slo_target
    assert target is not None
    longest = max(config.control_period_s, config.fast_mpc_period_s, config.online_period_s)
    assert target.window_s >= SLO_WINDOW_PERIODS * longest
    assert target.window_s == max(duration_s, SLO_WINDOW_PERIODS * longest)
    SLOTargetConfig(attainment=target.attainment, window_s=target.window_s)
