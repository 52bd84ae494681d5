"""KubeRay's and Kueue's own rules, ported as pure checks (infra.manifests.checks): each holds for
what we print and fails on a copy broken the way its source line refuses."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from infra.config import load_environment
from infra.manifests import checks
from infra.manifests.kueue import cluster_queue, resource_flavors
from infra.manifests.rayjob import RayJobRequest, ray_job

OURS = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32
ENV = load_environment("prod", tpu_image=OURS)
REQUEST = RayJobRequest(
    name="train-0a1b2c3d",
    job="train",
    entrypoint="python -m jobs.train --env prod --generation tpu7x --topology 2x2x2 --slices 1",
    group="ironwood-queued",
    slices=1,
    active_deadline_s=7200,
    pre_running_deadline_s=1800,
    ttl_after_finished_s=600,
    env_vars={"A": "1"},
)
JOB = ray_job(ENV, REQUEST)


def test_what_we_print_holds():
    assert checks.kuberay_rayjob(JOB) == [] and checks.kueue_rayjob(JOB) == []


def broken(change: Callable[[dict], None]) -> dict:
    job = copy.deepcopy(JOB)
    change(job)
    return job


def spec(**fields) -> Callable[[dict], None]:
    return lambda job: job["spec"].update(fields)


def cluster(**fields) -> Callable[[dict], None]:
    return lambda job: job["spec"]["rayClusterSpec"].update(fields)


def worker(**fields) -> Callable[[dict], None]:
    return lambda job: job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(fields)


def head_pod(**fields) -> Callable[[dict], None]:
    return lambda job: job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"].update(fields)


def sidecar(job: dict) -> None:
    """The job in SidecarMode, as KubeRay takes it there: no submitter template or config."""
    job["spec"].update(submissionMode="SidecarMode")
    job["spec"].pop("submitterPodTemplate")
    job["spec"].pop("submitterConfig")


KUBERAY_BREAKS = {
    "validation.go:534": lambda job: job["metadata"].update(name="x" * 48),
    "validation.go:537": lambda job: job["metadata"].update(name="Train_1"),
    "validation.go:547": spec(suspend=True, shutdownAfterJobFinishes=False, ttlSecondsAfterFinished=0),
    "validation.go:551": spec(ttlSecondsAfterFinished=-1),
    "validation.go:753": spec(shutdownAfterJobFinishes=False),
    "validation.go:564": lambda job: job["spec"].pop("rayClusterSpec"),
    "validation.go:592,596": spec(submissionMode="SidecarMode"),  # ours carries a submitterPodTemplate and submitterConfig
    "validation.go:600": lambda job: [sidecar(job), head_pod(restartPolicy="Always")(job)],
    "validation.go:606": cluster(authOptions={"mode": "token", "enableK8sTokenAuth": True}),
    "validation.go:285-297": cluster(rayVersion="2.51.0"),
    "validation.go:125": lambda job: job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("maxReplicas"),
    "validation.go:128-136": worker(minReplicas=2, maxReplicas=1),
    "validation.go:616": spec(runtimeEnvYAML="env_vars: [unclosed"),
    "validation.go:619": spec(activeDeadlineSeconds=0),
    "validation.go:622": spec(preRunningDeadlineSeconds=0),
    "validation.go:625": spec(backoffLimit=-1),
}


@pytest.mark.parametrize("line", sorted(KUBERAY_BREAKS))
def test_each_kuberay_rule_refuses_a_copy_broken_its_way(line):
    problems = checks.kuberay_rayjob(broken(KUBERAY_BREAKS[line]))
    assert any(line in p for p in problems), problems


KUEUE_BREAKS = {
    "rayjob_webhook.go:118": spec(clusterSelector={"ray.io/cluster": "x"}),
    "rayjob_webhook.go:130": lambda job: job["spec"].pop("rayClusterSpec"),
    "rayjob_webhook.go:138": spec(shutdownAfterJobFinishes=False),
    "common.go:302": cluster(enableInTreeAutoscaling=True),
    "common.go:314": lambda job: job["spec"]["rayClusterSpec"]["workerGroupSpecs"].extend(
        [dict(job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0], groupName=f"g{i}") for i in range(17)]
    ),
    "common.go:319": worker(groupName="head"),
    "workload_types.go:282-286": worker(groupName="tpu_group"),
}


@pytest.mark.parametrize("line", sorted(KUEUE_BREAKS))
def test_each_kueue_rayjob_rule_refuses_a_copy_broken_its_way(line):
    problems = checks.kueue_rayjob(broken(KUEUE_BREAKS[line]))
    assert any(line in p for p in problems), problems


def test_the_tpu_webhooks_names_must_be_dns_labels_of_at_most_63_characters():
    assert JOB["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] == 2  # TPU7x 2x2x2: the webhook names its hosts
    assert checks.tpu_webhook_names(JOB) == []
    too_long = broken(worker(groupName="g" * 58))  # + "-" + KubeRay's 5 random characters: 64
    (problem,) = checks.tpu_webhook_names(too_long)
    assert problem.startswith(f"worker group {'g' * 58!r}: its hosts' names such as") and "main.go:846-850" in problem
    assert checks.tpu_webhook_names(broken(worker(groupName="g" * 57))) == []


def test_kueue_leaves_a_rayjob_without_a_queue_to_kuberay():
    unqueued = broken(lambda job: job["metadata"]["labels"].pop("kueue.x-k8s.io/queue-name"))
    assert checks.kueue_rayjob(broken(lambda job: None)) == []
    assert checks.kueue_rayjob(dict(unqueued, spec={**unqueued["spec"], "shutdownAfterJobFinishes": False})) == []


QUEUE = cluster_queue(ENV)
FLAVORS = {f["metadata"]["name"] for f in resource_flavors(ENV)}


def flavor(index: int) -> Callable[[dict], None]:
    return lambda q: q["spec"]["resourceGroups"][0]["flavors"][index]["resources"].reverse()


QUEUE_BREAKS = {
    "clusterqueue_webhook.go:339": flavor(1),
    "clusterqueue_webhook.go:302": lambda q: q["spec"]["resourceGroups"][0]["flavors"].append(q["spec"]["resourceGroups"][0]["flavors"][0]),
    "clusterqueue_webhook.go:359": lambda q: q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(nominalQuota="-1"),
    "clusterqueue_webhook.go:159": lambda q: q["spec"]["admissionChecksStrategy"]["admissionChecks"][0]["onFlavors"].append("nope"),
    "is printed with the ClusterQueue": lambda q: q["spec"]["resourceGroups"][0]["flavors"][0].update(name="missing"),
}


def test_the_printed_cluster_queue_holds():
    assert checks.kueue_cluster_queue(QUEUE, FLAVORS) == []


@pytest.mark.parametrize("needle", sorted(QUEUE_BREAKS))
def test_each_cluster_queue_rule_refuses_a_copy_broken_its_way(needle):
    queue = copy.deepcopy(QUEUE)
    QUEUE_BREAKS[needle](queue)
    problems = checks.kueue_cluster_queue(queue, FLAVORS)
    assert any(needle in p for p in problems), problems
