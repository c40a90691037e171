"""The split mode's pieces in process: the actuator server's imports, its protocol under
the governor's client (a real Unix socket, the fake NVML), the zeusd backend against a
fake zeusd on loopback, and the config keys of both backends."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import eventually, node_commands_on
from fake_pynvml import FakeNvml
from fake_zeusd import FakeZeusd

import gpugov.daemon.actuator_command as actuator_command
import gpugov.daemon.actuator_server as actuator_server
from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.actuator_client import ActuatorBackend, ActuatorClient, ActuatorUnavailable
from gpugov.daemon.actuator_server import ActuatorServer
from gpugov.daemon.config import parse_config
from gpugov.daemon.errors import (
    ConfigError,
    GpuError,
    NotSupported,
    PermissionDenied,
    TransientGpuError,
)
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.zeusd import ZeusdBackend, ZeusdClient, ZeusdUnavailable

FORBIDDEN_IMPORTS = (
    "http",
    "urllib.request",
    "ssl",
    "numba",
    "numpy",
    "scipy",
    "pydantic",
    "prometheus_client",
    "gpugov.daemon.engines",
    "gpugov.daemon.config",
    "gpugov.daemon.config_types",
    "gpugov.daemon.controller_config",
    "gpugov.controllers",
    "gpugov.plant",
    "gpugov.study",
)


def test_the_actuator_imports_nothing_it_does_not_need() -> None:
    """``gpugov actuator`` loads no HTTP client, no numba, no engine parsing, no pydantic."""
    code = (
        "import sys\n"
        "from gpugov.cli import build_parser\n"
        "build_parser('actuator').parse_args(['actuator', '--gpus', '0', '--allow', '0'])\n"
        "import gpugov.daemon.actuator_server, gpugov.daemon.actuator_command\n"
        "import gpugov.daemon.nvml\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_IMPORTS)]
    assert not bad, bad
    lines = Path(actuator_server.__file__).read_text().count("\n")
    assert lines < 750, f"the actuator grew to {lines} lines; keep it readable in one sitting"
    lines = Path(actuator_command.__file__).read_text().count("\n")
    assert lines < 400, f"its command line grew to {lines} lines; keep it readable too"


# ---------------------------------------------------------------- the actuator
class Served:
    """An :class:`ActuatorServer` on a real socket, stepped by a thread."""

    def __init__(self, nvml: FakeNvml, path: Path, allow: str) -> None:
        self.backends = [NvmlBackend(i, nvml=nvml) for i in range(len(nvml.gpus))]
        self.server = ActuatorServer(self.backends, str(path), allow, min_relock_s=0.0)
        self.server.listen()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.server.serve, args=(self._stop.is_set,))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.server.close()
        for backend in self.backends:
            backend.close()


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gpugov-", dir="/tmp") as folder:
        yield Path(folder) / "a.sock"


def _governor(nvml: FakeNvml, path: Path) -> tuple[ActuatorClient, list[ActuatorBackend]]:
    client = ActuatorClient(str(path), lease_s=5.0, timeout_s=2.0)
    backends = [
        ActuatorBackend(NvmlBackend(i, nvml=nvml), client, release=lambda c: c.close())
        for i in range(len(nvml.gpus))
    ]
    return client, backends


def test_the_clock_actuator_locks_through_the_actuator_and_again_after_a_new_lease(
    socket_path: Path,
) -> None:
    import os

    nvml = FakeNvml(2)
    served = Served(nvml, socket_path, str(os.getuid()))
    client, backends = _governor(nvml, socket_path)
    actuator = ClockActuator(backends, domain="llm")
    try:
        assert actuator.write_path_problem() is None
        assert actuator.apply(1410) == 2
        assert [nvml.locked(i) for i in (0, 1)] == [(1410, 1410)] * 2
        served.stop()  # the actuator goes: it resets what the lease held
        assert [nvml.locked(i) for i in (0, 1)] == [None, None]
        problem = actuator.write_path_problem()
        assert problem is not None and "unreachable" in problem
        with pytest.raises(TransientGpuError):
            backends[0].lock_clocks(1410, 1410)
        assert client.failures >= 2
        served = Served(nvml, socket_path, str(os.getuid()))
        assert actuator.write_path_problem() is None  # reconnected: a new lease
        assert actuator.apply(1410) == 2  # written again, though the decision is unchanged
        assert [nvml.locked(i) for i in (0, 1)] == [(1410, 1410)] * 2
        # Refusals come back as the daemon's own errors.
        with pytest.raises(GpuError, match="out_of_range"):
            backends[0].lock_clocks(100, 100)
        nvml.permission = False
        with pytest.raises(PermissionDenied):
            backends[1].lock_clocks(1395, 1395)
        nvml.permission = True
        assert actuator.restore() == []
        assert [nvml.locked(i) for i in (0, 1)] == [None, None]
    finally:
        for backend in backends:
            backend.close()
        served.stop()


@pytest.mark.parametrize("code", [9, 1, 12, 18])  # DRIVER_NOT_LOADED, UNINITIALIZED, ...
def test_a_write_failing_as_the_driver_goes_is_that_nvml_error_in_the_governor(
    socket_path: Path, code: int
) -> None:
    """The actuator's refusal carried NVML's error as a protocol code and a message only
    (``gpu_error``), so the governor raised a bare GpuError with no NVML code: a write
    failing as the driver went away (unloaded, upgraded) was not the driver gone, which
    the loop reads from a GpuUnavailable's code (``DRIVER_GONE_CODES``). The answer now
    carries ``nvml_code``, and the governor raises the error its own NVML would have."""
    import os

    from gpugov.daemon.errors import DRIVER_GONE_CODES, DriverGone, GpuUnavailable

    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    _client, (gpu,) = _governor(nvml, socket_path)
    actuator = ClockActuator([gpu], domain="llm")
    try:
        nvml.fail("nvmlDeviceSetGpuLockedClocks", code, times=None)
        with pytest.raises(GpuUnavailable) as raised:
            actuator.apply(1410)
        assert raised.value.code == code and code in DRIVER_GONE_CODES
        assert raised.value.gpu == "0"
        assert f"(NVML code {code})" in str(raised.value)
        gone = DriverGone.from_unavailable(raised.value)  # the loop's line
        assert "the NVIDIA driver went away or was replaced" in str(gone)
        # A refusal that is not NVML's carries no code, and is what it was.
        with pytest.raises(GpuError, match="out_of_range") as refused:
            gpu.lock_clocks(100, 100)
        assert refused.value.code is None and not isinstance(refused.value, GpuUnavailable)
    finally:
        gpu.close()
        served.stop()


def test_a_reset_that_fails_at_a_leases_end_is_retried_and_frees_the_gpu(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    monkeypatch.setattr(actuator_server, "RESET_RETRY_S", 0.05)
    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    first, (gpu,) = _governor(nvml, socket_path)
    try:
        gpu.lock_clocks(1410, 1410)
        nvml.fail("nvmlDeviceResetGpuLockedClocks", 10, times=2)  # NVML_ERROR_TIMEOUT
        first.close()  # the lease ends; its reset fails twice, then succeeds
        eventually(lambda: nvml.locked(0) is None)
        assert nvml.locked(0) is None
        _second, (again,) = _governor(nvml, socket_path)
        again.lock_clocks(1395, 1395)  # not "busy": the dead lease holds nothing
        assert nvml.locked(0) == (1395, 1395)
        again.close()
    finally:
        gpu.close()
        served.stop()


def test_a_gpu_whose_reset_keeps_failing_at_a_leases_end_is_held_at_its_top_clock(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease that ended with a reset failing kept the GPU at the lost governor's low
    clock for as long as the reset failed (retried every second); it is locked at its top
    clock meanwhile, and the retried reset still unlocks it once NVML takes it."""
    import os

    monkeypatch.setattr(actuator_server, "RESET_RETRY_S", 0.05)
    nvml = FakeNvml(1)
    top = nvml.gpus[0].top_clock_mhz()
    served = Served(nvml, socket_path, str(os.getuid()))
    first, (gpu,) = _governor(nvml, socket_path)
    try:
        gpu.lock_clocks(705, 705)
        nvml.fail("nvmlDeviceResetGpuLockedClocks", 10, times=None)  # NVML_ERROR_TIMEOUT
        first.close()  # the lease ends; its reset keeps failing
        eventually(lambda: nvml.locked(0) == (top, top))
        assert nvml.locked(0) == (top, top)
        retries = nvml.calls["nvmlDeviceResetGpuLockedClocks"]
        nvml.clear_failures()
        eventually(lambda: nvml.locked(0) is None)
        assert nvml.locked(0) is None
        assert nvml.calls["nvmlDeviceResetGpuLockedClocks"] > retries
    finally:
        gpu.close()
        served.stop()


def test_a_lease_too_large_for_a_float_is_the_longest_lease_not_an_internal_error(
    socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hello whose ``lease_s`` is an integer beyond any float (JSON allows it) is
    granted the longest lease, as an infinite one is; it was an OverflowError: an
    ``internal error`` answer and a traceback in the actuator's log."""
    import json
    import os
    import socket

    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(5)
            peer.connect(str(socket_path))
            stream = peer.makefile("rwb")
            with caplog.at_level(logging.INFO, logger="gpugov.daemon.actuator_server"):
                for huge in (b"1" + b"0" * 400, b"-1" + b"0" * 400):
                    stream.write(b'{"op":"hello","lease_s":' + huge + b"}\n")
                    stream.flush()
                    answers = json.loads(stream.readline())
                    if huge.startswith(b"-"):
                        assert answers["error"] == "bad_request", answers
                    else:
                        assert answers["ok"] and answers["lease_s"] == 30.0, answers
        assert "Traceback" not in caplog.text and "internal error" not in caplog.text
    finally:
        served.stop()


def test_a_request_line_over_4_kib_closes_the_connection_even_when_it_ends(
    socket_path: Path,
) -> None:
    """A line over the 4 KiB a request may hold is refused and its connection closed,
    whether it arrives with its end or not; one that came whole in a read was served."""
    import json
    import os
    import socket

    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(5)
            peer.connect(str(socket_path))
            stream = peer.makefile("rwb")
            stream.write(b'{"op":"held","pad":"' + b"x" * 10_000 + b'"}\n')
            stream.flush()
            answer = json.loads(stream.readline())
            assert answer == {"ok": False, "error": "bad_request", "message": "line too long"}
            assert stream.readline() == b""  # closed
    finally:
        served.stop()


def test_a_lock_someone_else_reset_is_locked_again_through_the_actuator(
    socket_path: Path,
) -> None:
    """Someone resets a GPU the governor locked through the actuator (``nvidia-smi
    -rgc``): the readback sees it and the governor asks for the lock again, which the
    actuator took as already held and did not write, so the GPU stayed unlocked, however
    often it was asked."""
    import os

    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    _client, (gpu,) = _governor(nvml, socket_path)
    actuator = ClockActuator([gpu], domain="llm")
    try:
        assert actuator.apply(1410) == 1
        assert nvml.locked(0) == (1410, 1410)
        nvml.nvmlDeviceResetGpuLockedClocks(nvml.gpus[0])  # someone else's -rgc
        changed: list[str] = []
        for _ in range(10):  # confirmed over a few reads
            changed = actuator.check_readback([gpu.sample()])
            if changed:
                break
        assert changed == ["0"]
        actuator.apply(1410)
        assert nvml.locked(0) == (1410, 1410)
    finally:
        gpu.close()
        served.stop()


def test_the_lock_held_asked_again_within_the_rate_limit_is_no_failed_write(
    socket_path: Path,
) -> None:
    """A lock equal to the one held, asked again within ``--min-relock-s``, was refused as
    rate-limited, which the governor counts as a failed write; it is the lock held."""
    import os

    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    served.server.min_relock_s = 60.0  # the second ask falls within it
    _client, (gpu,) = _governor(nvml, socket_path)
    try:
        gpu.lock_clocks(1410, 1410)
        gpu.lock_clocks(1410, 1410)
        assert nvml.locked(0) == (1410, 1410)
        assert [w for w in nvml.writes if w[0] == "nvmlDeviceSetGpuLockedClocks"] == [
            ("nvmlDeviceSetGpuLockedClocks", 0, 1410, 1410)
        ]
    finally:
        gpu.close()
        served.stop()


def test_a_governor_of_another_uid_is_refused(socket_path: Path) -> None:
    import os

    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid() + 1))
    client, backends = _governor(nvml, socket_path)
    try:
        assert "refused" in str(client.check())
        with pytest.raises(PermissionDenied):
            backends[0].lock_clocks(1410, 1410)
        assert nvml.locked(0) is None
        assert served.server.refused_peers >= 2
    finally:
        backends[0].close()
        served.stop()


def test_the_probe_passes_while_an_actuator_serves_and_fails_in_one_line_otherwise(
    socket_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpugov actuator --probe`` (the Kubernetes liveness probe): an actuator that
    serves answers, whether it serves the probe's user or refuses it; a socket nobody
    serves, one bound by a process that never answers (a hung actuator) and a missing one
    each fail with one line."""
    import os
    import socket

    from gpugov.cli import main

    probe = ["actuator", "--probe", "--probe-timeout", "0.5", "--socket"]
    for allow in (str(os.getuid()), str(os.getuid() + 1)):  # served, then refused
        nvml = FakeNvml(1)
        served = Served(nvml, socket_path, allow)
        try:
            assert main([*probe, str(socket_path)]) == 0
            assert capsys.readouterr().err == ""
            assert nvml.locked(0) is None  # a probe locks nothing
        finally:
            served.stop()
    hung = socket_path.with_name("hung.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(hung))
        listener.listen(4)  # connects, never answers
        assert main([*probe, str(hung)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--socket {hung}: no answer within 0.5 s" in err
    assert main([*probe, str(socket_path.with_name("missing.sock"))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot connect" in err


def test_the_actuator_needs_its_gpus_and_user_unless_it_probes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without ``--probe``, ``--gpus`` and ``--allow`` are required: one line, exit 2,
    before any GPU is opened."""
    from gpugov.cli import main

    assert main(["actuator", "--allow", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "required: --gpus" in err
    assert main(["actuator"]) == 2
    assert "required: --gpus, --allow" in capsys.readouterr().err


def test_a_client_timing_out_drops_its_connection(socket_path: Path) -> None:
    """Nothing listens behind a bound socket: the request times out, the client
    reconnects on the next call instead of reading a stale answer."""
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(4)
    client = ActuatorClient(str(socket_path), timeout_s=0.05)
    try:
        with pytest.raises(ActuatorUnavailable, match="no answer within"):
            client.request({"op": "held"})
        assert client.problem is not None and client.failures == 1
    finally:
        client.close()
        listener.close()


# ------------------------------------------------------------------------ zeusd
def test_zeusd_backend_speaks_zeusds_api() -> None:
    zeusd = FakeZeusd(token="s3cret")
    now = [0.0]
    client = ZeusdClient(url=zeusd.url, token="s3cret", timeout_s=2, clock=lambda: now[0])
    backend = ZeusdBackend(NvmlBackend(0, nvml=FakeNvml(1)), client)
    try:
        backend.lock_clocks(1410, 1410)
        backend.reset_clocks()
        assert zeusd.calls == [
            (
                "POST",
                "/gpu/set_gpu_locked_clocks",
                {"gpu_ids": "0", "min_clock_mhz": "1410", "max_clock_mhz": "1410", "block": "true"},
            ),
            ("POST", "/gpu/reset_gpu_locked_clocks", {"gpu_ids": "0", "block": "true"}),
        ]
        assert backend.write_path_problem() is None
        zeusd.status = 400
        with pytest.raises(NotSupported):
            backend.lock_clocks(1410, 1410)
        zeusd.status = 500
        with pytest.raises(TransientGpuError):
            backend.lock_clocks(1410, 1410)
        assert backend.write_path_problem() is not None
        zeusd.status = None
        assert backend.write_path_problem() is not None  # probed at most once a second
        now[0] += 1.0
        assert backend.write_path_problem() is None  # the probe found it back
        assert zeusd.calls[-1][:2] == ("GET", "/discover")
        zeusd.token = "other"
        with pytest.raises(PermissionDenied):
            backend.reset_clocks()
    finally:
        backend.close()
        zeusd.close()


def test_zeusd_over_its_unix_socket(socket_path: Path) -> None:
    nvml = FakeNvml(1)
    zeusd = FakeZeusd(nvml, socket_path=str(socket_path))
    client = ZeusdClient(socket_path=str(socket_path), timeout_s=2)
    backend = ZeusdBackend(NvmlBackend(0, nvml=nvml), client)
    try:
        backend.lock_clocks(1410, 1410)
        assert nvml.locked(0) == (1410, 1410)
        backend.reset_clocks()
        assert nvml.locked(0) is None
        assert [c[1] for c in zeusd.calls] == [
            "/gpu/set_gpu_locked_clocks",
            "/gpu/reset_gpu_locked_clocks",
        ]
    finally:
        backend.close()
        zeusd.close()


def test_zeusd_gone_is_transient_and_a_write_path_problem() -> None:
    zeusd = FakeZeusd()
    url = zeusd.url
    zeusd.close()
    backend = ZeusdBackend(NvmlBackend(0, nvml=FakeNvml(1)), ZeusdClient(url=url, timeout_s=0.5))
    actuator = ClockActuator([backend], domain="llm")
    try:
        assert actuator.apply(1410) == 0  # transient: counted, retried next tick
        assert actuator.write_failures["0"] == 1
        assert "unreachable" in str(actuator.write_path_problem())
    finally:
        backend.close()


# ----------------------------------------------------------------------- config
def _config(daemon: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(f'[daemon]\n{daemon}\n[[domains]]\nname = "a"\ngpus = [0]\n')


@pytest.mark.parametrize(
    ("daemon", "needle"),
    [
        ('backend = "actuator"\nactuator = { lease_s = 1.0 }', "at least 3 x period_s"),
        ('backend = "actuator"\nactuator = { timeout_s = 1.0 }', "shorter than period_s"),
        ('backend = "actuator"\nactuator = { lease = 3 }', "daemon.actuator.lease: unknown key"),
        ('backend = "zeusd"', "needs a [daemon.zeusd] table"),
        ('backend = "zeusd"\nzeusd = { socket = "/s", url = "http://h:1" }', "one of them"),
        ('backend = "zeusd"\nzeusd = { url = "https://h" }', "must be http://HOST:PORT"),
    ],
)
def test_bad_split_backend_configs_name_the_field(daemon: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=__import__("re").escape(needle)):
        parse_config(_config(daemon), "g.toml")


def test_split_backend_configs_parse() -> None:
    config = parse_config(_config('backend = "actuator"\nperiod_s = 0.5'))
    assert str(config.daemon.actuator.socket) == "/run/gpugov-actuator/actuator.sock"
    assert config.daemon.actuator.lease_s == 3.0
    zeusd = parse_config(_config('backend = "zeusd"\nzeusd = { socket = "/var/run/zeusd.sock" }'))
    assert zeusd.daemon.zeusd is not None and zeusd.daemon.zeusd.url is None


def test_status_says_whether_the_actuator_takes_this_users_locks(
    socket_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unprivileged governor with ``backend = "actuator"`` locks through the actuator:
    ``status --config`` says whether it answers, not that root is needed."""
    import json
    import os

    import gpugov.daemon.status_cli as status_cli
    from gpugov.daemon import node_cli

    monkeypatch.setattr(status_cli, "may_lock_clocks", lambda: False)

    def one_gpu(*args: Any, rows: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
        rows.append(
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-fake-0000",
                "supported_clock_range_mhz": [345, 1980],
                "supported_clock_count": 110,
                "sm_clock_mhz": 1980.0,
                "power_w": 80.0,
                "temperature_c": 40.0,
                "utilization": 0.0,
                "power_limit_w": 700.0,
                "clock_event_reasons": 0,
            }
        )
        return rows

    monkeypatch.setattr(status_cli, "gpu_status", one_gpu)  # a node with one GPU
    config = tmp_path / "g.toml"
    config.write_text(
        f'[daemon]\nperiod_s = 0.5\nbackend = "actuator"\n'
        f'actuator = {{ socket = "{socket_path}" }}\n'
        '[[domains]]\nname = "a"\ngpus = [0]\n'
        '[domains.engine]\nurl = "http://127.0.0.1:9/metrics"\n'
    )
    assert node_cli.main(["status", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "may lock clocks: no (through the actuator: " in out, out
    assert "CAP_SYS_ADMIN" not in out
    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    try:
        assert node_cli.main(["status", "--config", str(config)]) == 0
        out = capsys.readouterr().out
        assert f"may lock clocks: yes (through the actuator: actuator {socket_path}: answers" in out
        assert node_cli.main(["status", "--json", "--config", str(config)]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["backend"] == "actuator" and report["may_lock_clocks"] is True
        assert "serves GPUs 0" in report["write_path"]
    finally:
        served.stop()
    assert nvml.writes == []  # read-only: nothing locked


def test_check_config_says_whether_the_actuator_or_zeusd_answers(socket_path: Path) -> None:
    import os

    from gpugov.daemon.node_check import check_node

    def config(daemon: str) -> Any:
        return parse_config(_config(f"period_s = 0.5\n{daemon}"))

    actuator = config(f'backend = "actuator"\nactuator = {{ socket = "{socket_path}" }}')
    report = check_node(actuator, nvml=FakeNvml(1))
    assert not report.problems
    assert any("does not answer" in w or "unreachable" in w for w in report.warnings)
    nvml = FakeNvml(1)
    served = Served(nvml, socket_path, str(os.getuid()))
    try:
        report = check_node(actuator, nvml=nvml)
        assert not report.problems and not report.warnings, report.warnings
        assert any("answers; serves GPUs 0" in line for line in report.lines)
    finally:
        served.stop()
    assert nvml.writes == []  # read-only: nothing locked or reset
    # Without an NVIDIA driver where check-config runs, the GPU part is skipped, and the
    # actuator's line still says whether it answers.
    no_driver = FakeNvml(1)
    no_driver.driver_loaded = False
    report = check_node(actuator, nvml=no_driver)
    assert not report.problems
    assert any("no NVIDIA driver on this machine" in line for line in report.lines), report.lines
    assert any("does not answer" in w or "unreachable" in w for w in report.warnings)
    served = Served(nvml, socket_path, str(os.getuid()))
    try:
        report = check_node(actuator, nvml=no_driver)
        assert not report.problems and not report.warnings, report.warnings
        assert any("answers; serves GPUs 0" in line for line in report.lines), report.lines
    finally:
        served.stop()
    zeusd = FakeZeusd()
    try:
        report = check_node(
            config(f'backend = "zeusd"\nzeusd = {{ url = "{zeusd.url}" }}'), nvml=FakeNvml(1)
        )
        assert not report.problems and any("answers" in line for line in report.lines)
        report = check_node(
            config(f'backend = "zeusd"\nzeusd = {{ url = "{zeusd.url}" }}'), nvml=no_driver
        )
        assert not report.problems
        assert any(line.startswith("zeusd ") and "answers" in line for line in report.lines)
    finally:
        zeusd.close()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "is a FIFO (named pipe), not a token file"),  # hung check-config and run
        (b"\xff\xfe\x00t", "UTF-16 text; a token file is UTF-8"),  # UnicodeDecodeError
        (b"tok\xe9n", "not UTF-8 text"),
        (b"abc\ndef\n", "holds more than one word"),  # ValueError: Invalid header value
        (b"tok\xc3\xa9n", "a character no HTTP header takes"),  # UnicodeEncodeError
    ],
)
def test_a_zeusd_token_file_that_holds_no_token_is_one_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, needle: str
) -> None:
    import os

    from gpugov.cli import main

    token = tmp_path / "token"
    if content is None:
        os.mkfifo(token)
    else:
        token.write_bytes(content)
    zeusd = FakeZeusd(token="s3cret")
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nbackend = "zeusd"\n'
        f'zeusd = {{ url = "{zeusd.url}", token_file = "token" }}\n'
        '[[domains]]\nname = "a"\ngpus = [0]\nttft_slo_s = 1.0\ntpot_slo_s = 0.05\n'
    )
    try:
        assert main(["check-config", str(config)]) == 0
    finally:
        zeusd.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "token file" in line]
    assert len(lines) == 1 and f"zeusd token file {token}" in lines[0] and needle in lines[0]
    assert zeusd.calls == []  # nothing was sent with a token it could not read


def test_a_second_actuator_touches_nothing_and_leaves_the_first_serving(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Started twice on one socket, the second actuator reset every GPU (the first's
    governor's locks with them), then replaced the live socket. It now refuses in one
    line before opening a GPU; a regular file at the path is refused the same way (it
    was exit 4, after every GPU was reset)."""
    import os
    import signal

    import gpugov.daemon.nvml as nvml_module
    from gpugov.cli import main
    from gpugov.daemon.actuator_command import STOP_SIGNALS

    nvml = FakeNvml(1)
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: nvml)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGQUIT)}
    served = Served(nvml, socket_path, str(os.getuid()))
    client, (gpu,) = _governor(nvml, socket_path)
    try:
        gpu.lock_clocks(1410, 1410)
        writes = list(nvml.writes)
        argv = ["actuator", "--gpus", "0", "--allow", str(os.getuid())]
        assert main([*argv, "--socket", str(socket_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--socket {socket_path}: another process serves" in err
        assert nvml.writes == writes and nvml.locked(0) == (1410, 1410)
        gpu.lock_clocks(1200, 1200)  # the first still serves its governor
        assert nvml.locked(0) == (1200, 1200)
        plain = socket_path.with_name("plain")
        plain.write_text("kept\n")
        before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        assert main([*argv, "--socket", str(plain)]) == 2
        assert "exists and is not a socket" in capsys.readouterr().err
        assert plain.read_text() == "kept\n" and nvml.locked(0) == (1200, 1200)
        # The caller's own signal handling is back (it was left on the actuator's stop
        # handler, and a later in-process command's Ctrl-C went to it).
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
    finally:
        gpu.close()
        client.close()
        served.stop()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_zeusd_that_trickles_its_answer_costs_one_timeout() -> None:
    """The probe of a zeusd that failed runs on the loop's thread each second: its
    ``timeout_s`` bounded each socket read, so a zeusd answering a byte now and then (a
    wedged process, a proxy) held the loop, and a stop, for as long as it trickled. It is
    one deadline for the whole exchange now, as the engine scrape's."""
    import socket
    import time

    from gpugov.daemon.zeusd import ZeusdClient, ZeusdUnavailable

    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def trickle() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.05):  # a header byte every 50 ms, never the end
                try:
                    connection.sendall(b"X")
                except OSError:
                    return

    threading.Thread(target=trickle, daemon=True).start()
    client = ZeusdClient(url=f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.25)
    try:
        started = time.monotonic()
        with pytest.raises(ZeusdUnavailable):
            client.call("GET", "/discover")
        assert time.monotonic() - started < 2.0
    finally:
        stop.set()
        listener.close()


def test_a_gpu_the_actuator_does_not_serve_is_refused_by_check_config_and_run(
    socket_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A domain's GPU that is not in the actuator's --gpus: check-config said OK, and run
    started, failed its first lock of that GPU and exited 6 ("could not reset the SM clock
    lock of GPU(s) 1; they may still be locked") on a GPU it never locked."""
    import os

    import gpugov.daemon.node_cli as node_cli
    from gpugov.cli import main

    nvml = node_commands_on(monkeypatch, FakeNvml(2))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)

    def loop(*args: object, **kwargs: object) -> None:
        raise AssertionError("run reached its loop")

    monkeypatch.setattr(node_cli, "run", loop)
    served = Served(FakeNvml(1), socket_path, str(os.getuid()))  # it serves GPU 0 alone
    config = tmp_path / "split.toml"
    config.write_text(
        # A generous actuator timeout: the refusal needs its answer now, and a loaded
        # machine's in-process actuator may take longer than a short period's default.
        f'[daemon]\nperiod_s = 5.0\nmetrics_address = ""\nbackend = "actuator"\n'
        f'actuator = {{ socket = "{socket_path}", lease_s = 15.0, timeout_s = 4.0 }}\n'
        '[[domains]]\nname = "a"\ngpus = [0]\nttft_slo_s = 1.0\ntpot_slo_s = 0.05\n'
        '[domains.engine]\nurl = "http://127.0.0.1:9/metrics"\n'
        '[[domains]]\nname = "b"\ngpus = [1]\nttft_slo_s = 1.0\ntpot_slo_s = 0.05\n'
        '[domains.engine]\nurl = "http://127.0.0.1:10/metrics"\n'
    )
    line = (
        f"gpugov: error: domain 'b': GPU 1 is not one the actuator at {socket_path} serves "
        "(it serves GPU 0); add it to gpugov actuator --gpus, or leave it out of the domain"
    )
    try:
        assert main(["check-config", str(config)]) == 2
        assert capsys.readouterr().err.splitlines() == [line]
        assert main(["run", "--config", str(config)]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == line
    finally:
        served.stop()
    assert nvml.writes == []  # nothing was locked, nor reset


def test_changes_paced_at_the_governors_interval_are_never_refused_for_their_ticks_latency(
    socket_path: Path,
) -> None:
    """The governor paces its changes by its ticks (``safety.min_relock_interval_s``, 0.1
    s); each lock is written some milliseconds into its tick (the reads, the scrape, the
    decision), more in one tick than in the next, so two changes a tick apart reach the
    actuator that much sooner than 0.1 s. Its own limit leaves them that room: a change
    was refused as rate-limited about every other tick at ``period_s = 0.1``."""
    import os
    import time

    nvml = FakeNvml(2)
    served = Served(nvml, socket_path, str(os.getuid()))
    served.server.min_relock_s = actuator_server.DEFAULT_MIN_RELOCK_S
    _client, backends = _governor(nvml, socket_path)
    actuator = ClockActuator(backends, domain="llm")
    try:
        assert actuator.write_path_problem() is None
        assert actuator.apply(1410) == 2
        for clock in (1200, 1410, 1005):
            time.sleep(0.085)  # the next tick's change, written 15 ms sooner into it
            assert actuator.apply(clock) == 2
        assert actuator.write_errors == 0
        assert [nvml.locked(i) for i in (0, 1)] == [(1005, 1005)] * 2
        served.server.min_relock_s = 60.0  # a governor relocking faster than its own
        assert actuator.apply(900) == 0  # pacing is still refused
        assert actuator.write_failures == {"0": 1, "1": 1}
    finally:
        for backend in backends:
            backend.close()
        served.stop()


def test_a_lowering_failing_on_one_gpu_through_the_actuator_leaves_no_group_split(
    socket_path: Path,
) -> None:
    """The GPUs a lowering went through on are held back with the one it failed on: from
    its top clock by a reset, which the actuator's rate limit never refuses (a lock back
    at the top clock, milliseconds after the lowering, was refused as rate-limited and
    the group left at 900 MHz beside 1980)."""
    import os

    nvml = FakeNvml(4)
    served = Served(nvml, socket_path, str(os.getuid()))
    served.server.min_relock_s = 60.0  # every lock back would fall within it
    _client, backends = _governor(nvml, socket_path)
    actuator = ClockActuator(backends, domain="tp4")
    try:
        assert actuator.write_path_problem() is None
        assert actuator.apply(1980) == 4
        for gpu in nvml.gpus:  # the limit counts from the lowering, not the first locks
            served.server.gpus[str(gpu.index)].last_lock_s = -1e9
        nvml.gpus[2].lock_error = 10  # NVML_ERROR_TIMEOUT
        actuator.apply(900)
        assert [nvml.locked(i) for i in range(4)] == [None, None, (1980, 1980), None]
    finally:
        for backend in backends:
            backend.close()
        served.stop()


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetSupportedGraphicsClocks",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetCount",
    ],
)
def test_the_actuator_retries_a_gpu_open_that_times_out_once(
    socket_path: Path, caplog: pytest.LogCaptureFixture, capsys: Any, function: str
) -> None:
    """One NVML TIMEOUT while the actuator opens its GPUs (the handle, the clocks' list,
    the max clock, the count for ``all``) made it exit 4, where ``run`` retries it: it
    retries now, with the start's retries, and serves."""
    import os
    import signal

    from gpugov.cli import build_parser
    from gpugov.daemon.nvml import nvml_device_count

    nvml = FakeNvml(2)
    nvml.fail(function, 10)  # NVML_ERROR_TIMEOUT, once
    gpus = "all" if function == "nvmlDeviceGetCount" else "0,1"
    args = build_parser("actuator").parse_args(
        ["actuator", "--gpus", gpus, "--allow", str(os.getuid()), "--socket", str(socket_path)]
    )
    code = actuator_command._serve(
        args,
        [signal.SIGTERM],
        lambda gpu: NvmlBackend(gpu, nvml=nvml),
        lambda: nvml_device_count(nvml),
    )
    err = capsys.readouterr().err
    assert code == 0, err
    retried = [r.getMessage() for r in caplog.records if "attempt 1 of 5" in r.getMessage()]
    assert len(retried) == 1 and "Timeout" in retried[0]
    assert nvml.calls[function] >= 2 and not socket_path.exists()


def test_a_reset_failing_for_now_as_the_actuator_stops_is_retried(socket_path: Path) -> None:
    """One NVML TIMEOUT on the reset at the actuator's stop left the GPU locked at the
    governor's clock and the actuator exited 6, where ``gpugov run``'s exit retries it
    (5 tries, backoff): the actuator's stop retries it the same way now. A GPU whose reset
    is refused for good (lost) is not retried, and is still named."""
    import os

    nvml = FakeNvml(2)
    served = Served(nvml, socket_path, str(os.getuid()))
    client, gpus = _governor(nvml, socket_path)
    try:
        for gpu in gpus:
            gpu.lock_clocks(1410, 1410)
        nvml.fail("nvmlDeviceResetGpuLockedClocks", 10, times=3)  # NVML_ERROR_TIMEOUT
        served._stop.set()
        served._thread.join(10)
        waits: list[float] = []
        assert served.server.close(sleep=waits.append) == []
        assert [nvml.locked(i) for i in range(2)] == [None, None] and len(waits) == 2
        served.server.gpus["1"].held = (1410, 1410)
        nvml.lose(1)
        assert served.server.close(sleep=waits.append) == ["1"] and len(waits) == 2
    finally:
        client.close()
        for backend in served.backends:
            backend.close()


def test_a_zeusd_answer_nested_too_deep_is_no_traceback() -> None:
    """A 200 whose body is JSON nested deeper than the parser recurses (a proxy, another
    program on the port) ended the clock write, and so the loop's tick, in a
    RecursionError traceback; the body of a write's answer is not needed, and such a
    body reads as none, as one that is no JSON does."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    body = b"[" * 20_000
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)

    def answer() -> None:
        for _ in range(2):
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(head + body)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    nvml = FakeNvml(1)
    client = ZeusdClient(url=f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=2.0)
    gpu = ZeusdBackend(NvmlBackend(0, nvml=nvml), client)
    try:
        gpu.lock_clocks(1410, 1410)
        assert client.call("GET", "/discover") is None and client.problem is None
    finally:
        gpu.close()
        thread.join(5)
        listener.close()


def test_a_zeusd_name_whose_lookup_hangs_costs_one_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """zeusd at http://NAME:PORT: its name was looked up with no deadline (the exchange's
    timer cannot cut a lookup), so a DNS server that does not answer held each write, and
    the loop's once-a-second probe of a failed zeusd on its own thread, for the resolver's
    5 s per try and search domain. The lookup is bounded by ``timeout_s`` now, as the
    engine scrape's is, and a name that answers is connected to as looked up."""
    import socket
    import time

    import gpugov.daemon.scrape as scrape

    zeusd = FakeZeusd()
    port = int(zeusd.url.rsplit(":", 1)[1])
    answer = threading.Event()
    lookups: list[str] = []
    real = socket.getaddrinfo

    def hung_dns(host: str, *args: object, **kwargs: object) -> object:
        lookups.append(host)
        assert answer.wait(30), "the test never answered the lookup"
        return real("127.0.0.1", *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scrape.socket, "getaddrinfo", hung_dns)
    client = ZeusdClient(url=f"http://zeusd.node.svc.cluster.local:{port}", timeout_s=0.1)
    try:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(ZeusdUnavailable, match=r"cannot resolve zeusd\.node"):
                client.call("GET", "/discover")
            assert time.monotonic() - started < 5.0  # not the lookup's hang
        assert lookups == ["zeusd.node.svc.cluster.local"]  # one lookup, not two
        answer.set()
        client.timeout_s = 5.0
        client.call("GET", "/discover")
        assert client.problem is None
    finally:
        answer.set()
        zeusd.close()


def test_a_socket_path_the_actuator_cannot_create_is_one_line_before_any_gpu_is_reset(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A --socket in a directory no socket can be made in (read-only, /proc): the actuator
    opened and reset every GPU, then failed to bind ('cannot serve: No such file or
    directory', exit 2). It is one line now, before any GPU is opened, as a missing
    directory or a taken socket is."""
    import os

    import gpugov.daemon.nvml as nvml_module
    from gpugov.cli import main

    nvml = FakeNvml(1)
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: nvml)
    argv = ["actuator", "--gpus", "0", "--allow", str(os.getuid())]
    assert main([*argv, "--socket", "/proc/gpugov-actuator.sock"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--socket /proc/gpugov-actuator.sock: " in err, err
    assert "cannot make a socket there" in err
    assert nvml.calls.get("nvmlInit", 0) == 0 and nvml.writes == []
    assert not os.path.exists("/proc/gpugov-actuator.sock")


def test_a_failed_zeusd_is_probed_once_a_second_for_all_its_gpus() -> None:
    """Each GPU of a zeusd domain had a client of its own, and each probed a failed zeusd
    once a second on the loop's thread: a zeusd that answers slowly (or not: up to
    ``timeout_s`` a probe) cost the loop that many times the GPUs each second (8 GPUs at
    0.25 s: 2 s). The node's GPUs share one client per zeusd now, as the actuator's
    GPUs share one connection: one probe a second in all, one failure count."""
    from gpugov.daemon.gpu_open import open_split_backend

    zeusd = FakeZeusd()
    zeusd.status = 503  # failing for now: every request a 5xx
    config = parse_config(
        _config(f'backend = "zeusd"\nzeusd = {{ url = "{zeusd.url}", timeout_s = 0.5 }}')
    )
    nvml = FakeNvml(4)
    gpus = [open_split_backend(i, "zeusd", config.daemon, nvml=nvml) for i in range(4)]
    try:
        with pytest.raises(ZeusdUnavailable):
            gpus[0].lock_clocks(1410, 1410)
        zeusd.calls.clear()
        problems = [gpu.write_path_problem() for gpu in gpus]  # one tick, within a second
        assert all(problem is not None and "HTTP 503" in problem for problem in problems)
        assert [call[1] for call in zeusd.calls] == ["/discover"]
    finally:
        for gpu in gpus:
            gpu.close()
        zeusd.close()


def test_a_gpu_the_stopping_actuator_cannot_reset_is_locked_at_its_top_clock(
    socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reset that still fails after the stop's retries left the GPU locked at the
    governor's low clock once the actuator exited (exit 6), where ``gpugov run``'s exit
    locks such a GPU at its top clock instead: the actuator does too now, one warning, and
    the GPU is still named as not reset."""
    import os

    nvml = FakeNvml(1)
    top = nvml.gpus[0].top_clock_mhz()
    served = Served(nvml, socket_path, str(os.getuid()))
    client, (gpu,) = _governor(nvml, socket_path)
    try:
        gpu.lock_clocks(1410, 1410)
        nvml.fail("nvmlDeviceResetGpuLockedClocks", 10, times=None)  # NVML_ERROR_TIMEOUT
        served._stop.set()
        served._thread.join(10)
        with caplog.at_level(logging.WARNING, logger="gpugov.daemon.actuator_server"):
            assert served.server.close(sleep=lambda _s: None) == ["0"]
        assert nvml.locked(0) == (top, top)
        lines = [r.getMessage() for r in caplog.records if "top clock" in r.getMessage()]
        assert len(lines) == 1 and f"locked at the top clock ({top} MHz) instead" in lines[0]
    finally:
        client.close()
        for backend in served.backends:
            backend.close()


def test_a_short_lease_is_said_once_not_at_every_reconnection(
    socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An actuator granting less than the governor asks (its --max-lease-s) was warned
    about at every connection: where the lease lapses between ticks, every tick
    reconnects, and the log had that line every tick. It is said once per lease granted."""
    import os

    nvml = FakeNvml(1)
    backends = [NvmlBackend(0, nvml=nvml)]
    server = ActuatorServer(backends, str(socket_path), str(os.getuid()), max_lease_s=0.5)
    server.listen()
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop.is_set,))
    thread.start()
    client = ActuatorClient(str(socket_path), lease_s=5.0, timeout_s=2.0)
    try:
        with caplog.at_level(logging.WARNING, logger="gpugov.daemon.actuator_client"):
            for _ in range(3):
                client.request({"op": "renew"})
                client.close()  # a lapsed lease: the next request connects again
        assert client.epoch == 3
        lines = [r.getMessage() for r in caplog.records if "grants" in r.getMessage()]
        assert lines == ["actuator grants a 0.5 s lease, not the 5 s asked for"]
    finally:
        client.close()
        stop.set()
        thread.join(10)
        server.close()
        backends[0].close()


def test_a_stop_during_the_actuators_open_ends_its_retries(socket_path: Path, capsys: Any) -> None:
    """A stop signal while the actuator retried a GPU's transient error waited out every
    retry (up to 3.75 s a call) before it stopped; the retries end at the stop now, as
    ``gpugov run``'s start's do, and it exits with the error in one line."""
    import os
    import signal

    from gpugov.cli import build_parser
    from gpugov.daemon.stop_signals import StopEvent

    nvml = FakeNvml(1)
    nvml.fail("nvmlDeviceGetSupportedGraphicsClocks", 10, times=None)  # TIMEOUT, for good
    stopped = StopEvent()
    stopped.set()  # the stop came during the open
    args = build_parser("actuator").parse_args(
        ["actuator", "--gpus", "0", "--allow", str(os.getuid()), "--socket", str(socket_path)]
    )
    code = actuator_command._serve(
        args,
        [signal.SIGTERM],
        lambda gpu: NvmlBackend(gpu, nvml=nvml),
        lambda: 1,
        stopped=stopped,
    )
    assert code == 4 and nvml.calls["nvmlDeviceGetSupportedGraphicsClocks"] == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Timeout" in err
    assert nvml.writes == [] and not socket_path.exists()
