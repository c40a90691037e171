"""The exit's restores, shared by the clock and power limit actuators: the one time budget
of all of them (:class:`ExitBudget`), each actuator's restores with their lines
(:func:`restore_each`) over the retry loop (:func:`retry_each`), what one such write did
(:data:`Outcome`), the errors that are never retried (:data:`PERMANENT_RESET_ERRORS`) and
the order GPUs are named in (:func:`label_order`).

On a node each restore call (a clock reset, a power limit restore and the read before it)
is bounded by its GPU's write deadline (2 s), so a driver that wedges exactly at exit
would cost up to 4 s a GPU, and eight such GPUs more than the unit's ``TimeoutStopSec=``
(30 s): systemd would kill the daemon before it said which GPUs it left changed. The exit
therefore gives every GPU's restores of both kinds one budget,
:data:`EXIT_RESTORE_BUDGET_S`: each call is waited for at most its deadline or what is
left of the budget, whichever is less, and once the budget is spent the restores left are
not started; those GPUs are reported as possibly still locked or capped (exit 6, their
lock records kept), as a GPU whose restore hangs is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

from gpugov.daemon.errors import GpuLost, NotSupported, PermissionDenied

PERMANENT_RESET_ERRORS = (GpuLost, PermissionDenied, NotSupported)
"""A restore that raises one of these would fail the same way again: it is not retried."""

EXIT_RESTORE_BUDGET_S = 20.0
"""The longest the exit's restores (every GPU's clock reset and power limit restore
together, retries and backoff included) may take on a node. Below the units'
``TimeoutStopSec=`` (30 s, ``deploy/systemd``) with room for what follows them: the lock
record's last write (``WRITE_DEADLINE_S``, 0.5 s), ``mpc-online``'s final model saves
(``EXIT_WRITE_WAIT_S``, 5 s, every domain's together: :func:`daemon.loop.close_controllers`)
and the exit itself. Healthy restores take milliseconds a
GPU; only restores that hang reach it (five GPUs whose reset and restore both hang)."""

Item = TypeVar("Item")
GpuT = TypeVar("GpuT", bound="Labelled")
Outcome = Literal["done", "failed", "retry"]
"""What one exit write did: went through (or was not needed), failed for good, or failed
for now."""


class Labelled(Protocol):
    """A GPU, as the exit names it."""

    @property
    def label(self) -> str: ...


def label_order(label: str) -> tuple[int, str]:
    """Sort key for GPU labels: indices in numeric order, then any other label."""
    return (int(label), label) if label.isdigit() else (1 << 30, label)


class ExitBudget:
    """The time left to the exit's restores, from when it was made (the exit's start).

    Args:
        budget_s: the whole budget, seconds (:data:`EXIT_RESTORE_BUDGET_S`).
        clock: monotonic seconds (tests pass a virtual clock).
    """

    def __init__(
        self,
        budget_s: float = EXIT_RESTORE_BUDGET_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_s = float(budget_s)
        self._clock = clock
        self._ends_s = clock() + self.budget_s

    def left_s(self) -> float:
        """Seconds left (0 once spent)."""
        return max(0.0, self._ends_s - self._clock())

    @property
    def spent(self) -> bool:
        """Whether no time is left: no other restore is started."""
        return self.left_s() <= 0.0

    def wait_s(self, deadline_s: float | None) -> float | None:
        """How long the next restore call may be waited for: its ``deadline_s`` or what
        is left, whichever is less (None: a call on the caller's thread, not bounded)."""
        return None if deadline_s is None else min(deadline_s, self.left_s())

    def not_started(self) -> str:
        """Why a restore is not started, for its log line."""
        return f"the exit's {self.budget_s:g} s for restoring the GPUs is spent"


def retry_each(
    items: Sequence[Item],
    attempt_one: Callable[[Item, int], Outcome],
    *,
    attempts: int,
    backoff_s: float,
    sleep: Callable[[float], Any],
    budget: ExitBudget | None = None,
) -> tuple[list[Item], list[Item]]:
    """The exit writes' retry loop (clock resets, power limit restores): ``attempt_one(item,
    attempt)`` on every item, then again on those that failed for now, in up to
    ``attempts`` rounds, the waits between doubling from ``backoff_s`` (each at most what
    is left of ``budget``: ``attempt_one`` says "failed" once it is spent); never raises
    what ``attempt_one`` does not. Returns ``(failed for good, still failing after the
    last round)``, each in the order of ``items``."""
    pending = list(items)
    failed: list[Item] = []
    for attempt in range(attempts):
        retry: list[Item] = []
        for item in pending:
            outcome = attempt_one(item, attempt)
            if outcome == "failed":
                failed.append(item)
            elif outcome == "retry":
                retry.append(item)
        pending = retry
        if not pending:
            break
        if attempt + 1 < attempts:
            wait_s = backoff_s * 2**attempt
            sleep(wait_s if budget is None else min(wait_s, budget.left_s()))
    return failed, pending


def restore_each(
    gpus: Sequence[GpuT],
    attempt_one: Callable[[GpuT, int], Outcome],
    *,
    what: str,
    still: Callable[[GpuT], str],
    log: logging.Logger,
    domain: str,
    attempts: int,
    backoff_s: float,
    sleep: Callable[[float], Any],
    budget: ExitBudget | None = None,
) -> list[str]:
    """One actuator's exit restores (``what``: "reset", "power limit restore"):
    ``attempt_one`` on each of ``gpus``, retried as :func:`retry_each` does, none started
    once ``budget`` is spent (each such GPU one line); a GPU still failing after the last
    round is one line saying what it may still be (``still``). Never raises what
    ``attempt_one`` does not.

    Returns:
        The labels of the GPUs not restored (failed, or not started), in label order.
    """

    def attempt(gpu: GpuT, number: int) -> Outcome:
        if budget is not None and budget.spent:
            log.error(
                "domain %s: GPU %s: %s not started: %s",
                domain,
                gpu.label,
                what,
                budget.not_started(),
            )
            return "failed"
        return attempt_one(gpu, number)

    failed, pending = retry_each(
        gpus, attempt, attempts=attempts, backoff_s=backoff_s, sleep=sleep, budget=budget
    )
    for gpu in pending:
        log.error(
            "domain %s: GPU %s: %s failed %d times; %s",
            domain,
            gpu.label,
            what,
            attempts,
            still(gpu),
        )
    return sorted((gpu.label for gpu in failed + pending), key=label_order)


__all__ = [
    "EXIT_RESTORE_BUDGET_S",
    "PERMANENT_RESET_ERRORS",
    "ExitBudget",
    "Outcome",
    "label_order",
    "restore_each",
    "retry_each",
]
