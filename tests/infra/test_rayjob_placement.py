"""What GKE and the Ray TPU webhook do with the RayJobs `jobs.submit --print-rayjob` prints, on the node
pools the same environment's synthesized stack declares (tests/fake_gke_tpu.py; Kueue's admission
and ProvisioningRequest ported): a queued-provisioning job is provisioned a whole slice and its pods
land on it; a worker template without the `google.com/tpu` toleration is never provisioned; two jobs
on one group take a slice each, which a worker group name shared by both would not."""

from __future__ import annotations

import argparse
import copy
import json

import pytest

from infra.config import load_environment
from infra.manifests.kueue import kueue_manifests
from infra.manifests.kueue_admission import Flavor, assign, pod_sets
from jobs.submit import rayjob_docs
from tests.fake_gke_tpu import provision, provisioning_request, schedule, tpu_pools, webhook_pods

OURS = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32

pytestmark = pytest.mark.synth


def request(job: str, group: str) -> argparse.Namespace:
    """`jobs.submit JOB --slice-group GROUP --print-rayjob`'s flags."""
    flags = dict(name=None, active_deadline=7200.0, pre_running_deadline=1800.0, ttl=60.0, env_var=[], priority=None, kueue_objects=None)
    return argparse.Namespace(
        job=job, job_args=["--steps", "10", "--batch-size", "64"] if job == "train" else [], slice_group=group, **flags
    )


def environment(team_paths):
    (path,) = [p for p in team_paths if p.stem == "team-rayjobs"]
    return load_environment(path, tpu_image=OURS)


def admit_and_provision(rayjob, docs, pools, flavors=None):
    """Kueue's admission (ported), its ProvisioningRequest (ported), GKE's answer (the fake)."""
    queue = next(d for d in docs if d["kind"] == "ClusterQueue")
    flavors = flavors or {d["metadata"]["name"]: Flavor.of(d) for d in docs if d["kind"] == "ResourceFlavor"}
    podsets = pod_sets(rayjob)
    verdict = assign(podsets, queue, flavors)
    assert verdict.fits, verdict.message
    config = next(d for d in docs if d["kind"] == "ProvisioningRequestConfig")
    request_podsets = provisioning_request(podsets, verdict.flavors, flavors, config["spec"]["managedResources"])
    assert [p.name for p in request_podsets] == [
        rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    ]  # the TPU workers alone
    worker_flavor = flavors[verdict.flavors[request_podsets[0].name]["google.com/tpu"]]
    return provision(request_podsets, pools), worker_flavor


def test_a_dws_job_is_provisioned_a_whole_slice_and_lands_on_it(team_stacks, team_paths):
    env = environment(team_paths)
    docs = kueue_manifests(env)
    pools = tpu_pools(team_stacks["team-rayjobs"].json)
    assert {n: (p.hosts, p.queued) for n, p in pools.items() if n.startswith("dws")} == {"dws-0": (4, True), "dws-1": (4, True)}
    _, rayjob = rayjob_docs(env, request("train", "dws"))
    (pool, why), flavor = admit_and_provision(rayjob, docs, pools)
    assert (pool, why) == ("dws-0", "")
    for pod in webhook_pods(rayjob, f"{rayjob['metadata']['name']}-abcde", flavor.node_labels):
        assert schedule(pod, pools) == "dws-0", json.dumps(pod)


def test_a_template_without_the_tpu_toleration_is_never_provisioned(team_stacks, team_paths):
    """As printed before issue 32: the flavors had no taints (so Kueue admitted it), and the worker
    template carried no google.com/tpu toleration, which GKE adds to Pods only, never to the template
    Kueue hands the ProvisioningRequest: GKE never provisioned it."""
    env = environment(team_paths)
    docs = kueue_manifests(env)
    pools = tpu_pools(team_stacks["team-rayjobs"].json)
    _, rayjob = rayjob_docs(env, request("healthcheck", "dws"))
    old = copy.deepcopy(rayjob)
    pod = old["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    pod["tolerations"] = [t for t in pod["tolerations"] if t["key"] != "google.com/tpu"]
    assert (
        "untolerated taint {google.com/tpu present NoSchedule <nil>}"
        in assign(
            pod_sets(old),
            next(d for d in docs if d["kind"] == "ClusterQueue"),
            {d["metadata"]["name"]: Flavor.of(d) for d in docs if d["kind"] == "ResourceFlavor"},
        ).message
    )  # today's flavors refuse it at admission
    untainted = {
        d["metadata"]["name"]: Flavor(d["metadata"]["name"], d["spec"]["nodeLabels"]) for d in docs if d["kind"] == "ResourceFlavor"
    }
    (pool, why), _ = admit_and_provision(old, docs, pools, untainted)
    assert pool is None and "untolerated taint google.com/tpu=present:NoSchedule on pool dws-0" in why
    assert not any(p.provisioned for p in pools.values())


def test_two_jobs_on_one_group_each_get_a_slice_which_one_shared_group_name_strands(team_stacks, team_paths):
    env = environment(team_paths)
    docs = kueue_manifests(env)

    def run(jobs: list[dict]) -> list[list[str | None]]:
        pools = tpu_pools(team_stacks["team-rayjobs"].json)
        placed = []
        for i, job in enumerate(jobs):
            (pool, why), flavor = admit_and_provision(job, docs, pools)
            assert pool == f"dws-{i}", why
            placed.append([schedule(pod, pools) for pod in webhook_pods(job, f"{job['metadata']['name']}-{i}xxxx", flavor.node_labels)])
        return placed

    ours = [rayjob_docs(env, request("healthcheck", "dws"))[-1] for _ in range(2)]
    assert run(ours) == [["dws-0"] * 4, ["dws-1"] * 4]
    shared = copy.deepcopy(ours)  # both groups named after the slice group, as printed before issue 32
    for job in shared:
        job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"] = "dws"
    first, second = run(shared)
    assert first == ["dws-0"] * 4 and second == [None] * 4  # replicaIndex=dws-0 pulls them to the full pool; dws-1 idles
