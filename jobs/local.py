"""A simulated TPU slice on this machine: a real local Ray cluster, one raylet per simulated host.

    python -m jobs.local up --generation v6e --topology 4x4 [--slices N]
    python -m jobs.local status
    python -m jobs.local down

Each simulated host is a `ray start --block` process started with the variables the GKE TPU
webhook injects (`TPU_NAME`, `TPU_WORKER_ID`, `TPU_ACCELERATOR_TYPE`, `TPU_TOPOLOGY`) and
`resources={"TPU": chips_per_host}`, so Ray derives exactly the labels and head resource it would
on GKE, and `ray.util.tpu` and Ray Train treat it as a slice. JAX runs on CPU with one device per
chip. The jobs need no change to run here: submit them with `ray job submit` to the printed address.

State and Ray's temp files live under `build/local-ray/` in the repo (or `--state-dir`), never in
`/tmp/ray` or `~/.ray`. Nodes start one after another (raylets on one machine pick their socket
names when they start, so starting them together makes them collide), each with a bounded wait;
`up` fails naming the host whose raylet did not come up and the log to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from infra import catalog

from jobs import REPO_ROOT
from jobs.cli import JobArgumentParser, add_slice_flags, positive_int, positive_seconds, resolve_target

DEFAULT_STATE_DIR = REPO_ROOT / "build" / "local-ray"
STATE_FILE = "cluster.json"
# A unix socket path may not exceed 107 bytes; Ray appends "/session_<date>_<pid>/sockets/plasma_store".
_RAY_SOCKET_SUFFIX = len("/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store")
_MAX_SOCKET_PATH = 107


class LocalClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped. The message says what to do."""


@dataclass(frozen=True)
class LocalNode:
    role: str  # "head" or "host"
    slice_name: str | None
    worker_id: int | None
    pid: int  # of `ray start --block`, which leads its own process group
    log: str

    def describe(self) -> str:
        return "head" if self.role == "head" else f"{self.slice_name} worker {self.worker_id}"


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

    @property
    def shape(self) -> catalog.SliceShape:
        return catalog.shape(self.generation, self.topology, self.chips_per_host)

    @property
    def storage_path(self) -> str:
        """Where Ray Train checkpoints go: every simulated host shares this filesystem."""
        return str(Path(self.state_dir) / "checkpoints")

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


def slice_name(shape: catalog.SliceShape, index: int) -> str:
    return f"sim-{shape.pod_type}-{index}"


def host_env(shape: catalog.SliceShape, name: str, worker_id: int) -> dict[str, str]:
    """The environment of one simulated host: what GKE's TPU webhook would inject, plus JAX on CPU
    with one device per chip (pure)."""
    return {
        "TPU_NAME": name,
        "TPU_WORKER_ID": str(worker_id),
        "TPU_ACCELERATOR_TYPE": shape.pod_type,
        "TPU_TOPOLOGY": shape.topology,
        **cpu_jax_env(shape),
    }


def cpu_jax_env(shape: catalog.SliceShape) -> dict[str, str]:
    """JAX on CPU, one device per chip: what a job's runtime env needs on the simulation."""
    return {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={shape.jax_devices_per_host}",
    }


def ray_env(temp_dir: str | Path) -> dict[str, str]:
    """Keep Ray's files under `temp_dir` and off the network: no token file in ~/.ray, no usage stats."""
    return {"RAY_TMPDIR": str(temp_dir), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _clean_base_env() -> dict[str, str]:
    # A developer's shell may carry TPU or Ray variables from elsewhere; the nodes must not inherit them.
    drop = ("TPU_", "MEGASCALE_", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "JAX_", "XLA_FLAGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    # `python` in a job's entrypoint must be this interpreter (the one with Ray and JAX), as it is
    # the image's on GKE; and the repo must be importable by workers started outside a job.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_dir_problem(state_dir: str | Path) -> str | None:
    """Why `state_dir` cannot hold a local cluster (its state, logs and Ray's sockets), or None."""
    state_dir = Path(state_dir).resolve()
    existing = next(p for p in (state_dir, *state_dir.parents) if p.exists())  # the root always exists
    if not existing.is_dir():
        return f"{existing} is not a directory; pass another --state-dir"
    temp_dir = state_dir / "ray"
    if len(str(temp_dir)) + _RAY_SOCKET_SUFFIX > _MAX_SOCKET_PATH:
        return (
            f"{temp_dir} is too long for Ray's unix sockets (at most {_MAX_SOCKET_PATH - _RAY_SOCKET_SUFFIX} "
            "characters); pass a shorter --state-dir"
        )
    return None


def _ray_start(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats", *args]
    with open(log, "w") as out:
        # Own session: `down` can signal the node and every process it spawned, and nothing else.
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _tail(path: str | Path, lines: int = 8) -> str:
    with contextlib.suppress(OSError):
        text = Path(path).read_text(errors="replace").strip().splitlines()
        return "\n".join("    " + line for line in text[-lines:])
    return "    (no log)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie we have not reaped counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    return True


def _stop_groups(pids: Sequence[int], grace_s: float) -> None:
    """SIGTERM each node's process group, wait up to `grace_s`, then SIGKILL what is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(p) for p in pids):
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (the leader waiting to be reaped) count as gone.
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (proc / "stat").read_text().rsplit(") ", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            raise LocalClusterError(f"the raylet for {what} exited with status {proc.returncode}; last lines of {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise LocalClusterError(f"the raylet for {what} did not register within {timeout_s:g}s; last lines of {log}:\n{_tail(log)}")
        time.sleep(0.2)


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
    if existing and any(_alive(n.pid) for n in existing.nodes):
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

    gcs_port, dashboard_port, client_port = _free_port(), _free_port(), _free_port()
    gcs_address = f"127.0.0.1:{gcs_port}"
    base = {
        **_clean_base_env(),
        **ray_env(temp_dir),
        # `ray start --block` drains a node for up to 30 s on SIGTERM (for Serve proxies); with the
        # GCS going down at the same time that is a 30 s wait for nothing.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    common = [
        f"--temp-dir={temp_dir}",
        f"--object-store-memory={object_store_mb * 2**20}",
        "--min-worker-port=0",
        "--max-worker-port=0",
        "--dashboard-agent-listen-port=0",
    ]
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
    )
    procs: list[subprocess.Popen] = []
    nodes: list[LocalNode] = []
    connected = False
    try:
        progress(f"starting the head node (dashboard {cluster.dashboard_url})")
        log = state_dir / "logs" / "head.log"
        head_env = {**base, **cpu_jax_env(shape), "JOBS_STORAGE_PATH": cluster.storage_path}
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
        procs.append(_ray_start(head_args, head_env, log))
        nodes.append(LocalNode("head", None, None, procs[-1].pid, str(log)))
        _wait_for("the head", lambda: _port_open(gcs_port), procs[-1], log, head_timeout_s)
        os.environ.update(ray_env(temp_dir))
        ray.init(address=gcs_address, logging_level="warning", log_to_driver=False)
        connected = True
        for s in range(slices):
            name = slice_name(shape, s)
            for w in range(shape.hosts):
                progress(f"starting host {name} worker {w} ({s * shape.hosts + w + 1}/{slices * shape.hosts})")
                log = state_dir / "logs" / f"{name}-{w}.log"
                host_args = [
                    f"--address={gcs_address}",
                    # One log monitor per machine (the head's): every raylet here shares one
                    # session directory, and a monitor per node would print each line N times.
                    "--include-log-monitor=false",
                    f"--num-cpus={host_cpus}",
                    f"--resources={json.dumps({'TPU': shape.chips_per_host})}",
                    *common,
                ]
                procs.append(_ray_start(host_args, {**base, **host_env(shape, name, w)}, log))
                nodes.append(LocalNode("host", name, w, procs[-1].pid, str(log)))
                _wait_for(f"{name} worker {w}", lambda: _registered(name, w), procs[-1], log, node_timeout_s)
        cluster = LocalCluster(**{**asdict(cluster), "nodes": tuple(nodes)})
        cluster.save()
        return cluster
    except BaseException:
        _stop_groups([p.pid for p in reversed(procs)], grace_s=10)
        raise
    finally:
        if connected:
            ray.shutdown()


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def _registered(name: str, worker_id: int) -> bool:
    import ray

    from jobs.slices import SLICE_NAME_LABEL, WORKER_ID_LABEL

    for node in ray.nodes():
        labels = node.get("Labels") or {}
        if node.get("Alive") and labels.get(SLICE_NAME_LABEL) == name and labels.get(WORKER_ID_LABEL) == str(worker_id):
            return True
    return False


def down(state_dir: str | Path = DEFAULT_STATE_DIR, grace_s: float = 15.0) -> LocalCluster | None:
    """Stop every node we started (hosts first, then the head). Returns what was stopped, or None."""
    cluster = LocalCluster.load(state_dir)
    if cluster is None:
        return None
    hosts = [n.pid for n in cluster.nodes if n.role == "host"]
    heads = [n.pid for n in cluster.nodes if n.role == "head"]
    _stop_groups(hosts, grace_s)
    _stop_groups(heads, grace_s)
    Path(state_dir, STATE_FILE).unlink(missing_ok=True)
    return cluster


@dataclass(frozen=True)
class LocalStatus:
    cluster: LocalCluster
    dead_nodes: tuple[LocalNode, ...]
    inventory: tuple  # of jobs.slices.SliceInventory, empty when the head is down
    idle_slices: int | None

    @property
    def healthy(self) -> bool:
        return not self.dead_nodes and sum(1 for s in self.inventory if s.complete) == self.cluster.slices


def status(state_dir: str | Path = DEFAULT_STATE_DIR, timeout_s: float = 30.0) -> LocalStatus | None:
    import ray
    from ray.util.tpu import get_num_ready_tpu_slices

    from jobs.slices import slice_inventory

    cluster = LocalCluster.load(state_dir)
    if cluster is None:
        return None
    dead = tuple(n for n in cluster.nodes if not _alive(n.pid))
    inventory: tuple = ()
    idle = None
    head_port = int(cluster.gcs_address.rsplit(":", 1)[1])
    if not any(n.role == "head" for n in dead) and _port_open(head_port):
        os.environ.update(ray_env(cluster.ray_temp_dir))
        ray.init(address=cluster.gcs_address, logging_level="warning", log_to_driver=False)
        try:
            shape = cluster.shape
            inventory = slice_inventory(ray.nodes(), shape)
            idle = get_num_ready_tpu_slices(shape.topology, shape.generation.ray_accelerator_type)
        finally:
            ray.shutdown()
    return LocalStatus(cluster, dead, inventory, idle)


# --- command line ------------------------------------------------------------------------------


def _parser() -> JobArgumentParser:
    parser = JobArgumentParser(prog="python -m jobs.local", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=JobArgumentParser)
    start = sub.add_parser("up", help="start a simulated slice")
    add_slice_flags(start, reserve_timeout=False)
    start.add_argument("--timeout", type=positive_seconds, default=90.0, metavar="SECONDS", help="per-node start timeout")
    start.add_argument("--host-cpus", type=positive_int, default=2, help="logical CPUs per simulated host")
    start.add_argument("--object-store-mb", type=positive_int, default=128, help="object store per node, MiB")
    for name, text in (("status", "show the simulated slices"), ("down", "stop the simulated cluster")):
        sub.add_parser(name, help=text)
    for p in (parser, *sub.choices.values()):
        p.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help=f"default: {DEFAULT_STATE_DIR}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        if args.command == "up":
            target = resolve_target(parser, args)
            problem = state_dir_problem(args.state_dir)
            if problem:  # a bad flag: say so before anything starts
                parser.error(f"argument --state-dir: {problem}")
            started = time.monotonic()
            cluster = up(
                target.shape,
                target.slices,
                args.state_dir,
                node_timeout_s=args.timeout,
                host_cpus=args.host_cpus,
                object_store_mb=args.object_store_mb,
                progress=lambda m: print(f"[local] {m}", flush=True),
            )
            print(
                f"[local] up in {time.monotonic() - started:.0f}s: {target.describe()}\n"
                f"  dashboard / jobs API: {cluster.dashboard_url}\n"
                # The nodes already run JAX on CPU, one device per chip: no runtime env needed.
                f"  submit: ray job submit --address {cluster.dashboard_url} --working-dir . -- "
                f"python -m jobs.healthcheck --generation {cluster.generation} --topology {cluster.topology} "
                f"--slices {cluster.slices}\n"
                f"  state and logs: {cluster.state_dir}"
            )
            return 0
        if args.command == "status":
            st = status(args.state_dir)
            if st is None:
                print(f"[local] no local cluster in {args.state_dir}")
                return 1
            c = st.cluster
            print(f"[local] {c.slices} x {c.shape} at {c.dashboard_url} (GCS {c.gcs_address})")
            for node in st.dead_nodes:
                print(f"  DOWN: {node.describe()} (pid {node.pid}); log {node.log}")
            for s in st.inventory:
                print(f"  {s.describe()}")
            print(f"  idle whole slices: {'unknown' if st.idle_slices is None else st.idle_slices}")
            return 0 if st.healthy else 1
        stopped = down(args.state_dir)
        print(f"[local] stopped {len(stopped.nodes)} node(s)" if stopped else f"[local] nothing running in {args.state_dir}")
        return 0
    except LocalClusterError as err:
        print(f"[local] error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
