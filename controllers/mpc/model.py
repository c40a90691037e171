"""The MPC's model: the fluid roll-out and latency proxies it predicts with, and the
horizon problem (:class:`MPCProblem`) whose cost every solver minimises."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import PerformanceProfile

FloatArray = NDArray[np.float64]

DEFAULT_EXPECTED_PROMPT_TOKENS = 1024.0
"""Declared prompt-length forecast when none is given (tokens; near the Azure
conversation trace's mean of about 1,155 and median of 1,020)."""
DEFAULT_EXPECTED_OUTPUT_TOKENS = 128.0
"""Declared output-length forecast when none is given (the seed's open-loop default)."""
DEFAULT_ARRIVAL_WINDOW_S = 30.0
FALLBACK_REASONS = ("solver_failed", "overrun", "exception", "budget")
DEFAULT_SOLVE_BUDGET_EVALUATIONS = 5_000
"""Cost evaluations one solve may use in virtual time (``solve_budget_evaluations``).

SLSQP's own limit (50 iterations of about horizon + 2 evaluations each) keeps it below
this at the default horizons: on the bundled slice the most a solve used was 648. 5,000
evaluations are about what the 0.8 s wall-clock limit allows on the 2-core development
machine (130-190 us per evaluation, measured under load), so the budget cuts the solves
the limit would cut on a node, but the same way on every machine."""


class _BudgetExhausted(Exception):
    """A solve used up its deterministic evaluation budget (virtual time)."""


# ------------------------------------------------------------------- the model
def mpc_latency_proxies(
    prefill_tokens: float,
    active_decode_requests: float,
    clock_mhz: float,
    profile: PerformanceProfile,
) -> tuple[float, float]:
    """Separate TTFT and TPOT delay proxies (seconds) for the reduced MPC model.

    TTFT proxy: queued prefill tokens over the prefill rate; TPOT proxy: active decodes
    over the aggregate decode rate (one token for each).
    """
    ttft_proxy = max(0.0, prefill_tokens) / max(profile.rate("prefill", clock_mhz), 1e-12)
    tpot_proxy = max(0.0, active_decode_requests) / max(profile.rate("decode", clock_mhz), 1e-12)
    return float(ttft_proxy), float(tpot_proxy)


def estimate_decode_remaining_tokens(
    active_decode_requests: int,
    generated_tokens_so_far: float,
    mean_output_tokens: float,
) -> float:
    """Unfinished decode work, ``max(0, active * mean_output - generated)``, without
    observing eventual output lengths."""
    return float(max(0.0, active_decode_requests * mean_output_tokens - generated_tokens_so_far))


@dataclass(frozen=True, slots=True)
class MPCRollout:
    """Predicted trajectories; state arrays have one more entry than the horizon."""

    prefill_tokens: FloatArray
    decode_tokens: FloatArray
    active_decode: FloatArray
    temperature_c: FloatArray
    normalized_power: FloatArray
    ttft_proxy_s: FloatArray
    tpot_proxy_s: FloatArray


def mpc_fluid_rollout(
    clock_mhz: FloatArray,
    *,
    initial_prefill_tokens: float,
    initial_decode_tokens: float,
    initial_active_decode: float,
    prompt_arrivals: FloatArray,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
    plant: ServingPlant,
    control_period_s: float,
    initial_temperature_c: float,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """Predict separate phase workloads under the alternating scheduler surrogate.

    Per period: with both prefill and decode work the GPU splits its time 50/50,
    otherwise it gives all of it to the phase with work. Completed prefill tokens become
    requests (``/ mean_prompt_tokens``) that each bring ``mean_output_tokens`` of decode
    work; power is the share-weighted phase power; temperature follows the RC model.

    Returns:
        ``(prefill, decode, active, temperature, normalized_power, ttft_proxy,
        tpot_proxy)`` as in the seed.
    """
    clock_mhz = np.asarray(clock_mhz, dtype=float)
    steps = clock_mhz.size
    profile = plant.profile
    # Rates and powers depend on the clock only; vectorised np.interp gives exactly the
    # values the seed's per-step profile.rate()/power() calls gave, much faster.
    grid = profile.clock_mhz
    # Python floats in the loop: this runs inside SLSQP's finite differences.
    prefill_rate = np.interp(clock_mhz, grid, profile.prefill_tokens_per_s).tolist()
    decode_rate = np.interp(clock_mhz, grid, profile.decode_tokens_per_s).tolist()
    prefill_power = np.interp(clock_mhz, grid, profile.prefill_power_w).tolist()
    decode_power = np.interp(clock_mhz, grid, profile.decode_power_w).tolist()
    idle_power = np.interp(clock_mhz, grid, profile.idle_power_w).tolist()
    arrivals = np.asarray(prompt_arrivals, dtype=float).tolist()

    prefill = [max(0.0, float(initial_prefill_tokens))]
    decode = [max(0.0, float(initial_decode_tokens))]
    active = [max(0.0, float(initial_active_decode))]
    temperature = [float(initial_temperature_c)]
    normalized_power: list[float] = []
    ttft_proxy: list[float] = []
    tpot_proxy: list[float] = []
    maximum_power = float(max(profile.prefill_power_w[-1], profile.decode_power_w[-1]))
    decay = math.exp(-control_period_s / plant.thermal_time_constant_s)
    ambient = float(plant.ambient_temperature_c)
    resistance = float(plant.thermal_resistance_c_per_w)
    prompt_divisor = max(mean_prompt_tokens, 1.0)
    output_divisor = max(mean_output_tokens, 1.0)
    for index in range(steps):
        available_prefill = prefill[index] + arrivals[index]
        has_prefill = available_prefill > 1e-12
        has_decode = decode[index] > 1e-12
        if has_prefill and has_decode:
            prefill_share = decode_share = 0.5
        elif has_prefill:
            prefill_share, decode_share = 1.0, 0.0
        elif has_decode:
            prefill_share, decode_share = 0.0, 1.0
        else:
            prefill_share = decode_share = 0.0
        served_prefill = min(
            available_prefill, prefill_rate[index] * control_period_s * prefill_share
        )
        completed_prefill = served_prefill / prompt_divisor
        prefill.append(max(0.0, available_prefill - served_prefill))
        available_decode = decode[index] + completed_prefill * mean_output_tokens
        served_decode = min(available_decode, decode_rate[index] * control_period_s * decode_share)
        completed_decode = served_decode / output_divisor
        decode.append(max(0.0, available_decode - served_decode))
        active.append(max(0.0, active[index] + completed_prefill - completed_decode))
        ttft_proxy.append(prefill[index + 1] / max(prefill_rate[index], 1e-12))
        tpot_proxy.append(active[index + 1] / max(decode_rate[index], 1e-12))
        if prefill_share > 0.0 and decode_share > 0.0:
            power = 0.5 * (prefill_power[index] + decode_power[index])
        elif prefill_share > 0.0:
            power = prefill_power[index]
        elif decode_share > 0.0:
            power = decode_power[index]
        else:
            power = idle_power[index]
        normalized_power.append(power / maximum_power)
        equilibrium = ambient + resistance * power
        temperature.append(equilibrium + (temperature[index] - equilibrium) * decay)
    return (
        np.asarray(prefill),
        np.asarray(decode),
        np.asarray(active),
        np.asarray(temperature),
        np.asarray(normalized_power),
        np.asarray(ttft_proxy),
        np.asarray(tpot_proxy),
    )


_mpc_fluid_rollout = mpc_fluid_rollout


LATENCY_MODELS = ("seed", "iteration")
CHUNK_TOKENS = 512.0  # the plant's chunked-prefill token budget
DEFAULT_WAIT_QUANTILE = 0.99
"""The share of random arrivals whose wait for a batch place the TTFT proxy covers where
no SLO target says otherwise (:meth:`MPCProblem.place_wait_s`): a p99, the default
target's."""
PLACE_LOAD_CEILING = 0.99
"""The highest load per batch place :meth:`MPCProblem.place_wait_s` prices a random
arrival's wait at (100 mean residences at one place): past it the engine is overloaded,
which the fluid queue itself shows."""


@dataclass(frozen=True, slots=True)
class MPCWeights:
    """Cost weights (the seed's constants are the defaults)."""

    power: float = 1.0
    ttft: float = 20.0
    tpot: float = 10.0
    clock_change: float = 0.05
    constraint: float = 1_000.0
    terminal_backlog: float = 20.0

    def __post_init__(self) -> None:
        for name in ("power", "ttft", "tpot", "clock_change", "constraint", "terminal_backlog"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0.0:
                raise ValueError(f"MPCWeights.{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class MPCProblem:
    """One horizon's optimisation problem: the initial state, forecasts and weights."""

    plant: ServingPlant
    control_period_s: float
    initial_prefill_tokens: float
    initial_decode_tokens: float
    initial_active_decode: float
    initial_temperature_c: float
    prompt_arrivals: FloatArray
    mean_prompt_tokens: float
    mean_output_tokens: float
    previous_clock_mhz: float
    weights: MPCWeights = field(default_factory=MPCWeights)
    latency_model: str = "seed"
    slo_margin: float = 1.0
    ttft_prompt_tokens: float | None = None
    ttft_excess_cap: float | None = None
    ttft_slo_per_prompt_token_s: float = 0.0
    """Per-prompt TTFT allowance (s per prompt token): the iteration model's TTFT proxy
    is judged per prompt (:meth:`ttft_proxy`); 0 keeps the flat SLO."""
    ttft_own_prompt_tokens: float | None = None
    """The new request's own prompt within ``ttft_prompt`` (the rest is a burst ahead of
    it, :class:`controllers.adaptation.BurstHedge`); default all of it."""
    terminal_share: float = 1.0
    """The share of the backlog left at the horizon's end that the seed's quadratic
    terminal penalty charges (:meth:`terminal_cost`); the rest of the decode backlog is
    priced at its least energy. A caller whose guard drains any prompt backlog charges
    less than all of it."""
    terminal_queued_replies: bool = False
    """The terminal backlog counts the replies of the prompts still queued (the mean
    reply per mean prompt), not only once they are prefilled: without them a backlog
    held in the queue is priced below the same one half served, so under an overload
    the lowest clock, which prefills least, leaves the cheapest terminal state. False:
    the seed's terminal penalty."""
    dwell_periods: float = 0.0
    """Periods the safety chain holds a clock before a lower one applies (its dwell over
    the control period, ``daemon.safety.MinimumDwell``): a plan is priced as the chain
    applies it (:meth:`applied`). 0: as asked."""
    held_clock_mhz: float | None = None
    """The clock locked at the first decision (None: unknown, nothing held)."""
    held_periods: float = math.inf
    """Periods the held clock has been locked by the first decision."""
    wait_quantile: float = DEFAULT_WAIT_QUANTILE
    """The share of random arrivals whose wait for a batch place the TTFT proxy covers
    (:meth:`place_wait_s`; the controller's SLO target where it has one)."""
    kv_capacity_tokens: float = math.inf
    """The engine's KV cache in tokens, which bounds the requests it holds at once
    (:attr:`batch_places`); inf (unknown, the seed's): its batch size alone bounds them."""

    @property
    def batch_places(self) -> float:
        """The requests the engine holds at once: its batch size
        (:attr:`ServingPlant.max_batch_size`), or fewer where its KV cache holds fewer
        requests of the mean prompt and reply (a request keeps both to its end; the
        engine preempts or admits none past it); at least one."""
        per_request = max(self.mean_prompt_tokens + self.mean_output_tokens, 1.0)
        return max(
            1.0, min(float(self.plant.max_batch_size), self.kv_capacity_tokens / per_request)
        )

    @property
    def ttft_own_prompt(self) -> float:
        """The new request's own prompt, at most the charged prompt."""
        own = (
            self.ttft_prompt if self.ttft_own_prompt_tokens is None else self.ttft_own_prompt_tokens
        )
        return min(own, self.ttft_prompt)

    @property
    def ttft_excess_cap_s(self) -> float:
        """TTFT excess (over the target) beyond which the penalty stops growing:
        ``ttft_excess_cap`` TTFT SLOs, or no cap (the seed's) when None. A request that
        late has missed its SLO whatever the clock, so a capped penalty stops spending
        energy to make it less late."""
        if self.ttft_excess_cap is None:
            return math.inf
        return self.ttft_excess_cap * self.plant.profile.ttft_slo_s

    @property
    def ttft_prompt(self) -> float:
        """Prompt length the iteration model's TTFT proxy charges a new request
        (a declared tail length, default the mean)."""
        if self.ttft_prompt_tokens is None:
            return self.mean_prompt_tokens
        return self.ttft_prompt_tokens

    @property
    def ttft_target_s(self) -> float:
        """TTFT above which the cost is penalised: ``slo_margin`` times the SLO."""
        return self.slo_margin * self.plant.profile.ttft_slo_s

    @property
    def tpot_weight(self) -> float:
        """The TPOT term's weight: none where the replies are of one token (a mean output of
        at most one: classification, scoring), which have no second token and so no TPOT;
        the fluid model still passes their one token through its decode batch, whose
        mixed iterations would otherwise be priced against a TPOT SLO no request is
        judged on, and hold the clock up for it."""
        return self.weights.tpot if self.mean_output_tokens > 1.0 else 0.0

    @property
    def tpot_target_s(self) -> float:
        """TPOT above which the cost is penalised: ``slo_margin`` times the SLO."""
        return self.slo_margin * self.plant.profile.tpot_slo_s

    def __post_init__(self) -> None:
        if not 0.0 < self.slo_margin <= 1.0:
            raise ValueError(f"slo_margin must lie in (0, 1], got {self.slo_margin!r}")
        if self.ttft_excess_cap is not None and not self.ttft_excess_cap > 0.0:
            raise ValueError(f"ttft_excess_cap must be positive, got {self.ttft_excess_cap!r}")
        if not (
            math.isfinite(self.ttft_slo_per_prompt_token_s)
            and self.ttft_slo_per_prompt_token_s >= 0.0
        ):
            raise ValueError(
                "ttft_slo_per_prompt_token_s must be finite and >= 0, got "
                f"{self.ttft_slo_per_prompt_token_s!r}"
            )
        if not 0.0 <= self.terminal_share <= 1.0:
            raise ValueError(f"terminal_share must lie in [0, 1], got {self.terminal_share!r}")
        if self.latency_model not in LATENCY_MODELS:
            raise ValueError(
                f"latency_model must be one of {LATENCY_MODELS}, got {self.latency_model!r}"
            )
        if not 0.0 < self.wait_quantile < 1.0:
            raise ValueError(f"wait_quantile must lie in (0, 1), got {self.wait_quantile!r}")
        if not (math.isfinite(self.dwell_periods) and self.dwell_periods >= 0.0):
            raise ValueError(f"dwell_periods must be finite and >= 0, got {self.dwell_periods!r}")
        if not self.kv_capacity_tokens > 0.0:
            raise ValueError(
                f"kv_capacity_tokens must be positive, got {self.kv_capacity_tokens!r}"
            )

    def applied(self, clock_mhz: FloatArray) -> FloatArray:
        """The clocks the safety chain applies for each row of ``(M, horizon_steps)``
        asked clocks: a lower clock waits until the one before it has been held
        :attr:`dwell_periods` periods (a raise applies at once and starts a new hold)."""
        sequences = np.atleast_2d(np.asarray(clock_mhz, dtype=float))
        if self.dwell_periods <= 0.0 or self.held_clock_mhz is None:
            return sequences
        out = np.empty_like(sequences)
        held = np.full(sequences.shape[0], float(self.held_clock_mhz))
        since = np.full(sequences.shape[0], float(self.held_periods))
        for index in range(sequences.shape[1]):
            asked = sequences[:, index]
            level = np.where((asked < held) & (since < self.dwell_periods - 1e-9), held, asked)
            since = np.where(level == held, since + 1.0, 1.0)
            held = level
            out[:, index] = level
        return out

    def decode_iteration_s(self, active: FloatArray, decode_rate: FloatArray) -> FloatArray:
        """Decode iteration time (s) for ``active`` requests at each decode rate, by the
        profile's decode latency model (the plant's): ``t_ref * (a + b B/B_ref + c C/C_ref)``
        with context ``C = B * (mean prompt + mean output / 2)``."""
        model = self.plant.profile.decode_latency_model
        reference = float(model.reference_batch_size)
        context = self.mean_prompt_tokens + 0.5 * self.mean_output_tokens
        t_ref = reference / np.maximum(decode_rate, 1e-12)
        return t_ref * (
            model.weight_fraction
            + model.batch_fraction * active / reference
            + model.kv_fraction * active * context / (reference * model.reference_context_tokens)
        )

    def tpot_proxy(
        self,
        active: FloatArray,
        decode_rate: FloatArray,
        served_prefill: FloatArray,
        prefill_rate: FloatArray,
    ) -> FloatArray:
        """TPOT proxy of the ``iteration`` latency model: the larger of a decode iteration's
        time stretched by the share of the period spent on prefill, ``t_dec / (1 - u_p)``,
        and the mixed iteration a short-lived request sees: while prompts are prefilled
        every iteration carries a chunk, ``t_dec + s * chunk / prefill_rate``, where ``s``
        is the prefill stretch's share of a request's decode life (``mean_output_tokens``
        iterations, at most one period: a longer life sees each period's share), at most
        1."""
        busy = served_prefill / np.maximum(prefill_rate * self.control_period_s, 1e-12)
        t_dec = self.decode_iteration_s(active, decode_rate)
        chunk = np.maximum(CHUNK_TOKENS - active, 32.0)
        inverse_rate = 1.0 / np.maximum(prefill_rate, 1e-12)
        # Chunked prefill never stalls the decode batch: an iteration carries at most one
        # chunk, so the stretch is bounded by the mixed iteration's time.
        stretched = np.minimum(t_dec / np.maximum(1.0 - busy, 0.05), t_dec + chunk * inverse_rate)
        prefilling = served_prefill * (t_dec / chunk + inverse_rate)
        life = np.maximum(np.minimum(self.mean_output_tokens * t_dec, self.control_period_s), 1e-9)
        share = np.minimum(1.0, prefilling / life)
        # Tokens come one per iteration: a time share ``share`` of mixed iterations.
        mixed = 1.0 / (
            share / (t_dec + chunk * inverse_rate) + (1.0 - share) / np.maximum(t_dec, 1e-12)
        )
        return np.where(active > 1e-9, np.maximum(stretched, mixed), 0.0)

    def ttft_proxy(
        self,
        prefill: FloatArray,
        active: FloatArray,
        decode_rate: FloatArray,
        prefill_rate: FloatArray,
        arrivals: float = 0.0,
    ) -> FloatArray:
        """TTFT proxy of the ``iteration`` latency model: the queued prompt tokens plus a
        new prompt, at the prefill rate chunked prefill leaves beside the decode batch
        (``chunk`` tokens per iteration of ``t_dec + chunk / prefill_rate``), after the
        new request's wait for a place in the batch (:meth:`place_wait_s`, with the
        period's ``arrivals`` in prompt tokens).

        With a per-prompt allowance ``a`` the new request of ``P`` own prompt tokens meets
        ``flat + a P``, i.e. its TTFT less ``a P`` meets the flat SLO, which the target
        then judges. A shorter new prompt behind the same queue gains less allowance than
        it saves prefill time wherever the clock prefills faster than ``1 / a`` tokens
        per second, so the proxy is the worse of the charged prompt's and a prompt of
        (almost) no tokens' (the queue alone): with no allowance, the first."""
        chunk = np.maximum(CHUNK_TOKENS - active, 32.0)
        iteration = self.decode_iteration_s(active, decode_rate) * (active > 1e-9)
        effective = chunk / (iteration + chunk / np.maximum(prefill_rate, 1e-12))
        proxy = (prefill + self.ttft_prompt) / effective
        allowance = self.ttft_slo_per_prompt_token_s
        if allowance > 0.0:
            own = self.ttft_own_prompt
            proxy = np.maximum(
                proxy - allowance * own, (prefill + self.ttft_prompt - own) / effective
            )
        return proxy + self.place_wait_s(prefill, active, decode_rate, prefill_rate, arrivals)

    def place_wait_s(
        self,
        prefill: FloatArray,
        active: FloatArray,
        decode_rate: FloatArray,
        prefill_rate: FloatArray,
        arrivals: float,
    ) -> FloatArray:
        """A new request's wait for a place in the engine's batch of ``B`` places
        (:attr:`batch_places`: the batch size, or what the KV cache holds), which the
        fluid model's prefill queue, served beside the decode batch, leaves out: the
        larger of

        * the queue in sight: the requests ahead (the active decodes, the queued prompts
          and a burst charged ahead, in mean prompts) beyond ``B - 1`` each finish
          first, one every ``mean_output * t_dec(b) / b`` s at a decode batch ``b`` (the
          active decodes, within 1 and ``B``); and
        * the wait of random arrivals (``arrivals`` prompt tokens a period) for one of
          ``B`` places each held a request's prefill and decode ``R``, at a load ``rho``
          per place of at most :data:`PLACE_LOAD_CEILING`: the :attr:`wait_quantile`
          of the M/M/B approximation (a wait with probability about
          ``rho ** (sqrt(2 (B + 1)) - 1)``, then exponential with mean
          ``R / (B (1 - rho))``), since the SLO is judged per request, not on the mean.

        Both are zero while the batch's places are plenty (with 256, until about 207
        requests are in flight); one place makes the engine a single queue whose waits
        grow as ``1 / (1 - rho)``, where the fluid queue waits only behind its own mean."""
        places = self.batch_places
        prompt = max(self.mean_prompt_tokens, 1.0)
        burst = self.ttft_prompt - self.ttft_own_prompt
        releases = np.maximum(active + (prefill + burst) / prompt + 1.0 - places, 0.0)
        decoding = np.minimum(np.maximum(active, 1.0), places)
        decode_s = self.mean_output_tokens * self.decode_iteration_s(decoding, decode_rate)
        in_sight = releases * (decode_s / decoding)
        residence = prompt / np.maximum(prefill_rate, 1e-12) + decode_s
        load = np.minimum(
            arrivals / (prompt * self.control_period_s) * residence / places, PLACE_LOAD_CEILING
        )
        exponent = math.sqrt(2.0 * (places + 1.0)) - 1.0
        tail = exponent * np.log(np.maximum(load, 1e-300)) - math.log(1.0 - self.wait_quantile)
        random = np.maximum(tail, 0.0) / (places * (1.0 - load)) * residence
        return np.maximum(in_sight, random)

    def place_lost_at_top(self) -> bool:
        """Whether the first period's new request waits for a batch place
        (:meth:`place_wait_s`, from the requests in hand and the period's arrivals) past
        the capped TTFT penalty even at the top clock: the engine's places, not a prompt's
        prefill, are what it lacks, and a lower clock only frees them later. False without
        a cap."""
        cap = self.ttft_excess_cap_s
        if not math.isfinite(cap):
            return False
        profile = self.plant.profile
        wait = self.place_wait_s(
            np.array([max(0.0, self.initial_prefill_tokens)]),
            np.array([max(0.0, self.initial_active_decode)]),
            profile.decode_tokens_per_s[-1:],
            profile.prefill_tokens_per_s[-1:],
            float(self.prompt_arrivals[0]) if self.prompt_arrivals.size else 0.0,
        )
        return bool(wait[0] >= self.ttft_target_s + cap)

    def ttft_lost_at_top(self) -> bool:
        """Whether the top clock leaves the first period's new request at the capped TTFT
        penalty (:attr:`ttft_excess_cap_s` past the target): every clock then leaves it
        there, so the capped cost cannot tell the clocks apart by that request, while its
        real TTFT, and the queue the next ones wait behind, are shortest at the top clock
        (an overload, or a TTFT SLO no clock meets). False without a cap."""
        cap = self.ttft_excess_cap_s
        if not math.isfinite(cap):
            return False
        from gpugov.controllers.mpc.search_kernel import first_ttft_excess_s

        top = self.plant.profile.clock_mhz.size - 1
        return first_ttft_excess_s(self, top) >= cap * (1.0 - 1e-9)

    @property
    def horizon_steps(self) -> int:
        """Number of control periods in the horizon."""
        return int(self.prompt_arrivals.size)

    @property
    def bounds(self) -> list[tuple[float, float]]:
        """Per-step clock bounds ``[f_min, f_max]``."""
        profile = self.plant.profile
        return [(profile.minimum_clock_mhz, profile.maximum_clock_mhz)] * self.horizon_steps

    def rollout(self, clock_mhz: FloatArray) -> MPCRollout:
        """Predicted trajectories under ``clock_mhz``."""
        return MPCRollout(
            *mpc_fluid_rollout(
                np.asarray(clock_mhz, dtype=float),
                initial_prefill_tokens=self.initial_prefill_tokens,
                initial_decode_tokens=self.initial_decode_tokens,
                initial_active_decode=self.initial_active_decode,
                prompt_arrivals=self.prompt_arrivals,
                mean_prompt_tokens=self.mean_prompt_tokens,
                mean_output_tokens=self.mean_output_tokens,
                plant=self.plant,
                control_period_s=self.control_period_s,
                initial_temperature_c=self.initial_temperature_c,
            )
        )

    def cost(self, clock_mhz: FloatArray) -> float:
        """The seed's objective for one clock sequence (MHz, continuous)."""
        sequence = np.asarray(clock_mhz, dtype=float)
        if sequence.shape != (self.horizon_steps,):
            raise ValueError(
                f"clock sequence must have shape ({self.horizon_steps},), got {sequence.shape}"
            )
        if self.latency_model != "seed":
            return float(self.costs(sequence[None, :])[0])
        sequence = self.applied(sequence)[0]
        profile = self.plant.profile
        weights = self.weights
        predicted = self.rollout(sequence)
        minimum = profile.minimum_clock_mhz
        maximum = profile.maximum_clock_mhz
        normalized_frequency = (sequence - minimum) / (maximum - minimum)
        previous_normalized = (self.previous_clock_mhz - minimum) / (maximum - minimum)
        changes = np.diff(np.concatenate([[previous_normalized], normalized_frequency]))
        ttft_excess = np.maximum(0.0, predicted.ttft_proxy_s - self.ttft_target_s)
        ttft_slack = np.minimum(ttft_excess, self.ttft_excess_cap_s) / max(
            profile.ttft_slo_s, 1e-12
        )
        tpot_slack = np.maximum(0.0, predicted.tpot_proxy_s - self.tpot_target_s) / max(
            profile.tpot_slo_s, 1e-12
        )
        maximum_power = self.maximum_power_w
        power_slack = np.maximum(
            0.0, predicted.normalized_power - self.plant.power_limit_w / maximum_power
        )
        thermal_slack = np.maximum(0.0, predicted.temperature_c[1:] - self.plant.thermal_limit_c)
        terminal = self.terminal_cost(
            np.asarray(predicted.prefill_tokens[-1]), np.asarray(predicted.decode_tokens[-1])
        )
        return float(
            weights.power * np.sum(predicted.normalized_power)
            + weights.ttft * np.sum(ttft_slack**2)
            + self.tpot_weight * np.sum(tpot_slack**2)
            + weights.clock_change * np.sum(changes**2)
            + weights.constraint * np.sum(power_slack**2 + thermal_slack**2)
            + terminal
        )

    def costs(self, clock_mhz: FloatArray) -> FloatArray:
        """The objective for each row of an ``(M, horizon_steps)`` array of sequences.

        The same model and cost as :meth:`cost`, vectorised over the rows so a discrete
        search can price many candidate plans in one pass (the tests check the two
        agree); :meth:`cost` stays a scalar loop because it is faster for one sequence.
        Each row is priced as the safety chain applies it (:meth:`applied`).
        """
        sequences = self.applied(clock_mhz)
        profile = self.plant.profile
        weights = self.weights
        grid = profile.clock_mhz
        count, steps = sequences.shape
        h = self.control_period_s
        prefill_rate = np.interp(sequences, grid, profile.prefill_tokens_per_s)
        decode_rate = np.interp(sequences, grid, profile.decode_tokens_per_s)
        prefill_power = np.interp(sequences, grid, profile.prefill_power_w)
        decode_power = np.interp(sequences, grid, profile.decode_power_w)
        idle_power = np.interp(sequences, grid, profile.idle_power_w)
        maximum_power = self.maximum_power_w
        decay = math.exp(-h / self.plant.thermal_time_constant_s)
        prompt_divisor = max(self.mean_prompt_tokens, 1.0)
        output_divisor = max(self.mean_output_tokens, 1.0)

        prefill = np.full(count, max(0.0, self.initial_prefill_tokens))
        decode = np.full(count, max(0.0, self.initial_decode_tokens))
        active = np.full(count, max(0.0, self.initial_active_decode))
        temperature = np.full(count, float(self.initial_temperature_c))
        power_sum = np.zeros(count)
        ttft_penalty = np.zeros(count)
        tpot_penalty = np.zeros(count)
        limit_penalty = np.zeros(count)
        power_limit = self.plant.power_limit_w / maximum_power
        ttft_scale = max(profile.ttft_slo_s, 1e-12)
        tpot_scale = max(profile.tpot_slo_s, 1e-12)
        for index in range(steps):
            available_prefill = prefill + self.prompt_arrivals[index]
            has_prefill = available_prefill > 1e-12
            has_decode = decode > 1e-12
            both = has_prefill & has_decode
            prefill_share = np.where(both, 0.5, np.where(has_prefill, 1.0, 0.0))
            decode_share = np.where(both, 0.5, np.where(has_decode, 1.0, 0.0))
            served_prefill = np.minimum(
                available_prefill, prefill_rate[:, index] * h * prefill_share
            )
            completed_prefill = served_prefill / prompt_divisor
            prefill = np.maximum(0.0, available_prefill - served_prefill)
            available_decode = decode + completed_prefill * self.mean_output_tokens
            served_decode = np.minimum(available_decode, decode_rate[:, index] * h * decode_share)
            completed_decode = served_decode / output_divisor
            decode = np.maximum(0.0, available_decode - served_decode)
            active = np.maximum(0.0, active + completed_prefill - completed_decode)
            if self.latency_model == "seed":
                ttft_proxy = prefill / np.maximum(prefill_rate[:, index], 1e-12)
            else:
                ttft_proxy = self.ttft_proxy(
                    prefill,
                    active,
                    decode_rate[:, index],
                    prefill_rate[:, index],
                    float(self.prompt_arrivals[index]),
                )
            if self.latency_model == "seed":
                tpot_proxy = active / np.maximum(decode_rate[:, index], 1e-12)
            else:
                tpot_proxy = self.tpot_proxy(
                    active, decode_rate[:, index], served_prefill, prefill_rate[:, index]
                )
            power = np.where(
                both,
                0.5 * (prefill_power[:, index] + decode_power[:, index]),
                np.where(
                    has_prefill,
                    prefill_power[:, index],
                    np.where(has_decode, decode_power[:, index], idle_power[:, index]),
                ),
            )
            normalized_power = power / maximum_power
            equilibrium = (
                self.plant.ambient_temperature_c + self.plant.thermal_resistance_c_per_w * power
            )
            temperature = equilibrium + (temperature - equilibrium) * decay
            power_sum += normalized_power
            ttft_excess = np.minimum(
                np.maximum(0.0, ttft_proxy - self.ttft_target_s), self.ttft_excess_cap_s
            )
            ttft_penalty += (ttft_excess / ttft_scale) ** 2
            tpot_penalty += (np.maximum(0.0, tpot_proxy - self.tpot_target_s) / tpot_scale) ** 2
            limit_penalty += (
                np.maximum(0.0, normalized_power - power_limit) ** 2
                + np.maximum(0.0, temperature - self.plant.thermal_limit_c) ** 2
            )
        minimum = profile.minimum_clock_mhz
        span = profile.maximum_clock_mhz - minimum
        normalized_frequency = (sequences - minimum) / span
        previous_normalized = np.full((count, 1), (self.previous_clock_mhz - minimum) / span)
        changes = np.diff(np.concatenate([previous_normalized, normalized_frequency], axis=1))
        return (
            weights.power * power_sum
            + weights.ttft * ttft_penalty
            + self.tpot_weight * tpot_penalty
            + weights.clock_change * np.sum(changes**2, axis=1)
            + weights.constraint * limit_penalty
            + self.terminal_cost(prefill, decode)
        )

    @cached_property
    def maximum_power_w(self) -> float:
        """The profile's highest phase power: the power term's unit (computed once per
        problem: the scalar cost runs it at every SLSQP evaluation)."""
        profile = self.plant.profile
        return float(max(profile.prefill_power_w[-1], profile.decode_power_w[-1]))

    @cached_property
    def decode_energy_per_token_j(self) -> float:
        """The least energy above idle one decode token costs on the profile (J): the
        least a plan can spend later on the decode work it defers past the horizon."""
        profile = self.plant.profile
        marginal = (profile.decode_power_w - profile.idle_power_w) / np.maximum(
            profile.decode_tokens_per_s, 1e-12
        )
        return max(0.0, float(marginal.min()))

    def terminal_cost(self, prefill: FloatArray, decode: FloatArray) -> FloatArray:
        """The cost of the backlog a plan leaves at the horizon's end: the seed's quadratic
        penalty on :attr:`terminal_share` of its seconds of work at the top clock, and the
        rest of the decode backlog at :attr:`decode_energy_per_token_j`, in the power
        term's units (periods at the maximum power); the decode backlog with the queued
        prompts' replies where :attr:`terminal_queued_replies`."""
        profile = self.plant.profile
        share = self.terminal_share
        if self.terminal_queued_replies:
            decode = decode + prefill / max(self.mean_prompt_tokens, 1.0) * self.mean_output_tokens
        backlog = share * (
            prefill / profile.prefill_tokens_per_s[-1] + decode / profile.decode_tokens_per_s[-1]
        )
        energy = self.weights.power * self.decode_energy_per_token_j / self.maximum_power_w
        return self.weights.terminal_backlog * backlog**2 + (1.0 - share) * energy * decode / (
            self.control_period_s
        )
