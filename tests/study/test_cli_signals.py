"""Ctrl-C and closed pipes end commands with one line (or none), never a traceback.

These run the real ``python -m gpugov`` process: SIGINT arrives once the command has said
it is working (its first progress line), and it must exit 130 promptly.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


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


def _interrupt_after(process: subprocess.Popen[str], marker: str) -> tuple[int, str, float]:
    """Wait for ``marker`` on stderr, send SIGINT, return (exit code, stderr, seconds)."""
    assert process.stderr is not None
    seen = []
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(marker):
            break
    assert seen and seen[-1].startswith(marker), seen
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
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


def test_closed_stdout_exits_quietly() -> None:
    process = _start(["profiles", "--json"])
    assert process.stdout is not None
    process.stdout.close()  # `| head` that has already exited
    assert process.stderr is not None
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 1
    assert stderr == ""


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
