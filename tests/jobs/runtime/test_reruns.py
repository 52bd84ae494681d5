"""The run driver on a simulated v6e 4x4 slice, real Ray: a host killed mid-run, a host that hangs,
a user error and an exhausted budget, each ending in the typed outcome it should, with the whole
slice released between attempts and no placement group left behind."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import ray

from infra import catalog
from jobs.runtime import progress
from jobs.runtime.outcomes import Failed, HostLost, Succeeded
from jobs.runtime.reruns import RetryBudget, run_on_slices
from tests.jobs.sim import SHARED_SLICE, SimHost

pytestmark = pytest.mark.cluster

SHAPE = catalog.shape("v6e", "4x4")
SLICE = SHARED_SLICE


@pytest.fixture
def sim(shared_slice):
    return shared_slice


def live_placement_groups() -> dict[str, str]:
    return {i: pg["state"] for i, pg in ray.util.placement_group_table().items() if pg["state"] != "REMOVED"}


def attempt_number(marks: Path, process) -> int:
    """How many attempts this process id has started (files in the shared test directory)."""
    done = len(list(marks.glob(f"p{process.process_id}-*")))
    (marks / f"p{process.process_id}-{done + 1}").touch()
    return done + 1


def steady(process, marks: str, seconds: float):
    """Reports progress for `seconds` on the first attempt (long enough to be killed), briefly after."""
    attempt = attempt_number(Path(marks), process)
    end = time.monotonic() + (seconds if attempt == 1 else 0.5)
    while time.monotonic() < end:
        progress.beat(round(time.monotonic() - end, 1))
        time.sleep(0.2)
    return {
        "attempt": attempt,
        "tpu_name": os.environ["TPU_NAME"],
        "worker_id": int(os.environ["TPU_WORKER_ID"]),
        "process_id": process.process_id,
        "coordinator": process.coordinator_address,
    }


def hangs_once(process, marks: str):
    """Process 2 goes silent on the first attempt (a wedged host) while the others go on
    reporting (until the driver cancels them); every process returns at once on the rerun."""
    attempt = attempt_number(Path(marks), process)
    progress.beat("started")
    if attempt == 1:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if process.process_id != 2:
                progress.beat("waiting")
            time.sleep(0.2)
    return attempt


def buggy(process):
    raise ValueError(f"bad input on process {process.process_id}")


def run(fn, *args, budget=RetryBudget(), step_timeout_s=None, log=None):
    lines: list[str] = []
    report = run_on_slices(
        SHAPE, 1, fn, *args, budget=budget, reserve_timeout_s=60, timeout_s=120,
        step_timeout_s=step_timeout_s, name="test", log=lines.append,
    )  # fmt: skip
    return report, lines


def test_a_host_killed_mid_run_is_rerun_on_a_whole_slice_with_a_new_coordinator(sim, tmp_path):
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("report", run(steady, str(tmp_path), 30.0, step_timeout_s=60)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("p*-1"))) < SHAPE.hosts and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list(tmp_path.glob("p*-1"))) == SHAPE.hosts, "the first attempt never started on every host"
    sim.kill_host(SLICE, 1)
    sim.add_host(SimHost(SHAPE, SLICE, 1))  # GKE recreates the VM; the rerun waits for it

    runner.join(timeout=180)
    assert not runner.is_alive()
    report, lines = outcome["report"]
    assert report.ok, report.describe()
    first, second = report.attempts
    assert isinstance(first.outcome, HostLost) and f"worker 1 of slice {SLICE}" in first.outcome.reason
    assert isinstance(second.outcome, Succeeded)
    seen = report.value
    # The rerun ran once per host of a whole slice, in worker-id order, all told the coordinator
    # that the second attempt's reservation computed.
    assert [s["worker_id"] for s in seen] == [s["process_id"] for s in seen] == list(range(SHAPE.hosts))
    assert {s["tpu_name"] for s in seen} == {SLICE}
    assert {s["coordinator"] for s in seen} == {second.coordinator}
    assert {s["attempt"] for s in seen if s["worker_id"] != 1} == {2}
    assert any("released the slice, rerunning" in line for line in lines)
    assert live_placement_groups() == {}


def test_a_silent_host_past_the_step_timeout_is_a_lost_host_and_the_rerun_succeeds(sim, tmp_path):
    report, _ = run(hangs_once, str(tmp_path), step_timeout_s=3)
    assert report.ok, report.describe()
    assert [a.outcome.kind for a in report.attempts] == ["host-lost", "succeeded"]
    reason = report.attempts[0].outcome.reason
    assert "no progress within --step-timeout 3s" in reason and f"worker 2 of slice {SLICE}" in reason
    assert report.value == [2] * SHAPE.hosts
    assert live_placement_groups() == {}


def test_the_lost_host_budget_bounds_the_reruns(sim, tmp_path):
    report, lines = run(hangs_once, str(tmp_path), budget=RetryBudget(max_preemptions=0), step_timeout_s=2)
    assert not report.ok and len(report.attempts) == 1
    assert isinstance(report.outcome, HostLost)
    assert "more than --max-preemptions 0" in lines[-1]
    assert live_placement_groups() == {}


def test_a_user_error_is_not_rerun_whatever_the_budget(sim):
    report, lines = run(buggy, budget=RetryBudget(max_preemptions=5, max_failures=5))
    assert len(report.attempts) == 1
    assert isinstance(report.outcome, Failed) and report.outcome.user_error
    assert report.outcome.reason.startswith("ValueError: bad input on process")
    assert "a user error: not rerun" in lines[-1]
    assert live_placement_groups() == {}


def raise_together(process, at: float, apart_s: float):
    """Every host raises at about the same instant, `apart_s` apart: how a bug in a job usually fails."""
    end = at + process.process_id * apart_s
    while time.time() < end:
        time.sleep(0.0005)
    raise ValueError(f"bad input on process {process.process_id}")


def test_every_host_raising_at_once_ends_each_run_as_one_user_error(sim):
    # Ending a run by cancelling tasks whose replies were arriving crashed this very driver in
    # Ray 2.60 (exit status 1, no traceback: jobs/runtime/launch.py says why the hosts are actors
    # now). Several runs, the hosts a few milliseconds apart, so that ends meet arriving replies.
    for apart_ms in (0, 1, 2, 3):
        report, lines = run(raise_together, time.time() + 2.0, apart_ms / 1000)
        assert len(report.attempts) == 1 and isinstance(report.outcome, Failed) and report.outcome.user_error, report.describe()
        assert report.outcome.reason.startswith("ValueError: bad input on process")
        assert "a user error: not rerun" in lines[-1]
    assert live_placement_groups() == {}


def hold(process, seconds: float):
    """Occupies the host for `seconds`, reporting progress; returns when it held it (wall clock)."""
    began = time.time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        progress.beat("holding")
        time.sleep(0.2)
    return (began, time.time())


def race(seconds: float, reserve_timeout_s: float):
    """Two jobs started together on the one slice; their reports and how long each took."""
    results: dict[int, tuple] = {}
    start = threading.Barrier(2, timeout=30)

    def job(i: int) -> None:
        start.wait()
        began = time.monotonic()
        report = run_on_slices(
            SHAPE, 1, hold, seconds, budget=RetryBudget(), reserve_timeout_s=reserve_timeout_s, timeout_s=60,
            step_timeout_s=30, name=f"race{i}", log=lambda line: None,
        )  # fmt: skip
        results[i] = (report, time.monotonic() - began)

    threads = [threading.Thread(target=job, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racing job is stuck"
    return results[0], results[1]


def test_two_jobs_racing_for_one_slice_take_turns(sim):
    (a, _), (b, _) = race(4.0, reserve_timeout_s=60)
    assert a.ok and b.ok, (a.describe(), b.describe())
    assert len(a.attempts) == len(b.attempts) == 1  # the loser waited for the slice; it did not fail and rerun
    spans = sorted([min(s for s, _ in r.value), max(e for _, e in r.value)] for r in (a, b))
    assert spans[0][1] <= spans[1][0], f"both held the slice at once: {spans}"
    assert live_placement_groups() == {}


def test_the_loser_of_a_race_fails_within_its_bound_naming_the_busy_slice(sim):
    (a, a_took), (b, b_took) = race(10.0, reserve_timeout_s=2)  # the slice is held longer than either waits
    assert [a.ok, b.ok].count(True) == 1, (a.describe(), b.describe())
    winner, loser, loser_took = (a, b, b_took) if a.ok else (b, a, a_took)
    assert isinstance(loser.outcome, Failed) and loser.outcome.no_slice and len(loser.attempts) == 1
    assert loser_took < 15  # bounded: 2 s, plus the inventory for the message
    assert "could not reserve 1 x v6e 4x4" in loser.outcome.reason and "within 2s" in loser.outcome.reason
    assert f"slice {SLICE} has hosts 0,1,2,3 of 4 (complete; TPUs in use on worker id 0,1,2,3)" in loser.outcome.reason
    assert len(winner.value) == SHAPE.hosts
    assert live_placement_groups() == {}
