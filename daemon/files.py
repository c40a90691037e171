"""The files gpugov reads and writes: the one bounded reader of every input file (from
:mod:`gpugov.plant.input_files`) and the one atomic writer of every output file (temporary
file, fsync, rename: :mod:`gpugov.plant.output_files`), both re-exported here, strict JSON
(non-finite numbers become null) and the state directory every persisted file lives in."""

from __future__ import annotations

import json
import math
import os
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
from gpugov.plant.output_files import (
    append_line,
    remove_left_temporaries,
    write_bytes_atomic,
    write_files_atomic,
    write_text_atomic,
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
    first non-empty entry: an empty one would be the working directory), else None."""
    if configured is not None:
        return Path(configured)
    entries = [entry for entry in os.environ.get(STATE_DIR_ENV, "").split(":") if entry]
    return Path(entries[0]) if entries else None


__all__ = [
    "FILE_LIMITS",
    "STATE_DIR_ENV",
    "InputFileError",
    "append_line",
    "json_safe",
    "loads_json",
    "loads_toml",
    "read_input_bytes",
    "read_input_text",
    "read_input_text_and_digest",
    "remove_left_temporaries",
    "resolve_state_dir",
    "write_bytes_atomic",
    "write_files_atomic",
    "write_json_atomic",
    "write_text_atomic",
]
