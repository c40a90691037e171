"""What a start reconciles from a previous run: the clock locks and power limits its state
file recorded on GPUs this config no longer governs, reset (each GPU call bounded)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from gpugov.daemon.backend import GpuBackend, power_limit_backend
from gpugov.daemon.config import GpugovConfig
from gpugov.daemon.deadline import CallTimeout, SerialCalls
from gpugov.daemon.emulated import EmulatedBackend, emulated_device_count
from gpugov.daemon.errors import GpugovError, GpuLost
from gpugov.daemon.gpu_hold import GpuHeld, held_for
from gpugov.daemon.gpu_open import open_backend
from gpugov.daemon.gpu_sampling import GPU_READ_DEADLINE_S
from gpugov.daemon.lockstate import LockState, gpu_key, left_by, live_writer, writer_pid_text
from gpugov.daemon.loop import ResetAdvice
from gpugov.daemon.power_limit import PowerLimitActuator
from gpugov.daemon.service import Assembled
from gpugov.plant.input_files import finite_number

# The service module's logger, not this one's: these lines were logged there and keep the
# name an operator's filters (and the log format's ``%(name)s``) know them by.
log = logging.getLogger("gpugov.daemon.service")


def reset_left_locks(
    config: GpugovConfig,
    assembled: Assembled,
    stop: threading.Event | None = None,
    *,
    deadline_s: float = GPU_READ_DEADLINE_S,
    advice: ResetAdvice | None = None,
) -> list[str]:
    """At start, after each domain's reconcile: reset the locks a previous run recorded
    (``locks.json``) on GPUs this config no longer governs (a domain's GPU taken out of
    the config after a crash). Reconcile sees only the configured GPUs, so such a GPU
    stayed locked low with nobody to reset it. A GPU is opened as the record names it and
    reset only when it is the recorded one (its UUID); a record whose writer still runs
    is left to it. One line each (logged); a reset that fails names the command to run.
    The power limits such a run recorded on those GPUs are restored the same way.

    Each GPU call (the open, its retries included; the reset; each power limit call) runs
    on the GPU's worker thread and is waited for at most ``deadline_s``, as the
    configured GPUs' reads and writes are: a hung NVML call costs the start that once, and
    the GPU is named as not reset, with the command to run: ``advice``'s (the config's
    backend and path; without them the command went to NVML, also for an emulated node).
    """
    advice = advice or ResetAdvice()
    state = assembled.state
    if state is None:
        return []
    ours = {gpu_key(backend) for backend in assembled.backends}
    lines: list[str] = []
    for key, entry in state.read().items():
        if key in ours or state.written_here(key) or live_writer(entry):
            continue
        named, backend, calls = _open_recorded(config, key, entry, stop, deadline_s)
        found = f"GPU {named} ({key}), not in this config: {left_by(entry)}"
        if isinstance(backend, Exception) and _emulator_lacks(config, named, calls):
            # Its lock lived in the emulator, which now has no such GPU (restarted with
            # fewer): the record was kept for good, its reset command refused (no GPU N).
            state.clear(key)
            line = (
                f"{found}; the emulator has no GPU {named} now (restarted with fewer "
                "GPUs), and its lock went with the old one; record dropped"
            )
        elif isinstance(backend, Exception):
            then = _lost_advice(backend) or _reset_command(advice, named)
            line = f"{found}; not reset ({backend}): {then}"
        else:
            try:
                if gpu_key(backend) != key and _by_index(key, entry, backend):
                    # Recorded by its index (a run through a backend without UUIDs, such
                    # as nvidia-smi), opened here by the same index: in one boot an index
                    # names one GPU (an earlier boot's entries are dropped), and it was
                    # left locked low with its record never cleared.
                    found = found.replace(
                        f"GPU {named} ({key}), not in this config",
                        f"GPU {named} (recorded by its index; {gpu_key(backend)})",
                    )
                    if gpu_key(backend) in ours:
                        # A domain governs it: its reconcile dealt with what the GPU
                        # showed, and a reset here would undo what that domain adopted.
                        state.clear(key)
                        line = f"{found}; governed by this config (its domain reconciled it)"
                    else:
                        line = _reset_unless_held(
                            config, state, key, gpu_key(backend), named, found, backend, calls
                        )
                elif gpu_key(backend) != key and gpu_key(backend) == backend.label:
                    # A backend without UUIDs (nvidia-smi): "GPU 0 is now 0" said nothing,
                    # and its reset-clocks would not clear an entry keyed by a UUID.
                    line = (
                        f"{found}; not reset: this backend gives no UUID to tell whether GPU "
                        f"{named} is the recorded one; run `gpugov reset-clocks --backend nvml "
                        f"--gpus {named}` as root (it clears the entry too)"
                    )
                elif gpu_key(backend) != key and isinstance(backend, EmulatedBackend):
                    # An emulated GPU's UUID follows its profile and index, and its lock
                    # lives in the emulator: one restarted with another profile has no
                    # recorded GPU and no lock on it. The record was kept for good, its
                    # line naming a reset no command can do.
                    state.clear(key)
                    line = (
                        f"{found}; GPU {named} is now {gpu_key(backend)}: the emulator was "
                        "restarted with other GPUs, and the recorded GPU's lock went with "
                        "it; record dropped"
                    )
                elif gpu_key(backend) != key:
                    line = (
                        f"{found}; not reset: GPU {named} is now {gpu_key(backend)}; run "
                        "`gpugov reset-clocks` on the recorded GPU"
                    )
                else:
                    line = _reset_unless_held(config, state, key, key, named, found, backend, calls)
            except (GpugovError, CallTimeout) as error:
                then = _lost_advice(error) or _reset_command(advice, named)
                line = f"{found}; reset FAILED ({error}): {then}"
            finally:
                _close_recorded(backend, calls)
        log.warning("reconcile: %s", line)
        lines.append(line)
    lines.extend(_restore_left_power_limits(config, state, ours, stop, deadline_s, advice))
    lines.extend(_power_limits_left_unrestored(config, state, assembled.backends, advice))
    return lines


def _reset_unless_held(
    config: GpugovConfig,
    state: LockState,
    key: str,
    uuid: str,
    named: str,
    found: str,
    backend: GpuBackend,
    calls: SerialCalls,
) -> str:
    """Reset the lock a previous run left on GPU ``uuid`` (recorded as ``key``: its UUID,
    or its index by a backend without UUIDs), held for the reset
    (:func:`daemon.gpu_hold.held_for`); the line. A GPU another gpugov governs now (a
    second daemon took it after the config dropped it) is left to it: its lock is that
    one's, and the reset would undo it. The entry is dropped either way."""
    try:
        with held_for(uuid, config.daemon.backend, named=named, emulator=config.daemon.emulator):
            calls.call(backend.reset_clocks)
    except GpuHeld as held:
        state.clear(key)
        return (
            f"{found}; not reset: another gpugov on this node governs it now "
            f"({held.holder}), and the lock is its own; record dropped"
        )
    state.clear(key)
    return f"{found}; reset"


def _by_index(key: str, entry: dict[str, Any], backend: GpuBackend) -> bool:
    """Whether a lock record entry keyed ``key`` names ``backend``'s GPU by its index: a
    run through a backend without UUIDs keys a GPU as its config names it, and an index
    is the GPU of that index in this boot."""
    named = str(entry.get("gpu", key))
    return key.isascii() and key.isdigit() and named == key and backend.label == key


def _power_limits_left_unrestored(
    config: GpugovConfig, state: LockState, backends: list[GpuBackend], advice: ResetAdvice
) -> list[str]:
    """The power limits a previous run recorded on GPUs this config governs through a
    backend that sets none (``nvidia-smi``, the split mode, an emulated node): no domain
    restores them, and they were passed over without a word. One line each with the
    command that restores them; the entry is kept for it."""
    lines: list[str] = []
    for backend in backends:
        key = gpu_key(backend)
        entry = state.get_power_limit(key)
        if (
            entry is None
            or power_limit_backend(backend) is not None  # its domain restores it
            or state.written_here(key, power_limit=True)
            or live_writer(entry)
        ):
            continue
        set_w = _watts(entry.get("set_mw"))
        before_w = _watts(entry.get("original_mw"))
        # Through NVML, with the config for its state directory (the record to restore).
        path = advice.config_path
        where = "" if path is None else f"--config {os.path.abspath(path)} "
        line = (
            f"GPU {backend.label} ({key}): a previous gpugov run ({writer_pid_text(entry)}, "
            f"{entry.get('time')}) set its power limit to {set_w} W, {before_w} W before; not "
            f'restored: backend = "{config.daemon.backend}" sets no power limit; run '
            f"`gpugov reset-clocks {where}--backend nvml --gpus {backend.label}` as root (it "
            f"restores the recorded limit) or `nvidia-smi -i {backend.label} -pl {before_w}`"
        )
        log.warning("reconcile: %s", line)
        lines.append(line)
    return lines


def _watts(milliwatts: object) -> str:
    """A recorded limit in milliwatts as whole watts, ``?`` where it is no number."""
    value = finite_number(milliwatts)
    return "?" if value is None else f"{value / 1000:.0f}"


def _open_recorded(
    config: GpugovConfig,
    key: str,
    entry: dict[str, Any],
    stop: threading.Event | None,
    deadline_s: float,
) -> tuple[str, GpuBackend | Exception, SerialCalls]:
    """A GPU a state file entry names: ``(its name, the opened backend or the error that
    kept it from opening, the worker its calls run on)``, the open waited for at most
    ``deadline_s``. An entry keyed by a UUID is opened by it through the backends that
    take one (NVML's), wherever the GPU is now, and named by its index now: opened by the
    index recorded, a GPU moved since (one before it taken off the node) was not found, or
    another GPU was, and it stayed locked."""
    named = str(entry.get("gpu", key))
    gpu: int | str = int(named) if named.isascii() and named.isdigit() else named
    if key.startswith(("GPU-", "MIG-")) and config.daemon.backend in UUID_BACKENDS:
        gpu = key
    calls = SerialCalls(deadline_s, name=f"left-{named}", cause="a hung GPU call")
    try:
        backend = calls.call(
            lambda: open_backend(
                gpu,
                config.daemon.backend,
                emulator=config.daemon.emulator,
                daemon=config.daemon,
                stop=stop,
            )
        )
    except (GpugovError, ValueError, CallTimeout) as error:  # ValueError: a split backend's usage
        return named, error, calls
    return (backend.label if gpu == key else named), backend, calls


UUID_BACKENDS = frozenset({"nvml", "actuator", "zeusd"})
"""The backends that open a GPU by its UUID (each reads it through NVML)."""


def _emulator_lacks(config: GpugovConfig, named: str, calls: SerialCalls) -> bool:
    """Whether the config's emulator answers with fewer GPUs than index ``named`` needs
    (False for another backend, a name that is no index, or an emulator that does not
    answer: that GPU may still be there and locked)."""
    if config.daemon.backend != "emulated" or not (named.isascii() and named.isdigit()):
        return False
    emulator = str(config.daemon.emulator)
    try:
        count = calls.call(lambda: emulated_device_count(emulator))
    except (GpugovError, CallTimeout, ValueError, KeyError, TypeError):
        return False
    return isinstance(count, int) and 0 <= count <= int(named)


def _close_recorded(backend: GpuBackend, calls: SerialCalls) -> None:
    """Close a GPU :func:`_open_recorded` opened, on its worker, waited for at most the
    deadline; one whose earlier call still hangs stays open (the process holds NVML)."""
    try:
        calls.call(backend.close)
    except CallTimeout as error:
        log.debug("GPU %s: not closed after the start's reset: %s", backend.label, error)


def _lost_advice(error: Exception, what: str = "lock") -> str | None:
    """What to do about a GPU a start could not reset (or restore) for ``error`` when it is
    lost: no command reaches it (a `gpugov reset-clocks` fails on it as the start did), and
    the driver reload or reboot it needs clears its ``what``; None for another error."""
    if not isinstance(error, GpuLost):
        return None
    return f"no command reaches a lost GPU: the driver reload or reboot it needs clears its {what}"


def _reset_command(advice: ResetAdvice, named: str) -> str:
    """``run `gpugov reset-clocks ...``` for GPU ``named``: with the config for a backend
    other than NVML (an emulated node's GPUs are not NVML's), NVML's the bare command."""
    if advice.backend == "nvml" or advice.config_path is None:
        return f"run `gpugov reset-clocks --gpus {named}`"
    return advice.command(named)


def _restore_left_power_limits(
    config: GpugovConfig,
    state: LockState,
    ours: set[str],
    stop: threading.Event | None,
    deadline_s: float,
    reset: ResetAdvice,
) -> list[str]:
    """The power limits a previous run recorded on GPUs this config no longer governs,
    restored as a governed GPU's are at its domain's reconcile (the limit it had before
    gpugov, unless someone changed it since); a GPU that is not the recorded one, or
    cannot be opened, is named with the command to run. One line each (logged); each GPU
    call is waited for at most ``deadline_s``."""
    lines: list[str] = []
    for key, entry in state.power_limits().items():
        if key in ours or state.written_here(key, power_limit=True) or live_writer(entry):
            continue
        named, backend, calls = _open_recorded(config, key, entry, stop, deadline_s)
        found = (
            f"GPU {named} ({key}), not in this config: a previous gpugov run set its power limit"
        )
        advice = f"{_reset_command(reset, named)} (it restores the recorded limit)"
        if isinstance(backend, Exception):
            then = _lost_advice(backend, "power limit") or advice
            line = f"{found}; not restored ({backend}): {then}"
        else:
            try:
                if gpu_key(backend) != key:
                    line = f"{found}; not restored: GPU {named} is now {gpu_key(backend)}; {advice}"
                elif power_limit_backend(backend) is None:
                    line = f"{found}; not restored: its backend sets no power limit; {advice}"
                else:
                    actuator = PowerLimitActuator(
                        [backend], domain="reconcile", state=state, write_deadline_s=deadline_s
                    )
                    # Its own line, logged by the actuator, says what it found and did.
                    lines.extend(actuator.reconcile())
                    continue
            finally:
                _close_recorded(backend, calls)
        log.warning("reconcile: %s", line)
        lines.append(line)
    return lines


__all__ = ["reset_left_locks"]
