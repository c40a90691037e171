"""Typed argparse converters: the one rule for every number a command-line flag takes.

Each converter parses a flag's text and checks its range, so a bad value is refused by
the parser before any work, in one line naming the flag (``argument --seed: must be an
integer in [0, 4294967295], got '-1'``). NaN and infinities are never accepted; every
count has an upper bound and every period the config's bounds
(:data:`gpugov.daemon.limits.MIN_PERIOD_S`). Light to import: command modules use these
when they register their flags.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
from collections.abc import Callable

from gpugov.daemon.limits import (
    MAX_CLOCK_MHZ,
    MAX_COUNT,
    MAX_LATENCY_NOISE,
    MAX_LOAD_SCALE,
    MAX_PERIOD_S,
    MAX_SECONDS,
    MAX_SEED,
    MAX_SPEED,
    MIN_PERIOD_S,
)
from gpugov.plant.input_files import plain_float, plain_number_text


def _float(text: str) -> float:
    """``text`` as a finite float, or one ArgumentTypeError."""
    try:
        value = plain_float(text)  # float() took --duration 1_0 as 10 s
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _int(text: str) -> int:
    """``text`` as a decimal integer, or one ArgumentTypeError."""
    try:
        if not plain_number_text(text):
            raise ValueError(text)
        return int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None


def _range(low: float, high: float, low_open: bool, high_open: bool) -> str:
    """``[0, 1)``, ``(0, 60]`` and so on; ``> 0`` for an open-ended range."""
    if math.isinf(high):
        return f"{'>' if low_open else '>='} {low:g}"
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def float_in(
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    name: str = "number",
) -> Callable[[str], float]:
    """A converter to a finite float in the range from ``low`` to ``high`` (each end
    closed unless ``*_open``)."""
    span = _range(low, high, low_open, high_open)
    span = span if span.startswith((">", "<")) else f"in {span}"

    def convert(text: str) -> float:
        value = _float(text)
        below = value <= low if low_open else value < low
        above = value >= high if high_open else value > high
        if below or above:
            raise argparse.ArgumentTypeError(f"must be a {name} {span}, got {text!r}")
        return value

    convert.__name__ = name.replace(" ", "_")
    return convert


def int_in(low: int, high: int, *, name: str = "integer") -> Callable[[str], int]:
    """A converter to an integer in ``[low, high]``."""

    def convert(text: str) -> int:
        value = _int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be an {name} in [{low}, {high}], got {text[:40]!r}"
            )
        return value

    convert.__name__ = name.replace(" ", "_")
    return convert


nonnegative_int = int_in(0, MAX_COUNT)
"""A count that may be 0 (``--show``)."""
positive_int = int_in(1, MAX_COUNT)
"""A count of at least 1 (``--stride``, ``--max-model-len``)."""
seed = int_in(0, MAX_SEED)
"""A seed in ``[0, 2**32)`` (numpy's generators take no other)."""
positive_float = float_in(0.0, low_open=True)
"""A finite number > 0 (an SLO, a timeout)."""
nonnegative_float = float_in(0.0)
"""A finite number >= 0 (a dwell)."""
fraction = float_in(0.0, 1.0, high_open=True, name="fraction")
"""A fraction in ``[0, 1)``."""
period = float_in(MIN_PERIOD_S, MAX_PERIOD_S, name="period in seconds")
"""A control period within the config's bounds of ``daemon.period_s``."""
duration = float_in(0.0, MAX_SECONDS, low_open=True, name="duration in seconds")
"""A positive length of time in seconds (ten years at most)."""
scaled_duration = float_in(MIN_PERIOD_S, MAX_SECONDS, name="duration in seconds")
"""The length of a trace window that a command scales to a load (``bench controllers``,
``fleet --duration``): at least one shortest control period. A window some 1e-160 s long
scaled to its load (about its length squared over its work) was 0 s, or its capacity's
inverse infinite, and the run ended in a traceback; and a window shorter than one
decision compares no controllers."""
offset = float_in(0.0, MAX_SECONDS, name="time in seconds")
"""A non-negative time offset in seconds (a window's start)."""
speed = float_in(0.0, MAX_SPEED, low_open=True, name="speed")
"""A pace in plant seconds per wall second."""
load_scale = float_in(0.0, MAX_LOAD_SCALE, low_open=True, name="multiplier")
"""An arrival-rate multiplier."""
latency_noise = float_in(0.0, MAX_LATENCY_NOISE, high_open=True, name="coefficient of variation")
"""The plant's iteration-time jitter (a coefficient of variation)."""
dwell = float_in(0.0, MAX_SECONDS, name="time in seconds")
"""A hold time in seconds (the safety chain's dwell; 0 allowed)."""
clock_mhz = float_in(0.0, MAX_CLOCK_MHZ, low_open=True, name="clock in MHz")
"""A clock in MHz (a floor)."""
attainment = float_in(0.0, 1.0, low_open=True, high_open=True, name="share")
"""An SLO attainment target in ``(0, 1)`` (``0.99``: 99 % of the requests meet both SLOs)."""


def slo_target(text: str) -> float | None:
    """``--slo-target``: an attainment in ``(0, 1)``, or ``none`` (no target)."""
    return None if text.strip().lower() == "none" else attainment(text)


def count(low: int, high: int) -> Callable[[str], int]:
    """A bounded count such as ``--gpus`` (``[low, high]``)."""
    return int_in(low, high)


__all__ = [
    "attainment",
    "clock_mhz",
    "count",
    "duration",
    "dwell",
    "float_in",
    "fraction",
    "int_in",
    "latency_noise",
    "load_scale",
    "nonnegative_float",
    "nonnegative_int",
    "offset",
    "period",
    "positive_float",
    "positive_int",
    "seed",
    "slo_target",
    "speed",
]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost`` (an address only this machine reaches)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
