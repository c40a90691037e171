"""Pydantic's validation errors of a config file said in the file's own words: one line a
problem, ``FILE: field.path: reason``, naming TOML tables and arrays rather than Python
classes, and the controller kinds there are for a missing or mistyped one."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from gpugov.daemon.controller_config import controller_kinds


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def validation_problems(error: ValidationError, source: str) -> list[str]:
    """Each problem's line: ``FILE: field.path: reason``."""
    lines = []
    for item in error.errors():
        loc = list(item["loc"])
        # Pydantic puts the union tag after "controller" (controller.fixed.clock_mhz): drop it.
        for index in range(len(loc) - 1):
            if loc[index] == "controller" and loc[index + 1] in _CONTROLLER_TAGS:
                del loc[index + 1]
                break
        message = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        message = _toml_words(item["type"], tuple(loc), item.get("input")) or message
        tagged = _tag_words(item["type"], item.get("ctx") or {})
        if tagged is not None:  # pydantic's "Unable to extract tag using discriminator"
            loc.append(str(item["ctx"]["discriminator"]).strip("'"))
            message = tagged
        message = message.removeprefix("Value error, ")
        if not loc and _FIELD_FIRST.match(message):
            # A problem of two fields (a validator of the whole file) names the field
            # its line starts with; "(top level)" named none.
            lines.append(f"{source}: {message}")
        else:
            lines.append(f"{source}: {_path(tuple(loc))}: {message}")
    return lines


_FIELD_FIRST = re.compile(r"(?:daemon|domains\[\d+\])(?:\.[a-z_]+|\[\d+\])*[ :]")
"""A message that starts with the field it is about (``domains[1].gpus: ...``)."""


_TABLE_TYPES = ("model_type", "model_attributes_type", "dict_type")
_ARRAY_TYPES = ("tuple_type", "list_type")


_EMPTY_WORDS = {
    "gpus": "list at least one GPU (an NVML index or a GPU-/MIG- UUID, such as [0])",
    "domains": "hold at least one [[domains]] table",
}
"""What an empty array must hold, by its key: pydantic said "Value should have at least 1
item after validation, not 0"."""


def _toml_words(kind: str, loc: tuple[int | str, ...], value: object) -> str | None:
    """A wrong-kind or empty-array line in the file's words (a table, an array), or None:
    pydantic's named a Python class (``instance of DaemonSection``, ``a valid tuple``)."""
    if kind == "too_short" and loc and loc[-1] in _EMPTY_WORDS:
        return f"must {_EMPTY_WORDS[str(loc[-1])]}, got none"
    if kind in _ARRAY_TYPES:
        return f"must be an array, such as [0, 1], got {value!r:.40}"
    if kind not in _TABLE_TYPES:
        return None
    name = ".".join(str(part) for part in loc if isinstance(part, str))
    section = f"[[{name}]]" if loc and isinstance(loc[-1], int) else f"[{name}]"
    return f"must be a table of keys (a {section} section, or {{ key = value }}), got {value!r:.40}"


def _tag_words(kind: str, context: dict[str, Any]) -> str | None:
    """A missing or unknown controller ``kind`` in the file's words (the kinds there are,
    the closest to a mistyped one), or None for any other problem."""
    from gpugov.daemon.controller_spec import did_you_mean

    kinds = ", ".join(sorted(_CONTROLLER_TAGS))
    if kind == "union_tag_not_found":
        return f"missing: name the controller, one of {kinds}"
    if kind == "union_tag_invalid":
        tag = str(context.get("tag"))
        return f"unknown controller {tag!r}{did_you_mean(tag)}; one of {kinds}"
    return None


_CONTROLLER_TAGS = controller_kinds()
"""The union tags pydantic puts in an error's path (``controller.mpc-slsqp.horizon_s``)."""
