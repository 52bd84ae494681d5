"""The pure parts of slice reservation: inventories, the error message, host order, JAX processes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra import catalog
from jobs.runtime.inventory import SliceInventory, describe_unavailable, missing_worker_ids, other_tpu_pod_types, slice_inventory
from jobs.runtime.labels import POD_TYPE_LABEL, SLICE_NAME_LABEL, WORKER_ID_LABEL
from jobs.runtime.launch import jax_processes
from jobs.runtime.reservation import BundlePlacement, Host, ReservationError, order_hosts

V6E_4X4 = catalog.shape("v6e", "4x4")


def node(node_id, slice_name, worker_id, pod_type="v6e-16", alive=True, tpu=4, head=False):
    resources = {"TPU": float(tpu), "CPU": 1.0}
    if head:
        resources[f"TPU-{pod_type}-head"] = 1.0
    return {
        "NodeID": node_id,
        "Alive": alive,
        "Resources": resources,
        "Labels": {SLICE_NAME_LABEL: slice_name, WORKER_ID_LABEL: str(worker_id), POD_TYPE_LABEL: pod_type},
    }


def test_missing_worker_ids():
    assert missing_worker_ids([0, 1, 3], 4) == (2,)
    assert missing_worker_ids([], 2) == (0, 1)
    assert missing_worker_ids(range(4), 4) == ()


def test_inventory_says_which_hosts_a_slice_has_and_lacks():
    nodes = [node("a0", "tpu-a", 0, head=True), node("a1", "tpu-a", 1), node("a3", "tpu-a", 3)]
    nodes += [node(f"b{i}", "tpu-b", i, head=i == 0) for i in range(4)]
    nodes += [node("dead", "tpu-a", 2, alive=False), node("other", "tpu-c", 0, pod_type="v5litepod-16")]
    inventory = slice_inventory(nodes, V6E_4X4)
    assert [s.name for s in inventory] == ["tpu-a", "tpu-b"]
    a, b = inventory
    assert a.describe() == "slice tpu-a has hosts 0,1,3 of 4 (missing worker id 2)"
    assert a.missing == (2,) and not a.complete and not a.idle
    assert b.complete and b.idle and b.describe() == "slice tpu-b has hosts 0,1,2,3 of 4 (complete, idle)"
    assert other_tpu_pod_types(nodes, V6E_4X4) == {"v5litepod-16": 1}


def test_a_host_with_no_free_tpu_entry_is_busy():
    # Ray drops a resource from a node's available resources when it reaches zero.
    nodes = [node(f"b{i}", "tpu-b", i, head=i == 0) for i in range(4)]
    available = {f"b{i}": {"CPU": 1.0} for i in range(4)}
    available["b0"]["TPU-v6e-16-head"] = 1.0
    (b,) = slice_inventory(nodes, V6E_4X4, available)
    assert b.complete and not b.idle and b.busy_worker_ids == (0, 1, 2, 3)
    assert b.describe() == "slice tpu-b has hosts 0,1,2,3 of 4 (complete; TPUs in use on worker id 0,1,2,3)"
    # A claimed head with free chips (another reservation between its two steps) is busy too.
    available = {f"b{i}": {"TPU": 4.0} for i in range(4)}
    (b,) = slice_inventory(nodes, V6E_4X4, available)
    assert b.busy_worker_ids == (0,)
    # Unknown availability: a complete slice counts as idle.
    assert slice_inventory(nodes, V6E_4X4, None)[0].idle


def test_duplicate_and_unlabelled_worker_ids_are_unexpected():
    s = SliceInventory("x", (-1, 0, 1, 1, 2, 3), 4)
    assert s.unexpected == (-1, 1) and not s.complete
    assert "unexpected worker id -1,1" in s.describe()


def test_the_timeout_message_says_what_was_asked_and_what_there_is():
    inventory = (SliceInventory("tpu-a", (0, 1, 3), 4), SliceInventory("tpu-b", (0, 1, 2, 3), 4, (0, 1, 2, 3)))
    text = describe_unavailable(V6E_4X4, 2, 12.4, "only 0 of the 2 slice(s) needed are whole and idle", inventory, {"v5litepod-16": 3}, 1)
    assert text.startswith("could not reserve 2 x v6e 4x4 slice(s) (pod type v6e-16: 16 chips on 4 x ct6e-standard-4t each) within 12s")
    assert "The cluster has 1 complete v6e-16 slice(s), 0 idle (ray.util.tpu.get_num_ready_tpu_slices: 1):" in text
    assert "  slice tpu-a has hosts 0,1,3 of 4 (missing worker id 2)" in text
    assert "  slice tpu-b has hosts 0,1,2,3 of 4 (complete; TPUs in use on worker id 0,1,2,3)" in text
    assert "other TPU hosts: 3 x v5litepod-16" in text
    assert "--reserve-timeout" in text
    empty = describe_unavailable(V6E_4X4, 1, 5, "x", (), {})
    assert "no alive host is labelled ray.io/tpu-pod-type=v6e-16" in empty


def placements(slice_names, hosts, shuffle_seed):
    out = [BundlePlacement(0, name, wid, f"{name}-n{wid}", f"10.0.{s}.{wid}") for s, name in enumerate(slice_names) for wid in range(hosts)]
    random.Random(shuffle_seed).shuffle(out)
    return [BundlePlacement(i, p.slice_name, p.worker_id, p.node_id, p.address) for i, p in enumerate(out)]


@given(st.integers(1, 3), st.sampled_from([1, 2, 4, 8]), st.integers(0, 10_000))
def test_hosts_are_ordered_by_slice_then_worker_id_whatever_the_bundle_order(slices, hosts, seed):
    names = [f"s{i}" for i in range(slices)]
    ordered = order_hosts(placements(names, hosts, seed), names, hosts)
    assert [(h.slice_index, h.worker_id) for h in ordered] == [(s, w) for s in range(slices) for w in range(hosts)]
    assert [h.process_id for h in ordered] == list(range(slices * hosts))
    assert all(h.slice_name == names[h.slice_index] for h in ordered)


def test_order_hosts_rejects_a_placement_that_is_not_whole_slices():
    good = placements(["a"], 4, 0)
    with pytest.raises(ReservationError, match="got worker ids"):
        order_hosts([p for p in good if p.worker_id != 2], ["a"], 4)
    shared = [*good[:3], BundlePlacement(3, "a", 3, good[0].node_id, "x")]
    with pytest.raises(ReservationError, match="share a node"):
        order_hosts([p if p.worker_id != 3 else shared[3] for p in good], ["a"], 4)
    with pytest.raises(ReservationError, match="unclaimed"):
        order_hosts(good + [BundlePlacement(9, "z", 0, "zz", "y")], ["a"], 4)


def test_jax_processes_coordinate_on_worker_0_of_slice_0_with_megascale_for_several_slices():
    names = ["a", "b"]
    hosts = order_hosts(placements(names, 4, 3), names, 4)
    procs = jax_processes(hosts, 2, 8476)
    assert [p.process_id for p in procs] == list(range(8))
    assert {p.num_processes for p in procs} == {8}
    assert {p.coordinator_address for p in procs} == {"10.0.0.0:8476"}
    for p in procs:
        env = p.env_vars
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.0.0"
        assert env["MEGASCALE_NUM_SLICES"] == "2"
        assert env["MEGASCALE_SLICE_ID"] == str(p.slice_index)
    single = jax_processes(order_hosts(placements(["a"], 4, 1), ["a"], 4), 1, 1234)
    assert all(p.env == () for p in single)


def test_jax_processes_refuse_a_first_host_that_is_not_worker_0():
    with pytest.raises(ReservationError):
        jax_processes([Host(0, 0, "a", 1, 0, "n", "ip")], 1, 1)
