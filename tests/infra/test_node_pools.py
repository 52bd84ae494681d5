"""Which TPU node pools a config asks for (pure: no cdktf)."""

from __future__ import annotations

from infra.config import load_environment, parse_environment
from infra.node_pools import tpu_pool_plans


def env_with(region="us-east5", zone="us-east5-b", **group):
    return parse_environment(
        {
            "name": "t",
            "project": "my-gcp-project",
            "region": region,
            "zone": zone,
            "cluster_name": "c",
            "gke_min_version": "1.35",
            "slice_groups": [{"name": "g", "generation": "v6e", "topology": "4x4", **group}],
        }
    )


def test_dev_is_one_pool_of_four_hosts_scaling_from_zero_and_a_serving_host():
    plan, serving = tpu_pool_plans(load_environment("dev"))
    assert (plan.name, plan.machine_type, plan.placement) == ("v6e-4x4-0", "ct6e-standard-4t", "tpu-topology")
    assert (plan.autoscaled, plan.min_nodes, plan.max_nodes, plan.initial_nodes) == (True, 0, 4, 0)
    assert (serving.name, serving.shape.hosts, serving.max_nodes, serving.zone) == ("v6e-2x2", 1, 1, "us-east5-b")


def test_n_multi_host_slices_are_n_pools_each_whole():
    plans = tpu_pool_plans(env_with(slices=3, autoscaling={"min_slices": 1}))
    assert [p.name for p in plans] == ["g-0", "g-1", "g-2"]
    assert [(p.autoscaled, p.min_nodes, p.max_nodes) for p in plans] == [(False, 4, 4), (True, 0, 4), (True, 0, 4)]
    # A pool is either empty or a whole slice: never between.
    assert all(p.max_nodes == p.shape.hosts for p in plans)


def test_fixed_pools_without_autoscaling():
    plans = tpu_pool_plans(env_with(slices=2))
    assert [(p.autoscaled, p.initial_nodes) for p in plans] == [(False, 4), (False, 4)]
    # Fixed pools set node_count only: the provider refuses both counts on one pool
    # (terraform-provider-google 6.50.0 resource_container_node_pool.go, expandNodePool).
    assert [p.fixed_nodes for p in plans] == [4, 4]


def test_single_host_slices_share_one_pool():
    (plan,) = tpu_pool_plans(env_with(topology="2x2", slices=3, autoscaling={"min_slices": 1}))
    assert (plan.name, plan.machine_type, plan.placement) == ("g", "ct6e-standard-4t", None)
    assert (plan.min_nodes, plan.max_nodes, plan.initial_nodes) == (1, 3, 1)


def test_tpu7x_multi_host_takes_a_workload_policy():
    plans = tpu_pool_plans(env_with(generation="tpu7x", topology="2x2x2", region="us-central1", zone="us-central1-c"))
    assert [(p.placement, p.machine_type, p.shape.hosts) for p in plans] == [("workload-policy", "tpu7x-standard-4t", 2)]


def test_flex_start_always_scales_from_zero():
    (plan,) = tpu_pool_plans(env_with(capacity="flex-start"))
    assert (plan.autoscaled, plan.min_nodes, plan.initial_nodes, plan.capacity) == (True, 0, 0, "flex-start")
    assert plan.fixed_nodes is None and plan.auto_repair is False  # xpk: --no-enable-autorepair


def test_reservation_is_carried():
    (plan,) = tpu_pool_plans(env_with(capacity={"reservation": "my-res"}))
    assert (plan.capacity, plan.reservation) == ("reservation", "my-res")


def test_autopilot_has_no_pools():
    assert tpu_pool_plans(load_environment("autopilot")) == []
