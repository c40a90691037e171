"""Several domains on a node are observed at once: one domain's hung engine or slow GPU
reads never hold another domain's decision (``daemon.loop.ConcurrentObservation``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from daemon_support import MetricsServer, run_ticks
from fake_pynvml import FakeNvml

from gpugov.daemon.config import parse_config
from gpugov.daemon.domain import Domain, TickRecord
from gpugov.daemon.engines import EngineSample, EngineSource
from gpugov.daemon.errors import GpuLost
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.service import Assembled, domains_from_config

RESET = "nvmlDeviceResetGpuLockedClocks"


class MeetingSource:
    """An engine source whose scrape returns only once every domain's scrape has begun
    (a ``threading.Barrier``): read one after another, the first one waits out the
    barrier's timeout and fails; read at once, every one passes straight through."""

    def __init__(self, inner: EngineSource, barrier: threading.Barrier) -> None:
        self.inner = inner
        self.barrier = barrier
        self.threads: list[str] = []

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        self.threads.append(threading.current_thread().name)
        self.barrier.wait()
        return self.inner.scrape(timeout_s)


def _assembled(url: str, fake: FakeNvml) -> Assembled:
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": name,
                    "gpus": gpus,
                    "engine": {"kind": "vllm", "url": url, "timeout_s": 0.9},
                    "controller": {"kind": "fixed", "clock_mhz": mhz},
                }
                for name, gpus, mhz in (("a", [0], 1200), ("b", [1], 1410), ("c", [2], 1605))
            ],
        }
    )
    return domains_from_config(config, nvml=fake)


def _run(domains: Sequence[Domain], ticks: int, **options: Any) -> list[TickRecord]:
    return run_ticks(domains, ticks, **options)[0]


def test_domains_are_observed_at_once_and_decide_in_order(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(3)
    assembled = _assembled(vllm_server.url, fake)
    barrier = threading.Barrier(3, timeout=10.0)
    sources = []
    for domain in assembled.domains:
        source = MeetingSource(domain.observer.source, barrier)
        domain.observer.source = source
        sources.append(source)
    try:
        records = _run(assembled.domains, 3, concurrent_observation=True)
    finally:
        assembled.close()
    assert not barrier.broken
    assert [(r.step, r.domain, r.requested_mhz) for r in records] == [
        (step, name, mhz)
        for step in range(3)
        for name, mhz in (("a", 1200.0), ("b", 1410.0), ("c", 1605.0))
    ]
    assert not any(r.failsafe for r in records)
    for source in sources:
        assert all(name.startswith("gpugov-observe") for name in source.threads)
    assert [fake.locked(i) for i in range(3)] == [None, None, None]  # reset at the end


def test_a_simulated_run_keeps_observing_in_order(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(3)
    assembled = _assembled(vllm_server.url, fake)
    seen: list[str] = []
    for domain in assembled.domains:
        inner = domain.observer.source

        class Recording:
            def __init__(self, inner: EngineSource, name: str) -> None:
                self.inner, self.name = inner, name

            def scrape(self, timeout_s: float | None = None) -> EngineSample:
                seen.append(f"{self.name}@{threading.current_thread().name}")
                return self.inner.scrape(timeout_s)

        domain.observer.source = Recording(inner, domain.name)
    try:
        _run(assembled.domains, 2)
    finally:
        assembled.close()
    main = threading.main_thread().name
    assert seen == [f"{name}@{main}" for _ in range(2) for name in ("a", "b", "c")]


def test_a_gpu_lost_in_one_domain_is_raised_after_the_others_observed(
    vllm_server: MetricsServer,
) -> None:
    fake = FakeNvml(3)
    assembled = _assembled(vllm_server.url, fake)
    observed_after: list[str] = []

    def on_tick(records: Sequence[TickRecord]) -> None:
        if records[0].step == 1:
            fake.lose(1)  # domain b's GPU, in the middle of the domains

    original = assembled.domains[2].observe

    def observe_c(now_s: float, step: int) -> Any:
        result = original(now_s, step)
        observed_after.append(f"c:{step}")
        return result

    assembled.domains[2].observe = observe_c  # type: ignore[method-assign]
    clock = VirtualClock()
    with pytest.raises(GpuLost) as caught:
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            on_tick=on_tick,
            before_tick=lambda now, step: step >= 5,
            concurrent_observation=True,
        )
    assembled.close()
    assert caught.value.gpu == "1" and caught.value.mid_run
    assert "c:2" in observed_after  # domain c's observation of that tick finished
    assert fake.locked(0) is None and fake.locked(2) is None  # the others were reset
    assert {w for w in fake.writes if w[0] == RESET} >= {(RESET, 0), (RESET, 2)}
