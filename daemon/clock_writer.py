"""One GPU's clock writes: in order, bounded by a deadline on a node, a hung write kept until
its outcome is taken, failures counted and logged; the mechanics a clock actuator writes by.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.deadline import CallTimeout, SerialCalls
from gpugov.daemon.episode_log import FailureRun
from gpugov.daemon.errors import TransientGpuError

# The actuator's logger, not this module's: these lines were logged there and keep the
# name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.actuator")
_NO_EPOCH = object()  # no write session seen yet

WRITE_FAILURE_LOG_EVERY_S = 60.0
"""While a GPU's clock writes keep failing, one reminder line per this many seconds."""


class ClockWriteHung(TransientGpuError):
    """A GPU's clock write has not returned within its deadline (it goes on in the
    background), or an earlier one to that GPU is still hanging (no other is started)."""


@dataclass(frozen=True, slots=True)
class HungWrite:
    """A clock write that ran past its deadline: the range it locks (None: a reset) and
    when it started (the writer's clock)."""

    clock_range: tuple[int, int] | None
    started_s: float

    @property
    def what(self) -> str:
        """The write in words, for the log."""
        if self.clock_range is None:
            return "reset"
        low, high = self.clock_range
        return f"lock at {low}-{high} MHz"


@dataclass(frozen=True, slots=True)
class LateWrite:
    """A write that ran past its deadline and has since returned: the write, and what it
    raised (None: it went through)."""

    write: HungWrite
    error: Exception | None


class WriteFailureLog:
    """Rate-limited log of one domain's failing clock writes (or, ``subject = "power
    limit"``, power limit writes), per GPU.

    A write that fails every tick would otherwise log a line every period (3,600 an hour
    at 1 s). Logged: the first failure; then, while it goes on, one reminder per
    ``every_s`` with the failures in a row and the lines left out since the last one
    (those go to DEBUG); and one line when a write to that GPU succeeds again. Writes that
    fail now and then log at most one such run per ``every_s``
    (:class:`~daemon.episode_log.EpisodeLog`).
    """

    def __init__(
        self,
        domain: str,
        *,
        every_s: float = WRITE_FAILURE_LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        subject: str = "clock",
    ) -> None:
        self.domain = domain
        self.every_s = every_s
        self.subject = subject
        self._clock = clock
        self._runs: dict[str, FailureRun] = {}

    def failed(
        self, gpu: str, what: str, error: Exception, *, then: str = "retrying every tick"
    ) -> None:
        """One failed ``what`` ("lock", "reset"; "write" of a power limit) on ``gpu``;
        logs it or counts it. ``then`` says, in the first line, what happens next."""
        run = self._runs.setdefault(gpu, FailureRun(self.every_s, self._clock))
        line = run.failed()
        if line.kind == "start":
            log.warning(
                "domain %s: %s; %s (while it fails, one line a minute)%s",
                self.domain,
                error,
                then,
                line.note,
            )
        elif line.kind == "reminder":
            log.warning(
                "domain %s: GPU %s: %s %s still failing: %d failures in a row over %.0f s "
                "(%d not logged): %s",
                self.domain,
                gpu,
                self.subject,
                what,
                line.count,
                line.seconds,
                line.left_out,
                error,
            )
        else:
            log.debug("domain %s: %s; retrying next tick", self.domain, error)

    def succeeded(self, gpu: str) -> None:
        """A write to ``gpu`` went through; one line if it had been failing."""
        run = self._runs.get(gpu)
        ended = None if run is None else run.succeeded()
        if ended is not None:
            count, seconds, loud = ended
            log.log(
                logging.WARNING if loud else logging.DEBUG,
                "domain %s: GPU %s: %s writes succeed again after %d failure(s) (%.0f s)",
                self.domain,
                gpu,
                self.subject,
                count,
                seconds,
            )

    def failing(self, gpu: str) -> int:
        """Failures in a row on ``gpu`` now (0: its last write went through)."""
        run = self._runs.get(gpu)
        return 0 if run is None else run.in_a_row


class ClockWriter:
    """Writes one GPU's clock locks and resets, and counts the ones that fail.

    With ``deadline_s`` (a node, on the wall clock) the writes run on a worker thread of
    their own (:class:`~daemon.deadline.SerialCalls`), one at a time in the order made,
    and the caller waits for one at most that long, so a write that hangs in the driver
    holds neither the loop nor the other GPUs. A write past it goes on in the background
    (:attr:`hung`), and no other write to the GPU is started until it has returned, as one
    would only queue behind it in the driver and could land in either order; once it has
    returned, :meth:`settle` gives what it did, once. Without a deadline (a simulated run,
    ``gpugov reset-clocks``) each write runs on the caller's thread: deterministic, and
    never hung.

    What the GPU holds after a write, and what a hung one may have left, is the caller's
    to judge (:class:`~daemon.actuator.ClockActuator`).

    Args:
        backend: the GPU.
        failure_log: the domain's log of failing writes, shared by its GPUs.
        deadline_s: how long the caller waits for one write (None: on its own thread).
        clock: monotonic seconds, for when a write started.
    """

    def __init__(
        self,
        backend: GpuBackend,
        failure_log: WriteFailureLog,
        *,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.label = backend.label
        self.failure_log = failure_log
        self.failures = 0
        """Failed lock and reset writes (``gpugov_clock_write_failures_total``)."""
        self._clock = clock
        self._calls = (
            None
            if deadline_s is None
            else SerialCalls(
                deadline_s, name=f"clocks-{self.label}", cause="a hung GPU call", clock=clock
            )
        )
        self._hung: HungWrite | None = None
        self._epoch: object = _NO_EPOCH

    @property
    def hanging(self) -> bool:
        """Whether a write that ran past its deadline is still running."""
        return self._calls is not None and self._calls.hanging

    @property
    def hung(self) -> HungWrite | None:
        """The write that ran past its deadline, until its outcome is taken
        (:meth:`settle`) or, once it has returned, a later write drops it."""
        return self._hung

    def path_problem(self) -> tuple[str | None, bool]:
        """For a backend that writes through another process (the actuator, zeusd): renew
        its lease. Returns why writes cannot go through now (None: they can), and whether
        its session is new since the last call (``write_epoch`` changed: the old lease
        ended and its locks were reset). A backend that writes itself: ``(None, False)``."""
        check = getattr(self.backend, "write_path_problem", None)
        if check is None:
            return None, False
        problem: str | None = check()
        epoch = getattr(self.backend, "write_epoch", None)
        renewed = self._epoch is not _NO_EPOCH and self._epoch != epoch
        self._epoch = epoch
        return problem, renewed

    def write(self, clock_range: tuple[int, int] | None) -> None:
        """Lock the GPU's SM clock into ``clock_range`` (None: reset it): on the caller's
        thread, or, with a deadline, on the GPU's writer thread, waiting at most that long.

        Raises:
            ClockWriteHung: the write has not returned in that time (it goes on in the
                background, and this GPU is written no more until it has returned), or an
                earlier write to it is still hanging (this one is not started).
            GpuError: what the write raised.
        """
        backend = self.backend
        target: Callable[[], None] = (
            backend.reset_clocks
            if clock_range is None
            else functools.partial(backend.lock_clocks, *clock_range)
        )
        calls = self._calls
        if calls is None:
            target()
            return
        hung = self._hung
        if hung is not None:
            if calls.busy:
                raise self._still_hanging(hung)
            self._hung = None  # it returned; what it did no longer matters (the exit)
        started = self._clock()
        try:
            calls.call(target)
        except CallTimeout:
            write = self._hung = HungWrite(clock_range, started)
            raise ClockWriteHung(
                f"GPU {self.label}: clock {write.what}: no answer within "
                f"{calls.deadline_s:g} s (a hung GPU call)",
                gpu=self.label,
            ) from None

    def settle(self) -> LateWrite | None:
        """Whether the GPU may be written now, and what a write that hung did.

        Returns:
            None when no write hangs; else the write that hung and has since returned,
            with what it raised, given once.

        Raises:
            ClockWriteHung: that write still hangs (no other may start).
        """
        hung = self._hung
        if hung is None or self._calls is None:
            return None
        try:
            outcome = self._calls.late()
        except CallTimeout:
            raise self._still_hanging(hung) from None
        self._hung = None
        return None if outcome is None else LateWrite(hung, outcome.error)

    def _still_hanging(self, hung: HungWrite) -> ClockWriteHung:
        """The error of a write not started because ``hung`` still hangs."""
        return ClockWriteHung(
            f"GPU {self.label}: the clock {hung.what} started "
            f"{self._clock() - hung.started_s:.1f} s ago has not returned (a hung GPU "
            "call); no other write to it is started",
            gpu=self.label,
        )

    def failed(self, what: str, error: Exception, *, then: str = "retrying every tick") -> None:
        """One failed ``what`` ("lock", "reset"): counted, and logged at the failure log's
        pace; ``then`` says, in its first line, what happens next."""
        self.failures += 1
        self.failure_log.failed(self.label, what, error, then=then)

    def count_failure(self) -> None:
        """One failed write, counted only: its caller logs it its own way (the exit's
        reset, reconcile, a write refused for good)."""
        self.failures += 1

    def succeeded(self) -> None:
        """A write went through: one line if writes had been failing."""
        self.failure_log.succeeded(self.label)
