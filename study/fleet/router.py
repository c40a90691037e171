"""The fleet's request routers: round-robin, least outstanding tokens, or least outstanding
work (tokens weighted by each node's speed)."""

from __future__ import annotations

import bisect
import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Protocol

from gpugov.plant.types import Request

ROUTERS = ("round-robin", "least-tokens", "least-work")


class RoutedNode(Protocol):
    """What a router reads of a node."""

    def outstanding_tokens(self) -> float: ...

    @property
    def tokens_per_s(self) -> float:
        """The node's serving rate at its top clock on the trace's mix (tokens per second)."""
        ...


class DispatchedNode(RoutedNode, Protocol):
    """A node a router sends requests to (:meth:`Router.route`)."""

    def dispatch(self, request: Request) -> None: ...


class Router(ABC):
    """Picks the node for each arriving request, in arrival order."""

    name = "router"

    def __init__(self) -> None:
        self._next = 0

    @abstractmethod
    def choose(self, request: Request, nodes: Sequence[RoutedNode]) -> int:
        """The index of the node ``request`` goes to."""

    def route(self, requests: Sequence[Request], nodes: Sequence[DispatchedNode]) -> None:
        """Dispatch ``requests`` in turn, each to the node :meth:`choose` picks, while the
        nodes do not step (one control period's arrivals)."""
        for request in requests:
            nodes[self.choose(request, nodes)].dispatch(request)


def _route_least(
    router: Router,
    requests: Sequence[Request],
    nodes: Sequence[DispatchedNode],
    load: Callable[[int], float],
) -> None:
    """Dispatch ``requests`` as ``router.choose`` would, each to the node of least
    ``load(i)``, ties to the first at or after the one in turn, while the nodes do not
    step: only the chosen node's load changes between requests, so the nodes are kept by
    load (a heap of loads, each load's nodes in index order) and each choice costs a log
    of the fleet, where a scan of every node made a period quadratic in a large fleet."""
    if not requests:
        return
    count = len(nodes)
    by_load: dict[float, list[int]] = {}
    for index in range(count):
        by_load.setdefault(load(index), []).append(index)
    heap = list(by_load)
    heapq.heapify(heap)
    for request in requests:
        while not by_load.get(heap[0]):  # a load no node has any more
            by_load.pop(heapq.heappop(heap), None)
        tied = by_load[heap[0]]
        start = router._next % count
        at = bisect.bisect_left(tied, start)
        index = tied.pop(at if at < len(tied) else 0)
        router._next = index + 1
        nodes[index].dispatch(request)
        now = load(index)
        if now not in by_load or not by_load[now]:
            if now not in by_load:
                heapq.heappush(heap, now)
            by_load[now] = []
        bisect.insort(by_load[now], index)


class RoundRobin(Router):
    """Each request to the next node in turn, whatever the nodes' load."""

    name = "round-robin"

    def choose(self, request: Request, nodes: Sequence[RoutedNode]) -> int:
        """The next node in turn."""
        index = self._next % len(nodes)
        self._next = index + 1
        return index


class LeastOutstandingTokens(Router):
    """Each request to the node with the fewest outstanding tokens (queued prompt tokens
    and running requests' KV tokens, plus what it was sent since it last reported); ties
    go round robin."""

    name = "least-tokens"

    def choose(self, request: Request, nodes: Sequence[RoutedNode]) -> int:
        """The least-loaded node, ties broken in turn."""
        count = len(nodes)
        start = self._next % count
        index = min(
            range(count), key=lambda i: (nodes[i].outstanding_tokens(), (i - start) % count)
        )
        self._next = index + 1
        return index

    def route(self, requests: Sequence[Request], nodes: Sequence[DispatchedNode]) -> None:
        """As :meth:`choose` for each request (:func:`_route_least`)."""
        _route_least(self, requests, nodes, lambda i: nodes[i].outstanding_tokens())


class LeastOutstandingWork(Router):
    """Each request to the node with the least outstanding work: its outstanding tokens
    (as ``least-tokens`` counts them) over its serving rate at the top clock, so a node
    twice as fast takes twice the tokens (a weighted least-request balancer, weights
    from each board's speed); ties go round robin."""

    name = "least-work"

    def choose(self, request: Request, nodes: Sequence[RoutedNode]) -> int:
        """The node with the fewest seconds of outstanding work, ties broken in turn."""
        count = len(nodes)
        start = self._next % count
        index = min(
            range(count),
            key=lambda i: (
                nodes[i].outstanding_tokens() / max(nodes[i].tokens_per_s, 1e-12),
                (i - start) % count,
            ),
        )
        self._next = index + 1
        return index

    def route(self, requests: Sequence[Request], nodes: Sequence[DispatchedNode]) -> None:
        """As :meth:`choose` for each request (:func:`_route_least`)."""
        _route_least(
            self,
            requests,
            nodes,
            lambda i: nodes[i].outstanding_tokens() / max(nodes[i].tokens_per_s, 1e-12),
        )


def make_router(name: str) -> Router:
    """The router called ``name`` (one of :data:`ROUTERS`)."""
    if name == "round-robin":
        return RoundRobin()
    if name == "least-tokens":
        return LeastOutstandingTokens()
    if name == "least-work":
        return LeastOutstandingWork()
    raise ValueError(f"router must be one of {ROUTERS}, got {name!r}")
