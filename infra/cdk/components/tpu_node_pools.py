"""TPU slice node pools, from `infra.node_pools.tpu_pool_plans`.

Multi-host pools are placed COMPACT with `tpu_topology`, except TPU7x (Ironwood), whose multi-host
pools name only a workload policy (a compute resource policy of type HIGH_THROUGHPUT with the
accelerator topology): GKE's Ironwood page applies it with `--placement-policy` alone ("This policy
replaces the --tpu-topology flag"), and xpk (nodepool.py @367c838) passes neither
`--placement-type=COMPACT` ("mutually exclusive with workload policy") nor `--tpu-topology`. The
provider (6.50.0 resource_container_node_pool.go) requires `type` but accepts "", which it leaves
out of the request, and reads `type`, `policy_name` and `tpu_topology` back verbatim; GKE stores the
policy with the topology filled in and no type, so the pool ignores changes to `tpu_topology`
(not ForceNew: an in-place diff that would never go away) and states `type` as GKE returns it.

Capacity maps to spot VMs, reservation affinity, flex-start or queued provisioning. Each
pool lives in its group's zone; fixed pools set only `node_count`, autoscaled ones
`initial_node_count` plus autoscaling (infra.node_pools says why).
"""

from __future__ import annotations

from typing import Any

from cdktf import TerraformResourceLifecycle
from cdktf_cdktf_provider_google.compute_resource_policy import (
    ComputeResourcePolicy,
    ComputeResourcePolicyWorkloadPolicy,
)
from cdktf_cdktf_provider_google.container_node_pool import (
    ContainerNodePool,
    ContainerNodePoolAutoscaling,
    ContainerNodePoolNodeConfigGvnic,
    ContainerNodePoolNodeConfigReservationAffinity,
    ContainerNodePoolPlacementPolicy,
    ContainerNodePoolQueuedProvisioning,
)
from constructs import Construct

from infra.cdk.components.node_defaults import management, node_config
from infra.config import Environment
from infra.names import QUEUED_LABEL, SLICE_GROUP_LABEL
from infra.node_pools import TpuPoolPlan, tpu_pool_plans
from infra.platform_facts import BOOT_DISK_TYPES

# What GKE fills in on a TPU7x pool's placement policy and the provider then reads back.
WORKLOAD_POLICY_FILLED_IN = ["placement_policy[0].tpu_topology"]


def capacity_settings(plan: TpuPoolPlan) -> tuple[dict[str, Any], dict[str, Any]]:
    """(node_config fields, node pool fields) for the plan's capacity."""
    if plan.capacity == "spot":
        return {"spot": True}, {}
    if plan.capacity == "reservation":
        return {
            "reservation_affinity": ContainerNodePoolNodeConfigReservationAffinity(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key="compute.googleapis.com/reservation-name",
                values=[plan.reservation],
            )
        }, {}
    if plan.capacity in ("flex-start", "queued-provisioning"):
        no_reservation = ContainerNodePoolNodeConfigReservationAffinity(consume_reservation_type="NO_RESERVATION")
        node_fields: dict[str, Any] = {"flex_start": True, "reservation_affinity": no_reservation}
        if plan.capacity == "flex-start":
            return node_fields, {}
        # Queued provisioning: nodes only for ProvisioningRequests (Kueue's, for an admitted RayJob),
        # which GKE marks with this label and taints cloud.google.com/gke-queued (the tutorial's
        # `--enable-queued-provisioning --flex-start --reservation-affinity=none`; cluster-toolkit's
        # gke-node-pool sets the label too).
        return node_fields, {"queued_provisioning": ContainerNodePoolQueuedProvisioning(enabled=True)}
    return {}, {}


class TpuSlicePools(Construct):
    def __init__(self, scope: Construct, id_: str, *, env: Environment, cluster_id: str, service_account: str) -> None:
        super().__init__(scope, id_)
        self.plans = tpu_pool_plans(env)
        self.workload_policies: dict[str, ComputeResourcePolicy] = {}
        self.pools: dict[str, ContainerNodePool] = {}
        for plan in self.plans:
            node_fields, pool_fields = capacity_settings(plan)
            disk_type = BOOT_DISK_TYPES.get(plan.shape.generation.name)
            if disk_type:
                node_fields["disk_type"] = disk_type
            self.pools[plan.name] = ContainerNodePool(
                self,
                plan.name,
                name=plan.name,
                cluster=cluster_id,
                location=env.location,
                node_locations=[plan.zone],
                initial_node_count=plan.initial_nodes if plan.autoscaled else None,
                node_count=plan.fixed_nodes,
                autoscaling=(
                    ContainerNodePoolAutoscaling(min_node_count=plan.min_nodes, max_node_count=plan.max_nodes, location_policy="ANY")
                    if plan.autoscaled
                    else None
                ),
                placement_policy=self._placement(env, plan),
                management=management(auto_repair=plan.auto_repair),
                node_config=node_config(
                    env,
                    service_account,
                    plan.machine_type,
                    gvnic=ContainerNodePoolNodeConfigGvnic(enabled=True),  # TPU hosts talk DCN (multislice) over gVNIC
                    # Worker pods select their own group's pools by this label (never another group's
                    # nodes of the same shape).
                    labels={SLICE_GROUP_LABEL: plan.group, **({QUEUED_LABEL: "true"} if plan.capacity == "queued-provisioning" else {})},
                    **node_fields,
                ),
                lifecycle=TerraformResourceLifecycle(ignore_changes=WORKLOAD_POLICY_FILLED_IN)
                if plan.placement == "workload-policy"
                else None,
                **pool_fields,
            )

    def _placement(self, env: Environment, plan: TpuPoolPlan) -> ContainerNodePoolPlacementPolicy | None:
        if plan.placement == "tpu-topology":
            return ContainerNodePoolPlacementPolicy(type="COMPACT", tpu_topology=plan.shape.topology)
        if plan.placement == "workload-policy":
            return ContainerNodePoolPlacementPolicy(type="", policy_name=self._workload_policy(env, plan).name)
        return None

    def _workload_policy(self, env: Environment, plan: TpuPoolPlan) -> ComputeResourcePolicy:
        """One HIGH_THROUGHPUT workload policy per TPU7x topology, shared by its pools."""
        topology = plan.shape.topology
        if topology not in self.workload_policies:
            self.workload_policies[topology] = ComputeResourcePolicy(
                self,
                f"workload-policy-{topology}",
                name=f"{env.cluster_name}-tpu7x-{topology}",
                region=env.region,
                workload_policy=ComputeResourcePolicyWorkloadPolicy(type="HIGH_THROUGHPUT", accelerator_topology=topology),
            )
        return self.workload_policies[topology]
