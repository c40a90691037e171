"""The exit's restores, shared by the clock and power limit actuators: the retry loop of
their writes at exit (:func:`retry_each`), what one such write did (:data:`Outcome`), the
errors that are never retried (:data:`PERMANENT_RESET_ERRORS`) and the order GPUs are
named in (:func:`label_order`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from gpugov.daemon.errors import GpuLost, NotSupported, PermissionDenied

PERMANENT_RESET_ERRORS = (GpuLost, PermissionDenied, NotSupported)
"""A restore that raises one of these would fail the same way again: it is not retried."""

Item = TypeVar("Item")
Outcome = Literal["done", "failed", "retry"]
"""What one exit write did: went through (or was not needed), failed for good, or failed
for now."""


def label_order(label: str) -> tuple[int, str]:
    """Sort key for GPU labels: indices in numeric order, then any other label."""
    return (int(label), label) if label.isdigit() else (1 << 30, label)


def retry_each(
    items: Sequence[Item],
    attempt_one: Callable[[Item, int], Outcome],
    *,
    attempts: int,
    backoff_s: float,
    sleep: Callable[[float], Any],
) -> tuple[list[Item], list[Item]]:
    """The exit writes' retry loop (clock resets, power limit restores): ``attempt_one(item,
    attempt)`` on every item, then again on those that failed for now, in up to
    ``attempts`` rounds, the waits between doubling from ``backoff_s``; never raises what
    ``attempt_one`` does not. Returns ``(failed for good, still failing after the last
    round)``, each in the order of ``items``."""
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
            sleep(backoff_s * 2**attempt)
    return failed, pending


__all__ = ["PERMANENT_RESET_ERRORS", "Outcome", "label_order", "retry_each"]
