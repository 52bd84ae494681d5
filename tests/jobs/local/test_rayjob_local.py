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
import yaml

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


@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores; make test-slow runs it
def test_a_healthcheck_rayjob_completes_with_kuberays_transitions_through_a_dropped_log_stream(state_dir, tmp_path):
    """The printed RayJob (K8sJobMode, our submitter) runs to Complete; while its job runs, the
    network between the submitter and the head drops (every connection reset): the submitter follows
    the job again and prints nothing twice, and KubeRay's rules never fail the job for it."""
    job = printed_rayjob(
        tmp_path, "healthcheck", "hc", "--reserve-timeout", "120", "--iters", "100"
    )  # a few seconds of all-reduces, for the drop
    status_file, log_file = tmp_path / "status.jsonl", tmp_path / "job.log"
    started = time.monotonic()
    done = drop_streams_while_it_runs(
        state_dir, job, "healthcheck: attempt 1 on", "--status-file", str(status_file), "--log-file", str(log_file)
    )
    assert done.returncode == 0, done.stdout
    assert time.monotonic() - started < 240
    out = done.stdout
    assert out.count("the network between the submitter and the head drops") == 1, out
    assert "[submitter] its log stream broke" in out and "following it again" in out
    assert transitions(out, "hc") == ["Initializing", "Running", "Complete"] and "Failed" not in out
    assert "[rayjob] hc: Complete: job hc-" in out and out.count("HEALTHCHECK {") == 1 and out.count("healthcheck PASSED") == 1

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
    assert '"ok": true' in logs and "[submitter] submitted job hc-" in logs  # the submitter's log: the job's own in it
    assert all(line in out for line in logs.splitlines())  # streamed to both (KubeRay's lines between them)
    assert_nothing_left(state_dir)


@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores (the deadlines' arithmetic: test_rayjob_pure.py)
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
        tmp_path / "bad.yaml",
        # K8sJobMode with KubeRay's own submitter: `ray job logs --follow` ends with the job, and KubeRay reads its result.
        rayjob("bad", "python -c \"import sys; print('boom'); sys.exit(3)\"", shutdownAfterJobFinishes=False, submissionMode="K8sJobMode"),
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


def sleeping(path: Path, marker: str, seconds: int = 20, mode: str | None = None) -> Path:
    """The printed RayJob at `path` with its job replaced by one that prints, sleeps and prints again
    (in its entrypoint and in its submitter's arguments, where the printed job carries both); in
    `mode` KubeRay's own way when given (no submitter template)."""
    docs = list(yaml.safe_load_all(path.read_text()))
    job = docs[-1]
    entrypoint = (
        f"python -c \"import time; print('before {marker}', flush=True); time.sleep({seconds}); print('after {marker}', flush=True)\""
    )
    job["spec"]["entrypoint"] = entrypoint
    job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["args"][1] = entrypoint
    if mode is not None:
        job["spec"].update(submissionMode=mode)
        job["spec"].pop("submitterPodTemplate")
        job["spec"].pop("submitterConfig")
    out = path.with_name(f"{path.stem}-{mode or 'ours'}.yaml")
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return out


def drop_streams_while_it_runs(state_dir: Path, job: Path, after: str, *extra: str, drops: int = 1) -> subprocess.CompletedProcess:
    """Run the RayJob; once a line holding `after` is out (the job runs), reset the submitter's
    connections to the head (SIGUSR2 to `jobs.local rayjob`) `drops` times, a few seconds apart."""
    log = state_dir.parent / f"{state_dir.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command(state_dir, job, *extra), cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 150
        while after not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        for _ in range(drops):
            proc.send_signal(signal.SIGUSR2)
            time.sleep(2)
        proc.wait(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, log.read_text(), "")


@pytest.mark.slow
def test_sidecar_modes_submitter_fails_the_job_on_a_dropped_stream(state_dir, tmp_path):
    """Why not SidecarMode (infra.kube_facts "submission-mode"): KubeRay's sidecar is one blocking
    `ray job submit`, whose broken stream fails the RayJob and deletes the cluster under the job."""
    marker = f"side-{uuid.uuid4().hex[:8]}"
    job = sleeping(printed_rayjob(tmp_path, "healthcheck", "sd"), marker, mode="SidecarMode")
    done = drop_streams_while_it_runs(state_dir, job, f"\nbefore {marker}")
    assert done.returncode == 1, done.stdout
    assert "Failed (SubmissionFailed): the submitter failed (exit 1) while job sd-" in done.stdout
    assert f"\nafter {marker}" not in done.stdout
    assert_nothing_left(state_dir, marker)


@pytest.mark.slow
def test_an_evicted_train_rayjob_resumes_its_run_from_its_checkpoint(state_dir, tmp_path):
    storage = tmp_path / "runs"
    job = printed_rayjob(
        tmp_path, "train", "tr-ev", "--steps", "30", "--checkpoint-every", "5", "--reserve-timeout", "120", "--storage", str(storage)
    )
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command(state_dir, job), cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not any(
            p.name.startswith("checkpoint_step_") and p.name[16:].isdigit() for p in (storage / "tr-ev").glob("checkpoint_step_*")
        ):
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
        evicted = subprocess.run(
            [sys.executable, "-m", "jobs.local", "preempt", "--state-dir", str(state_dir)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert evicted.returncode == 0, evicted.stdout + evicted.stderr
        assert evicted.stdout.startswith("[local] evicted RayJob tr-ev: Suspended, its cluster deleted")
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    assert transitions(out, "tr-ev") == ["Initializing", "Running", "Initializing", "Running", "Complete"]
    assert "Suspending: evicted by Kueue" in out and "Suspended: its cluster is gone" in out
    events = [json.loads(line) for line in (storage / "tr-ev" / "goodput.jsonl").read_text().splitlines()]
    starts = [e["attempt"] for e in events if e["event"] == "attempt_start"]
    restored = [e for e in events if e["event"] == "restored"]
    assert len(starts) >= 2 and starts == sorted(starts), events  # the first cluster's, then the re-admitted one's
    assert restored and restored[-1]["step"] > 0 and restored[-1]["attempt"] == starts[-1]
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("TRAIN {"))[6:])
    assert summary["steps"] == 30 and summary["start_step"] == restored[-1]["step"]
    assert_nothing_left(state_dir)


def test_preempt_with_no_rayjob_running_says_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.local", "preempt", "--state-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert (
        proc.stderr.strip()
        == f"[local] error: no RayJob is running from {tmp_path}; `python -m jobs.local rayjob FILE --state-dir {tmp_path}` runs one"
    )
