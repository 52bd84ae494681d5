"""The CPU pool for the Ray head and system pods."""

from __future__ import annotations

from cdktf_cdktf_provider_google.container_node_pool import ContainerNodePool, ContainerNodePoolAutoscaling
from constructs import Construct

from infra.cdk.components.node_defaults import management, node_config
from infra.config import Environment
from infra.names import CPU_POOL_NAME


class CpuNodePool(Construct):
    def __init__(self, scope: Construct, id_: str, *, env: Environment, cluster_id: str, service_account: str) -> None:
        super().__init__(scope, id_)
        pool = env.cpu_pool
        self.pool = ContainerNodePool(
            self,
            "pool",
            name=CPU_POOL_NAME,
            cluster=cluster_id,
            location=env.location,
            node_locations=[env.zone],  # one zone even in a regional cluster: the head needs one node
            initial_node_count=pool.min_nodes or 1,
            autoscaling=ContainerNodePoolAutoscaling(min_node_count=pool.min_nodes, max_node_count=pool.max_nodes),
            management=management(),
            node_config=node_config(
                env, service_account, pool.machine_type, disk_size_gb=pool.disk_size_gb, labels={"ray-tpu-gke/pool": "cpu"}
            ),
        )
