"""``bench/unseen_node.py`` (a node it never saw): its refusals, and a short run on a
generated profile whose JSON holds the runs and ratios it reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_support import run_bench_main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--load", "1.5"], "--load must lie in (0, 1)"),
        (["--duration", "200"], "--duration must be a finite number of seconds above 300"),
        (["--duration", "inf"], "--duration must be a finite number of seconds above 300"),
        (["--start", "nan"], "--start must be seconds >= 0"),
        (["--start", "-100"], "--start must be seconds >= 0"),
        (["--profiles", "synthetic:nope"], "unknown synthetic profile shape"),
        (["--trace", "no-such-trace.csv"], "no-such-trace.csv"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "unseen.json"
    code, _, stderr = run_bench_main("unseen_node", [*argv, "--out", str(out)])
    assert code == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def test_an_output_that_is_a_directory_is_refused_before_any_run(tmp_path: Path) -> None:
    code, stdout, stderr = run_bench_main("unseen_node", ["--out", str(tmp_path)])
    assert code == 2
    assert "is a directory" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not stdout


def test_short_run_reports_savings_and_ratios(tmp_path: Path) -> None:
    out = tmp_path / "unseen.json"
    code, stdout, stderr = run_bench_main(
        "unseen_node",
        [
            "--trace",
            "azure-conv-10min",
            "--duration",
            "320",
            "--profiles",
            "narrow-clocks",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert code == 0, stderr
    assert "ETA" in stderr
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    assert row["profile"] == "synthetic-narrow-clocks" and row["status"] == "synthetic"
    scenario = row["scenario"]
    assert scenario["scenario_duration_s"] == 320.0
    assert scenario["load_scale"] == pytest.approx(scenario["source_duration_s"] / 320.0)
    assert scenario["utilization"] == pytest.approx(
        scenario["load_scale"] / scenario["capacity_load_scale"]
    )
    runs = row["controllers"]
    assert set(runs) == {"max", "mpc-online", "mpc", "best-fixed"}
    assert runs["max"]["saved_first_fraction"] == pytest.approx(0.0)
    assert runs["max"]["saved_whole_fraction"] == pytest.approx(0.0)
    assert runs["best-fixed"]["holds_slo"]
    assert runs["best-fixed"]["saved_whole_fraction"] > 0.0
    online, fixed = runs["mpc-online"], runs["best-fixed"]
    assert online["ratio_first_vs_best_fixed"] == pytest.approx(
        online["saved_first_fraction"] / fixed["saved_first_fraction"]
    )
    assert online["ratio_whole_vs_best_fixed"] == pytest.approx(
        online["saved_whole_fraction"] / fixed["saved_whole_fraction"]
    )
    assert row["targets"]["whole_run"] == (
        online["holds_slo"] and online["ratio_whole_vs_best_fixed"] >= 0.85
    )
    assert payload["summary"]["profiles"] == 1
    assert "synthetic-narrow-clocks" in stdout and "wrote" in stdout


def test_a_trace_too_short_for_the_run_is_skipped_with_the_reason(tmp_path: Path) -> None:
    # A minute of arrivals (the bundled 10-minute slice is as short for the default run,
    # but its capacity search takes most of a minute before the refusal).
    trace = tmp_path / "minute.csv"
    trace.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n"
        + "".join(f"{0.25 * i:.2f},{300 + 37 * (i % 7)},{40 + 5 * (i % 5)}\n" for i in range(241))
    )
    out = tmp_path / "unseen.json"
    code, stdout, _ = run_bench_main(
        "unseen_node",
        [
            "--trace",
            str(trace),
            "--profiles",
            "narrow-clocks",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert code == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "the trace spans 60 s" in row["error"] and "shorten --duration" in row["error"]
    assert "skipped" in stdout


def test_a_profile_whose_capacity_probe_would_not_end_is_a_skipped_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``slo_capacity``'s refusal of a probe past the simulated-days limit
    (``ProbeTooLongError``, a ``ScenarioSkip``) is the profile's row's ``error``, as the
    scoreboard skips such a scenario: the other profiles still run."""
    from study_support import bench_script

    from gpugov.study.scoreboard.scenarios import ProbeTooLongError

    module = bench_script("unseen_node")

    def too_long(*args: object, **kwargs: object) -> None:
        raise ProbeTooLongError("its light-load capacity probe would simulate 40 days")

    monkeypatch.setattr(module, "slo_capacity", too_long)
    row = module.run_profile(("synthetic:tp4", "azure-conv-10min", 0.0, 320.0, 0.45, "vllm"))
    assert row == {
        "profile": "synthetic-tp4",
        "status": "synthetic",
        "error": "its light-load capacity probe would simulate 40 days",
    }
    assert module.table([row])[1].endswith(
        "skipped: its light-load capacity probe would simulate 40 days"
    )


def test_an_output_in_a_folder_that_does_not_exist_is_refused_before_any_run(
    tmp_path: Path,
) -> None:
    """The one check of every --out (``check_output_file``): the folder must exist."""
    out = tmp_path / "no-such-folder" / "unseen.json"
    code, stdout, stderr = run_bench_main("unseen_node", ["--out", str(out)])
    assert code == 2
    assert "--out" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not stdout and not out.parent.exists()
