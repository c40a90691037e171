"""The files gpugov reads and writes: the one bounded reader of every input file (from
:mod:`gpugov.plant.input_files`, re-exported here), strict JSON (non-finite numbers become
null), atomic writes (temporary file, fsync, rename) and the state directory every
persisted file lives in."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from gpugov.plant.input_files import (
    FILE_LIMITS,
    InputFileError,
    loads_json,
    loads_toml,
    read_input_bytes,
    read_input_text,
    read_input_text_and_digest,
)

STATE_DIR_ENV = "STATE_DIRECTORY"
"""systemd's ``StateDirectory=`` sets it (several directories joined with ``:``)."""


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, tuples as lists and numpy
    scalars as Python numbers, recursively: JSON has no NaN or infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return json_safe(item())
    return value


def write_text_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: a temporary file in the same
    directory (``.NAME.XXXXXXXX``), flushed and fsynced, then renamed over ``path``. A
    reader, or a run interrupted or killed meanwhile, finds the old file whole or the new
    one, never a part; a failure leaves no temporary file behind (a kill can leave one,
    never ``path`` cut short). A link is followed: its target is replaced. The parent
    directory must exist.

    ``mode``: the new file's permissions; by default an existing file's, else what a
    plain write creates (0o666 less the umask).

    Raises:
        OSError: the directory cannot be written (or is missing).
    """
    if path.is_symlink():
        path = path.resolve()
    if mode is None and path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
    handle, name = _create_beside(path, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(handle, mode)  # exactly, whatever the umask
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def _create_beside(path: Path, mode: int) -> tuple[int, str]:
    """A new file ``.NAME.XXXXXXXX`` in ``path``'s directory, opened for writing with
    ``mode`` less the umask (``tempfile.mkstemp`` would give 0o600); its descriptor and
    name."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        name = os.path.join(path.parent, f".{path.name}.{secrets.token_hex(4)}")
        try:
            return os.open(name, flags, mode), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def write_json_atomic(path: Path, payload: Any, *, indent: int | None = None) -> None:
    """Write ``payload`` as strict JSON to ``path`` atomically (:func:`write_text_atomic`,
    readable by its owner only: a state file), creating the directory.

    Raises:
        OSError: the directory cannot be written.
        ValueError: ``payload`` holds a non-finite number (pass it through
            :func:`json_safe` first) or something JSON cannot hold.
    """
    text = json.dumps(payload, indent=indent, sort_keys=indent is not None, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text, mode=0o600)


def resolve_state_dir(configured: str | Path | None) -> Path | None:
    """The state directory: the configured one, else systemd's ``$STATE_DIRECTORY`` (its
    first entry), else None (nothing is persisted)."""
    if configured is not None:
        return Path(configured)
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env.split(":")[0])
    return None


__all__ = [
    "FILE_LIMITS",
    "STATE_DIR_ENV",
    "InputFileError",
    "json_safe",
    "loads_json",
    "loads_toml",
    "read_input_bytes",
    "read_input_text",
    "read_input_text_and_digest",
    "resolve_state_dir",
    "write_json_atomic",
    "write_text_atomic",
]
