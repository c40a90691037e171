"""``gpugov plot FILE.jsonl``: plot a ``replay``-able recording (``run --record``) to a PNG.

One figure per domain, the same panels as ``simulate --plot`` (see :mod:`gpugov.study.plots`);
latencies are the windowed TTFT and TPOT the daemon observed each tick. The whole
recording is checked before any PNG is written: a bad header field or tick is one line
naming the file, the line and the field.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpugov.daemon.progress import Progress

PLOT_LIMIT = 1e12
"""The largest magnitude plotted: beyond any real clock, power, queue or time, and far below
where matplotlib's axis arithmetic overflows into RuntimeWarnings (1e308)."""

MIN_SLO_S = 1e-6
"""The smallest SLO plotted: latency / SLO stays finite on the log axis."""

PROGRESS_AFTER_S = 2.0
"""A plot shows its progress line (ticks checked and drawn, with an ETA) once it has taken
this long: a day's recording takes about a minute, a short one well under a second."""

PLOTTED_FIELDS = (
    "time_s",
    "realized_clock_mhz",
    "power_w",
    "power_limit_w",
    "waiting_requests",
    "decode_active",
    "temperature_c",
    "thermal_limit_c",
    "ttft_recent_s",
    "tpot_recent_s",
    "ttft_slo_s",
    "tpot_slo_s",
)
"""The observation fields the panels draw (each null or a plottable number)."""


def run_plot(args: argparse.Namespace) -> int:
    """Entry point of ``gpugov plot``."""
    from gpugov.daemon.cli_outputs import check_output_file
    from gpugov.daemon.cli_support import UsageError, warn
    from gpugov.daemon.progress import Progress
    from gpugov.daemon.record import RecordingError
    from gpugov.daemon.record_reader import read_recording
    from gpugov.study.plots import check_image_format, pyplot

    source = Path(args.file)
    out = Path(args.out) if args.out else source.with_suffix(".png")
    pyplot("gpugov plot")  # the missing extra is one line, before any reading
    # --out before the recording is read: a day's recording takes a minute to read and
    # check, and a missing folder or a .txt name was refused only after it.
    check_image_format("--out", out, "gpugov plot")
    check_output_file("--out", out, [("the recording", source)])
    try:
        header, rows = read_recording(source, warn=warn)
    except RecordingError as error:
        raise UsageError(str(error)) from error
    controllers = checked_header(source, header)
    domains = list(controllers)
    if args.domain is not None:
        if args.domain not in domains:
            raise UsageError(f"--domain {args.domain}: not in {source} (domains: {domains})")
        domains = [args.domain]
    to_draw = len(rows) if args.domain is None else _ticks_of(rows, args.domain)
    progress = Progress(len(rows) + to_draw, "plot", unit="ticks", quiet_start_s=PROGRESS_AFTER_S)
    try:
        _plot_domains(source, out, header, rows, controllers, domains, progress)
    except Exception:
        progress.close()  # a shown line ends where the plot stopped, before the error's line
        raise
    progress.close(done=progress.total)
    return 0


def _plot_domains(
    source: Path,
    out: Path,
    header: dict[str, Any],
    rows: list[Any],
    controllers: dict[str, str | None],
    domains: list[str],
    progress: Progress,
) -> None:
    """Check every tick, then write one figure per domain of ``domains`` (beside ``out``
    where there are several), counting the ticks checked and drawn on ``progress``."""
    from gpugov.daemon.cli_outputs import check_output_file
    from gpugov.daemon.cli_support import UsageError, wrote
    from gpugov.study.plots import series_from_recording, write_run_plot

    checked_ticks(source, rows, controllers, progress)
    targets: dict[str, Path] = {}
    for domain in domains:
        if len(domains) == 1:
            targets[domain] = out
            continue
        # A domain's name is the recording's text, not a path: only its safe characters
        # go into the file name (a name like "a/b" or "../x" stays beside --out).
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", domain)[:64].strip(".") or "domain"
        target = out.with_name(f"{out.stem}-{safe}{out.suffix}")
        if target in targets.values():
            target = out.with_name(f"{out.stem}-{safe}-{len(targets)}{out.suffix}")
        targets[domain] = target
    for target in targets.values():
        check_output_file("--out", target, [("the recording", source)])
    from gpugov.daemon.controller_spec import canonical_controller_name

    # Every domain's series before any PNG: a domain without ticks writes none of them.
    series = {domain: series_from_recording(rows, domain) for domain in targets}
    done = len(rows)
    for domain, drawn in series.items():
        if not drawn.time_s:
            raise UsageError(f"{source}: domain {domain!r} has no tick lines to plot")
    for domain, target in targets.items():
        name = canonical_controller_name(controllers[domain] or "?")
        title = (
            f"gpugov plot: {source.name}, domain {_printable(domain)}, "
            f"controller {name} "
            f"({header.get('mode') or 'node'}"
            + (", dry run: no clock was set" if header.get("dry_run") else "")
            + f", {len(series[domain].time_s)} ticks)"
        )
        progress.update(done)
        write_run_plot(series[domain], target, title)
        done += len(series[domain].time_s)
        wrote(target)


def _ticks_of(rows: list[Any], domain: str) -> int:
    """How many of ``rows`` are ticks of ``domain`` (the ticks its figure draws)."""
    return sum(1 for row in rows if isinstance(row, dict) and row.get("domain") == domain)


def checked_header(source: Path, header: dict[str, Any]) -> dict[str, str | None]:
    """Each domain's recorded controller (None: not recorded) by name; a header replay
    refuses (:func:`gpugov.daemon.record_reader.check_header`, the one check both share) is a
    :class:`UsageError` naming the field."""
    from gpugov.daemon.cli_support import UsageError
    from gpugov.daemon.record import RecordingError
    from gpugov.daemon.record_reader import check_header

    try:
        _, domains = check_header(source, header)
    except RecordingError as error:
        raise UsageError(str(error)) from error
    return {name: info.get("controller") for name, info in domains.items()}


def checked_ticks(
    source: Path, rows: list[Any], domains: dict[str, Any], progress: Progress | None = None
) -> None:
    """Refuse (:class:`UsageError`, ``FILE:LINE:`` and the field) a tick replay would
    refuse (:func:`gpugov.daemon.record_reader.check_ticks`, shared), or a plotted number
    :func:`_check_plottable` refuses; ``progress`` counts the ticks checked."""
    from gpugov.daemon.cli_support import UsageError
    from gpugov.daemon.record import RecordingError
    from gpugov.daemon.record_reader import check_ticks

    checked = 0

    def plottable(where: str, row: dict[str, Any]) -> None:
        nonlocal checked
        checked += 1
        if progress is not None:
            progress.update(checked)
        for key in PLOTTED_FIELDS:
            _check_plottable(where, f"observation.{key}", row["observation"].get(key))
        for key in ("time_s", "requested_mhz", "power_cap_w"):
            _check_plottable(where, key, row.get(key))

    try:
        check_ticks(source, rows, domains, plottable)
    except RecordingError as error:
        raise UsageError(str(error)) from error


def _check_plottable(where: str, name: str, value: object) -> None:
    """Refuse a non-null ``value`` that is no finite number within :data:`PLOT_LIMIT`
    (an SLO: at least :data:`MIN_SLO_S`)."""
    from gpugov.daemon.cli_support import UsageError
    from gpugov.plant.input_files import finite_number

    if value is None:
        return
    number = finite_number(value)
    if number is None or abs(number) > PLOT_LIMIT:
        raise UsageError(
            f"{where} {name} must be a finite number within ±{PLOT_LIMIT:g} to plot, "
            f"got {value!r:.40}"
        )
    if name.endswith("_slo_s") and number < MIN_SLO_S:
        raise UsageError(f"{where} {name} must be at least {MIN_SLO_S:g} s, got {value!r:.40}")


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
