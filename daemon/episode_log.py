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


__all__ = ["EPISODE_LOG_EVERY_S", "LEFT_OUT", "EpisodeLog"]
