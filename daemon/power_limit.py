"""Power limit actuation for one control domain: set only on change, always restore on
the way out.

A controller that sets a power cap (:class:`~gpugov.plant.types.PowerCapping`: the peers
``power-cap``, ``dps``, ``power-profile``, ``default-dvfs``) asks after each decision for
``requested_power_cap_w``, watts for the whole domain; None is the board limit, which on a
node is the limit each GPU had before gpugov set one. :class:`PowerLimitActuator` applies
it as the clock actuator (:mod:`daemon.actuator`) applies a clock:

* the domain's watts are split over its GPUs so that their limits add up to the cap (an
  equal share, the difference of a GPU whose bounds clamp it taken by the others:
  :meth:`~daemon.power_limit_bounds.PowerLimitBounds.level`), each GPU's share clamped into
  the limits it accepts (``nvmlDeviceGetPowerManagementLimitConstraints``) and never above
  the limit it had before gpugov (gpugov lowers limits, it never raises one an operator
  set); a clamped request is logged once;
* a GPU's limit is written only when its share changed;
* each GPU's limit as found before the first write (``nvmlDeviceGetPowerManagementLimit``)
  is remembered, and recorded in the lock state file (:mod:`daemon.lockstate`) *before*
  the write, so a start after a crash restores it (:meth:`PowerLimitActuator.reconcile`);
* that limit is restored when the controller asks for None again, while the domain is in
  its fail-safe, and on every way out (:meth:`PowerLimitActuator.restore`, retried with
  backoff like the clock reset; the GPUs still not restored are returned by name); a limit
  someone else set since gpugov's write is left as it is;
* a write that fails transiently is counted per GPU (``write_failures``, exported as
  ``gpugov_power_cap_write_failures_total``), logged at most once a minute per GPU
  (:class:`~daemon.gpu_writer.WriteFailureLog`) and retried on the next tick; a write refused
  for good (no root or CAP_SYS_ADMIN, a GPU that cannot set a limit) is one log line, and
  the domain goes on governing its clocks without a cap.

The enforced limit every sample carries is one source of the domain's power budget
(:mod:`daemon.power_budget`); the limit gpugov set itself is no outside budget, so
:meth:`PowerLimitActuator.outside_limit_w` gives the budget the limit found before the
first write, or a limit someone else set since.

On a node (``write_deadline_s``, :data:`POWER_LIMIT_WRITE_DEADLINE_S`) each GPU's power
limit calls (writes, restores, the reads before them, the start's reconcile and the exit's
restore) go through a :class:`~daemon.gpu_writer.GpuWriter` of their own: in order, each
waited for at most that long. A write past it is a failed write, and so is each tick that
wants one while it hangs; no other call to that GPU starts until it returns. It may have
been a lowering: the lock state file's entry, written before it, keeps the original, the
limit written and the limit held before (``held_mw``), so a restart restores the original
whichever the GPU holds, and the exit reports it as possibly still capped (exit 6). Once
it returns, the next tick takes its outcome and then writes the limit wanted now, after
it. A hung read is a failed read. ``docs/daemon.md`` (a hung power limit write) has the
whole rule. A simulated run, ``gpugov reset-clocks`` and the restore of a GPU the config
no longer names call on the caller's thread (no deadline).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpugov.daemon.backend import (
    DryRunBackend,
    GpuBackend,
    GpuSample,
    PowerLimitBackend,
    power_limit_backend,
)
from gpugov.daemon.errors import (
    DRIVER_GONE_CODES,
    ConfigError,
    GpuError,
    GpuLost,
    GpuUnavailable,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.exit_restore import PERMANENT_RESET_ERRORS, ExitBudget, Outcome, restore_each
from gpugov.daemon.gpu_writer import GpuWriter, LateCall, WriteFailureLog
from gpugov.daemon.lockstate import LockState, gpu_key, live_writer, writer_pid_text
from gpugov.daemon.power_limit_bounds import PowerLimitBounds, implausible_limit
from gpugov.daemon.power_limit_ledger import SAME_LIMIT_W, PowerLimitLedger, none_of
from gpugov.plant.input_files import finite_number

log = logging.getLogger(__name__)


def _raise_if_gone(error: GpuError) -> None:
    """Raise ``error`` where it says the driver went away (a code of
    :data:`~daemon.errors.DRIVER_GONE_CODES`): the loop ends the run on it as on a clock
    call's. Taken as a limit that cannot be set, the run went on against a gone driver."""
    if isinstance(error, GpuUnavailable) and error.code in DRIVER_GONE_CODES:
        raise error


POWER_LIMIT_WRITE_DEADLINE_S = 2.0
"""The longest one GPU's power limit call (a write, a restore, or the read of its limit
before one) may hold a node's loop, or its exit: a healthy
nvmlDeviceSetPowerManagementLimit takes milliseconds, so only a hung call reaches it. The
same bound as a GPU's clock write (``CLOCK_WRITE_DEADLINE_S``) and read, paid once per hang
(no other call to that GPU starts while it hangs), far below the unit's ``WatchdogSec=``
and ``TimeoutStopSec=`` (30 s); at exit every GPU's restores of both kinds share one
budget below the latter (:data:`~daemon.exit_restore.EXIT_RESTORE_BUDGET_S`)."""
HUNG_THEN = (
    "nothing more is written to this GPU's power limit until that call returns, then the "
    "limit wanted then is"
)
"""What the first line of a hung power limit write says happens next."""


class PowerLimitCallHung(TransientGpuError):
    """A GPU's power limit call has not returned within its deadline (it goes on in the
    background), or an earlier one to that GPU is still hanging (no other is started)."""


@dataclass(frozen=True, slots=True)
class PowerLimitWrite:
    """A power limit write, kept while it hangs: the limit it sets (watts), whether it
    restores the original, and whether it was gpugov's first write to the GPU."""

    value_w: float
    restore: bool = False
    first: bool = False

    @property
    def what(self) -> str:
        """The write in words, for the log."""
        if self.restore:
            return f"restore to {self.value_w:g} W"
        return f"write of {self.value_w:g} W"


class PowerLimitActuator:
    """Applies one domain's power cap to its GPUs' power limits.

    Args:
        backends: the domain's GPUs; each must set power limits
            (:func:`~daemon.backend.power_limit_backend`).
        domain: name for logs.
        state: where each GPU's original limit is persisted for the next start (None:
            nowhere; a dry run).
        restore_attempts, restore_backoff_s: the exit restore tries a failing GPU this many
            times, sleeping ``backoff * 2**k`` between rounds.
        sleep: for the backoff (tests pass a recorder).
        clock: monotonic seconds, for the rate-limited write-failure log.
        write_deadline_s: when given (a node, on the wall clock), each GPU's power limit
            calls run on a worker thread of their own
            (:class:`~daemon.deadline.SerialCalls`), one at a time in the order made, and
            each is waited for at most this long; a write past it hangs that GPU's power
            limit (see the module's docstring). None (a simulated run, ``gpugov
            reset-clocks``): called on the caller's thread.

    Raises:
        ValueError: no GPU, or a GPU whose power limit cannot be set.
    """

    def __init__(
        self,
        backends: Sequence[GpuBackend],
        *,
        domain: str = "default",
        state: LockState | None = None,
        restore_attempts: int = 5,
        restore_backoff_s: float = 0.2,
        sleep: Callable[[float], Any] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        write_deadline_s: float | None = None,
    ) -> None:
        if not backends:
            raise ValueError(f"domain {domain!r}: a power limit actuator needs at least one GPU")
        found: list[PowerLimitBackend] = []
        for backend in backends:
            limited = power_limit_backend(backend)
            if limited is None:
                raise ValueError(f"domain {domain!r}: GPU {backend.label} cannot set a power limit")
            found.append(limited)
        self._backends = found
        self._gpus = list(backends)
        self.domain = domain
        self.state = state
        self.restore_attempts = max(1, int(restore_attempts))
        self.restore_backoff_s = restore_backoff_s
        self._sleep = sleep
        self.ledger = PowerLimitLedger((b.label for b in found), state)
        """What gpugov remembers of each GPU's limits, and the lock record's entries."""
        self.original_w = self.ledger.original_w
        """Each GPU's power limit before gpugov's first write (:class:`PowerLimitLedger`)."""
        self.held_w = self.ledger.held_w
        """The limit gpugov set and holds on each GPU (None: the original is in force)."""
        self._outside_logged: set[str] = set()
        self.requested_w: float | None = None
        """The domain's cap the controller asked for last (None: the board limit)."""
        self.refused: str | None = None
        """Why power limits cannot be set on this domain (the cap is no longer applied)."""
        self.writes = 0
        self.failure_log = WriteFailureLog(domain, clock=clock, subject="power limit")
        self._clock = clock
        self._writers: dict[str, GpuWriter[PowerLimitWrite]] = {
            b.label: GpuWriter(
                b.label,
                self.failure_log,
                hung_error=PowerLimitCallHung,
                others="power limit call",
                thread="power-limit",
                deadline_s=write_deadline_s,
                clock=clock,
            )
            for b in found
        }
        self.bounds = PowerLimitBounds(domain, self._writers)
        """The cap's request, each GPU's constraints and the clamp into them."""
        self._out_of_range: set[str] = set()
        """GPUs whose original limit was outside their constraints (said once each)."""

    @property
    def applied_w(self) -> float | None:
        """The domain's power limit as gpugov set it, or None when it holds none."""
        return self.ledger.applied_w

    @property
    def hanging_writes(self) -> tuple[str, ...]:
        """The GPUs whose power limit call is still running past its deadline (on a
        node): nothing more is called on them until it returns."""
        return tuple(label for label, writer in self._writers.items() if writer.hanging)

    @property
    def write_failures(self) -> dict[str, int]:
        """Failed power limit writes per GPU (``gpugov_power_cap_write_failures_total``)."""
        return {label: writer.failures for label, writer in self._writers.items()}

    def _settled(self, backend: PowerLimitBackend, what: str) -> bool:
        """Whether ``backend``'s power limit may be written now: no write to it hangs
        (once a hung write has returned, its outcome is taken first,
        :meth:`_take_late`). While one hangs, this call's ``what`` ("write", "restore")
        is one more failed write (counted, and logged at the failure log's pace) and none
        is started.

        Raises:
            GpuLost, Exception: what the hung write raised, once it returned, when the
                same write's error would have been raised.
        """
        writer = self._writers[backend.label]
        try:
            late = writer.settle()
        except PowerLimitCallHung as error:
            writer.failed(what, error, then=HUNG_THEN)
            return False
        if late is not None:
            self._take_late(backend, late)
        return True

    def _bounds_read(self, backend: PowerLimitBackend) -> bool:
        """Whether ``backend``'s constraints are read (or known to be unknown); a read
        that failed for now is one more failed write and the GPU waits for the next
        tick: its share set with its lowest limit unknown (0 W) was refused by NVML, and
        the refusal dropped the cap for the whole run.

        Raises:
            GpuLost: the GPU fell off the bus.
        """
        self.bounds.constraints(backend)
        error = self.bounds.unread.get(backend.label)
        if error is None:
            return True
        self._writers[backend.label].failed("write", error)
        return False

    def _take_late(self, backend: PowerLimitBackend, late: LateCall[PowerLimitWrite]) -> None:
        """A hung write to ``backend`` has returned: the GPU holds what it wrote when it
        went through (its original, after a restore); when it failed, that is one more
        failed write, taken as the same write's error would have been.

        Raises:
            GpuLost, Exception: what it raised, when the same write's error would have
                been raised (a lost GPU; anything that is no GPU error).
        """
        label = backend.label
        hung, error = late.write, late.error
        took = self._clock() - late.started_s
        if error is None:
            log.debug(
                "domain %s: GPU %s: the power limit %s that hung went through after %.1f s",
                self.domain,
                label,
                hung.what,
                took,
            )
            if hung.restore:
                self._restored(backend, hung.value_w)
            else:
                self._written(backend, hung.value_w)
            return
        log.warning(
            "domain %s: GPU %s: the power limit %s that hung returned after %.1f s, failing: "
            "%s; the limit wanted now is written",
            self.domain,
            label,
            hung.what,
            took,
            error,
        )
        if not isinstance(error, GpuError):
            raise error
        if isinstance(error, TransientGpuError):
            return  # counted when it hung; the next write goes through what it may hold
        if hung.restore:
            if isinstance(error, PERMANENT_RESET_ERRORS):  # else: the next tick restores
                self._restore_refused(backend, hung.value_w, error)
                if self.refused is None:
                    self.refused = f"GPU {label}: its power limit cannot be restored"
            return
        if isinstance(error, GpuLost):
            raise error
        self._write_refused(backend, error, hung.value_w, first=hung.first)

    # -------------------------------------------------------------------- apply
    def apply(self, cap_w: float | None) -> int:
        """Set every GPU's share of ``cap_w`` (domain watts) where it changed; None
        restores the limits found before gpugov.

        Returns:
            The number of power limit writes made (0 when nothing changed).

        Raises:
            GpuLost: a GPU fell off the bus (the caller restores what it can).
        A transient failure is counted and retried on the next call; a refusal is logged
        once and the cap is not applied any more.
        """
        request = self.bounds.request(cap_w)
        self.requested_w = request
        if self.refused is not None:
            return 0
        if request is None:
            return self._release()
        written = 0
        ready: list[tuple[PowerLimitBackend, float]] = []
        for backend in self._backends:
            if not self._settled(backend, "write"):
                continue  # a write to it still hangs: none other is started
            original = self._original(backend)
            if self.refused is not None:
                break  # refused: this read, or the hung write that returned
            if original is not None and self._bounds_read(backend):
                ready.append((backend, original))  # else a transient failure: next tick
        if self.refused is not None:
            self._release()
            return written
        share = self.bounds.level(
            request, self._backends, self.original_w, {b.label for b, _ in ready}
        )
        for backend, original in ready:
            if self.refused is not None:
                break  # a write refused for good: no cap from now on
            label = backend.label
            value = self.bounds.clamped(backend, share, original, request)
            if abs(value - original) <= SAME_LIMIT_W:  # its own: restore it if gpugov set one
                if label in self.ledger.touched and self._restore_one(backend, at_exit=False) == (
                    "restored"
                ):
                    written += 1
                continue
            held = self.held_w[label]
            unchanged = (
                held is not None and abs(value - held) < 1e-3 and self.ledger.asked_w[label] == held
            )
            # Read back before a write, and while the share holds (a static cap): a limit
            # someone else set since, above or below gpugov's, is taken at the next tick.
            outside = None if label not in self.ledger.touched else self._outside_change(backend)
            if unchanged and outside is None:
                continue
            if outside is not None:
                # Someone else set this GPU's limit since gpugov's write: it is the new
                # ceiling (never raised), and what is restored at exit or after a crash.
                original = self.original_w[label] = outside
                value = self.bounds.clamped(backend, share, original, request)
                if abs(value - original) <= SAME_LIMIT_W:
                    self.ledger.forget(backend)  # at or under the cap: theirs stands, none of ours
                    continue
            if self._write(backend, value, original):
                written += 1
        if self.refused is not None:
            self._release()
        return written

    def _outside_change(self, backend: PowerLimitBackend) -> float | None:
        """The GPU's limit when someone else set it since gpugov's last write (read before
        gpugov writes over it; logged once a GPU), else None (or when it cannot be read)."""
        label = backend.label
        if isinstance(backend, DryRunBackend):
            return None  # a dry run never set what it holds
        try:
            now = float(self._writers[label].call(backend.power_limit_w, "read"))
        except GpuLost:
            raise
        except GpuError as error:
            _raise_if_gone(error)
            log.debug("GPU %s: power limit not read before writing: %s", label, error)
            return None
        if (problem := self.bounds.implausible(now, backend)) is not None:
            log.debug("GPU %s: power limit not read before writing: %s", label, problem)
            return None
        ours = self.ledger.ours_w(label)
        if self.held_w[label] is None and label in self.original_w:
            ours.append(self.original_w[label])  # a write that failed left it at its own
        if not ours or not none_of(now, ours):
            return None
        if label not in self._outside_logged:
            self._outside_logged.add(label)
            log.warning(
                "domain %s: GPU %s: its power limit is %g W, which gpugov did not set (it set "
                "%g W): someone else changed it; gpugov caps under it from now on and "
                "restores it, not %g W, on its way out (logged once)",
                self.domain,
                label,
                now,
                ours[0],
                self.original_w.get(label, math.nan),
            )
        return now

    def _plausible(self, backend: PowerLimitBackend, now: float | None, why: str) -> float | None:
        """``now``, ``backend``'s limit as read before a restore, or None (unknown) where it
        is no limit the GPU could have (NVML's 0xFFFFFFFF mW): taken for someone else's,
        it left the GPU capped."""
        if now is None:
            return None
        try:
            problem = self.bounds.implausible(now, backend)
        except GpuError:  # its constraints not read (a lost GPU): the restore's write tells
            problem = implausible_limit(now, None)
        if problem is None:
            return now
        log.debug("GPU %s: power limit not read for %s: %s", backend.label, why, problem)
        return None

    def _original(self, backend: PowerLimitBackend) -> float | None:
        """The GPU's limit before gpugov's first write: read now while gpugov holds none
        on it (a limit an operator sets meanwhile is the one to keep under and restore),
        the one read before its first write after that."""
        label = backend.label
        if label in self.original_w and label in self.ledger.touched:
            return self.original_w[label]
        try:
            found = float(self._writers[label].call(backend.power_limit_w, "read"))
        except TransientGpuError as error:  # a read that hangs too
            self._writers[label].failed("read", error)
            return None
        except GpuLost:
            raise
        except GpuError as error:
            _raise_if_gone(error)
            self._refuse(backend, error)
            return None
        problem = self.bounds.implausible(found, backend)
        if problem is not None:
            # Restored at exit, such a reading would be refused (and the run end in exit
            # 6): no write until the GPU reads a limit it could have.
            self._writers[label].failed("read", TransientGpuError(problem))
            return None
        self.original_w[label] = found
        return found

    def _write(self, backend: PowerLimitBackend, value: float, original: float) -> bool:
        """One power limit write of ``value`` watts; True when it went through."""
        label = backend.label
        self.ledger.record(backend, value, original)  # before: a crash right after restores
        first = label not in self.ledger.touched
        self.ledger.touched.add(label)
        self.ledger.asked_w[label] = value
        try:
            self._writers[label].call(
                functools.partial(backend.set_power_limit, value),
                f"write of {value:g} W",
                write=PowerLimitWrite(value, first=first),
            )
        except PowerLimitCallHung as error:
            self._writers[label].failed("write", error, then=HUNG_THEN)
            return False
        except TransientGpuError as error:
            self._writers[label].failed("write", error)
            return False
        except GpuLost:
            self._writers[label].count_failure()
            raise
        except GpuError as error:
            self._writers[label].count_failure()
            _raise_if_gone(error)
            self._write_refused(backend, error, value, first=first)
            return False
        self._written(backend, value)
        return True

    def _written(self, backend: PowerLimitBackend, value: float) -> None:
        """A write of ``value`` watts to ``backend`` went through."""
        label = backend.label
        self._writers[label].succeeded()
        self.held_w[label] = value
        self.bounds.taken(backend, value)
        self.writes += 1
        log.debug("domain %s: GPU %s power limit set to %g W", self.domain, label, value)

    def _write_refused(
        self, backend: PowerLimitBackend, error: GpuError, value: float, *, first: bool
    ) -> None:
        """A write of ``value`` watts to ``backend`` was refused (``first``: gpugov's first
        write to it, so nothing of gpugov's is there to restore): no cap from now on, unless
        it only says where the lowest limit of a GPU whose constraints cannot be read lies
        (:meth:`~daemon.power_limit_bounds.PowerLimitBounds.refused_below`)."""
        label = backend.label
        if first:  # refused, so nothing was written: nothing to restore
            self.ledger.touched.discard(label)
            self.ledger.asked_w.pop(label, None)
            if self.state is not None:
                self.state.clear_power_limit(gpu_key(backend))
        holds = self.held_w.get(label)
        holds = self.original_w.get(label, math.inf) if holds is None else holds
        if not self.bounds.refused_below(backend, value, holds, error):
            self._refuse(backend, error)

    def _refuse(self, backend: PowerLimitBackend, error: GpuError) -> None:
        """Power limits cannot be set here: one line, and no cap from now on."""
        if isinstance(error, PermissionDenied):
            reason = "setting a power limit needs root or CAP_SYS_ADMIN"
        else:
            reason = f"its power limit cannot be set ({error})"
        self.refused = f"GPU {backend.label}: {reason}"
        log.error(
            "domain %s: GPU %s: %s; the controller's power cap is not applied, the clocks are "
            "still governed",
            self.domain,
            backend.label,
            reason,
        )

    def _release(self) -> int:
        """Restore, once each, every GPU that holds a limit gpugov set (a transient
        failure is retried on the next call)."""
        restored = 0
        for backend in self._backends:
            if backend.label not in self.ledger.touched:
                continue
            outcome = self._restore_one(backend, at_exit=False)
            if outcome == "restored":
                restored += 1
            elif outcome == "failed" and self.refused is None:
                # Refused for good (logged): no cap and no retry every tick; the exit
                # restore tries once more and names the GPU if it still fails.
                self.refused = f"GPU {backend.label}: its power limit cannot be restored"
        return restored

    # ------------------------------------------------------------------ restore
    def _restore_one(
        self, backend: PowerLimitBackend, *, at_exit: bool, budget: ExitBudget | None = None
    ) -> str:
        """Put one GPU's original limit back: ``"restored"``, ``"left"`` (nothing to
        write: already there, or someone else set it since), ``"retry"`` (a transient
        failure), ``"hung"`` (on a node: a call to it hangs past the deadline, this one or
        an earlier one, counted, logged in the loop, not at exit; or, at exit, the
        ``budget`` is spent before the write) or ``"failed"`` (for good)."""
        label = backend.label
        writer = self._writers[label]
        wait = functools.partial(_wait_s, budget, writer.deadline_s)
        if not at_exit and not self._settled(backend, "restore"):
            return "hung"
        original = self.original_w.get(label)
        if original is None:
            self.ledger.forget(backend)
            return "left"
        original = self._restorable(backend, original, read=not at_exit)
        if not isinstance(backend, DryRunBackend):  # a dry run never set what it holds
            try:
                now: float | None = float(writer.call(backend.power_limit_w, "read", wait_s=wait()))
            except PowerLimitCallHung as error:
                return self._restore_hung(backend, error, at_exit=at_exit)
            except GpuLost:
                if at_exit:
                    self._writers[label].count_failure()
                    log.error(
                        "domain %s: GPU %s lost; its power limit not restored", self.domain, label
                    )
                    return "failed"
                raise
            except GpuError as error:
                if not at_exit:
                    _raise_if_gone(error)
                now = None
                log.debug("GPU %s: power limit not read before restoring: %s", label, error)
            now = self._plausible(backend, now, "restoring")
            if now is not None and abs(now - original) <= SAME_LIMIT_W:
                self.ledger.forget(backend)
                return "left"
            ours = self.ledger.ours_w(label)
            if now is not None and ours and none_of(now, ours):
                log.warning(
                    "domain %s: GPU %s: its power limit is %g W, which gpugov did not set (it "
                    "set %g W): someone else changed it; left as it is, not restored to %g W",
                    self.domain,
                    label,
                    now,
                    ours[0],
                    original,
                )
                self.ledger.forget(backend)
                return "left"
        if budget is not None and budget.spent:  # the read took what was left
            return self._not_started(backend, budget)
        self.ledger.asked_w[label] = original
        try:
            writer.call(
                functools.partial(backend.set_power_limit, original),
                f"restore to {original:g} W",
                write=PowerLimitWrite(original, restore=True),
                wait_s=wait(),
            )
        except PowerLimitCallHung as error:
            return self._restore_hung(backend, error, at_exit=at_exit)
        except PERMANENT_RESET_ERRORS as error:
            self._writers[label].count_failure()
            self._restore_refused(backend, original, error)
            return "failed"
        except GpuError as error:
            if at_exit:
                self._writers[label].count_failure()
            else:
                _raise_if_gone(error)
                self._writers[label].failed("restore", error)
            return "retry"
        self._restored(backend, original)
        return "restored"

    def _restore_hung(
        self, backend: PowerLimitBackend, error: PowerLimitCallHung, *, at_exit: bool
    ) -> str:
        """A restore of ``backend`` (or the read before it) ran past its deadline, or an
        earlier call to it still hangs: counted; logged through the failure log in the
        loop, at exit as an error (the GPU is named as possibly still capped)."""
        writer = self._writers[backend.label]
        if at_exit:
            writer.count_failure()
            log.error("domain %s: power limit restore failed: %s; not retried", self.domain, error)
        else:
            writer.failed("restore", error, then=HUNG_THEN)
        return "hung"

    def _not_started(self, backend: PowerLimitBackend, budget: ExitBudget) -> str:
        """At exit, ``backend``'s restore is not started: the exit's ``budget`` is spent.
        Reported as a restore that hangs is (the GPU may still be capped)."""
        log.error(
            "domain %s: GPU %s: power limit restore not started: %s",
            self.domain,
            backend.label,
            budget.not_started(),
        )
        return "hung"

    def _restored(self, backend: PowerLimitBackend, original: float) -> None:
        """``backend``'s original limit, ``original`` watts, is back."""
        label = backend.label
        self._writers[label].succeeded()
        self.writes += 1
        self.ledger.forget(backend)
        log.info("domain %s: GPU %s power limit restored to %g W", self.domain, label, original)

    def _restore_refused(
        self, backend: PowerLimitBackend, original: float, error: GpuError
    ) -> None:
        """Restoring ``backend``'s limit to ``original`` watts failed for good: one line."""
        why = (
            "needs root or CAP_SYS_ADMIN"
            if isinstance(error, PermissionDenied)
            else f"failed: {error}"
        )
        log.error(
            "domain %s: GPU %s: restoring its power limit to %g W %s; it may still be capped",
            self.domain,
            backend.label,
            original,
            why,
        )

    def restore(self, budget: ExitBudget | None = None) -> list[str]:
        """Restore every GPU's original limit where gpugov set one, retrying failures with
        backoff; never raises.

        A GPU that is lost, refuses permission or lacks the call is not retried, nor, on a
        node, one whose restore (or an earlier call) hangs past the write deadline, so a
        hung GPU holds the exit at most that deadline; any other failure is retried
        ``restore_attempts`` times. With ``budget`` (the exit's, shared by every GPU's
        restores) each call is waited for at most what is left of it, and once it is
        spent no other restore is started: those GPUs are returned too.

        Returns:
            Labels of the GPUs whose original limit could not be restored.
        """
        return restore_each(
            [b for b in self._backends if b.label in self.ledger.touched],
            functools.partial(self._restore_at_exit, budget=budget),
            what="power limit restore",
            still=lambda b: (
                f"it may still be capped below {self.original_w.get(b.label, math.nan):g} W"
            ),
            log=log,
            domain=self.domain,
            attempts=self.restore_attempts,
            backoff_s=self.restore_backoff_s,
            sleep=self._sleep,
            budget=budget,
        )

    def _restore_at_exit(
        self, backend: PowerLimitBackend, attempt: int, *, budget: ExitBudget | None
    ) -> Outcome:
        """One GPU's exit restore, try ``attempt`` (from 0) of :meth:`restore`'s. On a node
        it waits for each call at most ``write_deadline_s`` (or what is left of
        ``budget``), and not at all while an earlier call to the GPU still hangs; a
        restore that hangs is not retried (a retry could not start while it hangs, and
        each domain's backoff would add to the exit): the GPU may still be capped, and is
        reported so."""
        outcome = self._restore_one(backend, at_exit=True, budget=budget)
        if outcome == "retry":
            log.warning(
                "domain %s: GPU %s: power limit restore failed (attempt %d of %d)",
                self.domain,
                backend.label,
                attempt + 1,
                self.restore_attempts,
            )
            return "retry"
        return "failed" if outcome in ("failed", "hung") else "done"

    # ---------------------------------------------------------------- reconcile
    def reconcile(self, *, dry_run: bool = False, stop: threading.Event | None = None) -> list[str]:
        """At start: restore the power limit a previous run left (the state file), once.

        A GPU whose limit is back at the recorded original, or was changed by someone else
        since (neither the original nor what that run set), is left as it is. A restore
        that fails is tried again at exit (the recorded original is kept for it), and so
        is every GPU left once ``stop`` is set, not read here (a hung driver's two
        deadlines a GPU, one GPU after another, held the stop).

        Returns:
            One line per GPU the state file names (also logged).

        Raises:
            ConfigError: the run that recorded it still runs (another daemon).
        """
        lines: list[str] = []
        if self.state is None:
            return lines
        for backend in self._backends:
            line = self._reconcile_one(backend, dry_run, stopped=stop is not None and stop.is_set())
            if line is not None:
                lines.append(line)
        return lines

    def _reconcile_one(
        self, backend: PowerLimitBackend, dry_run: bool, *, stopped: bool = False
    ) -> str | None:
        assert self.state is not None
        label, key = backend.label, gpu_key(backend)
        entry = self.state.get_power_limit(key)
        if entry is None or self.state.written_here(key, power_limit=True):
            return None
        if live_writer(entry):
            if stopped:
                return None
            raise ConfigError(
                f"GPU {label}: gpugov {writer_pid_text(entry)} holds its power limit "
                f"({self.state.path}) and is still running; stop it first"
            )
        original = float(entry["original_mw"]) / 1000.0
        left_mw = finite_number(entry.get("set_mw"))  # no number (a damaged record): unknown
        left = None if left_mw is None else left_mw / 1000.0
        # The limit that run held before its last write, which the GPU keeps when that
        # write did not land (it hung, failed, or the run died first): gpugov's too.
        kept_mw = finite_number(entry.get("held_mw"))
        kept = None if kept_mw is None else kept_mw / 1000.0
        if stopped:
            found = (
                f"a previous gpugov run ({writer_pid_text(entry)}, {entry.get('time')}) set its "
                f"power limit to {'?' if left is None else f'{left:g}'} W, {original:g} W "
                "before; not reconciled (stopped during the start)"
            )
            if dry_run:
                line = f"GPU {label}: {found}; dry run: left as it is"
            else:
                self._left_to_the_exit(label, original, left)
                line = f"GPU {label}: {found}: restored at exit"
            log.warning("reconcile: %s", line)
            return line
        try:
            now: float | None = float(self._writers[label].call(backend.power_limit_w, "read"))
        except GpuError as error:
            now = None
            log.debug("GPU %s: power limit not read for reconcile: %s", label, error)
        now = self._plausible(backend, now, "reconcile")
        recorded, original = original, self._restorable(backend, original)
        found = (
            f"a previous gpugov run ({writer_pid_text(entry)}, {entry.get('time')}) set its power "
            f"limit to {'?' if left is None else f'{left:g}'} W (now "
            f"{'unknown' if now is None else f'{now:g} W'}), {recorded:g} W before"
        )
        if dry_run:
            line = f"GPU {label}: {found}; dry run: left as it is"
        elif now is not None and abs(now - original) <= SAME_LIMIT_W:
            self.state.clear_power_limit(key)
            line = f"GPU {label}: {found}; already back"
        elif (
            now is not None
            and left is not None
            and none_of(now, [v for v in (left, kept) if v is not None])
        ):
            self.state.clear_power_limit(key)
            line = f"GPU {label}: {found}; changed by someone else since: left as it is"
        else:
            try:
                self._writers[label].call(
                    functools.partial(backend.set_power_limit, original),
                    f"restore to {original:g} W",
                    write=PowerLimitWrite(original, restore=True),
                )
            except GpuError as error:  # a restore that hangs too: tried again at exit
                self._writers[label].count_failure()
                self._left_to_the_exit(label, original, left if now is None else now)
                line = f"GPU {label}: {found}; restore FAILED: {error}"
                log.error("reconcile: %s", line)
                return line
            self.writes += 1
            self.state.clear_power_limit(key)
            line = f"GPU {label}: {found}; restored"
        log.warning("reconcile: %s", line)
        return line

    def _restorable(
        self, backend: PowerLimitBackend, original: float, *, read: bool = True
    ) -> float:
        """``original`` clamped into the limits ``backend`` accepts now: a limit recorded
        before a driver or firmware change narrowed them is refused by NVML (invalid
        argument), and every restore and start's reconcile failed for good, the GPU left
        capped at gpugov's limit. Unchanged where the constraints cannot be read; without
        ``read`` (an exit's restore, within its time budget) only constraints read before
        are used."""
        try:
            bounds = self.bounds.constraints(backend) if read else self.bounds.known(backend)
        except GpuError:  # a lost GPU: the write says so
            return original
        if bounds is None:
            return original
        low, high = bounds
        kept = min(max(original, low), high)
        if abs(kept - original) > SAME_LIMIT_W and backend.label not in self._out_of_range:
            self._out_of_range.add(backend.label)
            log.warning(
                "domain %s: GPU %s: its original power limit %g W is outside the %g-%g W it "
                "accepts now; restored to %g W",
                self.domain,
                backend.label,
                original,
                low,
                high,
                kept,
            )
        return kept

    def _left_to_the_exit(self, label: str, original: float, held: float | None) -> None:
        """Leave GPU ``label``'s restore to ``original`` to the exit (:meth:`restore`), as
        a limit gpugov set; ``held``, what it holds (None: unknown), the exit judges by."""
        self.original_w[label] = original
        self.ledger.touched.add(label)
        if held is not None:
            self.ledger.asked_w[label] = held

    # ------------------------------------------------------------------- budget
    def outside_limit_w(self, samples: Sequence[GpuSample]) -> float | None:
        """The domain's enforced power limit as a budget source, without gpugov's own
        (:meth:`PowerLimitLedger.outside_limit_w`); None when a GPU's is unknown."""
        return self.ledger.outside_limit_w((b.label for b in self._backends), samples)


def _wait_s(budget: ExitBudget | None, deadline_s: float | None) -> float | None:
    """How long an exit call may be waited for (None: the writer's own deadline)."""
    return None if budget is None else budget.wait_s(deadline_s)


def power_limit_actuator(
    backends: Sequence[GpuBackend],
    *,
    domain: str,
    state: LockState | None,
    write_deadline_s: float | None = None,
) -> PowerLimitActuator | None:
    """The domain's :class:`PowerLimitActuator` when every GPU's power limit can be set
    through its backend (NVML, the simulated plant, a dry run of either), else None.
    ``write_deadline_s`` bounds each GPU's power limit call (a node; None: called on the
    loop's thread)."""
    if not backends or any(power_limit_backend(b) is None for b in backends):
        return None
    return PowerLimitActuator(
        backends, domain=domain, state=state, write_deadline_s=write_deadline_s
    )


__all__ = [
    "POWER_LIMIT_WRITE_DEADLINE_S",
    "SAME_LIMIT_W",
    "PowerLimitActuator",
    "PowerLimitCallHung",
    "power_limit_actuator",
]
