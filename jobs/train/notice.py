"""What the training loop does on a preemption notice (a pure rule, and the timer of saves it reads).

A notice reaches the workers through Ray Train (Ray 2.60): `ray start --block` turns the SIGTERM of a
preempted node (or of a Kueue eviction) into a drain with a deadline, Ray Train's watcher sees the
drain, and `ray.train.get_preemption_info()` returns it on every rank (a barrier: each rank calls it
once per step, so all of them learn it at the same step boundary). Rank 0 then decides for all
(`plan_on_notice`): save the step just finished, if the save fits in what is left of the notice by
the longest save measured so far, else keep the last checkpoint and say so. Either way the attempt
ends as preempted: training on would only make steps the next attempt throws away.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# A save must fit in the notice with this much to spare (the raylet's own shutdown follows it).
SAVE_MARGIN = 1.25


@dataclass(frozen=True)
class NoticePlan:
    save: bool
    why: str  # one line, for the log and the ledger


def plan_on_notice(
    step: int, remaining_s: float | None, save_estimate_s: float | None, committed_step: int | None, saving_step: int | None
) -> NoticePlan:
    """Save step `step` on a notice with `remaining_s` left (None: no deadline), given the longest
    save measured so far (None: none measured) and the newest committed and in-flight saves (pure)."""
    last = f"step {committed_step}" if committed_step else "the start (no checkpoint yet)"
    if committed_step == step:
        return NoticePlan(False, f"step {step} is already committed")
    if saving_step == step:
        return NoticePlan(True, f"step {step} is being saved: waiting for its commit")
    if remaining_s is not None and remaining_s <= 0:
        return NoticePlan(False, f"the notice's deadline has passed: resuming from {last}")
    if remaining_s is None or save_estimate_s is None:
        unknown = "no deadline" if remaining_s is None else "no save measured yet"
        return NoticePlan(True, f"saving step {step} ({unknown})")
    if save_estimate_s * SAVE_MARGIN <= remaining_s:
        return NoticePlan(True, f"saving step {step}: {remaining_s:.1f} s left, a save takes {save_estimate_s:.1f} s")
    return NoticePlan(
        False,
        f"the notice's {remaining_s:.1f} s left are shorter than a save ({save_estimate_s:.1f} s with "
        f"{SAVE_MARGIN:g}x to spare): resuming from {last}",
    )


def remaining_s(deadline_ms: int | None, now: float) -> float | None:
    """Seconds left before a drain's deadline (Ray's `deadline_ms`, 0 or None: none) (pure)."""
    return None if not deadline_ms else max(0.0, deadline_ms / 1000 - now)


class SaveTimer:
    """The longest save seen, from its start to its commit (an upper bound: a commit is noticed at
    the next step boundary), for `plan_on_notice`."""

    def __init__(self) -> None:
        self.longest_s: float | None = None
        self._started: float | None = None

    def started(self) -> None:
        self._started = time.perf_counter()

    def poll(self, in_progress: bool) -> None:
        """Call at a step boundary with `manager.is_saving_in_progress()`."""
        if self._started is not None and not in_progress:
            self.measured(time.perf_counter() - self._started)
            self._started = None

    def measured(self, seconds: float) -> None:
        self.longest_s = seconds if self.longest_s is None else max(self.longest_s, seconds)
