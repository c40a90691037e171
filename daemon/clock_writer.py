"""One GPU's clock writes: a :class:`~daemon.gpu_writer.GpuWriter` of locks and resets, and
the write-session renewal of a backend that writes through another process; the mechanics a
clock actuator writes by.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.errors import TransientGpuError
from gpugov.daemon.gpu_writer import GpuWriter, WriteFailureLog

_NO_EPOCH = object()  # no write session seen yet
UNKNOWN_LOCK = -1
"""The lock an actuator remembers for a GPU whose write failed half way (or hangs): its lock
state is unknown, so the clock wanted is written again."""


class ClockWriteHung(TransientGpuError):
    """A GPU's clock write has not returned within its deadline (it goes on in the
    background), or an earlier one to that GPU is still hanging (no other is started)."""


@dataclass(frozen=True, slots=True)
class ClockWrite:
    """A clock write: the range it locks (None: a reset)."""

    clock_range: tuple[int, int] | None

    @property
    def what(self) -> str:
        """The write in words, for the log."""
        if self.clock_range is None:
            return "reset"
        low, high = self.clock_range
        return f"lock at {low}-{high} MHz"


class ClockWriter(GpuWriter[ClockWrite]):
    """Writes one GPU's clock locks and resets (:class:`~daemon.gpu_writer.GpuWriter`: in
    order, each bounded by ``deadline_s`` on a node, a hung write kept until
    :meth:`settle` gives its outcome), and counts the ones that fail
    (``gpugov_clock_write_failures_total``).

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
        super().__init__(
            backend.label,
            failure_log,
            hung_error=ClockWriteHung,
            others="write",
            thread="clocks",
            deadline_s=deadline_s,
            clock=clock,
        )
        self.backend = backend
        self._epoch: object = _NO_EPOCH

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

    def write(self, clock_range: tuple[int, int] | None, *, wait_s: float | None = None) -> None:
        """Lock the GPU's SM clock into ``clock_range`` (None: reset it): on the caller's
        thread, or, with a deadline, on the GPU's writer thread, waiting at most that long
        (or ``wait_s``).

        Raises:
            ClockWriteHung: the write has not returned in that time (it goes on in the
                background, and this GPU is written no more until it has returned), or an
                earlier write to it is still hanging (this one is not started).
            GpuError: what the write raised.
        """
        self.start_write(clock_range)
        self.finish(wait_s)

    def start_write(self, clock_range: tuple[int, int] | None) -> None:
        """Begin :meth:`write`'s write without waiting for it (:meth:`finish` takes its
        outcome): a tick's writes to a domain's GPUs start together.

        Raises:
            ClockWriteHung: an earlier write to the GPU is still hanging (this one is not
                started).
        """
        backend = self.backend
        target: Callable[[], None] = (
            backend.reset_clocks
            if clock_range is None
            else functools.partial(backend.lock_clocks, *clock_range)
        )
        write = ClockWrite(clock_range)
        self.start(target, write.what, write=write)


def start_writes(
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


__all__ = ["UNKNOWN_LOCK", "ClockWrite", "ClockWriteHung", "ClockWriter", "start_writes"]
