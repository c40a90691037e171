"""throttLL'eM-style throttling: predict the engine's iteration throughput from projected
KV-cache usage and batch size, then run the lowest clock that meets the SLO.

Source: A. K. Kakolyris, D. Masouros, P. Vavaroutsos, S. Xydis, D. Soudris,
"throttLL'eM: Predictive GPU Throttling for Energy Efficient LLM Inference Serving",
HPCA 2025 (arXiv 2408.05235). It projects the KV-cache usage and batch size over the
coming iterations, feeds them with a candidate clock to a gradient-boosted model of
iterations per second (trained offline on profiling runs), and picks the lowest clock
whose predicted throughput meets the token-generation SLO; it also autoscales engine
instances. Claimed: up to 43.8 % less energy than NVIDIA's Triton at the default clock.

What this keeps: the projection (the batch a period ahead is the running requests plus
the waiting ones the batch can admit; the KV usage grows by the queued prompts and one
token per running request per iteration over ``horizon_iterations``) and the rule (the
lowest supported clock whose predicted time per iteration is within ``margin`` of the
TPOT SLO). Its end-to-end latency SLO becomes a TTFT check here, the SLO the scoreboard
judges: the queued prompt tokens must drain within ``drain_share`` (half) of the TTFT
SLO, since they have already waited, at the predicted prompt throughput (prompt tokens
per busy second, proportional to the clock, learned from the windows); the clock run
meets both. (A first version drained within ``margin`` of the SLO and left over a quarter
of the requests over their TTFT SLO in a smoke run on the bundled trace at 3x its load.)

Simplified: the performance model is learned online, from the node's own windows (the
engine's mean inter-token latency at the realised clock), instead of offline profiling:
recursive least squares with forgetting on ``[1, B, KV]`` and ``[1, B, KV] * f_max / f``,
so it learns which part of an iteration scales with the clock. Until it has
``min_samples`` windows it holds the top clock while the engine has work; an idle engine
(nothing running, waiting or queued) runs the lowest clock, before the model as after.
Generation-length prediction (used for the projection) and instance autoscaling are left
out: the plant serves one engine, and a node sees no output length in advance.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.peers.common import clocks_of, finite
from gpugov.plant.types import ServingObservation

BATCH_SCALE = 100.0
KV_SCALE = 100_000.0


class ThrottLLeMController:
    """Project, predict, pick the lowest meeting clock (module notes)."""

    def __init__(
        self,
        *,
        margin: float = 0.9,
        horizon_iterations: int = 50,
        forgetting: float = 0.99,
        min_samples: int = 10,
        max_batch_size: int = 256,
        drain_share: float = 0.5,
    ) -> None:
        if not 0.0 < margin <= 1.0:
            raise ValueError(f"throttllem: margin must lie in (0, 1], got {margin!r}")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"throttllem: forgetting must lie in (0, 1], got {forgetting!r}")
        self.margin = margin
        self.horizon_iterations = horizon_iterations
        self.forgetting = forgetting
        self.min_samples = min_samples
        self.max_batch_size = max_batch_size
        if not 0.0 < drain_share <= 1.0:
            raise ValueError(f"throttllem: drain_share must lie in (0, 1], got {drain_share!r}")
        self.drain_share = drain_share
        self.theta = np.zeros(6)
        self._p = np.eye(6) * 1e3
        self.samples = 0
        self._top: float | None = None
        self._last_features: tuple[float, float] | None = None
        self._last_prompt_total: float | None = None
        self._last_time_s: float | None = None
        self.prompt_rate_per_mhz: float | None = None
        self.name = "throttllem"

    def features(self, batch: float, kv_tokens: float, clock: float) -> NDArray[np.float64]:
        """The model's regressors for an iteration of ``batch`` requests over
        ``kv_tokens`` at ``clock``."""
        assert self._top is not None
        base = np.array([1.0, batch / BATCH_SCALE, kv_tokens / KV_SCALE])
        return np.concatenate([base, base * (self._top / clock)])

    def predict_iteration_s(self, batch: float, kv_tokens: float, clock: float) -> float:
        """Predicted seconds per iteration."""
        return float(self.theta @ self.features(batch, kv_tokens, clock))

    def _fit(self, observation: ServingObservation) -> None:
        """One recursive-least-squares step on the window just measured."""
        itl = finite(observation.tpot_recent_s)
        clock = finite(observation.realized_clock_mhz) or finite(observation.requested_clock_mhz)
        if (
            itl is None
            or itl <= 0.0
            or clock is None
            or clock <= 0.0
            or self._last_features is None
        ):
            return
        # The window ran from the previous state to this one: its mean batch and KV.
        batch = 0.5 * (self._last_features[0] + max(0, observation.decode_active))
        kv = 0.5 * (self._last_features[1] + (finite(observation.kv_tokens) or 0.0))
        x = self.features(batch, kv, clock)
        px = self._p @ x
        gain = px / (self.forgetting + x @ px)
        self.theta = self.theta + gain * (itl - x @ self.theta)
        self._p = (self._p - np.outer(gain, px)) / self.forgetting
        self.samples += 1

    def _fit_prompt_rate(self, observation: ServingObservation) -> None:
        """Track prompt tokens per busy second per MHz (an exponential average)."""
        total = finite(observation.prompt_tokens_total)
        now = float(observation.time_s)
        last_total, last_time = self._last_prompt_total, self._last_time_s
        self._last_prompt_total, self._last_time_s = total, now
        clock = finite(observation.realized_clock_mhz)
        utilization = finite(observation.gpu_utilization)
        if None in (total, last_total, last_time, clock, utilization):
            return
        assert total is not None and last_total is not None and last_time is not None
        assert clock is not None and utilization is not None
        busy = (now - last_time) * utilization
        tokens = total - last_total
        if tokens <= 0.0 or busy <= 0.0 or clock <= 0.0:
            return
        sample = tokens / busy / clock
        old = self.prompt_rate_per_mhz
        self.prompt_rate_per_mhz = sample if old is None else 0.8 * old + 0.2 * sample

    def prefill_clock_mhz(self, observation: ServingObservation) -> float | None:
        """The lowest clock that drains the queued prompts within ``drain_share`` of the
        TTFT SLO at the predicted prompt throughput; None without a queue; inf when unknown."""
        backlog = finite(observation.prefill_remaining_tokens) or 0.0
        if backlog <= 0.0:
            return None
        slo = observation.ttft_slo_for(finite(observation.ttft_recent_prompt_tokens))
        rate = self.prompt_rate_per_mhz
        if slo is None or slo <= 0.0 or rate is None or rate <= 0.0:
            return math.inf
        return backlog / (self.drain_share * slo * rate)

    def project(self, observation: ServingObservation) -> tuple[float, float]:
        """(batch, KV tokens) a period ahead (module notes)."""
        running = max(0, observation.decode_active)
        waiting = max(0, observation.waiting_requests)
        batch = float(min(self.max_batch_size, running + waiting))
        kv = finite(observation.kv_tokens) or 0.0
        queued = finite(observation.prefill_remaining_tokens) or 0.0
        kv += queued + batch * self.horizon_iterations
        capacity = finite(observation.kv_capacity_tokens)
        if capacity is not None and capacity > 0.0:
            kv = min(kv, capacity)
        return batch, kv

    def __call__(self, observation: ServingObservation) -> float:
        clocks = clocks_of(observation, "throttllem")
        self._top = clocks[-1]
        self._fit(observation)
        self._fit_prompt_rate(observation)
        running = max(0, observation.decode_active)
        kv_now = finite(observation.kv_tokens) or 0.0
        self._last_features = (float(running), kv_now)
        if not observation.has_work:
            return clocks[0]  # nothing to predict: no iteration runs, no prompt waits
        slo = finite(observation.tpot_slo_s)
        if self.samples < self.min_samples or slo is None or slo <= 0.0:
            return clocks[-1]
        batch, kv = self.project(observation)
        prefill = self.prefill_clock_mhz(observation)
        floor = 0.0 if prefill is None else prefill
        if batch <= 0.0:
            return next((c for c in clocks if c >= floor - 1e-9), clocks[-1])
        target = self.margin * slo
        for clock in clocks:
            if clock < floor - 1e-9:
                continue
            predicted = self.predict_iteration_s(batch, kv, clock)
            if math.isfinite(predicted) and predicted <= target:
                return clock
        return clocks[-1]
