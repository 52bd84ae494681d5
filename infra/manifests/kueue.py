"""Kueue's objects for an environment with a `kueue` section (API kueue.x-k8s.io/v1beta2, Kueue
v0.19.2), printed by `python -m infra manifests` after the Ray objects:

- A ResourceFlavor per slice group that leaves slices to RayJobs (`rayjob_slices`), its nodeLabels
  the group's pools' labels (Kueue adds them to the admitted pods' nodeSelector), and a CPU flavor
  for the RayJobs' heads, listed first: Kueue tries a resource group's flavors in order, so a head
  (no TPU) lands on the CPU flavor, whose TPU quota is 0, and a TPU worker group on its own group's.
- One ClusterQueue over cpu, memory and google.com/tpu (every resource a RayJob's pods request must
  be covered: Kueue's default BlockUndeclared). Its quotas are derived: each TPU flavor holds the
  group's RayJob slices (x chips, x the pods' CPU and memory); the CPU flavor one head (and its
  submitter sidecar) per RayJob slice, since a job needs at least a slice.
- A LocalQueue in the Ray namespace (never `default`, config.KueueConfig says why), which RayJobs
  name with the `kueue.x-k8s.io/queue-name` label.
- For queued-provisioning groups: a ProvisioningRequestConfig (`queued-provisioning.gke.io`,
  managedResources [google.com/tpu]: only the TPU worker PodSet goes into the request, as GKE takes
  one PodSet per request) and an AdmissionCheck on those flavors only.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from infra import quantity
from infra.config import Environment, SliceGroup
from infra.names import CPU_POOL_NAME, SLICE_GROUP_LABEL, labels

API = "kueue.x-k8s.io/v1beta2"
TPU_RESOURCE = "google.com/tpu"
COVERED = ["cpu", "memory", TPU_RESOURCE]
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"  # v1beta2 ProvisioningRequestControllerName
PROVISIONING_CLASS = "queued-provisioning.gke.io"
# KubeRay's SidecarMode submitter (common/job.go GetDefaultSubmitterContainer: requests 500m / 200Mi,
# limits 1 CPU / 1Gi) joins the head's PodSet in Kueue (rayjob_controller.go:319-332); the CPU
# flavor's quota counts its limits per job, which covers its requests.
SUBMITTER_CPU, SUBMITTER_MEMORY = Decimal(1), Decimal(2**30)


def rayjob_groups(env: Environment) -> list[SliceGroup]:
    return [g for g in env.slice_groups if g.rayjob_slices]


def cpu_flavor_name(env: Environment) -> str:
    return f"{env.cluster_name}-cpu"


def flavor_name(env: Environment, group: SliceGroup) -> str:
    return f"{env.cluster_name}-{group.name}"[:63]


def check_name(env: Environment) -> str:
    return f"{env.cluster_name}-dws"


def _meta(env: Environment, name: str, namespaced: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels(env)}
    if namespaced:
        meta["namespace"] = env.ray.namespace
    return meta


def resource_flavors(env: Environment) -> list[dict[str, Any]]:
    cpu_labels = {"cloud.google.com/gke-nodepool": CPU_POOL_NAME} if env.mode == "standard" else {}
    out = [{"apiVersion": API, "kind": "ResourceFlavor", "metadata": _meta(env, cpu_flavor_name(env)), "spec": {"nodeLabels": cpu_labels}}]
    for group in rayjob_groups(env):
        node_labels = {
            "cloud.google.com/gke-tpu-accelerator": group.shape.generation.gke_accelerator,
            "cloud.google.com/gke-tpu-topology": group.topology,
        }
        if env.mode == "standard":
            node_labels[SLICE_GROUP_LABEL] = group.name
        out.append(
            {
                "apiVersion": API,
                "kind": "ResourceFlavor",
                "metadata": _meta(env, flavor_name(env, group)),
                "spec": {"nodeLabels": node_labels},
            }
        )
    return out


def _quota(cpu: Decimal, memory: Decimal, tpu: int) -> list[dict[str, Any]]:
    """The flavor's quotas, in coveredResources order (ClusterQueue webhook: names must match)."""
    return [
        {"name": "cpu", "nominalQuota": quantity.cpu(cpu)},
        {"name": "memory", "nominalQuota": quantity.memory(memory)},
        {"name": TPU_RESOURCE, "nominalQuota": tpu},
    ]


def cluster_queue(env: Environment) -> dict[str, Any]:
    groups = rayjob_groups(env)
    jobs = sum(g.rayjob_slices for g in groups)
    head_cpu = quantity.parse(env.ray.head.cpu) + SUBMITTER_CPU
    head_memory = quantity.parse(env.ray.head.memory) + SUBMITTER_MEMORY
    flavors = [{"name": cpu_flavor_name(env), "resources": _quota(jobs * head_cpu, jobs * head_memory, 0)}]
    for group in groups:
        cpu, memory = (quantity.parse(r) for r in group.requests)
        pods = group.rayjob_slices * group.shape.hosts
        flavors.append(
            {"name": flavor_name(env, group), "resources": _quota(pods * cpu, pods * memory, group.rayjob_slices * group.shape.chips)}
        )
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ray.namespace}},
        "resourceGroups": [{"coveredResources": list(COVERED), "flavors": flavors}],
    }
    queued = [flavor_name(env, g) for g in groups if g.capacity_kind == "queued-provisioning"]
    if queued:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check_name(env), "onFlavors": queued}]}
    assert env.cluster_queue_name is not None
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": _meta(env, env.cluster_queue_name), "spec": spec}


def kueue_manifests(env: Environment) -> list[dict[str, Any]]:
    """Every Kueue object of the environment, in `kubectl apply` order; none without `kueue`."""
    if env.kueue is None:
        return []
    docs = resource_flavors(env)
    if any(g.capacity_kind == "queued-provisioning" for g in rayjob_groups(env)):
        docs.append(
            {
                "apiVersion": API,
                "kind": "ProvisioningRequestConfig",
                "metadata": _meta(env, check_name(env)),
                "spec": {"provisioningClassName": PROVISIONING_CLASS, "managedResources": [TPU_RESOURCE]},
            }
        )
        docs.append(
            {
                "apiVersion": API,
                "kind": "AdmissionCheck",
                "metadata": _meta(env, check_name(env)),
                "spec": {
                    "controllerName": PROVISIONING_CONTROLLER,
                    "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": check_name(env)},
                },
            }
        )
    docs.append(cluster_queue(env))
    assert env.cluster_queue_name is not None
    docs.append(
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": _meta(env, env.kueue.local_queue, namespaced=True),
            "spec": {"clusterQueue": env.cluster_queue_name},
        }
    )
    return docs
