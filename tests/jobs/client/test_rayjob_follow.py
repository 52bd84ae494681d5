"""`jobs.submit JOB --rayjob` with the real kubectl against a fake Kubernetes API server
(tests/fake_kube.py, the only fake: the cluster), whose KubeRay runs each admitted RayJob for real
on a simulated slice of its shape (`python -m jobs.local rayjob`) and whose Kueue holds a queued one
for a moment: the phases, the job's own logs, the exit status, what is deleted and when, and that
nothing is left running."""

from __future__ import annotations

import contextlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import load_environment
from jobs import REPO_ROOT as REPO
from jobs.client.rayjob import run_rayjob
from tests.fake_kube import FakeKube, serve

TPU_IMAGE = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32
SLICE_GROUP = {"name": "v6e-2x2", "generation": "v6e", "topology": "2x2"}  # one 4-chip host: quick to start
BASE = {"project": "my-gcp-project", "region": "us-east5", "zone": "us-east5-b", "cluster_name": "sim"}

pytestmark = pytest.mark.skipif(not (REPO.parent / "shared" / "kuberay" / "crds").is_dir(), reason="../shared/kuberay/crds is not here")


@pytest.fixture(scope="module")
def env_files(tmp_path_factory) -> dict[str, Path]:
    """`plain`: one v6e 2x2 slice group for RayJobs; `kueue`: the same, queued by Kueue."""
    directory = tmp_path_factory.mktemp("env")
    configs = {
        "plain": {**BASE, "slice_groups": [{**SLICE_GROUP, "rayjob_slices": 1}]},
        "kueue": {**BASE, "slice_groups": [{**SLICE_GROUP, "rayjob_slices": 1}], "kueue": {"local_queue": "ray-jobs"}},
    }
    for name, config in configs.items():
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return {name: directory / f"{name}.yaml" for name in configs}


@pytest.fixture(scope="module")
def kueue_docs(env_files) -> list[dict[str, Any]]:
    """Kueue's objects as `python -m infra manifests` prints them for the `kueue` environment."""
    cmd = [sys.executable, "-m", "infra", "manifests", "--env", str(env_files["kueue"])]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(proc.stdout) if d["apiVersion"].startswith("kueue.x-k8s.io/")]


@pytest.fixture
def fake(tmp_path, monkeypatch, kueue_docs) -> Iterator[FakeKube]:
    """The fake API server, this process's kubectl pointed at it; its runs stopped afterwards."""
    if not kubectl_installed():
        pytest.skip("kubectl is not installed")
    with serve(FakeKube(admit_after_s=3.0, kueue_docs=kueue_docs)) as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path)))
        monkeypatch.setenv("HOME", str(tmp_path))  # kubectl's discovery cache goes here
        yield kube


def kubectl_installed() -> bool:
    return shutil.which("kubectl") is not None


def submit_cmd(env_file: Path, *flags: str, job_args: tuple[str, ...] = ("--reserve-timeout", "120")) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jobs.submit",
        "healthcheck",
        "--env",
        str(env_file),
        "--tpu-image",
        TPU_IMAGE,
        "--rayjob",
        *flags,
        "--",
        *job_args,
    ]


def printed_docs(env_file: Path, *flags: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "jobs.submit", "healthcheck", "--env", str(env_file), "--tpu-image", TPU_IMAGE, "--print-rayjob", *flags]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def in_order(text: str, *parts: str) -> bool:
    at = 0
    for part in parts:
        at = text.find(part, at)
        if at < 0:
            return False
    return True


def group_alive(pgid: int) -> bool:
    """Any live (not zombie) process in the process group."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


def the_run(fake: FakeKube):
    (run,) = fake.runs.values()
    return run


# -- refused, unreachable, timed out: no cluster starts ---------------------------------------------


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"bogus": 1}, 'strict decoding error: unknown field "spec.bogus"'),
        ({"submissionMode": 5}, "The RayJob \"refused-1\" is invalid: spec.submissionMode: Invalid value: 5: 5 is not of type 'string'"),
    ],
    ids=["unknown-field", "wrong-type"],
)
def test_a_rayjob_the_api_server_refuses_is_one_line_exit_2_and_nothing_stays(fake, env_files, capsys, bad, says):
    docs = printed_docs(env_files["plain"], "--name", "refused-1")
    docs[-1]["spec"].update(bad)
    code = run_rayjob(load_environment(str(env_files["plain"]), tpu_image=TPU_IMAGE), docs, timeout_s=60)
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: cannot apply RayJob refused-1 and NetworkPolicy refused-1-ingress in namespace default: ")
    assert says in err and err.strip().endswith("nothing of it is left applied")
    assert any(r.startswith("POST /apis/ray.io/v1/namespaces/default/rayjobs?") and "fieldValidation=Strict" in r for r in fake.requests)
    assert fake.objects == {} and fake.runs == {}  # the NetworkPolicy applied before the refusal is gone


def test_an_unreachable_api_server_is_one_line_naming_the_credentials_command(env_files, tmp_path, monkeypatch, capsys):
    if not kubectl_installed():
        pytest.skip("kubectl is not installed")
    with serve(FakeKube()) as kube:
        config = kube.kubeconfig(tmp_path)  # the server is gone once this block ends
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setenv("HOME", str(tmp_path))
    docs = printed_docs(env_files["plain"], "--name", "nowhere-1")
    code = run_rayjob(load_environment(str(env_files["plain"]), tpu_image=TPU_IMAGE), docs, timeout_s=30)
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot apply RayJob nowhere-1" in err and "gcloud container clusters get-credentials sim" in err


def test_out_of_time_while_queued_deletes_it_saying_what_it_waited_for(fake, env_files):
    fake.admit_after_s = 600.0  # Kueue never admits it in time
    start = time.monotonic()
    proc = subprocess.run(
        submit_cmd(env_files["kueue"], "--name", "late-1", "--timeout", "6"), cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "rayjob late-1: queued: Kueue holds it in LocalQueue ray-jobs until it admits it" in proc.stdout
    assert "rayjob late-1: queued: Kueue says: the fake Kueue holds it" in proc.stdout  # from its Workload
    assert proc.stderr.splitlines() == [
        "error: waited 6 s for RayJob late-1 to be admitted by Kueue (LocalQueue ray-jobs); "
        "deleted RayJob late-1 and NetworkPolicy late-1-ingress in namespace default"
    ]
    assert fake.objects == {} and fake.runs == {}
    assert time.monotonic() - start < 60


def test_a_rayjob_deleted_by_someone_else_ends_the_follow_with_1(fake, env_files, tmp_path):
    fake.admit_after_s = 600.0
    proc = subprocess.Popen(
        submit_cmd(env_files["kueue"], "--name", "gone-1"), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        lines = Lines(proc)
        lines.wait_for("queued: Kueue holds it", 90)
        subprocess.run(["kubectl", "delete", "rayjob", "gone-1", "-n", "default"], check=True, capture_output=True, timeout=30)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, lines.text + err
    assert err.splitlines() == [
        "error: RayJob gone-1 was deleted by someone else; it was waiting to be admitted by Kueue (LocalQueue ray-jobs)"
    ]


# -- run on a simulated slice ------------------------------------------------------------------------


class Lines:
    """A process's stdout, read as it comes, so a test can act on a line while it runs."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.seen: list[str] = []
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    @property
    def text(self) -> str:
        return "".join(self.seen)

    def wait_for(self, part: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if part in line:
                return line
        raise AssertionError(f"no line with {part!r} in {timeout_s:g} s; stdout so far:\n{self.text}")

    def rest(self, timeout_s: float) -> str:
        with contextlib.suppress(AssertionError):
            self.wait_for("\0never", timeout_s)
        return self.text


@pytest.mark.cluster
def test_a_queued_healthcheck_runs_to_success_with_its_logs(fake, env_files):
    start = time.monotonic()
    proc = subprocess.run(
        submit_cmd(env_files["kueue"], "--name", "hc-ok", "--timeout", "300"), cwd=REPO, capture_output=True, text=True, timeout=400
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr + "".join(r.output() for r in fake.runs.values())
    assert in_order(
        out,
        "rayjob hc-ok: applied RayJob hc-ok and NetworkPolicy hc-ok-ingress in namespace default",
        "rayjob hc-ok: queued: Kueue holds it in LocalQueue ray-jobs",
        "rayjob hc-ok: admitted by Kueue (LocalQueue ray-jobs)",
        "rayjob hc-ok: Initializing: RayCluster hc-ok-",
        "rayjob hc-ok: Running: job hc-ok-",
        "healthcheck: reserving 1 x v6e 2x2",  # the job's own output, from the submitter's log
        "healthcheck PASSED: 1 x v6e 2x2",
        "rayjob hc-ok: Complete: job hc-ok-",
        "rayjob hc-ok: its RayCluster goes with ttlSecondsAfterFinished; NetworkPolicy hc-ok-ingress with the RayJob",
    ), out
    assert out.count("healthcheck PASSED") == 1 and proc.stderr == ""
    logs = [r for r in fake.requests if "/pods/" in r and r.split("?")[0].endswith("/log")]
    assert logs and all("container=ray-job-submitter" in r for r in logs) and any("follow=true" in r for r in logs)
    # The RayJob stays (its cluster for ttlSecondsAfterFinished), and so does its NetworkPolicy, as
    # the RayJob's dependent: the garbage collector deletes it with the RayJob, never before.
    assert sorted(fake.objects) == [("networkpolicies", "default", "hc-ok-ingress"), ("rayjobs", "default", "hc-ok")]
    job, policy = fake.objects[("rayjobs", "default", "hc-ok")], fake.objects[("networkpolicies", "default", "hc-ok-ingress")]
    assert policy["metadata"]["ownerReferences"] == [
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "hc-ok", "uid": job["metadata"]["uid"]}
    ]
    assert fake.wait_for_runs(120) == []
    assert "SUCCEEDED" in the_run(fake).status().get("jobStatus", "")
    print(f"queued healthcheck as a RayJob: {time.monotonic() - start:.0f} s")


@pytest.mark.cluster
@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores; make test-slow runs it
def test_a_deadline_that_passes_while_the_cluster_comes_up_fails_the_job_with_1(fake, env_files):
    # A Ray head takes longer than 3 s to start: KubeRay's preRunningDeadlineSeconds passes first.
    cmd = submit_cmd(env_files["plain"], "--name", "hc-late", "--pre-running-deadline", "3")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert in_order(
        proc.stdout, "rayjob hc-late: created; waiting for the KubeRay operator", "rayjob hc-late: Initializing: RayCluster hc-late-"
    )
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "error: RayJob hc-late Failed (PreRunningDeadlineExceeded): The RayJob has passed the preRunningDeadlineSeconds."
    )
    assert "it was waiting for the RayCluster to come up" in line
    assert "rayjob hc-late: its RayCluster goes with ttlSecondsAfterFinished; NetworkPolicy hc-late-ingress with the RayJob" in proc.stdout
    assert fake.wait_for_runs(120) == []


@pytest.mark.cluster
@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores; make test-slow runs it
def test_ctrl_c_while_running_deletes_the_rayjob_and_exits_130(fake, env_files):
    # Enough all-reduces to keep it running well past the Ctrl-C.
    cmd = submit_cmd(env_files["kueue"], "--name", "hc-stop", job_args=("--reserve-timeout", "120", "--iters", "100000"))
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc)
        lines.wait_for("rayjob hc-stop: Running: job hc-stop-", 240)
        lines.wait_for("healthcheck: attempt 1 on", 120)  # its logs stream while it runs
        pids = the_run(fake).node_pids()
        assert pids, the_run(fake).output()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, lines.rest(1) + err
    (line,) = err.splitlines()
    job_id = the_run(fake).status()["jobId"]
    assert line.startswith(
        f"error: interrupted: deleted RayJob hc-stop and NetworkPolicy hc-stop-ingress in namespace default; it was waiting to finish job {job_id} (Running"
    )
    assert fake.objects == {}  # kubectl waited until both were gone
    assert fake.wait_for_runs(120) == []
    assert "interrupted; job " in the_run(fake).output()  # KubeRay's side stopped the Ray job
    assert not [pid for pid in pids if group_alive(pid)], "simulated nodes left running"


@pytest.mark.cluster
@pytest.mark.slow  # three simulated clusters one after another
def test_a_higher_priority_job_preempts_a_running_one_which_runs_again_after(fake, env_files, tmp_path):
    """The queue holds one slice: a `low` job runs; a `high` one arrives, Kueue evicts `low` for it (its
    RayJob Suspended, its cluster deleted), runs `high` to the end, then admits `low` again."""
    docs = printed_docs(env_files["kueue"], "--name", "low-1", "--priority", "low")
    job = docs[-1]
    entrypoint = "python -c \"import time; print('low starts', flush=True); time.sleep(40); print('low ends', flush=True)\""
    job["spec"]["entrypoint"] = entrypoint
    job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["args"][1] = entrypoint
    applied = subprocess.run(["kubectl", "apply", "-f", "-"], input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    deadline = time.monotonic() + 240
    while "RUNNING" not in str(fake.answer("/apis/ray.io/v1/namespaces/default/rayjobs/low-1")[1].get("status", {}).get("jobStatus")):
        status = fake.answer("/apis/ray.io/v1/namespaces/default/rayjobs/low-1")[1].get("status")
        assert time.monotonic() < deadline and not fake.errors, (fake.errors, status, [r.output()[-2000:] for r in fake.runs.values()])
        time.sleep(1)
    high = subprocess.run(
        submit_cmd(env_files["kueue"], "--name", "high-1", "--priority", "high", "--timeout", "400"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert high.returncode == 0, high.stdout + high.stderr
    assert fake.evictions == ["low-1"]
    assert in_order(
        high.stdout,
        "rayjob high-1: queued: Kueue holds it in LocalQueue ray-jobs",
        "rayjob high-1: admitted by Kueue (LocalQueue ray-jobs)",
        "healthcheck PASSED",
        "rayjob high-1: Complete: job high-1-",
    ), high.stdout
    deadline = time.monotonic() + 300
    while fake.answer("/apis/ray.io/v1/namespaces/default/rayjobs/low-1")[1].get("status", {}).get("jobDeploymentStatus") != "Complete":
        assert time.monotonic() < deadline and not fake.errors, (
            fake.errors,
            fake.answer("/apis/ray.io/v1/namespaces/default/rayjobs/low-1")[1],
        )
        time.sleep(2)
    low = next(r for r in fake.runs.values() if r.status().get("rayClusterName", "").startswith("low-1-"))
    assert "low ends" in low.log_path().read_text()
    assert fake.wait_for_runs(120) == []
