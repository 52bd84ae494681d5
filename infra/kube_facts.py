"""What Kueue, KubeRay, the Ray TPU webhook and GKE's queued provisioning do with the RayJobs we print,
as data beside the catalog: each fact with its source (repository and lines, or page) and the day it
was read. `infra.manifests.rayjob`, `infra.manifests.kueue` and the pure ports
(`infra.manifests.kueue_admission`, the tests' fakes) cite them by key; a test checks every key
cited in the code is here. Read with the project's helpers on 2026-12-06."""

from __future__ import annotations

from dataclasses import dataclass

from infra.platform_facts import Source

READ = "2026-12-06"
KUEUE = "kubernetes-sigs/kueue v0.19.2 (8eab687)"
KUBERAY = "ray-project/kuberay ray-operator v1.7.0 (feeaf72)"
WEBHOOK = "ai-on-gke/kuberay-tpu-webhook"


@dataclass(frozen=True)
class KubeFact:
    key: str
    fact: str
    source: Source


def _src(title: str, url: str) -> Source:
    return Source(title, url, READ)


FACTS = (
    KubeFact(
        "submission-mode",
        "KubeRay fails a Running RayJob 30 s after its submitter finished while the Ray job is not terminal "
        "(DefaultSubmitterFinishedTimeout, not configurable), and at once when the submitter Job fails; SidecarMode's submitter is "
        "a blocking `ray job submit` whose non-zero exit fails the RayJob on the next reconcile (the SidecarSubmitterRestart gate, "
        "alpha, needs Kubernetes 1.35 and still fails on an exit 0); K8sJobMode's submitter is a Job that retries its pod "
        "(backoffLimit, default 2) and leaves a submitterPodTemplate's command as it is; a dropped `ray job logs --follow` fails a "
        "running job in both (kuberay#4921, open)",
        _src(
            f"{KUBERAY} ray-operator/controllers/ray/rayjob_controller.go:40, 279-293, 1062-1181, 1263-1286, 634-662, 716-740; "
            "common/job.go:89-212; kuberay issues #4285, #4921",
            "https://github.com/ray-project/kuberay/blob/feeaf72facab4881ba2b179248bb67315634e229/ray-operator/controllers/ray/rayjob_controller.go",
        ),
    ),
    KubeFact(
        "submitter-token",
        "the operator sets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the cluster's Secret on the submitter's first container, "
        "in K8sJobMode and SidecarMode alike (configureSubmitterContainer -> SetContainerTokenAuthEnvVars)",
        _src(
            f"{KUBERAY} rayjob_controller.go:657-659, common/pod.go:386-426",
            "https://github.com/ray-project/kuberay/blob/feeaf72facab4881ba2b179248bb67315634e229/ray-operator/controllers/ray/common/pod.go",
        ),
    ),
    KubeFact(
        "suspend",
        "a suspended RayJob (Kueue's eviction sets spec.suspend) goes Suspending: KubeRay deletes its RayCluster and submitter Job "
        "without stopping the Ray job, clears jobId and rayClusterName, then Suspended; resumed, it starts over as New with a new "
        "cluster and job id, and the entrypoint runs from scratch",
        _src(
            f"{KUBERAY} rayjob_controller.go:366-419, 887-917",
            "https://github.com/ray-project/kuberay/blob/feeaf72facab4881ba2b179248bb67315634e229/ray-operator/controllers/ray/rayjob_controller.go",
        ),
    ),
    KubeFact(
        "kueue-podsets",
        "a RayJob's PodSets are `head` (count 1; SidecarMode adds the submitter container's 500m / 200Mi to it), each worker group "
        "(its name lowercased, count replicas x numOfHosts), and `submitter` in K8sJobMode (the submitterPodTemplate as it is)",
        _src(
            f"{KUEUE} pkg/controller/jobs/rayjob/rayjob_controller.go:133-154, 249-332; pkg/controller/jobs/raycluster/common.go:64-128",
            "https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobs/rayjob/rayjob_controller.go",
        ),
    ),
    KubeFact(
        "kueue-flavor-fit",
        "flavors are tried in the ClusterQueue's order; a flavor's nodeTaints must be tolerated by the pod's tolerations plus the "
        "flavor's own (so a flavor's tolerations cancel its taints); its nodeLabels are matched against the pod's nodeSelector "
        "and required affinity for the flavor's own label keys only; a PodSet whose total exceeds a flavor's quota never fits it",
        _src(
            f"{KUEUE} pkg/scheduler/flavorassigner/flavorassigner.go:1061-1206, 1224-1254, 1278-1322, 1330-1380",
            "https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/flavorassigner/flavorassigner.go",
        ),
    ),
    KubeFact(
        "kueue-priority",
        "`kueue.x-k8s.io/priority-class` names a WorkloadPriorityClass (value: int32); a name with no class leaves the job "
        "suspended with no Workload; withinClusterQueue LowerPriority preempts only workloads of lower priority",
        _src(
            f"{KUEUE} pkg/controller/jobframework/reconciler.go:1716-1724, pkg/util/priority/priority.go:108-114, "
            "pkg/scheduler/preemption/common/preemption_policy.go:32-50",
            "https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/preemption/common/preemption_policy.go",
        ),
    ),
    KubeFact(
        "kueue-provreq",
        "for a ProvisioningRequest Kueue takes the PodSets that request a managed resource, each template with the assigned "
        "flavor's nodeLabels as nodeSelector and the flavor's tolerations added (the pod's own kept), and passes every "
        "`provreq.kueue.x-k8s.io/` annotation of the job as a parameter",
        _src(
            f"{KUEUE} pkg/controller/admissionchecks/provisioning/controller.go:302-348, 395-433, 499-537; provisioning.go:123-132; "
            "pkg/podset/podset.go:78-147",
            "https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/admissionchecks/provisioning/controller.go",
        ),
    ),
    KubeFact(
        "gke-tpu-taint",
        "TPU slice nodes carry the google.com/tpu taint (value `present`, effect NoSchedule in Google's samples); GKE adds the "
        "toleration to Pods that request TPUs when they are created, so a template Kueue reads has it only when written in",
        _src(
            'GKE "About TPUs in GKE" (last updated 2026-04-08); cluster-toolkit tpu-dws-queues.yaml.tftpl (a879901); '
            "kuberay#1914 (Kueue reads the template before tolerations are applied)",
            "https://cloud.google.com/kubernetes-engine/docs/concepts/tpus",
        ),
    ),
    KubeFact(
        "dws-tolerations",
        "a RayJob on queued-provisioning TPU nodes tolerates google.com/tpu and cloud.google.com/gke-queued in its worker template "
        "(GKE's tutorial; cluster-toolkit's TPU7x and v6e READMEs: 'Tolerations (Mandatory)')",
        _src(
            'GKE tutorial "Optimize AI training on TPUs with DWS and Kueue" (updated 2026-04-10); cluster-toolkit '
            "examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-tpu-7x/README.md:172-217 (1047080)",
            "https://cloud.google.com/kubernetes-engine/docs/tutorials/ray-kueue-dws",
        ),
    ),
    KubeFact(
        "dws-one-podset",
        "GKE's queued provisioning takes one PodSet per ProvisioningRequest ('the queued provisioning feature currently supports "
        "only single PodSet per request', ray#57839, #59070); the nodes of a request are 'scheduled atomically in one zone', and no "
        "source shows one request making several multi-host TPU slices (node pools)",
        _src(
            'GKE "Run a large-scale workload with flex-start with queued provisioning" (updated 2026-04-08); ray-project/ray #57839, #59070',
            "https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest",
        ),
    ),
    KubeFact(
        "dws-max-run",
        "a ProvisioningRequest's maxRunDurationSeconds is at most the default of seven days (604800 s) and cannot change after "
        "creation; cluster-toolkit's TPU blueprints mark the annotation required",
        _src(
            'GKE "Run a large-scale workload with flex-start with queued provisioning" (updated 2026-04-08); cluster-toolkit '
            "gke-tpu-7x/README.md:172-180",
            "https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest",
        ),
    ),
    KubeFact(
        "webhook-affinity",
        "the TPU webhook injects label replicaIndex=<group>-<replica> and a required podAffinity on it with topologyKey "
        "cloud.google.com/gke-nodepool; webhooks before v1.2.5 match it in the pod's namespace with no ray.io/cluster term, "
        "newer ones add ray.io/cluster and anti-affinity; the add-on's webhook version is not published",
        _src(
            f"GoogleCloudPlatform/ai-on-gke ray-on-gke/tpu/kuberay-tpu-webhook/main.go:292-333 (2561974); {WEBHOOK} main.go:331-437 (ef658db)",
            "https://github.com/ai-on-gke/kuberay-tpu-webhook/blob/ef658db45757e88abc584b0d17fbab930b45316f/main.go",
        ),
    ),
    KubeFact(
        "webhook-headless-name",
        "the webhook sets each multi-host pod's hostname <group>-<replica>-<worker> and subdomain <cluster>-headless passed through "
        "KubeRay's CheckName (longer than 50 characters: cut from the front), while KubeRay names the Service <cluster>-headless "
        "uncut; a RayJob's cluster is <rayjob>-<5 random>, so a name over 35 characters leaves the hosts' DNS names unresolvable",
        _src(
            f"{WEBHOOK} main.go:264-285, 846-857 (ef658db); {KUBERAY} common/service.go:299-327, utils/util.go:221-243, 368-371",
            "https://github.com/ai-on-gke/kuberay-tpu-webhook/blob/ef658db45757e88abc584b0d17fbab930b45316f/main.go",
        ),
    ),
)
KUBE_FACTS = {f.key: f for f in FACTS}

DWS_MAX_RUN_S = 7 * 24 * 3600  # "dws-max-run"
MAX_MULTI_HOST_RAYJOB_NAME = 50 - len("-xxxxx") - len("-headless")  # "webhook-headless-name": 35


def cite(key: str) -> str:
    """Where `key`'s fact comes from, for an error line that states it."""
    source = KUBE_FACTS[key].source
    return f"source: {source.title}, read {source.read}"
