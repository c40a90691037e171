"""The metrics HTTP server: prometheus_client's threading WSGI server bounded for a node.

At most :data:`MAX_CONNECTIONS` connections at once, a :data:`CONNECTION_TIMEOUT_S`
socket timeout and a :data:`REQUEST_DEADLINE_S` deadline on each connection as a whole;
when every slot is taken, a new connection closes the oldest one still sending its
request, so clients that trickle their headers cannot keep a scraper out
(:class:`~daemon.exporter.Exporter` serves its registry with it)."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32
"""Connections served at once. When all are taken, a new connection closes the oldest one
still sending its request (a slow or stuck client); with none such it is closed at once
(a scraper retries)."""
CONNECTION_TIMEOUT_S = 10.0
"""An idle client (nothing received for this long) is dropped, so it cannot hold a thread."""
REQUEST_DEADLINE_S = 10.0
"""A connection is closed this long after it was accepted, whatever it sent: one deadline
for the request (headers and answer), not per socket read, so a client that trickles a
header line every few seconds cannot hold a thread either."""
SLOT_WAIT_S = 1.0
"""How long a new connection waits for the slot of the connection it closed."""


@dataclass
class Connection:
    """One accepted connection: when, whether its request was read, whether it was cut."""

    sock: socket.socket
    accepted_s: float
    request_read: bool = False
    cut: bool = False


class QuietHandler(WSGIRequestHandler):
    """The request handler: no access log, no answer to a connection cut meanwhile."""

    timeout = CONNECTION_TIMEOUT_S  # StreamRequestHandler sets it on the socket

    def parse_request(self) -> bool:
        """Read the request line and headers; a connection cut meanwhile is not answered."""
        if not super().parse_request():
            return False
        server = self.server
        return not isinstance(server, BoundedServer) or server.request_read(self.request)

    def log_message(self, format: str, *args: object) -> None:
        pass


class BoundedServer(ThreadingWSGIServer):
    """One thread per connection, at most ``max_connections`` at once, each connection
    closed ``request_deadline_s`` after it was accepted.

    prometheus_client's server starts a thread per connection with no limit and no
    timeout, so idle connections would each hold a thread forever. A socket timeout alone
    does not stop a client that sends a byte now and then; the deadline does, and while
    it runs, a new connection takes the slot of the oldest one still sending its request.
    """

    max_connections = MAX_CONNECTIONS
    request_deadline_s = REQUEST_DEADLINE_S
    request_queue_size = 64  # the listen backlog (socketserver's default is 5)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or vanished is routine: no traceback on stderr."""
        log.debug("metrics client %s dropped: %s", client_address, sys.exc_info()[1])

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._open: dict[int, Connection] = {}
        self._open_lock = threading.Lock()
        self.refused = 0
        self.cut = 0
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False) and not (
            self._cut_oldest_unread() and self._slots.acquire(timeout=SLOT_WAIT_S)
        ):
            self.refused += 1
            self.shutdown_request(request)
            return
        with self._open_lock:
            self._open[id(request)] = Connection(request, time.monotonic())
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)
            self._slots.release()

    def service_actions(self) -> None:
        """Every poll of the serving loop: close the connections past their deadline."""
        super().service_actions()
        now = time.monotonic()
        with self._open_lock:
            late = [
                c
                for c in self._open.values()
                if not c.cut and now - c.accepted_s >= self.request_deadline_s
            ]
        for connection in late:
            self._cut(connection)

    def request_read(self, request: Any) -> bool:
        """The handler read this connection's request; False if it was cut meanwhile."""
        with self._open_lock:
            connection = self._open.get(id(request))
            if connection is None or connection.cut:
                return False
            connection.request_read = True
            return True

    def _cut_oldest_unread(self) -> bool:
        """Close the oldest connection still sending its request; False if none is."""
        with self._open_lock:
            waiting = [c for c in self._open.values() if not c.request_read and not c.cut]
        if not waiting:
            return False
        self._cut(min(waiting, key=lambda c: c.accepted_s))
        return True

    def _cut(self, connection: Connection) -> None:
        """Shut the socket down: the handler's read or write returns and its thread ends."""
        with self._open_lock:
            connection.cut = True
        self.cut += 1
        with contextlib.suppress(OSError):
            connection.sock.shutdown(socket.SHUT_RDWR)

    def _forget(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(id(request), None)
