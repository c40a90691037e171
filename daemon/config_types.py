"""The bounded value types and the frozen base model that every daemon config model shares
(:mod:`daemon.config` and :mod:`daemon.controller_config`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gpugov.daemon.limits import (
    MAX_CLOCK_MHZ,
    MAX_COUNT,
    MAX_POWER_W,
    MAX_SECONDS,
    socket_path_too_long,
)

ClockMHz = Annotated[float, Field(gt=0, le=MAX_CLOCK_MHZ, allow_inf_nan=False)]
"""A clock, at most :data:`~gpugov.daemon.limits.MAX_CLOCK_MHZ` (as the flags take)."""
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A duration, at most :data:`~gpugov.daemon.limits.MAX_SECONDS` (as the flags take)."""
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A duration above 0, at most :data:`~gpugov.daemon.limits.MAX_SECONDS`: a larger one is a
typo, and divided by the period it overflows the controllers' counts of periods."""
TokenCount = Annotated[float, Field(gt=0, le=MAX_COUNT, allow_inf_nan=False)]
"""A mean or declared token count, at most :data:`~gpugov.daemon.limits.MAX_COUNT` (no
prompt is within orders of magnitude of it; 1e308 overflows the controllers' sums)."""
Watts = Annotated[float, Field(gt=0, le=MAX_POWER_W, allow_inf_nan=False)]
"""A power above 0, at most :data:`~gpugov.daemon.limits.MAX_POWER_W` (a megawatt)."""
UnitFraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
"""A share in (0, 1]."""


def _no_nul(value: Path) -> Path:
    # A NUL byte passes Path() but no system call: check-config said OK and run crashed.
    if "\x00" in str(value):
        raise ValueError("a path cannot hold a NUL byte")
    # Left as written, ~name/... is a folder named ~name in the working directory.
    if str(value).startswith("~"):
        raise ValueError(
            f"{str(value)!r:.60} names the home of no user on this machine; write the full path"
        )
    return value


def _path_text(value: Any) -> Any:
    # Anything but text: pydantic's own line ("Input is not a valid path for <class
    # 'pathlib.Path'>") names a Python class, not what to write.
    if not isinstance(value, str | Path):
        raise ValueError(f"must be a file or directory name in quotes, got {value!r:.40}")
    # ~/... is the home's, as a shell takes it (a spec's open-loop:~/plan.json is no
    # word the shell expands).
    return os.path.expanduser(value) if str(value).startswith("~") else value


LoosePath = Annotated[
    Path, Field(strict=False), BeforeValidator(_path_text), AfterValidator(_no_nul)
]


def _socket_fits(value: Path) -> Path:
    # A longer path cannot be connected to at all (AF_UNIX path too long): check-config
    # said OK and run held every domain's fail-safe for good.
    too_long = socket_path_too_long(str(value))
    if too_long is not None:
        raise ValueError(f"{too_long}; choose a shorter one")
    return value


SocketPath = Annotated[LoosePath, AfterValidator(_socket_fits)]
"""A Unix socket's path (:data:`LoosePath`) short enough for its address."""


def named_directory(value: Any) -> Any:
    """Refuse an empty directory name before validation (a ``mode="before"`` validator)."""
    # An empty state_dir would read as the working directory ("").
    if isinstance(value, str) and not value.strip():
        raise ValueError(
            "must name a directory, such as /var/lib/gpugov (omit it for $STATE_DIRECTORY)"
        )
    return value


class FrozenModel(BaseModel):
    """The base of every config model: frozen, no unknown keys, no type coercion."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
