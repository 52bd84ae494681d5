"""Strict validation against the KubeRay CRDs in ../shared/kuberay/crds and Kueue's in
../shared/kueue/crds (its storage version, v1beta2).

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

CRD_FILES = {
    "RayCluster": "ray.io_rayclusters.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayService": "ray.io_rayservices.yaml",
    "ResourceFlavor": "kueue.x-k8s.io_resourceflavors.yaml",
    "ClusterQueue": "kueue.x-k8s.io_clusterqueues.yaml",
    "LocalQueue": "kueue.x-k8s.io_localqueues.yaml",
    "AdmissionCheck": "kueue.x-k8s.io_admissionchecks.yaml",
    "ProvisioningRequestConfig": "kueue.x-k8s.io_provisioningrequestconfigs.yaml",
    "WorkloadPriorityClass": "kueue.x-k8s.io_workloadpriorityclasses.yaml",
}
API_VERSIONS = {"ray.io": "v1", "kueue.x-k8s.io": "v1beta2"}


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
        # Go's RE2 takes a flag group anywhere (Kueue writes `^(?i)...`); Python's re only first.
        out["pattern"] = "(?i)^" + out["pattern"][len("^(?i)") :]
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
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == API_VERSIONS[crd["spec"]["group"]]]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def errors(crd_dir: Path, manifest: dict) -> list[str]:
    """Every schema violation, as `path: message`; empty when the manifest is valid. `crd_dir` holds
    the manifest's CRD (../shared/kuberay/crds or ../shared/kueue/crds)."""
    group, _, version = manifest["apiVersion"].partition("/")
    assert API_VERSIONS.get(group) == version, f"{manifest['apiVersion']} is not the version the CRDs here are checked at"
    v = validator(str(crd_dir), manifest["kind"])
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in v.iter_errors(manifest)]
