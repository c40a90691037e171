"""Compiled kernels of the fast MPC solver: pricing plans and searching them (numba).

The fast solver's cost is the seed MPC's (:meth:`controllers.mpc.controller.MPCProblem.costs`);
these kernels compute exactly that cost one plan at a time, in compiled code, so a search
can do what vectorised numpy cannot cheaply do:

- **incremental pricing**: a move that changes a plan from period ``p`` on only re-rolls
  the fluid model from the incumbent's stored state at ``p``, and a candidate pool (sorted,
  so neighbours share prefixes) is rolled from where each plan leaves the one before it;
- **pruning**: every term of the cost is non-negative and accumulates period by period,
  so a trial is abandoned as soon as its partial cost reaches the incumbent's;
- **first-improvement local search**: moves are tried in a fixed cyclic order and the
  first that lowers the cost is taken, with no per-round array building.

Problem data travel as three arrays built by :func:`problem_arrays`: a per-level table,
a parameter vector and the per-period prompt arrivals. The tests check the kernel's costs
against ``MPCProblem.costs`` for both latency models.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.compiled import inlined, jit
from gpugov.controllers.mpc.controller import CHUNK_TOKENS, MPCProblem
from gpugov.controllers.mpc.model import PLACE_LOAD_CEILING

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Rows of the per-level table (one column per supported clock).
_PREFILL_CAPACITY = 0  # prefill tokens one period serves, at full share
_DECODE_CAPACITY = 1  # decode tokens one period serves, at full share
_INVERSE_PREFILL = 2  # 1 / prefill rate (the seed's TTFT proxy)
_INVERSE_DECODE = 3  # 1 / decode rate (the seed's TPOT proxy)
_T0 = 4  # iteration model: decode iteration time = T0 + T1 * active
_T1 = 5
_INVERSE_CAPACITY = 6  # 1 / (prefill rate * period)
_INVERSE_RATE = 7  # 1 / prefill rate (iteration model)
_PREFILL_POWER = 8
_DECODE_POWER = 9
_IDLE_POWER = 10
_NORMALIZED_CLOCK = 11  # (clock - minimum) / span, for the clock-change penalty
_TABLE_ROWS = 12

# Entries of the parameter vector.
_P_PREFILL, _P_DECODE, _P_ACTIVE, _P_TEMPERATURE = 0, 1, 2, 3
_P_INV_PROMPT, _P_INV_OUTPUT, _P_MEAN_OUTPUT = 4, 5, 6
_P_ITERATION, _P_TTFT_PROMPT, _P_TTFT_TARGET, _P_TPOT_TARGET = 7, 8, 9, 10
_P_W_POWER, _P_W_TTFT, _P_W_TPOT, _P_W_CHANGE, _P_W_LIMIT, _P_W_TERMINAL = (
    11,
    12,
    13,
    14,
    15,
    16,
)
_P_CHECK_POWER, _P_POWER_LIMIT, _P_INV_MAX_POWER = 17, 18, 19
_P_CHECK_THERMAL, _P_AMBIENT, _P_RESISTANCE, _P_DECAY, _P_THERMAL_LIMIT = 20, 21, 22, 23, 24
_P_PREVIOUS, _P_INV_PREFILL_MAX, _P_INV_DECODE_MAX, _P_CHUNK = 25, 26, 27, 28
_P_TTFT_CAP = 29  # most TTFT excess penalised (s)
_P_PERIOD = 30  # control period (s)
_P_TTFT_ALLOWANCE = 31  # per-prompt TTFT allowance (s per prompt token)
_P_TTFT_OWN_PROMPT = 32  # the new request's own prompt within _P_TTFT_PROMPT
_P_DWELL = 33  # periods a clock is held before a lower one applies (0: none)
_P_HELD_LEVEL = 34  # level held at the first decision (-1: unknown, nothing held)
_P_HELD_PERIODS = 35  # periods it has been held by then
_P_TERMINAL_SHARE = 36  # share of the seed's terminal penalty charged
_P_DEFERRED_DECODE = 37  # cost of a decode token the rest of the share defers, at its least energy
_P_QUEUED_REPLIES = 38  # 1: a queued prompt's replies count in the terminal backlog
_P_BATCH_PLACES = 39  # the engine's batch bound (MPCProblem.batch_places)
_P_PLACE_EXPONENT = 40  # sqrt(2 (places + 1)) - 1 (MPCProblem.place_wait_s)
_P_MEAN_PROMPT = 41  # the mean prompt, at least 1 token
_P_WAIT_LOG = 42  # log(1 - wait_quantile)
_P_WAIT_LOAD = 43  # the load per place below which random arrivals' wait term is zero
_PARAMETERS = 44

# Columns of a trajectory row (``_load`` / ``_store``): the state before a period, the
# cost so far, and the safety chain's dwell state (the level applied, periods held).
_STATE_COLUMNS = 7


@jit
def _level_table(
    prefill_rate: FloatArray,
    decode_rate: FloatArray,
    prefill_power: FloatArray,
    decode_power: FloatArray,
    idle_power: FloatArray,
    clocks: FloatArray,
    period_s: float,
    reference_batch: float,
    weight_fraction: float,
    per_active: float,
    minimum_mhz: float,
    span_mhz: float,
) -> FloatArray:
    """The per-level table of :func:`problem_arrays` (compiled: one pass over the levels
    in place of some twenty numpy operations, each with its own call and array; the
    same operations in the same order, so the same numbers). ``per_active`` is the
    iteration model's slope per active request over the reference batch's time."""
    table = np.empty((_TABLE_ROWS, clocks.size))
    for level in range(clocks.size):
        prefill = prefill_rate[level]
        decode = decode_rate[level]
        safe_decode = max(decode, 1e-12)
        inverse_prefill = 1.0 / max(prefill, 1e-12)
        prefill_capacity = prefill * period_s
        t_ref = reference_batch / safe_decode
        table[_PREFILL_CAPACITY, level] = prefill_capacity
        table[_DECODE_CAPACITY, level] = decode * period_s
        table[_INVERSE_PREFILL, level] = inverse_prefill
        table[_INVERSE_DECODE, level] = 1.0 / safe_decode
        table[_T0, level] = t_ref * weight_fraction
        table[_T1, level] = t_ref * per_active
        table[_INVERSE_CAPACITY, level] = 1.0 / max(prefill_capacity, 1e-12)
        table[_INVERSE_RATE, level] = inverse_prefill
        table[_PREFILL_POWER, level] = prefill_power[level]
        table[_DECODE_POWER, level] = decode_power[level]
        table[_IDLE_POWER, level] = idle_power[level]
        table[_NORMALIZED_CLOCK, level] = (clocks[level] - minimum_mhz) / span_mhz
    return table


def problem_arrays(
    problem: MPCProblem, clock_mhz: FloatArray | None = None
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The kernel's view of ``problem``: ``(table, parameters, arrivals)``.

    ``table`` has one column per supported clock (the profile's, or ``clock_mhz``
    interpolated on the profile), laid out by the ``_`` row constants above.
    """
    plant = problem.plant
    profile = plant.profile
    grid = np.asarray(profile.clock_mhz, dtype=float)  # only read
    clocks = grid if clock_mhz is None else np.asarray(clock_mhz, dtype=float)

    def at(values: FloatArray) -> FloatArray:
        if clock_mhz is None:  # the profile's own clocks: nothing to interpolate
            return np.asarray(values, dtype=float)
        return np.interp(clocks, grid, np.asarray(values, dtype=float))

    h = problem.control_period_s
    model = profile.decode_latency_model
    reference = float(model.reference_batch_size)
    context = problem.mean_prompt_tokens + 0.5 * problem.mean_output_tokens
    minimum = profile.minimum_clock_mhz
    span = profile.maximum_clock_mhz - minimum
    table = _level_table(
        at(profile.prefill_tokens_per_s),
        at(profile.decode_tokens_per_s),
        at(profile.prefill_power_w),
        at(profile.decode_power_w),
        at(profile.idle_power_w),
        clocks,
        float(h),
        reference,
        float(model.weight_fraction),
        float(
            model.batch_fraction / reference
            + model.kv_fraction * context / (reference * model.reference_context_tokens)
        ),
        float(minimum),
        float(span),
    )

    weights = problem.weights
    maximum_power = problem.maximum_power_w
    ttft_scale = max(profile.ttft_slo_s, 1e-12)
    tpot_scale = max(profile.tpot_slo_s, 1e-12)
    power_limit = plant.power_limit_w / maximum_power
    highest_power = float(table[_PREFILL_POWER : _IDLE_POWER + 1].max())
    ambient = plant.ambient_temperature_c
    resistance = plant.thermal_resistance_c_per_w
    parameters = np.zeros(_PARAMETERS)
    parameters[_P_PREFILL] = max(0.0, problem.initial_prefill_tokens)
    parameters[_P_DECODE] = max(0.0, problem.initial_decode_tokens)
    parameters[_P_ACTIVE] = max(0.0, problem.initial_active_decode)
    parameters[_P_TEMPERATURE] = float(problem.initial_temperature_c)
    parameters[_P_INV_PROMPT] = 1.0 / max(problem.mean_prompt_tokens, 1.0)
    parameters[_P_INV_OUTPUT] = 1.0 / max(problem.mean_output_tokens, 1.0)
    parameters[_P_MEAN_OUTPUT] = problem.mean_output_tokens
    parameters[_P_ITERATION] = float(problem.latency_model != "seed")
    parameters[_P_TTFT_PROMPT] = problem.ttft_prompt
    parameters[_P_TTFT_TARGET] = problem.ttft_target_s
    parameters[_P_TPOT_TARGET] = problem.tpot_target_s
    parameters[_P_W_POWER] = weights.power / maximum_power
    parameters[_P_W_TTFT] = weights.ttft / (ttft_scale * ttft_scale)
    parameters[_P_W_TPOT] = problem.tpot_weight / (tpot_scale * tpot_scale)
    parameters[_P_W_CHANGE] = weights.clock_change
    parameters[_P_W_LIMIT] = weights.constraint
    parameters[_P_W_TERMINAL] = weights.terminal_backlog
    # The limit terms are skipped when no plan can reach them: the temperature is a
    # running convex combination of the start temperature and equilibria no hotter than
    # the table's highest power allows.
    parameters[_P_CHECK_POWER] = float(highest_power / maximum_power > power_limit)
    parameters[_P_POWER_LIMIT] = power_limit
    parameters[_P_INV_MAX_POWER] = 1.0 / maximum_power
    parameters[_P_CHECK_THERMAL] = float(
        max(float(problem.initial_temperature_c), ambient + resistance * highest_power)
        > plant.thermal_limit_c
    )
    parameters[_P_AMBIENT] = ambient
    parameters[_P_RESISTANCE] = resistance
    parameters[_P_DECAY] = math.exp(-h / plant.thermal_time_constant_s)
    parameters[_P_THERMAL_LIMIT] = plant.thermal_limit_c
    parameters[_P_PREVIOUS] = (problem.previous_clock_mhz - minimum) / span
    parameters[_P_INV_PREFILL_MAX] = 1.0 / profile.prefill_tokens_per_s[-1]
    parameters[_P_INV_DECODE_MAX] = 1.0 / profile.decode_tokens_per_s[-1]
    parameters[_P_CHUNK] = CHUNK_TOKENS
    parameters[_P_TTFT_CAP] = problem.ttft_excess_cap_s
    parameters[_P_PERIOD] = h
    parameters[_P_TTFT_ALLOWANCE] = problem.ttft_slo_per_prompt_token_s
    parameters[_P_TTFT_OWN_PROMPT] = problem.ttft_own_prompt
    parameters[_P_TERMINAL_SHARE] = problem.terminal_share
    parameters[_P_QUEUED_REPLIES] = float(problem.terminal_queued_replies)
    places = problem.batch_places
    parameters[_P_BATCH_PLACES] = places
    parameters[_P_PLACE_EXPONENT] = math.sqrt(2.0 * (places + 1.0)) - 1.0
    parameters[_P_MEAN_PROMPT] = max(problem.mean_prompt_tokens, 1.0)
    parameters[_P_WAIT_LOG] = math.log(1.0 - problem.wait_quantile)
    parameters[_P_WAIT_LOAD] = math.exp(parameters[_P_WAIT_LOG] / parameters[_P_PLACE_EXPONENT])
    parameters[_P_DEFERRED_DECODE] = (
        (1.0 - problem.terminal_share)
        * weights.power
        * problem.decode_energy_per_token_j
        / (maximum_power * h)
    )
    held = problem.held_clock_mhz
    if problem.dwell_periods > 0.0 and held is not None:
        parameters[_P_DWELL] = problem.dwell_periods
        parameters[_P_HELD_LEVEL] = float(np.argmin(np.abs(clocks - held)))
        parameters[_P_HELD_PERIODS] = min(problem.held_periods, 1e9)
    else:
        parameters[_P_HELD_LEVEL] = -1.0
    return table, parameters, np.asarray(problem.prompt_arrivals, dtype=float)


def first_ttft_excess_s(problem: MPCProblem, level: int) -> float:
    """The TTFT excess over the target, at most :attr:`MPCProblem.ttft_excess_cap_s`, of
    the first period's new request with the clock at ``level`` (an index into the
    profile's clocks): the first period's TTFT term of :meth:`MPCProblem.costs`, priced
    alone by the kernel (a few tens of microseconds, where ``costs`` takes hundreds)."""
    table, parameters, arrivals = problem_arrays(problem)
    for index in (_P_W_POWER, _P_W_TPOT, _P_W_CHANGE, _P_W_LIMIT, _P_W_TERMINAL):
        parameters[index] = 0.0
    parameters[_P_DEFERRED_DECODE] = 0.0
    parameters[_P_W_TTFT] = 1.0
    plan = np.full((1, 1), level, dtype=np.int64)
    steps = np.zeros(1, dtype=np.int64)
    return math.sqrt(float(price_plans(plan, steps, table, parameters, arrivals[:1])[0]))


@inlined
def _place_wait(
    level: int,
    prefill: float,
    active: float,
    arrivals: float,
    table: FloatArray,
    parameters: FloatArray,
) -> float:
    """A new request's wait for a place in the batch (MPCProblem.place_wait_s): the larger
    of the queue in sight's and random arrivals' mean wait. Zero, without the logarithm,
    while no request waits in sight and the load per place is below the quantile's
    (every decision on an engine of 256 places: the search prices this per plan step)."""
    places = parameters[_P_BATCH_PLACES]
    prompt = parameters[_P_MEAN_PROMPT]
    burst = parameters[_P_TTFT_PROMPT] - parameters[_P_TTFT_OWN_PROMPT]
    releases = max(active + (prefill + burst) / prompt + 1.0 - places, 0.0)
    decoding = min(max(active, 1.0), places)
    decode_s = parameters[_P_MEAN_OUTPUT] * (table[_T0, level] + table[_T1, level] * decoding)
    residence = prompt * table[_INVERSE_RATE, level] + decode_s
    load = min(arrivals / (prompt * parameters[_P_PERIOD]) * residence / places, PLACE_LOAD_CEILING)
    if releases <= 0.0 and load <= parameters[_P_WAIT_LOAD]:
        return 0.0
    in_sight = releases * (decode_s / decoding)
    tail = parameters[_P_PLACE_EXPONENT] * math.log(max(load, 1e-300)) - parameters[_P_WAIT_LOG]
    random = max(tail, 0.0) / (places * (1.0 - load)) * residence
    return max(in_sight, random)


@inlined
def _advance(
    level: int,
    previous_level: int,
    step: int,
    prefill: float,
    decode: float,
    active: float,
    temperature: float,
    table: FloatArray,
    parameters: FloatArray,
    arrivals: FloatArray,
) -> tuple[float, float, float, float, float]:
    """Advance the state (prefill, decode, active, temperature) one period at ``level``:
    that period's cost (the clock change from ``previous_level``, or from the problem's
    previous clock when it is negative, included) and the new state."""
    available_prefill = prefill + arrivals[step]
    has_prefill = available_prefill > 1e-12
    has_decode = decode > 1e-12
    if has_prefill and has_decode:
        prefill_share = 0.5
        decode_share = 0.5
    else:
        prefill_share = 1.0 if has_prefill else 0.0
        decode_share = 1.0 if has_decode else 0.0
    served_prefill = min(available_prefill, table[_PREFILL_CAPACITY, level] * prefill_share)
    completed_prefill = served_prefill * parameters[_P_INV_PROMPT]
    prefill = max(available_prefill - served_prefill, 0.0)
    available_decode = decode + completed_prefill * parameters[_P_MEAN_OUTPUT]
    served_decode = min(available_decode, table[_DECODE_CAPACITY, level] * decode_share)
    decode = max(available_decode - served_decode, 0.0)
    active = max(active + completed_prefill - served_decode * parameters[_P_INV_OUTPUT], 0.0)
    if has_prefill or has_decode:
        power = (
            prefill_share * table[_PREFILL_POWER, level]
            + decode_share * table[_DECODE_POWER, level]
        )
    else:
        power = table[_IDLE_POWER, level]
    if parameters[_P_ITERATION] > 0.0:
        busy = active > 1e-9
        t_dec = table[_T0, level] + table[_T1, level] * active
        chunk = max(parameters[_P_CHUNK] - active, 32.0)
        iteration = t_dec / chunk if busy else 0.0
        per_token = iteration + table[_INVERSE_RATE, level]
        ttft = (prefill + parameters[_P_TTFT_PROMPT]) * per_token
        if parameters[_P_TTFT_ALLOWANCE] > 0.0:
            # Judged per prompt (MPCProblem.ttft_proxy): the charged prompt less its
            # allowance, or the queue alone ahead of a prompt of no tokens.
            own = parameters[_P_TTFT_OWN_PROMPT]
            ttft = max(
                ttft - parameters[_P_TTFT_ALLOWANCE] * own,
                (prefill + parameters[_P_TTFT_PROMPT] - own) * per_token,
            )
        ttft += _place_wait(level, prefill, active, arrivals[step], table, parameters)
        ttft -= parameters[_P_TTFT_TARGET]
        stretch = max(1.0 - served_prefill * table[_INVERSE_CAPACITY, level], 0.05)
        # While prompts are prefilled every decode iteration carries a chunk: the share of
        # a request's decode life (at most a period) that the prefill stretch covers.
        slice_s = chunk * table[_INVERSE_RATE, level]
        prefilling_s = served_prefill * (iteration + table[_INVERSE_RATE, level])
        life_s = max(min(parameters[_P_MEAN_OUTPUT] * t_dec, parameters[_P_PERIOD]), 1e-9)
        share = min(1.0, prefilling_s / life_s)
        # Tokens come one per iteration: a time share ``share`` of mixed iterations.
        mixed = 1.0 / (share / (t_dec + slice_s) + (1.0 - share) / max(t_dec, 1e-12))
        # Chunked prefill never stalls the decode batch: an iteration carries at most one
        # chunk, so the stretch is bounded by the mixed iteration's time.
        stretched = min(t_dec / stretch, t_dec + slice_s)
        tpot = (max(stretched, mixed) if busy else 0.0) - parameters[_P_TPOT_TARGET]
    else:
        ttft = prefill * table[_INVERSE_PREFILL, level] - parameters[_P_TTFT_TARGET]
        tpot = active * table[_INVERSE_DECODE, level] - parameters[_P_TPOT_TARGET]
    ttft = min(max(ttft, 0.0), parameters[_P_TTFT_CAP])
    tpot = max(tpot, 0.0)
    limit = 0.0
    if parameters[_P_CHECK_POWER] > 0.0:
        over_power = max(0.0, power * parameters[_P_INV_MAX_POWER] - parameters[_P_POWER_LIMIT])
        limit += over_power * over_power
    if parameters[_P_CHECK_THERMAL] > 0.0:
        equilibrium = parameters[_P_AMBIENT] + parameters[_P_RESISTANCE] * power
        temperature = equilibrium + (temperature - equilibrium) * parameters[_P_DECAY]
        over_thermal = max(0.0, temperature - parameters[_P_THERMAL_LIMIT])
        limit += over_thermal * over_thermal
    if previous_level < 0:
        change = table[_NORMALIZED_CLOCK, level] - parameters[_P_PREVIOUS]
    else:
        change = table[_NORMALIZED_CLOCK, level] - table[_NORMALIZED_CLOCK, previous_level]
    cost = (
        parameters[_P_W_POWER] * power
        + parameters[_P_W_TTFT] * ttft * ttft
        + parameters[_P_W_TPOT] * tpot * tpot
        + parameters[_P_W_CHANGE] * change * change
        + parameters[_P_W_LIMIT] * limit
    )
    return cost, prefill, decode, active, temperature


@jit
def _terminal(prefill: float, decode: float, parameters: FloatArray) -> float:
    """The terminal term of the state after the last period (MPCProblem.terminal_cost)."""
    if parameters[_P_QUEUED_REPLIES] > 0.0:
        decode += prefill * parameters[_P_INV_PROMPT] * parameters[_P_MEAN_OUTPUT]
    backlog = parameters[_P_TERMINAL_SHARE] * (
        prefill * parameters[_P_INV_PREFILL_MAX] + decode * parameters[_P_INV_DECODE_MAX]
    )
    return parameters[_P_W_TERMINAL] * backlog * backlog + parameters[_P_DEFERRED_DECODE] * decode


@jit
def _trajectory(steps: int, parameters: FloatArray) -> FloatArray:
    """A trajectory of ``steps`` periods whose row 0 is the problem's initial state."""
    states = np.zeros((steps + 1, _STATE_COLUMNS))
    states[0, 0] = parameters[_P_PREFILL]
    states[0, 1] = parameters[_P_DECODE]
    states[0, 2] = parameters[_P_ACTIVE]
    states[0, 3] = parameters[_P_TEMPERATURE]
    states[0, 5] = parameters[_P_HELD_LEVEL]
    states[0, 6] = parameters[_P_HELD_PERIODS]
    return states


@inlined
def _load(states: FloatArray, k: int) -> tuple[float, float, float, float, float, int, float]:
    """Row ``k`` of a trajectory: the state before period ``k``, the cost so far, the
    level applied in period ``k - 1`` and the periods it has been held."""
    return (
        states[k, 0],
        states[k, 1],
        states[k, 2],
        states[k, 3],
        states[k, 4],
        int(states[k, 5]),
        states[k, 6],
    )


@inlined
def _store(
    states: FloatArray,
    k: int,
    prefill: float,
    decode: float,
    active: float,
    temperature: float,
    total: float,
    held: int,
    since: float,
) -> None:
    """Write row ``k`` of a trajectory (:func:`_load`'s inverse)."""
    states[k, 0] = prefill
    states[k, 1] = decode
    states[k, 2] = active
    states[k, 3] = temperature
    states[k, 4] = total
    states[k, 5] = held
    states[k, 6] = since


@inlined
def _applied(level: int, held: int, since: float, dwell: float) -> tuple[int, int, float]:
    """The level the safety chain applies when ``level`` is asked, ``held`` has been
    applied for ``since`` periods and a lower clock waits ``dwell`` periods
    (``daemon.safety.MinimumDwell``): ``(applied, held, since)`` for the next period."""
    if level < held and since < dwell - 1e-9:
        level = held
    if level == held:
        return level, held, since + 1.0
    return level, level, 1.0


@jit
def price_plans(
    plans: IntArray,
    block_of_step: IntArray,
    table: FloatArray,
    parameters: FloatArray,
    arrivals: FloatArray,
) -> FloatArray:
    """Cost of every row of ``plans`` (levels per block; ``block_of_step`` maps each
    period to its block), with no pruning; each row is rolled from the first period it
    differs from the row before it (bit for bit the cost of a roll from period 0)."""
    count = plans.shape[0]
    steps = block_of_step.size
    costs = np.empty(count)
    # Each period's state and cost so far along the previous row: a row that agrees with
    # it up to period k starts from there (the pool is sorted, so neighbours share
    # prefixes), with the same arithmetic in the same order as a roll from period 0.
    states = _trajectory(steps, parameters)
    dwell = parameters[_P_DWELL]
    for row in range(count):
        start = 0
        if row > 0:
            while start < steps and (
                plans[row, block_of_step[start]] == plans[row - 1, block_of_step[start]]
            ):
                start += 1
            if start == steps:
                costs[row] = costs[row - 1]
                continue
        prefill, decode, active, temperature, total, held, since = _load(states, start)
        previous = held if start > 0 else -1
        for step in range(start, steps):
            level, held, since = _applied(plans[row, block_of_step[step]], held, since, dwell)
            cost, prefill, decode, active, temperature = _advance(
                level,
                previous,
                step,
                prefill,
                decode,
                active,
                temperature,
                table,
                parameters,
                arrivals,
            )
            total += cost
            previous = level
            _store(states, step + 1, prefill, decode, active, temperature, total, held, since)
        costs[row] = total + _terminal(prefill, decode, parameters)
    return costs


@jit
def _roll(
    plan: IntArray,
    block_of_step: IntArray,
    start: int,
    states: FloatArray,
    bound: float,
    keep: bool,
    table: FloatArray,
    parameters: FloatArray,
    arrivals: FloatArray,
) -> float:
    """Cost of ``plan``, which agrees with the incumbent (``states``, row ``k``: state
    and cost so far before period ``k``) before period ``start``: rolled from there,
    ``inf`` as soon as the partial cost reaches ``bound``. With ``keep``, the new
    trajectory is written into ``states`` (the plan becomes the incumbent)."""
    steps = block_of_step.size
    dwell = parameters[_P_DWELL]
    prefill, decode, active, temperature, total, held, since = _load(states, start)
    previous = held if start > 0 else -1
    for step in range(start, steps):
        level, held, since = _applied(plan[block_of_step[step]], held, since, dwell)
        cost, prefill, decode, active, temperature = _advance(
            level, previous, step, prefill, decode, active, temperature, table, parameters, arrivals
        )
        total += cost
        if total >= bound:
            return np.inf
        previous = level
        if keep:
            _store(states, step + 1, prefill, decode, active, temperature, total, held, since)
    return total + _terminal(prefill, decode, parameters)


@jit
def local_search(
    plan: IntArray,
    block_of_step: IntArray,
    moves: IntArray,
    levels: int,
    maximum_trials: int,
    table: FloatArray,
    parameters: FloatArray,
    arrivals: FloatArray,
) -> tuple[IntArray, float, int]:
    """First-improvement local search from ``plan`` (levels per block).

    The neighbourhood is every additive move (row of ``moves``) that keeps all levels in
    ``[0, levels)``, and every swap of two adjacent blocks. Moves are tried in cyclic
    order, each priced from the first period it changes; the first one that lowers the
    cost is taken. Stops at a local optimum (a whole cycle without improvement) or after
    ``maximum_trials`` priced trials. Returns ``(plan, cost, trials)``.
    """
    blocks = plan.size
    steps = block_of_step.size
    first_step = np.empty(blocks, dtype=np.int64)
    for block in range(blocks - 1, -1, -1):
        for step in range(steps):
            if block_of_step[step] == block:
                first_step[block] = step
                break
    additive = moves.shape[0]
    first_block = np.empty(additive, dtype=np.int64)
    for row in range(additive):
        first_block[row] = blocks
        for block in range(blocks):
            if moves[row, block] != 0:
                first_block[row] = block
                break
    total_moves = additive + blocks - 1
    current = plan.copy()
    trial = plan.copy()
    states = _trajectory(steps, parameters)
    cost = _roll(current, block_of_step, 0, states, np.inf, True, table, parameters, arrivals)
    trials = 0
    since_improvement = 0
    move = 0
    while since_improvement < total_moves and trials < maximum_trials:
        valid = True
        if move < additive:
            changed = first_block[move]
            if changed >= blocks:
                valid = False
            else:
                for block in range(blocks):
                    level = current[block] + moves[move, block]
                    if level < 0 or level >= levels:
                        valid = False
                        break
                    trial[block] = level
        else:
            changed = move - additive
            if current[changed] == current[changed + 1]:
                valid = False
            else:
                trial[:] = current
                trial[changed] = current[changed + 1]
                trial[changed + 1] = current[changed]
        if valid:
            trials += 1
            tolerance = 1e-12 * max(1.0, abs(cost))
            start = first_step[changed]
            value = _roll(
                trial,
                block_of_step,
                start,
                states,
                cost - tolerance,
                False,
                table,
                parameters,
                arrivals,
            )
            if value < cost - tolerance:
                current[:] = trial
                cost = _roll(
                    current,
                    block_of_step,
                    start,
                    states,
                    np.inf,
                    True,
                    table,
                    parameters,
                    arrivals,
                )
                since_improvement = 0
            else:
                since_improvement += 1
        else:
            since_improvement += 1
        move = (move + 1) % total_moves
    return current, cost, trials


@jit
def search_plans(
    pool: IntArray,
    block_of_step: IntArray,
    moves: IntArray,
    levels: int,
    starts: int,
    start_spread: int,
    maximum_trials: int,
    table: FloatArray,
    parameters: FloatArray,
    arrivals: FloatArray,
) -> tuple[IntArray, float, int]:
    """The fast solver's whole search (``DiscreteSearchSolver.search``): price every plan
    of ``pool``, then run :func:`local_search` from each of the ``starts`` best plans
    that differ from every earlier start by at least ``start_spread`` levels in total.
    Returns ``(best plan in levels per block, its cost, trials priced)``."""
    costs = price_plans(pool, block_of_step, table, parameters, arrivals)
    order = np.argsort(costs, kind="mergesort")  # stable: ties keep the pool's order
    best_plan = pool[order[0]].copy()
    best_cost = costs[order[0]]
    eligible = np.ones(order.size, dtype=np.bool_)
    trials = 0
    rank = 0
    for start in range(starts):
        while rank < order.size and not eligible[rank]:
            rank += 1
        if rank == order.size:
            break
        candidate = pool[order[rank]]
        eligible[rank] = False
        if start + 1 < starts:  # the last start needs no distance to the next
            for other in range(rank + 1, order.size):
                if eligible[other]:
                    distance = 0
                    for block in range(candidate.size):
                        distance += abs(pool[order[other], block] - candidate[block])
                    if distance < start_spread:
                        eligible[other] = False
        plan, cost, used = local_search(
            candidate.copy(),
            block_of_step,
            moves,
            levels,
            maximum_trials,
            table,
            parameters,
            arrivals,
        )
        trials += used
        if cost < best_cost:
            best_plan, best_cost = plan, cost
    return best_plan, best_cost, trials


_COMPILED = False


def compile_kernels() -> None:
    """Compile (or load from numba's cache) every kernel once per process, on tiny
    inputs of the production types, so no control period pays the compile time."""
    global _COMPILED
    if _COMPILED:
        return
    table = np.ones((_TABLE_ROWS, 2))
    parameters = np.ones(_PARAMETERS)
    arrivals = np.ones(1)
    blocks = np.zeros(1, dtype=np.int64)
    plans = np.zeros((1, 1), dtype=np.int64)
    level = np.ones(2)
    _level_table(level, level, level, level, level, level, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0)
    price_plans(plans, blocks, table, parameters, arrivals)
    moves = np.ones((1, 1), dtype=np.int64)
    local_search(plans[0].copy(), blocks, moves, 2, 4, table, parameters, arrivals)
    search_plans(plans, blocks, moves, 2, 1, 0, 4, table, parameters, arrivals)
    _COMPILED = True
