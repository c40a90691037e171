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


class DrainEstimate:
    """The simulated time a run is expected to end at: its last arrival, and past it the
    time the requests left finish at the rate they generate output tokens. Measured
    against the last arrival alone, a run that drains a backlog for minutes after it (a
    burst at 0 s, long outputs) showed 100 % and an ETA of 0 s all along."""

    def __init__(self, last_arrival_s: float) -> None:
        self.end_s = max(last_arrival_s, 0.0)
        self._last_arrival_s = self.end_s
        self._unfinished: list[int] | None = None  # requests not yet seen finished
        self._mark: tuple[float, int] | None = None  # (time, output tokens left) then

    def __call__(self, time_s: float, simulation: Any) -> float:
        """The expected end once the simulation has reached ``time_s``: past the last
        arrival, ``time_s`` plus the output tokens the unfinished requests have left over
        the rate they fell since the previous call (or the start); a simulation without
        per-request tokens keeps the last arrival."""
        requests = getattr(simulation, "requests", None)
        generated = getattr(simulation, "generated_tokens", None)
        if time_s < self._last_arrival_s or requests is None or generated is None:
            return self.end_s
        _, finish = simulation.request_times()
        if self._unfinished is None:
            self._unfinished = list(range(len(requests)))
        self._unfinished = [i for i in self._unfinished if finish[i] is None]
        left = sum(max(requests[i].output_tokens - generated(i), 0) for i in self._unfinished)
        if self._mark is None:
            self._mark = (0.0, sum(request.output_tokens for request in requests))
        since_s, left_then = self._mark
        if not self._unfinished:
            self.end_s = max(self._last_arrival_s, time_s)
        elif time_s > since_s and left < left_then:
            rate = (left_then - left) / (time_s - since_s)
            self.end_s = max(self._last_arrival_s, time_s + left / rate)
            self._mark = (time_s, left)
        elif self.end_s <= time_s:
            # No token since the previous call (a prompt still prefilling): not done yet.
            self.end_s = time_s + max(time_s - since_s, 1.0)
        return self.end_s


class SimulationProgress:
    """Reports a simulated run's progress in simulated seconds, up to its expected end
    (:class:`DrainEstimate`: the last arrival, then the backlog's drain).

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
        self._last_arrival_s = max(total_s, 0.0)
        self._end = DrainEstimate(self._last_arrival_s)
        self._seen: tuple[float, Any] | None = None
        """The last ``(time_s, simulation)`` recorded, for the drain's estimate on demand."""

    def __call__(self, time_s: float, simulation: Any) -> None:
        """Record the simulation's state at ``time_s``; emit a line when one is due (the
        drain's estimate, a pass over the unfinished requests, is made only then: every
        tick of a quiet run paid it)."""
        self._seen = (time_s, simulation)
        if not self.progress.due():
            self._last_s = min(time_s, max(self.progress.total, time_s))
            self.progress.update(self._last_s, self._detail)
            return
        self.progress.total = max(self._end(time_s, simulation), 1e-9)
        self._last_s = min(time_s, self.progress.total)
        self._detail = self.detail(simulation)
        self.progress.update(self._last_s, self._detail)

    @staticmethod
    def detail(simulation: Any) -> str:
        """``energy 12.3 kJ, SLO so far 98.7 % of 1,234 finished``."""
        met, done = slo_so_far(simulation)
        slo = f"{100.0 * met / done:.1f} % of {done:,} finished" if done else "n/a"
        return f"energy {simulation.energy_j / 1000.0:,.1f} kJ, SLO so far {slo}"

    def _finish_at(self, end_s: float) -> None:
        """A finished run: its total is where it ended (past the last arrival, the
        estimate made while it drained is replaced by the end itself)."""
        self.progress.total = max(self._last_arrival_s, end_s, 1e-9)
        self._last_s = self.progress.total
        self._seen = None  # the end is known: no estimate replaces it

    @property
    def total_s(self) -> float:
        """The simulated seconds the run is now expected to cover (its last arrival, or
        later while it drains)."""
        if self._seen is not None:
            self.progress.total = max(self._end(*self._seen), 1e-9)
        return self.progress.total

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
                self._finish_at(getattr(simulation, "time_s", self._last_s))
        elif result is not None:
            metrics = result.metrics
            slo = metrics.slo_attainment
            shown = "n/a" if slo is None else f"{100.0 * slo:.1f} % of {metrics.arrived_requests:,}"
            self._detail = f"energy {metrics.energy_j / 1000.0:,.1f} kJ, SLO {shown}"
            self._finish_at(getattr(metrics, "simulated_duration_s", self._last_s))
        self.progress.close(self._detail, done=self._last_s)
