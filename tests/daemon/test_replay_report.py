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
