"""jobs.submit without a cluster: what it would submit, and its errors (missing tools, nothing
listening, bad arguments) as one line and an exit code, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
import tomllib

from infra.config import load_environment
from jobs import REPO_ROOT as REPO
from jobs.client.uploads import EXCLUDES, runtime_env
from jobs.submit import credentials_command, shape_args


def run(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": path} if path is not None else None
    return subprocess.run([sys.executable, "-m", "jobs.submit", *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_job_gets_the_config_shape_and_runtime_env():
    env = load_environment("dev")
    assert shape_args(env) == ["--env", "dev", "--generation", "v6e", "--topology", "4x4", "--chips-per-host", "4", "--slices", "1"]
    rt = runtime_env(env, {"EXTRA": "1"})
    assert rt["working_dir"] == str(REPO) and ".venv" in rt["excludes"] and rt["excludes"] == EXCLUDES
    # The image carries Ray, JAX and optax (ray.tpu_images): a job's runtime env holds only what it
    # adds. dev adds nothing; jobs.train adds its libraries, pinned as pyproject.toml pins them.
    assert "pip" not in rt and env.ray.job_pip == [] and rt["env_vars"] == {"EXTRA": "1"}
    from jobs import train

    assert runtime_env(env, {}, train.REQUIREMENTS)["pip"] == list(train.REQUIREMENTS)
    with open(REPO / "pyproject.toml", "rb") as f:
        pins = tomllib.load(f)["project"]["optional-dependencies"]["jobs"]
    assert set(train.REQUIREMENTS) <= set(pins)
    assert credentials_command(env) == [
        "gcloud",
        "container",
        "clusters",
        "get-credentials",
        "ray-tpu-dev",
        "--location",
        "us-east5-b",
        "--project",
        "my-gcp-project",
        "--dns-endpoint",  # the IAM-guarded endpoint laptops and Cloud Build reach
    ]


def test_missing_gcloud_or_kubectl_is_one_line(tmp_path):
    proc = run("healthcheck", path=str(tmp_path))  # an empty PATH: neither tool exists
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "gcloud is not on PATH" in proc.stderr and "Traceback" not in proc.stderr


def test_unreachable_address_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    proc = run("healthcheck", "--address", f"http://127.0.0.1:{port}")
    assert proc.returncode == 2
    assert f"no Ray dashboard answers at http://127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_arguments():
    unknown = run("bogus")
    assert unknown.returncode == 2 and "valid: healthcheck, train" in unknown.stderr
    negative = run("healthcheck", "--timeout", "-5")
    assert negative.returncode == 2 and "argument --timeout: -5 is not allowed; use a positive number of seconds" in negative.stderr
    assert len(negative.stderr.strip().splitlines()) == 1 and "Traceback" not in negative.stderr
    bad_env = run("healthcheck", "--env", "nope")
    assert bad_env.returncode == 2 and "valid environments" in bad_env.stderr


def test_print_credentials_command():
    proc = run("--print-credentials-command", "--env", "prod")
    assert proc.returncode == 0
    assert (
        proc.stdout.strip()
        == "gcloud container clusters get-credentials ray-tpu-prod --location us-central1 --project my-gcp-project --dns-endpoint"
    )  # regional


def test_the_jobs_own_arguments_are_checked_before_anything_is_submitted():
    # Nothing listens on port 9: the error must come from the argument check, before any request.
    for job, flag, message in [
        ("healthcheck", ["--slices", "0"], "argument --slices: 0 is not allowed; use 1 or more"),
        ("train", ["--steps", "-3"], "argument --steps: -3 is not allowed; use 1 or more"),
        ("train", ["--topology", "9x9"], "argument --topology"),
    ]:
        proc = run(job, "--address", "http://127.0.0.1:9", "--", *flag)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and f"python -m jobs.{job}: error:" in proc.stderr
        assert "Traceback" not in proc.stderr and "no Ray dashboard" not in proc.stderr
    missing = run("--address", "http://127.0.0.1:9")
    assert missing.returncode == 2 and "error: no job given; valid: healthcheck, train" in missing.stderr


def test_with_the_projects_tpu_image_a_train_job_installs_nothing():
    # What jobs.submit says it submits, before it connects (nothing listens at port 9): with Ray's
    # TPU image every host pip-installs the jobs' requirements; with the project's TPU image, which
    # carries them (images/tpu.Dockerfile), nothing.
    from jobs import train

    ours = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32
    plain = run("train", "--env", "dev", "--address", "http://127.0.0.1:9", "--", "--steps", "1")
    with_image = run("train", "--env", "dev", "--address", "http://127.0.0.1:9", "--tpu-image", ours, "--", "--steps", "1")
    assert plain.returncode == with_image.returncode == 2  # nothing answers there
    assert f"every host installs {' '.join(train.REQUIREMENTS)} at the job's start" in plain.stdout
    assert f"image {ours}; every host installs nothing at the job's start" in with_image.stdout
