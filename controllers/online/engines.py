"""One engine's view of a pooled observation: ``mpc-online`` learns and plans one engine.

A pool of data-parallel engines (a disaggregated pool of several engines, a data-parallel
domain) is observed as one (:attr:`ServingObservation.engines`): counts, tokens, power and
energy summed over the engines, the utilisation their mean. A model fitted to that learns
the engines' joint rate, and a lone prompt, which one engine prefills, runs at half that
rate in a pool of two. So the controller sees the pool as one engine, under one clock:

* the cumulative counters, the power, the energy, the power limit and the KV capacity
  over the engine count (round-robin routing spreads the requests evenly);
* the running batch as the batch of an engine that runs any: the pool's over the engines
  that can hold one (``min(engines, batch)``), and the running requests' KV and tokens
  generated so far with it, so that the KV per running request stays what it is;
* the prompt backlog as the busiest engine's (:attr:`~ServingObservation.busiest_prefill_tokens`),
  or the whole pool's where that is unknown (as if one engine held it all: a lone long
  prompt is the case that misses), and the tail estimate with it;
* the utilisation, latencies, temperature and clock as they are.

The identification then fits one engine's busy time (its utilisation) against one
engine's share of the work, the MPC forecasts one engine's arrivals, and the burst guard
drains the busiest engine's backlog at one engine's rate. Pure computation.
"""

from __future__ import annotations

from gpugov.plant.disaggregated import SUMMED_FIELDS
from gpugov.plant.types import ServingObservation, replace_observation

RUNNING_FIELDS = ("kv_tokens", "generated_decode_tokens")
"""Fields summed over the running requests: an engine that runs any holds its batch's."""

BACKLOG_FIELDS = ("prefill_remaining_tokens", "prefill_tail_tokens", "decode_active")
"""Summed fields one engine's view takes from the busiest engine or the running batch."""

SHARED_FIELDS = tuple(
    name for name in SUMMED_FIELDS if name not in (*RUNNING_FIELDS, *BACKLOG_FIELDS)
)
"""Fields summed over the engines that one engine holds an even share of (the counters,
power, energy, power limit and KV capacity)."""


def engine_view(observation: ServingObservation) -> ServingObservation:
    """``observation`` as one of its :attr:`~ServingObservation.engines` sees it (itself
    where there is one engine); the result says one engine, so a second call changes
    nothing."""
    engines = observation.engines
    if engines <= 1:
        return observation
    changes: dict[str, object] = {"engines": 1, "busiest_prefill_tokens": None}
    for name in SHARED_FIELDS:
        value = getattr(observation, name)
        if value is not None:
            changes[name] = value / engines
    batch = float(observation.decode_active)
    holding = min(float(engines), max(batch, 1.0))
    changes["decode_active"] = batch / holding
    for name in RUNNING_FIELDS:
        value = getattr(observation, name)
        if value is not None:
            changes[name] = value / (holding if batch > 0.0 else engines)
    pooled = observation.prefill_remaining_tokens
    busiest = observation.busiest_prefill_tokens
    backlog = pooled if busiest is None else min(max(busiest, pooled / engines), pooled)
    changes["prefill_remaining_tokens"] = backlog
    tail = observation.prefill_tail_tokens
    if tail is not None:
        # The tail's excess over the mean backlog is the prompts in their prefill priced
        # at the upper quantile of their rest: all of it on the busiest engine, at most.
        changes["prefill_tail_tokens"] = min(tail, backlog + max(0.0, tail - pooled))
    return replace_observation(observation, changes)
