"""How many data-parallel engines an engine's page shows (``EngineSample.engines``), and
the observation that pools them (``ServingObservation.engines``): distinct label sets of
the running and waiting gauges, rank labels left out."""

from __future__ import annotations

import itertools

import pytest
from daemon_support import fixture_text
from synthetic import make_plant

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.engine_sources import ScrapedSource, SglangSource, TgiSource, VllmSource
from gpugov.daemon.engines import EngineSample, EngineSource
from gpugov.daemon.errors import EngineUnavailable
from gpugov.daemon.observer import DomainObserver
from gpugov.study.emulate.metrics import render_metrics
from gpugov.study.emulate.node import EmulatedNode


class _Gpu:
    """A GpuBackend that reads the same sample every tick."""

    def __init__(self, label: str) -> None:
        self.label = label

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return (900, 1980)

    def sample(self) -> GpuSample:
        return GpuSample(gpu=self.label, power_w=300.0, utilization=0.5)

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self) -> None: ...

    def close(self) -> None: ...


def _page(page: str) -> ScrapedSource:
    return ScrapedSource("file:page", fetch=lambda url, t: page)


def _observed_engines(source: EngineSource, gpus: int = 1) -> int:
    observer = DomainObserver([_Gpu(str(k)) for k in range(gpus)], source, stale_after_s=3.0)
    observation = observer.observe(0.0, 0, None).observation
    assert observation.busiest_prefill_tokens is None  # not derived on a node
    return observation.engines


def vllm_dp2_from_the_real_page() -> str:
    """The real vLLM V1 page (``vllm_v1_real.txt``, one engine, ``engine="0"``) made a
    data-parallel page of two engines: every sample line labelled ``engine="0"`` is
    repeated labelled ``engine="1"``, as vLLM labels the second engine of a
    data-parallel deployment. No real data-parallel page has been found, so this one is
    built; the values of the copy are the first engine's."""
    lines: list[str] = []
    for line in fixture_text("vllm_v1_real.txt").splitlines():
        lines.append(line)
        if not line.startswith("#") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    return "\n".join(lines) + "\n"


def test_a_vllm_data_parallel_page_of_two_engines_is_observed_as_two() -> None:
    page = vllm_dp2_from_the_real_page()
    sample = VllmSource("x", fetch=lambda url, t: page).scrape()
    assert sample.engines == 2
    one = VllmSource("x", fetch=lambda url, t: fixture_text("vllm_v1_real.txt")).scrape()
    assert sample.finished_requests_total == 2 * (one.finished_requests_total or 0.0)
    assert _observed_engines(VllmSource("x", fetch=lambda url, t: page), gpus=2) == 2


def test_the_synthetic_vllm_data_parallel_page_shows_two_engines() -> None:
    page = fixture_text("vllm_dp2_synthetic.txt")
    assert _observed_engines(VllmSource("x", fetch=lambda url, t: page), gpus=2) == 2


def test_a_single_engine_page_is_one_engine() -> None:
    page = fixture_text("vllm_v1_real.txt")
    assert VllmSource("x", fetch=lambda url, t: page).scrape().engines == 1
    assert _observed_engines(VllmSource("x", fetch=lambda url, t: page)) == 1
    # Pages without an engine label: older SGLang (model_name only), TGI (none).
    sglang = SglangSource("x", fetch=lambda url, t: fixture_text("sglang_real.txt")).scrape()
    assert sglang.engines == 1
    tgi = TgiSource("x", fetch=lambda url, t: fixture_text("tgi_synthetic.txt")).scrape()
    assert tgi.engines == 1


@pytest.mark.parametrize(
    "name",
    ["sglang_ranks_synthetic.txt", "sglang_pd_prefill_synthetic.txt", "sglang_v05_synthetic.txt"],
)
def test_the_tensor_parallel_ranks_of_one_engine_are_one_engine(name: str) -> None:
    page = fixture_text(name)
    assert SglangSource("x", fetch=lambda url, t: page).scrape().engines == 1
    assert _observed_engines(SglangSource("x", fetch=lambda url, t: page), gpus=2) == 1


def test_sglang_data_parallel_ranks_are_engines_their_tensor_parallel_ranks_not() -> None:
    """SGLang labels each data-parallel scheduler ``dp_rank``; built from the TP=2 page
    (no real data-parallel SGLang page found): two DP ranks of two TP ranks each."""
    lines: list[str] = []
    for line in fixture_text("sglang_ranks_synthetic.txt").splitlines():
        if line.startswith("#") or "{" not in line:
            lines.append(line)
            continue
        for dp in ("0", "1"):
            lines.append(line.replace("{", f'{{dp_rank="{dp}",', 1))
    page = "\n".join(lines) + "\n"
    sample = SglangSource("x", fetch=lambda url, t: page).scrape()
    assert sample.engines == 2
    assert (sample.running_requests, sample.waiting_requests) == (20, 10)


def test_the_larger_count_of_the_two_gauges_counts() -> None:
    """An engine whose waiting gauge the page lacks is still counted by its running one."""
    page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_running{engine="2",model_name="m"} 0.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0\n'
    )
    assert _page(page).scrape().engines == 3


def test_the_emulators_pages_show_their_replicas() -> None:
    """The emulated node labels its replicas ``engine="0"``, ``"1"``: its whole page is a
    data-parallel page of them, one replica's page one engine."""
    node = EmulatedNode(make_plant(), gpus=2, seed=1, clock=lambda: 0.0)
    whole = render_metrics(node, "m")
    assert VllmSource("x", fetch=lambda url, t: whole).scrape().engines == 2
    own = render_metrics(node, "m", replicas=[1])
    assert VllmSource("x", fetch=lambda url, t: own).scrape().engines == 1


def test_the_emulators_page_escapes_a_served_model_name() -> None:
    """A served model name with a quote, a backslash or braces is escaped on the emulated
    page, which parses back to the same name (unescaped, every scrape failed)."""
    name = 'org/My "quoted" \\ model-{8B}'
    node = EmulatedNode(make_plant(), gpus=1, seed=1, clock=lambda: 0.0)
    page = render_metrics(node, name)
    assert VllmSource("x", fetch=lambda url, t: page).scrape().model_name == name


def test_no_scrape_yet_and_a_bare_sample_are_one_engine() -> None:
    assert EngineSample("vllm", 0, 0).engines == 1

    class Down:
        def scrape(self, timeout_s: float | None = None) -> EngineSample:
            raise EngineUnavailable("down")

    assert _observed_engines(Down()) == 1


class _EnergyGpu(_Gpu):
    """A GPU whose energy counter rises 400 J a tick (400 W)."""

    energy_j = 1e6

    def sample(self) -> GpuSample:
        self.energy_j += 400.0
        return GpuSample(gpu=self.label, energy_j=self.energy_j, power_limit_w=700.0)


def test_a_change_of_the_engine_count_is_another_engine() -> None:
    """A data-parallel deployment scaled up (one engine to two) or down between scrapes:
    the sums over the engines jumped by the joining engine's lifetime counters (read as
    one window's work, or dropped as an impossible jump) or fell by the leaving one's.
    Now a new count is another engine, as one of another kind or model is: the counters
    start from zero there, and no energy window spans it."""
    from gpugov.daemon.energy import EnergyEstimator, reading_from

    one, two = fixture_text("vllm_v1_real.txt"), vllm_dp2_from_the_real_page()
    page = [one]
    source = ScrapedSource("file:page", fetch=lambda url, t: page[0])
    observer = DomainObserver([_EnergyGpu("0")], source, stale_after_s=30.0)
    estimator = EnergyEstimator()
    ticks = []
    for step, shown in enumerate([one] * 3 + [two] * 3 + [one] * 3):
        page[0] = shown
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None, (step, observed.engine_error)
        estimator.update(reading_from(observed))
        ticks.append(observed.observation)
    assert [t.engines for t in ticks] == [1] * 3 + [2] * 3 + [1] * 3
    for change in (3, 6):
        switched, before = ticks[change], ticks[change - 1]
        assert switched.prompt_tokens_total <= before.prompt_tokens_total, change
        assert switched.output_tokens_total <= before.output_tokens_total, change
        assert switched.completed_requests <= before.completed_requests, change
        assert switched.ttft_recent_s is None, change  # no window across the two
    assert estimator.skipped["engine_restart"] == 2


def _restarted(page: str, engine: str) -> str:
    """``page`` with data-parallel engine ``engine`` restarted: its counters and histogram
    series back at zero, its gauges and ``cache_config_info`` as they were."""
    lines = []
    for line in page.splitlines():
        name = line.split("{", 1)[0]
        if f'engine="{engine}"' in line and name.endswith(("_total", "_bucket", "_count", "_sum")):
            line = line.rsplit(" ", 1)[0] + " 0.0"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_one_data_parallel_engine_restarting_is_no_flood_of_arrivals() -> None:
    """One of two data-parallel engines restarts: the page's sums fall by its lifetime
    and no more. Arrivals counted "from zero again" there read the other engine's whole
    lifetime of finished requests as one period's arrivals (the MPC's arrival rate and
    the burst hedge held the top clock for their windows); they count from that scrape,
    the requests then in flight included, as at the daemon's first scrape."""
    page = fixture_text("vllm_dp2_synthetic.txt")
    lifetime = 40_000.0  # engine 0 has served for days
    page = page.replace(
        'vllm:request_success_total{engine="0",finished_reason="stop",'
        'model_name="meta-llama/Llama-3.1-8B-Instruct"} 90.0',
        'vllm:request_success_total{engine="0",finished_reason="stop",'
        f'model_name="meta-llama/Llama-3.1-8B-Instruct"}} {lifetime}',
    )
    shown = [page]
    source = VllmSource("x", fetch=lambda url, t: shown[0])
    observer = DomainObserver([_Gpu("0")], source, stale_after_s=30.0)
    in_flight = 12 + 8 + 3 + 1  # running and waiting, both engines
    ticks = []
    for step, text in enumerate([page, page, _restarted(page, "1"), _restarted(page, "1")]):
        shown[0] = text
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None, observed.engine_error
        ticks.append(observed.observation)
    assert [t.engines for t in ticks] == [2] * 4
    assert ticks[2].completed_requests < ticks[1].completed_requests  # a restart, seen
    assert [t.arrived_requests for t in ticks] == [in_flight] * 4


def test_an_engine_restarting_after_the_deployment_scaled_is_no_lifetime_of_work() -> None:
    """A deployment scaled from one data-parallel engine to two, whose counters then
    count from zero (the joining engine's lifetime is no work), and later one of its
    engines restarts: the restart dropped what the scaling took off, so the counters
    jumped up by the other engine's whole lifetime (65,000 prompt tokens, 100 requests
    read as one window's work). A restart of one of several engines starts them from
    zero there, as the scaling did."""
    two = fixture_text("vllm_dp2_synthetic.txt")
    one = "\n".join(line for line in two.splitlines() if 'engine="1"' not in line) + "\n"
    restarted = _restarted(two, "1")
    shown = [one]
    observer = DomainObserver(
        [_Gpu("0")], VllmSource("x", fetch=lambda url, t: shown[0]), stale_after_s=30.0
    )
    ticks = []
    for step, page in enumerate([one, one, two, two, restarted, restarted]):
        shown[0] = page
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None, observed.engine_error
        ticks.append(observed.observation)
    assert [t.engines for t in ticks] == [1, 1, 2, 2, 2, 2]
    for before, after in itertools.pairwise(ticks[2:]):
        assert after.prompt_tokens_total <= before.prompt_tokens_total
        assert after.output_tokens_total <= before.output_tokens_total
        assert after.completed_requests <= before.completed_requests
    assert all(t.arrived_requests <= 24 for t in ticks[2:])


def test_one_engine_leaving_and_another_joining_between_scrapes_is_another_engine() -> None:
    """Three data-parallel engines; engine 0 leaves, then between two scrapes engine 1
    leaves and engine 0 is back: as many engines as before, but the sums swapped engine
    1's lifetime for engine 0's, read as 20,000 prompt tokens and 30 requests of work in
    one window. Other engines are another engine, as another count is."""
    three = []
    for line in fixture_text("vllm_dp2_synthetic.txt").splitlines():
        three.append(line)
        if not line.startswith("#") and 'engine="1"' in line:
            three.append(line.replace('engine="1"', 'engine="2"'))

    def without(engine: str) -> str:
        return "".join(line + "\n" for line in three if f'engine="{engine}"' not in line)

    shown = ["\n".join(three) + "\n"]
    observer = DomainObserver(
        [_Gpu("0")], VllmSource("x", fetch=lambda url, t: shown[0]), stale_after_s=30.0
    )
    ticks = []
    for step, page in enumerate([shown[0], without("0"), without("0"), without("1")]):
        shown[0] = page
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None, observed.engine_error
        ticks.append(observed.observation)
    assert [t.engines for t in ticks] == [3, 2, 2, 2]
    swapped, before = ticks[3], ticks[2]
    assert swapped.prompt_tokens_total <= before.prompt_tokens_total
    assert swapped.completed_requests <= before.completed_requests
    assert swapped.arrived_requests <= (12 + 3) + (8 + 1)  # those in flight, no lifetime
