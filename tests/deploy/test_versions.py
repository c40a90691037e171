"""One version everywhere: every image tag and image label in deploy/, docs/ and the README
is ``gpugov.__version__``, and each Dockerfile copies what ``pip install .`` reads.

The version lives in ``gpugov/__init__.py`` (the wheel's metadata reads it); a release
bumps it there and in the places this test finds, and the test fails until they agree.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from deploytools import DEPLOY, KUBERNETES, REPO, require_module

from gpugov import __version__

yaml = require_module("yaml")

TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".toml", ".txt", ""}
SCANNED = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted(DEPLOY.rglob("*"))]
# An image reference to one of our images (`gpugov:X`, `<registry>/gpugov-ray:X`) or an
# OCI version label.
IMAGE_TAG = re.compile(r"(?<![\w.-])(?:[\w.-]+/)*(gpugov(?:-ray)?):([\w.+-]+)")
IMAGE_LABEL = re.compile(r'org\.opencontainers\.image\.version="([^"]+)"')
DOCKERFILES = [DEPLOY / "Dockerfile", KUBERNETES / "ray" / "Dockerfile"]


def _text_files() -> list[Path]:
    return [
        path
        for path in SCANNED
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name.startswith("Dockerfile"))
    ]


def _references() -> list[tuple[str, str]]:
    """``(where, version)`` for every image tag and version label found."""
    found = []
    for path in _text_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            found += [(where, m.group(2)) for m in IMAGE_TAG.finditer(line)]
            found += [(where, m.group(1)) for m in IMAGE_LABEL.finditer(line)]
    return found


def test_every_image_tag_and_label_is_the_package_version() -> None:
    found = _references()
    wrong = [f"{where}: {version}" for where, version in found if version != __version__]
    assert not wrong, f"expected {__version__} (gpugov/__init__.py): {wrong}"
    places = {where.split(":")[0] for where, _ in found}
    # The places a release must bump; the scan has to keep finding them.
    assert {
        "deploy/Dockerfile",
        "deploy/kubernetes/daemonset.yaml",
        "deploy/kubernetes/ray/Dockerfile",
        "deploy/kubernetes/ray/sweep-rayjob.yaml",
        "deploy/README.md",
    } <= places


def test_the_manifests_run_the_version_built_here() -> None:
    documents = yaml.safe_load_all((KUBERNETES / "daemonset.yaml").read_text())
    daemonset = next(d for d in documents if d and d["kind"] == "DaemonSet")
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    assert [c["image"] for c in containers] == [f"gpugov:{__version__}"]
    documents = yaml.safe_load_all((KUBERNETES / "ray" / "sweep-rayjob.yaml").read_text())
    rayjob = next(d for d in documents if d and d["kind"] == "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["workerGroupSpecs"]]
    images = {c["image"] for t in templates for c in t["spec"]["containers"]}
    assert images == {f"gpugov-ray:{__version__}"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_dockerfile_copies_what_the_build_reads(dockerfile: Path) -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    needed = {project["readme"], *project["license-files"], "pyproject.toml"}
    # Every folder the wheel maps into the gpugov namespace (package-dir).
    needed |= set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = set()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied.update(w.rstrip("/") for w in shlex.split(line)[1:-1] if not w.startswith("--"))
    assert needed <= copied, f"{dockerfile.name} does not copy {sorted(needed - copied)}"
    # The extras it installs (`pip install '.[ray]'`) are the project's.
    for extras in re.findall(r"""pip install[^\n]*?['"]?\.\[([\w,-]+)\]""", dockerfile.read_text()):
        for extra in extras.split(","):
            assert extra in project["optional-dependencies"], (
                f"{dockerfile.name}: no extra {extra!r}"
            )
    assert IMAGE_LABEL.search(dockerfile.read_text()), "no org.opencontainers.image.version"
