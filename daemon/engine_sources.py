"""The engine sources: an engine's ``/metrics`` page fetched within one deadline and its kind
detected, the stateful I/O kept apart from the page's pure reading in :mod:`daemon.engines`."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Literal

from gpugov.daemon.engine_pools import DYNAMO_MARK, DYNAMO_SERIES
from gpugov.daemon.engines import (
    SPECS,
    TGI_BEFORE_FIRST_REQUEST,
    EngineKind,
    EngineSample,
    EngineSpec,
    detect_engine_on_page,
    extract,
    missing_series,
)
from gpugov.daemon.episode_log import EpisodeLog
from gpugov.daemon.errors import EngineParseError, EngineUnavailable
from gpugov.daemon.exposition import ParseTimeout, SeriesCache, parse_page
from gpugov.daemon.scrape import MAX_PAGE_BYTES, Fetcher, KeepAliveFetcher

# The engines module's logger, not this one's: these lines were logged there and keep the
# name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.engines")

KIND_CHANGES_LEFT_OUT = (
    "{count} more change(s) of engine kind in the {seconds:.0f} s before were not logged: "
    "does this URL reach engines of different kinds (a load balancer)?"
)
"""What a logged change of engine kind says about the changes left out before it."""

MISSING_CHANGES_LEFT_OUT = (
    "{count} more page(s) lacking series in the {seconds:.0f} s before were not logged: does "
    "this URL reach engines that publish different series (a load balancer)?"
)
"""What a logged page that lacks series says about the changes left out before it."""


HTML_SHOWN_CHARS = 80
"""The most characters of an HTML page's start its failure's line quotes."""

DYNAMO_FRONTEND_MARK = "dynamo_frontend_"
"""The prefix of a Dynamo frontend's series: its page has no engine's queue gauges."""


class ScrapedSource:
    """An engine's ``/metrics`` page over HTTP.

    Args:
        url: the metrics URL, e.g. ``http://127.0.0.1:8000/metrics``.
        kind: ``"vllm"``, ``"sglang"``, ``"tgi"`` or ``"auto"`` (detected on the first
            successful scrape, and again on a page without the detected kind's queue
            gauges: an engine of another kind restarted on the same port).
        timeout_s: one deadline for the whole scrape (connect, headers, body, reading
            the page).
        fetch: ``(url, timeout_s) -> text``; tests may pass their own.
        max_page_bytes: a larger page is refused (a bad scrape).
    """

    def __init__(
        self,
        url: str,
        kind: EngineKind | Literal["auto"] = "auto",
        *,
        timeout_s: float = 0.5,
        fetch: Fetcher | None = None,
        max_page_bytes: int = MAX_PAGE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if kind != "auto" and kind not in SPECS:
            raise ValueError(f"unknown engine kind {kind!r}; expected auto, {', '.join(SPECS)}")
        self.url = url
        self.timeout_s = timeout_s
        self._fetch = fetch or KeepAliveFetcher(max_bytes=max_page_bytes)
        self.spec: EngineSpec | None = None if kind == "auto" else SPECS[kind]
        self._auto = kind == "auto"
        self._wanted = None if self.spec is None else self.spec.wanted()
        self._cache: SeriesCache = {}
        self._missing: tuple[str, ...] = ()
        self._missing_said: tuple[str, ...] = ()
        """The series the log last said the page lacks (none: it has them all)."""
        self._missing_said_s = -math.inf
        self._missing_changes = EpisodeLog(left_out=MISSING_CHANGES_LEFT_OUT)
        self._clock = clock
        # A URL whose engine kind flips scrape after scrape (a load balancer over engines
        # of different kinds) logged a warning each scrape: 18,000 lines an hour.
        self._kind_changes = EpisodeLog(left_out=KIND_CHANGES_LEFT_OUT)

    @property
    def kind(self) -> str:
        """The engine kind, ``"auto"`` until detected."""
        return "auto" if self.spec is None else self.spec.kind

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        """Fetch and parse the page within ``timeout_s`` (default: the source's own): one
        deadline for the fetch and the reading of the page together, so a page too large
        to read in time (hundreds of thousands of series) is a late scrape, never a loop
        stalled for seconds on data it then takes as fresh.

        Raises:
            EngineUnavailable: fetch failed or timed out, or the page was still being
                read at the deadline. EngineParseError: bad text, impossible values or
                unknown engine.
        """
        budget = self.timeout_s if timeout_s is None else max(0.0, min(timeout_s, self.timeout_s))
        deadline = self._clock() + budget
        text = self._fetch(self.url, budget)
        self._refuse_html(text)
        try:
            if self.spec is None:
                self._detect(text)
            try:
                sample = self._parse(text, deadline)
            except EngineParseError as error:
                if not self._auto or not self._detect(text):
                    self._refuse_frontend(text, error)
                    raise
                sample = self._parse(text, deadline)
        except ParseTimeout as error:
            raise self._unread(text, budget) from error
        if self._clock() > deadline:
            raise self._unread(text, budget)
        return sample

    def _refuse_html(self, text: str) -> None:
        """Refuse a page that is HTML (no Prometheus text starts with ``<``), quoting its
        start: an authenticating proxy's sign-in page answers 200, and the line blamed
        the engine kind or its metrics.

        Raises:
            EngineParseError: the page starts with ``<``.
        """
        head = text.lstrip("\ufeff \t\r\n")
        if head.startswith("<"):
            shown = repr(head[:HTML_SHOWN_CHARS].rstrip())
            more = "..." if len(head.rstrip()) > HTML_SHOWN_CHARS else ""
            raise EngineParseError(
                f"{self.url}: the page is HTML, not Prometheus text ({shown}{more}): a "
                "sign-in or error page of a proxy, or a URL that is not the engine's metrics"
            )

    def _refuse_frontend(self, text: str, cause: EngineParseError | None = None) -> None:
        """Refuse a page of no engine's series that is a Dynamo frontend's, in words: the
        line blamed the engine kind or its metrics, where the URL is the frontend's (it
        listens on port 8000, the default ``engine.url``'s). Nothing for another page.

        Raises:
            EngineParseError: the page has the frontend's series.
        """
        # The mark first: a scan for the engines' prefixes costs a large page its time.
        if DYNAMO_FRONTEND_MARK in text and detect_engine_on_page(text) is None:
            raise EngineParseError(
                f"{self.url}: the page is a Dynamo frontend's ({DYNAMO_FRONTEND_MARK}* series, "
                "no engine's): point engine.url at a worker's page, on the worker's system "
                "port (DYN_SYSTEM_PORT)"
            ) from cause

    def _unread(self, text: str, budget: float) -> EngineUnavailable:
        """The failure of a page fetched in time but not read by the deadline."""
        return EngineUnavailable(
            f"{self.url}: timed out: its page ({len(text)} characters) was not read within "
            f"{budget:.3g} s (a page this large needs a longer engine.timeout_s)"
        )

    def _detect(self, text: str) -> bool:
        """Detect the engine kind from ``text`` (``kind = "auto"``); whether it changed. A
        page of another kind than the one detected before is an engine of that kind
        restarted on the same port (one WARNING; at most one a minute, the changes in
        between at DEBUG and counted in the next): it was read as a page without queue
        gauges, the fail-safe held until the daemon restarted.

        Raises:
            EngineParseError: no engine's metrics on a first page.
        """
        kind = detect_engine_on_page(text)
        if kind is None:
            if self.spec is not None:
                return False
            self._refuse_frontend(text)
            raise EngineParseError(
                f"{self.url}: no vllm:, sglang: or tgi_ metrics on the page: the engine's "
                "metrics are off (vLLM's --disable-log-stats; SGLang needs --enable-metrics) "
                f"or the URL is not an engine's ({TGI_BEFORE_FIRST_REQUEST})"
            )
        if self.spec is not None and self.spec.kind == kind:
            return False
        if self.spec is not None:
            note = self._kind_changes.start(self._clock())  # at most one line a minute
            log.log(
                logging.WARNING if note is not None else logging.DEBUG,
                "%s: the engine is now %s (it was %s): read as %s from here (engine kind auto)%s",
                self.url,
                kind,
                self.spec.kind,
                kind,
                note or "",
            )
        self.spec = SPECS[kind]
        self._wanted = self.spec.wanted()
        self._cache = {}
        self._missing = ()
        return True

    def _parse(self, text: str, deadline: float | None = None) -> EngineSample:
        """The engine sample of the page ``text``, as the detected kind reads it (given up
        past ``deadline``: :class:`~daemon.exposition.ParseTimeout`)."""
        assert self.spec is not None and self._wanted is not None
        clock = self._clock
        series = parse_page(
            text, self._wanted, self.url, self._cache, deadline=deadline, clock=clock
        )
        if DYNAMO_MARK in text:  # a Dynamo worker: its component series name the role
            dynamo = parse_page(
                text, DYNAMO_SERIES, self.url, self._cache, deadline=deadline, clock=clock
            )
            series.update(dynamo)
        if deadline is not None and clock() > deadline:
            raise ParseTimeout(f"{self.url}: the page was read past its deadline")
        sample = extract(self.spec, series, self.url)
        self._report_missing(missing_series(self.spec, series))
        return sample

    def _report_missing(self, missing: tuple[str, ...]) -> None:
        """One WARNING when the page lacks series the governor reads (an engine version
        that names them otherwise, metrics it does not publish yet), naming them; one
        INFO when it has them all again; nothing while the set is unchanged. At most one
        such WARNING a minute: a URL whose pages differ scrape after scrape (a load
        balancer over engines that publish different series) logged two lines a scrape;
        the changes in between go to DEBUG, counted in the next, and a set that lasts is
        said once its minute is up."""
        changed, self._missing = missing != self._missing, missing
        kind = self.kind
        if not missing:
            if self._missing_said:  # the end of what was said: always said
                log.info("%s: the %s page now has every series the governor reads", self.url, kind)
                self._missing_said = ()
            elif changed:
                log.debug("%s: the %s page has every series again", self.url, kind)
            return
        now = self._clock()
        due = now - self._missing_said_s >= self._missing_changes.every_s
        if missing == self._missing_said or not (changed or due):
            return
        note = self._missing_changes.start(now)
        if note is None:
            log.debug("%s: the %s page lacks %s", self.url, kind, "; ".join(missing))
            return
        log.warning(
            "%s: the %s page lacks %s (what derives from them stays unknown until "
            "the page has them)%s",
            self.url,
            kind,
            "; ".join(missing),
            note,
        )
        self._missing_said, self._missing_said_s = missing, now

    def close(self) -> None:
        """Close kept-alive connections."""
        close = getattr(self._fetch, "close", None)
        if close is not None:
            close()


class VllmSource(ScrapedSource):
    """vLLM: V1 names, with the deprecated aliases older fleets still run."""

    def __init__(self, url: str, *, timeout_s: float = 0.5, fetch: Fetcher | None = None) -> None:
        super().__init__(url, "vllm", timeout_s=timeout_s, fetch=fetch)


class SglangSource(ScrapedSource):
    """SGLang (needs ``--enable-metrics``); per-rank series counted once."""

    def __init__(self, url: str, *, timeout_s: float = 0.5, fetch: Fetcher | None = None) -> None:
        super().__init__(url, "sglang", timeout_s=timeout_s, fetch=fetch)


class TgiSource(ScrapedSource):
    """Hugging Face text-generation-inference (no TTFT histogram: TTFT stays None)."""

    def __init__(self, url: str, *, timeout_s: float = 0.5, fetch: Fetcher | None = None) -> None:
        super().__init__(url, "tgi", timeout_s=timeout_s, fetch=fetch)
