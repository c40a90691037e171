"""Exact per-request energy attribution in the plant.

The plant knows the energy of every segment it integrates (power times duration), so it
can say which requests that energy served. The rule (also in ``docs/plant.md``):

* **Phases.** An iteration that runs prefill chunks and decode tokens together spends
  ``t_pf * P_pf(f)`` on its prefill part and ``t_dec * P_dec(f, B)`` on its decode part
  (the plant's power model: the iteration's power is the time-weighted mix of the two
  phase powers at the realised clock). Its energy is split between the phases in that
  proportion, which is exactly the modelled energy of each part. A prefill-only or
  decode-only iteration goes wholly to its phase.
* **Within a phase, by token share.** The prefill energy is split over the iteration's
  prefill chunks in proportion to their tokens; the decode energy equally over the
  requests decoding in it (one token each).
* **Idle.** Energy while no iteration runs (no request in the GPU, a scheduler's idle
  time, a wait for KV space) is a node cost, kept apart and charged to no request.
* **Recompute.** A preempted request's recomputed prefill is charged to it again (it
  was spent on it), and the decode energy it had used stays charged to it.

So the requests' prefill and decode energy plus the idle energy is the GPU's energy, to
float rounding. A tensor-parallel domain is one plant (its powers are the sum over its
GPUs), so the attribution is per domain.

The decode share costs O(1) per iteration: a running sum of the energy per decoding
request (:attr:`EnergyLedger.decode_share_j`); a request's decode energy is the growth of
that sum while it decodes, settled when it leaves the batch (finished or preempted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpugov.plant.types import RequestRecord

PERCENTILES = (50, 90, 99)
"""Percentiles reported for the per-request distributions."""


def prefill_fraction(
    prefill_s: float, decode_s: float, power_w: float, prefill_power_w: float
) -> float:
    """Share of an iteration's energy that its prefill part spent: ``t_pf * P_pf`` over
    the iteration's ``(t_pf + t_dec) * P`` (``P`` the time-weighted phase mix), in [0, 1]."""
    if decode_s <= 0.0:
        return 1.0
    if prefill_s <= 0.0:
        return 0.0
    total = power_w * (prefill_s + decode_s)
    if total <= 0.0:
        return prefill_s / (prefill_s + decode_s)
    return min(1.0, max(0.0, prefill_s * prefill_power_w / total))


class EnergyLedger:
    """Per-request prefill and decode energy of one simulation, and its idle energy.

    The simulator calls :meth:`charge_busy` and :meth:`charge_idle` for every segment it
    integrates, and :meth:`start_decode` / :meth:`stop_decode` when a request enters or
    leaves the decode batch. Indices are the simulation's request indices.
    """

    def __init__(self, count: int) -> None:
        self.prefill_j = [0.0] * count
        self.decode_j = [0.0] * count
        """Settled decode energy (a request decoding now has more: :meth:`request_energy`)."""
        self.decode_start_j = [0.0] * count
        self.decode_share_j = 0.0
        """Energy charged so far to each decoding request, summed over iterations."""
        self.idle_j = 0.0
        self.prefill_total_j = 0.0
        self.decode_total_j = 0.0

    def add_request(self) -> None:
        """Room for one more request (online serving)."""
        self.prefill_j.append(0.0)
        self.decode_j.append(0.0)
        self.decode_start_j.append(0.0)

    def charge_idle(self, energy_j: float) -> None:
        """Energy while no iteration runs: a node cost."""
        self.idle_j += energy_j

    def charge_busy(
        self,
        energy_j: float,
        fraction_prefill: float,
        chunks: Sequence[tuple[Sequence[int], int]],
        prefill_tokens: int,
        decode_batch: int,
    ) -> None:
        """Split one busy segment's energy: ``fraction_prefill`` of it over the prefill
        ``chunks`` (``(entry, tokens)``, ``entry[0]`` the request) by tokens, the rest
        equally over the ``decode_batch`` decoding requests."""
        prefill = energy_j * fraction_prefill if prefill_tokens else 0.0
        decode = energy_j - prefill
        if prefill:
            per_token = prefill / prefill_tokens
            target = self.prefill_j
            for entry, take in chunks:
                target[entry[0]] += per_token * take
            self.prefill_total_j += prefill
        if decode_batch and decode:
            self.decode_share_j += decode / decode_batch
            self.decode_total_j += decode

    def start_decode(self, index: int) -> None:
        """Request ``index`` joins the decode batch."""
        self.decode_start_j[index] = self.decode_share_j

    def stop_decode(self, index: int) -> None:
        """Request ``index`` leaves the decode batch (finished or preempted)."""
        self.decode_j[index] += self.decode_share_j - self.decode_start_j[index]

    def request_energy(self, index: int, decoding: bool) -> tuple[float, float]:
        """(prefill J, decode J) of request ``index`` so far; ``decoding``: it is in the
        decode batch now."""
        decode = self.decode_j[index]
        if decoding:
            decode += self.decode_share_j - self.decode_start_j[index]
        return self.prefill_j[index], decode


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and the :data:`PERCENTILES` of ``values`` (None when empty)."""
    array = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {"mean": float(array.mean()) if array.size else None}
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(array, q)) if array.size else None
    return out


def request_rows(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """One JSON-able row per request: its times, tokens and attributed energy."""
    rows = []
    for r in records:
        total = r.prefill_energy_j + r.decode_energy_j
        rows.append(
            {
                "request_id": r.request_id,
                "arrival_time_s": r.arrival_time_s,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "generated_tokens": r.generated_tokens,
                "first_token_time_s": r.first_token_time_s,
                "finish_time_s": r.finish_time_s,
                "preemptions": r.preemptions,
                "prefill_energy_j": r.prefill_energy_j,
                "decode_energy_j": r.decode_energy_j,
                "energy_j": total,
                "energy_per_output_token_j": (
                    total / r.generated_tokens if r.generated_tokens > 0 else None
                ),
            }
        )
    return rows


ENERGY_DEFINITIONS = {
    "per_request": (
        "attributed energy of each finished request (prefill + decode J, idle excluded; "
        "rule in docs/plant.md); mean and percentiles over the finished requests"
    ),
    "per_output_token": (
        "each finished request's attributed energy over its output tokens (the first, "
        "prefilled one included); mean and percentiles over the finished requests"
    ),
    "ml_energy_j_per_output_token": (
        "as ML.ENERGY reports it: the run's whole GPU energy (idle included) over the "
        "output tokens generated in the run"
    ),
    "energy_per_1000_requests_j": (
        "the run's whole GPU energy (idle included) over the finished requests, times 1,000"
    ),
}


def energy_summary(
    records: Sequence[RequestRecord],
    *,
    energy_j: float,
    idle_energy_j: float,
    output_tokens: int,
) -> dict[str, Any]:
    """Per-run energy figures (:data:`ENERGY_DEFINITIONS`): the phase and idle totals,
    per-request distributions and the run-level units people compare."""
    finished = [r for r in records if r.finish_time_s is not None]
    per_request = [r.prefill_energy_j + r.decode_energy_j for r in finished]
    per_token = [
        (r.prefill_energy_j + r.decode_energy_j) / r.generated_tokens
        for r in finished
        if r.generated_tokens > 0
    ]
    return {
        "energy_j": float(energy_j),
        "prefill_energy_j": float(sum(r.prefill_energy_j for r in records)),
        "decode_energy_j": float(sum(r.decode_energy_j for r in records)),
        "idle_energy_j": float(idle_energy_j),
        "finished_requests": len(finished),
        "per_request_j": _stats(per_request),
        "per_output_token_j": _stats(per_token),
        "ml_energy_j_per_output_token": (
            float(energy_j) / output_tokens if output_tokens > 0 else None
        ),
        "energy_per_1000_requests_j": (
            1000.0 * float(energy_j) / len(finished) if finished else None
        ),
    }
