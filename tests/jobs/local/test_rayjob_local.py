"""`python -m jobs.local rayjob FILE` for real, as a user runs it: a RayJob's job on a simulated v6e
2x2 slice (one host, the cheapest) with KubeRay's status transitions, its status lines valid against
the RayJob CRD; a job past activeDeadlineSeconds stopped, and one past preRunningDeadlineSeconds
while its cluster comes up, each leaving nothing running; and (slow) a failed job whose cluster stays
up as shutdownAfterJobFinishes: false says, and Ctrl-C."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from jobs import REPO_ROOT, local
from tests import kuberay_schema
from tests.jobs.local.rayjobs import CRDS, leftovers, rayjob, write

pytestmark = pytest.mark.cluster


@pytest.fixture
def state_dir(ray_tmp):
    # Short on purpose: Ray's unix socket paths under it must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="rj-", dir="/tmp"))
    yield path
    local.down(path)  # only if a test failed half-way
    shutil.rmtree(path, ignore_errors=True)


def command(state_dir: Path, job: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jobs.local", "--state-dir", str(state_dir), "rayjob", str(job), *extra]


def run(state_dir: Path, job: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command(state_dir, job, *extra), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def transitions(stdout: str, name: str) -> list[str]:
    """The jobDeploymentStatus of each `[rayjob] NAME: STATUS[ (REASON)]: ...` line, in order, repeats folded."""
    steps = [line.split(": ")[1].split(" ")[0] for line in stdout.splitlines() if line.startswith(f"[rayjob] {name}: ")]
    steps = [s for s in steps if s in ("Initializing", "Running", "Complete", "Failed")]
    return [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s]


def statuses(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_nothing_left(state_dir: Path, *needles: str) -> None:
    assert local.status(state_dir) is None  # no cluster recorded there
    assert leftovers(str(state_dir), *needles) == []  # and no raylet, dashboard or job process of it


OURS = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32


def printed_rayjob(tmp_path: Path, job: str, name: str, *job_args: str) -> Path:
    """The RayJob `python -m jobs.submit JOB --print-rayjob` prints for an environment with one v6e 2x2
    slice group (the cheapest simulated slice): exactly what a user would apply."""
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        "project: my-gcp-project\nregion: us-east5\nzone: us-east5-b\ncluster_name: rj\n"
        "slice_groups: [{name: v6e-2x2, generation: v6e, topology: 2x2, rayjob_slices: 1}]\n"
        "ray: {job_env_vars: {RAYJOB_TEST: '1'}}\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "jobs.submit",
        job,
        "--env",
        str(env_file),
        "--tpu-image",
        OURS,
        "--print-rayjob",
        "--name",
        name,
        "--",
        *job_args,
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / f"{name}.yaml"
    path.write_text(proc.stdout)
    return path


def test_a_healthcheck_rayjob_completes_with_kuberays_transitions(state_dir, tmp_path):
    job = printed_rayjob(tmp_path, "healthcheck", "hc", "--reserve-timeout", "120")
    status_file, log_file = tmp_path / "status.jsonl", tmp_path / "job.log"
    started = time.monotonic()
    done = run(state_dir, job, "--status-file", str(status_file), "--log-file", str(log_file))
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 240

    assert transitions(done.stdout, "hc") == ["Initializing", "Running", "Complete"]
    assert "[rayjob] hc: Complete: job hc-" in done.stdout and "HEALTHCHECK {" in done.stdout and done.stderr == ""

    lines = statuses(status_file)
    deployment = [s["jobDeploymentStatus"] for s in lines]
    assert deployment[0] == "Initializing" and deployment[-1] == "Complete" and set(deployment) == {"Initializing", "Running", "Complete"}
    assert [s.get("jobStatus") for s in lines][-2:] == ["RUNNING", "SUCCEEDED"]
    last = lines[-1]
    assert (last["succeeded"], last["failed"]) == (1, 0) and last["jobId"].startswith("hc-") and last["endTime"] >= last["startTime"]
    assert {s["jobId"] for s in lines} == {last["jobId"]}  # one job, the id KubeRay would give it
    if CRDS.is_dir():
        for status in lines:
            assert kuberay_schema.errors(CRDS, {**rayjob("hc"), "status": status}) == [], status

    logs = log_file.read_text()
    assert '"ok": true' in logs and logs in done.stdout  # the same logs, streamed to both
    assert_nothing_left(state_dir)


def test_a_rayjob_past_its_active_deadline_is_stopped_and_leaves_nothing(state_dir, tmp_path):
    marker = f"rayjob-deadline-{uuid.uuid4().hex[:8]}"  # names this job's processes
    entrypoint = f'python -c "import time; time.sleep(600)" {marker}'
    job = write(tmp_path / "slow.yaml", rayjob("slow", entrypoint, activeDeadlineSeconds=20))
    status_file = tmp_path / "status.jsonl"
    started = time.monotonic()
    done = run(state_dir, job, "--status-file", str(status_file), timeout=180)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert 20 <= elapsed < 90  # the deadline, a bounded stop and the teardown
    failed = [line for line in done.stdout.splitlines() if "Failed (DeadlineExceeded)" in line]
    assert len(failed) == 1 and "has passed the activeDeadlineSeconds" in failed[0] and "ActiveDeadlineSeconds: 20" in failed[0]
    assert "it was waiting for" in failed[0]  # what for: the cluster, or the job to end (and that it was stopped)
    last = statuses(status_file)[-1]
    assert (last["jobDeploymentStatus"], last["reason"], last["failed"]) == ("Failed", "DeadlineExceeded", 1)
    assert transitions(done.stdout, "slow")[-1] == "Failed" and "RayCluster slow-" in done.stdout.splitlines()[-2]  # torn down
    assert_nothing_left(state_dir, marker)


@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores; make test-slow runs it
def test_a_rayjob_past_its_pre_running_deadline_fails_while_its_cluster_comes_up(state_dir, tmp_path):
    job = write(tmp_path / "early.yaml", rayjob("early", preRunningDeadlineSeconds=1))
    status_file = tmp_path / "status.jsonl"
    done = run(state_dir, job, "--status-file", str(status_file), timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed (PreRunningDeadlineExceeded): The RayJob has passed the preRunningDeadlineSeconds" in done.stdout
    assert "it was waiting for the RayCluster to come up" in done.stdout
    assert [s["jobDeploymentStatus"] for s in statuses(status_file)] == ["Initializing", "Failed"]
    assert_nothing_left(state_dir)


@pytest.mark.slow
def test_a_short_train_rayjob_as_printed_succeeds(state_dir, tmp_path):
    job = printed_rayjob(tmp_path, "train", "tr", "--steps", "3", "--reserve-timeout", "120", "--storage", str(tmp_path / "runs"))
    done = run(state_dir, job, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert transitions(done.stdout, "tr") == ["Initializing", "Running", "Complete"] and "TRAIN {" in done.stdout
    assert_nothing_left(state_dir)


@pytest.mark.slow
def test_a_failed_job_leaves_its_cluster_up_when_shutdown_after_job_finishes_is_false(state_dir, tmp_path):
    job = write(
        tmp_path / "bad.yaml", rayjob("bad", "python -c \"import sys; print('boom'); sys.exit(3)\"", shutdownAfterJobFinishes=False)
    )
    done = run(state_dir, job)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed (AppFailed): job bad-" in done.stdout and "boom" in done.stdout
    assert "shutdownAfterJobFinishes is false: RayCluster bad-" in done.stdout
    st = local.status(state_dir)
    assert st is not None and st.healthy  # still up, as KubeRay leaves it
    local.down(state_dir)
    assert_nothing_left(state_dir)


@pytest.mark.slow
def test_ctrl_c_stops_the_job_and_tears_down(state_dir, tmp_path):
    marker = f"rayjob-ctrl-c-{uuid.uuid4().hex[:8]}"
    job = write(tmp_path / "int.yaml", rayjob("int", f'python -c "import time; time.sleep(600)" {marker}', shutdownAfterJobFinishes=False))
    status_file = tmp_path / "status.jsonl"
    proc = subprocess.Popen(command(state_dir, job, "--status-file", str(status_file)), cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (status_file.exists() and '"RUNNING"' in status_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "[rayjob] int: interrupted; job int-" in out and "RayCluster int-" in out  # torn down all the same
    assert_nothing_left(state_dir, marker)
