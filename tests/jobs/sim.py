"""Simulated TPU slices on `ray.cluster_utils.Cluster`, for the tests.

Each simulated host is a raylet started with the environment `jobs.local.host_env` gives it (what
GKE's TPU webhook injects, plus JAX on CPU) and `resources={"TPU": chips_per_host}`, so Ray derives
the same labels and `TPU-<pod>-head` resource it would on GKE. Real Ray, real JAX.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from infra import catalog
from jobs.local import host_env
from jobs.runtime.auth import use_token

# The one whole slice the cluster tests share (tests/jobs/conftest.py: `shared_slice`).
SHARED_SHAPE = catalog.shape("v6e", "4x4")
SHARED_SLICE = "sim-4x4"


@dataclass(frozen=True)
class SimHost:
    shape: catalog.SliceShape
    slice_name: str
    worker_id: int


def slice_hosts(shape: catalog.SliceShape, name: str, worker_ids: Sequence[int] | None = None) -> list[SimHost]:
    ids = range(shape.hosts) if worker_ids is None else worker_ids
    return [SimHost(shape, name, w) for w in ids]


@dataclass
class SimCluster:
    cluster: Cluster
    nodes: dict[tuple[str, int], object] = field(default_factory=dict)  # (slice, worker id) -> Node

    def remove_host(self, slice_name: str, worker_id: int) -> None:
        self.cluster.remove_node(self.nodes.pop((slice_name, worker_id)))

    def kill_host(self, slice_name: str, worker_id: int, graceful: bool = False) -> None:
        """SIGKILL the host's raylet and its workers, as when a TPU VM dies without notice (the GCS
        learns it from missed health checks); `graceful`: SIGTERM instead, as a preempted GKE node's
        pods get on the preemption notice (kubelet's graceful node shutdown: 15 s for them, the VM
        stopped 30 s after the notice; GKE docs, "Spot VMs" and "preemptible VMs", read 2026-12-05),
        so the raylet leaves the cluster itself."""
        self.cluster.remove_node(self.nodes.pop((slice_name, worker_id)), allow_graceful=graceful)

    def add_host(self, host: SimHost) -> None:
        """Start a raylet for `host` (GKE recreating a lost TPU VM with the same name and id)."""
        env = host_env(host.shape, host.slice_name, host.worker_id)
        # The raylet (and every worker it starts) inherits the environment at this moment.
        with patched_environ(env):
            node = self.cluster.add_node(num_cpus=2, resources={"TPU": host.shape.chips_per_host}, object_store_memory=96 * 2**20)
        self.nodes[(host.slice_name, host.worker_id)] = node


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then restore what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_test_token: list[Path] = []  # the token file of the test clusters (tests/jobs/conftest.py: ray_tmp)


def set_test_token(path: Path) -> None:
    _test_token[:] = [path]


def use_test_token() -> None:
    """Point this process (and the nodes it starts next) at the test clusters' token."""
    if _test_token:
        use_token(token_path=str(_test_token[0]))


@contextlib.contextmanager
def simulated_cluster(hosts: Sequence[SimHost], head_cpus: int = 4) -> Iterator[SimCluster]:
    """Start a head plus one raylet per host, connect the driver (from whatever cluster it was
    connected to: `shared_slice` reconnects it), and always tear it all down."""
    ray.shutdown()
    use_test_token()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "object_store_memory": 128 * 2**20})
    sim = SimCluster(cluster)
    try:
        for host in hosts:
            sim.add_host(host)
        ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
        yield sim
    finally:
        ray.shutdown()
        cluster.shutdown()
