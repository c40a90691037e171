"""The simulated node: a :class:`plant.PlantSimulation` behind the daemon's two roles.

``SimulatedBackend`` (the GPU) and ``SimulatedSource`` (the engine) share one
:class:`SimulatedNode`. Each tick the backend's ``sample()`` advances the plant to the
loop's clock and takes one observation (its latency window closes there); the source's
``scrape()`` in the same tick reads that same observation. The daemon's loop, observer,
safety wrappers, actuator and exporter run unchanged on top.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.engines import EngineSample
from gpugov.daemon.errors import NVML_ERROR_INVALID_ARGUMENT, GpuError, GpuUnavailable
from gpugov.daemon.observer import DEFAULT_TAIL_QUANTILE, DomainObserver
from gpugov.daemon.profile_identity import profile_gpu_name, profile_gpu_uuid
from gpugov.daemon.vllm_view import VllmCounters
from gpugov.plant import PlantSimulation
from gpugov.plant.closed_loop import ObservationView
from gpugov.plant.disaggregated import PoolView
from gpugov.plant.types import ServingObservation

if TYPE_CHECKING:
    from gpugov.controllers.budget import SLOTarget

APPLICATIONS_CLOCKS_SETTING = 0x2
"""nvmlClocksEventReasonApplicationsClocksSetting: a lock holds the clock below the top."""
SIMULATED_LOWEST_LIMIT_SHARE = 0.1
"""The lowest power limit a simulated GPU accepts, as a share of its board limit."""


class SimulatedNode:
    """The plant plus the clock that drives it.

    Args:
        simulation: the plant shell.
        clock: the loop's clock in simulated seconds.
        horizon_s: the plant never advances past this.
    """

    def __init__(
        self,
        simulation: PlantSimulation,
        clock: Callable[[], float],
        *,
        horizon_s: float | None = None,
    ) -> None:
        self.simulation = simulation
        self._clock = clock
        self.horizon_s = horizon_s
        self._observation: ServingObservation | None = None
        self._observed_at: float | None = None

    def advance(self, time_s: float) -> None:
        """Run the plant up to ``time_s`` (capped at the horizon)."""
        if self.horizon_s is not None:
            time_s = min(time_s, self.horizon_s)
        if time_s > self.simulation.time_s:
            # Like plant.simulate: end at the last completion, not at the next tick.
            self.simulation.advance_to(time_s, stop_when_done=True)

    def refresh(self) -> ServingObservation:
        """Advance to the clock's time and take this tick's observation (once per clock
        time: the GPUs of a multi-GPU domain share it, and observing resets the engine's
        latency window)."""
        now = self._clock()
        if self._observation is not None and self._observed_at == now:
            return self._observation
        self.advance(now)
        self._observation = self.simulation.observe()
        self._observed_at = now
        return self._observation

    def current(self) -> ServingObservation:
        """This tick's observation (taken now if the tick has none yet)."""
        return self._observation if self._observation is not None else self.refresh()

    @property
    def done(self) -> bool:
        """Every request has arrived and finished."""
        return self.simulation.done


class SimulatedBackend:
    """The plant's GPU as a :class:`~daemon.backend.GpuBackend`.

    A lock requests its upper clock from the plant (quantised down onto the supported
    clocks and clamped into their range, effective after the plant's actuation delay) and,
    below the top clock, shows ApplicationsClocksSetting among the clock event reasons as
    NVML does; a reset requests the maximum (an unlocked GPU under load).
    A tensor-parallel plant is one backend per GPU (``share = 1 / tensor_parallel``): each
    reports its share of the domain's power, energy and power limit and the domain's
    clock and temperature, so the observer's sums give back the plant's domain.
    """

    def __init__(self, node: SimulatedNode, label: str = "0", share: float = 1.0) -> None:
        self._node = node
        self._label = label
        self._share = float(share)
        profile = node.simulation.plant.profile
        self.uuid = profile_gpu_uuid(profile, int(label)) if label.isdigit() else None
        """The GPU's NVML UUID, of its profile and index
        (:func:`~daemon.profile_identity.profile_gpu_uuid`, as an emulated GPU's): a learned
        model is keyed on it, so one learned on another profile is never restored here."""
        clocks = profile.clock_mhz
        self._clocks = tuple(int(round(float(c))) for c in clocks)
        self.locks: deque[tuple[int, int]] = deque(maxlen=1000)  # the last writes, bounded
        self.resets = 0
        self.power_limits: deque[float] = deque(maxlen=1000)  # the last limits set (W)
        self._held_below_top = False
        self._closed = False

    @property
    def label(self) -> str:
        """The GPU label."""
        return self._label

    @property
    def name(self) -> str | None:
        """The GPU's name as NVML would give it, as an emulated GPU of the plant's profile
        is named (:func:`~daemon.profile_identity.profile_gpu_name`; None when the
        profile states none), so ``mpc-online`` hints from it as on a node."""
        return profile_gpu_name(self._node.simulation.plant.profile)

    def _check_open(self) -> None:
        """Refuse any call on a closed backend."""
        if self._closed:
            raise GpuUnavailable(f"GPU {self._label}: backend is closed", gpu=self._label)

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """The profile's clocks."""
        self._check_open()
        return self._clocks

    def sample(self) -> GpuSample:
        """Advance the plant to now and read its GPU."""
        self._check_open()
        observation = self._node.refresh()
        reasons = self._node.simulation.clock_event_reasons
        if self._held_below_top:
            reasons |= APPLICATIONS_CLOCKS_SETTING
        return GpuSample(
            gpu=self._label,
            power_w=None if observation.power_w is None else observation.power_w * self._share,
            energy_j=None if observation.energy_j is None else observation.energy_j * self._share,
            temperature_c=observation.temperature_c,
            sm_clock_mhz=observation.realized_clock_mhz,
            utilization=observation.gpu_utilization,
            clock_event_reasons=reasons,
            power_limit_w=(
                None
                if observation.power_limit_w is None
                else observation.power_limit_w * self._share
            ),
        )

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Ask the plant for ``max_mhz``.

        Raises:
            GpuError: ``min_mhz`` is above ``max_mhz`` (NVML's INVALID_ARGUMENT).
        """
        self._check_open()
        if int(min_mhz) > int(max_mhz):
            raise GpuError(
                f"GPU {self._label}: lock clocks to {int(min_mhz)},{int(max_mhz)} MHz failed: "
                f"the minimum is above the maximum (NVML code {NVML_ERROR_INVALID_ARGUMENT})",
                gpu=self._label,
                code=NVML_ERROR_INVALID_ARGUMENT,
            )
        self.locks.append((int(min_mhz), int(max_mhz)))
        granted = self._node.simulation.request_clock(float(max_mhz))
        self._held_below_top = granted < self._clocks[-1]

    def reset_clocks(self) -> None:
        """Ask the plant for its maximum clock."""
        self._check_open()
        self.resets += 1
        self._node.simulation.request_clock(float(self._clocks[-1]))
        self._held_below_top = False

    def _board_w(self) -> float:
        """This GPU's share of the plant's board limit (watts)."""
        return float(self._node.simulation.plant.power_limit_w) * self._share

    def power_limit_w(self) -> float:
        """This GPU's share of the power limit in force on the plant (its run-time cap,
        else the board limit)."""
        self._check_open()
        return float(self._node.simulation.gpu.enforced_power_limit_w) * self._share

    def power_limit_constraints_w(self) -> tuple[float, float] | None:
        """A tenth of the board limit to the board limit (this GPU's share): the plant
        accepts any positive cap up to the board limit; NVML GPUs accept about a quarter
        of it and up."""
        self._check_open()
        board = self._board_w()
        return SIMULATED_LOWEST_LIMIT_SHARE * board, board

    def set_power_limit(self, limit_w: float) -> None:
        """Cap the plant at ``limit_w`` for this GPU's share (the whole domain's cap is
        ``limit_w / share``); the board limit itself removes the cap.

        Raises:
            GpuError: ``limit_w`` is not a finite positive number of watts.
        """
        self._check_open()
        value = float(limit_w)
        if not (math.isfinite(value) and value > 0.0):
            raise GpuError(
                f"GPU {self._label}: set power limit to {limit_w!r} W failed: not a positive "
                f"number of watts (NVML code {NVML_ERROR_INVALID_ARGUMENT})",
                gpu=self._label,
                code=NVML_ERROR_INVALID_ARGUMENT,
            )
        self.power_limits.append(value)
        domain_w = value / self._share
        board = float(self._node.simulation.plant.power_limit_w)
        self._node.simulation.set_power_cap(None if domain_w >= board - 1e-9 else domain_w)

    def close(self) -> None:
        """Nothing to release; later calls raise :class:`~daemon.errors.GpuUnavailable`."""
        self._closed = True


ENGINE_VIEWS = ("vllm", "exact")
"""What the simulated engine publishes: what a vLLM V1 engine's page gives (what a node
sees), or the plant's exact state (its prompt backlog and SLO counts)."""


class SimulatedSource:
    """The plant's engine as an :class:`~daemon.engines.EngineSource`.

    Args:
        node: the simulated node.
        view: ``"vllm"``, what a vLLM V1 engine publishes (:mod:`daemon.vllm_view`): the
            daemon's observer derives the prompt backlog, the requests in their prefill
            and the SLO attainment from it, as on a node; ``"exact"``, the plant's exact
            state besides (the prompt backlog to the token, exact SLO counts).
    """

    def __init__(self, node: SimulatedNode, view: str = "exact") -> None:
        if view not in ENGINE_VIEWS:
            raise ValueError(f"view must be one of {', '.join(ENGINE_VIEWS)}, got {view!r}")
        self._node = node
        self.view = view
        self._counters = VllmCounters()

    def scrape(self, timeout_s: float | None = None) -> EngineSample:
        """This tick's engine state."""
        o = self._node.current()
        simulation = self._node.simulation
        counters = self._counters
        counters.update(simulation, o)
        if self.view == "vllm":
            return counters.sample(simulation, o)
        return EngineSample(
            engine="simulated",
            running_requests=o.decode_active,
            waiting_requests=o.waiting_requests,
            prompt_tokens_total=o.prompt_tokens_total,
            generation_tokens_total=o.output_tokens_total,
            finished_requests_total=float(o.completed_requests),
            arrived_requests_total=float(o.arrived_requests),
            kv_usage_ratio=(o.kv_tokens / o.kv_capacity_tokens) if o.kv_capacity_tokens else None,
            kv_capacity_tokens=o.kv_capacity_tokens,
            kv_tokens=o.kv_tokens,
            prefill_remaining_tokens=o.prefill_remaining_tokens,
            generated_decode_tokens=o.generated_decode_tokens,
            ttft_recent_s=o.ttft_recent_s,
            tpot_recent_s=o.tpot_recent_s,
            ttft_slo_s=o.ttft_slo_s,
            tpot_slo_s=o.tpot_slo_s,
            ttft_slo_per_prompt_token_s=o.ttft_slo_per_prompt_token_s,
            ttft_recent_prompt_tokens=o.ttft_recent_prompt_tokens,
            ttft_count_total=o.ttft_count_total,
            ttft_within_slo_total=o.ttft_within_slo_total,
            tpot_count_total=o.tpot_count_total,
            tpot_within_slo_total=o.tpot_within_slo_total,
            request_prompt_tokens_buckets=counters.prompt_lengths.buckets_le(),
            request_generation_tokens_buckets=counters.output_lengths.buckets_le(),
            iterations_total=float(simulation.iterations),
            iteration_tokens_total=float(simulation.iteration_tokens),
            model_name=o.model_name,
        )


def tail_quantile(slo_target: SLOTarget | None) -> float:
    """The quantile a domain's observer prices a long prompt's tail at
    (``prefill_tail_tokens``): its SLO target's attainment, else
    :data:`~daemon.observer.DEFAULT_TAIL_QUANTILE`."""
    return DEFAULT_TAIL_QUANTILE if slo_target is None else slo_target.attainment


def node_view(
    simulation: PlantSimulation,
    role: str = "colocated",
    *,
    quantile: float = DEFAULT_TAIL_QUANTILE,
) -> Callable[[], ServingObservation]:
    """What a vLLM node's daemon observes of ``simulation`` each tick: its observer over
    the plant's GPU and a ``vllm`` view of its engine, under the SLOs the plant's profile
    states (what a node's config would), for a domain of ``role`` (a pool of
    disaggregated serving: ``prefill`` or ``decode``), its prompt tail at ``quantile``
    (:func:`tail_quantile` of the domain's SLO target). For closed-loop runs
    (:func:`plant.simulate`'s ``view``, :func:`plant.simulate_disaggregated`'s): the
    simulation is advanced elsewhere."""
    profile = simulation.plant.profile
    node = SimulatedNode(simulation, lambda: simulation.time_s)
    observer = DomainObserver(
        [SimulatedBackend(node)],
        SimulatedSource(node, view="vllm"),
        stale_after_s=math.inf,
        ttft_slo_s=profile.ttft_slo_s,
        tpot_slo_s=profile.tpot_slo_s,
        thermal_limit_c=simulation.plant.thermal_limit_c,
        ttft_slo_per_prompt_token_s=profile.ttft_slo_per_prompt_token_s,
        clock=lambda: simulation.time_s,
        role=role,
        role_from_config=role != "colocated",
        tail_quantile=quantile,
    )
    step_s = simulation.plant.time_step_s

    def observe() -> ServingObservation:
        now = simulation.time_s
        step = int(round(now / step_s))
        return observer.observe(now, step, simulation.requested_clock_mhz).observation

    return observe


def observation_view(
    engine_view: str, slo_target: SLOTarget | None = None
) -> ObservationView | None:
    """The :func:`plant.simulate` ``view`` an ``engine_view`` name stands for:
    :func:`node_view` for ``vllm`` (as a domain with ``slo_target`` observes), None (the
    plant's exact state) for ``exact``.

    Raises:
        ValueError: not one of :data:`ENGINE_VIEWS`.
    """
    if engine_view not in ENGINE_VIEWS:
        raise ValueError(f"view must be one of {', '.join(ENGINE_VIEWS)}, got {engine_view!r}")
    if engine_view != "vllm":
        return None
    return partial(node_view, quantile=tail_quantile(slo_target))


def pool_view(engine_view: str, slo_target: SLOTarget | None = None) -> PoolView | None:
    """:func:`observation_view` for the pools of a disaggregated run
    (:func:`plant.simulate_disaggregated`'s ``view``): :func:`node_view` of each engine,
    as a domain of the pool's role with ``slo_target``, for ``vllm``; None for ``exact``.

    Raises:
        ValueError: not one of :data:`ENGINE_VIEWS`.
    """
    if observation_view(engine_view, slo_target) is None:
        return None
    return partial(node_view, quantile=tail_quantile(slo_target))
