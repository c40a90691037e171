"""End to end on a fake node: fake NVML, a real local /metrics server, virtual time."""

from __future__ import annotations

import os
import signal
import urllib.request
from typing import Any

import pytest
from daemon_support import MetricsServer, run_ticks
from fake_pynvml import FakeNvml
from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.config import parse_config
from gpugov.daemon.domain import TickRecord
from gpugov.daemon.errors import ConfigError, ControllerFailure, GpuLost, PermissionDenied
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.loop import TimedLoop, VirtualClock, run, stop_on_signals
from gpugov.daemon.service import domains_from_config

LOCK = "nvmlDeviceSetGpuLockedClocks"
RESET = "nvmlDeviceResetGpuLockedClocks"


def _config(url: str, **domain: Any) -> Any:
    section = {
        "name": "llm",
        "gpus": [0, 1],
        "engine": {"kind": "vllm", "url": url, "timeout_s": 0.9},
        "controller": {"kind": "fixed", "clock_mhz": 1410},
        **domain,
    }
    return parse_config({"daemon": {"period_s": 1.0}, "domains": [section]})


def test_locks_once_and_resets_on_stop(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    records, stats = run_ticks(assembled.domains, 5)
    assembled.close()
    assert stats.ticks == 5
    assert [r.requested_mhz for r in records] == [1410.0] * 5
    # A tick's writes to the domain's GPUs start together: each GPU locked once, then reset.
    locks, resets = fake.writes[:2], fake.writes[2:]
    assert sorted(locks) == [(LOCK, 0, 1410, 1410), (LOCK, 1, 1410, 1410)]
    assert sorted(resets) == [(RESET, 0), (RESET, 1)]
    assert records[-1].observation.waiting_requests == 4  # two DP engines summed
    assert records[-1].observation.power_w == pytest.approx(700.0)  # two GPUs summed
    assert fake.initialized == 0
    assert vllm_server.requests == 6  # one read at start for the role labels, one a tick


def test_engine_down_then_back(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2)
    config = _config(vllm_server.url, stale_after_s=2.5)
    assembled = domains_from_config(config, nvml=fake)
    exporter = Exporter(port=0)
    scraped: dict[int, str] = {}

    def on_step(step: int, records: list[TickRecord]) -> None:
        if step == 2:
            vllm_server.down = True
        if step == 8:
            vllm_server.down = False
        if step in (6, 10):
            with urllib.request.urlopen(exporter.url, timeout=5) as response:
                scraped[step] = response.read().decode()

    try:
        records, _ = run_ticks(assembled.domains, 11, on_step=on_step, exporter=exporter)
    finally:
        exporter.close()
        assembled.close()
    failsafe = [r.failsafe for r in records]
    # Down from step 3; stale once the last good data (step 2) is older than 2.5 s.
    assert failsafe == [False] * 5 + [True] * 4 + [False] * 2
    assert [r.requested_mhz for r in records[5:9]] == [1980.0] * 4
    assert records[9].requested_mhz == 1410.0
    assert all(r.engine_error for r in records[3:9])
    locks = [w for w in fake.writes if w[0] == LOCK and w[1] == 0]
    assert locks == [(LOCK, 0, 1410, 1410), (LOCK, 0, 1980, 1980), (LOCK, 0, 1410, 1410)]
    during = {s.name: s for f in text_string_to_metric_families(scraped[6]) for s in f.samples}
    assert during["gpugov_failsafe_active"].value == 1.0
    assert during["gpugov_engine_scrape_errors_total"].value == 4.0
    after = {
        (s.name, s.labels.get("reason")): s.value
        for f in text_string_to_metric_families(scraped[10])
        for s in f.samples
    }
    assert after[("gpugov_failsafe_active", None)] == 0.0
    assert after[("gpugov_fallbacks_total", "engine_stale")] == 4.0
    assert after[("gpugov_applied_clock_hertz", None)] == 1410e6


def test_failsafe_unlock_mode(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(1)
    config = _config(vllm_server.url, gpus=[0], failsafe="unlock", stale_after_s=1.5)

    def on_step(step: int, records: list[TickRecord]) -> None:
        vllm_server.down = step >= 1

    assembled = domains_from_config(config, nvml=fake)
    records, _ = run_ticks(assembled.domains, 5, on_step=on_step)
    assembled.close()
    assert records[-1].failsafe and records[-1].applied_mhz is None
    assert fake.writes[:2] == [(LOCK, 0, 1410, 1410), (RESET, 0)]


def test_no_engine_at_start_goes_failsafe(metrics_server: MetricsServer) -> None:
    metrics_server.down = True
    fake = FakeNvml(1)
    assembled = domains_from_config(_config(metrics_server.url, gpus=[0]), nvml=fake)
    records, _ = run_ticks(assembled.domains, 2)
    assembled.close()
    assert all(r.failsafe for r in records)
    assert fake.writes[0] == (LOCK, 0, 1980, 1980)


def test_permission_denied_stops_with_nothing_locked(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2, permission=False)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    with pytest.raises(PermissionDenied, match="CAP_SYS_ADMIN"):
        run_ticks(assembled.domains, 5)
    assembled.close()
    assert fake.writes == []
    assert fake.locked(0) is None and fake.locked(1) is None


def test_gpu_lost_mid_run_resets_the_rest(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)

    def on_step(step: int, records: list[TickRecord]) -> None:
        if step == 2:
            fake.lose(1)

    with pytest.raises(GpuLost):
        run_ticks(assembled.domains, 10, on_step=on_step)
    assembled.close()
    assert fake.locked(0) is None
    assert fake.writes[-1] == (RESET, 0)


def test_transient_read_errors_survived(vllm_server: MetricsServer) -> None:
    import fake_pynvml as fp

    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)

    def on_step(step: int, records: list[TickRecord]) -> None:
        if step == 1:
            fake.fail("nvmlDeviceGetTemperatureV", fp.NVML_ERROR_TIMEOUT, times=2)

    records, stats = run_ticks(assembled.domains, 5, on_step=on_step)
    assembled.close()
    assert stats.ticks == 5
    assert records[2].gpu_read_errors == ("0:temperature", "1:temperature")
    assert assembled.domains[0].observer.gpus.gpu_read_errors == {"0": 1, "1": 1}


def test_sigterm_resets_clocks(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    clock = VirtualClock()
    loop = TimedLoop(1.0, clock=clock, sleep=clock.sleep)

    def on_step(step: int, records: list[TickRecord]) -> None:
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with stop_on_signals(loop.stop):
        records, _ = run_ticks(assembled.domains, 1000, on_step=on_step, loop=loop)
    assembled.close()
    assert len(records) == 4
    assert sorted(fake.writes[-2:]) == [(RESET, 0), (RESET, 1)]  # started together
    assert fake.locked(0) is None and fake.locked(1) is None


def test_a_controller_exception_is_survived_with_the_failsafe(
    vllm_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    domain = assembled.domains[0]
    calls = {"n": 0}
    inner = domain.controller

    def flaky(observation: Any) -> float:
        calls["n"] += 1
        if calls["n"] in (3, 4):
            raise ZeroDivisionError("bug in controller")
        return float(inner(observation))

    domain.controller = flaky
    with caplog.at_level("WARNING", logger="gpugov.daemon.loop"):
        records, stats = run_ticks(assembled.domains, 8)
    assembled.close()
    assert stats.ticks == 8
    # Ticks 2 and 3 hold the fail-safe (the top clock), then the controller decides again.
    assert [r.failsafe for r in records] == [False] * 2 + [True] * 2 + [False] * 4
    assert [r.requested_mhz for r in records] == [1410.0] * 2 + [1980.0] * 2 + [1410.0] * 4
    assert domain.fallback_counts()["controller_error"] == 2
    assert domain.controller_failures == 0
    raised = [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]
    assert len(raised) == 1 and "ZeroDivisionError" in raised[0]  # logged once
    assert any("decides again" in r.getMessage() for r in caplog.records)
    assert sorted(fake.writes[-2:]) == [(RESET, 0), (RESET, 1)]  # started together


def test_controller_exception_in_unlock_mode_unlocks(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(1)
    config = _config(vllm_server.url, gpus=[0], failsafe="unlock")
    assembled = domains_from_config(config, nvml=fake)
    domain = assembled.domains[0]
    inner = domain.controller

    def flaky(observation: Any) -> float:
        if observation.step_index == 2:
            raise RuntimeError("solver exploded")
        return float(inner(observation))

    domain.controller = flaky
    records, _ = run_ticks(assembled.domains, 4)
    assembled.close()
    assert records[2].failsafe and records[2].applied_mhz is None
    assert fake.writes[:3] == [(LOCK, 0, 1410, 1410), (RESET, 0), (LOCK, 0, 1410, 1410)]


def test_controller_failing_in_a_row_stops_the_daemon_with_clocks_reset(
    vllm_server: MetricsServer,
) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), nvml=fake)
    domain = assembled.domains[0]
    inner = domain.controller

    def broken(observation: Any) -> float:
        if observation.step_index >= 2:
            raise ZeroDivisionError("bug in controller")
        return float(inner(observation))

    domain.controller = broken
    clock = VirtualClock()
    records: list[TickRecord] = []
    with pytest.raises(ControllerFailure, match="ZeroDivisionError") as info:
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            on_tick=records.extend,
            before_tick=lambda now, step: step >= 100,
            max_controller_failures=3,
        )
    assembled.close()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "3 time(s) in a row" in str(info.value)
    assert len(records) == 4  # two decisions, two survived failures, the third stops it
    assert domain.fallback_counts()["controller_error"] == 3
    assert sorted(fake.writes[-2:]) == [(RESET, 0), (RESET, 1)]  # started together
    assert fake.locked(0) is None and fake.locked(1) is None


class _Closing:
    """A controller that records when it is closed and may fail doing so."""

    def __init__(self, events: list[str], name: str, error: Exception | None) -> None:
        self.events, self.name, self.error = events, name, error

    def __call__(self, observation: Any) -> float:
        return 1410.0

    def close(self) -> None:
        self.events.append(f"close {self.name}")
        if self.error is not None:
            raise self.error


def test_exit_resets_first_then_closes_each_controller_on_its_own(
    vllm_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    from gpugov.daemon.safety import with_safety

    fake = FakeNvml(2)
    config = parse_config(
        {
            "domains": [
                {"name": "a", "gpus": [0], "engine": {"url": vllm_server.url}},
                {"name": "b", "gpus": [1], "engine": {"url": vllm_server.url}},
            ]
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    events: list[str] = []
    for domain, error in zip(assembled.domains, (ValueError("bad state"), None), strict=True):
        clocks = domain.observer.gpus.supported_clocks_mhz()
        domain.controller = with_safety(_Closing(events, domain.name, error), clocks)
        restore = domain.actuator.restore

        def restoring(
            budget: Any = None, *, restore: Any = restore, name: str = domain.name
        ) -> list[str]:
            events.append(f"reset {name}")
            return restore(budget)  # type: ignore[no-any-return]

        domain.actuator.restore = restoring  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="gpugov.daemon.loop"):
        run_ticks(assembled.domains, 2)
    assembled.close()
    # Every reset before any close; a close that raises (not an OSError) neither skips
    # the resets nor the other domain's close.
    assert events == ["reset a", "reset b", "close a", "close b"]
    assert fake.locked(0) is None and fake.locked(1) is None
    assert any("closing the controller failed" in r.getMessage() for r in caplog.records)


def test_dry_run_writes_nothing(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(2)
    assembled = domains_from_config(_config(vllm_server.url), dry_run=True, nvml=fake)
    records, _ = run_ticks(assembled.domains, 3)
    assembled.close()
    assert fake.writes == []
    assert records[-1].applied_mhz == 1410  # what it would have locked
    dry = assembled.domains[0].observer.gpus.backends[0]
    assert dry.writes[0] == ("lock", 1410, 1410) and dry.writes[-1] == ("reset",)  # type: ignore[attr-defined]


def test_two_domains(vllm_server: MetricsServer) -> None:
    fake = FakeNvml(3)
    config = parse_config(
        {
            "domains": [
                {
                    "name": "a",
                    "gpus": [0, 1],
                    "engine": {"url": vllm_server.url},
                    "controller": {"kind": "fixed", "clock_mhz": 1200},
                },
                {"name": "b", "gpus": [2], "engine": {"url": vllm_server.url}},
            ]
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    records, _ = run_ticks(assembled.domains, 2)
    assembled.close()
    assert {(r.domain, r.requested_mhz) for r in records} == {("a", 1200.0), ("b", 1980.0)}
    assert sorted(w for w in fake.writes if w[0] == RESET) == [(RESET, 0), (RESET, 1), (RESET, 2)]


def test_gpus_with_no_clock_in_common_are_refused_in_one_line_with_nothing_left_open() -> None:
    from fake_pynvml import FakeGpu

    from gpugov.daemon.errors import NotSupported

    fake = FakeNvml(
        [
            FakeGpu(index=0, graphics_clocks_mhz=(1980, 1500, 900)),
            FakeGpu(index=1, graphics_clocks_mhz=(1410, 1005, 210)),
        ]
    )
    config = parse_config(
        {"domains": [{"name": "tp", "gpus": [0, 1], "engine": {"url": "http://127.0.0.1:9/m"}}]}
    )
    with pytest.raises(NotSupported, match="no supported SM clock in common"):
        domains_from_config(config, nvml=fake)
    assert fake.initialized == 0  # every GPU opened was closed again
    assert fake.writes == []


def test_a_gpu_failing_to_open_closes_the_ones_opened_before_it() -> None:
    from gpugov.daemon.errors import GpuUnavailable

    fake = FakeNvml(1)  # GPU 1 does not exist
    config = parse_config(
        {"domains": [{"name": "tp", "gpus": [0, 1], "engine": {"url": "http://127.0.0.1:9/m"}}]}
    )
    with pytest.raises(GpuUnavailable):
        domains_from_config(config, nvml=fake)
    assert fake.initialized == 0


def test_one_gpu_named_by_index_and_by_uuid_in_two_domains_is_refused(
    vllm_server: MetricsServer,
) -> None:
    """The config compares spellings; the opened GPUs' UUIDs catch GPU 0 named as ``0``
    in one domain and as its UUID in another, and every opened GPU is closed again."""
    fake = FakeNvml(2)
    domain = {"engine": {"kind": "vllm", "url": vllm_server.url}, "controller": {"kind": "max"}}
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {"name": "a", "gpus": [0], **domain},
                {"name": "b", "gpus": [1, "GPU-fake-0000"], **domain},
            ],
        }
    )
    with pytest.raises(ConfigError, match=r"domain 'b': GPU GPU-fake-0000 is .*'a'.* GPU 0"):
        domains_from_config(config, nvml=fake)
    assert fake.initialized == 0
    assert [w for w in fake.writes if w[0] == LOCK] == []


def _fail_safe_at_a_short_period(vllm_server: MetricsServer, failsafe: str) -> list[TickRecord]:
    """20 ticks at a 0.05 s period of a fixed 1410 MHz domain (dwell 0.5 s, relock 0.1 s)
    whose engine misses the scrapes of steps 1 and 2: its fail-safe (``failsafe``) acts."""
    fake = FakeNvml(2)
    section = {
        "name": "llm",
        "gpus": [0, 1],
        "failsafe": failsafe,
        "stale_after_s": 0.08,
        "engine": {"kind": "vllm", "url": vllm_server.url, "timeout_s": 0.025},
        "controller": {"kind": "fixed", "clock_mhz": 1410},
        "safety": {"dwell_s": 0.5, "min_relock_interval_s": 0.1},
    }
    config = parse_config({"daemon": {"period_s": 0.05}, "domains": [section]})
    assembled = domains_from_config(config, nvml=fake)

    def on_step(step: int, records: list[TickRecord]) -> None:
        vllm_server.down = step in (1, 2)

    clock = VirtualClock()
    loop = TimedLoop(0.05, clock=clock, sleep=clock.sleep)
    records, _ = run_ticks(assembled.domains, 20, on_step=on_step, loop=loop)
    assembled.close()
    return records


def test_the_fail_safe_top_clock_is_held_for_the_dwell_and_no_relock_comes_sooner(
    vllm_server: MetricsServer,
) -> None:
    """At a 0.05 s period the engine misses scrapes for a moment: the fail-safe locks the
    top clock, and the controller's lower clock waits out the dwell after it, so no two
    clock changes come within the relock interval (the next decision relocked at once)."""
    records = _fail_safe_at_a_short_period(vllm_server, "max")
    applied = [(r.time_s, r.applied_mhz) for r in records]
    assert [r.failsafe for r in records].count(True) >= 1
    changes = [t for (t, mhz), (_, was) in zip(applied[1:], applied, strict=False) if mhz != was]
    assert len(changes) == 2  # up to the top clock, and back down once
    assert changes[1] - changes[0] >= 0.5 - 1e-9  # the top clock held for the dwell
    assert applied[-1][1] == 1410


def test_after_the_unlock_fail_safe_the_clock_is_not_lowered_within_the_dwell(
    vllm_server: MetricsServer,
) -> None:
    """The unlock fail-safe runs the GPUs up to their top clock: once the controller decides
    again the chain holds the top clock for its dwell (a lock at it), where it locked the
    controller's lower clock 50 ms after the reset at a 0.05 s period."""
    records = _fail_safe_at_a_short_period(vllm_server, "unlock")
    unlocked = [r.time_s for r in records if r.failsafe]
    lowered = [r.time_s for r in records if not r.failsafe and r.requested_mhz == 1410.0]
    back = [t for t in lowered if t > unlocked[-1]]
    assert unlocked and back and back[0] - unlocked[0] >= 0.5 - 1e-9
    assert records[-1].applied_mhz == 1410
