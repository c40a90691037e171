"""A static workload power profile: a clock ceiling plus a power cap, chosen once.

Source: NVIDIA's workload power profiles (``nvidia-smi workload-power-profile``; the Data
Center GPU Manager's "Workload Power Profiles" documentation): presets a vendor tunes in
its lab per GPU and workload class, which cap clocks and power together; on Blackwell
NVIDIA quotes up to 15 % energy saved at 97 % or more of the performance.

What this keeps: the preset is a clock ceiling and a cap, fixed for the run. The ceiling
is the lowest supported clock whose throughput on a reference load keeps at least
``throughput_fraction`` (97 %) of the top clock's; the cap is that load's mean power at the
ceiling plus ``headroom`` (10 %), so that power spikes above the reference mix are clipped.

The reference load: requests of ``reference_prompt_tokens`` (512) prompt and
``reference_output_tokens`` (256) output tokens served one after the other at the
profile's rates (prefill at ``rate("prefill")``, decode at ``rate("decode")`` at the
reference batch), the daemon's default forecast lengths.

Simplified: the calibration reads a profile (:func:`calibrate_power_profile`), as a vendor
calibrates in its lab; it never sees the scenario's trace, and the controller itself sees
only observations. A real preset also sets memory clocks and other firmware knobs that the
plant does not model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpugov.controllers.peers.common import clocks_of, index_at_or_below
from gpugov.plant.profile import PerformanceProfile
from gpugov.plant.types import ServingObservation

THROUGHPUT_FRACTION = 0.97
"""Share of the top clock's reference throughput the preset keeps."""


@dataclass(frozen=True, slots=True)
class PowerProfilePreset:
    """A calibrated preset: the clock ceiling and the cap, and what the reference load
    gives at the ceiling relative to the top clock."""

    ceiling_mhz: float
    cap_w: float
    throughput_fraction: float
    power_fraction: float


def calibrate_power_profile(
    profile: PerformanceProfile,
    *,
    throughput_fraction: float = THROUGHPUT_FRACTION,
    reference_prompt_tokens: float = 512.0,
    reference_output_tokens: float = 256.0,
    headroom: float = 0.1,
) -> PowerProfilePreset:
    """The preset of ``profile`` (module notes).

    Raises:
        ValueError: a fraction outside (0, 1] or a non-positive reference length.
    """
    if not 0.0 < throughput_fraction <= 1.0:
        raise ValueError(f"throughput_fraction must lie in (0, 1], got {throughput_fraction!r}")
    if reference_prompt_tokens <= 0.0 or reference_output_tokens <= 0.0:
        raise ValueError("the reference load needs positive prompt and output lengths")

    def load(clock: float) -> tuple[float, float]:
        """(seconds per reference request, mean power) at ``clock``."""
        realized = profile.realized_clock(clock)
        t_prefill = reference_prompt_tokens / profile.rate("prefill", realized)
        t_decode = reference_output_tokens / profile.rate("decode", realized)
        power = (
            t_prefill * profile.power("prefill", realized)
            + t_decode * profile.power("decode", realized)
        ) / (t_prefill + t_decode)
        return t_prefill + t_decode, power

    clocks = [float(c) for c in profile.clock_mhz]
    top_time, top_power = load(clocks[-1])
    for clock in clocks:
        seconds, power = load(clock)
        kept = top_time / seconds
        if kept >= throughput_fraction - 1e-12:
            return PowerProfilePreset(
                ceiling_mhz=clock,
                cap_w=power * (1.0 + headroom),
                throughput_fraction=kept,
                power_fraction=power / top_power,
            )
    raise AssertionError("the top clock keeps all of its own throughput")


class PowerProfileController:
    """Hold the preset's clock ceiling and cap (a :class:`~gpugov.plant.types.PowerCapping`)."""

    def __init__(self, ceiling_mhz: float, cap_w: float | None) -> None:
        if not (math.isfinite(ceiling_mhz) and ceiling_mhz > 0.0):
            raise ValueError(f"power-profile: ceiling_mhz must be positive, got {ceiling_mhz!r}")
        if cap_w is not None and not (math.isfinite(cap_w) and cap_w > 0.0):
            raise ValueError(f"power-profile: cap_w must be positive watts, got {cap_w!r}")
        self.ceiling_mhz = float(ceiling_mhz)
        self._cap_w = None if cap_w is None else float(cap_w)
        self.name = "power-profile"

    @classmethod
    def from_preset(cls, preset: PowerProfilePreset) -> PowerProfileController:
        """The controller holding ``preset``."""
        return cls(preset.ceiling_mhz, preset.cap_w)

    @property
    def requested_power_cap_w(self) -> float | None:
        """The preset's cap."""
        return self._cap_w

    def __call__(self, observation: ServingObservation) -> float:
        clocks = clocks_of(observation, "power-profile")
        return clocks[index_at_or_below(clocks, self.ceiling_mhz)]
