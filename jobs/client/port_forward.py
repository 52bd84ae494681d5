"""`kubectl port-forward` to a service of the environment's Ray cluster, after getting its
credentials; always closed."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

from infra.config import Environment
from infra.names import credentials_command
from jobs.client.jobs_api import SubmitError
from jobs.runtime.deadlines import Deadline
from jobs.runtime.net import free_port, port_open

DASHBOARD_PORT = 8265


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SubmitError(f"{tool} is not on PATH: {hint}")
    return path


def _wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = Deadline(timeout_s)
    while not deadline.expired():
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
            raise SubmitError(f"kubectl port-forward exited ({proc.returncode}): {err or 'no output'}")
        if port_open(port, timeout_s=1.0):
            return
        deadline.sleep(0.2)
    raise SubmitError(f"the Ray head did not answer on the port-forward within {timeout_s:.0f} s")


@contextlib.contextmanager
def port_forward(
    env: Environment, timeout_s: float = 60, *, service: str | None = None, remote_port: int = DASHBOARD_PORT
) -> Iterator[str]:
    """Credentials + `kubectl port-forward` to a service of the environment's Ray cluster (by
    default the head's dashboard); yields the local URL."""
    _require("gcloud", "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)")
    kubectl = _require("kubectl", "install it with `gcloud components install kubectl`")
    try:
        creds = subprocess.run(credentials_command(env), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"gcloud get-credentials for {env.cluster_name} took over 120 s") from None
    if creds.returncode:
        reason = " ".join(creds.stderr.split())  # gcloud's advice, on one line
        raise SubmitError(f"cannot get credentials for cluster {env.cluster_name} in {env.location}: {reason}")
    port = free_port()
    target = f"svc/{service or env.ray_cluster_name + '-head-svc'}"
    proc = subprocess.Popen(
        [kubectl, "port-forward", "-n", env.ray.namespace, target, f"{port}:{remote_port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for_port(port, proc, timeout_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
