"""The config's `kueue` section: the queues RayJobs go through, and the priorities they run at."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from infra.config.fields import Name, Strict

# Kueue's WorkloadPriorityClass `value` is an int32 (the v1beta2 CRD: `format: int32`).
Priority = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
DEFAULT_PRIORITIES = {"low": 100, "normal": 1000, "high": 10000}


class KueueConfig(Strict):
    """Kueue queues the environment's RayJobs against quotas in chips (its presence turns it on).
    `python -m infra manifests` prints its ResourceFlavors, WorkloadPriorityClasses, ClusterQueue
    and LocalQueue; the quota is the slices the groups leave to RayJobs (`rayjob_slices`). Kueue
    itself is installed once per cluster, from its pinned release (README "Batch jobs")."""

    # The LocalQueue RayJobs name (kueue.x-k8s.io/queue-name), in the Ray namespace. Never `default`:
    # Kueue gives a LocalQueue of that name every unlabelled workload, the long-lived RayCluster too.
    local_queue: Name = "ray-jobs"
    # The ClusterQueue; default `<cluster_name>-tpu`.
    cluster_queue: Name | None = None
    # WorkloadPriorityClasses (name: value; higher runs first). A pending job preempts running jobs of
    # lower priority in the ClusterQueue when the quota is full (`withinClusterQueue: LowerPriority`).
    # `jobs.submit --priority NAME` picks one; `default_priority` when it names none.
    priorities: Annotated[dict[Name, Priority], Field(min_length=1)] = dict(DEFAULT_PRIORITIES)
    default_priority: Annotated[Name, Field(validate_default=True)] = "normal"

    @field_validator("local_queue")
    @classmethod
    def _not_default(cls, value: str) -> str:
        if value == "default":
            raise ValueError(
                "a LocalQueue named `default` takes every workload without a queue-name label in its namespace "
                "(Kueue's default LocalQueue), the RayCluster and RayService too: pick another name, e.g. ray-jobs"
            )
        return value

    @field_validator("default_priority")
    @classmethod
    def _one_of_the_priorities(cls, value: str, info: ValidationInfo) -> str:
        priorities = info.data.get("priorities")
        if priorities is not None and value not in priorities:  # else the priorities' own error says why
            raise ValueError(f"{value!r} is not one of kueue.priorities; valid: {', '.join(priorities)}")
        return value
