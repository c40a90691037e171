"""What one control window showed, from two consecutive observations: the engine's
counters and gauges and NVML's readings turned into the tokens, iterations, context, busy
time and energy the identification (:mod:`controllers.online.identification`) fits, and
the counter-based prompt estimate the context falls back on. Pure computation."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpugov.plant.types import ServingObservation


@dataclass(frozen=True, slots=True)
class Window:
    """What one control window showed, derived from two consecutive observations."""

    duration_s: float
    busy_s: float
    prompt_tokens: float
    generated_tokens: float
    iterations: float
    context_tokens: float
    """Mean context (prompt + generated) per running request, tokens."""
    energy_j: float | None
    realized_mhz: float
    requested_mhz: float | None
    temperature_start_c: float
    temperature_end_c: float


def window_between(
    previous: ServingObservation,
    current: ServingObservation,
    prompt_per_request: float | None = None,
    *,
    busy_from_engine: bool = False,
) -> Window | None:
    """The :class:`Window` between two observations, or None when it cannot be used
    (no time passed, counters went backwards (engine restart), the GPU reported no clock
    or no utilisation). With ``busy_from_engine`` (a GPU whose NVML never reports its
    utilisation: MIG mode, some virtual GPUs) a window without it is still used: its busy
    time is the window times the share of its two ends with requests in hand (an engine
    with work runs back to back), unless work came and went between two ends with none in
    hand. A NaN or infinite reading is carried into the window as it is;
    :meth:`OnlineModel.update` skips what it would spoil and counts it.

    The decode iterations are the decode tokens over the mean running batch of the two
    ends; where one end ran nothing and the other ``b``, over ``(b + 1) / 2`` (the mean
    batch of ``b`` requests joining or leaving at times spread over the window).

    The mean context of a running request is the KV tokens per running request, averaged
    over the two ends, in a decode-only window (no prompt tokens prefilled) whose ends
    both show a running batch, a known KV and no prompt backlog: the KV then holds only
    the running requests'. Elsewhere it is ``prompt_per_request`` (an estimate from the
    engine's counters, :class:`PromptEstimate`) plus the tokens generated so far; without
    the estimate, the KV tokens per running request (which also counts the KV of prompts
    still being prefilled, so it overstates the context under long prompts). The
    counter-based mean is far off where prompt lengths vary by orders of magnitude
    (Mooncake), and the time fit's decode part with it."""
    duration = current.time_s - previous.time_s
    if not duration > 1e-6:
        return None
    prompt = current.prompt_tokens_total - previous.prompt_tokens_total
    generated = current.output_tokens_total - previous.output_tokens_total
    if prompt < 0.0 or generated < 0.0:
        return None
    if current.realized_clock_mhz is None:
        return None
    if current.gpu_utilization is not None:
        utilization = float(current.gpu_utilization)
    elif not busy_from_engine:
        return None  # a read that failed this time: the window is not used
    else:
        # No NVML utilisation (MIG mode, some virtual GPUs): an engine with requests in
        # hand runs its iterations back to back, so the ends' work in hand stands in.
        in_hand = int(previous.has_work) + int(current.has_work)
        if in_hand == 0 and (prompt > 0.0 or generated > 0.0):
            return None  # work came and went between two idle ends: its time is unknown
        utilization = 0.5 * in_hand
    # A non-finite reading is kept as NaN: the model skips and counts such a window.
    busy = min(1.0, max(0.0, utilization)) * duration if math.isfinite(utilization) else math.nan
    # A request's first token comes from its prefill, not from a decode iteration: the
    # decode tokens are the generated ones less one per request that left the queue.
    started = (current.arrived_requests - current.waiting_requests) - (
        previous.arrived_requests - previous.waiting_requests
    )
    generated = max(0.0, generated - max(0, started))
    batch = 0.5 * (previous.decode_active + current.decode_active)
    if min(previous.decode_active, current.decode_active) <= 0 < batch:
        # The batch started (or drained) in the window: its ``b`` requests joined (or
        # left) at times spread over it, so the iterations ran at a mean batch of
        # ``(b + 1) / 2``, not ``b / 2`` (which would count twice as many iterations as
        # tokens where the batch went from 0 to 1).
        batch = 0.5 * (max(previous.decode_active, current.decode_active) + 1.0)
    iterations = generated / batch if batch >= 0.5 else (1.0 if generated > 0 else 0.0)
    running = max(current.decode_active, 1)
    if prompt <= 0.0 and all(
        end.decode_active > 0
        and math.isfinite(end.kv_tokens)
        and end.kv_tokens > 0.0
        and end.prefill_remaining_tokens <= 0.0
        for end in (previous, current)
    ):
        context = 0.5 * (
            previous.kv_tokens / previous.decode_active + current.kv_tokens / current.decode_active
        )
    elif prompt_per_request is not None:
        context = prompt_per_request + max(0.0, current.generated_decode_tokens) / running
    else:
        context = max(0.0, current.kv_tokens) / running
    energy = None
    if current.energy_j is not None and previous.energy_j is not None:
        delta = current.energy_j - previous.energy_j
        energy = delta if delta >= 0.0 else None
    return Window(
        duration_s=duration,
        busy_s=busy,
        prompt_tokens=prompt,
        generated_tokens=generated,
        iterations=iterations,
        context_tokens=context,
        energy_j=energy,
        realized_mhz=float(current.realized_clock_mhz),
        requested_mhz=previous.requested_clock_mhz
        if current.requested_clock_mhz is None
        else current.requested_clock_mhz,
        temperature_start_c=previous.temperature_c,
        temperature_end_c=current.temperature_c,
    )


@dataclass
class PromptEstimate:
    """Mean prompt tokens per request, from the engine's counters: prompt tokens
    prefilled over requests that left the queue, exponentially weighted over
    ``memory_windows`` windows (so a changing prompt mix is followed)."""

    memory_windows: float = 60.0
    _tokens: float = 0.0
    _requests: float = 0.0
    skipped_nonfinite: int = 0
    """Windows ignored because a counter was NaN or infinite."""

    def update(self, previous: ServingObservation, current: ServingObservation) -> None:
        """Fold in one window (ignored when a counter went backwards or is not finite)."""
        tokens = current.prompt_tokens_total - previous.prompt_tokens_total
        started = (current.arrived_requests - current.waiting_requests) - (
            previous.arrived_requests - previous.waiting_requests
        )
        if not (math.isfinite(tokens) and math.isfinite(started)):
            self.skipped_nonfinite += 1
            return
        if tokens < 0.0 or started < 0:
            return
        decay = math.exp(-1.0 / self.memory_windows)
        self._tokens = decay * self._tokens + tokens
        self._requests = decay * self._requests + started

    @property
    def value(self) -> float | None:
        """The estimate, or None before a few requests were seen."""
        return self._tokens / self._requests if self._requests >= 3.0 else None


__all__ = ["PromptEstimate", "Window", "window_between"]
