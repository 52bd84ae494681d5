"""Slice reservation against a simulated cluster: two whole v6e 4x4 slices (8 hosts), real Ray.

The last tests remove hosts; they run in file order, after the ones that need whole slices.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import ray

from infra import catalog
from jobs.runtime.inventory import SliceUnavailableError
from jobs.runtime.launch import run_per_host
from jobs.runtime.reservation import reserve_slices
from tests.jobs.sim import simulated_cluster, slice_hosts

pytestmark = pytest.mark.cluster

SHAPE = catalog.shape("v6e", "4x4")
SLICES = ("sim-a", "sim-b")


@pytest.fixture(scope="module")
def sim():
    hosts = [h for name in SLICES for h in slice_hosts(SHAPE, name)]
    with simulated_cluster(hosts) as cluster:
        yield cluster


def live_placement_groups() -> dict[str, str]:
    return {pg_id: info["state"] for pg_id, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"}


def whoami(process):
    """Runs on each host: what the host itself says it is (the ground truth for the ordering)."""
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "tpu_name": os.environ["TPU_NAME"],
        "worker_id": int(os.environ["TPU_WORKER_ID"]),
        "process_id": process.process_id,
        "num_processes": process.num_processes,
        "coordinator": process.coordinator_address,
        "env": process.env_vars,
        "tpu_resources": ray.get_runtime_context().get_assigned_resources().get("TPU"),
    }


def test_a_reservation_lands_on_one_slice_one_task_per_distinct_host(sim):
    with reserve_slices(SHAPE, 1, timeout_s=30) as reservation:
        assert len(reservation.slice_names) == 1 and reservation.slice_names[0] in SLICES
        seen = run_per_host(reservation, whoami, timeout_s=60)
    assert len({s["node"] for s in seen}) == SHAPE.hosts  # every task on its own host
    assert {s["tpu_name"] for s in seen} == set(reservation.slice_names)  # all on the reserved slice
    # JAX process id = TPU worker id (one slice), whatever the bundle order was.
    assert [s["worker_id"] for s in seen] == [s["process_id"] for s in seen] == list(range(SHAPE.hosts))
    assert {s["num_processes"] for s in seen} == {SHAPE.hosts}
    assert {s["tpu_resources"] for s in seen} == {SHAPE.chips_per_host}  # all chips of the host
    coordinator_ip = reservation.coordinator.address
    assert all(s["coordinator"].startswith(coordinator_ip + ":") for s in seen)
    assert all(s["env"] == {} for s in seen)  # no MEGASCALE_* for one slice
    assert live_placement_groups() == {}


def test_two_concurrent_reservations_get_distinct_slices_and_a_third_waits_bounded(sim):
    names: dict[int, tuple[str, ...]] = {}
    errors: list[BaseException] = []
    both_held = threading.Barrier(2, timeout=60)

    def job(i):
        try:
            with reserve_slices(SHAPE, 1, timeout_s=30, name=f"job{i}") as reservation:
                names[i] = reservation.slice_names
                both_held.wait()  # hold until the other one holds its slice too
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not errors and len(names) == 2
    assert {names[0][0], names[1][0]} == set(SLICES)

    with reserve_slices(SHAPE, 1, timeout_s=30) as first, reserve_slices(SHAPE, 1, timeout_s=30) as second:
        assert first.slice_names != second.slice_names
        started = time.monotonic()
        with pytest.raises(SliceUnavailableError) as caught, reserve_slices(SHAPE, 1, timeout_s=2):
            pass
        assert time.monotonic() - started < 15  # bounded
        message = str(caught.value)
        assert "1 x v6e 4x4" in message and "2 complete v6e-16 slice(s), 0 idle" in message
        assert "slice sim-a has hosts 0,1,2,3 of 4 (complete; TPUs in use on worker id 0,1,2,3)" in message
    assert live_placement_groups() == {}


def test_two_slices_get_megascale_env_and_slice_major_process_ids(sim):
    with reserve_slices(SHAPE, 2, timeout_s=30) as reservation:
        assert sorted(reservation.slice_names) == sorted(SLICES)
        seen = run_per_host(reservation, whoami, timeout_s=60)
    assert len({s["node"] for s in seen}) == 2 * SHAPE.hosts
    for s in seen:
        slice_index = reservation.slice_names.index(s["tpu_name"])
        assert s["process_id"] == slice_index * SHAPE.hosts + s["worker_id"]
        assert s["env"]["MEGASCALE_NUM_SLICES"] == "2"
        assert s["env"]["MEGASCALE_SLICE_ID"] == str(slice_index)
        assert s["env"]["MEGASCALE_COORDINATOR_ADDRESS"] == reservation.coordinator.address
    assert live_placement_groups() == {}


def test_ctrl_c_inside_a_reservation_releases_it(sim):
    with pytest.raises(KeyboardInterrupt), reserve_slices(SHAPE, 2, timeout_s=30):
        assert len(live_placement_groups()) == 3  # two heads and the workers
        raise KeyboardInterrupt
    assert live_placement_groups() == {}


def test_missing_host_gives_bounded_error_naming_it_and_leaves_nothing(sim):
    sim.remove_host("sim-b", 2)
    started = time.monotonic()
    with pytest.raises(SliceUnavailableError) as caught, reserve_slices(SHAPE, 2, timeout_s=3):
        pass
    assert time.monotonic() - started < 20
    err = caught.value
    assert err.missing == {"sim-b": (2,)}
    message = str(err)
    assert "2 x v6e 4x4" in message  # what was asked
    assert "slice sim-b has hosts 0,1,3 of 4 (missing worker id 2)" in message
    assert "slice sim-a has hosts 0,1,2,3 of 4 (complete, idle)" in message
    assert "1 complete v6e-16 slice(s), 1 idle" in message
    assert live_placement_groups() == {}

    with reserve_slices(SHAPE, 1, timeout_s=30) as reservation:  # the whole one still works
        assert reservation.slice_names == ("sim-a",)
    assert live_placement_groups() == {}


def test_missing_worker_0_fails_at_the_head_and_leaves_nothing(sim):
    sim.remove_host("sim-b", 0)
    # Hold sim-a, so only sim-b could serve the second reservation.
    with reserve_slices(SHAPE, 1, timeout_s=30), pytest.raises(SliceUnavailableError) as caught, reserve_slices(SHAPE, 1, timeout_s=2):
        pass
    message = str(caught.value)
    assert "only 0 of the 1 slice(s) needed are whole and idle" in message
    assert "slice sim-b has hosts 1,3 of 4 (missing worker id 0,2)" in message
    assert caught.value.missing == {"sim-b": (0, 2)}
    assert live_placement_groups() == {}
