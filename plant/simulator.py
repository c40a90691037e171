"""Iteration-level simulator of one GPU serving LLM requests under a clock controller.

The engine loop follows vLLM's scheduler: each iteration runs one decode token for every
running request plus prefill chunks within a token budget, bounded by a maximum batch
size and a KV-cache token capacity (arrivals wait when it is full; a running request is
preempted and recomputed, as vLLM V1 does, when decode growth overflows it).

Latency model (documented in ``docs/plant.md``), at realised clock ``f``:

* prefill: ``P / prefill_tokens_per_s(f)`` for ``P`` prompt tokens (compute-bound);
* decode: ``t_ref(f) * (a + b * B / B_ref + c * C / C_ref)`` for batch ``B`` with total
  context ``C`` tokens, ``t_ref(f) = B_ref / decode_tokens_per_s(f)`` (memory-bound,
  weakly clock dependent through the profile); ``a + b + c = 1`` reproduces the profile's
  aggregate decode rate at the reference batch and context;
* a mixed iteration takes the sum (``tau = alpha + beta * C``, arXiv 2602.02987).

Clocks: a requested clock is quantised to the supported set and takes effect after
``actuation_delay_s``; the realised clock follows a measured manifest's medians, and is
held lower while the iteration's power would exceed the power limit (SW power cap; slowed
below the lowest clock where that still draws more) or while the die is above the thermal
limit (to the highest clock whose steady-state temperature is within the limit). A power
cap set at run time (:meth:`PlantSimulation.set_power_cap`) holds it at the highest clock
whose power fits the cap, acting on power averaged over ``power_cap_window_s``, as the
firmware's power controller does. Power is the time-weighted phase mix of the iteration
at the realised clock; the one-state thermal RC is integrated exactly.

The GPU side (realised clock, power, thermal RC integration) is a composed
:class:`~gpugov.plant.gpu_physics.GpuPhysics` over frozen
:class:`~gpugov.plant.gpu_physics.GpuParameters`, in ``gpu_physics.py``.
The requested clock and the one in effect after the actuation delay are a composed
:class:`~gpugov.plant.actuation.ActuationDelay`, in ``actuation.py``.

Time advances segment by segment (iteration ends, clock changes, arrivals while idle);
series samples on the ``time_step_s`` grid are taken analytically inside segments and kept
by a composed :class:`~gpugov.plant.grid_series.GridSeries`, in ``grid_series.py``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpugov.plant.actuation import ActuationDelay
from gpugov.plant.attribution import EnergyLedger, prefill_fraction
from gpugov.plant.engine_counters import EngineCounters
from gpugov.plant.fork import fork_simulation
from gpugov.plant.gpu_physics import _EPS, GpuParameters, GpuPhysics
from gpugov.plant.grid_series import GridSeries
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult, compute_metrics
from gpugov.plant.scheduler import chunked_prefill_scheduler, scheduler_label
from gpugov.plant.types import (
    IterationPlan,
    Request,
    RequestRecord,
    Scheduler,
    SchedulerView,
    ServingObservation,
)


class PlantSimulation:
    """Stateful shell around the engine: advance time, observe, request clocks.

    ``simulate`` drives it for offline runs; the daemon's simulated mode drives the same
    object in (scaled) real time. The GPU's physics is :attr:`gpu`, the samples on the
    grid :attr:`series`.
    """

    def __init__(
        self,
        workload: Sequence[Request],
        plant: ServingPlant,
        scheduler: Scheduler = chunked_prefill_scheduler,
        *,
        seed: int = 0,
        initial_clock_mhz: float | None = None,
        fast_forward: bool = True,
    ) -> None:
        plant.validate()
        self._fast_forward_enabled = fast_forward
        requests = tuple(workload)
        for left, right in itertools.pairwise(requests):
            if right.arrival_time_s < left.arrival_time_s:
                raise ValueError(
                    f"workload must be sorted by arrival_time_s: request {right.request_id} "
                    f"arrives at {right.arrival_time_s} before request {left.request_id}"
                )
        for request in requests:
            if request.prompt_tokens + request.output_tokens > plant.kv_capacity_tokens:
                raise ValueError(
                    f"request {request.request_id} needs {request.prompt_tokens} + "
                    f"{request.output_tokens} KV tokens, more than the plant's "
                    f"kv_capacity_tokens={plant.kv_capacity_tokens}"
                )
        self.plant = plant
        self.scheduler = scheduler
        self._constant_plan: IterationPlan | None = getattr(scheduler, "constant_plan", None)
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._noise_cv = plant.latency_noise_cv
        self.requests = requests
        self._arrival = [r.arrival_time_s for r in requests]
        self._prompt = [int(r.prompt_tokens) for r in requests]
        self._output = [int(r.output_tokens) for r in requests]
        n = len(requests)
        self._first_token: list[float | None] = [None] * n
        self._finish: list[float | None] = [None] * n
        self._generated = [0] * n
        self._prefill_len = list(self._prompt)
        self._preemptions = [0] * n
        self._epoch = [0] * n
        # Each segment's energy, split among the requests it served (attribution.py).
        self.energy_ledger = EnergyLedger(n)

        params = GpuParameters.from_plant(plant)
        self._clocks = params.clock_mhz
        served = plant.profile.manifest.get("model")
        # The engine's model_name label: the profile's model, as an engine serving it
        # would label its metrics.
        self._model_name = served if isinstance(served, str) and served else None

        # Engine state.
        self.time_s = 0.0
        self._next_arrival = 0
        self._waiting: deque[int] = deque()
        self._waiting_tokens = 0
        self._prefilling: list[list[int]] = []  # [request index, remaining prefill tokens]
        self._prefilling_tokens = 0
        self._running: dict[int, int] = {}  # request index -> decode start counter
        self._heap: list[tuple[int, int, int]] = []  # (finish counter, request, epoch)
        # Requests that arrived with their prompt's KV cache (disaggregated decode pool).
        self._kv_arrivals: deque[int] = deque()
        self._prefilled_elsewhere: set[int] = set()
        self._decode_counter = 0
        self._sum_start = 0
        self._sum_gen0 = 0
        self._sum_plen_running = 0
        self._kv_prefill = 0
        self._completed = 0

        # Iteration in progress.
        self._in_iteration = False
        self._iter_progress = 0.0
        self._iter_start_s = 0.0
        self._iter_decode_batch = 0
        self._iter_context = 0
        self._iter_prefill_tokens = 0
        self._iter_chunks: list[tuple[list[int], int]] = []
        self._iter_noise = 1.0
        self._idle_until: float | None = None

        # Clocks: requested, and in effect after the actuation delay.
        start_index = (
            len(self._clocks) - 1
            if initial_clock_mhz is None
            else plant.profile.clock_index(initial_clock_mhz, downward=True)
        )
        self._actuation = ActuationDelay(start_index, plant.actuation_delay_s)

        # The GPU: realised clock, power, energy, temperature.
        self.gpu = GpuPhysics(params, start_index)

        # GPU utilisation since the previous observe().
        self._window_start = 0.0
        self._window_busy0 = 0.0
        # What the engine counts and reports: tokens, steps, latencies, SLO attainment.
        profile = plant.profile
        self.counters = EngineCounters(
            profile.ttft_slo_s, profile.ttft_slo_per_prompt_token_s, profile.tpot_slo_s
        )

        # Series on the grid.
        self._ff_tick: tuple[float, float, float, int, int] | None = None
        self._dt = plant.time_step_s
        self.series = GridSeries(plant.time_step_s)
        self._phase = "idle"
        self._record_tick(0.0, 0.0, self.gpu.temperature_c)

    # ------------------------------------------------------------------ public API
    @property
    def done(self) -> bool:
        """Every request has arrived and finished."""
        count = len(self.requests)
        return self._next_arrival >= count and self._completed >= count

    @property
    def requested_clock_mhz(self) -> float:
        """Latest requested (quantised) clock."""
        return self._clocks[self._actuation.requested]

    @property
    def realized_clock_mhz(self) -> float:
        """Clock the GPU runs at now."""
        return self.gpu.realized_clock_mhz

    @property
    def temperature_c(self) -> float:
        """Die temperature now."""
        return self.gpu.temperature_c

    @property
    def energy_j(self) -> float:
        """Energy drawn since the start."""
        return self.gpu.energy_j

    @property
    def clock_event_reasons(self) -> int:
        """Why the realised clock is below the request now, as NVML's bitmask."""
        return self.gpu.clock_event_reasons

    @property
    def prefilling_requests(self) -> int:
        """Admitted requests whose prompt is still being prefilled (chunk by chunk): an
        engine such as vLLM counts them running, where :meth:`observe` counts them
        waiting."""
        return len(self._prefilling)

    @property
    def preemptions(self) -> int:
        """Preemptions so far, every request together: a running count, so reading it
        costs the same however many requests have finished (``gpugov emulate``'s
        ``vllm:num_preemptions_total``)."""
        return self.counters.preemptions

    @property
    def iterations(self) -> int:
        """Engine steps (iterations) finished so far: prefill, decode and mixed alike
        (the count of vLLM's ``vllm:iteration_tokens_total`` histogram)."""
        return sum(self.counters.iteration_counts)

    @property
    def iteration_tokens(self) -> int:
        """Tokens those steps ran: prefill chunk tokens plus one per decoding request."""
        return self.counters.iteration_tokens

    def iteration_token_counts(self) -> tuple[int, ...]:
        """Steps per bucket of
        :data:`~gpugov.plant.engine_counters.ITERATION_TOKEN_BUCKETS` (not cumulative), the
        last entry above every bound."""
        return tuple(self.counters.iteration_counts)

    def recent_utilization(self, span_s: float) -> float:
        """Share of the grid samples of the last ``span_s`` seconds (up to now) at which an
        iteration ran: a sampled busy fraction, as NVML's GPU utilisation is (the share of
        its last sample period during which a kernel ran); 0.0 before any sample."""
        return self.series.busy_fraction_since(self.time_s - span_s)

    def add_request(self, prompt_tokens: int, output_tokens: int) -> int:
        """Append a request arriving now (online serving: ``gpugov emulate``); its index.

        Raises:
            ValueError: a length is not a positive integer, or the request cannot fit
                the KV cache.
        """
        index = len(self._arrival)
        prompt, output = int(prompt_tokens), int(output_tokens)
        if (prompt, output) != (prompt_tokens, output_tokens):
            raise ValueError(
                f"request lengths must be whole tokens, got {prompt_tokens!r} and {output_tokens!r}"
            )
        request = Request(index, self.time_s, prompt, output)
        if prompt + output > self.plant.kv_capacity_tokens:
            raise ValueError(
                f"{prompt_tokens} + {output_tokens} KV tokens exceed the plant's "
                f"kv_capacity_tokens={self.plant.kv_capacity_tokens}"
            )
        if not isinstance(self.requests, list):
            self.requests = list(self.requests)  # type: ignore[assignment]
        self.requests.append(request)  # type: ignore[attr-defined]
        self._arrival.append(self.time_s)
        self._prompt.append(prompt)
        self._output.append(output)
        self._first_token.append(None)
        self._finish.append(None)
        self._generated.append(0)
        self._prefill_len.append(prompt)
        self._preemptions.append(0)
        self._epoch.append(0)
        self.energy_ledger.add_request()
        return index

    def add_prefilled_request(
        self, prompt_tokens: int, output_tokens: int, first_token_time_s: float
    ) -> int:
        """Append a request arriving now with its prompt's KV cache already computed
        elsewhere and its first token produced at ``first_token_time_s`` (the decode pool of
        disaggregated serving, ``plant/disaggregated.py``); its index. It joins the decode
        batch at the next iteration start where the batch and the KV cache have room (first
        come, first served), without prefill compute.

        Raises:
            ValueError: as :meth:`add_request`, or a request of the workload has not arrived
                yet (prefilled requests are for a pool fed only this way).
        """
        self._move_arrivals(self.time_s)
        if self._next_arrival != len(self._arrival):
            raise ValueError("add_prefilled_request: workload requests are still to arrive")
        if output_tokens < 2:
            raise ValueError(f"a prefilled request needs output_tokens >= 2, got {output_tokens}")
        index = self.add_request(prompt_tokens, output_tokens)
        self._next_arrival = index + 1
        self._first_token[index] = float(first_token_time_s)
        self._generated[index] = 1
        self._kv_arrivals.append(index)
        self._prefilled_elsewhere.add(index)
        if not self._in_iteration:
            self._idle_until = None
        return index

    def _admit_prefilled(self) -> None:
        """Move prefilled arrivals into the decode batch while it has room (the admission
        rule of :meth:`_start_iteration`: batch size, then KV tokens with one slot of decode
        growth per running request)."""
        plant = self.plant
        queue = self._kv_arrivals
        while queue:
            request = queue[0]
            plen = self._prefill_len[request]
            if len(self._running) + len(self._prefilling) >= plant.max_batch_size:
                return
            growth = len(self._running) + 1
            if self._kv_prefill + self._kv_running() + plen + growth > plant.kv_capacity_tokens:
                return
            queue.popleft()
            self._start_running(request, plen)

    def cut_short(self, index: int) -> None:
        """End request ``index`` early, as an engine aborts a request whose client left:
        a running request finishes after the current decode iteration, one still waiting
        or prefilling at the end of its prefill (with its first token). A finished one is
        left alone. Online serving only (``gpugov emulate``)."""
        if self._finish[index] is not None:
            return
        start = self._running.get(index)
        if start is None:
            self._output[index] = self._generated[index] + 1
            return
        produced = self._generated[index] + self._decode_counter - start
        self._output[index] = produced + 1
        self._epoch[index] += 1  # the request's old completion entry no longer counts
        heapq.heappush(self._heap, (self._decode_counter + 1, index, self._epoch[index]))

    def prefilled_elsewhere(self, index: int) -> bool:
        """Whether request ``index`` came with its prompt's KV cache computed by another
        engine (:meth:`add_prefilled_request`)."""
        return index in self._prefilled_elsewhere

    def generated_tokens(self, index: int) -> int:
        """Tokens request ``index`` has produced so far (the prefill's first one included)."""
        generated = self._generated[index]
        start = self._running.get(index)
        return generated if start is None else generated + self._decode_counter - start

    def request_energy(self, index: int) -> tuple[float, float]:
        """(prefill J, decode J) attributed to request ``index`` so far
        (``plant/attribution.py``)."""
        return self.energy_ledger.request_energy(index, index in self._running)

    @property
    def idle_energy_j(self) -> float:
        """Energy drawn while no iteration ran (charged to no request)."""
        return self.energy_ledger.idle_j

    def request_clock(self, clock_mhz: float) -> float:
        """Request a clock (quantised downward); it takes effect after the actuation delay."""
        if not math.isfinite(clock_mhz):
            raise ValueError(f"requested clock must be finite, got {clock_mhz!r}")
        index = self.plant.profile.clock_index(clock_mhz, downward=True)
        self._actuation.request(index, self.time_s)
        return self._clocks[index]

    def set_power_cap(self, cap_w: float | None) -> float:
        """Set the GPU's run-time power cap (None: only the board limit); returns the
        limit in force. The firmware's power controller moves the clock to it over its
        averaging window (``gpu_physics.py``).

        Raises:
            ValueError: ``cap_w`` is not a finite positive number of watts.
        """
        return self.gpu.set_power_cap(cap_w)

    def observe(self, step_index: int | None = None) -> ServingObservation:
        """What a real node could know now; windowed latencies since the previous call."""
        now = self.time_s
        self._move_arrivals(now)
        decode_active = len(self._running)
        generated = self._sum_gen0 + decode_active * self._decode_counter - self._sum_start
        kv = self._kv_prefill + self._kv_running()
        elapsed = now - self._window_start
        gpu = self.gpu
        utilization = (gpu.busy_s - self._window_busy0) / elapsed if elapsed > _EPS else None
        profile = self.plant.profile
        counters = self.counters
        ttft_recent_s, tpot_recent_s, ttft_recent_prompt_tokens = counters.take_window()
        observation = ServingObservation(
            time_s=now,
            step_index=int(round(now / self._dt)) if step_index is None else step_index,
            arrived_requests=self._next_arrival,
            prefill_remaining_tokens=float(self._waiting_tokens + self._prefilling_tokens),
            decode_active=decode_active,
            generated_decode_tokens=float(generated),
            temperature_c=gpu.temperature_c,
            waiting_requests=len(self._waiting) + len(self._prefilling) + len(self._kv_arrivals),
            completed_requests=self._completed,
            output_tokens_total=float(counters.output_tokens),
            prompt_tokens_total=float(counters.prompt_tokens),
            kv_tokens=float(kv),
            kv_capacity_tokens=float(self.plant.kv_capacity_tokens),
            power_w=gpu.power_w,
            energy_j=gpu.energy_j,
            requested_clock_mhz=self._clocks[self._actuation.requested],
            realized_clock_mhz=gpu.realized_clock_mhz,
            gpu_utilization=None if utilization is None else min(1.0, max(0.0, utilization)),
            power_limit_w=gpu.enforced_power_limit_w,
            thermal_limit_c=self.plant.thermal_limit_c,
            supported_clocks_mhz=tuple(self._clocks),
            clock_event_reasons=gpu.clock_event_reasons,
            model_name=self._model_name,
            ttft_recent_s=ttft_recent_s,
            tpot_recent_s=tpot_recent_s,
            ttft_slo_s=profile.ttft_slo_s,
            tpot_slo_s=profile.tpot_slo_s,
            ttft_slo_per_prompt_token_s=counters.ttft_slo_per_prompt_token_s,
            ttft_recent_prompt_tokens=ttft_recent_prompt_tokens,
            ttft_count_total=float(counters.ttft_total),
            ttft_within_slo_total=float(counters.ttft_within),
            tpot_count_total=float(counters.tpot_total),
            tpot_within_slo_total=float(counters.tpot_within),
        )
        self._window_start = now
        self._window_busy0 = gpu.busy_s
        return observation

    def advance_to(self, end_s: float, *, stop_when_done: bool = False) -> None:
        """Run the engine until ``end_s`` (idling when there is no work).

        With ``stop_when_done`` it stops as soon as every request has finished, so an
        offline run ends at the last completion rather than at the next control tick.
        """
        while self.time_s < end_s - _EPS:
            if stop_when_done and self.done:
                return
            if not self._in_iteration:
                self._move_arrivals(self.time_s)
                started = self._idle_until is None and self._start_iteration()
                if not started and self._idle_until is None:
                    # Nothing to run: idle until the next arrival.
                    next_arrival = (
                        self._arrival[self._next_arrival]
                        if self._next_arrival < len(self._arrival)
                        else math.inf
                    )
                    self._idle_until = max(next_arrival, self.time_s)
                if started and self._fast_forward_enabled and self._fast_forward(end_s):
                    continue
                if self._idle_until is not None:
                    target = min(self._idle_until, end_s, self._actuation.next_change_s())
                    self._segment_idle(target)
                    if self.time_s >= self._idle_until - _EPS:
                        self._idle_until = None
                    continue
            self._segment_busy(end_s)

    # ------------------------------------------------------------- engine internals
    def _move_arrivals(self, now: float) -> None:
        arrival = self._arrival
        index = self._next_arrival
        count = len(arrival)
        while index < count and arrival[index] <= now + _EPS:
            self._waiting.append(index)
            tokens = self._prefill_len[index]
            self._waiting_tokens += tokens
            index += 1
        if index != self._next_arrival:
            self._next_arrival = index
            if self._idle_until is not None and not self._in_iteration:
                self._idle_until = None

    def _kv_running(self) -> int:
        return self._sum_plen_running + len(self._running) * self._decode_counter - self._sum_start

    def _segment_busy(self, end_s: float) -> None:
        index, (t_pf, t_dec, power) = self.gpu.busy_clock(
            self._actuation.take_effect(self.time_s),
            self._iter_prefill_tokens,
            self._iter_decode_batch,
            self._iter_context,
            self._iter_noise,
        )
        duration = t_pf + t_dec
        remaining = (1.0 - self._iter_progress) * duration
        finish = self.time_s + remaining
        target = min(finish, end_s, self._actuation.next_change_s())
        if target >= finish - _EPS:
            target = finish
            completes = True
        else:
            completes = False
        dt = target - self.time_s
        prefill = self._iter_prefill_tokens
        self.energy_ledger.charge_busy(
            power * dt,
            # The power it draws while it runs: a slowdown's idle share splits like the rest.
            prefill_fraction(
                t_pf, t_dec, self.gpu.running_power_w, self.gpu.params.prefill_power_w[index]
            )
            if prefill
            else 0.0,
            self._iter_chunks,
            prefill,
            self._iter_decode_batch,
        )
        self._integrate(dt, power, busy=True)
        if completes:
            # What the iteration took: its segments may have run at different clocks.
            self._finish_iteration(self.time_s - self._iter_start_s)
        elif duration > 0.0:
            self._iter_progress += dt / duration

    def _segment_idle(self, target: float) -> None:
        index = self.gpu.idle_clock(self._actuation.take_effect(self.time_s))
        if self._idle_until is not None and math.isinf(target):
            raise RuntimeError("idle segment without an end")
        self._phase = "idle"
        power = self.gpu.params.idle_power_w[index]
        dt = max(0.0, target - self.time_s)
        self.energy_ledger.charge_idle(power * dt)
        self._integrate(dt, power, busy=False)

    def _integrate(self, dt: float, power: float, *, busy: bool) -> None:
        """Advance time by ``dt`` at constant ``power``: the GPU, then the grid samples."""
        gpu = self.gpu
        start = self.time_s
        end = start + dt
        t0 = gpu.temperature_c
        e0 = gpu.energy_j
        gpu.integrate(dt, power, busy=busy)
        # Invariant: every grid tick <= time_s has been recorded.
        params = gpu.params
        series = self.series
        tick_time = series.next_tick_s
        while tick_time <= end + _EPS:
            elapsed = max(0.0, tick_time - start)
            temperature = params.temperature_after(t0, power, elapsed)
            self._record_tick(tick_time, e0 + power * elapsed, temperature)
            tick_time = series.next_tick_s
        if dt > 0.0:
            self.time_s = end

    def _record_tick(self, tick_time: float, energy: float, temperature: float) -> None:
        """Sample the engine at grid tick ``tick_time`` into :attr:`series`."""
        arrived = bisect.bisect_right(self._arrival, tick_time + _EPS)
        unmoved = arrived - self._next_arrival
        kv = self._kv_prefill + self._kv_running()
        if self._ff_tick is not None:
            # Inside a fast-forwarded stretch: add the iterations finished by tick_time.
            start, base, slope, batch, count = self._ff_tick
            done = 0
            elapsed = tick_time - start
            while done < count and (done + 1) * base + slope * done * (done + 1) / 2.0 <= (
                elapsed + _EPS
            ):
                done += 1
            kv += done * batch
        gpu = self.gpu
        self.series.record(
            tick_time,
            prefill_queue=float(len(self._waiting) + len(self._prefilling) + max(0, unmoved)),
            decode_active=float(len(self._running)),
            completed_requests=float(self._completed),
            kv_tokens=float(kv),
            power_w=gpu.power_w,
            requested_clock_mhz=self._clocks[self._actuation.requested],
            realized_clock_mhz=gpu.realized_clock_mhz,
            energy_j=energy,
            temperature_c=temperature,
            phase=self._phase,
        )

    def _start_iteration(self) -> bool:
        """Ask the scheduler for the next iteration; return False when nothing runs."""
        if self._kv_arrivals:
            self._admit_prefilled()
        has_work = bool(self._waiting or self._prefilling or self._running)
        if not has_work:
            return False
        plant = self.plant
        plan = self._constant_plan
        if plan is None:
            plan = self.scheduler(self._view())
        batch = 0
        if plan.decode and self._running:
            # Decode growth needs one KV slot per running request; preempt (recompute)
            # the most recently started requests when the cache would overflow.
            while (
                self._running
                and self._kv_prefill + self._kv_running() + len(self._running)
                > plant.kv_capacity_tokens
            ):
                self._preempt_latest()
            batch = len(self._running)
        budget = plan.prefill_token_budget
        if plan.count_decode_in_budget:
            budget -= batch
        chunks: list[tuple[list[int], int]] = []
        prefill_tokens = 0
        if budget > 0:
            for entry in self._prefilling:
                if budget <= 0:
                    break
                take = min(entry[1], budget)
                chunks.append((entry, take))
                budget -= take
                prefill_tokens += take
            capacity = plant.kv_capacity_tokens
            while budget > 0 and self._waiting:
                head = self._waiting[0]
                needed = self._prefill_len[head]
                in_batch = len(self._running) + len(self._prefilling)
                if in_batch >= plant.max_batch_size:
                    break
                if self._kv_prefill + self._kv_running() + needed + batch > capacity:
                    break
                self._waiting.popleft()
                self._waiting_tokens -= needed
                self._kv_prefill += needed
                entry = [head, needed]
                self._prefilling.append(entry)
                self._prefilling_tokens += needed
                take = min(needed, budget)
                chunks.append((entry, take))
                budget -= take
                prefill_tokens += take
        if batch == 0 and prefill_tokens == 0:
            if plan.idle_s > 0.0:
                self._idle_until = self.time_s + plan.idle_s
                return False
            if self._waiting and not self._running and not self._prefilling:
                raise RuntimeError(
                    f"scheduler deadlock at t={self.time_s:.3f}s: requests wait but the "
                    "scheduler ran nothing and asked for no idle time"
                )
            # Blocked (e.g. KV full with only prefills pending): wait one grid step.
            self._idle_until = self.time_s + self._dt
            return False
        self._in_iteration = True
        self._iter_progress = 0.0
        self._iter_start_s = self.time_s
        self._iter_decode_batch = batch
        self._iter_context = self._kv_running() if batch else 0
        self._iter_prefill_tokens = prefill_tokens
        self._iter_chunks = chunks
        if self._noise_cv > 0.0:
            sigma = math.sqrt(math.log1p(self._noise_cv**2))
            self._iter_noise = float(self._rng.lognormal(-0.5 * sigma * sigma, sigma))
        if batch and prefill_tokens:
            self._phase = "mixed"
        elif batch:
            self._phase = "decode"
        else:
            self._phase = "prefill"
        return True

    def _fast_forward(self, end_s: float) -> bool:
        """Run a stretch of identical decode-only iterations in closed form.

        Eligible when the new iteration decodes only, nothing waits or prefills, the
        scheduler's plan is constant and there is no jitter. The stretch stops before the
        next request completion, arrival, clock change, ``end_s`` or KV overflow, and is
        skipped when the die could reach the thermal limit. Iteration ``i`` of the stretch
        lasts ``base + slope * i`` (context grows by ``B`` tokens per iteration) at the
        constant decode power ``p_dec(B)``, so time, energy, temperature and token counts
        are exactly those of the iteration-by-iteration path. Returns True when it ran.
        """
        batch = self._iter_decode_batch
        if (
            self._constant_plan is None
            or self._noise_cv > 0.0
            or self._iter_prefill_tokens
            or not batch
            or self._waiting
            or self._prefilling
            or not self._heap
        ):
            return False
        plant = self.plant
        index, (_, base, power) = self.gpu.busy_clock(
            self._actuation.take_effect(self.time_s),
            self._iter_prefill_tokens,
            self._iter_decode_batch,
            self._iter_context,
            self._iter_noise,
        )
        if self.gpu.may_reach_thermal_limit(power):
            return False
        cap = self.gpu.cap_w
        if cap is not None and (power > cap or self.gpu.average_power_w > cap):
            # The cap's power controller would move the clock within the stretch.
            return False
        counter = self._decode_counter
        k_completion = self._heap[0][0] - counter - 1
        free = plant.kv_capacity_tokens - self._kv_prefill - self._kv_running()
        k_kv = free // batch - 1
        next_arrival = (
            self._arrival[self._next_arrival]
            if self._next_arrival < len(self._arrival)
            else math.inf
        )
        available = min(end_s, next_arrival, self._actuation.next_change_s()) - self.time_s
        # A slowdown below the lowest clock stretches every iteration alike (its power
        # depends on the batch alone, constant over the stretch).
        slope = self.gpu.params.decode_context_slope_s(index, batch) * self.gpu.slowdown
        if math.isinf(available):
            k_time = k_completion
        elif slope > 0.0:
            b = base - 0.5 * slope
            k_time = int((-b + math.sqrt(b * b + 2.0 * slope * available)) / slope)
        else:
            k_time = int(available / base)
        count = min(k_completion, k_kv, k_time)
        while count > 0 and count * base + slope * count * (count - 1) / 2.0 > available:
            count -= 1
        if count < 2:
            return False
        total = count * base + slope * count * (count - 1) / 2.0
        self._phase = "decode"
        self._ff_tick = (self.time_s, base, slope, batch, count)
        self.energy_ledger.charge_busy(power * total, 0.0, (), 0, batch)
        self._integrate(total, power, busy=True)
        self._ff_tick = None
        self._decode_counter = counter + count
        self.counters.count_steps(batch, count)
        self.counters.decoded(total, batch, count)
        self._in_iteration = False
        return True

    def _view(self) -> SchedulerView:
        plant = self.plant
        return SchedulerView(
            time_s=self.time_s,
            waiting_requests=len(self._waiting),
            prefilling_requests=len(self._prefilling),
            decode_active=len(self._running),
            prefill_remaining_tokens=self._waiting_tokens + self._prefilling_tokens,
            oldest_waiting_age_s=(
                self.time_s - self._arrival[self._waiting[0]] if self._waiting else 0.0
            ),
            kv_tokens=self._kv_prefill + self._kv_running(),
            kv_capacity_tokens=plant.kv_capacity_tokens,
            max_batch_size=plant.max_batch_size,
            next_prompt_tokens=self._prefill_len[self._waiting[0]] if self._waiting else 0,
        )

    def _preempt_latest(self) -> None:
        victim, start = self._running.popitem()
        self.energy_ledger.stop_decode(victim)
        produced = self._decode_counter - start
        plen = self._prefill_len[victim]
        self._sum_start -= start
        gen0 = self._generated[victim]
        self._sum_gen0 -= gen0
        self._sum_plen_running -= plen
        self._generated[victim] = gen0 + produced
        self._epoch[victim] += 1
        self._preemptions[victim] += 1
        self.counters.preempted()
        # Recompute: prompt plus every token generated so far is prefilled again.
        new_len = self._prompt[victim] + self._generated[victim]
        self._prefill_len[victim] = new_len
        self._waiting.appendleft(victim)
        self._waiting_tokens += new_len

    def _finish_iteration(self, duration: float) -> None:
        """End the iteration in flight, which took ``duration`` seconds: its tokens, the
        requests it finished and the prefills it completed."""
        now = self.time_s
        batch = self._iter_decode_batch
        self._in_iteration = False
        self.counters.count_steps(batch + self._iter_prefill_tokens)
        if batch:
            self._decode_counter += 1
            counter = self._decode_counter
            self.counters.decoded(duration, batch)
            heap = self._heap
            epoch = self._epoch
            running = self._running
            while heap and heap[0][0] <= counter:
                _, request, request_epoch = heapq.heappop(heap)
                if request_epoch != epoch[request] or request not in running:
                    continue
                start = running.pop(request)
                self.energy_ledger.stop_decode(request)
                self._sum_start -= start
                self._sum_gen0 -= self._generated[request]
                self._sum_plen_running -= self._prefill_len[request]
                self._generated[request] = self._output[request]
                self._finish[request] = now
                self._completed += 1
                self._count_tpot(request, now)
        if self._iter_chunks:
            self.counters.prefilled(self._iter_prefill_tokens)
            self._prefilling_tokens -= self._iter_prefill_tokens
            completed_any = False
            for entry, take in self._iter_chunks:
                entry[1] -= take
                if entry[1] <= 0:
                    completed_any = True
                    self._complete_prefill(entry[0], now)
            if completed_any:
                self._prefilling = [entry for entry in self._prefilling if entry[1] > 0]
            self._iter_chunks = []
        self._iter_prefill_tokens = 0

    def _complete_prefill(self, request: int, now: float) -> None:
        plen = self._prefill_len[request]
        self._kv_prefill -= plen
        self._generated[request] += 1
        self.counters.prefill_finished()
        if self._first_token[request] is None:
            self._first_token[request] = now
            self.counters.first_token(now - self._arrival[request], self._prompt[request])
        if self._generated[request] >= self._output[request]:
            self._finish[request] = now
            self._completed += 1
            self._count_tpot(request, now)
            return
        self._start_running(request, plen)

    def _start_running(self, request: int, plen: int) -> None:
        """Put ``request`` (prompt ``plen`` tokens, its KV cache in place) in the decode
        batch: its decode energy, the batch sums and its finish in the heap."""
        counter = self._decode_counter
        self._running[request] = counter
        self.energy_ledger.start_decode(request)
        self._sum_start += counter
        self._sum_gen0 += self._generated[request]
        self._sum_plen_running += plen
        remaining = self._output[request] - self._generated[request]
        heapq.heappush(self._heap, (counter + remaining, request, self._epoch[request]))

    def _count_tpot(self, request: int, now: float) -> None:
        """Count a finished request's TPOT against the SLO, as ``compute_metrics`` judges
        it (a one-token request has no TPOT and is not counted)."""
        output = self._output[request]
        first = self._first_token[request]
        if output <= 1 or first is None:
            return
        self.counters.finished((now - first) / (output - 1))

    # ------------------------------------------------------------------- forks
    def fork(self) -> PlantSimulation:
        """An independent copy of this simulation for what-if runs, without its series.

        ``copy.deepcopy`` is a correct fork (plain Python state plus a numpy
        ``Generator``) but copies every recorded grid sample, which grows with simulated
        time (about 90 ms at 300 s of the bundled trace). A fork shares the immutable
        workload (copied once :meth:`add_request` made it a list) and plant, starts its
        grid series empty (its :meth:`result` therefore has series from the fork point
        only; its energy, request outcomes and state are exact), and copies lists of
        plain numbers with ``list.copy`` (about 1 ms); ``plant/fork.py``.
        """
        return fork_simulation(self)

    def request_times(self) -> tuple[Sequence[float | None], Sequence[float | None]]:
        """First-token and finish times so far, indexed like :attr:`requests` (``None``
        where not yet reached). Live, read-only views: cheap to take every period, and
        not to be modified."""
        return self._first_token, self._finish

    # ----------------------------------------------------------------- results
    def records(self) -> tuple[RequestRecord, ...]:
        """Records of every request that has arrived by now."""
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

    def result(
        self, controller_name: str = "", scheduler_name: str = "", **metadata: Any
    ) -> ServingResult:
        """Freeze the run into a :class:`ServingResult`."""
        self._move_arrivals(self.time_s)
        records = self.records()
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
            clock_changes=self._actuation.changes,
            idle_energy_j=self.energy_ledger.idle_j,
            cap_overshoot_s=gpu.cap_overshoot_s if gpu.cap_requested else None,
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
