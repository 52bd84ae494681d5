"""Configs a team would write that an earlier reading of the platform refused (issue 21's second
fidelity pass), each accepted now from its source, synthesized in the session's one synth and
printed: TPU7x on flex-start (cluster-toolkit's dws-flex-start/gke-tpu-7x blueprint), a reservation
shared from another project down to a block (Compute Engine ReservationAffinity), a zonal cluster
with a pool in a sibling zone (provider `node_locations`), a v5p reservation in a zone Google's
public list omits, and pods asking for nearly all of a node's memory (machine memory in GiB, GKE's
reservation taken from the kubelet's capacity). The refusals that remain cite their sources."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra import quantity, rules
from infra.config import ConfigError, parse_environment
from infra.platform_facts import MACHINES, NODE_CAPACITY_SHARE
from tests.infra.sweep import BIG_POD_MEMORY, SHARED_RESERVATION, team_environments

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


def printed(path: Path) -> tuple[list[dict], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "manifests", "--env", str(path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout)), proc.stderr


def worker_pod(docs: list[dict]) -> dict:
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    (worker,) = cluster["spec"]["workerGroupSpecs"]
    return worker["template"]["spec"]


@pytest.fixture(scope="module")
def team(team_paths) -> dict[str, Path]:
    return {p.stem: p for p in team_paths}


@pytest.mark.synth
def test_each_team_config_synthesizes_pools_that_obey_the_rules(team_stacks):
    for name, stack in team_stacks.items():
        env = stack.env
        pools = [p for p in stack.resources("google_container_node_pool").values() if p["name"] != "cpu"]
        if env.mode == "autopilot":
            assert pools == [], name
            continue
        assert pools, name
        for pool in pools:
            group = env.slice_group(pool["node_config"]["labels"]["ray-tpu-gke/slice-group"])
            zone = env.group_zone(group)
            assert pool["node_locations"] == [zone] and zone.startswith(env.region + "-"), name
            assert rules.requests_fit(group.shape.machine_type, *group.requests) == {}, name
            assert pool["node_config"]["machine_type"] == group.shape.machine_type, name


@pytest.mark.synth
def test_tpu7x_on_flex_start_names_a_workload_policy_alone(team_stacks):
    stack = team_stacks["team-tpu7x-flex"]
    (pool,) = [p for p in stack.resources("google_container_node_pool").values() if p["name"] != "cpu"]
    config = pool["node_config"]
    assert config["flex_start"] is True and config["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
    assert pool["management"]["auto_repair"] is False  # cluster-toolkit: "flex-start dependency"
    assert pool["autoscaling"]["min_node_count"] == 0 and pool["autoscaling"]["max_node_count"] == 2
    placement = pool["placement_policy"]
    assert placement["type"] == "" and "tpu_topology" not in placement
    (policy,) = stack.resources("google_compute_resource_policy").values()
    assert policy["workload_policy"] == {"type": "HIGH_THROUGHPUT", "accelerator_topology": "2x2x2"}


def provider_read_back(stored: dict) -> dict:
    """What terraform-provider-google 6.50.0 writes into state from GKE's placement policy:
    `flattenPlacementPolicy` (resource_container_node_pool.go) copies type, policy_name and
    tpu_topology verbatim, "" where GKE stores none."""
    return {"type": stored.get("type", ""), "policy_name": stored.get("policyName", ""), "tpu_topology": stored.get("tpuTopology", "")}


@pytest.mark.synth
def test_what_a_tpu7x_pool_declares_is_what_the_provider_reads_back(team_stacks):
    # GKE stores a workload policy with the topology filled in and no type (the fake GKE API serves
    # it so, as vllm-project/ci-infra PR #547 read a live TPU7x pool): the declared type "" reads
    # back as declared, and the filled-in topology is ignored (not ForceNew: an in-place diff that
    # would never go away). A declared COMPACT would read back "" on every plan.
    stack = team_stacks["team-tpu7x-flex"]
    (pool,) = [p for p in stack.resources("google_container_node_pool").values() if p["name"] != "cpu"]
    declared = pool["placement_policy"]
    read = provider_read_back({"policyName": "ray-tpu-policy", "tpuTopology": "2x2x2"})
    ignored = {path.split(".")[-1] for path in pool["lifecycle"]["ignore_changes"] if path.startswith("placement_policy[0].")}
    differs = {k for k in read if k not in ignored and k != "policy_name" and declared.get(k, "") != read[k]}
    assert differs == set() and ignored == {"tpu_topology"}


@pytest.mark.synth
def test_a_shared_reservation_reaches_the_pool_whole(team_stacks):
    (pool,) = [p for p in team_stacks["team-shared-res"].resources("google_container_node_pool").values() if p["name"] != "cpu"]
    assert pool["node_config"]["reservation_affinity"] == {
        "consume_reservation_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": [SHARED_RESERVATION],
    }


def test_a_shared_reservation_on_autopilot_selects_its_owner_project(team):
    docs, _ = printed(team["team-shared-res-ap"])
    selector = worker_pod(docs)["nodeSelector"]
    assert selector["cloud.google.com/reservation-name"] == "trillium-res"
    assert selector["cloud.google.com/reservation-project"] == "owner-project"
    assert selector["cloud.google.com/reservation-affinity"] == "specific"


def test_a_zonal_cluster_places_a_group_in_a_sibling_zone(team):
    docs, _ = printed(team["team-zonal-sibling"])
    assert worker_pod(docs)["nodeSelector"]["ray-tpu-gke/slice-group"] == "trillium"
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "show", "--env", str(team["team-zonal-sibling"])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "zonal standard cluster team-zonal-sibling in us-east5-b" in proc.stdout and "in us-east5-a" in proc.stdout


def test_a_reservation_in_a_zone_the_public_list_omits_is_a_warning(team):
    _, stderr = printed(team["team-v5p-reserved"])
    assert "warning: zone: zone us-east5-b is not in Google's public list for v5p" in stderr
    assert "accepted because the capacity is a reservation" in stderr


def test_pods_may_ask_for_nearly_all_of_a_nodes_memory(team):
    docs, _ = printed(team["team-big-pods"])
    (container,) = worker_pod(docs)["containers"]
    assert container["resources"]["requests"]["memory"] == BIG_POD_MEMORY


# --- both sides of each boundary, pure ---------------------------------------------------------------


def test_allocatable_memory_boundary_on_a_ct6e_standard_4t():
    # 720 GiB (gcloud's MEMORY_GB is GiB); the kubelet reports >= 97% = 698.4 GiB; GKE keeps 25% of 4,
    # 20% of 4, 10% of 8, 6% of 112 and 2% of the 570.4 above 128 GiB = 20.73 GiB, and 100 MiB for
    # eviction: 677.57 GiB allocatable.
    machine = MACHINES["ct6e-standard-4t"]
    capacity = 720 * float(NODE_CAPACITY_SHARE)
    expected = capacity - (1 + 0.8 + 0.8 + 6.72 + 0.02 * (capacity - 128)) - 100 / 1024
    assert machine.allocatable_memory / GiB == pytest.approx(expected, rel=1e-9)
    assert rules.requests_fit("ct6e-standard-4t", "1", "677Gi") == {}
    (field,) = rules.requests_fit("ct6e-standard-4t", "1", "678Gi")
    assert field == "pod_memory"
    assert (
        "use at most " + quantity.gib_at_most(machine.allocatable_memory)
        in rules.requests_fit("ct6e-standard-4t", "1", "678Gi")["pod_memory"]
    )
    # The older reading (10^9-byte GB, no capacity margin) gave 650.3 GiB and refused 670Gi.
    assert 650 * GiB < quantity.parse(BIG_POD_MEMORY) < machine.allocatable_memory


BASE = team_environments()


def problems(name: str, **group_changes) -> list[str]:
    data = copy.deepcopy(BASE[name])
    data["slice_groups"][0].update(group_changes)
    with pytest.raises(ConfigError) as err:
        parse_environment(data, f"{name}.yaml")
    return err.value.problems


def test_tpu7x_flex_start_only_where_the_blueprint_runs_it():
    (line,) = problems("team-tpu7x-flex", zone="us-central1-ai1a")
    assert line.startswith("slice_groups[0].zone: zone us-central1-ai1a does not offer tpu7x on flex-start; zones that do: us-central1-c")


def test_a_pool_outside_the_clusters_region_is_refused_citing_the_provider():
    (line,) = problems("team-zonal-sibling", zone="us-central1-b")
    assert line.startswith("slice_groups[0].zone: zone us-central1-b is not in region us-east5")
    assert "node_locations" in line


@pytest.mark.parametrize(
    "reservation",
    ["Res", "projects/owner-project/reservation/x", "x" * 64, "projects/owner-project/reservations/r/reservationBlocks/"],
)
def test_a_malformed_reservation_is_refused_saying_what_is_valid(reservation):
    (line,) = problems("team-v5p-reserved", capacity={"reservation": reservation})
    assert line.startswith("slice_groups[0].capacity: reservation") and "projects/OWNER_PROJECT/reservations/NAME" in line


def test_on_demand_in_a_zone_the_public_list_omits_is_still_refused():
    (line,) = problems("team-v5p-reserved", capacity="on-demand")
    assert line.startswith("zone: zone us-east5-b does not offer v5p; zones that do: us-central1-a, us-east5-a")
    assert "regions-zones" in line


@pytest.mark.synth
def test_a_queued_provisioning_group_is_pools_gke_provisions_for_a_provisioning_request(team_stacks):
    # GKE's ray-kueue-dws tutorial: --enable-queued-provisioning --flex-start --reservation-affinity=none,
    # autoscaling from 0; cluster-toolkit's gke-node-pool: auto-repair off, the gke-queued label.
    pools = {p["name"]: p for p in team_stacks["team-queued"].resources("google_container_node_pool").values()}
    for name in ("dws-0", "dws-1"):
        pool = pools[name]
        assert pool["queued_provisioning"] == {"enabled": True}, name
        config = pool["node_config"]
        assert config["flex_start"] is True and config["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
        assert config["labels"]["cloud.google.com/gke-queued"] == "true"
        assert pool["autoscaling"]["min_node_count"] == 0 and pool["management"]["auto_repair"] is False
    assert "queued_provisioning" not in pools["trillium-0"]
