"""The Ray side of :mod:`gpugov.study.runners`: the address forms ``--ray`` takes and a
cluster's reachability, the runtime joined or started, and the cells run as Ray tasks.

Ray is an optional extra (``pip install 'gpugov[ray]'``), imported only when asked for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

from gpugov import __version__
from gpugov.daemon import cli_types
from gpugov.daemon.errors import printable
from gpugov.study import runners
from gpugov.study.runners import (
    LOCAL_OBJECT_STORE_BYTES,
    LOCAL_RAY,
    RAY_ADDRESS_FORMS,
    RAY_INSTALL_HINT,
    CellDone,
    RunnerError,
    RunnerSpec,
    TaskFunction,
    _terminate_raises,
    worker_label,
)


def import_ray() -> ModuleType:
    """The ``ray`` module, or :class:`RunnerError` with the one-line install hint."""
    try:
        import ray
    except ImportError as error:
        raise RunnerError(RAY_INSTALL_HINT) from error
    return ray


RAY_CONNECT_TIMEOUT_S = 5.0
"""How long :func:`check_ray_reachable` waits for a cluster's port to answer."""


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` that ``--ray ADDRESS`` names (None for ``local`` and ``auto``);
    :class:`RunnerError` for any other form, found without importing Ray."""
    if address in (LOCAL_RAY, "auto"):
        return None
    rest = address.removeprefix("ray://")
    host, _, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # [IPv6]:PORT
        host = host[1:-1]
    elif ":" in host:
        host = ""
    if (
        "://" in rest
        or not host
        or any(char.isspace() or char in "/[]@" for char in host)
        or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536)
    ):
        raise RunnerError(f"--ray {address}: not a Ray address; use {RAY_ADDRESS_FORMS}")
    return host, int(port)


def _auto_address() -> str | None:
    """The cluster ``--ray auto`` joins when the environment names one (``RAY_ADDRESS``
    as HOST:PORT or ray://HOST:PORT); None when Ray finds it itself (unset, ``auto``)."""
    named = os.environ.get("RAY_ADDRESS", "").strip()
    return None if named in ("", "auto", LOCAL_RAY) else named


def check_ray_reachable(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """:class:`RunnerError` in seconds for a bad address or a port that does not answer,
    which ``ray.init`` would retry for many minutes: ``--ray HOST:PORT``, or the
    ``RAY_ADDRESS`` that ``--ray auto`` joins (``local`` and a plain ``auto`` are Ray's)."""
    if address == "auto" and (named := _auto_address()) is not None:
        try:
            ray_endpoint(named)
        except RunnerError as error:
            _, colon, written = named.rpartition(":")
            if colon and written.isascii() and written.isdigit():
                # HOST:PORT with no port there (99999, 0): ray.init retried it for good.
                said = str(error).removeprefix(f"--ray {named}: ")
                raise RunnerError(f"--ray auto: RAY_ADDRESS={printable(named)}: {said}") from None
            return  # a form Ray may read otherwise: left to it
        try:
            check_ray_reachable(named, timeout_s)
        except RunnerError as error:
            said = str(error).removeprefix(f"--ray {named}: ")
            raise RunnerError(f"--ray auto: RAY_ADDRESS={printable(named)}: {said}") from error
        return
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    host, port = endpoint
    hosts = [host]
    if not address.startswith("ray://") and cli_types.is_loopback(host):
        # ray.init joins a loopback address at this node's IP, where the head may listen.
        with contextlib.suppress(Exception):
            hosts.append(import_ray().util.get_node_ip_address())
    problem = ""
    for candidate in hosts:
        try:
            socket.create_connection((candidate, port), timeout=timeout_s).close()
            return
        except TimeoutError:
            problem = problem or f"no answer from port {port} within {timeout_s:g} s"
        except OSError as error:
            problem = problem or (error.strerror or str(error))
    raise RunnerError(f"--ray {address}: cannot join Ray: {problem}")


_RAY_FETCHED: dict[str, Any] = {}
"""Shared values this worker process fetched, by object id (kept for its next cells)."""
_RAY_FETCHED_LIMIT = 16


class RayShared(Mapping[str, Any]):
    """The shared inputs as object-store references; a worker fetches a value the first
    time one of its cells reads it and keeps it for the next cells in the same process."""

    def __init__(self, refs: Mapping[str, Any]) -> None:
        self.refs = dict(refs)

    def __getitem__(self, key: str) -> Any:
        ref = self.refs[key]
        name = ref.hex()
        if name not in _RAY_FETCHED:
            if len(_RAY_FETCHED) >= _RAY_FETCHED_LIMIT:
                _RAY_FETCHED.pop(next(iter(_RAY_FETCHED)))
            _RAY_FETCHED[name] = import_ray().get(ref)
        return _RAY_FETCHED[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.refs)

    def __len__(self) -> int:
        return len(self.refs)


def _ray_task(fn: TaskFunction, cell: Any, shared: Mapping[str, Any]) -> tuple[Any, str, str]:
    with runners.single_threaded():
        return fn(cell, shared), worker_label(), __version__


class RayRuntime:
    """Context manager: connect to (or start) Ray; shut down only what it started.

    A runtime already initialised in this process (a test's shared fixture, a notebook)
    is used as it is and left running.
    """

    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec
        self.ray = import_ray()
        self.started = False
        self._neutral_dir: str | None = None

    def __enter__(self) -> RayRuntime:
        ray = self.ray
        if ray.is_initialized():
            return self
        address = self.spec.ray_address
        options: dict[str, Any] = {
            "logging_level": logging.WARNING,
            "log_to_driver": False,
            "configure_logging": True,
        }
        # ray.init puts the driver's working directory first on every worker's sys.path
        # (and a local runtime's processes start there). From a gpugov checkout, whose
        # gpugov/ folder holds only the root package, a worker would import that folder
        # instead of the installed package. So Ray starts from an empty directory, kept
        # until the runtime is shut down.
        self._neutral_dir = tempfile.mkdtemp(prefix="gpugov-ray-")
        previous = os.getcwd()
        os.chdir(self._neutral_dir)
        try:
            if address == LOCAL_RAY:
                # A runtime for this machine alone: its processes talk over loopback.
                ray.init(
                    address="local",
                    num_cpus=self.spec.jobs or os.cpu_count() or 1,
                    include_dashboard=False,
                    object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                    _node_ip_address="127.0.0.1",
                    **options,
                )
            else:
                ray.init(address=address, **options)
        except BaseException as error:
            self._remove_neutral_dir()
            if not isinstance(error, ConnectionError | RuntimeError | ValueError):
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            if address == "auto" and isinstance(error, ConnectionError):
                # Ray's own line asks for an --address flag no gpugov command takes.
                first = (
                    "no running Ray cluster found (start one with 'ray start --head', "
                    "set RAY_ADDRESS, or use --ray local)"
                )
            raise RunnerError(f"--ray {address}: cannot start or join Ray: {first}") from error
        finally:
            os.chdir(previous)
        self.started = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False
        self._remove_neutral_dir()

    def _remove_neutral_dir(self) -> None:
        """Remove the empty directory Ray was started from (once Ray is down)."""
        if self._neutral_dir is not None:
            shutil.rmtree(self._neutral_dir, ignore_errors=True)
            self._neutral_dir = None

    def cpus(self) -> int:
        """CPUs the runtime offers to tasks."""
        return int(self.ray.cluster_resources().get("CPU", 0))


def _lost_worker_errors(ray: ModuleType) -> tuple[type[BaseException], ...]:
    names = (
        "WorkerCrashedError",
        "NodeDiedError",
        "LocalRayletDiedError",
        "ObjectLostError",
        "ActorDiedError",
    )
    found = [getattr(ray.exceptions, name, None) for name in names]
    return tuple(kind for kind in found if isinstance(kind, type))


def map_on_ray(
    fn: TaskFunction,
    cells: Sequence[Any],
    order: Sequence[int],
    shared: Mapping[str, Any],
    spec: RunnerSpec,
    say: Callable[[str], None],
    label: Callable[[Any], str],
    on_wait: Callable[[], None] | None = None,
) -> Iterator[CellDone[Any]]:
    """:func:`~gpugov.study.runners.map_cells` on Ray: each cell a task, the shared inputs
    put in the object store once, a lost worker's cell run again up to ``spec.retries``."""
    # SIGTERM as on the local pool (ray.init's own handler dumps a stack and exits
    # without a shutdown): ``Terminated`` unwinds through the runtime's shutdown.
    with _terminate_raises(RayRuntime(spec)) as runtime:
        assert runtime is not None
        ray = runtime.ray
        lost_errors = _lost_worker_errors(ray)
        handle = RayShared({key: ray.put(value) for key, value in shared.items()})
        remote = ray.remote(max_retries=0, num_cpus=1)(_ray_task)
        attempts: dict[int, int] = {}
        pending: dict[Any, int] = {}

        def submit(index: int) -> None:
            attempts[index] = attempts.get(index, 0) + 1
            pending[remote.remote(fn, cells[index], handle)] = index

        for index in order:
            submit(index)
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=runners.WAIT_S)
                if not ready and on_wait is not None:
                    on_wait()
                for ref in ready:
                    index = pending.pop(ref)
                    try:
                        value, worker, version = ray.get(ref)
                    except lost_errors as error:
                        if attempts[index] > spec.retries:
                            raise RunnerError(
                                f"cell {label(cells[index])}: worker lost "
                                f"{attempts[index]} times ({type(error).__name__}); giving up"
                            ) from error
                        say(
                            f"cell {label(cells[index])}: worker lost "
                            f"({type(error).__name__}); running it again "
                            f"(retry {attempts[index]}/{spec.retries})"
                        )
                        submit(index)
                        continue
                    except ray.exceptions.RayTaskError as error:
                        cause = getattr(error, "cause", None)
                        if isinstance(cause, BaseException):
                            raise cause from None
                        raise
                    if version != __version__:
                        raise RunnerError(
                            f"--ray {spec.ray_address}: worker {worker} runs gpugov {version}, "
                            f"this driver {__version__}; install the same version on the cluster"
                        )
                    yield CellDone(index, value, attempts[index], worker)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)


__all__ = [
    "RAY_CONNECT_TIMEOUT_S",
    "RayRuntime",
    "RayShared",
    "check_ray_reachable",
    "import_ray",
    "map_on_ray",
    "ray_endpoint",
]
