"""NVML backend: one GPU read, locked and power-limited through ``nvidia-ml-py``
(``import pynvml``).

The ``pynvml`` module is a constructor argument (default: the real one), so tests run
this exact code against ``tests/daemon/fake_pynvml.py``. Every ``NVMLError`` becomes a
:mod:`daemon.errors` error in :func:`daemon.errors.from_nvml`.

Reads per sample (see ``docs/nvml-notes.md``): instant power through
``nvmlDeviceGetFieldValues`` (field 186, GPU scope, then MODULE scope; falls back to
``nvmlDeviceGetPowerUsage``, a 1 s average on Ampere+), the energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, every sample: a counter read before, carried as
if read now, gave a tick no energy and the next twice its own), temperature
(``TemperatureV``, falls back to the deprecated ``Temperature``), SM clock, utilisation,
clock-event reasons (the new name, falls back to the ``Throttle`` name on
FUNCTION_NOT_FOUND) and the enforced power limit. A read that is unsupported is left out
and tried again once a minute; a transient failure leaves the field None for this sample
and is named in ``GpuSample.read_errors``; a lost GPU raises
:class:`~daemon.errors.GpuLost`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from gpugov.daemon.backend import (
    GPU_TEMPERATURE_RANGE_C,
    MAX_GPU_POWER_W,
    GpuSample,
    clock_tolerance_mhz,
)
from gpugov.daemon.errors import (
    FUNCTION_NOT_FOUND,
    GpuError,
    GpuLost,
    GpuUnavailable,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
    from_nvml,
    printable,
)
from gpugov.daemon.limits import MAX_CLOCK_MHZ, MAX_GPU_INDEX

log = logging.getLogger(__name__)

T = TypeVar("T")

# Constants from nvml.h, used when an old binding lacks the name.
FI_DEV_POWER_INSTANT = 186
POWER_SCOPE_GPU = 0
POWER_SCOPE_MODULE = 1
# Per-field return codes that will not change on the next call: INVALID_ARGUMENT,
# NOT_SUPPORTED, FUNCTION_NOT_FOUND.
_PERMANENT_FIELD_CODES = frozenset({2, 3, 13})
SLOWDOWN_READ_ATTEMPTS = 3
"""Reads of the slowdown temperature, read once at the start, while they fail for now."""
UNSUPPORTED_READ_RETRY_S = 60.0
"""A read NVML said it does not support is tried again after this long: dropped for good,
one spurious NOT_SUPPORTED (a driver in trouble, MIG mode switched off again) left the SM
clock, and so every lock's readback, or the utilisation unread for the rest of the run."""


def load_pynvml() -> ModuleType:
    """Import the real ``pynvml`` (nvidia-ml-py).

    Raises:
        GpuUnavailable: the package is not installed.
    """
    try:
        import pynvml
    except ImportError as error:  # pragma: no cover - the package is a dependency
        raise GpuUnavailable("nvidia-ml-py is not installed (import pynvml failed)") from error
    module: ModuleType = pynvml
    return module


def _const(nvml: Any, name: str, default: int) -> int:
    return int(getattr(nvml, name, default))


def _field_value(nvml: Any, field: Any) -> float:
    """The numeric value of a ``c_nvmlFieldValue_t`` according to its ``valueType``."""
    member = {
        _const(nvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        _const(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        _const(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        _const(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        _const(nvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        _const(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        _const(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(int(field.valueType), "ullVal")
    return float(getattr(field.value, member))


def plausible_clocks(
    listed: Any, gpu: str, kind: str = "graphics", source: str = "NVML"
) -> tuple[int, ...]:
    """The clocks of an NVML supported-clock list a lock may ask for: ascending, each
    once, whole MHz above 0 and at most :data:`~daemon.limits.MAX_CLOCK_MHZ`. A value no
    GPU runs at (0, 0xFFFFFFFF: a driver's garbage) is dropped with one warning; locked,
    it fails with INVALID_ARGUMENT (the fail-safe's top clock would stop the run) or,
    as 0 MHz, would be the floor the controller's lowest clock comes from. ``kind`` names
    the list (``"graphics"`` or ``"memory"``) in the lines, ``source`` what listed it
    (``"NVML"``, ``"nvidia-smi"``).

    Raises:
        NotSupported: the list holds no such clock (empty, or all garbage).
    """
    clocks: set[int] = set()
    dropped: list[Any] = []
    for value in listed or ():
        try:
            number = float(value)
        except (TypeError, ValueError):
            dropped.append(value)
            continue
        if math.isfinite(number) and number == int(number) and 0 < number <= MAX_CLOCK_MHZ:
            clocks.add(int(number))
        else:
            dropped.append(value)
    if not clocks:
        raise NotSupported(
            f"GPU {gpu}: no supported {kind} clocks listed"
            + (f" (only values no GPU runs at: {dropped[:4]!r})" if dropped else "")
        )
    if dropped:
        log.warning(
            "GPU %s: %s listed %d supported %s clock(s) no GPU runs at (%s); ignored",
            gpu,
            source,
            len(dropped),
            "SM" if kind == "graphics" else kind,
            ", ".join(repr(value) for value in dropped[:4]),
        )
    return tuple(sorted(clocks))


def release_nvml(nvml: Any, gpu: str | None = None) -> None:
    """``nvmlShutdown``, its failure logged (DEBUG), never raised: on the way out of a
    failed open or count, an ``NVMLError`` of its own (a driver in trouble) replaced the
    daemon's error and reached the user as a traceback."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as error:
        log.debug("%snvmlShutdown failed: %s", "" if gpu is None else f"GPU {gpu}: ", error)


def nvml_device_count(nvml: ModuleType | None = None) -> int:
    """Number of GPUs NVML sees (initialises and shuts NVML down around the call).

    Raises:
        GpuUnavailable: no driver or library.
    """
    nvml = nvml or load_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise from_nvml(error, "initialise NVML") from error
    try:
        counted = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as error:
        raise from_nvml(error, "count GPUs") from error
    finally:
        release_nvml(nvml)
    try:
        count = int(counted)
    except (TypeError, ValueError, OverflowError):  # no number: no count a node has
        count = -1
    if not 0 <= count <= MAX_GPU_INDEX + 1:
        # A driver's garbage (an unsigned -1): as indices, every GPU of `--gpus all`.
        raise GpuUnavailable(
            f"NVML counts {printable(repr(counted))[:40]} GPUs, which no node has (indices go "
            f"0 to {MAX_GPU_INDEX}): a driver in trouble"
        )
    return count


class NvmlBackend:
    """One GPU through NVML. Initialises NVML (refcounted) and releases it on ``close()``.

    Args:
        gpu: NVML index (PCI order), a ``GPU-...`` UUID, or a ``MIG-...`` UUID, which
            stands for its whole GPU (its ``label`` and ``uuid`` are that GPU's: two MIG
            devices of one GPU are one GPU to govern).
        nvml: the ``pynvml`` module; tests pass a fake.
        clock: monotonic seconds, for when a read NVML does not support is tried again.

    Raises:
        GpuUnavailable: no driver/library, or no such GPU.
    """

    def __init__(
        self,
        gpu: int | str = 0,
        *,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml: Any = nvml or load_pynvml()
        self._closed = False
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as error:
            raise from_nvml(error, "initialise NVML", gpu=str(gpu)) from error
        try:
            if isinstance(gpu, str) and gpu.startswith(("GPU-", "MIG-")):
                self._handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu)
                parent = getattr(self._nvml, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", None)
                if gpu.startswith("MIG-") and parent is not None:
                    # A MIG device's clocks, power and temperature are its GPU's: a lock
                    # acts on the whole GPU, and NVML answers a MIG handle's device calls
                    # NOT_SUPPORTED. The GPU (its handle, index and UUID) is governed.
                    self._handle = parent(self._handle)
                self._index = int(self._nvml.nvmlDeviceGetIndex(self._handle))
            else:
                self._index = int(gpu)
                self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self._index)
            self.uuid = str(self._nvml.nvmlDeviceGetUUID(self._handle))
            self.name = str(self._nvml.nvmlDeviceGetName(self._handle))
        except self._nvml.NVMLError as error:
            release_nvml(self._nvml, str(gpu))
            translated = from_nvml(error, "open GPU", gpu=str(gpu))
            if not isinstance(
                translated, PermissionDenied | GpuLost | GpuUnavailable | TransientGpuError
            ):
                # INVALID_ARGUMENT here means an index past the last GPU.
                translated = GpuUnavailable(
                    f"GPU {gpu}: no such GPU or it cannot be opened ({error})",
                    gpu=str(gpu),
                    code=translated.code,
                )
            raise translated from error
        except (TypeError, ValueError, OverflowError) as error:  # an index that is no number
            release_nvml(self._nvml, str(gpu))
            raise GpuUnavailable(
                f"GPU {gpu}: no such GPU or it cannot be opened (NVML gave no index: {error})",
                gpu=str(gpu),
            ) from None
        self._label = str(self._index)
        self._supported: tuple[int, ...] | None = None
        self._bounds_warned = False
        """Implausible power limit bounds were warned about (:meth:`power_limit_constraints_w`)."""
        self._clock = clock
        self._dropped: dict[str, float] = {}
        """Per read NVML does not support, when it last said so (:meth:`_read`)."""
        self._all_power_scopes: tuple[int, ...] = (
            _const(self._nvml, "NVML_POWER_SCOPE_GPU", POWER_SCOPE_GPU),
            _const(self._nvml, "NVML_POWER_SCOPE_MODULE", POWER_SCOPE_MODULE),
        )
        self._power_scopes: tuple[int, ...] = self._all_power_scopes
        """The scopes the instant power field is read at, first to last (:meth:`_power`)."""
        self._power_scope_dropped_s: float | None = None
        """When a scope was last found unsupported: every scope is tried again
        :data:`UNSUPPORTED_READ_RETRY_S` later, as every read NVML does not support."""
        self._power_said = ""
        """The last power source said (:meth:`_say_power_source`)."""
        self._use_temperature_v = True
        self._event_reasons_name = "nvmlDeviceGetCurrentClocksEventReasons"

    # ------------------------------------------------------------------ identity
    @property
    def label(self) -> str:
        """The NVML index as text."""
        return self._label

    @property
    def index(self) -> int:
        """The NVML index (PCI order)."""
        return self._index

    # --------------------------------------------------------------------- reads
    def _check_open(self) -> None:
        """Refuse any call on a closed backend (its NVML reference is released)."""
        if self._closed:
            raise GpuUnavailable(f"GPU {self._label}: backend is closed", gpu=self._label)

    def _call(self, action: str, function: Callable[..., T], *args: Any) -> T:
        self._check_open()
        try:
            return function(*args)
        except self._nvml.NVMLError as error:
            raise from_nvml(error, action, gpu=self._label) from error

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """SM clocks the GPU accepts for locking, ascending (cached after the first call).

        Uses the highest supported memory clock's graphics-clock list, without the clocks
        above the GPU's max SM clock (:meth:`_within_max_clock`).

        Raises:
            NotSupported, GpuLost, GpuError: as NVML reports.
            GpuUnavailable: the backend is closed.
        """
        self._check_open()
        if self._supported is None:
            nvml = self._nvml
            # The memory clocks pass the same check: the highest of a list holding
            # 0xFFFFFFFF was that, and its graphics clocks NOT_FOUND (exit 4).
            memory = plausible_clocks(
                self._call(
                    "list memory clocks", nvml.nvmlDeviceGetSupportedMemoryClocks, self._handle
                ),
                self._label,
                "memory",
            )
            graphics = self._call(
                "list graphics clocks",
                nvml.nvmlDeviceGetSupportedGraphicsClocks,
                self._handle,
                max(memory),
            )
            self._supported = self._within_max_clock(plausible_clocks(graphics, self._label))
        return self._supported

    def _within_max_clock(self, clocks: tuple[int, ...]) -> tuple[int, ...]:
        """``clocks`` without those above the GPU's max SM clock (one line): a board that lists
        clocks it never reaches (a GeForce boost table, a power-limited SKU), locked there,
        ran lower with no event reason, and each readback took that for another's lock.

        A max clock within two steps of the top listed one (NVML: "can differ by a few
        MHz"), below every listed clock or unreadable leaves the list as it is; one that
        fails for now raises, so the start's retries read it again (the list is read once).

        Raises:
            TransientGpuError: the max clock read failed for now (TIMEOUT, UNKNOWN, ...).
        """
        try:
            top: int | None = self._read_max_clock()
        except TransientGpuError:
            raise
        except GpuError:
            top = None
        if top is None or top < clocks[0] or clocks[-1] <= top + clock_tolerance_mhz(clocks):
            return clocks
        kept = tuple(clock for clock in clocks if clock <= top)
        log.info(
            "GPU %s: NVML lists SM clocks up to %d MHz, above the %d MHz it runs at most "
            "(nvmlDeviceGetMaxClockInfo); the %d clock(s) above it are not used",
            self._label,
            clocks[-1],
            top,
            len(clocks) - len(kept),
        )
        return kept

    def _read(self, name: str, errors: list[str], function: Callable[[], T]) -> T | None:
        """Run one read: one NVML does not support is left out, and tried again once
        :data:`UNSUPPORTED_READ_RETRY_S` has passed (one line when it stops, one when it
        reads again); a transient failure is named in ``errors``."""
        dropped_s = self._dropped.get(name)
        if dropped_s is not None and self._clock() - dropped_s < UNSUPPORTED_READ_RETRY_S:
            return None
        try:
            value = function()
        except GpuLost:
            raise
        except NotSupported:
            if dropped_s is None:
                log.info("GPU %s: %s not supported; tried again once a minute", self._label, name)
            self._dropped[name] = self._clock()
            return None
        except GpuUnavailable:
            raise
        except GpuError as error:
            errors.append(name)
            log.debug("GPU %s: %s failed: %s", self._label, name, error)
            return None
        except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as error:
            # A value the binding gave that is no reading (no number, an empty field list):
            # a failed read of that field, where it ended the loop in a traceback.
            errors.append(name)
            log.debug("GPU %s: %s read no number: %r", self._label, name, error)
            return None
        if self._dropped.pop(name, None) is not None:
            log.info("GPU %s: %s reads again", self._label, name)
        return value

    def _power(self) -> float:
        """Instant power (field 186) in watts, at GPU scope, else MODULE scope (Grace-Hopper),
        else the 1 s average getter; a scope NVML does not read is passed over within the
        same sample, and tried again once :data:`UNSUPPORTED_READ_RETRY_S` has passed; a
        field call or field that fails for now leaves this sample to the average getter, and
        each change of source is said once (INFO)."""
        nvml = self._nvml
        power_field = _const(nvml, "NVML_FI_DEV_POWER_INSTANT", FI_DEV_POWER_INSTANT)
        dropped_s = self._power_scope_dropped_s
        if dropped_s is not None and self._clock() - dropped_s >= UNSUPPORTED_READ_RETRY_S:
            self._power_scopes, self._power_scope_dropped_s = self._all_power_scopes, None
        while self._power_scopes:
            scope = self._power_scopes[0]
            try:
                values = self._call(
                    "read power field",
                    nvml.nvmlDeviceGetFieldValues,
                    self._handle,
                    [(power_field, scope)],
                )
            except NotSupported:
                self._power_scopes, self._power_scope_dropped_s = (), self._clock()
                break
            except TransientGpuError as error:  # as a field answered with such a code
                log.debug("GPU %s: power field failed for now: %s", self._label, error)
                break
            if not values:  # no value for the field asked (garbage): as a passing failure
                break
            code = int(values[0].nvmlReturn)
            if code == _const(nvml, "NVML_SUCCESS", 0):
                if scope != _const(nvml, "NVML_POWER_SCOPE_GPU", POWER_SCOPE_GPU):
                    self._say_power_source(
                        "its power is read at MODULE scope (the whole Grace-Hopper module: "
                        "GPU, CPU and memory): NVML reads no GPU-scope instant power"
                    )
                elif self._power_said:  # back from a fallback said before
                    self._say_power_source("its instant power reads again (GPU scope)")
                return _field_value(nvml, values[0]) / 1000.0
            if code not in _PERMANENT_FIELD_CODES:
                break  # a passing failure: this sample's power from the average getter
            # GPU scope fails on Grace-Hopper C2C parts (Zeus): MODULE scope next.
            self._power_scopes, self._power_scope_dropped_s = self._power_scopes[1:], self._clock()
        if not self._power_scopes:
            self._say_power_source(
                "NVML reads no instant power; its power is the 1 s average "
                "(nvmlDeviceGetPowerUsage)"
            )
        return float(self._call("read power", nvml.nvmlDeviceGetPowerUsage, self._handle)) / 1000.0

    def _say_power_source(self, line: str) -> None:
        """One INFO line the first time the power comes from ``line``'s source."""
        if line != self._power_said:
            self._power_said = line
            log.info("GPU %s: %s", self._label, line)

    def _energy(self) -> float:
        """The energy counter in joules, read at every sample.

        Measured on an H200 (driver 580): this read takes ~3 ms (p99 ~17 ms) while every
        other read takes ~2 us; a tick's reads of a domain's GPUs run together, so it
        costs a tick about that once. Read at most once a second instead, a sample carried
        the counter read before as if read now, and per-tick energy came out 0, then
        twice a tick's.
        """
        energy_mj = self._call(
            "read energy", self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle
        )
        return float(energy_mj) / 1000.0

    def _temperature(self) -> float:
        nvml = self._nvml
        sensor = _const(nvml, "NVML_TEMPERATURE_GPU", 0)
        if self._use_temperature_v and hasattr(nvml, "nvmlDeviceGetTemperatureV"):
            try:
                return float(
                    self._call(
                        "read temperature", nvml.nvmlDeviceGetTemperatureV, self._handle, sensor
                    )
                )
            except NotSupported as error:
                if error.code != FUNCTION_NOT_FOUND:
                    raise  # not a driver older than the call: tried again later
                self._use_temperature_v = False
        return float(
            self._call("read temperature", nvml.nvmlDeviceGetTemperature, self._handle, sensor)
        )

    def _event_reasons(self) -> int:
        nvml = self._nvml
        function = getattr(nvml, self._event_reasons_name, None)
        if function is not None:
            try:
                return int(self._call("read clock event reasons", function, self._handle))
            except NotSupported as error:
                # Only FUNCTION_NOT_FOUND (a driver older than the rename) moves to the old
                # name: moved on any NOT_SUPPORTED, the reasons stayed unread for good
                # where the driver lacks the old symbol (or answers it DEPRECATED).
                if (
                    self._event_reasons_name.endswith("ThrottleReasons")
                    or error.code != FUNCTION_NOT_FOUND
                ):
                    raise
                log.debug("GPU %s: %s; trying the Throttle name", self._label, error)
        self._event_reasons_name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        return int(
            self._call(
                "read clock event reasons",
                nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
                self._handle,
            )
        )

    def sample(self) -> GpuSample:
        """Read power, energy, temperature, SM clock, utilisation, event reasons, power limit.

        Raises:
            GpuLost: the GPU fell off the bus.
            GpuUnavailable: NVML was shut down under us, or the backend is closed.
        """
        self._check_open()
        nvml = self._nvml
        errors: list[str] = []
        power_w = self._read("power", errors, self._power)
        energy_j = self._read("energy", errors, self._energy)
        temperature = self._read("temperature", errors, self._temperature)
        clock = self._read(
            "sm_clock",
            errors,
            lambda: float(
                self._call(
                    "read SM clock",
                    nvml.nvmlDeviceGetClockInfo,
                    self._handle,
                    _const(nvml, "NVML_CLOCK_SM", 1),
                )
            ),
        )
        # Not clamped: a percentage past 100 (a driver's garbage) is GpuSample.read's
        # failed read, where clamped it was a GPU busy all the time.
        utilization = self._read(
            "utilization",
            errors,
            lambda: (
                float(
                    self._call(
                        "read utilisation", nvml.nvmlDeviceGetUtilizationRates, self._handle
                    ).gpu
                )
                / 100.0
            ),
        )
        reasons = self._read("clock_event_reasons", errors, self._event_reasons)
        limit_w = self._read(
            "power_limit",
            errors,
            lambda: (
                float(
                    self._call(
                        "read power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, self._handle
                    )
                )
                / 1000.0
            ),
        )
        return GpuSample.read(
            self._label,
            power_w=power_w,
            energy_j=energy_j,
            temperature_c=temperature,
            sm_clock_mhz=clock,
            utilization=utilization,
            clock_event_reasons=reasons,
            power_limit_w=limit_w,
            read_errors=tuple(errors),
        )

    # -------------------------------------------------------------------- writes
    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock into ``[min_mhz, max_mhz]`` (nvmlDeviceSetGpuLockedClocks).

        Raises:
            PermissionDenied: not root / no CAP_SYS_ADMIN.
            NotSupported: pre-Volta or the pair is not accepted.
            GpuLost: the GPU fell off the bus.
        """
        self._call(
            f"lock clocks to {int(min_mhz)},{int(max_mhz)} MHz",
            self._nvml.nvmlDeviceSetGpuLockedClocks,
            self._handle,
            int(min_mhz),
            int(max_mhz),
        )

    def reset_clocks(self) -> None:
        """Remove any SM clock lock (nvmlDeviceResetGpuLockedClocks).

        Raises:
            PermissionDenied, NotSupported, GpuLost: as NVML reports.
        """
        self._call("reset clocks", self._nvml.nvmlDeviceResetGpuLockedClocks, self._handle)

    def max_clock_mhz(self) -> int | None:
        """``nvmlDeviceGetMaxClockInfo`` for the SM clock, or None when it fails."""
        try:
            return self._read_max_clock()
        except GpuError:
            return None

    def _read_max_clock(self) -> int:
        """``nvmlDeviceGetMaxClockInfo`` for the SM clock, its failure raised.

        Raises:
            GpuError: as NVML reports (a TransientGpuError for one that may pass).
        """
        value = self._call(
            "read max SM clock",
            self._nvml.nvmlDeviceGetMaxClockInfo,
            self._handle,
            _const(self._nvml, "NVML_CLOCK_SM", 1),
        )
        try:
            clock = int(value)
        except (TypeError, ValueError, OverflowError):
            clock = -1
        if not 0 <= clock < 2**32:  # no unsigned int NVML gives: unreadable, as a failed call
            raise GpuError(f"GPU {self._label}: max SM clock read {value!r}", gpu=self._label)
        return clock

    def slowdown_temperature_c(self) -> float | None:
        """The die temperature at which the GPU slows its clocks itself
        (``nvmlDeviceGetTemperatureThreshold``, ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``),
        or None where it cannot be read (a read failing for now, up to
        :data:`SLOWDOWN_READ_ATTEMPTS` times) or is no temperature a GPU slows at."""
        read = getattr(self._nvml, "nvmlDeviceGetTemperatureThreshold", None)
        if read is None:
            return None
        threshold = _const(self._nvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)
        for attempt in range(SLOWDOWN_READ_ATTEMPTS):
            try:
                value = float(
                    self._call("read slowdown temperature", read, self._handle, threshold)
                )
            except TransientGpuError:
                # Read once, at the start: a failure for now left the configured thermal
                # limit above it for the whole run.
                if attempt + 1 < SLOWDOWN_READ_ATTEMPTS:
                    continue
                return None
            except (GpuError, TypeError, ValueError, OverflowError):
                return None
            return value if 0.0 < value <= GPU_TEMPERATURE_RANGE_C[1] else None
        return None  # pragma: no cover - the loop returns

    def power_limit_constraints_w(self) -> tuple[float, float] | None:
        """The (lowest, highest) power limit the GPU accepts, in watts
        (``nvmlDeviceGetPowerManagementLimitConstraints``), or None when it cannot be read
        or no GPU has them (reversed, 0, 0xFFFFFFFF mW: one warning), so a bad pair never
        discards genuine power readings nor blocks a power cap.

        Raises:
            TransientGpuError: the read failed for now (TIMEOUT, UNKNOWN): read again
                later, where None would stand for the whole run.
        """
        try:
            low_mw, high_mw = self._call(
                "read power limit constraints",
                self._nvml.nvmlDeviceGetPowerManagementLimitConstraints,
                self._handle,
            )
        except TransientGpuError:
            raise
        except GpuError:
            return None
        try:
            low_w, high_w = float(low_mw) / 1000.0, float(high_mw) / 1000.0
        except (TypeError, ValueError, OverflowError):
            low_w = high_w = math.nan
        if math.isfinite(low_w) and 0.0 < low_w <= high_w <= MAX_GPU_POWER_W:
            return low_w, high_w
        if not self._bounds_warned:
            self._bounds_warned = True
            log.warning(
                "GPU %s: NVML reports its power limit bounds as %r-%r mW, which no GPU has; "
                "taken as unknown (power readings and power caps go on without them)",
                self._label,
                low_mw,
                high_mw,
            )
        return None

    def power_limit_w(self) -> float:
        """The power management limit set now, in watts
        (``nvmlDeviceGetPowerManagementLimit``).

        Raises:
            NotSupported, GpuLost, TransientGpuError, GpuError: as NVML reports (a value
                that is no number: TransientGpuError).
            GpuUnavailable: the backend is closed.
        """
        milliwatts = self._call(
            "read power management limit",
            self._nvml.nvmlDeviceGetPowerManagementLimit,
            self._handle,
        )
        try:
            return float(milliwatts) / 1000.0
        except (TypeError, ValueError, OverflowError):  # read again, as a failed read is
            raise TransientGpuError(
                f"GPU {self._label}: power management limit read {milliwatts!r}, no number",
                gpu=self._label,
            ) from None

    def set_power_limit(self, limit_w: float) -> None:
        """Set the power management limit to ``limit_w`` watts, rounded to whole milliwatts
        (``nvmlDeviceSetPowerManagementLimit``, what ``nvidia-smi -pl`` sets).

        Raises:
            PermissionDenied: not root / no CAP_SYS_ADMIN.
            NotSupported: the GPU or driver cannot set a power limit (vGPU, MIG, old GPU).
            GpuLost: the GPU fell off the bus.
            GpuError: a limit outside the GPU's constraints (NVML's INVALID_ARGUMENT).
        """
        milliwatts = int(round(float(limit_w) * 1000.0))
        self._call(
            f"set power limit to {milliwatts / 1000.0:g} W",
            self._nvml.nvmlDeviceSetPowerManagementLimit,
            self._handle,
            milliwatts,
        )

    def close(self) -> None:
        """Release this backend's NVML reference (idempotent); later calls raise
        :class:`~daemon.errors.GpuUnavailable`."""
        if not self._closed:
            self._closed = True
            release_nvml(self._nvml, self._label)
