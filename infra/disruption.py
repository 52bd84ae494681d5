"""What a TPU host gets when it is taken away, and how fast Ray notices one that vanished, as data
beside the catalog: GKE's preemption notice, Ray's drain on SIGTERM, Ray Train's preemption watcher
and the GCS's health checks, each with its source and the day it was read. The manifests
(`infra.manifests.raycluster`, `.rayjob`) and the simulation (`jobs.local`) derive their settings
from here, so a pod's grace period, Ray's drain and the tests' notice cannot disagree.

Why these numbers:
- A spot (or preemptible) node gets 30 s from the preemption notice to its stop; kubelet's graceful
  node shutdown gives the non-system pods the first 15 s of it and critical system pods the rest.
  So a TPU worker pod's `terminationGracePeriodSeconds` is 15: a longer one is cut to 15 on a
  preemption anyway, and a Kueue eviction (KubeRay deleting the pods) then gets the same window.
- `ray start --block` turns the SIGTERM into a preemption drain whose deadline is
  `RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S` (default 30, longer than the pod's window: Ray would
  promise a deadline kubelet does not keep). It is set to the grace period less `DRAIN_MARGIN_S`,
  the time Ray needs to stop its own processes before kubelet's SIGKILL.
- Ray Train's preemption watcher polls the GCS's draining nodes every 5 s by default: a third of the
  pods' window gone before the workers hear of it. 1 s costs one GCS read a second. Its controller
  polls the workers every 2 s (a dead one ends the attempt); 1 s takes a second off every lost host.
- The GCS declares a node dead after `failure_threshold` failed health checks `period_ms` apart
  (Ray's defaults: 5 x 3000 ms, 13 s measured by bench/restart_bench.py). 3 checks 1000 ms apart,
  each given 1000 ms, declare a vanished host dead within about 3 s; the false-positive risk (a
  loaded raylet missing three answers in a row) was measured on the simulation under load
  (bench/restart_bench.py, `false deaths under load`), and is the trade-off the README states.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.platform_facts import Source

READ = "2026-12-06"

SPOT_PAGE = Source(
    'GKE "About Spot VMs", "Termination and graceful shutdown of Spot VMs"',
    "https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms",
    READ,
)
RAY_DRAIN = Source(
    "ray 2.60.0 python/ray/_private/node.py `_drain_node_before_shutdown` (SIGTERM -> DrainNode PREEMPTION, deadline = "
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S), python/ray/_private/ray_constants.py:41 (default 30.0)",
    "https://github.com/ray-project/ray/blob/releases/2.60.0/python/ray/_private/node.py",
    READ,
)
RAY_TRAIN_WATCHER = Source(
    "ray 2.60.0 python/ray/train/v2/_internal/constants.py:69-70 (RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S, default 5.0), "
    ":36-37 (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, default 2.0), both propagated from the driver (ENV_VARS_TO_PROPAGATE); "
    "_internal/execution/preemption.py `PreemptionWatcher`",
    "https://github.com/ray-project/ray/blob/releases/2.60.0/python/ray/train/v2/_internal/constants.py",
    READ,
)
RAY_HEALTH = Source(
    "ray src/ray/common/ray_config_def.h (health_check_initial_delay_ms 5000, health_check_period_ms 3000, "
    "health_check_timeout_ms 10000, health_check_failure_threshold 5; each settable as RAY_<name> on the GCS)",
    "https://github.com/ray-project/ray/blob/master/src/ray/common/ray_config_def.h",
    READ,
)

NOTICE_TO_STOP_S = 30  # SPOT_PAGE: the VM stops 30 s after the preemption notice...
POD_SHUTDOWN_S = 15  # ...of which non-system pods get the first 15 s (the rest is for critical system pods)
MAX_NOTICE_TO_STOP_S = 120  # SPOT_PAGE: a Standard node pool may extend the window to 120 s (GKE >= 1.35.0-gke.1171000)
DRAIN_MARGIN_S = 3  # for Ray to stop its processes after the drain, before kubelet's SIGKILL
RAY_DEFAULT_DRAIN_S = 30.0  # RAY_DRAIN
RAY_TRAIN_DEFAULT_POLL_S = 5.0  # RAY_TRAIN_WATCHER
PREEMPTION_POLL_S = 1.0
RAY_TRAIN_DEFAULT_HEALTH_CHECK_S = 2.0  # RAY_TRAIN_WATCHER: constants.py:36-37, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S
RAY_TRAIN_HEALTH_CHECK_S = 1.0  # how often Ray Train's controller polls its workers (a dead one ends the attempt)


@dataclass(frozen=True)
class HealthChecks:
    """The GCS's health checks of each raylet (Ray's RayConfig names, in milliseconds)."""

    period_ms: int
    timeout_ms: int
    failure_threshold: int

    def declared_dead_within_s(self) -> float:
        """How long after a host vanishes the GCS declares it dead, at most: `failure_threshold`
        checks, each a period apart or timing out (pure)."""
        return self.failure_threshold * max(self.period_ms, self.timeout_ms) / 1000

    def env(self) -> dict[str, str]:
        """The settings as the GCS reads them from its environment (RAY_<config name>)."""
        return {
            "RAY_health_check_period_ms": str(self.period_ms),
            "RAY_health_check_timeout_ms": str(self.timeout_ms),
            "RAY_health_check_failure_threshold": str(self.failure_threshold),
        }

    def system_config(self) -> dict[str, int]:
        """The same settings as `ray.init(_system_config=...)` takes them (the tests' clusters)."""
        return {
            "health_check_period_ms": self.period_ms,
            "health_check_timeout_ms": self.timeout_ms,
            "health_check_failure_threshold": self.failure_threshold,
        }


RAY_DEFAULT_HEALTH = HealthChecks(period_ms=3000, timeout_ms=10000, failure_threshold=5)  # RAY_HEALTH
HEALTH = HealthChecks(period_ms=1000, timeout_ms=1000, failure_threshold=3)
DETECTION_TARGET_S = 5.0  # issue 34: a lost TPU host declared dead within 5 s


@dataclass(frozen=True)
class TpuPodShutdown:
    """What a TPU worker pod is given to stop: its grace period and Ray's drain inside it."""

    grace_period_s: int
    drain_s: int

    def env(self) -> dict[str, str]:
        return {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(self.drain_s)}


TPU_POD_SHUTDOWN = TpuPodShutdown(grace_period_s=POD_SHUTDOWN_S, drain_s=POD_SHUTDOWN_S - DRAIN_MARGIN_S)


def notice_problem(grace_period_s: int, drain_s: float) -> str | None:
    """Why a drain of `drain_s` inside a grace period of `grace_period_s` would promise the workers
    time kubelet does not give them, or None (pure)."""
    if drain_s + DRAIN_MARGIN_S > grace_period_s:
        return f"Ray's drain of {drain_s:g} s leaves less than {DRAIN_MARGIN_S} s of the pod's {grace_period_s} s grace period"
    if grace_period_s > POD_SHUTDOWN_S:
        return f"a grace period of {grace_period_s} s is cut to {POD_SHUTDOWN_S} s when GKE preempts the node ({SPOT_PAGE.cite()})"
    return None
