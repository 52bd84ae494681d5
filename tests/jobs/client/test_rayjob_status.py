"""What a RayJob's state means to `jobs.submit --rayjob` (pure): every jobDeploymentStatus KubeRay
has, Kueue's hold on a suspended RayJob, the exit status of each end, one line each."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.client.rayjob_status import DEPLOYMENT_STATUSES, TERMINAL, one_line, phase, workload_message

QUEUE = {"kueue.x-k8s.io/queue-name": "ray-jobs"}


def rayjob(
    status: dict[str, Any] | None = None, *, suspend: bool = False, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "hc-1", "namespace": "default", "labels": labels or {}},
        "spec": {"entrypoint": "python -m jobs.healthcheck", **({"suspend": True} if suspend else {}), **spec},
        "status": status or {},
    }


@pytest.mark.parametrize("deployment", DEPLOYMENT_STATUSES)
@pytest.mark.parametrize("labels", [{}, QUEUE], ids=["no-queue", "kueue"])
def test_every_deployment_status_is_a_phase_of_one_line(deployment, labels):
    status = {"jobDeploymentStatus": deployment, "jobId": "hc-1-abcde", "rayClusterName": "hc-1-fghij", "message": "a\nb"}
    now = phase(rayjob(status, labels=labels))
    assert now.line and "\n" not in now.line and "\n" not in now.waiting_for
    assert (now.exit_code is not None) == (deployment in TERMINAL)
    assert now.waiting_for.startswith("to "), now  # reads on from "waited N s for RayJob X ..."


def test_the_way_to_success():
    assert phase(rayjob({})).name == "new"
    initializing = phase(rayjob({"jobDeploymentStatus": "Initializing", "rayClusterName": "hc-1-fghij", "jobId": "hc-1-abcde"}))
    assert initializing.line == "Initializing: RayCluster hc-1-fghij is coming up"
    assert initializing.waiting_for == "to bring up RayCluster hc-1-fghij (Initializing)"
    running = phase(
        rayjob({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": "hc-1-abcde", "rayClusterName": "hc-1-fghij"})
    )
    assert running.line == "Running: job hc-1-abcde on RayCluster hc-1-fghij" and running.exit_code is None
    assert running.waiting_for == "to finish job hc-1-abcde (Running; Ray job status RUNNING)"
    done = phase(rayjob({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "jobId": "hc-1-abcde"}))
    assert (done.line, done.exit_code) == ("Complete: job hc-1-abcde SUCCEEDED", 0)


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (
            {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "message": "The RayJob has passed the activeDeadlineSeconds."},
            "Failed (DeadlineExceeded): The RayJob has passed the activeDeadlineSeconds.",
        ),
        (
            {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "message": "exit code 1\nTraceback ..."},
            "Failed (AppFailed): exit code 1 Traceback ...",
        ),
        ({"jobDeploymentStatus": "Failed", "reason": "SubmissionFailed"}, "Failed (SubmissionFailed): no message"),
        (
            {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED", "jobId": "hc-1-abcde"},
            "Complete: job hc-1-abcde was STOPPED before it finished",
        ),
        (
            {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed", "message": "The RayJob spec is invalid"},
            "ValidationFailed: KubeRay refused the RayJob: The RayJob spec is invalid",
        ),
    ],
)
def test_every_other_end_exits_1_saying_why(status, line):
    end = phase(rayjob(status))
    assert (end.line, end.exit_code) == (line, 1)


def test_a_long_message_stays_one_readable_line():
    end = phase(rayjob({"jobDeploymentStatus": "Failed", "reason": "AppFailed", "message": "last logs:\n" + "x " * 2000}))
    assert "\n" not in end.line and len(end.line) < 700 and end.line.endswith("…")
    assert one_line("  a \n\t b ") == "a b"


def test_kueue_holds_a_suspended_rayjob_whatever_kuberay_shows():
    # KubeRay takes a suspended RayJob New -> Initializing -> Suspending -> Suspended; all of it is Kueue's queue.
    for deployment in ("", "Initializing", "Suspending", "Suspended"):
        held = phase(rayjob({"jobDeploymentStatus": deployment}, suspend=True, labels=QUEUE))
        assert held.name == "queued" and held.line == "queued: Kueue holds it in LocalQueue ray-jobs until it admits it"
        assert held.waiting_for == "to be admitted by Kueue (LocalQueue ray-jobs)"
    admitted = phase(rayjob({"jobDeploymentStatus": "Suspended"}, labels=QUEUE))
    assert admitted.name == "admitted" and admitted.line == "admitted by Kueue (LocalQueue ray-jobs)"
    requeued = phase(rayjob({"jobDeploymentStatus": "Suspending"}, suspend=True, labels=QUEUE), admitted_before=True)
    assert requeued.name == "queued" and requeued.line.startswith("requeued: Kueue took its quota back (preempted or evicted)")
    own = phase(rayjob({}, suspend=True))
    assert own.name == "suspended" and "spec.suspend is true" in own.line


def test_an_end_is_an_end_even_while_suspended():
    end = phase(rayjob({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}, suspend=True, labels=QUEUE))
    assert end.exit_code == 1


def test_an_unknown_deployment_status_is_followed_not_fatal():
    later = phase(rayjob({"jobDeploymentStatus": "Hibernating"}))
    assert later.exit_code is None and later.line.startswith("Hibernating: a jobDeploymentStatus this client does not know")


def test_kueues_reason_comes_from_the_workload_that_is_not_admitted():
    pending = {
        "type": "QuotaReserved",
        "status": "False",
        "reason": "Pending",
        "message": "couldn't assign flavors to pod set head:\n insufficient quota",
    }
    workloads = {"items": [{"status": {"conditions": [pending]}}]}
    assert workload_message(workloads) == "couldn't assign flavors to pod set head: insufficient quota"
    admitted = {"items": [{"status": {"conditions": [{"type": "QuotaReserved", "status": "True", "message": "reserved"}]}}]}
    assert workload_message(admitted) == "" and workload_message({"items": []}) == ""
