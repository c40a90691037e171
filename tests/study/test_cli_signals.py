"""Ctrl-C and closed pipes end commands with one line (or none), never a traceback.

These run the real ``python -m gpugov`` process: SIGINT arrives once the command has said
it is working (its first progress line), and it must exit 130 promptly.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from study_support import QUICK_EXPERIMENTS_ARGS

from gpugov.cli import main


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpugov", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test runner started in the background may ignore SIGINT; the user's shell
        # does not, so restore the default before gpugov starts.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(process: subprocess.Popen[str], marker: str) -> list[str]:
    """The stderr lines up to the first that starts with ``marker``. A process silent for
    120 s is killed, so the blocked read returns and the test fails naming what it saw
    (a deadline checked between reads never came while a read waited)."""
    assert process.stderr is not None
    seen = []
    bound = threading.Timer(120.0, process.kill)
    bound.daemon = True
    bound.start()
    try:
        while line := process.stderr.readline():
            seen.append(line)
            if line.startswith(marker):
                break
    finally:
        bound.cancel()
    assert seen and seen[-1].startswith(marker), seen
    return seen


def _interrupt_after(
    process: subprocess.Popen[str], marker: str, sig: signal.Signals = signal.SIGINT
) -> tuple[int, str, float]:
    """Wait for ``marker`` on stderr, send ``sig``, return (exit code, stderr, seconds)."""
    seen = _wait_for(process, marker)
    sent = time.monotonic()
    process.send_signal(sig)
    _, rest = process.communicate(timeout=60)
    return process.returncode, "".join(seen) + rest, time.monotonic() - sent


@pytest.mark.parametrize(
    ("argv", "marker"),
    [
        (["simulate", "--controller", "mpc-slsqp"], "simulate:"),
        (["experiments", "--quick", "--duration", "120", "--animation", "30"], "experiments:"),
        (["bench", "controllers", "--quick", "--jobs", "2"], "bench controllers:"),
    ],
)
def test_sigint_exits_130_with_one_line(argv: list[str], marker: str, tmp_path: Path) -> None:
    if argv[0] in ("experiments", "bench"):
        argv = [*argv, "--out", str(tmp_path / "out")]
    code, stderr, seconds = _interrupt_after(_start(argv), marker)
    assert code == 130, stderr
    assert "Traceback" not in stderr
    lines = stderr.rstrip().splitlines()
    assert lines[-1].startswith("gpugov: interrupted"), lines  # simulate: "... at S of T"
    assert all(line.startswith(marker) for line in lines[:-1]), lines  # progress only
    assert seconds < 30.0  # bench's workers are ended, not waited for


SLOW_GRID = """
traces = ["azure-conv-10min"]
profiles = ["h100-sxm-llama3-8b"]
controllers = ["max", "mpc-slsqp"]
"""
FLEET = ["fleet", "--nodes", "2", "--trace", "azure-conv-10min", "--trace-start", "0"]
FLEET += ["--duration", "300", "--no-step", "--jobs", "1"]


@pytest.mark.parametrize(
    ("argv", "marker", "sig"),
    [
        (["simulate", "--controller", "mpc-slsqp"], "simulate:", signal.SIGTERM),
        ([*QUICK_EXPERIMENTS_ARGS], "experiments:", signal.SIGTERM),
        (["bench", "controllers", "--quick", "--jobs", "1"], "bench controllers:", signal.SIGTERM),
        (["sweep", "--jobs", "1"], "sweep:", signal.SIGTERM),
        (["sweep", "--jobs", "1"], "sweep:", signal.SIGINT),
        (FLEET, "fleet:", signal.SIGTERM),
        (FLEET, "fleet:", signal.SIGINT),
    ],
    ids=["simulate", "experiments", "bench", "sweep", "sweep-ctrl-c", "fleet", "fleet-ctrl-c"],
)
def test_a_study_command_in_one_process_ends_on_sigterm_with_143_and_one_line(
    argv: list[str], marker: str, sig: signal.Signals, tmp_path: Path
) -> None:
    """SIGTERM kept its default action where no worker processes ran: the command died
    with no line and none of its cleanup. It now ends as Ctrl-C does (130), with 143 and
    ``gpugov: terminated``."""
    if argv[0] == "sweep":
        (tmp_path / "grid.toml").write_text(SLOW_GRID)
        argv = [*argv, "--grid", str(tmp_path / "grid.toml")]
    if argv[0] != "simulate":
        argv = [*argv, "--out", str(tmp_path / "out")]
    code, stderr, _ = _interrupt_after(_start(argv), marker, sig)
    word = "terminated" if sig == signal.SIGTERM else "interrupted"
    assert code == (143 if sig == signal.SIGTERM else 130), stderr
    assert "Traceback" not in stderr
    lines = stderr.rstrip().splitlines()
    if argv[0] == "simulate":
        assert lines[-1].startswith(f"gpugov: {word} at "), lines
    else:
        assert lines[-1] == f"gpugov: {word}", lines
    assert all(line.startswith(marker) for line in lines[:-1]), lines


INTERRUPTED_IN_GENERATED_SOURCE = """
import argparse
import sys

import gpugov.cli as cli


def interrupted(args):
    # A Ctrl-C arriving while dataclasses runs the source it builds for a class.
    exec("raise KeyboardInterrupt", {})


def parser(command):
    built = argparse.ArgumentParser(prog="gpugov")
    built.add_argument("command")
    built.set_defaults(handler=interrupted)
    return built


cli.build_parser = parser
sys.argv = ["gpugov", "profiles"]
sys.exit(cli.main())
"""


def test_an_interrupt_inside_generated_source_still_exits_130(tmp_path: Path) -> None:
    """A Ctrl-C raised in source run from a string (dataclasses build their methods so)
    set CPython's own unhandled-interrupt note: ``python -m`` then killed itself with
    SIGINT (-2) after ``gpugov: interrupted``, in place of exit 130."""
    (tmp_path / "interrupted_command.py").write_text(INTERRUPTED_IN_GENERATED_SOURCE)
    done = subprocess.run(
        [sys.executable, "-m", "interrupted_command"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "gpugov: interrupted\n"


def test_closed_stdout_exits_quietly() -> None:
    process = _start(["profiles", "--json"])
    assert process.stdout is not None
    process.stdout.close()  # `| head` that has already exited
    assert process.stderr is not None
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 1
    assert stderr == ""


def test_a_command_started_with_stdout_closed_runs_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started with descriptor 1 closed (``gpugov emulate ... >&-``, Python's stdout None),
    a command ended in AttributeError on its final flush, a traceback after its work."""
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["profiles"]) == 0


FULL = Path("/dev/full")


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize(
    "argv", [["profiles"], ["traces", "--json"], ["--help"], ["simulate", "--help"]]
)
def test_a_stdout_that_cannot_be_written_is_one_line_and_exit_1(argv: list[str]) -> None:
    """`gpugov profiles > /dev/full` ended in a traceback, `gpugov --help > /dev/full`
    exited 0 with nothing said; both are now one line and exit 1, and Python's own flush
    at exit adds nothing."""
    with FULL.open("w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gpugov", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "gpugov: cannot write to standard output: No space left on device"
    ]


class _FullStream(io.StringIO):
    """A stdout whose writes (``on="write"``) or flushes fail as a full disk's do."""

    def __init__(self, on: str) -> None:
        super().__init__()
        self.on = on

    def write(self, text: str) -> int:
        if self.on == "write":
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("on", ["write", "flush"])
@pytest.mark.parametrize("argv", [["profiles", "--json"], ["--help"]])
def test_main_reports_a_failed_stdout_once_however_the_command_met_it(
    argv: list[str], on: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse swallows a failed write of its help; the command's output raises it.
    stream = _FullStream(on)
    monkeypatch.setattr(sys, "stdout", stream)
    assert main(argv) == 1
    assert sys.stdout is stream
    assert capsys.readouterr().err.splitlines() == [
        "gpugov: cannot write to standard output: No space left on device"
    ]


def test_sigint_on_a_simulated_run_says_where_it_stopped() -> None:
    process = _start(["run", "--simulate", "--speed", "30", "--metrics-address", "none"])
    code, stderr, _ = _interrupt_after(process, "run --simulate:")
    assert code == 130, stderr
    assert "Traceback" not in stderr
    lines = stderr.rstrip().splitlines()
    assert lines[-1].startswith("gpugov: interrupted at "), lines
    stopped_at = float(lines[-1].split()[3].replace(",", ""))
    total = float(lines[-1].split()[5].replace(",", ""))
    assert stopped_at < total
    assert "100.0%" not in lines[-2]  # the last progress line shows where it stopped
    assert all(line.startswith("run --simulate:") for line in lines[:-1]), lines


def test_sigint_on_a_simulated_run_draining_after_its_last_arrival(tmp_path: Path) -> None:
    """Every request arrives at 0 s and decodes for a minute: the stop line read
    "interrupted at 15.0 of 0.0 simulated s", the total being the last arrival alone; it
    is the drain's expected end now, as the progress line counts it."""
    trace = tmp_path / "burst.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "0,500,6000\n" * 4)
    argv = ["run", "--simulate", "--speed", "10", "--metrics-address", "none"]
    process = _start([*argv, "--trace", str(trace), "--controller", "max"])
    _wait_for(process, "run --simulate:")
    time.sleep(2.0)  # about 20 simulated seconds into the drain
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    last = stderr.rstrip().splitlines()[-1]
    assert last.startswith("gpugov: interrupted at "), last
    stopped_at = float(last.split()[3].replace(",", ""))
    total = float(last.split()[5].replace(",", ""))
    assert 0.0 < stopped_at < total, last


def _children(pid: int) -> list[int]:
    """The processes ``pid`` forked (Linux's ``/proc/PID/task/*/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (reaped, or a zombie waiting for whoever adopted it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X")


def _workers_of(process: subprocess.Popen[str], count: int) -> list[int]:
    """The pool's worker processes once ``count`` of them run (within 60 s)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        workers = _children(process.pid)
        if len(workers) >= count:
            return workers
        time.sleep(0.05)
    raise AssertionError(f"the pool did not start {count} workers: {_children(process.pid)}")


def _all_gone(pids: list[int], within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


BENCH = ["bench", "controllers", "--quick", "--jobs", "2"]
CHILDREN = pytest.mark.skipif(
    not Path(f"/proc/self/task/{os.getpid()}/children").exists(),
    reason="needs Linux's /proc/PID/task/TID/children (and PR_SET_PDEATHSIG)",
)


@CHILDREN
def test_sigterm_ends_the_pool_workers_then_the_command(tmp_path: Path) -> None:
    """SIGTERM (a job scheduler's, ``timeout``'s, a pod's stop) ends a study command with
    one line and 143, after its worker processes: none is left running its cell."""
    process = _start([*BENCH, "--out", str(tmp_path / "out")])
    _wait_for(process, "bench controllers:")
    workers = _workers_of(process, 2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert stderr.rstrip().splitlines()[-1].startswith("gpugov: terminated"), stderr
    assert _all_gone(workers), [pid for pid in workers if not _gone(pid)]


@CHILDREN
def test_pool_workers_end_when_the_command_is_killed(tmp_path: Path) -> None:
    """A command killed outright (SIGKILL, the OOM killer) runs no cleanup; its workers
    still end, by the kernel's parent-death signal."""
    process = _start([*BENCH, "--out", str(tmp_path / "out")])
    _wait_for(process, "bench controllers:")
    workers = _workers_of(process, 2)
    process.kill()
    process.communicate(timeout=60)
    assert _all_gone(workers), [pid for pid in workers if not _gone(pid)]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    found: list[int] = []
    stack = [pid]
    while stack:
        children = _children(stack.pop())
        found += children
        stack += children
    return found


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@CHILDREN
def test_sigterm_on_a_local_ray_runtime_shuts_it_down(tmp_path: Path) -> None:
    """``--ray local``: SIGTERM once cells run on the runtime ends the command with the
    same line and 143, after shutting the runtime down (Ray's own handler would dump a
    stack trace); none of its processes is left."""
    pytest.importorskip("ray")
    process = _start([*BENCH, "--ray", "local", "--out", str(tmp_path / "out")])
    _wait_for(process, "bench controllers:")
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        below = _descendants(process.pid)
        if any("_ray_task" in _command_line(pid) for pid in below):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("no cell started on the Ray runtime")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=90)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr, stderr
    assert stderr.rstrip().splitlines()[-1].startswith("gpugov: terminated"), stderr
    assert _all_gone(below, within_s=60.0), [_command_line(pid) for pid in below if not _gone(pid)]


def test_ctrl_c_while_a_command_module_imports_is_the_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first second of `gpugov run` imports numpy and numba: Ctrl-C there printed a
    # KeyboardInterrupt traceback.
    from gpugov import cli

    def interrupted(command: str | None) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["run", "--simulate"]) == cli.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err.strip() == "gpugov: interrupted" and "Traceback" not in err


@pytest.mark.parametrize("then", ["raises", "returns"])
def test_an_interrupt_raised_inside_a_finalizer_prints_nothing_but_the_one_line(
    then: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while `experiments` wrote its figures printed `Exception ignored in:
    <function WeakSet._remove>` and a KeyboardInterrupt traceback before `gpugov:
    interrupted`: the handler's KeyboardInterrupt was raised inside a weakref callback,
    where Python prints it and goes on. It is dropped there, and raised again by the next
    progress update or (``returns``: the command ran on to its end) at the command's end."""
    import argparse
    import weakref

    from gpugov import cli

    reported: list[type[BaseException]] = []

    def recorded(unraisable: Any) -> None:
        reported.append(type(unraisable.exc_value))

    monkeypatch.setattr(sys, "unraisablehook", recorded)

    class Thing:
        pass

    def ctrl_c(ref: object) -> None:
        signal.raise_signal(signal.SIGINT)  # the command line's handler raises in here

    def bug(ref: object) -> None:
        raise ValueError("a real bug")

    def handler(args: argparse.Namespace) -> int:
        for callback in (ctrl_c, bug):
            thing = Thing()
            ref = weakref.ref(thing, callback)
            del thing  # the callback runs here; what it raises goes to sys.unraisablehook
            assert ref() is None
        if then == "raises":
            raise KeyboardInterrupt  # as the next progress update does
        return 0

    class Parser:
        def parse_args(self, argv: list[str]) -> argparse.Namespace:
            return argparse.Namespace(handler=handler)

    monkeypatch.setattr(cli, "build_parser", lambda command: Parser())
    # A command line starts with Python's own Ctrl-C handling, whatever an earlier test
    # in this worker left.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["profiles"]) == cli.EXIT_INTERRUPTED
        assert capsys.readouterr().err == "gpugov: interrupted\n"
        assert reported == [ValueError]  # everything else still reaches the hook
        assert sys.unraisablehook is recorded
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_once_the_interrupt_is_handled_a_second_ctrl_c_is_ignored() -> None:
    from gpugov import cli

    previous = signal.signal(signal.SIGINT, cli._on_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        cli._ignore_further_interrupts()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)  # nothing raised, nothing printed
    finally:
        signal.signal(signal.SIGINT, previous)
        from gpugov.daemon.progress import clear_interrupt

        clear_interrupt()
