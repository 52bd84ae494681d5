"""A KubeRay `ray.io/v1` RayJob per job: its own Ray cluster, sized for the job and torn down when it
ends (`python -m jobs.submit JOB --env ENV --print-rayjob`). Pure: the entrypoint comes in as a
string (infra never imports jobs), so what it runs is exactly the job command `jobs.submit` checked.

- `rayClusterSpec` comes from the RayCluster's own builders (infra.manifests.raycluster: one place
  for pod specs, token auth, pinned ports, node selectors and requests), with one TPU worker group
  of the job's slice group and slices, `replicas = minReplicas = maxReplicas`, no autoscaling (Kueue
  admits whole jobs; it refuses in-tree autoscaling without workload slicing, raycluster/common.go).
- Token auth: `authOptions: {mode: token}`. The RayJob's cluster is named `<rayjob>-<5 random>`
  (KubeRay utils.GenerateRayClusterName), so no container names its Secret: the operator makes it
  and injects the token into every Ray container and into the submitter (common.SetContainerTokenAuthEnvVars).
- Submission: SidecarMode. KubeRay's four modes: K8sJobMode adds a submitter pod (a batch Job the
  NetworkPolicy must let in, and a third PodSet Kueue must find CPU quota for); InteractiveMode
  waits for someone to submit; HTTPMode and SidecarMode add no pod. SidecarMode's submitter is a
  container in the head pod (`ray-job-submitter`) running `ray job submit` against the head's own
  dashboard with the token the operator injects, so the job's logs are that container's logs
  (`kubectl logs`), which HTTPMode's have nowhere. Its cost: the head's restartPolicy stays unset or
  Never (validation.go), and Kueue counts the sidecar's 500m/200Mi in the head's PodSet.
- The code: the project's TPU image (images/tpu.Dockerfile), head and workers alike: the entrypoint
  runs on the head, and the image carries `jobs/` and `infra/` and the jobs' requirements. No
  shared code prefix in the bucket, which concurrent jobs would overwrite.
- Kueue (when the environment has a `kueue` section): the queue-name label, and for a
  queued-provisioning group the `cloud.google.com/gke-queued` node selector and toleration.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra.config import Environment, SliceGroup
from infra.images import is_project_tpu_image
from infra.manifests.network_policy import network_policy
from infra.manifests.raycluster import RayClusterPods, auth_options, head_group, tpu_worker_group
from infra.names import QUEUED_LABEL, labels

SUBMISSION_MODE = "SidecarMode"
SUBMITTER_CONTAINER = "ray-job-submitter"  # KubeRay utils.SubmitterContainerName
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue pkg/controller/constants QueueLabel
JOB_LABEL = "ray-tpu-gke/job"
BACKOFF_LIMIT = 0  # reruns after a lost host stay in the job's own driver (jobs.runtime.reruns)


@dataclass(frozen=True)
class RayJobRequest:
    """One job as a RayJob: what runs (`entrypoint`, `job` names the workload), on which slices, and
    the RayJob's bounds in seconds."""

    name: str
    job: str
    entrypoint: str
    group: str
    slices: int
    active_deadline_s: int
    pre_running_deadline_s: int
    ttl_after_finished_s: int
    env_vars: dict[str, str] = field(default_factory=dict)
    pip: tuple[str, ...] = ()


class RayJobError(ValueError):
    """A RayJob the environment cannot run; `str()` is one line naming the field or flag."""


def check(env: Environment, request: RayJobRequest) -> SliceGroup:
    """The request's slice group, or a RayJobError saying what is wrong."""
    names = [g.name for g in env.slice_groups]
    if request.group not in names:
        raise RayJobError(f"slice group {request.group!r} is not in environment {env.name}; valid: {', '.join(names)}")
    group = env.slice_group(request.group)
    image = env.ray.worker_image(group.generation)
    if not is_project_tpu_image(image):
        raise RayJobError(
            f"ray.tpu_images.{group.generation}: a RayJob runs the code in the project's TPU image (images/tpu.Dockerfile, "
            f"`make images`), and {image} is not it: pass --tpu-image REF or set ray.tpu_images.{group.generation}"
        )
    if request.slices > group.slices:
        raise RayJobError(f"--slices: {request.slices} is more than slice group {group.name} has ({group.slices})")
    return group


def ray_job(env: Environment, request: RayJobRequest) -> dict[str, Any]:
    group = check(env, request)
    image = env.ray.worker_image(group.generation)
    cluster = RayClusterPods(request.name, token_secret=None)
    head = head_group(env, cluster)
    (head_container,) = head["template"]["spec"]["containers"]
    head_container["image"] = image  # the entrypoint runs here: it needs the code
    worker = tpu_worker_group(env, group, cluster, slices=request.slices)
    worker.update(replicas=request.slices, minReplicas=request.slices, maxReplicas=request.slices)
    if group.capacity_kind == "queued-provisioning":
        _for_queued_nodes(worker)
    runtime_env: dict[str, Any] = {}
    if request.env_vars:
        runtime_env["env_vars"] = dict(request.env_vars)
    if request.pip:
        runtime_env["pip"] = list(request.pip)
    spec: dict[str, Any] = {
        "entrypoint": request.entrypoint,
        "submissionMode": SUBMISSION_MODE,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": request.ttl_after_finished_s,
        "activeDeadlineSeconds": request.active_deadline_s,
        "preRunningDeadlineSeconds": request.pre_running_deadline_s,
        "backoffLimit": BACKOFF_LIMIT,
        "rayClusterSpec": {
            "rayVersion": env.ray.version,
            "authOptions": auth_options(env),
            "headGroupSpec": head,
            "workerGroupSpecs": [worker],
        },
    }
    if runtime_env:
        spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=False)
    metadata_labels = {**labels(env), JOB_LABEL: request.job}
    if env.kueue is not None:
        metadata_labels[QUEUE_LABEL] = env.kueue.local_queue
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": request.name, "namespace": env.ray.namespace, "labels": metadata_labels},
        "spec": spec,
    }


def _for_queued_nodes(worker: dict[str, Any]) -> None:
    """Queued-provisioning nodes carry the gke-queued label and taint (GKE's ray-kueue-dws tutorial)."""
    pod = worker["template"]["spec"]
    pod["nodeSelector"] = {**pod["nodeSelector"], QUEUED_LABEL: "true"}
    pod["tolerations"] = [*pod.get("tolerations", []), {"key": QUEUED_LABEL, "operator": "Exists", "effect": "NoSchedule"}]


def rayjob_manifests(env: Environment, request: RayJobRequest) -> list[dict[str, Any]]:
    """The RayJob and the NetworkPolicy its cluster's pods need, in `kubectl apply` order."""
    job = ray_job(env, request)
    return [copy.deepcopy(network_policy(env, request.name, serving=False)), job]
