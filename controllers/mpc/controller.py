"""Receding-horizon (MPC) clock control over a phase-level fluid model.

Ported from the seed's ``_MPCClockController``. Every control period the controller
predicts prefill tokens, decode tokens, active decodes and temperature over the horizon
under the alternating prefill/decode surrogate of the chunked scheduler
(:func:`mpc_fluid_rollout`), minimises

    sum(normalised power) + 20 * sum(TTFT slack^2) + 10 * sum(TPOT slack^2)
    + 0.05 * sum(clock change^2) + 1000 * sum(power slack^2 + thermal slack^2)
    + 20 * terminal backlog^2

with SLSQP from the current clock, applies the first clock of a supported-clock plan
and falls back to the reactive governor when the solve fails, overruns its time limit
or raises. A failed solve is a value, never an exception in the control loop;
:meth:`MPCController.diagnostics` counts fallbacks by reason (``solver_failed``,
``overrun``, ``exception``).

Seed deviations (also listed in :data:`MPC_SEED_DEVIATIONS` and in ``run_mpc`` results):

* No peeking. The seed computed ``mean_output_tokens`` from the realised
  ``output_tokens`` of the whole workload, including requests that had not finished
  (and ``mean_prompt_tokens`` from prompts that had not arrived). Here both are declared
  forecasts passed to the constructor, so the controller needs no workload (the daemon
  builds it from a profile and plant parameters); :func:`run_mpc` derives the output
  forecast the way the seed's experiment derived ``expected_output_tokens`` unless the
  caller supplies one.
* Scaling. SLSQP works on clocks normalised to [0, 1]. In MHz (the seed) the cost
  gradient is about 1e-3 per MHz, SLSQP's first step is as small, and its ``ftol=1e-6``
  test often stops at the starting clock; the normalised solve moves from it.
* Rounding. The seed quantised the continuous plan downward. Because the surrogate's cost
  jumps where a phase's work runs out within a period, that rounding can cost far more
  than the best supported plan next to it; :func:`refine_discrete_plan` searches the
  neighbouring supported plans when ``discrete_refinement=True``. It is off by default:
  it optimises the surrogate harder, and with the TPOT proxy below that costs SLO
  attainment on the detailed plant.
* A fallback clock is quantised downward onto the supported set like the MPC's plans.

The fluid model and the horizon problem are in :mod:`gpugov.controllers.mpc.model`, the
solvers in :mod:`gpugov.controllers.mpc.solvers`; this module keeps the controller.

Known limitation kept from the seed: the TPOT proxy (active decodes over the aggregate
decode rate) ignores the per-iteration weight-read time, so it underestimates real TPOT
at small batches and the MPC can trade TPOT SLO attainment for energy on the detailed
plant.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from time import perf_counter
from typing import Any

import numpy as np

from gpugov.controllers.adaptation import BurstHedge, SLOFeedback
from gpugov.controllers.budget import AttainmentBudget
from gpugov.controllers.contract import PowerNeed, whole_periods
from gpugov.controllers.efficiency import ProfileFloor, WorkMix
from gpugov.controllers.mpc.model import (
    CHUNK_TOKENS,
    DEFAULT_ARRIVAL_WINDOW_S,
    DEFAULT_EXPECTED_OUTPUT_TOKENS,
    DEFAULT_EXPECTED_PROMPT_TOKENS,
    DEFAULT_SOLVE_BUDGET_EVALUATIONS,
    DEFAULT_WAIT_QUANTILE,
    FALLBACK_REASONS,
    LATENCY_MODELS,
    FloatArray,
    MPCProblem,
    MPCRollout,
    MPCWeights,
    _BudgetExhausted,
    estimate_decode_remaining_tokens,
    mpc_fluid_rollout,
    mpc_latency_proxies,
)
from gpugov.controllers.mpc.solvers import (
    MPCSolver,
    SLSQPSolver,
    SolveOutcome,
    refine_discrete_plan,
)
from gpugov.plant.closed_loop import simulate
from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.result import ServingResult
from gpugov.plant.scheduler import chunked_prefill_scheduler, scheduler_label
from gpugov.plant.types import (
    ClockController,
    MPCDiagnostics,
    Request,
    Scheduler,
    ServingObservation,
)


# ---------------------------------------------------------------- controller
def _default_fallback() -> ClockController:
    from gpugov.controllers.baseline import reactive_clock_controller

    return reactive_clock_controller


def arrival_baseline(observation: ServingObservation) -> int:
    """The arrival count a controller's first ``observation`` starts from: its engine's
    counter where the engine has completed requests (a node started under load reads every
    request since its engine started: a lifetime, no arrivals of its first period), else 0
    (a fresh engine's first arrivals are arrivals)."""
    return observation.arrived_requests if observation.completed_requests > 0 else 0


def least_busy_power_w(profile: PerformanceProfile) -> float:
    """The least power the GPU draws while it serves (domain watts): a prefill or a
    one-request decode (the batch power model's factor at batch 1, where it has one), at
    any clock, and never under its lowest idle power. A thermal limit at or under the
    temperature it holds the die at is held by no clock while the GPU works."""
    decode = profile.decode_power_w
    model = profile.decode_power_batch_model
    if model is not None:
        factor = min(1.0, model.factor(1, profile.decode_latency_model.reference_batch_size))
        decode = profile.idle_power_w + (decode - profile.idle_power_w) * factor
    busy = min(float(np.min(profile.prefill_power_w)), float(np.min(decode)))
    return max(busy, float(np.min(profile.idle_power_w)))


class MPCController:
    """Receding-horizon clock controller (the seed's ``_MPCClockController``).

    Args:
        plant: the plant model (profile, power and thermal limits, thermal RC).
        mean_prompt_tokens: declared prompt-length forecast (tokens).
        mean_output_tokens: declared output-length forecast (tokens).
        horizon_s: prediction horizon; ``ceil(horizon_s / control_period_s)`` steps.
        control_period_s: one decision per period; calls within a period hold the clock.
        solve_time_limit_s: a solve taking longer is discarded (``"overrun"``).
        arrival_window_s: sliding window of the arrival-rate estimate.
        weights: cost weights.
        solver: minimiser (default SLSQP with the seed's options).
        fallback: controller used when a solve is discarded (default: the reactive
            governor).
        discrete_refinement: improve the downward-quantised plan by a search over
            supported clocks (:func:`refine_discrete_plan`); False (default) gives the
            seed's plain downward quantisation.
        timer: monotonic clock in seconds used to time solves (injectable for tests).
        solve_budget_evaluations: in virtual time (simulations, the scoreboard), a
            deterministic budget instead of the wall-clock limit: a solve that needs more
            cost evaluations falls back (reason ``"budget"``) and ``solve_time_limit_s`` is
            not applied, so a busy machine cannot change a decision. None (a node, or any
            paced run): the wall-clock limit.
        latency_model: ``"seed"`` (the seed's proxies) or ``"iteration"``.
        slo_margin: the proxies are penalised above this fraction of each SLO.
        ttft_prompt_tokens: declared prompt length the iteration model's TTFT proxy
            charges a new request (default: the mean prompt).
        burst_hedge: when given, the TTFT proxy charges a new request at least the
            recent burst size it tracks (:class:`controllers.adaptation.BurstHedge`).
        slo_feedback: when given, integral action on ``slo_margin`` from measured
            latencies (:class:`controllers.adaptation.SLOFeedback`).
        ttft_excess_cap: cap on the penalised TTFT excess, in TTFT SLOs
            (:attr:`MPCProblem.ttft_excess_cap_s`); None (the seed's) for no cap.
        slo_budget: when given, the attainment-tracking loop
            (:class:`controllers.budget.AttainmentBudget`): its looseness scales
            ``slo_margin`` (never past 1) and the SLO feedback's thresholds, and below 1
            withdraws the per-prompt TTFT allowance (its ``allowance_credit``).
        feedback_yields_when_ahead: the SLO feedback does not tighten while the
            ``slo_budget`` is ahead of its target (``mpc-online``, whose measured-latency
            guards stay on; ``mpc``'s feedback is its only one, so it keeps it).
        tail_yields_to_budget: with a ``slo_budget``, the TTFT proxy charges a new request
            the part of ``ttft_prompt_tokens`` beyond the mean prompt only in the share
            the budget withholds (``1 - allowance_credit``: all of it at the tightest
            looseness, none from a looseness of 1 up; the burst hedge is charged in
            full), and the seed's terminal penalty in the same share
            (:attr:`MPCProblem.terminal_share`; the rest of the decode backlog is priced
            at its least energy): for a caller whose own measured-latency guard drains a
            long prompt, and any prompt backlog, from the decision after it arrives
            (``mpc-online``'s burst guard). ``mpc`` has no such guard and keeps charging
            both in full.
        dwell_s: the safety chain's dwell (``safety.dwell_s``): plans are priced as the
            chain applies them, a lower clock only after the locked one (the
            observation's ``requested_clock_mhz``) has been held this long, so a raise
            is charged for its whole hold (:meth:`MPCProblem.applied`). 0: as asked.
        terminal_queued_replies: the terminal backlog counts the queued prompts' replies
            (:attr:`MPCProblem.terminal_queued_replies`; ``mpc``).
        efficiency_floor: no decision below the lowest clock of the plant's profile
            whose mean power for the recent work mix is within 2 % of the cheapest
            (:func:`controllers.efficiency.profile_floor`): the fluid model charges a
            period at its phase's busy power however early its work ends, so where power
            hardly rises with the clock it sees no gain in finishing sooner and idling,
            and picks a slower clock that costs more. Inert where the lowest clocks are
            the cheapest (every bundled profile). False (the seed's): off.
        hold_top_when_ttft_lost: decide the top clock, without a solve, where even the
            top clock leaves the first period's new request at the capped TTFT penalty
            (:meth:`MPCProblem.ttft_lost_at_top`): past the cap every clock costs the same
            TTFT term, and the plan went by power alone, to a lower clock that misses more
            (an overload, or a TTFT SLO no clock meets). Needs a ``ttft_excess_cap``;
            False (the seed's): off.
        hold_top_when_place_lost: the same hold, only where the new request's wait for a
            batch place alone leaves it past the cap at the top clock
            (:meth:`MPCProblem.place_lost_at_top`: a full batch or KV cache, which a lower
            clock frees later); a prompt priced past the cap by its size alone (a burst
            hedge) does not hold. False: off.
        kv_batch_bound: the batch places a new request waits for are bounded by the
            plant's KV cache too (:attr:`MPCProblem.batch_places`: the requests of the
            mean prompt and reply it holds), not by its batch size alone: on an engine
            whose cache holds a tenth of its batch, the wait for a place was priced at
            none and the plan lowered the clock while requests queued for the cache
            (``mpc``, whose plant is its profile's). False (the seed's): off.

    With the ``iteration`` latency model, where an observation carries a per-prompt TTFT
    allowance (``ttft_slo_per_prompt_token_s``), the TTFT proxy is judged per prompt
    (:meth:`MPCProblem.ttft_proxy`): the declared prompt (``ttft_prompt_tokens``, default
    the mean) less its allowance, or the queue alone ahead of a short prompt.

    Raises:
        ValueError: non-finite or non-positive forecasts, horizon, period or limit.
    """

    def __init__(
        self,
        plant: ServingPlant,
        *,
        mean_prompt_tokens: float = DEFAULT_EXPECTED_PROMPT_TOKENS,
        mean_output_tokens: float = DEFAULT_EXPECTED_OUTPUT_TOKENS,
        horizon_s: float = 10.0,
        control_period_s: float = 1.0,
        solve_time_limit_s: float = 0.8,
        arrival_window_s: float = DEFAULT_ARRIVAL_WINDOW_S,
        weights: MPCWeights | None = None,
        solver: MPCSolver | None = None,
        fallback: ClockController | None = None,
        discrete_refinement: bool = False,
        timer: Callable[[], float] = perf_counter,
        latency_model: str = "seed",
        slo_margin: float = 1.0,
        ttft_prompt_tokens: float | None = None,
        burst_hedge: BurstHedge | None = None,
        slo_feedback: SLOFeedback | None = None,
        ttft_excess_cap: float | None = None,
        solve_budget_evaluations: int | None = None,
        slo_budget: AttainmentBudget | None = None,
        dwell_s: float = 0.0,
        feedback_yields_when_ahead: bool = False,
        tail_yields_to_budget: bool = False,
        terminal_queued_replies: bool = False,
        efficiency_floor: bool = False,
        hold_top_when_ttft_lost: bool = False,
        hold_top_when_place_lost: bool = False,
        kv_batch_bound: bool = False,
    ) -> None:
        for name, value in (
            ("mean_prompt_tokens", mean_prompt_tokens),
            ("mean_output_tokens", mean_output_tokens),
            ("horizon_s", horizon_s),
            ("control_period_s", control_period_s),
            ("arrival_window_s", arrival_window_s),
        ):
            if not math.isfinite(value) or value <= 0.0:
                raise ValueError(f"{name} must be finite and positive, got {value!r}")
        if not math.isfinite(dwell_s) or dwell_s < 0.0:
            raise ValueError(f"dwell_s must be finite and >= 0, got {dwell_s!r}")
        if not math.isfinite(solve_time_limit_s) or solve_time_limit_s < 0.0:
            raise ValueError(
                f"solve_time_limit_s must be finite and >= 0, got {solve_time_limit_s!r}"
            )
        if solve_budget_evaluations is not None and solve_budget_evaluations < 1:
            raise ValueError(
                f"solve_budget_evaluations must be >= 1, got {solve_budget_evaluations!r}"
            )
        self.solve_budget_evaluations = solve_budget_evaluations
        self.plant = plant
        self._stated_plant: tuple[ServingPlant, ServingPlant] | None = None
        """(:attr:`plant`, it at the thermal limit the node last stated):
        :meth:`planning_plant`'s, kept while neither changes."""
        self.horizon_steps = int(np.ceil(horizon_s / control_period_s))
        self.control_period_s = float(control_period_s)
        self.solve_time_limit_s = float(solve_time_limit_s)
        self.arrival_window_s = float(arrival_window_s)
        self.mean_prompt_tokens = float(mean_prompt_tokens)
        self.mean_output_tokens = float(mean_output_tokens)
        self.weights = MPCWeights() if weights is None else weights
        self.solver: MPCSolver = SLSQPSolver() if solver is None else solver
        self.fallback: ClockController = _default_fallback() if fallback is None else fallback
        self.discrete_refinement = bool(discrete_refinement)
        self.timer = timer
        if latency_model not in LATENCY_MODELS:
            raise ValueError(
                f"latency_model must be one of {LATENCY_MODELS}, got {latency_model!r}"
            )
        self.latency_model = latency_model
        if not 0.0 < slo_margin <= 1.0:
            raise ValueError(f"slo_margin must lie in (0, 1], got {slo_margin!r}")
        self.slo_margin = float(slo_margin)
        if ttft_prompt_tokens is not None and not (
            math.isfinite(ttft_prompt_tokens) and ttft_prompt_tokens > 0
        ):
            raise ValueError(f"ttft_prompt_tokens must be positive, got {ttft_prompt_tokens!r}")
        self.ttft_prompt_tokens = ttft_prompt_tokens
        self.burst_hedge = burst_hedge
        if ttft_excess_cap is not None and not ttft_excess_cap > 0.0:
            raise ValueError(f"ttft_excess_cap must be positive, got {ttft_excess_cap!r}")
        self.ttft_excess_cap = ttft_excess_cap
        self.slo_feedback = slo_feedback
        self.slo_budget = slo_budget
        self.feedback_yields_when_ahead = bool(feedback_yields_when_ahead)
        self.dwell_s = float(dwell_s)
        self.held_clock_mhz: float | None = None
        """The clock the node has locked (the observation's), whose hold plans are priced
        against (:attr:`dwell_s`)."""
        self.last_temperature_c: float | None = None
        """The die temperature the last tick was planned from: the last finite reading,
        carried forward by the plant's thermal RC at the power read since over ticks whose
        sensor gave none (NaN); None before any (the plant's ambient is planned from)."""
        self.last_temperature_s = -math.inf
        """The observation time :attr:`last_temperature_c` holds at."""
        self._last_power_w: float | None = None
        self.held_since_s = -math.inf
        """When the held clock was applied: the decision before the first observation
        that reported it."""
        self._last_decision_s: float | None = None
        self.charged_prompt_tokens = ttft_prompt_tokens
        self.charged_own_prompt_tokens = ttft_prompt_tokens or self.mean_prompt_tokens
        """The new request's own prompt within the charged one (the TTFT proxy's
        per-prompt allowance is judged on it)."""
        self.tail_yields_to_budget = bool(tail_yields_to_budget)
        self.terminal_queued_replies = bool(terminal_queued_replies)
        self.efficiency_floor = bool(efficiency_floor)
        self.hold_top_when_ttft_lost = bool(hold_top_when_ttft_lost)
        self.hold_top_when_place_lost = bool(hold_top_when_place_lost)
        self.kv_batch_bound = bool(kv_batch_bound)
        self.ttft_lost_holds = 0
        """Decisions that held the top clock, the TTFT lost there
        (``hold_top_when_ttft_lost``)."""
        self._profile_floor = ProfileFloor(plant.profile) if efficiency_floor else None
        self.work_mix = WorkMix()
        """The recent prompt rate and decode share (``efficiency_floor``)."""
        self.efficiency_floor_decisions = 0
        """Decisions the efficiency floor raised."""
        self.terminal_share = 1.0
        """The share of the seed's terminal penalty the next problem charges
        (``tail_yields_to_budget``; :attr:`MPCProblem.terminal_share`)."""
        self.effective_slo_margin = self.slo_margin
        self.ttft_allowance = 0.0
        """The per-prompt TTFT allowance the next problem judges with (0: flat)."""
        self.arrivals_seen: deque[tuple[float, int]] = deque()
        """(observation time, requests that arrived since the one before), within the
        arrival window: one entry per observation, whatever the counts."""
        self.arrivals_in_window = 0
        self.previous_arrived_count: int | None = None
        """The arrival counter at the last observation (None before the first: a node's
        counter then holds every request since its engine started, no arrivals of ours)."""
        self.current_clock = plant.profile.minimum_clock_mhz
        self.last_control_index: int | None = None
        self.solve_times: list[float] = []
        self.successful_solves = 0
        self.fallback_count = 0
        self.fallback_reasons: dict[str, int] = dict.fromkeys(FALLBACK_REASONS, 0)
        self.last_error: str | None = None
        self.last_plan: FloatArray | None = None
        self.plans_by_step: dict[int, tuple[float, ...]] = {}
        self.plan_start_times_by_step: dict[int, float] = {}
        self.plan_dt_s = self.control_period_s
        # The one controller name (CLI spec, metrics, JSON): the SLSQP solver is the
        # seed's ``mpc-slsqp``; any other solver is the fast ``mpc``.
        self.__name__ = "mpc-slsqp" if isinstance(self.solver, SLSQPSolver) else "mpc"
        # None keeps every plan and solve time (studies read them); the daemon bounds it.
        self.history_limit: int | None = None
        self.last_problem: MPCProblem | None = None
        """The horizon problem of the last decision (:meth:`power_needed` prices it)."""
        self._power_need: PowerNeed | None = None

    @classmethod
    def from_profile(
        cls,
        profile: PerformanceProfile,
        *,
        plant_overrides: Mapping[str, Any] | None = None,
        **controller_options: Any,
    ) -> MPCController:
        """Build from a profile, its manifest's limits and optional plant overrides."""
        plant = ServingPlant.from_profile(profile, **dict(plant_overrides or {}))
        return cls(plant, **controller_options)

    # ------------------------------------------------------------ internals
    def _arrival_rate(self, observation: ServingObservation) -> float:
        """Requests per second over the last ``arrival_window_s`` (the seed's estimate:
        new arrivals are stamped with the observation time). Counted, not listed, so a
        tick costs the same whatever the counter reads (a node's counter can jump by a
        lifetime of requests); a counter that went back (an engine restart) starts again
        from its new value. Where the first observation's engine has completed requests,
        its count is the baseline, not arrivals: a node started under load reads every
        request since its engine started there (a lifetime in one period held the top
        clock at a restarted node's first decision). An engine with none completed yet
        (a simulated run's first instant) counts its arrivals as new. A caller that saw
        the observations before this controller's first sets the baseline itself."""
        arrived = observation.arrived_requests
        if self.previous_arrived_count is None:
            self.previous_arrived_count = arrival_baseline(observation)
        new_arrivals = arrived - self.previous_arrived_count
        if new_arrivals > 0:
            self.arrivals_seen.append((observation.time_s, new_arrivals))
            self.arrivals_in_window += new_arrivals
        self.previous_arrived_count = arrived
        lower = observation.time_s - self.arrival_window_s
        while self.arrivals_seen and self.arrivals_seen[0][0] < lower:
            self.arrivals_in_window -= self.arrivals_seen.popleft()[1]
        observed_window = min(self.arrival_window_s, max(observation.time_s, self.control_period_s))
        return float(self.arrivals_in_window) / observed_window

    def remember_temperature(self, temperature_c: float | None, time_s: float) -> None:
        """A die temperature read at ``time_s`` outside this MPC's own ticks (mpc-online's
        warm-up): planned from where it is newer than what this MPC holds."""
        if (
            temperature_c is not None
            and math.isfinite(temperature_c)
            and time_s >= self.last_temperature_s
        ):
            self.last_temperature_c, self.last_temperature_s = float(temperature_c), time_s

    def _finite_temperature(self, observation: ServingObservation) -> float:
        """The observation's die temperature where finite (remembered); else the last one
        carried forward to now by the plant's thermal RC at the power read since (held
        where no power was read), so a sensor that stops answering over the limit does
        not hold the plan low for ever; else the plant's ambient."""
        power = observation.power_w
        if power is not None and math.isfinite(power) and power >= 0.0:
            self._last_power_w = float(power)
        temperature = observation.temperature_c
        now = float(observation.time_s)
        if math.isfinite(temperature):
            self.last_temperature_c, self.last_temperature_s = float(temperature), now
            return float(temperature)
        last = self.last_temperature_c
        if last is None:
            return float(self.plant.ambient_temperature_c)
        elapsed = now - self.last_temperature_s
        if self._last_power_w is not None and elapsed > 0.0:
            plant = self.plant
            steady = (
                plant.ambient_temperature_c + plant.thermal_resistance_c_per_w * self._last_power_w
            )
            last = steady + (last - steady) * math.exp(-elapsed / plant.thermal_time_constant_s)
            self.last_temperature_c, self.last_temperature_s = last, now
        return last

    def planning_plant(self, observation: ServingObservation) -> ServingPlant:
        """:attr:`plant` held to the thermal limit the node states (the observation's, a
        domain's ``thermal_limit_c``) where some clock holds it while the GPU serves: above
        the temperature its least busy draw (:func:`least_busy_power_w`) holds it at.
        Else the profile's own limit (no clock would keep the die under the stated one,
        and planning to it would lock the lowest clock, as the safety chain's thermal
        guard does only until it calls such a limit unholdable)."""
        plant = self.plant
        limit = observation.thermal_limit_c
        if limit is None or not math.isfinite(limit) or limit == plant.thermal_limit_c:
            return plant
        kept = self._stated_plant
        if kept is not None and kept[0] is plant and kept[1].thermal_limit_c == limit:
            return kept[1]  # checked against the least busy temperature when it was made
        if limit <= plant.ambient_temperature_c + plant.thermal_resistance_c_per_w * (
            least_busy_power_w(plant.profile)
        ):
            return plant
        stated = plant.with_overrides(thermal_limit_c=float(limit))
        self._stated_plant = (plant, stated)
        return stated

    def problem(self, observation: ServingObservation, arrival_rate: float) -> MPCProblem:
        """The horizon problem for ``observation`` and an arrival-rate estimate (req/s)."""
        return MPCProblem(
            plant=self.planning_plant(observation),
            control_period_s=self.control_period_s,
            initial_prefill_tokens=observation.prefill_remaining_tokens,
            initial_decode_tokens=estimate_decode_remaining_tokens(
                observation.decode_active,
                observation.generated_decode_tokens,
                self.mean_output_tokens,
            ),
            initial_active_decode=float(observation.decode_active),
            initial_temperature_c=self._finite_temperature(observation),
            prompt_arrivals=np.full(
                self.horizon_steps,
                arrival_rate * self.mean_prompt_tokens * self.control_period_s,
            ),
            mean_prompt_tokens=self.mean_prompt_tokens,
            mean_output_tokens=self.mean_output_tokens,
            previous_clock_mhz=self.current_clock,
            weights=self.weights,
            latency_model=self.latency_model,
            slo_margin=self.effective_slo_margin,
            ttft_prompt_tokens=self.charged_prompt_tokens,
            ttft_excess_cap=self.ttft_excess_cap,
            ttft_slo_per_prompt_token_s=self.ttft_allowance,
            ttft_own_prompt_tokens=self.charged_own_prompt_tokens,
            terminal_share=self.terminal_share,
            terminal_queued_replies=self.terminal_queued_replies,
            dwell_periods=self.dwell_s / self.control_period_s,
            held_clock_mhz=self.held_clock_mhz,
            held_periods=whole_periods(
                observation.time_s - self.held_since_s, self.control_period_s
            ),
            wait_quantile=(
                DEFAULT_WAIT_QUANTILE
                if self.slo_budget is None
                else self.slo_budget.target.attainment
            ),
            kv_capacity_tokens=(
                float(self.plant.kv_capacity_tokens) if self.kv_batch_bound else math.inf
            ),
        )

    def adapt(self, observation: ServingObservation) -> None:
        """Fold one period's observation into the burst hedge, the attainment budget and
        the SLO feedback, setting the prompt the TTFT proxy charges, the TTFT SLO it is
        judged against and the margin the next problem uses."""
        period = self.control_period_s
        ttft_slo = observation.ttft_slo_s or self.plant.profile.ttft_slo_s
        looseness = 1.0 if self.slo_budget is None else self.slo_budget.update(observation)
        allowance = observation.ttft_slo_per_prompt_token_s
        credit = 1.0 if self.slo_budget is None else self.slo_budget.allowance_credit
        declared = self.ttft_prompt_tokens or self.mean_prompt_tokens
        if self.tail_yields_to_budget and self.slo_budget is not None:
            # The declared tail beyond the mean prompt is charged in the share the budget
            # withholds (none from a looseness of 1 up): a long prompt that does arrive
            # is drained from the next decision on by the caller's measured-latency guard,
            # so the plan need not hold the clock for it ahead. A burst is not a prompt the
            # guard sees coming: its hedge stays.
            declared -= credit * max(declared - self.mean_prompt_tokens, 0.0)
            # Likewise the backlog a plan leaves at the horizon's end: the guard drains
            # any prompt within its deadline, so the seed's penalty is charged in the
            # share the budget withholds. The guard drains no decode work: the rest of it
            # is priced at the least energy it can cost later.
            self.terminal_share = 1.0 - credit
        charged = declared
        if self.burst_hedge is not None:
            self.burst_hedge.update(observation, period)
            hedge = self.burst_hedge.prompt_tokens(self.mean_prompt_tokens, period, ttft_slo)
            charged = max(declared, hedge)
        self.charged_prompt_tokens = charged
        self.charged_own_prompt_tokens = declared
        self.ttft_allowance = (
            float(allowance) * credit
            if self.latency_model == "iteration" and allowance is not None and allowance > 0.0
            else 0.0
        )
        margin = min(1.0, self.slo_margin * looseness)
        if self.slo_feedback is not None:
            # A hedge on the windowed mean latency: where asked, it stands down while the
            # measured attainment leaves the budget unspent (a GPU whose windowed TPOT is
            # noisy near its SLO would otherwise hold the margin tight for misses that
            # never come).
            ahead = (
                self.feedback_yields_when_ahead
                and self.slo_budget is not None
                and self.slo_budget.ahead
            )
            margin /= self.slo_feedback.update(observation, period, looseness, ahead=ahead)
        self.effective_slo_margin = margin

    def solve(self, problem: MPCProblem) -> tuple[FloatArray | None, str | None, float]:
        """Solve ``problem`` from the current clock and return a supported-clock plan.

        The solver works on clocks normalised to [0, 1] (see the module notes); its plan
        is quantised downward, as in the seed, and then, with ``discrete_refinement``,
        improved by :func:`refine_discrete_plan`. The refinement is timed with the solve.

        Returns:
            ``(plan in MHz or None, fallback reason or None, elapsed seconds)``; the
            reason is ``"exception"``, ``"overrun"`` or ``"solver_failed"``.
        """
        profile = self.plant.profile
        minimum = profile.minimum_clock_mhz
        span = profile.maximum_clock_mhz - minimum

        budget = self.solve_budget_evaluations
        evaluations = 0

        def normalized_cost(z: FloatArray) -> float:
            nonlocal evaluations
            evaluations += 1
            if budget is not None and evaluations > budget:
                raise _BudgetExhausted
            return problem.cost(minimum + span * np.asarray(z, dtype=float))

        # Virtual time: the evaluation budget bounds the solve, never the wall clock.
        limit_s = math.inf if budget is not None else self.solve_time_limit_s

        direct = getattr(self.solver, "solve_problem", None)
        if direct is None:  # a continuous solver's start and bounds
            initial = np.full(problem.horizon_steps, (self.current_clock - minimum) / span)
            bounds = [(0.0, 1.0)] * problem.horizon_steps
        start = self.timer()
        try:
            if (self.hold_top_when_ttft_lost and problem.ttft_lost_at_top()) or (
                self.hold_top_when_place_lost and problem.place_lost_at_top()
            ):
                # Fail towards performance: no clock keeps this period's request within
                # the capped penalty, and the top clock serves it and the queue soonest.
                self.ttft_lost_holds += 1
                top = np.full(problem.horizon_steps, float(profile.maximum_clock_mhz))
                return top, None, self.timer() - start
            if direct is not None:
                # A discrete solver searches supported clocks directly: no rounding step.
                outcome = direct(problem, self.last_plan)
                plan = np.asarray(outcome.x, dtype=float) if outcome.success else None
                elapsed = self.timer() - start
                if elapsed > limit_s:
                    return None, "overrun", elapsed
                if plan is None or plan.shape != (problem.horizon_steps,):
                    self.last_error = outcome.message or "solver reported failure"
                    return None, "solver_failed", elapsed
                return plan, None, elapsed
            outcome = self.solver(normalized_cost, initial, bounds)
            candidate = np.asarray(outcome.x, dtype=float)
            solved = (
                outcome.success
                and candidate.shape == (problem.horizon_steps,)
                and bool(np.all(np.isfinite(candidate)))
            )
            plan = None
            if solved:
                clocks = minimum + span * np.clip(candidate, 0.0, 1.0)
                if self.discrete_refinement:
                    plan = refine_discrete_plan(problem, clocks)
                else:
                    plan = np.array(
                        [profile.quantize_clock(value, downward=True) for value in clocks]
                    )
        except _BudgetExhausted:
            self.last_error = f"solve used its budget of {budget} cost evaluations"
            return None, "budget", self.timer() - start
        # The solve is a numerical black box at the edge of this controller: whatever it
        # raises becomes a counted fallback, never an exception in the control loop.
        except Exception as error:
            self.last_error = f"{type(error).__name__}: {error}"
            return None, "exception", self.timer() - start
        elapsed = self.timer() - start
        if elapsed > limit_s:
            return None, "overrun", elapsed
        if plan is None:
            self.last_error = outcome.message or "solver reported failure"
            return None, "solver_failed", elapsed
        return plan, None, elapsed

    def _fallback_clock(self, observation: ServingObservation) -> float:
        profile = self.plant.profile
        if not observation.supported_clocks_mhz:
            observation = replace(
                observation, supported_clocks_mhz=tuple(float(c) for c in profile.clock_mhz)
            )
        # Quantised like the MPC's own plans so current_clock is always a supported clock.
        return profile.quantize_clock(float(self.fallback(observation)), downward=True)

    # --------------------------------------------------------------- public
    def __call__(self, observation: ServingObservation) -> float:
        control_index = math.floor((observation.time_s + 1e-12) / self.control_period_s)
        if control_index == self.last_control_index:
            return self.current_clock
        self.last_control_index = control_index
        node_clock = observation.requested_clock_mhz
        if node_clock is not None and math.isfinite(node_clock) and node_clock > 0.0:
            # The clock-change penalty counts from the clock the node applied (a safety
            # layer may have held another), not from this controller's last wish.
            self.current_clock = float(node_clock)
            if node_clock != self.held_clock_mhz:
                # Applied at the decision before this observation.
                previous = self._last_decision_s
                self.held_since_s = -math.inf if previous is None else previous
                self.held_clock_mhz = float(node_clock)
        else:
            self.held_clock_mhz = None
        self._last_decision_s = observation.time_s
        self.work_mix.update(observation)
        arrival_rate = self._arrival_rate(observation)
        self.adapt(observation)
        self.last_problem = self.problem(observation, arrival_rate)
        self._power_need = None
        candidate, reason, elapsed = self.solve(self.last_problem)
        self.solve_times.append(elapsed)
        if candidate is not None:
            applied = tuple(candidate.tolist())  # Python floats, as float(value) gives
            self.last_plan = np.asarray(applied, dtype=float)
            self.current_clock = applied[0]
            self.successful_solves += 1
            self.plans_by_step[observation.step_index] = applied
        else:
            assert reason is not None
            self.last_plan = None
            self.current_clock = self._fallback_clock(observation)
            self.fallback_count += 1
            self.fallback_reasons[reason] += 1
            self.plans_by_step[observation.step_index] = (float(self.current_clock),)
        if self.efficiency_floor:
            profile = self.plant.profile
            if self._profile_floor is None or self._profile_floor.profile is not profile:
                # Switched on after construction, or planning on another plant now.
                self._profile_floor = ProfileFloor(profile)
            floor = self._profile_floor(*self.work_mix.for_role(observation.role))
            if floor > self.current_clock:
                self.current_clock = floor
                self.efficiency_floor_decisions += 1
        self.plan_start_times_by_step[observation.step_index] = observation.time_s
        if self.history_limit is not None:
            self._trim_history(self.history_limit)
        return self.current_clock

    def _trim_history(self, limit: int) -> None:
        """Keep the last ``limit`` plans and solve times (a daemon runs for months)."""
        for history in (self.plans_by_step, self.plan_start_times_by_step):
            while len(history) > limit:
                del history[next(iter(history))]
        if len(self.solve_times) > 2 * limit:
            del self.solve_times[:-limit]

    def power_needed(self) -> PowerNeed | None:
        """The power the domain needs to hold its SLO at the current load: the lowest
        clock of the plant's profile that keeps the TTFT and TPOT proxies within this
        controller's targets over the horizon, from the last decision's state and load
        forecast, and its predicted mean power, with no power cap applied
        (:func:`controllers.power_need.need_from_problem`). The profile is taken as exact
        (uncertainty 0). None before the first decision."""
        if self.last_problem is None:
            return None
        if self._power_need is None:
            from gpugov.controllers.power_need import need_from_problem

            self._power_need = need_from_problem(self.last_problem)
        return self._power_need

    def status(self) -> dict[str, Any]:
        """What a node exports of it: the SLO target's budget (target, measured attainment,
        looseness) where it spends one, as ``mpc-online``'s status says it; else nothing."""
        return {} if self.slo_budget is None else {"slo_budget": self.slo_budget.status()}

    def diagnostics(self) -> MPCDiagnostics:
        """Solve times, success and fallback counts (by reason) so far."""
        return MPCDiagnostics(
            solve_times_s=np.asarray(self.solve_times, dtype=float),
            successful_solves=self.successful_solves,
            fallback_count=self.fallback_count,
            control_period_s=self.control_period_s,
            horizon_steps=self.horizon_steps,
            solve_time_limit_s=self.solve_time_limit_s,
            fallback_reasons=dict(self.fallback_reasons),
        )


def expected_output_tokens_forecast(workload: Sequence[Request]) -> float:
    """The seed experiment's declared output forecast: the workload's mean output length.

    This is a planning input fixed before the run (as the seed's
    ``expected_output_tokens``), not something the controller reads while running; pass
    an estimate from past traffic instead where one exists.

    Raises:
        ValueError: an empty workload.
    """
    if not workload:
        raise ValueError("workload must contain at least one request")
    return float(np.mean([request.output_tokens for request in workload]))


def run_mpc(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    horizon_s: float = 10.0,
    control_period_s: float = 1.0,
    solve_time_limit_s: float = 0.8,
    seed: int = 0,
    expected_output_tokens: float | None = None,
    expected_prompt_tokens: float = DEFAULT_EXPECTED_PROMPT_TOKENS,
    **controller_options: Any,
) -> ServingResult:
    """Run receding-horizon frequency control on the detailed plant.

    ``expected_output_tokens`` defaults to :func:`expected_output_tokens_forecast` of the
    workload (the seed experiment's declared forecast); ``controller_options`` go to
    :class:`MPCController`. The result's ``metadata["mpc"]`` holds the forecasts used,
    the solve diagnostics and the seed deviations.
    """
    forecast = (
        expected_output_tokens_forecast(workload)
        if expected_output_tokens is None
        else float(expected_output_tokens)
    )
    controller = MPCController(
        plant,
        mean_prompt_tokens=expected_prompt_tokens,
        mean_output_tokens=forecast,
        horizon_s=horizon_s,
        control_period_s=control_period_s,
        solve_time_limit_s=solve_time_limit_s,
        **controller_options,
    )
    result = simulate(
        workload,
        plant,
        scheduler,
        controller,
        seed,
        controller_name="MPC",
        scheduler_name=scheduler_label(scheduler),
        control_period_s=control_period_s,
    )
    return replace(result, metadata={**result.metadata, "mpc": mpc_summary(controller, forecast)})


def mpc_summary(controller: MPCController, expected_output_tokens: float) -> dict[str, Any]:
    """JSON-able record of an MPC run: forecasts, solve statistics, seed deviations."""
    diagnostics = controller.diagnostics()
    times = diagnostics.solve_times_s
    return {
        "expected_output_tokens": float(expected_output_tokens),
        "expected_prompt_tokens": controller.mean_prompt_tokens,
        "forecast_source": (
            "declared before the run; the controller never reads a request's output_tokens"
        ),
        "horizon_steps": diagnostics.horizon_steps,
        "control_period_s": diagnostics.control_period_s,
        "solve_time_limit_s": diagnostics.solve_time_limit_s,
        "solve_budget_evaluations": controller.solve_budget_evaluations,
        "solves": int(times.size),
        "successful_solves": diagnostics.successful_solves,
        "fallback_count": diagnostics.fallback_count,
        "fallback_reasons": dict(diagnostics.fallback_reasons),
        "solve_time_p50_s": float(np.percentile(times, 50)) if times.size else None,
        "solve_time_max_s": float(np.max(times)) if times.size else None,
        "discrete_refinement": controller.discrete_refinement,
        "seed_deviations": [
            deviation
            for deviation in MPC_SEED_DEVIATIONS
            if controller.discrete_refinement or "refine_discrete_plan" not in deviation
        ],
    }


MPC_SEED_DEVIATIONS = (
    "mean_output_tokens is a declared forecast (run_mpc: the workload mean fixed before "
    "the run, as the seed experiment's expected_output_tokens), not read by the "
    "controller from unfinished requests' output_tokens",
    "mean_prompt_tokens is a declared forecast (default 1024 tokens), not the mean over "
    "requests that have not arrived yet",
    "a fallback clock from the reactive governor is quantised downward onto the "
    "supported set, like the MPC's own plans",
    "SLSQP runs on clocks normalised to [0, 1]: in MHz (the seed) the cost gradient is "
    "about 1e-3 per MHz and SLSQP's ftol=1e-6 test often stops at the starting clock",
    "the downward-quantised SLSQP plan (the seed's) is improved by a local search over "
    "supported clocks (refine_discrete_plan); the applied plan's model cost is never "
    "higher than the seed's quantised plan",
)


# The MPC's public names, wherever they are defined (the model and the solvers live in
# mpc_model.py and mpc_solvers.py; users import them from here).
__all__ = [
    "CHUNK_TOKENS",
    "DEFAULT_ARRIVAL_WINDOW_S",
    "DEFAULT_EXPECTED_OUTPUT_TOKENS",
    "DEFAULT_EXPECTED_PROMPT_TOKENS",
    "DEFAULT_SOLVE_BUDGET_EVALUATIONS",
    "FALLBACK_REASONS",
    "LATENCY_MODELS",
    "MPC_SEED_DEVIATIONS",
    "MPCController",
    "MPCProblem",
    "MPCRollout",
    "MPCSolver",
    "MPCWeights",
    "SLSQPSolver",
    "SolveOutcome",
    "estimate_decode_remaining_tokens",
    "expected_output_tokens_forecast",
    "mpc_fluid_rollout",
    "mpc_latency_proxies",
    "mpc_summary",
    "refine_discrete_plan",
    "run_mpc",
]
