"""Cheap what-if copies of a :class:`~gpugov.plant.simulator.PlantSimulation`: which parts a
fork shares, starts empty or copies shallowly, so that a fork costs about 1 ms, not a full
``copy.deepcopy`` of every grid sample recorded so far."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpugov.plant.simulator import PlantSimulation

_ATOMIC_TYPES = frozenset({int, float, bool, type(None)})
"""Element types whose lists :meth:`PlantSimulation.fork` copies shallowly."""


def fork_simulation(simulation: PlantSimulation) -> PlantSimulation:
    """An independent copy of ``simulation`` without its series
    (:meth:`PlantSimulation.fork <gpugov.plant.simulator.PlantSimulation.fork>`)."""
    memo: dict[int, Any] = {
        # The workload is shared while it is the immutable tuple it starts as; once
        # :meth:`add_request` made it a list, the fork takes a copy of its own.
        id(simulation.requests): (
            simulation.requests if type(simulation.requests) is tuple else list(simulation.requests)
        ),
        id(simulation.plant): simulation.plant,
        id(simulation.gpu.params): simulation.gpu.params,
    }
    for values in simulation.series.samples.values():
        memo[id(values)] = []
    memo[id(simulation.series.phases)] = []
    for value in [*vars(simulation).values(), *vars(simulation.energy_ledger).values()]:
        # Lists of plain numbers: a shallow copy is a deep copy, and far faster.
        if (
            type(value) is list
            and id(value) not in memo
            and len(value) > 32
            and set(map(type, value)) <= _ATOMIC_TYPES
        ):
            memo[id(value)] = value.copy()
    return copy.deepcopy(simulation, memo)
