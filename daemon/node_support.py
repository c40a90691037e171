"""What the node commands (:mod:`daemon.node_cli`, :mod:`daemon.status_cli`) share: their
errors as one line and the documented exit code, and the GPU backend a command reads."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from gpugov.daemon.addresses import emulator_url
from gpugov.daemon.cli_support import UsageError, fail
from gpugov.daemon.config import DaemonSection, GpugovConfig
from gpugov.daemon.deadline import CallTimeout, SerialCalls
from gpugov.daemon.errors import (
    PERMISSION_DENIED_MESSAGE,
    ClocksNotReset,
    ConfigError,
    ControllerError,
    DriverGone,
    ExitCode,
    GpuCallHung,
    GpugovError,
    GpuLost,
    GpuUnavailable,
    NotSupported,
    PeerRefused,
    PermissionDenied,
    ReadRefused,
)
from gpugov.daemon.log_lines import print_to_stderr
from gpugov.daemon.nvidia_smi import run_command
from gpugov.daemon.nvml import load_pynvml, nvml_device_count
from gpugov.daemon.record import RecordingError

T = TypeVar("T")

GPU_CALL_DEADLINE_S = 2.0
"""How long a read-only command (``check-config``, ``status``) waits for one GPU call
that does not initialise NVML (a sample, the clocks' list, the power limits, a close):
the loop's :data:`~daemon.gpu_sampling.GPU_READ_DEADLINE_S`. The calls that do (listing
the GPUs, opening one) wait ``run``'s start's
:data:`~daemon.gpu_open.GPU_OPEN_DEADLINE_S`."""


def gpu_calls(gpu: int | str) -> SerialCalls:
    """A worker thread for one GPU's calls, in order (:func:`bounded_gpu_call`)."""
    return SerialCalls(GPU_CALL_DEADLINE_S, name=f"gpu-{gpu}", cause="a hung GPU call", idle_s=0.0)


def bounded_gpu_call(
    target: Callable[[], T],
    what: str,
    deadline_s: float,
    *,
    gpu: int | str | None = None,
    calls: SerialCalls | None = None,
) -> T:
    """``target()`` on ``calls``' worker thread (a new one by default), waited for at most
    ``deadline_s``: a call hung in a driver in trouble ends a command in one line naming
    the GPU (``GPU 1: open: no answer within 20 s (a hung GPU call: a driver in
    trouble)``), as ``run``'s start does. The hung call goes on on its daemon thread (the
    process's exit does not wait for it); no other starts on ``calls`` until it returns.

    Raises:
        GpuCallHung: no answer within ``deadline_s`` (a GpuUnavailable: exit 4).
        Exception: what ``target`` raised.
    """
    calls = calls or gpu_calls("all" if gpu is None else gpu)
    try:
        return calls.call(target, deadline_s)
    except CallTimeout:
        raise GpuCallHung.after(what, deadline_s, gpu) from None


def guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the daemon's errors into one clear line and the documented exit code."""

    @functools.wraps(handler)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except PeerRefused as error:  # the actuator's or zeusd's own words
            return fail(error, ExitCode.PERMISSION)
        except ReadRefused as error:  # its own words: the action refused, no dry run
            return fail(error, ExitCode.PERMISSION)
        except PermissionDenied:
            print_to_stderr(f"gpugov: {PERMISSION_DENIED_MESSAGE}")
            return ExitCode.PERMISSION
        except GpuLost as error:
            return fail(gpu_lost_line(error), exit_code(error) or ExitCode.GPU_LOST)
        except DriverGone as error:
            # Had a GPU not been reset, the exit would have raised ClocksNotReset (6).
            return fail(f"{error}; every clock gpugov locked was reset", ExitCode.NO_GPU)
        except Exception as error:
            code = exit_code(error)
            if code is None:
                raise
            return fail(error, code)

    return wrapped


def gpu_lost_line(error: GpuLost) -> str:
    """The line a node command ends with for a lost GPU (``run``'s, and ``check-config``'s
    for the same GPU): lost while governed, the others were reset (exit 5); lost before
    (or for a read-only command), nothing of ours was locked: no usable GPU (exit 4)."""
    reset = error.other_gpus - len(error.also_lost)
    if not error.mid_run:
        after = "no usable GPU"
    elif error.also_lost:  # lost together (a baseboard's GPUs): none can be reset
        after = f"GPU(s) {', '.join(error.also_lost)} lost too"
        if reset:
            after += f"; the other {reset} GPU(s)' clocks were reset"
    elif reset == 1:
        after = "the other GPU's clock was reset"
    elif reset:
        after = f"the other {reset} GPUs' clocks were reset"
    else:
        after = "it was the only GPU governed"
    return f"{error}; {after}"


def exit_code(error: BaseException) -> int | None:
    """The documented exit code of an error a node command reports in one line (None: an
    error that is not one of the daemon's)."""
    from gpugov.plant.profile import ProfileError
    from gpugov.plant.workload import TraceError

    if isinstance(error, ClocksNotReset):
        return ExitCode.NOT_RESET
    if isinstance(error, PermissionDenied):
        return ExitCode.PERMISSION
    if isinstance(error, GpuLost):
        return ExitCode.GPU_LOST if error.mid_run else ExitCode.NO_GPU
    if isinstance(error, GpuUnavailable | NotSupported):
        return ExitCode.NO_GPU
    if isinstance(
        error,
        ConfigError | ControllerError | RecordingError | UsageError | TraceError | ProfileError,
    ):
        return ExitCode.USAGE
    if isinstance(error, GpugovError):
        return ExitCode.FAILURE
    return None


def backend_choice(
    backend: str | None, emulator: str | None, config: GpugovConfig | None
) -> tuple[str, str | None]:
    """The GPU backend (and emulator URL) a command uses: the flags', else the config's
    (``daemon.backend``, ``daemon.emulator``), else NVML.

    Raises:
        UsageError: ``emulated`` without an emulator URL, or an URL that is not http://.
    """
    kind = backend or (config.daemon.backend if config is not None else "nvml")
    url = emulator or (config.daemon.emulator if config is not None else None)
    if emulator is not None and kind != "emulated":
        raise UsageError(f"--emulator applies to the emulated backend, not {kind}")
    if kind == "emulated" and not url:
        raise UsageError(
            "--backend emulated needs --emulator URL (or --config FILE with "
            'backend = "emulated" and emulator = ...)'
        )
    try:
        emulator_url(url)
    except ValueError as error:  # the config's was checked as it was read
        raise UsageError(f"--emulator {error}") from None
    return kind, url if kind == "emulated" else None


NVIDIA_SMI_LIST_TIMEOUT_S = 30.0
"""nvidia-smi's timeout for listing the GPUs when the caller gives none."""


def gpu_lister(kind: str) -> str:
    """Who lists backend ``kind``'s GPUs (:func:`gpu_indices`), for a line on a node where
    it lists none: the emulator, nvidia-smi, else NVML (the split backends read through
    it)."""
    return {"emulated": "the emulator", "nvidia-smi": "nvidia-smi"}.get(kind, "NVML")


def gpu_indices(
    kind: str, emulator: str | None, nvml: Any = None, timeout_s: float | None = None
) -> list[int]:
    """Every GPU the backend sees: NVML's count, the emulator's, or nvidia-smi's list.
    ``timeout_s``: how long the caller waits for it (what is left of its budget), which
    nvidia-smi is given as its own timeout: the child is killed when the caller stops
    waiting, not left running to :data:`NVIDIA_SMI_LIST_TIMEOUT_S`.

    Raises:
        GpuUnavailable: no driver, no nvidia-smi, or no emulator answering.
    """
    if kind == "emulated":
        from gpugov.daemon.emulated import emulated_device_count

        return list(range(emulated_device_count(str(emulator))))
    if kind == "nvidia-smi":
        timeout = NVIDIA_SMI_LIST_TIMEOUT_S if timeout_s is None else max(timeout_s, 0.1)
        out = run_command(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], timeout)
        return [int(line) for line in out.split() if line.strip().isdigit()]
    return list(range(nvml_device_count(nvml if nvml is not None else load_pynvml())))


def write_path_status(daemon: DaemonSection) -> tuple[bool, str]:
    """Whether the clock writes of a split backend (``actuator``, ``zeusd``) get through:
    ``(True, "actuator SOCKET: answers; serves GPUs ...; lease ... s")`` (or ``"zeusd
    WHERE: answers"``), else ``(False, why)`` (not answering, or refusing this user)."""
    try:
        if daemon.backend == "actuator":
            from gpugov.daemon.actuator_client import ActuatorClient

            client = ActuatorClient(str(daemon.actuator.socket), timeout_s=1.0)
            try:
                served = client.request({"op": "held"})  # connects with hello first
            finally:
                client.close()
            gpus = ", ".join(g.get("gpu", "?") for g in client.gpus) or "none"
            lease = served.get("lease_s")
            return True, (
                f"actuator {daemon.actuator.socket}: answers; serves GPUs {gpus}; lease {lease} s"
            )
        if daemon.zeusd is not None:
            from gpugov.daemon.zeusd import ZeusdClient

            zeusd = ZeusdClient.from_config(daemon.zeusd)
            zeusd.timeout_s = 1.0
            zeusd.call("GET", "/discover")
            return True, f"zeusd {zeusd.where}: answers"
        return False, f"backend {daemon.backend!r} has no write path to check"
    except GpugovError as error:
        return False, str(error)
