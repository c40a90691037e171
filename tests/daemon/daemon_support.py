"""Helpers shared by the daemon tests: a local metrics server and the fixture pages.

Imported by name (``from daemon_support import ...``; ``conftest.py`` puts this folder on
``sys.path``), so no test module imports a module named ``conftest``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gpugov.daemon.config import parse_config
from gpugov.daemon.domain import Domain, TickRecord
from gpugov.daemon.loop import RunStats, TimedLoop, VirtualClock, run
from gpugov.daemon.service import Assembled, domains_from_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FakeT = TypeVar("FakeT")
JOIN_S = 30.0
"""The longest any wait in the hung-disk tests may take before it counts as a hang."""


def eventually(check: Callable[[], bool]) -> bool:
    """Whether ``check()`` comes true within :data:`JOIN_S` (tried again every 10 ms)."""
    limit = time.monotonic() + JOIN_S
    while not check():
        if time.monotonic() > limit:
            return False
        time.sleep(0.01)
    return True


@contextlib.contextmanager
def freed_at_end(free: Callable[[], None]) -> Iterator[None]:
    """Run the block, then ``free()`` (a hung disk answers); ``free()`` also runs after
    :data:`JOIN_S` if the block is still running, so a test waiting on a hang that a
    regression never ends fails instead of hanging."""
    safety = threading.Timer(JOIN_S, free)
    safety.daemon = True
    safety.start()
    try:
        yield
    finally:
        free()
        safety.cancel()


class QuietOnHangups:
    """A test server's ``handle_error``: a client that hung up mid-answer (the daemon gives
    up a scrape or a write at its deadline, often under load) is counted in ``hangups``, not
    printed to stderr, where it broke tests counting the daemon's own lines; any other error
    still prints socketserver's traceback, so a broken handler shows."""

    hangups = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            self.hangups += 1
            return
        super().handle_error(request, client_address)  # type: ignore[misc]


class MetricsServer:
    """A real HTTP server on 127.0.0.1 serving ``page`` at /metrics (``status`` settable)."""

    def __init__(self, protocol: str = "HTTP/1.0") -> None:
        import gzip
        import http.server
        import socket
        import threading

        self.page = ""
        self.status = 200
        self.down = False  # when True, connections are dropped without an answer
        self.short_body = False  # when True, half the page is sent and the connection closed
        self.encoding = ""  # "gzip": the page sent gzip-compressed; another: sent as it is
        self.gzip_members = 1  # "gzip": in this many members, one after another
        self.requests = 0
        self.paths: list[str] = []  # the request target of each GET, as sent
        self.headers: dict[str, str] = {}  # more headers for each answer
        self.connections = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = protocol

            def setup(self) -> None:
                server.connections += 1
                super().setup()

            def do_GET(self) -> None:
                server.requests += 1
                server.paths.append(self.path)
                if server.down:
                    self.close_connection = True
                    self.connection.close()
                    return
                body = server.page.encode()
                if server.encoding == "gzip":
                    step = max(1, -(-len(body) // server.gzip_members))
                    body = b"".join(
                        gzip.compress(body[i : i + step]) for i in range(0, len(body) or 1, step)
                    )
                self.send_response(server.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                if server.encoding:
                    self.send_header("Content-Encoding", server.encoding)
                for name, value in server.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.short_body:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        class Server(QuietOnHangups, http.server.ThreadingHTTPServer):
            pass

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/metrics"
        self._closed = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def hangups(self) -> int:
        """Answers the client hung up on (BrokenPipeError and the like; none printed)."""
        return self._httpd.hangups

    def close(self) -> None:
        """Stop serving; later requests are refused."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()


def fixture_text(name: str) -> str:
    """Contents of tests/daemon/fixtures/NAME."""
    return (FIXTURES / name).read_text()


def run_ticks(
    domains: Sequence[Domain],
    ticks: int,
    *,
    on_step: Callable[[int, list[TickRecord]], None] | None = None,
    loop: TimedLoop | None = None,
    **options: Any,
) -> tuple[list[TickRecord], RunStats]:
    """The daemon loop over ``domains`` until ``ticks`` ticks have run, on virtual time
    (1 s periods) unless ``loop`` is given: (every tick's records, the run's stats).
    ``on_step(step, records so far)`` runs after each tick; ``options`` go to ``run``."""
    clock = VirtualClock()
    loop = loop or TimedLoop(1.0, clock=clock, sleep=clock.sleep)
    records: list[TickRecord] = []

    def sink(batch: Sequence[TickRecord]) -> None:
        records.extend(batch)
        if on_step is not None:
            on_step(batch[0].step, records)

    stats = run(
        domains,
        loop,
        on_tick=sink,
        before_tick=lambda now, step: step >= ticks,
        **options,
    )
    return records, stats


def fixed_clock_node(tmp_path: Path, metrics_server: MetricsServer, fake: Any) -> Assembled:
    """One domain on GPU 0 of ``fake`` at a fixed 1,410 MHz, its state in ``tmp_path``, a
    vLLM page with requests running (so the clock is locked)."""
    metrics_server.page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
    )
    config = parse_config(
        {
            "daemon": {"period_s": 1.0, "state_dir": str(tmp_path)},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {"kind": "vllm", "url": metrics_server.url, "timeout_s": 0.9},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                }
            ],
        }
    )
    return domains_from_config(config, nvml=fake)


def lock_state_reading(exporter: Any, fake: Any) -> tuple[float | None, float | None, Any]:
    """What a tick shows of the lock record: the exported write failures and staleness,
    and GPU 0's lock on ``fake``."""
    get = exporter.registry.get_sample_value
    return (
        get("gpugov_lock_state_write_failures_total"),
        get("gpugov_lock_state_stale_active"),
        fake.locked(0),
    )


def sigterm_once_open(monkeypatch: Any) -> None:
    """Make ``gpugov run`` receive a SIGTERM right after it has opened (and reconciled)
    its GPUs, before its first tick (``monkeypatch``: pytest's fixture)."""
    import os
    import signal

    import gpugov.daemon.node_cli as node_cli

    real = node_cli.domains_from_config

    def terminated_once_open(*args: object, **kwargs: object) -> object:
        assembled = real(*args, **kwargs)  # type: ignore[arg-type]
        # After the last domain's reconcile: one stopped before it reconciles no more GPUs.
        last = assembled.domains[-1]
        reconcile = last.reconcile

        def reconciled_then_terminated(*args: Any, **kwargs: Any) -> list[str]:
            lines = reconcile(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)
            return lines

        last.reconcile = reconciled_then_terminated  # type: ignore[method-assign]
        return assembled

    monkeypatch.setattr(node_cli, "domains_from_config", terminated_once_open)


def node_commands_on(monkeypatch: Any, fake: FakeT) -> FakeT:
    """Make every place a node command loads NVML (the backends, check-config, status,
    GPU listing) load ``fake`` (a :class:`fake_pynvml.FakeNvml`); returns it."""
    import gpugov.daemon.node_cli as node_cli
    import gpugov.daemon.node_support as node_support
    import gpugov.daemon.nvml as nvml_module
    import gpugov.daemon.status_cli as status_cli

    for module in (nvml_module, node_cli, status_cli, node_support):
        monkeypatch.setattr(module, "load_pynvml", lambda: fake)
    return fake
