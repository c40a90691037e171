"""Shared fixtures for every test package."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from synthetic import make_plant, make_profile

from gpugov.plant import PerformanceProfile, ServingPlant


@pytest.fixture
def profile() -> PerformanceProfile:
    return make_profile()


@pytest.fixture
def plant() -> ServingPlant:
    return make_plant()


@pytest.fixture
def module_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, str], str]]:
    """``write(name, source)``: module ``name`` (``source`` dedented) in the test's temporary
    folder, on ``sys.path`` for the test to import or name as ``name:factory``; returns
    ``name``. Each module written is forgotten after the test, so the next imports afresh."""
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


# --------------------------------------------------------------- xdist file order
HEAVIEST_FILES = (
    "tests/faults/test_faults.py",  # its campaign is over before test_ray starts Ray
    "tests/study/test_experiments_cli.py",
    "tests/study/test_ray.py",
    "tests/controllers/test_online_unseen_shapes.py",
    "tests/study/test_fleet.py",
    "tests/study/test_profile.py",
    "tests/study/test_unseen_node.py",
    "tests/controllers/test_efficiency_floor.py",
    "tests/study/test_random_shapes.py",
    "tests/study/test_scoreboard_windows.py",
    "tests/study/test_cli_signals.py",
    "tests/study/test_outside_rows.py",
    "tests/controllers/test_scheduling.py",
    "tests/study/test_cli_progress.py",
    "tests/study/test_scoreboard_report.py",
    "tests/package/test_device_check.py",
    "tests/fuzz/test_cli_fuzz.py",
    "tests/package/test_wheel.py",
    "tests/study/test_emulate_e2e.py",
    "tests/daemon/test_node_lifecycle.py",
    "tests/controllers/test_online_mpc.py",
)
"""The files that take longest (``--durations``, summed per file), longest first. Under
``--dist loadfile`` xdist hands out files with the most tests first, which leaves these
(few tests, minutes of simulation) for the end, where one worker finishes them alone
while the other waits; they go first instead, and the many quick files fill in at the
end. Only the order changes: a file missing from the list runs as before."""


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile``: xdist's file scheduler, handing out ``HEAVIEST_FILES`` first."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeaviestFirst(LoadFileScheduling):  # type: ignore[misc]
        def _assign_work_unit(self, node: object) -> None:
            heaviest = next((f for f in HEAVIEST_FILES if f in self.workqueue), None)
            if heaviest is not None:
                self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return HeaviestFirst(config, log)
