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
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpugov.daemon.files import remove_left_temporaries
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
def held_output_dir(out: Path, flag: str = "--out", outputs: Iterable[str] = ()) -> Iterator[None]:
    """Hold the directory ``out`` (which exists) for one run: an exclusive ``flock`` on
    the directory itself, which the kernel releases when the run ends, however it ends
    (SIGKILL included), and which puts no file in ``out``. Two ``experiments`` runs into
    one directory shared its ``.partial``: the second removed the first's at its start,
    and the first's move took the second's files, so ``out`` held a mix of both runs and
    the other failed on a missing file; two ``sweep --resume`` runs each ran the cells
    not yet done, twice; two ``bench controllers`` or ``fleet`` runs each wrote their
    files over the other's, with no word of it.

    A directory this process holds already (``bench controllers --report DIR`` with
    ``--out DIR``, or its ``--layout both``) is held again at no cost. A process forked
    meanwhile (a local pool's worker) does not keep the hold: the run's own end lets
    ``out`` go, not its last worker's.

    ``outputs``: the names of the files the run writes in ``out`` (each with
    :func:`~gpugov.daemon.files.write_files_atomic`). Once ``out`` is held, the temporary
    files a run killed outright mid-write left beside them (``.NAME.`` and 8 hex digits,
    which no reader takes for an output, but which nothing else removes) are removed.

    Raises:
        OutputDirectoryHeld: another run holds it (named by ``flag``, with the holder's
            pid where ``/proc/locks`` shows it).
    """
    import fcntl

    from gpugov.daemon.cli_outputs import OutputDirectoryHeld

    handle = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    key = _file_key(handle)
    if key in _HELD:  # this run holds it already
        os.close(handle)
        yield
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputDirectoryHeld(
                f"{flag} {out}: another run is writing its outputs there "
                f"({_holder(handle)}); wait for it to end, or give another {flag}",
                out,
            ) from None
        except OSError:
            pass  # no lock to take here (a filesystem without flock): run unheld
        else:  # no other run of ours writes them now
            for name in outputs:
                remove_left_temporaries(out / name)
        _HELD[key] = handle
        try:
            yield
        finally:
            _HELD.pop(key, None)
    finally:
        os.close(handle)


_HELD: dict[tuple[int, int], int] = {}
"""The directories this process holds (device, inode), and the descriptor of each."""


def _file_key(handle: int) -> tuple[int, int]:
    """The open file's device and inode."""
    status = os.fstat(handle)
    return status.st_dev, status.st_ino


def _drop_holds_in_child() -> None:
    """In a forked child: close its copies of the held directories' descriptors, so that
    the hold ends with the process that took it (a worker outliving a killed run by a
    moment kept ``out`` held, and the next run refused, for that moment)."""
    for handle in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(handle)
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_holds_in_child)


def _holder(handle: int) -> str:
    """``pid N`` of the process holding the ``flock`` on ``handle``'s file, as
    ``/proc/locks`` lists it, or ``pid unknown`` (no ``/proc``, a holder in another pid
    namespace, or gone meanwhile)."""
    status = os.fstat(handle)
    device = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return "pid unknown"
    pids: dict[str, list[str]] = {}  # by device, of the flocks on this inode
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 31051 fe:00:2245141 0 EOF"; a waiter's has "->"
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit():
            continue
        where, _, inode = fields[5].rpartition(":")
        if inode == str(status.st_ino) and fields[4] != "0":
            pids.setdefault(where, []).append(fields[4])
    found = pids.get(device) or (next(iter(pids.values())) if len(pids) == 1 else [])
    # A filesystem whose stat() device is not its superblock's (btrfs): the inode alone.
    return f"pid {found[0]}" if found else "pid unknown"


def check_replaceable(flag: str, out: Path, path: Path) -> None:
    """Refuse, before any work, an output ``path`` of a run into ``out`` that a written
    file cannot replace: a directory (or a link to one), a device, a FIFO. The write at
    the run's end failed there, after all its work, and a set written together (a
    sweep's summaries, a fleet's report) was left half replaced.

    Raises:
        UsageError: naming ``flag``, ``out`` and the path.
    """
    from gpugov.daemon.cli_support import UsageError

    if not os.path.exists(path) or os.path.isfile(path):
        return
    what = "a directory" if os.path.isdir(path) else "not a regular file"
    raise UsageError(
        f"{flag} {out}: {path} is {what}, which the run's output file cannot replace; "
        f"move it away or choose another {flag}"
    )


def _staged(out: Path, *, created: bool) -> Iterator[Path]:
    """:func:`staged_outputs`' body, once ``out`` is held."""
    staging = out / PARTIAL
    shutil.rmtree(staging, ignore_errors=True)  # a run killed outright left it
    staging.mkdir()
    try:
        try:
            yield staging
        except OSError as error:  # a full disk: named as the file in DIR, never .partial
            named = _named_in(error, staging, out)
            if named is error:
                raise
            raise named from error
        with signals_blocked({signal.SIGINT, signal.SIGTERM}):
            _move_into(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty: nothing of the user's goes
        raise
    shutil.rmtree(staging, ignore_errors=True)


def _named_in(error: OSError, staging: Path, out: Path) -> OSError:
    """``error`` with a file under ``staging`` named as its place under ``out`` (where
    the user will look for it); else ``error`` as it is."""
    if error.filename is None or not error.errno:
        return error
    try:
        relative = Path(os.fsdecode(error.filename)).relative_to(staging)
    except ValueError:
        return error
    return OSError(error.errno, error.strerror, str(out / relative))


def _move_into(staging: Path, out: Path) -> None:
    """Rename every file under ``staging`` to the same place under ``out``."""
    for path in sorted(staging.rglob("*")):
        if path.is_dir():
            continue
        target = out / path.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)


__all__ = ["PARTIAL", "check_replaceable", "held_output_dir", "staged_outputs"]
