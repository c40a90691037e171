"""What every gpugov command shares: one usage error, the controller factory for simulated
runs, trace loading with one-line warnings, the metrics table, and one clear error line."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from gpugov.daemon import decide
from gpugov.daemon.config import (
    FixedControllerConfig,
    MPCControllerConfig,
    OnlineMPCControllerConfig,
)
from gpugov.daemon.decide import CONTROLLER_SPEC_HELP, parse_controller_spec
from gpugov.daemon.errors import ControllerError as GpugovControllerError
from gpugov.daemon.service import simulated_mpc, with_workload_forecasts
from gpugov.plant import ServingPlant
from gpugov.plant.profile import ProfileError
from gpugov.plant.types import ClockController, Request
from gpugov.plant.workload import (
    TraceError,
    TraceLoadReport,
    TraceWarning,
    load_trace,
)

DEFAULT_PROFILE = "h100-sxm-llama3-8b"
CONTROLLER_HELP = CONTROLLER_SPEC_HELP


class UsageError(ValueError):
    """A command-line value is invalid; the message names the flag."""


def build_controller(
    spec: str, plant: ServingPlant, workload: Sequence[Request], control_period_s: float = 1.0
) -> ClockController:
    """Build a controller from a ``--controller`` spec such as ``fixed:1410`` or ``mpc``.

    The same parser and factory as ``gpugov run``; the MPC plans on the run's plant with
    the workload's mean prompt and output lengths as declared forecasts, fixed before the
    run, exactly as ``gpugov run --simulate`` does.
    """
    try:
        config = parse_controller_spec(spec, default_profile=plant.profile.name)
    except ValueError as error:
        message = str(error)
        raise UsageError(
            message if message.startswith("--controller") else f"--controller: {message}"
        ) from error
    if isinstance(config, FixedControllerConfig):
        profile = plant.profile
        if not profile.minimum_clock_mhz <= config.clock_mhz <= profile.maximum_clock_mhz:
            raise UsageError(
                f"--controller {spec}: outside the profile's supported range "
                f"{profile.minimum_clock_mhz:g}-{profile.maximum_clock_mhz:g} MHz"
            )
    if isinstance(config, MPCControllerConfig):
        return simulated_mpc(config, plant, workload, control_period_s)
    if isinstance(config, OnlineMPCControllerConfig):
        # Declared forecasts from the workload, as for the MPC; never the plant's profile.
        config = with_workload_forecasts(config, workload)
    try:
        return decide.build_controller(config, period_s=control_period_s)
    except GpugovControllerError as error:
        raise UsageError(f"--controller {spec}: {error}") from error


def load_trace_for_cli(
    trace: str, **options: Any
) -> tuple[tuple[Request, ...], TraceLoadReport]:
    """``load_trace`` with its warnings (skipped zero-token rows) as one stderr line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        result = load_trace(trace, **options)
    for warning in caught:
        if issubclass(warning.category, TraceWarning):
            print(f"gpugov: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
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
        ("TTFT p50 / p95 / p99", " / ".join(
            _fmt(metrics[k], " s") for k in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s"))),
        ("TPOT p50 / p95 / p99", " / ".join(
            _fmt(metrics[k] * 1000 if metrics[k] is not None else None, " ms", 1)
            for k in ("tpot_p50_s", "tpot_p95_s", "tpot_p99_s"))),
        ("SLO attainment", _fmt(
            metrics["slo_attainment"] * 100 if metrics["slo_attainment"] is not None else None,
            " %", 2)),
        ("SLOs (TTFT / TPOT)",
         f"{metrics['ttft_slo_s']:g} s / {metrics['tpot_slo_s'] * 1000:g} ms"),
        ("requests completed / arrived",
         f"{metrics['completed_requests']} / {metrics['arrived_requests']}"
         f" ({metrics['censored_requests']} censored)"),
        ("output tokens", str(metrics["output_tokens"])),
        ("simulated time", _fmt(metrics["simulated_duration_s"], " s", 1)),
        ("power-cap / thermal violation", f"{metrics['power_cap_violation_s']:.2f} s / "
                                          f"{metrics['thermal_violation_s']:.2f} s"),
        ("peak temperature", _fmt(metrics["peak_temperature_c"], " C", 1)),
        ("clock changes", str(metrics["clock_changes"])),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [title] if title else []
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def require_positive(flag: str, value: float | None) -> None:
    """Raise :class:`UsageError` naming ``flag`` unless ``value`` is None or positive."""
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise UsageError(f"{flag} must be positive, got {value!r}")


INPUT_ERRORS = (UsageError, TraceError, ProfileError)


def fail(message: str) -> int:
    """Print one clear error line and return the usage-error exit code."""
    print(f"gpugov: error: {message}", file=sys.stderr)
    return 2
