"""Engine sources: recorded real pages over a local HTTP server, aggregation, errors."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from daemon_support import MetricsServer, fixture_text

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.engine_sources import ScrapedSource, SglangSource, TgiSource, VllmSource
from gpugov.daemon.engines import EngineKind, EngineSource, HistogramTotals, detect_engine
from gpugov.daemon.errors import EngineHttpError, EngineParseError, EngineUnavailable
from gpugov.daemon.exposition import aggregate, parse_page
from gpugov.daemon.observer import DomainObserver


def test_vllm_real_page_over_http(metrics_server: MetricsServer) -> None:
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    source = VllmSource(metrics_server.url, timeout_s=2.0)
    assert isinstance(source, EngineSource)
    sample = source.scrape()
    assert sample.engine == "vllm"
    assert (sample.running_requests, sample.waiting_requests) == (0, 0)
    assert sample.prompt_tokens_total == 80.0
    assert sample.generation_tokens_total == 500.0
    assert sample.finished_requests_total == 10.0
    assert sample.ttft == HistogramTotals(0.205, 10.0)
    assert sample.tpot == HistogramTotals(0.864, 490.0)
    assert sample.kv_capacity_tokens == 551520.0  # kv_cache_size_tokens = 34470 * 16
    assert sample.kv_usage_ratio == 0.0 and sample.kv_tokens == 0.0
    assert sample.model_name == "Qwen/Qwen3-0.6B"  # keys the online MPC's learned model
    assert sample.iterations_total is None  # the page has no tokens-per-step histogram
    assert metrics_server.requests == 1


def test_shared_pages_parse(shared_engine_metrics: Path) -> None:
    vllm = ScrapedSource(
        "file:vllm",
        fetch=lambda url, t: (shared_engine_metrics / "vllm_v1_excerpts.txt").read_text(),
    ).scrape()
    assert vllm.engine == "vllm" and vllm.finished_requests_total == 10.0
    sglang = ScrapedSource(
        "file:sglang",
        fetch=lambda url, t: (shared_engine_metrics / "sglang_docs_sample.txt").read_text(),
    ).scrape()
    assert sglang.engine == "sglang"
    assert (sglang.running_requests, sglang.waiting_requests) == (162, 2826)


def test_sglang_real_page() -> None:
    sample = SglangSource("x", fetch=lambda url, t: fixture_text("sglang_real.txt")).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (162, 2826)
    assert sample.prompt_tokens_total == pytest.approx(8.128902e06)
    assert sample.generation_tokens_total == pytest.approx(7.557572e06)
    assert sample.ttft == HistogramTotals(pytest.approx(2.3518979474117756e06), 11008.0)
    # Older SGLang: TPOT from the deprecated time_per_output_token histogram.
    assert sample.tpot is not None and sample.tpot.count == pytest.approx(7.400757e06)
    # No num_requests_total on this page: finished from the e2e histogram count.
    assert sample.finished_requests_total == 11228.0
    assert sample.kv_usage_ratio == pytest.approx(0.28)
    assert sample.kv_tokens == 123859.0
    assert sample.kv_capacity_tokens == pytest.approx(123859.0 / 0.28)


def test_vllm_data_parallel_engines_are_summed() -> None:
    sample = VllmSource("x", fetch=lambda url, t: fixture_text("vllm_dp2_synthetic.txt")).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (20, 4)
    assert sample.prompt_tokens_total == 100000.0
    assert sample.finished_requests_total == 170.0  # over engines and finished_reason
    assert sample.preemptions_total == 3.0
    assert sample.ttft == HistogramTotals(pytest.approx(60.0), 200.0)
    assert sample.tpot == HistogramTotals(pytest.approx(996.0), 49800.0)
    assert sample.kv_usage_ratio == pytest.approx(0.375)  # a ratio: averaged
    assert sample.kv_capacity_tokens == 320000.0
    assert sample.kv_tokens == pytest.approx(120000.0)
    # Engine steps: the tokens-per-step histogram's count and sum, over both engines.
    assert sample.iterations_total == 5000.0
    assert sample.iteration_tokens_total == 150000.0


def test_vllm_deprecated_aliases() -> None:
    sample = VllmSource(
        "x", fetch=lambda url, t: fixture_text("vllm_legacy_synthetic.txt")
    ).scrape()
    assert sample.kv_usage_ratio == pytest.approx(0.3)
    assert sample.tpot == HistogramTotals(5.0, 100.0)
    assert sample.finished_requests_total == 7.0
    assert sample.ttft is None and sample.prompt_tokens_total is None


def test_sglang_ranks_counted_once() -> None:
    sample = SglangSource(
        "x", fetch=lambda url, t: fixture_text("sglang_ranks_synthetic.txt")
    ).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (10, 5)
    assert sample.prompt_tokens_total == 1000.0
    assert sample.finished_requests_total == 4.0
    assert sample.kv_tokens == 5000.0
    assert sample.kv_capacity_tokens == pytest.approx(20000.0)
    assert sample.tpot == HistogramTotals(2.0, 100.0)


VLLM_LENGTHS_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1250.0
# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="m"} 0.0
vllm:request_generation_tokens_bucket{engine="0",le="500.0",model_name="m"} 3.0
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:request_generation_tokens_count{engine="0",model_name="m"} 4.0
vllm:request_generation_tokens_sum{engine="0",model_name="m"} 1100.0
"""


def test_the_finished_requests_tokens_come_from_the_output_length_histogram() -> None:
    """vLLM counts every generated token as it is made and each finished request's tokens
    in its output-length histogram: the histogram's sum is the finished requests'."""
    sample = VllmSource("x", fetch=lambda url, t: VLLM_LENGTHS_PAGE).scrape()
    assert sample.generation_tokens_total == 1250.0
    assert sample.finished_generation_tokens_total == 1100.0
    assert sample.request_generation_tokens_buckets is not None
    # TGI's generation counter is its output-length histogram's sum: no such pair.
    tgi = TgiSource("x", fetch=lambda url, t: fixture_text("tgi_synthetic.txt")).scrape()
    assert tgi.finished_generation_tokens_total is None


def test_tgi_page() -> None:
    sample = TgiSource("x", fetch=lambda url, t: fixture_text("tgi_synthetic.txt")).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (24, 6)
    assert sample.arrived_requests_total == 150.0
    assert sample.finished_requests_total == 120.0
    assert sample.prompt_tokens_total == 61440.0
    assert sample.tpot == HistogramTotals(3.6, 120.0)
    assert sample.ttft is None
    # Forward passes of both methods (prefill and decode), and their seconds.
    assert sample.iterations_total == 2530.0
    assert sample.prefill_forward_s_total == pytest.approx(9.1)
    assert sample.decode_forward_s_total == pytest.approx(48.0)


def test_forward_seconds_said_by_several_ranks_count_once() -> None:
    """A forward-seconds series said by each rank of one engine (a ``rank`` label) counts
    once, as every other series does (their largest): the ranks' rows were added, and two
    ranks read as twice the engine's prefill and decode seconds. Two engines' rows add."""
    page = fixture_text("tgi_synthetic.txt")
    ranked = "".join(
        line.replace("}", ',rank="0"}') + line.replace("}", ',rank="1"}')
        if line.startswith("tgi_batch_forward_duration_sum")
        else line
        for line in page.splitlines(keepends=True)
    )
    sample = TgiSource("x", fetch=lambda url, t: ranked).scrape()
    assert sample.prefill_forward_s_total == pytest.approx(9.1)
    assert sample.decode_forward_s_total == pytest.approx(48.0)
    engines = ranked.replace('rank="1"', 'shard="1"')
    sample = TgiSource("x", fetch=lambda url, t: engines).scrape()
    assert sample.prefill_forward_s_total == pytest.approx(2 * 9.1)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("vllm_v1_real.txt", "vllm"),
        ("sglang_real.txt", "sglang"),
        ("tgi_synthetic.txt", "tgi"),
    ],
)
def test_auto_detection(name: str, kind: str) -> None:
    source = ScrapedSource("x", "auto", fetch=lambda url, t: fixture_text(name))
    assert source.kind == "auto"
    source.scrape()
    assert source.kind == kind


def test_an_engine_of_another_kind_on_the_same_port_is_detected_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``kind = "auto"``: vLLM detected, then SGLang restarted on the same port. Its pages
    were read as vLLM pages without queue gauges, every scrape a bad one (the fail-safe
    held until the daemon restarted); they are read as SGLang's, with one warning. A kind
    set in the config is not second-guessed, and a page of no engine stays an error."""
    pages = {"now": fixture_text("vllm_v1_real.txt")}
    source = ScrapedSource("http://h/metrics", "auto", fetch=lambda url, t: pages["now"])
    fixed = ScrapedSource("http://h/metrics", "vllm", fetch=lambda url, t: pages["now"])
    assert source.scrape().engine == "vllm" and fixed.scrape().engine == "vllm"
    pages["now"] = fixture_text("sglang_real.txt")
    with caplog.at_level(logging.WARNING):
        assert source.scrape().engine == "sglang"
    assert source.kind == "sglang"
    assert "the engine is now sglang (it was vllm)" in caplog.text
    with pytest.raises(EngineParseError, match="no vllm queue gauges"):
        fixed.scrape()
    pages["now"] = "up 1\n"
    with pytest.raises(EngineParseError, match="no sglang queue gauges"):
        source.scrape()
    assert source.kind == "sglang"


def test_an_engine_kind_that_flips_every_scrape_logs_one_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A URL whose engine kind flips scrape after scrape (a load balancer over a vLLM and
    an SGLang) logged one warning per scrape, 14,400 lines an hour at a 0.25 s period:
    at most one a minute now, the next one counting the changes left out; every page is
    still read as its own engine's."""
    pages = [fixture_text("vllm_v1_real.txt"), fixture_text("sglang_real.txt")]
    now = {"s": 0.0, "scrapes": 0}

    def fetch(url: str, timeout_s: float) -> str:
        now["scrapes"] += 1
        return pages[now["scrapes"] % 2]

    source = ScrapedSource("http://h/metrics", "auto", fetch=fetch, clock=lambda: now["s"])
    kinds = []
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.engines"):
        for tick in range(242):  # a 0.25 s period; a change each scrape after the first
            now["s"] = 0.25 * tick  # the first change at 0.25 s, the next logged at 60.25 s
            kinds.append(source.scrape().engine)
    assert kinds[:4] == ["sglang", "vllm", "sglang", "vllm"]
    lines = [r.getMessage() for r in caplog.records if "the engine is now" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "more change(s) of engine kind" not in lines[0]
    assert "239 more change(s) of engine kind in the 60 s before were not logged" in lines[1]


def test_detect_engine_unknown() -> None:
    assert detect_engine(["node_cpu_seconds_total"]) is None
    source = ScrapedSource("http://h/metrics", fetch=lambda url, t: "up 1\n")
    with pytest.raises(EngineParseError, match="http://h/metrics"):
        source.scrape()


def test_parse_error_names_url_and_line() -> None:
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running 1\n"
        'vllm:num_requests_waiting{a="1" nope\n'
    )
    with pytest.raises(EngineParseError, match=r"http://e/metrics: line 3"):
        VllmSource("http://e/metrics", fetch=lambda url, t: page).scrape()


def test_unused_bad_lines_are_ignored() -> None:
    page = fixture_text("vllm_v1_real.txt") + "some_other_metric{ garbage\n"
    assert VllmSource("x", fetch=lambda url, t: page).scrape().engine == "vllm"


def test_wrong_engine_kind_is_a_parse_error() -> None:
    with pytest.raises(EngineParseError, match="no sglang queue gauges"):
        SglangSource("x", fetch=lambda url, t: fixture_text("vllm_v1_real.txt")).scrape()


def test_refused_connection_is_unavailable(metrics_server: MetricsServer) -> None:
    url = metrics_server.url
    metrics_server.close()
    with pytest.raises(EngineUnavailable, match=url.rsplit("/", 1)[0]):
        VllmSource(url, timeout_s=1.0).scrape()


def test_http_error_and_dropped_connection(metrics_server: MetricsServer) -> None:
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    metrics_server.status = 503
    source = VllmSource(metrics_server.url, timeout_s=2.0)
    with pytest.raises(EngineUnavailable, match="HTTP 503"):
        source.scrape()
    metrics_server.status = 200
    metrics_server.down = True
    with pytest.raises(EngineUnavailable):
        source.scrape()
    metrics_server.down = False
    assert source.scrape().finished_requests_total == 10.0


def test_aggregate_rules() -> None:
    series = parse_page(
        'a{engine="0",tp_rank="0"} 3\na{engine="0",tp_rank="1"} 3\na{engine="1",tp_rank="0"} 4\n'
        'r{engine="0"} 0.2\nr{engine="1"} 0.4\n',
        None,
        "t",
    )
    assert aggregate(series, "a") == 7.0
    assert aggregate(series, "r", "mean") == pytest.approx(0.3)
    assert aggregate(series, "missing") is None


@pytest.mark.parametrize("protocol", ["HTTP/1.0", "HTTP/1.1"])
def test_a_page_cut_short_of_its_content_length_is_a_failed_scrape(protocol: str) -> None:
    """An engine that announces a Content-Length, sends half the body and closes: the
    half page is not parsed as a page (it would lack histograms or end mid-line); the
    scrape fails naming the bytes that came, and the next whole page is read."""
    server = MetricsServer(protocol=protocol)
    try:
        server.page = fixture_text("vllm_v1_real.txt")
        size = len(server.page.encode())
        source = VllmSource(server.url, timeout_s=2.0)
        assert source.scrape().finished_requests_total == 10.0
        server.short_body = True
        with pytest.raises(EngineUnavailable) as cut:
            source.scrape()
        assert str(cut.value) == (
            f"{server.url}: the engine closed the connection mid-page: {size // 2} of "
            f"the {size} bytes its Content-Length announced"
        )
        server.short_body = False
        assert source.scrape().finished_requests_total == 10.0
    finally:
        server.close()


def test_keep_alive_connection_is_reused() -> None:
    server = MetricsServer(protocol="HTTP/1.1")
    try:
        server.page = fixture_text("vllm_v1_real.txt")
        source = VllmSource(server.url, timeout_s=2.0)
        for _ in range(3):
            assert source.scrape().finished_requests_total == 10.0
        assert (server.requests, server.connections) == (3, 1)
        server.status = 500
        with pytest.raises(EngineUnavailable, match="HTTP 500"):
            source.scrape()
        server.status = 200
        assert source.scrape().engine == "vllm"
        source.close()
        assert source.scrape().engine == "vllm"
        assert server.connections == 2
    finally:
        server.close()


def test_https_uses_a_tls_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    import http.client

    import gpugov.daemon.scrape as scrape

    seen: list[tuple[str, int]] = []

    class Refused:
        sock = None

        def __init__(self, host: str, port: int, timeout: float) -> None:
            seen.append((host, port))

        def request(self, *args: object, **kwargs: object) -> None:
            raise ConnectionRefusedError("refused")

        def close(self) -> None: ...

    monkeypatch.setattr(http.client, "HTTPSConnection", Refused)
    monkeypatch.setattr(scrape.socket, "getaddrinfo", lambda *args, **kwargs: [])
    with pytest.raises(EngineUnavailable, match="refused"):
        scrape.KeepAliveFetcher()("https://engine.example:8443/metrics", 1.0)
    assert seen == [("engine.example", 8443)]
    with pytest.raises(EngineUnavailable, match="not an http"):
        scrape.KeepAliveFetcher()("ftp://127.0.0.1/metrics", 1.0)


def test_a_dns_lookup_that_hangs_costs_a_scrape_its_deadline_not_the_loop(
    metrics_server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's host name is looked up with the scrape's deadline. The system's
    resolver has none: a cluster DNS that did not answer held the scrape, and the loop,
    for its timeouts (seconds per try and search domain) past ``stale_after_s``. A lookup
    still running is not started again; once it answers, the scrape connects to what it
    found, the Host header still the name."""
    import socket
    import threading

    import gpugov.daemon.scrape as scrape

    metrics_server.page = "up 1\n"
    port = int(metrics_server.url.rsplit(":", 1)[1].split("/")[0])
    answer = threading.Event()
    lookups: list[str] = []
    real = socket.getaddrinfo

    def hung_dns(host: str, *args: object, **kwargs: object) -> object:
        if host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        lookups.append(host)
        assert answer.wait(30), "the test never answered the lookup"
        return real("127.0.0.1", *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scrape.socket, "getaddrinfo", hung_dns)
    fetch = scrape.KeepAliveFetcher()
    url = f"http://vllm-local.inference.svc.cluster.local:{port}/metrics"
    try:
        for _ in range(2):
            with pytest.raises(EngineUnavailable, match=r"cannot resolve vllm-local.*no answer"):
                fetch(url, 0.05)
        assert not answer.is_set()  # both scrapes returned while the lookup hung
        assert lookups == ["vllm-local.inference.svc.cluster.local"]  # one lookup, not two
    finally:
        answer.set()
    assert fetch(url, 5.0) == "up 1\n"
    assert metrics_server.requests == 1
    with pytest.raises(EngineUnavailable, match=r"cannot resolve no-such-host\.invalid: Name"):
        fetch("http://no-such-host.invalid:1/metrics", 5.0)


def test_series_cache_gives_same_answer_without_reparsing(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpugov.daemon.engines as engines
    import gpugov.daemon.exposition as exposition

    page = fixture_text("vllm_dp2_synthetic.txt")
    wanted = engines.VLLM.wanted()
    cache: exposition.SeriesCache = {}
    first = parse_page(page, wanted, "u", cache)
    assert first == parse_page(page, wanted, "u")
    calls = {"n": 0}
    real = exposition.text_string_to_metric_families

    def counting(text: str):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return real(text)

    monkeypatch.setattr(exposition, "text_string_to_metric_families", counting)
    changed = page.replace(
        'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0',
        'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0',
    )
    again = parse_page(changed, wanted, "u", cache)
    assert calls["n"] == 0
    assert aggregate(again, "vllm:num_requests_waiting") == 10.0
    with pytest.raises(EngineParseError, match="line 9"):
        parse_page(changed.replace("} 9.0", "} nine"), wanted, "u", cache)


def test_each_failure_says_what_happened(metrics_server: MetricsServer) -> None:
    """Refused, dropped, HTTP status, no time given, a page that is not Prometheus text:
    each failure's line names the URL and which."""
    url = metrics_server.url
    port = url.split(":")[2].split("/")[0]
    metrics_server.page = "vllm:num_requests_running{oops 3\n"
    with pytest.raises(EngineUnavailable, match=f"^{url}: line 1 is not Prometheus text"):
        VllmSource(url, timeout_s=2.0).scrape()
    metrics_server.page = "<html>not a metrics page</html>\n"
    with pytest.raises(EngineUnavailable, match=f"^{url}: the page is HTML, not Prometheus"):
        VllmSource(url, timeout_s=2.0).scrape()
    metrics_server.page = "process_cpu_seconds_total 1.5\n"
    with pytest.raises(EngineUnavailable, match=f"^{url}: no vllm queue gauges"):
        VllmSource(url, timeout_s=2.0).scrape()
    metrics_server.status = 503
    with pytest.raises(EngineUnavailable) as http_error:
        VllmSource(url, timeout_s=2.0).scrape()
    assert str(http_error.value) == f"{url}: HTTP 503 Service Unavailable"
    metrics_server.down = True
    with pytest.raises(EngineUnavailable) as dropped:
        VllmSource(url, timeout_s=2.0).scrape()
    assert str(dropped.value) == f"{url}: the engine closed the connection without answering"
    with pytest.raises(EngineUnavailable) as no_time:
        VllmSource(url, timeout_s=2.0).scrape(timeout_s=0.0)
    assert str(no_time.value) == f"{url}: not fetched: a deadline of 0 s"
    metrics_server.close()
    with pytest.raises(EngineUnavailable) as refused:
        VllmSource(url, timeout_s=2.0).scrape()
    assert str(refused.value) == (
        f"{url}: connection refused (nothing listens on 127.0.0.1:{port})"
    )


def _falling(page: str, name: str) -> str:
    """``page`` with every ``name`` bucket rewritten as 1e6 minus its count (so the
    cumulative counts fall as ``le`` rises), as the probe's proxy served it."""
    lines = []
    for line in page.splitlines():
        if line.startswith(f"{name}{{"):
            head, _, value = line.rpartition(" ")
            line = f"{head} {1e6 - float(value)!r}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("source", "fixture", "name"),
    [
        (SglangSource, "sglang_real.txt", "sglang:time_to_first_token_seconds_bucket"),
        (VllmSource, "vllm_dp2_synthetic.txt", "vllm:time_to_first_token_seconds_bucket"),
    ],
    ids=["sglang-real", "vllm"],
)
def test_buckets_that_fall_as_le_rises_are_a_bad_scrape(
    source: type[SglangSource] | type[VllmSource], fixture: str, name: str
) -> None:
    # Trusted, 1e6 minus each count made ~1e6 phantom requests that met the TTFT SLO.
    page = fixture_text(fixture)
    assert source("x", fetch=lambda url, t: page).scrape().ttft_buckets is not None
    falling = _falling(page, name)
    with pytest.raises(EngineParseError, match=f"{name} falls as le rises.*scrape discarded"):
        source("x", fetch=lambda url, t: falling).scrape()


def test_buckets_equal_within_rounding_are_kept() -> None:
    page = fixture_text("sglang_real.txt")
    name = "sglang:time_to_first_token_seconds_bucket"
    # The +Inf bucket a hair below the one before it (float rounding in a counter).
    lines = page.splitlines()
    inf = next(i for i, line in enumerate(lines) if line.startswith(name) and '"+Inf"' in line)
    before = float(lines[inf - 1].rpartition(" ")[2])
    lines[inf] = f"{lines[inf].rpartition(' ')[0]} {before * (1 - 1e-12)!r}"
    sample = SglangSource("x", fetch=lambda url, t: "\n".join(lines) + "\n").scrape()
    assert sample.ttft_buckets is not None


def test_buckets_of_engines_one_of_which_lacks_its_total_are_not_summed() -> None:
    # Engine 1's TTFT series without its +Inf bucket: its 40 fast first tokens were added
    # to the 0.1 s bucket and its 88 not to the total, so 90 of 112 read as met (80 %)
    # where 90 of 200 were; a larger count read above 100 %, a controller's licence to
    # lower the clock.
    lines = [
        line
        for line in fixture_text("vllm_dp2_synthetic.txt").splitlines()
        if not line.startswith('vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"')
    ]
    sample = VllmSource("x", fetch=lambda url, t: "\n".join(lines) + "\n").scrape()
    assert sample.ttft_buckets is None
    assert sample.tpot_buckets is not None and (sample.running_requests, sample.engines) == (20, 2)


def _gauge_set(page: str, name: str, value: str) -> str:
    """``page`` with the first series of gauge ``name`` set to ``value``."""
    lines = page.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{name}{{"))
    lines[first] = f"{lines[first].rpartition(' ')[0]} {value}"
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("source", "fixture", "name"),
    [
        (VllmSource, "vllm_dp2_synthetic.txt", "vllm:num_requests_waiting"),
        (VllmSource, "vllm_dp2_synthetic.txt", "vllm:num_requests_running"),
        (SglangSource, "sglang_real.txt", "sglang:num_queue_reqs"),
        (SglangSource, "sglang_pd_decode_synthetic.txt", "sglang:num_decode_prealloc_queue_reqs"),
    ],
    ids=["vllm-waiting", "vllm-running", "sglang-queue", "sglang-pd-queue"],
)
@pytest.mark.parametrize("value", ["1.8446744073709552e+19", "4294967295", "1e308"])
def test_a_queue_gauge_above_any_engine_is_a_bad_scrape(
    source: type[SglangSource] | type[VllmSource], fixture: str, name: str, value: str
) -> None:
    # Read as requests, an unsigned gauge wrapped below zero made the prompt backlog
    # infinite (1e308 x the mean prompt) and the arrivals ~1.8e19: no bad scrape.
    page = fixture_text(fixture)
    source("x", fetch=lambda url, t: page).scrape()
    wrapped = _gauge_set(page, name, value)
    with pytest.raises(EngineParseError, match=f"impossible value {name}.*more requests"):
        source("x", fetch=lambda url, t: wrapped).scrape()


def test_a_long_queue_is_read() -> None:
    page = _gauge_set(fixture_text("vllm_dp2_synthetic.txt"), "vllm:num_requests_waiting", "1e6")
    assert VllmSource("x", fetch=lambda url, t: page).scrape().waiting_requests == 1_000_001


def test_a_page_that_starts_with_a_byte_order_mark_reads_whole(
    metrics_server: MetricsServer,
) -> None:
    # The mark glued itself to the first sample name: that line (engine 0's running
    # gauge, 12 of the 20 requests) was passed over unread.
    page = "\n".join(
        line
        for line in fixture_text("vllm_dp2_synthetic.txt").splitlines()
        if not line.startswith("#")
    )
    assert page.startswith('vllm:num_requests_running{engine="0"')
    metrics_server.page = "\ufeff" + page + "\n"
    sample = VllmSource(metrics_server.url, timeout_s=2.0).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (20, 4)


def test_a_gzip_encoded_page_is_decompressed(metrics_server: MetricsServer) -> None:
    # A server or proxy that compresses though the request asks for no encoding: the page
    # was refused as "not UTF-8 ... byte 0x8b", which sent the operator to the labels.
    metrics_server.page = fixture_text("vllm_dp2_synthetic.txt")
    metrics_server.encoding = "gzip"
    sample = VllmSource(metrics_server.url, timeout_s=2.0).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (20, 4)


def test_a_gzip_page_in_several_members_is_read_whole(metrics_server: MetricsServer) -> None:
    # Only the first member was decompressed: the rest of the page was dropped (here the
    # page ended mid-line, a bad scrape; cut at a line's end, its series went unread).
    metrics_server.page = fixture_text("vllm_dp2_synthetic.txt")
    metrics_server.encoding = "gzip"
    metrics_server.gzip_members = 2
    sample = VllmSource(metrics_server.url, timeout_s=2.0).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (20, 4)


def test_a_url_with_characters_outside_ascii_is_requested_percent_encoded(
    metrics_server: MetricsServer,
) -> None:
    # http.client sends ASCII only: the scrape raised UnicodeEncodeError, which no
    # handler took for a failed scrape, and `gpugov run` ended in a traceback.
    metrics_server.page = fixture_text("vllm_dp2_synthetic.txt")
    url = metrics_server.url + "?model=café"
    sample = VllmSource(url, timeout_s=2.0).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (20, 4)
    assert metrics_server.paths == ["/metrics?model=caf%C3%A9"]


def test_a_page_in_another_encoding_names_it(metrics_server: MetricsServer) -> None:
    metrics_server.page = fixture_text("vllm_dp2_synthetic.txt")
    metrics_server.encoding = "br"
    with pytest.raises(EngineParseError, match=r"br-encoded .*decodes only gzip"):
        VllmSource(metrics_server.url, timeout_s=2.0).scrape()


def test_a_gzip_page_past_the_size_limit_is_refused(metrics_server: MetricsServer) -> None:
    # A few KB compressed, megabytes once decompressed: the limit is on the page.
    metrics_server.page = fixture_text("vllm_dp2_synthetic.txt") + "x 1\n" * 300_000
    metrics_server.encoding = "gzip"
    with pytest.raises(EngineParseError, match="over the 100000-byte limit"):
        ScrapedSource(metrics_server.url, "vllm", timeout_s=2.0, max_page_bytes=100_000).scrape()


def test_sglang_v035_names() -> None:
    """SGLang v0.3.5 named its queue gauges num_requests_running / num_requests_waiting
    and its per-request length histograms request_prompt_tokens / request_generation_tokens
    (renamed in the collector rewrite after it); its page was refused as "no sglang queue
    gauges"."""
    source = ScrapedSource("x", fetch=lambda url, t: fixture_text("sglang_v035_synthetic.txt"))
    sample = source.scrape()
    assert source.kind == "sglang"
    assert (sample.running_requests, sample.waiting_requests) == (42, 7)
    assert sample.prompt_tokens_total == 230794.0
    assert sample.generation_tokens_total == 61200.0
    assert sample.ttft == HistogramTotals(pytest.approx(171.3), 450.0)
    assert sample.tpot == HistogramTotals(pytest.approx(1524.6), 60750.0)
    assert sample.tpot_buckets is not None and not sample.tpot_buckets_per_request
    # No success counter is incremented in this release: finished from the e2e count.
    assert sample.finished_requests_total == 440.0
    assert sample.request_prompt_tokens_buckets is not None
    assert sample.request_prompt_tokens_buckets[-1] == (math.inf, 440.0)
    # Its generation counter counts tokens as they are made: the output-length histogram's
    # sum is the finished requests' share.
    assert sample.finished_generation_tokens_total == 56700.0
    assert sample.kv_usage_ratio == pytest.approx(0.31)
    # Its model is in its label "name" (the collector rewrite renamed it model_name): it
    # was None, so the page gave the online controller no model name, hint or key.
    assert sample.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    # Its capacity gauge, where the usage rounded to 0.31 gave another.
    assert sample.kv_capacity_tokens == 570979.0


def test_a_vllm_cache_of_zero_blocks_is_no_kv_capacity() -> None:
    """A page whose ``cache_config_info`` says 0 blocks (before the engine sized its cache)
    gave a KV capacity of 0 tokens, which a recording then carried and replay and plot
    refuse: it is not known (None), as without the row."""
    page = fixture_text("vllm_v0_synthetic.txt").replace(
        'num_gpu_blocks="27895"', 'num_gpu_blocks="0"'
    )
    assert 'num_gpu_blocks="0"' in page
    sample = VllmSource("x", fetch=lambda url, t: page).scrape()
    assert sample.kv_capacity_tokens is None


def test_a_vllm_cache_size_of_none_falls_back_to_the_blocks() -> None:
    """vLLM writes ``kv_cache_size_tokens="None"`` where its config holds no size (the
    field is optional): the row was passed over though its ``num_gpu_blocks`` and
    ``block_size`` give the capacity, and the KV capacity and tokens were not known."""
    page = fixture_text("vllm_dp2_synthetic.txt")
    assert 'num_gpu_blocks="10000"' in page and "kv_cache_size_tokens" not in page
    known = VllmSource("x", fetch=lambda url, t: page).scrape()
    assert known.kv_capacity_tokens is not None
    sized = page.replace(
        'num_gpu_blocks="10000"', 'kv_cache_size_tokens="None",num_gpu_blocks="10000"'
    )
    assert sized.count("kv_cache_size_tokens") == page.count('num_gpu_blocks="10000"')
    sample = VllmSource("x", fetch=lambda url, t: sized).scrape()
    assert sample.kv_capacity_tokens == known.kv_capacity_tokens
    assert sample.kv_tokens == known.kv_tokens


def test_a_vllm_cache_beyond_any_engine_is_no_kv_capacity() -> None:
    # num_gpu_blocks wrapped below zero: 5.9e20 tokens of capacity, and the engines' KV
    # tokens with it (usage x capacity), went to the controller as the node's cache.
    page = fixture_text("vllm_dp2_synthetic.txt")
    assert VllmSource("x", fetch=lambda url, t: page).scrape().kv_tokens == 120_000.0
    wrapped = page.replace('num_gpu_blocks="10000"', 'num_gpu_blocks="18446744073709551615"')
    sample = VllmSource("x", fetch=lambda url, t: wrapped).scrape()
    assert sample.kv_capacity_tokens is None and sample.kv_tokens is None


def test_kv_tokens_beyond_any_engine_are_a_bad_scrape() -> None:
    page = fixture_text("sglang_real.txt")
    assert SglangSource("x", fetch=lambda url, t: page).scrape().kv_tokens == 123_859.0
    wrapped = _gauge_set(page, "sglang:num_used_tokens", "1.8446744073709552e+19")
    with pytest.raises(EngineParseError, match="impossible KV cache tokens"):
        SglangSource("x", fetch=lambda url, t: wrapped).scrape()


def test_vllm_v0_swapped_requests_are_waiting() -> None:
    """A V0-engine vLLM moves preempted requests to CPU memory (swap preemption): they
    are in vllm:num_requests_swapped, in neither the running nor the waiting gauge, and
    wait to resume; left out, a full cache read as requests finishing, and a domain with
    only swapped requests as idle."""
    sample = VllmSource("x", fetch=lambda url, t: fixture_text("vllm_v0_synthetic.txt")).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (24, 5 + 3)
    assert sample.kv_usage_ratio == pytest.approx(0.985)  # the deprecated alias
    assert sample.kv_capacity_tokens == 27895.0 * 16  # num_gpu_blocks x block_size
    assert sample.tpot == HistogramTotals(pytest.approx(4410.2), 157370.0)
    assert not sample.tpot_buckets_per_request  # per inter-token interval
    assert sample.ttft == HistogramTotals(pytest.approx(243.7), 630.0)
    assert sample.finished_requests_total == 598.0
    assert sample.preemptions_total == 17.0
    assert sample.model_name == "meta-llama/Meta-Llama-3-8B-Instruct"


def test_sglang_generation_counter_counts_at_finish() -> None:
    """Since its collector rewrite SGLang adds a request's generated tokens to
    sglang:generation_tokens_total when the request finishes, the number its output-length
    histogram observes: the two are equal, and their difference is not the tokens of the
    requests in flight (it read 0 with 30 requests decoding)."""
    sample = SglangSource(
        "x", fetch=lambda url, t: fixture_text("sglang_v05_synthetic.txt")
    ).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (30, 4)
    assert sample.generation_tokens_total == 412000.0
    assert sample.finished_generation_tokens_total is None
    # The histograms are still read: the per-request energy split uses them.
    assert sample.request_generation_tokens_buckets is not None
    assert sample.request_prompt_tokens_buckets is not None
    assert sample.ttft == HistogramTotals(pytest.approx(302.8), 1130.0)
    assert sample.tpot == HistogramTotals(pytest.approx(11950.0), 412000.0)
    assert sample.finished_requests_total == 1100.0
    assert sample.model_name == "Qwen/Qwen3-32B" and sample.role == "colocated"
    # The observer estimates the in-flight tokens instead: running x mean output / 2.
    observer = DomainObserver(
        [_IdleGpu()],
        SglangSource("x", fetch=lambda url, t: fixture_text("sglang_v05_synthetic.txt")),
        stale_after_s=3.0,
    )
    generated = observer.observe(0.0, 0, None).observation.generated_decode_tokens
    assert generated == pytest.approx(30 * (412000.0 / 1100.0) / 2)


class _IdleGpu:
    """A GpuBackend whose samples say nothing (the engine side is under test)."""

    label = "0"

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return (900, 1980)

    def sample(self) -> GpuSample:
        return GpuSample(gpu=self.label)

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self) -> None: ...

    def close(self) -> None: ...


OPENMETRICS_PAGE = """\
# TYPE vllm:num_requests_running gauge
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m \\\\ \\"quoted\\" {x} # y"} 1.0 1700000000.123
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 4000.0 # {trace_id="a1"} 12.0 1700000000.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total 500.0 # {trace_id="d4"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 60.0 # {trace_id="b2"} 0.31
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 100.0 # {trace_id="c3"} 7.5
vllm:time_to_first_token_seconds_count{model_name="m"} 100.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 60.0
vllm:time_to_first_token_seconds_created{model_name="m"} 1.7e+09
# EOF
"""


def test_openmetrics_page_reads_the_same_on_every_scrape() -> None:
    """A page in OpenMetrics text (a server or proxy that ignores the Accept header):
    exemplars after a value (`# {trace_id=...} value ts`), timestamps, `_created` series,
    escaped label values and `# EOF`. A series seen before reuses its parsed labels and
    reads only its value; with an exemplar it read the exemplar's value instead (the 0.5 s
    bucket 0.31 of 60 requests, the prompt counter 12 of 4000)."""
    source = VllmSource("x", fetch=lambda url, t: OPENMETRICS_PAGE)
    first, second, third = source.scrape(), source.scrape(), source.scrape()
    for sample in (first, second, third):
        assert (sample.running_requests, sample.waiting_requests) == (3, 1)
        assert sample.prompt_tokens_total == 4000.0
        assert sample.generation_tokens_total == 500.0
        assert sample.ttft == HistogramTotals(60.0, 100.0)
        assert sample.ttft_buckets == ((0.5, 60.0), (math.inf, 100.0))


def test_a_page_without_what_the_governor_needs_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A page that parses but lacks series the governor reads (here an older vLLM's: no
    TTFT histogram, no token counters) gives one WARNING naming them and the names looked
    for, not one per scrape; a page that gains them says so once."""
    pages = {"page": fixture_text("vllm_legacy_synthetic.txt")}
    source = VllmSource("http://e/metrics", fetch=lambda url, t: pages["page"])
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.engines"):
        source.scrape()
        source.scrape()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("http://e/metrics: the vllm page lacks ")
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert name in line
    assert "vllm:num_requests_waiting" not in line  # present
    caplog.clear()
    pages["page"] = fixture_text("vllm_dp2_synthetic.txt")
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.engines"):
        source.scrape()
        source.scrape()
    assert [r.getMessage() for r in caplog.records] == [
        "http://e/metrics: the vllm page now has every series the governor reads"
    ]


def test_a_url_whose_pages_lack_series_now_and_then_logs_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A load balancer over two engines, one publishing fewer series: a WARNING and an
    # INFO every scrape, 36,000 lines an hour at a 0.2 s period.
    pages = [fixture_text("vllm_legacy_synthetic.txt"), fixture_text("vllm_dp2_synthetic.txt")]
    now = [0.0]
    source = ScrapedSource(
        "http://e/metrics",
        "vllm",
        fetch=lambda url, t: pages[round(now[0] / 0.2) % 2],
        clock=lambda: now[0],
    )
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.engines"):
        for step in range(600):  # two minutes
            now[0] = step * 0.2
            source.scrape()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO] * 2
    assert "page lacks " in lines[0][1] and "not logged" not in lines[0][1]
    assert lines[2][1].endswith(
        "(149 more page(s) lacking series in the 60 s before were not logged: does this URL "
        "reach engines that publish different series (a load balancer)?)"
    )


def test_a_page_that_lacks_series_again_within_the_minute_says_so_once_it_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pages = {"page": fixture_text("vllm_legacy_synthetic.txt")}
    now = [0.0]
    source = ScrapedSource(
        "http://e/metrics", "vllm", fetch=lambda url, t: pages["page"], clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.engines"):
        source.scrape()
        pages["page"] = fixture_text("vllm_dp2_synthetic.txt")
        source.scrape()  # back: said at once
        pages["page"] = fixture_text("vllm_legacy_synthetic.txt")
        for step in range(1, 300):  # lacking again, within the minute: left out so far
            now[0] = step * 0.2
            source.scrape()
        assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
        now[0] = 60.0  # it lasts: said once its minute is up
        source.scrape()
        source.scrape()
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO, logging.WARNING]
    assert "page lacks " in caplog.records[2].getMessage()


def test_a_complete_page_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="gpugov.daemon.engines"):
        VllmSource("x", fetch=lambda url, t: fixture_text("vllm_dp2_synthetic.txt")).scrape()
        SglangSource("x", fetch=lambda url, t: fixture_text("sglang_real.txt")).scrape()
    assert caplog.records == []


@pytest.mark.parametrize(
    ("fixture", "kind", "gauge", "message"),
    [
        (
            "vllm_dp2_synthetic.txt",
            "vllm",
            "vllm:num_requests_waiting",
            "the vllm page has its running requests gauge but no waiting requests gauge "
            "(vllm:num_requests_waiting): the waiting requests are not known",
        ),
        (
            "vllm_dp2_synthetic.txt",
            "vllm",
            "vllm:num_requests_running",
            "the vllm page has its waiting requests gauge but no running requests gauge "
            "(vllm:num_requests_running): the running requests are not known",
        ),
        (
            "sglang_real.txt",
            "sglang",
            "sglang:num_queue_reqs",
            "the sglang page has its running requests gauge but no waiting requests gauge "
            "(sglang:num_queue_reqs or sglang:num_requests_waiting): the waiting requests "
            "are not known",
        ),
        (
            "tgi_synthetic.txt",
            "tgi",
            "tgi_queue_size",
            "the tgi page has its running requests gauge but no waiting requests gauge "
            "(tgi_queue_size): the waiting requests are not known",
        ),
    ],
)
def test_a_page_with_one_queue_gauge_is_a_bad_scrape(
    fixture: str, kind: EngineKind, gauge: str, message: str
) -> None:
    """A page with one queue gauge read the missing one as 0 (with a warning): a backlog
    read as an empty queue, so a controller lowered the clock. It is a bad scrape that
    names the gauge: the last good data is kept and the fail-safe takes over when it
    goes stale."""
    page = (
        "\n".join(line for line in fixture_text(fixture).splitlines() if not line.startswith(gauge))
        + "\n"
    )
    with pytest.raises(EngineParseError) as caught:
        ScrapedSource("http://e/metrics", kind, fetch=lambda url, t: page).scrape()
    assert str(caught.value) == f"http://e/metrics: {message} (never read as 0); scrape discarded"
    observer = DomainObserver(
        [_IdleGpu()],
        ScrapedSource("http://e/metrics", fetch=lambda url, t: page),
        stale_after_s=3.0,
    )
    observed = observer.observe(0.0, 0, None)
    assert not observed.engine_fresh and observed.engine_error is not None
    assert message in observed.engine_error


def test_tgi_before_v14_counts_forward_passes_by_inference_calls() -> None:
    """TGI before v1.4 has no tgi_batch_forward_duration; each prefill and decode call is
    one observation of tgi_batch_inference_duration{method}, so the engine steps are its
    count (the seconds are not forward seconds: they include filtering and decoding)."""
    sample = TgiSource("x", fetch=lambda url, t: fixture_text("tgi_v1_synthetic.txt")).scrape()
    assert (sample.running_requests, sample.waiting_requests) == (9, 3)
    assert (sample.arrived_requests_total, sample.finished_requests_total) == (310.0, 296.0)
    assert sample.tpot == HistogramTotals(8.6, 296.0)
    assert sample.tpot_buckets_per_request and sample.tpot_buckets is not None
    assert sample.iterations_total == 250.0 + 61000.0
    assert sample.prefill_forward_s_total is None and sample.decode_forward_s_total is None


def test_a_redirect_names_the_url_to_configure() -> None:
    """An engine whose page is mounted with a trailing slash answers ``/metrics`` with a
    307 to ``/metrics/`` (Starlette's mount, prometheus/client_python#1016). The scrape
    said only ``HTTP 307 Temporary Redirect``; it names where to and the URL to set."""
    import http.server
    import threading

    import gpugov.daemon.scrape as scrape

    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", "/metrics/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        with pytest.raises(EngineHttpError) as raised:
            scrape.KeepAliveFetcher()(url, 5.0)
    finally:
        server.shutdown()
        server.server_close()
    assert str(raised.value) == (
        f"{url}: HTTP 307 Temporary Redirect to {url}/; gpugov follows no redirect: "
        f"set engine.url to {url}/"
    )


def test_a_redirect_to_no_url_is_a_failed_scrape_that_quotes_it(
    metrics_server: MetricsServer,
) -> None:
    # urljoin raised ValueError on the Location, past every handler of a failed scrape:
    # `gpugov run` ended in a traceback.
    metrics_server.status = 302
    metrics_server.headers["Location"] = "http://[bad"
    with pytest.raises(EngineHttpError) as raised:
        VllmSource(metrics_server.url, timeout_s=2.0).scrape()
    assert str(raised.value).startswith(
        f"{metrics_server.url}: HTTP 302 Found to 'http://[bad', which is no URL ("
    )


def test_a_page_read_in_blocks_parses_as_one_and_names_a_bad_line_of_a_later_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wanted lines go to the parser a block at a time (so a huge page can be given
    up at its deadline); the series, the cache and a bad line's number are those of one
    parse of the whole page."""
    import gpugov.daemon.engines as engines
    import gpugov.daemon.exposition as exposition

    page = fixture_text("vllm_dp2_synthetic.txt")
    wanted = engines.VLLM.wanted()
    whole: exposition.SeriesCache = {}
    expected = parse_page(page, wanted, "u", whole)
    monkeypatch.setattr(exposition, "CHECK_EVERY", 3)
    blocks: exposition.SeriesCache = {}
    assert parse_page(page, wanted, "u", blocks, deadline=1.0, clock=lambda: 0.0) == expected
    assert blocks == whole
    lines = page.split("\n")
    last = max(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_waiting"))
    lines[last] = lines[last].rsplit(" ", 1)[0] + " nine"
    with pytest.raises(EngineParseError, match=f"line {last + 1} is not Prometheus text"):
        parse_page("\n".join(lines), wanted, "u", deadline=1.0, clock=lambda: 0.0)


def test_a_page_still_being_read_at_the_scrape_deadline_is_a_late_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One deadline covers the fetch and the reading of the page: a page too large to
    read in time (hundreds of thousands of series: seconds of parsing) is a timed-out
    scrape, given up at the deadline, not a loop stalled for seconds on data then taken
    as fresh. The same page read in time is taken."""
    import gpugov.daemon.exposition as exposition

    monkeypatch.setattr(exposition, "CHECK_EVERY", 3)
    page = fixture_text("vllm_dp2_synthetic.txt")
    now = {"s": 0.0}
    reads: list[float] = []

    def clock() -> float:
        reads.append(now["s"])
        return now["s"]

    def fetch(url: str, timeout_s: float) -> str:
        now["s"] += 0.1  # the fetch itself: in time
        return page

    source = ScrapedSource("http://e/metrics", "vllm", timeout_s=0.25, fetch=fetch, clock=clock)
    original = exposition._split_value

    def slow_split(line: str) -> tuple[str, str]:  # each line takes 1 s to read
        now["s"] += 1.0
        return original(line)

    monkeypatch.setattr(exposition, "_split_value", slow_split)
    with pytest.raises(EngineUnavailable, match="timed out") as caught:
        source.scrape()
    assert not isinstance(caught.value, EngineParseError)
    message = str(caught.value)
    assert message.startswith("http://e/metrics: timed out: its page (")
    assert f"({len(page)} characters) was not read within 0.25 s" in message
    assert len(reads) <= 3  # given up at the first look at the clock past the deadline
    monkeypatch.setattr(exposition, "_split_value", original)
    now["s"] = 0.0
    expected = VllmSource("http://e/metrics", fetch=lambda url, t: page).scrape()
    assert source.scrape() == expected  # read in time: taken


def test_a_page_read_past_its_deadline_before_extraction_is_a_late_scrape() -> None:
    """A page whose lines were all read but only after the deadline (fewer lines than
    one look at the clock covers) is late too, and so is one whose extraction ran past
    it: the check after the whole read."""
    page = fixture_text("vllm_dp2_synthetic.txt")
    times = iter([0.0, 0.3])  # the deadline set at 0; read at 0.3 s
    source = ScrapedSource(
        "http://e/metrics", "vllm", timeout_s=0.25, fetch=lambda url, t: page,
        clock=lambda: next(times, 0.3),
    )  # fmt: skip
    with pytest.raises(EngineUnavailable, match=r"timed out: its page \(\d+ characters\)"):
        source.scrape()


def test_the_engine_is_detected_from_the_page_without_splitting_it() -> None:
    """Detection reads each prefix at a line's start, as detect_engine does of the page's
    sample names: a comment naming an engine is no engine, vLLM wins over the others."""
    from gpugov.daemon.engines import detect_engine_on_page

    assert detect_engine_on_page("# HELP vllm:x help\nup 1\n") is None
    assert detect_engine_on_page("up 1\nsglang:num_running_reqs 1\n") == "sglang"
    assert detect_engine_on_page("tgi_queue_size 1\nvllm:x 1\n") == "vllm"
    assert detect_engine_on_page("tgi_queue_size 1\r\n") == "tgi"
    assert detect_engine_on_page(" \tvllm:x 1\n") == "vllm"  # leading blanks are ignored
    for name in ("vllm_v1_real.txt", "vllm_dp2_synthetic.txt"):
        assert detect_engine_on_page(fixture_text(name)) == "vllm"


def test_buckets_of_engines_with_different_bounds_are_summed_on_the_bounds_they_share() -> None:
    """Summed bound by bound, a bound one engine's series lacks (a layout of its own, a
    line the page dropped) held only the other's count: the histogram fell as ``le``
    rose (100 first tokens at or under 0.1 s, 60 at or under 0.5 s) and the attainment
    read it as buckets of negative counts. The bounds every series has are summed."""
    extra = (
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",'
        'model_name="meta-llama/Llama-3.1-8B-Instruct"} 60.0'
    )
    lines = []
    for line in fixture_text("vllm_dp2_synthetic.txt").splitlines():
        if line.startswith('vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"'):
            lines.append(extra)
        lines.append(line)
    sample = VllmSource("x", fetch=lambda url, t: "\n".join(lines) + "\n").scrape()
    assert sample.ttft_buckets == ((0.1, 90.0), (math.inf, 200.0))


def test_a_line_longer_than_any_metrics_line_is_refused_unread() -> None:
    """prometheus_client's parser takes time quadratic in a line's labels and one line
    cannot be given up at the deadline: a 2.3 MB page whose running gauge had 200,000
    labels held the scrape, and the loop, 23 s against a 0.5 s deadline. Such a line is
    a bad page, said in one line naming it, before any of it is parsed."""
    import time

    from gpugov.daemon.exposition import MAX_LINE_CHARS

    labels = ",".join(f'a{i}="b"' for i in range(200_000))
    page = f"# HELP x\nvllm:num_requests_waiting 1\nvllm:num_requests_running{{{labels}}} 1\n"
    source = VllmSource("http://e/metrics", fetch=lambda url, t: page, timeout_s=0.5)
    started = time.perf_counter()
    with pytest.raises(EngineParseError) as caught:
        source.scrape()
    assert time.perf_counter() - started < 2.0
    assert str(caught.value) == (
        f"http://e/metrics: line 3 (vllm:num_requests_running) is {len(page.splitlines()[2])} "
        f"characters, longer than any metrics line ({MAX_LINE_CHARS}); scrape discarded"
    )


def test_long_lines_are_parsed_in_blocks_the_deadline_can_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clock was read every 2048 lines: 300 lines of 29 KB each (3,000 labels, under
    the line limit) were one block, parsed whole in 6 s past a 0.25 s deadline. A block
    also ends at :data:`BLOCK_CHARS` characters, so the page is given up after the first."""
    import gpugov.daemon.exposition as exposition

    labels = ",".join(f'a{i}="b"' for i in range(3000))
    page = "".join(f'vllm:num_requests_running{{engine="{k}",{labels}}} 1\n' for k in range(300))
    now = {"s": 0.0}
    parsed: list[int] = []
    original = exposition._parse_block

    def slow_block(block: list, padded: str, source: str) -> list:  # type: ignore[type-arg]
        now["s"] += 1.0  # each block takes a second to parse
        parsed.append(sum(m.end() - m.start() for m in block))
        return original(block, padded, source)

    monkeypatch.setattr(exposition, "_parse_block", slow_block)
    source = ScrapedSource(
        "http://e/metrics", "vllm", timeout_s=0.25, fetch=lambda url, t: page,
        clock=lambda: now["s"],
    )  # fmt: skip
    with pytest.raises(EngineUnavailable, match="timed out"):
        source.scrape()
    assert len(parsed) == 1 and parsed[0] <= exposition.BLOCK_CHARS


def test_many_engines_kv_rows_are_matched_without_trying_every_pair() -> None:
    """Each engine's KV usage was matched against every ``cache_config_info`` row: a page
    of 2,000 engines (label churn, 340 KB), read in a third of a second, then took 3.6 s
    to extract, past the scrape's deadline and holding the loop. Matched by the values
    of the labels they share, it takes no longer than the reading."""
    import time

    engines = 2000
    page = "".join(
        f'vllm:num_requests_running{{engine="{k}"}} 1\n'
        f'vllm:num_requests_waiting{{engine="{k}"}} 0\n'
        f'vllm:kv_cache_usage_perc{{engine="{k}"}} 0.5\n'
        f'vllm:cache_config_info{{block_size="16",engine="{k}",num_gpu_blocks="10"}} 1\n'
        for k in range(engines)
    )
    source = VllmSource("http://e/metrics", fetch=lambda url, t: page, timeout_s=30.0)
    started = time.perf_counter()
    sample = source.scrape()
    assert time.perf_counter() - started < 2.0
    assert sample.engines == engines
    assert sample.kv_capacity_tokens == engines * 160.0
    assert sample.kv_tokens == engines * 80.0


def test_kv_usage_reported_by_several_processes_counts_each_engines_cache_once() -> None:
    """vLLM with several API servers runs prometheus_client in multiprocess mode, where a
    gauge without a multiprocess mode (``vllm:kv_cache_usage_perc`` in some releases) is
    written once per process, labelled ``pid``: each process's row of an engine was
    matched to that engine's cache and added, so two processes read the KV tokens twice
    over and the usage at twice its value (0.67 of the caches for 0.33). An engine's
    rows share its cache: their mean is its usage."""
    page = "".join(
        f'vllm:num_requests_running{{engine="{k}",model_name="m"}} 1\n'
        f'vllm:num_requests_waiting{{engine="{k}",model_name="m"}} 0\n'
        f'vllm:cache_config_info{{block_size="16",engine="{k}",num_gpu_blocks="{blocks}"}} 1\n'
        + "".join(
            f'vllm:kv_cache_usage_perc{{engine="{k}",model_name="m",pid="{pid}"}} {usage}\n'
            for pid in (4101, 4102)
        )
        for k, blocks, usage in ((0, 1000, 0.5), (1, 2000, 0.25))
    )
    sample = VllmSource("http://e/metrics", fetch=lambda url, t: page).scrape()
    assert sample.kv_capacity_tokens == 48_000.0
    assert sample.kv_tokens == pytest.approx(0.5 * 16_000 + 0.25 * 32_000)
    assert sample.kv_usage_ratio == pytest.approx(1 / 3)


def test_a_label_value_with_a_newline_is_quoted_escaped_in_the_error_line() -> None:
    """A label value holding a newline (escaped ``\\n`` on the page) was quoted as it
    parsed: the error line that names the series broke in two, its second half a log
    line of the page's making. The series is quoted as the page writes it."""
    page = (
        'vllm:num_requests_running{model_name="m\\ngpugov: every clock was reset \\"ok\\""} NaN\n'
        'vllm:num_requests_waiting{model_name="m"} 0\n'
    )
    with pytest.raises(EngineParseError) as caught:
        VllmSource("http://e/metrics", fetch=lambda url, t: page).scrape()
    message = str(caught.value)
    assert "\n" not in message
    assert 'model_name="m\\ngpugov: every clock was reset \\"ok\\""' in message


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (
            b"SSH-2.0-OpenSSH_9.6\r\n",
            "not an HTTP answer (BadStatusLine: 'SSH-2.0-OpenSSH_9.6\\r\\n')",
        ),
        (b"HTTP/1.1 500 " + b"x" * 5000 + b"\r\nContent-Length: 0\r\n\r\n", "HTTP 500 'xxx"),
    ],
    ids=["not-http", "long-reason"],
)
def test_what_the_server_said_is_quoted_on_one_short_line(answer: bytes, shown: str) -> None:
    """Something other than an engine on the port (an SSH server) answered a status line
    that went into the failure's line as it came, its CRLF breaking the log line; a
    reason phrase of kilobytes was quoted whole. Quoted escaped and cut to 200 characters."""
    import socket
    import threading

    import gpugov.daemon.scrape as scrape

    listener = socket.create_server(("127.0.0.1", 0))

    def answer_once() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    threading.Thread(target=answer_once, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    try:
        with pytest.raises(EngineUnavailable) as raised:
            scrape.KeepAliveFetcher()(url, 5.0)
    finally:
        listener.close()
    message = str(raised.value)
    assert "\n" not in message and "\r" not in message
    assert shown in message
    assert len(message) < len(url) + 300


def test_a_tgi_that_has_served_no_request_is_said_to_be_one() -> None:
    """TGI's router sets its queue gauges when a request first arrives (metrics-rs
    registers a series at its first use): a TGI that has served none has neither, nor
    any other ``tgi_`` series. Its node held the fail-safe with a line that blamed the
    engine kind or metrics not enabled; the line now says a TGI publishes them from its
    first request on (the fail-safe still holds: nothing on the page is read as 0)."""
    page = "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\n"
    with pytest.raises(EngineParseError) as configured:
        TgiSource("http://e/metrics", fetch=lambda url, t: page).scrape()
    with pytest.raises(EngineParseError) as detected:
        ScrapedSource("http://e/metrics", fetch=lambda url, t: page).scrape()
    for raised in (configured, detected):
        assert "a TGI that has served no request yet has none" in str(raised.value)


@pytest.mark.parametrize("kind", ["vllm", "auto"])
def test_an_html_page_is_said_to_be_one(metrics_server: MetricsServer, kind: str) -> None:
    """An authenticating proxy's sign-in page answers 200 with HTML: the line blamed the
    engine kind or its metrics (``no vllm queue gauges ... metrics not enabled``). It says
    the page is HTML, quoting its start."""
    metrics_server.page = "\n<!DOCTYPE html>\n<html><head><title>Sign in</title></head></html>\n"
    source = ScrapedSource(metrics_server.url, kind, timeout_s=2.0)  # type: ignore[arg-type]
    with pytest.raises(EngineParseError) as raised:
        source.scrape()
    assert str(raised.value) == (
        f"{metrics_server.url}: the page is HTML, not Prometheus text "
        "('<!DOCTYPE html>\\n<html><head><title>Sign in</title></head></html>'): a sign-in "
        "or error page of a proxy, or a URL that is not the engine's metrics"
    )


@pytest.mark.parametrize(
    ("status", "challenge", "said"),
    [
        (
            401,
            'Bearer realm="vllm"',
            "HTTP 401 Unauthorized (the page asks for credentials: "
            'WWW-Authenticate: Bearer realm="vllm"; gpugov sends none: give it a metrics URL '
            "that needs none)",
        ),
        (
            403,
            None,
            "HTTP 403 Forbidden (the page refuses this client: gpugov sends no "
            "credentials: give it a metrics URL that needs none)",
        ),
    ],
    ids=["401", "403"],
)
def test_a_page_behind_authentication_says_gpugov_sends_no_credentials(
    metrics_server: MetricsServer, status: int, challenge: str | None, said: str
) -> None:
    """An engine whose metrics sit behind authentication (an API key on every route, a
    proxy) answers 401 or 403 at every scrape: the line said only the status, and the
    node held the fail-safe with nothing saying that gpugov sends no credentials."""
    metrics_server.status = status
    if challenge is not None:
        metrics_server.headers["WWW-Authenticate"] = challenge
    with pytest.raises(EngineHttpError) as raised:
        VllmSource(metrics_server.url, timeout_s=2.0).scrape()
    assert str(raised.value) == f"{metrics_server.url}: {said}"


def test_an_answer_with_two_different_content_lengths_is_a_failed_scrape() -> None:
    """Two Content-Length headers that disagree (a proxy that adds its own): http.client
    reads as many bytes as the first says, so a page cut at a line the first length
    ends on was read as the whole page: here without its waiting gauge, read as an empty
    queue, and the rest of the body was left on the kept connection for the next answer.
    It is a failed scrape naming both lengths (RFC 9112, 6.3)."""
    server = MetricsServer(protocol="HTTP/1.1")
    try:
        page = fixture_text("vllm_dp2_synthetic.txt")
        cut = page.index("vllm:num_requests_waiting")
        server.page = page
        server.headers = {"Content-Length": str(cut)}
        source = VllmSource(server.url, timeout_s=2.0)
        with pytest.raises(EngineUnavailable) as caught:
            source.scrape()
        assert str(caught.value) == (
            f"{server.url}: the answer has Content-Length headers that disagree "
            f"({cut}, {len(page.encode())}); not read as a page"
        )
        server.headers = {}
        assert source.scrape().waiting_requests == 4
    finally:
        server.close()


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{engine="0", ="2"} 1',
        "vllm:num_requests_running{,\t=1} 1",
    ],
)
def test_a_line_the_parser_fails_on_with_another_error_is_bad_text(line: str) -> None:
    """prometheus_client's parser raised IndexError, not ValueError, on a label with an
    empty name after a comma: it escaped the scrape, and the daemon's loop ended with a
    traceback on one bad line of an engine's page. It is a bad page like any other."""
    page = f"vllm:num_requests_waiting 1\n{line}\n"
    source = VllmSource("http://e/metrics", fetch=lambda url, t: page)
    with pytest.raises(EngineParseError) as caught:
        source.scrape()
    assert str(caught.value) == (
        "http://e/metrics: line 2 is not Prometheus text (IndexError: string index out of "
        f"range): {line!r}"
    )


def test_a_page_of_no_engine_says_what_to_check() -> None:
    """A vLLM started with --disable-log-stats serves a /metrics page of process metrics
    only: the line said "set the engine kind explicitly", which then failed on the
    missing queue gauges. It says what makes a page without an engine's metrics."""
    page = "# HELP process_cpu_seconds_total x\nprocess_cpu_seconds_total 12.5\n"
    with pytest.raises(EngineParseError) as caught:
        ScrapedSource("http://e/metrics", fetch=lambda url, t: page).scrape()
    assert str(caught.value) == (
        "http://e/metrics: no vllm:, sglang: or tgi_ metrics on the page: the engine's "
        "metrics are off (vLLM's --disable-log-stats; SGLang needs --enable-metrics) or the "
        "URL is not an engine's (TGI publishes its series from its first request on: a TGI "
        "that has served no request yet has none)"
    )


DYNAMO_FRONTEND_PAGE = """\
# TYPE dynamo_frontend_inflight_requests gauge
dynamo_frontend_inflight_requests{model="Qwen/Qwen3-0.6B"} 3
# TYPE dynamo_frontend_queued_requests gauge
dynamo_frontend_queued_requests{model="Qwen/Qwen3-0.6B"} 1
# TYPE dynamo_frontend_requests_total counter
dynamo_frontend_requests_total{model="Qwen/Qwen3-0.6B",request_type="stream",status="success"} 40
"""
"""A Dynamo frontend's page (its series as ai-dynamo/dynamo's metrics reference names them)."""


@pytest.mark.parametrize("kind", ["auto", "vllm", "sglang"])
def test_a_dynamo_frontend_page_says_to_read_a_worker(kind: EngineKind) -> None:
    """A Dynamo frontend listens on port 8000, the default engine.url's, and its page has
    no engine's series: the line blamed the engine's metrics or kind. It says the page is
    the frontend's and where a worker's is."""
    source = ScrapedSource("http://e/metrics", kind, fetch=lambda url, t: DYNAMO_FRONTEND_PAGE)
    with pytest.raises(EngineParseError) as caught:
        source.scrape()
    assert str(caught.value) == (
        "http://e/metrics: the page is a Dynamo frontend's (dynamo_frontend_* series, no "
        "engine's): point engine.url at a worker's page, on the worker's system port "
        "(DYN_SYSTEM_PORT)"
    )


def test_a_kv_capacity_derived_above_any_engine_is_not_known() -> None:
    """SGLang's capacity is its used tokens over their share of the cache: a share read
    near 0 (1e-12) beside 60,000 used tokens made a cache of 6e16 tokens, where a vLLM
    page's capacity above 1e12 is not known (docs/daemon.md)."""
    import re

    page = re.sub(
        r"^(sglang:token_usage\{[^}]*\}) \S+",
        r"\1 1e-12",
        fixture_text("sglang_pd_decode_synthetic.txt"),
        flags=re.MULTILINE,
    )
    sample = SglangSource("x", fetch=lambda url, t: page).scrape()
    assert sample.kv_tokens == 60000.0
    assert sample.kv_capacity_tokens is None
    whole = SglangSource("x", fetch=lambda u, t: fixture_text("sglang_pd_decode_synthetic.txt"))
    assert whole.scrape().kv_capacity_tokens == pytest.approx(60000.0 / 0.41)


@pytest.mark.parametrize("indent", [" ", "\t", "  \t"])
def test_sample_lines_with_leading_whitespace_are_read(
    metrics_server: MetricsServer, indent: str
) -> None:
    # The exposition format ignores a line's leading whitespace (a proxy that re-indents
    # a page): such a page was "no vllm:, sglang: or tgi_ metrics on the page", and on a
    # detected engine its indented lines were passed over unread.
    lines = fixture_text("vllm_dp2_synthetic.txt").splitlines()
    plain = VllmSource("x", fetch=lambda url, t: "\n".join(lines) + "\n").scrape()
    metrics_server.page = "\n".join(indent + line for line in lines) + "\n"
    sample = ScrapedSource(metrics_server.url, "auto", timeout_s=2.0).scrape()
    assert sample == plain


_SGLANG_CAPACITY = (
    "# TYPE sglang:max_total_num_tokens gauge\n"
    'sglang:max_total_num_tokens{engine_type="unified",model_name="Qwen/Qwen3-32B",'
    'pp_rank="0",tp_rank="0"} 500000.0\n'
)


@pytest.mark.parametrize(
    ("used", "usage", "capacity_before"),
    [
        # SGLang publishes its usage rounded to two decimals: 3,000 of 500,000 tokens
        # (0.006) reads 0.01, and the capacity derived from it was 300,000.
        ("3000.0", "0.01", 300_000.0),
        ("0.0", "0.0", None),  # an idle engine: no capacity could be derived at all
    ],
)
def test_sglang_kv_capacity_is_its_max_total_num_tokens_gauge(
    used: str, usage: str, capacity_before: float | None
) -> None:
    page = _gauge_set(fixture_text("sglang_v05_synthetic.txt"), "sglang:num_used_tokens", used)
    page = _gauge_set(page, "sglang:token_usage", usage)
    without = SglangSource("x", fetch=lambda url, t: page).scrape()
    assert without.kv_capacity_tokens == (
        None if capacity_before is None else pytest.approx(capacity_before)
    )
    with_gauge = SglangSource("x", fetch=lambda url, t: page + _SGLANG_CAPACITY).scrape()
    assert with_gauge.kv_capacity_tokens == 500_000.0
    assert with_gauge.kv_tokens == float(used)


def test_an_sglang_capacity_of_zero_is_not_known() -> None:
    page = fixture_text("sglang_v05_synthetic.txt")
    derived = SglangSource("x", fetch=lambda url, t: page).scrape().kv_capacity_tokens
    zero = page + _SGLANG_CAPACITY.replace("500000.0", "0.0")
    assert SglangSource("x", fetch=lambda url, t: zero).scrape().kv_capacity_tokens == derived


def test_an_https_url_to_a_plain_http_engine_says_so(metrics_server: MetricsServer) -> None:
    # The TLS handshake met an HTTP answer: the line said "cannot reach ...: [SSL:
    # WRONG_VERSION_NUMBER] wrong version number", though the engine was reached.
    metrics_server.page = fixture_text("vllm_dp2_synthetic.txt")
    url = metrics_server.url.replace("http://", "https://")
    with pytest.raises(EngineUnavailable) as failed:
        VllmSource(url, timeout_s=2.0).scrape()
    port = url.split(":")[2].split("/")[0]
    assert str(failed.value).startswith(
        f"{url}: the TLS handshake with 127.0.0.1:{port} failed: the answer is not TLS (an "
        "engine serving plain HTTP wants an http:// URL"
    )


def test_an_untrusted_certificate_is_said_as_such() -> None:
    import ssl

    from gpugov.daemon.scrape import describe_failure

    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_message = "self-signed certificate"
    said = describe_failure(error, "engine.example", 8443)
    assert said.startswith(
        "the TLS certificate of engine.example:8443 is not trusted (self-signed certificate)"
    )
    assert "SSL_CERT_FILE" in said


def test_an_ipv6_address_is_named_in_brackets_with_its_port() -> None:
    # "nothing listens on ::1:1" read as the address ::1:1 (port missing).
    import socket

    listener = socket.socket(socket.AF_INET6)
    listener.bind(("::1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    url = f"http://[::1]:{port}/metrics"
    with pytest.raises(EngineUnavailable) as refused:
        VllmSource(url, timeout_s=2.0).scrape()
    assert str(refused.value) == f"{url}: connection refused (nothing listens on [::1]:{port})"


@pytest.mark.parametrize("length", [b"\xb2", b"1\xb9"])
def test_a_content_length_of_other_digits_is_read_as_none(length: bytes) -> None:
    """A Content-Length of '²' (latin-1 0xB2) passed isdigit() and int() refused it: a
    ValueError out of the fetcher, a traceback from ``gpugov status --engine-url``.
    http.client reads such a length as none, and so does the page's size check now."""
    import socket
    import threading

    import gpugov.daemon.scrape as scrape

    listener = socket.create_server(("127.0.0.1", 0))
    body = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"

    def answer_once() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                + length
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )

    threading.Thread(target=answer_once, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    try:
        assert scrape.KeepAliveFetcher()(url, 5.0) == body.decode()
    finally:
        listener.close()
