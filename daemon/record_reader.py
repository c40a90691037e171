"""Reading a recording back (``--record FILE.jsonl``): :func:`read_recording`, and the
checks ``replay`` and ``plot`` share, run on the whole file before either does any work
(:func:`check_recording`: the header's period, domains, safety settings and context;
every tick's domain, fields and order), and an observation rebuilt from a tick.

The writer and the format are :mod:`daemon.record`'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpugov import __version__
from gpugov.daemon.config import SafetyConfig, SLOTargetConfig
from gpugov.daemon.config_types import FrozenModel
from gpugov.daemon.errors import printable
from gpugov.daemon.files import InputFileError, loads_json, read_input_text
from gpugov.daemon.limits import (
    MAX_CLOCK_MHZ,
    MAX_COUNT,
    MAX_PERIOD_S,
    MAX_POWER_W,
    MIN_PERIOD_S,
)
from gpugov.daemon.record import RECORD_FORMAT, RecordingError, RecordingWarning
from gpugov.plant.input_files import finite_number
from gpugov.plant.types import ServingObservation

OBSERVATION_ROLES = ("colocated", "prefill", "decode")
"""The roles a recorded observation may carry (a domain's ``role``)."""

_OBSERVATION_TYPES = {f.name: str(f.type) for f in dataclasses.fields(ServingObservation)}
"""Each observation field's annotation (``"float | None"``, ``"int"``, ``"str"``...)."""

_REQUIRED_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(ServingObservation)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)
"""The observation fields a tick must carry (a null temperature is allowed: NaN)."""


def _field_value(name: str, value: Any) -> Any:
    """``value`` as observation field ``name`` takes it, or ValueError naming the field:
    numbers for numbers (integers for counts; no booleans), text for text, null only
    where the field is optional."""
    annotation = _OBSERVATION_TYPES[name]
    kind = annotation.removesuffix(" | None")
    wanted = {"float": "a number", "int": "an integer", "str": "text"}.get(kind)
    if wanted is None:
        return value
    if value is None:
        if annotation.endswith(" | None"):
            return None
        raise ValueError(f"field {name} must be {wanted}, got null")
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"field {name} must be {wanted}, got {value!r:.40}")
        if name == "role" and value not in OBSERVATION_ROLES:
            raise ValueError(
                f"field role must be one of {', '.join(OBSERVATION_ROLES)}, got {value!r:.40}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"field {name} must be {wanted}, got {value!r:.40}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float (10**400)
        raise ValueError(
            f"field {name} must be {wanted} a float holds, got {value!r:.40}"
        ) from None
    if kind == "int":
        if not number.is_integer():
            raise ValueError(f"field {name} must be {wanted}, got {value!r:.40}")
        return int(value)
    return number


def recorded_domains(where: str, header: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """A recording header's period and its domains by name, each an object with a text
    name: what every reader of a recording needs of it (replay and plot check the rest).

    Raises:
        RecordingError: a field of the wrong kind, named after ``where`` (the file and
            "header").
    """
    period = finite_number(header.get("period_s", 1.0))
    if period is None or period <= 0.0:
        raise RecordingError(
            f"{where} period_s must be a positive number, got {header.get('period_s')!r:.40}"
        )
    if not MIN_PERIOD_S <= period <= MAX_PERIOD_S:  # what no run writes (1e300 overflows mpc)
        raise RecordingError(
            f"{where} period_s must be from {MIN_PERIOD_S:g} to {MAX_PERIOD_S:g} s (the "
            f"config's daemon.period_s bounds), got {header.get('period_s')!r:.40}"
        )
    listed = header.get("domains", [])
    if not isinstance(listed, list):
        raise RecordingError(f"{where} domains must be a list, got {listed!r:.40}")
    domains: dict[str, Any] = {}
    for index, info in enumerate(listed):
        if not isinstance(info, dict) or not isinstance(info.get("name"), str):
            raise RecordingError(f"{where} domains[{index}] is no object with a name")
        if not info["name"].isprintable():  # a newline in it cut replay's lines in two
            raise RecordingError(
                f"{where} domains[{index}].name must be printable text (no control "
                f"characters), got {info['name']!r:.80}"
            )
        if info["name"] in domains:  # its ticks would be read as one domain's
            first = next(i for i, other in enumerate(listed) if other is domains[info["name"]])
            raise RecordingError(
                f"{where} domains[{index}] names domain {info['name']!r:.40} again "
                f"(domains[{first}])"
            )
        domains[info["name"]] = info
    return period, domains


def tick_domain(where: str, row: object, domains: Mapping[str, Any]) -> str:
    """The domain a tick line names, which the header must list.

    Raises:
        RecordingError: the line is no JSON object, or names no listed domain.
    """
    if not isinstance(row, dict):
        raise RecordingError(f"{where} a tick is a JSON object, got {row!r:.40}")
    domain = row.get("domain")
    if not isinstance(domain, str) or domain not in domains:
        raise RecordingError(f"{where} domain {domain!r:.40} is not in the header")
    return domain


HEADER_FIELDS = frozenset(
    {
        "format",
        "gpugov_version",
        "mode",
        "engine_view",
        "period_s",
        "dry_run",
        "domains",
        # run --simulate's: what it replayed.
        "trace",
        "profile",
        "requests",
        "speed",
    }
)
"""The header fields a recording may carry (what :class:`Recorder`'s callers write)."""

RECORDING_MODES = ("node", "simulated")
"""A header's ``mode``: a node's run, or ``run --simulate``."""

_POSITIVE_FIELDS = frozenset(
    {
        "kv_capacity_tokens",
        "power_limit_w",
        "thermal_limit_c",
        "requested_clock_mhz",
        "ttft_slo_s",
        "tpot_slo_s",
    }
)
"""Observation fields that are more than 0 where known (null: not known)."""

_SIGNED_FIELDS = frozenset({"time_s", "temperature_c"})
"""Observation numbers that may be below 0 (a clock's origin, a cold room); the other
numbers are counts, tokens, powers, energies, latencies or clocks, at least 0."""

_CLOCK_FIELDS = frozenset({"requested_clock_mhz", "realized_clock_mhz"})


def _checked_number(where: str, name: str, value: object, low: str = "") -> float | None:
    """``value`` (null: None) as a finite number, ``low`` ``"positive"`` or
    ``"non-negative"`` when it must be; else :class:`RecordingError` naming ``name``."""
    if value is None:
        return None
    number = finite_number(value)
    wanted = {"positive": "a positive number", "non-negative": "a number >= 0"}.get(
        low, "a finite number"
    )
    if (
        number is None
        or (low == "positive" and not number > 0.0)
        or (low == "non-negative" and number < 0.0)
    ):
        raise RecordingError(f"{where} {name} must be {wanted}, got {value!r:.40}")
    return number


def check_header(source: str | Path, header: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """A recording header's period and domains by name, every field replay and plot read
    checked (``FILE:1: header FIELD ...``): only known fields; the version and mode text,
    the mode one gpugov writes; at least one domain, named once, with text for its
    controller, supported clocks positive and ascending, safety settings and an SLO target
    the config would take, ``gpus`` and ``gpu_names`` lists, ``power_budget_held`` true or
    false, a ``controller_config`` object whose forecasts are bounded token counts, and a
    ``context`` object (:func:`_check_recorded_context`).

    Raises:
        RecordingError: naming the file and the field.
    """
    where = f"{source}:1: header"
    unknown = sorted(set(header) - HEADER_FIELDS)
    if unknown:
        written_by = header.get("gpugov_version")
        newer = (
            f"; the recording was written by gpugov {printable(written_by[:40])}, newer than this "
            f"{__version__}: read it with that gpugov"
            if isinstance(written_by, str) and _newer_version(written_by)
            else ""
        )
        raise RecordingError(
            f"{where} field {unknown[0]!r:.40} is not one gpugov writes "
            f"(known: {', '.join(sorted(HEADER_FIELDS))}){newer}"
        )
    period, domains = recorded_domains(where, header)
    for key in ("gpugov_version", "engine_view", "trace", "profile"):
        if header.get(key) is not None and not isinstance(header[key], str):
            raise RecordingError(f"{where} {key} must be text, got {header[key]!r:.40}")
    mode = header.get("mode")
    if mode is not None and mode not in RECORDING_MODES:
        raise RecordingError(
            f"{where} mode must be one of {', '.join(RECORDING_MODES)}, got {mode!r:.40}"
        )
    if header.get("dry_run") is not None and not isinstance(header["dry_run"], bool):
        raise RecordingError(
            f"{where} dry_run must be true or false, got {header['dry_run']!r:.40}"
        )
    if not domains:
        raise RecordingError(f"{where} domains must name at least one domain, got []")
    for index, info in enumerate(domains.values()):
        field = f"domains[{index}]"
        controller = info.get("controller")
        if controller is not None and not isinstance(controller, str):
            raise RecordingError(f"{where} {field}.controller must be text, got {controller!r:.40}")
        clocks = info.get("supported_clocks_mhz")
        if not clocks:
            raise RecordingError(
                f"{where} {field}.supported_clocks_mhz: domain {info['name']!r:.40} has no "
                "supported clocks in the header"
            )
        values = [finite_number(clock) for clock in clocks] if isinstance(clocks, list) else [None]
        if any(value is None or not 0.0 < value <= MAX_CLOCK_MHZ for value in values):
            raise RecordingError(
                f"{where} {field}.supported_clocks_mhz must be positive numbers of at most "
                f"{MAX_CLOCK_MHZ:g} MHz, got {clocks!r:.60}"
            )
        ascending = [float(value) for value in values if value is not None]
        if any(b <= a for a, b in itertools.pairwise(ascending)):
            raise RecordingError(
                f"{where} {field}.supported_clocks_mhz must be ascending (as NVML lists "
                f"them, sorted), got {clocks!r:.60}"
            )
        safety = info.get("safety") or {}
        limits = ("dwell_s", "floor_mhz", "min_relock_interval_s")
        if not isinstance(safety, dict) or any(
            safety.get(key) is not None and _negative_or_no_number(safety[key]) for key in limits
        ):
            raise RecordingError(
                f"{where} {field}.safety must hold non-negative numbers, got {safety!r:.60}"
            )
        _check_as_config(where, f"{field}.safety", safety, SafetyConfig)
        if info.get("slo_target") is not None:
            _check_as_config(where, f"{field}.slo_target", info["slo_target"], SLOTargetConfig)
        for key in ("gpus", "gpu_names"):
            if info.get(key) is not None and not isinstance(info[key], list):
                raise RecordingError(f"{where} {field}.{key} must be a list, got {info[key]!r:.40}")
        held = info.get("power_budget_held")
        if held is not None and not isinstance(held, bool):
            raise RecordingError(
                f"{where} {field}.power_budget_held must be true or false, got {held!r:.40}"
            )
        _check_recorded_forecasts(
            f"{where} {field}.controller_config", info.get("controller_config")
        )
        _check_recorded_context(f"{where} {field}.context", info.get("context"))
    return period, domains


CONTEXT_LIMITS = ("ttft_slo_s", "tpot_slo_s", "thermal_limit_c", "power_limit_w")
"""The numbers of a domain's recorded ``context`` (positive, or null: not known)."""


def _check_recorded_context(where: str, context: object) -> None:
    """A domain's recorded ``context`` (what its controller was told beyond the rest of
    the header): an object (or null) whose SLOs and limits are positive numbers or null,
    ``gpu_uuids`` a list of text and ``forecasts`` bounded token counts."""
    if context is None:
        return
    if not isinstance(context, dict):
        raise RecordingError(f"{where} must be an object, got {context!r:.40}")
    for key in CONTEXT_LIMITS:
        value = context.get(key)
        number = finite_number(value)
        if value is not None and (number is None or not number > 0.0):
            raise RecordingError(
                f"{where}.{key} must be a positive number or null, got {value!r:.40}"
            )
    uuids = context.get("gpu_uuids")
    if uuids is not None and not (
        isinstance(uuids, list) and all(isinstance(uuid, str) for uuid in uuids)
    ):
        raise RecordingError(f"{where}.gpu_uuids must be a list of text, got {uuids!r:.40}")
    _check_recorded_forecasts(f"{where}.forecasts", context.get("forecasts"))


def _negative_or_no_number(value: object) -> bool:
    """Whether ``value`` is no finite number, or a negative one (a zero is a setting: a
    dwell of 0 s, no relock interval)."""
    number = finite_number(value)
    return number is None or number < 0.0


def _check_as_config(where: str, field: str, value: object, model: type[FrozenModel]) -> None:
    """Refuse ``value`` unless the config's ``model`` takes it (its keys and bounds): a
    node writes only what its config held."""
    try:
        model.model_validate(value)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise RecordingError(
            f"{where} {field}{'.' + key if key else ''}: {first['msg']}, got {first['input']!r:.40}"
        ) from None


def _check_recorded_forecasts(where: str, config: object) -> None:
    """A recorded ``controller_config`` (or a recorded context's ``forecasts``): an object
    (or null) whose declared forecasts, which replay hands to the controller, are token
    counts within the config's bounds."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise RecordingError(f"{where} must be an object, got {config!r:.40}")
    for key in ("mean_prompt_tokens", "mean_output_tokens", "ttft_prompt_tokens"):
        value = config.get(key)
        number = finite_number(value)
        if value is not None and (number is None or not 0.0 < number <= MAX_COUNT):
            raise RecordingError(
                f"{where}.{key} must be a token count in (0, {MAX_COUNT:g}] or null, "
                f"got {value!r:.40}"
            )


def check_ticks(
    source: str | Path,
    rows: Sequence[object],
    domains: Mapping[str, Any],
    also: Callable[[str, dict[str, Any]], None] | None = None,
) -> None:
    """Every tick line checked before any is used (``FILE:LINE: FIELD ...``): an object
    naming a listed domain, with an observation :func:`observation_from_dict` takes whose
    numbers are finite and physical (powers, counts, latencies at least 0; clocks, SLOs,
    limits and the KV capacity above 0; clocks at most :data:`MAX_CLOCK_MHZ`), its time
    never going back within a domain; the tick's own time, its clocks (decided,
    requested, applied: positive and at most :data:`MAX_CLOCK_MHZ`, or null), solve time,
    step, power cap (positive and at most :data:`MAX_POWER_W`, or null) and fail-safe
    flag of their kinds. A
    recording without tick lines is refused too: there is nothing to read in it.
    ``also(where, row)``: a reader's own checks of a tick whose fields passed, before its
    time is compared with the previous tick's (plot's limits of what it can draw).

    Raises:
        RecordingError: naming the file, the line and the field.
    """
    if not rows:
        raise RecordingError(f"{source}: no tick lines after the header (the run recorded none)")
    previous: dict[str, tuple[float, float]] = {}
    for number, row in enumerate(rows, start=2):
        where = f"{source}:{number}:"
        domain = tick_domain(where, row, domains)
        assert isinstance(row, dict)
        if "observation" not in row:
            raise RecordingError(f"{where} the tick has no 'observation'")
        raw = row["observation"]
        try:
            observation_from_dict(raw)
        except (TypeError, ValueError) as error:
            raise RecordingError(f"{where} bad observation: {error}") from error
        for name, value in raw.items():
            if _OBSERVATION_TYPES.get(name, "").removesuffix(" | None") not in ("float", "int"):
                continue
            low = (
                "positive"
                if name in _POSITIVE_FIELDS
                else ("" if name in _SIGNED_FIELDS else "non-negative")
            )
            checked = _checked_number(where, f"observation.{name}", value, low)
            if name in _CLOCK_FIELDS and checked is not None and checked > MAX_CLOCK_MHZ:
                raise RecordingError(
                    f"{where} observation.{name} must be at most {MAX_CLOCK_MHZ:g} MHz, "
                    f"got {value!r:.40}"
                )
        time_s = _checked_number(where, "time_s", row.get("time_s"))
        requested = _checked_number(where, "requested_mhz", row.get("requested_mhz"), "positive")
        if requested is not None and requested > MAX_CLOCK_MHZ:
            raise RecordingError(
                f"{where} requested_mhz must be at most {MAX_CLOCK_MHZ:g} MHz, "
                f"got {row['requested_mhz']!r:.40}"
            )
        for key, most, unit in (
            ("decision_mhz", MAX_CLOCK_MHZ, "MHz"),
            ("applied_mhz", MAX_CLOCK_MHZ, "MHz"),
            ("power_cap_w", MAX_POWER_W, "W"),
        ):
            checked = _checked_number(where, key, row.get(key), "positive")
            if checked is not None and checked > most:
                raise RecordingError(
                    f"{where} {key} must be at most {most:g} {unit}, got {row[key]!r:.40}"
                )
        _checked_number(where, "solve_s", row.get("solve_s"), "non-negative")
        step = row.get("step", 0)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise RecordingError(f"{where} step must be an integer >= 0, got {step!r:.40}")
        if row.get("failsafe") is not None and not isinstance(row["failsafe"], bool):
            raise RecordingError(
                f"{where} failsafe must be true or false, got {row['failsafe']!r:.40}"
            )
        if also is not None:
            also(where, row)
        observed = float(raw["time_s"])
        tick = observed if time_s is None else time_s
        if domain in previous:
            last_observed, last_tick = previous[domain]
            for name, now, last in (
                ("observation.time_s", observed, last_observed),
                ("time_s", tick, last_tick),
            ):
                if now < last:
                    raise RecordingError(
                        f"{where} {name} {now:g} is before the previous tick's {last:g} "
                        f"in domain {domain!r:.40}"
                    )
        previous[domain] = (observed, tick)


def check_recording(
    source: str | Path, header: Mapping[str, Any], rows: Sequence[object]
) -> tuple[float, dict[str, Any]]:
    """:func:`check_header` and :func:`check_ticks`: what replay and plot read of a
    recording, checked whole before either does any work; the period and the domains."""
    period, domains = check_header(source, header)
    check_ticks(source, rows, domains)
    return period, domains


def observation_from_dict(
    data: Mapping[str, Any], supported_clocks_mhz: Sequence[float] = ()
) -> ServingObservation:
    """Rebuild an observation (a null temperature comes back as NaN).

    Raises:
        ValueError: a field unknown, missing or of the wrong kind (named), or a value the
            observation refuses.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"an observation is a JSON object, got {data!r:.40}")
    values = dict(data)
    if values.get("temperature_c") is None:
        values["temperature_c"] = math.nan
    unknown = sorted(set(values) - set(_OBSERVATION_TYPES) - {"supported_clocks_mhz"})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r:.40}")
    missing = [name for name in _REQUIRED_FIELDS if name not in values]
    if missing:
        raise ValueError(f"field {missing[0]} is missing")
    values = {name: _field_value(name, value) for name, value in values.items()}
    values["supported_clocks_mhz"] = tuple(float(c) for c in supported_clocks_mhz)
    return ServingObservation(**values)


def read_recording(
    path: str | Path, *, warn: Callable[[str], None] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the tick lines of a recording.

    A last line that is not complete JSON and has no newline (a run killed mid-write) is
    dropped, and ``warn`` (default: :func:`warnings.warn`) gets one line saying so; a
    complete line that is not JSON is refused wherever it stands.

    Raises:
        RecordingError: unreadable, not JSON lines, or not a gpugov recording.
    """
    source = Path(path)
    try:
        text = read_input_text(source, "recording")
    except InputFileError as error:
        raise RecordingError(str(error)) from error
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise RecordingError(f"{source}: empty recording")
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(loads_json(line))
        except json.JSONDecodeError as error:
            # The writer appends a line and its newline at once: only a last line
            # without its newline is a run killed mid-write.
            if number == len(lines) and number > 1 and not text.endswith("\n"):
                message = (
                    f"{source}:{number}: last line is incomplete (the run was cut short?); "
                    f"using the {number - 1} complete line(s) before it"
                )
                if warn is None:
                    warnings.warn(message, RecordingWarning, stacklevel=2)
                else:
                    warn(message)
                break
            raise RecordingError(f"{source}:{number}: not JSON: {error.msg}") from error
    header = rows[0]
    if not isinstance(header, dict) or header.get("format") != RECORD_FORMAT:
        written_by = header.get("gpugov_version") if isinstance(header, dict) else None
        later = isinstance(header, dict) and re.fullmatch(
            r"gpugov-record-v[0-9]{1,6}", str(header.get("format"))
        )
        if later and isinstance(written_by, str) and _newer_version(written_by):
            raise RecordingError(
                f"{source}:1: format {header['format']!r}, written by gpugov "
                f"{printable(written_by[:40])}; this gpugov {__version__} reads {RECORD_FORMAT}: "
                f"read it with gpugov {printable(written_by[:40])} or later"
            )
        raise RecordingError(f"{source}:1: not a {RECORD_FORMAT} header")
    return header, rows[1:]


def _newer_version(version: str) -> bool:
    """Whether ``version`` (``X.Y.Z``, a recording's ``gpugov_version``) is later than
    this gpugov's: what it wrote this one may not read. Not a version: False."""

    def numbers(text: str) -> tuple[int, ...] | None:
        found = re.match(r"([0-9]{1,6}(?:\.[0-9]{1,6}){0,3})(?![0-9])", text)
        return tuple(int(part) for part in found.group(1).split(".")) if found else None

    theirs, ours = numbers(version), numbers(__version__)
    return theirs is not None and ours is not None and theirs > ours
