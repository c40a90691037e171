"""The layers' imports point one way: plant <- controllers <- daemon <- study.

Read from the source with ``ast`` (so a lazy import inside a function counts too): plant/
imports nothing of ours, controllers/ only plant/, daemon/ never the study package, and
no module imports a top-level name that the namespace replaced.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"plant": "plant", "controllers": "controllers", "daemon": "daemon", "study": "study"}
ALLOWED = {
    "plant": {"plant"},
    "controllers": {"plant", "controllers"},
    "daemon": {"plant", "controllers", "daemon"},
    "study": {"plant", "controllers", "daemon", "study", "profiles"},
}
OLD_TOP_LEVEL = {"plant", "controllers", "daemon", "profiles", "bench", "study"}


@functools.cache
def _imported_modules(path: Path) -> tuple[tuple[int, str], ...]:
    """``(line, module)`` of every import in ``path``; parsed once for all the tests (a
    layer's files are read by its own test and by the old-names one)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return tuple(found)


@pytest.mark.parametrize("layer", sorted(FOLDERS))
def test_imports_point_down(layer: str) -> None:
    bad = []
    for path in sorted((ROOT / FOLDERS[layer]).rglob("*.py")):
        for line, module in _imported_modules(path):
            parts = module.split(".")
            if (
                parts[0] == "gpugov"
                and len(parts) > 1
                and parts[1] in OLD_TOP_LEVEL
                and parts[1] not in ALLOWED[layer]
            ):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_old_top_level_names() -> None:
    bad = []
    for folder in [*FOLDERS.values(), "gpugov", "bench", "tests", "deploy"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module in _imported_modules(path):
                if module.split(".")[0] in OLD_TOP_LEVEL:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)
