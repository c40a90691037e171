"""A file read while the loop runs whose read hangs (a stuck NFS or hostPath mount, where a
``stat`` blocks too): the power budget file, read every tick, and ``mpc-online``'s state
file, read at the first observation and again each save period while it cannot be read.
Each is read on a worker thread (:class:`daemon.deadline.LatestReader`): the caller goes
on after the read deadline with the last good value, the hang is counted and logged as a
file that cannot be read, no second read of the file starts while the first hangs, and
the late read's answer is taken once it comes.

A hung read is a read function blocked on a :class:`threading.Event`. Every check is of
what happened, never of wall time: a call that should not wait must return while the
read is still hung (a safety timer frees it after :data:`JOIN_S`, so a regression fails
instead of hanging the suite)."""

from __future__ import annotations

import copy
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from daemon_support import JOIN_S, MetricsServer, eventually, run_ticks
from fake_pynvml import FakeNvml
from synthetic import make_plant, poisson_requests

import gpugov.daemon.model_store as store
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.daemon import power_budget, stored_model
from gpugov.daemon.config import parse_config
from gpugov.daemon.deadline import LatestReader, ReadTimeout
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.model_store import PersistentOnlineModel
from gpugov.daemon.power_budget import BudgetFile
from gpugov.daemon.service import domains_from_config
from gpugov.daemon.stored_model import model_path
from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.input_files import InputFileError
from gpugov.plant.types import ServingObservation

DEADLINE_S = 0.2
"""The reads' deadline: short, yet far above a healthy read on a busy machine."""
GPUS = ("GPU-aaaa", "GPU-bbbb")


class _HungRead:
    """A read function that, while :attr:`armed`, blocks until :attr:`release` is set,
    then reads with ``real``."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.armed = True
        self.release = threading.Event()
        self.blocked = threading.Event()
        """Set once a read is blocked on the hung mount."""
        self.calls = 0
        """Reads started (each a thread's call)."""

    def __call__(self, *args: Any, **options: Any) -> Any:
        self.calls += 1
        if self.armed and not self.release.is_set():
            self.blocked.set()
            self.release.wait(JOIN_S)
        return self.real(*args, **options)

    def __deepcopy__(self, memo: dict[int, Any]) -> _HungRead:
        return self  # one mount, shared by a copy of its reader

    @property
    def hung(self) -> bool:
        return self.armed and not self.release.is_set()


# ------------------------------------------------------------------ the reader
def test_a_hung_read_costs_one_deadline_starts_no_other_and_its_answer_is_the_next(
    safety: list[_HungRead],
) -> None:
    answers = iter(["first", "late", "fresh"])
    hung = _HungRead(lambda: next(answers))
    hung.armed = False
    safety.append(hung)
    reader = LatestReader(hung, DEADLINE_S, name="test")
    assert reader.read() == "first"
    hung.armed = True
    with pytest.raises(ReadTimeout, match=r"has not finished within 0\.2 s: a hung disk"):
        reader.read()
    assert hung.blocked.wait(JOIN_S) and reader.hanging
    for _ in range(5):  # while it hangs, no read waits and none other starts
        with pytest.raises(ReadTimeout, match="a read has been hanging for"):
            reader.read()
    assert hung.hung and hung.calls == 2
    hung.release.set()
    assert eventually(lambda: not reader.busy)
    assert not reader.hanging
    assert reader.read() == "late"  # the late read's answer, without another read
    assert hung.calls == 2
    assert reader.read() == "fresh"  # then a read afresh
    assert hung.calls == 3


def test_a_late_read_s_error_is_the_next_caller_s_and_a_copy_is_an_idle_reader(
    safety: list[_HungRead],
) -> None:
    def gone() -> str:
        raise FileNotFoundError("gone")

    hung = _HungRead(gone)
    safety.append(hung)
    reader: LatestReader[str] = LatestReader(hung, DEADLINE_S, name="test", idle_s=0.0)
    with pytest.raises(ReadTimeout):
        reader.read()
    copied = copy.deepcopy(reader)  # while the original hangs
    assert not copied.busy and not copied.hanging and copied.deadline_s == DEADLINE_S
    hung.release.set()
    assert eventually(lambda: not reader.busy)
    with pytest.raises(FileNotFoundError, match="gone"):
        reader.read()  # the late read's error, raised to the caller that takes it
    with pytest.raises(FileNotFoundError, match="gone"):
        copied.read()
    with pytest.raises(ValueError, match="deadline_s must be positive"):
        LatestReader(gone, 0.0, name="test")


def test_a_file_read_every_tick_keeps_one_worker_thread() -> None:
    # Each read says which thread ran it: one worker, kept between reads (the reader's
    # own idle wait), never the caller's thread and never one started per read.
    reader = LatestReader(threading.current_thread, JOIN_S, name="one-thread")
    workers = {reader.read() for _ in range(50)}
    assert len(workers) == 1
    (worker,) = workers
    assert worker is not threading.current_thread() and worker.daemon
    assert worker.name == "gpugov-reader-one-thread"


# ------------------------------------------------------------------ the budget file
def _hung_budget_read(monkeypatch: pytest.MonkeyPatch, safety: list[_HungRead]) -> _HungRead:
    hung = _HungRead(power_budget.read_input_text)
    hung.armed = False
    safety.append(hung)
    monkeypatch.setattr(power_budget, "read_input_text", hung)
    return hung


def test_a_hung_budget_read_keeps_the_budget_in_force_and_its_answer_is_taken(
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hung = _hung_budget_read(monkeypatch, safety)
    path = tmp_path / "budget"
    path.write_text("400")
    budget = BudgetFile(path, domain="llm", read_deadline_s=DEADLINE_S)
    assert budget.read() == 400.0
    hung.armed = True
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.power_budget")
    assert budget.read() == 400.0  # past the deadline, the mount still hung: kept
    assert hung.hung and budget.hanging and budget.errors == 1
    path.write_text("300")
    for _ in range(5):  # each tick while it hangs: no wait, no other read, no line
        assert budget.read() == 400.0
    assert hung.hung and hung.calls == 2 and budget.errors == 1
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        f"domain llm: power budget file {path} cannot be read: the read has not finished "
        "within 0.2 s (a hung disk or mount); keeping 400 W, and no other read starts "
        "until it answers"
    ]
    hung.release.set()
    assert eventually(lambda: not budget.hanging)
    assert budget.read() == 300.0  # the late read's answer: the file as it answered
    assert hung.calls == 2
    assert budget.read() == 300.0 and hung.calls == 3  # read afresh from then on
    assert budget.errors == 1 and budget.problem is None
    caplog_lines = [record.getMessage() for record in caplog.records]
    assert len(caplog_lines) == 2
    assert caplog_lines[1].startswith(f"domain llm: power budget file {path} answers again after")


def test_a_late_budget_read_that_fails_is_an_unreadable_file(
    tmp_path: Path, safety: list[_HungRead], monkeypatch: pytest.MonkeyPatch
) -> None:
    hung = _hung_budget_read(monkeypatch, safety)
    path = tmp_path / "budget"
    path.write_text("400")
    budget = BudgetFile(path, domain="llm", read_deadline_s=DEADLINE_S)
    assert budget.read() == 400.0
    hung.armed = True
    assert budget.read() == 400.0
    path.unlink()  # the mount answers: the file is gone
    hung.release.set()
    assert eventually(lambda: not budget.hanging)
    assert budget.read() == 400.0  # kept, as for any file that cannot be read
    assert budget.errors == 2 and budget.problem is not None
    assert budget.problem.startswith("cannot be read: No such file")


def test_a_budget_mount_that_hangs_again_and_again_logs_one_hang_a_minute(
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "budget"
    path.write_text("400")
    now = [0.0]
    budget = BudgetFile(path, domain="llm", read_deadline_s=DEADLINE_S, clock=lambda: now[0])
    assert budget.read() == 400.0
    caplog.set_level(logging.WARNING, logger="gpugov.daemon.power_budget")
    for hang in range(4):  # a slow mount: each read late, each answer the next tick's
        hung = _HungRead(power_budget.read_input_text)
        safety.append(hung)
        monkeypatch.setattr(power_budget, "read_input_text", hung)
        assert budget.read() == 400.0 and budget.hanging
        now[0] += 1.0
        hung.release.set()
        assert eventually(lambda: not budget.hanging)
        monkeypatch.undo()
        assert budget.read() == 400.0 and not budget.hanging
        now[0] += 1.0
        assert budget.errors == 1 + hang  # each hang counts
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines  # the first hang and its end; the others within a minute
    assert "cannot be read: the read has not finished within 0.2 s" in lines[0]
    assert re.search(r"answers again after 1\.\d s$", lines[1])
    now[0] += 60.0
    hung = _HungRead(power_budget.read_input_text)
    safety.append(hung)
    monkeypatch.setattr(power_budget, "read_input_text", hung)
    assert budget.read() == 400.0
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3 and "3 more such episode(s)" in lines[2]


def _hung_budget_config(tmp_path: Path, metrics_server: MetricsServer) -> Any:
    metrics_server.page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
    )
    budget = tmp_path / "budget"
    budget.write_text("400")
    return parse_config(
        {
            "daemon": {"period_s": 1.0},
            "domains": [
                {
                    "name": "llm",
                    "gpus": [0],
                    "engine": {"kind": "vllm", "url": metrics_server.url, "timeout_s": 0.9},
                    "controller": {"kind": "fixed", "clock_mhz": 1410},
                    "power_budget_file": str(budget),
                    "power_budget_file_scope": "domain",
                }
            ],
        }
    )


def test_the_loop_goes_on_over_a_hung_budget_file_and_takes_its_answer(
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hung = _hung_budget_read(monkeypatch, safety)
    fake = FakeNvml(1)  # 700 W: the file's 400 W is the budget in force
    assembled = domains_from_config(_hung_budget_config(tmp_path, metrics_server), nvml=fake)
    (domain,) = assembled.domains
    assert domain.budget is not None and domain.budget.file is not None
    budget = domain.budget.file
    exporter = Exporter(serve=False)
    errors: list[float | None] = []
    hung_calls: list[int] = []

    def on_step(step: int, records: Any) -> None:
        errors.append(
            exporter.registry.get_sample_value(
                "gpugov_power_budget_file_errors_total", {"domain": "llm"}
            )
        )
        if step == 1:
            hung.armed = True  # the mount hangs from the next tick on
            (tmp_path / "budget").write_text("300")  # and the file changes behind it
        if step == 4:
            hung_calls.append(hung.calls)
            assert hung.hung and budget.hanging
            hung.release.set()
            assert eventually(lambda: not budget.hanging)

    caplog.set_level(logging.WARNING, logger="gpugov.daemon.power_budget")
    try:
        records, stats = run_ticks(assembled.domains, 7, on_step=on_step, exporter=exporter)
    finally:
        assembled.close()
    assert stats.ticks == 7  # every tick ran; ticks 2 to 4 with the read hung
    assert hung_calls == [3]  # ticks 0 and 1, then the one that hangs: no pile of reads
    limits = [record.observation.power_limit_w for record in records]
    assert limits == [400.0, 400.0, 400.0, 400.0, 400.0, 300.0, 300.0]
    assert errors == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # the hang counted once
    lines = [r.getMessage() for r in caplog.records if r.name == "gpugov.daemon.power_budget"]
    assert len(lines) == 2, lines
    assert "cannot be read: the read has not finished within 0.5 s" in lines[0]
    assert "keeping 400 W" in lines[0]
    assert "answers again after" in lines[1]


# ------------------------------------------------------------------ the GPUs


def test_a_hung_gpu_read_costs_one_deadline_and_the_loop_goes_on(
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An NVML call of a GPU's sample that hangs (a driver in trouble) costs the loop one
    read deadline: every tick still runs and decides, the hung GPU's samples count as
    failed reads, no second read starts while it hangs, and once it returns the samples
    come back. Before, the loop waited on it until the watchdog killed the daemon."""
    import gpugov.daemon.service as service

    monkeypatch.setattr(service, "GPU_READ_DEADLINE_S", DEADLINE_S)
    fake = FakeNvml(1)
    real = fake.nvmlDeviceGetUtilizationRates
    hung = _HungRead(real)
    hung.armed = False
    safety.append(hung)

    monkeypatch.setattr(fake, "nvmlDeviceGetUtilizationRates", hung)  # a sample's read
    config = _hung_budget_config(tmp_path, metrics_server)
    assembled = domains_from_config(
        config.model_copy(
            update={"domains": (config.domains[0].model_copy(update={"power_budget_file": None}),)}
        ),
        nvml=fake,
    )
    (domain,) = assembled.domains
    errors: list[int] = []
    calls: list[int] = []

    def on_step(step: int, records: Any) -> None:
        errors.append(domain.observer.gpus.gpu_read_errors["0"])
        if step == 1:
            hung.armed = True  # the GPU's utilisation read hangs from the next tick on
        if step == 4:
            calls.append(hung.calls)
            assert hung.blocked.is_set()
            hung.release.set()
            assert eventually(
                lambda: not any(r.busy for r in domain.observer.gpus._readers.values())
            )

    caplog.set_level(logging.WARNING, logger="gpugov.daemon.observer")
    try:
        records, stats = run_ticks(assembled.domains, 7, on_step=on_step)
    finally:
        assembled.close()
    assert stats.ticks == 7  # every tick ran and decided; ticks 2 to 4 with the read hung
    assert [record.failsafe for record in records] == [False] * 7
    assert calls == [3]  # ticks 0 and 1, then the one that hangs: no pile of reads
    assert errors[:2] == [0, 0] and errors[2] == errors[3] - 1 == errors[4] - 2
    assert errors[5] == errors[6] == errors[4]  # the late answer, then fresh reads: no more
    powers = [record.observation.power_w for record in records]
    assert powers[2:5] == [None, None, None] and None not in powers[:2] + powers[5:]
    lines = [r.getMessage() for r in caplog.records if "GPU 0" in r.getMessage()]
    assert any(f"no answer within {DEADLINE_S:g} s (a hung GPU call)" in line for line in lines)


@pytest.mark.parametrize("controller", ["max", "mpc-online"])
def test_a_gpu_read_that_hangs_at_the_start_holds_neither_the_start_nor_the_stop(
    controller: str,
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A GPU's temperature read hangs (a driver in trouble) when ``gpugov run`` starts,
    with a lock a killed run left: the start's reconcile read the GPU on the main thread
    with no deadline, so the start never finished (no loop, no watchdog ping) and a
    SIGTERM could not end it (``mpc-online``'s start read every GPU's power limit so too).
    Now the read is the loop's, under its deadline: the lock left is reset, the run starts
    and stops while the read still hangs."""
    from daemon_support import node_commands_on, sigterm_once_open

    import gpugov.daemon.node_cli as node_cli
    import gpugov.daemon.service as service
    from gpugov.daemon.actuator import ClockActuator
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend

    monkeypatch.setattr(service, "GPU_READ_DEADLINE_S", DEADLINE_S)
    fake = node_commands_on(monkeypatch, FakeNvml(1))
    state_dir = tmp_path / "state"
    ClockActuator([NvmlBackend(0, nvml=fake)], state=LockState(state_dir, pid=1)).apply(1005)
    hung = _HungRead(fake.nvmlDeviceGetTemperatureV)
    safety.append(hung)
    monkeypatch.setattr(fake, "nvmlDeviceGetTemperatureV", hung)
    metrics_server.page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
    )
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{state_dir}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
        f'[domains.controller]\nkind = "{controller}"\n'
    )
    sigterm_once_open(monkeypatch)
    with caplog.at_level(logging.INFO):
        assert node_cli.main(["run", "--config", str(config)]) == 0
    assert hung.hung and hung.calls == 1  # returned while the read still hangs
    assert "stopped during the start" in caplog.text
    assert "left it locked at 1005-1005 MHz (now unknown of 1980 MHz); reset" in caplog.text
    assert fake.locked(0) is None


def test_a_stop_while_a_gpu_call_hangs_as_the_gpus_are_opened_ends_the_start(
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A wedged driver: the NVML call that names a GPU never returns as ``gpugov run``
    opens it. The SIGTERM that follows (systemd's stop) was caught, but the start went on
    waiting on the call, so the run outlived the unit's stop timeout and was killed. The
    start now ends at the stop, with nothing opened or locked, while the call hangs."""
    import os
    import signal

    from daemon_support import node_commands_on

    import gpugov.daemon.node_cli as node_cli

    fake = node_commands_on(monkeypatch, FakeNvml(1))
    hung = _HungRead(fake.nvmlDeviceGetName)
    safety.append(hung)
    monkeypatch.setattr(fake, "nvmlDeviceGetName", hung)
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{tmp_path / "state"}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
    )

    def stop_once_hung() -> None:
        if hung.blocked.wait(JOIN_S):
            os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_hung, daemon=True)
    stopper.start()
    with caplog.at_level(logging.INFO):
        assert node_cli.main(["run", "--config", str(config)]) == 0
    stopper.join()
    assert hung.hung  # it ended while the call still hangs
    assert "stopped during the start" in caplog.text
    assert "locking clocks" not in caplog.text and fake.writes == []


@pytest.mark.parametrize("budget", [False, True], ids=["no budget", "a budget file"])
def test_a_hung_power_limit_constraints_read_holds_neither_the_start_nor_the_loop(
    budget: bool,
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
) -> None:
    """NVML's power limit constraints of a GPU hang (a wedged firmware answers nothing
    that goes to the board): the start read them for every domain with no deadline (the
    budget's lowest limit, needed only with a budget) and the loop's first power reading
    again (its plausibility ceiling), so the start never finished. Now the start reads
    them only for a budget, and each read has the GPU read deadline."""
    import gpugov.daemon.service as service

    monkeypatch.setattr(service, "GPU_READ_DEADLINE_S", DEADLINE_S)
    fake = FakeNvml(1)
    hung = _HungRead(fake.nvmlDeviceGetPowerManagementLimitConstraints)
    safety.append(hung)
    monkeypatch.setattr(fake, "nvmlDeviceGetPowerManagementLimitConstraints", hung)
    config = _hung_budget_config(tmp_path, metrics_server)
    if not budget:
        domains = (config.domains[0].model_copy(update={"power_budget_file": None}),)
        config = config.model_copy(update={"domains": domains})
    assembled = domains_from_config(config, nvml=fake)
    try:
        records, stats = run_ticks(assembled.domains, 3)
    finally:
        assembled.close()
    assert hung.hung and hung.calls <= 2  # returned while it hangs; never a pile of calls
    assert stats.ticks == 3 and [r.applied_mhz for r in records] == [1410] * 3
    assert [r.observation.power_w for r in records] == [350.0] * 3  # the enforced limit serves


# ------------------------------------------------------------------ the learned model


def _wrapper(
    directory: Path, read_deadline_s: float = DEADLINE_S, write_deadline_s: float = JOIN_S
) -> PersistentOnlineModel:
    """The learned model's store; its writes wait as long as a busy machine takes (no
    write hangs here)."""
    controller = OnlineMPCController(
        mean_prompt_tokens=1100.0, mean_output_tokens=110.0, warmup_s=10.0
    )
    return PersistentOnlineModel(
        controller,
        directory,
        "llm",
        GPUS,
        save_every_s=10.0,
        read_deadline_s=read_deadline_s,
        write_deadline_s=write_deadline_s,
    )


def _run(wrapper: PersistentOnlineModel, seconds: float) -> None:
    def decide(observation: ServingObservation) -> float:
        return wrapper(replace(observation, model_name="llama"))

    simulate(poisson_requests(seconds), make_plant(), chunked_prefill_scheduler, decide, 0)


def test_a_hung_state_file_read_is_an_unreadable_file_and_it_is_restored_once_answered(
    tmp_path: Path, safety: list[_HungRead], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _wrapper(tmp_path, read_deadline_s=JOIN_S)  # a healthy disk, however busy
    _run(first, 30.0)
    first.close()
    path = model_path(tmp_path, "llm")
    stored = path.read_bytes()
    hung = _HungRead(store.read_stored)
    safety.append(hung)
    monkeypatch.setattr(store, "read_stored", hung)
    wrapper = _wrapper(tmp_path)
    _run(wrapper, 60.0)  # the restore's read hangs; five save periods pass
    assert hung.hung and hung.calls == 1  # one read, never another while it hangs
    assert not wrapper.restored
    hangs = [m for m in wrapper.messages if "cannot read state file" in m]
    assert len(hangs) == 1, wrapper.messages
    assert "the read has not finished within 0.2 s: a hung disk or mount" in hangs[0]
    assert "learning anew without saving, and read again every 10 s" in hangs[0]
    assert path.read_bytes() == stored  # nothing saved over it, nothing set aside
    assert not list(tmp_path.glob("online-model-llm.json.*"))
    hung.release.set()
    assert eventually(wrapper.save)  # its answer taken once it came; restored; saved
    assert wrapper.restored
    assert any("can be read again" in m for m in wrapper.messages)
    assert any("learned model restored" in m for m in wrapper.messages)
    assert path.read_bytes() != stored
    wrapper.close()


def test_a_state_file_read_that_fails_late_is_handled_as_at_a_start(
    tmp_path: Path, safety: list[_HungRead], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mount answers that the file cannot be read after all (permissions): the
    unreadable file's path, unchanged."""
    path = model_path(tmp_path, "llm")
    path.write_text("{}")

    def denied(target: Path) -> dict[str, Any]:
        raise stored_model.UnreadableStateError(
            str(InputFileError(target, None, "cannot read state file: Permission denied"))
        )

    hung = _HungRead(denied)
    safety.append(hung)
    monkeypatch.setattr(store, "read_stored", hung)
    wrapper = _wrapper(tmp_path)
    _run(wrapper, 30.0)
    assert hung.hung and hung.calls == 1 and not wrapper.restored
    hung.release.set()
    # The late answer (denied) is taken by a save, and each save period reads it again.
    assert eventually(lambda: wrapper.save() is False and hung.calls >= 2)
    assert path.read_text() == "{}"  # still unreadable: nothing saved over it
    assert len([m for m in wrapper.messages if "cannot read state file" in m]) == 1
    assert not wrapper.restored


def test_a_stop_during_the_reconciles_hung_reads_leaves_the_rest_to_the_exits_reset(
    tmp_path: Path,
    safety: list[_HungRead],
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A killed run left three GPUs locked; the next start's reconcile reads each GPU's
    clocks (2 s each on a node when the driver hangs), and a SIGTERM lands during GPU 0's.
    The reconcile went on, GPU after GPU, reading and resetting each (a hung read and a
    hung reset, 4 s a GPU: eight GPUs outlived a unit's stop timeout), and so did the
    power limits'. It stops at the stop now: the GPUs left are not read, and the exit
    resets them (all at once, within its budget: a lock found or not) and restores their
    recorded power limits."""
    import os
    import signal

    from daemon_support import node_commands_on

    import gpugov.daemon.node_cli as node_cli
    import gpugov.daemon.service as service
    from gpugov.daemon.actuator import ClockActuator
    from gpugov.daemon.lockstate import LockState
    from gpugov.daemon.nvml import NvmlBackend

    monkeypatch.setattr(service, "GPU_READ_DEADLINE_S", DEADLINE_S)
    fake = node_commands_on(monkeypatch, FakeNvml(4))
    state_dir = tmp_path / "state"
    killed = LockState(state_dir, pid=1)
    ClockActuator([NvmlBackend(i, nvml=fake) for i in range(3)], state=killed).apply(1005)
    fake.gpus[3].locked = (900, 900)  # no record: a run that left none, or someone else
    killed.record_power_limit(fake.gpus[2].uuid, "2", 700_000, 300_000)
    fake.gpus[2].power_limit_mw = 300_000
    hung = _HungRead(fake.nvmlDeviceGetTemperatureV)
    safety.append(hung)

    def stopped_while_hung(*args: Any, **options: Any) -> Any:
        if hung.calls == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return hung(*args, **options)

    monkeypatch.setattr(fake, "nvmlDeviceGetTemperatureV", stopped_while_hung)
    metrics_server.page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
    )
    config = tmp_path / "gpugov.toml"
    config.write_text(
        f'[daemon]\nmetrics_address = ""\nstate_dir = "{state_dir}"\n'
        '[[domains]]\nname = "llm"\ngpus = [0, 1, 2, 3]\n'
        f'[domains.engine]\nkind = "vllm"\nurl = "{metrics_server.url}"\n'
    )
    with caplog.at_level(logging.INFO):
        assert node_cli.main(["run", "--config", str(config)]) == 0
    assert hung.calls == 1  # GPU 0's read, which the stop landed in; no other GPU read
    assert "stopped during the start" in caplog.text
    for gpu in (1, 2):
        assert (
            f"reconcile: GPU {gpu}: a previous gpugov run (pid 1, " in caplog.text
            and "left it locked at 1005-1005 MHz; not reconciled (stopped during the start): "
            "reset at exit"
            in caplog.text
        ), caplog.text
    assert (
        "reconcile: GPU 2: a previous gpugov run (pid 1, " in caplog.text
        and "set its power limit to 300 W, 700 W before; not reconciled (stopped during the "
        "start): restored at exit"
        in caplog.text
    ), caplog.text
    assert "reconcile: GPU 3: not reconciled (stopped during the start): reset at exit" in (
        caplog.text
    )
    assert [fake.locked(i) for i in range(4)] == [None] * 4  # GPU 3's reset too, as before
    assert fake.gpus[2].power_limit_mw == 700_000
    assert LockState(state_dir).read() == {} and LockState(state_dir).power_limits() == {}


def test_a_start_given_up_on_is_closed_once_it_returns() -> None:
    """A stop during a start hung in NVML gives the start up (nothing is locked yet); the
    build went on on its thread and, once the call returned, its GPUs, engines and GPU
    holds stayed open for the rest of the process (a test after it found the GPU held)."""
    import gpugov.daemon.node_cli as node_cli

    release = threading.Event()
    closed = threading.Event()

    class Built:
        def close(self) -> None:
            closed.set()

    def build() -> Built:
        release.wait(JOIN_S)
        return Built()

    stop = threading.Event()
    stop.set()
    assert node_cli._built_unless_stopped(build, stop) is None
    assert not closed.is_set()
    release.set()
    assert closed.wait(JOIN_S)
    # A build that returns in time is the caller's, not closed.
    kept = node_cli._built_unless_stopped(Built, threading.Event())
    assert isinstance(kept, Built)
