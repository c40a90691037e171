"""The work mix a domain serves and the lowest clock worth serving it at: shared by the
profile-fed MPC (exact tables) and ``mpc-online``'s efficiency floor (a learned model,
:mod:`controllers.online.efficiency`).

A domain that keeps up with its prompts draws, on average,

    c(f) = P_idle(f) + r * (P_prefill(f) - P_idle(f)) * prefill_s_per_token(f)
                     + d * (P_decode(f) - P_idle(f))

watts at clock ``f``, with ``r`` the prompt tokens prefilled per second recently and ``d``
the share of recent time it had replies decoding. A period's clock below the lowest one
whose ``c`` is within :data:`TOLERANCE` of the cheapest is both slower and dearer: the
MPC's fluid model does not see it, as it charges a period at its phase's busy power
however early the work ends (``docs/online.md``, "No race to idle in the MPC"). Pure
computation: no I/O, no clocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import ServingObservation

FloatArray = NDArray[np.float64]

MIX_MEMORY_S = 60.0
"""Time constant (s) of the work mix's exponential memory."""
TOLERANCE = 0.02
"""How near the cheapest cost the floor's clock may be."""


@dataclass
class WorkMix:
    """The prompt tokens a domain prefilled per second and the share of the time it had
    replies decoding, recently: from the engine's prompt counter and running batch,
    decayed over :data:`MIX_MEMORY_S` (a restart of the counter starts again)."""

    memory_s: float = MIX_MEMORY_S
    prompt_tokens: float = 0.0
    decoding_s: float = 0.0
    elapsed_s: float = 0.0
    _last: tuple[float, float] | None = None

    def update(self, observation: ServingObservation) -> None:
        """Fold the time since the previous observation in."""
        now = float(observation.time_s)
        prompt = float(observation.prompt_tokens_total)
        last = self._last
        self._last = (now, prompt) if math.isfinite(prompt) else None
        if last is None or not math.isfinite(prompt):
            return
        elapsed = now - last[0]
        added = prompt - last[1]
        if not elapsed > 0.0 or added < 0.0:
            return  # time went back or the counter restarted: the next delta counts
        decay = math.exp(-elapsed / self.memory_s)
        self.prompt_tokens = self.prompt_tokens * decay + added
        decoding = elapsed if observation.decode_active > 0 else 0.0
        self.decoding_s = self.decoding_s * decay + decoding
        self.elapsed_s = self.elapsed_s * decay + elapsed

    @property
    def prompt_rate(self) -> float:
        """Prompt tokens prefilled per second over the memory."""
        return self.prompt_tokens / self.elapsed_s if self.elapsed_s > 0.0 else 0.0

    @property
    def decode_share(self) -> float:
        """Share of the time over the memory with replies decoding."""
        return self.decoding_s / self.elapsed_s if self.elapsed_s > 0.0 else 0.0

    def for_role(self, role: str) -> tuple[float, float]:
        """``(prompt_rate, decode_share)`` as a domain of ``role`` serves them: a prefill
        pool decodes nothing, a decode pool prefills nothing."""
        rate = 0.0 if role == "decode" else self.prompt_rate
        share = 0.0 if role == "prefill" else self.decode_share
        return rate, share


def cheapest_within(clocks_mhz: FloatArray, cost_w: FloatArray) -> float:
    """The lowest of ``clocks_mhz`` whose ``cost_w`` is finite and within
    :data:`TOLERANCE` of the cheapest; the lowest clock where none is finite."""
    valid = np.isfinite(cost_w)
    if not valid.any():
        return float(clocks_mhz[0])
    best = float(np.min(cost_w[valid]))
    near = np.flatnonzero(valid & (cost_w <= (1.0 + TOLERANCE) * best))
    return float(clocks_mhz[int(near[0])])


class ProfileFloor:
    """The floor (module notes) of one profile, its tables read once: the lowest clock of
    ``profile`` whose mean power for a work mix, from the profile's own tables taken as
    exact, is within :data:`TOLERANCE` of the cheapest clock's."""

    def __init__(self, profile: PerformanceProfile) -> None:
        self.profile = profile
        self.clocks_mhz = np.asarray(profile.clock_mhz, dtype=float)
        self.idle_w = np.asarray(profile.idle_power_w, dtype=float)
        prefill = np.maximum(np.asarray(profile.prefill_power_w, dtype=float) - self.idle_w, 0.0)
        rate = np.asarray(profile.prefill_tokens_per_s, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            seconds = np.where(rate > 0.0, 1.0 / rate, np.inf)
        self.prefill_j_per_token = prefill * seconds
        """Prefill energy above idle per prompt token, per clock."""
        self.decode_w = np.maximum(
            np.asarray(profile.decode_power_w, dtype=float) - self.idle_w, 0.0
        )
        """Decode power above idle, per clock."""

    def __call__(self, prompt_rate: float, decode_share: float) -> float:
        """The floor for ``prompt_rate`` prompt tokens a second and ``decode_share`` of the
        time decoding: the profile's lowest clock where no prompts arrive."""
        if not prompt_rate > 0.0:
            return float(self.clocks_mhz[0])
        cost = self.idle_w + prompt_rate * self.prefill_j_per_token + decode_share * self.decode_w
        return cheapest_within(self.clocks_mhz, cost)


def profile_floor(profile: PerformanceProfile, prompt_rate: float, decode_share: float) -> float:
    """:class:`ProfileFloor` of ``profile`` for one work mix."""
    return ProfileFloor(profile)(prompt_rate, decode_share)


__all__ = [
    "MIX_MEMORY_S",
    "TOLERANCE",
    "ProfileFloor",
    "WorkMix",
    "cheapest_within",
    "profile_floor",
]
