"""The plant's series: the engine's and the GPU's state sampled every ``time_step_s``, which
become a :class:`~gpugov.plant.result.ServingResult`'s series. Apart from the engine, which
writes one sample per grid tick its segments cross and never reads one back."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.gpu_physics import _EPS
from gpugov.plant.result import SERIES_NAMES


class GridSeries:
    """The samples of one :class:`~gpugov.plant.simulator.PlantSimulation` at
    ``k * time_step_s``, one per tick, in order.

    :attr:`samples` holds a list per name of
    :data:`~gpugov.plant.result.SERIES_NAMES` and :attr:`phases` the engine's phase at each
    tick (``"idle"``, ``"prefill"``, ``"decode"`` or ``"mixed"``). ``power_w[k]`` is the
    mean power over the grid step ending at ``time_s[k]`` (the energy drawn over the step
    divided by it); the sample at time 0 takes the power at that instant.

    Args:
        time_step_s: the grid step (``ServingPlant.time_step_s``).
    """

    def __init__(self, time_step_s: float) -> None:
        self.time_step_s = time_step_s
        self.samples: dict[str, list[float]] = {name: [] for name in SERIES_NAMES}
        self.phases: list[str] = []
        self._last_energy_j = 0.0
        self._next_tick = 0

    @property
    def next_tick_s(self) -> float:
        """Time of the next sample due; every tick before it has been recorded."""
        return self._next_tick * self.time_step_s

    def record(
        self,
        time_s: float,
        *,
        prefill_queue: float,
        decode_active: float,
        completed_requests: float,
        kv_tokens: float,
        power_w: float,
        requested_clock_mhz: float,
        realized_clock_mhz: float,
        energy_j: float,
        temperature_c: float,
        phase: str,
    ) -> None:
        """Append the sample of the tick at :attr:`next_tick_s` (``time_s``).

        ``power_w`` is the GPU's power at that instant, used only for the sample at time 0
        (a fork's series, empty at first, goes on with each step's mean power);
        ``energy_j`` the energy drawn since the start, at the tick.
        """
        samples = self.samples
        samples["time_s"].append(time_s)
        samples["prefill_queue"].append(prefill_queue)
        samples["decode_active"].append(decode_active)
        samples["completed_requests"].append(completed_requests)
        samples["kv_tokens"].append(kv_tokens)
        if self._next_tick:
            samples["power_w"].append((energy_j - self._last_energy_j) / self.time_step_s)
        else:
            samples["power_w"].append(power_w)
        samples["requested_clock_mhz"].append(requested_clock_mhz)
        samples["realized_clock_mhz"].append(realized_clock_mhz)
        samples["energy_j"].append(energy_j)
        samples["temperature_c"].append(temperature_c)
        self.phases.append(phase)
        self._last_energy_j = energy_j
        self._next_tick += 1

    def busy_fraction_since(self, start_s: float) -> float:
        """Share of the samples after ``start_s`` at which an iteration ran (phase other
        than ``"idle"``); 0.0 when there is none."""
        times = self.samples["time_s"]
        phases = self.phases
        busy = total = 0
        for index in range(len(times) - 1, -1, -1):
            if times[index] <= start_s + _EPS:
                break
            total += 1
            busy += phases[index] != "idle"
        return busy / total if total else 0.0

    def arrays(self) -> dict[str, NDArray[np.float64]]:
        """Each series as a float array, keyed by its name."""
        return {key: np.asarray(values, dtype=float) for key, values in self.samples.items()}
