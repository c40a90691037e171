"""The hindsight oracles per pool on a disaggregated layout: a clock per pool per window by
greedy forked search, and the fluid LP bound of each pool (rules in
``controllers/oracles/__init__.py``)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpugov.controllers.baseline import FixedClockController
from gpugov.controllers.oracles.bound import FluidEnergyBound, fluid_energy_lower_bound
from gpugov.controllers.oracles.common import SLO_TOLERANCE, FloatArray, drive_steps, holds_slo
from gpugov.controllers.oracles.window import (
    ScheduleController,
    _MissCounter,
    candidate_key,
    candidate_levels,
    coarse_levels_of,
    cumulative_outputs,
    joules_per_token,
    known_miss_times,
    miss_counter_for,
    search_steps,
    select_schedule,
)
from gpugov.plant.disaggregated import (
    DisaggregatedResult,
    DisaggregatedSimulation,
    simulate_disaggregated,
)
from gpugov.plant.disaggregated_layout import ROLES, DisaggregatedPlant
from gpugov.plant.types import Request

Pair = tuple[float, float]
"""A clock per pool: (prefill MHz, decode MHz)."""


# ------------------------------------------------------------------ fluid LP bound
@dataclass(frozen=True)
class PoolEnergyBound:
    """Result of :func:`pool_energy_lower_bound`: each pool's bound (its replicas serving
    its phase) and their sum, the layout's bound (joules)."""

    pools: dict[str, FluidEnergyBound]
    replicas: dict[str, int]

    @property
    def energy_j(self) -> float:
        """The layout's bound: the pools' bounds summed."""
        return sum(bound.energy_j for bound in self.pools.values())

    @property
    def success(self) -> bool:
        """Every pool's LP solved."""
        return all(bound.success for bound in self.pools.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form: the total and each pool's bound with its replicas and phase."""
        return {
            "energy_j": self.energy_j,
            "success": self.success,
            "pools": {
                role: {**bound.as_dict(), "replicas": self.replicas[role], "phases": [role]}
                for role, bound in self.pools.items()
            },
        }


def pool_energy_lower_bound(
    workload: Sequence[Request], layout: DisaggregatedPlant, *, window_s: float = 1.0
) -> PoolEnergyBound:
    """The fluid LP bound per pool (module notes of ``controllers/oracles``): the prefill
    pool serves every prompt token, the decode pool ``output_tokens - 1`` tokens per
    request, each pool's replicas together; the layout's bound is their sum.

    Raises:
        ValueError: as :func:`fluid_energy_lower_bound`.
    """
    pools: dict[str, FluidEnergyBound] = {}
    replicas: dict[str, int] = {}
    for role in ROLES:
        spec = layout.pool(role)
        replicas[role] = int(spec.replicas)
        pools[role] = fluid_energy_lower_bound(
            workload, spec.plant, window_s=window_s, replicas=spec.replicas, phases=(role,)
        )
    return PoolEnergyBound(pools, replicas)


# ------------------------------------------------------------------ window oracle
@dataclass(frozen=True)
class PoolWindowOracle:
    """Result of :func:`pool_window_oracle`.

    ``schedule_mhz[role][k]`` is pool ``role``'s clock in window ``k``; ``result`` is the
    schedule's replay with :func:`simulate_disaggregated`. ``attempts`` records every
    schedule tried (margin, energy, attainment, whether it held); ``source`` says which
    one was kept.
    """

    schedule_mhz: dict[str, tuple[float, ...]]
    window_s: float
    lookahead_s: float
    continuation_clocks_mhz: dict[str, float]
    result: DisaggregatedResult
    holds_slo: bool
    source: str
    attempts: tuple[dict[str, Any], ...]
    candidate_runs: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (the run's metrics are not repeated)."""
        return {
            "window_s": self.window_s,
            "lookahead_s": self.lookahead_s,
            "continuation_clocks_mhz": dict(self.continuation_clocks_mhz),
            "windows": len(self.schedule_mhz["prefill"]),
            "schedule_mhz": {role: list(clocks) for role, clocks in self.schedule_mhz.items()},
            "holds_slo": self.holds_slo,
            "source": self.source,
            "attempts": list(self.attempts),
            "candidate_runs": self.candidate_runs,
            "energy_j": self.result.metrics.energy_j,
            "pool_energy_j": {role: pool.energy_j for role, pool in self.result.pools.items()},
            "slo_attainment": self.result.metrics.slo_attainment,
        }


@dataclass
class _PoolSearch:
    """The settings of one pool search, shared by its margins."""

    window_steps: int
    lookahead_steps: int
    control_period_s: float
    horizon_s: float
    clocks_mhz: dict[str, FloatArray]
    continuation: dict[str, int]
    coarse: dict[str, tuple[int, ...]]
    neighbour_steps: tuple[int, ...]
    reference_miss_times: FloatArray
    cumulative_output_tokens: list[float]
    terminal_prefill_j_per_token: float
    terminal_output_j_per_token: float
    counter_template: _MissCounter = field(repr=False)

    def pair(self, indices: Mapping[str, int]) -> Pair:
        """The clocks of a pair of level indices."""
        return (
            float(self.clocks_mhz["prefill"][indices["prefill"]]),
            float(self.clocks_mhz["decode"][indices["decode"]]),
        )


def _drive_pair(
    simulation: DisaggregatedSimulation,
    pair: Pair,
    first_step: int,
    end_step: int,
    settings: _PoolSearch,
) -> bool:
    """Control steps ``[first_step, end_step)`` at ``pair``, as
    :func:`simulate_disaggregated` runs them (each pool observed, then its clock set)."""

    def decide() -> None:
        for role, clock in zip(ROLES, pair, strict=True):
            simulation.observe(role)
            simulation.request_clock(role, clock)

    return drive_steps(
        simulation,
        decide,
        first_step,
        end_step,
        settings.control_period_s,
        settings.horizon_s,
    )


def _terminal_energy(
    simulation: DisaggregatedSimulation, arrived: int, settings: _PoolSearch
) -> float:
    """Work left in a (forked) run: prompt tokens queued in the prefill pool at its
    continuation clock's joules per token, output tokens still to generate at the decode
    pool's."""
    prefill = simulation.observe("prefill")
    decode = simulation.observe("decode")
    generated = prefill.output_tokens_total + decode.output_tokens_total
    left_output = max(0.0, settings.cumulative_output_tokens[arrived] - generated)
    return (
        prefill.prefill_remaining_tokens * settings.terminal_prefill_j_per_token
        + left_output * settings.terminal_output_j_per_token
    )


def _choose_pair(
    main: DisaggregatedSimulation,
    counter: _MissCounter,
    previous: Mapping[str, int],
    first_step: int,
    settings: _PoolSearch,
    margin: float,
) -> tuple[dict[str, int], int]:
    """One window's coordinate-wise choice (module notes): the prefill pool's candidates
    with the decode pool at its previous clock, then the decode pool's with the prefill
    winner; (the chosen level per pool, forks run). A pair is forked once."""
    period = settings.control_period_s
    end_step = first_step + settings.window_steps
    look_end = end_step + settings.lookahead_steps
    continuation = settings.pair(settings.continuation)
    keys: dict[Pair, tuple[int, float, float]] = {}

    def score(indices: Mapping[str, int]) -> tuple[int, float, float]:
        """The ranking of running the window at ``indices`` (one fork)."""
        pair = settings.pair(indices)
        if pair not in keys:
            fork = main.fork()
            over = _drive_pair(fork, pair, first_step, end_step, settings)
            if not over:
                over = _drive_pair(fork, continuation, end_step, look_end, settings)
                if not over:
                    fork.advance_to(min(look_end * period, settings.horizon_s), stop_when_done=True)
            misses, arrived = counter.known_misses(fork)
            energy = fork.energy_j - main.energy_j + _terminal_energy(fork, arrived, settings)
            keys[pair] = candidate_key(
                misses, arrived, fork.time_s, settings.reference_miss_times, margin, energy
            )
        return keys[pair]

    chosen = dict(previous)
    for role in ROLES:
        best: tuple[tuple[int, float, float], int] | None = None
        for index in candidate_levels(
            settings.coarse[role],
            previous[role],
            settings.continuation[role],
            settings.neighbour_steps,
            settings.clocks_mhz[role].size,
        ):
            key = score({**chosen, role: index})
            # Ties: the higher clock.
            if best is None or key < best[0] or (key == best[0] and index > best[1]):
                best = (key, index)
        assert best is not None
        chosen[role] = best[1]
    return chosen, len(keys)


def _greedy_pools(
    requests: tuple[Request, ...],
    layout: DisaggregatedPlant,
    seed: int,
    settings: _PoolSearch,
    margin: float,
) -> tuple[list[Pair], int]:
    """One greedy forward search (module notes): (the clock pair of each window, forks)."""
    main = DisaggregatedSimulation(requests, layout, seed=seed)
    counter = copy.copy(settings.counter_template)
    schedule: list[Pair] = []
    previous = dict(settings.continuation)
    forks = 0
    window = 0
    while True:
        first_step = window * settings.window_steps
        if first_step * settings.control_period_s > settings.horizon_s + 1e-12:
            break
        main.advance_to(first_step * settings.control_period_s, stop_when_done=True)
        if main.done and window > 0:
            break
        counter.settle(main)
        previous, runs = _choose_pair(main, counter, previous, first_step, settings, margin)
        forks += runs
        schedule.append(settings.pair(previous))
        over = _drive_pair(
            main, schedule[-1], first_step, first_step + settings.window_steps, settings
        )
        window += 1
        if over:
            break
    return schedule, forks


def _fixed_pair_run(
    requests: tuple[Request, ...],
    layout: DisaggregatedPlant,
    pair: Pair,
    seed: int,
    control_period_s: float,
) -> DisaggregatedResult:
    """The run at a fixed clock per pool."""
    return simulate_disaggregated(
        requests,
        layout,
        {role: FixedClockController(clock) for role, clock in zip(ROLES, pair, strict=True)},
        seed,
        controller_names={
            role: f"fixed:{clock:g}" for role, clock in zip(ROLES, pair, strict=True)
        },
        control_period_s=control_period_s,
    )


def pool_window_oracle(
    workload: Sequence[Request],
    layout: DisaggregatedPlant,
    *,
    reference: DisaggregatedResult | None = None,
    continuation_clocks_mhz: Mapping[str, float] | None = None,
    continuation_result: DisaggregatedResult | None = None,
    window_s: float = 5.0,
    lookahead_s: float = 15.0,
    coarse_levels: int = 8,
    neighbour_steps: Sequence[int] = (2, 6),
    margins: Sequence[float] | None = None,
    tolerance: float = SLO_TOLERANCE,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> PoolWindowOracle:
    """A clock per pool per window in hindsight by greedy forked search (module notes of
    ``controllers/oracles``), on the disaggregated plant.

    Args:
        workload: the requests.
        layout: the two pools and their link.
        reference: the run at the maximum clock on both pools (simulated here when
            ``None``).
        continuation_clocks_mhz: each pool's clock in the lookahead and the fallbacks;
            pass the best fixed clock pair (default: each pool's maximum clock).
        continuation_result: the run at the continuation pair if already simulated.
        window_s: schedule window; a whole number of control periods.
        lookahead_s: seconds simulated at the continuation pair after each window.
        coarse_levels: evenly spaced supported clocks tried per pool in every window.
        neighbour_steps: level offsets around a pool's previous clock also tried.
        margins: extra known misses allowed, as a fraction of arrived requests, one
            greedy search per margin until the replay holds the SLO (default
            ``(tolerance / 2, 0)``).
        tolerance: the SLO condition's slack (fraction).
        seed: plant seed.
        control_period_s: control tick, as in :func:`simulate_disaggregated`.

    Raises:
        ValueError: an empty workload, a continuation missing a pool, or as
            :func:`window_oracle`.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("pool_window_oracle needs at least one request")
    window_steps, margin_values = search_steps(
        window_s, lookahead_s, control_period_s, margins, tolerance, coarse_levels
    )
    profiles = {role: layout.pool(role).plant.profile for role in ROLES}
    if continuation_clocks_mhz is None:
        continuation_clocks_mhz = {role: profiles[role].maximum_clock_mhz for role in ROLES}
    missing = [role for role in ROLES if role not in continuation_clocks_mhz]
    if missing:
        raise ValueError(f"continuation_clocks_mhz needs a clock for {missing}")
    continuation = tuple(
        profiles[role].quantize_clock(continuation_clocks_mhz[role]) for role in ROLES
    )
    if reference is None:
        top = (profiles["prefill"].maximum_clock_mhz, profiles["decode"].maximum_clock_mhz)
        reference = _fixed_pair_run(requests, layout, top, seed, control_period_s)
    reference_attainment = reference.metrics.slo_attainment
    prefill_profile, decode_profile = profiles["prefill"], profiles["decode"]
    realized = (
        prefill_profile.realized_clock(continuation[0]),
        decode_profile.realized_clock(continuation[1]),
    )
    settings = _PoolSearch(
        window_steps=window_steps,
        lookahead_steps=int(math.ceil(lookahead_s / control_period_s - 1e-9)),
        control_period_s=float(control_period_s),
        horizon_s=layout.run_horizon_s(requests),
        clocks_mhz={role: profiles[role].clock_mhz for role in ROLES},
        continuation={
            role: profiles[role].clock_index(c) for role, c in zip(ROLES, continuation, strict=True)
        },
        coarse={
            role: coarse_levels_of(profiles[role].clock_mhz.size, coarse_levels) for role in ROLES
        },
        neighbour_steps=tuple(int(s) for s in neighbour_steps),
        reference_miss_times=known_miss_times(
            reference.request_records, prefill_profile, decode_profile
        ),
        cumulative_output_tokens=cumulative_outputs(requests),
        terminal_prefill_j_per_token=joules_per_token(prefill_profile, "prefill", realized[0]),
        terminal_output_j_per_token=joules_per_token(decode_profile, "decode", realized[1]),
        counter_template=miss_counter_for(requests, prefill_profile, decode_profile),
    )

    def replay(schedule: Sequence[Pair]) -> DisaggregatedResult:
        return simulate_disaggregated(
            requests,
            layout,
            {
                role: ScheduleController([pair[k] for pair in schedule], window_s, name=role)
                for k, role in enumerate(ROLES)
            },
            seed,
            controller_names={role: "window-oracle" for role in ROLES},
            control_period_s=control_period_s,
        )

    selection = select_schedule(
        margin_values,
        lambda margin: _greedy_pools(requests, layout, seed, settings, margin),
        replay,
        lambda pair: (max(pair[0], continuation[0]), max(pair[1], continuation[1])),
        (continuation[0], continuation[1]),
        continuation_result,
        reference_attainment,
        tolerance,
        continuation_name="pair",
    )
    result = selection.result
    return PoolWindowOracle(
        schedule_mhz={
            role: tuple(pair[k] for pair in selection.schedule) for k, role in enumerate(ROLES)
        },
        window_s=float(window_s),
        lookahead_s=float(lookahead_s),
        continuation_clocks_mhz=dict(zip(ROLES, continuation, strict=True)),
        result=result,
        holds_slo=holds_slo(result.metrics.slo_attainment, reference_attainment, tolerance),
        source=selection.source,
        attempts=selection.attempts,
        candidate_runs=selection.forks,
    )
