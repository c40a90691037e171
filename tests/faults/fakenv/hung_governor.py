"""An outside governor (``kind = "external"``) whose first decision never returns (a
blocking call that hangs) and whose later ones ask for the lowest clock, or for a clock
that is not one: the fault campaign's misbehaving controller."""

from __future__ import annotations

import threading
from typing import Any

_first = threading.Event()


def make(context: Any) -> Any:
    """Hang the first call (the warm-up's), then the lowest clock."""
    low = context.supported_clocks_mhz[0]

    def decide(observation: Any) -> float:
        if not _first.is_set():
            _first.set()
            threading.Event().wait()  # never returns
        return low

    return decide


def not_a_clock(context: Any) -> Any:
    """Every answer a string: not a clock."""

    def decide(observation: Any) -> str:
        return "fast"

    return decide


class _HungClose:
    """Decides 1410 MHz; its ``close`` (a flush to a service that went away) never
    returns."""

    def __call__(self, observation: Any) -> float:
        return 1410.0

    def close(self) -> None:
        threading.Event().wait()  # never returns


def hung_close(context: Any) -> Any:
    """A governor whose close at exit hangs."""
    return _HungClose()
