"""The simulated GPU of :class:`~gpugov.plant.simulator.PlantSimulation`.

:class:`GpuParameters` holds the physics the plant and its profile fix for a run (per
supported clock: realised clock, prefill rate, reference decode time and phase powers; the
decode latency split, the batch-power model, the power cap and the thermal RC).
:class:`GpuPhysics` is the GPU's state on top of them: the realised clock under the power
limits and the thermal limit, the iteration's phase power at that clock, and the exact
integration of energy and the one-state thermal RC over constant-power segments. The
engine (scheduling, KV cache, requests) stays in ``simulator.py`` and asks this object for
clocks, durations and powers; its samples on the grid are ``grid_series.py``'s.

Two power limits act on the clock. The board limit (``ServingPlant.power_limit_w``, the
TDP, or a limit an operator lowered with ``nvidia-smi -pl``) is an instant clamp: an
iteration never runs at a clock whose power exceeds it. Where even the lowest clock draws
more than the board limit, the firmware slows the GPU further (SW power cap): the
iteration runs at the lowest clock a share of the time and idles there for the rest, so
it draws exactly the limit and takes longer (:attr:`GpuPhysics.slowdown`). A
power cap set at run time (:meth:`GpuPhysics.set_power_cap`, what ``nvidia-smi -pl`` or
NVML's ``nvmlDeviceSetPowerManagementLimit`` set) acts as the firmware's power controller
does: it settles at the highest clock whose power fits the cap, but it acts on the power
averaged over ``power_cap_window_s`` (an exponential average), so after the cap drops or
the load grows the GPU keeps its clock, and overshoots the cap, until the average crosses
it; with headroom the ceiling rises at once (boost). Once it has come down to the lowest
clock, a cap below what that clock draws is held as the board limit is, by the slowdown. The
seconds spent above the cap are :attr:`GpuPhysics.cap_overshoot_s` (a run's
``cap_overshoot_s`` metric; :attr:`GpuPhysics.power_violation_s` counts the seconds above
the board limit alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpugov.plant.plant import ServingPlant
from gpugov.plant.profile import DecodePowerBatchModel

_EPS = 1e-12

# NVML clock-event reason bits the plant reports (nvmlClocksEventReason*).
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4
CLOCK_EVENT_SW_THERMAL_SLOWDOWN = 0x20


@dataclass(frozen=True, slots=True)
class GpuParameters:
    """The simulated GPU's physical parameters, fixed for a run.

    Per-clock tuples are indexed like the profile's supported clocks; rates and powers are
    taken at each clock's realised clock. ``decode_reference_s`` is ``t_ref(f) = B_ref /
    decode_tokens_per_s(f)`` and ``reference_context_tokens`` is ``C_ref = B_ref * L_ref``
    (``docs/plant.md``, latency model).
    """

    clock_mhz: tuple[float, ...]
    realized_clock_mhz: tuple[float, ...]
    prefill_tokens_per_s: tuple[float, ...]
    decode_reference_s: tuple[float, ...]
    prefill_power_w: tuple[float, ...]
    decode_power_w: tuple[float, ...]
    idle_power_w: tuple[float, ...]
    reference_batch_size: float
    reference_context_tokens: float
    weight_fraction: float
    batch_fraction: float
    kv_fraction: float
    decode_power_batch_model: DecodePowerBatchModel | None
    power_limit_w: float
    thermal_limit_c: float
    ambient_temperature_c: float
    thermal_resistance_c_per_w: float
    thermal_time_constant_s: float
    power_cap_window_s: float = 1.0

    @classmethod
    def from_plant(cls, plant: ServingPlant) -> GpuParameters:
        """Read the parameters off ``plant`` and its profile (once per simulation)."""
        profile = plant.profile
        clocks = tuple(float(c) for c in profile.clock_mhz)
        realized = tuple(profile.realized_clock(c) for c in clocks)
        decode_model = profile.decode_latency_model
        reference_batch = float(decode_model.reference_batch_size)
        return cls(
            clock_mhz=clocks,
            realized_clock_mhz=realized,
            prefill_tokens_per_s=tuple(profile.rate("prefill", c) for c in realized),
            decode_reference_s=tuple(reference_batch / profile.rate("decode", c) for c in realized),
            prefill_power_w=tuple(profile.power("prefill", c) for c in realized),
            decode_power_w=tuple(profile.power("decode", c) for c in realized),
            idle_power_w=tuple(profile.power("idle", c) for c in realized),
            reference_batch_size=reference_batch,
            reference_context_tokens=float(
                decode_model.reference_batch_size * decode_model.reference_context_tokens
            ),
            weight_fraction=decode_model.weight_fraction,
            batch_fraction=decode_model.batch_fraction,
            kv_fraction=decode_model.kv_fraction,
            decode_power_batch_model=profile.decode_power_batch_model,
            power_limit_w=plant.power_limit_w,
            thermal_limit_c=plant.thermal_limit_c,
            ambient_temperature_c=plant.ambient_temperature_c,
            thermal_resistance_c_per_w=plant.thermal_resistance_c_per_w,
            thermal_time_constant_s=plant.thermal_time_constant_s,
            power_cap_window_s=plant.power_cap_window_s,
        )

    def steady_temperature_c(self, power_w: float) -> float:
        """Temperature the die settles at under constant ``power_w``."""
        return self.ambient_temperature_c + self.thermal_resistance_c_per_w * power_w

    def temperature_after(self, start_c: float, power_w: float, elapsed_s: float) -> float:
        """Die temperature ``elapsed_s`` after ``start_c`` at constant ``power_w`` (exact RC)."""
        t_eq = self.steady_temperature_c(power_w)
        return t_eq + (start_c - t_eq) * math.exp(-elapsed_s / self.thermal_time_constant_s)

    def thermal_safe_power_w(self) -> float:
        """Highest power whose steady-state temperature stays within the thermal limit."""
        return (self.thermal_limit_c - self.ambient_temperature_c) / (
            self.thermal_resistance_c_per_w
        )

    def decode_context_slope_s(self, index: int, batch: int) -> float:
        """Growth of a decode iteration's time per iteration at clock ``index``: the KV
        term's share of ``batch`` more context tokens."""
        return (
            self.decode_reference_s[index]
            * self.kv_fraction
            * batch
            / self.reference_context_tokens
        )


class GpuPhysics:
    """The simulated GPU's state: realised clock, power, energy and die temperature.

    Starts idle at clock ``index`` (held lower where its idle power exceeds the board
    limit, as :meth:`idle_clock` holds it) and at that idle power's steady-state
    temperature. The simulator asks for the realised clock of each segment (:meth:`busy_clock`,
    :meth:`idle_clock`) and advances the GPU over it (:meth:`integrate`).
    """

    def __init__(self, params: GpuParameters, index: int) -> None:
        self.params = params
        # The run-time power cap (None: only the board limit) and its power controller.
        self.cap_w: float | None = None
        self.cap_ceiling_index = len(params.clock_mhz) - 1
        self.temperature_c = params.ambient_temperature_c
        # The realised clock and why it is below the request, as NVML's bitmask.
        self.realized_index = index
        self.clock_event_reasons = CLOCK_EVENT_GPU_IDLE
        idle = params.idle_power_w[self.idle_clock(index)]
        self.temperature_c = params.ambient_temperature_c + (
            params.thermal_resistance_c_per_w * idle
        )
        self.energy_j = 0.0
        self.power_w = idle
        self.peak_temperature_c = self.temperature_c
        self.busy_s = 0.0
        self.power_violation_s = 0.0
        self.thermal_violation_s = 0.0
        # How many times longer the iteration in flight takes than at its realised clock
        # (1: no slowdown), and the power it draws while it runs: above 1 only where the
        # lowest clock draws more than the board limit or a run-time cap
        # (:meth:`_slowed_below_lowest_clock`).
        self.slowdown = 1.0
        self.running_power_w = idle
        self._batch_factor_cache: dict[int, float] = {}
        self.average_power_w = idle
        self.cap_overshoot_s = 0.0
        # Whether a run-time cap was ever set (:attr:`cap_overshoot_s` means something).
        self.cap_requested = False

    @property
    def enforced_power_limit_w(self) -> float:
        """The power limit in force: the run-time cap when set, else the board limit."""
        return self.params.power_limit_w if self.cap_w is None else self.cap_w

    def set_power_cap(self, cap_w: float | None) -> float:
        """Set the run-time power cap (None: remove it); returns the limit in force.

        A cap above the board limit is the board limit. The power controller's ceiling
        moves at the next segment (:meth:`busy_clock`), on the averaged power; removing
        the cap lifts it, so a cap set again acts as a first one.

        Raises:
            ValueError: ``cap_w`` is not a finite positive number of watts.
        """
        if cap_w is None:
            # No cap, no power controller: a cap set later starts from the top clock.
            self.cap_w = None
            self.cap_ceiling_index = len(self.params.clock_mhz) - 1
            return self.params.power_limit_w
        value = float(cap_w)
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(f"power cap must be finite and positive watts, got {cap_w!r}")
        self.cap_w = min(value, self.params.power_limit_w)
        self.cap_requested = True
        return self.cap_w

    def _cap_ceiling(self, fit: int) -> int:
        """Move the cap's ceiling for a segment whose highest fitting clock is ``fit``:
        down to it once the averaged power exceeds the cap, up to it while within."""
        cap = self.cap_w
        assert cap is not None
        if self.average_power_w > cap + 1e-9:
            self.cap_ceiling_index = min(self.cap_ceiling_index, fit)
        else:
            self.cap_ceiling_index = max(self.cap_ceiling_index, fit)
        return self.cap_ceiling_index

    @property
    def realized_clock_mhz(self) -> float:
        """Clock the GPU runs at now."""
        return self.params.realized_clock_mhz[self.realized_index]

    def _batch_factor(self, batch: int) -> float:
        model = self.params.decode_power_batch_model
        if model is None or batch <= 0:
            return 1.0
        cached = self._batch_factor_cache.get(batch)
        if cached is None:
            cached = model.factor(batch, self.params.reference_batch_size)
            self._batch_factor_cache[batch] = cached
        return cached

    def iteration_parts(
        self, index: int, prefill_tokens: int, decode_batch: int, context: int, noise: float
    ) -> tuple[float, float, float]:
        """(prefill seconds, decode seconds, power W) of an iteration at clock ``index``.

        ``prefill_tokens`` and a ``decode_batch`` over ``context`` tokens (not both zero);
        ``noise`` multiplies both durations (the engine's seeded jitter).
        """
        p = self.params
        t_pf = prefill_tokens / p.prefill_tokens_per_s[index] if prefill_tokens else 0.0
        if decode_batch:
            t_dec = p.decode_reference_s[index] * (
                p.weight_fraction
                + p.batch_fraction * decode_batch / p.reference_batch_size
                + p.kv_fraction * context / p.reference_context_tokens
            )
            idle = p.idle_power_w[index]
            p_dec = idle + (p.decode_power_w[index] - idle) * self._batch_factor(decode_batch)
        else:
            t_dec = 0.0
            p_dec = 0.0
        total = t_pf + t_dec
        power = (t_pf * p.prefill_power_w[index] + t_dec * p_dec) / total
        return t_pf * noise, t_dec * noise, power

    def busy_clock(
        self, index: int, prefill_tokens: int, decode_batch: int, context: int, noise: float
    ) -> tuple[int, tuple[float, float, float]]:
        """Realised clock index for an iteration requested at ``index``, and its
        :meth:`iteration_parts`; sets :attr:`realized_index` and :attr:`clock_event_reasons`.

        The requested clock is held lower while the iteration's power exceeds the board
        limit (SW power cap; slowed below the lowest clock where that still exceeds it,
        :attr:`slowdown`), below a run-time cap's ceiling (the module notes), and while
        the die is at or above the thermal limit (slowed below the lowest clock where that
        still draws more than the thermally safe power).
        """
        requested = index
        parts = self.iteration_parts(index, prefill_tokens, decode_batch, context, noise)
        limit = self.params.power_limit_w + 1e-9
        while index > 0 and parts[2] > limit:
            index -= 1
            parts = self.iteration_parts(index, prefill_tokens, decode_batch, context, noise)
        held = self.params.power_limit_w
        cap = self.cap_w
        if cap is not None:
            fit, fit_parts = index, parts
            while fit > 0 and fit_parts[2] > cap + 1e-9:
                fit -= 1
                fit_parts = self.iteration_parts(fit, prefill_tokens, decode_batch, context, noise)
            ceiling = self._cap_ceiling(fit)
            if ceiling < index:
                index = ceiling
                parts = (
                    fit_parts
                    if ceiling == fit
                    else self.iteration_parts(index, prefill_tokens, decode_batch, context, noise)
                )
            if ceiling == 0 and cap > self.params.idle_power_w[0]:
                # The cap's controller has come down to the lowest clock: past it, the
                # firmware slows the GPU as it does for the board limit. A cap at or
                # below the idle power cannot be held; the board limit still is.
                held = min(held, cap)
        self.slowdown = 1.0
        if index == 0 and parts[2] > held + 1e-9:
            parts = self._slowed_below_lowest_clock(index, parts, held)
        reasons = CLOCK_EVENT_SW_POWER_CAP if index < requested or self.slowdown > 1.0 else 0
        if self.temperature_c >= self.params.thermal_limit_c:
            capped = index
            safe = self.params.thermal_safe_power_w()
            while index > 0 and parts[2] > safe:
                index -= 1
                parts = self.iteration_parts(index, prefill_tokens, decode_batch, context, noise)
            slowed = self.slowdown
            idle = self.params.idle_power_w[0]
            if index == 0 and parts[2] > safe + 1e-9 and safe > idle:
                # Even the lowest clock is too hot: slowed there (thermal slowdown) to draw
                # halfway from its idle power to the safe power, so the die cools back
                # under the limit, as it does at a lower clock.
                parts = self._slowed_below_lowest_clock(
                    0,
                    self.iteration_parts(0, prefill_tokens, decode_batch, context, noise),
                    min(held, 0.5 * (idle + safe)),
                )
            if index < capped or self.slowdown > slowed:
                reasons |= CLOCK_EVENT_SW_THERMAL_SLOWDOWN
        if self.slowdown == 1.0:
            self.running_power_w = parts[2]
        self.clock_event_reasons = reasons
        self.realized_index = index
        return index, parts

    def _slowed_below_lowest_clock(
        self, index: int, parts: tuple[float, float, float], limit: float
    ) -> tuple[float, float, float]:
        """``parts`` of an iteration at clock ``index`` (the lowest) that draws more than
        ``limit`` (the board limit, a run-time cap below it, or a thermal slowdown's power),
        slowed to draw the limit: run a share of the time, idle the rest.

        The share is ``(limit - idle) / (power - idle)``, so the mean power is the limit
        and both durations grow by its inverse (:attr:`slowdown`). A limit at or below the
        idle power cannot be held: unchanged (the loader refuses such a board limit, and
        :meth:`busy_clock` holds the board limit in place of such a run-time cap).
        """
        t_pf, t_dec, power = parts
        idle = self.params.idle_power_w[index]
        if limit <= idle:
            return parts
        self.slowdown = (power - idle) / (limit - idle)
        self.running_power_w = power
        return t_pf * self.slowdown, t_dec * self.slowdown, limit

    def idle_clock(self, index: int) -> int:
        """Realised clock index while idle at requested ``index`` (held lower by the board
        limit, a run-time power cap's ceiling and the thermal limit); sets
        :attr:`realized_index` and :attr:`clock_event_reasons`."""
        reasons = CLOCK_EVENT_GPU_IDLE
        requested = index
        idle_power = self.params.idle_power_w
        limit = self.params.power_limit_w + 1e-9
        while index > 0 and idle_power[index] > limit:
            index -= 1
        if index < requested:
            reasons |= CLOCK_EVENT_SW_POWER_CAP
        self.slowdown = 1.0
        self.running_power_w = idle_power[index]
        cap = self.cap_w
        if cap is not None:
            fit = index
            while fit > 0 and self.params.idle_power_w[fit] > cap + 1e-9:
                fit -= 1
            ceiling = self._cap_ceiling(fit)
            if ceiling < index:
                index = ceiling
                reasons |= CLOCK_EVENT_SW_POWER_CAP
        if self.temperature_c >= self.params.thermal_limit_c:
            capped = index
            safe = self.params.thermal_safe_power_w()
            idle_power = self.params.idle_power_w
            while index > 0 and idle_power[index] > safe:
                index -= 1
            if index < capped:
                reasons |= CLOCK_EVENT_SW_THERMAL_SLOWDOWN
        self.clock_event_reasons = reasons
        self.realized_index = index
        return index

    def may_reach_thermal_limit(self, power_w: float) -> bool:
        """The die is at the thermal limit, or would reach it under constant ``power_w``."""
        p = self.params
        return (
            self.temperature_c >= p.thermal_limit_c
            or p.steady_temperature_c(power_w) >= p.thermal_limit_c
        )

    def integrate(self, dt: float, power: float, *, busy: bool) -> None:
        """Run ``dt`` seconds at constant ``power``: energy, thermal RC, busy time and the
        seconds above the power and thermal limits (``dt <= 0`` only sets the power)."""
        self.power_w = power
        if dt <= 0.0:
            return
        p = self.params
        t0 = self.temperature_c
        tau = p.thermal_time_constant_s
        # temperature_after(t0, power, dt), inlined on the simulator's hot path.
        t_eq = p.ambient_temperature_c + p.thermal_resistance_c_per_w * power
        self.energy_j += power * dt
        self.temperature_c = t_eq + (t0 - t_eq) * math.exp(-dt / tau)
        if self.temperature_c > self.peak_temperature_c:
            self.peak_temperature_c = self.temperature_c
        if busy:
            self.busy_s += dt
        window = p.power_cap_window_s
        self.average_power_w = (
            power
            if window <= 0.0
            else power + (self.average_power_w - power) * math.exp(-dt / window)
        )
        if self.cap_w is not None and power > self.cap_w + 1e-9:
            self.cap_overshoot_s += dt
        if power > p.power_limit_w + 1e-9:
            self.power_violation_s += dt
        limit = p.thermal_limit_c
        if t0 > limit or t_eq > limit:
            self.thermal_violation_s += _time_above(t0, t_eq, tau, dt, limit)


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
