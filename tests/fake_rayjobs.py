"""What KubeRay does with a RayJob applied to the fake Kubernetes API (tests/fake_kube.py), for real:
`python -m jobs.local rayjob` run on it (`RayJobRun`), whose status lines become the RayJob's
`.status` and whose log is the submitter pod's log (K8sJobMode: the pod of the Job KubeRay names
after the RayJob). Kueue's part is tests/fake_kueue.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SUBMITTER = "ray-job-submitter"
STOP_S = 90.0  # for an interrupted `jobs.local rayjob` to stop its job and tear its cluster down
TERMINAL = ("Complete", "Failed", "ValidationFailed")


@dataclass
class RayJobRun:
    """One RayJob run by `python -m jobs.local rayjob` in its own directory (the RayJob as JSON, its
    status lines, its log, the simulated cluster's state)."""

    directory: Path
    proc: subprocess.Popen

    @classmethod
    def start(cls, rayjob: dict[str, Any], command: list[str], directory: Path | None = None) -> RayJobRun:
        """A run in `directory` (again, after an eviction: its storage kept), else in a new one."""
        # Short: Ray's socket paths under the state dir are limited to 107 bytes.
        directory = directory or Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
        (directory / "rayjob.json").write_text(json.dumps(rayjob))
        for name in ("status.jsonl", "job.log"):
            (directory / name).write_text("")  # an admission's own: a new cluster, a new submitter pod
        args = [
            *command,
            str(directory / "rayjob.json"),
            "--state-dir",
            str(directory / "state"),
            "--status-file",
            str(directory / "status.jsonl"),
            "--log-file",
            str(directory / "job.log"),
        ]
        with open(directory / "out.log", "wb") as out:  # the run's own lines, to read when a test fails
            # Its own session: a Ctrl-C meant for the test (or for jobs.submit) is not KubeRay's.
            proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return cls(directory, proc)

    def status(self) -> dict[str, Any]:
        """The last status line written whole; a run that ended without an end says so (Failed)."""
        ended = not self.running()
        text = (self.directory / "status.jsonl").read_text()
        lines = text[: text.rfind("\n") + 1].splitlines()  # a line still being written is read next time
        status = json.loads(lines[-1]) if lines else {}
        if ended and status.get("jobDeploymentStatus") not in TERMINAL:
            last = (self.output().strip().splitlines() or ["no output"])[-1]
            message = f"the fake's KubeRay (python -m jobs.local rayjob) exited {self.proc.returncode} before the RayJob ended: {last}"
            status = {**status, "jobDeploymentStatus": "Failed", "message": message}
        return status

    def log_path(self) -> Path:
        return self.directory / "job.log"

    def node_pids(self) -> list[int]:
        """The simulated cluster's node processes (each leads its own process group) while it is up."""
        try:
            return [node["pid"] for node in json.loads((self.directory / "state" / "cluster.json").read_text())["nodes"]]
        except (OSError, ValueError, KeyError):
            return []

    def output(self) -> str:
        return (self.directory / "out.log").read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = STOP_S) -> None:
        """Interrupt the run as a deleted RayJob's would be (it stops the job, tears down), bounded;
        past the bound, kill it and stop what it left with `jobs.local down`."""
        if self.running():
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            state = str(self.directory / "state")
            subprocess.run([sys.executable, "-m", "jobs.local", "--state-dir", state, "down"], cwd=REPO, capture_output=True, timeout=60)

    def clean_up(self) -> None:
        if not self.running() and not os.environ.get("KEEP_RAY_TMP"):
            shutil.rmtree(self.directory, ignore_errors=True)


def submitter_pod(job: dict[str, Any]) -> dict[str, Any] | None:
    """The pod of KubeRay's submitter Job (named after the RayJob), once the status names the cluster."""
    cluster = job.get("status", {}).get("rayClusterName")
    if not cluster:
        return None
    name = job["metadata"]["name"]
    labels = {"batch.kubernetes.io/job-name": name, "job-name": name, "ray-tpu-gke/ray-cluster": name}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": f"{name}-{cluster[-5:]}",
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "creationTimestamp": job.get("status", {}).get("startTime") or job["metadata"].get("creationTimestamp"),
        },
        "spec": {"containers": [{"name": SUBMITTER, "image": "ray"}]},
        "status": {"phase": "Running"},
    }
