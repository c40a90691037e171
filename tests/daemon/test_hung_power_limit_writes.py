"""A power limit write that hangs inside NVML (a driver in trouble): on a node each GPU's
power limit calls run on a worker thread of their own (:class:`daemon.deadline.SerialCalls`),
one at a time in the order made, and the loop waits for one at most the write deadline. A
write past it is a failed write (counted, one log line), no other power limit call to that
GPU starts while it hangs, the loop goes on governing every other GPU, and once the call
returns its outcome is taken and the limit wanted then is written after it. The lock state
file keeps the original limit and both limits the GPU may hold, so a restart's reconcile
restores it; at exit a restore that hangs is bounded too, and the GPU is reported as
possibly still capped (exit 6), its entry kept.

A hung write is an NVML setter blocked on a :class:`threading.Event`. Every check is of what
happened, never of wall time: a call that should not wait must return while the write is
still hung (a safety timer frees it after :data:`JOIN_S`, so a regression fails instead of
hanging the suite)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from daemon_support import MetricsServer, eventually, run_ticks
from fake_pynvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_TIMEOUT,
    FakeNvml,
    NVMLError,
)
from hung_support import DEADLINE_S, HungCall, two_domains

import gpugov.daemon.service as service
from gpugov.daemon.errors import ClocksNotReset, GpuLost
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.power_limit import PowerLimitActuator
from gpugov.daemon.service import domains_from_config

SET = "nvmlDeviceSetPowerManagementLimit"
READ = "nvmlDeviceGetPowerManagementLimit"
KEY = "GPU-fake-0000"
"""GPU 0's key in the lock state file."""
DEAD_PID = 999_999_999
"""The pid of a run that died: its record is a crash's leftover to the next start."""


def _writes(fake: FakeNvml, index: int) -> list[int]:
    """The power limits (mW) written to GPU ``index`` that went through, in order."""
    return [w[2] for w in fake.writes if w[0] == SET and w[1] == index]


def _recorded(state: LockState) -> dict[str, dict[str, Any]]:
    """The power limit entries the state file on disk holds, by GPU label, without the
    writer's stamp (what the next start reconciles)."""
    state.flush()
    data = json.loads((state.path).read_text())
    return {
        entry["gpu"]: {k: v for k, v in entry.items() if k.endswith("_mw")}
        for entry in data.get("power_limits", {}).values()
    }


def _actuator(fake: FakeNvml, state: LockState | None = None, **options: Any) -> PowerLimitActuator:
    backends = [NvmlBackend(i, nvml=fake) for i in range(len(fake.gpus))]
    return PowerLimitActuator(
        backends, domain="llm", state=state, write_deadline_s=DEADLINE_S, **options
    )


# ------------------------------------------------------------------ the actuator
def test_a_hung_write_starts_no_other_call_and_the_wanted_limit_follows_it_in_order(
    safety: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hung write is a lowering (from GPU 0's own 700 W to 300 W): while it hangs
    nothing else is called on that GPU and the lock state file keeps its original; once it
    returns (it went through: the GPU is at 300 W), the limit wanted now (250 W) is written
    after it, never before."""
    fake = FakeNvml(2)
    hung = HungCall(fake, SET)
    safety.append(hung)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state)
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.power_limit")
    assert actuator.apply(600.0) == 1  # GPU 1's write; GPU 0's ran past the deadline
    assert hung.blocked.is_set() and hung.hung
    assert fake.gpus[1].power_limit_mw == 300_000 and actuator.held_w["1"] == 300.0
    assert actuator.write_failures == {"0": 1, "1": 0}
    assert actuator.hanging_writes == ("0",)
    assert _recorded(state) == {  # a kill now: the next start restores 700 W
        "0": {"original_mw": 700_000, "set_mw": 300_000},
        "1": {"original_mw": 700_000, "set_mw": 300_000},
    }
    # Each call while it hangs: no call to GPU 0 started, one more failure.
    assert [actuator.apply(500.0) for _ in range(5)] == [1, 0, 0, 0, 0]
    assert fake.gpus[1].power_limit_mw == 250_000
    assert hung.calls == 1 and actuator.write_failures["0"] == 6
    readers = [NvmlBackend(i, nvml=fake) for i in range(2)]
    budget_w = actuator.outside_limit_w([reader.sample() for reader in readers])
    assert budget_w == 1400.0  # the budget's nvml source: neither limit of gpugov's
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "domain llm: GPU 0: power limit write of 300 W: no answer within 0.2 s (a hung GPU "
        "call); nothing more is written to this GPU's power limit until that call returns, "
        "then the limit wanted then is (while it fails, one line a minute)"
    ]
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert fake.gpus[0].power_limit_mw == 300_000  # the late lowering went through
    assert actuator.outside_limit_w([reader.sample() for reader in readers]) == 1400.0
    assert actuator.apply(500.0) == 1  # its outcome taken, then the wanted limit written
    assert _writes(fake, 0) == [300_000, 250_000]
    assert fake.gpus[0].power_limit_mw == 250_000 and actuator.held_w["0"] == 250.0
    assert actuator.write_failures["0"] == 6
    assert "power limit writes succeed again after 6 failure(s)" in caplog.records[-1].getMessage()
    assert actuator.restore() == []
    assert [gpu.power_limit_mw for gpu in fake.gpus] == [700_000, 700_000]
    assert _recorded(state) == {}


def test_a_hung_write_that_fails_is_written_again(safety: list[Any]) -> None:
    fake = FakeNvml(1)
    hung = HungCall(fake, SET)
    hung.error = NVMLError(NVML_ERROR_TIMEOUT)
    safety.append(hung)
    actuator = _actuator(fake)
    assert actuator.apply(300.0) == 0
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.apply(300.0) == 1  # the same limit: it did not land, so written
    assert hung.calls == 2 and fake.gpus[0].power_limit_mw == 300_000
    assert actuator.held_w["0"] == 300.0 and actuator.write_failures["0"] == 1


def test_a_hung_write_that_returns_gpu_lost_stops_the_run_as_any_lost_gpu(
    safety: list[Any],
) -> None:
    fake = FakeNvml(1)
    hung = HungCall(fake, SET)
    hung.error = NVMLError(NVML_ERROR_GPU_IS_LOST)
    safety.append(hung)
    actuator = _actuator(fake)
    actuator.apply(300.0)
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    with pytest.raises(GpuLost):
        actuator.apply(250.0)
    assert hung.calls == 1


def test_a_hung_first_write_that_returns_refused_ends_the_cap_with_nothing_to_restore(
    safety: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(1)
    hung = HungCall(fake, SET)
    hung.error = NVMLError(NVML_ERROR_NO_PERMISSION)
    safety.append(hung)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state)
    actuator.apply(300.0)
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    caplog.set_level(logging.ERROR, logger="gpugov.daemon.power_limit")
    assert actuator.apply(250.0) == 0
    assert actuator.refused is not None and "CAP_SYS_ADMIN" in caplog.text
    assert hung.calls == 1 and _recorded(state) == {}
    assert actuator.restore() == []  # nothing of gpugov's was written
    assert hung.calls == 1


def test_the_fail_safe_s_restore_waits_for_a_hung_lowering_and_follows_it(
    safety: list[Any],
) -> None:
    """The domain falls back (the controller asks for the GPUs' own limits) while its
    lowering hangs: no restore starts behind it (it could land before the lowering); once
    the lowering has landed, the restore is written after it."""
    fake = FakeNvml(1)
    hung = HungCall(fake, SET)
    safety.append(hung)
    actuator = _actuator(fake)
    actuator.apply(300.0)
    assert [actuator.apply(None) for _ in range(3)] == [0, 0, 0]
    assert hung.calls == 1 and actuator.write_failures["0"] == 4
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.apply(None) == 1
    assert _writes(fake, 0) == [300_000, 700_000]
    assert actuator.applied_w is None and actuator.restore() == []


def test_a_hung_restore_of_the_fail_safe_is_bounded_and_taken_when_it_returns(
    safety: list[Any], tmp_path: Path
) -> None:
    fake = FakeNvml(1)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state)
    actuator.apply(300.0)
    hung = HungCall(fake, SET)
    safety.append(hung)
    assert actuator.apply(None) == 0  # the restore hangs
    assert actuator.apply(None) == 0 and hung.calls == 1
    assert _recorded(state) == {"0": {"original_mw": 700_000, "set_mw": 300_000}}
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.apply(None) == 0  # the late restore went through: nothing left to write
    assert fake.gpus[0].power_limit_mw == 700_000 and actuator.applied_w is None
    assert _recorded(state) == {}
    assert actuator.apply(300.0) == 1 and fake.gpus[0].power_limit_mw == 300_000


def test_a_restore_that_hangs_at_exit_is_bounded_and_reported_with_its_entry_kept(
    safety: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(2)
    state = LockState(tmp_path)
    slept: list[float] = []
    actuator = _actuator(fake, state, sleep=slept.append)
    actuator.apply(600.0)
    hung = HungCall(fake, SET)
    safety.append(hung)
    caplog.set_level(logging.ERROR, logger="gpugov.daemon.power_limit")
    assert actuator.restore() == ["0"]  # returned while the restore still hangs
    assert hung.hung and hung.calls == 1  # one restore started, not retried
    assert [gpu.power_limit_mw for gpu in fake.gpus] == [300_000, 700_000]
    assert slept == []  # no backoff: a retry could not start while it hangs
    assert _recorded(state) == {"0": {"original_mw": 700_000, "set_mw": 300_000}}
    assert [r.getMessage() for r in caplog.records] == [
        "domain llm: power limit restore failed: GPU 0: power limit restore to 700 W: no "
        "answer within 0.2 s (a hung GPU call); not retried"
    ]


def test_a_restore_at_exit_waits_for_no_write_still_hanging_from_the_loop(
    safety: list[Any], tmp_path: Path
) -> None:
    fake = FakeNvml(1)
    hung = HungCall(fake, SET)
    safety.append(hung)
    state = LockState(tmp_path)
    slept: list[float] = []
    actuator = _actuator(fake, state, sleep=slept.append)
    actuator.apply(300.0)
    reads = HungCall(fake, READ)  # counts the reads; none hangs (it is released)
    reads.release.set()
    assert actuator.restore() == ["0"]
    assert reads.calls == 0 and hung.calls == 1  # no read nor restore behind the hung write
    assert slept == [] and _recorded(state) == {"0": {"original_mw": 700_000, "set_mw": 300_000}}


def test_a_hung_read_of_the_limit_costs_one_deadline_and_is_a_failed_read(
    safety: list[Any],
) -> None:
    fake = FakeNvml(2)
    hung = HungCall(fake, READ)
    safety.append(hung)
    actuator = _actuator(fake)
    assert actuator.apply(600.0) == 1  # GPU 0's original is not known: no write to it
    assert [actuator.apply(600.0) for _ in range(3)] == [0, 0, 0]
    assert hung.calls == 1 and actuator.write_failures["0"] == 4
    assert _writes(fake, 0) == []
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.apply(600.0) == 1 and fake.gpus[0].power_limit_mw == 300_000


# ------------------------------------------------------------------ reconcile
def test_a_restart_restores_the_original_whichever_limit_a_hung_write_left(
    safety: list[Any], tmp_path: Path
) -> None:
    """A run held 300 W on GPU 0, its lowering to 250 W hung, and it was killed: the GPU
    holds 300 W (the write never landed) or 250 W (it did). Either way the next start
    restores the GPU's own 700 W; before, a GPU left at 300 W was taken for a limit someone
    else set, and stayed capped."""
    fake = FakeNvml(1)
    killed = _actuator(fake, LockState(tmp_path, pid=DEAD_PID))
    killed.apply(300.0)
    hung = HungCall(fake, SET)
    safety.append(hung)
    killed.apply(250.0)  # hangs; the run is killed here
    assert _recorded(LockState(tmp_path)) == {
        "0": {"original_mw": 700_000, "set_mw": 250_000, "held_mw": 300_000}
    }
    hung.armed = False  # the driver answers the next run
    assert fake.gpus[0].power_limit_mw == 300_000
    restarted = _actuator(fake, LockState(tmp_path))
    (line,) = restarted.reconcile()
    assert line.endswith("set its power limit to 250 W (now 300 W), 700 W before; restored")
    assert fake.gpus[0].power_limit_mw == 700_000
    assert "power_limits" not in json.loads((tmp_path / "locks.json").read_text())


def test_a_restore_at_start_that_hangs_is_reported_and_tried_again_at_exit(
    safety: list[Any], tmp_path: Path
) -> None:
    fake = FakeNvml(1)
    _actuator(fake, LockState(tmp_path, pid=DEAD_PID)).apply(300.0)  # a run that was killed
    hung = HungCall(fake, SET)
    safety.append(hung)
    state = LockState(tmp_path)
    actuator = _actuator(fake, state, sleep=lambda s: None)
    (line,) = actuator.reconcile()
    assert line.endswith(
        "restore FAILED: GPU 0: power limit restore to 700 W: no answer within 0.2 s (a hung "
        "GPU call)"
    )
    assert actuator.restore() == ["0"] and hung.calls == 1  # still hanging: reported
    assert _recorded(state) == {"0": {"original_mw": 700_000, "set_mw": 300_000}}
    hung.release.set()
    assert eventually(lambda: not actuator.hanging_writes)
    assert actuator.restore() == [] and fake.gpus[0].power_limit_mw == 700_000
    assert _recorded(state) == {}


# ------------------------------------------------------------------ the loop
def _two_domains(server: MetricsServer) -> Any:
    return two_domains(server, {"kind": "power-cap", "cap_w": 400.0})


def test_a_hung_power_limit_write_costs_one_deadline_and_every_other_domain_goes_on(
    safety: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Domain a's first cap (GPU 0, a lowering from its own 700 W to 400 W) hangs in the
    driver. Every tick still runs; domain b caps and restores on (its fail-safe while the
    engine is down, its cap once it is back), the exporter updates, no second call to GPU
    0 starts while the first hangs, and once it returns the limit domain a wants then (its
    own, in the fail-safe) is written after it: the late lowering never lands after the
    restore. Before, the loop waited on it until the watchdog killed the daemon."""
    monkeypatch.setattr(service, "POWER_LIMIT_WRITE_DEADLINE_S", DEADLINE_S)
    fake = FakeNvml(2)
    hung = HungCall(fake, SET)
    safety.append(hung)
    assembled = domains_from_config(_two_domains(metrics_server), nvml=fake)
    limits = assembled.domains[0].power_limits
    assert limits is not None
    exporter = Exporter(serve=False)
    seen: list[tuple[Any, ...]] = []

    def on_step(step: int, records: Any) -> None:
        get = exporter.registry.get_sample_value
        seen.append(
            (
                hung.hung,
                hung.calls,
                fake.gpus[1].power_limit_mw,
                get("gpugov_loop_ticks_total"),
                get("gpugov_power_cap_write_failures_total", {"domain": "a", "gpu": "0"}),
            )
        )
        if step == 0:
            metrics_server.down = True  # both engines go quiet: both domains' fail-safe
        if step == 5:
            hung.release.set()  # the driver answers: the lowering to 400 W lands now
            assert eventually(lambda: not limits.hanging_writes)
            assert fake.gpus[0].power_limit_mw == 400_000
        if step == 6:
            metrics_server.down = False

    caplog.set_level(logging.WARNING, logger="gpugov.daemon.power_limit")
    try:
        _, stats = run_ticks(assembled.domains, 9, on_step=on_step, exporter=exporter)
    finally:
        assembled.close()
    assert stats.ticks == 9  # every tick ran; ticks 0 to 5 with GPU 0's write hung
    assert [hung_now for hung_now, *_ in seen] == [True] * 6 + [False] * 3
    assert [calls for _, calls, *_ in seen[:6]] == [1] * 6  # one call started while hung
    assert [ticks for *_, ticks, _ in seen] == [float(n) for n in range(1, 10)]
    failures = [failed for *_, failed in seen]
    assert failures[0] == 1.0 and failures[5] > failures[0]  # the hang, each tick it held
    # Domain b capped, restored in its fail-safe, capped again, restored at exit.
    capped_again = [400_000, 700_000, 400_000, 700_000]
    assert _writes(fake, 1) == capped_again
    assert [limit for _, _, limit, *_ in seen][3:5] == [700_000] * 2
    # GPU 0: the hung lowering, the restore wanted when it returned, the cap, the exit's.
    assert _writes(fake, 0) == capped_again
    hang_lines = [r.getMessage() for r in caplog.records if "a hung GPU call" in r.getMessage()]
    assert hang_lines == [
        "domain a: GPU 0: power limit write of 400 W: no answer within 0.2 s (a hung GPU "
        "call); nothing more is written to this GPU's power limit until that call returns, "
        "then the limit wanted then is (while it fails, one line a minute)"
    ]
    assert [gpu.power_limit_mw for gpu in fake.gpus] == [700_000, 700_000]


def test_a_restore_that_hangs_at_the_loop_s_exit_ends_the_run_naming_the_gpu(
    safety: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
) -> None:
    """The exit's restore of GPU 1 hangs: the run ends at once after its deadline (no
    retries, no backoff) with exit 6's error naming GPU 1 and its own limit, GPU 0
    restored; and closing the node leaves NVML open while the call hangs, then closes it
    once it has returned."""
    monkeypatch.setattr(service, "POWER_LIMIT_WRITE_DEADLINE_S", DEADLINE_S)
    fake = FakeNvml(2)
    assembled = domains_from_config(_two_domains(metrics_server), nvml=fake)
    opened = fake.initialized
    hung: list[HungCall] = []

    def on_step(step: int, records: Any) -> None:
        if step == 1:  # the driver hangs GPU 1's power limit writes from now on
            hung.append(HungCall(fake, SET, index=1))
            safety.append(hung[0])

    with pytest.raises(ClocksNotReset, match=r"power limit of GPU\(s\) 1; .*GPU 1: 700 W"):
        run_ticks(assembled.domains, 2, on_step=on_step)
    assert hung[0].hung and hung[0].calls == 1
    assert [gpu.power_limit_mw for gpu in fake.gpus] == [700_000, 400_000]
    assert fake.locked(1) is None  # the clocks were reset all the same
    assembled.close()
    assert fake.initialized == opened  # left open: the restore still hangs
    power_limits = assembled.domains[1].power_limits
    assert power_limits is not None
    hung[0].release.set()
    assert eventually(lambda: not power_limits.hanging_writes)
    assembled.close()
    assert fake.initialized == 0
