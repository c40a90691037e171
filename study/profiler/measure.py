"""Measurements at one locked clock: idle power, prefill rate and power, decode iteration
time and power at several batch sizes and contexts, and the realised clock.

Every quantity comes from what a client and NVML can see: streamed token arrival times
at the client, and the GPUs' instant power, energy counter, SM clock and temperature,
polled by :class:`GpuSampler` in a background thread. Power over a window is the energy
counter's increase divided by the window (instant power's median when the window holds
too few samples); powers and energies are summed over the engine's GPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.errors import GpuError, GpuLost
from gpugov.study.openai_client import StreamTiming, request_body, stream_completion

MIN_WINDOW_TOKENS = 8  # tokens per request inside the all-decoding window
DECODE_ATTEMPTS = 4
"""Tries of one decode point, each with twice the previous output (a window too short)."""


class ProfileRunError(RuntimeError):
    """A measurement cannot go on (engine gone, model too small); the message says why."""


class Interrupted(RuntimeError):
    """SIGTERM/SIGINT arrived; the clocks were reset and the state file kept."""


class _ShortWindow(ProfileRunError):
    """The batch never decoded together long enough; retried with a longer output."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One poll of every GPU: summed power and energy, mean clock, max temperature, and
    the fastest GPU's clock (one GPU of a group whose lock was reset shows there)."""

    time_s: float
    power_w: float | None
    energy_j: float | None
    sm_clock_mhz: float | None
    temperature_c: float | None
    top_sm_clock_mhz: float | None = None


class GpuSampler:
    """Polls the GPUs every ``interval_s`` in a background thread (bounded history)."""

    def __init__(
        self,
        backends: Sequence[GpuBackend],
        *,
        interval_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        history: int = 200_000,
    ) -> None:
        self._backends = list(backends)
        self.interval_s = interval_s
        self._clock = clock
        self._history = history
        self.readings: list[GpuReading] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def read(self) -> GpuReading:
        """One reading of every GPU now.

        Raises:
            GpuLost: a GPU fell off the bus.
        """
        samples = [backend.sample() for backend in self._backends]
        now = self._clock()

        def total(values: list[float | None]) -> float | None:
            return None if any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]

        clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
        temps = [s.temperature_c for s in samples if s.temperature_c is not None]
        return GpuReading(
            time_s=now,
            power_w=total([s.power_w for s in samples]),
            energy_j=total([s.energy_j for s in samples]),
            sm_clock_mhz=float(np.mean(clocks)) if clocks else None,
            temperature_c=float(max(temps)) if temps else None,
            top_sm_clock_mhz=float(max(clocks)) if clocks else None,
        )

    def start(self) -> None:
        """Start polling."""
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                reading = self.read()
            except GpuLost as error:
                self.error = error
                return
            except GpuError:
                reading = None
            if reading is not None:
                with self._lock:
                    self.readings.append(reading)
                    if len(self.readings) > self._history:
                        del self.readings[: len(self.readings) // 2]
            self._stop.wait(self.interval_s)

    def window(self, start_s: float, end_s: float) -> list[GpuReading]:
        """Readings taken in ``[start_s, end_s]``."""
        with self._lock:
            return [r for r in self.readings if start_s <= r.time_s <= end_s]

    def check(self) -> None:
        """Re-raise a lost GPU seen by the polling thread."""
        if self.error is not None:
            raise self.error


ENERGY_WINDOW_S = 1.0


def window_power_w(readings: Sequence[GpuReading]) -> float | None:
    """Mean power over readings: the energy counter's slope (least squares over every
    reading, so one late reply does not tilt it) when the window spans at least
    ``ENERGY_WINDOW_S``; the median instant power over shorter windows."""
    energy = [(r.time_s, r.energy_j) for r in readings if r.energy_j is not None]
    if len(energy) >= 4 and energy[-1][0] - energy[0][0] >= ENERGY_WINDOW_S:
        times, joules = np.asarray(energy, dtype=float).T
        slope = float(np.polyfit(times - times[0], joules, 1)[0])
        if slope > 0:
            return slope
    powers = [r.power_w for r in readings if r.power_w is not None]
    return float(np.median(powers)) if powers else None


def robust_interval_s(times: Sequence[float]) -> float:
    """Seconds per token from arrival times: the Theil-Sen slope (median of pairwise
    slopes), so tokens delivered in a burst after a stall (a busy client or server CPU)
    do not tilt it the way the first-to-last difference would."""
    t = np.asarray(times, dtype=float)
    index = np.arange(t.size, dtype=float)
    upper = np.triu_indices(t.size, k=1)
    slopes = (t[:, None] - t[None, :])[upper[::-1]] / (index[:, None] - index[None, :])[upper[::-1]]
    return float(np.median(slopes))


def median_clock_mhz(readings: Sequence[GpuReading]) -> float | None:
    """Median realised SM clock over readings."""
    clocks = [r.sm_clock_mhz for r in readings if r.sm_clock_mhz is not None]
    return float(np.median(clocks)) if clocks else None


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """One decode design point: batch, mean total context, iteration time, power."""

    batch: int
    prompt_tokens: int
    context_tokens: float
    iteration_s: float
    power_w: float | None
    window_s: float


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """Prefill rate from completion times against cumulative tokens (slope), and power."""

    tokens_per_s: float
    r_squared: float
    power_w: float | None
    prompt_tokens: int
    requests: int
    fixed_latency_s: float


STOP_POLL_S = 0.1
"""How often a measurement in flight looks at the stop event (Ctrl-C, SIGTERM)."""


def _concurrent(
    url: str,
    bodies: Sequence[dict],
    timeout_s: float,
    api_key: str | None = None,
    stop: threading.Event | None = None,
) -> list[StreamTiming]:
    """Send ``bodies`` at once and wait for every stream to end.

    Raises:
        Interrupted: ``stop`` was set while waiting; the requests are left to their
            daemon threads, so the caller resets the clocks at once rather than after the
            slowest stream (minutes with a stalled engine).
        ProfileRunError: a request failed or got no answer in time.
    """
    results: list[StreamTiming | None] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def one(index: int) -> None:
        results[index] = stream_completion(
            url, bodies[index], timeout_s=timeout_s, barrier=barrier, api_key=api_key
        )

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s + 5.0
    for thread in threads:
        while thread.is_alive() and time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                raise Interrupted("interrupted")
            thread.join(timeout=min(STOP_POLL_S, max(0.0, deadline - time.monotonic())))
    out = [r for r in results if r is not None]
    failures = [r.error for r in out if r.error] + (["no answer"] * (len(bodies) - len(out)))
    if failures:
        raise ProfileRunError(f"engine at {url}: {len(failures)} request(s) failed: {failures[0]}")
    return out  # type: ignore[return-value]


class Measurer:
    """Runs the measurement recipe against one engine and its GPUs."""

    def __init__(
        self,
        url: str,
        model: str,
        sampler: GpuSampler,
        *,
        request_timeout_s: float = 300.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        api_key: str | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.url = url
        self.stop = stop
        """Set by Ctrl-C/SIGTERM: a measurement in flight then raises :class:`Interrupted`."""
        self.api_key = api_key
        self.model = model
        self.sampler = sampler
        self.request_timeout_s = request_timeout_s
        self._sleep = sleep
        self._clock = clock
        self._salt = 0

    def _body(self, prompt_tokens: int, max_tokens: int) -> dict:
        self._salt += 7919  # different ids each request: no prefix-cache hits
        return request_body(self.model, prompt_tokens, max_tokens, "ids", salt=self._salt)

    def idle(self, dwell_s: float) -> tuple[float | None, float | None]:
        """Idle power and realised clock over ``dwell_s`` with no request in flight."""
        start = self._clock()
        if self.stop is None:
            self._sleep(dwell_s)
        elif self.stop.wait(dwell_s):  # a long --dwell must not hold a stop (and a lock)
            raise Interrupted("interrupted")
        readings = self.sampler.window(start, self._clock())
        self.sampler.check()
        return window_power_w(readings), median_clock_mhz(readings)

    def prefill(self, prompt_tokens: int, requests: int) -> tuple[PrefillResult, list[GpuReading]]:
        """Send ``requests`` prompts of ``prompt_tokens`` at once with one output token each;
        the rate is the slope of completion time against cumulative prompt tokens."""
        bodies = [self._body(prompt_tokens, 1) for _ in range(requests)]
        timings = _concurrent(self.url, bodies, self.request_timeout_s, self.api_key, self.stop)
        done = sorted(t.token_s[0] for t in timings if t.token_s)
        if len(done) < 3:
            raise ProfileRunError(f"engine at {self.url}: prefill requests returned no token")
        cumulative = prompt_tokens * np.arange(1, len(done) + 1, dtype=float)
        slope, intercept = np.polyfit(cumulative, done, 1)
        predicted = slope * cumulative + intercept
        residual = float(np.sum((np.asarray(done) - predicted) ** 2))
        total = float(np.sum((np.asarray(done) - np.mean(done)) ** 2))
        r_squared = 1.0 - residual / total if total > 0 else 0.0
        if slope <= 0:
            raise ProfileRunError(
                "prefill completions did not spread out in time: the engine serves the "
                "prompts in parallel or the model is too small to load the GPU"
            )
        readings = self.sampler.window(done[0], done[-1])
        first_sent = min(t.sent_s for t in timings)
        fixed = done[0] - first_sent - prompt_tokens * slope
        return (
            PrefillResult(
                tokens_per_s=float(1.0 / slope),
                r_squared=r_squared,
                power_w=window_power_w(readings),
                prompt_tokens=prompt_tokens,
                requests=len(done),
                fixed_latency_s=float(fixed),
            ),
            readings,
        )

    def decode(
        self,
        batch: int,
        prompt_tokens: int,
        output_tokens: int,
        *,
        attempts: int = DECODE_ATTEMPTS,
    ) -> tuple[DecodePoint, list[GpuReading]]:
        """``batch`` requests at once; the iteration time over the window where all of
        them decode together (after the last first token, before the first finish).

        When that window holds too few iterations (the batch's prefills or the client's
        sends spread too far), the point is measured again with twice the output."""
        for attempt in range(attempts):
            try:
                return self._decode_once(batch, prompt_tokens, output_tokens << attempt)
            except _ShortWindow as error:
                if attempt == attempts - 1:
                    raise ProfileRunError(str(error)) from error
        raise AssertionError("unreachable")  # pragma: no cover

    def _decode_once(
        self, batch: int, prompt_tokens: int, output_tokens: int
    ) -> tuple[DecodePoint, list[GpuReading]]:
        bodies = [self._body(prompt_tokens, output_tokens) for _ in range(batch)]
        timings = _concurrent(self.url, bodies, self.request_timeout_s, self.api_key, self.stop)
        if any(len(t.token_s) < output_tokens for t in timings):
            shortest = min(timings, key=lambda t: len(t.token_s))
            raise ProfileRunError(
                f"engine at {self.url}: a decode request streamed {len(shortest.token_s)} of "
                f"{output_tokens} tokens: {_why_short(shortest.finish_reason)}"
            )
        start = max(t.token_s[0] for t in timings)
        end = min(t.token_s[-1] for t in timings)
        intervals = []
        generated = []
        for timing in timings:
            inside = [s for s in timing.token_s if start <= s <= end]
            if len(inside) >= MIN_WINDOW_TOKENS:
                intervals.append(robust_interval_s(inside))
                first_index = timing.token_s.index(inside[0])
                generated.append(first_index + (len(inside) - 1) / 2.0)
        if len(intervals) < max(1, (batch + 1) // 2) or end - start <= 0:
            raise _ShortWindow(
                f"decode at batch {batch}: the requests never decoded together; raise the "
                "output length or check the engine's max_num_seqs"
            )
        iteration = float(np.median(intervals))
        # The iteration that streams token j reads the prompt and tokens 1..j-1 (token 0
        # came from the prefill): the window's mean context per sequence is this.
        context = batch * (prompt_tokens + float(np.mean(generated)) - 0.5)
        readings = self.sampler.window(start, end)
        return (
            DecodePoint(
                batch=batch,
                prompt_tokens=prompt_tokens,
                context_tokens=context,
                iteration_s=iteration,
                power_w=window_power_w(readings),
                window_s=end - start,
            ),
            readings,
        )


def _why_short(finish_reason: str | None) -> str:
    """Why a stream ended before its ``max_tokens`` (fewer token events than asked), from
    its finish reason: an engine that stopped or restarted mid-measurement is not one
    that ignores ``ignore_eos``."""
    if finish_reason == "stop":
        return "it stopped at an end-of-sequence token (is ignore_eos honoured?)"
    if finish_reason == "length":
        # Ended at a length limit with fewer token events than tokens asked: a context
        # cut short, or tokens streamed several to an event.
        return (
            "it reached a length limit: the engine's max_model_len, or the engine streams "
            "several tokens per event (--stream-interval above 1, speculative decoding), "
            "from which a decode iteration cannot be timed"
        )
    reason = "no finish reason" if finish_reason is None else f"finish reason {finish_reason!r}"
    return f"the engine ended it ({reason}: did it stop or restart?)"


def point_dict(point: DecodePoint | PrefillResult) -> dict:
    """A measurement as JSON-able dict (state file)."""
    return asdict(point)
