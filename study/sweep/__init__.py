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

The grid file and its paths are :mod:`.grid`, the cells and their keys :mod:`.plan`, and
running them and writing the results :mod:`.run`; this package re-exports their public names.
"""

from gpugov.study.sweep.grid import (
    MAX_GRID_VALUES,
    PROFILE_SPEC_KINDS,
    SweepGrid,
    grid_toml,
    read_grid,
    rebased_grid,
)
from gpugov.study.sweep.plan import MAX_GRID_CELLS, SweepCell, SweepPlan, cell_key, plan_sweep
from gpugov.study.sweep.run import (
    GRID_COPY,
    PLOT,
    PLOTS_HINT,
    RESULTS,
    SUMMARY_JSON,
    SUMMARY_MD,
    check_outputs_not_inputs,
    input_files,
    run_cell,
    run_sweep,
)

__all__ = [
    "GRID_COPY",
    "MAX_GRID_CELLS",
    "MAX_GRID_VALUES",
    "PLOT",
    "PLOTS_HINT",
    "PROFILE_SPEC_KINDS",
    "RESULTS",
    "SUMMARY_JSON",
    "SUMMARY_MD",
    "SweepCell",
    "SweepGrid",
    "SweepPlan",
    "cell_key",
    "check_outputs_not_inputs",
    "grid_toml",
    "input_files",
    "plan_sweep",
    "read_grid",
    "rebased_grid",
    "run_cell",
    "run_sweep",
]
