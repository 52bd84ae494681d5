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
    # No traceback from the demo or the jobs. Ray Train's detached PlacementGroupCleaner actor can
    # print one from its monitor thread as the run's controller goes away (seen once in a few runs,
    # ray 2.60): Ray's own teardown, streamed with the job's logs, not ours.
    ours = [line for line in out.splitlines() if "(PlacementGroupCleaner pid=" not in line]
    assert not any("Traceback" in line for line in ours), "\n".join(ours)[-4000:]
