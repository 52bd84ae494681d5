"""The Ray token of an environment's RayCluster, read at run time from the Secret KubeRay creates
for it (`infra.names.auth_secret_name`), through kubectl, straight into this process's environment:
never into a file, an argument or a log line."""

from __future__ import annotations

import base64
import binascii
import shlex

from infra import kubectl
from infra.config import Environment
from infra.names import AUTH_TOKEN_KEY, auth_secret_name
from jobs.client.jobs_api import SubmitError

KUBECTL_TIMEOUT_S = 60.0


def secret_command(env: Environment) -> list[str]:
    jsonpath = "jsonpath={.data." + AUTH_TOKEN_KEY + "}"
    return ["kubectl", "get", "secret", auth_secret_name(env), "-n", env.ray.namespace, "-o", jsonpath]


def export_line(env: Environment) -> str:
    """The shell line that puts the token into a shell's environment (for `ray job submit`)."""
    return f'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$({shlex.join(secret_command(env))} | base64 -d)"'


def read_token(env: Environment, timeout_s: float = KUBECTL_TIMEOUT_S) -> str:
    """The RayCluster's token; SubmitError (one line saying what to check) if it cannot be read."""
    where = f"Secret {auth_secret_name(env)} in namespace {env.ray.namespace}"
    try:
        out = kubectl.run(secret_command(env)[1:], timeout_s, f"read the Ray token ({where})")
    except kubectl.KubectlError as err:
        hint = f"KubeRay creates it when the RayCluster is applied (python -m infra manifests --env {env.name} | kubectl apply -f -)"
        raise SubmitError(f"{err}; {hint}" if err.answered else str(err)) from None
    try:
        token = base64.b64decode(out.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    if not token:
        raise SubmitError(f"the {where} has no usable `{AUTH_TOKEN_KEY}`; delete it and re-apply the RayCluster so KubeRay makes a new one")
    return token
