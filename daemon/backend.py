"""The GPU backend role: one GPU's readings and its clock lock.

Implementations: :class:`daemon.nvml.NvmlBackend` (the product),
:class:`daemon.nvidia_smi.NvidiaSmiBackend` (fallback),
:class:`daemon.simulated.SimulatedBackend` (the plant) and :class:`DryRunBackend` (wraps
any of them: reads for real, only logs writes).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpugov.daemon.errors import GpuError, GpuUnavailable

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

    ``writes`` keeps the last ``history`` of ``("lock", min, max)`` and ``("reset",)`` in
    call order (bounded, so a long-running dry-run daemon does not grow). The wrapped GPU's
    ``uuid`` and ``name`` show through, so everything keyed on them (a learned model)
    sees the same GPU in a dry run.
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

    def _check_open(self) -> None:
        if self._closed:
            raise GpuUnavailable(f"GPU {self.label}: backend is closed", gpu=self.label)

    def close(self) -> None:
        """Close the wrapped backend; later writes raise GpuUnavailable as its reads do."""
        self._closed = True
        self._inner.close()
