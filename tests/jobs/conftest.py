"""Shared set-up for the jobs tests: Ray's files in a short tmp dir, no token file, no usage stats.

Set for this package only (and restored after it), so other test packages keep their own Ray
settings. Cluster fixtures live in the modules that need them (one simulated cluster per module
at most: starting one costs 15-35 s on 2 cores); `tests/jobs/sim.py` builds them.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


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
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield tmp
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)
