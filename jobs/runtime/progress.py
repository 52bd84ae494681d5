"""Progress from the hosts, and the two watches that turn a silent run into a lost host.

A host that hangs (a dead peer in a collective, a wedged chip, a stuck data read) makes no error:
it just stops. So the hosts say when they move on, and a watch with a bound decides that silence
for longer than the step timeout is a fault:

- `jobs.runtime.launch.run_per_host(..., step_timeout_s=T)` gives every host task a `ProgressBoard`
  actor; per-host code calls `progress.beat(step)` once per step, and the driver cancels the run
  with `NoProgressError` (classified as a lost host) when a host that is still running has not
  beaten for T seconds (the others are then usually blocked in a collective with it).
- Ray Train workers (`jobs.train.worker`) run a `StepWatchdog` thread instead: Ray Train has no step
  timeout, and a thread cannot interrupt a blocked XLA call, so a worker that makes no progress for
  T seconds reports that to the attempt's board and exits. The training run then fails, the driver
  finds the report (a worker's exit alone reads like a crash) and reruns it on a whole slice from
  the newest checkpoint, as for a lost host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


class NoProgressError(TimeoutError):
    """No host reported progress for longer than the step timeout: a hang, handled as a lost host."""


# Exit status of a worker the watchdog stopped. Ray's worker-died error does not show it, which is
# why the watchdog reports the stall to the board before exiting.
NO_PROGRESS_EXIT_CODE = 75

# Bound on handing a stall report to the board before exiting: on a busy host the report can take
# seconds, and without it the driver only has the board's silence to tell a hang from a crash.
STALL_REPORT_S = 30.0

_board: Any = None  # the ProgressBoard handle of the run this process is a host task of
_process_id = -1


class ProgressBoard:
    """When each host last reported progress, and what it said (a Ray actor, num_cpus=0)."""

    def __init__(self, hosts: int) -> None:
        started = time.monotonic()  # the run's start counts as progress
        self.last = {p: started for p in range(hosts)}
        self.steps: dict[int, Any] = {}
        self.stalls: dict[int, tuple[float, Any]] = {}  # from watchdogs: process -> (silent s, last step)

    def beat(self, process_id: int, step: Any) -> None:
        self.last[process_id] = time.monotonic()
        self.steps[process_id] = step

    def silence(self) -> dict[int, tuple[float, Any]]:
        """Per process: seconds since its last report, and that report (None: none yet)."""
        now = time.monotonic()
        return {p: (now - t, self.steps.get(p)) for p, t in self.last.items()}

    def report_stall(self, process_id: int, quiet_s: float, step: Any) -> None:
        self.stalls[process_id] = (quiet_s, step)

    def stall_reports(self) -> dict[int, tuple[float, Any]]:
        return dict(self.stalls)


def start_board(hosts: int) -> Any:
    """A `ProgressBoard` actor on the driver's node: a lost TPU host must not take it along."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return ray.remote(ProgressBoard).options(num_cpus=0, scheduling_strategy=here).remote(hosts)


def stop_board(board: Any) -> None:
    import ray

    with contextlib.suppress(Exception):  # already gone with its node or with Ray
        ray.kill(board)


def stalled(silence: Mapping[int, tuple[float, Any]], running: Iterable[int], timeout_s: float) -> dict[int, tuple[float, Any]]:
    """The running processes silent for longer than `timeout_s` (pure). A process whose task has
    finished is not expected to report any more."""
    return {p: silence[p] for p in running if p in silence and silence[p][0] > timeout_s}


def attach(board: Any, process_id: int) -> None:
    """Called in the host task before the job's code: later `beat()` calls report to `board`."""
    global _board, _process_id
    _board, _process_id = board, process_id


def beat(step: Any = None) -> None:
    """Report progress from per-host code (fire and forget; a no-op outside a watched run)."""
    if _board is not None:
        _board.beat.remote(_process_id, step)


def silent_since_progress(silence: Mapping[int, tuple[float, Any]], timeout_s: float) -> dict[int, tuple[float, Any]]:
    """The processes that reported progress at least once and then fell silent for longer than
    `timeout_s` (pure): a run that failed with such a process was hung, even when no stall report
    arrived (a watchdog exits its worker after trying to send one; a busy host may lose it)."""
    return {p: (quiet, step) for p, (quiet, step) in silence.items() if step is not None and quiet > timeout_s}


def describe_silence(silent: Mapping[int, tuple[float, Any]], timeout_s: float, hosts: Sequence[str]) -> str:
    """The no-progress error: which hosts, for how long, after what, and the bound (pure).
    `hosts[p]` describes process p."""
    where = "; ".join(
        f"process {p} ({hosts[p] if p < len(hosts) else '?'}) for {quiet:.0f}s, "
        + (f"last at {step!r}" if step is not None else "no report yet")
        for p, (quiet, step) in sorted(silent.items())
    )
    return (
        f"no progress within --step-timeout {timeout_s:.0f}s from {where}. A host that stops without an "
        "error is usually waiting for a lost or wedged peer; the run is treated as having lost a host."
    )


class StepWatchdog:
    """A daemon thread that calls `on_stall(quiet_s)` when `beat()` has not been called for
    `timeout_s`. By default that reports the stall to `board` (as `process_id`), if given, and exits
    the process. Used as a context manager; leaving it stops the watch. A `timeout_s` of 0 or None
    watches nothing (`beat()` is then free)."""

    def __init__(
        self,
        timeout_s: float | None,
        what: str = "training step",
        on_stall: Callable[[float], None] | None = None,
        board: Any = None,
        process_id: int = 0,
    ):
        self.timeout_s = float(timeout_s or 0)
        self.what = what
        self.on_stall = on_stall or self._exit
        self.board = board
        self.process_id = process_id
        self._last = time.monotonic()
        self._step: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)

    def beat(self, step: Any = None) -> None:
        self._last = time.monotonic()
        self._step = step
        if self.board is not None:  # fire and forget: the driver reads silence from the board too
            self.board.beat.remote(self.process_id, step)

    def _watch(self) -> None:
        poll = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(poll):
            quiet = time.monotonic() - self._last
            if quiet > self.timeout_s:
                self.on_stall(quiet)
                return

    def _exit(self, quiet_s: float) -> None:
        logging.getLogger(__name__).error(
            "no progress for %.0fs after %s %r (--step-timeout %.0f): exiting this worker so the run restarts from its newest checkpoint",
            quiet_s,
            self.what,
            self._step,
            self.timeout_s,
        )
        if self.board is not None:  # so the driver can tell this exit from a crash
            import ray

            with contextlib.suppress(Exception):
                ray.get(self.board.report_stall.remote(self.process_id, quiet_s, self._step), timeout=STALL_REPORT_S)
        logging.shutdown()
        os._exit(NO_PROGRESS_EXIT_CODE)  # a thread cannot interrupt a blocked XLA call; only exit can

    def __enter__(self) -> StepWatchdog:
        self._last = time.monotonic()
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
