"""What GKE does to a preempted TPU node, done to one simulated host (`python -m jobs.local kill-host`),
and the notice itself, which the tests' clusters give their hosts the same way (tests/jobs/sim.py).

A preempted node's pod gets SIGTERM, and its `ray start --block` turns that into a drain of the node
with a deadline (ray/_private/node.py `_drain_node_before_shutdown`: a non-rejectable PREEMPTION
drain through the GCS), which Ray Train's workers read as `ray.train.get_preemption_info()`. kubelet
SIGKILLs whatever is left when the grace period ends. So `kill_host` SIGTERMs the host's `ray start`
(Ray drains it with the hosts' `RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`), sets the drain's deadline to
the notice given (a later drain request replaces an earlier one's deadline in the GCS: measured), and
leaves a background process that SIGKILLs the host's process group when the notice runs out and,
with `back_after_s`, starts a fresh host in its place that many seconds later, as the node pool
re-provisions the VM (`down` stops it, sleeping or running). With no notice, the host's group is
SIGKILLed at once: a host lost without warning, which the GCS learns from missed health checks.

The same SIGTERM and grace period stop every host when a RayJob is evicted (`jobs.local.preempt`:
`down(all_at_once=True)` is KubeRay deleting every pod at once), so both faults run through one
mechanism: Ray's drain on SIGTERM inside the pods' grace period (infra.disruption).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from jobs.local.cluster import STATE_FILE, LocalCluster, LocalNode, host_start
from jobs.local.env import ray_env, slice_name
from jobs.local.processes import alive
from jobs.runtime.auth import use_environment
from jobs.runtime.deadlines import Deadline
from jobs.runtime.labels import tpu_node

DRAIN_SEEN_S = 5.0  # how long to wait for Ray's own drain to register before giving the notice's deadline


class FaultError(RuntimeError):
    """The fault could not be delivered; the message says why."""


class FaultFlagError(FaultError):
    """A flag names no host of the cluster (a usage error: exit 2)."""


def give_notice(node_id: str, seconds: float) -> None:
    """Drain `node_id` (hex) for preemption with a deadline `seconds` from now, as `ray start --block`
    does on SIGTERM. Needs `ray.init()` done."""
    import ray
    from ray.core.generated import autoscaler_pb2

    deadline_ms = int((time.time() + seconds) * 1000)
    gcs = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
    accepted, why = gcs.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,  # type: ignore[attr-defined]
        f"preemption notice of {seconds:g} s (simulated)",
        deadline_ms,
        timeout=10,
    )
    if not accepted:  # a PREEMPTION drain is not rejectable; say so if it ever is
        raise FaultError(f"the GCS refused to drain node {node_id}: {why}")


def _find(cluster: LocalCluster, slice_index: int, host: int) -> LocalNode:
    if not 0 <= slice_index < cluster.slices:
        raise FaultFlagError(f"argument --slice: {slice_index} is not a slice of the cluster; it has slices 0..{cluster.slices - 1}")
    if not 0 <= host < cluster.shape.hosts:
        raise FaultFlagError(
            f"argument --host: {host} is not a host of a {cluster.shape.pod_type} slice; it has hosts 0..{cluster.shape.hosts - 1}"
        )
    name = slice_name(cluster.shape, slice_index)
    for node in cluster.nodes:
        if node.role == "host" and node.slice_name == name and node.worker_id == host and alive(node.pid):
            return node
    raise FaultError(f"{name} worker {host} is not running (`python -m jobs.local status` shows the hosts)")


def kill_host(state_dir: str | Path, slice_index: int, host: int, notice_s: float | None = None, back_after_s: float | None = None) -> str:
    """Preempt (with `notice_s`) or kill (without) one simulated host, and with `back_after_s` bring
    a fresh one back; returns once the host is signalled, saying what was done."""
    cluster = LocalCluster.load(state_dir)
    if cluster is None:
        raise FaultError(f"no local cluster in {state_dir}; start one with `python -m jobs.local up`")
    node = _find(cluster, slice_index, host)
    kill_at = time.time() + (notice_s or 0.0)
    if notice_s:
        _sigterm_with_notice(cluster, node, notice_s)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
    if notice_s or back_after_s is not None:
        _background(cluster, node, kill_at, back_after_s)
    what = f"preempted {node.describe()} with a {notice_s:g} s notice" if notice_s else f"killed {node.describe()} (no notice)"
    back = f"; a fresh host comes back {back_after_s:g} s after the kill" if back_after_s is not None else ""
    return what + back


def _sigterm_with_notice(cluster: LocalCluster, node: LocalNode, notice_s: float) -> None:
    """SIGTERM the host's `ray start` (Ray drains it with the hosts' configured timeout), then give
    the drain the notice's deadline once Ray's own request is in, so that the deadline the workers
    read is the notice's."""
    import ray

    sent = time.time()
    use_environment(ray_env(cluster.state_dir))
    ray.init(address=cluster.gcs_address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        node_id = next(
            (t.node_id for t in map(tpu_node, ray.nodes()) if t.alive and (t.slice_name, t.worker_id) == (node.slice_name, node.worker_id)),
            None,
        )
        if node_id is None:
            raise FaultError(f"{node.describe()} is not registered with the cluster's GCS")
        os.kill(node.pid, signal.SIGTERM)  # kubelet signals the container's first process
        seen = Deadline(DRAIN_SEEN_S)
        while node_id not in ray._private.state.state.get_draining_nodes() and not seen.expired() and alive(node.pid):
            seen.sleep(0.05)
        left = notice_s - (time.time() - sent)
        if left > 0 and alive(node.pid):
            give_notice(node_id, left)
    finally:
        ray.shutdown()


def _background(cluster: LocalCluster, node: LocalNode, kill_at: float, back_after_s: float | None) -> None:
    """Start the process that SIGKILLs the host at `kill_at` and, with `back_after_s`, brings a
    fresh one; registered in the cluster's state (so `down` stops it) when it will bring one."""
    log = Path(cluster.state_dir, "logs", f"{node.slice_name}-{node.worker_id}.fault.log")
    command = [sys.executable, "-m", "jobs.local.faults", "--state-dir", cluster.state_dir, "--pid", str(node.pid)]
    command += ["--kill-at", repr(kill_at), "--slice-name", str(node.slice_name), "--worker", str(node.worker_id)]
    if back_after_s is not None:
        command += ["--back-after", repr(back_after_s)]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    if back_after_s is not None:
        respawn = LocalNode("respawn", node.slice_name, node.worker_id, proc.pid, str(log))
        _save(replace(cluster, nodes=(*cluster.nodes, respawn)))


def _save(cluster: LocalCluster) -> None:
    path = Path(cluster.state_dir, STATE_FILE)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cluster), indent=2) + "\n")
    tmp.replace(path)


def _run_background(state_dir: str, pid: int, kill_at: float, name: str, worker: int, back_after_s: float | None) -> None:
    """The background half: SIGKILL the old host's group when the notice runs out (if Ray has not
    stopped it first), then become the fresh host (`exec` of its `ray start --block`)."""
    while time.time() < kill_at and alive(pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if back_after_s is None:
        return
    time.sleep(back_after_s)
    cluster = LocalCluster.load(state_dir)
    if cluster is None:  # `down` ran meanwhile
        return
    log = Path(state_dir, "logs", f"{name}-{worker}.log")
    me = LocalNode("host", name, worker, os.getpid(), str(log))
    kept = tuple(n for n in cluster.nodes if not (n.slice_name == name and n.worker_id == worker and n.role in ("host", "respawn")))
    _save(replace(cluster, nodes=(*kept, me)))
    args, env = host_start(cluster, name, worker)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats", *args]
    os.execve(sys.executable, command, env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.local.faults", description="(internal) the background half of kill-host")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--kill-at", type=float, required=True)
    p.add_argument("--slice-name", required=True)
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--back-after", type=float, default=None)
    a = p.parse_args(argv)
    _run_background(a.state_dir, a.pid, a.kill_at, a.slice_name, a.worker, a.back_after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
