"""Elastic slices (`jobs.train --min-slices K`): the pure rules of a run that keeps training on the
whole slices it has left and grows back when the lost ones return.

Ray 2.60's Ray Train has elastic JAX training on TPU (`ScalingConfig(num_workers=(min, max))`, its
`ElasticScalingPolicy` counting workers on intact slices only), and we do not use it, read in its
code (python/ray/train/v2/_internal/execution/controller/controller.py `_execute_resize_decision`,
scaling_policy/elastic.py): it grows by shutting the running worker group down wherever it is, at
most every `elastic_resize_monitor_interval_s`, so every step since the last checkpoint is thrown
away on each growth; and it shrinks only through its own failure policy, which would retry inside
`fit()` where our classification (preempted, lost, failed, user error) and budgets cannot see it.
Here each size is an attempt of our own reruns instead: a lost slice ends the attempt as every lost
host does, and the next attempt starts at once on the whole slices that are idle (at least K); a
shrunk run looks for idle whole slices every `--resize-check` seconds (Ray's interval, default 60),
and when it finds some it saves at that step boundary and ends the attempt as `Resized`, so the next
one starts on more slices from that very step. A new attempt is a new `fit()`: the mesh is rebuilt
over the slices present, the coordinator and `MEGASCALE_*` come from its own hosts.

The global batch is kept (so the loss curve does not jump): on n of N slices, every step
accumulates N / n micro-batches of the full-size run's per-host batch, so each chip holds what it
held before. n must therefore divide N.
"""

from __future__ import annotations

from dataclasses import dataclass


def sizes(wanted: int, min_slices: int) -> tuple[int, ...]:
    """The slice counts an elastic run may take, largest first: the divisors of `wanted` from
    `min_slices` up (pure)."""
    return tuple(n for n in range(wanted, min_slices - 1, -1) if wanted % n == 0)


def size_problem(wanted: int, min_slices: int) -> str | None:
    """Why `--min-slices min_slices` cannot go with `--slices wanted`, or None (pure)."""
    if min_slices > wanted:
        return f"{min_slices} is more than --slices {wanted}"
    if min_slices < wanted and sizes(wanted, min_slices) == (wanted,):
        divisors = [n for n in range(1, wanted) if wanted % n == 0]
        return (
            f"a run of {wanted} slices shrinks only to a divisor of {wanted} (it keeps the global batch by accumulating whole "
            f"micro-batches), and none is >= {min_slices}; pass one of {', '.join(map(str, divisors))} or {wanted}"
        )
    return None


def pick(wanted: int, min_slices: int, idle: int) -> int | None:
    """How many slices an attempt takes with `idle` whole idle slices: the largest allowed size that
    is there, else None (wait for `min_slices`) (pure)."""
    return next((n for n in sizes(wanted, min_slices) if n <= idle), None)


def accumulation(wanted: int, slices: int) -> int:
    """Micro-batches per step on `slices` of `wanted` slices (pure; `slices` divides `wanted`)."""
    if slices <= 0 or wanted % slices:
        raise ValueError(f"{slices} slices do not divide {wanted}")
    return wanted // slices


@dataclass(frozen=True)
class GrowPlan:
    grow: bool
    slices: int
    why: str


def plan_growth(running: int, wanted: int, min_slices: int, idle: int) -> GrowPlan:
    """A run on `running` of its `wanted` slices, with `idle` more whole idle slices in the cluster:
    grow (save here, and rerun on more slices) when a larger allowed size fits (pure)."""
    if running >= wanted:
        return GrowPlan(False, running, "on every slice")
    target = pick(wanted, min_slices, running + idle)
    if target is None or target <= running:
        return GrowPlan(False, running, f"{idle} whole idle slice(s): not enough to grow from {running}")
    return GrowPlan(True, target, f"{idle} whole idle slice(s): growing from {running} to {target} slices")
