"""`python -m infra.doctor --env dev`: does the live cluster match the config?

Reads the cluster and its node pools through the GKE API and compares them with what the config
asks for (`infra.node_pools.tpu_pool_plans`): the Ray Operator add-on, each TPU pool's machine type,
topology, size, capacity and status, and missing or extra pools. Prints a table.

  exit 0  everything matches       exit 1  drift       exit 2  config, API or network error

  python -m infra.doctor --env dev                          the real GKE API, gcloud ADC credentials
  python -m infra.doctor --env dev --endpoint http://...    another endpoint (tests, emulators), no credentials
  python -m infra.doctor --env dev --ray-address ray://...  also: complete idle slices Ray sees per shape
  python -m infra.doctor --env dev --kubectl                also: the cluster's KubeRay (RayCluster and RayJob
                                                            CRDs) and Kueue know every field the manifests
                                                            use (infra.kuberay_crd)
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import google.auth
import requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1
from rich.console import Console
from rich.table import Table
from rich.text import Text

from infra import kuberay_crd
from infra.argtypes import positive_seconds
from infra.catalog import CatalogError
from infra.config import ConfigError, Environment, environment_names, load_environment
from infra.names import CPU_POOL_NAME
from infra.node_pools import TpuPoolPlan, tpu_pool_plans

DEFAULT_ENDPOINT = "container.googleapis.com"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
LOGIN = "run `gcloud auth application-default login`"
T = TypeVar("T")


@dataclass(frozen=True)
class Finding:
    subject: str  # "cluster ray-tpu-dev", "pool v6e-4x4-0"
    field: str
    expected: str
    actual: str
    ok: bool


class DoctorError(Exception):
    """The check could not run. `str()` is one sentence: what was asked, what failed, what to do."""


def _check(subject: str, field: str, expected: object, actual: object) -> Finding:
    return Finding(subject, field, str(expected), str(actual), str(expected) == str(actual))


def _on(flag: bool) -> str:
    return "enabled" if flag else "disabled"


# --- comparison (pure) -----------------------------------------------------------------------------


def compare(env: Environment, cluster: container_v1.Cluster, pools: list[container_v1.NodePool]) -> list[Finding]:
    """What the config asks for against what GKE reports, one finding per check."""
    subject = f"cluster {env.cluster_name}"
    ray = cluster.addons_config.ray_operator_config
    findings = [
        _check(subject, "mode", env.mode, "autopilot" if cluster.autopilot.enabled else "standard"),
        # The add-on runs KubeRay and the TPU webhook that labels each host with its slice.
        _check(subject, "ray operator add-on", "enabled", _on(ray.enabled)),
        _check(subject, "ray cluster logging", "enabled", _on(ray.ray_cluster_logging_config.enabled)),
        _check(subject, "ray cluster monitoring", "enabled", _on(ray.ray_cluster_monitoring_config.enabled)),
    ]
    if env.mode == "autopilot":
        return findings  # GKE owns Autopilot's node pools: there is nothing of ours to compare
    live = {pool.name: pool for pool in pools}
    plans = tpu_pool_plans(env)
    for plan in plans:
        findings += _tpu_pool(plan, live.get(plan.name))
    findings += _cpu_pool(env, live.get(CPU_POOL_NAME))
    # Anything else is drift, GKE's "default-pool" included: the stack removes it.
    for name in sorted(set(live) - {p.name for p in plans} - {CPU_POOL_NAME}):
        findings.append(Finding(f"pool {name}", "exists", "absent", "present", False))
    return findings


def _tpu_pool(plan: TpuPoolPlan, pool: container_v1.NodePool | None) -> list[Finding]:
    subject = f"pool {plan.name}"
    if pool is None:
        return [Finding(subject, "exists", "present", "missing", False)]
    found = [_check(subject, "machine type", plan.machine_type, pool.config.machine_type)]
    placement = pool.placement_policy
    if plan.placement == "tpu-topology":
        found.append(_check(subject, "tpu topology", plan.shape.topology, placement.tpu_topology or "(none)"))
    elif plan.placement == "workload-policy":
        # TPU7x names a compute resource policy instead; its topology lives in Compute, not GKE.
        name = placement.policy_name
        found.append(Finding(subject, "workload policy", "set", name or "(none)", bool(name)))
    found.append(_check(subject, "zone", plan.zone, ",".join(pool.locations) or "(none)"))
    found.append(_check(subject, "size", _size(plan.autoscaled, plan.min_nodes, plan.max_nodes, plan.initial_nodes), _live_size(pool)))
    found.append(_check(subject, "auto repair", _on_off(plan.auto_repair), _on_off(pool.management.auto_repair)))
    expected_capacity = f"reservation {plan.reservation}" if plan.capacity == "reservation" else plan.capacity
    found.append(_check(subject, "capacity", expected_capacity, _live_capacity(pool)))
    found.append(_check(subject, "status", "RUNNING", pool.status.name))
    return found


def _cpu_pool(env: Environment, pool: container_v1.NodePool | None) -> list[Finding]:
    subject = f"pool {CPU_POOL_NAME}"
    if pool is None:
        return [Finding(subject, "exists", "present", "missing", False)]
    cpu = env.cpu_pool
    return [
        _check(subject, "machine type", cpu.machine_type, pool.config.machine_type),
        _check(subject, "size", _size(True, cpu.min_nodes, cpu.max_nodes, cpu.min_nodes), _live_size(pool)),
        _check(subject, "status", "RUNNING", pool.status.name),
    ]


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _size(autoscaled: bool, min_nodes: int, max_nodes: int, fixed_nodes: int) -> str:
    return f"autoscaled {min_nodes}-{max_nodes} nodes" if autoscaled else f"fixed {fixed_nodes} nodes"


def _live_size(pool: container_v1.NodePool) -> str:
    scaling = pool.autoscaling
    # The NodePool resource has no live node count; initial_node_count is the size GKE keeps for a
    # pool without autoscaling (the node count of each instance group is a Compute API read).
    return _size(scaling.enabled, scaling.min_node_count, scaling.max_node_count, pool.initial_node_count)


def _live_capacity(pool: container_v1.NodePool) -> str:
    """The pool's capacity in the config's words; several markers at once are all shown."""
    config = pool.config
    kinds = []
    if config.spot:
        kinds.append("spot")
    if config.preemptible:
        kinds.append("preemptible")
    if pool.queued_provisioning.enabled:
        kinds.append("queued-provisioning")  # flex-start capacity, provisioned for ProvisioningRequests only
    elif config.flex_start:
        kinds.append("flex-start")
    affinity = config.reservation_affinity
    if affinity.consume_reservation_type == container_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION:
        kinds.append(f"reservation {','.join(affinity.values) or '(none)'}")
    return " + ".join(kinds) or "on-demand"


# --- reading the cluster (I/O) ---------------------------------------------------------------------


def cluster_path(env: Environment) -> str:
    return f"projects/{env.project}/locations/{env.location}/clusters/{env.cluster_name}"


def make_client(endpoint: str | None = None) -> container_v1.ClusterManagerClient:
    host = endpoint or DEFAULT_ENDPOINT
    if (urlsplit(host).hostname or host.split("/")[0]).endswith("googleapis.com"):
        try:
            credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
        except auth.DefaultCredentialsError:
            raise DoctorError(
                f"no Google credentials found to read GKE at {host}: {LOGIN}, or set GOOGLE_APPLICATION_CREDENTIALS"
            ) from None
    else:
        credentials = AnonymousCredentials()  # a local fake or an emulator: nothing to sign
    # REST, not gRPC: the same transport the tests drive against a local HTTP server.
    return container_v1.ClusterManagerClient(transport="rest", credentials=credentials, client_options={"api_endpoint": host})


def fetch(
    env: Environment, client: container_v1.ClusterManagerClient, timeout_s: float
) -> tuple[container_v1.Cluster, list[container_v1.NodePool]]:
    name = cluster_path(env)
    cluster = _call(env, client, f"reading cluster {name}", timeout_s, client.get_cluster, name=name)
    if env.mode == "autopilot":
        return cluster, []
    listed = _call(env, client, f"listing the node pools of {name}", timeout_s, client.list_node_pools, parent=name)
    return cluster, list(listed.node_pools)


def _call(env: Environment, client: Any, what: str, timeout_s: float, method: Callable[..., T], **request: str) -> T:
    where = f"{what} from {getattr(client, 'api_endpoint', DEFAULT_ENDPOINT)} failed"
    slow = f"{where}: no answer within {timeout_s:g} s; check your network or raise --timeout"
    try:
        # No retries: the default retries DeadlineExceeded for 20 s, and a check you rerun should
        # take at most --timeout per call.
        return method(**request, timeout=timeout_s, retry=None)
    # REST errors map by HTTP status (Forbidden), gRPC ones by code (PermissionDenied, a subclass).
    except api.NotFound as err:
        raise DoctorError(
            f"{where}: not found ({_detail(err)}); check project, zone/region and cluster_name of "
            f"environment {env.name}, or deploy it with `make deploy ENV={env.name}`"
        ) from None
    except (api.Forbidden, api.Unauthorized) as err:
        raise DoctorError(
            f"{where}: {err.code} {_detail(err)}; {LOGIN} as an account with roles/container.viewer on project {env.project}"
        ) from None
    except (api.GatewayTimeout, requests.Timeout):
        raise DoctorError(slow) from None
    except api.ServiceUnavailable as err:
        raise DoctorError(f"{where}: the service is unavailable ({_detail(err)}); try again in a minute") from None
    except api.GoogleAPICallError as err:
        raise DoctorError(f"{where}: {err.code} {_detail(err)}") from None
    except requests.ConnectionError as err:
        if "timed out" in str(err).lower():  # a read timeout while streaming the body comes as this
            raise DoctorError(slow) from None
        raise DoctorError(f"{where}: cannot connect ({_reason(err)}); check --endpoint and your network") from None
    except auth.TransportError as err:
        raise DoctorError(f"{where}: cannot reach Google to refresh the credentials ({_reason(err)}); check your network") from None
    except auth.GoogleAuthError as err:
        raise DoctorError(f"{where}: the Google credentials were refused ({_first_line(err)}); {LOGIN}") from None


def _detail(err: api.GoogleAPICallError) -> str:
    # api_core's REST message is "GET <url>: <server message>"; `where` already names the request.
    message = re.sub(r"^(GET|POST) \S+: ", "", str(err.message or ""))
    return _first_line(message).rstrip(".") or type(err).__name__


def _reason(err: Exception) -> str:
    """The root cause inside requests' and urllib3's long messages: "[Errno 111] Connection refused"."""
    text = str(err)
    found = re.findall(r"\[Errno -?\d+\] [^'\")]+", text) or re.findall(r"Caused by (\w+)", text)
    return found[-1] if found else type(err).__name__


def _first_line(value: object, limit: int = 200) -> str:
    lines = str(value).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --- what Ray sees (optional) ----------------------------------------------------------------------


@dataclass(frozen=True)
class RayShape:
    groups: tuple[str, ...]
    topology: str
    accelerator_type: str  # "TPU-V6E"
    pod_type: str  # "v6e-16"
    configured_slices: int


def ray_shapes(env: Environment) -> list[RayShape]:
    """One row per distinct slice shape: groups that share a shape share Ray's count."""
    by_shape: dict[tuple[str, str], list] = {}
    for group in env.slice_groups:
        by_shape.setdefault((group.shape.generation.ray_accelerator_type, group.shape.pod_type), []).append(group)
    return [
        RayShape(tuple(g.name for g in groups), groups[0].shape.topology, accel, pod_type, sum(g.slices for g in groups))
        for (accel, pod_type), groups in by_shape.items()
    ]


def ray_ready_slices(env: Environment, address: str, timeout_s: float) -> list[tuple[RayShape, int]]:
    shapes = ray_shapes(env)

    def ask() -> list[tuple[RayShape, int]]:
        import logging

        try:
            import ray  # only here: importing Ray costs time and the drift check does not need it
            from ray.util.tpu import get_num_ready_tpu_slices
        except ImportError as err:
            raise DoctorError(f"--ray-address needs Ray ({err}): install ray[default]==2.60.0 (`make setup`)") from None

        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        try:
            return [(s, get_num_ready_tpu_slices(topology=s.topology, accelerator_type=s.accelerator_type)) for s in shapes]
        finally:
            ray.shutdown()

    return bounded(ask, timeout_s, f"asking the Ray cluster at {address} for ready TPU slices")


def bounded(work: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run `work` in a daemon thread and give up after `timeout_s` (ray.init has no overall timeout)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_outcome(work)), name="doctor-bounded", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not result:
        raise DoctorError(f"{what} failed: no answer within {timeout_s:g} s; check the address and that the cluster is up")
    ok, value = result[0]
    if isinstance(value, DoctorError):
        raise value
    if not ok:
        raise DoctorError(f"{what} failed: {type(value).__name__}: {_first_line(value)}")
    return value


def _outcome(work: Callable[[], T]) -> tuple[bool, Any]:
    try:
        return True, work()
    except BaseException as err:  # reported to the caller's thread as one line
        return False, err


# --- CLI -------------------------------------------------------------------------------------------


def findings_table(env: Environment, findings: list[Finding]) -> Table:
    table = Table(title=f"{env.name}: {env.mode} cluster {env.cluster_name} in {env.location} (project {env.project})")
    for column in ("", "subject", "check", "expected", "actual"):
        table.add_column(column, no_wrap=True)
    for f in findings:
        mark = Text("ok", style="green") if f.ok else Text("DRIFT", style="bold red")
        # Text, not str: values from the API must not be read as rich markup.
        table.add_row(mark, Text(f.subject), Text(f.field), Text(f.expected), Text(f.actual))
    return table


def ray_table(rows: list[tuple[RayShape, int]]) -> Table:
    table = Table(title="complete idle TPU slices Ray sees")
    for column in ("slice groups", "shape", "ready", "configured"):
        table.add_column(column, no_wrap=True)
    for shape, ready in rows:
        table.add_row(", ".join(shape.groups), f"{shape.pod_type} ({shape.topology})", str(ready), str(shape.configured_slices))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.doctor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="dev", help=f"environment name ({', '.join(environment_names())}) or a .yaml path")
    parser.add_argument(
        "--endpoint", default=None, help=f"GKE API endpoint (default {DEFAULT_ENDPOINT}); a non-Google one gets no credentials"
    )
    parser.add_argument("--timeout", type=positive_seconds, default=20.0, help="seconds per API call (and for the Ray report)")
    parser.add_argument("--ray-address", default=None, help="also report the complete idle slices this Ray cluster sees")
    parser.add_argument("--kubectl", action="store_true", help="also check the cluster's KubeRay CRD (current kubectl context)")
    args = parser.parse_args(argv)
    try:
        env = load_environment(args.env)
        with make_client(args.endpoint) as client:
            cluster, pools = fetch(env, client, args.timeout)
        crd = kuberay_crd.read_crd(args.timeout) if args.kubectl else None
        others = {f.crd for f in kuberay_crd.required_fields(env)} if args.kubectl else set()
        other_crds = {name: kuberay_crd.read_crd(args.timeout, name) for name in sorted(others)}
    except (ConfigError, CatalogError, DoctorError, kuberay_crd.CrdError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    findings = compare(env, cluster, pools)
    if crd is not None:
        for c in kuberay_crd.check(env, crd):
            wanted = f"knows it (KubeRay >= {c.feature.since})"
            findings.append(_check(f"CRD {kuberay_crd.CRD}", c.feature.field, wanted, wanted if c.known else "unknown field"))
        for field in kuberay_crd.required_fields(env):
            wanted = f"knows it ({field.since})"
            known = kuberay_crd.knows_field(other_crds[field.crd], field)
            findings.append(_check(f"CRD {field.crd} {field.version}", field.field, wanted, wanted if known else "unknown field"))
    # A pipe or a test gets no terminal width; 80 columns would fold the table.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(findings_table(env, findings))
    drift = [f for f in findings if not f.ok]
    if drift:
        print(f"{env.name}: {len(drift)} of {len(findings)} checks drifted: " + "; ".join(f"{f.subject} {f.field}" for f in drift))
    else:
        print(f"{env.name}: all {len(findings)} checks match the config")
    code = 1 if drift else 0
    if args.ray_address:
        try:
            console.print(ray_table(ray_ready_slices(env, args.ray_address, args.timeout)))
        except DoctorError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
