"""The cloud's side of a RayJob's TPU pods, as strict as the real parts, for tests: the nodes GKE makes of
the TPU node pools a synthesized stack declares (labels and taints), GKE's queued provisioning of a
ProvisioningRequest that Kueue builds (its builder ported from Kueue), and where pods land once the
Ray TPU webhook has given them its pod affinity (kube-scheduler's required pod affinity, ported).
Each cites its source (infra.kube_facts keys, or lines).

- Nodes: a pool's node_config labels, plus what GKE adds (`cloud.google.com/gke-nodepool`,
  `cloud.google.com/gke-tpu-accelerator`, `cloud.google.com/gke-tpu-topology`); taints
  `google.com/tpu=present:NoSchedule` ("gke-tpu-taint") and, on queued-provisioning pools,
  `cloud.google.com/gke-queued=true:NoSchedule` (GKE's provisioningrequest page: --enable-queued-
  provisioning "add[s] the cloud.google.com/gke-queued taint to the node pool").
- Queued provisioning: one PodSet per request ("dws-one-podset": GKE's warden refuses more); the
  request's pods must schedule on the nodes of one pool no request holds yet, one pod per node, the
  whole pool at once ("scheduled atomically"), or it is never provisioned.
- Placement: the webhook of before v1.2.5 ("webhook-affinity": the add-on's version is not
  published, so the laxest match is assumed) labels each multi-host pod `replicaIndex=<group>-<i>`
  and requires pod affinity on it, in the pod's namespace, per node pool. kube-scheduler's rule for
  a required affinity term: some pod matching it already runs in the same pool, or none matches
  anywhere and the pod matches its own term (interpodaffinity/filtering.go, the "first pod" rule).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from infra import catalog
from infra.manifests.kueue_admission import Flavor, PodSet, pod_requests, untolerated
from infra.platform_facts import MACHINES

TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
QUEUED_TAINT = {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}
POOL_LABEL = "cloud.google.com/gke-nodepool"
REPLICA_LABEL = "replicaIndex"  # the webhook's (main.go:331-336)


@dataclass
class Pool:
    name: str
    hosts: int
    labels: dict[str, str]
    taints: list[dict[str, str]]
    queued: bool
    capacity: dict[str, int]  # one node's allocatable, as Kueue counts (cpu in milli-units)
    pods: list[dict[str, Any]] = field(default_factory=list)  # bound pods, one per node
    provisioned: bool = False  # a queued-provisioning pool has nodes only once a request got them

    @property
    def has_nodes(self) -> bool:
        return not self.queued or self.provisioned


def tpu_pools(stack: dict[str, Any]) -> dict[str, Pool]:
    """The TPU pools of a synthesized stack (`cdk.tf.json`), as GKE labels and taints their nodes."""
    policies = stack["resource"].get("google_compute_resource_policy", {})
    out = {}
    for pool in stack["resource"].get("google_container_node_pool", {}).values():
        config = pool["node_config"]
        gen = next((g for g in catalog.GENERATIONS if config["machine_type"].startswith(g.machine_type_pattern.split("{")[0])), None)
        if gen is None:
            continue  # the CPU pool
        chips = int(config["machine_type"].rsplit("-", 1)[1].rstrip("t"))
        placement = pool.get("placement_policy") or {}
        topology = placement.get("tpu_topology")
        if "policy_name" in placement:  # TPU7x: the workload policy's topology
            ref = placement["policy_name"].split(".")[1]
            topology = next(p["workload_policy"]["accelerator_topology"] for k, p in policies.items() if k == ref)
        if topology is None:  # a single-host slice: the one shape of this machine on one host
            (topology,) = [s.topology for s in catalog.shapes(gen) if s.hosts == 1 and s.chips_per_host == chips]
        shape = catalog.shape(gen, topology, chips)
        queued = bool((pool.get("queued_provisioning") or {}).get("enabled"))
        labels = {**config.get("labels", {}), POOL_LABEL: pool["name"]}
        labels |= {"cloud.google.com/gke-tpu-accelerator": gen.gke_accelerator, "cloud.google.com/gke-tpu-topology": topology}
        taints = [*({"key": t["key"], "value": t["value"], "effect": t["effect"]} for t in config.get("taint", [])), TPU_TAINT]
        machine = MACHINES[config["machine_type"]]
        capacity = {
            "cpu": int(machine.allocatable_cpu * 1000),
            "memory": int(machine.allocatable_memory),
            "google.com/tpu": chips,
        }
        out[pool["name"]] = Pool(pool["name"], shape.hosts, labels, [*taints, *([QUEUED_TAINT] if queued else [])], queued, capacity)
    return out


def fits_node(pod: dict[str, Any], pool: Pool) -> str | None:
    """Why a pod cannot run on a node of `pool` (selector, taints, resources), or None."""
    if any(pool.labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return f"node selector {pod.get('nodeSelector')} does not match pool {pool.name}'s labels"
    node = Flavor(pool.name, pool.labels, tuple(pool.taints))
    if (taint := untolerated(pod, node)) is not None:
        return f"untolerated taint {taint['key']}={taint.get('value', '')}:{taint['effect']} on pool {pool.name}"
    for resource, amount in pod_requests(pod).items():
        if amount > pool.capacity.get(resource, 0):
            return f"{resource} {amount} is more than a node of pool {pool.name} has ({pool.capacity.get(resource, 0)})"
    return None


# -- Kueue's ProvisioningRequest, and GKE's answer --------------------------------------------------


def provisioning_request(
    podsets: list[PodSet], assigned: dict[str, dict[str, str]], flavors: dict[str, Flavor], managed: list[str]
) -> list[PodSet]:
    """The PodSets of the ProvisioningRequest Kueue makes for an admitted workload: those that request a
    managed resource, each template with its assigned flavor's nodeLabels as nodeSelector and the
    flavor's tolerations added, the pod's own kept (kueue v0.19.2 pkg/controller/admissionchecks/
    provisioning/controller.go:395-433, 499-537; pkg/podset/podset.go:78-147)."""
    out = []
    for podset in podsets:
        uses = any(
            r in managed
            for c in podset.pod.get("containers", [])
            for part in ("requests", "limits")
            for r in (c.get("resources") or {}).get(part, {})
        )
        if not uses or podset.count < 1:
            continue
        pod = copy.deepcopy(podset.pod)
        for name in dict.fromkeys(assigned.get(podset.name, {}).values()):
            flavor = flavors[name]
            pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **flavor.node_labels}
            pod["tolerations"] = [
                *(pod.get("tolerations") or []),
                *(t for t in flavor.tolerations if t not in (pod.get("tolerations") or [])),
            ]
        out.append(PodSet(podset.name, podset.count, pod))
    return out


def provision(request: list[PodSet], pools: dict[str, Pool]) -> tuple[str | None, str]:
    """GKE's queued provisioning of one request: (the pool it provisioned, "") or (None, why never)."""
    if len(request) != 1:
        return None, "the queued provisioning feature currently supports only single PodSet per request"  # ray#57839, as GKE's warden says
    (podset,) = request
    reasons = []
    for pool in pools.values():
        if not pool.queued or pool.provisioned:
            continue
        why = fits_node(podset.pod, pool)
        if why is None and podset.count != pool.hosts:
            why = f"{podset.count} pods for pool {pool.name}'s {pool.hosts} nodes: a request is provisioned whole, in one pool"
        if why is None:
            pool.provisioned = True
            return pool.name, ""
        reasons.append(why)
    return None, "; ".join(reasons) or "no queued-provisioning pool is free"


# -- the TPU webhook's pods, and where they land -----------------------------------------------------


def webhook_pods(rayjob: dict[str, Any], cluster: str, flavor_labels: dict[str, str]) -> list[dict[str, Any]]:
    """The TPU worker pods of an admitted RayJob's cluster: the template with Kueue's flavor labels
    merged in, then what the webhook injects into each multi-host pod (main.go:292-336 at 2561974)."""
    pods = []
    namespace = rayjob["metadata"].get("namespace", "default")
    for group in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        for replica in range(group.get("replicas", 1)):
            for host in range(group.get("numOfHosts", 1)):
                spec = copy.deepcopy(group["template"]["spec"])
                spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **flavor_labels}
                labels = {
                    **group["template"].get("metadata", {}).get("labels", {}),
                    "ray.io/cluster": cluster,
                    "ray.io/group": group["groupName"],
                }
                if group.get("numOfHosts", 1) > 1:
                    value = f"{group['groupName']}-{replica}"
                    labels[REPLICA_LABEL] = value
                    term = {
                        "labelSelector": {"matchExpressions": [{"key": REPLICA_LABEL, "operator": "In", "values": [value]}]},
                        "topologyKey": POOL_LABEL,
                    }
                    spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
                pods.append(
                    {
                        "metadata": {"name": f"{cluster}-{group['groupName']}-{replica}-{host}", "namespace": namespace, "labels": labels},
                        "spec": spec,
                    }
                )
    return pods


def _selects(term: dict[str, Any], labels: dict[str, str]) -> bool:
    expressions = term["labelSelector"].get("matchExpressions", [])
    return all(labels.get(e["key"]) in e["values"] for e in expressions if e["operator"] == "In")


def schedule(pod: dict[str, Any], pools: dict[str, Pool]) -> str | None:
    """Bind the pod to a free node of a pool it fits and whose pods satisfy its required pod affinity;
    the pool's name, or None when it stays Pending."""
    terms = ((pod["spec"].get("affinity") or {}).get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])
    namespace = pod["metadata"]["namespace"]
    bound = [(p, pool) for pool in pools.values() for p in pool.pods if p["metadata"]["namespace"] == namespace]
    for pool in pools.values():
        if not pool.has_nodes or len(pool.pods) >= pool.hosts or fits_node(pod["spec"], pool) is not None:
            continue
        ok = True
        for term in terms:
            anywhere = [where.name for p, where in bound if _selects(term, p["metadata"]["labels"])]
            if anywhere:
                ok = ok and pool.name in anywhere  # topologyKey gke-nodepool: the same pool
            else:
                ok = ok and _selects(term, pod["metadata"]["labels"])  # the first pod of its kind
        if ok:
            pool.pods.append(pod)
            return pool.name
    return None
