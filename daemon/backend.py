"""The GPU backend role: one GPU's readings and its clock lock, and the optional power
limit (:class:`PowerLimitBackend`).

Implementations: :class:`daemon.nvml.NvmlBackend` (the product),
:class:`daemon.nvidia_smi.NvidiaSmiBackend` (fallback),
:class:`daemon.simulated.SimulatedBackend` (the plant) and :class:`DryRunBackend` (wraps
any of them: reads for real, only logs writes). The power limit is set through NVML and
on the simulated plant (and logged by a dry run around either); the other backends (the
emulated GPU, nvidia-smi, the split mode's actuator and zeusd) lock clocks only, and a
controller that sets a power cap is refused with them at start.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gpugov.daemon.errors import GpuError, GpuUnavailable, NotSupported

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's readings at one instant; a reading that failed or is unsupported is None.

    ``utilization`` is a ratio in [0, 1]. ``clock_event_reasons`` is NVML's bitmask
    (``nvmlClocksEventReason*``). ``read_errors`` names the reads that failed transiently
    in this sample (counted by the daemon and survived).
    """

    gpu: str
    power_w: float | None = None
    energy_j: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    utilization: float | None = None
    clock_event_reasons: int | None = None
    power_limit_w: float | None = None
    read_errors: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.utilization is not None and not 0.0 <= self.utilization <= 1.0:
            raise ValueError(f"utilization must be a ratio in [0, 1], got {self.utilization!r}")
        if self.power_w is not None and self.power_w < 0.0:
            raise ValueError(f"power_w must be >= 0, got {self.power_w!r}")

    @classmethod
    def read(
        cls,
        gpu: str,
        *,
        read_errors: tuple[str, ...] = (),
        **readings: float | None,
    ) -> GpuSample:
        """A sample from a backend's raw readings (the fields above, in base units): a
        reading no GPU can give (NaN, infinite, a negative power, energy or clock, a power
        above :data:`MAX_GPU_POWER_W`, a power limit of 0 or above it, a temperature outside
        :data:`GPU_TEMPERATURE_RANGE_C`, a utilisation outside [0, 1], event reasons that
        are no 64-bit mask) is None and
        named in ``read_errors``, as a failed read is, so one bad value from a driver or
        an emulator costs that reading, never the sample."""
        errors = list(read_errors)
        kept: dict[str, Any] = {}
        for name, value in readings.items():
            if value is None:
                kept[name] = None
                continue
            number = float(value)
            read, lowest, highest = _READINGS[name]
            if not (math.isfinite(number) and lowest <= number <= highest) or (
                name == "clock_event_reasons" and number != int(number)
            ):
                kept[name] = None
                errors.append(read)
            else:
                kept[name] = int(number) if name == "clock_event_reasons" else number
        return cls(gpu=gpu, read_errors=tuple(errors), **kept)


MAX_GPU_POWER_W = 50_000.0
"""No GPU draws that much (the largest boards and modules draw under 3 kW, the TP group
one ``gpugov emulate`` GPU stands for under 12 kW): a power reading above it is a
sensor fault (0xFFFFFFFF mW, 1e9 mW), never a load to plan for."""
MIN_POWER_LIMIT_W = 0.001
"""The least power limit a GPU can hold: one milliwatt, NVML's unit. A limit of 0 (or one
above :data:`MAX_GPU_POWER_W`, NVML's 0xFFFFFFFF mW for an unknown value) is no limit: taken
as one, a domain's limit and the power budget read from NVML were that much less (or 4.3
MW more)."""
GPU_TEMPERATURE_RANGE_C = (-50.0, 150.0)
"""The die temperatures a GPU can report: every GPU shuts down far below 150 C, and a
reading of 255 C (an 8-bit sensor's fault value) would have the MPC cool a healthy GPU
by locking it low."""

_READINGS: dict[str, tuple[str, float, float]] = {
    "power_w": ("power", 0.0, MAX_GPU_POWER_W),
    "energy_j": ("energy", 0.0, math.inf),
    "temperature_c": ("temperature", *GPU_TEMPERATURE_RANGE_C),
    "sm_clock_mhz": ("sm_clock", 0.0, math.inf),
    "utilization": ("utilization", 0.0, 1.0),
    "clock_event_reasons": ("clock_event_reasons", 0.0, 2.0**64 - 1.0),
    "power_limit_w": ("power_limit", MIN_POWER_LIMIT_W, MAX_GPU_POWER_W),
}
"""Per sample field: the read it comes from (its name in ``read_errors``) and the values
it can take (:meth:`GpuSample.read`; finite in every case)."""


EXPLAINS_LOWER_CLOCK = (2**64 - 1) & ~0x2
"""Clock event reasons that explain a realised clock below the lock: every bit but
ApplicationsClocksSetting (0x2, the lock itself). Idle, power cap, slowdowns (hardware,
thermal, power brake), sync boost, display clock, the board and reliability (voltage)
limits, which nvidia-ml-py names only among its throttle reasons
(``nvmlClocksThrottleReasonBoardLimit`` 0x200, ``...Reliability`` 0x400), and any bit a
newer driver adds: each is the driver saying why the clock is where it is, and none is
another tool's lock (which shows 0x2 alone)."""


def clock_tolerance_mhz(clocks: Sequence[float]) -> float:
    """Two steps of the supported clocks (their median step; 15 MHz without one): what a
    realised SM clock may differ from a lock, or from the supported range, by."""
    ordered = sorted(set(clocks))
    steps = sorted(b - a for a, b in itertools.pairwise(ordered))
    step = steps[len(steps) // 2] if steps else 15
    return 2.0 * max(step, 1)


def plausible_clock(
    sample: GpuSample, lowest_mhz: float, highest_mhz: float, tolerance_mhz: float
) -> GpuSample:
    """``sample`` with an SM clock its GPU cannot run at taken as a failed read: above its
    top supported clock (``highest_mhz``), or below its lowest (``lowest_mhz``) with no
    event reason that explains a lower clock, by more than ``tolerance_mhz``
    (:func:`clock_tolerance_mhz`). Such a reading (a driver's garbage, 0 MHz) is no lock
    anyone set, so the readback must not yield the GPU over it (gpugov's own lock would
    stay at exit), and no controller should learn from it."""
    clock = sample.sm_clock_mhz
    if clock is None:
        return sample
    reasons = sample.clock_event_reasons
    too_high = clock > highest_mhz + tolerance_mhz
    too_low = (
        clock < lowest_mhz - tolerance_mhz
        and reasons is not None
        and not reasons & EXPLAINS_LOWER_CLOCK
    )
    if not (too_high or too_low):
        return sample
    return dataclasses.replace(
        sample, sm_clock_mhz=None, read_errors=(*sample.read_errors, "sm_clock")
    )


POWER_OVER_LIMIT_FACTOR = 2.0
"""A power reading above this many times the highest power limit the GPU accepts (its
enforced limit where that is unknown) is a sensor fault: GPUs hold their limit within
milliseconds, and a reading below :data:`MAX_GPU_POWER_W` can still be ten times a
board's (a learned power model fed it predicts a need no budget holds and locks low)."""


def plausible_power(sample: GpuSample, highest_limit_w: float | None) -> GpuSample:
    """``sample`` with a power reading far above what the GPU may draw (more than
    :data:`POWER_OVER_LIMIT_FACTOR` times ``highest_limit_w``, else its own enforced
    limit) taken as a failed read, as :meth:`GpuSample.read` takes one above
    :data:`MAX_GPU_POWER_W`."""
    power = sample.power_w
    limit = highest_limit_w if highest_limit_w else sample.power_limit_w
    if power is None or not limit or power <= POWER_OVER_LIMIT_FACTOR * limit:
        return sample
    return dataclasses.replace(sample, power_w=None, read_errors=(*sample.read_errors, "power"))


IMPLAUSIBLE_POWER_FACTOR = 20.0
"""An energy counter that advanced by more than this many times the power limit over a
window is a counter jump (a real GPU stays under its limit; ``gpugov emulate --speed X``
runs its energy counter X times faster than the wall clock the daemon's windows are
measured in): :func:`plausible_energy`, and the energy attribution's windows."""


def plausible_energy(
    sample: GpuSample,
    previous: tuple[float, float] | None,
    now_s: float,
    highest_limit_w: float | None,
) -> GpuSample:
    """``sample`` with an energy counter that advanced further since ``previous`` (the
    counter read before, and when) than the GPU may draw meanwhile (more than
    :data:`IMPLAUSIBLE_POWER_FACTOR` times ``highest_limit_w``, else its own enforced limit,
    for at least a second) taken as a failed read: a counter's garbage (2^64 - 1 mJ) was a
    window of 18 PJ a learned power model took in. A counter that went back (a driver
    reload) is its consumers' to take as a reset."""
    energy = sample.energy_j
    if energy is None or previous is None:
        return sample
    before_j, before_s = previous
    limit_w = highest_limit_w or sample.power_limit_w or MAX_GPU_POWER_W
    if energy - before_j <= IMPLAUSIBLE_POWER_FACTOR * limit_w * max(now_s - before_s, 1.0):
        return sample
    return dataclasses.replace(sample, energy_j=None, read_errors=(*sample.read_errors, "energy"))


@runtime_checkable
class GpuBackend(Protocol):
    """One GPU: read it, lock its SM clock, unlock it.

    The contract every implementation meets (``tests/conformance/test_backends.py`` runs
    it against each; ``docs/backends.md``):

    * ``label`` names the GPU in logs and metrics (the NVML index as text): a non-empty
      string, and the ``gpu`` of every sample.
    * ``supported_clocks_mhz()``: the SM clocks a lock may ask for; a non-empty tuple of
      positive ints, strictly ascending, the same on every call.
    * ``sample()``: a :class:`GpuSample` in base units (W, J, C, MHz, a ratio); a reading
      the GPU lacks is None; the energy counter never decreases. A read that fails
      transiently is None and named in ``read_errors``, or, when the whole reading failed,
      ``sample()`` raises :class:`~daemon.errors.TransientGpuError`; the observer counts
      both and goes on.
    * ``lock_clocks(min_mhz, max_mhz)``: holds the SM clock in the range. Once the
      actuation delay has passed a busy GPU reads back ``max_mhz`` (lower only with an
      event reason that says why), and below the top clock ``clock_event_reasons`` (where
      reported) shows ApplicationsClocksSetting (0x2). Callers ask for supported clocks
      (the actuator does, after ``ClampToSupported``); a clock outside the supported range
      is refused (:class:`~daemon.errors.GpuError` or ``NotSupported``) or clamped into
      it, never read back outside it. ``min_mhz > max_mhz`` is refused with
      :class:`~daemon.errors.GpuError` (NVML's INVALID_ARGUMENT).
    * ``reset_clocks()``: removes the lock; the GPU returns to its default (a busy GPU
      runs at the top clock) and ApplicationsClocksSetting clears.
    * ``close()``: releases what the backend holds; idempotent; afterwards every call
      raises :class:`~daemon.errors.GpuUnavailable`.
    * Errors are the daemon's own (:mod:`daemon.errors`), never the vendor's: a lock or
      reset without root or CAP_SYS_ADMIN raises ``PermissionDenied``; a call the GPU or
      driver lacks, ``NotSupported``; a GPU off the bus, ``GpuLost`` (from any call); no
      driver, no such GPU or a closed backend, ``GpuUnavailable``; a timeout or another
      passing failure, ``TransientGpuError``.

    :class:`DryRunBackend` reads for real and never writes, so it refuses no lock.
    """

    @property
    def label(self) -> str: ...

    def supported_clocks_mhz(self) -> tuple[int, ...]: ...

    def sample(self) -> GpuSample: ...

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class PowerLimitBackend(Protocol):
    """A GPU whose power management limit gpugov may set (NVML's
    ``nvmlDeviceSetPowerManagementLimit``, what ``nvidia-smi -pl`` sets), in watts.

    * ``power_limit_w()``: the power management limit set now (not the enforced limit a
      sample carries, which may be lower for other reasons).
    * ``power_limit_constraints_w()``: the (lowest, highest) limit the GPU accepts, or
      None when they cannot be read.
    * ``set_power_limit(limit_w)``: set the limit (whole milliwatts on NVML); without root
      or CAP_SYS_ADMIN ``PermissionDenied``, a GPU or driver without the call
      ``NotSupported``, otherwise errors as :class:`GpuBackend`'s.

    Optional beside :class:`GpuBackend` (a backend that lacks it runs clock-only
    controllers); :func:`power_limit_backend` tells which backends have it.
    """

    @property
    def label(self) -> str: ...

    def power_limit_w(self) -> float: ...

    def power_limit_constraints_w(self) -> tuple[float, float] | None: ...

    def set_power_limit(self, limit_w: float) -> None: ...


def unwrapped(backend: GpuBackend) -> GpuBackend:
    """The GPU backend inside a dry-run wrapper (reads go through it unchanged)."""
    return backend.inner if isinstance(backend, DryRunBackend) else backend


def power_limit_backend(backend: GpuBackend) -> PowerLimitBackend | None:
    """``backend`` as a :class:`PowerLimitBackend` when its GPU's power limit can be set
    through it (a dry run when the GPU it wraps can), else None."""
    inner = unwrapped(backend)
    if not isinstance(inner, PowerLimitBackend) or not isinstance(backend, PowerLimitBackend):
        return None
    return backend


class ReadThroughBackend:
    """One GPU whose reads go through ``reader`` (NVML) and whose writes a subclass sends
    elsewhere (the actuator, zeusd): the reader's label, UUID, name, clocks and samples,
    and the checks every write makes."""

    def __init__(self, reader: GpuBackend) -> None:
        self._reader = reader
        self._closed = False

    @property
    def label(self) -> str:
        """The reader's label (the NVML index as text)."""
        return self._reader.label

    @property
    def uuid(self) -> str | None:
        """The GPU's UUID, from its reader."""
        value = getattr(self._reader, "uuid", None)
        return str(value) if value else None

    @property
    def name(self) -> str | None:
        """The GPU's name, from its reader."""
        value = getattr(self._reader, "name", None)
        return str(value) if value else None

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """The reader's supported clocks."""
        return self._reader.supported_clocks_mhz()

    def sample(self) -> GpuSample:
        """A reading through the reader."""
        return self._reader.sample()

    def slowdown_temperature_c(self) -> float | None:
        """The reader's slowdown temperature (a read, as the nvml mode's): not passed on, a
        domain's thermal limit above it was held in the split mode."""
        read = getattr(self._reader, "slowdown_temperature_c", None)
        return None if read is None else read()

    def _check_write(self, min_mhz: int | None = None, max_mhz: int | None = None) -> None:
        """Refuse a write on a closed backend, and a lock whose minimum is above its
        maximum, as every backend does."""
        if self._closed:
            raise GpuUnavailable(f"GPU {self.label}: backend is closed", gpu=self.label)
        if min_mhz is not None and max_mhz is not None and min_mhz > max_mhz:
            raise GpuError(
                f"GPU {self.label}: lock {min_mhz}-{max_mhz} MHz: min above max", gpu=self.label
            )


class DryRunBackend:
    """Wraps a backend: every read goes through, every write is only logged and recorded.

    ``writes`` keeps the last ``history`` of ``("lock", min, max)``, ``("reset",)`` and
    ``("power_limit", watts)`` in call order (bounded, so a long-running dry-run daemon
    does not grow). The wrapped GPU's ``uuid`` and ``name`` show through, so everything
    keyed on them (a learned model) sees the same GPU in a dry run.
    """

    def __init__(self, inner: GpuBackend, history: int = 1000) -> None:
        self._inner = inner
        self.writes: deque[tuple[object, ...]] = deque(maxlen=history)
        self._closed = False

    @property
    def inner(self) -> GpuBackend:
        """The wrapped backend (reads go through it unchanged)."""
        return self._inner

    @property
    def label(self) -> str:
        """The wrapped GPU's label."""
        return self._inner.label

    @property
    def uuid(self) -> str | None:
        """The wrapped GPU's UUID (None when its backend reports none), so a dry run
        keys a learned model as a locking run does."""
        uuid = getattr(self._inner, "uuid", None)
        return str(uuid) if uuid else None

    @property
    def name(self) -> str | None:
        """The wrapped GPU's name (NVML's), None when its backend reports none."""
        name = getattr(self._inner, "name", None)
        return str(name) if name else None

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """The wrapped GPU's supported clocks."""
        return self._inner.supported_clocks_mhz()

    def sample(self) -> GpuSample:
        """A real reading from the wrapped GPU."""
        return self._inner.sample()

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Log the lock that would be written; write nothing."""
        self._check_open()
        self.writes.append(("lock", int(min_mhz), int(max_mhz)))
        log.info("dry run: GPU %s: would lock SM clock to %d,%d MHz", self.label, min_mhz, max_mhz)

    def reset_clocks(self) -> None:
        """Log the reset that would be written; write nothing."""
        self._check_open()
        self.writes.append(("reset",))
        log.info("dry run: GPU %s: would reset SM clock lock", self.label)

    def _power_inner(self) -> PowerLimitBackend:
        """The wrapped GPU's power limit, where it has one.

        Raises:
            NotSupported: the wrapped backend sets no power limit.
        """
        inner = self._inner
        if not isinstance(inner, PowerLimitBackend):
            raise NotSupported(
                f"GPU {self.label}: this backend cannot set a power limit", gpu=self.label
            )
        return inner

    def power_limit_w(self) -> float:
        """The wrapped GPU's power management limit now, in watts (a real read)."""
        return self._power_inner().power_limit_w()

    def power_limit_constraints_w(self) -> tuple[float, float] | None:
        """The (lowest, highest) power limit the wrapped GPU accepts (a real read)."""
        return self._power_inner().power_limit_constraints_w()

    def set_power_limit(self, limit_w: float) -> None:
        """Log the power limit that would be set; set nothing."""
        self._check_open()
        self._power_inner()
        self.writes.append(("power_limit", float(limit_w)))
        log.info("dry run: GPU %s: would set the power limit to %.1f W", self.label, limit_w)

    def _check_open(self) -> None:
        if self._closed:
            raise GpuUnavailable(f"GPU {self.label}: backend is closed", gpu=self.label)

    def close(self) -> None:
        """Close the wrapped backend; later writes raise GpuUnavailable as its reads do."""
        self._closed = True
        self._inner.close()
