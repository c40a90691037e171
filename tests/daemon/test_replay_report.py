"""The replay's report says what it compared: a recording whose every tick held the
fail-safe compares no decision, and said `differing ticks 0 (0.0 %)` and a mean request
of 0.0 MHz on both sides, figures of nothing; ``--show 0`` printed list headings over
empty lists."""

from __future__ import annotations

from gpugov.daemon.replay import Difference, ReplayReport


def test_a_replay_that_compared_no_decision_says_so_and_no_means() -> None:
    report = ReplayReport("mpc-online", "reactive", compared=0, skipped_failsafe=1223)
    text = report.format()
    assert text.splitlines()[0].startswith("replayed 0 decisions of 'mpc-online'")
    assert "no decision to compare" in text
    assert "MHz" not in text and "%" not in text


def test_show_zero_lists_no_headings() -> None:
    report = ReplayReport("mpc-online", "max", compared=2)
    report.differences = [Difference("sim", 1, 0.5, 495.0, 1980.0)]
    report.abs_diff_sum_mhz = 1485.0
    report.recorded_sum_mhz = 495.0 + 1980.0
    report.replayed_sum_mhz = 2 * 1980.0
    text = report.format(show=0)
    assert "  differing ticks     1 (50.0 %)" in text
    assert "differing stretches (1)" in text
    assert "first" not in text
    assert "495 ->" not in text
    shown = report.format(show=1)
    assert "differing stretches (1; first 1):" in shown
    assert "sim t =       0.5 s      495 ->    1980 MHz" in shown


def test_stretches_are_counted_per_domain() -> None:
    """A node's recording interleaves its domains' ticks (step s of each, then step s+1):
    a stretch was cut at every other domain's difference, and named no domain."""
    report = ReplayReport("mpc-online", "max", compared=8)
    for step in (1, 2, 3):
        for domain in ("prefill", "decode"):
            report.differences.append(Difference(domain, step, step * 0.5, 495.0, 1980.0))
    report.differences.append(Difference("decode", 7, 3.5, 495.0, 1980.0))
    assert report.ranges() == [
        ("prefill", 0.5, 1.5, 3),
        ("decode", 0.5, 1.5, 3),
        ("decode", 3.5, 3.5, 1),
    ]
    text = report.format(show=10)
    assert "differing stretches (3; first 3):" in text
    assert "    prefill t =       0.5 ..       1.5 s  (3 ticks)" in text
    assert "    decode t =       3.5 ..       3.5 s  (1 ticks)" in text
