"""Does the cluster's KubeRay know the fields our manifests rely on? Google does not publish which
KubeRay the GKE Ray Operator add-on runs (`platform_facts.GKE_RAY_ADDON_KUBERAY`), but the
RayCluster CRD it installed says: a field its schema lacks is one that KubeRay release predates
(`platform_facts.KUBERAY_AUTH` names the first release of each). The same for the RayJob CRD
(the fields `jobs.submit --print-rayjob` uses) and, where the environment has a `kueue` section,
Kueue's CRDs at the version we print (v1beta2). `python -m infra.doctor --kubectl` runs this
against the current kubectl context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra import kubectl
from infra.config import Environment
from infra.platform_facts import KUBERAY_AUTH, KubeRayFeature

CRD = "rayclusters.ray.io"
RAYJOB_CRD = "rayjobs.ray.io"


@dataclass(frozen=True)
class CrdField:
    """A field our printed objects use: `spec.<field>` of `crd` at API `version`, since `since`."""

    crd: str
    version: str
    field: str
    since: str


# The RayJob fields `--print-rayjob` uses beyond a RayCluster's (KubeRay git history:
# submitterPodTemplate in v1.1.0's API, submitterConfig #2091 in v1.2.0, submissionMode (SidecarMode
# #3971) and deletionStrategy in v1.5.0, authOptions in a RayJob's rayClusterSpec v1.5.1,
# preRunningDeadlineSeconds #4525 in v1.6.0).
RAYJOB_FIELDS = (
    CrdField(RAYJOB_CRD, "v1", "submitterPodTemplate", "KubeRay 1.1.0"),
    CrdField(RAYJOB_CRD, "v1", "submitterConfig.backoffLimit", "KubeRay 1.2.0"),
    CrdField(RAYJOB_CRD, "v1", "submissionMode", "KubeRay 1.5.0 (SidecarMode)"),
    CrdField(RAYJOB_CRD, "v1", "rayClusterSpec.authOptions.mode", "KubeRay 1.5.1"),
    CrdField(RAYJOB_CRD, "v1", "preRunningDeadlineSeconds", "KubeRay 1.6.0"),
)
# Kueue's v1beta2 (the storage version since v0.15; the objects we print use it).
KUEUE_FIELDS = (
    CrdField("clusterqueues.kueue.x-k8s.io", "v1beta2", "admissionChecksStrategy", "Kueue v1beta2"),
    CrdField("localqueues.kueue.x-k8s.io", "v1beta2", "clusterQueue", "Kueue v1beta2"),
    CrdField("resourceflavors.kueue.x-k8s.io", "v1beta2", "nodeLabels", "Kueue v1beta2"),
    CrdField("resourceflavors.kueue.x-k8s.io", "v1beta2", "nodeTaints", "Kueue v1beta2"),
    CrdField("clusterqueues.kueue.x-k8s.io", "v1beta2", "preemption.withinClusterQueue", "Kueue v1beta2"),
)
QUEUED_FIELDS = (CrdField("provisioningrequestconfigs.kueue.x-k8s.io", "v1beta2", "managedResources", "Kueue v1beta2"),)


def required_fields(env: Environment) -> list[CrdField]:
    """Every field of a CRD other than the RayCluster's that the environment's objects use (pure)."""
    out = list(RAYJOB_FIELDS)
    if env.kueue is not None:
        out.extend(KUEUE_FIELDS)
        if any(g.capacity_kind == "queued-provisioning" for g in env.slice_groups):
            out.extend(QUEUED_FIELDS)
    return out


def version_schema(crd: dict[str, Any], version: str) -> dict[str, Any] | None:
    for v in crd.get("spec", {}).get("versions", []):
        if v.get("name") == version:
            return v.get("schema", {}).get("openAPIV3Schema", {})
    return None


def knows_field(crd: dict[str, Any], field: CrdField) -> bool:
    """Whether the CRD's `field.version` schema has `spec.<field.field>` (pure)."""
    schema = version_schema(crd, field.version)
    return schema is not None and knows(schema, field.field)


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


def read_crd(timeout_s: float, name: str = CRD) -> dict[str, Any]:
    hint = 'is Kueue installed (README "Batch jobs")' if name.endswith("kueue.x-k8s.io") else "is the Ray Operator add-on on"
    try:
        out = kubectl.run(["get", "crd", name, "-o", "json"], timeout_s, f"read the {name} CRD")
    except kubectl.KubectlError as err:
        raise CrdError(f"{err}; {hint}, and kubectl's context this cluster?") from None
    try:
        crd = json.loads(out)
    except ValueError:
        crd = None
    if not isinstance(crd, dict):
        raise CrdError(f"kubectl get crd {name} -o json printed something that is not a JSON object: {out[:120]!r}")
    return crd


def check(env: Environment, crd: dict[str, Any]) -> list[FieldCheck]:
    schema = v1_schema(crd)
    return [FieldCheck(f, knows(schema, f.field)) for f in used_features(env)]
