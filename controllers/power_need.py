"""The power a domain needs to hold its SLO, from an MPC's horizon problem, and the rule
that keeps a controller within a power budget (``docs/power-budget.md``).

:func:`need_from_problem` prices every clock of the controller's model held constant over
the horizon, from the state and load forecast of its last decision, with the MPC's own
prediction (:meth:`MPCProblem.costs` with one weight at a time): the TTFT and TPOT
penalties against the controller's targets, and the mean power. The lowest clock with no
penalty holds the SLO; its power is the need. The power limit in the problem plays no
part (its weight is zero), so the need ignores any cap.

:class:`BudgetGuard` applies a budget, the observation's ``power_limit_w`` (the node puts
the effective budget there), to the clock of the controller inside it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from gpugov.controllers.contract import ControllerWrapper, PowerNeed
from gpugov.plant.types import ClockController, ServingObservation

if TYPE_CHECKING:
    from gpugov.controllers.mpc.model import MPCProblem

HOLDS_TOLERANCE = 1e-12
"""A summed squared penalty at or below this counts as none (the SLO holds)."""
NEED_EVERY_S = 1.0
"""While the budget cannot bind (at least the model's peak power), :class:`BudgetGuard`
asks for the need at most once per this many seconds of observation time (for
publishing); a budget that can bind asks at every decision."""

MEASURED_RELEASE_SHARE = 0.9
"""With no model, :class:`BudgetGuard`'s measured-power cap rises again only while the
domain draws under this share of the budget (a hysteresis against the cap hunting)."""
MEASURED_RAISE_SHARE = 0.1
"""The share of the clock range the measured-power cap rises by per decision under
:data:`MEASURED_RELEASE_SHARE` of the budget."""

IDLE_UTILIZATION = 0.05
"""At most this GPU utilisation (the share of the period a kernel ran), a period with no
work in hand is taken for idle power: a request that came and went between two reads ran
kernels the engine's counts missed, whose power is no idle draw."""

Slipping = Literal["none", "ttft", "ttft+tpot"]


def need_from_problem(problem: MPCProblem, *, uncertainty_w: float = 0.0) -> PowerNeed:
    """The :class:`PowerNeed` of ``problem``: the lowest clock of the problem's profile
    whose constant plan has no TTFT and no TPOT penalty over the horizon, and its mean
    predicted power (domain watts). ``uncertainty_w``: one standard deviation to report
    with it (the model's, where it has one)."""
    from gpugov.controllers.mpc.model import MPCWeights

    # What the load needs at each clock held throughout, not what the safety chain's
    # dwell would keep applied for the first periods.
    problem = replace(problem, dwell_periods=0.0)
    profile = problem.plant.profile
    clocks = np.asarray(profile.clock_mhz, dtype=float)
    steps = problem.horizon_steps
    plans = np.repeat(clocks[:, None], steps, axis=1)
    zero = {
        "power": 0.0,
        "ttft": 0.0,
        "tpot": 0.0,
        "clock_change": 0.0,
        "constraint": 0.0,
        "terminal_backlog": 0.0,
    }

    def priced(term: str) -> np.ndarray:
        return np.asarray(
            replace(problem, weights=MPCWeights(**{**zero, term: 1.0})).costs(plans), dtype=float
        )

    ttft = priced("ttft")
    tpot = priced("tpot")
    maximum_power = float(max(profile.prefill_power_w[-1], profile.decode_power_w[-1]))
    watts = priced("power") * maximum_power / max(steps, 1)
    holding = np.flatnonzero((ttft <= HOLDS_TOLERANCE) & (tpot <= HOLDS_TOLERANCE))
    tpot_holding = np.flatnonzero(tpot <= HOLDS_TOLERANCE)
    index = int(holding[0]) if holding.size else clocks.size - 1
    tpot_index = int(tpot_holding[0]) if tpot_holding.size else clocks.size - 1
    return PowerNeed(
        watts=float(watts[index]),
        uncertainty_w=float(uncertainty_w),
        clock_mhz=float(clocks[index]),
        holds=bool(holding.size),
        tpot_clock_mhz=float(clocks[tpot_index]),
        clocks_mhz=tuple(float(c) for c in clocks),
        curve_w=tuple(float(w) for w in watts),
        # The most any clock draws: a table need not rise with the clock.
        peak_w=float(max(profile.prefill_power_w.max(), profile.decode_power_w.max())),
    )


class BudgetGuard(ControllerWrapper):
    """Keep the inner controller's clock within the domain's power budget, by the inner
    controller's own model (:meth:`power_needed`); degrade by a fixed rule when the
    budget is below the need.

    The budget is ``observation.power_limit_w`` (domain watts; the node puts the lowest
    of its budget sources there every tick). With the need ``N`` at the current load and
    the budget ``B``:

    * ``N <= B``: the inner decision, at most the *ceiling* (the highest clock whose
      predicted power fits ``B``), and lowered to the highest clock below that fits where
      its own power does not (a predicted power that does not rise with the clock);
    * ``N > B`` (over budget: the SLO cannot be held): that clock, raised to the TPOT
      clock where its power fits. The running requests keep the clock their TPOT needs
      while its power fits the budget (or a faster clock's does), and the queued
      requests' TTFT slips; only a budget below every such clock's power lets TPOT slip
      too (the clock is then the highest that fits).

    A tick without a budget passes through unchanged. A controller that reports no need
    (no model: ``max``, ``reactive``, the peers; ``mpc-online`` in its warm-up) is held
    by the power the domain measured over the last period instead
    (:meth:`_measured_cap`), judged above its idle draw (:attr:`idle_floor_w`): above the
    budget, the clock is capped at the clock that drew that power scaled by
    (budget - idle) / (power - idle) (power above idle grows at least in proportion to
    the clock, so each step closes most of the excess, and the cap is lowered again only
    once the clock has come down to it); with the power above idle under
    :data:`MEASURED_RELEASE_SHARE` of the budget above idle, the cap rises by
    :data:`MEASURED_RAISE_SHARE` of the clock range a decision until it lapses; with no
    power reading it lapses. The
    guard never raises a clock above
    the inner decision except over budget, to the TPOT clock or the slowest faster clock
    whose power fits.

    With ``enforce=False`` (the budget is only the GPUs' own power limit, which their
    firmware enforces) the guard prices the need and follows the over-budget state for
    the node's reports, and returns the inner decision unchanged.
    """

    def __init__(self, inner: ClockController, *, enforce: bool = True) -> None:
        super().__init__(inner)
        self.enforce = enforce
        """Whether the budget is held by the clock (False: only reported)."""
        self.last_need: PowerNeed | None = None
        """The inner controller's need at the last decision (None: unknown)."""
        self.last_budget_w: float | None = None
        """The budget the last decision was held to (None: none)."""
        self.over_budget = False
        """Whether the budget was below the need at the last decision."""
        self.slipping: Slipping = "none"
        """What the last decision lets slip: ``ttft`` (queued requests' first tokens) or
        ``ttft+tpot`` (the budget is below the running requests' clock too)."""
        self.capped_decisions = 0
        """Decisions the budget lowered."""
        self.over_budget_decisions = 0
        """Decisions made over budget (the need above the budget)."""
        self.need_errors = 0
        """Decisions whose need the inner controller could not give (it raised): they
        pass unchanged, as with no need."""
        self._need_time_s = -math.inf
        self.measured_cap_mhz: float | None = None
        """With no need reported, the clock the measured power holds the budget at (None:
        none binds)."""
        self.idle_floor_w: float | None = None
        """The lowest power the domain drew over a period with no work in hand (None: none
        seen yet): the part of its power no clock removes."""
        self._had_work = True

    def __call__(self, observation: ServingObservation) -> float:
        decision = float(self.inner(observation))
        budget = observation.power_limit_w
        if budget is not None and not (np.isfinite(budget) and budget > 0.0):
            budget = None
        # Every tick, whoever decides: a period is idle when it and the one before it had
        # no work in hand (the power read is the period's mean).
        idle_period = not (self._had_work or observation.has_work)
        self._had_work = observation.has_work
        need = self._need(observation.time_s, budget)
        self.last_need = need
        self.over_budget = False
        self.slipping = "none"
        if need is None and budget is not None and self.enforce:
            self.last_budget_w = float(budget)
            cap = self._measured_cap(observation, float(budget), idle_period)
            power = observation.power_w
            self.over_budget = power is not None and math.isfinite(power) and power > budget
            if cap is not None and cap < decision - 1e-9:
                self.capped_decisions += 1
                return cap
            return decision
        self.measured_cap_mhz = None
        if need is None or budget is None:
            self.last_budget_w = None
            return decision
        self.last_budget_w = float(budget)
        guarded = min(decision, need.ceiling_mhz(budget))
        if not need.fits_at(guarded, budget):
            # A clock below the ceiling may draw more than it (a curve that does not
            # rise with the clock): the highest one at or below that fits.
            guarded = need.ceiling_mhz(budget, guarded)
        if not need.fits(budget):
            self.over_budget = True
            self.over_budget_decisions += 1
            guarded = max(guarded, need.tpot_floor_mhz(budget))
            self.slipping = "ttft" if guarded >= need.tpot_clock_mhz - 1e-9 else "ttft+tpot"
        if not self.enforce:
            return decision
        if guarded < decision - 1e-9:
            self.capped_decisions += 1
        return guarded

    def measured_ceiling(self, observation: ServingObservation) -> float | None:
        """The clock the domain's measured power holds an enforced budget at (None: none
        binds): the node's fail-safe, which decides without the controller, holds the
        budget by it as a controller with no model is held."""
        budget = observation.power_limit_w
        if not self.enforce or budget is None or not (np.isfinite(budget) and budget > 0.0):
            return None
        return self._measured_cap(observation, float(budget))

    def _measured_cap(
        self, observation: ServingObservation, budget: float, idle_period: bool = False
    ) -> float | None:
        """The clock the domain's measured power (``power_w``, the last period's mean at
        the clock applied then) holds ``budget`` at, for a controller with no model;
        None where none binds or there is no reading."""
        clocks = sorted(float(c) for c in observation.supported_clocks_mhz)
        power = observation.power_w
        applied = observation.requested_clock_mhz
        cap = self.measured_cap_mhz
        if not clocks or power is None or not math.isfinite(power) or power <= 0.0:
            # No reading to hold the budget by: no cap (the GPUs' own limit still holds).
            self.measured_cap_mhz = None
            return None
        busy = observation.gpu_utilization
        if idle_period and (busy is None or busy <= IDLE_UTILIZATION):
            # A whole period with no work in hand, and no kernel running by the GPUs'
            # own count where they give one: its power is the domain's idle draw.
            self.idle_floor_w = min(power, self.idle_floor_w or math.inf)
        # The clock moves only the power above the idle draw: the excess and the
        # headroom are judged there (a board idling near its budget otherwise never read
        # under 90 % of it, and a cap once lowered was kept for good).
        floor = self.idle_floor_w or 0.0
        floor = floor if floor < budget else 0.0
        if applied is None or not math.isfinite(applied):
            applied = clocks[-1] if cap is None else cap
        if power > budget and (cap is None or applied <= cap + 1e-9):
            # Scaled from the clock that drew the power; a cap the chain has not brought
            # the clock down to yet (its dwell) waits for a reading taken there.
            wanted = applied * (budget - floor) / max(power - floor, 1e-9)
            index = int(np.searchsorted(clocks, wanted + 1e-9, side="right"))
            cap = clocks[max(index - 1, 0)]
        elif cap is not None and power - floor <= MEASURED_RELEASE_SHARE * (budget - floor):
            raised = cap + MEASURED_RAISE_SHARE * (clocks[-1] - clocks[0])
            # The clock at or above it: on a coarse grid a step inside a gap still moves.
            index = int(np.searchsorted(clocks, raised - 1e-9, side="left"))
            cap = None if index >= len(clocks) - 1 else clocks[index]
        self.measured_cap_mhz = cap
        return cap

    def _need(self, time_s: float, budget: float | None) -> PowerNeed | None:
        """The inner controller's need now, or the last one while it is younger than
        :data:`NEED_EVERY_S` and ``budget`` cannot bind (at least its peak power): pricing
        every clock costs a few milliseconds, the decision often less."""
        last = self.last_need
        if (
            last is not None
            and last.peak_w is not None
            and (budget is None or budget >= last.peak_w)
            and 0.0 <= time_s - self._need_time_s < NEED_EVERY_S
        ):
            return last
        try:
            need = self.power_needed()
        except Exception:  # the controller's own estimate never costs the decision
            self.need_errors += 1
            need = None
        self._need_time_s = time_s
        return need


__all__ = ["HOLDS_TOLERANCE", "NEED_EVERY_S", "BudgetGuard", "need_from_problem"]
