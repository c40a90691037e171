"""The self-calibrating governor: an MPC that learns its node's model online (``mpc-online``).

It is given only what a real node knows: the supported clocks and power limit (in every
observation, from NVML), the SLOs and declared forecasts (config), and the
:class:`ServingObservation` stream. It never sees a profile. Each call it

1. folds the window since the previous observation into :class:`OnlineModel`
   (:mod:`controllers.online.identification`);
2. builds a *learned* :class:`PerformanceProfile` over the supported clocks from the
   model's **pessimistic** predictions: latency at the mean plus ``uncertainty_z``
   standard deviations, so the MPC's SLO margin is wider where the model is unsure and
   narrows as evidence builds up; power at the mean;
3. runs the fast MPC (discrete search, iteration latency model, burst hedge, SLO
   feedback: :mod:`controllers.mpc.fast`, :mod:`controllers.adaptation`) on that profile;
4. applies safe exploration (:mod:`controllers.online.exploration`) to the MPC's
   decision, the decode descent (:meth:`OnlineMPCController.descent_clock`: in a
   decode-only window, a lower clock the measured latency and the 1/f law allow) and the
   burst guard (:meth:`OnlineMPCController.burst_floor`): while a prompt backlog is
   prefilled, a clock that drains it within the TTFT target and, beside decoding
   requests, whose mixed iteration fits the TPOT SLO. These measured-latency rules live
   in :mod:`controllers.online.rules`.

Before the warm-up windows are in, the clock stays at the maximum (``docs/online.md``).
With an SLO target, an :class:`~controllers.budget.AttainmentBudget` measures the
attainment from the observation's counters and scales the MPC's margin, the SLO
feedback's and the exploration's thresholds and ``uncertainty_z`` by its looseness; while
it is ahead of its target, the back-off and the burst guard's short-answer rule stand down.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from time import perf_counter
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.adaptation import BurstHedge, SLOFeedback
from gpugov.controllers.budget import AttainmentBudget, SLOTarget
from gpugov.controllers.contract import PowerNeed
from gpugov.controllers.mpc.controller import (
    DEFAULT_EXPECTED_OUTPUT_TOKENS,
    DEFAULT_EXPECTED_PROMPT_TOKENS,
    MPCController,
    arrival_baseline,
)
from gpugov.controllers.mpc.fast import DiscreteSearchSolver
from gpugov.controllers.mpc.search_kernel import compile_kernels
from gpugov.controllers.online.efficiency import WorkMix, domain_floor
from gpugov.controllers.online.engines import engine_view
from gpugov.controllers.online.exploration import (
    ArrivalClumping,
    BacklogAge,
    LatencyWindow,
    SafeExploration,
)
from gpugov.controllers.online.identification import REFERENCE_BATCH, ModelPrior, OnlineModel
from gpugov.controllers.online.learned_plant import (
    ONLINE_STATUS,
    LearnedPlant,
    published_kv_capacity,
)
from gpugov.controllers.online.model_names import SettledName
from gpugov.controllers.online.prediction import compile_prediction
from gpugov.controllers.online.prior import AutoHints
from gpugov.controllers.online.regression import compile_regression
from gpugov.controllers.online.rules import MeasuredLatencyRules
from gpugov.controllers.online.window import PromptEstimate, window_between
from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import MPCDiagnostics, ServingObservation, replace_observation

FloatArray = NDArray[np.float64]

UNCAPPED_POWER_SCALE_W = 300.0
"""Scale of the power prior (not a cap) when no power limit, hint or reading is known."""
HORIZON_PERIODS = 10
"""Default horizon, in control periods: the MPC plans ten decisions ahead whatever the
period (2.5 s at 0.25 s), so a shorter period buys faster reactions without a longer
solve (``docs/online.md``, "Cost")."""
ONLINE_SEARCH: dict[str, Any] = {
    "coarse_levels": 10,
    "constant_stride": 4,
    "late_step_levels": 2,
    "starts": 2,
    "maximum_trials": 300,
}
"""The discrete search ``mpc-online`` solves with (:class:`DiscreteSearchSolver`): a
leaner pool and local search than ``mpc``'s, sized so that the whole decision fits in
about a millisecond; its plans cost the MPC at most a few per cent more than the full
search's, and every decision still passes the exploration floor, the burst guard and
the decode descent (``bench/decision_time.py``, ``docs/online.md``)."""


class SettingsRefuseModel(ValueError):
    """A stored model that passes its own checks but gives no usable profile with the
    controller's settings: the settings' fault, so the stored file is not to blame."""


class OnlineMPCController(MeasuredLatencyRules):
    """Fast MPC on a model identified online (module notes). A :class:`ClockController`.

    Args:
        mean_prompt_tokens, mean_output_tokens, ttft_prompt_tokens: declared forecasts.
        horizon_s, control_period_s, solve_time_limit_s: as :class:`MPCController`;
            the horizon defaults to :data:`HORIZON_PERIODS` control periods.
        slo_margin: base margin of the MPC's latency targets (the uncertainty widens it).
        ttft_slo_s, tpot_slo_s: SLOs used when the observation carries none.
        thermal_limit_c: used when the observation carries none.
        memory_s: forgetting horizon of the identification.
        warmup_s: seconds of busy windows at the maximum clock before the MPC takes over.
        hinted_warmup_s: the same once a hint (``prior`` or :attr:`auto_hints`) has given
            the clock shape: the warm-up then only centres it on the top clock.
        uncertainty_z: standard deviations added to predicted latencies.
        prior: optional rough prior (:class:`ModelPrior`).
        auto_hints: where no ``prior`` is given, the hints the node derives itself
            (:class:`AutoHints`: GPU family from NVML's name, model size from the
            engine's ``model_name``), asked when the first name arrives and when it
            changes; None: no prior but ``prior``.
        power_limit_w: the domain's summed enforced power limit known at start (NVML),
            used when an observation carries none; else the prior's board power (TDP x
            GPUs, a hint); else no cap is assumed (:meth:`power_cap_w`).
        exploration: the :class:`SafeExploration` policy.
        latency_window_s: the latency-driven rules (back-off, exploration slack, decode
            descent, SLO feedback) read the engine's windowed latencies averaged over at
            least this long (:class:`LatencyWindow`); the queue signals stay per tick.
        slo_target: when given, spend the SLO budget (:mod:`controllers.budget`): the
            looseness of an :class:`AttainmentBudget` scales the MPC's margin, the SLO
            feedback's and the exploration's thresholds, and divides ``uncertainty_z``,
            within ``[slo_margin, 1 / slo_margin]``.
        mpc_options: more :class:`MPCController` keyword arguments.
    """

    def __init__(
        self,
        *,
        mean_prompt_tokens: float = DEFAULT_EXPECTED_PROMPT_TOKENS,
        mean_output_tokens: float = DEFAULT_EXPECTED_OUTPUT_TOKENS,
        ttft_prompt_tokens: float | None = None,
        horizon_s: float | None = None,
        control_period_s: float = 1.0,
        solve_time_limit_s: float = 0.8,
        slo_margin: float = 0.7,
        ttft_slo_s: float | None = None,
        tpot_slo_s: float | None = None,
        thermal_limit_c: float | None = None,
        memory_s: float = 900.0,
        warmup_s: float = 20.0,
        hinted_warmup_s: float = 5.0,
        uncertainty_z: float = 1.5,
        knots: int = 8,
        prior: ModelPrior | None = None,
        auto_hints: AutoHints | None = None,
        power_limit_w: float | None = None,
        exploration: SafeExploration | None = None,
        latency_window_s: float = 0.5,
        burst_guard: bool = True,
        decode_descent: bool = True,
        slo_target: SLOTarget | None = None,
        timer: Callable[[], float] = perf_counter,
        **mpc_options: Any,
    ) -> None:
        for name, value in (
            ("mean_prompt_tokens", mean_prompt_tokens),
            ("mean_output_tokens", mean_output_tokens),
            ("control_period_s", control_period_s),
            ("memory_s", memory_s),
            ("warmup_s", warmup_s),
            ("hinted_warmup_s", hinted_warmup_s),
        ):
            if not math.isfinite(value) or value <= 0.0:
                raise ValueError(f"{name} must be finite and positive, got {value!r}")
        for name, value in (("warmup_s", warmup_s), ("hinted_warmup_s", hinted_warmup_s)):
            if not math.isfinite(value / control_period_s):
                raise ValueError(f"{name} spans too many control periods to count, got {value!r}")
        if not math.isfinite(uncertainty_z) or uncertainty_z < 0.0:
            raise ValueError(f"uncertainty_z must be >= 0, got {uncertainty_z!r}")
        self.mean_prompt_tokens = float(mean_prompt_tokens)
        self.mean_output_tokens = float(mean_output_tokens)
        self.ttft_prompt_tokens = ttft_prompt_tokens
        self.control_period_s = float(control_period_s)
        self.horizon_s = (
            HORIZON_PERIODS * self.control_period_s if horizon_s is None else float(horizon_s)
        )
        self.solve_time_limit_s = float(solve_time_limit_s)
        self.slo_margin = float(slo_margin)
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s
        self.thermal_limit_c = thermal_limit_c
        self.memory_s = float(memory_s)
        self.warmup_windows = max(1, int(math.ceil(warmup_s / control_period_s)))
        self.hinted_warmup_windows = max(1, int(math.ceil(hinted_warmup_s / control_period_s)))
        self.uncertainty_z = float(uncertainty_z)
        self.knots = int(knots)
        self.prior = prior
        self.auto_hints = auto_hints
        self.auto_prior: ModelPrior | None = None
        """The prior :attr:`auto_hints` gave for the served model (None: none yet)."""
        self._hinted_name: str | None = None
        self.utilization_seen = False
        """NVML reported a utilisation once: a window without one is a read that failed
        (not used), not a GPU that reports none (MIG: busy time from the engine)."""
        self._clocks_agreed: tuple[OnlineModel, tuple[float, ...]] | None = None
        """The model and the supported clocks last found to agree (a list that changes
        is rare; comparing the tuple again is cheaper than sorting it every period)."""
        self.power_limit_w = power_limit_w
        self.last_power_limit_w: float | None = None
        self.exploration = exploration or SafeExploration()
        self.latency_window = LatencyWindow(latency_window_s)
        self.burst_guard = bool(burst_guard)
        self.decode_descent = bool(decode_descent)
        self.clumping = ArrivalClumping()
        self._prefill_pressures: deque[tuple[float, float, float, float]] = deque()
        """(time, TTFT pressure, one period over that TTFT SLO, the clock it was measured
        at) over the last :data:`PARK_MEMORY_S` (idle parking, the arrival floor)."""
        self._decode_pressures: deque[tuple[float, float, float, float]] = deque()
        """(time, TPOT pressure, clock it was measured at, running requests) measured over
        the last :data:`PARK_MEMORY_S` (idle parking)."""
        self._decode_park_cache: tuple[tuple[object, ...], float] | None = None
        """The idle decode pool's last parking bound and what it was computed from
        (the threshold, the TPOT windows' count, first and last)."""
        self._last_requested_mhz: float | None = None
        """The clock the previous observation's window ran at (a TPOT window's tokens
        can come from the period before)."""
        self.backlog_age = BacklogAge()
        self.work_mix = WorkMix()
        self.budget = (
            None
            if slo_target is None
            else AttainmentBudget(
                slo_target, tightest=min(1.0, self.slo_margin), loosest=1.0 / self.slo_margin
            )
        )
        self.timer = timer
        self.mpc_options = mpc_options
        self.model: OnlineModel | None = None
        self.mpc: MPCController | None = None
        self.arrivals_baseline: int | None = None
        """The engine's arrival counter at the first observation where it had completed
        requests (a node started under load: a lifetime, not arrivals), else 0; the MPC,
        built later, counts arrivals from it."""
        self.model_name: str | None = None
        self.settled_name = SettledName()
        self.previous: ServingObservation | None = None
        self.current_clock: float | None = None
        self.prompt_estimate = PromptEstimate()
        self.update_times_s: list[float] = []
        self.history_limit: int | None = None
        """Plans and solve times its MPC keeps (``HistoryBounded``; a node bounds it)."""
        self.resets = 0
        self.last_reason = "start"
        self._mpc_decided = False
        """Whether the MPC decided at the last call (its need is the current load's)."""
        self._learned = LearnedPlant()
        self.pooled_waiting = 0.0
        self.engines = 1
        """Data-parallel engines the last observation pooled: the controller learns and
        plans one of them (:func:`controllers.online.engines.engine_view`)."""
        self.last_temperature_c: float | None = None
        """The last finite temperature observed (the MPC plans from it, carried forward by
        its thermal RC, while a reading is NaN)."""
        self.last_temperature_s = -math.inf
        """When :attr:`last_temperature_c` was read (observation time)."""
        self.__name__ = "mpc_online_clock"
        # Compile (or load from numba's cache) the kernels now, when the node builds the
        # controller: the model's first update and the MPC's first solve come later,
        # inside a control period, where a cold compile would stall the loop for seconds.
        compile_regression()
        compile_prediction()
        compile_kernels()

    # ----------------------------------------------------------------- model
    def _new_model(self, observation: ServingObservation) -> OnlineModel:
        clocks = observation.supported_clocks_mhz
        if len(clocks) < 2:
            raise ValueError("mpc-online needs the supported clocks in the observation")
        power_scale = self.power_cap_w(observation)
        if power_scale is None:
            measured = observation.power_w
            power_scale = (
                2.0 * measured
                if measured is not None and math.isfinite(measured) and measured > 0.0
                else UNCAPPED_POWER_SCALE_W
            )
        return OnlineModel(
            clocks,
            power_scale,
            knots=self.knots,
            memory_s=self.memory_s,
            period_s=self.control_period_s,
            warmup_windows=self.warmup_windows,
            hinted_warmup_windows=self.hinted_warmup_windows,
            prior=self.active_prior,
        )

    @property
    def active_prior(self) -> ModelPrior | None:
        """The prior in use: the configured one, else the automatic hints' one."""
        return self.prior if self.prior is not None else self.auto_prior

    def power_cap_w(self, observation: ServingObservation) -> float | None:
        """The domain's power cap (one engine's share where it pools several): the
        observation's (NVML, every tick), else the last one
        an observation carried, else the enforced limit known at start, else the hinted
        board power (TDP x GPUs); None when nothing is known (no cap is assumed)."""
        prior = self.active_prior
        board = None if prior is None else prior.board_power_w
        start = None if self.power_limit_w is None else self.power_limit_w / self.engines
        for value in (
            observation.power_limit_w,
            self.last_power_limit_w,
            start,
            board,
        ):
            if value is not None and math.isfinite(value) and value > 0.0:
                if value is observation.power_limit_w:
                    self.last_power_limit_w = float(value)
                return float(value)
        return None

    def reset(self, observation: ServingObservation | None = None) -> None:
        """Forget the learned model (another model served, another GPU); re-learn."""
        self.model = None
        if observation is not None:
            self._follow_name(observation.model_name)
            self.model = self._new_model(observation)
        self.mpc = None
        self.exploration = replace(
            self.exploration,
            baseline=None,
            backoff_until_s=-math.inf,
            floor_mhz=None,
            exploring=False,
            raised_floor_mhz=None,
            calm_count=0,
            raise_steps=1,
        )
        self.previous = observation
        self.resets += 1

    def restore(self, state: dict[str, Any], observation: ServingObservation) -> None:
        """Start from a stored model (:meth:`OnlineModel.state_dict`).

        Raises:
            ValueError: the state does not fit this node's clocks or version.
        """
        self._follow_name(observation.model_name)
        model = self._new_model(observation)
        model.load_state(state, observation.role)
        previous, self.model = self.model, model
        try:
            self.check_learned(self.slos(observation))
        except ValueError:
            self.model = previous
            raise

    def check_learned(self, slos: tuple[float, float] | None = None) -> None:
        """Build the profile the MPC plans on from the model (``slos`` or placeholder
        ones: they do not enter its latencies): a stored state that passes its own checks
        can still describe no GPU (a latency of 1e308 s).

        Raises:
            ValueError: no usable profile comes out of the model at its mean.
            SettingsRefuseModel: one does, but not with this controller's settings
                (its ``uncertainty_z``): the settings' fault, not the stored model's.
        """
        slos = slos or (1.0, 0.1)
        try:
            with np.errstate(all="ignore"):
                self.learned_profile(slos, pessimistic=False)
        except (ValueError, OverflowError, FloatingPointError) as error:
            raise ValueError(f"stored model gives no usable profile: {error}") from None
        try:
            with np.errstate(all="ignore"):
                self.learned_profile(slos)
        except (ValueError, OverflowError, FloatingPointError) as error:
            raise SettingsRefuseModel(
                f"stored model gives no usable profile with uncertainty_z = "
                f"{self.uncertainty_z:g}: {error}"
            ) from None

    def slos(self, observation: ServingObservation) -> tuple[float, float] | None:
        """(TTFT SLO, TPOT SLO): the observation's, else the configured ones."""
        ttft = observation.ttft_slo_s or self.ttft_slo_s
        tpot = observation.tpot_slo_s or self.tpot_slo_s
        if ttft is None or tpot is None:
            return None
        return float(ttft), float(tpot)

    def learned_profile(
        self, slos: tuple[float, float], *, pessimistic: bool = True
    ) -> PerformanceProfile:
        """The model as a profile over the supported clocks: latencies at the mean plus
        ``uncertainty_z`` standard deviations (``pessimistic``), powers at the mean
        (:meth:`LearnedPlant.profile`)."""
        model = self.model
        assert model is not None
        z = self.effective_z if pessimistic else 0.0
        return self._learned.profile(model, slos, z, self.context_tokens, self.model_name)

    def learned_plant(
        self, observation: ServingObservation, slos: tuple[float, float]
    ) -> ServingPlant:
        """The plant the MPC plans on (:meth:`LearnedPlant.plant`)."""
        model = self.model
        assert model is not None
        return self._learned.plant(
            observation,
            self.learned_profile(slos),
            model,
            thermal_limit_c=self.thermal_limit_c,
            cap_w=self.power_cap_w(observation),
            control_period_s=self.control_period_s,
        )

    def _mpc(self, plant: ServingPlant, *, kv_known: bool = False) -> MPCController:
        if self.mpc is None:
            options: dict[str, Any] = {
                "solver": DiscreteSearchSolver(**ONLINE_SEARCH),
                "latency_model": "iteration",
                "slo_margin": self.slo_margin,
                "burst_hedge": BurstHedge(),
                "slo_feedback": SLOFeedback(),
                "slo_budget": self.budget,
                "feedback_yields_when_ahead": True,
                # The burst guard drains a long prompt that does arrive: the MPC need
                # not hold the clock for one ahead (docs/online.md).
                "tail_yields_to_budget": self.burst_guard,
                "ttft_excess_cap": 1.0,
                "hold_top_when_place_lost": True,
                **self.mpc_options,
            }
            if self.ttft_prompt_tokens is not None:
                options["ttft_prompt_tokens"] = self.ttft_prompt_tokens
            self.mpc = MPCController(
                plant,
                mean_prompt_tokens=self.mean_prompt_tokens,
                mean_output_tokens=self.mean_output_tokens,
                horizon_s=self.horizon_s,
                control_period_s=self.control_period_s,
                solve_time_limit_s=self.solve_time_limit_s,
                timer=self.timer,
                **options,
            )
            self.mpc.previous_arrived_count = self.arrivals_baseline
        else:
            self.mpc.plant = plant
        self.mpc.history_limit = self.history_limit
        # A tick with no temperature is planned from the last one this controller read
        # (its warm-up's too, which the MPC did not see), carried forward by the MPC.
        self.mpc.remember_temperature(self.last_temperature_c, self.last_temperature_s)
        # The wait for a batch place counts what the KV cache holds only where the engine
        # published its cache: the plant's default is no node's (MPCController).
        self.mpc.kv_batch_bound = kv_known
        return self.mpc

    # ---------------------------------------------------------------- control
    def observe(self, observation: ServingObservation) -> None:
        """Fold ``observation`` into the model (resets on a model-name change)."""
        self._observe_engine(self._one_engine(observation))

    def _one_engine(self, observation: ServingObservation) -> ServingObservation:
        """``observation`` as one of the engines it pools sees it. Where the engine count
        changed, the counters changed scale: the next window is not learned from, and the
        MPC counts arrivals afresh; the automatic hints' prior, which is one engine's (its
        share of the domain's GPUs), is asked again."""
        engines = observation.engines
        if engines != self.engines:
            self.engines = engines
            self.previous = None
            self.mpc = None
            self.arrivals_baseline = None
            self._hinted_name = None
        self.pooled_waiting = float(observation.waiting_requests)
        return engine_view(observation)

    def _observe_engine(self, observation: ServingObservation) -> None:
        """:meth:`observe` of one engine's view."""
        if self.arrivals_baseline is None:
            self.arrivals_baseline = arrival_baseline(observation)
        if math.isfinite(observation.temperature_c):
            self.last_temperature_c = float(observation.temperature_c)
            self.last_temperature_s = float(observation.time_s)
        name = self.settled_name.update(observation.model_name, self.model_name)
        self._follow_name(name)
        if name is not None and self.model_name is not None and name != self.model_name:
            self.reset(observation)
        if name is not None:
            self.model_name = name
        if self.model is not None and self._clocks_changed(observation):
            self.reset(observation)
        if self.model is None:
            self.model = self._new_model(observation)
            self.previous = observation
            return
        previous = self.previous
        self.previous = observation
        if previous is None:
            return
        if observation.model_name not in (None, self.model_name):
            # Another name, not settled yet: the window may be the new model's, which
            # must not teach (nor be stored in) the model of the name held.
            return
        start = self.timer()
        self.prompt_estimate.update(previous, observation)
        if observation.gpu_utilization is not None:
            self.utilization_seen = True
        window = window_between(
            previous,
            observation,
            self.prompt_estimate.value,
            busy_from_engine=not self.utilization_seen,
        )
        if window is not None:
            self.model.update(window)
        self.update_times_s.append(self.timer() - start)
        if len(self.update_times_s) > 4096:
            del self.update_times_s[:2048]

    def _clocks_changed(self, observation: ServingObservation) -> bool:
        """Whether ``observation`` offers other supported clocks (two or more) than the
        model was learned on: its clock-indexed fit then plans clocks the GPU lacks."""
        model = self.model
        offered = observation.supported_clocks_mhz
        agreed = self._clocks_agreed
        if model is None or (agreed is not None and agreed[0] is model and agreed[1] == offered):
            return False
        clocks = np.unique(np.asarray(offered, dtype=float))
        if clocks.size < 2:
            return False
        changed = clocks.shape != model.clocks_mhz.shape or not np.array_equal(
            clocks, model.clocks_mhz
        )
        if not changed:
            self._clocks_agreed = (model, tuple(offered))
        return changed

    def _follow_name(self, name: str | None) -> None:
        """On a served model name not seen before, ask the automatic hints for its prior
        (not when a prior is configured). A model still in its warm-up takes the prior's
        clock shape at once (the first name often arrives after the first observation);
        on a name change the model is reset after this, from the new prior."""
        if name is None or name == self._hinted_name:
            return
        self._hinted_name = name
        if self.auto_hints is None or self.prior is not None:
            return
        self.auto_prior = self.auto_hints.prior_for(name, engines=self.engines)
        model = self.model
        if model is not None and self.auto_prior is not None:
            model.adopt_hint(self.auto_prior)

    def __call__(self, observation: ServingObservation) -> float:
        self._mpc_decided = False
        clocks = observation.supported_clocks_mhz
        if len(clocks) == 1:
            # A GPU with one supported clock: nothing to choose, and no clock response to
            # learn (a model needs two clocks). Every tick had raised, and a node stops
            # after a run of controller failures.
            self.last_reason = "one clock"
            self.current_clock = float(clocks[0])
            return self.current_clock
        pooled = observation
        observation = self._one_engine(observation)
        self._observe_engine(observation)
        # The oldest waiting prompt's age and the SLO window's misses are the pool's.
        self.backlog_age.update(pooled)
        self.work_mix.update(observation)
        observation = self.latency_window.view(observation)
        self.clumping.update(observation)
        if self.budget is not None:
            self.exploration.looseness = self.budget.update(pooled)
            observation = self._tail_backlog(observation)
        model = self.model
        assert model is not None
        maximum = float(model.clocks_mhz[-1])
        slos = self.slos(observation)
        self.exploration.observe_top(observation, maximum)
        parked = self.idle_prefill_clock(observation, slos)
        # An idle prefill pool past the warm-up parked at the lowest clock is the
        # decision; parked higher (its measured TTFT leaves less than a period's room
        # there) it caps the MPC's, as a colocated GPU's parking does.
        lowest = parked is not None and parked <= float(model.clocks_mhz[0])
        if not self.spending and self.exploration.backing_off(observation, maximum):
            self.last_reason = "backoff"
        elif parked is not None and (
            (observation.role == "prefill" and lowest) or not model.warmed_up
        ):
            self.last_reason = "idle-park"
            self.current_clock = parked
            if self.mpc is not None:
                self.mpc.current_clock = parked
            return parked
        elif not model.warmed_up:
            self.last_reason = "warm-up"
        elif slos is None:
            self.last_reason = "no SLO known"
        else:
            plant = self.learned_plant(observation, slos)
            mpc = self._mpc(plant, kv_known=published_kv_capacity(observation) is not None)
            decision = float(mpc(observation))
            self._mpc_decided = True
            floor = self.exploration.floor(model, observation, self.effective_z)
            guard = self.burst_floor(observation, slos) if self.burst_guard else None
            window = self.descent_window(observation, slos) if self.decode_descent else None
            # What the MPC and the exploration floor alone would give.
            undescended = max(decision, floor)
            if window is not None:
                # Every clock from the window's bound up is safe by the measured latency
                # and the 1/f law, not by the model: the exploration floor (model
                # uncertainty) does not bind below that bound, so the MPC's own lower
                # decision passes too; the floor back-offs left still binds.
                bound, descent = window
                decision = min(decision, descent)
                floor = max(min(floor, bound), self.exploration.backoff_floor(model.clocks_mhz))
            efficient = self.efficient_clock(observation)
            arrival = self.arrival_floor(observation)
            self.current_clock = max(decision, floor, guard or 0.0, efficient, arrival)
            in_hand = (
                observation.waiting_requests > 0
                or observation.decode_active > 0
                or observation.prefill_remaining_tokens > 0.0
            )
            if self.overspent and in_hand:
                # The window's budget is spent and requests still miss (an engine past its
                # capacity, or a model wrong about it): the work in hand is served at the
                # top clock, past the MPC, the descents and the floors, until they stop.
                self.current_clock = maximum
                self.last_reason = "overspent"
                return self.current_clock
            if parked is not None and max(parked, guard or 0.0) < self.current_clock:
                # An idle colocated GPU past the warm-up (or a prefill pool parked above
                # its lowest clock): the MPC's fluid model spreads
                # the expected prompts over every period and prices each as prefilled at
                # that period's clock, where one arriving is raised at the next decision.
                # The parking bound caps it (the clump floor and the efficiency floor
                # kept: on a board where a slower clock costs more, a prompt landing in
                # the idle period is prefilled dearer there).
                self.current_clock = max(parked, guard or 0.0, efficient)
                self.last_reason = "idle-park" if parked >= efficient else "efficiency-floor"
            elif efficient > max(decision, floor, guard or 0.0):
                self.last_reason = "efficiency-floor"
            elif arrival > max(decision, floor, guard or 0.0):
                self.last_reason = "arrival-floor"
            elif guard is not None and guard > max(decision, floor):
                self.last_reason = "burst-guard"
            elif window is not None and self.current_clock < undescended - 1e-9:
                # Lowered by the descent: its clock, or the MPC's decision its bound let
                # below the floor.
                self.last_reason = "decode-descent"
            elif decision < floor:
                self.last_reason = "explore-floor"
            else:
                self.last_reason = "mpc"
            return self.current_clock
        self.exploration.exploring = False
        clock = maximum
        if self.last_reason == "warm-up" and slos is not None and self.warmup_drains(observation):
            # A prefill pool's backlog in the warm-up: the burst guard's drain, priced by
            # the warm-up's fit, whose knots move together (the compute-bound 1/f law from
            # where the busy windows ran: pessimistic below them), once a second of busy
            # windows is in. A prefill pool runs one phase, so there is no decode mix
            # for the missing clock shape to misprice.
            guard = self.burst_floor(observation, slos, self.park_share(observation))
            if guard is not None:
                clock = guard
                self.last_reason = "warm-up-guard"
        elif self.last_reason == "warm-up" and slos is not None and self.decode_descent:
            # The decode descent's bound needs no model (the measured latency and the 1/f
            # law), so a decode-only window need not wait for the warm-up at the top. The
            # bound itself, not the model's pick among the clocks above it: the model has
            # no evidence yet to price them.
            window = self.descent_window(observation, slos)
            if window is not None:
                clock = max(window[0], self.arrival_floor(observation))
                self.last_reason = "warm-up-descent"
        self.current_clock = clock
        if self.mpc is not None:
            # Keep the MPC's notion of the applied clock (its clock-change penalty).
            self.mpc.current_clock = clock
        return clock

    def efficient_clock(self, observation: ServingObservation) -> float:
        """The efficiency floor (:mod:`controllers.online.efficiency`) of the domain's
        recent work; 0 before the model exists."""
        if self.model is None:
            return 0.0
        return domain_floor(
            self.model,
            self.work_mix,
            observation.role,
            self.effective_z,
            self.exploration.minimum_visits,
        )

    def _tail_backlog(self, observation: ServingObservation) -> ServingObservation:
        """``observation`` with its prompt backlog at the tail estimate while the SLO
        window cannot afford one more miss (:attr:`AttainmentBudget.affordable`).

        A node sees no prompt's length before its first token: the backlog prices a
        prompt in its prefill at its expected rest, and one far longer (Mooncake's 100k-token
        prompts) holds every prompt queued behind it on its engine for its whole rest.
        Where a miss is still affordable that risk is the budget's to spend; where none is,
        the prompt is planned at the rest only the target's share of prompts exceed
        (``prefill_tail_tokens``), so that a short prompt behind it does not miss."""
        budget = self.budget
        tail = observation.prefill_tail_tokens
        if (
            budget is None
            or budget.affordable
            or tail is None
            or not tail > observation.prefill_remaining_tokens
        ):
            return observation
        return replace_observation(observation, {"prefill_remaining_tokens": tail})

    def warm_kernels(self, observation: ServingObservation) -> None:
        """Run once, on this object, the compiled code a decision past the warm-up runs:
        the regression step, the model's tables and the MPC's search. The daemon calls it
        on a copy before its loop starts (:func:`daemon.decide.warm_up`), so the kernels
        are compiled or loaded from numba's cache there, not at the first busy window or
        the first decision after the warm-up, seconds into a run; likewise the fits a
        hint's prior needs for this GPU (:meth:`AutoHints.warm`)."""
        if self.auto_hints is not None:
            self.auto_hints.warm()
        observation = self._one_engine(observation)
        self._observe_engine(observation)
        model = self.model
        assert model is not None
        model.time.update(np.zeros_like(model.time.mean), 0.0)
        slos = self.slos(observation) or (1.0, 0.05)
        realized = model.clocks_mhz * model.realized_ratio
        model.table(realized, 1.0, self.context_tokens)
        plant = self.learned_plant(observation, slos)
        mpc = self._mpc(plant, kv_known=published_kv_capacity(observation) is not None)
        mpc(observation)

    def power_needed(self) -> PowerNeed | None:
        """The power the domain needs to hold its SLO at the current load, by the learned
        model: the inner MPC's need (:meth:`MPCController.power_needed`) on the learned
        profile, whose latencies are pessimistic (mean + ``uncertainty_z`` standard
        deviations, so the clock is one the model is sure holds the SLO), with the
        power model's standard deviation at that clock as its uncertainty (the larger
        of the prefill and decode powers': a period's power mixes the two, so its
        deviation is no larger). In a back-off (the top clock held on measured latency)
        it is the need of the last MPC decision; None while there is none to trust
        (before the MPC first decided, in the warm-up, with no SLO known, or parked idle
        without an MPC decision). An idle GPU parked below the MPC's decision reports the
        need of that decision: the load now, which the parking only caps."""
        model = self.model
        if self.mpc is None or model is None:
            return None
        if self.last_reason in _NO_NEED_REASONS and not (
            self.last_reason == "idle-park" and self._mpc_decided
        ):
            return None
        need = self.mpc.power_needed()
        if need is None:
            return None
        realized = model.realized_mhz(need.clock_mhz)
        deviation = max(model.phase_power_w(realized, phase)[1] for phase in ("prefill", "decode"))
        need = replace(need, uncertainty_w=float(deviation))
        if self.engines == 1:
            return need
        # One engine's need, planned on its view: the domain's is the engines' sum.
        engines = float(self.engines)
        return replace(
            need,
            watts=need.watts * engines,
            uncertainty_w=need.uncertainty_w * engines,
            curve_w=tuple(w * engines for w in need.curve_w),
            peak_w=None if need.peak_w is None else need.peak_w * engines,
        )

    def diagnostics(self) -> MPCDiagnostics:
        """The inner MPC's solve statistics (empty before the MPC first ran)."""
        if self.mpc is not None:
            return self.mpc.diagnostics()
        return MPCDiagnostics(
            solve_times_s=np.zeros(0),
            successful_solves=0,
            fallback_count=0,
            control_period_s=self.control_period_s,
            horizon_steps=int(math.ceil(self.horizon_s / self.control_period_s)),
            solve_time_limit_s=self.solve_time_limit_s,
            fallback_reasons={},
        )

    @property
    def fallback_reasons(self) -> dict[str, int]:
        """The inner MPC's fallbacks by reason (exported as ``controller_<reason>``)."""
        return {} if self.mpc is None else dict(self.mpc.fallback_reasons)

    def status(self) -> dict[str, Any]:
        """What the exporter and ``gpugov model show`` report about the learning."""
        model = self.model
        if model is None:
            return {
                "samples": 0,
                "confidence": 0.0,
                "exploring": False,
                "warmed_up": False,
                "skipped_nonfinite_windows": 0,
            }
        return {
            "samples": model.samples,
            "skipped_nonfinite_windows": model.skipped_nonfinite_windows,
            "skipped_nonfinite": {
                **model.skipped_nonfinite,
                "prompt_estimate": self.prompt_estimate.skipped_nonfinite,
            },
            "confidence": model.confidence(),
            "exploring": self.exploration.exploring,
            "warmed_up": model.warmed_up,
            "residual_rms": model.residual_rms(),
            "floor_mhz": self.exploration.floor_mhz,
            "lowest_explored_mhz": model.lowest_explored_mhz(self.exploration.minimum_visits),
            "backoffs": self.exploration.backoffs,
            "top_clock_pressure": self.exploration.baseline,
            "arrival_clumping": self.clumping.share,
            "resets": self.resets,
            "prior": None if self.active_prior is None else self.active_prior.source,
            "slo_budget": None if self.budget is None else self.budget.status(),
            "reason": self.last_reason,
            "model_name": self.model_name,
        }


_NO_NEED_REASONS = frozenset(
    {
        "start",
        "warm-up",
        "warm-up-descent",
        "warm-up-guard",
        "idle-park",
        "no SLO known",
        "one clock",
    }
)
"""The ``last_reason`` values of a decision with no model need to report."""


def prior_from_profile(profile: PerformanceProfile) -> ModelPrior:
    """A rough :class:`ModelPrior` from a profile (a config hint: a bundled profile to
    start from), read once when the controller is built, never during control."""
    top = profile.maximum_clock_mhz
    return ModelPrior(
        prefill_s_per_token=1.0 / profile.rate("prefill", top),
        decode_iteration_s=REFERENCE_BATCH / profile.rate("decode", top),
        idle_power_w=profile.power("idle", top),
        prefill_power_w=profile.power("prefill", top),
        decode_power_w=profile.power("decode", top),
    )


__all__ = [
    "ONLINE_STATUS",
    "OnlineMPCController",
    "SafeExploration",
    "prior_from_profile",
]
