"""docs/daemon.md's config tables (``| key | default | meaning |``) name every key the
config models take, and only those, with the default each model gives where the table
states a plain value."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpugov.daemon.config import DaemonSection, DomainConfig

DAEMON_MD = Path(__file__).resolve().parents[2] / "docs" / "daemon.md"
SECTIONS: dict[str, type[BaseModel]] = {"[daemon]": DaemonSection, "[[domains]]": DomainConfig}


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds (itself or inside ``X | None``), if any."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _keys(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every key of ``model`` as the docs spell it (``engine.url``), with its default."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        inner = _model_in(field.annotation)
        if name == "controller":  # its other keys depend on its kind: the prose after
            keys[f"{prefix}controller.kind"] = field.default.kind
        elif inner is not None:
            keys.update(_keys(inner, f"{prefix}{name}."))
        else:
            keys[f"{prefix}{name}"] = field.default
    return keys


def _tables() -> dict[str, dict[str, str]]:
    """Each section's table: key -> its default cell."""
    tables: dict[str, dict[str, str]] = {}
    section = None
    for line in DAEMON_MD.read_text().splitlines():
        heading = re.match(r"^`(\[daemon\]|\[\[domains\]\])`", line)
        if heading:
            section = heading.group(1)
            tables.setdefault(section, {})
        elif section and line.startswith("| `"):
            keys_cell, default = (cell.strip() for cell in line.split("|")[1:3])
            for key in re.findall(r"`([^`]+)`", keys_cell):
                tables[section][key] = default
        elif section and tables[section] and not line.startswith("|"):
            section = None  # the table ended
    return tables


def _plain(cell: str) -> Any:
    """A default cell's value where it is one plain value (``0.5``, ``"max"``, ``false``,
    ``unset``, ``required``), else None (prose: ``3 × period_s``)."""
    cell = cell.strip("`")
    if cell in ("unset", "required"):
        return PydanticUndefined if cell == "required" else None
    if cell in ("true", "false"):
        return cell == "true"
    if re.fullmatch(r'"[^"]*"', cell):
        return cell.strip('"')
    if re.fullmatch(r"-?\d+(\.\d+)?", cell):
        return float(cell)
    return ...


def test_config_tables_name_every_key_with_its_default() -> None:
    tables = _tables()
    problems = []
    for section, model in SECTIONS.items():
        table = tables.get(section)
        assert table, f"docs/daemon.md has no {section} table"
        keys = _keys(model)
        problems += [
            f"{section} {key}: in the config, not in the table" for key in keys - table.keys()
        ]
        problems += [
            f"{section} {key}: in the table, no key of the config" for key in table - keys.keys()
        ]
        for key, cell in table.items():
            stated = _plain(cell)
            if key not in keys or stated is ...:
                continue
            actual = keys[key]
            actual = str(actual) if hasattr(actual, "as_posix") else actual
            if isinstance(actual, bool) or not isinstance(actual, (int, float)):
                same = stated == actual
            else:
                same = stated is not None and float(actual) == stated
            if not same:
                problems.append(
                    f"{section} {key}: the table says {cell}, the default is {actual!r}"
                )
    assert not problems, problems


def test_daemon_module_table_names_every_daemon_module() -> None:
    """docs/daemon.md's module table is the map of daemon/: each module has a row (a
    module split out of another, or added, gets one with it)."""
    text = DAEMON_MD.read_text()
    start = text.index("| module | role |")
    table = text[start : text.index("\n\n", start)]
    named = set(re.findall(r"`daemon/([a-z_]+\.py)`", table))
    daemon = DAEMON_MD.parents[1] / "daemon"
    modules = {p.name for p in daemon.glob("*.py") if p.name != "__init__.py"}
    assert sorted(modules - named) == []
    assert sorted(named - modules) == []


def test_recording_section_names_every_header_field() -> None:
    """docs/daemon.md's "Recording and replay" describes the recording's header: every
    field a header may carry (``record_reader.HEADER_FIELDS``) is named there."""
    from gpugov.daemon.record_reader import HEADER_FIELDS

    text = DAEMON_MD.read_text()
    start = text.index("## Recording and replay")
    section = text[start : text.index("\n## ", start + 1)]
    assert sorted(f for f in HEADER_FIELDS if f"`{f}`" not in section) == []


def test_recording_section_names_every_tick_field() -> None:
    """The same section describes a tick line: each field of ``TickRecord``, which the
    recorder writes whole, is named there."""
    import dataclasses

    from gpugov.daemon.domain import TickRecord

    text = DAEMON_MD.read_text()
    start = text.index("## Recording and replay")
    section = text[start : text.index("\n## ", start + 1)]
    fields = [f.name for f in dataclasses.fields(TickRecord)]
    assert [f for f in fields if f"`{f}`" not in section] == []


def test_exit_reset_tries_are_stated_as_the_actuator_makes_them() -> None:
    """docs/operator.md and docs/daemon.md give the exit's reset tries (the first and its
    retries together) as ``ClockActuator`` makes them."""
    import inspect

    from gpugov.daemon.actuator import ClockActuator

    tries = inspect.signature(ClockActuator).parameters["reset_attempts"].default
    words = {"three": 3, "four": 4, "five": 5, "six": 6}
    operator = " ".join((DAEMON_MD.parent / "operator.md").read_text().split())
    stated = re.search(r"A reset that fails is tried (\w+) times in all", operator)
    assert stated is not None and words[stated.group(1)] == tries
    assert f"even after {tries} tries with backoff" in " ".join(DAEMON_MD.read_text().split())
