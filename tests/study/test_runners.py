"""The cell runners without Ray: in-process, the local pool, lost workers, and the
one-line install hint when ``--ray`` is asked for and Ray is missing."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import cell_tasks
import pytest

from gpugov.cli import main
from gpugov.daemon.cli_support import UsageError
from gpugov.study.runners import (
    RAY_INSTALL_HINT,
    RunnerError,
    RunnerSpec,
    map_cells,
)


def _values(done: list) -> dict[int, int]:
    indices = [item.index for item in done]
    assert sorted(indices) == list(range(len(indices))), "every cell exactly once"
    return {item.index: item.value for item in done}


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_cell_once_with_the_shared_inputs(jobs: int) -> None:
    done = list(
        map_cells(
            cell_tasks.double,
            [3, 1, 4, 1, 5],
            spec=RunnerSpec(jobs=jobs),
            shared={"offset": 100},
            order=[4, 3, 2, 1, 0],
        )
    )
    assert _values(done) == {0: 106, 1: 102, 2: 108, 3: 102, 4: 110}
    assert all(item.attempts == 1 for item in done)


def test_a_pool_worker_killed_mid_task_is_retried_and_reported(tmp_path: Path) -> None:
    events: list[str] = []
    cells = [(value, str(tmp_path / "killed")) for value in range(4)]
    done = list(
        map_cells(
            cell_tasks.die_once,
            cells,
            spec=RunnerSpec(jobs=2),
            shared={"offset": 1},
            on_event=events.append,
        )
    )
    assert _values(done) == {0: 1, 1: 11, 2: 21, 3: 31}
    assert (tmp_path / "killed").exists(), "the worker was really killed once"
    assert len(events) == 1 and "worker process died" in events[0] and "retry 1/2" in events[0]
    assert max(item.attempts for item in done) == 2


def test_a_cell_that_always_kills_its_worker_gives_up_after_the_retries() -> None:
    events: list[str] = []
    with pytest.raises(RunnerError, match="died 2 times"):
        list(
            map_cells(
                cell_tasks.always_die,
                [1, 2],
                spec=RunnerSpec(jobs=2, retries=1),
                on_event=events.append,
            )
        )
    assert len(events) == 1


def test_workers_that_cannot_start_give_one_line_each_and_a_runner_error(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A worker whose initialiser fails (a module missing from the install) exits with
    one line; the pool, broken before or while its cells are submitted, is retried, then
    gives up with :class:`RunnerError`: no traceback from the pool or its workers."""
    from gpugov.study import runners

    def missing() -> None:
        raise ModuleNotFoundError("No module named 'threadpoolctl'")

    monkeypatch.setattr(runners, "single_threaded", missing)  # the forked workers see it
    events: list[str] = []
    with pytest.raises(RunnerError, match="died 2 times"):
        list(
            map_cells(
                cell_tasks.double,
                list(range(6)),
                spec=RunnerSpec(jobs=2, retries=1),
                shared={"offset": 0},
                on_event=events.append,
            )
        )
    assert len(events) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "a worker process could not start" in err and "threadpoolctl" in err


def test_a_task_error_propagates_unchanged() -> None:
    with pytest.raises(ValueError, match="cell 7: bad input"):
        list(map_cells(cell_tasks.reject, [7], spec=RunnerSpec(jobs=1)))


def test_bad_runner_values_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--jobs"):
        RunnerSpec(jobs=-1)
    with pytest.raises(UsageError, match="--retries"):
        RunnerSpec(retries=-1)
    with pytest.raises(UsageError, match="--ray"):
        RunnerSpec(ray_address=" ")


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "controllers", "--tiny"],
        ["sweep", "--grid", "GRID"],
        ["experiments", "--quick"],
    ],
    ids=["bench", "sweep", "experiments"],
)
def test_ray_missing_says_how_to_install_it_in_one_line(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["azure-conv-10min"]\nprofiles = ["h100-sxm-llama3-8b"]\ncontrollers = ["max"]\n'
    )
    argv = [str(grid) if word == "GRID" else word for word in command]
    out = tmp_path / "out"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*argv, "--ray", "local", "--out", str(out)])
    assert code == 2
    assert stderr.getvalue() == f"gpugov: error: {RAY_INSTALL_HINT}\n"
    assert "pip install 'gpugov[ray]'" in RAY_INSTALL_HINT
    assert not out.exists()


def _blocked_at_submit(monkeypatch: pytest.MonkeyPatch, signum: int) -> list[bool]:
    """Record, at every pool submit (where the workers fork), whether ``signum`` is
    blocked in the submitting thread."""
    import signal
    from concurrent.futures import ProcessPoolExecutor

    blocked: list[bool] = []
    submit = ProcessPoolExecutor.submit

    def watched(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        blocked.append(signum in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", watched)
    return blocked


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="POSIX only")
def test_pool_workers_are_forked_with_sigint_blocked_then_ignore_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workers fork (on submit) with SIGINT blocked: a Ctrl-C mid-fork hung the
    command. They then ignore and unblock it; the parent's mask is as it was."""
    import signal

    blocked_at_submit = _blocked_at_submit(monkeypatch, signal.SIGINT)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    done = list(map_cells(cell_tasks.sigint_state, [0, 1], spec=RunnerSpec(jobs=2)))
    assert blocked_at_submit == [True, True]
    assert {item.value for item in done} == {(True, False)}
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_sigterm_raises_in_the_parent_while_a_pool_runs_and_workers_keep_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the pool runs, the parent's SIGTERM raises ``Terminated`` (so its cleanup
    ends the workers) and is restored after; the workers fork with it blocked and run it
    at its default action, unblocked."""
    import signal

    from gpugov.daemon.errors import Terminated

    blocked_at_submit = _blocked_at_submit(monkeypatch, signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM)
    cells = map_cells(cell_tasks.sigterm_state, [0, 1], spec=RunnerSpec(jobs=2))
    first = next(cells)
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler) and handler is not before
    try:
        with pytest.raises(Terminated):
            handler(signal.SIGTERM, None)
    finally:
        Terminated.forget()
    done = [first, *cells]
    assert blocked_at_submit == [True, True]
    assert {item.value for item in done} == {(True, False)}
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_while_a_runtime_starts_waits_for_the_handler_then_unwinds_it() -> None:
    """A SIGTERM that arrives while a runtime starts (Ray's ``ray.init`` installs a
    handler of its own there) is held until gpugov's handler is in place; it then raises
    ``Terminated`` before any cell runs, the runtime's exit runs, and the handler and the
    signal mask are restored."""
    import signal
    import threading

    from gpugov.daemon.errors import Terminated
    from gpugov.study.runners import _terminate_raises

    events: list[str] = []

    class Runtime:
        def __enter__(self) -> str:
            # The runtime installs its own handler, then the signal comes mid-start, to the
            # thread starting it (a pytest-xdist worker has threads of its own that would
            # take a process-wide one; a gpugov command has none before its runtime).
            signal.signal(signal.SIGTERM, lambda signum, frame: events.append("runtime's"))
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
            events.append("started")
            return "runtime"

        def __exit__(self, *exc: object) -> None:
            events.append("shut down")

    before = signal.getsignal(signal.SIGTERM)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        with pytest.raises(Terminated), _terminate_raises(Runtime()) as value:
            events.append(f"body with {value}")
        assert events == ["started", "shut down"]
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    finally:
        after = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, before)
        Terminated.forget()
    # The handler in force before the block is back (the runtime's own, here).
    assert callable(after) and after is not before


def _raises_value_error() -> None:
    raise ValueError("the factory's own complaint")


def test_an_isolated_failure_names_its_type_unless_it_is_gpugovs_own() -> None:
    """The parent raises a child's failure as a ControllerError: an outside controller's
    ValueError read as 'ControllerError: the factory's own complaint' in a failed cell."""
    from gpugov.daemon.errors import ControllerError
    from gpugov.study.runners import run_isolated

    with pytest.raises(ControllerError, match=r"^ValueError: the factory's own complaint$"):
        run_isolated(_raises_value_error, "controller 'm:f'")

    def own() -> None:
        raise ControllerError("controller 'm:f': its factory takes no context")

    with pytest.raises(ControllerError, match=r"^controller 'm:f': its factory takes no"):
        run_isolated(own, "controller 'm:f'")
