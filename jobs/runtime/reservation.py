"""Reserving whole TPU slices atomically, and always releasing them.

`reserve_slices(shape, slices, timeout_s)` is a context manager around
`ray.util.tpu.slice_placement_group`: it yields a `Reservation` (the hosts, sorted the way JAX wants
them) and always releases it, on success, on error and on Ctrl-C.

How a slice is claimed, and why we claim its head ourselves: Ray marks worker 0 of each multi-host
slice with a `TPU-<pod type>-head` resource. A one-bundle placement group on that resource claims
the slice exclusively; a second placement group, one bundle per host, label-selected on that slice's
`ray.io/tpu-slice-name`, then gang-schedules its hosts. `slice_placement_group` does the same, but
(a) its head claim may land on any free head, including that of a slice which has lost a host or
whose hosts another job uses, and then waits for hosts that never come while a whole slice sits
idle; (b) it reads the slice name by running a task (an unbounded `ray.get`, and a worker start:
~0.1-1 s); (c) it gives every slice the whole timeout. So we look at the inventory first and claim
only heads of slices that are whole and idle (`ray.io/tpu-slice-name in (...)`), with one shared
deadline, read the slice name from the node's labels, and hand the names to
`slice_placement_group` through `bundle_label_selector`, which then creates only the worker
placement group. The head placement groups are kept until the work is done: releasing them earlier
would let another job claim a slice whose hosts we are using (its head would look free).

Bundle index is not the TPU worker id: Ray may put bundle 0 on any host of the slice. JAX process
ids follow (slice index, `ray.io/tpu-worker-id`), so the coordinator is worker 0 of slice 0.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra import catalog
from jobs.runtime.deadlines import Deadline
from jobs.runtime.inventory import DEFAULT_RESERVE_TIMEOUT_S, cluster_inventory, unavailable
from jobs.runtime.labels import POD_TYPE_LABEL, SLICE_NAME_LABEL, WORKER_ID_LABEL, tpu_node

# How long releasing may wait for the GCS to confirm the placement groups are gone.
RELEASE_WAIT_S = 10.0
# ...and for the chips to show free again (another job may take them first: then we stop waiting).
RESOURCES_BACK_WAIT_S = 2.0
# How often to look for whole idle slices while waiting, and how long one claim may take before
# we assume another job won the race for that head.
CLAIM_POLL_S = 0.5
CLAIM_ATTEMPT_S = 10.0


@dataclass(frozen=True)
class Host:
    """One reserved host, in JAX process order."""

    process_id: int
    slice_index: int
    slice_name: str
    worker_id: int  # ray.io/tpu-worker-id
    bundle_index: int  # in the worker placement group; not the worker id
    node_id: str
    address: str  # the node's IP


@dataclass(frozen=True)
class BundlePlacement:
    """Where Ray put one bundle (the raw material of `order_hosts`)."""

    bundle_index: int
    slice_name: str
    worker_id: int
    node_id: str
    address: str


class ReservationError(RuntimeError):
    """The placement group landed somewhere that is not a whole slice (labels are inconsistent)."""


def order_hosts(placements: Sequence[BundlePlacement], slice_names: Sequence[str], hosts_per_slice: int) -> tuple[Host, ...]:
    """Sort bundles by (slice, worker id) and check each slice got each worker id once, on distinct nodes."""
    problems = []
    for index, name in enumerate(slice_names):
        ids = [p.worker_id for p in placements if p.slice_name == name]
        if sorted(ids) != list(range(hosts_per_slice)):
            problems.append(f"slice {index} ({name}) got worker ids {sorted(ids)}, expected 0..{hosts_per_slice - 1}")
    strays = sorted({p.slice_name for p in placements} - set(slice_names))
    if strays:
        problems.append(f"bundles landed on unclaimed slice(s) {', '.join(strays)}")
    nodes = [p.node_id for p in placements]
    if len(set(nodes)) != len(nodes):
        problems.append("two bundles share a node")
    if problems:
        raise ReservationError("; ".join(problems))
    rank = {name: i for i, name in enumerate(slice_names)}
    ordered = sorted(placements, key=lambda p: (rank[p.slice_name], p.worker_id))
    return tuple(
        Host(i, rank[p.slice_name], p.slice_name, p.worker_id, p.bundle_index, p.node_id, p.address) for i, p in enumerate(ordered)
    )


@dataclass(frozen=True)
class Reservation:
    """Reserved slices. `hosts` is in JAX process order; `hosts[0]` is the coordinator."""

    shape: catalog.SliceShape
    slices: int
    slice_names: tuple[str, ...]
    hosts: tuple[Host, ...]
    ready_s: float  # from the call to ready placement groups
    handle: Any = field(repr=False)  # ray.util.tpu.SlicePlacementGroup

    @property
    def placement_group(self):
        return self.handle.placement_group

    @property
    def coordinator(self) -> Host:
        return self.hosts[0]

    def host_options(self, host: Host, **options: Any) -> dict[str, Any]:
        """`.options(...)` that pin a task or actor to `host` with all of its chips."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        merged: dict[str, Any] = {"num_cpus": 0, "resources": {"TPU": self.shape.chips_per_host}}
        merged.update(options)
        merged["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group, placement_group_bundle_index=host.bundle_index
        )
        return merged


def _slice_name_of(pg, nodes_by_id: Mapping[str, Mapping[str, Any]]) -> str:
    import ray
    from ray.util import placement_group_table

    node_id = placement_group_table(pg)["bundles_to_node_id"][0]
    node = nodes_by_id.get(node_id) or {n["NodeID"]: n for n in ray.nodes()}.get(node_id, {})  # newer than our list
    return tpu_node(node).slice_name or node_id


def _release(groups: Sequence[Any], handle: Any, held: Mapping[str, float] | None = None) -> None:
    """Remove every placement group we created and wait (bounded) until the GCS says they are gone
    and the `held` hosts (node id -> TPUs) have their chips back, so the next reservation, or a
    check of `placement_group_table()`, sees a clean cluster. (A placement group created before the
    chips are back waits for Ray's rescheduling backoff: about a second instead of 10 ms.)"""
    from ray.util import placement_group_table, remove_placement_group

    if handle is not None:
        with contextlib.suppress(Exception):
            groups = [*groups, handle.placement_group]
        handle.shutdown()
    ids = set()
    for pg in groups:
        with contextlib.suppress(Exception):  # already removed, or Ray is shutting down
            remove_placement_group(pg)
        ids.add(pg.id.hex())
    deadline = Deadline(RELEASE_WAIT_S)
    while ids and not deadline.expired():
        try:
            table = placement_group_table()
        except Exception:
            return
        ids = {i for i in ids if table.get(i, {}).get("state", "REMOVED") != "REMOVED"}
        if ids:
            time.sleep(0.02)
    deadline = Deadline(RESOURCES_BACK_WAIT_S)
    while held and not deadline.expired():
        try:
            from ray._private.state import available_resources_per_node  # no public per-node view

            free = available_resources_per_node()
        except Exception:
            return
        held = {n: tpus for n, tpus in held.items() if n in free and free[n].get("TPU", 0) < tpus}
        if held:
            time.sleep(0.02)


@contextlib.contextmanager
def reserve_slices(
    shape: catalog.SliceShape,
    slices: int = 1,
    timeout_s: float = DEFAULT_RESERVE_TIMEOUT_S,
    name: str = "jobs",
) -> Iterator[Reservation]:
    """Reserve `slices` whole slices of `shape` within `timeout_s`, yield them, always release them.

    Raises `SliceUnavailableError` (after releasing what it held) when they are not free in time.
    """
    from ray.util.tpu import slice_placement_group

    deadline = Deadline(timeout_s)
    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    heads: list[Any] = []  # appended as soon as created, so every exit path releases them
    handle = None
    held: dict[str, float] = {}
    try:
        try:
            nodes_by_id: dict[str, dict] = {}  # filled by the inventory, reused for the labels below
            slice_names = _claim_heads(shape, slices, deadline, tag, heads, nodes_by_id) if shape.multi_host else []
            # The pod type keeps single-host bundles off other shapes with as many chips per host.
            selectors = (
                [{SLICE_NAME_LABEL: n, POD_TYPE_LABEL: shape.pod_type} for n in slice_names for _ in range(shape.hosts)]
                if slice_names
                else [{POD_TYPE_LABEL: shape.pod_type} for _ in range(shape.hosts * slices)]
            )
            handle = slice_placement_group(
                shape.topology,
                shape.generation.ray_version,
                num_slices=slices,
                chips_per_vm=shape.chips_per_host,
                bundle_label_selector=selectors,
                name=tag,
            )
            if not _wait_ready(handle.placement_group, deadline):
                claimed = f"claimed {', '.join(slice_names)}, but " if slice_names else ""
                raise TimeoutError(f"{claimed}not every host became free")
        except TimeoutError as err:
            _release(heads, handle)
            heads, handle = [], None
            raise unavailable(shape, slices, deadline.elapsed(), str(err)) from None

        hosts = _hosts_of(handle, slice_names, shape, nodes_by_id)
        held = {h.node_id: float(shape.chips_per_host) for h in hosts}
        yield Reservation(shape, slices, tuple(dict.fromkeys(h.slice_name for h in hosts)), hosts, deadline.elapsed(), handle)
    finally:
        _release(heads, handle, held)


def _claim_heads(
    shape: catalog.SliceShape, slices: int, deadline: Deadline, tag: str, heads: list[Any], nodes_by_id: dict[str, dict]
) -> list[str]:
    """Claim the heads of `slices` whole idle slices; return their names.

    Only slices that are whole and idle right now are candidates (`ray.io/tpu-slice-name in (...)`):
    an unrestricted claim can land on the free head of a slice that has lost a host, or whose hosts
    another job is using, and then wait for hosts that never come while a good slice sits idle.
    Candidates are looked for again until the deadline (GKE adds a scaling slice's hosts one by one).
    """
    from ray.util.placement_group import placement_group

    head = {f"TPU-{shape.pod_type}-head": 1}
    attempt = 0
    why = ""
    while True:
        inventory, _, nodes = cluster_inventory(shape)
        nodes_by_id.clear()
        nodes_by_id.update((n["NodeID"], n) for n in nodes)
        candidates = [s.name for s in inventory if s.idle]
        why = f"only {len(candidates)} of the {slices} slice(s) needed are whole and idle"
        if len(candidates) >= slices:
            where = {WORKER_ID_LABEL: "0", POD_TYPE_LABEL: shape.pod_type, SLICE_NAME_LABEL: f"in({','.join(candidates)})"}
            batch = [placement_group([head], bundle_label_selector=[where], name=f"{tag}-head-{attempt}-{i}") for i in range(slices)]
            heads.extend(batch)
            attempt_deadline = Deadline(min(deadline.remaining(), CLAIM_ATTEMPT_S))
            if all(_wait_ready(pg, attempt_deadline) for pg in batch):
                return [_slice_name_of(pg, nodes_by_id) for pg in batch]
            # Another job claimed a candidate between our look and our claim: give back, look again.
            _release(batch, None)
            del heads[-len(batch) :]
            attempt += 1
            why = f"{slices} whole idle slice(s) were there, but their heads were claimed by others first"
        if deadline.expired():
            raise TimeoutError(why)
        deadline.sleep(CLAIM_POLL_S)


def _wait_ready(pg: Any, deadline: Deadline) -> bool:
    """Wait for a placement group through the GCS (no task, unlike `pg.ready()`), in short slices so
    that Ctrl-C is not stuck behind one long blocking call."""
    while True:
        if pg.wait(min(1.0, deadline.remaining())):
            return True
        if deadline.expired():
            return False


def _hosts_of(
    handle: Any, slice_names: Sequence[str], shape: catalog.SliceShape, nodes_by_id: Mapping[str, Mapping[str, Any]]
) -> tuple[Host, ...]:
    import ray
    from ray.util import placement_group_table

    bundles = placement_group_table(handle.placement_group)["bundles_to_node_id"]
    if any(node_id not in nodes_by_id for node_id in bundles.values()):  # a node newer than our list
        nodes_by_id = {n["NodeID"]: n for n in ray.nodes()}
    placements = []
    for index, node_id in sorted(bundles.items()):
        host = tpu_node(nodes_by_id[node_id])
        placements.append(
            BundlePlacement(
                bundle_index=index,
                slice_name=host.slice_name or node_id,
                # A host without a worker id is an unexpected one: order_hosts refuses the placement.
                worker_id=-1 if host.worker_id is None else host.worker_id,
                node_id=node_id,
                address=host.address,
            )
        )
    if not slice_names:  # single-host slices: each host is its own slice
        slice_names = list(dict.fromkeys(p.slice_name for p in placements))
    return order_hosts(placements, slice_names, shape.hosts)
