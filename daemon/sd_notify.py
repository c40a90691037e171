"""systemd's notify protocol in the standard library alone, for ``gpugov actuator``.

``gpugov run`` talks to systemd through :class:`gpugov.daemon.loop.SystemdNotify` (one
watchdog ping per control tick, sent by :class:`SocketNotifier`); the actuator sends
``READY=1`` once it serves, ``WATCHDOG=1`` from its serving loop (:class:`Watchdog`),
``STOPPING=1`` as it resets and exits. Outside systemd (no ``$NOTIFY_SOCKET``) nothing is
sent. A datagram the socket has no room for is dropped, never waited for.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

MIN_WATCHDOG_S = 1.0
"""The shortest ``WatchdogSec=`` the actuator accepts: its loop serves in 0.1 s rounds,
and one round's NVML calls (a reset per GPU) must fit with room to spare."""


def notify_systemd(state: str, environ: Mapping[str, str] | None = None) -> None:
    """``sd_notify(state)`` when systemd asked for it (``$NOTIFY_SOCKET``); else nothing.

    Sent without waiting: the socket queues a few datagrams only
    (``net.unix.max_dgram_qlen``), and while its reader is busy (PID 1 in a long reload, a
    container's notify proxy that stopped reading) a blocking send held the caller's loop,
    its watchdog pings and, at a stop, the clocks' reset. One with no room is dropped."""
    address = _notify_address(os.environ if environ is None else environ)
    if address is None:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        _send(sock, address, state)


def _notify_address(environ: Mapping[str, str]) -> str | None:
    """``$NOTIFY_SOCKET`` as a socket address (``@name``: an abstract socket); None unset."""
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return None
    return "\0" + address[1:] if address.startswith("@") else address


def _send(sock: socket.socket, address: str, state: str) -> None:
    """One datagram, never waiting for room in the socket's queue (dropped without)."""
    try:
        sock.sendto(state.encode(), socket.MSG_DONTWAIT, address)
    except OSError as error:  # BlockingIOError: no room in its queue
        log.debug("sd_notify failed: %s", error)


class SocketNotifier:
    """``notify(state)`` to the ``$NOTIFY_SOCKET`` of ``environ``, never waiting for room
    (:func:`notify_systemd`), over one socket kept open: ``gpugov run``'s sender
    (:class:`daemon.loop.SystemdNotify`), two datagrams a tick."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._address = _notify_address(environ)
        self._sock = (
            None if self._address is None else socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        )

    def notify(self, state: str) -> None:
        """Send ``state`` (``READY=1``, ``WATCHDOG=1``, ``STATUS=...``, ``STOPPING=1``)."""
        if self._sock is not None and self._address is not None:
            _send(self._sock, self._address, state)


def watchdog_seconds(environ: Mapping[str, str]) -> float | None:
    """The unit's ``WatchdogSec=`` when systemd expects this process to ping it
    (``$WATCHDOG_USEC`` set, ``$WATCHDOG_PID`` absent or this pid, ``$NOTIFY_SOCKET``
    set); else None."""
    pid = environ.get("WATCHDOG_PID")
    if not environ.get("NOTIFY_SOCKET") or (pid is not None and pid != str(os.getpid())):
        return None
    raw = environ.get("WATCHDOG_USEC", "")
    if watchdog_usec_problem(environ) is not None or not raw:
        return None
    return int(raw) / 1e6


def watchdog_usec_problem(environ: Mapping[str, str]) -> str | None:
    """Why a set ``$WATCHDOG_USEC`` is no positive integer of ASCII digits (``abc``,
    ``-5``, ``1e6``, ``²``, which ``isdigit()`` passes and ``int()`` refuses), in one line
    naming it; None where it is unset or well formed. ``run`` and ``actuator`` refuse it."""
    raw = environ.get("WATCHDOG_USEC")
    if raw is None:
        return None
    value = raw.strip()
    if value.isascii() and value.isdigit() and int(value) > 0:
        return None
    shown = raw if len(raw) <= 40 else f"{raw[:40]}..."
    return (
        f"WATCHDOG_USEC={shown!r}: must be a positive integer of microseconds (systemd "
        "sets it from the unit's WatchdogSec=); unset it or fix the unit"
    )


class Watchdog:
    """``WATCHDOG=1`` from the loop that does the work, at most every quarter of
    ``WatchdogSec=``.

    The loop calls :meth:`progress` after every round it completed; there is no thread
    that pings on its own, so a round stuck in a call (an NVML call that hangs) sends
    nothing, systemd's watchdog fires, and the unit's ``ExecStopPost=`` resets the clocks.

    Args:
        environ: for ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self.watchdog_s = watchdog_seconds(self._environ)
        self._clock = clock
        self._last_s = -math.inf
        self.pings = 0

    def problem(self) -> str | None:
        """Why this ``WatchdogSec=`` cannot work: ``$WATCHDOG_USEC`` malformed, or shorter
        than :data:`MIN_WATCHDOG_S`."""
        malformed = watchdog_usec_problem(self._environ)
        if malformed is not None:
            return malformed
        if self.watchdog_s is None or self.watchdog_s >= MIN_WATCHDOG_S:
            return None
        return (
            f"the unit's WatchdogSec={self.watchdog_s:g}s is too short (the actuator serves "
            f"in 0.1 s rounds); use at least {MIN_WATCHDOG_S:g}s"
        )

    def progress(self) -> None:
        """A round of work completed: ping when a quarter of ``WatchdogSec=`` has passed."""
        if self.watchdog_s is None:
            return
        now = self._clock()
        if now - self._last_s >= self.watchdog_s / 4:
            self._last_s = now
            notify_systemd("WATCHDOG=1", self._environ)
            self.pings += 1
