"""The control loop: observe, decide, actuate, publish, on a period that never drifts.

```python
with ClockActuator(backends) as actuator:        # restores the GPUs' clocks on exit, always
    for now_s in TimedLoop(period_s, clock):
        observation = observer.observe(now_s)    # NVML + engine, or the simulated plant
        requested_mhz = controller(observation)
        actuator.apply(requested_mhz)            # writes only when the decision changed
        exporter.publish(observation, requested_mhz)
```

:func:`run` is that loop over several domains (each one's tick and fail-safe:
:mod:`daemon.domain`), with systemd notifications and the per-tick record. The clock and
the sleeper are injected, so tests and the simulated mode run it on virtual time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol

from gpugov.daemon.deadline import EXIT_WRITE_WAIT_S
from gpugov.daemon.domain import Domain, TickRecord
from gpugov.daemon.errors import (
    DRIVER_GONE_CODES,
    ClocksNotReset,
    DriverGone,
    GpuLost,
    GpuUnavailable,
)
from gpugov.daemon.exit_restore import ExitBudget
from gpugov.daemon.exporter import Exporter, LoopSnapshot
from gpugov.daemon.limits import MIN_PERIOD_S
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.observer import Observed
from gpugov.daemon.sd_notify import SocketNotifier
from gpugov.daemon.stop_signals import (
    STOP_SIGNALS,
    StopEvent,
    off_handler,
    set_from_handler,
    signal_name,
)

log = logging.getLogger(__name__)


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
        self.stop = stop or StopEvent()
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
        self._stop = stop or StopEvent()

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
        notifier: what sends each message (default: a
            :class:`~daemon.sd_notify.SocketNotifier`; tests pass a recorder).
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
            # Not sdnotify's notifier: its blocking send waited on a full socket queue.
            notifier = SocketNotifier(env)
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
            # A period is at least MIN_PERIOD_S: under a WatchdogSec of twice that or less
            # no period fits, and "a period under 0.05 s" was advice no config can take.
            shorter = (
                f"use a period under {self.watchdog_s / 2:g} s or "
                if self.watchdog_s / 2 > MIN_PERIOD_S
                else ""
            )
            raise ValueError(
                f"daemon.period_s = {period_s:g} s is too long for the unit's WatchdogSec="
                f"{self.watchdog_s:g}s (the loop pings the watchdog once per tick); {shorter}"
                f"raise WatchdogSec" + ("" if shorter else f" above {2 * MIN_PERIOD_S:g}s")
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


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, received: list[str] | None = None) -> Iterator[None]:
    """Every terminating signal (:data:`STOP_SIGNALS`) sets ``stop``.

    A repeated signal is logged and changes nothing: the reset that follows the stop is
    never interrupted, so every GPU gets its reset. SIGKILL cannot be caught; the next
    start reconciles (see :meth:`daemon.actuator.ClockActuator.reconcile`). Only in the
    main thread; elsewhere this does nothing. ``received`` collects the name of the signal
    that stopped the loop (the node exits 130 after its reset when it was SIGINT).

    The handler takes no lock (:func:`~daemon.stop_signals.set_from_handler`): ``stop``
    (a :class:`~daemon.stop_signals.StopEvent` reads as set at once) is set and the lines
    are logged from a thread of its own.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    seen: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        # No lock is taken here, a log line's or the event's: see set_from_handler.
        name = signal_name(signum)
        if seen or stop.is_set():
            off_handler(
                functools.partial(
                    log.warning, "received %s again; still stopping (resetting clocks first)", name
                )
            )
            return
        seen.append(name)
        if received is not None:
            received.append(name)
        set_from_handler(stop, first=functools.partial(log.info, "received %s; stopping", name))

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
        if seen:  # the stop's log line, written on a thread of its own, is out before the exit
            (stop.settled if isinstance(stop, StopEvent) else stop.wait)(1.0)


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
    reset_advice: ResetAdvice | None = None,
    restore_budget: Callable[[], ExitBudget] = ExitBudget,
) -> RunStats:
    """Run the loop until ``loop.stop`` is set or ``before_tick`` returns True.

    On any way out (stop, signal, a controller failing too often, a lost GPU) the exit
    order is: ``STOPPING=1``, every clock the daemon locked is reset and every power limit
    it set restored (failures retried with backoff; the lock record's writes are handed
    over without waiting; all of it within one budget, ``restore_budget()``: once that is
    spent no other restore starts and those GPUs are reported as not restored), the lock
    record's last write is waited for (at most its write deadline:
    :meth:`daemon.lockstate.LockState.flush`), then each domain's controller is closed on
    its own (``mpc-online`` saves its model, within the same bound); a failing close is
    logged and never skips a reset or another domain's close. Each tick first writes again
    a lock record whose last write failed or is still running
    (:meth:`daemon.lockstate.LockState.retry`); its failures and whether it is out of date
    are published with the loop's counters.

    Args:
        before_tick: ``(now_s, step) -> stop?``, checked before each tick (simulation end).
        on_tick: receives each tick's records (the ``--record`` writer).
        keep_tick_times: keep every tick's wall duration in the stats (benchmarks).
        max_controller_failures: when given, each domain's limit of controller
            exceptions in a row (``daemon.max_controller_failures``).
        concurrent_observation: observe several domains at once
            (:class:`ConcurrentObservation`; a node's run); False reads them one after
            another (a simulated run, whose domains may share one plant).
        reset_advice: how the exit line tells the operator to reset GPUs left locked
            (the backend and the config; default: NVML's command, as root).
        restore_budget: makes the exit's budget for its restores when the exit starts
            (:class:`~daemon.exit_restore.ExitBudget`, :data:`EXIT_RESTORE_BUDGET_S`).

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
    states = lock_states(domains)
    try:
        for step, now_s in enumerate(loop):
            if before_tick is not None and before_tick(now_s, step):
                break
            started = wall()
            for state in states:  # a lock record whose last write failed: write it again
                state.retry()
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
                lost.other_gpus = max(0, sum(len(d.observer.gpus.backends) for d in domains) - 1)
                raise
            except GpuUnavailable as gone:
                if gone.code not in DRIVER_GONE_CODES:
                    raise
                # Said at the start, "no NVIDIA driver on this machine"; here the driver
                # was unloaded or replaced under the loop. The exit below resets what NVML
                # still answers for and names the GPUs it could not reset (exit 6).
                raise DriverGone.from_unavailable(gone) from gone
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
                        lock_state_write_failures_total=sum(s.write_failures for s in states),
                        lock_state_stale=any(s.stale for s in states),
                        # A sink that can leave ticks out (the recording) counts them.
                        recording_dropped_ticks_total=int(getattr(on_tick, "dropped_ticks", 0)),
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
        for state in states:  # no GPU's reset waits on the disk for another's record
            state.defer_writes()
        budget = restore_budget()  # one for every GPU's restores of both kinds
        try:
            failed = restore_all(domains, budget)
        finally:  # the clocks first, then the power limits; each close logs its failure
            try:
                capped = restore_power_limits(domains, budget)
            finally:
                try:
                    for state in states:  # the resets' record, within the write deadline
                        state.flush()
                finally:
                    close_controllers(domains)
        if failed or capped:
            found_lost = {label for domain in domains for label in domain.actuator.lost}
            raise_not_reset(failed, sys.exc_info()[1], capped, reset_advice, found_lost)
    return stats


CLOSE_SLACK_S = 1.0
"""What the controllers' closes together may take beyond one state file's last write
(:data:`~daemon.deadline.EXIT_WRITE_WAIT_S`): the model's last windows and its checks."""


def close_controllers(
    domains: Sequence[Domain], wait_s: float = EXIT_WRITE_WAIT_S + CLOSE_SLACK_S
) -> list[str]:
    """Close every domain's controller (``mpc-online`` saves its model) at once, each on
    its own thread, all waited for at most ``wait_s`` together; the names of the domains
    whose close had not ended by then (one line; the exit goes on without them). One
    after another, each final save waiting up to its 5 s on a disk that stopped answering
    at the stop, eight domains took 40 s and outlasted the units' ``TimeoutStopSec=``
    (30 s): systemd killed the daemon before its last lines. A single domain closes on
    this thread, as before, and so does every controller whose close saves no model (an
    outside controller's code was never written to close beside another)."""
    savers = [domain for domain in domains if _saves_a_model(domain)]
    for domain in domains:
        if len(savers) <= 1 or domain not in savers:
            domain.close_controller()
    if len(savers) <= 1:
        return []
    domains = savers
    threads = [
        threading.Thread(target=domain.close_controller, name=f"close-{domain.name}", daemon=True)
        for domain in domains
    ]
    for thread in threads:
        thread.start()
    ends_s = time.monotonic() + wait_s
    for thread in threads:
        thread.join(max(0.0, ends_s - time.monotonic()))
    left = [
        domain.name for domain, thread in zip(domains, threads, strict=True) if thread.is_alive()
    ]
    if left:
        log.warning(
            "domain(s) %s: closing the controller (mpc-online's final model save) has not "
            "ended within %g s; exiting without it",
            ", ".join(left),
            wait_s,
        )
    return left


def _saves_a_model(domain: Domain) -> bool:
    """Whether ``domain``'s controller keeps a learned model in the state directory
    (``mpc-online``'s :class:`~daemon.model_store.PersistentOnlineModel`), whose close
    waits on the disk; never true where that module was never loaded."""
    store = sys.modules.get("gpugov.daemon.model_store")
    if store is None:
        return False
    from gpugov.controllers.contract import layers

    return any(
        isinstance(layer, store.PersistentOnlineModel) for layer in layers(domain.controller)
    )


def raise_not_reset(
    failed: list[str],
    stopped_by: BaseException | None,
    capped: Mapping[str, float] | None = None,
    advice: ResetAdvice | None = None,
    lost: Collection[str] = (),
) -> None:
    """After the exit reset left ``failed`` locked (and ``capped``'s power limits not
    restored): raise :class:`ClocksNotReset` (exit 6, the line naming them) in place of the
    error that stopped the run, which is logged first; GPUs still locked or capped are
    what the operator must act on. Kept are an interrupt (not an ``Exception``) and a
    lost GPU when the GPUs left are it and others the exit found ``lost`` too (a lost GPU
    cannot be reset, and exit 5 names them: GPUs lost together, a baseboard's, were exit
    6 and a ``gpugov reset-clocks`` that cannot reach them)."""
    capped = dict(capped or {})
    message = not_reset_message(failed, capped, advice)
    gpus = (*failed, *(label for label in capped if label not in failed))
    if stopped_by is None:
        raise ClocksNotReset(message, gpus=gpus)
    lost_only = isinstance(stopped_by, GpuLost) and all(
        label == stopped_by.gpu or label in lost for label in gpus
    )
    if isinstance(stopped_by, GpuLost) and lost_only:
        stopped_by.also_lost = tuple(label for label in gpus if label != stopped_by.gpu)
        # Not `message`: its `gpugov reset-clocks` (or `nvidia-smi -pl`) cannot reach them.
        log.error("%s", lost_message(gpus, bool(capped)))
        return
    if not isinstance(stopped_by, Exception):
        log.error("%s", message)
        return
    log.error("the run stopped: %s", stopped_by)
    raise ClocksNotReset(message, gpus=gpus) from stopped_by


def lock_states(domains: Sequence[Domain]) -> list[LockState]:
    """The lock records the domains' clock and power limit actuators write (one per node
    run, shared; none in a dry run or a simulation), each once."""
    found: dict[int, LockState] = {}
    for domain in domains:
        for actuator in (domain.actuator, domain.power_limits):
            state = getattr(actuator, "state", None)
            if isinstance(state, LockState):
                found.setdefault(id(state), state)
    return list(found.values())


def restore_all(domains: Sequence[Domain], budget: ExitBudget | None = None) -> list[str]:
    """Reset every domain's locks (each actuator retries, within ``budget``, the exit's,
    when given); the labels still locked, or not reset once the budget was spent."""
    for domain in domains:  # every domain's first resets start before any is waited for
        domain.actuator.begin_restore(budget)
    failed: list[str] = []
    for domain in domains:
        failed.extend(domain.actuator.restore(budget))
    return failed


def restore_power_limits(
    domains: Sequence[Domain], budget: ExitBudget | None = None
) -> dict[str, float]:
    """Restore every power limit gpugov set (each actuator retries, within ``budget``,
    the exit's, when given): the GPUs whose original limit could not be restored (or was
    not once the budget was spent), with that limit in watts."""
    failed: dict[str, float] = {}
    for domain in domains:
        limits = domain.power_limits
        if limits is None:
            continue
        for label in limits.restore(budget):
            failed[label] = limits.original_w.get(label, math.nan)
    return failed


@dataclass(frozen=True)
class ResetAdvice:
    """How to reset GPUs by hand, for the line of a run that left some locked.

    ``reset-clocks`` alone opens NVML (root or CAP_SYS_ADMIN); any other backend needs the
    config (the emulator's URL, the actuator's socket, zeusd's address), which needs no
    root except for nvidia-smi's. ``config_path`` is made absolute: the line is read
    later, from another directory (a unit's log)."""

    backend: str = "nvml"
    config_path: str | None = None

    def command(self, names: str) -> str:
        """``run `gpugov reset-clocks ... --gpus NAMES`...`` for the GPUs ``names``."""
        if self.backend == "nvml" or self.config_path is None:
            return f"run `gpugov reset-clocks --gpus {names}` as root"
        config = os.path.abspath(self.config_path)
        command = f"run `gpugov reset-clocks --config {config} --gpus {names}`"
        if self.backend == "nvidia-smi":
            return f"{command} as root"
        return f"{command} ({self.backend} backend)"


def lost_message(gpus: Sequence[str], capped: bool = False) -> str:
    """The line for lost GPUs the exit could not reset: no command reaches a lost GPU (a
    `gpugov reset-clocks` fails on it as the exit's reset did); a driver reload or a
    reboot, which it needs anyway, clears what gpugov set."""
    many = len(gpus) > 1
    what = "SM clock lock" + (" and power limit" if capped else "")
    return (
        f"GPU(s) {','.join(gpus)} lost: {'their' if many else 'its'} {what}"
        f"{'s' if many and not capped else ''} could not be reset; no command reaches "
        f"a lost GPU: the driver reload or reboot it needs clears {'them' if many else 'it'}"
    )


def not_reset_message(
    gpus: Sequence[str],
    capped: Mapping[str, float] | None = None,
    advice: ResetAdvice | None = None,
) -> str:
    """The one line naming the GPUs still locked (and those whose power limit gpugov set
    is not restored) and how to reset them by hand; not "after retries": a lost, refused,
    unsupported or hung GPU is never retried (its own line says why)."""
    parts = []
    if gpus:
        names = ",".join(gpus)
        parts.append(
            f"could not reset the SM clock lock of GPU(s) {names}; they may still be "
            f"locked: {(advice or ResetAdvice()).command(names)}"
        )
    if capped:
        limits = ", ".join(f"GPU {label}: {watts:g} W" for label, watts in capped.items())
        parts.append(
            f"could not restore the power limit of GPU(s) {','.join(capped)}; "
            f"they may still be capped: run `nvidia-smi -i GPU -pl WATTS` as root ({limits})"
        )
    return "; ".join(parts)
