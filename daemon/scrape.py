"""Fetching a metrics page over HTTP: one kept-alive connection per host, one deadline for
the whole exchange, a size cap, and failures said in words.

The engine sources (:mod:`daemon.engine_sources`) scrape through :class:`KeepAliveFetcher`; it
raises the daemon's :class:`~gpugov.daemon.errors.EngineUnavailable` (nothing usable came
back), :class:`~gpugov.daemon.errors.EngineHttpError` (an HTTP error status) and
:class:`~gpugov.daemon.errors.EngineParseError` (a page too large, not UTF-8, or in an
encoding other than gzip).
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from gpugov.daemon.errors import EngineHttpError, EngineParseError, EngineUnavailable

Fetcher = Callable[[str, float], str]

MAX_PAGE_BYTES = 16 * 1024 * 1024
"""The largest metrics page read (a vLLM page is ~100 KB); a larger one is a bad scrape."""


def _decompressed(body: bytes, encoding: str | None, url: str, max_bytes: int) -> bytes:
    """``body`` as the page it encodes: a gzip answer decompressed (a server or proxy
    that compresses though the request asks for no encoding), within ``max_bytes``.

    Raises:
        EngineParseError: another encoding, a body that is not gzip, or a page that
            decompresses past ``max_bytes``.
    """
    coding = (encoding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding not in ("gzip", "x-gzip"):
        raise EngineParseError(
            f"{url}: the metrics page is {coding}-encoded (Content-Encoding: {encoding}); "
            "gpugov asks for no encoding and decodes only gzip"
        )
    # A gzip body may hold several members, one after another (RFC 1952, 2.2): the page
    # is all of them. Only the first was read, the rest of the page silently dropped.
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            part = inflate.decompress(rest, max_bytes + 1 - size)
        except zlib.error as error:
            where = f" after its first {len(body) - len(rest)} bytes" if parts else ""
            raise EngineParseError(
                f"{url}: the gzip-encoded metrics page is not gzip{where}: {error}"
            ) from error
        parts.append(part)
        size += len(part)
        if size > max_bytes:
            raise EngineParseError(
                f"{url}: the metrics page is over the {max_bytes}-byte limit (gzip-encoded)"
            )
        if not inflate.eof:
            raise EngineParseError(f"{url}: the gzip-encoded metrics page ends mid-stream")
        rest = inflate.unused_data
        if not rest.strip(b"\0"):  # the end, or the zero padding some writers leave
            return b"".join(parts)


_TARGET_SAFE = "".join(chr(code) for code in range(0x21, 0x7F))
"""What a request target keeps as it is: printable ASCII, ``%`` escapes included."""


def request_target(parts: urllib.parse.SplitResult) -> str:
    """The path and query to request, every other character percent-encoded as UTF-8:
    http.client sends ASCII only, so a URL such as ``/metrics?model=café`` raised
    ``UnicodeEncodeError`` at its first scrape, out of the daemon's loop."""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return urllib.parse.quote(target, safe=_TARGET_SAFE)


def _decode(body: bytes, url: str) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise EngineParseError(f"{url}: the metrics page is not UTF-8: {error}") from error


SAID_CHARS = 200
"""The most characters of what a server said (a status line, a reason phrase) a failure's
line quotes."""


def quoted(said: str) -> str:
    """What a server said, on one line: its repr (CR, LF and other control characters
    escaped), cut to :data:`SAID_CHARS` characters. As it came, an SSH server's banner
    ended the failure's log line with its CRLF, and a status line of 64 KB was quoted
    whole."""
    return repr(said[:SAID_CHARS]) + ("..." if len(said) > SAID_CHARS else "")


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it, an IPv6 address in brackets: ``::1:8000`` read
    as the address ``::1:8000``, its port lost in it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe_failure(error: BaseException, host: str, port: int) -> str:
    """What a failed fetch met, in words: a refused connection, a dropped one, a name
    that does not resolve, an answer that is not HTTP (a timeout is said by the caller,
    which knows the deadline)."""
    if isinstance(error, ConnectionRefusedError):
        return f"connection refused (nothing listens on {host_port(host, port)})"
    if isinstance(error, http.client.RemoteDisconnected):
        return "the engine closed the connection without answering"
    if isinstance(error, ConnectionResetError):
        return "the engine reset the connection"
    if isinstance(error, BrokenPipeError):
        return "the connection broke while sending the request"
    if isinstance(error, http.client.IncompleteRead):
        return f"the engine closed the connection mid-page ({len(error.partial)} bytes read)"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve {host}: {error.strerror or error}"
    if isinstance(error, ResolveTimeout):
        return str(error)  # names the host and the time waited
    if isinstance(error, http.client.HTTPException):
        return f"not an HTTP answer ({type(error).__name__}: {quoted(str(error))})"
    if isinstance(error, ssl.SSLError):
        return _tls_failure(error, host, port)
    if isinstance(error, OSError) and error.strerror:
        return f"cannot reach {host_port(host, port)}: {error.strerror}"
    return f"{type(error).__name__}: {error}"


NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
)
"""OpenSSL's reasons for a handshake whose answer was no TLS record (a plain HTTP server)."""


def _tls_failure(error: ssl.SSLError, host: str, port: int) -> str:
    """A failed TLS handshake in words: a certificate not trusted (and how to trust it),
    or an answer that is not TLS (an http:// engine), where it read "cannot reach" an
    engine that answered, with OpenSSL's code."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"the TLS certificate of {host_port(host, port)} is not trusted "
            f"({error.verify_message or error.reason or error}): gpugov checks it against "
            "the system's CA certificates (the SSL_CERT_FILE environment variable names "
            "another bundle)"
        )
    if error.reason in NOT_TLS_REASONS:
        return (
            f"the TLS handshake with {host_port(host, port)} failed: the answer is not TLS "
            f"(an engine serving plain HTTP wants an http:// URL; OpenSSL: {error.reason})"
        )
    return f"the TLS handshake with {host_port(host, port)} failed: {error.reason or error}"


def _redirect_advice(url: str, response: http.client.HTTPResponse) -> str:
    """For a redirect, where to (its ``Location``) and the URL to configure: a page
    mounted with a trailing slash (Starlette's mount of ``prometheus_client``'s app
    answers ``/metrics`` with 307 to ``/metrics/``, prometheus/client_python#1016) is
    not followed, and the bare status left the fix to guess. "" for any other status.
    A ``Location`` that is no URL (``http://[bad``) is quoted as sent: its ``ValueError``
    ended the daemon with a traceback."""
    location = response.getheader("Location")
    if response.status not in (301, 302, 303, 307, 308) or not location:
        return ""
    try:
        target = urllib.parse.urljoin(url, location.strip())[:300]
    except ValueError as error:
        return (
            f" to {location.strip()[:300]!r}, which is no URL ({error}); gpugov follows no redirect"
        )
    return f" to {target}; gpugov follows no redirect: set engine.url to {target}"


def _credentials_advice(response: http.client.HTTPResponse) -> str:
    """For a 401 or 403, that gpugov sends no credentials (and a 401's challenge, quoted):
    a page behind authentication failed every scrape with the bare status. "" for any
    other status."""
    if response.status == 401:
        challenge = response.getheader("WWW-Authenticate")
        asked = (
            f": WWW-Authenticate: {challenge.strip()[:SAID_CHARS]}"
            if challenge and challenge.isprintable()
            else ""
        )
        return (
            f" (the page asks for credentials{asked}; gpugov sends none: give it a metrics "
            "URL that needs none)"
        )
    if response.status == 403:
        return (
            " (the page refuses this client: gpugov sends no credentials: give it a metrics "
            "URL that needs none)"
        )
    return ""


class ExchangeDeadline:
    """Shuts a connection's socket down when the whole exchange passes its deadline.

    A socket timeout bounds one read; a server that trickles a byte at a time resets it
    on every read. The timer bounds the whole request, headers and body together. Used
    by the engine scrape here and by the emulated GPU backend (:mod:`daemon.emulated`).
    """

    def __init__(self, connection: http.client.HTTPConnection, timeout_s: float) -> None:
        self.expired = False
        self._connection = connection
        self._sock: socket.socket | None = None
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def track(self) -> None:
        """Remember the connection's socket once the request is sent: ``getresponse()``
        hands it to the response and clears ``connection.sock`` when the answer will close
        the connection (HTTP/1.0, ``Connection: close``), and the body must still be cut."""
        self._sock = self._connection.sock

    def _expire(self) -> None:
        self.expired = True
        sock = self._connection.sock or self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        """Disarm (the exchange finished in time)."""
        self._timer.cancel()


Address = tuple[Any, ...]
"""One ``socket.getaddrinfo`` row: family, type, protocol, canonical name, address."""


class ResolveTimeout(OSError):
    """A host name's lookup has not answered within the scrape's time left."""


class _Lookup:
    """One ``getaddrinfo`` of a host on a daemon thread, its answer kept for the caller."""

    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.addresses: list[Address] = []
        self.error: OSError | None = None
        self.started_s = time.monotonic()
        threading.Thread(
            target=self._run, args=(host, port), name="gpugov-resolve", daemon=True
        ).start()

    def _run(self, host: str, port: int) -> None:
        try:
            self.addresses = list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as error:
            self.error = error
        except Exception as error:  # the thread's outermost edge: handed to the caller
            self.error = OSError(f"{type(error).__name__}: {error}")
        finally:
            self.done.set()


class Resolver:
    """Host names looked up with a deadline. The system's resolver has none of its own:
    a DNS server that does not answer (a cluster DNS down, under ``ndots:5`` search
    domains) held a scrape, and so the loop, for its 5 s timeout per try and per search
    domain, far past the scrape's deadline and ``stale_after_s``. Each lookup runs on a
    daemon thread, waited for at most the time left; one still running past that is not
    started again (the next scrape waits for it, then takes its answer). An IP address
    is no name and is not looked up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], _Lookup] = {}

    def __call__(self, host: str, port: int, wait_s: float) -> list[Address] | None:
        """``host``'s addresses (None for an IP address: connect to it as it is).

        Raises:
            ResolveTimeout: no answer within ``wait_s`` (the lookup goes on).
            OSError: the lookup failed (``socket.gaierror``: no such name).
        """
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return None
        with self._lock:
            lookup = self._running.get((host, port))
            if lookup is None:
                lookup = self._running[(host, port)] = _Lookup(host, port)
        if not lookup.done.wait(max(wait_s, 0.0)):
            age = time.monotonic() - lookup.started_s
            raise ResolveTimeout(
                f"cannot resolve {host}: no answer within {wait_s:.3g} s (the lookup has "
                f"run {age:.1f} s: a DNS server that does not answer)"
            )
        with self._lock:
            if self._running.get((host, port)) is lookup:
                del self._running[(host, port)]
        if lookup.error is not None:
            raise lookup.error
        return lookup.addresses


def connect_any(
    addresses: Sequence[Address],
    _address: tuple[str, int],
    timeout: Any = None,
    source_address: Any = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> socket.socket:
    """``socket.create_connection`` to addresses already looked up, each in turn (an
    ``HTTPConnection``'s ``_create_connection``: its Host header and TLS name stay the
    host's).

    A numeric ``timeout`` bounds all the tries together, not each: an address that does
    not answer (a blackholed IPv6 route before a working IPv4 one) leaves the next what is
    left of it, so a name with N unreachable addresses costs the scrape ``timeout``, never
    N times it (the exchange's timer cannot cut a connect: the socket is not yet the
    connection's). Once it is spent the addresses left are not tried.

    Raises:
        OSError: the last try's error (``TimeoutError`` once the time is spent).
    """
    error: OSError | None = None
    end = clock() + timeout if isinstance(timeout, int | float) else None
    for family, kind, protocol, _name, address in addresses:
        left: float | None = None
        if end is not None:
            left = end - clock()
            if left <= 0:
                error = TimeoutError(
                    f"timed out: no address answered within {timeout:.3g} s"
                    + ("" if error is None else f" (last: {error})")
                )
                break
        sock = socket.socket(family, kind, protocol)
        try:
            if left is not None:
                sock.settimeout(left)
            if source_address:
                sock.bind(source_address)
            sock.connect(address)
        except OSError as caught:
            sock.close()
            error = caught
            continue
        return sock
    raise error if error is not None else OSError("the name has no address")


def resolved_connection(
    resolve: Resolver, scheme: str, host: str, port: int, timeout_s: float
) -> http.client.HTTPConnection:
    """A new HTTP(S) connection to ``host``, its name looked up by ``resolve`` within
    ``timeout_s`` (the system's lookup has no deadline; the engine scrape, zeusd's client).

    Raises:
        ResolveTimeout, OSError: as :class:`Resolver` does.
    """
    addresses = resolve(host, port, timeout_s)
    connection: http.client.HTTPConnection
    if scheme == "https":
        connection = http.client.HTTPSConnection(host, port, timeout=timeout_s)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    if addresses is not None:
        # Connect to what was looked up: the connection would look the name up again,
        # with no deadline.
        connection._create_connection = (  # type: ignore[attr-defined]
            lambda address, timeout=None, source=None: connect_any(
                addresses, address, timeout, source
            )
        )
    return connection


class KeepAliveFetcher:
    """GET over one persistent HTTP/1.1 connection per host, reopened when it fails.

    A fresh connection per scrape (urllib) costs a TCP handshake and urllib's machinery,
    milliseconds on a small VM; the engines' servers (uvicorn, axum) keep connections
    alive. ``timeout_s`` is one deadline for the whole exchange (connect, headers, body),
    not per socket read, so a trickling or hung engine costs at most ``timeout_s``. A
    page over ``max_bytes`` is refused, and so is a body shorter than its Content-Length
    (a connection closed mid-page). A reused connection the server closed while idle
    is retried once on a new one (within the same deadline); a timeout is not retried.
    """

    def __init__(self, max_bytes: int = MAX_PAGE_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self._connections: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self._resolve = Resolver()

    def _open(self, key: tuple[str, str, int], timeout_s: float) -> http.client.HTTPConnection:
        """A new connection to ``key``'s host, its name looked up within ``timeout_s``.

        Raises:
            ResolveTimeout, OSError: as :class:`Resolver` does.
        """
        return resolved_connection(self._resolve, *key, timeout_s)

    def __call__(self, url: str, timeout_s: float) -> str:
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port
        except ValueError as error:
            raise EngineUnavailable(f"{url}: {error}") from error
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineUnavailable(f"{url}: not an http:// or https:// URL with a host")
        key = (parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80))
        path = request_target(parts)
        if timeout_s <= 0:
            raise EngineUnavailable(f"{url}: not fetched: a deadline of {timeout_s:g} s")
        end = time.monotonic() + timeout_s
        for _ in range(2):
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            connection = self._connections.pop(key, None)
            reused = connection is not None
            if connection is None:
                try:
                    connection = self._open(key, remaining)
                except OSError as error:  # ResolveTimeout too
                    raise EngineUnavailable(
                        f"{url}: {describe_failure(error, *key[1:])}"
                    ) from error
            elif connection.sock is not None:
                connection.sock.settimeout(remaining)
            deadline = ExchangeDeadline(connection, remaining)
            try:
                connection.request("GET", path, headers={"Accept": "text/plain"})
                deadline.track()
                response = connection.getresponse()
                lengths = list(dict.fromkeys(response.headers.get_all("Content-Length") or ()))
                if len(lengths) > 1:
                    # http.client reads as many bytes as the first says: a page cut where
                    # it ends was read as the whole, the rest left for the next answer.
                    connection.close()
                    raise EngineUnavailable(
                        f"{url}: the answer has Content-Length headers that disagree "
                        f"({', '.join(v.strip()[:20] for v in lengths)}); not read as a page"
                    )
                length = response.getheader("Content-Length")
                # ASCII digits alone: '²' passes isdigit() and int() refuses it.
                if length is not None and not (length.isascii() and length.isdigit()):
                    length = None  # as http.client reads it: no length
                if length is not None and int(length) > self.max_bytes:
                    connection.close()
                    raise EngineParseError(
                        f"{url}: the metrics page is {int(length)} bytes, over the "
                        f"{self.max_bytes}-byte limit"
                    )
                body = response.read(self.max_bytes + 1)
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as error:
                connection.close()
                if deadline.expired:
                    raise self._late(url, timeout_s) from error
                if reused:
                    continue  # the server dropped an idle keep-alive connection
                raise EngineUnavailable(f"{url}: {describe_failure(error, *key[1:])}") from error
            except (http.client.HTTPException, OSError) as error:
                connection.close()
                if deadline.expired or isinstance(error, TimeoutError):
                    raise self._late(url, timeout_s) from error
                raise EngineUnavailable(f"{url}: {describe_failure(error, *key[1:])}") from error
            finally:
                deadline.cancel()
            if deadline.expired:
                connection.close()
                raise self._late(url, timeout_s)
            if len(body) > self.max_bytes:
                connection.close()
                raise EngineParseError(
                    f"{url}: the metrics page is over the {self.max_bytes}-byte limit"
                )
            missing = response.length  # what Content-Length promised and did not come
            if missing:
                connection.close()
                raise EngineUnavailable(
                    f"{url}: the engine closed the connection mid-page: {len(body)} of "
                    f"the {len(body) + missing} bytes its Content-Length announced"
                )
            if response.will_close:
                connection.close()
            else:
                self._connections[key] = connection
            moved = _redirect_advice(url, response)
            if response.status != 200:
                reason = response.reason
                if len(reason) > SAID_CHARS or not reason.isprintable():
                    reason = quoted(reason)
                refused = _credentials_advice(response)
                raise EngineHttpError(f"{url}: HTTP {response.status} {reason}{moved}{refused}")
            page = _decompressed(body, response.getheader("Content-Encoding"), url, self.max_bytes)
            return _decode(page, url)
        raise self._late(url, timeout_s)

    @staticmethod
    def _late(url: str, timeout_s: float) -> EngineUnavailable:
        return EngineUnavailable(f"{url}: timed out: no complete answer within {timeout_s:.3g} s")

    def close(self) -> None:
        """Close every kept connection."""
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
