"""The grid file of ``gpugov sweep``: its keys (validated), reading it, and the paths it
names, resolved against its folder and made absolute for the sweep's copy of it.

The grid file (TOML; every key but the four lists is optional)::

    traces = ["azure-conv-10min", "azure-code"]   # names, or paths (relative to the file)
    profiles = ["h100-sxm-llama3-8b"]             # bundled names, manifest paths, or
                                                  # synthetic:SHAPE ("synthetic": every shape)
    loads = [0.5, 1.0, 2.0]                       # arrival-rate multipliers (--load-scale)
    controllers = ["max", "reactive", "mpc"]      # simulate's --controller specs
    seeds = [0, 1]                                # plant seeds (matter with latency_noise)
    start_s = 0.0                                 # window start in the trace (--start)
    duration_s = 300.0                            # window length (--duration; default all)
    control_period_s = 1.0                        # --control-period (default: the controller's)
    slo_target = 0.99                             # --slo-target (or "none")
    scheduler = "chunked"                         # --scheduler
    latency_noise = 0.0                           # --latency-noise (iteration jitter CV)
    dwell_s = 0.5                                 # --dwell: the node's safety.dwell_s
    # floor_mhz = 900.0                           # --floor: the node's safety.floor_mhz
    engine_view = "vllm"                          # --engine-view: vllm (a node's) or exact
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator

from gpugov.daemon.cli_support import DEFAULT_SLO_TARGET, UsageError
from gpugov.daemon.files import InputFileError, loads_toml, read_input_bytes, read_input_text
from gpugov.daemon.limits import (
    MAX_CLOCK_MHZ,
    MAX_LATENCY_NOISE,
    MAX_LOAD_SCALE,
    MAX_PERIOD_S,
    MAX_SECONDS,
    MAX_SEED,
    MIN_PERIOD_S,
)
from gpugov.daemon.safety import DEFAULT_DWELL_S
from gpugov.plant.input_files import path_exists
from gpugov.plant.profile_files import names_profile_file, profile_files
from gpugov.plant.scheduler import SCHEDULERS
from gpugov.plant.workload import BUNDLED_TRACES, SHARED_TRACES

MAX_GRID_VALUES = 1000
"""Most values one grid list holds (a grid is a product: its cells multiply quickly)."""
Number = Annotated[float, Strict()]
"""A grid's number: a TOML integer or float (lax mode ran ``"5"`` and ``true``)."""


class SweepGrid(BaseModel):
    """The grid file's keys (module docstring); unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    traces: list[str] = Field(min_length=1, max_length=MAX_GRID_VALUES)
    profiles: list[str] = Field(min_length=1, max_length=MAX_GRID_VALUES)
    loads: list[Number] = Field(default=[1.0], min_length=1, max_length=MAX_GRID_VALUES)
    controllers: list[str] = Field(min_length=1, max_length=MAX_GRID_VALUES)
    seeds: list[Annotated[int, Strict(), Field(ge=0, le=MAX_SEED)]] = Field(
        default=[0], min_length=1, max_length=MAX_GRID_VALUES
    )
    start_s: Number = Field(default=0.0, ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)
    duration_s: Number | None = Field(default=None, gt=0.0, le=MAX_SECONDS, allow_inf_nan=False)
    control_period_s: Number | None = Field(
        default=None, ge=MIN_PERIOD_S, le=MAX_PERIOD_S, allow_inf_nan=False
    )
    """Unset: each cell's controller at its own period, as ``simulate`` runs it (0.25 s for
    mpc-online, 1 s for the others)."""
    slo_target: float | Literal["none"] = DEFAULT_SLO_TARGET
    """The SLO target every cell's controller is given (``simulate --slo-target``)."""
    scheduler: str = "chunked"
    latency_noise: Number = Field(default=0.0, ge=0.0, lt=MAX_LATENCY_NOISE, allow_inf_nan=False)
    dwell_s: Number = Field(default=DEFAULT_DWELL_S, ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)
    floor_mhz: Number | None = Field(default=None, gt=0.0, le=MAX_CLOCK_MHZ, allow_inf_nan=False)
    engine_view: Literal["vllm", "exact"] = "vllm"

    @field_validator("traces", "profiles", "controllers", "seeds", "loads")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        seen = [value for index, value in enumerate(values) if value in values[:index]]
        if seen:
            raise ValueError(f"duplicate value {seen[0]!r}")
        return values

    @field_validator("traces", "profiles", "controllers")
    @classmethod
    def _non_empty(cls, values: list[str]) -> list[str]:
        if any(not value.strip() for value in values):
            raise ValueError("empty name")
        return values

    @field_validator("loads")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        bad = [
            value
            for value in values
            if not math.isfinite(value) or value <= 0.0 or value > MAX_LOAD_SCALE
        ]
        if bad:
            raise ValueError(
                f"loads are arrival-rate multipliers in (0, {MAX_LOAD_SCALE:g}], got {bad[0]!r}"
            )
        return values

    @field_validator("slo_target", mode="before")
    @classmethod
    def _attainment(cls, value: Any) -> Any:
        if isinstance(value, str) and value == "none":
            return value
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and 0.0 < value < 1.0):
            raise ValueError(f'must be an attainment in (0, 1) or "none", got {value!r}')
        return float(value)

    @field_validator("scheduler")
    @classmethod
    def _scheduler(cls, value: str) -> str:
        if value not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {value!r}; choose from {sorted(SCHEDULERS)}")
        return value

    def settings(self) -> dict[str, Any]:
        """The settings every cell shares (part of each cell's key)."""
        return {
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "control_period_s": self.control_period_s,
            "slo_target": None if self.slo_target == "none" else self.slo_target,
            "scheduler": self.scheduler,
            "latency_noise": self.latency_noise,
            "dwell_s": self.dwell_s,
            "floor_mhz": self.floor_mhz,
            "engine_view": self.engine_view,
        }


def _pydantic_line(path: Path, error: ValidationError) -> str:
    """One line naming the file and the first bad key."""
    first = error.errors()[0]
    location = ""
    for part in first["loc"]:
        location += f"[{part}]" if isinstance(part, int) else (f".{part}" if location else part)
    if first["type"] == "extra_forbidden":
        known = ", ".join(SweepGrid.model_fields)
        return f"{path}: unknown key {location!r} (known keys: {known})"
    if first["type"] == "missing":
        return f"{path}: missing key {location!r}"
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{path}: key {location!r}: {message}"


def read_grid(path: Path) -> SweepGrid:
    """Parse and validate a grid file (syntax and values; names are checked later).

    Raises:
        UsageError: unreadable file, bad TOML, unknown key or bad value (one line).
    """
    try:
        raw = loads_toml(read_input_text(path, "grid"))
    except InputFileError as error:
        raise UsageError(f"--grid {error}") from error
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path}: not valid TOML: {error}") from error
    try:
        return SweepGrid.model_validate(raw)
    except ValidationError as error:
        raise UsageError(_pydantic_line(path, error)) from error


def _resolve(entry: str, known: Sequence[str], base: Path) -> str:
    """A name as it is, a ``~`` path the home's, a relative path made relative to the grid
    file's folder."""
    entry = os.path.expanduser(entry)
    if entry in known or Path(entry).is_absolute():
        return entry
    candidate = base / entry
    # A name too long for a file is no file: the loader refuses the entry.
    return str(candidate) if path_exists(candidate) else entry


PROFILE_SPEC_KINDS = ("mpc", "mpc-slsqp", "mpc-online", "power-profile")
"""Controller kinds whose ``KIND:ARGUMENT`` may name a profile file."""


def _absolute_if_file(read: str, entry: str) -> str:
    """``read`` (the path the sweep read for ``entry``) made absolute when it is an existing
    file, else ``entry`` as written (a name)."""
    return os.path.abspath(read) if os.path.exists(read) else entry


def _profile_path_like(text: str) -> bool:
    """Whether the profile loader reads ``text`` as a file rather than a bundled name."""
    return names_profile_file(text)


def _rebased_spec(spec: str, absolute: Callable[[str], str] = os.path.abspath) -> str:
    """A controller spec whose file argument (an ``open-loop`` plan, an MPC profile), read
    from the working directory, is made absolute (by ``absolute``)."""
    kind, colon, argument = spec.partition(":")
    argument = os.path.expanduser(argument)  # as parse_controller_spec reads it
    if not colon or not argument or not os.path.exists(argument):
        return spec
    if kind == "open-loop" or (
        kind in PROFILE_SPEC_KINDS and "=" not in argument and _profile_path_like(argument)
    ):
        return f"{kind}:{absolute(argument)}"
    return spec


def _spec_files(spec: str) -> list[tuple[str, str]]:
    """The files controller ``spec`` reads, each with its input-file kind, as
    ``simulate`` reads them (from the working directory): an ``open-loop`` plan; a
    profile named by path after an MPC, ``mpc-online`` or ``power-profile`` kind (or as
    ``mpc-online``'s ``profile=PATH``), its manifest and CSV. A bundled name reads none of
    the user's files; an outside factory's module is code, not an input file."""
    kind, colon, argument = spec.partition(":")
    if not colon or not argument:
        return []
    argument = os.path.expanduser(argument)  # as parse_controller_spec reads it
    if kind == "open-loop":
        return [(argument, "plan")] if os.path.exists(argument) else []
    if kind not in PROFILE_SPEC_KINDS:
        return []
    if "=" in argument:
        items = (item.partition("=") for item in argument.split(","))
        argument = {key.strip(): value.strip() for key, _, value in items}.get("profile", "")
    argument = os.path.expanduser(argument)  # as parse_controller_spec reads it
    if not argument or not _profile_path_like(argument) or not os.path.exists(argument):
        return []
    return [(str(path), "profile") for path in profile_files(argument)]


def _spec_contents(path: Path, spec: str) -> tuple[tuple[str, ...], float | None]:
    """The sha256 of each file controller ``spec`` reads, and when the latest of them last
    changed (its status-change or modification time, Unix seconds; None: it reads none).

    Raises:
        UsageError: a file it names cannot be read (one line naming the grid and the key).
    """
    digests = []
    changed: float | None = None
    for name, kind in _spec_files(spec):
        try:
            digests.append(hashlib.sha256(read_input_bytes(name, kind)).hexdigest())
            status = os.stat(name)
        except (InputFileError, OSError) as error:
            raise UsageError(f"{path}: key 'controllers' ({spec}): {error}") from error
        latest = max(status.st_ctime, status.st_mtime)
        changed = latest if changed is None else max(changed, latest)
    return tuple(digests), changed


def _profile_identity(entry: str, base: Path) -> str:
    """What a cell's key holds for a profile: its manifest file resolved
    (:func:`_file_identity`), or its bundled name."""
    read = _resolve(entry, (), base)
    return _file_identity(read, entry) if _profile_path_like(read) else entry


def _file_identity(read: str, entry: str) -> str:
    """What a cell's key holds for a trace or profile: the file read for ``entry``
    (``read``) with every link and ``..`` resolved, however the grid spelled it (relative
    to its folder, to the working directory, or absolute, as ``DIR/grid.toml`` has it);
    ``entry`` for a name."""
    return os.path.realpath(read) if os.path.exists(read) else entry


def rebased_grid(grid: SweepGrid, base: Path) -> SweepGrid:
    """``grid`` with every path it names absolute: traces and profiles as read (relative to
    ``base``, the grid file's folder, or else the working directory), and the files of its
    controller specs; names are kept. A copy of it runs again from any folder."""
    known_traces = tuple(BUNDLED_TRACES) + tuple(SHARED_TRACES)
    traces = []
    for entry in grid.traces:
        read = _resolve(entry, known_traces, base)
        traces.append(entry if read in known_traces else _absolute_if_file(read, entry))
    profiles = []
    for entry in grid.profiles:
        read = _resolve(entry, (), base)
        profiles.append(_absolute_if_file(read, entry) if _profile_path_like(read) else entry)
    controllers = [_rebased_spec(spec) for spec in grid.controllers]
    return grid.model_copy(
        update={"traces": traces, "profiles": profiles, "controllers": controllers}
    )


def _toml_value(value: Any) -> str:
    """One TOML value: a string, a finite number, a boolean or a list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a JSON string is a TOML basic string, but for DEL
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, int | float):
        return repr(value)
    return "[" + ", ".join(_toml_value(item) for item in value) + "]"


def grid_toml(grid: SweepGrid) -> str:
    """``grid`` as a grid file (every key it sets; an unset optional key left out)."""
    lines = ["# The grid this sweep ran, every path absolute: it runs again from any folder."]
    for key, value in grid.model_dump().items():
        if value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


__all__ = [
    "MAX_GRID_VALUES",
    "PROFILE_SPEC_KINDS",
    "SweepGrid",
    "grid_toml",
    "read_grid",
    "rebased_grid",
]
