"""KubeRay's submitter on the simulated cluster, run for real: the process a RayJob's submitter pod (or
SidecarMode's container) runs, with the environment KubeRay gives it, its output the submitter's log
(what `kubectl logs` shows), and the Job controller's retries of a failed pod.

- K8sJobMode: the submitterPodTemplate's command, or KubeRay's own (common/job.go:89-212
  BuildJobSubmitCommand: wait for the GCS, `ray job status` || `ray job submit --no-wait`, then
  `ray job logs --follow`); a pod that exits non-zero is retried up to `backoffLimit` times, after
  the Job controller's back-off (10 s, doubling, at most 6 min); then the Job has failed.
- SidecarMode: KubeRay's sidecar (job.go:154-209 without the SidecarSubmitterRestart gate): one
  blocking `ray job submit`, never retried.

Every pod reaches the head through the simulated head Service (jobs.local.head_service), and gets
`RAY_DASHBOARD_ADDRESS`, `RAY_JOB_SUBMISSION_ID`, `PYTHONUNBUFFERED=1` and the cluster's token
(`RAY_AUTH_MODE`, `RAY_AUTH_TOKEN`), as KubeRay sets them (rayjob_controller.go:634-662).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobs import REPO_ROOT
from jobs.local.env import TOKEN_FILE, clean_base_env

BACKOFF_S, MAX_BACKOFF_S = 10.0, 360.0  # the Job controller's pod failure back-off
STOP_S = 10.0


def kuberay_command(mode: str, address: str, job_id: str, entrypoint: str, runtime_env: dict) -> list[str]:
    """KubeRay's own submitter command (common/job.go:89-212), for a template with no command."""
    url = f"http://{address}"
    health = f"until python -c \"import urllib.request; urllib.request.urlopen('{url}/api/gcs_healthz', timeout=5)\" >/dev/null 2>&1; "
    health += f'do echo "Waiting for Ray Dashboard GCS to become healthy at {url} ..."; sleep 2; done'
    env_json = ["--runtime-env-json", json.dumps(runtime_env)] if runtime_env else []
    if mode == "SidecarMode":
        submit = shlex.join(["ray", "job", "submit", "--address", url, *env_json, "--submission-id", job_id, "--"])
        return ["/bin/bash", "-ce", "--", f"{health}; {submit} {entrypoint}"]
    status = shlex.join(["ray", "job", "status", "--address", url, job_id])
    submit = shlex.join(["ray", "job", "submit", "--address", url, "--no-wait", *env_json, "--submission-id", job_id, "--"])
    logs = shlex.join(["ray", "job", "logs", "--address", url, "--follow", job_id])
    return ["/bin/bash", "-ce", "--", f"{health}; if ! {status} >/dev/null 2>&1 ; then {submit} {entrypoint} ; fi ; {logs}"]


class SubmitterJob:
    """The submitter's pods, one at a time. `state()`: "running", "succeeded" or "failed" (the Job
    gave up, or SidecarMode's container exited non-zero); `finished_at` (monotonic) once it ended."""

    def __init__(
        self,
        command: list[str],
        *,
        address: str,
        job_id: str,
        state_dir: str,
        backoff_limit: int,
        retried: bool,
        write: Callable[[str], None],
        note: Callable[[str], None],
    ):
        self.command, self.backoff_limit, self.retried = command, backoff_limit, retried
        self.write, self.note = write, note
        env = clean_base_env()
        env.update(RAY_DASHBOARD_ADDRESS=address, RAY_JOB_SUBMISSION_ID=job_id, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
        # The cluster's token, as KubeRay puts it in the submitter's env from the RayCluster's Secret.
        env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"] = "token", Path(state_dir, TOKEN_FILE).read_text().strip()
        self.env = env
        self.failures = 0
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.next_start: float | None = time.monotonic()
        self.finished_at: float | None = None
        self._state = "running"

    def _start_pod(self) -> None:
        self.proc = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,  # the image's working directory holds jobs/ and infra/
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own group: stop() ends what it started too
        )
        proc = self.proc
        self.reader = threading.Thread(target=lambda: [self.write(line) for line in proc.stdout or ()], daemon=True)
        self.reader.start()
        self.next_start = None

    def state(self) -> str:
        """Advance the Job as its controller would, and say where it stands."""
        if self._state != "running":
            return self._state
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None and self.next_start is None:  # the pod just ended
                code = self.proc.returncode
                if self.reader is not None:
                    self.reader.join(5.0)
                if code == 0:
                    return self._end("succeeded")
                self.failures += 1
                if not self.retried or self.failures > self.backoff_limit:
                    what = "its container" if not self.retried else f"the Job (backoffLimit {self.backoff_limit})"
                    self.note(f"submitter pod exited {code}; {what} failed")
                    return self._end("failed")
                pause = min(BACKOFF_S * 2 ** (self.failures - 1), MAX_BACKOFF_S)
                self.note(
                    f"submitter pod exited {code}; the Job starts another in {pause:g} s ({self.failures} of {self.backoff_limit} retries)"
                )
                self.next_start = time.monotonic() + pause
            if self.next_start is not None and time.monotonic() >= self.next_start:
                self._start_pod()
        return self._state

    def _end(self, state: str) -> str:
        self._state, self.finished_at = state, time.monotonic()
        return state

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Signal the running pod's processes (a test's way to lose the submitter's pod)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)

    def stop(self) -> None:
        """Delete the Job: its pod gets SIGTERM, then SIGKILL after STOP_S."""
        self._state = "deleted" if self._state == "running" else self._state
        if self.proc is None or self.proc.poll() is not None:
            return
        self.kill(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self.reader is not None:
            self.reader.join(5.0)
