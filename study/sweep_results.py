"""A sweep's results file and its summary: reading (and repairing) the append-only
``results.jsonl``, each cell's latest result, the summary table against the maximum clock,
and its plot."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpugov.daemon.cli_support import UsageError
from gpugov.daemon.controller_spec import canonical_controller_name
from gpugov.daemon.errors import printable
from gpugov.daemon.files import InputFileError, append_line, loads_json, read_input_bytes
from gpugov.plant.input_files import finite_number
from gpugov.study.markdown import markdown_text

if TYPE_CHECKING:
    from gpugov.study.sweep import SweepCell

BASELINE = "max"
"""The controller every row's saving is measured against."""
SUMMARY_METRICS = (
    "energy_j",
    "energy_per_output_token_j",
    "slo_attainment",
    "ttft_p95_s",
    "tpot_p95_s",
    "power_cap_violation_s",
    "thermal_violation_s",
)
"""The metrics :func:`summarize` reads of every finished cell's row."""


def _row_problem(row: Any) -> str | None:
    """What makes ``row`` no sweep result line (None: it is one): a string key, and for a
    finished cell a metrics object of numbers (None where a metric is undefined)."""
    if not isinstance(row, dict) or not isinstance(row.get("key"), str):
        return "no string key"
    if row.get("status") == "failed":
        return None
    metrics = row.get("metrics")
    if not isinstance(metrics, dict):
        return "a finished cell without its metrics object"
    for name, value in metrics.items():
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            return f"metric {name!r} is not a number"
        if finite_number(value) is None:
            return f"metric {name!r} is too large or not finite"
    for name in SUMMARY_METRICS:
        if name not in metrics:
            return f"a finished cell without the metric {name!r}"
    return _cell_problem(row)


def _cell_problem(row: dict[str, Any]) -> str | None:
    """What makes a finished row's cell fields unusable (None: they are as a sweep writes
    them): the trace, profile and controller names, a load and a seed."""
    for name in ("trace", "profile", "controller"):
        if not isinstance(row.get(name), str):
            return f"{name} is {row.get(name)!r:.80}, not a name"
    if finite_number(row.get("load")) is None:
        return f"load is {row.get('load')!r:.80}, not a load"
    seed = row.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        return f"seed is {seed!r:.80}, not a seed"
    return None


def read_results(path: Path, *, repair: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The rows of a results file and the number of unreadable lines dropped.

    Only a last line cut short by an interrupted write is expected (one without its
    newline: the writer appends a line and its newline at once); with ``repair`` the file
    is truncated to its last complete line, so appending continues cleanly. A complete
    line that is not a result is refused wherever it stands.

    Raises:
        UsageError: an unreadable line other than the last (the file is not ours).
    """
    if not path.exists():
        return [], 0
    try:
        data = read_input_bytes(path, "results")
    except InputFileError as error:
        raise UsageError(str(error)) from error
    lines = data.split(b"\n")
    rows: list[dict[str, Any]] = []
    good_bytes = 0
    dropped = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        try:
            row = loads_json(line)
            problem = _row_problem(row)
            if problem is not None:
                raise ValueError(problem)
        except ValueError as error:
            if number == len(lines):  # no newline after it: a write cut short
                dropped += 1
                break
            raise UsageError(f"{path}:{number}: not a sweep result line ({error})") from error
        if number == len(lines):  # a complete row without its newline: keep, add one
            rows.append(row)
            good_bytes = len(data)
            if repair:
                with path.open("ab") as handle:
                    handle.write(b"\n")
            break
        rows.append(row)
        good_bytes += len(line) + 1
    if repair and dropped:
        with path.open("r+b") as handle:
            handle.truncate(min(good_bytes, len(data)))
    return rows, dropped


def row_cell(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """A result line's trace, profile, load, controller and seed, as the grid spelled them."""
    return tuple(row.get(name) for name in ("trace", "profile", "load", "controller", "seed"))


def cell_fields(cell: SweepCell) -> tuple[Any, ...]:
    """``cell``'s trace, profile, load, controller and seed (:func:`_row_cell`'s order)."""
    return (cell.trace, cell.profile, cell.load, cell.controller, cell.seed)


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one row to ``path`` and make it durable before the next cell is counted (a
    failure, a full disk, raised naming ``path``: :func:`append_line`)."""
    append_line(path, json.dumps(row, allow_nan=False) + "\n", durable=True)


def _mean(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None


def ok_rows_by_key(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The ``ok`` result lines by key, each key's in file order."""
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok":
            by_key.setdefault(row["key"], []).append(row)
    return by_key


def cell_result(
    cell: SweepCell, by_key: Mapping[str, Sequence[Mapping[str, Any]]]
) -> Mapping[str, Any] | None:
    """``cell``'s result: the latest line that counts for it (:meth:`SweepCell.counts`)
    under its key, else under a former key; None when it has none (it runs)."""
    for key in cell.known_keys():
        counted = [row for row in by_key.get(key, ()) if cell.counts(row)]
        if counted:
            return counted[-1]
    return None


def summarize(
    rows: Sequence[Mapping[str, Any]], cells: Sequence[SweepCell]
) -> list[dict[str, Any]]:
    """Per (trace, profile, load, controller): means over seeds of energy, J/token, SLO
    attainment, TTFT/TPOT p95, violations, and energy saved against ``max`` on the same
    (trace, profile, load, seed) when the grid has it."""
    by_key = ok_rows_by_key(rows)

    def result(cell: SweepCell) -> Mapping[str, Any] | None:
        return cell_result(cell, by_key)

    # By the cells' own fields: a row written from another spelling of the grid (an
    # absolute path in DIR/grid.toml) names its trace and profile as that spelling did.
    baseline = {}
    for cell in cells:
        row = result(cell)
        # The maximum clock under any of its spellings (``maximum``, an older name).
        if row is not None and canonical_controller_name(cell.controller) == BASELINE:
            baseline[(cell.trace, cell.profile, cell.load, cell.seed)] = row["metrics"]["energy_j"]
    groups: dict[tuple[str, str, float, str], list[Mapping[str, Any]]] = {}
    for cell in cells:
        row = result(cell)
        if row is not None:
            groups.setdefault((cell.trace, cell.profile, cell.load, cell.controller), []).append(
                row
            )
    table = []
    for (trace, profile, load, controller), members in groups.items():
        metrics = [row["metrics"] for row in members]
        saved = []
        for row in members:
            reference = baseline.get((trace, profile, load, row["seed"]))
            if reference:
                saved.append((reference - row["metrics"]["energy_j"]) / reference)
        table.append(
            {
                "trace": trace,
                "profile": profile,
                "load": load,
                "controller": controller,
                "seeds": len(members),
                "energy_j": _mean([m["energy_j"] for m in metrics]),
                "energy_saved_vs_max": _mean(saved),
                "energy_per_output_token_j": _mean(
                    [m["energy_per_output_token_j"] for m in metrics]
                ),
                "slo_attainment": _mean([m["slo_attainment"] for m in metrics]),
                "ttft_p95_s": _mean([m["ttft_p95_s"] for m in metrics]),
                "tpot_p95_s": _mean([m["tpot_p95_s"] for m in metrics]),
                "power_cap_violation_s": _mean([m["power_cap_violation_s"] for m in metrics]),
                "thermal_violation_s": _mean([m["thermal_violation_s"] for m in metrics]),
                "cap_overshoot_s": _mean([m.get("cap_overshoot_s") for m in metrics]),
                # Summed, not a mean: how many answers the chain replaced, over the seeds.
                "invalid_decisions": sum(int(row.get("invalid_decisions") or 0) for row in members),
            }
        )
    return table


def _fmt(value: Any, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{suffix}"


def _name(value: Any, *, markdown: bool) -> str:
    """A trace, profile or controller as a table cell: one printable line (a file name
    may hold a newline or an escape sequence), its ``|`` escaped in markdown, where it
    would end the cell and push the row's figures into the wrong columns."""
    return markdown_text(value) if markdown else printable(str(value))


def format_table(table: Sequence[Mapping[str, Any]], *, markdown: bool = False) -> str:
    """The summary as a fixed-width table (stdout) or a markdown table; every name is
    written as :func:`_name` writes it."""
    header = [
        "trace",
        "profile",
        "load",
        "controller",
        "seeds",
        "energy",
        "saved",
        "J/token",
        "SLO",
        "TTFT p95",
        "TPOT p95",
    ]
    body = [
        [
            _name(row["trace"], markdown=markdown),
            _name(row["profile"], markdown=markdown),
            f"x{row['load']:g}",
            _name(row["controller"], markdown=markdown),
            str(row["seeds"]),
            _fmt(row["energy_j"], 1e-3, 1, " kJ"),
            _fmt(row["energy_saved_vs_max"], 100, 1, "%"),
            _fmt(row["energy_per_output_token_j"], 1, 3),
            _fmt(row["slo_attainment"], 100, 1, "%"),
            _fmt(row["ttft_p95_s"], 1, 3, " s"),
            _fmt(row["tpot_p95_s"], 1000, 1, " ms"),
        ]
        for row in table
    ]
    if markdown:
        lines = [
            "| " + " | ".join(header) + " |",
            "| " + " | ".join("---" if i < 4 else "---:" for i in range(len(header))) + " |",
        ]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(str(cells[i])) for cells in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            str(cell).ljust(width) if i < 4 else str(cell).rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )
        for cells in [header, *body]
    )


def invalid_decisions_markdown(table: Sequence[Mapping[str, Any]]) -> str:
    """The paragraph of ``summary.md`` that names each controller whose decisions were not
    a clock (the chain ran the top clock instead): how many, over the cells of its rows
    that had any (a row sums its seeds, so not every one of them need have); empty when
    none were. Its rows are in the table, so the reader must know they are not its
    own clocks."""
    counts: dict[str, list[int]] = {}
    for row in table:
        if row.get("invalid_decisions"):
            found = counts.setdefault(row["controller"], [0, 0])
            found[0] += int(row["invalid_decisions"])
            found[1] += int(row["seeds"])
    if not counts:
        return ""
    lines = ["Not its own clocks (the safety chain ran the top clock instead):", ""]
    lines += [
        "- "
        + printable(
            f"{controller}: {count} decision(s) over the {cells} cell(s) of its row(s) were "
            "not a clock in MHz"
        )
        for controller, (count, cells) in counts.items()
    ]
    return "\n".join(lines) + "\n\n"


def failed_cells_markdown(failed: Sequence[Mapping[str, Any]]) -> str:
    """The paragraph of ``summary.md`` that names the cells that failed (each a cell's
    parameters and its ``error``), one phrase per controller: how many cells, the first
    and its error; empty when none did. Their rows are not in the table."""
    by_controller: dict[str, list[Mapping[str, Any]]] = {}
    for entry in failed:
        by_controller.setdefault(entry["controller"], []).append(entry)
    if not by_controller:
        return ""
    lines = ["Failed, so left out of the table (`--resume` runs them again):", ""]
    for controller, entries in by_controller.items():
        first = entries[0]
        where = (
            f"{first['trace']}, {first['profile']}, load {first['load']:g}, seed {first['seed']}"
        )
        lines.append(
            "- "
            + printable(
                f"{controller} failed on {len(entries)} cell(s), first {where}: {first['error']}"
            )
        )
    return "\n".join(lines) + "\n\n"


def write_plot(table: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Write :func:`sweep_plot` to ``path`` atomically. Returns False (and writes nothing)
    without matplotlib."""
    from gpugov.daemon.files import write_bytes_atomic

    data = sweep_plot(table)
    if data is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
    return True


def sweep_plot(table: Sequence[Mapping[str, Any]]) -> bytes | None:
    """PNG bytes: J per output token against SLO attainment, one point per group, one
    colour per controller; None without matplotlib."""
    from gpugov.study.plots import agg_pyplot, figure_bytes

    try:
        plt = agg_pyplot()
    except ImportError:
        return None

    fig, ax = plt.subplots(figsize=(9, 6))
    controllers = list(dict.fromkeys(row["controller"] for row in table))
    for index, controller in enumerate(controllers):
        mine = [
            r
            for r in table
            if r["controller"] == controller
            and r["slo_attainment"] is not None
            and r["energy_per_output_token_j"] is not None
        ]
        ax.scatter(
            [100.0 * r["slo_attainment"] for r in mine],
            [r["energy_per_output_token_j"] for r in mine],
            label=controller,
            color=f"C{index % 10}",
            alpha=0.8,
            s=36,
        )
    ax.set_xlabel("SLO attainment (%), mean over seeds")
    ax.set_ylabel("energy per output token (J)")
    ax.set_title(f"gpugov sweep: {len(table)} groups (trace x profile x load x controller)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # none when no cell finished: no empty legend
        ax.legend(fontsize=8)  # (matplotlib warned of one on stderr, naming this file)
    fig.tight_layout()
    data = figure_bytes(fig, "png")
    plt.close(fig)
    return data


__all__ = [
    "BASELINE",
    "append_row",
    "cell_fields",
    "cell_result",
    "failed_cells_markdown",
    "format_table",
    "invalid_decisions_markdown",
    "ok_rows_by_key",
    "read_results",
    "row_cell",
    "summarize",
    "sweep_plot",
    "write_plot",
]
