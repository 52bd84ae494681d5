"""Kueue's objects as `python -m infra manifests` prints them: strictly valid against Kueue v0.19.2's
CRDs (v1beta2), within its ClusterQueue rules (infra.manifests.checks), with quotas derived from
the slices the groups leave to RayJobs; and the config's Kueue rules."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.config import ConfigError, parse_environment
from infra.manifests import checks
from tests.infra.sweep import team_environments
from tests.kuberay_schema import errors

REPO = Path(__file__).resolve().parents[2]
KUEUE_KINDS = {"ResourceFlavor", "ClusterQueue", "LocalQueue", "AdmissionCheck", "ProvisioningRequestConfig", "WorkloadPriorityClass"}


def printed(env: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "infra", "manifests", "--env", env], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


@pytest.fixture(scope="module")
def prod() -> list[dict]:
    return printed("prod")


def kueue_docs(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        if d["kind"] in KUEUE_KINDS:
            out.setdefault(d["kind"], []).append(d)
    return out


def test_every_printed_kueue_object_is_strictly_valid(prod, kueue_crds, tmp_path):
    printed_teams = []
    for team in ("team-queued", "team-rayjobs"):
        path = tmp_path / f"{team}.yaml"
        path.write_text(yaml.safe_dump(team_environments()[team]))
        printed_teams.append(printed(str(path)))
    for docs in (prod, *printed_teams):
        found = kueue_docs(docs)
        assert set(found) == KUEUE_KINDS
        for kind, objects in found.items():
            for obj in objects:
                assert errors(kueue_crds, obj) == [], (kind, obj["metadata"]["name"])
        (queue,) = found["ClusterQueue"]
        assert checks.kueue_cluster_queue(queue, {f["metadata"]["name"] for f in found["ResourceFlavor"]}) == []


def test_no_kueue_section_prints_no_kueue_objects():
    assert kueue_docs(printed("dev")) == {}


def test_quotas_are_the_slices_left_to_rayjobs(prod):
    found = kueue_docs(prod)
    (queue,) = found["ClusterQueue"]
    (group,) = queue["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "google.com/tpu"]
    flavors = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]}
    # The CPU flavor first (Kueue tries flavors in order): a head, no TPU, lands there.
    assert next(iter(flavors)) == "ray-tpu-prod-cpu" and flavors["ray-tpu-prod-cpu"]["google.com/tpu"] == 0
    # prod: v5e-serving leaves 1 slice of 8 chips to RayJobs; ironwood-queued all 2 of its 8-chip slices.
    assert flavors["ray-tpu-prod-v5e-serving"]["google.com/tpu"] == 8
    assert flavors["ray-tpu-prod-ironwood-queued"]["google.com/tpu"] == 16
    assert "ray-tpu-prod-ironwood" not in flavors and "ray-tpu-prod-v6e-multislice" not in flavors  # no RayJob slices
    # A head and a submitter per RayJob slice (3): 3 x (4 CPU + 500m) and 3 x (16Gi + 200Mi), exactly.
    assert (flavors["ray-tpu-prod-cpu"]["cpu"], flavors["ray-tpu-prod-cpu"]["memory"]) == ("13500m", "49752Mi")
    # v5e-serving's pod asks 300G, and the quota holds exactly that (never rounded down to 279Gi).
    assert flavors["ray-tpu-prod-v5e-serving"]["memory"] == "300G" and flavors["ray-tpu-prod-v5e-serving"]["cpu"] == "100"
    assert queue["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    taints = {f["metadata"]["name"]: f["spec"].get("nodeTaints") for f in found["ResourceFlavor"]}
    tpu = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
    assert taints["ray-tpu-prod-cpu"] is None and taints["ray-tpu-prod-v5e-serving"] == [tpu]
    assert taints["ray-tpu-prod-ironwood-queued"] == [tpu, {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}]
    assert not any("tolerations" in f["spec"] for f in found["ResourceFlavor"])  # a flavor's own would cancel its taints
    classes = {c["metadata"]["name"]: c["value"] for c in found["WorkloadPriorityClass"]}
    assert classes == {"low": 100, "normal": 1000, "high": 10000}
    by_name = {f["metadata"]["name"]: f["spec"]["nodeLabels"] for f in found["ResourceFlavor"]}
    assert by_name["ray-tpu-prod-ironwood-queued"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu7x",
        "cloud.google.com/gke-tpu-topology": "2x2x2",
        "ray-tpu-gke/slice-group": "ironwood-queued",
    }
    assert by_name["ray-tpu-prod-cpu"] == {"cloud.google.com/gke-nodepool": "cpu"}
    # The admission check (queued provisioning) applies to the queued-provisioning flavor only.
    assert queue["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": "ray-tpu-prod-dws", "onFlavors": ["ray-tpu-prod-ironwood-queued"]}]
    }
    (config,) = found["ProvisioningRequestConfig"]
    assert config["spec"] == {"provisioningClassName": "queued-provisioning.gke.io", "managedResources": ["google.com/tpu"]}
    (local,) = found["LocalQueue"]
    assert (local["metadata"]["name"], local["metadata"]["namespace"], local["spec"]["clusterQueue"]) == (
        "ray-jobs",
        "default",
        "ray-tpu-prod-tpu",
    )


BASE = team_environments()["team-queued"]


def problems(**changes) -> list[str]:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if key.startswith("group_"):
            data["slice_groups"][0][key[6:]] = value
        elif value is None:
            data.pop(key)
        else:
            data[key] = value
    with pytest.raises(ConfigError) as err:
        parse_environment(data, "q.yaml")
    return err.value.problems


def test_queued_provisioning_needs_kueue_and_every_slice_for_rayjobs():
    (line,) = problems(kueue=None)
    assert line.startswith("slice_groups[0].capacity: queued-provisioning pools scale up only for ProvisioningRequests")
    (line,) = problems(group_rayjob_slices=1)
    assert line.startswith(
        "slice_groups[0].capacity: a queued-provisioning group's slices are provisioned only for RayJobs: set rayjob_slices to 2"
    )
    lines = problems(mode="autopilot")
    assert any(p.startswith("slice_groups[0].capacity: queued-provisioning is for Standard node pools") for p in lines)
    (line,) = problems(group_zone="us-east5-c")
    assert "does not offer v6e on flex-start" in line  # queued provisioning is flex-start capacity


def test_kueue_config_rules():
    (line,) = problems(kueue={"local_queue": "jobs", "priorities": {"batch": 1}})
    assert line == "kueue.default_priority: 'normal' is not one of kueue.priorities; valid: batch"
    (line,) = problems(kueue={"priorities": {"batch": 2**31}, "default_priority": "batch"})
    assert line.startswith("kueue.priorities.batch: ") and "2147483647" in line  # Kueue's value is an int32
    (line,) = problems(kueue={"local_queue": "default"})
    assert line.startswith("kueue.local_queue: a LocalQueue named `default` takes every workload without a queue-name label")
    data = copy.deepcopy(BASE)
    data["slice_groups"] = [{"name": "trillium", "generation": "v6e", "topology": "4x4"}]
    with pytest.raises(ConfigError) as err:
        parse_environment(data)
    assert err.value.problems == [
        "kueue: no slice group leaves slices to RayJobs, so Kueue would have no TPU quota to admit one against: "
        "set rayjob_slices on the groups RayJobs take"
    ]
    (line,) = problems(group_rayjob_slices=3)
    assert (
        line.startswith("slice_groups[0]: Value error, rayjob_slices (3) must be between 0 and slices (2)") or "rayjob_slices (3)" in line
    )


def test_show_says_which_groups_take_rayjobs_and_through_which_queue():
    proc = subprocess.run([sys.executable, "-m", "infra", "show", "--env", "prod"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "1 for RayJobs (queued by Kueue: LocalQueue ray-jobs -> ClusterQueue ray-tpu-prod-tpu)" in proc.stdout
    assert "0 for the RayCluster, 2 for RayJobs" in proc.stdout
