"""A decision deadline for outside controllers on a node: the call runs in a worker thread
and a late one costs its domain the tick (the fail-safe), never the loop.

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


__all__ = ["DecisionDeadline", "DecisionTimeout"]
