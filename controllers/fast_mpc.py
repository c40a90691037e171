"""A millisecond MPC solver: direct search over supported clock levels.

The seed's MPC minimises its horizon cost with SLSQP and finite-difference gradients over
continuous clocks, then rounds the plan down onto the supported clocks. The applied
clocks are a small discrete set and the fluid rollout is cheap, so this solver prices
whole batches of supported-clock plans at once with a vectorised rollout (the very same
model and cost as :meth:`controllers.mpc.MPCProblem.costs`, tested equal) and searches
them directly:

1. a structured candidate set, priced in one pass: every constant plan, and two-block
   ("first period at level i, the rest at level j") and alternating ("i, j, i, j, ...")
   plans on a coarse level grid, plus the previous decision's plan shifted by one period
   (warm start);
2. a best-improvement local search from the ``starts`` best candidates at once: moves of
   one period, of a period and all later ones, of two adjacent periods in opposite
   directions, of every other period from some point on, and swaps of adjacent periods;
   each round prices every incumbent's neighbourhood in one pass, and the number of
   rounds is capped so the solve time is bounded.

The result is a supported-clock plan whose model cost is what the controller applies,
with no rounding step after the optimisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from controllers.mpc import CHUNK_TOKENS, MPCProblem, SolveOutcome
from plant.profile import PerformanceProfile

IntArray = NDArray[np.int_]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class LevelTables:
    """Per-supported-clock rates and powers of one profile (looked up by level index)."""

    clock_mhz: FloatArray
    prefill_rate: FloatArray
    decode_rate: FloatArray
    prefill_power: FloatArray
    decode_power: FloatArray
    idle_power: FloatArray

    @classmethod
    def from_profile(cls, profile: PerformanceProfile) -> LevelTables:
        """Tables at the profile's own supported clocks."""
        return cls(
            clock_mhz=profile.clock_mhz.astype(float),
            prefill_rate=profile.prefill_tokens_per_s.astype(float),
            decode_rate=profile.decode_tokens_per_s.astype(float),
            prefill_power=profile.prefill_power_w.astype(float),
            decode_power=profile.decode_power_w.astype(float),
            idle_power=profile.idle_power_w.astype(float),
        )


def level_costs(problem: MPCProblem, levels: IntArray, tables: LevelTables) -> FloatArray:
    """The seed's MPC cost of each row of an ``(M, horizon)`` array of level indices.

    Equal to ``problem.costs(tables.clock_mhz[levels])`` (tested); faster because rates
    and powers are table lookups rather than interpolations, the phase shares are
    arithmetic, and the power-cap and thermal terms are skipped when no plan can reach
    them (the temperature is a running convex combination of the start temperature and
    equilibria no hotter than the table's highest power allows).
    """
    levels = np.atleast_2d(levels)
    count, steps = levels.shape
    plant = problem.plant
    profile = plant.profile
    weights = problem.weights
    h = problem.control_period_s
    by_step = levels.T
    prefill_capacity = tables.prefill_rate[by_step] * h
    decode_capacity = tables.decode_rate[by_step] * h
    inverse_prefill = 1.0 / np.maximum(tables.prefill_rate, 1e-12)[by_step]
    inverse_decode = 1.0 / np.maximum(tables.decode_rate, 1e-12)[by_step]
    iteration_model = problem.latency_model != "seed"
    if iteration_model:
        # The iteration latency model's proxies (MPCProblem.ttft_proxy / tpot_proxy),
        # rearranged into per-level tables: t_dec = t0 + t1 * active.
        model = profile.decode_latency_model
        reference = float(model.reference_batch_size)
        context = problem.mean_prompt_tokens + 0.5 * problem.mean_output_tokens
        t_ref = reference / np.maximum(tables.decode_rate, 1e-12)
        t0 = (t_ref * model.weight_fraction)[by_step]
        t1 = (
            t_ref
            * (
                model.batch_fraction / reference
                + model.kv_fraction * context / (reference * model.reference_context_tokens)
            )
        )[by_step]
        inverse_capacity = 1.0 / np.maximum(tables.prefill_rate * h, 1e-12)[by_step]
        inverse_rate = 1.0 / np.maximum(tables.prefill_rate, 1e-12)[by_step]
        mean_prompt = problem.ttft_prompt
    prefill_power = tables.prefill_power[by_step]
    decode_power = tables.decode_power[by_step]
    idle_power = tables.idle_power[by_step]
    maximum_power = max(profile.prefill_power_w[-1], profile.decode_power_w[-1])
    decay = math.exp(-h / plant.thermal_time_constant_s)
    prompt_divisor = max(problem.mean_prompt_tokens, 1.0)
    output_divisor = max(problem.mean_output_tokens, 1.0)
    mean_output = problem.mean_output_tokens
    ambient = plant.ambient_temperature_c
    resistance = plant.thermal_resistance_c_per_w
    ttft_slo, tpot_slo = problem.ttft_target_s, problem.tpot_target_s
    ttft_scale = max(profile.ttft_slo_s, 1e-12)
    tpot_scale = max(profile.tpot_slo_s, 1e-12)
    power_limit = plant.power_limit_w / maximum_power
    thermal_limit = plant.thermal_limit_c
    arrivals = problem.prompt_arrivals
    highest_power = max(
        float(np.max(tables.prefill_power)),
        float(np.max(tables.decode_power)),
        float(np.max(tables.idle_power)),
    )
    check_power = highest_power / maximum_power > power_limit
    check_thermal = (
        max(float(problem.initial_temperature_c), ambient + resistance * highest_power)
        > thermal_limit
    )

    prefill = np.full(count, max(0.0, problem.initial_prefill_tokens))
    decode = np.full(count, max(0.0, problem.initial_decode_tokens))
    active = np.full(count, max(0.0, problem.initial_active_decode))
    temperature = np.full(count, float(problem.initial_temperature_c))
    power_sum = np.zeros(count)
    ttft_penalty = np.zeros(count)
    tpot_penalty = np.zeros(count)
    limit_penalty = np.zeros(count)
    for index in range(steps):
        available_prefill = prefill + arrivals[index]
        has_prefill = available_prefill > 1e-12
        has_decode = decode > 1e-12
        both = has_prefill & has_decode
        # Shares: 1/2 each when both phases have work, else 1 for the busy phase.
        prefill_share = np.where(both, 0.5, has_prefill)
        decode_share = np.where(both, 0.5, has_decode)
        served_prefill = np.minimum(available_prefill, prefill_capacity[index] * prefill_share)
        completed_prefill = served_prefill * (1.0 / prompt_divisor)
        prefill = available_prefill - served_prefill
        np.maximum(prefill, 0.0, out=prefill)
        available_decode = decode + completed_prefill * mean_output
        served_decode = np.minimum(available_decode, decode_capacity[index] * decode_share)
        decode = available_decode - served_decode
        np.maximum(decode, 0.0, out=decode)
        active = active + completed_prefill - served_decode * (1.0 / output_divisor)
        np.maximum(active, 0.0, out=active)
        power = np.where(
            has_prefill | has_decode,
            prefill_share * prefill_power[index] + decode_share * decode_power[index],
            idle_power[index],
        )
        power_sum += power
        if iteration_model:
            busy_decode = active > 1e-9
            t_dec = t0[index] + t1[index] * active
            chunk = np.maximum(CHUNK_TOKENS - active, 32.0)
            ttft = (prefill + mean_prompt) * (
                t_dec * busy_decode / chunk + inverse_rate[index]
            ) - ttft_slo
            np.maximum(ttft, 0.0, out=ttft)
            ttft_penalty += ttft * ttft
            stretch = np.maximum(1.0 - served_prefill * inverse_capacity[index], 0.05)
            tpot = np.where(busy_decode, t_dec / stretch, 0.0) - tpot_slo
        else:
            ttft = prefill * inverse_prefill[index] - ttft_slo
            np.maximum(ttft, 0.0, out=ttft)
            ttft_penalty += ttft * ttft
            tpot = active * inverse_decode[index] - tpot_slo
        np.maximum(tpot, 0.0, out=tpot)
        tpot_penalty += tpot * tpot
        if check_power:
            over_power = np.maximum(0.0, power * (1.0 / maximum_power) - power_limit)
            limit_penalty += over_power * over_power
        if check_thermal:
            equilibrium = ambient + resistance * power
            temperature = equilibrium + (temperature - equilibrium) * decay
            over_thermal = np.maximum(0.0, temperature - thermal_limit)
            limit_penalty += over_thermal * over_thermal
    minimum = profile.minimum_clock_mhz
    span = profile.maximum_clock_mhz - minimum
    normalized = (tables.clock_mhz[levels] - minimum) / span
    previous = (problem.previous_clock_mhz - minimum) / span
    changes = np.diff(normalized, axis=1)
    first = normalized[:, 0] - previous
    change_penalty = first * first + np.sum(changes * changes, axis=1)
    terminal = prefill / profile.prefill_tokens_per_s[-1] + decode / profile.decode_tokens_per_s[-1]
    return (
        weights.power * power_sum * (1.0 / maximum_power)
        + weights.ttft * ttft_penalty * (1.0 / (ttft_scale * ttft_scale))
        + weights.tpot * tpot_penalty * (1.0 / (tpot_scale * tpot_scale))
        + weights.clock_change * change_penalty
        + weights.constraint * limit_penalty
        + weights.terminal_backlog * terminal * terminal
    )


@dataclass
class DiscreteSearchSolver:
    """Structured candidates plus best-improvement local search over clock levels.

    Args:
        coarse_levels: levels on the coarse grid of the two-block and alternating
            candidate families.
        step_sizes: level offsets of single-period moves in the local search.
        maximum_rounds: cap on local-search rounds (each prices every move at once), so
            the solve time is bounded whatever the state.
        starts: incumbents searched side by side from the best distinct candidates.
        free_periods: most independent levels in a plan; longer horizons use blocks.
    """

    coarse_levels: int = 28
    step_sizes: tuple[int, ...] = (1, 2, 4, 8)
    maximum_rounds: int = 12
    starts: int = 4
    free_periods: int = 10
    _tables: dict[int, LevelTables] = field(default_factory=dict, repr=False)
    _pools: dict[tuple[int, int], IntArray] = field(default_factory=dict, repr=False)
    _moves: dict[int, IntArray] = field(default_factory=dict, repr=False)
    last_rounds: int = 0

    def tables(self, profile: PerformanceProfile) -> LevelTables:
        """Level tables for ``profile`` (cached per profile object)."""
        key = id(profile)
        cached = self._tables.get(key)
        if cached is None or cached.clock_mhz.size != profile.clock_mhz.size:
            cached = LevelTables.from_profile(profile)
            self._tables[key] = cached
        return cached

    def _move_matrix(self, steps: int) -> IntArray:
        """Additive level moves (one row each), cached per horizon length.

        One period by +-1, 2, 4 or 8 levels; a period and every later one by +-1, 4 or
        16; two adjacent periods by opposite offsets +-1, 2 or 4 (this reaches
        alternating plans); every other period from some point on by +-1, 2 or 4.
        """
        cached = self._moves.get(steps)
        if cached is not None:
            return cached
        index = np.arange(steps)
        moves = []
        for position in range(steps):
            for size in (1, 2, 4, 8):
                for sign in (-size, size):
                    moves.append(sign * (index == position))
            for size in (1, 4, 16):
                for sign in (-size, size):
                    moves.append(sign * (index >= position))
            if position + 1 < steps:
                for size in (1, 2, 4):
                    for sign in (-size, size):
                        moves.append(sign * (index == position) - sign * (index == position + 1))
            for size in (1, 2, 4):
                for sign in (-size, size):
                    moves.append(sign * ((index >= position) & (index % 2 == position % 2)))
        cached = np.unique(np.array(moves, dtype=int), axis=0)
        self._moves[steps] = cached
        return cached

    def _neighbours(self, plan: IntArray, levels: int) -> IntArray:
        """Plans one move away from ``plan``: the additive moves and adjacent swaps."""
        steps = plan.size
        trials = plan[None, :] + self._move_matrix(steps)
        if steps > 1:
            rows = np.arange(steps - 1)
            swap = np.repeat(plan[None, :], steps - 1, axis=0)
            swap[rows, rows], swap[rows, rows + 1] = plan[1:], plan[:-1]
            trials = np.concatenate([trials, swap], axis=0)
        return trials[np.all((trials >= 0) & (trials < levels), axis=1)]

    def _coarse(self, levels: int) -> IntArray:
        return np.unique(
            np.linspace(0, levels - 1, min(self.coarse_levels, levels)).round()
        ).astype(int)

    def candidates(self, steps: int, levels: int, warm_start: IntArray | None) -> IntArray:
        """Constant, two-block and alternating plans on a coarse grid, and the warm start
        (already shifted by one period by the caller)."""
        key = (steps, levels)
        pool = self._pools.get(key)
        if pool is None:
            constant = np.repeat(np.arange(levels)[:, None], steps, axis=1)
            coarse = self._coarse(levels)
            first, rest = np.meshgrid(coarse, coarse, indexing="ij")
            first, rest = first.reshape(-1), rest.reshape(-1)
            two_block = np.repeat(rest[:, None], steps, axis=1)
            two_block[:, 0] = first
            alternating = np.repeat(rest[:, None], steps, axis=1)
            alternating[:, 0::2] = first[:, None]
            pool = np.unique(np.concatenate([constant, two_block, alternating]), axis=0)
            self._pools[key] = pool
        if warm_start is not None and warm_start.size == steps:
            return np.concatenate([pool, warm_start[None, :]], axis=0)
        return pool

    def search(
        self, problem: MPCProblem, warm_start: IntArray | None = None
    ) -> tuple[IntArray, float]:
        """Best plan found, as level indices, and its model cost.

        Local search runs from the ``starts`` best distinct candidates at once: each
        round prices the neighbourhoods of every incumbent in one pass, and each
        incumbent moves to its best neighbour while that lowers its cost. Horizons
        longer than ``free_periods`` are searched with move blocking: the plan holds one
        level per block of consecutive periods (standard in MPC), so the search space and
        the solve time grow with the number of blocks, not the horizon.
        """
        tables = self.tables(problem.plant.profile)
        levels = tables.clock_mhz.size
        steps = problem.horizon_steps
        free = min(steps, self.free_periods)
        block_of_step = (np.arange(steps) * free) // steps

        def costs_of(block_plans: IntArray) -> FloatArray:
            return level_costs(problem, block_plans[:, block_of_step], tables)

        warm = None
        if warm_start is not None and warm_start.size == steps:
            shifted = np.concatenate([warm_start[1:], warm_start[-1:]])
            first_of_block = np.searchsorted(block_of_step, np.arange(free))
            warm = shifted[first_of_block]
        pool = self.candidates(free, levels, warm)
        costs = costs_of(pool)
        order = np.argsort(costs, kind="stable")[: self.starts]
        incumbents = [pool[i].copy() for i in order]
        incumbent_costs = [float(costs[i]) for i in order]
        active = list(range(len(incumbents)))
        rounds = 0
        while active and rounds < self.maximum_rounds:
            rounds += 1
            blocks = [self._neighbours(incumbents[i], levels) for i in active]
            trials = np.concatenate(blocks, axis=0)
            trial_costs = costs_of(trials)
            still = []
            offset = 0
            for i, block in zip(active, blocks, strict=True):
                segment = trial_costs[offset : offset + block.shape[0]]
                offset += block.shape[0]
                best = int(np.argmin(segment))
                tolerance = 1e-12 * max(1.0, abs(incumbent_costs[i]))
                if segment[best] < incumbent_costs[i] - tolerance:
                    incumbents[i] = block[best].copy()
                    incumbent_costs[i] = float(segment[best])
                    still.append(i)
            active = still
        self.last_rounds = rounds
        winner = int(np.argmin(incumbent_costs))
        return incumbents[winner][block_of_step], incumbent_costs[winner]

    def solve_problem(self, problem: MPCProblem, warm_start_mhz: FloatArray | None) -> SolveOutcome:
        """Solve ``problem`` and return the supported-clock plan in MHz."""
        profile = problem.plant.profile
        warm = None
        if warm_start_mhz is not None and len(warm_start_mhz) == problem.horizon_steps:
            warm = np.searchsorted(profile.clock_mhz, np.asarray(warm_start_mhz) - 1e-9)
            warm = np.clip(warm, 0, profile.clock_mhz.size - 1)
        plan, cost = self.search(problem, warm)
        return SolveOutcome(
            x=profile.clock_mhz[plan].astype(float),
            success=bool(math.isfinite(cost)),
            message=f"discrete search, {self.last_rounds} rounds, cost {cost:.6g}",
        )

