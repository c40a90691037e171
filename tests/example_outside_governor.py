"""A minimal outside governor, as another package would ship it (the example in
docs/benchmark.md): the conformance suite builds it as the ``external`` kind."""

from __future__ import annotations

from collections.abc import Callable

from gpugov.daemon.decide import ControllerContext
from gpugov.plant.types import ServingObservation


def make(context: ControllerContext) -> Callable[[ServingObservation], float]:
    """Top clock while anything runs or waits, the lowest clock when idle."""
    clocks = context.supported_clocks_mhz

    def decide(observation: ServingObservation) -> float:
        busy = observation.decode_active > 0 or observation.waiting_requests > 0
        return clocks[-1] if busy else clocks[0]

    return decide


def make_swallowing(context: ControllerContext) -> Callable[[ServingObservation], float]:
    """:func:`make`, whose fifth decision notes a Ctrl-C without raising it, as a Ctrl-C
    swallowed inside a compiled kernel leaves it (tests of the interrupt path)."""
    from gpugov.daemon.progress import note_interrupt

    inner = make(context)
    calls = [0]

    def decide(observation: ServingObservation) -> float:
        calls[0] += 1
        if calls[0] == 5:
            note_interrupt()
        return inner(observation)

    return decide


class _Capping:
    """:func:`make`'s decisions, with a power cap of 300 W per GPU (``PowerCapping``)."""

    def __init__(self, context: ControllerContext) -> None:
        self._decide = make(context)
        self.requested_power_cap_w = 300.0 * context.gpu_count

    def __call__(self, observation: ServingObservation) -> float:
        return self._decide(observation)


def make_capping(context: ControllerContext) -> _Capping:
    """An outside governor that sets a power cap as well as the clock (tests of a node
    whose backend cannot set one)."""
    return _Capping(context)
