"""One governor per GPU on a node: a hold on each GPU a run locks, seen by any other gpugov.

Two governors with different state directories (a second unit, a ``gpugov run`` by hand
beside the unit, a ``gpugov profile`` beside a running governor) would both lock the same
GPU's clocks, each undoing the other's writes, and the state directory's hold
(:meth:`daemon.lockstate.LockState.hold`) cannot see it. Each GPU a locking run opens is
held by an abstract Unix socket (Linux) named after the GPU's UUID: the kernel frees the
name when the process exits, however it exits, so there is no file to clean up and no
directory or permission to provide. A second run finds the name taken, asks the socket
for its holder (``SO_PEERCRED``) and stops before any write, naming the GPU and the
holder's pid and command line.

Scope: the network namespace. The processes of one host (units, shells, host-network
pods) see one another; a pod with its own network sees only itself (see
``docs/daemon.md``). ``$GPUGOV_GPU_HOLD_SCOPE`` names a separate set of holds: several
emulated or fake nodes on one machine (the test suite) each set their own.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from gpugov.daemon.errors import ConfigError

log = logging.getLogger(__name__)

SCOPE_ENV = "GPUGOV_GPU_HOLD_SCOPE"
"""The environment variable naming the set of holds a run takes part in (default
``gpugov``)."""

ANSWER_POLL_S = 0.1
"""How often a hold's answering thread looks whether it was let go."""

PROBE_TRIES = 20
PROBE_WAIT_S = 0.05
"""A probe of a hold whose listen queue is full (its answering thread behind) tries again
this often, this long apart, before it says the holder is not known."""

PHYSICAL_BACKENDS = frozenset({"nvml", "nvidia-smi", "actuator", "zeusd"})
"""Backends whose GPU is a physical one, named by its UUID node-wide; an emulated GPU is
held within its emulator's address, a simulated one not at all."""


class GpuHeld(ConfigError):
    """Another gpugov process on this node holds a GPU this run would lock.

    Attributes:
        uuid: the GPU's UUID.
        holder: who holds it: ``"pid 4242 (gpugov run --config ...)"``, or ``"pid unknown"``.
    """

    def __init__(self, message: str, uuid: str, holder: str) -> None:
        super().__init__(message)
        self.uuid = uuid
        self.holder = holder


def hold_scope() -> str:
    """The set of holds this process takes part in (:data:`SCOPE_ENV`, else ``gpugov``):
    read once where a start begins, so a start that ends later holds in its own."""
    return os.environ.get(SCOPE_ENV) or "gpugov"


def hold_name(uuid: str, where: str = "", scope: str | None = None) -> bytes:
    """The abstract socket name of the hold on GPU ``uuid`` (``where``: an emulator's
    address, empty for a physical GPU), within ``scope`` (:func:`hold_scope` unless
    given)."""
    scope = hold_scope() if scope is None else scope
    digest = hashlib.sha256(f"{scope}\0{where}\0{uuid}".encode()).hexdigest()[:40]
    return b"\0gpugov-gpu-" + digest.encode()


def _holder(name: bytes) -> str | None:
    """Who holds the socket ``name``: its pid and command line, as the kernel gives the
    listener's credentials to a connecting client; None where nobody listens there
    (``"pid unknown"`` where the connection fails otherwise: held, the holder not told)."""
    credentials = None
    for _ in range(PROBE_TRIES):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(PROBE_WAIT_S)
                probe.connect(name)
                credentials = probe.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
                )
            break
        except (ConnectionRefusedError, FileNotFoundError):
            return None
        except BlockingIOError:  # the holder's listen queue is full for now: try again
            time.sleep(PROBE_WAIT_S)
        except OSError:
            return "pid unknown"
    if credentials is None:
        return "pid unknown"
    pid = struct.unpack("3i", credentials)[0]
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid}"
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if len(command) > 120:
        command = command[:117] + "..."
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def _emulator_key(emulator: str) -> str:
    """An emulator's address as its holds are keyed: host and port, however the URL is
    written (``http://127.0.0.1:8000/v1/`` and ``127.0.0.1:8000`` are one emulator)."""
    parts = urlsplit(emulator if "//" in emulator else f"//{emulator}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{(parts.hostname or '').lower()}:{port}"


def _name_for(uuid: str, kind: str, emulator: str | None, scope: str | None = None) -> bytes | None:
    """The hold's name for GPU ``uuid`` through backend ``kind``; None where no hold
    applies (no UUID, a simulated GPU, a platform without abstract sockets)."""
    if not sys.platform.startswith("linux") or not uuid:
        return None
    if kind in PHYSICAL_BACKENDS:
        return hold_name(uuid, scope=scope)
    if kind == "emulated" and emulator:
        return hold_name(uuid, _emulator_key(emulator), scope)
    return None


def holder_of(uuid: str, kind: str, *, emulator: str | None = None) -> str | None:
    """Who holds GPU ``uuid`` now (``"pid 4242 (gpugov run ...)"``), or None when no
    gpugov does: what ``gpugov status`` shows, holding nothing itself."""
    name = _name_for(uuid, kind, emulator)
    return None if name is None else _holder(name)


class GpuHold:
    """A GPU held for this process: the bound socket, and the thread that takes and
    closes every connection a prober makes (it reads the holder's credentials as it
    connects; left queued, they filled the listen queue and later probes could no longer
    tell the holder)."""

    def __init__(self, held: socket.socket, named: str) -> None:
        self._socket = held
        self._stop = threading.Event()
        held.settimeout(ANSWER_POLL_S)
        self._thread = threading.Thread(target=self._answer, name=f"gpu-hold-{named}", daemon=True)
        self._thread.start()

    def _answer(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            connection.close()

    def stop(self) -> None:
        """Ask the answering thread to end (at most :data:`ANSWER_POLL_S` later)."""
        self._stop.set()

    def close(self) -> None:
        """Let the GPU go: the answering thread ended first (a socket closed under a
        blocked accept kept its name bound a moment), then the socket, which frees the
        name at once."""
        self._stop.set()
        self._thread.join(2 * ANSWER_POLL_S)
        with contextlib.suppress(OSError):
            self._socket.close()


def hold_gpu(
    uuid: str,
    kind: str,
    *,
    named: str,
    emulator: str | None = None,
    scope: str | None = None,
) -> GpuHold | None:
    """Hold GPU ``uuid`` (opened through backend ``kind``, ``named`` as the user named it)
    for this process: the hold to keep while the run may lock it, or None where no
    hold applies (a simulated GPU, a platform without abstract sockets, a sandbox that
    refuses the socket: logged). A thread answers the probes of other processes.
    ``scope``: :func:`hold_scope` as the start read it where it began.

    Raises:
        GpuHeld: another process holds it (the message names the GPU and the holder).
    """
    name = _name_for(uuid, kind, emulator, scope)
    if name is None:
        return None
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        held.bind(name)
        held.listen(socket.SOMAXCONN)
    except OSError as error:
        held.close()
        if error.errno != errno.EADDRINUSE:
            log.warning(
                "GPU %s: cannot hold it against a second gpugov on this node (%s); going on "
                "without the hold",
                named,
                error.strerror or error,
            )
            return None
        holder = _holder(name) or "pid unknown"
        shown = named if named == uuid else f"{named} ({uuid})"
        raise GpuHeld(
            f"GPU {shown} is held by another gpugov on this node ({holder}): two governors "
            "would fight over its clocks; stop the other one (systemctl stop gpugov) or give "
            "this one other GPUs",
            uuid,
            holder,
        ) from error
    return GpuHold(held, named)


@contextlib.contextmanager
def held_for(uuid: str, kind: str, *, named: str, emulator: str | None = None) -> Iterator[None]:
    """Hold GPU ``uuid`` for the block (a lock a previous run left, reset at the start),
    as :func:`hold_gpu` does.

    Raises:
        GpuHeld: another gpugov holds it: it governs the GPU now, and the lock is its.
    """
    held = hold_gpu(uuid, kind, named=named, emulator=emulator)
    try:
        yield
    finally:
        release([held] if held is not None else [])


def release(holds: list[GpuHold]) -> None:
    """Let the holds go (their threads asked to end together, then each closed)."""
    for held in holds:
        held.stop()
    for held in holds:
        held.close()
    holds.clear()
