"""``gpugov simulate`` and ``gpugov profiles`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import plan_payload

from gpugov.cli import main

METRIC_KEYS = (
    "energy_j",
    "energy_per_output_token_j",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p95_s",
    "tpot_p99_s",
    "slo_attainment",
    "completed_requests",
    "censored_requests",
    "output_tokens",
    "simulated_duration_s",
    "power_cap_violation_s",
    "thermal_violation_s",
    "cap_overshoot_s",
    "peak_queued_requests_at_minimum_clock",
)


def test_simulate_writes_metrics_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    plot = tmp_path / "run.png"
    code = main(
        [
            "simulate",
            "--controller",
            "fixed:1410",
            "--duration",
            "60",
            "--start",
            "30",
            "--out",
            str(out),
            "--plot",
            str(plot),
            "--control-period",
            "0.5",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "SLO attainment" in printed and "energy per output token" in printed
    payload = json.loads(out.read_text())
    for key in METRIC_KEYS:
        assert key in payload["metrics"]
    assert payload["metrics"]["arrived_requests"] == payload["metadata"]["trace"]["requests"]
    assert payload["metadata"]["plant"]["profile"]["status"] == "literature-derived"
    assert len(payload["metadata"]["trace"]["workload_checksum"]) == 64
    # The t = 0 sample is the GPU's default state before the first decision.
    assert set(payload["series"]["requested_clock_mhz"][1:]) == {1410.0}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Per-request energy: one row per arrived request, adding up with idle to the run's.
    assert "J/request p50 / p90 / p99" in printed
    rows, energy = payload["requests"], payload["energy"]
    assert len(rows) == payload["metrics"]["arrived_requests"]
    assert {"prefill_energy_j", "decode_energy_j", "energy_j"} <= set(rows[0])
    attributed = sum(row["energy_j"] for row in rows) + energy["idle_energy_j"]
    assert attributed == pytest.approx(payload["metrics"]["energy_j"], rel=1e-9)
    assert energy["ml_energy_j_per_output_token"] == pytest.approx(
        payload["metrics"]["energy_per_output_token_j"]
    )
    assert set(energy["per_request_j"]) == {"mean", "p50", "p90", "p99"}


def test_simulate_lower_clock_lower_energy_via_cli(tmp_path: Path) -> None:
    energies = []
    for clock in ("1980", "1200"):
        out = tmp_path / f"{clock}.json"
        assert (
            main(
                [
                    "simulate",
                    "--controller",
                    f"fixed:{clock}",
                    "--duration",
                    "60",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        energies.append(json.loads(out.read_text())["metrics"]["energy_j"])
    assert energies[1] < energies[0]


def test_a_power_cap_no_clock_can_hold_is_reported_not_shown_as_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """power-cap:80 asks for less than the board draws idle (about 108 W): the GPU runs
    over it the whole run, and the table printed "power-cap / thermal violation 0.00 s",
    the seconds above the board limit, so the cap looked held."""
    out = tmp_path / "cap.json"
    argv = ["simulate", "--controller", "power-cap:80", "--duration", "20", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["power_cap_violation_s"] == 0.0  # the board limit is never exceeded
    assert metrics["cap_overshoot_s"] > 0.9 * metrics["simulated_duration_s"]
    assert f"over the requested power cap     {metrics['cap_overshoot_s']:.2f} s" in printed
    assert "board-limit / thermal violation  0.00 s / 0.00 s" in printed
    assert main(["simulate", "--controller", "max", "--duration", "20", "--quiet"]) == 0
    assert "over the requested power cap     no cap set" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command", [["simulate"], ["run", "--simulate", "--metrics-address", "none"]]
)
def test_a_power_cap_below_the_simulated_gpus_lowest_limit_is_refused_as_nvml_refuses_it(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """NVML refuses a limit below its lowest, and a node refuses such a configured cap_w;
    a simulated run set power-cap:10 on the plant (simulate) or clamped it to the lowest
    with a line naming no flag (run --simulate)."""
    argv = [*command, "--controller", "power-cap:10", "--duration", "5", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "gpugov: error: --controller power-cap:10: cap_w (10 W) is below the lowest power "
        "limit the simulated GPUs accept (70 W, a tenth of the profile's power_limit_w "
        "700 W), as NVML refuses a limit below its lowest"
    ]
    assert main([*command, "--controller", "power-cap:70", "--duration", "5", "--quiet"]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "/nonexistent/trace.csv"], "trace.csv"),
        (["--profile", "no-such-gpu"], "unknown profile 'no-such-gpu'"),
        (["--controller", "fixed:abc"], "--controller fixed:MHZ needs a number"),
        (["--controller", "fixed:5000"], "outside the supported range"),
        (["--controller", "warp-drive"], "unknown controller 'warp-drive'"),
        (
            ["--controller", "mpc-onlin"],
            "unknown controller 'mpc-onlin' (did you mean 'mpc-online'?)",
        ),
        (["--load-scale", "-1"], "argument --load-scale: must be a multiplier in (0, "),
        (["--duration", "0"], "argument --duration: must be a duration in seconds in (0, "),
    ],
)
def test_simulate_bad_input_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("gpugov: error: ")
    assert message in err[0]


@pytest.mark.parametrize(
    "spec",
    [
        "x" * 5000,  # an unknown kind
        "mpc-online:" + "x" * 5000,  # a prior profile no file or bundled name has
        "fixed:" + "9" * 5000,  # a clock out of range
        "mpc-online:params_b=" + "x" * 5000,  # a hint's value
    ],
)
def test_a_controller_spec_pasted_whole_is_quoted_cut_short(
    spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spec is quoted in the error line cut to a readable length, with its length said:
    a file's contents pasted as --controller are no line to print."""
    assert main(["simulate", "--controller", spec, "--duration", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and len(err[0]) < 1000
    assert "characters)" in err[0]


def test_simulate_broken_trace_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "broken.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0.0,10,5\n1.0,abc,5\n")
    assert main(["simulate", "--trace", str(trace)]) == 2
    assert "broken.csv:3" in capsys.readouterr().err


def test_profiles_lists_bundled_with_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {row["name"] for row in rows}
    assert {"h100-sxm-llama3-8b", "h200-sxm-llama3-8b", "a100-sxm-80gb-llama3-8b"} <= names
    assert {row["status"] for row in rows} == {"literature-derived"}
    assert len(rows) >= 10
    for row in rows:
        assert Path(row["path"]).is_file()
        assert row["gpu"] and row["model"] and row["tensor_parallel"] >= 1
        assert "worst_calibration_error" in row
    by_name = {row["name"]: row for row in rows}
    assert by_name["h100-sxm-llama3-70b-tp8"]["tensor_parallel"] == 8
    assert 0.0 <= by_name["h100-sxm-llama3-8b"]["worst_calibration_error"] <= 0.2
    assert main(["profiles"]) == 0
    text = capsys.readouterr().out
    assert "literature-derived" in text
    assert "h200-sxm-llama3-70b-tp4" in text


def test_simulate_mpc_and_open_loop_controllers(tmp_path: Path) -> None:
    from gpugov.controllers.open_loop import optimize_open_loop, save_plan
    from gpugov.plant import ServingPlant, load_profile, load_trace

    out = tmp_path / "mpc.json"
    assert main(["simulate", "--controller", "mpc", "--duration", "30", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["metadata"]["controller"] == "mpc"
    workload, _ = load_trace("azure-conv-10min", duration_s=60)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    plan_path = tmp_path / "plan.json"
    save_plan(optimize_open_loop(workload, plant), plan_path)
    out = tmp_path / "plan-run.json"
    assert (
        main(
            [
                "simulate",
                "--controller",
                f"open-loop:{plan_path}",
                "--duration",
                "60",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    plan = json.loads(plan_path.read_text())
    series = json.loads(out.read_text())["series"]
    assert set(series["requested_clock_mhz"][1:]) <= set(plan["applied_clock_mhz"])


def test_an_open_loop_plan_period_below_the_minimum_is_one_line_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 5e-324 s plan period ran and failed at t=0 naming neither file nor key."""
    plan = plan_payload(control_period_s=5e-324)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    out = tmp_path / "run.json"
    argv = ["simulate", "--duration", "20", "--controller", f"open-loop:{path}"]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpugov: error: "), err
    assert f"{path}: key 'control_period_s' must be at least 0.05 s" in err[0]
    assert not out.exists()


def test_skipped_zero_token_rows_reported_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "zeros.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0.0,10,5\n1.0,0,5\n2.0,12,3\n")
    assert main(["simulate", "--trace", str(trace), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpugov: warning: {trace}: skipped 1 zero-token row(s) of 3 (failed requests)"]


def test_mpc_profile_part_names_the_model_it_plans_on(tmp_path: Path) -> None:
    """``mpc:PROFILE`` is not ignored: the MPC plans on that profile (a mismatch run)."""
    energies = {}
    for spec in ("mpc", "mpc:h100-sxm-llama3-8b", "mpc:a100-sxm-80gb-llama3-8b"):
        out = tmp_path / f"{spec.replace(':', '_')}.json"
        argv = ["simulate", "--controller", spec, "--duration", "30", "--quiet", "--out", str(out)]
        assert main(argv) == 0
        payload = json.loads(out.read_text())
        assert payload["metadata"]["controller"] == "mpc"
        assert payload["metadata"]["controller_spec"] == spec
        energies[spec] = payload["metrics"]["energy_j"]
    assert energies["mpc"] == energies["mpc:h100-sxm-llama3-8b"]
    assert energies["mpc:a100-sxm-80gb-llama3-8b"] != energies["mpc"]


def test_a_plot_file_matplotlib_cannot_write_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--plot run.txt` raised matplotlib's ValueError after the whole run.
    pytest.importorskip("matplotlib")
    target = tmp_path / "run.txt"
    assert main(["simulate", "--duration", "5", "--plot", str(target), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpugov: error: --plot {target}: not an image format")
    assert ".png" in err and not target.exists()


def test_simulate_writes_its_files_before_a_closed_stdout_ends_it(tmp_path: Path) -> None:
    """`gpugov simulate --out F | head -1`: the reader is gone before the summary is
    printed; the command ends quietly, and the run's JSON is written all the same."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails with EPIPE
    out = tmp_path / "run.json"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpugov", "simulate", "--duration", "30", "--out", str(out)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr
    assert json.loads(out.read_text())["metrics"]["energy_j"] > 0


def test_simulate_out_cut_short_mid_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """``--out`` was written in place: a write that failed midway (here past a file-size
    limit of 16 KiB, of about 80) left it cut short, with a traceback; it is now replaced
    whole or not at all, and the failure is one line."""
    from study_support import run_past_file_size

    out = tmp_path / "run.json"
    out.write_text('{"an": "earlier run"}\n')
    argv = ["simulate", "--controller", "max", "--duration", "30", "--quiet", "--out", str(out)]
    cut = run_past_file_size(argv, limit_bytes=16 * 1024)
    assert cut.returncode == 1, cut.stderr
    assert cut.stderr.splitlines() == [f"gpugov: error: --out {out}: cannot write: File too large"]
    assert out.read_text() == '{"an": "earlier run"}\n'
    assert [path.name for path in tmp_path.iterdir()] == ["run.json"]  # no temporary left
    assert main(argv) == 0
    assert json.loads(out.read_text())["metrics"]["completed_requests"] > 0


def test_simulate_runs_a_controller_as_run_simulate_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unset, the period is mpc-online's recommended 0.25 s (1 s for the others) and the
    SLO target 99 %, as `run --simulate` and the example config run them; the title says
    both and the JSON records them."""
    cases = (
        (["--controller", "mpc-online"], 0.25, 0.99),
        (["--controller", "reactive"], 1.0, 0.99),
        (
            ["--controller", "mpc-online", "--control-period", "0.5", "--slo-target", "none"],
            0.5,
            None,
        ),
    )
    for index, (flags, period, target) in enumerate(cases):
        out = tmp_path / f"run{index}.json"
        assert main(["simulate", *flags, "--duration", "20", "--quiet", "--out", str(out)]) == 0
        metadata = json.loads(out.read_text())["metadata"]
        assert (metadata["control_period_s"], metadata["slo_target"]) == (period, target)
        shown = "none" if target is None else "99%"
        assert f"every {period:g} s, SLO target {shown}" in capsys.readouterr().out


def test_a_simulated_controller_gets_the_slo_target() -> None:
    from gpugov.controllers.budget import SLOTarget
    from gpugov.daemon.cli_support import simulated_controller
    from gpugov.plant import ServingPlant, load_profile, load_trace

    workload, _ = load_trace("azure-conv-10min", duration_s=10)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    target = SLOTarget(attainment=0.99, window_s=600.0)
    chain = simulated_controller("mpc-online", plant, workload, 0.25, slo_target=target)
    budget = chain.unwrapped.budget  # type: ignore[attr-defined]
    assert budget is not None and budget.target == target
    assert simulated_controller("mpc-online", plant, workload, 0.25).unwrapped.budget is None  # type: ignore[attr-defined]


def test_out_and_plot_are_replaced_together_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--out was replaced before the plot was drawn: a Ctrl-C while drawing (seconds) left
    the new run's JSON beside the earlier run's PNG. Both are one set now."""
    from study_support import fail_when_synced

    out, plot = tmp_path / "run.json", tmp_path / "run.png"
    argv = ["simulate", "--duration", "5", "--quiet", "--out", str(out), "--plot", str(plot)]
    assert main(argv) == 0
    earlier = (out.read_bytes(), plot.read_bytes())
    fail_when_synced(monkeypatch, "run.png", KeyboardInterrupt())
    assert main([*argv[:2], "6", *argv[3:]]) == 130
    assert (out.read_bytes(), plot.read_bytes()) == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.png"]


def test_the_loops_warnings_in_simulate_are_the_clis_warning_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's loop logs a warning inside ``simulate`` (mpc-online's hints find no
    size in a synthetic model's name and no family in its GPU's); with no logging set up
    it reached the terminal as the bare message, unlike every other warning line."""
    import logging

    assert logging.lastResort is not None
    monkeypatch.setattr(logging.lastResort, "formatter", None)  # put back after
    monkeypatch.setattr(logging.root, "handlers", [])  # as outside pytest: none
    argv = ["simulate", "--profile", "synthetic:tp2", "--controller", "mpc-online"]
    assert main([*argv, "--duration", "10", "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("gpugov: warning: ") for line in err), err
    assert any(
        line.startswith("gpugov: warning: mpc-online prior: GPU 'NVIDIA synthetic GPU")
        for line in err
    ), err


def test_a_window_past_the_traces_end_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--duration 3600`` on a 2 s trace simulated 2.2 s without a word: the energy of
    those seconds read as the window's. One note after the results says the window runs
    past the end (after them: a refusal before the run stays one line)."""
    trace = tmp_path / "short.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,50\n1,200,20\n2,300,30\n")
    assert main(["simulate", "--trace", str(trace), "--duration", "3600", "--quiet"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "runs past" in line]
    assert notes == [
        "note: short.csv: the window from 0 s to 3,600 s runs past the trace's last "
        "arrival at 2 s: it holds 3 request(s), and a run ends once they finish"
    ]
    assert main(["simulate", "--trace", str(trace), "--duration", "2", "--quiet"]) == 0
    assert "runs past" not in capsys.readouterr().out


@pytest.mark.parametrize("command", [["simulate", "--quiet"], ["run", "--simulate", "--quiet"]])
def test_a_load_scale_too_small_for_any_finite_time_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,5\n10,9,5\n")
    assert main([*command, "--trace", str(trace), "--load-scale", "1e-308"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [
        f"gpugov: error: {trace}: a load scale of 1e-308 stretches the window's arrival at "
        "10 s to no finite time; choose a larger load scale"
    ]


def test_the_out_file_names_every_setting_that_changes_its_figures(tmp_path: Path) -> None:
    """Two runs that differ only in what the controller observes (--engine-view) give
    different figures; each --out file names its view and the gpugov that wrote it, so a
    published figure can be run again as it was."""
    from gpugov import __version__

    base = ["simulate", "--controller", "mpc-online", "--duration", "20", "--quiet"]
    written = {}
    for view in ("vllm", "exact"):
        out = tmp_path / f"{view}.json"
        assert main([*base, "--engine-view", view, "--out", str(out)]) == 0
        written[view] = json.loads(out.read_text())
    vllm, exact = written["vllm"], written["exact"]
    assert vllm["metrics"]["energy_j"] != exact["metrics"]["energy_j"]
    assert vllm["metadata"]["engine_view"] == "vllm"
    assert exact["metadata"]["engine_view"] == "exact"
    assert vllm["metadata"]["gpugov_version"] == __version__
    assert vllm["metadata"]["versions"]["gpugov"] == __version__
    assert {"numpy", "scipy", "numba", "source"} <= set(vllm["metadata"]["versions"])


@pytest.mark.parametrize("plot", [False, True])
def test_a_failed_write_through_a_link_names_the_flag_it_came_from(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    plot: bool,
) -> None:
    """``--out`` a link to another file on a full disk: the failed write names the link's
    target, which the flag was told from by its text, so the line blamed ``--plot`` (given
    or not). It names ``--out`` now."""
    import errno
    import os

    from study_support import fail_when_synced

    real = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    extra = ["--plot", str(tmp_path / "run.png")] if plot else []
    fail_when_synced(monkeypatch, "real.json", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    argv = ["simulate", "--duration", "5", "--quiet", "--out", str(link), *extra]
    assert main(argv) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"gpugov: error: --out {link}: cannot write: No space left on device"], err
    assert not real.exists()


def test_a_failed_plot_write_names_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The figure's failed write, through a link, names ``--plot`` as given."""
    import errno
    import os

    from study_support import fail_when_synced

    link = tmp_path / "link.png"
    link.symlink_to(tmp_path / "real.png")
    fail_when_synced(monkeypatch, "real.png", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    out = tmp_path / "run.json"
    argv = ["simulate", "--duration", "5", "--quiet", "--out", str(out), "--plot", str(link)]
    assert main(argv) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"gpugov: error: --plot {link}: cannot write: No space left on device"], err
    assert not out.exists()


def test_the_title_says_the_chain_and_view_the_controller_ran_in(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The title line states the safety chain's dwell and floor and the engine view, as it
    states the period and SLO target: two runs' figures show the settings they differ in."""
    argv = ["simulate", "--controller", "reactive", "--duration", "5", "--quiet"]
    assert main([*argv, "--dwell", "2", "--floor", "900", "--engine-view", "exact"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title.endswith("dwell 2 s, clock floor 900 MHz, exact engine view"), title
    assert main(argv) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title.endswith("dwell 0.5 s, no clock floor, vllm engine view"), title
