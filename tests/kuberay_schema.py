"""Strict validation against the KubeRay CRDs in ../shared/kuberay/crds.

The API server prunes unknown fields silently; we treat them as errors, since a field that is
pruned is a setting that never took effect. So every object schema that lists its properties
gets `additionalProperties: false`, unless the CRD marks it x-kubernetes-preserve-unknown-fields.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml", "RayService": "ray.io_rayservices.yaml"}


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def validator(crd_dir: str, kind: str) -> jsonschema.Draft7Validator:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((Path(crd_dir) / CRD_FILES[kind]).read_text(), Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def errors(crd_dir: Path, manifest: dict) -> list[str]:
    """Every schema violation, as `path: message`; empty when the manifest is valid."""
    v = validator(str(crd_dir), manifest["kind"])
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in v.iter_errors(manifest)]
