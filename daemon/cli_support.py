"""What every gpugov command shares: one usage error, the controller factory for simulated
runs, trace loading with one-line warnings, the metrics table, and one clear error line.
The checks of where a command's output goes are :mod:`daemon.cli_outputs`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import math
import os
import re
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpugov.controllers.budget import SLOTarget
from gpugov.controllers.contract import ControllerWrapper
from gpugov.daemon import cli_types, decide
from gpugov.daemon.addresses import engine_page_url, parse_address
from gpugov.daemon.config import ONLINE_PERIOD_S, default_control_period
from gpugov.daemon.controller_config import (
    ControllerConfig,
    FixedControllerConfig,
    OpenLoopControllerConfig,
)
from gpugov.daemon.controller_spec import (
    CONTROLLER_SPEC_HELP,
    parse_controller_spec,
    shown_spec,
    spec_name,
)
from gpugov.daemon.decide import ControllerContext
from gpugov.daemon.errors import ControllerError as GpugovControllerError
from gpugov.daemon.errors import ExitCode, error_lines, printable
from gpugov.daemon.limits import GPU_UUID_PATTERN, MAX_GPU_INDEX, MIN_PERIOD_S
from gpugov.daemon.log_lines import command_line, log_to_stderr, print_to_stderr
from gpugov.daemon.progress import Progress
from gpugov.daemon.safety import DEFAULT_DWELL_S, SafetySettings
from gpugov.plant import PerformanceProfile, ServingPlant, load_profile
from gpugov.plant.closed_loop import ControllerError as PlantControllerError
from gpugov.plant.profile import ProfileError
from gpugov.plant.result import ArrivalSeparation, arrival_separation
from gpugov.plant.types import Request, RequestRecord
from gpugov.plant.workload import (
    TraceError,
    TraceLoadReport,
    TraceProgress,
    TraceWarning,
    format_seconds,
    load_trace,
    resolve_trace,
)

CONTROLLER_HELP = CONTROLLER_SPEC_HELP


if TYPE_CHECKING:
    from gpugov.daemon.exporter import Exporter


class UsageError(ValueError):
    """A command-line value is invalid; the message names the flag."""


def simulated_controller(
    spec: str,
    plant: ServingPlant,
    workload: Sequence[Request],
    control_period_s: float = 1.0,
    *,
    safety: SafetySettings | None = None,
    slo_target: SLOTarget | None = None,
) -> ControllerWrapper:
    """The controller a ``--controller`` spec such as ``fixed:1410`` or ``mpc`` asks for,
    for a simulated run: built by the node's factory (:func:`daemon.decide.build_controller`)
    in the node's safety chain, with the run's plant, the workload's forecasts declared
    before the run, the domain's ``slo_target`` and virtual time, exactly as
    ``gpugov run --simulate --virtual``.
    """
    config = _parsed_for_profile(spec, plant.profile, plant.profile.name)
    context = ControllerContext.for_plant(
        plant, workload, period_s=control_period_s, safety=safety, slo_target=slo_target
    )
    try:
        return decide.build_controller(config, context)
    except GpugovControllerError as error:
        raise UsageError(f"--controller {shown_spec(spec)}: {error}") from error


def checked_controller_flag(
    text: str, profile: PerformanceProfile, *, default_profile: str | None = None
) -> ControllerConfig:
    """A ``--controller`` value checked against the run's ``profile`` before a simulated
    run reads its trace (a large one takes a minute): parsed, a ``fixed:MHZ`` within the
    profile's clocks, an ``open-loop`` plan file read and checked; each refusal is one
    :class:`UsageError` line naming the flag. ``default_profile``: the spec's profile
    where it names none (default the profile's name)."""
    config = _parsed_for_profile(text, profile, default_profile or profile.name)
    check_simulated_cap(config, profile, text)
    if isinstance(config, OpenLoopControllerConfig):
        from gpugov.controllers.open_loop import PlanFormatError, load_plan

        try:
            load_plan(config.plan, min_period_s=MIN_PERIOD_S)
        except PlanFormatError as error:
            raise UsageError(f"--controller {shown_spec(text)}: {error}") from error
    return config


def _parsed_for_profile(
    text: str, profile: PerformanceProfile, default_profile: str
) -> ControllerConfig:
    """A ``--controller`` value parsed, a ``fixed:MHZ`` checked within ``profile``'s
    clocks; each refusal one :class:`UsageError` line naming the flag."""
    config = parse_controller_flag(text, default_profile=default_profile)
    check_fixed_clock(config, profile.minimum_clock_mhz, profile.maximum_clock_mhz, text)
    return config


def parse_controller_flag(text: str, *, default_profile: str | None = None) -> ControllerConfig:
    """A ``--controller`` value parsed (:func:`parse_controller_spec`), or a
    :class:`UsageError` in one line that names the flag."""
    try:
        return parse_controller_spec(text, default_profile=default_profile)
    except ValueError as error:
        message = str(error)
        raise UsageError(
            message if message.startswith("--controller") else f"--controller: {message}"
        ) from error


def controller_label(spec: str) -> str:
    """The one name of a ``--controller`` spec for titles and JSON (``mpc:h200-...`` ->
    ``mpc``; ``fixed:1410.0`` -> ``fixed:1410``); the spec itself when it does not parse."""
    try:
        return spec_name(parse_controller_spec(spec))
    except ValueError:
        return spec


def check_simulated_cap(config: object, profile: PerformanceProfile, spec: str) -> None:
    """Refuse a ``power-cap:W`` (or a ``power-profile`` ``cap_w``) below the lowest power
    limit the simulated GPUs accept together (a tenth of the profile's ``power_limit_w``,
    :data:`~daemon.simulated.SIMULATED_LOWEST_LIMIT_SHARE`), as a node refuses a
    configured ``cap_w`` below its GPUs' lowest (:func:`~daemon.power_budget.check_configured_cap`)
    rather than clamping it."""
    from gpugov.daemon.simulated import SIMULATED_LOWEST_LIMIT_SHARE
    from gpugov.plant.plant import board_power_limit_w

    cap_w = getattr(config, "cap_w", None)
    if cap_w is None:
        return
    board_w = board_power_limit_w(profile)
    lowest_w = SIMULATED_LOWEST_LIMIT_SHARE * board_w
    if cap_w < lowest_w - 1e-9:
        raise UsageError(
            f"--controller {shown_spec(spec)}: cap_w ({cap_w:g} W) is below the lowest power "
            f"limit the simulated GPUs accept ({lowest_w:g} W, a tenth of the profile's "
            f"power_limit_w {board_w:g} W), as NVML refuses a limit below its lowest"
        )


def check_fixed_clock(config: object, low_mhz: float, high_mhz: float, spec: str) -> None:
    """Refuse ``fixed:MHZ`` outside the supported range ``[low, high]`` (rather than
    clamping it silently)."""
    if isinstance(config, FixedControllerConfig) and not (low_mhz <= config.clock_mhz <= high_mhz):
        raise UsageError(
            f"--controller {shown_spec(spec)}: outside the supported range "
            f"{low_mhz:g}-{high_mhz:g} MHz"
        )


def check_engine_url(url: str, *, flag: str = "--engine-url") -> None:
    """Refuse an engine URL the config's ``engine.url`` refuses
    (:func:`daemon.addresses.engine_page_url`), in one line naming ``flag``."""
    try:
        engine_page_url(url)
    except ValueError as error:
        raise UsageError(f"{flag}: {error}") from None


TRACE_PROGRESS_AFTER_S = 2.0
"""A trace load shows its progress line once it has taken this long: a large file (the
bundled and shared traces load in well under a second)."""


@contextlib.contextmanager
def trace_progress(
    trace: str | Path,
    *,
    enabled: bool = True,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[TraceProgress | None]:
    """An ``on_progress`` callback for ``load_trace(trace)``: a :class:`Progress` line in MB
    of the file, with an ETA, once the load has taken :data:`TRACE_PROGRESS_AFTER_S`
    (nothing for a quick one); ``None`` when not ``enabled`` or the file cannot be sized
    (the load then names the problem). A Ctrl-C noted during the load is raised at the
    next report."""
    if not enabled:
        yield None
        return
    try:
        path = resolve_trace(trace)
        megabytes = os.stat(path).st_size / 1e6
    except (TraceError, OSError, ValueError):
        yield None
        return
    bar = Progress(
        megabytes,
        f"reading trace {path.name}",
        unit="MB",
        stream=stream,
        clock=clock,
        quiet_start_s=TRACE_PROGRESS_AFTER_S,
    )
    try:
        yield lambda fraction: bar.update(fraction * megabytes)
    except Exception:
        bar.close()  # a shown line ends where the load stopped, before the error's line
        raise
    bar.close()


def window_past_end_note(report: TraceLoadReport) -> str | None:
    """A line saying a ``--start``/``--duration`` window runs past the trace's last arrival
    (a 2 s trace under ``--duration 3600``), so a run covers less than the window asked
    for: it ends once the window's requests finish, and its energy is that of those
    seconds, not of the window's; None when the window ends within the trace."""
    if report.duration_s is None or report.start_s + report.duration_s <= report.span_s:
        return None
    end = report.start_s + report.duration_s
    return (
        f"{Path(report.path).name}: the window from {format_seconds(report.start_s)} s to "
        f"{format_seconds(end)} s runs past the trace's last arrival at "
        f"{format_seconds(report.span_s)} s: it holds {report.requests} request(s), and a "
        "run ends once they finish"
    )


def load_trace_for_cli(
    trace: str,
    *,
    progress: bool = True,
    format_flag: str | None = None,
    keep_stamps_flag: str | None = "--keep-batched-stamps",
    **options: Any,
) -> tuple[tuple[Request, ...], TraceLoadReport]:
    """``load_trace`` with its warnings (skipped zero-token rows) as one stderr line each,
    after a progress line on stderr while a large file loads (unless not ``progress``).
    ``format_flag``: the command's flag that names the trace's format (``simulate``'s
    ``--trace-format``), offered where a header matches several formats;
    ``keep_stamps_flag``: its flag that keeps batched stamps as written, named in the note
    that they were spread (None for a command without one: sweep, experiments, bench)."""
    with (
        warnings.catch_warnings(record=True) as caught,
        trace_progress(trace, enabled=progress) as on_progress,
    ):
        warnings.simplefilter("always", TraceWarning)
        try:
            result = load_trace(trace, on_progress=on_progress, **options)
        except TraceError as error:
            if format_flag is None or not error.formats:
                raise
            choices = " or ".join(f"{format_flag} {fmt}" for fmt in error.formats)
            raise TraceError(f"{error}, or choose one: {choices}", formats=error.formats) from None
    for warning in caught:
        if issubclass(warning.category, TraceWarning):
            warn(str(warning.message))
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    if result[1].batch_grid_s is not None:
        keep = f" ({keep_stamps_flag} replays the stamps as written)" if keep_stamps_flag else ""
        note(
            f"{Path(result[1].path).name} stamps arrivals on a "
            f"{result[1].batch_grid_s:g} s grid; each batch is spread over its step{keep}"
        )
    return result


def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def format_summary(metrics: dict[str, Any], title: str = "") -> str:
    """The short metrics table printed by ``simulate`` and the simulated daemon."""
    rows = [
        ("energy", _fmt(metrics["energy_j"] / 1000.0, " kJ", 2)),
        ("energy per output token", _fmt(metrics["energy_per_output_token_j"], " J", 4)),
        ("mean power", _fmt(metrics["mean_power_w"], " W", 1)),
        (
            "TTFT p50 / p95 / p99",
            " / ".join(_fmt(metrics[k], " s") for k in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s")),
        ),
        (
            "TPOT p50 / p95 / p99",
            " / ".join(
                _fmt(metrics[k] * 1000 if metrics[k] is not None else None, " ms", 1)
                for k in ("tpot_p50_s", "tpot_p95_s", "tpot_p99_s")
            ),
        ),
        (
            "SLO attainment",
            _fmt(
                metrics["slo_attainment"] * 100 if metrics["slo_attainment"] is not None else None,
                " %",
                2,
            ),
        ),
        (
            "SLOs (TTFT / TPOT)",
            f"{metrics['ttft_slo_s']:g} s"
            + (
                f" + {metrics['ttft_slo_per_prompt_token_s'] * 1e6:g} us/prompt token"
                if metrics.get("ttft_slo_per_prompt_token_s")
                else ""
            )
            + f" / {metrics['tpot_slo_s'] * 1000:g} ms",
        ),
        (
            "requests completed / arrived",
            f"{metrics['completed_requests']} / {metrics['arrived_requests']}"
            f" ({metrics['censored_requests']} censored)",
        ),
        ("output tokens", str(metrics["output_tokens"])),
        ("simulated time", _fmt(metrics["simulated_duration_s"], " s", 1)),
        (
            "board-limit / thermal violation",
            f"{metrics['power_cap_violation_s']:.2f} s / {metrics['thermal_violation_s']:.2f} s",
        ),
        (
            "over the requested power cap",
            "no cap set"
            if metrics.get("cap_overshoot_s") is None
            else f"{metrics['cap_overshoot_s']:.2f} s",
        ),
        ("peak temperature", _fmt(metrics["peak_temperature_c"], " C", 1)),
        ("clock changes", str(metrics["clock_changes"])),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [printable(title)] if title else []  # a profile's and a trace's file names
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


MAX_SIMULATED_DAYS = 7.0
"""Longest window ``simulate`` and ``run --simulate`` accept, in simulated days (a trace
with an arrival at 1e308 s, or ``--load-scale 1e-6``, would otherwise never end)."""


def hidden_alias(
    parser: argparse.ArgumentParser, old: str, dest: str, kind: Callable[[str], Any]
) -> None:
    """Accept ``old`` as a deprecated spelling of the flag stored in ``dest``, unlisted
    in ``--help`` (one flag name per concept; scripts using the old name keep working)."""
    parser.add_argument(
        old, dest=dest, type=kind, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


def warn(message: str) -> None:
    """Print one warning line on stderr, its control characters escaped as :func:`fail`
    escapes them."""
    print(command_line("warning", message), file=sys.stderr)


def wrote(path: object) -> None:
    """Print the ``wrote PATH`` line on stdout, escaped as :func:`warn` escapes: a file
    name with a newline stays one line, and an escape sequence never reaches the terminal."""
    print(printable(f"wrote {path}"))


def note(message: str) -> None:
    """Print one note line on stderr (``gpugov: note: ...``), escaped as :func:`warn`."""
    print(command_line("note", message), file=sys.stderr)


def require_nonnegative(flag: str, value: float | None) -> None:
    """Raise :class:`UsageError` naming ``flag`` unless ``value`` is None or finite >= 0."""
    if value is not None and (not math.isfinite(value) or value < 0):
        raise UsageError(f"{flag} must be finite and >= 0, got {value!r}")


def load_profile_for_cli(
    flag: str, name: str, *, load: Callable[[str], PerformanceProfile] = load_profile
) -> PerformanceProfile:
    """``load(name)`` (:func:`load_profile`; a command that takes generated shapes passes
    its resolver, whose refusal lists them), its refusal one line naming ``flag``: made
    before a command reads its trace, so a mistyped name is not found only after a long
    read."""
    try:
        return load(name)
    except ProfileError as error:
        raise UsageError(f"{flag}: {error}") from None


def check_workload_fits(workload: Sequence[Request], plant: ServingPlant, trace: str) -> None:
    """Refuse a workload the plant cannot run: a request larger than the KV cache, or
    a window longer than :data:`MAX_SIMULATED_DAYS` (it would not end in reasonable time).
    """
    check_kv_fits(workload, plant, trace)
    if workload:
        check_window_span(workload[-1].arrival_time_s, trace)


def check_kv_fits(workload: Sequence[Request], plant: ServingPlant, trace: str) -> None:
    """Refuse a workload with a request larger than the plant's KV cache (the first one
    and how many more), whatever its load: a load moves arrivals only."""
    capacity = plant.kv_capacity_tokens
    oversized = [r for r in workload if r.prompt_tokens + r.output_tokens > capacity]
    if oversized:
        # The id is the 0-based index of the trace's data row (the row a user looks for),
        # and a trace with one such row often has more: say how many.
        first = oversized[0]
        more = (
            f" (and {len(oversized) - 1:,} more of the window's {len(workload):,} requests)"
            if len(oversized) > 1
            else ""
        )
        raise UsageError(
            f"--trace {trace}: request {first.request_id} (data row {first.request_id + 1}) "
            f"needs {first.prompt_tokens} + {first.output_tokens} KV tokens, more than the "
            f"profile's KV capacity of {capacity} tokens{more}"
        )


def check_window_span(
    span_s: float,
    trace: str,
    remedy: str = "choose a shorter --duration or a larger --load-scale",
) -> None:
    """Refuse a window whose last arrival (``span_s``, scaled by its load) lies past
    :data:`MAX_SIMULATED_DAYS`; ``remedy`` names what to change in the caller's terms (a
    sweep grid's keys, not flags it does not take)."""
    if not math.isfinite(span_s) or span_s > MAX_SIMULATED_DAYS * 86_400.0:
        raise UsageError(
            f"--trace {trace}: the window spans {format_seconds(span_s)} simulated seconds, "
            f"over the limit of {MAX_SIMULATED_DAYS:g} simulated days; {remedy}"
        )


def light_load_note(
    records: Sequence[RequestRecord], separation: ArrivalSeparation | None = None
) -> str | None:
    """The one line ``simulate`` and ``run --simulate`` print when every request finished
    before the next arrival time: a smaller ``--load-scale`` then shortens no queue, it
    only lengthens idle gaps (see :class:`gpugov.plant.result.ArrivalSeparation`).
    ``separation``: ``arrival_separation(records)`` when the caller has it already."""
    if separation is None:
        separation = arrival_separation(records)
    if not separation.separated or separation.arrival_times < 2:
        return None
    return (
        f"note: every request finished before the next arrival time ({len(records)} "
        f"requests at {separation.arrival_times} arrival times, up to "
        f"{separation.largest_group} at once): none queued behind an earlier arrival, so "
        "a smaller --load-scale only lengthens the idle gaps (this window's light-load floor)"
    )


def require_positive(flag: str, value: float | None) -> None:
    """Raise :class:`UsageError` naming ``flag`` unless ``value`` is None or positive."""
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise UsageError(f"{flag} must be positive, got {value!r}")


#: Optional module -> the extra that installs it (pyproject's optional-dependencies).
EXTRAS = {"matplotlib": "plots", "sklearn": "study"}


def require_extra(module: str, needed_for: str) -> None:
    """Import ``module`` now, or raise one :class:`UsageError` line naming the extra.

    Commands call it before any work, so a missing optional dependency costs nothing:
    e.g. ``simulate --plot needs matplotlib, which is not installed: pip install
    'gpugov[plots]'``.

    Raises:
        UsageError: the module (an optional dependency in :data:`EXTRAS`) is missing.
    """
    require_extras(needed_for, module)


def require_extras(needed_for: str, *modules: str) -> None:
    """:func:`require_extra` for several modules at once: one line names every missing
    one and the extras that bring them (``pip install 'gpugov[study,plots]'``), so a user
    is not sent back once per extra.

    Raises:
        UsageError: one or more of the modules are missing.
    """
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        extras = ",".join(dict.fromkeys(EXTRAS.get(module, module) for module in missing))
        verb = "is" if len(missing) == 1 else "are"
        raise UsageError(
            f"{needed_for} needs {' and '.join(missing)}, which {verb} not installed: "
            f"pip install 'gpugov[{extras}]'"
        )


INPUT_ERRORS = (UsageError, TraceError, ProfileError)

CONTROLLER_ERRORS = (PlantControllerError, GpugovControllerError)
"""A controller that raised while a run decided (the plant's error names it and the
simulated time) or could not be built: one line and exit 1 at the command line."""


def fail(message: str | BaseException, code: int = ExitCode.USAGE) -> int:
    """Print one clear error line (``gpugov: error: ...``) and return ``code``: the one
    error printer of every command. A control character in it (a file name's newline or
    escape sequence) is escaped (:func:`~gpugov.daemon.errors.printable`), so the line
    stays one; a config error with several problems prints each on a line of its own
    (:func:`~gpugov.daemon.errors.error_lines`)."""
    first, *more = error_lines(message)
    print_to_stderr(command_line("error", first))
    for line in more:
        print_to_stderr(printable(line))
    return int(code)


def parse_gpu_list(
    text: str, *, flag: str = "--gpus", allow_all: bool = False
) -> list[int | str] | None:
    """A ``--gpus`` value: NVML indices or ``GPU-``/``MIG-`` UUIDs separated by commas,
    or ``all`` (None) where ``allow_all``.

    Raises:
        UsageError: naming the flag and the bad entry, or a GPU named twice.
    """
    if allow_all and text.strip() == "all":
        return None
    expected = "'all' or " if allow_all else ""
    out: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        # ASCII digits only: str.isdigit() is true of '²', which int() refuses (a traceback),
        # and of other scripts' digits, which int() reads.
        digits = part.isascii() and part.isdigit()
        if digits and len(part) <= 4 and int(part) <= MAX_GPU_INDEX:
            out.append(int(part))
        elif digits:
            raise UsageError(f"{flag}: GPU index {part[:20]} is over {MAX_GPU_INDEX}")
        elif re.fullmatch(GPU_UUID_PATTERN, part):  # as NVML prints one, as the config's
            out.append(part)
        else:
            raise UsageError(
                f"{flag} takes {expected}indices or GPU-/MIG- UUIDs separated by commas, "
                f"got {part!r:.80}"
            )
        if out[-1] in out[:-1]:  # reset-clocks --gpus 0,0 reset GPU 0 twice
            raise UsageError(f"{flag}: GPU {out[-1]} is named twice")
    return out


DEFAULT_SLO_TARGET = 0.99
"""A simulated run's SLO target, as the example config states it: 99 % of the requests
meet both SLOs over :data:`SLO_TARGET_WINDOW_S`."""
SLO_TARGET_WINDOW_S = 600.0
"""The rolling window ``--slo-target`` counts requests over (the config's default)."""


def slo_target_of(attainment: float | None) -> SLOTarget | None:
    """``--slo-target``'s :class:`~gpugov.controllers.budget.SLOTarget` (None: none),
    as a domain's ``[domains.slo_target]`` gives it."""
    from gpugov.daemon.config import SLOTargetConfig

    if attainment is None:
        return None
    return SLOTargetConfig(attainment=attainment, window_s=SLO_TARGET_WINDOW_S).target()


def check_slo_target_period(
    attainment: float | None, period_s: float, flags: str = "--slo-target, --control-period"
) -> None:
    """Refuse in one line (:class:`UsageError` naming ``flags``) an SLO target whose
    window (:data:`SLO_TARGET_WINDOW_S`) spans fewer control periods than a config
    allows (``slo_target.window_s`` at least 12 x ``daemon.period_s``), so that a study
    runs no target a node would refuse."""
    from gpugov.daemon.config import SLO_WINDOW_PERIODS, short_of

    if attainment is None or not short_of(SLO_TARGET_WINDOW_S, SLO_WINDOW_PERIODS * period_s):
        return
    raise UsageError(
        f"{flags}: an SLO target counts the requests over {SLO_TARGET_WINDOW_S:g} s, which "
        f"must span at least {SLO_WINDOW_PERIODS:g} control periods, as a config's "
        f"slo_target.window_s must (a control period of at most "
        f"{SLO_TARGET_WINDOW_S / SLO_WINDOW_PERIODS:g} s, got {period_s:g} s), or none"
    )


def control_period_of(period_s: float | None, spec: str) -> float:
    """``--control-period``'s value, or, unset, the period a node runs ``spec``'s
    controller at with ``daemon.period_s`` unset (0.25 s for ``mpc-online``, 1 s for the
    others: :func:`daemon.config.default_control_period`)."""
    if period_s is not None:
        return float(period_s)
    return default_control_period(parse_controller_flag(spec).kind)


def add_decision_arguments(
    parser: argparse.ArgumentParser, *, prefix: str = "", node_note: str = ""
) -> None:
    """``--control-period`` and ``--slo-target``: how often a simulated run's controller
    decides and the SLO target it is given, unset as a node's example config runs it."""
    parser.add_argument(
        "--control-period",
        type=cli_types.period,
        default=None,
        metavar="S",
        help=f"{prefix}seconds between decisions ({node_note}default {ONLINE_PERIOD_S:g} for "
        "mpc-online, 1 for the others)",
    )
    parser.add_argument(
        "--slo-target",
        type=cli_types.slo_target,
        default=DEFAULT_SLO_TARGET,
        metavar="SHARE|none",
        help=f"{prefix}the share of requests meeting both SLOs over {SLO_TARGET_WINDOW_S:g} s "
        "(a domain's [domains.slo_target]); mpc and mpc-online spend the misses it allows, "
        f"'none' holds fixed margins (default {DEFAULT_SLO_TARGET:g})",
    )


def add_engine_view_argument(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """``--engine-view``: what the simulated engine publishes to the controller."""
    from gpugov.daemon.simulated import ENGINE_VIEWS

    parser.add_argument(
        "--engine-view",
        choices=ENGINE_VIEWS,
        default="vllm",
        help=f"{prefix}what the controller observes: vllm, what a vLLM node's daemon derives "
        "from the engine's metrics page (default), or exact, the simulator's exact state",
    )


def add_safety_arguments(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """``--dwell`` and ``--floor``: the safety chain a simulated run's controller runs in,
    with a node's defaults (``safety.dwell_s`` and ``safety.floor_mhz``)."""
    parser.add_argument(
        "--dwell",
        type=cli_types.dwell,
        default=None,
        metavar="S",
        help=f"{prefix}hold a clock at least S seconds before lowering it "
        f"(the node's safety.dwell_s; default {DEFAULT_DWELL_S:g})",
    )
    parser.add_argument(
        "--floor",
        type=cli_types.clock_mhz,
        default=None,
        metavar="MHZ",
        help=f"{prefix}never lock below MHZ (the node's safety.floor_mhz; default none)",
    )


def safety_from_args(args: argparse.Namespace, clocks_mhz: Iterable[float]) -> SafetySettings:
    """The safety settings of ``--dwell`` and ``--floor``, checked against the clocks.

    Raises:
        UsageError: naming the flag.
    """
    require_nonnegative("--dwell", args.dwell)
    require_positive("--floor", args.floor)
    clocks = [float(c) for c in clocks_mhz]
    if args.floor is not None and clocks and args.floor > max(clocks):
        raise UsageError(
            f"--floor {args.floor:g}: above the top supported clock ({max(clocks):g} MHz)"
        )
    return SafetySettings(
        floor_mhz=args.floor,
        dwell_s=DEFAULT_DWELL_S if args.dwell is None else float(args.dwell),
    )


def setup_logging(level: str) -> None:
    """Log lines to stderr at ``level`` (a node command's ``--log-level``), each record
    one escaped, bounded line (:class:`~gpugov.daemon.log_lines.LineFormatter`)."""
    log_to_stderr(getattr(logging, level.upper(), logging.INFO))


def check_metrics_address(address: str | None, name: str = "--metrics-address") -> None:
    """Refuse, before any GPU is opened, an address ``run`` could not serve ``/metrics``
    on (malformed, a host that does not resolve, a port that cannot be bound); ``name``
    is where it was given (the flag, or ``FILE: daemon.metrics_address``).

    Raises:
        UsageError: one line naming ``name`` and the address.
    """
    if not address or address.lower() == "none":
        return
    try:
        host, port = parse_address(address)
    except ValueError as error:
        raise UsageError(f"{name} {error}") from error
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter
            probe.bind((host, port))
    except (OSError, UnicodeError) as error:  # socket.gaierror is an OSError
        reason = getattr(error, "strerror", None) or str(error)
        if name == "--metrics-address":
            raise UsageError(
                f"cannot serve metrics on {address}: {reason}; "
                "pick another --metrics-address (or 'none')"
            ) from error
        raise UsageError(
            f'{name}: cannot serve metrics on {address}: {reason}; pick another (or "" for none)'
        ) from error


def metrics_exporter(address: str | None) -> Exporter | None:
    """The Prometheus exporter on ``address`` (None for ``none`` or no address).

    Raises:
        UsageError: the address is malformed or cannot be bound.
    """
    from gpugov.daemon.exporter import Exporter

    if not address or address.lower() == "none":
        return None
    try:
        host, port = parse_address(address)
    except ValueError as error:
        raise UsageError(f"--metrics-address {error}") from error
    if host in ("0.0.0.0", "::", "*"):
        warn(
            f"metrics address {address} exposes /metrics on every network interface; "
            "use 127.0.0.1 or one interface's address unless that is intended"
        )
    try:
        return Exporter(host, port)
    except OSError as error:
        raise UsageError(
            f"cannot serve metrics on {address}: {error.strerror or error}; "
            "pick another --metrics-address (or 'none')"
        ) from error
