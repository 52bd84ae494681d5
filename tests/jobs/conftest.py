"""Shared set-up for the jobs tests: Ray's files in a short tmp dir, no token file, no usage stats.

Cluster fixtures live in the modules that need them (one simulated cluster per module at most:
starting one costs 15-35 s on 2 cores); `tests/jobs/sim.py` builds them.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# Set at import, before any test imports Ray: Ray reads these when it starts or connects.
# The dir is short on purpose: Ray's unix socket paths must stay under 108 bytes.
_RAY_TMP = tempfile.mkdtemp(prefix="rayjobs-", dir="/tmp")
os.environ["RAY_TMPDIR"] = _RAY_TMP
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"


@pytest.fixture(scope="session", autouse=True)
def _remove_ray_tmp():
    yield
    shutil.rmtree(_RAY_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_tmp() -> str:
    return _RAY_TMP
