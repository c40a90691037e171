"""The daemon's reliability cases, one test each: bad values, deadlines, resets, reconcile,
external clock changes, start retries, config gaps, exporter connections, bounded history."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import fake_pynvml as fp
import pytest
from daemon_support import MetricsServer, eventually, fixture_text, run_ticks
from fake_pynvml import FakeNvml

from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.backend import GpuSample, plausible_clock, plausible_power
from gpugov.daemon.config import parse_config
from gpugov.daemon.engine_sources import ScrapedSource, VllmSource
from gpugov.daemon.engines import extract
from gpugov.daemon.errors import (
    ClocksNotReset,
    ConfigError,
    EngineParseError,
    EngineUnavailable,
    TransientGpuError,
)
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.exposition import parse_page
from gpugov.daemon.gpu_open import open_backend
from gpugov.daemon.lockstate import LockState, StateDirectoryHeld
from gpugov.daemon.loop import TimedLoop, VirtualClock, run
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.observer import DomainObserver
from gpugov.daemon.service import domains_from_config

LOCK = "nvmlDeviceSetGpuLockedClocks"
RESET = "nvmlDeviceResetGpuLockedClocks"
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="m"}'


def _page(extra: str = "", waiting: str = "3") -> str:
    return f'vllm:num_requests_running{{engine="0",model_name="m"}} 2\n{WAITING} {waiting}\n{extra}'


# ---------------------------------------------------------------- item 1: bad values
@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-4"])
def test_non_finite_or_negative_values_are_a_bad_scrape(value: str) -> None:
    series = parse_page(_page(waiting=value), None, "u")
    with pytest.raises(EngineParseError, match=r"impossible value vllm:num_requests_waiting"):
        extract(__import__("gpugov.daemon.engines", fromlist=["VLLM"]).VLLM, series, "u")


def test_kv_usage_above_one_is_impossible() -> None:
    from gpugov.daemon.engines import VLLM

    page = _page('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 7.5\n')
    with pytest.raises(EngineParseError, match="KV cache usage"):
        extract(VLLM, parse_page(page, None, "u"), "u")


# -------------------------------------------------------------- item 14: kv_tokens
def test_kv_tokens_weight_each_engine_by_its_own_capacity() -> None:
    from gpugov.daemon.engines import VLLM

    page = fixture_text("vllm_dp2_synthetic.txt").replace(
        'engine="1",num_gpu_blocks="10000"', 'engine="1",num_gpu_blocks="30000"'
    )
    sample = extract(VLLM, parse_page(page, VLLM.wanted(), "u"), "u")
    # engine 0: 0.5 x 160,000; engine 1: 0.25 x 480,000 (not the mean 0.375 x 640,000).
    assert sample.kv_capacity_tokens == 640_000.0
    assert sample.kv_tokens == pytest.approx(0.5 * 160_000 + 0.25 * 480_000)
    assert sample.kv_usage_ratio == pytest.approx(200_000 / 640_000)


# ---------------------------------------------------------- item 2: one deadline
class _Trickle:
    """A loopback server that answers one byte every ``gap_s`` (headers and all), or with
    ``head_at_once`` its headers at once and then the body a byte at a time."""

    def __init__(
        self, gap_s: float = 0.05, *, protocol: str = "HTTP/1.1", head_at_once: bool = False
    ) -> None:
        self.gap_s = gap_s
        self.protocol = protocol
        self.head_at_once = head_at_once
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(4)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/metrics"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        head = f"{self.protocol} 200 OK\r\nContent-Length: 100000\r\n\r\n".encode()
        body = head + b"x" * 100000
        try:
            conn.recv(65536)
            if self.head_at_once:
                conn.sendall(head)
                body = body[len(head) :]
            for byte in body:
                if self._stop.is_set():
                    break
                conn.sendall(bytes([byte]))
                time.sleep(self.gap_s)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


def test_a_trickling_engine_costs_at_most_the_deadline() -> None:
    server = _Trickle()
    try:
        source = VllmSource(server.url, timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises(EngineUnavailable, match=r"no complete answer within 0\.3 s"):
            source.scrape()
        assert time.monotonic() - started < 1.0  # per-read timeouts alone never end
        started = time.monotonic()
        with pytest.raises(EngineUnavailable):
            source.scrape(timeout_s=0.1)  # the observer's shorter budget wins
        assert time.monotonic() - started < 0.6
    finally:
        server.close()


@pytest.mark.parametrize("protocol", ["HTTP/1.0", "HTTP/1.1"])
def test_a_body_trickled_after_prompt_headers_costs_at_most_the_deadline(protocol: str) -> None:
    """Headers at once, then the body a byte at a time: the deadline still cuts the body,
    also when the answer will close the connection (HTTP/1.0), where http.client hands the
    socket to the response and the connection no longer holds it."""
    server = _Trickle(protocol=protocol, head_at_once=True)
    try:
        started = time.monotonic()
        with pytest.raises(EngineUnavailable, match=r"no complete answer within 0\.3 s"):
            VllmSource(server.url, timeout_s=0.3).scrape()
        assert time.monotonic() - started < 1.0
    finally:
        server.close()


def test_an_oversized_page_is_refused(metrics_server: MetricsServer) -> None:
    metrics_server.page = _page() + "# padding\n" * 20_000
    source = ScrapedSource(metrics_server.url, "vllm", timeout_s=2.0, max_page_bytes=64 * 1024)
    with pytest.raises(EngineParseError, match="over the 65536-byte limit"):
        source.scrape()


class _SlowSource:
    """An engine that answers after ``delay_s`` (of the observer's clock) or fails."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.ok = True
        self.budgets: list[float | None] = []

    def scrape(self, timeout_s: float | None = None) -> Any:
        from gpugov.daemon.engines import EngineSample

        self.budgets.append(timeout_s)
        if self.ok:
            self.clock[0] += 0.01
            return EngineSample("vllm", 1, 1)
        self.clock[0] += timeout_s if timeout_s is not None else 0.4  # timed out
        raise EngineUnavailable("slow")


def test_failsafe_within_stale_plus_one_period_for_a_slow_engine() -> None:
    clock = [0.0]
    source = _SlowSource(clock)
    gpu = NvmlBackend(0, nvml=_fake_open(FakeNvml(1)))
    period, stale = 1.0, 2.0
    observer = DomainObserver(
        [gpu], source, stale_after_s=stale, clock=lambda: clock[0], scrape_timeout_s=0.9
    )
    observer.observe(0.0, 0, None)  # good data, received at ~0.01
    source.ok = False
    failsafe_at = None
    for step in range(1, 6):
        clock[0] = 0.0
        observed = observer.observe(step * period, step, None)
        if not observed.engine_fresh:
            failsafe_at = step * period + observed.scrape_s
            break
    assert failsafe_at is not None
    assert failsafe_at - 0.01 <= stale + period
    assert source.budgets[1:3] == [0.9, pytest.approx(0.01)]  # the last tick is cut short


def _fake_open(fake: FakeNvml) -> Any:
    return fake


# ------------------------------------------------------------- item 12: log lines
def test_a_field_read_that_keeps_failing_is_one_warning_and_one_line_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NVML reads a sample field by field: a temperature read that failed was only a
    DEBUG line per tick (counted), so an operator saw nothing while the thermal limit went
    unread. It is one WARNING when it starts, one INFO line when it reads again, and a
    read that comes and goes logs at most one such pair a minute."""
    clock = [0.0]
    fake = FakeNvml(1)
    observer = DomainObserver(
        [NvmlBackend(0, nvml=_fake_open(fake))],
        _SlowSource(clock),
        stale_after_s=3.0,
        log_every_s=60.0,
    )
    with caplog.at_level(logging.INFO, logger="gpugov.daemon"):
        fake.fail("nvmlDeviceGetTemperatureV", fp.NVML_ERROR_TIMEOUT, times=None)
        fake.fail("nvmlDeviceGetTemperature", fp.NVML_ERROR_TIMEOUT, times=None)
        for step in range(10):
            observer.observe(float(step), step, None)
        fake.clear_failures()
        observer.observe(10.0, 10, None)
        # It comes and goes within the minute: counted, at DEBUG.
        fake.fail("nvmlDeviceGetTemperatureV", fp.NVML_ERROR_TIMEOUT, times=1)
        fake.fail("nvmlDeviceGetTemperature", fp.NVML_ERROR_TIMEOUT, times=1)
        observer.observe(11.0, 11, None)
        observer.observe(12.0, 12, None)
    lines = [r.getMessage() for r in caplog.records if "temperature" in r.getMessage()]
    assert lines == [
        "GPU 0: its temperature read failed; left out of the sample while it fails "
        "(gpugov_gpu_read_errors_total)",
        "GPU 0: its temperature reads again after 10 failed read(s)",
    ]
    assert observer.gpus.gpu_read_errors["0"] == 11


def test_scrape_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    source = _SlowSource(clock)
    observer = DomainObserver(
        [NvmlBackend(0, nvml=FakeNvml(1))], source, stale_after_s=3.0, log_every_s=60.0
    )
    source.ok = False
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        for step in range(100):
            observer.observe(float(step), step, None)
        source.ok = True
        observer.observe(100.0, 100, None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "engine scrape failed: slow"
    assert sum("still failing" in line for line in lines) == 1  # at 60 s
    assert lines[-1].startswith("engine scrape back after 100 failed scrape(s)")
    assert len(lines) == 3


# ---------------------------------------------------- items 4 and 3: exit reset
def test_failed_reset_is_retried_then_named() -> None:
    fake = FakeNvml(2)
    backends = [NvmlBackend(i, nvml=fake) for i in range(2)]
    sleeps: list[float] = []
    actuator = ClockActuator(backends, sleep=sleeps.append)
    actuator.apply(1410)
    fake.fail(RESET, fp.NVML_ERROR_TIMEOUT, times=3)
    assert actuator.restore() == []
    assert fake.locked(0) is None and fake.locked(1) is None
    assert sleeps == [0.2, 0.4]  # GPU 0 failed twice, then reset; GPU 1 once
    actuator.apply(1200)
    fake.lose(1)
    fake.fail(RESET, fp.NVML_ERROR_UNKNOWN, times=None)
    assert actuator.restore() == ["0", "1"]
    assert len(sleeps) == 2 + 4  # GPU 1 (lost) is not retried; GPU 0 five times


@pytest.mark.parametrize("code", [fp.NVML_ERROR_UNKNOWN, fp.NVML_ERROR_NOT_SUPPORTED])
def test_a_gpu_whose_reset_keeps_failing_at_exit_is_not_left_locked_low(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The exit's reset failing on every try (a driver that answers UNKNOWN, or refuses
    the reset as NOT_SUPPORTED while it took the lock) left the GPU locked at the low
    clock gpugov had set, for good; the loop's fail-safe locks the top clock instead of a
    reset that fails, and so does the exit now. The GPU is still named (exit 6)."""
    fake = FakeNvml(2)
    backends = [NvmlBackend(i, nvml=fake) for i in range(2)]
    actuator = ClockActuator(backends, sleep=lambda s: None)
    actuator.apply(1200)
    fake.fail(RESET, code, times=None)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.actuator"):
        assert actuator.restore() == ["0", "1"]
    assert fake.locked(0) == (1980, 1980) and fake.locked(1) == (1980, 1980)
    lines = [r.getMessage() for r in caplog.records if "top clock" in r.getMessage()]
    assert lines == [
        f"domain default: GPU {gpu}: its reset failed; locked at the top clock (1980 MHz) "
        "instead, so it is not held low (it is still locked: gpugov reset-clocks unlocks it)"
        for gpu in ("0", "1")
    ]


def test_a_gpu_gpugov_unlocked_is_not_locked_at_exit_when_its_reset_fails() -> None:
    """A GPU the fail-safe unlocked (its reset went through) runs at its default clocks:
    the exit's reset failing on it must not lock it at the top clock, which left a GPU
    gpugov had let go locked after gpugov exited."""
    fake = FakeNvml(1)
    actuator = ClockActuator([NvmlBackend(0, nvml=fake)], sleep=lambda s: None)
    actuator.apply(1200)
    actuator.unlock()
    assert fake.locked(0) is None and actuator.locked_mhz["0"] is None
    fake.fail(RESET, fp.NVML_ERROR_UNKNOWN, times=None)
    actuator.restore()
    assert fake.locked(0) is None


def test_a_gpu_lost_at_exit_is_not_locked_at_the_top_clock() -> None:
    fake = FakeNvml(2)
    backends = [NvmlBackend(i, nvml=fake) for i in range(2)]
    actuator = ClockActuator(backends, sleep=lambda s: None)
    actuator.apply(1200)
    fake.lose(1)
    reset = fake.nvmlDeviceResetGpuLockedClocks

    def reset_fails_on_gpu_0(handle: Any) -> None:
        if handle.index == 0:
            raise fp.NVMLError(fp.NVML_ERROR_UNKNOWN)
        reset(handle)

    fake.nvmlDeviceResetGpuLockedClocks = reset_fails_on_gpu_0  # type: ignore[method-assign]
    calls = dict(fake.calls)
    assert actuator.restore() == ["0", "1"]
    assert fake.locked(0) == (1980, 1980)
    assert fake.calls[LOCK] == calls[LOCK] + 1  # GPU 0's; nothing more is asked of GPU 1


def test_run_raises_naming_the_gpus_still_locked(metrics_server: MetricsServer) -> None:
    metrics_server.page = fixture_text("vllm_v1_real.txt")
    fake = FakeNvml(2)
    config = parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0, 1],
                    "engine": {"kind": "vllm", "url": metrics_server.url, "timeout_s": 0.9},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                }
            ],
        }
    )
    assembled = domains_from_config(config, nvml=fake)
    for domain in assembled.domains:
        domain.actuator._sleep = lambda s: None
    clock = VirtualClock()

    def stop_after(now: float, step: int) -> bool:
        if step == 2:
            fake.fail(RESET, fp.NVML_ERROR_UNKNOWN, times=None)
        return step >= 2

    with pytest.raises(ClocksNotReset, match=r"GPU\(s\) 0,1; .*reset-clocks --gpus 0,1"):
        run(
            assembled.domains,
            TimedLoop(1.0, clock=clock, sleep=clock.sleep),
            before_tick=stop_after,
        )
    assembled.close()
    assert fake.locked(0) == (1980, 1980)  # not reset, but not held at 1410 MHz either


# ---------------------------------------------------------- item 6: reconcile
def test_reconcile_resets_what_a_killed_run_left(tmp_path: Path) -> None:
    fake = FakeNvml(2)
    first = ClockActuator(
        [NvmlBackend(i, nvml=fake) for i in range(2)], state=LockState(tmp_path, pid=1)
    )
    first.apply(1200)  # ... and the process is SIGKILLed: no restore
    assert set(LockState(tmp_path).read()) == {"GPU-fake-0000", "GPU-fake-0001"}
    fake.gpus[1].locked = None  # someone reset GPU 1 by hand meanwhile
    fake.gpus[1].sm_clock_mhz = 1980
    fake.gpus[1].event_reasons = 0
    second = ClockActuator(
        [NvmlBackend(i, nvml=fake) for i in range(2)], state=LockState(tmp_path, pid=2)
    )
    lines = second.reconcile("reset")
    assert "previous gpugov run (pid 1" in lines[0] and lines[0].endswith("; reset")
    assert "1200-1200 MHz" in lines[0]
    assert lines[1].endswith("; reset")  # the record says locked: reset anyway (harmless)
    assert fake.locked(0) is None and LockState(tmp_path).read() == {}


def test_reconcile_refuses_a_lock_whose_gpugov_still_runs(tmp_path: Path) -> None:
    """A record written by a gpugov that still runs is another daemon's live lock (its
    state directory's hold lost: the directory deleted under it), not a crash's
    leftover: the start refuses in one line and leaves the lock alone."""
    import subprocess
    import sys

    from gpugov.daemon.errors import ConfigError

    fake = FakeNvml(1)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "gpugov-run-stand-in"]
    )
    try:
        first = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=other.pid))
        first.apply(900)
        second = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path))
        with pytest.raises(ConfigError, match=rf"gpugov pid {other.pid} holds its clock lock"):
            second.reconcile("reset")
        assert fake.locked(0) == (900, 900)
    finally:
        other.kill()
        other.wait()
    # Once it has ended, its record is a leftover again: reset.
    (line,) = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path)).reconcile(
        "reset"
    )
    assert line.endswith("; reset") and fake.locked(0) is None


def test_a_record_older_than_the_gpugov_now_running_under_its_pid_is_a_leftover(
    tmp_path: Path,
) -> None:
    """After a reboot the record's pid can be another gpugov's (the split mode's actuator,
    started at boot): a process started after the record was written is not its writer.
    The start refused (exit 2, which the units do not restart) until the file was removed
    by hand; the lock and the power limit are now undone."""
    import json
    import subprocess
    import sys

    from gpugov.daemon.power_limit import PowerLimitActuator

    fake = FakeNvml(1)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "gpugov-actuator-stand-in"]
    )
    try:
        killed = LockState(tmp_path, pid=other.pid, write_deadline_s=60.0)
        ClockActuator([NvmlBackend(0, nvml=fake)], state=killed).apply(900)
        PowerLimitActuator([NvmlBackend(0, nvml=fake)], domain="d", state=killed).apply(300.0)
        data = json.loads((tmp_path / "locks.json").read_text())
        for entries in (data["gpus"], data["power_limits"]):
            entries["GPU-fake-0000"]["time"] = "2026-01-01T00:00:00+00:00"  # before the boot
            for field in ("boot_id", "start_ticks"):  # a record of a gpugov before them
                entries["GPU-fake-0000"].pop(field)
        (tmp_path / "locks.json").write_text(json.dumps(data))
        state = LockState(tmp_path)
        (line,) = ClockActuator([NvmlBackend(0, nvml=fake)], state=state).reconcile("reset")
        assert f"previous gpugov run (pid {other.pid}" in line and line.endswith("; reset")
        (limit,) = PowerLimitActuator(
            [NvmlBackend(0, nvml=fake)], domain="d", state=state
        ).reconcile()
        assert limit.endswith("; restored")
        assert fake.locked(0) is None and fake.gpus[0].power_limit_mw == 700_000
        assert LockState(tmp_path).read() == {} and LockState(tmp_path).power_limits() == {}
    finally:
        other.kill()
        other.wait()


def test_the_writer_of_a_lock_record_is_told_by_its_boot_and_start_not_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record names its writer's boot and start tick beside its pid: an NTP step of the
    wall clock after the record was written (a node that locked before its time synced)
    made the running writer a leftover, and a second daemon (the state directory's hold
    lost) reset its live lock and fought it; a step back made a process that took the pid
    later its writer. Now the step changes neither, and the record of another boot or
    another process under that pid is a leftover whatever the clock says."""
    import json
    import subprocess
    import sys

    import gpugov.daemon.lockstate as lockstate
    from gpugov.daemon.errors import ConfigError
    from gpugov.daemon.lockstate import live_writer

    fake = FakeNvml(1)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "gpugov-run-stand-in"]
    )
    try:
        ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=other.pid)).apply(
            900
        )
        data = json.loads((tmp_path / "locks.json").read_text())
        entry = data["gpus"]["GPU-fake-0000"]
        assert entry["boot_id"] and isinstance(entry["start_ticks"], int)
        real_time = time.time
        for step_s in (3600.0, -3600.0):  # the wall clock stepped forward, then back
            monkeypatch.setattr(lockstate.time, "time", lambda s=step_s: real_time() + s)
            assert live_writer(entry)
            second = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path))
            with pytest.raises(ConfigError, match=rf"gpugov pid {other.pid} holds its clock"):
                second.reconcile("reset")
            assert fake.locked(0) == (900, 900)
            assert not live_writer({**entry, "start_ticks": entry["start_ticks"] + 1})
            assert not live_writer({**entry, "boot_id": "another-boot"})
        monkeypatch.setattr(lockstate.time, "time", real_time)
        # The same pid taken by another process since: its record is a leftover.
        data["gpus"]["GPU-fake-0000"]["start_ticks"] = entry["start_ticks"] - 1
        (tmp_path / "locks.json").write_text(json.dumps(data))
        (line,) = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path)).reconcile(
            "reset"
        )
        assert f"previous gpugov run (pid {other.pid}" in line and line.endswith("; reset")
        assert fake.locked(0) is None
    finally:
        other.kill()
        other.wait()


def test_a_lock_adopted_from_a_run_with_this_pid_is_stamped_anew(tmp_path: Path) -> None:
    """The record of a lock adopted from a killed run that had this pid (a container's
    pid 1) is written again with this run's time: kept with the old time, it would read
    as a leftover of a process that started after it, and be reset under this run."""
    import json

    fake = FakeNvml(1)
    ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=1)).apply(900)
    data = json.loads((tmp_path / "locks.json").read_text())
    data["gpus"]["GPU-fake-0000"]["time"] = "2026-01-01T00:00:00+00:00"
    (tmp_path / "locks.json").write_text(json.dumps(data))
    restarted = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=1))
    (line,) = restarted.reconcile("adopt")
    assert "left it locked at 900-900 MHz" in line and line.endswith("reset on exit")
    entry = LockState(tmp_path).read()["GPU-fake-0000"]
    assert entry["max_mhz"] == 900 and entry["time"] != "2026-01-01T00:00:00+00:00"


def test_reconcile_sees_a_lock_nobody_recorded_and_can_adopt(tmp_path: Path) -> None:
    fake = FakeNvml(1)
    fake.nvmlInit()
    fake.nvmlDeviceSetGpuLockedClocks(fake.gpus[0], 900, 900)  # nvidia-smi -lgc 900
    fake.nvmlShutdown()
    actuator = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path))
    (line,) = actuator.reconcile("adopt")
    assert "runs at 900 MHz of 1980 MHz with ApplicationsClocksSetting" in line
    assert line.endswith("adopted: governed from here, reset on exit")
    assert fake.locked(0) == (900, 900)
    assert actuator.restore() == [] and fake.locked(0) is None
    (line,) = ClockActuator([NvmlBackend(0, nvml=fake)]).reconcile("reset")
    assert line.startswith("GPU 0: no lock found (SM clock 1980 MHz of 1980 MHz)")


def _adopted_then_yielding_node(tmp_path: Path, server: MetricsServer, fake: FakeNvml) -> Any:
    """A node of GPU 0 on ``fake`` at a fixed 1410 MHz that adopts what a previous run
    left and yields to outside clock changes, its state in ``tmp_path``."""
    server.page = _page()
    config = parse_config(
        {
            "daemon": {"period_s": 1.0, "state_dir": str(tmp_path), "reconcile": "adopt"},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "external_clock_policy": "yield",
                    "engine": {"kind": "vllm", "url": server.url, "timeout_s": 0.9},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                }
            ],
        }
    )
    return domains_from_config(config, nvml=fake)


@pytest.mark.parametrize("since", ["a reboot", "a reset"])
def test_a_recorded_lock_that_is_gone_is_not_adopted_as_held(
    tmp_path: Path, metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture, since: str
) -> None:
    """A run crashed with its GPU locked at 1410 MHz; a reboot (or ``nvidia-smi -rgc``)
    reset the lock before the next start. Adopted, the lock was taken as held while the
    GPU ran unlocked: the readback took its default clock for someone else's change, and
    with ``yield`` the GPU was left ungoverned for the whole run."""
    import json

    fake = FakeNvml(1)
    ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=1)).apply(1410)
    if since == "a reboot":
        path = tmp_path / "locks.json"
        record = json.loads(path.read_text())
        record["gpus"]["GPU-fake-0000"]["boot_id"] = "0f3c0000-an-earlier-boot"
        path.write_text(json.dumps(record))
    fake.gpus[0].locked, fake.gpus[0].sm_clock_mhz, fake.gpus[0].event_reasons = None, 1980, 0
    with caplog.at_level(logging.INFO, logger="gpugov.daemon.lockstate"):
        assembled = _adopted_then_yielding_node(tmp_path, metrics_server, fake)
    locks: list[Any] = []
    try:
        (line,) = assembled.domains[0].actuator.reconcile("adopt")
        if since == "a reboot":  # the record is of no lock at all
            assert line.startswith("GPU 0: no lock found"), line
            assert "of an earlier boot" in caplog.text
        else:
            assert "adopted" in line and "taken as unknown" in line, line
        run_ticks(assembled.domains, 4, on_step=lambda step, records: locks.append(fake.locked(0)))
    finally:
        assembled.close()
    assert locks == [(1410, 1410)] * 4  # governed, never yielded
    assert "GPU-fake-0000" not in LockState(tmp_path).read()


def test_a_recorded_lock_still_in_force_is_adopted_as_held(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    """The same record with the GPU still locked: adopted as held, nothing written."""
    fake = FakeNvml(1)
    ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=1)).apply(1410)
    assembled = _adopted_then_yielding_node(tmp_path, metrics_server, fake)
    held: list[Any] = []
    try:
        (line,) = assembled.domains[0].actuator.reconcile("adopt")
        assert line.endswith("adopted: governed from here, reset on exit"), line
        run_ticks(assembled.domains, 3, on_step=lambda step, records: held.append(fake.locked(0)))
    finally:
        assembled.close()
    assert held == [(1410, 1410)] * 3
    locks = [w for w in fake.writes if w[0] == LOCK]
    assert locks == [(LOCK, 0, 1410, 1410)]  # the crashed run's only


@pytest.mark.parametrize(
    "clocks",
    [{"min_mhz": "abc", "max_mhz": "abc"}, {"max_mhz": 900}, {"min_mhz": float("nan")}],
    ids=["text", "missing", "nan"],
)
@pytest.mark.parametrize("policy", ["adopt", "reset"])
def test_a_damaged_lock_record_is_a_lock_of_unknown_clocks(
    tmp_path: Path, clocks: dict[str, object], policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A record whose clocks are not clocks (hand-edited, a bad disk) still says a run left
    the GPU locked: the start adopts or resets it, with one warning, and never raises."""
    import json

    fake = FakeNvml(1)
    ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=1)).apply(900)
    path = tmp_path / "locks.json"
    record = json.loads(path.read_text())
    entry = record["gpus"]["GPU-fake-0000"]
    del entry["min_mhz"], entry["max_mhz"]
    entry.update(clocks)
    entry["pid"] = 999_999_999  # no such process
    path.write_text(json.dumps(record))  # NaN is written as JSON's NaN, which json reads
    actuator = ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=2))
    with caplog.at_level("WARNING"):
        (line,) = actuator.reconcile(policy)
    assert "locked (clocks unknown)" in line
    assert "its locked clocks are taken as unknown" in caplog.text
    if policy == "adopt":
        assert line.endswith("adopted: governed from here, reset on exit")
        assert actuator.restore() == [] and fake.locked(0) is None
    else:
        assert line.endswith("; reset") and fake.locked(0) is None


def test_a_lock_record_with_numbers_too_large_for_a_machine_is_read_not_raised(
    tmp_path: Path,
) -> None:
    """A pid no machine has (10**21: a hand edit, a flipped bit) raised OverflowError
    from os.kill: `gpugov run` ended in a traceback before its reconcile, leaving the GPU
    locked low at every restart, and `gpugov status` did too; a power limit recorded as an
    integer too large for a float did the same in the power limit's reconcile. The pid is
    nobody's, the limit unknown: the lock is reset and the limit restored, and status
    shows the record."""
    import json

    from gpugov.daemon.power_limit import PowerLimitActuator
    from gpugov.daemon.status_cli import _held_line, held_by_gpugov

    fake = FakeNvml(1)
    killed = LockState(tmp_path, pid=1, write_deadline_s=60.0)
    ClockActuator([NvmlBackend(0, nvml=fake)], state=killed).apply(900)
    PowerLimitActuator([NvmlBackend(0, nvml=fake)], domain="d", state=killed).apply(300.0)
    path = tmp_path / "locks.json"
    text = path.read_text()
    record = json.loads(text)
    huge = 10**400
    for entries in (record["gpus"], record["power_limits"]):
        entries["GPU-fake-0000"]["pid"] = 10**21
    record["power_limits"]["GPU-fake-0000"]["set_mw"] = huge
    path.write_text(json.dumps(record))
    assert str(huge) in path.read_text()  # an integer JSON holds, no float can
    (held,) = held_by_gpugov(tmp_path, ["GPU-fake-0000"]).values()
    assert held["running"] is False and held["power_limit_w"] is None
    assert "clock lock 900-900 MHz; power limit ? W (700 W before)" in _held_line(held)
    state = LockState(tmp_path)
    (line,) = ClockActuator([NvmlBackend(0, nvml=fake)], state=state).reconcile("reset")
    assert f"previous gpugov run (pid {10**21}" in line and line.endswith("; reset")
    (limit,) = PowerLimitActuator([NvmlBackend(0, nvml=fake)], domain="d", state=state).reconcile()
    assert "set its power limit to ? W" in limit and limit.endswith("; restored")
    assert fake.locked(0) is None and fake.gpus[0].power_limit_mw == 700_000


@pytest.mark.parametrize("pid", [True, False, 0, -7, "4242", None])
def test_a_lock_record_whose_pid_is_no_pid_names_its_writer_unknown(
    tmp_path: Path, pid: object
) -> None:
    """A bool is no pid (JSON's ``true`` is an int to Python): a record with ``"pid":
    true`` was named "pid True" by the reconcile lines, and a missing or negative one "pid
    None" or "pid -7". Each is an unknown pid now, as status already showed text."""
    import json

    from gpugov.daemon.power_limit import PowerLimitActuator
    from gpugov.daemon.status_cli import _held_line, held_by_gpugov

    fake = FakeNvml(1)
    killed = LockState(tmp_path, pid=1, write_deadline_s=60.0)
    ClockActuator([NvmlBackend(0, nvml=fake)], state=killed).apply(900)
    PowerLimitActuator([NvmlBackend(0, nvml=fake)], domain="d", state=killed).apply(300.0)
    path = tmp_path / "locks.json"
    record = json.loads(path.read_text())
    for entries in (record["gpus"], record["power_limits"]):
        entries["GPU-fake-0000"]["pid"] = pid
    path.write_text(json.dumps(record))
    (held,) = held_by_gpugov(tmp_path, ["GPU-fake-0000"]).values()
    assert held["pid"] is None and "held by a gpugov run (pid unknown, not running" in (
        _held_line(held)
    )
    state = LockState(tmp_path)
    (line,) = ClockActuator([NvmlBackend(0, nvml=fake)], state=state).reconcile("reset")
    (limit,) = PowerLimitActuator([NvmlBackend(0, nvml=fake)], domain="d", state=state).reconcile()
    for said in (line, limit):
        assert said.startswith("GPU 0: a previous gpugov run (pid unknown, "), said
    assert line.endswith("; reset") and limit.endswith("; restored")


def test_status_says_in_words_that_a_damaged_lock_records_clocks_are_unknown(
    tmp_path: Path,
) -> None:
    """A lock record whose clocks are damaged is still a lock (its clocks are taken as
    unknown); `gpugov status` printed it as "clock lock None-None MHz"."""
    import json

    from gpugov.daemon.status_cli import _held_line, held_by_gpugov

    fake = FakeNvml(1)
    ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path, pid=1)).apply(900)
    path = tmp_path / "locks.json"
    record = json.loads(path.read_text())
    record["gpus"]["GPU-fake-0000"]["min_mhz"] = "fast"
    path.write_text(json.dumps(record))
    (held,) = held_by_gpugov(tmp_path, ["GPU-fake-0000"]).values()
    assert held["clock_lock_mhz"] == [None, None]
    line = _held_line(held)
    assert "clock lock (clocks unknown)" in line and "None" not in line


# ------------------------------------------------- item 7: external clock changes
@pytest.mark.parametrize("policy", ["reassert", "yield"])
def test_external_clock_change_is_seen_counted_and_handled(policy: str) -> None:
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    actuator = ClockActuator([backend], external_policy=policy)  # type: ignore[arg-type]
    actuator.apply(1410)
    assert actuator.check_readback([backend.sample()]) == []
    fake.nvmlDeviceResetGpuLockedClocks(fake.gpus[0])  # nvidia-smi -rgc behind our back
    assert actuator.check_readback([backend.sample()]) == []  # one read is not enough
    assert actuator.check_readback([backend.sample()]) == ["0"]
    assert actuator.external_changes == {"0": 1}
    assert actuator.applied_mhz is None  # what is true: not our lock any more
    writes = actuator.apply(1410)
    if policy == "reassert":
        assert writes == 1 and fake.locked(0) == (1410, 1410)
    else:
        assert writes == 0 and fake.locked(0) is None and actuator.yielded == {"0"}
        assert actuator.restore() == [] and fake.writes[-1][0] == RESET  # not reset by us


def test_a_lock_written_again_after_reset_clocks_is_recorded_again(tmp_path: Path) -> None:
    """``gpugov reset-clocks`` resets the GPU and clears its record; the daemon, finding
    its lock gone, locks again and records it again (the record is what a killed daemon
    leaves for the next start)."""
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    actuator = ClockActuator([backend], state=LockState(tmp_path, pid=1))
    actuator.apply(900)
    assert LockState(tmp_path).read()["GPU-fake-0000"]["max_mhz"] == 900
    fake.nvmlDeviceResetGpuLockedClocks(fake.gpus[0])  # gpugov reset-clocks, another process
    LockState(tmp_path, pid=2).clear("GPU-fake-0000")
    assert LockState(tmp_path).read() == {}
    actuator.check_readback([backend.sample()])
    assert actuator.check_readback([backend.sample()]) == ["0"]
    assert actuator.apply(900) == 1 and fake.locked(0) == (900, 900)
    assert LockState(tmp_path).read()["GPU-fake-0000"]["max_mhz"] == 900


def test_a_dry_run_never_calls_the_real_clock_an_external_change() -> None:
    from gpugov.daemon.backend import DryRunBackend

    fake = FakeNvml(1)
    backend = DryRunBackend(NvmlBackend(0, nvml=fake))
    actuator = ClockActuator([backend])
    actuator.apply(1410)  # only logged: the GPU stays at 1980
    for _ in range(4):
        assert actuator.check_readback([backend.sample()]) == []
    assert actuator.external_changes == {"0": 0}


@pytest.mark.parametrize(
    ("clock_mhz", "reasons", "kept"),
    [
        (1410.0, 0x2, True),  # a lock's clock
        (2000.0, 0x0, True),  # a boost step above the top: within two steps
        (5000.0, 0x2, False),  # above the top supported clock: no GPU runs there
        (0.0, 0x2, False),  # below the lowest, nothing explains it
        (200.0, 0x20, True),  # below the lowest under a thermal slowdown: a real reading
        (0.0, None, True),  # reasons unknown: cannot tell, kept
    ],
)
def test_an_sm_clock_no_gpu_runs_at_is_a_failed_read(
    clock_mhz: float, reasons: int | None, kept: bool
) -> None:
    sample = GpuSample("0", sm_clock_mhz=clock_mhz, clock_event_reasons=reasons)
    checked = plausible_clock(sample, 345.0, 1980.0, 30.0)
    assert (checked.sm_clock_mhz == clock_mhz) is kept
    assert checked.read_errors == (() if kept else ("sm_clock",))


@pytest.mark.parametrize(
    ("field", "value", "kept"),
    [
        ("temperature_c", 255.0, False),  # an 8-bit sensor's fault value
        ("temperature_c", 0.0, True),
        ("temperature_c", 95.0, True),
        ("power_w", 1e6, False),  # 1e9 mW
        ("power_w", 0.0, True),
        ("power_w", 5600.0, True),  # the TP-8 group one emulated GPU stands for
    ],
)
def test_a_temperature_or_power_no_gpu_reads_is_a_failed_read(
    field: str, value: float, kept: bool
) -> None:
    sample = GpuSample.read("0", **{field: value})
    assert (getattr(sample, field) == value) is kept
    assert bool(sample.read_errors) is not kept


@pytest.mark.parametrize(
    ("power_w", "highest_w", "enforced_w", "kept"),
    [
        (650.0, 700.0, 700.0, True),
        (1300.0, 700.0, 300.0, True),  # above a cap gpugov set, within the board's range
        (9000.0, 700.0, 700.0, False),  # under 50 kW, yet thirteen times the board
        (9000.0, None, 700.0, False),  # no constraints read: the enforced limit serves
        (9000.0, None, None, True),  # nothing to judge it by
    ],
)
def test_a_power_far_above_the_gpus_limit_is_a_failed_read(
    power_w: float, highest_w: float | None, enforced_w: float | None, kept: bool
) -> None:
    sample = GpuSample.read("0", power_w=power_w, power_limit_w=enforced_w)
    checked = plausible_power(sample, highest_w)
    assert (checked.power_w == power_w) is kept
    assert checked.read_errors == (() if kept else ("power",))


def test_the_observer_drops_a_power_far_above_the_limit_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml(1)
    fake.gpus[0].power_mw = 9_000_000  # 9 kW from a 700 W board: a sensor fault
    backend = NvmlBackend(0, nvml=fake)
    observer = DomainObserver([backend], _NoEngine(), stale_after_s=3.0)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.observer"):
        for step in range(3):
            observed = observer.observe(float(step), step, None)
    assert observed.gpu_samples[0].power_w is None
    assert observer.gpus.gpu_read_errors["0"] == 3
    lines = [r.getMessage() for r in caplog.records if "power read" in r.getMessage()]
    assert len(lines) == 1 and "9000 W" in lines[0] and "700 W" in lines[0]
    backend.close()


class _NoEngine:
    def scrape(self, timeout_s: float | None = None) -> Any:
        raise EngineUnavailable("down")


def test_throttling_below_the_lock_is_not_an_external_change() -> None:
    fake = FakeNvml(1)
    backend = NvmlBackend(0, nvml=fake)
    actuator = ClockActuator([backend])
    actuator.apply(1410)
    fake.gpus[0].sm_clock_mhz = 1100
    fake.gpus[0].event_reasons |= fp.nvmlClocksEventReasonSwPowerCap
    for _ in range(3):
        assert actuator.check_readback([backend.sample()]) == []
    fake.gpus[0].event_reasons = fp.nvmlClocksEventReasonApplicationsClocksSetting
    actuator.check_readback([backend.sample()])
    assert actuator.check_readback([backend.sample()]) == ["0"]  # someone locked it lower


# ------------------------------------------------------ item 9: start retries
def test_transient_nvml_errors_at_start_are_retried() -> None:
    fake = FakeNvml(1)
    fake.fail("nvmlDeviceGetSupportedGraphicsClocks", fp.NVML_ERROR_TIMEOUT, times=2)
    sleeps: list[float] = []
    backend = open_backend(0, nvml=fake, sleep=sleeps.append)
    assert backend.supported_clocks_mhz()[-1] == 1980 and sleeps == [0.25, 0.5]
    backend.close()
    fake.fail("nvmlDeviceGetHandleByIndex", fp.NVML_ERROR_TIMEOUT, times=None)
    with pytest.raises(TransientGpuError):
        open_backend(0, nvml=fake, sleep=sleeps.append)
    assert fake.initialized == 0


def test_a_stop_ends_the_start_retries_during_their_wait() -> None:
    """The wait between two attempts wakes on the stop, and no attempt follows it."""
    import threading

    fake = FakeNvml(1)
    fake.fail("nvmlDeviceGetHandleByIndex", fp.NVML_ERROR_TIMEOUT, times=None)
    stop = threading.Event()

    class StopOnWait(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            stop.set()  # the signal arrives while the first wait runs
            return stop.wait(timeout)

        def is_set(self) -> bool:
            return stop.is_set()

    with pytest.raises(TransientGpuError):
        open_backend(0, nvml=fake, stop=StopOnWait())
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 1
    assert fake.initialized == 0  # nothing left open


# ------------------------------------------------------- item 10: config gaps
def _domain(**kw: Any) -> dict[str, Any]:
    return {"name": "d", "gpus": [0], **kw}


@pytest.mark.parametrize(
    ("domain", "daemon", "needle"),
    [
        (_domain(engine={"url": "http://127.0.0.1:99999/metrics"}), {}, "port outside"),
        (_domain(engine={"url": "http:///metrics"}), {}, "must name a host"),
        (
            _domain(controller={"kind": "reactive", "up_fraction": 0.4, "down_fraction": 0.6}),
            {},
            "down_fraction (0.6) must not exceed up_fraction (0.4)",
        ),
        (_domain(stale_after_s=0.5), {"period_s": 1.0}, "stale_after_s (0.5 s) must be at least"),
        # A horizon of a million periods allocated its plan until the node ran out of memory.
        (
            _domain(controller={"kind": "mpc-online", "horizon_s": 1e6}),
            {"period_s": 1.0},
            "controller.horizon_s (1e+06 s) must span at most 120 control periods",
        ),
        # One line each: NaN read as "should be <= 60", and a negative period added an
        # error about the engine timeout the file never set.
        (_domain(), {"period_s": float("nan")}, "daemon.period_s: Input should be a finite"),
        (_domain(), {"period_s": -1.0}, "daemon.period_s: Input should be greater than"),
        # An empty record read as the working directory: "--record .".
        (_domain(), {"record": ""}, "daemon.record: must name a file"),
        # The config takes what the flags take: ten years, 100,000 MHz.
        (_domain(safety={"dwell_s": 1e300}), {}, "less than or equal to 315360000"),
        (_domain(controller={"kind": "fixed", "clock_mhz": 1e12}), {}, "less than or equal"),
        (
            _domain(controller={"kind": "mpc", "horizon_s": 31.0}),
            {"period_s": 0.25},
            "controller.horizon_s (31 s) must span at most 120 control periods (30 s",
        ),
    ],
)
def test_config_gaps_are_refused(
    domain: dict[str, Any], daemon: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"daemon": daemon, "domains": [domain]}, "g.toml")
    assert needle in str(caught.value) and str(caught.value).startswith("g.toml: ")
    assert len(str(caught.value).splitlines()) == 1


def test_floor_above_the_top_clock_is_refused_at_start(metrics_server: MetricsServer) -> None:
    fake = FakeNvml(1)
    config = parse_config(
        {"domains": [_domain(engine={"url": metrics_server.url}, safety={"floor_mhz": 2500.0})]}
    )
    with pytest.raises(ConfigError, match=r"safety.floor_mhz \(2500 MHz\) is above .*1980"):
        domains_from_config(config, nvml=fake)
    assert fake.initialized == 0


# ------------------------------------------------ item 11: exporter connections
def test_idle_connections_do_not_hold_threads_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpugov.daemon.metrics_server as server_module

    monkeypatch.setattr(server_module.QuietHandler, "timeout", 0.5)
    exporter = Exporter(port=0)
    idle = []
    try:
        before = threading.active_count()
        for _ in range(40):  # more than MAX_CONNECTIONS, none sends a request
            idle.append(socket.create_connection(("127.0.0.1", exporter.port), timeout=5))
        time.sleep(0.2)
        assert threading.active_count() - before <= server_module.MAX_CONNECTIONS
        deadline = time.monotonic() + 10
        while True:  # the idle ones time out; a scrape is served again
            try:
                with urllib.request.urlopen(exporter.url, timeout=2) as response:
                    assert b"gpugov_build_info" in response.read()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        # The last idle ones were accepted just before the scrape; each ends 0.5 s after.
        assert eventually(lambda: threading.active_count() - before <= 1)
    finally:
        for sock in idle:
            sock.close()
        exporter.close()


def _scrape_time(url: str) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=5) as response:
        assert b"gpugov_build_info" in response.read()
    return time.monotonic() - started


def test_clients_trickling_their_headers_neither_starve_a_scrape_nor_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """40 clients (more than MAX_CONNECTIONS) each send a request line, then a header
    line now and then, never the blank line: each read is within the idle timeout, so
    that timeout never fires. A real scrape is still served at once (it takes the slot of
    the oldest client still sending its request), and the request deadline closes every
    trickling client, however often it sends."""
    import gpugov.daemon.metrics_server as server_module

    monkeypatch.setattr(server_module.BoundedServer, "request_deadline_s", 1.5)
    exporter = Exporter(port=0)
    slow: list[socket.socket] = []
    try:
        for _ in range(40):
            client = socket.create_connection(("127.0.0.1", exporter.port), timeout=5)
            client.sendall(b"GET /metrics HTTP/1.1\r\n")
            slow.append(client)
        time.sleep(0.2)
        assert _scrape_time(exporter.url) < 2.0
        closed: set[int] = set()
        # Each is closed 1.5 s after it was accepted (those past MAX_CONNECTIONS once a
        # slot freed): the loop ends when every one is; the deadline bounds a regression.
        deadline = time.monotonic() + 30.0
        while len(closed) < len(slow) and time.monotonic() < deadline:
            for index, client in enumerate(slow):  # each trickles one more header line
                if index in closed:
                    continue
                try:
                    client.sendall(b"X-Slow: 1\r\n")
                    client.setblocking(False)
                    if client.recv(1) == b"":
                        closed.add(index)
                except BlockingIOError:
                    pass
                except OSError:
                    closed.add(index)
                finally:
                    client.setblocking(True)
            time.sleep(0.1)
        assert len(closed) == len(slow)  # none outlived the deadline
        assert _scrape_time(exporter.url) < 2.0
    finally:
        for client in slow:
            client.close()
        exporter.close()


# ------------------------------------------------------ item 8: bounded history
def test_mpc_history_is_bounded_in_the_daemon() -> None:
    from gpugov.controllers.mpc.controller import MPCController
    from gpugov.plant import ServingPlant, load_profile
    from gpugov.plant.types import ServingObservation

    plant = ServingPlant.from_profile(load_profile("h100-sxm-llama3-8b"))
    controller = MPCController(plant, horizon_s=2.0, control_period_s=1.0)
    controller.history_limit = 5
    clocks = tuple(float(c) for c in plant.profile.clock_mhz)
    for step in range(30):
        controller(
            ServingObservation(
                time_s=float(step),
                step_index=step,
                arrived_requests=step,
                prefill_remaining_tokens=0.0,
                decode_active=0,
                generated_decode_tokens=0.0,
                temperature_c=50.0,
                supported_clocks_mhz=clocks,
            )
        )
    assert len(controller.plans_by_step) == 5 and min(controller.plans_by_step) == 25
    assert len(controller.plan_start_times_by_step) == 5
    assert len(controller.solve_times) <= 10


def test_a_second_daemon_on_the_same_state_directory_is_refused(tmp_path: Path) -> None:
    # Two daemons on one state directory: the second read the first one's live lock as a
    # crash's leftover, reset it, and the two fought for the clock every tick.
    domain = {"name": "llm", "gpus": [0], "engine": {"url": "http://127.0.0.1:9/metrics"}}
    config = parse_config(
        {"daemon": {"period_s": 1.0, "state_dir": str(tmp_path)}, "domains": [domain]}
    )
    fake = FakeNvml(1)
    first = domains_from_config(config, nvml=fake)
    with pytest.raises(ConfigError, match=rf"another gpugov run \(pid {os.getpid()}\)"):
        domains_from_config(config, nvml=fake)
    assert fake.calls.get("nvmlDeviceSetGpuLockedClocks", 0) == 0  # nothing was touched
    # A dry run writes no locks and holds nothing: it may watch beside a running daemon.
    domains_from_config(config, nvml=fake, dry_run=True).close()
    first.close()
    second = LockState(tmp_path)
    second.hold()  # the holder's handle is gone with its LockState: free again


def test_a_second_daemon_keeping_a_domain_of_the_same_name_in_one_model_directory_is_refused(
    tmp_path: Path,
) -> None:
    """Two daemons, each with its own ``daemon.state_dir``, whose ``mpc-online`` keeps
    its model in one ``controller.state_dir`` (the example config's line copied into
    both) under one domain name: nothing held the model, so the second set the first
    one's aside as another node's and the two then overwrote each other's
    ``online-model-<domain>.json`` at every save. The second is refused before any GPU is
    touched, naming the field, the directory, the domain and the holder; domains of other
    names may share the directory."""
    shared = tmp_path / "models"

    def config(state: str, **domains: int) -> Any:
        specs = [
            {
                "name": name,
                "gpus": [gpu],
                "engine": {"url": "http://127.0.0.1:9/metrics"},
                "controller": {"kind": "mpc-online", "state_dir": str(shared)},
            }
            for name, gpu in domains.items()
        ]
        daemon = {"period_s": 0.25, "state_dir": str(tmp_path / state)}
        return parse_config({"daemon": daemon, "domains": specs})

    fake = FakeNvml(3)
    first = domains_from_config(config("a", llm=0, other=1), nvml=fake)
    try:
        with pytest.raises(ConfigError) as held:
            domains_from_config(config("b", llm=2), nvml=fake)
        assert str(held.value) == (
            f"domains[0].controller.state_dir {shared}: another gpugov run (pid "
            f"{os.getpid()}) keeps domain 'llm''s learned model here; give each daemon its "
            "own state_dir (or its domains other names)"
        )
        assert fake.calls.get("nvmlDeviceSetGpuLockedClocks", 0) == 0  # nothing was touched
        # The refused start lets its own directory go, on a worker thread the close waits
        # for at most a write's deadline (under load it may finish after the raise).
        deadline = time.monotonic() + 60.0
        while True:
            try:
                LockState(tmp_path / "b").hold()
                break
            except StateDirectoryHeld:
                assert time.monotonic() < deadline, "the refused start kept its directory"
                time.sleep(0.05)
        # A domain of another name may keep its model there too.
        domains_from_config(config("c", third=2), nvml=fake).close()
        # A dry run saves no model and holds nothing: it may watch beside a running one.
        domains_from_config(config("d", llm=2), nvml=fake, dry_run=True).close()
    finally:
        first.close()
    domains_from_config(config("b", llm=2), nvml=fake).close()  # let go with the first


def test_a_model_hold_that_hangs_never_holds_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The learned model's hold on a hung disk or mount: the start waits for it at most
    MODEL_HOLD_WAIT_S and goes on, with one warning (the model's reads and saves are
    bounded too)."""
    import gpugov.daemon.service as service

    release = threading.Event()

    def hangs(directory: Path, domain: str, name: str) -> None:
        release.wait(10.0)

    monkeypatch.setattr(service, "hold_model_file", hangs)
    monkeypatch.setattr(service, "MODEL_HOLD_WAIT_S", 0.1)
    domain = {
        "name": "llm",
        "gpus": [0],
        "engine": {"url": "http://127.0.0.1:9/metrics"},
        "controller": {"kind": "mpc-online", "state_dir": str(tmp_path / "models")},
    }
    config = parse_config(
        {"daemon": {"period_s": 0.25, "state_dir": str(tmp_path / "s")}, "domains": [domain]}
    )
    try:
        with caplog.at_level(logging.WARNING, logger="gpugov.daemon.service"):
            domains_from_config(config, nvml=FakeNvml(1)).close()
    finally:
        release.set()
    (line,) = [r.getMessage() for r in caplog.records if "could not be held" in r.getMessage()]
    assert line.startswith("domains[0].controller.state_dir ") and "'llm'" in line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_hold_file_that_cannot_take_the_pid_still_starts_the_daemon(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A full disk under the state directory (here its hold file a link to /dev/full, where
    # every write fails): the pid's write ended the start in an OSError traceback, where
    # a full disk only keeps the lock record out of date.
    (tmp_path / "gpugov.lock").symlink_to("/dev/full")
    domain = {"name": "llm", "gpus": [0], "engine": {"url": "http://127.0.0.1:9/metrics"}}
    config = parse_config(
        {"daemon": {"period_s": 1.0, "state_dir": str(tmp_path)}, "domains": [domain]}
    )
    fake = FakeNvml(1)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        assembled = domains_from_config(config, nvml=fake)
    try:
        (line,) = [
            r.getMessage() for r in caplog.records if "cannot write its pid" in r.getMessage()
        ]
        assert "holds the state directory" in line
        # Held all the same: a second run is refused, naming no pid (the device reads
        # back NUL bytes, not the holder's pid).
        with pytest.raises(ConfigError, match=r"another gpugov run \(pid unknown\)"):
            LockState(tmp_path).hold()
    finally:
        assembled.close()


def test_a_state_directory_without_file_locks_is_not_taken_as_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A state directory on a filesystem that takes no flock (NFS without its lock
    daemon: ENOLCK) was refused as held by another run, named by the pid a previous run
    left in the hold file: every start exited 2, which the units do not restart. Only a
    lock someone holds is a holder; the directory is then not held, with one warning."""
    import errno
    import fcntl

    (tmp_path / "gpugov.lock").write_text("4242\n")  # a previous run's, long gone

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    domain = {"name": "llm", "gpus": [0], "engine": {"url": "http://127.0.0.1:9/metrics"}}
    config = parse_config(
        {"daemon": {"period_s": 1.0, "state_dir": str(tmp_path)}, "domains": [domain]}
    )
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        domains_from_config(config, nvml=FakeNvml(1)).close()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "cannot hold the state directory" in line and "No locks available" in line


def test_a_damaged_hold_file_names_no_pid_and_raises_no_traceback(tmp_path: Path) -> None:
    """A hold file of bytes that are no pid (not UTF-8) while another run holds it: the
    refusal read it as text and ended in a UnicodeDecodeError traceback."""
    import fcntl

    path = tmp_path / "gpugov.lock"
    path.write_bytes(b"\xff\xfe12")
    with open(path, "rb") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match=r"another gpugov run \(pid unknown\)"):
            LockState(tmp_path).hold()


def test_a_state_directory_deleted_under_the_daemon_is_held_and_recorded_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The state directory deleted while the daemon runs: its hold (a flock on a file
    now gone) kept no second daemon out, and the lock record was gone until the next
    clock change, silently. The next tick's retry takes the directory again and writes
    the record again, in one WARNING."""
    import shutil

    from gpugov.daemon.errors import ConfigError

    directory = tmp_path / "state"
    fake = FakeNvml(1)
    state = LockState(directory)
    state.hold()
    ClockActuator([NvmlBackend(0, nvml=fake)], state=state).apply(900)
    assert state.retry()  # nothing removed: nothing to do, nothing said
    shutil.rmtree(directory)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        assert state.retry()
        assert state.retry()
    (line,) = [r.getMessage() for r in caplog.records if "removed under" in r.getMessage()]
    assert "held again, and the lock record written again" in line
    entry = LockState(directory).read()["GPU-fake-0000"]
    assert (entry["min_mhz"], entry["max_mhz"], entry["pid"]) == (900, 900, os.getpid())
    with pytest.raises(ConfigError, match="another gpugov run"):
        LockState(directory).hold()
    state.release()


def test_a_lock_record_linked_in_a_loop_is_warned_about_and_the_daemon_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock record a symbolic link loop: its first write raised RuntimeError through
    the lock, and ``gpugov run`` ended in a traceback (exit 1). It is a record that
    cannot be written now: one WARNING naming it, and the lock holds."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "locks.json").symlink_to(tmp_path / "a")
    fake = FakeNvml(1)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(tmp_path)).apply(900)
    assert fake.locked(0) == (900, 900)
    (line,) = [r.getMessage() for r in caplog.records if "cannot write it" in r.getMessage()]
    assert str(tmp_path / "locks.json") in line and "symbolic links" in line


def test_a_lock_record_that_is_no_record_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "locks.json").write_text('["garbage"]')
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        assert LockState(tmp_path).read() == {}
    assert any("not a lock record" in record.getMessage() for record in caplog.records)


def test_a_lock_record_naming_a_key_twice_is_still_read(tmp_path: Path) -> None:
    """The lock record is a safety record: a GPU it names as locked is restored even
    from a damaged one, so a key given twice is read (the last value), where every other
    JSON input refuses it."""
    first = ClockActuator([NvmlBackend(0, nvml=FakeNvml(1))], state=LockState(tmp_path, pid=1))
    first.apply(1200)
    path = tmp_path / "locks.json"
    text = path.read_text()
    assert text.startswith("{")
    path.write_text('{"gpus": {},' + text[1:])  # "gpus" twice: the real entries last
    assert set(LockState(tmp_path).read()) == {"GPU-fake-0000"}


def test_a_lock_record_write_a_killed_run_left_is_removed_when_the_directory_is_held(
    tmp_path: Path,
) -> None:
    """A run killed between the lock record's temporary file and its rename left
    ``.locks.json.<8 hex>`` behind for good; the next run removes it once it holds the
    directory, and leaves the record itself."""
    state = LockState(tmp_path, pid=1)
    state.record("GPU-x", "0", 900, 900)
    left = tmp_path / ".locks.json.deadbeef"
    left.write_text('{"version": 1, "gp')
    held = LockState(tmp_path)
    held.hold()
    try:
        assert not left.exists()
        assert set(held.read()) == {"GPU-x"}
    finally:
        held.release()
