"""Running kubectl once, bounded, with what went wrong folded onto one line: what `infra.doctor`
(the live KubeRay CRD) and `jobs.submit` (the RayCluster's token) both need."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

INSTALL_HINT = "install it with `gcloud components install kubectl`"


class KubectlError(RuntimeError):
    """kubectl is missing, took too long or failed; the message is one line saying which.
    `answered`: kubectl ran and refused (the cluster said no), as opposed to not running at all."""

    def __init__(self, message: str, answered: bool = False):
        super().__init__(message)
        self.answered = answered


def run(args: Sequence[str], timeout_s: float, what: str) -> str:
    """kubectl's stdout for `kubectl ARGS`; `what` names the request in errors ("read the Ray token")."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise KubectlError(f"kubectl is not on PATH: {INSTALL_HINT}")
    try:
        proc = subprocess.run([kubectl, *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise KubectlError(f"kubectl took over {timeout_s:g} s to {what}") from None
    if proc.returncode:
        reason = " ".join(proc.stderr.split()) or f"kubectl exited {proc.returncode}"
        raise KubectlError(f"cannot {what}: {reason}", answered=True)
    return proc.stdout
