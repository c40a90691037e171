"""``gpugov emulate --layout MPND``: the emulated node in a disaggregated layout, and the
daemon governing its prefill and decode pools side by side over real loopback HTTP.

The end-to-end test shares one virtual clock between the emulator's plants and the
daemon's loop, so forty seconds of serving take a fraction of a second and every run is
the same; the daemon still reaches the emulated GPUs and both pools' metrics pages over
HTTP, as ``gpugov run`` with ``backend = "emulated"`` does.
"""

from __future__ import annotations

import json
import logging
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.config import parse_config
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.energy import EnergyEstimator, reading_from
from gpugov.daemon.engine_sources import ScrapedSource, VllmSource
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.observer import DomainObserver
from gpugov.daemon.service import domains_from_config
from gpugov.plant import ServingPlant, load_profile
from gpugov.study.emulate import cli as emulate_cli
from gpugov.study.emulate.disaggregated import (
    DisaggregatedNode,
    parse_layout,
    render_pool_metrics,
)
from gpugov.study.emulate.server import EmulatorServer

PROFILE = "h100-sxm-llama3-8b"
TOP_MHZ = 1980
APPLICATIONS_CLOCKS_SETTING = 0x2


@pytest.fixture(scope="module")
def plant() -> ServingPlant:
    return ServingPlant.from_profile(load_profile(PROFILE))


def _read_page(page: str, clock: VirtualClock) -> Any:
    """``page`` read as the daemon reads a vLLM page, its deadline on the test's virtual
    clock: the default 0.5 s of wall time failed the read (``was not read within 0.5 s``)
    on a machine loaded enough to stall the parse, though no plant time passed."""
    return ScrapedSource("x", "vllm", fetch=lambda url, timeout_s: page, clock=clock).scrape()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


@pytest.fixture
def emulator(plant: ServingPlant) -> Iterator[EmulatorServer]:
    """A 1P1D node in fast real time (speed 50) on a free loopback port."""
    node = DisaggregatedNode(plant, prefill_replicas=1, decode_replicas=1, speed=50.0)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.close()


# ------------------------------------------------------------------- the layout
def test_layout_flag_values() -> None:
    assert parse_layout("colocated") is None
    assert parse_layout("1P1D") == (1, 1) and parse_layout("2p3d") == (2, 3)
    for bad in ("1P", "0P1D", "P1D", "1D1P", "two"):
        with pytest.raises(ValueError, match="expected colocated or MPND"):
            parse_layout(bad)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--layout", "1P0D"], "argument --layout: expected colocated or MPND"),
        (["--layout", "1P1D", "--gpus", "3"], "--gpus 3 disagrees with --layout 1P1D (2 GPUs)"),
        (["--interconnect", "roce"], "--interconnect needs a disaggregated --layout"),
        (["--layout", "1P1D", "--interconnect", "pcie"], "argument --interconnect: expected"),
    ],
)
def test_bad_layout_flags_are_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugov.cli import main

    code = main(["emulate", "--profile", PROFILE, "--address", "127.0.0.1:0", *argv])
    err = capsys.readouterr().err
    assert code == 2 and line in err and "Traceback" not in err
    assert emulate_cli  # the command module is the one registered


def test_completion_goes_through_both_pools(emulator: EmulatorServer) -> None:
    url = emulator.url
    answer = _post(
        f"{url}/v1/completions",
        {"model": "gpugov-emulated", "prompt": "hi " * 500, "max_tokens": 40, "ignore_eos": True},
    )
    usage = answer["usage"]
    assert usage["completion_tokens"] == 40
    assert usage["prefill_energy_j"] > 0.0 and usage["decode_energy_j"] > 0.0
    # Real HTTP on a real clock: the deadline of the test's other requests, not the
    # daemon's 0.5 s, which a loaded machine can pass.
    prefill = VllmSource(f"{url}/prefill/metrics", timeout_s=10.0).scrape()
    decode = VllmSource(f"{url}/decode/metrics", timeout_s=10.0).scrape()
    # The prefill instance produced the first token, the decode instance the other 39.
    assert prefill.generation_tokens_total == 1 and decode.generation_tokens_total == 39
    assert prefill.ttft is not None and prefill.ttft.count == 1
    assert decode.kv_transfers_total == 1 and decode.kv_transfer_bytes_total > 0
    assert decode.prompt_tokens_external_total == decode.prompt_tokens_total > 0
    truth = json.loads(_get(f"{url}/gpugov/energy"))
    assert truth["layout"] == "1P1D" and truth["totals"]["output_tokens"] == 40
    assert truth["totals"]["prompt_tokens"] == usage["prompt_tokens"]
    (record,) = truth["requests"]
    assert record["total_j"] == pytest.approx(usage["energy_j"])
    pools = truth["pools"]
    assert pools["prefill"]["total_j"] + pools["decode"]["total_j"] == pytest.approx(
        truth["totals"]["total_j"]
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        _get(f"{url}/metrics")
    assert caught.value.code == 404
    assert "/prefill/metrics and /decode/metrics" in caught.value.read().decode()
    assert json.loads(_get(f"{url}/gpu"))["count"] == 2


def test_each_pool_page_counts_its_finished_requests_lengths(emulator: EmulatorServer) -> None:
    """Each pool's vllm:request_prompt_tokens / vllm:request_generation_tokens histograms
    count the requests that pool finished (as its request_success_total does), with the
    tokens it generated: the daemon's per-request energy histogram
    (gpugov_energy_request_joules, the dashboard's p50/p90) reads them, and stayed empty
    on a disaggregated node."""
    url = emulator.url
    _post(
        f"{url}/v1/completions",
        {"model": "gpugov-emulated", "prompt": "hi " * 500, "max_tokens": 40, "ignore_eos": True},
    )
    for pool, generated in (("prefill", 1), ("decode", 39)):
        sample = VllmSource(f"{url}/{pool}/metrics", timeout_s=10.0).scrape()
        assert sample.generation_tokens_total == generated
        for buckets in (
            sample.request_prompt_tokens_buckets,
            sample.request_generation_tokens_buckets,
        ):
            assert buckets is not None and buckets[-1][1] == 1.0, (pool, buckets)
        page = _get(f"{url}/{pool}/metrics")
        labels = '{engine="0",model_name="gpugov-emulated"}'
        assert f"vllm:request_generation_tokens_sum{labels} {float(generated)}" in page


class _Gpu:
    """A GpuBackend of one GPU drawing 300 W (its energy counter moves 300 J a read)."""

    label = "0"

    def __init__(self) -> None:
        self.energy_j = 1e6

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return (900, 1980)

    def sample(self) -> GpuSample:
        self.energy_j += 300.0
        return GpuSample(gpu=self.label, energy_j=self.energy_j, power_limit_w=700.0)

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self) -> None: ...

    def close(self) -> None: ...


def test_the_energy_attribution_counts_the_prompt_tokens_each_pool_prefilled(
    emulator: EmulatorServer,
) -> None:
    """The decode pool's page counts the prompts whose KV cache the prefill pool computed
    (vLLM's external_kv_transfer source). gpugov_prompt_tokens_total leaves them out; the
    energy attribution's prompt tokens (gpugov_energy_tokens_total{kind="prompt"}, the
    prefill J per prompt token) counted them, a decode pool's prefill energy spread over
    prompts it never ran. Each pool's finished request still gets its estimated energy
    (gpugov_energy_request_joules): the decode pool's, its decode energy alone."""
    url = emulator.url
    pools = {}
    for role in ("prefill", "decode"):
        source = VllmSource(f"{url}/{role}/metrics", timeout_s=10.0)
        observer = DomainObserver([_Gpu()], source, stale_after_s=30.0, role=role)
        estimator = EnergyEstimator()
        estimator.update(reading_from(observer.observe(0.0, 0, None)))
        pools[role] = (observer, estimator)
    _post(
        f"{url}/v1/completions",
        {"model": "gpugov-emulated", "prompt": "hi " * 500, "max_tokens": 40, "ignore_eos": True},
    )
    for role, (observer, estimator) in pools.items():
        observed = observer.observe(1.0, 1, None)
        assert observed.engine_sample is not None
        engine_prompt = observed.engine_sample.prompt_tokens_total
        assert engine_prompt is not None and engine_prompt > 0
        reading = reading_from(observed)
        assert reading.prompt_tokens == observed.observation.prompt_tokens_total, role
        estimator.update(reading)
        histogram = estimator.models["gpugov-emulated"].histogram
        assert histogram is not None and histogram.count == 1.0, role
    assert reading.prompt_tokens == 0.0  # the decode pool prefilled none


def test_a_transfer_in_flight_is_deferred_on_the_decode_page_and_can_be_aborted(
    plant: ServingPlant,
) -> None:
    from gpugov.plant.disaggregated_layout import DisaggregatedPlant

    clock = VirtualClock()
    node = DisaggregatedNode(plant, prefill_replicas=1, decode_replicas=1, clock=clock)
    # A slow link (5 s a transfer) keeps the KV caches on the way long enough to look.
    node.layout = DisaggregatedPlant(node.layout.prefill, node.layout.decode, transfer_fixed_s=5.0)
    kept = node.submit(500, 20, "length", "kept")
    dropped = node.submit(500, 20, "length", "dropped")
    gone_early = node.submit(500, 20, "length", "gone-early")
    node.abort(gone_early)  # its client left during its prefill: it never moves
    clock.sleep(1.0)
    node.advance()
    assert (kept.sent, dropped.sent) == (1, 1)  # first tokens, from the prefill GPU
    page = render_pool_metrics(node, "m", "decode")
    deferred = _read_page(page, clock)
    assert deferred.waiting_deferred_requests == 2 and deferred.waiting_requests == 2
    node.abort(dropped)  # its client left while its KV cache was on the link
    clock.sleep(10.0)
    node.advance()
    assert kept.sent == 20 and dropped.sent == 1
    assert node.transfers[1].in_flight == 0 and node.transfers[1].seconds.count == 1
    assert [r["id"] for r in node.energy_report()["requests"]] == ["kept"]
    node.stop()


def test_2p2d_spreads_requests_over_each_pool(plant: ServingPlant) -> None:
    clock = VirtualClock()
    node = DisaggregatedNode(plant, prefill_replicas=2, decode_replicas=2, clock=clock)
    assert (node.prefill_gpus, node.decode_gpus, node.layout_name) == ((0, 1), (2, 3), "2P2D")
    streams = [node.submit(800, 30, "length", f"r{k}") for k in range(4)]
    clock.sleep(5.0)
    node.advance()
    assert all(stream.sent == 30 for stream in streams)
    assert [node.stats[gpu].prompt_tokens for gpu in (0, 1)] == [1600, 1600]
    assert [node.transfers[gpu].seconds.count for gpu in (2, 3)] == [2, 2]
    page = render_pool_metrics(node, "m", "decode")
    assert 'vllm:generation_tokens_total{engine="1",model_name="m"} 58.0' in page
    decode = _read_page(page, clock)
    assert decode.generation_tokens_total == 4 * 29 and decode.kv_transfers_total == 4
    report = node.energy_report()
    assert report["pools"]["decode"]["gpus"] == [2, 3]
    assert sum(r["total_j"] for r in report["requests"]) < report["totals"]["total_j"]
    node.stop()


def test_the_prefill_page_counts_a_prompt_once_its_prefill_is_done(plant: ServingPlant) -> None:
    """As vLLM V1 (and the colocated emulated node): vllm:prompt_tokens_total counts a
    prompt at the end of its prefill. Counted on arrival, a queued burst read as prompts
    already computed, and the daemon's mean prompt (those tokens over the prompts done)
    doubled, and so did the prefill domain's backlog."""
    clock = VirtualClock()
    node = DisaggregatedNode(plant, prefill_replicas=1, decode_replicas=1, clock=clock)
    for k in range(4):
        node.submit(3000, 20, "length", f"a{k}")
    clock.sleep(5.0)
    node.advance()
    for k in range(4):
        node.submit(3000, 20, "length", f"b{k}")  # queued: none of it computed yet
    page = render_pool_metrics(node, "m", "prefill")
    prefill = _read_page(page, clock)
    assert prefill.waiting_requests + prefill.running_requests == 4
    assert prefill.prompt_tokens_total == 12000.0
    assert 'source="local_compute",model_name="m"} 12000.0' in page
    assert node.energy_report()["totals"]["prompt_tokens"] == 12000
    clock.sleep(5.0)
    node.advance()
    assert _read_page(render_pool_metrics(node, "m", "prefill"), clock).prompt_tokens_total == (
        24000.0
    )
    node.stop()


# ------------------------------------------------------------------ end to end
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "emulated-1p1d.toml"


def _config(url: str) -> Any:
    """The shipped example (two ``reactive`` domains, roles and pool pages), pointed at
    ``url`` and without an exporter."""
    text = EXAMPLE.read_text().replace("http://127.0.0.1:8000", url)
    data = tomllib.loads(text)
    data["daemon"]["metrics_address"] = ""
    data["daemon"]["log_level"] = "warning"
    return parse_config(data, str(EXAMPLE))


def test_daemon_governs_each_pool_to_its_own_objective(
    plant: ServingPlant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    clock = VirtualClock()
    node = DisaggregatedNode(plant, prefill_replicas=1, decode_replicas=1, clock=clock, tick_s=0.5)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    records: list[TickRecord] = []
    bursts = (2, 14)

    def load(now_s: float, step: int) -> bool:
        """A burst of long prompts every 12 s; long answers keep the decode pool busy."""
        if step in bursts:
            for k in range(8):
                node.submit(3000, 600, "length", f"req-{step}-{k}")
        return step >= 24

    try:
        assembled = domains_from_config(_config(server.url))
        try:
            run(
                assembled.domains,
                TimedLoop(1.0, clock=clock, sleep=clock.sleep),
                on_tick=records.extend,
                before_tick=load,
            )
        finally:
            assembled.close()
        # No lock is left behind: both emulated GPUs are unlocked and, once the reset has
        # taken effect, back at the top clock.
        clock.sleep(1.0)
        for gpu in (0, 1):
            assert node.gpu_state[gpu].locked is None
            sample = json.loads(_get(f"{server.url}/gpu/{gpu}/sample"))
            assert sample["sm_clock_mhz"] == TOP_MHZ
            assert not sample["clock_event_reasons"] & APPLICATIONS_CLOCKS_SETTING
        truth = node.energy_report()
    finally:
        server.close()
    by_domain: dict[str, list[TickRecord]] = {"prefill": [], "decode": []}
    for record in records:
        by_domain[record.domain].append(record)
    prefill, decode = by_domain["prefill"], by_domain["decode"]
    assert len(prefill) == len(decode) == 24
    assert {r.controller for r in records} == {"reactive"}
    assert {r.observation.role for r in records} <= {"prefill", "decode", None}
    # The prefill pool is judged on TTFT: each prompt burst takes it to the top clock.
    for step in bursts:
        assert prefill[step].applied_mhz == TOP_MHZ, [r.applied_mhz for r in prefill]
    # The decode pool is judged on TPOT: with a batch decoding at low TPOT pressure it
    # walks well below the top, and stays there through the prompt bursts.
    # walks well below the top and holds its TPOT there, through the prompt bursts too.
    decoding = [r for r in decode if r.observation.decode_active > 0]
    assert len(decoding) >= 10
    assert all((r.applied_mhz or TOP_MHZ) <= 0.75 * TOP_MHZ for r in decoding[2:]), [
        r.applied_mhz for r in decode
    ]
    assert all((r.observation.tpot_recent_s or 0.0) < 0.05 for r in decoding)
    for step in bursts:
        assert (decode[step + 1].applied_mhz or TOP_MHZ) < prefill[step].applied_mhz
    # The requests were served through both pools, and the truth covers both.
    assert len(truth["requests"]) == len(bursts) * 8
    assert truth["totals"]["output_tokens"] == len(bursts) * 8 * 600


# --------------------------------------------------- tensor-parallel engines
TP4 = "h100-sxm-llama3-70b-tp4"


def _tp4_config(url: str) -> Any:
    """Two domains, a pool's group of four GPUs each, with the TP4 profile's ``mpc``."""
    manifest = load_profile(TP4).manifest
    domains = [
        {
            "name": role,
            "gpus": gpus,
            "role": role,
            "ttft_slo_s": manifest["ttft_slo_s"],
            "tpot_slo_s": manifest["tpot_slo_s"],
            "engine": {"kind": "vllm", "url": f"{url}/{role}/metrics"},
            "controller": {"kind": "mpc", "profile": TP4},
        }
        for role, gpus in (("prefill", [0, 1, 2, 3]), ("decode", [4, 5, 6, 7]))
    ]
    return parse_config(
        {
            "daemon": {"backend": "emulated", "emulator": url, "metrics_address": ""},
            "domains": domains,
        }
    )


def test_a_tensor_parallel_profile_runs_each_engine_on_its_group_of_gpus(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--layout 1P1D`` with a TP4 profile: one prefill and one decode engine replica of
    four GPUs each (GPUs 0-3 and 4-7), each GPU with its share of its engine's power and
    its own lock, each engine at its group's slowest clock; the daemon governs each pool
    as a domain of its four GPUs with the profile's ``mpc`` and no tensor_parallel
    warning."""
    from gpugov.daemon.emulated import EmulatedBackend

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    clock = VirtualClock()
    tp4 = ServingPlant.from_profile(load_profile(TP4))
    node = DisaggregatedNode(tp4, prefill_replicas=1, decode_replicas=1, clock=clock)
    assert (node.gpu_count, node.tensor_parallel, node.layout_name) == (8, 4, "1P1D")
    assert (node.prefill_gpus, node.decode_gpus) == ((0, 1, 2, 3), (4, 5, 6, 7))
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    backends = [EmulatedBackend(gpu, emulator=server.url, timeout_s=2.0) for gpu in range(8)]
    try:
        served = json.loads(_get(f"{server.url}/gpu"))
        assert (served["count"], served["tensor_parallel"]) == (8, 4)
        assert [(r["gpus"], r["role"], r["metrics"]) for r in served["replicas"]] == [
            ([0, 1, 2, 3], "prefill", "/replica/0/metrics"),
            ([4, 5, 6, 7], "decode", "/replica/1/metrics"),
        ]
        for k in range(8):
            node.submit(2000, 400, "length", f"r{k}")
        clock.sleep(3.0)
        node.advance()
        samples = [backend.sample() for backend in backends]  # one plant instant
        for replica, gpus in ((0, range(4)), (1, range(4, 8))):
            plant = node.simulations[replica].observe()
            assert plant.power_w is not None
            pool = [samples[gpu] for gpu in gpus]
            assert sum(s.power_w or 0.0 for s in pool) == pytest.approx(plant.power_w, abs=0.004)
            for sample in pool:
                assert sample.power_limit_w == 700.0  # an H100's, not the group's 2,800 W
                assert sample.power_w == pytest.approx(plant.power_w / 4, abs=0.001)
        assert node.simulations[1].observe().decode_active == 8  # decoding on GPUs 4-7
        # One engine a pool: the decode pool's page is its one replica's own page.
        assert _get(f"{server.url}/decode/metrics") == _get(f"{server.url}/replica/1/metrics")
        assert "vllm:nixl_xfer_time_seconds_count" in _get(f"{server.url}/replica/1/metrics")
        assert node.energy_report()["pools"]["decode"]["gpus"] == [4, 5, 6, 7]
        # A lock on three decode GPUs holds the decode engine down (the fourth unlocked
        # counts at the top); the prefill engine keeps the top clock.
        for backend in backends[4:7]:
            backend.lock_clocks(900, 900)
        assert node.simulations[1].requested_clock_mhz == 900
        assert node.simulations[0].requested_clock_mhz == TOP_MHZ
        for backend in backends[4:7]:
            backend.reset_clocks()
        caplog.set_level(logging.INFO)
        assembled = domains_from_config(_tp4_config(server.url))
        try:
            assert not [r for r in caplog.records if "(tensor_parallel)" in r.getMessage()]
            prefill, decode = assembled.domains
            for step in range(3):
                clock.sleep(1.0)
                records = [domain.tick(clock(), step) for domain in (prefill, decode)]
            for record, replica in zip(records, (0, 1), strict=True):
                plant = node.simulations[replica].observe()
                assert plant.power_w is not None
                assert record.observation.power_w == pytest.approx(plant.power_w, abs=0.004)
                assert not record.failsafe and record.decision_mhz is not None
            assert records[1].observation.decode_active == 8
            for gpus in (range(4), range(4, 8)):
                assert len({node.gpu_state[gpu].locked for gpu in gpus}) == 1  # a group
        finally:
            assembled.close()
    finally:
        for backend in backends:
            backend.close()
        server.close()


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--layout", "1P1D", "--gpus", "2"],
            "--gpus 2 disagrees with --layout 1P1D (8 GPUs, 4 per engine replica); "
            "leave --gpus out",
        ),
        (
            ["--layout", "9P8D"],
            "--layout 9P8D: 68 GPUs, 4 per engine replica, more than the 64 GPUs an "
            "emulated node has at most",
        ),
    ],
)
def test_a_tensor_parallel_layout_counts_engine_replicas_of_its_gpus(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugov.cli import main

    code = main(["emulate", "--profile", TP4, "--address", "127.0.0.1:0", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert err == f"gpugov: error: {line}"


def test_check_config_names_a_domain_that_does_not_match_the_emulated_pools(
    plant: ServingPlant, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's pages state no role, so a 2P1D node's config must: a domain without one
    over a pool's GPUs is governed colocated, one whose role is the other pool's follows
    the wrong page, and one over both pools locks them to one clock. check-config warns
    of each in one line (exit 0); a config that matches the pools gets no such line."""
    from gpugov.daemon import node_cli

    clock = VirtualClock()
    node = DisaggregatedNode(plant, prefill_replicas=2, decode_replicas=1, clock=clock)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:

        def check(domains: list[tuple[str, list[int], str | None]]) -> list[str]:
            lines = [
                "[daemon]",
                "backend = 'emulated'",
                f"emulator = '{server.url}'",
                "metrics_address = ''",
            ]
            for name, gpus, role in domains:
                lines += ["[[domains]]", f"name = '{name}'", f"gpus = {gpus}"]
                lines += [] if role is None else [f"role = '{role}'"]
                lines += ["ttft_slo_s = 1.0", "tpot_slo_s = 0.05"]
                lines += [f"engine = {{ kind = 'vllm', url = '{server.url}/decode/metrics' }}"]
            path = tmp_path / "node.toml"
            path.write_text("\n".join(lines) + "\n")
            assert node_cli.main(["check-config", str(path)]) == 0
            return [line for line in capsys.readouterr().err.splitlines() if "pool" in line]

        assert check([("p", [0, 1], "prefill"), ("d", [2], "decode")]) == []
        assert check([("p", [0, 1], None), ("d", [2], "prefill")]) == [
            "gpugov: warning: domain 'p': GPUs 0, 1 are the emulator's prefill pool, but "
            "the domain sets no role (the emulator's vLLM pages state none): it is "
            "governed as colocated; set role = 'prefill'",
            "gpugov: warning: domain 'd': role = 'prefill' in the config, but GPU 2 is "
            "the emulator's decode pool",
        ]
        assert check([("all", [0, 1, 2], "prefill")]) == [
            "gpugov: warning: domain 'all': GPUs 0, 1, 2 span the emulator's prefill "
            "and decode pools, which one domain locks to one clock; give each pool its "
            "own domain"
        ]
    finally:
        server.close()
        node.stop()
