"""A fake ``pynvml`` module: the real function names, constants and ``NVMLError`` codes.

``FakeNvml`` instances stand in for the module (``NvmlBackend(0, nvml=fake)``). The error
classes mirror nvidia-ml-py exactly: ``NVMLError(code)`` returns an instance of the
generated subclass for that code (``NVMLError_NoPermission``, ``NVMLError_GpuIsLost``...),
and each subclass can be raised without arguments.

A GPU in MIG mode lists its MIG devices' UUIDs (``FakeGpu.mig_uuids``); a MIG handle
answers only its UUID, name and parent (:class:`FakeMigDevice`).

Failure injection: ``permission=False`` (setters raise NO_PERMISSION), ``lose(index)``
(every call on that GPU raises GPU_IS_LOST), ``fail(function, code, times)`` (the next
``times`` calls raise; ``times=None`` for always), ``flaky(function, code)`` (every
other call raises, the first included), ``remove(function)`` (the binding has the name
but the driver lacks the symbol: FUNCTION_NOT_FOUND), and per-GPU
``field_power_supported``. Writes are recorded in ``writes`` as
``(function_name, index, *args)``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

# ----------------------------------------------------------------- constants (pynvml)
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_POWER_INSTANT = 186
NVML_POWER_SCOPE_GPU = 0
NVML_POWER_SCOPE_MODULE = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonSwThermalSlowdown = 0x20

_ERROR_STRINGS = {
    # pynvml's own table (NVMLError._errcode_to_string), word for word: what a real
    # NVMLError says for these codes, the driver's library loaded or not.
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}
"""pynvml's messages. A code outside its table (IN_USE, NO_DATA, and every code from 22
on) is asked of the driver's ``nvmlErrorString``, text nvidia-ml-py does not hold; without
a library to ask, pynvml says "NVML Error with code N", as the fake does."""


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` is an instance of the subclass for ``code``."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - mirrors pynvml

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value  # type: ignore[attr-defined]
        return obj

    def __init__(self, *args: Any) -> None:
        super().__init__()

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")  # type: ignore[attr-defined]


def _generate_error_classes() -> None:
    """The same naming rule as pynvml's ``_extractNVMLErrorsAsClasses``."""
    for err_name, err_val in list(globals().items()):
        if not err_name.startswith("NVML_ERROR_"):
            continue
        class_name = "NVMLError_" + string.capwords(
            err_name.replace("NVML_ERROR_", ""), "_"
        ).replace("_", "")

        def gen_new(val: int) -> Any:
            def new(typ: type, *args: Any) -> NVMLError:
                return NVMLError.__new__(typ, val)

            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        globals()[class_name] = cls
        NVMLError._valClassMapping[err_val] = cls


_generate_error_classes()


# ------------------------------------------------------------------------- structs
@dataclass
class _Value:
    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass
class FieldValue:
    """Stands in for ``c_nvmlFieldValue_t``."""

    fieldId: int
    scopeId: int = 0
    timestamp: int = 0
    latencyUsec: int = 0
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    nvmlReturn: int = NVML_SUCCESS
    value: _Value = field(default_factory=_Value)


@dataclass
class Utilization:
    """Stands in for ``c_nvmlUtilization_t``."""

    gpu: int
    memory: int


@dataclass
class FakeGpu:
    """One fake GPU's state (H100-like defaults)."""

    index: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    power_mw: int = 350_000
    average_power_mw: int = 340_000
    energy_mj: int = 1_000_000
    temperature_c: int = 55
    sm_clock_mhz: int = 1980
    utilization_pct: int = 80
    event_reasons: int = 0
    power_limit_mw: int = 700_000
    power_limit_min_mw: int = 200_000
    power_limit_max_mw: int = 700_000
    memory_clocks_mhz: tuple[int, ...] = (2619,)
    graphics_clocks_mhz: tuple[int, ...] = tuple(range(1980, 344, -15))  # descending, as NVML
    field_power_supported: bool = True
    module_power_mw: int | None = None
    """A Grace-Hopper module's power: its instant power field answers NOT_SUPPORTED at GPU
    scope and this at MODULE scope (None: a discrete board, GPU scope only)."""
    max_clock_mhz: int | None = None
    """The highest SM clock the board runs at (``nvmlDeviceGetMaxClockInfo``); None: the
    top listed clock. A GeForce or power-limited board lists graphics clocks above it."""
    locked: tuple[int, int] | None = None
    lost: bool = False
    lock_error: int | None = None
    """An NVML code every clock lock of this GPU alone raises (None: locks go through)."""
    slowdown_temperature_c: int | None = 87
    """Where the GPU slows itself (``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``); None: the
    threshold read answers NOT_SUPPORTED."""
    mig_uuids: tuple[str, ...] = ()
    """The UUIDs of its MIG devices (``MIG-...``), for a GPU in MIG mode: each opens by
    ``nvmlDeviceGetHandleByUUID`` as a :class:`FakeMigDevice` of this GPU."""

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-fake-{self.index:04d}"
        if self.max_clock_mhz is not None:  # it idles unlocked at its own top clock
            self.sm_clock_mhz = min(self.sm_clock_mhz, self.max_clock_mhz)

    def top_clock_mhz(self) -> int:
        """The highest SM clock it runs at: its max clock, else the top listed one."""
        listed = max(self.graphics_clocks_mhz)
        return listed if self.max_clock_mhz is None else min(listed, self.max_clock_mhz)


@dataclass
class FakeMigDevice:
    """A MIG device handle: a slice of ``parent``. As on real GPUs its UUID, its name and
    its parent answer; a device call (clocks, power, temperature, locks) answers
    NOT_SUPPORTED, the clocks being the whole GPU's (its parent's handle)."""

    parent: FakeGpu
    uuid: str

    @property
    def index(self) -> int:
        """The parent's index (the fault harness keys failures by it)."""
        return self.parent.index

    @property
    def lost(self) -> bool:
        """Lost with its parent."""
        return self.parent.lost


MIG_HANDLE_CALLS = frozenset(
    {
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    }
)
"""The calls the fake answers for a MIG device handle; every other one is NOT_SUPPORTED."""


class FakeNvml:
    """A stand-in for the ``pynvml`` module (see the module docstring)."""

    def __init__(self, gpus: int | list[FakeGpu] = 1, *, permission: bool = True) -> None:
        self.gpus = [FakeGpu(index=i) for i in range(gpus)] if isinstance(gpus, int) else gpus
        self.permission = permission
        self.initialized = 0
        self.driver_loaded = True
        self.writes: list[tuple[Any, ...]] = []
        self.calls: dict[str, int] = {}
        self._failures: dict[str, list[Any]] = {}
        self._flaky: dict[str, list[int]] = {}
        self._removed: set[str] = set()
        # Expose constants and error classes like the module does.
        for key, value in globals().items():
            if key.startswith(("NVML_", "NVMLError", "nvmlClocksEventReason")):
                setattr(self, key, value)

    # ------------------------------------------------------------ failure injection
    def fail(self, function: str, code: int, times: int | None = 1) -> None:
        """Make the next ``times`` calls of ``function`` raise ``code`` (None: always)."""
        self._failures[function] = [code, times]

    def flaky(self, function: str, code: int) -> None:
        """Make every other call of ``function`` raise ``code``, starting with the next."""
        self._flaky[function] = [code, 0]

    def clear_failures(self) -> None:
        """Remove every injected failure."""
        self._failures.clear()
        self._flaky.clear()

    def remove(self, function: str) -> None:
        """The driver lacks ``function``: calls raise FUNCTION_NOT_FOUND."""
        self._removed.add(function)

    def lose(self, index: int) -> None:
        """GPU ``index`` falls off the bus."""
        self.gpus[index].lost = True

    def _enter(self, function: str, handle: FakeGpu | FakeMigDevice | None = None) -> None:
        self.calls[function] = self.calls.get(function, 0) + 1
        if function in self._removed:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        failure = self._failures.get(function)
        if failure is not None:
            code, times = failure
            if times is not None:
                failure[1] = times - 1
                if failure[1] <= 0:
                    del self._failures[function]
            raise NVMLError(code)
        flaky = self._flaky.get(function)
        if flaky is not None:
            flaky[1] += 1
            if flaky[1] % 2 == 1:
                raise NVMLError(flaky[0])
        if function not in ("nvmlInit", "nvmlShutdown") and self.initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is not None and handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if isinstance(handle, FakeMigDevice) and function not in MIG_HANDLE_CALLS:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    # -------------------------------------------------------------------- library
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if not self.driver_loaded:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        if self.initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu | FakeMigDevice:
        self._enter("nvmlDeviceGetHandleByUUID")
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
            if uuid in gpu.mig_uuids:
                return FakeMigDevice(gpu, uuid)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceIsMigDeviceHandle(self, handle: FakeGpu | FakeMigDevice) -> int:
        self._enter("nvmlDeviceIsMigDeviceHandle", handle)
        return int(isinstance(handle, FakeMigDevice))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        self, handle: FakeGpu | FakeMigDevice
    ) -> FakeGpu:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        if not isinstance(handle, FakeMigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.parent

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return handle.index

    def nvmlDeviceGetUUID(self, handle: FakeGpu | FakeMigDevice) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu | FakeMigDevice) -> str:
        self._enter("nvmlDeviceGetName", handle)
        if isinstance(handle, FakeMigDevice):
            return f"{handle.parent.name} MIG 3g.40gb"
        return handle.name

    # ---------------------------------------------------------------------- reads
    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, fieldIds: list[Any]) -> list[FieldValue]:
        self._enter("nvmlDeviceGetFieldValues", handle)
        out = []
        for item in fieldIds:
            field_id, scope = item if isinstance(item, tuple) else (item, 0)
            value = FieldValue(fieldId=field_id, scopeId=scope)
            module = handle.module_power_mw
            if field_id == NVML_FI_DEV_POWER_INSTANT and module is not None:
                if scope == NVML_POWER_SCOPE_MODULE:
                    value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                    value.value.uiVal = module
                else:
                    value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            elif field_id == NVML_FI_DEV_POWER_INSTANT and handle.field_power_supported:
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = handle.power_mw
            elif field_id == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = handle.energy_mj
            else:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            out.append(value)
        return out

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return handle.average_power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return handle.energy_mj

    def nvmlDeviceGetTemperatureV(self, handle: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperatureV", handle)
        return handle.temperature_c

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        return handle.temperature_c

    def nvmlDeviceGetTemperatureThreshold(self, handle: FakeGpu, threshold: int) -> int:
        self._enter("nvmlDeviceGetTemperatureThreshold", handle)
        value = {
            NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: handle.slowdown_temperature_c,
            NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: (
                None if handle.slowdown_temperature_c is None else handle.slowdown_temperature_c + 5
            ),
        }.get(threshold)
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock_type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle)
        return handle.sm_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, clock_type: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", handle)
        if handle.max_clock_mhz is not None:
            return handle.max_clock_mhz
        return max(handle.graphics_clocks_mhz)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Utilization:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return Utilization(gpu=handle.utilization_pct, memory=30)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return handle.event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return handle.event_reasons

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        return handle.power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [handle.power_limit_min_mw, handle.power_limit_max_mw]

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerManagementLimit", handle)
        return handle.power_limit_mw

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetSupportedMemoryClocks", handle)
        return list(handle.memory_clocks_mhz)

    def nvmlDeviceGetSupportedGraphicsClocks(
        self, handle: FakeGpu, memoryClockMHz: int
    ) -> list[int]:
        self._enter("nvmlDeviceGetSupportedGraphicsClocks", handle)
        if memoryClockMHz not in handle.memory_clocks_mhz:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return list(handle.graphics_clocks_mhz)

    # --------------------------------------------------------------------- writes
    def nvmlDeviceSetGpuLockedClocks(
        self, handle: FakeGpu, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        self._enter("nvmlDeviceSetGpuLockedClocks", handle)
        if handle.lock_error is not None:
            raise NVMLError(handle.lock_error)
        if not self.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if minGpuClockMHz > maxGpuClockMHz:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self.writes.append(
            ("nvmlDeviceSetGpuLockedClocks", handle.index, minGpuClockMHz, maxGpuClockMHz)
        )
        handle.locked = (minGpuClockMHz, maxGpuClockMHz)
        # The GPU runs at a supported clock: the highest one at or below the upper bound
        # and the board's max clock.
        supported = sorted(handle.graphics_clocks_mhz)
        ceiling = min(maxGpuClockMHz, handle.top_clock_mhz())
        below = [clock for clock in supported if clock <= ceiling]
        handle.sm_clock_mhz = below[-1] if below else supported[0]
        # A lock below the top clock shows as ApplicationsClocksSetting (as on real GPUs).
        if maxGpuClockMHz < max(handle.graphics_clocks_mhz):
            handle.event_reasons |= nvmlClocksEventReasonApplicationsClocksSetting
        else:
            handle.event_reasons &= ~nvmlClocksEventReasonApplicationsClocksSetting

    def nvmlDeviceResetGpuLockedClocks(self, handle: FakeGpu) -> None:
        self._enter("nvmlDeviceResetGpuLockedClocks", handle)
        if not self.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        self.writes.append(("nvmlDeviceResetGpuLockedClocks", handle.index))
        handle.locked = None
        handle.sm_clock_mhz = handle.top_clock_mhz()
        handle.event_reasons &= ~nvmlClocksEventReasonApplicationsClocksSetting

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeGpu, limit: int) -> None:
        self._enter("nvmlDeviceSetPowerManagementLimit", handle)
        if not isinstance(limit, int):  # ctypes' c_uint refuses a float, as pynvml does
            raise TypeError(f"limit must be whole milliwatts, got {limit!r}")
        if not self.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if not handle.power_limit_min_mw <= limit <= handle.power_limit_max_mw:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self.writes.append(("nvmlDeviceSetPowerManagementLimit", handle.index, limit))
        # The fake's enforced limit is the management limit (no other limit is lower).
        handle.power_limit_mw = int(limit)

    # -------------------------------------------------------------------- helpers
    def locked(self, index: int) -> tuple[int, int] | None:
        """The lock GPU ``index`` holds now (the fake can read it; real NVML cannot)."""
        return self.gpus[index].locked
