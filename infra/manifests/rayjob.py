"""A KubeRay `ray.io/v1` RayJob per job: its own Ray cluster, sized for the job and torn down when it
ends (`python -m jobs.submit JOB --env ENV --print-rayjob`). Pure: the entrypoint comes in as a
string (infra never imports jobs), so what it runs is exactly the job command `jobs.submit` checked.
The rules behind each choice, with their sources, are in `infra.kube_facts`.

- `rayClusterSpec` comes from the RayCluster's own builders (infra.manifests.raycluster: one place
  for pod specs, token auth, pinned ports, node selectors and requests), with one TPU worker group
  of the job's slices, `replicas = minReplicas = maxReplicas`, no autoscaling (Kueue admits whole
  jobs; it refuses in-tree autoscaling without workload slicing, raycluster/common.go). The group
  is named after the RayJob, never after the slice group: the TPU webhook places a slice's pods by
  `replicaIndex=<group>-<i>`, which older webhooks match namespace-wide, so two jobs with one group
  name would chase each other's node pools.
- Token auth: `authOptions: {mode: token}`. The RayJob's cluster is named `<rayjob>-<5 random>`, so
  no container names its Secret: the operator makes it and injects the token into every Ray
  container and into the submitter (common.SetContainerTokenAuthEnvVars).
- Submission: K8sJobMode, with a submitter of ours (`python -m jobs.client.submitter`, from the
  project's image): a batch Job whose pod submits the job once (checking first that it is not
  already there), follows its logs, and when the log stream drops while the job still runs, follows
  it again, ending only when Ray says the job ended. KubeRay fails a RayJob 30 s after its
  submitter ends while the job runs, and SidecarMode's submitter (a blocking `ray job submit`)
  ends with any dropped stream (kuberay#4921): KUBE_FACTS["submission-mode"] has the sources.
- The code: the project's TPU image (images/tpu.Dockerfile) for the head, the workers and the
  submitter: the entrypoint runs on the head, and the image carries `jobs/` and `infra/` and the
  jobs' requirements. No shared code prefix in the bucket, which concurrent jobs would overwrite.
  A batch job runs the serving image (vLLM) everywhere instead, and its head and workers mount the
  environment's bucket at /gcs (infra.manifests.bucket_mount), where vLLM reads a gs:// model.
- Kueue (when the environment has a `kueue` section): the queue-name and priority-class labels;
  the TPU workers tolerate `google.com/tpu` in their template, where Kueue reads tolerations (GKE
  adds it to pods only when they are created); for a queued-provisioning group also the
  `cloud.google.com/gke-queued` node selector and toleration and the ProvisioningRequest's
  `maxRunDurationSeconds` (the active deadline); one slice per queued-provisioning job.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra.config import Environment, SliceGroup
from infra.images import PROJECT_SERVE_IMAGE_FORM, PROJECT_TPU_IMAGE_FORM, is_project_serve_image, is_project_tpu_image
from infra.kube_facts import DWS_MAX_RUN_S, MAX_MULTI_HOST_RAYJOB_NAME, cite
from infra.manifests.bucket_mount import with_bucket_mount
from infra.manifests.network_policy import network_policy
from infra.manifests.raycluster import (
    CONTAINER_SECURITY,
    POD_SECURITY,
    RayClusterPods,
    auth_options,
    head_group,
    pod_labels,
    tpu_worker_group,
)
from infra.names import CPU_POOL_NAME, QUEUED_LABEL, labels

SUBMISSION_MODE = "K8sJobMode"
SUBMITTER_CONTAINER = "ray-job-submitter"  # KubeRay utils.SubmitterContainerName
# KubeRay's own submitter's resources (common/job.go GetDefaultSubmitterContainer), which Kueue
# counts as the `submitter` PodSet (kueue rayjob_controller.go:266-311).
SUBMITTER_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
SUBMITTER_LIMITS = {"cpu": "1", "memory": "1Gi"}
# Retries of the submitter's pod (the Job's backoffLimit; KubeRay's default 2): a pod lost with its
# node. A dropped log stream costs none: the submitter follows the job again itself.
SUBMITTER_BACKOFF_LIMIT = 5
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue pkg/controller/constants QueueLabel
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # Kueue pkg/controller/constants/constants.go:48
MAX_RUN_ANNOTATION = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"
JOB_LABEL = "ray-tpu-gke/job"
BACKOFF_LIMIT = 0  # reruns after a lost host stay in the job's own driver (jobs.runtime.reruns)
# How long a finished job's cluster stays: Kueue frees the quota when the RayJob ends, so nodes still
# held by a finished job's cluster keep the next admitted job (or idle DWS hosts) waiting.
TTL_AFTER_FINISHED_S = 60
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
QUEUED_TOLERATION = {"key": QUEUED_LABEL, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class RayJobRequest:
    """One job as a RayJob: what runs (`entrypoint`, `job` names the workload), on which slices, the
    RayJob's bounds in seconds, and its Kueue priority class (None without Kueue)."""

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
    priority: str | None = None
    image: str | None = None  # every pod's image when not the TPU image: the serving image, for batch inference
    # The environment's bucket at /gcs in the head's and the workers' pods (infra.manifests.bucket_mount):
    # vLLM reads a gs:// model from there, as the RayService's replicas do.
    mount_bucket: bool = False

    @property
    def runtime_env(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env_vars:
            out["env_vars"] = dict(self.env_vars)
        if self.pip:
            out["pip"] = list(self.pip)
        return out


class RayJobError(ValueError):
    """A RayJob the environment cannot run; `str()` is one line naming the field or flag."""


def check(env: Environment, request: RayJobRequest) -> SliceGroup:
    """The request's slice group, or a RayJobError saying what is wrong."""
    names = [g.name for g in env.slice_groups]
    if request.group not in names:
        raise RayJobError(f"slice group {request.group!r} is not in environment {env.name}; valid: {', '.join(names)}")
    group = env.slice_group(request.group)
    index = names.index(group.name)
    image = env.ray.worker_image(group.generation)
    if request.image is not None:
        if not is_project_serve_image(request.image):
            raise RayJobError(
                f"--serve-image: a {request.job} RayJob runs vLLM, which lives in the project's serving image "
                f"(images/serve.Dockerfile), and {request.image} is not it: pass --serve-image {PROJECT_SERVE_IMAGE_FORM}"
            )
    elif not is_project_tpu_image(image):
        raise RayJobError(
            f"ray.tpu_images.{group.generation}: a RayJob runs the code in the project's TPU image (images/tpu.Dockerfile, "
            f"`make images`), and {image} is not it: pass --tpu-image {PROJECT_TPU_IMAGE_FORM}, or set ray.tpu_images.{group.generation}"
        )
    if not group.rayjob_slices:
        raise RayJobError(f"slice_groups[{index}].rayjob_slices: slice group {group.name} leaves no slices to RayJobs")
    if request.slices > group.rayjob_slices:
        raise RayJobError(
            f"--slices: {request.slices} is more than slice group {group.name} leaves to RayJobs "
            f"(slice_groups[{index}].rayjob_slices: {group.rayjob_slices})"
        )
    if group.shape.hosts > 1 and len(request.name) > MAX_MULTI_HOST_RAYJOB_NAME:
        raise RayJobError(
            f"--name: {request.name!r} is {len(request.name)} characters; a RayJob on a multi-host slice takes at most "
            f"{MAX_MULTI_HOST_RAYJOB_NAME} ({cite('webhook-headless-name')})"
        )
    if group.capacity_kind == "queued-provisioning":
        if request.slices > 1:
            raise RayJobError(
                f"--slices: {request.slices} slices of queued-provisioning group {group.name} in one RayJob; GKE provisions one "
                f"PodSet per ProvisioningRequest and documents no request that makes several multi-host slices: submit one RayJob "
                f"per slice ({cite('dws-one-podset')})"
            )
        if request.active_deadline_s > DWS_MAX_RUN_S:
            raise RayJobError(
                f"--active-deadline: {request.active_deadline_s} s is longer than a queued-provisioning node may run "
                f"({DWS_MAX_RUN_S} s, 7 days: {cite('dws-max-run')})"
            )
    return group


def submitter_template(env: Environment, request: RayJobRequest, image: str) -> dict[str, Any]:
    """The submitter Job's pod: ours, on the CPU pool, in the job's Ray cluster (its NetworkPolicy lets
    it reach the head). KubeRay adds RAY_DASHBOARD_ADDRESS, RAY_JOB_SUBMISSION_ID and the token to its
    first container and leaves its command alone (rayjob_controller.go:634-662)."""
    args = ["--entrypoint", request.entrypoint]
    if request.runtime_env:
        args += ["--runtime-env-json", json.dumps(request.runtime_env, sort_keys=True)]
    container = {
        "name": SUBMITTER_CONTAINER,
        "image": image,
        "command": ["python", "-m", "jobs.client.submitter"],
        "args": args,
        "resources": {"requests": dict(SUBMITTER_REQUESTS), "limits": dict(SUBMITTER_LIMITS)},
        "securityContext": CONTAINER_SECURITY,
    }
    pod: dict[str, Any] = {"restartPolicy": "Never", "securityContext": dict(POD_SECURITY), "containers": [container]}
    if env.mode == "standard":
        pod["nodeSelector"] = {"cloud.google.com/gke-nodepool": CPU_POOL_NAME}
    return {"metadata": {"labels": pod_labels(env, RayClusterPods(request.name, None))}, "spec": pod}


def ray_job(env: Environment, request: RayJobRequest) -> dict[str, Any]:
    group = check(env, request)
    image = request.image or env.ray.worker_image(group.generation)
    cluster = RayClusterPods(request.name, token_secret=None)
    head = head_group(env, cluster)
    (head_container,) = head["template"]["spec"]["containers"]
    head_container["image"] = image  # the entrypoint runs here: it needs the code
    worker = tpu_worker_group(env, group, cluster, slices=request.slices, name=request.name)
    worker.update(replicas=request.slices, minReplicas=request.slices, maxReplicas=request.slices)
    pod = worker["template"]["spec"]
    pod["containers"][0]["image"] = image  # the TPU image, or the serving image a batch job asked for
    pod["tolerations"] = [*pod.get("tolerations", []), TPU_TOLERATION]
    if request.mount_bucket:
        head, worker = with_bucket_mount(env, head), with_bucket_mount(env, worker)
        pod = worker["template"]["spec"]
    annotations: dict[str, str] = {}
    if group.capacity_kind == "queued-provisioning":
        # Queued-provisioning nodes carry the gke-queued label and taint (GKE's ray-kueue-dws
        # tutorial); the request's nodes run no longer than the job may.
        pod["nodeSelector"] = {**pod["nodeSelector"], QUEUED_LABEL: "true"}
        pod["tolerations"].append(QUEUED_TOLERATION)
        annotations[MAX_RUN_ANNOTATION] = str(request.active_deadline_s)
    spec: dict[str, Any] = {
        "entrypoint": request.entrypoint,
        "submissionMode": SUBMISSION_MODE,
        "submitterPodTemplate": submitter_template(env, request, image),
        "submitterConfig": {"backoffLimit": SUBMITTER_BACKOFF_LIMIT},
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
    if request.runtime_env:
        spec["runtimeEnvYAML"] = yaml.safe_dump(request.runtime_env, sort_keys=False)
    metadata_labels = {**labels(env), JOB_LABEL: request.job}
    if env.kueue is not None:
        metadata_labels[QUEUE_LABEL] = env.kueue.local_queue
        metadata_labels[PRIORITY_LABEL] = request.priority or env.kueue.default_priority
    metadata: dict[str, Any] = {"name": request.name, "namespace": env.ray.namespace, "labels": metadata_labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata, "spec": spec}


def rayjob_manifests(env: Environment, request: RayJobRequest) -> list[dict[str, Any]]:
    """The RayJob and the NetworkPolicy its cluster's pods need, in `kubectl apply` order."""
    job = ray_job(env, request)
    return [copy.deepcopy(network_policy(env, request.name, serving=False)), job]
