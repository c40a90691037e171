"""Progress lines for simulated runs: simulated time, energy so far and SLO attainment so far.

``simulate`` hands :meth:`SimulationProgress.__call__` to the plant's ``on_progress`` hook;
``run --simulate`` calls it from the daemon loop. Both show the shared
:class:`~gpugov.daemon.progress.Progress` line (a bar with ETA on a terminal, a periodic
line elsewhere); the SLO so far is computed only when a line is due.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from gpugov.daemon.progress import Progress


def slo_so_far(simulation: Any) -> tuple[int, int]:
    """``(finished requests meeting both SLOs, finished requests)`` of a plant simulation.

    The same rule as the final metric (TTFT and TPOT each within its SLO), over the
    requests finished so far; the final metric also counts unfinished ones as misses.
    """
    profile = simulation.plant.profile
    ttft_slo, tpot_slo = profile.ttft_slo_s + 1e-12, profile.tpot_slo_s + 1e-12
    first_token, finish = simulation.request_times()
    met = done = 0
    for request, first, end in zip(simulation.requests, first_token, finish, strict=False):
        if end is None or first is None:
            continue
        done += 1
        ttft_ok = first - request.arrival_time_s <= ttft_slo
        tokens = request.output_tokens
        tpot_ok = tokens <= 1 or (end - first) / (tokens - 1) <= tpot_slo
        met += ttft_ok and tpot_ok
    return met, done


class SimulationProgress:
    """Reports a simulated run's progress against its last arrival (simulated seconds).

    Args:
        total_s: simulated seconds the run is expected to cover (its last arrival).
        label: the line's label (``simulate``, ``run --simulate``).
        stream, clock, tty, enabled: as for :class:`Progress` (tests inject them).
    """

    def __init__(
        self,
        total_s: float,
        label: str,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        enabled: bool = True,
    ) -> None:
        self.progress = Progress(
            max(total_s, 1e-9),
            label,
            unit="simulated s",
            stream=stream,
            clock=clock,
            tty=tty,
            enabled=enabled,
        )
        self._last_s = 0.0
        self._detail = ""

    def __call__(self, time_s: float, simulation: Any) -> None:
        """Record the simulation's state at ``time_s``; emit a line when one is due."""
        self._last_s = min(time_s, self.progress.total)
        if not self.progress.due():
            self.progress.update(self._last_s, self._detail)
            return
        self._detail = self.detail(simulation)
        self.progress.update(self._last_s, self._detail)

    @staticmethod
    def detail(simulation: Any) -> str:
        """``energy 12.3 kJ, SLO so far 98.7 % of 1,234 finished``."""
        met, done = slo_so_far(simulation)
        slo = f"{100.0 * met / done:.1f} % of {done:,} finished" if done else "n/a"
        return f"energy {simulation.energy_j / 1000.0:,.1f} kJ, SLO so far {slo}"

    @property
    def reached_s(self) -> float:
        """The simulated time of the last update (where an interrupted run stopped)."""
        return self._last_s

    def close(
        self, simulation: Any | None = None, *, result: Any | None = None, stopped: bool = False
    ) -> None:
        """The final line, with the final state of ``simulation`` or the final metrics of
        ``result`` (a :class:`~gpugov.plant.ServingResult`) when given; ``stopped``: the
        run was interrupted, and the line shows where (not 100 %)."""
        if simulation is not None:
            self._detail = self.detail(simulation)
            if not stopped:
                self._last_s = self.progress.total
        elif result is not None:
            metrics = result.metrics
            slo = metrics.slo_attainment
            shown = "n/a" if slo is None else f"{100.0 * slo:.1f} % of {metrics.arrived_requests:,}"
            self._detail = f"energy {metrics.energy_j / 1000.0:,.1f} kJ, SLO {shown}"
            self._last_s = self.progress.total
        self.progress.close(self._detail, done=self._last_s)
