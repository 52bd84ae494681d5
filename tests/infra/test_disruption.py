"""A preempted TPU host's window, as the manifests print it and the facts say (infra.disruption):
the TPU pods' grace period is what GKE's graceful node shutdown gives pods on a preemption notice,
Ray's drain ends inside it, and the heads' GCS declares a vanished host dead within 5 s. Sources:
GKE "About Spot VMs" (30 s from the notice, the first 15 for non-system pods), ray 2.60.0 node.py
and ray_constants.py (the drain on SIGTERM, default 30 s), ray_config_def.h (health checks, 5 x 3000
ms by default), read 2026-12-06."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra import disruption
from infra.config import environment_names, load_environment
from infra.manifests.raycluster import ray_cluster

REPO = Path(__file__).resolve().parents[2]
OURS = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def check_cluster_spec(spec: dict) -> None:
    head = env_of(spec["headGroupSpec"]["template"]["spec"]["containers"][0])
    assert {k: head[k] for k in disruption.HEALTH.env()} == {
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 15, group["groupName"]
        assert env_of(pod["containers"][0])["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "12", group["groupName"]


@pytest.mark.parametrize("env_name", environment_names())
def test_every_raycluster_gives_tpu_pods_the_notices_window_and_heads_fast_health_checks(env_name):
    check_cluster_spec(ray_cluster(load_environment(env_name))["spec"])


def test_the_printed_rayjob_carries_the_same_window():
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.submit", "train", "--env", "prod", "--tpu-image", OURS, "--print-rayjob", "--name", "spot-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rayjob = next(d for d in yaml.safe_load_all(proc.stdout) if d["kind"] == "RayJob")
    check_cluster_spec(rayjob["spec"]["rayClusterSpec"])


def test_the_window_is_the_one_gke_gives_and_rays_drain_ends_inside_it():
    shutdown = disruption.TPU_POD_SHUTDOWN
    assert shutdown.grace_period_s == disruption.POD_SHUTDOWN_S == 15 < disruption.NOTICE_TO_STOP_S == 30
    assert disruption.notice_problem(shutdown.grace_period_s, shutdown.drain_s) is None
    # Ray's default drain would promise the workers 30 s of a 15 s window...
    assert "leaves less than 3 s" in (disruption.notice_problem(15, disruption.RAY_DEFAULT_DRAIN_S) or "")
    # ...and a longer grace period is cut to 15 s on a preemption.
    assert "cut to 15 s" in (disruption.notice_problem(30, 20) or "")


def test_a_vanished_host_is_declared_dead_within_5_s_where_rays_defaults_take_15():
    assert disruption.HEALTH.declared_dead_within_s() == 3.0 <= disruption.DETECTION_TARGET_S
    assert disruption.RAY_DEFAULT_HEALTH.declared_dead_within_s() == 50.0  # 5 checks, each may time out after 10 s
    assert disruption.RAY_DEFAULT_HEALTH.failure_threshold * disruption.RAY_DEFAULT_HEALTH.period_ms / 1000 == 15.0


def test_every_fact_names_its_source_and_the_day_it_was_read():
    for source in (disruption.SPOT_PAGE, disruption.RAY_DRAIN, disruption.RAY_TRAIN_WATCHER, disruption.RAY_HEALTH):
        assert source.url.startswith("https://") and source.read == "2026-12-06"
