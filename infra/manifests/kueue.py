"""Kueue's objects for an environment with a `kueue` section (API kueue.x-k8s.io/v1beta2, Kueue
v0.19.2), printed by `python -m infra manifests` after the Ray objects:

- A ResourceFlavor per slice group that leaves slices to RayJobs (`rayjob_slices`), its nodeLabels
  the group's pools' labels (Kueue adds them to the admitted pods' nodeSelector) and its nodeTaints
  the taints GKE puts on those nodes (`google.com/tpu`, and `cloud.google.com/gke-queued` on
  queued-provisioning pools), and a CPU flavor for the RayJobs' heads and submitters, listed first.
  Kueue matches a pod only against each flavor's own label keys (infra.kube_facts
  "kueue-flavor-fit"), so without the taints a head or a submitter, which request no TPU, could be
  given a TPU flavor once the CPU flavor is full; only the TPU worker templates tolerate them. No
  flavor has tolerations of its own: they would cancel its taints for admission.
- WorkloadPriorityClasses, the config's `kueue.priorities` (RayJobs name one with
  `kueue.x-k8s.io/priority-class`).
- One ClusterQueue over cpu, memory and google.com/tpu (every resource a RayJob's pods request must
  be covered: Kueue's default BlockUndeclared), preempting lower-priority jobs within it when a
  higher one does not fit. Its quotas are derived, exactly (never rounded down): each TPU flavor
  holds the group's RayJob slices (x chips, x the pods' CPU and memory); the CPU flavor one head and
  one submitter per RayJob slice, since a job needs at least a slice.
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
from infra.manifests.rayjob import SUBMITTER_REQUESTS
from infra.names import CPU_POOL_NAME, QUEUED_LABEL, SLICE_GROUP_LABEL, labels

API = "kueue.x-k8s.io/v1beta2"
TPU_RESOURCE = "google.com/tpu"
COVERED = ["cpu", "memory", TPU_RESOURCE]
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"  # v1beta2 ProvisioningRequestControllerName
PROVISIONING_CLASS = "queued-provisioning.gke.io"
# What GKE taints TPU nodes with (infra.kube_facts "gke-tpu-taint", "dws-tolerations").
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
QUEUED_TAINT = {"key": QUEUED_LABEL, "value": "true", "effect": "NoSchedule"}


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
        taints = [dict(TPU_TAINT), *([dict(QUEUED_TAINT)] if group.capacity_kind == "queued-provisioning" else [])]
        out.append(
            {
                "apiVersion": API,
                "kind": "ResourceFlavor",
                "metadata": _meta(env, flavor_name(env, group)),
                "spec": {"nodeLabels": node_labels, "nodeTaints": taints},
            }
        )
    return out


def priority_classes(env: Environment) -> list[dict[str, Any]]:
    """The config's priorities as WorkloadPriorityClasses (cluster-scoped, like ResourceFlavors)."""
    assert env.kueue is not None
    return [
        {
            "apiVersion": API,
            "kind": "WorkloadPriorityClass",
            "metadata": _meta(env, name),
            "value": value,
            "description": f"ray-tpu-gke {env.name}: `jobs.submit --priority {name}`"
            + (" (the default)" if name == env.kueue.default_priority else ""),
        }
        for name, value in env.kueue.priorities.items()
    ]


def _quota(cpu: Decimal, memory: Decimal, tpu: int) -> list[dict[str, Any]]:
    """The flavor's quotas, in coveredResources order (ClusterQueue webhook: names must match)."""
    return [
        {"name": "cpu", "nominalQuota": quantity.exact(cpu)},
        {"name": "memory", "nominalQuota": quantity.memory(memory)},
        {"name": TPU_RESOURCE, "nominalQuota": tpu},
    ]


def cluster_queue(env: Environment) -> dict[str, Any]:
    groups = rayjob_groups(env)
    jobs = sum(g.rayjob_slices for g in groups)
    head_cpu = quantity.parse(env.ray.head.cpu) + quantity.parse(SUBMITTER_REQUESTS["cpu"])
    head_memory = quantity.parse(env.ray.head.memory) + quantity.parse(SUBMITTER_REQUESTS["memory"])
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
        "preemption": {"withinClusterQueue": "LowerPriority"},
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
    docs = [*resource_flavors(env), *priority_classes(env)]
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
