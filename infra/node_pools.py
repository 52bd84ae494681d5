"""Which node pools a config asks for, as plain data (no cdktf): the TPU pool construct builds
them, and the tests and the drift check compare against them.

A multi-host slice is one node pool of exactly `hosts` nodes (GKE creates and deletes it atomically,
so a slice is never half there); N slices are N pools. Single-host slices share one pool, a node
per slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog import SliceShape
from infra.config import Environment, Reservation, SliceGroup


@dataclass(frozen=True)
class TpuPoolPlan:
    name: str
    group: str
    shape: SliceShape
    initial_nodes: int
    # Autoscaled pools scale between min_nodes and max_nodes; fixed pools keep initial_nodes.
    autoscaled: bool
    min_nodes: int
    max_nodes: int
    capacity: str  # on-demand | spot | flex-start | queued-provisioning | reservation
    reservation: str | None
    zone: str  # the pool's one node location

    @property
    def fixed_nodes(self) -> int | None:
        """A pool that does not autoscale sets only `node_count`: the provider refuses a pool with
        both counts ("Cannot set both initial_node_count and node_count", expandNodePool in
        terraform-provider-google 6.50.0 resource_container_node_pool.go)."""
        return None if self.autoscaled else self.initial_nodes

    @property
    def auto_repair(self) -> bool:
        """Flex-start nodes (queued provisioning's too) are not repaired: xpk creates flex pools with
        --no-enable-autorepair and cluster-toolkit refuses "enable_flex_start needs node auto_repair
        set to false"."""
        return self.capacity not in ("flex-start", "queued-provisioning")

    @property
    def machine_type(self) -> str:
        return self.shape.machine_type

    @property
    def placement(self) -> str | None:
        """How the pool's hosts are placed: `tpu_topology` (COMPACT), a TPU7x workload policy, or
        nothing for single-host pools."""
        if not self.shape.multi_host:
            return None
        return "workload-policy" if self.shape.generation.name == "tpu7x" else "tpu-topology"


def tpu_pool_plans(env: Environment) -> list[TpuPoolPlan]:
    if env.mode == "autopilot":
        return []  # GKE provisions slices from the pods' nodeSelectors
    return [plan for group in env.slice_groups for plan in _group_plans(group, env.group_zone(group))]


def _group_plans(group: SliceGroup, zone: str) -> list[TpuPoolPlan]:
    shape = group.shape
    reservation = group.capacity.reservation if isinstance(group.capacity, Reservation) else None

    def plan(name: str, initial_nodes: int, autoscaled: bool, min_nodes: int, max_nodes: int) -> TpuPoolPlan:
        return TpuPoolPlan(
            name=name,
            group=group.name,
            shape=shape,
            initial_nodes=initial_nodes,
            autoscaled=autoscaled,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            capacity=group.capacity_kind,
            reservation=reservation,
            zone=zone,
        )

    if not shape.multi_host:
        return [
            plan(
                name=group.name,
                initial_nodes=group.min_slices if group.autoscaled else group.slices,
                autoscaled=group.autoscaled,
                min_nodes=group.min_slices,
                max_nodes=group.slices,
            )
        ]
    plans = []
    for index in range(group.slices):
        # The first min_slices slices stay up; the rest scale between zero and a whole slice.
        scales = group.autoscaled and index >= group.min_slices
        plans.append(
            plan(
                name=f"{group.name}-{index}",
                initial_nodes=0 if scales else shape.hosts,
                autoscaled=scales,
                min_nodes=0 if scales else shape.hosts,
                max_nodes=shape.hosts,
            )
        )
    return plans
