"""The synthesized Terraform, through cdktf's own `Testing` matchers, for every resource and
property the stacks promise. One synth for the whole session (tests/infra/conftest.py)."""

from __future__ import annotations

import cdktf
import pytest

from infra.node_pools import tpu_pool_plans

pytestmark = pytest.mark.synth


def has(stack, tf_type: str, props: dict) -> None:
    assert cdktf.Testing.to_have_resource_with_properties(stack.text, tf_type, props), f"no {tf_type} with {props}"


def test_one_stack_per_shipped_environment(stacks):
    assert {s.path.parent.name for s in stacks.values()} == {"ray-tpu-autopilot", "ray-tpu-dev", "ray-tpu-prod"}


def test_network_vpc_subnet_ranges_router_nat(stacks):
    dev = stacks["dev"]
    has(dev, "google_compute_network", {"name": "ray-tpu-dev-vpc", "auto_create_subnetworks": False})
    has(
        dev,
        "google_compute_subnetwork",
        {
            "ip_cidr_range": "10.10.0.0/20",
            "private_ip_google_access": True,
            "secondary_ip_range": [
                {"range_name": "pods", "ip_cidr_range": "10.16.0.0/14"},
                {"range_name": "services", "ip_cidr_range": "10.20.0.0/20"},
            ],
        },
    )
    has(dev, "google_compute_router", {"name": "ray-tpu-dev-router", "region": "us-east5"})
    has(dev, "google_compute_router_nat", {"source_subnetwork_ip_ranges_to_nat": "ALL_SUBNETWORKS_ALL_IP_RANGES"})


def test_cluster_is_private_shielded_with_ray_operator(stacks):
    dev = stacks["dev"]
    has(
        dev,
        "google_container_cluster",
        {
            "name": "ray-tpu-dev",
            "location": "us-east5-b",
            "deletion_protection": True,
            "remove_default_node_pool": True,
            "enable_shielded_nodes": True,
            "release_channel": {"channel": "REGULAR"},
            "workload_identity_config": {"workload_pool": "my-gcp-project.svc.id.goog"},
            "private_cluster_config": {"enable_private_nodes": True, "master_ipv4_cidr_block": "172.16.0.32/28"},
            "ip_allocation_policy": {"cluster_secondary_range_name": "pods", "services_secondary_range_name": "services"},
            "monitoring_config": {"managed_prometheus": {"enabled": True}},
            # The DNS endpoint: how laptops and Cloud Build's default pool reach the control plane.
            "control_plane_endpoints_config": {"dns_endpoint_config": {"allow_external_traffic": True}},
            "addons_config": {
                "ray_operator_config": [
                    {
                        "enabled": True,
                        "ray_cluster_logging_config": {"enabled": True},
                        "ray_cluster_monitoring_config": {"enabled": True},
                    }
                ],
            },
        },
    )
    cluster = dev.one("google_container_cluster")
    assert cluster["node_config"]["service_account"].startswith("${google_service_account.node-identity")


def test_dev_tpu_pool_is_one_compact_v6e_4x4_slice(stacks):
    dev = stacks["dev"]
    has(
        dev,
        "google_container_node_pool",
        {
            "name": "v6e-4x4-0",
            "location": "us-east5-b",
            "initial_node_count": 0,
            "autoscaling": {"min_node_count": 0, "max_node_count": 4},
            "placement_policy": {"type": "COMPACT", "tpu_topology": "4x4"},
            "node_locations": ["us-east5-b"],
            "node_config": {
                "machine_type": "ct6e-standard-4t",
                "workload_metadata_config": {"mode": "GKE_METADATA"},
                "disk_type": "hyperdisk-balanced",
                "labels": {"ray-tpu-gke/slice-group": "v6e-4x4"},
            },
            "management": {"auto_repair": True, "auto_upgrade": True},
        },
    )
    pool = dev.resources("google_container_node_pool")
    tpu = next(p for p in pool.values() if p["name"] == "v6e-4x4-0")
    assert "google_service_account.node-identity" in tpu["node_config"]["service_account"]
    assert "spot" not in tpu["node_config"]


def test_cpu_pool_for_the_head(stacks):
    has(
        stacks["dev"],
        "google_container_node_pool",
        {
            "name": "cpu",
            "autoscaling": {"min_node_count": 1, "max_node_count": 3},
            "node_config": {"machine_type": "e2-standard-8"},
        },
    )


def test_every_planned_pool_is_synthesized_and_nothing_else(stacks):
    for name, stack in stacks.items():
        pools = {p["name"]: p for p in stack.resources("google_container_node_pool").values()}
        planned = {p.name: p for p in tpu_pool_plans(stack.env)}
        expected = set(planned) | ({"cpu"} if stack.env.mode == "standard" else set())
        assert set(pools) == expected, name
        for plan in planned.values():
            pool = pools[plan.name]
            assert pool["node_config"]["machine_type"] == plan.machine_type
            if plan.autoscaled:
                assert (pool["autoscaling"]["min_node_count"], pool["autoscaling"]["max_node_count"]) == (plan.min_nodes, plan.max_nodes)
            else:
                # node_count only: the provider refuses both counts on one pool (expandNodePool).
                assert pool["node_count"] == plan.initial_nodes and "autoscaling" not in pool
                assert "initial_node_count" not in pool


def test_prod_is_regional_with_each_group_in_a_zone_that_offers_it(stacks):
    prod = stacks["prod"]
    has(prod, "google_container_cluster", {"location": "us-central1", "node_locations": ["us-central1-b"], "min_master_version": "1.35"})
    zones = {p["name"]: (p["location"], p["node_locations"]) for p in prod.resources("google_container_node_pool").values()}
    assert zones == {
        "cpu": ("us-central1", ["us-central1-b"]),
        "v6e-multislice-0": ("us-central1", ["us-central1-b"]),  # v6e: us-central1-b
        "v6e-multislice-1": ("us-central1", ["us-central1-b"]),
        "ironwood-0": ("us-central1", ["us-central1-c"]),  # TPU7x: us-central1-c
        "ironwood-queued-0": ("us-central1", ["us-central1-c"]),  # TPU7x flex-start capacity: us-central1-c
        "ironwood-queued-1": ("us-central1", ["us-central1-c"]),
        "v5e-serving": ("us-central1", ["us-central1-a"]),  # v5e: us-central1-a
    }


def test_prod_capacity_maps_to_spot_and_reservation(stacks):
    prod = stacks["prod"]
    has(prod, "google_container_node_pool", {"name": "v6e-multislice-1", "node_config": {"spot": True}})
    has(
        prod,
        "google_container_node_pool",
        {
            "name": "ironwood-0",
            "node_count": 2,
            "node_config": {
                "reservation_affinity": {
                    "consume_reservation_type": "SPECIFIC_RESERVATION",
                    "key": "compute.googleapis.com/reservation-name",
                    "values": ["ironwood-res"],
                }
            },
        },
    )
    ironwood = next(p for p in prod.resources("google_container_node_pool").values() if p["name"] == "ironwood-0")
    assert "initial_node_count" not in ironwood  # fixed: node_count alone
    assert ironwood["node_config"]["disk_type"] == "hyperdisk-balanced"
    has(prod, "google_container_node_pool", {"name": "v5e-serving", "node_config": {"machine_type": "ct5lp-hightpu-8t"}})
    v5e = next(p for p in prod.resources("google_container_node_pool").values() if p["name"] == "v5e-serving")
    assert "placement_policy" not in v5e  # single-host slices need no placement


def test_tpu7x_pool_names_a_high_throughput_workload_policy(stacks):
    prod = stacks["prod"]
    has(
        prod,
        "google_compute_resource_policy",
        {
            "name": "ray-tpu-prod-tpu7x-2x2x2",
            "region": "us-central1",
            "workload_policy": {"type": "HIGH_THROUGHPUT", "accelerator_topology": "2x2x2"},
        },
    )
    (policy_id,) = prod.resources("google_compute_resource_policy")
    pool = next(p for p in prod.resources("google_container_node_pool").values() if p["name"] == "ironwood-0")
    assert pool["placement_policy"]["policy_name"] == f"${{google_compute_resource_policy.{policy_id}.name}}"
    assert "tpu_topology" not in pool["placement_policy"]


def test_node_service_account_has_only_minimal_roles(stacks):
    dev = stacks["dev"]
    has(dev, "google_service_account", {"account_id": "ray-tpu-dev-nodes"})
    roles = sorted(m["role"] for m in dev.resources("google_project_iam_member").values())
    assert roles == sorted(
        [
            "roles/artifactregistry.reader",
            "roles/autoscaling.metricsWriter",
            "roles/logging.logWriter",
            "roles/monitoring.metricWriter",
            "roles/monitoring.viewer",
            "roles/stackdriver.resourceMetadata.writer",
        ]
    )


def test_ray_pods_identity_and_bucket(stacks):
    dev = stacks["dev"]
    has(dev, "google_service_account", {"account_id": "ray-tpu-dev-ray"})
    has(
        dev,
        "google_service_account_iam_member",
        {
            "role": "roles/iam.workloadIdentityUser",
            "member": "serviceAccount:my-gcp-project.svc.id.goog[default/ray]",
        },
    )
    has(
        dev,
        "google_storage_bucket",
        {
            "name": "my-gcp-project-ray-tpu-dev-ray",
            "uniform_bucket_level_access": True,
            "versioning": {"enabled": True},
            "public_access_prevention": "enforced",
        },
    )
    has(dev, "google_storage_bucket_iam_member", {"role": "roles/storage.objectUser"})


def test_state_backend_local_relative_or_gcs(stacks):
    assert stacks["autopilot"].json["terraform"]["backend"] == {"local": {"path": "../../../terraform.ray-tpu-autopilot.tfstate"}}
    # dev shares its state with Cloud Build (the default pipeline deploys it).
    assert stacks["dev"].json["terraform"]["backend"] == {"gcs": {"bucket": "my-gcp-project-tfstate", "prefix": "ray-tpu-gke/ray-tpu-dev"}}
    assert stacks["prod"].json["terraform"]["backend"] == {
        "gcs": {"bucket": "my-gcp-project-tfstate", "prefix": "ray-tpu-gke/ray-tpu-prod"}
    }


def test_outputs(stacks):
    outputs = stacks["dev"].json["output"]
    assert outputs["get_credentials"]["value"] == (
        "gcloud container clusters get-credentials ray-tpu-dev --location us-east5-b --project my-gcp-project --dns-endpoint"
    )
    assert outputs["cluster_location"]["value"] == "us-east5-b"
    assert outputs["bucket"]["value"].startswith("gs://")
    assert {"cluster_name", "ray_service_account", "apply_ray_cluster"} <= set(outputs)


def test_autopilot_has_no_node_pools_but_the_ray_operator(stacks):
    auto = stacks["autopilot"]
    has(
        auto,
        "google_container_cluster",
        {
            "enable_autopilot": True,
            "location": "us-east5",
            "addons_config": {"ray_operator_config": [{"enabled": True}]},
        },
    )
    assert auto.resources("google_container_node_pool") == {}
    assert "remove_default_node_pool" not in auto.one("google_container_cluster")


def test_no_keys_or_credentials_in_any_stack(stacks):
    for name, stack in stacks.items():
        assert not stack.resources("google_service_account_key"), name
        for marker in ("private_key", "BEGIN PRIVATE", "client_secret", "access_token"):
            assert marker not in stack.text, f"{marker} in {name}"
        provider = stack.json["provider"]["google"][0]
        assert "credentials" not in provider and "access_token" not in provider  # ADC only
