"""The RayCluster's token from its Secret, read by the real kubectl from a fake Kubernetes API server
(the only fake: the cluster), into the process environment; and the printed shell line, which names
the Secret, never the token."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.config import load_environment
from jobs import REPO_ROOT as REPO
from jobs.client import tokens
from jobs.client.jobs_api import SubmitError

TOKEN = "s3cret-token-from-the-secret"
V1_RESOURCES = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [{"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret", "verbs": ["get", "list"]}],
}


@contextlib.contextmanager
def fake_api(secrets: dict[tuple[str, str], dict[str, str]]) -> Iterator[str]:
    """A Kubernetes API server holding `secrets` ((namespace, name) -> data), enough for `kubectl get secret`."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/api":
                return self._json(200, {"kind": "APIVersions", "versions": ["v1"]})
            if path == "/apis":
                return self._json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
            if path == "/api/v1":
                return self._json(200, V1_RESOURCES)
            parts = path.strip("/").split("/")  # api v1 namespaces NS secrets NAME
            if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
                data = secrets.get((parts[3], parts[5]))
                if data is not None:
                    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
                    meta = {"name": parts[5], "namespace": parts[3]}
                    return self._json(200, {"kind": "Secret", "apiVersion": "v1", "metadata": meta, "data": encoded})
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
                return self._json(404, {**status, "message": f'secrets "{parts[5]}" not found'})
            return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")

    def point_at(server: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": server}}],
            "users": [{"name": "me", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
            "current-context": "fake",
        }
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
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
