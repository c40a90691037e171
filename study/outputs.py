"""An offline command's output directory, replaced as a whole: the files of a run are
written under ``DIR/.partial/`` and moved into ``DIR`` only once every one is written.

A run stopped midway (Ctrl-C, SIGTERM, an error) leaves ``DIR`` as it was: the earlier
run's files, whole, and no ``.partial``. A run killed outright (SIGKILL, the OOM killer),
which runs no cleanup, leaves them too, beside a ``DIR/.partial/`` that marks the
unfinished run; the next run into ``DIR`` removes it. The move itself is a rename per
file with Ctrl-C and SIGTERM held until it is done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

from gpugov.study.runners import signals_blocked

PARTIAL = ".partial"
"""Where a run's files are written until the run is complete (under ``DIR``)."""


@contextlib.contextmanager
def staged_outputs(out: Path, *, created: bool = False, flag: str = "--out") -> Iterator[Path]:
    """Yield ``out/.partial`` to write a run's files in; when the block ends normally,
    move each into ``out`` at the same relative path (replacing an earlier run's file of
    that name; other files in ``out`` are left alone). When it raises, remove what was
    written, and ``out`` itself where ``created`` (the command made it) and it is empty.

    ``out`` is held (an exclusive ``flock`` on the directory) for the whole block.

    Raises:
        UsageError: another run holds ``out`` (named by ``flag``), before anything in it
            is touched.
    """
    with held_output_dir(out, flag):
        yield from _staged(out, created=created)


@contextlib.contextmanager
def held_output_dir(out: Path, flag: str = "--out") -> Iterator[None]:
    """Hold the directory ``out`` (which exists) for one run. Two ``experiments`` runs into
    one directory shared its ``.partial``: the second removed the first's at its start,
    and the first's move took the second's files, so ``out`` held a mix of both runs and
    the other failed on a missing file; two ``sweep --resume`` runs each ran the cells
    not yet done, twice.

    Raises:
        UsageError: another run holds it (named by ``flag``).
    """
    import fcntl

    from gpugov.daemon.cli_support import UsageError

    handle = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"{flag} {out}: another run is writing its outputs there; wait for it to "
                f"end, or give another {flag}"
            ) from None
        except OSError:
            pass  # no lock to take here (a filesystem without flock): run unheld
        yield
    finally:
        os.close(handle)


def _staged(out: Path, *, created: bool) -> Iterator[Path]:
    """:func:`staged_outputs`' body, once ``out`` is held."""
    staging = out / PARTIAL
    shutil.rmtree(staging, ignore_errors=True)  # a run killed outright left it
    staging.mkdir()
    try:
        yield staging
        with signals_blocked({signal.SIGINT, signal.SIGTERM}):
            _move_into(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty: nothing of the user's goes
        raise
    shutil.rmtree(staging, ignore_errors=True)


def _move_into(staging: Path, out: Path) -> None:
    """Rename every file under ``staging`` to the same place under ``out``."""
    for path in sorted(staging.rglob("*")):
        if path.is_dir():
            continue
        target = out / path.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)


__all__ = ["PARTIAL", "held_output_dir", "staged_outputs"]
