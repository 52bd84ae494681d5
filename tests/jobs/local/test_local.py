"""`jobs.local` for real: up (a one-host v6e 2x2 slice, the cheapest), status, a job through the
Ray Jobs API (the `ray job submit` path), a refused second `up`, down; and a bounded, clean failure
when a raylet does not come up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray

from infra import catalog
from jobs import demo, local
from jobs.local import processes

pytestmark = pytest.mark.cluster

SHAPE = catalog.shape("v6e", "2x2")


@pytest.fixture
def short_state_dir(ray_tmp):
    # Short on purpose: Ray's unix socket paths under it must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="jl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    state_dir = Path(tempfile.mkdtemp(prefix="jl-", dir="/tmp"))
    ray.shutdown()  # this driver may be connected to the shared simulated slice; `up` connects its own
    try:
        yield local.up(SHAPE, 1, state_dir, host_cpus=2, head_cpus=2)
    finally:
        local.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_up_starts_a_labelled_slice_whose_files_stay_in_the_state_dir(cluster):
    state_dir = Path(cluster.state_dir)
    assert local.LocalCluster.load(state_dir) == cluster
    assert [n.role for n in cluster.nodes] == ["head", "host"]
    assert all(processes.alive(n.pid) for n in cluster.nodes)
    assert any(state_dir.joinpath("ray").glob("session_*/logs/raylet*.out"))  # Ray's temp files are here

    st = local.status(state_dir)
    assert st is not None and st.healthy and st.dead_nodes == ()
    assert [s.describe() for s in st.inventory] == ["slice sim-v6e-4-0 has hosts 0 of 1 (complete, idle)"]


def test_a_job_submitted_through_the_jobs_api_runs_on_the_simulated_slice(cluster):
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    outcome = demo.run_job(
        client,
        "healthcheck",
        "python -m jobs.healthcheck --generation v6e --topology 2x2 --reserve-timeout 60 --payload-mb 1 --iters 2",
        demo.job_runtime_env(SHAPE),
        "HEALTHCHECK",
        timeout_s=240,
        echo=lambda line: None,
    )
    assert outcome.status == "SUCCEEDED", outcome
    assert outcome.ok
    assert outcome.result["devices"] == 4 and outcome.result["hosts"] == 1 and outcome.result["correct"]


def test_a_second_up_is_refused_while_one_runs(cluster):
    with pytest.raises(local.LocalClusterError, match="already running"):
        local.up(SHAPE, 1, cluster.state_dir)


def kill_host_cli(state_dir: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jobs.local", "kill-host", "--state-dir", state_dir, *args], capture_output=True, text=True, timeout=120
    )


def test_kill_host_preempts_a_host_with_its_notice_and_a_fresh_one_comes_back(cluster):
    """What GKE does to a preempted node: SIGTERM, a preemption drain (the GCS records the node's
    death as drained for preemption), and with --back-after a new host."""
    refused = kill_host_cli(cluster.state_dir, "--slice", "1", "--host", "0")
    assert refused.returncode == 2 and "argument --slice: 1 is not a slice of the cluster" in refused.stderr
    started = time.monotonic()
    done = kill_host_cli(cluster.state_dir, "--slice", "0", "--host", "0", "--notice", "5", "--back-after", "1")
    assert done.returncode == 0, done.stderr
    assert "preempted sim-v6e-4-0 worker 0 with a 5 s notice" in done.stdout
    assert time.monotonic() - started < 30  # it returns once the host is signalled
    gone = next(n for n in cluster.nodes if n.role == "host")

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        st = local.status(cluster.state_dir)
        if st is not None and st.healthy and processes.alive(st.cluster.nodes[-1].pid) and st.cluster.nodes[-1].pid != gone.pid:
            break
        time.sleep(0.5)
    assert st is not None and st.healthy, st
    assert not processes._group_alive(gone.pid)  # the preempted host is gone, a new one in its place
    assert [n.role for n in st.cluster.nodes] == ["head", "host"]

    from jobs.local.env import ray_env
    from jobs.runtime.auth import use_environment

    use_environment(ray_env(cluster.state_dir))
    ray.init(address=cluster.gcs_address, logging_level="warning", log_to_driver=False)
    try:
        dead = [n for n in ray.nodes() if not n["Alive"]]
    finally:
        ray.shutdown()
    # Drained for preemption, not killed: the GCS records the drain's reason (Ray's own drain on
    # SIGTERM, or the notice's deadline given over it when the host was still busy).
    from ray.core.generated import common_pb2

    assert [n["DeathReason"] for n in dead] == [common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED], dead
    assert dead[0]["DeathReasonMessage"] in ("Node received SIGTERM; draining before shutdown.", "preemption notice of 5 s (simulated)")


def test_down_stops_every_node_and_forgets_the_cluster(cluster):
    stopped = local.down(cluster.state_dir)
    assert stopped is not None and stopped.gcs_address == cluster.gcs_address  # its hosts may be new (kill-host)
    nodes = {*cluster.nodes, *stopped.nodes}
    deadline = time.monotonic() + 30
    while any(processes._group_alive(n.pid) for n in nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(processes._group_alive(n.pid) for n in nodes)
    assert local.LocalCluster.load(cluster.state_dir) is None
    assert local.status(cluster.state_dir) is None
    assert local.down(cluster.state_dir) is None  # idempotent


def test_a_raylet_that_does_not_come_up_fails_up_clearly_and_leaves_nothing(short_state_dir):
    state_dir = short_state_dir
    started = time.monotonic()
    with pytest.raises(local.LocalClusterError) as caught:
        local.up(SHAPE, 1, state_dir, node_timeout_s=0.5, head_cpus=1)
    assert time.monotonic() - started < 120  # bounded
    message = str(caught.value)
    assert "sim-v6e-4-0 worker 0 did not register within 0.5s" in message
    assert "sim-v6e-4-0-0.log" in message  # where to look
    assert local.LocalCluster.load(state_dir) is None
    # Every process it started is gone (their logs name the pids' process groups).
    time.sleep(1)
    leftover = [p for p in _ray_processes() if str(state_dir) in p]
    assert leftover == []


def _ray_processes() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (proc / "stat").read_text().rsplit(") ", 1)[1][:1]
            except OSError:
                continue
            if state != "Z" and "ray" in cmd:
                out.append(cmd)
    return out


def test_up_refuses_a_state_dir_too_long_for_ray_sockets(tmp_path):
    deep = tmp_path / ("x" * 80)
    with pytest.raises(local.LocalClusterError, match="too long for Ray's unix sockets"):
        local.up(SHAPE, 1, deep)
    assert not os.path.exists(deep / "ray")
