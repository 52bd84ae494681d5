"""`python -m jobs.local rayjob FILE`: run what a printed KubeRay RayJob runs, on a simulated slice of
its shape, the way KubeRay's RayJob controller drives it (ray-operator rayjob_controller.go):

- `Initializing` from the start (the RayCluster coming up; `status.startTime`), then `Running` once
  the job is submitted (here through the Ray Jobs API with the cluster's token, as KubeRay's
  submitter does, with the RayJob's entrypoint, runtime env and KubeRay-style job id), then
  `Complete` (the Ray job SUCCEEDED or was STOPPED) or `Failed` (`AppFailed`: the job FAILED).
- `activeDeadlineSeconds` counts from the start to the end (`DeadlineExceeded`);
  `preRunningDeadlineSeconds` from the start until `Running` (`PreRunningDeadlineExceeded`). Past
  one, the job is stopped (bounded) and the RayJob is Failed. A RayJob with no
  activeDeadlineSeconds is still bounded here, by `--default-deadline`.
- Afterwards the cluster is torn down when `shutdownAfterJobFinishes` (KubeRay's default: false,
  the cluster stays up). `ttlSecondsAfterFinished` is not waited for, and `backoffLimit` retries
  are not made: this proves one run.

Each transition is a `[rayjob] NAME: ...` line on stdout and, with `--status-file`, the RayJob
`.status` KubeRay would show, one JSON object a line.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from jobs.client.jobs_api import TERMINAL, JobTimedOut, SubmitError, bounded_client, follow_job, submit_job
from jobs.local.cluster import LocalCluster, LocalClusterError, down, up
from jobs.local.processes import alive
from jobs.local.rayjob_spec import RayJobSpec, RayJobStatus
from jobs.runtime.deadlines import Deadline

STOP_WAIT_S = 20.0  # for a stopped job to end (Ray's own grace before SIGKILL is 3 s)


class _DeadlinePassed(BaseException):
    """Raised by the alarm while the cluster comes up. A BaseException, as Ctrl-C is, so that no
    `except Exception` on the way swallows it; `up` stops what it started either way."""


@contextlib.contextmanager
def _alarm(seconds: float | None) -> Iterator[None]:
    if seconds is None:
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _DeadlinePassed()

    previous = signal.signal(signal.SIGALRM, fire)
    # A little past the deadline: when it fires, the Deadline it stands for has expired too.
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.0) + 0.05)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: stop the job, tear down


class _Watched:
    """The Jobs API client as `follow_job` uses it, but each status poll reads the whole job info
    (Ray's status, message and times: what KubeRay copies into the RayJob's status) and reports it."""

    def __init__(self, client: Any, on_info: Callable[[Any], None]):
        self.client, self.on_info = client, on_info

    def get_job_status(self, job_id: str) -> str:
        info = self.client.get_job_info(job_id)
        self.on_info(info)
        return _name(info.status)

    def get_job_logs(self, job_id: str) -> str:
        return self.client.get_job_logs(job_id)

    def stop_job(self, job_id: str) -> bool:
        return self.client.stop_job(job_id)


class RayJobRun:
    def __init__(
        self,
        spec: RayJobSpec,
        state_dir: str,
        default_deadline_s: float,
        out: IO[str],
        status_file: IO[str] | None,
        log_file: IO[str] | None,
    ):
        self.spec, self.state_dir, self.out = spec, state_dir, out
        self.status_file, self.log_file = status_file, log_file
        self.status = RayJobStatus.initializing(spec.name)
        self.active = Deadline(spec.active_deadline_s or default_deadline_s)
        self.active_what = (
            f"activeDeadlineSeconds. StartTime: {{}}. ActiveDeadlineSeconds: {spec.active_deadline_s}"
            if spec.active_deadline_s
            else f"local run's --default-deadline (it sets no activeDeadlineSeconds). StartTime: {{}}. Seconds: {default_deadline_s:g}"
        )
        self.pre_running = Deadline(spec.pre_running_deadline_s) if spec.pre_running_deadline_s else None
        self.waiting_for = "the RayCluster to be created"
        self.tear_down = spec.shutdown_after_finishes
        self.cluster: LocalCluster | None = None
        self.client: Any = None

    def say(self, text: str) -> None:
        print(f"[rayjob] {self.spec.name}: {text}", file=self.out, flush=True)

    def emit(self, note: str = "") -> None:
        s = self.status
        self.say(s.job_deployment_status + (f" ({s.reason})" if s.reason else "") + (f": {note}" if note else ""))
        if self.status_file:
            self.status_file.write(json.dumps(s.to_json()) + "\n")
            self.status_file.flush()

    def deadline_passed(self) -> tuple[str, str] | None:
        """(reason, KubeRay's message) of the first deadline passed, checked in KubeRay's order."""
        start = self.status.start_time
        if self.active.expired():
            return "DeadlineExceeded", f"The RayJob has passed the {self.active_what.format(start)}"
        if self.pre_running and self.status.job_deployment_status == "Initializing" and self.pre_running.expired():
            seconds = self.spec.pre_running_deadline_s
            return (
                "PreRunningDeadlineExceeded",
                f"The RayJob has passed the preRunningDeadlineSeconds. StartTime: {start}. PreRunningDeadlineSeconds: {seconds}",
            )
        return None

    def run(self, bring_up: Callable[[Callable[[str], None]], LocalCluster]) -> int:
        s = self.status
        self.emit(f"starting a simulated {self.spec.slices} x {self.spec.shape} as RayCluster {s.ray_cluster_name}")
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return self._run(bring_up)
        except KeyboardInterrupt:
            self.say(f"interrupted; {self._stop()}")
            self.tear_down = True  # whatever shutdownAfterJobFinishes says: nothing is left behind
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._clean_up()

    def _run(self, bring_up: Callable[[Callable[[str], None]], LocalCluster]) -> int:
        s = self.status

        def progress(message: str) -> None:
            self.waiting_for = f"the RayCluster to come up: {message}"
            print(f"[local] {message}", file=self.out, flush=True)

        first = min(self.active.remaining(), self.pre_running.remaining() if self.pre_running else float("inf"))
        try:
            with _alarm(first):
                self.cluster = bring_up(progress)
        except _DeadlinePassed:
            pass  # `up` stopped everything it had started
        except LocalClusterError as err:
            return self._fail("", f"the RayCluster did not come up: {err}")
        if self.cluster is None or self.deadline_passed():
            return self._deadline()
        s.dashboard_url = self.cluster.dashboard_url.removeprefix("http://")  # KubeRay's form: host:port
        self.waiting_for = f"job {s.job_id} to be submitted"
        try:
            self.client = bounded_client(self.cluster.dashboard_url)
            submit_job(self.client, self.spec.entrypoint, self.spec.runtime_env, submission_id=s.job_id)
        except (SubmitError, OSError, RuntimeError) as err:  # RuntimeError: the dashboard answered an error
            return self._fail("SubmissionFailed", f"submitting job {s.job_id} failed: {' '.join(str(err).split())}")
        if self.deadline_passed():
            return self._deadline()
        s.job_deployment_status = "Running"
        self.emit(f"job {s.job_id} submitted to {self.cluster.dashboard_url}")
        try:
            final, _ = follow_job(
                _Watched(self.client, self._on_info), s.job_id, self.active.remaining(), self._on_logs, stop_on_interrupt=True
            )
        except JobTimedOut as err:
            if self.deadline_passed():
                return self._deadline()
            return self._fail("JobStatusCheckTimeoutExceeded", " ".join(str(err).split()))
        except (SubmitError, OSError, RuntimeError) as err:
            return self._fail(
                "JobStatusCheckTimeoutExceeded", f"reading job {s.job_id}'s status failed: {' '.join(str(err).split())}; {self._stop()}"
            )
        s.job_status = final
        if final == "FAILED":
            s.finish("Failed", "AppFailed")
            # Ray's message goes on with the job's last logs, already streamed above.
            self.emit(f"job {s.job_id} FAILED: {(s.message.splitlines() or [''])[0].split(', last available logs')[0]}")
        else:
            s.finish("Complete")
            self.emit(f"job {s.job_id} {final}")
        return TERMINAL[final]

    def _on_info(self, info: Any) -> None:
        s = self.status
        status = _name(info.status)
        s.message = info.message or ""
        s.job_start_ms, s.job_end_ms = info.start_time or 0, info.end_time or 0
        if status != s.job_status and status not in TERMINAL:  # the end is reported after the last logs
            s.job_status = status
            self.waiting_for = f"job {s.job_id} ({status}) to end"
            self.emit(f"job {s.job_id} {status}")

    def _on_logs(self, text: str) -> None:
        for stream in (self.out, self.log_file):
            if stream:
                stream.write(text)
                stream.flush()

    def _fail(self, reason: str, message: str) -> int:
        self.status.finish("Failed", reason, message)
        self.emit(message)
        return 1

    def _deadline(self) -> int:
        reason, message = self.deadline_passed() or ("DeadlineExceeded", "")
        stopped = f"; {self._stop()}" if self.client else ""
        return self._fail(reason, f"{message}; it was waiting for {self.waiting_for}{stopped}")

    def _stop(self) -> str:
        """Stop the job (each request bounded) and wait, bounded, for it to end; say how it went."""
        if self.client is None:
            return "no job was running"
        job_id = self.status.job_id
        try:
            self.client.stop_job(job_id)
            deadline = Deadline(STOP_WAIT_S)
            while (status := _name(self.client.get_job_status(job_id))) not in TERMINAL and not deadline.expired():
                deadline.sleep(0.5)
        except Exception as err:  # reported: the teardown that follows ends it anyway
            return f"stopping job {job_id} failed ({' '.join(str(err).split()) or type(err).__name__}); the teardown ends it"
        return (
            f"job {job_id} was stopped"
            if status in TERMINAL
            else f"job {job_id} still {status} {STOP_WAIT_S:g} s after the stop; the teardown ends it"
        )

    def _clean_up(self) -> None:
        if self.cluster is None:
            return
        if not self.tear_down:
            self.say(
                f"shutdownAfterJobFinishes is false: RayCluster {self.status.ray_cluster_name} stays up at "
                f"{self.cluster.dashboard_url}; `python -m jobs.local --state-dir {self.state_dir} down` stops it"
            )
            return
        stopped = down(self.state_dir)
        self.say(f"RayCluster {self.status.ray_cluster_name} deleted ({len(stopped.nodes) if stopped else 0} node(s) stopped)")


def _name(status: Any) -> str:
    return str(getattr(status, "value", status))  # Ray's JobStatus enum


def run(
    spec: RayJobSpec,
    state_dir: str | Path,
    *,
    default_deadline_s: float = 3600.0,
    node_timeout_s: float = 90.0,
    host_cpus: int = 2,
    object_store_mb: int = 128,
    status_file: IO[str] | None = None,
    log_file: IO[str] | None = None,
    out: IO[str] = sys.stdout,
) -> int:
    """Run the RayJob on a new simulated cluster in `state_dir`; the exit status (0 the job succeeded,
    1 it failed, was stopped or passed a deadline, 130 interrupted)."""
    state_dir = str(Path(state_dir).resolve())
    existing = LocalCluster.load(state_dir)
    if existing and any(alive(n.pid) for n in existing.nodes):  # said before anything starts
        raise LocalClusterError(
            f"a local cluster is already running from {state_dir}; "
            f"`python -m jobs.local --state-dir {state_dir} down` stops it, or pass another --state-dir"
        )
    job = RayJobRun(spec, state_dir, default_deadline_s, out, status_file, log_file)

    def bring_up(progress: Callable[[str], None]) -> LocalCluster:
        return up(
            spec.shape,
            spec.slices,
            state_dir,
            node_timeout_s=node_timeout_s,
            host_cpus=host_cpus,
            object_store_mb=object_store_mb,
            progress=progress,
        )

    started = time.monotonic()
    code = job.run(bring_up)
    print(f"[rayjob] {spec.name}: done in {time.monotonic() - started:.0f} s, exit {code}", file=out, flush=True)
    return code
