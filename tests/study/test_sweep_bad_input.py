"""``gpugov sweep`` refuses bad settings and ``--ray`` addresses in one line (exit 2) before
any work: no progress line, no ``--out`` directory, and no Ray started for a malformed
address."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from study_support import run_main
from synthetic import plan_payload

from gpugov.daemon.cli_support import UsageError
from gpugov.daemon.progress import Progress
from gpugov.plant.workload import scale_load
from gpugov.study import sweep
from gpugov.study.runners import RunnerError, RunnerSpec
from gpugov.study.sweep import plan as sweep_plan
from gpugov.study.sweep import run as sweep_run

GRID = 'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\ncontrollers = ["max"]\n'


def _refused(tmp_path: Path, settings: str, *flags: str) -> str:
    """Run a one-cell sweep; assert exit 2, one ``gpugov: error:`` line and no ``--out``."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID + settings)
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), *flags])
    assert code == 2, stderr
    assert stderr.startswith("gpugov: error: ") and stderr.count("\n") == 1, stderr
    assert not out.exists()
    return stderr


@pytest.mark.parametrize(
    "setting",
    [
        'start_s = "0"',
        'duration_s = "5"',
        'floor_mhz = "1000"',
        'control_period_s = "1"',
        'latency_noise = "0.1"',
        'dwell_s = "0.5"',
        "start_s = true",
        'loads = ["1"]',
    ],
)
def test_a_setting_written_as_a_string_is_refused(tmp_path: Path, setting: str) -> None:
    # Lax validation turned each string into a number and ran the sweep.
    key = setting.split(" =")[0] + ("[0]" if setting.startswith("loads") else "")
    window = "" if key == "duration_s" else "duration_s = 5\n"
    stderr = _refused(tmp_path, f"{window}{setting}\n")
    assert f"grid.toml: key '{key}': Input should be a valid number" in stderr


def test_an_open_loop_plan_period_below_the_minimum_is_refused_up_front(tmp_path: Path) -> None:
    """The grid's check builds each controller once, so a plan's 5e-324 s period is refused."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_payload(control_period_s=5e-324)))
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.replace('"max"', f'"max", "open-loop:{plan}"') + "duration_s = 5\n")
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"{plan}: key 'control_period_s' must be at least 0.05 s" in stderr
    assert not out.exists()


def test_integers_are_numbers(tmp_path: Path) -> None:
    grid = sweep.read_grid(_write(tmp_path, "duration_s = 5\nfloor_mhz = 1000\nloads = [1, 2]\n"))
    assert grid.duration_s == 5.0 and isinstance(grid.duration_s, float)
    assert grid.settings()["floor_mhz"] == 1000.0 and grid.loads == [1.0, 2.0]


def _write(folder: Path, settings: str) -> Path:
    path = folder / "grid.toml"
    path.write_text(GRID + settings)
    return path


@pytest.mark.parametrize(
    "address",
    ["nope", "head:port", "head:0", "head:70000", ":6379", "::1:6379", "http://head:1", "ray://"],
)
def test_a_malformed_ray_address_is_refused_without_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    # It printed a progress line, made --out with grid.toml and an empty results.jsonl,
    # then said Ray's "Invalid address format".
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray is neither imported nor started
    stderr = _refused(tmp_path, "duration_s = 5\n", "--ray", address)
    assert stderr.startswith(f"gpugov: error: --ray {address}: not a Ray address; use "), stderr


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: a connection to it is refused at once."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_ray_address_where_nothing_listens_is_refused_in_seconds(
    tmp_path: Path, closed_port: int, scheme: str
) -> None:
    # ray.init retried it for many minutes, after --out was made.
    pytest.importorskip("ray")
    address = f"{scheme}127.0.0.1:{closed_port}"
    stderr = _refused(tmp_path, "duration_s = 5\n", "--ray", address)
    assert stderr.startswith(f"gpugov: error: --ray {address}: cannot join Ray: "), stderr


def test_ray_auto_checks_the_ray_address_it_joins_in_seconds(
    tmp_path: Path, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --ray auto joins RAY_ADDRESS; one where nothing listens was retried by ray.init for
    # minutes, with Ray's warnings and no line of gpugov's.
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed_port}")
    stderr = _refused(tmp_path, "duration_s = 5\n", "--ray", "auto")
    assert stderr.startswith(
        f"gpugov: error: --ray auto: RAY_ADDRESS=127.0.0.1:{closed_port}: cannot join Ray: "
    ), stderr


def test_ray_auto_without_a_cluster_names_what_to_do_in_gpugovs_terms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray's own line asked for an --address flag that no gpugov command takes.
    fake = types.ModuleType("ray")

    def init(**options: object) -> None:
        assert options["address"] == "auto"
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect to "
            "by setting `--address` flag or `RAY_ADDRESS` environment variable."
        )

    fake.is_initialized = lambda: False  # type: ignore[attr-defined]
    fake.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    stderr = _refused(tmp_path, "duration_s = 5\n", "--ray", "auto")
    assert stderr == (
        "gpugov: error: --ray auto: cannot start or join Ray: no running Ray cluster found "
        "(start one with 'ray start --head', set RAY_ADDRESS, or use --ray local)\n"
    )


def test_the_output_directory_is_made_only_once_ray_has_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []

    @contextlib.contextmanager
    def unreachable(spec: RunnerSpec) -> Iterator[None]:
        seen.append((tmp_path / "out").exists())
        raise RunnerError(f"--ray {spec.ray_address}: cannot start or join Ray: timed out")
        yield

    pytest.importorskip("ray")
    monkeypatch.setattr(sweep_run, "runner_ready", unreachable)
    stderr = _refused(tmp_path, "duration_s = 5\n", "--ray", "head.example:6379")
    assert seen == [False] and "cannot start or join Ray: timed out" in stderr


def test_a_bad_out_parent_is_refused_before_ray_joins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    monkeypatch.setattr(sweep_run, "runner_ready", None)  # reaching it would raise TypeError
    grid = _write(tmp_path, "duration_s = 5\n")
    out = tmp_path / "missing" / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--ray", "auto"])
    assert code == 2 and stderr.count("\n") == 1 and "does not exist" in stderr, stderr
    assert not out.parent.exists()


def _trace(path: Path) -> Path:
    path.write_text("arrival_time_s,prompt_tokens,output_tokens\n0.0,100,5\n1.0,200,5\n")
    return path


@pytest.mark.parametrize(
    ("key", "entries"),
    [
        ("traces", '["t.csv", "./t.csv"]'),
        ("traces", '["t.csv", "link.csv"]'),
        ("profiles", '["p/h100-sxm-llama3-8b.json", "p/../p/h100-sxm-llama3-8b.json"]'),
        (
            "controllers",
            '["max", "mpc:p/h100-sxm-llama3-8b.json", "mpc:./p/h100-sxm-llama3-8b.json"]',
        ),
    ],
)
def test_two_spellings_of_one_file_are_refused_as_a_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, entries: str
) -> None:
    """``ok.csv`` and ``./ok.csv`` passed the duplicate check: the same cell (one key) ran
    twice, and results.jsonl and the summary held it twice."""
    from gpugov.plant.profile_files import profile_files

    _trace(tmp_path / "t.csv")
    (tmp_path / "link.csv").symlink_to(tmp_path / "t.csv")
    (tmp_path / "p").mkdir()
    for path in profile_files("h100-sxm-llama3-8b"):
        (tmp_path / "p" / path.name).write_bytes(path.read_bytes())
    monkeypatch.chdir(tmp_path)
    grid = {
        "traces": '["t.csv"]',
        "profiles": '["h100-sxm-llama3-8b"]',
        "controllers": '["max"]',
        key: entries,
    }
    text = "".join(f"{name} = {value}\n" for name, value in grid.items())
    (tmp_path / "grid.toml").write_text(text + "duration_s = 5\n")
    code, _, stderr = run_main(["sweep", "--grid", "grid.toml", "--out", "out"])
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"grid.toml: key '{key}': " in stderr and "name the same " in stderr
    assert not (tmp_path / "out").exists()


def test_a_second_sweep_into_a_directory_being_written_is_refused(tmp_path: Path) -> None:
    """Two sweeps into one DIR (--resume in two terminals, a job retried while the first
    still ran) each ran every cell not yet done: each such cell ran twice and was written
    twice to results.jsonl."""
    import fcntl
    import os

    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text("")
    held = os.open(out, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # the other sweep, mid-way
    try:
        stderr = _refused_in(tmp_path, out, "--resume")
    finally:
        os.close(held)
    assert f"--out {out}: another run is writing its outputs there" in stderr
    assert (out / "results.jsonl").read_text() == "" and sorted(os.listdir(out)) == [
        "results.jsonl"
    ]


def _refused_in(tmp_path: Path, out: Path, *flags: str) -> str:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID + "duration_s = 5\n")
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), *flags])
    assert code == 2 and stderr.startswith("gpugov: error: "), stderr
    assert stderr.count("\n") == 1, stderr
    return stderr


@pytest.mark.parametrize("output", ["summary.md", "summary.json", "sweep.png", "grid.toml"])
def test_an_out_whose_outputs_would_overwrite_a_trace_is_refused(
    tmp_path: Path, output: str
) -> None:
    # The sweep replaced the trace with its summary, plot or grid copy.
    out = tmp_path / "out"
    out.mkdir()
    trace = _trace(out / output)
    before = trace.read_text()
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.replace("azure-conv-10min", f"out/{output}") + "duration_s = 5\n")
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"--out {out / output}: is the trace 'out/{output}' of the grid" in stderr
    assert trace.read_text() == before and sorted(p.name for p in out.iterdir()) == [output]


def test_an_out_whose_outputs_would_overwrite_a_controllers_profile_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpugov.plant.profile_files import profile_files

    out = tmp_path / "out"
    out.mkdir()
    manifest, csv = profile_files("h100-sxm-llama3-8b")
    (out / "summary.json").write_bytes(manifest.read_bytes())
    (out / csv.name).write_bytes(csv.read_bytes())
    monkeypatch.chdir(tmp_path)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.replace('"max"', '"max", "mpc:out/summary.json"') + "duration_s = 5\n")
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "is a file of the controller 'mpc:out/summary.json'" in stderr


def test_a_grid_inside_out_is_kept_as_written(tmp_path: Path) -> None:
    # DIR/grid.toml was the user's grid: the sweep replaced it with its copy (comments
    # gone), or refused nothing when that copy changed its relative paths.
    out = tmp_path / "out"
    out.mkdir()
    grid = out / "grid.toml"
    text = "# mine\n" + GRID + "duration_s = 5\n"
    grid.write_text(text)
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 0, stderr
    assert grid.read_text() == text  # names only: it already is its copy, left as written
    _trace(out / "t.csv")
    text = GRID.replace("azure-conv-10min", "t.csv") + "duration_s = 5\n"
    grid.write_text(text)
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--resume"])
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"{grid} is the --grid file, which the sweep's grid copy" in stderr
    assert grid.read_text() == text


@pytest.mark.parametrize("key", ["traces", "profiles"])
def test_a_name_too_long_for_a_file_is_one_short_line_naming_the_key(
    tmp_path: Path, key: str
) -> None:
    """A 30,000-character entry raised "File name too long" past the loaders: the whole
    name on one 30 KB line (profiles), or a line naming neither the grid nor the key
    (traces)."""
    entries = {"traces": "azure-conv-10min", "profiles": "h100-sxm-llama3-8b"}
    entries[key] = "y" * 30_000
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f'traces = ["{entries["traces"]}"]\nprofiles = ["{entries["profiles"]}"]\n'
        'controllers = ["max"]\n'
    )
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and stderr.count("\n") == 1 and len(stderr) < 600, stderr[:300]
    assert stderr.startswith(f"gpugov: error: {grid}: key '{key}': unknown ")
    assert not out.exists()


@pytest.mark.parametrize("kind", ["a file", "results already"])
def test_an_unusable_out_is_refused_before_the_grid_is_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Planning reads every trace and builds every controller on every profile (a minute on
    a grid of 2,880 cells): an --out that is a file, or holds results without --resume,
    was refused only after it."""

    def unplanned(path: Path) -> None:
        raise AssertionError("the grid was planned")

    monkeypatch.setattr(sweep_run, "plan_sweep", unplanned)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    if kind == "a file":
        out.write_text("not a directory\n")
        said = "exists and is not a directory"
    else:
        out.mkdir()
        (out / "results.jsonl").write_text('{"key": "a"}\n')
        said = "already holds results; add --resume"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and stderr.count("\n") == 1 and said in stderr, stderr


def test_the_cells_are_checked_without_scaling_a_window_per_load_and_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each load's window was scaled once per profile to check its KV and its span (a
    minute on 3 traces x 6 profiles x 40 loads, before any cell): the KV check needs the
    window once, the span its last arrival over the load."""
    scaled: list[float] = []
    real = scale_load

    def counted(workload: object, load: float) -> object:
        scaled.append(load)
        return real(workload, load)  # type: ignore[arg-type]

    # Planning (sweep/plan.py) imports no scale_load: one that did would call this one.
    monkeypatch.setattr(sweep_plan, "scale_load", counted, raising=False)
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b", '
        '"a100-sxm-80gb-llama3-8b"]\ncontrollers = ["max"]\nloads = [0.5, 2.0, 4.0]\n'
    )
    plan = sweep.plan_sweep(grid)
    assert len(plan.cells) == 6 and scaled == []
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        'controllers = ["max"]\nloads = [1.0, 1e-4]\n'
    )
    with pytest.raises(UsageError, match=r"load 0\.0001: the window spans 5,99"):
        sweep.plan_sweep(grid)


def test_a_sweep_says_it_runs_before_its_first_cell_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first progress line came when the first cell ended: a sweep whose cells replay a
    whole trace under mpc said nothing for minutes. A 0 % line comes at once."""
    seen: list[str] = []
    stream = io.StringIO()
    real = sweep.run_cell

    def watched(cell: object, shared: object) -> object:
        seen.append(stream.getvalue())
        return real(cell, shared)  # type: ignore[arg-type]

    monkeypatch.setattr(sweep_run, "run_cell", watched)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID + "duration_s = 5.0\n")
    sweep.run_sweep(
        grid, tmp_path / "out", spec=RunnerSpec(jobs=1), say=lambda line: None,
        progress_stream=stream,
    )  # fmt: skip
    first = "sweep:   0.0% (0/5 simulated s), elapsed 0s, ETA ?, 0/1 cells, running 1 cell(s)\n"
    assert seen == [first]


def test_a_cell_draining_after_its_last_arrival_is_not_shown_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell's share of the bar was its last arrival: a burst at 0 s with long outputs
    read 100 %, ETA 0s, for as long as its backlog took to drain. Its expected length now
    grows while it drains and ends as the run's own."""
    calls: list[tuple[float, float, str]] = []

    class Recorded(Progress):
        def update(self, done: float, detail: str = "", *, force: bool = False) -> None:
            calls.append((done, self.total, detail))
            super().update(done, detail, force=force)

    monkeypatch.setattr(sweep_run, "Progress", Recorded)
    trace = tmp_path / "burst.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "0,500,6000\n" * 4)
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["burst.csv"]\nprofiles = ["h100-sxm-llama3-8b"]\ncontrollers = ["max"]\n'
    )
    sweep.run_sweep(
        grid, tmp_path / "out", spec=RunnerSpec(jobs=1), say=lambda line: None,
        progress_stream=io.StringIO(),
    )  # fmt: skip
    row = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])
    end_s = row["metrics"]["simulated_duration_s"]
    assert end_s > 30.0
    running = [(done, total) for done, total, detail in calls if detail.startswith("0/1 cells")]
    assert len(running) > 3
    assert all(done < total for done, total in running), running
    assert max(total for _, total in running) > 10.0  # not the last arrival's 1 s
    assert calls[-1][:2] == (pytest.approx(end_s), pytest.approx(end_s))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('controllers = ["fixed:100"]', "key 'controllers' (h100-sxm-llama3-8b): fixed:100: "),
        ('controllers = ["open-loop:missing.json"]', "cannot read plan file"),
        ('controllers = ["max"]\nfloor_mhz = 5000', "key 'floor_mhz': 5000 MHz is above"),
    ],
    ids=["fixed-clock", "plan", "floor"],
)
def test_what_needs_no_trace_is_refused_before_any_trace_is_read(
    extra: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grid's controllers and floor were checked after every trace was read: 42 s of a
    63 MB trace before the line."""

    def no_trace(*_: object, **__: object) -> None:
        raise AssertionError("a trace was read before the grid's cheap checks")

    monkeypatch.setattr(sweep_plan, "load_trace_for_cli", no_trace)
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
        f"duration_s = 30.0\n{extra}\n"
    )
    with pytest.raises(UsageError) as refused:
        sweep.plan_sweep(grid)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_window_too_long_in_a_grid_names_the_grid_keys_to_change(tmp_path: Path) -> None:
    """The refusal of a cell past the simulated-days limit told a sweep's user to choose
    "a shorter --duration or a larger --load-scale", flags ``sweep`` does not take; it
    names the grid's keys now."""
    stderr = _refused(tmp_path, "loads = [1e-6]\n")
    assert "load 1e-06: the window spans " in stderr
    assert stderr.rstrip().endswith("choose a shorter duration_s or larger loads"), stderr
    assert "--duration" not in stderr and "--load-scale" not in stderr


def test_an_outside_factory_that_fails_is_named_in_the_grids_words(tmp_path: Path) -> None:
    """An outside controller is built in a child process (run_isolated); its refusal came
    back as 'UsageError: --controller os:getcwd: ...', a Python class and a flag sweep does
    not take, where an in-process refusal reads 'os:getcwd: ...'."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.replace('"max"', '"os:getcwd"') + "duration_s = 5\n")
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "key 'controllers' (h100-sxm-llama3-8b): os:getcwd: controller factory" in stderr
    assert "UsageError" not in stderr and "--controller" not in stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "controllers",
    [
        '["fixed:1000", "fixed:1e3"]',
        '["max", "maximum"]',
        '["power-cap:300", "power-cap:300.0"]',
        '["mpc-online:tp=2", "mpc-online:tensor_parallel=2"]',
    ],
)
def test_two_spellings_of_one_controller_are_refused_as_a_duplicate(
    tmp_path: Path, controllers: str
) -> None:
    """``fixed:1000`` and ``fixed:1e3`` (or ``max`` and its old name ``maximum``) passed the
    duplicate check, which compared the text: the same controller ran twice and the
    summary showed it twice under two labels."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.replace('controllers = ["max"]\n', f"controllers = {controllers}\n"))
    grid.write_text(grid.read_text() + "duration_s = 5\n")
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out)])
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "grid.toml: key 'controllers': " in stderr and "name the same controller" in stderr
    assert not out.exists()


def test_a_bare_mpc_and_one_naming_the_default_profile_are_two_controllers() -> None:
    """``mpc`` plans on each cell's profile, ``mpc:h100-sxm-llama3-8b`` on that one alone."""
    assert sweep_plan._controller_identity("mpc") != sweep_plan._controller_identity(
        "mpc:h100-sxm-llama3-8b"
    )


@pytest.mark.parametrize("named", ["127.0.0.1:99999", "127.0.0.1:0", "ray://head:70000"])
def test_ray_auto_refuses_a_ray_address_whose_port_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    """RAY_ADDRESS=127.0.0.1:99999 was left to Ray as 'a form Ray may read otherwise', and
    ray.init hung there for good (ten minutes, deaf to SIGTERM) after --out was made. A
    HOST:PORT whose port is no port is refused as --ray HOST:PORT would be, without Ray."""
    ray = pytest.importorskip("ray")

    def joined(*args: object, **kwargs: object) -> None:
        raise AssertionError("ray.init was reached")  # where it hung

    monkeypatch.setattr(ray, "init", joined)
    monkeypatch.setenv("RAY_ADDRESS", named)
    stderr = _refused(tmp_path, "duration_s = 5\n", "--ray", "auto")
    assert stderr.startswith(
        f"gpugov: error: --ray auto: RAY_ADDRESS={named}: not a Ray address; use "
    ), stderr
