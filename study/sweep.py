"""``gpugov sweep``: a grid of traces x profiles x loads x controllers x seeds, one cell each.

Every cell is one ``gpugov simulate`` run (the same trace window, load scaling, plant,
controller factory and metrics), run by :func:`gpugov.study.runners.map_cells` on the local
pool or on Ray. Each finished cell is appended to ``DIR/results.jsonl`` at once (one JSON
line, flushed and synced), keyed by a stable hash of everything that determines its result
(the cell's parameters, the grid's settings, the checksum of its trace window and the
sha256 of its profile's files and of the files its controller spec reads), so ``--resume``
runs only the cells whose key is not already there: an interrupted sweep loses at most the
cells that were running, no cell is counted twice, and an edited input file runs again the
cells that read it. At the end:
``DIR/summary.md`` and ``DIR/summary.json`` (the table, mean over seeds) and
``DIR/sweep.png`` (with matplotlib, the ``gpugov[plots]`` extra).

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
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator

from gpugov import __version__
from gpugov.daemon.cli_support import (
    DEFAULT_SLO_TARGET,
    UsageError,
    check_kv_fits,
    check_not_an_input,
    check_output_dir,
    check_window_span,
    control_period_of,
    load_trace_for_cli,
    prepare_output_dir,
    simulated_controller,
    slo_target_of,
)
from gpugov.daemon.errors import printable
from gpugov.daemon.files import (
    InputFileError,
    json_safe,
    loads_toml,
    read_input_bytes,
    read_input_text,
    write_files_atomic,
    write_text_atomic,
)
from gpugov.daemon.limits import (
    MAX_CLOCK_MHZ,
    MAX_LATENCY_NOISE,
    MAX_LOAD_SCALE,
    MAX_PERIOD_S,
    MAX_SECONDS,
    MAX_SEED,
    MIN_PERIOD_S,
)
from gpugov.daemon.progress import Progress
from gpugov.daemon.safety import DEFAULT_DWELL_S, SafetySettings, invalid_decisions
from gpugov.daemon.simulated import observation_view
from gpugov.plant import PerformanceProfile, ServingPlant, load_profile, simulate
from gpugov.plant.input_files import path_exists
from gpugov.plant.profile import ProfileError
from gpugov.plant.profile_files import names_profile_file, profile_files
from gpugov.plant.result import arrival_separation
from gpugov.plant.scheduler import SCHEDULERS
from gpugov.plant.synthetic_profiles import (
    expand_synthetic,
    is_synthetic_spec,
    resolve_profile,
)
from gpugov.plant.types import Request
from gpugov.plant.workload import (
    BUNDLED_TRACES,
    SHARED_TRACES,
    TraceError,
    scale_load,
    workload_checksum,
)
from gpugov.study.runners import RunnerSpec, import_ray, map_cells, ray_endpoint, runner_ready
from gpugov.study.sweep_results import (
    BASELINE,
    append_row,
    cell_fields,
    cell_result,
    format_table,
    ok_rows_by_key,
    read_results,
    row_cell,
    summarize,
    sweep_plot,
)

RESULTS = "results.jsonl"
SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
PLOT = "sweep.png"
GRID_COPY = "grid.toml"
"""The controller energy savings are measured against, when the grid has it."""
MAX_GRID_VALUES = 1000
"""Most values one grid list holds (a grid is a product: its cells multiply quickly)."""
MAX_GRID_CELLS = 100_000
"""Most cells one grid expands to."""
PLOTS_HINT = "matplotlib is not installed: no plot written (pip install 'gpugov[plots]')"
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


# ------------------------------------------------------------------------ the cells
@dataclass(frozen=True, slots=True)
class SweepCell:
    """One run of the grid, with its stable key."""

    key: str
    trace: str
    profile: str
    load: float
    controller: str
    seed: int
    settings: tuple[tuple[str, Any], ...]
    former_keys: tuple[str, ...] = ()
    """The keys earlier versions gave this cell, where they differ from ``key``: before
    keys resolved paths (its paths as the grid spelled them), and before they held the
    contents of its controller's files. A result under one still counts as done, unless
    :attr:`files_changed_at_s` says otherwise."""
    controller_file_sha256: tuple[str, ...] = ()
    """The sha256 of each file its controller spec reads (an ``open-loop`` plan, an MPC
    profile's manifest and CSV named by path), part of its key."""
    files_changed_at_s: float | None = None
    """When those files last changed (the latest status change, Unix seconds; a copy or
    move sets it too). A result under a former key, which holds no contents, counts only
    when it finished after this: it may have been computed from other contents."""

    def known_keys(self) -> tuple[str, ...]:
        """Every key a result of this cell may carry: its key, then its former ones."""
        return (self.key, *self.former_keys)

    def counts(self, row: Mapping[str, Any]) -> bool:
        """Whether ``row``, an ``ok`` result line, is this cell's result: one under its key,
        or under a former key when the cell reads no controller file or the row finished
        after the files last changed (a row without a readable finish time does not)."""
        if row.get("key") == self.key:
            return True
        if row.get("key") not in self.former_keys:
            return False
        if self.files_changed_at_s is None:
            return True
        finished = _finished_at_s(row)
        return finished is not None and finished > self.files_changed_at_s

    def label(self) -> str:
        """``trace|profile|xload|controller|seed`` for progress lines."""
        return f"{self.trace}|{self.profile}|x{self.load:g}|{self.controller}|seed {self.seed}"

    def parameters(self) -> dict[str, Any]:
        """The cell's parameters as a row's fields."""
        return {
            "trace": self.trace,
            "profile": self.profile,
            "load": self.load,
            "controller": self.controller,
            "seed": self.seed,
        }


def _finished_at_s(row: Mapping[str, Any]) -> float | None:
    """A result line's ``finished_at`` (ISO 8601, whole seconds, UTC) in Unix seconds, or
    None when it has none that reads as one."""
    try:
        finished = datetime.fromisoformat(row["finished_at"])
    except (KeyError, TypeError, ValueError):
        return None
    if finished.tzinfo is None:
        return None
    return finished.timestamp()


def cell_key(parameters: Mapping[str, Any]) -> str:
    """A stable hash (sha256 of the canonical JSON, 16 hex digits) of a cell's inputs."""
    text = json.dumps(parameters, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _resolve(entry: str, known: Sequence[str], base: Path) -> str:
    """A name as it is, a relative path made relative to the grid file's folder."""
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
    if kind == "open-loop":
        return [(argument, "plan")] if os.path.exists(argument) else []
    if kind not in PROFILE_SPEC_KINDS:
        return []
    if "=" in argument:
        items = (item.partition("=") for item in argument.split(","))
        argument = {key.strip(): value.strip() for key, _, value in items}.get("profile", "")
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


def _expanded(grid: SweepGrid) -> SweepGrid:
    """``grid`` with a ``synthetic`` profile entry replaced by every generated shape
    (``synthetic:SHAPE``), as the scoreboard's ``--profiles`` takes it; each entry once."""
    profiles: list[str] = []
    for entry in grid.profiles:
        profiles += [name for name in expand_synthetic(entry) if name not in profiles]
    if profiles == grid.profiles:
        return grid
    return grid.model_copy(update={"profiles": profiles})


def _grid_profile(entry: str, base: Path) -> PerformanceProfile:
    """The profile a grid's entry names: a generated one (``synthetic:SHAPE``, as
    ``gpugov simulate --profile`` and the scoreboard take it; its sha256s are those of
    its generated manifest and table, so a changed generator runs its cells again), a
    bundled name, or a manifest path (relative to the grid's folder).

    Raises:
        ValueError: an unknown shape (``ProfileError``: an unknown or unreadable profile).
    """
    read = _resolve(entry, (), base)
    if read != entry or not is_synthetic_spec(entry):  # a file of that name comes first
        return load_profile(read)
    profile = resolve_profile(entry)
    table = np.stack(
        [
            profile.clock_mhz,
            profile.prefill_tokens_per_s,
            profile.decode_tokens_per_s,
            profile.prefill_power_w,
            profile.decode_power_w,
            profile.idle_power_w,
        ]
    )
    manifest = json.dumps(profile.manifest, sort_keys=True, default=str).encode()
    return replace(
        profile,
        profile_csv_sha256=hashlib.sha256(table.astype("<f8").tobytes()).hexdigest(),
        manifest_sha256=hashlib.sha256(manifest).hexdigest(),
    )


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


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """A validated grid: its cells and the inputs they read (sent to workers by value)."""

    grid: SweepGrid
    cells: tuple[SweepCell, ...]
    shared: dict[str, Any]


def plan_sweep(path: Path) -> SweepPlan:
    """Read ``path``, load every trace window and profile, check every controller spec,
    and list the cells with their keys.

    Raises:
        UsageError: a bad grid, an unknown or unreadable trace or profile, a bad
            controller spec (one line naming the file and the key).
    """
    grid = _expanded(read_grid(path))
    total = (
        len(grid.traces)
        * len(grid.profiles)
        * len(grid.loads)
        * len(grid.controllers)
        * len(grid.seeds)
    )
    if total > MAX_GRID_CELLS:
        raise UsageError(
            f"{path}: the grid expands to {total:,} cells, over the limit of "
            f"{MAX_GRID_CELLS:,}; split it into several sweeps"
        )
    base = path.resolve().parent
    shared: dict[str, Any] = {}
    checksums: dict[str, str] = {}
    profiles: dict[str, PerformanceProfile] = {}
    for entry in grid.profiles:
        try:
            profile = _grid_profile(entry, base)
        except (ProfileError, OSError, ValueError) as error:
            raise UsageError(f"{path}: key 'profiles': {error}") from error
        profiles[entry] = profile
        shared[f"profile:{entry}"] = profile
    known_traces = tuple(BUNDLED_TRACES) + tuple(SHARED_TRACES)
    for entry in grid.traces:
        try:
            workload, _ = load_trace_for_cli(
                _resolve(entry, known_traces, base),
                start_s=grid.start_s,
                duration_s=grid.duration_s,
            )
        except (TraceError, ValueError) as error:
            raise UsageError(f"{path}: key 'traces': {error}") from error
        shared[f"trace:{entry}"] = workload
        checksums[entry] = workload_checksum(workload)
    _check_cells(path, grid, profiles, shared)
    first = shared[f"trace:{grid.traces[0]}"]
    for spec in grid.controllers:
        for entry, profile in profiles.items():
            try:
                simulated_controller(
                    spec,
                    ServingPlant.from_profile(profile),
                    first,
                    _period(grid.settings(), spec),
                    safety=_safety(grid.settings()),
                    slo_target=slo_target_of(grid.settings()["slo_target"]),
                )
            except UsageError as error:
                message = str(error).removeprefix("--controller: ")
                raise UsageError(f"{path}: key 'controllers' ({entry}): {message}") from error
    settings = grid.settings()
    contents = {spec: _spec_contents(path, spec) for spec in grid.controllers}
    # A cell's key names its files as resolved, so that the same run keys alike however
    # the grid spelled them (DIR/grid.toml names them absolute), and holds the contents
    # of every file it reads: the trace window's checksum, the profile's sha256s and
    # those of its controller's files (an edited plan runs its cells again).
    trace_ids = {
        entry: entry if entry in known_traces else _file_identity(_resolve(entry, (), base), entry)
        for entry in grid.traces
    }
    profile_ids = {entry: _profile_identity(entry, base) for entry in grid.profiles}
    cells = []
    for trace in grid.traces:
        for entry, profile in profiles.items():
            for load in grid.loads:
                for controller in grid.controllers:
                    for seed in grid.seeds:
                        written = {
                            "trace": trace,
                            "trace_window_checksum": checksums[trace],
                            "profile": entry,
                            "profile_csv_sha256": profile.profile_csv_sha256,
                            "profile_manifest_sha256": profile.manifest_sha256,
                            "load": load,
                            "controller": controller,
                            "seed": seed,
                            **settings,
                        }
                        resolved = {
                            **written,
                            "trace": trace_ids[trace],
                            "profile": profile_ids[entry],
                            "controller": _rebased_spec(controller, os.path.realpath),
                        }
                        digests, changed = contents[controller]
                        identity = dict(resolved)
                        if digests:
                            identity["controller_file_sha256"] = list(digests)
                        key = cell_key(identity)
                        former = (cell_key(resolved), cell_key(written))
                        cells.append(
                            SweepCell(
                                key,
                                trace,
                                entry,
                                load,
                                controller,
                                seed,
                                tuple(settings.items()),
                                former_keys=tuple(k for k in dict.fromkeys(former) if k != key),
                                controller_file_sha256=digests,
                                files_changed_at_s=changed,
                            )
                        )
    return SweepPlan(grid, tuple(cells), shared)


def _check_cells(
    path: Path,
    grid: SweepGrid,
    profiles: Mapping[str, PerformanceProfile],
    shared: Mapping[str, Any],
) -> None:
    """Refuse, before the first cell runs, every cell the plant would refuse: a request
    larger than a profile's KV cache, a scaled window longer than the simulated-days
    limit, a floor above a profile's top clock (one line naming the file and the cell).

    Raises:
        UsageError: naming the grid file, the key and the values of the bad cell.
    """
    for entry, profile in profiles.items():
        if grid.floor_mhz is not None and grid.floor_mhz > profile.maximum_clock_mhz:
            raise UsageError(
                f"{path}: key 'floor_mhz': {grid.floor_mhz:g} MHz is above the top clock of "
                f"profile {entry} ({profile.maximum_clock_mhz:g} MHz)"
            )
        plant = ServingPlant.from_profile(profile)
        for trace in grid.traces:
            window: Sequence[Request] = shared[f"trace:{trace}"]
            latest = max((r.arrival_time_s for r in window), default=None)
            for index, load in enumerate(grid.loads):
                # A load moves the arrivals only: the window's KV check once, then each
                # load's last arrival as scale_load puts it (the window scaled per load and
                # profile took a minute on a grid of 720 windows, before any cell ran).
                try:
                    if index == 0:
                        check_kv_fits(window, plant, trace)
                    if latest is not None:
                        check_window_span(latest / load if load != 1.0 else latest, trace)
                except UsageError as error:
                    message = str(error).removeprefix(f"--trace {trace}: ")
                    raise UsageError(
                        f"{path}: cell trace {trace}, profile {entry}, load {load:g}: {message}"
                    ) from error


def _period(settings: Mapping[str, Any], spec: str) -> float:
    """A cell's control period: the grid's, else its controller's own (as ``simulate``
    takes an unset ``--control-period``)."""
    return control_period_of(settings.get("control_period_s"), spec)


def _safety(settings: Mapping[str, Any]) -> SafetySettings:
    """The safety chain of a grid's settings (older results carry none: the defaults)."""
    return SafetySettings(
        floor_mhz=settings.get("floor_mhz"),
        dwell_s=float(settings.get("dwell_s", DEFAULT_DWELL_S)),
    )


def run_cell(cell: SweepCell, shared: Mapping[str, Any]) -> dict[str, Any]:
    """One cell, as ``gpugov simulate`` runs it; a failure becomes a ``failed`` row (a
    sweep of hours does not stop for one cell; ``--resume`` runs failed cells again)."""
    started = time.perf_counter()
    settings = dict(cell.settings)
    base = {"key": cell.key, **cell.parameters(), "settings": settings}
    if cell.controller_file_sha256:
        base["controller_file_sha256"] = list(cell.controller_file_sha256)
    try:
        window: Sequence[Request] = shared[f"trace:{cell.trace}"]
        workload = scale_load(window, cell.load) if cell.load != 1.0 else tuple(window)
        plant = ServingPlant.from_profile(
            shared[f"profile:{cell.profile}"], latency_noise_cv=settings["latency_noise"]
        )
        period = _period(settings, cell.controller)
        controller = simulated_controller(
            cell.controller,
            plant,
            workload,
            period,
            safety=_safety(settings),
            # Results written before the key existed gave the controller no target.
            slo_target=slo_target_of(settings.get("slo_target")),
        )
        result = simulate(
            workload,
            plant,
            SCHEDULERS[settings["scheduler"]],
            controller,
            seed=cell.seed,
            controller_name=cell.controller,
            control_period_s=period,
            # Results written before the view existed observed the exact state.
            view=observation_view(settings.get("engine_view", "exact")),
        )
    except Exception as error:  # the cell's outermost edge: recorded, the sweep goes on
        return {
            **base,
            "status": "failed",
            "error": f"{type(error).__name__}: {error}",
            "wall_s": time.perf_counter() - started,
        }
    return {
        **base,
        "status": "ok",
        "requests": len(workload),
        "workload_checksum": workload_checksum(workload),
        "light_load_floor": arrival_separation(result.request_records).separated,
        "metrics": json_safe(result.metrics.as_dict()),
        # Decisions that were not a clock (the chain ran the top clock instead).
        "invalid_decisions": invalid_decisions(controller),
        "wall_s": time.perf_counter() - started,
    }


# ---------------------------------------------------------------------------- run
def input_files(plan: SweepPlan, grid_path: Path) -> list[tuple[str, str]]:
    """Every file the sweep reads, as ``(what, path)``: the grid, each trace and profile
    file (manifest and CSV) it names by path, and each file a controller spec names."""
    base = grid_path.resolve().parent
    known_traces = tuple(BUNDLED_TRACES) + tuple(SHARED_TRACES)
    inputs = [("the --grid file", str(grid_path))]
    for entry in plan.grid.traces:
        read = _resolve(entry, known_traces, base)
        if read not in known_traces:
            inputs.append((f"the trace {entry!r} of the grid", read))
    for entry in plan.grid.profiles:
        read = _resolve(entry, (), base)
        if _profile_path_like(read):
            inputs += [(f"a file of the profile {entry!r}", str(p)) for p in profile_files(read)]
    for spec in plan.grid.controllers:
        inputs += [(f"a file of the controller {spec!r}", name) for name, _ in _spec_files(spec)]
    return inputs


def check_outputs_not_inputs(plan: SweepPlan, grid_path: Path, out: Path) -> bool:
    """Refuse an ``--out`` whose outputs would overwrite a file the sweep reads (one line).

    The grid itself may be ``DIR/grid.toml`` (a sweep run again from its copy): it is then
    left as it is when it already is its copy (every path absolute), and refused when
    rewriting it would change what it says. Returns whether to write ``DIR/grid.toml``.
    """
    inputs = input_files(plan, grid_path)
    copy = out / GRID_COPY
    is_grid = os.path.exists(copy) and os.path.samefile(copy, grid_path)
    if is_grid and rebased_grid(plan.grid, grid_path.resolve().parent) != plan.grid:
        raise UsageError(
            f"--out {out}: {copy} is the --grid file, which the sweep's grid copy "
            "(every path absolute) would overwrite; choose another --out"
        )
    for name in (RESULTS, SUMMARY_MD, SUMMARY_JSON, PLOT, GRID_COPY):
        others = inputs[1:] if name == GRID_COPY and is_grid else inputs
        check_not_an_input("--out", out / name, others)
    return not is_grid


def run_sweep(
    grid_path: Path,
    out: Path,
    *,
    spec: RunnerSpec | None = None,
    resume: bool = False,
    say: Callable[[str], None] | None = None,
    progress_stream: Any = None,
) -> dict[str, Any]:
    """Plan, run the cells not yet done, append each as it finishes, then summarise.

    Returns:
        ``{"cells", "ran", "skipped_done", "failed", "table", "paths"}``.

    Raises:
        UsageError: a bad grid, results already in ``out`` without ``resume``, or a
            ``--ray`` address that is malformed or does not answer.
    """
    say = say or (lambda line: print(printable(line), file=sys.stderr))
    spec = spec or RunnerSpec()
    if spec.ray_address is not None:
        ray_endpoint(spec.ray_address)  # a malformed address, before Ray is imported
        import_ray()  # the install hint before any work or file
    # --out before the grid is planned: planning reads every trace and builds every
    # controller on every profile, a minute on a large grid, and an --out that is a file
    # or already holds results was refused only after it.
    check_output_dir("--out", out)
    results_path = out / RESULTS
    if results_path.exists() and results_path.stat().st_size and not resume:
        raise UsageError(
            f"--out {out}: {results_path.name} already holds results; add --resume to "
            "continue that sweep, or choose another --out"
        )
    plan = plan_sweep(grid_path)
    write_grid_copy = check_outputs_not_inputs(plan, grid_path, out)
    with runner_ready(spec):  # Ray joined before DIR is made or progress printed
        return _run_plan(plan, grid_path, out, spec, resume, say, progress_stream, write_grid_copy)


def _run_plan(
    plan: SweepPlan,
    grid_path: Path,
    out: Path,
    spec: RunnerSpec,
    resume: bool,
    say: Callable[[str], None],
    progress_stream: Any,
    write_grid_copy: bool = True,
) -> dict[str, Any]:
    """:func:`run_sweep` once its inputs are checked and its runner is ready."""
    results_path = out / RESULTS
    prepare_output_dir("--out", out)
    rows, dropped = read_results(results_path, repair=True)
    if dropped:
        say(f"{results_path}: dropped a last line cut short by an interrupted write")
    by_key = ok_rows_by_key(rows)
    todo = [cell for cell in plan.cells if cell_result(cell, by_key) is None]
    skipped = len(plan.cells) - len(todo)
    if resume:
        line = f"resuming: {skipped} of {len(plan.cells)} cells already done, {len(todo)} to run"
        ran = {row_cell(row) for keyed in by_key.values() for row in keyed}
        again = sum(cell_fields(cell) in ran for cell in todo)
        if again:
            line += (
                f" ({again} of them ran before on other inputs: a trace, profile or "
                "controller file changed, or a setting)"
            )
        say(line)
    if write_grid_copy:
        write_text_atomic(
            out / GRID_COPY, grid_toml(rebased_grid(plan.grid, grid_path.resolve().parent))
        )
    failed = 0
    with (
        results_path.open("a") as handle,
        # Nothing to run (a finished sweep resumed): no bar, whose only line was
        # "100.0% (0/0 cells) ... ETA ?"; the resume line above says why.
        Progress(
            len(todo), "sweep", unit="cells", stream=progress_stream, enabled=bool(todo)
        ) as progress,
    ):
        # A line at once: the first cell can run for minutes (a whole trace under mpc),
        # and the sweep said nothing until it finished.
        progress.update(0, f"running {len(todo):,} cell(s)")
        for count, finished in enumerate(
            map_cells(
                run_cell, todo, spec=spec, shared=plan.shared, on_event=say, label=SweepCell.label
            ),
            1,
        ):
            row = {
                **finished.value,
                "attempts": finished.attempts,
                "worker": finished.worker,
                "gpugov_version": __version__,
                "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            append_row(handle, row)
            rows.append(row)
            if row["status"] != "ok":
                failed += 1
                say(f"cell {todo[finished.index].label()} failed: {row['error']}")
            elif row.get("invalid_decisions"):
                say(
                    f"cell {todo[finished.index].label()}: {row['invalid_decisions']} "
                    "decision(s) were not a clock in MHz; the safety chain ran the top clock"
                )
            progress.update(count, todo[finished.index].label())
    table = summarize(rows, plan.cells)
    paths = {
        "results": results_path,
        "summary_md": out / SUMMARY_MD,
        "summary_json": out / SUMMARY_JSON,
    }
    # The summaries and the plot as one set (write_files_atomic): replaced one after
    # another, a Ctrl-C midway left a new summary.json beside the earlier summary.md.
    outputs: dict[Path, str | bytes] = {
        paths["summary_json"]: json.dumps(
            {
                "grid": plan.grid.model_dump(),
                "cells": len(plan.cells),
                "failed": failed,
                "runner": spec.describe(),
                "table": json_safe(table),
            },
            indent=1,
            allow_nan=False,
        )
        + "\n",
        paths["summary_md"]: (
            f"# gpugov sweep: {grid_path.name}\n\n{len(plan.cells)} cells; means over seeds; "
            f"saved is energy saved against `{BASELINE}` on the same trace, profile, load and "
            f"seed.\n\n{format_table(table, markdown=True)}\n"
        ),
    }
    plot = sweep_plot(table)
    if plot is not None:
        paths["plot"] = out / PLOT
        outputs[paths["plot"]] = plot
    write_files_atomic(outputs)
    if plot is None:
        say(PLOTS_HINT)
    return {
        "cells": len(plan.cells),
        "ran": len(todo),
        "skipped_done": skipped,
        "failed": failed,
        "table": table,
        "paths": paths,
    }


__all__ = [
    "SweepCell",
    "SweepGrid",
    "cell_key",
    "plan_sweep",
    "read_grid",
    "run_cell",
    "run_sweep",
]
