"""A state file whose write hangs (a stuck NFS or hostPath mount, an fsync blocked for
minutes): the lock record and ``mpc-online``'s learned model are written on a worker
thread (:class:`daemon.deadline.LatestWriter`), so the caller goes on after its write
deadline with the file counted out of date, the newest payload lands once the disk
answers (never an older one after a newer one), and neither the loop nor its exit waits
on the disk.

A hung write is a write function blocked on a :class:`threading.Event`. Every check is of
what happened, never of wall time: a call that should not wait must return while the disk
is still hung (a safety timer frees the disk after :data:`JOIN_S`, so a regression fails
instead of hanging the suite)."""

from __future__ import annotations

import copy
import errno
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from daemon_support import (
    JOIN_S,
    MetricsServer,
    eventually,
    fixed_clock_node,
    freed_at_end,
    lock_state_reading,
    run_ticks,
)
from fake_pynvml import FakeNvml
from synthetic import make_plant, poisson_requests

import gpugov.daemon.model_store as store
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.daemon import lockstate, stored_model
from gpugov.daemon.actuator import ClockActuator
from gpugov.daemon.deadline import LatestWriter, WriteTimeout
from gpugov.daemon.exporter import Exporter
from gpugov.daemon.lockstate import LockState
from gpugov.daemon.model_store import PersistentOnlineModel
from gpugov.daemon.nvml import NvmlBackend
from gpugov.daemon.stored_model import model_path, read_stored
from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.types import ServingObservation

DEADLINE_S = 0.05
KEY = "GPU-fake-0000"
GPUS = ("GPU-aaaa", "GPU-bbbb")


class _HungDisk:
    """A write function that blocks until :attr:`release` is set, then writes with ``real``
    (when given); every payload written is kept, in the order written."""

    def __init__(self, real: Callable[..., None] | None = None) -> None:
        self.real = real
        self.release = threading.Event()
        self.blocked = threading.Event()
        """Set once a write is blocked on the hung disk."""
        self.written: list[Any] = []

    def __call__(self, *args: Any, **options: Any) -> None:
        if not self.release.is_set():
            self.blocked.set()
            self.release.wait(JOIN_S)
        if self.real is not None:
            self.real(*args, **options)
        self.written.append(args[-1])

    @property
    def hung(self) -> bool:
        return not self.release.is_set()

    def hangs(self, module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """Stand in for ``module``'s ``write_json_atomic``, writing with it once released."""
        self.real = module.write_json_atomic
        monkeypatch.setattr(module, "write_json_atomic", self)


@pytest.fixture
def hung() -> Iterator[_HungDisk]:
    """A hung disk, freed at the end of the test (or after :data:`JOIN_S`)."""
    disk = _HungDisk()
    with freed_at_end(disk.release.set):
        yield disk


# ------------------------------------------------------------------ the writer
def test_a_hung_write_costs_one_deadline_and_the_newest_payload_lands_after_it(
    hung: _HungDisk,
) -> None:
    writer = LatestWriter(hung, DEADLINE_S, name="test")
    with pytest.raises(WriteTimeout, match=r"has not finished within 0\.05 s: a hung disk"):
        writer.write("a")
    assert hung.blocked.wait(JOIN_S) and hung.hung and writer.busy
    # While the late write runs, no later write waits; each replaces the one queued.
    with pytest.raises(WriteTimeout, match="a write has been hanging for"):
        writer.write("b")
    writer.post("c")
    with pytest.raises(WriteTimeout, match="a write has been hanging for"):
        writer.write("d")
    assert hung.hung and hung.written == []
    hung.release.set()
    assert eventually(lambda: not writer.busy)  # the newest is written once the disk answers
    assert hung.written == ["a", "d"]  # never b or c, never an older one after d
    writer.write("e", wait_s=JOIN_S)  # a working disk: written before the call returns
    assert hung.written[-1] == "e"


def test_a_write_error_is_raised_to_the_caller_and_a_copy_is_an_idle_writer() -> None:
    written: list[str] = []

    def full(payload: str) -> None:
        if payload == "full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(payload)

    # A working disk: waited for as long as a busy machine takes (never a WriteTimeout).
    writer = LatestWriter(full, JOIN_S, name="test")
    with pytest.raises(OSError, match="No space left"):
        writer.write("full")
    writer.write("fits")
    copied = copy.deepcopy(writer)
    assert not copied.busy and copied.deadline_s == JOIN_S
    copied.write("copied")
    assert written == ["fits", "copied"]
    with pytest.raises(ValueError, match="deadline_s must be positive"):
        LatestWriter(full, 0.0, name="test")


# ------------------------------------------------------------------ the lock record
def test_a_hung_lock_state_write_leaves_the_file_stale_and_the_newest_record_lands(
    tmp_path: Path,
    hung: _HungDisk,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hung.hangs(lockstate, monkeypatch)
    fake = FakeNvml(1)
    state = LockState(tmp_path, pid=1, write_deadline_s=DEADLINE_S)
    actuator = ClockActuator([NvmlBackend(0, nvml=fake)], state=state)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        assert actuator.apply(900) == 1  # returns past the deadline, the disk still hung
        assert hung.blocked.wait(JOIN_S) and hung.hung
        assert fake.locked(0) == (900, 900)  # the lock went through
        assert state.stale and state.write_failures == 1  # counted as a failed write
        assert actuator.apply(1000) == 1  # a newer record while the first hangs
        assert state.retry() is False
        assert hung.hung and state.stale and state.write_failures == 3
        assert not (tmp_path / "locks.json").exists()
        hung.release.set()
        assert eventually(state.retry)  # the disk answers: written again
    # (a retry that came before the hung write had ended counts too)
    assert not state.stale and state.write_failures >= 3
    assert LockState(tmp_path).read()[KEY]["max_mhz"] == 1000  # the newest record
    clocks = [payload["gpus"][KEY]["max_mhz"] for payload in hung.written]
    assert clocks[0] == 900 and clocks[-1] == 1000 and 900 not in clocks[1:]
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines  # the first failure and the recovery, as a failed write
    assert "cannot write it (the write has not finished within 0.05 s: a hung disk" in lines[0]
    assert re.search(r"written again after \d+ failed write\(s\)", lines[1])


def test_a_record_that_lands_late_is_up_to_date_at_the_next_retry(
    tmp_path: Path,
    hung: _HungDisk,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A disk slower than the deadline, not hung: the write runs past it and then goes
    # through. The next retry takes the file as up to date without writing it again (a
    # write again would run past the deadline as well, on such a disk, every tick).
    hung.hangs(lockstate, monkeypatch)
    state = LockState(tmp_path, pid=1, write_deadline_s=DEADLINE_S)
    with caplog.at_level(logging.WARNING, logger="gpugov.daemon.lockstate"):
        state.record(KEY, "0", 900, 900)
        assert hung.blocked.wait(JOIN_S) and state.stale and state.write_failures == 1
        hung.release.set()
        assert eventually(lambda: not state._writer.busy)  # the write went through, late
        assert state.retry() is True
    assert not state.stale and state.write_failures == 1
    assert [payload["gpus"][KEY]["max_mhz"] for payload in hung.written] == [900]  # once
    assert LockState(tmp_path).read()[KEY]["max_mhz"] == 900
    assert re.search(r"written again after 1 failed write\(s\)", caplog.records[-1].getMessage())


def test_the_power_limit_record_is_on_disk_before_the_call_returns(tmp_path: Path) -> None:
    # The order the record keeps (the entry before the limit is set) holds on a working
    # disk: the caller waits for its write.
    state = LockState(tmp_path, pid=1, write_deadline_s=JOIN_S)
    state.record_power_limit(KEY, "0", 700_000, 300_000)
    assert LockState(tmp_path).power_limits()[KEY]["set_mw"] == 300_000
    assert not state.stale


def test_the_exit_resets_never_wait_on_a_hung_disk_and_the_flush_is_bounded(
    tmp_path: Path, hung: _HungDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNvml(2)
    state = LockState(tmp_path, pid=1, write_deadline_s=DEADLINE_S)
    actuator = ClockActuator([NvmlBackend(i, nvml=fake) for i in range(2)], state=state)
    assert actuator.apply(900) == 2  # recorded on a working disk
    before = state.write_failures  # (0 unless a busy machine wrote it past the deadline)
    hung.hangs(lockstate, monkeypatch)
    state.defer_writes()
    assert actuator.restore() == []  # both reset, no write waited for
    assert fake.locked(0) is None and fake.locked(1) is None
    assert state.flush() is False  # bounded: the file counts as out of date
    assert hung.hung and state.stale and state.write_failures == before + 1
    hung.release.set()
    assert eventually(lambda: LockState(tmp_path).read() == {})  # the newest record lands


def test_the_loop_goes_on_over_a_hung_lock_state_disk_and_its_exit_does_not_hang(
    tmp_path: Path,
    hung: _HungDisk,
    monkeypatch: pytest.MonkeyPatch,
    metrics_server: MetricsServer,
) -> None:
    hung.hangs(lockstate, monkeypatch)
    fake = FakeNvml(1)
    assembled = fixed_clock_node(tmp_path, metrics_server, fake)
    exporter = Exporter(serve=False)
    seen: list[tuple[float | None, float | None, Any]] = []

    def on_step(step: int, records: Any) -> None:
        seen.append(lock_state_reading(exporter, fake))

    try:
        _, stats = run_ticks(assembled.domains, 4, on_step=on_step, exporter=exporter)
    finally:
        assembled.close()
    # Every tick ran with the disk hung throughout, the exit's reset and flush too.
    assert hung.hung and stats.ticks == 4
    assert seen == [
        (1.0, 1.0, (1410, 1410)),  # the lock's record hangs; the lock holds
        (2.0, 1.0, (1410, 1410)),  # each tick's retry counts, as a failed write's does
        (3.0, 1.0, (1410, 1410)),
        (4.0, 1.0, (1410, 1410)),
    ]
    assert fake.locked(0) is None  # reset at stop, the disk still hung
    hung.release.set()
    assert eventually(lambda: (tmp_path / "locks.json").exists())
    assert eventually(lambda: LockState(tmp_path).read() == {})  # the newest: no lock


# ------------------------------------------------------------------ the learned model


def _wrapper(directory: Path) -> PersistentOnlineModel:
    controller = OnlineMPCController(
        mean_prompt_tokens=1100.0, mean_output_tokens=110.0, warmup_s=10.0
    )
    return PersistentOnlineModel(
        controller, directory, "llm", GPUS, save_every_s=10.0, write_deadline_s=DEADLINE_S
    )


def _named(wrapper: PersistentOnlineModel, name: Callable[[float], str]) -> Any:
    def decide(observation: ServingObservation) -> float:
        return wrapper(replace(observation, model_name=name(observation.time_s)))

    return decide


def test_a_hung_model_save_never_stalls_the_run_and_the_newest_model_lands(
    tmp_path: Path, hung: _HungDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    hung.hangs(store, monkeypatch)
    posted: list[dict[str, Any]] = []
    post = LatestWriter.post

    def recording(writer: LatestWriter, payload: Any) -> None:
        posted.append(payload)
        post(writer, payload)

    monkeypatch.setattr(LatestWriter, "post", recording)
    wrapper = _wrapper(tmp_path)
    simulate(
        poisson_requests(60.0),
        make_plant(),
        chunked_prefill_scheduler,
        _named(wrapper, lambda _: "llama"),
        0,
    )
    assert hung.hung and wrapper.save_failed  # the run went on past every save
    failures = [m for m in wrapper.messages if "cannot save" in m]
    assert "has not finished within 0.05 s: a hung disk" in failures[0]
    assert "a write has been hanging for" in failures[-1]
    wrapper.close()  # the final save is bounded too
    assert hung.hung and "not saved" in wrapper.messages[-1]
    path = model_path(tmp_path, "llm")
    assert not path.exists()
    assert len(posted) >= 3  # the first save, later ones, the final one: none waited
    hung.release.set()
    assert eventually(lambda: bool(hung.written) and hung.written[-1] is posted[-1])
    # Written in the order posted, each once, the final save's model last; of the saves
    # posted while the first one hung, only the newest is written.
    order = [next(i for i, p in enumerate(posted) if p is w) for w in hung.written]
    assert order == sorted(set(order)) and order[-1] == len(posted) - 1 and len(order) <= 2
    assert read_stored(path)["saved_at_unix_s"] == posted[-1]["saved_at_unix_s"]


def test_the_final_save_waits_past_the_loops_deadline_for_a_slow_disk(
    tmp_path: Path, hung: _HungDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At exit the clocks are reset already: a disk slower than the loop's deadline, not
    hung, still gets the final save (its wait is :data:`store.FINAL_SAVE_WAIT_S`)."""
    monkeypatch.setattr(store, "FINAL_SAVE_WAIT_S", JOIN_S)
    wrapper = _wrapper(tmp_path)
    simulate(
        poisson_requests(30.0),
        make_plant(),
        chunked_prefill_scheduler,
        _named(wrapper, lambda _: "llama"),
        0,
    )
    assert not wrapper.save_failed
    hung.hangs(store, monkeypatch)
    slow = threading.Timer(0.2, hung.release.set)  # answers, past the 0.05 s deadline
    slow.start()
    try:
        assert wrapper.save(final=True)
    finally:
        slow.cancel()
    assert hung.written and not wrapper.save_failed
    stored = read_stored(model_path(tmp_path, "llm"))
    assert stored["saved_at_unix_s"] == hung.written[-1]["saved_at_unix_s"]


def test_the_state_file_is_not_read_while_a_save_hangs(
    tmp_path: Path, hung: _HungDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The served model changes while the old model's save hangs: the file is not read
    (nor set aside) until that save has ended, nothing is saved over it meanwhile, and
    then it is kept aside as another model's and the new model is saved."""
    hung.hangs(store, monkeypatch)
    wrapper = _wrapper(tmp_path)
    simulate(
        poisson_requests(60.0),
        make_plant(),
        chunked_prefill_scheduler,
        _named(wrapper, lambda time_s: "llama" if time_s < 35.0 else "mistral"),
        0,
    )
    assert hung.hung
    assert wrapper.key is not None and wrapper.key.model_name == "mistral"
    (line,) = [m for m in wrapper.messages if "an earlier save has not finished" in m]
    assert "not read now" in line
    assert not list(tmp_path.glob("online-model-llm.json.*"))  # nothing renamed
    hung.release.set()
    path = model_path(tmp_path, "llm")

    def saved() -> bool:
        """A save (read again once the hung one ended, then saved): the new model's on
        disk (the save counted as done, or one that ran past the deadline landed)."""
        if wrapper.save():
            return True
        try:
            return bool(read_stored(path)["key"]["model_name"] == "mistral")
        except (OSError, stored_model.StoredModelError):
            return False

    assert eventually(saved)
    assert read_stored(path)["key"]["model_name"] == "mistral"
    (kept,) = tmp_path.glob("online-model-llm.json.other-*")
    assert read_stored(kept)["key"]["model_name"] == "llama"
    # The old model's saves first, then the new one's: never an old one over the new.
    names = [payload["key"]["model_name"] for payload in hung.written]
    first_new = names.index("mistral")
    assert set(names[:first_new]) == {"llama"} and set(names[first_new:]) == {"mistral"}
    wrapper.close()


def test_a_hung_look_at_the_state_directorys_hold_never_stalls_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tick's retry looks whether the hold file was removed under the daemon (one
    ``fstat``), on the loop's thread: on a hung mount (an NFS ``GETATTR`` that never
    answers) the loop stopped there, no watchdog ping, a SIGTERM not taken, GPUs locked.
    It is bounded as the record's writes are: one write deadline once, then no wait while
    it hangs, and the hold is looked at again once the disk answers."""
    release = threading.Event()
    blocked = threading.Event()
    state = LockState(tmp_path, write_deadline_s=DEADLINE_S)
    state.hold()
    hold_fd = state._held.fileno()

    class HungFstat:
        """``os`` as lockstate sees it, the hold file's ``fstat`` hung."""

        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        def fstat(self, fd: int) -> os.stat_result:
            if fd == hold_fd:
                blocked.set()
                release.wait(JOIN_S)
            return os.fstat(fd)

    monkeypatch.setattr(lockstate, "os", HungFstat())
    with freed_at_end(release.set):
        worker = threading.Thread(target=lambda: [state.retry() for _ in range(50)], daemon=True)
        worker.start()
        worker.join(JOIN_S / 2)
        assert blocked.is_set()
        assert not worker.is_alive(), "a tick's retry waited on the hung hold file"
        release.set()
        (tmp_path / lockstate.HOLD_FILE).unlink()  # the directory cleaned under the daemon
        assert eventually(lambda: [state.retry()] and (tmp_path / lockstate.HOLD_FILE).exists())
    state.release()


def test_a_hung_release_of_the_state_directory_never_holds_the_exit(
    tmp_path: Path, hung: _HungDisk, metrics_server: MetricsServer
) -> None:
    """The exit lets the state directory go (the hold file's ``flock``) and closes the
    learned models' hold files after the resets: on a hung mount (an NFS lock release is
    a call to the server) the close never returned, and the daemon outlived the unit's
    stop timeout. Each is waited for at most the write deadline now."""
    fake = FakeNvml(1)
    assembled = fixed_clock_node(tmp_path, metrics_server, fake)
    assert assembled.state is not None and assembled.state._held is not None
    held = assembled.state._held

    class HungClose:
        """The hold file, its close hung on the mount."""

        def __getattr__(self, name: str) -> Any:
            return getattr(held, name)

        def close(self) -> None:
            hung.release.wait(JOIN_S)
            held.close()

    assembled.state._held = HungClose()
    assembled.held_models.append(HungClose())  # type: ignore[arg-type]
    done = threading.Event()
    with freed_at_end(hung.release.set):
        threading.Thread(target=lambda: (assembled.close(), done.set()), daemon=True).start()
        assert done.wait(JOIN_S / 2), "the exit waited on the hung close"
        assert not hung.release.is_set()
