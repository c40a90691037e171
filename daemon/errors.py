"""The daemon's error tree, and the one table that maps NVML return codes onto it.

Every NVML failure becomes one of these in :func:`from_nvml` (chained ``from`` the
original), so nothing above ``daemon/nvml.py`` ever catches ``pynvml.NVMLError``.

* GpugovError -- base of everything the daemon raises on purpose.
    * GpuError -- a GPU call failed.
        * PermissionDenied -- locking clocks needs root or CAP_SYS_ADMIN.
            * PeerRefused -- the actuator or zeusd refused this governor.
        * NotSupported -- the GPU or driver lacks the feature.
        * GpuLost -- the GPU fell off the bus or needs a reset; not survivable.
        * GpuUnavailable -- no driver, no library, no such GPU: the daemon cannot start.
            * DriverGone -- the driver went away (unloaded, replaced) under a running loop.
        * TransientGpuError -- a read that may succeed next tick (timeout, no data, ...).
    * EngineUnavailable -- the engine's ``/metrics`` could not be fetched.
        * EngineParseError -- the page was fetched but is not Prometheus text.
    * ConfigError -- the config file is wrong; nothing was applied.
    * ControllerError -- a controller could not be built from its config.
    * ControllerFailure -- a controller raised while deciding (clocks were reset).
    * ClocksNotReset -- at exit, some GPUs' locks could not be reset, or their power
      limits restored (named).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Every gpugov command's exit status (``docs/daemon.md``, "Exit codes")."""

    OK = 0
    FAILURE = 1
    """A runtime failure (a controller failing in a row, an unreadable state)."""
    USAGE = 2
    """Bad input: a flag, a config, a trace, a profile, a recording."""
    PERMISSION = 3
    """Locking clocks needs root or CAP_SYS_ADMIN."""
    NO_GPU = 4
    """No driver, library, GPU or emulator; or the GPU lacks the feature."""
    GPU_LOST = 5
    """A GPU fell off the bus; the others' clocks were reset."""
    NOT_RESET = 6
    """Some GPUs' locks could not be reset at exit, or the power limits gpugov set not
    restored (named in the error line)."""
    INTERRUPTED = 130
    """Stopped by a signal (as a shell reports SIGINT)."""
    TERMINATED = 143
    """A study command stopped by SIGTERM (as a shell reports SIGTERM), after its cleanup
    (its worker processes ended, a profile's clocks reset)."""


PERMISSION_DENIED_MESSAGE = (
    "needs root or CAP_SYS_ADMIN to lock clocks; run with --dry-run to observe only"
)
NEEDS_PRIVILEGE_MESSAGE = "needs root or CAP_SYS_ADMIN; run with --dry-run to observe only"
"""The same for a write that is not a clock lock (a power limit needs that privilege too)."""
READ_PERMISSION_MESSAGE = (
    "NVML refused this user (no permission): it must be able to open the GPU's device files "
    "(/dev/nvidia*), for a dry run as for a run"
)
"""The same for a read (NVML's initialisation, a GPU's open, a clock list), where a dry
run, which reads as much, has nothing to offer."""
RESET_PERMISSION_MESSAGE = (
    "needs root or CAP_SYS_ADMIN to reset clocks: run `gpugov reset-clocks` as root, "
    "as gpugov.service's ExecStopPost= does"
)
"""The same for a clock reset, where a dry run has nothing to offer: the privilege, and
the command that has it (the unit runs it as root, with CAP_SYS_ADMIN)."""


_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories :func:`printable` escapes: control characters (C0, DEL, C1),
format characters (bidirectional overrides, zero-width spaces), lone surrogates (a file
name's undecodable bytes) and the line and paragraph separators."""

_JOINERS = frozenset({"\u200c", "\u200d"})
"""Format characters kept as they are: the zero-width (non-)joiner, part of ordinary
text in several scripts and of emoji sequences."""


LINE_CHARS = 4096
"""The most characters :func:`printable` gives back, so a line that quotes a 100 kB label
stays a line a terminal, journald or rsyslog (8 KiB a message) shows whole."""


def _shown(char: str) -> str:
    """One character as :func:`printable` writes it."""
    if unicodedata.category(char) in _ESCAPED_CATEGORIES and char not in _JOINERS:
        return repr(char)[1:-1]
    return char


def _fitting(chars: Iterable[str], room: int) -> list[str]:
    """``chars`` as :func:`printable` writes them, as many as fit in ``room`` characters."""
    pieces: list[str] = []
    size = 0
    for char in chars:
        piece = _shown(char)
        if size + len(piece) > room:
            break
        pieces.append(piece)
        size += len(piece)
    return pieces


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (each run of whitespace, newlines included, one
    space), or its type's name where it says nothing."""
    return " ".join(str(error).split()) or type(error).__name__


def printable(text: str) -> str:
    """``text`` safe for one line on a terminal or in a log: each character that would
    end the line or drive the terminal (a newline, a carriage return, the ESC of an escape
    sequence, a NUL, a bidirectional override) written as Python's ``repr`` writes it
    (``\\n``, ``\\r``, ``\\x1b``, ``\\x00``, ``\\u202e``); every other character, a
    backslash included, as it is, so an ordinary message prints unchanged.

    At most :data:`LINE_CHARS` characters come back: longer text keeps its start and its end, the
    middle written ``...[N characters left out]...`` (an escape is never cut in two).

    The one escaper of every ``gpugov:`` line that can hold a user's file name or value
    (``cli_support.fail`` and ``warn``), of every log line
    (:class:`gpugov.daemon.log_lines.LineFormatter`), and of the lines a command prints
    that quote an engine, a GPU or a file."""
    limit = LINE_CHARS
    if len(text) <= limit and text.isprintable():
        return text
    if len(text) <= limit:
        whole = "".join(map(_shown, text))
        if len(whole) <= limit:
            return whole
    # Each character is written as one character or more, so ``budget`` characters of
    # each end are all that can be kept.
    budget = max(0, limit - len(f"...[{len(text)} characters left out]..."))
    head = _fitting(text[: budget // 2], budget // 2)
    rest = text[len(head) :]
    tail = _fitting(reversed(rest[len(rest) - budget :]), budget - sum(map(len, head)))
    left_out = len(text) - len(head) - len(tail)
    return f"{''.join(head)}...[{left_out} characters left out]...{''.join(reversed(tail))}"


def error_lines(error: BaseException | str) -> list[str]:
    """The lines an error prints: a :class:`ConfigError`'s :attr:`~ConfigError.problems`
    one a line, else its message as one line (:func:`printable` keeps it one)."""
    if isinstance(error, ConfigError) and error.problems:
        return list(error.problems)
    return [str(error)]


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived during a long study command (``gpugov.cli``'s handler, and
    ``study/runners.py``'s while worker processes run): the command stops as Ctrl-C stops
    it (every ``KeyboardInterrupt`` cleanup runs, its worker processes are ended), then
    exits :attr:`ExitCode.TERMINATED` with one line (:meth:`line`)."""

    received = False
    """Set when one was raised in this process: a library that turns the exception into a
    plain ``KeyboardInterrupt`` on its way up (Ray's ``ray.get``) still ends as SIGTERM."""

    workers_ended = False
    """Set when it was raised while worker processes ran (their pool ends them)."""

    @classmethod
    def now(cls, *, workers: bool = False) -> Terminated:
        """The exception a SIGTERM handler raises, recorded in :attr:`received`
        (``workers``: raised while a pool's worker processes ran)."""
        cls.received = True
        cls.workers_ended = cls.workers_ended or workers
        return cls()

    @classmethod
    def caused(cls, stop: BaseException) -> bool:
        """Whether ``stop`` (a ``KeyboardInterrupt`` caught) came of a SIGTERM."""
        return isinstance(stop, cls) or cls.received

    @classmethod
    def forget(cls) -> None:
        """A command's start: no SIGTERM yet (one process can run several commands, as a
        test does)."""
        cls.received = False
        cls.workers_ended = False

    @classmethod
    def line(cls) -> str:
        """The one line a command stopped by SIGTERM ends with."""
        if cls.workers_ended:
            return "gpugov: terminated; its worker processes were ended"
        return "gpugov: terminated"


class GpugovError(Exception):
    """Base of every error the daemon raises on purpose."""


class GpuError(GpugovError):
    """A GPU call failed. ``code`` is the NVML return code when there is one."""

    def __init__(self, message: str, *, gpu: str | None = None, code: int | None = None) -> None:
        super().__init__(message)
        self.gpu = gpu
        self.code = code


class PermissionDenied(GpuError):
    """Locking or resetting clocks was refused: the process lacks root/CAP_SYS_ADMIN."""


class ReadRefused(PermissionDenied):
    """NVML refused a read, not a write: the user cannot open the GPU's device files."""


class PeerRefused(PermissionDenied):
    """The process that writes clocks for this one (``gpugov actuator``, zeusd) refused
    it: another user, a bad token, or that process lacks the privilege itself."""


class NotSupported(GpuError):
    """The GPU or driver does not support the call (pre-Volta, MIG, vGPU, old driver)."""


class GpuLost(GpuError):
    """The GPU fell off the bus or needs a reset; the daemon resets what it can and exits."""

    mid_run = False
    """Set when it was lost while the daemon governed (exit 5, the other GPUs reset);
    a GPU lost before, at the start or for a read-only command, is no usable GPU (4)."""
    other_gpus = 0
    """With ``mid_run``: how many other GPUs the daemon governed (and reset at exit)."""
    also_lost: tuple[str, ...] = ()
    """With ``mid_run``: those other GPUs the exit found lost too (not reset: none can be)."""


class GpuUnavailable(GpuError):
    """NVML cannot be used at all: no library, no driver, no such GPU."""


class GpuCallHung(GpuUnavailable):
    """A GPU call a command cannot go on without (opening a GPU at the start, a reset of
    ``gpugov reset-clocks``) has not returned within its deadline: a driver in trouble.
    The call goes on on its worker thread; NVML is not shut down under it."""

    @classmethod
    def after(cls, what: str, wait_s: float, gpu: int | str | None = None) -> GpuCallHung:
        """The one line for a call that did not answer in ``wait_s``, naming ``gpu``
        (``GPU 1: open: no answer within 20 s (a hung GPU call: a driver in trouble)``)."""
        where = "" if gpu is None else f"GPU {gpu}: "
        return cls(
            f"{where}{what}: no answer within {wait_s:.3g} s (a hung GPU call: a driver in "
            "trouble)",
            gpu=None if gpu is None else str(gpu),
        )


class DriverGone(GpuUnavailable):
    """A read or write of a running loop got an NVML code of :data:`DRIVER_GONE_CODES`:
    the driver was unloaded or replaced under the daemon (not "no driver on this machine")."""

    @classmethod
    def from_unavailable(cls, error: GpuUnavailable) -> DriverGone:
        """``error`` (raised after the loop started) said as what happened; raise it ``from``."""
        said = str(error).removesuffix(f": {NO_DRIVER_HINT}")
        return cls(
            f"{said}: the NVIDIA driver went away or was replaced (unloaded, or upgraded) "
            "while gpugov ran",
            gpu=error.gpu,
            code=error.code,
        )


class TransientGpuError(GpuError):
    """A failure that may not repeat next tick; counted and survived."""


class EngineUnavailable(GpugovError):
    """The engine's metrics endpoint could not be fetched (refused, timeout, HTTP error)."""


class EngineParseError(EngineUnavailable):
    """The endpoint answered with text that is not Prometheus exposition format."""


class EngineHttpError(EngineUnavailable):
    """The endpoint answered, with an HTTP error status (500, 404, ...) and no page."""


class ConfigError(GpugovError):
    """The configuration is invalid; the message names the file, field path and reason.

    ``problems``: each problem's line where the file has several (the message is them
    joined by newlines); printed one a line (:func:`error_lines`)."""

    def __init__(self, message: str, *, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class ControllerError(GpugovError):
    """A controller could not be built (missing plan file, unknown profile, ...)."""


class ControllerFailure(GpugovError):
    """A controller raised while deciding; the loop stopped and the clocks were reset."""


class ClocksNotReset(GpugovError):
    """At exit some GPUs' clock locks could not be reset (retried, where a retry can help).

    ``gpus`` lists their labels; the message names them and the command to run.
    """

    def __init__(self, message: str, *, gpus: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.gpus = gpus


# NVML return code -> error class. Codes not listed map to GpuError. Values are the
# NVML_ERROR_* constants of nvml.h (stable across driver branches).
NVML_ERROR_MAP: dict[int, type[GpuError]] = {
    1: GpuUnavailable,  # UNINITIALIZED
    2: GpuError,  # INVALID_ARGUMENT: a bug or an unsupported clock pair
    3: NotSupported,  # NOT_SUPPORTED
    4: PermissionDenied,  # NO_PERMISSION
    6: GpuUnavailable,  # NOT_FOUND (no such GPU index/UUID)
    8: TransientGpuError,  # INSUFFICIENT_POWER
    9: GpuUnavailable,  # DRIVER_NOT_LOADED
    10: TransientGpuError,  # TIMEOUT
    11: TransientGpuError,  # IRQ_ISSUE
    12: GpuUnavailable,  # LIBRARY_NOT_FOUND
    13: NotSupported,  # FUNCTION_NOT_FOUND (driver too old for the symbol)
    14: GpuError,  # CORRUPTED_INFOROM
    15: GpuLost,  # GPU_IS_LOST
    16: GpuLost,  # RESET_REQUIRED
    17: PermissionDenied,  # OPERATING_SYSTEM ("the operating system has blocked the request")
    18: GpuUnavailable,  # LIB_RM_VERSION_MISMATCH
    19: TransientGpuError,  # IN_USE
    20: TransientGpuError,  # MEMORY
    21: TransientGpuError,  # NO_DATA
    23: TransientGpuError,  # INSUFFICIENT_RESOURCES
    24: NotSupported,  # FREQ_NOT_SUPPORTED
    26: NotSupported,  # DEPRECATED
    27: TransientGpuError,  # NOT_READY
    28: GpuLost,  # GPU_NOT_FOUND (vanished after discovery)
    999: TransientGpuError,  # UNKNOWN: counted; repeated failures surface as staleness
}

FUNCTION_NOT_FOUND = 13

NO_DRIVER_CODES = frozenset({9, 12})
"""NVML's DRIVER_NOT_LOADED and LIBRARY_NOT_FOUND: this machine has no NVIDIA driver."""

NVML_ERROR_INVALID_ARGUMENT = 2
"""NVML's code for an invalid argument (a GPU index the node does not have, a minimum
clock above the maximum, a power limit that is no number of watts)."""
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
"""NVML's code for handles of a driver that was replaced: one of the driver-gone codes."""
DRIVER_GONE_CODES = frozenset({1, 6, 9, 12, 18})
"""UNINITIALIZED, NOT_FOUND, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH:
at the start, no driver (or no such GPU); from a running loop, the driver went away."""

NO_DRIVER_HINT = (
    "no NVIDIA driver on this machine; without a GPU, run `gpugov emulate` and use its "
    'GPUs (--backend emulated --emulator URL, or backend = "emulated" in the config)'
)
"""Appended to an NVML error of :data:`NO_DRIVER_CODES`: where a command goes on a machine
without a GPU (a workstation, CI), instead of a bare "NVML Shared Library Not Found"."""


NVML_ERROR_FREQ_NOT_SUPPORTED = 24
FREQ_REFUSED_HINT = (
    "the driver refuses that SM clock (FREQ_NOT_SUPPORTED), though the GPU lists it "
    "(nvmlDeviceGetSupportedGraphicsClocks)"
)
"""Appended to a clock lock NVML refuses as a frequency it does not support: the GPU locks
clocks (the hint that it cannot lock any sent the operator to a dry run), not that one."""
CANNOT_LOCK_HINT = (
    "this GPU or its driver does not lock SM clocks (nvmlDeviceSetGpuLockedClocks needs a "
    "Volta or newer GPU, and some boards and virtual GPUs refuse it): gpugov cannot govern "
    "it; `gpugov run --dry-run` observes it"
)
"""Appended to a clock lock NVML refuses as not supported: NVML's "Not Supported" alone
did not say that no lock will ever go through on that GPU, nor what is left to do."""


def from_nvml(error: Any, action: str, *, gpu: str | None = None) -> GpuError:
    """Translate a ``pynvml.NVMLError`` into the daemon's tree (raise it ``from error``).

    Args:
        error: the NVML exception; its ``.value`` is the return code.
        action: what was being done, e.g. ``"lock clocks"``; goes into the message.
        gpu: the GPU label for the message.
    """
    code = getattr(error, "value", None)
    kind = NVML_ERROR_MAP.get(code, GpuError) if isinstance(code, int) else GpuError
    where = f"GPU {gpu}: " if gpu is not None else ""
    if kind is PermissionDenied and not action.startswith(("lock", "reset", "set")):
        # A read (initialise, open, count, list, read): the advice to lock with root or to
        # observe with --dry-run sent a user whose dry run was refused to run one again.
        return ReadRefused(
            f"{where}{action}: {READ_PERMISSION_MESSAGE} (NVML code {code})", gpu=gpu, code=code
        )
    if kind is PermissionDenied:
        needs = PERMISSION_DENIED_MESSAGE if "clock" in action else NEEDS_PRIVILEGE_MESSAGE
        if action.startswith("reset") and "clock" in action:
            needs = RESET_PERMISSION_MESSAGE
        message = f"{where}{action}: {needs}"
    else:
        message = f"{where}{action} failed: {error} (NVML code {code})"
        if code in NO_DRIVER_CODES:
            message = f"{message}: {NO_DRIVER_HINT}"
        elif kind is NotSupported and action.startswith("lock clocks"):
            # FREQ_NOT_SUPPORTED refuses that clock, not every lock.
            hint = FREQ_REFUSED_HINT if code == NVML_ERROR_FREQ_NOT_SUPPORTED else CANNOT_LOCK_HINT
            message = f"{message}: {hint}"
    return kind(message, gpu=gpu, code=code)
