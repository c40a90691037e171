"""The start's retries of a transient GPU error (an NVML TIMEOUT while opening a GPU or
listing its clocks), shared by ``run``'s open (:mod:`daemon.gpu_open`) and ``gpugov
actuator``'s. Standard library and the error tree only: the actuator imports it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpugov.daemon.errors import TransientGpuError

log = logging.getLogger("gpugov.daemon.service")
"""The start's lines keep the logger name they were logged under (an operator's filters)."""

START_ATTEMPTS = 5
START_BACKOFF_S = 0.25


def retry_transient(
    action: Callable[[], Any],
    what: str,
    *,
    attempts: int = START_ATTEMPTS,
    backoff_s: float = START_BACKOFF_S,
    sleep: Callable[[float], Any] = time.sleep,
    stop: threading.Event | None = None,
) -> Any:
    """Run ``action``, retrying a :class:`TransientGpuError` up to ``attempts`` times.

    At start a single NVML timeout (reading supported clocks, opening a GPU) must not
    abort the daemon; the waits double from ``backoff_s`` (0.25 + 0.5 + 1 + 2 s at most).
    A ``stop`` set (a stop signal during the start) ends the retries at once: the wait
    wakes on it, and the last error is raised.

    Raises:
        TransientGpuError: still failing after the last attempt, or when ``stop`` is set.
    """
    for attempt in range(attempts):
        try:
            return action()
        except TransientGpuError as error:
            if attempt + 1 >= attempts or (stop is not None and stop.is_set()):
                raise
            log.warning(
                "%s failed (attempt %d of %d): %s; retrying", what, attempt + 1, attempts, error
            )
            if stop is None:
                sleep(backoff_s * 2**attempt)
            elif stop.wait(backoff_s * 2**attempt):
                raise
    raise AssertionError("unreachable")  # pragma: no cover
