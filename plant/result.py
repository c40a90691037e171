"""Simulation results: time series on the plant grid, per-request records and metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.types import RequestRecord, ttft_slo_at

SERIES_NAMES = (
    "time_s",
    "prefill_queue",
    "decode_active",
    "completed_requests",
    "kv_tokens",
    "power_w",
    "requested_clock_mhz",
    "realized_clock_mhz",
    "energy_j",
    "temperature_c",
)


@dataclass(frozen=True)
class ServingMetrics:
    """Headline numbers of one run. Latency percentiles use observed values only;
    censored requests are counted separately and count as SLO misses."""

    energy_j: float
    energy_per_output_token_j: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
    slo_attainment: float | None
    ttft_slo_attainment: float | None
    tpot_slo_attainment: float | None
    arrived_requests: int
    completed_requests: int
    censored_requests: int
    ttft_censored_requests: int
    tpot_censored_requests: int
    output_tokens: int
    simulated_duration_s: float
    mean_power_w: float
    power_cap_violation_s: float
    thermal_violation_s: float
    peak_temperature_c: float
    peak_queued_requests_at_minimum_clock: float
    preemptions: int
    clock_changes: int
    ttft_slo_s: float
    tpot_slo_s: float
    ttft_slo_per_prompt_token_s: float = 0.0
    prefill_energy_j: float = 0.0
    """Energy attributed to the requests' prefill chunks (``plant/attribution.py``)."""
    decode_energy_j: float = 0.0
    """Energy attributed to the requests' decode tokens."""
    idle_energy_j: float = 0.0
    """Energy while no iteration ran (a node cost; the three sum to ``energy_j``)."""
    cap_overshoot_s: float | None = None
    """Seconds the GPU drew more than the run-time power cap in force (one a controller
    requested, ``requested_power_cap_w``, or a node's power limit); None where no cap was
    set during the run. ``power_cap_violation_s`` counts the seconds above the board limit
    (``power_limit_w``) alone, which the firmware holds whatever is requested; a cap no
    clock can hold (below the idle power) shows here."""

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of every metric."""
        return asdict(self)


def summed_cap_overshoot_s(metrics: Sequence[ServingMetrics]) -> float | None:
    """The seconds over a run-time power cap of several GPUs' runs together (GPU-seconds;
    summed as ``power_cap_violation_s`` is), None where none of them had a cap."""
    present = [m.cap_overshoot_s for m in metrics if m.cap_overshoot_s is not None]
    return float(sum(present)) if present else None


def _percentile(values: NDArray[np.float64], q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def compute_metrics(
    records: Sequence[RequestRecord],
    *,
    energy_j: float,
    duration_s: float,
    output_tokens: int,
    ttft_slo_s: float,
    tpot_slo_s: float,
    power_cap_violation_s: float,
    thermal_violation_s: float,
    peak_temperature_c: float,
    peak_queued_requests_at_minimum_clock: float,
    preemptions: int,
    clock_changes: int,
    ttft_slo_per_prompt_token_s: float = 0.0,
    idle_energy_j: float = 0.0,
    cap_overshoot_s: float | None = None,
) -> ServingMetrics:
    """Summarise records into :class:`ServingMetrics` (censoring kept visible).

    A request's TTFT SLO is ``ttft_slo_s + ttft_slo_per_prompt_token_s * prompt_tokens``.
    The phase energies sum the records' attributed energy; ``idle_energy_j`` is the rest.
    ``cap_overshoot_s`` is None where no run-time power cap was set.
    """
    ttft = np.array([r.ttft_s for r in records if r.ttft_s is not None], dtype=float)
    tpot = np.array([r.tpot_s for r in records if r.tpot_s is not None], dtype=float)
    ttft_censored = sum(1 for r in records if r.ttft_censored)
    tpot_censored = sum(1 for r in records if r.tpot_censored)
    completed = sum(1 for r in records if r.finish_time_s is not None)
    ttft_ok = 0
    tpot_ok = 0
    both_ok = 0
    for r in records:
        ttft_slo = ttft_slo_at(ttft_slo_s, ttft_slo_per_prompt_token_s, r.prompt_tokens)
        ttft_met = r.ttft_s is not None and r.ttft_s <= ttft_slo + 1e-12
        if r.finish_time_s is None:
            tpot_met = False
        else:
            value = r.tpot_s
            tpot_met = value is None or value <= tpot_slo_s + 1e-12
        ttft_ok += ttft_met
        tpot_ok += tpot_met
        both_ok += ttft_met and tpot_met
    arrived = len(records)
    return ServingMetrics(
        energy_j=float(energy_j),
        energy_per_output_token_j=(float(energy_j) / output_tokens) if output_tokens else None,
        ttft_p50_s=_percentile(ttft, 50),
        ttft_p95_s=_percentile(ttft, 95),
        ttft_p99_s=_percentile(ttft, 99),
        tpot_p50_s=_percentile(tpot, 50),
        tpot_p95_s=_percentile(tpot, 95),
        tpot_p99_s=_percentile(tpot, 99),
        slo_attainment=(both_ok / arrived) if arrived else None,
        ttft_slo_attainment=(ttft_ok / arrived) if arrived else None,
        tpot_slo_attainment=(tpot_ok / arrived) if arrived else None,
        arrived_requests=arrived,
        completed_requests=completed,
        censored_requests=arrived - completed,
        ttft_censored_requests=ttft_censored,
        tpot_censored_requests=tpot_censored,
        output_tokens=int(output_tokens),
        simulated_duration_s=float(duration_s),
        mean_power_w=float(energy_j / duration_s) if duration_s > 0 else 0.0,
        power_cap_violation_s=float(power_cap_violation_s),
        thermal_violation_s=float(thermal_violation_s),
        peak_temperature_c=float(peak_temperature_c),
        peak_queued_requests_at_minimum_clock=float(peak_queued_requests_at_minimum_clock),
        preemptions=int(preemptions),
        clock_changes=int(clock_changes),
        ttft_slo_s=float(ttft_slo_s),
        tpot_slo_s=float(tpot_slo_s),
        ttft_slo_per_prompt_token_s=float(ttft_slo_per_prompt_token_s),
        prefill_energy_j=float(sum(r.prefill_energy_j for r in records)),
        decode_energy_j=float(sum(r.decode_energy_j for r in records)),
        idle_energy_j=float(idle_energy_j),
        cap_overshoot_s=None if cap_overshoot_s is None else float(cap_overshoot_s),
    )


@dataclass(frozen=True)
class ServingResult:
    """Output of :func:`plant.simulate`: series on the ``time_step_s`` grid, records, metrics.

    ``power_w[k]`` is the mean power over ``(time_s[k-1], time_s[k]]`` so that
    ``energy_j[k] == sum(power_w[:k+1] * dt)`` up to rounding; the other series are the
    state at ``time_s[k]``.
    """

    time_s: NDArray[np.float64]
    prefill_queue: NDArray[np.float64]
    decode_active: NDArray[np.float64]
    completed_requests: NDArray[np.float64]
    kv_tokens: NDArray[np.float64]
    power_w: NDArray[np.float64]
    requested_clock_mhz: NDArray[np.float64]
    realized_clock_mhz: NDArray[np.float64]
    energy_j: NDArray[np.float64]
    temperature_c: NDArray[np.float64]
    phase: tuple[str, ...]
    request_records: tuple[RequestRecord, ...]
    metrics: ServingMetrics
    controller_name: str = ""
    scheduler_name: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_dict(self, stride: int = 1) -> dict[str, Any]:
        """JSON-able dict with every ``stride``-th series sample (the last one always kept)."""
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        count = self.time_s.size
        indices = np.arange(0, count, stride)
        if count and indices[-1] != count - 1:
            indices = np.append(indices, count - 1)
        payload: dict[str, Any] = {
            "controller_name": self.controller_name,
            "scheduler_name": self.scheduler_name,
        }
        for name in SERIES_NAMES:
            values = getattr(self, name)[indices]
            payload[name] = [float(v) for v in values]
        payload["phase"] = [self.phase[i] for i in indices]
        payload["metrics"] = self.metrics.as_dict()
        payload["metadata"] = dict(self.metadata)
        return payload


@dataclass(frozen=True, slots=True)
class ArrivalSeparation:
    """How a run's arrivals met each other: the distinct arrival times, the most requests
    that arrived at one time, and whether every request finished before the next distinct
    arrival time (then no two arrival times ever shared the GPU).

    When ``separated`` holds, no request queued behind an earlier arrival time's, so
    dividing the arrival times further (a smaller load scale) only lengthens the idle gaps:
    the run sits at its light-load floor (at a fixed clock the latencies stay exactly the
    same; a controller that acts on idle time may still choose other clocks). Traces
    that record arrivals on a coarse grid (Mooncake: a 3 s grid, 2 to 28 requests at one
    time) keep their simultaneous groups at every scale, so that floor is not 100%
    attainment.
    """

    arrival_times: int
    largest_group: int
    separated: bool


def arrival_separation(records: Sequence[RequestRecord]) -> ArrivalSeparation:
    """:class:`ArrivalSeparation` of ``records`` (a request that never finished counts as
    still running at every later arrival time)."""
    ordered = sorted(records, key=lambda r: r.arrival_time_s)
    times = 0
    largest = 0
    group = 0
    separated = True
    busy_until_s = -np.inf
    previous_s: float | None = None
    for record in ordered:
        if record.arrival_time_s != previous_s:
            if busy_until_s > record.arrival_time_s:
                separated = False
            times += 1
            group = 0
            previous_s = record.arrival_time_s
        group += 1
        largest = max(largest, group)
        finish = np.inf if record.finish_time_s is None else record.finish_time_s
        busy_until_s = max(busy_until_s, finish)
    return ArrivalSeparation(times, largest, separated)
