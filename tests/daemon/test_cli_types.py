"""The typed argparse converters: one rule per kind of number, the config's period bounds."""

from __future__ import annotations

import argparse
import math

import pytest

from gpugov.daemon import cli_types
from gpugov.daemon.config import DaemonSection
from gpugov.daemon.limits import MAX_PERIOD_S, MIN_PERIOD_S

BAD_EVERYWHERE = ["", "x", "nan", "inf", "-inf", "1e999", "0x10"]


@pytest.mark.parametrize(
    ("convert", "good", "bad"),
    [
        (cli_types.nonnegative_int, {"0": 0, "7": 7}, ["-1", "1.5", "1" + "0" * 30]),
        (cli_types.positive_int, {"1": 1}, ["0", "-3"]),
        (cli_types.seed, {"0": 0, "4294967295": 2**32 - 1}, ["-1", "4294967296"]),
        (cli_types.positive_float, {"0.5": 0.5, "1e3": 1e3}, ["0", "-0.1"]),
        (cli_types.nonnegative_float, {"0": 0.0}, ["-1e-9"]),
        (cli_types.fraction, {"0": 0.0, "0.99": 0.99}, ["1", "-0.1"]),
        (cli_types.period, {"0.05": 0.05, "60": 60.0}, ["1e-9", "0.049", "61"]),
        (cli_types.latency_noise, {"0": 0.0, "0.99": 0.99}, ["1", "1e6", "-1"]),
        (cli_types.offset, {"0": 0.0}, ["-5", "1e308"]),
        (cli_types.duration, {"1": 1.0}, ["0", "1e308"]),
        (cli_types.scaled_duration, {"0.05": 0.05, "1": 1.0}, ["0", "1e-300", "0.049"]),
        (cli_types.count(1, 64), {"64": 64}, ["0", "100000"]),
    ],
)
def test_converters(convert, good, bad) -> None:  # type: ignore[no-untyped-def]
    for text, value in good.items():
        assert convert(text) == value
    for text in [*bad, *BAD_EVERYWHERE]:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(text)


def test_a_refusal_says_the_range_and_the_value() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as error:
        cli_types.period("1e-9")
    assert str(error.value) == "must be a period in seconds in [0.05, 60], got '1e-9'"


def test_the_period_bounds_are_the_configs() -> None:
    metadata = DaemonSection.model_fields["period_s"].metadata
    bounds = {type(item).__name__: item for item in metadata}
    assert bounds["Ge"].ge == MIN_PERIOD_S and bounds["Le"].le == MAX_PERIOD_S
    assert math.isclose(cli_types.period(str(MIN_PERIOD_S)), MIN_PERIOD_S)
