"""The fleet's request routers: round-robin, least outstanding tokens, or least outstanding
work (tokens weighted by each node's speed)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
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


class Router(ABC):
    """Picks the node for each arriving request, in arrival order."""

    name = "router"

    def __init__(self) -> None:
        self._next = 0

    @abstractmethod
    def choose(self, request: Request, nodes: Sequence[RoutedNode]) -> int:
        """The index of the node ``request`` goes to."""


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


def make_router(name: str) -> Router:
    """The router called ``name`` (one of :data:`ROUTERS`)."""
    if name == "round-robin":
        return RoundRobin()
    if name == "least-tokens":
        return LeastOutstandingTokens()
    if name == "least-work":
        return LeastOutstandingWork()
    raise ValueError(f"router must be one of {ROUTERS}, got {name!r}")
