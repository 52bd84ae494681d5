"""The one reader of the TPU labels Ray puts on each node (`ray.io/tpu-*`, from the TPU_NAME,
TPU_WORKER_ID, ... variables that GKE's TPU webhook sets). Everything that asks which slice a node
belongs to, or which worker of it it is, asks here, so a missing or malformed label means the same
thing everywhere: no worker id (None), which the inventory reports as an unexpected host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Ray's node label keys (ray._raylet.RAY_NODE_TPU_*_KEY).
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"


@dataclass(frozen=True)
class TpuNode:
    """One entry of `ray.nodes()`, as far as TPU placement cares."""

    node_id: str
    alive: bool
    pod_type: str | None
    slice_name: str | None
    worker_id: int | None  # None: no label, or not a whole number
    address: str

    def describe(self) -> str:
        worker = "?" if self.worker_id is None else self.worker_id
        return f"worker {worker} of slice {self.slice_name or '?'}"


def parse_worker_id(value: Any) -> int | None:
    """A `ray.io/tpu-worker-id` label value as a worker id, or None if it is not one (pure)."""
    text = str(value) if value is not None else ""
    return int(text) if text.isdigit() else None


def tpu_node(node: Mapping[str, Any]) -> TpuNode:
    """Read one `ray.nodes()` entry (pure)."""
    labels = node.get("Labels") or {}
    return TpuNode(
        node_id=str(node.get("NodeID", "")),
        alive=bool(node.get("Alive")),
        pod_type=labels.get(POD_TYPE_LABEL) or None,
        slice_name=labels.get(SLICE_NAME_LABEL) or None,
        worker_id=parse_worker_id(labels.get(WORKER_ID_LABEL)),
        address=str(node.get("NodeManagerAddress", "")),
    )


def alive_of_pod_type(nodes: list[Mapping[str, Any]] | tuple[Mapping[str, Any], ...], pod_type: str) -> list[TpuNode]:
    """The alive nodes of one TPU pod type (e.g. `v6e-16`), read (pure)."""
    return [n for n in map(tpu_node, nodes) if n.alive and n.pod_type == pod_type]
