"""The RayCluster: derived from the config and the catalog, valid against the KubeRay CRDs
strictly, and obeying the rule the Ray TPU webhook enforces."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from infra.catalog import topology_chips
from infra.config import environment_names, load_environment, parse_environment
from infra.manifests.raycluster import manifests, ray_cluster
from tests.kuberay_schema import errors


def worker_groups(env_name: str) -> list[dict]:
    return ray_cluster(load_environment(env_name))["spec"]["workerGroupSpecs"]


@pytest.mark.parametrize("env_name", environment_names())
def test_raycluster_validates_strictly_against_crd(crds, env_name):
    assert errors(crds, ray_cluster(load_environment(env_name))) == []


def test_strict_validation_catches_unknown_and_mistyped_fields(crds):
    manifest = ray_cluster(load_environment("dev"))
    typo = copy.deepcopy(manifest)
    typo["spec"]["workerGroupSpecs"][0]["numOfHost"] = 4
    assert any("numOfHost" in e for e in errors(crds, typo))
    wrong_type = copy.deepcopy(manifest)
    wrong_type["spec"]["workerGroupSpecs"][0]["replicas"] = "one"
    assert any("replicas" in e for e in errors(crds, wrong_type))


@pytest.mark.parametrize("env_name", environment_names())
def test_num_of_hosts_is_what_the_tpu_webhook_demands(env_name):
    for group in worker_groups(env_name):
        pod = group["template"]["spec"]
        (container,) = pod["containers"]
        tpu_per_pod = int(container["resources"]["limits"]["google.com/tpu"])
        chips = topology_chips(pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"])
        assert group["numOfHosts"] == max(chips // tpu_per_pod, 1)
        assert container["resources"]["requests"]["google.com/tpu"] == container["resources"]["limits"]["google.com/tpu"]


def test_dev_worker_group_is_one_v6e_4x4_slice():
    (group,) = worker_groups("dev")
    assert (group["numOfHosts"], group["replicas"], group["minReplicas"], group["maxReplicas"]) == (4, 1, 0, 1)
    pod = group["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
        "ray-tpu-gke/slice-group": "v6e-4x4",  # its own group's pools only
    }
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["google.com/tpu"] == "4"
    assert container["image"] == "rayproject/ray:2.60.0-py312-tpu"  # JAX for TPU in the image
    assert {"containerPort": 8081, "name": "mxla"} in container["ports"]
    assert pod["serviceAccountName"] == "ray"


def test_prod_groups_carry_slices_and_capacity():
    groups = {g["groupName"]: g for g in worker_groups("prod")}
    multislice = groups["v6e-multislice"]
    assert (multislice["replicas"], multislice["numOfHosts"]) == (2, 4)
    # Standard: the pools carry spot and the reservation; pods select their group's pools. The
    # reservation labels are documented for nodes GKE makes from the pod spec (Autopilot), not for
    # Standard pools (GKE "Consume reserved zonal resources"; xpk selects them only with NAP).
    assert multislice["template"]["spec"]["nodeSelector"]["ray-tpu-gke/slice-group"] == "v6e-multislice"
    ironwood = groups["ironwood"]["template"]["spec"]["nodeSelector"]
    assert ironwood["cloud.google.com/gke-tpu-accelerator"] == "tpu7x"
    assert "cloud.google.com/reservation-affinity" not in ironwood and ironwood["ray-tpu-gke/slice-group"] == "ironwood"
    v5e = groups["v5e-serving"]
    assert v5e["numOfHosts"] == 1 and v5e["template"]["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] == "8"


def test_head_runs_on_cpu_pool_non_root_and_dashboard_stays_inside():
    head = ray_cluster(load_environment("dev"))["spec"]["headGroupSpec"]
    pod = head["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert head["serviceType"] == "ClusterIP"
    assert head["rayStartParams"]["num-cpus"] == "0"


def test_autopilot_pods_carry_the_whole_request():
    (group,) = worker_groups("autopilot")
    assert group["template"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
        "topology.kubernetes.io/zone": "us-east5-b",
        "cloud.google.com/gke-spot": "true",
    }


def test_default_requests_fit_every_machine():
    # Derived from the machine's allocatable (GKE "Plan node sizes"), so v5e's small hosts fit too.
    # By hand: ct5lp-hightpu-4t has 192 GiB, the kubelet reports 97% = 186.24 GiB; GKE keeps 1 + 0.8 +
    # 0.8 + 6.72 + 2% of 58.24 = 10.48 GiB and 100 MiB for eviction: 175.66 GiB allocatable, 90% =
    # 158.1 -> 158Gi; CPU 112 - 0.35 = 111.65, 90% -> 100. ct5lp-hightpu-1t: 48 GiB -> 46.56 - 4.43 -
    # 0.10 = 42.03, 90% -> 37Gi; 23.87 cores, 90% -> 21. (The old default, 24 CPU / 200G, fit neither.)
    for gen, topology, machine, cpu, memory in [
        ("v5e", "1x1", "ct5lp-hightpu-1t", "21", "37Gi"),
        ("v5e", "4x4", "ct5lp-hightpu-4t", "100", "158Gi"),
    ]:
        data = {
            "name": "t",
            "project": "my-gcp-project",
            "region": "us-west4",
            "zone": "us-west4-a",
            "cluster_name": "t",
            "slice_groups": [{"name": "g", "generation": gen, "topology": topology}],
        }
        (group,) = ray_cluster(parse_environment(data))["spec"]["workerGroupSpecs"]
        requests = group["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert (requests["cpu"], requests["memory"]) == (cpu, memory), machine


def test_autopilot_head_has_no_pool_selector():
    head = ray_cluster(load_environment("autopilot"))["spec"]["headGroupSpec"]
    assert "nodeSelector" not in head["template"]["spec"]


def test_service_account_is_bound_for_workload_identity():
    docs = manifests(load_environment("dev"))
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == "ray-tpu-dev-ray@my-gcp-project.iam.gserviceaccount.com"
    assert [d["kind"] for d in docs] == ["ServiceAccount", "RayCluster", "NetworkPolicy"]


def test_manifests_cli_prints_applyable_yaml(crds):
    proc = subprocess.run([sys.executable, "-m", "infra", "manifests", "--env", "dev"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    # dev serves an LLM; each Ray cluster comes with its NetworkPolicy
    assert [d["kind"] for d in docs] == ["ServiceAccount", "RayCluster", "NetworkPolicy", "RayService", "NetworkPolicy"]
    assert errors(crds, docs[1]) == [] and errors(crds, docs[3]) == []
    assert "&id" not in proc.stdout  # no YAML anchors


def test_manifests_cli_needs_no_cdktf():
    code = "import sys, infra.__main__ as m; m.main(['manifests']); assert not any(k.startswith(('cdktf', 'jsii')) for k in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("env_name", environment_names())
def test_no_secrets_and_no_public_dashboard(env_name):
    docs = manifests(load_environment(env_name))
    assert all(d["kind"] not in ("Secret", "Ingress", "Service") for d in docs)
    head = next(d for d in docs if d["kind"] == "RayCluster")["spec"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    text = yaml.safe_dump_all(docs)
    for marker in ("private_key", "BEGIN PRIVATE", "token:", "password"):
        assert marker not in text


@pytest.mark.parametrize("env_name", environment_names())
def test_applied_together_no_worker_group_waits_for_a_slice_another_holds(env_name):
    # What `make apply-manifests` applies: every worker group of every Ray cluster printed, and the
    # slices they may hold at most, per slice group (the pools' label they select).
    proc = subprocess.run([sys.executable, "-m", "infra", "manifests", "--env", env_name], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    wanted: dict[str, int] = {}
    names = []
    for doc in yaml.safe_load_all(proc.stdout):
        spec = doc["spec"]["rayClusterConfig"] if doc["kind"] == "RayService" else doc["spec"] if doc["kind"] == "RayCluster" else None
        for group in (spec or {}).get("workerGroupSpecs", []):
            names.append(group["groupName"])
            slice_group = group["template"]["metadata"]["labels"]["ray-tpu-gke/slice-group"]
            wanted[slice_group] = wanted.get(slice_group, 0) + group["maxReplicas"]
    env = load_environment(env_name)
    for name, slices in wanted.items():
        assert slices <= env.slice_group(name).slices, f"{env_name}: {name} is promised {slices} slices, has {env.slice_group(name).slices}"
    # The Ray TPU webhook pairs a multi-host replica's pods by worker group name: never one name twice.
    assert len(names) == len(set(names)), names
