"""A ``pynvml`` for a real ``gpugov`` process: the fake NVML with its state in a JSON file.

Put this folder first on ``PYTHONPATH`` and name the state file in
``$GPUGOV_FAKE_NVML_STATE``: ``import pynvml`` in the daemon then gets a
:class:`PersistentFakeNvml`, whose GPUs (locks, clocks, event reasons, lost flags), the
permission flag, the injected failures and delays are read from the file before every
call and written back after every change, under an ``flock``. So a second process (the
next daemon, ``gpugov reset-clocks``, the test itself) sees the locks the first one left,
and the test can inject errors at any call site while the daemon runs.

State file keys: ``gpus`` (list of FakeGpu fields), ``permission``, ``failures``
(``{"function" or "function@index": [code, times or null]}``), ``delays``
(``{"function": seconds}``) and ``writes`` (``[function, index, *args, unix time]``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "daemon"))

import fake_pynvml as _fp

STATE_ENV = "GPUGOV_FAKE_NVML_STATE"
PERSISTED = ("locked", "sm_clock_mhz", "event_reasons", "lost", "power_mw", "temperature_c")


def initial_state(gpus: int = 2) -> dict[str, Any]:
    """A fresh node: ``gpus`` unlocked fake H100s, root permission, no failures."""
    return {
        "gpus": [
            {
                "index": i,
                "locked": None,
                "sm_clock_mhz": 1980,
                "event_reasons": 0,
                "lost": False,
                "power_mw": 350_000,
                "temperature_c": 55,
            }
            for i in range(gpus)
        ],
        "permission": True,
        "failures": {},
        "delays": {},
        "writes": [],
    }


def write_state(path: str | Path, state: dict[str, Any]) -> None:
    """Replace the state file atomically."""
    path = Path(path)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=".nvml.")
    with os.fdopen(handle, "w") as out:
        json.dump(state, out)
    os.replace(name, path)


@contextlib.contextmanager
def locked_state(path: str | Path) -> Iterator[dict[str, Any]]:
    """Read, let the caller change, and write back the state, under an exclusive flock."""
    path = Path(path)
    with open(str(path) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(path.read_text())
            try:
                yield state
            finally:  # an injected NVML error is raised through here: keep its count
                write_state(path, state)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class PersistentFakeNvml(_fp.FakeNvml):
    """The fake NVML whose state lives in a file shared by every process."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        state = json.loads(self._path.read_text())
        super().__init__(len(state["gpus"]))
        self._state: dict[str, Any] = state
        self._depth = 0
        self._guard = threading.RLock()
        self._apply(state)

    def _apply(self, state: dict[str, Any]) -> None:
        for gpu, saved in zip(self.gpus, state["gpus"], strict=True):
            for name in PERSISTED:
                value = saved[name]
                setattr(gpu, name, tuple(value) if name == "locked" and value else value)
        self.permission = bool(state["permission"])

    def _collect(self, state: dict[str, Any]) -> None:
        for gpu, saved in zip(self.gpus, state["gpus"], strict=True):
            for name in PERSISTED:
                value = getattr(gpu, name)
                saved[name] = list(value) if isinstance(value, tuple) else value

    @contextlib.contextmanager
    def _session(self) -> Iterator[dict[str, Any]]:
        # NVML is thread-safe, and the daemon reads its domains' GPUs from several
        # threads: one thread's session at a time in this process (nested calls of that
        # thread reuse it), the flock for the other processes.
        with self._guard:
            if self._depth:
                yield self._state
                return
            with locked_state(self._path) as state:
                self._depth += 1
                try:
                    self._state = state
                    self._apply(state)
                    yield state
                finally:
                    self._collect(state)
                    self._depth -= 1

    def _enter(self, function: str, handle: Any = None) -> None:
        delay = 0.0
        with self._session() as state:
            delay = float(state["delays"].get(function, 0.0))
            keys = [function] if handle is None else [f"{function}@{handle.index}", function]
            for key in keys:
                failure = state["failures"].get(key)
                if failure is None:
                    continue
                code, times = failure
                if times is not None:
                    if times <= 1:
                        del state["failures"][key]
                    else:
                        failure[1] = times - 1
                self.calls[function] = self.calls.get(function, 0) + 1
                raise _fp.NVMLError(code)
            super()._enter(function, handle)
        if delay:
            time.sleep(delay)

    def _record(self, function: str, *args: Any) -> None:
        self._state["writes"].append([function, *args, time.time()])

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, low: int, high: int) -> None:
        with self._session():
            super().nvmlDeviceSetGpuLockedClocks(handle, low, high)
            self._record("lock", handle.index, int(low), int(high))

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        with self._session():
            super().nvmlDeviceResetGpuLockedClocks(handle)
            self._record("reset", handle.index)


if __name__ != "__main__" and os.environ.get(STATE_ENV):
    _instance = PersistentFakeNvml(os.environ[STATE_ENV])
    sys.modules[__name__] = _instance  # type: ignore[assignment]
