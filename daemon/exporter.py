"""Prometheus exporter: a scrape-time Collector over the latest per-domain snapshots.

Its own ``CollectorRegistry`` (never the global one), served by prometheus_client's WSGI
app on ``127.0.0.1:9400`` by default, through the bounded server of
:mod:`daemon.metrics_server`. Names are ``gpugov_*`` in
base units (hertz, watts, joules, celsius, seconds); labels ``domain``, ``gpu`` and, on
decision metrics, ``controller``. The loop calls :meth:`Exporter.publish` once per tick
with immutable snapshots; a scrape reads whatever was published last."""

from __future__ import annotations

import logging
import math
import numbers
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpugov import __version__
from gpugov.daemon.backend import GpuSample
from gpugov.daemon.energy import EnergySnapshot
from gpugov.daemon.metrics_server import BoundedServer, QuietHandler
from gpugov.daemon.power_budget import BudgetStatus
from gpugov.plant.types import ServingObservation

log = logging.getLogger(__name__)

MHZ = 1e6
SOLVE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class SolveHistogram:
    """Cumulative histogram of controller solve times (seconds)."""

    bounds_s: tuple[float, ...] = SOLVE_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    sum_s: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds_s)

    def observe(self, seconds: float) -> None:
        """Add one solve time."""
        self.sum_s += seconds
        self.count += 1
        for index, bound in enumerate(self.bounds_s):
            if seconds <= bound:
                self.counts[index] += 1

    def buckets(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``."""
        rows = [(repr(float(b)), float(c)) for b, c in zip(self.bounds_s, self.counts, strict=True)]
        return [*rows, ("+Inf", float(self.count))]


@dataclass(frozen=True)
class DomainSnapshot:
    """Everything the exporter shows about one domain after one tick."""

    domain: str
    controller: str
    gpus: tuple[GpuSample, ...]
    observation: ServingObservation | None
    requested_mhz: float | None
    applied_mhz: float | None
    failsafe: bool
    engine_age_s: float | None
    engine_scrape_s: float
    decisions_total: int
    clock_writes_total: int
    engine_errors_total: int
    gpu_read_errors_total: Mapping[str, int]
    fallbacks_total: Mapping[str, int]
    solve_buckets: tuple[tuple[str, float], ...]
    solve_sum_s: float
    external_clock_changes_total: Mapping[str, int] = field(default_factory=dict)
    clock_write_failures_total: Mapping[str, int] = field(default_factory=dict)
    """Failed lock and reset writes per GPU label (``ClockActuator.write_failures``)."""
    power_cap_applied_w: float | None = None
    """The domain's power limit as gpugov set it (``PowerLimitActuator.applied_w``), None
    when it holds none."""
    power_cap_write_failures_total: Mapping[str, int] = field(default_factory=dict)
    """Failed power limit writes per GPU label (``PowerLimitActuator.write_failures``)."""
    yielded_gpus: tuple[str, ...] = ()
    model: Mapping[str, Any] | None = None
    """The online MPC's learning status (``OnlineMPCController.status()``), else None."""
    power_budget: BudgetStatus | None = None
    """The domain's power budget and need (:class:`daemon.power_budget.BudgetStatus`)."""
    energy: EnergySnapshot | None = None
    """The energy attribution (:class:`daemon.energy.EnergyEstimator`), else None."""
    lowest_mhz: float | None = None
    """The lowest clock a lock of the domain may hold (its lowest supported clock at or
    above ``safety.floor_mhz``: where an idle GPU parks), None when unknown."""
    thermal_cap_mhz: float | None = None
    """The clock the safety chain's thermal guard capped the last decision at (None:
    none applied: the die under the band, or no limit stated)."""
    thermal_capped_total: int | None = None
    """Decisions the thermal guard lowered (None: no guard in the chain)."""
    clock_locked: bool = False
    """Whether gpugov holds (or, after a write that failed half way, may hold) a clock
    lock on a GPU of the domain (``ClockActuator.holds_lock``): also when the GPUs hold
    different clocks, or one was yielded, where ``applied_mhz`` is None."""


@dataclass(frozen=True)
class LoopSnapshot:
    """Loop-wide counters."""

    ticks_total: int = 0
    overruns_total: int = 0
    tick_seconds: float = 0.0
    period_s: float = 1.0
    lock_state_write_failures_total: int = 0
    """Failed writes of the lock state file, retries included (``LockState.write_failures``;
    0 for a run that keeps none: a dry run, a simulation, no state directory)."""
    lock_state_stale: bool = False
    """True while the lock state file is out of date: its last write failed
    (``LockState.stale``)."""
    recording_dropped_ticks_total: int = 0
    """Ticks left out of the ``--record`` file: the disk had not taken the ticks queued
    before them (``Recorder.dropped_ticks``; 0 without a recording)."""


def _real(value: object) -> float | None:
    """``value`` as a finite float when it is a real number (a bool is 0 or 1, numpy's
    scalars count), else None: a learner's status, an outside controller's included, may
    hold anything, and one odd value must not fail the scrape."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _items(value: object) -> list[tuple[Any, Any]]:
    """A status field's ``(key, value)`` pairs when it is a mapping, else none."""
    return list(value.items()) if isinstance(value, Mapping) else []


def _whole_counts(buckets: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """Cumulative bucket counts rounded to whole observations: an estimated histogram's
    are shares (OpenMetrics takes integers), and rounding keeps them cumulative and, as
    they grow, never decreasing."""
    return [(bound, float(round(count))) for bound, count in buckets]


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class SnapshotCollector(Collector):
    """Turns the latest snapshots into metric families at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._domains: tuple[DomainSnapshot, ...] = ()
        self._loop: LoopSnapshot | None = None  # None until the first tick's

    def publish(self, domains: Sequence[DomainSnapshot], loop: LoopSnapshot) -> None:
        """Replace the snapshots (called by the loop once per tick)."""
        with self._lock:
            self._domains = tuple(domains)
            self._loop = loop

    def collect(self) -> Iterator[Metric]:
        """Metric families from the latest snapshots."""
        with self._lock:
            domains, loop = self._domains, self._loop
        return self._families(domains, loop)

    def describe(self) -> Iterator[Metric]:
        """Every metric family, without samples: the registry learns their names, which a
        scrape's ``name[]`` filter (``/metrics?name[]=gpugov_loop_ticks_total``) needs."""
        return self._families((), None)

    def _families(
        self, domains: Sequence[DomainSnapshot], loop: LoopSnapshot | None
    ) -> Iterator[Metric]:
        """The metric families of these snapshots."""
        info = InfoMetricFamily("gpugov_build", "gpugov version and Python runtime")
        info.add_metric([], {"version": __version__, "python": platform.python_version()})
        yield info
        yield from self._gpu_metrics(domains)
        yield from self._domain_metrics(domains)
        yield from self._model_metrics(domains)
        yield from self._budget_metrics(domains)
        yield from self._energy_metrics(domains)
        yield from self._loop_metrics(loop)

    def _gpu_metrics(self, domains: Sequence[DomainSnapshot]) -> Iterator[Metric]:
        labels = ("domain", "gpu")
        power = _gauge("gpugov_gpu_power_watts", "GPU board power (instant when available)", labels)
        energy = CounterMetricFamily(
            "gpugov_gpu_energy_joules", "GPU energy counter since the driver loaded", labels=labels
        )
        temperature = _gauge("gpugov_gpu_temperature_celsius", "GPU die temperature", labels)
        clock = _gauge("gpugov_gpu_sm_clock_hertz", "Realised SM clock", labels)
        utilization = _gauge("gpugov_gpu_utilization_ratio", "GPU utilisation (0-1)", labels)
        limit = _gauge("gpugov_gpu_power_limit_watts", "Enforced GPU power limit", labels)
        reasons = _gauge(
            "gpugov_gpu_clock_event_reasons", "NVML clock-event-reason bitmask", labels
        )
        errors = CounterMetricFamily(
            "gpugov_gpu_read_errors", "GPU reads that failed and were survived", labels=labels
        )
        external = CounterMetricFamily(
            "gpugov_gpu_external_clock_changes",
            "Clock changes made by someone else that the readback caught",
            labels=labels,
        )
        write_failures = CounterMetricFamily(
            "gpugov_clock_write_failures",
            "Clock lock and reset writes that failed (a transient failure is retried next tick)",
            labels=labels,
        )
        cap_failures = CounterMetricFamily(
            "gpugov_power_cap_write_failures",
            "Power limit writes and restores that failed (a transient failure is retried "
            "next tick)",
            labels=labels,
        )
        yielded = _gauge(
            "gpugov_gpu_clock_yield_active",
            "1 when gpugov left the GPU to an outside clock setting (external_clock_policy)",
            labels,
        )
        for snapshot in domains:
            for gpu in snapshot.gpus:
                key = [snapshot.domain, gpu.gpu]
                for family, value, scale in (
                    (power, gpu.power_w, 1.0),
                    (energy, gpu.energy_j, 1.0),
                    (temperature, gpu.temperature_c, 1.0),
                    (clock, gpu.sm_clock_mhz, MHZ),
                    (utilization, gpu.utilization, 1.0),
                    (limit, gpu.power_limit_w, 1.0),
                    (reasons, gpu.clock_event_reasons, 1.0),
                ):
                    if value is not None:
                        family.add_metric(key, float(value) * scale)
                errors.add_metric(key, float(snapshot.gpu_read_errors_total.get(gpu.gpu, 0)))
                external.add_metric(
                    key, float(snapshot.external_clock_changes_total.get(gpu.gpu, 0))
                )
                write_failures.add_metric(
                    key, float(snapshot.clock_write_failures_total.get(gpu.gpu, 0))
                )
                cap_failures.add_metric(
                    key, float(snapshot.power_cap_write_failures_total.get(gpu.gpu, 0))
                )
                yielded.add_metric(key, 1.0 if gpu.gpu in snapshot.yielded_gpus else 0.0)
        yield from (power, energy, temperature, clock, utilization, limit, reasons, errors)
        yield from (external, write_failures, cap_failures, yielded)

    def _domain_metrics(self, domains: Sequence[DomainSnapshot]) -> Iterator[Metric]:
        d = ("domain",)
        dc = ("domain", "controller")
        requested = _gauge(
            "gpugov_requested_clock_hertz", "SM clock decided for the domain (after safety)", dc
        )
        applied = _gauge(
            "gpugov_applied_clock_hertz", "SM clock the domain's GPUs are locked to", d
        )
        locked = _gauge("gpugov_clock_locked", "1 when the daemon holds a clock lock", d)
        lowest = _gauge(
            "gpugov_lowest_clock_hertz",
            "Lowest SM clock a lock of the domain may hold (supported, at or above the floor)",
            d,
        )
        thermal_cap = _gauge(
            "gpugov_thermal_cap_hertz",
            "Clock the thermal guard capped the last decision at, near the stated thermal "
            "limit (absent: no cap)",
            d,
        )
        thermal_capped = CounterMetricFamily(
            "gpugov_thermal_capped_decisions",
            "Decisions the safety chain's thermal guard lowered to hold the thermal limit",
            labels=list(d),
        )
        cap = _gauge(
            "gpugov_power_cap_applied_watts",
            "Power limit gpugov set on the domain's GPUs, summed (absent: their own limits)",
            d,
        )
        writes = CounterMetricFamily(
            "gpugov_clock_writes", "Clock lock/reset writes made", labels=list(d)
        )
        decisions = CounterMetricFamily(
            "gpugov_decisions", "Controller decisions taken", labels=list(dc)
        )
        solve = HistogramMetricFamily(
            "gpugov_controller_solve_seconds", "Wall time of one controller call", labels=list(dc)
        )
        fallbacks = CounterMetricFamily(
            "gpugov_fallbacks",
            "Decisions replaced by a fallback, by reason",
            labels=["domain", "controller", "reason"],
        )
        scrape_errors = CounterMetricFamily(
            "gpugov_engine_scrape_errors", "Failed engine /metrics scrapes", labels=list(d)
        )
        scrape_time = _gauge(
            "gpugov_engine_scrape_duration_seconds", "Wall time of the last engine scrape", d
        )
        age = _gauge(
            "gpugov_observation_age_seconds", "Age of the newest engine data at the last tick", d
        )
        failsafe = _gauge(
            "gpugov_failsafe_active", "1 while the domain is held in its fail-safe state", d
        )
        waiting = _gauge("gpugov_queue_waiting_requests", "Requests waiting in the engine", d)
        running = _gauge("gpugov_queue_running_requests", "Requests running in the engine", d)
        ttft = _gauge("gpugov_ttft_seconds", "Mean time to first token over the last tick", d)
        tpot = _gauge("gpugov_tpot_seconds", "Mean time per output token over the last tick", d)
        ttft_slo = _gauge(
            "gpugov_ttft_slo_seconds",
            "TTFT service-level objective of the last tick's first tokens (the flat SLO plus "
            "the per-prompt allowance at their mean prompt, where known)",
            d,
        )
        tpot_slo = _gauge("gpugov_tpot_slo_seconds", "TPOT service-level objective", d)
        domain_power = _gauge("gpugov_domain_power_watts", "Summed power of the domain's GPUs", d)
        role = _gauge(
            "gpugov_domain_role_info",
            "1 for the domain's pool role: prefill, decode or colocated (docs/disaggregated.md)",
            ("domain", "role"),
        )
        output_tokens = CounterMetricFamily(
            "gpugov_output_tokens", "Tokens the engine generated (its own counter)", labels=list(d)
        )
        prompt_tokens = CounterMetricFamily(
            "gpugov_prompt_tokens",
            "Prompt tokens the engine prefilled (its own counter)",
            labels=list(d),
        )
        completed = CounterMetricFamily(
            "gpugov_completed_requests",
            "Requests the engine finished (its own counter)",
            labels=list(d),
        )
        for s in domains:
            key, keyc = [s.domain], [s.domain, s.controller]
            if s.requested_mhz is not None:
                requested.add_metric(keyc, s.requested_mhz * MHZ)
            if s.applied_mhz is not None:
                applied.add_metric(key, s.applied_mhz * MHZ)
            locked.add_metric(key, 1.0 if s.clock_locked else 0.0)
            if s.lowest_mhz is not None:
                lowest.add_metric(key, s.lowest_mhz * MHZ)
            if s.thermal_cap_mhz is not None:
                thermal_cap.add_metric(key, s.thermal_cap_mhz * MHZ)
            if s.thermal_capped_total is not None:
                thermal_capped.add_metric(key, float(s.thermal_capped_total))
            if s.power_cap_applied_w is not None:
                cap.add_metric(key, s.power_cap_applied_w)
            writes.add_metric(key, float(s.clock_writes_total))
            decisions.add_metric(keyc, float(s.decisions_total))
            solve.add_metric(keyc, buckets=list(s.solve_buckets), sum_value=s.solve_sum_s)
            for reason, count in sorted(s.fallbacks_total.items()):
                fallbacks.add_metric([*keyc, reason], float(count))
            scrape_errors.add_metric(key, float(s.engine_errors_total))
            scrape_time.add_metric(key, s.engine_scrape_s)
            if s.engine_age_s is not None:
                age.add_metric(key, s.engine_age_s)
            failsafe.add_metric(key, 1.0 if s.failsafe else 0.0)
            o = s.observation
            if o is not None:
                waiting.add_metric(key, float(o.waiting_requests))
                running.add_metric(key, float(o.decode_active))
                output_tokens.add_metric(key, float(o.output_tokens_total))
                prompt_tokens.add_metric(key, float(o.prompt_tokens_total))
                completed.add_metric(key, float(o.completed_requests))
                role.add_metric([s.domain, o.role], 1.0)
                for family, value in (
                    (ttft, o.ttft_recent_s),
                    (tpot, o.tpot_recent_s),
                    (ttft_slo, o.ttft_recent_slo_s),
                    (tpot_slo, o.tpot_slo_s),
                    (domain_power, o.power_w),
                ):
                    if value is not None:
                        family.add_metric(key, float(value))
        yield from (requested, applied, locked, lowest, cap, writes, decisions, solve, fallbacks)
        yield from (thermal_cap, thermal_capped)
        yield from (scrape_errors, scrape_time, age, failsafe, waiting, running)
        yield from (ttft, tpot, ttft_slo, tpot_slo, domain_power)
        yield from (output_tokens, prompt_tokens, completed, role)

    def _model_metrics(self, domains: Sequence[DomainSnapshot]) -> Iterator[Metric]:
        """``gpugov_model_*``: the online MPC's learned model (domains running one)."""
        d = ("domain",)
        samples = CounterMetricFamily(
            "gpugov_model_samples",
            "Control windows folded into the learned latency model (restarts on a reset)",
            labels=list(d),
        )
        residuals = {
            "busy_s": _gauge(
                "gpugov_model_busy_residual_seconds",
                "RMS innovation of the learned busy-time fit (seconds per window)",
                d,
            ),
            "energy_j": _gauge(
                "gpugov_model_energy_residual_joules",
                "RMS innovation of the learned energy fit (joules per window)",
                d,
            ),
            "temperature_c": _gauge(
                "gpugov_model_temperature_residual_celsius",
                "RMS innovation of the learned thermal fit (degrees per window)",
                d,
            ),
        }
        confidence = _gauge(
            "gpugov_model_confidence_ratio",
            "1 minus the mean relative standard deviation of the learned latencies (0-1)",
            d,
        )
        exploring = _gauge(
            "gpugov_model_exploration_active",
            "1 while the clock floor sits below the explored clocks (safe exploration)",
            d,
        )
        warmup = _gauge(
            "gpugov_model_warmup_active", "1 while the model warms up at the top clock", d
        )
        floor = _gauge("gpugov_model_floor_hertz", "Lowest clock the exploration allows now", d)
        guard = _gauge(
            "gpugov_model_burst_guard_active",
            "1 when the last decision was the burst guard's clock",
            d,
        )
        descent = _gauge(
            "gpugov_model_decode_descent_active",
            "1 when the last decision was lowered by the decode descent",
            d,
        )
        efficiency = _gauge(
            "gpugov_model_efficiency_floor_active",
            "1 when the last decision was raised to the efficiency floor (a slower clock "
            "costs more energy by the learned model)",
            d,
        )
        backoffs = CounterMetricFamily(
            "gpugov_model_backoffs",
            "Back-offs to the maximum clock on measured latency near the SLO",
            labels=list(d),
        )
        resets = CounterMetricFamily(
            "gpugov_model_resets", "Times the learned model was discarded", labels=list(d)
        )
        budget = {
            "target": _gauge(
                "gpugov_model_slo_target_ratio", "SLO attainment target (slo_target)", d
            ),
            "attainment": _gauge(
                "gpugov_model_slo_attainment_ratio",
                "Measured SLO attainment over the target's window (union bound of TTFT and TPOT)",
                d,
            ),
            "looseness": _gauge(
                "gpugov_model_slo_looseness_ratio",
                "Attainment budget's looseness: above 1 spends the budget, below 1 gives it back",
                d,
            ),
            "applied_looseness": _gauge(
                "gpugov_model_slo_applied_looseness_ratio",
                "Looseness the margins are scaled by: the budget's, at most 1 while the window "
                "cannot afford every waiting prompt missing at once",
                d,
            ),
            "ahead": _gauge(
                "gpugov_model_slo_spending_active",
                "1 while the measured attainment is ahead of its target (the back-off and the "
                "burst guard's short-answer rule stand down, mpc-online's SLO feedback stops "
                "tightening), else 0",
                d,
            ),
        }
        for s in domains:
            model = s.model
            if not model:
                continue
            key = [s.domain]
            for name, value in _items(model.get("slo_budget")):
                number = _real(value)
                if name in budget and number is not None:
                    budget[name].add_metric(key, number)
            if set(model) <= {"slo_budget"}:
                continue  # an SLO budget without a learned model (mpc)
            for family, value, scale in (
                (samples, model.get("samples", 0), 1.0),
                (confidence, model.get("confidence", 0.0), 1.0),
                (floor, model.get("floor_mhz"), MHZ),
            ):
                number = _real(value)
                if number is not None:
                    family.add_metric(key, number * scale)
            for fit, value in _items(model.get("residual_rms")):
                number = _real(value)
                if fit in residuals and number is not None:
                    residuals[fit].add_metric(key, number)
            exploring.add_metric(key, 1.0 if model.get("exploring") else 0.0)
            warmup.add_metric(key, 0.0 if model.get("warmed_up") else 1.0)
            guard.add_metric(
                key, 1.0 if model.get("reason") in ("burst-guard", "warm-up-guard") else 0.0
            )
            descent.add_metric(
                key,
                1.0 if model.get("reason") in ("decode-descent", "warm-up-descent") else 0.0,
            )
            efficiency.add_metric(key, 1.0 if model.get("reason") == "efficiency-floor" else 0.0)
            for family, value in (
                (backoffs, model.get("backoffs", 0)),
                (resets, model.get("resets", 0)),
            ):
                number = _real(value)
                if number is not None:
                    family.add_metric(key, number)
        yield samples
        yield from residuals.values()
        yield from (confidence, exploring, warmup, floor, guard, descent, efficiency)
        yield from (backoffs, resets)
        yield from budget.values()

    def _budget_metrics(self, domains: Sequence[DomainSnapshot]) -> Iterator[Metric]:
        """``gpugov_power_*``: the domain's power budget, its need and the headroom
        (``docs/power-budget.md``)."""
        d = ("domain",)
        need = _gauge(
            "gpugov_power_needed_watts",
            "Power the domain needs to hold its SLO at the current load, by its controller's "
            "model (no cap applied)",
            d,
        )
        uncertainty = _gauge(
            "gpugov_power_needed_uncertainty_watts",
            "One standard deviation of gpugov_power_needed_watts (the model's uncertainty)",
            d,
        )
        budget = _gauge(
            "gpugov_power_budget_watts",
            "Power budget in force (the lowest of its sources); source: the one that won",
            ("domain", "source"),
        )
        sources = _gauge(
            "gpugov_power_budget_source_watts",
            "Each power budget source's current value (config, file, nvml)",
            ("domain", "source"),
        )
        headroom = _gauge(
            "gpugov_power_headroom_watts",
            "Power budget less the power needed (negative: over budget)",
            d,
        )
        over = _gauge(
            "gpugov_power_over_budget_active",
            "1 while the budget is below the power the SLO needs (the budget rule degrades: "
            "TTFT of queued requests slips first)",
            d,
        )
        tpot = _gauge(
            "gpugov_power_over_budget_tpot_active",
            "1 while the budget is below even the power the running requests' TPOT needs "
            "(TPOT slips too)",
            d,
        )
        events = CounterMetricFamily(
            "gpugov_power_over_budget_events",
            "Times the budget fell below the power the SLO needs",
            labels=list(d),
        )
        seconds = CounterMetricFamily(
            "gpugov_power_over_budget_seconds",
            "Seconds spent with the budget below the power the SLO needs",
            labels=list(d),
        )
        capped = CounterMetricFamily(
            "gpugov_power_budget_capped_decisions",
            "Decisions the power budget lowered",
            labels=list(d),
        )
        file_errors = CounterMetricFamily(
            "gpugov_power_budget_file_errors",
            "Problems met reading power_budget_file (the last good budget was kept)",
            labels=list(d),
        )
        for s in domains:
            status = s.power_budget
            if status is None:
                continue
            key = [s.domain]
            if status.need_w is not None:
                need.add_metric(key, status.need_w)
                uncertainty.add_metric(key, status.need_uncertainty_w or 0.0)
            if status.budget_w is not None:
                budget.add_metric([s.domain, status.source or ""], status.budget_w)
            for name, value in sorted(status.sources_w.items()):
                sources.add_metric([s.domain, name], value)
            if status.headroom_w is not None:
                headroom.add_metric(key, status.headroom_w)
            over.add_metric(key, 1.0 if status.over_budget else 0.0)
            tpot.add_metric(key, 1.0 if status.slipping == "ttft+tpot" else 0.0)
            events.add_metric(key, float(status.over_budget_events_total))
            seconds.add_metric(key, status.over_budget_seconds_total)
            capped.add_metric(key, float(status.capped_decisions_total))
            file_errors.add_metric(key, float(status.file_errors_total))
        yield from (need, uncertainty, budget, sources, headroom, over, tpot)
        yield from (events, seconds, capped, file_errors)

    def _energy_metrics(self, domains: Sequence[DomainSnapshot]) -> Iterator[Metric]:
        """``gpugov_energy_*``: measured energy split into phases per model (docs/energy.md)."""
        dm = ("domain", "model")
        phases = CounterMetricFamily(
            "gpugov_energy_joules",
            "Measured GPU energy of attributed windows, split by phase (prefill, decode, idle; "
            "the split is estimated, the sum is the NVML energy counter's)",
            labels=[*dm, "phase"],
        )
        tokens = CounterMetricFamily(
            "gpugov_energy_tokens",
            "Engine tokens of the attributed windows (kind prompt or output)",
            labels=[*dm, "kind"],
        )
        requests = CounterMetricFamily(
            "gpugov_energy_requests",
            "Requests the engine finished in the attributed windows",
            labels=list(dm),
        )
        windows = CounterMetricFamily(
            "gpugov_energy_windows",
            "Windows attributed, by source of the phase split (learned, fit, prior)",
            labels=[*dm, "source"],
        )
        skipped = CounterMetricFamily(
            "gpugov_energy_skipped_windows",
            "Windows left out of the attribution for bad input, by reason",
            labels=["domain", "reason"],
        )
        rates = {
            "joules_per_output_token": _gauge(
                "gpugov_energy_per_output_token_joules",
                "(prefill + decode) J per output token over the last minute (ML.ENERGY's unit)",
                dm,
            ),
            "joules_per_prompt_token": _gauge(
                "gpugov_energy_per_prompt_token_joules",
                "Prefill J per prompt token over the last minute",
                dm,
            ),
            "decode_joules_per_output_token": _gauge(
                "gpugov_energy_decode_per_output_token_joules",
                "Decode J per output token over the last minute",
                dm,
            ),
            "joules_per_request": _gauge(
                "gpugov_energy_per_request_joules",
                "(prefill + decode) J per finished request over the last minute",
                dm,
            ),
        }
        histogram = HistogramMetricFamily(
            "gpugov_energy_request_joules",
            "Estimated energy per finished request (engines publishing per-request token "
            "histograms)",
            labels=list(dm),
        )
        for s in domains:
            energy = s.energy
            if energy is None:
                continue
            for reason, count in energy.skipped:
                skipped.add_metric([s.domain, reason], float(count))
            for view in energy.models:
                key = [s.domain, view.model]
                for phase, value in (
                    ("prefill", view.prefill_j),
                    ("decode", view.decode_j),
                    ("idle", view.idle_j),
                ):
                    phases.add_metric([*key, phase], value)
                tokens.add_metric([*key, "prompt"], view.prompt_tokens)
                tokens.add_metric([*key, "output"], view.output_tokens)
                requests.add_metric(key, view.finished_requests)
                for source, count in view.windows:
                    windows.add_metric([*key, source], float(count))
                for name, family in rates.items():
                    value = getattr(view.rates, name)
                    if value is not None:
                        family.add_metric(key, float(value))
                if view.histogram_buckets is not None:
                    histogram.add_metric(
                        key,
                        buckets=_whole_counts(view.histogram_buckets),
                        sum_value=view.histogram_sum_j,
                    )
        yield from (phases, tokens, requests, windows, skipped)
        yield from rates.values()
        yield histogram

    def _loop_metrics(self, published: LoopSnapshot | None) -> Iterator[Metric]:
        """``gpugov_loop_*`` and the lock record's: counters at 0 before the first tick
        (``published`` None), which has no tick duration and no period to show yet."""
        loop = published or LoopSnapshot()
        ticks = CounterMetricFamily("gpugov_loop_ticks", "Control-loop iterations run")
        ticks.add_metric([], float(loop.ticks_total))
        overruns = CounterMetricFamily(
            "gpugov_loop_overruns", "Ticks skipped because an iteration ran past its period"
        )
        overruns.add_metric([], float(loop.overruns_total))
        duration = GaugeMetricFamily(
            "gpugov_loop_tick_duration_seconds", "Wall time of the last loop iteration"
        )
        period = GaugeMetricFamily("gpugov_loop_period_seconds", "Configured control period")
        if published is not None:
            duration.add_metric([], published.tick_seconds)
            period.add_metric([], published.period_s)
        lock_failures = CounterMetricFamily(
            "gpugov_lock_state_write_failures",
            "Writes of the lock state file (locks.json) that failed, retried every tick",
        )
        lock_failures.add_metric([], float(loop.lock_state_write_failures_total))
        lock_stale = GaugeMetricFamily(
            "gpugov_lock_state_stale_active",
            "1 while the lock state file is out of date (its last write failed): a daemon "
            "killed meanwhile leaves locks the next start finds only by reading the clocks",
        )
        lock_stale.add_metric([], 1.0 if loop.lock_state_stale else 0.0)
        dropped = CounterMetricFamily(
            "gpugov_recording_dropped_ticks",
            "Ticks left out of the --record file because the disk had not taken the ticks "
            "queued before them (a hung or slow disk; 0 without a recording)",
        )
        dropped.add_metric([], float(loop.recording_dropped_ticks_total))
        yield from (ticks, overruns, duration, period, lock_failures, lock_stale, dropped)


HEALTH_PATH = "/healthz"
"""The liveness path: 200 while the control loop ticks, 503 once it stalled (every other
path serves the metrics, which a stalled loop still answers from its last snapshot)."""
STALL_AFTER_S = 30.0
"""No tick for this long (or three periods, if longer) is a stalled loop: the units'
``WatchdogSec=``, for a pod, which has no watchdog."""
START_ALLOWANCE_S = 120.0
"""How long the start (GPUs, reconcile, the controller's compile) may take before the
first tick: the units' ``TimeoutStartSec=``."""


class Exporter:
    """The registry, its collector and (optionally) the HTTP server.

    Args:
        host, port: where to serve ``/metrics``; port 0 picks a free port (tests).
        serve: False to build the registry without an HTTP server.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9400,
        *,
        serve: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SnapshotCollector()
        self.registry.register(self.collector)
        self._clock = clock
        self._started_s = clock()
        self._published_s: float | None = None
        self._period_s = 1.0
        self._server: BoundedServer | None = None
        self._scrape_failure: str | None = None
        """The last failed scrape's reason, logged once until another is met."""
        self._thread: threading.Thread | None = None
        self.host, self.port = host, port
        if serve:
            self._start(host, port)

    def _start(self, host: str, port: int) -> None:
        metrics = make_wsgi_app(self.registry)

        def answer(start_response: Callable[..., Any], status: str, text: str) -> list[bytes]:
            """A plain-text answer of one line (the liveness path's, a failed scrape's)."""
            body = (text + "\n").encode()
            headers = [("Content-Type", "text/plain; charset=utf-8")]
            start_response(status, [*headers, ("Content-Length", str(len(body)))])
            return [body]

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == HEALTH_PATH:
                healthy, text = self.health()
                return answer(
                    start_response, "200 OK" if healthy else "503 Service Unavailable", text
                )
            try:
                served: Iterable[bytes] = metrics(environ, start_response)
            except Exception as error:  # a snapshot nobody foresaw: one line, no traceback
                reason = f"{type(error).__name__}: {error}"
                if reason != self._scrape_failure:
                    self._scrape_failure = reason
                    log.warning("metrics scrape failed: %s", reason)
                return answer(
                    start_response, "500 Internal Server Error", f"metrics unavailable: {reason}"
                )
            return served

        class Server(BoundedServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._server = make_server(host, port, app, Server, handler_class=QuietHandler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},  # how fast close() returns
            name="gpugov-metrics",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """The metrics URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def publish(self, domains: Sequence[DomainSnapshot], loop: LoopSnapshot) -> None:
        """Make these snapshots what the next scrape sees (and the tick the liveness
        path counts from)."""
        self.collector.publish(domains, loop)
        self._published_s, self._period_s = self._clock(), loop.period_s

    def health(self) -> tuple[bool, str]:
        """``(alive, line)`` for :data:`HEALTH_PATH`: False once no tick was published for
        :data:`STALL_AFTER_S` (or three periods), or none within :data:`START_ALLOWANCE_S`
        of the start, so a pod's liveness probe restarts a stalled loop as the watchdog does."""
        now = self._clock()
        if self._published_s is None:
            waited = now - self._started_s
            if waited <= START_ALLOWANCE_S:
                return True, f"starting: no control tick yet ({waited:.0f} s)"
            return False, f"stalled: no control tick in the {waited:.0f} s since the start"
        age, limit = now - self._published_s, max(STALL_AFTER_S, 3 * self._period_s)
        if age > limit:
            return False, f"stalled: no control tick for {age:.0f} s (limit {limit:g} s)"
        return True, f"ok: last control tick {age:.1f} s ago"

    def close(self) -> None:
        """Stop the HTTP server (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
