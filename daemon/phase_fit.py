"""The energy estimator's phase model: the powers and prefill time that split a window's
measured energy between prefill, decode and idle, its own windowed fit of them, and the
prior used before that fit has data.

The fit (:class:`PhaseFit`) takes one row per window and refits by non-negative least
squares; :func:`split_components` prices one window's phases with its coefficients (or
the prior); :func:`learned_phase_model` reads ``mpc-online``'s learned powers instead,
where asked. Pure computation: the estimator (:mod:`daemon.energy`) keeps the windows,
the skipped ones and the rates.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gpugov.controllers.contract import layers

PRIOR_DECODE_TOKEN_WEIGHT = 30.0
"""Before the fit is ready: busy seconds of one output token relative to one prompt token."""
PRIOR_IDLE_POWER_RATIO = 0.25
"""Before the fit is ready: idle power relative to busy power (a data-centre GPU idles at
a fifth to a third of its serving power)."""


@runtime_checkable
class PhaseModel(Protocol):
    """What the estimator reads of a learned model (``mpc-online``'s ``OnlineModel``)."""

    warmed_up: bool

    def phase_power_w(self, clock_mhz: float, phase: str) -> tuple[float, float]: ...

    def prefill_s_per_token(self, clock_mhz: float) -> tuple[float, float]: ...


def learned_phase_model(controller: object) -> PhaseModel | None:
    """The warmed-up learned model of a controller chain (``mpc-online``), else None.

    Reads only: the controller's behaviour is untouched."""
    for layer in layers(controller):  # type: ignore[arg-type]
        model = getattr(layer, "model", None)
        if isinstance(model, PhaseModel) and bool(getattr(model, "warmed_up", False)):
            return model
    return None


@dataclass(frozen=True, slots=True)
class PhaseCoefficients:
    """Powers (W) per phase and prefill seconds per prompt token, for one split."""

    idle_w: float
    prefill_w: float
    decode_w: float
    prefill_s_per_token: float


BATCH_HALF = 16.0
"""Decode power rises with the batch and saturates: the fit's batch term is
``batch / (batch + half)``, ``half`` this by default."""
BATCH_HALF_CHOICES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""The half-saturation batches the energy fit chooses among (by its residual): GPUs
differ in how fast decode power saturates with the batch."""


def batch_term(batch: float, half: float = BATCH_HALF) -> float:
    """The saturating batch factor of the fit's decode power."""
    return batch / (batch + half) if batch > 0 else 0.0


CLOCK_POWER_EXPONENT = 2.5
"""Dynamic power grows about as ``f V^2``, with the voltage rising with the clock: the
fit's clock term of every phase power is ``(f / f_top) ** CLOCK_POWER_EXPONENT``."""


def clock_term(slowdown: float | np.ndarray) -> Any:
    """The clock term of the fit's powers for a window of slow-down ``f_top / f``."""
    return np.power(1.0 / np.maximum(slowdown, 1.0), CLOCK_POWER_EXPONENT)


@dataclass
class PhaseFit:
    """Windowed non-negative least squares of the phase model (the estimator's own fit).

    Time: ``busy_s = a g prompt + b iterations + c g iterations + d iterations x kv + e
    decode_tokens`` (``g = f_top / f``, the clock's slow-down of compute-bound work;
    ``kv`` the KV tokens in use, what a decode iteration reads; ``decode_tokens`` the
    iterations times their batch, each sequence's own share of a step), so ``a g`` is the
    prefill seconds per prompt token at the window's clock. Energy, with ``prefill_s =
    min(busy_s, a g prompt)`` and ``decode_s = busy_s - prefill_s``: ``E = P_idle(f)
    idle_s + P_prefill(f) prefill_s + (P_busy(f) + P_batch(f) batch_term(batch, K))
    decode_s``, each ``P(f) = p0 + p1 clock_term(g)``. Prefill has its own power:
    compute-bound, it can draw far less than a memory-bound decode at a low clock and
    more at the top one. ``K`` (how soon decode power saturates) is the one of
    :data:`BATCH_HALF_CHOICES` with the least residual when every window's steps were
    counted by the engine, else :data:`BATCH_HALF`. The time fit runs on sums over
    ``time_block_windows`` consecutive windows, each block weighted down when its batch
    moved: without a step count a window's batch, hence its iteration count, is known
    only at its ends. With the count, single windows fitted better in virtual time but
    worse at real time through ``gpugov emulate``, where the engine's counters and the
    GPU's energy are read at slightly different instants. Older windows weigh less (half
    weight after ``half_life_windows``); at most ``memory_windows`` are kept; refitted
    every ``refit_every`` windows.
    """

    memory_windows: int = 600
    half_life_windows: float = 300.0
    min_windows: int = 20
    refit_every: int = 5
    time_block_windows: int = 10
    _rows: deque[tuple[float, ...]] = field(default_factory=deque)
    _since_fit: int = 0
    _fitted: tuple[float, ...] | None = None
    working_windows: int = 0
    top_clock_mhz: float = 0.0

    def slowdown(self, clock_mhz: float | None) -> float:
        """``f_top / f`` for a window at ``clock_mhz`` (1 when unknown)."""
        if clock_mhz is None or not math.isfinite(clock_mhz) or clock_mhz <= 0:
            return 1.0
        self.top_clock_mhz = max(self.top_clock_mhz, clock_mhz)
        return self.top_clock_mhz / clock_mhz

    def add(
        self,
        idle_s: float,
        busy_s: float,
        prompt: float,
        iterations: float,
        kv_tokens: float,
        batch: float,
        slowdown: float,
        energy_j: float,
        batch_change: float = 0.0,
        steps_counted: bool = False,
        prefill_s: float | None = None,
    ) -> None:
        """Fold in one window (a row with a negative or non-finite value is ignored);
        ``batch_change`` is how much the batch moved between the window's ends;
        ``steps_counted``: the iterations are the engine's own count, and ``batch`` the
        mean batch over them (not the batch at the window's ends); ``prefill_s``: the
        window's prefill seconds where the engine timed them (the energy fit then uses
        them instead of the time fit's)."""
        row = (
            idle_s,
            busy_s,
            prompt,
            iterations,
            kv_tokens,
            batch,
            slowdown,
            energy_j,
            batch_change,
            float(steps_counted),
            float(prefill_s is not None),
            0.0 if prefill_s is None else prefill_s,
        )
        if not all(math.isfinite(v) and v >= 0 for v in row):
            return
        self._rows.append(row)
        while len(self._rows) > self.memory_windows:
            self._rows.popleft()
        if prompt > 0 or iterations > 0:
            self.working_windows += 1
        self._since_fit += 1

    def coefficients(self, slowdown: float = 1.0, batch: float = 0.0) -> PhaseCoefficients | None:
        """The current fit for a window of clock slow-down ``slowdown`` and mean decode
        ``batch``, or None before ``min_windows`` working windows."""
        if self.working_windows < self.min_windows:
            return None
        if self._fitted is None or self._since_fit >= self.refit_every:
            self._fitted = self._fit() or self._fitted
            self._since_fit = 0
        if self._fitted is None:
            return None
        idle_w, idle_h, pf_w, pf_h, busy_w, busy_h, batch_w, batch_h, seconds, half = self._fitted
        h = clock_term(slowdown)
        return PhaseCoefficients(
            idle_w=idle_w + idle_h * h,
            prefill_w=pf_w + pf_h * h,
            decode_w=busy_w + busy_h * h + (batch_w + batch_h * h) * batch_term(batch, half),
            prefill_s_per_token=seconds * slowdown,
        )

    def _fit(self) -> tuple[float, ...] | None:
        from scipy.optimize import nnls  # only once a fit is due (commands stay lean)

        rows = np.asarray(self._rows, dtype=float)
        n = rows.shape[0]
        weights = np.sqrt(0.5 ** (np.arange(n)[::-1] / self.half_life_windows))
        (
            idle,
            busy,
            prompt,
            iterations,
            kv,
            batch,
            g,
            energy,
            change,
            counted,
            timed,
            timed_prefill,
        ) = rows.T
        # Time features scaled near 1 (kilo-tokens, hundreds of iterations), summed over
        # blocks of consecutive windows: a window's batch (without a step count) is known
        # only at its ends, and its counters and energy are read at different instants.
        x_time = np.column_stack(
            [
                g * prompt / 1000.0,
                iterations / 100.0,
                g * iterations / 100.0,
                iterations * kv / 1e7,
                iterations * batch / 1000.0,
                busy,
            ]
        )
        blocks = _block_sums(x_time, self.time_block_windows)
        working = blocks[:, -1] > 0
        if working.sum() < 5:
            return None
        # A block weighs by its windows' age and by how steady their batch was (a window
        # whose batch moved has a poor iteration count).
        trust = weights**2 / (1.0 + change) ** 2
        w = _block_sums(trust[:, None], self.time_block_windows)[working, 0] ** 0.5
        seconds, _ = nnls(blocks[working, :-1] * w[:, None], blocks[working, -1] * w)
        alpha = float(seconds[0]) / 1000.0
        prefill_s = np.minimum(busy, np.where(timed > 0, timed_prefill, alpha * g * prompt))
        decode_s = busy - prefill_s
        h = clock_term(g)
        # How fast decode power saturates with the batch is chosen by the residual only
        # where every window's mean batch is known (the engine counts its steps): a
        # batch guessed from the window's ends would pick a shape from its noise.
        choices = BATCH_HALF_CHOICES if bool(counted.all()) else (BATCH_HALF,)
        best: tuple[float, np.ndarray, float] | None = None
        for half in choices:
            loaded = decode_s * batch / (batch + half)
            x_energy = np.column_stack(
                [
                    idle,
                    idle * h,
                    prefill_s,
                    prefill_s * h,
                    decode_s,
                    decode_s * h,
                    loaded,
                    loaded * h,
                ]
            )
            power, residual = nnls(x_energy * weights[:, None], energy * weights)
            if best is None or residual < best[0]:
                best = (float(residual), power, half)
        assert best is not None
        _, power, half = best
        values = (*(float(p) for p in power), alpha, half)
        return values if all(math.isfinite(v) for v in values) else None


def _block_sums(rows: np.ndarray, size: int) -> np.ndarray:
    """Sums of ``rows`` over consecutive blocks of ``size``, aligned on the newest row
    (the oldest block may be shorter)."""
    n = rows.shape[0]
    rest = n % size
    starts = np.arange(rest, n, size)
    if rest:
        starts = np.concatenate([[0], starts])
    return np.add.reduceat(rows, starts, axis=0)


def split_components(
    idle_s: float,
    busy_s: float,
    prompt: float,
    output: float,
    coefficients: PhaseCoefficients | None,
    prefill_s: float | None = None,
) -> tuple[float, float, float]:
    """Unscaled ``(prefill, decode, idle)`` components of one window (non-negative);
    ``prefill_s``: the prefill seconds where the engine timed them (else estimated)."""
    c = coefficients
    if prefill_s is None or not math.isfinite(prefill_s):
        if c is None:  # the prior: busy time split by tokens
            weight = prompt + PRIOR_DECODE_TOKEN_WEIGHT * output
            prefill_s = busy_s * prompt / weight if weight > 0 else 0.0
        else:
            prefill_s = max(0.0, c.prefill_s_per_token) * prompt
    prefill_s = min(busy_s, max(0.0, prefill_s))
    if c is None:  # the prior prices busy time alike and idle lower
        return prefill_s, busy_s - prefill_s, PRIOR_IDLE_POWER_RATIO * idle_s
    prefill = max(0.0, c.prefill_w) * prefill_s
    decode = max(0.0, c.decode_w) * (busy_s - prefill_s)
    idle = max(0.0, c.idle_w) * idle_s
    return prefill, decode, idle


def learned_coefficients(model: PhaseModel, clock_mhz: float) -> PhaseCoefficients | None:
    """The learned model's powers and prefill time at ``clock_mhz`` (None: not finite)."""
    try:
        values = [model.phase_power_w(clock_mhz, phase)[0] for phase in ("idle", "prefill")]
        values.append(model.phase_power_w(clock_mhz, "decode")[0])
        seconds = model.prefill_s_per_token(clock_mhz)[0]
    except (ValueError, ArithmeticError):
        return None
    if not all(math.isfinite(v) for v in (*values, seconds)):
        return None
    return PhaseCoefficients(
        idle_w=values[0], prefill_w=values[1], decode_w=values[2], prefill_s_per_token=seconds
    )
