"""Engine counters that jump further in one scrape than any node can: dropped, then
re-anchored (``docs/daemon.md``, counter jumps)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.controller_config import OnlineMPCControllerConfig
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.engine_sources import ScrapedSource
from gpugov.daemon.engines import EngineSample, HistogramTotals
from gpugov.daemon.errors import EngineUnavailable
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.observer import DomainObserver
from gpugov.daemon.service import simulated_run
from gpugov.daemon.stored_model import model_path, read_stored
from gpugov.plant import ServingPlant, load_profile
from gpugov.plant.workload import load_trace


class StubGpu:
    label = "0"
    name = "stub"

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        return (345, 1000, 1980)

    def sample(self) -> GpuSample:
        return GpuSample(gpu="0", power_w=300.0, energy_j=0.0, sm_clock_mhz=1980.0, utilization=0.5)


class ListSource:
    def __init__(self, samples: Sequence[EngineSample]) -> None:
        self.samples = list(samples)

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        return self.samples.pop(0)


def _sample(step: int, scale: float = 1.0, offset: float = 0.0) -> EngineSample:
    """A vLLM-like sample after ``step`` half-second scrapes of 1000 prompt tokens,
    2000 generated and 4 requests a scrape, its counters times ``scale``."""
    n = 1000 + step
    return EngineSample(
        engine="vllm",
        running_requests=4,
        waiting_requests=2,
        prompt_tokens_total=(1000.0 * n + offset) * scale,
        generation_tokens_total=2000.0 * n * scale,
        finished_requests_total=4.0 * n * scale,
        ttft=HistogramTotals(sum_s=0.2 * 4 * n * scale, count=4.0 * n * scale),
        ttft_buckets=((0.5, 4.0 * n * scale), (float("inf"), 4.0 * n * scale)),
    )


def _observe(samples: Sequence[EngineSample]) -> tuple[DomainObserver, list]:  # type: ignore[type-arg]
    observer = DomainObserver([StubGpu()], ListSource(samples), stale_after_s=5.0, ttft_slo_s=1.0)  # type: ignore[list-item]
    return observer, [observer.observe(0.5 * i, i, None) for i in range(len(samples))]


@pytest.mark.parametrize("scale", [1e6, 1.8e19, 1e300])
def test_a_spike_is_dropped_and_its_end_is_no_jump(
    scale: float, caplog: pytest.LogCaptureFixture
) -> None:
    spiked = [_sample(i, scale if 4 <= i < 8 else 1.0) for i in range(12)]
    with caplog.at_level(logging.DEBUG, logger="gpugov.daemon.observer"):
        observer, ticks = _observe(spiked)
    errors = [t.engine_error for t in ticks]
    assert all(errors[i] for i in range(4, 8)) and not any(errors[:4] + errors[8:])
    assert observer.engine_errors == 4
    first = errors[4] or ""
    assert "prompt_tokens_total" in first and "sample dropped" in first
    # One WARNING names the counter, one says the engine is back; the rest at DEBUG.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and "prompt_tokens_total" in warnings[0]
    assert "back after 4 failed" in warnings[1]
    # The counters the controllers see never moved with the spike: the window across it
    # is the missed scrapes' work, as after an engine that did not answer.
    prompts = [t.observation.prompt_tokens_total for t in ticks]
    assert prompts[4:8] == [prompts[3]] * 4
    assert prompts[8] - prompts[3] == pytest.approx(5000.0)
    assert prompts[11] - prompts[8] == pytest.approx(3000.0)
    assert all(t.engine_sample is not None for t in ticks)
    assert max(t.observation.completed_requests for t in ticks) < 5000
    assert max(t.observation.arrived_requests for t in ticks) < 5000
    assert observer.attainment.ttft_count == pytest.approx(4.0 * 11)


def test_a_counter_that_stays_at_its_new_level_is_taken_from_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A jump that stays (a proxy adding a rank's lifetime to its sum) costs one scrape;
    the counter then goes on from where it was, and an engine restart after it is one."""
    samples = [_sample(i, offset=1e12 if i >= 3 else 0.0) for i in range(8)]
    samples.append(
        _sample(0).__class__(
            engine="vllm", running_requests=0, waiting_requests=0, prompt_tokens_total=10.0
        )
    )
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        _, ticks = _observe(samples)
    assert [bool(t.engine_error) for t in ticks] == [False] * 3 + [True] + [False] * 5
    assert any("stayed at the level" in r.getMessage() for r in caplog.records)
    prompts = [t.observation.prompt_tokens_total for t in ticks]
    assert prompts[4] - prompts[2] == pytest.approx(1000.0)  # the jumped window not counted
    assert prompts[7] - prompts[4] == pytest.approx(3000.0)
    assert prompts[8] == pytest.approx(10.0)  # a restart: the engine's own counters again


def test_a_counter_at_about_two_to_the_64_is_no_count() -> None:
    wrapped = replace(_sample(1), generation_tokens_total=float(2**64 - 5))
    _, ticks = _observe([_sample(0), wrapped, _sample(2)])
    assert "generation_tokens_total" in (ticks[1].engine_error or "")
    assert ticks[2].engine_error is None


class SpikingSource:
    """The simulated engine's vLLM view, with its counters times ``scale`` on the
    scrapes of ``spikes`` (scrape index -> scale; None: the engine does not answer)."""

    def __init__(self, inner: object, spikes: dict[int, float | None]) -> None:
        self.inner = inner
        self.spikes = spikes
        self.scrapes = 0

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        sample: EngineSample = self.inner.scrape(timeout_s)  # type: ignore[attr-defined]
        scale = self.spikes.get(self.scrapes, 1.0)
        self.scrapes += 1
        if scale is None:
            raise EngineUnavailable("connection refused")
        if scale == 1.0:
            return sample

        def times(buckets: object) -> object:
            return None if buckets is None else tuple((le, c * scale) for le, c in buckets)  # type: ignore[attr-defined]

        def hist(h: HistogramTotals | None) -> HistogramTotals | None:
            return None if h is None else HistogramTotals(h.sum_s * scale, h.count * scale)

        scaled = {
            name: getattr(sample, name) * scale
            for name in (
                "prompt_tokens_total",
                "generation_tokens_total",
                "finished_requests_total",
                "iteration_tokens_total",
                "iterations_total",
                "finished_generation_tokens_total",
                "tpot_buckets_sum_s",
            )
            if getattr(sample, name) is not None
        }
        return replace(
            sample,
            ttft=hist(sample.ttft),
            tpot=hist(sample.tpot),
            ttft_buckets=times(sample.ttft_buckets),
            tpot_buckets=times(sample.tpot_buckets),
            request_prompt_tokens_buckets=times(sample.request_prompt_tokens_buckets),
            request_generation_tokens_buckets=times(sample.request_generation_tokens_buckets),
            **scaled,  # type: ignore[arg-type]
        )


def _online_run(tmp_path: Path, spikes: dict[int, float | None]) -> list[TickRecord]:
    workload, _ = load_trace("azure-conv-10min", duration_s=150)
    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    clock = VirtualClock()
    spec = OnlineMPCControllerConfig(kind="mpc-online", state_dir=tmp_path)
    sim = simulated_run(workload, plant, spec, clock, virtual_time=True)
    observer = sim.domain.observer
    observer.source = SpikingSource(observer.source, spikes)  # type: ignore[assignment]
    observer._clock = clock  # scrapes take no time: the engine's age is the virtual one's
    records: list[TickRecord] = []
    run(
        [sim.domain],
        TimedLoop(1.0, clock=clock, sleep=clock.sleep),
        on_tick=records.extend,
        before_tick=lambda now, step: step >= 150 or sim.before_tick(now, step),
    )

    return records


def test_a_counter_spike_neither_floors_the_clock_nor_spoils_the_learned_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """mpc-online on the simulated node's vLLM page, on virtual time: x1e6 for three
    scrapes, then x1.8e19 for three. Each spiked scrape costs exactly what a scrape the
    engine did not answer costs (the same decisions, tick for tick: the fail-safe's top
    clock once the data is stale, then the clean run's own), the clock never goes to the
    lowest after a spike, and the model saved loads."""
    spikes: dict[int, float | None] = {
        **dict.fromkeys(range(60, 63), 1e6),
        **dict.fromkeys(range(90, 93), 1.8e19),
    }
    missed = _online_run(tmp_path / "missed", dict.fromkeys(spikes))
    with caplog.at_level(logging.WARNING):
        spiked = _online_run(tmp_path / "spiked", spikes)
    assert [r.requested_mhz for r in spiked] == [r.requested_mhz for r in missed]
    assert [r.failsafe for r in spiked] == [r.failsafe for r in missed]
    dropped = [r.step for r in spiked if (r.engine_error or "").startswith("impossible counter")]
    assert len(dropped) == len(spikes)  # (a tick whose data is stale makes no scrape)
    lowest = min(spiked[0].observation.supported_clocks_mhz)
    assert all(r.requested_mhz != lowest for r in spiked[60:75] + spiked[90:105])
    assert "impossible counter jump: prompt_tokens_total" in caplog.text
    payload = read_stored(model_path(tmp_path / "spiked", "sim"))  # saveable, and saved
    assert payload["model"] == read_stored(model_path(tmp_path / "missed", "sim"))["model"]
    assert "learned model not saved" not in caplog.text
    assert "learned model refused" not in caplog.text


def test_a_dropped_scrape_and_a_re_anchored_counter_name_their_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every other failed scrape starts with its URL; an impossible counter, and the
    warning that a counter stayed at its new level, named only the counter, so on a node
    of several domains the operator could not tell which engine's page was bad."""
    from daemon_support import fixture_text

    url = "http://10.0.0.7:8000/metrics"
    good = fixture_text("vllm_dp2_synthetic.txt")
    prompt = 'vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
    wrapped = good.replace(f"{prompt} 60000.0", f"{prompt} 1.8e+19")
    jumped = good.replace(f"{prompt} 60000.0", f"{prompt} 6.0e+14")
    pages = [good, wrapped, good, jumped, jumped]
    source = ScrapedSource(url, fetch=lambda u, t: pages.pop(0))
    observer = DomainObserver([StubGpu()], source, stale_after_s=30.0)  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        ticks = [observer.observe(float(i), i, None) for i in range(5)]
    errors = [t.engine_error for t in ticks]
    assert errors[0] is None and errors[2] is None and errors[4] is None
    assert (errors[1] or "").startswith(f"{url}: impossible counter: prompt_tokens_total")
    assert (errors[3] or "").startswith(f"{url}: impossible counter jump: prompt_tokens_total")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    stayed = [line for line in warnings if "stayed at the level" in line]
    assert len(stayed) == 1 and stayed[0].startswith(f"{url}: "), warnings
    assert all(url in line for line in warnings if "impossible" in line), warnings


def _vllm_page(step: int, without: str = "") -> str:
    """A vLLM page after ``step`` scrapes of an engine that has served for days (50,000
    requests), 10 requests and 5,000 prompt tokens a scrape; lines of ``without`` left
    out."""
    done = 50_000 + 10 * step
    labels = 'engine="0",model_name="m"'
    lines = [
        f"vllm:num_requests_running{{{labels}}} 3",
        f"vllm:num_requests_waiting{{{labels}}} 1",
        f"vllm:prompt_tokens_total{{{labels}}} {500.0 * done}",
        f"vllm:generation_tokens_total{{{labels}}} {250.0 * done}",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {done}',
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.5"}} {done}',
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {done + 2}',
        f"vllm:time_to_first_token_seconds_count{{{labels}}} {done + 2}",
        f"vllm:time_to_first_token_seconds_sum{{{labels}}} {0.2 * (done + 2)}",
    ]
    return "".join(line + "\n" for line in lines if not without or not line.startswith(without))


@pytest.mark.parametrize(
    "family",
    ["vllm:prompt_tokens_total", "vllm:request_success_total", "vllm:time_to_first_token"],
)
def test_a_counter_missing_from_one_page_is_no_lifetime_of_work(family: str) -> None:
    """A page that lacks a counter for one scrape (a family the engine's collector left
    out once) read it as 0, a restart to every consumer, and the next page's lifetime
    value as one window's work: 25 million prompt tokens, or 50,000 requests finished
    and arrived, in one second (``mpc-online`` learned it as the node's speed). At its
    return the counters start from zero, as after a restart."""
    shown = [_vllm_page(0)]
    source = ScrapedSource("http://e/metrics", "vllm", fetch=lambda url, t: shown[0])
    observer = DomainObserver([StubGpu()], source, stale_after_s=30.0, ttft_slo_s=1.0)  # type: ignore[list-item]
    ticks = []
    for step in range(6):
        shown[0] = _vllm_page(step, without=family if step == 3 else "")
        observed = observer.observe(float(step), step, None)
        assert observed.engine_error is None, observed.engine_error
        ticks.append(observed.observation)
    for before, after in itertools.pairwise(ticks):
        assert after.prompt_tokens_total - before.prompt_tokens_total <= 5000.0
        assert after.completed_requests - before.completed_requests <= 10
        assert after.arrived_requests - before.arrived_requests <= 10
    assert all((t.ttft_count_total or 0.0) <= 50.0 for t in ticks)
