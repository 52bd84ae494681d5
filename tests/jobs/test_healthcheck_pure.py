"""The healthcheck's pure checks: the expected sum, bus bandwidth, and what makes a slice wrong."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from infra import catalog
from jobs.healthcheck import HostReport, allreduce_is_correct, bus_bandwidth, check, expected_sum, summarize

SHAPE = catalog.shape("v6e", "4x4")


def report(pid, **changes):
    base = HostReport(
        process_id=pid,
        slice_name="s",
        worker_id=pid,
        node_id=f"n{pid}",
        hostname="h",
        platform="cpu",
        device_kind="cpu",
        process_count=4,
        local_devices=4,
        global_devices=16,
        values=(136.0,),
        correct=True,
        latency_s=0.001 * (pid + 1),
        allreduce_s=0.01 * (pid + 1),
        payload_bytes=2**20,
    )
    return dataclasses.replace(base, **changes)


@given(st.integers(1, 4096))
def test_expected_sum_is_the_sum_of_device_indices_plus_one(n):
    assert expected_sum(n) == sum(range(1, n + 1))
    assert allreduce_is_correct([expected_sum(n)], n)
    assert not allreduce_is_correct([expected_sum(n) - 1], n)
    assert not allreduce_is_correct([], n)


def test_bus_bandwidth_follows_nccl_tests():
    assert bus_bandwidth(1000, 1.0, 16) == 1000 * 2 * 15 / 16
    assert bus_bandwidth(1000, 0.0, 16) == 0.0 and bus_bandwidth(1000, 1.0, 1) == 0.0


def test_a_whole_right_slice_passes_and_reports_the_slowest_host():
    result = summarize([report(i) for i in range(4)], SHAPE, 1, "t", 0.1)
    assert result.ok and result.correct and result.problems == ()
    assert (result.hosts, result.devices, result.expected_devices, result.expected_sum) == (4, 16, 16, 136)
    assert result.latency_s == 0.004 and result.allreduce_s == 0.04
    assert result.bus_bandwidth_bytes_per_s == bus_bandwidth(2**20, 0.04, 16)
    assert "healthcheck PASSED" in result.summary()


def test_what_makes_a_slice_fail():
    missing = check([report(i) for i in (0, 1, 3)], SHAPE, 1)
    assert "3 JAX processes reported, expected 4 (one per host)" in missing
    assert "slice s is missing worker id 2" in missing
    wrong = check([report(0, values=(135.0,), correct=False), *[report(i) for i in (1, 2, 3)]], SHAPE, 1)
    assert wrong == ("process 0 (s worker 0) holds [135.0] after the all-reduce, expected 136",)
    few = check([report(i, local_devices=2, global_devices=8) for i in range(4)], SHAPE, 1)
    assert any("sees 8 devices, expected 16" in p for p in few) and any("has 2 local devices" in p for p in few)
    same_node = check([report(i, node_id="n") for i in range(4)], SHAPE, 1)
    assert "two processes ran on the same node" in same_node
    failed = summarize([report(0, correct=False), *[report(i) for i in (1, 2, 3)]], SHAPE, 1, "t", 0.1)
    assert not failed.ok and not failed.correct and "FAILED" in failed.summary()
