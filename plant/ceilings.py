"""Rates no serving node reaches: what an engine's counters (the daemon's observer) and the
online model's windows (``mpc-online``) are checked against. A window that shows more is a
counter gone wild, not a sample of the node. Kept here, below both, so that reading them
imports nothing heavy."""

from __future__ import annotations

MAX_TOKENS_PER_S = 1e8
"""Tokens a second no GPU node processes: the fastest GPUs prefill a small model at
about 1e5 prompt tokens a second each, so a node of eight is near 1e6; this is a hundred
times that. A window that shows more (a counter gone wild) is no sample of the node. The
daemon's observer drops such a scrape first (:mod:`daemon.counter_jumps`)."""
MAX_REQUESTS_PER_S = 1e6
"""Requests (and engine steps) a second no node serves: each needs its prompt prefilled
in an engine step of tens of microseconds at least, and an engine's API server answers
on the order of 1e4 requests a second."""

__all__ = ["MAX_REQUESTS_PER_S", "MAX_TOKENS_PER_S"]
