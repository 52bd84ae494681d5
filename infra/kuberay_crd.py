"""Does the cluster's KubeRay know the fields our manifests rely on? Google does not publish which
KubeRay the GKE Ray Operator add-on runs (`platform_facts.GKE_RAY_ADDON_KUBERAY`), but the
RayCluster CRD it installed says: a field its schema lacks is one that KubeRay release predates
(`platform_facts.KUBERAY_AUTH` names the first release of each). `python -m infra.doctor --kubectl`
runs this against the current kubectl context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra import kubectl
from infra.config import Environment
from infra.platform_facts import KUBERAY_AUTH, KubeRayFeature

CRD = "rayclusters.ray.io"


class CrdError(RuntimeError):
    """The CRD could not be read; the message is one line saying why."""


@dataclass(frozen=True)
class FieldCheck:
    feature: KubeRayFeature
    known: bool


def used_features(env: Environment) -> list[KubeRayFeature]:
    """The KubeRay features the environment's manifests use (pure)."""
    wanted = {"authOptions.mode"} if env.ray.access.auth == "token" else set()
    return [f for f in KUBERAY_AUTH if f.field in wanted]


def knows(schema: dict[str, Any], dotted: str) -> bool:
    """Whether a RayCluster's `spec.<dotted>` is in the CRD's openAPIV3Schema (pure)."""
    node = schema.get("properties", {}).get("spec", {})
    for part in dotted.split("."):
        node = node.get("properties", {}).get(part)
        if node is None:
            return False
    return True


def v1_schema(crd: dict[str, Any]) -> dict[str, Any]:
    for version in crd.get("spec", {}).get("versions", []):
        if version.get("name") == "v1":
            return version.get("schema", {}).get("openAPIV3Schema", {})
    raise CrdError(f"the {CRD} CRD has no v1 version; is this KubeRay older than 1.0?")


def read_crd(timeout_s: float) -> dict[str, Any]:
    try:
        out = kubectl.run(["get", "crd", CRD, "-o", "json"], timeout_s, f"read the {CRD} CRD")
    except kubectl.KubectlError as err:
        raise CrdError(f"{err}; is the Ray Operator add-on on, and kubectl's context this cluster?") from None
    try:
        crd = json.loads(out)
    except ValueError:
        crd = None
    if not isinstance(crd, dict):
        raise CrdError(f"kubectl get crd {CRD} -o json printed something that is not a JSON object: {out[:120]!r}")
    return crd


def check(env: Environment, crd: dict[str, Any]) -> list[FieldCheck]:
    schema = v1_schema(crd)
    return [FieldCheck(f, knows(schema, f.field)) for f in used_features(env)]
