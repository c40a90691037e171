"""The SLO target and the per-prompt TTFT allowance in the node config: valid values reach
the controllers; bad ones are refused with one line naming the key."""

from __future__ import annotations

import pytest

from gpugov.controllers.budget import SLOTarget
from gpugov.daemon.config import parse_config
from gpugov.daemon.errors import ConfigError


def _domain(**overrides: object) -> dict[str, object]:
    return {"domains": [{"name": "llm", "gpus": [0], **overrides}]}


def test_unset_target_keeps_todays_behaviour() -> None:
    domain = parse_config(_domain(ttft_slo_s=1.0, tpot_slo_s=0.05)).domains[0]
    assert domain.slo_target is None and domain.ttft_slo_per_prompt_token_s is None


def test_a_target_and_an_allowance_parse() -> None:
    config = parse_config(
        _domain(
            ttft_slo_s=1.0,
            tpot_slo_s=0.05,
            ttft_slo_per_prompt_token_s=5e-5,
            slo_target={"attainment": 0.99, "window_s": 300.0},
        )
    )
    domain = config.domains[0]
    assert domain.ttft_slo_per_prompt_token_s == 5e-5
    assert domain.slo_target is not None
    assert domain.slo_target.target() == SLOTarget(attainment=0.99, window_s=300.0)
    window_default = parse_config(_domain(tpot_slo_s=0.05, slo_target={"attainment": 0.95}))
    assert window_default.domains[0].slo_target.window_s == 600.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("overrides", "key", "reason"),
    [
        (
            {"ttft_slo_s": 1.0, "slo_target": {"attainment": 1.0}},
            "domains[0].slo_target.attainment",
            "less than 1",
        ),
        (
            {"ttft_slo_s": 1.0, "slo_target": {"attainment": 0}},
            "domains[0].slo_target.attainment",
            "greater than 0",
        ),
        (
            {"ttft_slo_s": 1.0, "slo_target": {"attainment": "99%"}},
            "domains[0].slo_target.attainment",
            "valid number",
        ),
        (
            {"ttft_slo_s": 1.0, "slo_target": {"attainment": 0.99, "window_s": -5}},
            "domains[0].slo_target.window_s",
            "greater than 0",
        ),
        (
            {"ttft_slo_s": 1.0, "slo_target": {"attainment": 0.99, "window_s": 1e9}},
            "domains[0].slo_target.window_s",
            "less than or equal to 2678400",
        ),
        (
            {"ttft_slo_s": 1.0, "slo_target": {"attainment": 0.99, "p99": 1}},
            "domains[0].slo_target.p99",
            "unknown key",
        ),
        (
            {"ttft_slo_s": 1.0, "slo_target": {"attainment": 0.99, "window_s": 6.0}},
            "domains[0].slo_target.window_s",
            "at least 12 x daemon.period_s",
        ),
        ({"slo_target": {"attainment": 0.99}}, "domains[0]", "slo_target needs"),
        # A prefill pool is judged on TTFT alone, a decode pool on TPOT alone: the other
        # SLO alone gave the target no request to count (accepted with a metrics warning).
        (
            {"role": "prefill", "tpot_slo_s": 0.05, "slo_target": {"attainment": 0.99}},
            "domains[0]",
            'slo_target of a prefill pool (role = "prefill") counts its first tokens against '
            "ttft_slo_s",
        ),
        (
            {"role": "decode", "ttft_slo_s": 1.0, "slo_target": {"attainment": 0.99}},
            "domains[0]",
            'slo_target of a decode pool (role = "decode") counts its tokens against tpot_slo_s',
        ),
        (
            {"ttft_slo_per_prompt_token_s": -1e-5, "ttft_slo_s": 1.0},
            "domains[0].ttft_slo_per_prompt_token_s",
            "greater than or equal to 0",
        ),
        ({"ttft_slo_per_prompt_token_s": 1e-5}, "domains[0]", "needs ttft_slo_s"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(
    overrides: dict[str, object], key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(_domain(**overrides), "node.toml")
    lines = str(raised.value).splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("node.toml: ") and key in lines[0] and reason in lines[0]


def test_a_pools_target_with_its_own_slo_parses() -> None:
    """A prefill pool's target over TTFT alone, and a decode pool's over TPOT alone, parse."""
    prefill = _domain(role="prefill", ttft_slo_s=1.0, slo_target={"attainment": 0.99})
    decode = _domain(role="decode", tpot_slo_s=0.05, slo_target={"attainment": 0.99})
    assert parse_config(prefill).domains[0].slo_target is not None
    assert parse_config(decode).domains[0].slo_target is not None
