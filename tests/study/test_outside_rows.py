"""An outside controller that misbehaves in a study: the command names it in one line, no
traceback, and a failing row costs its own results only (the scoreboard's other rows,
the sweep's other cells are kept)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpugov.cli import main

RUN_EARLY = 50  # its rough seconds on 2 cores: tests/conftest.py runs the longest files first
PACKAGE = '''
"""Outside governors that misbehave on the plant."""

import math


def make(context):
    clocks = context.supported_clocks_mhz

    def decide(observation):
        busy = observation.decode_active > 0 or observation.waiting_requests > 0
        return clocks[-1] if busy else clocks[0]

    return decide


def fails_later(context):
    def decide(observation):
        if observation.time_s >= 5.0:
            raise ValueError("no model for this load")
        return context.supported_clocks_mhz[0]

    return decide


def exits_later(context):
    def decide(observation):
        if observation.time_s >= 5.0:
            raise SystemExit(3)
        return context.supported_clocks_mhz[0]

    return decide


def not_a_number(context):
    def decide(observation):
        return "fast" if observation.step_index % 2 else math.nan

    return decide
'''


@pytest.fixture
def outside(module_on_path: Callable[[str, str], str]) -> str:
    """An importable module ``study_misbehaving`` in a temporary directory."""
    return module_on_path("study_misbehaving", PACKAGE)


@dataclass(frozen=True)
class NotAClockBoard:
    """One ``bench controllers --tiny --report`` run with a controller whose decisions are
    not a clock: its exit code, stderr, board and report."""

    spec: str
    module: Path
    code: int
    err: str
    out: Path
    report: Path


@pytest.fixture(scope="module")
def not_a_clock_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NotAClockBoard]:
    """The board and report of :data:`PACKAGE`'s ``not_a_number``, built once: the tests of
    the board's count, its warning, the report's lines and the software it names read the
    same run."""
    root = tmp_path_factory.mktemp("not-a-clock")
    name = "study_not_a_clock"
    (root / f"{name}.py").write_text(textwrap.dedent(PACKAGE))
    out, report, spec = root / "board", root / "report", f"{name}:not_a_number"
    argv = ["bench", "controllers", "--tiny", "--jobs", "1", "--out", str(out)]
    argv += ["--report", str(report), "--controller", spec]
    sys.path.insert(0, str(root))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop(name, None)
    yield NotAClockBoard(spec, root / f"{name}.py", code, err.getvalue(), out, report)


def test_a_failing_outside_row_leaves_the_board_of_the_other_rows(
    outside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two failing outside rows (one raises, one calls sys.exit) and a working one: the
    board is written with every other row, the failures are named in it and in one
    stderr line each, exit 1."""
    out, report = tmp_path / "board", tmp_path / "report"
    good, bad, exits = (f"{outside}:{name}" for name in ("make", "fails_later", "exits_later"))
    argv = ["bench", "controllers", "--tiny", "--jobs", "1", "--out", str(out)]
    argv += ["--report", str(report)]
    code = main([*argv, "--controller", bad, "--controller", good, "--controller", exits])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("gpugov: error:")]
    assert len(errors) == 2
    assert errors[0].startswith(f"gpugov: error: --controller {bad} failed on 1 scenario(s)")
    assert f"controller '{bad}' raised at t=5.000s" in errors[0]
    assert "no model for this load" in errors[0]
    assert "called sys.exit(3) while deciding" in errors[1]
    payload = json.loads((out / "scoreboard.json").read_text())
    controllers = {row["controller"] for row in payload["rows"]}
    assert good in controllers and {"max", "mpc-online", "pid"} <= controllers
    assert not {bad, exits} & controllers
    assert [s["controller"] for s in payload["summary"]][-1] == good
    assert [(f["controller"], f["scenario"]) for f in payload["failed_rows"]] == [
        (bad, payload["scenarios"][0]["key"]),
        (exits, payload["scenarios"][0]["key"]),
    ]
    assert "Failed, so left out of every table:" in (out / "scoreboard.md").read_text()
    published = json.loads((report / "report.json").read_text())
    assert [f["controller"] for f in published["failed_rows"]] == [bad, exits]


def test_the_board_counts_and_names_decisions_that_are_not_a_clock(
    not_a_clock_board: NotAClockBoard,
) -> None:
    out, spec, err = not_a_clock_board.out, not_a_clock_board.spec, not_a_clock_board.err
    assert not_a_clock_board.code == 0, err
    payload = json.loads((out / "scoreboard.json").read_text())
    (row,) = [r for r in payload["rows"] if r["controller"] == spec]
    assert row["invalid_decisions"] == row["decisions"] > 0
    assert all(r["invalid_decisions"] == 0 for r in payload["rows"] if r["controller"] == "max")
    (line,) = [line for line in err.splitlines() if "not a clock" in line]
    assert line.startswith(f"gpugov: warning: controller '{spec}': {row['invalid_decisions']} ")


def test_simulate_warns_about_decisions_that_are_not_a_clock(
    outside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = tmp_path / "run.json"
    argv = ["simulate", "--controller", f"{outside}:not_a_number", "--duration", "20"]
    assert main([*argv, "--quiet", "--out", str(result)]) == 0
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"gpugov: warning: controller '{outside}:not_a_number': ")
    assert "(the last: " in line and "top clock" in line
    metadata = json.loads(result.read_text())["metadata"]
    invalid = metadata["invalid_decisions"]
    assert invalid > 0 and f": {invalid} decision(s)" in line
    # The outside code it ran: its module's file and sha256 (no package on the path).
    (source,) = metadata["versions"]["outside_controllers"]
    assert source["spec"] == f"{outside}:not_a_number" and len(source["module_sha256"]) == 64


def test_simulate_names_a_sys_exit_in_a_decision(
    outside: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--controller", f"{outside}:exits_later", "--duration", "20", "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"gpugov: error: controller '{outside}:exits_later' raised at t=5.000s (step 50): "
        "called sys.exit(3) while deciding"
    )


def test_a_sweep_records_a_sys_exit_cell_as_failed_and_keeps_the_others(
    outside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "grid.toml"
    controllers = [f"{outside}:exits_later", f"{outside}:not_a_number", "max"]
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        f"controllers = {json.dumps(controllers)}\nduration_s = 20.0\n"
    )
    out = tmp_path / "out"
    assert main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    rows = {
        row["controller"]: row
        for row in map(json.loads, (out / "results.jsonl").read_text().splitlines())
    }
    assert rows[controllers[0]]["status"] == "failed"
    assert "called sys.exit(3) while deciding" in rows[controllers[0]]["error"]
    assert rows["max"]["status"] == "ok" and rows["max"]["invalid_decisions"] == 0
    assert rows[controllers[1]]["status"] == "ok" and rows[controllers[1]]["invalid_decisions"] > 0
    assert f"|{controllers[1]}|seed 0: " in err and "not a clock" in err


def test_fleet_names_a_controller_that_raises_in_one_line(
    outside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The bundled slice: the default trace is a shared one a fresh machine lacks.
    argv = ["fleet", "--controller", f"{outside}:fails_later", "--duration", "30"]
    argv += ["--trace", "azure-conv-10min", "--trace-start", "0"]
    argv += ["--nodes", "2", "--no-step", "--budgets", "0.8", "--allocators", "uniform"]
    argv += ["--quiet", "--jobs", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(
        f"gpugov: error: controller '{outside}:fails_later' on node node0 raised at t=5.000s"
    )
    assert line.endswith("): no model for this load")


def test_the_report_and_the_markdown_name_decisions_that_are_not_a_clock(
    not_a_clock_board: NotAClockBoard,
) -> None:
    """A row whose decisions the chain replaced by the top clock is no row of its own
    decisions: report.json keeps the count per row and scenario, and scoreboard.md and
    report.md say it beside the tables that cite the row."""
    out, report, spec = not_a_clock_board.out, not_a_clock_board.report, not_a_clock_board.spec
    assert not_a_clock_board.code == 0, not_a_clock_board.err
    board = json.loads((out / "scoreboard.json").read_text())
    (counted,) = [r for r in board["rows"] if r["controller"] == spec]
    published = json.loads((report / "report.json").read_text())
    (row,) = [r for r in published["rows"] if r["controller"] == spec]
    assert row["invalid_decisions"] == counted["invalid_decisions"] > 0
    (reference,) = [r for r in published["rows"] if r["controller"] == "max"]
    assert reference["invalid_decisions"] == 0
    phrase = f"controller '{spec}': {row['invalid_decisions']} decision(s) on 1 scenario(s)"
    for markdown in (out / "scoreboard.md", report / "report.md"):
        (line,) = [line for line in markdown.read_text().splitlines() if phrase in line]
        assert "top clock" in line


def test_a_sweeps_summary_names_decisions_that_are_not_a_clock_after_a_resume(
    outside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A controller whose answers the chain replaced by the top clock is named with the
    count in summary.md and counted in summary.json's table; a --resume, which runs no
    cell again and so warns of none, keeps saying it."""
    grid = tmp_path / "grid.toml"
    spec = f"{outside}:not_a_number"
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        f'controllers = ["max", "{spec}"]\nseeds = [0, 1]\nduration_s = 10.0\n'
    )
    out = tmp_path / "out"
    argv = ["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]
    assert main(argv) == 0
    assert main([*argv, "--resume"]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    count = sum(row["invalid_decisions"] for row in rows if row["controller"] == spec)
    assert count > 0
    summary_json = json.loads((out / "summary.json").read_text())
    table = {row["controller"]: row for row in summary_json["table"]}
    assert table[spec]["invalid_decisions"] == count
    assert table["max"]["invalid_decisions"] == 0
    # What ran it: the libraries, and the outside controller's module and its sha256
    # (the built-in kinds of the grid are gpugov's own).
    (source,) = summary_json["versions"]["outside_controllers"]
    assert source["spec"] == spec and source["module_file"] == str(tmp_path / f"{outside}.py")
    assert summary_json["versions"]["scipy"] and "source" in summary_json["versions"]
    summary = (out / "summary.md").read_text()
    (line,) = [line for line in summary.splitlines() if f"{spec}: {count} decision(s)" in line]
    assert "2 cell(s)" in line and "not a clock" in line
    assert "Not its own clocks (the safety chain ran the top clock instead):" in summary


def test_the_report_names_the_software_and_the_outside_code_it_ran(
    not_a_clock_board: NotAClockBoard,
) -> None:
    """A figure depends on more than gpugov's version: report.json and the board record
    the libraries that solve and sum it, the checkout's commit when gpugov runs from one,
    and the outside controller's module (its file's sha256, no package for a module on
    the path); report.md says them in its first line."""
    import hashlib
    import importlib.metadata
    import subprocess

    import gpugov

    out, report, spec = not_a_clock_board.out, not_a_clock_board.report, not_a_clock_board.spec
    assert not_a_clock_board.code == 0, not_a_clock_board.err
    published = json.loads((report / "report.json").read_text())
    versions = published["versions"]
    assert json.loads((out / "scoreboard.json").read_text())["versions"] == versions
    for library in ("numpy", "scipy", "numba"):
        assert versions[library] == importlib.metadata.version(library)
    package = Path(gpugov.__file__).parent
    tracked = subprocess.run(
        ["git", "-C", str(package), "ls-files", "--error-unmatch", "__init__.py"],
        capture_output=True,
        check=False,
    )
    if tracked.returncode == 0:  # run from a checkout: its commit
        commit = versions["source"]["commit"]
        assert len(commit) == 40 and isinstance(versions["source"]["dirty"], bool)
    else:
        assert versions["source"] is None
    (source,) = versions["outside_controllers"]
    module = not_a_clock_board.module
    assert source["spec"] == source["factory"] == spec
    assert source["module_file"] == str(module)
    assert source["module_sha256"] == hashlib.sha256(module.read_bytes()).hexdigest()
    assert source["package"] is None and source["package_version"] is None
    first = (report / "report.md").read_text().splitlines()[2]
    assert f"numpy {versions['numpy']}" in first and f"scipy {versions['scipy']}" in first
    assert f"{spec} from {spec} (module sha256 {source['module_sha256'][:12]})" in first


def test_an_outside_controller_that_ends_its_process_costs_its_row_only(
    module_on_path: Callable[[str, str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """os._exit (as a crash in compiled code would end it) inside a decision ends a child
    process, not the board: the other rows are written, the row is named with the exit
    code in failed_rows and one line, exit 1."""
    name = module_on_path(
        "study_exits_its_process",
        """
        import os


        def make(context):
            def decide(observation):
                if observation.time_s >= 5.0:
                    os._exit(7)
                return context.supported_clocks_mhz[-1]

            return decide
        """,
    )
    out = tmp_path / "board"
    spec = f"{name}:make"
    argv = ["bench", "controllers", "--tiny", "--jobs", "1", "--out", str(out)]
    assert main([*argv, "--controller", spec]) == 1
    err = capsys.readouterr().err
    payload = json.loads((out / "scoreboard.json").read_text())
    assert {"max", "mpc-online", "pid"} <= {row["controller"] for row in payload["rows"]}
    (failed,) = payload["failed_rows"]
    assert failed["controller"] == spec
    assert (
        failed["error"] == f"controller '{spec}' ended its process (exit code 7) before it answered"
    )
    (line,) = [line for line in err.splitlines() if line.startswith("gpugov: error:")]
    assert "exit code 7" in line and "Traceback" not in err


def test_each_scenario_builds_an_outside_controller_from_the_same_module_state(
    module_on_path: Callable[[str, str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A factory that keeps state in its module (a counter here, a model it goes on
    learning in a real one) finds the same state on every scenario, whatever ran before
    it in the process: its rows do not follow --jobs or the scenarios' order."""
    log = tmp_path / "builds.txt"
    name = module_on_path(
        "study_module_state",
        f"""
        BUILT = []


        def make(context):
            BUILT.append(1)
            with open({str(log)!r}, "a") as handle:
                handle.write(f"{{len(BUILT)}}\\n")
            return lambda observation: context.supported_clocks_mhz[-1]
        """,
    )
    spec = f"{name}:make"
    argv = ["bench", "controllers", "--tiny", "--windows", "2", "--duration", "10"]
    assert main([*argv, "--jobs", "1", "--out", str(tmp_path / "b"), "--controller", spec]) == 0
    capsys.readouterr()
    # The check before the run, then each of the two windows: each built on a fresh state.
    assert log.read_text().split() == ["1", "1", "1"]


def test_a_sweep_keeps_its_cells_when_an_outside_controller_ends_its_process(
    module_on_path: Callable[[str, str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A sweep's cell whose outside controller ends its process fails alone (named with
    the exit code), and a factory's module state is the same for every cell and for the
    grid's check: the state a cell starts from follows neither --jobs nor the order."""
    log = tmp_path / "builds.txt"
    name = module_on_path(
        "study_sweep_process",
        f"""
        import os

        BUILT = []


        def exits(context):
            def decide(observation):
                if observation.time_s >= 5.0:
                    os._exit(7)
                return context.supported_clocks_mhz[-1]

            return decide


        def counts(context):
            BUILT.append(1)
            with open({str(log)!r}, "a") as handle:
                handle.write(f"{{len(BUILT)}}\\n")
            return lambda observation: context.supported_clocks_mhz[-1]
        """,
    )
    grid = tmp_path / "grid.toml"
    controllers = ["max", f"{name}:exits", f"{name}:counts"]
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        f"controllers = {json.dumps(controllers)}\nseeds = [0, 1]\nduration_s = 10.0\n"
    )
    out = tmp_path / "out"
    assert main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    status = {(row["controller"], row["seed"]): row["status"] for row in rows}
    assert status == {
        ("max", 0): "ok",
        ("max", 1): "ok",
        (controllers[1], 0): "failed",
        (controllers[1], 1): "failed",
        (controllers[2], 0): "ok",
        (controllers[2], 1): "ok",
    }
    failed = [row["error"] for row in rows if row["status"] == "failed"]
    assert all("ended its process (exit code 7)" in error for error in failed)
    # The grid's check and the two cells, each built on the module's first state.
    assert log.read_text().split() == ["1", "1", "1"]


def test_a_resume_says_when_an_outside_controllers_module_changed(
    module_on_path: Callable[[str, str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A sweep's outside controller is keyed by its name (its module is code, not an input
    file), so an edited module keeps its done cells; each row records the module's sha256,
    and a --resume after an edit says how many done cells ran the earlier code."""
    import hashlib

    source = "def make(context):\n    return lambda observation: context.supported_clocks_mhz[-1]\n"
    name = module_on_path("study_edited_module", source)
    module = tmp_path / f"{name}.py"
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        f'controllers = ["max", "{name}:make"]\nseeds = [0, 1]\nduration_s = 10.0\n'
    )
    out = tmp_path / "out"
    argv = ["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    assert {r["controller_module_sha256"] for r in rows if r["controller"] != "max"} == {digest}
    assert all("controller_module_sha256" not in r for r in rows if r["controller"] == "max")
    assert main([*argv, "--resume"]) == 0
    assert "another version of their outside controller" not in capsys.readouterr().err
    module.write_text(source + "# edited\n")
    assert main([*argv, "--resume"]) == 0
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "resuming:" in line]
    assert "(2 of them ran another version of their outside controller's module" in line
