"""The KubeRay `ray.io/v1` RayCluster for an environment: a head group on the CPU pool and one TPU
worker group per slice group (less the slices the RayService holds: `cluster_slices`).

Per worker group: `numOfHosts` = hosts per slice (pods per replica), `replicas` = slices, and every
pod asks for `google.com/tpu` = chips per host, plus CPU and memory that fit the machine
(`SliceGroup.requests`). On Standard, pods select their own group's pools by the pools' node label
`ray-tpu-gke/slice-group`, so two groups of one shape never take each other's nodes. The Ray TPU
webhook rejects a group unless numOfHosts == max(topology chips / google.com/tpu per pod, 1); that
holds by construction, since both come from the same catalog shape.

Applied with `python -m infra manifests --env dev | kubectl apply -f -` (a pipeline step), not by
Terraform: a kubernetes-provider stack would need cluster credentials at plan time and would tie a
RayCluster's rolling changes to infrastructure applies.
"""

from __future__ import annotations

from typing import Any

from infra.config import Environment, Reservation, SliceGroup
from infra.names import CPU_POOL_NAME, SLICE_GROUP_LABEL, ray_service_account_email

DASHBOARD_PORT = 8265
MEGASCALE_PORT = 8081  # multislice (DCN) traffic between slices
RAY_UID = 1000  # the `ray` user of the rayproject/ray images

HEAD_PORTS = [
    {"containerPort": 6379, "name": "gcs"},
    {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
    {"containerPort": 10001, "name": "client"},
    {"containerPort": 8000, "name": "serve"},
    {"containerPort": 8080, "name": "metrics"},
]

# No privilege escalation and no extra capabilities for any Ray container.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def ray_cluster(env: Environment) -> dict[str, Any]:
    groups = [(g, cluster_slices(env, g)) for g in env.slice_groups]
    spec: dict[str, Any] = {
        "rayVersion": env.ray.version,
        "headGroupSpec": head_group(env),
        "workerGroupSpecs": [tpu_worker_group(env, g, slices=n) for g, n in groups if n],
    }
    if any(g.autoscaled for g, n in groups if n):
        # Ray's autoscaler scales whole replicas (slices) between minReplicas and maxReplicas.
        spec["enableInTreeAutoscaling"] = True
        spec["autoscalerOptions"] = {"idleTimeoutSeconds": 600, "upscalingMode": "Default"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": env.ray_cluster_name, "namespace": env.ray.namespace, "labels": labels(env)},
        "spec": spec,
    }


def cluster_slices(env: Environment, group: SliceGroup) -> int:
    """The group's slices the RayCluster gets: all of them, less the RayService's replicas where
    the group serves. A slice belongs to one of the two, so they never wait on each other."""
    serving = env.serving
    held = serving.replicas if serving is not None and serving.slice_group == group.name else 0
    return group.slices - held


def service_account(env: Environment, google_service_account: str) -> dict[str, Any]:
    """The Kubernetes service account the Ray pods run as, annotated for Workload Identity."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": env.ray.kubernetes_service_account,
            "namespace": env.ray.namespace,
            "labels": labels(env),
            "annotations": {"iam.gke.io/gcp-service-account": google_service_account},
        },
    }


def manifests(env: Environment) -> list[dict[str, Any]]:
    """Everything `kubectl apply` needs for the environment's Ray cluster, in order."""
    docs: list[dict[str, Any]] = []
    if env.ray.namespace != "default":
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": env.ray.namespace}})
    docs.append(service_account(env, ray_service_account_email(env)))
    docs.append(ray_cluster(env))
    return docs


def labels(env: Environment) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "ray-tpu-gke", "ray-tpu-gke/env": env.name}


def head_group(env: Environment) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "serviceAccountName": env.ray.kubernetes_service_account,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RAY_UID, "fsGroup": 100},
        "containers": [
            {
                "name": "ray-head",
                "image": env.ray.image,
                "ports": HEAD_PORTS,
                "resources": {
                    "requests": {"cpu": env.ray.head.cpu, "memory": env.ray.head.memory},
                    "limits": {"cpu": env.ray.head.cpu, "memory": env.ray.head.memory},
                },
                "securityContext": CONTAINER_SECURITY,
            }
        ],
    }
    if env.mode == "standard":
        pod_spec["nodeSelector"] = {"cloud.google.com/gke-nodepool": CPU_POOL_NAME}
    return {
        # The head schedules no work: every CPU it has goes to the GCS, dashboard and job drivers.
        # The dashboard listens on all interfaces inside the pod; it is reached only through the
        # ClusterIP head service (kubectl port-forward), never a LoadBalancer or Ingress.
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
        "serviceType": "ClusterIP",
        "template": {"metadata": {"labels": labels(env)}, "spec": pod_spec},
    }


def tpu_node_selector(env: Environment, group: SliceGroup) -> dict[str, str]:
    shape = group.shape
    selector = {
        "cloud.google.com/gke-tpu-accelerator": shape.generation.gke_accelerator,
        "cloud.google.com/gke-tpu-topology": shape.topology,
    }
    if env.mode == "standard":
        # The pools carry the capacity (spot, reservation, flex-start) and the zone; the pods pick
        # their own group's pools. Reservation and flex-start pod labels are documented for nodes
        # GKE creates from the pod spec (Autopilot, auto-provisioning), not for Standard pools.
        selector[SLICE_GROUP_LABEL] = group.name
        return selector
    # Autopilot: these labels are the whole request (GKE "Consume reserved zonal resources",
    # "About Spot VMs", "flex-start provisioning mode").
    selector["topology.kubernetes.io/zone"] = env.group_zone(group)
    if group.capacity == "spot":
        selector["cloud.google.com/gke-spot"] = "true"
    elif isinstance(group.capacity, Reservation):
        selector["cloud.google.com/reservation-name"] = group.capacity.reservation
        selector["cloud.google.com/reservation-affinity"] = "specific"
    elif group.capacity == "flex-start":
        selector["cloud.google.com/gke-flex-start"] = "true"
    return selector


def tpu_worker_group(env: Environment, group: SliceGroup, *, slices: int | None = None, name: str | None = None) -> dict[str, Any]:
    """The worker group for `slices` of the group's slices (default: all), named `name` (default:
    the group's name)."""
    shape = group.shape
    slices = group.slices if slices is None else slices
    cpu, memory = group.requests
    resources = {"cpu": cpu, "memory": memory, "google.com/tpu": str(shape.chips_per_host)}
    container = {
        "name": "ray-worker",
        "image": env.ray.worker_image(group.generation),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "env": [
            {"name": "JAX_PLATFORMS", "value": "tpu,cpu"},
            {"name": "ENABLE_PJRT_COMPATIBILITY", "value": "true"},
        ],
        "ports": [{"containerPort": MEGASCALE_PORT, "name": "mxla"}],
        # TPU devices (/dev/vfio) are owned by root on GKE nodes, so TPU workers keep the image's
        # user; they still get no privilege escalation and no capabilities.
        "securityContext": CONTAINER_SECURITY,
    }
    return {
        "groupName": name or group.name,
        "replicas": slices,
        "minReplicas": min(group.min_slices, slices),
        "maxReplicas": slices,
        "numOfHosts": shape.hosts,
        "rayStartParams": {},
        "template": {
            "metadata": {"labels": {**labels(env), SLICE_GROUP_LABEL: group.name}},
            "spec": {
                "serviceAccountName": env.ray.kubernetes_service_account,
                "nodeSelector": tpu_node_selector(env, group),
                "containers": [container],
            },
        },
    }
