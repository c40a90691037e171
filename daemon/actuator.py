"""Clock actuation for one control domain, the policy of what to write: lock on change,
remember, reconcile at start, check the readback, reset on the way out.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

from gpugov.daemon.backend import DryRunBackend, GpuBackend, GpuSample
from gpugov.daemon.clock_writer import ClockWrite, ClockWriteHung, ClockWriter
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import (
    ConfigError,
    GpuError,
    GpuLost,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.exit_restore import (
    PERMANENT_RESET_ERRORS,
    ExitBudget,
    Outcome,
    restore_each,
)
from gpugov.daemon.gpu_writer import LateCall, WriteFailureLog
from gpugov.daemon.lockstate import LockState, gpu_key, left_by, live_writer, writer_pid_text
from gpugov.daemon.readback import APPLICATIONS_CLOCKS_SETTING, LockReadback

log = logging.getLogger(__name__)

LockMode = Literal["pin", "cap"]
ExternalPolicy = Literal["reassert", "yield"]
ReconcilePolicy = Literal["reset", "adopt"]
_UNKNOWN = -1  # a write failed half way: the GPU's lock state is unknown, write again

REASSERTED = (
    "{count} more outside change(s) in the {seconds:.0f} s before, each locked again, were "
    "not logged: another tool keeps setting this GPU's clock; external_clock_policy = "
    '"yield" leaves the GPU to it'
)
"""What a logged outside change says about the ones left out before it."""
CLOCK_WRITE_DEADLINE_S = 2.0
"""The longest one GPU's clock write (a lock or a reset) may hold a node's loop, or its
exit: a healthy nvmlDeviceSetGpuLockedClocks or reset takes milliseconds (a write through
the actuator or zeusd is bounded sooner, by its client's own timeout), so only a hung call
reaches it. The same bound as a GPU's read (``GPU_READ_DEADLINE_S``), paid once per hang
(no other write to that GPU starts while it hangs), far below the unit's ``WatchdogSec=``
and ``TimeoutStopSec=`` (30 s); at exit every GPU's restores of both kinds share one
budget below the latter (:data:`~daemon.exit_restore.EXIT_RESTORE_BUDGET_S`)."""
HUNG_THEN = (
    "nothing more is written to this GPU until that call returns, then the clock wanted then is"
)
"""What the first line of a hung clock write says happens next."""


def _one_clock(locks: Iterable[int | None]) -> int | None:
    """The clock all of ``locks`` hold, or None: none is locked, a lock's clock is
    unknown, or they differ."""
    values = set(locks)
    value = values.pop() if len(values) == 1 else None
    return None if value == _UNKNOWN else value


def _raise(error: Exception) -> None:
    """Raise ``error``: the outcome of a write that was not started."""
    raise error


def _start_writes(
    planned: Sequence[tuple[ClockWriter, tuple[int, int] | None]],
) -> dict[str, ClockWriteHung]:
    """Start every write of ``planned`` (a GPU's writer and the range it locks; None: a
    reset) without waiting; per GPU not started because an earlier write to it still
    hangs, the error its write raises."""
    refused: dict[str, ClockWriteHung] = {}
    for writer, clock_range in planned:
        try:
            writer.start_write(clock_range)
        except ClockWriteHung as error:
            refused[writer.label] = error
    return refused


class ClockActuator:
    """Applies one SM clock to every GPU of a domain.

    NVML cannot read a clock lock back, so the actuator remembers what it wrote (in memory
    and in the state file, :mod:`daemon.lockstate`) and "restoring" means resetting every
    GPU it ever wrote to (GEOPM does the same), retried with backoff. Use it as a context
    manager: the reset runs on a normal stop, on every terminating signal (the loop stops,
    the ``with`` block exits) and on any exception. Three more duties, each documented in
    ``docs/daemon.md``:

    * :meth:`reconcile` at start: a lock a previous run left (state file) or one the GPU
      shows (ApplicationsClocksSetting active below the top clock) is reset or adopted,
      and the log says which.
    * :meth:`check_readback` every tick: the realised SM clock is compared with the lock
      (:class:`~daemon.readback.LockReadback`); a change nobody here made (``nvidia-smi
      -lgc``/``-rgc``, a driver reset) is counted and re-asserted or yielded to, by the
      domain's ``external_clock_policy``. A GPU the driver holds near its lock (its own
      clock steps, a bin lower) or below it for a reason NVML reports (power cap, thermal,
      board or reliability limit) is not written again: the same lock written again
      changes nothing there, and each write can stall a tensor-parallel group's
      collectives.
    * :meth:`restore` at exit: every GPU ever written to is reset; failures are retried
      with exponential backoff and the GPUs still locked are returned by name.

    Each GPU is written through a :class:`~daemon.clock_writer.ClockWriter`. A lock or
    reset write that fails transiently is retried on the next tick; each failure is
    counted per GPU (``write_failures``, exported as ``gpugov_clock_write_failures_total``)
    and logged at most once a minute per GPU (:class:`~daemon.gpu_writer.WriteFailureLog`).
    A write that hangs past ``write_deadline_s`` is a failed write, and so is each tick
    that wants a write to that GPU while it hangs; meanwhile its lock is unknown (no
    readback is judged against it), the lowest lock it may hold is remembered and the lock
    record keeps an entry for it (a kill or restart has the next start's reconcile reset
    it; the exit's reset, bounded the same way, reports it as possibly still locked). Once
    it returns the next tick takes its outcome, then writes the clock wanted now, after
    it: a lowering that landed late holds for at most one period. The domain's other GPUs
    and the other domains are governed as before (``docs/daemon.md``, a hung clock write).

    Args:
        backends: the domain's GPUs.
        domain: name for logs.
        lock_mode: ``"pin"`` locks ``[f, f]``; ``"cap"`` locks ``[min supported, f]`` so
            the GPU may still idle down.
        external_policy: on a clock change made by someone else, lock again
            (``"reassert"``) or leave that GPU alone until restart (``"yield"``).
        state: where locks are persisted for the next start (None: nowhere).
        reset_attempts, reset_backoff_s: the exit reset tries a failing GPU this many
            times, sleeping ``backoff * 2**k`` between rounds.
        sleep: for the backoff (tests pass a recorder).
        clock: monotonic seconds, for the rate-limited write-failure log.
        write_deadline_s: when given (a node, on the wall clock,
            :data:`CLOCK_WRITE_DEADLINE_S`), each GPU's writes run on a worker thread of
            their own, one at a time in the order made; a call's writes to the domain's
            GPUs (:meth:`apply`, :meth:`unlock`) start together and are waited for at most
            this long together; a write past it hangs that GPU's writes (see above). None (a
            simulated run, ``gpugov reset-clocks``): written on the caller's thread,
            deterministic and never hung.
    """

    def __init__(
        self,
        backends: Sequence[GpuBackend],
        *,
        domain: str = "default",
        lock_mode: LockMode = "pin",
        external_policy: ExternalPolicy = "reassert",
        state: LockState | None = None,
        reset_attempts: int = 5,
        reset_backoff_s: float = 0.2,
        sleep: Callable[[float], Any] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        write_deadline_s: float | None = None,
    ) -> None:
        if not backends:
            raise ValueError(f"domain {domain!r}: a clock actuator needs at least one GPU")
        self._backends = list(backends)
        self.domain = domain
        self.lock_mode = lock_mode
        self.external_policy = external_policy
        self.state = state
        self.reset_attempts = max(1, int(reset_attempts))
        self.reset_backoff_s = reset_backoff_s
        self._sleep = sleep
        self.locked_mhz: dict[str, int | None] = {b.label: None for b in self._backends}
        self._touched: set[str] = set()
        self.writes = 0
        self.failure_log = WriteFailureLog(domain, clock=clock)
        self._clock = clock
        self.external_changes: dict[str, int] = {b.label: 0 for b in self._backends}
        self._reasserted: dict[str, EpisodeLog] = {}
        """Per GPU, which outside changes met by a new lock are logged: at most one a
        minute (another tool that keeps setting the clock logged a line each time)."""
        self.yielded: set[str] = set()
        self.lost: set[str] = set()
        """GPUs whose exit reset found them lost (:meth:`restore`): not locked by anyone
        any more, and no ``gpugov reset-clocks`` can reach them."""
        self._readback = LockReadback(domain, pinned=lock_mode == "pin")
        self._fallback_logged: set[str] = set()
        self._rollback_logged = False
        """Whether a lowering that split the group has been said (:meth:`apply`)."""
        self._maybe_held: dict[str, int] = {}
        """Per GPU whose lock writes failed: the lowest clock a lock may hold it at."""
        self._write_deadline_s = write_deadline_s
        self._exit_started: dict[str, tuple[float, float]] | None = None
        """The exit resets :meth:`begin_restore` started, for :meth:`restore` to take."""
        self._writers = {
            b.label: ClockWriter(b, self.failure_log, deadline_s=write_deadline_s, clock=clock)
            for b in self._backends
        }

    def __enter__(self) -> ClockActuator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        failures = self.restore()
        if failures:
            log.error("domain %s: could not reset GPU(s) %s", self.domain, ", ".join(failures))

    @property
    def applied_mhz(self) -> int | None:
        """The clock every GPU of the domain is locked to, or None (unlocked or mixed)."""
        return _one_clock(self.locked_mhz.values())

    @property
    def governed_mhz(self) -> int | None:
        """The clock every GPU gpugov still governs (the yielded ones aside) is locked to,
        or None: the clock the exporter shows as applied (none in a dry run)."""
        return _one_clock(self._held_locks())

    @property
    def holds_lock(self) -> bool:
        """Whether a GPU holds a lock of gpugov's, or may hold one (a write failed half
        way): the exporter's ``gpugov_clock_locked``, whatever clocks the GPUs hold."""
        return any(mhz is not None for mhz in self._held_locks())

    def _held_locks(self) -> list[int | None]:
        """The remembered lock of each GPU gpugov governs and really writes to: not one
        yielded, nor one of a dry run (whose locks were only logged)."""
        return [
            self.locked_mhz[b.label]
            for b in self._backends
            if b.label not in self.yielded and not isinstance(b, DryRunBackend)
        ]

    @property
    def hanging_writes(self) -> tuple[str, ...]:
        """The GPUs whose clock write is still running past its deadline (on a node):
        nothing more is written to them until it returns."""
        return tuple(label for label, writer in self._writers.items() if writer.hanging)

    @property
    def write_failures(self) -> dict[str, int]:
        """Failed lock and reset writes per GPU (``gpugov_clock_write_failures_total``)."""
        return {label: writer.failures for label, writer in self._writers.items()}

    @property
    def write_errors(self) -> int:
        """Failed lock and reset writes, every GPU's together."""
        return sum(writer.failures for writer in self._writers.values())

    def _range(self, backend: GpuBackend, clock_mhz: int) -> tuple[int, int]:
        if self.lock_mode == "cap":
            return min(backend.supported_clocks_mhz()), clock_mhz
        return clock_mhz, clock_mhz

    def apply(self, clock_mhz: int) -> int:
        """Lock every GPU whose remembered lock differs from ``clock_mhz``.

        The domain's GPUs (a tensor-parallel group) are never left split by a lowering
        that fails on some of them: the GPUs it went through on are locked back at the
        clock the failing ones kept (once, one warning line), and while a GPU's writes keep
        failing a lowering is written to it first, the others only once it went through.

        Returns:
            The number of lock writes made (0 when nothing changed), a rollback's included.

        Raises:
            PermissionDenied, NotSupported, GpuLost: not survivable; the caller's ``with``
                block resets what it can (also when a hung write returns with one).
        A transient failure is counted and retried on the next call; a write past its
        deadline is counted, and so is each call while it hangs, and no other write to
        that GPU is started until it has returned. On a node the GPUs' writes start
        together under one deadline; a fatal error is raised once each has its outcome.
        """
        clock_mhz = int(clock_mhz)
        planned: list[tuple[ClockWriter, tuple[int, int] | None]] = []
        before: dict[str, int | None] = {}
        for backend in self._backends:
            if self.locked_mhz[backend.label] == clock_mhz or backend.label in self.yielded:
                continue
            writer = self._writers[backend.label]
            if not self._settled(writer, "lock") or self.locked_mhz[backend.label] == clock_mhz:
                continue  # still hanging; or the hung write, returned, locked this clock
            planned.append((writer, self._range(backend, clock_mhz)))
            before[backend.label] = self.locked_mhz[backend.label]
        # A lowering goes first to the GPUs whose writes are failing: a GPU that keeps
        # failing then holds the others at its clock, not split from them every tick.
        failing = [item for item in planned if self.failure_log.failing(item[0].label)]
        lowering = bool(failing) and any(
            self._lowers(writer.backend, before[writer.label], clock_mhz) for writer, _ in planned
        )
        first = failing if lowering else []
        rest = planned
        written = 0
        if first and len(first) < len(planned):
            written, _ = self._lock_planned(first, clock_mhz, before)
            through = all(self.locked_mhz[writer.label] == clock_mhz for writer, _ in first)
            rest = [item for item in planned if item not in first] if through else []
            if not through:
                # Of several failing GPUs some went through: back at the clock the others
                # hold (they were left where they are), the group not split.
                others = {self.locked_mhz[item[0].label] for item in planned if item not in first}
                if len(others) == 1 and _UNKNOWN not in others:
                    (held,) = others
                    stuck = {
                        w.label: held for w, _ in first if self.locked_mhz[w.label] != clock_mhz
                    }
                    written += self._not_split(first, stuck, clock_mhz)
        if rest:
            more, kept = self._lock_planned(rest, clock_mhz, before)
            written += more + self._not_split(planned, kept, clock_mhz)
        if written:
            self.writes += written
            log.debug("domain %s: locked SM clock at %d MHz", self.domain, clock_mhz)
        return written

    def _back_range(self, backend: GpuBackend, back: int | None) -> tuple[int, int] | None:
        """What :meth:`_not_split` writes to ``backend`` to hold it at ``back`` (None: no
        lock): the lock's range, or None (a reset) at or above its top clock."""
        if back is None:
            return None
        try:
            top = max(backend.supported_clocks_mhz())
        except GpuError:  # a GPU lost meanwhile is said by its write
            return None
        return None if back >= top else self._range(backend, back)

    @staticmethod
    def _lowers(backend: GpuBackend, before: int | None, clock_mhz: int) -> bool:
        """Whether locking ``clock_mhz`` lowers ``backend``, which held ``before`` (None: no
        lock, so up to its top clock; unknown: not known to)."""
        if before is None:
            try:
                return clock_mhz < max(backend.supported_clocks_mhz())
            except GpuError:  # a GPU lost meanwhile is said by its write
                return True
        return before != _UNKNOWN and clock_mhz < before

    def _lock_planned(
        self,
        planned: Sequence[tuple[ClockWriter, tuple[int, int] | None]],
        clock_mhz: int,
        before: dict[str, int | None],
    ) -> tuple[int, dict[str, int | None]]:
        """Make :meth:`apply`'s lock writes ``planned`` (together, on a node) and take
        their outcomes.

        Returns:
            The writes that went through, and per GPU whose lowering failed for now (not
            one that hangs) the lock it kept (None: none).

        Raises:
            PermissionDenied, NotSupported, GpuLost: as :meth:`apply`.
        """
        kept: dict[str, int | None] = {}

        def transient(writer: ClockWriter, _: object, error: TransientGpuError) -> int:
            """The lock failed for now: its clock unknown; held low, reset (or kept)."""
            backend, label = writer.backend, writer.label
            self.locked_mhz[label] = _UNKNOWN
            writer.failed("lock", error)
            lowest = self._lowest_held(label, before[label], clock_mhz)
            assert lowest is not None  # this lock's clock at least
            self._maybe_held[label] = lowest
            if lowest < clock_mhz:
                return self._not_held_low(backend, lowest, clock_mhz)
            if self._lowers(backend, before[label], clock_mhz):
                kept[label] = before[label]
            return 0

        def refused(writer: ClockWriter, error: GpuError) -> None:
            """The lock failed for good: counted; its clock unknown, or none was held."""
            label = writer.label
            writer.count_failure()
            if before[label] is None and isinstance(error, PermissionDenied | NotSupported):
                # Refused, so nothing was written, on a GPU that held no lock of
                # ours: nothing for the exit to reset (nor to report as still locked).
                self._touched.discard(label)
            else:
                self.locked_mhz[label] = _UNKNOWN

        written, fatal = self._take_outcomes(planned, before, transient, on_fatal=refused)
        if fatal is not None:
            if written:
                self.writes += written
            raise fatal
        return written, kept

    def _not_split(
        self,
        planned: Sequence[tuple[ClockWriter, tuple[int, int] | None]],
        kept: dict[str, int | None],
        clock_mhz: int,
    ) -> int:
        """After a lowering to ``clock_mhz`` that failed on the GPUs of ``kept`` (each with
        the lock it kept), lock the GPUs of ``planned`` it went through on back at the
        highest clock those kept, so the group runs at one clock; the first time one
        warning line. Where that is no lock, or a GPU's top clock, the GPU is reset
        instead, which no rate limit holds back (the actuator's limits only locks).
        Returns the writes that went through."""
        lowered = [writer for writer, _ in planned if self.locked_mhz[writer.label] == clock_mhz]
        if not kept or not lowered:
            return 0
        values = list(kept.values())
        back = None if None in values else max(v for v in values if v is not None)
        back_planned = [(writer, self._back_range(writer.backend, back)) for writer in lowered]

        def transient(
            writer: ClockWriter, wanted: tuple[int, int] | None, error: TransientGpuError
        ) -> int:
            """The write back failed for now: written again at the next apply."""
            self.locked_mhz[writer.label] = _UNKNOWN
            writer.failed("reset" if wanted is None else "lock", error)
            return 0

        written, _ = self._take_outcomes(
            back_planned,
            dict.fromkeys((writer.label for writer in lowered), clock_mhz),
            transient,
            fatal_at_once=True,
        )
        if not self._rollback_logged:
            self._rollback_logged = True
            log.warning(
                "domain %s: the lock at %d MHz failed on GPU(s) %s; GPU(s) %s %s so the "
                "group is not split, and the lowering is written to the failing GPU(s) "
                "first until it goes through (logged once)",
                self.domain,
                clock_mhz,
                ", ".join(sorted(kept)),
                ", ".join(writer.label for writer in lowered),
                "reset as well" if back is None else f"back at {back} MHz",
            )
        return written

    def _take_outcomes(
        self,
        planned: Sequence[tuple[ClockWriter, tuple[int, int] | None]],
        before: Mapping[str, int | None],
        transient: Callable[[ClockWriter, tuple[int, int] | None, TransientGpuError], int],
        *,
        on_fatal: Callable[[ClockWriter, GpuError], None] | None = None,
        fatal_at_once: bool = False,
    ) -> tuple[int, GpuError | None]:
        """Make the writes ``planned`` (:meth:`_write_together`) and take each outcome, the
        one way :meth:`apply`'s locks, their rollback and :meth:`unlock`'s resets do.

        A write that went through is remembered (:meth:`_holds`); one past its deadline
        hangs that GPU (:meth:`_write_hung`, from the lock ``before`` it); one that failed
        for now is handed to ``transient`` (the GPU's writer, the range written, the
        error), which returns the writes its fallback made. A fatal error is handed to
        ``on_fatal``, then raised at once without a deadline (or with ``fatal_at_once``),
        else kept until every write started has its outcome.

        Returns:
            The writes that went through (the fallbacks' included), and the first fatal
            error kept, for the caller to raise.
        """
        written = 0
        fatal: GpuError | None = None
        for (writer, finish), (_, wanted) in zip(
            self._write_together(planned), planned, strict=True
        ):
            try:
                finish()
            except ClockWriteHung as error:
                what, held = ("reset", None) if wanted is None else ("lock", wanted[1])
                self._write_hung(writer, what, error, before[writer.label], held)
                continue
            except TransientGpuError as error:
                written += transient(writer, wanted, error)
                continue
            except GpuError as error:
                if fatal_at_once:
                    raise
                if on_fatal is not None:
                    on_fatal(writer, error)
                if writer.deadline_s is None:
                    raise
                fatal = fatal or error  # raised once every write started has its outcome
                continue
            writer.succeeded()
            self._holds(writer.backend, wanted)
            written += 1
        return written, fatal

    def _write_together(
        self, planned: Sequence[tuple[ClockWriter, tuple[int, int] | None]]
    ) -> Iterator[tuple[ClockWriter, Callable[[], None]]]:
        """The writes ``planned`` (a GPU's writer and the range it locks; None: a reset),
        each given as its writer and a ``finish()`` that takes its outcome, raising as
        :meth:`ClockWriter.write` does. On a node they all start first and are waited for
        under one ``write_deadline_s``, as a tick's GPU reads are: N GPUs whose writes
        hang cost the tick one deadline, not N. Without one (a simulated run) each is
        written on the caller's thread when its turn comes, so a caller that stops at a
        fatal error writes no further GPU."""
        deadline_s = self._write_deadline_s
        if deadline_s is None:
            for writer, clock_range in planned:
                if clock_range is not None:
                    self._touched.add(writer.label)
                yield writer, functools.partial(writer.write, clock_range)
            return
        for writer, clock_range in planned:
            if clock_range is not None:
                self._touched.add(writer.label)  # a lock that hangs may hold: reset at exit
        refused = _start_writes(planned)
        ends_s = time.monotonic() + deadline_s  # the threads' waits are in real seconds
        for writer, _ in planned:
            if writer.label in refused:
                yield writer, functools.partial(_raise, refused[writer.label])
            else:
                wait_s = max(0.0, ends_s - time.monotonic())
                yield writer, functools.partial(writer.finish, wait_s, deadline_s=deadline_s)

    def write_path_problem(self) -> str | None:
        """Once per tick, for backends that write through another process (the actuator,
        zeusd): renew their lease and say why writes cannot go through now (None: they
        can). A backend whose session is new (``write_epoch`` changed: the old lease
        ended and its locks were reset) has its locks marked unknown, so the next
        :meth:`apply` or :meth:`unlock` writes them again."""
        problem: str | None = None
        for label, writer in self._writers.items():
            found, renewed = writer.path_problem()
            if found is not None and problem is None:
                problem = found
            if renewed and self.locked_mhz[label] is not None:
                self.locked_mhz[label] = _UNKNOWN
        return problem

    def _holds(self, backend: GpuBackend, clock_range: tuple[int, int] | None) -> None:
        """A write to ``backend`` went through: it holds the lock at ``clock_range`` (None:
        none, it was reset), remembered here and in the lock record for the next start."""
        label = backend.label
        self.locked_mhz[label] = None if clock_range is None else clock_range[1]
        self._maybe_held.pop(label, None)
        self._readback.written(label)
        if self.state is not None:
            if clock_range is None:
                self.state.clear(gpu_key(backend))
            else:
                self.state.record(gpu_key(backend), label, *clock_range)

    def _lowest_held(self, label: str, before: int | None, clock_mhz: int | None) -> int | None:
        """After a lock (``clock_mhz``; None: a reset) that failed or hangs on a GPU that
        held ``before``: the lowest lock it may hold now, the one before, one a write that
        failed before may still have made, or this one (None: none)."""
        earlier = self._maybe_held.get(label) if before == _UNKNOWN else before
        held = [v for v in (earlier, clock_mhz) if v is not None and v != _UNKNOWN]
        return min(held) if held else None

    # ------------------------------------------------------- the hung writes
    def _write_hung(
        self,
        writer: ClockWriter,
        what: str,
        error: ClockWriteHung,
        before: int | None,
        clock_mhz: int | None,
    ) -> None:
        """A ``what`` write through ``writer`` (a lock at ``clock_mhz``, or a reset: None)
        to a GPU which held ``before`` ran past its deadline: counted and logged as a
        failed write; its lock unknown until the write's outcome is taken. It may hold
        either lock, so the lowest of them is remembered and the lock record keeps an
        entry for it (a hung lock's range, or, for a hung reset, the entry of the lock
        before): a kill or restart meanwhile has the next start's reconcile reset it."""
        label = writer.label
        self.locked_mhz[label] = _UNKNOWN
        writer.failed(what, error, then=HUNG_THEN)
        lowest = self._lowest_held(label, before, clock_mhz)
        if lowest is not None:
            self._maybe_held[label] = lowest
        hung = writer.hung
        if self.state is not None and hung is not None and hung.write.clock_range is not None:
            self.state.record(gpu_key(writer.backend), label, *hung.write.clock_range)

    def _settled(self, writer: ClockWriter, what: str) -> bool:
        """Whether ``writer``'s GPU may be written now: no write to it hangs (once a hung
        write has returned, its outcome is taken first, :meth:`_take_late`). While one
        hangs, this call's ``what`` ("lock", "reset") is one more failed write (counted,
        and logged at the failure log's pace) and none is started.

        Raises:
            GpuLost, PermissionDenied, NotSupported, Exception: what the hung write
                raised, once it returned, when that is not transient.
        """
        try:
            late = writer.settle()
        except ClockWriteHung as error:
            writer.failed(what, error, then=HUNG_THEN)
            return False
        if late is not None:
            self._take_late(writer, late)
        return True

    def _take_late(self, writer: ClockWriter, late: LateCall[ClockWrite]) -> None:
        """A hung write through ``writer`` has returned: what the GPU holds now is what
        that write did (it went through: its lock, or none after a reset), else unknown
        (the next write goes through whatever was remembered).

        Raises:
            GpuLost, PermissionDenied, NotSupported, Exception: what it raised, when that
                is not transient (as the same write's error would have been).
        """
        label, hung, error = writer.label, late, late.error
        if error is None:
            self._holds(writer.backend, hung.write.clock_range)
            writer.succeeded()
            log.debug(
                "domain %s: GPU %s: the clock %s that hung went through after %.1f s",
                self.domain,
                label,
                hung.what,
                self._clock() - hung.started_s,
            )
            return
        self.locked_mhz[label] = _UNKNOWN
        log.warning(
            "domain %s: GPU %s: the clock %s that hung returned after %.1f s, failing: %s; "
            "the clock wanted now is written",
            self.domain,
            label,
            hung.what,
            self._clock() - hung.started_s,
            error,
        )
        if not isinstance(error, TransientGpuError):
            raise error

    def unlock(self) -> int:
        """Reset every GPU this actuator locked (the fail-safe's "unlock" mode). A reset
        past its deadline (on a node) is counted as :meth:`apply`'s lock is, and nothing
        more is written to that GPU until it has returned.

        Returns:
            The number of reset writes made.

        Raises:
            GpuLost, PermissionDenied, NotSupported: as :meth:`apply`.
        """
        planned: list[tuple[ClockWriter, tuple[int, int] | None]] = []
        before: dict[str, int | None] = {}
        for backend in self._backends:
            if self.locked_mhz[backend.label] is None or backend.label in self.yielded:
                continue
            writer = self._writers[backend.label]
            if not self._settled(writer, "reset") or self.locked_mhz[backend.label] is None:
                continue  # still hanging; or the hung write, returned, was a reset
            planned.append((writer, None))
            before[backend.label] = self.locked_mhz[backend.label]

        def transient(writer: ClockWriter, _: object, error: TransientGpuError) -> int:
            """The reset failed for now: the top clock locked instead where held low."""
            writer.failed("reset", error)
            return self._top_instead(writer.backend)

        written, fatal = self._take_outcomes(planned, before, transient)
        self.writes += written
        if fatal is not None:
            raise fatal
        return written

    def _log_fallback(self, label: str, line: str) -> None:
        """A write that failed was met another way: the first time for a GPU one WARNING,
        then DEBUG (the failures themselves are counted and logged by ``failure_log``)."""
        first = label not in self._fallback_logged
        self._fallback_logged.add(label)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "domain %s: GPU %s: %s%s",
            self.domain,
            label,
            line,
            " (logged once per GPU)" if first else "",
        )

    def _not_held_low(self, backend: GpuBackend, held_mhz: int, clock_mhz: int) -> int:
        """A lock that raised the clock from ``held_mhz`` (or from what an earlier failed
        write may have locked) failed for now: reset the lock, so the GPU is not held at
        the lower clock until a lock goes through (a reset runs it at its default, top,
        clock). ``locked_mhz`` then says unlocked, and the next :meth:`apply` locks
        again. Returns the writes that went through (0 or 1), counted as the lock's."""
        label = backend.label
        writer = self._writers[label]
        try:
            writer.write(None)
        except ClockWriteHung as error:
            self._write_hung(writer, "reset", error, _UNKNOWN, None)
            return 0
        except GpuLost:
            raise
        except GpuError as error:  # still unknown: the next apply writes again
            log.debug(
                "domain %s: GPU %s: reset after a failed lock failed: %s", self.domain, label, error
            )
            return 0
        self._holds(backend, None)
        self._log_fallback(
            label,
            f"the lock could not be raised from {held_mhz} MHz to {clock_mhz} MHz; the lock was "
            "reset instead, so the GPU runs at its default clocks until a lock goes through",
        )
        return 1

    def _top_instead(self, backend: GpuBackend) -> int:
        """A reset (the fail-safe's ``unlock``) failed for now on a GPU held below its top
        clock (or at unknown clocks): lock the top clock instead, so the GPU is not held
        low until a reset goes through (the next :meth:`unlock` tries again). Returns the
        writes that went through (0 or 1), counted as the reset's."""
        label = backend.label
        top = max(backend.supported_clocks_mhz())
        held = self.locked_mhz[label]
        if not self._held_low(label, top):
            return 0
        low, high = self._range(backend, top)
        writer = self._writers[label]
        try:
            writer.write((low, high))
        except ClockWriteHung as error:
            self._write_hung(writer, "lock", error, held, top)
            return 0
        except GpuLost:
            raise
        except GpuError as error:
            log.debug(
                "domain %s: GPU %s: top clock after a failed reset failed: %s",
                self.domain,
                label,
                error,
            )
            self.locked_mhz[label] = _UNKNOWN
            return 0
        self._holds(backend, (low, high))
        self._log_fallback(
            label,
            f"the lock could not be reset; locked at the top clock ({top} MHz) instead "
            "until a reset goes through",
        )
        return 1

    def _held_low(self, label: str, top: int) -> bool:
        """Whether GPU ``label`` may be held below its ``top`` clock by a lock of gpugov's:
        a lock below it, or one at unknown clocks; not a GPU gpugov unlocked (its last
        write a reset that went through), which a failed reset must not lock anew."""
        held = self.locked_mhz[label]
        return held == _UNKNOWN or (held is not None and held < top)

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
        refused = _start_writes([(self._writers[backend.label], None) for backend in gpus])
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

    # --------------------------------------------------------------- reconcile
    def reconcile(
        self,
        policy: ReconcilePolicy = "reset",
        *,
        dry_run: bool = False,
        read: Callable[[GpuBackend], GpuSample] | None = None,
        stop: threading.Event | None = None,
    ) -> list[str]:
        """At start: find locks a previous run (or someone else) left, reset or adopt them.

        A GPU counts as locked when the state file holds an entry for it written by
        another process, or when NVML shows ApplicationsClocksSetting among its clock
        event reasons while its SM clock is below the top supported clock (a lock below
        the top; a lock at the top is harmless and cannot be told from no lock).

        ``read`` reads a GPU (default: its sample on this thread; a node: its domain's
        read under its deadline, so a hung read leaves the clock unknown). Once ``stop`` is
        set the GPUs left are not read (:meth:`_left_to_the_exit`).

        Returns:
            One line per GPU saying what was found and done (also logged).
        """
        lines = []
        for backend in self._backends:
            if stop is not None and stop.is_set():
                lines.append(self._left_to_the_exit(backend, dry_run))
            else:
                lines.append(self._reconcile_one(backend, policy, dry_run, read))
        return lines

    def _left_to_the_exit(self, backend: GpuBackend, dry_run: bool) -> str:
        """A GPU the reconcile did not reach before a stop: not read, and reset by the exit
        (every GPU's at once, within the exit's budget), as the reconcile would have reset
        or adopted a lock it found (a reset where none is held changes nothing). Read and
        reset here one GPU after another, a hung driver cost the stop two deadlines a GPU,
        past a unit's stop timeout on eight GPUs. A GPU whose record names a gpugov that
        still runs is left to it."""
        label, key = backend.label, gpu_key(backend)
        entry = self.state.get(key) if self.state is not None else None
        found = "" if entry is None else f"{left_by(entry)}; "
        if entry is not None and live_writer(entry):
            line = (
                f"GPU {label}: not reconciled (stopped during the start): gpugov "
                f"{writer_pid_text(entry)} holds its lock and still runs"
            )
        elif dry_run:
            line = f"GPU {label}: {found}not reconciled (stopped during the start); dry run"
        else:
            self._touched.add(label)
            self.locked_mhz[label] = _UNKNOWN
            line = f"GPU {label}: {found}not reconciled (stopped during the start): reset at exit"
        log.warning("reconcile: %s", line)
        return line

    def _reconcile_one(
        self,
        backend: GpuBackend,
        policy: ReconcilePolicy,
        dry_run: bool,
        read: Callable[[GpuBackend], GpuSample] | None,
    ) -> str:
        label, key = backend.label, gpu_key(backend)
        entry = self.state.get(key) if self.state is not None else None
        if entry is not None and self.state is not None and self.state.written_here(key):
            entry = None  # our own (cannot happen at start; be safe)
        if entry is not None and live_writer(entry):
            # Its writer still runs: another daemon governs this GPU (its state directory's
            # hold was lost, say, the directory deleted under it). Resetting its live lock
            # would start a fight for the clock.
            state_file = getattr(self.state, "path", "locks.json")
            raise ConfigError(
                f"GPU {label}: gpugov {writer_pid_text(entry)} holds its clock lock "
                f"({state_file}) and is still running; stop it first"
            )
        try:
            sample: GpuSample | None = backend.sample() if read is None else read(backend)
        except GpuError as error:
            sample = None
            log.debug("GPU %s: reading clocks for reconcile failed: %s", label, error)
        top = max(backend.supported_clocks_mhz())
        clock = sample.sm_clock_mhz if sample is not None else None
        reasons = sample.clock_event_reasons if sample is not None else None
        seems_locked = (
            reasons is not None
            and bool(reasons & APPLICATIONS_CLOCKS_SETTING)
            and clock is not None
            and clock < top - self._readback.tolerance(backend)
        )
        now = f"{clock:.0f} MHz" if clock is not None else "unknown"
        low = entry.get("min_mhz") if entry is not None else None
        held = entry.get("max_mhz") if entry is not None else None
        if entry is not None:
            found = f"{left_by(entry)} (now {now} of {top} MHz)"
        elif seems_locked:
            found = f"it runs at {now} of {top} MHz with ApplicationsClocksSetting active: " + (
                # A dry run reads no lock record: a running gpugov's lock looks alike.
                "locked by someone else or a running gpugov (a dry run reads no record)"
                if dry_run
                else "locked by someone else or by a run that left no record"
            )
        else:
            line = f"GPU {label}: no lock found (SM clock {now} of {top} MHz)"
            log.info("reconcile: %s", line)
            return line
        if dry_run:
            line = f"GPU {label}: {found}; dry run: left as it is"
        elif policy == "adopt":
            self._touched.add(label)
            pin = held is not None and low == held and self.lock_mode == "pin"
            # The GPU above the recorded lock with no lock shown: it was reset since the
            # record (nvidia-smi -rgc, a driver reload). Taken as held, the readback read
            # the GPU's default clock as someone else's change (with "yield": the GPU
            # left ungoverned for the run); as unknown, the first decision is written.
            gone = (
                isinstance(held, int | float)
                and reasons is not None
                and not reasons & APPLICATIONS_CLOCKS_SETTING
                and clock is not None
                and clock > held + self._readback.tolerance(backend)
            )
            self.locked_mhz[label] = (
                int(held) if held is not None and pin and not gone else _UNKNOWN
            )
            if self.state is not None and low is not None and held is not None:
                self.state.record(key, label, int(low), int(held))
            line = f"GPU {label}: {found}; adopted: governed from here, reset on exit"
            if gone:
                line += (
                    " (no lock shown now, above the recorded one: taken as unknown, the "
                    "first decision written)"
                )
        else:
            writer = self._writers[label]
            try:
                writer.write(None)
            except GpuError as error:  # a reset that hangs too: tried again at exit
                writer.count_failure()
                self._touched.add(label)  # try again at exit
                self.locked_mhz[label] = _UNKNOWN
                line = f"GPU {label}: {found}; reset FAILED: {error}"
                log.error("reconcile: %s", line)
                return line
            if self.state is not None:
                self.state.clear(key)
            line = f"GPU {label}: {found}; reset"
        log.warning("reconcile: %s", line)
        return line

    # ---------------------------------------------------------------- readback
    def check_readback(self, samples: Sequence[GpuSample]) -> list[str]:
        """Compare each GPU's realised SM clock with the lock held; act on outside changes.

        A reading near the lock, or off it for a reason the driver or NVML gives, leaves
        the lock as it is: writing it again would change nothing. A change by someone else,
        confirmed over a few reads (:class:`~daemon.readback.LockReadback` says which is
        which), is counted in ``external_changes`` and, by ``external_policy``, the lock
        is written again on the next apply or the GPU is left alone (``yielded``).

        Returns:
            Labels of the GPUs whose change was confirmed at this call.
        """
        by_label = {b.label: b for b in self._backends}
        changed = []
        for sample in samples:
            label = sample.gpu
            backend = by_label.get(label)
            held = self.locked_mhz.get(label)
            if backend is None or held is None or held == _UNKNOWN or label in self.yielded:
                continue
            if isinstance(backend, DryRunBackend):
                continue  # a dry run never wrote the lock it remembers
            clock = sample.sm_clock_mhz
            if clock is None:
                continue
            if not self._readback.changed(backend, clock, sample.clock_event_reasons, held):
                continue
            self.external_changes[label] += 1
            changed.append(label)
            what = (
                f"domain {self.domain}: GPU {label} runs at {clock:.0f} MHz but gpugov locked "
                f"it at {held} MHz: changed by someone else (nvidia-smi -lgc/-rgc, another "
                "tool, the driver)"
            )
            if self.external_policy == "yield":
                self.yielded.add(label)
                self.locked_mhz[label] = None
                self._touched.discard(label)
                if self.state is not None:
                    self.state.clear(gpu_key(backend))
                log.warning("%s; yielding: gpugov leaves this GPU alone until restarted", what)
            else:
                self.locked_mhz[label] = _UNKNOWN
                if self.state is not None:
                    # The lock written again is recorded again, whatever the file holds now.
                    self.state.invalidate(gpu_key(backend))
                episodes = self._reasserted.setdefault(label, EpisodeLog(left_out=REASSERTED))
                note = episodes.start(self._clock())
                log.log(
                    logging.DEBUG if note is None else logging.WARNING,
                    "%s; locking it again%s",
                    what,
                    note or "",
                )
        return changed
