"""What a vLLM V1 engine publishes about the simulated plant's requests: its histogram
bounds, a cumulative histogram, and the counters vLLM keeps, built from the plant.

The simulated node's engine (:class:`~daemon.simulated.SimulatedSource`) publishes these
in its ``vllm`` view, so a simulated run sees what a vLLM node sees (no prompt backlog,
a prompt being prefilled counted as running, latencies as histograms), and the emulator
renders the same bounds on its ``/metrics`` page.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpugov.daemon.attainment import Buckets
from gpugov.daemon.engines import EngineSample, HistogramTotals
from gpugov.plant import PlantSimulation
from gpugov.plant.types import ServingObservation

# vLLM V1's histogram buckets (vllm/v1/metrics/loggers.py), seconds.
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
"""Inter-token latency and per-request time per output token share these bounds."""
E2E_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
LENGTH_BUCKETS = tuple(float(base * 10**power) for power in range(6) for base in (1, 2, 5))
"""vLLM's 1-2-5 bounds of its per-request token histograms (``vllm:request_prompt_tokens``,
``vllm:request_generation_tokens``), up to 500,000 tokens."""


class Histogram:
    """A cumulative Prometheus histogram: bucket counts, sum and count."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times."""
        index = int(np.searchsorted(self.buckets, value, side="left"))
        self.counts[index] += times
        self.sum += value * times
        self.count += times

    @classmethod
    def of(cls, buckets: tuple[float, ...], counts: Sequence[int], total: float) -> Histogram:
        """A histogram of per-bucket ``counts`` (the last above every bound) summing to
        ``total``, kept elsewhere (the plant's engine-step counts)."""
        histogram = cls(buckets)
        histogram.counts = list(counts)
        histogram.count = sum(histogram.counts)
        histogram.sum = float(total)
        return histogram

    def cumulative(self) -> list[int]:
        """Counts per ``le`` bound, cumulative, the last one for ``+Inf``."""
        return [int(c) for c in np.cumsum(self.counts)]

    def buckets_le(self) -> Buckets:
        """``(le, cumulative count)`` pairs ending with ``+Inf``, as the page parser
        returns them."""
        bounds = (*self.buckets, float("inf"))
        return tuple((float(b), float(c)) for b, c in zip(bounds, self.cumulative(), strict=True))

    def totals(self) -> HistogramTotals:
        """The ``_sum`` and ``_count`` pair."""
        return HistogramTotals(sum_s=self.sum, count=float(self.count))


class VllmCounters:
    """vLLM V1's cumulative request counters for one :class:`PlantSimulation`, brought up
    to date each tick from the plant's first-token and finish times.

    As vLLM V1 counts them: a request's TTFT and its prompt tokens when its first token
    is made; its time per output token, and its prompt and output lengths, when it
    finishes; inter-token latencies as the tokens are made (here at the window's mean).
    A request prefilled on another engine (a disaggregated decode pool) counts its
    prompt tokens as ``external_kv_transfer`` too, and its TTFT at zero: the decode
    instance's own first-token latency is not modelled, and a decode domain is not
    judged on TTFT.
    """

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)
        self.tpot = Histogram(ITL_BUCKETS_S)
        """Per finished request (``vllm:request_time_per_output_token_seconds``)."""
        self.prompt_lengths = Histogram(LENGTH_BUCKETS)
        self.output_lengths = Histogram(LENGTH_BUCKETS)
        self.prompt_tokens = 0.0
        """Prompt tokens of the requests that have their first token."""
        self.external_prompt_tokens = 0.0
        """Those of them whose KV cache another engine computed."""
        self._arrived = 0
        self._before_first: list[int] = []
        self._before_finish: list[int] = []
        self._output_tokens = 0.0

    def update(self, simulation: PlantSimulation, observation: ServingObservation) -> None:
        """Count what happened up to ``observation`` (this tick's, taken from
        ``simulation``)."""
        arrived = observation.arrived_requests
        if arrived > self._arrived:
            self._before_first.extend(range(self._arrived, arrived))
            self._before_finish.extend(range(self._arrived, arrived))
            self._arrived = arrived
        first, finish = simulation.request_times()
        requests = simulation.requests
        new_first = 0
        waiting = []
        for index in self._before_first:
            made = first[index]
            if made is None:
                waiting.append(index)
                continue
            request = requests[index]
            self.ttft.observe(max(0.0, made - request.arrival_time_s))
            self.prompt_tokens += request.prompt_tokens
            if simulation.prefilled_elsewhere(index):
                self.external_prompt_tokens += request.prompt_tokens
            new_first += 1
        self._before_first = waiting
        running = []
        for index in self._before_finish:
            ended = finish[index]
            if ended is None:
                running.append(index)
                continue
            made = first[index]
            output = simulation.generated_tokens(index)
            if output > 1 and made is not None:
                self.tpot.observe((ended - made) / (output - 1))
            self.prompt_lengths.observe(requests[index].prompt_tokens)
            self.output_lengths.observe(output)
        self._before_finish = running
        tokens = observation.output_tokens_total - self._output_tokens - new_first
        self._output_tokens = observation.output_tokens_total
        if tokens >= 1 and observation.tpot_recent_s is not None:
            self.itl.observe(observation.tpot_recent_s, int(round(tokens)))

    def sample(self, simulation: PlantSimulation, observation: ServingObservation) -> EngineSample:
        """What vLLM's ``/metrics`` page gives the page parser now (nothing it does not
        publish: no prompt backlog, no arrival counter, no SLO counts)."""
        prefilling = simulation.prefilling_requests
        capacity = observation.kv_capacity_tokens
        usage = observation.kv_tokens / capacity if capacity else None
        return EngineSample(
            engine="vllm",
            running_requests=observation.decode_active + prefilling,
            waiting_requests=max(0, observation.waiting_requests - prefilling),
            prompt_tokens_total=self.prompt_tokens,
            prompt_tokens_external_total=self.external_prompt_tokens or None,
            generation_tokens_total=observation.output_tokens_total,
            finished_requests_total=float(self.output_lengths.count),
            preemptions_total=float(simulation.preemptions),
            ttft=self.ttft.totals(),
            tpot=self.itl.totals(),
            ttft_buckets=self.ttft.buckets_le(),
            tpot_buckets=self.tpot.buckets_le(),
            tpot_buckets_per_request=True,
            tpot_buckets_sum_s=self.tpot.sum,
            kv_usage_ratio=usage,
            kv_capacity_tokens=capacity,
            kv_tokens=None if usage is None or capacity is None else usage * capacity,
            model_name=observation.model_name,
            request_prompt_tokens_buckets=self.prompt_lengths.buckets_le(),
            request_generation_tokens_buckets=self.output_lengths.buckets_le(),
            finished_generation_tokens_total=self.output_lengths.sum,
            iterations_total=float(simulation.iterations),
            iteration_tokens_total=float(simulation.iteration_tokens),
        )
