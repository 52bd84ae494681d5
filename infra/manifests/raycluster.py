"""The KubeRay `ray.io/v1` RayCluster for an environment: a head group on the CPU pool and one TPU
worker group per slice group (less the slices the RayService holds: `cluster_slices`).

Per worker group: `numOfHosts` = hosts per slice (pods per replica), `replicas` = slices, and every
pod asks for `google.com/tpu` = chips per host, plus CPU and memory that fit the machine
(`SliceGroup.requests`). On Standard, pods select their own group's pools by the pools' node label
`ray-tpu-gke/slice-group`, so two groups of one shape never take each other's nodes. The Ray TPU
webhook rejects a group unless numOfHosts == max(topology chips / google.com/tpu per pod, 1); that
holds by construction, since both come from the same catalog shape.

Access (README "Access"): `authOptions: {mode: token}` turns on Ray token authentication. The
operator creates the Secret (named after the RayCluster, key `auth_token`), injects the token into
every Ray container it adds (the autoscaler), and sends it to the dashboard itself; our containers
name the same Secret explicitly, so the printed manifest shows where each token comes from. Every
port Ray would pick at random is pinned (infra.ray_ports), and every pod carries
`ray-tpu-gke/ray-cluster: <name>`, which its NetworkPolicy (infra.manifests.network_policy) selects.

Applied with `python -m infra manifests --env dev | kubectl apply -f -` (a pipeline step), not by
Terraform: a kubernetes-provider stack would need cluster credentials at plan time and would tie a
RayCluster's rolling changes to infrastructure applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra import disruption, ray_ports
from infra.config import Environment, Reservation, SliceGroup
from infra.manifests.network_policy import network_policy
from infra.names import AUTH_TOKEN_KEY, CPU_POOL_NAME, RAY_CLUSTER_LABEL, SLICE_GROUP_LABEL, auth_secret_name, ray_service_account_email
from infra.names import labels as labels

DASHBOARD_PORT = ray_ports.DASHBOARD.port
MEGASCALE_PORT = ray_ports.MEGASCALE.port  # multislice (DCN) traffic between slices
RAY_UID = 1000  # the `ray` user of the rayproject/ray images

HEAD_PORTS = [
    {"containerPort": p.port, "name": p.name}
    for p in (ray_ports.GCS, ray_ports.DASHBOARD, ray_ports.CLIENT, ray_ports.SERVE, ray_ports.METRICS)
]
TPU_PORTS = [{"containerPort": p.port, "name": p.name} for p in (ray_ports.MEGASCALE, ray_ports.SLICE_BUILDER)]

# No privilege escalation and no extra capabilities for any Ray container.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# The `ray` user, never root, for the pods that touch no TPU (the head, a RayJob's submitter).
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RAY_UID, "fsGroup": 100}


def ray_cluster(env: Environment) -> dict[str, Any]:
    groups = [(g, cluster_slices(env, g)) for g in env.slice_groups]
    cluster = RayClusterPods(env.ray_cluster_name, auth_secret_name(env))
    spec: dict[str, Any] = {
        "rayVersion": env.ray.version,
        "authOptions": auth_options(env),
        "headGroupSpec": head_group(env, cluster),
        "workerGroupSpecs": [tpu_worker_group(env, g, cluster, slices=n) for g, n in groups if n],
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
    the group serves and the slices it leaves to RayJobs. A slice belongs to one of them, so they
    never wait on each other."""
    serving = env.serving
    held = serving.replicas if serving is not None and serving.slice_group == group.name else 0
    return group.slices - held - group.rayjob_slices


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
    """The namespace, service account, RayCluster and its NetworkPolicy, in `kubectl apply` order."""
    docs: list[dict[str, Any]] = []
    if env.ray.namespace != "default":
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": env.ray.namespace}})
    docs.append(service_account(env, ray_service_account_email(env)))
    docs.append(ray_cluster(env))
    docs.append(network_policy(env, env.ray_cluster_name, serving=False))
    return docs


@dataclass(frozen=True)
class RayClusterPods:
    """Which Ray cluster a group's pods belong to: `name` is their RAY_CLUSTER_LABEL, and
    `token_secret` the Secret each Ray container names for its token (None: the operator injects
    it, as for a RayService, whose RayCluster and Secret names KubeRay generates)."""

    name: str
    token_secret: str | None


def _env_list(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def auth_options(env: Environment) -> dict[str, str]:
    return {"mode": env.ray.access.auth}


def auth_env(cluster: RayClusterPods) -> list[dict[str, Any]]:
    """RAY_AUTH_MODE and the token from the cluster's Secret (never a literal)."""
    if cluster.token_secret is None:
        return []
    token = {"secretKeyRef": {"name": cluster.token_secret, "key": AUTH_TOKEN_KEY}}
    return [{"name": "RAY_AUTH_MODE", "value": "token"}, {"name": "RAY_AUTH_TOKEN", "valueFrom": token}]


def pod_labels(env: Environment, cluster: RayClusterPods) -> dict[str, str]:
    return {**labels(env), RAY_CLUSTER_LABEL: cluster.name}


def head_group(env: Environment, cluster: RayClusterPods) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "serviceAccountName": env.ray.kubernetes_service_account,
        "securityContext": dict(POD_SECURITY),
        "containers": [
            {
                "name": "ray-head",
                "image": env.ray.image,
                "ports": HEAD_PORTS,
                # The GCS declares a vanished TPU host dead within seconds, not Ray's 13 (infra.disruption).
                "env": [*auth_env(cluster), *_env_list(disruption.HEALTH.env())],
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
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0", **ray_ports.start_params(head=True)},
        "serviceType": "ClusterIP",
        "template": {"metadata": {"labels": pod_labels(env, cluster)}, "spec": pod_spec},
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
        # A shared reservation names its owner project, a block its block (label values cannot
        # hold the `projects/.../reservations/...` path the node pools take).
        selector["cloud.google.com/reservation-name"] = group.capacity.name
        selector["cloud.google.com/reservation-affinity"] = "specific"
        if group.capacity.owner_project:
            selector["cloud.google.com/reservation-project"] = group.capacity.owner_project
        if group.capacity.block:
            selector["cloud.google.com/reservation-blocks"] = group.capacity.block
    elif group.capacity == "flex-start":
        selector["cloud.google.com/gke-flex-start"] = "true"
    return selector


def tpu_worker_group(
    env: Environment, group: SliceGroup, cluster: RayClusterPods, *, slices: int | None = None, name: str | None = None
) -> dict[str, Any]:
    """The worker group for `slices` of the group's slices (default: all), named `name` (default:
    the group's name), whose pods belong to `cluster`."""
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
            # On SIGTERM (a preemption notice, a Kueue eviction) Ray drains the host inside the
            # pod's grace period, and Ray Train's workers hear of it (infra.disruption).
            *_env_list(disruption.TPU_POD_SHUTDOWN.env()),
            *auth_env(cluster),
        ],
        "ports": TPU_PORTS,
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
        "rayStartParams": ray_ports.start_params(head=False),
        "template": {
            "metadata": {"labels": {**pod_labels(env, cluster), SLICE_GROUP_LABEL: group.name}},
            "spec": {
                "serviceAccountName": env.ray.kubernetes_service_account,
                "terminationGracePeriodSeconds": disruption.TPU_POD_SHUTDOWN.grace_period_s,
                "nodeSelector": tpu_node_selector(env, group),
                "containers": [container],
            },
        },
    }
