"""A clock actuator's reconcile at start: the locks a previous run (its lock record) or
someone else (a GPU held below its top clock by ApplicationsClocksSetting) left on the
domain's GPUs, each reset or adopted, and said in one line per GPU."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Literal

from gpugov.daemon.backend import GpuBackend, GpuSample
from gpugov.daemon.clock_writer import UNKNOWN_LOCK, ClockWriter
from gpugov.daemon.errors import ConfigError, GpuError
from gpugov.daemon.lockstate import LockState, gpu_key, left_by, live_writer, writer_pid_text
from gpugov.daemon.readback import APPLICATIONS_CLOCKS_SETTING, LockReadback

# The clock actuator's logger, not this module's: these lines were logged there and keep
# the name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.actuator")

ReconcilePolicy = Literal["reset", "adopt"]


class LockReconcile:
    """The reconcile of :class:`~daemon.actuator.ClockActuator` (``docs/daemon.md``): what
    it finds on each GPU at start, reset or adopted. What it leaves governed (a lock
    adopted, a reset that failed) the actuator remembers, and its exit resets."""

    _backends: list[GpuBackend]
    _writers: dict[str, ClockWriter]
    _touched: set[str]
    _readback: LockReadback
    locked_mhz: dict[str, int | None]
    lock_mode: str
    state: LockState | None

    def reconcile(
        self,
        policy: ReconcilePolicy = "reset",
        *,
        dry_run: bool = False,
        read: Callable[[GpuBackend], GpuSample] | None = None,
        stop: threading.Event | None = None,
    ) -> list[str]:
        """At start: find locks a previous run (or someone else) left, reset or adopt them.

        A GPU counts as locked when the state file holds an entry for it written by
        another process, or when NVML shows ApplicationsClocksSetting among its clock
        event reasons while its SM clock is below the top supported clock (a lock below
        the top; a lock at the top is harmless and cannot be told from no lock).

        ``read`` reads a GPU (default: its sample on this thread; a node: its domain's
        read under its deadline, so a hung read leaves the clock unknown). Once ``stop`` is
        set the GPUs left are not read (:meth:`_left_to_the_exit`).

        Returns:
            One line per GPU saying what was found and done (also logged).
        """
        lines = []
        for backend in self._backends:
            if stop is not None and stop.is_set():
                lines.append(self._left_to_the_exit(backend, dry_run))
            else:
                lines.append(self._reconcile_one(backend, policy, dry_run, read))
        return lines

    def _left_to_the_exit(self, backend: GpuBackend, dry_run: bool) -> str:
        """A GPU the reconcile did not reach before a stop: not read, and reset by the exit
        (every GPU's at once, within the exit's budget), as the reconcile would have reset
        or adopted a lock it found (a reset where none is held changes nothing). Read and
        reset here one GPU after another, a hung driver cost the stop two deadlines a GPU,
        past a unit's stop timeout on eight GPUs. A GPU whose record names a gpugov that
        still runs is left to it."""
        label, key = backend.label, gpu_key(backend)
        entry = self.state.get(key) if self.state is not None else None
        found = "" if entry is None else f"{left_by(entry)}; "
        if entry is not None and live_writer(entry):
            line = (
                f"GPU {label}: not reconciled (stopped during the start): gpugov "
                f"{writer_pid_text(entry)} holds its lock and still runs"
            )
        elif dry_run:
            line = f"GPU {label}: {found}not reconciled (stopped during the start); dry run"
        else:
            self._touched.add(label)
            self.locked_mhz[label] = UNKNOWN_LOCK
            line = f"GPU {label}: {found}not reconciled (stopped during the start): reset at exit"
        log.warning("reconcile: %s", line)
        return line

    def _reconcile_one(
        self,
        backend: GpuBackend,
        policy: ReconcilePolicy,
        dry_run: bool,
        read: Callable[[GpuBackend], GpuSample] | None,
    ) -> str:
        label, key = backend.label, gpu_key(backend)
        entry = self.state.get(key) if self.state is not None else None
        if entry is not None and self.state is not None and self.state.written_here(key):
            entry = None  # our own (cannot happen at start; be safe)
        if entry is not None and live_writer(entry):
            # Its writer still runs: another daemon governs this GPU (its state directory's
            # hold was lost, say, the directory deleted under it). Resetting its live lock
            # would start a fight for the clock.
            state_file = getattr(self.state, "path", "locks.json")
            raise ConfigError(
                f"GPU {label}: gpugov {writer_pid_text(entry)} holds its clock lock "
                f"({state_file}) and is still running; stop it first"
            )
        try:
            sample: GpuSample | None = backend.sample() if read is None else read(backend)
        except GpuError as error:
            sample = None
            log.debug("GPU %s: reading clocks for reconcile failed: %s", label, error)
        top = max(backend.supported_clocks_mhz())
        clock = sample.sm_clock_mhz if sample is not None else None
        reasons = sample.clock_event_reasons if sample is not None else None
        seems_locked = (
            reasons is not None
            and bool(reasons & APPLICATIONS_CLOCKS_SETTING)
            and clock is not None
            and clock < top - self._readback.tolerance(backend)
        )
        now = f"{clock:.0f} MHz" if clock is not None else "unknown"
        low = entry.get("min_mhz") if entry is not None else None
        held = entry.get("max_mhz") if entry is not None else None
        if entry is not None:
            found = f"{left_by(entry)} (now {now} of {top} MHz)"
        elif seems_locked:
            found = f"it runs at {now} of {top} MHz with ApplicationsClocksSetting active: " + (
                # A dry run reads no lock record: a running gpugov's lock looks alike.
                "locked by someone else or a running gpugov (a dry run reads no record)"
                if dry_run
                else "locked by someone else or by a run that left no record"
            )
        else:
            line = f"GPU {label}: no lock found (SM clock {now} of {top} MHz)"
            log.info("reconcile: %s", line)
            return line
        if dry_run:
            line = f"GPU {label}: {found}; dry run: left as it is"
        elif policy == "adopt":
            self._touched.add(label)
            pin = held is not None and low == held and self.lock_mode == "pin"
            # The GPU above the recorded lock with no lock shown: it was reset since the
            # record (nvidia-smi -rgc, a driver reload). Taken as held, the readback read
            # the GPU's default clock as someone else's change (with "yield": the GPU
            # left ungoverned for the run); as unknown, the first decision is written.
            gone = (
                isinstance(held, int | float)
                and reasons is not None
                and not reasons & APPLICATIONS_CLOCKS_SETTING
                and clock is not None
                and clock > held + self._readback.tolerance(backend)
            )
            self.locked_mhz[label] = (
                int(held) if held is not None and pin and not gone else UNKNOWN_LOCK
            )
            if self.state is not None and low is not None and held is not None:
                self.state.record(key, label, int(low), int(held))
            line = f"GPU {label}: {found}; adopted: governed from here, reset on exit"
            if gone:
                line += (
                    " (no lock shown now, above the recorded one: taken as unknown, the "
                    "first decision written)"
                )
        else:
            writer = self._writers[label]
            try:
                writer.write(None)
            except GpuError as error:  # a reset that hangs too: tried again at exit
                writer.count_failure()
                self._touched.add(label)  # try again at exit
                self.locked_mhz[label] = UNKNOWN_LOCK
                line = f"GPU {label}: {found}; reset FAILED: {error}"
                log.error("reconcile: %s", line)
                return line
            if self.state is not None:
                self.state.clear(key)
            line = f"GPU {label}: {found}; reset"
        log.warning("reconcile: %s", line)
        return line


__all__ = ["LockReconcile", "ReconcilePolicy"]
