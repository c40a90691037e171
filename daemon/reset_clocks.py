"""``gpugov reset-clocks``: remove SM clock locks GPU by GPU (or all at once through
nvidia-smi) and restore a power limit a run left, every GPU call bounded by one budget so
that a Kubernetes preStop hook or a unit's ``ExecStopPost=`` always ends. Registered by
:mod:`daemon.node_cli`."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpugov.daemon.backend import power_limit_backend
from gpugov.daemon.cli_support import UsageError, fail, parse_gpu_list
from gpugov.daemon.config import load_config
from gpugov.daemon.deadline import CallTimeout, SerialCalls
from gpugov.daemon.errors import (
    RESET_PERMISSION_MESSAGE,
    ClocksNotReset,
    ConfigError,
    ExitCode,
    GpuCallHung,
    GpuError,
    GpugovError,
    GpuUnavailable,
    PermissionDenied,
    TransientGpuError,
    printable,
)
from gpugov.daemon.gpu_open import open_backend
from gpugov.daemon.node_support import backend_choice, gpu_indices, gpu_lister, guarded
from gpugov.daemon.nvidia_smi import CommandTimedOut, run_command
from gpugov.plant.input_files import finite_number

log = logging.getLogger("gpugov")

EXIT_OK = ExitCode.OK
EXIT_PERMISSION = ExitCode.PERMISSION
EXIT_NOT_RESET = ExitCode.NOT_RESET

RESET_ATTEMPTS = 4
RESET_BACKOFF_S = 0.25
RESET_CALL_DEADLINE_S = 2.0
"""How long ``gpugov reset-clocks`` waits for one GPU call (a reset, a power limit call,
the clocks' list): the loop's GPU deadline (``CLOCK_WRITE_DEADLINE_S``). A call past it
hangs in a driver in trouble; it is not retried (a retry would queue behind it). The
calls that initialise NVML (listing the GPUs, opening one) may take what is left of
:data:`RESET_BUDGET_S`: with no daemon holding NVML on a node without persistence mode,
``nvmlInit`` brings every GPU up, which takes seconds."""
RESET_BUDGET_S = 10.0
"""The longest ``gpugov reset-clocks`` spends on GPU calls, every GPU's together: a
preStop hook's time comes out of the pod's ``terminationGracePeriodSeconds`` (45 s),
and the daemon's own exit at SIGTERM needs the rest (its 20 s budget and last writes);
once it is spent, the GPUs left are named as not reset, not tried."""


_STATE_LOCK = threading.Lock()
"""Held while a GPU's reset reads, changes and writes the lock record: the GPUs are reset
on threads of their own, and each writes the whole file."""


class _ResetBudget:
    """The time left to a ``reset-clocks`` command's GPU calls, from when it was made."""

    def __init__(
        self, budget_s: float | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self.budget_s = RESET_BUDGET_S if budget_s is None else budget_s
        self._clock = clock or time.monotonic
        self._ends_s = self._clock() + self.budget_s

    def wait_s(self) -> float:
        """How long the next GPU call may be waited for (0: the budget is spent)."""
        return min(RESET_CALL_DEADLINE_S, self.left_s())

    def left_s(self) -> float:
        """What is left of the budget: what a call that initialises NVML (listing the
        GPUs, opening one) may be waited for."""
        return max(0.0, self._ends_s - self._clock())

    def spent_line(self) -> str:
        return f"not tried: reset-clocks' {self.budget_s:g} s for its GPU calls is spent"


def _reset_one(
    gpu: int | str,
    backend_kind: str,
    sleep: Callable[[float], Any],
    emulator: str | None = None,
    daemon: Any = None,
    budget: _ResetBudget | None = None,
    say: Callable[[str], Any] = print,
) -> str | None:
    """Reset one GPU's SM clock lock, retrying transient errors; None or the error text.
    ``say`` prints a line on stdout (a power limit restored), or keeps it for the caller.
    ``daemon`` is the config's ``[daemon]`` (the actuator's socket, zeusd's address, the
    state directory whose lock record is cleared).

    Each GPU call (the open, the reset, the power limit restore's) runs on a worker thread
    and is waited for at most :data:`RESET_CALL_DEADLINE_S`, or what is left of
    ``budget``: a hung driver costs the command that, never a preStop hook that does not
    end. A GPU whose call hangs is not retried, nor closed (NVML is not shut down under
    the hung call)."""
    budget = budget or _ResetBudget()
    calls = SerialCalls(
        RESET_CALL_DEADLINE_S, name=f"reset-{gpu}", cause="a hung GPU call", idle_s=0.0
    )
    error: Exception | None = None
    for attempt in range(RESET_ATTEMPTS):
        wait_s = budget.left_s()  # nvmlInit: seconds on a node without persistence mode
        if wait_s <= 0.0:
            return str(error) if error is not None else budget.spent_line()
        try:
            backend = open_backend(
                gpu, backend_kind, sleep=sleep, emulator=emulator, daemon=daemon, deadline_s=wait_s
            )
        except (GpuError, UsageError) as failure:
            error = failure
        else:
            hung = False
            try:
                try:
                    wait_s = budget.wait_s()
                    if wait_s <= 0.0:
                        return budget.spent_line()
                    calls.call(backend.reset_clocks, wait_s)
                    _forget_lock(backend, getattr(daemon, "state_dir", None))
                    error = None
                except CallTimeout:
                    hung = True
                    return str(GpuCallHung.after("reset clocks", wait_s, gpu))
                except GpuError as failure:
                    error = failure
                # A power limit a run recorded is restored whether or not the clock reset
                # went through (a restore done once leaves no record to redo).
                left, hung = _restore_left_power_limit(
                    backend, getattr(daemon, "state_dir", None), budget, say
                )
                if error is None:
                    return None if left is None else PowerLimitLeft(left)
            finally:
                if not hung:
                    _close_reset(backend, calls, budget)
        if not isinstance(error, TransientGpuError) or attempt + 1 == RESET_ATTEMPTS:
            break
        sleep(RESET_BACKOFF_S * 2**attempt)
    return str(error)


class PowerLimitLeft(str):
    """What :func:`_reset_one` gives for a GPU whose clock lock was reset but whose power
    limit a gpugov run set is left (why, with the command that restores it)."""


def _close_reset(backend: Any, calls: SerialCalls, budget: _ResetBudget) -> None:
    """Close a GPU :func:`_reset_one` opened, on its worker, waited for at most what the
    budget allows; one that does not answer stays open (the process's exit releases it)."""
    try:
        calls.call(backend.close, max(budget.wait_s(), 0.1))
    except CallTimeout as error:
        log.debug("GPU %s: not closed after its reset: %s", backend.label, error)


def _listed(kind: str, emulator: str | None, budget: _ResetBudget) -> list[int]:
    """:func:`gpu_indices` on a worker thread, waited for at most what ``budget`` allows.

    Raises:
        ClocksNotReset: the listing hangs (exit 6: the GPUs may still be locked): NVML's
            past the budget, or an emulator that accepts and does not answer in time.
        GpuUnavailable: as :func:`gpu_indices`.
    """
    wait_s = budget.left_s()  # nvmlInit: seconds on a node without persistence mode
    calls = SerialCalls(max(wait_s, 0.1), name="reset-list", cause="a hung GPU call", idle_s=0.0)
    try:
        return calls.call(lambda: gpu_indices(kind, emulator, timeout_s=max(wait_s, 0.1)))
    except CallTimeout:
        raise ClocksNotReset(
            f"{GpuCallHung.after('list the GPUs', wait_s)}; no GPU was reset and they may still "
            "be locked: run `gpugov reset-clocks` (or `nvidia-smi -rgc`) again once the "
            "driver answers"
        ) from None
    except GpuCallHung as hung:  # a stopped or hung emulator: exit 6 as a hung NVML, not 4
        raise ClocksNotReset(
            f"{hung}; no GPU was reset and they may still be locked: run `gpugov "
            "reset-clocks` again once it answers"
        ) from None


def _reset_all_nvidia_smi(budget: _ResetBudget) -> None:
    """``nvidia-smi --reset-gpu-clocks`` (every GPU), within ``budget``: the command's
    own timeout is what is left of it, and it runs on a worker thread waited for as long
    (a child that hangs in the driver outlives its kill: ``subprocess`` then waits for it
    with no deadline). It had its own 30 s, three times the command's budget.

    Raises:
        ClocksNotReset: no answer in time, or nvidia-smi failed to reset (a GPU it cannot
            reset, one lost, ...): exit 6, the GPUs may still be locked.
        PermissionDenied: nvidia-smi said so (exit 3, as NVML's refusals).
        GpuUnavailable: no nvidia-smi or no driver here (exit 4, no GPU could be listed).
    """
    wait_s = budget.left_s()  # nvidia-smi initialises NVML: seconds without persistence mode
    argv = ["nvidia-smi", "--reset-gpu-clocks"]
    calls = SerialCalls(max(wait_s, 0.1), name="reset-all", cause="a hung GPU call", idle_s=0.0)
    try:
        calls.call(lambda: run_command(argv, max(wait_s, 0.1)))
    except (CallTimeout, CommandTimedOut):
        raise ClocksNotReset(
            f"{GpuCallHung.after(' '.join(argv), wait_s)}; the GPUs may still be locked: run "
            "`gpugov reset-clocks` (or `nvidia-smi -rgc`) again once the driver answers"
        ) from None
    except (PermissionDenied, GpuUnavailable):
        raise
    except GpuError as error:  # a non-zero exit: it said why (a GPU it cannot reset, ...)
        # Before, exit 1 and no word that the GPUs may still be locked.
        raise ClocksNotReset(
            f"{error}; the GPUs may still be locked: `gpugov reset-clocks --backend "
            "nvidia-smi --gpus 0,1,...` resets and names each"
        ) from error


def _require_present(
    chosen: list[int | str], kind: str, emulator: str | None, budget: _ResetBudget | None = None
) -> None:
    """Refuse GPU indices the node does not have (exit 4, as for no GPU at all), where
    they read as GPUs that 'may still be locked' (exit 6). A node whose GPUs cannot be
    listed is left to the resets to report; one whose listing hangs ends the command
    (exit 6).

    Raises:
        GpuUnavailable: such an index.
        ClocksNotReset: the listing hangs.
    """
    try:
        present = _listed(kind, emulator, budget or _ResetBudget())
    except ClocksNotReset:
        raise
    except GpugovError:
        return
    missing = [str(gpu) for gpu in chosen if isinstance(gpu, int) and gpu not in present]
    if missing:
        have = f"0-{len(present) - 1}" if present else "none"
        raise GpuUnavailable(f"--gpus: no GPU {', '.join(missing)} on this node (it has {have})")


def _forget_lock(backend: Any, configured: Any = None) -> None:
    """Remove the GPU from the daemon's lock state file, if there is one: in the config's
    ``state_dir`` (``configured``), else systemd's ``$STATE_DIRECTORY``."""
    from gpugov.daemon.deadline import EXIT_WRITE_WAIT_S
    from gpugov.daemon.files import resolve_state_dir
    from gpugov.daemon.lockstate import STATE_FILE, LockState, NewerLockRecord, gpu_key

    directory = resolve_state_dir(configured)
    if directory is not None and (directory / STATE_FILE).exists():
        # The clock is reset: the record's write may take a slow disk's time, and a
        # write still running when this process ends would be lost.
        with _STATE_LOCK:  # each GPU's reset clears its entry from a thread of its own
            try:
                state = LockState(directory, write_deadline_s=EXIT_WRITE_WAIT_S)
            except NewerLockRecord:  # left as it is; cmd_reset_clocks says so
                return
            state.clear(gpu_key(backend))


def _restore_left_power_limit(
    backend: Any,
    configured: Any = None,
    budget: _ResetBudget | None = None,
    say: Callable[[str], Any] = print,
) -> tuple[str | None, bool]:
    """Restore the power limit a gpugov run set on the GPU and recorded in the lock state
    file (``configured``'s, else ``$STATE_DIRECTORY``), as a start's reconcile does; one
    line on stdout when one was found. ``(None, hung)``, or the error text when the
    restore failed; ``hung``: a power limit call has not returned (the GPU is not to be
    closed). Each call is waited for at most :data:`RESET_CALL_DEADLINE_S` or what is left
    of ``budget``. A run still holding it is left to restore it on its own way out."""
    from gpugov.daemon.deadline import EXIT_WRITE_WAIT_S
    from gpugov.daemon.files import resolve_state_dir
    from gpugov.daemon.lockstate import STATE_FILE, LockState, NewerLockRecord
    from gpugov.daemon.power_limit import PowerLimitActuator

    directory = resolve_state_dir(configured)
    if directory is None or not (directory / STATE_FILE).exists():
        return None, False
    if power_limit_backend(backend) is None:
        return _left_unrestored(backend, directory), False
    budget = budget or _ResetBudget()
    wait_s = budget.wait_s()
    if wait_s <= 0.0:
        return f"its power limit {budget.spent_line()}", False
    with _STATE_LOCK:  # the record is read, changed and written whole: one GPU at a time
        try:
            state = LockState(directory, write_deadline_s=EXIT_WRITE_WAIT_S)
        except NewerLockRecord:  # its power limits are not this gpugov's to read
            return None, False
        actuator = PowerLimitActuator(
            [backend], domain="reset-clocks", state=state, write_deadline_s=wait_s
        )
        try:
            lines = actuator.reconcile()
        except ConfigError as running:
            say(f"{running}; it restores the power limit on its own way out")
            return None, False
    hung = bool(actuator.hanging_writes)
    for line in lines:
        say(line.replace("a previous gpugov run", "a gpugov run", 1))
        if "restore FAILED" in line:
            return line.split("restore FAILED: ", 1)[1], hung
    return None, hung


def _left_unrestored(backend: Any, directory: Path) -> str | None:
    """Why a power limit a run recorded on the GPU is not restored through ``backend``,
    which sets none (the split mode's, an emulated node's), or None where none is
    recorded: a reset said done (exit 0) with the GPU left capped."""
    from gpugov.daemon.lockstate import LockState, NewerLockRecord, gpu_key, live_writer

    with _STATE_LOCK:
        try:
            entry = LockState(directory).get_power_limit(gpu_key(backend))
        except NewerLockRecord:
            return None
    if entry is None or live_writer(entry):
        return None
    before = finite_number(entry.get("original_mw"))
    watts = "?" if before is None else f"{before / 1000:.0f}"
    return (
        f"its power limit, which a gpugov run set ({watts} W before), is not restored: this "
        f"backend sets no power limit; run `gpugov reset-clocks --config FILE --backend nvml "
        f"--gpus {backend.label}` as root, or `nvidia-smi -i {backend.label} -pl {watts}`"
    )


def _reset_together(
    gpus: list[int | str], kind: str, emulator: str | None, daemon: Any, budget: _ResetBudget
) -> list[tuple[str | None, list[str]]]:
    """:func:`_reset_one` of every GPU at once, one thread each, within ``budget``: GPUs
    whose calls hang cost the command one deadline together, and cannot spend the budget
    before a healthy GPU after them is tried (reset one after another, five hung GPUs
    left the rest "not tried", still locked). Per GPU, in order: its error (None: reset)
    and the lines it has for stdout, printed by the caller so the output keeps the GPUs'
    order."""
    from gpugov.daemon.deadline import EXIT_WRITE_WAIT_S

    outcomes: dict[int, tuple[str | None, list[str]]] = {}

    def one(position: int, gpu: int | str) -> None:
        said: list[str] = []
        try:
            error = _reset_one(gpu, kind, time.sleep, emulator, daemon, budget, said.append)
        except Exception as failure:  # the thread's outermost edge: reported as not reset
            error = str(failure) or type(failure).__name__
        outcomes[position] = (error, said)

    threads = [
        threading.Thread(target=one, args=(i, gpu), name=f"gpugov-reset-{gpu}", daemon=True)
        for i, gpu in enumerate(gpus)
    ]
    for thread in threads:
        thread.start()
    # Every GPU call is bounded by the budget; a lock record's write by its own wait.
    ends_s = time.monotonic() + budget.left_s() + EXIT_WRITE_WAIT_S
    for thread in threads:
        thread.join(max(0.0, ends_s - time.monotonic()))
    late: tuple[str | None, list[str]] = (
        f"no outcome within reset-clocks' {budget.budget_s:g} s",
        [],
    )
    return [outcomes.get(i, late) for i in range(len(gpus))]


@guarded
def cmd_reset_clocks(args: argparse.Namespace) -> int:
    """``gpugov reset-clocks``: remove SM clock locks, trying every GPU and reporting each,
    through the backend the flags or the config name (NVML by default); a power limit a
    gpugov run set and recorded in the state directory is restored as well.

    Exit 0 when every GPU was reset, 3 when permission was denied, 6 when any GPU could
    not be reset (each is named with its error; ``nvidia-smi --reset-gpu-clocks`` that
    fails or hangs, every GPU; a listing that hangs, NVML's or a stopped emulator's), 4
    when no GPU could be listed at all (no driver, no emulator running, a backend that
    lists none) or a --gpus index
    names one the node does not have, 2 when all were reset but the lock record is a newer
    gpugov's (named, and left as it is: neither cleared nor its power limits restored).
    """
    chosen = parse_gpu_list(args.gpus, allow_all=True)
    config = load_config(args.config) if args.config else None
    kind, emulator = backend_choice(args.backend, args.emulator, config)
    if chosen is None and kind == "nvidia-smi":
        try:
            _reset_all_nvidia_smi(_ResetBudget())
        except PermissionDenied as refused:  # exit 3 as NVML's refusals, named not reset
            return fail(
                f"{refused}; no GPU was reset and they may still be locked", EXIT_PERMISSION
            )
        print("all GPUs: SM clock locks reset (nvidia-smi)")
        return EXIT_OK
    named = [str(gpu) for gpu in chosen or () if isinstance(gpu, str)]
    if kind == "emulated" and named:
        # Read as a GPU that "may still be locked" (exit 6): no emulated GPU has a UUID name.
        raise UsageError(
            f"--gpus {', '.join(named)}: an emulated GPU is named by its index (0, 1, ...)"
        )
    budget = _ResetBudget()  # every GPU call of the command: a preStop hook always ends
    gpus: list[int | str] = list(_listed(kind, emulator, budget)) if chosen is None else chosen
    if not gpus:  # read as every GPU reset (exit 0, no line)
        raise GpuUnavailable(f"{gpu_lister(kind)} lists no GPU on this node; nothing was reset")
    if chosen is not None:  # every backend; the split ones (actuator, zeusd) list by NVML
        _require_present(chosen, kind, emulator, budget)
    from gpugov.daemon.files import resolve_state_dir
    from gpugov.daemon.lockstate import newer_record

    newer = newer_record(resolve_state_dir(config.daemon.state_dir if config else None))
    failed: dict[str, str] = {}
    capped: list[str] = []  # clock reset, a power limit gpugov set left
    outcomes = _reset_together(gpus, kind, emulator, config.daemon if config else None, budget)
    for gpu, (error, said) in zip(gpus, outcomes, strict=True):
        for line in said:
            print(line)
        if error is None or isinstance(error, PowerLimitLeft):
            print(f"GPU {gpu}: SM clock lock reset")
        if isinstance(error, PowerLimitLeft):
            capped.append(str(gpu))
            print(printable(f"GPU {gpu}: power limit NOT restored: {error}"), file=sys.stderr)
        elif error is not None:
            failed[str(gpu)] = error
            reason = error.removeprefix(f"GPU {gpu}: ")  # "GPU 1: NOT reset: GPU 1: ..." was
            print(printable(f"GPU {gpu}: NOT reset: {reason}"), file=sys.stderr)
    if newer is not None:  # the clocks are reset all the same: they need no record
        fail(newer)
    if capped and not failed:  # every clock reset: not 'they may still be locked'
        return fail(
            f"{len(capped)} of {len(gpus)} GPU(s) keep a power limit gpugov set: "
            f"{', '.join(capped)}; they may still be capped",
            EXIT_NOT_RESET,
        )
    if not failed:
        return EXIT_OK if newer is None else int(ExitCode.USAGE)
    # Refused everywhere is exit 3, but the GPUs may be as locked as after any other
    # failure (the line said nothing of it): every failed reset's line says so.
    denied = all(RESET_PERMISSION_MESSAGE in error for error in failed.values())
    names = ", ".join(failed)
    return fail(
        f"{len(failed)} of {len(gpus)} GPU(s) not reset: {names}; they may still be locked",
        EXIT_PERMISSION if denied else EXIT_NOT_RESET,
    )
