"""``gpugov sweep`` through the real entry point: cells equal ``simulate``'s runs, results
are appended as cells finish, ``--resume`` runs only what is missing (never a cell twice),
and bad grid files get one line naming the file and the key."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from study_support import run_main
from synthetic import plan_payload

from gpugov.study.sweep import PLOTS_HINT, RESULTS, cell_key, plan_sweep

GRID = """
traces = ["azure-conv-10min", "bursty.csv"]
profiles = ["h100-sxm-llama3-8b"]
loads = [1.0, 2.0]
controllers = ["max", "reactive", "fixed:1200"]
seeds = [0, 1]
duration_s = 30.0
latency_noise = 0.05
"""
CELLS = 2 * 1 * 2 * 3 * 2


def _grid(folder: Path, text: str = GRID) -> Path:
    """A grid beside a trace of our own: bursts of long prompts unlike the Azure slice."""
    rows = ["arrival_time_s,prompt_tokens,output_tokens"]
    for burst in range(6):
        for index in range(8):
            rows.append(f"{5.0 * burst + 0.05 * index:.2f},{3000 + 200 * index},{20 + index}")
    (folder / "bursty.csv").write_text("\n".join(rows) + "\n")
    path = folder / "grid.toml"
    path.write_text(text)
    return path


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]


@pytest.fixture(scope="module")
def full_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, str]:
    folder = tmp_path_factory.mktemp("sweep")
    grid = _grid(folder)
    out = folder / "out"
    code, stdout, stderr = run_main(
        ["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "2"]
    )
    assert code == 0, stderr
    return grid, out, stdout, stderr


def test_every_cell_once_with_simulates_metrics(full_sweep, tmp_path: Path) -> None:
    grid, out, stdout, stderr = full_sweep
    rows = _rows(out)
    assert len(rows) == CELLS and len({row["key"] for row in rows}) == CELLS
    assert all(row["status"] == "ok" for row in rows)
    assert f"{CELLS} cells: {CELLS} ran now" in stdout
    assert "sweep: 100.0%" in stderr and "ETA" in stderr
    # One cell against `gpugov simulate` with the same flags: the same metrics exactly.
    cell = next(
        r
        for r in rows
        if r["trace"] == "bursty.csv"
        and r["load"] == 2.0
        and r["controller"] == "reactive"
        and r["seed"] == 1
    )
    target = tmp_path / "simulate.json"
    code, _, stderr = run_main(
        [
            "simulate",
            "--trace",
            str(grid.parent / "bursty.csv"),
            "--duration",
            "30",
            "--load-scale",
            "2",
            "--controller",
            "reactive",
            "--seed",
            "1",
            "--latency-noise",
            "0.05",
            "--out",
            str(target),
        ]
    )
    assert code == 0, stderr
    simulated = json.loads(target.read_text())
    assert simulated["metrics"] == cell["metrics"]
    assert simulated["metadata"]["trace"]["light_load_floor"] == cell["light_load_floor"]
    # Seeds matter with latency noise; the max clock saves nothing against itself.
    by = {(r["trace"], r["load"], r["controller"], r["seed"]): r for r in rows}
    assert (
        by[("bursty.csv", 2.0, "max", 0)]["metrics"] != by[("bursty.csv", 2.0, "max", 1)]["metrics"]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["table"]) == CELLS // 2
    for row in summary["table"]:
        assert row["seeds"] == 2
        if row["controller"] == "max":
            assert row["energy_saved_vs_max"] == 0.0
    assert "| trace | profile | load | controller |" in (out / "summary.md").read_text()
    assert (out / "sweep.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("settings", "flags"),
    [
        ("", []),  # unset: mpc-online at its own 0.25 s under a 0.99 target, as simulate
        (
            'control_period_s = 0.5\nslo_target = "none"',
            ["--control-period", "0.5", "--slo-target", "none"],
        ),
    ],
)
def test_a_cell_runs_the_controller_as_simulate_runs_it(
    settings: str, flags: list[str], tmp_path: Path
) -> None:
    text = 'traces = ["bursty.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
    text += f'controllers = ["mpc-online"]\nduration_s = 30.0\n{settings}\n'
    grid = _grid(tmp_path, text)
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(tmp_path / "out")])
    assert code == 0, stderr
    (cell,) = _rows(tmp_path / "out")
    target = tmp_path / "simulate.json"
    argv = ["simulate", "--trace", str(tmp_path / "bursty.csv"), "--duration", "30"]
    code, _, stderr = run_main([*argv, "--controller", "mpc-online", *flags, "--out", str(target)])
    assert code == 0, stderr
    assert json.loads(target.read_text())["metrics"] == cell["metrics"]


def test_resume_runs_only_the_missing_cells(full_sweep, tmp_path: Path) -> None:
    grid, out, _, _ = full_sweep
    lines = (out / RESULTS).read_text().splitlines(keepends=True)
    # An interrupted sweep: three cells never finished, the last write cut short.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / RESULTS).write_text("".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    code, stdout, stderr = run_main(
        ["sweep", "--grid", str(grid), "--out", str(resumed), "--resume", "--jobs", "2"]
    )
    assert code == 0, stderr
    assert f"{CELLS} cells: 3 ran now, {CELLS - 3} done before" in stdout
    assert "cut short" in stderr
    rows = _rows(resumed)
    assert len(rows) == CELLS and len({row["key"] for row in rows}) == CELLS
    original = {row["key"]: row["metrics"] for row in _rows(out)}
    assert {row["key"]: row["metrics"] for row in rows} == original
    # Resuming a finished sweep runs nothing and counts nothing twice.
    code, stdout, _ = run_main(["sweep", "--grid", str(grid), "--out", str(resumed), "--resume"])
    assert code == 0 and f"0 ran now, {CELLS} done before" in stdout
    assert len(_rows(resumed)) == CELLS


def test_a_resume_over_results_of_another_gpugov_says_so(full_sweep, tmp_path: Path) -> None:
    """Done cells written by another gpugov version are kept, and the resume line, the
    summary's markdown and its JSON say which versions the table mixes (a plant change
    between them would compare one controller's figures with another's on two plants)."""
    from gpugov import __version__

    grid, out, _, _ = full_sweep
    lines = (out / RESULTS).read_text().splitlines(keepends=True)
    older = json.loads(lines[0])
    older["gpugov_version"] = "0.0.1"
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / RESULTS).write_text(json.dumps(older) + "\n" + "".join(lines[1:]))
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(resumed), "--resume"])
    assert code == 0, stderr
    (line,) = [line for line in stderr.splitlines() if line.startswith("resuming:")]
    assert f"1 of them written by gpugov 0.0.1, not this {__version__}" in line
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["gpugov_versions"] == {"0.0.1": 1, __version__: CELLS - 1}
    markdown = (resumed / "summary.md").read_text()
    assert f"gpugov 0.0.1 (1 cell) and {__version__} ({CELLS - 1} cells)" in markdown
    # One version: the JSON names it, the markdown says nothing of versions.
    single = json.loads((out / "summary.json").read_text())
    assert single["gpugov_versions"] == {__version__: CELLS}
    assert "written by gpugov" not in (out / "summary.md").read_text()


def test_the_maximum_clock_spelled_maximum_is_the_baseline_of_the_savings(
    tmp_path: Path,
) -> None:
    """``maximum`` is ``max`` (its older name, a spec simulate takes): a grid that names it
    so gets the saving of every row against it, where every saving read '-'."""
    grid = _grid(
        tmp_path,
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["maximum", "fixed:1200"]\nduration_s = 10.0\n',
    )
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"])
    assert code == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    table = {row["controller"]: row for row in summary["table"]}
    assert table["maximum"]["energy_saved_vs_max"] == 0.0
    saved = 1.0 - table["fixed:1200"]["energy_j"] / table["maximum"]["energy_j"]
    assert table["fixed:1200"]["energy_saved_vs_max"] == pytest.approx(saved)
    assert saved > 0.0


def test_existing_results_need_resume(full_sweep) -> None:
    grid, out, _, _ = full_sweep
    before = (out / RESULTS).read_bytes()
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2
    assert stderr.count("\n") == 1 and "--resume" in stderr
    assert (out / RESULTS).read_bytes() == before


def test_keys_are_stable_and_follow_the_settings(tmp_path: Path) -> None:
    grid = _grid(tmp_path)
    first = [cell.key for cell in plan_sweep(grid).cells]
    assert first == [cell.key for cell in plan_sweep(grid).cells]
    assert len(set(first)) == CELLS
    grid.write_text(GRID.replace("latency_noise = 0.05", "latency_noise = 0.1"))
    assert not set(first) & {cell.key for cell in plan_sweep(grid).cells}
    grid.write_text(GRID + 'engine_view = "exact"\n')
    exact = plan_sweep(grid).cells
    assert not set(first) & {cell.key for cell in exact}
    assert {dict(cell.settings)["engine_view"] for cell in exact} == {"exact"}
    assert cell_key({"a": 1, "b": 2}) == cell_key({"b": 2, "a": 1})


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("seeds = [0, 1]", "unknown key 'colour'"),
        ("loads = [1.0, 2.0]", "key 'loads': "),
        ("loads = [1.0, 2.0]", "key 'loads': "),
        ('traces = ["azure-conv-10min", "bursty.csv"]', "key 'traces': "),
        ('profiles = ["h100-sxm-llama3-8b"]', "key 'profiles': "),
        ('controllers = ["max", "reactive", "fixed:1200"]', "key 'controllers'"),
        ("duration_s = 30.0", "not valid TOML"),
        ("duration_s = 30.0", "key 'engine_view'"),
        ('traces = ["azure-conv-10min", "bursty.csv"]', "missing key 'traces'"),
    ],
    ids=[
        "unknown-key",
        "bad-load",
        "duplicate-load",
        "unknown-trace",
        "unknown-profile",
        "bad-controller",
        "bad-toml",
        "bad-view",
        "missing",
    ],
)
def test_bad_grid_files_get_one_line(
    change: str, expected: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    replacement = {
        "unknown-key": 'seeds = [0, 1]\ncolour = "blue"',
        "bad-load": "loads = [1.0, -2.0]",
        "duplicate-load": "loads = [1.0, 1.0]",
        "unknown-trace": 'traces = ["azure-conv-10min", "nope.csv"]',
        "unknown-profile": 'profiles = ["b300-nope"]',
        "bad-controller": 'controllers = ["max", "warp-drive"]',
        "bad-toml": "duration_s = = 30",
        "bad-view": 'duration_s = 30.0\nengine_view = "sglang"',
        "missing": "",
    }[request.node.callspec.id]
    grid = _grid(tmp_path, GRID.replace(change, replacement))
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"gpugov: error: {grid}") and expected in stderr
    assert not (out / RESULTS).exists()


def test_the_grid_copy_names_every_path_absolute_and_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DIR/grid.toml kept relative paths verbatim, which then resolved against DIR."""
    from gpugov.plant.profile_files import bundled_profile_dir
    from gpugov.study.sweep import GRID_COPY, read_grid

    data, grids, work = tmp_path / "data", tmp_path / "grids", tmp_path / "work"
    for folder in (data, grids, work):
        folder.mkdir()
    _grid(data)  # data/bursty.csv
    manifest = json.loads((bundled_profile_dir() / "h100-sxm-llama3-8b.json").read_text())
    (data / "my h100.csv").write_bytes((bundled_profile_dir() / manifest["csv"]).read_bytes())
    (data / "my h100.json").write_text(json.dumps({**manifest, "csv": "my h100.csv"}))
    plan = plan_payload((1200.0, 1500.0))
    (work / "plan.json").write_text(json.dumps(plan))
    grid = grids / "grid.toml"
    grid.write_text(
        'traces = ["../data/bursty.csv", "azure-conv-10min"]\n'
        'profiles = ["../data/my h100.json", "h100-sxm-llama3-8b"]\n'
        'controllers = ["max", "open-loop:plan.json"]\n'
        "duration_s = 10.0\n"
    )
    monkeypatch.chdir(work)  # the plan is read from the working directory, as simulate's
    first = tmp_path / "first"
    code, _, stderr = run_main(["sweep", "--grid", "../grids/grid.toml", "--out", str(first)])
    assert code == 0, stderr
    copy = read_grid(first / GRID_COPY)
    assert copy.traces == [str(data / "bursty.csv"), "azure-conv-10min"]
    assert copy.profiles == [str(data / "my h100.json"), "h100-sxm-llama3-8b"]
    assert copy.controllers == ["max", f"open-loop:{work / 'plan.json'}"]
    assert copy.duration_s == 10.0 and copy.seeds == [0] and copy.floor_mhz is None
    monkeypatch.chdir(first)
    again = tmp_path / "again"
    code, _, stderr = run_main(["sweep", "--grid", GRID_COPY, "--out", str(again)])
    assert code == 0, stderr
    before = sorted(json.dumps(row["metrics"], sort_keys=True) for row in _rows(first))
    assert sorted(json.dumps(row["metrics"], sort_keys=True) for row in _rows(again)) == before
    assert len(before) == 2 * 2 * 2


def test_a_grid_takes_home_paths_from_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~/...` in the grid (a trace, a profile, a spec's plan or profile) is the home's, as
    in the node config; the trace was "not found" (read as a folder `~` beside the grid),
    and a spec's profile read by simulate was left out of the cell's key."""
    from gpugov.plant.profile_files import bundled_profile_dir
    from gpugov.study.sweep import GRID_COPY, read_grid

    home, grids = tmp_path / "home", tmp_path / "grids"
    for folder in (home, grids):
        folder.mkdir()
    _grid(home)  # home/bursty.csv
    for suffix in (".json", ".csv"):
        source = bundled_profile_dir() / f"h100-sxm-llama3-8b{suffix}"
        (home / source.name).write_bytes(source.read_bytes())
    (home / "plan.json").write_text(json.dumps(plan_payload((1200.0, 1500.0))))
    grid = grids / "grid.toml"
    grid.write_text(
        'traces = ["~/bursty.csv"]\n'
        'profiles = ["~/h100-sxm-llama3-8b.json"]\n'
        'controllers = ["open-loop:~/plan.json", "mpc:~/h100-sxm-llama3-8b.json"]\n'
        "duration_s = 10.0\n"
    )
    monkeypatch.setenv("HOME", str(home))
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 0, stderr
    copy = read_grid(out / GRID_COPY)
    manifest = str(home / "h100-sxm-llama3-8b.json")
    assert copy.traces == [str(home / "bursty.csv")]
    assert copy.profiles == [manifest]
    assert copy.controllers == [f"open-loop:{home / 'plan.json'}", f"mpc:{manifest}"]
    digests = {row["controller"]: row["controller_file_sha256"] for row in _rows(out)}
    assert all(len(files) > 0 for files in digests.values()), digests


def _grid_of_relative_paths(tmp_path: Path) -> Path:
    """``grids/grid.toml`` naming a trace and a profile relative to its folder and an
    open-loop plan relative to ``work/`` (the working directory it is run from)."""
    from gpugov.plant.profile_files import bundled_profile_dir

    data, grids, work = tmp_path / "data", tmp_path / "grids", tmp_path / "work"
    for folder in (data, grids, work):
        folder.mkdir()
    _grid(data)  # data/bursty.csv
    manifest = json.loads((bundled_profile_dir() / "h100-sxm-llama3-8b.json").read_text())
    (data / "my h100.csv").write_bytes((bundled_profile_dir() / manifest["csv"]).read_bytes())
    (data / "my h100.json").write_text(json.dumps({**manifest, "csv": "my h100.csv"}))
    (work / "plan.json").write_text(json.dumps(plan_payload((1200.0, 1500.0))))
    grid = grids / "grid.toml"
    grid.write_text(
        'traces = ["../data/bursty.csv", "azure-conv-10min"]\n'
        'profiles = ["../data/my h100.json", "h100-sxm-llama3-8b"]\n'
        'controllers = ["max", "open-loop:plan.json"]\n'
        "duration_s = 10.0\n"
    )
    return grid


def test_resume_from_the_grid_copy_in_another_folder_runs_nothing_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell's key held its trace, profile and controller file as the grid spelled them,
    so ``--resume`` with ``DIR/grid.toml`` (every path absolute), the copy made to run
    again from any folder, ran again every cell that named a file relatively (7 of 8
    here). Keys now name the files as resolved."""
    from gpugov.study.sweep import GRID_COPY

    grid = _grid_of_relative_paths(tmp_path)
    monkeypatch.chdir(tmp_path / "work")
    code, _, stderr = run_main(["sweep", "--grid", "../grids/grid.toml", "--out", "../out"])
    assert code == 0, stderr
    out = tmp_path / "out"
    before = (out / RESULTS).read_text()
    keys = {cell.key for cell in plan_sweep(grid).cells}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert {cell.key for cell in plan_sweep(out / GRID_COPY).cells} == keys
    code, stdout, stderr = run_main(
        ["sweep", "--grid", f"../out/{GRID_COPY}", "--out", "../out", "--resume"]
    )
    assert code == 0, stderr
    assert "8 cells: 0 ran now, 8 done before" in stdout
    assert "0/0 cells" not in stderr  # no bar with nothing to run
    assert (out / RESULTS).read_text() == before
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["table"]) == 8 and all(row["seeds"] == 1 for row in summary["table"])
    saved = [row["energy_saved_vs_max"] for row in summary["table"]]
    assert all(value is not None for value in saved)  # each row still set against max


def test_results_keyed_as_the_grid_spelled_paths_still_count_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results written before keys resolved paths (a relative path as written) are still
    found: resuming them runs nothing again."""
    grid = _grid_of_relative_paths(tmp_path)
    monkeypatch.chdir(tmp_path / "work")
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 0, stderr
    cells = {cell.key: cell for cell in plan_sweep(grid).cells}
    assert sum(not cell.former_keys for cell in cells.values()) == 1  # all names: unchanged
    rows = _rows(out)
    for row in rows:
        cell = cells[row["key"]]
        row["key"] = cell.former_keys[-1] if cell.former_keys else row["key"]
        if cell.files_changed_at_s is not None:  # the plan: written after it last changed
            row["finished_at"] = _iso(cell.files_changed_at_s + 1)
    (out / RESULTS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, stdout, _ = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--resume"])
    assert code == 0 and "8 cells: 0 ran now, 8 done before" in stdout


def _iso(unix_s: float) -> str:
    """A result line's ``finished_at`` for Unix time ``unix_s``."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="seconds")


def test_resume_runs_again_the_cells_whose_input_files_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell's key named its controller's files (an open-loop plan, an MPC profile) by
    path only, so ``--resume`` after editing one reused results computed from the old
    contents. The key now holds each file's sha256: an edited plan or profile runs its
    cells again, and only those; an edited trace window runs its cells again, as before."""
    from gpugov.plant.profile_files import bundled_profile_dir

    monkeypatch.chdir(tmp_path)  # the controller files are read from here, as simulate's
    _grid(tmp_path)  # bursty.csv
    manifest = json.loads((bundled_profile_dir() / "h100-sxm-llama3-8b.json").read_text())
    csv = tmp_path / "mine.csv"
    csv.write_bytes((bundled_profile_dir() / manifest["csv"]).read_bytes())
    (tmp_path / "mine.json").write_text(json.dumps({**manifest, "csv": "mine.csv"}))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_payload((1200.0, 1500.0))))
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["bursty.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["max", "open-loop:plan.json", "mpc:mine.json"]\nduration_s = 10.0\n'
    )
    out = tmp_path / "out"
    argv = ["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]
    assert run_main(argv)[0] == 0

    def resume() -> tuple[list[str], str]:
        """The controllers of the cells the resumed sweep ran, and its stderr."""
        count = len(_rows(out))
        code, _, stderr = run_main([*argv, "--resume"])
        assert code == 0, stderr
        return [row["controller"] for row in _rows(out)[count:]], stderr

    assert resume()[0] == []
    first = {row["controller"]: row for row in _rows(out)}
    plan.write_text(json.dumps(plan_payload((900.0, 900.0))))
    ran, stderr = resume()
    assert ran == ["open-loop:plan.json"]
    assert "2 of 3 cells already done, 1 to run (1 of them ran before on other inputs" in stderr
    again = _rows(out)[-1]
    assert again["controller_file_sha256"] != first["open-loop:plan.json"]["controller_file_sha256"]
    assert again["metrics"]["energy_j"] != first["open-loop:plan.json"]["metrics"]["energy_j"]
    summary = {
        row["controller"]: row for row in json.loads((out / "summary.json").read_text())["table"]
    }
    assert summary["open-loop:plan.json"]["energy_j"] == again["metrics"]["energy_j"]
    csv.write_text(csv.read_text() + "\n")  # the profile's CSV, not its manifest
    assert resume()[0] == ["mpc:mine.json"]
    trace = tmp_path / "bursty.csv"
    trace.write_text(trace.read_text().replace(",3000,", ",2900,"))
    assert sorted(resume()[0]) == ["max", "mpc:mine.json", "open-loop:plan.json"]
    assert resume()[0] == []


def test_results_keyed_without_contents_count_while_their_files_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result written before keys held the files' contents says nothing of them: it
    counts while its controller's files have not changed since it finished (their status
    change time, which a copy or a move sets too), else its cell runs again."""
    monkeypatch.chdir(tmp_path)
    _grid(tmp_path)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_payload((1200.0, 1500.0))))
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["bursty.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["max", "open-loop:plan.json"]\nduration_s = 10.0\n'
    )
    out = tmp_path / "out"
    argv = ["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]
    assert run_main(argv)[0] == 0
    cells = {cell.key: cell for cell in plan_sweep(grid).cells}
    planned = next(cell for cell in cells.values() if cell.controller.startswith("open-loop"))
    assert planned.former_keys and planned.files_changed_at_s is not None
    maximum = next(cell for cell in cells.values() if cell.controller == "max")
    assert maximum.files_changed_at_s is None  # reads no controller file: as before

    def keyed_the_old_way(finished_at_s: float) -> None:
        rows = _rows(out)
        for row in rows:
            if row["key"] in planned.known_keys():
                row.pop("controller_file_sha256", None)
                row["key"], row["finished_at"] = planned.former_keys[0], _iso(finished_at_s)
        (out / RESULTS).write_text("".join(json.dumps(row) + "\n" for row in rows))

    keyed_the_old_way(planned.files_changed_at_s + 1)  # finished after the plan was written
    code, stdout, _ = run_main([*argv, "--resume"])
    assert code == 0 and "2 cells: 0 ran now, 2 done before" in stdout
    keyed_the_old_way(planned.files_changed_at_s - 1)  # the plan changed after it finished
    code, stdout, _ = run_main([*argv, "--resume"])
    assert code == 0 and "2 cells: 1 ran now, 1 done before" in stdout
    assert _rows(out)[-1]["key"] == planned.key


def test_the_grid_copy_reads_back_as_the_grid(tmp_path: Path) -> None:
    """Quotes, backslashes, other scripts and control characters survive the TOML copy."""
    from gpugov.study.sweep import SweepGrid, grid_toml, read_grid

    odd = 'a "b" \\ c \u00e9\u6f22 \U0001f600 \t\x7f\x01.csv'
    grid = SweepGrid(
        traces=[odd, "azure-code"],
        profiles=["h100-sxm-llama3-8b"],
        controllers=["max"],
        loads=[0.5, 1e-05, 3.0],
        duration_s=3e8,
        floor_mhz=900.0,
    )
    path = tmp_path / "copy.toml"
    path.write_text(grid_toml(grid))
    assert read_grid(path) == grid


def test_without_matplotlib_the_table_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = _grid(
        tmp_path,
        GRID.replace("seeds = [0, 1]", "seeds = [0]").replace(
            "loads = [1.0, 2.0]", "loads = [1.0]"
        ),
    )
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "out"
    code, stdout, stderr = run_main(
        ["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]
    )
    assert code == 0, stderr
    assert PLOTS_HINT in stderr
    assert (out / "summary.md").exists() and not (out / "sweep.png").exists()
    assert "reactive" in stdout


def test_a_worker_killed_mid_sweep_loses_nothing_and_counts_nothing_twice(
    full_sweep, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cell_tasks

    from gpugov.study.sweep import run as sweep_run

    grid, reference, _, _ = full_sweep
    victim = "bursty.csv|h100-sxm-llama3-8b|x2|reactive|seed 1"
    monkeypatch.setenv("GPUGOV_TEST_KILL_CELL", victim)
    monkeypatch.setenv("GPUGOV_TEST_KILL_MARKER", str(tmp_path / "killed"))
    monkeypatch.setattr(sweep_run, "run_cell", cell_tasks.sweep_cell_dying_once)
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "2"])
    assert code == 0, stderr
    assert (tmp_path / "killed").exists(), "a worker really died"
    assert "worker process died" in stderr and "retry 1/2" in stderr
    rows = _rows(out)
    assert len(rows) == CELLS and len({row["key"] for row in rows}) == CELLS
    assert max(row["attempts"] for row in rows) == 2
    assert {r["key"]: r["metrics"] for r in rows} == {
        r["key"]: r["metrics"] for r in _rows(reference)
    }


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("control_period_s = 1e-9", "key 'control_period_s': Input should be greater than"),
        ("seeds = [-1]", "key 'seeds[0]': Input should be greater than or equal to 0"),
        ("seeds = [true]", "key 'seeds[0]': Input should be a valid integer"),
        ('loads = ["1"]', "key 'loads[0]': Input should be a valid number"),
        ("loads = [true]", "key 'loads[0]': Input should be a valid number"),
        ("latency_noise = 1.0", "key 'latency_noise': Input should be less than 1"),
        ("floor_mhz = 5000.0", "key 'floor_mhz': 5000 MHz is above the top clock"),
        ("loads = [1.0, 1e-7]", "cell trace bursty.csv, profile h100-sxm-llama3-8b, load 1e-07"),
        ("slo_target = 1.0", "key 'slo_target': must be an attainment in (0, 1) or \"none\""),
        ('slo_target = "0.99"', "key 'slo_target': must be an attainment in (0, 1) or"),
        ("slo_target = true", "key 'slo_target': must be an attainment in (0, 1) or"),
        (
            "control_period_s = 60.0",
            "keys 'slo_target' and 'control_period_s' (max): an SLO target counts the",
        ),
    ],
)
def test_every_cell_is_checked_before_the_first_runs(
    extra: str, expected: str, tmp_path: Path
) -> None:
    text = 'traces = ["bursty.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
    text += f'controllers = ["max"]\nduration_s = 30.0\n{extra}\n'
    grid = _grid(tmp_path, text)
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2, stderr
    assert stderr.count("\n") == 1 and expected in stderr, stderr
    assert not out.exists()  # refused before the output directory was made


def test_an_output_directory_under_a_missing_parent_is_refused(tmp_path: Path) -> None:
    grid = _grid(tmp_path, 'traces = ["bursty.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
                 'controllers = ["max"]\nduration_s = 5.0\n')  # fmt: skip
    out = tmp_path / "missing" / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and "does not exist (create it first)" in stderr, stderr
    assert not out.parent.exists()


_OK_ROW: dict[str, Any] = {
    "key": "a",
    "trace": "t.csv",
    "profile": "p",
    "load": 1.0,
    "controller": "max",
    "seed": 0,
    "status": "ok",
    "metrics": {
        "energy_j": 1.0,
        "energy_per_output_token_j": 0.1,
        "slo_attainment": 1.0,
        "ttft_p95_s": 0.1,
        "tpot_p95_s": 0.01,
        "power_cap_violation_s": 0.0,
        "thermal_violation_s": 0.0,
    },
}
"""A finished cell's row as a sweep writes it, trimmed to what the summary reads."""


def test_a_finished_row_the_summary_can_read_is_a_result(tmp_path: Path) -> None:
    from gpugov.study.sweep_results import read_results

    path = tmp_path / RESULTS
    path.write_text(json.dumps(_OK_ROW) + "\n")
    assert read_results(path) == ([_OK_ROW], 0)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"key": ["a"], "status": "ok", "metrics": {}}, "no string key"),
        ({"key": "a", "status": "ok"}, "without its metrics object"),
        ({"key": "a", "status": "ok", "metrics": {"energy_j": "1"}}, "'energy_j' is not a number"),
        ({"key": "a", "status": "ok", "metrics": {"energy_j": 10**400}}, "'energy_j' is too large"),
        # Each ended --resume in a traceback when the summary was made (KeyError, TypeError).
        ({**_OK_ROW, "metrics": {}}, "without the metric 'energy_j'"),
        ({**_OK_ROW, "seed": None}, "seed is None, not a seed"),
        ({**_OK_ROW, "seed": True}, "seed is True, not a seed"),
        ({**_OK_ROW, "trace": []}, r"trace is \[\], not a name"),
        ({**_OK_ROW, "load": {}}, "load is {}, not a load"),
        ({key: value for key, value in _OK_ROW.items() if key != "seed"}, "seed is None"),
    ],
    ids=[
        "list-key",
        "no-metrics",
        "string-metric",
        "huge-metric",
        "metric-missing",
        "seed-null",
        "seed-bool",
        "trace-list",
        "load-object",
        "seed-missing",
    ],
)
def test_a_results_line_of_the_wrong_shape_is_named_on_resume(
    tmp_path: Path, row: dict[str, Any], problem: str
) -> None:
    # --resume raised TypeError, KeyError or OverflowError on each.
    from gpugov.daemon.cli_support import UsageError
    from gpugov.study.sweep_results import read_results

    path = tmp_path / RESULTS
    good = {"key": "b", "status": "failed", "error": "x"}
    path.write_text(json.dumps(row) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(UsageError, match=rf"{RESULTS}:1: not a sweep result line \(.*{problem}"):
        read_results(path)


def test_a_complete_last_line_that_is_not_a_result_is_refused(tmp_path: Path) -> None:
    """Only a line without its newline is a write cut short: a complete garbage last line
    (binary junk, another program's output) was dropped and the file rewritten."""
    from gpugov.daemon.cli_support import UsageError
    from gpugov.study.sweep_results import read_results

    path = tmp_path / RESULTS
    good = json.dumps({"key": "b", "status": "failed", "error": "x"}) + "\n"
    path.write_text(good + "not json\n")
    with pytest.raises(UsageError, match=rf"{RESULTS}:2: not a sweep result line"):
        read_results(path, repair=True)
    assert path.read_text() == good + "not json\n"
    path.write_text(good + '{"key": "c", "sta')  # cut short: dropped, the file repaired
    assert read_results(path, repair=True) == ([json.loads(good)], 1)
    assert path.read_text() == good


def test_a_profile_file_named_as_the_loader_reads_it_is_keyed_by_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep keys a cell by the files its MPC profile reads. ``mpc:MINE.JSON`` or a
    manifest without a suffix (files the loader reads) were taken for bundled names, so an
    edit to them would not run their cells again on ``--resume``."""
    from gpugov.plant.profile_files import bundled_profile_dir
    from gpugov.study.sweep.grid import _spec_files

    monkeypatch.chdir(tmp_path)
    manifest = json.loads((bundled_profile_dir() / "h100-sxm-llama3-8b.json").read_text())
    (tmp_path / "MINE.CSV").write_bytes((bundled_profile_dir() / manifest["csv"]).read_bytes())
    for name in ("MINE.JSON", "bare"):
        (tmp_path / name).write_text(json.dumps({**manifest, "csv": "MINE.CSV"}))
        assert [kind for _, kind in _spec_files(f"mpc:{name}")] == ["profile", "profile"]
        assert Path(_spec_files(f"mpc:{name}")[1][0]).name == "MINE.CSV"
    assert _spec_files("mpc:h100-sxm-llama3-8b") == []  # a bundled name reads no file of ours


def test_the_summaries_are_replaced_together_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """summary.json, summary.md and sweep.png were replaced one after another: a Ctrl-C
    midway left a new summary.json beside the earlier summary.md. They are one set."""
    from study_support import fail_when_synced

    from gpugov.study import sweep
    from gpugov.study.runners import RunnerSpec

    grid = _grid(tmp_path, 'traces = ["bursty.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
                 'controllers = ["max"]\nduration_s = 5.0\n')  # fmt: skip
    out = tmp_path / "out"
    sweep.run_sweep(grid, out, spec=RunnerSpec(jobs=1), say=lambda line: None)
    names = ("summary.json", "summary.md", "sweep.png")
    earlier = {name: (out / name).read_bytes() for name in names}
    fail_when_synced(monkeypatch, "summary.md", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):  # the runner's description differs: jobs 2
        sweep.run_sweep(grid, out, spec=RunnerSpec(jobs=2), resume=True, say=lambda line: None)
    assert {name: (out / name).read_bytes() for name in names} == earlier
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "grid.toml", "results.jsonl"])
