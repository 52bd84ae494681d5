"""Kueue's admission of a RayJob, ported as pure functions from Kueue v0.19.2 (kubernetes-sigs/kueue
at 8eab687): the PodSets it makes of a RayJob, each pod's requests as int64s, and the flavor it
assigns each PodSet, resource group by resource group, against the ClusterQueue's quotas. Used by
`jobs.submit --print-rayjob` (a job its ClusterQueue could never admit, even alone, is refused) and
by the tests' fake Kueue, which admits and preempts by the same arithmetic.

What is ported, each with its source (paths under the kueue repository):
- PodSets: `head` (count 1), then every worker group (name lowercased, count = replicas x numOfHosts),
  then `submitter` in K8sJobMode; SidecarMode's submitter container joins the head's template, and
  the in-tree autoscaler's and the GCS fault-tolerance clean-up's requests the head's.
- Requests: containers summed, init containers as a maximum (restartable ones added), pod-level
  requests replacing, overhead added; a missing request takes its limit; ceil to milli-units for
  cpu and to units for everything else, per pod, then x count.
- Flavors, in the resource group's order: the flavor's `nodeTaints` must be tolerated by the pod's
  tolerations plus the flavor's own (so a flavor's tolerations cancel its taints); its `nodeLabels`
  must match the pod's nodeSelector and required node affinity, read only for the flavor's own label
  keys; every covered resource of the PodSet from that one flavor; the quota must hold what the
  workload's earlier PodSets took plus this one's total (strictly greater than the quota: no fit).
- Not ported: cohorts and borrowing, fair sharing, topology-aware scheduling, LimitRange defaults and
  RuntimeClass overhead (none of ours has them), and the `pods` resource.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from infra import quantity

KUEUE = "kubernetes-sigs/kueue@v0.19.2"
RAYJOB_GO = f"{KUEUE} pkg/controller/jobs/rayjob/rayjob_controller.go"
RAYCLUSTER_GO = f"{KUEUE} pkg/controller/jobs/raycluster/common.go"
ASSIGNER_GO = f"{KUEUE} pkg/scheduler/flavorassigner/flavorassigner.go"
# rayjob_controller.go:249-263 defaultSubmitterResources (KubeRay's GetDefaultSubmitterContainer).
SUBMITTER_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
SUBMITTER_LIMITS = {"cpu": "1", "memory": "1Gi"}
SUBMITTER_CONTAINER = "ray-job-submitter"
AUTOSCALER_RESOURCES = {"cpu": "500m", "memory": "512Mi"}  # raycluster/common.go:159-185
REDIS_CLEANUP_REQUESTS = {"cpu": "200m", "memory": "256Mi"}  # raycluster/common.go:130-151


@dataclass(frozen=True)
class PodSet:
    name: str
    count: int
    pod: dict[str, Any]  # the pod template's spec

    def requests(self) -> dict[str, int]:
        return pod_requests(self.pod)


def _resources(requests: dict[str, str], limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"requests": dict(requests), **({"limits": dict(limits)} if limits else {})}


def pod_sets(rayjob: dict[str, Any]) -> list[PodSet]:
    """The RayJob's PodSets, in Kueue's order (rayjob_controller.go:133-154, 289-332;
    raycluster/common.go:64-128)."""
    spec = rayjob["spec"]
    cluster = spec.get("rayClusterSpec", {})
    head = _copy(cluster["headGroupSpec"]["template"].get("spec", {}))
    (ray_head, *_) = head["containers"]
    if cluster.get("enableInTreeAutoscaling"):  # common.go:101-106, 159-185
        options = cluster.get("autoscalerOptions") or {}
        head["containers"].append({"name": "autoscaler", "resources": options.get("resources") or _resources(AUTOSCALER_RESOURCES)})
    annotations = rayjob.get("metadata", {}).get("annotations") or {}
    if cluster.get("gcsFaultToleranceOptions") or annotations.get("ray.io/ft-enabled") == "true":  # common.go:93-97, 130-151
        own = (ray_head.get("resources") or {}).get("requests") or {}
        merged = {r: max((own[r], v), key=quantity.parse) if r in own else v for r, v in REDIS_CLEANUP_REQUESTS.items()}
        ray_head["resources"] = {**(ray_head.get("resources") or {}), "requests": {**own, **merged}}
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode == "SidecarMode":  # rayjob_controller.go:313-332: the default resources whatever else is set
        head["containers"].append({"name": SUBMITTER_CONTAINER, "resources": _resources(SUBMITTER_REQUESTS, SUBMITTER_LIMITS)})
    out = [PodSet("head", 1, head)]
    for group in cluster.get("workerGroupSpecs") or []:  # common.go:64-73 effectiveWorkerCount
        count = group.get("replicas", 1)
        if group.get("numOfHosts", 1) > 1:
            count *= group["numOfHosts"]
        out.append(PodSet(str(group["groupName"]).lower(), count, _copy(group["template"].get("spec", {}))))
    if mode == "K8sJobMode":  # rayjob_controller.go:266-311: the user's template as it is, else the default
        template = spec.get("submitterPodTemplate")
        if template is not None:
            submitter = _copy(template.get("spec", {}))
        else:
            image = ray_head.get("image")
            container = {"name": SUBMITTER_CONTAINER, "image": image, "resources": _resources(SUBMITTER_REQUESTS, SUBMITTER_LIMITS)}
            submitter = {"containers": [container], "restartPolicy": "Never"}
        out.append(PodSet("submitter", 1, submitter))
    return out


def _copy(obj: Any) -> Any:
    import copy

    return copy.deepcopy(obj)


def pod_requests(pod: dict[str, Any]) -> dict[str, int]:
    """One pod's requests as Kueue compares them: limits standing in for missing requests
    (pkg/workload/resources.go:122-138), then k8s component-helpers `PodRequests` (containers summed,
    restartable init containers added, other init containers as a maximum, pod-level requests
    replacing, overhead added), then `ResourceValue` (pkg/resources/requests.go:142-151): cpu in
    milli-units, everything else in units, rounded up."""

    def requested(container: dict[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: quantity.parse(value) for name, value in merged.items()}

    def add(into: dict[str, Decimal], more: dict[str, Decimal]) -> None:
        for name, value in more.items():
            into[name] = into.get(name, Decimal(0)) + value

    total: dict[str, Decimal] = {}
    for container in pod.get("containers") or []:
        add(total, requested(container))
    sidecars: dict[str, Decimal] = {}
    init_max: dict[str, Decimal] = {}
    for init in pod.get("initContainers") or []:
        use = requested(init)
        if init.get("restartPolicy") == "Always":  # a sidecar runs beside the containers too
            add(total, use)
            add(sidecars, use)
            use = dict(sidecars)
        else:
            add(use, sidecars)  # an init container runs beside the sidecars started before it
        for name, value in use.items():
            init_max[name] = max(init_max.get(name, Decimal(0)), value)
    for name, value in init_max.items():
        total[name] = max(total.get(name, Decimal(0)), value)
    pod_level = ((pod.get("resources") or {}).get("requests")) or {}
    for name, value in pod_level.items():
        if name in ("cpu", "memory") or name.startswith("hugepages-"):
            total[name] = quantity.parse(value)
    add(total, {n: quantity.parse(v) for n, v in (pod.get("overhead") or {}).items()})
    return {name: quantity.whole(value, milli=name == "cpu") for name, value in total.items() if value > 0}


def quota_amount(resource: str, nominal: Any) -> int:
    """A quota as Kueue holds it (pkg/resources/amount.go:61-87 AmountFromQuantity)."""
    return quantity.whole(quantity.parse(nominal), milli=resource == "cpu")


def show(resource: str, amount: int) -> str:
    """An amount as Kueue's messages print it (pkg/resources/resource_formatter.go:65-97)."""
    if resource == "cpu":
        return quantity.canonical(amount // 1000, binary=False) if amount % 1000 == 0 else f"{amount}m"
    binary = resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-")
    return quantity.canonical(amount, binary=binary)


@dataclass(frozen=True)
class Flavor:
    name: str
    node_labels: dict[str, str]
    node_taints: tuple[dict[str, Any], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Flavor:
        spec = doc.get("spec") or {}
        return cls(
            doc["metadata"]["name"],
            dict(spec.get("nodeLabels") or {}),
            tuple(spec.get("nodeTaints") or ()),
            tuple(spec.get("tolerations") or ()),
        )


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """k8s.io/api core/v1 toleration.go `ToleratesTaint` (Equal and Exists)."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not toleration.get("value")
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(pod: dict[str, Any], flavor: Flavor) -> dict[str, Any] | None:
    """The flavor's first NoSchedule / NoExecute taint the pod's tolerations and the flavor's own
    leave untolerated (flavorassigner.go:1238-1245)."""
    tolerations = [*(pod.get("tolerations") or []), *flavor.tolerations]
    for taint in flavor.node_taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and labels[key].lstrip("-").isdigit():
        return int(labels[key]) > int(values[0]) if operator == "Gt" else int(labels[key]) < int(values[0])
    return False


def matches(pod: dict[str, Any], flavor: Flavor) -> bool:
    """The pod's nodeSelector and required node affinity, kept for the flavor's own label keys only,
    against a node labelled exactly as the flavor (flavorassigner.go:1224-1254, 1278-1322)."""
    keys, labels = set(flavor.node_labels), flavor.node_labels
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items() if k in keys):
        return False
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        kept = [e for e in term.get("matchExpressions") or [] if e["key"] in keys]
        if not kept:  # an emptied term matches any flavor: the terms are ORed
            return True
        terms.append(kept)
    return not terms or any(all(_expression_holds(e, labels) for e in term) for term in terms)


@dataclass(frozen=True)
class Admission:
    """Kueue's verdict: `flavors` maps each PodSet to {resource: flavor} when it fits; `message` is
    the Workload's QuotaReserved=False message when it does not; `preempt` says it would fit within
    the quotas once others' usage is freed (`needs` lists (flavor, resource) it lacks)."""

    flavors: dict[str, dict[str, str]] = field(default_factory=dict)
    message: str = ""
    preempt: bool = False
    needs: tuple[tuple[str, str], ...] = ()
    usage: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.message and not self.preempt


def assign(
    podsets: list[PodSet],
    cluster_queue: dict[str, Any],
    flavors: dict[str, Flavor],
    usage: dict[tuple[str, str], int] | None = None,
) -> Admission:
    """Flavors for every PodSet against the ClusterQueue's quotas, less `usage` ({(flavor,
    resource): amount} of the workloads already admitted); alone when `usage` is None
    (flavorassigner.go:707-904 assignFlavors, 1061-1206 findFlavorForPodSets, 1330-1380
    fitsResourceQuota; a cluster queue with no cohort: the most a flavor holds is its quota)."""
    usage = usage or {}
    groups = cluster_queue["spec"].get("resourceGroups") or []
    quotas = {
        (f["name"], r["name"]): quota_amount(r["name"], r["nominalQuota"]) for g in groups for f in g["flavors"] for r in f["resources"]
    }
    taken: dict[tuple[str, str], int] = {}  # what this workload's earlier PodSets took
    result: dict[str, dict[str, str]] = {}
    preempt, needs = False, []
    problems: list[str] = []
    for podset in podsets:
        per_pod = podset.requests()
        totals = {r: v * podset.count for r, v in per_pod.items()}
        reasons: list[str] = []
        uncovered = sorted(r for r in totals if not any(r in g["coveredResources"] for g in groups))
        reasons += [f"resource {r} unavailable in ClusterQueue" for r in uncovered]  # flavorassigner.go:1069-1072
        chosen: dict[str, str] = {}
        for group in groups:
            wanted = {r: v for r, v in totals.items() if r in group["coveredResources"]}
            if not wanted or uncovered:
                continue
            best: tuple[str, bool, list[tuple[str, str]]] | None = None
            for entry in group["flavors"]:
                flavor = flavors.get(entry["name"]) or Flavor(entry["name"], {})
                if (taint := untolerated(podset.pod, flavor)) is not None:
                    reasons.append(f"untolerated taint {_taint(taint)} in flavor {flavor.name}")
                    continue
                if not matches(podset.pod, flavor):
                    reasons.append(f"flavor {flavor.name} doesn't match node affinity")
                    continue
                lacking, fits = [], True
                for resource, amount in wanted.items():
                    key = (flavor.name, resource)
                    before = taken.get(key, 0)
                    if before + amount > quotas.get(key, 0):
                        reasons.append(
                            f"insufficient quota for {resource} in flavor {flavor.name}, previously considered podsets requests "
                            f"({show(resource, before)}) + current podset request ({show(resource, amount)}) > maximum capacity "
                            f"({show(resource, quotas.get(key, 0))})"
                        )
                        fits = False
                        break
                    if before + amount > quotas.get(key, 0) - usage.get(key, 0):
                        lacking.append(key)
                if not fits:
                    continue
                if not lacking:  # whenCanPreempt TryNextFlavor: a flavor that fits now wins
                    best = (flavor.name, False, [])
                    break
                best = best or (flavor.name, True, lacking)
            if best is None:
                break
            name, must_preempt, lacking = best
            if must_preempt:
                preempt = True
                needs += lacking
                reasons.append(f"insufficient unused quota in flavor {name}")
            for resource in wanted:
                chosen[resource] = name
                taken[(name, resource)] = taken.get((name, resource), 0) + wanted[resource]
        if set(chosen) != set(totals):
            problems.append(f"couldn't assign flavors to pod set {podset.name}: {', '.join(sorted(set(reasons)))}")
        result[podset.name] = chosen
    if problems:  # flavorassigner.go:228-246 Assignment.Message
        return Admission(message="; ".join(problems))
    return Admission(flavors=result, preempt=preempt, needs=tuple(dict.fromkeys(needs)), usage=taken)


def _taint(taint: dict[str, Any]) -> str:
    """A taint as Go's %s prints a corev1.Taint: `{key value effect <nil>}`."""
    return f"{{{taint['key']} {taint.get('value', '')} {taint['effect']} <nil>}}"


def never_admitted(rayjob: dict[str, Any], kueue_docs: list[dict[str, Any]]) -> str | None:
    """Why the RayJob's ClusterQueue could never admit it, even with nothing else admitted; None
    when it could. `kueue_docs`: the ResourceFlavors and the ClusterQueue it is queued in."""
    (queue,) = [d for d in kueue_docs if d["kind"] == "ClusterQueue"]
    flavors = {d["metadata"]["name"]: Flavor.of(d) for d in kueue_docs if d["kind"] == "ResourceFlavor"}
    verdict = assign(pod_sets(rayjob), queue, flavors)
    if verdict.message:
        return f"ClusterQueue {queue['metadata']['name']} could never admit it: {verdict.message} ({ASSIGNER_GO}:1330-1359)"
    return None


@dataclass(frozen=True)
class Admitted:
    """A workload holding quota: its name, priority, when it was admitted, and its usage."""

    name: str
    priority: int
    admitted_at: float
    usage: dict[tuple[str, str], int]


def total_usage(admitted: list[Admitted]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for workload in admitted:
        for key, amount in workload.usage.items():
            out[key] = out.get(key, 0) + amount
    return out


def preemption_targets(
    podsets: list[PodSet],
    priority: int,
    cluster_queue: dict[str, Any],
    flavors: dict[str, Flavor],
    admitted: list[Admitted],
) -> list[Admitted]:
    """The admitted workloads Kueue evicts so that a pending one fits its ClusterQueue, or [] when
    evicting those it may would not make room (classical preemption within a ClusterQueue with no
    cohort, pkg/scheduler/preemption/preemption.go:282-353 classicalPreemptions and
    fillBackWorkloads): the candidates are the workloads that use a flavor's resource the pending
    one lacks, of lower priority only under `withinClusterQueue: LowerPriority`
    (common/preemption_policy.go:32-50), lowest priority first, then the most recently admitted
    first (common/ordering.go:35-78 CandidatesOrdering); they are removed one by one until the
    pending workload fits, then every target but the last is given back, in reverse order, where
    the workload still fits without its removal."""
    policy = (cluster_queue["spec"].get("preemption") or {}).get("withinClusterQueue", "Never")
    if policy != "LowerPriority":  # Never; LowerOrNewerEqualPriority (which we never print) is not ported
        return []
    lacking = set(assign(podsets, cluster_queue, flavors, total_usage(admitted)).needs)
    candidates = [w for w in admitted if w.priority < priority and any(w.usage.get(k, 0) > 0 for k in lacking)]
    candidates.sort(key=lambda w: (w.priority, -w.admitted_at))
    remaining = list(admitted)
    targets: list[Admitted] = []
    for candidate in candidates:
        remaining.remove(candidate)
        targets.append(candidate)
        if assign(podsets, cluster_queue, flavors, total_usage(remaining)).fits:
            break
    else:
        return []
    for target in reversed(targets[:-1]):  # the last one removed was needed
        if assign(podsets, cluster_queue, flavors, total_usage([*remaining, target])).fits:
            remaining.append(target)
            targets.remove(target)
    return targets
