"""A user's names (trace paths, profile names, scenario keys) as text of the studies'
markdown files (scoreboard.md, report.md, disaggregated.md, summary.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpugov.daemon.errors import printable


def markdown_text(value: Any) -> str:
    """``value`` as one printable line (a file name may hold a newline or an escape
    sequence: :func:`~gpugov.daemon.errors.printable`) with its ``|`` escaped, which in a
    table row would end the cell and push the row's figures under the wrong headers."""
    return printable(str(value)).replace("|", "\\|")


def scenario_title(entry: Mapping[str, Any], key: str = "key") -> str:
    """A scoreboard scenario (a row's or a scenario's entry, its key under ``key``) as a
    table cell or heading: its trace, profile, load and what the key adds (a held-out
    window's ``@START``, a layout) joined by `` / ``, each written by
    :func:`markdown_text`. The key joins them with ``|``, which a trace path or a profile
    name may hold too: split at each ``|``, a trace ``a|b.csv`` read ``a / b.csv``."""
    whole = str(entry[key])
    trace, profile = str(entry.get("trace", "")), str(entry.get("profile", ""))
    stem = f"{trace}|{profile}|"
    if not whole.startswith(stem):  # an entry without its trace and profile
        return markdown_text(whole).replace("\\|", " / ")
    rest = markdown_text(whole[len(stem) :]).replace("\\|", " / ")
    return f"{markdown_text(trace)} / {markdown_text(profile)} / {rest}"
