"""The files gpugov reads and writes: the one bounded reader of every input file (from
:mod:`gpugov.plant.input_files`, re-exported here), strict JSON (non-finite numbers become
null), atomic writes (temporary file, fsync, rename) and the state directory every
persisted file lives in."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
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


def write_json_atomic(path: Path, payload: Any, *, indent: int | None = None) -> None:
    """Write ``payload`` as strict JSON to ``path`` atomically: a temporary file in the
    same directory, flushed and fsynced, then renamed over ``path``; a failure leaves the
    old file whole and no temporary file behind.

    Raises:
        OSError: the directory cannot be written.
        ValueError: ``payload`` holds a non-finite number (pass it through
            :func:`json_safe` first) or something JSON cannot hold.
    """
    text = json.dumps(payload, indent=indent, sort_keys=indent is not None, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


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
]
