"""Reserving whole TPU slices, and running one JAX process per host on them.

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
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from infra import catalog

from jobs.cli import DEFAULT_RESERVE_TIMEOUT_S

# Ray's node label keys (ray._raylet.RAY_NODE_TPU_*_KEY), set from TPU_NAME, TPU_WORKER_ID, ...
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"

# How long releasing may wait for the GCS to confirm the placement groups are gone.
RELEASE_WAIT_S = 10.0
# ...and for the chips to show free again (another job may take them first: then we stop waiting).
RESOURCES_BACK_WAIT_S = 2.0
# How often to look for whole idle slices while waiting, and how long one claim may take before
# we assume another job won the race for that head.
CLAIM_POLL_S = 0.5
CLAIM_ATTEMPT_S = 10.0


# --- what the cluster has ----------------------------------------------------------------------


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
        labels = node.get("Labels") or {}
        if not node.get("Alive") or labels.get(POD_TYPE_LABEL) != shape.pod_type:
            continue
        name = labels.get(SLICE_NAME_LABEL) or f"node {str(node.get('NodeID', '?'))[:12]}"
        try:
            wid = int(labels.get(WORKER_ID_LABEL, ""))
        except ValueError:
            wid = -1  # reported as unexpected
        free = (available or {}).get(node.get("NodeID", ""))
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
    for node in nodes:
        pod_type = (node.get("Labels") or {}).get(POD_TYPE_LABEL)
        if node.get("Alive") and pod_type and pod_type != shape.pod_type:
            counts[pod_type] = counts.get(pod_type, 0) + 1
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


def _unavailable(shape: catalog.SliceShape, slices: int, waited_s: float, stage: str) -> SliceUnavailableError:
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
    start = time.monotonic()
    while sum(1 for s in cluster_inventory(shape)[0] if s.idle) < slices:
        if time.monotonic() - start >= timeout_s:
            raise _unavailable(shape, slices, time.monotonic() - start, f"fewer than {slices} whole idle slice(s)")
        time.sleep(min(poll_s, max(0.0, timeout_s - (time.monotonic() - start))))


# --- the reservation ---------------------------------------------------------------------------


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
        Host(i, rank[p.slice_name], p.slice_name, p.worker_id, p.bundle_index, p.node_id, p.address)
        for i, p in enumerate(ordered)
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


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _slice_name_of(pg, nodes_by_id: Mapping[str, Mapping[str, Any]]) -> str:
    from ray.util import placement_group_table

    import ray

    node_id = placement_group_table(pg)["bundles_to_node_id"][0]
    node = nodes_by_id.get(node_id) or {n["NodeID"]: n for n in ray.nodes()}.get(node_id, {})  # newer than our list
    labels = node.get("Labels") or {}
    return labels.get(SLICE_NAME_LABEL) or node_id


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
    deadline = time.monotonic() + RELEASE_WAIT_S
    while ids and time.monotonic() < deadline:
        try:
            table = placement_group_table()
        except Exception:
            return
        ids = {i for i in ids if table.get(i, {}).get("state", "REMOVED") != "REMOVED"}
        if ids:
            time.sleep(0.02)
    deadline = time.monotonic() + RESOURCES_BACK_WAIT_S
    while held and time.monotonic() < deadline:
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
    import ray
    from ray.util.tpu import slice_placement_group

    start = time.monotonic()
    deadline = start + timeout_s
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
            raise _unavailable(shape, slices, time.monotonic() - start, str(err)) from None

        hosts = _hosts_of(handle, slice_names, shape, nodes_by_id)
        held = {h.node_id: float(shape.chips_per_host) for h in hosts}
        yield Reservation(shape, slices, tuple(dict.fromkeys(h.slice_name for h in hosts)), hosts, time.monotonic() - start, handle)
    finally:
        _release(heads, handle, held)


def _claim_heads(
    shape: catalog.SliceShape, slices: int, deadline: float, tag: str, heads: list[Any], nodes_by_id: dict[str, dict]
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
            attempt_deadline = min(deadline, time.monotonic() + CLAIM_ATTEMPT_S)
            if all(_wait_ready(pg, attempt_deadline) for pg in batch):
                return [_slice_name_of(pg, nodes_by_id) for pg in batch]
            # Another job claimed a candidate between our look and our claim: give back, look again.
            _release(batch, None)
            del heads[-len(batch) :]
            attempt += 1
            why = f"{slices} whole idle slice(s) were there, but their heads were claimed by others first"
        if _remaining(deadline) <= 0:
            raise TimeoutError(why)
        time.sleep(min(CLAIM_POLL_S, _remaining(deadline)))


def _wait_ready(pg: Any, deadline: float) -> bool:
    """Wait for a placement group through the GCS (no task, unlike `pg.ready()`), in short slices so
    that Ctrl-C is not stuck behind one long blocking call."""
    while True:
        if pg.wait(min(1.0, _remaining(deadline))):
            return True
        if _remaining(deadline) <= 0:
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
        node = nodes_by_id[node_id]
        labels = node.get("Labels") or {}
        placements.append(
            BundlePlacement(
                bundle_index=index,
                slice_name=labels.get(SLICE_NAME_LABEL) or node_id,
                worker_id=int(labels.get(WORKER_ID_LABEL, 0)),
                node_id=node_id,
                address=node["NodeManagerAddress"],
            )
        )
    if not slice_names:  # single-host slices: each host is its own slice
        slice_names = list(dict.fromkeys(p.slice_name for p in placements))
    return order_hosts(placements, slice_names, shape.hosts)


# --- one JAX process per host ------------------------------------------------------------------


@dataclass(frozen=True)
class JaxProcess:
    """What one host needs for `jax.distributed.initialize`, plus the multislice variables."""

    process_id: int
    num_processes: int
    coordinator_address: str  # "ip:port" of worker 0 of slice 0
    slice_index: int
    slice_name: str
    worker_id: int
    env: tuple[tuple[str, str], ...] = ()  # MEGASCALE_* for several slices

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(self.env)


def jax_processes(hosts: Sequence[Host], slices: int, coordinator_port: int) -> tuple[JaxProcess, ...]:
    """One `JaxProcess` per host: ids in host order, worker 0 of slice 0 coordinates (pure)."""
    from ray.util.tpu import get_tpu_coordinator_env_vars  # pure: builds a dict

    coordinator = hosts[0]
    if coordinator.slice_index != 0 or coordinator.worker_id != 0:
        raise ReservationError(f"the first host must be worker 0 of slice 0, got {coordinator}")
    out = []
    for host in hosts:
        env = get_tpu_coordinator_env_vars(coordinator.address, slices, host.slice_index) if slices > 1 else {}
        out.append(
            JaxProcess(
                process_id=host.process_id,
                num_processes=len(hosts),
                coordinator_address=f"{coordinator.address}:{coordinator_port}",
                slice_index=host.slice_index,
                slice_name=host.slice_name,
                worker_id=host.worker_id,
                env=tuple(sorted(env.items())),
            )
        )
    return tuple(out)


def initialize_jax(process: JaxProcess, timeout_s: int = 300) -> None:
    """Run inside the per-host task: join the JAX job described by `process` (bounded)."""
    os.environ.update(process.env_vars)
    import jax

    jax.distributed.initialize(
        coordinator_address=process.coordinator_address,
        num_processes=process.num_processes,
        process_id=process.process_id,
        initialization_timeout=int(timeout_s),
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def run_per_host(
    reservation: Reservation,
    fn: Callable[..., Any],
    *args: Any,
    timeout_s: float,
    step_timeout_s: float | None = None,
    runtime_env: Mapping[str, Any] | None = None,
    on_start: Callable[[Reservation, Sequence[JaxProcess]], None] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(process: JaxProcess, *args, **kwargs)` once on every reserved host, with all of its
    chips, and return the results in process order.

    Bounded three ways: the whole run by `timeout_s` (`TimeoutError`); silence by `step_timeout_s`,
    if given (`NoProgressError` when no host called `jobs.progress.beat()` for that long); and the
    first host to fail ends the run at once with that host's error, instead of waiting for the
    others, which are usually blocked in a collective with it. Every other task is then cancelled.
    `on_start(reservation, processes)` is called once the JAX processes are known.

    Each task runs in a fresh worker process (`max_calls=1`): `jax.distributed` can only be
    initialized once per process, and it must not leak into the next job's tasks.
    """
    import ray

    from jobs import progress
    from jobs.outcomes import NoProgressError

    deadline = time.monotonic() + timeout_s
    extra = {"runtime_env": dict(runtime_env)} if runtime_env else {}
    port_task = ray.remote(_free_port).options(**reservation.host_options(reservation.coordinator, resources={}))
    port = ray.get(port_task.remote(), timeout=_remaining(deadline))
    processes = jax_processes(reservation.hosts, reservation.slices, port)
    if on_start:
        on_start(reservation, processes)
    board = progress.start_board(len(processes)) if step_timeout_s else None
    # max_retries=0: Ray would otherwise rerun a dead host's task by itself on a recreated node, with
    # the old coordinator, while the driver reruns the whole slice; the driver owns retries.
    task = ray.remote(max_calls=1, max_retries=0)(_host_task)
    refs = [
        task.options(name=getattr(fn, "__name__", "host_task"), **reservation.host_options(host, **extra)).remote(
            board, fn, process, *args, **kwargs
        )
        for host, process in zip(reservation.hosts, processes)
    ]
    running = dict(zip(refs, range(len(refs))))  # ref -> process id
    try:
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=min(1.0, _remaining(deadline)))
            for ref in ready:
                ray.get(ref)  # raises now if this host failed
                del running[ref]
            if ready:
                continue
            if _remaining(deadline) <= 0:
                raise TimeoutError(f"the per-host tasks did not finish within {timeout_s:.0f}s")
            if board is not None:
                silent = progress.stalled(ray.get(board.silence.remote(), timeout=30), running.values(), step_timeout_s)
                if silent:
                    where = [f"worker {h.worker_id} of slice {h.slice_name}" for h in reservation.hosts]
                    raise NoProgressError(progress.describe_silence(silent, step_timeout_s, where))
        return ray.get(refs, timeout=30)
    except BaseException:
        for ref in refs:  # one host failed, a bound ran out, or Ctrl-C: free the others
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        if board is not None:
            progress.stop_board(board)


def _host_task(board: Any, fn: Callable[..., Any], process: JaxProcess, *args: Any, **kwargs: Any) -> Any:
    """What runs on each host: connect `jobs.progress.beat()` to the run's board, then the job."""
    from jobs import progress

    progress.attach(board, process.process_id)
    return fn(process, *args, **kwargs)
