"""The one reader of Ray's TPU node labels: a missing or malformed worker id is None everywhere, and
what each reader built on it makes of that (the inventory: an unexpected host; the reruns' watch: -1)."""

from __future__ import annotations

import pytest

from infra import catalog
from jobs.runtime.inventory import slice_inventory
from jobs.runtime.labels import POD_TYPE_LABEL, SLICE_NAME_LABEL, WORKER_ID_LABEL, alive_of_pod_type, parse_worker_id, tpu_node
from jobs.runtime.reruns import watched_hosts

SHAPE = catalog.shape("v6e", "4x4")


def node(worker_id: str | None, *, alive: bool = True, slice_name: str = "tpu-a", pod_type: str = SHAPE.pod_type) -> dict:
    labels = {SLICE_NAME_LABEL: slice_name, POD_TYPE_LABEL: pod_type}
    if worker_id is not None:
        labels[WORKER_ID_LABEL] = worker_id
    return {"NodeID": f"n-{slice_name}-{worker_id}", "Alive": alive, "Labels": labels, "NodeManagerAddress": "10.0.0.9"}


@pytest.mark.parametrize(
    ("value", "expected"), [("0", 0), ("3", 3), ("12", 12), ("", None), (None, None), ("-1", None), ("x", None), ("1.5", None)]
)
def test_a_worker_id_is_a_whole_number_or_none(value, expected):
    assert parse_worker_id(value) == expected


def test_a_node_is_read_from_its_labels():
    read = tpu_node(node("2"))
    assert (read.node_id, read.alive, read.pod_type, read.slice_name, read.worker_id, read.address) == (
        "n-tpu-a-2",
        True,
        SHAPE.pod_type,
        "tpu-a",
        2,
        "10.0.0.9",
    )
    assert read.describe() == "worker 2 of slice tpu-a"


def test_a_node_without_tpu_labels_has_none_of_them():
    read = tpu_node({"NodeID": "head", "Alive": True})
    assert (read.pod_type, read.slice_name, read.worker_id) == (None, None, None)
    assert read.describe() == "worker ? of slice ?"


def test_only_alive_nodes_of_the_pod_type_are_kept():
    nodes = [node("0"), node("1", alive=False), node("2", pod_type="v5litepod-16"), {"NodeID": "head", "Alive": True}]
    assert [n.worker_id for n in alive_of_pod_type(nodes, SHAPE.pod_type)] == [0]


@pytest.mark.parametrize("bad", [None, "", "x", "-1"])
def test_every_reader_agrees_on_a_missing_or_bad_worker_id(bad):
    nodes = [node("0"), node("1"), node("2"), node(bad)]
    (inventory,) = slice_inventory(nodes, SHAPE)
    assert inventory.missing == (3,) and inventory.unexpected == (-1,) and not inventory.complete
    assert sorted(h.worker_id for h in watched_hosts(nodes, SHAPE)) == [-1, 0, 1, 2]
