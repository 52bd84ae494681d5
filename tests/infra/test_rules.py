"""The platform's rules (infra.rules), each with a case that passes and one that fails, and each
citing where the rule comes from. Then the same rules as a config meets them: one line per problem
naming the field."""

from __future__ import annotations

import copy

import pytest

from infra import rules
from infra.config import ConfigError, parse_environment
from infra.platform_facts import MACHINES, version_key


# Cloud TPU "TPU regions and zones" (https://cloud.google.com/tpu/docs/regions-zones, read 2026-12-03):
# v6e us-central1-b, us-east1-d, us-east5-a/b; v5e us-central1-a, us-south1-a, us-west1-c, us-west4-a;
# TPU7x us-central1-c.
def test_zone_must_offer_the_generation():
    assert rules.zone_offers("v6e", "us-east5-b", "on-demand") is None
    assert rules.zone_offers("tpu7x", "us-central1-c", "spot") is None
    problem = rules.zone_offers("v6e", "us-central1-c", "on-demand")
    assert "zone us-central1-c does not offer v6e" in problem and "us-central1-b" in problem and "regions-zones" in problem
    assert "does not offer v5e" in rules.zone_offers("v5e", "us-central1-c", "spot")


# GKE flex-start page (https://cloud.google.com/kubernetes-engine/docs/concepts/dws, read 2026-12-03):
# "TPU Trillium (v6e) in asia-northeast1-b, us-east5-a, us-east5-b. TPU v5e in us-west4-a. TPU v5p in
# us-east5-a. TPU v3 and v4 are not supported."
def test_flex_start_has_its_own_shorter_zone_list():
    assert rules.zone_offers("v5e", "us-west4-a", "flex-start") is None
    assert "does not offer v5e on flex-start; zones that do: us-west4-a" in rules.zone_offers("v5e", "us-central1-a", "flex-start")
    assert "flex-start does not support v4" in rules.zone_offers("v4", "us-central2-b", "flex-start")
    assert "flex-start does not support v4" in rules.capacity_offered("v4", "flex-start")
    assert rules.capacity_offered("v4", "spot") is None and rules.capacity_offered("v6e", "flex-start") is None


def test_a_clusters_pools_stay_in_its_region():
    # provider node_locations: "in the region of their regional cluster or in the same region as their
    # cluster's zone for zonal clusters": a zonal cluster's pool may sit in a sibling zone.
    assert rules.zone_in_cluster("us-east5", "us-east5-b") is None
    assert rules.zone_in_cluster("us-central1", "us-central1-c") is None
    problem = rules.zone_in_cluster("us-central1", "us-east5-b")
    assert problem and "not in region us-central1" in problem and "node_locations" in problem


# GKE "Plan node sizes" (memory and CPU reservations): 25% of the first 4 GiB, 20% of the next 4, 10%
# of the next 8, 6% of the next 112, 2% above 128 GiB, plus 100 MiB for eviction, of the kubelet's
# capacity (counted as 97% of the machine's: platform_facts.NODE_CAPACITY); CPU 6% of the first
# core, 1% of the next, 0.5% of the next 2, 0.25% above 4. Machine sizes: Cloud TPU "TPU v5e" VM
# types (ct5lp-hightpu-1t 24 vCPU / 48 GiB, -4t 112 / 192 GiB; gcloud's MEMORY_GB column is GiB).
def test_allocatable_follows_gkes_reservation_tiers():
    small = MACHINES["ct5lp-hightpu-1t"]
    assert float(small.allocatable_cpu) == pytest.approx(24 - (0.06 + 0.01 + 0.01 + 0.0025 * 20))
    gib = 48 * 0.97
    reserved = 1 + 0.8 + 0.8 + 0.06 * (gib - 16)
    assert small.allocatable_memory / 2**30 == pytest.approx(gib - reserved - 100 / 1024, rel=1e-6)


def test_pod_requests_must_fit_the_machine():
    assert rules.requests_fit("ct5lp-hightpu-4t", "100", "150Gi") == {}
    # The old default (24 CPU / 200G per pod) fits neither v5e machine of the issue.
    problems = rules.requests_fit("ct5lp-hightpu-1t", "24", "200G")
    assert set(problems) == {"pod_cpu", "pod_memory"}
    assert "pod_cpu 24 is more than a ct5lp-hightpu-1t node" in problems["pod_cpu"]
    assert "use at most 42Gi" in problems["pod_memory"] and "plan-node-sizes" in problems["pod_memory"]
    assert "instance_capacities" in problems["pod_memory"]  # the kubelet capacity's source
    assert set(rules.requests_fit("ct5lp-hightpu-4t", "24", "200G")) == {"pod_memory"}  # 175.7Gi allocatable


def test_default_requests_always_fit():
    for machine in MACHINES:
        cpu, memory = rules.default_requests(machine)
        assert rules.requests_fit(machine, cpu, memory) == {}, machine


# GKE Ironwood page: "GKE Standard clusters that run version 1.34.0-gke.2201000 and later, and in
# Autopilot clusters that run version 1.34.1-gke.3084001 and later"; flex-start page: "To run TPUs, use
# GKE version 1.33.0-gke.1712000 or later".
def test_tpu7x_and_flex_start_need_a_minimum_gke_version():
    tpu7x = rules.required_versions("standard", {"tpu7x"}, {"on-demand"})
    assert rules.version_covers("1.35", tpu7x) is None
    assert rules.version_covers("1.34.0-gke.2201000", tpu7x) is None
    assert "tpu7x on Standard needs GKE 1.34.0-gke.2201000" in rules.version_covers(None, tpu7x)
    assert "needs GKE 1.34.0-gke.2201000" in rules.version_covers("1.33", tpu7x)
    autopilot = rules.required_versions("autopilot", {"tpu7x"}, set())
    assert "1.34.1-gke.3084001" in rules.version_covers("1.34.0-gke.2201000", autopilot)
    flex = rules.required_versions("standard", {"v6e"}, {"flex-start"})
    assert "flex-start TPUs needs GKE 1.33.0-gke.1712000" in rules.version_covers(None, flex)
    assert rules.version_covers(None, rules.required_versions("standard", {"v6e"}, {"spot"})) is None


def test_version_order_reads_fuzzy_versions_as_their_newest_patch():
    assert version_key("1.34") > version_key("1.34.0-gke.2201000") > version_key("1.33.5-gke.1")
    assert version_key("1.34.1") > version_key("1.34.0-gke.9")


# ray-project/ray issue #62402 and PR #63006: Ironwood needs jax[tpu] >= 0.8.2 on Python >= 3.12; Ray's
# TPU image tags name their Python ("-py312-tpu"; no suffix means Python 3.10).
def test_one_python_per_cluster_and_ironwood_needs_312():
    assert rules.images_agree("rayproject/ray:2.60.0-py312", {"tpu7x": "rayproject/ray:2.60.0-py312-tpu"}) == []
    (mismatch,) = rules.images_agree("rayproject/ray:2.60.0-py311", {"v6e": "rayproject/ray:2.60.0-py312-tpu"})
    assert "Python 3.12 but the head image rayproject/ray:2.60.0-py311 runs Python 3.11" in mismatch
    problems = rules.images_agree("rayproject/ray:2.60.0", {"tpu7x": "rayproject/ray:2.60.0-tpu"})
    assert problems and "Ironwood needs jax[tpu] >= 0.8.2" in problems[0]
    assert rules.images_agree("my-registry/head:1", {"tpu7x": "my-registry/worker:1"}) == []  # not ours to read


def test_serving_replicas_are_slices_of_their_group():
    assert rules.serving_budget("g", 2, 2) is None
    assert "serving.replicas (2) is more than slice group g has slices (1)" in rules.serving_budget("g", 1, 2)


# Ray 2.60.0 ray/_private/accelerators/tpu.py VALID_TPU_TOPOLOGY (checked against the installed Ray
# in test_catalog.py).
def test_ray_must_know_the_topology_to_reserve_it():
    assert rules.ray_knows("v6e", "4x4") is None
    assert "does not know tpu7x 4x4x12" in rules.ray_knows("tpu7x", "4x4x12")


# --- as a config meets them ----------------------------------------------------------------------

BASE = {
    "name": "t",
    "project": "my-gcp-project",
    "region": "us-east5",
    "zone": "us-east5-b",
    "cluster_name": "t",
    "slice_groups": [{"name": "g", "generation": "v6e", "topology": "4x4"}],
}


def problems(**changes) -> list[str]:
    data = copy.deepcopy(BASE)
    data["slice_groups"][0].update(changes.pop("group", {}))
    data.update(changes)
    with pytest.raises(ConfigError) as err:
        parse_environment(data, "t.yaml")
    return [line[4:] for line in str(err.value).splitlines()[1:]]


def test_config_errors_name_the_field_and_the_valid_choices():
    (line,) = problems(region="us-central1", zone="us-central1-c")
    assert line.startswith("zone: zone us-central1-c does not offer v6e; zones that do:")
    assert line.endswith("set slice_groups[0].unlisted_zone_ok: true")
    (line,) = problems(group={"zone": "us-central1-b"})
    assert line.startswith("slice_groups[0].zone: zone us-central1-b is not in region us-east5")
    lines = problems(
        group={"generation": "v5e", "topology": "1x1", "pod_cpu": "24", "pod_memory": "200G"}, region="us-west4", zone="us-west4-a"
    )
    assert [line.split(":")[0] for line in lines] == ["slice_groups[0].pod_cpu", "slice_groups[0].pod_memory"]
    # Queued provisioning needs Kueue (tests/infra/test_kueue.py has the rest of its rules).
    line, *_ = problems(group={"capacity": "queued-provisioning"}, gke_min_version="1.35")
    assert line.startswith("slice_groups[0].capacity: queued-provisioning pools scale up only for ProvisioningRequests")
    assert "add a `kueue:` section" in line and "or use capacity: flex-start" in line
    (line,) = problems(group={"capacity": "flex-start"})
    assert line.startswith("gke_min_version: flex-start TPUs needs GKE 1.33.0-gke.1712000")
    # No zone can make flex-start exist for v4, so no zone override is offered for it.
    lines = problems(
        group={"generation": "v4", "topology": "2x2x1", "capacity": "flex-start", "unlisted_zone_ok": True},
        region="us-central2",
        zone="us-central2-b",
        gke_min_version="1.35",
    )
    assert lines == [lines[0]] and lines[0].startswith("slice_groups[0].capacity: flex-start does not support v4")
    assert "unlisted_zone_ok" not in lines[0]


def test_an_unlisted_zone_is_accepted_on_request_with_a_warning():
    data = copy.deepcopy(BASE) | {"region": "us-west1", "zone": "us-west1-b"}
    data["slice_groups"][0]["unlisted_zone_ok"] = True
    env = parse_environment(data)
    (warning,) = env.warnings
    assert warning.startswith("zone: zone us-west1-b does not offer v6e") and "accepted because" in warning


def test_a_regional_cluster_puts_each_group_in_its_own_zone():
    data = copy.deepcopy(BASE) | {"region": "us-central1", "zone": "us-central1-b", "cluster_type": "regional", "gke_min_version": "1.35"}
    data["slice_groups"] = [
        {"name": "trillium", "generation": "v6e", "topology": "4x4"},
        {"name": "ironwood", "generation": "tpu7x", "topology": "2x2x2", "zone": "us-central1-c"},
        {"name": "lite", "generation": "v5e", "topology": "2x2", "zone": "us-central1-a"},
    ]
    env = parse_environment(data)
    assert env.location == "us-central1" and [env.group_zone(g) for g in env.slice_groups] == [
        "us-central1-b",
        "us-central1-c",
        "us-central1-a",
    ]
