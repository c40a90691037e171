"""Whether a GPU's realised SM clock still shows the lock gpugov wrote, judged over a few
reads: what a clock actuator's readback check acts on.
"""

from __future__ import annotations

import logging

from gpugov.daemon.backend import EXPLAINS_LOWER_CLOCK, GpuBackend, clock_tolerance_mhz

# The actuator's logger, not this module's: these lines were logged there and keep the
# name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.actuator")

APPLICATIONS_CLOCKS_SETTING = 0x2
"""nvmlClocksEventReasonApplicationsClocksSetting: the clock is held by a setting (a lock)."""
CONFIRM_READS = 2
"""Consecutive readbacks that must disagree with the lock before it counts as external."""
DRIVER_OFFSET_STEPS = 8
"""How many supported-clock steps a GPU may run off its lock (below it, or above it while
it shows ApplicationsClocksSetting, a lock in force) and still count as held by that
lock: a driver rounds a lock to its own clock steps and holds it a few bins lower
(voltage, temperature, a limit it names no reason for), and writing the same lock again
changes nothing there. Further off, with no reason that explains it, it is another lock
than gpugov's."""


class LockReadback:
    """Judges one domain's readbacks: is each GPU still held by the lock gpugov wrote?

    A GPU within two supported-clock steps of its lock is at it. A pinned GPU below its
    lock is still held by it when an event reason explains the lower clock (idle, power
    cap, slowdowns, board or reliability limit) or when it runs at most
    :data:`DRIVER_OFFSET_STEPS` steps below it (the driver's rounding, a bin lower); a GPU
    above its lock when it shows ApplicationsClocksSetting at most that far above it (a
    capped GPU is only checked above). Each such reading leaves the lock as it is: writing
    it again would change nothing (the first steady one per GPU off its lock is logged
    once). Any other reading (above the lock with no lock in force: the clocks were reset;
    further off: another lock) is a change by someone else once :data:`CONFIRM_READS`
    such reads come in a row.

    Args:
        domain: name for the log.
        pinned: the domain pins its lock (``lock_mode = "pin"``), else it caps it.
    """

    def __init__(self, domain: str, *, pinned: bool) -> None:
        self.domain = domain
        self.pinned = pinned
        self._disagreements: dict[str, int] = {}
        """Per GPU, readbacks in a row that disagreed with its lock."""
        self._off_lock_reads: dict[str, int] = {}
        """Per GPU, readbacks in a row that found it held off its lock by the driver."""
        self._off_lock_logged: set[str] = set()
        self._tolerance_mhz: dict[str, float] = {}

    def tolerance(self, backend: GpuBackend) -> float:
        """Two supported-clock steps: what a lock's realised clock may differ by."""
        label = backend.label
        if label not in self._tolerance_mhz:
            self._tolerance_mhz[label] = clock_tolerance_mhz(backend.supported_clocks_mhz())
        return self._tolerance_mhz[label]

    def changed(self, backend: GpuBackend, clock: float, reasons: int | None, held: int) -> bool:
        """One readback of ``backend``: its SM clock (MHz) and clock event ``reasons``
        while it is locked at ``held`` MHz. True when it confirms a change by someone else
        (the :data:`CONFIRM_READS`-th disagreeing read in a row; the count starts over)."""
        label = backend.label
        tolerance = self.tolerance(backend)
        offset = tolerance / 2.0 * DRIVER_OFFSET_STEPS  # that many supported-clock steps
        lock_in_force = reasons is not None and bool(reasons & APPLICATIONS_CLOCKS_SETTING)
        unexplained = reasons is not None and not reasons & EXPLAINS_LOWER_CLOCK
        pinned = self.pinned
        above = clock > held + (offset if lock_in_force else tolerance)
        below = pinned and clock < held - offset and unexplained
        if not (above or below):
            self._disagreements[label] = 0
            off_lock = clock > held + tolerance or (
                pinned and clock < held - tolerance and unexplained
            )
            self._held_off_lock(label, clock, held, off_lock)
            return False
        self._off_lock_reads[label] = 0
        self._disagreements[label] = self._disagreements.get(label, 0) + 1
        if self._disagreements[label] < CONFIRM_READS:
            return False
        self._disagreements[label] = 0
        return True

    def written(self, label: str) -> None:
        """A write to ``label`` went through: the reads that disagreed before it no longer
        count."""
        self._disagreements[label] = 0

    def _held_off_lock(self, label: str, clock: float, held: int, off_lock: bool) -> None:
        """A readback that leaves the lock as it is: when it found the GPU off its lock
        with no reason that explains it (``off_lock``), on :data:`CONFIRM_READS` reads
        in a row, say once per GPU that the driver holds it there."""
        if not off_lock:
            self._off_lock_reads[label] = 0
            return
        self._off_lock_reads[label] = self._off_lock_reads.get(label, 0) + 1
        if self._off_lock_reads[label] < CONFIRM_READS or label in self._off_lock_logged:
            return
        self._off_lock_logged.add(label)
        log.info(
            "domain %s: GPU %s runs at %.0f MHz while locked at %d MHz, with no clock "
            "event reason that explains it: taken as the driver's own clock for that lock "
            "(its clock steps, a bin %s), not written again (logged once per GPU)",
            self.domain,
            label,
            clock,
            held,
            "lower" if clock < held else "higher",
        )
