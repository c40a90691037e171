"""The control loop: observe, decide, actuate, publish, on a period that never drifts.

```python
with ClockActuator(backends) as actuator:        # restores the GPUs' clocks on exit, always
    for now_s in TimedLoop(period_s, clock):
        observation = observer.observe(now_s)    # NVML + engine, or the simulated plant
        requested_mhz = controller(observation)
        actuator.apply(requested_mhz)            # writes only when the decision changed
        exporter.publish(observation, requested_mhz)
```

:func:`run` is that loop over several domains, with the fail-safe, systemd
notifications and the per-tick record. The clock and the sleeper are injected, so tests
and the simulated mode run it on virtual time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal, Protocol

from gpugov.controllers.contract import (
    Closable,
    Learner,
    ReportsFallbacks,
    controller_label,
    layers,
)
from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.deadline import DecisionTimeout
from gpugov.daemon.energy import EnergyEstimator, reading_from
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import ClocksNotReset, ControllerFailure, GpuLost
from gpugov.daemon.exporter import DomainSnapshot, Exporter, LoopSnapshot, SolveHistogram
from gpugov.daemon.observer import DomainObserver, Observed
from gpugov.daemon.outside import outside_layer
from gpugov.daemon.phase_fit import learned_phase_model
from gpugov.daemon.power_budget import PowerBudget
from gpugov.daemon.safety import invalid_decisions, raw_decision
from gpugov.plant.types import ClockController, ServingObservation

log = logging.getLogger(__name__)

FailsafeMode = Literal["max", "unlock"]
MAX_CONTROLLER_FAILURES = 10
"""Controller exceptions in a row a domain survives (fail-safe each time) before the
daemon stops (``daemon.max_controller_failures``)."""
CONTROLLER_ERROR_LOG_EVERY_S = 60.0
"""After the first controller exception is logged, at most one reminder per this many
seconds while the controller keeps failing."""


# ----------------------------------------------------------------------- timing
class TimedLoop:
    """Yields the time since start at ticks aimed at ``start + k * period_s``.

    Sleeping to absolute targets keeps the period from drifting; a tick that ends past
    the next target skips the targets it missed (counted in ``overruns``).

    Args:
        period_s: control period.
        clock: monotonic seconds (``time.monotonic``; virtual in tests and simulation).
        sleep: sleeps for a duration; default waits on ``stop`` so a stop wakes it.
        stop: set it to end the loop after the current tick.
    """

    def __init__(
        self,
        period_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        if not math.isfinite(period_s) or period_s <= 0:
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        self.period_s = period_s
        self.stop = stop or threading.Event()
        self._clock = clock
        self._sleep = sleep or self.stop.wait
        self.ticks = 0
        self.overruns = 0

    def __iter__(self) -> Iterator[float]:
        start = self._clock()
        k = 0
        while not self.stop.is_set():
            yield self._clock() - start
            self.ticks += 1
            k += 1
            now = self._clock()
            target = start + k * self.period_s
            if now > target:
                missed = math.floor((now - start) / self.period_s) - k + 1
                self.overruns += missed
                k += missed
                target = start + k * self.period_s
            if not self.stop.is_set():
                self._sleep(target - now)


class VirtualClock:
    """Time that moves only when slept on: ``--virtual`` and the tests."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        """Advance time by ``seconds`` at once."""
        if seconds > 0:
            self.now_s += seconds


class ScaledClock:
    """Simulated seconds running ``speed`` times faster than the wall clock."""

    def __init__(
        self,
        speed: float,
        *,
        wall: Callable[[], float] = time.monotonic,
        stop: threading.Event | None = None,
    ) -> None:
        if not math.isfinite(speed) or speed <= 0:
            raise ValueError(f"speed must be positive, got {speed!r}")
        self.speed = speed
        self._wall = wall
        self._start = wall()
        self._stop = stop or threading.Event()

    def start(self) -> None:
        """Restart at simulated time 0 now: call it once everything the run needs is
        built (the controller warmed), so no set-up time passes on the plant."""
        self._start = self._wall()

    def __call__(self) -> float:
        return (self._wall() - self._start) * self.speed

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of simulated time (woken early by ``stop``)."""
        if seconds > 0:
            self._stop.wait(seconds / self.speed)


# ---------------------------------------------------------------------- systemd
class Notifier(Protocol):
    """Where sd_notify messages go."""

    def notify(self, state: str) -> Any: ...


class SystemdNotify:
    """READY/WATCHDOG/STATUS/STOPPING for ``Type=notify`` units; silent outside systemd.

    Args:
        notifier: a ``sdnotify.SystemdNotifier``-like object (tests pass a recorder).
        environ: for ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.
    """

    def __init__(
        self, notifier: Notifier | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        env = os.environ if environ is None else environ
        pid = env.get("WATCHDOG_PID")
        self.watchdog_enabled = "WATCHDOG_USEC" in env and (pid is None or pid == str(os.getpid()))
        try:
            self.watchdog_s = float(env.get("WATCHDOG_USEC", "0")) / 1e6
        except ValueError:
            self.watchdog_s = 0.0
        if notifier is None and env.get("NOTIFY_SOCKET"):
            import sdnotify

            notifier = sdnotify.SystemdNotifier()
        self._notifier = notifier
        self.ready_sent = False

    def _send(self, state: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(state)

    def check_period(self, period_s: float) -> None:
        """Refuse a control period the unit's watchdog would kill (one ping per tick).

        Raises:
            ValueError: ``period_s`` is at least half of ``WatchdogSec=``.
        """
        if self.watchdog_enabled and self.watchdog_s > 0 and period_s >= self.watchdog_s / 2:
            raise ValueError(
                f"daemon.period_s = {period_s:g} s is too long for the unit's WatchdogSec="
                f"{self.watchdog_s:g}s (the loop pings the watchdog once per tick); use a "
                f"period under {self.watchdog_s / 2:g} s or raise WatchdogSec"
            )

    def tick(self, status: str) -> None:
        """Once per loop: READY=1 the first time, WATCHDOG=1 when enabled, STATUS=."""
        if not self.ready_sent:
            self._send("READY=1")
            self.ready_sent = True
        if self.watchdog_enabled:
            self._send("WATCHDOG=1")
        self._send(f"STATUS={status}")

    def stopping(self) -> None:
        """STOPPING=1 (clocks are being reset)."""
        self._send("STOPPING=1")


STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name)
    for name in (
        "SIGTERM",
        "SIGINT",
        "SIGHUP",
        "SIGQUIT",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGPOLL",
    )
    if hasattr(signal, name)
)
"""Every catchable signal whose default action ends the process (SIGPIPE stays ignored,
as Python leaves it): each one stops the loop and the clocks are reset."""


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, received: list[str] | None = None) -> Iterator[None]:
    """Every terminating signal (:data:`STOP_SIGNALS`) sets ``stop``.

    A repeated signal is logged and changes nothing: the reset that follows the stop is
    never interrupted, so every GPU gets its reset. SIGKILL cannot be caught; the next
    start reconciles (see :meth:`daemon.actuator.ClockActuator.reconcile`). Only in the
    main thread; elsewhere this does nothing. ``received`` collects the name of the signal
    that stopped the loop (the node exits 130 after its reset when it was SIGINT).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.warning("received %s again; still stopping (resetting clocks first)", name)
            return
        log.info("received %s; stopping", name)
        if received is not None:
            received.append(name)
        stop.set()

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, handler)
        except (OSError, ValueError):  # pragma: no cover - a platform without it
            continue
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ----------------------------------------------------------------------- domains
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


class Domain:
    """One control domain: observer, safety-wrapped controller, actuator, counters.

    Args:
        name: domain label.
        observer: its GPUs and engine.
        controller: the controller in its safety chain (:func:`daemon.decide.build_controller`).
        actuator: its GPUs' clock actuator (entered by :func:`run`).
        failsafe: on stale engine data or a controller exception, lock the maximum clock
            (``"max"``) or unlock.
        label: controller name for metrics (default: the controller's ``name``).
        solve_clock: wall clock for timing the controller.
        max_controller_failures: controller exceptions in a row survived before
            :meth:`tick` raises :class:`ControllerFailure`.
        budget: the domain's power budget sources (:class:`daemon.power_budget.PowerBudget`):
            each tick the budget in force replaces the observation's ``power_limit_w``
            and the controller's need is followed after each decision; None: neither.
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
    ) -> None:
        if max_controller_failures < 1:
            raise ValueError(f"max_controller_failures must be >= 1, got {max_controller_failures}")
        self.name = name
        self.observer = observer
        self.controller = controller
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
        self.budget = budget
        self.energy = EnergyEstimator()
        """Energy attribution per window and model (:mod:`daemon.energy`)."""
        self._energy_failed = False

    def _estimate_energy(self, observed: Observed) -> None:
        """Fold this tick into the energy estimate; a failure is logged once and never
        stops the loop (the estimate only reports)."""
        try:
            self.energy.update(reading_from(observed), learned_phase_model(self.controller))
        except Exception as error:  # the estimate must never cost a decision
            if not self._energy_failed:
                self._energy_failed = True
                log.warning("domain %s: energy estimate failed: %r", self.name, error)

    def _failsafe_clock(self) -> tuple[float | None, int]:
        """Apply the fail-safe: lock the top clock (``"max"``) or unlock."""
        if self.failsafe_mode == "max":
            clocks = self.observer.supported_clocks_mhz()
            target = clocks[-1]
            return target, self.actuator.apply(int(target))
        return None, self.actuator.unlock()

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
        return self._failsafe_clock()

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
        if invalid <= self._invalid_logged:
            return
        outside = outside_layer(self.controller)
        what = (
            outside.last_invalid
            if outside is not None and outside.last_invalid is not None
            else "a non-finite value"
        )
        if self._invalid_logged == 0:
            log.warning(
                "domain %s: controller %r returned %s at t=%.3fs (step %d), not a clock in "
                "MHz; the top clock instead (counted as invalid_decision)",
                self.name,
                self.label,
                what,
                now_s,
                step,
            )
        elif now_s - self._invalid_logged_s >= CONTROLLER_ERROR_LOG_EVERY_S:
            log.warning(
                "domain %s: controller %r still returns no clock: %d invalid decision(s) "
                "so far, the last %s",
                self.name,
                self.label,
                invalid,
                what,
            )
        else:
            return
        self._invalid_logged = invalid
        self._invalid_logged_s = now_s

    def _write_path(self, problem: str | None) -> None:
        """Log the clock writes' path (the actuator) going away and coming back, once each."""
        if problem is not None and self.write_path_down is None:
            mode = "maximum clock" if self.failsafe_mode == "max" else "unlocked"
            log.warning(
                "domain %s: clock writes cannot go through (%s); fail-safe: %s, retried every tick",
                self.name,
                problem,
                mode,
            )
        elif problem is None and self.write_path_down is not None:
            log.warning("domain %s: clock writes go through again; fail-safe ended", self.name)
        self.write_path_down = problem

    def observe(self, now_s: float, step: int) -> Observed:
        """This tick's GPU reads and engine scrape (:meth:`DomainObserver.observe`), no
        decision: :func:`run` calls it for every domain at once on a node, each on its
        own thread, then :meth:`tick` with its result in the main thread.

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
            observed = self.budget.apply(observed)
        self.last = observed
        self._estimate_energy(observed)
        self.actuator.check_readback(observed.gpu_samples)
        decision: float | None = None
        solve_s: float | None = None
        failed = False
        requested: float | None
        problem = self.actuator.write_path_problem()
        if problem is not None or self.write_path_down is not None:
            self._write_path(problem)
        if problem is not None:
            self.fallbacks["actuator_unavailable"] = (
                self.fallbacks.get("actuator_unavailable", 0) + 1
            )
            requested, writes = self._failsafe_clock()
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
                requested, writes = self._failsafe_clock()
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
            applied_mhz=self.actuator.applied_mhz,
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
            gpu_read_errors_total=dict(self.observer.gpu_read_errors),
            fallbacks_total=self.fallback_counts(),
            solve_buckets=tuple(self.solve.buckets()),
            solve_sum_s=self.solve.sum_s,
            external_clock_changes_total=dict(self.actuator.external_changes),
            clock_write_failures_total=dict(self.actuator.write_failures),
            yielded_gpus=tuple(sorted(self.actuator.yielded)),
            model=self.model_status(),
            energy=self.energy.snapshot(),
            power_budget=None if self.budget is None else self.budget.status(),
        )

    def model_status(self) -> dict[str, Any] | None:
        """The controller's learning status when it learns a model (``mpc-online``)."""
        for layer in layers(self.controller):
            if isinstance(layer, Learner):
                value = layer.status()
                return value if isinstance(value, dict) else None
        return None

    def close_controller(self) -> None:
        """Let the controller release or persist what it holds (``mpc-online`` saves its
        model); logs a failure and never raises."""
        # The outermost closable layer: a ControllerWrapper closes the layers inside it.
        closable = next(
            (layer for layer in layers(self.controller) if isinstance(layer, Closable)),
            None,
        )
        if closable is None:
            return
        try:
            closable.close()
        except Exception as error:  # one controller's close never blocks another's
            log.warning("domain %s: closing the controller failed: %r", self.name, error)


# ----------------------------------------------------------------------- the loop
TickSink = Callable[[Sequence[TickRecord]], None]


@dataclass
class RunStats:
    """Totals of one run."""

    ticks: int = 0
    overruns: int = 0
    tick_seconds: list[float] = field(default_factory=list)


class ConcurrentObservation:
    """Every domain's :meth:`Domain.observe` at once, one thread per domain.

    Read one after another, one domain's trouble was every domain's: each hung engine
    cost every tick its whole scrape deadline before the next domain was read (period
    0.2 s, scrape timeout 0.15 s: with three hung engines of four the healthy domain
    decided 3 times in 3 s, and its own data went stale between its ticks, so it fell to
    its fail-safe too), and enough of them outlast a systemd ``WatchdogSec=``, which
    kills the daemon with its GPUs locked. Now a tick lasts the slowest domain's
    observation, not their sum. Decisions and clock writes stay in the calling thread,
    in domain order.
    """

    def __init__(self, domains: Sequence[Domain]) -> None:
        self._domains = list(domains)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, len(self._domains)), thread_name_prefix="gpugov-observe"
        )

    def observe(self, now_s: float, step: int) -> list[Observed]:
        """Each domain's observation, in domain order, once every one has returned.

        Raises:
            GpuLost, ...: the first domain's (in domain order) error, after the others
                finished theirs (no read runs on while the clocks are reset).
        """
        futures = [self._pool.submit(domain.observe, now_s, step) for domain in self._domains]
        concurrent.futures.wait(futures)
        return [future.result() for future in futures]

    def close(self) -> None:
        """Let the threads go (never waits: a stop must not wait on a read)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _status_line(records: Sequence[TickRecord]) -> str:
    parts = []
    for record in records:
        state = "FAIL-SAFE" if record.failsafe else f"{record.requested_mhz or 0:.0f} MHz"
        o = record.observation
        parts.append(
            f"{record.domain}: {state}, {o.waiting_requests} waiting, {o.decode_active} running"
        )
    return "; ".join(parts)


def run(
    domains: Sequence[Domain],
    loop: TimedLoop,
    *,
    exporter: Exporter | None = None,
    notify: SystemdNotify | None = None,
    on_tick: TickSink | None = None,
    before_tick: Callable[[float, int], bool] | None = None,
    wall: Callable[[], float] = time.perf_counter,
    keep_tick_times: bool = False,
    max_controller_failures: int | None = None,
    concurrent_observation: bool = False,
) -> RunStats:
    """Run the loop until ``loop.stop`` is set or ``before_tick`` returns True.

    On any way out (stop, signal, a controller failing too often, a lost GPU) the exit
    order is: ``STOPPING=1``, every clock the daemon locked is reset (failures retried
    with backoff), then each domain's controller is closed on its own (``mpc-online``
    saves its model); a failing close is logged and never skips a reset or another
    domain's close.

    Args:
        before_tick: ``(now_s, step) -> stop?``, checked before each tick (simulation end).
        on_tick: receives each tick's records (the ``--record`` writer).
        keep_tick_times: keep every tick's wall duration in the stats (benchmarks).
        max_controller_failures: when given, each domain's limit of controller
            exceptions in a row (``daemon.max_controller_failures``).
        concurrent_observation: observe several domains at once
            (:class:`ConcurrentObservation`; a node's run); False reads them one after
            another (a simulated run, whose domains may share one plant).

    Raises:
        ClocksNotReset: the loop ended normally but some GPUs could not be reset (when
            another error is already on its way out, the failures are logged instead).
    """
    notify = notify or SystemdNotify(environ={})
    stats = RunStats()
    if max_controller_failures is not None:
        if max_controller_failures < 1:
            raise ValueError(f"max_controller_failures must be >= 1, got {max_controller_failures}")
        for domain in domains:
            domain.max_controller_failures = int(max_controller_failures)
    observing = (
        ConcurrentObservation(domains) if concurrent_observation and len(domains) > 1 else None
    )
    try:
        for step, now_s in enumerate(loop):
            if before_tick is not None and before_tick(now_s, step):
                break
            started = wall()
            try:
                if observing is None:
                    records = [domain.tick(now_s, step) for domain in domains]
                else:
                    observed = observing.observe(now_s, step)
                    records = [
                        domain.tick(now_s, step, seen)
                        for domain, seen in zip(domains, observed, strict=True)
                    ]
            except GpuLost as lost:
                lost.mid_run = True  # the command's line: the others are being reset
                raise
            elapsed = wall() - started
            stats.ticks += 1
            if keep_tick_times:
                stats.tick_seconds.append(elapsed)
            if exporter is not None:
                exporter.publish(
                    [domain.snapshot() for domain in domains],
                    LoopSnapshot(
                        ticks_total=stats.ticks,
                        overruns_total=loop.overruns,
                        tick_seconds=elapsed,
                        period_s=loop.period_s,
                    ),
                )
            if on_tick is not None:
                on_tick(records)
            notify.tick(_status_line(records))
    finally:
        if observing is not None:
            observing.close()
        stats.overruns = loop.overruns
        notify.stopping()
        try:
            failed = restore_all(domains)
        finally:  # the clocks first; each controller's close logs its own failure
            for domain in domains:
                domain.close_controller()
        if failed:
            _raise_not_reset(failed, sys.exc_info()[1])
    return stats


def _raise_not_reset(failed: list[str], stopped_by: BaseException | None) -> None:
    """After the exit reset left ``failed`` locked: raise :class:`ClocksNotReset` (exit
    6, the line naming them) in place of the error that stopped the run, which is logged
    first; GPUs still locked are what the operator must act on. Kept are an interrupt
    (not an ``Exception``) and a lost GPU that is the only one left (a lost GPU cannot
    be reset, and exit 5 names it)."""
    message = not_reset_message(failed)
    if stopped_by is None:
        raise ClocksNotReset(message, gpus=tuple(failed))
    lost_alone = isinstance(stopped_by, GpuLost) and failed == [stopped_by.gpu]
    if not isinstance(stopped_by, Exception) or lost_alone:
        log.error("%s", message)
        return
    log.error("the run stopped: %s", stopped_by)
    raise ClocksNotReset(message, gpus=tuple(failed)) from stopped_by


def restore_all(domains: Sequence[Domain]) -> list[str]:
    """Reset every domain's locks (each actuator retries); the labels still locked."""
    failed: list[str] = []
    for domain in domains:
        failed.extend(domain.actuator.restore())
    return failed


def not_reset_message(gpus: Sequence[str]) -> str:
    """The one line naming the GPUs still locked and how to reset them by hand."""
    names = ",".join(gpus)
    return (
        f"could not reset the SM clock lock of GPU(s) {names} after retries; they may still "
        f"be locked: run `gpugov reset-clocks --gpus {names}` as root"
    )
