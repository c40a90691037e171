"""Opening a domain's GPUs at the start, and checking the opened GPUs against the config:
the backends (NVML, nvidia-smi, the emulator, the split actuator or zeusd) with the start's
retries and deadline, and the refusals ``run`` and ``check-config`` share (no clock in
common, a configured clock the GPUs cannot run, a GPU the actuator does not serve, a power
cap the backend cannot set, one GPU named in two domains). ``reset-clocks``, ``status``
and ``profile`` open their GPUs through :func:`open_backend` too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from gpugov.controllers.contract import layers
from gpugov.daemon.backend import DryRunBackend, GpuBackend, unwrapped
from gpugov.daemon.config import DaemonSection
from gpugov.daemon.controller_config import ControllerConfig, FixedControllerConfig
from gpugov.daemon.controller_spec import spec_name
from gpugov.daemon.deadline import CallTimeout, SerialCalls
from gpugov.daemon.emulated import EmulatedBackend, call_timeout_s
from gpugov.daemon.errors import (
    NVML_ERROR_INVALID_ARGUMENT,
    ConfigError,
    GpuCallHung,
    GpugovError,
    GpuUnavailable,
    NotSupported,
    TransientGpuError,
)
from gpugov.daemon.nvidia_smi import NvidiaSmiBackend
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.start_retry import START_ATTEMPTS, retry_transient
from gpugov.plant.types import PowerCapping

GPU_OPEN_DEADLINE_S = 20.0
"""The longest one call opening a configured GPU at the start may take (nvmlInit, the
handle, UUID and name, the clocks' list; each try of the retries). Longer than the
loop's :data:`~daemon.gpu_sampling.GPU_READ_DEADLINE_S`: the first ``nvmlInit`` on a node
without persistence mode brings every GPU up, which takes seconds (``nvidia-smi`` is as
slow there), and a healthy start must not be taken for a hung one. Only a call that
hangs in the driver reaches it, well inside the unit's ``TimeoutStartSec=`` (120 s)."""


def open_backend(
    gpu: int | str,
    kind: str = "nvml",
    *,
    dry_run: bool = False,
    nvml: ModuleType | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    emulator: str | None = None,
    daemon: DaemonSection | None = None,
    stop: threading.Event | None = None,
    deadline_s: float | None = None,
) -> GpuBackend:
    """One GPU's backend (``nvml``, ``nvidia-smi`` or ``emulated`` at ``emulator``),
    wrapped for a dry run if asked.

    Transient NVML errors while opening the GPU and listing its clocks are retried
    (:func:`retry_transient`; ``stop`` set ends the retries). With ``deadline_s`` (a
    node's start) each try runs on a worker thread and is waited for at most that long,
    as the loop's GPU calls are: a call that hangs in the driver (nvmlInit, the handle,
    the clocks' list) is :class:`~daemon.errors.GpuCallHung`, not a start that never
    ends; it is not retried (a retry would queue behind it).

    Raises:
        GpuUnavailable: no driver, library or GPU (or no emulator answering);
            GpuCallHung: a call past ``deadline_s`` (the backend, if it opened, is left
            open: NVML is not shut down under a hung call).
        TransientGpuError: still failing after the retries.
    """
    calls = (
        None
        if deadline_s is None
        else SerialCalls(deadline_s, name=f"open-{gpu}", cause="a hung GPU call", idle_s=0.0)
    )

    def bounded(target: Callable[[], Any], what: str) -> Any:
        if calls is None:
            return target()
        try:
            return calls.call(target)
        except CallTimeout:
            raise GpuCallHung.after(what, calls.deadline_s, gpu) from None

    def open_one() -> GpuBackend:
        if kind in ("actuator", "zeusd"):
            return open_split_backend(gpu, kind, daemon or DaemonSection(), nvml=nvml)
        if kind == "emulated":
            return EmulatedBackend(
                gpu,
                emulator=emulator or "http://127.0.0.1:8000",
                timeout_s=call_timeout_s((daemon or DaemonSection()).period_s),
            )
        if kind == "nvidia-smi":
            return NvidiaSmiBackend(gpu)
        return NvmlBackend(gpu, nvml=nvml)

    try:
        backend: GpuBackend = retry_transient(
            lambda: bounded(open_one, "open"), f"GPU {gpu}: open", sleep=sleep, stop=stop
        )
    except TransientGpuError as error:
        if kind != "emulated" or (stop is not None and stop.is_set()):
            raise
        # An emulator that never answered is no GPU at start (exit 4), as documented;
        # one that was still starting answered one of the tries.
        raise GpuUnavailable(f"{error} (tried {START_ATTEMPTS} times)", gpu=str(gpu)) from error
    try:
        retry_transient(
            lambda: bounded(backend.supported_clocks_mhz, "list supported clocks"),
            f"GPU {gpu}: list supported clocks",
            sleep=sleep,
            stop=stop,
        )
    except GpuCallHung:
        raise  # left open: closing it would shut NVML down under the hung call
    except GpugovError:  # transient after the retries, or no clocks at all
        backend.close()
        raise
    return DryRunBackend(backend) if dry_run else backend


NO_SUCH_GPU_CODES = frozenset({NVML_ERROR_INVALID_ARGUMENT, 6})
"""NVML's codes for opening a GPU the node does not have: INVALID_ARGUMENT (an index past
the last GPU, as the emulator answers too) and NOT_FOUND (a UUID no GPU has)."""


def open_domain_gpu(domain: str, gpu: int | str, kind: str, **options: Any) -> GpuBackend:
    """:func:`open_backend` for one GPU a domain's ``gpus`` lists (``options``: its keyword
    arguments): ``run`` and ``check-config`` open them alike, and a GPU the node does not
    have is said naming the domain and its ``gpus`` (the line named the GPU alone, on a
    node of several domains).

    Raises:
        GpuUnavailable, GpuCallHung, TransientGpuError, ...: as :func:`open_backend`.
    """
    try:
        return open_backend(gpu, kind, **options)
    except GpuUnavailable as error:
        if not isinstance(error, GpuCallHung) and error.code in NO_SUCH_GPU_CODES:
            error.args = (f"domain {domain!r}: gpus: {error}",)
        raise


def open_split_backend(
    gpu: int | str, kind: str, daemon: DaemonSection, *, nvml: ModuleType | None = None
) -> GpuBackend:
    """One GPU read through NVML (unprivileged) and written through ``gpugov actuator``
    (``kind = "actuator"``) or zeusd (``"zeusd"``), as ``daemon`` configures them."""
    reader = NvmlBackend(gpu, nvml=nvml)
    try:
        if kind == "actuator":
            from gpugov.daemon.actuator_client import ActuatorBackend, shared_client

            section = daemon.actuator
            client = shared_client(
                str(section.socket), lease_s=section.lease_s, timeout_s=section.timeout_s
            )
            return ActuatorBackend(reader, client)
        from gpugov.daemon.zeusd import ZeusdBackend, shared_zeusd_client

        if daemon.zeusd is None:
            raise ConfigError('backend = "zeusd" needs a [daemon.zeusd] table with socket or url')
        return ZeusdBackend(reader, shared_zeusd_client(daemon.zeusd))
    except BaseException:
        reader.close()
        raise


def no_common_clock(name: str, backends: Sequence[GpuBackend]) -> NotSupported:
    """The refusal of a domain whose GPUs list no supported SM clock in common, in the
    one line ``run`` and ``check-config`` both give (they gave two wordings)."""
    return NotSupported(
        f"domain {name!r}: its GPUs ({', '.join(b.label for b in backends)}) have no "
        "supported SM clock in common; clock locking is not possible"
    )


def check_configured_clocks(
    name: str, floor_mhz: float | None, spec: ControllerConfig, clocks: Sequence[float]
) -> None:
    """Refuse a clock the domain's config sets that its GPUs cannot run (``clocks``: their
    supported clocks, ascending): ``safety.floor_mhz`` above the top one, a ``fixed``
    controller's ``clock_mhz`` outside their range (it was locked at the nearest end in
    silence, where ``simulate`` and ``replay`` refuse it). ``run`` and ``check-config``
    both refuse through this, in one line.

    Raises:
        ConfigError: naming the domain, the field and the GPUs' clocks.
    """
    if not clocks:
        return
    if floor_mhz is not None and floor_mhz > clocks[-1]:
        raise ConfigError(
            f"domain {name!r}: safety.floor_mhz ({floor_mhz:g} MHz) is above the top "
            f"supported clock of its GPUs ({clocks[-1]:g} MHz)"
        )
    if isinstance(spec, FixedControllerConfig) and not clocks[0] <= spec.clock_mhz <= clocks[-1]:
        raise ConfigError(
            f"domain {name!r}: controller.clock_mhz ({spec.clock_mhz:g} MHz) is outside the "
            f"supported clocks of its GPUs ({clocks[0]:g}-{clocks[-1]:g} MHz)"
        )


def check_actuator_serves(domain: str, backends: Sequence[GpuBackend]) -> None:
    """Refuse a domain's GPU that the actuator (``backend = "actuator"``) does not serve
    (not in its ``--gpus``), when it answers now (else the domain holds its fail-safe until
    it does): the first lock of that GPU was refused, and ``run`` exited 6 on a GPU it never
    locked. The GPU is matched as it is named on the wire: its UUID, else its index.

    Raises:
        ConfigError: naming the domain, the GPU and the GPUs the actuator serves.
    """
    from gpugov.daemon.actuator_client import ActuatorBackend

    for backend in backends:
        inner = unwrapped(backend)
        if not isinstance(inner, ActuatorBackend):
            return
        try:
            if inner.client.check() is not None:
                return  # not answering now: the write path's problem, said elsewhere
        except GpugovError:
            return
        served = [gpu for gpu in inner.client.gpus if isinstance(gpu, dict)]
        names = {str(gpu[key]) for gpu in served for key in ("gpu", "uuid") if gpu.get(key)}
        if str(getattr(inner, "uuid", None) or inner.label) in names:
            continue
        labels = [str(gpu.get("gpu", "?")) for gpu in served]
        serves = f"GPU{'s' if len(labels) != 1 else ''} {', '.join(labels)}" if labels else "none"
        raise ConfigError(
            f"domain {domain!r}: GPU {backend.label} is not one the actuator at "
            f"{inner.client.path} serves (it serves {serves}); add it to gpugov actuator "
            "--gpus, or leave it out of the domain"
        )


def check_power_capping(
    name: str, spec: ControllerConfig, controller: Any, *, can_set: bool
) -> None:
    """Refuse a built controller that sets a GPU power cap (its algorithm is
    :class:`~gpugov.plant.types.PowerCapping`: a cap kind, or an outside controller that
    has a ``requested_power_cap_w``) on GPUs whose backend cannot set a power limit
    (``can_set`` False). ``run`` and ``check-config`` both refuse through this, in one
    line (``check-config`` said OK to an outside controller that ``run`` refused).

    Raises:
        ConfigError: naming the domain and the controller.
    """
    if not can_set and isinstance(layers(controller)[-1], PowerCapping):
        raise ConfigError(
            f"domain {name!r}: controller {spec_name(spec)!r} sets a GPU power "
            "limit, which this domain's GPU backend cannot set (only nvml can); use "
            'backend = "nvml", or a controller that sets only the clock'
        )


def gpu_uuid(backend: GpuBackend) -> str:
    """A GPU's UUID (NVML), else its label: what a learned model is keyed by. A dry run
    shows its GPU's UUID, so it keys a model as a locking run does."""
    return str(getattr(backend, "uuid", None) or backend.label)


def check_opened_once(
    opened: dict[str, tuple[str, str]], backend: GpuBackend, domain: str, named: str
) -> None:
    """Refuse a GPU the config names twice in two spellings (an index in one domain, its
    UUID in another; two MIG devices of it, each opened as the whole GPU): the config's
    own check compares the spellings, this the UUIDs.

    Raises:
        ConfigError: naming both domains and both spellings.
    """
    uuid = getattr(backend, "uuid", None)
    if not uuid:
        return
    uuid = str(uuid)
    if uuid in opened:
        first_domain, first_named = opened[uuid]
        if first_domain == domain:  # "which domain 'a' names ..., one domain" said nothing
            raise ConfigError(
                f"domain {domain!r}: GPU {named} is {uuid}, which it names as GPU "
                f"{first_named} too; name each GPU once"
            )
        raise ConfigError(
            f"domain {domain!r}: GPU {named} is {uuid}, which domain "
            f"{first_domain!r} names as GPU {first_named}; a GPU belongs to one domain"
        )
    opened[uuid] = (domain, named)


def gpu_names(backends: Sequence[GpuBackend]) -> list[str]:
    """The GPUs' NVML names ("" for one that reports none; a dry run shows its GPU's)."""
    return [str(getattr(b, "name", "") or "") for b in backends]
