"""The exit's one budget for restoring the GPUs (:class:`daemon.exit_restore.ExitBudget`):
every GPU's clock reset and power limit restore share it, each call is waited for at most
its deadline or what is left, and once it is spent the restores left are not started and
those GPUs are reported as possibly still locked or capped (exit 6), their lock records
kept, as a restore that hangs is. Before, each hung restore cost its own 2 s deadline,
and eight GPUs wedged at exit outlasted the unit's ``TimeoutStopSec=``.

Time is virtual: the driver's calls advance a test clock (a slow or wedged driver), so
no check depends on how long anything takes; a hung call is an NVML setter blocked on a
:class:`threading.Event` (:class:`hung_support.HungCall`), freed at the end of the test.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_support import MetricsServer, eventually, run_ticks
from fake_pynvml import NVML_ERROR_TIMEOUT, FakeNvml, NVMLError
from hung_support import DEADLINE_S, HungCall, two_domains

import gpugov.daemon.service as service
from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.errors import ClocksNotReset
from gpugov.daemon.exit_restore import EXIT_RESTORE_BUDGET_S, ExitBudget
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.power_limit import PowerLimitActuator
from gpugov.daemon.service import domains_from_config

RESET = "nvmlDeviceResetGpuLockedClocks"
SET = "nvmlDeviceSetPowerManagementLimit"


class _Clock:
    """Virtual monotonic seconds."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class _Slow:
    """An NVML call of ``fake`` that costs ``step_s`` of ``clock`` on every GPU (advanced
    as it starts), then runs the call beneath (a hung one too)."""

    def __init__(self, fake: FakeNvml, function: str, clock: _Clock, step_s: float) -> None:
        self.real = getattr(fake, function)
        self.clock = clock
        self.step_s = step_s
        self.gpus: list[int] = []
        """The GPUs it was called on, in order."""
        setattr(fake, function, self)

    def __call__(self, handle: Any, *args: Any) -> Any:
        self.gpus.append(handle.index)
        self.clock.now_s += self.step_s
        return self.real(handle, *args)


def _backends(fake: FakeNvml) -> list[NvmlBackend]:
    return [NvmlBackend(i, nvml=fake) for i in range(len(fake.gpus))]


def _records(state: LockState, gpus: int) -> tuple[list[str], list[str]]:
    """The GPUs the lock record still names for the next start: (locks, power limits)."""
    state.flush()
    locks = sorted(entry["gpu"] for entry in state.read().values())
    limits = [str(i) for i in range(gpus) if state.get_power_limit(f"GPU-fake-000{i}")]
    return locks, limits


def test_the_budget_is_below_the_units_stop_timeout() -> None:
    units = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
    for unit in sorted(units.glob("*.service")):
        (line,) = [x for x in unit.read_text().splitlines() if x.startswith("TimeoutStopSec=")]
        assert float(line.split("=")[1].rstrip("s")) > EXIT_RESTORE_BUDGET_S + 5.5, unit


def test_once_the_budget_is_spent_no_restore_starts_and_the_gpus_are_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver whose resets take 8 s each (on the caller's thread: no deadline bounds
    them): with 20 s, GPUs 0 to 2 are reset (the third starts with 4 s left), GPU 3's
    reset and every power limit restore are not started; each is reported and keeps its
    lock record for the next start."""
    clock = _Clock()
    fake = FakeNvml(4)
    state = LockState(tmp_path)
    clocks = ClockActuator(_backends(fake), domain="llm", state=state)
    limits = PowerLimitActuator(_backends(fake), domain="llm", state=state)
    clocks.apply(1005)
    limits.apply(1200.0)
    resets = _Slow(fake, RESET, clock, 8.0)
    sets = _Slow(fake, SET, clock, 0.0)
    budget = ExitBudget(20.0, clock=clock)
    caplog.set_level(logging.ERROR)
    assert clocks.restore(budget) == ["3"]
    assert limits.restore(budget) == ["0", "1", "2", "3"]
    assert resets.gpus == [0, 1, 2] and sets.gpus == []
    assert fake.locked(3) == (1005, 1005) and fake.locked(2) is None
    assert [gpu.power_limit_mw for gpu in fake.gpus] == [300_000] * 4
    assert _records(state, 4) == (["3"], ["0", "1", "2", "3"])  # for the next start
    spent = "not started: the exit's 20 s for restoring the GPUs is spent"
    assert [r.getMessage() for r in caplog.records] == [
        f"domain llm: GPU 3: reset {spent}",
        *(f"domain llm: GPU {gpu}: power limit restore {spent}" for gpu in range(4)),
    ]


def test_a_call_is_waited_for_at_most_what_is_left_and_no_backoff_outlasts_it() -> None:
    clock = _Clock()
    budget = ExitBudget(3.0, clock=clock)
    assert budget.wait_s(2.0) == 2.0 and budget.wait_s(None) is None
    clock.now_s = 2.5
    assert budget.wait_s(2.0) == 0.5 and not budget.spent
    clock.now_s = 3.0
    assert budget.spent and budget.left_s() == 0.0 and budget.wait_s(2.0) == 0.0


def test_a_failing_reset_is_retried_only_while_the_budget_lasts() -> None:
    """Each reset fails for now (retried with backoff) and the backoff's sleeps advance the
    clock: the sleep is cut to what is left, and no round starts after it."""
    clock = _Clock()
    fake = FakeNvml(1)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now_s += seconds

    actuator = ClockActuator(
        _backends(fake), domain="llm", reset_attempts=5, reset_backoff_s=1.0, sleep=sleep
    )
    actuator.apply(1005)

    def failing(handle: Any) -> None:
        raise NVMLError(NVML_ERROR_TIMEOUT)

    fake.nvmlDeviceResetGpuLockedClocks = failing  # type: ignore[method-assign]
    assert actuator.restore(ExitBudget(2.5, clock=clock)) == ["0"]
    assert slept == [1.0, 1.5]  # 1 s, then the 1.5 s left of 2 s; no third round's wait


def test_hung_resets_of_a_domain_start_together_within_the_budget(
    safety: list[Any], tmp_path: Path
) -> None:
    """Every GPU's reset wedges in the driver (each costing 8 s of the test's clock as it
    starts, and its 0.2 s deadline of real time). The domain's first resets start
    together, with 10 s left (one after another, GPU 2's was not started: the two before
    it had spent the budget); all three are reported, their records kept."""
    clock = _Clock()
    fake = FakeNvml(3)
    state = LockState(tmp_path)
    actuator = ClockActuator(
        _backends(fake), domain="llm", state=state, write_deadline_s=DEADLINE_S
    )
    actuator.apply(1005)
    for index in range(3):
        safety.append(HungCall(fake, RESET, index=index))
    resets = _Slow(fake, RESET, clock, 8.0)
    assert actuator.restore(ExitBudget(10.0, clock=clock)) == ["0", "1", "2"]
    assert eventually(lambda: sorted(resets.gpus) == [0, 1, 2])
    assert _records(state, 3) == (["0", "1", "2"], [])


def test_a_gpu_wedged_at_the_loop_s_exit_leaves_the_other_domain_s_gpu_reset(
    safety: list[Any], monkeypatch: pytest.MonkeyPatch, metrics_server: MetricsServer
) -> None:
    """At the loop's exit GPU 0's reset (domain a) wedges. One domain after another, its
    wait came first and could spend the budget, leaving domain b's GPU 1 not started and
    locked; every domain's resets now start before any is waited for: GPU 1 is reset,
    and exit 6's error names GPU 0 alone."""
    monkeypatch.setattr(service, "CLOCK_WRITE_DEADLINE_S", DEADLINE_S)
    clock = _Clock()
    fake = FakeNvml(2)
    assembled = domains_from_config(
        two_domains(metrics_server, {"kind": "fixed", "clock_mhz": 1410}), nvml=fake
    )

    def on_step(step: int, records: Any) -> None:
        if step == 1:  # the driver wedges GPU 0's resets from now on
            safety.append(HungCall(fake, RESET, index=0))

    try:
        # A wedged reset is never retried: the line claims no retries.
        with pytest.raises(ClocksNotReset, match=r"GPU\(s\) 0; they may still be locked"):
            run_ticks(
                assembled.domains,
                2,
                on_step=on_step,
                restore_budget=lambda: ExitBudget(10.0, clock=clock),
            )
    finally:
        safety[0].release.set()
        assembled.close()
    assert fake.locked(1) is None


class SlowClose:
    """A domain whose controller's close (``mpc-online``'s final save) takes ``seconds``
    on a disk that stopped answering at the stop."""

    def __init__(
        self, name: str, seconds: float, release: threading.Event, *, saves: bool = True
    ) -> None:
        self.name, self.seconds, self.release, self.saves = name, seconds, release, saves
        self.closed = False
        self.closed_on: threading.Thread | None = None

    def close_controller(self) -> None:
        self.release.wait(self.seconds)
        self.closed = True
        self.closed_on = threading.current_thread()


def test_the_controllers_close_together_within_one_final_save_wait(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each domain's final model save waits up to 5 s on a disk that hangs at the stop;
    one after another, eight domains took 40 s, past the units' TimeoutStopSec= (30 s).
    They close at once, waited for together; one still closing past that is named. A
    controller that saves no model (an outside one's code) closes on the exit's thread,
    as before."""
    import gpugov.daemon.loop as loop
    from gpugov.daemon.loop import close_controllers

    monkeypatch.setattr(loop, "_saves_a_model", lambda domain: domain.saves)
    release = threading.Event()
    outside = SlowClose("outside", 0.0, release, saves=False)
    assert close_controllers([outside, SlowClose("x", 0.0, release)]) == []  # type: ignore[list-item]
    assert outside.closed_on is threading.current_thread()
    domains = [SlowClose(f"d{index}", 0.4, release) for index in range(8)]
    started = time.monotonic()
    assert close_controllers(domains, wait_s=5.0) == []  # type: ignore[arg-type]
    assert time.monotonic() - started < 0.4 * 8 / 2
    assert all(domain.closed for domain in domains)
    hung = [SlowClose("a", 0.0, release), SlowClose("b", 30.0, threading.Event())]
    started = time.monotonic()
    assert close_controllers(hung, wait_s=0.3) == ["b"]  # type: ignore[arg-type]
    assert time.monotonic() - started < 2.0
    (line,) = [r.getMessage() for r in caplog.records if "closing the controller" in r.getMessage()]
    assert line.startswith("domain(s) b: ") and "\n" not in line
    hung[1].release.set()


def test_only_a_learned_model_s_close_counts_as_saving_one(tmp_path: Path) -> None:
    """The domains whose close waits on the disk: those whose chain keeps mpc-online's
    model in a state directory."""
    from types import SimpleNamespace

    from gpugov.controllers.online.controller import OnlineMPCController
    from gpugov.daemon.loop import _saves_a_model
    from gpugov.daemon.model_store import PersistentOnlineModel

    store = PersistentOnlineModel(OnlineMPCController(), tmp_path, "llm", ("GPU-a",))
    assert _saves_a_model(SimpleNamespace(controller=store))  # type: ignore[arg-type]
    assert not _saves_a_model(SimpleNamespace(controller=store.inner))  # type: ignore[arg-type]
