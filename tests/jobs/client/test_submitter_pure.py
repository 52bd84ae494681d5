"""The RayJob submitter's pieces that need no cluster: a reconnected log stream prints only what it had
not printed, and its flags and KubeRay's environment are checked before anything is sent."""

from __future__ import annotations

import subprocess
import sys

from jobs import REPO_ROOT
from jobs.client.submitter import Follower
from jobs.local.submitters import kuberay_command


def test_a_replayed_stream_prints_only_what_is_new():
    out: list[str] = []
    follower = Follower(out.append)
    seen = follower.feed(0, "one\ntw")
    follower.feed(seen, "o\n")
    # The stream drops; the next one replays the log from its start, in other chunks.
    seen = follower.feed(0, "one\n")
    seen = follower.feed(seen, "two\nthr")
    follower.feed(seen, "ee\n")
    assert "".join(out) == "one\ntwo\nthree\n" and follower.printed == len("one\ntwo\nthree\n")


def test_kuberays_own_submitters_are_what_kuberay_runs():
    k8s = kuberay_command("K8sJobMode", "head:8265", "job-1", "python -m x", {"env_vars": {"A": "1"}})
    assert k8s[:3] == ["/bin/bash", "-ce", "--"]
    script = k8s[3]
    assert (
        "if ! ray job status --address http://head:8265 job-1 >/dev/null 2>&1 ; then ray job submit --address http://head:8265 --no-wait"
        in script
    )
    assert script.endswith("; fi ; ray job logs --address http://head:8265 --follow job-1")
    sidecar = kuberay_command("SidecarMode", "127.0.0.1:8265", "job-1", "python -m x", {})[3]
    assert "ray job submit --address http://127.0.0.1:8265 --submission-id job-1 -- python -m x" in sidecar and "--no-wait" not in sidecar


def test_the_submitter_needs_what_kuberay_gives_it():
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.client.submitter", "--entrypoint", "true"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2 and "RAY_DASHBOARD_ADDRESS is not set: KubeRay sets it on a RayJob's submitter" in proc.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "jobs.client.submitter", "--entrypoint", "true", "--runtime-env-json", "[1]"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--runtime-env-json: a runtime env is a JSON object" in bad.stderr
