"""The measured-latency rules of ``mpc-online``: what it lays over the MPC's decision from
the engine's own latencies and queue, where the learned model alone would be too slow or
too unsure (``docs/online.md``).

* the **burst guard** (:meth:`MeasuredLatencyRules.burst_floor`): while a prompt backlog
  is prefilled, the lowest clock that drains it within the TTFT target and, beside
  decoding requests, whose mixed iteration fits the TPOT SLO;
* the **decode descent** (:meth:`MeasuredLatencyRules.descent_window`): in a decode-only
  window, the lower clocks the measured latency and the 1/f law allow, and across a coarse
  grid's gap, which that law never crosses, the clock below
  (:meth:`MeasuredLatencyRules.coarse_step`);
* the **idle parking** of an idle GPU (:meth:`MeasuredLatencyRules.idle_prefill_clock`):
  a prefill pool's, and a colocated GPU's, which caps the MPC's decision past the warm-up;
* the attainment budget's view the rules read (looseness, spending, the trusted ``z``).

:class:`MeasuredLatencyRules` is a mixin of
:class:`~controllers.online.controller.OnlineMPCController`, which owns the state it
declares; the rules are kept apart from the model, the MPC and the control flow.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.adaptation import SLOFeedback
from gpugov.controllers.budget import AttainmentBudget, loosened
from gpugov.controllers.mpc.model import CHUNK_TOKENS
from gpugov.controllers.online.exploration import ArrivalClumping, BacklogAge, SafeExploration
from gpugov.controllers.online.identification import OnlineModel
from gpugov.controllers.online.learned_plant import published_kv_capacity
from gpugov.plant.types import ServingObservation

FloatArray = NDArray[np.float64]

PARK_MEMORY_S = 60.0
"""How long a measured latency pressure counts for idle parking (the last one measured
counts until a newer one comes: a long idle gap measures nothing)."""

WARMUP_DRAIN_BUSY_S = 1.0
"""Busy windows, in seconds, a prefill pool's warm-up fits before its burst guard prices a
backlog below the top clock (:meth:`MeasuredLatencyRules.warmup_drains`)."""

ARRIVAL_FLOOR_PERIODS = 1.0
"""The arrival floor (:meth:`MeasuredLatencyRules.arrival_floor`) applies where the TTFT
SLO measured is shorter than this many control periods (no decision after an arrival
comes in time)."""


class MeasuredLatencyRules:
    """The burst guard, the decode descent and an idle GPU's parking (module
    notes), over the state :class:`~controllers.online.controller.OnlineMPCController`
    keeps: the learned model, the exploration policy, the arrival and backlog trackers
    and the attainment budget."""

    model: OnlineModel | None
    exploration: SafeExploration
    clumping: ArrivalClumping
    backlog_age: BacklogAge
    budget: AttainmentBudget | None
    slo_margin: float
    uncertainty_z: float
    control_period_s: float
    burst_guard: bool
    mean_prompt_tokens: float
    mean_output_tokens: float
    _prefill_pressures: deque[tuple[float, float, float, float]]
    _decode_pressures: deque[tuple[float, float, float, float]]
    _last_requested_mhz: float | None
    _decode_park_cache: tuple[tuple[object, ...], float] | None
    pooled_waiting: float
    """Requests waiting on all the engines the last observation pooled (the rules see one
    engine's view, :mod:`controllers.online.engines`)."""

    @property
    def looseness(self) -> float:
        """The attainment budget's applied looseness (1 without an SLO target)."""
        return 1.0 if self.budget is None else self.budget.applied_looseness

    @property
    def spending(self) -> bool:
        """Whether the attainment budget is ahead of its target (:attr:`AttainmentBudget.ahead`):
        the back-off and the burst guard's short-answer rule, hedges against model error
        and unseen mixes, stand down while the measured misses leave the budget unspent
        (``docs/online.md``, "Spending the SLO budget"). False without an SLO target."""
        return self.budget is not None and self.budget.ahead

    @property
    def overspent(self) -> bool:
        """Whether the attainment budget's window is overspent and still missing
        (:attr:`AttainmentBudget.overspent`). False without an SLO target."""
        return self.budget is not None and self.budget.overspent

    @property
    def effective_z(self) -> float:
        """``uncertainty_z`` over the looseness: the model is trusted more while the
        measured attainment is ahead of its target."""
        return self.uncertainty_z / self.looseness

    @property
    def context_tokens(self) -> float:
        """Mean context of a running request the learned profile is read at: the declared
        prompt plus half the declared output."""
        return self.mean_prompt_tokens + 0.5 * self.mean_output_tokens

    def idle_prefill_clock(
        self, observation: ServingObservation, slos: tuple[float, float] | None
    ) -> float | None:
        """The clock an idle GPU parks at, or None where parking does not apply: the
        lowest clock the measured TTFT (and, but in a prefill pool, TPOT) allows: its
        clock in the warm-up (which otherwise holds the top clock, idle or not), and past
        it a cap on the MPC's decision, whose fluid model prices a prompt arriving in an
        idle period as prefilled at that period's clock and so idles high where prompts
        are long (a prefill pool parked at its lowest clock takes that as its decision).

        A prompt that arrives meanwhile runs at most one control period at the parked
        clock before the next decision raises it. By the 1/f law from the top clock (an
        upper bound on the latency wherever a measurement was taken lower) the period at
        ``f`` delays that prompt by at most the period times ``1 - f / f_top``, which must
        keep the worst TTFT measured over the last :data:`PARK_MEMORY_S` under the
        exploration threshold (loosened while the attainment budget is ahead). On a
        colocated GPU the prompt's first tokens decode there, so ``f`` is also no lower
        than where the worst TPOT of the last :data:`PARK_MEMORY_S` would meet it (and
        it parks only once a TTFT and a TPOT have been measured). An idle decode pool
        (role ``decode``) parks by the TPOT half alone (:meth:`_decode_park_bound`), once
        a TPOT has been measured: it prefills nothing, and a request that arrives decodes
        at most a period at ``f``. It needs no model, so it applies in the warm-up too.
        The pressures of the last :data:`PARK_MEMORY_S` count, or the last one measured
        where none is that recent."""
        ttft_ratio, tpot_ratio = SLOFeedback.latency_ratios(observation)
        slo_s = observation.ttft_recent_slo_s
        model = self.model
        assert model is not None
        top = float(model.clocks_mhz[-1])
        requested = observation.requested_clock_mhz
        current = top if requested is None or not math.isfinite(requested) else float(requested)
        # Measured at no more than the higher of this window's clock and the last one's.
        measured_at = max(current, self._last_requested_mhz or current)
        if ttft_ratio is not None and slo_s is not None and slo_s > 0.0:
            # The measured TTFT pressure, and what one period adds to it, at the SLO it
            # was measured at (with its per-prompt allowance).
            self.remember_ttft_pressure(
                observation.time_s, ttft_ratio, self.control_period_s / slo_s, measured_at
            )
        if tpot_ratio is not None:
            self._decode_pressures.append(
                (observation.time_s, tpot_ratio, measured_at, max(observation.decode_active, 1.0))
            )
        self._last_requested_mhz = current
        horizon = observation.time_s - PARK_MEMORY_S
        while len(self._prefill_pressures) > 1 and self._prefill_pressures[0][0] < horizon:
            self._prefill_pressures.popleft()
        while len(self._decode_pressures) > 1 and self._decode_pressures[0][0] < horizon:
            self._decode_pressures.popleft()
        if slos is None or observation.has_work:
            return None
        # An idle window measures nothing: the worst of the last minute.
        threshold = loosened(self.exploration.explore_threshold, self.looseness)
        clocks = model.clocks_mhz
        if observation.role == "decode":
            # A decode pool prefills nothing: a request arriving decodes at most a period
            # at the parked clock, which the worst TPOT's 1/f bound covers.
            if not self._decode_pressures:
                return None
            bound = self._decode_park_bound(threshold)
            if bound >= top:
                return None
            parked = _first_fit(clocks, clocks >= bound - 1e-9)
            return parked if parked < top else None
        if not self._prefill_pressures:
            return None
        # The share of the top clock each bound needs: TTFT's (an arriving prompt's),
        # TPOT's (not in a prefill pool) from ratio / x <= threshold.
        needed = self._arrival_park_share(threshold)
        if observation.role != "prefill":
            if not self._decode_pressures:
                return None
            needed = max(needed, max(sample[1] for sample in self._decode_pressures) / threshold)
        if needed >= 1.0:
            return None
        parked = _first_fit(clocks, clocks >= top * needed - 1e-9)
        return parked if parked < top else None

    def remember_ttft_pressure(
        self, time_s: float, ratio: float, share: float, clock_mhz: float = math.inf
    ) -> None:
        """Keep a measured TTFT pressure (``ratio`` of its SLO, one period being ``share``
        of that SLO, measured at no more than ``clock_mhz``; unknown: the top clock) for
        :data:`PARK_MEMORY_S`."""
        self._prefill_pressures.append((time_s, ratio, share, clock_mhz))

    def _arrival_park_share(self, threshold: float, *, past_period_only: bool = False) -> float:
        """The share of the top clock a prompt arriving in the coming period needs, run
        at that clock until the next decision: from ``ratio + share * (1 - x) <=
        threshold`` over the TTFT pressures of the last :data:`PARK_MEMORY_S` (-inf with
        none). Idle parking holds it; with ``past_period_only`` (the decode descent where
        arrivals come alone), over the pressures of SLOs shorter than
        :data:`ARRIVAL_FLOOR_PERIODS` periods alone, as the arrival floor: where the SLO
        spans more, a later decision (the burst guard, seeing the backlog) raises the
        clock in time."""
        return max(
            (
                1.0 - (threshold - ratio) / share
                for _, ratio, share, _ in self._prefill_pressures
                if not past_period_only or share * ARRIVAL_FLOOR_PERIODS > 1.0
            ),
            default=-math.inf,
        )

    def _decode_park_bound(self, threshold: float) -> float:
        """The lowest clock an idle decode pool may park at by the TPOTs of the last
        :data:`PARK_MEMORY_S`. A TPOT measured at clock ``c`` at pressure ``p`` keeps every
        clock from ``c * p / threshold`` up under the threshold at that window's load (the
        1/f law from where it was measured, not from the top clock); the bound is the
        highest over the windows, each lowered by any window that decoded at least as
        many requests at a lower clock within the threshold (a decode iteration is no
        slower with fewer requests). So a memory-bound decode the descent measured low
        parks low, where the 1/f law from the top held an idle pool far above the clock
        its busy windows had just decoded at; a window at or over the threshold keeps its
        own bound."""
        pressures = self._decode_pressures
        key = (threshold, len(pressures), pressures[0], pressures[-1])
        if self._decode_park_cache is not None and self._decode_park_cache[0] == key:
            # Idle ticks add no TPOT: the bound of the last idle tick stands (a pass over
            # every pair of the minute's windows costs about 0.3 ms).
            return self._decode_park_cache[1]
        samples = np.array([sample[1:] for sample in pressures])
        ratio, clock, batch = samples[:, 0], samples[:, 1], samples[:, 2]
        bound = clock * ratio / threshold
        covers = (
            (batch[None, :] >= batch[:, None])
            & (clock[None, :] < clock[:, None])
            & (ratio[None, :] < threshold)
            & (ratio[:, None] < threshold)
        )
        lowered = np.where(covers, bound[None, :], np.inf).min(axis=1)
        value = float(np.minimum(bound, lowered).max())
        self._decode_park_cache = (key, value)
        return value

    def warmup_drains(self, observation: ServingObservation) -> bool:
        """Whether the burst guard prices a backlog in the warm-up: a prefill pool's,
        once :data:`WARMUP_DRAIN_BUSY_S` of busy windows have been fitted, while the
        measured TTFT leaves the pool no parking anyway (:meth:`prefill_pool_parks`): in
        the warm-up an idle pool that does not park idles at the top clock, which costs
        more than a lower clock on its prompts saves."""
        model = self.model
        return (
            self.burst_guard
            and observation.role == "prefill"
            and model is not None
            and int(model.visits.sum()) * self.control_period_s >= WARMUP_DRAIN_BUSY_S
            and bool(self._prefill_pressures)
            and not self.prefill_pool_parks()
        )

    def prefill_pool_parks(self) -> bool:
        """Whether an idle prefill pool parks now (:meth:`idle_prefill_clock`): a TTFT
        has been measured, and the worst of the last :data:`PARK_MEMORY_S` plus a period
        stays under the threshold."""
        if not self._prefill_pressures:
            return False
        threshold = loosened(self.exploration.explore_threshold, self.looseness)
        return max(ratio + share for _, ratio, share, _ in self._prefill_pressures) <= threshold

    def park_share(self, observation: ServingObservation) -> float | None:
        """The share of the TTFT SLO a prompt may take and still leave an idle prefill
        pool free to park (:meth:`idle_prefill_clock`): the parking threshold less what
        one period adds at the SLO measured; None before a TTFT SLO is measured."""
        slo_s = observation.ttft_recent_slo_s
        if slo_s is None or not slo_s > 0.0:
            return None
        threshold = loosened(self.exploration.explore_threshold, self.looseness)
        return max(0.0, threshold - self.control_period_s / slo_s)

    def arrival_floor(self, observation: ServingObservation) -> float:
        """The lowest clock at which a prompt arriving in the coming period still meets
        its TTFT SLO where that SLO is shorter than :data:`ARRIVAL_FLOOR_PERIODS` control
        period (the lowest clock elsewhere, before such a TTFT is measured, and in a
        decode pool, which prefills nothing).

        A prompt arriving now is prefilled at the clock chosen now until the next
        decision, which comes too late where the SLO is shorter than the period: the
        decode descent and the MPC's fluid model (which spreads the expected prompts over
        its horizon) otherwise lower the clock in decode-only windows where one arriving
        misses before any decision can raise it. Latency grows at most like 1/f, so a
        prompt whose TTFT measured at ``f`` is ``ratio`` of its SLO meets the SLO from
        ``ratio * f`` up to ``f``: the floor is the highest such clock over the TTFT
        pressures of the last :data:`PARK_MEMORY_S` (``f`` the higher of the window's
        clock and the one before; one at or over its SLO holds the top clock). Where the
        SLO spans more than a period, a later decision (the burst guard, seeing the
        backlog) still has time to act, and a window's worst mean TTFT (a burst's queueing
        included) overstates a lone arrival's: no floor. ``idle_prefill_clock`` records the
        pressures and runs first at every decision."""
        model = self.model
        assert model is not None
        clocks = model.clocks_mhz
        top = float(clocks[-1])
        if observation.role == "decode":
            return float(clocks[0])
        # A TTFT at ``ratio`` of its SLO measured at ``f`` meets the SLO from ``ratio * f``
        # up to ``f`` (1/f); one at or over its SLO bounds nothing below the top clock.
        needed = max(
            (
                ratio * min(clock, top) if ratio < 1.0 else top
                for _, ratio, share, clock in self._prefill_pressures
                if share * ARRIVAL_FLOOR_PERIODS > 1.0
            ),
            default=-math.inf,
        )
        if needed <= float(clocks[0]):
            return float(clocks[0])
        return _first_fit(clocks, clocks >= needed - 1e-9)

    def descent_clock(
        self, observation: ServingObservation, slos: tuple[float, float]
    ) -> float | None:
        """The decode descent's clock (:meth:`descent_window`), or None where it does
        not apply."""
        window = self.descent_window(observation, slos)
        return None if window is None else window[1]

    def descent_window(
        self, observation: ServingObservation, slos: tuple[float, float]
    ) -> tuple[float, float] | None:
        """``(bound, clock)`` for a decode-only window, or None where it does not apply:
        the lowest clock the measured latency allows, and the descent's clock.

        While the GPU only decodes (no prompt tokens waiting or being prefilled) and the
        window measured its latencies at pressure ``p`` (max of TTFT/SLO and TPOT/SLO) at
        the applied clock ``f``, every clock from ``f * p / threshold`` up keeps them
        under the exploration threshold (latency grows at most like 1/f): a bound that
        needs no model. Among those clocks it picks the one with the least decode energy
        per iteration by the model's optimistic prediction (mean power times the
        iteration time at mean - ``uncertainty_z`` std, at the running batch): clocks
        never visited look cheap and get tried, visited ones are priced by evidence.
        Where arrivals come together (:class:`ArrivalClumping`) it stays at or above the
        clock whose mixed iteration fits the TPOT SLO, as an idle GPU parks there (not in
        a decode pool of disaggregated serving, where no prompt is prefilled). Across a
        coarse grid's gap the clock below is allowed too (:meth:`coarse_step`), and taken
        outright until the model has seen it. Where arrivals clump
        (:class:`ArrivalClumping`; or before that is known) or the TTFT SLO is shorter than
        a period, the bound is no lower than an idle GPU's parking allows a prompt
        arriving in the coming period (:meth:`_arrival_park_share`)."""
        if (
            observation.prefill_remaining_tokens > 0.0
            or observation.waiting_requests > 0
            or observation.decode_active <= 0
        ):
            return None
        pressure = self.exploration.pressure(observation)
        applied = observation.requested_clock_mhz
        if pressure is None or applied is None or not pressure > 0.0:
            return None
        model = self.model
        assert model is not None
        bound = applied * pressure / self.exploration.explore_threshold
        clocks = model.clocks_mhz
        if observation.role != "decode":
            # A prompt arriving in the coming period runs at the descended clock until the
            # next decision: where the period outlasts the TTFT SLO, the prompts arriving
            # over it queue there (at a 5 s period and a 1 s SLO the lowest clock missed
            # it), and where arrivals clump a second prompt can queue behind the first
            # there: the descent holds an idle GPU's parking bound. Where prompts come
            # alone and the SLO spans more than a period, the burst guard raises the clock
            # in time, and the bound from the last minute's worst TTFT (a long prompt's
            # queueing) held decode up for nothing. Before the clumping is known (a
            # restored model decides from its first tick) the bound is held. A decode
            # pool prefills nothing.
            threshold = loosened(self.exploration.explore_threshold, self.looseness)
            alone = self.clumping.share is not None and not self.clumping.clumped
            share = self._arrival_park_share(threshold, past_period_only=alone)
            bound = max(bound, float(clocks[-1]) * share)
        table = model.table(
            clocks * model.realized_ratio, float(observation.decode_active), self.context_tokens
        )
        mean, std = table["decode_iteration_s"]
        optimistic = np.maximum(mean - self.uncertainty_z * std, 1e-9)
        energy = table["decode"][0] * optimistic
        allowed = clocks >= bound - 1e-9
        gap = self.coarse_step(observation, applied, bound, table)
        if gap is not None:
            # A coarse grid: the clock across the gap below the applied one, one period at
            # a time; a probe until the model has seen it (its prior prices it 1/f slower,
            # so the energy pick below would never try it).
            visits = model.visits[int(np.searchsorted(clocks, gap - 1e-9))]
            if visits < self.exploration.minimum_visits:
                return gap, gap
            allowed |= clocks >= gap - 1e-9
        elif self.clumping.clumped and observation.role != "decode":
            # A decode pool prefills nothing: arrivals join its batch without a chunk.
            mixed = self._mixed_iteration_s(observation, table, clocks * model.realized_ratio)
            allowed &= clocks >= float(_first_fit(clocks, mixed <= slos[1]))
        candidates = np.flatnonzero(allowed)
        if not candidates.size:
            return None
        chosen = candidates[int(np.argmin(energy[candidates]))]
        return float(clocks[candidates[0]]), float(clocks[chosen])

    def coarse_step(
        self,
        observation: ServingObservation,
        applied_mhz: float,
        bound_mhz: float,
        table: dict[str, tuple[FloatArray, FloatArray]],
    ) -> float | None:
        """The supported clock just below ``applied_mhz`` where the grid leaves a gap the
        decode descent cannot cross, or None: its 1/f bound excludes that clock, which lies
        farther below than the exploration's longest step (a board of a few clocks, such
        as 345 and 1,980 MHz, whose 1/f bound from the top never reaches the lowest).

        On a fine grid the descent measures its way down clock by clock; across such a gap
        it would hold the applied clock for good, and the model, whose prior takes an
        unvisited clock as 1/f slower, never learns the lower one. The step is taken one
        decode-only window at a time (the next decision raises the clock for a prompt),
        past the warm-up, while the measured latency has slack and the SLO window can
        afford one more miss (:attr:`AttainmentBudget.affordable`; never without an SLO
        target), and while the worst TTFT of the last minute plus what one period at that
        clock adds to an arriving prompt (the 1/f law from the top, as an idle GPU parks)
        stays under the threshold. Once the model has ``minimum_visits`` windows there,
        its pessimistic decode iteration at the running batch (mean + ``z`` std, over the
        applied clock's mean) must also keep the measured TPOT under the threshold; before
        that each window there is a probe, whose latency the back-off watches. The
        short-answer floor of clumped arrivals rounds up to the clock above on such a grid
        and is not applied with the step: the budget pays for a short reply landing in it.
        """
        model = self.model
        if model is None:
            return None
        clocks = model.clocks_mhz
        below = np.flatnonzero(clocks < applied_mhz - 1e-9)
        if not below.size:
            return None
        index = int(below[-1])
        lower = float(clocks[index])
        span = float(clocks[-1] - clocks[0])
        exploration = self.exploration
        if (
            bound_mhz >= applied_mhz - 1e-9  # no slack: the measured latency allows no lower
            or lower >= bound_mhz - 1e-9  # the descent's own bound reaches it
            or applied_mhz - lower <= exploration.largest_step_fraction * span + 1e-9
        ):
            return None
        budget = self.budget
        if not model.warmed_up or budget is None or not budget.affordable:
            return None
        threshold = exploration.explore_threshold
        if lower < exploration.backoff_floor(clocks) - 1e-9 or not self._prefill_pressures:
            return None
        delay = 1.0 - lower / float(clocks[-1])
        if max(ratio + share * delay for _, ratio, share, _ in self._prefill_pressures) > threshold:
            return None
        if model.visits[index] >= exploration.minimum_visits:
            _, tpot_ratio = SLOFeedback.latency_ratios(observation)
            mean, std = table["decode_iteration_s"]
            applied = int(np.flatnonzero(clocks <= applied_mhz + 1e-9)[-1])
            slower = (mean[index] + self.effective_z * std[index]) / max(mean[applied], 1e-9)
            if tpot_ratio is not None and tpot_ratio * max(1.0, slower) > threshold:
                return None
        return lower

    def _mixed_iteration_s(
        self,
        observation: ServingObservation,
        table: dict[str, tuple[FloatArray, FloatArray]],
        realized_mhz: FloatArray,
    ) -> FloatArray:
        """Pessimistic seconds of one mixed iteration (the running batch's decode plus a
        prefill chunk, each at mean + ``uncertainty_z`` std; a prefill pool's chunk alone)
        per clock of ``table`` (read at the running batch), made non-increasing in the
        clock."""
        z = self.effective_z
        prefill_mean, prefill_std = table["prefill_s_per_token"]
        mixed = _chunk_tokens(observation) * (prefill_mean + z * prefill_std)
        if observation.role != "prefill":
            # A prefill pool decodes nothing: its iterations are prefill chunks alone.
            decode_mean, decode_std = table["decode_iteration_s"]
            mixed = mixed + decode_mean + z * decode_std
        # Physics: no iteration gets faster at a lower clock, nor slower than 1/f.
        return _physical(mixed, realized_mhz)

    def burst_floor(
        self,
        observation: ServingObservation,
        slos: tuple[float, float],
        target_share: float | None = None,
    ) -> float | None:
        """The lowest clock for a prompt backlog, or None when none waits and none is
        expected sooner than the next decision. ``slos``: (TTFT SLO, TPOT SLO), seconds.

        With more than one chunk of prompt tokens waiting, every iteration carries a
        prefill chunk until the backlog is drained. Two limits follow, each at the
        pessimistic mixed iteration (decode iteration at the running batch plus the
        chunk's prefill, each at mean + ``uncertainty_z`` std):

        * **drain**: the backlog, chunk by chunk, must be prefilled within the MPC's TTFT
          target (``slo_margin`` times the TTFT SLO, the margin scaled by the attainment
          budget's looseness) less the time its oldest prompt has already waited
          (:class:`BacklogAge`, from the prompt counter and the backlog: the deadline does
          not slide by a period at every tick); where one prompt waits, plus its per-prompt
          allowance, behind several the flat SLO, as the last may be short; or, where
          several wait, each prompt by its own deadline (:meth:`_drains_in_order`) at a
          clock whose mixed iteration meets the TPOT SLO (the longer drain's iterations
          are the decoding replies'); a backlog only the top clock drains in time needs
          the top clock, where the MPC's capped TTFT penalty would give it up;
        * **short answers**: beside decoding requests (or other waiting prompts, which
          decode beside the rest), a short answer gets all its tokens from mixed
          iterations, so its TPOT is the mixed iteration's time: that must fit the
          TPOT SLO. This one is a hedge for the few short answers that land in a burst:
          it stands down while the attainment budget is ahead (:attr:`spending`).

        The result is the lowest supported clock meeting both, the maximum when none
        does. An idle GPU parks at the short-answer clock too where arrivals often come
        together (:class:`ArrivalClumping`): a clump arriving unannounced is served at
        the parked clock until the next decision, and a locked clock costs an idle GPU
        little.
        (Not where no clock meets the short-answer limit, a board whose prefill chunk alone
        outlasts the TPOT SLO: the top clock would not save them.)
        Where the waiting prompts do not fit the room the engine's published KV cache has
        left, the top clock: they are admitted only as running replies finish, which the
        drain by the prefill rate leaves out (a lower clock held them queued longer); not
        on a prefill pool, whose cache the transfers free.

        ``target_share``, where given, is a tighter share of the flat SLO to drain within
        (a prefill pool's warm-up keeps the measured TTFT under its parking threshold,
        :meth:`park_share`), applied only where the top clock drains within it.
        """
        ttft_slo_s, tpot_slo_s = slos
        backlog = observation.prefill_remaining_tokens
        if observation.role != "prefill" and _waits_for_cache(observation):
            # Prompts the cache has no room for are admitted only as the running replies
            # finish and free theirs: decoding faster is what drains them, whatever a
            # drain by the prefill rate alone would allow. (A prefill pool's cache is
            # freed by the transfers to the decode pool, which its clock does not hasten.)
            assert self.model is not None
            return float(self.model.clocks_mhz[-1])
        # A pool of disaggregated serving is judged on one phase: no short answers decode
        # beside a prefill chunk there.
        colocated = observation.role not in ("prefill", "decode")
        idle = colocated and not observation.has_work and self.clumping.clumped
        draining = backlog > CHUNK_TOKENS
        others = colocated and (observation.decode_active > 0 or observation.waiting_requests > 1)
        budget = self.budget
        exposed = (
            colocated
            and budget is not None
            and budget.remaining < 1.0
            and budget.last is not None
            and budget.last.tpot_misses >= 0.5
        )
        if not (idle or draining or exposed):
            return None
        model = self.model
        assert model is not None
        batch = max(1.0, float(observation.decode_active))
        chunk = _chunk_tokens(observation)
        clocks = model.clocks_mhz
        realized = clocks * model.realized_ratio
        table = model.table(realized, batch, self.context_tokens)
        mixed = self._mixed_iteration_s(observation, table, realized)
        fits = np.ones(clocks.size, dtype=bool)
        spent = exposed and not draining
        if (idle or others) and not self.spending and not spent:
            short = mixed <= tpot_slo_s
            if idle and not draining and not short.any():
                # No clock would give a clump's short answers their TPOT: parking an idle
                # GPU at the top clock for them would only cost power.
                return None
            fits &= short
        if spent:
            assert budget is not None
            recent = budget.recent
            if budget.remaining < 0.0 and recent is not None and recent.tpot_misses >= 0.5:
                # Past the window's budget and still missing on TPOT: the misses came at
                # clocks the learned mean judged to fit, so it is not trusted while they
                # go on.
                return float(clocks[-1])
            # No miss left in the window: a prompt landing in this window is prefilled at
            # this clock, beside the replies decoding, until the next decision raises it.
            # Those mixed iterations may be no slower than the SLO or the top clock's.
            typical = _physical(
                chunk * table["prefill_s_per_token"][0] + table["decode_iteration_s"][0], realized
            )
            fits &= typical <= max(tpot_slo_s, float(typical[-1])) + 1e-12
        if draining:
            share = min(1.0, self.slo_margin * self.looseness)
            drained = self._drains(observation, mixed, share * ttft_slo_s, tpot_slo_s)
            if target_share is not None and target_share < share:
                # Within the tighter share where the top clock drains in it (and so
                # keeps what it is kept for); where not even the top clock does, that is
                # lost at any clock, and the margin's drain stands.
                kept = self._drains(observation, mixed, target_share * ttft_slo_s, tpot_slo_s)
                if kept[-1]:
                    drained = kept
            fits &= drained
        return _first_fit(clocks, fits)

    def _drains(
        self,
        observation: ServingObservation,
        mixed: FloatArray,
        flat_target_s: float,
        tpot_slo_s: float,
    ) -> NDArray[np.bool_]:
        """Per clock, whether the backlog drains, chunk by chunk at ``mixed`` seconds an
        iteration, within ``flat_target_s`` of the flat TTFT SLO (:meth:`burst_floor`)."""
        backlog = observation.prefill_remaining_tokens
        chunk = _chunk_tokens(observation)
        budget = self.budget
        # The oldest waiting prompt has waited ``backlog_age.age_s`` already.
        target = flat_target_s - self.backlog_age.age_s
        if max(observation.waiting_requests, self.pooled_waiting) <= 1:
            # One prompt waits: its own per-prompt allowance is known (the whole
            # backlog). Behind several, the last may be short: the flat SLO. (In a
            # pool of engines, one waiting in the pool: the view's share of two
            # waiting prompts is one, but either may be the busiest engine's.)
            credit = 1.0 if budget is None else budget.allowance_credit
            target += credit * (observation.ttft_slo_per_prompt_token_s or 0.0) * backlog
        drained = math.ceil(backlog / chunk) * mixed <= target
        # Prompts priced alike is an estimate, and one misjudged drain can cost every
        # waiting prompt: each by its own deadline only while the SLO window could
        # afford them all.
        if budget is None or budget.remaining >= budget.exposed:
            in_order = self._drains_in_order(backlog, chunk, mixed, target)
            if in_order is not None:
                if observation.role != "prefill":
                    # The longer drain's mixed iterations are the decoding replies'.
                    in_order &= mixed <= tpot_slo_s
                drained |= in_order
        return np.asarray(drained)

    def _drains_in_order(
        self, backlog: float, chunk: float, mixed: FloatArray, target: float
    ) -> NDArray[np.bool_] | None:
        """Per clock, whether the waiting prompts, prefilled first in first out, each get
        their first token within ``target`` (from the oldest's age) counted from its own
        arrival: the ``k``-th of ``w`` needs the first ``k / w`` of the backlog done by
        then (the prompts priced alike, as the node's backlog prices them). None where
        they all arrived in one period: the oldest's deadline is every prompt's."""
        groups = self.backlog_age.arrival_groups()
        if len(groups) < 2:
            return None
        count = float(groups[-1][0])
        oldest = self.backlog_age.age_s
        done = np.array([k for k, _ in groups], dtype=float) / count
        slack = target + oldest - np.array([age for _, age in groups])
        chunks = np.ceil(backlog * done / chunk)
        return np.asarray((chunks[:, None] * mixed[None, :] <= slack[:, None]).all(axis=0))


def _waits_for_cache(observation: ServingObservation) -> bool:
    """Whether prompts wait that the engine's published KV cache has no room for beside
    what it holds: their wait ends only as running requests finish (the engine admits a
    prompt only where its tokens fit the cache)."""
    capacity = published_kv_capacity(observation)
    return (
        capacity is not None
        and observation.waiting_requests > 0
        and observation.kv_tokens + observation.prefill_remaining_tokens > capacity
    )


def _chunk_tokens(observation: ServingObservation) -> float:
    """Prompt tokens one iteration prefills: the chunk budget less a token per running
    request (at least one counted), the whole budget on a prefill pool (no decode)."""
    if observation.role == "prefill":
        return CHUNK_TOKENS
    return max(CHUNK_TOKENS - max(1.0, float(observation.decode_active)), 32.0)


def _first_fit(clocks: FloatArray, fits: NDArray[np.bool_]) -> float:
    """The lowest clock where ``fits`` holds, the top clock when it holds nowhere."""
    within = np.flatnonzero(fits)
    return float(clocks[within[0]]) if within.size else float(clocks[-1])


def _physical(times: FloatArray, realized_mhz: FloatArray) -> FloatArray:
    """Pessimistic seconds per clock (ascending ``realized_mhz``) held to the physics:
    non-increasing in the clock (:func:`_non_increasing`), and growing no faster than
    1/f below any clock (a compute-bound part's time scales as 1/f, a memory-bound
    part's less): ``t(f) <= t(f') f' / f`` for every ``f' > f``. Where the model is
    unsure at a clock it has not visited, that bound from a well-known higher clock
    caps its mean plus ``uncertainty_z`` standard deviations."""
    times = _non_increasing(times)
    # A held top clock can realise less than the one below it: the running maximum
    # keeps the bound's clocks ascending, and only loosens it.
    clocks = np.maximum.accumulate(np.maximum(realized_mhz, 1.0))
    cycles = times * clocks
    return np.minimum.accumulate(cycles[::-1])[::-1] / clocks


def _non_increasing(values: FloatArray) -> FloatArray:
    """``values`` (per clock, ascending) raised to their running maximum from the top
    clock down: no part of an iteration gets faster at a lower clock."""
    return np.maximum.accumulate(values[::-1])[::-1]
