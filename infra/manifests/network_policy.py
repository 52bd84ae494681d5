"""One `networking.k8s.io/v1` NetworkPolicy per Ray cluster (the RayCluster, and the RayService's):
its pods accept traffic only as listed below. Egress stays open (GCS, Artifact Registry, the
metadata server).

- From the pods of the same Ray cluster (RAY_CLUSTER_LABEL): any port. The head and the TPU hosts
  reach each other; multi-host JAX needs every host to reach the coordinator, and Ray's workers
  listen on a range of ports no policy can safely name (infra.ray_ports says why).
- From the KubeRay operator: the dashboard (it deploys a RayService's Serve config and submits
  RayJobs through it) and, for a RayService, Serve (it checks each proxy's health). GKE hosts the
  add-on's operator and does not say where its requests come from; a controller GKE hosts reaches
  pods from the control plane: its range (`network.master_cidr`) or, through the API server's
  proxy, the konnectivity agents in kube-system. A self-installed operator: `ray.access.operator_namespace`.
- From Managed Prometheus's collectors (namespace gmp-system, `app.kubernetes.io/name: collector`):
  the metrics port.
- From the peers `ray.access.dashboard_from` names: the dashboard / Jobs API and Ray Client; from
  `ray.access.serve_from`: Serve. Default none: `kubectl port-forward` is the way in (it enters the
  pod through the kubelet, which network policies do not filter).
"""

from __future__ import annotations

from typing import Any

from infra import ray_ports
from infra.config import Environment, Peer
from infra.names import RAY_CLUSTER_LABEL, labels
from infra.platform_facts import Source

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace since Kubernetes 1.21
GMP_COLLECTORS = {
    "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "gmp-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "collector"}},
}
GMP_SOURCE = Source(
    "GoogleCloudPlatform/prometheus-engine manifests/operator.yaml (DaemonSet `collector` in gmp-system, pod label app.kubernetes.io/name: collector)",
    "https://github.com/GoogleCloudPlatform/prometheus-engine/blob/00fc0a68f7df4a63f5e71a86894142b7929a297c/manifests/operator.yaml",
)
KONNECTIVITY_AGENTS = {
    "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}},
}


def policy_name(cluster: str) -> str:
    return f"{cluster}-ingress"


def _ports(ports: list[ray_ports.RayPort]) -> list[dict[str, Any]]:
    """Single ports only: no `endPort` (infra.ray_ports says why)."""
    assert all(p.end_port is None for p in ports), "a range reaches a client from outside the cluster"
    return [{"protocol": "TCP", "port": p.port} for p in ports]


def _union(*port_lists: list[ray_ports.RayPort]) -> list[ray_ports.RayPort]:
    seen = {p for ports in port_lists for p in ports}
    return [p for p in ray_ports.PORTS if p in seen]


def _listened(client: ray_ports.Client) -> list[ray_ports.RayPort]:
    """Every port any pod of a Ray cluster (head, CPU or TPU host) opens to `client`."""
    return _union(*(ray_ports.clients_of(client, head, tpu) for head in (True, False) for tpu in (True, False)))


def peer(p: Peer) -> dict[str, Any]:
    """A config peer as a NetworkPolicyPeer (no namespace: the policy's own namespace)."""
    out: dict[str, Any] = {}
    if p.namespace is not None:
        out["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: p.namespace}}
    out["podSelector"] = {"matchLabels": dict(p.pod_labels)} if p.pod_labels else {}
    return out


def operator_peers(env: Environment) -> list[dict[str, Any]]:
    namespace = env.ray.access.operator_namespace
    if namespace is not None:
        return [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}, "podSelector": {}}]
    return [{"ipBlock": {"cidr": str(env.network.master_cidr)}}, KONNECTIVITY_AGENTS]


def network_policy(env: Environment, cluster: str, *, serving: bool) -> dict[str, Any]:
    """The NetworkPolicy of the Ray cluster whose pods carry RAY_CLUSTER_LABEL=`cluster`."""
    own = {RAY_CLUSTER_LABEL: cluster}
    access = env.ray.access
    operator_ports = [ray_ports.DASHBOARD, *([ray_ports.SERVE] if serving else [])]
    rules: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": own}}]},  # every port: infra.ray_ports says why
        {"from": operator_peers(env), "ports": _ports(operator_ports)},
        {"from": [GMP_COLLECTORS], "ports": _ports(_listened("prometheus"))},
    ]
    if access.dashboard_from:
        rules.append({"from": [peer(p) for p in access.dashboard_from], "ports": _ports(_listened("dashboard-peers"))})
    if access.serve_from:
        rules.append({"from": [peer(p) for p in access.serve_from], "ports": _ports(_listened("serve-peers"))})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": policy_name(cluster), "namespace": env.ray.namespace, "labels": labels(env)},
        "spec": {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": rules},
    }
