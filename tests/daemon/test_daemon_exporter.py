"""Exporter: own registry, live values over HTTP, a clean exposition."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from daemon_support import MetricsServer, node_commands_on, run_ticks
from fake_pynvml import FakeNvml
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.config import parse_config
from gpugov.daemon.exporter import (
    DomainSnapshot,
    Exporter,
    LoopSnapshot,
    SnapshotCollector,
    SolveHistogram,
)
from gpugov.daemon.service import domains_from_config
from gpugov.plant.types import ServingObservation

UNIT_SUFFIXES = ("_watts", "_joules", "_celsius", "_hertz", "_seconds", "_ratio", "_requests")


def _snapshot() -> DomainSnapshot:
    histogram = SolveHistogram()
    for seconds in (0.0004, 0.02, 0.3):
        histogram.observe(seconds)
    observation = ServingObservation(
        time_s=5.0,
        step_index=5,
        arrived_requests=10,
        prefill_remaining_tokens=100.0,
        decode_active=3,
        generated_decode_tokens=10.0,
        temperature_c=61.0,
        waiting_requests=2,
        completed_requests=7,
        output_tokens_total=1234.0,
        prompt_tokens_total=5678.0,
        power_w=650.0,
        ttft_recent_s=0.25,
        tpot_recent_s=0.02,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
    )
    gpus = (
        GpuSample(
            "0",
            power_w=350.0,
            energy_j=1000.0,
            temperature_c=61.0,
            sm_clock_mhz=1410.0,
            utilization=0.8,
            clock_event_reasons=4,
            power_limit_w=700.0,
        ),
        GpuSample("1", power_w=300.0, read_errors=("temperature",)),
    )
    return DomainSnapshot(
        domain="llm",
        controller="mpc",
        gpus=gpus,
        observation=observation,
        requested_mhz=1410.0,
        applied_mhz=1410.0,
        clock_locked=True,
        failsafe=False,
        engine_age_s=0.0,
        engine_scrape_s=0.002,
        decisions_total=6,
        clock_writes_total=2,
        engine_errors_total=1,
        gpu_read_errors_total={"0": 0, "1": 3},
        clock_write_failures_total={"0": 0, "1": 5},
        fallbacks_total={"engine_stale": 2},
        solve_buckets=tuple(histogram.buckets()),
        solve_sum_s=histogram.sum_s,
        model={
            "samples": 120,
            "confidence": 0.75,
            "exploring": True,
            "warmed_up": True,
            "residual_rms": {"busy_s": 0.01, "energy_j": 3.0, "temperature_c": 0.1},
            "floor_mhz": 1200.0,
            "reason": "burst-guard",
            "backoffs": 2,
            "resets": 1,
            "slo_budget": {
                "target": 0.99,
                "attainment": 0.995,
                "looseness": 1.2,
                "applied_looseness": 1.0,
                "ahead": True,
            },
        },
    )


@pytest.fixture
def page() -> str:
    with Exporter("127.0.0.1", 0) as exporter:
        assert exporter.url.startswith("http://127.0.0.1:")
        exporter.publish(
            [_snapshot()], LoopSnapshot(ticks_total=6, overruns_total=1, tick_seconds=0.0003)
        )
        with urllib.request.urlopen(exporter.url, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            return response.read().decode()


def test_values_and_labels(page: str) -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("gpugov_gpu_power_watts", domain="llm", gpu="0") == 350.0
    assert value("gpugov_gpu_energy_joules_total", domain="llm", gpu="0") == 1000.0
    assert value("gpugov_gpu_sm_clock_hertz", domain="llm", gpu="0") == 1410e6
    assert value("gpugov_gpu_temperature_celsius", domain="llm", gpu="0") == 61.0
    assert value("gpugov_gpu_utilization_ratio", domain="llm", gpu="0") == 0.8
    assert value("gpugov_gpu_read_errors_total", domain="llm", gpu="1") == 3.0
    assert ("gpugov_gpu_temperature_celsius", (("domain", "llm"), ("gpu", "1"))) not in samples
    assert value("gpugov_requested_clock_hertz", domain="llm", controller="mpc") == 1410e6
    assert value("gpugov_applied_clock_hertz", domain="llm") == 1410e6
    assert value("gpugov_clock_writes_total", domain="llm") == 2.0
    assert value("gpugov_clock_write_failures_total", domain="llm", gpu="0") == 0.0
    assert value("gpugov_clock_write_failures_total", domain="llm", gpu="1") == 5.0
    assert value("gpugov_decisions_total", domain="llm", controller="mpc") == 6.0
    assert (
        value("gpugov_fallbacks_total", domain="llm", controller="mpc", reason="engine_stale")
        == 2.0
    )
    assert value("gpugov_controller_solve_seconds_count", domain="llm", controller="mpc") == 3.0
    assert (
        value(
            "gpugov_controller_solve_seconds_bucket",
            domain="llm",
            controller="mpc",
            le="0.001",
        )
        == 1.0
    )
    assert value("gpugov_queue_waiting_requests", domain="llm") == 2.0
    assert value("gpugov_queue_running_requests", domain="llm") == 3.0
    assert value("gpugov_ttft_seconds", domain="llm") == 0.25
    assert value("gpugov_tpot_slo_seconds", domain="llm") == 0.05
    assert value("gpugov_model_slo_attainment_ratio", domain="llm") == 0.995
    assert value("gpugov_model_slo_looseness_ratio", domain="llm") == 1.2
    assert value("gpugov_model_slo_applied_looseness_ratio", domain="llm") == 1.0
    assert value("gpugov_model_slo_spending_active", domain="llm") == 1.0
    assert value("gpugov_model_slo_target_ratio", domain="llm") == 0.99
    assert value("gpugov_failsafe_active", domain="llm") == 0.0
    assert value("gpugov_observation_age_seconds", domain="llm") == 0.0
    assert value("gpugov_engine_scrape_errors_total", domain="llm") == 1.0
    assert value("gpugov_output_tokens_total", domain="llm") == 1234.0
    assert value("gpugov_prompt_tokens_total", domain="llm") == 5678.0
    assert value("gpugov_completed_requests_total", domain="llm") == 7.0
    assert value("gpugov_loop_ticks_total") == 6.0
    assert value("gpugov_loop_overruns_total") == 1.0
    build = [k for k in samples if k[0] == "gpugov_build_info"]
    assert build and dict(build[0][1])["version"]


def test_online_model_gauges(page: str) -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }
    key = (("domain", "llm"),)
    assert samples[("gpugov_model_samples_total", key)] == 120.0
    assert samples[("gpugov_model_confidence_ratio", key)] == 0.75
    assert samples[("gpugov_model_exploration_active", key)] == 1.0
    assert samples[("gpugov_model_warmup_active", key)] == 0.0
    assert samples[("gpugov_model_busy_residual_seconds", key)] == 0.01
    assert samples[("gpugov_model_energy_residual_joules", key)] == 3.0
    assert samples[("gpugov_model_floor_hertz", key)] == 1200e6
    assert samples[("gpugov_model_burst_guard_active", key)] == 1.0
    assert samples[("gpugov_model_decode_descent_active", key)] == 0.0
    assert samples[("gpugov_model_backoffs_total", key)] == 2.0


@pytest.mark.parametrize(
    ("reason", "guard", "descent"),
    [("warm-up-guard", 1.0, 0.0), ("warm-up-descent", 0.0, 1.0), ("mpc", 0.0, 0.0)],
)
def test_the_guard_and_descent_gauges_follow_the_reason(
    reason: str, guard: float, descent: float
) -> None:
    # A prefill pool's warm-up clock is the burst guard's; a decode-only warm-up
    # window's is the descent's.
    snapshot = _snapshot()
    model = {**(snapshot.model or {}), "reason": reason}
    with Exporter("127.0.0.1", 0) as exporter:
        exporter.publish([replace(snapshot, model=model)], LoopSnapshot(ticks_total=1))
        with urllib.request.urlopen(exporter.url, timeout=5) as response:
            text = response.read().decode()
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("gpugov_model_")
    }
    assert samples["gpugov_model_burst_guard_active"] == guard
    assert samples["gpugov_model_decode_descent_active"] == descent


def test_exposition_is_clean(page: str) -> None:
    helps = set(re.findall(r"^# HELP (\S+) ", page, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M))
    assert helps == set(types)
    for name, kind in types.items():
        assert name.startswith("gpugov_"), name
        assert re.fullmatch(r"[a-z_]+", name), name
        if kind == "counter":
            assert name.endswith("_total"), name
        elif kind == "gauge" and not name.endswith(("_info", "_active")):
            assert name.endswith(UNIT_SUFFIXES) or name.endswith(("_locked", "_reasons")), name
    for line in page.splitlines():
        if line and not line.startswith("#"):
            metric = re.match(r"[a-z_]+", line).group(0)  # type: ignore[union-attr]
            assert any(metric.startswith(n) for n in types), line


def test_promtool_if_installed(page: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=page, text=True, capture_output=True
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_own_registry_not_global() -> None:
    exporter = Exporter(serve=False)
    assert exporter.registry is not REGISTRY
    names = {m.name for m in REGISTRY.collect()}
    assert not any(name.startswith("gpugov") for name in names)


def test_empty_before_first_tick() -> None:
    """Before the first tick (the start) the counters are 0 and nothing is measured yet: no
    period (the config's is not known here) and no tick duration, where a period of 1 s
    and a tick of 0 s were shown."""
    exporter = Exporter(serve=False)
    families = {m.name for m in exporter.registry.collect()}
    assert "gpugov_build" in families
    get = exporter.registry.get_sample_value
    assert get("gpugov_loop_ticks_total") == 0.0
    assert get("gpugov_loop_period_seconds") is None
    assert get("gpugov_loop_tick_duration_seconds") is None
    exporter.publish([], LoopSnapshot(ticks_total=1, tick_seconds=0.01, period_s=0.25))
    assert get("gpugov_loop_period_seconds") == 0.25
    assert get("gpugov_loop_tick_duration_seconds") == 0.01


def test_health_allows_three_periods_of_a_slow_loop_and_the_start() -> None:
    """A 60 s period is not a stall until three periods pass; before the first tick the
    start may take START_ALLOWANCE_S; /metrics is never affected."""
    from gpugov.daemon.exporter import START_ALLOWANCE_S

    now = [0.0]
    exporter = Exporter(serve=False, clock=lambda: now[0])
    now[0] = START_ALLOWANCE_S
    assert exporter.health()[0]
    now[0] += 1.0
    alive, line = exporter.health()
    assert not alive and "since the start" in line
    exporter.publish([], LoopSnapshot(ticks_total=1, period_s=60.0))
    now[0] += 170.0
    assert exporter.health()[0]
    now[0] += 20.0
    alive, line = exporter.health()
    assert not alive and line.startswith("stalled: no control tick for 190 s"), line


def _lock_gauges(snapshot: DomainSnapshot) -> dict[str, float]:
    """``gpugov_clock_locked`` and ``gpugov_applied_clock_hertz`` as a scrape shows them."""
    published = _published(snapshot)
    return {
        name: published[name]
        for name in ("gpugov_clock_locked", "gpugov_applied_clock_hertz")
        if name in published
    }


def test_a_domain_still_locked_after_one_gpu_was_yielded_is_shown_locked(
    vllm_server: MetricsServer,
) -> None:
    """With ``external_clock_policy = "yield"``, one GPU of two changed by someone else is
    left alone; gpugov still holds the other's lock, so the domain is locked at that clock
    (it was shown unlocked, ``gpugov_clock_locked 0``, with no applied clock)."""
    fake = FakeNvml(2)
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0, 1],
                    "external_clock_policy": "yield",
                    "engine": {"kind": "vllm", "url": vllm_server.url, "timeout_s": 0.9},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                }
            ],
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    domain = assembled.domains[0]
    seen: dict[int, dict[str, float]] = {}

    def on_step(step: int, records: list[Any]) -> None:
        seen[step] = _lock_gauges(domain.snapshot())
        if step == 1:
            fake.nvmlDeviceResetGpuLockedClocks(fake.gpus[1])  # nvidia-smi -rgc -i 1
        if step == 5:
            assert domain.actuator.yielded == {"1"} and fake.locked(0) == (1410, 1410)

    try:
        run_ticks([domain], 6, on_step=on_step)
    finally:
        assembled.close()
    locked = {"gpugov_clock_locked": 1.0, "gpugov_applied_clock_hertz": 1410e6}
    assert seen[1] == locked and seen[5] == locked


def test_a_scrape_can_ask_for_some_metrics_by_name() -> None:
    """``/metrics?name[]=...`` (prometheus_client's filter, a scrape config's ``params``)
    serves those series only; it served nothing, the collector's names being unknown."""
    with Exporter("127.0.0.1", 0) as exporter:
        exporter.publish([_snapshot()], LoopSnapshot(ticks_total=6))
        query = "?name[]=gpugov_loop_ticks_total&name[]=gpugov_gpu_power_watts"
        with urllib.request.urlopen(exporter.url + query, timeout=5) as response:
            page = response.read().decode()
    samples = [s for f in text_string_to_metric_families(page) for s in f.samples]
    assert sorted((s.name, s.labels.get("gpu"), s.value) for s in samples) == [
        ("gpugov_gpu_power_watts", "0", 350.0),
        ("gpugov_gpu_power_watts", "1", 300.0),
        ("gpugov_loop_ticks_total", None, 6.0),
    ]


def test_health_and_metrics_answer_while_the_start_opens_the_gpus(
    tmp_path: Path, metrics_server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/healthz`` says "starting" while ``run`` opens its GPUs (and builds its
    controllers), so the start may take START_ALLOWANCE_S as the units'
    ``TimeoutStartSec=`` does, and a pod's probes see it; nothing served there until the
    GPUs were open and reconciled. A stop during the start frees the port."""
    import gpugov.daemon.node_cli as node_cli

    node_commands_on(monkeypatch, FakeNvml(1))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = "127.0.0.1:{port}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
    )
    real = node_cli.domains_from_config
    seen: list[tuple[int, str]] = []

    def opening(*args: Any, **kwargs: Any) -> Any:
        for path in ("/healthz", "/metrics"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    seen.append((r.status, r.read().decode()))
            except OSError as error:
                seen.append((0, str(error)))
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(node_cli, "domains_from_config", opening)
    assert node_cli.main(["run", "--config", str(config)]) == 0
    (health_status, health), (metrics_status, metrics) = seen
    assert (health_status, health.split(":")[0]) == (200, "starting"), health
    assert metrics_status == 200 and "gpugov_loop_ticks_total 0.0" in metrics
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter binds
        again.bind(("127.0.0.1", port))  # no one listens there: closed with the run


@pytest.mark.parametrize("address", ["nothing", "127.0.0.1:99999", "held"])
def test_run_simulate_refuses_a_bad_metrics_address_before_the_trace_is_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], address: str
) -> None:
    """``run --simulate --metrics-address`` that cannot be served is one line before any
    work, as for a node; it was found only once the trace was read and the controller
    built and warmed up (a port in use too)."""
    import gpugov.daemon.node_cli as node_cli
    import gpugov.daemon.run_simulated as run_simulated

    def read(*args: object, **kwargs: object) -> None:
        raise AssertionError("the trace was read")

    monkeypatch.setattr(run_simulated, "load_trace_for_cli", read)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        if address == "held":
            address = f"127.0.0.1:{holder.getsockname()[1]}"
        argv = ["run", "--simulate", "--virtual", "--metrics-address", address]
        assert node_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpugov: error: ") and "--metrics-address" in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_estimated_request_energy_histogram_is_valid_openmetrics() -> None:
    """The energy per request histogram places a window's requests across its buckets in
    shares (docs/energy.md), so its counts were fractions: OpenMetrics, what Prometheus
    asks for, takes whole counts only, and prometheus_client's own parser refused the page.
    Counts are whole requests now, cumulative and never decreasing; the sum is kept."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_openmetrics,
    )

    from gpugov.daemon.energy import EnergySnapshot, ModelEnergyView, Rates

    def with_buckets(buckets: tuple[tuple[str, float], ...]) -> DomainSnapshot:
        view = ModelEnergyView(
            model="m",
            prefill_j=1.0,
            decode_j=2.0,
            idle_j=0.0,
            prompt_tokens=10.0,
            output_tokens=5.0,
            finished_requests=3.0,
            windows=(("fit", 1),),
            rates=Rates(None, None, None, None, None),
            histogram_buckets=buckets,
            histogram_sum_j=11075.5,
        )
        return replace(_snapshot(), energy=EnergySnapshot(models=(view,), skipped=()))

    exporter = Exporter(serve=False)
    shown: list[list[float]] = []
    for buckets in (
        (("5.0", 0.865), ("10.0", 3.0175), ("20.0", 41.16), ("+Inf", 212.99999999999997)),
        (("5.0", 1.4), ("10.0", 3.6), ("20.0", 41.4), ("+Inf", 213.6)),
    ):
        exporter.publish([with_buckets(buckets)], LoopSnapshot(ticks_total=1))
        (family,) = [
            f
            for f in parse_openmetrics(openmetrics(exporter.registry).decode())
            if f.name == "gpugov_energy_request_joules"
        ]
        counts = {s.name: s.value for s in family.samples if s.name.endswith(("_count", "_sum"))}
        assert counts == {
            "gpugov_energy_request_joules_count": round(buckets[-1][1]),
            "gpugov_energy_request_joules_sum": 11075.5,
        }
        shown.append([s.value for s in family.samples if s.name.endswith("_bucket")])
    assert shown == [[1, 3, 41, 213], [1, 4, 41, 214]]


def _outside_domain(monkeypatch: pytest.MonkeyPatch, url: str, make: Any) -> Any:
    """One domain on a fake GPU whose controller is an outside package's, ``make`` its
    factory (a module of its own), reading the vLLM page at ``url``: its assembled domains."""
    import types

    plugin = types.ModuleType("gpugov_outside_status_plugin")
    plugin.make = make  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpugov_outside_status_plugin", plugin)
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {"kind": "vllm", "url": url, "timeout_s": 0.9},
                    "controller": {
                        "kind": "external",
                        "factory": "gpugov_outside_status_plugin:make",
                    },
                }
            ],
        }
    )
    return domains_from_config(config, nvml=FakeNvml(1))


class _StatusReporting:
    """An outside controller (the top clock) with a ``status()`` of its own: a dict that
    is not mpc-online's, or an error."""

    def __init__(self, clocks: Sequence[float], raises: bool) -> None:
        self.clocks, self.raises = clocks, raises

    def __call__(self, observation: ServingObservation) -> float:
        return self.clocks[-1]

    answered = 0
    """Statuses given, over every instance (the warm-up decides on a copy)."""

    def status(self) -> dict[str, Any]:
        if self.raises:
            raise RuntimeError("status is broken")
        _StatusReporting.answered += 1
        return {"samples": "many", "confidence": None, "residual_rms": "n/a", "resets": [1]}


@pytest.mark.parametrize("raises", [False, True], ids=["odd-status", "status-raises"])
def test_an_outside_controllers_own_status_neither_breaks_a_scrape_nor_the_loop(
    vllm_server: MetricsServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    raises: bool,
) -> None:
    """A controller from another package with a ``status()`` method is taken for a learner
    and its status exported as the learned model's. A status of other values made every
    scrape a 500 (a traceback on stderr); one that raised ended the run."""
    _StatusReporting.answered = 0
    assembled = _outside_domain(
        monkeypatch,
        vllm_server.url,
        lambda context: _StatusReporting(context.supported_clocks_mhz, raises),
    )
    pages: list[str] = []
    with Exporter("127.0.0.1", 0) as exporter:

        def on_step(step: int, records: list[Any]) -> None:
            with urllib.request.urlopen(exporter.url, timeout=5) as response:
                pages.append(response.read().decode())

        try:
            with caplog.at_level(logging.WARNING):
                records, _ = run_ticks(assembled.domains, 4, on_step=on_step, exporter=exporter)
        finally:
            assembled.close()
    assert [r.decision_mhz for r in records] == [1980.0] * 4
    names = {s.name for f in text_string_to_metric_families(pages[-1]) for s in f.samples}
    assert "gpugov_loop_ticks_total" in names
    assert not names & {"gpugov_model_samples_total", "gpugov_model_confidence_ratio"}
    if not raises:  # read, and its values left out, not left unread
        assert _StatusReporting.answered > 0
    failed = [r.getMessage() for r in caplog.records if "status" in r.getMessage()]
    if raises:  # said once, not each tick
        assert len(failed) == 1 and "status is broken" in failed[0], failed


def test_a_scrape_that_fails_is_one_logged_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Should the collector fail, the scrape answers 500 with one line, and the log says
    it once; wsgiref printed a traceback on stderr for each scrape."""
    with Exporter("127.0.0.1", 0) as exporter:

        def broken(*args: object) -> None:
            raise ValueError("a snapshot nobody foresaw")

        monkeypatch.setattr(exporter.collector, "_families", broken)
        answers = []
        with caplog.at_level(logging.WARNING, logger="gpugov.daemon.exporter"):
            for _ in range(2):
                with pytest.raises(urllib.error.HTTPError) as failed:
                    urllib.request.urlopen(exporter.url, timeout=5)
                answers.append((failed.value.code, failed.value.read().decode()))
    assert answers == [(500, "metrics unavailable: ValueError: a snapshot nobody foresaw\n")] * 2
    assert "Traceback" not in capfd.readouterr().err
    lines = [r.getMessage() for r in caplog.records if "metrics" in r.getMessage()]
    assert lines == ["metrics scrape failed: ValueError: a snapshot nobody foresaw"], lines


def test_a_dry_run_shows_no_lock(vllm_server: MetricsServer) -> None:
    """A dry run (gpugov-observe.service) decides a clock but locks nothing: the decision
    is ``gpugov_requested_clock_hertz``, and the GPUs are shown unlocked; they were shown
    locked at the clock it would have set."""
    fake = FakeNvml(1)
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {"kind": "vllm", "url": vllm_server.url, "timeout_s": 0.9},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                }
            ],
        }
    )
    assembled = domains_from_config(config, dry_run=True, nvml=fake)
    domain = assembled.domains[0]
    seen: list[dict[str, float]] = []
    try:
        run_ticks(
            [domain], 3, on_step=lambda step, records: seen.append(_lock_gauges(domain.snapshot()))
        )
    finally:
        assembled.close()
    assert fake.writes == [] and domain.last_requested_mhz == 1410
    assert seen == [{"gpugov_clock_locked": 0.0}] * 3


_RELEASE_STATUS = threading.Event()
"""Releases :class:`_HungStatus` (module-level: the warm-up copies the controller)."""


class _HungStatus(_StatusReporting):
    """An outside controller whose ``status()`` blocks (on a lock its own work holds)."""

    def status(self) -> dict[str, Any]:
        _RELEASE_STATUS.wait(10.0)  # bounded, so the test process never keeps the thread
        return super().status()


def test_an_outside_controllers_hung_status_does_not_hold_the_loop(
    vllm_server: MetricsServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a node an outside controller's ``status()`` is waited for briefly on a worker
    thread, as its decisions are: one that blocks is said once and the ticks and scrapes
    go on (each tick's snapshot waited for it as long as it blocked)."""
    _RELEASE_STATUS.clear()
    assembled = _outside_domain(
        monkeypatch,
        vllm_server.url,
        lambda context: _HungStatus(context.supported_clocks_mhz, raises=False),
    )
    pages: list[str] = []
    try:
        with Exporter("127.0.0.1", 0) as exporter, caplog.at_level(logging.WARNING):

            def on_step(step: int, records: list[Any]) -> None:
                with urllib.request.urlopen(exporter.url, timeout=5) as response:
                    pages.append(response.read().decode())

            records, _ = run_ticks(assembled.domains, 4, on_step=on_step, exporter=exporter)
    finally:
        _RELEASE_STATUS.set()
        assembled.close()
    assert [r.decision_mhz for r in records] == [1980.0] * 4
    assert len(pages) == 4
    hung = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(hung) == 1, hung  # blocked, each tick waited for it and nothing was said


def test_an_mpc_domains_slo_target_is_exported_without_a_learned_models_gauges(
    vllm_server: MetricsServer,
) -> None:
    """``mpc`` spends an SLO target's budget as ``mpc-online`` does: its target, measured
    attainment and looseness are exported (nothing was: only a learner's status reached
    the page), and none of a learned model's gauges, which it has not."""
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "ttft_slo_s": 1.0,
                    "tpot_slo_s": 0.05,
                    "slo_target": {"attainment": 0.95, "window_s": 60.0},
                    "engine": {"kind": "vllm", "url": vllm_server.url, "timeout_s": 0.9},
                    "controller": {"kind": "mpc", "profile": "h100-sxm-llama3-8b"},
                }
            ],
        }
    )
    assembled = domains_from_config(config, nvml=FakeNvml(1))
    domain = assembled.domains[0]
    try:
        run_ticks([domain], 3)
        names = _published(domain.snapshot())
    finally:
        assembled.close()
    assert names["gpugov_model_slo_target_ratio"] == 0.95
    assert names["gpugov_model_slo_looseness_ratio"] == 1.0
    assert "gpugov_model_samples_total" not in names
    assert "gpugov_model_warmup_active" not in names


def _published(snapshot: DomainSnapshot) -> dict[str, float]:
    """The domain samples a scrape of ``snapshot`` shows, by name."""
    collector = SnapshotCollector()
    collector.publish([snapshot], LoopSnapshot())
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def test_the_ttft_slo_published_is_that_of_the_ticks_first_tokens() -> None:
    """``gpugov_ttft_seconds`` is the tick's mean first token, and the recording rule
    ``domain:gpugov_slo_met:bool`` judges it against ``gpugov_ttft_slo_seconds``: under a
    per-prompt allowance that is their SLO (the flat one plus the allowance at their mean
    prompt). The flat SLO alone judged a long prompt's first token within its own SLO a
    miss, and GpugovSLOAttainmentLow fired on a node meeting every SLO."""
    snapshot = _snapshot()
    assert snapshot.observation is not None
    long_prompts = replace(
        snapshot.observation,
        ttft_recent_s=1.8,
        ttft_slo_per_prompt_token_s=5e-5,
        ttft_recent_prompt_tokens=20_000.0,
    )
    published = _published(replace(snapshot, observation=long_prompts))
    assert published["gpugov_ttft_seconds"] == 1.8
    assert published["gpugov_ttft_slo_seconds"] == pytest.approx(2.0)  # 1 s + 20k x 50 us
    unknown = replace(long_prompts, ttft_recent_prompt_tokens=None)
    assert _published(replace(snapshot, observation=unknown))["gpugov_ttft_slo_seconds"] == 1.0
