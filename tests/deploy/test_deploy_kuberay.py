"""The KubeRay sweep manifest (deploy/kubernetes/ray/) and its image, validated offline.

The RayJob is a CRD kubernetes-validate does not know: it is validated with ``jsonschema``
against ``schemas/rayjob-ray.io-v1.json``, extracted from KubeRay's own CRD at a pinned
commit (see its $comment and ``schemas/extract_rayjob_schema.py``), with the pod templates
pruned there and validated here, strictly, as core/v1 PodTemplates by kubernetes-validate
(as are the ConfigMap and the PersistentVolumeClaim). Then the pieces are checked against
gpugov: the entrypoint parses with gpugov's CLI, the grid passes ``gpugov sweep``'s
validation, its paths are mounted, and the Ray versions agree.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from deploytools import KUBERNETES, REPO, require_module
from test_deploy_kubernetes import kubernetes_versions

from gpugov import __version__
from gpugov.cli import build_parser
from gpugov.plant.profile_files import list_bundled_profiles
from gpugov.plant.workload import BUNDLED_TRACES, SHARED_TRACES

yaml = require_module("yaml")

RAY = KUBERNETES / "ray"
MANIFEST = RAY / "sweep-rayjob.yaml"
DOCKERFILE = RAY / "Dockerfile"
SCHEMA = Path(__file__).parent / "schemas" / "rayjob-ray.io-v1.json"


def documents() -> list[dict[str, Any]]:
    """Every YAML document of the sweep manifest."""
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d is not None]


def find(kind: str) -> dict[str, Any]:
    """The one document of ``kind``."""
    found = [d for d in documents() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def rayjob_errors(document: dict[str, Any]) -> list[str]:
    """Schema errors of a RayJob document against the vendored CRD schema."""
    jsonschema = require_module("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(schema).iter_errors(document)
    ]


def pod_templates() -> list[tuple[str, dict[str, Any]]]:
    """``(group, pod template)`` of the head and every worker group."""
    cluster = find("RayJob")["spec"]["rayClusterSpec"]
    out = [("head", cluster["headGroupSpec"]["template"])]
    out += [(g["groupName"], g["template"]) for g in cluster["workerGroupSpecs"]]
    return out


def test_rayjob_validates_against_kuberays_crd_schema() -> None:
    errors = rayjob_errors(find("RayJob"))
    assert not errors, "; ".join(errors)


def test_the_crd_schema_rejects_a_misspelt_field_and_a_bad_type() -> None:
    job = json.loads(json.dumps(find("RayJob")))
    job["spec"]["shutdownAfterJobFinish"] = True
    assert any("shutdownAfterJobFinish" in error for error in rayjob_errors(job))
    job = json.loads(json.dumps(find("RayJob")))
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "four"
    assert rayjob_errors(job)


@pytest.mark.parametrize("kind", ["ConfigMap", "PersistentVolumeClaim", "PodTemplate"])
def test_core_objects_validate_strictly(kind: str) -> None:
    module = require_module("kubernetes_validate")
    if kind == "PodTemplate":
        checked = [
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": group},
                "template": template,
            }
            for group, template in pod_templates()
        ]
    else:
        checked = [find(kind)]
    for document in checked:
        for version in kubernetes_versions():
            try:
                module.validate(document, version, strict=True)
            except module.ValidationError as error:
                pytest.fail(f"{MANIFEST.name} ({document['kind']}) on {version}: {error}")


def _head() -> dict[str, Any]:
    return pod_templates()[0][1]["spec"]


def _mounts() -> dict[str, dict[str, Any]]:
    containers = _head()["containers"]
    assert len(containers) == 1
    return {m["mountPath"]: m for m in containers[0]["volumeMounts"]}


def test_the_entrypoint_is_a_resumable_sweep_that_joins_the_cluster() -> None:
    words = shlex.split(find("RayJob")["spec"]["entrypoint"])
    assert words[0] == "gpugov"
    args = build_parser().parse_args(words[1:])
    assert args.command == "sweep" and args.ray == "auto" and args.resume
    mounts = _mounts()
    grid_mount = mounts[str(Path(args.grid).parent)]
    volumes = {v["name"]: v for v in _head()["volumes"]}
    configmap = volumes[grid_mount["name"]]["configMap"]["name"]
    assert configmap == find("ConfigMap")["metadata"]["name"]
    assert Path(args.grid).name in find("ConfigMap")["data"]
    results = mounts[str(Path(args.out).parent)]
    claim = volumes[results["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == find("PersistentVolumeClaim")["metadata"]["name"]
    assert not results.get("readOnly", False)


def test_the_grid_passes_gpugovs_validation(tmp_path: Path) -> None:
    from gpugov.study.sweep import read_grid

    path = tmp_path / "grid.toml"
    path.write_text(find("ConfigMap")["data"]["grid.toml"])
    grid = read_grid(path)
    bundled = {row["name"] for row in list_bundled_profiles()}
    assert set(grid.profiles) <= bundled
    assert set(grid.traces) <= set(BUNDLED_TRACES) | set(SHARED_TRACES)
    for spec in grid.controllers:
        build_parser().parse_args(["simulate", "--controller", spec])
    # The shared traces are read by the driver from the head's traces mount.
    env = {e["name"]: e["value"] for e in _head()["containers"][0]["env"]}
    assert env["GPUGOV_TRACES_DIR"] in _mounts()


def test_head_runs_only_the_driver_and_workers_mount_nothing() -> None:
    cluster = find("RayJob")["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group, template in pod_templates()[1:]:
        assert "volumes" not in template["spec"], f"{group}: inputs travel by value"


def test_the_image_installs_gpugov_with_ray_at_the_clusters_ray_version() -> None:
    lines = [
        line
        for line in DOCKERFILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    base = next(line.split()[1] for line in lines if line.startswith("FROM "))
    version = find("RayJob")["spec"]["rayClusterSpec"]["rayVersion"]
    assert base.startswith(f"rayproject/ray:{version}-py311")
    assert any("pip install" in line and ".[ray]" in line for line in lines)
    ignore = (RAY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for line in lines:
        if line.startswith("COPY "):
            *sources, _ = [w for w in shlex.split(line)[1:] if not w.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
                assert source.rstrip("/") in allowed, f"COPY {source}: excluded"
    images = {c["image"] for _, t in pod_templates() for c in t["spec"]["containers"]}
    assert images == {f"gpugov-ray:{__version__}"}
    assert DOCKERFILE.read_text().count(f"-t gpugov-ray:{__version__}") == 1
