"""Regenerate ``rayjob-ray.io-v1.json`` from KubeRay's RayJob CRD (a data extraction).

    python tests/deploy/schemas/extract_rayjob_schema.py ray.io_rayjobs.yaml > \
        tests/deploy/schemas/rayjob-ray.io-v1.json

The input is ``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` of
github.com/ray-project/kuberay at the tag named in ``SOURCE`` (not vendored). The output is
the CRD's ``v1`` ``openAPIV3Schema`` as a JSON Schema (draft 2020-12) with two changes:

* Pod templates and embedded core objects (``PRUNED``) become ``{"type": "object"}``: the
  tests validate those strictly as core/v1 objects with kubernetes-validate instead, which
  knows them better than a copy would and keeps this file small.
* Every object that lists its properties and neither says ``additionalProperties`` nor
  ``x-kubernetes-preserve-unknown-fields`` gets ``additionalProperties: false``: the API
  server's strict field validation rejects an unknown field there, and so does this schema.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

SOURCE = {
    "repository": "https://github.com/ray-project/kuberay",
    "path": "ray-operator/config/crd/bases/ray.io_rayjobs.yaml",
    "tag": "v1.7.0",
    "commit": "59d663aeec13760646da3db9c1cf8cfe883e30b7",
}
PRUNED = {
    ("spec", "rayClusterSpec", "headGroupSpec", "template"): "core/v1 PodTemplateSpec",
    ("spec", "rayClusterSpec", "workerGroupSpecs", "[]", "template"): "core/v1 PodTemplateSpec",
    ("spec", "rayClusterSpec", "headGroupSpec", "headService"): "core/v1 Service",
    ("spec", "rayClusterSpec", "autoscalerOptions"): "KubeRay autoscaler options (unused)",
    ("spec", "submitterPodTemplate"): "core/v1 PodTemplateSpec",
    ("status",): "status (written by the operator)",
}


def convert(node: Any, path: tuple[str, ...]) -> Any:
    """The OpenAPI v3 node at ``path`` as JSON Schema, pruned and closed (module notes)."""
    if path in PRUNED:
        return {"type": "object", "$comment": f"pruned: {PRUNED[path]}"}
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: convert(item, (*path, name)) for name, item in value.items()}
        elif key == "items":
            out[key] = convert(value, (*path, "[]"))
        elif key == "additionalProperties" and isinstance(value, dict):
            out[key] = convert(value, (*path, "{}"))
        elif key == "nullable":
            continue
        else:
            out[key] = value
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def main(argv: list[str]) -> int:
    """Print the schema extracted from the CRD file ``argv[1]``."""
    crd = yaml.safe_load(Path(argv[1]).read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = convert(version["schema"]["openAPIV3Schema"], ())
    schema["properties"]["apiVersion"] = {"const": "ray.io/v1"}
    schema["properties"]["kind"] = {"const": "RayJob"}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": (
            "Extracted by tests/deploy/schemas/extract_rayjob_schema.py from the RayJob CRD "
            f"(ray.io/v1) at {SOURCE['repository']} {SOURCE['path']}, tag {SOURCE['tag']}, "
            f"commit {SOURCE['commit']} (Apache-2.0). Pod templates and embedded core "
            "objects are pruned to {type: object} and validated as core/v1 objects by "
            "kubernetes-validate; objects listing their properties are closed "
            "(additionalProperties false) as the API server's strict field validation is."
        ),
        "title": "RayJob (ray.io/v1)",
        **schema,
    }
    json.dump(document, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
