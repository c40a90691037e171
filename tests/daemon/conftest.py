"""Shared fixtures for the daemon tests: a fake NVML and the engine-metrics pages."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for _path in (HERE,):  # the fakes (fake_pynvml, daemon_support)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from daemon_support import MetricsServer, fixture_text, freed_at_end  # noqa: E402
from fake_pynvml import FakeNvml  # noqa: E402


def shared_dir() -> Path:
    """The shared data folder: $GPUGOV_SHARED_DIR, else a shared/ folder beside the repo."""
    env = os.environ.get("GPUGOV_SHARED_DIR")
    return Path(env) if env else HERE.parents[2] / "shared"


@pytest.fixture
def safety() -> Iterator[list[Any]]:
    """Hung calls a test adds (anything with a ``release`` event, ``hung_support.HungCall``
    mostly), each freed at the end of the test (or after ``daemon_support.JOIN_S``)."""
    hung: list[Any] = []

    def free() -> None:
        for call in hung:
            call.release.set()

    with freed_at_end(free):
        yield hung


@pytest.fixture
def fake_nvml() -> FakeNvml:
    """Two fake H100s, root permissions."""
    return FakeNvml(2)


@pytest.fixture
def shared_engine_metrics() -> Path:
    """The recorded real /metrics pages in shared/engine_metrics (skip when absent)."""
    path = shared_dir() / "engine_metrics"
    if not path.is_dir():
        pytest.skip(f"shared engine metrics not found at {path}")
    return path


@pytest.fixture
def metrics_server():  # type: ignore[no-untyped-def]
    """A local /metrics endpoint; set ``.page`` to what the engine should say."""
    server = MetricsServer()
    yield server
    server.close()


@pytest.fixture
def vllm_server(metrics_server: MetricsServer) -> MetricsServer:
    """A local /metrics endpoint serving the synthetic two-engine vLLM page."""
    metrics_server.page = fixture_text("vllm_dp2_synthetic.txt")
    return metrics_server
