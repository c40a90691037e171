"""Disaggregated serving: a prefill pool and a decode pool joined by a KV-cache transfer.

Model (also in ``docs/plant.md``, section "Disaggregated serving"):

* **Pools.** A layout has a prefill pool and a decode pool. Each pool is ``replicas``
  engines of one :class:`~gpugov.plant.plant.ServingPlant` (data parallel; each engine may
  be a tensor-parallel group as the plant models ``tensor_parallel``), under one clock set
  by the pool's controller. Each engine is a full
  :class:`~gpugov.plant.simulator.PlantSimulation`: its own realised clock, power, energy,
  thermal state, queue and KV cache.
* **Routing.** Arrivals go to the prefill engines in turn, and prefilled requests to the
  decode engines in turn (round robin, as vLLM's disaggregated-serving proxy
  ``toy_proxy_server.py`` cycles over its prefill and decode instances).
* **Prefill.** A prefill engine runs the request's prompt (chunked prefill, its
  scheduler) and produces the **first token** at the end of the prefill, as in vLLM's
  disaggregated prefill (the prefill instance runs the request with ``max_tokens=1``) and
  DistServe; so TTFT ends at prefill end, and the transfer delays the second token
  (it is inside the request's TPOT). A request of one output token ends there.
* **Transfer.** The prompt's KV cache then moves to a decode engine in
  ``fixed_s + prompt_tokens * kv_bytes_per_token / (bandwidth * links)`` seconds, where
  ``links = min(prefill TP, decode TP)`` (each GPU of a TP group sends its own shard of
  the KV heads in parallel). The prefill engine frees the blocks at prefill end (the
  transfer is milliseconds; its hold on the prefill KV cache is not modelled).
* **Decode.** The decode engine admits the request into its running batch at an
  iteration start, first come first served, when the batch size and KV cache allow
  (:meth:`PlantSimulation.add_prefilled_request`), and decodes the remaining tokens; a
  preempted request is recomputed there.

The layout (:class:`~gpugov.plant.disaggregated_layout.DisaggregatedPlant`), its link
and their stated defaults are in :mod:`gpugov.plant.disaggregated_layout`.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

import numpy as np

from gpugov.plant.closed_loop import (
    _controller_name,
    apply_decision,
    control_ticks,
)
from gpugov.plant.disaggregated_layout import ROLES, DisaggregatedPlant
from gpugov.plant.gpu_physics import _EPS
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import (
    ServingMetrics,
    ServingResult,
    compute_metrics,
    summed_cap_overshoot_s,
)
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.simulator import PlantSimulation
from gpugov.plant.types import (
    ClockController,
    Request,
    RequestRecord,
    Scheduler,
    ServingObservation,
)

PoolView = Callable[[PlantSimulation, str], Callable[[], ServingObservation]]
"""What a pool's node observes of one of its engines: called once per engine with the
engine and the pool's role, it returns the function each tick calls (a node's view:
``daemon.simulated.node_view``). Without one a pool observes its engines' exact state."""


class _Pool:
    """A pool's engines under one clock: requests clocks, caps, and a pooled observation."""

    def __init__(
        self, role: str, engines: list[PlantSimulation], view: PoolView | None = None
    ) -> None:
        self.role = role
        self.engines = engines
        self._observers = None if view is None else [view(engine, role) for engine in engines]
        self._ttft_seen = [0.0] * len(engines)
        self._tokens_seen = [0.0] * len(engines)

    def fork(self) -> _Pool:
        """An independent copy: each engine forked (:meth:`PlantSimulation.fork`), the
        pooled observation's bookkeeping copied.

        Raises:
            ValueError: the pool observes through a view (whose own state a fork cannot
                copy).
        """
        if self._observers is not None:
            raise ValueError(f"the {self.role} pool observes through a view: it cannot be forked")
        twin = _Pool(self.role, [engine.fork() for engine in self.engines])
        twin._ttft_seen = list(self._ttft_seen)
        twin._tokens_seen = list(self._tokens_seen)
        return twin

    def request_clock(self, clock_mhz: float) -> None:
        for engine in self.engines:
            engine.request_clock(clock_mhz)

    def set_power_cap(self, cap_w: float | None) -> None:
        """A pool-wide cap, shared equally by the engines."""
        share = None if cap_w is None else float(cap_w) / len(self.engines)
        for engine in self.engines:
            engine.set_power_cap(share)

    def observe(self, step_index: int | None = None) -> ServingObservation:
        """The pool's observation: one engine's as is; several engines' pooled (counts,
        tokens, power and energy summed, the hottest temperature, the slowest realised
        clock, the mean utilisation, window latencies weighted by each engine's first
        tokens and output tokens in the window), with the engine count and the largest
        prompt backlog of any one engine."""
        if self._observers is None:
            observations = [engine.observe(step_index) for engine in self.engines]
        else:
            observations = [observe() for observe in self._observers]
        if len(observations) == 1:
            return replace(observations[0], role=self.role)
        ttft_weights = []
        token_weights = []
        for k, obs in enumerate(observations):
            ttft_total = obs.ttft_count_total or 0.0
            ttft_weights.append(ttft_total - self._ttft_seen[k])
            self._ttft_seen[k] = ttft_total
            token_weights.append(obs.output_tokens_total - self._tokens_seen[k])
            self._tokens_seen[k] = obs.output_tokens_total
        first = observations[0]
        summed: dict[str, Any] = {}
        for name in SUMMED_FIELDS:
            values = [getattr(obs, name) for obs in observations]
            summed[name] = None if any(v is None for v in values) else sum(values)
        utilizations = [o.gpu_utilization for o in observations if o.gpu_utilization is not None]
        reasons = [o.clock_event_reasons for o in observations if o.clock_event_reasons is not None]
        realized = [o.realized_clock_mhz for o in observations if o.realized_clock_mhz is not None]
        return replace(
            first,
            **summed,
            temperature_c=max(o.temperature_c for o in observations),
            realized_clock_mhz=min(realized) if realized else None,
            gpu_utilization=float(np.mean(utilizations)) if utilizations else None,
            clock_event_reasons=int(np.bitwise_or.reduce(reasons)) if reasons else None,
            ttft_recent_s=_weighted([o.ttft_recent_s for o in observations], ttft_weights),
            ttft_recent_prompt_tokens=_weighted(
                [o.ttft_recent_prompt_tokens for o in observations], ttft_weights
            ),
            tpot_recent_s=_weighted([o.tpot_recent_s for o in observations], token_weights),
            role=self.role,
            engines=len(observations),
            busiest_prefill_tokens=max(o.prefill_remaining_tokens for o in observations),
        )


SUMMED_FIELDS = (
    "arrived_requests",
    "prefill_remaining_tokens",
    "prefill_tail_tokens",
    "decode_active",
    "generated_decode_tokens",
    "waiting_requests",
    "completed_requests",
    "output_tokens_total",
    "prompt_tokens_total",
    "kv_tokens",
    "kv_capacity_tokens",
    "power_w",
    "energy_j",
    "power_limit_w",
    "ttft_count_total",
    "ttft_within_slo_total",
    "tpot_count_total",
    "tpot_within_slo_total",
)
"""The observation fields a pool of several engines sums over them (``_Pool.observe``)."""


def _weighted(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """Mean of the known ``values`` weighted by ``weights`` (None when none is known)."""
    pairs = [(v, max(w, 0.0)) for v, w in zip(values, weights, strict=True) if v is not None]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total <= 0.0:
        return float(np.mean([v for v, _ in pairs]))
    return sum(v * w for v, w in pairs) / total


class DisaggregatedSimulation:
    """Stateful disaggregated plant: advance time, observe a pool, request a pool's clock.

    :func:`simulate_disaggregated` drives it; :attr:`pools` holds each role's engines.
    """

    def __init__(
        self,
        workload: Sequence[Request],
        plant: DisaggregatedPlant,
        *,
        seed: int = 0,
        view: PoolView | None = None,
    ) -> None:
        requests = tuple(workload)
        prefill_spec, decode_spec = plant.prefill, plant.decode
        for request in requests:
            if request.prompt_tokens + 1 > prefill_spec.plant.kv_capacity_tokens:
                raise ValueError(
                    f"request {request.request_id} needs {request.prompt_tokens} + 1 KV "
                    "tokens, more than the prefill plant's kv_capacity_tokens="
                    f"{prefill_spec.plant.kv_capacity_tokens}"
                )
            if request.prompt_tokens + request.output_tokens > decode_spec.plant.kv_capacity_tokens:
                raise ValueError(
                    f"request {request.request_id} needs {request.prompt_tokens} + "
                    f"{request.output_tokens} KV tokens, more than the decode plant's "
                    f"kv_capacity_tokens={decode_spec.plant.kv_capacity_tokens}"
                )
        self.plant = plant
        self.requests = requests
        self.seed = seed
        self.time_s = 0.0
        count = prefill_spec.replicas
        self._prefill_global: list[list[int]] = [[] for _ in range(count)]
        for index in range(len(requests)):
            self._prefill_global[index % count].append(index)
        prefill_engines = [
            PlantSimulation(
                [
                    Request(
                        requests[g].request_id,
                        requests[g].arrival_time_s,
                        requests[g].prompt_tokens,
                        1,
                    )
                    for g in members
                ],
                prefill_spec.plant,
                prefill_spec.scheduler,
                seed=seed + k,
            )
            for k, members in enumerate(self._prefill_global)
        ]
        decode_engines = [
            PlantSimulation((), decode_spec.plant, decode_spec.scheduler, seed=seed + 1000 + k)
            for k in range(decode_spec.replicas)
        ]
        self.pools: dict[str, _Pool] = {
            "prefill": _Pool("prefill", prefill_engines, view),
            "decode": _Pool("decode", decode_engines, view),
        }
        self._scan_from = [0] * count
        self._handed: list[list[bool]] = [[False] * len(m) for m in self._prefill_global]
        self._deliveries: list[tuple[float, int, float]] = []  # (time, request, first token)
        self._next_decode = 0
        self._decode_of: dict[int, tuple[int, int]] = {}  # request -> (engine, local index)
        self._transfer_s: dict[int, float] = {}

    # ------------------------------------------------------------------ public API
    @property
    def done(self) -> bool:
        """Every request has arrived and finished (and no transfer is in flight)."""
        return (
            not self._deliveries
            and all(engine.done for engine in self.pools["prefill"].engines)
            and all(engine.done for engine in self.pools["decode"].engines)
        )

    @property
    def energy_j(self) -> float:
        """Energy drawn by every GPU of both pools since the start."""
        return sum(e.energy_j for pool in self.pools.values() for e in pool.engines)

    def fork(self) -> DisaggregatedSimulation:
        """An independent copy for what-if runs (the per-pool hindsight oracle): each
        engine forked with :meth:`PlantSimulation.fork` (so its series start at the fork
        point; energy, request outcomes and state are exact), the routing and transfer
        bookkeeping copied, the workload and the layout shared.

        Raises:
            ValueError: the pools observe through a :data:`PoolView` (a node's view keeps
                state of its own that a fork cannot copy).
        """
        twin = copy.copy(self)
        twin.pools = {role: pool.fork() for role, pool in self.pools.items()}
        twin._scan_from = list(self._scan_from)
        twin._handed = [list(handed) for handed in self._handed]
        twin._deliveries = list(self._deliveries)
        twin._decode_of = dict(self._decode_of)
        twin._transfer_s = dict(self._transfer_s)
        return twin

    def request_times(self) -> tuple[list[float | None], list[float | None]]:
        """First-token and finish times so far, indexed like :attr:`requests` (``None``
        where not yet reached), as :meth:`records` reports them: the first token from the
        prefill pool, the finish from the decode pool (the prefill pool's for a request
        of one output token). Fresh lists, built on each call."""
        count = len(self._prefill_global)
        prefill = [engine.request_times() for engine in self.pools["prefill"].engines]
        decode_finish = [engine.request_times()[1] for engine in self.pools["decode"].engines]
        first: list[float | None] = []
        finish: list[float | None] = []
        for index, request in enumerate(self.requests):
            engine_first, engine_finish = prefill[index % count]
            local = index // count
            first.append(engine_first[local])
            if request.output_tokens <= 1:
                finish.append(engine_finish[local])
                continue
            where = self._decode_of.get(index)
            finish.append(None if where is None else decode_finish[where[0]][where[1]])
        return first, finish

    def observe(self, role: str, step_index: int | None = None) -> ServingObservation:
        """What the node of pool ``role`` could know now (its ``role`` field set)."""
        self.plant.pool(role)
        return self.pools[role].observe(step_index)

    def request_clock(self, role: str, clock_mhz: float) -> None:
        """Request a clock for every engine of pool ``role``."""
        if not math.isfinite(clock_mhz):
            raise ValueError(f"requested clock must be finite, got {clock_mhz!r}")
        self.pools[role].request_clock(clock_mhz)

    def set_power_cap(self, role: str, cap_w: float | None) -> None:
        """Set pool ``role``'s power cap (watts for the pool, shared by its engines)."""
        self.pools[role].set_power_cap(cap_w)

    def advance_to(self, end_s: float, *, stop_when_done: bool = False) -> None:
        """Run both pools until ``end_s``: the prefill engines, the transfers that land by
        then (each delivered to its decode engine at its exact time), then the decode
        engines. With ``stop_when_done`` the run ends at the last completion, every GPU
        brought to that time."""
        if end_s <= self.time_s + _EPS:
            return
        prefill = self.pools["prefill"].engines
        decode = self.pools["decode"].engines
        for engine in prefill:
            engine.advance_to(end_s, stop_when_done=stop_when_done)
        self._collect_prefilled()
        deliveries = self._deliveries
        while deliveries and deliveries[0][0] <= end_s + _EPS:
            time_s, request, first_token_s = heapq.heappop(deliveries)
            slot = self._next_decode
            self._next_decode = (slot + 1) % len(decode)
            engine = decode[slot]
            engine.advance_to(time_s)
            original = self.requests[request]
            local = engine.add_prefilled_request(
                original.prompt_tokens, original.output_tokens, first_token_s
            )
            self._decode_of[request] = (slot, local)
        final = stop_when_done and not deliveries and all(e.done for e in prefill)
        for engine in decode:
            engine.advance_to(end_s, stop_when_done=final)
        engines = [*prefill, *decode]
        done = stop_when_done and self.done
        target = max(engine.time_s for engine in engines) if done else end_s
        for engine in engines:
            engine.advance_to(target)
        self.time_s = max(self.time_s, target)

    def _collect_prefilled(self) -> None:
        """Queue the transfers of the requests whose prefill ended since the last call."""
        found: list[tuple[float, int]] = []
        for k, engine in enumerate(self.pools["prefill"].engines):
            first_token, _ = engine.request_times()
            members = self._prefill_global[k]
            handed = self._handed[k]
            arrivals = engine.requests
            j = self._scan_from[k]
            while j < len(members) and arrivals[j].arrival_time_s <= engine.time_s + _EPS:
                if not handed[j] and first_token[j] is not None:
                    handed[j] = True
                    found.append((float(first_token[j]), members[j]))  # type: ignore[arg-type]
                j += 1
            start = self._scan_from[k]
            while start < len(members) and handed[start]:
                start += 1
            self._scan_from[k] = start
        for first_token_s, request in sorted(found):
            original = self.requests[request]
            if original.output_tokens <= 1:
                continue
            transfer = self.plant.transfer_s(original.prompt_tokens)
            self._transfer_s[request] = transfer
            heapq.heappush(self._deliveries, (first_token_s + transfer, request, first_token_s))

    # ----------------------------------------------------------------- results
    def records(self) -> tuple[RequestRecord, ...]:
        """Request-level records: arrival and first token in the prefill pool, finish in
        the decode pool; energies summed over the pools."""
        prefill_records = [engine.records() for engine in self.pools["prefill"].engines]
        decode_records = [engine.records() for engine in self.pools["decode"].engines]
        out: list[RequestRecord] = []
        count = len(self._prefill_global)
        position = [0] * count
        for index, request in enumerate(self.requests):
            k = index % count
            local = position[k]
            position[k] += 1
            if local >= len(prefill_records[k]):
                continue  # not arrived yet
            p = prefill_records[k][local]
            record = RequestRecord(
                request_id=request.request_id,
                arrival_time_s=request.arrival_time_s,
                prompt_tokens=request.prompt_tokens,
                output_tokens=request.output_tokens,
                first_token_time_s=p.first_token_time_s,
                finish_time_s=p.finish_time_s if request.output_tokens <= 1 else None,
                generated_tokens=p.generated_tokens,
                preemptions=p.preemptions,
                prefill_energy_j=p.prefill_energy_j,
                decode_energy_j=p.decode_energy_j,
            )
            where = self._decode_of.get(index)
            if where is not None:
                d = decode_records[where[0]][where[1]]
                record = replace(
                    record,
                    finish_time_s=d.finish_time_s,
                    generated_tokens=d.generated_tokens,
                    preemptions=p.preemptions + d.preemptions,
                    prefill_energy_j=p.prefill_energy_j + d.prefill_energy_j,
                    decode_energy_j=p.decode_energy_j + d.decode_energy_j,
                )
            out.append(record)
        return tuple(out)

    def result(
        self, controller_names: Mapping[str, str] | None = None, **metadata: Any
    ) -> DisaggregatedResult:
        """Freeze the run into a :class:`DisaggregatedResult`."""
        names = dict(controller_names or {})
        records = self.records()
        pools = {
            role: _pool_result(role, pool, names.get(role, ""), self.plant, records)
            for role, pool in self.pools.items()
        }
        results = [r for pool in pools.values() for r in pool.engines]
        prefill_profile = self.plant.prefill.plant.profile
        decode_profile = self.plant.decode.plant.profile
        minimum_peaks = [r.metrics.peak_queued_requests_at_minimum_clock for r in results]
        metrics = compute_metrics(
            records,
            energy_j=sum(p.energy_j for p in pools.values()),
            duration_s=self.time_s,
            output_tokens=sum(r.generated_tokens for r in records),
            ttft_slo_s=prefill_profile.ttft_slo_s,
            tpot_slo_s=decode_profile.tpot_slo_s,
            ttft_slo_per_prompt_token_s=prefill_profile.ttft_slo_per_prompt_token_s,
            power_cap_violation_s=sum(r.metrics.power_cap_violation_s for r in results),
            thermal_violation_s=sum(r.metrics.thermal_violation_s for r in results),
            peak_temperature_c=max(r.metrics.peak_temperature_c for r in results),
            peak_queued_requests_at_minimum_clock=max(minimum_peaks),
            preemptions=sum(r.metrics.preemptions for r in results),
            clock_changes=sum(r.metrics.clock_changes for r in results),
            idle_energy_j=sum(p.idle_energy_j for p in pools.values()),
            cap_overshoot_s=summed_cap_overshoot_s([r.metrics for r in results]),
        )
        transfers = tuple(self._transfer_s[i] for i in sorted(self._transfer_s))
        return DisaggregatedResult(
            pools=pools,
            request_records=records,
            metrics=metrics,
            transfer_s=transfers,
            transfer_bytes=sum(
                self.plant.transfer_bytes(self.requests[i].prompt_tokens) for i in self._transfer_s
            ),
            metadata={"seed": self.seed, "plant": self.plant.describe(), **metadata},
        )


@dataclass(frozen=True)
class PoolResult:
    """One pool's outcome: its engines' results and its totals.

    ``energy_j`` is every GPU of the pool over the whole run (``prefill_energy_j +
    decode_energy_j + idle_energy_j``); ``mean_realized_clock_mhz`` is the time average over
    the grid, across engines; ``phase_latency_s`` gives the pool's own phase: the
    prefill pool's time to first token (queue and prefill), the decode pool's TPOT
    (transfer, admission wait and decode: the request-level TPOT).
    """

    role: str
    controller_name: str
    engines: tuple[ServingResult, ...]
    energy_j: float
    prefill_energy_j: float
    decode_energy_j: float
    idle_energy_j: float
    mean_power_w: float
    mean_realized_clock_mhz: float
    phase_latency_s: dict[str, float | None]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able totals (the engines' series left out)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "engines"}
        out["engines"] = len(self.engines)
        return out


@dataclass(frozen=True)
class DisaggregatedResult:
    """Output of :func:`simulate_disaggregated`: per-pool results, request-level records
    and metrics (the scoreboard's SLO condition applies to :attr:`metrics` unchanged)."""

    pools: dict[str, PoolResult]
    request_records: tuple[RequestRecord, ...]
    metrics: ServingMetrics
    transfer_s: tuple[float, ...]
    """Transfer time of each transferred request, by request index."""
    transfer_bytes: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary: metrics, pools and transfer statistics."""
        transfers = np.asarray(self.transfer_s, dtype=float)
        return {
            "metrics": self.metrics.as_dict(),
            "pools": {role: pool.as_dict() for role, pool in self.pools.items()},
            "transfer": {
                "requests": int(transfers.size),
                "bytes": float(self.transfer_bytes),
                "p50_s": float(np.percentile(transfers, 50)) if transfers.size else None,
                "p99_s": float(np.percentile(transfers, 99)) if transfers.size else None,
            },
            "metadata": dict(self.metadata),
        }


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    array = np.asarray(values, dtype=float)
    return {
        "p50": float(np.percentile(array, 50)) if array.size else None,
        "p99": float(np.percentile(array, 99)) if array.size else None,
    }


def _pool_result(
    role: str,
    pool: _Pool,
    controller_name: str,
    plant: DisaggregatedPlant,
    records: Sequence[RequestRecord],
) -> PoolResult:
    engines = tuple(
        engine.result(controller_name=controller_name, role=role) for engine in pool.engines
    )
    energy = sum(r.metrics.energy_j for r in engines)
    duration = max((r.metrics.simulated_duration_s for r in engines), default=0.0)
    clocks = [float(np.mean(r.realized_clock_mhz)) for r in engines if r.realized_clock_mhz.size]
    if role == "prefill":
        latency = _percentiles([r.ttft_s for r in records if r.ttft_s is not None])
    else:
        latency = _percentiles([r.tpot_s for r in records if r.tpot_s is not None])
    return PoolResult(
        role=role,
        controller_name=controller_name,
        engines=engines,
        energy_j=energy,
        prefill_energy_j=sum(r.metrics.prefill_energy_j for r in engines),
        decode_energy_j=sum(r.metrics.decode_energy_j for r in engines),
        idle_energy_j=sum(r.metrics.idle_energy_j for r in engines),
        mean_power_w=energy / duration if duration > 0.0 else 0.0,
        mean_realized_clock_mhz=float(np.mean(clocks)) if clocks else 0.0,
        phase_latency_s={
            ("ttft" if role == "prefill" else "tpot") + "_" + k: v for k, v in latency.items()
        },
    )


def simulate_disaggregated(
    workload: Sequence[Request],
    plant: DisaggregatedPlant,
    controllers: Mapping[str, ClockController],
    seed: int = 0,
    *,
    controller_names: Mapping[str, str] | None = None,
    control_period_s: float = 1.0,
    horizon_s: float | None = None,
    on_progress: Callable[[float, DisaggregatedSimulation], None] | None = None,
    progress_every_s: float = 10.0,
    view: PoolView | None = None,
) -> DisaggregatedResult:
    """Run ``workload`` on ``plant`` with one controller per pool (``controllers`` maps
    "prefill" and "decode" to a clock controller), each called every
    ``control_period_s`` with its pool's observation; the loop of
    :func:`~gpugov.plant.closed_loop.simulate`, per pool (power caps included). With
    ``view`` (:data:`PoolView`) each pool observes what its node would.

    Raises:
        ValueError: a role is missing or unknown, or a bad period or horizon.
        ControllerError: a controller raised (chained) or returned a non-finite clock.
    """
    unknown = sorted(set(controllers) - set(ROLES))
    missing = [role for role in ROLES if role not in controllers]
    if unknown or missing:
        raise ValueError(
            f"controllers must map exactly {list(ROLES)} to a controller; "
            f"missing {missing}, unknown {unknown}"
        )
    if not math.isfinite(control_period_s) or control_period_s <= 0.0:
        raise ValueError(f"control_period_s must be positive, got {control_period_s!r}")
    simulation = DisaggregatedSimulation(workload, plant, seed=seed, view=view)
    requests = simulation.requests
    horizon = plant.run_horizon_s(requests) if horizon_s is None else float(horizon_s)
    if horizon <= 0.0:
        raise ValueError(f"horizon_s must be positive, got {horizon!r}")
    names = {
        role: (controller_names or {}).get(role) or _controller_name(controllers[role])
        for role in ROLES
    }
    for _ in control_ticks(simulation, horizon, control_period_s, on_progress, progress_every_s):
        for role in ROLES:
            apply_decision(
                controllers[role],
                f"{role} controller {names[role]!r}",
                simulation.observe(role),
                partial(simulation.request_clock, role),
                partial(simulation.set_power_cap, role),
            )
    return simulation.result(
        controller_names=names, control_period_s=control_period_s, horizon_s=horizon
    )


@dataclass(frozen=True)
class ReplicatedResult:
    """Output of :func:`simulate_colocated_replicas`: each GPU's result, the request-level
    records (in workload order) and the metrics over every GPU."""

    engines: tuple[ServingResult, ...]
    request_records: tuple[RequestRecord, ...]
    metrics: ServingMetrics


def simulate_colocated_replicas(
    workload: Sequence[Request],
    plant: ServingPlant,
    controllers: Sequence[ClockController],
    seed: int = 0,
    *,
    scheduler: Scheduler = chunked_prefill_scheduler,
    control_period_s: float = 1.0,
    horizon_s: float | None = None,
    view: PoolView | None = None,
) -> ReplicatedResult:
    """``len(controllers)`` colocated engines of ``plant`` (data parallel, arrivals round
    robin), each governed by its own controller: the colocated layout of the same GPUs
    as a disaggregated one, for comparison. Like :class:`DisaggregatedSimulation`, the
    run ends at the last completion with every GPU brought to that time. With ``view``
    each engine's controller observes what its node would (role ``colocated``).

    Raises:
        ValueError: no controller, or a bad period or horizon.
        ControllerError: a controller raised or returned a non-finite clock.
    """
    if not controllers:
        raise ValueError("simulate_colocated_replicas needs one controller per engine")
    if not math.isfinite(control_period_s) or control_period_s <= 0.0:
        raise ValueError(f"control_period_s must be positive, got {control_period_s!r}")
    requests = tuple(workload)
    count = len(controllers)
    members = [list(range(k, len(requests), count)) for k in range(count)]
    engines = [
        PlantSimulation([requests[g] for g in group], plant, scheduler, seed=seed + k)
        for k, group in enumerate(members)
    ]
    observers = [
        engine.observe if view is None else view(engine, "colocated") for engine in engines
    ]
    horizon = plant.run_horizon_s(requests) if horizon_s is None else float(horizon_s)
    if horizon <= 0.0:
        raise ValueError(f"horizon_s must be positive, got {horizon!r}")
    names = [_controller_name(c) for c in controllers]
    step = 0
    while True:
        tick = min(step * control_period_s, horizon)
        for engine in engines:
            engine.advance_to(tick, stop_when_done=True)
        done = all(engine.done for engine in engines)
        target = max(engine.time_s for engine in engines) if done else tick
        for engine in engines:
            engine.advance_to(target)
        if (done and step > 0) or tick >= horizon:
            break
        for k, (engine, controller) in enumerate(zip(engines, controllers, strict=True)):
            apply_decision(
                controller,
                f"engine {k} controller {names[k]!r}",
                observers[k](),
                engine.request_clock,
                engine.set_power_cap,
            )
        step += 1
    results = tuple(
        engine.result(controller_name=names[k], control_period_s=control_period_s)
        for k, engine in enumerate(engines)
    )
    by_index: dict[int, RequestRecord] = {}
    for group, result in zip(members, results, strict=True):
        for g, record in zip(group, result.request_records, strict=False):
            by_index[g] = record
    records = tuple(by_index[g] for g in sorted(by_index))
    profile = plant.profile
    metrics = compute_metrics(
        records,
        energy_j=sum(r.metrics.energy_j for r in results),
        duration_s=max(engine.time_s for engine in engines),
        output_tokens=sum(r.metrics.output_tokens for r in results),
        ttft_slo_s=profile.ttft_slo_s,
        tpot_slo_s=profile.tpot_slo_s,
        ttft_slo_per_prompt_token_s=profile.ttft_slo_per_prompt_token_s,
        power_cap_violation_s=sum(r.metrics.power_cap_violation_s for r in results),
        thermal_violation_s=sum(r.metrics.thermal_violation_s for r in results),
        peak_temperature_c=max(r.metrics.peak_temperature_c for r in results),
        peak_queued_requests_at_minimum_clock=max(
            r.metrics.peak_queued_requests_at_minimum_clock for r in results
        ),
        preemptions=sum(r.metrics.preemptions for r in results),
        clock_changes=sum(r.metrics.clock_changes for r in results),
        idle_energy_j=sum(r.metrics.idle_energy_j for r in results),
        cap_overshoot_s=summed_cap_overshoot_s([r.metrics for r in results]),
    )
    return ReplicatedResult(results, records, metrics)
