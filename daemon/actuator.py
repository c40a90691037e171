"""Clock actuation for one control domain: lock only on change, always reset on the way out.

NVML cannot read a clock lock back, so the actuator remembers what it wrote and
"restoring" means resetting every GPU it ever wrote to (GEOPM does the same). Use it as a
context manager: the reset runs on a normal stop, on SIGTERM/SIGINT (the loop stops, the
``with`` block exits) and on any exception.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Literal

from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.errors import GpuError, TransientGpuError

log = logging.getLogger(__name__)

LockMode = Literal["pin", "cap"]
_UNKNOWN = -1  # a write failed half way: the GPU's lock state is unknown, write again


class ClockActuator:
    """Applies one SM clock to every GPU of a domain.

    Args:
        backends: the domain's GPUs.
        domain: name for logs.
        lock_mode: ``"pin"`` locks ``[f, f]``; ``"cap"`` locks ``[min supported, f]`` so
            the GPU may still idle down.
    """

    def __init__(
        self,
        backends: Sequence[GpuBackend],
        *,
        domain: str = "default",
        lock_mode: LockMode = "pin",
    ) -> None:
        if not backends:
            raise ValueError(f"domain {domain!r}: a clock actuator needs at least one GPU")
        self._backends = list(backends)
        self.domain = domain
        self.lock_mode = lock_mode
        self.locked_mhz: dict[str, int | None] = {b.label: None for b in self._backends}
        self._touched: set[str] = set()
        self.writes = 0
        self.write_errors = 0

    def __enter__(self) -> ClockActuator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        failures = self.restore()
        if failures:
            log.error("domain %s: could not reset GPU(s) %s", self.domain, ", ".join(failures))

    @property
    def applied_mhz(self) -> int | None:
        """The clock every GPU of the domain is locked to, or None (unlocked or mixed)."""
        values = set(self.locked_mhz.values())
        if len(values) == 1:
            value = values.pop()
            return None if value in (None, _UNKNOWN) else value
        return None

    def _range(self, backend: GpuBackend, clock_mhz: int) -> tuple[int, int]:
        if self.lock_mode == "cap":
            return min(backend.supported_clocks_mhz()), clock_mhz
        return clock_mhz, clock_mhz

    def apply(self, clock_mhz: int) -> int:
        """Lock every GPU whose remembered lock differs from ``clock_mhz``.

        Returns:
            The number of lock writes made (0 when nothing changed).

        Raises:
            PermissionDenied, NotSupported, GpuLost: not survivable; the caller's ``with``
                block resets what it can.
        A transient failure is counted and retried on the next call.
        """
        clock_mhz = int(clock_mhz)
        written = 0
        for backend in self._backends:
            if self.locked_mhz[backend.label] == clock_mhz:
                continue
            low, high = self._range(backend, clock_mhz)
            self._touched.add(backend.label)
            try:
                backend.lock_clocks(low, high)
            except TransientGpuError as error:
                self.locked_mhz[backend.label] = _UNKNOWN
                self.write_errors += 1
                log.warning("domain %s: %s; retrying next tick", self.domain, error)
                continue
            except GpuError:
                self.locked_mhz[backend.label] = _UNKNOWN
                self.write_errors += 1
                raise
            self.locked_mhz[backend.label] = clock_mhz
            written += 1
        if written:
            self.writes += written
            log.debug("domain %s: locked SM clock at %d MHz", self.domain, clock_mhz)
        return written

    def unlock(self) -> int:
        """Reset every GPU this actuator locked (the fail-safe's "unlock" mode).

        Returns:
            The number of reset writes made.
        """
        written = 0
        for backend in self._backends:
            if self.locked_mhz[backend.label] is None:
                continue
            try:
                backend.reset_clocks()
            except TransientGpuError as error:
                self.write_errors += 1
                log.warning("domain %s: %s; retrying next tick", self.domain, error)
                continue
            self.locked_mhz[backend.label] = None
            written += 1
        self.writes += written
        return written

    def restore(self) -> list[str]:
        """Reset every GPU ever written to; never raises.

        Returns:
            Labels of the GPUs that could not be reset (lost, no permission, ...).
        """
        failures = []
        for backend in self._backends:
            if backend.label not in self._touched:
                continue
            try:
                backend.reset_clocks()
            except GpuError as error:
                failures.append(backend.label)
                log.error("domain %s: reset failed: %s", self.domain, error)
                continue
            self._touched.discard(backend.label)
            self.locked_mhz[backend.label] = None
            log.info("domain %s: GPU %s clocks reset", self.domain, backend.label)
        return failures
