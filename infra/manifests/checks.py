"""KubeRay's and Kueue's own rules for the objects we print, ported as pure checks over the printed
dicts. A RayJob that breaks one applies fine and then sits in `ValidationFailed` (KubeRay validates in
its reconciler) or is refused by Kueue's webhook: these say so before anything is applied.

Each rule cites its source line: KubeRay at feeaf72 (= ray-operator/v1.7.0, the CRDs in
../shared/kuberay), `ray-operator/controllers/ray/utils/validation.go`; Kueue at v0.19.2 (8eab687).
Each returns a list of one-line problems, empty when the object holds.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

KUBERAY = "ray-project/kuberay@feeaf72 ray-operator/controllers/ray/utils/validation.go"
KUEUE = "kubernetes-sigs/kueue@v0.19.2"
MAX_RAYJOB_NAME = 47  # utils.MaxRayJobNameLength = MaxRayClusterNameLength (53) - 6 (constant.go:375,381)
MAX_PODSETS = 18  # jobframework/constants.go:21 MaxPodSets
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_PODSET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MIN_TOKEN_RAY = (2, 52, 0)  # validation.go:295-297: token auth needs Ray >= 2.52.0


def rayjob_name(name: str) -> list[str]:
    """ValidateRayJobMetadata (validation.go:534-538)."""
    problems = []
    if len(name) > MAX_RAYJOB_NAME:
        problems.append(f"RayJob name {name!r} is {len(name)} characters; KubeRay takes at most {MAX_RAYJOB_NAME} ({KUBERAY}:534)")
    if not _DNS1035.match(name) or len(name) > 63:
        problems.append(
            f"RayJob name {name!r} is not a DNS-1035 label (lowercase letters, digits, '-', starting with a letter) ({KUBERAY}:537)"
        )
    return problems


def kuberay_rayjob(job: dict[str, Any]) -> list[str]:
    """The ValidateRayJobMetadata and ValidateRayJobSpec rules our RayJobs could break."""
    problems = rayjob_name(job["metadata"]["name"])
    spec = job["spec"]
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    if spec.get("suspend") and not shutdown:
        problems.append(f"suspend needs shutdownAfterJobFinishes ({KUBERAY}:547)")
    ttl = spec.get("ttlSecondsAfterFinished", 0)
    if ttl < 0:
        problems.append(f"ttlSecondsAfterFinished must be a non-negative integer ({KUBERAY}:551)")
    if ttl > 0 and not shutdown:
        problems.append(f"ttlSecondsAfterFinished needs shutdownAfterJobFinishes ({KUBERAY}:753)")
    if "rayClusterSpec" not in spec and not spec.get("clusterSelector"):
        problems.append(f"one of rayClusterSpec or clusterSelector must be set ({KUBERAY}:564)")
    if spec.get("submissionMode") == "SidecarMode":
        if "submitterPodTemplate" in spec or "submitterConfig" in spec:
            problems.append(f"SidecarMode takes no submitterPodTemplate or submitterConfig ({KUBERAY}:592,596)")
        head_pod = spec.get("rayClusterSpec", {}).get("headGroupSpec", {}).get("template", {}).get("spec", {})
        if head_pod.get("restartPolicy", "Never") != "Never":
            problems.append(f"SidecarMode needs the head's restartPolicy Never or unset ({KUBERAY}:600)")
    cluster = spec.get("rayClusterSpec", {})
    auth = cluster.get("authOptions", {})
    if auth.get("enableK8sTokenAuth"):
        problems.append(f"K8s token auth mode is not supported for RayJob ({KUBERAY}:606)")
    if auth.get("mode") == "token":
        version = str(cluster.get("rayVersion", ""))
        parts = tuple(int(p) for p in version.split(".")[:3]) if re.fullmatch(r"\d+\.\d+\.\d+", version) else None
        if parts is None or parts < MIN_TOKEN_RAY:
            problems.append(f"token auth needs rayVersion 2.52.0 or later, got {version or 'none'} ({KUBERAY}:285-297)")
    for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
        if not cluster.get("enableInTreeAutoscaling") and ("minReplicas" not in group or "maxReplicas" not in group):
            problems.append(f"workerGroupSpecs[{i}] needs minReplicas and maxReplicas without autoscaling ({KUBERAY}:125)")
        low, high, replicas = group.get("minReplicas", 0), group.get("maxReplicas", 0), group.get("replicas", 0)
        if min(low, high, replicas) < 0 or low > high:
            problems.append(f"workerGroupSpecs[{i}] replicas must be non-negative with minReplicas <= maxReplicas ({KUBERAY}:128-136)")
    if "runtimeEnvYAML" in spec:
        try:
            yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError as err:
            problems.append(f"runtimeEnvYAML does not parse: {err} ({KUBERAY}:616)")
    for key, line in (("activeDeadlineSeconds", 619), ("preRunningDeadlineSeconds", 622)):
        if key in spec and spec[key] <= 0:
            problems.append(f"{key} must be a positive integer ({KUBERAY}:{line})")
    if spec.get("backoffLimit", 0) < 0:
        problems.append(f"backoffLimit must not be negative ({KUBERAY}:625)")
    return problems


def kueue_rayjob(job: dict[str, Any]) -> list[str]:
    """Kueue's RayJob webhook (pkg/controller/jobs/rayjob/rayjob_webhook.go:107-158 and
    raycluster/common.go:298-329) for a job it manages (one with a queue-name label)."""
    if "kueue.x-k8s.io/queue-name" not in job["metadata"].get("labels", {}):
        return []
    spec = job["spec"]
    where = f"{KUEUE} pkg/controller/jobs"
    problems = []
    if spec.get("clusterSelector"):
        problems.append(f"a Kueue-managed RayJob must not use an existing cluster (clusterSelector) ({where}/rayjob/rayjob_webhook.go:118)")
    if "rayClusterSpec" not in spec:
        problems.append(f"a Kueue-managed RayJob needs rayClusterSpec ({where}/rayjob/rayjob_webhook.go:130)")
    if not spec.get("shutdownAfterJobFinishes"):
        problems.append(
            f"a Kueue-managed RayJob must delete its cluster when it finishes (shutdownAfterJobFinishes) ({where}/rayjob/rayjob_webhook.go:138)"
        )
    cluster = spec.get("rayClusterSpec", {})
    if cluster.get("enableInTreeAutoscaling"):
        problems.append(f"Kueue refuses in-tree autoscaling without workload slicing ({where}/raycluster/common.go:302)")
    groups = cluster.get("workerGroupSpecs", [])
    # The head is a PodSet, and so is K8sJobMode's submitter (rayjob/rayjob_controller.go:289-311). The
    # webhook counts the head and the groups (raycluster/common.go:187-189, 313-316); the Workload's
    # CRD, which the submitter's PodSet joins, takes at most 18 (apis/kueue/v1beta2/workload_types.go:36).
    podsets = 1 + len(groups) + (1 if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode" else 0)
    if podsets > MAX_PODSETS:
        problems.append(f"{podsets} PodSets is more than Kueue's {MAX_PODSETS} ({where}/raycluster/common.go:314, workload_types.go:36)")
    if any(g.get("groupName") == "head" for g in groups):
        problems.append(f"no worker group may be named `head` ({where}/raycluster/common.go:319)")
    for group in groups:  # a PodSet's name (apis/kueue/v1beta2/workload_types.go:282-286: lowercased, a DNS label)
        if not _PODSET_NAME.match(str(group.get("groupName", "")).lower()):
            problems.append(
                f"worker group {group.get('groupName')!r} is not a Kueue PodSet name (a DNS label) ({KUEUE} workload_types.go:282-286)"
            )
    return problems


def tpu_webhook_names(job: dict[str, Any]) -> list[str]:
    """The names the Ray TPU webhook and KubeRay derive from a multi-host TPU group's name must be
    valid: the pods' hostnames `<group>-<replica>-<host>` (DNS labels, webhook main.go:846-850) and
    label values `<group>-<replica>` (replicaIndex, main.go:331-336) and `<group>-<5 random>`
    (KubeRay's ray.io/worker-group-replica-name, utils/util.go:378-382), each at most 63 characters."""
    problems = []
    for group in job["spec"].get("rayClusterSpec", {}).get("workerGroupSpecs", []):
        hosts, replicas, name = group.get("numOfHosts", 1), group.get("replicas", 1), str(group.get("groupName", ""))
        if hosts <= 1:
            continue  # the webhook names only multi-host slices' pods (main.go:846)
        longest = max(f"{name}-{replicas - 1}-{hosts - 1}", f"{name}-xxxxx", key=len)
        if len(longest) > 63 or not _DNS1035.match(name):
            problems.append(
                f"worker group {name!r}: its hosts' names such as {longest!r} must be DNS labels of at most 63 characters "
                "(ai-on-gke/kuberay-tpu-webhook main.go:846-850; KubeRay utils/util.go:378-382)"
            )
    return problems


def kueue_cluster_queue(queue: dict[str, Any], flavor_names: set[str]) -> list[str]:
    """Kueue's ClusterQueue webhook (pkg/webhooks/clusterqueue_webhook.go) and the v1beta2 CRD's
    CEL rules, against the ResourceFlavors printed with it."""
    where = f"{KUEUE} pkg/webhooks/clusterqueue_webhook.go"
    problems = []
    spec = queue["spec"]
    seen_flavors: set[str] = set()
    seen_resources: set[str] = set()
    for g, group in enumerate(spec.get("resourceGroups", [])):
        covered = group["coveredResources"]
        if len(set(covered)) != len(covered) or seen_resources & set(covered):
            problems.append(f"resourceGroups[{g}] repeats a covered resource ({where}:302)")
        seen_resources |= set(covered)
        for f, flavor in enumerate(group["flavors"]):
            at = f"resourceGroups[{g}].flavors[{f}]"
            if flavor["name"] in seen_flavors:
                problems.append(f"{at}: flavor {flavor['name']} appears twice ({where}:302)")
            seen_flavors.add(flavor["name"])
            if flavor["name"] not in flavor_names:
                problems.append(f"{at}: no ResourceFlavor {flavor['name']} is printed with the ClusterQueue")
            names = [r["name"] for r in flavor["resources"]]
            if names != covered:
                problems.append(f"{at}: resources {names} must match coveredResources {covered}, in order ({where}:339)")
            for r in flavor["resources"]:
                if str(r["nominalQuota"]).startswith("-"):
                    problems.append(f"{at}: quota for {r['name']} must not be negative ({where}:359)")
    for check in spec.get("admissionChecksStrategy", {}).get("admissionChecks", []):
        unknown = set(check.get("onFlavors", [])) - seen_flavors
        if unknown:
            problems.append(f"admission check {check['name']} names flavors the queue does not have: {sorted(unknown)} ({where}:159)")
    return problems
