"""One control domain's observation: its GPUs' samples plus its engine's scrape.

Derivations from the engine's cumulative counters (documented in ``docs/daemon.md``):

* ``arrived_requests``: the engine's arrival counter when it has one (TGI), else
  finished + waiting + running (every request that arrived is in one of the three),
  counted from the first scrape (the requests then in flight included) and from zero
  again after an engine restart (from that scrape, as from the first, on a page summed
  over data-parallel engines, whose sums keep the other engines' lifetimes).
* ``waiting_requests`` / ``decode_active``: the waiting and running gauges, with the
  running requests still in their prefill moved from one to the other (vLLM and SGLang
  run a prompt's chunks as a running request): the running gauge less the requests that
  have their first token and have not finished (TTFT count less finished, less what that
  difference held the last time nothing was in flight).
* ``prefill_remaining_tokens``: the queued requests x the running mean prompt length, plus
  each prompt in prefill at :func:`~daemon.prompt_lengths.residual_prompt_tokens` (given
  the tokens of it that have run where the engine publishes per-step tokens, else at
  least the mean), the
  mean being prompt tokens / first tokens (TTFT histogram count) since the engine started,
  else prompt tokens / finished requests, else the configured default.
* ``generated_decode_tokens``: the tokens the requests in flight have generated, the
  engine's generation counter less its output-length histogram's sum (the finished
  requests' tokens; vLLM, SGLang v0.3.5), less what that difference held the last time
  nothing was in flight (tokens of requests the histogram never counted); where the
  engine has no such pair (TGI; later SGLang, which counts a request's generated tokens
  when it finishes), running x mean output length / 2 (a running request is on
  average half done; mean output = generation tokens / finished requests, else default).
* ``ttft_recent_s`` / ``tpot_recent_s``: (sum now - sum before) / (count now - count
  before) of the histograms between two successful scrapes; None when no request
  completed the event in the window or a counter went backwards (engine restart).
* ``ttft_within_slo_total`` / ``ttft_count_total`` and the TPOT pair: cumulative SLO
  counts estimated from the histograms' buckets between successful scrapes
  (:mod:`daemon.attainment`); None where the engine publishes no buckets or the domain
  states no such SLO. ``ttft_recent_prompt_tokens``: prompt tokens prefilled per first
  token in the window (:class:`daemon.attainment.PromptPerFirstToken`), for the
  per-prompt TTFT allowance.
* A scrape whose counters moved further since the last one taken than any node can, or
  read above 2^53, is dropped as a bad scrape (:mod:`daemon.counter_jumps`); a counter
  that stays at the level it jumped to goes on from where it was (the jump taken off).
* GPU fields over the domain: power, energy and power limit summed; temperature the
  hottest GPU; realised clock the slowest; utilisation the mean.
* ``engines``: the data-parallel engines the engine's page shows
  (:func:`daemon.engines.shown_engines`: the distinct label sets of its running
  and waiting gauges, rank labels left out; vLLM's ``engine``, SGLang's ``dp_rank``):
  every count and token above is their sum; 1 where the page shows one engine or none
  has been scraped. A scrape that shows another count than the last (a data-parallel
  deployment scaled up or down), or other engines (their gauges' label sets), is
  another engine's, as one of another kind or model is: the sums would jump by a
  joining engine's lifetime or fall by a leaving one's, so the counters start from
  zero again there, as after an engine restart (no window,
  arrival or energy across it). ``busiest_prefill_tokens`` stays None on a node: a page gives
  each engine's waiting and running gauges, but the requests still in their prefill,
  and the length of their prompts, are derived from counters summed over the engines,
  so which engine holds the prompts in prefill is not known (scaling the backlog by an
  engine's share of the waiting requests alone would miss them).

A simulated engine in its ``exact`` view fills the exact values itself and they are used as
they are; in its ``vllm`` view it publishes only what a vLLM page has
(:mod:`daemon.vllm_view`), and everything above is derived as on a node.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpugov.daemon.attainment import AttainmentEstimator, bucket_delta
from gpugov.daemon.backend import GpuBackend, GpuSample
from gpugov.daemon.counter_jumps import (
    CounterOffsets,
    Counters,
    counters,
    impossible_jump,
    impossible_value,
    went_back,
)
from gpugov.daemon.engines import EngineSample, EngineSource, HistogramTotals
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import EngineUnavailable
from gpugov.daemon.gpu_sampling import DomainGpus
from gpugov.daemon.in_flight import InFlightRequests
from gpugov.daemon.safety import THERMAL_STALE_S
from gpugov.plant.types import ServingObservation

log = logging.getLogger(__name__)

DEFAULT_TAIL_QUANTILE = 0.99
"""The quantile of a prompt's rest behind ``prefill_tail_tokens``: the default SLO
target's attainment (a domain with a target uses its own)."""


@dataclass(frozen=True, slots=True)
class Observed:
    """One tick's observation and the health of the data behind it.

    ``engine_age_s`` is the time since the last successful scrape (None: never
    succeeded); ``engine_fresh`` is False when that exceeds the domain's stale age or
    there has been no scrape at all.
    """

    observation: ServingObservation
    gpu_samples: tuple[GpuSample, ...]
    engine_sample: EngineSample | None
    engine_age_s: float | None
    engine_fresh: bool
    engine_error: str | None
    scrape_s: float


def _window_mean(now: HistogramTotals | None, before: HistogramTotals | None) -> float | None:
    if now is None or before is None:
        return None
    count = now.count - before.count
    total = now.sum_s - before.sum_s
    if count <= 0 or total < 0:
        return None
    return total / count


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """A mean per request: ``numerator`` over a count of requests, None below one request
    (a count of 1e-300 made a mean output of 7.6e306 tokens, and the generated tokens
    derived from it infinite)."""
    if numerator is None or denominator is None or not denominator >= 1.0:
        return None
    return numerator / denominator


def _sum(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return float(sum(v for v in values if v is not None))


def _reasons(values: Sequence[int | None]) -> int | None:
    """The clock-event reasons of a domain: every GPU's bits ORed (None when none known)."""
    known = [int(v) for v in values if v is not None]
    if not known:
        return None
    combined = 0
    for value in known:
        combined |= value
    return combined


CREATED_NEW_IN_A_ROW = 3
"""Scrapes in a row whose changed ``_created`` times are all new, after which they are not
read as creation times (:meth:`DomainObserver._recreated`)."""

RESTARTS_LEFT_OUT = (
    "{count} more in the {seconds:.0f} s before were not logged: does this URL reach "
    "several engines in turn (a load balancer)?"
)
"""What a logged engine restart says about the restarts left out before it."""


def _another_engine(last: EngineSample, sample: EngineSample) -> bool:
    """Whether ``sample`` is another engine's than ``last``: of another kind, serving
    another model (a name either page lacks tells nothing), or as many data-parallel
    engines no more (a deployment scaled up or down: the sums now hold an engine's
    lifetime counters more, or less), or other ones (one left and another joined
    between two scrapes: the sums swapped one's lifetime for the other's); its counters
    are its own. (A series created again is another engine too:
    :meth:`DomainObserver._recreated`.)"""
    if sample.engine != last.engine or sample.engines != last.engines:
        return True
    shown = (last.engine_labels, sample.engine_labels)
    if None not in shown and shown[0] != shown[1]:
        return True
    names = (last.model_name, sample.model_name)
    return None not in names and names[0] != names[1]


def _returned(key: str, last: Counters, seen: Counters) -> bool:
    """Whether ``key`` is a counter an earlier page had and the last one lacked. Not a
    histogram's bucket (``ttft_buckets[0.5]``): a bound back on the page is another
    layout, which no window is taken across (:func:`~daemon.attainment.bucket_delta`).
    Not one no page had before: an engine publishes some only once they count
    something (SGLang's after its first request)."""
    return key in seen and key not in last and "[" not in key


class DomainObserver:
    """Builds a domain's :class:`ServingObservation` each tick.

    Args:
        backends: the domain's GPUs, sampled by :attr:`gpus`
            (:class:`~daemon.gpu_sampling.DomainGpus`).
        source: the domain's engine.
        stale_after_s: engine data older than this is stale (the fail-safe trigger).
        ttft_slo_s, tpot_slo_s, thermal_limit_c: copied into every observation.
        ttft_slo_per_prompt_token_s: the per-prompt TTFT allowance, copied too.
        mean_prompt_tokens, mean_output_tokens: defaults until the engine's counters
            give a mean.
        clock: monotonic seconds, for the scrape's own duration.
        scrape_timeout_s: the source's own deadline (the observer never gives a scrape
            longer, and gives it less when the data would go stale first).
        log_every_s: while the engine stays down, one reminder per this many seconds
            (the first failure and the recovery are always logged); the GPUs' sampling
            logs at the same rate.
        role: the domain's pool role (``docs/disaggregated.md``), stamped on every
            observation; ``role_from_config`` says whether the config set it (else the
            engine's labels did at start, or nobody). When the engine's labels later
            state another role, one log line says so (per role they state).
        domain: the domain's name, for those log lines.
        gpu_read_deadline_s: the GPUs' read deadline on a node
            (:class:`~daemon.gpu_sampling.DomainGpus`; None: read on the loop's thread).
        period_s: the control period, which lengthens how long a GPU's last temperature
            stands in for a failed read (0: unknown).

    Staleness is measured when the scrape returns: the data's age is the time from the
    end of the last successful scrape to the end of this one, so a slow or trickling
    engine cannot push the fail-safe past ``stale_after_s`` plus one period.
    """

    def __init__(
        self,
        backends: Sequence[GpuBackend],
        source: EngineSource,
        *,
        stale_after_s: float,
        ttft_slo_s: float | None = None,
        tpot_slo_s: float | None = None,
        thermal_limit_c: float | None = None,
        ttft_slo_per_prompt_token_s: float | None = None,
        mean_prompt_tokens: float = 512.0,
        mean_output_tokens: float = 256.0,
        clock: Callable[[], float] = time.perf_counter,
        scrape_timeout_s: float | None = None,
        log_every_s: float = 60.0,
        role: str = "colocated",
        role_from_config: bool = False,
        domain: str = "default",
        tail_quantile: float = DEFAULT_TAIL_QUANTILE,
        gpu_read_deadline_s: float | None = None,
        period_s: float = 0.0,
    ) -> None:
        if stale_after_s <= 0:
            raise ValueError(f"stale_after_s must be positive, got {stale_after_s!r}")
        self.gpus = DomainGpus(
            backends, log_every_s=log_every_s, read_deadline_s=gpu_read_deadline_s
        )
        """The domain's GPUs, sampled each tick (:mod:`daemon.gpu_sampling`)."""
        self.period_s = period_s
        """The control period the ticks come at (0: unknown)."""
        self._temperatures: dict[str, tuple[float, float]] = {}
        """Each GPU's last temperature read: when (``now_s``) and what (C)."""
        self.source = source
        self.stale_after_s = stale_after_s
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s
        self.thermal_limit_c = thermal_limit_c
        self.ttft_slo_per_prompt_token_s = ttft_slo_per_prompt_token_s
        self.attainment = AttainmentEstimator(ttft_slo_s, tpot_slo_s, ttft_slo_per_prompt_token_s)
        self.mean_prompt_tokens = mean_prompt_tokens
        self.mean_output_tokens = mean_output_tokens
        self.in_flight = InFlightRequests(role, tail_quantile)
        """The requests in flight, derived from the engine's counters (:mod:`daemon.in_flight`)."""
        self._clock = clock
        self._last: EngineSample | None = None
        self._last_time_s: float | None = None
        self._window_base: EngineSample | None = None
        self.scrape_timeout_s = scrape_timeout_s
        self.log_every_s = log_every_s
        self.engine_errors = 0
        self.last_error: str | None = None
        """The last failed scrape's error (kept until a scrape succeeds)."""
        self._cut = False
        self._was_fresh = False
        self.failed_in_a_row = 0
        self._down_since_s: float | None = None
        self._last_reminder_s = -math.inf
        self._engine_episodes = EpisodeLog(log_every_s)
        self._restarts = EpisodeLog(log_every_s, left_out=RESTARTS_LEFT_OUT)
        """Engine restarts and changes said: at most one line a ``log_every_s``."""
        self._restarted = False
        """Whether the last page's counters went back (:meth:`_impossible_counters`)."""
        self._created_seen: set[tuple[str, float]] = set()
        """Every (series, ``_created`` time) the engine's pages have had."""
        self._created_new_in_a_row = 0
        self._created_trusted = True
        """Whether ``_created`` times are read as creation times (:meth:`_recreated`)."""
        self.role_from_config = role_from_config
        self.domain = domain
        self._roles_reported: set[str] = {role}
        self._last_raw: Counters | None = None
        """The engine's own counters at the last scrape taken (before any offset)."""
        self._jumped: tuple[Counters, float] | None = None
        """The counters of the last scrape dropped for an impossible jump, and its time:
        a next scrape that follows on from it plausibly is a counter that stayed at its
        new level (re-anchored), one that follows on from the last taken is a spike gone."""
        self._seen: Counters = {}
        """Every counter of the engine's scrapes taken, at its last value: one a page left
        out and a later one has again is compared with where it was."""
        self._offsets = CounterOffsets()
        """What is taken off counters that jumped and stayed (:mod:`daemon.counter_jumps`)."""

    @property
    def role(self) -> str:
        """The domain's pool role, stamped on every observation."""
        return self.in_flight.role

    def _budget(self, now_s: float) -> float | None:
        """What is left of the scrape deadline before the last good data goes stale."""
        if self._last_time_s is None:
            return None
        left = self._last_time_s + self.stale_after_s - now_s
        if left <= 0:
            # Stale already: decide the fail-safe now if the last tick was still fresh
            # (a late tick), else give the engine its whole timeout to come back.
            return 0.0 if self._was_fresh else None
        return left if self.scrape_timeout_s is None else min(left, self.scrape_timeout_s)

    def _scrape(self, now_s: float) -> tuple[str | None, float]:
        """Scrape at ``now_s`` (the tick's time plus what the GPU reads took)."""
        started = self._clock()
        budget = self._budget(now_s)
        cut = (
            budget is not None
            and self.scrape_timeout_s is not None
            and budget < self.scrape_timeout_s
        )
        self._cut = False
        if budget is not None and budget <= 0.0:
            # A late tick: the data went stale before it, so no scrape can save it; the
            # fail-safe is decided now, and the reason is what the engine last did.
            self._cut = True
            self.engine_errors += 1
            error = "not scraped: the last good data went stale before this tick" + (
                f"; last scrape: {self.last_error}" if self.last_error else ""
            )
            self._report_failure(now_s, error)
            return error, self._clock() - started
        try:
            sample = (
                self.source.scrape() if budget is None else self.source.scrape(timeout_s=budget)
            )
        except EngineUnavailable as failure:
            elapsed = self._clock() - started
            # Ran out the deadline the stale age set: the data is stale by now.
            self._cut = cut and budget is not None and elapsed >= budget - 1e-3
            self.engine_errors += 1
            error = str(failure)
            self.last_error = error
            if self._cut:
                error += f" (given only the {budget:.2g} s left before the data went stale)"
            self._report_failure(now_s, error)
            return error, elapsed
        elapsed = self._clock() - started
        recreated = self._recreated(sample)
        new_engine = self._last is not None and (recreated or _another_engine(self._last, sample))
        if new_engine:
            # Its counters are checked against none of the old engine's.
            self._last_raw = self._jumped = None
            self._offsets.clear()
        refused = self._impossible_counters(sample, now_s + elapsed)
        if refused is not None:
            self.engine_errors += 1
            self.last_error = refused
            self._report_failure(now_s, refused)
            return refused, elapsed
        if new_engine:
            # Its lifetime is no work this daemon saw: its counters start from zero here,
            # so every consumer (windows, arrivals, the learned model, the energy
            # estimate) meets it as an engine restart, which each already handles.
            self._offsets.restart_from(counters(sample))
        if new_engine or self._restarted:
            self._report_restart(now_s, new_engine)
        sample = self._offsets.apply(sample)
        if self.failed_in_a_row:
            down_s = now_s - (self._down_since_s if self._down_since_s is not None else now_s)
            log.log(
                logging.WARNING if self._engine_episodes.end() else logging.DEBUG,
                "engine scrape back after %d failed scrape(s) (%.1f s)%s",
                self.failed_in_a_row,
                down_s,
                self._source_note(),
            )
        self.failed_in_a_row = 0
        self._down_since_s = None
        self.last_error = None
        self._window_base, self._last = self._last, sample
        self._last_time_s = now_s + elapsed
        self._check_role(getattr(sample, "role", None))
        return None, elapsed

    def _impossible_counters(self, sample: EngineSample, at_s: float) -> str | None:
        """Why ``sample`` (scraped at ``at_s``) is dropped, or None to take it.

        A counter that is no count (about 2^64, a wrapped unsigned counter), or one that
        rose further since the last scrape taken than any node can
        (:func:`~daemon.counter_jumps.impossible_jump`: a x1e6 spike), makes the scrape
        a bad one, as a NaN does: counted, the last good data kept, nothing of it fed to
        a derivation. A next scrape that follows on from the last one taken is the spike
        gone; one that follows on from the dropped one plausibly is a counter that
        stayed at its new level: the jump is taken off it from then on (one WARNING), so
        that its rise is not read as work. A counter that went back is an engine
        restart, as before (the offsets are dropped with the engine's counters; on a
        page summed over data-parallel engines the counters start from zero there), and
        so is one a page left out that is back below its last value; back at or above
        it, every counter starts from zero there (the scrape between read it as 0)."""
        now = counters(sample)
        problem = impossible_value(now)
        if problem is not None:
            self._jumped = None
            return self._named(
                f"impossible counter: {problem}; sample dropped (the last good one kept)"
            )
        last, jumped = self._last_raw, self._jumped
        seen = None if last is None else {**self._seen, **last}
        restarted = seen is not None and went_back(seen, now)
        self._restarted = restarted
        if restarted:
            if sample.engines > 1:
                # One of several data-parallel engines restarted: the sums still hold
                # the others' lifetimes, which dropping the offsets (taken off at a
                # scaling or a jump) read as one window's work. They start from zero
                # here, as at a change of engine.
                self._offsets.restart_from(now)
            else:
                self._offsets.clear()  # an engine restart: its counters start from zero
        elif last is not None and self._last_time_s is not None:
            jump = impossible_jump(last, now, at_s - self._last_time_s)
            if jump is not None:
                if (
                    jumped is None
                    or went_back(jumped[0], now)
                    or impossible_jump(jumped[0], now, at_s - jumped[1]) is not None
                ):
                    self._jumped = (now, at_s)
                    return self._named(
                        f"impossible counter jump: {jump[1]}; sample dropped (the last good "
                        "one kept)"
                    )
                moved = self._offsets.re_anchor(last, jumped[0], jumped[1] - self._last_time_s)
                log.warning(
                    "%s",
                    self._named(
                        f"engine counter(s) {', '.join(moved) or jump[0]} stayed at the level "
                        "they jumped to: taken from there on, the jump not counted as work"
                    ),
                )
        if (
            not restarted
            and last is not None
            and seen is not None
            and any(_returned(key, last, seen) for key in now)
        ):
            # A counter the last page left out is back, at or above where it was: the
            # scrape between read it as 0 (a restart, to every consumer), and its return
            # would be its whole lifetime in one window. Every counter starts from zero
            # here, as after a restart, so that they stay consistent.
            self._offsets.restart_from(now)
        self._seen = now if seen is None or restarted else {**seen, **now}
        self._last_raw, self._jumped = now, None
        return None

    def _source_note(self) -> str:
        """``": URL"`` for a line that names no engine otherwise (its recovery: on a node
        of several domains, which engine came back), "" for a source without a URL."""
        url = getattr(self.source, "url", None)
        return f": {url}" if isinstance(url, str) and url else ""

    def _named(self, text: str) -> str:
        """``text`` after the engine's URL, as every failed fetch starts: on a node of
        several domains a bad page's line named only the counter, not whose it was."""
        url = getattr(self.source, "url", None)
        return f"{url}: {text}" if isinstance(url, str) and url else text

    def _check_role(self, labelled: str | None) -> None:
        """One log line per role the engine's labels state that differs from the
        domain's (the config's wins; a role read at start stays until a restart)."""
        if labelled is None or labelled in self._roles_reported:
            return
        self._roles_reported.add(labelled)
        if self.role_from_config:
            log.warning(
                "domain %s: role = %r in the config, but the engine's labels say %r; "
                "the config wins",
                self.domain,
                self.role,
                labelled,
            )
        else:
            log.warning(
                "domain %s: the engine's labels now say role %r, but the domain is governed "
                "as %r (read at start); set role in the config or restart the daemon",
                self.domain,
                labelled,
                self.role,
            )

    def _recreated(self, sample: EngineSample) -> bool:
        """Whether ``sample``'s series were created again since the last page taken (a
        ``_created`` time changed): a restart whose counters rose past the old ones before
        this scrape, or another replica behind a load balancer, whose lifetimes'
        difference no counter going back shows. Times that are all new at
        :data:`CREATED_NEW_IN_A_ROW` scrapes in a row are no creation times (a page built
        afresh for each request stamps each with its time; every scrape read as another
        engine, no window was taken): from then on they are not read (one line says so).
        Replicas answering in turn show times seen before."""
        if not self._created_trusted or not sample.created:
            return False
        last = self._last
        before = dict(last.created) if last is not None and last.created else {}
        changed = [item for item in sample.created if before.get(item[0], item[1]) != item[1]]
        fresh = bool(changed) and not any(item in self._created_seen for item in changed)
        if len(self._created_seen) > 10_000:  # label churn
            self._created_seen.clear()
        self._created_seen.update(sample.created)
        self._created_new_in_a_row = self._created_new_in_a_row + 1 if fresh else 0
        if self._created_new_in_a_row >= CREATED_NEW_IN_A_ROW:
            self._created_trusted = False
            log.warning(
                "%s",
                self._named(
                    f"the page's _created series change at every scrape ({len(changed)} "
                    f"new at {CREATED_NEW_IN_A_ROW} scrapes in a row): not creation times; "
                    "a restart is told by counters going back alone from here"
                ),
            )
            return False
        return bool(changed)

    def _report_restart(self, now_s: float, another: bool) -> None:
        """One line when the engine restarts or another one answers on the URL (its
        windows start again there), at most one a ``log_every_s``: a URL whose counters go
        back scrape after scrape (a load balancer over replicas of one model) says how
        many it left out, at WARNING. A restart was not logged at all."""
        note = self._restarts.start(now_s)
        what = (
            "another engine answers (of another kind or model, other data-parallel "
            "engines, or series created again)"
            if another
            else "the engine's counters went back (a restart)"
        )
        if note is None:
            log.debug("%s", self._named(f"{what}: its counters start from zero here"))
            return
        log.log(
            logging.WARNING if note else logging.INFO,
            "%s",
            self._named(f"{what}: its counters start from zero here{note}"),
        )

    def _report_failure(self, now_s: float, error: str) -> None:
        """One WARNING when the engine goes down, then one reminder per ``log_every_s``;
        an engine that comes and goes logs at most one outage per ``log_every_s``
        (:class:`~daemon.episode_log.EpisodeLog`), the next one saying how many it left
        out."""
        self.failed_in_a_row += 1
        if self.failed_in_a_row == 1:
            self._down_since_s = now_s
            self._last_reminder_s = now_s
            note = self._engine_episodes.start(now_s)
            if note is None:
                log.debug("engine scrape failed: %s", error)
            else:
                log.warning("engine scrape failed: %s%s", error, note)
        elif now_s - self._last_reminder_s >= self.log_every_s:
            self._last_reminder_s = now_s
            self._engine_episodes.reminded()
            log.warning(
                "engine still failing: %d scrapes in a row: %s", self.failed_in_a_row, error
            )
        else:
            log.debug("engine scrape failed: %s", error)

    def observe(self, now_s: float, step_index: int, requested_clock_mhz: float | None) -> Observed:
        """Sample the GPUs, scrape the engine and derive the observation.

        ``requested_clock_mhz`` is the clock the daemon has locked (None: unlocked, which
        is reported as the maximum supported clock, what an unlocked GPU runs under load).

        Raises:
            GpuLost: a GPU fell off the bus.
        """
        tick_started = self._clock()
        gpus = self.gpus.sample(now_s)
        reads_s = self._clock() - tick_started
        error, scrape_s = self._scrape(now_s + reads_s)
        decided_s = now_s + reads_s + scrape_s
        age = None if self._last_time_s is None else max(0.0, decided_s - self._last_time_s)
        # A scrape cut short by the stale deadline failed because the data went stale.
        fresh = age is not None and age <= self.stale_after_s and not (error and self._cut)
        self._was_fresh = fresh
        observation = self._build(now_s, step_index, requested_clock_mhz, gpus, error is None)
        return Observed(
            observation=observation,
            gpu_samples=gpus,
            engine_sample=self._last,
            engine_age_s=age,
            engine_fresh=fresh,
            engine_error=error,
            scrape_s=scrape_s,
        )

    def _hottest(self, now_s: float, gpus: tuple[GpuSample, ...]) -> float:
        """The domain's die temperature: its hottest GPU's. A GPU whose read failed this
        tick counts at its last reading up to :data:`THERMAL_STALE_S` plus one period old
        (the thermal guard's staleness), or a failed read on the hottest GPU took the
        cooler ones' for the domain's (and the guard's cap lifted); NaN when no GPU reads
        this tick (held, the last one was planned with and recorded as measured for as
        long as the sensors kept failing)."""
        read = [(g.gpu, g.temperature_c) for g in gpus if g.temperature_c is not None]
        if not read:
            return math.nan
        self._temperatures.update((gpu, (now_s, temperature)) for gpu, temperature in read)
        oldest_s = now_s - THERMAL_STALE_S - self.period_s
        return max(t for read_s, t in self._temperatures.values() if read_s >= oldest_s)

    def _build(
        self,
        now_s: float,
        step_index: int,
        requested_clock_mhz: float | None,
        gpus: tuple[GpuSample, ...],
        new_scrape: bool,
    ) -> ServingObservation:
        engine = self._last or EngineSample(engine="none", running_requests=0, waiting_requests=0)
        base = self._window_base if new_scrape else None
        temperature_c = self._hottest(now_s, gpus)
        clocks_now = [g.sm_clock_mhz for g in gpus if g.sm_clock_mhz is not None]
        utilizations = [g.utilization for g in gpus if g.utilization is not None]
        supported = self.gpus.supported_clocks_mhz()
        if requested_clock_mhz is None and supported:
            requested_clock_mhz = supported[-1]

        finished = engine.finished_requests_total
        arrived = engine.arrived_requests_total
        if arrived is None:
            arrived = (finished or 0.0) + engine.waiting_requests + engine.running_requests
        arrived = self.in_flight.arrived_since_start(arrived, engine)
        mean_prompt = (
            _ratio(engine.prompt_tokens_total, engine.prompt_requests_total)
            or _ratio(engine.prompt_tokens_total, engine.ttft.count if engine.ttft else None)
            or _ratio(engine.prompt_tokens_total, finished)
            or self.mean_prompt_tokens
        )
        mean_output = _ratio(engine.generation_tokens_total, finished) or self.mean_output_tokens
        prefilling = self.in_flight.prefilling(engine)
        decoding = max(0, engine.running_requests - prefilling)
        local_prompt_tokens = self.in_flight.local_prompt_tokens(engine)
        prefill = engine.prefill_remaining_tokens
        tail = None
        if prefill is None:
            # Every tick, so that it learns its offset while idle.
            done = self.in_flight.prefilled_in_flight(engine, local_prompt_tokens)
            queued = engine.waiting_requests * mean_prompt
            prefill = queued + self.in_flight.prefill_rest(engine, prefilling, done, mean_prompt)
            tail = queued + self.in_flight.prefill_tail(engine, prefilling, done, prefill - queued)
        generated = engine.generated_decode_tokens
        if generated is None:
            generated = self.in_flight.generated_in_flight(engine)
        if generated is None:
            generated = decoding * mean_output / 2.0
        ttft = tpot = None  # nothing measured in a window without a new scrape
        if new_scrape:
            ttft = engine.ttft_recent_s
            if ttft is None and base is not None:
                ttft = _window_mean(engine.ttft, base.ttft)
            tpot = engine.tpot_recent_s
            if tpot is None and base is not None:
                tpot = _window_mean(engine.tpot, base.tpot)
            if base is not None:
                # A prompt counter that moves as requests finish says nothing of the
                # window's first tokens: they are judged at the flat TTFT SLO.
                at_finish = engine.prompt_tokens_at_finish or base.prompt_tokens_at_finish
                prompts = None if at_finish else engine.prompt_tokens_total
                before = base.prompt_tokens_total
                self.attainment.add_window(
                    bucket_delta(engine.ttft_buckets, base.ttft_buckets),
                    # Only between buckets of one histogram: a page that stops publishing
                    # the per-request one falls back to the inter-token one, whose
                    # lifetime of tokens less the requests' read as one window's TPOTs.
                    bucket_delta(engine.tpot_buckets, base.tpot_buckets)
                    if engine.tpot_buckets_per_request == base.tpot_buckets_per_request
                    else None,
                    None if prompts is None or before is None else prompts - before,
                    None
                    if engine.ttft is None or base.ttft is None
                    else engine.ttft.sum_s - base.ttft.sum_s,
                    None
                    if engine.tpot_buckets_sum_s is None or base.tpot_buckets_sum_s is None
                    else engine.tpot_buckets_sum_s - base.tpot_buckets_sum_s,
                    tpot_per_interval=not engine.tpot_buckets_per_request,
                    finished=None
                    if finished is None or base.finished_requests_total is None
                    else finished - base.finished_requests_total,
                )
        counts = self.attainment
        exact = engine.ttft_count_total is not None or engine.tpot_count_total is not None

        return ServingObservation(
            time_s=now_s,
            step_index=step_index,
            arrived_requests=max(0, round(arrived)),
            prefill_remaining_tokens=max(0.0, float(prefill)),
            prefill_tail_tokens=None if tail is None else max(0.0, float(tail)),
            decode_active=decoding,
            generated_decode_tokens=max(0.0, float(generated)),
            temperature_c=temperature_c,
            waiting_requests=self.in_flight.waiting(engine) + prefilling,
            completed_requests=round(finished or 0.0),
            output_tokens_total=float(engine.generation_tokens_total or 0.0),
            prompt_tokens_total=local_prompt_tokens,
            kv_tokens=float(engine.kv_tokens or 0.0),
            kv_capacity_tokens=engine.kv_capacity_tokens,
            power_w=_sum([g.power_w for g in gpus]),
            energy_j=_sum([g.energy_j for g in gpus]),
            requested_clock_mhz=requested_clock_mhz,
            realized_clock_mhz=min(clocks_now) if clocks_now else None,
            gpu_utilization=sum(utilizations) / len(utilizations) if utilizations else None,
            power_limit_w=_sum([g.power_limit_w for g in gpus]),
            thermal_limit_c=self.thermal_limit_c,
            supported_clocks_mhz=supported,
            clock_event_reasons=_reasons([g.clock_event_reasons for g in gpus]),
            model_name=engine.model_name,
            ttft_recent_s=ttft,
            tpot_recent_s=tpot,
            ttft_slo_s=engine.ttft_slo_s if engine.ttft_slo_s is not None else self.ttft_slo_s,
            tpot_slo_s=engine.tpot_slo_s if engine.tpot_slo_s is not None else self.tpot_slo_s,
            ttft_slo_per_prompt_token_s=(
                engine.ttft_slo_per_prompt_token_s
                if engine.ttft_slo_per_prompt_token_s is not None
                else self.ttft_slo_per_prompt_token_s
            ),
            ttft_recent_prompt_tokens=(
                engine.ttft_recent_prompt_tokens if exact else counts.recent_prompt_tokens
            )
            if new_scrape
            else None,
            ttft_count_total=engine.ttft_count_total if exact else counts.ttft_count,
            ttft_within_slo_total=engine.ttft_within_slo_total if exact else counts.ttft_within,
            tpot_count_total=engine.tpot_count_total if exact else counts.tpot_count,
            tpot_within_slo_total=engine.tpot_within_slo_total if exact else counts.tpot_within,
            role=self.role,
            engines=max(1, engine.engines),
        )
