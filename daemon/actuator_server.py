"""The server of ``gpugov actuator``, the privileged half of the split mode, small enough
to read at once (its command line, flags and liveness probe: :mod:`daemon.actuator_command`).

It holds the one privilege the governor needs (locking SM clocks: root or CAP_SYS_ADMIN)
and nothing else: no HTTP, no engine parsing, no controller, no numba, no pydantic. It
serves a Unix socket, one JSON object per line each way (``docs/actuator.md``):

* ``{"op": "hello", "lease_s": 3}``: the lease this connection wants; answers the GPUs
  and their lockable ranges.
* ``{"op": "lock", "gpu": "0", "min_mhz": 1410, "max_mhz": 1410}``: lock one configured
  GPU within its supported range; at most one lock per GPU per ``min_relock_s``.
* ``{"op": "reset", "gpu": "0"}``: reset one configured GPU's lock.
* ``{"op": "renew"}`` and ``{"op": "held"}``: keep the lease; report what is held.

Every answer is ``{"ok": true, ...}`` or ``{"ok": false, "error": CODE, "message": ...}``
(with ``"nvml_code": N`` where an NVML call failed with return code N).
:data:`PROTOCOL` (the hello's ``protocol``) changes with any change a peer of the other
version would misread (a field removed or its meaning changed, an op the governor needs);
a field added that the other side may ignore (``nvml_code``) leaves it. The governor
takes writes only to an actuator of its own protocol (one line otherwise).
A peer is accepted only when ``SO_PEERCRED`` shows the allowed uid. A lock is a lease:
it is held while its connection is open and sends a request at least every ``lease_s``;
when the connection closes (the governor exited or was killed, even by SIGKILL) or goes
quiet past its deadline, every GPU it locked is reset at once. At start every configured
GPU is reset (no lease holds it yet), and on SIGTERM every lock is reset before exit.
Under systemd it pings the watchdog from its serving loop (``daemon/sd_notify.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pwd
import selectors
import socket
import stat
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpugov.daemon.backend import GpuBackend
from gpugov.daemon.errors import (
    GpuError,
    GpugovError,
    GpuLost,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.exit_restore import PERMANENT_RESET_ERRORS, Outcome, retry_each

log = logging.getLogger(__name__)

PROTOCOL = 1
DEFAULT_SOCKET = "/run/gpugov-actuator/actuator.sock"
DEFAULT_LEASE_S = 3.0
MIN_LEASE_S = 0.2
DEFAULT_MAX_LEASE_S = 30.0
DEFAULT_MIN_RELOCK_S = 0.05
"""The least seconds between two locks of one GPU (``--min-relock-s``): the ~50 ms at which
clock changes stall a tensor-parallel group's collectives, a guard under the governor's
own pacing (``safety.min_relock_interval_s``, 0.1 s by its ticks), which leaves a tick's
latency room: a lock is written some milliseconds into its tick, more in one than the
next, so two changes a tick apart can reach the actuator sooner than 0.1 s."""
MAX_LINE_BYTES = 4096
"""A request line longer than this closes the connection (no request is that long)."""
MAX_PENDING_OUT_BYTES = 64 * 1024
"""A peer that does not read its answers is dropped once this many bytes wait."""
MAX_CLIENTS = 16
SOCKET_MODE = 0o666
"""Anyone may connect; SO_PEERCRED decides who is served."""
_TICK_S = 0.1
STOP_RESET_ATTEMPTS = 5
STOP_RESET_BACKOFF_S = 0.2
"""The stop's resets: tries and first backoff, as ``gpugov run``'s exit (3 s of waits at
most, well inside the unit's ``TimeoutStopSec=``)."""
RESET_RETRY_S = 1.0
"""A reset that failed (a lease's end, the start) is tried again this often."""
_ERRORS: tuple[tuple[type[GpuError], str], ...] = (
    (PermissionDenied, "permission"),
    (NotSupported, "not_supported"),
    (GpuLost, "lost"),
    (TransientGpuError, "transient"),
)


def error_code(error: GpuError) -> str:
    """The protocol's name for a GPU error (the governor maps it back)."""
    return next((code for kind, code in _ERRORS if isinstance(error, kind)), "gpu_error")


def refusal(error: GpuError) -> dict[str, Any]:
    """The answer to a request an NVML call failed: the protocol's code, the message and,
    where NVML gave one, its return code (``nvml_code``), by which the governor raises
    the error NVML's own would have been (the driver gone: codes 1, 6, 9, 12, 18)."""
    answer: dict[str, Any] = {"ok": False, "error": error_code(error), "message": str(error)}
    if isinstance(error.code, int) and not isinstance(error.code, bool):
        answer["nvml_code"] = error.code
    return answer


class Refused(Exception):
    """A request the actuator will not carry out; ``code`` goes on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Gpu:
    """One configured GPU: its backend, lockable range and who holds its lock."""

    backend: GpuBackend
    uuid: str
    min_mhz: int
    max_mhz: int
    holder: Connection | None = None
    held: tuple[int, int] | None = None
    last_lock_s: float = -1e9
    retry_reset_s: float | None = None
    """When a reset failed: when to try it again (a lost lease's lock is never kept)."""


@dataclass(eq=False)
class Connection:
    """One accepted, authenticated peer and its lease."""

    sock: socket.socket
    pid: int
    uid: int
    lease_s: float
    deadline_s: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    closing: bool = False


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def resolve_uid(allowed: str) -> int | None:
    """The uid ``allowed`` names now: a number, or a user name (a systemd DynamicUser
    resolves only while its unit runs, so it is looked up at each connection)."""
    if allowed.isascii() and allowed.isdigit():
        return int(allowed)
    try:
        return pwd.getpwnam(allowed).pw_uid
    except KeyError:
        return None


class ActuatorServer:
    """The socket server: accepts, authenticates, serves requests, expires leases.

    Args:
        gpus: the configured GPUs' backends (NVML), opened and listed by the caller.
        socket_path: where to listen.
        allow: the governor's uid or user name.
        max_lease_s: the longest lease a peer may ask for.
        min_relock_s: least seconds between two lock writes to one GPU.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        gpus: Sequence[GpuBackend],
        socket_path: str,
        allow: str,
        *,
        max_lease_s: float = DEFAULT_MAX_LEASE_S,
        min_relock_s: float = DEFAULT_MIN_RELOCK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not gpus:
            raise GpugovError("no GPU to serve")
        self.gpus: dict[str, Gpu] = {}
        self._by_name: dict[str, Gpu] = {}
        for backend in gpus:
            clocks = backend.supported_clocks_mhz()
            uuid = str(getattr(backend, "uuid", "") or backend.label)
            gpu = Gpu(backend, uuid, min(clocks), max(clocks))
            self.gpus[backend.label] = gpu
            self._by_name[backend.label] = self._by_name[uuid] = gpu
        self.socket_path = socket_path
        self.allow = allow
        self.max_lease_s = max(MIN_LEASE_S, max_lease_s)
        self.min_relock_s = min_relock_s
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._connections: dict[socket.socket, Connection] = {}
        self.refused_peers = 0
        self._refusals_logged: set[int] = set()
        self.stopping = False

    # ------------------------------------------------------------------ lifecycle
    def reset_all(self, why: str) -> list[str]:
        """Reset every configured GPU; the labels that failed (logged)."""
        failed = []
        for label, gpu in self.gpus.items():
            try:
                gpu.backend.reset_clocks()
            except GpuError as error:
                if isinstance(error, PermissionDenied):
                    raise
                failed.append(label)
                gpu.retry_reset_s = self._clock() + RESET_RETRY_S
                log.error("GPU %s: reset (%s) failed, retrying: %s", label, why, error)
                continue
            gpu.holder, gpu.held = None, None
            log.info("GPU %s: SM clock lock reset (%s)", label, why)
        return failed

    def listen(self) -> None:
        """Bind the socket (replacing a stale one, never another kind of file)."""
        path = self.socket_path
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
            else:
                raise GpugovError(f"{path}: exists and is not a socket; not replacing it")
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, SOCKET_MODE)
        listener.listen(MAX_CLIENTS)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ)

    def close(self, sleep: Callable[[float], Any] = time.sleep) -> list[str]:
        """Reset every GPU, close every connection and the socket; the GPUs not reset.
        A reset failing for now is retried as ``gpugov run``'s exit retries it (5 tries,
        backoff from 0.2 s): one NVML timeout left the GPU locked (exit 6)."""
        whys = {
            label: f"actuator stopping; held by pid {self._pid(gpu)}"
            for label, gpu in self.gpus.items()
            if gpu.held is not None or gpu.holder is not None or gpu.retry_reset_s is not None
        }

        lost: set[str] = set()

        def attempt(label: str, _attempt: int) -> Outcome:
            error = self._reset(self.gpus[label], whys[label])
            if error is None:
                return "done"
            if isinstance(error, GpuLost):
                lost.add(label)
            return "failed" if isinstance(error, PERMANENT_RESET_ERRORS) else "retry"

        failed, pending = retry_each(
            list(whys),
            attempt,
            attempts=STOP_RESET_ATTEMPTS,
            backoff_s=STOP_RESET_BACKOFF_S,
            sleep=sleep,
        )
        failed = [label for label in self.gpus if label in failed or label in pending]
        for label in failed:
            if label not in lost:
                self._hold_top(self.gpus[label])
        for conn in list(self._connections.values()):
            self._drop(conn, reset=False)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        return failed

    @staticmethod
    def _hold_top(gpu: Gpu) -> None:
        """A GPU whose reset failed (a lease's end, the stop), held below its top clock
        (or at clocks unknown): lock the top clock instead, as ``gpugov run``'s exit does,
        so it is not left low while the reset is retried or once the actuator is gone; a
        lock that fails too is only logged (DEBUG)."""
        if gpu.held is not None and gpu.held[1] >= gpu.max_mhz:
            return
        label = gpu.backend.label
        try:
            gpu.backend.lock_clocks(gpu.max_mhz, gpu.max_mhz)
        except GpuError as error:
            log.debug("GPU %s: top clock after a failed reset failed: %s", label, error)
            return
        gpu.held = (gpu.max_mhz, gpu.max_mhz)
        log.warning(
            "GPU %s: its reset failed; locked at the top clock (%d MHz) instead, so it is not "
            "held low (it is still locked: gpugov reset-clocks unlocks it)",
            label,
            gpu.max_mhz,
        )

    @staticmethod
    def _pid(gpu: Gpu) -> str:
        """The holder's pid for a log line."""
        return str(gpu.holder.pid) if gpu.holder is not None else "none"

    def serve(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        progress: Callable[[], None] = lambda: None,
    ) -> None:
        """Serve until ``should_stop()`` (checked at least every 0.1 s), calling
        ``progress()`` after every completed round (the systemd watchdog's ping: a round
        stuck in an NVML call sends none)."""
        while not should_stop() and not self.stopping:
            self.step(_TICK_S)
            progress()

    def step(self, timeout_s: float) -> None:
        """One round: wait for events (at most ``timeout_s`` or the next deadline),
        handle them, then expire leases whose deadline passed."""
        now = self._clock()
        deadlines = [c.deadline_s for c in self._connections.values()]
        wait = min([timeout_s, *[max(0.0, d - now) for d in deadlines]])
        for key, events in self._selector.select(wait):
            sock = key.fileobj
            if sock is self._listener:
                for _ in range(2 * MAX_CLIENTS):  # drain the backlog, boundedly
                    if not self._accept():
                        break
                continue
            conn = self._connections.get(sock)  # type: ignore[call-overload]
            if conn is None:
                continue
            if events & selectors.EVENT_READ:
                self._read(conn)
            if events & selectors.EVENT_WRITE and not conn.closing:
                self._flush(conn)
        now = self._clock()
        for conn in list(self._connections.values()):
            if now > conn.deadline_s:
                self._expire(conn)
        for gpu in self.gpus.values():
            if gpu.retry_reset_s is not None and now >= gpu.retry_reset_s:
                self._reset(gpu, "retrying a reset that failed")

    # ---------------------------------------------------------------- connections
    def _accept(self) -> bool:
        """Accept one waiting peer and serve it or turn it away; False when none waits."""
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as error:  # out of descriptors: drop nothing, try again later
            log.warning("accept failed: %s", error)
            return False
        try:
            pid, uid, _gid = peer_credentials(sock)
        except OSError:
            sock.close()
            return True
        allowed = resolve_uid(self.allow)
        if uid != allowed:
            self.refused_peers += 1
            if uid not in self._refusals_logged and len(self._refusals_logged) < 64:
                self._refusals_logged.add(uid)
                log.warning(
                    "refused a connection from pid %d uid %d: only uid %s (%s) is served",
                    pid,
                    uid,
                    allowed,
                    self.allow,
                )
            self._answer_and_close(sock, "forbidden", f"uid {uid} is not allowed")
            return True
        if len(self._connections) >= MAX_CLIENTS:
            self._answer_and_close(sock, "busy", f"at most {MAX_CLIENTS} connections")
            return True
        sock.setblocking(False)
        lease = min(DEFAULT_LEASE_S, self.max_lease_s)
        conn = Connection(sock, pid, uid, lease, self._clock() + lease)
        self._connections[sock] = conn
        self._selector.register(sock, selectors.EVENT_READ)
        log.info("connection from pid %d (uid %d)", pid, uid)
        return True

    @staticmethod
    def _answer_and_close(sock: socket.socket, code: str, message: str) -> None:
        """Turn a peer away with one refusal line."""
        try:
            sock.setblocking(False)
            sock.send(_line({"ok": False, "error": code, "message": message}))
        except OSError:
            pass
        sock.close()

    def _read(self, conn: Connection) -> None:
        """Read what the peer sent and answer every complete line; EOF ends its lease."""
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, reset=True, why=f"pid {conn.pid} disconnected")
            return
        conn.inbox += data
        while not conn.closing:
            end = conn.inbox.find(b"\n", 0, MAX_LINE_BYTES + 1)
            if end < 0:
                # Over-long whether or not its end came in the same read.
                if len(conn.inbox) > MAX_LINE_BYTES:
                    self._send(
                        conn, {"ok": False, "error": "bad_request", "message": "line too long"}
                    )
                    self._drop(conn, reset=True, why=f"pid {conn.pid} sent an over-long line")
                return
            line = bytes(conn.inbox[:end])
            del conn.inbox[: end + 1]
            self._send(conn, self.handle(conn, line))

    def _send(self, conn: Connection, message: dict[str, Any]) -> None:
        """Queue an answer and send what the socket takes now."""
        conn.outbox += _line(message)
        if len(conn.outbox) > MAX_PENDING_OUT_BYTES:
            self._drop(conn, reset=True, why=f"pid {conn.pid} does not read its answers")
            return
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        """Send queued answers; wait for writability while some remain."""
        if conn.closing:
            return
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn, reset=True, why=f"pid {conn.pid} went away")
            return
        del conn.outbox[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
        self._selector.modify(conn.sock, events)

    def _expire(self, conn: Connection) -> None:
        """End a lease whose deadline passed: reset its GPUs, close it."""
        why = f"lease of pid {conn.pid} expired ({conn.lease_s:g} s without a request)"
        self._drop(conn, reset=True, why=why)

    def _drop(self, conn: Connection, *, reset: bool, why: str = "") -> None:
        """Close ``conn``; with ``reset``, reset every GPU its lease held."""
        if conn.closing:
            return
        conn.closing = True
        self._connections.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()
        held = [gpu for gpu in self.gpus.values() if gpu.holder is conn]
        if reset:
            for gpu in held:
                self._reset(gpu, why)
        if why:
            log.info("connection closed: %s", why)

    def _reset(self, gpu: Gpu, why: str) -> GpuError | None:
        """Reset ``gpu`` as its lease ended; a failure (returned) frees the GPU (no lease
        holds it) and is retried every :data:`RESET_RETRY_S` until it succeeds or a lock
        replaces it. Meanwhile the GPU is locked at its top clock (:meth:`_hold_top`): a
        reset that kept failing left it at the lost governor's low clock."""
        label = gpu.backend.label
        gpu.holder = None
        try:
            gpu.backend.reset_clocks()
        except GpuError as error:
            if gpu.retry_reset_s is None:
                log.error("GPU %s: reset (%s) failed, retrying: %s", label, why, error)
                if not isinstance(error, GpuLost):
                    self._hold_top(gpu)
            gpu.retry_reset_s = self._clock() + RESET_RETRY_S
            return error
        if gpu.retry_reset_s is not None:
            log.warning("GPU %s: SM clock lock reset on a retry", label)
        gpu.held, gpu.retry_reset_s = None, None
        log.warning("GPU %s: SM clock lock reset: %s", label, why)
        return None

    # -------------------------------------------------------------------- requests
    def handle(self, conn: Connection, line: bytes) -> dict[str, Any]:
        """One request line to its answer; a valid request renews the lease."""
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise Refused("bad_request", "a request is a JSON object")
            op = request.get("op")
            conn.deadline_s = self._clock() + conn.lease_s
            if op == "hello":
                return self._hello(conn, request)
            if op == "renew":
                return {"ok": True, "lease_s": conn.lease_s}
            if op == "held":
                return self._held(conn)
            if op == "lock":
                return self._lock(conn, request)
            if op == "reset":
                return self._reset_request(conn, request)
            raise Refused("bad_request", f"unknown op {op!r}")
        except (ValueError, RecursionError):  # RecursionError: nesting too deep
            return {"ok": False, "error": "bad_request", "message": "not a JSON line"}
        except Refused as refused:
            return {"ok": False, "error": refused.code, "message": str(refused)}
        except GpuError as error:
            return refusal(error)
        except Exception as error:  # never let one request end the process that holds leases
            log.exception("request from pid %d failed", conn.pid)
            return {"ok": False, "error": "gpu_error", "message": f"internal error: {error!r}"}

    def _hello(self, conn: Connection, request: dict[str, Any]) -> dict[str, Any]:
        """Grant the lease asked for, within bounds; list the GPUs served."""
        asked = request.get("lease_s", DEFAULT_LEASE_S)
        if isinstance(asked, bool) or not isinstance(asked, int | float) or not asked > 0:
            raise Refused("bad_request", "lease_s must be a positive number of seconds")
        try:
            seconds = float(asked)
        except OverflowError:  # an integer beyond any float (JSON allows it): the longest
            seconds = math.inf
        conn.lease_s = min(max(seconds, MIN_LEASE_S), self.max_lease_s)
        conn.deadline_s = self._clock() + conn.lease_s
        gpus = [
            {"gpu": label, "uuid": g.uuid, "min_mhz": g.min_mhz, "max_mhz": g.max_mhz}
            for label, g in self.gpus.items()
        ]
        return {"ok": True, "protocol": PROTOCOL, "lease_s": conn.lease_s, "gpus": gpus}

    def _held(self, conn: Connection) -> dict[str, Any]:
        """Every lock held now, and whether this connection holds it."""
        held = {
            label: {"min_mhz": g.held[0], "max_mhz": g.held[1], "mine": g.holder is conn}
            for label, g in self.gpus.items()
            if g.held is not None
        }
        return {"ok": True, "held": held, "lease_s": conn.lease_s}

    def _gpu(self, request: dict[str, Any]) -> Gpu:
        """The configured GPU a request names (label or UUID), else ``unknown_gpu``."""
        name = request.get("gpu")
        gpu = self._by_name.get(name) if isinstance(name, str) else None
        if gpu is None:
            raise Refused("unknown_gpu", f"GPU {name!r} is not one this actuator governs")
        return gpu

    def _owned_elsewhere(self, gpu: Gpu, conn: Connection) -> None:
        """Refuse (``busy``) a GPU that another live lease holds."""
        if gpu.holder is not None and gpu.holder is not conn:
            raise Refused("busy", f"GPU {gpu.backend.label} is held by pid {gpu.holder.pid}")

    def _lock(self, conn: Connection, request: dict[str, Any]) -> dict[str, Any]:
        """Lock within the supported range, at most once per ``min_relock_s`` per GPU,
        also when it is the lock held (the GPU's own may have been reset since)."""
        gpu = self._gpu(request)
        low, high = request.get("min_mhz"), request.get("max_mhz")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
            raise Refused("bad_request", "min_mhz and max_mhz must be integers (MHz)")
        assert isinstance(low, int) and isinstance(high, int)
        if not gpu.min_mhz <= low <= high <= gpu.max_mhz:
            raise Refused(
                "out_of_range",
                f"GPU {gpu.backend.label}: {low}-{high} MHz is outside its supported range "
                f"{gpu.min_mhz}-{gpu.max_mhz} MHz (or min above max)",
            )
        self._owned_elsewhere(gpu, conn)
        # A lock equal to the one held is written again: another tool may have reset it
        # (nvidia-smi -rgc), and the governor asks again only when its readback says so.
        # Within the rate limit it is the lock held, not a refusal (the governor counts a
        # refusal as a failed write): its readback asks again after the window.
        now = self._clock()
        wait = gpu.last_lock_s + self.min_relock_s - now
        if wait > 0:
            if gpu.holder is conn and gpu.held == (low, high):
                return {"ok": True, "written": False}
            raise Refused("rate_limited", f"GPU {gpu.backend.label}: relocked too soon")
        gpu.last_lock_s = now
        gpu.holder = conn  # from here on a failure half way is reset with the lease
        gpu.backend.lock_clocks(low, high)
        gpu.held, gpu.retry_reset_s = (low, high), None
        return {"ok": True, "written": True}

    def _reset_request(self, conn: Connection, request: dict[str, Any]) -> dict[str, Any]:
        """Reset a GPU this connection holds, or one no lease holds."""
        gpu = self._gpu(request)
        self._owned_elsewhere(gpu, conn)
        gpu.backend.reset_clocks()
        gpu.holder, gpu.held, gpu.retry_reset_s = None, None, None
        return {"ok": True}


def _line(message: dict[str, Any]) -> bytes:
    """One answer as a JSON line."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"
