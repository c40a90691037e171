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


def run_quick_experiments(out: Path, *extra: str) -> tuple[int, str, str]:
    """``gpugov experiments --quick`` on a 120 s window into ``out``; (code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*QUICK_EXPERIMENTS_ARGS, *extra, "--out", str(out)])
    return code, stdout.getvalue(), stderr.getvalue()


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
