"""An emulator run faster than its plants can be computed: it falls behind its --speed
and keeps answering, where each advance took longer than the last and held the node."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from synthetic import make_plant

from gpugov.study.emulate.node import EmulatedNode


def test_a_speed_the_plants_cannot_keep_up_with_leaves_the_node_answering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At --speed 1e6 one tick was 2,000 plant seconds, whose computing took longer than
    a tick, so the next covered more: the advancing thread held the node's lock for ever
    longer, and every GPU read, page and request waited on it."""
    caplog.set_level(logging.WARNING, logger="gpugov.study.emulate.node")
    node = EmulatedNode(make_plant(), speed=1.0e6)
    node.start()
    try:
        time.sleep(1.5)
        answers: list[float] = []

        def read() -> None:
            for _ in range(5):
                started = time.monotonic()
                sample = node.gpu_sample(0)
                assert "power_mw" in sample
                answers.append(time.monotonic() - started)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout=30.0)  # a bound to catch the stall, not a timing check
        assert len(answers) == 5, "the node's GPU reads did not answer"
        with node.lock:  # the advancing thread steps the plants under it
            reached = node.plant_time_s()
            simulated = node.simulations[0].time_s
        assert reached > 0.0
        assert simulated <= reached + 1.0e-6
        said = [r for r in caplog.records if "cannot keep up" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in caplog.records]
        assert "--speed 1e+06" in said[0].getMessage()
    finally:
        node.stop()


def test_a_speed_the_plants_keep_up_with_is_kept() -> None:
    """At a speed the plants keep up with, the node's clock is the wall clock times it."""
    wall = [0.0]
    node = EmulatedNode(make_plant(), speed=50.0, clock=lambda: wall[0])
    for _ in range(20):
        wall[0] += 0.002
        node.advance_within_budget()
    assert node.plant_time_s() == pytest.approx(20 * 0.002 * 50.0)
    assert node.simulations[0].time_s == pytest.approx(node.plant_time_s())
