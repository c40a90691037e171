"""Spend the SLO-attainment budget: a loop that loosens a controller's safety margins while
the measured attainment is ahead of its target and tightens them when it falls behind.

An SRE states an SLO target as "``attainment`` of the requests meet their latency SLOs over
a rolling ``window_s``" (:class:`SLOTarget`). A request meets them when its TTFT is within
its TTFT SLO (the flat SLO plus any per-prompt allowance) and its TPOT within the TPOT SLO:
the plant's ``slo_attainment`` (``plant/result.py``). The fraction ``1 - attainment`` is the
*budget* of misses the target allows. The controllers' margins (the MPC's SLO margin, the
SLO feedback's pressure, ``mpc-online``'s exploration thresholds and uncertainty) were set to
hold the SLO with no misses at all; :class:`AttainmentBudget` measures the attainment the
node actually achieves and moves one factor, the *looseness*, that scales those margins.

The measurement is the observation's cumulative counters (``ttft_within_slo_total`` /
``ttft_count_total``, ``tpot_within_slo_total`` / ``tpot_count_total``: exact in the plant,
estimated from the engine's histograms on a node). TTFT and TPOT are counted apart (an
engine's histograms do not pair them per request), so the window's miss fraction is the
union bound ``TTFT misses / first tokens + TPOT misses / TPOT counts``: at least the true
share of requests missing either, so the estimate never overstates the attainment.

The rule (``docs/online.md``, "Spending the SLO budget"), with ``e = 1 - attainment`` the
budget, ``N`` the requests in the window, ``A = e N`` the misses the target allows there,
``S`` the misses counted in the window and ``m_s`` the miss fraction of its last twelfth
(the short window of an SRE's multi-window burn-rate alert); until the counters cover a
whole window, its requests ``N'`` are projected from their rate so far (over at least a
short window) and ``A' = e N'``, else ``A' = A``:

* **behind** when ``S > 3A'/4`` (a quarter of the window's budget is kept in reserve for
  the misses still under way; judged against the window's projected budget, so that a few
  misses in a window's first minutes, before most of its requests have been served, are
  not read as a budget spent) or ``m_s > 3e`` (the short window burns the budget three
  times faster than the target sustains: at that rate a twelfth of the window spends a
  quarter of the window's budget), each with at least two misses (one miss is no rate:
  on a light node, one early miss among 40 requests is not "behind"): the looseness
  falls, fast: across its whole range in one short window (``window_s / 12``);
* **ahead** when ``S < A/2``, ``m_s <= e`` (the short window burns no faster than the
  target sustains), ``A' >= 2`` (one more miss would cost at most half the budget, so
  the window holds enough requests to tell) and ``A - S >= 1`` (the requests seen so far
  can afford one more miss: early in a window, before 100 requests at 99 %, one miss would
  already spend the budget of what has been served, however many the window will hold),
  and every SLO the domain is judged on is counted (TGI publishes no TTFT histogram: its
  window shows no slack of first tokens, whatever its TPOT judgements say):
  the looseness rises, slowly: across its
  whole range in half a window, so that half the window's requests were served at the
  older, tighter setting when it gets there and a loosening that costs misses shows in the
  window before it has gone far;
* otherwise it holds. It moves in log space and stays within ``[tightest, loosest]``.

A misjudgement is not always one miss: the prompts that wait together are prefilled
together, and their replies decode together, so one clock too low for them can cost every
one of them (a burst of four prompts on a tight TPOT SLO, four misses in one period). The
looseness is therefore applied above 1 only while the window's projected budget less its
misses (``A' - S``) covers the prompts waiting and the next one
(:attr:`AttainmentBudget.exposed`); otherwise the margins are applied at 1, the rule's own
level kept for when the queue has drained (:attr:`AttainmentBudget.applied_looseness`).

The per-prompt TTFT allowance (a long prompt judged against its own, longer SLO) is a
spend of its own: a short prompt that lands behind a long one prefilled at a lower clock
may miss. It is planned with only while the window can afford one more miss (``A' - S >=
1``, and once a miss is counted, ``S >= 1/2`` or a tenth of a first token's, also ``A - S >=
1``: the projection pays for the first miss, the requests served for the next, since
traffic can stop;
:attr:`AttainmentBudget.allowance_credit`), in the share the looseness gives.

No constant here is tuned to a profile: the fractions are shares of the budget and the
rates are in units of the window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import pairwise

from gpugov.plant.input_files import finite_number
from gpugov.plant.types import ServingObservation

SHORT_WINDOW_SHARE = 1.0 / 12.0
"""The short window's share of the long one (an SRE's 5 minutes against an hour)."""
BEHIND_SHARE = 0.75
"""Budget share spent in the window above which the loop tightens."""
AHEAD_SHARE = 0.5
"""Budget share spent in the window below which the loop may loosen."""
FAST_BURN_RATE = 3.0
"""Burn rate (the short window's miss fraction over the budget) above which the loop
tightens."""
BEHIND_MISSES = 2.0
"""Misses a window must hold before it counts as behind (one miss is no rate)."""
MINIMUM_ALLOWED_MISSES = 2.0
"""Misses the target must allow in the window before the loop loosens."""
LOOSEN_WINDOWS = 0.5
"""Windows the looseness takes to cross its range upwards."""
COUNTED_TTFT_MISS = 0.1
"""A first token's share of a miss from which the window counts a TTFT miss: an engine's
coarse TTFT buckets can split one real miss into a fraction (a 1.10 s first token against
a 1.04 s SLO, in a window of several, estimated at 0.4)."""
SNAPSHOTS_PER_WINDOW = 120
"""Counter snapshots kept per window (the window's resolution)."""


@dataclass(frozen=True)
class SLOTarget:
    """An SLO target as an SRE writes one: ``attainment`` of the requests meet both latency
    SLOs over a rolling ``window_s`` (``0.99`` over ``600`` s is a p99 target).

    Raises:
        ValueError: ``attainment`` outside (0, 1) or ``window_s`` not positive.
    """

    attainment: float
    window_s: float = 600.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.attainment) and 0.0 < self.attainment < 1.0):
            raise ValueError(f"attainment must lie in (0, 1), got {self.attainment!r}")
        if not (math.isfinite(self.window_s) and self.window_s > 0.0):
            raise ValueError(f"window_s must be positive, got {self.window_s!r}")

    @property
    def budget(self) -> float:
        """The share of requests the target allows to miss."""
        return 1.0 - self.attainment

    def as_dict(self) -> dict[str, float]:
        """JSON-able form (``attainment``, ``window_s``)."""
        return {"attainment": self.attainment, "window_s": self.window_s}


@dataclass(frozen=True, slots=True)
class AttainmentCounters:
    """One observation's cumulative SLO counters (a pair is None when unmeasured)."""

    time_s: float
    ttft: tuple[float, float] | None
    """(within SLO, count) of first tokens."""
    tpot: tuple[float, float] | None
    """(within SLO, count) of TPOT judgements."""

    @classmethod
    def of(cls, observation: ServingObservation) -> AttainmentCounters | None:
        """The observation's counters, or None when it carries neither pair."""
        ttft = _pair(observation.ttft_within_slo_total, observation.ttft_count_total)
        tpot = _pair(observation.tpot_within_slo_total, observation.tpot_count_total)
        if ttft is None and tpot is None:
            return None
        return cls(float(observation.time_s), ttft, tpot)

    def blind_to(self, observation: ServingObservation) -> bool:
        """Whether an SLO the domain is judged on has no counters here (TGI publishes no
        TTFT histogram): the window says nothing of it, so it can never show slack. A
        prefill pool is judged on TTFT alone and a decode pool on TPOT alone."""
        ttft = observation.ttft_slo_s is not None and observation.role != "decode"
        tpot = observation.tpot_slo_s is not None and observation.role != "prefill"
        return (ttft and self.ttft is None) or (tpot and self.tpot is None)

    def went_back(self, before: AttainmentCounters) -> bool:
        """Whether a counter decreased since ``before`` (a source restarted) or a pair
        appeared or vanished (the deltas would mix different sources)."""
        for now, then in ((self.ttft, before.ttft), (self.tpot, before.tpot)):
            if (now is None) != (then is None):
                return True
            if now is not None and then is not None and (now[0] < then[0] or now[1] < then[1]):
                return True
        return False


def _pair(within: float | None, count: float | None) -> tuple[float, float] | None:
    if within is None or count is None or not (math.isfinite(within) and math.isfinite(count)):
        return None
    return float(within), float(count)


@dataclass(frozen=True, slots=True)
class WindowAttainment:
    """What the counters say about one window."""

    requests: float
    """Requests judged in the window (first tokens; TPOT counts where TTFT is unmeasured)."""
    miss_fraction: float
    """Union bound on the share of requests that missed either SLO."""
    tpot_misses: float = 0.0
    """TPOT judgements in the window that missed their SLO."""
    ttft_misses: float = 0.0
    """First tokens in the window that missed their TTFT SLO."""

    @property
    def misses(self) -> float:
        """Misses in the window, in requests."""
        return self.requests * self.miss_fraction

    @property
    def attainment(self) -> float | None:
        """``1 - miss_fraction``, None for an empty window."""
        return None if self.requests <= 0.0 else 1.0 - self.miss_fraction


def window_attainment(now: AttainmentCounters, before: AttainmentCounters) -> WindowAttainment:
    """The attainment between two snapshots of the same source (union bound: module
    notes)."""
    miss = 0.0
    requests = 0.0
    tpot_misses = ttft_misses = 0.0
    for pair, base, primary in ((now.ttft, before.ttft, True), (now.tpot, before.tpot, False)):
        if pair is None or base is None:
            continue
        count = pair[1] - base[1]
        if count <= 0.0:
            continue
        within = min(max(pair[0] - base[0], 0.0), count)
        miss += (count - within) / count
        if primary:
            ttft_misses = count - within
        else:
            tpot_misses = count - within
        if primary or requests == 0.0:
            requests = count
    return WindowAttainment(
        requests=requests,
        miss_fraction=min(1.0, miss),
        tpot_misses=tpot_misses,
        ttft_misses=ttft_misses,
    )


@dataclass
class AttainmentBudget:
    """The attainment-tracking loop (module notes): :meth:`update` once per decision
    returns the looseness the controller scales its margins by.

    Args:
        target: the SLO target.
        tightest: the lowest looseness (below 1: tighter than the controller's defaults).
        loosest: the highest looseness.
    """

    target: SLOTarget
    tightest: float = 0.7
    loosest: float = 1.0 / 0.7
    looseness: float = 1.0
    ahead: bool = False
    """Whether the last update found the window ahead of its target (the rule's *ahead*:
    under half the budget spent, the short window burning no faster than the target
    sustains, enough requests to tell): the hedges against model error may stand down."""
    affordable: bool = True
    """Whether the last update found the window able to afford one more miss (its
    projected budget less its misses, ``A' - S``, at least one, and once a miss is counted
    the budget of the requests served so far less its misses, ``A - S``, too; True before
    any counters):
    the per-prompt TTFT allowance is planned with only then (:attr:`allowance_credit`)."""
    remaining: float = math.inf
    """The window's projected budget less its misses at the last update (``A' - S``;
    infinite before any counters)."""
    exposed: float = 1.0
    """The requests one misjudgement decides together at the last update: the prompts
    waiting and the next one."""
    last: WindowAttainment | None = None
    """The long window's attainment at the last update (None before any counters)."""
    recent: WindowAttainment | None = None
    """The short window's (its last twelfth) at the last update (None before any
    counters)."""
    _history: deque[AttainmentCounters] = field(default_factory=deque, repr=False)
    _last_time_s: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not (0.0 < self.tightest <= 1.0 <= self.loosest < math.inf):
            raise ValueError(
                "AttainmentBudget needs 0 < tightest <= 1 <= loosest, got "
                f"{self.tightest!r} and {self.loosest!r}"
            )
        self.looseness = min(self.loosest, max(self.tightest, self.looseness))

    @property
    def window_s(self) -> float:
        """The long window."""
        return self.target.window_s

    @property
    def applied_looseness(self) -> float:
        """The looseness the margins are scaled by: the rule's, but at most 1 while the
        window cannot afford every request now exposed missing at once (module notes)."""
        if self.looseness > 1.0 and self.remaining < self.exposed:
            return 1.0
        return self.looseness

    def update(self, observation: ServingObservation) -> float:
        """Fold one observation in (idempotent per ``time_s``: the MPC inside a controller
        may call it again on the same observation) and return the applied looseness."""
        now = AttainmentCounters.of(observation)
        time_s = float(observation.time_s)
        previous_time = self._last_time_s
        if previous_time is not None and time_s <= previous_time:
            return self.applied_looseness
        self._last_time_s = time_s
        waiting = float(observation.waiting_requests)
        self.exposed = (waiting if math.isfinite(waiting) and waiting > 0.0 else 0.0) + 1.0
        if now is None:
            self.ahead = False  # nothing measured: no evidence of slack
            return self.applied_looseness
        history = self._history
        if history and now.went_back(history[-1]):
            history.clear()  # a restarted source: its counters start again
        window = self.window_s
        if not history or time_s - history[-1].time_s >= window / SNAPSHOTS_PER_WINDOW:
            history.append(now)
        while len(history) >= 2 and history[1].time_s <= time_s - window:
            history.popleft()
        if len(history) < 2 and history[0] is now:
            self.last = self.recent = None
            self.ahead = False
            return self.applied_looseness
        self.last = long = window_attainment(now, history[0])
        short = window_attainment(now, self._base(time_s - SHORT_WINDOW_SHARE * window))
        self.recent = short
        period = 0.0 if previous_time is None else time_s - previous_time
        covered = time_s - history[0].time_s
        self.looseness = self.next_looseness(
            long, short, period, covered_s=covered, blind=now.blind_to(observation)
        )
        return self.applied_looseness

    def _base(self, since_s: float) -> AttainmentCounters:
        """The latest snapshot at or before ``since_s`` (else the oldest kept)."""
        base = self._history[0]
        for snapshot in self._history:
            if snapshot.time_s > since_s:
                break
            base = snapshot
        return base

    def next_looseness(
        self,
        long: WindowAttainment,
        short: WindowAttainment,
        period_s: float,
        *,
        covered_s: float | None = None,
        blind: bool = False,
    ) -> float:
        """One step of the rule (module notes) over ``period_s`` seconds; ``covered_s``:
        how much of the long window the counters cover yet (a full window when None);
        ``blind``: an SLO the domain is judged on is not counted, so the window is never
        ahead (:meth:`AttainmentCounters.blind_to`)."""
        window = self.window_s
        covered = window if covered_s is None else min(window, max(covered_s, 0.0))
        budget = self.target.budget
        allowed = budget * long.requests
        # Until the counters cover a whole window, its requests are projected from their
        # rate so far (over at least a short window): "behind" is judged against the
        # window's projected budget, and the window holds enough requests to tell from
        # its projected size. "Ahead" judges the misses against those seen, and one miss
        # is no rate: "behind" needs two.
        projected = long.requests * window / max(covered, SHORT_WINDOW_SHARE * window)
        allowed_in_window = budget * projected
        span = math.log(self.loosest / self.tightest)
        behind = (
            long.misses > BEHIND_SHARE * allowed_in_window and long.misses >= BEHIND_MISSES
        ) or (short.miss_fraction > FAST_BURN_RATE * budget and short.misses >= BEHIND_MISSES)
        ahead = (
            not blind
            and long.misses < AHEAD_SHARE * allowed
            and short.miss_fraction <= budget
            and allowed_in_window >= MINIMUM_ALLOWED_MISSES
            and allowed - long.misses >= 1.0
        )
        self.ahead = bool(ahead and not behind)
        # The window's projected size pays for its first miss; traffic can stop (a trace's
        # arrivals ending, a router draining the node), so past it the requests served so
        # far must afford the next one too (a miss counted: at least half of one, or a
        # tenth of a first token's, which coarse TTFT buckets can split: COUNTED_TTFT_MISS).
        self.remaining = allowed_in_window - long.misses
        counted = long.misses >= 0.5 or long.ttft_misses >= COUNTED_TTFT_MISS
        self.affordable = allowed_in_window - long.misses >= 1.0 and (
            not counted or allowed - long.misses >= 1.0
        )
        log_looseness = math.log(self.looseness)
        if behind:
            log_looseness -= span * period_s / (SHORT_WINDOW_SHARE * self.window_s)
        elif ahead:
            log_looseness += span * period_s / (LOOSEN_WINDOWS * self.window_s)
        return min(self.loosest, max(self.tightest, math.exp(log_looseness)))

    @property
    def overspent(self) -> bool:
        """Whether the window's misses are past its whole projected budget (``A' - S < 0``)
        and its short window still misses faster than the target sustains: the target is
        broken for this window and the node is still losing requests (an engine past its
        capacity, or a model wrong about it)."""
        recent = self.recent
        return (
            self.remaining < 0.0
            and recent is not None
            and recent.misses >= BEHIND_MISSES
            and recent.miss_fraction > self.target.budget
        )

    @property
    def allowance_credit(self) -> float:
        """The share of a per-prompt TTFT allowance the controller may plan with: all of
        it from a looseness of 1 up, none at the tightest, and none while the window cannot
        afford one more miss (:attr:`affordable`). Judging a long prompt against its own,
        longer SLO lets the clock down, but a short prompt that lands behind it at that
        clock may miss: a spend made only where the window has a miss to spare, and
        given back when behind."""
        if not self.affordable:
            return 0.0
        if self.tightest >= 1.0:
            return 1.0
        return min(1.0, max(0.0, (self.looseness - self.tightest) / (1.0 - self.tightest)))

    def state_dict(self) -> dict[str, object]:
        """What a restart needs to go on measuring the same window (:meth:`load_state`):
        the looseness, the last update's time and the counter snapshots, each
        ``[time_s, ttft within, ttft count, tpot within, tpot count]`` (None where a pair
        is unmeasured). JSON-able."""
        return {
            "looseness": self.looseness,
            "time_s": self._last_time_s,
            "snapshots": [
                [
                    snapshot.time_s,
                    *(snapshot.ttft or (None, None)),
                    *(snapshot.tpot or (None, None)),
                ]
                for snapshot in self._history
            ],
        }

    def load_state(self, state: object, time_s: float, shift_s: float = 0.0) -> bool:
        """Go on from :meth:`state_dict`'s ``state`` at observation time ``time_s``, its
        times moved by ``shift_s`` into this run's time base (a restarted daemon's clock
        starts again: the caller knows by how much from the wall clock). It applies where
        the save lies between one window ago and now; the snapshots older than the window
        are dropped. Returns whether it applied; a state it cannot read changes nothing.

        Raises:
            ValueError: ``state`` is not a :meth:`state_dict` (the field named).
        """
        if not isinstance(state, dict):
            raise ValueError("slo_budget must be an object")
        looseness = _finite(state.get("looseness"), "slo_budget.looseness")
        saved_at = _finite(state.get("time_s"), "slo_budget.time_s")
        rows = state.get("snapshots")
        if not isinstance(rows, list):
            raise ValueError("slo_budget.snapshots must be a list")
        snapshots = [_snapshot(row, index) for index, row in enumerate(rows)]
        if any(b.time_s < a.time_s for a, b in pairwise(snapshots)):
            raise ValueError("slo_budget.snapshots must be in time order")
        if snapshots and snapshots[-1].time_s > saved_at:
            raise ValueError("slo_budget.snapshots must not be later than slo_budget.time_s")
        since = float(time_s) - (saved_at + shift_s)
        if not (math.isfinite(since) and 0.0 <= since <= self.window_s):
            return False
        moved = [replace(s, time_s=s.time_s + shift_s) for s in snapshots]
        kept = [s for s in moved if s.time_s > float(time_s) - self.window_s]
        if not kept and moved:
            kept = moved[-1:]  # the base the window's first deltas start from
        self._history = deque(kept)
        self._last_time_s = saved_at + shift_s
        self.looseness = min(self.loosest, max(self.tightest, looseness))
        return True

    def status(self) -> dict[str, float | None]:
        """What the exporter and the scoreboard report: target, window, measured
        attainment and looseness."""
        last = self.last
        return {
            "target": self.target.attainment,
            "window_s": self.window_s,
            "attainment": None if last is None else last.attainment,
            "requests": None if last is None else last.requests,
            "looseness": self.looseness,
            "applied_looseness": self.applied_looseness,
            "ahead": self.ahead,
        }


def _finite(value: object, field: str) -> float:
    """``value`` as a float (:func:`~gpugov.plant.input_files.finite_number`), else the
    ValueError naming ``field``."""
    number = finite_number(value)
    if number is None:
        raise ValueError(f"{field} must be a finite number, got {value!r:.40}")
    return number


def _snapshot(row: object, index: int) -> AttainmentCounters:
    """One stored ``[time_s, ttft within, ttft count, tpot within, tpot count]`` row."""
    field = f"slo_budget.snapshots[{index}]"
    if not isinstance(row, list) or len(row) != 5:
        raise ValueError(f"{field} must be a list of 5 numbers")
    time_s = _finite(row[0], field)
    pairs: list[tuple[float, float] | None] = []
    for within, count in (row[1:3], row[3:5]):
        if within is None and count is None:
            pairs.append(None)
            continue
        pair = (_finite(within, field), _finite(count, field))
        if pair[0] < 0.0 or pair[1] < 0.0:
            raise ValueError(f"{field} holds a negative count")
        pairs.append(pair)
    if pairs[0] is None and pairs[1] is None:
        raise ValueError(f"{field} holds no counters")
    return AttainmentCounters(time_s, pairs[0], pairs[1])


def loosened(threshold: float, looseness: float) -> float:
    """``threshold`` (a latency over its SLO) scaled by ``looseness``, never loosened past
    the SLO itself (1) unless it already was."""
    return min(threshold * looseness, max(threshold, 1.0))


__all__ = [
    "AttainmentBudget",
    "AttainmentCounters",
    "SLOTarget",
    "WindowAttainment",
    "loosened",
    "window_attainment",
]
