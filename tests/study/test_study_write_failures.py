"""A file a study command appends to as it goes that cannot be written (a full disk) ends
the command with one line naming the file, never a traceback."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from study_support import run_main

GRID = (
    'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\n'
    'controllers = ["max", "fixed:1200"]\nduration_s = 5.0\n'
)


def test_a_full_disk_under_the_sweeps_results_is_one_line_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append's flush raised ENOSPC with no file name, which the command line's edge
    let through as a traceback (exit 1); it names ``DIR/results.jsonl`` now."""
    real_fsync = os.fsync

    def full(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("results.jsonl"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    code, _, stderr = run_main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"])
    assert code == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("gpugov: error:")]
    assert errors == [f"gpugov: error: {out / 'results.jsonl'}: No space left on device"], stderr
    assert "Traceback" not in stderr


def test_a_profile_state_file_that_cannot_grow_is_one_line_naming_it(tmp_path: Path) -> None:
    """A clock's record appended to ``sweep-state.jsonl`` past a full disk (here a file-size
    limit) raised with no file name: a traceback, exit 1. One line naming the file now,
    the clocks reset and the records before it whole for ``--resume``."""
    from study_support import SMALL_BATCH, SMALL_CONTEXT, run_past_file_size
    from synthetic import make_profile

    from gpugov.plant import ServingPlant
    from gpugov.study.emulate.node import EmulatedNode
    from gpugov.study.emulate.server import EmulatorServer

    server = EmulatorServer(EmulatedNode(ServingPlant.from_profile(make_profile())), "127.0.0.1", 0)
    server.start()
    try:
        argv = ["profile", "--engine-url", server.url, "--gpus", "0", "--backend", "emulated"]
        argv += ["--out", str(tmp_path), "--quiet", "--clock-list", "1980,1290", "--dwell"]
        argv += ["0.3", "--reference-batch", str(SMALL_BATCH)]
        argv += ["--reference-context", str(SMALL_CONTEXT)]
        # The header line (about 400 bytes) fits; the first clock's record does not.
        cut = run_past_file_size(argv, limit_bytes=1000)
        assert server.node.gpu_state[0].locked is None  # reset on the way out
    finally:
        server.close()
    state = tmp_path / "sweep-state.jsonl"
    assert cut.returncode == 1, cut.stderr
    errors = [line for line in cut.stderr.splitlines() if line.startswith("gpugov: error:")]
    assert errors == [f"gpugov: error: {state}: File too large"], cut.stderr
    assert "Traceback" not in cut.stderr


@contextlib.contextmanager
def _file_size_limit(limit_bytes: int) -> Iterator[None]:
    """Writing a file past ``limit_bytes`` fails (EFBIG, as a full disk fails a write) in
    this process while the block runs (Python ignores the SIGXFSZ that would kill it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_experiments_past_a_full_disk_is_one_line_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DIR/results.json`` was written with ``Path.write_text``, whose failed write names
    no file: a traceback (exit 1). One line naming ``DIR/results.json`` now, and the
    ``DIR`` the run made is gone again. The study's results are a stand-in: what is under
    test is how the command writes them."""
    from gpugov.study import experiments_cli

    monkeypatch.setattr(
        experiments_cli, "build_textbook_results", lambda *a, **k: {"pad": "x" * 50_000}
    )
    out = tmp_path / "out"
    with _file_size_limit(16_384):
        code, _, stderr = run_main(["experiments", "--quick", "--out", str(out)])
    assert code == 1, stderr
    assert stderr.splitlines()[-1] == f"gpugov: error: {out / 'results.json'}: File too large"
    assert "Traceback" not in stderr and not out.exists()


def test_an_experiments_figure_past_a_full_disk_names_its_file(tmp_path: Path) -> None:
    """The figures were saved by matplotlib in place, whose failed write (inside PIL)
    names no file: a traceback. Written as every output is now, naming the figure."""
    from gpugov.study import experiments_cli
    from gpugov.study.plots import pyplot

    fig, axis = pyplot().subplots()
    axis.plot(range(1000), [(i * 7919) % 1000 for i in range(1000)])
    target = tmp_path / "figure.png"
    with _file_size_limit(4096), pytest.raises(OSError) as failed:
        experiments_cli._save(fig, target)
    assert failed.value.filename == str(target) and failed.value.errno == errno.EFBIG
    assert not target.exists()
