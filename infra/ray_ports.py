"""Every port a Ray pod listens on, as data: who connects to it and where its number comes from.

Ray picks the raylet's, the object manager's, the dashboard agent's and the runtime env agent's
ports at random unless `ray start` is told (`ray start --help`, Ray 2.60), and every worker process
takes one of `min-worker-port`..`max-worker-port`; KubeRay pins two by default (metrics 8080,
dashboard agent 52365: kuberay `common/pod.go`, `utils/constant.go`). We pin them all, so a Ray pod's
ports are the same on every start.

The NetworkPolicies (infra.manifests.network_policy) name single ports only for the clients from
outside a Ray cluster (the operator, Prometheus, the configured peers). Within a cluster they allow
every port: Ray's workers listen on thousands of ports (a range), Ray Train's and JAX's coordinators
on free ones, and a range needs `endPort`, which Cilium (GKE Dataplane V2's policy engine) accepted
and silently ignored until it implemented port ranges (cilium/cilium#28684), and which allows at
most 40 ports per rule where it does; GKE does not say which Cilium each version runs. A rule that
silently admitted one port of a range would leave a slice unable to run a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infra.platform_facts import Source

KUBERAY_POD = Source(
    "KubeRay ray-operator/controllers/ray/common/pod.go and utils/constant.go (default metrics-export-port 8080, dashboard-agent-listen-port 52365)",
    "https://github.com/ray-project/kuberay/tree/feeaf72facab4881ba2b179248bb67315634e229/ray-operator/controllers/ray",
)
RAY_START = Source(
    "`ray start --help` (Ray 2.60.0): the ports Ray otherwise picks at random",
    "https://docs.ray.io/en/latest/ray-core/configure.html#ports-configurations",
)
KUBERAY_TPU_SAMPLE = Source(
    "KubeRay sample ray-cluster.tpu-v4-multihost.yaml (containerPort 8471 `slicebuilder`, 8081 `mxla`); "
    "Ray 2.60 `ray/_private/accelerators/tpu.py` DEFAULT_MEGASCALE_PORT = 8081",
    "https://github.com/ray-project/kuberay/blob/master/ray-operator/config/samples/ray-cluster.tpu-v4-multihost.yaml",
)
CILIUM_END_PORT = Source(
    'cilium/cilium#28684 "Cilium silently accepts k8s networkpolicy with endPort without implementing it" (2023-10); '
    "cilium/cilium#17315 (endPort parsing, at most 40 ports per rule)",
    "https://github.com/cilium/cilium/issues/28684",
)

Role = Literal["head", "all", "tpu"]
# Who may connect: the pods of the same Ray cluster, the KubeRay operator, Managed Prometheus, or
# the peers the config names for the dashboard / Serve (`ray.access`).
Client = Literal["cluster", "operator", "prometheus", "dashboard-peers", "serve-peers"]


@dataclass(frozen=True)
class RayPort:
    name: str  # the containerPort name, at most 15 characters
    port: int
    on: Role  # which pods listen: the head, every Ray pod, or the TPU hosts
    clients: tuple[Client, ...]
    start_param: str | None  # the `ray start` flag that pins it (None: not Ray's, or not a flag)
    source: Source
    end_port: int | None = None  # a range: port..end_port


GCS = RayPort("gcs", 6379, "head", ("cluster",), "port", RAY_START)
DASHBOARD = RayPort("dashboard", 8265, "head", ("cluster", "operator", "dashboard-peers"), "dashboard-port", RAY_START)
CLIENT = RayPort("client", 10001, "head", ("cluster", "dashboard-peers"), "ray-client-server-port", RAY_START)
SERVE = RayPort("serve", 8000, "all", ("cluster", "operator", "serve-peers"), None, RAY_START)  # serveConfigV2 http_options
METRICS = RayPort("metrics", 8080, "all", ("cluster", "prometheus"), "metrics-export-port", KUBERAY_POD)
NODE_MANAGER = RayPort("node-manager", 6380, "all", ("cluster",), "node-manager-port", RAY_START)
OBJECT_MANAGER = RayPort("object-manager", 6381, "all", ("cluster",), "object-manager-port", RAY_START)
RUNTIME_ENV_AGENT = RayPort("runtime-env", 6382, "all", ("cluster",), "runtime-env-agent-port", RAY_START)
AGENT_GRPC = RayPort("agent-grpc", 6383, "all", ("cluster",), "dashboard-agent-grpc-port", RAY_START)
AGENT_HTTP = RayPort("agent-http", 52365, "all", ("cluster",), "dashboard-agent-listen-port", KUBERAY_POD)
WORKERS = RayPort("workers", 10002, "all", ("cluster",), "min-worker-port", RAY_START, end_port=19999)
SLICE_BUILDER = RayPort("slicebuilder", 8471, "tpu", ("cluster",), None, KUBERAY_TPU_SAMPLE)
MEGASCALE = RayPort("mxla", 8081, "tpu", ("cluster",), None, KUBERAY_TPU_SAMPLE)  # multislice (DCN)

PORTS = (
    GCS,
    DASHBOARD,
    CLIENT,
    SERVE,
    METRICS,
    NODE_MANAGER,
    OBJECT_MANAGER,
    RUNTIME_ENV_AGENT,
    AGENT_GRPC,
    AGENT_HTTP,
    WORKERS,
    SLICE_BUILDER,
    MEGASCALE,
)


def listens(port: RayPort, head: bool, tpu: bool) -> bool:
    return port.on == "all" or (port.on == "head" and head) or (port.on == "tpu" and tpu)


def start_params(head: bool) -> dict[str, str]:
    """The `rayStartParams` that pin every port Ray would otherwise choose (pure)."""
    params: dict[str, str] = {}
    for port in PORTS:
        if port.start_param is None or not listens(port, head, tpu=False):
            continue
        params[port.start_param] = str(port.port)
        if port.end_port is not None:
            params["max-worker-port"] = str(port.end_port)
    return params


def clients_of(client: Client, head: bool, tpu: bool) -> list[RayPort]:
    """The ports a pod (head or not, TPU or not) opens to `client`, in PORTS order (pure)."""
    return [p for p in PORTS if client in p.clients and listens(p, head, tpu)]
