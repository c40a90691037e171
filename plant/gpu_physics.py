"""The simulated GPU's side of :class:`~gpugov.plant.simulator.PlantSimulation`.

Realised clock under the power cap and the thermal limit, the iteration's phase power at
that clock, and the exact integration of energy and the one-state thermal RC between
events (with the series samples on the time grid). The engine's side (scheduling, KV
cache, requests) stays in ``simulator.py``; both share one state on the simulation object.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

_EPS = 1e-12

# NVML clock-event reason bits the plant reports (nvmlClocksEventReason*).
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4
CLOCK_EVENT_SW_THERMAL_SLOWDOWN = 0x20


class GpuPhysics:
    """Mixin with the GPU's physics for ``PlantSimulation`` (it owns every attribute)."""

    # Attributes PlantSimulation defines; declared for readers and type checkers.
    plant: Any
    time_s: float
    temperature_c: float
    energy_j: float
    clock_event_reasons: int

    def _batch_factor(self, batch: int) -> float:
        model = self._batch_power
        if model is None or batch <= 0:
            return 1.0
        cached = self._batch_factor_cache.get(batch)
        if cached is None:
            cached = model.factor(batch, self._b_ref)
            self._batch_factor_cache[batch] = cached
        return cached

    def _iteration_parts(self, index: int) -> tuple[float, float, float]:
        """(prefill seconds, decode seconds, power W) of the current iteration at ``index``."""
        tokens = self._iter_prefill_tokens
        t_pf = tokens / self._pf_rate[index] if tokens else 0.0
        batch = self._iter_decode_batch
        if batch:
            t_dec = self._dec_tref[index] * (
                self._dec_a
                + self._dec_b * batch / self._b_ref
                + self._dec_c * self._iter_context / self._c_ref
            )
            idle = self._p_idle[index]
            p_dec = idle + (self._p_dec[index] - idle) * self._batch_factor(batch)
        else:
            t_dec = 0.0
            p_dec = 0.0
        total = t_pf + t_dec
        power = (t_pf * self._p_pf[index] + t_dec * p_dec) / total
        noise = self._iter_noise
        return t_pf * noise, t_dec * noise, power

    def _thermal_safe_power_w(self) -> float:
        """Highest power whose steady-state temperature stays within the thermal limit."""
        plant = self.plant
        return (plant.thermal_limit_c - plant.ambient_temperature_c) / (
            plant.thermal_resistance_c_per_w
        )

    def _busy_clock(self) -> tuple[int, tuple[float, float, float]]:
        """Realised clock index for the current iteration and its (t_pf, t_dec, power).

        The requested clock is held lower while the iteration's power exceeds the power
        limit (SW power cap), and while the die is at or above the thermal limit.
        """
        requested = index = self._effective_index
        parts = self._iteration_parts(index)
        limit = self.plant.power_limit_w + 1e-9
        while index > 0 and parts[2] > limit:
            index -= 1
            parts = self._iteration_parts(index)
        reasons = CLOCK_EVENT_SW_POWER_CAP if index < requested else 0
        if self.temperature_c >= self.plant.thermal_limit_c:
            capped = index
            safe = self._thermal_safe_power_w()
            while index > 0 and parts[2] > safe:
                index -= 1
                parts = self._iteration_parts(index)
            if index < capped:
                reasons |= CLOCK_EVENT_SW_THERMAL_SLOWDOWN
        self.clock_event_reasons = reasons
        return index, parts

    def _idle_clock(self) -> int:
        requested = index = self._effective_index
        reasons = CLOCK_EVENT_GPU_IDLE
        if self.temperature_c >= self.plant.thermal_limit_c:
            safe = self._thermal_safe_power_w()
            while index > 0 and self._p_idle[index] > safe:
                index -= 1
            if index < requested:
                reasons |= CLOCK_EVENT_SW_THERMAL_SLOWDOWN
        self.clock_event_reasons = reasons
        return index

    def _apply_pending(self) -> None:
        pending = self._pending
        while pending and pending[0][0] <= self.time_s + _EPS:
            self._effective_index = pending.popleft()[1]

    def _segment_busy(self, end_s: float) -> None:
        self._apply_pending()
        index, (t_pf, t_dec, power) = self._busy_clock()
        self._current_realized_index = index
        duration = t_pf + t_dec
        remaining = (1.0 - self._iter_progress) * duration
        finish = self.time_s + remaining
        target = min(finish, end_s, self._next_pending_time())
        if target >= finish - _EPS:
            target = finish
            completes = True
        else:
            completes = False
        dt = target - self.time_s
        self._integrate(dt, power, busy=True)
        if completes:
            self._finish_iteration(duration)
        elif duration > 0.0:
            self._iter_progress += dt / duration

    def _segment_idle(self, target: float) -> None:
        self._apply_pending()
        index = self._idle_clock()
        self._current_realized_index = index
        if self._idle_until is not None and math.isinf(target):
            raise RuntimeError("idle segment without an end")
        self._phase = "idle"
        self._integrate(max(0.0, target - self.time_s), self._p_idle[index], busy=False)

    def _integrate(self, dt: float, power: float, *, busy: bool) -> None:
        """Advance time by ``dt`` at constant ``power``: energy, thermal RC, grid samples."""
        plant = self.plant
        start = self.time_s
        end = start + dt
        t0 = self.temperature_c
        tau = plant.thermal_time_constant_s
        t_eq = plant.ambient_temperature_c + plant.thermal_resistance_c_per_w * power
        self._power_w = power
        # Invariant: every grid tick <= time_s has been recorded.
        dt_grid = self._dt
        tick_time = self._next_tick * dt_grid
        while tick_time <= end + _EPS:
            elapsed = max(0.0, tick_time - start)
            self.temperature_c = t_eq + (t0 - t_eq) * math.exp(-elapsed / tau)
            self._record_tick(tick_time, self.energy_j + power * elapsed)
            tick_time = self._next_tick * dt_grid
        if dt <= 0.0:
            self.temperature_c = t0
            return
        self.energy_j += power * dt
        self.temperature_c = t_eq + (t0 - t_eq) * math.exp(-dt / tau)
        if self.temperature_c > self._peak_temperature:
            self._peak_temperature = self.temperature_c
        if busy:
            self._busy_s += dt
        if power > plant.power_limit_w + 1e-9:
            self._power_violation_s += dt
        limit = plant.thermal_limit_c
        if t0 > limit or t_eq > limit:
            self._thermal_violation_s += _time_above(t0, t_eq, tau, dt, limit)
        self.time_s = end

    def _record_tick(self, tick_time: float, energy: float) -> None:
        series = self._series
        arrived = bisect.bisect_right(self._arrival, tick_time + _EPS)
        unmoved = arrived - self._next_arrival
        series["time_s"].append(tick_time)
        series["prefill_queue"].append(
            float(len(self._waiting) + len(self._prefilling) + max(0, unmoved))
        )
        series["decode_active"].append(float(len(self._running)))
        series["completed_requests"].append(float(self._completed))
        kv = self._kv_prefill + self._kv_running()
        if self._ff_tick is not None:
            # Inside a fast-forwarded stretch: add the iterations finished by tick_time.
            start, base, slope, batch, count = self._ff_tick
            done = 0
            elapsed = tick_time - start
            while done < count and (done + 1) * base + slope * done * (done + 1) / 2.0 <= (
                elapsed + _EPS
            ):
                done += 1
            kv += done * batch
        series["kv_tokens"].append(float(kv))
        if series["energy_j"]:
            series["power_w"].append((energy - self._last_tick_energy) / self._dt)
        else:
            series["power_w"].append(self._power_w)
        series["requested_clock_mhz"].append(self._clocks[self._requested_index])
        series["realized_clock_mhz"].append(self._realized_mhz[self._current_realized_index])
        series["energy_j"].append(energy)
        series["temperature_c"].append(self.temperature_c)
        self._phase_series.append(self._phase)
        self._last_tick_energy = energy
        self._next_tick += 1


def _time_above(t0: float, t_eq: float, tau: float, dt: float, limit: float) -> float:
    """Time within ``dt`` that ``T(t) = t_eq + (t0 - t_eq) e^{-t/tau}`` spends above ``limit``."""
    if t0 > limit and t_eq >= limit:
        return dt
    if t0 > limit:  # cooling towards t_eq < limit
        crossing = tau * math.log((t0 - t_eq) / (limit - t_eq))
        return min(dt, crossing)
    if t_eq > limit:  # heating from below
        crossing = tau * math.log((t_eq - t0) / (t_eq - limit))
        return max(0.0, dt - crossing)
    return 0.0
