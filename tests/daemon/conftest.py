"""Shared fixtures for the daemon tests: a fake NVML and the engine-metrics pages."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parents[1]):  # the fakes, and the repo root when not installed
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fake_pynvml import FakeNvml  # noqa: E402

FIXTURES = HERE / "fixtures"


def shared_dir() -> Path:
    """The project's shared folder: $GPUGOV_SHARED_DIR, else ../shared beside the repo."""
    env = os.environ.get("GPUGOV_SHARED_DIR")
    return Path(env) if env else HERE.parents[2] / "shared"


@pytest.fixture
def fake_nvml() -> FakeNvml:
    """Two fake H100s, root permissions."""
    return FakeNvml(2)


@pytest.fixture
def shared_engine_metrics() -> Path:
    """The recorded real /metrics pages in shared/engine_metrics (skip when absent)."""
    path = shared_dir() / "engine_metrics"
    if not path.is_dir():
        pytest.skip(f"shared engine metrics not found at {path}")
    return path


class MetricsServer:
    """A real HTTP server on 127.0.0.1 serving ``page`` at /metrics (``status`` settable)."""

    def __init__(self, protocol: str = "HTTP/1.0") -> None:
        import http.server
        import threading

        self.page = ""
        self.status = 200
        self.down = False  # when True, connections are dropped without an answer
        self.requests = 0
        self.connections = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = protocol

            def setup(self) -> None:
                server.connections += 1
                super().setup()

            def do_GET(self) -> None:
                server.requests += 1
                if server.down:
                    self.close_connection = True
                    self.connection.close()
                    return
                body = server.page.encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/metrics"
        self._closed = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving; later requests are refused."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def metrics_server():  # type: ignore[no-untyped-def]
    """A local /metrics endpoint; set ``.page`` to what the engine should say."""
    server = MetricsServer()
    yield server
    server.close()


def fixture_text(name: str) -> str:
    """Contents of tests/daemon/fixtures/NAME."""
    return (FIXTURES / name).read_text()
