"""Energy attribution on a node: the measured GPU energy of each window split into
prefill, decode and idle, per engine model, and the rates people compare.

Measured (never estimated): each window's GPU energy (the NVML energy counter's delta,
summed over the domain's GPUs), its prompt and output tokens and finished requests
(the engine's own counters), its engine steps where the engine counts them (vLLM's
tokens-per-step histogram, TGI's forward passes), its length.

Estimated: how that energy divides between the phases. Each window gets three
non-negative components, then all three are scaled so that they add up to the measured
energy exactly (the split is estimated, the total never is):

* ``idle = P_idle x (window - busy)``, where busy = GPU utilisation x window, or the
  engine's timed prefill and decode forward seconds where it times them (TGI);
* ``prefill = P_prefill x prefill_s`` with ``prefill_s = min(busy, s_per_prompt_token x
  prompt tokens)``, or the timed prefill seconds;
* ``decode = P_decode x (busy - prefill_s)``.

The powers and the seconds per prompt token come from the estimator's own fit
(:class:`daemon.phase_fit.PhaseFit`, source ``fit``): windowed non-negative least squares
(``scipy.optimize.nnls``) of busy seconds on prompt tokens, iterations (the engine's step
count, else estimated from tokens and batch), the KV they read and the decode tokens, and
of window energy on idle, prefill and decode seconds, each phase at its own clock- (and,
for decode, batch-) dependent power. Until the fit has data a prior splits busy time by
token counts (source ``prior``). ``mpc-online``'s learned model can split instead
(:func:`daemon.phase_fit.learned_phase_model`, ``use_learned=True``, source ``learned``);
it is off by default, having measured worse (``docs/energy.md``).

Rates over the trailing :data:`TRAILING_S` seconds:

* J per output token, as ML.ENERGY reports it: (prefill + decode) / output tokens
  (idle, a node cost, excluded);
* J per prompt token: prefill / prompt tokens; decode J per output token: decode /
  output tokens;
* J per request: (prefill + decode) / finished requests.

Per-request rule: a request of ``p`` prompt and ``o`` output tokens is estimated at
``p x (J per prompt token) + o x (decode J per output token)``, the rates of its window.
With the engine's per-request token histograms (vLLM ``vllm:request_prompt_tokens`` /
``vllm:request_generation_tokens``, SGLang ``sglang:prompt_tokens_histogram`` /
``sglang:generation_tokens_histogram``) the finished requests of each window go into a
histogram of that estimate (:class:`RequestEnergyHistogram`).

Bad input never yields a negative or infinite energy: a window whose energy is missing
(NVML ``NotSupported``, a failed read), not finite, went backwards (a counter reset or
wrap) or is above 20 times the power limit, or whose token or request counters went
backwards or changed model or data-parallel engine count (an engine restart), is skipped
and counted by reason; the next window starts from the reading that ended it. Pure
computation: no I/O, no clocks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from gpugov.daemon.attainment import Buckets, bucket_delta
from gpugov.daemon.backend import IMPLAUSIBLE_POWER_FACTOR
from gpugov.daemon.phase_fit import (
    PhaseCoefficients,
    PhaseFit,
    PhaseModel,
    learned_coefficients,
    split_components,
)

if TYPE_CHECKING:
    from gpugov.daemon.engines import EngineSample
    from gpugov.daemon.observer import Observed

PHASES = ("prefill", "decode", "idle")
TRAILING_S = 60.0
"""Seconds of windows behind the rate gauges (``gpugov status`` shows the last minute)."""
ENERGY_BUCKETS_J = (
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    50.0,
    100.0,
    200.0,
    500.0,
    1000.0,
    2000.0,
    5000.0,
    10000.0,
    20000.0,
    50000.0,
)
"""Upper bounds of the per-request energy histogram, joules."""
SKIP_REASONS = (
    "energy_unavailable",
    "energy_not_finite",
    "energy_counter_reset",
    "energy_implausible",
    "engine_restart",
)
"""Why a window was skipped (the ``reason`` label of the skipped-windows counter)."""
UNKNOWN_MODEL = "unknown"
"""The ``model`` label when the engine does not name its model."""
Source = Literal["learned", "fit", "prior"]


@dataclass(frozen=True, slots=True)
class EnergyReading:
    """What one tick offers the estimator: cumulative counters at ``time_s``.

    ``energy_j`` is the domain's NVML energy counter (None: not readable); the token and
    request counters are the engine's (None: it does not publish them);
    ``engine_fresh`` is False when the engine was not scraped successfully this tick
    (the window then waits for the next scrape, so energy and tokens stay aligned).
    """

    time_s: float
    energy_j: float | None
    prompt_tokens: float | None
    output_tokens: float | None
    finished_requests: float | None = None
    utilization: float | None = None
    clock_mhz: float | None = None
    running: float = 0.0
    kv_tokens: float | None = None
    admitted_requests: float | None = None
    """Requests that left the queue so far (arrived - waiting): each one's first token
    comes from its prefill, not from a decode iteration."""
    model: str = UNKNOWN_MODEL
    engine: str = ""
    """The kind of engine whose counters these are (``vllm``, ``sglang``, ``tgi``): a
    window across two (another engine on the URL) is skipped as a restart."""
    engine_fresh: bool = True
    engines: int = 1
    """The data-parallel engines the counters are summed over: a window across another
    count (a deployment scaled up or down) is skipped as a restart."""
    power_limit_w: float | None = None
    prompt_buckets: Buckets | None = None
    output_buckets: Buckets | None = None
    iterations: float | None = None
    """Engine steps so far (:attr:`EngineSample.iterations_total`; None: not published,
    then a window's decode iterations are estimated from its tokens and batch)."""
    iteration_tokens: float | None = None
    """Tokens those steps ran (:attr:`EngineSample.iteration_tokens_total`): with the
    decode tokens, the prompt tokens prefilled in a window, as they were computed."""
    prefill_forward_s: float | None = None
    """Seconds of prefill forward passes so far, where the engine times its phases (TGI);
    with :attr:`decode_forward_s` they give a window's busy time and its prefill share."""
    decode_forward_s: float | None = None
    """Seconds of decode forward passes so far (TGI)."""


def _prompt_tokens(engine: EngineSample, role: str) -> float | None:
    """The engine's prompt tokens, less (in a disaggregated pool) those whose KV cache
    another instance computed (vLLM's ``external_kv_transfer`` source), as
    ``gpugov_prompt_tokens_total`` leaves them out: a decode pool prefilled none of them."""
    total = engine.prompt_tokens_total
    external = engine.prompt_tokens_external_total
    if total is None or role == "colocated" or external is None:
        return total
    return max(0.0, total - external)


def reading_from(observed: Observed) -> EnergyReading:
    """The estimator's reading of one tick of :class:`daemon.observer.DomainObserver`."""
    o = observed.observation
    engine = observed.engine_sample
    return EnergyReading(
        time_s=o.time_s,
        energy_j=o.energy_j,
        prompt_tokens=None if engine is None else _prompt_tokens(engine, o.role),
        output_tokens=None if engine is None else engine.generation_tokens_total,
        finished_requests=None if engine is None else engine.finished_requests_total,
        utilization=o.gpu_utilization,
        clock_mhz=o.realized_clock_mhz,
        running=float(o.decode_active),
        kv_tokens=o.kv_tokens,
        admitted_requests=float(o.arrived_requests - o.waiting_requests),
        model=(engine.model_name if engine is not None else None) or UNKNOWN_MODEL,
        engine="" if engine is None else engine.engine,
        engine_fresh=engine is not None and observed.engine_error is None,
        engines=1 if engine is None else engine.engines,
        power_limit_w=o.power_limit_w,
        prompt_buckets=None if engine is None else engine.request_prompt_tokens_buckets,
        output_buckets=None if engine is None else engine.request_generation_tokens_buckets,
        iterations=None if engine is None else engine.iterations_total,
        iteration_tokens=None if engine is None else engine.iteration_tokens_total,
        prefill_forward_s=None if engine is None else engine.prefill_forward_s_total,
        decode_forward_s=None if engine is None else engine.decode_forward_s_total,
    )


@dataclass(frozen=True, slots=True)
class WindowEnergy:
    """One window's measured energy split into phases (joules), with its work."""

    end_s: float
    duration_s: float
    prefill_j: float
    decode_j: float
    idle_j: float
    prompt_tokens: float
    output_tokens: float
    finished_requests: float
    source: Source

    @property
    def total_j(self) -> float:
        """The measured energy of the window."""
        return self.prefill_j + self.decode_j + self.idle_j


# -------------------------------------------------------------- request histogram
@dataclass
class RequestEnergyHistogram:
    """Cumulative histogram of the estimated energy of finished requests (joules).

    The engine publishes the distributions of prompt and output lengths of the requests
    that finished, not their pairing: each window's requests are placed as if the two
    were independent (every prompt bucket paired with every output bucket, each bucket
    at its midpoint, the open last bucket at its lower bound), priced by the window's
    rates. The sum is that of the placed values."""

    bounds_j: tuple[float, ...] = ENERGY_BUCKETS_J
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per bucket (not cumulative), the last one above every bound."""
    sum_j: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        if self.counts.size != len(self.bounds_j) + 1:
            self.counts = np.zeros(len(self.bounds_j) + 1)

    def add(self, prompt: Buckets, output: Buckets, j_prompt: float, j_output: float) -> None:
        """Add one window's finished requests (bucket deltas, cumulative per ``le``)."""
        xs, ms = _masses(prompt)
        ys, ns = _masses(output)
        total = min(ms.sum(), ns.sum())
        if not total > 0:
            return
        pair = np.outer(ms / ms.sum(), ns / ns.sum()) * total
        energy = j_prompt * xs[:, None] + j_output * ys[None, :]
        if not np.all(np.isfinite(energy)):
            return
        index = np.searchsorted(np.asarray(self.bounds_j), energy.ravel(), side="left")
        np.add.at(self.counts, index, pair.ravel())
        self.sum_j += float((pair * energy).sum())
        self.count += float(total)

    def buckets(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``."""
        cumulative = np.cumsum(self.counts)
        rows = [(repr(float(b)), float(c)) for b, c in zip(self.bounds_j, cumulative, strict=False)]
        return [*rows, ("+Inf", float(cumulative[-1]))]


def _masses(buckets: Buckets) -> tuple[np.ndarray, np.ndarray]:
    """Representative values and counts of a cumulative histogram's buckets."""
    values, counts = [], []
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        count = max(0.0, cumulative - below)
        values.append(lower if math.isinf(le) else 0.5 * (lower + le))
        counts.append(count)
        below = max(below, cumulative)
        if not math.isinf(le):
            lower = le
    return np.asarray(values, dtype=float), np.asarray(counts, dtype=float)


# ----------------------------------------------------------------- the estimator
@dataclass
class ModelEnergy:
    """Cumulative attribution of one engine model, plus its trailing windows."""

    prefill_j: float = 0.0
    decode_j: float = 0.0
    idle_j: float = 0.0
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    finished_requests: float = 0.0
    windows: dict[str, int] = field(default_factory=dict)
    """Windows attributed, by source (learned, fit, prior)."""
    trailing: deque[WindowEnergy] = field(default_factory=deque)
    histogram: RequestEnergyHistogram | None = None

    def add(self, window: WindowEnergy, trailing_s: float) -> None:
        """Count one window in the totals and the trailing set."""
        self.prefill_j += window.prefill_j
        self.decode_j += window.decode_j
        self.idle_j += window.idle_j
        self.prompt_tokens += window.prompt_tokens
        self.output_tokens += window.output_tokens
        self.finished_requests += window.finished_requests
        self.windows[window.source] = self.windows.get(window.source, 0) + 1
        self.trailing.append(window)
        while self.trailing and self.trailing[0].end_s <= window.end_s - trailing_s:
            self.trailing.popleft()


@dataclass(frozen=True, slots=True)
class Rates:
    """Trailing-window rates (None where the denominator is zero)."""

    joules_per_output_token: float | None
    joules_per_prompt_token: float | None
    decode_joules_per_output_token: float | None
    joules_per_request: float | None
    seconds: float


def trailing_rates(windows: Sequence[WindowEnergy]) -> Rates:
    """Rates over ``windows`` (the module notes say which)."""
    prefill = sum(w.prefill_j for w in windows)
    decode = sum(w.decode_j for w in windows)
    prompt = sum(w.prompt_tokens for w in windows)
    output = sum(w.output_tokens for w in windows)
    finished = sum(w.finished_requests for w in windows)

    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    return Rates(
        joules_per_output_token=ratio(prefill + decode, output),
        joules_per_prompt_token=ratio(prefill, prompt),
        decode_joules_per_output_token=ratio(decode, output),
        joules_per_request=ratio(prefill + decode, finished),
        seconds=sum(w.duration_s for w in windows),
    )


@dataclass(frozen=True, slots=True)
class ModelEnergyView:
    """What the exporter shows of one model (immutable)."""

    model: str
    prefill_j: float
    decode_j: float
    idle_j: float
    prompt_tokens: float
    output_tokens: float
    finished_requests: float
    windows: tuple[tuple[str, int], ...]
    rates: Rates
    histogram_buckets: tuple[tuple[str, float], ...] | None
    histogram_sum_j: float


@dataclass(frozen=True, slots=True)
class EnergySnapshot:
    """The estimator's state after a tick: one view per model and the skipped windows."""

    models: tuple[ModelEnergyView, ...]
    skipped: tuple[tuple[str, int], ...]


class EnergyEstimator:
    """Per control window and per engine model: measured energy split into phases.

    Args:
        trailing_s: seconds behind the rate gauges.
        min_window_s: shorter windows are merged into the next one (NVML updates its
            energy counter about every 100 ms: a shorter window's energy is mostly noise).
        fit: the own phase fit (a fresh :class:`PhaseFit` by default).
        use_learned: split with the controller's learned model when one is given (off
            by default: measured worse than the own fit, see ``docs/energy.md``).
    """

    def __init__(
        self,
        *,
        trailing_s: float = TRAILING_S,
        min_window_s: float = 1.0,
        fit: PhaseFit | None = None,
        use_learned: bool = False,
    ) -> None:
        if not trailing_s > 0 or not min_window_s >= 0:
            raise ValueError("trailing_s must be positive and min_window_s non-negative")
        self.trailing_s = float(trailing_s)
        self.min_window_s = float(min_window_s)
        self.fit = fit or PhaseFit()
        self.use_learned = use_learned
        self.models: dict[str, ModelEnergy] = {}
        self.skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)
        self._anchor: EnergyReading | None = None
        self._last_skip_s = -math.inf
        self.last_window: WindowEnergy | None = None

    def _skip(self, reason: str, reading: EnergyReading) -> None:
        self.skipped[reason] += 1
        self._last_skip_s = reading.time_s
        usable = reading.energy_j is not None and math.isfinite(reading.energy_j)
        self._anchor = reading if usable and reading.engine_fresh else None

    def update(
        self, reading: EnergyReading, learned: PhaseModel | None = None
    ) -> WindowEnergy | None:
        """Close a window at ``reading`` when one is due; return it (None: none closed,
        or it was skipped and counted in :attr:`skipped`)."""
        anchor = self._anchor
        energy = reading.energy_j
        if anchor is None:
            if energy is None or not math.isfinite(energy):
                if reading.time_s - self._last_skip_s >= max(self.min_window_s, 1e-9):
                    reason = "energy_unavailable" if energy is None else "energy_not_finite"
                    self._skip(reason, reading)
                return None
            if reading.engine_fresh:
                self._anchor = reading
            return None
        if not reading.engine_fresh:
            return None  # the window waits for the engine's next scrape
        duration = reading.time_s - anchor.time_s
        if not duration >= max(self.min_window_s, 1e-9):
            return None
        if energy is None:
            self._skip("energy_unavailable", reading)
            return None
        if anchor.energy_j is None or not (math.isfinite(energy) and math.isfinite(duration)):
            self._skip("energy_not_finite", reading)
            return None
        delta = energy - anchor.energy_j
        if delta < 0:
            self._skip("energy_counter_reset", reading)
            return None
        limit = reading.power_limit_w
        if (
            limit is not None
            and math.isfinite(limit)
            and limit > 0
            and delta > IMPLAUSIBLE_POWER_FACTOR * limit * duration
        ):
            self._skip("energy_implausible", reading)
            return None
        work = _deltas(anchor, reading)
        if (
            work is None
            or reading.model != anchor.model
            or reading.engine != anchor.engine
            or reading.engines != anchor.engines
        ):
            self._skip("engine_restart", reading)
            return None
        prompt, output, finished = work
        window = self._split(anchor, reading, duration, delta, prompt, output, finished, learned)
        self._anchor = reading
        state = self.models.setdefault(reading.model, ModelEnergy())
        state.add(window, self.trailing_s)
        self._histogram(state, anchor, reading, window)
        self.last_window = window
        return window

    def _split(
        self,
        anchor: EnergyReading,
        reading: EnergyReading,
        duration: float,
        energy: float,
        prompt: float,
        output: float,
        finished: float,
        learned: PhaseModel | None,
    ) -> WindowEnergy:
        running = max(0.5 * (reading.running + anchor.running), 1.0)
        # Decode tokens: output tokens less the first tokens (from prefills).
        decode_tokens = output
        if reading.admitted_requests is not None and anchor.admitted_requests is not None:
            decode_tokens = max(
                0.0, output - max(0.0, reading.admitted_requests - anchor.admitted_requests)
            )
        # The engine's own step count (None: not published, or it went backwards).
        iterations = _delta(anchor.iterations, reading.iterations)
        counted = iterations is not None
        # The prompt tokens prefilled in the window: the engine's prompt counter counts a
        # prompt once its prefill is done (vLLM), which can be windows after its chunks
        # ran; the tokens its steps ran, less the decode tokens, count them as they ran.
        computed = _delta(anchor.iteration_tokens, reading.iteration_tokens)
        prefilled = prompt if computed is None else max(0.0, computed - decode_tokens)
        if iterations is None:
            # Estimated: the decode tokens over the mean batch.
            iterations = decode_tokens / running
            # A window whose batch moved has a poor estimate (the fit trusts it less).
            change = abs(reading.running - anchor.running)
        else:
            change = 0.0
            if iterations > 0 and decode_tokens > 0:
                # The mean batch over the window's steps, not the batch at its ends.
                running = max(decode_tokens / iterations, 1.0)
        kv = reading.kv_tokens if reading.kv_tokens is not None else 0.0
        clock = reading.clock_mhz
        slowdown = self.fit.slowdown(clock)
        utilization = reading.utilization
        timed = _timed_phases(anchor, reading)
        if timed is not None:
            # The engine timed its forward passes: busy time and its prefill share are
            # measured (a forward pass keeps the GPU busy), not read off the utilisation.
            busy = min(duration, timed[0] + timed[1])
            timed_prefill: float | None = min(busy, timed[0])
        elif utilization is not None and math.isfinite(utilization):
            busy = min(1.0, max(0.0, utilization)) * duration
            timed_prefill = None
        else:
            busy = duration if (prompt > 0 or output > 0 or reading.running > 0) else 0.0
            timed_prefill = None
        idle_s = duration - busy
        coefficients: PhaseCoefficients | None = None
        source: Source = "prior"
        if self.use_learned and learned is not None and clock is not None and math.isfinite(clock):
            coefficients = learned_coefficients(learned, clock)
            source = "learned" if coefficients is not None else "prior"
        if coefficients is None:
            coefficients = self.fit.coefficients(slowdown, running)
            source = "fit" if coefficients is not None else "prior"
        self.fit.add(
            idle_s,
            busy,
            prefilled,
            iterations,
            kv,
            running,
            slowdown,
            energy,
            change,
            steps_counted=counted,
            prefill_s=timed_prefill,
        )
        parts = split_components(idle_s, busy, prefilled, output, coefficients, timed_prefill)
        total = sum(parts)
        if total > 0 and math.isfinite(total):
            scale = energy / total
            prefill, decode, idle = (part * scale for part in parts)
        else:
            prefill, decode, idle = 0.0, 0.0, energy
        return WindowEnergy(
            end_s=reading.time_s,
            duration_s=duration,
            prefill_j=prefill,
            decode_j=decode,
            idle_j=idle,
            prompt_tokens=prompt,
            output_tokens=output,
            finished_requests=finished,
            source=source,
        )

    def _histogram(
        self,
        state: ModelEnergy,
        before: EnergyReading,
        now: EnergyReading,
        window: WindowEnergy,
    ) -> None:
        prompt = bucket_delta(now.prompt_buckets, before.prompt_buckets)
        output = bucket_delta(now.output_buckets, before.output_buckets)
        if prompt is None or output is None:
            return
        rates = trailing_rates(state.trailing)
        j_prompt = (
            window.prefill_j / window.prompt_tokens
            if window.prompt_tokens > 0
            else rates.joules_per_prompt_token
        )
        if j_prompt is None:
            # No prompt prefilled here in the trailing minute (a decode pool: their KV
            # caches came from the prefill pool): a prompt costs this domain nothing.
            j_prompt = 0.0
        j_output = (
            window.decode_j / window.output_tokens
            if window.output_tokens > 0
            else rates.decode_joules_per_output_token
        )
        if j_prompt is None or j_output is None:
            return
        if state.histogram is None:
            state.histogram = RequestEnergyHistogram()
        state.histogram.add(prompt, output, j_prompt, j_output)

    def rates(self, model: str) -> Rates:
        """The trailing rates of ``model`` (all None before any window)."""
        state = self.models.get(model)
        return trailing_rates(state.trailing if state is not None else ())

    def snapshot(self) -> EnergySnapshot:
        """An immutable view for the exporter."""
        views = []
        for model, state in sorted(self.models.items()):
            histogram = state.histogram
            views.append(
                ModelEnergyView(
                    model=model,
                    prefill_j=state.prefill_j,
                    decode_j=state.decode_j,
                    idle_j=state.idle_j,
                    prompt_tokens=state.prompt_tokens,
                    output_tokens=state.output_tokens,
                    finished_requests=state.finished_requests,
                    windows=tuple(sorted(state.windows.items())),
                    rates=trailing_rates(state.trailing),
                    histogram_buckets=None if histogram is None else tuple(histogram.buckets()),
                    histogram_sum_j=0.0 if histogram is None else histogram.sum_j,
                )
            )
        return EnergySnapshot(models=tuple(views), skipped=tuple(self.skipped.items()))


def _timed_phases(before: EnergyReading, now: EnergyReading) -> tuple[float, float] | None:
    """``(prefill, decode)`` forward seconds of the window, where the engine times its
    phases at both ends; None otherwise or when a total went backwards."""
    prefill = _delta(before.prefill_forward_s, now.prefill_forward_s)
    decode = _delta(before.decode_forward_s, now.decode_forward_s)
    return None if prefill is None or decode is None else (prefill, decode)


def _delta(before: float | None, now: float | None) -> float | None:
    """``now - before`` of a cumulative counter; None when either is missing or it went
    backwards (a restart) or is not finite."""
    if before is None or now is None:
        return None
    delta = now - before
    return delta if math.isfinite(delta) and delta >= 0 else None


def _deltas(before: EnergyReading, now: EnergyReading) -> tuple[float, float, float] | None:
    """Prompt tokens, output tokens and finished requests of the window; None when a
    counter went backwards or is not finite (an engine restart). A counter the engine
    does not publish counts 0."""
    out = []
    for a, b in (
        (before.prompt_tokens, now.prompt_tokens),
        (before.output_tokens, now.output_tokens),
        (before.finished_requests, now.finished_requests),
    ):
        if a is None or b is None:
            if (a is None) != (b is None):
                return None
            out.append(0.0)
            continue
        delta = b - a
        if not math.isfinite(delta) or delta < 0:
            return None
        out.append(delta)
    return out[0], out[1], out[2]
