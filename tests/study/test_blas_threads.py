"""A study's numbers do not depend on the machine's cores or on the runner: every gpugov
process starts its BLAS with one thread. An OpenBLAS started with more threads and limited
to one later (the runners' ``threadpoolctl`` limit) sums in another order than one started
with one (a Ray worker, a one-core machine), and the SLSQP MPC's decisions followed it:
``sweep --jobs 1`` and ``sweep --ray local`` gave one cell two results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _simulate(out: Path, threads: str) -> dict[str, float]:
    """``gpugov simulate`` of the SLSQP MPC in its own process, its BLAS started with
    ``threads`` threads by the environment; the run's metrics."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
    argv = ["simulate", "--controller", "mpc-slsqp", "--duration", "120", "--quiet"]
    done = subprocess.run(
        [sys.executable, "-m", "gpugov", *argv, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    metrics: dict[str, float] = json.loads(out.read_text())["metrics"]
    return metrics


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: every BLAS has one thread")
def test_simulate_gives_one_result_whatever_the_blas_threads(tmp_path: Path) -> None:
    one = _simulate(tmp_path / "one.json", "1")
    two = _simulate(tmp_path / "two.json", "2")
    for key in ("energy_j", "clock_changes", "slo_attainment", "ttft_p95_s"):
        assert one[key] == two[key], key


def test_the_node_commands_leave_the_blas_as_the_operator_started_it() -> None:
    """A study command starts its BLAS with one thread (its figures must not follow the
    machine's cores); the node's commands do not override what the operator set (an
    outside controller on a node may want its threads)."""
    from gpugov.cli import sets_one_blas_thread

    assert sets_one_blas_thread(["simulate", "--duration", "5"])
    assert sets_one_blas_thread(["sweep", "--grid", "g.toml"])
    assert not sets_one_blas_thread(["run", "--config", "/etc/gpugov/config.toml"])
    assert not sets_one_blas_thread(["actuator"])
    assert not sets_one_blas_thread([])
