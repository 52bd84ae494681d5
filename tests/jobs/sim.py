"""Simulated TPU slices on `ray.cluster_utils.Cluster`, for the tests.

Each simulated host is a raylet started with the environment `jobs.local.host_env` gives it (what
GKE's TPU webhook injects, plus JAX on CPU) and `resources={"TPU": chips_per_host}`, so Ray derives
the same labels and `TPU-<pod>-head` resource it would on GKE. Real Ray, real JAX.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from infra import catalog
from jobs.local import host_env
from jobs.local.faults import give_notice
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

    def preempt_host(
        self, host: SimHost, notice_s: float, back_after_s: float | None = None, kill_after_s: float | None = None
    ) -> threading.Thread:
        """What GKE does to a preempted node, as `python -m jobs.local kill-host --notice` does it (the
        same `give_notice`): a preemption drain of the host with the notice's deadline, then SIGKILL
        of whatever is left when it runs out (a drained host whose work has ended stops by itself
        first), in the background; the thread doing that is returned. `kill_after_s` (default: the
        notice) stops it later than Ray's drain deadline says, as a pod's grace period longer than
        its drain would. With `back_after_s`, this waits for the kill and starts a fresh host that
        long after it (on this thread: Ray's nodes start on the main thread only)."""
        node = self.nodes[(host.slice_name, host.worker_id)]
        give_notice(node.node_id, notice_s)  # type: ignore[attr-defined]
        kill_at = time.monotonic() + (notice_s if kill_after_s is None else kill_after_s)

        def rest() -> None:
            while time.monotonic() < kill_at and not any(t == "raylet" for t, _ in node.dead_processes()):  # type: ignore[attr-defined]
                time.sleep(0.1)
            self.cluster.remove_node(self.nodes.pop((host.slice_name, host.worker_id)), allow_graceful=False)

        thread = threading.Thread(target=rest, daemon=True)
        thread.start()
        if back_after_s is not None:
            thread.join()
            time.sleep(back_after_s)
            self.add_host(host)
        return thread

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
def simulated_cluster(hosts: Sequence[SimHost], head_cpus: int = 4, system_config: dict | None = None) -> Iterator[SimCluster]:
    """Start a head plus one raylet per host, connect the driver (from whatever cluster it was
    connected to: `shared_slice` reconnects it), and always tear it all down. `system_config`: Ray
    settings of the head (e.g. `infra.disruption.HEALTH.system_config()`, the manifests' health checks)."""
    ray.shutdown()
    use_test_token()
    head = {"num_cpus": head_cpus, "object_store_memory": 128 * 2**20, **({"_system_config": system_config} if system_config else {})}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    sim = SimCluster(cluster)
    try:
        for host in hosts:
            sim.add_host(host)
        ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
        yield sim
    finally:
        ray.shutdown()
        cluster.shutdown()
