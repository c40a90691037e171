"""The controller contract: what a clock controller must do, and what it may offer.

A controller is any callable ``ServingObservation -> MHz`` (:class:`ClockController`). The
optional capabilities are small ``runtime_checkable`` protocols, tested with ``isinstance``
(never ``getattr``), and every wrapper derives from :class:`ControllerWrapper`, which has
``inner`` and ``unwrapped`` as Gymnasium's wrappers do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from gpugov.plant.types import ClockController, MPCDiagnostics, PowerCapping, ServingObservation

__all__ = [
    "BUDGET_ROUNDING",
    "ClockController",
    "Closable",
    "ControllerWrapper",
    "Diagnosable",
    "HistoryBounded",
    "Learner",
    "Named",
    "PowerCapping",
    "PowerNeed",
    "PowerNeeding",
    "ReportsFallbacks",
    "chain_layer",
    "controller_label",
    "fits_budget",
    "layers",
    "power_needed",
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


TICK_SLACK_PERIODS = 0.1
"""The share of a control period by which two decisions may come closer than their ticks'
targets and still count as that many whole periods apart: a node's tick wakes a fraction
of a millisecond after its target, by a different fraction each time."""


def whole_periods(seconds: float, period_s: float) -> float:
    """``seconds`` between two decisions in whole control periods of ``period_s``
    (:data:`TICK_SLACK_PERIODS` allowed for the ticks' timing), as the safety chain's
    dwell and relock interval count them (``daemon.safety.MinimumDwell``) and an MPC
    prices them; a non-finite span (nothing held yet) is returned as it is."""
    if not math.isfinite(seconds):
        return seconds
    return float(math.floor(seconds / period_s + TICK_SLACK_PERIODS))


BUDGET_ROUNDING = 1e-9
"""A predicted power above a budget by at most this share of it is at the budget: rounding.
A model that learned a board's power from reads its power limit held predicts that limit
plus float noise (150.0000000000073 W against 150 W), which is not over the budget."""


def fits_budget(watts: float, budget_w: float) -> bool:
    """Whether ``watts`` fits ``budget_w``: at or below it, or above by rounding only
    (:data:`BUDGET_ROUNDING`)."""
    return watts <= budget_w + BUDGET_ROUNDING * abs(budget_w)


@dataclass(frozen=True, slots=True)
class PowerNeed:
    """The power a domain needs to hold its SLO at the current load, by its controller's
    model (``docs/power-budget.md``).

    Powers are watts for the whole domain, the mean the model predicts over the
    controller's horizon with the clock held constant; no power cap or budget is applied.
    """

    watts: float
    """Predicted power at :attr:`clock_mhz`, the lowest clock whose predicted TTFT and
    TPOT stay within the controller's targets over its horizon."""
    uncertainty_w: float
    """One standard deviation of :attr:`watts` from the model's own uncertainty (0 when
    the controller takes its model as exact, as ``mpc`` takes its profile)."""
    clock_mhz: float
    """The lowest clock that holds the SLO (the top clock when none does)."""
    holds: bool
    """Whether any clock holds the SLO by the model (False: a backlog no clock clears in
    time; :attr:`watts` is then the top clock's power)."""
    tpot_clock_mhz: float
    """The lowest clock that holds the TPOT SLO alone: what the running requests need."""
    clocks_mhz: tuple[float, ...]
    """The clocks the model predicts at, ascending."""
    curve_w: tuple[float, ...]
    """Predicted power at each of :attr:`clocks_mhz` at the current load."""
    peak_w: float | None = None
    """The most the model lets the domain draw at any load (its highest phase power at
    any clock), when known: a budget at least this never binds."""

    def __post_init__(self) -> None:
        if len(self.clocks_mhz) != len(self.curve_w) or not self.clocks_mhz:
            raise ValueError("a power need needs one predicted power per clock")
        for name in ("watts", "uncertainty_w"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")

    @property
    def upper_w(self) -> float:
        """An upper estimate of the need: :attr:`watts` plus two standard deviations."""
        return self.watts + 2.0 * self.uncertainty_w

    def watts_at(self, clock_mhz: float) -> float:
        """Predicted power at ``clock_mhz`` (the highest model clock at or below it)."""
        index = _index_at_or_below(self.clocks_mhz, clock_mhz)
        return self.curve_w[index]

    def fits(self, budget_w: float) -> bool:
        """Whether the need fits ``budget_w`` (:func:`fits_budget`); else it is over it."""
        return fits_budget(self.watts, budget_w)

    def ceiling_mhz(self, budget_w: float, at_most_mhz: float = math.inf) -> float:
        """The highest clock at or below ``at_most_mhz`` whose predicted power fits
        ``budget_w`` (:func:`fits_budget`; the lowest clock when none does). The curve need
        not rise with the clock (a table's bump, a learned model): a clock below one that
        fits may not fit itself."""
        fitting = [
            c
            for c, w in zip(self.clocks_mhz, self.curve_w, strict=True)
            if c <= at_most_mhz + 1e-9 and fits_budget(w, budget_w)
        ]
        return fitting[-1] if fitting else self.clocks_mhz[0]

    def fits_at(self, clock_mhz: float, budget_w: float) -> bool:
        """Whether the predicted power at ``clock_mhz`` (:meth:`watts_at`) fits ``budget_w``."""
        return fits_budget(self.watts_at(clock_mhz), budget_w)

    def tpot_floor_mhz(self, budget_w: float) -> float:
        """The clock an over-budget domain keeps for its running requests: the TPOT clock
        where its power fits ``budget_w``, else the lowest faster clock that fits, else
        the highest that fits (TPOT slips too)."""
        tpot = self.tpot_clock_mhz
        if self.fits_at(tpot, budget_w):
            return tpot
        above = [
            c
            for c, w in zip(self.clocks_mhz, self.curve_w, strict=True)
            if c > tpot + 1e-9 and fits_budget(w, budget_w)
        ]
        return above[0] if above else self.ceiling_mhz(budget_w, tpot)


def _index_at_or_below(clocks: Sequence[float], clock_mhz: float) -> int:
    """Index of the highest of ``clocks`` (ascending) at or below ``clock_mhz`` (0 below
    them all)."""
    index = 0
    for position, clock in enumerate(clocks):
        if clock <= clock_mhz + 1e-9:
            index = position
    return index


@runtime_checkable
class PowerNeeding(Protocol):
    """Reports the power its domain needs to hold the SLO at the current load
    (``mpc``, ``mpc-online``; every wrapper passes it through)."""

    def power_needed(self) -> PowerNeed | None: ...


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

    def power_needed(self) -> PowerNeed | None:
        """The inner controller's :class:`PowerNeed` after its last decision; None when
        it reports none (a controller without a model, or before its first decision)."""
        inner = self.inner
        return inner.power_needed() if isinstance(inner, PowerNeeding) else None

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


Layer = TypeVar("Layer")


def chain_layer(controller: ClockController, kind: type[Layer]) -> Layer | None:
    """The chain's outermost layer of ``kind`` (None outside a chain, or none)."""
    return next((layer for layer in layers(controller) if isinstance(layer, kind)), None)


def unwrap(controller: ClockController) -> ClockController:
    """The algorithm inside every wrapper (``controller`` itself when it is none)."""
    return controller.unwrapped if isinstance(controller, ControllerWrapper) else controller


def power_needed(controller: ClockController) -> PowerNeed | None:
    """What ``controller`` (a chain or a bare algorithm) says its domain needs to hold
    the SLO after its last decision; None when it cannot say (no model, no decision yet)."""
    return controller.power_needed() if isinstance(controller, PowerNeeding) else None


def controller_label(controller: object) -> str:
    """A short label for logs: the controller's ``name`` when it has one, else its type."""
    if isinstance(controller, Named) and controller.name:
        return controller.name
    return type(controller).__name__
