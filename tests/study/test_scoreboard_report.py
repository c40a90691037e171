"""``gpugov bench controllers --report DIR`` through the real entry point, on the hidden
tiny setup (one 15 s scenario), and the report's rules on hand-made request records."""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import shlex
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from study_support import run_main

from gpugov.plant.profile_files import bundled_profile_dir
from gpugov.plant.types import RequestRecord
from gpugov.plant.workload import resolve_trace
from gpugov.study.markdown import markdown_text, scenario_title
from gpugov.study.scoreboard import command, publish
from gpugov.study.scoreboard import report as scoreboard_report
from gpugov.study.scoreboard import run as scoreboard

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROFILE = "h100-sxm-llama3-8b"


def _strict_load(text: str) -> Any:
    def reject(constant: str) -> None:
        raise ValueError(f"non-strict JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, str]:
    out = tmp_path_factory.mktemp("scoreboard")
    report = tmp_path_factory.mktemp("base") / "report"  # created: its parent exists
    code, stdout, stderr = run_main(
        ["bench", "controllers", "--tiny", "--out", str(out), "--report", str(report)]
    )
    return report, code, stdout, stderr


def test_report_folder_holds_every_file_its_readme_names(
    tiny_report: tuple[Path, int, str, str],
) -> None:
    report, code, stdout, stderr = tiny_report
    assert code == 0, stderr
    names = sorted(p.name for p in report.iterdir())
    assert names == sorted(
        ["README.md", "report.md", "report.json", "pareto.csv", "pareto.png", "scoreboard.json"]
    )
    readme = (report / "README.md").read_text()
    for name in names:
        assert f"`{name}`" in readme
    data = _strict_load((report / "report.json").read_text())
    assert data["command"] in readme
    assert f"wrote the benchmark report to {report}" in stdout
    assert (report / "pareto.png").read_bytes().startswith(PNG_MAGIC)
    assert data["command"] in (report / "report.md").read_text()
    # Every row set against mpc-online where it holds, in the JSON and the markdown.
    entries = {entry["controller"]: entry for entry in data["head_to_head"]}
    assert "mpc-online" not in entries and "max" not in entries
    assert entries and all(entry["holds_slo"] <= 1 for entry in entries.values())
    assert "## Head to head against" in (report / "report.md").read_text()


def test_report_json_carries_versions_checksums_and_ml_energy_units(
    tiny_report: tuple[Path, int, str, str],
) -> None:
    report, _, _, _ = tiny_report
    data = _strict_load((report / "report.json").read_text())
    from gpugov import __version__

    assert data["schema"] == publish.REPORT_SCHEMA
    assert data["versions"]["gpugov"] == __version__
    assert data["plant"]["version"] == __version__
    # The profile's checksums are those of the bundled files it was read from.
    profile = data["profiles"][PROFILE]
    assert profile["status"] == "literature-derived"
    assert profile["profile_csv_sha256"] == _sha256(bundled_profile_dir() / f"{PROFILE}.csv")
    assert profile["manifest_sha256"] == _sha256(bundled_profile_dir() / f"{PROFILE}.json")
    [scenario] = data["scenarios"]
    assert scenario["trace_sha256"] == _sha256(resolve_trace("azure-conv-10min"))
    assert len(scenario["workload_checksum"]) == 64
    assert "energy_per_request_j" in data["definitions"]
    assert "proportion to the output tokens" in data["definitions"]["energy_per_request_j"]
    rows = data["rows"]
    assert [r["controller"] for r in rows] == list(scoreboard.CONTROLLER_ORDER)
    for row in rows:
        tokens, requests = row["output_tokens"], row["requests"]
        assert tokens > 0 and requests == scenario["requests"]
        # The attribution rule: J/token = E / tokens; mean per request = E / requests.
        assert row["energy_per_output_token_j"] == pytest.approx(row["energy_j"] / tokens)
        assert row["energy_per_request_mean_j"] == pytest.approx(row["energy_j"] / requests)
        assert row["energy_per_request_median_j"] > 0.0
        within = row["tpot_within_deadline"]
        assert list(within) == ["50ms", "100ms", "250ms"]
        assert 0.0 <= within["50ms"] <= within["100ms"] <= within["250ms"] <= 1.0
        assert row["tpot_median_s"] <= row["tpot_p95_s"]
        # The plant's exact attribution: requests' phases plus idle make up the energy.
        attributed = row["attributed_energy"]
        phases = attributed["prefill_energy_j"] + attributed["decode_energy_j"]
        assert phases + attributed["idle_energy_j"] == pytest.approx(row["energy_j"], rel=1e-9)
        spread = attributed["per_request_j"]
        assert 0.0 < spread["p50"] <= spread["p90"] <= spread["p99"]
        assert attributed["ml_energy_j_per_output_token"] == pytest.approx(
            row["energy_per_output_token_j"]
        )
    assert "attributed_energy" in data["definitions"]
    table = scoreboard_report.markdown(_strict_load((report / "scoreboard.json").read_text()))
    assert "J/request p50 / p99" in table
    by_key = {r["controller"]: r for r in rows}
    assert by_key["max"]["energy_saved_fraction"] == 0.0
    assert by_key["window-oracle"]["oracle_capture"] == pytest.approx(1.0)
    # The Pareto front is non-empty and every row on it is flagged.
    front = data["pareto_front"][scenario["key"]]
    assert front and all(by_key[key]["pareto_optimal"] for key in front)
    assert {s["controller"] for s in data["summary"]} == set(by_key)


def test_pareto_csv_has_one_line_per_row_and_scenario(
    tiny_report: tuple[Path, int, str, str],
) -> None:
    report, _, _, _ = tiny_report
    data = _strict_load((report / "report.json").read_text())
    with (report / "pareto.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    assert [(r["scenario"], r["controller"]) for r in lines] == [
        (r["scenario"], r["controller"]) for r in data["rows"]
    ]
    for line, row in zip(lines, data["rows"], strict=True):
        assert float(line["energy_saved_fraction"]) == pytest.approx(
            row["energy_saved_fraction"], abs=1e-6
        )
        assert line["holds_slo"] == str(int(row["holds_slo"]))


_CELL_EDGE = re.compile(r"(?<!\\)\|")
"""A ``|`` that ends a markdown table cell (an escaped ``\\|`` is text in the cell)."""


def _misaligned_rows(markdown: str) -> list[str]:
    """The table rows of ``markdown`` whose cells are not as many as their header's."""
    misaligned: list[str] = []
    width: int | None = None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = len(_CELL_EDGE.findall(line)) - 1
        if width is None:
            width = cells
        elif cells != width:
            misaligned.append(line)
    return misaligned


def test_report_tables_keep_their_columns_whatever_the_trace_is_named(
    tiny_report: tuple[Path, int, str, str],
) -> None:
    """Every table row of report.md and scoreboard.md has its header's cells. A scenario's
    key joins its trace, profile and load with ``|``: report.md's scenario table wrote it
    as it is, three cells too many, so each figure stood under the wrong header; and a
    trace whose file name holds a ``|`` or a newline split the rows of both files."""
    report, code, _, stderr = tiny_report
    assert code == 0, stderr
    assert _misaligned_rows((report / "report.md").read_text()) == []
    text = (report / "report.json").read_text()
    board = (report / "scoreboard.json").read_text()
    trace = json.dumps(_strict_load(text)["scenarios"][0]["trace"])[1:-1]
    odd = "my|trace\\nfile.csv"  # a |, and a newline as JSON writes it
    data = _strict_load(text.replace(trace, odd))
    payload = _strict_load(board.replace(trace, odd))
    assert data["scenarios"][0]["trace"] == "my|trace\nfile.csv"
    for markdown in (publish.report_markdown(data), scoreboard_report.markdown(payload)):
        assert _misaligned_rows(markdown) == []
        assert "my\\|trace\\nfile.csv / " in markdown  # the name as written, one line


def test_a_scenario_title_keeps_a_pipe_in_a_name_as_text() -> None:
    """A scenario's trace, profile and load, a held-out window's start and a layout, joined
    by ' / ' with each name's | escaped; split at each | of its key, a trace a|b.csv read
    'a / b.csv'."""
    row = {"scenario": "a|b.csv|p|cap70@60|1P1D", "trace": "a|b.csv", "profile": "p"}
    assert scenario_title(row, "scenario") == "a\\|b.csv / p / cap70@60 / 1P1D"
    assert scenario_title({"key": "t|p|recorded", "trace": "t", "profile": "p"}) == (
        "t / p / recorded"
    )
    assert markdown_text("x|y\nz") == "x\\|y\\nz"


def test_the_recorded_command_reproduces_the_report(
    tiny_report: tuple[Path, int, str, str], tmp_path: Path
) -> None:
    report, _, _, _ = tiny_report
    first = _strict_load((report / "report.json").read_text())
    argv = shlex.split(first["command"])
    assert argv[:3] == ["gpugov", "bench", "controllers"]
    again = tmp_path / "again"
    argv[argv.index("--report") + 1] = str(again)
    code, _, stderr = run_main([*argv[1:], "--out", str(tmp_path / "out")])
    assert code == 0, stderr
    second = _strict_load((again / "report.json").read_text())
    assert second["config"] == first["config"]
    assert second["scenarios"] == first["scenarios"]
    assert [(r["controller"], r["energy_j"], r["slo_attainment"]) for r in second["rows"]] == [
        (r["controller"], r["energy_j"], r["slo_attainment"]) for r in first["rows"]
    ]


def test_reproduce_command_spells_out_every_choice() -> None:
    # An outside row too (any loadable MODULE:FACTORY parses; it is called only at run time).
    config = command.config_for(
        quick=True,
        dwell_s=2.0,
        floor_mhz=900.0,
        engine_view="exact",
        outside_controllers=["json:loads"],
    )
    payload_config = {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in vars(config).items()
    }
    line = publish.reproduce_command(payload_config, "out dir")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(shlex.split(line)[3:])
    assert args.report == "out dir"
    again = command.config_for(
        quick=args.quick,
        traces=args.traces,
        profiles=args.profiles,
        loads=args.loads,
        duration_s=args.duration,
        dwell_s=args.dwell,
        floor_mhz=args.floor,
        windows=args.windows,
        engine_view=args.engine_view,
        outside_controllers=args.controller,
    )
    assert again == config
    assert config.engine_view == "exact" and config.outside_controllers == ("json:loads",)


def test_report_under_a_missing_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "report"
    out = tmp_path / "out"
    code, _, stderr = run_main(
        ["bench", "controllers", "--tiny", "--out", str(out), "--report", str(target)]
    )
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"gpugov: error: --report {target}:")
    assert "does not exist" in lines[0]
    assert not (tmp_path / "missing").exists()
    assert not (out / "scoreboard.json").exists()  # refused before any work


def test_report_onto_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me\n")
    code, _, stderr = run_main(
        ["bench", "controllers", "--tiny", "--out", str(tmp_path / "o"), "--report", str(target)]
    )
    assert code == 2
    assert f"--report {target}: exists and is not a directory" in stderr
    assert target.read_text() == "keep me\n"


def _record(
    request_id: int, output: int, generated: int, first: float | None, finish: float | None
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        arrival_time_s=0.0,
        prompt_tokens=100,
        output_tokens=output,
        first_token_time_s=first,
        finish_time_s=finish,
        generated_tokens=generated,
    )


def test_request_stats_follow_the_documented_rules() -> None:
    records = (
        _record(0, 11, 11, 0.1, 0.1 + 10 * 0.04),  # TPOT 40 ms
        _record(1, 11, 11, 0.1, 0.1 + 10 * 0.2),  # TPOT 200 ms
        _record(2, 1, 1, 0.1, 0.1),  # one token: no interval, counts as within
        _record(3, 50, 7, 0.2, None),  # unfinished: a miss at every deadline
    )
    result = SimpleNamespace(request_records=records, metrics=SimpleNamespace(energy_j=300.0))
    stats = publish.request_stats(result)  # type: ignore[arg-type]
    assert stats["requests"] == 4 and stats["completed_requests"] == 3
    assert stats["output_tokens"] == 30
    assert stats["energy_per_output_token_j"] == pytest.approx(10.0)
    assert stats["energy_per_request_mean_j"] == pytest.approx(75.0)
    # E_i = E * g_i / sum(g): 110, 110, 10, 70 J; median 90 J.
    assert stats["energy_per_request_median_j"] == pytest.approx(
        statistics.median([110.0, 110.0, 10.0, 70.0])
    )
    assert stats["tpot_median_s"] == pytest.approx(0.12)
    assert stats["tpot_within_deadline"] == {"50ms": 0.5, "100ms": 0.5, "250ms": 0.75}


def test_a_scenario_row_shows_the_seconds_over_the_requested_cap_apart() -> None:
    """The scenario table's "cap / thermal" cell was the seconds above the board limit: a
    power-cap row that ran over its own cap the whole scenario read 0.0 there."""
    row: dict[str, Any] = {
        "label": "power cap",
        "energy_j": 9000.0,
        "energy_saved_fraction": 0.1,
        "energy_per_output_token_j": 0.2,
        "slo_attainment": 0.95,
        "holds_slo": False,
        "ttft_p95_s": 0.9,
        "tpot_p95_s": 0.047,
        "power_cap_violation_s": 0.0,
        "thermal_violation_s": 0.0,
        "cap_overshoot_s": 36.2,
        "decision_time_p50_s": None,
        "decision_time_p99_s": None,
        "oracle_capture": None,
    }
    header, alignment = scoreboard_report.SCENARIO_TABLE_HEAD
    cells = [c.strip() for c in scoreboard_report.scenario_row(row).strip("|").split("|")]
    names = [c.strip() for c in header.strip("|").split("|")]
    assert len(cells) == len(names) == len(alignment.strip("|").split("|"))
    by_name = dict(zip(names, cells, strict=True))
    assert by_name["limit / thermal"] == "0.0 / 0.0 s"
    assert by_name["over cap"] == "36.2 s"
    # A row that sets no cap (the key absent, as in a scoreboard.json written before).
    del row["cap_overshoot_s"]
    cells = [c.strip() for c in scoreboard_report.scenario_row(row).strip("|").split("|")]
    assert dict(zip(names, cells, strict=True))["over cap"] == "-"


def test_without_matplotlib_the_plot_data_is_written_and_said(
    tiny_report: tuple[Path, int, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, _, _, _ = tiny_report
    payload = _strict_load((report / "scoreboard.json").read_text())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    paths, note = publish.write_report(payload, tmp_path)
    assert note is not None and "matplotlib" in note and "pareto.csv" in note
    assert "\n" not in note
    assert not (tmp_path / "pareto.png").exists()
    assert "pareto.png" not in paths
    readme = (tmp_path / "README.md").read_text()
    assert note in readme and "`pareto.png`" not in readme
    assert (tmp_path / "pareto.csv").is_file()


def test_head_to_head_sets_each_row_against_mpc_online_where_the_row_holds() -> None:
    """A median over every scenario compares different sets; the head-to-head keeps each
    row's held scenarios and prices the default governor on the same ones, a miss of its
    own counting no saving."""

    def row(scenario: str, controller: str, saved: float, holds: bool) -> dict[str, Any]:
        return {
            "scenario": scenario,
            "controller": controller,
            "energy_saved_fraction": saved,
            "holds_slo": holds,
        }

    rows = [
        row("a", "mpc-online", 0.20, True),
        row("a", "pid", 0.30, True),
        row("a", "agft", 0.50, False),
        row("b", "mpc-online", 0.25, False),  # its own miss: no saving there
        row("b", "pid", 0.10, True),
        row("b", "agft", 0.05, True),
        row("c", "mpc-online", 0.40, True),
        row("c", "pid", 0.35, False),
        row("c", "agft", 0.10, True),
    ]
    entries = {e["controller"]: e for e in scoreboard_report.head_to_head(rows)}
    assert set(entries) == {"agft", "pid"}
    pid = entries["pid"]  # holds on a and b
    assert (pid["holds_slo"], pid["reference_holds_slo"], pid["saves_more"]) == (2, 1, 2)
    assert pid["median_energy_saved_fraction"] == pytest.approx(0.20)  # (0.30 + 0.10) / 2
    assert pid["reference_median_energy_saved_fraction"] == pytest.approx(0.10)  # (0.2 + 0)/2
    agft = entries["agft"]  # holds on b and c
    assert (agft["holds_slo"], agft["reference_holds_slo"], agft["saves_more"]) == (2, 1, 1)
    assert agft["reference_median_energy_saved_fraction"] == pytest.approx(0.20)  # (0 + 0.4)/2
    without = [r for r in rows if r["controller"] != "mpc-online"]
    assert scoreboard_report.head_to_head(without) == []  # no reference: no section
    section = "\n".join(scoreboard_report.head_to_head_markdown(list(entries.values())))
    assert "## Head to head against" in section and "| 2 | 1 | 20.0% | 10.0% | 2 |" in section


def test_a_report_stopped_midway_leaves_the_earlier_report_whole(
    tiny_report: tuple[Path, int, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's files were replaced one after another: a Ctrl-C or a full disk after
    the first left a new report.json beside the earlier README.md and report.md. They are
    written as one set: all or none."""
    from gpugov.plant import output_files

    report, _, _, _ = tiny_report
    payload = _strict_load((report / "scoreboard.json").read_text())
    publish.write_report(payload, tmp_path, created_utc="earlier")
    earlier = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    synced = []

    def third_fails(descriptor: int) -> None:
        synced.append(descriptor)
        if len(synced) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(output_files.os, "fsync", third_fails)
    with pytest.raises(KeyboardInterrupt):
        publish.write_report(payload, tmp_path, created_utc="later")
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == earlier


def test_the_report_says_the_period_each_row_decided_at(
    tiny_report: tuple[Path, int, str, str],
) -> None:
    """report.md, the citable report, says each row's control period where it is not the
    board's, and the SLO target and view every controller was given, as scoreboard.md
    does: it said 'control period 1 s' beside rows decided every 0.25 s."""
    report, code, _, stderr = tiny_report
    assert code == 0, stderr
    text = (report / "report.md").read_text()
    assert "Control period 1 s (mpc 0.5 s; agft 0.3 s; mpc-online, default-dvfs, pid, " in text
    assert "observed the vllm engine view." in text
    rows = _strict_load((report / "report.json").read_text())["rows"]
    assert {r["controller"]: r["control_period_s"] for r in rows}["pid"] == 0.25


def test_the_periods_line_says_every_row_where_no_row_decides_at_another_period() -> None:
    """Rows that recorded their periods, all the board's: the line named the fast MPC at
    0.5 s and mpc-online at 0.25 s, rows the board did not have (the fallback of boards
    from before the rows recorded their periods)."""
    config = {
        "control_period_s": 1.0,
        "fast_mpc_period_s": 0.5,
        "online_period_s": 0.25,
        "mpc_horizon_s": 10.0,
    }
    rows = [
        {"controller": "max", "control_period_s": 1.0},
        {"controller": "reactive", "control_period_s": 1.0},
    ]
    line = scoreboard_report.periods_line({"config": config, "rows": rows})
    assert line == "Control period 1 s, every row; MPC horizon 10 s."
    old = [{"controller": "max"}, {"controller": "reactive"}]
    line = scoreboard_report.periods_line({"config": config, "rows": old})
    assert line == "Control period 1 s (the fast MPC 0.5 s, mpc-online 0.25 s); MPC horizon 10 s."
