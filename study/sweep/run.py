"""Running a planned sweep: each cell as ``gpugov simulate`` runs it, every result appended
as it finishes (``--resume`` skips those done), then the summaries and the plot."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpugov import __version__
from gpugov.daemon.cli_outputs import check_not_an_input, check_output_dir, prepare_output_dir
from gpugov.daemon.cli_support import UsageError, simulated_controller, slo_target_of
from gpugov.daemon.decide import close_controller
from gpugov.daemon.errors import printable
from gpugov.daemon.files import json_safe, write_files_atomic, write_text_atomic
from gpugov.daemon.progress import Progress
from gpugov.daemon.safety import invalid_decisions
from gpugov.daemon.sim_progress import DrainEstimate
from gpugov.daemon.simulated import observation_view
from gpugov.plant import ServingPlant, simulate
from gpugov.plant.profile_files import profile_files
from gpugov.plant.result import arrival_separation
from gpugov.plant.scheduler import SCHEDULERS
from gpugov.plant.types import Request
from gpugov.plant.workload import BUNDLED_TRACES, SHARED_TRACES, scale_load, workload_checksum
from gpugov.study.outputs import check_replaceable, held_output_dir
from gpugov.study.provenance import (
    outside_module_sha256,
    outside_specs,
    software_versions,
)
from gpugov.study.ray_cluster import import_ray, ray_endpoint
from gpugov.study.runners import (
    CellProgress,
    RunnerSpec,
    map_cells,
    run_isolated,
    runner_ready,
)
from gpugov.study.sweep.grid import (
    _profile_path_like,
    _resolve,
    _spec_files,
    grid_toml,
    rebased_grid,
)
from gpugov.study.sweep.plan import SweepCell, SweepPlan, _period, _safety, plan_sweep
from gpugov.study.sweep_results import (
    BASELINE,
    append_row,
    cell_fields,
    cell_result,
    failed_cells_markdown,
    format_table,
    invalid_decisions_markdown,
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
"""The sweep's copy of its grid in ``--out``, every path absolute."""
PLOTS_HINT = "matplotlib is not installed: no plot written (pip install 'gpugov[plots]')"


def last_arrival(window: Sequence[Request]) -> float:
    """The last arrival of a trace's window, in seconds (0 for none)."""
    return max((r.arrival_time_s for r in window), default=0.0)


def cell_units(last_arrival_s: float, load: float) -> float:
    """A cell's share of the sweep's progress: the simulated seconds to its last arrival at
    its load (``simulate``'s own progress total), at least one."""
    return max(last_arrival_s / load, 1.0)


def run_cell(cell: SweepCell, shared: Mapping[str, Any]) -> dict[str, Any]:
    """One cell, as ``gpugov simulate`` runs it; a failure becomes a ``failed`` row (a
    sweep of hours does not stop for one cell; ``--resume`` runs failed cells again).
    Its simulated seconds are counted as it runs in ``shared["progress"]`` (a
    :class:`CellProgress`, where there is one), and its expected length, which grows past
    the last arrival while a backlog drains, in ``shared["sizes"]``; the count only reads
    the simulation."""
    started = time.perf_counter()
    counter: CellProgress | None = shared.get("progress")
    sizes: CellProgress | None = shared.get("sizes")
    on_progress: Callable[[float, Any], None] | None = None
    if counter is not None:
        end = DrainEstimate(cell_units(last_arrival(shared[f"trace:{cell.trace}"]), cell.load))

        def on_progress(time_s: float, simulation: Any) -> None:
            units = end(time_s, simulation)  # past the last arrival, the drain's end
            if sizes is not None:
                sizes.report(cell.key, units)
            counter.report(cell.key, min(time_s, units))

    settings = dict(cell.settings)
    base = {"key": cell.key, **cell.parameters(), "settings": settings}
    if cell.controller_file_sha256:
        base["controller_file_sha256"] = list(cell.controller_file_sha256)
    outside = bool(outside_specs([cell.controller]))
    try:
        if outside:  # the code it ran: a --resume says when the module changed since
            base["controller_module_sha256"] = outside_module_sha256(cell.controller)
        window: Sequence[Request] = shared[f"trace:{cell.trace}"]
        workload = scale_load(window, cell.load) if cell.load != 1.0 else tuple(window)
        plant = ServingPlant.from_profile(
            shared[f"profile:{cell.profile}"], latency_noise_cv=settings["latency_noise"]
        )
        period = _period(settings, cell.controller)

        # Results written before the key existed gave the controller no target.
        slo_target = slo_target_of(settings.get("slo_target"))

        def simulated() -> dict[str, Any]:
            """The cell's controller built, run and closed: the row's result fields."""
            controller = simulated_controller(
                cell.controller,
                plant,
                workload,
                period,
                safety=_safety(settings),
                slo_target=slo_target,
            )
            try:
                result = simulate(
                    workload,
                    plant,
                    SCHEDULERS[settings["scheduler"]],
                    controller,
                    seed=cell.seed,
                    controller_name=cell.controller,
                    control_period_s=period,
                    # Results written before the view existed observed the exact state.
                    view=observation_view(settings.get("engine_view", "exact"), slo_target),
                    on_progress=on_progress,
                )
            finally:
                close_controller(controller, f"cell {cell.key}: controller {cell.controller!r}")
            return {
                "light_load_floor": arrival_separation(result.request_records).separated,
                "metrics": json_safe(result.metrics.as_dict()),
                # Decisions that were not a clock (the chain ran the top clock instead).
                "invalid_decisions": invalid_decisions(controller),
            }

        # Another package's controller runs in a child process (as on the scoreboard):
        # one that ends its process fails its cell, and its module's state does not
        # carry over to the next cell (which would follow --jobs and the cells' order).
        fields = (
            run_isolated(simulated, f"controller {cell.controller!r}") if outside else simulated()
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
        "light_load_floor": fields["light_load_floor"],
        "metrics": fields["metrics"],
        "invalid_decisions": fields["invalid_decisions"],
        "wall_s": time.perf_counter() - started,
    }


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
    for name in (RESULTS, SUMMARY_MD, SUMMARY_JSON, PLOT, GRID_COPY):
        check_replaceable("--out", out, out / name)  # before hours of cells, not after
    results_path = out / RESULTS
    if results_path.exists() and results_path.stat().st_size and not resume:
        raise UsageError(
            f"--out {out}: {results_path.name} already holds results; add --resume to "
            "continue that sweep, or choose another --out"
        )
    # Planning builds every controller on every profile and keys every cell: minutes for
    # a grid of thousands, which said nothing until the first cell ran.
    with Progress(0, "sweep", unit="checks", stream=progress_stream, quiet_start_s=5.0) as bar:

        def on_check(done: float, total: float, what: str) -> None:
            bar.total = total
            bar.update(done, f"checking the grid: {what}")

        plan = plan_sweep(grid_path, on_check)
    write_grid_copy = check_outputs_not_inputs(plan, grid_path, out)
    with runner_ready(spec):  # Ray joined before DIR is made or progress printed
        prepare_output_dir("--out", out)
        with held_output_dir(out, "--out"):  # one sweep at a time appends to its results
            return _run_plan(
                plan, grid_path, out, spec, resume, say, progress_stream, write_grid_copy
            )


def result_versions(
    cells: Sequence[SweepCell], by_key: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, int]:
    """How many of ``cells``' results each gpugov version wrote (``unknown`` for a line
    that does not say), by version: a resumed sweep may hold cells of several."""
    counts: dict[str, int] = {}
    for cell in cells:
        row = cell_result(cell, by_key)
        if row is not None:
            version = str(row.get("gpugov_version") or "unknown")
            counts[version] = counts.get(version, 0) + 1
    return dict(sorted(counts.items()))


def changed_outside_code(
    cells: Sequence[SweepCell], by_key: Mapping[str, Sequence[Mapping[str, Any]]]
) -> int:
    """How many of ``cells`` have a result computed by another version of their outside
    controller's module than the one there now (its recorded sha256 differs; a result
    that recorded none says nothing)."""
    now: dict[str, str | None] = {}
    changed = 0
    for cell in cells:
        row = cell_result(cell, by_key)
        if row is None or not row.get("controller_module_sha256"):
            continue
        if cell.controller not in now:
            now[cell.controller] = outside_module_sha256(cell.controller)
        changed += row["controller_module_sha256"] != now[cell.controller]
    return changed


def versions_markdown(versions: Mapping[str, int]) -> str:
    """The sentence of ``summary.md`` naming the gpugov versions its results were written
    by, where that is not this one alone (a resumed sweep's older cells); else empty."""
    if not versions or list(versions) == [__version__]:
        return ""
    parts = [f"{version} ({n} cell{'' if n == 1 else 's'})" for version, n in versions.items()]
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return (
        f"Results written by gpugov {printable(listed)}; this summary was written by "
        f"{__version__}. A new `--out` runs every cell on one version.\n\n"
    )


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
        changed = changed_outside_code(plan.cells, by_key)
        if changed:
            line += (
                f" ({changed} of them ran another version of their outside controller's "
                "module: its sha256 changed since; kept as they are, a new --out runs them "
                "on this one)"
            )
        done = result_versions(plan.cells, by_key)
        older = {version: n for version, n in done.items() if version != __version__}
        if older:
            line += (
                f" ({sum(older.values())} of them written by gpugov {' or '.join(older)}, "
                f"not this {__version__}: kept as they are; a new --out runs every cell on "
                "this one)"
            )
        say(line)
    if write_grid_copy:
        write_text_atomic(
            out / GRID_COPY, grid_toml(rebased_grid(plan.grid, grid_path.resolve().parent))
        )
    failed: list[dict[str, Any]] = []  # this run's failed cells, each with its error
    # The bar counts simulated seconds, each cell's as it runs (a local pool's workers
    # through shared memory; a Ray cell's when it ends): counted in whole cells, a sweep
    # of a few long cells read "0/1 cells, ETA ?" for minutes.
    ends = {trace: last_arrival(plan.shared[f"trace:{trace}"]) for trace in plan.grid.traces}
    units = [cell_units(ends[cell.trace], cell.load) for cell in todo]
    count = 0
    last = ""  # the cell finished last, named on each line

    def show() -> None:
        cells = f"{count:,}/{len(todo):,} cells"
        progress.total = sizes.total()
        progress.update(counter.total(), f"{cells}, {last}" if last else cells)

    counter = CellProgress([cell.key for cell in todo], on_report=show)
    # Each cell's expected simulated seconds: its last arrival until it runs past it,
    # then the end of its drain (a burst's backlog), then its real length once done.
    sizes = CellProgress([cell.key for cell in todo])
    for cell, size in zip(todo, units, strict=True):
        sizes.report(cell.key, size)
    # Nothing to run (a finished sweep resumed): no bar, whose only line was
    # "100.0% (0/0 cells) ... ETA ?"; the resume line above says why.
    with Progress(
        sum(units), "sweep", unit="simulated s", stream=progress_stream, enabled=bool(todo)
    ) as progress:
        # A line at once: the first cell can run for minutes (a whole trace under mpc),
        # and the sweep said nothing until it finished.
        last = f"running {len(todo):,} cell(s)"
        show()
        for finished in map_cells(
            run_cell,
            todo,
            spec=spec,
            shared={**plan.shared, "progress": counter, "sizes": sizes},
            on_event=say,
            label=SweepCell.label,
            on_wait=show,
        ):
            count += 1  # read by show()
            row = {
                **finished.value,
                "attempts": finished.attempts,
                "worker": finished.worker,
                "gpugov_version": __version__,
                "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            append_row(results_path, row)
            rows.append(row)
            if row["status"] != "ok":
                failed.append({**todo[finished.index].parameters(), "error": row["error"]})
                say(f"cell {todo[finished.index].label()} failed: {row['error']}")
            elif row.get("invalid_decisions"):
                say(
                    f"cell {todo[finished.index].label()}: {row['invalid_decisions']} "
                    "decision(s) were not a clock in MHz; the safety chain ran the top clock"
                )
            last = todo[finished.index].label()
            key, size = todo[finished.index].key, units[finished.index]
            if row["status"] == "ok":
                size = max(size, row["metrics"].get("simulated_duration_s") or 0.0)
            sizes.report(key, size)
            counter.report(key, size)  # and show()
        progress.close(f"{count:,}/{len(todo):,} cells")
    table = summarize(rows, plan.cells)
    versions = result_versions(plan.cells, ok_rows_by_key(rows))
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
                "failed": len(failed),
                "failed_cells": failed,
                "runner": spec.describe(),
                "gpugov_versions": versions,
                "versions": software_versions(outside_specs(plan.grid.controllers)),
                "table": json_safe(table),
            },
            indent=1,
            allow_nan=False,
        )
        + "\n",
        paths["summary_md"]: (
            f"# gpugov sweep: {printable(grid_path.name)}\n\n"
            f"{len(plan.cells)} cells; means over seeds; "
            f"saved is energy saved against `{BASELINE}` on the same trace, profile, load and "
            f"seed.\n\n{_settings_markdown(plan.grid.settings())}"
            f"{versions_markdown(versions)}{failed_cells_markdown(failed)}"
            f"{invalid_decisions_markdown(table)}"
            f"{format_table(table, markdown=True)}\n"
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
        "failed": len(failed),
        "table": table,
        "paths": paths,
    }


def _settings_markdown(settings: Mapping[str, Any]) -> str:
    """The settings every cell ran with, in words (the grid's, else ``simulate``'s
    defaults), so that a cell's figures set beside a ``simulate`` or ``run --simulate``
    run's show the settings they differ in."""
    period = settings.get("control_period_s")
    target = settings.get("slo_target")
    duration = settings.get("duration_s")
    return (
        "Every cell: its controller decides "
        + (
            f"every {period:g} s"
            if period is not None
            else "at its own period (0.25 s for `mpc-online`, 1 s for the others)"
        )
        + ", SLO target "
        + ("none" if target is None else f"{100.0 * target:g} %")
        + f", the node's safety chain ({_safety(settings).words()}), the "
        + f"{settings['engine_view']} engine view, the "
        + f"{settings['scheduler']} scheduler, latency noise {settings['latency_noise']:g}, "
        + f"the window from {settings['start_s']:g} s "
        + ("to the trace's end" if duration is None else f"for {duration:g} s")
        + ".\n\n"
    )


__all__ = [
    "GRID_COPY",
    "PLOT",
    "PLOTS_HINT",
    "RESULTS",
    "SUMMARY_JSON",
    "SUMMARY_MD",
    "changed_outside_code",
    "check_outputs_not_inputs",
    "input_files",
    "result_versions",
    "run_cell",
    "run_sweep",
    "versions_markdown",
]
