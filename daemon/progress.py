"""Progress with an ETA for long commands: a redrawn bar on a terminal, a periodic line elsewhere.

One class for every long command (simulate, run --simulate, the scoreboard, experiments,
sweeps, profile). The clock and the stream are arguments, so tests need no sleeping.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from gpugov.daemon.errors import Terminated, printable

_interrupt_requested: type[KeyboardInterrupt] | None = None
"""Set by the command line's Ctrl-C and SIGTERM handlers (:func:`note_interrupt`); read at
every progress update."""


def note_interrupt(*, terminated: bool = False) -> None:
    """Remember a Ctrl-C (``terminated``: a SIGTERM). The handler also raises the
    exception, but a compiled kernel's call back into Python (numba boxing an array it
    returns) swallows an exception raised there, and the command ran on to its end: the
    next progress update raises it again (:func:`raise_if_interrupted`)."""
    global _interrupt_requested
    _interrupt_requested = Terminated if terminated else KeyboardInterrupt


def clear_interrupt() -> None:
    """Forget a Ctrl-C or SIGTERM (a command's start, or once the interrupt was handled)."""
    global _interrupt_requested
    _interrupt_requested = None


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt (:class:`~gpugov.daemon.errors.Terminated` for a SIGTERM)
    where one was noted and not yet handled."""
    kind = _interrupt_requested
    if kind is not None:
        clear_interrupt()
        raise Terminated.now() if kind is Terminated else KeyboardInterrupt


def format_duration(seconds: float) -> str:
    """``73`` -> ``"1m13s"``; ``3700`` -> ``"1h01m"``; negative or non-finite -> ``"?"``."""
    if not seconds >= 0 or seconds == float("inf"):
        return "?"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{(whole % 3600) // 60:02d}m"


MIN_ETA_ELAPSED_S = 1.0
MIN_ETA_FRACTION = 0.01
"""An ETA is shown once a second has passed or a percent of the work is done."""


class Progress:
    """Report ``done`` out of ``total`` units of work, with the rate so far and an ETA.

    On a terminal the line is redrawn in place at most every ``tty_interval_s``; otherwise
    a full line is written every ``log_interval_s`` (and at the end), so logs stay short.
    ``detail`` strings (energy so far, SLO so far, ...) are appended to the line.
    """

    def __init__(
        self,
        total: float,
        label: str,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        tty_interval_s: float = 0.2,
        log_interval_s: float = 10.0,
        enabled: bool = True,
        quiet_start: bool = False,
        quiet_start_s: float | None = None,
    ) -> None:
        if not total >= 0:
            raise ValueError(f"progress total must be >= 0, got {total!r}")
        if quiet_start_s is not None and not 0 <= quiet_start_s < math.inf:
            raise ValueError(f"quiet_start_s must be finite and >= 0, got {quiet_start_s!r}")
        self.total = float(total)
        self.label = label
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s = tty_interval_s if self.tty else log_interval_s
        self.enabled = enabled
        self.start_s = clock()
        # ``quiet_start``: the first line only once an interval has passed (or
        # ``quiet_start_s``, which implies it), and no final line where none was shown (a
        # command that is usually short: replay, a trace load).
        quiet_start = quiet_start or quiet_start_s is not None
        wait_s = self.interval_s if quiet_start_s is None else quiet_start_s
        self._quiet_until_s = self.start_s + wait_s if quiet_start else -math.inf
        self._last_emit_s = -math.inf
        self._quiet_start = quiet_start
        self._emitted = False
        self._done = 0.0
        self._closed = False

    def line(self, done: float, detail: str = "") -> str:
        """The progress line for ``done`` units (pure; used by ``update`` and tests)."""
        elapsed = self.clock() - self.start_s
        fraction = min(1.0, done / self.total) if self.total > 0 else 1.0
        rate = done / elapsed if elapsed > 0 else 0.0
        # Below a second and a percent the rate is the start's noise (a run whose first
        # tick reached 0.01 of 599 s showed an ETA of 3h10m): "?" until one of them.
        settled = elapsed >= MIN_ETA_ELAPSED_S or fraction >= MIN_ETA_FRACTION
        eta = (self.total - done) / rate if rate > 0 and settled else float("inf")
        unit = f" {self.unit}" if self.unit else ""
        text = (
            f"{self.label}: {fraction * 100:5.1f}% ({done:,.0f}/{self.total:,.0f}{unit}), "
            f"elapsed {format_duration(elapsed)}, ETA {format_duration(eta)}"
        )
        if self.tty:
            width = 20
            filled = int(round(fraction * width))
            text = f"[{'#' * filled}{'.' * (width - filled)}] {text}"
        # The label and detail can name a user's file: escaped as an error line is.
        return printable(f"{text}, {detail}" if detail else text)

    def due(self) -> bool:
        """Whether the next :meth:`update` would emit a line (so callers can skip
        computing an expensive ``detail`` when it would not be shown)."""
        if not self.enabled or self._closed:
            return False
        now = self.clock()
        return now >= self._quiet_until_s and now - self._last_emit_s >= self.interval_s

    def update(self, done: float, detail: str = "", *, force: bool = False) -> None:
        """Record progress; emit a line when the interval has passed (or ``force``). A
        Ctrl-C noted and not yet raised is raised here (:func:`note_interrupt`)."""
        raise_if_interrupted()
        self._done = done
        if not self.enabled or self._closed:
            return
        now = self.clock()
        if not force and (now < self._quiet_until_s or now - self._last_emit_s < self.interval_s):
            return
        self._last_emit_s = now
        self._emitted = True
        text = self.line(done, detail)
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, detail: str = "", *, done: float | None = None) -> None:
        """Emit the final line (and end the redrawn one on a terminal); ``done``, when
        given, is the final amount of work."""
        if self._closed:
            return
        if self._quiet_start and not self._emitted:
            raise_if_interrupted()
            self._closed = True
            return
        self.update(self._done if done is None else done, detail, force=True)
        self._closed = True
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
