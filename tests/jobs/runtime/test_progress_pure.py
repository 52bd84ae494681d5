"""Progress and hang detection without Ray: `ProgressBoard` as a plain class, `stalled`,
`describe_silence` (the no-progress error text), `beat()` outside a watched run, `StepWatchdog`
with a custom `on_stall` (fires after the timeout, not while beats come, not after the watch ends),
and its default (log, report to the board, exit with `NO_PROGRESS_EXIT_CODE`) in a subprocess.
Timeouts are short and every wait is bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.runtime import progress
from jobs.runtime.progress import ProgressBoard, StepWatchdog, describe_silence, stalled

# A bounded wait for something that should happen within a fraction of a second.
WAIT_S = 3.0


# --- ProgressBoard ------------------------------------------------------------------------------


def test_a_new_board_counts_the_start_as_progress_with_no_report_yet():
    board = ProgressBoard(3)
    silence = board.silence()
    assert sorted(silence) == [0, 1, 2]
    for quiet, step in silence.values():
        assert 0.0 <= quiet < 1.0 and step is None


def test_a_beat_resets_that_process_silence_and_keeps_its_step():
    board = ProgressBoard(2)
    time.sleep(0.05)
    board.beat(1, {"step": 7})
    silence = board.silence()
    assert silence[1][1] == {"step": 7} and silence[0][1] is None
    assert silence[0][0] >= 0.05 and silence[1][0] < silence[0][0]
    board.beat(1, 8)
    assert board.silence()[1][1] == 8  # the latest report wins


def test_board_and_stalled_together_find_the_silent_running_processes():
    board = ProgressBoard(3)
    time.sleep(0.3)
    board.beat(1, 3)
    silence = board.silence()
    assert set(stalled(silence, running=[0, 1, 2], timeout_s=0.2)) == {0, 2}
    # Process 0 has finished its task: it is not expected to report any more.
    assert set(stalled(silence, running=[1, 2], timeout_s=0.2)) == {2}


def test_stall_reports_from_watchdogs_are_kept_per_process_and_returned_as_a_copy():
    board = ProgressBoard(2)
    assert board.stall_reports() == {}
    board.report_stall(1, 31.5, 40)
    reports = board.stall_reports()
    assert reports == {1: (31.5, 40)}
    reports[0] = (1.0, None)
    assert board.stall_reports() == {1: (31.5, 40)}


def test_a_later_stall_report_from_the_same_process_replaces_the_earlier_and_beats_do_not_clear_it():
    board = ProgressBoard(3)
    board.report_stall(0, 30.5, None)
    board.report_stall(2, 31.0, 7)
    board.report_stall(2, 62.0, 8)
    board.beat(2, 9)  # a beat after the report does not take the report back
    assert board.stall_reports() == {0: (30.5, None), 2: (62.0, 8)}
    assert board.silence()[2][1] == 9


# --- stalled --------------------------------------------------------------------------------------

SILENCE = {0: (5.0, 10), 1: (31.0, 9), 2: (30.0, None), 3: (120.0, None)}


def test_stalled_keeps_running_processes_silent_for_longer_than_the_timeout():
    assert stalled(SILENCE, running=[0, 1, 2, 3], timeout_s=30.0) == {1: (31.0, 9), 3: (120.0, None)}


def test_stalled_at_exactly_the_timeout_is_not_yet_stalled():
    assert stalled(SILENCE, running=[2], timeout_s=30.0) == {}
    assert stalled(SILENCE, running=[2], timeout_s=29.9) == {2: (30.0, None)}


def test_stalled_ignores_finished_and_unknown_processes():
    assert stalled(SILENCE, running=[0, 7], timeout_s=1.0) == {0: (5.0, 10)}
    assert stalled(SILENCE, running=[], timeout_s=0.0) == {}
    assert stalled({}, running=[0, 1], timeout_s=0.0) == {}


# --- describe_silence -----------------------------------------------------------------------------

HOSTS = ["worker 0 of slice tpu-a", "worker 1 of slice tpu-a", "worker 0 of slice tpu-b"]


def test_describe_silence_names_each_silent_process_its_host_its_silence_and_its_last_step():
    text = describe_silence({2: (95.2, None), 0: (61.6, {"step": 7})}, 60.0, HOSTS)
    assert "process 0 (worker 0 of slice tpu-a) for 62s, last at {'step': 7}" in text
    assert "process 2 (worker 0 of slice tpu-b) for 95s, no report yet" in text
    assert "--step-timeout 60s" in text
    assert text.index("process 0 ") < text.index("process 2 ")  # in process order
    assert "process 1 " not in text


def test_describe_silence_says_it_is_treated_as_a_lost_host():
    text = describe_silence({1: (45.0, 3)}, 30.0, HOSTS)
    assert text.startswith("no progress within --step-timeout 30s from process 1 (worker 1 of slice tpu-a)")
    assert "lost" in text


def test_a_step_of_zero_is_a_report_not_no_report():
    text = describe_silence({0: (40.0, 0)}, 30.0, HOSTS)
    assert "last at 0" in text and "no report yet" not in text


def test_a_process_without_a_host_description_is_marked_unknown():
    text = describe_silence({5: (40.0, None)}, 30.0, HOSTS)
    assert "process 5 (?) for 40s, no report yet" in text


# --- beat() in the host task ----------------------------------------------------------------------


class RecordingBoard:
    """Stands in for the board actor handle: `board.beat.remote(pid, step)` and
    `board.report_stall.remote(...)` are recorded, as (method, args)."""

    def __init__(self):
        self.calls = []
        outer = self

        class _Method:
            def __init__(self, name):
                self.name = name

            def remote(self, *args):
                outer.calls.append((self.name, args))

        self.beat = _Method("beat")
        self.report_stall = _Method("report_stall")


@pytest.fixture
def detached(monkeypatch):
    """This process as outside any watched run; whatever a test attaches is undone afterwards."""
    monkeypatch.setattr(progress, "_board", None)
    monkeypatch.setattr(progress, "_process_id", -1)


def test_beat_outside_a_watched_run_is_a_no_op(detached):
    assert progress.beat() is None
    assert progress.beat({"step": 1}) is None


def test_beat_once_attached_reports_this_process_and_its_step(detached):
    board = RecordingBoard()
    progress.attach(board, 3)
    progress.beat(12)
    progress.beat()
    assert board.calls == [("beat", (3, 12)), ("beat", (3, None))]


# --- StepWatchdog ---------------------------------------------------------------------------------


class StallRecorder:
    """A custom `on_stall`: records the silence it was called with, instead of exiting."""

    def __init__(self):
        self.calls: list[float] = []
        self.fired = threading.Event()

    def __call__(self, quiet_s: float) -> None:
        self.calls.append(quiet_s)
        self.fired.set()


def test_the_watchdog_fires_once_after_the_timeout_without_a_beat():
    on_stall = StallRecorder()
    timeout = 0.2
    before_entering = time.monotonic()  # the watch starts after this, so it cannot fire before + timeout
    with StepWatchdog(timeout, on_stall=on_stall) as watchdog:
        assert on_stall.fired.wait(WAIT_S), "no stall reported"
        fired_after = time.monotonic() - before_entering
        time.sleep(0.15)  # time for a second, wrong, call
    assert fired_after >= timeout
    assert len(on_stall.calls) == 1 and on_stall.calls[0] > timeout
    assert not watchdog._thread.is_alive()


def test_the_watchdog_does_not_fire_while_beats_keep_coming():
    on_stall = StallRecorder()
    timeout = 0.5
    with StepWatchdog(timeout, on_stall=on_stall) as watchdog:
        end = time.monotonic() + 1.5 * timeout
        step = 0
        while time.monotonic() < end:
            watchdog.beat(step)
            step += 1
            time.sleep(0.02)
        assert on_stall.calls == []
    assert step > 10  # the loop really beat, many times
    assert on_stall.calls == []


def test_the_watchdog_fires_when_beats_stop():
    on_stall = StallRecorder()
    timeout = 0.2
    with StepWatchdog(timeout, on_stall=on_stall) as watchdog:
        for step in range(5):
            last_beat = time.monotonic()  # taken just before the beat, so the beat is no earlier
            watchdog.beat(step)
            time.sleep(0.02)
        assert on_stall.fired.wait(WAIT_S), "no stall reported after the beats stopped"
        assert time.monotonic() - last_beat >= timeout
    assert on_stall.calls[0] > timeout


def test_leaving_the_watchdog_stops_the_watch():
    on_stall = StallRecorder()
    timeout = 0.2
    with StepWatchdog(timeout, on_stall=on_stall) as watchdog:
        pass
    assert not watchdog._thread.is_alive()
    assert not on_stall.fired.wait(2 * timeout)
    assert on_stall.calls == []


def test_time_before_entering_the_watchdog_does_not_count_as_silence():
    on_stall = StallRecorder()
    timeout = 0.2
    watchdog = StepWatchdog(timeout, on_stall=on_stall)
    time.sleep(timeout + 0.1)  # longer than the timeout, but not yet watched
    before_entering = time.monotonic()
    with watchdog:
        assert on_stall.fired.wait(WAIT_S)
        # The silence reported is counted from entering, not from construction.
        assert on_stall.calls[0] <= time.monotonic() - before_entering


def test_an_exception_inside_the_watch_propagates_and_stops_it():
    on_stall = StallRecorder()
    with pytest.raises(ValueError, match="from the job"), StepWatchdog(0.2, on_stall=on_stall) as watchdog:
        raise ValueError("from the job")
    assert not watchdog._thread.is_alive()
    assert not on_stall.fired.wait(0.3)


@pytest.mark.parametrize("timeout", [0, None], ids=["zero", "none"])
def test_a_watchdog_without_a_timeout_watches_nothing(timeout):
    on_stall = StallRecorder()
    with StepWatchdog(timeout, on_stall=on_stall) as watchdog:
        watchdog.beat(1)  # free, and harmless
        assert not on_stall.fired.wait(0.2)
        assert not watchdog._thread.is_alive()
    assert on_stall.calls == []


def test_a_custom_on_stall_replaces_the_default_exit_and_its_report_to_the_board():
    on_stall, board = StallRecorder(), RecordingBoard()
    with StepWatchdog(0.2, on_stall=on_stall, board=board, process_id=3):
        assert on_stall.fired.wait(WAIT_S), "no stall reported"
    assert len(on_stall.calls) == 1
    assert board.calls == []  # reporting to the board is the default's job, not the custom one's


def test_a_watchdog_with_a_board_forwards_each_beat_to_it_as_its_process():
    board = RecordingBoard()
    with StepWatchdog(60, board=board, process_id=3) as watchdog:
        watchdog.beat(1)
        watchdog.beat("checkpoint at step 1")
    assert board.calls == [("beat", (3, 1)), ("beat", (3, "checkpoint at step 1"))]


def test_silent_since_progress_keeps_processes_that_beat_once_then_fell_silent_past_the_timeout():
    # Why: a watchdog exits its worker right after trying to report the stall; on a busy host the
    # report can be lost, and the board's silence is then what tells the hang from a crash.
    silence = {0: (61.0, 4), 1: (61.0, None), 2: (5.0, 5), 3: (60.0, 4)}
    assert progress.silent_since_progress(silence, 60.0) == {0: (61.0, 4)}


def test_silent_since_progress_takes_a_step_of_zero_as_progress():
    assert progress.silent_since_progress({0: (90.0, 0)}, 60.0) == {0: (90.0, 0)}


# --- StepWatchdog's default: log, report, exit (in a subprocess: it ends the process) --------------

REPO = Path(__file__).resolve().parents[3]
# Bound for a subprocess that should exit ~0.3 s after it starts (the interpreter start included).
EXIT_WITHIN_S = 10.0

SILENT_WORKER = """
import time
from jobs.runtime.progress import StepWatchdog

class _ReportStall:
    def remote(self, *args):
        print("report_stall", *args, flush=True)
        return "not an object ref"  # ray.get fails on it (no cluster, no auto-connect): the exit goes on

class _Beat:
    def remote(self, *args):
        print("beat", *args, flush=True)

class Board:
    report_stall = _ReportStall()
    beat = _Beat()

with StepWatchdog(0.3, what="training step", board={board}, process_id=2) as watchdog:
    watchdog.beat(7)
    time.sleep(60)  # a hang: no more beats
print("the watch let the hang go on", flush=True)
"""


def run_silent_worker(board: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_AUTO_CONNECT": "0"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SILENT_WORKER.format(board=board)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN_S,
    )
    return done, time.monotonic() - started


def test_a_silent_worker_logs_and_exits_with_the_no_progress_status():
    done, took = run_silent_worker("None")
    assert done.returncode == progress.NO_PROGRESS_EXIT_CODE, done.stderr
    assert "no progress for" in done.stderr and "after training step 7" in done.stderr
    assert "the watch let the hang go on" not in done.stdout
    assert took < EXIT_WITHIN_S / 2


def test_a_silent_worker_reports_its_stall_to_the_board_before_exiting():
    done, _ = run_silent_worker("Board()")
    assert done.returncode == progress.NO_PROGRESS_EXIT_CODE, done.stderr
    assert "no progress for" in done.stderr
    reports = [line.split() for line in done.stdout.splitlines() if line.startswith("report_stall")]
    assert len(reports) == 1
    _, process_id, quiet_s, step = reports[0]
    assert (process_id, step) == ("2", "7") and float(quiet_s) > 0.3
    assert "beat 2 7" in done.stdout.splitlines()  # the step it beat was on the board before the stall
