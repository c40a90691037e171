"""Shared value types of the serving plant: requests, observations, records, protocols.

Names follow the seed (``docs/seed-notes.md`` section 1) so the seed's methods port
unchanged in spirit. Units are in every field name.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class Request:
    """One LLM request as a trace records it.

    ``output_tokens`` is the realised output length. The plant uses it to decide when a
    request finishes; controllers must never read it for a request that has not finished
    (they see only :class:`ServingObservation`).
    """

    request_id: int
    arrival_time_s: float
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if not np.isfinite(self.arrival_time_s) or self.arrival_time_s < 0.0:
            raise ValueError(
                f"request {self.request_id}: arrival_time_s must be finite and >= 0, "
                f"got {self.arrival_time_s!r}"
            )
        if int(self.prompt_tokens) != self.prompt_tokens or self.prompt_tokens < 1:
            raise ValueError(
                f"request {self.request_id}: prompt_tokens must be an integer >= 1, "
                f"got {self.prompt_tokens!r}"
            )
        if int(self.output_tokens) != self.output_tokens or self.output_tokens < 1:
            raise ValueError(
                f"request {self.request_id}: output_tokens must be an integer >= 1, "
                f"got {self.output_tokens!r}"
            )


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Outcome of one request in a simulation.

    ``first_token_time_s`` is ``None`` when the run ended before the first token (TTFT
    censored); ``finish_time_s`` is ``None`` when the run ended before the last token
    (TPOT censored). TPOT is (finish - first token) / (output_tokens - 1); a one-token
    request has no inter-token interval, so its ``tpot_s`` is ``None`` without censoring.
    """

    request_id: int
    arrival_time_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_time_s: float | None
    finish_time_s: float | None
    generated_tokens: int
    preemptions: int = 0
    prefill_energy_j: float = 0.0
    """Energy of this request's prefill chunks (recomputes included), by the plant's
    attribution rule (``plant/attribution.py``)."""
    decode_energy_j: float = 0.0
    """Energy of this request's decode tokens, by the same rule."""

    @property
    def energy_j(self) -> float:
        """This request's attributed energy: prefill plus decode (idle excluded)."""
        return self.prefill_energy_j + self.decode_energy_j

    @property
    def ttft_s(self) -> float | None:
        """Time to first token in seconds, or None when censored."""
        if self.first_token_time_s is None:
            return None
        return self.first_token_time_s - self.arrival_time_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, or None (censored or one token)."""
        if self.first_token_time_s is None or self.finish_time_s is None:
            return None
        if self.output_tokens <= 1:
            return None
        return (self.finish_time_s - self.first_token_time_s) / (self.output_tokens - 1)

    @property
    def ttft_censored(self) -> bool:
        """True when the run ended before this request's first token."""
        return self.first_token_time_s is None

    @property
    def tpot_censored(self) -> bool:
        """True when the run ended before this request's last token."""
        return self.finish_time_s is None


def ttft_slo_at(
    flat_s: float, per_prompt_token_s: float | None, prompt_tokens: float | None
) -> float:
    """The TTFT SLO of a request (or a window's mean) of ``prompt_tokens`` prompt tokens:
    ``flat_s`` plus ``per_prompt_token_s`` per prompt token, ``flat_s`` where either is
    unknown or the length is not finite."""
    if per_prompt_token_s is None or prompt_tokens is None or not math.isfinite(prompt_tokens):
        return float(flat_s)
    return float(flat_s) + per_prompt_token_s * max(0.0, float(prompt_tokens))


@dataclass(frozen=True, slots=True)
class ServingObservation:
    """What a clock controller sees at a control instant: only what a real node can know.

    The first block holds the seed's fields. The rest are what NVML and an engine's
    ``/metrics`` page expose on a real node (see ``daemon/``); fields a source cannot
    provide are ``None``. No field reveals future arrivals or an unfinished request's
    output length.

    ``generated_decode_tokens`` counts tokens generated so far by the requests that are
    decoding now (the seed's ``estimate_decode_remaining_tokens`` subtracts it from
    ``decode_active * mean_output_tokens``); ``output_tokens_total`` is the engine's
    cumulative generation counter.
    """

    time_s: float
    step_index: int
    arrived_requests: int
    prefill_remaining_tokens: float
    decode_active: int
    generated_decode_tokens: float
    temperature_c: float
    # Queue and progress (engine metrics on a real node).
    waiting_requests: int = 0
    completed_requests: int = 0
    output_tokens_total: float = 0.0
    prompt_tokens_total: float = 0.0
    kv_tokens: float = 0.0
    kv_capacity_tokens: float | None = None
    # GPU state (NVML on a real node).
    power_w: float | None = None
    energy_j: float | None = None
    requested_clock_mhz: float | None = None
    realized_clock_mhz: float | None = None
    gpu_utilization: float | None = None
    power_limit_w: float | None = None
    thermal_limit_c: float | None = None
    supported_clocks_mhz: tuple[float, ...] = ()
    clock_event_reasons: int | None = None
    """NVML clock-event-reason bitmask (why the realised clock is below the request)."""
    model_name: str | None = None
    """The engine's ``model_name`` label (a change means another model is served)."""
    # Latency over the last control window (engine histograms on a real node).
    ttft_recent_s: float | None = None
    tpot_recent_s: float | None = None
    ttft_slo_s: float | None = None
    """The flat TTFT SLO (the whole SLO where there is no per-prompt allowance)."""
    tpot_slo_s: float | None = None
    ttft_slo_per_prompt_token_s: float | None = None
    """TTFT SLO allowance per prompt token: a request of ``p`` prompt tokens meets its TTFT
    SLO when ``TTFT <= ttft_slo_s + ttft_slo_per_prompt_token_s * p`` (None: flat)."""
    ttft_recent_prompt_tokens: float | None = None
    """Mean prompt of the requests whose first token came in the window (the allowance
    that applies to ``ttft_recent_s``; None when unknown)."""
    # SLO attainment counters, cumulative since the source started (None: not measured).
    ttft_count_total: float | None = None
    """First tokens (one per request)."""
    ttft_within_slo_total: float | None = None
    """First tokens whose TTFT met the request's TTFT SLO (estimated from the engine's
    histogram on a node, exact in the plant)."""
    tpot_count_total: float | None = None
    """Finished requests with more than one output token (per inter-token interval where
    the engine has only an inter-token-latency histogram)."""
    tpot_within_slo_total: float | None = None
    """Those of ``tpot_count_total`` whose TPOT met the TPOT SLO."""
    role: str = "colocated"
    """The serving role of the domain: "colocated" (both phases), or "prefill" / "decode"
    for a pool of disaggregated serving (``plant/disaggregated.py``)."""
    prefill_tail_tokens: float | None = None
    """Where ``prefill_remaining_tokens`` is an estimate (a node sees no prompt's length
    before its first token), the backlog with each prompt in its prefill at the upper
    quantile of its rest (the one only the SLO target's share of misses exceeds) rather
    than its mean; None where the backlog is exact."""
    engines: int = 1
    """Data-parallel engines the observation pools (a pool of disaggregated serving with
    several engines, a data-parallel domain), each serving its own requests on its own
    GPUs: the counts, tokens, power and energy are their sums, the utilisation their
    mean, the clock the slowest and the temperature the hottest."""
    busiest_prefill_tokens: float | None = None
    """The largest prompt backlog any one of the ``engines`` holds, within
    ``prefill_remaining_tokens`` (a long prompt is prefilled on one engine alone); None
    where unknown or where there is one engine."""

    def __post_init__(self) -> None:
        if not np.isfinite(self.time_s):
            raise ValueError(f"time_s must be finite, got {self.time_s!r}")
        for name in ("arrived_requests", "decode_active", "waiting_requests"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if not self.engines >= 1:
            raise ValueError(f"engines must be >= 1, got {self.engines!r}")
        if self.busiest_prefill_tokens is not None and not self.busiest_prefill_tokens >= 0:
            raise ValueError(
                f"busiest_prefill_tokens must be >= 0, got {self.busiest_prefill_tokens!r}"
            )
        if self.prefill_tail_tokens is not None and not self.prefill_tail_tokens >= 0:
            raise ValueError(f"prefill_tail_tokens must be >= 0, got {self.prefill_tail_tokens!r}")
        if self.prefill_remaining_tokens < 0:
            raise ValueError(
                f"prefill_remaining_tokens must be >= 0, got {self.prefill_remaining_tokens!r}"
            )

    def ttft_slo_for(self, prompt_tokens: float | None) -> float | None:
        """The TTFT SLO of a request of ``prompt_tokens`` prompt tokens: the flat SLO plus
        the per-prompt allowance (the flat SLO where either is unknown); None without an
        SLO."""
        if self.ttft_slo_s is None:
            return None
        return ttft_slo_at(self.ttft_slo_s, self.ttft_slo_per_prompt_token_s, prompt_tokens)

    @property
    def ttft_recent_slo_s(self) -> float | None:
        """The TTFT SLO that applies to ``ttft_recent_s``: at the window's mean prompt."""
        return self.ttft_slo_for(self.ttft_recent_prompt_tokens)

    @property
    def has_work(self) -> bool:
        """Whether the engine has requests in hand: running, waiting or being prefilled (a
        backlog not known, NaN in a recording's null, counts as work)."""
        return (
            self.decode_active > 0
            or self.waiting_requests > 0
            or not self.prefill_remaining_tokens <= 0.0
        )

    @property
    def minimum_clock_mhz(self) -> float | None:
        """Lowest supported clock, when the source reported the supported set."""
        return self.supported_clocks_mhz[0] if self.supported_clocks_mhz else None

    @property
    def maximum_clock_mhz(self) -> float | None:
        """Highest supported clock, when the source reported the supported set."""
        return self.supported_clocks_mhz[-1] if self.supported_clocks_mhz else None


_OBSERVATION_FIELDS = tuple(f.name for f in fields(ServingObservation))
_observation_values = operator.attrgetter(*_OBSERVATION_FIELDS)
_set = object.__setattr__


def replace_observation(
    observation: ServingObservation, changes: dict[str, Any]
) -> ServingObservation:
    """``dataclasses.replace(observation, **changes)`` without running the validation again
    (half the cost; for a controller's per-call views): only for ``changes`` the caller
    knows valid, since none of them is checked."""
    new = object.__new__(ServingObservation)
    for name, value in zip(_OBSERVATION_FIELDS, _observation_values(observation), strict=True):
        _set(new, name, value)
    for name, value in changes.items():
        _set(new, name, value)
    return new


@dataclass(frozen=True)
class MPCDiagnostics:
    """Solve statistics an MPC controller reports (the seed's fields)."""

    solve_times_s: NDArray[np.float64]
    successful_solves: int
    fallback_count: int
    control_period_s: float
    horizon_steps: int
    solve_time_limit_s: float
    fallback_reasons: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class ClockController(Protocol):
    """Maps an observation to a requested SM clock in MHz.

    Optional introspection attributes the seed sets: ``__name__``, ``plans_by_step``,
    ``plan_start_times_by_step``, ``plan_dt_s`` and ``diagnostics()``.
    """

    def __call__(self, observation: ServingObservation) -> float: ...


@runtime_checkable
class PowerCapping(Protocol):
    """A controller that also sets the GPU's power cap: after each decision the loop
    applies ``requested_power_cap_w`` (watts for the whole domain; None: the board limit)."""

    @property
    def requested_power_cap_w(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """The engine state a scheduler sees at the start of an iteration.

    ``next_prompt_tokens``: the KV tokens the first waiting request needs to be admitted
    (its prompt, plus what it generated before a preemption; 0 when none waits). The plant
    admits it when the batch has a free slot and ``kv_tokens + next_prompt_tokens`` (plus a
    slot per request the iteration decodes) fits ``kv_capacity_tokens``."""

    time_s: float
    waiting_requests: int
    prefilling_requests: int
    decode_active: int
    prefill_remaining_tokens: int
    oldest_waiting_age_s: float
    kv_tokens: int
    kv_capacity_tokens: int
    max_batch_size: int
    next_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class IterationPlan:
    """What one engine iteration runs.

    ``decode``: run one decode token for every running request. ``prefill_token_budget``:
    prompt tokens the iteration may prefill (chunks of partially prefilled requests first,
    then new admissions in arrival order). ``count_decode_in_budget``: decode tokens use
    the same budget, as vLLM's ``max_num_batched_tokens`` does. ``idle_s``: when nothing
    runs, how long the engine waits before asking again (a scheduler may idle on purpose).
    """

    decode: bool
    prefill_token_budget: int
    count_decode_in_budget: bool = False
    idle_s: float = 0.0


class Scheduler(Protocol):
    """The serving engine's batching rule inside the plant."""

    def __call__(self, view: SchedulerView) -> IterationPlan: ...
