"""DomainObserver: derivations from engine counters and GPU samples."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace

import pytest
from daemon_support import MetricsServer, fixture_text

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.engines import EngineSample, HistogramTotals
from gpugov.daemon.errors import EngineUnavailable, GpuLost, TransientGpuError
from gpugov.daemon.observer import DomainObserver
from gpugov.daemon.prompt_lengths import (
    residual_prompt_tokens,
    residual_prompt_tokens_quantile,
)
from gpugov.plant.types import ServingObservation


class StubGpu:
    """A GpuBackend returning scripted samples."""

    def __init__(self, label: str, clocks: tuple[int, ...] = (900, 1200, 1500, 1980)) -> None:
        self.label = label
        self.clocks = clocks
        self.next: GpuSample | Exception = GpuSample(gpu=label)

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return self.clocks

    def sample(self) -> GpuSample:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self) -> None: ...

    def close(self) -> None: ...


class StubSource:
    """An EngineSource returning scripted samples or raising."""

    def __init__(self) -> None:
        self.next: EngineSample | Exception = EngineSample("vllm", 0, 0)

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next


def _engine(**kw: object) -> EngineSample:
    base: dict[str, object] = {"engine": "vllm", "running_requests": 4, "waiting_requests": 2}
    base.update(kw)
    return EngineSample(**base)  # type: ignore[arg-type]


def test_derivations_from_counters() -> None:
    gpu, source = StubGpu("0"), StubSource()
    observer = DomainObserver([gpu], source, stale_after_s=3.0, ttft_slo_s=1.0, tpot_slo_s=0.05)
    source.next = _engine(
        prompt_tokens_total=10_000.0,
        generation_tokens_total=4_000.0,
        finished_requests_total=16.0,
        ttft=HistogramTotals(4.0, 20.0),
        tpot=HistogramTotals(40.0, 4000.0),
        kv_tokens=3000.0,
        kv_capacity_tokens=10000.0,
    )
    first = observer.observe(0.0, 0, None).observation
    # Arrivals since the first scrape, the requests then in flight included: the 16 the
    # engine finished before it are not arrivals this daemon saw.
    assert first.arrived_requests == 2 + 4
    assert first.waiting_requests == 2 and first.decode_active == 4
    assert first.prefill_remaining_tokens == pytest.approx(2 * 10_000 / 20)  # mean prompt 500
    assert first.generated_decode_tokens == pytest.approx(4 * (4000 / 16) / 2)
    assert first.ttft_recent_s is None  # no window yet
    assert first.completed_requests == 16
    assert first.kv_tokens == 3000.0 and first.kv_capacity_tokens == 10000.0
    assert first.requested_clock_mhz == 1980.0  # unlocked reads as the maximum
    assert first.supported_clocks_mhz == (900.0, 1200.0, 1500.0, 1980.0)
    assert (first.ttft_slo_s, first.tpot_slo_s) == (1.0, 0.05)
    source.next = _engine(
        prompt_tokens_total=12_000.0,
        finished_requests_total=20.0,
        ttft=HistogramTotals(7.0, 25.0),
        tpot=HistogramTotals(52.0, 4600.0),
    )
    second = observer.observe(1.0, 1, 1200.0).observation
    assert second.arrived_requests == 20 + 2 + 4 - 16  # finished + in flight, less before
    assert second.ttft_recent_s == pytest.approx(3.0 / 5)
    assert second.tpot_recent_s == pytest.approx(12.0 / 600)
    assert second.requested_clock_mhz == 1200.0


def test_generated_tokens_in_flight_from_the_counter_and_the_output_histogram() -> None:
    """The tokens the requests in flight have generated: the generation counter less the
    finished requests' (the output-length histogram's sum), less what the difference held
    the last time nothing was in flight; half a mean output per running request where an
    engine gives no such pair, or an inconsistent one."""
    gpu, source = StubGpu("0"), StubSource()
    observer = DomainObserver([gpu], source, stale_after_s=3.0, mean_output_tokens=200.0)

    def generated(running: int, waiting: int, total: float, finished: float | None) -> float:
        source.next = _engine(
            running_requests=running,
            waiting_requests=waiting,
            generation_tokens_total=total,
            finished_generation_tokens_total=finished,
            finished_requests_total=10.0,
        )
        return observer.observe(0.0, 0, None).observation.generated_decode_tokens

    assert generated(4, 0, 1000.0, 600.0) == 400.0
    # Nothing in flight, yet 100 tokens the histogram never counted (an aborted request):
    # they are no running request's.
    assert generated(0, 0, 1200.0, 1100.0) == 0.0
    assert generated(2, 1, 1500.0, 1100.0) == 300.0
    # The engine restarted: its counters start from zero, and so does the offset.
    assert generated(1, 0, 50.0, 0.0) == 50.0
    # An output-length histogram ahead of the counter, or none (TGI): half done. (Not in
    # the other order: a histogram back on the page after one without it starts every
    # counter from zero, docs/daemon.md.)
    mean_output = 50.0 / 10.0
    assert generated(4, 0, 50.0, 80.0) == pytest.approx(4 * mean_output / 2)
    assert generated(4, 0, 50.0, None) == pytest.approx(4 * mean_output / 2)


def test_prompt_tokens_count_as_their_chunks_ran() -> None:
    """vLLM counts a prompt once its prefill is done; the tokens its steps ran, less the
    decode tokens (generated less first tokens), count the chunks as they ran. A decode
    pool, or an engine without the tokens-per-step histogram, keeps the prompt counter."""
    gpu, source = StubGpu("0"), StubSource()
    observer = DomainObserver([gpu], source, stale_after_s=3.0)
    sample = _engine(
        prompt_tokens_total=10_000.0,
        generation_tokens_total=4_000.0,
        ttft=HistogramTotals(4.0, 20.0),
        iteration_tokens_total=26_000.0,  # 22,020 prompt tokens ran + 3,980 decode tokens
    )
    source.next = sample
    assert observer.observe(0.0, 0, None).observation.prompt_tokens_total == 22_020.0
    source.next = replace(sample, iteration_tokens_total=None)
    assert observer.observe(1.0, 1, None).observation.prompt_tokens_total == 10_000.0
    decode = DomainObserver([gpu], source, stale_after_s=3.0, role="decode")
    source.next = replace(sample, prompt_tokens_external_total=9_000.0)
    assert decode.observe(2.0, 2, None).observation.prompt_tokens_total == 1_000.0


def test_running_requests_still_in_their_prefill_count_as_waiting() -> None:
    """vLLM and SGLang run a prompt's chunks as a running request: the running gauge less
    the requests with a first token and unfinished (TTFT count less finished) are still
    prefilling, and their prompts are backlog, not decode batch."""
    gpu, source = StubGpu("0"), StubSource()
    observer = DomainObserver([gpu], source, stale_after_s=3.0)

    def observe(
        running: int, waiting: int, first: float, finished: float, **kw: object
    ) -> ServingObservation:
        source.next = _engine(
            running_requests=running,
            waiting_requests=waiting,
            ttft=HistogramTotals(1.0, first),
            finished_requests_total=finished,
            prompt_tokens_total=first * 1000.0,
            **kw,
        )
        return observer.observe(0.0, 0, None).observation

    # Three running, two of them decoding (ten first tokens, eight finished): one long
    # prompt is being prefilled beside one waiting.
    seen = observe(3, 1, 10.0, 8.0)
    assert (seen.decode_active, seen.waiting_requests) == (2, 2)
    assert seen.prefill_remaining_tokens == pytest.approx(2 * 1000.0)
    # Nothing in flight, yet one first token no finished request accounts for (a request
    # that ended uncounted): it is no running request's.
    seen = observe(0, 0, 12.0, 11.0)
    assert (seen.decode_active, seen.waiting_requests) == (0, 0)
    seen = observe(2, 0, 14.0, 11.0)
    assert (seen.decode_active, seen.waiting_requests) == (2, 0)
    # The engine restarted: counters from zero, the offset too.
    seen = observe(2, 0, 1.0, 0.0)
    assert (seen.decode_active, seen.waiting_requests) == (1, 1)
    # A simulated engine states the backlog itself: its gauges are taken as they are.
    seen = observe(2, 0, 1.0, 0.0, prefill_remaining_tokens=0.0)
    assert (seen.decode_active, seen.waiting_requests) == (2, 0)
    # A decode pool prefills nothing: every running request decodes.
    decode_pool = DomainObserver([gpu], source, stale_after_s=3.0, role="decode")
    source.next = _engine(
        running_requests=3,
        waiting_requests=0,
        ttft=HistogramTotals(1.0, 10.0),
        finished_requests_total=8.0,
    )
    seen = decode_pool.observe(0.0, 0, None).observation
    assert (seen.decode_active, seen.waiting_requests) == (3, 0)


def test_a_prompt_in_prefill_is_priced_at_the_length_biased_rest() -> None:
    """A prompt seen in its prefill is a long one more often than the mean prompt says
    (its prefill lasts in proportion to its length) and half done on average: its rest is
    ``E[L^2] / (2 E[L])`` over the prompt-length histogram, at least the mean prompt, where
    the engine does not say how much of it has run."""

    def square(low: float, high: float) -> float:  # E[L^2] of a uniform bucket
        return (low * low + low * high + high * high) / 3.0

    # Nine prompts of 500-1,000 tokens, one of 10,000-20,000 (uniform in their buckets).
    heavy = ((500.0, 0.0), (1000.0, 9.0), (10000.0, 9.0), (20000.0, 10.0), (math.inf, 10.0))
    expected = (9 * square(500, 1000) + square(10000, 20000)) / (2 * (9 * 750.0 + 15000.0))
    assert residual_prompt_tokens(heavy) == pytest.approx(expected)
    # Equal prompts: about half of one is left on average; an open top bucket runs up to
    # twice its bound.
    equal = square(100, 200) / 300.0
    equal_prompts = ((100.0, 0.0), (200.0, 10.0), (math.inf, 10.0))
    assert residual_prompt_tokens(equal_prompts) == pytest.approx(equal)
    assert residual_prompt_tokens(((100.0, 0.0), (math.inf, 4.0))) == pytest.approx(equal)
    assert residual_prompt_tokens(None) is None
    assert residual_prompt_tokens(((100.0, 0.0), (math.inf, 0.0))) is None
    # A page with a bad bound prices nothing rather than a NaN.
    assert residual_prompt_tokens(((math.nan, 3.0), (math.inf, 3.0))) is None

    gpu, source = StubGpu("0"), StubSource()
    observer = DomainObserver([gpu], source, stale_after_s=3.0)
    source.next = _engine(
        running_requests=3,
        waiting_requests=1,
        ttft=HistogramTotals(1.0, 10.0),
        finished_requests_total=8.0,
        prompt_tokens_total=21_000.0,  # a mean prompt of 2,100 tokens
        request_prompt_tokens_buckets=heavy,
    )
    seen = observer.observe(0.0, 0, None).observation
    # One waiting prompt at the mean, one in prefill at the length-biased rest.
    assert seen.prefill_remaining_tokens == pytest.approx(2100.0 + expected)
    # Equal prompts: the one in prefill at no less than the mean.
    source.next = replace(source.next, request_prompt_tokens_buckets=((2000.0, 10.0),))
    seen = observer.observe(1.0, 1, None).observation
    assert seen.prefill_remaining_tokens == pytest.approx(2 * 2100.0)


def test_the_rest_of_a_prompt_given_what_of_it_has_run() -> None:
    """``E[L - k | L > k]`` over the histogram (uniform buckets): a prompt that has run
    past the short ones is one of the long ones; one past every recorded length is taken
    to be as long again."""
    heavy = ((500.0, 0.0), (1000.0, 9.0), (10000.0, 9.0), (20000.0, 10.0), (math.inf, 10.0))
    assert residual_prompt_tokens(heavy, 0.0) == pytest.approx((9 * 750.0 + 15000.0) / 10)
    # Past the short ones: only the long one is left, 15,000 - 2,000 on average.
    assert residual_prompt_tokens(heavy, 2000.0) == pytest.approx(13000.0)
    # Inside the long one's bucket: uniform on (12,000, 20,000], 4,000 left on average.
    assert residual_prompt_tokens(heavy, 12000.0) == pytest.approx(4000.0)
    # Part-way into the short ones' bucket: the short ones above 800 and the long one.
    short_mass, short_rest = 9 * 0.4, 9 * 0.4 * 100.0
    assert residual_prompt_tokens(heavy, 800.0) == pytest.approx(
        (short_rest + 14200.0) / (short_mass + 1.0)
    )
    assert residual_prompt_tokens(heavy, 50_000.0) == 50_000.0
    assert residual_prompt_tokens(None, 100.0) is None


def test_the_tail_of_the_rest_of_a_prompt() -> None:
    """The ``q`` quantile of ``L - k | L > k`` over the histogram (uniform buckets): the
    rest only a share ``1 - q`` of such prompts exceed."""
    heavy = ((500.0, 0.0), (1000.0, 9.0), (10000.0, 9.0), (20000.0, 10.0), (math.inf, 10.0))
    # Nine short prompts and one long: the median is short, the 95th percentile long.
    assert residual_prompt_tokens_quantile(heavy, 0.5) == pytest.approx(500.0 + 500.0 * 5 / 9)
    assert residual_prompt_tokens_quantile(heavy, 0.95) == pytest.approx(15000.0)
    # Past the short ones only the long one is left: uniform on (10,000, 20,000] less k.
    assert residual_prompt_tokens_quantile(heavy, 0.99, 2000.0) == pytest.approx(17900.0)
    assert residual_prompt_tokens_quantile(heavy, 0.5, 12000.0) == pytest.approx(4000.0)
    # Past every recorded length: as long again, as the mean rest takes it.
    assert residual_prompt_tokens_quantile(heavy, 0.99, 50_000.0) == 50_000.0
    assert residual_prompt_tokens_quantile(None, 0.99) is None
    # The tail is never below the mean rest where the long prompts are rare.
    assert residual_prompt_tokens_quantile(heavy, 0.99, 800.0) > residual_prompt_tokens(
        heavy, 800.0
    )
    with pytest.raises(ValueError, match="quantile"):
        residual_prompt_tokens_quantile(heavy, 1.0)


def test_the_backlog_tail_prices_a_prompt_in_prefill_at_its_rest_quantile() -> None:
    """Beside the expected backlog the observer publishes its tail: the queued prompts at
    the mean, each prompt in prefill at the ``tail_quantile`` of its rest; the engine's
    own backlog (exact) has none."""
    heavy = ((500.0, 0.0), (1000.0, 9.0), (10000.0, 9.0), (20000.0, 10.0), (math.inf, 10.0))
    source = StubSource()
    observer = DomainObserver([StubGpu("0")], source, stale_after_s=3.0, tail_quantile=0.95)
    source.next = _engine(
        running_requests=1,
        waiting_requests=1,
        ttft=HistogramTotals(1.0, 10.0),
        finished_requests_total=10.0,
        prompt_tokens_total=21_000.0,
        request_prompt_tokens_buckets=heavy,
    )
    seen = observer.observe(0.0, 0, None).observation
    assert seen.prefill_tail_tokens == pytest.approx(2100.0 + 15000.0)
    assert seen.prefill_tail_tokens > seen.prefill_remaining_tokens
    source.next = replace(source.next, prefill_remaining_tokens=4000.0)
    assert observer.observe(1.0, 1, None).observation.prefill_tail_tokens is None
    with pytest.raises(ValueError, match="tail_quantile"):
        DomainObserver([StubGpu("0")], source, stale_after_s=3.0, tail_quantile=1.0)


def test_a_prompt_in_prefill_is_priced_from_its_tokens_that_ran() -> None:
    """Where the engine publishes its per-step tokens (vLLM), the tokens of a prompt in
    prefill that have run are those less the decode tokens less the prompt counter, and
    its rest follows from them; prefix-cached tokens (counted, never run) drop out at the
    next idle moment."""
    heavy = ((500.0, 0.0), (1000.0, 9.0), (10000.0, 9.0), (20000.0, 10.0), (math.inf, 10.0))
    source = StubSource()
    observer = DomainObserver([StubGpu("0")], source, stale_after_s=3.0)
    idle = _engine(
        running_requests=0,
        waiting_requests=0,
        ttft=HistogramTotals(1.0, 10.0),
        finished_requests_total=10.0,
        generation_tokens_total=1010.0,
        prompt_tokens_total=21_000.0,  # 500 of them prefix-cached: never ran
        iteration_tokens_total=21_500.0,  # 20,500 prompt + 1,000 decode tokens ran
        request_prompt_tokens_buckets=heavy,
    )
    source.next = idle
    assert observer.observe(0.0, 0, None).observation.prefill_remaining_tokens == 0.0
    # A prompt has run 2,000 tokens in its prefill: only the long one is that long.
    source.next = replace(idle, running_requests=1, iteration_tokens_total=23_500.0)
    seen = observer.observe(1.0, 1, None).observation
    assert seen.waiting_requests == 1 and seen.decode_active == 0
    assert seen.prefill_remaining_tokens == pytest.approx(13000.0)
    # Two prompts in prefill: each has run its share, 1,000 tokens, which no short prompt
    # outlasts: each is priced as the long one, 14,000 tokens left.
    source.next = replace(idle, running_requests=2, iteration_tokens_total=23_500.0)
    two = residual_prompt_tokens(heavy, 1000.0)
    assert two == pytest.approx(14000.0)
    assert observer.observe(2.0, 2, None).observation.prefill_remaining_tokens == (
        pytest.approx(2 * two)
    )
    # One waiting beside the first: at the engine's mean prompt, 21,000 / 10 tokens.
    source.next = replace(
        idle, running_requests=1, waiting_requests=1, iteration_tokens_total=23_500.0
    )
    seen = observer.observe(3.0, 3, None).observation
    assert seen.prefill_remaining_tokens == pytest.approx(13000.0 + 2100.0)


def test_defaults_without_counters_and_counter_reset() -> None:
    source = StubSource()
    observer = DomainObserver(
        [StubGpu("0")], source, stale_after_s=3.0, mean_prompt_tokens=100, mean_output_tokens=50
    )
    source.next = _engine(ttft=HistogramTotals(10.0, 100.0))
    o = observer.observe(0.0, 0, None).observation
    assert o.prefill_remaining_tokens == 200.0 and o.generated_decode_tokens == 100.0
    source.next = _engine(ttft=HistogramTotals(1.0, 3.0))  # engine restarted
    assert observer.observe(1.0, 1, None).observation.ttft_recent_s is None


def test_domain_aggregation_over_gpus() -> None:
    a, b = StubGpu("0"), StubGpu("1", clocks=(900, 1500, 1980, 2000))
    a.next = GpuSample(
        "0",
        power_w=300,
        energy_j=10,
        temperature_c=60,
        sm_clock_mhz=1500,
        utilization=0.5,
        power_limit_w=700,
    )
    b.next = GpuSample(
        "1",
        power_w=200,
        energy_j=5,
        temperature_c=70,
        sm_clock_mhz=1410,
        utilization=0.7,
        power_limit_w=700,
    )
    observer = DomainObserver([a, b], StubSource(), stale_after_s=3.0)
    o = observer.observe(0.0, 0, None).observation
    assert o.power_w == 500 and o.energy_j == 15 and o.power_limit_w == 1400
    assert o.temperature_c == 70 and o.realized_clock_mhz == 1410
    assert o.gpu_utilization == pytest.approx(0.6)
    assert o.supported_clocks_mhz == (900.0, 1500.0, 1980.0)  # common to both


def test_a_temperature_not_read_this_tick_is_nan_not_the_last_one() -> None:
    """Once no GPU's temperature reads (a sensor that fails, then keeps failing), the
    observation held the last one read as if measured at every later tick: --record lines
    carried it, mpc-online's thermal model learned windows where the die did not warm
    whatever the power, and the MPC planned from a die that never cooled. It is NaN (a
    null in a record) until one reads again, as before the first one did."""
    gpu = StubGpu("0")
    observer = DomainObserver([gpu], StubSource(), stale_after_s=3.0)
    gpu.next = GpuSample("0", temperature_c=80.0, sm_clock_mhz=1410)
    assert observer.observe(0.0, 0, None).observation.temperature_c == 80.0
    gpu.next = GpuSample("0", sm_clock_mhz=1410, read_errors=("temperature",))
    assert math.isnan(observer.observe(1.0, 1, None).observation.temperature_c)
    gpu.next = GpuSample("0", temperature_c=75.0, sm_clock_mhz=1410)
    assert observer.observe(2.0, 2, None).observation.temperature_c == 75.0


def test_staleness_and_errors() -> None:
    gpu, source = StubGpu("0"), StubSource()
    observer = DomainObserver([gpu], source, stale_after_s=2.5)
    source.next = EngineUnavailable("down")
    never = observer.observe(0.0, 0, None)
    assert never.engine_age_s is None and not never.engine_fresh
    assert never.engine_error == "down" and observer.engine_errors == 1
    assert math.isnan(never.observation.temperature_c)
    source.next = _engine()
    assert observer.observe(1.0, 1, None).engine_fresh
    source.next = EngineUnavailable("down again")
    assert observer.observe(3.0, 2, None).engine_fresh  # 2.0 s old
    late = observer.observe(4.0, 3, None)
    assert not late.engine_fresh and late.engine_age_s == pytest.approx(3.0, abs=0.05)
    assert late.observation.waiting_requests == 2  # last good data kept


def test_gpu_read_errors_counted_lost_raises() -> None:
    gpu = StubGpu("0")
    observer = DomainObserver([gpu], StubSource(), stale_after_s=3.0)
    gpu.next = GpuSample("0", read_errors=("power", "temperature"))
    observer.observe(0.0, 0, None)
    gpu.next = TransientGpuError("timeout")
    observer.observe(1.0, 1, None)
    assert observer.gpus.gpu_read_errors == {"0": 3}
    gpu.next = GpuLost("gone")
    with pytest.raises(GpuLost):
        observer.observe(2.0, 2, None)


def test_a_gpu_whose_samples_keep_failing_is_logged_once_a_minute_and_counted_each_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A backend that times out every tick (nvidia-smi's) logged a warning every tick:
    now the first failure, one reminder per ``log_every_s``, and one line on recovery;
    the metric still counts every failed sample."""
    gpu = StubGpu("0")
    observer = DomainObserver([gpu], StubSource(), stale_after_s=3.0, log_every_s=60.0)
    gpu.next = TransientGpuError("nvidia-smi timed out")
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.observer"):
        for tick in range(150):  # 150 s at 1 s: the first failure, reminders at 60 and 120 s
            observer.observe(float(tick), tick, None)
        gpu.next = GpuSample(gpu="0")
        observer.observe(150.0, 150, None)
        observer.observe(151.0, 151, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    failing = [m for m in warnings if m.startswith("GPU 0: sample")]
    assert failing == [
        "GPU 0: sample failed: nvidia-smi timed out",
        "GPU 0: samples still failing: 61 in a row over 60 s: nvidia-smi timed out",
        "GPU 0: samples still failing: 121 in a row over 120 s: nvidia-smi timed out",
    ]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "GPU 0: sampled again after 150 failed samples" in infos
    assert observer.gpus.gpu_read_errors == {"0": 150}


def test_a_late_tick_names_what_the_engine_last_did_not_a_zero_deadline() -> None:
    """The tick at which the data goes stale is not given a scrape it cannot use (no
    'no complete answer within 0 s'): its reason is the last failure, e.g. a refusal."""
    gpu, source = StubGpu("0"), StubSource()
    budgets: list[float | None] = []
    scrape = source.scrape

    def counted(timeout_s: float | None = None) -> EngineSample:
        budgets.append(timeout_s)
        return scrape(timeout_s)

    source.scrape = counted  # type: ignore[method-assign]
    observer = DomainObserver([gpu], source, stale_after_s=3.0, clock=lambda: 0.0)
    source.next = _engine()
    assert observer.observe(1.0, 1, None).engine_fresh
    refused = (
        "http://127.0.0.1:8000/metrics: connection refused (nothing listens on 127.0.0.1:8000)"
    )
    source.next = EngineUnavailable(refused)
    for now in (2.0, 3.0):
        observed = observer.observe(now, int(now), None)
        assert observed.engine_fresh and observed.engine_error == refused
    stale = observer.observe(4.0, 4, None)  # 3 s after the last good data: stale now
    assert not stale.engine_fresh
    assert stale.engine_error == (
        f"not scraped: the last good data went stale before this tick; last scrape: {refused}"
    )
    assert len(budgets) == 3 and observer.engine_errors == 3  # counted, never fetched
    after = observer.observe(5.0, 5, None)
    assert not after.engine_fresh and after.engine_error == refused and len(budgets) == 4
    source.next = _engine()
    assert observer.observe(6.0, 6, None).engine_fresh and observer.last_error is None


def test_a_scrape_cut_short_by_the_stale_age_says_so() -> None:
    now = [0.0]
    gpu = StubGpu("0")

    class Slow(StubSource):
        def scrape(self, timeout_s: float | None = None) -> EngineSample:
            if isinstance(self.next, EngineSample):
                return self.next
            now[0] += timeout_s or 0.5  # runs out its whole deadline
            raise EngineUnavailable(
                f"http://e/metrics: timed out: no complete answer within {timeout_s:.3g} s"
            )

    source = Slow()
    observer = DomainObserver(
        [gpu], source, stale_after_s=2.0, clock=lambda: now[0], scrape_timeout_s=0.5
    )
    source.next = _engine()
    assert observer.observe(0.0, 0, None).engine_fresh
    source.next = EngineUnavailable("hang")
    cut = observer.observe(1.8, 1, None)  # 0.2 s left of the stale age: the scrape gets that
    assert not cut.engine_fresh
    assert cut.engine_error == (
        "http://e/metrics: timed out: no complete answer within 0.2 s "
        "(given only the 0.2 s left before the data went stale)"
    )


def test_arrivals_count_from_the_first_scrape_and_again_after_an_engine_restart() -> None:
    # A daemon started beside an engine that has served 50,000 requests: its MPC read
    # them as one period's arrivals and forecast a flood for its 30 s window.
    gpu, source = StubGpu("0"), StubSource()
    observer = DomainObserver([gpu], source, stale_after_s=3.0)

    def arrived(finished: float, running: int, waiting: int, time_s: float) -> int:
        source.next = _engine(
            finished_requests_total=finished, running_requests=running, waiting_requests=waiting
        )
        return observer.observe(time_s, int(time_s), None).observation.arrived_requests

    assert arrived(50_000.0, 3, 1, 0.0) == 4  # the ones in flight
    assert arrived(50_002.0, 3, 2, 1.0) == 7  # two finished, one more waiting: +3
    assert arrived(50_002.0, 2, 2, 2.0) == 6  # one aborted: not a restart
    assert arrived(1.0, 1, 0, 3.0) == 2  # the counter went back: counted from zero


def test_an_engine_of_another_kind_on_the_url_starts_its_counters_afresh(
    metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM replaced by an SGLang that has served for days, on the same URL (kind auto):
    its lifetime counters are not one scrape's work after vLLM's, nor a jump to drop."""
    source = ScrapedSource(metrics_server.url, "auto", timeout_s=2.0)
    observer = DomainObserver([StubGpu("0")], source, stale_after_s=30.0, ttft_slo_s=1.0)
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    ticks = [observer.observe(float(t), t, None) for t in range(2)]
    sglang = fixture_text("sglang_real.txt")
    # Its first page a bad one (a counter wrapped below zero): the old engine's last
    # sample stays, as for any bad scrape.
    metrics_server.page = sglang.replace("8.128902e+06", "1.8e+19")
    bad = observer.observe(2.0, 2, None)
    assert "impossible counter" in (bad.engine_error or "")
    assert bad.engine_sample is not None and bad.engine_sample.engine == "vllm"
    metrics_server.page = sglang
    with caplog.at_level(logging.WARNING):
        ticks += [observer.observe(float(t), t, None) for t in range(3, 6)]
    assert [t.engine_error for t in ticks] == [None] * 5
    assert [t.engine_sample.engine for t in ticks] == ["vllm"] * 2 + ["sglang"] * 3  # type: ignore[union-attr]
    assert not any("jump" in r.getMessage() for r in caplog.records), caplog.text
    switched = ticks[2].observation
    # SGLang's 11,008 first tokens and 8.1e6 prompt tokens are not a window's: no TTFT
    # measured across the two engines, nor counted against the SLO.
    assert switched.ttft_recent_s is None
    assert (observer.attainment.ttft_count or 0.0) == 0.0  # the page did not move since
    # The counters a controller diffs start again, as after an engine restart: mpc-online
    # learned a window of 8.1e6 prompt tokens in one second across the two engines.
    before = ticks[1].observation
    assert switched.prompt_tokens_total <= before.prompt_tokens_total
    assert switched.output_tokens_total <= before.output_tokens_total
    assert switched.completed_requests <= before.completed_requests
    # Its requests in flight are arrivals, as at a daemon's first scrape; its lifetime is not.
    in_flight = 162 + 2826
    assert all(t.observation.arrived_requests <= in_flight for t in ticks[2:])


def test_an_engine_serving_another_model_on_the_url_starts_its_counters_afresh(
    metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The URL now reaches another vLLM, serving another model, that has served for days
    (a service moved to another deployment): as for an engine of another kind, its
    lifetime is no work this daemon saw and no jump from the old engine's counters."""
    observer = DomainObserver([StubGpu("0")], ScrapedSource(metrics_server.url), stale_after_s=30.0)
    page = fixture_text("vllm_v1_real.txt")
    metrics_server.page = page
    ticks = [observer.observe(float(t), t, None) for t in range(2)]
    other = page.replace("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B-Instruct")
    for series, value in (
        ("vllm:prompt_tokens_total", "8.0e+07"),
        ("vllm:generation_tokens_total", "5.0e+07"),
        ("vllm:request_success_total", "40000.0"),
        ("vllm:num_requests_waiting", "7.0"),
    ):
        other = re.sub(
            rf"^({re.escape(series)}{{[^}}]*}}) \S+$", rf"\g<1> {value}", other, flags=re.M
        )
    metrics_server.page = other
    with caplog.at_level(logging.WARNING):
        ticks += [observer.observe(float(t), t, None) for t in range(2, 4)]
    assert [t.engine_error for t in ticks] == [None] * 4
    assert not any("jump" in r.getMessage() for r in caplog.records), caplog.text
    switched, before = ticks[2].observation, ticks[1].observation
    assert switched.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert switched.prompt_tokens_total <= before.prompt_tokens_total
    assert switched.output_tokens_total <= before.output_tokens_total
    assert switched.completed_requests <= before.completed_requests
    assert all(t.observation.arrived_requests <= 7 for t in ticks[2:])


def test_no_tpot_window_between_the_per_request_and_the_inter_token_histogram() -> None:
    """A page that stops publishing the per-request TPOT histogram (a URL that now reaches
    an older vLLM) falls back to the inter-token one, which has the same bounds: their
    difference, 9,800 inter-token intervals less requests, was counted as one window of
    TPOTs against the SLO. A window is only taken within one histogram."""
    page = fixture_text("vllm_request_tpot_synthetic.txt").replace(
        'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="m"} 9000.0',
        'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} 5000.0\n'
        'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="m"} 9000.0',
    )
    without = "".join(
        line + "\n" for line in page.splitlines() if "request_time_per_output" not in line
    )
    shown = [page]
    observer = DomainObserver(
        [StubGpu("0")],
        ScrapedSource("http://e/metrics", "vllm", fetch=lambda url, t: shown[0]),
        stale_after_s=30.0,
        tpot_slo_s=0.03,
    )
    counts = []
    for step, text in enumerate([page, page, without, without, page]):
        shown[0] = text
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None
        counts.append(observed.observation.tpot_count_total)
    assert counts == [None, 0.0, 0.0, 0.0, 0.0]


def test_the_engine_back_line_names_its_url(caplog: pytest.LogCaptureFixture) -> None:
    """The failure lines name the URL (in the error); the recovery line did not, so on a
    node of several domains it did not say which engine came back."""
    url = "http://10.0.0.7:8000/metrics"
    pages: list[str | None] = [None, None, fixture_text("vllm_v1_real.txt")]

    def fetch(address: str, timeout_s: float) -> str:
        page = pages.pop(0)
        if page is None:
            raise EngineUnavailable(f"{address}: connection refused")
        return page

    observer = DomainObserver([StubGpu("0")], ScrapedSource(url, fetch=fetch), stale_after_s=3.0)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        for step in range(3):
            observer.observe(float(step), step, None)
    assert caplog.records[-1].getMessage() == (
        f"engine scrape back after 2 failed scrape(s) (2.0 s): {url}"
    )


def test_a_failed_read_on_the_hottest_gpu_keeps_its_last_temperature_for_a_while() -> None:
    """The domain's temperature is its hottest GPU's: where that GPU's read fails and a
    cooler one's does not, its last reading counts for up to THERMAL_STALE_S (the cooler
    GPU's was taken for the domain's, and the thermal guard's cap lifted for the tick);
    a sensor that keeps failing past that is left out."""
    hot, cool = StubGpu("0"), StubGpu("1")
    observer = DomainObserver([hot, cool], StubSource(), stale_after_s=3.0)
    hot.next = GpuSample("0", temperature_c=84.0, sm_clock_mhz=1410)
    cool.next = GpuSample("1", temperature_c=61.0, sm_clock_mhz=1410)
    assert observer.observe(0.0, 0, None).observation.temperature_c == 84.0
    hot.next = GpuSample("0", sm_clock_mhz=1410, read_errors=("temperature",))
    assert observer.observe(1.0, 1, None).observation.temperature_c == 84.0
    assert observer.observe(10.0, 2, None).observation.temperature_c == 84.0
    assert observer.observe(10.5, 3, None).observation.temperature_c == 61.0
    cool.next = GpuSample("1", sm_clock_mhz=1410, read_errors=("temperature",))
    assert math.isnan(observer.observe(11.0, 4, None).observation.temperature_c)


def test_at_a_long_period_the_hottest_gpus_last_reading_still_counts_for_one_tick() -> None:
    """With ticks 30 s apart (``period_s`` up to 60), the hottest GPU's reading of the
    tick before counts when its read fails, as the thermal guard's staleness is one period
    longer too; two ticks on it is left out."""
    hot, cool = StubGpu("0"), StubGpu("1")
    observer = DomainObserver([hot, cool], StubSource(), stale_after_s=90.0, period_s=30.0)
    hot.next = GpuSample("0", temperature_c=84.0, sm_clock_mhz=1410)
    cool.next = GpuSample("1", temperature_c=61.0, sm_clock_mhz=1410)
    assert observer.observe(0.0, 0, None).observation.temperature_c == 84.0
    hot.next = GpuSample("0", sm_clock_mhz=1410, read_errors=("temperature",))
    assert observer.observe(30.0, 1, None).observation.temperature_c == 84.0
    assert observer.observe(60.0, 2, None).observation.temperature_c == 61.0
