"""`python -m jobs.submit` for real against a local simulated slice (the same Jobs API path a laptop
takes to GKE, minus the port-forward): a whole slice succeeds, a failing job exits 1, and without
the cluster's token the Jobs API, `ray job submit` and `jobs.submit` are refused."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray
import requests
import yaml

from infra import catalog
from infra.config import load_environment
from jobs import REPO_ROOT as REPO
from jobs import local
from jobs.client.uploads import runtime_env

pytestmark = pytest.mark.cluster

SHAPE = catalog.shape("v6e", "2x2")  # one 4-chip host: the smallest real slice, quick to start


@pytest.fixture(scope="module")
def cluster():
    state = tempfile.mkdtemp(prefix="js-", dir="/tmp")  # short: Ray's socket paths are limited
    ray.shutdown()  # this driver may be connected to the shared simulated slice; `up` connects its own
    try:
        yield local.up(SHAPE, 1, state, host_cpus=2, head_cpus=2)
    finally:
        local.down(state)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    # A config whose first slice group is the simulated shape, with no pip installs (offline here).
    path = tmp_path_factory.mktemp("env") / "sim.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "project": "my-gcp-project",
                "region": "us-east5",
                "zone": "us-east5-b",
                "cluster_name": "sim",
                "slice_groups": [{"name": "v6e-2x2", "generation": "v6e", "topology": "2x2"}],
            }
        )
    )
    return path


def submit(cluster, env_file, *job_args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env_vars = [f"--env-var={k}={v}" for k, v in local.cpu_jax_env(SHAPE).items()]
    cmd = [
        sys.executable,
        "-m",
        "jobs.submit",
        "healthcheck",
        "--env",
        str(env_file),
        "--address",
        cluster.dashboard_url,
        "--timeout",
        str(timeout),
        *env_vars,
        "--",
        "--reserve-timeout",
        "120",
        *job_args,
    ]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout + 100, env=env)


def test_healthcheck_through_submit_succeeds(cluster, env_file):
    proc = submit(cluster, env_file)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "submitted " in proc.stdout and "job succeeded" in proc.stdout
    assert "--generation v6e --topology 2x2" in proc.stdout  # the shape came from the config


def test_failing_job_exits_one(cluster, env_file):
    # Valid arguments (so jobs.submit's own check passes them), but the cluster has one slice: the
    # job fails on the cluster, within its 1 s bound.
    proc = submit(cluster, env_file, "--slices", "2", "--reserve-timeout", "1")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "job failed" in proc.stdout and "could not reserve 2 x v6e 2x2" in proc.stdout


def test_make_submit_with_the_environments_own_runtime_env(cluster):
    # The laptop path, as users run it against GKE (`make submit JOB=healthcheck ENV=dev`), pointed
    # at the simulation with RAY_ADDRESS: dev's own runtime env goes up unchanged (the TPU image
    # carries JAX, so it installs nothing), and only the slice shape is overridden to the simulated 2x2.
    env = load_environment("dev")
    assert "pip" not in runtime_env(env, {})  # offline-safe: no wheel index, no find-links URL
    proc = subprocess.run(
        ["make", "--no-print-directory", "submit", "JOB=healthcheck", "ENV=dev", "ARGS=--topology 2x2 --reserve-timeout 120"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "RAY_ADDRESS": cluster.dashboard_url},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "job succeeded" in proc.stdout and "--env dev" in proc.stdout


# --- token authentication, as every cluster we define runs it --------------------------------------


def without_ray_auth(home) -> dict[str, str]:
    """This environment with no Ray token anywhere a Ray client looks: no RAY_AUTH_* variable, and
    a HOME whose ~/.ray holds no token file."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}, "HOME": str(home)}


def test_the_jobs_api_refuses_a_request_without_the_token_or_with_a_wrong_one(cluster):
    url = f"{cluster.dashboard_url}/api/jobs/"
    token = (Path(cluster.state_dir) / "auth_token").read_text()
    assert requests.get(url, timeout=30).status_code == 401
    assert requests.get(url, headers={"Authorization": "Bearer not-the-token"}, timeout=30).status_code == 403
    assert requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code == 200


def test_ray_job_submit_is_refused_without_the_token_and_runs_with_jobs_local_env(cluster, tmp_path):
    ray_cli = str(Path(sys.executable).parent / "ray")
    job = [ray_cli, "job", "submit", "--address", cluster.dashboard_url, "--", "python", "-c", "print('inside the slice')"]
    refused = subprocess.run(job, capture_output=True, text=True, timeout=120, env=without_ray_auth(tmp_path))
    assert refused.returncode != 0 and "Authentication required" in refused.stdout + refused.stderr
    # The README's recipe: `eval "$(python -m jobs.local env)"`, then plain `ray job submit`.
    script = f'eval "$({sys.executable} -m jobs.local env --state-dir {cluster.state_dir})" && {shlex.join(job[:3] + job[5:])}'
    ran = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300, env=without_ray_auth(tmp_path))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "inside the slice" in ran.stdout and "succeeded" in ran.stdout
    token = (Path(cluster.state_dir) / "auth_token").read_text()
    assert token not in ran.stdout + ran.stderr + refused.stdout + refused.stderr


@pytest.mark.parametrize(("token", "why"), [(None, "no token was sent (401)"), ("not-the-token", "the token is not this cluster's (403)")])
def test_jobs_submit_without_the_right_token_is_one_line_saying_how_to_get_it(cluster, env_file, tmp_path, token, why):
    env = without_ray_auth(tmp_path) | ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {})
    proc = submit(cluster, env_file, env=env, timeout=60)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: the Ray dashboard at {cluster.dashboard_url} refused") and why in line
    assert 'eval "$(python -m jobs.local env)"' in line and "kubectl get secret sim-ray -n default" in line
    assert "Traceback" not in proc.stderr and "submitted" not in proc.stdout
