"""A local stand-in for the GKE v1 REST API, and what a correct deploy of a config looks like in it.

`render_cluster` / `render_node_pools` write the JSON GKE returns (camelCase, enums by name) for a
cluster deployed exactly as `infra/cdk/components` declares it; tests mutate those dicts to make drift.
`FakeGke` serves them over real HTTP on 127.0.0.1 so the real `ClusterManagerClient` (REST) talks
to it unmodified.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from infra.config import Environment
from infra.names import CPU_POOL_NAME
from infra.node_pools import TpuPoolPlan, tpu_pool_plans


def render_cluster(env: Environment) -> dict:
    """GET .../clusters/{c} without `nodePools` (the server adds the current list)."""
    return {
        "name": env.cluster_name,
        "location": env.location,
        "selfLink": f"https://container.googleapis.com/v1/projects/{env.project}/locations/{env.location}/clusters/{env.cluster_name}",
        "status": "RUNNING",
        "currentMasterVersion": "1.34.1-gke.1829001",
        "releaseChannel": {"channel": env.release_channel},
        "autopilot": {"enabled": env.mode == "autopilot"},
        "addonsConfig": {
            "rayOperatorConfig": {
                "enabled": True,
                "rayClusterLoggingConfig": {"enabled": True},
                "rayClusterMonitoringConfig": {"enabled": True},
            },
            "gcsFuseCsiDriverConfig": {"enabled": True},
            "httpLoadBalancing": {},
        },
    }


def render_node_pools(env: Environment) -> list[dict]:
    """The pools a correct deploy has: the CPU pool and one per TPU pool plan (none on Autopilot)."""
    if env.mode == "autopilot":
        return []
    cpu = env.cpu_pool
    pools = [
        _pool(
            env,
            CPU_POOL_NAME,
            {"machineType": cpu.machine_type, "diskSizeGb": cpu.disk_size_gb},
            initial=cpu.min_nodes or 1,
            autoscaling={"enabled": True, "minNodeCount": cpu.min_nodes, "maxNodeCount": cpu.max_nodes},
        )
    ]
    return pools + [_tpu_pool(env, plan) for plan in tpu_pool_plans(env)]


def _tpu_pool(env: Environment, plan: TpuPoolPlan) -> dict:
    # Mirrors infra/cdk/components/tpu_node_pools.py: capacity_settings and _placement.
    config: dict = {"machineType": plan.machine_type, "gvnic": {"enabled": True}}
    extra: dict = {}
    no_reservation = {"consumeReservationType": "NO_RESERVATION"}
    if plan.capacity == "spot":
        config["spot"] = True
    elif plan.capacity == "reservation":
        config["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [plan.reservation],
        }
    elif plan.capacity in ("flex-start", "queued-provisioning"):
        config.update(flexStart=True, reservationAffinity=no_reservation)
        if plan.capacity == "queued-provisioning":
            extra["queuedProvisioning"] = {"enabled": True}
    if plan.placement == "tpu-topology":
        extra["placementPolicy"] = {"type": "COMPACT", "tpuTopology": plan.shape.topology}
    elif plan.placement == "workload-policy":
        policy = f"projects/{env.project}/regions/{env.region}/resourcePolicies/{env.cluster_name}-tpu7x-{plan.shape.topology}"
        # GKE stores a workload policy with the topology filled in and no type (vllm-project/ci-infra
        # PR #547 read a live TPU7x pool back so).
        extra["placementPolicy"] = {"policyName": policy, "tpuTopology": plan.shape.topology}
    autoscaling = (
        {"enabled": True, "minNodeCount": plan.min_nodes, "maxNodeCount": plan.max_nodes, "locationPolicy": "ANY"}
        if plan.autoscaled
        else None
    )
    return _pool(
        env, plan.name, config, initial=plan.initial_nodes, autoscaling=autoscaling, zone=plan.zone, auto_repair=plan.auto_repair, **extra
    )


def _pool(
    env: Environment,
    name: str,
    config: dict,
    *,
    initial: int,
    autoscaling: dict | None,
    zone: str | None = None,
    auto_repair: bool = True,
    **extra,
) -> dict:
    pool = {
        "name": name,
        "config": {"imageType": "COS_CONTAINERD", "labels": {}, "resourceLabels": dict(env.labels), **config},
        "initialNodeCount": initial,
        "locations": [zone or env.zone],
        "selfLink": f"https://container.googleapis.com/v1/projects/{env.project}/locations/{env.location}/clusters/{env.cluster_name}/nodePools/{name}",
        "version": "1.34.1-gke.1829001",
        "status": "RUNNING",
        "management": {"autoUpgrade": True, "autoRepair": auto_repair},
        **extra,
    }
    if autoscaling:
        pool["autoscaling"] = autoscaling
    return pool


def google_error(code: int, status: str, message: str, reason: str | None = None) -> dict:
    """An error body as Google APIs write it (google.rpc.Status in JSON)."""
    error: dict = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "container.googleapis.com"}]
    return {"error": error}


class FakeGke:
    """Serves one environment's cluster. Set `cluster`, `node_pools`, `errors[kind]` (status, body)
    or `delays[kind]` (seconds) per test, kind being "cluster" or "nodePools"."""

    def __init__(self) -> None:
        self.cluster: dict = {}
        self.node_pools: list[dict] = []
        self.errors: dict[str, tuple[int, dict]] = {}
        self.delays: dict[str, float] = {}
        self.requests: list[str] = []
        self._name = ""
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True  # a handler still sleeping must not hold up shutdown
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def serve(self, env: Environment) -> FakeGke:
        """Answer for `env`'s cluster, deployed as the config says."""
        self._name = f"projects/{env.project}/locations/{env.location}/clusters/{env.cluster_name}"
        self.cluster, self.node_pools = render_cluster(env), render_node_pools(env)
        return self

    def pool(self, name: str) -> dict:
        return next(p for p in self.node_pools if p["name"] == name)

    def start(self) -> FakeGke:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes any handler sleeping in `delays`
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _answer(self, path: str) -> tuple[int, dict, float]:
        kind = {f"/v1/{self._name}": "cluster", f"/v1/{self._name}/nodePools": "nodePools"}.get(path)
        delay = self.delays.get(kind or "", 0.0)
        if kind is None:
            return 404, google_error(404, "NOT_FOUND", f"Not found: {path.removeprefix('/v1/')}."), delay
        if kind in self.errors:
            return (*self.errors[kind], delay)
        pools = copy.deepcopy(self.node_pools)
        return 200, ({**self.cluster, "nodePools": pools} if kind == "cluster" else {"nodePools": pools}), delay


class _Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer

    def do_GET(self) -> None:  # http.server's naming
        fake: FakeGke = self.server.fake
        fake.requests.append(self.path)
        status, body, delay = fake._answer(urlsplit(self.path).path)
        if delay and fake._stopping.wait(delay):
            return
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test): nothing to answer

    def log_message(self, format: str, *args: object) -> None:  # http.server's signature
        pass  # keep pytest output clean
