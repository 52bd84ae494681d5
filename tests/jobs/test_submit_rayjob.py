"""`python -m jobs.submit JOB --env ENV --print-rayjob`: the RayJob (and its NetworkPolicy) that a job
becomes, read as users get it: printed, validated strictly against the KubeRay CRD, checked by
KubeRay's and Kueue's own rules (infra.manifests.checks) and admitted by Kueue's ported arithmetic
(infra.manifests.kueue_admission) against the Kueue objects printed for the same environment, for
every slice group that leaves slices to RayJobs in every shipped environment and team config
(tests/infra/sweep.py); and every refusal one line, exit 2, nothing printed."""

from __future__ import annotations

import argparse
import copy
import shlex
import subprocess
import sys

import pytest
import yaml

from infra import quantity, rules
from infra.config import environment_names, load_environment
from infra.kube_facts import DWS_MAX_RUN_S
from infra.manifests import checks
from infra.manifests.kueue import kueue_manifests
from infra.manifests.kueue_admission import never_admitted
from jobs import REPO_ROOT as REPO
from jobs.submit import rayjob_docs
from tests.infra.sweep import team_environments
from tests.kuberay_schema import errors

OURS = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32
SHARED_CRDS = REPO.parent / "shared" / "kuberay" / "crds"


def print_rayjob(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.submit", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def request(job: str, group: str | None, *job_args: str, **flags) -> argparse.Namespace:
    defaults = dict(name=None, active_deadline=7200.0, pre_running_deadline=1800.0, ttl=60.0, env_var=[], priority=None, kueue_objects=None)
    return argparse.Namespace(job=job, job_args=list(job_args), slice_group=group, **{**defaults, **flags})


@pytest.fixture(scope="module")
def environments(tmp_path_factory) -> dict[str, object]:
    """Every shipped environment, and the team configs (tests/infra/sweep.py)."""
    directory = tmp_path_factory.mktemp("rayjob-envs")
    out: dict[str, object] = {name: load_environment(name, tpu_image=OURS) for name in environment_names()}
    for name, data in team_environments().items():
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        out[name] = load_environment(path, tpu_image=OURS)
    return out


def batch_for(group) -> str:
    devices = group.shape.chips * group.shape.generation.jax_devices_per_chip
    return str(devices * max(1, 64 // devices))  # train's batch is a multiple of the slice's devices


def test_every_rayjob_group_of_every_environment_takes_a_valid_admissible_rayjob(environments):
    if not SHARED_CRDS.is_dir():
        pytest.skip("../shared/kuberay/crds is not here")
    total = 0
    for name, env in environments.items():
        queues = kueue_manifests(env)
        for group in (g for g in env.slice_groups if g.rayjob_slices):
            for job, extra in (("healthcheck", ()), ("train", ("--steps", "10", "--batch-size", batch_for(group)))):
                where = f"{name}/{group.name}/{job}"
                policy, rayjob = rayjob_docs(env, request(job, group.name, *extra))
                assert errors(SHARED_CRDS, rayjob) == [], where
                assert checks.kuberay_rayjob(rayjob) == [] and checks.kueue_rayjob(rayjob) == [], where
                assert checks.tpu_webhook_names(rayjob) == [], where
                if env.kueue is not None:
                    assert never_admitted(rayjob, queues) is None, where
                assert policy["kind"] == "NetworkPolicy" and policy["spec"]["podSelector"]["matchLabels"] == {
                    "ray-tpu-gke/ray-cluster": rayjob["metadata"]["name"]
                }, where
                (worker,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
                pod = worker["template"]["spec"]
                (container,) = pod["containers"]
                requests = container["resources"]["requests"]
                # The group's own pools (Standard), its machine's chips and what fits the machine.
                if env.mode == "standard":
                    assert pod["nodeSelector"]["ray-tpu-gke/slice-group"] == group.name, where
                assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == group.topology, where
                assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"], where
                assert requests["google.com/tpu"] == str(group.shape.chips_per_host), where
                assert rules.requests_fit(group.shape.machine_type, requests["cpu"], requests["memory"]) == {}, where
                assert (
                    worker["numOfHosts"] == group.shape.hosts and worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == 1
                )
                assert worker["groupName"] == rayjob["metadata"]["name"], where  # the job's own, never the slice group's
                # The entrypoint is the job's own command, shaped like the group; the submitter runs it.
                argv = shlex.split(rayjob["spec"]["entrypoint"])
                assert argv[:3] == ["python", "-m", f"jobs.{job}"], where
                assert argv[argv.index("--topology") + 1] == group.topology, where
                submitter = rayjob["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
                assert submitter["command"] == ["python", "-m", "jobs.client.submitter"], where
                assert submitter["args"][:2] == ["--entrypoint", rayjob["spec"]["entrypoint"]], where
                images = {
                    c["image"] for c in [*rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"], container]
                }
                assert images == {OURS} and submitter["image"] == OURS, where
                total += 1
    assert total == 2 * sum(1 for env in environments.values() for g in env.slice_groups if g.rayjob_slices) >= 14


def test_a_quota_one_byte_short_is_never_admitted_and_print_rayjob_says_so(environments, tmp_path):
    env = environments["team-rayjobs"]  # 600G per single-host pod: decimal units, as teams write them
    _, rayjob = rayjob_docs(env, request("healthcheck", "hosts"))
    queues = kueue_manifests(env)
    assert never_admitted(rayjob, queues) is None
    short = copy.deepcopy(queues)
    (queue,) = [d for d in short if d["kind"] == "ClusterQueue"]
    flavor = next(f for f in queue["spec"]["resourceGroups"][0]["flavors"] if f["name"].endswith("-hosts"))
    memory = next(r for r in flavor["resources"] if r["name"] == "memory")
    assert memory["nominalQuota"] == "1200G"  # two slices' pods of 600G, exactly
    memory["nominalQuota"] = quantity.exact(quantity.parse("600G") - 1)  # one byte short of this job's one pod
    why = never_admitted(rayjob, short)
    assert why is not None and "insufficient quota for memory in flavor team-rayjobs-hosts" in why
    assert "current podset request (585937500Ki) > maximum capacity (599999999999)" in why  # Kueue's own form of 600G and the quota
    # The same against a file of the cluster's objects, as kubectl prints them (a List).
    objects = tmp_path / "queues.yaml"
    objects.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": short}))
    env_file = tmp_path / "team-rayjobs.yaml"
    env_file.write_text(yaml.safe_dump(team_environments()["team-rayjobs"]))
    args = ["healthcheck", "--env", str(env_file), "--tpu-image", OURS, "--print-rayjob", "--slice-group", "hosts"]
    assert print_rayjob(*args).returncode == 0
    proc = print_rayjob(*args, "--kueue-objects", str(objects))
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: the RayJob would queue forever: ClusterQueue team-rayjobs-tpu could never admit it: ")
    assert "memory" in proc.stderr and "(585937500Ki)" in proc.stderr and "(599999999999)" in proc.stderr


def test_prods_v5e_job_fits_its_exact_quota_where_the_rounded_one_never_admitted_it():
    env = load_environment("prod", tpu_image=OURS)
    _, rayjob = rayjob_docs(env, request("healthcheck", "v5e-serving"))
    queues = kueue_manifests(env)
    assert never_admitted(rayjob, queues) is None
    rounded = copy.deepcopy(queues)  # what the old quota printed: whole GiB, rounded down
    for flavor in next(d for d in rounded if d["kind"] == "ClusterQueue")["spec"]["resourceGroups"][0]["flavors"]:
        for r in flavor["resources"]:
            if r["name"] == "memory":
                r["nominalQuota"] = quantity.gib_at_most(quantity.parse(r["nominalQuota"]))
    why = never_admitted(rayjob, rounded)
    assert why and "insufficient quota for memory in flavor ray-tpu-prod-v5e-serving" in why and "> maximum capacity (279Gi)" in why


def test_two_jobs_on_one_group_get_their_own_worker_groups_and_runs_and_a_name_resumes_its_run(environments):
    env = environments["team-rayjobs"]
    jobs = [rayjob_docs(env, request("train", "dws", "--steps", "10", "--batch-size", "64"))[-1] for _ in range(2)]
    groups = [j["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"] for j in jobs]
    runs = [shlex.split(j["spec"]["entrypoint"])[-1] for j in jobs]
    assert groups[0] != groups[1] and runs[0] != runs[1]
    assert [shlex.split(j["spec"]["entrypoint"])[-2] for j in jobs] == ["--name", "--name"]
    assert runs == [j["metadata"]["name"] for j in jobs]  # each job's run is named after its RayJob
    again = [rayjob_docs(env, request("train", "dws", "--steps", "10", "--batch-size", "64", name="nightly"))[-1] for _ in range(2)]
    assert {shlex.split(j["spec"]["entrypoint"])[-1] for j in again} == {"nightly"}  # the same --name: the same run
    theirs = rayjob_docs(env, request("train", "dws", "--steps", "10", "--batch-size", "64", "--name=mine", name="nightly"))[-1]
    argv = shlex.split(theirs["spec"]["entrypoint"])
    assert "--name=mine" in argv and argv.count("--name") == 0  # the user's run name wins
    healthcheck = rayjob_docs(env, request("healthcheck", "dws"))[-1]
    assert "--name" not in shlex.split(healthcheck["spec"]["entrypoint"])  # a job without named runs gets none


def test_a_dws_job_tolerates_the_tpu_nodes_and_bounds_its_request(environments):
    env = environments["team-rayjobs"]
    _, rayjob = rayjob_docs(env, request("train", "dws", "--steps", "10", "--batch-size", "64", active_deadline=7200.0))
    pod = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]["cloud.google.com/gke-queued"] == "true"
    seconds = int(rayjob["metadata"]["annotations"]["provreq.kueue.x-k8s.io/maxRunDurationSeconds"])
    assert rayjob["spec"]["activeDeadlineSeconds"] <= seconds <= DWS_MAX_RUN_S == 7 * 86400
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-jobs"
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "batch"  # the config's default_priority
    assert rayjob["spec"]["submissionMode"] == "K8sJobMode" and rayjob["spec"]["ttlSecondsAfterFinished"] == 60
    _, other = rayjob_docs(env, request("healthcheck", "hosts", priority="deadline"))
    assert other["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "deadline"
    assert "annotations" not in other["metadata"]  # not a queued-provisioning group
    # Without Kueue, no queue or priority label.
    _, plain = rayjob_docs(environments["team-queued"], request("healthcheck", "trillium"))
    assert plain["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_print_rayjob_prints_what_kubectl_applies():
    proc = print_rayjob("train", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--name", "t-run", "--", "--steps", "20")
    assert proc.returncode == 0, proc.stderr
    policy, rayjob = yaml.safe_load_all(proc.stdout)
    assert (policy["kind"], rayjob["kind"], rayjob["metadata"]["name"]) == ("NetworkPolicy", "RayJob", "t-run")
    assert shlex.split(rayjob["spec"]["entrypoint"])[-4:] == ["--steps", "20", "--name", "t-run"]
    assert "runtimeEnvYAML" not in rayjob["spec"]  # the project's image carries the jobs' requirements: no pip
    template = rayjob["spec"]["submitterPodTemplate"]
    assert template["metadata"]["labels"]["ray-tpu-gke/ray-cluster"] == "t-run"  # its NetworkPolicy lets it reach the head
    assert template["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--", "--bogus"], "unrecognized arguments: --bogus"),
        (
            ["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--slice-group", "nope"],
            "--slice-group: no slice group 'nope'",
        ),
        (
            ["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--slice-group", "ironwood"],
            "--slice-group: slice group ironwood leaves no slices to RayJobs (slice_groups[1].rayjob_slices is 0 in environment prod); "
            "groups that do: v5e-serving, ironwood-queued",
        ),
        (
            ["healthcheck", "--env", "dev", "--tpu-image", OURS, "--print-rayjob"],
            "--slice-group: environment dev leaves no slices to RayJobs (every group's rayjob_slices is 0)",
        ),
        (["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--name", "x" * 48], "--name: RayJob name"),
        (["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--name", "Bad_Name"], "not a DNS-1035 label"),
        (
            ["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--slice-group", "ironwood-queued", "--name", "n" * 36],
            "--name: '" + "n" * 36 + "' is 36 characters; a RayJob on a multi-host slice takes at most 35",
        ),
        (
            ["healthcheck", "--env", "prod", "--print-rayjob"],
            "pass --tpu-image <registry>/ray-tpu-gke/ray-tpu:<tag> or <registry>/ray-tpu-gke/ray-tpu@sha256:<digest>",
        ),
        (
            ["healthcheck", "--env", "prod", "--tpu-image", "us-docker.pkg.dev/p/other/image:1", "--print-rayjob"],
            "is not it: pass --tpu-image <registry>/ray-tpu-gke/ray-tpu:<tag>",
        ),
        (
            [
                "healthcheck",
                "--env",
                "prod",
                "--tpu-image",
                OURS,
                "--print-rayjob",
                "--slice-group",
                "ironwood-queued",
                "--",
                "--topology",
                "2x2x1",
            ],
            "--topology: the job asks for",
        ),
        (
            ["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--priority", "urgent"],
            "--priority: 'urgent' is not a priority of environment prod; valid: low (100), normal (1000), high (10000)",
        ),
        (
            [
                "healthcheck",
                "--env",
                "prod",
                "--tpu-image",
                OURS,
                "--print-rayjob",
                "--slice-group",
                "ironwood-queued",
                "--",
                "--slices",
                "2",
            ],
            "--slices: 2 slices of queued-provisioning group ironwood-queued in one RayJob; GKE provisions one PodSet per ProvisioningRequest",
        ),
        (
            [
                "healthcheck",
                "--env",
                "prod",
                "--tpu-image",
                OURS,
                "--print-rayjob",
                "--slice-group",
                "ironwood-queued",
                "--active-deadline",
                "700000",
            ],
            "--active-deadline: 700000 s is longer than a queued-provisioning node may run (604800 s, 7 days",
        ),
        (
            ["healthcheck", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--kueue-objects", "/nonexistent.yaml"],
            "--kueue-objects: cannot read",
        ),
    ],
)
def test_each_refusal_is_one_line_exit_2_and_prints_nothing(args, needle):
    proc = print_rayjob(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_queued_provisioning_without_kueue_is_one_line_naming_the_field(tmp_path):
    data = team_environments()["team-queued"]
    data.pop("kueue")
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = print_rayjob("train", "--env", str(path), "--tpu-image", OURS, "--print-rayjob")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "slice_groups[0].capacity: queued-provisioning pools scale up only for ProvisioningRequests" in proc.stderr
    assert "Traceback" not in proc.stderr
