"""`make demo` as users run it (`python -m jobs.demo`): a simulated v6e 4x4 slice with token
authentication on, the healthcheck and a short training run through the Ray Jobs API, torn down.
Slow (about 3 minutes on 2 cores): `make test-slow`."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
import ray

from jobs import REPO_ROOT as REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_the_demo_passes_with_token_authentication_on():
    ray.shutdown()  # this driver may be connected to the shared simulated slice
    with tempfile.TemporaryDirectory(prefix="demo-", dir="/tmp") as state:  # short: Ray's socket paths
        proc = subprocess.run(
            [sys.executable, "-m", "jobs.demo", "--state-dir", state],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "COLUMNS": "400"},  # rich's table, one row per line
        )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    # The slice refused a Jobs API request without the token, and its token file is the owner's only.
    assert "a request without the token gets 401" in out and "(mode 600)" in out
    assert "healthcheck job" in out and "train job" in out and out.count("SUCCEEDED") == 2
    assert "Traceback" not in out
