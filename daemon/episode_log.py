"""Which starts and ends of a recurring trouble are logged: an engine scrape that fails,
a GPU sample that fails, a domain's fail-safe.

Each such trouble logs one line when it starts and one when it ends. A trouble that
comes and goes (an engine answering every other scrape, a flaky NVML read) would then
log two lines a flap: 18,000 an hour at a 0.2 s period. :class:`EpisodeLog` lets at most
one start a ``every_s`` through, with its end; the starts (and so the ends) in between go
to DEBUG and are counted, and the next start logged says how many were left out. A
trouble that lasts has its own reminders (its owner's); one of those logged marks the
episode as logged, so its end is logged too. Every occurrence still counts in the
metrics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

EPISODE_LOG_EVERY_S = 60.0
"""At most one logged start of the same trouble per this many seconds."""
LEFT_OUT = (
    "{count} more such episode(s) in the {seconds:.0f} s before were not logged: it comes and goes"
)
"""What a logged start says about the starts left out before it."""


class EpisodeLog:
    """The log decisions for one trouble (one engine, one GPU, one domain's fail-safe).

    Args:
        every_s: at most one logged start per this many seconds (of the times given).
        left_out: how a logged start says what was left out before it, a format string
            with ``{count}`` (starts left out) and ``{seconds}`` (since the first of them).
    """

    def __init__(self, every_s: float = EPISODE_LOG_EVERY_S, *, left_out: str = LEFT_OUT) -> None:
        self.every_s = float(every_s)
        self.left_out = left_out
        self._logged_start_s = -math.inf
        self._left_out = 0
        self._left_out_since_s: float | None = None
        self.logged = False
        """Whether the episode now running had a line logged (its end is logged too)."""

    def start(self, now_s: float) -> str | None:
        """An episode starts at ``now_s``: None when its start is left out (log it at
        DEBUG), else the text to end its line with: empty, or how many starts were left
        out since the last one logged."""
        if now_s - self._logged_start_s < self.every_s:
            self.logged = False
            if self._left_out == 0:
                self._left_out_since_s = now_s
            self._left_out += 1
            return None
        self._logged_start_s = now_s
        self.logged = True
        left_out, since = self._left_out, self._left_out_since_s
        self._left_out, self._left_out_since_s = 0, None
        if not left_out or since is None:
            return ""
        return " (" + self.left_out.format(count=left_out, seconds=now_s - since) + ")"

    def reminded(self) -> None:
        """A line about the running episode was logged after all (a reminder while it
        lasts): its end is logged too."""
        self.logged = True

    def end(self) -> bool:
        """The episode ended: whether to log that (its start, or a reminder, was)."""
        logged, self.logged = self.logged, False
        return logged


@dataclass(frozen=True)
class FailureLine:
    """What to log of one failure in a run of them (:meth:`FailureRun.failed`): ``kind``
    ``"start"`` (the run's first, with ``note`` to end the line with), ``"reminder"``
    (``count`` failures in a row over ``seconds``, ``left_out`` lines not logged since the
    last one) or ``"quiet"`` (to DEBUG)."""

    kind: str
    note: str = ""
    count: int = 0
    seconds: float = 0.0
    left_out: int = 0


class FailureRun:
    """The log decisions for one operation that can fail every tick (a GPU's clock writes,
    the lock-state file's writes): the first failure of a run; while it goes on, one
    reminder per ``every_s`` with the failures in a row and the lines left out since the
    last one; one line when it succeeds again. Runs that come and go log at most one start
    per ``every_s`` (:class:`EpisodeLog`). The owner words the lines.

    Args:
        every_s: at most one logged line per this many seconds while a run lasts.
        clock: monotonic seconds.
    """

    def __init__(
        self, every_s: float = EPISODE_LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = float(every_s)
        self._clock = clock
        self.in_a_row = 0
        """Failures in a row now (0: the last attempt succeeded)."""
        self._since_s = 0.0
        self._logged_s = 0.0
        self._left_out = 0
        self._episodes = EpisodeLog(every_s)

    def failed(self) -> FailureLine:
        """One more failure: what to log of it."""
        now = self._clock()
        self.in_a_row += 1
        if self.in_a_row == 1:
            self._since_s = now
            note = self._episodes.start(now)
            if note is None:  # runs that come and go: one of them a minute
                self._left_out = 1
                return FailureLine("quiet")
            self._logged_s = now
            self._left_out = 0
            return FailureLine("start", note=note)
        if now - self._logged_s >= self.every_s:
            self._episodes.reminded()
            line = FailureLine(
                "reminder",
                count=self.in_a_row,
                seconds=now - self._since_s,
                left_out=self._left_out,
            )
            self._logged_s = now
            self._left_out = 0
            return line
        self._left_out += 1
        return FailureLine("quiet")

    def succeeded(self) -> tuple[int, float, bool] | None:
        """The operation went through: None where it had not been failing, else the
        failures of the run, its seconds, and whether to log its end (a line of it was)."""
        count, self.in_a_row = self.in_a_row, 0
        if not count:
            return None
        return count, self._clock() - self._since_s, self._episodes.end()


__all__ = ["EPISODE_LOG_EVERY_S", "LEFT_OUT", "EpisodeLog", "FailureLine", "FailureRun"]
