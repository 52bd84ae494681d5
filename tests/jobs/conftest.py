"""Shared set-up for the jobs tests: Ray's files in a short tmp dir, no token file, no usage stats.

Set for this package only (and restored after it), so other test packages keep their own Ray
settings. Cluster fixtures live in the modules that need them (one simulated cluster per module
at most: starting one costs 15-35 s on 2 cores); `tests/jobs/sim.py` builds them.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.jobs.sim import patched_environ


@pytest.fixture(scope="package", autouse=True)
def ray_tmp():
    # Short on purpose: Ray's unix socket paths under it must stay under 108 bytes.
    tmp = tempfile.mkdtemp(prefix="rayjobs-", dir="/tmp")
    settings = {
        "RAY_TMPDIR": tmp,
        "RAY_AUTH_MODE": "disabled",  # else Ray 2.60 writes ~/.ray/auth_token
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # nodes stop at once (no Serve to drain)
    }
    try:
        with patched_environ(settings):
            yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
