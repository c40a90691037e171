"""Fixtures shared by the study tests: one quick ``gpugov experiments`` run per session
(the CLI tests read it, and the Ray test compares its sharded run with it), and an
emulated node on the tests' synthetic profile, served on loopback."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from study_support import run_quick_experiments
from synthetic import make_plant

from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    """``gpugov emulate`` on the synthetic profile, one GPU, on a free loopback port."""
    server = EmulatorServer(EmulatedNode(make_plant()), "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def experiments_quick_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, int, str, str]:
    """The sequential quick run (figures included): ``(out, code, stdout, stderr)``.

    Under pytest-xdist the files that read it may run on different workers; the first
    to need it runs it into the session's shared temporary folder (under a file lock)
    and the others read that run (its folder and what it printed) instead of running
    the same ~20 s again. The tests only read the folder."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp("experiments") / "quick"
        code, stdout, stderr = run_quick_experiments(out)
        return out, code, stdout, stderr
    shared = tmp_path_factory.getbasetemp().parent  # the same folder for every worker
    out = shared / "experiments-shared" / "quick"
    record = shared / "experiments-shared.json"
    with open(shared / "experiments-shared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            out.parent.mkdir(exist_ok=True)
            code, stdout, stderr = run_quick_experiments(out)
            record.write_text(json.dumps({"code": code, "stdout": stdout, "stderr": stderr}))
        run = json.loads(record.read_text())
    return out, run["code"], run["stdout"], run["stderr"]
