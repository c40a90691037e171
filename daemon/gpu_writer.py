"""One GPU's writes of one kind (its clock locks and resets, or its power limit calls):
in order, bounded by a deadline on a node, a hung write kept until its outcome is taken,
failures counted and logged; the mechanics both actuators write by
(:mod:`daemon.actuator`, :mod:`daemon.power_limit`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from gpugov.daemon.deadline import CallTimeout, SerialCalls
from gpugov.daemon.episode_log import FailureRun
from gpugov.daemon.errors import TransientGpuError

# The clock actuator's logger, not this module's: these lines were logged there and keep
# the name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.actuator")

T = TypeVar("T")
W = TypeVar("W", bound="Write")

WRITE_FAILURE_LOG_EVERY_S = 60.0
"""While a GPU's writes keep failing, one reminder line per this many seconds."""


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


class Write(Protocol):
    """What a writer's caller says about a write, kept while it hangs."""

    @property
    def what(self) -> str:
        """The write in words, for the log ("lock at 1200-1200 MHz", "write of 300 W")."""
        ...


@dataclass(frozen=True, slots=True)
class HungCall(Generic[W]):
    """A write that ran past its deadline, and when it started (the writer's clock)."""

    write: W
    started_s: float

    @property
    def what(self) -> str:
        """The write in words, for the log."""
        return self.write.what


@dataclass(frozen=True, slots=True)
class LateCall(Generic[W]):
    """A write that ran past its deadline and has since returned: the write, when it
    started, and what it raised (None: it went through)."""

    write: W
    started_s: float
    error: Exception | None

    @property
    def what(self) -> str:
        """The write in words, for the log."""
        return self.write.what


@dataclass(slots=True)
class _Started(Generic[W]):
    """A call :meth:`GpuWriter.start` began: what it is, its write, when it started, and
    (run on the caller's thread) its outcome, what it returned and raised."""

    what: str
    write: W | None
    started_s: float
    outcome: tuple[Any, Exception | None] | None = None


class GpuWriter(Generic[W]):
    """Makes one GPU's calls of one kind (its clock writes, or its power limit calls), and
    counts the writes that fail.

    With ``deadline_s`` (a node, on the wall clock) the calls run on a worker thread of
    their own (:class:`~daemon.deadline.SerialCalls`), one at a time in the order made,
    and the caller waits for one at most that long, so a call that hangs in the driver
    holds neither the loop nor the other GPUs. A call past it goes on in the background
    (:attr:`hanging`; a write is kept as :attr:`hung`), and no other call to the GPU is
    started until it has returned, as one would only queue behind it in the driver and
    could land in either order; once it has returned, :meth:`settle` gives what the write
    did, once. Without a deadline (a simulated run, ``gpugov reset-clocks``) each call
    runs on the caller's thread: deterministic, and never hung.

    What the GPU holds after a write, and what a hung one may have left, is the caller's
    to judge (the actuators).

    Args:
        label: the GPU's label.
        failure_log: the domain's log of failing writes, shared by its GPUs; its
            ``subject`` names the kind of call in messages ("clock", "power limit").
        hung_error: what a call past its deadline (or one not started behind it) raises.
        others: what is not started while one hangs ("write", "power limit call").
        thread: names the worker thread (with the GPU's label).
        deadline_s: how long the caller waits for one call (None: on its own thread).
        clock: monotonic seconds, for when a call started.
    """

    def __init__(
        self,
        label: str,
        failure_log: WriteFailureLog,
        *,
        hung_error: type[TransientGpuError],
        others: str,
        thread: str,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.failure_log = failure_log
        self.failures = 0
        """Failed writes (an actuator's ``write_failures``)."""
        self.subject = failure_log.subject
        self._others = others
        self._hung_error = hung_error
        self._clock = clock
        self._calls = (
            None
            if deadline_s is None
            else SerialCalls(
                deadline_s, name=f"{thread}-{self.label}", cause="a hung GPU call", clock=clock
            )
        )
        self._hung: HungCall[W] | None = None
        self._started: _Started[W] | None = None
        """The call :meth:`start` began and :meth:`finish` has not taken."""

    @property
    def deadline_s(self) -> float | None:
        """How long the caller waits for one call (None: calls run on its thread)."""
        return None if self._calls is None else self._calls.deadline_s

    @property
    def hanging(self) -> bool:
        """Whether a call that ran past its deadline is still running."""
        return self._calls is not None and self._calls.hanging

    @property
    def hung(self) -> HungCall[W] | None:
        """The write that ran past its deadline, until its outcome is taken
        (:meth:`settle`) or, once it has returned, a later call drops it."""
        return self._hung

    def call(
        self,
        target: Callable[[], T],
        what: str,
        *,
        write: W | None = None,
        wait_s: float | None = None,
    ) -> T:
        """``target()``, one call (``what``, in words): on the caller's thread, or, with a
        deadline, on the GPU's worker thread, waiting at most that long (or ``wait_s``,
        when given: what is left of the exit's budget). A write (``write``, its
        description) that runs past it is kept for :meth:`settle`.

        Raises:
            TransientGpuError: the writer's ``hung_error``: the call has not returned in
                that time (it goes on in the background, and this GPU is called no more
                until it has returned), or an earlier call to it is still hanging (this
                one is not started).
            GpuError: what the call raised.
        """
        self.start(target, what, write=write)
        return cast(T, self.finish(wait_s))

    def start(self, target: Callable[[], Any], what: str, *, write: W | None = None) -> None:
        """Begin :meth:`call`'s call without waiting for it (on the caller's thread, with
        no deadline, it runs now); :meth:`finish` takes its outcome. Several GPUs' writes
        so start together and are waited for under one deadline.

        Raises:
            TransientGpuError: the writer's ``hung_error``: an earlier call to the GPU is
                still hanging (this one is not started).
        """
        calls = self._calls
        if calls is None:
            try:
                outcome: tuple[Any, Exception | None] = (target(), None)
            except Exception as error:  # handed to finish(), as a worker's would be
                outcome = (None, error)
            self._started = _Started(what, write, 0.0, outcome)
            return
        if calls.busy:
            raise self._still_hanging()
        self._hung = None  # it returned; what it did no longer matters (the exit)
        started_s = self._clock()
        calls.start(target)
        self._started = _Started(what, write, started_s)

    def finish(self, wait_s: float | None = None, *, deadline_s: float | None = None) -> Any:
        """The outcome of the call :meth:`start` began, waiting at most ``wait_s``
        (default the writer's deadline): what is left of a deadline several GPUs' calls
        share, ``deadline_s`` (said in the message of a call past it).

        Raises:
            TransientGpuError: the writer's ``hung_error``: no answer in that time (a
                write is kept for :meth:`settle`).
            GpuError: what the call raised.
        """
        started, self._started = self._started, None
        if started is None:
            raise RuntimeError(f"GPU {self.label}: finish() without a call started")
        calls = self._calls
        if calls is None or started.outcome is not None:
            result, error = started.outcome if started.outcome is not None else (None, None)
            if error is not None:
                raise error
            return result
        waited_s = calls.deadline_s if wait_s is None else wait_s
        try:
            return calls.wait(waited_s)
        except CallTimeout:
            if started.write is not None:
                self._hung = HungCall(started.write, started.started_s)
            said_s = waited_s if deadline_s is None else deadline_s
            raise self._hung_error(
                f"GPU {self.label}: {self.subject} {started.what}: no answer within "
                f"{said_s:g} s (a hung GPU call)",
                gpu=self.label,
            ) from None

    def settle(self) -> LateCall[W] | None:
        """Whether the GPU may be written now, and what a write that hung did.

        Returns:
            None when no write hangs; else the write that hung and has since returned,
            with what it raised, given once.

        Raises:
            TransientGpuError: the writer's ``hung_error``: that write still hangs (no
                other may start).
        """
        hung = self._hung
        if hung is None or self._calls is None:
            return None
        try:
            outcome = self._calls.late()
        except CallTimeout:
            raise self._still_hanging() from None
        self._hung = None
        return None if outcome is None else LateCall(hung.write, hung.started_s, outcome.error)

    def _still_hanging(self) -> TransientGpuError:
        """The error of a call not started because an earlier one to the GPU hangs."""
        hung = self._hung
        what = "call" if hung is None else hung.what
        since = "" if hung is None else f" started {self._clock() - hung.started_s:.1f} s ago"
        return self._hung_error(
            f"GPU {self.label}: the {self.subject} {what}{since} has not returned (a hung GPU "
            f"call); no other {self._others} to it is started",
            gpu=self.label,
        )

    def failed(self, what: str, error: Exception, *, then: str = "retrying every tick") -> None:
        """One failed ``what`` ("lock", "reset", "write", "restore", "read"): counted, and
        logged at the failure log's pace; ``then`` says, in its first line, what happens
        next."""
        self.failures += 1
        self.failure_log.failed(self.label, what, error, then=then)

    def count_failure(self) -> None:
        """One failed write, counted only: its caller logs it its own way (the exit's
        restore, reconcile, a write refused for good)."""
        self.failures += 1

    def succeeded(self) -> None:
        """A write went through: one line if writes had been failing."""
        self.failure_log.succeeded(self.label)


__all__ = [
    "WRITE_FAILURE_LOG_EVERY_S",
    "GpuWriter",
    "HungCall",
    "LateCall",
    "Write",
    "WriteFailureLog",
]
