"""Disaggregated serving on the node: roles, the engines' PD metrics, per-role objectives,
and a prefill and a decode domain governed side by side (fake NVML, real loopback HTTP)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from daemon_support import MetricsServer, fixture_text
from fake_pynvml import FakeNvml
from prometheus_client import generate_latest

from gpugov.controllers.contract import layers
from gpugov.daemon.config import parse_config
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import ControllerContext, build_controller
from gpugov.daemon.engine_sources import ScrapedSource, SglangSource, VllmSource
from gpugov.daemon.errors import ConfigError
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.roles import RoleView, resolve_role, role_view
from gpugov.daemon.service import domains_from_config
from gpugov.plant.types import ServingObservation

LOCK = "nvmlDeviceSetGpuLockedClocks"


def _page(name: str) -> Any:
    return lambda url, timeout_s: fixture_text(name)


# ----------------------------------------------------------------------- engines
def test_vllm_nixl_decode_page() -> None:
    sample = VllmSource("x", fetch=_page("vllm_nixl_decode_synthetic.txt")).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (24, 3)
    assert sample.role is None  # vLLM labels no role
    assert sample.kv_transfers_total == 230.0
    assert sample.kv_transfer_seconds_total == pytest.approx(3.45)
    assert sample.kv_transfer_bytes_total == pytest.approx(1.5691e10)
    assert sample.kv_transfer_failures_total == 1.0
    assert sample.waiting_deferred_requests == 2
    assert sample.prompt_tokens_external_total == 119700.0
    assert sample.prompt_tokens_total == 120000.0


def test_sglang_pd_pages_state_their_role() -> None:
    prefill = SglangSource("x", fetch=_page("sglang_pd_prefill_synthetic.txt")).scrape()
    assert prefill.role == "prefill"
    assert (prefill.running_requests, prefill.waiting_requests) == (3, 5)  # TP ranks once
    assert prefill.kv_bootstrap_queue_requests == 2
    assert prefill.kv_transfer_queue_requests == 4
    assert prefill.kv_transfer_latency_s == pytest.approx(0.0125)
    assert prefill.kv_transfer_failures_total == 1.0  # (sglang:utilization = -1 is ignored)
    decode = SglangSource("x", fetch=_page("sglang_pd_decode_synthetic.txt")).scrape()
    assert decode.role == "decode"
    assert (decode.running_requests, decode.kv_tokens) == (32, 60000.0)
    assert (decode.kv_bootstrap_queue_requests, decode.kv_transfer_queue_requests) == (4, 3)
    assert decode.tpot is not None and decode.tpot.count == 288850.0


def test_dynamo_worker_component_names_the_role() -> None:
    page = fixture_text("dynamo_vllm_prefill_synthetic.txt")
    source = ScrapedSource("x", "auto", fetch=lambda url, t: page)
    sample = source.scrape()
    assert (source.kind, sample.role, sample.waiting_requests) == ("vllm", "prefill", 6)
    # "backend" is both an aggregated and a decode worker: it states no role.
    backend = page.replace('dynamo_component="prefill"', 'dynamo_component="backend"')
    assert ScrapedSource("x", "auto", fetch=lambda url, t: backend).scrape().role is None


def test_unknown_or_mixed_role_labels_state_none() -> None:
    page = fixture_text("sglang_pd_decode_synthetic.txt")
    odd = page.replace('engine_type="decode"', 'engine_type="encode"')
    assert SglangSource("x", fetch=lambda url, t: odd).scrape().role is None
    mixed = page.replace(
        'engine_type="decode",model_name="meta-llama/Llama-3.1-8B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="1"',
        'engine_type="prefill",model_name="meta-llama/Llama-3.1-8B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="1"',
    )
    assert SglangSource("x", fetch=lambda url, t: mixed).scrape().role is None
    unified = fixture_text("sglang_ranks_synthetic.txt")
    assert SglangSource("x", fetch=lambda url, t: unified).scrape().role == "colocated"


def test_a_pool_role_beside_unified_is_the_pools() -> None:
    """SGLang releases that write ``engine_type="unified"`` in every mode, behind a Dynamo
    prefill worker: the worker's component states the pool, ``unified`` nothing against
    it (a pool label and ``unified`` are no two roles)."""
    worker = (
        "# TYPE dynamo_component_requests_total counter\n"
        'dynamo_component_requests_total{dynamo_component="prefill",'
        'dynamo_endpoint="generate",dynamo_namespace="dynamo"} 12\n'
    )
    page = worker + fixture_text("sglang_ranks_synthetic.txt")
    sample = ScrapedSource("x", "auto", fetch=lambda url, t: page).scrape()
    assert sample.role == "prefill"
    decode = page.replace('dynamo_component="prefill"', 'dynamo_component="decode"')
    assert ScrapedSource("x", "auto", fetch=lambda url, t: decode).scrape().role == "decode"
    both = page.replace('engine_type="unified"', 'engine_type="decode"', 1)
    assert ScrapedSource("x", "auto", fetch=lambda url, t: both).scrape().role is None


# ------------------------------------------------------------------------ config
def test_role_config_default_and_bad_value() -> None:
    domain = {"name": "p", "gpus": [0]}
    assert parse_config({"domains": [domain]}).domains[0].role is None
    with pytest.raises(ConfigError) as caught:
        parse_config({"domains": [{**domain, "role": "prefil"}]}, "node.toml")
    assert str(caught.value) == (
        "node.toml: domains[0].role: Input should be 'prefill', 'decode' or 'colocated'"
    )


def test_config_wins_over_labels_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert resolve_role("decode", "prefill", "d") == "decode"
    assert len(caplog.records) == 1 and "config wins" in caplog.records[0].getMessage()
    assert resolve_role(None, "prefill", "d") == "prefill"
    assert resolve_role(None, None, "d") == "colocated"


# --------------------------------------------------------------------- objectives
def _observation(**more: Any) -> ServingObservation:
    values: dict[str, Any] = {
        "time_s": 1.0,
        "step_index": 1,
        "arrived_requests": 10,
        "prefill_remaining_tokens": 4096.0,
        "decode_active": 8,
        "generated_decode_tokens": 100.0,
        "temperature_c": 50.0,
        "ttft_recent_s": 0.4,
        "tpot_recent_s": 0.03,
        "ttft_slo_s": 1.0,
        "tpot_slo_s": 0.05,
        "ttft_count_total": 10.0,
        "ttft_within_slo_total": 9.0,
        "tpot_count_total": 8.0,
        "tpot_within_slo_total": 8.0,
    }
    return ServingObservation(**{**values, **more})


def test_role_view_hides_the_objective_the_role_is_not_judged_on() -> None:
    prefill = role_view(_observation(), "prefill")
    assert prefill.role == "prefill" and prefill.ttft_recent_s == 0.4
    assert (prefill.tpot_recent_s, prefill.tpot_count_total) == (None, None)
    assert prefill.prefill_remaining_tokens == 4096.0
    decode = role_view(_observation(), "decode")
    assert decode.role == "decode" and decode.tpot_recent_s == 0.03
    assert (decode.ttft_recent_s, decode.ttft_count_total, decode.prefill_remaining_tokens) == (
        None,
        None,
        0.0,
    )
    assert (decode.decode_active, decode.ttft_slo_s, decode.tpot_slo_s) == (8, 1.0, 0.05)
    assert role_view(_observation(), "colocated") == _observation()


def test_a_decode_domain_sees_no_prompt_backlog_in_any_estimate() -> None:
    """The backlog's tail estimate (a node's waiting requests at a prompt each, which
    ``mpc-online`` plans at once the SLO budget can afford no miss) and a pool's busiest
    engine's backlog are prompt backlog too: a decode domain computes none of them."""
    seen = _observation(prefill_tail_tokens=9000.0, busiest_prefill_tokens=3000.0, engines=2)
    decode = role_view(seen, "decode")
    assert (decode.prefill_remaining_tokens, decode.prefill_tail_tokens) == (0.0, 0.0)
    assert decode.busiest_prefill_tokens == 0.0
    assert role_view(_observation(), "decode").prefill_tail_tokens is None  # unknown stays
    prefill = role_view(seen, "prefill")
    assert (prefill.prefill_tail_tokens, prefill.busiest_prefill_tokens) == (9000.0, 3000.0)


def test_context_role_reaches_the_chain_and_the_mpc_weights() -> None:
    clocks = (600.0, 1000.0, 1410.0)
    colocated = ControllerContext(period_s=1.0, supported_clocks_mhz=clocks)
    assert colocated.objectives == ("ttft", "tpot")
    chain = build_controller(parse_controller_spec("max"), colocated)
    assert not any(isinstance(layer, RoleView) for layer in layers(chain))
    decode = ControllerContext(period_s=1.0, supported_clocks_mhz=clocks, role="decode")
    assert decode.objectives == ("tpot",)
    online = build_controller(parse_controller_spec("mpc-online"), decode)
    assert any(isinstance(layer, RoleView) and layer.role == "decode" for layer in layers(online))
    weights = online.unwrapped.mpc_options["weights"]  # type: ignore[attr-defined]
    assert (weights.ttft, weights.tpot) == (0.0, 10.0)
    with pytest.raises(ValueError, match="role must be one of"):
        ControllerContext(period_s=1.0, supported_clocks_mhz=clocks, role="both")


# ------------------------------------------------------------- side by side
SEEN: dict[str, list[Any]] = {}


class RoleRecorder:
    """An outside controller that records its context's role and what it observes; a
    prefill domain asks for the top clock, a decode domain for the lowest."""

    def __init__(self, context: ControllerContext) -> None:
        self.role = context.role
        self.clocks = context.supported_clocks_mhz
        SEEN[context.role] = [context.objectives]

    def __call__(self, observation: ServingObservation) -> float:
        SEEN[self.role].append(observation)
        return self.clocks[-1] if observation.role == "prefill" else self.clocks[0]


def test_prefill_and_decode_domains_side_by_side() -> None:
    SEEN.clear()
    prefill_engine, decode_engine = MetricsServer(), MetricsServer()
    prefill_engine.page = fixture_text("sglang_pd_prefill_synthetic.txt")
    decode_engine.page = fixture_text("vllm_nixl_decode_synthetic.txt")
    recorder = {"kind": "external", "factory": "test_disaggregated:RoleRecorder"}
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                # No role set: SGLang's engine_type label says prefill.
                {"name": "prefill", "gpus": [0], "controller": recorder,
                 "engine": {"url": prefill_engine.url, "timeout_s": 0.5},
                 "ttft_slo_s": 1.0, "tpot_slo_s": 0.05},
                # vLLM labels no role: the config says decode.
                {"name": "decode", "gpus": [1], "controller": recorder, "role": "decode",
                 "engine": {"url": decode_engine.url, "timeout_s": 0.5},
                 "ttft_slo_s": 1.0, "tpot_slo_s": 0.05},
            ],
        }
    )  # fmt: skip
    fake = FakeNvml(2)
    try:
        assembled = domains_from_config(config, nvml=fake)
        clock = VirtualClock()
        records: list[Any] = []
        exporter = Exporter(serve=False)
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            exporter=exporter,
            on_tick=records.extend,
            before_tick=lambda now, step: step >= 3,
        )
        assembled.close()
        page = generate_latest(exporter.registry).decode()
        header_roles = [d["role"] for d in assembled.header["domains"]]
    finally:
        prefill_engine.close()
        decode_engine.close()
    assert SEEN["prefill"][0] == ("ttft",) and SEEN["decode"][0] == ("tpot",)
    assert header_roles == ["prefill", "decode"]  # a recording's header keeps them for replay
    # After the objectives: the warm-up's dummy decision (a copy of the bare algorithm),
    # then the three ticks.
    prefill_seen, decode_seen = SEEN["prefill"][2:], SEEN["decode"][2:]
    assert len(prefill_seen) == len(decode_seen) == 3
    assert all(o.role == "prefill" and o.tpot_count_total is None for o in prefill_seen)
    assert all(o.waiting_requests == 5 for o in prefill_seen)
    assert all(o.role == "decode" and o.ttft_count_total is None for o in decode_seen)
    assert all(o.prefill_remaining_tokens == 0.0 and o.decode_active == 24 for o in decode_seen)
    # The node's own record keeps the full observation (both latencies, for the exporter).
    decode_records = [r for r in records if r.domain == "decode"]
    assert decode_records[-1].observation.prefill_remaining_tokens > 0.0
    # Its prompt tokens are those prefilled here, not those whose KV cache was transferred;
    # its waiting requests leave out the two vLLM defers (their KV cache still on the way).
    assert decode_records[-1].observation.prompt_tokens_total == 300.0
    assert decode_records[-1].observation.waiting_requests == 1
    # Each domain's clock follows its own controller: GPU 0 at the top, GPU 1 at the floor.
    locks = {w[1]: (w[2], w[3]) for w in fake.writes if w[0] == LOCK}
    assert locks[0] == (1980, 1980) and locks[1] == (345, 345)
    assert 'gpugov_domain_role_info{domain="prefill",role="prefill"} 1.0' in page
    assert 'gpugov_domain_role_info{domain="decode",role="decode"} 1.0' in page


def test_replay_rebuilds_the_recorded_role() -> None:
    from gpugov.daemon.replay import _recorded_role

    assert _recorded_role({"role": "decode"}) == "decode"
    assert _recorded_role({}) == _recorded_role({"role": "both"}) == "colocated"


def test_a_label_that_contradicts_the_config_is_logged_once(
    metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    metrics_server.page = fixture_text("sglang_pd_prefill_synthetic.txt")
    domain = {
        "name": "pool",
        "gpus": [0],
        "role": "decode",
        "engine": {"url": metrics_server.url, "timeout_s": 0.5},
    }
    config = parse_config({"daemon": {"period_s": 1.0}, "domains": [domain]})
    assembled = domains_from_config(config, nvml=FakeNvml(1))
    clock = VirtualClock()
    records: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            on_tick=records.extend,
            before_tick=lambda now, step: step >= 3,
        )
    assembled.close()
    lines = [r.getMessage() for r in caplog.records if "labels say" in r.getMessage()]
    assert lines == [
        "domain pool: role = 'decode' in the config, but the engine's labels say 'prefill'; "
        "the config wins"
    ]
    assert {r.observation.role for r in records} == {"decode"}


def test_status_shows_the_role_the_labels_state(
    metrics_server: MetricsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpugov.daemon import node_cli, status_cli

    monkeypatch.setattr(status_cli, "load_pynvml", lambda: FakeNvml(1))
    metrics_server.page = fixture_text("sglang_pd_decode_synthetic.txt")
    assert node_cli.main(["status", "--engine-url", metrics_server.url]) == 0
    assert "reachable (sglang, 2 waiting, 32 running, labels say role decode)" in (
        capsys.readouterr().out
    )


def test_check_config_names_each_domain_role(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A configured pool role is part of what check-config says the domain runs as; a
    domain without one says where its role comes from."""
    from gpugov.daemon import node_cli

    path = tmp_path / "node.toml"
    path.write_text(
        "[[domains]]\nname = 'd'\ngpus = [1]\nrole = 'decode'\ntpot_slo_s = 0.05\n"
        "[[domains]]\nname = 'c'\ngpus = [0]\nttft_slo_s = 1.0\ntpot_slo_s = 0.05\n"
    )
    assert node_cli.main(["check-config", "--offline", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  domain d: GPUs 1; role decode; engine " in out
    assert "  domain c: GPUs 0; role from the engine's labels, else colocated; engine " in out
