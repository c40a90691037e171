"""``gpugov_lowest_clock_hertz``: the lowest clock a domain's lock may hold, exported so
that the ``GpugovClocksLockedWhileIdle`` alert can tell an idle GPU parked there on
purpose (``mpc-online``'s ``idle-park``) from one held above it."""

from __future__ import annotations

from typing import Any

from fake_pynvml import FakeNvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.config import parse_config
from gpugov.daemon.exporter import LoopSnapshot, SnapshotCollector
from gpugov.daemon.service import domains_from_config


def _lowest(safety: dict[str, Any] | None = None) -> tuple[float | None, dict[str, float]]:
    section: dict[str, Any] = {
        "name": "prefill",
        "gpus": [0, 1],
        "role": "prefill",
        "ttft_slo_s": 1.0,
        "tpot_slo_s": 0.05,
        "engine": {"kind": "vllm", "url": "http://127.0.0.1:9/metrics"},
        "controller": {"kind": "fixed", "clock_mhz": 1410},
    }
    raw: dict[str, Any] = {"daemon": {"period_s": 1.0}, "domains": [section]}
    if safety is not None:
        section["safety"] = safety
    assembled = domains_from_config(parse_config(raw), nvml=FakeNvml(2))
    try:
        snapshot = assembled.domains[0].snapshot()
    finally:
        assembled.close()
    collector = SnapshotCollector()
    collector.publish([snapshot], LoopSnapshot(ticks_total=0, tick_seconds=0.0))
    registry = CollectorRegistry()
    registry.register(collector)
    exported = {
        sample.labels["domain"]: sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name == "gpugov_lowest_clock_hertz"
    }
    return snapshot.lowest_mhz, exported


def test_the_lowest_supported_clock_is_exported() -> None:
    # The fake GPUs support 345 to 1980 MHz in 15 MHz steps.
    assert _lowest() == (345.0, {"prefill": 345e6})


def test_the_floor_rounded_up_onto_the_supported_clocks_is_the_lowest() -> None:
    assert _lowest({"floor_mhz": 1000}) == (1005.0, {"prefill": 1005e6})
