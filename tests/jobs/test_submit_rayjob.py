"""`python -m jobs.submit JOB --env ENV --print-rayjob`: the RayJob (and its NetworkPolicy) that a job
becomes, read as users get it: printed, validated strictly against the KubeRay CRD, checked by
KubeRay's and Kueue's own rules (infra.manifests.checks), for every slice group of every shipped
environment and of the team configs (tests/infra/sweep.py; the shape sweep's thousands of groups
are the same builders over more shapes, which test_sweep.py already covers for the RayCluster);
and every refusal one line, exit 2, nothing printed."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

import pytest
import yaml

from infra import rules
from infra.config import environment_names, load_environment
from infra.manifests import checks
from jobs import REPO_ROOT as REPO
from jobs.submit import rayjob_docs
from tests.infra.sweep import team_environments
from tests.kuberay_schema import errors

OURS = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32
SHARED_CRDS = REPO.parent / "shared" / "kuberay" / "crds"


def print_rayjob(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.submit", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def request(job: str, group: str, *job_args: str) -> argparse.Namespace:
    return argparse.Namespace(
        job=job,
        job_args=list(job_args),
        slice_group=group,
        name=None,
        active_deadline=7200.0,
        pre_running_deadline=1800.0,
        ttl=600.0,
        env_var=[],
    )


def environments(tmp_path_factory) -> dict[str, object]:
    """Every shipped environment, and the team configs (tests/infra/sweep.py)."""
    directory = tmp_path_factory.mktemp("rayjob-envs")
    out: dict[str, object] = {name: load_environment(name, tpu_image=OURS) for name in environment_names()}
    for name, data in team_environments().items():
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        out[name] = load_environment(path, tpu_image=OURS)
    return out


def test_every_slice_group_of_every_environment_takes_a_valid_rayjob(tmp_path_factory):
    if not SHARED_CRDS.is_dir():
        pytest.skip("../shared/kuberay/crds is not here")
    total = 0
    for name, env in environments(tmp_path_factory).items():
        for group in env.slice_groups:
            devices = group.shape.chips * group.shape.generation.jax_devices_per_chip
            batch = str(devices * max(1, 64 // devices))  # train's batch is a multiple of the slice's devices
            for job, extra in (("healthcheck", ()), ("train", ("--steps", "10", "--batch-size", batch))):
                where = f"{name}/{group.name}/{job}"
                policy, rayjob = rayjob_docs(env, request(job, group.name, *extra))
                assert errors(SHARED_CRDS, rayjob) == [], where
                assert checks.kuberay_rayjob(rayjob) == [] and checks.kueue_rayjob(rayjob) == [], where
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
                assert requests["google.com/tpu"] == str(group.shape.chips_per_host), where
                assert rules.requests_fit(group.shape.machine_type, requests["cpu"], requests["memory"]) == {}, where
                assert (
                    worker["numOfHosts"] == group.shape.hosts and worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == 1
                )
                # The entrypoint is the job's own command, shaped like the group.
                argv = shlex.split(rayjob["spec"]["entrypoint"])
                assert argv[:3] == ["python", "-m", f"jobs.{job}"], where
                assert argv[argv.index("--topology") + 1] == group.topology, where
                assert {
                    c["image"] for c in [*rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"], container]
                } == {OURS}, where
                total += 1
    assert total == 2 * sum(len(env.slice_groups) for env in environments(tmp_path_factory).values())


def test_a_queued_provisioning_rayjob_is_queued_and_tolerates_the_queued_nodes():
    env = load_environment("prod", tpu_image=OURS)
    _, rayjob = rayjob_docs(env, request("train", "ironwood-queued", "--steps", "10"))
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "ray-jobs"
    (worker,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    pod = worker["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-queued"] == "true"
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert rayjob["spec"]["submissionMode"] == "SidecarMode" and rayjob["spec"]["backoffLimit"] == 0
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True and "enableInTreeAutoscaling" not in rayjob["spec"]["rayClusterSpec"]
    # Without Kueue (dev), no queue label.
    _, plain = rayjob_docs(load_environment("dev", tpu_image=OURS), request("healthcheck", "v6e-4x4"))
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


def test_print_rayjob_prints_what_kubectl_applies():
    proc = print_rayjob("train", "--env", "dev", "--tpu-image", OURS, "--print-rayjob", "--name", "t-run", "--", "--steps", "20")
    assert proc.returncode == 0, proc.stderr
    policy, rayjob = yaml.safe_load_all(proc.stdout)
    assert (policy["kind"], rayjob["kind"], rayjob["metadata"]["name"]) == ("NetworkPolicy", "RayJob", "t-run")
    assert shlex.split(rayjob["spec"]["entrypoint"])[-2:] == ["--steps", "20"]
    assert "runtimeEnvYAML" not in rayjob["spec"]  # the project's image carries the jobs' requirements: no pip


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["healthcheck", "--env", "dev", "--tpu-image", OURS, "--print-rayjob", "--", "--bogus"], "unrecognized arguments: --bogus"),
        (
            ["healthcheck", "--env", "dev", "--tpu-image", OURS, "--print-rayjob", "--slice-group", "nope"],
            "--slice-group: no slice group 'nope'",
        ),
        (["healthcheck", "--env", "dev", "--tpu-image", OURS, "--print-rayjob", "--name", "x" * 48], "--name: RayJob name"),
        (["healthcheck", "--env", "dev", "--tpu-image", OURS, "--print-rayjob", "--name", "Bad_Name"], "not a DNS-1035 label"),
        (["healthcheck", "--env", "dev", "--print-rayjob"], "a RayJob runs the code in the project's TPU image"),
        (
            ["healthcheck", "--env", "dev", "--tpu-image", OURS, "--print-rayjob", "--slice-group", "v6e-2x2", "--", "--topology", "4x4"],
            "--topology: the job asks for",
        ),
    ],
)
def test_each_refusal_is_one_line_exit_2_and_prints_nothing(args, needle):
    proc = print_rayjob(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert needle in proc.stderr and "Traceback" not in proc.stderr
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
