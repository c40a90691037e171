"""Shared fixtures for every test package."""

from __future__ import annotations

import itertools
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from synthetic import make_plant, make_profile

from gpugov.daemon.gpu_hold import SCOPE_ENV
from gpugov.plant import PerformanceProfile, ServingPlant

_TESTS = itertools.count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that set ``RUN_EARLY`` (long ones with few tests: their rough seconds) first,
    longest first, then the rest by their number of tests, most first: under ``--dist
    loadfile --no-loadscope-reorder`` (the Makefile's) each worker takes the files in this
    order, and a long file scheduled last (xdist's own order is by the number of tests
    alone) kept one worker busy while the others sat idle."""
    counts = Counter(item.path for item in items)
    items.sort(
        key=lambda item: (
            -float(getattr(getattr(item, "module", None), "RUN_EARLY", 0)),
            -counts[item.path],
        )
    )


@pytest.fixture(autouse=True)
def _own_gpu_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test takes its GPU holds (``daemon.gpu_hold``) in a scope of its own: the fake
    GPUs of tests running at once on other workers share UUIDs, not a node. The test's
    daemons (in-process and child processes) share the scope, so a test of two governors
    on one GPU sees them meet."""
    monkeypatch.setenv(SCOPE_ENV, f"test-{os.getpid()}-{next(_TESTS)}")


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
