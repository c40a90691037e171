"""Worker processes that stop promptly: Ctrl-C ends a pooled benchmark in about a second.

``concurrent.futures.ProcessPoolExecutor`` waits for running tasks on shutdown, and every
forked worker also receives the terminal's SIGINT and prints its own traceback. Here the
workers ignore SIGINT, the parent waits in short slices (calling ``tick`` for a live
progress line), and on any exit other than success it terminates the workers itself.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any


def _ignore_sigint() -> None:
    """Worker initialiser: the parent alone handles Ctrl-C (and ends the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_in_pool(
    function: Callable[[Any], Any],
    items: Iterable[tuple[Any, Any]],
    jobs: int,
    tick: Callable[[], None] | None = None,
    *,
    tick_s: float = 1.0,
) -> Iterator[tuple[Any, Any]]:
    """Yield ``(key, function(argument))`` for each ``(key, argument)`` as each finishes.

    Runs in ``jobs`` forked processes. An exception in the parent (KeyboardInterrupt
    included) or in a task cancels what is queued and terminates the running workers
    before it propagates, so the command exits at once instead of after the longest task.
    """
    pool = ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_ignore_sigint,
    )
    finished = False
    try:
        pending: dict[Future[Any], Any] = {
            pool.submit(function, argument): key for key, argument in items
        }
        while pending:
            done, _ = wait(pending, timeout=tick_s, return_when=FIRST_COMPLETED)
            if not done and tick is not None:
                tick()
            for future in done:
                key = pending.pop(future)
                yield key, future.result()
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            # The executor's own shutdown would wait for the running tasks: end them.
            processes = list(getattr(pool, "_processes", {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.terminate()
            for process in processes:
                process.join(timeout=5.0)
