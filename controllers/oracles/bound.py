"""The fluid LP lower bound: the least energy any run serving the trace's work can use on
this plant, from an LP over windows (assumptions in ``controllers/oracles/__init__.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.optimize import linprog

from gpugov.controllers.oracles.common import (
    FloatArray,
)
from gpugov.plant.plant import ServingPlant
from gpugov.plant.types import Request

# ------------------------------------------------------------------ fluid LP bound
PHASES = ("prefill", "decode")
"""The work a bound serves by default: every prompt token and every decode token."""
EXACT_BATCHES = 4096
"""Decode batches priced one by one (every engine's batch bound we know is below it)."""
GRID_RATIO = 1.002
"""Past :data:`EXACT_BATCHES`, the ratio between the batches of the grid whose stretches
are priced by their corners (a manifest may state up to 10**12 places: pricing each ended
in a MemoryError); the bound there is within about 0.2 % of each batch's own cost."""
BATCH_CHUNK = 256
"""Batches priced at once (the arrays are clocks x batches)."""


@dataclass(frozen=True)
class FluidEnergyBound:
    """Result of :func:`fluid_energy_lower_bound` (energies in joules)."""

    energy_j: float
    idle_floor_j: float
    window_s: float
    windows: int
    last_arrival_s: float
    prefill_tokens: float
    decode_tokens: float
    tail_prefill_tokens: float
    tail_decode_tokens: float
    prefill_hull_clocks_mhz: tuple[float, ...]
    decode_hull_clocks_mhz: tuple[float, ...]
    success: bool
    message: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "energy_j": self.energy_j,
            "idle_floor_j": self.idle_floor_j,
            "window_s": self.window_s,
            "windows": self.windows,
            "last_arrival_s": self.last_arrival_s,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "tail_prefill_tokens": self.tail_prefill_tokens,
            "tail_decode_tokens": self.tail_decode_tokens,
            "prefill_hull_clocks_mhz": list(self.prefill_hull_clocks_mhz),
            "decode_hull_clocks_mhz": list(self.decode_hull_clocks_mhz),
            "success": self.success,
            "message": self.message,
        }


def _lower_hull(seconds: FloatArray, cost: FloatArray) -> NDArray[np.int_]:
    """Indices of the lower-left convex hull of ``(seconds, cost)`` points.

    From the fastest point to the cheapest one; every other point is no better than a
    convex combination of hull points with no more seconds and no more cost.
    """
    order = sorted(range(seconds.size), key=lambda i: (seconds[i], cost[i]))
    hull: list[int] = []
    for i in order:
        if hull and cost[i] >= cost[hull[-1]] - 1e-15:
            continue  # slower and no cheaper than the last kept point
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (seconds[b] - seconds[a]) * (cost[i] - cost[a]) - (cost[b] - cost[a]) * (
                seconds[i] - seconds[a]
            )
            if cross <= 0.0:  # b lies on or above the segment a-i
                hull.pop()
            else:
                break
        hull.append(i)
    return np.asarray(hull, dtype=int)


def _least_over_stretches(seconds: FloatArray, power: FloatArray) -> FloatArray:
    """Per row, the least ``seconds * power`` over the stretches between neighbouring
    columns, each taken at its corners: both move one way along a stretch, so their
    product is no lower anywhere inside it."""
    corners = [
        seconds[:, :-1] * power[:, :-1],
        seconds[:, :-1] * power[:, 1:],
        seconds[:, 1:] * power[:, :-1],
        seconds[:, 1:] * power[:, 1:],
    ]
    return np.asarray(np.minimum.reduce(corners).min(axis=1), dtype=float)


def phase_token_costs(plant: ServingPlant, minimum_context_tokens: float) -> dict[str, FloatArray]:
    """Per supported clock: seconds and joules per prefill token, and the best case per
    decode token (module notes), at the clock the plant realises.

    Returns:
        ``clock_mhz``, ``prefill_s``, ``prefill_j``, ``decode_s``, ``decode_j`` (the
        fastest and the cheapest decode token over batch sizes, each its own minimum;
        past :data:`EXACT_BATCHES` batches, at most the least over each stretch of a
        geometric grid),
        ``decode_marginal_j`` (the lowest joules per decode token above the floor,
        ``min_B seconds * (p_dec(B) - P_floor)``), ``idle_w`` and ``floor_w`` (the least
        power of any state: the lowest idle power, or a lower busy power a table lists).
    """
    profile = plant.profile
    clocks = profile.clock_mhz.astype(float)
    realized = np.array([profile.realized_clock(c) for c in clocks])
    prefill_rate = np.array([profile.rate("prefill", c) for c in realized])
    decode_rate = np.array([profile.rate("decode", c) for c in realized])
    prefill_power = np.array([profile.power("prefill", c) for c in realized])
    decode_power = np.array([profile.power("decode", c) for c in realized])
    idle_power = np.array([profile.power("idle", c) for c in realized])
    model = profile.decode_latency_model
    b_ref = float(model.reference_batch_size)
    c_ref = b_ref * float(model.reference_context_tokens)
    t_ref = b_ref / decode_rate
    power_model = profile.decode_power_batch_model

    def at(batches: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Seconds per decode token and power per clock (rows) at each batch (columns)."""
        per_token_s = t_ref[:, None] * (
            model.weight_fraction / batches[None, :]
            + model.batch_fraction / b_ref
            + model.kv_fraction * minimum_context_tokens / c_ref
        )
        factor = np.array(
            [1.0 if power_model is None else power_model.factor(b, b_ref) for b in batches]
        )
        return per_token_s, idle_power[:, None] + (decode_power - idle_power)[:, None] * factor

    # The least power the plant draws in any state: the lowest idle power, unless a table
    # lists a busy power below it (the batch factor is monotone in the batch, so a decode
    # power's least is at batch 1 or the largest). Measured from the idle power alone, a
    # busy state drawing less gave a negative marginal cost, paired by the LP with the
    # fastest batch's seconds, and the bound came out below zero.
    ends = np.array([1.0, float(plant.max_batch_size)])
    idle_floor = float(min(np.min(idle_power), np.min(prefill_power), np.min(at(ends)[1])))
    least_s = np.full(clocks.size, np.inf)
    least_j = np.full(clocks.size, np.inf)
    least_marginal_j = np.full(clocks.size, np.inf)
    exact = np.arange(1, min(plant.max_batch_size, EXACT_BATCHES) + 1, dtype=float)
    for start in range(0, exact.size, BATCH_CHUNK):  # a chunk at a time: bounded memory
        seconds, watts = at(exact[start : start + BATCH_CHUNK])
        least_s = np.minimum(least_s, seconds.min(axis=1))
        least_j = np.minimum(least_j, (seconds * watts).min(axis=1))
        least_marginal_j = np.minimum(
            least_marginal_j, (seconds * (watts - idle_floor)).min(axis=1)
        )
    if plant.max_batch_size > EXACT_BATCHES:
        # Past them, stretches of batches between points of a geometric grid: a token's
        # seconds fall with the batch and its power moves one way (the batch power
        # model's factor grows with it), so the least product over a stretch is at one
        # of its corners (the seconds at either end times the power at either end).
        count = math.ceil(math.log(plant.max_batch_size / EXACT_BATCHES) / math.log(GRID_RATIO))
        grid = np.unique(np.geomspace(EXACT_BATCHES, plant.max_batch_size, count + 1))
        for start in range(0, grid.size - 1, BATCH_CHUNK):
            seconds, watts = at(grid[start : start + BATCH_CHUNK + 1])  # stretches' ends
            least_s = np.minimum(least_s, seconds[:, -1])
            least_j = np.minimum(least_j, _least_over_stretches(seconds, watts))
            least_marginal_j = np.minimum(
                least_marginal_j, _least_over_stretches(seconds, watts - idle_floor)
            )
    return {
        "clock_mhz": clocks,
        "prefill_s": 1.0 / prefill_rate,
        "prefill_j": prefill_power / prefill_rate,
        "decode_s": least_s,
        "decode_j": least_j,
        "decode_marginal_j": least_marginal_j,
        "idle_w": idle_power,
        "floor_w": np.asarray(idle_floor),
    }


def fluid_energy_lower_bound(
    workload: Sequence[Request],
    plant: ServingPlant,
    *,
    window_s: float = 1.0,
    replicas: int = 1,
    phases: Sequence[str] = PHASES,
) -> FluidEnergyBound:
    """Lower bound on the energy of any run serving ``workload`` (module notes).

    Args:
        workload: the requests.
        plant: each engine's plant.
        window_s: the LP's window.
        replicas: engines of ``plant`` serving the work together (a pool of a
            disaggregated layout): ``replicas`` times the busy seconds per window and
            ``replicas`` times the idle floor.
        phases: the work served: ``"prefill"`` (every prompt token) and ``"decode"``
            (``output_tokens - 1`` tokens per request); a disaggregated pool serves one.

    Raises:
        ValueError: an empty workload, a non-positive window, a replica count below
            one, or no or an unknown phase.
    """
    requests = tuple(workload)
    if not requests:
        raise ValueError("fluid_energy_lower_bound needs at least one request")
    if not math.isfinite(window_s) or window_s <= 0.0:
        raise ValueError(f"window_s must be positive, got {window_s!r}")
    if int(replicas) != replicas or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    if not phases or not set(phases) <= set(PHASES):
        raise ValueError(f"phases must be some of {PHASES}, got {phases!r}")
    minimum_context = float(min(r.prompt_tokens for r in requests))
    costs = phase_token_costs(plant, minimum_context)
    idle_floor_w = float(costs["floor_w"])
    prefill_s, prefill_j = costs["prefill_s"], costs["prefill_j"]
    decode_s, decode_j = costs["decode_s"], costs["decode_j"]
    prefill_marginal = prefill_j - idle_floor_w * prefill_s
    decode_marginal = costs["decode_marginal_j"]
    prefill_hull = _lower_hull(prefill_s, prefill_marginal)
    decode_hull = _lower_hull(decode_s, decode_marginal)
    tail_prefill_j = float(np.min(prefill_j))
    tail_decode_j = float(np.min(decode_j))

    arrivals = np.array([r.arrival_time_s for r in requests], dtype=float)
    prompt = np.array([r.prompt_tokens for r in requests], dtype=float)
    decode = np.array([r.output_tokens - 1 for r in requests], dtype=float)
    if "prefill" not in phases:
        prompt = np.zeros_like(prompt)
    if "decode" not in phases:
        decode = np.zeros_like(decode)
    last_arrival = float(arrivals.max())
    total_prefill, total_decode = float(prompt.sum()), float(decode.sum())
    windows = int(math.ceil(last_arrival / window_s - 1e-12)) if last_arrival > 0.0 else 0
    clocks = costs["clock_mhz"]
    hull_clocks = (
        tuple(float(clocks[i]) for i in prefill_hull),
        tuple(float(clocks[i]) for i in decode_hull),
    )
    if windows == 0:
        energy = tail_prefill_j * total_prefill + tail_decode_j * total_decode
        return FluidEnergyBound(
            energy,
            0.0,
            float(window_s),
            0,
            last_arrival,
            total_prefill,
            total_decode,
            total_prefill,
            total_decode,
            *hull_clocks,
            True,
            "no window before the last arrival",
        )
    lengths = np.full(windows, float(window_s))
    lengths[-1] = last_arrival - window_s * (windows - 1)
    index = np.minimum((arrivals / window_s).astype(int), windows - 1)
    prefill_in = np.bincount(index, weights=prompt, minlength=windows)
    decode_in = np.bincount(index, weights=decode, minlength=windows)

    # Variable layout per window k: [x_k (prefill per hull clock), y_k (decode per hull
    # clock), q_k (prefill backlog at the window's end), r_k (decode backlog)].
    hp, hd = prefill_hull.size, decode_hull.size
    width = hp + hd + 2
    count = windows * width
    cost = np.zeros(count)
    base = np.arange(windows) * width
    for j, level in enumerate(prefill_hull):
        cost[base + j] = prefill_marginal[level]
    for j, level in enumerate(decode_hull):
        cost[base + hp + j] = decode_marginal[level]
    cost[base[-1] + hp + hd] = tail_prefill_j
    cost[base[-1] + hp + hd + 1] = tail_decode_j

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []

    def put(row: int, col: int, value: float) -> None:
        rows.append(row)
        cols.append(col)
        vals.append(value)

    # Equalities: backlog_k - backlog_{k-1} + served_k = arrived_k, per phase.
    for k in range(windows):
        b = k * width
        for j in range(hp):
            put(2 * k, b + j, 1.0)
        put(2 * k, b + hp + hd, 1.0)
        for j in range(hd):
            put(2 * k + 1, b + hp + j, 1.0)
        put(2 * k + 1, b + hp + hd + 1, 1.0)
        if k > 0:
            put(2 * k, b - width + hp + hd, -1.0)
            put(2 * k + 1, b - width + hp + hd + 1, -1.0)
    equality = sparse.csr_matrix((vals, (rows, cols)), shape=(2 * windows, count))
    equality_rhs = np.column_stack([prefill_in, decode_in]).reshape(-1)
    rows, cols, vals = [], [], []
    # Inequalities: busy seconds of window k <= its length.
    for k in range(windows):
        b = k * width
        for j, level in enumerate(prefill_hull):
            put(k, b + j, float(prefill_s[level]))
        for j, level in enumerate(decode_hull):
            put(k, b + hp + j, float(decode_s[level]))
    inequality = sparse.csr_matrix((vals, (rows, cols)), shape=(windows, count))
    solution = linprog(
        cost,
        A_ub=inequality,
        b_ub=lengths * replicas,
        A_eq=equality,
        b_eq=equality_rhs,
        bounds=(0.0, None),
        method="highs",
    )
    idle_floor_j = idle_floor_w * last_arrival * replicas
    if not solution.success:
        # Never infeasible (the tail absorbs any work); report rather than raise.
        return FluidEnergyBound(
            float("nan"),
            idle_floor_j,
            float(window_s),
            windows,
            last_arrival,
            total_prefill,
            total_decode,
            float("nan"),
            float("nan"),
            *hull_clocks,
            False,
            str(solution.message),
        )
    x = np.asarray(solution.x)
    return FluidEnergyBound(
        energy_j=float(solution.fun) + idle_floor_j,
        idle_floor_j=idle_floor_j,
        window_s=float(window_s),
        windows=windows,
        last_arrival_s=last_arrival,
        prefill_tokens=total_prefill,
        decode_tokens=total_decode,
        tail_prefill_tokens=float(x[base[-1] + hp + hd]),
        tail_decode_tokens=float(x[base[-1] + hp + hd + 1]),
        prefill_hull_clocks_mhz=hull_clocks[0],
        decode_hull_clocks_mhz=hull_clocks[1],
        success=True,
        message=str(solution.message),
    )
