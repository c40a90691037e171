"""Planning a sweep: the grid expanded into its cells, each keyed by everything that
determines its result, with every input loaded and checked before the first cell runs."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpugov.daemon.cli_support import (
    UsageError,
    check_kv_fits,
    check_slo_target_period,
    check_window_span,
    checked_controller_flag,
    control_period_of,
    load_trace_for_cli,
    simulated_controller,
    slo_target_of,
)
from gpugov.daemon.controller_spec import parse_controller_spec
from gpugov.daemon.decide import close_controller
from gpugov.daemon.errors import ControllerError
from gpugov.daemon.safety import DEFAULT_DWELL_S, SafetySettings
from gpugov.plant import PerformanceProfile, ServingPlant, load_profile
from gpugov.plant.profile import ProfileError
from gpugov.plant.synthetic_profiles import expand_synthetic, is_synthetic_spec, resolve_profile
from gpugov.plant.types import Request
from gpugov.plant.workload import BUNDLED_TRACES, SHARED_TRACES, TraceError, workload_checksum
from gpugov.study.provenance import outside_specs
from gpugov.study.runners import run_isolated
from gpugov.study.sweep.grid import (
    SweepGrid,
    _file_identity,
    _profile_identity,
    _rebased_spec,
    _resolve,
    _spec_contents,
    read_grid,
)

MAX_GRID_CELLS = 100_000
"""Most cells one grid expands to."""
CELL_CHECK = 0.02
"""A cell's keying in the planning's progress, where loading a profile or a trace, or
building a controller on a profile, is one (keying a cell is some fifty times quicker)."""


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


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """A validated grid: its cells and the inputs they read (sent to workers by value)."""

    grid: SweepGrid
    cells: tuple[SweepCell, ...]
    shared: dict[str, Any]


PlanProgress = Callable[[float, float, str], None]
"""Hears the planning's checks done, their total and what was checked last: a grid of
many profiles and controllers builds each controller on each profile (minutes for
thousands), and a large trace loads for seconds."""


def plan_sweep(path: Path, on_check: PlanProgress | None = None) -> SweepPlan:
    """Read ``path``, load every trace window and profile, check every controller spec,
    and list the cells with their keys; ``on_check`` hears each profile and trace loaded
    and each controller built on a profile.

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
    known_traces = tuple(BUNDLED_TRACES) + tuple(SHARED_TRACES)
    # A cell's key names its files as resolved, so that the same run keys alike however
    # the grid spelled them (DIR/grid.toml names them absolute).
    trace_ids = {
        entry: entry if entry in known_traces else _file_identity(_resolve(entry, (), base), entry)
        for entry in grid.traces
    }
    profile_ids = {entry: _profile_identity(entry, base) for entry in grid.profiles}
    controller_ids = {spec: _rebased_spec(spec, os.path.realpath) for spec in grid.controllers}
    for key, ids in (
        ("traces", trace_ids),
        ("profiles", profile_ids),
        ("controllers", {spec: _controller_identity(spec) for spec in grid.controllers}),
    ):
        _refuse_the_same_twice(path, key, ids)
    checks = float(len(grid.profiles) * (1 + len(grid.controllers)) + len(grid.traces))
    checks += total * CELL_CHECK  # every cell keyed: seconds for 100,000 of them
    done = 0.0

    def checked(what: str, units: float = 1.0) -> None:
        nonlocal done
        done += units
        if on_check is not None:
            on_check(done, checks, what)

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
        checked(f"profile {entry}")
    _check_before_traces(path, grid, profiles)
    for entry in grid.traces:
        try:
            workload, _ = load_trace_for_cli(
                _resolve(entry, known_traces, base),
                start_s=grid.start_s,
                duration_s=grid.duration_s,
                keep_stamps_flag=None,  # a grid has no key for it
            )
        except (TraceError, ValueError) as error:
            raise UsageError(f"{path}: key 'traces': {error}") from error
        shared[f"trace:{entry}"] = workload
        checksums[entry] = workload_checksum(workload)
        checked(f"trace {entry}")
    _check_cells(path, grid, profiles, shared)
    first = shared[f"trace:{grid.traces[0]}"]
    for spec in grid.controllers:
        check_slo_target_period(
            grid.settings()["slo_target"],
            _period(grid.settings(), spec),
            f"{path}: keys 'slo_target' and 'control_period_s' ({spec})",
        )
        outside = bool(outside_specs([spec]))
        for entry, profile in profiles.items():
            build = functools.partial(_build_and_close, path, spec, entry, profile, first, grid)
            try:
                if outside:
                    # Built in a child process, as its cells build it (run_cell): what its
                    # factory changes in its module's state is not there when they start.
                    run_isolated(build, f"controller {spec!r}")
                else:
                    build()
            except (UsageError, ControllerError) as error:
                message = _spec_message(error)
                raise UsageError(f"{path}: key 'controllers' ({entry}): {message}") from error
            checked(f"controller {spec} on {entry}")
    settings = grid.settings()
    contents = {spec: _spec_contents(path, spec) for spec in grid.controllers}
    # A cell's key holds its files as resolved (trace_ids, profile_ids, controller_ids)
    # and the contents of every file it reads: the trace window's checksum, the
    # profile's sha256s and those of its controller's files (an edited plan runs its
    # cells again).
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
                            "controller": controller_ids[controller],
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
                        if len(cells) % 1000 == 0:
                            checked(f"{len(cells):,} of {total:,} cells keyed", 1000 * CELL_CHECK)
    if len(cells) % 1000:
        checked(f"{len(cells):,} of {total:,} cells keyed", len(cells) % 1000 * CELL_CHECK)
    return SweepPlan(grid, tuple(cells), shared)


def _controller_identity(spec: str) -> str:
    """The controller ``spec`` builds, however it is spelled (``fixed:1000`` and
    ``fixed:1e3``, ``max`` and ``maximum``, a plan as ``p.json`` and ``./p.json``): its
    parsed config, its files absolute; the text where it does not parse (refused later
    in its own line). A bare ``mpc`` plans on each cell's profile, so it stays itself."""
    rebased = _rebased_spec(spec, os.path.realpath)
    kind, colon, _ = spec.partition(":")
    if kind in ("mpc", "mpc-slsqp") and not colon:
        return rebased
    try:
        config = parse_controller_spec(rebased)
    except ValueError:
        return rebased
    return config.model_dump_json(exclude_none=True)


def _refuse_the_same_twice(path: Path, key: str, identities: Mapping[str, str]) -> None:
    """Refuse two entries of grid key ``key`` that name the same file (``ok.csv`` and
    ``./ok.csv``, a file and a link to it; ``mpc:p.json`` and ``mpc:./p.json``): their
    cells had one key, so the same run was done twice, written twice to results.jsonl and
    shown twice in the summary.

    Raises:
        UsageError: naming the grid file, the key and both entries.
    """
    first: dict[str, str] = {}
    for entry, identity in identities.items():
        earlier = first.setdefault(identity, entry)
        if earlier != entry:
            what = "controller" if key == "controllers" else "file"
            raise UsageError(
                f"{path}: key {key!r}: {earlier!r} and {entry!r} name the same {what} "
                f"({identity}); give it once"
            )


def _build_and_close(
    path: Path,
    spec: str,
    entry: str,
    profile: PerformanceProfile,
    workload: Sequence[Request],
    grid: SweepGrid,
) -> None:
    """Build ``spec``'s controller on ``profile`` as a cell will, then close it: the
    check of a grid's controller (a refusal is a :class:`UsageError`)."""
    built = simulated_controller(
        spec,
        ServingPlant.from_profile(profile),
        workload,
        _period(grid.settings(), spec),
        safety=_safety(grid.settings()),
        slo_target=slo_target_of(grid.settings()["slo_target"]),
    )
    close_controller(built, f"{path}: controller {spec!r} on {entry}")


def _spec_message(error: Exception) -> str:
    """A ``--controller`` refusal as a grid's ``controllers`` entry says it."""
    return str(error).removeprefix("--controller: ").removeprefix("--controller ")


def _check_before_traces(
    path: Path, grid: SweepGrid, profiles: Mapping[str, PerformanceProfile]
) -> None:
    """Refuse what needs no trace before any trace is read (a large one takes a minute):
    a floor above a profile's top clock, and a controller spec that does not parse, a
    fixed clock outside a profile's clocks or an open-loop plan that cannot be read.

    Raises:
        UsageError: naming the grid file, the key and the profile.
    """
    for entry, profile in profiles.items():
        if grid.floor_mhz is not None and grid.floor_mhz > profile.maximum_clock_mhz:
            raise UsageError(
                f"{path}: key 'floor_mhz': {grid.floor_mhz:g} MHz is above the top clock of "
                f"profile {entry} ({profile.maximum_clock_mhz:g} MHz)"
            )
        for spec in grid.controllers:
            try:
                checked_controller_flag(spec, profile)
            except UsageError as error:
                raise UsageError(
                    f"{path}: key 'controllers' ({entry}): {_spec_message(error)}"
                ) from error


def _check_cells(
    path: Path,
    grid: SweepGrid,
    profiles: Mapping[str, PerformanceProfile],
    shared: Mapping[str, Any],
) -> None:
    """Refuse, before the first cell runs, every cell the plant would refuse: a request
    larger than a profile's KV cache, a scaled window longer than the simulated-days
    limit (one line naming the file and the cell).

    Raises:
        UsageError: naming the grid file, the key and the values of the bad cell.
    """
    for entry, profile in profiles.items():
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
                        check_window_span(
                            latest / load if load != 1.0 else latest,
                            trace,
                            "choose a shorter duration_s or larger loads",
                        )
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


__all__ = [
    "MAX_GRID_CELLS",
    "PlanProgress",
    "SweepCell",
    "SweepPlan",
    "cell_key",
    "plan_sweep",
]
