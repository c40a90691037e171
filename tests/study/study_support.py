"""Helpers shared by the study tests (imported by name; conftest.py holds the fixtures)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from gpugov.cli import main

BENCH = Path(__file__).resolve().parents[2] / "bench"
QUICK_EXPERIMENTS_ARGS = ["experiments", "--quick", "--duration", "120", "--animation", "30"]


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``gpugov ARGV`` in this process: (exit code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


def run_quick_experiments(out: Path, *extra: str) -> tuple[int, str, str]:
    """``gpugov experiments --quick`` on a 120 s window into ``out``; (code, stdout, stderr)."""
    return run_main([*QUICK_EXPERIMENTS_ARGS, *extra, "--out", str(out)])


def fail_when_synced(monkeypatch: Any, name: str, error: BaseException) -> list[str]:
    """Make ``os.fsync`` raise ``error`` on the temporary file written for ``name`` (a Ctrl-C
    or a full disk in the middle of an output set); returns the temporaries it failed."""
    real = os.fsync
    failed: list[str] = []

    def fsync(descriptor: int) -> None:
        temporary = os.path.basename(os.readlink(f"/proc/self/fd/{descriptor}"))
        if temporary.startswith(f".{name}."):
            failed.append(temporary)
            raise error
        real(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    return failed


def run_past_file_size(argv: list[str], limit_bytes: int) -> subprocess.CompletedProcess[str]:
    """``python -m gpugov ARGV`` in its own process, where writing a file past
    ``limit_bytes`` fails midway (``RLIMIT_FSIZE``: EFBIG, as a full disk fails a write;
    Python ignores the SIGXFSZ that would kill it). Bytecode caching is off so that only
    the command's own files count."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "gpugov", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=limit,
    )


def bench_script(name: str) -> ModuleType:
    """``bench/NAME.py`` loaded as a module, with bench/ on the import path as it is when
    the script runs (a script may import a sibling's helpers)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"gpugov_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_bench_main(name: str, argv: list[str]) -> tuple[int, str, str]:
    """``bench/NAME.py``'s ``main(argv)``: (exit code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = bench_script(name).main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


SMALL_BATCH, SMALL_CONTEXT = 16, 256
"""The profiler tests' decode reference: a small batch and context, so a sweep's points take
seconds in real time."""


def small_sweep_settings(dwell_s: float) -> Any:
    """What ``gpugov profile --clock-list 1980,1290 --dwell DWELL --reference-batch 16
    --reference-context 256`` sweeps (``--resume`` compares them)."""
    from gpugov.study.profiler.sweep import SweepSettings, default_decode_points

    return SweepSettings(
        clocks_mhz=(1980, 1290),
        dwell_s=dwell_s,
        decode_points=default_decode_points(SMALL_BATCH, SMALL_CONTEXT, 131_072),
        reference_batch=SMALL_BATCH,
        reference_context_tokens=SMALL_CONTEXT,
    )


def start_emulator_process(profile_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``gpugov emulate --profile PATH`` in its own process (as on a node: the profiler and
    the emulator do not share an interpreter) on a free loopback port, once it answers:
    ``(process, url)``. The caller ends the process."""
    import socket
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "gpugov", "emulate", "--profile", str(profile_path)]
    process = subprocess.Popen(
        [*command, "--address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
            return process, url
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                process.wait()
                raise
            time.sleep(0.2)
