"""Shared set-up for the jobs tests: Ray's files in a short tmp dir, token authentication on as in
production (the test clusters' token in that dir, mode 0600, never ~/.ray), no usage stats, and one
simulated v6e 4x4 slice that the cluster tests share (`shared_slice`).

Set for this package only (and restored after it), so other test packages keep their own Ray
settings. Starting a simulated cluster costs 15-35 s on 2 cores, so the modules that need one whole
v6e 4x4 slice share this one; a module that needs another shape builds its own with
`tests/jobs/sim.py`. Modules that start a `jobs.local` cluster disconnect this driver first
(`ray.shutdown()`); `shared_slice` reconnects it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import ray

from jobs.local.env import write_token
from jobs.runtime.auth import AUTH_VARS
from jobs.runtime.inventory import wait_for_slices
from tests.jobs.sim import (
    SHARED_SHAPE,
    SHARED_SLICE,
    SimCluster,
    SimHost,
    patched_environ,
    set_test_token,
    simulated_cluster,
    slice_hosts,
    use_test_token,
)

# Bound on the slice being whole and idle again before a test gets it (a host re-added after a
# test removed it registers in a few seconds).
RESTORE_S = 120.0


@pytest.fixture(scope="package", autouse=True)
def ray_tmp():
    # Short on purpose: Ray's unix socket paths under it must stay under 108 bytes.
    tmp = tempfile.mkdtemp(prefix="rayjobs-", dir="/tmp")
    settings = {
        "RAY_TMPDIR": tmp,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # nodes stop at once (no Serve to drain)
        # This process connects and disconnects (`ray.init`/`ray.shutdown`) dozens of times. With
        # Ray 2.60's OpenTelemetry metrics each connection leaves an exporter thread behind (measured:
        # +1 thread per cycle, still exporting to a dead agent): the likely cause of a CI run at
        # 014f36f that passed every test, then segfaulted at exit (make Error 139; the segfault did
        # not reproduce in isolation). Tests read no metrics; with this off the count stays flat.
        "RAY_enable_open_telemetry": "0",
    }
    try:
        with patched_environ({**settings, **{var: "" for var in AUTH_VARS}}):
            set_test_token(write_token(tmp))
            use_test_token()
            yield tmp
    finally:
        if not os.environ.get("KEEP_RAY_TMP"):  # KEEP_RAY_TMP=1 keeps Ray's logs to read afterwards
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="package")
def _shared_cluster(ray_tmp):
    with simulated_cluster(slice_hosts(SHARED_SHAPE, SHARED_SLICE)) as sim:
        yield sim


@pytest.fixture
def shared_slice(_shared_cluster: SimCluster) -> SimCluster:
    """The shared v6e 4x4 slice, whole and idle, with this driver connected to it. A test may remove,
    kill or re-add its hosts: the next test gets the missing ones back."""
    return whole_and_idle(_shared_cluster)


def whole_and_idle(sim: SimCluster) -> SimCluster:
    """`sim` with every host of the shared slice back and this driver connected (for fixtures of a
    wider scope than `shared_slice`'s)."""
    if not ray.is_initialized():
        use_test_token()  # a `jobs.local` cluster started since has its own token
        ray.init(address=sim.cluster.address, logging_level="warning", log_to_driver=False)
    for worker_id in range(SHARED_SHAPE.hosts):
        if (SHARED_SLICE, worker_id) not in sim.nodes:
            sim.add_host(SimHost(SHARED_SHAPE, SHARED_SLICE, worker_id))
    wait_for_slices(SHARED_SHAPE, 1, RESTORE_S)
    return sim
