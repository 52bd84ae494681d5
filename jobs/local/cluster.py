"""Start, inspect and stop the simulated slices: a real local Ray cluster, one raylet per host
(`jobs.local` says how a simulated host passes for a TPU host, and where its files live)."""

from __future__ import annotations

import functools
import json
import logging
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from infra import catalog, disruption
from jobs import REPO_ROOT
from jobs.local.env import clean_base_env, cpu_jax_env, host_env, ray_env, slice_name, state_dir_problem, write_token
from jobs.local.processes import alive, ray_start, stop_groups, tail
from jobs.runtime.auth import use_environment
from jobs.runtime.deadlines import Deadline
from jobs.runtime.inventory import SliceInventory, slice_inventory
from jobs.runtime.labels import tpu_node
from jobs.runtime.net import free_port, port_open

DEFAULT_STATE_DIR = REPO_ROOT / "build" / "local-ray"
STATE_FILE = "cluster.json"


class LocalClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped. The message says what to do."""


@dataclass(frozen=True)
class LocalNode:
    role: str  # "head", "host", or "respawn" (a host coming back after kill-host --back-after)
    slice_name: str | None
    worker_id: int | None
    pid: int  # of `ray start --block`, which leads its own process group
    log: str

    def describe(self) -> str:
        if self.role == "head":
            return "head"
        return f"{self.slice_name} worker {self.worker_id}" + (" (coming back)" if self.role == "respawn" else "")


@dataclass(frozen=True)
class LocalCluster:
    state_dir: str
    ray_temp_dir: str
    gcs_address: str
    dashboard_url: str
    generation: str
    topology: str
    chips_per_host: int
    slices: int
    nodes: tuple[LocalNode, ...]
    host_cpus: int = 2
    object_store_mb: int = 128

    @property
    def shape(self) -> catalog.SliceShape:
        return catalog.shape(self.generation, self.topology, self.chips_per_host)

    @property
    def storage_path(self) -> str:
        """Where Ray Train checkpoints go: every simulated host shares this filesystem."""
        return str(Path(self.state_dir) / "checkpoints")

    @property
    def compilation_cache_path(self) -> str:
        """JAX's persistent compilation cache of every job on the simulation (jobs.runtime.compile_cache)."""
        return str(Path(self.state_dir) / "xla-cache")

    def save(self) -> None:
        data = asdict(self)
        Path(self.state_dir, STATE_FILE).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: str | Path) -> LocalCluster | None:
        path = Path(state_dir, STATE_FILE)
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        data["nodes"] = tuple(LocalNode(**n) for n in data["nodes"])
        return cls(**data)


def _wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = Deadline(timeout_s)
    while not check():
        if proc.poll() is not None:
            raise LocalClusterError(f"the raylet for {what} exited with status {proc.returncode}; last lines of {log}:\n{tail(log)}")
        if deadline.expired():
            raise LocalClusterError(f"the raylet for {what} did not register within {timeout_s:g}s; last lines of {log}:\n{tail(log)}")
        deadline.sleep(0.2)


def up(
    shape: catalog.SliceShape,
    slices: int = 1,
    state_dir: str | Path = DEFAULT_STATE_DIR,
    node_timeout_s: float = 90.0,
    head_timeout_s: float = 90.0,
    host_cpus: int = 2,
    head_cpus: int = 4,
    object_store_mb: int = 128,
    progress: Callable[[str], None] = lambda message: None,
) -> LocalCluster:
    """Start the head and one raylet per simulated host, each waited for (bounded); on failure,
    or Ctrl-C, every process started is stopped before the error propagates."""
    import ray

    state_dir = Path(state_dir).resolve()
    existing = LocalCluster.load(state_dir)
    if existing and any(alive(n.pid) for n in existing.nodes):
        raise LocalClusterError(
            f"a local cluster is already running from {state_dir} ({existing.slices} x {existing.generation} "
            f"{existing.topology}); `python -m jobs.local status` shows it, `python -m jobs.local down` stops it"
        )
    temp_dir = state_dir / "ray"
    problem = state_dir_problem(state_dir)
    if problem:
        raise LocalClusterError(problem)
    try:
        (state_dir / "logs").mkdir(parents=True, exist_ok=True)
        temp_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise LocalClusterError(f"cannot create {err.filename or state_dir}: {err.strerror}; pass another --state-dir") from None
    Path(state_dir, STATE_FILE).unlink(missing_ok=True)
    write_token(state_dir)  # a new token per cluster: a client of the last one is refused

    gcs_port, dashboard_port, client_port = free_port(), free_port(), free_port()
    gcs_address = f"127.0.0.1:{gcs_port}"
    base = _base_env(state_dir)
    cluster = LocalCluster(
        state_dir=str(state_dir),
        ray_temp_dir=str(temp_dir),
        gcs_address=gcs_address,
        dashboard_url=f"http://127.0.0.1:{dashboard_port}",
        generation=shape.generation.name,
        topology=shape.topology,
        chips_per_host=shape.chips_per_host,
        slices=slices,
        nodes=(),
        host_cpus=host_cpus,
        object_store_mb=object_store_mb,
    )
    common = _common_args(cluster)
    procs: list[subprocess.Popen] = []
    nodes: list[LocalNode] = []
    connected = False
    try:
        progress(f"starting the head node (dashboard {cluster.dashboard_url})")
        log = state_dir / "logs" / "head.log"
        head_env = {
            **base,
            # The head's `ray start` need not drain (its GCS goes with it), and the GCS declares a
            # vanished host dead within seconds, as the manifests' heads do (infra.disruption).
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            **disruption.HEALTH.env(),
            **cpu_jax_env(shape),
            "JOBS_STORAGE_PATH": cluster.storage_path,
            "JOBS_COMPILATION_CACHE": cluster.compilation_cache_path,
        }
        head_args = [
            "--head",
            f"--port={gcs_port}",
            f"--ray-client-server-port={client_port}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--num-cpus={head_cpus}",
            *common,
        ]
        procs.append(ray_start(head_args, head_env, log))
        nodes.append(LocalNode("head", None, None, procs[-1].pid, str(log)))
        _wait_for("the head", lambda: port_open(gcs_port), procs[-1], log, head_timeout_s)
        use_environment(ray_env(state_dir))
        ray.init(address=gcs_address, logging_level=logging.WARNING, log_to_driver=False)
        connected = True
        for s in range(slices):
            name = slice_name(shape, s)
            for w in range(shape.hosts):
                progress(f"starting host {name} worker {w} ({s * shape.hosts + w + 1}/{slices * shape.hosts})")
                log = state_dir / "logs" / f"{name}-{w}.log"
                procs.append(ray_start(*host_start(cluster, name, w), log))
                nodes.append(LocalNode("host", name, w, procs[-1].pid, str(log)))
                _wait_for(f"{name} worker {w}", functools.partial(_registered, name, w), procs[-1], log, node_timeout_s)
        cluster = LocalCluster(**{**asdict(cluster), "nodes": tuple(nodes)})
        cluster.save()
        return cluster
    except BaseException:
        stop_groups([p.pid for p in reversed(procs)], grace_s=10)
        raise
    finally:
        if connected:
            ray.shutdown()


def _base_env(state_dir: str | Path) -> dict[str, str]:
    return {
        **clean_base_env(),
        **ray_env(state_dir),
        # SIGTERM (a preemption notice, an eviction) drains a host as on GKE: inside the TPU pods'
        # grace period, so Ray Train's workers hear of it (infra.disruption).
        **disruption.TPU_POD_SHUTDOWN.env(),
    }


def _common_args(cluster: LocalCluster) -> list[str]:
    return [
        f"--temp-dir={cluster.ray_temp_dir}",
        f"--object-store-memory={cluster.object_store_mb * 2**20}",
        "--min-worker-port=0",
        "--max-worker-port=0",
        "--dashboard-agent-listen-port=0",
    ]


def host_start(cluster: LocalCluster, name: str, worker_id: int) -> tuple[list[str], dict[str, str]]:
    """`ray start`'s arguments and environment for simulated host `worker_id` of slice `name`."""
    args = [
        f"--address={cluster.gcs_address}",
        # One log monitor per machine (the head's): every raylet here shares one
        # session directory, and a monitor per node would print each line N times.
        "--include-log-monitor=false",
        f"--num-cpus={cluster.host_cpus}",
        f"--resources={json.dumps({'TPU': cluster.shape.chips_per_host})}",
        *_common_args(cluster),
    ]
    return args, {**_base_env(cluster.state_dir), **host_env(cluster.shape, name, worker_id)}


def _registered(name: str, worker_id: int) -> bool:
    import ray

    return any(n.alive and n.slice_name == name and n.worker_id == worker_id for n in map(tpu_node, ray.nodes()))


def down(state_dir: str | Path = DEFAULT_STATE_DIR, grace_s: float = 15.0, *, all_at_once: bool = False) -> LocalCluster | None:
    """Stop every node we started (hosts first, then the head; or `all_at_once`, as a deleted
    RayCluster's pods all get their SIGTERM together). Returns what was stopped, or None."""
    cluster = LocalCluster.load(state_dir)
    if cluster is None:
        return None
    hosts = [n.pid for n in cluster.nodes if n.role != "head"]  # hosts, and any coming back (jobs.local.faults)
    heads = [n.pid for n in cluster.nodes if n.role == "head"]
    if all_at_once:
        stop_groups([*heads, *hosts], grace_s)
    else:
        stop_groups(hosts, grace_s)
        stop_groups(heads, grace_s)
    Path(state_dir, STATE_FILE).unlink(missing_ok=True)
    return cluster


@dataclass(frozen=True)
class LocalStatus:
    cluster: LocalCluster
    dead_nodes: tuple[LocalNode, ...]
    inventory: tuple[SliceInventory, ...]  # empty when the head is down
    idle_slices: int | None

    @property
    def healthy(self) -> bool:
        return not self.dead_nodes and sum(1 for s in self.inventory if s.complete) == self.cluster.slices


def status(state_dir: str | Path = DEFAULT_STATE_DIR, timeout_s: float = 30.0) -> LocalStatus | None:
    import ray
    from ray.util.tpu import get_num_ready_tpu_slices

    cluster = LocalCluster.load(state_dir)
    if cluster is None:
        return None
    dead = tuple(n for n in cluster.nodes if not alive(n.pid) and n.role != "respawn")
    inventory: tuple[SliceInventory, ...] = ()
    idle = None
    head_port = int(cluster.gcs_address.rsplit(":", 1)[1])
    if not any(n.role == "head" for n in dead) and port_open(head_port):
        use_environment(ray_env(cluster.state_dir))
        ray.init(address=cluster.gcs_address, logging_level=logging.WARNING, log_to_driver=False)
        try:
            shape = cluster.shape
            inventory = slice_inventory(ray.nodes(), shape)
            idle = get_num_ready_tpu_slices(shape.topology, shape.generation.ray_accelerator_type)
        finally:
            ray.shutdown()
    return LocalStatus(cluster, dead, inventory, idle)
