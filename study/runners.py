"""Where a study's independent cells run: in this process, a local process pool, or Ray.

One function, :func:`map_cells`, maps a picklable task function over cells and yields each
result as it finishes, whichever runner runs it. The scoreboard, ``gpugov sweep`` and
``gpugov experiments`` use it, so ``--jobs N`` (the default local pool) and ``--ray``
(a local Ray runtime, or an existing cluster) run the same tasks on the same inputs.

* Task functions take ``(cell, shared)``: ``cell`` is small and picklable; ``shared`` is a
  read-only mapping of the large inputs (loaded traces, profiles) that reach every worker
  by value, never as a path that exists only on the driver. The local pool hands them to
  each worker process once (fork); Ray puts each into its object store once and a worker
  fetches the ones its cell reads.
* A worker lost mid-task (killed, out of memory, its node gone) is retried up to
  ``retries`` times and reported through ``on_event``; every cell's result is yielded
  exactly once. Ray's own task retries are off (``max_retries=0``) so the driver sees,
  counts and reports each loss. A local pool cannot tell which cell killed it: every
  unfinished cell goes to a fresh pool, and the restarts are counted.
* An exception raised by the task function itself is not a lost worker: it propagates
  (Ray's wrapper is removed), so input errors still reach the user as one line.
* A cell may say how far it has got while it runs (:class:`CellProgress`: shared memory
  the local pool's forked workers inherit, and ``map_cells``' ``on_wait`` for the driver
  to look while it waits), so a long study shows a rate and an ETA before its first cell
  finishes; a cell on Ray counts when it finishes.
* Every cell runs with one BLAS/OpenMP thread, whatever the runner (Ray's workers do so
  by default): parallelism comes from the cells, and a cell's floating-point result (the
  SLSQP MPC's is sensitive to the summation order of multi-threaded BLAS) does not depend
  on the runner or on how many cores its machine has.

Ray is an optional extra (``pip install 'gpugov[ray]'``), imported only when asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import FrameType
from typing import Any, Generic, TypeVar

from gpugov.daemon import cli_types
from gpugov.daemon.cli_support import UsageError
from gpugov.daemon.errors import Terminated, one_line
from gpugov.daemon.limits import MAX_JOBS, MAX_RETRIES
from gpugov.daemon.stop_signals import signal_name

C = TypeVar("C")
R = TypeVar("R")
T = TypeVar("T")

TaskFunction = Callable[[Any, Mapping[str, Any]], Any]
"""``fn(cell, shared) -> result``; module-level (picklable by reference)."""

RAY_INSTALL_HINT = (
    "--ray needs Ray, which is not installed: pip install 'gpugov[ray]' (or: pip install ray)"
)
LOCAL_RAY = "local"
"""``--ray local`` starts a Ray runtime on this machine; anything else is an address."""
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024
"""Object store of a local Ray runtime: the shared inputs are a few MB; keep it small."""
DEFAULT_RETRIES = 2


class RunnerError(UsageError):
    """A runner cannot start, reach its cluster, or keep a cell's worker alive."""


@dataclass(frozen=True, slots=True)
class RunnerSpec:
    """How to run cells: ``jobs`` local processes, or Ray at ``ray_address``.

    Attributes:
        jobs: local worker processes (0: one per CPU, at most one per cell); with Ray
            and ``ray_address == "local"``, the CPUs given to the local Ray runtime.
        ray_address: None for the local pool; ``"local"`` to start a Ray runtime here;
            ``"auto"``, ``HOST:PORT`` or ``ray://HOST:PORT`` to join a cluster.
        retries: how often a cell whose worker was lost is run again.
    """

    jobs: int = 0
    ray_address: str | None = None
    retries: int = DEFAULT_RETRIES

    def __post_init__(self) -> None:
        if self.jobs < 0:
            raise UsageError(f"--jobs must be >= 0, got {self.jobs}")
        if self.retries < 0:
            raise UsageError(f"--retries must be >= 0, got {self.retries}")
        if self.ray_address is not None and not self.ray_address.strip():
            raise UsageError("--ray needs 'local', 'auto' or a cluster address")

    @property
    def kind(self) -> str:
        """``"ray"`` or ``"local"``."""
        return "ray" if self.ray_address is not None else "local"

    def describe(self) -> dict[str, Any]:
        """JSON-able description for a payload's provenance."""
        return {
            "kind": self.kind,
            "jobs": self.jobs,
            "ray_address": self.ray_address,
            "retries": self.retries,
        }


@dataclass(frozen=True, slots=True)
class CellDone(Generic[R]):
    """One finished cell: its index in the input, its result, and where it ran."""

    index: int
    value: R
    attempts: int
    worker: str


def worker_label() -> str:
    """``host:pid`` of the process running a cell."""
    return f"{socket.gethostname()}:{os.getpid()}"


RAY_ADDRESS_FORMS = "'local', 'auto', HOST:PORT or ray://HOST:PORT"


def check_runner(spec: RunnerSpec) -> None:
    """What a command checks of its runner before any work: with ``--ray``, Ray installed
    (the install hint) and the cluster's port answering (:func:`check_ray_reachable`)."""
    if spec.ray_address is not None:
        from gpugov.study.ray_cluster import check_ray_reachable, import_ray

        import_ray()
        check_ray_reachable(spec.ray_address)


@contextlib.contextmanager
def runner_ready(spec: RunnerSpec) -> Iterator[None]:
    """Ray joined (or started) until exit, SIGTERM handled as in :func:`map_cells`, which
    reuses it: a command makes its output only once Ray is there (local pool: nothing)."""
    if spec.ray_address is None:
        yield
        return
    from gpugov.study.ray_cluster import RayRuntime, check_ray_reachable

    check_ray_reachable(spec.ray_address)
    with _terminate_raises(RayRuntime(spec)):
        yield


def add_runner_arguments(
    parser: Any,
    *,
    jobs: bool = True,
    jobs_help: str = "local worker processes (default: one per CPU)",
) -> None:
    """``--ray ADDRESS`` and ``--retries N`` (and ``--jobs N`` unless the caller has it)."""
    if jobs:
        parser.add_argument(
            "--jobs",
            type=cli_types.count(1, MAX_JOBS),
            default=None,
            metavar="N",
            help=jobs_help,
        )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run the cells as Ray tasks: 'local' starts a Ray runtime on this machine "
        "(--jobs CPUs), 'auto' or HOST:PORT joins a running cluster (needs gpugov[ray])",
    )
    parser.add_argument(
        "--retries",
        type=cli_types.count(0, MAX_RETRIES),
        default=DEFAULT_RETRIES,
        metavar="N",
        help=f"runs again a cell whose worker died, up to N times (default {DEFAULT_RETRIES})",
    )


def spec_from_args(args: Any) -> RunnerSpec:
    """The :class:`RunnerSpec` of parsed ``--jobs``/``--ray``/``--retries`` arguments; a
    malformed ``--ray`` address is a :class:`RunnerError` here, before any work."""
    address = getattr(args, "ray", None)
    if address is not None:
        from gpugov.study.ray_cluster import ray_endpoint

        ray_endpoint(address)
    return RunnerSpec(
        jobs=getattr(args, "jobs", None) or 0,
        ray_address=address,
        retries=getattr(args, "retries", DEFAULT_RETRIES),
    )


def single_threaded() -> Any:
    """A context in which BLAS and OpenMP use one thread (``threadpoolctl``, which comes
    with scikit-learn)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


WAIT_S = 1.0
"""How often the driver calls ``map_cells``' ``on_wait`` while it waits for cells."""


_ISOLATED_FROM: int | None = None
"""In a :func:`run_isolated` child, the process it was forked from (else None)."""


class CellProgress:
    """How far each cell has got while it runs (in any unit, e.g. simulated seconds),
    readable by the driver before the cell finishes: one slot per cell key, so that a cell
    run again after a lost worker overwrites its own count instead of adding to it.

    The slots are shared memory the local pool's forked workers inherit; a cell run in
    this process reports to the driver at once (``on_report``, called in the driver's
    process only). A copy sent to another process by value (a Ray worker) counts nothing:
    its cells show no progress until they finish (the driver :meth:`report` s them then).
    """

    def __init__(self, keys: Sequence[str], on_report: Callable[[], None] | None = None) -> None:
        self.slots = {key: index for index, key in enumerate(keys)}
        if len(self.slots) != len(keys):
            raise ValueError("cell keys must be distinct")
        self.on_report = on_report
        self._driver_pid = os.getpid()
        self._done: Any = multiprocessing.get_context("fork").Array("d", max(len(keys), 1))

    def report(self, key: str, done: float) -> None:
        """Record that the cell ``key`` has done ``done`` (its total so far)."""
        if self._done is None:  # a copy in another process (Ray): nothing to report to
            return
        self._done[self.slots[key]] = done
        # The driver, or its run_isolated child (the driver waits on it meanwhile).
        driver = os.getpid() == self._driver_pid or self._driver_pid == _ISOLATED_FROM
        if self.on_report is not None and driver:
            self.on_report()

    def total(self) -> float:
        """The sum over every cell of what it reported."""
        return 0.0 if self._done is None else float(sum(self._done[:]))

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent by value (a Ray worker's copy): detached, its reports go nowhere."""
        return (_detached_progress, (list(self.slots),))


def _detached_progress(keys: list[str]) -> CellProgress:
    """A :class:`CellProgress` whose reports count nothing (a copy in another process)."""
    progress = CellProgress.__new__(CellProgress)
    progress.slots = {key: index for index, key in enumerate(keys)}
    progress.on_report = None
    progress._driver_pid = -1
    progress._done = None
    return progress


def _finished_in_turn(
    futures: Mapping[Future[Any], int], on_wait: Callable[[], None] | None
) -> Iterator[Future[Any]]:
    """The futures as they finish (``as_completed``), with ``on_wait`` called every
    :data:`WAIT_S` while none does."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=WAIT_S, return_when=FIRST_COMPLETED)
        if not done and on_wait is not None:
            on_wait()
        yield from done


# ----------------------------------------------------------------------- in-process
def _serial(
    fn: TaskFunction, cells: Sequence[Any], order: Sequence[int], shared: Mapping[str, Any]
) -> Iterator[CellDone[Any]]:
    for index in order:
        with single_threaded():
            value = fn(cells[index], shared)
        yield CellDone(index, value, 1, worker_label())


# ----------------------------------------------------------------------- local pool
_WORKER_SHARED: Mapping[str, Any] = {}


_POOL_SIGNALS = {signal.SIGINT, signal.SIGTERM}
"""Blocked while the pool forks its workers (:func:`_submit_all`)."""
PR_SET_PDEATHSIG = 1
"""Linux ``prctl`` option: the signal a process gets when the thread that forked it dies."""


def _set_worker_shared(shared: Mapping[str, Any], parent_pid: int) -> None:
    """Worker initialiser: the shared inputs, one BLAS thread, SIGINT ignored (the parent
    alone handles Ctrl-C and ends the workers, so none prints a traceback), SIGTERM back
    to its default (the parent's raises, :func:`_terminate_raises`), and the worker ends
    with its parent however the parent ends (:func:`_die_with_parent`)."""
    global _WORKER_SHARED
    _WORKER_SHARED = shared
    _child_of(parent_pid)
    try:
        single_threaded()  # stays in force for the worker's life
    except Exception as error:  # the pool would log a traceback per worker
        print(f"gpugov: a worker process could not start: {error!r}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)  # the pool breaks: its cells are retried, then RunnerError


def run_isolated(work: Callable[[], T], who: str) -> T:
    """``work()`` in a forked child process, its value (picklable) returned here: outside
    code that ends its process (``os._exit``, a segfault or abort in compiled code) ends
    the child only, and what it changes in its module's state stays in the child, so the
    next call starts from this process's state whatever ran before or where (``--jobs``,
    Ray). The child ignores Ctrl-C and ends with this process, as a pool's worker does;
    this process ends it on Ctrl-C or SIGTERM.

    Raises:
        ControllerError: what ``work`` raised, as one line of its message; or the child
            ended without an answer (one line naming ``who`` and its exit code or
            signal).
    """
    from gpugov.daemon.errors import ControllerError

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    parent = os.getpid()
    child = context.Process(target=_isolated_child, args=(work, send, parent))
    child.start()
    send.close()
    try:
        try:
            status, value = receive.recv()
        except EOFError:
            child.join()
            code = child.exitcode
            how = (
                f"signal {signal_name(-code)}"
                if code is not None and code < 0
                else f"exit code {code}"
            )
            raise ControllerError(f"{who} ended its process ({how}) before it answered") from None
        child.join()
    finally:
        receive.close()
        if child.is_alive():  # Ctrl-C, SIGTERM or an error here: the child goes too
            child.terminate()
            child.join()
    if status == "error":
        raise ControllerError(value)
    return value  # type: ignore[no-any-return]


def _isolated_child(work: Callable[[], Any], send: Any, parent: int) -> None:
    """:func:`run_isolated`'s child: Ctrl-C is the parent's, SIGTERM ends it, it ends with
    the parent; runs ``work`` and sends ``("ok", value)`` or ``("error", message)``, then
    exits at once (no cleanup of the parent's that it inherited runs twice)."""
    global _ISOLATED_FROM
    _ISOLATED_FROM = parent
    _child_of(parent)
    answer: tuple[str, Any]
    try:
        answer = ("ok", work())
    except BaseException as error:  # outside code: any failure is its own, said in a line
        answer = ("error", _one_line(error))
    try:
        send.send(answer)
    except BaseException as error:  # an answer that does not pickle
        send.send(("error", f"its result could not be sent back: {one_line(error)}"))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _one_line(error: BaseException) -> str:
    """``error`` as one line for the parent, its type named unless it is gpugov's own
    (whose message already says what failed): the parent raises it as a
    ``ControllerError``, and an outside controller's ``ValueError`` read as one. A
    :class:`~daemon.cli_support.UsageError` (a refused ``--controller``) is gpugov's too,
    and so is the plant's ``ControllerError`` (a controller that raised, named with the
    time it did: read as ``ControllerError: ControllerError: ...``)."""
    from gpugov.daemon.cli_support import UsageError
    from gpugov.daemon.errors import GpugovError
    from gpugov.plant.closed_loop import ControllerError as PlantControllerError

    message = one_line(error)
    own = GpugovError | UsageError | PlantControllerError
    if isinstance(error, own) or message == type(error).__name__:
        return message
    return f"{type(error).__name__}: {message}"


def _child_of(parent_pid: int) -> None:
    """A forked worker's signals: Ctrl-C ignored (the parent alone handles it and ends its
    workers), SIGTERM back to its default, both unblocked (forked with them blocked,
    :func:`_submit_all`), and the worker ends with its parent (:func:`_die_with_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _POOL_SIGNALS)
    _die_with_parent(parent_pid)


def _die_with_parent(parent_pid: int) -> None:
    """On Linux, have the kernel send this worker SIGTERM when its parent dies, even of
    SIGKILL or the OOM killer, whose death runs no cleanup of ours: a worker left behind
    would run its cell to the end on a machine the user thinks is free. Elsewhere nothing
    (the parent's cleanup still ends the workers on Ctrl-C and SIGTERM)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the parent's cleanup only
        return
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request took effect


@contextlib.contextmanager
def _terminate_raises(
    first: contextlib.AbstractContextManager[T] | None = None,
) -> Iterator[T | None]:
    """While a pool runs, SIGTERM raises :class:`~daemon.errors.Terminated` in this
    (main) thread, so that the pool's cleanup ends its workers before the command exits;
    SIGTERM's default action would kill this process alone and leave them running.

    ``first`` (a runtime to start, :class:`RayRuntime`) is entered with SIGTERM blocked
    and left after the handler is restored: a SIGTERM during its start (Ray installs a
    handler of its own there, which exits without shutting the runtime down) waits until
    this handler is in place, then unwinds through its exit. The mask is per thread: it
    holds the signal for this thread and the threads the runtime starts meanwhile (a
    gpugov command has no other thread before it). Yields what ``first`` yields. Elsewhere
    than the main thread SIGTERM is left as it is."""
    with contextlib.ExitStack() as stack:
        if threading.current_thread() is not threading.main_thread():
            yield None if first is None else stack.enter_context(first)
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            raise Terminated.now(workers=True)

        with signals_blocked({signal.SIGTERM}):  # a pending one raises once unblocked
            value = None if first is None else stack.enter_context(first)
            previous = signal.signal(signal.SIGTERM, handler)
            stack.callback(signal.signal, signal.SIGTERM, previous)
        yield value


@contextlib.contextmanager
def signals_blocked(signals: set[signal.Signals]) -> Iterator[None]:
    """``signals`` blocked in this thread, if it is the main one (where Python runs its
    handlers), the previous mask restored after: one that came meanwhile is delivered
    then."""
    masked = hasattr(signal, "pthread_sigmask") and (
        threading.current_thread() is threading.main_thread()
    )
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals) if masked else None
    try:
        yield
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _submit_all(
    pool: ProcessPoolExecutor, fn: TaskFunction, cells: Sequence[Any], pending: Sequence[int]
) -> tuple[dict[Any, int], list[int]]:
    """Submit every pending cell with SIGINT and SIGTERM blocked; the futures by cell, and
    the cells left unsubmitted because the pool broke meanwhile (a worker died already).
    The executor forks its workers on the first submit: a Ctrl-C or SIGTERM in the middle
    would interrupt a child in its at-fork handlers (before its initialiser sets its own
    handling) or leave a worker the executor does not list yet, which nothing ends, and
    the command would hang instead of exiting. A signal that came meanwhile is delivered
    once the mask is restored."""
    futures: dict[Any, int] = {}
    with signals_blocked(_POOL_SIGNALS):
        for position, index in enumerate(pending):
            try:
                futures[pool.submit(_pool_task, fn, cells[index])] = index
            except BrokenProcessPool:
                return futures, list(pending[position:])
    return futures, []


def _pool_task(fn: TaskFunction, cell: Any) -> tuple[Any, str]:
    return fn(cell, _WORKER_SHARED), worker_label()


def _pool(
    fn: TaskFunction,
    cells: Sequence[Any],
    order: Sequence[int],
    shared: Mapping[str, Any],
    jobs: int,
    retries: int,
    say: Callable[[str], None],
    on_wait: Callable[[], None] | None = None,
) -> Iterator[CellDone[Any]]:
    """Cells over a fork pool; a broken pool (a worker died) is replaced, its unfinished
    cells resubmitted, at most ``retries`` times. SIGTERM raises meanwhile
    (:func:`_terminate_raises`), so the workers are ended before the command exits."""
    with _terminate_raises():
        context = multiprocessing.get_context("fork")
        pending = list(order)
        restarts = 0
        while pending:
            pool = ProcessPoolExecutor(
                max_workers=min(jobs, len(pending)),
                mp_context=context,
                initializer=_set_worker_shared,
                initargs=(shared, os.getpid()),
            )
            finished = False
            try:
                futures, lost = _submit_all(pool, fn, cells, pending)
                for future in _finished_in_turn(futures, on_wait):
                    index = futures[future]
                    try:
                        value, worker = future.result()
                    except BrokenProcessPool:
                        lost.append(index)
                        continue
                    yield CellDone(index, value, restarts + 1, worker)
                finished = True
            finally:
                if finished:
                    pool.shutdown(wait=True, cancel_futures=True)
                else:
                    # Ctrl-C, SIGTERM or an error here: the executor's shutdown would wait
                    # for the running cells, so end the workers now and exit at once.
                    processes = list(getattr(pool, "_processes", {}).values())
                    call_queue = getattr(pool, "_call_queue", None)
                    if call_queue is not None:
                        # Its feeder thread may be blocked writing a cell to a pipe that no
                        # worker will read again; the interpreter's exit would wait for it.
                        call_queue.cancel_join_thread()
                    pool.shutdown(wait=False, cancel_futures=True)
                    for process in processes:
                        process.terminate()
                    for process in processes:
                        process.join(timeout=5.0)
            if not lost:
                return
            restarts += 1
            if restarts > retries:
                raise RunnerError(
                    f"a worker process died {restarts} times; {len(lost)} cell(s) unfinished "
                    f"(raise --retries, or look for memory exhaustion)"
                )
            say(
                f"a worker process died; running its pool's {len(lost)} unfinished cell(s) "
                f"again in a new pool (retry {restarts}/{retries})"
            )
            pending = [i for i in order if i in set(lost)]


# -------------------------------------------------------------------------- public
def map_cells(
    fn: TaskFunction,
    cells: Sequence[C],
    *,
    spec: RunnerSpec | None = None,
    shared: Mapping[str, Any] | None = None,
    order: Sequence[int] | None = None,
    on_event: Callable[[str], None] | None = None,
    label: Callable[[Any], str] = str,
    on_wait: Callable[[], None] | None = None,
) -> Iterator[CellDone[Any]]:
    """Run ``fn(cell, shared)`` for every cell; yield each result as it finishes.

    Args:
        fn: a module-level task function (picklable by reference).
        cells: the cells (small, picklable).
        spec: the runner (default: a local pool, one process per CPU).
        shared: large read-only inputs every task may read, by value.
        order: submission order (indices into ``cells``; default: as given), e.g.
            longest first.
        on_event: receives one line per lost worker and retry.
        label: names a cell in those lines.
        on_wait: called every :data:`WAIT_S` while the driver waits for cells that run
            in other processes (a progress line fed by a :class:`CellProgress`).

    Yields:
        :class:`CellDone` per cell, exactly once each, in completion order.

    Raises:
        RunnerError: Ray missing or unreachable, or a cell lost its worker more than
            ``spec.retries`` times.
        Exception: whatever ``fn`` raised (the first failing cell's, Ray's wrapper removed).
    """
    spec = spec or RunnerSpec()
    shared = dict(shared or {})
    order = list(range(len(cells))) if order is None else list(order)
    if sorted(order) != list(range(len(cells))):
        raise ValueError("order must be a permutation of the cells' indices")
    say = on_event or (lambda line: None)
    if not cells:
        return iter(())
    if spec.ray_address is not None:
        from gpugov.study.ray_cluster import import_ray, map_on_ray

        import_ray()  # the install hint now, before any work
        return map_on_ray(fn, cells, order, shared, spec, say, label, on_wait)
    jobs = spec.jobs or min(len(cells), os.cpu_count() or 1)
    if jobs <= 1 or len(cells) <= 1:
        return _serial(fn, cells, order, shared)
    return _pool(fn, cells, order, shared, jobs, spec.retries, say, on_wait)


__all__ = [
    "LOCAL_RAY",
    "RAY_ADDRESS_FORMS",
    "RAY_INSTALL_HINT",
    "CellDone",
    "CellProgress",
    "RunnerError",
    "RunnerSpec",
    "add_runner_arguments",
    "check_runner",
    "map_cells",
    "run_isolated",
    "runner_ready",
    "signals_blocked",
    "single_threaded",
    "spec_from_args",
    "worker_label",
]
