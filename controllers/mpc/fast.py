"""A millisecond MPC solver: direct search over supported clock levels.

The seed's MPC minimises its horizon cost with SLSQP and finite-difference gradients over
continuous clocks, then rounds the plan down onto the supported clocks. The applied
clocks are a small discrete set and the fluid rollout is cheap, so this solver searches
supported-clock plans directly, pricing them with the very same model and cost as
:meth:`controllers.mpc.controller.MPCProblem.costs` (compiled in
:mod:`controllers.mpc.search_kernel`, tested equal):

1. a structured candidate pool, every plan priced: every constant plan, and two-block
   ("first period at level i, the rest at level j"), alternating ("i, j, i, j, ...") and
   late-step ("a low level until period k, then level j") plans on a coarse level grid,
   plus the previous decision's plan shifted by one period (warm start);
2. a first-improvement local search from each of the ``starts`` best candidates that lie
   at least ``start_spread`` levels from each other: moves of one period, of a period and
   all later ones, of two adjacent periods in opposite directions, of every other period
   from or up to some point, and swaps of adjacent periods. A move is priced only from
   the first period it changes (the incumbent's states before it are kept), and
   abandoned as soon as its partial cost reaches the incumbent's, since every cost term
   is non-negative. Each search stops at a local optimum or after ``maximum_trials``
   priced moves, so the solve time is bounded whatever the state.

The result is a supported-clock plan whose model cost is what the controller applies,
with no rounding step after the optimisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.mpc.controller import MPCProblem, SolveOutcome
from gpugov.controllers.mpc.search_kernel import (
    compile_kernels,
    price_plans,
    problem_arrays,
    search_plans,
)

FAST_MPC_PRESET: dict[str, float] = {
    # Penalise predicted latency above 70% of each SLO: the proxies are means, the SLOs
    # are judged per request (chosen on the scoreboard, see docs/scoreboard.md).
    "slo_margin": 0.7,
    # Stop penalising TTFT excess beyond one TTFT SLO (see MPCProblem).
    "ttft_excess_cap": 1.0,
    # A queued prompt's replies are work left at the horizon's end: with the cap, an
    # overload otherwise priced the lowest clock cheapest (see MPCProblem).
    "terminal_queued_replies": True,
    # Hold the top clock where it too leaves the next request past the cap: the capped
    # cost then sees every clock alike and chose by power (see MPCController).
    "hold_top_when_ttft_lost": True,
    # Wait for a batch place the KV cache holds, not only the batch size: a small cache
    # otherwise left the queue for it unpriced (see MPCController).
    "kv_batch_bound": True,
}
"""The ``mpc`` kind's MPCController options beyond the seed's (``mpc-slsqp``) defaults."""

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


def plan_costs(problem: MPCProblem, levels: IntArray) -> FloatArray:
    """The MPC cost of each row of an ``(M, horizon)`` array of supported-clock indices.

    Equal to ``problem.costs(profile.clock_mhz[levels])`` (tested), computed by the
    compiled kernel the solver searches with.
    """
    plans = np.ascontiguousarray(np.atleast_2d(levels), dtype=np.int64)
    table, parameters, arrivals = problem_arrays(problem)
    steps = np.arange(plans.shape[1], dtype=np.int64)
    return price_plans(plans, steps, table, parameters, arrivals)


@dataclass
class DiscreteSearchSolver:
    """Structured candidates plus first-improvement local search over clock levels.

    Args:
        coarse_levels: levels on the coarse grid of the two-block and alternating
            candidate families.
        starts: local searches, each from one of the best distinct candidates.
        maximum_trials: cap on the moves one local search prices, so the solve time is
            bounded whatever the state.
        free_periods: most independent levels in a plan; longer horizons use blocks.
        late_step_levels: low levels of the late-step candidate family (hold a low level
            for the first periods, then step to any coarse level); 0 turns it off.
        start_spread: least total level difference (summed over the free periods)
            between any two starts, so the searches begin in different basins of a
            rugged cost (60 is six levels a period over ten periods).
        constant_stride: the constant plans are every this many levels (and the top
            one); 1 prices every constant plan.

    The defaults were chosen on the scoreboard's solver comparison
    (``study/scoreboard/run.py``); see ``docs/scoreboard.md``.
    """

    coarse_levels: int = 28
    starts: int = 4
    maximum_trials: int = 1000
    free_periods: int = 10
    start_spread: int = 60
    late_step_levels: int = 4
    constant_stride: int = 1
    _pools: dict[tuple[int, int], IntArray] = field(default_factory=dict, repr=False)
    _moves: dict[int, IntArray] = field(default_factory=dict, repr=False)
    _blocks: dict[tuple[int, int], tuple[IntArray, IntArray]] = field(
        default_factory=dict, repr=False
    )
    last_trials: int = 0

    def __post_init__(self) -> None:
        for name in (
            "coarse_levels",
            "starts",
            "maximum_trials",
            "free_periods",
            "constant_stride",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("late_step_levels", "start_spread"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        # Compile now, not inside the first control period.
        compile_kernels()

    def move_matrix(self, steps: int) -> IntArray:
        """Additive level moves (one row each), cached per number of free periods.

        One period by +-1, 2, 4 or 8 levels; a period and every later one by +-1, 4 or
        16; two adjacent periods by opposite offsets +-1, 2 or 4 (this reaches
        alternating plans); every other period from, or up to, some point by +-1, 2 or 4. Rows
        are ordered by the first period they change, so a cyclic scan sweeps the plan.
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
                    parity = index % 2 == position % 2
                    moves.append(sign * ((index >= position) & parity))
                    moves.append(sign * ((index <= position) & parity))
        unique, first_seen = np.unique(np.array(moves, dtype=np.int64), axis=0, return_index=True)
        cached = np.ascontiguousarray(unique[np.argsort(first_seen)])
        self._moves[steps] = cached
        return cached

    def _coarse(self, levels: int) -> IntArray:
        return np.unique(
            np.linspace(0, levels - 1, min(self.coarse_levels, levels)).round()
        ).astype(np.int64)

    def candidates(self, steps: int, levels: int, warm_start: IntArray | None) -> IntArray:
        """Constant, two-block and alternating plans on a coarse grid, and the warm start
        (already shifted by one period by the caller)."""
        key = (steps, levels)
        pool = self._pools.get(key)
        if pool is None:
            constant_levels = np.unique(
                np.append(np.arange(0, levels, self.constant_stride), levels - 1)
            ).astype(np.int64)
            constant = np.repeat(constant_levels[:, None], steps, axis=1)
            coarse = self._coarse(levels)
            first_grid, rest_grid = np.meshgrid(coarse, coarse, indexing="ij")
            first, rest = first_grid.reshape(-1), rest_grid.reshape(-1)
            two_block = np.repeat(rest[:, None], steps, axis=1)
            two_block[:, 0] = first
            alternating = np.repeat(rest[:, None], steps, axis=1)
            alternating[:, 0::2] = first[:, None]
            families = [constant, two_block, alternating]
            # Hold a low level, then step up for the rest of the horizon at any period:
            # the plan a backlog that can wait calls for. The low levels are the lowest
            # of a grid four times as sparse as the level count allows.
            low = np.unique(np.linspace(0, levels - 1, 4 * self.late_step_levels).round())
            for level in low.astype(np.int64)[: self.late_step_levels]:
                for split in range(2, steps):
                    late_step = np.repeat(coarse[:, None], steps, axis=1)
                    late_step[:, :split] = level
                    families.append(late_step)
            pool = np.unique(np.concatenate(families), axis=0)
            self._pools[key] = np.ascontiguousarray(pool, dtype=np.int64)
            pool = self._pools[key]
        if warm_start is not None and warm_start.size == steps:
            return np.concatenate([pool, warm_start[None, :].astype(np.int64)], axis=0)
        return pool

    def _blocking(self, steps: int) -> tuple[IntArray, IntArray]:
        """The block of each of ``steps`` periods under move blocking, and each block's
        first period (cached per horizon: the arrays are never written)."""
        free = min(steps, self.free_periods)
        cached = self._blocks.get((steps, free))
        if cached is None:
            block_of_step = ((np.arange(steps) * free) // steps).astype(np.int64)
            cached = (block_of_step, np.searchsorted(block_of_step, np.arange(free)))
            self._blocks[steps, free] = cached
        return cached

    def search(
        self, problem: MPCProblem, warm_start: IntArray | None = None
    ) -> tuple[IntArray, float]:
        """Best plan found, as level indices, and its model cost.

        Horizons longer than ``free_periods`` are searched with move blocking: the plan
        holds one level per block of consecutive periods (standard in MPC), so the search
        space and the solve time grow with the number of blocks, not the horizon.
        """
        table, parameters, arrivals = problem_arrays(problem)
        levels = table.shape[1]
        steps = problem.horizon_steps
        free = min(steps, self.free_periods)
        block_of_step, block_starts = self._blocking(steps)
        warm = None
        if warm_start is not None and warm_start.size == steps:
            shifted = np.concatenate([warm_start[1:], warm_start[-1:]])
            warm = shifted[block_starts]
        pool = self.candidates(free, levels, warm)
        best_plan, best_cost, trials = search_plans(
            pool,
            block_of_step,
            self.move_matrix(free),
            levels,
            self.starts,
            self.start_spread,
            self.maximum_trials,
            table,
            parameters,
            arrivals,
        )
        self.last_trials = int(trials)
        return best_plan[block_of_step], float(best_cost)

    def solve_problem(self, problem: MPCProblem, warm_start_mhz: FloatArray | None) -> SolveOutcome:
        """Solve ``problem`` and return the supported-clock plan in MHz."""
        profile = problem.plant.profile
        warm = None
        if warm_start_mhz is not None and len(warm_start_mhz) == problem.horizon_steps:
            warm = profile.clock_mhz.searchsorted(np.asarray(warm_start_mhz) - 1e-9)
            # searchsorted gives indices in [0, size]: only the top needs clipping.
            warm = np.minimum(warm, profile.clock_mhz.size - 1).astype(np.int64)
        plan, cost = self.search(problem, warm)
        return SolveOutcome(
            x=profile.clock_mhz[plan].astype(float),
            success=bool(math.isfinite(cost)),
            message=f"discrete search, {self.last_trials} trials, cost {cost:.6g}",
        )
