"""Reading GPU profile files: bundled names and paths, the CSV and its manifest, and every
check :func:`load_profile` makes before a :class:`~gpugov.plant.profile.PerformanceProfile`
is built (one ``file: what is wrong`` line each), with both files' sha256s recorded."""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpugov.plant.input_files import (
    InputFileError,
    finite_number,
    loads_json,
    path_exists,
    plain_number_text,
    read_input_text_and_digest,
)
from gpugov.plant.profile import (
    CSV_COLUMNS,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_REFERENCE_BATCH_SIZE,
    MAX_ENGINE_COUNT,
    PerformanceProfile,
    ProfileError,
    worst_calibration_error,
)


def _read_profile_file(path: Path) -> tuple[str, str]:
    """A profile file's text and sha256, through the bounded reader.

    Raises:
        ProfileError: the reader refuses the file (one line naming it).
    """
    try:
        return read_input_text_and_digest(path, "profile")
    except InputFileError as error:
        raise ProfileError(str(error)) from error


def bundled_profile_dir() -> Path:
    """Directory of the profiles shipped inside the ``profiles`` package."""
    return Path(str(resources.files("gpugov.profiles")))


def list_bundled_profiles() -> list[dict[str, Any]]:
    """Name, path, GPU, model, TP, status and calibration quality of every bundled profile."""
    rows = []
    for manifest_path in sorted(bundled_profile_dir().glob("*.json")):
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as error:
            raise ProfileError(
                f"{manifest_path}:{error.lineno}: manifest is not valid JSON: {error.msg}"
            ) from error
        rows.append(
            {
                "name": manifest_path.stem,
                "gpu": manifest.get("gpu", ""),
                "gpu_kind": manifest.get("gpu_kind", ""),
                "model": manifest.get("model", ""),
                "status": manifest.get("status", "synthetic"),
                "clock_range_mhz": manifest.get("clock_range_mhz"),
                "tensor_parallel": _tp_size(manifest.get("tensor_parallel", 1)),
                "ttft_slo_s": manifest.get("ttft_slo_s"),
                "ttft_slo_per_prompt_token_s": manifest.get("ttft_slo_per_prompt_token_s", 0.0),
                "tpot_slo_s": manifest.get("tpot_slo_s"),
                "calibration_rows": len(manifest.get("calibration") or []),
                "worst_calibration_error": worst_calibration_error(manifest),
                "path": str(manifest_path),
            }
        )
    return rows


def _tp_size(raw: Any) -> Any:
    """The TP degree of a manifest's ``tensor_parallel`` (an int or ``{"size": n}``; an
    object without ``size`` is returned whole, for the loader to refuse)."""
    return raw.get("size", raw) if isinstance(raw, Mapping) else raw


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """Return the manifest path for a bundled profile name, a manifest or a CSV path."""
    candidate = Path(name_or_path)
    shown = _cut(str(candidate))
    # The suffix in any case: "X.JSON" in the working directory was looked up as a
    # bundled name and refused as an unknown profile.
    suffix = candidate.suffix.lower()
    if suffix in (".json", ".csv") and not path_exists(candidate):
        raise ProfileError(f"{shown}: profile file not found")
    if suffix == ".json":
        return candidate
    if suffix == ".csv" and path_exists(candidate):
        manifests = [candidate.with_suffix(".json"), candidate.with_suffix(".JSON")]
        manifest = next((path for path in manifests if path_exists(path)), None)
        if manifest is None:
            raise ProfileError(f"{shown}: no manifest {manifests[0].name} beside the CSV")
        return manifest
    if "/" in str(name_or_path):
        # A path named as one: read (and refused) as a manifest, or, where no such file
        # is, its manifest "PATH.json", as a bundled name is its NAME.json. It was looked
        # up as a bundled name: an absolute "/abs/x" replaced the bundled folder and
        # loaded "/abs/x.json" (and a config's relative "dir/x", made absolute, did too),
        # but a relative "dir/x" on the command line was refused as an unknown profile.
        if path_exists(candidate):
            return candidate
        named_manifest = Path(f"{name_or_path}.json")
        if path_exists(named_manifest):
            return named_manifest
        raise ProfileError(f"{_cut(str(name_or_path))}: profile file not found")
    bundled = bundled_profile_dir() / f"{name_or_path}.json"
    if path_exists(bundled):
        return bundled
    if path_exists(candidate) and candidate.is_file():
        return candidate  # a file here named without a folder, and no bundled name
    if str(name_or_path) == "synthetic" or str(name_or_path).startswith("synthetic:"):
        # Listed as an unknown profile beside the bundled names, with no word that only
        # some commands generate one.
        raise ProfileError(
            f"{str(name_or_path)!r:.80}: a synthetic profile is generated only by gpugov "
            "simulate --profile, sweep and bench controllers; here name a bundled profile or "
            "a manifest (python -m gpugov.plant.synthetic_profiles --out DIR SHAPE writes "
            "one as files)"
        )
    known = [row["name"] for row in list_bundled_profiles()]
    close = difflib.get_close_matches(str(name_or_path), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ProfileError(
        f"unknown profile {str(name_or_path)!r:.80}{hint}; bundled profiles: {', '.join(known)}"
    )


def written_as_path(text: str) -> bool:
    """Whether a profile given as ``text`` is written as a file's path, whatever exists: a
    ``.json`` or ``.csv`` name in any case, or a name with a folder in it."""
    return Path(text).suffix.lower() in (".json", ".csv") or "/" in text


def names_profile_file(name_or_path: str | Path) -> bool:
    """Whether :func:`resolve_profile_path` takes ``name_or_path`` as a file of the user's
    (a ``.json`` or ``.csv`` path in any case, a path with a folder, or a file here that is
    no bundled name) rather than a bundled profile's name; the file need not exist."""
    text = str(name_or_path)
    candidate = Path(text)
    if written_as_path(text):
        return True
    if path_exists(bundled_profile_dir() / f"{text}.json"):
        return False
    return path_exists(candidate) and candidate.is_file()


def _cut(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters for an error line (a path given as 60,000
    characters made a 60 KB line)."""
    return text if len(text) <= limit else text[:limit] + "..."


MAX_POWER_OVER_LIMIT = 10.0
"""How many times the manifest's ``power_limit_w`` a CSV power may be. Not the limit
itself: a measured row can sit above it (the board reads over its limit before the power
brake throttles the clock, and a row averages such windows), and a manifest may state a
limit below a clock's draw (a capped board: the plant holds the limit, the table says
what the clock draws uncapped). Ten times the limit is past any of these; a power such
as 1e300 W (a unit slip, a corrupt cell) is refused, where it was taken and made every
energy figure meaningless."""


MIN_RATE_TOKENS_PER_S = 1.0
"""The slowest prefill or decode rate a profile's CSV may list. No board serves a model at
under a token a second (the bundled profiles' slowest is 405 tokens/s); a decode rate of
1e-300 made one iteration overflow the simulator (a traceback mid-run), and a prefill rate
of 5e-324 made every power NaN, so a run failed writing its JSON at the end."""


def _read_csv(path: Path, text: str, power_limit_w: float) -> dict[str, NDArray[np.float64]]:
    if not text.strip(" \t\r\n\ufeff"):
        # Refused as "missing column(s) [all six]; header is ''", which did not say why.
        raise ProfileError(
            f"{path}: the profile CSV is empty; it needs a header row ({','.join(CSV_COLUMNS)}) "
            "and a row per clock"
        )
    with io.StringIO(text, newline="") as handle:
        reader = csv.DictReader(handle)
        # A hand-written header may space its names as its cells ("clock_mhz, idle_power_w");
        # float() already reads " 345", so a name is read without the spaces around it.
        header = [name.strip() for name in reader.fieldnames or []]
        reader.fieldnames = header
        missing = [column for column in CSV_COLUMNS if column not in header]
        if missing:
            # The header quoted cut short: a CSV that is no profile table (the manifest
            # itself, say) made an error line as long as its first line, up to 16 MiB.
            shown = _cut(",".join(header), 80)
            hint = ""
            if len(header) == 1:
                # One name holding them all: cells split by another separator (a
                # spreadsheet in a locale whose list separator is ';').
                others = [sep for sep in (";", "\t", "|") if sep in header[0]]
                if others:
                    hint = f" (cells separated by {others[0]!r}? a profile CSV uses commas)"
            raise ProfileError(f"{path}: missing column(s) {missing}; header is {shown!r}{hint}")
        repeated = [column for column in CSV_COLUMNS if header.count(column) > 1]
        if repeated:
            raise ProfileError(f"{path}: column(s) {repeated} appear more than once in the header")
        columns: dict[str, list[float]] = {column: [] for column in CSV_COLUMNS}
        line_numbers: list[int] = []
        for row in reader:
            line_number = reader.line_num
            if _blank_row(row):
                # A row of empty cells or spaces is no row, as an empty line is none to
                # DictReader: a spreadsheet saves its trailing blank rows as ",,,,,", and
                # either was refused as a row with too few cells or a non-number.
                continue
            line_numbers.append(line_number)
            # DictReader puts a row's cells past the header under None and fills a short
            # row with None: either shifts values between columns (a thousands separator,
            # a stray comma) or loses one, so it is refused rather than read.
            rest = row.get(None) or []
            if any(cell.strip() for cell in rest) or None in row.values():
                which = "more cells than the header's" if rest else "fewer cells than the header's"
                hint = " (a stray comma or a thousands separator?)" if rest else ""
                raise ProfileError(f"{path}:{line_number}: the row has {which} {len(header)}{hint}")
            for column in CSV_COLUMNS:
                raw = row.get(column)
                try:
                    if raw is None or not plain_number_text(raw):
                        raise ValueError(raw)  # "3_45" and "٣٤٥" were read as 345
                    value = float(raw)
                except (TypeError, ValueError) as error:
                    raise ProfileError(
                        f"{path}:{line_number}: column {column!r} is not a number: {raw!r}"
                    ) from error
                if (
                    not np.isfinite(value)
                    or value < 0.0
                    or (value == 0.0 and column != "idle_power_w")
                ):
                    # Idle power may be 0 (a table of the power above an unmetered idle
                    # floor; a profiler reading 0 W wrote one it could not load again).
                    which = "at least 0" if column == "idle_power_w" else "positive"
                    raise ProfileError(
                        f"{path}:{line_number}: column {column!r} must be {which}, got {raw!r}"
                    )
                if column.endswith("_tokens_per_s") and value < MIN_RATE_TOKENS_PER_S:
                    raise ProfileError(
                        f"{path}:{line_number}: column {column!r} must be at least "
                        f"{MIN_RATE_TOKENS_PER_S:g} token/s, got {raw!r}; no board serves a "
                        "model slower (a unit slip or a corrupt cell?)"
                    )
                if column.endswith("_power_w") and value > MAX_POWER_OVER_LIMIT * power_limit_w:
                    raise ProfileError(
                        f"{path}:{line_number}: column {column!r} is {raw!r} W, over "
                        f"{MAX_POWER_OVER_LIMIT:g} times the manifest's power_limit_w "
                        f"({power_limit_w:g} W); no board draws that"
                    )
                if column == "clock_mhz" and value > MAX_CLOCK_MHZ:
                    raise ProfileError(
                        f"{path}:{line_number}: column 'clock_mhz' must be at most "
                        f"{MAX_CLOCK_MHZ:g} MHz, got {raw!r}"
                    )
                if column == "clock_mhz" and not value.is_integer():
                    # NVML reports and locks whole MHz: a node (and the simulated and
                    # emulated GPUs) would round it, and could never lock the top clock.
                    raise ProfileError(
                        f"{path}:{line_number}: column 'clock_mhz' must be a whole number of "
                        f"MHz (GPUs lock whole MHz), got {raw!r}"
                    )
                columns[column].append(value)
    return _one_row_per_clock(path, columns, line_numbers)


MIN_PEAK_POWER_SHARE = 0.01
"""The least share of the manifest's ``power_limit_w`` the table's highest prefill or decode
power may be. A board serving a model draws far more than this (the bundled profiles' peaks
are 80-95 % of their limits); a table written in kW (0.6 for 600 W) loaded, and every
energy figure came out a thousandth of the board's."""


def _check_power_unit(
    columns: Mapping[str, NDArray[np.float64]], power_limit_w: float, path: Path
) -> None:
    """Refuse a table whose serving powers lie under :data:`MIN_PEAK_POWER_SHARE` of the
    limit: a unit slip (kW), not a board.

    Raises:
        ProfileError: naming the CSV, its highest power and the limit.
    """
    peak = float(max(np.max(columns["prefill_power_w"]), np.max(columns["decode_power_w"])))
    if peak < MIN_PEAK_POWER_SHARE * power_limit_w:
        raise ProfileError(
            f"{path}: its highest prefill or decode power is {peak:g} W, under "
            f"{100 * MIN_PEAK_POWER_SHARE:g}% of the manifest's power_limit_w "
            f"({power_limit_w:g} W); no board serves at that (a table in kW? the power "
            "columns are in W)"
        )


def _blank_row(row: Mapping[str | None, Any]) -> bool:
    """Whether a :class:`csv.DictReader` row holds nothing but empty or blank cells (a
    short row's missing cells are None, a long row's extra cells a list under None)."""
    cells: list[Any] = []
    for key, value in row.items():
        cells.extend(value if key is None and isinstance(value, list) else [value])
    return all(cell is None or not str(cell).strip() for cell in cells)


def _one_row_per_clock(
    path: Path, columns: Mapping[str, list[float]], line_numbers: list[int]
) -> dict[str, NDArray[np.float64]]:
    """The CSV's rows in ascending clock order, each clock once. Rows may come in any order
    (``nvidia-smi`` lists supported clocks descending, and a table written from it did
    too): they were refused unless strictly ascending. A clock listed again with the same
    values in every column is read once (a row pasted twice); listed again with other
    values it is refused, naming both lines and the column: which row is the GPU's is not
    the loader's to guess.

    Raises:
        ProfileError: a clock listed twice with different values, or fewer than two clocks.
    """
    order = sorted(range(len(line_numbers)), key=lambda row: columns["clock_mhz"][row])
    kept: list[int] = []
    for row in order:
        if kept and columns["clock_mhz"][row] == columns["clock_mhz"][kept[-1]]:
            first = kept[-1]
            for column in CSV_COLUMNS:
                if columns[column][row] != columns[column][first]:
                    later, earlier = sorted((row, first), key=lambda r: line_numbers[r])[::-1]
                    raise ProfileError(
                        f"{path}:{line_numbers[later]}: clock_mhz "
                        f"{columns['clock_mhz'][row]:g} is listed again (first on line "
                        f"{line_numbers[earlier]}) with another {column} "
                        f"({columns[column][later]:g}, not {columns[column][earlier]:g}); "
                        "one row per clock"
                    )
            continue
        kept.append(row)
    if len(kept) < 2:
        listed = "one clock" if line_numbers else "no clock rows"
        raise ProfileError(f"{path}: needs at least two clocks, has {listed}")
    return {
        key: np.asarray([values[row] for row in kept], dtype=float)
        for key, values in columns.items()
    }


REQUIRED_MANIFEST_KEYS = ("status", "csv", "ttft_slo_s", "tpot_slo_s", "power_limit_w", "thermal")
PROFILE_STATUSES = ("measured", "emulated", "literature-derived", "synthetic", "online-identified")
REQUIRED_THERMAL_KEYS = (
    "ambient_temperature_c",
    "thermal_resistance_c_per_w",
    "thermal_time_constant_s",
    "thermal_limit_c",
)

ENGINE_COUNT_KEYS = (
    "max_batch_size",
    "kv_capacity_tokens",
    "reference_batch_size",
    "reference_context_tokens",
)
"""The engine section's counts: each, where given, an integer of at least 1."""


def profile_files(name_or_path: str | Path) -> tuple[Path, ...]:
    """The files a profile is read from: its manifest and, when the manifest names one, the
    CSV beside it. Best effort, for refusing an output that would overwrite them: a profile
    that does not resolve or read names what it can (:func:`load_profile` reports why)."""
    try:
        manifest_path = resolve_profile_path(name_or_path)
        manifest = loads_json(_read_profile_file(manifest_path)[0])
    except (ProfileError, ValueError):
        return (Path(name_or_path),)
    csv_name = manifest.get("csv") if isinstance(manifest, dict) else None
    if not isinstance(csv_name, str):
        return (manifest_path,)
    return (manifest_path, csv_beside(manifest_path, csv_name))


def csv_beside(manifest_path: Path, csv_name: str) -> Path:
    """The CSV a manifest's ``csv`` names: beside the manifest or, where it is not there and
    the manifest is a link, beside the file the link leads to. A manifest linked from
    another folder (``current.json`` -> a versioned profile) was refused as "csv ... not
    found beside it"."""
    beside = manifest_path.parent / csv_name
    if path_exists(beside, dangling_links=True):
        return beside
    try:
        target = manifest_path.resolve(strict=True) if manifest_path.is_symlink() else None
    except (OSError, RuntimeError):
        target = None
    if target is not None and path_exists(target.parent / csv_name, dangling_links=True):
        return target.parent / csv_name
    return beside


def load_profile(name_or_path: str | Path) -> PerformanceProfile:
    """Load and validate a profile by bundled name or by manifest/CSV path.

    Raises:
        ProfileError: naming the file and the field or line that is wrong.
    """
    manifest_path = resolve_profile_path(name_or_path)
    manifest_text, manifest_sha256 = _read_profile_file(manifest_path)
    if not manifest_text.strip(" \t\r\n\ufeff"):
        # Was "manifest is not valid JSON: Expecting value", which did not say why.
        raise ProfileError(
            f"{manifest_path}: the manifest is empty; it must be a JSON object with "
            f"{', '.join(REQUIRED_MANIFEST_KEYS)}"
        )
    try:
        manifest = loads_json(manifest_text)
    except json.JSONDecodeError as error:
        raise ProfileError(
            f"{manifest_path}:{error.lineno}: manifest is not valid JSON: {error.msg}"
        ) from error
    if not isinstance(manifest, dict):
        raise ProfileError(f"{manifest_path}: manifest must be a JSON object")
    for key in REQUIRED_MANIFEST_KEYS:
        if key not in manifest:
            raise ProfileError(f"{manifest_path}: manifest lacks required key {key!r}")
    thermal = manifest["thermal"]
    if not isinstance(thermal, dict):
        raise ProfileError(f"{manifest_path}: 'thermal' must be an object")
    if manifest["status"] not in PROFILE_STATUSES:
        raise ProfileError(
            f"{manifest_path}: status must be one of {PROFILE_STATUSES}, "
            f"got {manifest['status']!r:.40}"
        )
    for key in REQUIRED_THERMAL_KEYS:
        value = thermal.get(key)
        if not _is_number(value):
            raise ProfileError(
                f"{manifest_path}: thermal.{key} must be a number, got {value!r:.40}"
            )
    for key in ("thermal_resistance_c_per_w", "thermal_time_constant_s"):
        if not thermal[key] > 0:
            raise ProfileError(
                f"{manifest_path}: thermal.{key} must be positive, got {thermal[key]!r}"
            )
    if not thermal["ambient_temperature_c"] > ABSOLUTE_ZERO_C:
        # -1e300 C was taken, and every result reported a 300-digit peak temperature.
        raise ProfileError(
            f"{manifest_path}: thermal.ambient_temperature_c must be above absolute zero "
            f"({ABSOLUTE_ZERO_C:g} C), got {thermal['ambient_temperature_c']!r}"
        )
    if not thermal["thermal_limit_c"] > thermal["ambient_temperature_c"]:
        raise ProfileError(
            f"{manifest_path}: thermal.thermal_limit_c ({thermal['thermal_limit_c']!r}) must "
            f"exceed thermal.ambient_temperature_c ({thermal['ambient_temperature_c']!r})"
        )
    engine = manifest.get("engine", {})
    if not isinstance(engine, dict):
        raise ProfileError(f"{manifest_path}: 'engine' must be an object")
    for key in ENGINE_COUNT_KEYS:
        if key not in engine:
            continue  # its default
        value = engine[key]
        # Bounded above too: a max_batch_size of 10**30 (an int no float holds exactly)
        # ended the load in a numpy TypeError traceback. A null is refused as any other
        # non-number: read as given, it ended a run in a TypeError traceback.
        if not (_is_number(value) and float(value).is_integer() and 1 <= value <= MAX_ENGINE_COUNT):
            raise ProfileError(
                f"{manifest_path}: engine.{key} must be an integer in "
                f"[1, {MAX_ENGINE_COUNT:g}], got {value!r:.40}"
            )
    reference_batch = engine.get("reference_batch_size")
    largest_batch = engine.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE)
    if reference_batch is None and largest_batch < DEFAULT_REFERENCE_BATCH_SIZE:
        # Read at the default batch, a one-place engine's CSV was taken as measured at a
        # batch the engine never runs, and every clock missed every SLO.
        raise ProfileError(
            f"{manifest_path}: engine.reference_batch_size is not given, and its default "
            f"({DEFAULT_REFERENCE_BATCH_SIZE}) is above engine.max_batch_size "
            f"({largest_batch!r}): state the batch the CSV's decode is measured at"
        )
    if reference_batch is not None and reference_batch > largest_batch:
        # A reference batch of 1e12 was taken: every batch the engine runs then decoded at
        # a trillionth of the CSV's latency, and a run missed every SLO at any clock.
        given = "" if "max_batch_size" in engine else " (its default)"
        raise ProfileError(
            f"{manifest_path}: engine.reference_batch_size ({reference_batch!r}) is above "
            f"engine.max_batch_size{given} ({largest_batch!r}): the CSV's decode is measured "
            "at a batch the engine runs"
        )
    for key, largest, unit in (
        ("ttft_slo_s", MAX_SLO_S, "s"),
        ("tpot_slo_s", MAX_SLO_S, "s"),
        ("power_limit_w", MAX_POWER_LIMIT_W, "W"),
    ):
        value = manifest[key]
        if not _is_number(value) or not value > 0:
            raise ProfileError(
                f"{manifest_path}: {key} must be a positive number, got {value!r:.40}"
            )
        if value > largest:
            # 1e308 s or 1e200 W was taken: the run then failed in its controller with an
            # OverflowError, or printed numpy's RuntimeWarnings, after the work had begun.
            raise ProfileError(
                f"{manifest_path}: {key} must be at most {largest:g} {unit}, got {value!r}"
            )
    clock_range = manifest.get("clock_range_mhz")
    if clock_range is not None and not (
        isinstance(clock_range, list)
        and len(clock_range) == 2
        and all(_is_number(value) and value > 0 for value in clock_range)
        and clock_range[0] < clock_range[1]
    ):
        raise ProfileError(
            f"{manifest_path}: clock_range_mhz must be [lowest, highest] with "
            f"0 < lowest < highest, got {clock_range!r:.40}"
        )
    allowance = manifest.get("ttft_slo_per_prompt_token_s", 0.0)
    if not _is_number(allowance) or not 0 <= allowance <= MAX_SLO_S:
        raise ProfileError(
            f"{manifest_path}: ttft_slo_per_prompt_token_s must be a number in "
            f"[0, {MAX_SLO_S:g}] s, got {allowance!r:.40}"
        )
    tp = _tp_size(manifest.get("tensor_parallel", 1))
    if not isinstance(tp, int) or isinstance(tp, bool) or not 1 <= tp <= MAX_TENSOR_PARALLEL:
        raise ProfileError(
            f"{manifest_path}: tensor_parallel size must be an integer in "
            f"[1, {MAX_TENSOR_PARALLEL}], got {tp!r:.40}"
        )
    csv_name = manifest["csv"]
    if not isinstance(csv_name, str) or not csv_name.strip():
        # null was looked for as a file named "None", and "" or "." read the manifest's
        # folder, refused as "DIR: is a directory" with no word of the manifest's key.
        raise ProfileError(
            f"{manifest_path}: csv must be the file name of the profile's CSV, got {csv_name!r:.80}"
        )
    csv_path = csv_beside(manifest_path, csv_name)
    if not csv_path.exists():
        raise ProfileError(f"{manifest_path}: csv {csv_name!r:.80} not found beside it")
    if csv_path.is_dir():
        raise ProfileError(
            f"{manifest_path}: csv {csv_name!r:.80} is a directory, not the profile's CSV"
        )
    _check_named_csv_is_read(name_or_path, manifest_path, csv_path)
    csv_text, csv_sha256 = _read_profile_file(csv_path)
    columns = _read_csv(csv_path, csv_text, float(manifest["power_limit_w"]))
    _check_power_unit(columns, float(manifest["power_limit_w"]), csv_path)
    clocks = columns["clock_mhz"]
    lowest, highest = float(clocks[0]), float(clocks[-1])
    step = manifest.get("clock_step_mhz")
    if step is not None and not (_is_number(step) and 0 < step <= highest - lowest):
        raise ProfileError(
            f"{manifest_path}: clock_step_mhz must be a number above 0 and at most the "
            f"clock range of {csv_path.name} ({highest - lowest:g} MHz), got {step!r:.40}"
        )
    idle_clock = manifest.get("idle_clock_mhz")
    # The clock an idle GPU drops to may lie below the table's lowest (an A100 idles at
    # 210 MHz, its profiles start at 510), never above its highest.
    if idle_clock is not None and not (_is_number(idle_clock) and 0 < idle_clock <= highest):
        raise ProfileError(
            f"{manifest_path}: idle_clock_mhz must be a number above 0 and at most the "
            f"highest clock of {csv_path.name} ({highest:g} MHz), got {idle_clock!r:.40}"
        )
    if clock_range is not None and (float(clock_range[0]), float(clock_range[1])) != (
        lowest,
        highest,
    ):
        raise ProfileError(
            f"{manifest_path}: clock_range_mhz {clock_range!r} disagrees with the clocks "
            f"of {csv_path.name} ({lowest:g}-{highest:g} MHz)"
        )
    try:
        profile = PerformanceProfile(
            **columns,
            ttft_slo_s=float(manifest["ttft_slo_s"]),
            tpot_slo_s=float(manifest["tpot_slo_s"]),
            manifest=manifest,
            name=manifest_path.stem,
            profile_csv_sha256=csv_sha256,
            manifest_sha256=manifest_sha256,
        )
    except ValueError as error:
        raise ProfileError(f"{manifest_path}: {error}") from error
    _check_model_sections(manifest, manifest_path)
    for section in MODEL_SECTION_KEYS:
        try:
            getattr(profile, section)
        except KeyError as error:
            raise ProfileError(f"{manifest_path}: {section}.{error.args[0]} is missing") from error
        except (TypeError, ValueError, OverflowError) as error:
            raise ProfileError(f"{manifest_path}: {section} is invalid: {error}") from error
    _check_batch_power(profile, manifest_path, csv_path.name)
    idle_floor = float(np.min(profile.idle_power_w))
    if idle_floor >= float(manifest["power_limit_w"]):
        raise ProfileError(
            f"{manifest_path}: power_limit_w ({manifest['power_limit_w']!r} W) is not above "
            f"the idle power of {csv_path.name} at any clock (at least {idle_floor:g} W): a "
            "board cannot idle at its power limit (a TP domain's limit and powers are sums)"
        )
    _check_idle_below_thermal_limit(profile, manifest_path, csv_path.name)
    return profile


def _check_named_csv_is_read(name_or_path: str | Path, manifest_path: Path, csv_path: Path) -> None:
    """Refuse a profile named by its CSV whose manifest reads another CSV: ``--profile
    a.csv`` beside an ``a.json`` whose ``csv`` is ``b.csv`` ran on b.csv's table, with no
    word that the table named was never read.

    Raises:
        ProfileError: naming the CSV given, the manifest and its ``csv``.
    """
    given = Path(name_or_path)
    if given.suffix.lower() != ".csv":
        return
    try:
        same = given.resolve() == csv_path.resolve() or given.samefile(csv_path)
    except OSError:
        same = False
    if not same:
        raise ProfileError(
            f"{_cut(str(given))}: its manifest {manifest_path.name} reads csv "
            f"{csv_path.name!r:.80}, not this file; name the manifest to load its table, or "
            f"set its csv to {given.name!r:.80}"
        )


def _check_idle_below_thermal_limit(
    profile: PerformanceProfile, manifest_path: Path, csv_name: str
) -> None:
    """Refuse a thermal section whose steady temperature at the table's lowest idle power
    (``ambient + R * P``) is already at or over the thermal limit: the plant then throttles
    to the lowest clock for the whole run, loaded or not. A TP profile that states one GPU's
    resistance against its summed powers did this silently (a TP8 domain at a steady 97 C
    idle under an 87 C limit, every run at the lowest clock).

    Raises:
        ProfileError: naming the manifest and the thermal fields.
    """
    thermal = profile.manifest["thermal"]
    ambient = float(thermal["ambient_temperature_c"])
    resistance = float(thermal["thermal_resistance_c_per_w"])
    limit = float(thermal["thermal_limit_c"])
    idle_floor = float(np.min(profile.idle_power_w))
    steady = ambient + resistance * idle_floor
    if not steady < limit:
        raise ProfileError(
            f"{manifest_path}: thermal.thermal_resistance_c_per_w ({resistance:g} C/W) puts "
            f"the lowest idle power of {csv_name} ({idle_floor:g} W) at a steady {steady:.4g} C, "
            f"not below thermal.thermal_limit_c ({limit:g} C): a board cannot idle at its "
            "thermal limit (a TP domain's powers are sums, so its resistance is one GPU's "
            "divided by the GPU count)"
        )


MODEL_SECTION_KEYS = {
    "decode_latency_model": ("weight_fraction", "batch_fraction", "kv_fraction"),
    "decode_power_batch_model": ("k", "x0"),
}
"""The manifest's optional engine-model sections and the numbers each must hold."""


def _check_model_sections(manifest: Mapping[str, Any], manifest_path: Path) -> None:
    """Refuse an engine-model section that is not an object of numbers: a list was refused
    as "list indices must be integers or slices, not str", a string as "string indices
    must be integers", and ``true`` was read as 1.0. ``null`` or ``{}`` is no section.

    Raises:
        ProfileError: naming the manifest, the section and the key.
    """
    for section, keys in MODEL_SECTION_KEYS.items():
        raw = manifest.get(section)
        if raw is None or raw == {}:
            continue
        if not isinstance(raw, dict):
            raise ProfileError(
                f"{manifest_path}: {section} must be an object with {', '.join(keys)}, "
                f"got {raw!r:.40}"
            )
        for key in keys:
            if key not in raw:
                raise ProfileError(f"{manifest_path}: {section}.{key} is missing")
            if not _is_number(raw[key]):
                raise ProfileError(
                    f"{manifest_path}: {section} is invalid: {key} must be a number, "
                    f"got {raw[key]!r:.40}"
                )


def _check_batch_power(profile: PerformanceProfile, manifest_path: Path, csv_name: str) -> None:
    """Refuse a batch power model whose factor is not a finite number over the batches the
    engine runs (1 to ``max_batch_size``): an ``x0`` so far above the reference batch that
    its sigmoid underflows to zero made every decode power NaN, and a run crashed writing
    its results. Refuse too a CSV whose decode power the model takes to zero or below
    at some batch: ``idle + (decode - idle) * factor`` falls as the batch grows where
    ``decode_power_w`` is below ``idle_power_w``, and a run crashed mid-way on a negative
    power reading.

    Raises:
        ProfileError: naming the manifest and the section, or the CSV and the clock.
    """
    model = profile.decode_power_batch_model
    if model is None:
        return
    reference = profile.decode_latency_model.reference_batch_size
    largest = int(profile.manifest.get("engine", {}).get("max_batch_size", DEFAULT_MAX_BATCH_SIZE))
    with np.errstate(all="ignore"):
        factors = [model.factor(batch, reference) for batch in (1, reference, largest)]
    if not all(math.isfinite(factor) for factor in factors):
        raise ProfileError(
            f"{manifest_path}: decode_power_batch_model (k {model.k!r}, x0 {model.x0!r}) "
            f"gives no finite power factor at batches 1-{largest} against the reference "
            f"batch {reference}"
        )
    # The factor grows with the batch (k >= 0): the lowest power is at batch 1 or the largest.
    for batch, factor in ((1, factors[0]), (largest, factors[-1])):
        powers = profile.idle_power_w + (profile.decode_power_w - profile.idle_power_w) * factor
        if np.any(powers <= 0.0):
            row = int(np.flatnonzero(powers <= 0.0)[0])
            raise ProfileError(
                f"{manifest_path}: decode_power_batch_model takes the decode power of "
                f"{csv_name} at {profile.clock_mhz[row]:g} MHz to {powers[row]:.4g} W at batch "
                f"{batch}: its decode_power_w ({profile.decode_power_w[row]:g} W) is below "
                f"its idle_power_w ({profile.idle_power_w[row]:g} W)"
            )


MAX_TENSOR_PARALLEL = 1024
"""The largest TP degree a profile may state (a rack-scale NVLink domain holds 576 GPUs)."""
MAX_CLOCK_MHZ = 100_000.0
"""The highest clock a profile may list (the daemon's flags and config take no more)."""
MAX_SLO_S = 10.0 * 365 * 86_400
"""The longest SLO a profile may state: ten years, the bound of every duration flag
(``gpugov.daemon.limits.MAX_SECONDS``; the plant imports nothing of ours, a test holds
them equal)."""
MAX_POWER_LIMIT_W = 1_000_000.0
"""The largest ``power_limit_w`` a profile may state: the config's and a ``--controller``
spec's bound on a power (``gpugov.daemon.limits.MAX_POWER_W``; a test holds them equal)."""
ABSOLUTE_ZERO_C = -273.15
"""No ambient temperature is at or below it."""


def _is_number(value: object) -> bool:
    """A finite int or float that is not a bool (JSON ``true`` is not a number here); an
    integer too large for a float (``10**400`` in a manifest) is none either."""
    return finite_number(value) is not None
