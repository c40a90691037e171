"""Hindsight oracles: the limits a clock controller can reach on a known workload.

This module is the public face and the oracles' specification: the code lives in
``common`` (SLO condition, capture, driving the plant), ``fixed``,
``window``, ``bound`` and ``pools`` (the disaggregated layout's), and every public name
is re-exported here.

Each oracle sees the whole future (every arrival and every output length) and works on
the detailed plant (:class:`plant.PlantSimulation`), so it is a reference for the
scoreboard (``study/scoreboard/run.py``), never a controller a node could run. All of them
share one SLO condition: a run *holds the SLO* when its SLO attainment is at least the
maximum clock's minus ``tolerance`` (1 percentage point by default), see
:func:`holds_slo`.

Best fixed clock in hindsight (:func:`best_fixed_clock`)
    The lowest-energy fixed clock whose run holds the SLO. Search over the supported
    clocks: (1) bisection for the lowest clock index that holds (SLO attainment is
    roughly monotone in the clock), (2) ``coarse_points`` evenly spaced clocks between
    that index and the maximum, (3) refinement around the lowest-energy holding clock
    with halving steps down to one supported level. Every candidate is verified by a
    full simulation; the result lists every clock evaluated. Energy and attainment are
    only roughly monotone, so the search is exact only when they are.

Window schedule in hindsight (:func:`window_oracle`)
    A clock per window of ``window_s`` seconds, found by a greedy forward search that
    forks the simulator at each window boundary. The exact rule, for window ``k``
    starting at ``t_k``:

    1. candidates: ``coarse_levels`` evenly spaced supported clocks, the previous
       window's clock and its neighbours ``+-s`` levels for ``s`` in
       ``neighbour_steps``, and the continuation clock ``c_cont`` (the best fixed clock
       when given, else the maximum);
    2. for each candidate ``c``: fork the plant at ``t_k``, run the window at ``c`` and
       a lookahead of ``lookahead_s`` at ``c_cont``, both with the same per-period
       control ticks as :func:`plant.simulate`; its *score* is the energy used from
       ``t_k`` plus the work left at the end ``t_e`` valued at ``c_cont``'s energy per
       token (queued prompt tokens at its prefill joules per token, output tokens still
       to generate at its decode joules per token at the reference batch), so that
       deferring work is not free; also record the number of requests whose SLO is
       *known* to be missed at ``t_e``
       (TTFT: no first token by ``arrival + TTFT SLO``, or a late one; TPOT: finished
       with a mean TPOT above the SLO, or unfinished with
       ``t_e - first_token > TPOT SLO * (output_tokens - 1)``);
    3. a candidate is *admissible* when its known misses are at most the maximum-clock
       run's known misses at ``t_e`` (same rule) plus ``floor(margin * arrived(t_e))``;
       the admissible candidate with the lowest score wins (ties: the higher clock);
       when none is admissible, the one with the fewest known misses (then lowest
       score) wins;
    4. the plant advances through the window at the winner, and the search moves on
       until every request has finished or the horizon (last arrival plus the plant's
       drain timeout) is reached.

    The schedule is then replayed from scratch with :func:`plant.simulate` and the SLO
    condition is checked on the full run. If it fails the search is repeated with the
    next, smaller margin (``margins``, default half the tolerance, then zero); if every
    margin fails, the schedule raised to at least ``c_cont`` in every window is tried,
    and finally ``c_cont`` itself (which holds by construction when it is the best
    fixed clock). The constant ``c_cont`` schedule is itself a per-window schedule, so
    when it holds the SLO with less energy than the greedy one it is returned instead.
    The result is a heuristic: an *achievable* schedule, so an upper bound on the energy
    of the true optimal per-window schedule, not the optimum itself.

Fluid LP lower bound (:func:`fluid_energy_lower_bound`)
    A bound, not a controller: the minimum energy of any run that serves all the work
    of the trace (every prompt token once, ``output_tokens - 1`` decode tokens per
    request) on this plant, from an LP over windows of ``window_s`` seconds up to the
    last arrival and a free tail after it. Per supported clock (its realised clock, as
    the plant uses) a prefill token costs ``tau = 1 / prefill_rate`` seconds and
    ``tau * prefill_power`` joules; a decode token costs at least
    ``tau_d = min_B t_dec(B, C_min(B)) / B`` seconds and
    ``min_B t_dec(B, C_min(B)) * p_dec(B) / B`` joules over batch sizes
    ``1 <= B <= max_batch_size``, with the plant's decode latency and batch-power models
    and the smallest possible context ``C_min(B) = B * min prompt tokens`` (each batch up
    to 4,096; past that, the least over each stretch of a geometric grid of batches 0.2 %
    apart, taken at the stretch's corners: no more than any batch in it costs, so a
    manifest's batch bound of up to 10**12 prices in bounded time and memory). Before the
    last arrival ``A`` the GPU draws at least the lowest idle power ``P_idle_min`` at
    every instant (or the lowest busy power, where a table lists one below it), so the
    energy up to ``A`` is at least ``P_idle_min * A`` plus, per
    token served before ``A``, its marginal cost ``energy - P_idle_min * tau``; work
    left at ``A`` costs its full (lowest) energy per token with no time limit. The LP
    (HiGHS) chooses, per window, how many tokens of each phase to serve at each clock,
    subject to the window's length (busy time ``<=`` window) and causality (cumulative
    service ``<=`` cumulative arrivals up to the window's end; backlog variables keep the
    constraints sparse). Only the lower-left convex hull of each phase's
    ``(seconds, marginal joules)`` points is kept, which leaves the optimum unchanged.

    Every run of the noise-free plant that finishes all requests maps onto a feasible LP
    point with no more energy, so the LP optimum is a lower bound. It ignores: latency
    SLOs and queueing (work may wait arbitrarily), the prefill-before-decode order within
    a request and admission limits (a request's decode work is available at its
    arrival), batch formation (every decode token gets the best batch size), context
    growth, KV-cache limits and preemption recompute, the actuation delay, the power cap
    and thermal limits, idle energy after the last arrival, and arrivals within a window
    being served from the window's start. With ``latency_noise_cv > 0`` it bounds the
    noise-free plant only.

Per pool on a disaggregated layout (:mod:`gpugov.plant.disaggregated`)
    The same SLO condition on the request-level records (TTFT SLO: the prefill profile's
    ``ttft_slo_for(prompt_tokens)``; TPOT SLO: the decode profile's ``tpot_slo_s``),
    against the run at the maximum clock on both pools. The best fixed clock pair is
    searched by the scoreboard (``study/scoreboard/disaggregated.py``).

    *Window schedule per pool* (:func:`pool_window_oracle`): a clock per pool per window,
    by the window oracle's rule above on :class:`plant.disaggregated.DisaggregatedSimulation`
    (forked at each boundary), with these differences. The continuation is a clock
    pair ``(c_p, c_d)`` (the best fixed pair when given, else both maxima): the lookahead
    runs at it, and work left at ``t_e`` is valued at the prefill pool's prefill joules
    per token at ``c_p`` (prompt tokens queued in the prefill pool) and the decode pool's
    decode joules per token at ``c_d`` (output tokens still to generate). Per window the
    pools are searched coordinate-wise: (a) the prefill pool's candidates (step 1's rule
    on its own clocks around its previous clock) with the decode pool at its previous
    clock, the best by step 3 kept; (b) the decode pool's candidates with the prefill
    pool at (a)'s winner. A pair is forked once per window, so a window costs at most
    the two pools' candidate counts (minus the shared pair), about twice the colocated
    oracle's, not their product; the joint optimum over pairs is not searched. Known
    misses, admissibility and margins, the replay (:func:`plant.simulate_disaggregated`
    with a :class:`ScheduleController` per pool) and the fallbacks (raised to the
    continuation pair in every window, then the constant continuation pair, which also
    replaces a holding greedy schedule that uses more energy) are as above.

    *Fluid LP bound per pool* (:func:`pool_energy_lower_bound`): the bound above for each
    pool alone (``fluid_energy_lower_bound(..., replicas=R, phases=(role,))``): the
    prefill pool serves every prompt token and no decode token, the decode pool
    ``output_tokens - 1`` decode tokens per request and no prompt token; a pool of ``R``
    engines has ``R`` times the busy seconds per window and ``R`` times the idle floor
    (each engine draws at least ``P_idle_min`` until the last arrival). Giving the decode
    pool its work at the requests' arrival times is a further relaxation (in the plant
    it arrives at prefill end plus the transfer), so the bound stays valid; the
    transfer and the decode pool's recompute of preempted requests are ignored. The
    layout's bound is the sum of the two pools' bounds: each pool's energy is at least
    its own bound, so each run's total is at least their sum.

:func:`oracle_capture` turns the energies into the scoreboard's capture ratio.
"""

from __future__ import annotations

from gpugov.controllers.oracles.bound import (
    FluidEnergyBound,
    fluid_energy_lower_bound,
    phase_token_costs,
)
from gpugov.controllers.oracles.common import (
    SLO_TOLERANCE,
    holds_slo,
    maximum_clock_reference,
    oracle_capture,
)
from gpugov.controllers.oracles.fixed import BestFixedClock, ClockEvaluation, best_fixed_clock
from gpugov.controllers.oracles.pools import (
    PoolEnergyBound,
    PoolWindowOracle,
    pool_energy_lower_bound,
    pool_window_oracle,
)
from gpugov.controllers.oracles.window import ScheduleController, WindowOracle, window_oracle

__all__ = [
    "SLO_TOLERANCE",
    "BestFixedClock",
    "ClockEvaluation",
    "FluidEnergyBound",
    "PoolEnergyBound",
    "PoolWindowOracle",
    "ScheduleController",
    "WindowOracle",
    "best_fixed_clock",
    "fluid_energy_lower_bound",
    "holds_slo",
    "maximum_clock_reference",
    "oracle_capture",
    "phase_token_costs",
    "pool_energy_lower_bound",
    "pool_window_oracle",
    "window_oracle",
]
