"""The RayCluster's token from its Secret, read by the real kubectl from a fake Kubernetes API server
(the only fake: the cluster), into the process environment; and the printed shell line, which names
the Secret, never the token."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from infra.config import load_environment
from jobs import REPO_ROOT as REPO
from jobs.client import tokens
from jobs.client.jobs_api import SubmitError
from tests.fake_kube import FakeKube, serve

TOKEN = "s3cret-token-from-the-secret"


@contextlib.contextmanager
def fake_api(secrets: dict[tuple[str, str], dict[str, str]]) -> Iterator[str]:
    with serve(FakeKube(secrets=secrets)) as kube:
        yield kube.url


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")

    def point_at(server: str) -> None:
        monkeypatch.setenv("KUBECONFIG", str(FakeKube(url=server).kubeconfig(tmp_path)))
        monkeypatch.setenv("HOME", str(tmp_path))  # kubectl's discovery cache goes here

    return point_at


def test_the_token_is_read_from_the_rayclusters_secret(kubeconfig):
    env = load_environment("dev")
    with fake_api({("default", "ray-tpu-dev-ray"): {"auth_token": TOKEN}}) as server:
        kubeconfig(server)
        assert tokens.read_token(env) == TOKEN


def test_a_missing_secret_is_one_line_saying_what_creates_it(kubeconfig):
    env = load_environment("dev")
    with fake_api({}) as server:
        kubeconfig(server)
        with pytest.raises(SubmitError) as caught:
            tokens.read_token(env)
    message = str(caught.value)
    assert "\n" not in message and "Secret ray-tpu-dev-ray in namespace default" in message and "not found" in message
    assert "python -m infra manifests --env dev | kubectl apply -f -" in message


def test_a_secret_without_the_key_is_refused(kubeconfig):
    env = load_environment("dev")
    with fake_api({("default", "ray-tpu-dev-ray"): {"other": "x"}}) as server:
        kubeconfig(server)
        with pytest.raises(SubmitError, match="has no usable `auth_token`"):
            tokens.read_token(env)


def test_the_printed_token_command_reads_the_secret_at_run_time():
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.submit", "--env", "dev", "--print-token-command"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$(kubectl get secret ray-tpu-dev-ray -n default '
        "-o 'jsonpath={.data.auth_token}' | base64 -d)\""
    )


def test_the_printed_token_command_works_in_a_shell(kubeconfig):
    env = load_environment("dev")
    with fake_api({("default", "ray-tpu-dev-ray"): {"auth_token": TOKEN}}) as server:
        kubeconfig(server)
        script = f'{tokens.export_line(env)}; test "$RAY_AUTH_MODE" = token && test "$RAY_AUTH_TOKEN" = {TOKEN} && echo ok'
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr
