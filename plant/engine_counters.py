"""What the simulated engine counts and reports but never reads back: vLLM's step histogram
and token counters, latency sums over the observation window, and SLO attainment counts."""

from __future__ import annotations

import bisect

from gpugov.plant.types import ttft_slo_at

ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""Upper bounds of the tokens-per-step histogram, vLLM V1's layout (1, 8, then its
default CUDA-graph capture sizes; ``vllm:iteration_tokens_total``)."""


class EngineCounters:
    """The counters of one :class:`~gpugov.plant.simulator.PlantSimulation`, each updated
    when its event happens.

    Since the start: engine steps per :data:`ITERATION_TOKEN_BUCKETS` bucket and the tokens
    they ran, prompt and output tokens, preemptions, and first tokens and finished requests
    counted against the SLOs (what an engine's histograms give). Since the previous
    :meth:`take_window`: the TTFT and inter-token latency sums behind an observation's
    recent means.

    Args:
        ttft_slo_s: the flat TTFT SLO.
        ttft_slo_per_prompt_token_s: the TTFT SLO's allowance per prompt token.
        tpot_slo_s: the TPOT SLO.
    """

    def __init__(
        self, ttft_slo_s: float, ttft_slo_per_prompt_token_s: float, tpot_slo_s: float
    ) -> None:
        self.ttft_slo_s = float(ttft_slo_s)
        self.ttft_slo_per_prompt_token_s = float(ttft_slo_per_prompt_token_s)
        self.tpot_slo_s = float(tpot_slo_s)
        # Engine steps and the tokens each ran (vLLM's ``vllm:iteration_tokens_total``).
        self.iteration_counts = [0] * (len(ITERATION_TOKEN_BUCKETS) + 1)
        self.iteration_tokens = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.preemptions = 0
        # SLO attainment counters since the start.
        self.ttft_total = 0
        self.ttft_within = 0
        self.tpot_total = 0
        self.tpot_within = 0
        # Windowed statistics since the previous take_window().
        self._ttft_sum = 0.0
        self._ttft_count = 0
        self._ttft_prompt_sum = 0.0
        self._itl_sum = 0.0
        self._itl_count = 0

    def count_steps(self, tokens: int, steps: int = 1) -> None:
        """``steps`` engine steps ran ``tokens`` tokens each (prefill chunk tokens plus one
        per decoding request)."""
        self.iteration_counts[bisect.bisect_left(ITERATION_TOKEN_BUCKETS, tokens)] += steps
        self.iteration_tokens += tokens * steps

    def prefilled(self, tokens: int) -> None:
        """A step ran ``tokens`` prompt tokens."""
        self.prompt_tokens += tokens

    def prefill_finished(self) -> None:
        """A request's prefill ended with its next token."""
        self.output_tokens += 1

    def decoded(self, seconds: float, batch: int, steps: int = 1) -> None:
        """``steps`` decode steps of ``batch`` requests took ``seconds`` together: one token
        per request and step, each after ``seconds / steps`` on average."""
        self.output_tokens += steps * batch
        self._itl_sum += seconds * batch
        self._itl_count += steps * batch

    def preempted(self) -> None:
        """A running request was preempted (to be recomputed)."""
        self.preemptions += 1

    def first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        """A request's first token came ``ttft_s`` after its arrival; counted against the
        TTFT SLO at its prompt length."""
        self._ttft_sum += ttft_s
        self._ttft_count += 1
        self._ttft_prompt_sum += prompt_tokens
        self.ttft_total += 1
        slo = ttft_slo_at(self.ttft_slo_s, self.ttft_slo_per_prompt_token_s, prompt_tokens)
        self.ttft_within += ttft_s <= slo + 1e-12

    def finished(self, tpot_s: float) -> None:
        """A request of more than one token finished at ``tpot_s`` per output token after
        its first; counted against the TPOT SLO."""
        self.tpot_total += 1
        self.tpot_within += tpot_s <= self.tpot_slo_s + 1e-12

    def take_window(self) -> tuple[float | None, float | None, float | None]:
        """The window's mean TTFT, mean inter-token latency and mean prompt of the first
        tokens (``None`` where nothing came), and a new window from now."""
        ttft = self._ttft_count
        means = (
            self._ttft_sum / ttft if ttft else None,
            self._itl_sum / self._itl_count if self._itl_count else None,
            self._ttft_prompt_sum / ttft if ttft else None,
        )
        self._ttft_sum = 0.0
        self._ttft_count = 0
        self._ttft_prompt_sum = 0.0
        self._itl_sum = 0.0
        self._itl_count = 0
        return means
