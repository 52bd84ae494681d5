"""Kueue's part of the fake Kubernetes API (tests/fake_kube.py), as strict as Kueue v0.19.2: each
RayJob labelled `kueue.x-k8s.io/queue-name` is suspended and gets a Workload, which is admitted,
left pending or preempted by Kueue's own arithmetic (infra.manifests.kueue_admission, ported with
its source lines), against the ResourceFlavors, ClusterQueue and WorkloadPriorityClasses that
`python -m infra manifests` printed for the environment:

- PodSets and their requests, flavor assignment by taints and labels, quota per flavor and resource
  less what the admitted workloads use: a job that can never fit stays pending with Kueue's message.
- Priorities: `kueue.x-k8s.io/priority-class` names a WorkloadPriorityClass; a name with no class
  leaves the job suspended with no Workload at all (jobframework/reconciler.go:1716-1724, 1818-1829).
  Pending workloads are tried highest priority first, then oldest (BestEffortFIFO: one that cannot
  fit does not hold back the others).
- Preemption within the ClusterQueue: the targets Kueue picks are evicted (their RayJob suspended,
  their run stopped), and their quota is free once they have stopped; they are pending again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra.manifests.kueue_admission import Admitted, Flavor, assign, pod_sets, preemption_targets, total_usage

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


@dataclass
class Queued:
    job: dict[str, Any]
    priority: int | None  # None: its priority class does not exist (no Workload)
    created: float
    state: str = "pending"  # pending, admitted, evicting, finished
    message: str = "the fake Kueue holds it for a moment before admitting it"
    admitted_at: float = 0.0
    usage: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return self.job["metadata"]["uid"]


class FakeKueue:
    def __init__(self, docs: list[dict[str, Any]], hold_s: float):
        queues = [d for d in docs if d["kind"] == "ClusterQueue"]
        self.queue = queues[0] if queues else None
        self.local_queues = {d["metadata"]["name"] for d in docs if d["kind"] == "LocalQueue"}
        self.flavors = {d["metadata"]["name"]: Flavor.of(d) for d in docs if d["kind"] == "ResourceFlavor"}
        self.priorities = {d["metadata"]["name"]: int(d["value"]) for d in docs if d["kind"] == "WorkloadPriorityClass"}
        self.hold_s = hold_s
        self.jobs: dict[str, Queued] = {}

    def add(self, job: dict[str, Any]) -> None:
        name = (job["metadata"].get("labels") or {}).get(PRIORITY_LABEL)
        priority: int | None = 0 if name is None else self.priorities.get(name)
        self.jobs[job["metadata"]["uid"]] = Queued(job, priority, time.monotonic())

    def remove(self, uid: str) -> None:
        self.jobs.pop(uid, None)

    def schedule(
        self,
        start: Callable[[dict[str, Any]], None],
        evict: Callable[[dict[str, Any]], None],
        stopped: Callable[[str], bool],
        finished: Callable[[str], bool],
    ) -> None:
        """One pass of Kueue's scheduler: a finished RayJob's workload gives its quota back (Kueue
        frees it when the job ends, not when KubeRay deletes its cluster), and so does an evicted one
        once its run stopped; then each pending workload, in order, is admitted, left pending or
        makes room by preemption."""
        for queued in self.jobs.values():
            if queued.state == "admitted" and finished(queued.uid):
                queued.state, queued.usage, queued.message = "finished", {}, "Job finished successfully"
            if queued.state == "evicting" and stopped(queued.uid):
                queued.state, queued.usage, queued.created = "pending", {}, time.monotonic()
                queued.message = "Preempted to accommodate a higher priority Workload; pending again"
        if self.queue is None:
            return
        now = time.monotonic()
        pending = [q for q in self.jobs.values() if q.state == "pending" and q.priority is not None and now - q.created >= self.hold_s]
        pending.sort(key=lambda q: (-(q.priority or 0), q.created))
        for queued in pending:
            if (queued.job["metadata"].get("labels") or {}).get(QUEUE_LABEL) not in self.local_queues:
                queued.message = f"LocalQueue {queued.job['metadata']['labels'][QUEUE_LABEL]} doesn't exist"
                continue
            admitted = [
                Admitted(q.uid, q.priority or 0, q.admitted_at, q.usage) for q in self.jobs.values() if q.state in ("admitted", "evicting")
            ]
            podsets = pod_sets(queued.job)
            verdict = assign(podsets, self.queue, self.flavors, total_usage(admitted))
            if verdict.fits:
                queued.state, queued.admitted_at, queued.usage = "admitted", time.monotonic(), verdict.usage
                queued.message = f"Quota reserved in ClusterQueue {self.queue['metadata']['name']}"
                start(queued.job)
                continue
            if verdict.message:
                queued.message = verdict.message
                continue
            busy = [a for a in admitted if self.jobs[a.name].state == "admitted"]
            if assign(podsets, self.queue, self.flavors, total_usage(busy)).fits:
                queued.message = "waiting for the workloads it preempted to stop"
                continue
            targets = preemption_targets(podsets, queued.priority or 0, self.queue, self.flavors, busy)
            if not targets:
                queued.message = f"couldn't assign flavors: insufficient unused quota in ClusterQueue {self.queue['metadata']['name']}"
                continue
            names = ", ".join(self.jobs[t.name].job["metadata"]["name"] for t in targets)
            queued.message = f"Pending the preemption of {len(targets)} workload(s): {names}"
            for target in targets:
                self.jobs[target.name].state = "evicting"
                evict(self.jobs[target.name].job)

    def workload(self, uid: str) -> dict[str, Any] | None:
        """The Workload of a queued RayJob, or None: not queued here, or its priority class missing."""
        queued = self.jobs.get(uid)
        if queued is None or queued.priority is None:
            return None
        meta = queued.job["metadata"]
        admitted = queued.state == "admitted"
        conditions = [
            {
                "type": "QuotaReserved",
                "status": "True" if admitted else "False",
                "reason": "QuotaReserved" if admitted else "Pending",
                "message": queued.message,
            }
        ]
        if admitted:
            conditions.append({"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""})
        if queued.state == "evicting":
            conditions.append(
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": "Preempted",
                    "message": "Preempted to accommodate a higher priority Workload",
                }
            )
        return {
            "kind": "Workload",
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "metadata": {"name": f"rayjob-{meta['name']}", "namespace": meta["namespace"], "labels": {JOB_UID_LABEL: meta["uid"]}},
            "spec": {"queueName": meta["labels"][QUEUE_LABEL], "priority": queued.priority},
            "status": {"conditions": conditions},
        }
