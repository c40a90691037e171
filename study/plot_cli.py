"""``gpugov plot FILE.jsonl``: plot a ``replay``-able recording (``run --record``) to a PNG.

One figure per domain, the same panels as ``simulate --plot`` (see :mod:`gpugov.study.plots`);
latencies are the windowed TTFT and TPOT the daemon observed each tick.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any


def run_plot(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov plot``."""
    from gpugov.daemon.cli_support import UsageError, check_output_file, warn
    from gpugov.daemon.record import RecordingError, read_recording
    from gpugov.study.plots import pyplot, series_from_recording, write_run_plot

    source = Path(args.file)
    out = Path(args.out) if args.out else source.with_suffix(".png")
    pyplot("gpugov plot")  # the missing extra is one line, before any reading
    try:
        header, rows = read_recording(source, warn=warn)
    except RecordingError as error:
        raise UsageError(str(error)) from error
    listed = header.get("domains", [])
    if not isinstance(listed, list) or not all(isinstance(d, dict) for d in listed):
        raise UsageError(f"{source}: header domains must be a list of objects")
    domains: list[str | None] = [str(d.get("name")) for d in listed] or [None]
    if args.domain is not None:
        if args.domain not in domains:
            raise UsageError(f"--domain {args.domain}: not in {source} (domains: {domains})")
        domains = [args.domain]
    targets: dict[str | None, Path] = {}
    for domain in domains:
        if len(domains) == 1:
            targets[domain] = out
            continue
        # A domain's name is the recording's text, not a path: only its safe characters
        # go into the file name (a name like "a/b" or "../x" stays beside --out).
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(domain))[:64].strip(".") or "domain"
        target = out.with_name(f"{out.stem}-{safe}{out.suffix}")
        if target in targets.values():
            target = out.with_name(f"{out.stem}-{safe}-{len(targets)}{out.suffix}")
        targets[domain] = target
    for target in targets.values():
        check_output_file("--out", target, [("the recording", source)])
    from gpugov.study.plots import check_image_format

    check_image_format("--out", out, "gpugov plot")
    controllers: dict[str | None, Any] = {str(d.get("name")): d.get("controller") for d in listed}
    from gpugov.daemon.controller_spec import canonical_controller_name

    for domain, target in targets.items():
        name = canonical_controller_name(str(controllers.get(domain, "?")))
        # A tick of the wrong shape (null, a string observation, "hot" degrees) fails the
        # series or, where its values are read lazily, the plot: one line either way.
        try:
            series = series_from_recording(rows, domain)
            ticks = len(series.time_s)
            if ticks:
                title = (
                    f"gpugov plot: {source.name}, domain {_printable(domain)}, "
                    f"controller {name} "
                    f"({header.get('mode', 'node')}"
                    + (", dry run: no clock was set" if header.get("dry_run") else "")
                    + f", {ticks} ticks)"
                )
                write_run_plot(series, target, title)
        except (TypeError, ValueError, AttributeError, OverflowError, KeyError) as error:
            raise UsageError(
                f"{source}: domain {domain!r}: a tick line is not a recording's ({error})"
            ) from error
        if not ticks:
            raise UsageError(f"{source}: domain {domain!r} has no tick lines to plot")
        print(f"wrote {target}")
    return 0


def _printable(text: str | None) -> str:
    """``text`` with what a font cannot draw (a NUL, a control character) as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``plot`` to the ``gpugov`` parser."""
    parser = subparsers.add_parser(
        "plot",
        help="plot a replay or run --record recording (FILE.jsonl) to a PNG",
        description="Plot a recording written by 'gpugov run --record': clocks (requested "
        "and realised), power against the cap, queues, TTFT/TPOT against their SLOs and "
        "temperature against the thermal limit. Needs the gpugov[plots] extra.",
    )
    parser.add_argument("file", metavar="FILE.jsonl", help="a recording from run --record")
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE.png",
        help="the PNG to write (default: FILE.png beside the recording; with several "
        "domains, one FILE-DOMAIN.png each, the domain's name with any character but "
        "letters, digits, '.', '_' and '-' as '_')",
    )
    parser.add_argument(
        "--domain", default=None, metavar="NAME", help="plot only this domain (default: all)"
    )
    parser.set_defaults(handler=run_plot)
