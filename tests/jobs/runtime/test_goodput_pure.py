"""The goodput ledger's arithmetic on synthetic timelines (jobs.runtime.goodput.account, pure): no
disruption; one disruption whose wasted progress is at most one checkpoint interval; a run still
going; categories that always sum with the productive time to the wall time."""

from __future__ import annotations

import pytest

from jobs.runtime.goodput import BadputType, LedgerError, account

B = BadputType


def ev(t: float, event: str, attempt: int = 1, **fields) -> dict:
    return {"t": t, "event": event, "attempt": attempt, **fields}


def attempt_events(attempt: int, t: float, steps: range, first_s: float, step_s: float, every: int, restored: int | None = None):
    """An attempt that starts at `t`: 2 s to its slices, 8 s to its workers, 2 s to its state, then
    a restore (or a random init), 0.25 s more waiting for the compile, and `steps`, a save every
    `every` steps; returns (events, end)."""
    out = [ev(t, "attempt_start", attempt), ev(t + 2, "reserved", attempt), ev(t + 10, "workers_started", attempt)]
    out.append(ev(t + 12, "state_built", attempt))
    t += 12
    if restored is None:
        out.append(ev(t + 0.5, "initialized", attempt, how="random", seconds=0.5))
    else:
        out.append(ev(t + 0.5, "restored", attempt, step=restored, seconds=0.5))
    t += 0.5
    out.append(ev(t + 0.3, "data_wait", attempt, seconds=0.3))
    t += 0.3
    out.append(ev(t + 0.25, "compiled", attempt, seconds=1.0, lower_s=0.4, wait_s=0.25, cache_hits=0, cache_misses=1))  # 0.75 s hidden
    t += 0.25
    for n, step in enumerate(steps):
        seconds = first_s if n == 0 else step_s
        t += 0.1 + seconds  # the batch, then the step
        first = {"hit_hosts": 1, "hosts": 4} if n == 0 else {}  # the worker's first step says which hosts hit the cache
        out.append(ev(t, "step", attempt, step=step, seconds=seconds, data_s=0.1, **first))
        if step % every == 0:
            t += 0.2
            out.append(ev(t, "save", attempt, step=step, stall_s=0.2))
    return out, t


def total(g) -> float:
    return g.productive_s + sum(g.badput_s.values())


def test_no_disruption():
    events, t = attempt_events(1, 100.0, range(1, 11), first_s=5.0, step_s=1.0, every=5)
    events.append(ev(t + 1.0, "attempt_end", outcome="succeeded"))
    g = account(events)
    assert g.finished and g.disruptions == 0 and g.last_step == 10
    assert g.wall_s == pytest.approx(t + 1.0 - 100.0)
    assert g.productive_s == pytest.approx(10 * 1.0)
    assert g.badput_s[B.PROGRAM_STARTUP] == pytest.approx(0.25 + 4.0)  # the compile's wait, the first step's excess
    assert g.badput_s[B.TPU_INITIALIZATION] == pytest.approx(10.0)  # 2 s to the slices, 8 s to the workers
    assert g.badput_s[B.TRAINING_PREP] == pytest.approx(2.5)
    assert g.badput_s[B.DATA_LOADING_SYNC] == pytest.approx(0.3 + 10 * 0.1)
    assert g.badput_s[B.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME] == pytest.approx(0.4)
    assert g.badput_s[B.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME] == 0.0
    assert g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION] == 0.0
    assert g.badput_s[B.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == 0.0
    assert g.badput_s[B.OTHER] == pytest.approx(1.0)  # the last save's wait and Ray Train's teardown
    assert total(g) == pytest.approx(g.wall_s)
    assert g.goodput == pytest.approx(10.0 / g.wall_s)
    assert "TPU_INITIALIZATION" in g.describe() and "goodput" in g.describe()


def test_one_disruption_wastes_at_most_one_checkpoint_interval():
    every, step_s = 5, 1.0
    first, t = attempt_events(1, 0.0, range(1, 9), first_s=5.0, step_s=step_s, every=every)  # saved at 5, lost after 8
    first += [ev(t + 15.0, "fit_failed"), ev(t + 20.0, "attempt_end", outcome="host-lost")]  # 20 s to notice
    second, t2 = attempt_events(2, t + 21.0, range(6, 13), first_s=1.5, step_s=step_s, every=every, restored=5)
    second.append(ev(t2 + 1.0, "attempt_end", 2, outcome="succeeded"))
    g = account(first + second)
    assert g.disruptions == 1 and len(g.attempts) == 2 and g.last_step == 12
    assert g.attempts[1].restored_step == 5 and g.attempts[0].outcome == "host-lost"
    wasted = g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION]
    assert wasted == pytest.approx(3 * step_s)  # steps 6-8 of attempt 1
    assert wasted <= every * step_s
    # From attempt 1's last step to attempt 2 holding its slices: noticing, deciding, re-reserving.
    assert g.badput_s[B.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == pytest.approx(20.0 + 1.0 + 2.0)
    assert g.badput_s[B.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME] == pytest.approx(0.5)
    # Slices waited for only at the first start; both attempts started their workers.
    assert g.badput_s[B.TPU_INITIALIZATION] == pytest.approx(2.0 + 8.0 + 8.0)
    assert g.productive_s == pytest.approx(5 * step_s + 7 * step_s)  # steps 1-5, then 6-12
    assert g.disruption_badput_s() == pytest.approx(wasted + 23.0)
    assert total(g) == pytest.approx(g.wall_s)


def test_a_run_still_going_counts_up_to_now_and_nothing_lost_yet():
    events, t = attempt_events(1, 0.0, range(1, 4), first_s=3.0, step_s=1.0, every=10)
    g = account(events, now=t + 5.0)
    assert not g.finished and g.wall_s == pytest.approx(t + 5.0)
    assert g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION] == 0.0
    assert total(g) == pytest.approx(g.wall_s)


def test_a_rerun_that_has_not_restored_yet_counts_the_unsaved_steps_as_lost():
    events, t = attempt_events(1, 0.0, range(1, 8), first_s=3.0, step_s=1.0, every=5)
    events += [ev(t + 1, "attempt_end", outcome="host-lost"), ev(t + 2, "attempt_start", 2)]
    g = account(events, now=t + 30)
    assert g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION] == pytest.approx(2.0)  # steps 6 and 7
    assert total(g) == pytest.approx(g.wall_s)


@pytest.mark.parametrize(
    ("events", "says"),
    [
        ([], "no attempt_start"),
        ([{"t": 1.0, "event": "teleported", "attempt": 1}], "not a ledger event"),
        ([{"event": "attempt_start", "attempt": 1}], "not a ledger event"),
        ([ev(1, "attempt_start"), {"t": 2.0, "event": "step", "step": 1, "seconds": 1.0}], "names no attempt"),
    ],
)
def test_a_ledger_that_is_not_one_is_refused_naming_why(events, says):
    with pytest.raises(LedgerError, match=says):
        account(events)


def test_a_resubmission_after_success_is_no_disruption():
    first, t = attempt_events(1, 0.0, range(1, 6), first_s=3.0, step_s=1.0, every=5)
    first.append(ev(t + 1, "attempt_end", outcome="succeeded"))
    second, t2 = attempt_events(2, t + 100.0, range(6, 9), first_s=2.0, step_s=1.0, every=5, restored=5)
    second.append(ev(t2 + 1, "attempt_end", 2, outcome="succeeded"))
    g = account(first + second)
    assert g.disruptions == 0 and g.last_step == 8
    assert g.badput_s[B.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == 0.0
    assert g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION] == 0.0
    assert g.badput_s[B.OTHER] >= 99.0  # the 99 s between the submissions
    assert total(g) == pytest.approx(g.wall_s)


def test_a_save_on_the_notice_wastes_nothing_and_the_timeline_says_what_happened():
    from jobs.goodput import timeline

    first, t = attempt_events(1, 0.0, range(1, 8), first_s=5.0, step_s=1.0, every=5)  # saved at 5, notice after 7
    first[0]["slices"], first[0]["hosts"] = 2, 4
    first += [
        ev(t + 0.1, "notice", step=7, remaining_s=11.5, save=True, why="saving step 7"),
        ev(t + 0.5, "save", step=7, stall_s=0.4),
        ev(t + 0.5, "saved_now", step=7, seconds=0.4),
        ev(t + 1.0, "attempt_end", outcome="preempted"),
    ]
    second, t2 = attempt_events(2, t + 3.0, range(8, 11), first_s=1.5, step_s=1.0, every=5, restored=7)
    second[0]["slices"], second[0]["hosts"] = 2, 4
    second.append(ev(t2 + 1.0, "attempt_end", 2, outcome="succeeded"))
    g = account(first + second)
    assert g.disruptions == 1 and g.last_step == 10
    assert g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION] == 0.0  # the next attempt restored step 7, the last one run
    text = timeline(g)
    assert "on 2 slice(s), 4 hosts; preemption notice after step 7 (11.5 s left): saved step 7 in 0.4 s" in text
    assert total(g) == pytest.approx(g.wall_s)


def test_a_notice_too_short_for_a_save_is_shown_as_such():
    from jobs.goodput import timeline

    first, t = attempt_events(1, 0.0, range(1, 8), first_s=5.0, step_s=1.0, every=5)
    first += [ev(t + 0.1, "notice", step=7, remaining_s=0.0, save=False, why="the notice's deadline has passed: resuming from step 5")]
    first.append(ev(t + 1.0, "attempt_end", outcome="preempted"))
    g = account(first)
    assert "preemption notice after step 7 (0.0 s left): not saved (the notice's deadline has passed: resuming from step 5)" in timeline(g)
    assert g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION] == pytest.approx(2.0)  # steps 6-7, past the last save


def test_an_elastic_resize_is_counted_as_a_resize_not_a_disruption():
    first, t = attempt_events(1, 0.0, range(1, 11), first_s=5.0, step_s=1.0, every=5)
    first[0]["slices"], first[0]["hosts"] = 1, 2
    first += [ev(t + 0.1, "resize", step=10, slices=2, why="1 whole idle slice(s): growing from 1 to 2 slices")]
    first += [ev(t + 0.5, "saved_now", step=10, seconds=0.4), ev(t + 1.0, "attempt_end", outcome="resized")]
    second, t2 = attempt_events(2, t + 2.0, range(11, 13), first_s=1.5, step_s=1.0, every=5, restored=10)
    second.append(ev(t2 + 1.0, "attempt_end", 2, outcome="succeeded"))
    g = account(first + second)
    assert (g.disruptions, g.resizes) == (0, 1)
    assert g.attempts[0].notice == "saved step 10 in 0.4 s to go on 2 slice(s)"
    assert g.badput_s[B.WASTED_PROGRESS_FROM_DISRUPTION] == 0.0
    assert g.badput_s[B.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] > 0  # the restart still costs
