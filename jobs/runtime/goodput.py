"""Goodput and badput of a training run, from the events its ledger holds (pure).

A run's ledger (`<run dir>/goodput.jsonl`, written by `jobs.runtime.ledger`) is one JSON object per
line, `{"t": <unix time>, "event": <kind>, ...}`, in the order they happened:

    attempt_start  {attempt, slices, hosts}  the driver begins an attempt (a fit() on `slices` whole
                                             slices of `hosts` hosts: fewer on an elastic run that
                                             lost one)
    reserved       {attempt}                 whole idle slices are there for it
    workers_started {attempt}                rank 0's training function runs (jax.distributed is up)
    state_built    {attempt}                 the mesh, shardings and compiled-function objects exist
    initialized    {attempt, how, seconds}   parameters made: how = "random" or "import"
    restored       {attempt, step, seconds}  or restored from the checkpoint at `step`
    data_wait      {attempt, seconds}        blocked waiting for the first batch
    compiled       {attempt, seconds, lower_s, wait_s, cache_hits, cache_misses}  the step compiled
                                             (or found in the persistent cache) while the
                                             parameters were made, `lower_s` of it tracing and
                                             lowering; wait_s: what the loop then still waited for it
    step           {attempt, step, seconds, data_s, loss}  step `step` (1-based) ran for `seconds`, after
                                             waiting `data_s` for its batch; an attempt's first
                                             step adds {hit_hosts, hosts}: how many hosts found
                                             the step in the persistent cache
    save           {attempt, step, stall_s}  a checkpoint save started; the loop was blocked stall_s
    notice         {attempt, step, remaining_s, save, why}  a preemption notice reached the workers
                                             after `step` (remaining_s: left of it; save: whether
                                             the step is saved in it, why: the decision)
    resize         {attempt, step, slices, why}  an elastic run saves `step` to go on `slices` slices
    saved_now      {attempt, step, seconds}  that save, committed after `seconds` (a `save` event
                                             with the same stall precedes it)
    fit_failed     {attempt}                 Ray Train's run raised (before the error was classified)
    attempt_end    {attempt, outcome}        the attempt ended: succeeded, preempted, host-lost,
                                             resized, failed, ...

`account(events, now)` turns them into goodput (productive step time over the wall time since the
first attempt started) and badput in the categories of Google's `ml-goodput-measurement`, named as
its `BadputType` is (ml_goodput_measurement 0.2.3, src/goodput_utils.py lines 81-97, read
2026-12-04). That library reads its events from Cloud Logging, so it is not a dependency; its rules
are followed where they apply (src/goodput.py, same version):

- PROGRAM_STARTUP: the wait for the step's compilation (what of it the restore did not hide), and
  the first step of each attempt beyond the attempt's average step (what the first call still
  costs: collectives connecting, buffers allocated), as `_compute_segment_final_metrics` does; an
  attempt of one step keeps it productive.
- WASTED_PROGRESS_FROM_DISRUPTION: steps an attempt ran past the checkpoint the next attempt resumed
  from (the library's steps "lost due to disruption"); a run that ended failed loses those past its
  last save.
- INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION: from a disrupted attempt's last event (its last step
  or save: Ray Train noticing the lost host and the driver classifying it count here) to the next
  attempt having its slices again (the library counts disruption -> restart; a re-provisioned host
  is part of the restart here, since the new attempt waits for it). The gap after an attempt that
  succeeded (the run resubmitted with more steps) is no disruption: it is OTHER.
- TPU_INITIALIZATION: the first attempt's wait for slices, and every attempt's start of the workers
  with jax.distributed (Ray Train's worker group).
- TRAINING_PREP: building the sharded state and initializing (random or imported) parameters.
- DATA_LOADING_SYNC: time blocked waiting for a batch. DATA_LOADING_ASYNC is 0: Ray Data loads in
  the background, overlapping the steps, so it costs no wall time of its own.
- UNPRODUCTIVE_CHECKPOINT_SAVE_TIME / _RESTORE_TIME: the save stalls; the restores.
- CUSTOM_BADPUT_EVENTS: none are recorded (0).
- OTHER: the rest of the wall time (what no event covers: the driver between attempts, opening the
  checkpoint manager, the last save's wait and Ray Train's teardown), as the library computes OTHER.

Productive time plus every category is the wall time.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class BadputType(enum.Enum):
    """ml-goodput-measurement's BadputType (0.2.3), less its elastic-training members."""

    TPU_INITIALIZATION = 1
    TRAINING_PREP = 2
    PROGRAM_STARTUP = 3
    DATA_LOADING_SYNC = 4
    DATA_LOADING_ASYNC = 5
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME = 6
    UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME = 7
    WASTED_PROGRESS_FROM_DISRUPTION = 8
    INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION = 9
    CUSTOM_BADPUT_EVENTS = 10
    OTHER = 11


EVENTS = frozenset(
    {
        "attempt_start",
        "reserved",
        "workers_started",
        "state_built",
        "initialized",
        "restored",
        "data_wait",
        "compiled",
        "step",
        "save",
        "notice",
        "resize",
        "saved_now",
        "fit_failed",
        "attempt_end",
    }
)


# The driver's notes of an attempt's end: a disruption starts at the attempt's last event before them.
DRIVER_ENDS = frozenset({"fit_failed", "attempt_end"})
# Outcomes of an attempt that ended by itself: what follows is a new submission, not a recovery.
FINISHED = frozenset({"succeeded", "already-trained"})


class LedgerError(ValueError):
    """A ledger that cannot be accounted for; the message says which line and why."""


@dataclass(frozen=True)
class AttemptTimes:
    """One attempt's timeline, seconds since the first attempt started (None: did not happen)."""

    attempt: int
    start: float
    reserved: float | None
    workers_started: float | None
    state_built: float | None
    first_step_start: float | None  # when its first step began (its end minus its seconds)
    restored_step: int | None  # the checkpoint it resumed from
    steps: tuple[int, int] | None  # (first, last) step it ran
    outcome: str | None
    end: float | None
    slices: int | None = None  # what it ran on (attempt_start's; None in a ledger from before they were recorded)
    hosts: int | None = None
    notice: str | None = None  # what a preemption notice or an elastic resize did, in a few words

    def describe_events(self) -> str:
        on = f" on {self.slices} slice(s), {self.hosts} hosts" if self.slices is not None else ""
        return on + (f"; {self.notice}" if self.notice else "")


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    productive_s: float
    badput_s: Mapping[BadputType, float]
    attempts: tuple[AttemptTimes, ...]
    disruptions: int  # attempts ended by a fault (a resize is none: `resizes`)
    last_step: int
    finished: bool = field(default=False)
    resizes: int = 0  # attempts an elastic run ended itself to change its slices

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def disruption_badput_s(self) -> float:
        """What the disruptions cost: infrastructure recovery plus wasted progress."""
        return self.badput_s[BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] + self.badput_s[BadputType.WASTED_PROGRESS_FROM_DISRUPTION]

    def as_dict(self) -> dict[str, Any]:
        """The figures, for a job's result line."""
        return {
            "goodput": self.goodput,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "badput_s": {k.name: v for k, v in self.badput_s.items()},
            "attempts": len(self.attempts),
            "disruptions": self.disruptions,
            "resizes": self.resizes,
            "last_step": self.last_step,
        }

    def describe(self) -> str:
        state = "finished" if self.finished else "running or stopped"
        lines = [
            f"goodput {self.goodput:.1%}: {self.productive_s:.1f} s of productive steps in {self.wall_s:.1f} s since the first "
            f"attempt started ({len(self.attempts)} attempt(s), {self.disruptions} disruption(s), {self.resizes} resize(s), last step {self.last_step}, {state})",
        ]
        for kind in BadputType:
            seconds = self.badput_s[kind]
            share = seconds / self.wall_s if self.wall_s > 0 else 0.0
            lines.append(f"  badput {kind.name:40} {seconds:9.1f} s  {share:6.1%}")
        return "\n".join(lines)


def _check(events: Sequence[Mapping[str, Any]]) -> None:
    for i, e in enumerate(events, 1):
        if not isinstance(e, Mapping) or e.get("event") not in EVENTS or not isinstance(e.get("t"), int | float):
            raise LedgerError(f"event {i} is not a ledger event (needs 't' and an 'event' of {sorted(EVENTS)}): {e!r}")
        if e["event"] != "attempt_start" and "attempt" not in e:
            raise LedgerError(f"event {i} ({e['event']}) names no attempt")


def _attempts(events: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for e in events:
        out.setdefault(int(e["attempt"]), []).append(e)
    return dict(sorted(out.items()))


def _kept_until(nxt: Sequence[Mapping[str, Any]] | None, saved: Sequence[int], ended: Mapping[str, Any] | None) -> int | None:
    """The last step of an attempt that was not lost (None: all of them): the checkpoint the next
    attempt restored; 0 when it started over; else (not known yet, or the run ended failed) the
    attempt's last save."""
    if nxt is not None:
        restored = [int(e["step"]) for e in nxt if e["event"] == "restored"]
        if restored:
            return restored[0]
        if any(e["event"] in ("initialized", "step") for e in nxt):
            return 0
        return max(saved, default=0)
    if ended is not None and ended.get("outcome") != "succeeded":
        return max(saved, default=0)
    return None


def account(events: Iterable[Mapping[str, Any]], now: float | None = None) -> Goodput:
    """Goodput and badput of the run whose ledger holds `events` (pure). `now` ends the wall time of
    a run whose last attempt has not ended (default: its last event)."""
    events = sorted(events, key=lambda e: e.get("t", 0) if isinstance(e, Mapping) else 0)
    _check(events)
    if not events or events[0]["event"] != "attempt_start":
        raise LedgerError("the ledger has no attempt_start first: no attempt of this run started")
    t0 = float(events[0]["t"])
    by_attempt = _attempts(events)
    numbers = list(by_attempt)
    last = by_attempt[numbers[-1]]
    finished = last[-1]["event"] == "attempt_end"
    end = float(last[-1]["t"]) if finished or now is None else max(float(now), float(last[-1]["t"]))
    bad = dict.fromkeys(BadputType, 0.0)
    productive = 0.0
    times: list[AttemptTimes] = []
    disruptions = resizes = 0
    last_step = 0
    for index, number in enumerate(numbers):
        evs = by_attempt[number]
        first = {e["event"]: e for e in reversed(evs)}  # the first of each kind
        start = float(first["attempt_start"]["t"]) if "attempt_start" in first else float(evs[0]["t"])
        steps = [e for e in evs if e["event"] == "step"]
        ended = first.get("attempt_end")
        nxt = by_attempt[numbers[index + 1]] if index + 1 < len(numbers) else None
        saved = [int(e["step"]) for e in evs if e["event"] == "save"]
        keep_until = _kept_until(nxt, saved, ended)
        reserved = float(first["reserved"]["t"]) if "reserved" in first else None
        workers = float(first["workers_started"]["t"]) if "workers_started" in first else None
        built = float(first["state_built"]["t"]) if "state_built" in first else None
        # Waiting for slices: the first attempt's is start-up; a later one's is recovery (below).
        if reserved is not None and index == 0:
            bad[BadputType.TPU_INITIALIZATION] += reserved - start
        if reserved is not None and workers is not None:
            bad[BadputType.TPU_INITIALIZATION] += workers - reserved
        if workers is not None and built is not None:
            bad[BadputType.TRAINING_PREP] += built - workers
        for e in evs:
            if e["event"] == "initialized":
                bad[BadputType.TRAINING_PREP] += float(e["seconds"])
            elif e["event"] == "restored":
                bad[BadputType.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME] += float(e["seconds"])
            elif e["event"] == "data_wait":
                bad[BadputType.DATA_LOADING_SYNC] += float(e["seconds"])
            elif e["event"] == "compiled":
                bad[BadputType.PROGRAM_STARTUP] += float(e["wait_s"])
            elif e["event"] == "save":
                bad[BadputType.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME] += float(e["stall_s"])
        kept: list[float] = []
        for e in steps:
            bad[BadputType.DATA_LOADING_SYNC] += float(e.get("data_s", 0.0))
            if keep_until is not None and int(e["step"]) > keep_until:
                bad[BadputType.WASTED_PROGRESS_FROM_DISRUPTION] += float(e["seconds"])
            else:
                kept.append(float(e["seconds"]))
        if len(kept) > 1:  # the first step's excess over the others is its compile
            extra = max(0.0, kept[0] - statistics.fmean(kept[1:]))
            bad[BadputType.PROGRAM_STARTUP] += extra
            kept[0] -= extra
        productive += sum(kept)
        if steps:
            ran = int(steps[-1]["step"])
            last_step = max(last_step, ran if keep_until is None else min(ran, keep_until))
        if nxt is not None and (ended is None or ended.get("outcome") not in FINISHED):
            # A disruption: from this attempt's last event to the next one holding its slices. (After
            # an attempt that finished, a later submission of the run is no recovery: OTHER. A
            # resize is the run's own choice, not a fault, but its restart costs the same way.)
            if ended is not None and ended.get("outcome") == "resized":
                resizes += 1
            else:
                disruptions += 1
            stop = float(next((e for e in reversed(evs) if e["event"] not in DRIVER_ENDS), evs[0])["t"])
            nxt_first = {e["event"]: e for e in reversed(nxt)}
            resume_at = nxt_first.get("reserved", nxt_first.get("attempt_start", nxt[0]))
            bad[BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] += max(0.0, float(resume_at["t"]) - stop)
        first_step = steps[0] if steps else None
        times.append(
            AttemptTimes(
                attempt=number,
                start=start - t0,
                reserved=None if reserved is None else reserved - t0,
                workers_started=None if workers is None else workers - t0,
                state_built=None if built is None else built - t0,
                first_step_start=None if first_step is None else float(first_step["t"]) - float(first_step["seconds"]) - t0,
                restored_step=int(first["restored"]["step"]) if "restored" in first else None,
                steps=(int(steps[0]["step"]), int(steps[-1]["step"])) if steps else None,
                outcome=None if ended is None else str(ended.get("outcome")),
                end=None if ended is None else float(ended["t"]) - t0,
                slices=first["attempt_start"].get("slices") if "attempt_start" in first else None,
                hosts=first["attempt_start"].get("hosts") if "attempt_start" in first else None,
                notice=_stopped_by(evs),
            )
        )
    wall = end - t0
    counted = productive + sum(bad.values())
    bad[BadputType.OTHER] = max(0.0, wall - counted)
    return Goodput(
        wall_s=wall,
        productive_s=productive,
        badput_s=bad,
        attempts=tuple(times),
        disruptions=disruptions,
        last_step=last_step,
        finished=finished,
        resizes=resizes,
    )


def _stopped_by(evs: Sequence[Mapping[str, Any]]) -> str | None:
    """What a preemption notice or a resize did in one attempt, in a few words (pure)."""
    saved = {int(e["step"]): float(e["seconds"]) for e in evs if e["event"] == "saved_now"}
    for e in evs:
        if e["event"] == "notice":
            step = int(e["step"])
            left = e.get("remaining_s")
            told = f"preemption notice after step {step} ({'no deadline' if left is None else f'{float(left):.1f} s left'})"
            return f"{told}: saved step {step} in {saved[step]:.1f} s" if step in saved else f"{told}: not saved ({e.get('why', '')})"
        if e["event"] == "resize":
            step = int(e["step"])
            took = f" in {saved[step]:.1f} s" if step in saved else ""
            return f"saved step {step}{took} to go on {e['slices']} slice(s)"
    return None
