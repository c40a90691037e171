"""Emulated backend: one GPU of ``gpugov emulate``, read and locked over loopback HTTP.

The emulator answers NVML's calls (``/gpu/<i>``, ``/gpu/<i>/sample``, ``/gpu/<i>/lock``,
``/gpu/<i>/reset``) with NVML's units (mW, mJ, MHz, C) and, on failure, NVML's return
code (``{"nvmlReturn": code}``). Codes become :mod:`daemon.errors` errors through the same
table as :mod:`daemon.nvml` (:func:`daemon.errors.from_nvml`), and a read is dropped,
counted or fatal exactly as there. An emulator that does not answer is a transient read
failure (and an unavailable GPU when opening): ``sample()`` raises
:class:`~daemon.errors.TransientGpuError`, so the observer logs and counts it as it does
a GPU whose samples fail on the other backends. Each call has one overall deadline
(connect, request, answer), so a frozen or trickling emulator costs a tick at most that.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import threading
import time
import urllib.parse
from typing import Any

from gpugov.daemon.backend import GPU_TEMPERATURE_RANGE_C, GpuSample
from gpugov.daemon.errors import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    GpuCallHung,
    GpuError,
    GpuLost,
    GpuUnavailable,
    NotSupported,
    TransientGpuError,
    from_nvml,
)
from gpugov.daemon.scrape import ExchangeDeadline
from gpugov.plant.input_files import finite_number

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 2.0
"""The deadline of the calls that open a GPU (its description), as for ``GET /gpu``."""

# NVML's own text for the return codes the emulator sends (nvmlErrorString), so an
# emulated failure reads as NVML's would: "GPU is lost", not a bare number.
_NVML_ERROR_STRINGS = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    10: "Timeout",
    13: "Function Not Found",
    15: "GPU is lost",
    16: "GPU requires restart",
    999: "Unknown Error",
}

# Sample fields -> the NVML read they stand for (for dropped/errored read names).
_READS = {
    "power": "power_mw",
    "energy": "energy_mj",
    "temperature": "temperature_c",
    "sm_clock": "sm_clock_mhz",
    "utilization": "utilization_gpu",
    "clock_event_reasons": "clock_event_reasons",
    "power_limit": "enforced_power_limit_mw",
}


def _node_info(emulator: str, timeout_s: float, api_key: str | None = None) -> dict[str, Any]:
    """``GET /gpu`` of ``gpugov emulate`` at ``emulator``: its GPU count and speed (with
    ``api_key`` as a bearer token: asked at an engine's URL, that engine's key).

    Raises:
        GpuUnavailable: the emulator does not answer, or not as ``gpugov emulate`` does;
            GpuCallHung (one) when it does not answer within ``timeout_s``: stopped or
            hung, as an NVML call that hangs, where its GPUs may still be locked.
    """
    parts = urllib.parse.urlsplit(emulator)
    if parts.scheme != "http" or not parts.hostname:
        raise GpuUnavailable(f"emulator URL must be http://HOST:PORT, got {emulator!r}")
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        connection.request("GET", "/gpu", headers=headers)
        response = connection.getresponse()
        payload = json.loads(response.read() or b"{}")
    except TimeoutError as error:  # an OSError: no answer in time, not nothing listening
        raise GpuCallHung(
            f"emulator {emulator} does not answer: no answer within {timeout_s:g} s "
            "(stopped or hung)"
        ) from error
    except (http.client.HTTPException, OSError, ValueError) as error:
        raise GpuUnavailable(f"emulator {emulator} does not answer: {error}") from error
    finally:
        connection.close()
    count = payload.get("count") if isinstance(payload, dict) else None
    if response.status != 200 or not isinstance(count, int) or isinstance(count, bool):
        raise GpuUnavailable(
            f"emulator {emulator}: GET /gpu answered HTTP {response.status} without a GPU "
            "count; is it gpugov emulate?"
        )
    return dict(payload)


def emulated_replicas(
    emulator: str, *, timeout_s: float = 2.0, api_key: str | None = None
) -> list[list[int]] | None:
    """Each engine replica's GPUs of ``gpugov emulate`` at ``emulator`` (``GET /gpu``), or
    None where it does not list them (an older emulator).

    Raises:
        GpuUnavailable: the emulator does not answer, or not as ``gpugov emulate`` does.
    """
    replicas = _node_info(emulator, timeout_s, api_key).get("replicas")
    if not isinstance(replicas, list):
        return None
    groups = []
    for replica in replicas:
        gpus = replica.get("gpus") if isinstance(replica, dict) else None
        if not isinstance(gpus, list) or not all(
            isinstance(gpu, int) and not isinstance(gpu, bool) for gpu in gpus
        ):
            return None
        groups.append(list(gpus))
    return groups


def emulated_device_count(
    emulator: str, *, timeout_s: float = 2.0, api_key: str | None = None
) -> int:
    """How many GPUs ``gpugov emulate`` at ``emulator`` serves (``GET /gpu``), as
    ``nvmlDeviceGetCount`` for the emulated node.

    Raises:
        GpuUnavailable: the emulator does not answer, or not as ``gpugov emulate`` does.
    """
    return int(_node_info(emulator, timeout_s, api_key)["count"])


def emulated_gpu_roles(
    emulator: str, *, timeout_s: float = 2.0, api_key: str | None = None
) -> dict[int, str]:
    """Each emulated GPU's pool role (``prefill`` or ``decode``) as ``GET /gpu`` lists
    its engine replica's (``gpugov emulate --layout MPND``); empty for a colocated node or
    an emulator that lists no replicas.

    Raises:
        GpuUnavailable: the emulator does not answer, or not as ``gpugov emulate`` does.
    """
    replicas = _node_info(emulator, timeout_s, api_key).get("replicas")
    roles: dict[int, str] = {}
    for replica in replicas if isinstance(replicas, list) else ():
        role = replica.get("role") if isinstance(replica, dict) else None
        gpus = replica.get("gpus") if isinstance(replica, dict) else None
        if role in ("prefill", "decode") and isinstance(gpus, list):
            roles.update((gpu, role) for gpu in gpus if isinstance(gpu, int))
    return roles


def emulated_speed(
    emulator: str, *, timeout_s: float = 2.0, api_key: str | None = None
) -> float | None:
    """The plant seconds per wall second ``gpugov emulate`` at ``emulator`` runs at
    (``--speed``), or None where it does not say (an older emulator).

    Raises:
        GpuUnavailable: the emulator does not answer, or not as ``gpugov emulate`` does.
    """
    speed = _node_info(emulator, timeout_s, api_key).get("speed")
    if isinstance(speed, int | float) and not isinstance(speed, bool) and math.isfinite(speed):
        return float(speed)
    return None


def call_timeout_s(period_s: float) -> float:
    """The deadline of one emulated read or write in a daemon of period ``period_s``: a
    fifth of the period, from 0.05 to 0.25 s. A tick's sample and write then take at most
    0.4 of the period however the emulator fails (a frozen emulator serves the engine's
    page too, whose scrape takes at most half), so the tick stays within its period (for
    periods from 0.25 s; a loopback answer takes milliseconds)."""
    return max(0.05, min(0.25, period_s / 5.0))


MAX_CLOCK_MHZ = 100_000
"""The highest SM clock an emulated GPU may list (GPUs run below 3,000 MHz): one listed
past it (an integer too large for a float) is no clock."""


def _nvml_code(value: object) -> int:
    """An NVML return code the emulator sent, or 999 (UNKNOWN: a transient failure) where
    it sent no integer code (text, a float, one past any C int)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31:
        return value
    return 999


class EmulatorNvmlError(Exception):
    """An NVML return code sent by the emulator (``value`` as on ``pynvml.NVMLError``)."""

    def __init__(self, value: int) -> None:
        super().__init__(_NVML_ERROR_STRINGS.get(value, f"NVML error {value}"))
        self.value = value


class EmulatorReplaced(Exception):
    """The emulator behind a new connection serves another GPU at the index opened."""


class EmulatedBackend:
    """One emulated GPU at ``emulator`` (``http://127.0.0.1:8000``), index ``gpu``.

    ``timeout_s`` is one overall deadline for each read or write (connect, request and
    answer together, not per socket read); the daemon gives it a fifth of its period
    (:func:`call_timeout_s`), so a frozen emulator cannot stretch a tick past its period.
    Opening the GPU is given :data:`OPEN_TIMEOUT_S`.

    Raises:
        GpuUnavailable: the emulator has no such GPU, or answers no GPU description.
        TransientGpuError: the emulator did not answer (refused, or past the deadline):
            one still starting, or busy; the daemon's start tries again.
    """

    def __init__(self, gpu: int | str = 0, *, emulator: str, timeout_s: float = 0.25) -> None:
        parts = urllib.parse.urlsplit(emulator)
        if parts.scheme != "http" or not parts.hostname:
            raise GpuUnavailable(f"emulator URL must be http://HOST:PORT, got {emulator!r}")
        if not isinstance(gpu, int):
            raise GpuUnavailable(f"GPU {gpu}: an emulated GPU is named by its index (0, 1, ...)")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._timeout_s = timeout_s
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # one connection; NVML calls may come from threads
        self._closed = False
        self._index = int(gpu)
        self._label = str(gpu)
        self.emulator = emulator
        self._dropped: set[str] = set()
        """The fields the emulator last answered NOT_SUPPORTED (said once, until they read)."""
        self._identity: str | None = None  # the UUID opened
        # Ask the identity again on the next new connection: the emulator dropped or
        # refused one (it may have been restarted). Not after a timeout of ours: the
        # extra request in the same deadline could time out every call after one.
        self._verify_next = False
        self._replaced: str | None = None  # why the GPU is another now, once it is
        try:
            info = self._call(
                "open GPU", "GET", f"/gpu/{self._index}", timeout_s=max(timeout_s, OPEN_TIMEOUT_S)
            )
        except (GpuLost, GpuUnavailable, TransientGpuError):
            raise  # no answer (TransientGpuError): an emulator still starting, or busy
        except GpuError as error:
            raise GpuUnavailable(
                f"GPU {gpu}: no such emulated GPU at {emulator} ({error})",
                gpu=self._label,
                code=error.code,
            ) from error
        if not isinstance(info, dict):
            raise GpuUnavailable(
                f"GPU {gpu}: the emulator at {emulator} answered no GPU description",
                gpu=self._label,
            )
        self.uuid = str(info.get("uuid", ""))
        self.name = str(info.get("name", ""))
        self._max_clock_mhz = info.get("max_sm_clock_mhz")
        self._slowdown_c = info.get("slowdown_temperature_c")
        memory = info.get("supported_memory_clocks_mhz") or []
        graphics = info.get("supported_graphics_clocks_mhz") or []
        try:
            clocks = {int(c) for c in graphics} if memory else set()
        except (TypeError, ValueError, OverflowError) as error:
            raise GpuUnavailable(
                f"GPU {gpu}: the emulator at {emulator} lists supported clocks that are not "
                f"integers ({error})",
                gpu=self._label,
            ) from error
        absurd = sorted(c for c in clocks if not 0 < c <= MAX_CLOCK_MHZ)
        if absurd:
            raise GpuUnavailable(
                f"GPU {gpu}: the emulator at {emulator} lists supported clocks no GPU runs at "
                f"({str(absurd[0])[:20]} MHz; a clock is 1 to {MAX_CLOCK_MHZ} MHz)",
                gpu=self._label,
            )
        self._supported = tuple(sorted(clocks))
        self._identity = self.uuid or None

    @property
    def label(self) -> str:
        """The emulated GPU's index as text."""
        return self._label

    @property
    def index(self) -> int:
        """The emulated GPU's index."""
        return self._index

    # ------------------------------------------------------------------ transport
    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout_s: float,
    ) -> tuple[int, Any]:
        with self._lock:
            return self._request_locked(method, path, body, timeout_s)

    def _request_locked(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout_s: float,
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        end = time.monotonic() + timeout_s
        for attempt in range(2):
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            fresh = self._connection is None or self._connection.sock is None  # a new socket
            verify = fresh and self._verify_next and self._identity is not None
            if self._connection is None:
                self._connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=remaining
                )
            elif self._connection.sock is not None:
                self._connection.sock.settimeout(remaining)
            else:
                self._connection.timeout = remaining
            deadline = ExchangeDeadline(self._connection, remaining)
            try:
                if verify:
                    self._check_identity(self._connection, deadline)
                    self._verify_next = False
                self._connection.request(method, path, body=data, headers=headers)
                deadline.track()
                response = self._connection.getresponse()
                payload = response.read()
            except (
                ConnectionResetError,
                BrokenPipeError,
                http.client.RemoteDisconnected,
            ) as error:
                self._connection.close()
                self._connection = None
                self._verify_next = True
                if deadline.expired:
                    raise self._late(timeout_s) from error
                if attempt == 0:
                    continue  # the server dropped an idle keep-alive connection
                raise
            except (http.client.HTTPException, OSError) as error:
                self._connection.close()
                self._connection = None
                if deadline.expired or isinstance(error, TimeoutError):
                    raise self._late(timeout_s) from error
                self._verify_next = True  # refused, or cut: the emulator may be restarting
                raise
            except EmulatorReplaced:
                self._connection.close()
                self._connection = None
                raise
            finally:
                deadline.cancel()
            if deadline.expired:
                self._connection.close()
                self._connection = None
                raise self._late(timeout_s)
            if response.will_close:
                self._connection.close()
                self._connection = None
            return response.status, json.loads(payload or b"{}")
        raise self._late(timeout_s)

    def _check_identity(
        self, connection: http.client.HTTPConnection, deadline: ExchangeDeadline
    ) -> None:
        """On a new connection after a dropped or refused one, ask ``GET /gpu/<i>`` first:
        an emulator restarted with another profile (or fewer GPUs) serves another GPU at
        this index, or none, which must not be read or locked as the one opened (NVML's
        handles go stale the same way when the driver is replaced).

        Raises:
            EmulatorReplaced: the GPU at this index has another UUID now.
        """
        connection.request("GET", f"/gpu/{self._index}")
        deadline.track()
        response = connection.getresponse()
        payload = json.loads(response.read() or b"{}")
        if response.will_close:
            connection.close()  # reopened by the request that follows
        uuid = payload.get("uuid") if isinstance(payload, dict) else None
        if response.status == 200 and isinstance(uuid, str) and uuid != self._identity:
            raise EmulatorReplaced(
                f"the emulator at {self.emulator} serves another GPU at index {self._index} "
                f"now ({uuid[:120]}, was {self._identity}: restarted with another profile)"
            )
        if isinstance(payload, dict) and payload.get("nvmlReturn") == NVML_ERROR_INVALID_ARGUMENT:
            raise EmulatorReplaced(
                f"the emulator at {self.emulator} has no GPU {self._index} now (restarted "
                "with fewer GPUs)"
            )

    @staticmethod
    def _late(timeout_s: float) -> TimeoutError:
        return TimeoutError(f"no complete answer within {timeout_s:.3g} s")

    def _call(
        self,
        action: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """One NVML call over HTTP; NVML codes become daemon errors as in ``daemon/nvml.py``;
        refused where the emulator now serves another GPU here, or none."""
        self._check_open()
        if self._replaced is not None:
            raise self._gone(action, self._replaced)
        try:
            status, payload = self._request(
                method,
                path,
                body,
                self._timeout_s if timeout_s is None else timeout_s,
            )
        except EmulatorReplaced as replaced:
            self._replaced = str(replaced)
            raise self._gone(action, self._replaced) from replaced
        except (http.client.HTTPException, OSError, ValueError) as error:
            raise TransientGpuError(
                f"GPU {self._label}: {action}: emulator {self.emulator} did not answer: {error}",
                gpu=self._label,
            ) from error
        code = payload.get("nvmlReturn", 0) if isinstance(payload, dict) else 0
        if status != 200 or code:
            nvml_error = EmulatorNvmlError(_nvml_code(code))
            raise from_nvml(nvml_error, action, gpu=self._label) from nvml_error
        return payload

    def _gone(self, action: str, why: str) -> GpuUnavailable:
        """The opened GPU is no longer the emulator's: a driver-gone code (LIB_RM_VERSION_
        MISMATCH), which a running loop exits on (4) and a start reopens."""
        return GpuUnavailable(
            f"GPU {self._label}: {action} failed: {why} "
            f"(NVML code {NVML_ERROR_LIB_RM_VERSION_MISMATCH})",
            gpu=self._label,
            code=NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        )

    def _check_open(self) -> None:
        """Refuse any call on a closed backend."""
        if self._closed:
            raise GpuUnavailable(f"GPU {self._label}: backend is closed", gpu=self._label)

    # ---------------------------------------------------------------------- reads
    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """SM clocks the GPU accepts for locking, ascending.

        Raises:
            NotSupported: the emulator lists none.
            GpuUnavailable: the backend is closed.
        """
        self._check_open()
        if not self._supported:
            raise NotSupported(f"GPU {self._label}: no supported graphics clocks listed")
        return self._supported

    def max_clock_mhz(self) -> int | None:
        """The GPU's max SM clock, or None."""
        value = finite_number(self._max_clock_mhz)
        return None if value is None else int(value)

    def slowdown_temperature_c(self) -> float | None:
        """Where the emulated GPU slows itself (its plant's thermal limit), or None where
        the emulator states none or one no GPU slows at."""
        value = finite_number(self._slowdown_c)
        return value if value is not None and 0.0 < value <= GPU_TEMPERATURE_RANGE_C[1] else None

    def sample(self) -> GpuSample:
        """One reading; unsupported fields are left out while they are, transient ones
        counted.

        Raises:
            GpuLost: the GPU fell off the bus.
            TransientGpuError: the emulator did not answer within the deadline, or
                answered the whole read with an NVML error.
        """
        try:
            payload = self._call("read GPU", "GET", f"/gpu/{self._index}/sample")
        except GpuLost:
            raise
        except NotSupported:
            return GpuSample(gpu=self._label, read_errors=("sample",))
        except GpuUnavailable:
            raise
        except GpuError as error:
            # The whole reading failed: the observer logs it (the first failure, then a
            # reminder a minute) and counts it, as for NVML and nvidia-smi.
            detail = str(error).removeprefix(f"GPU {self._label}: ")
            raise TransientGpuError(detail, gpu=self._label) from error
        if not isinstance(payload, dict):  # not a reading at all: the whole read failed
            log.debug("GPU %s: read answered %r", self._label, type(payload).__name__)
            return GpuSample(gpu=self._label, read_errors=tuple(_READS))
        errors: list[str] = []
        values: dict[str, float | None] = {}
        for name, key in _READS.items():
            raw = payload.get(key)
            if isinstance(raw, dict):  # {"nvmlReturn": code} for this field
                failure = from_nvml(EmulatorNvmlError(_nvml_code(raw.get("nvmlReturn"))), name)
                if isinstance(failure, GpuLost):
                    raise failure
                if isinstance(failure, NotSupported):
                    if name not in self._dropped:
                        self._dropped.add(name)
                        log.info(
                            "GPU %s: %s not supported; left out while it is", self._label, name
                        )
                else:
                    errors.append(name)
                values[name] = None
            elif isinstance(raw, int | float) and not isinstance(raw, bool):
                if name in self._dropped:  # answered again: taken, not thrown away for good
                    self._dropped.discard(name)
                    log.info("GPU %s: %s reads again", self._label, name)
                try:
                    values[name] = float(raw)  # NaN and infinities: GpuSample.read's to refuse
                except OverflowError:  # an integer too large for a float: no reading
                    values[name] = None
                    errors.append(name)
            else:
                values[name] = None
                errors.append(name)
        utilization = values["utilization"]
        return GpuSample.read(
            self._label,
            power_w=None if values["power"] is None else values["power"] / 1000.0,
            energy_j=None if values["energy"] is None else values["energy"] / 1000.0,
            temperature_c=values["temperature"],
            sm_clock_mhz=values["sm_clock"],
            # Not clamped: past 100 % (or below 0) is GpuSample.read's failed read.
            utilization=None if utilization is None else utilization / 100.0,
            clock_event_reasons=values["clock_event_reasons"],
            power_limit_w=None if values["power_limit"] is None else values["power_limit"] / 1000.0,
            read_errors=tuple(errors),
        )

    # --------------------------------------------------------------------- writes
    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock into ``[min_mhz, max_mhz]``.

        Raises:
            PermissionDenied, NotSupported, GpuLost, TransientGpuError: as the GPU answers.
        """
        self._call(
            f"lock clocks to {int(min_mhz)},{int(max_mhz)} MHz",
            "POST",
            f"/gpu/{self._index}/lock",
            {"min_mhz": int(min_mhz), "max_mhz": int(max_mhz)},
        )

    def reset_clocks(self) -> None:
        """Remove any SM clock lock.

        Raises:
            PermissionDenied, NotSupported, GpuLost, TransientGpuError: as the GPU answers.
        """
        # Nothing to reset on an emulator restarted with other GPUs (or fewer): the lock
        # went with the old emulator, as a driver reload clears the locks, and the GPU
        # now at this index is not gpugov's.
        if self._replaced is not None:
            return
        try:
            self._call("reset clocks", "POST", f"/gpu/{self._index}/reset", {})
        except GpuUnavailable:
            if self._replaced is None:
                raise

    def close(self) -> None:
        """Close the kept connection (idempotent); later calls raise
        :class:`~daemon.errors.GpuUnavailable`."""
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None
