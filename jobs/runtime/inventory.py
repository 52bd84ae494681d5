"""What TPU slices the Ray cluster has right now, and the bounded wait for whole idle ones.

A slice is whole when every worker id 0..hosts-1 is alive exactly once, and idle when none of its
hosts has chips in use (nor its head claimed). `SliceUnavailableError` says, when a bounded wait
runs out, what was asked and what the cluster has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra import catalog
from jobs.runtime.deadlines import Deadline
from jobs.runtime.labels import POD_TYPE_LABEL, tpu_node

# The default bound on waiting for whole idle slices (`--reserve-timeout`). Long enough for GKE to
# scale a multi-host TPU node pool up from zero: node provisioning, the TPU webhook and pulling a
# Ray+JAX image typically take 5-15 minutes; 30 leaves headroom.
DEFAULT_RESERVE_TIMEOUT_S = 1800.0


def missing_worker_ids(present: Iterable[int], hosts: int) -> tuple[int, ...]:
    """The worker ids 0..hosts-1 that are not present."""
    have = set(present)
    return tuple(i for i in range(hosts) if i not in have)


@dataclass(frozen=True)
class SliceInventory:
    """The alive hosts of one slice, as their labels describe them."""

    name: str
    worker_ids: tuple[int, ...]  # sorted, duplicates kept (two hosts claiming one id is a fault)
    hosts: int  # how many the shape needs
    busy_worker_ids: tuple[int, ...] = ()  # hosts with TPUs in use

    @property
    def missing(self) -> tuple[int, ...]:
        return missing_worker_ids(self.worker_ids, self.hosts)

    @property
    def unexpected(self) -> tuple[int, ...]:
        """Duplicated or out-of-range worker ids."""
        seen: set[int] = set()
        odd = []
        for wid in self.worker_ids:
            if wid in seen or not 0 <= wid < self.hosts:
                odd.append(wid)
            seen.add(wid)
        return tuple(odd)

    @property
    def complete(self) -> bool:
        return not self.missing and not self.unexpected

    @property
    def idle(self) -> bool:
        return self.complete and not self.busy_worker_ids

    def describe(self) -> str:
        ids = ",".join(map(str, self.worker_ids)) or "none"
        notes = []
        if self.missing:
            notes.append(f"missing worker id {','.join(map(str, self.missing))}")
        if self.unexpected:
            notes.append(f"unexpected worker id {','.join(map(str, self.unexpected))}")
        if not notes:
            notes.append("complete")
        if self.busy_worker_ids:
            notes.append(f"TPUs in use on worker id {','.join(map(str, self.busy_worker_ids))}")
        elif not self.missing and not self.unexpected:
            notes[-1] += ", idle"
        return f"slice {self.name} has hosts {ids} of {self.hosts} ({'; '.join(notes)})"


def slice_inventory(
    nodes: Sequence[Mapping[str, Any]],
    shape: catalog.SliceShape,
    available: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[SliceInventory, ...]:
    """Group the alive nodes of `shape`'s pod type by slice name (pure: takes `ray.nodes()` and,
    to tell busy hosts, the available resources per node id).

    A node's available resources omit a resource that is down to zero, so a host whose TPUs are
    all in use has no "TPU" entry: that counts as busy. (Ray's `get_num_ready_tpu_slices` reads the
    missing entry as all free, and so counts a fully used slice as idle.)
    """
    by_slice: dict[str, list[tuple[int, bool]]] = {}
    for node in nodes:
        host = tpu_node(node)
        if not host.alive or host.pod_type != shape.pod_type:
            continue
        name = host.slice_name or f"node {host.node_id[:12] or '?'}"
        wid = -1 if host.worker_id is None else host.worker_id  # -1: reported as unexpected
        free = (available or {}).get(host.node_id)
        totals = node.get("Resources") or {}
        # Busy: chips in use, or (worker 0) the slice's head claimed by another reservation.
        busy = free is not None and any(
            free.get(resource, 0) < amount for resource, amount in totals.items() if resource == "TPU" or resource.endswith("-head")
        )
        by_slice.setdefault(name, []).append((wid, busy))
    return tuple(
        SliceInventory(
            name,
            tuple(sorted(w for w, _ in hosts)),
            shape.hosts,
            tuple(sorted(w for w, busy in hosts if busy)),
        )
        for name, hosts in sorted(by_slice.items())
    )


def other_tpu_pod_types(nodes: Sequence[Mapping[str, Any]], shape: catalog.SliceShape) -> dict[str, int]:
    """Alive TPU hosts of other pod types, counted: a user asking for the wrong shape sees what there is."""
    counts: dict[str, int] = {}
    for host in map(tpu_node, nodes):
        if host.alive and host.pod_type and host.pod_type != shape.pod_type:
            counts[host.pod_type] = counts.get(host.pod_type, 0) + 1
    return dict(sorted(counts.items()))


def describe_unavailable(
    shape: catalog.SliceShape,
    slices: int,
    waited_s: float,
    stage: str,
    inventory: Sequence[SliceInventory],
    others: Mapping[str, int],
    ray_ready_slices: int | None = None,
) -> str:
    """The bounded-wait error: what was asked, how far we got, and what the cluster has (pure)."""
    complete = sum(1 for s in inventory if s.complete)
    idle = sum(1 for s in inventory if s.idle)
    ray_says = "" if ray_ready_slices is None else f" (ray.util.tpu.get_num_ready_tpu_slices: {ray_ready_slices})"
    lines = [
        f"could not reserve {slices} x {shape.generation.name} {shape.topology} slice(s) "
        f"(pod type {shape.pod_type}: {shape.chips} chips on {shape.hosts} x {shape.machine_type} each) "
        f"within {waited_s:.0f}s (--reserve-timeout): {stage}.",
        f"The cluster has {complete} complete {shape.pod_type} slice(s), {idle} idle{ray_says}:",
    ]
    lines += [f"  {s.describe()}" for s in inventory] or [f"  no alive host is labelled {POD_TYPE_LABEL}={shape.pod_type}"]
    if others:
        lines.append("  other TPU hosts: " + ", ".join(f"{n} x {t}" for t, n in others.items()))
    if any(s.missing for s in inventory):
        lines.append(
            "A slice with missing hosts is either still scaling up (GKE creates a slice's nodes together, "
            "then each Ray worker registers) or has lost a host; a longer --reserve-timeout helps the first."
        )
    elif complete and not idle:
        lines.append("Every complete slice is in use by another job; wait for it or raise --reserve-timeout.")
    return "\n".join(lines)


class SliceUnavailableError(TimeoutError):
    """The slices did not become free in time. The message names what is missing."""

    def __init__(self, message: str, inventory: tuple[SliceInventory, ...]):
        super().__init__(message)
        self.inventory = inventory

    @property
    def missing(self) -> dict[str, tuple[int, ...]]:
        return {s.name: s.missing for s in self.inventory if s.missing}


def cluster_inventory(shape: catalog.SliceShape) -> tuple[tuple[SliceInventory, ...], dict[str, int], list[dict]]:
    """The live inventory of `shape`'s slices, the other TPU pod types present, and `ray.nodes()`."""
    import ray

    nodes = ray.nodes()
    try:
        # Per-node availability has no public API; Ray's own TPU helpers read it the same way.
        from ray._private.state import available_resources_per_node

        available = available_resources_per_node()
    except Exception:  # unknown availability: every complete slice counts as idle
        available = None
    return slice_inventory(nodes, shape, available), other_tpu_pod_types(nodes, shape), nodes


def unavailable(shape: catalog.SliceShape, slices: int, waited_s: float, stage: str) -> SliceUnavailableError:
    from ray.util.tpu import get_num_ready_tpu_slices

    inventory, others, _ = cluster_inventory(shape)
    try:
        ray_ready: int | None = get_num_ready_tpu_slices(shape.topology, shape.generation.ray_accelerator_type)
    except Exception:  # diagnostics must not hide the real error
        ray_ready = None
    message = describe_unavailable(shape, slices, waited_s, stage, inventory, others, ray_ready)
    return SliceUnavailableError(message, inventory)


def wait_for_slices(shape: catalog.SliceShape, slices: int, timeout_s: float, poll_s: float = 1.0) -> None:
    """Wait (bounded) until `slices` whole idle slices exist, for code that reserves through someone
    else (Ray Train). Raises `SliceUnavailableError` with the inventory on timeout."""
    deadline = Deadline(timeout_s)
    while sum(1 for s in cluster_inventory(shape)[0] if s.idle) < slices:
        if deadline.expired():
            raise unavailable(shape, slices, deadline.elapsed(), f"fewer than {slices} whole idle slice(s)")
        deadline.sleep(poll_s)
