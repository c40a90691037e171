"""Clock actuation for one control domain, the policy of what to write: lock on change,
remember, check the readback; with the reconcile at start (:mod:`daemon.clock_reconcile`)
and the reset on the way out (:mod:`daemon.clock_exit`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

from gpugov.daemon.backend import DryRunBackend, GpuBackend, GpuSample
from gpugov.daemon.clock_exit import ExitResets
from gpugov.daemon.clock_reconcile import LockReconcile
from gpugov.daemon.clock_writer import (
    UNKNOWN_LOCK,
    ClockWrite,
    ClockWriteHung,
    ClockWriter,
    start_writes,
)
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import (
    GpuError,
    GpuLost,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.gpu_writer import LateCall, WriteFailureLog
from gpugov.daemon.lockstate import LockState, gpu_key
from gpugov.daemon.readback import LockReadback

log = logging.getLogger(__name__)

LockMode = Literal["pin", "cap"]
ExternalPolicy = Literal["reassert", "yield"]

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
    return None if value == UNKNOWN_LOCK else value


def _raise(error: Exception) -> None:
    """Raise ``error``: the outcome of a write that was not started."""
    raise error


class ClockActuator(LockReconcile, ExitResets):
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
                if len(others) == 1 and UNKNOWN_LOCK not in others:
                    (held,) = others
                    stuck = {
                        w.label: held for w, _ in first if self.locked_mhz[w.label] != clock_mhz
                    }
                    written += self._not_split(first, stuck, clock_mhz)
        if rest:
            more, kept = self._lock_planned(rest, clock_mhz, before)
            written += more + self._not_split(planned, kept, clock_mhz)
        if written:
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
        return before != UNKNOWN_LOCK and clock_mhz < before

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
            self.locked_mhz[label] = UNKNOWN_LOCK
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
            """The lock failed for good: its clock unknown, or none was held."""
            label = writer.label
            if before[label] is None and isinstance(error, PermissionDenied | NotSupported):
                # Refused, so nothing was written, on a GPU that held no lock of
                # ours: nothing for the exit to reset (nor to report as still locked).
                self._touched.discard(label)
            else:
                self.locked_mhz[label] = UNKNOWN_LOCK

        written, fatal = self._take_outcomes(planned, before, transient, on_fatal=refused)
        if fatal is not None:
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
            self.locked_mhz[writer.label] = UNKNOWN_LOCK
            writer.failed("reset" if wanted is None else "lock", error)
            return 0

        written, fatal = self._take_outcomes(
            back_planned, dict.fromkeys((writer.label for writer in lowered), clock_mhz), transient
        )
        if fatal is not None:
            raise fatal
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
    ) -> tuple[int, GpuError | None]:
        """Make the writes ``planned`` (:meth:`_write_together`) and take each outcome, the
        one way :meth:`apply`'s locks, their rollback and :meth:`unlock`'s resets do.

        A write that went through is remembered (:meth:`_holds`); one past its deadline
        hangs that GPU (:meth:`_write_hung`, from the lock ``before`` it); one that failed
        for now is handed to ``transient`` (the GPU's writer, the range written, the
        error), which returns the writes its fallback made. A fatal error (the write's, or
        its fallback's: a GPU lost meanwhile) is counted and
        handed to ``on_fatal``, then raised at once without a deadline (the writes are
        made one after another, so none other has started), else kept until every write
        started has its outcome. The writes that went through are added to ``writes``
        here, also when a fatal error is raised.

        Returns:
            The writes that went through (the fallbacks' included), and the first fatal
            error kept, for the caller to raise.
        """
        written = 0
        fatal: GpuError | None = None
        for (writer, finish), (_, wanted) in zip(
            self._write_together(planned), planned, strict=True
        ):
            failure: GpuError | None = None
            try:
                finish()
            except ClockWriteHung as hung:
                what, held = ("reset", None) if wanted is None else ("lock", wanted[1])
                self._write_hung(writer, what, hung, before[writer.label], held)
                continue
            except TransientGpuError as error:
                try:
                    written += transient(writer, wanted, error)
                    continue
                except GpuError as lost:  # its fallback's write found the GPU lost
                    failure = lost
            except GpuError as refused:
                failure = refused
            if failure is None:
                writer.succeeded()
                self._holds(writer.backend, wanted)
                written += 1
                continue
            writer.count_failure()
            if on_fatal is not None:
                on_fatal(writer, failure)
            if writer.deadline_s is None:
                self.writes += written
                raise failure
            fatal = fatal or failure  # raised once every write started has its outcome
        self.writes += written
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
        refused = start_writes(planned)
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
                self.locked_mhz[label] = UNKNOWN_LOCK
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
        earlier = self._maybe_held.get(label) if before == UNKNOWN_LOCK else before
        held = [v for v in (earlier, clock_mhz) if v is not None and v != UNKNOWN_LOCK]
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
        self.locked_mhz[label] = UNKNOWN_LOCK
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
        self.locked_mhz[label] = UNKNOWN_LOCK
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
            self._write_hung(writer, "reset", error, UNKNOWN_LOCK, None)
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
            self.locked_mhz[label] = UNKNOWN_LOCK
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
        return held == UNKNOWN_LOCK or (held is not None and held < top)

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
            if backend is None or held is None or held == UNKNOWN_LOCK or label in self.yielded:
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
                self.locked_mhz[label] = UNKNOWN_LOCK
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
