"""``gpugov emulate`` over real loopback HTTP: the OpenAI API, vLLM /metrics and the GPUs,
read through the daemon's own VllmSource and the ``emulated`` backend."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Iterator

import pytest
from synthetic import IdleGpu, make_plant

from gpugov.daemon.attainment import bucket_delta, count_within, total
from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.errors import (
    GpuLost,
    GpuUnavailable,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer


def _serve(**node_options: object) -> EmulatorServer:
    node = EmulatedNode(make_plant(), **node_options)  # type: ignore[arg-type]
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    return server


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    server = _serve()
    try:
        yield server
    finally:
        server.close()


def _post(url: str, path: str, body: object) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, payload


def _get(url: str, path: str) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, payload


def test_completion_counts_prompt_and_output_tokens(emulator: EmulatorServer) -> None:
    status, body = _post(
        emulator.url,
        "/v1/completions",
        {"model": "gpugov-emulated", "prompt": "x" * 400, "max_tokens": 7, "ignore_eos": True},
    )
    assert status == 200
    answer = json.loads(body)
    assert answer["object"] == "text_completion"
    usage = answer["usage"]
    tokens = {key: usage[key] for key in ("prompt_tokens", "total_tokens", "completion_tokens")}
    assert tokens == {"prompt_tokens": 100, "total_tokens": 107, "completion_tokens": 7}
    assert usage["energy_j"] > 0.0  # the plant's truth (test_emulate_energy.py)
    assert answer["choices"][0]["finish_reason"] == "length"
    status, body = _post(
        emulator.url,
        "/v1/completions",
        {"prompt_token_ids": list(range(33)), "max_tokens": 2, "ignore_eos": True},
    )
    assert json.loads(body)["usage"]["prompt_tokens"] == 33


def test_streams_one_event_per_token_then_done(emulator: EmulatorServer) -> None:
    status, body = _post(
        emulator.url,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [
        c
        for c in chunks
        if c["choices"]
        and "content" in c["choices"][0]["delta"]
        and c["choices"][0]["delta"]["content"]
    ]
    assert len(content) == 12
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_bad_requests_get_vllm_error_bodies(emulator: EmulatorServer) -> None:
    status, body = _post(emulator.url, "/v1/completions", b"{not json")
    assert status == 400
    error = json.loads(body)["error"]  # current vLLM: {"error": ErrorInfo}
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError"
    assert error["code"] == 400
    status, body = _post(emulator.url, "/v1/completions", {"prompt": "a", "max_tokens": 10**7})
    assert status == 400 and "maximum context length" in json.loads(body)["error"]["message"]
    status, body = _post(emulator.url, "/v1/completions", {"model": "other", "prompt": "a"})
    assert status == 404 and json.loads(body)["error"]["type"] == "NotFoundError"
    status, _ = _get(emulator.url, "/v1/nothing")
    assert status == 404
    status, body = _get(emulator.url, "/v1/models")
    assert json.loads(body)["data"][0]["id"] == "gpugov-emulated"


def test_metrics_page_moves_and_parses_with_vllm_source(emulator: EmulatorServer) -> None:
    source = ScrapedSource(f"{emulator.url}/metrics", "vllm", timeout_s=2.0)
    before = source.scrape()
    body = {"prompt": "y" * 80, "max_tokens": 5, "ignore_eos": True}
    _post(emulator.url, "/v1/completions", body)
    after = source.scrape()
    source.close()
    assert before.engine == "vllm"
    assert after.prompt_tokens_total == (before.prompt_tokens_total or 0) + 20
    assert after.generation_tokens_total == (before.generation_tokens_total or 0) + 5
    assert after.finished_requests_total == (before.finished_requests_total or 0) + 1
    assert after.ttft is not None and after.ttft.count == 1
    assert after.tpot is not None and after.tpot.count == 4
    assert after.kv_capacity_tokens == pytest.approx(400_000, rel=1e-3)
    # The buckets give the SLO attainment (daemon.attainment): the one first token, and
    # the request's one time per output token (vLLM V1's per-request histogram, which the
    # plant's TPOT SLO judges; its four inter-token intervals give the windowed mean),
    # all within a 10 s SLO.
    ttft = bucket_delta(after.ttft_buckets, before.ttft_buckets)
    tpot = bucket_delta(after.tpot_buckets, before.tpot_buckets)
    assert ttft is not None and total(ttft) == 1 and count_within(ttft, 10.0) == 1
    assert tpot is not None and total(tpot) == 1 and after.tpot_buckets_per_request
    assert count_within(tpot, 10.0) == 1
    _, page = _get(emulator.url, "/metrics")
    text = page.decode()
    labels = 'engine="0",model_name="gpugov-emulated",le="2560.0"'
    assert f"vllm:time_to_first_token_seconds_bucket{{{labels}}}" in text
    assert "h100" not in text.lower() and "synthetic" not in text.lower()
    # Engine steps: the 20-token prefill, then four one-token decode steps.
    assert (after.iterations_total or 0) - (before.iterations_total or 0) == 5
    steps = 'engine="0",model_name="gpugov-emulated"'
    assert f"vllm:iteration_tokens_total_sum{{{steps}}} 24.0" in text
    assert f'vllm:iteration_tokens_total_bucket{{{steps},le="1.0"}} 4.0' in text
    assert f'vllm:iteration_tokens_total_bucket{{{steps},le="32.0"}} 5.0' in text
    # The finished request's five tokens in the output-length histogram: with the
    # generation counter, nothing is left in flight.
    assert after.finished_generation_tokens_total == (
        (before.finished_generation_tokens_total or 0) + 5
    )
    assert f'vllm:request_generation_tokens_bucket{{{steps},le="5.0"}} 1.0' in text
    # Its 20 prompt tokens in the prompt-length histogram (vLLM's name and 1-2-5 bounds),
    # which with the one above gives the daemon's per-request energy histogram.
    assert "# TYPE vllm:request_prompt_tokens histogram" in text
    assert f'vllm:request_prompt_tokens_bucket{{{steps},le="10.0"}} 0.0' in text
    assert f'vllm:request_prompt_tokens_bucket{{{steps},le="20.0"}} 1.0' in text
    assert f"vllm:request_prompt_tokens_sum{{{steps}}} 20.0" in text
    prompts = bucket_delta(
        after.request_prompt_tokens_buckets, before.request_prompt_tokens_buckets
    )
    outputs = bucket_delta(
        after.request_generation_tokens_buckets, before.request_generation_tokens_buckets
    )
    assert prompts is not None and total(prompts) == 1
    assert outputs is not None and total(outputs) == 1
    assert after.generation_tokens_total == after.finished_generation_tokens_total


def test_emulated_backend_reads_locks_and_resets(emulator: EmulatorServer) -> None:
    backend = EmulatedBackend(0, emulator=emulator.url)
    assert isinstance(backend, GpuBackend)
    clocks = backend.supported_clocks_mhz()
    assert clocks[0] == 345 and clocks[-1] == 1980
    sample = backend.sample()
    assert sample.power_w is not None and sample.power_w > 0
    assert sample.energy_j is not None and sample.temperature_c is not None
    assert sample.sm_clock_mhz == 1980 and sample.power_limit_w == 700.0
    backend.lock_clocks(900, 900)
    time.sleep(0.1)  # the plant's actuation delay is 20 ms
    locked = backend.sample()
    assert locked.sm_clock_mhz == 900
    assert locked.clock_event_reasons is not None and locked.clock_event_reasons & 0x2
    assert locked.energy_j is not None and locked.energy_j >= sample.energy_j
    backend.reset_clocks()
    time.sleep(0.1)
    reset = backend.sample()
    assert reset.sm_clock_mhz == 1980 and not (reset.clock_event_reasons or 0) & 0x2
    backend.close()


@pytest.mark.parametrize(
    ("fault", "error"),
    [("no-permission", PermissionDenied), ("not-supported", NotSupported), ("lost", GpuLost)],
)
def test_emulated_backend_maps_nvml_errors(fault: str, error: type[Exception]) -> None:
    server = _serve(fault="lost" if fault == "lost" else fault)
    try:
        if fault == "lost":
            with pytest.raises(GpuLost):
                EmulatedBackend(0, emulator=server.url)
            return
        backend = EmulatedBackend(0, emulator=server.url)
        with pytest.raises(error):
            backend.lock_clocks(900, 900)
        with pytest.raises(error):
            backend.reset_clocks()
        backend.close()
    finally:
        server.close()


def test_gpu_lost_mid_run_raises_on_sample() -> None:
    """A GPU the emulator loses at a time of its run (``--lost-after``) answers until then,
    and every sample after it is a lost GPU. The loss is moved to the current time once the
    backend is open: a fixed 0.3 s came before the open on a loaded machine."""
    server = _serve(lost_after_s=3600.0)
    try:
        backend = EmulatedBackend(0, emulator=server.url)
        assert backend.sample().gpu == backend.label
        state = server.node.gpu_state[0]
        state.lost_at_s = server.node.plant_time_s()
        with pytest.raises(GpuLost):
            backend.sample()
    finally:
        server.close()


def test_unreachable_emulator_is_a_transient_error_and_a_bad_url_an_unavailable_gpu() -> None:
    """An emulator not answering yet is retried at start as an NVML timeout is (the daemon
    gives up with exit 4 after its tries); a URL no emulator can have is refused at once."""
    server = _serve()
    url = server.url
    server.close()
    with pytest.raises(TransientGpuError, match="did not answer"):
        EmulatedBackend(0, emulator=url)
    with pytest.raises(GpuUnavailable):
        EmulatedBackend(5, emulator="ftp://127.0.0.1:1")


def test_two_gpus_are_two_data_parallel_replicas() -> None:
    """--gpus 2: two engines on /metrics (vLLM's engine label, summed by VllmSource), two
    GPUs that lock independently."""
    server = _serve(gpus=2)
    try:
        for _ in range(2):
            _post(
                server.url,
                "/v1/completions",
                {"prompt": "z" * 40, "max_tokens": 3, "ignore_eos": True},
            )
        _, page = _get(server.url, "/metrics")
        text = page.decode()
        assert 'vllm:prompt_tokens_total{engine="0",model_name="gpugov-emulated"} 10.0' in text
        assert 'vllm:prompt_tokens_total{engine="1",model_name="gpugov-emulated"} 10.0' in text
        source = ScrapedSource(f"{server.url}/metrics", "vllm", timeout_s=2.0)
        assert source.scrape().prompt_tokens_total == 20
        source.close()
        first = EmulatedBackend(0, emulator=server.url)
        second = EmulatedBackend(1, emulator=server.url)
        first.lock_clocks(600, 600)
        time.sleep(0.1)
        assert first.sample().sm_clock_mhz == 600
        assert second.sample().sm_clock_mhz == 1980
        first.reset_clocks()
        first.close()
        second.close()
    finally:
        server.close()


def test_gpu_utilization_is_the_busy_share_of_the_last_second() -> None:
    # As NVML's: the share of its last sample period (1 s) in which a kernel ran, not a
    # 0-or-1 reading of the instant.
    now = [0.0]
    node = EmulatedNode(make_plant(), clock=lambda: now[0])
    assert node.gpu_sample(0)["utilization_gpu"] == 0
    node.submit(2000, 300, "length")
    now[0] = 1.0
    assert node.gpu_sample(0)["utilization_gpu"] == 100
    now[0] = 120.0
    assert node.gpu_sample(0)["utilization_gpu"] == 0
    finish = node.simulations[0].result().request_records[0].finish_time_s
    assert finish is not None and finish > 1.5
    now[0] = 0.0
    again = EmulatedNode(make_plant(), clock=lambda: now[0])
    again.submit(2000, 300, "length")
    now[0] = finish + 0.5
    assert 35 <= int(again.gpu_sample(0)["utilization_gpu"]) <= 65  # type: ignore[call-overload]


def test_a_node_sees_a_long_prompt_being_prefilled_through_the_page() -> None:
    """The emulator's page reports a prompt in prefill as vLLM V1 does (a running request,
    not a waiting one); the daemon's observer, reading that page, counts it as backlog and
    not as decode batch."""
    from gpugov.daemon.observer import DomainObserver
    from gpugov.study.emulate.metrics import render_metrics

    now = [0.0]
    node = EmulatedNode(make_plant(), clock=lambda: now[0])
    page = [""]
    source = ScrapedSource("emulated", "vllm", fetch=lambda url, timeout: page[0])
    observer = DomainObserver([IdleGpu()], source, stale_after_s=10.0)

    def observe() -> tuple[int, int, float]:
        with node.lock:
            node.advance()
        page[0] = render_metrics(node, "m")
        seen = observer.observe(now[0], 0, None).observation
        return seen.waiting_requests, seen.decode_active, seen.prefill_remaining_tokens

    # One short request decoding, then a long prompt whose chunks take many steps.
    node.submit(64, 4000, "length")
    now[0] = 0.2
    assert observe()[:2] == (0, 1)
    node.submit(30_000, 10, "length")
    simulation = node.simulations[0]
    for _ in range(200):
        now[0] += 0.005
        with node.lock:
            node.advance()
        if simulation.prefilling_requests:
            break
    assert simulation.prefilling_requests == 1
    state = node.engine_state(0)
    assert (state["running"], state["waiting"]) == (2.0, 0.0)  # as vLLM V1 reports it
    waiting, decoding, backlog = observe()
    assert (waiting, decoding) == (1, 1)
    assert backlog > 0.0
