"""The signals that stop ``gpugov run``, in a module light enough for the console script
to handle them before the daemon's own modules are imported (``gpugov.cli``)."""

from __future__ import annotations

import _thread
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS: tuple[int, ...] = tuple(
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
        "SIGPOLL",
        "SIGPWR",
        "SIGSTKFLT",
    )
    if hasattr(signal, name)
) + (
    tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    if hasattr(signal, "SIGRTMIN") and hasattr(signal, "SIGRTMAX")
    else ()
)
"""Every catchable signal whose default action ends the process (SIGPIPE and SIGXFSZ stay
ignored, as Python leaves them: a write past the file size limit is a failed write, as a
full disk's, never a stop; the faults a crash raises, such as SIGSEGV or SIGABRT, stay
the crash's): each one stops the loop and the clocks are reset. SIGPWR (LXC's stop of a
container) and the real-time signals (systemd's halt in a container is SIGRTMIN+3)
killed the daemon with its GPUs locked."""


def signal_name(signum: int) -> str:
    """A signal's name for a line (``SIGTERM``; a real-time one ``SIGRTMIN+3``, which
    :class:`signal.Signals` has no member for)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        low = getattr(signal, "SIGRTMIN", None)
        return f"signal {signum}" if low is None else f"SIGRTMIN+{signum - low}"


def signal_number(name: str) -> int:
    """The number of the signal :func:`signal_name` calls ``name`` (``SIGRTMIN+3`` too).

    Raises:
        KeyError: no such signal.
    """
    base, plus, offset = name.partition("+")
    if plus and base == "SIGRTMIN" and offset.isdigit():
        return int(signal.SIGRTMIN) + int(offset)
    return int(signal.Signals[name])


class StopEvent(threading.Event):
    """A :class:`threading.Event` that a signal handler may set (:func:`set_from_handler`):
    seen set at once by :meth:`is_set` and :meth:`wait`, its waiters woken from a thread
    of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._signalled = False

    def is_set(self) -> bool:
        """Whether it was set, by a handler or by :meth:`set`."""
        return self._signalled or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """As :meth:`threading.Event.wait`; True at once once a handler set it."""
        return self._signalled or super().wait(timeout)

    def settled(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a handler's set to be carried out by its thread
        (``first`` run, waiters woken): a stop's log line is out before the exit."""
        return super().wait(timeout)

    def clear(self) -> None:
        """As :meth:`threading.Event.clear`, a handler's set included."""
        self._signalled = False
        super().clear()


def set_from_handler(*events: threading.Event, first: Callable[[], object] | None = None) -> None:
    """Set ``events`` from a signal handler, in order, never taking their locks.

    ``Event.set`` takes the event's lock, which is not reentrant, and a handler runs in
    the main thread between any two bytecodes: a signal that lands while the main thread
    holds that lock (entering or leaving ``event.wait``, or inside an earlier handler's
    ``set``) waited on it forever, a daemon hung at its stop with its GPUs locked. A
    :class:`StopEvent` reads as set at once; one thread then sets them all in order (its
    waiters woken), taking each lock once the handler has returned. ``first`` runs on that
    thread before them: a log line, which in the handler could land inside the main
    thread's own write to the same stream (a reentrant write, an error on stderr).
    """
    for event in events:
        if isinstance(event, StopEvent):
            event._signalled = True

    def set_all() -> None:
        try:
            if first is not None:
                first()
        finally:
            for event in events:
                event.set()

    off_handler(set_all)


def off_handler(function: Callable[[], object]) -> None:
    """Run ``function`` on a thread of its own, out of a signal handler's way (see
    :func:`set_from_handler`). ``_thread`` starts it without ``threading``'s own locks,
    which the interrupted main thread may hold as well."""
    try:
        _thread.start_new_thread(function, ())
    except RuntimeError:  # no new thread at the interpreter's exit: nothing waits then
        function()


__all__ = [
    "STOP_SIGNALS",
    "StopEvent",
    "off_handler",
    "set_from_handler",
    "signal_name",
    "signal_number",
]
