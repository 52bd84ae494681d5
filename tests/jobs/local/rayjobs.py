"""RayJobs for the tests, in the form `python -m jobs.submit JOB --print-rayjob` prints (until its
builder lands, written here): one TPU worker group, a NetworkPolicy document alongside."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

import yaml

from jobs import REPO_ROOT

CRDS = REPO_ROOT.parent / "shared" / "kuberay" / "crds"
KUBERAY_TPU_SAMPLE = REPO_ROOT.parent / "shared" / "kuberay" / "samples" / "ray-job.tpu-v6e-16-multihost.yaml"
# The simulated nodes already run JAX on CPU, one device per chip: no runtime env needed.
HEALTHCHECK = "python -m jobs.healthcheck --generation v6e --topology 2x2 --reserve-timeout 120"

NETWORK_POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "ray-head", "namespace": "default"},
    "spec": {"podSelector": {}},
}


def rayjob(name: str = "hc", entrypoint: str = HEALTHCHECK, topology: str = "2x2", hosts: int = 1, **spec: Any) -> dict:
    """A v6e RayJob of `topology` with 4-chip hosts; `spec` overrides or adds top-level spec fields."""
    image = "rayproject/ray:2.60.0"
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": "default", "labels": {"app.kubernetes.io/name": "ray-tpu-gke"}},
        "spec": {
            "entrypoint": entrypoint,
            "submissionMode": "SidecarMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "activeDeadlineSeconds": 600,
            "preRunningDeadlineSeconds": 300,
            "backoffLimit": 0,
            "rayClusterSpec": {
                "rayVersion": "2.60.0",
                "authOptions": {"mode": "token"},
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": image}]}}},
                "workerGroupSpecs": [
                    {
                        "groupName": f"v6e-{topology}",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "numOfHosts": hosts,
                        "rayStartParams": {},
                        "template": {
                            "spec": {
                                "nodeSelector": {
                                    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                    "cloud.google.com/gke-tpu-topology": topology,
                                    "ray-tpu-gke/slice-group": f"v6e-{topology}",
                                },
                                "containers": [
                                    {
                                        "name": "ray-worker",
                                        "image": image,
                                        "resources": {
                                            "requests": {"cpu": "4", "memory": "16Gi", "google.com/tpu": "4"},
                                            "limits": {"cpu": "4", "memory": "16Gi", "google.com/tpu": "4"},
                                        },
                                    }
                                ],
                            }
                        },
                    }
                ],
            },
            **spec,
        },
    }


def worker_group(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


def to_yaml(*docs: dict) -> str:
    return yaml.safe_dump_all([copy.deepcopy(d) for d in docs], sort_keys=False)


def write(path: Path, *docs: dict) -> Path:
    path.write_text(to_yaml(NETWORK_POLICY, *docs))
    return path


def leftovers(*needles: str, wait_s: float = 20.0) -> list[str]:
    """Live processes whose command line holds any of `needles`, after waiting (bounded) for them to go:
    a stopped job's driver and Ray's watcher of it end a second or two after their cluster."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (proc / "stat").read_text().rsplit(") ", 1)[1][:1]
            except OSError:
                continue
            if state != "Z" and any(n in cmd for n in needles):
                found.append(f"{proc.name}: {cmd[:200]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
