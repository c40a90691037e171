"""What every hindsight oracle shares: the SLO condition, the capture ratio, and driving
the detailed plant under a fixed clock or a schedule (see ``controllers/oracles/__init__.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.baseline import FixedClockController
from gpugov.plant.closed_loop import simulate
from gpugov.plant.plant import ServingPlant
from gpugov.plant.result import ServingResult
from gpugov.plant.scheduler import chunked_prefill_scheduler
from gpugov.plant.simulator import PlantSimulation
from gpugov.plant.types import Request, Scheduler

FloatArray = NDArray[np.float64]

SLO_TOLERANCE = 0.01
"""SLO attainment may be at most this far (a fraction: 1 percentage point) below the
maximum clock's for a run to hold the SLO."""

_EPS = 1e-9


# ------------------------------------------------------------------ SLO and capture
def holds_slo(
    attainment: float | None,
    reference_attainment: float | None,
    tolerance: float = SLO_TOLERANCE,
) -> bool:
    """True when ``attainment`` is within ``tolerance`` below ``reference_attainment``.

    ``None`` (no request arrived) holds only against a ``None`` reference.

    Raises:
        ValueError: ``tolerance`` negative or not finite.
    """
    if not math.isfinite(tolerance) or tolerance < 0.0:
        raise ValueError(f"tolerance must be finite and >= 0, got {tolerance!r}")
    if reference_attainment is None:
        return attainment is None
    if attainment is None:
        return False
    return attainment >= reference_attainment - tolerance - 1e-12


def lowest_holding(holds: Callable[[int], bool], top: int) -> int:
    """The lowest index in ``[0, top]`` where ``holds`` is true, by bisection: ``holds``
    is taken to be monotone (a higher clock or cap holds where a lower one does) and true
    at ``top``, which is returned when nothing lower holds."""
    if holds(0):
        return 0
    failing, lowest = 0, top
    while lowest - failing > 1:
        middle = (failing + lowest) // 2
        if holds(middle):
            lowest = middle
        else:
            failing = middle
    return lowest


def oracle_capture(
    energy_max_j: float,
    energy_j: float,
    energy_oracle_j: float,
    *,
    holds: bool,
) -> float | None:
    """Share of the oracle's saving a controller captures.

    ``(E_max - E) / (E_max - E_oracle)``: 1 when the controller matches the oracle, 0 at
    the maximum clock's energy, above 1 when it beats the (heuristic) oracle and
    negative when it uses more than the maximum clock.

    Returns:
        The ratio, or ``None`` when the controller does not hold the SLO or the oracle
        saves nothing (``E_max - E_oracle`` at most a millionth of ``E_max``).
    """
    if not holds:
        return None
    for name, value in (
        ("energy_max_j", energy_max_j),
        ("energy_j", energy_j),
        ("energy_oracle_j", energy_oracle_j),
    ):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    gap = energy_max_j - energy_oracle_j
    if gap <= 1e-6 * max(abs(energy_max_j), 1e-12):
        return None
    return (energy_max_j - energy_j) / gap


# -------------------------------------------------------------------- simulation
class Steppable(Protocol):
    """What :func:`drive_steps` needs of a simulation (the detailed plant, or the
    disaggregated one)."""

    @property
    def done(self) -> bool: ...

    def advance_to(self, end_s: float, *, stop_when_done: bool = False) -> None: ...


def drive_steps(
    simulation: Steppable,
    decide: Callable[[], object],
    first_step: int,
    end_step: int,
    control_period_s: float,
    horizon_s: float,
) -> bool:
    """Run control steps ``[first_step, end_step)``, calling ``decide`` at each tick (it
    observes and requests the clocks), exactly as the closed loop does (advance to the
    tick, stop when done, decide).

    Returns:
        True when the run is over (everything finished or past the horizon).
    """
    for step in range(first_step, end_step):
        tick = step * control_period_s
        if tick > horizon_s + 1e-12:
            simulation.advance_to(horizon_s, stop_when_done=True)
            return True
        simulation.advance_to(tick, stop_when_done=True)
        if simulation.done and step > 0:
            return True
        decide()
    return False


def _drive(
    simulation: PlantSimulation,
    clock_mhz: float,
    first_step: int,
    end_step: int,
    control_period_s: float,
    horizon_s: float,
) -> bool:
    """Run control steps ``[first_step, end_step)`` requesting ``clock_mhz``, exactly as
    :func:`plant.simulate` does (:func:`drive_steps`: observe, then request).

    Returns:
        True when the run is over (everything finished or past the horizon).
    """

    def decide() -> None:
        simulation.observe()
        simulation.request_clock(clock_mhz)

    return drive_steps(simulation, decide, first_step, end_step, control_period_s, horizon_s)


def _run_fixed(
    requests: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler,
    clock_mhz: float,
    seed: int,
    control_period_s: float,
) -> ServingResult:
    return simulate(
        requests,
        plant,
        scheduler,
        FixedClockController(float(clock_mhz)),
        seed,
        controller_name=f"fixed_{clock_mhz:g}_mhz",
        control_period_s=control_period_s,
    )


def maximum_clock_reference(
    workload: Sequence[Request],
    plant: ServingPlant,
    scheduler: Scheduler = chunked_prefill_scheduler,
    *,
    seed: int = 0,
    control_period_s: float = 1.0,
) -> ServingResult:
    """The maximum-clock run every oracle's SLO condition is measured against."""
    return _run_fixed(
        tuple(workload), plant, scheduler, plant.profile.maximum_clock_mhz, seed, control_period_s
    )
