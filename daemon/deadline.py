"""Deadlines for work the daemon loop cannot bound, run on a worker thread: an outside
controller's decision (:class:`DecisionDeadline`), a state file's write
(:class:`LatestWriter`), a file's read while the loop runs (:class:`LatestReader`) and a
GPU's clock writes (:class:`SerialCalls`). Late work costs a tick's decision, leaves a
file out of date, keeps the last value read or a GPU's clock where it was, never the loop.

An outside package's controller (``kind = "external"``) is code the daemon cannot bound:
an infinite loop or a blocking network call inside it would stop the loop, leaving the
GPU at whatever clock it was locked to. :class:`DecisionDeadline` runs each call on one
worker thread and waits at most ``deadline_s`` for it; past that it raises
:class:`DecisionTimeout`, which the loop survives as it survives an exception. While the
late call is still running no new call is started (each such tick raises too), and its
result, when it comes, is discarded. Python cannot kill a thread: a hung call's thread
stays until it returns. It is a daemon thread, so the process's exit never waits for it.

Only a node (wall time) uses it; the in-tree controllers are bounded by their own limits
and run on the loop's thread, and virtual-time runs stay deterministic without it.

A state file (the lock record, ``mpc-online``'s learned model) is written with a
temporary file, fsync and rename; on a hung disk (a stuck NFS or hostPath mount, an fsync
blocked for minutes) that write would hold the loop until the watchdog kills it.
:class:`LatestWriter` writes on a worker thread, the caller waiting for its write up to
:data:`WRITE_DEADLINE_S`; past that the write goes on in the background
(:class:`WriteTimeout`), and the newest payload posted meanwhile is written once the disk
answers, never an older one after it.

A file read while the loop runs (the power budget file, every tick; ``mpc-online``'s
state file, read again while it cannot be read) blocks as long on such a mount, its
``stat`` too. :class:`LatestReader` reads on a worker thread, the caller waiting up to
:data:`READ_DEADLINE_S`; past that the caller keeps what it had (:class:`ReadTimeout`),
no other read of that file starts while the late one runs, and the late read's answer is
the next caller's once it ends.

A GPU's clock write (nvmlDeviceSetGpuLockedClocks, or its reset) can hang in a driver in
trouble, and writes to one GPU must land in the order made. :class:`SerialCalls` runs
each call on one worker thread, one at a time, the caller waiting up to a deadline; past
it (:class:`CallTimeout`) no other call starts until the late one returns, and its
outcome (:class:`CallOutcome`) is then the caller's to take (:meth:`SerialCalls.late`).
"""

from __future__ import annotations

import copy
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from gpugov.controllers.contract import ControllerWrapper
from gpugov.plant.types import ClockController, ServingObservation

log = logging.getLogger(__name__)

T = TypeVar("T")

WRITE_DEADLINE_S = 0.5
"""How long a state file's write may hold the loop (:class:`LatestWriter`). A healthy
disk writes and fsyncs such a file (a few kB) in milliseconds, so only a hung one reaches
it; it is the engine scrape's default timeout (0.5 s), far below the unit's
``WatchdogSec=`` and ``TimeoutStopSec=`` (30 s), and it is paid once per hang: while a
write that ran past it is still running, later writes do not wait."""

EXIT_WRITE_WAIT_S = 5.0
"""How long a state file's last write waits once the clocks are reset (the daemon's final
model save at exit, ``gpugov reset-clocks``' lock record): nothing waits on it any more,
so a disk slower than :data:`WRITE_DEADLINE_S` (an NFS fsync of a second or two) still
gets it, well inside the unit's ``TimeoutStopSec=`` (30 s); a disk already found hung (a
write still running past its deadline) is not waited for at all."""
READ_DEADLINE_S = WRITE_DEADLINE_S
"""How long a file read while the loop runs may hold it (:class:`LatestReader`): the
power budget file, read every tick, and ``mpc-online``'s state file, read again while it
cannot be read. The same bound as a write, and for the same reasons: a healthy disk reads
such a file (a few bytes to a few kB) in well under a millisecond, so only a hung one (a
stuck NFS or hostPath mount, where a ``stat`` blocks too) reaches it, and it is paid once
per hang."""
READER_IDLE_S = 5.0
"""How long a :class:`LatestReader`'s worker thread waits for the next read before it
ends: a file read every tick keeps one thread (a read then costs about 20 us; starting a
thread per read, about 0.1 ms), and a reader idle that long keeps none."""


def _checked_deadline(deadline_s: float) -> float:
    """``deadline_s`` as a float, checked above 0 and finite (every wrapper's deadline).

    Raises:
        ValueError: it is not.
    """
    if not math.isfinite(deadline_s) or deadline_s <= 0:
        raise ValueError(f"deadline_s must be positive and finite, got {deadline_s!r}")
    return float(deadline_s)


class DecisionTimeout(Exception):
    """The controller has not decided within its deadline (or is still running a call
    that did not): the domain holds its fail-safe for the tick."""


def escape_text(error: BaseException) -> str:
    """What code did that raised no ``Exception``, for a line: ``called sys.exit(3)``,
    ``raised GeneratorExit()``, ``raised CancelledError()``."""
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r})"
    return f"raised {error!r}"


def ctrl_c(error: BaseException) -> bool:
    """Whether ``error`` is a KeyboardInterrupt on the main thread, a Ctrl-C: no signal
    reaches another thread, where one is the running code's own, as a ``sys.exit()`` is."""
    return (
        isinstance(error, KeyboardInterrupt)
        and threading.current_thread() is threading.main_thread()
    )


class EscapedCall(RuntimeError):
    """A call on a worker thread raised what is no ``Exception`` (``sys.exit()``, a
    GeneratorExit, an asyncio CancelledError, a KeyboardInterrupt its own code raised):
    handed to the caller as an error, where it ended the worker thread and left the
    caller waiting out its deadline."""


class _Call:
    """One call handed to the worker: the observation in, the answer or error out."""

    __slots__ = ("answer", "done", "error", "observation", "started_s", "target")

    def __init__(
        self, target: ClockController, observation: ServingObservation, started_s: float
    ) -> None:
        self.target = target
        self.observation = observation
        self.started_s = started_s
        self.done = threading.Event()
        self.answer: Any = None
        self.error: BaseException | None = None


class DecisionDeadline(ControllerWrapper):
    """``inner``'s decision, run on a worker thread, or :class:`DecisionTimeout` when it
    takes longer than ``deadline_s`` (or a late call is still running).

    Args:
        inner: the outside algorithm (the safety chain stays outside, on the loop's thread).
        deadline_s: seconds a call may take, above 0 and finite.
        clock: monotonic seconds (for the messages only).
    """

    def __init__(
        self,
        inner: ClockController,
        deadline_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(inner)
        self.deadline_s = _checked_deadline(deadline_s)
        self.timeouts = 0
        """Ticks that ended without a decision (late, or a late call still running)."""
        self.late_results_discarded = 0
        """Late calls that returned (or raised) after their tick; their answers are unused."""
        self._clock = clock
        self._pending: _Call | None = None
        self._calls: queue.SimpleQueue[_Call | None] | None = None
        """The running worker's queue (None: no worker); ``None`` put in it retires it."""

    def __deepcopy__(self, memo: dict[int, Any]) -> DecisionDeadline:
        """A copy around a deep copy of the algorithm, with its own (not yet started)
        worker and no late call: a thread and its locks cannot be copied."""
        copied = DecisionDeadline(
            copy.deepcopy(self.inner, memo), self.deadline_s, clock=self._clock
        )
        copied.name = self.name
        return copied

    @property
    def busy(self) -> bool:
        """Whether a late call is still running on the worker thread."""
        pending = self._pending
        return pending is not None and not pending.done.is_set()

    def _start_worker(self) -> queue.SimpleQueue[_Call | None]:
        """Start a worker thread (a daemon thread: the exit never waits for it); its
        queue. A plain ``ThreadPoolExecutor`` is no use here: the interpreter joins its
        threads at exit, so a hung call would hang the exit."""
        calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        threading.Thread(
            target=self._work, args=(calls,), name=f"gpugov-controller-{self.name}", daemon=True
        ).start()
        self._calls = calls
        return calls

    def _work(self, calls: queue.SimpleQueue[_Call | None]) -> None:
        """Run the calls handed over, one at a time, until :meth:`close` retires this
        worker (a call it is running finishes first)."""
        while (call := calls.get()) is not None:
            try:
                call.answer = call.target(call.observation)
            except BaseException as error:  # handed back to the loop's thread as it is
                call.error = error
            finally:
                call.done.set()

    def __call__(self, observation: ServingObservation) -> float:
        return cast(float, self._decide(self.inner, observation))

    def warm(self, probe: ClockController, observation: ServingObservation) -> Any:
        """Run the warm-up's decision ``probe`` (on a copy of the algorithm) on the worker
        thread, with the same deadline as a decision: a node's start never waits longer
        than that on outside code. A probe still running past it is this layer's late
        call: the loop's first ticks hold the fail-safe until it returns.

        Raises:
            DecisionTimeout: no answer within the deadline.
        """
        return self._decide(probe, observation)

    def _decide(self, target: ClockController, observation: ServingObservation) -> Any:
        """``target(observation)`` on the worker thread, within the deadline."""
        pending = self._pending
        if pending is not None:
            if not pending.done.is_set():
                self.timeouts += 1
                raise DecisionTimeout(
                    f"still running the call started {self._clock() - pending.started_s:.1f} s "
                    f"ago (deadline {self.deadline_s:g} s)"
                )
            self._pending = None  # it came back late: its answer belongs to a past tick
            self.late_results_discarded += 1
        call = _Call(target, observation, self._clock())
        (self._calls or self._start_worker()).put(call)
        if not call.done.wait(self.deadline_s):
            self._pending = call
            self.timeouts += 1
            raise DecisionTimeout(f"no decision within its deadline of {self.deadline_s:g} s")
        error = call.error
        if error is not None and not isinstance(error, Exception):
            # No signal reaches the worker: a KeyboardInterrupt (or sys.exit()) there is
            # the code's own, a failed decision; raised as it is it stopped the node as a
            # Ctrl-C does, naming no controller.
            raise EscapedCall(escape_text(error)) from error
        if error is not None:
            raise error
        return call.answer  # the chain outside judges a non-numeric answer

    def close(self) -> None:
        """Retire the worker thread and close the inner controller, unless a late call is
        still running in it (closing it under that call is not safe, and a hung close
        would stall the exit); that thread ends when the call returns. The close runs on
        a thread of its own, waited for at most :data:`CLOSE_WAIT_S`: outside code whose
        close never returned (a flush to a service that went away) held the exit, after
        the resets, until the unit's stop timeout killed it."""
        if self._calls is not None:
            self._calls.put(None)
            self._calls = None
        if self.busy:
            log.warning(
                "controller %r: a late call is still running; the controller is not closed",
                self.name,
            )
            return
        closing = SerialCalls(CLOSE_WAIT_S, name=f"close-{self.name}", cause="a hung close")
        try:
            closing.call(super().close)
        except CallTimeout:
            log.warning(
                "controller %r: its close has not returned within %g s; exiting without it",
                self.name,
                CLOSE_WAIT_S,
            )


CLOSE_WAIT_S = 1.0
"""How long the exit waits for a deadline-bound controller's close (outside code) before
it goes on without it (:meth:`DecisionDeadline.close`)."""


class WriteTimeout(TimeoutError):
    """A write has not finished within its deadline (a hung disk or mount): it goes on in
    the background, and the newest payload posted is written once the disk answers. An
    ``OSError``, as a failed write is."""


class ReadTimeout(TimeoutError):
    """A read has not finished within its deadline (a hung disk or mount): it goes on in
    the background, and its answer is the next read's (:class:`LatestReader`). An
    ``OSError``, as a file that cannot be read is."""


class _DiskWorker:
    """The worker thread behind :class:`LatestWriter` and :class:`LatestReader`: runs
    ``job(payload)`` for the newest payload posted, one at a time, on a daemon thread,
    and a caller waits for its payload up to a deadline; while a job that ran past a
    caller's deadline is still running, callers do not wait at all.

    The worker thread runs while there is something to do, then ``idle_s`` more for the
    next payload (0: it ends at once), so neither the process's exit nor an idle worker
    keeps a thread.
    """

    _noun = "job"
    """What one job is, in the timeout's message ("write", "read")."""
    _cause = "a hung disk or mount"
    """What a job past its deadline is taken for, in the timeout's message."""
    _timeout: type[TimeoutError] = TimeoutError
    _thread = "gpugov-worker"

    def __init__(
        self,
        job: Callable[[Any], Any],
        deadline_s: float,
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
        idle_s: float = 0.0,
    ) -> None:
        self.deadline_s = _checked_deadline(deadline_s)
        self.name = name
        self._job = job
        self._clock = clock
        self._idle_s = float(idle_s)
        self._changed = threading.Condition()
        self._next: tuple[int, Any] | None = None
        """The newest payload posted and not yet started, with its number."""
        self._posted = 0
        """The number of the newest payload posted (they count from 1)."""
        self._finished = 0
        """The number of the last payload whose job finished; ``_result`` or ``_error``,
        what it returned or raised."""
        self._result: Any = None
        self._error: Exception | None = None
        self._started_s: float | None = None
        """When the job running now started (None: none is)."""
        self._overdue = False
        """A caller's deadline passed while the job running now ran."""
        self._working = False
        """A worker thread runs (until it finds nothing posted)."""

    @property
    def busy(self) -> bool:
        """Whether a payload posted is not done yet (a job hangs, or the newest waits
        behind it)."""
        with self._changed:
            return self._finished < self._posted

    def _post_locked(self, payload: Any) -> None:
        """Hand ``payload`` to the worker (the lock held); it replaces a posted payload
        not yet started."""
        self._posted += 1
        self._next = (self._posted, payload)
        if self._working:
            self._changed.notify_all()  # a worker waiting for the next payload
            return
        self._working = True
        threading.Thread(target=self._work, name=f"{self._thread}-{self.name}", daemon=True).start()

    def _wait_locked(self, wait_s: float) -> Any:
        """Wait (the lock held) until the newest payload posted is done: at most
        ``wait_s``, and not at all while a job that ran past a deadline is still running;
        what its job returned.

        Raises:
            TimeoutError: the class's timeout (:class:`WriteTimeout`, :class:`ReadTimeout`):
                not done in that time; the job goes on.
            Exception: what the job of that payload raised.
        """
        number = self._posted
        if self._finished < number and self._overdue:
            raise self._hanging_locked()
        if not self._changed.wait_for(lambda: self._finished >= number, timeout=wait_s):
            self._overdue = True
            raise self._timeout(
                f"the {self._noun} has not finished within {wait_s:g} s: {self._cause}; it "
                "goes on in the background"
            )
        if self._error is not None:
            raise self._error
        return self._result

    def _hanging_locked(self) -> TimeoutError:
        """The class's timeout for a job still running past a caller's deadline (the lock
        held)."""
        started = self._started_s
        age = 0.0 if started is None else self._clock() - started
        return self._timeout(f"a {self._noun} has been hanging for {age:.1f} s: {self._cause}")

    def _work(self) -> None:
        """Run the job of the newest payload posted until none is left (for ``idle_s``),
        then end."""
        while True:
            with self._changed:
                if self._next is None and self._idle_s > 0:
                    self._changed.wait_for(lambda: self._next is not None, timeout=self._idle_s)
                if self._next is None:
                    self._working = False
                    return
                number, payload = self._next
                self._next = None
                self._started_s = self._clock()
            result: Any = None
            error: Exception | None = None
            try:
                result = self._job(payload)
            except Exception as caught:  # the worker's outermost edge: handed to the caller
                error = caught
            except BaseException as caught:  # no signal reaches a worker: the code's own
                error = EscapedCall(escape_text(caught))
            with self._changed:
                self._started_s = None
                self._overdue = False
                self._finished, self._result, self._error = number, result, error
                self._changed.notify_all()


class LatestWriter(_DiskWorker):
    """Writes the payloads posted to it with ``write`` on a worker thread, one at a time;
    the caller waits for its write up to ``deadline_s`` (:meth:`write`).

    Latest wins: a payload posted while an earlier write is still running replaces any
    posted payload not yet started, so after a hung write the newest payload is written
    next and an older one never lands after a newer one. While a write that ran past a
    caller's deadline is still running, :meth:`wait` does not wait at all (it raises
    :class:`WriteTimeout` at once): a hung disk costs the loop one deadline, not one per
    write. The worker is a daemon thread that runs while there is something to write (and
    ``idle_s`` more), so neither the process's exit nor an idle writer keeps a thread.

    Args:
        write: writes one payload (a state file); what it raises is raised to the caller
            waiting for that payload.
        deadline_s: seconds a caller waits for its write, above 0 and finite.
        name: names the worker thread.
        clock: monotonic seconds (for the messages only).
        idle_s: seconds the worker waits for the next payload before it ends (0: a
            file written now and then starts a thread per write; one written every tick,
            a recording, keeps its thread with :data:`READER_IDLE_S`).
    """

    _noun = "write"
    _timeout = WriteTimeout
    _thread = "gpugov-writer"

    def __init__(
        self,
        write: Callable[[Any], None],
        deadline_s: float = WRITE_DEADLINE_S,
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
        idle_s: float = 0.0,
    ) -> None:
        super().__init__(write, deadline_s, name=name, clock=clock, idle_s=idle_s)

    def __deepcopy__(self, memo: dict[int, Any]) -> LatestWriter:
        """An idle writer with the same write and deadline: a thread and its locks cannot
        be copied."""
        return LatestWriter(
            copy.deepcopy(self._job, memo),
            self.deadline_s,
            name=self.name,
            clock=self._clock,
            idle_s=self._idle_s,
        )

    def post(self, payload: Any) -> None:
        """Hand ``payload`` to the worker without waiting; it replaces a posted payload
        not yet started."""
        with self._changed:
            self._post_locked(payload)

    def wait(self, wait_s: float | None = None) -> None:
        """Wait until the newest payload posted is written: at most ``wait_s`` (default
        ``deadline_s``), and not at all while a write that ran past a deadline is still
        running.

        Raises:
            WriteTimeout: not written in that time; the write goes on.
            Exception: what the write of that payload raised (``OSError``, ...).
        """
        with self._changed:
            self._wait_locked(self.deadline_s if wait_s is None else wait_s)

    def write(self, payload: Any, wait_s: float | None = None) -> None:
        """:meth:`post` ``payload``, then :meth:`wait` for it.

        Raises:
            WriteTimeout: not written in time; the write goes on.
            Exception: what the write raised.
        """
        self.post(payload)
        self.wait(wait_s)


class _LateAnswer(_DiskWorker):
    """A :class:`_DiskWorker` whose job that ran past a caller's deadline keeps its answer
    (what it returned or raised) for a later caller to take (:class:`LatestReader`,
    :class:`SerialCalls`)."""

    _late = False
    """A job ran past a caller's deadline and its answer has not been taken."""

    @property
    def hanging(self) -> bool:
        """Whether a job that ran past a caller's deadline is still running."""
        with self._changed:
            return self._late and self._finished < self._posted


class LatestReader(_LateAnswer, Generic[T]):
    """Reads one file with ``read`` on a worker thread; the caller waits for the read up
    to ``deadline_s`` (:meth:`read`).

    One read at a time, never a pile of them: while a read that ran past a caller's
    deadline is still running (a hung disk or mount), :meth:`read` starts no other and
    raises :class:`ReadTimeout` at once, so a hung file costs the loop one deadline, not
    one per read, and one thread. Once that late read has ended, the next call takes its
    answer (what it returned or raised) without waiting, as the newest read started; the
    call after it reads afresh. The worker is a daemon thread that waits ``idle_s`` for
    the next read before it ends: a file read every tick keeps one thread, and an idle
    reader none.

    Args:
        read: reads the file (its path is its own); what it raises is raised to the
            caller that takes its answer.
        deadline_s: seconds a caller waits for a read, above 0 and finite.
        name: names the worker thread.
        clock: monotonic seconds (for the messages only).
        idle_s: seconds the worker thread waits for the next read before it ends.
    """

    _noun = "read"
    _timeout = ReadTimeout
    _thread = "gpugov-reader"

    def __init__(
        self,
        read: Callable[[], T],
        deadline_s: float = READ_DEADLINE_S,
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
        idle_s: float = READER_IDLE_S,
    ) -> None:
        super().__init__(self._run, deadline_s, name=name, clock=clock, idle_s=idle_s)
        self._read = read
        self._started = False
        """A read :meth:`start` began whose answer the next :meth:`read` takes."""

    def __deepcopy__(self, memo: dict[int, Any]) -> LatestReader[T]:
        """An idle reader with the same read and deadline: a thread and its locks cannot
        be copied."""
        return LatestReader(
            copy.deepcopy(self._read, memo),
            self.deadline_s,
            name=self.name,
            clock=self._clock,
            idle_s=self._idle_s,
        )

    def _run(self, _payload: Any) -> T:
        return self._read()

    def start(self) -> None:
        """Start a read now, without waiting for it, unless one is running or an answer
        waits to be taken: the next :meth:`read` takes its answer. Several readers'
        reads so run at once, and their callers wait for them under one deadline
        (:class:`daemon.gpu_sampling.DomainGpus`: a tick's GPU samples)."""
        with self._changed:
            if self._finished < self._posted or self._late:
                return
            self._started = True
            self._post_locked(None)

    def read(self, wait_s: float | None = None) -> T:
        """The file's contents as ``read`` gives them: read now on the worker thread (or
        the read :meth:`start` began), waiting at most ``wait_s`` (default
        ``deadline_s``; 0: not at all); or, once a read that ran past its deadline has
        ended, that read's answer at once.

        Raises:
            ReadTimeout: no answer in that time (the read goes on in the background), or a
                late read is still running (no other is started).
            Exception: what the read raised (``OSError``, an input file error, ...).
        """
        with self._changed:
            idle = self._finished >= self._posted
            started, self._started = self._started, False
            if self._late and idle:
                self._late = False  # the late read's answer, taken once
                if self._error is not None:
                    raise self._error
                return cast(T, self._result)
            if idle and not started:
                self._post_locked(None)
            wait = self.deadline_s if wait_s is None else max(0.0, wait_s)
            try:
                return cast(T, self._wait_locked(wait))
            except ReadTimeout:
                self._late = True
                raise


def _invoke(target: Callable[[], Any]) -> Any:
    """A :class:`SerialCalls` job: the call handed over."""
    return target()


class CallTimeout(TimeoutError):
    """A call has not returned within its deadline (:class:`SerialCalls`), or an earlier
    one is still running: it goes on in the background, and no other call starts until it
    returns."""


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What a call that ran past its deadline returned (``result``) or raised
    (``error``), once it ended (:meth:`SerialCalls.late`)."""

    result: Any
    error: Exception | None


class SerialCalls(_LateAnswer):
    """Runs the calls handed to it on one worker thread, one at a time and in the order
    they were made; the caller waits for its call up to ``deadline_s`` (:meth:`call`).

    For calls whose order matters, one GPU's clock writes
    (:class:`daemon.clock_writer.ClockWriter`): a call never starts before the one before it
    has returned. A call that runs past the caller's deadline goes on in the background
    (:class:`CallTimeout`), and while it runs :meth:`call` starts no other and raises
    :class:`CallTimeout` at once, so a hung call costs the caller one deadline, not one
    per call, and a later call can never land before or beside it. Once it has returned,
    :meth:`late` gives its outcome (what it returned or raised), once; a :meth:`call` made
    before that drops it. The worker is a daemon thread (the process's exit never waits
    for a hung call) that waits ``idle_s`` for the next call before it ends.

    Args:
        deadline_s: seconds a caller waits for its call, above 0 and finite.
        name: names the worker thread.
        cause: what a call past its deadline is taken for, in the timeout's message.
        clock: monotonic seconds (for the messages only).
        idle_s: seconds the worker thread waits for the next call before it ends.
    """

    _noun = "call"
    _timeout = CallTimeout
    _thread = "gpugov-calls"

    def __init__(
        self,
        deadline_s: float,
        *,
        name: str,
        cause: str = "a hung call",
        clock: Callable[[], float] = time.monotonic,
        idle_s: float = READER_IDLE_S,
    ) -> None:
        super().__init__(_invoke, deadline_s, name=name, clock=clock, idle_s=idle_s)
        self._cause = cause

    def call(self, target: Callable[[], T], wait_s: float | None = None) -> T:
        """``target()`` on the worker thread, waiting at most ``wait_s`` (default
        ``deadline_s``) for it.

        Raises:
            CallTimeout: it has not returned in that time (it goes on in the background;
                :meth:`late` gives its outcome once it has), or an earlier call is still
                running (this one is not started).
            Exception: what ``target`` raised.
        """
        self.start(target)
        return cast(T, self.wait(wait_s))

    def start(self, target: Callable[[], Any]) -> None:
        """Start ``target()`` on the worker thread without waiting for it; :meth:`wait`
        takes its outcome. Several workers' calls so run at once, and their caller waits
        for them under one deadline (a tick's clock writes, one per GPU).

        Raises:
            CallTimeout: an earlier call is still running (this one is not started).
        """
        with self._changed:
            if self._finished < self._posted:
                raise self._hanging_locked()
            self._late = False  # an outcome not taken: this call is newer
            self._post_locked(target)

    def wait(self, wait_s: float | None = None) -> Any:
        """What the call :meth:`start` began returned, waiting at most ``wait_s``
        (default ``deadline_s``; 0: not at all, though one that has returned is taken).

        Raises:
            CallTimeout: it has not returned in that time (it goes on in the background;
                :meth:`late` gives its outcome once it has).
            Exception: what it raised.
        """
        with self._changed:
            try:
                return self._wait_locked(self.deadline_s if wait_s is None else max(0.0, wait_s))
            except CallTimeout:
                self._late = True
                raise

    def late(self) -> CallOutcome | None:
        """The outcome of the call that ran past its deadline, once it has returned, taken
        once; None when there is none to take.

        Raises:
            CallTimeout: that call is still running.
        """
        with self._changed:
            if self._late and self._finished < self._posted:
                raise self._hanging_locked()
            if not self._late:
                return None
            self._late = False
            return CallOutcome(self._result, self._error)


__all__ = [
    "EXIT_WRITE_WAIT_S",
    "READER_IDLE_S",
    "READ_DEADLINE_S",
    "WRITE_DEADLINE_S",
    "CallOutcome",
    "CallTimeout",
    "DecisionDeadline",
    "DecisionTimeout",
    "EscapedCall",
    "LatestReader",
    "LatestWriter",
    "ReadTimeout",
    "SerialCalls",
    "WriteTimeout",
    "ctrl_c",
    "escape_text",
]
