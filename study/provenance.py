"""What ran a study, for its results to be run again: the versions of gpugov and of the
libraries its figures depend on, the checkout's commit when gpugov runs from one, and
where each outside controller's code came from.

A figure depends on more than gpugov's version: SciPy's SLSQP and HiGHS solve the
``mpc-slsqp`` MPC and the LP bound, numba compiles the fast MPC's search, NumPy sums every
metric; a run from a checkout between two releases is named by its commit, and an outside
controller (``MODULE:FACTORY``, an entry point) by its package's version and its module
file's sha256.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from gpugov import __version__

LIBRARIES = ("numpy", "scipy", "numba", "pydantic")
"""Distributions whose version a study's figures depend on (recorded when installed)."""
GIT_TIMEOUT_S = 5.0
"""Longest a ``git`` call for the checkout's commit may take (a hung filesystem)."""


def _version(distribution: str) -> str | None:
    """``distribution``'s installed version, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _sha256(path: object) -> str | None:
    """The sha256 of the file at ``path``, or None where there is none to read (a module
    without a file, a namespace package, a file gone or unreadable since its import)."""
    if not isinstance(path, str):
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _git(directory: Path, *arguments: str) -> str | None:
    """``git -C directory ARGUMENTS``'s output, or None where git, the checkout or the
    answer is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *arguments],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_checkout() -> dict[str, Any] | None:
    """The git commit gpugov's code was imported from, and whether tracked files differ
    from it (``dirty``); None for an installed package outside a checkout."""
    import gpugov

    package = Path(gpugov.__file__).resolve().parent
    # Tracked there: an installed copy inside another repository's ignored .venv is not.
    if _git(package, "ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    commit = _git(package, "rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git(package, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _outside_module(spec: str) -> tuple[Any, str, Any]:
    """An outside controller ``spec``'s parsed config, its factory and its module
    (imported where it is not yet)."""
    import importlib
    import sys

    from gpugov.daemon.controller_config import ExternalControllerConfig
    from gpugov.daemon.controller_spec import parse_controller_spec

    config = parse_controller_spec(spec)
    factory = config.factory if isinstance(config, ExternalControllerConfig) else spec
    name = factory.partition(":")[0]
    return config, factory, sys.modules.get(name) or importlib.import_module(name)


def outside_module_sha256(spec: str) -> str | None:
    """The sha256 of the module file an outside controller ``spec``'s factory lives in
    (None where it has none to read): what :func:`outside_controller_source` records,
    without its search of the installed packages."""
    return _sha256(getattr(_outside_module(spec)[2], "__file__", None))


def outside_controller_source(spec: str) -> dict[str, Any]:
    """Where an outside controller's code came from: its factory (``MODULE:FACTORY``,
    an entry point's), the module's file and sha256, and the installed package that
    provides the module with its version (None where no package does: a module on
    ``PYTHONPATH``)."""
    from gpugov.daemon.controller_config import ExternalControllerConfig
    from gpugov.daemon.controller_spec import ENTRY_POINT_GROUP

    config, factory, module = _outside_module(spec)
    entry: dict[str, Any] = {"spec": spec, "factory": factory}
    path = getattr(module, "__file__", None)
    entry["module_file"] = path
    entry["module_sha256"] = _sha256(path)
    top = factory.partition(":")[0].partition(".")[0]
    packages = sorted(metadata.packages_distributions().get(top, ()))
    if isinstance(config, ExternalControllerConfig) and config.name:
        # An entry point's name: the package that registers it.
        packages = [
            point.dist.name
            for point in metadata.entry_points(group=ENTRY_POINT_GROUP, name=config.name)
            if point.dist is not None and point.value == factory
        ] or packages
    entry["package"] = packages[0] if packages else None
    entry["package_version"] = _version(packages[0]) if packages else None
    return entry


def outside_specs(specs: Sequence[str]) -> tuple[str, ...]:
    """The specs among ``specs`` that name an outside controller (``MODULE:FACTORY`` or
    an entry point's name), in their order: a sweep's grid mixes them with built-in
    kinds. A spec that does not parse is left out (its command refuses it)."""
    from gpugov.daemon.controller_config import ExternalControllerConfig
    from gpugov.daemon.controller_spec import parse_controller_spec

    found = []
    for spec in specs:
        try:
            config = parse_controller_spec(spec)
        except ValueError:
            continue
        if isinstance(config, ExternalControllerConfig):
            found.append(spec)
    return tuple(found)


def software_versions(outside_controllers: Sequence[str] = ()) -> dict[str, Any]:
    """The versions a study's figures depend on: gpugov, Python, :data:`LIBRARIES`, the
    checkout's commit (:func:`source_checkout`) and each outside controller's source
    (:func:`outside_controller_source`)."""
    versions: dict[str, Any] = {"gpugov": __version__, "python": platform.python_version()}
    versions |= {name: _version(name) for name in LIBRARIES}
    versions["source"] = source_checkout()
    if outside_controllers:
        versions["outside_controllers"] = [
            outside_controller_source(spec) for spec in outside_controllers
        ]
    return versions


__all__ = [
    "LIBRARIES",
    "outside_controller_source",
    "outside_specs",
    "software_versions",
    "source_checkout",
]
