"""The one atomic writer of every output file gpugov writes: a temporary file beside the
target (``.NAME.`` and 8 random hex digits), flushed and fsynced, then renamed over it.

A reader, or a run interrupted, killed or out of disk meanwhile, finds the old file whole
or the new one, never a part. It lives in ``plant/`` because the plant's own writers
(profiles) and the controllers' plan writer use it; ``gpugov.daemon.files`` re-exports
it for everything above.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path


def write_bytes_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same directory,
    flushed and fsynced, then renamed over ``path``. A failure leaves no temporary file
    behind (a kill can leave one, never ``path`` cut short). A link is followed: its
    target is replaced. The parent directory must exist.

    ``mode``: the new file's permissions; by default an existing file's, else what a
    plain write creates (0o666 less the umask).

    Raises:
        OSError: the directory cannot be written (or is missing), or the disk is full.
    """
    write_files_atomic({path: data}, mode=mode)


def write_text_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` as UTF-8 to ``path`` atomically (:func:`write_bytes_atomic`; the
    text is written as given, with no newline translation)."""
    write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_files_atomic(files: Mapping[Path, bytes | str], *, mode: int | None = None) -> None:
    """Write several files that belong together (a profile's CSV and manifest) so that
    none is replaced until every one is written: each goes to its temporary file first,
    and only then are they renamed over their targets, in the mapping's order. A failure
    while writing (a full disk, Ctrl-C) leaves every target as it was; ``str`` content is
    written as UTF-8.

    Raises:
        OSError: a directory cannot be written (or is missing), or the disk is full;
            its ``filename`` is the target's.
    """
    staged: list[tuple[str, Path]] = []
    target: Path | None = None
    try:
        for path, content in files.items():
            target = _link_target(path)
            wanted = mode
            if wanted is None and target.exists():
                wanted = stat.S_IMODE(target.stat().st_mode)
            handle, name = _create_beside(target, 0o666 if wanted is None else wanted)
            staged.append((name, target))
            data = content.encode("utf-8") if isinstance(content, str) else content
            with os.fdopen(handle, "wb") as out:
                if wanted is not None:
                    os.fchmod(out.fileno(), wanted)  # exactly, whatever the umask
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        while staged:
            name, target = staged[0]
            os.replace(name, target)
            staged.pop(0)
    except BaseException as error:
        for name, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(name)
        if isinstance(error, OSError) and error.errno and target is not None:
            # Named as the file being written (a failed write() names none, and the
            # temporary's name means nothing to a user), as the same OSError subclass.
            raise OSError(error.errno, error.strerror, str(target)) from error
        raise


def _link_target(path: Path) -> Path:
    """The file a write to ``path`` replaces: the one it links to, if it is a link.

    Raises:
        OSError: ``path`` is a symbolic link loop (ELOOP, naming ``path``). Python before
            3.13 raises RuntimeError there, which no caller of a write expected (a learned
            model's state file linked in a loop stopped the daemon).
    """
    if not path.is_symlink():
        return path
    try:
        return path.resolve()
    except RuntimeError as error:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path)) from error


def _create_beside(path: Path, mode: int) -> tuple[int, str]:
    """A new file in ``path``'s directory, named ``.NAME.`` and 8 random hex digits, opened
    for writing with ``mode`` less the umask (``tempfile.mkstemp`` would give 0o600); its
    descriptor and name."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        name = os.path.join(path.parent, f".{path.name}.{secrets.token_hex(4)}")
        try:
            return os.open(name, flags, mode), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def remove_left_temporaries(path: Path) -> list[str]:
    """Remove the temporary files a write of ``path`` left behind when its process was
    killed, lost power or exited under a slow disk between making one and renaming it
    (``.NAME.`` and 8 hex digits, plain files only); their names, in order. For a file
    that only one process writes (a daemon's state file, at its start): another
    writer's temporary would be removed under it. Nothing it cannot list or remove is
    raised: it is left."""
    try:
        target = _link_target(path)
        names = sorted(os.listdir(target.parent))
    except OSError:
        return []
    prefix = f".{target.name}."
    removed = []
    for name in names:
        digits = name[len(prefix) :]
        if not name.startswith(prefix) or len(digits) != 8:
            continue
        if any(digit not in "0123456789abcdef" for digit in digits):
            continue
        left = target.parent / name
        try:
            if not stat.S_ISREG(left.lstat().st_mode):
                continue
            left.unlink()
        except OSError:
            continue
        removed.append(name)
    return removed


def append_line(path: Path, line: str, *, durable: bool = False) -> None:
    """Append ``line`` (its newline included) to ``path``, fsynced when ``durable``: the
    files a run appends to as it goes (a sweep's results, a profile's state).

    Unbuffered, so a failed write (a full disk) leaves nothing for a later close to retry,
    and raised naming ``path``: the kernel's error names no file, and a command's edge
    printed it as a traceback. A line cut short by a full disk is left; readers of these
    files drop a last line cut short.

    Raises:
        OSError: naming ``path``.
    """
    data = line.encode()
    try:
        with path.open("ab", buffering=0) as handle:
            view = memoryview(data)
            while view:  # a regular file's write can be short (the disk filling midway)
                view = view[handle.write(view) or 0 :]
            if durable:
                os.fsync(handle.fileno())
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


__all__ = [
    "append_line",
    "remove_left_temporaries",
    "write_bytes_atomic",
    "write_files_atomic",
    "write_text_atomic",
]
