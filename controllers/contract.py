"""The controller contract: what a clock controller must do, and what it may offer.

A controller is any callable ``ServingObservation -> MHz`` (:class:`ClockController`). The
optional capabilities are small ``runtime_checkable`` protocols, tested with ``isinstance``
(never ``getattr``), and every wrapper derives from :class:`ControllerWrapper`, which has
``inner`` and ``unwrapped`` as Gymnasium's wrappers do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from gpugov.plant.types import ClockController, MPCDiagnostics, PowerCapping, ServingObservation

__all__ = [
    "ClockController",
    "Closable",
    "ControllerWrapper",
    "Diagnosable",
    "HistoryBounded",
    "Learner",
    "Named",
    "PowerCapping",
    "ReportsFallbacks",
    "controller_label",
    "layers",
    "unwrap",
]


@runtime_checkable
class Named(Protocol):
    """Has the one name metrics, logs, recordings and results use (``mpc``, ``fixed:1410``)."""

    name: str


@runtime_checkable
class Diagnosable(Protocol):
    """An MPC: reports its solve times and fallbacks."""

    def diagnostics(self) -> MPCDiagnostics: ...


@runtime_checkable
class ReportsFallbacks(Protocol):
    """Counts the decisions it could not make as planned, by reason."""

    @property
    def fallback_reasons(self) -> Mapping[str, int]: ...


@runtime_checkable
class Learner(Protocol):
    """Learns a model of its node while it runs (``mpc-online``): reports its status."""

    def status(self) -> dict[str, Any]: ...


@runtime_checkable
class Closable(Protocol):
    """Holds something to release or persist at exit (a learned model)."""

    def close(self) -> None: ...


@runtime_checkable
class HistoryBounded(Protocol):
    """Keeps per-decision history (plans, solve times); a node bounds it."""

    history_limit: int | None


class ControllerWrapper:
    """A controller around another one: the safety limits, persistence, instruments.

    ``inner`` is the wrapped controller and ``unwrapped`` the one inside every wrapper
    (the algorithm itself). ``close`` closes the inner controller when it can be closed,
    so closing the outermost layer closes the chain.
    """

    name: str
    """The one name of the controller this wrapper carries (metrics, logs, recordings)."""

    def __init__(self, inner: ClockController) -> None:
        self.inner = inner
        self.name = controller_label(inner)

    @property
    def unwrapped(self) -> ClockController:
        """The controller inside every wrapper."""
        controller: ClockController = self.inner
        while isinstance(controller, ControllerWrapper):
            controller = controller.inner
        return controller

    def __call__(self, observation: ServingObservation) -> float:
        return self.inner(observation)

    @property
    def requested_power_cap_w(self) -> float | None:
        """The power cap the inner controller sets (:class:`PowerCapping`), else None
        (the board limit): a wrapper passes a cap through unchanged."""
        inner = self.inner
        return inner.requested_power_cap_w if isinstance(inner, PowerCapping) else None

    def close(self) -> None:
        """Close the inner controller, if it holds anything."""
        if isinstance(self.inner, Closable):
            self.inner.close()


def layers(controller: ClockController) -> list[ClockController]:
    """Every layer of a wrapper chain, outermost first, the algorithm last."""
    found = [controller]
    while isinstance(controller, ControllerWrapper):
        controller = controller.inner
        found.append(controller)
    return found


def unwrap(controller: ClockController) -> ClockController:
    """The algorithm inside every wrapper (``controller`` itself when it is none)."""
    return controller.unwrapped if isinstance(controller, ControllerWrapper) else controller


def controller_label(controller: object) -> str:
    """A short label for logs: the controller's ``name`` when it has one, else its type."""
    if isinstance(controller, Named) and controller.name:
        return controller.name
    return type(controller).__name__
