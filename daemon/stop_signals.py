"""The signals that stop ``gpugov run``, in a module light enough for the console script
to handle them before the daemon's own modules are imported (``gpugov.cli``)."""

from __future__ import annotations

import signal

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name)
    for name in (
        "SIGTERM",
        "SIGINT",
        "SIGHUP",
        "SIGQUIT",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGPOLL",
    )
    if hasattr(signal, name)
)
"""Every catchable signal whose default action ends the process (SIGPIPE stays ignored,
as Python leaves it): each one stops the loop and the clocks are reset."""

__all__ = ["STOP_SIGNALS"]
