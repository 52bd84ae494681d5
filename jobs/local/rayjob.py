"""`python -m jobs.local rayjob FILE`: run what a printed KubeRay RayJob runs, on a simulated slice of
its shape, the way KubeRay's RayJob controller drives it (ray-operator rayjob_controller.go at
v1.7.0; infra.kube_facts "submission-mode", "suspend"):

- `Initializing` from the start (the RayCluster coming up; `status.startTime`), then `Running` once
  the submitter is started: K8sJobMode's submitter Job and SidecarMode's container run for real
  (jobs.local.submitters: the template's command or KubeRay's own, the Job's pod retries, the
  cluster's token); HTTPMode is submitted here, as the operator does. Every ~2 s the controller
  reads Ray's status of the job from the dashboard.
- The end, by KubeRay's rules: `Complete` once Ray says SUCCEEDED or STOPPED and the submitter has
  finished (`Failed`/`AppFailed` for FAILED); `Failed`/`SubmissionFailed` at once when the submitter
  Job fails (or the sidecar exits non-zero); `Failed`/`JobDeploymentStatusTransitionGracePeriodExceeded`
  30 s after the submitter finished while the job still runs.
- `activeDeadlineSeconds` counts from the start to the end (`DeadlineExceeded`);
  `preRunningDeadlineSeconds` from the start until `Running` (`PreRunningDeadlineExceeded`). Past
  one, the job is stopped (bounded) and the RayJob is Failed. A RayJob with no
  activeDeadlineSeconds is still bounded here, by `--default-deadline`.
- Evicted, as Kueue evicts it (`python -m jobs.local preempt`, which sends SIGUSR1): `Suspending`
  (the submitter and the cluster deleted, the job not stopped first), `Suspended` (job id and
  cluster name cleared), then admitted again at once: a new cluster, a new job id, the entrypoint
  from the start, the deadlines counted anew.
- SIGUSR2 resets every connection through the head's Service (a network blip between the
  submitter's pod and the head): the submitter's log stream drops while the job runs on.
- Afterwards the cluster is torn down when `shutdownAfterJobFinishes` (KubeRay's default: false,
  the cluster stays up). `ttlSecondsAfterFinished` is not waited for, and `backoffLimit` retries
  are not made: this proves one run.

Each transition is a `[rayjob] NAME: ...` line on stdout and, with `--status-file`, the RayJob
`.status` KubeRay would show, one JSON object a line; `<state-dir>/rayjob.json` says which process
runs the RayJob, where it stands and how often it was evicted (what `preempt` reads).
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

from jobs.client.jobs_api import TERMINAL, SubmitError, bounded_client, submit_job
from jobs.local.cluster import LocalCluster, LocalClusterError, down, up
from jobs.local.head_service import HeadService
from jobs.local.preempt import CONTROL_FILE, write_control
from jobs.local.processes import alive
from jobs.local.rayjob_spec import RayJobSpec, RayJobStatus
from jobs.local.submitters import SubmitterJob, kuberay_command
from jobs.runtime.deadlines import Deadline

STOP_WAIT_S = 20.0  # for a stopped job to end (Ray's own grace before SIGKILL is 3 s)
POLL_S = 2.0  # between the controller's reads of the job's status
SUBMITTER_FINISHED_S = 30.0  # rayjob_controller.go:40 DefaultSubmitterFinishedTimeout
GRACE_S = 300.0  # constant.go:284-290: a terminal job whose submitter never ends; and unreadable status


class _DeadlinePassed(BaseException):
    """Raised by the alarm while the cluster comes up. A BaseException, as Ctrl-C is, so that no
    `except Exception` on the way swallows it; `up` stops what it started either way."""


class _Evicted(Exception):
    """Kueue evicted the RayJob: KubeRay suspends it."""


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
        self.default_deadline_s = default_deadline_s
        self.tear_down = spec.shutdown_after_finishes
        self.evictions = 0
        self.evict_requested = False
        self._begin()

    def _begin(self) -> None:
        """A new start (the first, or after a suspension): new ids, the deadlines from now."""
        spec = self.spec
        self.status = RayJobStatus.initializing(spec.name)
        self.active = Deadline(spec.active_deadline_s or self.default_deadline_s)
        self.active_what = (
            f"activeDeadlineSeconds. StartTime: {{}}. ActiveDeadlineSeconds: {spec.active_deadline_s}"
            if spec.active_deadline_s
            else f"local run's --default-deadline (it sets no activeDeadlineSeconds). StartTime: {{}}. Seconds: {self.default_deadline_s:g}"
        )
        self.pre_running = Deadline(spec.pre_running_deadline_s) if spec.pre_running_deadline_s else None
        self.waiting_for = "the RayCluster to be created"
        self.cluster: LocalCluster | None = None
        self.client: Any = None
        self.service: HeadService | None = None
        self.submitter: SubmitterJob | None = None
        self.terminal_at: float | None = None  # when Ray first said the job ended

    def say(self, text: str) -> None:
        print(f"[rayjob] {self.spec.name}: {text}", file=self.out, flush=True)

    def emit(self, note: str = "") -> None:
        s = self.status
        self.say(s.job_deployment_status + (f" ({s.reason})" if s.reason else "") + (f": {note}" if note else ""))
        if self.status_file:
            self.status_file.write(json.dumps(s.to_json()) + "\n")
            self.status_file.flush()
        self._write_control()

    def _write_control(self) -> None:
        write_control(self.state_dir, self.spec.name, self.status.job_deployment_status, self.evictions)

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
        self.emit(f"starting a simulated {self.spec.slices} x {self.spec.shape} as RayCluster {self.status.ray_cluster_name}")
        handlers = {
            signal.SIGTERM: _interrupt,
            signal.SIGUSR1: lambda signum, frame: setattr(self, "evict_requested", True),
            signal.SIGUSR2: lambda signum, frame: self._drop_streams(),
        }
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        try:
            while True:
                try:
                    return self._run(bring_up)
                except _Evicted:
                    self._suspend()
        except KeyboardInterrupt:
            self.say(f"interrupted; {self._stop()}")
            self.tear_down = True  # whatever shutdownAfterJobFinishes says: nothing is left behind
            return 130
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._clean_up()
            Path(self.state_dir, CONTROL_FILE).unlink(missing_ok=True)

    def _drop_streams(self) -> None:
        if self.service is not None:
            self.say(f"the network between the submitter and the head drops: {self.service.drop()} connection(s) reset")

    def _check_evicted(self) -> None:
        if self.evict_requested:
            self.evict_requested = False
            raise _Evicted()

    def _suspend(self) -> None:
        """KubeRay's Suspending -> Suspended (rayjob_controller.go:366-419), then Kueue's admission."""
        s = self.status
        s.job_deployment_status, s.reason, s.message = "Suspending", "", ""
        self.emit("evicted by Kueue: deleting the submitter and the RayCluster (the job is not stopped first)")
        if self.submitter is not None:
            self.submitter.stop()
        self._clean_up(force=True)
        self.evictions += 1
        s.job_deployment_status, s.job_id, s.ray_cluster_name, s.job_status, s.dashboard_url = "Suspended", "", "", "", ""
        self.emit("its cluster is gone; Kueue holds it until it admits it again")
        self._begin()
        self.emit(
            f"admitted again: starting a simulated {self.spec.slices} x {self.spec.shape} as RayCluster {self.status.ray_cluster_name}"
        )

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
        self._check_evicted()
        s.dashboard_url = self.cluster.dashboard_url.removeprefix("http://")  # KubeRay's form: host:port
        self.service = HeadService(int(s.dashboard_url.rsplit(":", 1)[1]))
        self.waiting_for = f"job {s.job_id} to be submitted"
        try:
            self.client = bounded_client(self.cluster.dashboard_url)
            self._start_submitter()
        except (SubmitError, OSError, RuntimeError) as err:  # RuntimeError: the dashboard answered an error
            return self._fail("SubmissionFailed", f"submitting job {s.job_id} failed: {' '.join(str(err).split())}")
        if self.deadline_passed():
            return self._deadline()
        s.job_deployment_status = "Running"
        how = f"{self.spec.mode}'s submitter started" if self.submitter else "submitted by the operator (HTTPMode)"
        self.emit(f"job {s.job_id} {how}, through the head's Service at {self.service.address}")
        return self._follow()

    def _start_submitter(self) -> None:
        spec, s = self.spec, self.status
        assert self.service is not None
        if spec.mode == "HTTPMode":
            submit_job(self.client, spec.entrypoint, spec.runtime_env, submission_id=s.job_id)
            return
        command = list(
            spec.submitter_command or kuberay_command(spec.mode, self.service.address, s.job_id, spec.entrypoint, spec.runtime_env)
        )
        self.submitter = SubmitterJob(
            command,
            address=self.service.address,
            job_id=s.job_id,
            state_dir=self.state_dir,
            backoff_limit=spec.submitter_backoff_limit,
            retried=spec.mode == "K8sJobMode",
            write=self._on_logs,
            note=lambda text: self.say(text),
        )
        self.submitter.state()

    def _follow(self) -> int:
        """The controller's loop while Running (rayjob_controller.go:249-365)."""
        s, logged, unread_since = self.status, 0, None
        while True:
            self._check_evicted()
            if self.deadline_passed():
                return self._deadline()
            submitter = self.submitter.state() if self.submitter else "succeeded"
            if submitter == "failed":  # rayjob_controller.go:1098-1114, 1138-1165
                reason = "AppFailed" if s.job_status == "FAILED" else "SubmissionFailed"
                return self._fail(
                    reason,
                    f"the submitter failed (exit {self.submitter.exit_code if self.submitter else '?'}) while job {s.job_id} was {s.job_status or 'not yet started'}",
                )
            try:
                info = self.client.get_job_info(s.job_id)
                unread_since = None
            except Exception as err:  # not there yet, or the dashboard answered an error
                unread_since = unread_since or time.monotonic()
                if time.monotonic() - unread_since > GRACE_S:
                    return self._fail(
                        "JobStatusCheckTimeoutExceeded",
                        f"reading job {s.job_id}'s status failed for {GRACE_S:g} s: {' '.join(str(err).split())}",
                    )
                info = None
            if info is not None:
                self._on_info(info)
                if self.spec.mode == "HTTPMode":
                    logs = self.client.get_job_logs(s.job_id)
                    self._on_logs(logs[logged:])
                    logged = len(logs)
                status = _name(info.status)
                finished = self.submitter.finished_at if self.submitter else time.monotonic()
                if status in TERMINAL:
                    self.terminal_at = self.terminal_at or time.monotonic()
                    # The submitter must have finished too, or the grace period passed (rayjob_controller.go:337-341, 1366-1394).
                    if finished is not None or time.monotonic() - self.terminal_at > GRACE_S:
                        return self._finish(status)
                if (
                    status not in TERMINAL
                    and self.submitter
                    and finished is not None
                    and time.monotonic() - finished > SUBMITTER_FINISHED_S
                ):
                    s.job_status = "FAILED"  # rayjob_controller.go:1263-1285 overwrites it
                    return self._fail(
                        "JobDeploymentStatusTransitionGracePeriodExceeded",
                        f"The RayJob submitter finished but the ray job did not reach terminal state within {SUBMITTER_FINISHED_S:g}s",
                    )
            self.active.sleep(POLL_S)

    def _finish(self, final: str) -> int:
        s = self.status
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
        if not text:
            return
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
        if self.client is None or not self.status.job_id:
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

    def _clean_up(self, force: bool = False) -> None:
        if self.submitter is not None:
            self.submitter.stop()
        if self.service is not None:
            self.service.close()
            self.service = None
        if self.cluster is None:
            return
        if not (self.tear_down or force):
            self.say(
                f"shutdownAfterJobFinishes is false: RayCluster {self.status.ray_cluster_name} stays up at "
                f"{self.cluster.dashboard_url}; `python -m jobs.local --state-dir {self.state_dir} down` stops it"
            )
            return
        stopped = down(self.state_dir, all_at_once=force)  # evicted: KubeRay deletes the RayCluster, every pod at once
        self.say(f"RayCluster {self.status.ray_cluster_name} deleted ({len(stopped.nodes) if stopped else 0} node(s) stopped)")
        self.cluster = None


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
