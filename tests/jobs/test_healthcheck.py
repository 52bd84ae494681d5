"""The healthcheck against a simulated v6e 4x4 slice: 4 JAX processes x 4 CPU devices, real Ray."""

from __future__ import annotations

import json

import pytest

from infra import catalog
from jobs import healthcheck
from tests.jobs.sim import SHARED_SLICE

pytestmark = pytest.mark.cluster

SHAPE = catalog.shape("v6e", "4x4")
FLAGS = ["--generation", "v6e", "--topology", "4x4", "--payload-mb", "1", "--iters", "2"]


@pytest.fixture
def sim(shared_slice):
    return shared_slice


def test_all_reduce_over_16_devices_of_4_processes_is_right(sim, capsys):
    assert healthcheck.main([*FLAGS, "--reserve-timeout", "60"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.split("HEALTHCHECK ", 1)[1].splitlines()[0])
    assert result["ok"] and result["correct"] and result["problems"] == []
    assert result["hosts"] == 4 and result["devices"] == result["expected_devices"] == 16
    assert result["expected_sum"] == 16 * 17 / 2
    assert result["platform"] == "cpu"
    assert result["latency_s"] > 0 and result["bus_bandwidth_bytes_per_s"] > 0
    assert result["payload_bytes"] == 2**20
    assert "healthcheck PASSED" in out


def test_a_slice_missing_a_host_fails_with_the_missing_worker_id(sim, capsys):
    sim.remove_host(SHARED_SLICE, 3)
    assert healthcheck.main([*FLAGS, "--reserve-timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert "healthcheck FAILED" in err
    assert f"slice {SHARED_SLICE} has hosts 0,1,2 of 4 (missing worker id 3)" in err
