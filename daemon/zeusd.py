"""``backend = "zeusd"``: clock writes through zeusd, the Zeus project's privileged daemon.

For sites that already run zeusd (github.com/ml-energy/zeus, ``zeusd/``, version 0.3 or
newer, whose GPU routes take ``gpu_ids`` as a query parameter). The governor
reads its GPUs through NVML itself and asks zeusd, over its HTTP API on a Unix socket
(zeusd's default) or TCP, to lock and reset the SM clock:

* ``POST /gpu/set_gpu_locked_clocks?gpu_ids=I&min_clock_mhz=L&max_clock_mhz=H&block=true``
* ``POST /gpu/reset_gpu_locked_clocks?gpu_ids=I&block=true``
* ``GET /discover`` (whether zeusd answers; its GPU ids)

with ``Authorization: Bearer TOKEN`` when zeusd requires a token. A 200 is success; a
401 or 403 is :class:`~daemon.errors.PeerRefused`; a 400 is a refused request
(:class:`~daemon.errors.GpuError`, or ``NotSupported`` when zeusd says so); a 5xx, a
timeout or no answer is transient: counted, retried next tick, and the domain holds its
fail-safe until zeusd answers again. zeusd has no lease: a lock a SIGKILLed governor
left stays until the next start reconciles it (``docs/actuator.md``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from gpugov.daemon.backend import GpuBackend, ReadThroughBackend
from gpugov.daemon.errors import (
    GpuError,
    GpuUnavailable,
    NotSupported,
    PeerRefused,
    TransientGpuError,
    printable,
)
from gpugov.daemon.files import InputFileError, read_input_text
from gpugov.daemon.scrape import ExchangeDeadline, Resolver, resolved_connection

MAX_BODY_BYTES = 64 * 1024
PROBE_EVERY_S = 1.0
"""While zeusd is unreachable, ``GET /discover`` at most this often to see it back."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket (zeusd's default transport)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class ZeusdUnavailable(TransientGpuError):
    """zeusd did not answer (no socket, refused, timed out, a 5xx)."""


class ZeusdClient:
    """Requests to one zeusd, each on a fresh connection bounded by ``timeout_s``.

    Args:
        socket_path: zeusd's Unix socket, or None for TCP.
        url: ``http://HOST:PORT`` for TCP.
        token: the bearer token, when zeusd requires one.
    """

    def __init__(
        self,
        *,
        socket_path: str | None = None,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (socket_path is None) == (url is None):
            raise ValueError("give socket_path or url, one of them")
        self.socket_path = socket_path
        self.url = url
        self.token = token
        self.timeout_s = timeout_s
        self._clock = clock
        self.problem: str | None = None
        self.failures = 0
        self.users = 0
        """The GPUs sharing this client (:func:`shared_zeusd_client`)."""
        self._probed_s = -1e9
        self._lock = threading.Lock()
        self._resolve = Resolver()
        """zeusd's host name (``url``) looked up within ``timeout_s``: the system's lookup
        has no deadline, and a DNS server that does not answer held each request."""

    @classmethod
    def from_config(cls, section: Any) -> ZeusdClient:
        """From a :class:`~daemon.config.ZeusdBackendConfig`; reads the token file.

        Raises:
            GpuUnavailable: the token file cannot be read.
        """
        token = None
        if section.token_file is not None:
            # Through the bounded reader: a FIFO there hung the start (and check-config),
            # and a file that is not UTF-8 text ended it in a UnicodeDecodeError traceback.
            try:
                token = read_input_text(section.token_file, "token").strip()
            except InputFileError as error:
                raise GpuUnavailable(f"zeusd token file {printable(str(error))}") from error
            if not (token.isascii() and token.isprintable() and " " not in token):
                # Sent as it is, a line break in it ended the first request in a
                # ValueError traceback ("Invalid header value").
                raise GpuUnavailable(
                    f"zeusd token file {printable(str(section.token_file))}: holds more than "
                    "one word, or a character no HTTP header takes (a line break, a control "
                    "or non-ASCII character); it must hold the bearer token alone"
                )
        return cls(
            socket_path=str(section.socket) if section.socket is not None else None,
            url=section.url,
            token=token,
            timeout_s=section.timeout_s,
        )

    @property
    def where(self) -> str:
        """zeusd's address, for messages."""
        return self.socket_path or str(self.url)

    def _connection(self) -> http.client.HTTPConnection:
        """A fresh connection to zeusd (Unix socket or TCP, its host name looked up within
        ``timeout_s``).

        Raises:
            ResolveTimeout, OSError: the name's lookup did not answer in time, or failed.
        """
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, self.timeout_s)
        parts = urllib.parse.urlsplit(str(self.url))
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        return resolved_connection(self._resolve, "http", host, port, self.timeout_s)

    def call(self, method: str, path: str, params: dict[str, str] | None = None) -> Any:
        """One request; the decoded JSON body (None when empty).

        Raises:
            ZeusdUnavailable: no answer, too slow, or a 5xx.
            PeerRefused: 401 or 403.
            NotSupported, GpuError: another refusal (a 4xx).
        """
        target = path + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            connection = self._connection()
        except OSError as error:  # its name did not resolve (in time)
            raise ZeusdUnavailable(
                self._failed(f"zeusd at {self.where} unreachable: {error}")
            ) from error
        # One deadline for the whole exchange: the socket's timeout bounds each read, and a
        # zeusd that answers a byte now and then held the call (the loop's probe) for as
        # long as it trickled.
        deadline = ExchangeDeadline(connection, self.timeout_s)
        try:
            connection.request(method, target, headers=headers)
            deadline.track()
            response = connection.getresponse()
            body = response.read(MAX_BODY_BYTES + 1)
            if deadline.expired:  # cut short: what came is no answer
                raise TimeoutError
        except (OSError, http.client.HTTPException) as error:
            if deadline.expired:
                problem = f"zeusd at {self.where}: no complete answer within {self.timeout_s:g} s"
            else:
                problem = f"zeusd at {self.where} unreachable: {error}"
            raise ZeusdUnavailable(self._failed(problem)) from error
        finally:
            deadline.cancel()
            connection.close()
        status = response.status
        message = body[:MAX_BODY_BYTES].decode("utf-8", "replace").strip()
        if status >= 500:
            raise ZeusdUnavailable(self._failed(f"zeusd at {self.where}: HTTP {status}: {message}"))
        self.problem = None
        if status in (401, 403):
            raise PeerRefused(
                f"zeusd at {self.where} refused: HTTP {status}: {message} (zeusd needs root "
                "or CAP_SYS_ADMIN to lock clocks, and this governor a token for GPU control "
                "where zeusd requires one)"
            )
        if status != 200:
            kind = NotSupported if "not supported" in message.lower() else GpuError
            raise kind(f"zeusd at {self.where}: HTTP {status}: {message}")
        if not body:
            return None
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            return None

    def _failed(self, problem: str) -> str:
        """Count a failed request and keep its reason for ``check``; the reason. The
        client is shared by the node's GPUs, whose writer threads call it at once: the
        count is kept under a lock, and each raise names its own failure (another
        thread's success may clear ``problem`` in between)."""
        with self._lock:
            self.failures += 1
            self.problem = problem
        return problem

    def check(self) -> str | None:
        """Once per tick: None when zeusd took the last request; else probe
        ``GET /discover`` at most once a second and say why writes cannot go through."""
        if self.problem is None:
            return None
        now = self._clock()
        if now - self._probed_s >= PROBE_EVERY_S:
            self._probed_s = now
            with contextlib.suppress(GpuError):
                self.call("GET", "/discover")
        return self.problem


_CLIENTS: dict[tuple[str | None, str | None, str | None, float], ZeusdClient] = {}


def shared_zeusd_client(section: Any) -> ZeusdClient:
    """The process's one client for the zeusd ``section`` names (its address, token and
    timeout), counted per user; :meth:`ZeusdBackend.close` releases it. Each GPU had its
    own, and each probed a failed zeusd once a second on the loop's thread: a zeusd that
    answers slowly cost each second ``timeout_s`` times the GPUs.

    Raises:
        GpuUnavailable: the token file cannot be read.
    """
    fresh = ZeusdClient.from_config(section)
    key = (fresh.socket_path, fresh.url, fresh.token, fresh.timeout_s)
    client = _CLIENTS.setdefault(key, fresh)
    client.users += 1
    return client


def release_zeusd_client(client: ZeusdClient) -> None:
    """One user fewer; the last one drops the shared client."""
    client.users -= 1
    if client.users <= 0:
        for key, shared in list(_CLIENTS.items()):
            if shared is client:
                del _CLIENTS[key]


class ZeusdBackend(ReadThroughBackend):
    """One GPU: read through ``reader`` (NVML), written through zeusd by its NVML index."""

    def __init__(
        self,
        reader: GpuBackend,
        client: ZeusdClient,
        *,
        release: Callable[[ZeusdClient], None] = release_zeusd_client,
    ) -> None:
        super().__init__(reader)
        self._client = client
        self._release = release
        self._index = str(getattr(reader, "index", reader.label))

    @property
    def client(self) -> ZeusdClient:
        """The zeusd client."""
        return self._client

    def write_path_problem(self) -> str | None:
        """Why writes cannot go through zeusd now, or None."""
        return self._client.check()

    def _write(self, path: str, params: dict[str, str], what: str) -> None:
        """One POST for this GPU; errors name the GPU and the write."""
        self._check_write()
        try:
            self._client.call("POST", path, {"gpu_ids": self._index, **params, "block": "true"})
        except GpuError as error:
            raise type(error)(f"GPU {self.label}: {what}: {error}", gpu=self.label) from error

    def lock_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """``POST /gpu/set_gpu_locked_clocks`` for this GPU."""
        self._check_write(min_mhz, max_mhz)
        params = {"min_clock_mhz": str(int(min_mhz)), "max_clock_mhz": str(int(max_mhz))}
        self._write("/gpu/set_gpu_locked_clocks", params, f"lock {min_mhz}-{max_mhz} MHz")

    def reset_clocks(self) -> None:
        """``POST /gpu/reset_gpu_locked_clocks`` for this GPU."""
        self._write("/gpu/reset_gpu_locked_clocks", {}, "reset clocks")

    def close(self) -> None:
        """Close the reader and release the shared client (idempotent)."""
        if not self._closed:
            self._closed = True
            self._reader.close()
            self._release(self._client)
