"""Every port a Ray pod listens on, pinned, as data: the NetworkPolicies name these ports, so Ray
must not pick any at random. Each port says who connects to it and where its number comes from.

Ray picks the raylet's, the object manager's, the dashboard agent's, the runtime env agent's and
every worker's port at random unless `ray start` is told (`ray start --help`, Ray 2.60); KubeRay pins
two of them by default (metrics 8080, dashboard agent 52365: kuberay `common/pod.go`, `utils/constant.go`).
Ray Train's JAX backend binds its coordinator to a free port (`ray.train._internal.utils.get_address_and_port`),
which the kernel takes from `net.ipv4.ip_local_port_range`: each Ray pod sets that range
(`EPHEMERAL_PORTS`, a namespaced sysctl Kubernetes counts as safe), and the policy names it.
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
JAX_CLOUD_TPU = Source(
    "jax/_src/clusters/cloud_tpu_cluster.py (jax 0.10.2): `coordinator_port = '8482'` for multi-host Cloud TPU",
    "https://github.com/jax-ml/jax/blob/main/jax/_src/clusters/cloud_tpu_cluster.py",
)
KUBERAY_TPU_SAMPLE = Source(
    "KubeRay sample ray-cluster.tpu-v4-multihost.yaml (containerPort 8471 `slicebuilder`, 8081 `mxla`); "
    "Ray 2.60 `ray/_private/accelerators/tpu.py` DEFAULT_MEGASCALE_PORT = 8081",
    "https://github.com/ray-project/kuberay/blob/master/ray-operator/config/samples/ray-cluster.tpu-v4-multihost.yaml",
)
SAFE_SYSCTLS = Source(
    'Kubernetes "Using sysctls in a Kubernetes Cluster": net.ipv4.ip_local_port_range is a safe (namespaced) sysctl',
    "https://kubernetes.io/docs/tasks/administer-cluster/sysctl-cluster/",
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

    def numbers(self) -> str:
        return f"{self.port}-{self.end_port}" if self.end_port else str(self.port)


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
JAX_COORDINATOR = RayPort("jax-coord", 8482, "tpu", ("cluster",), None, JAX_CLOUD_TPU)
SLICE_BUILDER = RayPort("slicebuilder", 8471, "tpu", ("cluster",), None, KUBERAY_TPU_SAMPLE)
MEGASCALE = RayPort("mxla", 8081, "tpu", ("cluster",), None, KUBERAY_TPU_SAMPLE)  # multislice (DCN)
# Ray Train's JAX coordinator (a free port) and any other port a job binds without naming one.
EPHEMERAL = RayPort("ephemeral", 20000, "all", ("cluster",), None, SAFE_SYSCTLS, end_port=29999)

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
    JAX_COORDINATOR,
    SLICE_BUILDER,
    MEGASCALE,
    EPHEMERAL,
)
# The sysctl that keeps free-port binds (Ray Train's JAX coordinator) inside EPHEMERAL.
EPHEMERAL_SYSCTL = {"name": "net.ipv4.ip_local_port_range", "value": f"{EPHEMERAL.port} {EPHEMERAL.end_port}"}
# The environment variable that tells `jobs.runtime.launch` which port the JAX coordinator uses.
COORDINATOR_PORT_ENV = "RAY_TPU_GKE_JAX_COORDINATOR_PORT"


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
