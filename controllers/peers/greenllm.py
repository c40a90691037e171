"""GreenLLM: a dual-loop decode controller with hysteresis, and a prefill clock from fitted
latency and power models.

Source: Q. Liu, D. Huang, M. Zapater, D. Atienza, "GreenLLM: SLO-Aware Dynamic Frequency
Scaling for Energy-Efficient LLM Serving", arXiv 2508.16449 (2025). Requests go to
length-binned queues; for prefill it fits compact latency and power models over the SM
clock from short traces and picks, per queue, the energy-minimal clock that meets the
TTFT SLO; for decode a dual-loop controller tracks tokens per second and moves the clock
in small hysteretic steps to hold tail time-between-tokens within its band. Claimed: up
to 34 % less energy than the default DVFS, with under 3.5 % more SLO violations.

What this keeps:

* decode, inner loop (every call): the window's mean time per output token against a
  band ``[low, high] x target x TPOT SLO``: above it, up ``up_steps`` clocks; below it,
  down one clock; inside it, hold (the hysteresis);
* decode, outer loop (every ``outer_s``): the share of recent windows over the TPOT SLO
  (a tail proxy) moves ``target``: down by ``target_step`` when over ``tail_budget``, up
  by half a step when none was;
* prefill: with prompt tokens queued, the clock that minimises the modelled energy of
  the backlog, ``P(f) * W / r(f)``, among the clocks whose modelled drain time ``W /
  r(f)`` fits ``prefill_share`` of the TTFT SLO; ``r(f) = k f`` (prefill is
  compute-bound) and ``P(f) = a + b (f / f_max)^3`` are least-squares fits to the node's
  own windows (prompt tokens per busy second, and power, at the realised clock). The
  clock run is the higher of the decode and prefill clocks.

Simplified: the length-binned queues are an engine scheduler change and are left out
(the plant's engine keeps vLLM's one queue), so there is one prefill class; the models
are fitted online from the node's windows instead of an offline trace sweep, and until
two clocks have been seen the prefill clock is the top one; the tail is the share of
windows over the SLO, not a per-token percentile.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from gpugov.controllers.peers.common import (
    CounterTracker,
    clocks_of,
    current_index,
    finite,
    tpot_ratio,
)
from gpugov.plant.types import ServingObservation


class GreenLLMController:
    """Decode dual loop plus fitted prefill clock (module notes)."""

    def __init__(
        self,
        *,
        target: float = 0.8,
        low: float = 0.85,
        high: float = 1.0,
        up_steps: int = 3,
        outer_s: float = 10.0,
        tail_budget: float = 0.05,
        target_step: float = 0.05,
        prefill_share: float = 0.7,
        memory: int = 200,
    ) -> None:
        if not 0.0 < low < high:
            raise ValueError(f"greenllm: need 0 < low < high, got {low!r}, {high!r}")
        if not 0.0 < target <= 1.0:
            raise ValueError(f"greenllm: target must lie in (0, 1], got {target!r}")
        self.target = target
        self.low, self.high = low, high
        self.up_steps = up_steps
        self.outer_s = outer_s
        self.tail_budget = tail_budget
        self.target_step = target_step
        self.prefill_share = prefill_share
        self._decode_index: int | None = None
        self._over: deque[bool] = deque(maxlen=50)
        self._next_outer_s: float | None = None
        self._counters = CounterTracker()
        self._rate_samples: deque[tuple[float, float]] = deque(maxlen=memory)
        self._power_samples: deque[tuple[float, float]] = deque(maxlen=memory)
        self.name = "greenllm"

    # ------------------------------------------------------------------ decode
    def _decode(self, observation: ServingObservation, clocks: tuple[float, ...]) -> int:
        if self._decode_index is None:
            self._decode_index = current_index(observation, clocks)
        ratio = tpot_ratio(observation)
        now = float(observation.time_s)
        if ratio is not None:
            self._over.append(ratio > 1.0)
            band = self.target
            if ratio > self.high * band:
                self._decode_index += self.up_steps
            elif ratio < self.low * band:
                self._decode_index -= 1
        elif observation.decode_active == 0 and observation.waiting_requests == 0:
            self._decode_index -= 1  # idle: nothing to protect
        if self._next_outer_s is None:
            self._next_outer_s = now + self.outer_s
        elif now + 1e-9 >= self._next_outer_s:
            self._next_outer_s = now + self.outer_s
            if self._over:
                share = sum(self._over) / len(self._over)
                if share > self.tail_budget:
                    self.target = max(0.3, self.target - self.target_step)
                elif share == 0.0:
                    self.target = min(1.0, self.target + 0.5 * self.target_step)
        self._decode_index = min(len(clocks) - 1, max(0, self._decode_index))
        return self._decode_index

    # ----------------------------------------------------------------- prefill
    def _observe_models(self, observation: ServingObservation) -> None:
        deltas = self._counters.update(observation)
        clock = finite(observation.realized_clock_mhz)
        power = finite(observation.power_w)
        utilization = finite(observation.gpu_utilization)
        if clock is None or clock <= 0.0:
            return
        if power is not None and power > 0.0 and utilization is not None and utilization > 0.5:
            self._power_samples.append((clock, power))
        busy = (
            None
            if deltas.elapsed_s is None or utilization is None
            else deltas.elapsed_s * utilization
        )
        if deltas.prompt_tokens and busy and busy > 0.0:
            self._rate_samples.append((clock, deltas.prompt_tokens / busy))

    def prefill_index(
        self, observation: ServingObservation, clocks: tuple[float, ...]
    ) -> int | None:
        """The prefill clock's index for the queued prompts, or None with none queued."""
        backlog = finite(observation.prefill_remaining_tokens) or 0.0
        if backlog <= 0.0:
            return None
        slo = observation.ttft_slo_for(finite(observation.ttft_recent_prompt_tokens))
        if slo is None or not self._rate_samples or len({c for c, _ in self._power_samples}) < 2:
            return len(clocks) - 1
        top = clocks[-1]
        # r(f) = k f: the slope through the origin of the rate samples (an upper envelope
        # would be optimistic; the mean slope is what the node measured).
        k = float(np.mean([rate / clock for clock, rate in self._rate_samples]))
        x = np.array([c / top for c, _ in self._power_samples])
        design = np.column_stack([np.ones_like(x), x**3])
        (a, b), *_ = np.linalg.lstsq(
            design, np.array([p for _, p in self._power_samples]), rcond=None
        )
        budget = self.prefill_share * slo
        best, best_energy = len(clocks) - 1, np.inf
        for index, clock in enumerate(clocks):
            drain = backlog / (k * clock) if k > 0.0 else np.inf
            if drain > budget:
                continue
            energy = (a + b * (clock / top) ** 3) * drain
            if energy < best_energy:
                best, best_energy = index, energy
        return best

    def __call__(self, observation: ServingObservation) -> float:
        clocks = clocks_of(observation, "greenllm")
        self._observe_models(observation)
        decode = self._decode(observation, clocks)
        prefill = self.prefill_index(observation, clocks)
        return clocks[decode if prefill is None else max(decode, prefill)]
