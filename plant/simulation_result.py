"""Results assembly for a :class:`~gpugov.plant.simulator.PlantSimulation`: its per-request
records and the frozen :class:`~gpugov.plant.result.ServingResult` with its metrics, read
from the engine's state, apart from the engine loop that advances it (``simulator.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpugov.plant.result import ServingResult, compute_metrics
from gpugov.plant.scheduler import scheduler_label
from gpugov.plant.types import RequestRecord

if TYPE_CHECKING:
    from gpugov.plant.simulator import PlantSimulation


def simulation_records(simulation: PlantSimulation) -> tuple[RequestRecord, ...]:
    """Records of every request that has arrived by now
    (:meth:`PlantSimulation.records <gpugov.plant.simulator.PlantSimulation.records>`)."""
    self = simulation
    out = []
    for index in range(self._next_arrival):
        request = self.requests[index]
        generated = self._generated[index]
        if index in self._running:
            generated += self._decode_counter - self._running[index]
        prefill_j, decode_j = self.request_energy(index)
        out.append(
            RequestRecord(
                request_id=request.request_id,
                arrival_time_s=request.arrival_time_s,
                prompt_tokens=request.prompt_tokens,
                output_tokens=request.output_tokens,
                first_token_time_s=self._first_token[index],
                finish_time_s=self._finish[index],
                generated_tokens=generated,
                preemptions=self._preemptions[index],
                prefill_energy_j=prefill_j,
                decode_energy_j=decode_j,
            )
        )
    return tuple(out)


def simulation_result(
    simulation: PlantSimulation,
    controller_name: str = "",
    scheduler_name: str = "",
    **metadata: Any,
) -> ServingResult:
    """Freeze the run into a :class:`ServingResult`, arrivals moved up to now
    (:meth:`PlantSimulation.result <gpugov.plant.simulator.PlantSimulation.result>`)."""
    self = simulation
    records = simulation_records(self)
    series = self.series.arrays()
    gpu = self.gpu
    minimum = gpu.params.realized_clock_mhz[0]
    at_minimum = np.isclose(series["realized_clock_mhz"], minimum)
    queued = series["prefill_queue"] + series["decode_active"]
    peak_at_minimum = float(np.max(queued[at_minimum])) if np.any(at_minimum) else 0.0
    profile = self.plant.profile
    metrics = compute_metrics(
        records,
        energy_j=gpu.energy_j,
        duration_s=self.time_s,
        output_tokens=self.counters.output_tokens,
        ttft_slo_s=profile.ttft_slo_s,
        tpot_slo_s=profile.tpot_slo_s,
        ttft_slo_per_prompt_token_s=profile.ttft_slo_per_prompt_token_s,
        power_cap_violation_s=gpu.power_violation_s,
        thermal_violation_s=gpu.thermal_violation_s,
        peak_temperature_c=gpu.peak_temperature_c,
        peak_queued_requests_at_minimum_clock=peak_at_minimum,
        preemptions=self.counters.preemptions,
        clock_changes=self._clock_changes,
        idle_energy_j=self.energy_ledger.idle_j,
    )
    meta = {
        "seed": self.seed,
        "plant": self.plant.describe(),
        "scheduler": scheduler_name or scheduler_label(self.scheduler),
        **metadata,
    }
    return ServingResult(
        **series,
        phase=tuple(self.series.phases),
        request_records=records,
        metrics=metrics,
        controller_name=controller_name,
        scheduler_name=scheduler_name or scheduler_label(self.scheduler),
        metadata=meta,
    )
