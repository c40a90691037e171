"""The online model's predictions at many clocks, compiled (numba).

A clock's features weight at most two neighbouring knots (piecewise-linear hat weights),
so the prediction at a clock reads two entries per block of the estimate, and its
variance a few entries of the covariance: a few dozen operations per clock. Computed
this way, a table over every supported clock costs microseconds, where the dense matrix
products over all knots cost tens of them on every model update (each decision).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.compiled import inlined, jit

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Rows of the array :func:`predict_table` returns (one column per clock).
PREFILL_MEAN, PREFILL_STD, DECODE_MEAN, DECODE_STD = 0, 1, 2, 3
POWER_ROWS = 4  # then one row per power block (idle, prefill, decode)


@inlined
def _hat(clock: float, knots_mhz: FloatArray) -> tuple[int, int, float]:
    """The two knots around ``clock`` and the upper one's hat weight (np.interp's
    weights, clamped to the end knots)."""
    knots = knots_mhz.size
    if clock <= knots_mhz[0]:
        return 0, 0, 0.0
    if clock >= knots_mhz[knots - 1]:
        return knots - 1, knots - 1, 0.0
    upper = int(np.searchsorted(knots_mhz, clock, side="right"))
    lower = upper - 1
    return lower, upper, (clock - knots_mhz[lower]) / (knots_mhz[upper] - knots_mhz[lower])


@inlined
def _time_moments(
    lower: int,
    upper: int,
    low: float,
    high: float,
    knots: int,
    time_mean: FloatArray,
    time_covariance: FloatArray,
    work: FloatArray,
    index: IntArray,
    weight: FloatArray,
) -> tuple[float, float]:
    """Mean and variance of the time blocks weighted by ``work`` at a clock whose scaled
    hat weights are ``low`` (knot ``lower``) and ``high`` (knot ``upper``): the feature's
    non-zero entries (two per block with work) gathered into ``index`` and ``weight``
    (scratch), then their mean and quadratic form."""
    count = 0
    for block in range(work.size):
        if work[block] == 0.0:
            continue
        for knot, hat in ((lower, low), (upper, high)):
            if hat != 0.0:
                index[count] = block * knots + knot
                weight[count] = work[block] * hat
                count += 1
    mean = 0.0
    variance = 0.0
    for i in range(count):
        mean += weight[i] * time_mean[index[i]]
        for j in range(count):
            variance += weight[i] * weight[j] * time_covariance[index[i], index[j]]
    return mean, variance


@jit
def predict_table(
    clocks_mhz: FloatArray,
    knots_mhz: FloatArray,
    maximum_mhz: float,
    time_mean: FloatArray,
    time_covariance: FloatArray,
    power_mean: FloatArray,
    prefill_unit: float,
    decode_work: FloatArray,
) -> FloatArray:
    """Per clock: the prefill block's mean and standard deviation (divided by
    ``prefill_unit``), the decode iteration's (the time blocks weighted by
    ``decode_work``) and every power block's mean (rows as the constants above).

    The time features of a clock are the hat weights scaled by ``maximum_mhz / f``
    (``OnlineModel.time_features``); the power features the hat weights alone."""
    knots = knots_mhz.size
    power_blocks = power_mean.size // knots
    out = np.empty((POWER_ROWS + power_blocks, clocks_mhz.size))
    prefill_work = np.zeros(decode_work.size)
    prefill_work[0] = 1.0 / prefill_unit
    index = np.empty(2 * decode_work.size, dtype=np.int64)
    weight = np.empty(2 * decode_work.size)
    for n in range(clocks_mhz.size):
        clock = clocks_mhz[n]
        lower, upper, share = _hat(clock, knots_mhz)
        scale = maximum_mhz / max(clock, 1.0)
        low, high = (1.0 - share) * scale, share * scale
        mean, variance = _time_moments(
            lower, upper, low, high, knots, time_mean, time_covariance, prefill_work, index, weight
        )
        out[PREFILL_MEAN, n] = mean
        out[PREFILL_STD, n] = math.sqrt(max(variance, 0.0))
        mean, variance = _time_moments(
            lower, upper, low, high, knots, time_mean, time_covariance, decode_work, index, weight
        )
        out[DECODE_MEAN, n] = mean
        out[DECODE_STD, n] = math.sqrt(max(variance, 0.0))
        for block in range(power_blocks):
            out[POWER_ROWS + block, n] = (1.0 - share) * power_mean[
                block * knots + lower
            ] + share * power_mean[block * knots + upper]
    return out


@inlined
def _physical_inplace(times: FloatArray, realized_mhz: FloatArray) -> None:
    """``rules._physical`` in place: the times made non-increasing in the clock, then
    held to grow no faster than 1/f below any clock (``t(f) <= t(f') f' / f``)."""
    n = times.size
    for i in range(n - 2, -1, -1):
        times[i] = max(times[i], times[i + 1])
    clocks = np.empty(n)
    running = 1.0
    for i in range(n):
        running = max(running, realized_mhz[i])
        clocks[i] = running
    cycles = times[n - 1] * clocks[n - 1]
    times[n - 1] = cycles / clocks[n - 1]
    for i in range(n - 2, -1, -1):
        cycles = min(cycles, times[i] * clocks[i])
        times[i] = cycles / clocks[i]


@jit
def learned_tables(
    clocks_mhz: FloatArray,
    realized_mhz: FloatArray,
    knots_mhz: FloatArray,
    maximum_mhz: float,
    time_mean: FloatArray,
    time_covariance: FloatArray,
    power_mean: FloatArray,
    prefill_unit: float,
    z: float,
    reference_batch: float,
    decode_work: FloatArray,
    top_work: FloatArray,
) -> tuple[FloatArray, FloatArray, bool]:
    """The learned profile's arrays in one pass (``OnlineMPCController.learned_profile``):

    - rows ``(prefill tokens/s, decode tokens/s at reference_batch, prefill W, decode W,
      idle W)`` over ``clocks_mhz``, the model read at ``realized_mhz``: latencies at
      their mean plus ``z`` standard deviations, held to the physics (non-increasing in
      the clock, at most 1/f growth below a clock), powers non-decreasing in the clock;
    - the decode iteration's parts at the top clock: the mean of the time blocks under
      each row of ``top_work`` (weights only, batch added, context added);
    - whether every table value is finite and positive (the profile's validation)."""
    n = clocks_mhz.size
    rows = predict_table(
        realized_mhz,
        knots_mhz,
        maximum_mhz,
        time_mean,
        time_covariance,
        power_mean,
        prefill_unit,
        decode_work,
    )
    prefill_s = np.empty(n)
    iteration_s = np.empty(n)
    for i in range(n):
        prefill_s[i] = max(rows[PREFILL_MEAN, i] + z * rows[PREFILL_STD, i], 1e-7)
        iteration_s[i] = max(rows[DECODE_MEAN, i] + z * rows[DECODE_STD, i], 1e-5)
    _physical_inplace(prefill_s, realized_mhz)
    _physical_inplace(iteration_s, realized_mhz)
    out = np.empty((5, n))
    for i in range(n):
        out[0, i] = 1.0 / prefill_s[i]
        out[1, i] = reference_batch / iteration_s[i]
    # Powers per phase (prefill, decode, idle; the model's blocks are idle, prefill,
    # decode), at least 1 W and non-decreasing in the clock.
    for row, block in ((2, 1), (3, 2), (4, 0)):
        running = 1.0
        for i in range(n):
            running = max(running, rows[POWER_ROWS + block, i])
            out[row, i] = running
    parts = np.empty(top_work.shape[0])
    for k in range(top_work.shape[0]):
        parts[k] = predict_table(
            clocks_mhz[n - 1 :],
            knots_mhz,
            maximum_mhz,
            time_mean,
            time_covariance,
            power_mean,
            prefill_unit,
            top_work[k],
        )[DECODE_MEAN, 0]
    # A NaN the running maxima would pass over fails here, as the profile's own check.
    valid = bool(np.all(np.isfinite(rows)))
    for value in out.ravel():
        if not (0.0 < value < math.inf):
            valid = False
    return out, parts, valid


@jit
def work_power(
    rows: FloatArray, prompt_rate: float, decode_share: float, z: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Mean watts at each clock (a column of :func:`predict_table`'s ``rows``, power
    blocks idle, prefill, decode) while prefilling ``prompt_rate`` prompt tokens per second
    and decoding ``decode_share`` of the time: the idle power, the prefill power above idle
    for the seconds the prompts take, and the decode power above idle for its share; with
    the prefill latency at its mean, its mean less and its mean plus ``z`` standard
    deviations (the powers at their means; ``controllers.online.efficiency``)."""
    count = rows.shape[1]
    mean = np.empty(count)
    optimistic = np.empty(count)
    pessimistic = np.empty(count)
    for n in range(count):
        idle = rows[POWER_ROWS, n]
        prefill = prompt_rate * max(rows[POWER_ROWS + 1, n] - idle, 0.0)
        base = idle + decode_share * max(rows[POWER_ROWS + 2, n] - idle, 0.0)
        seconds, spread = rows[PREFILL_MEAN, n], z * rows[PREFILL_STD, n]
        mean[n] = base + prefill * max(seconds, 0.0)
        optimistic[n] = base + prefill * max(seconds - spread, 0.0)
        pessimistic[n] = base + prefill * max(seconds + spread, 0.0)
    return mean, optimistic, pessimistic


def compile_prediction() -> None:
    """Compile (or load from numba's cache) the kernel once per process, on a tiny
    input, so no control period pays the compile time."""
    knots = np.array([1.0, 2.0])
    work = np.array([0.0, 1.0])
    predict_table(knots, knots, 2.0, np.ones(4), np.eye(4), np.ones(2), 1.0, work)
    work_power(np.ones((POWER_ROWS + 3, 2)), 1.0, 1.0, 1.0)
    learned_tables(
        knots,
        knots,
        knots,
        2.0,
        np.ones(4),
        np.eye(4),
        np.ones(6),
        1.0,
        1.0,
        1.0,
        work,
        work[None, :],
    )
