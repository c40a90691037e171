"""``ServingObservation.has_work``: the one test of work in hand the controllers read."""

from __future__ import annotations

import math

import pytest

from gpugov.plant.types import ServingObservation


def _observation(**fields: float) -> ServingObservation:
    base = {
        "arrived_requests": 0,
        "prefill_remaining_tokens": 0.0,
        "decode_active": 0,
        "generated_decode_tokens": 0.0,
        "temperature_c": 50.0,
    }
    base.update(fields)
    return ServingObservation(time_s=1.0, step_index=1, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "work"),
    [
        ({}, False),
        ({"decode_active": 2}, True),
        ({"waiting_requests": 1}, True),
        ({"prefill_remaining_tokens": 512.0}, True),
        # A backlog not known (a recording's null, read back as NaN) is not taken for an
        # idle engine: the controllers would park the clock low under work.
        ({"prefill_remaining_tokens": math.nan}, True),
    ],
)
def test_work_in_hand(fields: dict[str, float], work: bool) -> None:
    assert _observation(**fields).has_work is work
