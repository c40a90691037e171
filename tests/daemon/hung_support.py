"""Helpers shared by the hung GPU write tests (clock writes, power limit writes): an NVML
call of the fake that hangs in the driver, and a node of two domains.

Imported by name (``from hung_support import ...``), as :mod:`daemon_support` is; the
``safety`` fixture that frees the hung calls at the end of a test is in ``conftest.py``.
"""

from __future__ import annotations

import threading
from typing import Any

from daemon_support import JOIN_S, MetricsServer
from fake_pynvml import FakeNvml

from gpugov.daemon.config import GpugovConfig, parse_config

DEADLINE_S = 0.2
"""The writes' deadline: short, yet far above a healthy write on a busy machine."""


class HungCall:
    """An NVML call of ``fake`` (a setter, mostly) that, while :attr:`armed`, blocks on GPU
    ``index`` until :attr:`release` is set (then it runs, or raises :attr:`error` when one
    is set); it runs at once on every other GPU."""

    def __init__(self, fake: FakeNvml, function: str, index: int = 0) -> None:
        self.real = getattr(fake, function)
        self.index = index
        self.armed = True
        self.release = threading.Event()
        self.blocked = threading.Event()
        """Set once a call is blocked in the driver."""
        self.calls = 0
        """Calls on GPU ``index`` started."""
        self.error: Exception | None = None
        setattr(fake, function, self)

    def __call__(self, handle: Any, *args: Any) -> Any:
        if handle.index != self.index:
            return self.real(handle, *args)
        self.calls += 1
        if self.armed and not self.release.is_set():
            self.blocked.set()
            self.release.wait(JOIN_S)
            if self.error is not None:
                raise self.error
        return self.real(handle, *args)

    @property
    def hung(self) -> bool:
        return self.armed and not self.release.is_set()


def two_domains(server: MetricsServer, controller: dict[str, Any]) -> GpugovConfig:
    """A node of two domains, ``a`` on GPU 0 and ``b`` on GPU 1, each run by
    ``controller`` and scraping ``server`` (its page set to a busy engine)."""
    server.page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
    )
    engine = {"kind": "vllm", "url": server.url, "timeout_s": 0.9}
    return parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": name,
                    "gpus": [index],
                    "engine": engine,
                    "controller": controller,
                    "stale_after_s": 2.0,
                }
                for index, name in enumerate(("a", "b"))
            ],
        }
    )
