"""``bench controllers --floor`` is checked against the profiles the chosen layout runs:
the disaggregated board runs its own four profiles (H100 and H200, top clock 1,980 MHz)
unless ``--profiles`` names others, and a floor was refused for the colocated board's
A100 (1,410 MHz), which it never runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpugov.cli import build_parser
from gpugov.study.scoreboard.command import config_from_args


def _config(tmp_path: Path, *flags: str) -> object:
    args = build_parser("bench").parse_args(
        ["bench", "controllers", *flags, "--out", str(tmp_path / "out")]
    )
    return config_from_args(args)


def test_the_disaggregated_board_takes_a_floor_its_profiles_reach(tmp_path: Path) -> None:
    config = _config(tmp_path, "--layout", "disaggregated", "--floor", "1500")
    assert config.safety.floor_mhz == 1500.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--layout", "colocated"), "a100-sxm-80gb-llama3-8b (1410 MHz)"),
        (("--layout", "both"), "a100-sxm-80gb-llama3-8b (1410 MHz)"),
        (
            ("--layout", "disaggregated", "--profiles", "a100-sxm-80gb-llama3-70b-tp4"),
            "a100-sxm-80gb-llama3-70b-tp4 (1410 MHz)",
        ),
        (("--layout", "disaggregated", "--floor", "2000"), "h100-sxm-llama3-8b (1980 MHz)"),
    ],
)
def test_a_floor_above_a_run_profile_is_refused(
    tmp_path: Path, flags: tuple[str, ...], named: str
) -> None:
    floor = () if "--floor" in flags else ("--floor", "1500")
    with pytest.raises(ValueError, match="above the top supported clock of") as error:
        _config(tmp_path, *flags, *floor)
    assert named in str(error.value)
