"""The fault campaign's parts: a loopback engine that misbehaves on demand, a fake node
(NVML state in a file, see ``fakenv/pynvml.py``) and the real ``gpugov`` process."""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpugov.daemon.gpu_hold import SCOPE_ENV

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FIXTURES = REPO / "tests" / "daemon" / "fixtures"


def _load_fake_nvml() -> Any:
    """The file-backed fake ``pynvml`` under a private name: this test process keeps the
    real ``pynvml`` for every other test; only the daemon processes import the fake."""
    fake = HERE / "fakenv" / "pynvml.py"
    spec = importlib.util.spec_from_file_location("fault_fake_pynvml", fake)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_FAKE = _load_fake_nvml()
STATE_ENV, initial_state, locked_state, write_state = (
    _FAKE.STATE_ENV,
    _FAKE.initial_state,
    _FAKE.locked_state,
    _FAKE.write_state,
)

PERIOD_S = 0.2
STALE_S = 0.6  # three periods
TIMEOUT_S = 0.15
LOCKED_MHZ = 1410  # the fixed controller's clock
TOP_MHZ = 1980  # the fake H100's top clock: the fail-safe's lock

HEALTHY = (FIXTURES / "vllm_v1_real.txt").read_text()
COUNTER = re.compile(r"^(vllm:(?:prompt|generation)_tokens_total\{[^}]*\}) (\S+)$", re.M)


# ---------------------------------------------------------------- the engine
def _replace_value(page: str, name: str, value: str) -> str:
    pattern = re.compile(rf"^({re.escape(name)}(?:\{{[^}}]*\}})?) \S+$", re.M)
    out, count = pattern.subn(rf"\g<1> {value}", page)
    assert count, name
    return out


def page_for(mode: str, tick: int = 0) -> str | bytes:
    """What the engine serves in ``mode`` (pages for the faults that answer at all)."""
    match mode:
        case "ok" | "vllm-v1":
            return HEALTHY
        case "vllm-legacy":
            return (FIXTURES / "vllm_legacy_synthetic.txt").read_text()
        case "vllm-dp2":
            return (FIXTURES / "vllm_dp2_synthetic.txt").read_text()
        case "sglang":
            return (FIXTURES / "sglang_real.txt").read_text()
        case "tgi":
            return (FIXTURES / "tgi_synthetic.txt").read_text()
        case "garbage":
            return "this is not {prometheus text at all\n<html><body>oops</body></html>\n"
        case "binary":
            return bytes(range(256)) * 64
        case "nan":
            return _replace_value(HEALTHY, "vllm:num_requests_waiting", "NaN")
        case "inf":
            return _replace_value(HEALTHY, "vllm:num_requests_running", "+Inf")
        case "negative":
            return _replace_value(HEALTHY, "vllm:num_requests_waiting", "-3")
        case "kv-impossible":
            return _replace_value(HEALTHY, "vllm:kv_cache_usage_perc", "12.5")
        case "restarted":
            # An engine restart: every counter and histogram back near zero, once.
            page = COUNTER.sub(lambda m: f"{m.group(1)} 1.0", HEALTHY)
            return _replace_value(page, "vllm:time_to_first_token_seconds_count", "1.0")
        case "model-changed":
            # Another model served after a restart: the same series under a new label.
            return HEALTHY.replace("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B-Instruct")
        case "ttft-count-down":
            # One histogram's _count falls every scrape while the rest of the page holds.
            count = max(0.0, 1e6 - 1000.0 * tick)
            return _replace_value(HEALTHY, "vllm:time_to_first_token_seconds_count", str(count))
        case "histogram-nan":
            return _replace_value(HEALTHY, "vllm:time_to_first_token_seconds_sum", "NaN")
        case "backwards":
            # Counters that fall every scrape (an engine restarting over and over).
            return COUNTER.sub(lambda m: f"{m.group(1)} {max(0.0, 1e6 - 1000.0 * tick)}", HEALTHY)
    raise ValueError(mode)


class Engine:
    """A loopback ``/metrics`` server whose ``mode`` picks the answer or the fault.

    Modes: every page of :func:`page_for`, and ``down`` (refused: the port is closed),
    ``drop`` (accepts, closes without a word), ``hang`` (accepts, never answers),
    ``trickle`` (one byte per 20 ms), ``slow`` (the page after 3 engine timeouts),
    ``500``, ``404`` and ``huge`` (a 50 MB page).
    """

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests = 0
        self._stop = threading.Event()
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                engine.requests += 1
                engine.handle(self)

            def log_message(self, *args: object) -> None:
                pass

            def handle_error(self) -> None:  # pragma: no cover
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self._server_class = Server
        self._handler = Handler
        self._server: http.server.ThreadingHTTPServer | None = None
        self._start(0)
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        if mode == "down":
            self._halt()

    def _start(self, port: int) -> None:
        self._server = self._server_class(("127.0.0.1", port), self._handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def _halt(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def set(self, mode: str) -> float:
        """Switch to ``mode``; returns the switch time (``time.time()``)."""
        self.mode = mode
        if mode == "down":
            self._halt()  # new connections are refused; kept ones are dropped (handle)
        elif self._server is None:
            self._start(self.port)
        return time.time()

    def _send(self, handler: Any, status: int, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def handle(self, handler: Any) -> None:
        """Answer one request according to the mode."""
        mode = self.mode
        try:
            if mode in ("drop", "down"):
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
            elif mode == "hang":
                self._stop.wait(30)
                handler.close_connection = True
            elif mode == "trickle":
                body = HEALTHY.encode()
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                for byte in head + body:
                    if self._stop.is_set() or self.mode != "trickle":
                        break
                    handler.wfile.write(bytes([byte]))
                    handler.wfile.flush()
                    time.sleep(0.02)
                handler.close_connection = True
            elif mode == "slow":
                self._stop.wait(3 * TIMEOUT_S)
                self._send(handler, 200, HEALTHY.encode())
            elif mode == "500":
                self._send(handler, 500, b"internal error\n")
            elif mode == "404":
                self._send(handler, 404, b"not found\n")
            elif mode == "huge":
                chunk = b"# " + b"x" * (1 << 20) + b"\n"
                total = 50 * len(chunk)
                handler.send_response(200)
                handler.send_header("Content-Length", str(total))
                handler.end_headers()
                for _ in range(50):
                    handler.wfile.write(chunk)
            else:
                page = page_for(mode, self.requests)
                self._send(handler, 200, page if isinstance(page, bytes) else page.encode())
        except OSError:
            handler.close_connection = True

    def close(self) -> None:
        """Stop serving."""
        self._stop.set()
        self._halt()


# ---------------------------------------------------------------- the node
class Node:
    """The fake node's NVML state, shared with every ``gpugov`` process run on it."""

    def __init__(self, root: Path, gpus: int = 2) -> None:
        self.root = root
        self.path = root / "nvml.json"
        self.state_dir = root / "state"
        write_state(self.path, initial_state(gpus))

    def state(self) -> dict[str, Any]:
        """The current state (a consistent copy)."""
        with locked_state(self.path) as state:
            return json.loads(json.dumps(state))

    def locked(self) -> list[list[int] | None]:
        """Each GPU's lock now."""
        return [gpu["locked"] for gpu in self.state()["gpus"]]

    def writes(self) -> list[list[Any]]:
        """``["lock", index, low, high, t]`` and ``["reset", index, t]`` in order."""
        return self.state()["writes"]

    def fail(self, function: str, code: int, times: int | None = 1, gpu: int | None = None) -> None:
        """Make the next ``times`` calls of ``function`` (on ``gpu``) raise ``code``."""
        key = function if gpu is None else f"{function}@{gpu}"
        with locked_state(self.path) as state:
            state["failures"][key] = [code, times]

    def clear_failures(self) -> None:
        """Remove every injected failure."""
        with locked_state(self.path) as state:
            state["failures"] = {}

    def delay(self, function: str, seconds: float) -> None:
        """Make every call of ``function`` take ``seconds``."""
        with locked_state(self.path) as state:
            state["delays"][function] = seconds

    def edit(self, **changes: Any) -> None:
        """Set top-level keys (``permission``)."""
        with locked_state(self.path) as state:
            state.update(changes)

    def set_gpu(self, index: int, **fields: Any) -> None:
        """Change one GPU behind the daemon's back (an operator's nvidia-smi)."""
        with locked_state(self.path) as state:
            state["gpus"][index].update(fields)


def config_text(engine_url: str, *, gpus: tuple[int, ...] = (0, 1), **domain: Any) -> str:
    """A config for a fast daemon: period 0.2 s, stale 0.6 s, fixed 1410 MHz (another
    ``controller`` table: a dict of its keys)."""
    lines = [
        "[daemon]",
        f"period_s = {PERIOD_S}",
        'metrics_address = "127.0.0.1:0"',
        "",
        "[[domains]]",
        'name = "llm"',
        f"gpus = [{', '.join(map(str, gpus))}]",
    ]
    domain.setdefault("stale_after_s", STALE_S)
    chosen = domain.pop("controller", {"kind": "fixed", "clock_mhz": LOCKED_MHZ})
    extra_tables = []
    for key, value in domain.items():
        if isinstance(value, dict):
            extra_tables.append(f"[domains.{key}]")
            extra_tables += [f"{k} = {json.dumps(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    engine = [
        "[domains.engine]",
        'kind = "auto"',
        f'url = "{engine_url}"',
        f"timeout_s = {TIMEOUT_S}",
    ]
    controller = ["[domains.controller]"]
    controller += [f"{key} = {json.dumps(value)}" for key, value in chosen.items()]
    return "\n".join([*lines, *engine, *controller, *extra_tables]) + "\n"


@dataclass
class Daemon:
    """One real ``gpugov`` process on the fake node."""

    node: Node
    args: list[str]
    name: str = "gpugov"
    process: subprocess.Popen[bytes] | None = None
    stderr_path: Path = field(default_factory=Path)
    metrics_url: str | None = None
    preexec: Any = None
    """Run in the child before ``exec`` (a resource limit, a blocked signal)."""
    env: dict[str, str] = field(default_factory=dict)
    """Set in the child's environment (systemd's ``NOTIFY_SOCKET``, ``WATCHDOG_USEC``)."""
    stderr_fd: int | None = None
    """The child's stderr, when not the file :attr:`stderr` reads (a pipe the test reads)."""

    def start(self) -> Daemon:
        """Start it (stderr to a file)."""
        env = dict(os.environ)
        # Only the fake pynvml goes first; gpugov itself is the installed one.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HERE / "fakenv"), env.get("PYTHONPATH", "")) if p
        )
        env[STATE_ENV] = str(self.node.path)
        # Each fake node is a node of its own: its GPUs' holds (daemon.gpu_hold) are not
        # those of the campaign's other nodes, whose fake GPUs share their UUIDs.
        env[SCOPE_ENV] = f"fake-node-{self.node.path}"
        env["STATE_DIRECTORY"] = str(self.node.state_dir)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"  # a hung exit's threads: see wait()
        env.pop("NOTIFY_SOCKET", None)
        env.update(self.env)
        self.stderr_path = self.node.root / f"{self.name}.stderr"
        with (
            open(self.stderr_path, "wb") as err,
            open(self.node.root / f"{self.name}.out", "wb") as out,
        ):
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpugov", *self.args],
                stdout=out,
                stderr=err if self.stderr_fd is None else self.stderr_fd,
                env=env,
                cwd=self.node.root,
                preexec_fn=self.preexec,
            )
        return self

    @property
    def stderr(self) -> str:
        """What it wrote to stderr so far."""
        return self.stderr_path.read_text(errors="replace")

    @property
    def stdout(self) -> str:
        """What it wrote to stdout so far."""
        return (self.node.root / f"{self.name}.out").read_text(errors="replace")

    def wait_for(self, predicate: Any, timeout_s: float = 90.0, what: str = "") -> float:
        """Poll ``predicate()`` until true; returns the time it became true. A series the
        page does not show yet (``KeyError``: the first tick's snapshot not taken when
        its lock is already seen) is not yet true."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                done = predicate()
            except KeyError:
                done = False
            if done:
                return time.time()
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(
                    f"gpugov exited ({self.process.returncode}) waiting for {what}:\n{self.stderr}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.stderr}")
            time.sleep(0.02)

    def wait_locked(self, mhz: int, timeout_s: float = 90.0, what: str = "") -> float:
        """Until every GPU is locked at ``mhz``."""
        return self.wait_for(
            lambda: all(lock == [mhz, mhz] for lock in self.node.locked()),
            timeout_s,
            f"every GPU locked at {mhz} MHz",
        )

    def metrics(self) -> dict[str, float]:
        """The daemon's /metrics as ``{name{labels}: value}`` (the URL from its log)."""
        if self.metrics_url is None:
            match = re.search(r"metrics on (http://\S+/metrics)", self.stderr)
            assert match, self.stderr
            self.metrics_url = match.group(1)
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            text = response.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def send(self, sig: int) -> None:
        """Send ``sig``."""
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 90.0) -> int:
        """Signal it and wait; the exit code."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float = 90.0) -> int:
        """Wait for the exit; the exit code. One that never comes fails with every thread's
        stack (SIGABRT: ``faulthandler``) and the daemon's stderr."""
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            raise AssertionError(
                f"{self.name} did not exit within {timeout_s:g} s:\n{self.stderr}"
            ) from None

    def kill(self) -> None:
        """SIGKILL (nothing is reset)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def assert_clean(daemon: Daemon) -> None:
    """No traceback ever reaches the operator."""
    text = daemon.stderr + daemon.stdout
    assert "Traceback" not in text, text


def last_line(daemon: Daemon) -> str:
    """The last stderr line (the one an operator reads)."""
    lines = [line for line in daemon.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
