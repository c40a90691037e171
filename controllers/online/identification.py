"""Online identification of a node's clock -> latency/power model from its observations.

A real node shows, per control window, how many prompt tokens the engine prefilled and how
many tokens it generated (engine counters), how busy the GPU was and how much energy it
used (NVML), and at which clock it really ran. This module fits, by recursive Bayesian
linear regression with forgetting (:class:`RecursiveLeastSquares`), the model the MPC
needs, on features the physics suggests:

* **busy time** of a window = prefill time + decode time,
  ``busy = sum_k g h_k(f) [tp_k P + tw_k N + tb_k D + tc_k D c]`` where ``P`` is prompt
  kilo-tokens, ``N`` decode iterations (hundreds), ``D`` generated kilo-tokens, ``c`` the
  mean context per running request (kilo-tokens), ``g = f_max / f`` and ``h_k`` the
  piecewise-linear interpolation weights of the clock over ``knots`` clocks. A constant
  coefficient across knots is a compute-bound part (time ~ 1/f); coefficients falling
  with the clock are memory-bound parts (time flat in f). Before any data the prior
  holds every knot equal to the top one: the compute-bound extrapolation, which is the
  pessimistic one (no part of an iteration slows down faster than 1/f);
* **energy** of a window = ``sum_k h_k(f) [pi_k idle_s + pp_k prefill_s + pd_k decode_s]``
  (power per phase per clock), the prefill seconds taken from the time model;
* **the realised clock** per requested clock (power-cap and thermal holds), as a ratio;
* **thermal RC**: ``T' = a T + b + c P`` per window.

Every estimate keeps its covariance, so the model reports a standard deviation for any
prediction (:meth:`OnlineModel.decode_iteration_s` etc.). Memory is fixed by the number
of clocks and knots, whatever the run length. Pure computation: no I/O, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpugov.controllers.online.prediction import (
    DECODE_MEAN,
    DECODE_STD,
    POWER_ROWS,
    PREFILL_MEAN,
    PREFILL_STD,
    learned_tables,
    predict_table,
)
from gpugov.controllers.online.regression import MAX_STORED_COUNT, RecursiveLeastSquares
from gpugov.controllers.online.window import Window
from gpugov.plant.ceilings import MAX_TOKENS_PER_S

FloatArray = NDArray[np.float64]

MODEL_VERSION = 1
"""Version of :meth:`OnlineModel.state_dict`'s layout; a stored model of another version is
discarded."""
# Feature units (keep the coefficients near 1e-2..1 s so the regression is well scaled).
PROMPT_UNIT = 1000.0  # prompt tokens per feature unit
ITERATION_UNIT = 100.0  # decode iterations per unit
DECODE_UNIT = 1000.0  # generated tokens per unit
CONTEXT_UNIT = 1000.0  # context tokens per unit
TIME_BLOCKS = ("prefill", "weights", "batch", "context")
POWER_BLOCKS = ("idle", "prefill", "decode")
REFERENCE_BATCH = 64
"""Decode batch at which the learned profile, the exploration's uncertainty and the
stored model's check read the decode iteration (and a hint's profile is built)."""
REFERENCE_CONTEXT_TOKENS = 1024.0
"""Context at which the exploration's uncertainty and the stored model's check read it."""
NONFINITE_PARTS = ("window", "clock_ratio", "time", "power", "thermal")
"""Parts of :class:`OnlineModel` that skip a window holding a NaN or infinite field (or
one no node can show: :data:`~plant.ceilings.MAX_TOKENS_PER_S`, a power fit gone to 0 W
or below)."""
MIN_PLAUSIBLE_WINDOW_S = 1.0
"""A window shorter than this is allowed a second's worth of the ceilings above (an
engine may account a step's tokens at once)."""


def hat_weights(clock_mhz: float, knots_mhz: FloatArray) -> FloatArray:
    """Piecewise-linear interpolation weights of ``clock_mhz`` on ``knots_mhz`` (sum 1)."""
    weights = np.zeros(knots_mhz.size)
    if clock_mhz <= knots_mhz[0]:
        weights[0] = 1.0
        return weights
    if clock_mhz >= knots_mhz[-1]:
        weights[-1] = 1.0
        return weights
    upper = int(np.searchsorted(knots_mhz, clock_mhz, side="right"))
    lower = upper - 1
    span = knots_mhz[upper] - knots_mhz[lower]
    share = (clock_mhz - knots_mhz[lower]) / span
    weights[lower] = 1.0 - share
    weights[upper] = share
    return weights


def smooth_covariance(knots_mhz: FloatArray, scale: float, length_fraction: float) -> FloatArray:
    """Squared-exponential covariance over the knots (plus a small nugget): neighbouring
    clocks are strongly correlated, far ones less."""
    span = max(float(knots_mhz[-1] - knots_mhz[0]), 1.0)
    distance = (knots_mhz[:, None] - knots_mhz[None, :]) / (length_fraction * span)
    kernel = np.exp(-0.5 * distance**2) + 1e-4 * np.eye(knots_mhz.size)
    return scale * scale * kernel


@dataclass(frozen=True, slots=True)
class ModelPrior:
    """A rough starting point (from a bundled profile or a hint): per-clock values at the
    top clock, used instead of the warm-up estimate. All optional."""

    prefill_s_per_token: float | None = None
    decode_iteration_s: float | None = None
    """Decode iteration time at the reference batch and context, at the top clock."""
    idle_power_w: float | None = None
    prefill_power_w: float | None = None
    decode_power_w: float | None = None
    time_table: tuple[tuple[float, float, float, float, float], ...] = ()
    """Per-clock times from physics (a hint, :mod:`controllers.online.prior`): rows of
    ``(clock MHz, prefill s per prompt token, decode s per iteration, s per running request
    per iteration, s per context token per iteration)``; gives the time prior its clock
    shape (kept when the warm-up re-centres the level). Overrides the two values above."""
    replaces_warmup: bool = True
    """True (a profile): the prior stands in for the warm-up. False (a rough hint): the
    warm-up still runs and sets the level; only ``time_table``'s clock shape is taken."""
    board_power_w: float | None = None
    """The domain's board power (TDP x GPUs) the hint implies: the power-cap fallback."""
    source: str = "profile"


class OnlineModel:
    """The learned clock -> latency/power model of one control domain.

    Args:
        clocks_mhz: the supported clocks (NVML), ascending.
        power_limit_w: the board power limit (NVML), the scale of the power prior.
        knots: clocks the coefficients are interpolated between (spread over the range).
        memory_s: the forgetting horizon: evidence older than this fades.
        period_s: the expected window length (sets the forgetting per update).
        warmup_windows: busy windows at one clock before the prior is re-centred on them.
        hinted_warmup_windows: the warm-up once a hint has given the clock shape
            (:meth:`adopt_hint`, or a ``prior`` with a ``time_table``): only the level at
            the top clock is left to learn then (None: ``warmup_windows`` either way).
        prior: optional :class:`ModelPrior`.
    """

    def __init__(
        self,
        clocks_mhz: tuple[float, ...] | list[float] | FloatArray,
        power_limit_w: float,
        *,
        knots: int = 8,
        memory_s: float = 900.0,
        period_s: float = 1.0,
        warmup_windows: int = 20,
        hinted_warmup_windows: int | None = None,
        relative_spread: float = 0.3,
        prior: ModelPrior | None = None,
    ) -> None:
        clocks = np.unique(np.asarray(clocks_mhz, dtype=float))
        if clocks.size < 2:
            raise ValueError("OnlineModel needs at least two supported clocks")
        if not math.isfinite(power_limit_w) or power_limit_w <= 0.0:
            raise ValueError(f"power_limit_w must be positive, got {power_limit_w!r}")
        self.clocks_mhz = clocks
        self.power_limit_w = float(power_limit_w)
        count = max(2, min(int(knots), clocks.size))
        self.knots_mhz = np.unique(
            clocks[np.linspace(0, clocks.size - 1, count).round().astype(int)]
        )
        k = self.knots_mhz.size
        self.maximum_mhz = float(clocks[-1])
        self.relative_spread = float(relative_spread)
        self.warmup_windows = int(warmup_windows)
        self.hinted_warmup_windows = hinted_warmup_windows
        forgetting = math.exp(-max(period_s, 1e-3) / max(memory_s, period_s))
        self.memory_s = float(memory_s)
        # Before warm-up: a broad prior with all knots of a block moving together.
        broad_time = np.asarray(
            np.kron(np.eye(len(TIME_BLOCKS)), np.ones((k, k)) + 1e-3 * np.eye(k)), dtype=np.float64
        )
        self.time = RecursiveLeastSquares(
            np.zeros(len(TIME_BLOCKS) * k), broad_time, 1e-4, forgetting
        )
        power_prior = np.concatenate([self._physics_power(block) for block in POWER_BLOCKS])
        power_cov = np.asarray(
            np.kron(
                np.eye(len(POWER_BLOCKS)),
                smooth_covariance(self.knots_mhz, 0.3 * self.power_limit_w, 0.5),
            ),
            dtype=np.float64,
        )
        self.power = RecursiveLeastSquares(power_prior, power_cov, 25.0, forgetting)
        self.thermal = RecursiveLeastSquares(
            np.array([0.97, 1.0, 0.002]), np.diag([0.05, 100.0, 1e-3]) ** 2, 0.05, forgetting
        )
        self.realized_ratio = np.ones(clocks.size)
        self.visits = np.zeros(clocks.size, dtype=np.int64)
        self.warmed_up = False
        self._warmup_count = 0
        self.skipped_nonfinite_windows = 0
        """Windows of which a fit (or all) was skipped for a NaN or infinite field."""
        self.skipped_nonfinite: dict[str, int] = dict.fromkeys(NONFINITE_PARTS, 0)
        """The same, per part of the model (``window``: the whole window was skipped)."""
        self.time_shape = np.ones((len(TIME_BLOCKS), k))
        """Per-knot coefficient relative to the top knot's, per block: ones (the
        compute-bound extrapolation) unless a prior's ``time_table`` gives the physics."""
        self.prior = prior
        if prior is not None:
            self._apply_prior(prior)

    # --------------------------------------------------------------- priors
    def _physics_power(self, block: str) -> FloatArray:
        """Power prior per knot: ``p = p0 + (p_top - p0) x^2.5`` (dynamic power ~ f V^2),
        scaled on the power limit."""
        x = self.knots_mhz / self.maximum_mhz
        floor = 0.15 * self.power_limit_w
        top = {"idle": 0.2, "prefill": 0.9, "decode": 0.6}[block] * self.power_limit_w
        if block == "idle":
            return floor + (top - floor) * x
        return floor + (top - floor) * x**2.5

    def _time_prior(self, top_values: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Every knot equal to the top clock's value (compute-bound extrapolation; times
        ``time_shape`` when a hint gave the physics' shape), with a spread of
        ``relative_spread`` times the value, correlated over the clocks."""
        k = self.knots_mhz.size
        mean = (np.asarray(top_values, dtype=float)[:, None] * self.time_shape).ravel()
        # A part the warm-up could not separate (estimate near or clipped at 0) keeps a
        # spread on the scale of the largest part (the units make the parts comparable),
        # or later evidence could never move it.
        floor = max(1e-4, 0.05 * float(np.max(np.abs(top_values), initial=0.0)))
        blocks = []
        for index, value in enumerate(top_values):
            scale = self.relative_spread * max(abs(float(value)), floor)
            shape = self.time_shape[index]
            blocks.append(smooth_covariance(self.knots_mhz, scale, 0.35) * np.outer(shape, shape))
        covariance = np.zeros((mean.size, mean.size))
        for index, block in enumerate(blocks):
            covariance[index * k : (index + 1) * k, index * k : (index + 1) * k] = block
        return mean, covariance

    def _hinted_coefficients(self, prior: ModelPrior) -> FloatArray:
        """The time coefficients per block and knot that ``prior.time_table`` implies."""
        table = np.asarray(sorted(prior.time_table), dtype=float)
        units = (PROMPT_UNIT, ITERATION_UNIT, DECODE_UNIT, DECODE_UNIT * CONTEXT_UNIT)
        g = self.maximum_mhz / self.knots_mhz
        rows = [
            np.interp(self.knots_mhz, table[:, 0], table[:, 1 + index]) * unit / g
            for index, unit in enumerate(units)
        ]
        return np.maximum(np.vstack(rows), 0.0)

    def _apply_hint(self, prior: ModelPrior) -> None:
        """Take the clock shape of ``time_table`` (per block, relative to the top knot, at
        most the compute-bound 1; used when the warm-up re-centres the prior). A prior that
        replaces the warm-up also sets the level; a rough hint does not: the warm-up's
        evidence sets it and the split between the parts (started from a wrong level or
        split, the warm-up's fit goes wrong and a part can end stuck near zero)."""
        coefficients = self._hinted_coefficients(prior)
        top = np.maximum(coefficients[:, -1:], 1e-12)
        self.time_shape = np.clip(coefficients / top, 0.05, 1.0)
        if self.hinted_warmup_windows is not None:
            # The shape is given: the warm-up only centres it on the top clock.
            self.warmup_windows = min(self.warmup_windows, int(self.hinted_warmup_windows))
        if prior.replaces_warmup:
            mean, covariance = self._time_prior(coefficients[:, -1])
            self.time.reset_prior(mean, covariance * 4.0)
            self.warmed_up = True

    def adopt_hint(self, prior: ModelPrior) -> bool:
        """Take a rough hint's clock shape (``time_table``) that arrived after the model
        was made (the engine's first ``model_name``): only while the warm-up still runs,
        as the warm-up's end is where the shape is used; a prior that replaces the
        warm-up, or a model already warmed up, is left as it is. True when taken."""
        if self.warmed_up or prior.replaces_warmup or not prior.time_table:
            return False
        self.prior = prior
        self._apply_hint(prior)
        return True

    def _apply_prior(self, prior: ModelPrior) -> None:
        if prior.time_table:
            self._apply_hint(prior)
        elif prior.prefill_s_per_token is not None and prior.decode_iteration_s is not None:
            # Split the hinted decode iteration: half weight reads, the rest batch/context.
            iteration = prior.decode_iteration_s
            top = np.array(
                [
                    prior.prefill_s_per_token * PROMPT_UNIT,
                    0.5 * iteration * ITERATION_UNIT,
                    0.25 * iteration / 64.0 * DECODE_UNIT,
                    0.25 * iteration / (64.0 * 1024.0) * DECODE_UNIT * CONTEXT_UNIT,
                ]
            )
            mean, covariance = self._time_prior(top)
            self.time.reset_prior(mean, covariance * 4.0)
            self.warmed_up = True
        k = self.knots_mhz.size
        mean = self.power.mean.copy()
        for index, value in enumerate(
            (prior.idle_power_w, prior.prefill_power_w, prior.decode_power_w)
        ):
            if value is not None:
                block = self._physics_power(POWER_BLOCKS[index])
                mean[index * k : (index + 1) * k] = block * (value / block[-1])
        self.power.reset_prior(mean, self.power.covariance)

    # ------------------------------------------------------------- features
    def _g(self, clock_mhz: float) -> float:
        return self.maximum_mhz / max(clock_mhz, 1.0)

    def _clock_index(self, clock_mhz: float) -> int:
        index = int(self.clocks_mhz.searchsorted(clock_mhz - 1e-6))
        return min(max(index, 0), self.clocks_mhz.size - 1)

    def time_features(self, window: Window, hat: FloatArray | None = None) -> FloatArray:
        """Regressors of the busy-time model for ``window``."""
        h = hat_weights(window.realized_mhz, self.knots_mhz) if hat is None else hat
        h = h * self._g(window.realized_mhz)
        work = np.array(
            [
                window.prompt_tokens / PROMPT_UNIT,
                window.iterations / ITERATION_UNIT,
                window.generated_tokens / DECODE_UNIT,
                window.generated_tokens / DECODE_UNIT * window.context_tokens / CONTEXT_UNIT,
            ]
        )
        # np.outer's own arithmetic; a product that overflows (absurd counters) is refused
        # by the regression as non-finite, so numpy need not warn on a node's stderr.
        with np.errstate(over="ignore", invalid="ignore"):
            return np.multiply(work[:, None], h[None, :]).ravel()

    # --------------------------------------------------------------- update
    def update(self, window: Window) -> None:
        """Fold one window in: busy time, energy, realised clock, temperature.

        A part whose inputs hold a NaN or an infinity (a temperature not read yet, a bad
        counter) skips the window, counted in ``skipped_nonfinite`` and
        ``skipped_nonfinite_windows``; the other parts still learn from it. A window
        without a finite length, clock or busy time is skipped whole."""
        skipped: list[str] = []
        if not (
            math.isfinite(window.duration_s)
            and window.duration_s > 0.0
            and math.isfinite(window.realized_mhz)
            and math.isfinite(window.busy_s)
        ):
            self._count_skipped(["window"])
            return
        allowed = MAX_TOKENS_PER_S * max(window.duration_s, MIN_PLAUSIBLE_WINDOW_S)
        if not all(
            abs(value) <= allowed
            for value in (window.prompt_tokens, window.generated_tokens, window.iterations)
            if math.isfinite(value)
        ):
            # A counter gone wild: no node shows such a window (and its features would
            # overflow the fits or drive the prefill estimate, and the power fit, negative).
            self._count_skipped(["window"])
            return
        index = self._clock_index(window.realized_mhz)
        hat = hat_weights(window.realized_mhz, self.knots_mhz)
        busy_fraction = window.busy_s / window.duration_s
        if window.requested_mhz is not None and busy_fraction > 0.5:
            if math.isfinite(window.requested_mhz):
                requested = self._clock_index(window.requested_mhz)
                ratio = min(1.0, window.realized_mhz / max(window.requested_mhz, 1.0))
                self.realized_ratio[requested] += 0.2 * (ratio - self.realized_ratio[requested])
            else:
                skipped.append("clock_ratio")
        worked = window.prompt_tokens > 0 or window.generated_tokens > 0
        work = (window.prompt_tokens, window.iterations, window.generated_tokens)
        x = (
            self.time_features(window, hat)
            if all(math.isfinite(v) for v in (*work, window.context_tokens))
            else None
        )
        if worked and window.busy_s > 0.0:
            if x is not None:
                self.visits[index] += 1
                self.time.update(x, window.busy_s)
                if not self.warmed_up:
                    self._warmup_count += 1
                    if self._warmup_count >= self.warmup_windows:
                        self._finish_warmup()
            else:
                skipped.append("time")
        if window.energy_j is not None:
            k = self.knots_mhz.size
            estimated = math.nan  # the prefill seconds, from the prompt tokens
            if math.isfinite(window.prompt_tokens):
                # The time features' prefill block (same operations, same rounding).
                prompt_x = (window.prompt_tokens / PROMPT_UNIT) * (
                    hat * self._g(window.realized_mhz)
                )
                estimated = float(prompt_x @ self.time.mean[:k])
            prefill = min(max(0.0, estimated), window.busy_s)
            decode = max(0.0, window.busy_s - prefill)
            idle = max(0.0, window.duration_s - window.busy_s)
            power_x = np.multiply(np.array([idle, prefill, decode])[:, None], hat[None, :]).ravel()
            finite = math.isfinite(window.energy_j) and math.isfinite(estimated)
            if not (finite and self._update_power(power_x, window.energy_j)):
                skipped.append("power")
            mean_power = window.energy_j / window.duration_s
            thermal_x = np.array([window.temperature_start_c, 1.0, mean_power])
            if math.isfinite(window.temperature_end_c) and bool(np.isfinite(thermal_x).all()):
                self.thermal.update(thermal_x, window.temperature_end_c)
            else:
                skipped.append("thermal")
        if skipped:
            self._count_skipped(skipped)

    def _update_power(self, x: FloatArray, energy_j: float) -> bool:
        """Fold one window into the power fit unless it would leave a phase's power at
        the top clock at 0 W or below (no board draws that; the state file's loader
        refuses such a model, :func:`daemon.stored_model.model_state_problem`): then the
        fit is left as it was and False returned."""
        power = self.power
        k = self.knots_mhz.size

        def drawn() -> bool:
            return all(power.mean[(i + 1) * k - 1] > 0.0 for i in range(len(POWER_BLOCKS)))

        was_drawn = drawn()
        before = (power.mean, power.covariance, power.samples, power.residual_ms)
        noise = power.noise_variance
        if not math.isfinite(power.update(x, energy_j)):
            return False
        if drawn() or not was_drawn:
            return True
        power.mean, power.covariance, power.samples, power.residual_ms = before
        power.noise_variance = noise
        return False

    def _count_skipped(self, parts: list[str]) -> None:
        """Count one window of which ``parts`` were skipped for a non-finite field."""
        self.skipped_nonfinite_windows += 1
        for part in parts:
            self.skipped_nonfinite[part] += 1

    def _finish_warmup(self) -> None:
        """Re-centre the time prior on the warm-up estimate (every knot at the estimate,
        the compute-bound extrapolation) with a spread relative to it."""
        k = self.knots_mhz.size
        blocks = self.time.mean.reshape(len(TIME_BLOCKS), k)
        top = np.maximum(blocks[:, -1], 0.0)
        mean, covariance = self._time_prior(top)
        self.time.reset_prior(mean, covariance)
        self._recentre_power()
        self.warmed_up = True

    def _recentre_power(self) -> None:
        """Scale each phase's physics power curve to the value learned at the top clock,
        so clocks not visited yet are priced by the physics shape, not the generic prior."""
        k = self.knots_mhz.size
        mean = self.power.mean.copy()
        covariance = np.zeros_like(self.power.covariance)
        for index, block in enumerate(POWER_BLOCKS):
            shape = self._physics_power(block)
            top = float(mean[(index + 1) * k - 1])
            if not top > 0.0:
                top = float(shape[-1])
            curve = shape * (top / shape[-1])
            mean[index * k : (index + 1) * k] = curve
            covariance[index * k : (index + 1) * k, index * k : (index + 1) * k] = (
                smooth_covariance(self.knots_mhz, self.relative_spread * top, 0.5)
            )
        self.power.reset_prior(mean, covariance)

    # ---------------------------------------------------------- predictions
    def realized_mhz(self, requested_mhz: float) -> float:
        """The clock a request for ``requested_mhz`` is expected to realise."""
        return float(requested_mhz * self.realized_ratio[self._clock_index(requested_mhz)])

    def _time_vector(self, clock_mhz: float, work: FloatArray) -> FloatArray:
        weights = hat_weights(clock_mhz, self.knots_mhz) * self._g(clock_mhz)
        return np.asarray(np.kron(work, weights), dtype=np.float64)

    def prefill_s_per_token(self, clock_mhz: float) -> tuple[float, float]:
        """``(mean, std)`` prefill seconds per prompt token at ``clock_mhz`` (realised)."""
        mean, std = self.time.predict(self._time_vector(clock_mhz, np.array([1.0, 0, 0, 0])))
        return mean / PROMPT_UNIT, std / PROMPT_UNIT

    def decode_iteration_s(
        self, clock_mhz: float, batch: float, context_tokens: float
    ) -> tuple[float, float]:
        """``(mean, std)`` of one decode iteration's seconds for ``batch`` running requests
        of ``context_tokens`` mean context, at ``clock_mhz`` (realised)."""
        work = np.array(
            [
                0.0,
                1.0 / ITERATION_UNIT,
                batch / DECODE_UNIT,
                batch / DECODE_UNIT * context_tokens / CONTEXT_UNIT,
            ]
        )
        return self.time.predict(self._time_vector(clock_mhz, work))

    @staticmethod
    def _decode_weights(batch: float, context_tokens: float) -> FloatArray:
        """The time blocks' work in one decode iteration of ``batch`` requests of
        ``context_tokens`` context (the prefill block does none)."""
        return np.array(
            [
                0.0,
                1.0 / ITERATION_UNIT,
                batch / DECODE_UNIT,
                batch / DECODE_UNIT * context_tokens / CONTEXT_UNIT,
            ]
        )

    def decode_iteration_mean(
        self, clocks_mhz: FloatArray, batch: float, context_tokens: float
    ) -> FloatArray:
        """Mean seconds of one decode iteration at each of ``clocks_mhz`` (realised): the
        ``decode_iteration_s`` mean of :meth:`table`, without the rest."""
        return self.decode_iteration_means(clocks_mhz, ((batch, context_tokens),))[:, 0]

    def decode_iteration_means(
        self, clocks_mhz: FloatArray, points: Sequence[tuple[float, float]]
    ) -> FloatArray:
        """:meth:`decode_iteration_mean` at several ``(batch, context_tokens)`` points:
        one column per point, one row per clock."""
        clocks = np.ascontiguousarray(clocks_mhz, dtype=float)
        return np.column_stack(
            [self._predict(clocks, batch, context)[DECODE_MEAN] for batch, context in points]
        )

    def predict_rows(self, clocks: FloatArray, batch: float, context_tokens: float) -> FloatArray:
        """:func:`predict_table` of the current estimate at ``clocks`` (its rows: the
        prefill and decode latencies' means and standard deviations, the power blocks)."""
        return self._predict(np.ascontiguousarray(clocks, dtype=float), batch, context_tokens)

    def _predict(self, clocks: FloatArray, batch: float, context_tokens: float) -> FloatArray:
        """:func:`predict_table` of the current estimate at ``clocks``."""
        return predict_table(
            clocks,
            self.knots_mhz,
            self.maximum_mhz,
            self.time.mean,
            self.time.covariance,
            self.power.mean,
            PROMPT_UNIT,
            self._decode_weights(batch, context_tokens),
        )

    def learned_tables(
        self, realized_mhz: FloatArray, z: float, batch: float, context_tokens: float
    ) -> tuple[FloatArray, FloatArray, bool]:
        """The learned profile's arrays over the supported clocks, read at their
        ``realized_mhz``, latencies at the mean plus ``z`` standard deviations, decode at
        ``batch`` requests of ``context_tokens``; the top clock's decode iteration parts
        (weights; with the batch; with the context); and whether the arrays are finite
        and positive (:func:`prediction.learned_tables`)."""
        points = ((0.0, 0.0), (batch, 0.0), (batch, context_tokens))
        return learned_tables(
            self.clocks_mhz,
            np.ascontiguousarray(realized_mhz, dtype=float),
            self.knots_mhz,
            self.maximum_mhz,
            self.time.mean,
            self.time.covariance,
            self.power.mean,
            PROMPT_UNIT,
            z,
            batch,
            self._decode_weights(batch, context_tokens),
            np.array([self._decode_weights(b, c) for b, c in points]),
        )

    def table(
        self, clocks_mhz: FloatArray, batch: float, context_tokens: float
    ) -> dict[str, tuple[FloatArray, FloatArray]]:
        """Vectorised predictions at many (realised) clocks: ``{name: (mean, std)}`` for
        ``prefill_s_per_token``, ``decode_iteration_s`` (at ``batch`` and
        ``context_tokens``) and the ``idle``/``prefill``/``decode`` powers (std omitted:
        zeros), computed in one compiled pass (:mod:`controllers.online.prediction`)."""
        clocks = np.ascontiguousarray(clocks_mhz, dtype=float)
        rows = self._predict(clocks, batch, context_tokens)
        zeros = np.zeros(clocks.size)
        out: dict[str, tuple[FloatArray, FloatArray]] = {
            "prefill_s_per_token": (rows[PREFILL_MEAN], rows[PREFILL_STD]),
            "decode_iteration_s": (rows[DECODE_MEAN], rows[DECODE_STD]),
        }
        for index, phase in enumerate(POWER_BLOCKS):
            out[phase] = (rows[POWER_ROWS + index], zeros)
        return out

    def phase_power_w(self, clock_mhz: float, phase: str) -> tuple[float, float]:
        """``(mean, std)`` board power of ``phase`` (idle, prefill, decode) at the clock."""
        work = np.zeros(len(POWER_BLOCKS))
        work[POWER_BLOCKS.index(phase)] = 1.0
        x = np.asarray(np.kron(work, hat_weights(clock_mhz, self.knots_mhz)), dtype=np.float64)
        return self.power.predict(x)

    def thermal_parameters(self) -> tuple[float, float, float] | None:
        """``(ambient C, resistance C/W, time constant in windows)`` from the RC fit, or
        None while the fit is not physical."""
        a, b, c = (float(v) for v in self.thermal.mean)
        if self.thermal.samples < 30 or not 0.0 < a < 0.999 or c <= 0.0:
            return None
        resistance = c / (1.0 - a)
        ambient = b / (1.0 - a)
        if not (1e-4 < resistance < 1.0 and -20.0 < ambient < 80.0):
            return None
        return ambient, resistance, -1.0 / math.log(a)

    def confidence(self) -> float:
        """A 0..1 summary of how sure the latency model is: 1 minus the mean relative
        standard deviation of the prefill and decode predictions over the clocks."""
        if not self.warmed_up:
            return 0.0
        relative = []
        for clock in self.knots_mhz:
            for mean, std in (
                self.prefill_s_per_token(float(clock)),
                self.decode_iteration_s(float(clock), 64.0, 1024.0),
            ):
                relative.append(std / max(abs(mean), 1e-12))
        return float(max(0.0, 1.0 - min(1.0, float(np.mean(relative)))))

    def residual_rms(self) -> dict[str, float]:
        """Root-mean-square innovation of each fit: busy seconds, joules, degrees."""
        return {
            "busy_s": math.sqrt(self.time.residual_ms),
            "energy_j": math.sqrt(self.power.residual_ms),
            "temperature_c": math.sqrt(self.thermal.residual_ms),
        }

    @property
    def samples(self) -> int:
        """Windows folded into the latency model."""
        return self.time.samples

    def lowest_explored_mhz(self, minimum_visits: int = 5) -> float:
        """The lowest clock with at least ``minimum_visits`` busy windows (the top clock
        when none)."""
        explored = self.visits >= minimum_visits
        first = int(explored.argmax())  # the first True, or 0 where none is
        return float(self.clocks_mhz[first]) if explored[first] else self.maximum_mhz

    # ------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (see :data:`MODEL_VERSION`)."""
        return {
            "version": MODEL_VERSION,
            "clocks_mhz": self.clocks_mhz.tolist(),
            "knots_mhz": self.knots_mhz.tolist(),
            "power_limit_w": self.power_limit_w,
            "warmed_up": self.warmed_up,
            "warmup_count": self._warmup_count,
            "realized_ratio": self.realized_ratio.tolist(),
            "visits": self.visits.tolist(),
            "time": self.time.state_dict(),
            "power": self.power.state_dict(),
            "thermal": self.thermal.state_dict(),
        }

    def load_state(self, state: dict[str, Any], role: str = "colocated") -> None:
        """Restore :meth:`state_dict`'s output, learned on a domain of ``role``
        (:meth:`check_latencies`).

        Raises:
            ValueError: another version, other clocks, or a malformed field.
        """
        if state.get("version") != MODEL_VERSION:
            raise ValueError(
                f"model version {state.get('version')!r}, this gpugov reads {MODEL_VERSION}"
            )
        clocks = np.asarray(state["clocks_mhz"], dtype=float)
        if clocks.shape != self.clocks_mhz.shape or not np.allclose(clocks, self.clocks_mhz):
            raise ValueError("stored model was learned on other supported clocks")
        ratio = np.asarray(state["realized_ratio"], dtype=float)
        counts = np.asarray(state["visits"], dtype=float)
        if ratio.shape != clocks.shape or counts.shape != clocks.shape:
            raise ValueError("stored per-clock arrays have the wrong length")
        if not bool(np.all((counts >= 0.0) & (counts <= MAX_STORED_COUNT))) or bool(
            np.any(counts != np.floor(counts))
        ):
            raise ValueError("stored visits must be counts")
        if not isinstance(state["warmed_up"], bool):
            raise ValueError(f"stored warmed_up must be true or false, got {state['warmed_up']!r}")
        visits = counts.astype(np.int64)
        warmup_count = float(state["warmup_count"])
        if not (math.isfinite(warmup_count) and 0.0 <= warmup_count <= MAX_STORED_COUNT):
            raise ValueError(f"stored warmup_count must be a count, got {warmup_count!r}")
        if not np.all((ratio > 0.0) & (ratio <= 1.0)):
            raise ValueError("stored realised-clock ratios must lie in (0, 1]")
        prior = (self.time.mean.copy(), self.time.prior_covariance.copy())
        for name, regression in (
            ("time", self.time),
            ("power", self.power),
            ("thermal", self.thermal),
        ):
            try:
                regression.load_state(state[name])
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None  # which of the three
        self.realized_ratio = ratio
        self.visits = visits
        self.warmed_up = bool(state["warmed_up"])
        self._warmup_count = int(warmup_count)
        if self.time.samples == 0:
            # Saved before any busy window (a node stopped before its first traffic):
            # nothing of latency was learned, and without a hint the prior predicts no
            # latency at all. This model's own prior stands in for the stored one, and
            # what was measured (power, thermal) is kept.
            self.time.reset_prior(*prior)
            return
        self.check_latencies(role)

    def check_latencies(self, role: str = "colocated") -> None:
        """Refuse a model whose mean decode latency is not positive at the top clock, or
        whose mean prefill latency there is below zero by more than three of its own
        standard deviations (a stored ``time.mean`` negated or zeroed drove the clock
        down). Only at the top clock: the warm-up's evidence is there, while a few windows
        elsewhere can leave a mean below zero at a clock barely visited, which the learned
        profile holds to the physics (``learned_tables``). And the prefill mean within its
        noise of zero: a run whose prompts were few, or prefilled beside decoding, can
        learn a prefill part of -1e-7 s a token with a spread far wider, which the running
        controller decides with, so its restart must too (a valid model must never be
        refused).

        The decode iteration is checked where the learned profile reads it, at the
        reference batch (:data:`REFERENCE_BATCH` requests of
        :data:`REFERENCE_CONTEXT_TOKENS` tokens), not at one request
        with no context: a decode pool whose batch and context grow together cannot tell
        weight reads from context reads, and can learn a weights-only part below zero,
        which the running controller clamps at zero (every save of it was refused, and the
        running model went back to the last good file).

        A prefill pool's model (``role`` ``"prefill"``) learns no decode latency, as the
        pool decodes nothing: its prefill latency must be positive there instead (every
        save of such a model was refused, and the model went back to the last good file).

        Raises:
            ValueError: naming the latency.
        """
        top = self.clocks_mhz[-1:] * self.realized_ratio[-1:]
        realized = np.ascontiguousarray(top, dtype=float)
        rows = self._predict(realized, REFERENCE_BATCH, REFERENCE_CONTEXT_TOKENS)
        checks = (
            ((PREFILL_MEAN, "prefill", 0.0),)
            if role == "prefill"
            else (
                (PREFILL_MEAN, "prefill", -3.0 * float(rows[PREFILL_STD][0])),
                (DECODE_MEAN, "decode iteration", 0.0),
            )
        )
        for row, what, lowest in checks:
            mean = float(rows[row][0])
            if not (mean >= lowest if lowest < 0.0 else mean > lowest):
                raise ValueError(
                    f"stored model predicts a {what} latency of {mean:.3g} s at its top "
                    f"clock {float(self.clocks_mhz[-1]):g} MHz, which no GPU gives"
                )

    def nbytes(self) -> int:
        """Bytes held by the model's arrays (constant over the run)."""
        total = self.clocks_mhz.nbytes + self.knots_mhz.nbytes
        total += self.realized_ratio.nbytes + self.visits.nbytes
        for regression in (self.time, self.power, self.thermal):
            total += regression.mean.nbytes + regression.covariance.nbytes
            total += regression.prior_covariance.nbytes
        return total
