"""A clock actuator's reset on the way out: every GPU it ever wrote to reset, the first
round started together on a node, failures retried with backoff under the exit's budget,
and a GPU that could not be reset locked at its top clock instead of left low."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpugov.daemon.backend import DryRunBackend, GpuBackend
from gpugov.daemon.clock_writer import ClockWriteHung, ClockWriter, start_writes
from gpugov.daemon.errors import GpuError, GpuLost
from gpugov.daemon.exit_restore import (
    PERMANENT_RESET_ERRORS,
    ExitBudget,
    Outcome,
    restore_each,
)
from gpugov.daemon.lockstate import LockState, gpu_key

# The clock actuator's logger, not this module's: these lines were logged there and keep
# the name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.actuator")


class ExitResets:
    """The exit's resets of :class:`~daemon.actuator.ClockActuator` (:meth:`restore`, and
    :meth:`begin_restore` for the exit that starts every domain's at once). What each GPU
    holds is the actuator's to remember: a reset here clears its lock and record."""

    _backends: list[GpuBackend]
    _writers: dict[str, ClockWriter]
    _touched: set[str]
    _exit_started: dict[str, tuple[float, float]] | None
    _write_deadline_s: float | None
    _sleep: Callable[[float], Any]
    _range: Callable[[GpuBackend, int], tuple[int, int]]
    _held_low: Callable[[str, int], bool]
    _holds: Callable[[GpuBackend, tuple[int, int] | None], None]
    domain: str
    locked_mhz: dict[str, int | None]
    yielded: set[str]
    lost: set[str]
    state: LockState | None
    reset_attempts: int
    reset_backoff_s: float

    def restore(self, budget: ExitBudget | None = None) -> list[str]:
        """Reset every GPU ever written to, retrying failures with backoff; never raises.

        A GPU that is lost, refuses permission or lacks the call is not retried (it would
        fail the same way), nor, on a node, one whose reset (or an earlier write) hangs
        past the write deadline, so a hung GPU holds the exit at most that deadline; any
        other failure is retried ``reset_attempts`` times. With ``budget`` (the exit's,
        shared by every GPU's restores) each reset is waited for at most what is left of
        it, and once it is spent no other reset is started: those GPUs are returned too.

        On a node the first round's resets start together and are waited for under one
        deadline, as a tick's writes are: GPUs whose reset hangs cost the exit that
        deadline once, not each, and cannot spend the budget before a healthy GPU after
        them is reset.

        Returns:
            Labels of the GPUs that could not be reset (they may still be locked).
        """
        gpus = self._exit_gpus()
        started, self._exit_started = self._exit_started, None
        if started is None:
            started = self._start_exit_resets(gpus, budget)
        not_reset = restore_each(
            gpus,
            functools.partial(self._reset_at_exit, budget=budget, started=started),
            what="reset",
            still=lambda backend: "it may still be locked",
            log=log,
            domain=self.domain,
            attempts=self.reset_attempts,
            backoff_s=self.reset_backoff_s,
            sleep=self._sleep,
            budget=budget,
        )
        for backend in gpus:
            if backend.label in not_reset:
                self._top_at_exit(backend, budget)
        return not_reset

    def _top_at_exit(self, backend: GpuBackend, budget: ExitBudget | None) -> None:
        """A GPU the exit could not reset, held below its top clock (or at unknown clocks):
        lock the top clock instead, as the loop's fail-safe does, so it is not left low
        until someone resets it. Not for a lost GPU, one whose write hangs, or once the
        exit's budget is spent; a lock that fails too is only logged (DEBUG)."""
        label = backend.label
        writer = self._writers[label]
        if label in self.lost or writer.hanging or (budget is not None and budget.spent):
            return
        try:
            top = max(backend.supported_clocks_mhz())
            if not self._held_low(label, top):
                return
            clock_range = self._range(backend, top)
            writer.write(
                clock_range, wait_s=None if budget is None else budget.wait_s(writer.deadline_s)
            )
        except GpuError as error:
            log.debug("domain %s: GPU %s: top clock at exit failed: %s", self.domain, label, error)
            return
        self._holds(backend, clock_range)
        log.warning(
            "domain %s: GPU %s: its reset failed; locked at the top clock (%d MHz) instead, so "
            "it is not held low (it is still locked: gpugov reset-clocks unlocks it)",
            self.domain,
            label,
            top,
        )

    def begin_restore(self, budget: ExitBudget | None = None) -> None:
        """Start :meth:`restore`'s first resets now, without waiting for them: the exit
        starts every domain's before it waits for any (:func:`daemon.loop.restore_all`),
        so domains whose GPUs hang share one deadline as a domain's GPUs do."""
        self._exit_started = self._start_exit_resets(self._exit_gpus(), budget)

    def _exit_gpus(self) -> list[GpuBackend]:
        """The GPUs the exit resets: every one written to and not yielded."""
        return [b for b in self._backends if b.label in self._touched - self.yielded]

    def _start_exit_resets(
        self, gpus: Sequence[GpuBackend], budget: ExitBudget | None
    ) -> dict[str, tuple[float, float]]:
        """On a node, start the exit's first reset of every GPU in ``gpus`` at once; per GPU
        started, when its wait ends (``time.monotonic``) and the wait said in its line.
        A GPU whose earlier write still hangs is not started (its reset fails as it
        would have); none is once ``budget`` is spent."""
        deadline_s = self._write_deadline_s
        if deadline_s is None or (budget is not None and budget.spent):
            return {}
        wait_s = deadline_s if budget is None else budget.wait_s(deadline_s)
        assert wait_s is not None
        refused = start_writes([(self._writers[backend.label], None) for backend in gpus])
        ends_s = time.monotonic() + wait_s  # the threads' waits are in real seconds
        return {b.label: (ends_s, wait_s) for b in gpus if b.label not in refused}

    def _reset_at_exit(
        self,
        backend: GpuBackend,
        attempt: int,
        *,
        budget: ExitBudget | None,
        started: dict[str, tuple[float, float]] | None = None,
    ) -> Outcome:
        """One GPU's exit reset, try ``attempt`` (from 0) of :meth:`restore`'s. On a node
        it waits for the reset at most ``write_deadline_s`` (or what is left of
        ``budget``), and not at all while an earlier write to the GPU still hangs; a reset
        that hangs is not retried (a retry could not start while it hangs, and each
        domain's backoff would add to the exit): the GPU may still be locked, and is
        reported so."""
        writer = self._writers[backend.label]
        begun = None if started is None else started.pop(backend.label, None)
        try:
            if begun is not None:  # the first round's, started with the others
                ends_s, said_s = begun
                writer.finish(max(0.0, ends_s - time.monotonic()), deadline_s=said_s)
            else:
                wait_s = None if budget is None else budget.wait_s(writer.deadline_s)
                writer.write(None, wait_s=wait_s)
        except ClockWriteHung as error:
            writer.count_failure()
            log.error("domain %s: reset failed: %s; not retried", self.domain, error)
            return "failed"
        except PERMANENT_RESET_ERRORS as error:
            writer.count_failure()
            if isinstance(error, GpuLost):
                self.lost.add(backend.label)
            log.error("domain %s: reset failed: %s", self.domain, error)
            return "failed"
        except GpuError as error:
            writer.count_failure()
            log.warning(
                "domain %s: reset failed (attempt %d of %d): %s",
                self.domain,
                attempt + 1,
                self.reset_attempts,
                error,
            )
            return "retry"
        self._touched.discard(backend.label)
        self.locked_mhz[backend.label] = None
        if self.state is not None:
            self.state.clear(gpu_key(backend))
        dry = " (dry run: not written)" if isinstance(backend, DryRunBackend) else ""
        log.info("domain %s: GPU %s clocks reset%s", self.domain, backend.label, dry)
        return "done"


__all__ = ["ExitResets"]
