"""``gpugov actuator``'s command line: its flags and their checks (before any GPU is
opened), the liveness probe (``--probe``), and the serving run around
:class:`~daemon.actuator_server.ActuatorServer` (``docs/actuator.md``).

Like the server, it loads the standard library, the NVML backend and the error tree only:
no HTTP client, no engine parsing, no controller, no numba, no pydantic (a test checks
what the actuator imports).
"""

from __future__ import annotations

import argparse
import functools
import logging
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

from gpugov.daemon.actuator_client import probe_actuator, socket_path_taken
from gpugov.daemon.actuator_server import (
    DEFAULT_MAX_LEASE_S,
    DEFAULT_MIN_RELOCK_S,
    DEFAULT_SOCKET,
    MIN_LEASE_S,
    ActuatorServer,
    resolve_uid,
)
from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.errors import ExitCode, GpugovError, PermissionDenied, printable
from gpugov.daemon.limits import GPU_UUID_PATTERN, MAX_GPU_INDEX, socket_path_too_long
from gpugov.daemon.log_lines import log_to_stderr, print_to_stderr
from gpugov.daemon.sd_notify import Watchdog, notify_systemd
from gpugov.daemon.start_retry import retry_transient
from gpugov.daemon.stop_signals import (
    STOP_SIGNALS,
    StopEvent,
    off_handler,
    set_from_handler,
    signal_name,
)

# The server's logger: one actuator, one name in its log lines.
log = logging.getLogger("gpugov.daemon.actuator_server")

DEFAULT_PROBE_TIMEOUT_S = 2.0
"""How long ``--probe`` waits for the actuator's answer by default."""


def _gpu_list(value: str) -> list[int | str]:
    """``--gpus``: ``all``, or NVML indices and GPU-/MIG- UUIDs separated by commas."""
    if value.strip() == "all":
        return ["all"]
    items: list[int | str] = []
    for part in value.split(","):
        part = part.strip()
        # ASCII digits only, as every --gpus (cli_support.parse_gpu_list): '٣' was GPU 3,
        # and '²' (a digit to isdigit(), none to int()) named a Python function.
        if part.isascii() and part.isdigit():
            if int(part) > MAX_GPU_INDEX:
                raise argparse.ArgumentTypeError(
                    f"GPU indices lie in [0, {MAX_GPU_INDEX}], got {part[:40]!r}"
                )
            items.append(int(part))
        elif part.startswith(("GPU-", "MIG-")) and _UUID.fullmatch(part):
            items.append(part)
        else:
            raise argparse.ArgumentTypeError(
                f"GPUs are NVML indices or GPU-/MIG- UUIDs separated by commas, got {part!r}"
            )
        if items[-1] in items[:-1]:
            raise argparse.ArgumentTypeError(f"GPU {items[-1]} is named twice")
    if not items:
        raise argparse.ArgumentTypeError("name at least one GPU")
    return items


_UUID = re.compile(GPU_UUID_PATTERN)
"""A GPU or MIG UUID as NVML prints it."""
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
"""A user name systemd accepts (a DynamicUser's included)."""
MAX_UID = 2**32 - 2
"""The highest uid (2**32 - 1 is the invalid uid)."""


def _allowed_user(value: str) -> str:
    """``--allow``: a uid in [0, 2**32 - 2] or a user name (looked up at each connection:
    a systemd DynamicUser exists only while its unit runs)."""
    if value.isascii() and value.isdigit():  # '٣' was uid 3, '²' a Python function's name
        if int(value) > MAX_UID:
            raise argparse.ArgumentTypeError(f"a uid lies in [0, {MAX_UID}], got {value[:40]!r}")
        return value
    if not _USER.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"a user name or a uid, got {value[:40]!r} (letters, digits, _ . -, at most 32)"
        )
    return value


def _socket_path(value: str) -> str:
    """``--socket``: an absolute path short enough for a Unix socket's address (its
    directory is checked before any GPU is opened, in :func:`run_actuator`)."""
    if not value.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise argparse.ArgumentTypeError(f"an absolute path, got {value[:60]!r}")
    too_long = socket_path_too_long(value)
    if too_long is not None:
        raise argparse.ArgumentTypeError(too_long)
    return value


def _seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type for a number of seconds within ``[low, high]`` (NaN refused)."""

    def parse(value: str) -> float:
        try:
            # A plain number, as every flag takes one (plant.input_files.plain_float, which
            # the actuator cannot import): float() reads '1_0' as 10 and '٣' as 3.
            if not value.isascii() or "_" in value:
                raise ValueError(value)
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a number of seconds, got {value!r}"
            ) from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be within {low:g}-{high:g} s, got {value!r}")
        return number

    return parse


def register(subparsers: Any) -> None:
    """Add ``gpugov actuator`` to the CLI."""
    parser = subparsers.add_parser(
        "actuator",
        help="serve clock locks to an unprivileged governor over a Unix socket (split mode)",
        description=(
            "The privileged half of the split mode: locks and resets SM clocks on the "
            "GPUs named by --gpus for the one user --allow names, as leases that end "
            "with the governor's connection (docs/actuator.md)."
        ),
    )
    parser.add_argument(
        "--gpus",
        type=_gpu_list,
        metavar="LIST",
        help=(
            "the GPUs it may lock: NVML indices or UUIDs, e.g. 0,1, or all (NVML's count); "
            "required unless --probe"
        ),
    )
    parser.add_argument(
        "--allow",
        type=_allowed_user,
        metavar="USER|UID",
        help="the governor's user name or uid (checked with SO_PEERCRED); required unless --probe",
    )
    parser.add_argument(
        "--socket",
        type=_socket_path,
        default=DEFAULT_SOCKET,
        metavar="PATH",
        help=f"the Unix socket to serve (default {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--max-lease-s",
        type=_seconds(MIN_LEASE_S, 600.0),
        default=DEFAULT_MAX_LEASE_S,
        metavar="S",
        help=f"the longest lease a governor may ask for (default {DEFAULT_MAX_LEASE_S:g})",
    )
    parser.add_argument(
        "--min-relock-s",
        type=_seconds(0.0, 10.0),
        default=DEFAULT_MIN_RELOCK_S,
        metavar="S",
        help=f"least time between two locks of one GPU (default {DEFAULT_MIN_RELOCK_S:g})",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help=(
            "check that an actuator serves --socket and answers within --probe-timeout "
            "(a liveness probe: exit 0, else 1 with one line); opens no GPU"
        ),
    )
    parser.add_argument(
        "--probe-timeout",
        type=_seconds(0.05, 60.0),
        default=DEFAULT_PROBE_TIMEOUT_S,
        metavar="S",
        help=f"how long --probe waits for the answer (default {DEFAULT_PROBE_TIMEOUT_S:g})",
    )
    parser.set_defaults(handler=run_actuator)


def _error(message: str) -> None:
    """Print one error line, escaped as every command's (``cli_support.fail``, which
    the actuator's lean import path leaves out)."""
    print_to_stderr(f"gpugov: error: {printable(message)}")


def run_actuator(args: argparse.Namespace) -> int:
    """``gpugov actuator``: open the GPUs, reset them, serve until a terminating signal,
    reset every lock on the way out; with ``--probe``, only check that one answers."""
    if args.probe:
        problem = probe_actuator(args.socket, args.probe_timeout)
        if problem is not None:
            _error(f"actuator: --socket {args.socket}: {problem}")
            return int(ExitCode.FAILURE)
        return int(ExitCode.OK)
    missing = [
        flag for flag, value in (("--gpus", args.gpus), ("--allow", args.allow)) if value is None
    ]
    if missing:
        _error(f"actuator: the following arguments are required: {', '.join(missing)}")
        return int(ExitCode.USAGE)
    from gpugov.daemon.nvml import NvmlBackend, nvml_device_count

    log_to_stderr(logging.INFO)
    stop: list[int] = []
    stopped = StopEvent()  # ends the open's retries at once

    def on_signal(signum: int, _frame: Any) -> None:
        # No lock taken here, a log line's included (daemon.stop_signals.set_from_handler).
        if stop:
            name = signal_name(signum)
            off_handler(functools.partial(log.warning, "received %s again; still stopping", name))
        else:
            set_from_handler(stopped)
        stop.append(signum)

    # The signals that stop `gpugov run` (SIGUSR1, SIGPWR or a real-time one killed the
    # actuator with the locks it served held): every lock is reset on the way out.
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        return _serve(args, stop, NvmlBackend, nvml_device_count, stopped=stopped)
    finally:
        # An in-process caller (a test, an embedding tool) gets its own handling back.
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(
    args: argparse.Namespace,
    stop: list[int],
    backend_type: Callable[[int], GpuBackend],
    device_count: Callable[[], int],
    *,
    stopped: threading.Event | None = None,
) -> int:
    """:func:`run_actuator` once its stop signals are caught (``stop`` collects them;
    ``stopped`` is set with the first, and ends the open's retries)."""
    taken = socket_path_taken(args.socket)  # before any GPU is opened (or reset)
    if taken is not None:
        _error(f"actuator: --socket {args.socket}: {taken}")
        return int(ExitCode.USAGE)
    watchdog = Watchdog()
    if (problem := watchdog.problem()) is not None:
        _error(f"actuator: {problem}")
        return int(ExitCode.USAGE)
    backends: list[GpuBackend] = []
    server: ActuatorServer | None = None
    try:
        # One NVML timeout while opening a GPU (the count, the handle, the clocks' list
        # and the max clock under it) is retried as `gpugov run`'s start retries it.
        gpus = args.gpus
        retry = functools.partial(retry_transient, stop=stopped)
        if gpus == ["all"]:
            gpus = list(range(retry(device_count, "count the GPUs")))
        for gpu in gpus:
            backend = retry(functools.partial(backend_type, gpu), f"GPU {gpu}: open")
            backends.append(backend)
            retry(backend.supported_clocks_mhz, f"GPU {gpu}: list supported clocks")
        server = ActuatorServer(
            backends,
            args.socket,
            args.allow,
            max_lease_s=args.max_lease_s,
            min_relock_s=args.min_relock_s,
        )
        server.reset_all("actuator start: no lease holds it")
        server.listen()
    except PermissionDenied:
        _error("the actuator needs root or CAP_SYS_ADMIN to lock clocks")
        return _close(backends, server, ExitCode.PERMISSION)
    except OSError as error:
        _error(f"{args.socket}: cannot serve: {error.strerror or error}")
        return _close(backends, server, ExitCode.USAGE)
    except GpugovError as error:
        _error(str(error))
        return _close(backends, server, ExitCode.NO_GPU)
    log.info(
        "serving GPUs %s on %s for %s",
        ", ".join(f"{label} ({g.min_mhz}-{g.max_mhz} MHz)" for label, g in server.gpus.items()),
        args.socket,
        args.allow,
    )
    if resolve_uid(args.allow) is None:
        log.warning(
            "user %r does not exist yet; connections are refused until it does (a systemd "
            "DynamicUser exists only while its unit runs)",
            args.allow,
        )
    notify_systemd("READY=1")
    try:
        server.serve(lambda: bool(stop), watchdog.progress)
    finally:
        notify_systemd("STOPPING=1")
    # SIGTERM (systemd's stop) is the normal stop; Ctrl-C ends it as it ends every
    # command, with 130 and one line, once every GPU is reset.
    interrupted = stop[:1] == [signal.SIGINT]
    code = _close(backends, server, ExitCode.INTERRUPTED if interrupted else ExitCode.OK)
    if code == ExitCode.NOT_RESET:
        _error("some GPUs could not be reset; see the log")
    elif interrupted:
        print_to_stderr("gpugov: interrupted; every GPU the actuator served was reset")
    return code


def _close(backends: list[GpuBackend], server: ActuatorServer | None, code: int) -> int:
    """Reset and close everything; ``code``, or 6 when a GPU could not be reset."""
    failed = server.close() if server is not None else []
    for backend in backends:
        backend.close()
    return int(ExitCode.NOT_RESET) if failed else int(code)
