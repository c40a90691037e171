"""Synthetic request workloads: Poisson and on/off bursty arrivals with lognormal token
lengths fitted to the Azure conversation trace's medians and means.

They are synthetic stand-ins for tests and studies, not replays; real arrivals come from
the trace files :func:`plant.workload.load_trace` reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.types import Request

LengthSampler = Callable[[np.random.Generator, int], NDArray[np.int64]]
LengthSpec = int | LengthSampler | None


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """Lognormal token-length sampler given by its median and mean, rounded and clipped.

    ``mu = ln(median)``, ``sigma = sqrt(2 ln(mean / median))`` (lognormal mean is
    ``exp(mu + sigma^2 / 2)``). Samples are rounded to integers and clipped to
    ``[minimum, maximum]``, so the realised mean is slightly below ``mean``.
    """

    median: float
    mean: float
    minimum: int = 1
    maximum: int = 16_384

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median > 0):
            raise ValueError(f"median must be finite and > 0, got {self.median!r}")
        if not (math.isfinite(self.mean) and self.mean >= self.median):
            raise ValueError(f"mean must be finite and >= median, got {self.mean!r}")
        if not (1 <= self.minimum <= self.maximum):
            raise ValueError(
                f"need 1 <= minimum <= maximum, got {self.minimum!r}, {self.maximum!r}"
            )

    @property
    def sigma(self) -> float:
        """Log-space standard deviation."""
        return math.sqrt(2.0 * math.log(self.mean / self.median))

    def __call__(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        """Draw ``n`` lengths."""
        draws = rng.lognormal(math.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(draws), self.minimum, self.maximum).astype(np.int64)


#: Prompt lengths fitted to the Azure conversation trace (median 1020, mean 1154.7;
#: the trace's max is 14,050, clipped here at 16,384).
AZURE_CONV_PROMPT_TOKENS = LognormalLengths(median=1020.0, mean=1154.7, maximum=16_384)
#: Output lengths fitted to the Azure conversation trace (median 129, mean 211.1; the
#: trace's max is 1,000, clipped here at 2,048).
AZURE_CONV_OUTPUT_TOKENS = LognormalLengths(median=129.0, mean=211.1, maximum=2_048)


def _lengths(
    spec: LengthSpec, default: LognormalLengths, rng: np.random.Generator, n: int, what: str
) -> NDArray[np.int64]:
    """Draw ``n`` lengths from a fixed int, a sampler, or the default; check they are >= 1."""
    if spec is None:
        values = default(rng, n)
    elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"{what} must be >= 1, got {spec!r}")
        values = np.full(n, int(spec), dtype=np.int64)
    elif callable(spec):
        values = np.asarray(spec(rng, n))
        if values.shape != (n,):
            raise ValueError(f"{what} sampler returned shape {values.shape}, expected ({n},)")
        if n and (np.any(values != np.rint(values)) or values.min() < 1):
            raise ValueError(f"{what} sampler must return integers >= 1")
        values = values.astype(np.int64)
    else:
        raise TypeError(f"{what} must be an int, a sampler (rng, n) -> array, or None")
    return values


def _build(
    arrivals_s: NDArray[np.float64],
    rngs: Sequence[np.random.Generator],
    prompt_tokens: LengthSpec,
    output_tokens: LengthSpec,
) -> tuple[Request, ...]:
    """Attach lengths to sorted arrivals; ids are 0..n-1 in arrival order."""
    n = len(arrivals_s)
    prompts = _lengths(prompt_tokens, AZURE_CONV_PROMPT_TOKENS, rngs[0], n, "prompt_tokens")
    outputs = _lengths(output_tokens, AZURE_CONV_OUTPUT_TOKENS, rngs[1], n, "output_tokens")
    return tuple(
        Request(i, float(t), int(p), int(o))
        for i, (t, p, o) in enumerate(zip(arrivals_s, prompts, outputs, strict=True))
    )


def _streams(seed: int) -> Iterator[np.random.Generator]:
    """Independent generators for arrivals, prompts and outputs from one seed.

    Separate streams mean changing the output sampler does not change the arrivals or
    the prompts drawn for the same seed.
    """
    for child in np.random.SeedSequence(seed).spawn(3):
        yield np.random.default_rng(child)


def _check_rate(name: str, value: float) -> None:
    """Validate a rate or duration: finite and >= 0."""
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def poisson_workload(
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int,
    prompt_tokens: LengthSpec = None,
    output_tokens: LengthSpec = None,
) -> tuple[Request, ...]:
    """Synthetic homogeneous Poisson arrivals on ``[0, duration_s)``.

    The count is Poisson(``rate_per_s * duration_s``) and the arrival times are sorted
    uniforms, which is the same process as exponential gaps. Lengths default to
    :data:`AZURE_CONV_PROMPT_TOKENS` and :data:`AZURE_CONV_OUTPUT_TOKENS`; pass an int for
    a fixed length or a sampler ``(rng, n) -> int array``. Deterministic per ``seed``.
    """
    _check_rate("rate_per_s", rate_per_s)
    if not math.isfinite(duration_s) or duration_s <= 0.0:
        raise ValueError(f"duration_s must be finite and > 0, got {duration_s!r}")
    arrival_rng, prompt_rng, output_rng = _streams(seed)
    n = int(arrival_rng.poisson(rate_per_s * duration_s))
    arrivals = np.sort(arrival_rng.uniform(0.0, duration_s, size=n))
    return _build(arrivals, (prompt_rng, output_rng), prompt_tokens, output_tokens)


def bursty_workload(
    on_rate_per_s: float,
    off_rate_per_s: float,
    on_s: float,
    off_s: float,
    duration_s: float,
    *,
    seed: int,
    prompt_tokens: LengthSpec = None,
    output_tokens: LengthSpec = None,
) -> tuple[Request, ...]:
    """Synthetic on/off modulated Poisson arrivals on ``[0, duration_s)``.

    The rate is ``on_rate_per_s`` for ``on_s`` seconds, then ``off_rate_per_s`` for
    ``off_s`` seconds, repeating, starting in the on phase at time 0. Drawn by thinning a
    Poisson process at the larger rate. Mean rate is
    ``(on_rate * on_s + off_rate * off_s) / (on_s + off_s)``. Lengths as in
    :func:`poisson_workload`. Deterministic per ``seed``.
    """
    _check_rate("on_rate_per_s", on_rate_per_s)
    _check_rate("off_rate_per_s", off_rate_per_s)
    _check_rate("off_s", off_s)
    if not math.isfinite(on_s) or on_s <= 0.0:
        raise ValueError(f"on_s must be finite and > 0, got {on_s!r}")
    if not math.isfinite(duration_s) or duration_s <= 0.0:
        raise ValueError(f"duration_s must be finite and > 0, got {duration_s!r}")
    arrival_rng, prompt_rng, output_rng = _streams(seed)
    peak = max(on_rate_per_s, off_rate_per_s)
    n = int(arrival_rng.poisson(peak * duration_s))
    candidates = np.sort(arrival_rng.uniform(0.0, duration_s, size=n))
    keep_u = arrival_rng.uniform(0.0, 1.0, size=n)
    in_on = np.mod(candidates, on_s + off_s) < on_s
    rate = np.where(in_on, on_rate_per_s, off_rate_per_s)
    arrivals = candidates[keep_u * peak < rate] if peak > 0 else candidates
    return _build(arrivals, (prompt_rng, output_rng), prompt_tokens, output_tokens)
