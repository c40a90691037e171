"""The governor's side of the split mode: ``backend = "actuator"``.

The governor runs unprivileged. It reads its GPUs through NVML itself (reads need no
privilege) and asks ``gpugov actuator`` (:mod:`daemon.actuator_server`) over its Unix
socket to lock and reset them. One :class:`ActuatorClient` per process holds one
connection, and so one lease, for all its GPUs; each GPU is an :class:`ActuatorBackend`.

The lease is renewed once per control tick (:meth:`ActuatorBackend.write_path_problem`,
called by the clock actuator), so a governor that stops ticking loses its locks within
the lease. When the actuator cannot be reached, every write raises
:class:`~daemon.errors.TransientGpuError` (counted as a failed clock write) and
``write_path_problem`` names the reason, which holds the domain in its fail-safe until
the actuator answers again. A new connection is a new lease: ``write_epoch`` changes,
and the clock actuator writes its locks again (the actuator reset them with the old
lease).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from gpugov.daemon.actuator_server import PROTOCOL
from gpugov.daemon.backend import GpuBackend, ReadThroughBackend
from gpugov.daemon.errors import (
    NVML_ERROR_MAP,
    GpuError,
    GpuLost,
    NotSupported,
    PeerRefused,
    PermissionDenied,
    TransientGpuError,
    printable,
)

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 64 * 1024
RENEW_SHARE = 0.25
"""A tick renews the lease when this share of it has passed since the last request."""
_ERRORS: dict[str, type[GpuError]] = {
    "permission": PeerRefused,
    "not_supported": NotSupported,
    "lost": GpuLost,
    "transient": TransientGpuError,
    "rate_limited": TransientGpuError,
    "busy": TransientGpuError,
}


class ActuatorUnavailable(TransientGpuError):
    """The actuator did not answer (no socket, refused, timed out, closed)."""


class ActuatorClient:
    """One connection to ``gpugov actuator``: requests, lease renewal, reconnection.

    Args:
        path: the actuator's socket.
        lease_s: the lease asked for in ``hello`` (the actuator may grant less).
        timeout_s: the most one request (connect, send, answer) may take; past it the
            connection is dropped (its lease ends, so the actuator resets its locks).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        path: str,
        *,
        lease_s: float = 3.0,
        timeout_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.lease_s = lease_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self._last_ok_s = -1e9
        self.granted_lease_s = lease_s
        self._said_lease_s: float | None = None
        """The shorter lease than asked last warned about."""
        self.epoch = 0
        """Increments with every new connection (a new lease)."""
        self.failures = 0
        """Requests that failed because the actuator was unreachable or too slow."""
        self.problem: str | None = None
        self.gpus: list[dict[str, Any]] = []
        self.users = 0

    # ---------------------------------------------------------------- transport
    def _connect(self) -> None:
        """Connect and say hello: a new lease (``epoch`` + 1)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.path)
        except OSError as error:
            sock.close()
            raise ActuatorUnavailable(
                f"actuator at {self.path} unreachable: {error.strerror or error}"
            ) from error
        self._sock, self._buffer = sock, b""
        answer = self._exchange({"op": "hello", "lease_s": self.lease_s})
        if not answer.get("ok"):
            self._disconnect()
            message = answer.get("message", "refused")
            if answer.get("error") == "forbidden":
                raise PeerRefused(f"actuator at {self.path} refused this user: {message}")
            raise ActuatorUnavailable(f"actuator at {self.path} refused hello: {message}")
        spoken = answer.get("protocol")
        if spoken != PROTOCOL or isinstance(spoken, bool):
            # It was not looked at: an actuator of another protocol was written to as
            # if it spoke this one.
            self._disconnect()
            raise ActuatorUnavailable(
                f"actuator at {self.path} speaks protocol {printable(repr(spoken))[:40]}, "
                f"this gpugov speaks {PROTOCOL}: run the same gpugov version as governor "
                "and actuator (upgrade both)"
            )
        lease, gpus = answer.get("lease_s", self.lease_s), answer.get("gpus", [])
        problem = (
            ("lease_s", lease)
            if isinstance(lease, bool)
            or not isinstance(lease, int | float)
            or not (math.isfinite(lease) and lease > 0)
            else ("gpus", gpus)
            if not isinstance(gpus, list)
            else None
        )
        if problem is not None:
            # Read as they came, such fields ended the write path in a ValueError or a
            # TypeError: a traceback out of the loop's tick.
            self._disconnect()
            field, value = problem
            raise ActuatorUnavailable(
                f"actuator at {self.path}: its hello answer's {field} is "
                f"{printable(repr(value))[:40]}, not the actuator protocol's (a positive "
                "number of seconds, a list of GPUs): another program on the socket?"
            )
        self.granted_lease_s = float(lease)
        self.gpus = list(gpus)
        self.epoch += 1
        if self.granted_lease_s < self.lease_s and self.granted_lease_s != self._said_lease_s:
            # Once per lease granted: one that lapses between ticks reconnects every tick.
            self._said_lease_s = self.granted_lease_s
            log.warning(
                "actuator grants a %.3g s lease, not the %.3g s asked for",
                self.granted_lease_s,
                self.lease_s,
            )
        log.info("connected to the actuator at %s (lease %.3g s)", self.path, self.granted_lease_s)

    def _disconnect(self) -> None:
        """Close the socket (the actuator ends the lease)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one request and read its one answer line within ``timeout_s``."""
        assert self._sock is not None
        deadline = self._clock() + self.timeout_s
        try:
            # Refused at once (a stranger): the send fails, its one answer line waits.
            with contextlib.suppress(OSError):
                self._sock.sendall(json.dumps(message).encode() + b"\n")
            while b"\n" not in self._buffer:
                left = deadline - self._clock()
                if left <= 0:
                    raise TimeoutError
                self._sock.settimeout(left)
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise ConnectionResetError("the actuator closed the connection")
                self._buffer += chunk
                if len(self._buffer) > MAX_ANSWER_BYTES:
                    raise ConnectionResetError("the actuator's answer is too long")
        except (OSError, TimeoutError) as error:
            self._disconnect()
            what = (
                f"no answer within {self.timeout_s:g} s"
                if isinstance(error, TimeoutError)
                else str(error) or type(error).__name__
            )
            raise ActuatorUnavailable(f"actuator at {self.path}: {what}") from error
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
            self._disconnect()
            raise ActuatorUnavailable(f"actuator at {self.path}: answer is not JSON") from error
        if not isinstance(answer, dict):
            self._disconnect()
            raise ActuatorUnavailable(f"actuator at {self.path}: answer is not a JSON object")
        self._last_ok_s = self._clock()
        return answer

    # ----------------------------------------------------------------- requests
    def request(self, message: dict[str, Any], *, gpu: str | None = None) -> dict[str, Any]:
        """Send ``message`` (connecting first when needed) and return a successful answer.

        Raises:
            ActuatorUnavailable: unreachable, too slow, or closed (a TransientGpuError).
            PeerRefused, NotSupported, GpuLost, GpuError: what the actuator refused,
                translated back into the daemon's own errors.
        """
        with self._lock:
            try:
                if self._sock is None:
                    self._connect()
                answer = self._exchange(message)
            except ActuatorUnavailable as error:
                self.failures += 1
                self.problem = str(error)
                raise
            self.problem = None
        if answer.get("ok"):
            return answer
        code = str(answer.get("error", "gpu_error"))
        kind = _ERRORS.get(code, GpuError)
        nvml_code = answer.get("nvml_code")
        if not isinstance(nvml_code, int) or isinstance(nvml_code, bool):
            nvml_code = None  # an older actuator's answer, or not NVML's failure
        elif kind is not PeerRefused:
            # NVML's error as this process's NVML would have raised it, code and all:
            # the loop's driver-gone handling (DRIVER_GONE_CODES) reads both.
            kind = NVML_ERROR_MAP.get(nvml_code, GpuError)
        where = f"GPU {gpu}: " if gpu is not None else ""
        raise kind(
            f"{where}actuator refused ({code}): {answer.get('message', '')}",
            gpu=gpu,
            code=nvml_code,
        )

    def check(self) -> str | None:
        """Once per tick: connect if needed, renew the lease when due; the reason the
        actuator cannot take writes now, or None."""
        with self._lock:
            if self._sock is not None and self._peer_closed():
                self._disconnect()  # the actuator went away: its locks went with it
        due = self._clock() - self._last_ok_s >= RENEW_SHARE * self.granted_lease_s
        if self._sock is None or due:
            try:
                self.request({"op": "renew"})
            except ActuatorUnavailable as error:
                return str(error)
            except PermissionDenied as error:
                return str(error)
        return None

    def _peer_closed(self) -> bool:
        """True when the actuator's end is closed (seen without blocking)."""
        assert self._sock is not None
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            return bool(readable) and self._sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def close(self) -> None:
        """Close the connection: the actuator resets whatever this lease held."""
        with self._lock:
            self._disconnect()


_CLIENTS: dict[str, ActuatorClient] = {}


def shared_client(path: str, *, lease_s: float, timeout_s: float) -> ActuatorClient:
    """The process's one client for ``path`` (one connection, one lease), counted per
    user; :meth:`ActuatorBackend.close` releases it."""
    client = _CLIENTS.get(path)
    if client is None:
        client = _CLIENTS[path] = ActuatorClient(path, lease_s=lease_s, timeout_s=timeout_s)
    client.users += 1
    return client


def release_client(client: ActuatorClient) -> None:
    """One user fewer; the last one closes the connection."""
    client.users -= 1
    if client.users <= 0:
        client.close()
        if _CLIENTS.get(client.path) is client:
            del _CLIENTS[client.path]


class ActuatorBackend(ReadThroughBackend):
    """One GPU: read through ``reader`` (NVML, unprivileged), written through the actuator.

    The GPU is named to the actuator by its UUID when the reader knows it, else by its
    label, so both sides agree whatever index order each process sees.
    """

    def __init__(
        self,
        reader: GpuBackend,
        client: ActuatorClient,
        *,
        release: Callable[[ActuatorClient], None] = release_client,
    ) -> None:
        super().__init__(reader)
        self._client = client
        self._release = release
        self._name_on_wire = str(getattr(reader, "uuid", "") or reader.label)

    @property
    def write_epoch(self) -> int:
        """Changes when the actuator connection (and so the lease) is new."""
        return self._client.epoch

    @property
    def client(self) -> ActuatorClient:
        """The shared connection."""
        return self._client

    def write_path_problem(self) -> str | None:
        """Renew the lease when due; why writes cannot go through now, or None."""
        return self._client.check()

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Ask the actuator to lock this GPU's SM clock into ``[min_mhz, max_mhz]``."""
        self._check_write(min_mhz, max_mhz)
        self._client.request(
            {
                "op": "lock",
                "gpu": self._name_on_wire,
                "min_mhz": int(min_mhz),
                "max_mhz": int(max_mhz),
            },
            gpu=self.label,
        )

    def reset_clocks(self) -> None:
        """Ask the actuator to reset this GPU's lock."""
        self._check_write()
        self._client.request({"op": "reset", "gpu": self._name_on_wire}, gpu=self.label)

    def close(self) -> None:
        """Close the reader and release the shared connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._reader.close()
        self._release(self._client)


def probe_actuator(path: str, timeout_s: float) -> str | None:
    """Why the actuator on ``path`` is not answering, or None when it is: connect, ask
    what is held, and wait ``timeout_s`` for one answer line. Any answer counts, a
    refusal too (a probe running as another user than the governor's is refused, and the
    refusal comes from the same serving loop that serves the governor)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.settimeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        try:
            peer.connect(path)
            with contextlib.suppress(OSError):  # a refusal may close before it reads
                peer.sendall(b'{"op":"held"}\n')
            answer = b""
            while b"\n" not in answer:
                left = deadline - time.monotonic()
                if left <= 0.0:
                    raise TimeoutError
                peer.settimeout(left)
                chunk = peer.recv(4096)
                if not chunk:
                    break
                answer += chunk
                if len(answer) > MAX_ANSWER_BYTES:
                    break  # no answer is this long: something else streams on the socket
        except TimeoutError:
            return f"no answer within {timeout_s:g} s"
        except OSError as error:
            return f"cannot connect: {error.strerror or error}"
    line = answer.split(b"\n", 1)[0]
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        message = None
    if not isinstance(message, dict) or "ok" not in message:
        return (
            "closed without an answer"
            if not line
            else "answered something else than the actuator protocol"
        )
    return None


def _bind_problem(path: str) -> str | None:
    """Why no socket can be made at the free ``path`` (a read-only directory, /proc), or
    None: a socket bound there once, and removed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as trial:
        try:
            trial.bind(path)
        except OSError as error:
            return f"cannot make a socket there: {error.strerror or error}"
    with contextlib.suppress(OSError):
        os.unlink(path)
    return None


def socket_path_taken(path: str, timeout_s: float = 1.0) -> str | None:
    """Why the actuator cannot serve ``path``, checked before it opens a GPU: no such
    directory, one no socket can be made in (it reset every GPU, then failed to bind),
    another kind of file there (never replaced), or another actuator answering on it (a
    second one reset every GPU the first's governor held, then took its socket); None
    when the path is free or a stale socket a dead actuator left."""
    directory = os.path.dirname(path) or "/"
    if not os.path.isdir(directory):
        return f"no such directory {directory}"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return _bind_problem(path)
    except OSError as error:
        return f"cannot use it: {error.strerror or error}"
    if not stat.S_ISSOCK(mode):
        return "exists and is not a socket; not replacing it"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(path)
        except OSError:  # refused: nothing listens (stale), or not ours to reach
            return None
    return "another process serves this socket (an actuator already running?); stop it first"
