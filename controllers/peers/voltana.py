"""VoltanaLLM's per-phase frequency controller (EcoFreq): on a prefill or a decode pool,
the lowest clock of a short list whose predicted latency meets the phase's SLO.

Source: J. Yu, A. Taneja, J. Lin, M. Zhang, "VoltanaLLM: Feedback-Driven Frequency Control
and State-Space Routing for Energy-Efficient LLM Serving", arXiv 2509.04827 (2025), and
its SGLang implementation (Supercomputing-System-AI-Lab/VoltanaLLM,
``python/sglang/srt/managers/freq_manager.py``). On prefill/decode disaggregated
serving, each instance runs a feedback loop (EcoFreq) every interval: the highest
frequency when requests wait in its queue (or the arrival rate crosses a threshold);
otherwise the lowest frequency of a short list whose latency, predicted from a profiled
lookup table for the current batch (the running tokens on prefill, the batch size on
decode), meets the phase's SLO (TTFT on prefill, inter-token latency on decode) times
``1 + margin``; the highest when none does; the lowest after five seconds without work.
A state-space router (EcoRoute) places decode requests across instances to avoid batch
size boundaries. Claimed: up to 36.3 % less energy than the maximum clock, with near
perfect SLO attainment.

What this keeps, per pool, every call:

* the list: ``levels`` supported clocks, evenly spaced from the lowest to the highest;
* decode, requests waiting for admission (``waiting_requests > 0``): the highest clock;
* otherwise the lowest clock of the list whose predicted latency is at most ``(1 +
  margin) x SLO``, else the highest. Prefill: the time to compute the prompt backlog
  (with none queued now but prompts computed in the window, one window-mean prompt: the
  typical batch), ``W / r(f)``, against the TTFT SLO at the window's mean prompt;
  decode: the time per output token at the running batch, against the TPOT SLO;
* no metrics (no prompt computed or queued, no running batch): hold, and after
  ``idle_reset_s`` (five seconds) without any, the lowest clock of the list.

The role comes from the observation (``observation.role``, the domain's ``role``); a
colocated domain runs both rules and takes the higher clock (VoltanaLLM itself refuses
co-location).

Simplified: the paper profiles a latency table offline per model and GPU; a node has no
profile, so the table is learned online from the node's own windows (the feedback): the
prefill rate ``r`` (prompt tokens per busy second) per clock, and the window's mean TPOT
per clock and power-of-two batch bucket, each an exponential average at the realised
clock. A clock not yet measured is predicted from the nearest measured one as if
latency scaled with ``1 / f`` (compute-bound: exact for prefill, pessimistic for
memory-bound decode, so the rule steps down and learns the real figure); with nothing
measured for the batch, the highest clock. On prefill the waiting-queue rule is replaced
by the backlog's drain time: the plant (like a node's ``waiting_requests`` under chunked
prefill) counts the prompt being computed as waiting, so the rule would pin the prefill
pool at the top clock whenever it works; the whole backlog's drain time is the queueing
the rule protects. The TTFT offset for the time queued requests already waited is not
visible to a node (no per-request wait), so ``margin`` (-0.2: aim at 80 % of the SLO)
stands in for it on both phases. The rate thresholds and the router are left out: one
pool's controller sees one pool, and the plant routes round robin.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpugov.controllers.peers.common import (
    CounterTracker,
    clocks_of,
    current_index,
    finite,
)
from gpugov.plant.types import ServingObservation

PREFILL, DECODE, COLOCATED = "prefill", "decode", "colocated"


class LatencyTable:
    """Latencies measured per (clock, key), exponentially averaged; a clock not measured
    is predicted from the nearest measured one as ``latency x f_measured / f``."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.entries: dict[int, dict[float, float]] = {}

    def record(self, key: int, clock_mhz: float, latency: float) -> None:
        """Average ``latency`` into the entry of ``(clock_mhz, key)``."""
        row = self.entries.setdefault(key, {})
        old = row.get(clock_mhz)
        row[clock_mhz] = latency if old is None else old + self.alpha * (latency - old)

    def predict(self, key: int, clock_mhz: float) -> float | None:
        """The latency at ``clock_mhz`` for ``key``, or None with nothing measured."""
        row = self.entries.get(key)
        if not row:
            return None
        if clock_mhz in row:
            return row[clock_mhz]
        nearest = min(row, key=lambda c: (abs(c - clock_mhz), -c))
        return row[nearest] * nearest / clock_mhz


def batch_bucket(batch: float) -> int:
    """The power-of-two bucket of a running batch (1, 2, 3-4, 5-8, ... -> 0, 1, 2, 3)."""
    return max(0, math.ceil(math.log2(max(1.0, batch))))


class VoltanaController:
    """EcoFreq's per-phase rule on a learned latency table (module notes)."""

    def __init__(
        self,
        *,
        margin: float = -0.2,
        levels: int = 8,
        idle_reset_s: float = 5.0,
        alpha: float = 0.3,
    ) -> None:
        if not (math.isfinite(margin) and -1.0 < margin <= 1.0):
            raise ValueError(f"voltana: margin must lie in (-1, 1], got {margin!r}")
        if levels < 2:
            raise ValueError(f"voltana: levels must be >= 2, got {levels!r}")
        if not (math.isfinite(idle_reset_s) and idle_reset_s >= 0.0):
            raise ValueError(f"voltana: idle_reset_s must be >= 0, got {idle_reset_s!r}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"voltana: alpha must lie in (0, 1], got {alpha!r}")
        self.margin = margin
        self.levels = levels
        self.idle_reset_s = idle_reset_s
        self.prefill_time = LatencyTable(alpha)
        """Seconds per prompt token (1 / rate), one key (0)."""
        self.decode_time = LatencyTable(alpha)
        """Mean TPOT, keyed by batch bucket."""
        self._counters = CounterTracker()
        self._last_metrics_s: float | None = None
        self._list: tuple[float, ...] = ()
        self.name = "voltana"

    # ------------------------------------------------------------------ helpers
    def frequency_list(self, clocks: tuple[float, ...]) -> tuple[float, ...]:
        """``levels`` supported clocks evenly spaced over the range (VoltanaLLM's list)."""
        if len(clocks) <= self.levels:
            return clocks
        last = len(clocks) - 1
        picks = {round(k * last / (self.levels - 1)) for k in range(self.levels)}
        return tuple(clocks[i] for i in sorted(picks))

    def _snap(self, mhz: float) -> float:
        """The list's clock nearest to ``mhz`` (the clock a measurement is filed under)."""
        return min(self._list, key=lambda c: abs(c - mhz))

    def _learn(self, observation: ServingObservation) -> bool:
        """File this window's measurements under the realised clock; True when prompt
        tokens were computed in the window (the prefill rule has metrics)."""
        deltas = self._counters.update(observation)
        computed = bool(deltas.prompt_tokens and deltas.prompt_tokens > 0.0)
        clock = finite(observation.realized_clock_mhz) or finite(observation.requested_clock_mhz)
        if clock is None or clock <= 0.0:
            return computed
        clock = self._snap(clock)
        utilization = finite(observation.gpu_utilization)
        busy = (
            None
            if deltas.elapsed_s is None or utilization is None
            else deltas.elapsed_s * utilization
        )
        if computed and busy and busy > 0.0:
            self.prefill_time.record(0, clock, busy / deltas.prompt_tokens)  # type: ignore[operator]
        tpot = finite(observation.tpot_recent_s)
        if tpot is not None and tpot > 0.0 and observation.decode_active > 0:
            self.decode_time.record(batch_bucket(observation.decode_active), clock, tpot)
        return computed

    def _lowest_meeting(self, predict: Callable[[float], float | None], target: float) -> float:
        """The lowest clock of the list whose prediction is at most ``target``, else the
        highest (also when nothing is measured yet)."""
        for clock in self._list[:-1]:
            latency = predict(clock)
            if latency is not None and latency <= target:
                return clock
        return self._list[-1]

    # -------------------------------------------------------------- per phase
    def prefill_clock(self, observation: ServingObservation, computed: bool) -> float | None:
        """The prefill rule's clock: the work is the prompt backlog, else (none queued
        now, but prompts were computed in the window) the window's mean prompt, one
        typical batch; None (no metrics) when neither."""
        backlog = finite(observation.prefill_remaining_tokens) or 0.0
        recent = finite(observation.ttft_recent_prompt_tokens)
        work = backlog if backlog > 0.0 else (recent if computed and recent else 0.0)
        if work <= 0.0:
            return None
        slo = observation.ttft_slo_for(recent)
        if slo is None:
            return self._list[-1]
        target = (1.0 + self.margin) * slo

        def predict(clock: float) -> float | None:
            per_token = self.prefill_time.predict(0, clock)
            return None if per_token is None else work * per_token

        return self._lowest_meeting(predict, target)

    def decode_clock(self, observation: ServingObservation) -> float | None:
        """The decode rule's clock: the highest with requests waiting for admission (on a
        decode pool); None (no metrics) with no running batch."""
        if observation.role == DECODE and observation.waiting_requests > 0:
            return self._list[-1]
        if observation.decode_active <= 0:
            return None
        slo = finite(observation.tpot_slo_s)
        if slo is None or slo <= 0.0:
            return self._list[-1]
        bucket = batch_bucket(observation.decode_active)
        target = (1.0 + self.margin) * slo
        return self._lowest_meeting(lambda c: self.decode_time.predict(bucket, c), target)

    # ---------------------------------------------------------------- decision
    def __call__(self, observation: ServingObservation) -> float:
        clocks = clocks_of(observation, "voltana")
        self._list = self.frequency_list(clocks)
        computed = self._learn(observation)
        now = float(observation.time_s)
        role = observation.role
        choices = []
        if role in (PREFILL, COLOCATED):
            choices.append(self.prefill_clock(observation, computed))
        if role in (DECODE, COLOCATED):
            choices.append(self.decode_clock(observation))
        known = [c for c in choices if c is not None]
        if known:
            self._last_metrics_s = now
            return max(known)
        if self._last_metrics_s is None or now - self._last_metrics_s >= self.idle_reset_s:
            return self._list[0]
        return clocks[current_index(observation, clocks)]
