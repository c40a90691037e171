"""Deadlines for work the daemon loop cannot bound, run on a worker thread: an outside
controller's decision (:class:`DecisionDeadline`) and a state file's write
(:class:`LatestWriter`). Late work costs a tick's decision or leaves a file out of date,
never the loop.

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
"""

from __future__ import annotations

import copy
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from gpugov.controllers.contract import ControllerWrapper
from gpugov.plant.types import ClockController, ServingObservation

log = logging.getLogger(__name__)

WRITE_DEADLINE_S = 0.5
"""How long a state file's write may hold the loop (:class:`LatestWriter`). A healthy
disk writes and fsyncs such a file (a few kB) in milliseconds, so only a hung one reaches
it; it is the engine scrape's longest timeout (0.5 s), far below the unit's
``WatchdogSec=`` and ``TimeoutStopSec=`` (30 s), and it is paid once per hang: while a
write that ran past it is still running, later writes do not wait."""


class DecisionTimeout(Exception):
    """The controller has not decided within its deadline (or is still running a call
    that did not): the domain holds its fail-safe for the tick."""


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
        if not math.isfinite(deadline_s) or deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive and finite, got {deadline_s!r}")
        self.deadline_s = float(deadline_s)
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
        if call.error is not None:
            raise call.error
        return call.answer  # the chain outside judges a non-numeric answer

    def close(self) -> None:
        """Retire the worker thread and close the inner controller, unless a late call is
        still running in it (closing it under that call is not safe, and a hung close
        would stall the exit); that thread ends when the call returns."""
        if self._calls is not None:
            self._calls.put(None)
            self._calls = None
        if self.busy:
            log.warning(
                "controller %r: a late call is still running; the controller is not closed",
                self.name,
            )
            return
        super().close()


class WriteTimeout(TimeoutError):
    """A write has not finished within its deadline (a hung disk or mount): it goes on in
    the background, and the newest payload posted is written once the disk answers. An
    ``OSError``, as a failed write is."""


class LatestWriter:
    """Writes the payloads posted to it with ``write`` on a worker thread, one at a time;
    the caller waits for its write up to ``deadline_s`` (:meth:`write`).

    Latest wins: a payload posted while an earlier write is still running replaces any
    posted payload not yet started, so after a hung write the newest payload is written
    next and an older one never lands after a newer one. While a write that ran past a
    caller's deadline is still running, :meth:`wait` does not wait at all (it raises
    :class:`WriteTimeout` at once): a hung disk costs the loop one deadline, not one per
    write. The worker is a daemon thread that runs while there is something to write, so
    neither the process's exit nor an idle writer keeps a thread.

    Args:
        write: writes one payload (a state file); what it raises is raised to the caller
            waiting for that payload.
        deadline_s: seconds a caller waits for its write, above 0 and finite.
        name: names the worker thread.
        clock: monotonic seconds (for the messages only).
    """

    def __init__(
        self,
        write: Callable[[Any], None],
        deadline_s: float = WRITE_DEADLINE_S,
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not math.isfinite(deadline_s) or deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive and finite, got {deadline_s!r}")
        self.deadline_s = float(deadline_s)
        self.name = name
        self._write = write
        self._clock = clock
        self._changed = threading.Condition()
        self._next: tuple[int, Any] | None = None
        """The newest payload posted and not yet started, with its number."""
        self._posted = 0
        """The number of the newest payload posted (they count from 1)."""
        self._finished = 0
        """The number of the last payload whose write finished; ``_error``, its error."""
        self._error: Exception | None = None
        self._started_s: float | None = None
        """When the write running now started (None: none is)."""
        self._overdue = False
        """A caller's deadline passed while the write running now ran."""
        self._working = False
        """A worker thread runs (until it finds nothing posted)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> LatestWriter:
        """An idle writer with the same write and deadline: a thread and its locks cannot
        be copied."""
        return LatestWriter(
            copy.deepcopy(self._write, memo), self.deadline_s, name=self.name, clock=self._clock
        )

    @property
    def busy(self) -> bool:
        """Whether a payload posted is not written yet (a write hangs, or the newest waits
        behind it)."""
        with self._changed:
            return self._finished < self._posted

    def post(self, payload: Any) -> None:
        """Hand ``payload`` to the worker without waiting; it replaces a posted payload
        not yet started."""
        with self._changed:
            self._posted += 1
            self._next = (self._posted, payload)
            if not self._working:
                self._working = True
                threading.Thread(
                    target=self._work, name=f"gpugov-writer-{self.name}", daemon=True
                ).start()

    def wait(self, wait_s: float | None = None) -> None:
        """Wait until the newest payload posted is written: at most ``wait_s`` (default
        ``deadline_s``), and not at all while a write that ran past a deadline is still
        running.

        Raises:
            WriteTimeout: not written in that time; the write goes on.
            Exception: what the write of that payload raised (``OSError``, ...).
        """
        wait_s = self.deadline_s if wait_s is None else wait_s
        with self._changed:
            number = self._posted
            if self._finished < number and self._overdue:
                started = self._started_s
                age = 0.0 if started is None else self._clock() - started
                raise WriteTimeout(
                    f"a write has been hanging for {age:.1f} s: a hung disk or mount"
                )
            if not self._changed.wait_for(lambda: self._finished >= number, timeout=wait_s):
                self._overdue = True
                raise WriteTimeout(
                    f"the write has not finished within {wait_s:g} s: a hung disk or mount; "
                    "it goes on in the background"
                )
            if self._error is not None:
                raise self._error

    def write(self, payload: Any, wait_s: float | None = None) -> None:
        """:meth:`post` ``payload``, then :meth:`wait` for it.

        Raises:
            WriteTimeout: not written in time; the write goes on.
            Exception: what the write raised.
        """
        self.post(payload)
        self.wait(wait_s)

    def _work(self) -> None:
        """Write the newest payload posted until none is left, then end."""
        while True:
            with self._changed:
                if self._next is None:
                    self._working = False
                    return
                number, payload = self._next
                self._next = None
                self._started_s = self._clock()
            error: Exception | None = None
            try:
                self._write(payload)
            except Exception as caught:  # the worker's outermost edge: handed to the caller
                error = caught
            with self._changed:
                self._started_s = None
                self._overdue = False
                self._finished, self._error = number, error
                self._changed.notify_all()


__all__ = [
    "WRITE_DEADLINE_S",
    "DecisionDeadline",
    "DecisionTimeout",
    "LatestWriter",
    "WriteTimeout",
]
