"""What a RayJob's state means to the one following it (pure): the phase it is in, one line saying
so, what it waits for next, and, at the end, the exit status.

KubeRay's RayJob controller (ray-operator rayjob_controller.go) drives `status.jobDeploymentStatus`
through `""` (New) -> Initializing -> Running -> Complete | Failed, or ValidationFailed for a spec it
refuses; Suspending / Suspended while `spec.suspend` is true, Retrying between attempts
(backoffLimit), Waiting in InteractiveMode, Scheduling / Scheduled for a cron `spec.schedule`.
Kueue's webhook sets `spec.suspend: true` on a RayJob that names a LocalQueue
(`kueue.x-k8s.io/queue-name`) and clears it when it admits the RayJob's Workload: so a suspended
RayJob is queued whatever its deployment status says (KubeRay takes it to Initializing, then
Suspending, then Suspended, while Kueue holds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# KubeRay's JobDeploymentStatus values (apis/ray/v1/rayjob_types.go); "" is New.
DEPLOYMENT_STATUSES = (
    "",
    "Initializing",
    "Running",
    "Complete",
    "Failed",
    "ValidationFailed",
    "Suspending",
    "Suspended",
    "Retrying",
    "Waiting",
    "Scheduling",
    "Scheduled",
)
TERMINAL = ("Complete", "Failed", "ValidationFailed")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MESSAGE_CHARS = 600  # a Ray job's message can carry its last log lines: the line stays readable


@dataclass(frozen=True)
class Phase:
    """`name` changes when the phase does; `line` says it; `waiting_for` completes "waited N s for
    RayJob X ..."; `exit_code` is set once the RayJob has ended (0 its job succeeded, else 1)."""

    name: str
    line: str
    waiting_for: str
    exit_code: int | None = None


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def queue_of(rayjob: dict[str, Any]) -> str | None:
    return (rayjob.get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL)


def phase(rayjob: dict[str, Any], *, admitted_before: bool = False) -> Phase:
    """The phase of a RayJob object (`kubectl get rayjob NAME -o json`). `admitted_before`: it ran
    before, so a suspension now is Kueue taking it back (preemption, eviction)."""
    spec, status = rayjob.get("spec") or {}, rayjob.get("status") or {}
    deployment = status.get("jobDeploymentStatus") or ""
    queue = queue_of(rayjob)
    cluster = status.get("rayClusterName") or "(not named yet)"
    job_id = status.get("jobId") or "(no id yet)"
    if deployment in TERMINAL:
        return _ended(deployment, status, job_id)
    if spec.get("suspend"):
        if queue and admitted_before:
            line = f"requeued: Kueue took its quota back (preempted or evicted) and holds it in LocalQueue {queue} until it admits it again"
            return Phase("queued", line, f"to be admitted by Kueue again (LocalQueue {queue})")
        if queue:
            return Phase(
                "queued",
                f"queued: Kueue holds it in LocalQueue {queue} until it admits it",
                f"to be admitted by Kueue (LocalQueue {queue})",
            )
        return Phase(
            "suspended", "suspended: spec.suspend is true; KubeRay starts it once that is false", "to be resumed (spec.suspend is true)"
        )
    if deployment == "Suspending":  # suspended and resumed at once: KubeRay finishes the suspension first
        return Phase(
            "suspending", f"Suspending: RayCluster {cluster} is being deleted", f"to finish suspending (RayCluster {cluster} being deleted)"
        )
    if deployment in ("", "Suspended"):
        if queue:
            return Phase("admitted", f"admitted by Kueue (LocalQueue {queue})", "to get its RayCluster from KubeRay (admitted by Kueue)")
        return Phase("new", "created; waiting for the KubeRay operator to start it", "to be started by the KubeRay operator")
    if deployment == "Initializing":
        return Phase("Initializing", f"Initializing: RayCluster {cluster} is coming up", f"to bring up RayCluster {cluster} (Initializing)")
    if deployment == "Running":
        ray_status = status.get("jobStatus") or "not reported yet"
        return Phase(
            "Running", f"Running: job {job_id} on RayCluster {cluster}", f"to finish job {job_id} (Running; Ray job status {ray_status})"
        )
    if deployment == "Retrying":
        line = "Retrying: an attempt failed; KubeRay deletes its RayCluster and starts over (backoffLimit)"
        return Phase("Retrying", line, "to start its next attempt (Retrying)")
    if deployment == "Waiting":
        line = "Waiting: InteractiveMode; KubeRay waits for someone to submit the job (spec.jobId)"
        return Phase("Waiting", line, "to get a job submitted (InteractiveMode)")
    if deployment in ("Scheduling", "Scheduled"):
        line = f"{deployment}: it runs on spec.schedule ({spec.get('schedule') or 'not set'})"
        return Phase(deployment, line, f"to start its next scheduled run ({deployment})")
    line = f"{deployment}: a jobDeploymentStatus this client does not know; still following it"
    return Phase(deployment, line, f"to leave jobDeploymentStatus {deployment}")


def _ended(deployment: str, status: dict[str, Any], job_id: str) -> Phase:
    line, code = _end(deployment, status, job_id)
    return Phase(deployment, line, f"to show its last log lines (it had ended: {deployment})", code)


def _end(deployment: str, status: dict[str, Any], job_id: str) -> tuple[str, int]:
    """The end's line and exit status: 0 only for a Ray job that SUCCEEDED."""
    ray_status = status.get("jobStatus") or ""
    reason = status.get("reason") or ""
    message = one_line(status.get("message") or "")
    because = f" ({reason})" if reason else ""
    detail = f": {message}" if message else ""
    if deployment == "ValidationFailed":
        return f"ValidationFailed: KubeRay refused the RayJob{detail}", 1
    if deployment == "Complete" and ray_status == "SUCCEEDED":
        return f"Complete: job {job_id} SUCCEEDED", 0
    if deployment == "Complete":
        what = {"STOPPED": "was STOPPED before it finished", "FAILED": "FAILED"}.get(
            ray_status, f"ended {ray_status or 'with no Ray job status'}"
        )
        return f"Complete{because}: job {job_id} {what}{detail}", 1
    return f"Failed{because}{detail or ': no message'}", 1


def workload_message(workloads: dict[str, Any]) -> str:
    """Why Kueue has not admitted a Workload yet (`kubectl get workloads -o json`): the message of
    its QuotaReserved (or Admitted) condition that is False; empty when none says."""
    for workload in workloads.get("items") or []:
        for condition in (workload.get("status") or {}).get("conditions") or []:
            if condition.get("type") in ("QuotaReserved", "Admitted") and condition.get("status") == "False" and condition.get("message"):
                return one_line(condition["message"])
    return ""
