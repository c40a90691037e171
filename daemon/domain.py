"""One control domain's tick: observe, decide under the fail-safe, actuate, count.

:func:`daemon.loop.run` ticks every domain each period; what one domain does with its
tick (its fail-safe, controller failures, power budget, energy estimate, exporter view)
is here, with the tick's record.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gpugov.controllers.contract import (
    Learner,
    ReportsFallbacks,
    chain_layer,
    controller_label,
    layers,
)
from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.clock_reconcile import ReconcilePolicy
from gpugov.daemon.deadline import DecisionDeadline, DecisionTimeout, LatestReader, ReadTimeout
from gpugov.daemon.decide import ControllerContext, close_controller
from gpugov.daemon.energy import EnergyEstimator, reading_from
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import ControllerFailure
from gpugov.daemon.exporter import DomainSnapshot, SolveHistogram
from gpugov.daemon.observer import DomainObserver, Observed
from gpugov.daemon.outside import outside_layer
from gpugov.daemon.phase_fit import learned_phase_model
from gpugov.daemon.power_budget import PowerBudget
from gpugov.daemon.power_limit import PowerLimitActuator
from gpugov.daemon.safety import (
    ClampToSupported,
    FloorClock,
    ThermalGuard,
    failsafe_clock,
    held_by_node,
    invalid_decisions,
    raw_decision,
)
from gpugov.plant.types import ClockController, PowerCapping, ServingObservation

log = logging.getLogger("gpugov.daemon.loop")
"""The loop's logger, kept when the domain moved here: a domain's lines (fail-safe,
controller failures) are the loop's in operators' logs and filters."""

FailsafeMode = Literal["max", "unlock"]
MAX_CONTROLLER_FAILURES = 10
"""Controller exceptions in a row a domain survives (fail-safe each time) before the
daemon stops (``daemon.max_controller_failures``)."""
CONTROLLER_ERROR_LOG_EVERY_S = 60.0
"""After the first controller exception is logged, at most one reminder per this many
seconds while the controller keeps failing."""
WRITE_PATH_SAID_EVERY_S = CONTROLLER_ERROR_LOG_EVERY_S
"""At most one logged outage of the clock writes' path (the actuator, zeusd) per this
many seconds; one that lasts, its start left out, is said once this long has passed."""
STATUS_DEADLINE_S = 0.1
"""How long a tick waits for an outside controller's ``status()`` on a node (it only
reports: past this, the last status it gave is shown; its answer is the next tick's)."""


@dataclass(frozen=True)
class TickRecord:
    """What happened in one domain at one tick (also one line of ``--record``)."""

    domain: str
    controller: str
    time_s: float
    step: int
    observation: ServingObservation
    decision_mhz: float | None
    requested_mhz: float | None
    applied_mhz: int | None
    solve_s: float | None
    failsafe: bool
    writes: int
    engine_error: str | None
    gpu_read_errors: tuple[str, ...] = field(default=())
    power_cap_w: float | None = None
    """The power limit gpugov held on the domain's GPUs after the tick, summed (None while
    they keep their own: no power limit actuator, or no cap asked for)."""


class Domain:
    """One control domain: observer, safety-wrapped controller, actuator, counters.

    Args:
        name: domain label.
        observer: its GPUs and engine.
        controller: the controller in its safety chain (:func:`daemon.decide.build_controller`).
        actuator: its GPUs' clock actuator (entered by :func:`daemon.loop.run`).
        failsafe: on stale engine data or a controller exception, lock the maximum clock
            (``"max"``) or unlock.
        label: controller name for metrics (default: the controller's ``name``).
        solve_clock: wall clock for timing the controller.
        max_controller_failures: controller exceptions in a row survived before
            :meth:`tick` raises :class:`ControllerFailure`.
        budget: the domain's power budget sources (:class:`daemon.power_budget.PowerBudget`):
            each tick the budget in force replaces the observation's ``power_limit_w``
            and the controller's need is followed after each decision; None: neither.
        power_limits: its GPUs' power limit actuator (:mod:`daemon.power_limit`), where
            their backends set power limits: a controller that sets a power cap
            (:class:`~gpugov.plant.types.PowerCapping`) has it applied after each
            decision, and the fail-safe restores the GPUs' own limits. None: no GPU's
            limit is touched (a capping controller's clock alone is applied).
        context: the context the factory built the controller with (None: not known);
            a recording's header keeps it for ``replay``.
    """

    def __init__(
        self,
        name: str,
        observer: DomainObserver,
        controller: ClockController,
        actuator: ClockActuator,
        *,
        failsafe: FailsafeMode = "max",
        label: str | None = None,
        solve_clock: Callable[[], float] = time.perf_counter,
        max_controller_failures: int = MAX_CONTROLLER_FAILURES,
        budget: PowerBudget | None = None,
        power_limits: PowerLimitActuator | None = None,
        context: ControllerContext | None = None,
    ) -> None:
        if max_controller_failures < 1:
            raise ValueError(f"max_controller_failures must be >= 1, got {max_controller_failures}")
        self.name = name
        self.observer = observer
        self.controller = controller
        self.context = context
        """The context the controller was built with (a recording's header keeps it)."""
        self.actuator = actuator
        self.failsafe_mode = failsafe
        self.label = label or controller_label(controller)
        self._solve_clock = solve_clock
        self.failsafe_active = False
        self.decisions = 0
        self.fallbacks: dict[str, int] = {}
        self.solve = SolveHistogram()
        self.last: Observed | None = None
        self.last_requested_mhz: float | None = None
        self.max_controller_failures = int(max_controller_failures)
        self.controller_failures = 0
        """Controller exceptions in a row (0 after a decision)."""
        self.write_path_down: str | None = None
        """Why the clock writes cannot go through (the actuator or zeusd is gone), or None."""
        self._failure_logged_s = -math.inf
        self._invalid_logged = 0
        """Invalid decisions counted when the last line about them was logged."""
        self._invalid_logged_s = -math.inf
        self._failsafe_episodes = EpisodeLog(CONTROLLER_ERROR_LOG_EVERY_S)
        """The engine-stale fail-safe's lines: at most one start (and its end) a minute."""
        self._controller_episodes = EpisodeLog(CONTROLLER_ERROR_LOG_EVERY_S)
        """A controller that fails now and then: at most one run of failures a minute."""
        self._write_path_episodes = EpisodeLog(WRITE_PATH_SAID_EVERY_S)
        """The write path's outages said: at most one a minute, with its end."""
        self._write_path_said_s = -math.inf
        """When the last line about the write path's outage now running was due."""
        self.budget = budget
        self.power_limits = power_limits
        self.caps = isinstance(layers(controller)[-1], PowerCapping)
        """Whether the controller sets a power cap (its algorithm, inside every wrapper)."""
        self.energy = EnergyEstimator()
        """Energy attribution per window and model (:mod:`daemon.energy`)."""
        self._energy_failed = False
        self._status_said: set[str] = set()
        """The kinds of controller status trouble said (``hung``, ``failed``): once each."""
        self._status_reader: LatestReader[Any] | None = None
        """An outside controller's ``status()`` on a node, run on a worker thread and
        waited for :data:`STATUS_DEADLINE_S` (:meth:`model_status`)."""
        self._last_status: dict[str, Any] | None = None

    def _estimate_energy(self, observed: Observed) -> None:
        """Fold this tick into the energy estimate; a failure is logged once and never
        stops the loop (the estimate only reports)."""
        try:
            self.energy.update(reading_from(observed), learned_phase_model(self.controller))
        except Exception as error:  # the estimate must never cost a decision
            if not self._energy_failed:
                self._energy_failed = True
                log.warning("domain %s: energy estimate failed: %r", self.name, error)

    @property
    def power_cap_w(self) -> float | None:
        """The power limit gpugov holds on the domain's GPUs, summed (None: their own)."""
        return None if self.power_limits is None else self.power_limits.applied_w

    def _apply_cap(self, failsafe: bool = False) -> None:
        """After a decision, set the controller's power cap (when it sets one); in the
        fail-safe, the GPUs' own limits."""
        if self.power_limits is None or not self.caps:
            return
        if failsafe:
            self.power_limits.apply(None)
        elif isinstance(self.controller, PowerCapping):
            self.power_limits.apply(self.controller.requested_power_cap_w)

    def _failsafe_clock(
        self, now_s: float, observation: ServingObservation | None = None
    ) -> tuple[float | None, int]:
        """Apply the fail-safe at ``now_s``: lock the top clock (``"max"``) or unlock, which
        runs the GPUs up to it; the safety chain then holds that clock for its dwell. With
        the die near a stated thermal limit (``observation``'s readings) the clock the
        chain's thermal guard allows is locked instead, in either mode. A power cap the
        controller set gives way to the GPUs' own limits either way."""
        self._apply_cap(failsafe=True)
        top = self.observer.gpus.supported_clocks_mhz()[-1]
        clock = failsafe_clock(self.controller, top, observation)
        if self.failsafe_mode == "max" or clock < top:
            writes = self.actuator.apply(int(clock))
        else:
            writes = self.actuator.unlock()
        held_by_node(self.controller, clock, now_s)
        return (clock if self.failsafe_mode == "max" or clock < top else None), writes

    def _failsafe(self, observed: Observed) -> tuple[float | None, int]:
        if not self.failsafe_active:
            self.failsafe_active = True
            age = observed.engine_age_s
            note = self._failsafe_episodes.start(observed.observation.time_s)
            log.log(
                logging.DEBUG if note is None else logging.WARNING,
                "domain %s: engine data %s (%s); fail-safe: %s%s",
                self.name,
                "never received" if age is None else f"{age:.1f}s old",
                observed.engine_error or "no new data",
                "maximum clock" if self.failsafe_mode == "max" else "unlocked",
                note or "",
            )
        self.fallbacks["engine_stale"] = self.fallbacks.get("engine_stale", 0) + 1
        return self._failsafe_clock(observed.observation.time_s, observed.observation)

    def _controller_failed(self, error: Exception, now_s: float, step: int) -> None:
        """Count a controller exception, or an outside controller's missed deadline
        (:class:`daemon.deadline.DecisionTimeout`), and log it (the first one, then at
        most one reminder a minute).

        Raises:
            ControllerFailure: ``max_controller_failures`` failures in a row.
        """
        timeout = isinstance(error, DecisionTimeout)
        reason = "controller_timeout" if timeout else "controller_error"
        what = "did not decide in time" if timeout else "raised"
        shown = str(error) if timeout else repr(error)
        self.controller_failures += 1
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        if self.controller_failures >= self.max_controller_failures:
            raise ControllerFailure(
                f"domain {self.name}: controller {self.label!r} {what} "
                f"{self.controller_failures} time(s) in a row, the last at t={now_s:.3f}s "
                f"(step {step}): {shown}"
            ) from error
        mode = "maximum clock" if self.failsafe_mode == "max" else "unlocked"
        if self.controller_failures == 1:
            note = self._controller_episodes.start(now_s)
            log.log(
                logging.DEBUG if note is None else logging.WARNING,
                "domain %s: controller %r %s %s at t=%.3fs (step %d); fail-safe for this "
                "tick: %s (the daemon stops after %d in a row)%s",
                self.name,
                self.label,
                what,
                f"({shown})" if timeout else shown,
                now_s,
                step,
                mode,
                self.max_controller_failures,
                note or "",
            )
            if not timeout:
                log.debug("domain %s: controller exception", self.name, exc_info=error)
            if note is not None:
                self._failure_logged_s = now_s
        elif now_s - self._failure_logged_s >= CONTROLLER_ERROR_LOG_EVERY_S:
            self._controller_episodes.reminded()
            log.warning(
                "domain %s: controller %r still %s: %d in a row, the last %s",
                self.name,
                self.label,
                "missing its deadline" if timeout else "raising",
                self.controller_failures,
                f"({shown})" if timeout else shown,
            )
            self._failure_logged_s = now_s

    def _invalid_decision(self, invalid: int, now_s: float, step: int) -> None:
        """Log a decision that was not a clock (the chain ran the top clock instead): the
        first one, then at most one line a minute with the count."""
        first = self._invalid_logged == 0
        if invalid <= self._invalid_logged or (
            not first and now_s - self._invalid_logged_s < CONTROLLER_ERROR_LOG_EVERY_S
        ):
            return  # before the chain walk: a controller never answering a clock is here every tick
        outside = outside_layer(self.controller)
        what = (
            outside.last_invalid
            if outside is not None and outside.last_invalid is not None
            else "a non-finite value"
        )
        if first:
            log.warning(
                "domain %s: controller %r returned %s at t=%.3fs (step %d), not a clock in "
                "MHz; the top clock instead (counted as invalid_decision)",
                self.name,
                self.label,
                what,
                now_s,
                step,
            )
        else:
            log.warning(
                "domain %s: controller %r still returns no clock: %d invalid decision(s) "
                "so far, the last %s",
                self.name,
                self.label,
                invalid,
                what,
            )
        self._invalid_logged = invalid
        self._invalid_logged_s = now_s

    def _write_path(self, problem: str | None, now_s: float) -> None:
        """Log the clock writes' path (the actuator, zeusd) going away and coming back,
        once each; outages that come and go (zeusd taking every other request) log at
        most one a minute with its end (:class:`~daemon.episode_log.EpisodeLog`)."""
        if problem is not None and self.write_path_down is None:
            mode = "maximum clock" if self.failsafe_mode == "max" else "unlocked"
            note = self._write_path_episodes.start(now_s)
            self._write_path_said_s = now_s
            log.log(
                logging.DEBUG if note is None else logging.WARNING,
                "domain %s: clock writes cannot go through (%s); fail-safe: %s, retried every "
                "tick%s",
                self.name,
                problem,
                mode,
                note or "",
            )
        elif problem is not None and now_s - self._write_path_said_s >= WRITE_PATH_SAID_EVERY_S:
            self._write_path_said_s = now_s  # one that lasts, its start left out: said now
            if not self._write_path_episodes.logged:
                self._write_path_episodes.reminded()
                log.warning(
                    "domain %s: clock writes still cannot go through (%s); fail-safe held",
                    self.name,
                    problem,
                )
        elif problem is None and self.write_path_down is not None:
            log.log(
                logging.WARNING if self._write_path_episodes.end() else logging.DEBUG,
                "domain %s: clock writes go through again; fail-safe ended",
                self.name,
            )
        self.write_path_down = problem

    def reconcile(
        self, policy: ReconcilePolicy, *, dry_run: bool = False, stop: threading.Event | None = None
    ) -> list[str]:
        """At start: what a previous run left on the domain's GPUs, reset or adopted (one
        line each), each GPU read as the loop reads it, under its deadline; once ``stop`` is
        set, what is left is the exit's to reset and restore (nothing more is read)."""
        lines = self.actuator.reconcile(
            policy, dry_run=dry_run, read=self.observer.gpus.read, stop=stop
        )
        if self.power_limits is not None:
            lines += self.power_limits.reconcile(dry_run=dry_run, stop=stop)
        return lines

    def observe(self, now_s: float, step: int) -> Observed:
        """This tick's GPU reads and engine scrape (:meth:`DomainObserver.observe`), no
        decision: :func:`daemon.loop.run` calls it for every domain at once on a node, each
        on its own thread, then :meth:`tick` with its result in the main thread.

        Raises:
            GpuLost: a GPU fell off the bus.
        """
        return self.observer.observe(now_s, step, self.actuator.applied_mhz)

    def tick(self, now_s: float, step: int, observed: Observed | None = None) -> TickRecord:
        """Observe (unless ``observed`` is this tick's :meth:`observe`), decide (or fall
        back), actuate.

        A controller exception is survived: the fail-safe holds for that tick and it is
        counted (fallback ``controller_error``); so is an outside controller's missed
        decision deadline (fallback ``controller_timeout``, :mod:`daemon.deadline`). So
        is a tick whose clock writes cannot go through (split mode: the actuator or zeusd
        is gone; fallback ``actuator_unavailable``), until they can again.

        Raises:
            GpuLost, PermissionDenied, NotSupported: not survivable.
            ControllerFailure: the controller raised ``max_controller_failures`` times
                in a row (the caller resets the clocks).
        """
        if observed is None:
            observed = self.observe(now_s, step)
        if self.budget is not None:
            observed = self.budget.apply(observed, self.power_limits)
        self.last = observed
        self._estimate_energy(observed)
        self.actuator.check_readback(observed.gpu_samples)
        decision: float | None = None
        solve_s: float | None = None
        failed = False
        requested: float | None
        problem = self.actuator.write_path_problem()
        if problem is not None or self.write_path_down is not None:
            self._write_path(problem, now_s)
        if problem is not None:
            self.fallbacks["actuator_unavailable"] = (
                self.fallbacks.get("actuator_unavailable", 0) + 1
            )
            requested, writes = self._failsafe_clock(now_s, observed.observation)
        elif observed.engine_fresh:
            if self.failsafe_active:
                self.failsafe_active = False
                log.log(
                    logging.WARNING if self._failsafe_episodes.end() else logging.DEBUG,
                    "domain %s: engine data back; fail-safe ended",
                    self.name,
                )
            started = self._solve_clock()
            try:
                answer = float(self.controller(observed.observation))
            except Exception as error:  # survived per tick; N in a row stop the daemon
                self._controller_failed(error, now_s, step)
                failed = True
                requested, writes = self._failsafe_clock(now_s, observed.observation)
            else:
                if self.controller_failures:
                    log.log(
                        logging.WARNING if self._controller_episodes.end() else logging.DEBUG,
                        "domain %s: controller %r decides again after %d failure(s) in a row",
                        self.name,
                        self.label,
                        self.controller_failures,
                    )
                    self.controller_failures = 0
                solve_s = self._solve_clock() - started
                self.solve.observe(solve_s)
                self.decisions += 1
                requested = answer
                decision = raw_decision(self.controller, answer)
                if self.budget is not None:
                    self.budget.after_decision(self.controller, now_s)
                invalid = invalid_decisions(self.controller)
                if invalid:
                    self.fallbacks["invalid_decision"] = invalid
                    self._invalid_decision(invalid, now_s, step)
                writes = self.actuator.apply(int(round(answer)))
                self._apply_cap()
        else:
            requested, writes = self._failsafe(observed)
        self.last_requested_mhz = requested
        errors = tuple(
            f"{sample.gpu}:{name}" for sample in observed.gpu_samples for name in sample.read_errors
        )
        return TickRecord(
            domain=self.name,
            controller=self.label,
            time_s=now_s,
            step=step,
            observation=observed.observation,
            decision_mhz=decision,
            requested_mhz=requested,
            applied_mhz=self.actuator.applied_mhz,
            solve_s=solve_s,
            failsafe=self.failsafe_active or failed or problem is not None,
            writes=writes,
            engine_error=observed.engine_error,
            gpu_read_errors=errors,
            power_cap_w=self.power_cap_w,
        )

    def fallback_counts(self) -> dict[str, int]:
        """Fallbacks by reason: the daemon's own and those the controller reports (MPC)."""
        counts = dict(self.fallbacks)
        for layer in layers(self.controller):
            if isinstance(layer, ReportsFallbacks):
                for reason, count in layer.fallback_reasons.items():
                    if count:
                        counts[f"controller_{reason}"] = int(count)
                break
        return counts

    def snapshot(self) -> DomainSnapshot:
        """The exporter's view after the last tick."""
        observed = self.last
        return DomainSnapshot(
            domain=self.name,
            controller=self.label,
            gpus=observed.gpu_samples if observed else (),
            observation=observed.observation if observed else None,
            requested_mhz=self.last_requested_mhz,
            applied_mhz=self.actuator.governed_mhz,
            clock_locked=self.actuator.holds_lock,
            failsafe=(
                self.failsafe_active
                or self.controller_failures > 0
                or self.write_path_down is not None
            ),
            engine_age_s=observed.engine_age_s if observed else None,
            engine_scrape_s=observed.scrape_s if observed else 0.0,
            decisions_total=self.decisions,
            clock_writes_total=self.actuator.writes,
            engine_errors_total=self.observer.engine_errors,
            gpu_read_errors_total=dict(self.observer.gpus.gpu_read_errors),
            fallbacks_total=self.fallback_counts(),
            solve_buckets=tuple(self.solve.buckets()),
            solve_sum_s=self.solve.sum_s,
            external_clock_changes_total=dict(self.actuator.external_changes),
            clock_write_failures_total=dict(self.actuator.write_failures),
            power_cap_applied_w=self.power_cap_w,
            power_cap_write_failures_total=(
                {} if self.power_limits is None else dict(self.power_limits.write_failures)
            ),
            yielded_gpus=tuple(sorted(self.actuator.yielded)),
            model=self.model_status(),
            energy=self.energy.snapshot(),
            power_budget=None if self.budget is None else self.budget.status(),
            lowest_mhz=self.lowest_clock_mhz(),
            **self._thermal_guard_status(),
        )

    def _thermal_guard_status(self) -> dict[str, Any]:
        """The chain's thermal guard's cap and count for the snapshot (none without one:
        an outside controller's chain)."""
        guard = chain_layer(self.controller, ThermalGuard)
        if guard is None:
            return {}
        return {"thermal_cap_mhz": guard.cap_mhz, "thermal_capped_total": guard.capped}

    def lowest_clock_mhz(self) -> float | None:
        """The lowest clock the safety chain lets a lock hold: the floor
        (``safety.floor_mhz``, rounded up onto the supported clocks) or else the lowest
        supported clock; where a controller that parks an idle GPU low parks it. None
        without either layer (an outside controller's chain)."""
        lowest: float | None = None
        for layer in layers(self.controller):
            if isinstance(layer, FloorClock):
                value = layer.floor_mhz
            elif isinstance(layer, ClampToSupported):
                value = layer.clocks_mhz[0]
            else:
                continue
            lowest = value if lowest is None else max(lowest, value)
        return lowest

    def model_status(self) -> dict[str, Any] | None:
        """The controller's learning status when it learns a model (``mpc-online``, or an
        outside controller with a ``status()``); a failure is logged once and never stops
        the loop (the status only reports). On a node, an outside controller's status is
        waited for at most :data:`STATUS_DEADLINE_S` on a worker thread (its decisions
        are bounded by their deadline; a ``status()`` that blocks held the loop): past
        it, the last status it gave."""
        chain = layers(self.controller)
        for layer in chain:
            if isinstance(layer, Learner):
                try:
                    if any(isinstance(other, DecisionDeadline) for other in chain):
                        value = self._bounded_status(layer)
                    else:
                        value = layer.status()
                except ReadTimeout:
                    self._status_warning(
                        "hung",
                        f"did not answer within {STATUS_DEADLINE_S:g} s (the last one kept)",
                    )
                    return self._last_status
                except Exception as error:  # an outside controller's: never cost a tick
                    self._status_warning("failed", f"failed: {error!r}")
                    return None
                self._last_status = value if isinstance(value, dict) else None
                return self._last_status
        return None

    def _bounded_status(self, learner: Learner) -> Any:
        """``learner.status()`` on the status reader's thread, waited for at most
        :data:`STATUS_DEADLINE_S` (:class:`~daemon.deadline.LatestReader`: while a late
        call runs no other starts)."""
        if self._status_reader is None:
            self._status_reader = LatestReader(
                learner.status, STATUS_DEADLINE_S, name=f"gpugov-status-{self.name}"
            )
        return self._status_reader.read()

    def _status_warning(self, kind: str, what: str) -> None:
        """One warning line for a controller status that failed or hung, once a run for
        each ``kind``."""
        if kind not in self._status_said:
            self._status_said.add(kind)
            log.warning("domain %s: controller status %s", self.name, what)

    def close_controller(self) -> None:
        """Let the controller release or persist what it holds (``mpc-online`` saves its
        model); logs a failure and never raises (one controller's close never blocks
        another's)."""
        close_controller(self.controller, f"domain {self.name}")
