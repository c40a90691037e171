"""Task functions for the runner tests: module-level, so a pool or Ray worker imports them."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpugov.study.sweep import run_cell as sweep_run_cell


def double(cell: int, shared: Mapping[str, Any]) -> int:
    """``2 * cell + shared["offset"]``."""
    return 2 * cell + int(shared.get("offset", 0))


def die_once(cell: tuple[int, str], shared: Mapping[str, Any]) -> int:
    """Kill this worker process the first time cell 1 runs (a marker file remembers), as
    an out-of-memory kill or a lost node would; every other run returns the cell's value."""
    value, marker = cell
    path = Path(marker)
    if value == 1 and not path.exists():
        path.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return 10 * value + int(shared.get("offset", 0))


def always_die(cell: int, shared: Mapping[str, Any]) -> int:
    """Kill this worker every time (a cell that can never finish)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return cell


def reject(cell: int, shared: Mapping[str, Any]) -> int:
    """Raise an input error from inside the task."""
    raise ValueError(f"cell {cell}: bad input")


def sweep_cell_dying_once(cell: Any, shared: Mapping[str, Any]) -> dict[str, Any]:
    """``gpugov sweep``'s cell, except that the first run of the cell named by
    ``$GPUGOV_TEST_KILL_CELL`` kills its worker (``$GPUGOV_TEST_KILL_MARKER`` remembers)."""
    marker = Path(os.environ["GPUGOV_TEST_KILL_MARKER"])
    if cell.label() == os.environ["GPUGOV_TEST_KILL_CELL"] and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return sweep_run_cell(cell, shared)


def sigint_state(cell: int, shared: Mapping[str, Any]) -> tuple[bool, bool]:
    """In a pool worker: (SIGINT ignored, SIGINT blocked)."""
    import signal

    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN, blocked


def sigterm_state(cell: int, shared: Mapping[str, Any]) -> tuple[bool, bool]:
    """In a pool worker: (SIGTERM at its default action, SIGTERM blocked)."""
    import signal

    blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, blocked
