"""A fake zeusd on loopback TCP: the GPU endpoints gpugov's ``zeusd`` backend uses, with
zeusd's query parameters, bearer-token check and error statuses (``zeusd/src/routes/gpu.rs``,
``zeusd/src/error.rs`` of github.com/ml-energy/zeus). Given a fake NVML, a lock or reset
is applied to it and an NVML error answers as zeusd answers it (no permission 403,
invalid argument or not supported 400, anything else 500)."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
import urllib.parse
from typing import Any

from daemon_support import QuietOnHangups

NVML_STATUS = {2: 400, 3: 400, 4: 403}


class _UnixHTTPServer(QuietOnHangups, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TcpHTTPServer(QuietOnHangups, http.server.ThreadingHTTPServer):
    pass


class FakeZeusd:
    """``GET /discover``, ``POST /gpu/set_gpu_locked_clocks`` and
    ``POST /gpu/reset_gpu_locked_clocks``; every call is recorded in ``calls``."""

    def __init__(
        self, nvml: Any = None, token: str | None = None, socket_path: str | None = None
    ) -> None:
        self.nvml = nvml
        self.token = token
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.status: int | None = None  # force an answer (500, 400 ...)
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                fake.calls.append((self.command, url.path, params))
                if fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                    self._answer(401, {"error": "Authentication required."})
                elif fake.status is not None:
                    self._answer(fake.status, {"errors": {"0": "NVML error: Not supported"}})
                elif (self.command, url.path) == ("GET", "/discover"):
                    gpus = len(fake.nvml.gpus) if fake.nvml is not None else 1
                    self._answer(
                        200,
                        {
                            "gpus": [{"id": i} for i in range(gpus)],
                            "cpus": [],
                            "enabled_api_groups": ["gpu-control"],
                            "auth_required": fake.token is not None,
                        },
                    )
                elif self.command == "POST" and url.path in (
                    "/gpu/set_gpu_locked_clocks",
                    "/gpu/reset_gpu_locked_clocks",
                ):
                    self._write(url.path, params)
                else:
                    self._answer(404, {"error": "not found"})

            def _write(self, path: str, params: dict[str, str]) -> None:
                nvml = fake.nvml
                if nvml is None:
                    self._answer(200)
                    return
                index = params["gpu_ids"]
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(int(index))
                    if path == "/gpu/set_gpu_locked_clocks":
                        low, high = int(params["min_clock_mhz"]), int(params["max_clock_mhz"])
                        nvml.nvmlDeviceSetGpuLockedClocks(handle, low, high)
                    else:
                        nvml.nvmlDeviceResetGpuLockedClocks(handle)
                except nvml.NVMLError as error:
                    status = NVML_STATUS.get(error.value, 500)
                    self._answer(status, {"errors": {index: f"NVML error: {error}"}})
                    return
                self._answer(200)

            do_GET = do_POST = _route

            def log_message(self, *args: object) -> None:
                pass

        self.server: socketserver.BaseServer
        if socket_path is not None:  # zeusd's default transport
            self.server = _UnixHTTPServer(socket_path, Handler)
            self.url = ""
        else:
            self.server = _TcpHTTPServer(("127.0.0.1", 0), Handler)
            self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()  # type: ignore[attr-defined]
