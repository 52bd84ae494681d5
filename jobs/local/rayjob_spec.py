"""What a printed KubeRay RayJob asks for, read and checked (pure): the job (entrypoint, runtime env,
deadlines, clean-up) and the one TPU worker group's slice shape and count; and the RayJob `.status`
object KubeRay would show at each step (fields of the RayJob CRD's status schema, omitted when
empty as KubeRay's `omitempty` does).

Every error is one line that starts with the field it is about, e.g.
`spec.rayClusterSpec.workerGroupSpecs[0].numOfHosts: 2, but a v6e 4x4 slice has 4 hosts`.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from infra import catalog

API_VERSION = "ray.io/v1"
TPU_RESOURCE = "google.com/tpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GROUPS = "spec.rayClusterSpec.workerGroupSpecs"
MODES = ("K8sJobMode", "HTTPMode", "SidecarMode", "InteractiveMode")


class RayJobError(ValueError):
    """The file is not a RayJob this can run; the message starts with the field."""


@dataclass(frozen=True)
class RayJobSpec:
    name: str
    entrypoint: str
    runtime_env: dict[str, Any]
    active_deadline_s: int | None
    pre_running_deadline_s: int | None
    shutdown_after_finishes: bool  # KubeRay's default is false: the RayCluster stays up
    backoff_limit: int
    shape: catalog.SliceShape
    slices: int
    group_name: str
    mode: str = "K8sJobMode"  # KubeRay's default (the CRD's default too)
    # K8sJobMode: the submitterPodTemplate's first container's command + args, when it has a
    # command (KubeRay fills in its own only where there is none); None runs KubeRay's own.
    submitter_command: tuple[str, ...] | None = None
    submitter_backoff_limit: int = 2  # submitterConfig.backoffLimit; KubeRay's default


def _at(obj: Any, key: str, path: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """`obj[key]`, which must be a `kind` (a bool is no int here), or `default` when absent."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        if default is ...:
            raise RayJobError(f"{path}: missing")
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise RayJobError(f"{path}: {value!r} is not a {names}")
    return value


def _positive(spec: dict, key: str) -> int | None:
    value = _at(spec, key, f"spec.{key}", int, None)
    if value is not None and value <= 0:
        raise RayJobError(f"spec.{key}: {value}; KubeRay takes a positive number of seconds")
    return value


def parse_rayjob(text: str, source: str) -> RayJobSpec:
    """The one `kind: RayJob` document of `text` (other documents, e.g. a NetworkPolicy, are left out)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise RayJobError(f"{source}: not YAML ({' '.join(str(err).split())})") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "RayJob"]
    if len(jobs) != 1:
        found = ", ".join(str(d.get("kind")) for d in docs if isinstance(d, dict)) or "nothing"
        raise RayJobError(f"kind: {source} holds {len(jobs)} RayJob documents (found: {found}); give exactly one")
    doc = jobs[0]
    if doc.get("apiVersion") != API_VERSION:
        raise RayJobError(f"apiVersion: {doc.get('apiVersion')!r}, but this runs {API_VERSION} RayJobs")
    name = _at(_at(doc, "metadata", "metadata", dict), "name", "metadata.name", str)
    spec = _at(doc, "spec", "spec", dict)
    entrypoint = _at(spec, "entrypoint", "spec.entrypoint", str, "")
    if not entrypoint.strip():
        raise RayJobError("spec.entrypoint: missing; a RayJob's entrypoint is the shell command its submitter runs")
    mode = _at(spec, "submissionMode", "spec.submissionMode", str, "K8sJobMode")
    if mode == "InteractiveMode":
        raise RayJobError(
            "spec.submissionMode: InteractiveMode waits for a job someone else submits; use K8sJobMode, HTTPMode or SidecarMode"
        )
    if spec.get("clusterSelector"):
        raise RayJobError("spec.clusterSelector: this RayJob runs on an existing RayCluster; this needs spec.rayClusterSpec")
    if _at(spec, "suspend", "spec.suspend", bool, False):
        raise RayJobError("spec.suspend: true; KubeRay would not start a suspended RayJob")
    if mode not in MODES:
        raise RayJobError(f"spec.submissionMode: {mode!r} is not one of KubeRay's modes; valid: {', '.join(MODES)}")
    runtime_env = yaml_mapping(_at(spec, "runtimeEnvYAML", "spec.runtimeEnvYAML", str, ""))
    command = _submitter_command(spec) if mode == "K8sJobMode" else None
    config = _at(spec, "submitterConfig", "spec.submitterConfig", dict, {})
    backoff = _at(config, "backoffLimit", "spec.submitterConfig.backoffLimit", int, 2)
    if backoff < 0:
        raise RayJobError(f"spec.submitterConfig.backoffLimit: {backoff}; a Job's backoffLimit is not negative")
    shape, slices, group = tpu_group(_at(_at(spec, "rayClusterSpec", "spec.rayClusterSpec", dict), "workerGroupSpecs", GROUPS, list))
    return RayJobSpec(
        name=name,
        entrypoint=entrypoint,
        runtime_env=runtime_env,
        active_deadline_s=_positive(spec, "activeDeadlineSeconds"),
        pre_running_deadline_s=_positive(spec, "preRunningDeadlineSeconds"),
        shutdown_after_finishes=_at(spec, "shutdownAfterJobFinishes", "spec.shutdownAfterJobFinishes", bool, False),
        backoff_limit=_at(spec, "backoffLimit", "spec.backoffLimit", int, 0),
        shape=shape,
        slices=slices,
        group_name=group,
        mode=mode,
        submitter_command=command,
        submitter_backoff_limit=backoff,
    )


def _submitter_command(spec: dict) -> tuple[str, ...] | None:
    """The submitterPodTemplate's first container's command and args (rayjob_controller.go:641-647:
    KubeRay keeps a command it is given), or None for KubeRay's own."""
    template = _at(spec, "submitterPodTemplate", "spec.submitterPodTemplate", dict, None)
    if template is None:
        return None
    path = "spec.submitterPodTemplate.spec.containers"
    containers = _at(_at(template, "spec", "spec.submitterPodTemplate.spec", dict), "containers", path, list)
    if not containers or not isinstance(containers[0], dict):
        raise RayJobError(f"{path}: empty; the submitter's pod needs a container")
    command = _at(containers[0], "command", f"{path}[0].command", list, [])
    args = _at(containers[0], "args", f"{path}[0].args", list, [])
    if not command:
        return None
    if not all(isinstance(a, str) for a in [*command, *args]):
        raise RayJobError(f"{path}[0]: command and args must be strings")
    return (*command, *args)


def yaml_mapping(text: str) -> dict[str, Any]:
    """`spec.runtimeEnvYAML` as a dict (empty when absent), as KubeRay's submitter reads it."""
    try:
        value = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise RayJobError(f"spec.runtimeEnvYAML: not YAML ({' '.join(str(err).split())})") from None
    if not isinstance(value, dict):
        raise RayJobError(f"spec.runtimeEnvYAML: {type(value).__name__}, but a runtime env is a mapping")
    return value


def _containers(group: dict, path: str) -> list[dict]:
    pod = _at(_at(group, "template", f"{path}.template", dict), "spec", f"{path}.template.spec", dict)
    return [c for c in _at(pod, "containers", f"{path}.template.spec.containers", list, []) if isinstance(c, dict)]


def _tpu_request(container: dict) -> Any:
    resources = container.get("resources") or {}
    # An extended resource's request defaults to its limit, and GKE wants them equal.
    return (resources.get("requests") or {}).get(TPU_RESOURCE) or (resources.get("limits") or {}).get(TPU_RESOURCE)


def _is_tpu(group: Any, path: str) -> bool:
    if not isinstance(group, dict):
        raise RayJobError(f"{path}: {group!r} is not a worker group")
    pod = (group.get("template") or {}).get("spec") or {}
    return ACCELERATOR_LABEL in (pod.get("nodeSelector") or {}) or any(_tpu_request(c) for c in _containers(group, path))


def tpu_group(groups: list) -> tuple[catalog.SliceShape, int, str]:
    """(shape, slices, group name) of the one TPU worker group."""
    tpu = [(i, g) for i, g in enumerate(groups) if _is_tpu(g, f"{GROUPS}[{i}]")]
    if len(tpu) != 1:
        which = ", ".join(f"[{i}] {g.get('groupName')}" for i, g in tpu) or "none requests google.com/tpu"
        raise RayJobError(f"{GROUPS}: {len(tpu)} TPU worker groups ({which}); this runs exactly one")
    index, group = tpu[0]
    path = f"{GROUPS}[{index}]"
    selector = _at(group["template"]["spec"], "nodeSelector", f"{path}.template.spec.nodeSelector", dict, {})
    label_path = f'{path}.template.spec.nodeSelector["{{}}"]'
    accelerator = _at(selector, ACCELERATOR_LABEL, label_path.format(ACCELERATOR_LABEL), str)
    by_label = {g.gke_accelerator: g for g in catalog.GENERATIONS}
    if accelerator not in by_label:
        raise RayJobError(
            f"{label_path.format(ACCELERATOR_LABEL)}: {accelerator!r} is not a TPU the catalog knows; valid: {', '.join(by_label)}"
        )
    gen = by_label[accelerator]
    topology = _at(selector, TOPOLOGY_LABEL, label_path.format(TOPOLOGY_LABEL), str)
    if not gen.offers(topology):
        raise RayJobError(
            f"{label_path.format(TOPOLOGY_LABEL)}: {topology!r} is not offered for {gen.name}; valid: {gen.describe_topologies()}"
        )
    requesting = [(i, c) for i, c in enumerate(_containers(group, path)) if _tpu_request(c)]
    if len(requesting) != 1:
        raise RayJobError(f"{path}.template.spec.containers: {len(requesting)} containers request {TPU_RESOURCE}; a TPU host runs one")
    c_index, container = requesting[0]
    chips_path = f'{path}.template.spec.containers[{c_index}].resources.requests["{TPU_RESOURCE}"]'
    chips = _tpu_request(container)
    if isinstance(chips, bool) or not str(chips).isdigit() or int(chips) < 1:
        raise RayJobError(f"{chips_path}: {chips!r} is not a whole number of chips")
    try:
        shape = catalog.shape(gen, topology, int(chips))
    except catalog.CatalogError as err:
        raise RayJobError(f"{chips_path}: {err}") from None
    hosts = _at(group, "numOfHosts", f"{path}.numOfHosts", int, 1)  # the CRD's default
    if hosts != shape.hosts:
        raise RayJobError(f"{path}.numOfHosts: {hosts}, but a {gen.name} {topology} slice has {shape.hosts} hosts")
    slices = _at(group, "replicas", f"{path}.replicas", int, 0)  # the CRD's default: no slice at all
    if slices < 1:
        raise RayJobError(f"{path}.replicas: {slices}; the number of slices must be at least 1")
    return shape, slices, str(group.get("groupName") or "")


def _suffix() -> str:
    # KubeRay's names for the RayCluster and the Ray job: "<rayjob>-<5 random lowercase letters or digits>".
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))


def timestamp(at: datetime | None = None) -> str:
    """A Kubernetes `metav1.Time`: RFC 3339, UTC, whole seconds."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RayJobStatus:
    """The RayJob's `.status`, as KubeRay's controller fills it in."""

    job_id: str
    ray_cluster_name: str
    start_time: str
    job_deployment_status: str = "Initializing"
    job_status: str = ""  # Ray's: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED; empty before the first look
    reason: str = ""
    message: str = ""
    dashboard_url: str = ""
    end_time: str = ""
    succeeded: int | None = None
    failed: int | None = None
    job_start_ms: int = 0  # Ray's own start and end of the job (status.rayJobInfo)
    job_end_ms: int = 0

    @classmethod
    def initializing(cls, name: str) -> RayJobStatus:
        return cls(job_id=f"{name}-{_suffix()}", ray_cluster_name=f"{name}-{_suffix()}", start_time=timestamp())

    def finish(self, deployment_status: str, reason: str = "", message: str | None = None) -> None:
        """Complete or Failed: the end time, and the counts KubeRay keeps for backoffLimit."""
        self.job_deployment_status, self.reason, self.end_time = deployment_status, reason, timestamp()
        if message is not None:
            self.message = message
        self.succeeded = int(deployment_status == "Complete" and self.job_status == "SUCCEEDED")
        self.failed = int(deployment_status == "Failed")

    def to_json(self) -> dict[str, Any]:
        def ms(value: int) -> str:
            return timestamp(datetime.fromtimestamp(value / 1000, UTC))

        info = {k: ms(v) for k, v in (("startTime", self.job_start_ms), ("endTime", self.job_end_ms)) if v}
        out = {
            "jobDeploymentStatus": self.job_deployment_status,
            "jobStatus": self.job_status,
            "reason": self.reason,
            "message": self.message,
            "jobId": self.job_id,
            "rayClusterName": self.ray_cluster_name,
            "dashboardURL": self.dashboard_url,
            "startTime": self.start_time,
            "endTime": self.end_time,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "rayJobInfo": info,
        }
        return {k: v for k, v in out.items() if v not in ("", None, {})}
