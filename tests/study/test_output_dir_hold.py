"""One run at a time writes an offline command's ``--out DIR`` (``study/outputs.py``'s
``held_output_dir``): ``bench controllers`` and ``fleet`` took no hold, so two runs into one
``DIR`` each wrote their files over the other's with no word of it; a second run is now
refused in one line naming ``DIR`` and the holder's pid, and a run killed outright leaves
nothing that blocks the next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.daemon.cli_outputs import OutputDirectoryHeld, output_dirs_removed_on_failure
from gpugov.study.outputs import held_output_dir

BENCH = ["bench", "controllers", "--tiny", "--jobs", "1"]
FLEET = ["fleet", "--nodes", "2", "--trace", "azure-conv-10min", "--trace-start", "0"]
FLEET += ["--drain", "2", "--budgets", "0.6", "--allocators", "uniform", "--no-step"]
FLEET += ["--controller", "max", "--jobs", "1"]

HOLDER = """
import fcntl, os, sys, time
handle = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


class Reached(Exception):
    """The command got past its hold to the work."""


def _reached(*args: object, **kwargs: object) -> None:
    raise Reached


def _patch_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command's work raises :class:`Reached` (nothing runs, nothing is written)."""
    from gpugov.study.fleet import run as fleet_run
    from gpugov.study.scoreboard import command, disaggregated

    monkeypatch.setattr(command, "run_scoreboard", _reached)
    monkeypatch.setattr(disaggregated, "run_disaggregated", _reached)
    monkeypatch.setattr(fleet_run, "run_fleet", _reached)


def _hold_in_another_process(directory: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


COMMANDS = {
    "bench": [*BENCH, "--out", "{out}"],
    "bench-disaggregated": [*BENCH, "--layout", "disaggregated", "--out", "{out}"],
    "bench-report": [*BENCH, "--out", "{other}", "--report", "{out}"],
    "fleet": [*FLEET, "--duration", "10", "--quiet", "--out", "{out}"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_second_run_into_a_held_directory_is_refused_naming_the_holder(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run into a DIR another run is writing is refused before its work, in one line
    naming DIR and the other run's pid (exit 2); DIR is left as the other run has it. Once
    that run is gone (SIGKILL: no cleanup ran), the next run into DIR goes ahead."""
    out, other = tmp_path / "out", tmp_path / "other"
    out.mkdir()
    (out / "scoreboard.json").write_text("the other run's")
    flag = "--report" if name == "bench-report" else "--out"
    argv = [part.format(out=out, other=other) for part in COMMANDS[name]]
    _patch_work(monkeypatch)
    holder = _hold_in_another_process(out)
    try:
        assert main(argv) == 2
    finally:
        holder.kill()
        holder.wait()
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        f"gpugov: error: {flag} {out}: another run is writing its outputs there "
        f"(pid {holder.pid}); wait for it to end, or give another {flag}"
    ]
    assert sorted(os.listdir(out)) == ["scoreboard.json"]
    assert (out / "scoreboard.json").read_text() == "the other run's"
    with pytest.raises(Reached):  # the holder was killed outright: nothing blocks DIR
        main(argv)


KILLED = {
    "bench": ([*BENCH, "--out", "{out}"], "bench controllers:"),
    "fleet": ([*FLEET, "--duration", "300", "--out", "{out}"], "fleet:"),
}


@pytest.mark.parametrize("name", list(KILLED))
def test_a_run_killed_outright_leaves_nothing_that_blocks_the_next(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL runs no cleanup: the hold is a flock on DIR itself, which the kernel lets
    go with the process, so the next run into DIR is not refused."""
    out = tmp_path / "out"
    template, marker = KILLED[name]
    argv = [part.format(out=out) for part in template]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpugov", *argv], stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    deadline = time.monotonic() + 120.0
    line = ""
    while time.monotonic() < deadline and not line.startswith(marker):
        line = process.stderr.readline()  # the progress line: DIR is held by now
        assert line, "the run ended before its progress line"
    assert process.poll() is None, "the run ended before it was killed"
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    _patch_work(monkeypatch)
    with pytest.raises(Reached):
        main(argv)


def test_the_hold_ends_with_the_run_not_with_a_forked_worker(tmp_path: Path) -> None:
    """A local pool's worker is forked with the hold's descriptor: it kept DIR held after
    the run that took it had ended, until the worker ended too."""
    import fcntl

    started, ready = os.pipe()
    with held_output_dir(tmp_path):
        child = os.fork()
        if child == 0:  # the worker: outlives the hold for a moment
            os.write(ready, b"1")
            time.sleep(30)
            os._exit(0)
        assert os.read(started, 1) == b"1"  # the child runs: its fork handlers ran
    os.close(started)
    os.close(ready)
    try:
        handle = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused before
        finally:
            os.close(handle)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_directory_this_run_holds_is_held_again_at_no_cost(tmp_path: Path) -> None:
    """``bench controllers --report DIR --out DIR`` and ``--layout both`` hold one DIR
    twice in one run."""
    with held_output_dir(tmp_path, "--out"), held_output_dir(tmp_path, "--report"):
        pass
    with held_output_dir(tmp_path):  # and it is let go after
        pass


def test_a_refused_run_leaves_the_directory_the_other_run_made(tmp_path: Path) -> None:
    """Two runs started at once into a new DIR each saw it missing; the refused one removed
    it (still empty mid-run) from under the other."""
    out, mine = tmp_path / "out", tmp_path / "mine"
    with pytest.raises(OutputDirectoryHeld), output_dirs_removed_on_failure(out, mine):
        out.mkdir()  # the other run's
        mine.mkdir()  # this run's (--out, where --report is the held one)
        raise OutputDirectoryHeld("held", out)
    assert out.is_dir() and not mine.exists()


LEFT = {
    "bench": "scoreboard.json",
    "bench-disaggregated": "disaggregated.md",
    "bench-report": "report.json",
    "fleet": "fleet.png",
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_temporary_files_a_killed_write_left_go_once_the_directory_is_held(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed outright mid-write leaves the temporary file beside its output
    (``.scoreboard.json.`` and 8 hex digits): never taken for the output, but nothing
    removed it, and one more piled up with each such run. The next run into DIR removes
    them once it holds DIR, and nothing else."""
    out, other = tmp_path / "out", tmp_path / "other"
    out.mkdir()
    left = out / f".{LEFT[name]}.0123abcd"
    left.write_text('{"cut sh')
    kept = [out / f".{LEFT[name]}.keep", out / "notes.txt", out / ".other.json.0123abcd"]
    for path in kept:
        path.write_text("the user's")
    argv = [part.format(out=out, other=other) for part in COMMANDS[name]]
    _patch_work(monkeypatch)
    with pytest.raises(Reached):
        main(argv)
    assert not left.exists()
    assert all(path.read_text() == "the user's" for path in kept)


SWEEP_GRID = (
    'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
    'controllers = ["max"]\nduration_s = 5.0\n'
)
IN_THE_WAY = {
    # (command line, an output name in DIR; the run's own work must not be reached)
    "bench": ([*BENCH, "--out", "{out}"], "scoreboard.png"),
    "bench-disaggregated": (
        [*BENCH, "--layout", "disaggregated", "--out", "{out}"],
        "disaggregated.md",
    ),
    "bench-report": ([*BENCH, "--out", "{other}", "--report", "{out}"], "pareto.csv"),
    "fleet": ([*FLEET, "--duration", "10", "--quiet", "--out", "{out}"], "fleet.md"),
    "sweep": (["sweep", "--grid", "{grid}", "--out", "{out}", "--jobs", "1"], "summary.md"),
    "sweep-results": (["sweep", "--grid", "{grid}", "--out", "{out}"], "results.jsonl"),
    "experiments": (["experiments", "--quick", "--out", "{out}"], "figures/coverage.png"),
}


@pytest.mark.parametrize("name", list(IN_THE_WAY))
def test_a_directory_where_an_output_goes_is_refused_before_any_work(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory at an output's path was found only when the run, its work done, wrote
    its files: the write failed (exit 1), and a set written together was half replaced
    (a sweep's summary.json beside no summary.md, a fleet's fleet.json beside no fleet.md)."""
    from gpugov.study import experiments_cli
    from gpugov.study.sweep import run as sweep_run

    argv, output = IN_THE_WAY[name]
    out, other, grid = tmp_path / "out", tmp_path / "other", tmp_path / "grid.toml"
    grid.write_text(SWEEP_GRID)
    (out / output).mkdir(parents=True)
    _patch_work(monkeypatch)
    monkeypatch.setattr(sweep_run, "plan_sweep", _reached)
    monkeypatch.setattr(experiments_cli, "build_textbook_results", _reached)
    flag = "--report" if name == "bench-report" else "--out"
    assert main([part.format(out=out, other=other, grid=grid) for part in argv]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        f"gpugov: error: {flag} {out}: {out / output} is a directory, which the run's output "
        f"file cannot replace; move it away or choose another {flag}"
    ]
    assert (out / output).is_dir()


def test_experiments_refuses_a_file_where_its_figures_folder_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugov.study import experiments_cli

    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").write_text("the user's")
    monkeypatch.setattr(experiments_cli, "build_textbook_results", _reached)
    assert main(["experiments", "--quick", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpugov: error: --out {out}: {out / 'figures'} is not a directory, where the "
        "figures go; move it away or choose another --out"
    ]
    assert (out / "figures").read_text() == "the user's"
